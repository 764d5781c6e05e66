// Two small open-addressing hash tables, built once and then read-only (so
// lookups are safe from several threads at once).
//
//   nm_strindex: an index over a caller-owned array of strings: text -> the
//                position of that text in the array (the last one wins on
//                duplicates). Slots hold (hash tag, index), 8 bytes each; the
//                key bytes stay in the caller's array (e.g. a GGUF mapping).
//   nm_u64map:   uint64 key -> uint64 value (e.g. a token pair -> merge rank).
#ifndef NM_HASHMAP_H
#define NM_HASHMAP_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "nanomind.h"

uint64_t nm_hash_bytes(const void *p, size_t n);

typedef struct nm_strindex {
    const char *const *ptrs; // borrowed: key i is ptrs[i][0..lens[i])
    const uint32_t *lens;    // borrowed
    uint64_t *slots;         // (cap) high 32 bits: hash tag, low 32 bits: index + 1; 0 = empty
    uint32_t mask;           // cap - 1
} nm_strindex;

// Indexes keys 0..n-1. ptrs and lens are borrowed and must outlive the index.
nm_status nm_strindex_build(nm_strindex *ix, const char *const *ptrs, const uint32_t *lens,
                            uint32_t n);
void nm_strindex_free(nm_strindex *ix); // zeroed struct is a no-op
// Index of the key equal to p[0..n), or -1.
int32_t nm_strindex_find(const nm_strindex *ix, const char *p, size_t n);

typedef struct nm_u64map {
    uint64_t *keys; // (cap) UINT64_MAX = empty
    uint64_t *vals; // (cap)
    uint32_t mask;
    uint32_t count;
} nm_u64map;

// Room for `n` entries at a load factor of at most 1/2.
nm_status nm_u64map_init(nm_u64map *m, uint32_t n);
void nm_u64map_free(nm_u64map *m);
// Inserts or keeps the existing value (first wins). key must not be UINT64_MAX.
// Returns false if the table is full (more than the `n` given to init).
bool nm_u64map_put_first(nm_u64map *m, uint64_t key, uint64_t val);
bool nm_u64map_get(const nm_u64map *m, uint64_t key, uint64_t *val);

#endif
