#include <stdatomic.h>
#include <time.h>

#include "core/threadpool.h"
#include "nmtest.h"

typedef struct sum_job {
    const int *v;
    int64_t n;
    long long partial[64];
    _Atomic int calls;
} sum_job;

static void sum_fn(void *arg, int ith, int nth) {
    sum_job *j = arg;
    int64_t b, e;
    nm_split_range(j->n, ith, nth, &b, &e);
    long long s = 0;
    for (int64_t i = b; i < e; i++) s += j->v[i];
    j->partial[ith] = s;
    atomic_fetch_add(&j->calls, 1);
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
            sum_job j = {.v = v, .n = 100000 - rep};
            atomic_store(&j.calls, 0);
            nm_pool_run(p, sum_fn, &j);
            long long got = 0;
            for (int i = 0; i < nt; i++) got += j.partial[i];
            long long w = want;
            for (int i = 100000 - rep; i < 100000; i++) w -= v[i];
            if (got != w || atomic_load(&j.calls) != nt) {
                NM_CHECK(got == w);
                NM_CHECK(atomic_load(&j.calls) == nt);
                break;
            }
        }
        nm_pool_free(p);
    }
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
        sum_job j = {.v = v, .n = 1000};
        nm_pool_run(p, sum_fn, &j);
        NM_CHECK(j.partial[0] + j.partial[1] + j.partial[2] == 1000);
    }
    nm_pool_free(p);
    nm_pool_free(NULL);
}

NM_TEST_MAIN()
