// umem pool: dma-buf heap / sealed memfd / anonymous shared buffers, fd
// passing, CPU-access brackets. See umem.h.
#include "mem/umem.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/dma-buf.h>
#include <linux/dma-heap.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/fail.h"

#define NM_DEFAULT_HEAP "/dev/dma_heap/system"

struct nm_umem_buf {
    nm_umem *pool;
    nm_umem_buf *prev, *next; // the pool's list of live buffers (under pool->lock)
    void *data;
    size_t size;              // mapped bytes (rounded)
    size_t align;
    int fd;                   // -1 for anon
    nm_umem_kind kind;
    bool held;                // a ring's memory: outlives nm_umem_free (nm_umem_hold)
};

struct nm_umem {
    nm_umem_params params;
    char heap_path[256];
    int heap_fd;              // -1: no heap (absent, or disallowed)
    nm_umem_kind default_kind;
    pthread_mutex_t lock;     // the buffer list, `closed` and the error message
    nm_umem_buf *bufs;
    bool closed;              // nm_umem_free ran; the last held buffer's free frees the pool
    _Atomic uint64_t live, peak, n_live, n_allocs;
    _Atomic uint64_t by_kind[4];
    char err[256];
};

static nm_status fail(nm_umem *p, nm_status st, const char *fmt, ...) {
    if (!p) return st;
    pthread_mutex_lock(&p->lock);
    va_list ap;
    va_start(ap, fmt);
    nm_vfail(st, p->err, sizeof p->err, NULL, fmt, ap);
    va_end(ap);
    pthread_mutex_unlock(&p->lock);
    return st;
}

static bool kind_allowed(const nm_umem_params *pr, nm_umem_kind k) {
    return pr->kinds == 0 || (pr->kinds & (1u << k));
}

nm_umem_params nm_umem_default_params(void) {
    return (nm_umem_params){.dma_heap = NULL, .kinds = 0, .align = 64, .hugepage = false, .limit = 0};
}

static size_t page_size(void) {
    long ps = sysconf(_SC_PAGESIZE);
    return ps > 0 ? (size_t)ps : 4096;
}

nm_status nm_umem_create(const nm_umem_params *params, nm_umem **out, char *err, size_t err_size) {
    if (err && err_size) err[0] = 0;
    if (!out) return NM_ERR_INVALID_ARG;
    *out = NULL;
    nm_umem_params pr = params ? *params : nm_umem_default_params();
    if (pr.align == 0) pr.align = 64;
    if (pr.align < 64 || (pr.align & (pr.align - 1)) || pr.align > (1ull << 30)) {
        if (err) snprintf(err, err_size, "umem: alignment %zu is not a power of two in [64, 1 GiB]", pr.align);
        return NM_ERR_INVALID_ARG;
    }
    if (pr.kinds & ~((1u << NM_UMEM_DMABUF) | (1u << NM_UMEM_MEMFD) | (1u << NM_UMEM_ANON))) {
        if (err) snprintf(err, err_size, "umem: unknown kinds in mask 0x%x", pr.kinds);
        return NM_ERR_INVALID_ARG;
    }
    nm_umem *p = calloc(1, sizeof *p);
    if (!p) return NM_ERR_NOMEM;
    p->params = pr;
    p->heap_fd = -1;
    pthread_mutex_init(&p->lock, NULL);
    snprintf(p->heap_path, sizeof p->heap_path, "%s", pr.dma_heap ? pr.dma_heap : NM_DEFAULT_HEAP);
    p->params.dma_heap = p->heap_path;
    if (p->heap_path[0] && kind_allowed(&pr, NM_UMEM_DMABUF))
        p->heap_fd = open(p->heap_path, O_RDONLY | O_CLOEXEC); // absent heap: memfd below
    if (p->heap_fd >= 0) p->default_kind = NM_UMEM_DMABUF;
    else if (kind_allowed(&pr, NM_UMEM_MEMFD)) p->default_kind = NM_UMEM_MEMFD;
    else if (kind_allowed(&pr, NM_UMEM_ANON)) p->default_kind = NM_UMEM_ANON;
    else {
        if (err) snprintf(err, err_size, "umem: only dma-buf allowed and heap %s cannot be opened: %s",
                          p->heap_path, strerror(errno));
        pthread_mutex_destroy(&p->lock);
        free(p);
        return NM_ERR_UNSUPPORTED;
    }
    *out = p;
    return NM_OK;
}

nm_umem_kind nm_umem_default_kind(const nm_umem *p) { return p ? p->default_kind : 0; }

// The message is copied out under the lock into the calling thread's own
// buffer: another thread's failure cannot change it while the caller reads.
const char *nm_umem_last_error(const nm_umem *p) {
    static _Thread_local char msg[sizeof p->err];
    return p ? nm_err_snapshot(&((nm_umem *)p)->lock, p->err, msg, sizeof msg) : "";
}

void *nm_umem_map_aligned(int fd, size_t size, size_t align) {
    int flags = fd >= 0 ? MAP_SHARED : MAP_SHARED | MAP_ANONYMOUS;
    if (align <= page_size()) return mmap(NULL, size, PROT_READ | PROT_WRITE, flags, fd, 0);
    // Reserve size + align, map at the aligned address inside, trim the rest.
    size_t span = size + align;
    uint8_t *res = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (res == MAP_FAILED) return MAP_FAILED;
    uint8_t *a = (uint8_t *)(((uintptr_t)res + align - 1) & ~(uintptr_t)(align - 1));
    void *m = mmap(a, size, PROT_READ | PROT_WRITE, flags | MAP_FIXED, fd, 0);
    if (m == MAP_FAILED) {
        int e = errno;
        munmap(res, span);
        errno = e;
        return MAP_FAILED;
    }
    if (a > res) munmap(res, (size_t)(a - res));
    size_t tail = (size_t)((res + span) - (a + size));
    if (tail) munmap(a + size, tail);
    return a;
}

void nm_umem_unmap_aligned(void *p, size_t size) {
    if (p && p != MAP_FAILED) munmap(p, size);
}

static void account(nm_umem *p, nm_umem_buf *b, int sign) {
    if (sign > 0) {
        uint64_t now = atomic_fetch_add(&p->live, b->size) + b->size;
        uint64_t pk = atomic_load(&p->peak);
        while (now > pk && !atomic_compare_exchange_weak(&p->peak, &pk, now)) {
        }
        atomic_fetch_add(&p->n_live, 1);
        atomic_fetch_add(&p->n_allocs, 1);
        atomic_fetch_add(&p->by_kind[b->kind], b->size);
        pthread_mutex_lock(&p->lock);
        b->next = p->bufs;
        if (p->bufs) p->bufs->prev = b;
        p->bufs = b;
        pthread_mutex_unlock(&p->lock);
    } else { // the caller holds p->lock
        atomic_fetch_sub(&p->live, b->size);
        atomic_fetch_sub(&p->n_live, 1);
        atomic_fetch_sub(&p->by_kind[b->kind], b->size);
        if (b->prev) b->prev->next = b->next;
        else p->bufs = b->next;
        if (b->next) b->next->prev = b->prev;
    }
}

// Reserves `size` bytes against the pool's limit; false if over.
static bool reserve(nm_umem *p, size_t size) {
    if (!p->params.limit) return true;
    uint64_t cur = atomic_load(&p->live);
    return cur + size <= p->params.limit; // best effort: two racing allocs may pass together
}

static int new_fd(nm_umem *p, nm_umem_kind kind, size_t size, nm_status *st) {
    if (kind == NM_UMEM_DMABUF) {
        struct dma_heap_allocation_data d = {.len = size, .fd_flags = O_RDWR | O_CLOEXEC};
        if (ioctl(p->heap_fd, DMA_HEAP_IOCTL_ALLOC, &d) < 0) {
            *st = fail(p, NM_ERR_NOMEM, "umem: dma-heap %s: alloc of %zu bytes: %s", p->heap_path, size,
                       strerror(errno));
            return -1;
        }
        return (int)d.fd;
    }
    int fd = memfd_create("nanomind-umem", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        *st = fail(p, NM_ERR_IO, "umem: memfd_create: %s", strerror(errno));
        return -1;
    }
    if (ftruncate(fd, (off_t)size) < 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
        *st = fail(p, NM_ERR_NOMEM, "umem: memfd of %zu bytes: %s", size, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

nm_status nm_umem_alloc(nm_umem *p, size_t size, uint32_t flags, nm_umem_buf **out) {
    if (!out) return NM_ERR_INVALID_ARG;
    *out = NULL;
    if (!p) return NM_ERR_INVALID_ARG;
    if (size == 0) return fail(p, NM_ERR_INVALID_ARG, "umem: zero-size allocation");
    if (flags & ~(NM_UMEM_F_FD | NM_UMEM_F_NO_DMABUF | NM_UMEM_F_HUGEPAGE))
        return fail(p, NM_ERR_INVALID_ARG, "umem: unknown flags 0x%x", flags);
    size_t align = p->params.align;
    size_t gran = align > page_size() ? align : page_size(); // mappings are whole pages
    if (size > SIZE_MAX - gran) return fail(p, NM_ERR_RANGE, "umem: size %zu too large", size);
    size_t sz = (size + gran - 1) & ~(gran - 1);
    if (!reserve(p, sz))
        return fail(p, NM_ERR_NOMEM, "umem: %zu bytes would pass the pool limit of %llu (live %llu)", sz,
                    (unsigned long long)p->params.limit, (unsigned long long)atomic_load(&p->live));

    // Candidate kinds in order of preference.
    nm_umem_kind order[3];
    int n = 0;
    if (p->heap_fd >= 0 && !(flags & NM_UMEM_F_NO_DMABUF)) order[n++] = NM_UMEM_DMABUF;
    if (kind_allowed(&p->params, NM_UMEM_MEMFD)) order[n++] = NM_UMEM_MEMFD;
    if (kind_allowed(&p->params, NM_UMEM_ANON) && !(flags & NM_UMEM_F_FD)) order[n++] = NM_UMEM_ANON;
    if (n == 0) return fail(p, NM_ERR_UNSUPPORTED, "umem: no allowed buffer kind satisfies flags 0x%x", flags);

    nm_status st = NM_ERR_NOMEM;
    for (int i = 0; i < n; i++) {
        int fd = -1;
        if (order[i] != NM_UMEM_ANON && (fd = new_fd(p, order[i], sz, &st)) < 0) continue;
        void *m = nm_umem_map_aligned(fd, sz, align);
        if (m == MAP_FAILED) {
            st = fail(p, NM_ERR_NOMEM, "umem: mmap of %zu bytes: %s", sz, strerror(errno));
            if (fd >= 0) close(fd);
            continue;
        }
        if (p->params.hugepage || (flags & NM_UMEM_F_HUGEPAGE))
            madvise(m, sz, MADV_HUGEPAGE); // a hint: EINVAL without THP support is fine
        nm_umem_buf *b = calloc(1, sizeof *b);
        if (!b) {
            nm_umem_unmap_aligned(m, sz);
            if (fd >= 0) close(fd);
            return fail(p, NM_ERR_NOMEM, "umem: out of memory");
        }
        *b = (nm_umem_buf){.pool = p, .data = m, .size = sz, .align = align, .fd = fd, .kind = order[i]};
        account(p, b, +1);
        *out = b;
        return NM_OK;
    }
    return st;
}

nm_status nm_umem_import(nm_umem *p, int fd, size_t size, nm_umem_buf **out) {
    if (!out) return NM_ERR_INVALID_ARG;
    *out = NULL;
    if (!p || fd < 0) return fail(p, NM_ERR_INVALID_ARG, "umem: import of fd %d", fd);
    struct stat stt;
    if (fstat(fd, &stt) < 0) return fail(p, NM_ERR_IO, "umem: import: fstat fd %d: %s", fd, strerror(errno));
    // dma-bufs report size 0 from fstat on older kernels; then trust `size`.
    size_t fsz = (size_t)stt.st_size;
    if (size == 0) size = fsz;
    if (size == 0) return fail(p, NM_ERR_INVALID_ARG, "umem: import: fd %d has no size; pass one", fd);
    if (fsz && size > fsz)
        return fail(p, NM_ERR_RANGE, "umem: import: %zu bytes asked, fd %d holds %zu", size, fd, fsz);
    int seals = fcntl(fd, F_GET_SEALS);
    nm_umem_kind kind = seals >= 0 ? NM_UMEM_MEMFD : NM_UMEM_DMABUF;
    int dfd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (dfd < 0) return fail(p, NM_ERR_IO, "umem: import: dup: %s", strerror(errno));
    void *m = nm_umem_map_aligned(dfd, size, p->params.align);
    if (m == MAP_FAILED) {
        close(dfd);
        return fail(p, NM_ERR_IO, "umem: import: mmap of %zu bytes: %s", size, strerror(errno));
    }
    nm_umem_buf *b = calloc(1, sizeof *b);
    if (!b) {
        munmap(m, size);
        close(dfd);
        return fail(p, NM_ERR_NOMEM, "umem: out of memory");
    }
    *b = (nm_umem_buf){.pool = p, .data = m, .size = size, .align = p->params.align, .fd = dfd, .kind = kind};
    account(p, b, +1);
    *out = b;
    return NM_OK;
}

static void buf_release(nm_umem_buf *b) {
    nm_umem_unmap_aligned(b->data, b->size);
    if (b->fd >= 0) close(b->fd);
    free(b);
}

static void pool_destroy(nm_umem *p) {
    if (p->heap_fd >= 0) close(p->heap_fd);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

void nm_umem_hold(nm_umem_buf *b) {
    pthread_mutex_lock(&b->pool->lock);
    b->held = true;
    pthread_mutex_unlock(&b->pool->lock);
}

void nm_umem_buf_free(nm_umem_buf *b) {
    if (!b) return;
    nm_umem *p = b->pool;
    pthread_mutex_lock(&p->lock);
    account(p, b, -1);
    const bool last = p->closed && !p->bufs; // the pool was freed while a ring held this
    pthread_mutex_unlock(&p->lock);
    buf_release(b);
    if (last) pool_destroy(p);
}

// Frees the buffers the caller allocated; those a ring holds (its memory) stay
// mapped, and the pool with them, until the ring frees them: freeing the pool
// before a ring made in it is allowed.
void nm_umem_free(nm_umem *p) {
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    p->closed = true;
    nm_umem_buf *dead = NULL;
    for (nm_umem_buf *b = p->bufs, *next; b; b = next) {
        next = b->next;
        if (b->held) continue;
        account(p, b, -1);
        b->next = dead;
        dead = b;
    }
    const bool empty = !p->bufs;
    pthread_mutex_unlock(&p->lock);
    for (nm_umem_buf *b = dead, *next; b; b = next) {
        next = b->next;
        buf_release(b);
    }
    if (empty) pool_destroy(p);
}

void *nm_umem_buf_data(const nm_umem_buf *b) { return b ? b->data : NULL; }
size_t nm_umem_buf_size(const nm_umem_buf *b) { return b ? b->size : 0; }
nm_umem_kind nm_umem_buf_kind(const nm_umem_buf *b) { return b ? b->kind : 0; }
int nm_umem_buf_fd(const nm_umem_buf *b) { return b ? b->fd : -1; }

static nm_status sync_cpu(nm_umem_buf *b, bool write, uint64_t edge) {
    if (!b) return NM_ERR_INVALID_ARG;
    if (b->kind != NM_UMEM_DMABUF) return NM_OK;
    struct dma_buf_sync s = {.flags = edge | (write ? DMA_BUF_SYNC_RW : DMA_BUF_SYNC_READ)};
    int r;
    do r = ioctl(b->fd, DMA_BUF_IOCTL_SYNC, &s);
    while (r < 0 && (errno == EINTR || errno == EAGAIN));
    if (r < 0) return fail(b->pool, NM_ERR_IO, "umem: DMA_BUF_IOCTL_SYNC: %s", strerror(errno));
    return NM_OK;
}

nm_status nm_umem_begin_cpu(nm_umem_buf *b, bool write) { return sync_cpu(b, write, DMA_BUF_SYNC_START); }
nm_status nm_umem_end_cpu(nm_umem_buf *b, bool write) { return sync_cpu(b, write, DMA_BUF_SYNC_END); }

nm_umem_stats nm_umem_get_stats(const nm_umem *p) {
    nm_umem_stats s = {0};
    if (!p) return s;
    nm_umem *q = (nm_umem *)p; // atomics are read-only here
    s.live_bytes = atomic_load(&q->live);
    s.peak_bytes = atomic_load(&q->peak);
    s.n_live = atomic_load(&q->n_live);
    s.n_allocs = atomic_load(&q->n_allocs);
    for (int i = 0; i < 4; i++) s.bytes_by_kind[i] = atomic_load(&q->by_kind[i]);
    return s;
}

nm_status nm_fd_send(int sock, int fd, const void *msg, size_t n_msg) {
    char dummy = 0;
    struct iovec iov = {.iov_base = n_msg ? (void *)msg : &dummy, .iov_len = n_msg ? n_msg : 1};
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } u;
    memset(&u, 0, sizeof u);
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
    ssize_t r;
    do r = sendmsg(sock, &mh, MSG_NOSIGNAL);
    while (r < 0 && errno == EINTR);
    return r < 0 ? NM_ERR_IO : NM_OK;
}

nm_status nm_fd_recv(int sock, int *fd, void *msg, size_t msg_size, size_t *n_msg) {
    if (!fd) return NM_ERR_INVALID_ARG;
    *fd = -1;
    char dummy;
    struct iovec iov = {.iov_base = msg_size ? msg : &dummy, .iov_len = msg_size ? msg_size : 1};
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } u;
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
    ssize_t r;
    do r = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
    while (r < 0 && errno == EINTR);
    if (r <= 0) return NM_ERR_IO;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len == CMSG_LEN(sizeof(int)))
            memcpy(fd, CMSG_DATA(c), sizeof *fd);
    if (n_msg) *n_msg = msg_size ? (size_t)r : 0;
    if (*fd < 0) return NM_ERR_FORMAT; // a message without an fd
    if (mh.msg_flags & MSG_CTRUNC) return NM_ERR_FORMAT;
    return NM_OK;
}
