// nanomind assistant: where the questions come from (docs/cli.md): audio
// files or a folder of them, typed questions over a folder of frames, the
// microphone (cut into utterances) and a watched folder (each file that
// arrives); and the gates that wake the pipeline (or the cascade) for a
// question: a wake word at the start of its transcript, a frame that changed.
#include <dirent.h>
#include <ctype.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "assistant.h"

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
        // only files: a FIFO or device here is refused now (opened as its reader will, never waited on)
        FILE *f;
        char ferr[512];
        if (nm_infile_open(p, UINT64_MAX, 0, &f, NULL, ferr, sizeof ferr) != NM_OK) {
            fprintf(stderr, "error: %s folder '%s': %s\n", what, path, ferr);
            free(p);
            closedir(d);
            return false;
        }
        fclose(f);
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

static const char *const audio_exts[] = {"wav", "flac", "ogg", "mp3", "opus", "aiff", "au", NULL};
static const char *const image_exts[] = {"png", "jpg", "jpeg", "ppm", NULL};

bool assistant_make_items(app *A) {
    A->owned = calloc(2 * MAX_ITEMS, sizeof(char *));
    if (!A->owned) return false;
    if (A->live) { // questions come as they are heard, or as files arrive
        A->items = calloc(MAX_ITEMS, sizeof(item));
        A->cap_items = MAX_ITEMS;
        A->n_items = 0;
        return A->items != NULL;
    }
    int a0 = 0, na = 0, f0 = 0, nf = 0;
    if (A->audio && !list_files(A, A->audio, "--audio", audio_exts, &a0, &na)) return false;
    if (A->frames && !A->camera_dev && !list_files(A, A->frames, "--frames", image_exts, &f0, &nf)) return false;
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

// ---- a watched folder ----------------------------------------------------------------------

bool assistant_watch_open(app *A) {
    const char *what = A->watch_frames ? "--frames" : "--audio";
    struct stat sb;
    const bool there = stat(A->watch_dir, &sb) == 0;
    if (!there || !S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "error: %s watch:%s: %s\n", what, A->watch_dir, there ? "not a folder" : strerror(errno));
        return false;
    }
    A->watch_fd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    // written and closed there, or moved in (a writer's atomic rename); the folder itself going ends the watch
    if (A->watch_fd < 0 ||
        inotify_add_watch(A->watch_fd, A->watch_dir, IN_CLOSE_WRITE | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF) < 0) {
        fprintf(stderr, "error: %s watch:%s: cannot watch it: %s\n", what, A->watch_dir, strerror(errno));
        if (A->watch_fd >= 0) close(A->watch_fd);
        A->watch_fd = -1;
        return false;
    }
    return true;
}

// Ctrl-C while listening: stop (what was heard is answered); twice: quit. Atomic: the main thread sets it
// too (assistant_stop_listening) and the source thread reads it.
static atomic_int g_stop;

// A file that arrived: the next question (its audio, or its frame with the typed question).
static void arrived(app *A, const char *name) {
    if (name[0] == '.' || !has_ext(name, A->watch_frames ? image_exts : audio_exts)) return;
    const size_t len = strlen(A->watch_dir) + strlen(name) + 2;
    char *path = malloc(len);
    if (!path) return;
    snprintf(path, len, "%s/%s", A->watch_dir, name);
    pthread_mutex_lock(&A->lock);
    const int i = A->n_items;
    if (i < A->cap_items && A->n_owned < 2 * MAX_ITEMS) {
        item *it = &A->items[i];
        A->owned[A->n_owned++] = path;
        if (A->watch_frames) {
            it->frame = path;
            snprintf(it->question, sizeof it->question, "%s", A->o.prompt);
        } else {
            it->audio = path;
        }
        A->n_items = i + 1;
        pthread_cond_broadcast(&A->cond);
        path = NULL;
    }
    pthread_mutex_unlock(&A->lock);
    free(path);
}

void *assistant_watch_main(void *arg) {
    app *A = arg;
    const double end = A->listen_s > 0 ? now(A) + A->listen_s : 0;
    _Alignas(struct inotify_event) char buf[8192];
    bool failed = false;
    while (!g_stop && A->n_items < A->cap_items) {
        const double left = end > 0 ? end - now(A) : 0.25;
        if (left <= 0) break;
        struct pollfd pfd = {.fd = A->watch_fd, .events = POLLIN};
        const int r = poll(&pfd, 1, left < 0.25 ? (int)(left * 1000) + 1 : 250); // (Ctrl-C is seen within 0.25 s)
        if (r < 0 && errno != EINTR) {
            fprintf(stderr, "error: watch:%s: %s\n", A->watch_dir, strerror(errno));
            failed = true;
            break;
        }
        if (r <= 0) continue;
        const ssize_t n = read(A->watch_fd, buf, sizeof buf);
        if (n <= 0) continue; // (EAGAIN: nothing after all)
        bool gone = false;
        for (char *p = buf; p < buf + n;) {
            const struct inotify_event *e = (const struct inotify_event *)p;
            p += sizeof *e + e->len;
            if (e->mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED)) gone = true;
            else if (e->mask & IN_Q_OVERFLOW) fprintf(stderr, "watch:%s: too many files at once: some were missed\n", A->watch_dir);
            else if (e->len) arrived(A, e->name);
        }
        if (gone) {
            fprintf(stderr, "error: watch:%s: the folder was removed or moved away\n", A->watch_dir);
            failed = true;
            break;
        }
    }
    close(A->watch_fd);
    A->watch_fd = -1;
    pthread_mutex_lock(&A->lock);
    A->src_done = true;
    A->src_failed = failed;
    pthread_cond_broadcast(&A->cond);
    pthread_mutex_unlock(&A->lock);
    return NULL;
}

// ---- the gates: a wake word, a frame that changed ------------------------------------------------

// A byte of a word: ASCII letters and digits, and any byte of a multi-byte UTF-8 character.
static bool word_byte(unsigned char c) { return c >= 0x80 || isalnum(c); }

bool assistant_wake_words(app *A, const char *list) {
    for (const char *p = list; *p;) {
        const char *end = strchr(p, ',');
        if (!end) end = p + strlen(p);
        char w[64];
        size_t n = 0;
        bool gap = false;
        for (const char *q = p; q < end; q++) { // lower case, the words one blank apart
            if (!word_byte((unsigned char)*q)) {
                gap = n > 0;
                continue;
            }
            if (n + 2 >= sizeof w) {
                fprintf(stderr, "error: --wake-words: '%.*s' is longer than %zu bytes\n", (int)(end - p), p, sizeof w - 2);
                return false;
            }
            if (gap) w[n++] = ' ';
            gap = false;
            w[n++] = (char)tolower((unsigned char)*q);
        }
        w[n] = '\0';
        if (n == 0) {
            fprintf(stderr, "error: --wake-words: an empty word in '%s' (give words, comma-separated)\n", list);
            return false;
        }
        if (A->n_wake >= (int)(sizeof A->wake / sizeof A->wake[0])) {
            fprintf(stderr, "error: --wake-words: more than %zu words\n", sizeof A->wake / sizeof A->wake[0]);
            return false;
        }
        memcpy(A->wake[A->n_wake++], w, n + 1);
        p = *end ? end + 1 : end;
    }
    return true;
}

// Where the question starts if text starts with the normalised word w (at a
// word's end), after the blanks and punctuation that follow; NULL if not.
static const char *after_word(const char *text, const char *w) {
    const unsigned char *t = (const unsigned char *)text;
    while (*t && !word_byte(*t)) t++;
    for (const char *c = w; *c; c++) {
        if (*c == ' ') { // between two words: at least one separator
            if (!*t || word_byte(*t)) return NULL;
            while (*t && !word_byte(*t)) t++;
            continue;
        }
        if (!*t || tolower(*t) != (unsigned char)*c) return NULL;
        t++;
    }
    if (*t && word_byte(*t)) return NULL; // "computers" does not start with "computer"
    while (*t && !word_byte(*t)) t++;
    return (const char *)t;
}

bool assistant_woken(app *A, item *it, int i) {
    if (A->n_wake == 0) return true;
    for (int k = 0; k < A->n_wake; k++) {
        const char *rest = after_word(it->question, A->wake[k]);
        if (rest) {
            memmove(it->question, rest, strlen(rest) + 1);
            return true;
        }
    }
    fprintf(stderr, "question %d: no wake word: \"%s\"\n", i + 1, it->question);
    it->skipped = "no wake word";
    return false;
}

bool assistant_frame_changed(app *A, item *it, int i) {
    nm_frame_sig sig;
    char err[512];
    if (A->camera) { // the frame is taken now and held: the question asks about this one
        if (A->cam_held) nm_tabm_cancel(A->cam_ring, &A->cam_slot); // (one a question asked before never sent)
        A->cam_held = false;
        if (!assistant_camera_frame(A, &A->cam_slot)) return true; // (send_frame tries again, and says why)
        A->cam_held = true;
        if (nm_frame_signature_slot(&A->cam_slot, &sig, err, sizeof err) != NM_OK) return true;
    } else if (nm_frame_signature(it->frame, &sig, err, sizeof err) != NM_OK) {
        return true; // the brick reports it
    }
    const double d = A->have_sig ? nm_frame_difference(&A->last_sig, &sig) : 255.0;
    if (d <= A->frame_change) {
        fprintf(stderr, "question %d: frame %s unchanged (difference %.2f <= %.2f): not asked\n", i + 1, it->frame, d,
                (double)A->frame_change);
        it->skipped = "frame unchanged";
        if (A->cam_held) nm_tabm_cancel(A->cam_ring, &A->cam_slot); // back to the camera
        A->cam_held = false;
        return false;
    }
    A->last_sig = sig;
    A->have_sig = true;
    return true;
}

// ---- the microphone ------------------------------------------------------------------------

static void on_sigint(int sig) {
    if (atomic_fetch_add(&g_stop, 1)) {
        nm_outfile_remove_temps();
        signal(sig, SIG_DFL);
        raise(sig);
    }
}

// An utterance the cutter found: copied once from the capture into a PCM slot
// of the microphone's ring (counted), as the next question; Whisper (resident
// or the cascade's) reads it there when the question's turn comes.
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
    pthread_mutex_lock(&A->lock);
    A->items[i].n_heard = n;
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
void *assistant_mic_main(void *arg) {
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
    A->src_done = true;
    A->src_failed = st != NM_OK;
    pthread_cond_broadcast(&A->cond);
    pthread_mutex_unlock(&A->lock);
    return NULL;
}

void assistant_catch_sigint(void) {
    struct sigaction sa = {.sa_handler = on_sigint, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
}

void assistant_stop_listening(void) { atomic_store(&g_stop, 1); }

// ---- a camera ------------------------------------------------------------------------------

bool assistant_camera_open(app *A) {
    nm_camera_params p = nm_camera_default_params();
    p.fps = A->fps;
    p.ledger = A->ledger;
    char err[512];
    nm_status st = nm_camera_open(A->camera_dev, &p, &A->camera, err, sizeof err);
    nm_camera_info in = nm_camera_get_info(A->camera);
    // its buffers and two more: the frame the vision brick reads, and the one compared (--frame-change)
    if (st == NM_OK && (st = nm_tabm_create(NULL, in.n_slots + 2, in.slot_bytes, &A->cam_ring, err, sizeof err)) == NM_OK &&
        (st = nm_camera_start(A->camera, A->cam_ring, 0)) != NM_OK)
        snprintf(err, sizeof err, "%s", nm_camera_last_error(A->camera));
    if (st != NM_OK) {
        fprintf(stderr, "%s%s\n", A->audio ? "" : "error: ", err);
        nm_camera_close(A->camera);
        nm_tabm_free(A->cam_ring);
        A->camera = NULL;
        A->cam_ring = NULL;
        return false;
    }
    in = nm_camera_get_info(A->camera);
    char f[5];
    for (int k = 0; k < 4; k++) f[k] = (char)((in.fourcc >> (8 * k)) & 0xff);
    f[4] = '\0';
    fprintf(stderr, "camera %s: %s (%s), %d x %d %s%s, %s\n", A->camera_dev, in.card, in.driver, in.width, in.height, f,
            in.fps > 0 ? "" : ", its own rate", in.zero_copy ? "frames straight into the slots" : "a copy a frame (mmap)");
    return true;
}

bool assistant_camera_frame(app *A, nm_tabm_slot *sl) {
    nm_status st = nm_camera_capture(A->camera, 5000000000ll, sl); // a camera that sends nothing for 5 s has failed
    if (st != NM_OK) fprintf(stderr, "error: %s (%s)\n", nm_camera_last_error(A->camera), nm_status_str(st));
    if (st == NM_ERR_IO && !A->audio) { // gone (unplugged): no more questions of its frames
        pthread_mutex_lock(&A->lock);
        A->src_failed = true;
        pthread_mutex_unlock(&A->lock);
        assistant_stop_listening();
    } else if (st == NM_ERR_IO) { // the spoken questions go on, without a frame
        fprintf(stderr, "camera %s: gone: the next questions go without a frame\n", A->camera_dev);
        nm_camera_close(A->camera); // (this thread is its only user)
        A->camera = NULL;
    }
    return st == NM_OK;
}

void *assistant_camera_main(void *arg) {
    app *A = arg;
    const double end = A->listen_s > 0 ? now(A) + A->listen_s : 0;
    pthread_mutex_lock(&A->lock);
    while (!g_stop && A->n_items < A->cap_items && (end <= 0 || now(A) < end)) {
        if (A->n_items > A->n_taken) { // the loop has not taken the last one: look again in 0.1 s (or when it does)
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 100000000;
            if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
            pthread_cond_timedwait(&A->cond, &A->lock, &ts);
            continue;
        }
        item *it = &A->items[A->n_items];
        it->frame = A->camera_dev;
        snprintf(it->question, sizeof it->question, "%s", A->o.prompt);
        A->n_items++;
        pthread_cond_broadcast(&A->cond);
    }
    A->src_done = true;
    pthread_cond_broadcast(&A->cond);
    pthread_mutex_unlock(&A->lock);
    return NULL;
}
