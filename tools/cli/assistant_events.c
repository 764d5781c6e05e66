// nanomind assistant: where the questions come from (docs/cli.md): audio
// files or a folder of them, typed questions over a folder of frames, the
// microphone (its stream given to the pipeline, which cuts it into
// utterances), a watched folder (each file that arrives) and a camera (its
// newest frame, asked about each time the last question is answered). Each
// question is a request of the pipeline; the gates (wake words, a frame that
// changed) are the pipeline's.
#include <dirent.h>
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
#include <time.h>
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
    A->items = calloc(MAX_ITEMS, sizeof(item));
    A->cap_items = MAX_ITEMS;
    if (!A->owned || !A->items) return false;
    if (A->live) return true; // questions come as they are heard, or as files arrive
    int a0 = 0, na = 0, f0 = 0, nf = 0;
    if (A->audio && !list_files(A, A->audio, "--audio", audio_exts, &a0, &na)) return false;
    if (A->frames && !A->camera_dev && !list_files(A, A->frames, "--frames", image_exts, &f0, &nf)) return false;
    if (na && nf && na != nf) {
        fprintf(stderr, "error: %d frames and %d spoken questions: give one question per frame (or -p for all)\n",
                nf, na);
        return false;
    }
    A->n_items = na ? na : nf ? nf : 1;
    for (int i = 0; i < A->n_items; i++) {
        item *it = &A->items[i];
        it->audio = na ? A->owned[a0 + i] : NULL;
        it->frame = nf ? A->owned[f0 + i] : NULL;
        it->camera = A->camera_dev != NULL; // (a spoken question with the camera's frame: while there is one)
        if (!na) snprintf(it->question, sizeof it->question, "%s", A->o.prompt);
    }
    return true;
}

item *assistant_add_item(app *A) {
    if (A->n_items >= A->cap_items) return NULL;
    item *it = &A->items[A->n_items++];
    memset(it, 0, sizeof *it);
    return it;
}

bool assistant_submit(app *A, item *it) {
    pthread_mutex_lock(&A->lock);
    const bool camera = it->camera && A->camera && !A->camera_gone;
    pthread_mutex_unlock(&A->lock);
    it->camera = camera;
    nm_pipeline_image img = {.path = it->frame, .camera = camera ? A->camera : NULL};
    nm_pipeline_input in = {.text = it->audio ? NULL : it->question, .audio_path = it->audio,
                            .images = &img, .n_images = it->frame || camera ? 1 : 0,
                            .silent = A->speaker_dev && !A->player};
    uint64_t id = 0;
    char err[1024];
    const nm_status st = nm_pipeline_submit(A->P, &in, &id, err, sizeof err);
    pthread_mutex_lock(&A->lock);
    it->id = id;
    if (st != NM_OK) it->failed = true, A->n_done++;
    pthread_cond_broadcast(&A->cond); // (on_event waits for the id of a question whose events came first)
    pthread_mutex_unlock(&A->lock);
    if (st != NM_OK) {
        fprintf(stderr, "error: question %d (%s): %s\n", (int)(it - A->items) + 1,
                it->audio ? it->audio : it->frame ? it->frame : "-p", err);
        assistant_silent_answer(A, (int)(it - A->items));
    }
    return st == NM_OK;
}

// ---- Ctrl-C, --listen ---------------------------------------------------------------------------

// Ctrl-C while listening: stop (what was heard is answered); twice: quit.
static atomic_int g_stop;

static void on_sigint(int sig) {
    if (atomic_fetch_add(&g_stop, 1)) {
        nm_outfile_remove_temps();
        signal(sig, SIG_DFL);
        raise(sig);
    }
}

void assistant_catch_sigint(void) {
    struct sigaction sa = {.sa_handler = on_sigint, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
}

bool assistant_stopped(void) { return atomic_load(&g_stop) != 0; }

// --listen S is over (0: never).
static bool listened(const app *A, double end) { return end > 0 && now(A) >= end; }

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

// A file that arrived: the next question (its audio, or its frame with the typed question), submitted.
static void arrived(app *A, const char *name) {
    if (name[0] == '.' || !has_ext(name, A->watch_frames ? image_exts : audio_exts)) return;
    const size_t len = strlen(A->watch_dir) + strlen(name) + 2;
    char *path = malloc(len);
    if (!path) return;
    snprintf(path, len, "%s/%s", A->watch_dir, name);
    pthread_mutex_lock(&A->lock);
    item *it = A->n_owned < 2 * MAX_ITEMS ? assistant_add_item(A) : NULL;
    if (it) {
        A->owned[A->n_owned++] = path;
        if (A->watch_frames) {
            it->frame = path;
            snprintf(it->question, sizeof it->question, "%s", A->o.prompt);
        } else {
            it->audio = path;
            it->camera = A->camera != NULL; // (with the camera's frame, while there is one)
        }
        path = NULL;
    }
    pthread_mutex_unlock(&A->lock);
    free(path);
    if (it) assistant_submit(A, it);
}

bool assistant_watch(app *A) {
    const double end = A->listen_s > 0 ? now(A) + A->listen_s : 0;
    _Alignas(struct inotify_event) char buf[8192];
    bool failed = false;
    while (!assistant_stopped() && !listened(A, end) && A->n_items < A->cap_items) {
        const double left = end > 0 ? end - now(A) : 0.25;
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
    return !failed;
}

// ---- the microphone ------------------------------------------------------------------------

// A chunk of the capture: into the pipeline, which cuts the stream into
// questions (each utterance a request; barge-in where asked). True: stop.
static bool mic_chunk(const float *pcm, int64_t n, void *user) {
    app *A = user;
    char err[512];
    const bool heard = nm_pipeline_hear(A->P, pcm, n, err, sizeof err) == NM_OK;
    if (!heard) fprintf(stderr, "error: %s\n", err);
    pthread_mutex_lock(&A->lock);
    A->src_failed = A->src_failed || !heard; // (an utterance the pipeline refused: the run fails)
    const bool full = A->n_items >= A->cap_items;
    pthread_mutex_unlock(&A->lock);
    return assistant_stopped() || full;
}

bool assistant_listen_mic(app *A) {
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
    const bool last = nm_pipeline_hear(A->P, NULL, 0, err, sizeof err) == NM_OK; // (the last utterance)
    if (!last) fprintf(stderr, "error: %s\n", err);
    pthread_mutex_lock(&A->lock);
    const bool refused = A->src_failed;
    pthread_mutex_unlock(&A->lock);
    return st == NM_OK && last && !refused;
}

// ---- a camera ------------------------------------------------------------------------------

bool assistant_camera_open(app *A) {
    nm_camera_params p = nm_camera_default_params();
    p.fps = A->fps;
    p.ledger = A->ledger; // (the MMAP path's copies, counted camera -> vision)
    char err[512];
    nm_status st = nm_camera_open(A->camera_dev, &p, &A->camera, err, sizeof err);
    // its own ring: its buffers and two more (the frame the vision brick reads, the one compared: --frame-change)
    if (st == NM_OK && (st = nm_camera_start(A->camera, NULL, 0)) != NM_OK)
        snprintf(err, sizeof err, "%s", nm_camera_last_error(A->camera));
    if (st != NM_OK) {
        fprintf(stderr, "%s%s\n", A->audio ? "" : "error: ", err);
        nm_camera_close(A->camera);
        A->camera = NULL;
        return false;
    }
    const nm_camera_info in = nm_camera_get_info(A->camera);
    char f[5];
    for (int k = 0; k < 4; k++) f[k] = (char)((in.fourcc >> (8 * k)) & 0xff);
    f[4] = '\0';
    fprintf(stderr, "camera %s: %s (%s), %d x %d %s%s, %s\n", A->camera_dev, in.card, in.driver, in.width, in.height, f,
            in.fps > 0 ? "" : ", its own rate", in.zero_copy ? "frames straight into the slots" : "a copy a frame (mmap)");
    return true;
}

bool assistant_camera_questions(app *A) {
    const double end = A->listen_s > 0 ? now(A) + A->listen_s : 0;
    double next_frame = 0; // when the camera's next frame is due
    bool ok = true;
    while (!assistant_stopped() && !listened(A, end)) {
        pthread_mutex_lock(&A->lock);
        // the typed question of the newest frame, once the last one is answered (or skipped)
        while (A->n_done < A->n_items && !assistant_stopped() && !listened(A, end)) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 100000000;
            if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
            pthread_cond_timedwait(&A->cond, &A->lock, &ts);
        }
        float fps = A->fps;
        if (A->fps_cap > 0 && (fps == 0 || A->fps_cap < fps)) fps = (float)A->fps_cap;
        const bool gone = A->camera_gone;
        item *it = gone || assistant_stopped() || listened(A, end) ? NULL : assistant_add_item(A);
        pthread_mutex_unlock(&A->lock);
        if (gone) ok = false; // (its error said with its question)
        if (!it) break;
        const double t = now(A);
        if (fps > 0 && next_frame > t) {
            const double d = next_frame - t;
            struct timespec ts = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
            nanosleep(&ts, NULL);
        }
        next_frame = (next_frame > t ? next_frame : t) + (fps > 0 ? 1.0 / fps : 0);
        it->camera = true;
        snprintf(it->question, sizeof it->question, "%s", A->o.prompt);
        if (!assistant_submit(A, it)) { // (the pipeline refuses more: it broke, said)
            ok = false;
            break;
        }
    }
    return ok;
}
