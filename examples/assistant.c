// The voice-and-vision assistant on nm_pipeline: spoken questions (a microphone, or audio files)
// heard by Whisper, each asked with an image (a file, or a camera's newest frame) when one is given,
// answered by the language model and spoken (on a speaker, or into DIR/answer-N.wav), the battery's
// policy on (the machine's battery; none: a full one). The answers on stdout, the rest on stderr.
//   cc -o assistant examples/assistant.c $(pkg-config --cflags --libs nanomind)
//   ./assistant LLM.gguf WHISPER.gguf MMPROJ.gguf|- IMAGE|/dev/videoN|- speaker|DIR mic|AUDIO...
#include <nanomind.h>
#include <stdio.h>
#include <string.h>

static nm_pipeline *p;
static nm_audio_player *speaker; // or the answers into files in `dir`
static const char *dir;
static int failed; // (the events')

static bool heard(const float *pcm, int64_t n, void *err) { return nm_pipeline_hear(p, pcm, n, err, 256), false; }

static FILE *f; static uint64_t at; // (the speech of request `at`)
static char path[4200];
static uint8_t h[NM_WAV_HEADER_BYTES]; static uint32_t bytes;

static void answers(const nm_pipeline_event *e, void *u) { // the events: text to stdout, speech to the speaker or a WAV
    if (e->kind == NM_PIPELINE_ASKED) fprintf(stderr, "asked: %s\n", e->text);
    if (e->kind == NM_PIPELINE_TEXT) fwrite(e->text, 1, e->len, stdout), fflush(stdout);
    if (e->kind == NM_PIPELINE_AUDIO && speaker) nm_audio_player_write(speaker, e->pcm, e->n_samples, NULL, 0);
    if (e->kind == NM_PIPELINE_AUDIO && !speaker && !f) { // (its header once its size is known)
        snprintf(path, sizeof path, "%s/answer-%llu.wav", dir, (unsigned long long)e->request);
        if ((f = fopen(path, "wb"))) bytes = 0, at = e->request, fwrite(h, 1, sizeof h, f);
    }
    if (e->kind == NM_PIPELINE_AUDIO && f) bytes += 2 * (uint32_t)fwrite(e->pcm, 2, (size_t)e->n_samples, f);
    if (e->kind == NM_PIPELINE_AUDIO) nm_audio_wav_header(h, bytes, e->sample_rate, 1);
    if (e->kind == NM_PIPELINE_DONE && f && e->request == at) fseek(f, 0, SEEK_SET), fwrite(h, 1, sizeof h, f), fclose(f), f = NULL;
    if (e->kind == NM_PIPELINE_DONE && e->status != NM_OK) fprintf(stderr, "error: %s\n", e->text), failed = 1;
    if (e->kind == NM_PIPELINE_DONE) putchar('\n');
    if (e->kind == NM_PIPELINE_POWER || e->kind == NM_PIPELINE_NOTE) fprintf(stderr, "%s\n", e->text);
    (void)u;
}

int main(int argc, char **argv) {
    if (argc < 7) return fprintf(stderr, "usage: %s LLM WHISPER MMPROJ|- IMAGE|/dev/videoN|- speaker|DIR mic|AUDIO...\n", argv[0]), 2;
    nm_brick_params llm = nm_brick_default_params(NM_BRICK_LLM), stt = nm_brick_default_params(NM_BRICK_STT),
                    vision = nm_brick_default_params(NM_BRICK_VISION), tts = nm_brick_default_params(NM_BRICK_TTS);
    llm.model = argv[1], stt.model = argv[2], vision.model = argv[3];
    llm.llm.n_predict = 128; // an answer must end
    nm_pipeline_params pp = nm_pipeline_default_params(); // pipelined: the next question heard while one is spoken
    pp.llm = &llm, pp.stt = &stt, pp.tts = &tts, pp.vision = strcmp(argv[3], "-") ? &vision : NULL;
    pp.on_event = answers; // (called on a thread of the pipeline's)
    char err[512];
    if (nm_battery_open_sysfs(NULL, NULL, &pp.battery, err, sizeof err) != NM_OK) // (no battery here: a full one)
        nm_battery_open_fixed(100, &pp.battery, err, sizeof err);
    nm_camera *cam = NULL;
    nm_pipeline_image img = {.path = argv[4]};
    if (!strncmp(argv[4], "/dev/video", 10) && nm_camera_open(argv[4], NULL, &cam, err, sizeof err) == NM_OK &&
        nm_camera_start(cam, NULL, 0) == NM_OK) // (a ring of its own)
        img = (nm_pipeline_image){.camera = cam};
    dir = argv[5];
    if (nm_pipeline_create(&pp, &p, err, sizeof err) != NM_OK ||
        (!strcmp(dir, "speaker") && nm_audio_player_open("default", nm_brick_tts_sample_rate(nm_pipeline_brick(p, NM_BRICK_TTS)),
                                                         &speaker, err, sizeof err) != NM_OK))
        return fprintf(stderr, "error: %s\n", err), 1;
    nm_audio_capture_params mic = nm_audio_capture_default_params(); // until Ctrl-C; each utterance a question
    mic.stream = true, mic.on_chunk = heard, mic.user = err;
    nm_audio none = {0};
    if (!strcmp(argv[6], "mic") && nm_audio_capture(&mic, &none, err, sizeof err) != NM_OK) fprintf(stderr, "%s\n", err);
    if (!strcmp(argv[6], "mic")) nm_pipeline_hear(p, NULL, 0, err, sizeof err); // (the last utterance)
    int refused = 0;
    for (int i = 6; i < argc && strcmp(argv[6], "mic"); i++) {
        const nm_pipeline_input q = {.audio_path = argv[i], .images = &img, .n_images = pp.vision && strcmp(argv[4], "-")};
        if (nm_pipeline_submit(p, &q, NULL, err, sizeof err) != NM_OK) fprintf(stderr, "error: %s\n", err), refused = 1;
    }
    nm_pipeline_close(p); // the questions asked are answered, their events given
    nm_pipeline_free(p);
    nm_camera_close(cam), nm_battery_free(pp.battery), nm_audio_player_close(speaker);
    return failed || refused;
}
