// Persistent thread pool for data-parallel ops.
//
// A job is n_chunks independent pieces of work. Threads claim chunks one at a
// time from a shared counter, so when a core is busy with something else (a
// phone runs other apps) the threads that are running take over the work of
// the one that is not, instead of the whole op waiting for it. Workers are
// created once and park between jobs: they spin briefly on the job counter
// (the ops of one forward pass follow each other within microseconds) and then
// sleep on a futex. The caller's thread is worker 0. Nothing is allocated or
// created per job.
#ifndef NM_THREADPOOL_H
#define NM_THREADPOOL_H

#include <stdint.h>

#include "nanomind.h"

typedef struct nm_pool nm_pool;

// Runs chunk `chunk` of a job on thread `ith` (in [0, nth): use it to pick
// per-thread scratch, never to split the work).
typedef void (*nm_pool_fn)(void *arg, int64_t chunk, int ith);

// n_threads <= 0: the number of online cores. NULL on failure.
nm_pool *nm_pool_create(int n_threads);
void nm_pool_free(nm_pool *p); // NULL is a no-op; joins the workers
int nm_pool_size(const nm_pool *p);
// A pool's cores are those its creating thread could run on (all, or its
// lane's set: nm_brick_params.cores); its workers inherit that mask.
// Optional core affinity: worker i is pinned to the i-th of them (mod their
// count) now, and the thread that drives a job (thread 0) to the first when it
// first runs one (not the thread calling this: threads it starts later
// inherit its mask).
// Returns 0, or -1 if the OS refused (the pool still works, unpinned).
int nm_pool_pin(nm_pool *p);
// Runs fn for every chunk in [0, n_chunks) and returns when all are done. One
// job at a time per pool (the caller's thread drives it). More than
// NM_POOL_ROUND_CHUNKS chunks run as several rounds, one after the other.
#define NM_POOL_ROUND_CHUNKS 65535
void nm_pool_run(nm_pool *p, nm_pool_fn fn, void *arg, int64_t n_chunks);

// Split [0, n) into nth near-equal contiguous ranges; range of part ith.
static inline void nm_split_range(int64_t n, int ith, int nth, int64_t *begin, int64_t *end) {
    int64_t per = n / nth, rem = n % nth;
    *begin = ith * per + (ith < rem ? ith : rem);
    *end = *begin + per + (ith < rem ? 1 : 0);
}

// nm_cpu_count: include/nanomind.h

#endif
