#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <time.h>

#include "core/threadpool.h"
#include "nmtest.h"

#define N_CHUNKS 37

typedef struct sum_job {
    const int *v;
    int64_t n;
    long long partial[N_CHUNKS];
    _Atomic int calls[N_CHUNKS];
    _Atomic int bad_ith;
    int nth;
} sum_job;

static void sum_fn(void *arg, int64_t chunk, int ith) {
    sum_job *j = arg;
    int64_t b, e;
    nm_split_range(j->n, (int)chunk, N_CHUNKS, &b, &e);
    long long s = 0;
    for (int64_t i = b; i < e; i++) s += j->v[i];
    j->partial[chunk] = s;
    atomic_fetch_add(&j->calls[chunk], 1);
    if (ith < 0 || ith >= j->nth) atomic_store(&j->bad_ith, 1);
}

static bool job_ok(sum_job *j, long long want) {
    long long got = 0;
    for (int i = 0; i < N_CHUNKS; i++) {
        got += j->partial[i];
        if (atomic_load(&j->calls[i]) != 1) return false; // every chunk exactly once
    }
    return got == want && !atomic_load(&j->bad_ith);
}

NM_TEST(split_range_covers_exactly) {
    for (int nth = 1; nth <= 7; nth++)
        for (int64_t n = 0; n < 50; n++) {
            int64_t prev_end = 0, total = 0;
            for (int i = 0; i < nth; i++) {
                int64_t b, e;
                nm_split_range(n, i, nth, &b, &e);
                NM_CHECK(b == prev_end);
                NM_CHECK(e - b <= n / nth + 1);
                total += e - b;
                prev_end = e;
            }
            NM_CHECK(total == n);
        }
}

NM_TEST(pool_runs_every_thread_once_per_job) {
    static int v[100000];
    long long want = 0;
    for (int i = 0; i < 100000; i++) want += v[i] = (i * 7919) % 1000 - 500;
    for (int nt = 1; nt <= 4; nt++) {
        nm_pool *p = nm_pool_create(nt);
        NM_CHECK(p != NULL);
        if (!p) return;
        NM_CHECK(nm_pool_size(p) == nt);
        // many back-to-back jobs: exercises spin and sleep paths of the barrier
        for (int rep = 0; rep < 2000; rep++) {
            sum_job j = {.v = v, .n = 100000 - rep, .nth = nt};
            nm_pool_run(p, sum_fn, &j, N_CHUNKS);
            long long w = want;
            for (int i = 100000 - rep; i < 100000; i++) w -= v[i];
            if (!job_ok(&j, w)) {
                NM_CHECK(job_ok(&j, w));
                break;
            }
        }
        nm_pool_free(p);
    }
}

// Tiny jobs whose chunk counts change from one job to the next, back to back:
// the pattern that once let a worker holding the exhausted claim of the
// previous job take a chunk of it using the next job's (larger) count. Every
// chunk must run exactly once, and the pool must not hang.
typedef struct count_job {
    _Atomic int hits[64];
    _Atomic int extra;
    int64_t n;
} count_job;

static void count_fn(void *arg, int64_t chunk, int ith) {
    count_job *j = arg;
    if (chunk < 0 || chunk >= j->n) atomic_fetch_add(&j->extra, 1);
    else atomic_fetch_add(&j->hits[chunk], 1);
}

NM_TEST(pool_varying_chunk_counts_stress) {
    for (int nt = 2; nt <= 3; nt++) {
        nm_pool *p = nm_pool_create(nt);
        NM_CHECK(p != NULL);
        if (!p) return;
        uint32_t r = 12345;
        bool ok = true;
        for (int rep = 0; rep < 200000 && ok; rep++) {
            r = r * 1103515245u + 12345u;
            count_job j = {.n = 1 + (r >> 16) % 64};
            nm_pool_run(p, count_fn, &j, j.n);
            ok = atomic_load(&j.extra) == 0;
            for (int64_t c = 0; c < j.n; c++) ok = ok && atomic_load(&j.hits[c]) == 1;
        }
        NM_CHECK(ok);
        nm_pool_free(p);
    }
}

// More chunks than one round can count: every chunk still runs exactly once.
static void mark_fn(void *arg, int64_t chunk, int ith) { atomic_fetch_add(&((_Atomic unsigned char *)arg)[chunk], 1); }

NM_TEST(pool_job_larger_than_a_round) {
    const int64_t n = 2 * NM_POOL_ROUND_CHUNKS + 5;
    _Atomic unsigned char *hits = calloc((size_t)n, 1);
    nm_pool *p = nm_pool_create(2);
    NM_CHECK(p && hits);
    if (!p || !hits) return;
    nm_pool_run(p, mark_fn, (void *)hits, n);
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; i++) wrong += atomic_load(&hits[i]) != 1;
    NM_CHECK(wrong == 0);
    nm_pool_free(p);
    free((void *)hits);
}

static void *affinity_count(void *arg) {
    cpu_set_t set;
    *(int *)arg = pthread_getaffinity_np(pthread_self(), sizeof set, &set) == 0 ? CPU_COUNT(&set) : -1;
    return NULL;
}

NM_TEST(pool_pinned_still_runs_every_chunk) {
    nm_pool *p = nm_pool_create(2);
    NM_CHECK(p != NULL);
    if (!p) return;
    cpu_set_t set;
    NM_CHECK(pthread_getaffinity_np(pthread_self(), sizeof set, &set) == 0);
    const int all = CPU_COUNT(&set);
    NM_CHECK(nm_pool_pin(p) == 0);
    // the creating thread keeps its cores until it drives a job: a thread it
    // starts now (another brick's lane) inherits them all, not core 0 alone
    pthread_t t;
    int inherited = -1;
    NM_CHECK(pthread_create(&t, NULL, affinity_count, &inherited) == 0);
    pthread_join(t, NULL);
    NM_CHECK(inherited == all);
    count_job j = {.n = 50};
    nm_pool_run(p, count_fn, &j, j.n);
    NM_CHECK(pthread_getaffinity_np(pthread_self(), sizeof set, &set) == 0 && CPU_COUNT(&set) == 1 && CPU_ISSET(0, &set));
    bool ok = atomic_load(&j.extra) == 0;
    for (int64_t c = 0; c < j.n; c++) ok = ok && atomic_load(&j.hits[c]) == 1;
    NM_CHECK(ok);
    nm_pool_free(p);
    // give the test process its cores back
    CPU_ZERO(&set);
    for (int i = 0; i < nm_cpu_count(); i++) CPU_SET(i, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

NM_TEST(pool_survives_idle_sleep) {
    nm_pool *p = nm_pool_create(3);
    NM_CHECK(p != NULL);
    if (!p) return;
    static int v[1000];
    for (int i = 0; i < 1000; i++) v[i] = 1;
    for (int rep = 0; rep < 3; rep++) {
        struct timespec ts = {0, 30 * 1000 * 1000}; // long enough for workers to park on the futex
        nanosleep(&ts, NULL);
        sum_job j = {.v = v, .n = 1000, .nth = 3};
        nm_pool_run(p, sum_fn, &j, N_CHUNKS);
        NM_CHECK(job_ok(&j, 1000));
    }
    nm_pool_free(p);
    nm_pool_free(NULL);
}

NM_TEST_MAIN()
