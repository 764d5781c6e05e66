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
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "mem/umem.h"
#include "core/fail.h"

#define TABM_MAGIC "NMTABM\0"
#define TABM_VERSION 2u
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

typedef struct qcell {
    _Atomic uint64_t seq; // Vyukov: == pos: empty for push pos; == pos+1: full for pop pos
    uint32_t val;         // slot index
    uint32_t pad;
} qcell;

// A futex word bumped on every event, and how many wait on it (a wake costs a
// syscall only when someone sleeps; see wait_ev/signal_ev for the ordering).
typedef struct tabm_event {
    alignas(CL) _Atomic uint32_t word;
    _Atomic uint32_t sleepers;
} tabm_event;

typedef struct tabm_ctl {
    char magic[8];
    uint32_t version, ctl_size, hdr_size, n_slots, qcap, pad0;
    uint64_t max_payload, stride;
    uint64_t hdr_off, freeq_off, readyq_off, payload_off, total_size;
    uint64_t t_create_ns;

    alignas(CL) _Atomic uint32_t shutdown;
    _Atomic uint32_t n_pollers; // handles that asked for the eventfd
    _Atomic uint32_t writers;   // slots held for write + acquire_write calls in their take step
    _Atomic uint32_t in_use;    // slots not FREE
    tabm_event ev_free;         // a slot went back to FREE (or shutdown)
    tabm_event ev_ready;        // a slot was published, a writer left (or shutdown)
    alignas(CL) _Atomic uint64_t fq_head;
    alignas(CL) _Atomic uint64_t fq_tail;
    alignas(CL) _Atomic uint64_t rq_head;
    alignas(CL) _Atomic uint64_t rq_tail;

    alignas(CL) _Atomic uint64_t published, released, bytes, full_waits, empty_waits;
    _Atomic uint32_t max_occ;
    _Atomic uint64_t wh[NM_TABM_HIST_BUCKETS], rh[NM_TABM_HIST_BUCKETS];
} tabm_ctl;

typedef struct tabm_hdr {
    alignas(CL) _Atomic uint32_t state; // gen << 2 | state
    uint32_t pad;
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
    qcell *fq, *rq;
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
    L->readyq_off = round_up(L->freeq_off + L->qcap * sizeof(qcell), CL);
    // Page-aligned slots once a payload is a page or more: a GPU driver can
    // import each slot as a host pointer.
    L->stride = max_payload >= 4096 ? round_up(max_payload, 4096) : round_up(max_payload, CL);
    L->payload_off = round_up(L->readyq_off + L->qcap * sizeof(qcell), 4096);
    L->total = round_up(L->payload_off + (uint64_t)n_slots * L->stride, 4096);
}

static nm_status fail(nm_tabm *r, nm_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&r->err_lock);
    vsnprintf(r->err, sizeof r->err, fmt, ap);
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
static void futex_wake_all(_Atomic uint32_t *a) {
    syscall(SYS_futex, (uint32_t *)a, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

// [WAKE_*] Waker: bump the word, then read sleepers; waiter: sleepers++, then
// re-read the word (wait_ev). Both seq_cst, so either the waiter sees the new
// word or the waker sees the sleeper; FUTEX_WAIT re-checks the word in the kernel.
static void signal_ev(tabm_event *e) {
    atomic_fetch_add(&e->word, 1);
    if (atomic_load(&e->sleepers) > 0) futex_wake_all(&e->word);
}

// [SLEEP_*] Waits until e->word != seen, or the deadline (0: none). false on timeout.
static bool wait_ev(tabm_event *e, uint32_t seen, uint64_t deadline) {
    for (int i = 0; i < SPIN_ITERS; i++) {
        if (atomic_load_explicit(&e->word, memory_order_acquire) != seen) return true;
        CPU_RELAX();
    }
    bool ok = true;
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

// ---- bounded MPMC queue of slot indices (Vyukov) ------------------------------------
// Never full by construction (see tabm.h). *ticket (may be NULL) gets the
// position, written to the slot's header before the cell becomes visible.
static void q_push(qcell *q, uint64_t mask, _Atomic uint64_t *tail, uint32_t val, tabm_hdr *hdr) {
    uint64_t pos = atomic_load_explicit(tail, memory_order_relaxed);
    qcell *c;
    for (;;) {
        c = &q[pos & mask];
        uint64_t seq = atomic_load_explicit(&c->seq, memory_order_acquire);
        int64_t dif = (int64_t)(seq - pos);
        if (dif == 0) {
            if (atomic_compare_exchange_weak_explicit(tail, &pos, pos + 1, memory_order_relaxed,
                                                      memory_order_relaxed))
                break;
        } else {
            // dif < 0 would mean full: impossible, there are only n_slots indices.
            pos = atomic_load_explicit(tail, memory_order_relaxed);
        }
    }
    if (hdr) hdr[val].meta.seq = pos; // publish order (ready queue only)
    c->val = val;
    atomic_store_explicit(&c->seq, pos + 1, memory_order_release);
}

static bool q_pop(qcell *q, uint64_t mask, _Atomic uint64_t *head, uint32_t *val) {
    uint64_t pos = atomic_load_explicit(head, memory_order_relaxed);
    qcell *c;
    for (;;) {
        c = &q[pos & mask];
        uint64_t seq = atomic_load_explicit(&c->seq, memory_order_acquire);
        int64_t dif = (int64_t)(seq - (pos + 1));
        if (dif == 0) {
            if (atomic_compare_exchange_weak_explicit(head, &pos, pos + 1, memory_order_relaxed,
                                                      memory_order_relaxed))
                break;
        } else if (dif < 0) {
            return false; // empty (or the next push has its ticket but not yet its value)
        } else {
            pos = atomic_load_explicit(head, memory_order_relaxed);
        }
    }
    *val = c->val;
    atomic_store_explicit(&c->seq, pos + mask + 1, memory_order_release);
    return true;
}

// ---- create / attach ------------------------------------------------------------------
static void bind(nm_tabm *r, const layout *L) {
    r->ctl = (tabm_ctl *)r->base;
    r->hdr = (tabm_hdr *)(r->base + L->hdr_off);
    r->fq = (qcell *)(r->base + L->freeq_off);
    r->rq = (qcell *)(r->base + L->readyq_off);
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
    for (uint64_t i = 0; i < L.qcap; i++) {
        atomic_init(&r->fq[i].seq, i);
        atomic_init(&r->rq[i].seq, i);
    }
    for (uint32_t i = 0; i < n_slots; i++) q_push(r->fq, r->qmask, &c->fq_tail, i, NULL);
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

// A writer stops counting itself in `writers`; once the ring is shut down,
// readers waiting for the last writer must hear of it.
static void writer_leave(nm_tabm *r) {
    atomic_fetch_sub(&r->ctl->writers, 1); // [W3]
    if (atomic_load(&r->ctl->shutdown)) signal_ev(&r->ctl->ev_ready);
}

nm_status nm_tabm_acquire_write(nm_tabm *r, uint32_t producer, int64_t timeout_ns, nm_tabm_slot *slot) {
    if (!r || !slot) return NM_ERR_INVALID_ARG;
    tabm_ctl *c = r->ctl;
    uint64_t deadline = 0, t0 = 0;
    bool waited = false;
    for (;;) {
        uint32_t seen = atomic_load(&c->ev_free.word);
        atomic_fetch_add(&c->writers, 1); // [W0] count ourselves before looking at shutdown
        if (atomic_load(&c->shutdown)) {
            writer_leave(r);
            return NM_ERR_SHUTDOWN;
        }
        uint32_t idx;
        if (q_pop(r->fq, r->qmask, &c->fq_head, &idx)) { // [W1] take a FREE slot
            tabm_hdr *h = &r->hdr[idx];
            uint32_t w = atomic_load_explicit(&h->state, memory_order_relaxed);
            if (ST(w) != NM_TABM_FREE) { // only a corrupted ring (a peer writing headers) gets here
                writer_leave(r);
                return fail(r, NM_ERR_FORMAT, "tabm: slot %u in the free queue is in state %u", idx, ST(w));
            }
            atomic_store_explicit(&h->state, WORD(GEN(w), NM_TABM_ALLOCATED_FOR_WRITE), memory_order_relaxed);
            uint64_t now = nm_now_ns();
            h->meta = (nm_tabm_meta){.producer = producer, .t_acquire_ns = now};
            fill_slot(r, idx, GEN(w), slot);
            uint32_t occ = atomic_fetch_add_explicit(&c->in_use, 1, memory_order_relaxed) + 1;
            uint32_t mx = atomic_load_explicit(&c->max_occ, memory_order_relaxed);
            while (occ > mx && !atomic_compare_exchange_weak_explicit(&c->max_occ, &mx, occ, memory_order_relaxed,
                                                                      memory_order_relaxed)) {
            }
            int b = waited ? hist_bucket(now - t0) : 0;
            atomic_fetch_add_explicit(&c->wh[b], 1, memory_order_relaxed);
            return NM_OK; // still counted in `writers` until publish or cancel
        }
        writer_leave(r);
        if (timeout_ns == 0) return NM_ERR_AGAIN;
        if (!waited) {
            waited = true;
            t0 = nm_now_ns();
            deadline = deadline_of(timeout_ns);
            atomic_fetch_add_explicit(&c->full_waits, 1, memory_order_relaxed); // backpressure
        }
        if (!wait_ev(&c->ev_free, seen, deadline)) return NM_ERR_TIMEOUT; // [SLEEP_F]
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
    if (m->kind > NM_TABM_IMAGE) return fail(r, NM_ERR_INVALID_ARG, "tabm: unknown payload kind %u", m->kind);
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
    // [W2] ALLOCATED_FOR_WRITE -> READY_TO_READ, then into the ready queue
    // (the ticket taken there is the publish order, m->seq).
    if (!atomic_compare_exchange_strong_explicit(&h->state, &expect, WORD(s->gen, NM_TABM_READY_TO_READ),
                                                 memory_order_release, memory_order_relaxed))
        return fail(r, NM_ERR_STATE, "tabm: slot %u changed state during publish (published twice?)", s->index);
    uint64_t size = m->size; // the slot is the readers' once pushed
    q_push(r->rq, r->qmask, &r->ctl->rq_tail, s->index, r->hdr);
    atomic_fetch_add_explicit(&r->ctl->published, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&r->ctl->bytes, size, memory_order_relaxed);
    atomic_fetch_sub(&r->ctl->writers, 1); // [W3]
    signal_ev(&r->ctl->ev_ready);          // [WAKE_R]
    poke_pollers(r);
    s->data = NULL; // the writer's handle is spent
    return NM_OK;
}

// Returns slot idx (generation gen, in state `from`) to FREE.
static nm_status to_free(nm_tabm *r, nm_tabm_slot *s, uint32_t from, const char *what) {
    nm_status st = check_handle(r, s, what);
    if (st) return st;
    tabm_hdr *h = &r->hdr[s->index];
    uint32_t expect = WORD(s->gen, from);
    // [R2] (release) / cancel: X -> FREE with the next generation
    if (!atomic_compare_exchange_strong_explicit(&h->state, &expect, WORD((s->gen + 1) & 0x3fffffffu, NM_TABM_FREE),
                                                 memory_order_release, memory_order_relaxed))
        return fail(r, NM_ERR_STATE, "tabm: %s of slot %u, which is not held for %s (state %u gen %u, handle gen %u)",
                    what, s->index, from == NM_TABM_ALLOCATED_FOR_READ ? "read (released twice?)" : "write",
                    ST(expect), GEN(expect), s->gen);
    atomic_fetch_sub_explicit(&r->ctl->in_use, 1, memory_order_relaxed);
    q_push(r->fq, r->qmask, &r->ctl->fq_tail, s->index, NULL);
    signal_ev(&r->ctl->ev_free); // [WAKE_F]
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
    if (st == NM_OK) writer_leave(r);
    return st;
}

nm_status nm_tabm_acquire_read(nm_tabm *r, int64_t timeout_ns, nm_tabm_slot *slot) {
    if (!r || !slot) return NM_ERR_INVALID_ARG;
    tabm_ctl *c = r->ctl;
    uint64_t deadline = 0, t0 = 0;
    bool waited = false;
    for (;;) {
        uint32_t seen = atomic_load(&c->ev_ready.word);
        uint32_t idx;
        bool got = q_pop(r->rq, r->qmask, &c->rq_head, &idx); // [R1]
        if (!got && atomic_load(&c->shutdown) && atomic_load(&c->writers) == 0) {
            // [R3] Shut down and no writer holds a slot: what is still queued
            // was pushed before the last writer left; one more look, then stop.
            got = q_pop(r->rq, r->qmask, &c->rq_head, &idx);
            if (!got) return NM_ERR_SHUTDOWN;
        }
        if (got) {
            // [R1] READY_TO_READ -> ALLOCATED_FOR_READ
            tabm_hdr *h = &r->hdr[idx];
            uint32_t w = atomic_load_explicit(&h->state, memory_order_relaxed);
            if (ST(w) != NM_TABM_READY_TO_READ)
                return fail(r, NM_ERR_FORMAT, "tabm: slot %u in the ready queue is in state %u", idx, ST(w));
            atomic_store_explicit(&h->state, WORD(GEN(w), NM_TABM_ALLOCATED_FOR_READ), memory_order_relaxed);
            uint64_t now = nm_now_ns();
            h->meta.t_read_ns = now;
            fill_slot(r, idx, GEN(w), slot);
            int b = waited ? hist_bucket(now - t0) : 0;
            atomic_fetch_add_explicit(&c->rh[b], 1, memory_order_relaxed);
            return NM_OK;
        }
        if (timeout_ns == 0) return NM_ERR_AGAIN;
        if (!waited) {
            waited = true;
            t0 = nm_now_ns();
            deadline = deadline_of(timeout_ns);
            atomic_fetch_add_explicit(&c->empty_waits, 1, memory_order_relaxed);
        }
        if (!wait_ev(&c->ev_ready, seen, deadline)) return NM_ERR_TIMEOUT; // [SLEEP_R]
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
}

bool nm_tabm_is_shutdown(const nm_tabm *r) { return r && atomic_load(&r->ctl->shutdown); }

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
