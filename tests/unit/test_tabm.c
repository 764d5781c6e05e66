// TABM ring, one thread: the slot protocol, publish order, error cases
// (release twice, publish without acquire, payload too big, stale handles),
// backpressure and timeouts, shutdown semantics, the eventfd, stats, attach
// validation.
#include <poll.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nmtest.h"
#include "nanomind.h"
#include "tabm/tabm.h"

static nm_tabm *ring(uint32_t n, size_t max) {
    nm_tabm *r = NULL;
    char err[256];
    if (nm_tabm_create(NULL, n, max, &r, err, sizeof err) != NM_OK) fprintf(stderr, "  %s\n", err);
    return r;
}

NM_TEST(tabm_protocol_single_thread) {
    nm_tabm *r = ring(4, 256);
    NM_CHECK(r != NULL);
    if (!r) return;
    NM_CHECK(nm_tabm_n_slots(r) == 4 && nm_tabm_max_payload(r) == 256);
    nm_tabm_slot w, rd;
    NM_CHECK(nm_tabm_acquire_read(r, 0, &rd) == NM_ERR_AGAIN);
    // Write three slots, publish them out of acquire order: reads follow publish order.
    nm_tabm_slot ws[3];
    for (int i = 0; i < 3; i++) {
        NM_CHECK(nm_tabm_acquire_write(r, 7, 0, &ws[i]) == NM_OK);
        NM_CHECK(nm_tabm_slot_state(r, ws[i].index) == NM_TABM_ALLOCATED_FOR_WRITE);
        NM_CHECK(ws[i].capacity == 256 && ((uintptr_t)ws[i].data & 127) == 0);
        int32_t *tok = ws[i].data;
        for (int k = 0; k < 5; k++) tok[k] = i * 100 + k;
        ws[i].meta->kind = NM_TABM_TOKENS;
        ws[i].meta->ndim = 1;
        ws[i].meta->shape[0] = 5;
        ws[i].meta->size = 20;
        ws[i].meta->user = (uint64_t)i;
    }
    uint32_t idx2 = ws[2].index;
    NM_CHECK(nm_tabm_publish(r, &ws[2]) == NM_OK);
    NM_CHECK(nm_tabm_slot_state(r, idx2) == NM_TABM_READY_TO_READ);
    NM_CHECK(nm_tabm_publish(r, &ws[0]) == NM_OK);
    NM_CHECK(nm_tabm_publish(r, &ws[1]) == NM_OK);
    const uint64_t order[3] = {2, 0, 1};
    for (int i = 0; i < 3; i++) {
        NM_CHECK(nm_tabm_acquire_read(r, 0, &rd) == NM_OK);
        NM_CHECK(rd.meta->user == order[i] && rd.meta->seq == (uint64_t)i);
        NM_CHECK(rd.meta->producer == 7 && rd.meta->kind == NM_TABM_TOKENS && rd.meta->size == 20);
        NM_CHECK(((int32_t *)rd.data)[4] == (int32_t)order[i] * 100 + 4); // in place
        NM_CHECK(rd.meta->t_acquire_ns <= rd.meta->t_publish_ns && rd.meta->t_publish_ns <= rd.meta->t_read_ns);
        NM_CHECK(nm_tabm_slot_state(r, rd.index) == NM_TABM_ALLOCATED_FOR_READ);
        uint32_t ix = rd.index;
        NM_CHECK(nm_tabm_release(r, &rd) == NM_OK);
        NM_CHECK(nm_tabm_slot_state(r, ix) == NM_TABM_FREE);
    }
    NM_CHECK(nm_tabm_acquire_read(r, 0, &rd) == NM_ERR_AGAIN);
    nm_tabm_stats s = nm_tabm_get_stats(r);
    NM_CHECK(s.published == 3 && s.released == 3 && s.bytes_published == 60 && s.occupancy == 0);
    NM_CHECK(s.max_occupancy == 3 && s.ready == 0 && s.write_wait_hist[0] == 3 && s.read_wait_hist[0] == 3);
    NM_CHECK(s.slots_per_s > 0);
    (void)w;
    nm_tabm_free(r);
}

NM_TEST(tabm_errors) {
    nm_tabm *r = ring(2, 64);
    if (!r) { NM_CHECK(0); return; }
    nm_tabm_slot s, t;
    // publish without acquire: a handle that was never filled in
    memset(&s, 0, sizeof s);
    NM_CHECK(nm_tabm_publish(r, &s) == NM_ERR_INVALID_ARG); // data does not match the slot
    NM_CHECK(nm_tabm_acquire_write(r, 0, 0, &s) == NM_OK);
    t = s;
    t.gen ^= 5; // a stale handle of the same slot
    NM_CHECK(nm_tabm_publish(r, &t) == NM_ERR_STATE);
    NM_CHECK(strstr(nm_tabm_last_error(r), "not held for write") != NULL);
    NM_CHECK(nm_tabm_release(r, &s) == NM_ERR_STATE); // release of a slot held for write
    // payload too big, bad shapes: the slot stays held and can be fixed
    s.meta->size = 65;
    NM_CHECK(nm_tabm_publish(r, &s) == NM_ERR_RANGE);
    NM_CHECK(strstr(nm_tabm_last_error(r), "65 bytes") != NULL);
    s.meta->kind = NM_TABM_EMBD_F32;
    s.meta->ndim = 2;
    s.meta->shape[0] = 2;
    s.meta->shape[1] = 4;
    s.meta->size = 31;
    NM_CHECK(nm_tabm_publish(r, &s) == NM_ERR_RANGE); // shape says 32
    s.meta->shape[1] = -4;
    NM_CHECK(nm_tabm_publish(r, &s) == NM_ERR_RANGE);
    s.meta->shape[1] = 4;
    s.meta->ndim = 5;
    NM_CHECK(nm_tabm_publish(r, &s) == NM_ERR_INVALID_ARG);
    s.meta->ndim = 2;
    s.meta->kind = 99;
    NM_CHECK(nm_tabm_publish(r, &s) == NM_ERR_INVALID_ARG);
    s.meta->kind = NM_TABM_EMBD_F32;
    s.meta->size = 32;
    nm_tabm_slot pub = s;
    NM_CHECK(nm_tabm_publish(r, &s) == NM_OK);
    NM_CHECK(nm_tabm_publish(r, &pub) == NM_ERR_STATE); // published twice
    NM_CHECK(nm_tabm_acquire_read(r, 0, &t) == NM_OK);
    nm_tabm_slot again = t;
    NM_CHECK(nm_tabm_release(r, &t) == NM_OK);
    NM_CHECK(nm_tabm_release(r, &again) == NM_ERR_STATE); // released twice
    NM_CHECK(strstr(nm_tabm_last_error(r), "released twice") != NULL);
    // ... still an error once the slot lives again (the generation moved on)
    NM_CHECK(nm_tabm_acquire_write(r, 0, 0, &s) == NM_OK);
    NM_CHECK(nm_tabm_acquire_write(r, 0, 0, &t) == NM_OK);
    NM_CHECK(nm_tabm_release(r, &again) == NM_ERR_STATE);
    NM_CHECK(nm_tabm_cancel(r, &s) == NM_OK && nm_tabm_cancel(r, &t) == NM_OK);
    NM_CHECK(nm_tabm_cancel(r, &t) == NM_ERR_STATE || nm_tabm_cancel(r, &t) == NM_ERR_INVALID_ARG);
    t.index = 2; // out of range
    NM_CHECK(nm_tabm_release(r, &t) == NM_ERR_INVALID_ARG);
    NM_CHECK(nm_tabm_publish(NULL, &t) == NM_ERR_INVALID_ARG && nm_tabm_acquire_read(r, 0, NULL) == NM_ERR_INVALID_ARG);
    nm_tabm_stats st = nm_tabm_get_stats(r);
    NM_CHECK(st.occupancy == 0 && st.published == 1 && st.released == 1);
    nm_tabm_free(r);
    nm_tabm *bad = NULL;
    char err[200];
    NM_CHECK(nm_tabm_create(NULL, 0, 64, &bad, err, sizeof err) == NM_ERR_INVALID_ARG && !bad);
    NM_CHECK(nm_tabm_create(NULL, 70000, 64, &bad, err, sizeof err) == NM_ERR_INVALID_ARG);
    NM_CHECK(nm_tabm_create(NULL, 4, 0, &bad, err, sizeof err) == NM_ERR_INVALID_ARG);
    NM_CHECK(strstr(err, "slots") != NULL);
    nm_tabm_free(NULL);
}

NM_TEST(tabm_backpressure_timeout_shutdown) {
    nm_tabm *r = ring(2, 64);
    if (!r) { NM_CHECK(0); return; }
    nm_tabm_slot a, b, c;
    NM_CHECK(nm_tabm_acquire_write(r, 1, 0, &a) == NM_OK);
    NM_CHECK(nm_tabm_acquire_write(r, 1, -1, &b) == NM_OK);
    NM_CHECK(nm_tabm_acquire_write(r, 1, 0, &c) == NM_ERR_AGAIN); // full
    uint64_t t0 = nm_tabm_get_stats(r).seconds * 1e9;
    NM_CHECK(nm_tabm_acquire_write(r, 1, 20 * 1000000, &c) == NM_ERR_TIMEOUT);
    uint64_t t1 = nm_tabm_get_stats(r).seconds * 1e9;
    NM_CHECK(t1 - t0 >= 19 * 1000000ull);
    NM_CHECK(nm_tabm_acquire_read(r, 5 * 1000000, &c) == NM_ERR_TIMEOUT);
    nm_tabm_stats s = nm_tabm_get_stats(r);
    NM_CHECK(s.full_waits == 1 && s.empty_waits == 1 && s.occupancy == 2);
    NM_CHECK(nm_tabm_publish(r, &a) == NM_OK);
    nm_tabm_shutdown(r);
    NM_CHECK(nm_tabm_is_shutdown(r));
    NM_CHECK(nm_tabm_acquire_write(r, 1, -1, &c) == NM_ERR_SHUTDOWN);
    NM_CHECK(nm_tabm_acquire_read(r, -1, &c) == NM_OK); // a is still delivered
    NM_CHECK(nm_tabm_release(r, &c) == NM_OK);
    // b is held by a writer: readers wait for it (not SHUTDOWN yet) ...
    NM_CHECK(nm_tabm_acquire_read(r, 0, &c) == NM_ERR_AGAIN);
    NM_CHECK(nm_tabm_publish(r, &b) == NM_OK); // publish after shutdown: not lost
    NM_CHECK(nm_tabm_acquire_read(r, 0, &c) == NM_OK);
    NM_CHECK(nm_tabm_release(r, &c) == NM_OK);
    NM_CHECK(nm_tabm_acquire_read(r, -1, &c) == NM_ERR_SHUTDOWN); // ... then stop
    nm_tabm_free(r);
}

NM_TEST(tabm_eventfd_poll) {
    nm_tabm *r = ring(4, 64);
    if (!r) { NM_CHECK(0); return; }
    int efd = nm_tabm_poll_fd(r);
    NM_CHECK(efd >= 0 && nm_tabm_poll_fd(r) == efd);
    struct pollfd p = {.fd = efd, .events = POLLIN};
    NM_CHECK(poll(&p, 1, 0) == 0);
    nm_tabm_slot s;
    NM_CHECK(nm_tabm_acquire_write(r, 0, 0, &s) == NM_OK && nm_tabm_publish(r, &s) == NM_OK);
    NM_CHECK(poll(&p, 1, 0) == 1 && (p.revents & POLLIN));
    uint64_t v;
    NM_CHECK(read(efd, &v, sizeof v) == sizeof v && v == 1);
    NM_CHECK(nm_tabm_acquire_read(r, 0, &s) == NM_OK && nm_tabm_release(r, &s) == NM_OK);
    NM_CHECK(nm_tabm_acquire_read(r, 0, &s) == NM_ERR_AGAIN);
    NM_CHECK(poll(&p, 1, 0) == 0);
    nm_tabm_shutdown(r);
    NM_CHECK(poll(&p, 1, 0) == 1);
    nm_tabm_free(r);
}

NM_TEST(tabm_attach_validates) {
    nm_tabm *r = ring(3, 5000);
    if (!r) { NM_CHECK(0); return; }
    nm_tabm *a = NULL;
    char err[256];
    NM_CHECK(nm_tabm_attach(nm_tabm_fd(r), -1, &a, err, sizeof err) == NM_OK);
    NM_CHECK(a && nm_tabm_n_slots(a) == 3 && nm_tabm_max_payload(a) == 5000);
    nm_tabm_slot s, t;
    NM_CHECK(nm_tabm_acquire_write(a, 3, 0, &s) == NM_OK);
    NM_CHECK(((uintptr_t)s.data & 4095) == 0); // page-aligned slots for payloads >= a page
    memset(s.data, 0x5a, 5000);
    s.meta->size = 5000;
    NM_CHECK(nm_tabm_publish(a, &s) == NM_OK);
    NM_CHECK(nm_tabm_acquire_read(r, 0, &t) == NM_OK); // through the other mapping
    NM_CHECK(t.meta->producer == 3 && ((unsigned char *)t.data)[4999] == 0x5a);
    NM_CHECK(nm_tabm_release(r, &t) == NM_OK);
    nm_tabm_free(a);
    // Not a ring: a memfd of zeros, a corrupted magic, a truncated file.
    int fd = memfd_create("notaring", 0);
    NM_CHECK(ftruncate(fd, 1 << 16) == 0);
    a = (nm_tabm *)1;
    NM_CHECK(nm_tabm_attach(fd, -1, &a, err, sizeof err) == NM_ERR_FORMAT && a == NULL);
    NM_CHECK(strstr(err, "magic") != NULL);
    char hdr[4096];
    NM_CHECK(pread(nm_tabm_fd(r), hdr, sizeof hdr, 0) == sizeof hdr);
    NM_CHECK(ftruncate(fd, 4096) == 0);
    NM_CHECK(pwrite(fd, hdr, sizeof hdr, 0) == sizeof hdr);
    NM_CHECK(nm_tabm_attach(fd, -1, &a, err, sizeof err) == NM_ERR_FORMAT); // too small for its geometry
    NM_CHECK(strstr(err, "needs") != NULL);
    hdr[8] = 9; // version
    NM_CHECK(pwrite(fd, hdr, sizeof hdr, 0) == sizeof hdr);
    NM_CHECK(nm_tabm_attach(fd, -1, &a, err, sizeof err) == NM_ERR_UNSUPPORTED);
    NM_CHECK(nm_tabm_attach(-1, -1, &a, err, sizeof err) == NM_ERR_IO);
    close(fd);
    nm_tabm_free(r);
}

NM_TEST(tabm_from_pool) {
    nm_umem *u = NULL;
    NM_CHECK(nm_umem_create(NULL, &u, NULL, 0) == NM_OK);
    nm_tabm *r = NULL;
    NM_CHECK(nm_tabm_create(u, 8, 1 << 20, &r, NULL, 0) == NM_OK);
    nm_umem_stats s = nm_umem_get_stats(u);
    NM_CHECK(s.n_live == 1 && s.live_bytes >= 8ull << 20 && s.bytes_by_kind[NM_UMEM_MEMFD] == s.live_bytes);
    nm_tabm_free(r);
    NM_CHECK(nm_umem_get_stats(u).live_bytes == 0);
    nm_umem_free(u);
}

// The pool freed before a ring made in it (a pipeline tearing down in any
// order): the ring's memory stays until nm_tabm_free, the pool's other
// buffers go with it. Under ASan a use after free fails here.
NM_TEST(tabm_pool_freed_before_ring) {
    nm_umem *u = NULL;
    NM_CHECK(nm_umem_create(NULL, &u, NULL, 0) == NM_OK);
    if (!u) return;
    nm_tabm *r = NULL, *r2 = NULL;
    nm_umem_buf *other = NULL;
    NM_CHECK(nm_tabm_create(u, 4, 4096, &r, NULL, 0) == NM_OK);
    NM_CHECK(nm_tabm_create(u, 2, 64, &r2, NULL, 0) == NM_OK);
    NM_CHECK(nm_umem_alloc(u, 1 << 16, 0, &other) == NM_OK);
    nm_umem_free(u); // `other` dies here; the rings live on
    if (!r || !r2) return;
    nm_tabm_slot w, rd;
    NM_CHECK(nm_tabm_acquire_write(r, 1, 0, &w) == NM_OK);
    memset(w.data, 0x5a, 4096);
    w.meta->size = 4096;
    NM_CHECK(nm_tabm_publish(r, &w) == NM_OK);
    NM_CHECK(nm_tabm_acquire_read(r, 0, &rd) == NM_OK);
    NM_CHECK(((const uint8_t *)rd.data)[4095] == 0x5a);
    NM_CHECK(nm_tabm_release(r, &rd) == NM_OK);
    nm_tabm_free(r);  // the pool lives on for r2
    NM_CHECK(nm_tabm_acquire_write(r2, 1, 0, &w) == NM_OK);
    NM_CHECK(nm_tabm_cancel(r2, &w) == NM_OK);
    nm_tabm_free(r2); // the last one: the pool goes
}

// Failing calls on one ring and one pool from two threads, each reading the
// last error after its own failure: the text is whole (TSan: no race between
// a writer's vsnprintf and a reader).
typedef struct {
    nm_tabm *r;
    nm_umem *u;
    int bad;
} err_job;

static void *err_worker(void *arg) {
    err_job *j = arg;
    for (int i = 0; i < 2000; i++) {
        nm_tabm_slot bogus = {0};
        bogus.index = 1u << 30; // no such slot
        if (nm_tabm_release(j->r, &bogus) == NM_OK) j->bad++;
        const char *m = nm_tabm_last_error(j->r);
        if (strncmp(m, "tabm", 4) != 0) j->bad++;
        nm_umem_buf *b = NULL;
        if (nm_umem_alloc(j->u, (size_t)1 << 40, 0, &b) == NM_OK) nm_umem_buf_free(b), j->bad++; // over the limit
        if (strncmp(nm_umem_last_error(j->u), "umem", 4) != 0) j->bad++;
    }
    return NULL;
}

NM_TEST(tabm_last_error_across_threads) {
    nm_umem_params pp = nm_umem_default_params();
    pp.limit = 1 << 20;
    nm_umem *u = NULL;
    nm_tabm *r = ring(2, 64);
    NM_CHECK(nm_umem_create(&pp, &u, NULL, 0) == NM_OK && r);
    if (!u || !r) {
        nm_tabm_free(r);
        nm_umem_free(u);
        return;
    }
    err_job jobs[2] = {{r, u, 0}, {r, u, 0}};
    pthread_t t;
    NM_CHECK(pthread_create(&t, NULL, err_worker, &jobs[1]) == 0);
    err_worker(&jobs[0]);
    pthread_join(t, NULL);
    NM_CHECK(jobs[0].bad == 0 && jobs[1].bad == 0);
    nm_tabm_free(r);
    nm_umem_free(u);
}

// [R2] gives the slot its next generation: a stale copy of a read handle,
// released again after the slot went round the ring to another reader, must
// be refused and must not free the other reader's slot.
NM_TEST(tabm_stale_handle_after_reuse) {
    nm_tabm *r = ring(1, 64);
    if (!r) return;
    nm_tabm_slot w, a, stale, b;
    NM_CHECK(nm_tabm_acquire_write(r, 1, 0, &w) == NM_OK);
    NM_CHECK(nm_tabm_publish(r, &w) == NM_OK);
    NM_CHECK(nm_tabm_acquire_read(r, 0, &a) == NM_OK);
    stale = a;
    NM_CHECK(nm_tabm_release(r, &a) == NM_OK);
    NM_CHECK(nm_tabm_acquire_write(r, 1, 0, &w) == NM_OK); // the same slot, its next generation
    NM_CHECK(w.index == stale.index && w.gen != stale.gen);
    NM_CHECK(nm_tabm_publish(r, &w) == NM_OK);
    NM_CHECK(nm_tabm_acquire_read(r, 0, &b) == NM_OK);
    NM_CHECK(nm_tabm_release(r, &stale) == NM_ERR_STATE);
    NM_CHECK(nm_tabm_get_stats(r).occupancy == 1); // b still holds it
    NM_CHECK(nm_tabm_release(r, &b) == NM_OK);
    nm_tabm_free(r);
}

// A cancelled write leaves `writers` ([W3] on the cancel path): after it and a
// shutdown, a reader is told NM_ERR_SHUTDOWN at once instead of waiting for a
// writer that is gone.
NM_TEST(tabm_cancel_then_shutdown_ends_readers) {
    nm_tabm *r = ring(2, 64);
    if (!r) return;
    nm_tabm_slot w, s;
    NM_CHECK(nm_tabm_acquire_write(r, 1, 0, &w) == NM_OK);
    NM_CHECK(nm_tabm_cancel(r, &w) == NM_OK);
    nm_tabm_shutdown(r);
    NM_CHECK(nm_tabm_acquire_read(r, 200000000, &s) == NM_ERR_SHUTDOWN); // 0.2 s: a wait would time out
    NM_CHECK(nm_tabm_get_stats(r).occupancy == 0);
    nm_tabm_free(r);
}

// Cancellation marks: shared by every process of the ring, the last
// NM_TABM_MAX_CANCELLED kept, id 0 refused, a second mark of an id not counted.
NM_TEST(tabm_cancel_request_marks) {
    nm_tabm *r = NULL;
    NM_CHECK(nm_tabm_create(NULL, 2, 64, &r, NULL, 0) == NM_OK);
    if (!r) return;
    NM_CHECK(nm_tabm_cancel_request(r, 0) == NM_ERR_INVALID_ARG);
    NM_CHECK(strstr(nm_tabm_last_error(r), "request id 0") != NULL);
    NM_CHECK(nm_tabm_cancel_request(NULL, 5) == NM_ERR_INVALID_ARG && !nm_tabm_request_cancelled(NULL, 5));
    NM_CHECK(!nm_tabm_request_cancelled(r, 5) && !nm_tabm_request_cancelled(r, 0));
    NM_CHECK(nm_tabm_cancel_request(r, 5) == NM_OK && nm_tabm_cancel_request(r, 5) == NM_OK);
    NM_CHECK(nm_tabm_request_cancelled(r, 5) && !nm_tabm_request_cancelled(r, 6));
    NM_CHECK(nm_tabm_get_stats(r).cancelled == 1);
    // a child process marks 100..100+MAX-1: the parent sees them, and 5 (the oldest) is forgotten
    pid_t pid = fork();
    if (pid == 0) {
        for (uint64_t i = 0; i < NM_TABM_MAX_CANCELLED; i++)
            if (nm_tabm_cancel_request(r, 100 + i) != NM_OK) _exit(1);
        _exit(0);
    }
    int ws = 0;
    NM_CHECK(pid > 0 && waitpid(pid, &ws, 0) == pid && WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    int seen = 0;
    for (uint64_t i = 0; i < NM_TABM_MAX_CANCELLED; i++) seen += nm_tabm_request_cancelled(r, 100 + i);
    NM_CHECK(seen == NM_TABM_MAX_CANCELLED && !nm_tabm_request_cancelled(r, 5));
    NM_CHECK(nm_tabm_get_stats(r).cancelled == 1 + NM_TABM_MAX_CANCELLED);
    // a mark changes no slot: the ring still moves
    nm_tabm_slot s;
    NM_CHECK(nm_tabm_acquire_write(r, 0, 0, &s) == NM_OK);
    s.meta->kind = NM_TABM_PARAMS;
    s.meta->size = 2;
    s.meta->ndim = 1;
    s.meta->shape[0] = 2;
    memcpy(s.data, "{}", 2);
    NM_CHECK(nm_tabm_publish(r, &s) == NM_OK);
    NM_CHECK(nm_tabm_acquire_read(r, 0, &s) == NM_OK && s.meta->kind == NM_TABM_PARAMS);
    NM_CHECK(nm_tabm_release(r, &s) == NM_OK);
    nm_tabm_free(r);
}

// NM_TABM_WAIT_PEER: a write to a full ring waits only for another thread
// that reads it. The caller as the ring's reader: NM_ERR_AGAIN at once. No
// reader yet: up to the grace (1 s), then NM_ERR_AGAIN. A reader on another
// thread: the wait ends when it takes a slot. The same for reads and writers.
typedef struct peer_reader {
    nm_tabm *r;
    nm_status st;
} peer_reader;
// Takes a slot, holds it until a writer waits on the full ring, then releases it.
static void *peer_read_one(void *arg) {
    peer_reader *P = arg;
    nm_tabm_slot s;
    if ((P->st = nm_tabm_acquire_read(P->r, -1, &s)) != NM_OK) return NULL;
    while (nm_tabm_get_stats(P->r).full_waits == 0) usleep(1000);
    P->st = nm_tabm_release(P->r, &s);
    return NULL;
}

NM_TEST(tabm_wait_peer) {
    nm_tabm *r = ring(1, 64);
    nm_tabm_slot s;
    NM_CHECK(nm_tabm_acquire_write(r, 1, NM_TABM_WAIT_PEER, &s) == NM_OK && nm_tabm_publish(r, &s) == NM_OK);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    NM_CHECK(nm_tabm_acquire_write(r, 1, NM_TABM_WAIT_PEER, &s) == NM_ERR_AGAIN); // nobody has read: the grace, then none
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double waited = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    printf("  no reader: NM_ERR_AGAIN after %.2f s\n", waited);
    NM_CHECK(waited >= 0.9); // (a lower bound: the grace is waited out, not skipped)
    NM_CHECK(nm_tabm_acquire_read(r, 0, &s) == NM_OK && nm_tabm_release(r, &s) == NM_OK); // this thread reads it
    NM_CHECK(nm_tabm_acquire_read(r, NM_TABM_WAIT_PEER, &s) == NM_ERR_AGAIN); // empty, and this thread wrote it
    NM_CHECK(nm_tabm_acquire_write(r, 1, NM_TABM_WAIT_PEER, &s) == NM_OK && nm_tabm_publish(r, &s) == NM_OK);
    NM_CHECK(nm_tabm_acquire_write(r, 1, NM_TABM_WAIT_PEER, &s) == NM_ERR_AGAIN); // full, and this thread reads it
    nm_tabm_free(r);
    // another thread holds the one slot read: this write waits until it gives it back
    r = ring(1, 64);
    NM_CHECK(nm_tabm_acquire_write(r, 1, NM_TABM_WAIT_PEER, &s) == NM_OK && nm_tabm_publish(r, &s) == NM_OK);
    peer_reader P = {r, NM_ERR_STATE};
    pthread_t th;
    NM_CHECK(pthread_create(&th, NULL, peer_read_one, &P) == 0);
    while (nm_tabm_get_stats(r).ready != 0) usleep(1000); // (it holds the slot: it is the reader)
    NM_CHECK(nm_tabm_acquire_write(r, 1, NM_TABM_WAIT_PEER, &s) == NM_OK && nm_tabm_publish(r, &s) == NM_OK);
    pthread_join(th, NULL);
    NM_CHECK(P.st == NM_OK);
    nm_tabm_free(r);
}

NM_TEST_MAIN()
