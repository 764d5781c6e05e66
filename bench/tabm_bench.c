// Hand-off benchmark: the TABM ring (payload written and read in place)
// against two copying baselines, a pipe (write + read of the payload) and a
// mutex+condvar queue that memcpy's the payload in and out.
//
// Same work on both sides everywhere: the producer fills the whole payload
// (a header with the sequence number and a timestamp, then a pattern), the
// consumer checksums all of it and checks the sum. For TABM that happens in
// the slot; for the baselines in a private buffer on each side, with the
// transport's copies in between.
//
// Latency: one message in flight. The producer takes t0 just before it
// starts producing a message (acquire, fill, publish / fill, write) and puts
// it in the header; the consumer takes t1 once it has checksummed it;
// latency = t1 - t0 (CLOCK_MONOTONIC, valid across processes). The producer
// starts the next message only after the consumer acknowledged the last one
// (a spin on a shared counter, outside the measured interval).
// Throughput: a stream of messages, the ring/queue/pipe allowed to fill
// (8 slots; the pipe sized to 8 payloads where the system allows); messages/s
// from the producer's first t0 to the consumer's last checksum.
//
// Threads in one process; also two processes (fork) for the pipe and TABM
// (the child attaches the ring by its fd).
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nanomind.h"

#define N_SLOTS 8

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

// ---- the work both sides do ---------------------------------------------------------------
// Payload: words[0] = seq, words[1] = t0, words[i >= 2] = seq + i.
static void fill(void *buf, size_t n, uint64_t seq, uint64_t t0) {
    uint64_t *w = buf;
    size_t nw = n / 8;
    w[0] = seq;
    w[1] = t0;
    for (size_t i = 2; i < nw; i++) w[i] = seq + i;
}

// Checksums the payload; returns false if it is not what fill wrote.
static bool check(const void *buf, size_t n, uint64_t *seq, uint64_t *t0) {
    const uint64_t *w = buf;
    size_t nw = n / 8;
    uint64_t s = 0;
    for (size_t i = 2; i < nw; i++) s += w[i];
    *seq = w[0];
    *t0 = w[1];
    uint64_t want = (uint64_t)(nw - 2) * w[0] + (uint64_t)(nw * (nw - 1) / 2 - 1);
    return s == want;
}

// ---- shared state of one measurement (in a MAP_SHARED mapping: works across fork) ------------
typedef struct shared {
    _Atomic uint64_t acked; // messages the consumer has finished
    _Atomic uint64_t bad;   // checksum failures
    uint64_t t_first;       // producer: t0 of the first message
    uint64_t t_end;         // consumer: time of the last checksum
} shared;

typedef struct job {
    size_t payload;
    int n;         // messages
    bool one;      // one in flight (latency) or a stream (throughput)
    shared *sh;
    uint64_t *lat; // (n) latencies, ns, written by the consumer (shared mapping)
} job;

static void wait_acked(shared *sh, uint64_t k) {
    while (atomic_load_explicit(&sh->acked, memory_order_acquire) < k) sched_yield();
}

static void consumed(job *J, int k, bool ok, uint64_t t0) {
    uint64_t t1 = now_ns();
    J->lat[k] = t1 - t0;
    if (!ok) atomic_fetch_add(&J->sh->bad, 1);
    if (k == J->n - 1) J->sh->t_end = t1;
    atomic_store_explicit(&J->sh->acked, (uint64_t)k + 1, memory_order_release);
}

// ---- TABM --------------------------------------------------------------------------------------
typedef struct tabm_job {
    job j;
    nm_tabm *r;
} tabm_job;

static void tabm_produce(tabm_job *T) {
    job *J = &T->j;
    for (int k = 0; k < J->n; k++) {
        if (J->one) wait_acked(J->sh, (uint64_t)k);
        uint64_t t0 = now_ns();
        if (k == 0) J->sh->t_first = t0;
        nm_tabm_slot s;
        if (nm_tabm_acquire_write(T->r, 0, -1, &s) != NM_OK) return;
        fill(s.data, J->payload, (uint64_t)k, t0); // in the slot
        s.meta->kind = NM_TABM_BYTES;
        s.meta->size = J->payload;
        if (nm_tabm_publish(T->r, &s) != NM_OK) return;
    }
}

static void tabm_consume(tabm_job *T) {
    job *J = &T->j;
    for (int k = 0; k < J->n; k++) {
        nm_tabm_slot s;
        if (nm_tabm_acquire_read(T->r, -1, &s) != NM_OK) return;
        uint64_t seq, t0;
        bool ok = check(s.data, J->payload, &seq, &t0) && seq == (uint64_t)k; // in the slot
        nm_tabm_release(T->r, &s);
        consumed(J, k, ok, t0);
    }
}

// ---- pipe ----------------------------------------------------------------------------------------
typedef struct pipe_job {
    job j;
    int fd[2];
    void *buf[2]; // producer's, consumer's private buffers
} pipe_job;

static void pipe_produce(pipe_job *P) {
    job *J = &P->j;
    for (int k = 0; k < J->n; k++) {
        if (J->one) wait_acked(J->sh, (uint64_t)k);
        uint64_t t0 = now_ns();
        if (k == 0) J->sh->t_first = t0;
        fill(P->buf[0], J->payload, (uint64_t)k, t0);
        for (size_t off = 0; off < J->payload;) {
            ssize_t w = write(P->fd[1], (char *)P->buf[0] + off, J->payload - off);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) return;
            off += (size_t)w;
        }
    }
}

static void pipe_consume(pipe_job *P) {
    job *J = &P->j;
    for (int k = 0; k < J->n; k++) {
        for (size_t off = 0; off < J->payload;) {
            ssize_t r = read(P->fd[0], (char *)P->buf[1] + off, J->payload - off);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) return;
            off += (size_t)r;
        }
        uint64_t seq, t0;
        bool ok = check(P->buf[1], J->payload, &seq, &t0) && seq == (uint64_t)k;
        consumed(J, k, ok, t0);
    }
}

// ---- mutex + condvar queue, memcpy in and out (single producer, single consumer;
// the copies run outside the lock, so producer and consumer overlap) -----------------------------
typedef struct mq_job {
    job j;
    pthread_mutex_t mu;
    pthread_cond_t not_full, not_empty;
    int head, tail, count;
    char *slots;  // N_SLOTS payloads
    void *buf[2]; // producer's, consumer's private buffers
} mq_job;

static void mq_produce(mq_job *Q) {
    job *J = &Q->j;
    for (int k = 0; k < J->n; k++) {
        if (J->one) wait_acked(J->sh, (uint64_t)k);
        uint64_t t0 = now_ns();
        if (k == 0) J->sh->t_first = t0;
        fill(Q->buf[0], J->payload, (uint64_t)k, t0);
        pthread_mutex_lock(&Q->mu);
        while (Q->count == N_SLOTS) pthread_cond_wait(&Q->not_full, &Q->mu);
        int t = Q->tail;
        pthread_mutex_unlock(&Q->mu);
        memcpy(Q->slots + (size_t)t * J->payload, Q->buf[0], J->payload); // copy in
        pthread_mutex_lock(&Q->mu);
        Q->tail = (t + 1) % N_SLOTS;
        Q->count++;
        pthread_cond_signal(&Q->not_empty);
        pthread_mutex_unlock(&Q->mu);
    }
}

static void mq_consume(mq_job *Q) {
    job *J = &Q->j;
    for (int k = 0; k < J->n; k++) {
        pthread_mutex_lock(&Q->mu);
        while (Q->count == 0) pthread_cond_wait(&Q->not_empty, &Q->mu);
        int h = Q->head;
        pthread_mutex_unlock(&Q->mu);
        memcpy(Q->buf[1], Q->slots + (size_t)h * J->payload, J->payload); // copy out
        pthread_mutex_lock(&Q->mu);
        Q->head = (h + 1) % N_SLOTS;
        Q->count--;
        pthread_cond_signal(&Q->not_full);
        pthread_mutex_unlock(&Q->mu);
        uint64_t seq, t0;
        bool ok = check(Q->buf[1], J->payload, &seq, &t0) && seq == (uint64_t)k;
        consumed(J, k, ok, t0);
    }
}

// ---- driver ---------------------------------------------------------------------------------------
enum transport { T_TABM, T_MUTEXQ, T_PIPE };
static const char *tname[] = {"TABM ring (in place)", "mutex queue + memcpy", "pipe (write + read)"};

typedef struct result {
    size_t payload;
    enum transport t;
    bool xproc;
    double med_us, p99_us; // latency
    double msgs_per_s, gb_per_s;
    uint64_t bad;
    bool ok;
} result;

typedef struct thr_arg {
    void (*fn)(void *);
    void *arg;
} thr_arg;
static void *thr_main(void *a) {
    thr_arg *t = a;
    t->fn(t->arg);
    return NULL;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void *shared_alloc(size_t n) {
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

// Runs producer and consumer: two threads, or parent (producer) and a forked
// child (consumer). child_setup runs in the child first (e.g. attach a ring).
static bool run_pair(void (*prod)(void *), void (*cons)(void *), void *arg, bool xproc,
                     bool (*child_setup)(void *)) {
    if (!xproc) {
        pthread_t a, b;
        thr_arg pa = {prod, arg}, ca = {cons, arg};
        if (pthread_create(&b, NULL, thr_main, &ca) != 0) return false;
        if (pthread_create(&a, NULL, thr_main, &pa) != 0) return false;
        pthread_join(a, NULL);
        pthread_join(b, NULL);
        return true;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return false;
    if (pid == 0) {
        if (child_setup && !child_setup(arg)) _exit(3);
        cons(arg);
        _exit(0);
    }
    prod(arg);
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static bool tabm_child_setup(void *a) {
    tabm_job *T = a;
    nm_tabm *r = NULL;
    char err[256];
    if (nm_tabm_attach(nm_tabm_fd(T->r), -1, &r, err, sizeof err) != NM_OK) {
        fprintf(stderr, "child: %s\n", err);
        return false;
    }
    T->r = r; // the child's own handle on the same memfd (the parent's is not used here)
    return true;
}

static void w_tabm_p(void *a) { tabm_produce(a); }
static void w_tabm_c(void *a) { tabm_consume(a); }
static void w_pipe_p(void *a) { pipe_produce(a); }
static void w_pipe_c(void *a) { pipe_consume(a); }
static void w_mq_p(void *a) { mq_produce(a); }
static void w_mq_c(void *a) { mq_consume(a); }

// One measurement (latency or throughput) of one transport.
static bool measure(enum transport t, bool xproc, size_t payload, int n, bool one, shared *sh, uint64_t *lat) {
    memset(sh, 0, sizeof *sh);
    job J = {payload, n, one, sh, lat};
    bool ok = false;
    if (t == T_TABM) {
        tabm_job T = {J, NULL};
        char err[256];
        if (nm_tabm_create(NULL, N_SLOTS, payload, &T.r, err, sizeof err) != NM_OK) {
            fprintf(stderr, "error: tabm: %s\n", err);
            return false;
        }
        ok = run_pair(w_tabm_p, w_tabm_c, &T, xproc, tabm_child_setup);
        nm_tabm_free(T.r);
    } else if (t == T_PIPE) {
        pipe_job P = {J, {-1, -1}, {malloc(payload), malloc(payload)}};
        if (P.buf[0] && P.buf[1] && pipe(P.fd) == 0) {
            // Let the pipe hold N_SLOTS payloads where the system allows (pipe-max-size, 1 MiB by default).
            long want = (long)(N_SLOTS * payload);
            while (want >= 65536 && fcntl(P.fd[1], F_SETPIPE_SZ, (int)want) < 0) want /= 2;
            ok = run_pair(w_pipe_p, w_pipe_c, &P, xproc, NULL);
            close(P.fd[0]);
            close(P.fd[1]);
        }
        free(P.buf[0]);
        free(P.buf[1]);
    } else {
        mq_job *Q = calloc(1, sizeof *Q);
        if (!Q) return false;
        Q->j = J;
        pthread_mutex_init(&Q->mu, NULL);
        pthread_cond_init(&Q->not_full, NULL);
        pthread_cond_init(&Q->not_empty, NULL);
        Q->slots = malloc(N_SLOTS * payload);
        Q->buf[0] = malloc(payload);
        Q->buf[1] = malloc(payload);
        if (Q->slots && Q->buf[0] && Q->buf[1]) {
            memset(Q->slots, 0, N_SLOTS * payload); // fault the pages in, as the ring's are
            ok = run_pair(w_mq_p, w_mq_c, Q, false, NULL);
        }
        free(Q->slots);
        free(Q->buf[0]);
        free(Q->buf[1]);
        pthread_cond_destroy(&Q->not_full);
        pthread_cond_destroy(&Q->not_empty);
        pthread_mutex_destroy(&Q->mu);
        free(Q);
    }
    return ok && atomic_load(&sh->acked) == (uint64_t)n;
}

static result bench_one(enum transport t, bool xproc, size_t payload, int n, shared *sh, uint64_t *lat) {
    result R = {.payload = payload, .t = t, .xproc = xproc, .ok = true};
    // warm-up (page faults, first wake-ups), not counted
    R.ok &= measure(t, xproc, payload, n / 10 > 20 ? n / 10 : 20, false, sh, lat);
    R.ok &= measure(t, xproc, payload, n, true, sh, lat);
    R.bad += atomic_load(&sh->bad);
    qsort(lat, (size_t)n, sizeof *lat, cmp_u64);
    R.med_us = lat[n / 2] / 1e3;
    R.p99_us = lat[(size_t)((double)n * 0.99)] / 1e3;
    R.ok &= measure(t, xproc, payload, n, false, sh, lat);
    R.bad += atomic_load(&sh->bad);
    double secs = (double)(sh->t_end - sh->t_first) / 1e9;
    R.msgs_per_s = secs > 0 ? n / secs : 0;
    R.gb_per_s = R.msgs_per_s * (double)payload / 1e9;
    R.ok &= R.bad == 0;
    return R;
}

static void print_json(const result *R, int n_msgs) {
    printf("{\"payload_bytes\": %zu, \"transport\": \"%s\", \"processes\": %d, \"messages\": %d, "
           "\"lat_median_us\": %.2f, \"lat_p99_us\": %.2f, \"msgs_per_s\": %.0f, \"gb_per_s\": %.3f, \"ok\": %s}\n",
           R->payload, R->t == T_TABM ? "tabm" : R->t == T_PIPE ? "pipe" : "mutexq", R->xproc ? 2 : 1, n_msgs,
           R->med_us, R->p99_us, R->msgs_per_s, R->gb_per_s, R->ok ? "true" : "false");
}

static void print_row(const result *R, const result *ref) {
    char lr[32] = "", tr[32] = "";
    if (R != ref) {
        snprintf(lr, sizeof lr, "%.1fx", R->med_us / ref->med_us);
        snprintf(tr, sizeof tr, "%.1fx", ref->msgs_per_s / R->msgs_per_s);
    }
    printf("| %s | %s | %-21s | %9.2f | %9.2f | %10.0f | %7.2f | %-14s | %-15s |%s\n",
           R->payload >= (1 << 20) ? "1 MB" : "4 KB", R->xproc ? "2 procs" : "threads", tname[R->t], R->med_us,
           R->p99_us, R->msgs_per_s, R->gb_per_s, R->t == T_TABM ? "(reference)" : lr, R->t == T_TABM ? "(reference)" : tr,
           R->ok ? "" : " FAILED (see above)");
}

static void usage(void) {
    printf("usage: tabm_bench [--iters N] [--json] [--no-xproc]\n"
           "\n"
           "Hand-off latency (median, p99; one message in flight, producer's start of a message to the\n"
           "consumer's end of its checksum) and throughput (a stream, %d slots) of the TABM ring against a\n"
           "pipe and a mutex+condvar queue with memcpy, for 4 KB and 1 MB payloads; threads in one process,\n"
           "and producer/consumer in two processes (fork) for the pipe and TABM.\n"
           "\n"
           "  --iters N     messages per measurement at 4 KB (default 20000); 1 MB uses N/10 (at least 100)\n"
           "  --json        one JSON object per measurement instead of the table\n"
           "  --no-xproc    skip the two-process runs\n",
           N_SLOTS);
}

int main(int argc, char **argv) {
    int iters = 20000;
    bool json = false, xproc = true;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage();
            return 0;
        } else if (!strcmp(argv[i], "--iters") && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 100 || v > 100000000) {
                fprintf(stderr, "error: --iters needs an integer in [100, 1e8], got '%s'\n", argv[i]);
                return 2;
            }
            iters = (int)v;
        } else if (!strcmp(argv[i], "--json")) {
            json = true;
        } else if (!strcmp(argv[i], "--no-xproc")) {
            xproc = false;
        } else {
            fprintf(stderr, "error: unknown option '%s' (see --help)\n", argv[i]);
            return 2;
        }
    }
    const size_t sizes[2] = {4096, 1 << 20};
    int max_n = iters;
    shared *sh = shared_alloc(sizeof(shared));
    uint64_t *lat = shared_alloc(sizeof(uint64_t) * (size_t)max_n);
    if (!sh || !lat) {
        fprintf(stderr, "error: out of memory\n");
        return 1;
    }
    result res[16];
    int nres = 0, n_of[2];
    for (int si = 0; si < 2; si++) {
        size_t payload = sizes[si];
        int n = si == 0 ? iters : (iters / 10 > 100 ? iters / 10 : 100);
        if (n > max_n) n = max_n;
        n_of[si] = n;
        for (int x = 0; x < (xproc ? 2 : 1); x++)
            for (int t = T_TABM; t <= T_PIPE; t++) {
                if (x && t == T_MUTEXQ) continue; // a process-shared mutex queue is not a baseline anyone runs
                res[nres] = bench_one((enum transport)t, x == 1, payload, n, sh, lat);
                if (json) print_json(&res[nres], n);
                nres++;
            }
    }
    bool all_ok = true;
    for (int i = 0; i < nres; i++) all_ok &= res[i].ok;
    if (!json) {
        printf("messages per measurement: %d at 4 KB, %d at 1 MB; %d slots; latency one in flight, throughput a stream\n\n",
               n_of[0], n_of[1], N_SLOTS);
        printf("| payload | where | transport | latency median (us) | latency p99 (us) | msgs/s | GB/s | median latency / TABM | TABM msgs/s / this |\n");
        printf("|---|---|---|---|---|---|---|---|---|\n");
        const result *ref = NULL;
        for (int i = 0; i < nres; i++) {
            if (res[i].t == T_TABM) ref = &res[i];
            print_row(&res[i], ref);
        }
    }
    if (!all_ok) fprintf(stderr, "error: a run failed or a checksum did not match\n");
    munmap(sh, sizeof(shared));
    munmap(lat, sizeof(uint64_t) * (size_t)max_n);
    return all_ok ? 0 : 1;
}
