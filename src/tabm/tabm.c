// TABM ring: see tabm.h for the layout and tests/spin/tabm.pml for the model
// of the slot protocol. Labels like [W1] name the model's transitions.
#include "tabm/tabm.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdalign.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "mem/umem.h"
#include "core/fail.h"

#define TABM_MAGIC "NMTABM\0"
#define TABM_VERSION 5u
#define CL 128 // cache line (128 on Apple/some ARM; harmless elsewhere)
#define MAX_SLOTS 65536u
#define MAX_PAYLOAD (1ull << 40)
#define SPIN_ITERS 64 // re-checks before sleeping: cheap on the hand-off path, short on 2 cores

#if defined(__x86_64__) || defined(__i386__)
#define CPU_RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield")
#else
#define CPU_RELAX() ((void)0)
#endif

// A futex word bumped on every event, and how many wait on it (a wake costs a
// syscall only when someone sleeps; see wait_ev/signal_ev for the ordering).
typedef struct tabm_event {
    alignas(CL) _Atomic uint32_t word;
    _Atomic uint32_t sleepers;
} tabm_event;

// What a critical section is about to change, written before it changes
// anything: a process killed inside one leaves it valid, and whoever takes the
// lock from the dead owner puts these values back (recover). Every section
// changes at most one slot's header.
typedef struct tabm_journal {
    _Atomic uint32_t valid;
    uint32_t slot, state, owner;
    uint64_t fq_head, fq_tail, rq_head, rq_tail;
    uint32_t n_write, in_use;
} tabm_journal;

typedef struct tabm_ctl {
    char magic[8];
    uint32_t version, ctl_size, hdr_size, n_slots, qcap, pad0;
    uint64_t max_payload, stride;
    uint64_t hdr_off, freeq_off, readyq_off, payload_off, total_size;
    uint64_t t_create_ns;

    alignas(CL) _Atomic uint32_t shutdown;
    _Atomic uint32_t n_pollers; // handles that asked for the eventfd
    _Atomic uint32_t foreign;   // a peer attached from another pid namespace: pids mean nothing
    _Atomic uint64_t pidns;     // the creator's pid namespace (inode of /proc/self/ns/pid; 0: unknown)
    _Atomic uint32_t creator;   // the creator's pid
    _Atomic uint32_t multi;     // another process has used the ring (sticky)
    _Atomic int32_t reader_tid, writer_tid; // the thread that last asked to read, to write (NM_TABM_WAIT_PEER)
    // Cancelled request ids, the last NM_TABM_MAX_CANCELLED: written round
    // robin (n_cancel counts every mark), read by the bricks between steps.
    _Atomic uint64_t n_cancel;
    _Atomic uint64_t cancelled[NM_TABM_MAX_CANCELLED];
    tabm_event ev_free;         // a slot went back to FREE (or shutdown, or a reap)
    tabm_event ev_ready;        // a slot was published, a writer left (or shutdown, or a reap)
    // The ring lock: 0, or the owner's pid | LOCK_WAIT. Everything from here
    // to the stats is read and written under it (relaxed atomics: the stats
    // read some of it without the lock).
    alignas(CL) _Atomic uint32_t lock;
    tabm_journal jn;
    _Atomic uint64_t fq_head, fq_tail, rq_head, rq_tail;
    _Atomic uint32_t n_write; // slots ALLOCATED_FOR_WRITE
    _Atomic uint32_t in_use;  // slots not FREE

    alignas(CL) _Atomic uint64_t published, released, bytes, full_waits, empty_waits;
    _Atomic uint64_t reclaimed_write, reclaimed_read, recoveries;
    _Atomic uint32_t max_occ;
    _Atomic uint64_t wh[NM_TABM_HIST_BUCKETS], rh[NM_TABM_HIST_BUCKETS];
} tabm_ctl;

typedef struct tabm_hdr {
    alignas(CL) _Atomic uint32_t state; // gen << 2 | state
    _Atomic uint32_t owner;             // pid of the process holding the slot (0: none)
    nm_tabm_meta meta;
} tabm_hdr;
_Static_assert(sizeof(tabm_hdr) == CL, "slot header is one 128-byte line");

#define ST(w) ((w)&3u)
#define GEN(w) ((w) >> 2)
#define WORD(g, s) (((g) << 2) | (s))

struct nm_tabm {
    uint8_t *base;
    size_t map_size;
    nm_umem *own_pool;  // create(NULL, ...): the ring's own memfd pool
    nm_umem_buf *buf;   // create: the buffer; attach: NULL (mapped by hand)
    int fd;             // attach: owned dup; create: borrowed from buf
    int efd;            // owned eventfd, or -1
    tabm_ctl *ctl;
    tabm_hdr *hdr;
    _Atomic uint32_t *fq, *rq; // queue cells: slot indices
    uint8_t *payload;
    uint32_t n_slots;
    uint64_t qmask, stride;
    size_t max_payload;
    _Atomic int polling;
    pthread_mutex_t err_lock; // err: written by failing calls of any thread
    char err[256];
};

typedef struct layout {
    uint64_t qcap, ctl_size, hdr_off, freeq_off, readyq_off, payload_off, stride, total;
} layout;

static uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

static void compute_layout(uint32_t n_slots, uint64_t max_payload, layout *L) {
    L->qcap = 1;
    while (L->qcap < n_slots) L->qcap <<= 1;
    L->ctl_size = round_up(sizeof(tabm_ctl), CL);
    L->hdr_off = L->ctl_size;
    L->freeq_off = round_up(L->hdr_off + (uint64_t)n_slots * sizeof(tabm_hdr), CL);
    L->readyq_off = round_up(L->freeq_off + L->qcap * sizeof(uint32_t), CL);
    // Page-aligned slots once a payload is a page or more: a GPU driver can
    // import each slot as a host pointer.
    L->stride = max_payload >= 4096 ? round_up(max_payload, 4096) : round_up(max_payload, CL);
    L->payload_off = round_up(L->readyq_off + L->qcap * sizeof(uint32_t), 4096);
    L->total = round_up(L->payload_off + (uint64_t)n_slots * L->stride, 4096);
}

static nm_status fail(nm_tabm *r, nm_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&r->err_lock);
    nm_vfail(st, r->err, sizeof r->err, NULL, fmt, ap);
    pthread_mutex_unlock(&r->err_lock);
    va_end(ap);
    return st;
}

static nm_tabm *ring_new(void) {
    nm_tabm *r = calloc(1, sizeof *r);
    if (r && pthread_mutex_init(&r->err_lock, NULL) != 0) {
        free(r);
        r = NULL;
    }
    return r;
}

static void ring_delete(nm_tabm *r) {
    pthread_mutex_destroy(&r->err_lock);
    free(r);
}

// ---- futex words ---------------------------------------------------------------
// Shared futexes (no FUTEX_PRIVATE_FLAG): waiters may be in other processes.
static void futex_wait(_Atomic uint32_t *a, uint32_t val, const struct timespec *rel) {
    syscall(SYS_futex, (uint32_t *)a, FUTEX_WAIT, val, rel, NULL, 0);
}
static void futex_wake(_Atomic uint32_t *a, int n) {
    syscall(SYS_futex, (uint32_t *)a, FUTEX_WAKE, n, NULL, NULL, 0);
}

// [WAKE_*] Waker: bump the word, then read sleepers; waiter: sleepers++, then
// re-read the word (wait_ev). Both seq_cst, so either the waiter sees the new
// word or the waker sees the sleeper; FUTEX_WAIT re-checks the word in the kernel.
static void signal_ev(tabm_event *e) {
    atomic_fetch_add(&e->word, 1);
    if (atomic_load(&e->sleepers) > 0) futex_wake(&e->word, INT_MAX);
}

// [SLEEP_*] Waits until e->word != seen, or the deadline (0: none), in sleeps
// of at most `chunk` ns (0: unbounded). false on timeout or at the end of a
// chunk (the caller looks for dead peers, then waits again).
static bool wait_ev(tabm_event *e, uint32_t seen, uint64_t deadline, uint64_t chunk) {
    for (int i = 0; i < SPIN_ITERS; i++) {
        if (atomic_load_explicit(&e->word, memory_order_acquire) != seen) return true;
        CPU_RELAX();
    }
    bool ok = true;
    uint64_t end = chunk ? nm_now_ns() + chunk : 0;
    if (end && (!deadline || end < deadline)) deadline = end;
    atomic_fetch_add(&e->sleepers, 1);
    while (atomic_load(&e->word) == seen) {
        struct timespec ts, *tp = NULL;
        if (deadline) {
            uint64_t now = nm_now_ns();
            if (now >= deadline) {
                ok = false;
                break;
            }
            uint64_t rel = deadline - now;
            ts.tv_sec = (time_t)(rel / 1000000000u);
            ts.tv_nsec = (long)(rel % 1000000000u);
            tp = &ts;
        }
        futex_wait(&e->word, seen, tp);
    }
    atomic_fetch_sub(&e->sleepers, 1);
    return ok;
}

// ---- peers: who holds what, and whether they still live ------------------------------
// A slot held for write or read, and the ring lock, name their holder by pid
// (the process: any of its threads may publish or release). A holder that died
// (kill -9, a crash) is found by the peers that wait on it, and what it held is
// taken back: the lock by recover(), slots by reap(). All peers of a ring must
// share a pid namespace for this; a peer attaching from another one switches
// it off for the ring (ctl->foreign), which then trusts every holder to live.
#define LOCK_WAIT 0x40000000u // someone sleeps on the lock word
#define LOCK_PID(w) ((w)&0x3fffffffu)
#define PEER_CHECK_NS 100000000ull // a sleeper that could be waiting on a dead peer looks this often
#define PEER_IDLE_NS 1000000000ull // and one on a ring of several processes, in any case

static _Atomic uint32_t g_pid; // getpid(), cached; forgotten in a forked child
static pthread_once_t g_pid_once = PTHREAD_ONCE_INIT;
static void pid_forget(void) { atomic_store(&g_pid, 0); }
static void pid_once(void) { pthread_atfork(NULL, NULL, pid_forget); }
// This thread's id (unique among the threads of a pid namespace).
static int32_t my_tid(void) {
    static _Thread_local int32_t tid;
    if (!tid) tid = (int32_t)syscall(SYS_gettid);
    return tid;
}

// Records the calling thread as the ring's last reader or writer (a store only when it changes).
static void note_tid(_Atomic int32_t *who) {
    const int32_t t = my_tid();
    if (atomic_load_explicit(who, memory_order_relaxed) != t) atomic_store_explicit(who, t, memory_order_relaxed);
}

// NM_TABM_WAIT_PEER: 1 when another thread (or a process of another pid namespace) is the other side,
// 0 when none has come yet, -1 when the other side is the calling thread itself.
static int peer_of(const tabm_ctl *c, const _Atomic int32_t *other) {
    const int32_t t = atomic_load_explicit(other, memory_order_relaxed);
    return atomic_load(&c->foreign) || (t != 0 && t != my_tid()) ? 1 : t == 0 ? 0 : -1;
}

// How long NM_TABM_WAIT_PEER waits for the other side's first call when none has come yet (a lane
// started just before may not have asked yet).
#define PEER_GRACE_NS 1000000000ll
static uint64_t deadline_of(int64_t timeout_ns);

// NM_TABM_WAIT_PEER's wait, decided when a call finds nothing: the deadline to wait to (0: forever), or
// false for NM_ERR_AGAIN. A wait for a first peer that ran out (*grace) is decided again.
static bool peer_wait(const tabm_ctl *c, const _Atomic int32_t *other, bool *grace, uint64_t *deadline) {
    const int p = peer_of(c, other);
    if (p < 0 || (p == 0 && *grace)) return false;
    if (p == 0) *grace = true, *deadline = deadline_of(PEER_GRACE_NS);
    else *grace = false, *deadline = 0;
    return true;
}

static uint32_t my_pid(void) {
    uint32_t p = atomic_load_explicit(&g_pid, memory_order_relaxed);
    if (!p) {
        pthread_once(&g_pid_once, pid_once);
        p = (uint32_t)getpid();
        atomic_store_explicit(&g_pid, p, memory_order_relaxed);
    }
    return p;
}

static uint64_t pid_ns(void) {
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

// false only when pid is surely gone: no such process, or a zombie (dead,
// not yet reaped by its parent).
static bool peer_alive(const nm_tabm *r, uint32_t pid) {
    if (pid == 0 || pid == my_pid() || atomic_load_explicit(&r->ctl->foreign, memory_order_relaxed)) return true;
    if (kill((pid_t)pid, 0) < 0 && errno == ESRCH) return false;
    char path[40], buf[512];
    snprintf(path, sizeof path, "/proc/%u/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno != ENOENT;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return true;
    buf[n] = 0;
    const char *p = strrchr(buf, ')'); // the name may hold spaces and parentheses
    return !(p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X'));
}

// Tests kill the process at the n-th step inside a critical section (tabm.h).
_Atomic int nm_tabm_crash_countdown;
#define CRASH_POINT()                                                                        \
    do {                                                                                     \
        if (atomic_load_explicit(&nm_tabm_crash_countdown, memory_order_relaxed) > 0 &&      \
            atomic_fetch_sub(&nm_tabm_crash_countdown, 1) == 1)                              \
            raise(SIGKILL);                                                                  \
    } while (0)

// ---- the ring lock and its journal ------------------------------------------------------------
// Every change to the queues, the counters and a slot's state is made under one
// lock, a futex word holding its owner's pid ([L1]). Each critical section
// first writes a journal of what it will change ([J1]), then changes it, then
// clears the journal ([J2]); one that finds the owner dead takes the word over
// and undoes the half-done section from the journal ([REC]). The sections are
// a few stores long: contention costs a few spins, rarely a sleep.
static void recover(nm_tabm *r) {
    tabm_ctl *c = r->ctl;
    tabm_journal *j = &c->jn;
    if (atomic_load(&j->valid)) { // [REC] undo; idempotent if we die here too
        atomic_store_explicit(&c->fq_head, j->fq_head, memory_order_relaxed);
        atomic_store_explicit(&c->fq_tail, j->fq_tail, memory_order_relaxed);
        CRASH_POINT();
        atomic_store_explicit(&c->rq_head, j->rq_head, memory_order_relaxed);
        atomic_store_explicit(&c->rq_tail, j->rq_tail, memory_order_relaxed);
        atomic_store_explicit(&c->n_write, j->n_write, memory_order_relaxed);
        atomic_store_explicit(&c->in_use, j->in_use, memory_order_relaxed);
        if (j->slot < r->n_slots) {
            atomic_store_explicit(&r->hdr[j->slot].state, j->state, memory_order_relaxed);
            atomic_store_explicit(&r->hdr[j->slot].owner, j->owner, memory_order_relaxed);
        }
        CRASH_POINT();
        atomic_store(&j->valid, 0);
    }
    atomic_fetch_add_explicit(&c->recoveries, 1, memory_order_relaxed);
}

// The ring has a second process: sleepers that chose unbounded sleeps
// (sleep_chunk) wake and choose again.
static void become_multi(nm_tabm *r) {
    if (atomic_exchange(&r->ctl->multi, 1) == 0) {
        signal_ev(&r->ctl->ev_free);
        signal_ev(&r->ctl->ev_ready);
    }
}

// [L1] check_now: look at the owner's liveness at once (the caller suspects
// it is dead), not after PEER_CHECK_NS of waiting.
static void ring_lock_ex(nm_tabm *r, bool check_now) {
    _Atomic uint32_t *lk = &r->ctl->lock;
    uint32_t me = my_pid(), v = 0;
    if (me != atomic_load_explicit(&r->ctl->creator, memory_order_relaxed) &&
        !atomic_load_explicit(&r->ctl->multi, memory_order_relaxed))
        become_multi(r); // e.g. a forked child on the creator's handle
    if (atomic_compare_exchange_strong(lk, &v, me)) { // [L1]
        CRASH_POINT();
        return;
    }
    for (int i = 0; i < SPIN_ITERS; i++) {
        CPU_RELAX();
        v = 0;
        if (atomic_load_explicit(lk, memory_order_relaxed) == 0 && atomic_compare_exchange_strong(lk, &v, me))
            return;
    }
    // Having slept, we may not be the last sleeper: keep LOCK_WAIT in the word.
    uint32_t want = me | LOCK_WAIT;
    uint64_t next_check = check_now ? 0 : nm_now_ns() + PEER_CHECK_NS;
    for (;;) {
        v = atomic_load(lk);
        if (v == 0) {
            if (atomic_compare_exchange_strong(lk, &v, want)) return;
            continue;
        }
        uint64_t now = nm_now_ns();
        if (now >= next_check) {
            next_check = now + PEER_CHECK_NS;
            if (!peer_alive(r, LOCK_PID(v))) {
                if (atomic_compare_exchange_strong(lk, &v, want)) { // the owner died holding it
                    CRASH_POINT();
                    recover(r);
                    // The wakes it may have owed (it died between a step and its signal).
                    signal_ev(&r->ctl->ev_free);
                    signal_ev(&r->ctl->ev_ready);
                    return;
                }
                continue;
            }
        }
        if (!(v & LOCK_WAIT) && !atomic_compare_exchange_strong(lk, &v, v | LOCK_WAIT)) continue;
        struct timespec ts = {0, (long)PEER_CHECK_NS};
        futex_wait(lk, v | LOCK_WAIT, &ts);
    }
}

static void ring_lock(nm_tabm *r) { ring_lock_ex(r, false); }

static void ring_unlock(nm_tabm *r) {
    if (atomic_exchange(&r->ctl->lock, 0) & LOCK_WAIT) futex_wake(&r->ctl->lock, 1);
}

// [J1] Under the lock: note what the section may change (slot: the one
// header it changes, or UINT32_MAX).
static void journal(nm_tabm *r, uint32_t slot) {
    tabm_ctl *c = r->ctl;
    tabm_journal *j = &c->jn;
    j->fq_head = atomic_load_explicit(&c->fq_head, memory_order_relaxed);
    j->fq_tail = atomic_load_explicit(&c->fq_tail, memory_order_relaxed);
    j->rq_head = atomic_load_explicit(&c->rq_head, memory_order_relaxed);
    j->rq_tail = atomic_load_explicit(&c->rq_tail, memory_order_relaxed);
    j->n_write = atomic_load_explicit(&c->n_write, memory_order_relaxed);
    j->in_use = atomic_load_explicit(&c->in_use, memory_order_relaxed);
    j->slot = slot;
    if (slot < r->n_slots) {
        j->state = atomic_load_explicit(&r->hdr[slot].state, memory_order_relaxed);
        j->owner = atomic_load_explicit(&r->hdr[slot].owner, memory_order_relaxed);
    }
    atomic_store(&j->valid, 1); // seq_cst: after the copy, before any change
    CRASH_POINT();
}
static void commit(nm_tabm *r) { // [J2]
    atomic_store(&r->ctl->jn.valid, 0);
    CRASH_POINT();
}

// A store inside a critical section (a crash point after it, for the tests).
static void set_word(_Atomic uint32_t *a, uint32_t v) {
    atomic_store_explicit(a, v, memory_order_relaxed);
    CRASH_POINT();
}
static void cnt_add(_Atomic uint32_t *a, int d) {
    set_word(a, atomic_load_explicit(a, memory_order_relaxed) + (uint32_t)d);
}

// ---- the two queues of slot indices (FIFO arrays, changed under the lock) ---------------
static void q_push(_Atomic uint32_t *q, uint64_t mask, _Atomic uint64_t *tail, uint32_t val) {
    uint64_t t = atomic_load_explicit(tail, memory_order_relaxed);
    atomic_store_explicit(&q[t & mask], val, memory_order_relaxed);
    CRASH_POINT();
    atomic_store_explicit(tail, t + 1, memory_order_relaxed);
    CRASH_POINT();
}
// The index at the head, or UINT32_MAX when empty; q_pop then drops it.
static uint32_t q_peek(const _Atomic uint32_t *q, uint64_t mask, _Atomic uint64_t *head, _Atomic uint64_t *tail) {
    uint64_t h = atomic_load_explicit(head, memory_order_relaxed);
    if (h == atomic_load_explicit(tail, memory_order_relaxed)) return UINT32_MAX;
    return atomic_load_explicit(&q[h & mask], memory_order_relaxed);
}
static void q_pop(_Atomic uint64_t *head) {
    atomic_store_explicit(head, atomic_load_explicit(head, memory_order_relaxed) + 1, memory_order_relaxed);
    CRASH_POINT();
}

// ---- create / attach ------------------------------------------------------------------
static void bind(nm_tabm *r, const layout *L) {
    r->ctl = (tabm_ctl *)r->base;
    r->hdr = (tabm_hdr *)(r->base + L->hdr_off);
    r->fq = (_Atomic uint32_t *)(r->base + L->freeq_off);
    r->rq = (_Atomic uint32_t *)(r->base + L->readyq_off);
    r->payload = r->base + L->payload_off;
    r->n_slots = r->ctl->n_slots;
    r->qmask = L->qcap - 1;
    r->stride = L->stride;
    r->max_payload = (size_t)r->ctl->max_payload;
}

nm_status nm_tabm_create(nm_umem *pool, uint32_t n_slots, size_t max_payload, nm_tabm **out, char *err,
                         size_t err_size) {
    if (err && err_size) err[0] = 0;
    if (!out) return NM_ERR_INVALID_ARG;
    *out = NULL;
    if (n_slots < 1 || n_slots > MAX_SLOTS || max_payload < 1 || max_payload > MAX_PAYLOAD) {
        if (err) snprintf(err, err_size, "tabm: %u slots of %zu bytes: want 1..%u slots of 1..2^40 bytes",
                          n_slots, max_payload, MAX_SLOTS);
        return NM_ERR_INVALID_ARG;
    }
    layout L;
    compute_layout(n_slots, max_payload, &L);
    nm_tabm *r = ring_new();
    if (!r) return NM_ERR_NOMEM;
    r->efd = -1;
    nm_status st;
    if (!pool) {
        nm_umem_params pp = nm_umem_default_params();
        pp.kinds = 1u << NM_UMEM_MEMFD;
        pp.align = 4096;
        if ((st = nm_umem_create(&pp, &r->own_pool, err, err_size)) != NM_OK) goto fail;
        pool = r->own_pool;
    }
    // One memfd for everything: futex words must be in memory the kernel can
    // key across processes (a dma-buf mapping may not be), hence NO_DMABUF.
    if ((st = nm_umem_alloc(pool, L.total, NM_UMEM_F_FD | NM_UMEM_F_NO_DMABUF, &r->buf)) != NM_OK) {
        if (err) snprintf(err, err_size, "tabm: %s", nm_umem_last_error(pool));
        goto fail;
    }
    nm_umem_hold(r->buf); // the ring outlives an nm_umem_free of its pool
    r->base = nm_umem_buf_data(r->buf);
    r->map_size = nm_umem_buf_size(r->buf);
    r->fd = nm_umem_buf_fd(r->buf);
    r->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (r->efd < 0) {
        if (err) snprintf(err, err_size, "tabm: eventfd: %s", strerror(errno));
        st = NM_ERR_IO;
        goto fail;
    }
    // The buffer is zeroed: only non-zero fields need writing.
    tabm_ctl *c = (tabm_ctl *)r->base;
    memcpy(c->magic, TABM_MAGIC, 8);
    c->version = TABM_VERSION;
    c->ctl_size = (uint32_t)L.ctl_size;
    c->hdr_size = sizeof(tabm_hdr);
    c->n_slots = n_slots;
    c->qcap = (uint32_t)L.qcap;
    c->max_payload = max_payload;
    c->stride = L.stride;
    c->hdr_off = L.hdr_off;
    c->freeq_off = L.freeq_off;
    c->readyq_off = L.readyq_off;
    c->payload_off = L.payload_off;
    c->total_size = L.total;
    c->t_create_ns = nm_now_ns();
    bind(r, &L);
    for (uint32_t i = 0; i < n_slots; i++) atomic_init(&r->fq[i], i);
    atomic_init(&c->fq_tail, n_slots);
    atomic_init(&c->pidns, pid_ns());
    atomic_init(&c->creator, my_pid());
    atomic_thread_fence(memory_order_seq_cst);
    *out = r;
    return NM_OK;
fail:
    if (r->efd >= 0) close(r->efd);
    nm_umem_buf_free(r->buf);
    nm_umem_free(r->own_pool);
    ring_delete(r);
    return st;
}

nm_status nm_tabm_attach(int fd, int efd, nm_tabm **out, char *err, size_t err_size) {
    if (err && err_size) err[0] = 0;
    if (!out) return NM_ERR_INVALID_ARG;
    *out = NULL;
#define AFAIL(st_, ...)                                           \
    do {                                                          \
        if (err) snprintf(err, err_size, "tabm: attach: " __VA_ARGS__); \
        st = (st_);                                               \
        goto fail;                                                \
    } while (0)
    nm_status st = NM_OK;
    nm_tabm *r = ring_new();
    if (!r) return NM_ERR_NOMEM;
    r->fd = r->efd = -1;
    r->base = MAP_FAILED;
    tabm_ctl c;
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) < 0) AFAIL(NM_ERR_IO, "fd %d: %s", fd, fd < 0 ? "invalid" : strerror(errno));
    if ((uint64_t)sb.st_size < sizeof c) AFAIL(NM_ERR_FORMAT, "fd %d is %lld bytes, too small for a ring", fd, (long long)sb.st_size);
    if (pread(fd, &c, sizeof c, 0) != (ssize_t)sizeof c) AFAIL(NM_ERR_IO, "read of the ring header: %s", strerror(errno));
    if (memcmp(c.magic, TABM_MAGIC, 8)) AFAIL(NM_ERR_FORMAT, "bad magic: not a TABM ring");
    if (c.version != TABM_VERSION) AFAIL(NM_ERR_UNSUPPORTED, "ring version %u, this build reads %u", c.version, TABM_VERSION);
    if (c.n_slots < 1 || c.n_slots > MAX_SLOTS || c.max_payload < 1 || c.max_payload > MAX_PAYLOAD)
        AFAIL(NM_ERR_FORMAT, "geometry %u slots x %llu bytes out of range", c.n_slots, (unsigned long long)c.max_payload);
    layout L;
    compute_layout(c.n_slots, c.max_payload, &L);
    if (c.ctl_size != L.ctl_size || c.hdr_size != sizeof(tabm_hdr) || c.qcap != L.qcap || c.stride != L.stride ||
        c.hdr_off != L.hdr_off || c.freeq_off != L.freeq_off || c.readyq_off != L.readyq_off ||
        c.payload_off != L.payload_off || c.total_size != L.total)
        AFAIL(NM_ERR_FORMAT, "layout fields do not match the geometry (corrupt or another build's ring)");
    if ((uint64_t)sb.st_size < L.total)
        AFAIL(NM_ERR_FORMAT, "fd holds %lld bytes, the ring needs %llu", (long long)sb.st_size, (unsigned long long)L.total);
    if ((r->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0) AFAIL(NM_ERR_IO, "dup: %s", strerror(errno));
    if (efd >= 0 && (r->efd = fcntl(efd, F_DUPFD_CLOEXEC, 0)) < 0) AFAIL(NM_ERR_IO, "dup of eventfd: %s", strerror(errno));
    r->map_size = (size_t)L.total;
    r->base = mmap(NULL, r->map_size, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, 0);
    if (r->base == MAP_FAILED) AFAIL(NM_ERR_IO, "mmap of %zu bytes: %s", r->map_size, strerror(errno));
    bind(r, &L);
    become_multi(r);
    uint64_t ns = pid_ns(), theirs = atomic_load(&r->ctl->pidns);
    if (!ns || !theirs || ns != theirs) atomic_store(&r->ctl->foreign, 1); // pids are not comparable: trust every holder
    *out = r;
    return NM_OK;
#undef AFAIL
fail:
    if (r->base != MAP_FAILED) munmap(r->base, r->map_size);
    if (r->fd >= 0) close(r->fd);
    if (r->efd >= 0) close(r->efd);
    ring_delete(r);
    return st;
}

void nm_tabm_free(nm_tabm *r) {
    if (!r) return;
    if (r->buf) {
        nm_umem_buf_free(r->buf); // closes the fd
        nm_umem_free(r->own_pool);
    } else {
        munmap(r->base, r->map_size);
        close(r->fd);
    }
    if (r->efd >= 0) close(r->efd);
    ring_delete(r);
}

int nm_tabm_fd(const nm_tabm *r) { return r ? r->fd : -1; }
uint32_t nm_tabm_n_slots(const nm_tabm *r) { return r ? r->n_slots : 0; }
size_t nm_tabm_max_payload(const nm_tabm *r) { return r ? r->max_payload : 0; }
// Copied out under the lock into the calling thread's own buffer (see nm_umem_last_error).
const char *nm_tabm_last_error(const nm_tabm *r) {
    static _Thread_local char msg[sizeof r->err];
    return r ? nm_err_snapshot(&((nm_tabm *)r)->err_lock, r->err, msg, sizeof msg) : "";
}

int nm_tabm_poll_fd(nm_tabm *r) {
    if (!r || r->efd < 0) return -1;
    int was = 0;
    if (atomic_compare_exchange_strong(&r->polling, &was, 1)) atomic_fetch_add(&r->ctl->n_pollers, 1);
    return r->efd;
}

static void poke_pollers(nm_tabm *r) {
    if (r->efd >= 0 && atomic_load_explicit(&r->ctl->n_pollers, memory_order_relaxed) > 0) {
        uint64_t one = 1;
        ssize_t w = write(r->efd, &one, sizeof one); // EAGAIN at counter overflow: already readable
        (void)w;
    }
}

int nm_tabm_slot_state(const nm_tabm *r, uint32_t index) {
    if (!r || index >= r->n_slots) return -1;
    return (int)ST(atomic_load(&r->hdr[index].state));
}

// ---- the slot protocol -----------------------------------------------------------------
static int hist_bucket(uint64_t ns) {
    uint64_t us = ns / 1000;
    int b = 1;
    while (us && b < NM_TABM_HIST_BUCKETS - 1) {
        us >>= 1;
        b++;
    }
    return b; // [2^(b-2), 2^(b-1)) us for b >= 2; b == 1: under 1 us
}

static uint64_t deadline_of(int64_t timeout_ns) {
    return timeout_ns > 0 ? nm_now_ns() + (uint64_t)timeout_ns : 0;
}

static void fill_slot(nm_tabm *r, uint32_t idx, uint32_t gen, nm_tabm_slot *s) {
    s->data = r->payload + (uint64_t)idx * r->stride;
    s->capacity = r->max_payload;
    s->meta = &r->hdr[idx].meta;
    s->index = idx;
    s->gen = gen;
}

// ---- dead peers ----------------------------------------------------------------------
// [REAP] Slots held (for write or read) by processes that died go back to
// FREE, in one critical section each; a dead writer's slot no longer counts
// in n_write, so readers draining a shut-down ring can end. Returns how many.
static uint32_t reap(nm_tabm *r) {
    tabm_ctl *c = r->ctl;
    uint32_t n = 0, dead_pid = 0, live_pid = 0;
    uint32_t v = atomic_load(&c->lock);
    if (v && !peer_alive(r, LOCK_PID(v))) { // died inside a step: undo it (the slot may then be reaped)
        ring_lock_ex(r, true);
        ring_unlock(r);
    }
    for (uint32_t i = 0; i < r->n_slots; i++) {
        uint32_t w = atomic_load_explicit(&r->hdr[i].state, memory_order_relaxed);
        if (ST(w) != NM_TABM_ALLOCATED_FOR_WRITE && ST(w) != NM_TABM_ALLOCATED_FOR_READ) continue;
        uint32_t o = atomic_load_explicit(&r->hdr[i].owner, memory_order_relaxed);
        if (o == live_pid || (o != dead_pid && peer_alive(r, o))) {
            live_pid = o;
            continue;
        }
        dead_pid = o;
        ring_lock(r);
        w = atomic_load_explicit(&r->hdr[i].state, memory_order_relaxed);
        if ((ST(w) == NM_TABM_ALLOCATED_FOR_WRITE || ST(w) == NM_TABM_ALLOCATED_FOR_READ) &&
            atomic_load_explicit(&r->hdr[i].owner, memory_order_relaxed) == o) {
            journal(r, i);
            set_word(&r->hdr[i].state, WORD((GEN(w) + 1) & 0x3fffffffu, NM_TABM_FREE));
            set_word(&r->hdr[i].owner, 0);
            q_push(r->fq, r->qmask, &c->fq_tail, i);
            if (ST(w) == NM_TABM_ALLOCATED_FOR_WRITE)
                cnt_add(&c->n_write, -1);
            cnt_add(&c->in_use, -1);
            commit(r);
            n++;
            atomic_fetch_add_explicit(ST(w) == NM_TABM_ALLOCATED_FOR_WRITE ? &c->reclaimed_write : &c->reclaimed_read,
                                      1, memory_order_relaxed);
        }
        ring_unlock(r);
    }
    if (n) {
        signal_ev(&c->ev_free);
        signal_ev(&c->ev_ready);
    }
    return n;
}

uint32_t nm_tabm_reclaim(nm_tabm *r) { return r ? reap(r) : 0; }

// How long a waiter may sleep at once. A process killed between a step and
// its wake leaves nothing behind but a waiter that needed the wake, so on a
// ring that more than one process uses every sleep is bounded: PEER_CHECK_NS
// while another process holds the lock or a slot or a slot is READY (what it
// waits for may be stuck in a dead process), PEER_IDLE_NS otherwise. The
// threads of one process die together: their sleeps are unbounded (no timer
// wakes an idle brick).
static uint64_t sleep_chunk(nm_tabm *r) {
    if (!atomic_load_explicit(&r->ctl->multi, memory_order_relaxed)) return 0;
    uint32_t me = my_pid(), lk = LOCK_PID(atomic_load(&r->ctl->lock));
    if (lk && lk != me) return PEER_CHECK_NS;
    for (uint32_t i = 0; i < r->n_slots; i++) {
        uint32_t w = atomic_load_explicit(&r->hdr[i].state, memory_order_relaxed);
        if (ST(w) == NM_TABM_FREE) continue;
        if (ST(w) == NM_TABM_READY_TO_READ || atomic_load_explicit(&r->hdr[i].owner, memory_order_relaxed) != me)
            return PEER_CHECK_NS;
    }
    return PEER_IDLE_NS;
}

// Waits on e (seen: its word before the failed try) until it changes or the
// deadline passes (false); at the end of a bounded chunk, reaps what dead
// peers hold and returns for the caller to look again (a peer that died
// between a step and its wake owed this waiter that wake).
static bool wait_or_reap(nm_tabm *r, tabm_event *e, uint32_t seen, uint64_t deadline) {
    if (wait_ev(e, seen, deadline, sleep_chunk(r))) return true;
    if (deadline && nm_now_ns() >= deadline) return false;
    reap(r);
    return true;
}

// ---- the slot protocol: each step one critical section ---------------------------------
nm_status nm_tabm_acquire_write(nm_tabm *r, uint32_t producer, int64_t timeout_ns, nm_tabm_slot *slot) {
    if (!r || !slot) return NM_ERR_INVALID_ARG;
    tabm_ctl *c = r->ctl;
    note_tid(&c->writer_tid);
    uint64_t deadline = 0, t0 = 0;
    bool waited = false, grace = false;
    for (;;) {
        uint32_t seen = atomic_load(&c->ev_free.word);
        ring_lock(r);
        if (atomic_load(&c->shutdown)) { // [W0]
            ring_unlock(r);
            return NM_ERR_SHUTDOWN;
        }
        uint32_t idx = q_peek(r->fq, r->qmask, &c->fq_head, &c->fq_tail);
        if (idx != UINT32_MAX) { // [W1] take a FREE slot
            uint32_t w = idx < r->n_slots ? atomic_load_explicit(&r->hdr[idx].state, memory_order_relaxed) : 0;
            if (idx >= r->n_slots || ST(w) != NM_TABM_FREE) { // only a corrupted ring (a peer writing headers) gets here
                ring_unlock(r);
                return fail(r, NM_ERR_FORMAT, "tabm: slot %u in the free queue is in state %u", idx, ST(w));
            }
            journal(r, idx);
            q_pop(&c->fq_head);
            set_word(&r->hdr[idx].state, WORD(GEN(w), NM_TABM_ALLOCATED_FOR_WRITE));
            set_word(&r->hdr[idx].owner, my_pid());
            cnt_add(&c->n_write, 1);
            uint32_t occ = atomic_load_explicit(&c->in_use, memory_order_relaxed) + 1;
            set_word(&c->in_use, occ);
            commit(r);
            if (occ > atomic_load_explicit(&c->max_occ, memory_order_relaxed))
                atomic_store_explicit(&c->max_occ, occ, memory_order_relaxed);
            ring_unlock(r);
            uint64_t now = nm_now_ns();
            tabm_hdr *h = &r->hdr[idx];
            h->meta = (nm_tabm_meta){.producer = producer, .t_acquire_ns = now};
            fill_slot(r, idx, GEN(w), slot);
            int b = waited ? hist_bucket(now - t0) : 0;
            atomic_fetch_add_explicit(&c->wh[b], 1, memory_order_relaxed);
            return NM_OK;
        }
        ring_unlock(r);
        if (timeout_ns == 0) return NM_ERR_AGAIN;
        if (!waited) {
            waited = true;
            t0 = nm_now_ns();
            deadline = deadline_of(timeout_ns);
            atomic_fetch_add_explicit(&c->full_waits, 1, memory_order_relaxed); // backpressure
            if (timeout_ns == NM_TABM_WAIT_PEER && !peer_wait(c, &c->reader_tid, &grace, &deadline))
                return NM_ERR_AGAIN; // the caller is the ring's reader: it cannot read while it waits
        }
        if (!wait_or_reap(r, &c->ev_free, seen, deadline)) { // [SLEEP_F]
            if (timeout_ns != NM_TABM_WAIT_PEER) return NM_ERR_TIMEOUT;
            if (!peer_wait(c, &c->reader_tid, &grace, &deadline)) return NM_ERR_AGAIN; // no reader came
        }
    }
}

static size_t kind_elsize(uint32_t kind) {
    switch (kind) {
    case NM_TABM_TOKENS: return 4;
    case NM_TABM_EMBD_F32: return 4;
    case NM_TABM_EMBD_F16: return 2;
    case NM_TABM_PCM_S16: return 2;
    case NM_TABM_PCM_F32: return 4;
    case NM_TABM_TEXT: return 1;
    case NM_TABM_IMAGE: return 1;
    case NM_TABM_PARAMS: return 1;
    }
    return 0;
}

static nm_status check_handle(nm_tabm *r, const nm_tabm_slot *s, const char *what) {
    if (!r || !s) return NM_ERR_INVALID_ARG;
    if (s->index >= r->n_slots || s->data != r->payload + (uint64_t)s->index * r->stride)
        return fail(r, NM_ERR_INVALID_ARG, "tabm: %s: not a slot of this ring (index %u)", what, s->index);
    return NM_OK;
}

nm_status nm_tabm_publish(nm_tabm *r, nm_tabm_slot *s) {
    nm_status st = check_handle(r, s, "publish");
    if (st) return st;
    tabm_hdr *h = &r->hdr[s->index];
    uint32_t expect = WORD(s->gen, NM_TABM_ALLOCATED_FOR_WRITE);
    if (atomic_load_explicit(&h->state, memory_order_relaxed) != expect)
        return fail(r, NM_ERR_STATE, "tabm: publish of slot %u, which is not held for write (state %u)", s->index,
                    ST(atomic_load(&h->state)));
    nm_tabm_meta *m = &h->meta;
    if (m->size > r->max_payload)
        return fail(r, NM_ERR_RANGE, "tabm: payload of %llu bytes, slots hold %zu", (unsigned long long)m->size,
                    r->max_payload);
    if (m->kind > NM_TABM_PARAMS) return fail(r, NM_ERR_INVALID_ARG, "tabm: unknown payload kind %u", m->kind);
    if (m->ndim < 0 || m->ndim > 4) return fail(r, NM_ERR_INVALID_ARG, "tabm: ndim %d not in 0..4", m->ndim);
    size_t es = kind_elsize(m->kind);
    if (es && m->ndim > 0) {
        uint64_t n = es;
        for (int i = 0; i < m->ndim; i++) {
            if (m->shape[i] <= 0 || (uint64_t)m->shape[i] > MAX_PAYLOAD || n > MAX_PAYLOAD)
                return fail(r, NM_ERR_RANGE, "tabm: shape[%d] = %lld", i, (long long)m->shape[i]);
            n *= (uint64_t)m->shape[i];
        }
        if (n != m->size)
            return fail(r, NM_ERR_RANGE, "tabm: shape says %llu bytes, size says %llu", (unsigned long long)n,
                        (unsigned long long)m->size);
    }
    m->t_publish_ns = nm_now_ns();
    uint64_t size = m->size; // the slot is the readers' once pushed
    tabm_ctl *c = r->ctl;
    ring_lock(r);
    // [W2] ALLOCATED_FOR_WRITE -> READY_TO_READ, into the ready queue (its
    // position there is the publish order, m->seq); [W3] one writer less.
    if (atomic_load_explicit(&h->state, memory_order_relaxed) != expect) {
        ring_unlock(r);
        return fail(r, NM_ERR_STATE, "tabm: slot %u changed state during publish (published twice?)", s->index);
    }
    journal(r, s->index);
    m->seq = atomic_load_explicit(&c->rq_tail, memory_order_relaxed);
    set_word(&h->state, WORD(s->gen, NM_TABM_READY_TO_READ));
    set_word(&h->owner, 0);
    q_push(r->rq, r->qmask, &c->rq_tail, s->index);
    cnt_add(&c->n_write, -1);
    commit(r);
    ring_unlock(r);
    CRASH_POINT(); // published, the readers not yet woken
    atomic_fetch_add_explicit(&c->published, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->bytes, size, memory_order_relaxed);
    signal_ev(&c->ev_ready); // [WAKE_R]
    poke_pollers(r);
    s->data = NULL; // the writer's handle is spent
    return NM_OK;
}

// Returns a held slot (state `from`, the handle's generation) to FREE.
static nm_status to_free(nm_tabm *r, nm_tabm_slot *s, uint32_t from, const char *what) {
    nm_status st = check_handle(r, s, what);
    if (st) return st;
    tabm_ctl *c = r->ctl;
    tabm_hdr *h = &r->hdr[s->index];
    uint32_t expect = WORD(s->gen, from);
    ring_lock(r);
    uint32_t w = atomic_load_explicit(&h->state, memory_order_relaxed);
    if (w != expect) {
        ring_unlock(r);
        return fail(r, NM_ERR_STATE, "tabm: %s of slot %u, which is not held for %s (state %u gen %u, handle gen %u)",
                    what, s->index, from == NM_TABM_ALLOCATED_FOR_READ ? "read (released twice?)" : "write", ST(w),
                    GEN(w), s->gen);
    }
    // [R2] (release) / cancel: X -> FREE with the next generation
    journal(r, s->index);
    set_word(&h->state, WORD((s->gen + 1) & 0x3fffffffu, NM_TABM_FREE));
    set_word(&h->owner, 0);
    q_push(r->fq, r->qmask, &c->fq_tail, s->index);
    if (from == NM_TABM_ALLOCATED_FOR_WRITE)
        cnt_add(&c->n_write, -1);
    cnt_add(&c->in_use, -1);
    commit(r);
    ring_unlock(r);
    signal_ev(&c->ev_free); // [WAKE_F]
    s->data = NULL;
    return NM_OK;
}

nm_status nm_tabm_release(nm_tabm *r, nm_tabm_slot *s) {
    nm_status st = to_free(r, s, NM_TABM_ALLOCATED_FOR_READ, "release");
    if (st == NM_OK) atomic_fetch_add_explicit(&r->ctl->released, 1, memory_order_relaxed);
    return st;
}

nm_status nm_tabm_cancel(nm_tabm *r, nm_tabm_slot *s) {
    nm_status st = to_free(r, s, NM_TABM_ALLOCATED_FOR_WRITE, "cancel");
    // One writer less: readers draining a shut-down ring may be waiting for it.
    if (st == NM_OK && atomic_load(&r->ctl->shutdown)) signal_ev(&r->ctl->ev_ready);
    return st;
}

nm_status nm_tabm_acquire_read(nm_tabm *r, int64_t timeout_ns, nm_tabm_slot *slot) {
    if (!r || !slot) return NM_ERR_INVALID_ARG;
    tabm_ctl *c = r->ctl;
    note_tid(&c->reader_tid);
    uint64_t deadline = 0, t0 = 0;
    bool waited = false, reaped = false, grace = false;
    for (;;) {
        uint32_t seen = atomic_load(&c->ev_ready.word);
        ring_lock(r);
        uint32_t idx = q_peek(r->rq, r->qmask, &c->rq_head, &c->rq_tail);
        if (idx != UINT32_MAX) { // [R1] READY_TO_READ -> ALLOCATED_FOR_READ
            uint32_t w = idx < r->n_slots ? atomic_load_explicit(&r->hdr[idx].state, memory_order_relaxed) : 0;
            if (idx >= r->n_slots || ST(w) != NM_TABM_READY_TO_READ) {
                ring_unlock(r);
                return fail(r, NM_ERR_FORMAT, "tabm: slot %u in the ready queue is in state %u", idx, ST(w));
            }
            journal(r, idx);
            q_pop(&c->rq_head);
            set_word(&r->hdr[idx].state, WORD(GEN(w), NM_TABM_ALLOCATED_FOR_READ));
            set_word(&r->hdr[idx].owner, my_pid());
            commit(r);
            ring_unlock(r);
            uint64_t now = nm_now_ns();
            r->hdr[idx].meta.t_read_ns = now;
            fill_slot(r, idx, GEN(w), slot);
            int b = waited ? hist_bucket(now - t0) : 0;
            atomic_fetch_add_explicit(&c->rh[b], 1, memory_order_relaxed);
            return NM_OK;
        }
        // [R3] Shut down, nothing queued and no writer holds a slot: the end.
        bool end = atomic_load(&c->shutdown) && atomic_load_explicit(&c->n_write, memory_order_relaxed) == 0;
        ring_unlock(r);
        if (end) return NM_ERR_SHUTDOWN;
        if (timeout_ns == 0) {
            // A poller draining a shut-down ring: a dead writer's slot must not keep it waiting.
            if (!reaped && atomic_load(&c->shutdown) && reap(r)) {
                reaped = true;
                continue;
            }
            return NM_ERR_AGAIN;
        }
        if (!waited) {
            waited = true;
            t0 = nm_now_ns();
            deadline = deadline_of(timeout_ns);
            atomic_fetch_add_explicit(&c->empty_waits, 1, memory_order_relaxed);
            if (timeout_ns == NM_TABM_WAIT_PEER && !peer_wait(c, &c->writer_tid, &grace, &deadline))
                return NM_ERR_AGAIN; // the caller is the ring's writer: it cannot write while it waits
        }
        if (!wait_or_reap(r, &c->ev_ready, seen, deadline)) { // [SLEEP_R]
            if (timeout_ns != NM_TABM_WAIT_PEER) return NM_ERR_TIMEOUT;
            if (!peer_wait(c, &c->writer_tid, &grace, &deadline)) return NM_ERR_AGAIN; // no writer came
        }
    }
}

void nm_tabm_shutdown(nm_tabm *r) {
    if (!r) return;
    atomic_store(&r->ctl->shutdown, 1); // [S1]
    signal_ev(&r->ctl->ev_free);         // wake every sleeper, in every process
    signal_ev(&r->ctl->ev_ready);
    if (r->efd >= 0) {
        uint64_t one = 1;
        ssize_t w = write(r->efd, &one, sizeof one);
        (void)w;
    }
    reap(r); // what dead peers hold would keep readers waiting
}

nm_status nm_tabm_check(nm_tabm *r, char *err, size_t err_size) {
    if (!r) return NM_ERR_INVALID_ARG;
    tabm_ctl *c = r->ctl;
    ring_lock(r); // takes it over from a dead owner, undoing its step
    nm_status st = NM_OK;
    uint32_t n = r->n_slots, n_write = 0, in_use = 0;
    uint8_t *seen = calloc(n, 1);
    if (!seen) {
        ring_unlock(r);
        return NM_ERR_NOMEM;
    }
    uint64_t fh = atomic_load(&c->fq_head), ft = atomic_load(&c->fq_tail);
    uint64_t rh = atomic_load(&c->rq_head), rt = atomic_load(&c->rq_tail);
    if (atomic_load(&c->jn.valid)) st = nm_fail(NM_ERR_FORMAT, err, err_size, "journal still valid under the lock");
    for (int q = 0; q < 2 && !st; q++) {
        uint64_t h = q ? rh : fh, t = q ? rt : ft;
        if (t - h > n) st = nm_fail(NM_ERR_FORMAT, err, err_size, "%s queue holds %llu > %u", q ? "ready" : "free",
                                    (unsigned long long)(t - h), n);
        for (uint64_t i = h; i < t && !st; i++) {
            uint32_t idx = atomic_load((q ? r->rq : r->fq) + (i & r->qmask));
            uint32_t want = q ? NM_TABM_READY_TO_READ : NM_TABM_FREE;
            if (idx >= n || seen[idx]++)
                st = nm_fail(NM_ERR_FORMAT, err, err_size, "slot %u twice in the queues (or out of range)", idx);
            else if (ST(atomic_load(&r->hdr[idx].state)) != want)
                st = nm_fail(NM_ERR_FORMAT, err, err_size, "slot %u in the %s queue is in state %u", idx,
                             q ? "ready" : "free", ST(atomic_load(&r->hdr[idx].state)));
        }
    }
    for (uint32_t i = 0; i < n && !st; i++) {
        uint32_t w = atomic_load(&r->hdr[i].state);
        n_write += ST(w) == NM_TABM_ALLOCATED_FOR_WRITE;
        in_use += ST(w) != NM_TABM_FREE;
        bool held = ST(w) == NM_TABM_ALLOCATED_FOR_WRITE || ST(w) == NM_TABM_ALLOCATED_FOR_READ;
        if (held == (seen[i] != 0))
            st = nm_fail(NM_ERR_FORMAT, err, err_size, "slot %u (state %u) is %s", i, ST(w),
                         held ? "held and queued" : "in no queue and held by no one");
        else if (held && !atomic_load(&r->hdr[i].owner))
            st = nm_fail(NM_ERR_FORMAT, err, err_size, "slot %u is held by no process", i);
    }
    if (!st && (n_write != atomic_load(&c->n_write) || in_use != atomic_load(&c->in_use)))
        st = nm_fail(NM_ERR_FORMAT, err, err_size, "counts: %u writing, %u in use; the ring says %u, %u", n_write,
                     in_use, atomic_load(&c->n_write), atomic_load(&c->in_use));
    free(seen);
    ring_unlock(r);
    return st;
}

bool nm_tabm_is_shutdown(const nm_tabm *r) { return r && atomic_load(&r->ctl->shutdown); }

// A mark is one atomic store into a cell that no other mark takes until
// NM_TABM_MAX_CANCELLED more marks are made; readers scan every cell.
nm_status nm_tabm_cancel_request(nm_tabm *r, uint64_t request) {
    if (!r) return NM_ERR_INVALID_ARG;
    if (request == 0) return fail(r, NM_ERR_INVALID_ARG, "tabm: request id 0 means none: it cannot be cancelled");
    if (nm_tabm_request_cancelled(r, request)) return NM_OK;
    tabm_ctl *c = r->ctl;
    uint64_t i = atomic_fetch_add(&c->n_cancel, 1);
    atomic_store(&c->cancelled[i % NM_TABM_MAX_CANCELLED], request);
    return NM_OK;
}

bool nm_tabm_request_cancelled(const nm_tabm *r, uint64_t request) {
    if (!r || request == 0) return false;
    for (uint32_t i = 0; i < NM_TABM_MAX_CANCELLED; i++)
        if (atomic_load_explicit(&r->ctl->cancelled[i], memory_order_acquire) == request) return true;
    return false;
}

nm_tabm_stats nm_tabm_get_stats(const nm_tabm *r) {
    nm_tabm_stats s;
    memset(&s, 0, sizeof s);
    if (!r) return s;
    tabm_ctl *c = r->ctl;
    s.n_slots = r->n_slots;
    s.occupancy = atomic_load(&c->in_use);
    uint64_t t = atomic_load(&c->rq_tail), h = atomic_load(&c->rq_head);
    s.ready = t > h ? (uint32_t)(t - h) : 0;
    s.max_occupancy = atomic_load(&c->max_occ);
    s.reclaimed_write = atomic_load(&c->reclaimed_write);
    s.reclaimed_read = atomic_load(&c->reclaimed_read);
    s.recoveries = atomic_load(&c->recoveries);
    s.cancelled = atomic_load(&c->n_cancel);
    s.published = atomic_load(&c->published);
    s.released = atomic_load(&c->released);
    s.bytes_published = atomic_load(&c->bytes);
    s.full_waits = atomic_load(&c->full_waits);
    s.empty_waits = atomic_load(&c->empty_waits);
    s.seconds = (double)(nm_now_ns() - c->t_create_ns) * 1e-9;
    if (s.seconds > 0) {
        s.slots_per_s = (double)s.published / s.seconds;
        s.bytes_per_s = (double)s.bytes_published / s.seconds;
    }
    for (int i = 0; i < NM_TABM_HIST_BUCKETS; i++) {
        s.write_wait_hist[i] = atomic_load(&c->wh[i]);
        s.read_wait_hist[i] = atomic_load(&c->rh[i]);
    }
    return s;
}
