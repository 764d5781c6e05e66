#include "core/threadpool.h"

#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
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

// Spin iterations before sleeping: covers the gap between two ops of one
// forward pass, short enough not to burn a core between tokens.
#define NM_SPIN_ITERS 20000

// A futex word with a count of sleepers, so that a wake costs a syscall only
// when someone actually sleeps. Waiter: sleepers++ then re-check the word;
// waker: change the word then read sleepers; both seq_cst, so at least one of
// them sees the other (the futex syscall re-checks the word atomically too).
typedef struct nm_event {
    _Atomic uint32_t word;
    _Atomic int sleepers;
} nm_event;

// The job protocol. `claim` packs (job sequence, chunk count, next chunk) in
// one word, so that a single CAS both takes a chunk and proves that the job
// it belongs to is still running. The caller writes fn/arg/base, zeroes
// `done`, then publishes the new claim word (release). A worker loads `claim`
// (acquire), reads fn/arg/base, and takes chunk c with a CAS from
// (seq, n, c) to (seq, n, c + 1), c < n. A CAS that succeeds proves chunk c
// was unclaimed, hence the job unfinished, hence fn/arg/base (written by the
// caller only between jobs) were this job's. Keeping n inside the word
// matters: with n in a separate variable, a worker holding the exhausted
// word of job g-1 could read job g's larger n and "claim" a chunk of a job
// that had already ended. Each finished chunk increments `done`; the caller
// returns when done == n.
// 32 bits of sequence: a worker would have to sleep between its load and its
// CAS through 2^32 jobs (hours) for a stale word to match again.
#define NM_CLAIM_BITS 16
#define NM_CLAIM_MASK ((1ull << NM_CLAIM_BITS) - 1)
#define NM_MAX_CHUNKS NM_POOL_ROUND_CHUNKS // a bigger job runs in rounds
_Static_assert(NM_POOL_ROUND_CHUNKS == NM_CLAIM_MASK, "round size is what a claim word can count");
#define CLAIM_SEQ(w) ((uint32_t)((w) >> (2 * NM_CLAIM_BITS)))
#define CLAIM_N(w) ((int64_t)(((w) >> NM_CLAIM_BITS) & NM_CLAIM_MASK))
#define CLAIM_C(w) ((int64_t)((w)&NM_CLAIM_MASK))

struct nm_pool {
    int n;                     // threads including the caller
    pthread_t *threads;        // n-1 helpers
    _Atomic uint64_t claim;    // (seq << 32) | (n_chunks << 16) | next chunk
    nm_event gen;              // bumped per job: wakes parked workers
    nm_event done_ev;          // bumped when the last chunk finishes
    _Atomic int64_t done;      // chunks finished in the current job
    _Atomic int stop;
    // Read by workers while the caller may be writing the next job's: atomic
    // (relaxed; the release store of `claim` orders them) to stay race-free.
    _Atomic(nm_pool_fn) fn;
    _Atomic(void *) arg;
    _Atomic int64_t base;      // chunk index of the round's first chunk
    uint32_t seq;              // caller-side copy of the current sequence
    // nm_pool_pin: the thread that drives a job is pinned to the first core when
    // it first does (the creating thread is left alone: threads it starts later,
    // such as another brick's, would inherit a one-core mask)
    bool pin_caller;
    bool caller_pinned;
    pthread_t caller;          // the driving thread pinned last
    // the cores the creating thread could run on (its lane's, or all): workers
    // inherit that mask, and nm_pool_pin pins within it
    int n_cores;
    int cores[NM_MAX_CPUS];
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

// Claims and runs chunks of the job with sequence `seq` until none is left.
static void work(nm_pool *p, uint32_t seq, int ith) {
    uint64_t cur = atomic_load_explicit(&p->claim, memory_order_acquire);
    for (;;) {
        if (CLAIM_SEQ(cur) != seq) return; // a newer job: this one is over
        const int64_t n = CLAIM_N(cur), c = CLAIM_C(cur);
        if (c >= n) return;
        nm_pool_fn fn = atomic_load_explicit(&p->fn, memory_order_relaxed);
        void *arg = atomic_load_explicit(&p->arg, memory_order_relaxed);
        int64_t base = atomic_load_explicit(&p->base, memory_order_relaxed);
        if (!atomic_compare_exchange_weak_explicit(&p->claim, &cur, cur + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue; // cur was reloaded
        fn(arg, base + c, ith);
        if (atomic_fetch_add_explicit(&p->done, 1, memory_order_acq_rel) + 1 == n) signal_change(&p->done_ev);
        cur = atomic_load_explicit(&p->claim, memory_order_acquire);
    }
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
        work(p, CLAIM_SEQ(atomic_load_explicit(&p->claim, memory_order_acquire)), ith);
    }
    return NULL;
}

int32_t nm_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

nm_pool *nm_pool_create(int n_threads) {
    if (n_threads <= 0) n_threads = nm_cpu_count();
    nm_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = n_threads;
    cpu_set_t mask;
    CPU_ZERO(&mask);
    if (pthread_getaffinity_np(pthread_self(), sizeof mask, &mask) == 0)
        for (int c = 0; c < NM_MAX_CPUS; c++)
            if (CPU_ISSET(c, &mask)) p->cores[p->n_cores++] = c;
    if (p->n_cores == 0) // unknown: the online cores
        for (int c = 0; c < nm_cpu_count() && c < NM_MAX_CPUS; c++) p->cores[p->n_cores++] = c;
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    if (!p->threads) {
        free(p);
        return NULL;
    }
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

static int pin_to(pthread_t t, int core) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(core, &set);
    return pthread_setaffinity_np(t, sizeof set, &set) == 0 ? 0 : -1;
}

int nm_pool_pin(nm_pool *p) {
    int rc = 0;
    for (int i = 1; i < p->n; i++)
        if (pin_to(p->threads[i - 1], p->cores[i % p->n_cores]) != 0) rc = -1;
    p->pin_caller = true;
    p->caller_pinned = false;
    return rc;
}

// The driving thread on the first core, once per thread that drives the pool.
static void pin_caller(nm_pool *p) {
    const pthread_t self = pthread_self();
    if (p->caller_pinned && pthread_equal(p->caller, self)) return;
    (void)pin_to(self, p->cores[0]); // best effort, as nm_pool_pin
    p->caller = self;
    p->caller_pinned = true;
}

static void run_round(nm_pool *p, nm_pool_fn fn, void *arg, int64_t base, int64_t n) {
    atomic_store_explicit(&p->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&p->arg, arg, memory_order_relaxed);
    atomic_store_explicit(&p->base, base, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    uint32_t done_word = atomic_load_explicit(&p->done_ev.word, memory_order_acquire);
    p->seq++;
    atomic_store_explicit(&p->claim, ((uint64_t)p->seq << (2 * NM_CLAIM_BITS)) | ((uint64_t)n << NM_CLAIM_BITS),
                          memory_order_release);
    signal_change(&p->gen);
    work(p, p->seq, 0);
    while (atomic_load_explicit(&p->done, memory_order_acquire) != n)
        done_word = wait_change(&p->done_ev, done_word);
}

void nm_pool_run(nm_pool *p, nm_pool_fn fn, void *arg, int64_t n_chunks) {
    if (n_chunks <= 0) return;
    if (p->pin_caller) pin_caller(p);
    if (p->n == 1 || n_chunks == 1) {
        for (int64_t c = 0; c < n_chunks; c++) fn(arg, c, 0);
        return;
    }
    for (int64_t base = 0; base < n_chunks; base += NM_MAX_CHUNKS)
        run_round(p, fn, arg, base, n_chunks - base < NM_MAX_CHUNKS ? n_chunks - base : NM_MAX_CHUNKS);
}
