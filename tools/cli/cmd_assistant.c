// nanomind assistant: the assistant's loop in one process, every brick on its
// own lane, joined by rings (docs/cli.md, docs/bricks.md):
//
//   question audio -> [STT lane] -> transcript --------+
//   frame (image)  -> [vision lane: this thread] ------+-> [LLM lane] -> tokens
//   tokens -> [answer thread: text on stdout, sentences] -> [TTS lane] -> speech -> [sink thread: WAV files]
//
// Pipelined: the next question is transcribed and the next frame encoded
// while the decoder answers, and an answer's first sentence is spoken while
// the rest is decoded. --sequential waits for each answer to be spoken
// before the next question starts (the baseline the benchmark compares
// with). Each question is its own request, with the same id on every ring.
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli.h"

#define MEDIA_MARKER "<__media__>"
#define MAX_ITEMS 4096
#define MAX_QUESTION_S 60     // seconds of audio a question slot holds
#define SAY_SLOT_BYTES 4096   // text of a sentence (or a few) for the TTS brick
#define LLM_IN_SLOTS 8        // a prompt's parts (text, image segment, text) for two questions
#define SPEECH_SLOTS 64
#define SENTINEL "\x1fQUESTION\x1f"

static void usage(FILE *f) {
    fprintf(f,
            "usage: nanomind assistant -m LLM.gguf [--stt WHISPER.gguf] (--audio FILE|DIR | -p TEXT)\n"
            "                          [--mmproj MM.gguf --frames DIR [--fps F]] [--out DIR] [options]\n"
            "\n"
            "The assistant's loop: each question (spoken, or typed with -p), with a camera frame if\n"
            "given, is transcribed, answered by the language model (a chat turn of its own) and\n"
            "spoken, every model on its own lane, the next question heard and the next frame encoded\n"
            "while the current answer is decoded, and the first sentence spoken before the answer ends.\n"
            "\n"
            "sources and sinks:\n"
            "  --stt FILE               Whisper model for spoken questions (GGUF or whisper.cpp .bin)\n"
            "  --audio FILE|DIR         the questions: an audio file, or a folder of them (one question\n"
            "                           each, in name order; WAV, FLAC, OGG, MP3), up to %d s each\n"
            "  --audio mic[:DEVICE]     the questions from a microphone (ALSA; default device \"default\"):\n"
            "                           each utterance (speech until 0.8 s of silence) is a question\n"
            "  --listen S               with mic: listen S seconds; 0 (default): until Ctrl-C\n"
            "  -p, --prompt TEXT        a typed question (with --frames: asked of every frame)\n"
            "  --mmproj FILE            vision encoder for the frames (llama.cpp's mmproj GGUF)\n"
            "  --frames DIR             the camera frames: a folder of images (PNG, JPEG, PPM) in name\n"
            "                           order, one per question (as many as the questions, or any number\n"
            "                           with -p)\n"
            "  --fps F                  take at most F frames a second (a camera's rate); 0 (default):\n"
            "                           as fast as the pipeline goes\n"
            "  --out DIR                speak the answers into DIR/answer-NNN.wav (text goes to stdout\n"
            "                           always); without it nothing is spoken\n"
            "  --out speaker[:DEVICE]   speak them on a speaker (ALSA; an absent one is skipped with a\n"
            "                           message)\n"
            "  --tts ENGINE             espeak-ng (default) or none;  --voice V  its voice (en-us)\n"
            "  --sequential             one question at a time: the next starts once the answer is\n"
            "                           spoken (the baseline of the pipelined loop)\n"
            "power (docs/power.md):\n"
            "  --battery SRC            the battery: a percent, sysfs[:NAME] (Linux power_supply) or\n"
            "                           trace:FILE (seconds,percent rows); before each question the policy\n"
            "                           sets the frame rate, the decoder's pace and, when critical, runs\n"
            "                           the question as the cascade\n"
            "  --battery-speed X        trace seconds per second of the loop (default 1)\n"
            "  --power-sysfs ROOT       write the policy's DVFS caps under ROOT (/sys), restored at exit\n"
            "  --cascade                every question as the cascade: each brick loaded, run once and\n"
            "                           released in turn (the least memory; --audio FILE|DIR, --out DIR)\n"
            "  --plan                   place the bricks where the planner puts them (the plan goes to\n"
            "                           stderr) from the unit profiles (`nanomind profile`);\n"
            "                           --plan-goal latency|throughput|energy, --profile FILE\n"
            "lanes (core lists as run --cores: 0-3,6, big, little, cluster:N):\n"
            "  --cores LIST             the language model's lane;  --mmproj-cores LIST  the vision\n"
            "                           encoder's;  --stt-cores LIST, --tts-cores LIST\n"
            "also: -t, -c, -b, -n (default 128), --temp and the other sampling options, -sys,\n"
            "--chat-template, -dev, -ngl, --mmproj-device, --pin, --no-mmap, --mlock, as `run`.\n"
            "  --stats                  per question: seconds from the end of the question to its\n"
            "                           transcript, first token, first audio sample, last token and\n"
            "                           last sample; questions a second; the copy ledger; energy per\n"
            "                           brick and per question (modelled; measured where a meter exists)\n"
            "  --json FILE              the same as one JSON object in FILE\n"
            "  -h, --help               this help\n",
            MAX_QUESTION_S);
}

typedef struct item {
    const char *audio;   // the question's audio file, or NULL (typed)
    const char *frame;   // its frame, or NULL
    char question[2048]; // transcript (or -p)
    bool from_mic;       // an utterance the microphone heard: its audio is in the STT ring already
    bool failed;         // heard nothing or a brick failed it: the answer is empty
    int32_t n_tokens;
    int32_t n_prompt;    // prompt positions sent to the decoder (text tokens and image rows)
    size_t n_said;       // bytes of the answer given to the voice
    int64_t n_samples;
    // seconds, from the loop's start
    double t_start;      // the question is whole (its audio read)
    double t_heard, t_first_tok, t_answered, t_first_audio, t_spoken;
} item;

typedef struct lane {
    nm_brick *b;
    nm_tabm *in, *out;
    pthread_t th;
    bool started;
} lane;

typedef struct energy_report {
    cli_energy model;
    double cpu_s, dram, run_j, brick_j[4];
    nm_energy_reading measured;
} energy_report;

typedef struct app {
    // options
    const char *stt_model, *audio, *frames, *out_dir, *tts_engine, *voice, *stt_cores, *tts_cores;
    float fps, listen_s;
    bool sequential;
    const char *mic_dev, *speaker_dev; // --audio mic[:DEV], --out speaker[:DEV]
    cli_opts o;
    // bricks and rings
    nm_model *m;
    nm_brick *llm, *vision, *stt, *tts;
    nm_tabm *pcm, *heard, *llm_in, *tok, *img, *say, *speech;
    nm_ledger *ledger;
    int ep_stt, ep_llm, ep_mic;
    nm_audio_player *player; // --out speaker
    nm_vad *vad;             // --audio mic: cuts the capture into questions
    bool mic_done;           // the capture has ended (its questions are all in items)
    bool mic_failed;
    int cap_items;
    // the bricks' parameters (kept: --plan loads them again where the planner puts them)
    nm_brick_params lp, vp, sp, tp;
    nm_unit_profile units[NM_PLAN_MAX_UNITS]; // --plan: the profiles (the cores strings point into them)
    int32_t n_units;
    // the questions
    item *items;
    int n_items;
    char **owned; // paths listed from the folders
    int n_owned;
    double t0;
    // power: --battery (a source and the policy), --power-sysfs (DVFS), --cascade
    nm_battery *battery;
    nm_power_policy policy;
    nm_power_actuators *dvfs;
    double battery_speed;      // trace seconds a second of the loop
    const char *battery_src, *power_sysfs; // --battery, --power-sysfs
    bool cascade_always;       // --cascade
    bool cascading;            // this question runs as the cascade
    double decode_cap;         // tokens/s the answer reader paces the decoder to (0: none; under lock)
    double fps_cap;            // frames/s the policy allows (0: none)
    int n_cascaded;
    int32_t tts_rate;          // the voice's sample rate once it has been loaded
    long stage_peak_kb[4];     // the cascade: each stage's peak RSS (stt, vision + llm, llm, tts), the largest seen
    // the bricks' counters, kept across loads (the cascade frees each brick after its question)
    struct { char name[24], device[24]; uint64_t n; double busy; int32_t threads; } acc[4];
    // energy (--stats, --json): each brick's DRAM traffic (its estimate for each request's size, under
    // lock), the meters where the machine has some, the process's CPU time at the loop's start
    double dram[4];
    nm_energy_meters *meters;
    double cpu0;
    const char *json_path;     // --json FILE
    energy_report energy;
    // the resident pipeline's lanes and threads
    bool resident, planned;
    bool no_voice;             // the speaker could not be opened: answers printed only
    lane L_llm, L_stt, L_tts;
    pthread_t th_answers, th_speech;
    bool answers_started, speech_started;
    int n_asked;               // questions asked of the resident pipeline so far
    double full_tps;           // the decoder's tokens/s on the last answer it decoded unpaced
    // progress, for --sequential and the end
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int n_answered, n_spoken;
    bool answers_gone, speech_gone; // their thread ended
} app;

static void *lane_main(void *arg) {
    lane *L = arg;
    (void)nm_brick_run(L->b, L->in, L->out); // ends when a ring is shut down (and shuts the other)
    return NULL;
}

static double now(const app *A) { return cli_now() - A->t0; }

// A request's DRAM traffic as brick k's estimate for its size has it (0 stt,
// 1 vision, 2 llm, 3 tts): the weights its passes stream and the activations.
static void add_traffic(app *A, int k, const nm_brick *b, nm_brick_input in) {
    nm_brick_cost c = {0};
    if (!b || nm_brick_estimate(b, &in, &c) != NM_OK) return;
    pthread_mutex_lock(&A->lock);
    A->dram[k] += c.weight_bytes_read + c.act_bytes;
    pthread_mutex_unlock(&A->lock);
}

// ---- the questions -----------------------------------------------------------------------

static bool has_ext(const char *name, const char *const *exts) {
    const char *dot = strrchr(name, '.');
    if (!dot) return false;
    for (; *exts; exts++)
        if (!strcasecmp(dot + 1, *exts)) return true;
    return false;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

// A file, or a folder's files with one of exts in name order, into A->owned;
// *first and *n say where. False (error printed) on an unreadable path or an
// empty folder.
static bool list_files(app *A, const char *path, const char *what, const char *const *exts, int *first, int *n) {
    struct stat sb;
    if (stat(path, &sb) != 0) {
        fprintf(stderr, "error: %s '%s': %s\n", what, path, strerror(errno));
        return false;
    }
    *first = A->n_owned;
    *n = 0;
    if (!S_ISDIR(sb.st_mode)) {
        A->owned[A->n_owned++] = strdup(path);
        *n = 1;
        return A->owned[*first] != NULL;
    }
    DIR *d = opendir(path);
    if (!d) {
        fprintf(stderr, "error: %s folder '%s': %s\n", what, path, strerror(errno));
        return false;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || !has_ext(e->d_name, exts)) continue;
        if (A->n_owned >= 2 * MAX_ITEMS) {
            fprintf(stderr, "error: %s folder '%s': more than %d files\n", what, path, MAX_ITEMS);
            closedir(d);
            return false;
        }
        size_t len = strlen(path) + strlen(e->d_name) + 2;
        char *p = malloc(len);
        if (!p) break;
        snprintf(p, len, "%s/%s", path, e->d_name);
        A->owned[A->n_owned++] = p;
        (*n)++;
    }
    closedir(d);
    if (*n == 0) {
        fprintf(stderr, "error: %s folder '%s' holds no %s file\n", what, path, exts[0]);
        return false;
    }
    qsort(A->owned + *first, (size_t)*n, sizeof(char *), cmp_str);
    return true;
}

static bool make_items(app *A) {
    static const char *const audio_exts[] = {"wav", "flac", "ogg", "mp3", "opus", "aiff", "au", NULL};
    static const char *const image_exts[] = {"png", "jpg", "jpeg", "ppm", NULL};
    A->owned = calloc(2 * MAX_ITEMS, sizeof(char *));
    if (!A->owned) return false;
    if (A->mic_dev) { // questions come as they are heard
        A->items = calloc(MAX_ITEMS, sizeof(item));
        A->cap_items = MAX_ITEMS;
        A->n_items = 0;
        return A->items != NULL;
    }
    int a0 = 0, na = 0, f0 = 0, nf = 0;
    if (A->audio && !list_files(A, A->audio, "--audio", audio_exts, &a0, &na)) return false;
    if (A->frames && !list_files(A, A->frames, "--frames", image_exts, &f0, &nf)) return false;
    if (na && nf && na != nf) {
        fprintf(stderr, "error: %d frames and %d spoken questions: give one question per frame (or -p for all)\n",
                nf, na);
        return false;
    }
    A->n_items = na ? na : nf ? nf : 1;
    A->cap_items = A->n_items;
    A->items = calloc((size_t)A->n_items, sizeof(item));
    if (!A->items) return false;
    for (int i = 0; i < A->n_items; i++) {
        item *it = &A->items[i];
        it->audio = na ? A->owned[a0 + i] : NULL;
        it->frame = nf ? A->owned[f0 + i] : NULL;
        if (!na) snprintf(it->question, sizeof it->question, "%s", A->o.prompt);
    }
    return true;
}

// The vision ring's slot: the largest frame file (at least a byte; at most
// what the brick takes: a larger file is refused when its turn comes).
static size_t frame_bytes(const app *A) {
    size_t most = 1;
    for (int i = 0; i < A->n_items; i++) {
        struct stat sb;
        if (A->items[i].frame && stat(A->items[i].frame, &sb) == 0 && (size_t)sb.st_size > most)
            most = (size_t)sb.st_size;
    }
    const size_t cap = nm_brick_in_slot_bytes(A->vision);
    return most < cap ? most : cap;
}

// ---- prompts -------------------------------------------------------------------------------

// The chat for one question: [system], user (MEDIA_MARKER first when there is
// a frame) with the assistant's turn opened. malloc'd, NULL on failure.
static char *chat(const app *A, const char *question, bool frame) {
    char *content = malloc(strlen(question) + sizeof MEDIA_MARKER);
    if (!content) return NULL;
    sprintf(content, "%s%s", frame ? MEDIA_MARKER : "", question);
    nm_chat_msg msgs[2];
    size_t n = 0;
    if (A->o.system) msgs[n++] = (nm_chat_msg){"system", A->o.system};
    msgs[n++] = (nm_chat_msg){"user", content};
    int32_t need = nm_chat_format(A->m, A->o.chat_tmpl, msgs, n, true, NULL, 0);
    char *buf = NULL;
    if (need != NM_ERR_TEMPLATE) {
        if (need < 0) need = -need;
        buf = malloc((size_t)need + 1);
        if (buf && nm_chat_format(A->m, A->o.chat_tmpl, msgs, n, true, buf, need + 1) < 0) {
            free(buf);
            buf = NULL;
        }
    }
    free(content);
    return buf;
}

// Tokenizes text straight into a slot of the LLM brick's input ring and
// publishes it as a part of request `id`.
static bool send_text(app *A, const char *text, uint64_t user, bool bos, uint64_t id) {
    nm_tabm_slot sl;
    nm_status st = nm_tabm_acquire_write(A->llm_in, 0, -1, &sl);
    if (st != NM_OK) return false;
    const int32_t cap = (int32_t)(sl.capacity / sizeof(int32_t));
    int32_t n = nm_tokenize(A->m, text, strlen(text), sl.data, cap, bos, true);
    if (n <= 0 || n >= nm_ctx_n_ctx(nm_brick_llm_ctx(A->llm))) {
        fprintf(stderr, "error: question %llu: %s\n", (unsigned long long)id,
                n == 0 ? "the prompt gives no tokens" : "the prompt does not fit the context (-c)");
        n = 0; // an empty part: the brick fails the request, flagged
    }
    if (id >= 1 && id <= (uint64_t)A->cap_items) A->items[id - 1].n_prompt += n > 0 ? n : 0;
    sl.meta->kind = NM_TABM_TOKENS;
    sl.meta->ndim = n > 0 ? 1 : 0;
    sl.meta->shape[0] = n;
    sl.meta->size = sizeof(int32_t) * (uint64_t)n;
    sl.meta->user = user;
    sl.meta->request = id;
    if ((st = nm_tabm_publish(A->llm_in, &sl)) != NM_OK) {
        nm_tabm_cancel(A->llm_in, &sl);
        return false;
    }
    return true;
}

// The frame's file into the vision brick's slot, encoded on this thread into
// the LLM brick's ring (the segment flagged MORE: the question follows).
static bool send_frame(app *A, const char *path, uint64_t id) {
    nm_tabm_slot sl;
    if (nm_tabm_acquire_write(A->img, 0, -1, &sl) != NM_OK) return false;
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(sl.data, 1, sl.capacity, f) : 0;
    const bool big = f && n == sl.capacity && fgetc(f) != EOF;
    if (f) fclose(f);
    sl.meta->kind = NM_TABM_IMAGE;
    sl.meta->ndim = n > 0 ? 1 : 0;
    sl.meta->shape[0] = (int64_t)n;
    sl.meta->size = big ? 0 : n; // an unreadable or oversized file: an empty slot, failed by the brick
    sl.meta->user = NM_BRICK_MORE;
    sl.meta->request = id;
    if (!f || big) fprintf(stderr, "error: frame %s: %s\n", path, !f ? strerror(errno) : "larger than 64 MiB");
    if (nm_tabm_publish(A->img, &sl) != NM_OK) {
        nm_tabm_cancel(A->img, &sl);
        return false;
    }
    const uint64_t bad = nm_brick_get_stats(A->vision).n_bad_requests;
    nm_status st = nm_brick_step(A->vision, A->img, A->llm_in);
    if (st == NM_OK && nm_brick_get_stats(A->vision).n_bad_requests != bad)
        fprintf(stderr, "error: frame %s: %s\n", path, nm_brick_last_error(A->vision));
    nm_brick_cost c = {0}; // the encoder's traffic, and its rows in the prompt
    if (st == NM_OK && nm_brick_estimate(A->vision, &(nm_brick_input){0}, &c) == NM_OK) {
        pthread_mutex_lock(&A->lock);
        A->dram[1] += c.weight_bytes_read + c.act_bytes;
        pthread_mutex_unlock(&A->lock);
        if (id >= 1 && id <= (uint64_t)A->cap_items) A->items[id - 1].n_prompt += (int32_t)c.n_out;
    }
    return st == NM_OK;
}

// The question's audio decoded straight into the STT brick's slot (nothing
// copied), published as request `id`. False: the question is skipped.
static bool send_audio(app *A, item *it, uint64_t id) {
    nm_tabm_slot sl;
    if (nm_tabm_acquire_write(A->pcm, 0, -1, &sl) != NM_OK) return false;
    char err[512];
    int64_t n = 0;
    nm_status st = nm_audio_load_into(it->audio, 16000, sl.data, (int64_t)(sl.capacity / sizeof(float)), &n, err,
                                      sizeof err);
    if (st != NM_OK) {
        if (st == NM_ERR_RANGE)
            fprintf(stderr, "error: question %s: longer than %d s\n", it->audio, MAX_QUESTION_S);
        else
            fprintf(stderr, "error: question %s: %s (%s)\n", it->audio, err, nm_status_str(st));
        nm_tabm_cancel(A->pcm, &sl);
        return false;
    }
    *sl.meta = (nm_tabm_meta){.kind = NM_TABM_PCM_F32, .ndim = 1, .shape = {n}, .size = sizeof(float) * (uint64_t)n,
                              .sample_rate = 16000, .request = id};
    if (nm_tabm_publish(A->pcm, &sl) != NM_OK) {
        nm_tabm_cancel(A->pcm, &sl);
        return false;
    }
    add_traffic(A, 0, A->stt, (nm_brick_input){.n_samples = n});
    return true;
}

// The STT brick's segments of request id, joined into it->question.
static bool read_transcript(app *A, item *it, uint64_t id) {
    size_t len = 0;
    bool failed = false;
    for (;;) {
        nm_tabm_slot s;
        if (nm_tabm_acquire_read(A->heard, -1, &s) != NM_OK) return false;
        const uint64_t user = s.meta->user;
        if (s.meta->request == id && !(user & NM_BRICK_ERROR)) {
            const char *t = s.data;
            size_t n = (size_t)s.meta->size;
            if (len == 0)
                while (n > 0 && *t == ' ') t++, n--; // Whisper's leading blank
            if (len + n >= sizeof it->question) n = sizeof it->question - 1 - len;
            // the transcript into the chat's text (then tokenized into the decoder's slot): counted
            nm_ledger_copy(A->ledger, A->ep_stt, A->ep_llm, it->question + len, t, n);
            len += n;
        }
        failed = failed || (user & NM_BRICK_ERROR);
        nm_tabm_release(A->heard, &s);
        if (!(user & NM_BRICK_MORE)) break;
    }
    it->question[len] = '\0';
    if (failed)
        fprintf(stderr, "error: question %s: %s\n", it->audio ? it->audio : "(microphone)", nm_brick_last_error(A->stt));
    return !failed && len > 0;
}

// ---- the microphone ------------------------------------------------------------------------

static volatile sig_atomic_t g_stop; // Ctrl-C while listening: stop (what was heard is answered); twice: quit

static void on_sigint(int sig) {
    if (g_stop++) {
        signal(sig, SIG_DFL);
        raise(sig);
    }
}

// An utterance the cutter found: copied once from the capture into a PCM slot
// of the STT ring (counted), as the next question.
static void heard_utterance(void *user, const float *pcm, int64_t n, int64_t t0) {
    app *A = user;
    (void)t0;
    const double t = now(A);
    const int i = A->n_items; // only this thread adds items
    if (i >= A->cap_items) return;
    nm_tabm_slot sl;
    // never wait here: a capture that stops reading loses audio (an overrun)
    nm_status st = nm_tabm_acquire_write(A->pcm, 0, 0, &sl);
    if (st != NM_OK) {
        if (st == NM_ERR_AGAIN)
            fprintf(stderr, "a question was dropped: %u heard ones wait for Whisper\n", nm_tabm_n_slots(A->pcm));
        return;
    }
    if ((uint64_t)n * sizeof(float) > sl.capacity) n = (int64_t)(sl.capacity / sizeof(float));
    nm_ledger_copy(A->ledger, A->ep_mic, A->ep_stt, sl.data, pcm, sizeof(float) * (size_t)n);
    *sl.meta = (nm_tabm_meta){.kind = NM_TABM_PCM_F32, .ndim = 1, .shape = {n}, .size = sizeof(float) * (uint64_t)n,
                              .sample_rate = 16000, .request = (uint64_t)i + 1};
    if (nm_tabm_publish(A->pcm, &sl) != NM_OK) {
        nm_tabm_cancel(A->pcm, &sl);
        return;
    }
    add_traffic(A, 0, A->stt, (nm_brick_input){.n_samples = n});
    pthread_mutex_lock(&A->lock);
    A->items[i].from_mic = true;
    A->items[i].t_start = t; // the cutter's end of the utterance (end_silence_ms after the speech)
    A->n_items = i + 1;
    pthread_cond_broadcast(&A->cond);
    pthread_mutex_unlock(&A->lock);
}

static bool mic_chunk(const float *pcm, int64_t n, void *user) {
    app *A = user;
    nm_vad_push(A->vad, pcm, n, heard_utterance, A);
    return g_stop || A->n_items >= A->cap_items;
}

// Listens until --listen seconds have passed or Ctrl-C; each utterance is a question.
static void *mic_main(void *arg) {
    app *A = arg;
    nm_audio_capture_params p = nm_audio_capture_default_params();
    p.device = A->mic_dev;
    p.stream = true;
    p.seconds = A->listen_s;
    p.on_chunk = mic_chunk;
    p.user = A;
    nm_audio none = {0};
    char err[512];
    nm_status st = nm_audio_capture(&p, &none, err, sizeof err);
    if (st != NM_OK) fprintf(stderr, "error: microphone: %s\n", err);
    nm_vad_flush(A->vad, heard_utterance, A);
    pthread_mutex_lock(&A->lock);
    A->mic_done = true;
    A->mic_failed = st != NM_OK;
    pthread_cond_broadcast(&A->cond);
    pthread_mutex_unlock(&A->lock);
    return NULL;
}

// Waits for --sequential, and for the end: counter >= n.
static void wait_for(app *A, int *counter, int n, bool *gone) {
    pthread_mutex_lock(&A->lock);
    while (*counter < n && !*gone) pthread_cond_wait(&A->cond, &A->lock);
    pthread_mutex_unlock(&A->lock);
}

// One question: its audio to the STT lane, its frame through the vision
// brick (on this thread) while Whisper transcribes, then the question's text.
static void ask(app *A, int i) {
    item *it = &A->items[i];
    const uint64_t id = (uint64_t)i + 1;
    if (!it->from_mic && !A->cascading) it->t_start = now(A); // (a heard question's end is when the cutter closed it)
    const bool spoken = (it->audio || it->from_mic) && !A->cascading; // (the cascade transcribed it already)
    const bool heard = it->from_mic || (it->audio && send_audio(A, it, id));
    bool sent_first = false; // a part of the prompt is in the ring: the rest must follow
    bool ok = true;
    if (it->frame && A->vision) {
        char *probe = chat(A, SENTINEL, true);
        char *mark = probe ? strstr(probe, MEDIA_MARKER) : NULL;
        if (mark) {
            *mark = '\0';
            sent_first = send_text(A, probe, NM_LLM_IN_POS(0) | NM_BRICK_MORE, true, id);
            ok = sent_first && send_frame(A, it->frame, id);
        }
        ok = ok && mark;
        free(probe);
    }
    if (spoken) ok = heard && read_transcript(A, it, id) && ok; // (the transcript is read in any case)
    if (spoken && heard && !ok && !it->question[0]) fprintf(stderr, "question %d: no speech heard\n", i + 1);
    it->t_heard = now(A);
    char *full = ok ? chat(A, it->question, it->frame && A->vision) : NULL;
    const char *rest = full;
    if (full && sent_first) { // the part after the image: what the full chat has after its marker
        const char *mark = strstr(full, MEDIA_MARKER);
        rest = mark ? mark + strlen(MEDIA_MARKER) : NULL;
    }
    if (!rest) {
        // The request still goes through the decoder, cancelled: the brick drops
        // what was sent of it and ends it, so its (empty) answer and its speech
        // end in order with the others'.
        it->failed = true;
        nm_tabm_cancel_request(A->llm_in, id);
        send_text(A, " ", sent_first ? 0 : NM_LLM_IN_POS(0), false, id);
    } else {
        send_text(A, rest, sent_first ? 0 : NM_LLM_IN_POS(0), !sent_first, id);
    }
    free(full);
}

// ---- answers ---------------------------------------------------------------------------

typedef struct sentence {
    nm_tabm_slot s;
    bool held;
    size_t len;
} sentence;

static void say_out(app *A, sentence *S, uint64_t id, bool more) {
    if (!S->held) {
        if (more) return; // nothing to say yet
        if (nm_tabm_acquire_write(A->say, 0, -1, &S->s) != NM_OK) return;
        S->len = 0;
    }
    nm_tabm_meta *m = S->s.meta;
    *m = (nm_tabm_meta){.kind = NM_TABM_TEXT, .ndim = S->len ? 1 : 0, .shape = {(int64_t)S->len}, .size = S->len,
                        .user = more ? NM_BRICK_MORE : 0, .request = id};
    if (nm_tabm_publish(A->say, &S->s) != NM_OK) nm_tabm_cancel(A->say, &S->s);
    S->held = false;
}

// The policy's decode cap: the reader holds each token until its time, and
// the full token ring holds the decoder (it waits, idle, for a free slot).
static void pace(app *A, const item *it) {
    pthread_mutex_lock(&A->lock);
    const double cap = A->decode_cap;
    pthread_mutex_unlock(&A->lock);
    if (cap <= 0) return;
    const double due = it->t_first_tok + (it->n_tokens - 1) / cap, t = now(A);
    if (due > t) {
        struct timespec ts = {(time_t)(due - t), (long)((due - t - (double)(time_t)(due - t)) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

// An answer's end: its unpaced speed is what the policy's decode share scales.
static void note_speed(app *A, const item *it, double t_end) {
    pthread_mutex_lock(&A->lock);
    if (A->decode_cap <= 0 && it->n_tokens > 1 && t_end > it->t_first_tok)
        A->full_tps = (it->n_tokens - 1) / (t_end - it->t_first_tok);
    pthread_mutex_unlock(&A->lock);
}

// One token of an answer: its time, its count, the policy's pace, and its
// text into piece, printed as it comes. The piece's length (0 while the
// detokenizer holds bytes back).
static int32_t answer_piece(app *A, item *it, nm_detok *dt, int32_t tok, char *piece, int32_t size) {
    if (it->t_first_tok == 0) it->t_first_tok = now(A);
    it->n_tokens++;
    pace(A, it);
    const int32_t pn = nm_detok_push(A->m, dt, tok, piece, size);
    if (pn > 0) {
        fwrite(piece, 1, (size_t)pn, stdout);
        fflush(stdout);
    }
    return pn;
}

// Where an answer is cut into the voice's slots, the pipelined reader's and
// the cascade's alike: before a piece that starts with a blank after a
// sentence's end (. ! ?), and after a line's end.
static bool ends_sentence(const char *piece, int32_t pn) {
    const char last = piece[pn - 1];
    return last == '.' || last == '!' || last == '?';
}
static bool cut_before(bool ended_sentence, const char *piece) {
    return ended_sentence && (piece[0] == ' ' || piece[0] == '\n');
}
static bool cut_after(const char *piece, int32_t pn) { return piece[pn - 1] == '\n'; }

// A TEXT slot of the voice's ring held for the sentence being read; false if none can be had.
static bool say_hold(app *A, sentence *S) {
    if (S->held) return true;
    if (nm_tabm_acquire_write(A->say, 0, -1, &S->s) != NM_OK) return false;
    S->held = true;
    S->len = 0;
    return true;
}

// Reads the decoder's tokens: the text to stdout as it comes, and, with a
// voice, into TEXT slots for the TTS brick, one sentence each, detokenized
// straight into the slot (it is what this thread makes; the TTS brick reads
// it there).
static void *answers_main(void *arg) {
    app *A = arg;
    uint64_t cur = 0;
    nm_detok dt = {0};
    sentence S = {0};
    bool ended_sentence = false;
    for (;;) {
        nm_tabm_slot sl;
        if (nm_tabm_acquire_read(A->tok, -1, &sl) != NM_OK) break;
        const uint64_t id = sl.meta->request, user = sl.meta->user;
        item *it = id >= 1 && id <= (uint64_t)A->cap_items ? &A->items[id - 1] : NULL;
        if (id != cur && it) {
            cur = id;
            memset(&dt, 0, sizeof dt);
            ended_sentence = false;
            it->t_first_tok = 0;
            printf("> %s\n", it->question);
        }
        const int32_t *toks = sl.data;
        const int32_t n = sl.meta->ndim == 1 ? (int32_t)sl.meta->shape[0] : 0;
        for (int32_t k = 0; k < n && it; k++) {
            char piece[256];
            const int32_t pn = answer_piece(A, it, &dt, toks[k], piece, (int32_t)sizeof piece);
            if (pn <= 0 || !A->tts) continue;
            if (cut_before(ended_sentence, piece)) say_out(A, &S, id, true);
            if (!say_hold(A, &S)) continue;
            if (S.len + (size_t)pn > S.s.capacity) say_out(A, &S, id, true); // a very long sentence: cut
            if (!say_hold(A, &S)) continue;
            // the text this thread makes from the tokens, written once into the TTS brick's slot
            memcpy((char *)S.s.data + S.len, piece, (size_t)pn);
            S.len += (size_t)pn;
            it->n_said += (size_t)pn;
            ended_sentence = ends_sentence(piece, pn);
            if (cut_after(piece, pn)) say_out(A, &S, id, true);
        }
        nm_tabm_release(A->tok, &sl);
        if (user & NM_BRICK_MORE || !it) continue;
        // the answer's end
        printf("\n");
        fflush(stdout);
        const nm_llm_stop why = NM_LLM_STOP_OF(user);
        if (user & NM_BRICK_ERROR) {
            fprintf(stderr, "error: question %llu: %s\n", (unsigned long long)id, nm_brick_last_error(A->llm));
            it->failed = true;
        } else if (why == NM_LLM_STOP_CTX_FULL) {
            fprintf(stderr, "[question %llu: the context is full]\n", (unsigned long long)id);
        }
        if (A->tts) say_out(A, &S, id, false);
        add_traffic(A, 2, A->llm, (nm_brick_input){.n_tokens = it->n_prompt, .n_predict = it->n_tokens});
        add_traffic(A, 3, A->tts, (nm_brick_input){.n_bytes = (int64_t)it->n_said});
        note_speed(A, it, now(A));
        pthread_mutex_lock(&A->lock);
        it->t_answered = now(A);
        A->n_answered++;
        if (!A->tts) A->n_spoken++;
        pthread_cond_broadcast(&A->cond);
        pthread_mutex_unlock(&A->lock);
    }
    if (S.held) nm_tabm_cancel(A->say, &S.s);
    if (A->say) nm_tabm_shutdown(A->say); // the voice ends too, and the speech thread after it
    pthread_mutex_lock(&A->lock);
    A->answers_gone = true;
    pthread_cond_broadcast(&A->cond);
    pthread_mutex_unlock(&A->lock);
    return NULL;
}

// Writes each answer's speech to OUT/answer-NNN.wav as it comes (the slots'
// samples straight to the file).
static void *speech_main(void *arg) {
    app *A = arg;
    nm_outfile f = {0};
    bool open = false, bad = false;
    uint64_t bytes = 0;
    char path[4096], err[512];
    const int32_t rate = nm_brick_tts_sample_rate(A->tts);
    for (;;) {
        nm_tabm_slot s;
        if (nm_tabm_acquire_read(A->speech, -1, &s) != NM_OK) break;
        const uint64_t id = s.meta->request, user = s.meta->user;
        item *it = id >= 1 && id <= (uint64_t)A->cap_items ? &A->items[id - 1] : NULL;
        if (!open && it && !A->player) {
            snprintf(path, sizeof path, "%s/answer-%03llu.wav", A->out_dir, (unsigned long long)id);
            bad = nm_outfile_open(&f, path, err, sizeof err) != NM_OK;
            uint8_t h[NM_WAV_HEADER_BYTES];
            nm_audio_wav_header(h, 0, rate, 1);
            bad = bad || fwrite(h, 1, sizeof h, f.f) != sizeof h;
            if (bad) fprintf(stderr, "error: %s: %s\n", path, err[0] ? err : strerror(errno));
            open = true;
            bytes = 0;
        }
        if (it && s.meta->size > 0) {
            if (it->t_first_audio == 0) it->t_first_audio = now(A);
            it->n_samples += (int64_t)(s.meta->size / 2);
            if (A->player && !bad && nm_audio_player_write(A->player, s.data, (int64_t)(s.meta->size / 2), err,
                                                           sizeof err) != NM_OK) { // the slot's samples, in place
                fprintf(stderr, "error: speaker: %s\n", err);
                bad = true;
            } else if (!A->player && !bad && fwrite(s.data, 1, (size_t)s.meta->size, f.f) != s.meta->size) {
                fprintf(stderr, "error: %s: %s\n", path, strerror(errno));
                bad = true;
            }
            bytes += s.meta->size;
        }
        nm_tabm_release(A->speech, &s);
        if ((user & NM_BRICK_MORE) || !it) continue;
        if (open && !bad) {
            uint8_t h[NM_WAV_HEADER_BYTES];
            nm_audio_wav_header(h, (uint32_t)bytes, rate, 1);
            if (!f.seekable || fseek(f.f, 0, SEEK_SET) != 0 || fwrite(h, 1, sizeof h, f.f) != sizeof h ||
                nm_outfile_commit(&f, err, sizeof err) != NM_OK) {
                fprintf(stderr, "error: %s: %s\n", path, err[0] ? err : "cannot write the header");
                nm_outfile_abort(&f);
            }
        } else if (open) {
            nm_outfile_abort(&f);
        }
        open = false;
        pthread_mutex_lock(&A->lock);
        it->t_spoken = now(A);
        A->n_spoken++;
        pthread_cond_broadcast(&A->cond);
        pthread_mutex_unlock(&A->lock);
    }
    if (open) nm_outfile_abort(&f);
    pthread_mutex_lock(&A->lock);
    A->speech_gone = true;
    pthread_cond_broadcast(&A->cond);
    pthread_mutex_unlock(&A->lock);
    return NULL;
}

// ---- the command ---------------------------------------------------------------------------

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

// The median, min and max of the n values of v (sorted in place).
static void spread(const char *what, double *v, int n) {
    if (n == 0) return;
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    fprintf(stderr, "end of question -> %s: median %.3f s, min %.3f s, max %.3f s\n", what, v[n / 2], v[0], v[n - 1]);
}

static long peak_rss_kb(const app *A) {
    long peak = cli_peak_rss_kb(); // (the cascade's resets of VmHWM reset this too: its stages' peaks count)
    for (int k = 0; k < 4; k++) peak = A->stage_peak_kb[k] > peak ? A->stage_peak_kb[k] : peak;
    return peak;
}

// The run's energy, at its end: modelled for each brick (its busy threads and
// its traffic, over idle) and for the run (the process's CPU time and all the
// traffic, idle included); measured by each meter the machine has.
static void energy_end(app *A, double wall) {
    energy_report *E = &A->energy;
    E->model = cli_energy_default();
    E->cpu_s = cli_cpu_seconds() - A->cpu0;
    E->dram = 0;
    for (int k = 0; k < 4; k++) {
        E->brick_j[k] = cli_energy_work(&E->model, A->acc[k].busy * A->acc[k].threads, A->dram[k]);
        E->dram += A->dram[k];
    }
    E->run_j = cli_energy_run(&E->model, E->cpu_s, wall, E->dram);
    char err[256];
    if (A->meters && nm_energy_meters_stop(A->meters, &E->measured, err, sizeof err) != NM_OK) {
        fprintf(stderr, "energy meters: %s\n", err);
        E->measured.n = 0;
    }
}

static void json_time(cJSON *o, const char *key, double t, double t0) {
    cJSON_AddNumberToObject(o, key, t > 0 ? t - t0 : 0);
}

// --json FILE: the questions, the bricks and the energy as one object.
static bool write_json(app *A, double wall) {
    const energy_report *E = &A->energy;
    cJSON *root = cJSON_CreateObject(), *qs = cJSON_AddArrayToObject(root, "questions");
    for (int i = 0; i < A->n_items; i++) {
        const item *it = &A->items[i];
        cJSON *q = cJSON_CreateObject();
        cJSON_AddItemToArray(qs, q);
        cJSON_AddStringToObject(q, "question", it->question);
        cJSON_AddNumberToObject(q, "start_s", it->t_start);
        json_time(q, "heard_s", it->t_heard, it->t_start);
        json_time(q, "first_token_s", it->t_first_tok, it->t_start);
        json_time(q, "answered_s", it->t_answered, it->t_start);
        json_time(q, "first_audio_s", it->t_first_audio, it->t_start);
        json_time(q, "spoken_s", it->t_spoken, it->t_start);
        cJSON_AddNumberToObject(q, "prompt_tokens", it->n_prompt);
        cJSON_AddNumberToObject(q, "tokens", it->n_tokens);
        cJSON_AddNumberToObject(q, "samples", (double)it->n_samples);
        cJSON_AddBoolToObject(q, "failed", it->failed);
    }
    cJSON *bs = cJSON_AddArrayToObject(root, "bricks");
    for (int k = 0; k < 4; k++) {
        if (!A->acc[k].name[0]) continue;
        cJSON *b = cJSON_CreateObject();
        cJSON_AddItemToArray(bs, b);
        cJSON_AddStringToObject(b, "name", A->acc[k].name);
        cJSON_AddStringToObject(b, "device", A->acc[k].device);
        cJSON_AddNumberToObject(b, "requests", (double)A->acc[k].n);
        cJSON_AddNumberToObject(b, "busy_s", A->acc[k].busy);
        cJSON_AddNumberToObject(b, "threads", A->acc[k].threads);
        cJSON_AddNumberToObject(b, "dram_bytes", A->dram[k]);
        cJSON_AddNumberToObject(b, "joules", E->brick_j[k]);
        cJSON_AddStringToObject(b, "energy", "modelled");
    }
    cJSON *run = cJSON_AddObjectToObject(root, "run");
    cJSON_AddNumberToObject(run, "questions", A->n_items);
    cJSON_AddStringToObject(run, "mode", A->n_cascaded == A->n_items ? "cascade" : A->n_cascaded > 0 ? "mixed"
                                         : A->sequential ? "sequential" : "pipelined");
    cJSON_AddNumberToObject(run, "wall_s", wall);
    cJSON_AddNumberToObject(run, "cpu_s", E->cpu_s);
    cJSON_AddNumberToObject(run, "dram_bytes", E->dram);
    cJSON_AddNumberToObject(run, "peak_rss_mib", peak_rss_kb(A) / 1024.0);
    cJSON_AddNumberToObject(run, "copied_bytes", (double)nm_ledger_total(A->ledger));
    cJSON *en = cJSON_AddArrayToObject(run, "energy");
    cJSON *mo = cJSON_CreateObject();
    cJSON_AddItemToArray(en, mo);
    cJSON_AddStringToObject(mo, "source", "model");
    cJSON_AddStringToObject(mo, "energy", "modelled");
    cJSON_AddNumberToObject(mo, "joules", E->run_j);
    cJSON_AddNumberToObject(mo, "joules_per_question", A->n_items ? E->run_j / A->n_items : 0);
    cJSON_AddNumberToObject(mo, "idle_w", E->model.idle_w);
    cJSON_AddNumberToObject(mo, "active_w", E->model.active_w);
    cJSON_AddNumberToObject(mo, "cores", E->model.n_cores);
    cJSON_AddNumberToObject(mo, "pj_byte", E->model.pj_byte > 0 ? E->model.pj_byte : 80);
    for (int32_t m = 0; m < E->measured.n; m++) {
        cJSON *me = cJSON_CreateObject();
        cJSON_AddItemToArray(en, me);
        cJSON_AddStringToObject(me, "source", E->measured.name[m]);
        cJSON_AddStringToObject(me, "energy", "measured");
        cJSON_AddNumberToObject(me, "joules", E->measured.joules[m]);
        cJSON_AddNumberToObject(me, "joules_per_question", A->n_items ? E->measured.joules[m] / A->n_items : 0);
        cJSON_AddNumberToObject(me, "seconds", E->measured.seconds);
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    nm_outfile f = {0};
    char err[512] = "";
    bool ok = text && nm_outfile_open(&f, A->json_path, err, sizeof err) == NM_OK;
    if (ok && (fputs(text, f.f) == EOF || fputc('\n', f.f) == EOF)) {
        nm_outfile_abort(&f);
        snprintf(err, sizeof err, "%s", strerror(errno));
        ok = false;
    } else if (ok) {
        ok = nm_outfile_commit(&f, err, sizeof err) == NM_OK;
    }
    if (!ok) fprintf(stderr, "error: --json %s: %s\n", A->json_path, err[0] ? err : "out of memory");
    free(text);
    return ok;
}

static void print_stats(app *A, double wall) {
    double *first_audio = calloc((size_t)A->n_items, sizeof(double));
    double *done = calloc((size_t)A->n_items, sizeof(double));
    int n_fa = 0, n_done = 0;
    for (int i = 0; i < A->n_items; i++) {
        const item *it = &A->items[i];
        fprintf(stderr, "question %d (at %.3f s): from its end: heard %.3f s, first token %.3f s, last token %.3f s",
                i + 1, it->t_start, it->t_heard - it->t_start, it->t_first_tok > 0 ? it->t_first_tok - it->t_start : 0.0,
                it->t_answered - it->t_start);
        if (A->tts_rate > 0)
            fprintf(stderr, ", first audio %.3f s, spoken %.3f s (%.2f s of speech)",
                    it->t_first_audio > 0 ? it->t_first_audio - it->t_start : 0.0, it->t_spoken - it->t_start,
                    (double)it->n_samples / A->tts_rate);
        fprintf(stderr, "; %d tokens%s\n", it->n_tokens, it->failed ? " (failed)" : "");
        if (first_audio && it->t_first_audio > 0) first_audio[n_fa++] = it->t_first_audio - it->t_start;
        if (done && !it->failed) done[n_done++] = (A->tts_rate > 0 ? it->t_spoken : it->t_answered) - it->t_start;
    }
    fprintf(stderr, "%d questions in %.3f s: %.3f questions/s (%s)\n", A->n_items, wall, A->n_items / wall,
            A->n_cascaded == A->n_items ? "cascade" : A->n_cascaded > 0 ? "pipelined and cascade"
            : A->sequential ? "sequential" : "pipelined");
    if (first_audio) spread("first audio sample", first_audio, n_fa);
    if (done) spread(A->tts_rate > 0 ? "answer spoken" : "answer written", done, n_done);
    free(first_audio);
    free(done);
    for (int k = 0; k < 4; k++) {
        if (!A->acc[k].name[0]) continue;
        fprintf(stderr, "%s brick (%s): %llu requests, busy %.3f s (%.0f%% of the run)\n", A->acc[k].name,
                A->acc[k].device, (unsigned long long)A->acc[k].n, A->acc[k].busy, 100.0 * A->acc[k].busy / wall);
    }
    if (A->n_cascaded > 0)
        fprintf(stderr, "cascade: %d of %d questions, each brick loaded, run and released in turn; peak RSS by stage: "
                        "whisper %.1f MiB, vision %.1f MiB, decoder %.1f MiB, voice %.1f MiB\n",
                A->n_cascaded, A->n_items, A->stage_peak_kb[0] / 1024.0, A->stage_peak_kb[1] / 1024.0,
                A->stage_peak_kb[2] / 1024.0, A->stage_peak_kb[3] / 1024.0);
    const int ep_eng = nm_ledger_endpoint(A->ledger, "espeak-ng"), ep_tts = nm_ledger_endpoint(A->ledger, "tts");
    const uint64_t mic = A->mic_dev ? nm_ledger_bytes(A->ledger, A->ep_mic, A->ep_stt) : 0;
    const uint64_t heard = A->stt_model ? nm_ledger_bytes(A->ledger, A->ep_stt, A->ep_llm) : 0;
    const uint64_t engine = nm_ledger_bytes(A->ledger, ep_tts, ep_eng) + nm_ledger_bytes(A->ledger, ep_eng, ep_tts);
    const uint64_t total = nm_ledger_total(A->ledger);
    fprintf(stderr, "ledger: %llu bytes copied (%llu copies): the microphone's audio into the STT slots %llu, the "
                    "transcripts into the chats %llu, espeak-ng's text and samples %llu, anything else %llu\n",
            (unsigned long long)total, (unsigned long long)nm_ledger_copies(A->ledger, -1, -1), (unsigned long long)mic,
            (unsigned long long)heard, (unsigned long long)engine, (unsigned long long)(total - mic - heard - engine));
    fprintf(stderr, "peak RSS: %.1f MiB\n", peak_rss_kb(A) / 1024.0);
    const energy_report *E = &A->energy;
    fprintf(stderr, "energy (modelled: %.2f W idle, %.2f W with all %d cores busy, %.0f pJ a DRAM byte; docs/power.md):\n",
            E->model.idle_w, E->model.active_w, E->model.n_cores, E->model.pj_byte > 0 ? E->model.pj_byte : 80.0);
    for (int k = 0; k < 4; k++) {
        if (!A->acc[k].name[0]) continue;
        fprintf(stderr, "  %s brick: %.3f s busy x %d threads, %.1f MB streamed: %.3f J over idle (modelled)\n",
                A->acc[k].name, A->acc[k].busy, A->acc[k].threads, A->dram[k] / 1e6, E->brick_j[k]);
    }
    fprintf(stderr, "  the run: %.3f CPU-s in %.3f s, %.1f MB streamed: %.3f J (modelled), %.3f J a question\n",
            E->cpu_s, wall, E->dram / 1e6, E->run_j, A->n_items ? E->run_j / A->n_items : 0.0);
    for (int32_t m = 0; m < E->measured.n; m++)
        fprintf(stderr, "  %s: %.3f J in %.3f s (measured), %.3f J a question\n", E->measured.name[m],
                E->measured.joules[m], E->measured.seconds, A->n_items ? E->measured.joules[m] / A->n_items : 0.0);
    if (E->measured.n == 0) fprintf(stderr, "  no energy meter on this machine: modelled only\n");
}

// Loads the bricks the parameters ask for (the vision brick feeds the LLM brick).
static nm_status load_bricks(app *A) {
    char err[512];
    nm_status st;
    if ((st = nm_brick_load(NULL, &A->lp, &A->llm, err, sizeof err)) != NM_OK) {
        fprintf(stderr, "error: the language model's brick: %s: %s\n", nm_status_str(st), err);
        return st;
    }
    A->vp.feeds = A->llm;
    if (A->vp.model && (st = nm_brick_load(NULL, &A->vp, &A->vision, err, sizeof err)) != NM_OK) {
        fprintf(stderr, "error: cannot load mmproj '%s': %s: %s\n", A->vp.model, nm_status_str(st), err);
        return st;
    }
    if (A->sp.model && (st = nm_brick_load(NULL, &A->sp, &A->stt, err, sizeof err)) != NM_OK) {
        fprintf(stderr, "error: cannot load '%s': %s: %s\n", A->sp.model, nm_status_str(st), err);
        return st;
    }
    if (A->out_dir && !A->no_voice && (st = nm_brick_load(NULL, &A->tp, &A->tts, err, sizeof err)) != NM_OK) {
        fprintf(stderr, "error: the voice: %s: %s\n", nm_status_str(st), err);
        return st;
    }
    if (A->tts) A->tts_rate = nm_brick_tts_sample_rate(A->tts);
    return NM_OK;
}

// A brick's counters into A->acc[k] before it is freed (0 stt, 1 vision, 2 llm, 3 tts).
static void keep_stats(app *A, int k, const nm_brick *b) {
    if (!b) return;
    nm_brick_stats bs = nm_brick_get_stats(b);
    snprintf(A->acc[k].name, sizeof A->acc[k].name, "%s", nm_brick_name(b));
    snprintf(A->acc[k].device, sizeof A->acc[k].device, "%s", nm_brick_device(b));
    A->acc[k].n += bs.n_requests;
    A->acc[k].busy += bs.t_busy;
    const nm_brick_params *p = k == 0 ? &A->sp : k == 1 ? &A->vp : k == 2 ? &A->lp : &A->tp;
    const int32_t cores = cli_energy_default().n_cores;
    A->acc[k].threads = k == 3 ? 1 : p->n_threads > 0 && p->n_threads < cores ? p->n_threads : cores; // espeak-ng: one
}

static void free_bricks(app *A) {
    keep_stats(A, 0, A->stt);
    keep_stats(A, 1, A->vision);
    keep_stats(A, 2, A->llm);
    keep_stats(A, 3, A->tts);
    nm_brick_free(A->vision);
    nm_brick_free(A->stt);
    nm_brick_free(A->tts);
    nm_brick_free(A->llm);
    A->vision = A->stt = A->tts = A->llm = NULL;
}

// A unit's name as a brick's placement: "cpu", "cpu:SPEC" (a lane: its cores),
// "opencl[:N]" (a device). False for a unit this build cannot place on (an NPU).
static bool placement(const nm_unit_profile *u, const char **device, const char **cores) {
    if (!strcmp(u->name, "cpu") || !strncmp(u->name, "cpu:", 4)) {
        *device = "cpu";
        *cores = u->name[3] ? u->name + 4 : NULL;
        return true;
    }
    if (!strcmp(u->name, "opencl") || !strncmp(u->name, "opencl:", 7)) {
        *device = u->name;
        *cores = NULL;
        return true;
    }
    return false;
}

// --plan: the planner places the bricks on the profiled units from their
// estimates for a typical question (3 s of speech, a frame at the encoder's
// size, 40 tokens of text around it, -n tokens of answer, ~4 bytes of text a
// token spoken); the plan is printed and the bricks are loaded again there.
// 0, or an exit status.
static int place_by_plan(app *A) {
    int rc = cli_load_units(A->o.profile, A->units, &A->n_units);
    if (rc) return rc;
    nm_plan_brick b[4];
    nm_brick *which[4];
    int32_t n = 0;
    nm_status st = NM_OK;
    int64_t image_rows = 0;
    memset(b, 0, sizeof b);
    if (A->stt) {
        b[n] = (nm_plan_brick){.kind = NM_BRICK_STT, .name = "stt", .units = nm_brick_impl(A->stt)->units};
        which[n] = A->stt;
        st = nm_brick_estimate(A->stt, &(nm_brick_input){.n_samples = 3 * 16000}, &b[n++].cost);
    }
    if (st == NM_OK && A->vision) {
        b[n] = (nm_plan_brick){.kind = NM_BRICK_VISION, .name = "vision", .units = nm_brick_impl(A->vision)->units};
        which[n] = A->vision;
        st = nm_brick_estimate(A->vision, &(nm_brick_input){0}, &b[n].cost);
        image_rows = b[n++].cost.n_out;
    }
    const int64_t n_predict = A->lp.llm.n_predict;
    if (st == NM_OK) {
        b[n] = (nm_plan_brick){.kind = NM_BRICK_LLM, .name = "llm", .units = nm_brick_impl(A->llm)->units,
                               .n_layer = nm_model_n_layer(A->m)};
        which[n] = A->llm;
        const nm_brick_input li = {.n_tokens = 40 + image_rows, .n_predict = n_predict};
        st = nm_brick_estimate(A->llm, &li, &b[n].cost);
        if (st == NM_OK)
            st = nm_brick_estimate(A->llm, &(nm_brick_input){.n_past = li.n_tokens, .n_predict = n_predict},
                                   &b[n].decode);
        n++;
    }
    if (st == NM_OK && A->tts) {
        b[n] = (nm_plan_brick){.kind = NM_BRICK_TTS, .name = "tts", .units = nm_brick_impl(A->tts)->units};
        which[n] = A->tts;
        st = nm_brick_estimate(A->tts, &(nm_brick_input){.n_bytes = 4 * n_predict}, &b[n++].cost);
    }
    if (st != NM_OK) {
        fprintf(stderr, "error: a brick's estimate: %s\n", nm_status_str(st));
        return 1;
    }
    nm_plan p;
    char err[512], buf[4096];
    if ((st = nm_plan_make(A->units, A->n_units, b, n, (nm_plan_goal)A->o.plan_goal, &p, err, sizeof err)) != NM_OK) {
        fprintf(stderr, "error: %s\n", err);
        return 1;
    }
    if (nm_plan_format(&p, A->units, b, buf, sizeof buf) > 0) fputs(buf, stderr);
    for (int32_t i = 0; i < n; i++) {
        const nm_plan_step *stp = &p.steps[i];
        const nm_unit_profile *u = &A->units[stp->unit], *u2 = stp->unit2 >= 0 ? &A->units[stp->unit2] : NULL;
        const char *dev = NULL, *cores = NULL, *dev2 = NULL, *cores2 = NULL;
        if (!placement(u, &dev, &cores) || (u2 && !placement(u2, &dev2, &cores2))) {
            fprintf(stderr, "error: the plan puts %s on %s, which this build cannot run bricks on\n", b[i].name,
                    u2 && placement(u, &dev, &cores) ? u2->name : u->name);
            return 1;
        }
        nm_brick_params *bp = which[i] == A->llm ? &A->lp : which[i] == A->vision ? &A->vp
                              : which[i] == A->stt ? &A->sp : &A->tp;
        int32_t ngl = -1;
        if (u2) { // the decoder's first `split` layers on u, the rest on u2
            if (!strcmp(dev, "cpu") && strcmp(dev2, "cpu")) { // the last layers on a device: -ngl
                dev = dev2;
                ngl = b[i].n_layer - stp->split;
            } else { // two CPU lanes (or a device first): not a split we run; the larger share's unit
                if (stp->split * 2 < b[i].n_layer) dev = dev2, cores = cores2, u = u2;
                fprintf(stderr, "note: the plan splits %s over %s and %s; it runs whole on %s\n", b[i].name,
                        A->units[stp->unit].name, A->units[stp->unit2].name, u->name);
            }
        }
        bp->device = dev;
        bp->cores = cores;
        if (which[i] == A->llm) bp->n_gpu_layers = ngl;
        fprintf(stderr, "placed: %s on %s%s%s", b[i].name, dev, cores ? ", cores " : "", cores ? cores : "");
        if (ngl >= 0) fprintf(stderr, ", its last %d layers there and the others on the CPU", ngl);
        fprintf(stderr, "\n");
    }
    free_bricks(A);
    return load_bricks(A) == NM_OK ? 0 : 1;
}

// ---- the cascade ---------------------------------------------------------------------------
// The critical battery state (or --cascade): each brick is loaded, runs this
// question once and is released before the next one loads, and only the
// transcript and the answer (text) pass between them; the frame's embeddings
// go straight into the decoder's input ring (the decoder's brick is made, its
// weights mapped and not yet read, while the encoder runs). Nothing stays
// resident between questions but the process itself.

// The peak RSS from here on (Linux: clear_refs 5 resets VmHWM), and what it is now.
static void peak_reset(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (f) {
        fputs("5", f);
        fclose(f);
    }
}
static long peak_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %ld", &kb) == 1) break;
    if (f) fclose(f);
    return kb;
}
static void stage_done(app *A, int k) {
    long kb = peak_kb();
    if (kb > A->stage_peak_kb[k]) A->stage_peak_kb[k] = kb;
}

typedef struct step_arg {
    nm_brick *b;
    nm_tabm *in, *out;
    nm_status st;
} step_arg;
static void *step_main(void *p) {
    step_arg *a = p;
    a->st = nm_brick_step(a->b, a->in, a->out);
    return NULL;
}

static void free_ring(nm_tabm **r) {
    nm_tabm_free(*r);
    *r = NULL;
}

// The decoder's answer to request id from A->tok, printed as it comes and
// returned (malloc'd; NULL when it failed), with where the pipelined reader
// would cut it into the voice's slots (cuts[], at most MAX_CUTS: after a
// line's end, before the blank after a sentence's end), so that both speak
// alike. The decoder runs on another thread.
#define MAX_CUTS 256
static char *collect_answer(app *A, item *it, uint64_t id, size_t *cuts, int *n_cuts) {
    nm_detok dt = {0};
    size_t cap = 1024, len = 0;
    char *text = malloc(cap);
    bool failed = text == NULL, ended_sentence = false;
    *n_cuts = 0;
    printf("> %s\n", it->question);
    for (;;) {
        nm_tabm_slot sl;
        if (nm_tabm_acquire_read(A->tok, -1, &sl) != NM_OK) {
            failed = true;
            break;
        }
        const uint64_t user = sl.meta->user;
        const int32_t *toks = sl.data;
        const int32_t n = sl.meta->request == id && sl.meta->ndim == 1 ? (int32_t)sl.meta->shape[0] : 0;
        for (int32_t k = 0; k < n; k++) {
            char piece[256];
            const int32_t pn = answer_piece(A, it, &dt, toks[k], piece, (int32_t)sizeof piece);
            if (pn <= 0) continue;
            if (text && len + (size_t)pn + 1 > cap) {
                char *t = realloc(text, cap * 2 + (size_t)pn);
                if (!t) {
                    failed = true;
                    continue;
                }
                text = t;
                cap = cap * 2 + (size_t)pn;
            }
            if (cut_before(ended_sentence, piece) && *n_cuts < MAX_CUTS) cuts[(*n_cuts)++] = len;
            if (text) {
                memcpy(text + len, piece, (size_t)pn);
                len += (size_t)pn;
            }
            ended_sentence = ends_sentence(piece, pn);
            if (cut_after(piece, pn) && *n_cuts < MAX_CUTS) cuts[(*n_cuts)++] = len;
        }
        nm_tabm_release(A->tok, &sl);
        if (user & NM_BRICK_MORE) continue;
        if (user & NM_BRICK_ERROR) {
            fprintf(stderr, "error: question %llu: %s\n", (unsigned long long)id, nm_brick_last_error(A->llm));
            failed = true;
        }
        break;
    }
    printf("\n");
    fflush(stdout);
    if (failed) {
        free(text);
        return NULL;
    }
    text[len] = '\0';
    return text;
}

// The answer spoken into OUT/answer-NNN.wav: the voice loaded, fed the text a
// sentence (or a slot) at a time while its samples are written, released.
static bool cascade_speak(app *A, item *it, uint64_t id, const char *text, const size_t *cuts, int n_cuts) {
    char err[512];
    nm_status st;
    peak_reset();
    if ((st = nm_brick_load(NULL, &A->tp, &A->tts, err, sizeof err)) != NM_OK) {
        fprintf(stderr, "error: the voice: %s: %s\n", nm_status_str(st), err);
        return false;
    }
    A->tts_rate = nm_brick_tts_sample_rate(A->tts);
    bool ok = nm_tabm_create(NULL, 16, SAY_SLOT_BYTES, &A->say, err, sizeof err) == NM_OK &&
              nm_tabm_create(NULL, SPEECH_SLOTS, nm_brick_out_slot_bytes(A->tts), &A->speech, err, sizeof err) == NM_OK;
    step_arg sa = {A->tts, A->say, A->speech, NM_OK};
    pthread_t th_step, th_sink;
    bool step = false, sink = false;
    A->speech_gone = false;
    if (ok) sink = pthread_create(&th_sink, NULL, speech_main, A) == 0;
    if (sink) step = pthread_create(&th_step, NULL, step_main, &sa) == 0;
    ok = ok && sink && step;
    // the text in slots, cut where the pipelined reader cuts it (and at SAY_SLOT_BYTES), the last one
    // (maybe empty) ending the request
    const size_t len = strlen(text);
    size_t at = 0;
    for (int c = 0; ok && c <= n_cuts; c++) {
        const size_t end = c < n_cuts ? cuts[c] : len;
        const bool last = c == n_cuts;
        while (ok && (at < end || last)) {
            nm_tabm_slot sl;
            if (nm_tabm_acquire_write(A->say, 0, -1, &sl) != NM_OK) {
                ok = false;
                break;
            }
            const size_t n = end - at < sl.capacity ? end - at : sl.capacity;
            memcpy(sl.data, text + at, n);
            at += n;
            const bool more = !(last && at == end);
            *sl.meta = (nm_tabm_meta){.kind = NM_TABM_TEXT, .ndim = n ? 1 : 0, .shape = {(int64_t)n}, .size = n,
                                      .user = more ? NM_BRICK_MORE : 0, .request = id};
            if (nm_tabm_publish(A->say, &sl) != NM_OK) {
                nm_tabm_cancel(A->say, &sl);
                ok = false;
            }
            if (!more) break;
        }
    }
    if (step) pthread_join(th_step, NULL);
    if (A->speech) nm_tabm_shutdown(A->speech); // the sink drains the answer's samples and ends
    if (sink) pthread_join(th_sink, NULL);
    ok = ok && sa.st == NM_OK;
    if (!ok) fprintf(stderr, "error: question %llu: the voice failed%s%s\n", (unsigned long long)id, err[0] ? ": " : "",
                     err);
    it->n_said = len;
    add_traffic(A, 3, A->tts, (nm_brick_input){.n_bytes = (int64_t)len});
    keep_stats(A, 3, A->tts);
    nm_brick_free(A->tts);
    A->tts = NULL;
    free_ring(&A->say);
    free_ring(&A->speech);
    stage_done(A, 3);
    return ok;
}

// One question as the cascade: Whisper, then the decoder with the frame's
// encoder feeding it, then the voice; each released before the next loads.
static void cascade_question(app *A, int i) {
    item *it = &A->items[i];
    const uint64_t id = (uint64_t)i + 1;
    char err[512];
    nm_status st;
    it->t_start = now(A);
    A->n_cascaded++;
    bool ok = true;
    if (it->audio) { // Whisper: load, transcribe, release
        peak_reset();
        if ((st = nm_brick_load(NULL, &A->sp, &A->stt, err, sizeof err)) != NM_OK) {
            fprintf(stderr, "error: cannot load '%s': %s: %s\n", A->sp.model, nm_status_str(st), err);
            ok = false;
        }
        if (ok) A->ep_stt = nm_ledger_endpoint(A->ledger, nm_brick_name(A->stt));
        ok = ok && nm_tabm_create(NULL, 1, sizeof(float) * 16000 * MAX_QUESTION_S, &A->pcm, err, sizeof err) == NM_OK &&
             nm_tabm_create(NULL, 64, nm_brick_out_slot_bytes(A->stt), &A->heard, err, sizeof err) == NM_OK;
        ok = ok && send_audio(A, it, id);
        step_arg sa = {A->stt, A->pcm, A->heard, NM_OK};
        pthread_t th;
        const bool started = ok && pthread_create(&th, NULL, step_main, &sa) == 0;
        ok = started && read_transcript(A, it, id);
        if (started) pthread_join(th, NULL);
        if (!ok && !it->question[0]) fprintf(stderr, "question %d: no speech heard\n", i + 1);
        keep_stats(A, 0, A->stt);
        nm_brick_free(A->stt);
        A->stt = NULL;
        free_ring(&A->pcm);
        free_ring(&A->heard);
        stage_done(A, 0);
    }
    it->t_heard = now(A);
    if (!ok) {
        it->failed = true;
        it->t_answered = it->t_spoken = now(A);
        return;
    }
    // the decoder: its model mapped and its brick made; the frame's encoder loaded to feed it
    peak_reset();
    nm_model_params mp = nm_model_default_params();
    mp.n_threads = A->o.n_threads;
    mp.no_mmap = A->o.no_mmap;
    if (!A->m && (st = nm_model_load(A->o.model, &mp, &A->m, err, sizeof err)) != NM_OK) {
        fprintf(stderr, "error: cannot load '%s': %s: %s\n", A->o.model, nm_status_str(st), err);
        ok = false;
    }
    A->lp.llm_model = A->m;
    if (ok && (st = nm_brick_load(NULL, &A->lp, &A->llm, err, sizeof err)) != NM_OK) {
        fprintf(stderr, "error: the language model's brick: %s: %s\n", nm_status_str(st), err);
        ok = false;
    }
    const bool frame = ok && it->frame && A->vp.model;
    if (frame) {
        A->vp.feeds = A->llm;
        if ((st = nm_brick_load(NULL, &A->vp, &A->vision, err, sizeof err)) != NM_OK) {
            fprintf(stderr, "error: cannot load mmproj '%s': %s: %s\n", A->vp.model, nm_status_str(st), err);
            ok = false;
        }
    }
    size_t llm_slot = ok ? nm_brick_in_slot_bytes(A->llm) : 0;
    if (A->vision && nm_brick_out_slot_bytes(A->vision) > llm_slot) llm_slot = nm_brick_out_slot_bytes(A->vision);
    ok = ok && nm_tabm_create(NULL, LLM_IN_SLOTS, llm_slot, &A->llm_in, err, sizeof err) == NM_OK &&
         nm_tabm_create(NULL, 16, nm_brick_out_slot_bytes(A->llm), &A->tok, err, sizeof err) == NM_OK &&
         (!A->vision || nm_tabm_create(NULL, 1, frame_bytes(A), &A->img, err, sizeof err) == NM_OK);
    if (ok) {
        ask(A, i); // the prompt (the frame encoded on this thread into the decoder's ring)
        if (A->vision) { // the encoder is done with this question: released before the decoder runs
            keep_stats(A, 1, A->vision);
            nm_brick_free(A->vision);
            A->vision = NULL;
            free_ring(&A->img);
            stage_done(A, 1);
            peak_reset();
        }
    }
    char *answer = NULL;
    size_t cuts[MAX_CUTS];
    int n_cuts = 0;
    if (ok && !it->failed) {
        step_arg sa = {A->llm, A->llm_in, A->tok, NM_OK};
        pthread_t th;
        if (pthread_create(&th, NULL, step_main, &sa) == 0) {
            answer = collect_answer(A, it, id, cuts, &n_cuts);
            pthread_join(th, NULL);
        }
    }
    it->t_answered = now(A);
    if (!answer) it->failed = true;
    else note_speed(A, it, it->t_answered);
    add_traffic(A, 2, A->llm, (nm_brick_input){.n_tokens = it->n_prompt, .n_predict = it->n_tokens});
    keep_stats(A, 1, A->vision);
    nm_brick_free(A->vision);
    A->vision = NULL;
    keep_stats(A, 2, A->llm);
    nm_brick_free(A->llm);
    A->llm = NULL;
    nm_model_free(A->m); // its pages go with the mapping
    A->m = NULL;
    free_ring(&A->img);
    free_ring(&A->llm_in);
    free_ring(&A->tok);
    stage_done(A, 2);
    // the voice
    if (answer && A->out_dir && !cascade_speak(A, it, id, answer, cuts, n_cuts)) it->failed = true;
    if (!A->out_dir || !answer) it->t_spoken = now(A);
    free(answer);
    pthread_mutex_lock(&A->lock);
    A->n_answered++;
    if (!A->out_dir || !answer) A->n_spoken++;
    pthread_mutex_unlock(&A->lock);
}

// ---- the resident pipeline ----------------------------------------------------------------

// Every brick loaded (where --plan puts them, the first time), the rings, the
// lanes and the reader threads started. 0, or the exit status.
static int start_resident(app *A) {
    char err[512];
    nm_status st;
    if (!A->m) {
        nm_model_params mp = nm_model_default_params();
        mp.n_threads = A->o.n_threads;
        mp.no_mmap = A->o.no_mmap;
        if ((st = nm_model_load(A->o.model, &mp, &A->m, err, sizeof err)) != NM_OK) {
            fprintf(stderr, "error: cannot load '%s': %s: %s\n", A->o.model, nm_status_str(st), err);
            return 1;
        }
    }
    A->lp.llm_model = A->m;
    if (load_bricks(A) != NM_OK) return 1;
    if (!A->planned) cli_ctx_note(nm_brick_llm_ctx(A->llm));
    if (A->o.plan && !A->planned) { // the bricks again, where the planner puts them
        int prc = place_by_plan(A);
        if (prc) return prc;
    }
    A->planned = true;
    if (A->stt) A->ep_stt = nm_ledger_endpoint(A->ledger, nm_brick_name(A->stt));
    if (A->tts && A->speaker_dev && !A->player &&
        nm_audio_player_open(A->speaker_dev, nm_brick_tts_sample_rate(A->tts), &A->player, err, sizeof err) != NM_OK) {
        fprintf(stderr, "speaker skipped: %s: the answers are printed, not spoken\n", err); // an absent device
        A->no_voice = true;
        nm_brick_free(A->tts);
        A->tts = NULL;
    }
    // the rings
    size_t llm_slot = nm_brick_in_slot_bytes(A->llm);
    if (A->vision && nm_brick_out_slot_bytes(A->vision) > llm_slot) llm_slot = nm_brick_out_slot_bytes(A->vision);
    if ((st = nm_tabm_create(NULL, LLM_IN_SLOTS, llm_slot, &A->llm_in, err, sizeof err)) != NM_OK ||
        (st = nm_tabm_create(NULL, 16, nm_brick_out_slot_bytes(A->llm), &A->tok, err, sizeof err)) != NM_OK ||
        (A->vision && (st = nm_tabm_create(NULL, 1, frame_bytes(A), &A->img, err, sizeof err)) != NM_OK) ||
        (A->stt && (st = nm_tabm_create(NULL, A->mic_dev ? 8 : 2, sizeof(float) * 16000 * MAX_QUESTION_S, &A->pcm,
                                        err, sizeof err)) != NM_OK) ||
        (A->stt && (st = nm_tabm_create(NULL, 8, nm_brick_out_slot_bytes(A->stt), &A->heard, err, sizeof err)) != NM_OK) ||
        (A->tts && (st = nm_tabm_create(NULL, 16, SAY_SLOT_BYTES, &A->say, err, sizeof err)) != NM_OK) ||
        (A->tts && (st = nm_tabm_create(NULL, SPEECH_SLOTS, nm_brick_out_slot_bytes(A->tts), &A->speech, err,
                                        sizeof err)) != NM_OK)) {
        fprintf(stderr, "error: cannot create the rings: %s: %s\n", nm_status_str(st), err);
        return 1;
    }
    // the lanes
    A->L_llm = (lane){.b = A->llm, .in = A->llm_in, .out = A->tok};
    A->L_stt = (lane){.b = A->stt, .in = A->pcm, .out = A->heard};
    A->L_tts = (lane){.b = A->tts, .in = A->say, .out = A->speech};
    A->answers_gone = A->speech_gone = false;
    A->resident = true; // (stop_resident undoes what started, whatever fails below)
    A->L_llm.started = pthread_create(&A->L_llm.th, NULL, lane_main, &A->L_llm) == 0;
    if (A->stt) A->L_stt.started = pthread_create(&A->L_stt.th, NULL, lane_main, &A->L_stt) == 0;
    if (A->tts) A->L_tts.started = pthread_create(&A->L_tts.th, NULL, lane_main, &A->L_tts) == 0;
    A->answers_started = pthread_create(&A->th_answers, NULL, answers_main, A) == 0;
    if (A->tts) A->speech_started = pthread_create(&A->th_speech, NULL, speech_main, A) == 0;
    if (!A->L_llm.started || !A->answers_started || (A->stt && !A->L_stt.started) ||
        (A->tts && (!A->L_tts.started || !A->speech_started))) {
        fprintf(stderr, "error: cannot start the lanes' threads\n");
        return 1;
    }
    return 0;
}

// Waits until every question asked of the pipeline is answered (and
// spoken), then shuts the rings (each lane ends and shuts its other ring, the
// readers end), and frees the rings, the bricks and the model.
static void stop_resident(app *A) {
    if (A->answers_started)
        wait_for(A, &A->n_spoken, A->n_asked + A->n_cascaded, A->tts ? &A->speech_gone : &A->answers_gone);
    nm_tabm *rings[] = {A->pcm, A->heard, A->llm_in, A->tok, A->img, A->say, A->speech};
    for (size_t k = 0; k < sizeof rings / sizeof rings[0]; k++)
        if (rings[k]) nm_tabm_shutdown(rings[k]);
    lane *lanes[] = {&A->L_llm, &A->L_stt, &A->L_tts};
    for (int k = 0; k < 3; k++)
        if (lanes[k]->started) pthread_join(lanes[k]->th, NULL);
    if (A->answers_started) pthread_join(A->th_answers, NULL);
    if (A->speech_started) pthread_join(A->th_speech, NULL);
    A->answers_started = A->speech_started = false;
    memset(&A->L_llm, 0, sizeof(lane) );
    memset(&A->L_stt, 0, sizeof(lane));
    memset(&A->L_tts, 0, sizeof(lane));
    free_ring(&A->pcm);
    free_ring(&A->heard);
    free_ring(&A->llm_in);
    free_ring(&A->tok);
    free_ring(&A->img);
    free_ring(&A->say);
    free_ring(&A->speech);
    free_bricks(A);
    nm_model_free(A->m);
    A->m = NULL;
    A->resident = false;
}

// ---- the battery -----------------------------------------------------------------------------

// Reads the battery and steps the policy before a question: the frame rate,
// the decoder's pace and the DVFS caps follow it. True when the state is critical
// (the question runs as the cascade).
static bool power_step(app *A) {
    double t0, t1;
    nm_battery_span(A->battery, &t0, &t1);
    nm_battery_reading r;
    nm_battery_read(A->battery, t0 + now(A) * A->battery_speed, &r);
    if (r.note[0]) fprintf(stderr, "battery: %s\n", r.note);
    const bool started = A->policy.started;
    const nm_power_state before = A->policy.state;
    nm_power_targets tg = nm_power_policy_step(&A->policy, r.pct);
    pthread_mutex_lock(&A->lock);
    A->decode_cap = tg.decode_share < 1 && A->full_tps > 0 ? tg.decode_share * A->full_tps : 0;
    const double cap = A->decode_cap;
    pthread_mutex_unlock(&A->lock);
    A->fps_cap = tg.state == NM_POWER_CRITICAL ? 0 : tg.fps;
    if (!started || tg.state != before)
        fprintf(stderr, "power: battery %.1f %%: %s, alpha %.2f: frames %.2f/s, decoder %.0f%% of its speed%s%s\n",
                r.pct, nm_power_state_name(tg.state), tg.alpha, tg.fps, 100 * tg.decode_share,
                tg.cascade ? ", each brick loaded, run and released in turn" : "",
                cap > 0 ? "" : tg.decode_share < 1 ? " (once an answer has measured it)" : "");
    char err[512];
    if (A->dvfs && nm_power_actuators_apply(A->dvfs, &tg, err, sizeof err) != NM_OK)
        fprintf(stderr, "power: DVFS not applied: %s\n", err);
    return tg.state == NM_POWER_CRITICAL;
}

// Takes the assistant's own options out of argv (the rest is `run`'s).
static bool take_own(app *A, int *argc, char **argv) {
    int w = 1;
    for (int i = 1; i < *argc; i++) {
        const char *a = argv[i];
        const char **dst = !strcmp(a, "--stt") ? &A->stt_model : !strcmp(a, "--audio") ? &A->audio
                           : !strcmp(a, "--frames") ? &A->frames : !strcmp(a, "--out") ? &A->out_dir
                           : !strcmp(a, "--tts") ? &A->tts_engine : !strcmp(a, "--voice") ? &A->voice
                           : !strcmp(a, "--stt-cores") ? &A->stt_cores : !strcmp(a, "--tts-cores") ? &A->tts_cores
                           : !strcmp(a, "--json") ? &A->json_path
                                                                                                : NULL;
        if (dst) {
            if (i + 1 >= *argc || !argv[i + 1][0]) {
                fprintf(stderr, "error: %s needs a value\n", a);
                return false;
            }
            *dst = argv[++i];
        } else if (!strcmp(a, "--fps")) {
            if (i + 1 >= *argc || !cli_arg_float("--fps", argv[i + 1], 0.0f, 1000.0f, &A->fps)) {
                if (i + 1 >= *argc) fprintf(stderr, "error: --fps needs a value\n");
                return false;
            }
            i++;
        } else if (!strcmp(a, "--listen")) {
            if (i + 1 >= *argc || !cli_arg_float("--listen", argv[i + 1], 0.0f, 86400.0f, &A->listen_s)) {
                if (i + 1 >= *argc) fprintf(stderr, "error: --listen needs a value\n");
                return false;
            }
            i++;
        } else if (!strcmp(a, "--sequential")) {
            A->sequential = true;
        } else if (!strcmp(a, "--cascade")) {
            A->cascade_always = true;
        } else if (!strcmp(a, "--battery") || !strcmp(a, "--power-sysfs")) {
            if (i + 1 >= *argc || !argv[i + 1][0]) {
                fprintf(stderr, "error: %s needs a value\n", a);
                return false;
            }
            *(!strcmp(a, "--battery") ? &A->battery_src : &A->power_sysfs) = argv[++i];
        } else if (!strcmp(a, "--battery-speed")) {
            float x;
            if (i + 1 >= *argc || !cli_arg_float("--battery-speed", argv[i + 1], 0.001f, 1e9f, &x)) {
                if (i + 1 >= *argc) fprintf(stderr, "error: --battery-speed needs a value\n");
                return false;
            }
            A->battery_speed = x;
            i++;
        } else {
            argv[w++] = argv[i];
        }
    }
    *argc = w;
    // the devices: mic[:DEV] and speaker[:DEV] (ALSA names; "default" without one)
    if (A->audio && (!strcmp(A->audio, "mic") || !strncmp(A->audio, "mic:", 4)))
        A->mic_dev = A->audio[3] ? A->audio + 4 : "default";
    if (A->out_dir && (!strcmp(A->out_dir, "speaker") || !strncmp(A->out_dir, "speaker:", 8)))
        A->speaker_dev = A->out_dir[7] ? A->out_dir + 8 : "default";
    return true;
}

int cmd_assistant(int argc, char **argv) {
    app A;
    memset(&A, 0, sizeof A);
    A.tts_engine = "espeak-ng";
    if (!take_own(&A, &argc, argv)) return 2;
    if (!cli_parse("assistant", CLI_MPATH | CLI_MODEL | CLI_CTX | CLI_PROMPT | CLI_GEN | CLI_VISION | CLI_STATS | CLI_LANE | CLI_PLAN,
                   argc, argv, &A.o, NULL))
        return 2;
    cli_opts *o = &A.o;
    int rc = 2;
    if (o->help) {
        usage(stdout);
        cli_opts_free(o);
        return 0;
    }
    if (o->version) {
        cli_print_version();
        cli_opts_free(o);
        return 0;
    }
    if (!o->model) {
        fprintf(stderr, "error: give the language model with -m FILE\n");
        goto out;
    }
    if (!A.audio == !o->prompt) {
        fprintf(stderr, "error: give the questions: --audio FILE|DIR (spoken, with --stt) or -p TEXT (typed), one "
                        "of the two\n");
        goto out;
    }
    if (A.audio && !A.stt_model) {
        fprintf(stderr, "error: --audio needs a Whisper model: --stt FILE\n");
        goto out;
    }
    if (!A.frames != !o->mmproj) {
        fprintf(stderr, "error: --frames and --mmproj go together\n");
        goto out;
    }
    if (o->n_images > 0) {
        fprintf(stderr, "error: the assistant takes its images from --frames, not --image\n");
        goto out;
    }
    if (o->plan && (o->cores || o->mmproj_cores || A.stt_cores || A.tts_cores || o->device || o->mmproj_device ||
                    o->n_gpu_layers != -1)) {
        fprintf(stderr, "error: --plan places the bricks: drop --cores, --mmproj-cores, --stt-cores, --tts-cores, -dev, "
                        "--mmproj-device and -ngl\n");
        goto out;
    }
    if ((o->plan_goal || o->profile) && !o->plan) {
        fprintf(stderr, "error: --plan-goal and --profile go with --plan\n");
        goto out;
    }
    if (A.listen_s > 0 && !A.mic_dev) {
        fprintf(stderr, "error: --listen goes with --audio mic\n");
        goto out;
    }
    if (A.mic_dev && A.frames) {
        fprintf(stderr, "error: --frames pairs a folder's frames with a folder's questions, not with a microphone\n");
        goto out;
    }
    if (A.fps > 0 && !A.frames) {
        fprintf(stderr, "error: --fps goes with --frames\n");
        goto out;
    }
    if (strcmp(A.tts_engine, "espeak-ng") && strcmp(A.tts_engine, "none")) {
        fprintf(stderr, "error: --tts takes espeak-ng or none, not '%s'\n", A.tts_engine);
        goto out;
    }
    if (A.out_dir && !strcmp(A.tts_engine, "none")) {
        fprintf(stderr, "error: --out writes speech: it needs a voice (not --tts none)\n");
        goto out;
    }
    if (o->chat_tmpl && !nm_chat_template_known(o->chat_tmpl)) {
        fprintf(stderr, "error: unknown chat template '%s' (known: %s)\n", o->chat_tmpl, nm_chat_template_names());
        goto out;
    }
    if ((A.cascade_always || A.battery_src) && (A.mic_dev || A.speaker_dev)) {
        fprintf(stderr, "error: --cascade and --battery take questions from files and speak into a folder (--audio "
                        "FILE|DIR, --out DIR); the microphone and the speaker are not supported with them yet\n");
        goto out;
    }
    if (A.cascade_always && o->plan) {
        fprintf(stderr, "error: --cascade runs each brick alone on every core: drop --plan\n");
        goto out;
    }
    if ((A.battery_speed > 0 || A.power_sysfs) && !A.battery_src) {
        fprintf(stderr, "error: --battery-speed and --power-sysfs go with --battery\n");
        goto out;
    }
    if (A.json_path) { // its folder must be there now, not after the run
        char *dir = strdup(A.json_path), *slash = dir ? strrchr(dir, '/') : NULL;
        struct stat sb;
        if (slash) *(slash == dir ? slash + 1 : slash) = '\0';
        errno = 0;
        const bool there = dir && stat(slash ? dir : ".", &sb) == 0 && S_ISDIR(sb.st_mode);
        if (!there) fprintf(stderr, "error: --json '%s': %s\n", A.json_path, errno ? strerror(errno) : "not in a folder");
        free(dir);
        if (!there) goto out;
    }
    if (A.out_dir && !A.speaker_dev) {
        struct stat sb;
        if (stat(A.out_dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
            fprintf(stderr, "error: --out '%s': %s\n", A.out_dir, errno ? strerror(errno) : "not a folder");
            goto out;
        }
    }
    rc = 1;
    if (!make_items(&A)) goto out;
    pthread_mutex_init(&A.lock, NULL);
    pthread_cond_init(&A.cond, NULL);

    char err[512];
    nm_status st;
    nm_model_params mp = nm_model_default_params();
    mp.n_threads = o->n_threads;
    mp.no_mmap = o->no_mmap;
    if ((st = nm_model_load(o->model, &mp, &A.m, err, sizeof err)) != NM_OK) {
        fprintf(stderr, "error: cannot load '%s': %s: %s\n", o->model, nm_status_str(st), err);
        goto out;
    }
    cli_mlock(o);
    {
        nm_chat_msg probe = {"user", "hi"};
        char buf[16];
        if (nm_chat_format(A.m, o->chat_tmpl, &probe, 1, true, buf, sizeof buf) == NM_ERR_TEMPLATE) {
            fprintf(stderr, "error: the model names no chat template we know: name one with --chat-template (%s)\n",
                    nm_chat_template_names());
            goto out;
        }
    }
    A.ledger = nm_ledger_create();
    if (!A.ledger) goto out;
    if (A.battery_src) { // PCT, sysfs[:NAME] or trace:CSV
        char *end;
        const double pct = strtod(A.battery_src, &end);
        if (!strncmp(A.battery_src, "trace:", 6))
            st = nm_battery_open_trace(A.battery_src + 6, &A.battery, err, sizeof err);
        else if (!strcmp(A.battery_src, "sysfs") || !strncmp(A.battery_src, "sysfs:", 6))
            st = nm_battery_open_sysfs(NULL, A.battery_src[5] ? A.battery_src + 6 : NULL, &A.battery, err, sizeof err);
        else if (end != A.battery_src && !*end)
            st = nm_battery_open_fixed(pct, &A.battery, err, sizeof err);
        else
        {
            snprintf(err, sizeof err, "--battery takes a percent, sysfs[:NAME] or trace:FILE, not '%s'", A.battery_src);
            st = NM_ERR_INVALID_ARG;
        }
        if (st != NM_OK) {
            fprintf(stderr, "error: %s\n", err);
            rc = st == NM_ERR_INVALID_ARG ? 2 : 1;
            goto out;
        }
        nm_power_policy_init(&A.policy, NULL, NULL, 0);
        if (A.battery_speed <= 0) A.battery_speed = 1;
        if (A.power_sysfs) {
            nm_actuator_params ap = nm_actuator_default_params();
            ap.sysfs_root = A.power_sysfs;
            if ((st = nm_power_actuators_open(&ap, &A.dvfs, err, sizeof err)) != NM_OK) {
                fprintf(stderr, "error: --power-sysfs: %s\n", err);
                goto out;
            }
            nm_power_actuators_guard(A.dvfs);
        }
    }
    A.ep_llm = nm_ledger_endpoint(A.ledger, "llm");
    A.lp = cli_llm_params(o, A.m, A.ledger);
    if (A.lp.llm.n_predict < 0) A.lp.llm.n_predict = 128; // an answer must end
    if (o->mmproj) {
        A.vp = nm_brick_default_params(NM_BRICK_VISION);
        A.vp.model = o->mmproj;
        A.vp.device = o->mmproj_device ? o->mmproj_device : o->device;
        A.vp.n_threads = o->n_threads;
        A.vp.cores = o->mmproj_cores;
        A.vp.ledger = A.ledger;
    }
    if (A.stt_model) {
        A.sp = nm_brick_default_params(NM_BRICK_STT);
        A.sp.model = A.stt_model;
        A.sp.n_threads = o->n_threads;
        A.sp.cores = A.stt_cores;
        A.sp.stt = nm_stt_default_params(NM_STT_GREEDY); // whisper.cpp's stream example decodes greedily too
        A.sp.ledger = A.ledger;
    }
    if (A.out_dir) {
        A.tp = nm_brick_default_params(NM_BRICK_TTS);
        A.tp.cores = A.tts_cores;
        A.tp.ledger = A.ledger;
        if (A.voice) A.tp.tts.voice = A.voice;
    }
    if (A.mic_dev) {
        nm_vad_params vp = nm_vad_default_params();
        if ((st = nm_vad_create(&vp, &A.vad, err, sizeof err)) != NM_OK) {
            fprintf(stderr, "error: %s\n", err);
            goto out;
        }
        A.ep_mic = nm_ledger_endpoint(A.ledger, "microphone");
    }
    if (o->stats || A.json_path) { // the machine's energy meters, if any (else the energy is modelled only)
        if (nm_energy_meters_open(NULL, true, &A.meters, err, sizeof err) != NM_OK) {
            fprintf(stderr, "energy meters: %s: the energy is modelled only\n", err);
        } else if (nm_energy_meters_count(A.meters) == 0 || nm_energy_meters_start(A.meters, err, sizeof err) != NM_OK) {
            nm_energy_meters_free(A.meters);
            A.meters = NULL;
        }
    }
    A.t0 = cli_now();
    A.cpu0 = cli_cpu_seconds();
    bool lanes_failed = false;
    pthread_t th_mic;
    bool mic = false;
    struct sigaction sa = {.sa_handler = on_sigint, .sa_flags = SA_RESTART};
    double next_frame = 0; // when the camera's next frame is due
    for (int i = 0;; i++) {
        if (A.mic_dev) { // the next question once it is heard, until the capture ends
            if (!A.resident) { // the microphone writes into the resident Whisper's ring
                if ((rc = start_resident(&A)) != 0) break;
                sigemptyset(&sa.sa_mask);
                sigaction(SIGINT, &sa, NULL); // Ctrl-C stops listening; the questions heard are answered
                mic = pthread_create(&th_mic, NULL, mic_main, &A) == 0;
                if (!mic) A.mic_done = true;
                fprintf(stderr, "listening on '%s'%s\n", A.mic_dev, A.listen_s > 0 ? "" : " (Ctrl-C stops)");
            }
            pthread_mutex_lock(&A.lock);
            while (i >= A.n_items && !A.mic_done) pthread_cond_wait(&A.cond, &A.lock);
            const bool more = i < A.n_items;
            pthread_mutex_unlock(&A.lock);
            if (!more) break;
        } else if (i >= A.n_items) {
            break;
        }
        bool cascade = A.cascade_always;
        if (A.battery) cascade = power_step(&A) || cascade;
        if (cascade && A.resident) stop_resident(&A);
        if (!cascade && !A.resident && (rc = start_resident(&A)) != 0) {
            lanes_failed = true;
            break;
        }
        A.cascading = cascade;
        if (!cascade && A.sequential && A.n_asked > 0)
            wait_for(&A, &A.n_spoken, A.n_asked, A.tts ? &A.speech_gone : &A.answers_gone);
        float fps = A.fps;
        if (A.fps_cap > 0 && (fps == 0 || A.fps_cap < fps)) fps = (float)A.fps_cap;
        if (A.items[i].frame && fps > 0) { // a camera gives a frame every 1/fps s
            const double t = now(&A);
            if (next_frame > t) {
                struct timespec ts = {(time_t)(next_frame - t),
                                      (long)((next_frame - t - (double)(time_t)(next_frame - t)) * 1e9)};
                nanosleep(&ts, NULL);
            }
            next_frame = (next_frame > t ? next_frame : t) + 1.0 / fps;
        }
        if (cascade) {
            cascade_question(&A, i);
        } else {
            ask(&A, i);
            A.n_asked++;
        }
    }
    if (mic) pthread_join(th_mic, NULL);
    if (A.resident) stop_resident(&A);
    if (A.player) nm_audio_player_drain(A.player, err, sizeof err); // the last answer, played to its end
    const double wall = now(&A);
    rc = rc > 1 ? rc : A.mic_failed || lanes_failed ? 1 : 0;
    for (int i = 0; i < A.n_items; i++) rc = A.items[i].failed ? 1 : rc;
    if (A.mic_dev && A.n_items == 0 && !A.mic_failed) fprintf(stderr, "heard no question\n");
    if (o->stats || A.json_path) energy_end(&A, wall);
    if (o->stats) print_stats(&A, wall);
    if (A.json_path && !write_json(&A, wall)) rc = 1;
out:
    nm_energy_meters_free(A.meters);
    nm_power_actuators_free(A.dvfs); // the frequencies as they were
    nm_battery_free(A.battery);
    free_bricks(&A);
    nm_tabm *all[] = {A.pcm, A.heard, A.llm_in, A.tok, A.img, A.say, A.speech};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) nm_tabm_free(all[k]);
    nm_ledger_free(A.ledger);
    nm_model_free(A.m);
    nm_vad_free(A.vad);
    nm_audio_player_close(A.player);
    for (int i = 0; i < A.n_owned; i++) free(A.owned[i]);
    free(A.owned);
    free(A.items);
    cli_opts_free(o);
    return rc;
}
