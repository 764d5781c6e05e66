// Copy ledger: see ledger.h.
#include "mem/ledger.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NEP NM_LEDGER_MAX_ENDPOINTS

struct nm_ledger {
    pthread_mutex_t lock;                // endpoint registration only
    _Atomic int n_ep;
    char names[NEP][32];                 // written before n_ep is raised (release)
    _Atomic uint64_t bytes[NEP][NEP];    // (from, to)
    _Atomic uint64_t copies[NEP][NEP];
};

nm_ledger *nm_ledger_create(void) {
    nm_ledger *l = calloc(1, sizeof *l);
    if (!l) return NULL;
    pthread_mutex_init(&l->lock, NULL);
    return l;
}

void nm_ledger_free(nm_ledger *l) {
    if (!l) return;
    pthread_mutex_destroy(&l->lock);
    free(l);
}

int nm_ledger_endpoint(nm_ledger *l, const char *name) {
    if (!l || !name || !name[0]) return -1;
    pthread_mutex_lock(&l->lock);
    int n = atomic_load_explicit(&l->n_ep, memory_order_relaxed), id = -1;
    for (int i = 0; i < n; i++)
        if (!strncmp(l->names[i], name, sizeof l->names[i] - 1)) id = i;
    if (id < 0 && n < NEP) {
        snprintf(l->names[n], sizeof l->names[n], "%s", name);
        atomic_store_explicit(&l->n_ep, n + 1, memory_order_release);
        id = n;
    }
    pthread_mutex_unlock(&l->lock);
    return id;
}

void nm_ledger_copy(nm_ledger *l, int from, int to, void *dst, const void *src, size_t n) {
    if (n) memcpy(dst, src, n);
    nm_ledger_count(l, from, to, n);
}

void nm_ledger_count(nm_ledger *l, int from, int to, size_t n) {
    if (!l || from < 0 || to < 0 || from >= NEP || to >= NEP) return;
    atomic_fetch_add_explicit(&l->bytes[from][to], n, memory_order_relaxed);
    atomic_fetch_add_explicit(&l->copies[from][to], 1, memory_order_relaxed);
}

// which: 0 bytes, 1 copies. from/to -1: any.
static uint64_t sum(const nm_ledger *cl, int which, int from, int to) {
    if (!cl || from >= NEP || to >= NEP) return 0;
    nm_ledger *l = (nm_ledger *)cl; // atomics are only loaded
    _Atomic uint64_t(*t)[NEP] = which ? l->copies : l->bytes;
    uint64_t s = 0;
    for (int f = 0; f < NEP; f++)
        for (int d = 0; d < NEP; d++)
            if ((from < 0 || f == from) && (to < 0 || d == to))
                s += atomic_load_explicit(&t[f][d], memory_order_relaxed);
    return s;
}

uint64_t nm_ledger_bytes(const nm_ledger *l, int from, int to) {
    return l ? sum(l, 0, from, to) : 0;
}
uint64_t nm_ledger_copies(const nm_ledger *l, int from, int to) {
    return l ? sum(l, 1, from, to) : 0;
}
uint64_t nm_ledger_total(const nm_ledger *l) { return nm_ledger_bytes(l, -1, -1); }

void nm_ledger_reset(nm_ledger *l) {
    if (!l) return;
    for (int f = 0; f < NEP; f++)
        for (int d = 0; d < NEP; d++) {
            atomic_store_explicit(&l->bytes[f][d], 0, memory_order_relaxed);
            atomic_store_explicit(&l->copies[f][d], 0, memory_order_relaxed);
        }
}

int32_t nm_ledger_format(const nm_ledger *l, char *buf, int32_t size) {
    // Formats twice at most: once to measure when buf is too small.
    char line[160];
    size_t need = 0;
    uint64_t total = nm_ledger_total(l), ncp = nm_ledger_copies(l, -1, -1);
    int n = l ? atomic_load_explicit(&((nm_ledger *)l)->n_ep, memory_order_acquire) : 0;
#define EMIT(...)                                                                     \
    do {                                                                              \
        int k_ = snprintf(line, sizeof line, __VA_ARGS__);                            \
        if (buf && size > 0 && need + (size_t)k_ < (size_t)size) memcpy(buf + need, line, (size_t)k_ + 1); \
        need += (size_t)k_;                                                           \
    } while (0)
    EMIT("ledger: %llu bytes copied between bricks (%llu copies)\n", (unsigned long long)total,
         (unsigned long long)ncp);
    for (int f = 0; f < n; f++)
        for (int d = 0; d < n; d++) {
            uint64_t b = nm_ledger_bytes(l, f, d);
            if (b || nm_ledger_copies(l, f, d))
                EMIT("ledger:   %s -> %s: %llu bytes (%llu copies)\n", l->names[f], l->names[d],
                     (unsigned long long)b, (unsigned long long)nm_ledger_copies(l, f, d));
        }
#undef EMIT
    if (need + 1 > (size_t)(size > 0 ? size : 0) || need > INT32_MAX - 1) return -(int32_t)(need + 1);
    return (int32_t)need;
}
