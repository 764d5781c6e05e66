// TABM stress: 2 producers x 2 consumers hand over NM_TABM_STRESS_N slots
// (default 1e6; 2e4 under TSan; env NM_TABM_STRESS_N overrides) through an
// 8-slot ring. Each payload has a length and bytes derived from (producer,
// index) and a checksum in meta.user. Checked: every message arrives exactly
// once, intact, and each consumer sees each producer's messages in order;
// shutdown after the producers finish lets the consumers drain and stop.
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "nmtest.h"
#include "nanomind.h"

#if defined(__SANITIZE_THREAD__)
#define STRESS_DEFAULT 20000
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define STRESS_DEFAULT 20000
#endif
#endif
#ifndef STRESS_DEFAULT
#define STRESS_DEFAULT 1000000
#endif

#define NPROD 2
#define NCONS 2
#define MAXP 256

static uint64_t n_total;
static _Atomic uint8_t *seen; // (NPROD * per)
static _Atomic int bad_sum, bad_order, dup_seen, errs;

static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static uint64_t fill(unsigned char *d, uint32_t p, uint64_t i, size_t *len) {
    uint64_t s = mix(((uint64_t)p << 40) ^ i);
    *len = 8 + (size_t)(s % (MAXP - 8));
    uint64_t sum = 1469598103934665603ull;
    for (size_t k = 0; k < *len; k++) {
        d[k] = (unsigned char)(mix(s + k) >> 17);
        sum = (sum ^ d[k]) * 1099511628211ull; // FNV-1a
    }
    return sum;
}

struct prod { nm_tabm *r; uint32_t id; uint64_t n; };
static void *producer(void *arg) {
    struct prod *p = arg;
    for (uint64_t i = 0; i < p->n; i++) {
        nm_tabm_slot s;
        nm_status st = nm_tabm_acquire_write(p->r, p->id, -1, &s);
        if (st != NM_OK) { atomic_fetch_add(&errs, 1); return NULL; }
        size_t len;
        uint64_t sum = fill(s.data, p->id, i, &len);
        s.meta->kind = NM_TABM_BYTES;
        s.meta->size = len;
        s.meta->user = sum;
        s.meta->shape[0] = (int64_t)i; // the message index
        if (nm_tabm_publish(p->r, &s) != NM_OK) { atomic_fetch_add(&errs, 1); return NULL; }
    }
    return NULL;
}

struct cons { nm_tabm *r; int id; uint64_t got; int64_t timeout; };
static void *consumer(void *arg) {
    struct cons *c = arg;
    int64_t last[NPROD] = {-1, -1};
    uint64_t per = n_total / NPROD;
    for (;;) {
        nm_tabm_slot s;
        nm_status st = nm_tabm_acquire_read(c->r, c->timeout, &s);
        if (st == NM_ERR_SHUTDOWN) break;
        if (st == NM_ERR_TIMEOUT) continue;
        if (st != NM_OK) { atomic_fetch_add(&errs, 1); break; }
        uint32_t p = s.meta->producer;
        int64_t i = s.meta->shape[0];
        if (p >= NPROD || i < 0 || (uint64_t)i >= per) { atomic_fetch_add(&errs, 1); break; }
        const unsigned char *d = s.data;
        uint64_t sum = 1469598103934665603ull;
        for (size_t k = 0; k < s.meta->size; k++) sum = (sum ^ d[k]) * 1099511628211ull;
        if (sum != s.meta->user) atomic_fetch_add(&bad_sum, 1);
        if (i <= last[p]) atomic_fetch_add(&bad_order, 1);
        last[p] = i;
        if (atomic_fetch_add(&seen[p * per + (uint64_t)i], 1) != 0) atomic_fetch_add(&dup_seen, 1);
        c->got++;
        if (nm_tabm_release(c->r, &s) != NM_OK) { atomic_fetch_add(&errs, 1); break; }
    }
    return NULL;
}

NM_TEST(tabm_stress_2x2) {
    const char *env = getenv("NM_TABM_STRESS_N");
    n_total = env ? strtoull(env, NULL, 10) : STRESS_DEFAULT;
    n_total -= n_total % NPROD;
    uint64_t per = n_total / NPROD;
    seen = calloc(n_total ? n_total : 1, 1);
    nm_tabm *r = NULL;
    NM_CHECK(nm_tabm_create(NULL, 8, MAXP, &r, NULL, 0) == NM_OK);
    if (!r || !seen) return;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pthread_t pt[NPROD], ct[NCONS];
    struct prod pa[NPROD];
    struct cons ca[NCONS];
    for (int i = 0; i < NCONS; i++) {
        // one consumer sleeps without a deadline, the other with 1 ms timeouts
        ca[i] = (struct cons){r, i, 0, i == 0 ? -1 : 1000000};
        pthread_create(&ct[i], NULL, consumer, &ca[i]);
    }
    for (int i = 0; i < NPROD; i++) {
        pa[i] = (struct prod){r, (uint32_t)i, per};
        pthread_create(&pt[i], NULL, producer, &pa[i]);
    }
    for (int i = 0; i < NPROD; i++) pthread_join(pt[i], NULL);
    nm_tabm_shutdown(r); // the consumers drain what is left, then stop
    for (int i = 0; i < NCONS; i++) pthread_join(ct[i], NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double sec = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    uint64_t missing = 0;
    for (uint64_t k = 0; k < n_total; k++) missing += atomic_load(&seen[k]) == 0;
    nm_tabm_stats s = nm_tabm_get_stats(r);
    fprintf(stderr, "  %llu slots in %.2f s (%.2f M/s); consumers got %llu + %llu; max occupancy %u, "
            "full waits %llu, empty waits %llu\n", (unsigned long long)n_total, sec, n_total / sec / 1e6,
            (unsigned long long)ca[0].got, (unsigned long long)ca[1].got, s.max_occupancy,
            (unsigned long long)s.full_waits, (unsigned long long)s.empty_waits);
    NM_CHECK(atomic_load(&errs) == 0);
    NM_CHECK(missing == 0);
    NM_CHECK(atomic_load(&dup_seen) == 0);
    NM_CHECK(atomic_load(&bad_sum) == 0);
    NM_CHECK(atomic_load(&bad_order) == 0);
    NM_CHECK(ca[0].got + ca[1].got == n_total);
    NM_CHECK(s.published == n_total && s.released == n_total && s.occupancy == 0 && s.ready == 0);
    NM_CHECK(s.max_occupancy <= 8);
    uint64_t hw = 0, hr = 0;
    for (int i = 0; i < NM_TABM_HIST_BUCKETS; i++) hw += s.write_wait_hist[i], hr += s.read_wait_hist[i];
    NM_CHECK(hw == n_total && hr == n_total); // one histogram entry per acquire
    nm_tabm_free(r);
    free(seen);
}

// Shutdown wakes everyone: two producers blocked on a full ring and two
// consumers blocked on another, empty ring, all return NM_ERR_SHUTDOWN.
struct blk { nm_tabm *r; bool write; nm_status st; };
static void *blocker(void *arg) {
    struct blk *b = arg;
    nm_tabm_slot s;
    b->st = b->write ? nm_tabm_acquire_write(b->r, 0, -1, &s) : nm_tabm_acquire_read(b->r, -1, &s);
    return NULL;
}

NM_TEST(tabm_shutdown_wakes_all_waiters) {
    nm_tabm *full = NULL, *empty = NULL;
    NM_CHECK(nm_tabm_create(NULL, 1, 64, &full, NULL, 0) == NM_OK);
    NM_CHECK(nm_tabm_create(NULL, 1, 64, &empty, NULL, 0) == NM_OK);
    if (!full || !empty) return;
    nm_tabm_slot held;
    NM_CHECK(nm_tabm_acquire_write(full, 0, 0, &held) == NM_OK);
    NM_CHECK(nm_tabm_publish(full, &held) == NM_OK); // full: one slot, ready, unread
    struct blk b[4] = {{full, true, 1}, {full, true, 1}, {empty, false, 1}, {empty, false, 1}};
    pthread_t t[4];
    for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, blocker, &b[i]);
    struct timespec d = {0, 50 * 1000000};
    nanosleep(&d, NULL); // let them block
    nm_tabm_shutdown(full);
    nm_tabm_shutdown(empty);
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < 4; i++) NM_CHECK(b[i].st == NM_ERR_SHUTDOWN);
    nm_tabm_free(full);
    nm_tabm_free(empty);
}

NM_TEST_MAIN()
