// Persistent thread pool for data-parallel ops.
//
// Workers are created once and park between jobs: they spin briefly on the
// job generation counter (decode steps follow each other within microseconds)
// and then sleep on a futex. A job is a function called once per thread with
// (ith, nth); the caller's thread is worker 0, so nth threads means nth-1
// helpers. Nothing is allocated or created per job.
#ifndef NM_THREADPOOL_H
#define NM_THREADPOOL_H

#include <stdint.h>

typedef struct nm_pool nm_pool;

// fn runs on every thread; ith in [0, nth).
typedef void (*nm_pool_fn)(void *arg, int ith, int nth);

// n_threads <= 0: the number of online cores. NULL on failure.
nm_pool *nm_pool_create(int n_threads);
void nm_pool_free(nm_pool *p); // NULL is a no-op; joins the workers
int nm_pool_size(const nm_pool *p);
// Runs fn on all threads and returns when every one has finished. Not
// reentrant: one job at a time per pool (the caller's thread drives it).
void nm_pool_run(nm_pool *p, nm_pool_fn fn, void *arg);

// Split [0, n) into nth near-equal contiguous ranges; range of thread ith.
static inline void nm_split_range(int64_t n, int ith, int nth, int64_t *begin, int64_t *end) {
    int64_t per = n / nth, rem = n % nth;
    *begin = ith * per + (ith < rem ? ith : rem);
    *end = *begin + per + (ith < rem ? 1 : 0);
}

int nm_cpu_count(void); // online cores, >= 1

#endif
