#include "core/threadpool.h"

#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define NM_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define NM_CPU_RELAX() __asm__ __volatile__("yield")
#else
#define NM_CPU_RELAX() ((void)0)
#endif

// Spin iterations before sleeping. Long enough to cover the gap between two
// ops of one forward pass, short enough not to burn a core between tokens
// when the caller is slow (sampling, printing).
#define NM_SPIN_ITERS 20000

// A futex word with a count of sleepers, so that a wake costs a syscall only
// when someone actually sleeps. Waiter: sleepers++ then re-check the word;
// waker: change the word then read sleepers; both seq_cst, so at least one of
// them sees the other (the futex syscall re-checks the word atomically too).
typedef struct nm_event {
    _Atomic uint32_t word;
    _Atomic int sleepers;
} nm_event;

struct nm_pool {
    int n;                      // threads including the caller
    pthread_t *threads;         // n-1 helpers
    nm_event gen;               // incremented per job
    _Atomic int pending;        // helpers still running the current job
    nm_event done;              // incremented when the last helper finishes
    _Atomic int stop;
    nm_pool_fn fn;
    void *arg;
};

struct nm_worker_arg {
    nm_pool *p;
    int ith;
};

static void futex_wait(_Atomic uint32_t *addr, uint32_t val) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *addr) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL, NULL, 0);
}

static uint32_t wait_change(nm_event *e, uint32_t old) {
    uint32_t v;
    for (int i = 0; i < NM_SPIN_ITERS; i++) {
        v = atomic_load_explicit(&e->word, memory_order_acquire);
        if (v != old) return v;
        NM_CPU_RELAX();
    }
    atomic_fetch_add(&e->sleepers, 1);
    while ((v = atomic_load(&e->word)) == old) futex_wait(&e->word, old);
    atomic_fetch_sub(&e->sleepers, 1);
    return v;
}

static void signal_change(nm_event *e) {
    atomic_fetch_add(&e->word, 1);
    if (atomic_load(&e->sleepers) > 0) futex_wake_all(&e->word);
}

static void *worker_main(void *varg) {
    struct nm_worker_arg *wa = varg;
    nm_pool *p = wa->p;
    int ith = wa->ith;
    free(wa);
    uint32_t seen = 0;
    for (;;) {
        seen = wait_change(&p->gen, seen);
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) break;
        p->fn(p->arg, ith, p->n);
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) signal_change(&p->done);
    }
    return NULL;
}

int nm_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

nm_pool *nm_pool_create(int n_threads) {
    if (n_threads <= 0) n_threads = nm_cpu_count();
    nm_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = n_threads;
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    if (!p->threads) { free(p); return NULL; }
    for (int i = 1; i < n_threads; i++) {
        struct nm_worker_arg *wa = malloc(sizeof *wa);
        if (wa) *wa = (struct nm_worker_arg){p, i};
        if (!wa || pthread_create(&p->threads[i - 1], NULL, worker_main, wa) != 0) {
            free(wa);
            p->n = i; // only the threads started so far
            nm_pool_free(p);
            return NULL;
        }
    }
    return p;
}

void nm_pool_free(nm_pool *p) {
    if (!p) return;
    atomic_store_explicit(&p->stop, 1, memory_order_release);
    signal_change(&p->gen);
    for (int i = 1; i < p->n; i++) pthread_join(p->threads[i - 1], NULL);
    free(p->threads);
    free(p);
}

int nm_pool_size(const nm_pool *p) { return p->n; }

void nm_pool_run(nm_pool *p, nm_pool_fn fn, void *arg) {
    if (p->n == 1) { fn(arg, 0, 1); return; }
    p->fn = fn;
    p->arg = arg;
    uint32_t done = atomic_load_explicit(&p->done.word, memory_order_acquire);
    atomic_store_explicit(&p->pending, p->n - 1, memory_order_release);
    signal_change(&p->gen);
    fn(arg, 0, p->n);
    // Wait until every helper has decremented `pending`.
    while (atomic_load_explicit(&p->pending, memory_order_acquire) != 0)
        done = wait_change(&p->done, done);
}
