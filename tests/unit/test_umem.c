// umem pool: allocation paths (dma-buf where present, memfd, anon), alignment,
// sealing, accounting, limits, and an fd passed over SCM_RIGHTS to a forked
// child that maps the buffer and writes into it.
#include <fcntl.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nmtest.h"
#include "nanomind.h"
#include "mem/umem.h"

static nm_umem *pool_of(uint32_t kinds, size_t align) {
    nm_umem_params p = nm_umem_default_params();
    p.kinds = kinds;
    p.align = align;
    nm_umem *u = NULL;
    char err[256];
    if (nm_umem_create(&p, &u, err, sizeof err) != NM_OK) fprintf(stderr, "  %s\n", err);
    return u;
}

NM_TEST(umem_memfd_sealed_and_accounted) {
    nm_umem *u = pool_of(1u << NM_UMEM_MEMFD, 64);
    NM_CHECK(u != NULL);
    if (!u) return;
    NM_CHECK(nm_umem_default_kind(u) == NM_UMEM_MEMFD);
    nm_umem_buf *b = NULL;
    NM_CHECK(nm_umem_alloc(u, 1000, 0, &b) == NM_OK);
    NM_CHECK(nm_umem_buf_kind(b) == NM_UMEM_MEMFD);
    NM_CHECK(nm_umem_buf_size(b) == 4096); // whole pages
    NM_CHECK(((uintptr_t)nm_umem_buf_data(b) & 4095) == 0);
    int fd = nm_umem_buf_fd(b);
    NM_CHECK(fd >= 0);
    int seals = fcntl(fd, F_GET_SEALS);
    NM_CHECK(seals >= 0 && (seals & F_SEAL_SHRINK) && (seals & F_SEAL_GROW));
    NM_CHECK(ftruncate(fd, 100) < 0); // a peer cannot shrink it under us
    unsigned char *d = nm_umem_buf_data(b);
    NM_CHECK(d[0] == 0 && d[4095] == 0); // zeroed
    memset(d, 0xab, 4096);
    NM_CHECK(nm_umem_begin_cpu(b, true) == NM_OK && nm_umem_end_cpu(b, true) == NM_OK); // no-op
    nm_umem_stats s = nm_umem_get_stats(u);
    NM_CHECK(s.live_bytes == 4096 && s.n_live == 1 && s.bytes_by_kind[NM_UMEM_MEMFD] == 4096);
    nm_umem_buf *b2 = NULL;
    NM_CHECK(nm_umem_alloc(u, 5000, NM_UMEM_F_HUGEPAGE, &b2) == NM_OK);
    s = nm_umem_get_stats(u);
    NM_CHECK(s.live_bytes == 4096 + 8192 && s.peak_bytes == 4096 + 8192 && s.n_allocs == 2);
    nm_umem_buf_free(b);
    s = nm_umem_get_stats(u);
    NM_CHECK(s.live_bytes == 8192 && s.peak_bytes == 12288 && s.n_live == 1);
    nm_umem_free(u); // frees b2 too (ASan checks the leak)
}

NM_TEST(umem_anon_fallback_and_fd_flag) {
    nm_umem *u = pool_of(1u << NM_UMEM_ANON, 128);
    NM_CHECK(u && nm_umem_default_kind(u) == NM_UMEM_ANON);
    if (!u) return;
    nm_umem_buf *b = NULL;
    NM_CHECK(nm_umem_alloc(u, 64, 0, &b) == NM_OK);
    NM_CHECK(nm_umem_buf_kind(b) == NM_UMEM_ANON && nm_umem_buf_fd(b) == -1);
    NM_CHECK(((uintptr_t)nm_umem_buf_data(b) & 127) == 0);
    nm_umem_buf_free(b);
    // Exportable memory was asked for, and only anon is allowed: a status, not a crash.
    nm_umem_buf *c = (nm_umem_buf *)1;
    NM_CHECK(nm_umem_alloc(u, 64, NM_UMEM_F_FD, &c) == NM_ERR_UNSUPPORTED && c == NULL);
    NM_CHECK(strstr(nm_umem_last_error(u), "flags") != NULL);
    nm_umem_free(u);
}

NM_TEST(umem_default_pool_prefers_dmabuf_then_memfd) {
    nm_umem *u = NULL;
    NM_CHECK(nm_umem_create(NULL, &u, NULL, 0) == NM_OK);
    if (!u) return;
    bool heap = access("/dev/dma_heap/system", R_OK) == 0;
    NM_CHECK(nm_umem_default_kind(u) == (heap ? NM_UMEM_DMABUF : NM_UMEM_MEMFD));
    nm_umem_buf *b = NULL;
    NM_CHECK(nm_umem_alloc(u, 3 * 4096, 0, &b) == NM_OK);
    if (b) {
        memset(nm_umem_buf_data(b), 1, 3 * 4096);
        NM_CHECK(nm_umem_begin_cpu(b, false) == NM_OK);
        NM_CHECK(nm_umem_end_cpu(b, false) == NM_OK);
    }
    if (!heap) fprintf(stderr, "  (no /dev/dma_heap/system here: dma-buf path not exercised)\n");
    nm_umem_buf_free(b);
    nm_umem_free(u);
}

NM_TEST(umem_missing_heap_falls_back_or_fails_cleanly) {
    nm_umem_params p = nm_umem_default_params();
    p.dma_heap = "/nonexistent/dma_heap/x";
    nm_umem *u = NULL;
    NM_CHECK(nm_umem_create(&p, &u, NULL, 0) == NM_OK && nm_umem_default_kind(u) == NM_UMEM_MEMFD);
    nm_umem_free(u);
    p.kinds = 1u << NM_UMEM_DMABUF; // only dma-buf, and no heap
    char err[256];
    u = (nm_umem *)1;
    NM_CHECK(nm_umem_create(&p, &u, err, sizeof err) == NM_ERR_UNSUPPORTED && u == NULL);
    NM_CHECK(strstr(err, "/nonexistent/dma_heap/x") != NULL);
}

NM_TEST(umem_bad_params_and_limit) {
    nm_umem_params p = nm_umem_default_params();
    nm_umem *u = NULL;
    p.align = 96;
    NM_CHECK(nm_umem_create(&p, &u, NULL, 0) == NM_ERR_INVALID_ARG && !u);
    p = nm_umem_default_params();
    p.limit = 8192;
    NM_CHECK(nm_umem_create(&p, &u, NULL, 0) == NM_OK);
    nm_umem_buf *a = NULL, *b = NULL;
    NM_CHECK(nm_umem_alloc(u, 0, 0, &a) == NM_ERR_INVALID_ARG);
    NM_CHECK(nm_umem_alloc(u, 8192, 0, &a) == NM_OK);
    NM_CHECK(nm_umem_alloc(u, 1, 0, &b) == NM_ERR_NOMEM && !b);
    NM_CHECK(strstr(nm_umem_last_error(u), "limit") != NULL);
    NM_CHECK(nm_umem_alloc(u, 1, 0x100, &b) == NM_ERR_INVALID_ARG);
    nm_umem_buf_free(a);
    NM_CHECK(nm_umem_alloc(u, 1, 0, &b) == NM_OK);
    nm_umem_buf_free(b);
    nm_umem_free(u);
    nm_umem_free(NULL);
    nm_umem_buf_free(NULL);
}

NM_TEST(umem_large_alignment) {
    nm_umem *u = pool_of(0, 2u << 20); // 2 MiB: hugepage-sized
    NM_CHECK(u != NULL);
    if (!u) return;
    nm_umem_buf *b = NULL, *c = NULL;
    NM_CHECK(nm_umem_alloc(u, 100, NM_UMEM_F_HUGEPAGE, &b) == NM_OK);
    NM_CHECK(nm_umem_alloc(u, 100, NM_UMEM_F_HUGEPAGE, &c) == NM_OK);
    NM_CHECK(b && ((uintptr_t)nm_umem_buf_data(b) & ((2u << 20) - 1)) == 0);
    NM_CHECK(c && ((uintptr_t)nm_umem_buf_data(c) & ((2u << 20) - 1)) == 0);
    NM_CHECK(nm_umem_buf_size(b) == (2u << 20));
    if (b) memset(nm_umem_buf_data(b), 7, nm_umem_buf_size(b));
    nm_umem_free(u);
}

// The parent allocates, sends the fd over a socketpair; the child imports it
// into a pool of its own, checks the parent's bytes and writes its answer.
NM_TEST(umem_fd_passing_to_child) {
    nm_umem *u = pool_of(0, 64);
    NM_CHECK(u != NULL);
    if (!u) return;
    nm_umem_buf *b = NULL;
    NM_CHECK(nm_umem_alloc(u, 1 << 16, NM_UMEM_F_FD, &b) == NM_OK);
    if (!b) return;
    uint32_t *w = nm_umem_buf_data(b);
    for (int i = 0; i < (1 << 14); i++) w[i] = (uint32_t)i * 2654435761u;
    int sv[2];
    NM_CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        close(sv[0]);
        int fd = -1;
        char msg[16];
        size_t n = 0;
        int code = 0;
        if (nm_fd_recv(sv[1], &fd, msg, sizeof msg, &n) != NM_OK || n != 4 || memcmp(msg, "umem", 4)) _exit(2);
        nm_umem *cu = NULL;
        nm_umem_buf *cb = NULL;
        if (nm_umem_create(NULL, &cu, NULL, 0) != NM_OK || nm_umem_import(cu, fd, 0, &cb) != NM_OK) _exit(3);
        close(fd);
        uint32_t *cw = nm_umem_buf_data(cb);
        nm_umem_begin_cpu(cb, true);
        for (int i = 0; i < (1 << 14); i++) {
            if (cw[i] != (uint32_t)i * 2654435761u) code = 4;
            cw[i] = ~cw[i];
        }
        nm_umem_end_cpu(cb, true);
        if (nm_umem_get_stats(cu).live_bytes != (1 << 16)) code = 5;
        nm_umem_free(cu);
        _exit(code);
    }
    close(sv[1]);
    NM_CHECK(nm_fd_send(sv[0], nm_umem_buf_fd(b), "umem", 4) == NM_OK);
    int status = 0;
    waitpid(pid, &status, 0);
    NM_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (WIFEXITED(status) && WEXITSTATUS(status)) fprintf(stderr, "  child exit %d\n", WEXITSTATUS(status));
    int bad = 0;
    for (int i = 0; i < (1 << 14); i++) bad += w[i] != ~((uint32_t)i * 2654435761u);
    NM_CHECK(bad == 0); // the child's writes landed in our mapping: same pages
    close(sv[0]);
    nm_umem_free(u);
}

NM_TEST(umem_import_errors) {
    nm_umem *u = NULL;
    NM_CHECK(nm_umem_create(NULL, &u, NULL, 0) == NM_OK);
    nm_umem_buf *b = NULL;
    NM_CHECK(nm_umem_import(u, -1, 0, &b) == NM_ERR_INVALID_ARG && !b);
    int fd = memfd_create("x", 0);
    NM_CHECK(nm_umem_import(u, fd, 0, &b) == NM_ERR_INVALID_ARG); // empty: no size
    NM_CHECK(ftruncate(fd, 4096) == 0);
    NM_CHECK(nm_umem_import(u, fd, 8192, &b) == NM_ERR_RANGE);
    NM_CHECK(nm_umem_import(u, fd, 0, &b) == NM_OK && nm_umem_buf_size(b) == 4096);
    close(fd);
    nm_umem_free(u);
}

NM_TEST_MAIN()
