// The voice-and-vision assistant on nm_pipeline: spoken questions (a microphone, or audio files)
// heard by Whisper, each asked with an image (a file, or a camera's newest frame) when one is given,
// answered by the language model and spoken (on a speaker, or into DIR/answer-N.wav), the battery's
// policy on (the machine's battery; none: a full one). The answers on stdout, the rest on stderr.
//   cc -o assistant examples/assistant.c $(pkg-config --cflags --libs nanomind) -pthread
//   ./assistant LLM.gguf WHISPER.gguf MMPROJ.gguf|- IMAGE|/dev/videoN|- speaker|DIR mic|AUDIO...
#include <nanomind.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

static nm_pipeline *p;
static nm_audio_player *speaker; // or the answers into files in `dir`
static const char *dir;
static int failed; // (the reader's)

static bool heard(const float *pcm, int64_t n, void *err) { return nm_pipeline_hear(p, pcm, n, err, 256), false; }

static void *answers(void *arg) { // the events: text to stdout, speech to the speaker or a WAV a question
    FILE *f = NULL; uint64_t at = 0; // (the speech of request `at`)
    char path[4200];
    uint8_t h[NM_WAV_HEADER_BYTES]; uint32_t bytes = 0;
    for (nm_pipeline_event ev; nm_pipeline_read(p, -1, &ev) == NM_OK;) {
        if (ev.kind == NM_PIPELINE_ASKED) fprintf(stderr, "asked: %s\n", ev.text);
        if (ev.kind == NM_PIPELINE_TEXT) fwrite(ev.text, 1, ev.len, stdout), fflush(stdout);
        if (ev.kind == NM_PIPELINE_AUDIO && speaker) nm_audio_player_write(speaker, ev.pcm, ev.n_samples, NULL, 0);
        if (ev.kind == NM_PIPELINE_AUDIO && !speaker && !f) { // (its header once its size is known)
            snprintf(path, sizeof path, "%s/answer-%llu.wav", dir, (unsigned long long)ev.request);
            if ((f = fopen(path, "wb"))) bytes = 0, at = ev.request, fwrite(h, 1, sizeof h, f);
        }
        if (ev.kind == NM_PIPELINE_AUDIO && f) bytes += 2 * (uint32_t)fwrite(ev.pcm, 2, (size_t)ev.n_samples, f);
        if (ev.kind == NM_PIPELINE_AUDIO) nm_audio_wav_header(h, bytes, ev.sample_rate, 1);
        if (ev.kind == NM_PIPELINE_DONE && f && ev.request == at) fseek(f, 0, SEEK_SET), fwrite(h, 1, sizeof h, f), fclose(f), f = NULL;
        if (ev.kind == NM_PIPELINE_DONE && ev.status != NM_OK) fprintf(stderr, "error: %s\n", ev.text), failed = 1;
        if (ev.kind == NM_PIPELINE_DONE) putchar('\n');
        if (ev.kind == NM_PIPELINE_POWER || ev.kind == NM_PIPELINE_NOTE) fprintf(stderr, "%s\n", ev.text);
    }
    return arg;
}

int main(int argc, char **argv) {
    if (argc < 7) return fprintf(stderr, "usage: %s LLM WHISPER MMPROJ|- IMAGE|/dev/videoN|- speaker|DIR mic|AUDIO...\n", argv[0]), 2;
    nm_brick_params llm = nm_brick_default_params(NM_BRICK_LLM), stt = nm_brick_default_params(NM_BRICK_STT),
                    vision = nm_brick_default_params(NM_BRICK_VISION), tts = nm_brick_default_params(NM_BRICK_TTS);
    llm.model = argv[1], stt.model = argv[2], vision.model = argv[3];
    llm.llm.n_predict = 128; // an answer must end
    nm_pipeline_params pp = nm_pipeline_default_params(); // pipelined: the next question heard while one is spoken
    pp.llm = &llm, pp.stt = &stt, pp.tts = &tts, pp.vision = strcmp(argv[3], "-") ? &vision : NULL;
    char err[512];
    if (nm_battery_open_sysfs(NULL, NULL, &pp.battery, err, sizeof err) != NM_OK) // (no battery here: a full one)
        nm_battery_open_fixed(100, &pp.battery, err, sizeof err);
    nm_camera *cam = NULL; nm_tabm *frames = NULL;
    nm_pipeline_image img = {.path = argv[4]};
    if (!strncmp(argv[4], "/dev/video", 10) && nm_camera_open(argv[4], NULL, &cam, err, sizeof err) == NM_OK &&
        nm_tabm_create(NULL, nm_camera_get_info(cam).n_slots + 2, nm_camera_get_info(cam).slot_bytes, &frames, err,
                       sizeof err) == NM_OK && nm_camera_start(cam, frames, 0) == NM_OK)
        img = (nm_pipeline_image){.camera = cam};
    dir = argv[5];
    if (nm_pipeline_create(&pp, &p, err, sizeof err) != NM_OK ||
        (!strcmp(dir, "speaker") && nm_audio_player_open("default", nm_brick_tts_sample_rate(nm_pipeline_brick(p, NM_BRICK_TTS)),
                                                         &speaker, err, sizeof err) != NM_OK))
        return fprintf(stderr, "error: %s\n", err), 1;
    pthread_t th;
    pthread_create(&th, NULL, answers, NULL);
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
    nm_pipeline_close(p); // the questions asked are answered, then the reader ends
    pthread_join(th, NULL);
    nm_pipeline_free(p);
    nm_camera_close(cam), nm_tabm_free(frames), nm_battery_free(pp.battery), nm_audio_player_close(speaker);
    return failed || refused;
}
