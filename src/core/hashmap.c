#include "core/hashmap.h"

#include <stdlib.h>
#include <string.h>

static uint64_t fmix64(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

// Word-at-a-time multiply-xor hash, finished with murmur3's fmix64. Keys here
// are short (tokens, a few bytes), so per-call overhead matters more than
// throughput on long inputs.
uint64_t nm_hash_bytes(const void *p, size_t n) {
    const uint8_t *s = p;
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (n * 0x100000001b3ull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ fmix64(w)) * 0x9fb21c651e98df25ull;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    for (size_t i = 0; i < n; i++) w |= (uint64_t)s[i] << (8 * i);
    h = (h ^ w) * 0x9fb21c651e98df25ull;
    return fmix64(h);
}

static uint32_t cap_for(uint32_t n) {
    uint64_t cap = 16;
    while (cap < 2ull * n) cap <<= 1; // load factor <= 1/2
    return (uint32_t)cap;
}

// ---- nm_strindex ---------------------------------------------------------------

nm_status nm_strindex_build(nm_strindex *ix, const char *const *ptrs, const uint32_t *lens,
                            uint32_t n) {
    memset(ix, 0, sizeof(*ix));
    if (n >= 0x7fffffffu) return NM_ERR_RANGE;
    uint32_t cap = cap_for(n);
    ix->slots = calloc(cap, sizeof(uint64_t));
    if (!ix->slots) return NM_ERR_NOMEM;
    ix->ptrs = ptrs;
    ix->lens = lens;
    ix->mask = cap - 1;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t h = nm_hash_bytes(ptrs[i], lens[i]);
        uint32_t tag = (uint32_t)(h >> 32);
        for (uint32_t j = (uint32_t)h & ix->mask;; j = (j + 1) & ix->mask) {
            uint64_t s = ix->slots[j];
            if (s == 0) {
                ix->slots[j] = ((uint64_t)tag << 32) | (i + 1);
                break;
            }
            uint32_t k = (uint32_t)s - 1;
            if ((uint32_t)(s >> 32) == tag && lens[k] == lens[i] &&
                memcmp(ptrs[k], ptrs[i], lens[i]) == 0) {
                ix->slots[j] = ((uint64_t)tag << 32) | (i + 1); // last duplicate wins
                break;
            }
        }
    }
    return NM_OK;
}

void nm_strindex_free(nm_strindex *ix) {
    free(ix->slots);
    memset(ix, 0, sizeof(*ix));
}

int32_t nm_strindex_find(const nm_strindex *ix, const char *p, size_t n) {
    if (!ix->slots) return -1;
    uint64_t h = nm_hash_bytes(p, n);
    uint32_t tag = (uint32_t)(h >> 32);
    for (uint32_t j = (uint32_t)h & ix->mask;; j = (j + 1) & ix->mask) {
        uint64_t s = ix->slots[j];
        if (s == 0) return -1;
        uint32_t k = (uint32_t)s - 1;
        if ((uint32_t)(s >> 32) == tag && ix->lens[k] == n && memcmp(ix->ptrs[k], p, n) == 0)
            return (int32_t)k;
    }
}

// ---- nm_u64map -----------------------------------------------------------------

nm_status nm_u64map_init(nm_u64map *m, uint32_t n) {
    memset(m, 0, sizeof(*m));
    if (n >= 0x7fffffffu) return NM_ERR_RANGE;
    uint32_t cap = cap_for(n);
    m->keys = malloc((size_t)cap * sizeof(uint64_t));
    m->vals = malloc((size_t)cap * sizeof(uint64_t));
    if (!m->keys || !m->vals) {
        nm_u64map_free(m);
        return NM_ERR_NOMEM;
    }
    memset(m->keys, 0xff, (size_t)cap * sizeof(uint64_t));
    m->mask = cap - 1;
    return NM_OK;
}

void nm_u64map_free(nm_u64map *m) {
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof(*m));
}

static uint32_t u64_slot(uint64_t key) { return (uint32_t)fmix64(key); }

bool nm_u64map_put_first(nm_u64map *m, uint64_t key, uint64_t val) {
    if (!m->keys || (uint64_t)m->count + 1 > ((uint64_t)m->mask + 1) / 2) return false;
    for (uint32_t j = u64_slot(key) & m->mask;; j = (j + 1) & m->mask) {
        if (m->keys[j] == key) return true;
        if (m->keys[j] == UINT64_MAX) {
            m->keys[j] = key;
            m->vals[j] = val;
            m->count++;
            return true;
        }
    }
}

bool nm_u64map_get(const nm_u64map *m, uint64_t key, uint64_t *val) {
    if (!m->keys) return false;
    for (uint32_t j = u64_slot(key) & m->mask;; j = (j + 1) & m->mask) {
        if (m->keys[j] == key) {
            *val = m->vals[j];
            return true;
        }
        if (m->keys[j] == UINT64_MAX) return false;
    }
}
