// GGUF reader: mmap, validate everything once at open, then hand out pointers
// into the mapping. Layout: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
//
//   u32 magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
//   n_kv x      { str key | u32 type | value }
//   n_tensors x { str name | u32 n_dims | n_dims x u64 ne | u32 ggml type | u64 offset }
//   padding to `general.alignment` | data section (offsets are relative to it)
//
// str = u64 len + bytes; array value = u32 elem type + u64 n + n elements.
//
// Every length and count is checked against the bytes left before it is used,
// and arithmetic on file-controlled numbers goes through the overflow builtins,
// so a corrupt file can only produce an error message, never a wild read or a
// huge allocation: the two descriptor arrays are sized from counts that were
// first bounded by what the remaining bytes could hold.
#include "gguf/gguf.h"
#include "io/infile.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "quant/quant.h"
#include "core/fail.h"

// Values are read in place (memcpy of the wire bytes), which is only right on
// a little-endian host; all our targets are.
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF reader assumes a little-endian host"
#endif

#define MAX_ARRAY_DEPTH 8 // arrays of arrays nest at most this deep
// Smallest encodings, used to bound counts before allocating or looping.
#define MIN_KV_BYTES (8 + 4 + 1)               // empty key, u8 value
#define MIN_TENSOR_INFO_BYTES (8 + 4 + 8 + 4 + 8) // empty name, 1 dim
#define MIN_ARRAY_BYTES (4 + 8)                // elem type + count

struct nm_gguf {
    const uint8_t *base; // file bytes
    uint64_t size;
    bool mapped;         // base is our mmap
    bool heap;           // base is our allocation (nm_gguf_open_read); neither: borrowed from the caller
    uint32_t version;
    uint64_t alignment;
    uint64_t data_offset;
    int64_t n_kv;
    int64_t n_tensors;
    nm_gguf_kv *kv;            // (n_kv) in file order
    nm_gguf_tensor *tensors;   // (n_tensors) in file order
    const nm_gguf_kv **kv_sorted;        // (n_kv) by key, for nm_gguf_find
    const nm_gguf_tensor **t_sorted;     // (n_tensors) by name, for nm_gguf_find_tensor
};

typedef unsigned long long ull; // for printf

// ---- strings ------------------------------------------------------------------

static int str_cmp(const char *a, uint64_t alen, const char *b, uint64_t blen) {
    uint64_t n = alen < blen ? alen : blen;
    int c = n ? memcmp(a, b, (size_t)n) : 0;
    if (c) return c;
    return (alen > blen) - (alen < blen);
}

bool nm_str_eq(nm_str s, const char *c) {
    size_t n = strlen(c);
    return s.len == n && (n == 0 || memcmp(s.ptr, c, n) == 0);
}

// ---- value types ----------------------------------------------------------------

size_t nm_gguf_vtype_size(uint32_t vtype) {
    switch (vtype) {
    case NM_GGUF_UINT8: case NM_GGUF_INT8: case NM_GGUF_BOOL: return 1;
    case NM_GGUF_UINT16: case NM_GGUF_INT16: return 2;
    case NM_GGUF_UINT32: case NM_GGUF_INT32: case NM_GGUF_FLOAT32: return 4;
    case NM_GGUF_UINT64: case NM_GGUF_INT64: case NM_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

const char *nm_gguf_vtype_name(uint32_t vtype) {
    static const char *const names[NM_GGUF_VTYPE_COUNT] = {
        "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "str", "arr", "u64", "i64", "f64",
    };
    return vtype < NM_GGUF_VTYPE_COUNT ? names[vtype] : "?";
}

static uint32_t ld_u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t ld_u64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

uint64_t nm_gguf_value_size(uint32_t type, const void *pv) {
    const uint8_t *p = pv;
    size_t sz = nm_gguf_vtype_size(type);
    if (sz) return sz;
    if (type == NM_GGUF_STRING) return 8 + ld_u64(p);
    if (type != NM_GGUF_ARRAY) return 0;
    // Validated at open: the sizes below neither overflow nor leave the file.
    uint32_t et = ld_u32(p);
    uint64_t n = ld_u64(p + 4);
    size_t es = nm_gguf_vtype_size(et);
    if (es) return MIN_ARRAY_BYTES + n * es;
    uint64_t off = MIN_ARRAY_BYTES;
    for (uint64_t i = 0; i < n; i++) off += nm_gguf_value_size(et, p + off);
    return off;
}

// ---- parsing ----------------------------------------------------------------------

typedef struct reader {
    const uint8_t *base;
    uint64_t size;
    uint64_t pos;
    char ctx[160]; // what is being parsed ("kv 3 'general.name'"), prefixes messages
    char *err;
    size_t err_size;
} reader;

__attribute__((format(printf, 3, 4)))
static nm_status fail(reader *r, nm_status st, const char *fmt, ...) {
    char prefix[sizeof r->ctx + 2];
    snprintf(prefix, sizeof prefix, "%s: ", r->ctx);
    va_list ap;
    va_start(ap, fmt);
    nm_vfail(st, r->err, r->err_size, r->ctx[0] ? prefix : NULL, fmt, ap);
    va_end(ap);
    return st;
}

// Quoted, bounded copy of a name for messages (names are not NUL-terminated
// and may hold any bytes).
static void set_ctx(reader *r, const char *what, int64_t i, const nm_str *name) {
    if (!name) {
        snprintf(r->ctx, sizeof r->ctx, "%s %lld", what, (long long)i);
        return;
    }
    int n = name->len > 96 ? 96 : (int)name->len;
    snprintf(r->ctx, sizeof r->ctx, "%s %lld '%.*s%s'", what, (long long)i, n, name->ptr,
             name->len > 96 ? "..." : "");
}

static uint64_t left(const reader *r) { return r->size - r->pos; }

static nm_status need(reader *r, uint64_t n, const char *what) {
    if (n <= left(r)) return NM_OK;
    return fail(r, NM_ERR_FORMAT, "truncated: %s needs %llu bytes at offset %llu, file has %llu",
                what, (ull)n, (ull)r->pos, (ull)r->size);
}

static nm_status rd_u32(reader *r, uint32_t *v, const char *what) {
    nm_status st = need(r, 4, what);
    if (st) return st;
    *v = ld_u32(r->base + r->pos);
    r->pos += 4;
    return NM_OK;
}

static nm_status rd_u64(reader *r, uint64_t *v, const char *what) {
    nm_status st = need(r, 8, what);
    if (st) return st;
    *v = ld_u64(r->base + r->pos);
    r->pos += 8;
    return NM_OK;
}

static nm_status rd_str(reader *r, nm_str *s, const char *what) {
    uint64_t len;
    nm_status st = rd_u64(r, &len, what);
    if (st) return st;
    if (len > left(r))
        return fail(r, NM_ERR_FORMAT, "%s length %llu at offset %llu exceeds the %llu bytes left",
                    what, (ull)len, (ull)(r->pos - 8), (ull)left(r));
    s->ptr = (const char *)r->base + r->pos;
    s->len = len;
    r->pos += len;
    return NM_OK;
}

static nm_status rd_value(reader *r, uint32_t type, int depth);

// The n elements of an array whose header (et, n) was just read.
static nm_status rd_array_body(reader *r, uint32_t et, uint64_t n, int depth) {
    size_t es = nm_gguf_vtype_size(et);
    if (es) {
        if (n > left(r) / es)
            return fail(r, NM_ERR_FORMAT,
                        "array of %llu %s (%zu bytes each) at offset %llu exceeds the %llu bytes left",
                        (ull)n, nm_gguf_vtype_name(et), es, (ull)r->pos, (ull)left(r));
        r->pos += n * es;
        return NM_OK;
    }
    if (et != NM_GGUF_STRING && et != NM_GGUF_ARRAY)
        return fail(r, NM_ERR_FORMAT, "unknown array element type %u at offset %llu", et,
                    (ull)(r->pos - MIN_ARRAY_BYTES));
    // Each element takes at least min bytes: the loop below is bounded by the
    // file size whatever n says.
    uint64_t min = et == NM_GGUF_STRING ? 8 : MIN_ARRAY_BYTES;
    if (n > left(r) / min)
        return fail(r, NM_ERR_FORMAT,
                    "array of %llu %s at offset %llu needs at least %llu bytes each, only %llu left",
                    (ull)n, nm_gguf_vtype_name(et), (ull)r->pos, (ull)min, (ull)left(r));
    for (uint64_t i = 0; i < n; i++) {
        nm_status st = rd_value(r, et, depth);
        if (st) return st;
    }
    return NM_OK;
}

// One value of `type`; depth = arrays enclosing it.
static nm_status rd_value(reader *r, uint32_t type, int depth) {
    size_t sz = nm_gguf_vtype_size(type);
    if (sz) {
        nm_status st = need(r, sz, nm_gguf_vtype_name(type));
        if (st) return st;
        r->pos += sz;
        return NM_OK;
    }
    if (type == NM_GGUF_STRING) {
        nm_str s;
        return rd_str(r, &s, "string");
    }
    if (type != NM_GGUF_ARRAY)
        return fail(r, NM_ERR_FORMAT, "unknown value type %u at offset %llu", type,
                    (ull)(r->pos - 4));
    if (depth >= MAX_ARRAY_DEPTH)
        return fail(r, NM_ERR_FORMAT, "arrays nested deeper than %d at offset %llu",
                    MAX_ARRAY_DEPTH, (ull)r->pos);
    uint32_t et;
    uint64_t n;
    nm_status st = rd_u32(r, &et, "array element type");
    if (!st) st = rd_u64(r, &n, "array count");
    if (!st) st = rd_array_body(r, et, n, depth + 1);
    return st;
}

static int kv_ptr_cmp(const void *a, const void *b) {
    const nm_gguf_kv *x = *(const nm_gguf_kv *const *)a, *y = *(const nm_gguf_kv *const *)b;
    int c = str_cmp(x->key.ptr, x->key.len, y->key.ptr, y->key.len);
    return c ? c : (x > y) - (x < y); // ties by file order, for the message
}

static int tensor_ptr_cmp(const void *a, const void *b) {
    const nm_gguf_tensor *x = *(const nm_gguf_tensor *const *)a;
    const nm_gguf_tensor *y = *(const nm_gguf_tensor *const *)b;
    int c = str_cmp(x->name.ptr, x->name.len, y->name.ptr, y->name.len);
    return c ? c : (x > y) - (x < y);
}

static nm_status parse_header(reader *r, nm_gguf *g) {
    if (r->size < 4)
        return fail(r, NM_ERR_FORMAT, "file too small (%llu bytes) for a GGUF header",
                    (ull)r->size);
    uint32_t magic = ld_u32(r->base);
    if (magic != NM_GGUF_MAGIC)
        return fail(r, NM_ERR_FORMAT, "bad magic 0x%08x (expected \"GGUF\"): not a GGUF file",
                    magic);
    r->pos = 4;
    nm_status st = rd_u32(r, &g->version, "version");
    if (st) return st;
    if (g->version == 1)
        return fail(r, NM_ERR_UNSUPPORTED, "GGUF version 1 is not supported (only 2 and 3)");
    if (g->version != 2 && g->version != 3) {
        if ((g->version & 0xffff) == 0 && g->version != 0)
            return fail(r, NM_ERR_UNSUPPORTED,
                        "GGUF version 0x%08x: a big-endian file? only little-endian v2 and v3 "
                        "are supported", g->version);
        return fail(r, NM_ERR_UNSUPPORTED, "GGUF version %u is not supported (only 2 and 3)",
                    g->version);
    }
    uint64_t n_tensors, n_kv;
    if ((st = rd_u64(r, &n_tensors, "tensor count")) || (st = rd_u64(r, &n_kv, "kv count")))
        return st;
    // Bound both counts by what the remaining bytes could hold, before
    // anything is allocated from them.
    uint64_t rem = left(r);
    if (n_tensors > rem / MIN_TENSOR_INFO_BYTES)
        return fail(r, NM_ERR_FORMAT,
                    "tensor count %llu is impossible: the %llu bytes after the header hold at "
                    "most %llu tensor infos", (ull)n_tensors, (ull)rem,
                    (ull)(rem / MIN_TENSOR_INFO_BYTES));
    rem -= n_tensors * MIN_TENSOR_INFO_BYTES;
    if (n_kv > rem / MIN_KV_BYTES)
        return fail(r, NM_ERR_FORMAT,
                    "kv count %llu is impossible: the %llu bytes left (besides %llu tensor infos) "
                    "hold at most %llu kvs", (ull)n_kv, (ull)rem, (ull)n_tensors,
                    (ull)(rem / MIN_KV_BYTES));
    // Now n_kv, n_tensors < size / 13, so these products fit in a 64-bit
    // size_t; on 32-bit hosts they might not.
    if (n_kv > SIZE_MAX / sizeof(nm_gguf_kv) || n_tensors > SIZE_MAX / sizeof(nm_gguf_tensor))
        return fail(r, NM_ERR_NOMEM, "%llu kvs and %llu tensors do not fit in memory",
                    (ull)n_kv, (ull)n_tensors);
    g->n_kv = (int64_t)n_kv;
    g->n_tensors = (int64_t)n_tensors;
    g->kv = calloc(n_kv ? n_kv : 1, sizeof *g->kv);
    g->kv_sorted = calloc(n_kv ? n_kv : 1, sizeof *g->kv_sorted);
    g->tensors = calloc(n_tensors ? n_tensors : 1, sizeof *g->tensors);
    g->t_sorted = calloc(n_tensors ? n_tensors : 1, sizeof *g->t_sorted);
    if (!g->kv || !g->kv_sorted || !g->tensors || !g->t_sorted)
        return fail(r, NM_ERR_NOMEM, "out of memory for %llu kvs and %llu tensors",
                    (ull)n_kv, (ull)n_tensors);
    return NM_OK;
}

static nm_status parse_kvs(reader *r, nm_gguf *g) {
    for (int64_t i = 0; i < g->n_kv; i++) {
        nm_gguf_kv *kv = &g->kv[i];
        nm_status st;
        set_ctx(r, "kv", i, NULL);
        if ((st = rd_str(r, &kv->key, "key"))) return st;
        set_ctx(r, "kv", i, &kv->key);
        if ((st = rd_u32(r, &kv->type, "value type"))) return st;
        if (kv->type == NM_GGUF_ARRAY) {
            if ((st = rd_u32(r, &kv->arr_type, "array element type")) ||
                (st = rd_u64(r, &kv->arr_n, "array count")))
                return st;
            kv->data = r->base + r->pos;
            st = rd_array_body(r, kv->arr_type, kv->arr_n, 1);
        } else {
            kv->data = r->base + r->pos;
            st = rd_value(r, kv->type, 0);
        }
        if (st) return st;
        g->kv_sorted[i] = kv;
    }
    r->ctx[0] = '\0';
    if (g->n_kv > 1) qsort(g->kv_sorted, (size_t)g->n_kv, sizeof *g->kv_sorted, kv_ptr_cmp);
    for (int64_t i = 1; i < g->n_kv; i++) {
        const nm_gguf_kv *a = g->kv_sorted[i - 1], *b = g->kv_sorted[i];
        if (!str_cmp(a->key.ptr, a->key.len, b->key.ptr, b->key.len)) {
            set_ctx(r, "kv", b - g->kv, &b->key);
            return fail(r, NM_ERR_FORMAT, "duplicate key (also kv %lld)", (long long)(a - g->kv));
        }
    }

    g->alignment = NM_GGUF_DEFAULT_ALIGNMENT;
    const nm_gguf_kv *al = nm_gguf_find(g, "general.alignment");
    if (al) {
        set_ctx(r, "kv", al - g->kv, &al->key);
        if (al->type != NM_GGUF_UINT32)
            return fail(r, NM_ERR_FORMAT, "alignment has type %s, expected u32",
                        nm_gguf_vtype_name(al->type));
        uint32_t a = ld_u32(al->data);
        if (a == 0 || (a & (a - 1)))
            return fail(r, NM_ERR_FORMAT, "alignment %u is not a nonzero power of two", a);
        g->alignment = a;
        r->ctx[0] = '\0';
    }
    return NM_OK;
}

static nm_status parse_tensor_info(reader *r, nm_gguf *g, int64_t i) {
    nm_gguf_tensor *t = &g->tensors[i];
    nm_status st;
    set_ctx(r, "tensor", i, NULL);
    if ((st = rd_str(r, &t->name, "name"))) return st;
    set_ctx(r, "tensor", i, &t->name);
    if ((st = rd_u32(r, &t->n_dims, "n_dims"))) return st;
    if (t->n_dims == 0 || t->n_dims > NM_GGUF_MAX_DIMS)
        return fail(r, NM_ERR_FORMAT, "n_dims %u not in [1, %d]", t->n_dims, NM_GGUF_MAX_DIMS);
    int64_t nelem = 1;
    for (uint32_t d = 0; d < NM_GGUF_MAX_DIMS; d++) {
        t->ne[d] = 1;
        if (d >= t->n_dims) continue;
        uint64_t ne;
        if ((st = rd_u64(r, &ne, "ne"))) return st;
        if (ne == 0 || ne > (uint64_t)INT64_MAX)
            return fail(r, NM_ERR_FORMAT, "ne[%u] = %llu out of range [1, 2^63)", d, (ull)ne);
        t->ne[d] = (int64_t)ne;
        if (__builtin_mul_overflow(nelem, t->ne[d], &nelem))
            return fail(r, NM_ERR_FORMAT, "element count overflows at ne[%u] = %llu", d,
                        (ull)ne);
    }
    if ((st = rd_u32(r, &t->type, "type"))) return st;
    const nm_type_traits *tr = nm_type_traits_get(t->type);
    if (!tr) return fail(r, NM_ERR_FORMAT, "unknown tensor type %u", t->type);
    if (t->ne[0] % tr->blck_size != 0)
        return fail(r, NM_ERR_FORMAT, "row of %lld elements is not a multiple of the %s block (%lld)",
                    (long long)t->ne[0], tr->name, (long long)tr->blck_size);
    size_t row = nm_row_size(t->type, t->ne[0]);
    if (row == 0)
        return fail(r, NM_ERR_FORMAT, "byte size of a %s row of %lld elements overflows", tr->name,
                    (long long)t->ne[0]);
    if (__builtin_mul_overflow((uint64_t)row, (uint64_t)(nelem / t->ne[0]), &t->nbytes))
        return fail(r, NM_ERR_FORMAT, "byte size overflows (%lld rows of %zu bytes)",
                    (long long)(nelem / t->ne[0]), row);
    if ((st = rd_u64(r, &t->offset, "offset"))) return st;
    if (t->offset % g->alignment != 0)
        return fail(r, NM_ERR_FORMAT, "data offset %llu is not a multiple of the alignment %llu",
                    (ull)t->offset, (ull)g->alignment);
    g->t_sorted[i] = t;
    return NM_OK;
}

static int tensor_off_cmp(const void *pa, const void *pb) {
    const nm_gguf_tensor *a = *(const nm_gguf_tensor *const *)pa, *b = *(const nm_gguf_tensor *const *)pb;
    return a->offset < b->offset ? -1 : a->offset > b->offset;
}

static nm_status parse_tensors(reader *r, nm_gguf *g) {
    for (int64_t i = 0; i < g->n_tensors; i++) {
        nm_status st = parse_tensor_info(r, g, i);
        if (st) return st;
    }
    r->ctx[0] = '\0';
    // The data section starts at the header end padded to the alignment.
    // pos <= size < 2^64 - 2^32, so this cannot overflow.
    g->data_offset = (r->pos + g->alignment - 1) / g->alignment * g->alignment;
    uint64_t avail = g->data_offset < r->size ? r->size - g->data_offset : 0;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        nm_gguf_tensor *t = &g->tensors[i];
        if (t->offset > avail || t->nbytes > avail - t->offset) {
            set_ctx(r, "tensor", i, &t->name);
            uint64_t start, end;
            if (__builtin_add_overflow(g->data_offset, t->offset, &start) ||
                __builtin_add_overflow(start, t->nbytes, &end))
                return fail(r, NM_ERR_FORMAT,
                            "data at offset %llu (+%llu bytes) past end of file (%llu bytes)",
                            (ull)t->offset, (ull)t->nbytes, (ull)r->size);
            return fail(r, NM_ERR_FORMAT, "data [%llu, %llu) past end of file (%llu bytes)",
                        (ull)start, (ull)end, (ull)r->size);
        }
        t->data = r->base + g->data_offset + t->offset;
    }
    if (g->n_tensors > 1)
        qsort(g->t_sorted, (size_t)g->n_tensors, sizeof *g->t_sorted, tensor_ptr_cmp);
    for (int64_t i = 1; i < g->n_tensors; i++) {
        const nm_gguf_tensor *a = g->t_sorted[i - 1], *b = g->t_sorted[i];
        if (!str_cmp(a->name.ptr, a->name.len, b->name.ptr, b->name.len)) {
            set_ctx(r, "tensor", b - g->tensors, &b->name);
            return fail(r, NM_ERR_FORMAT, "duplicate tensor name (also tensor %lld)",
                        (long long)(a - g->tensors));
        }
    }
    // No two tensors' bytes may overlap (a changed type or shape makes one run
    // into its neighbour): sorted by offset, each must end where the next may start.
    if (g->n_tensors > 1) {
        const nm_gguf_tensor **by_off = malloc(sizeof *by_off * (size_t)g->n_tensors);
        if (!by_off) return fail(r, NM_ERR_NOMEM, "out of memory");
        for (int64_t i = 0; i < g->n_tensors; i++) by_off[i] = &g->tensors[i];
        qsort(by_off, (size_t)g->n_tensors, sizeof *by_off, tensor_off_cmp);
        for (int64_t i = 1; i < g->n_tensors; i++) {
            const nm_gguf_tensor *a = by_off[i - 1], *b = by_off[i];
            if (a->nbytes > 0 && b->nbytes > 0 && a->offset + a->nbytes > b->offset) {
                set_ctx(r, "tensor", a - g->tensors, &a->name);
                nm_status st = fail(r, NM_ERR_FORMAT,
                                    "data [%llu, %llu) overlaps tensor %lld '%.*s' (from %llu): a wrong type or shape?",
                                    (ull)a->offset, (ull)(a->offset + a->nbytes), (long long)(b - g->tensors),
                                    (int)(b->name.len > 96 ? 96 : b->name.len), b->name.ptr, (ull)b->offset);
                free(by_off);
                return st;
            }
        }
        free(by_off);
    }
    return NM_OK;
}

static void gguf_free(nm_gguf *g) {
    if (!g) return;
    free(g->kv);
    free(g->kv_sorted);
    free(g->tensors);
    free(g->t_sorted);
    if (g->mapped) munmap((void *)g->base, (size_t)g->size);
    if (g->heap) free((void *)g->base);
    free(g);
}

// Takes ownership of the mapping (if mapped) or the heap buffer (if heap)
// whatever the outcome.
static nm_status open_bytes(const void *buf, uint64_t size, bool mapped, bool heap, nm_gguf **out,
                            char *err, size_t err_size) {
    reader r = {.base = buf, .size = size, .err = err, .err_size = err_size};
    nm_gguf *g = calloc(1, sizeof *g);
    if (!g) {
        if (mapped) munmap((void *)buf, (size_t)size);
        if (heap) free((void *)buf);
        return fail(&r, NM_ERR_NOMEM, "out of memory");
    }
    g->base = buf;
    g->size = size;
    g->mapped = mapped;
    g->heap = heap;
    nm_status st = parse_header(&r, g);
    if (!st) st = parse_kvs(&r, g);
    if (!st) st = parse_tensors(&r, g);
    if (st) {
        gguf_free(g);
        return st;
    }
    *out = g;
    return NM_OK;
}

nm_status nm_gguf_open_memory(const void *buf, size_t size, nm_gguf **out, char *err,
                              size_t err_size) {
    if (err && err_size) err[0] = '\0';
    if (!out) return NM_ERR_INVALID_ARG;
    *out = NULL;
    if (!buf && size) return NM_ERR_INVALID_ARG;
    static const uint8_t empty[1];
    return open_bytes(buf ? buf : empty, size, false, false, out, err, err_size);
}

static nm_status open_path(const char *path, bool read_whole, nm_gguf **out, char *err, size_t err_size) {
    if (err && err_size) err[0] = '\0';
    if (!out) return NM_ERR_INVALID_ARG;
    *out = NULL;
    reader r = {.err = err, .err_size = err_size};
    if (!path) return fail(&r, NM_ERR_INVALID_ARG, "no path");
    // a regular file only (a FIFO is refused, never waited on); mapped, so no size cap
    int fd;
    struct stat sb;
    int64_t fsize;
    char why[512];
    nm_status ost = nm_infile_fd(path, UINT64_MAX, 0, &fd, &fsize, why, sizeof why);
    if (ost != NM_OK) return fail(&r, ost, "%s", why);
    sb.st_size = (off_t)fsize;
    if (sb.st_size < 4) {
        close(fd);
        return fail(&r, NM_ERR_FORMAT, "%s: file too small (%lld bytes) for a GGUF header", path,
                    (long long)sb.st_size);
    }
    if ((uint64_t)sb.st_size > SIZE_MAX) {
        close(fd);
        return fail(&r, NM_ERR_NOMEM, "%s: %lld bytes do not fit in the address space", path,
                    (long long)sb.st_size);
    }
    void *p;
    if (read_whole) { // into memory we own (llama.cpp's --no-mmap), page-aligned as a mapping is
        p = NULL;
        if (posix_memalign(&p, 4096, (size_t)sb.st_size) != 0) {
            close(fd);
            return fail(&r, NM_ERR_NOMEM, "%s: out of memory for %lld bytes", path, (long long)sb.st_size);
        }
        size_t got = 0;
        while (got < (size_t)sb.st_size) {
            ssize_t k = pread(fd, (uint8_t *)p + got, (size_t)sb.st_size - got, (off_t)got);
            if (k <= 0) {
                int e = k < 0 ? errno : EIO;
                close(fd);
                free(p);
                return fail(&r, NM_ERR_IO, "%s: read: %s", path, strerror(e));
            }
            got += (size_t)k;
        }
        close(fd);
    } else {
        p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        int e = errno;
        close(fd); // the mapping keeps the file
        if (p == MAP_FAILED) return fail(&r, NM_ERR_IO, "%s: mmap: %s", path, strerror(e));
    }
    nm_status st = open_bytes(p, (uint64_t)sb.st_size, !read_whole, read_whole, out, err, err_size);
    if (st && err && err_size) {
        // Prefix the path.
        char tmp[512];
        snprintf(tmp, sizeof tmp, "%s", err);
        snprintf(err, err_size, "%s: %s", path, tmp);
    }
    return st;
}

nm_status nm_gguf_open(const char *path, nm_gguf **out, char *err, size_t err_size) {
    return open_path(path, false, out, err, err_size);
}

nm_status nm_gguf_open_read(const char *path, nm_gguf **out, char *err, size_t err_size) {
    return open_path(path, true, out, err, err_size);
}

void nm_gguf_close(nm_gguf *g) { gguf_free(g); }

// ---- accessors ------------------------------------------------------------------------

uint32_t nm_gguf_version(const nm_gguf *g) { return g->version; }
uint64_t nm_gguf_alignment(const nm_gguf *g) { return g->alignment; }
uint64_t nm_gguf_file_size(const nm_gguf *g) { return g->size; }
uint64_t nm_gguf_data_offset(const nm_gguf *g) { return g->data_offset; }
int64_t nm_gguf_n_kv(const nm_gguf *g) { return g->n_kv; }
int64_t nm_gguf_n_tensors(const nm_gguf *g) { return g->n_tensors; }

const nm_gguf_kv *nm_gguf_kv_at(const nm_gguf *g, int64_t i) {
    return i >= 0 && i < g->n_kv ? &g->kv[i] : NULL;
}

const nm_gguf_tensor *nm_gguf_tensor_at(const nm_gguf *g, int64_t i) {
    return i >= 0 && i < g->n_tensors ? &g->tensors[i] : NULL;
}

const nm_gguf_kv *nm_gguf_find(const nm_gguf *g, const char *key) {
    size_t klen = strlen(key);
    int64_t lo = 0, hi = g->n_kv; // binary search in [lo, hi)
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        const nm_gguf_kv *kv = g->kv_sorted[mid];
        int c = str_cmp(kv->key.ptr, kv->key.len, key, klen);
        if (c == 0) return kv;
        if (c < 0) lo = mid + 1; else hi = mid;
    }
    return NULL;
}

const nm_gguf_tensor *nm_gguf_find_tensor(const nm_gguf *g, const char *name) {
    size_t nlen = strlen(name);
    int64_t lo = 0, hi = g->n_tensors;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        const nm_gguf_tensor *t = g->t_sorted[mid];
        int c = str_cmp(t->name.ptr, t->name.len, name, nlen);
        if (c == 0) return t;
        if (c < 0) lo = mid + 1; else hi = mid;
    }
    return NULL;
}

// ---- typed getters ------------------------------------------------------------------

// Integer value of a scalar kv: in *s (is_signed) or, for u64, in *u.
static bool kv_int(const nm_gguf_kv *kv, int64_t *s, uint64_t *u, bool *is_signed) {
    const uint8_t *p = kv->data;
    *is_signed = true;
    switch (kv->type) {
    case NM_GGUF_UINT8: *s = p[0]; return true;
    case NM_GGUF_INT8: { int8_t v; memcpy(&v, p, 1); *s = v; return true; }
    case NM_GGUF_UINT16: { uint16_t v; memcpy(&v, p, 2); *s = v; return true; }
    case NM_GGUF_INT16: { int16_t v; memcpy(&v, p, 2); *s = v; return true; }
    case NM_GGUF_UINT32: *s = ld_u32(p); return true;
    case NM_GGUF_INT32: { int32_t v; memcpy(&v, p, 4); *s = v; return true; }
    case NM_GGUF_INT64: { int64_t v; memcpy(&v, p, 8); *s = v; return true; }
    case NM_GGUF_UINT64: *u = ld_u64(p); *is_signed = false; return true;
    default: return false;
    }
}

bool nm_gguf_get_u32(const nm_gguf *g, const char *key, uint32_t *out) {
    const nm_gguf_kv *kv = nm_gguf_find(g, key);
    int64_t s = 0;
    uint64_t u = 0;
    bool sig;
    if (!kv || !kv_int(kv, &s, &u, &sig)) return false;
    if (sig) {
        if (s < 0 || s > (int64_t)UINT32_MAX) return false;
        *out = (uint32_t)s;
    } else {
        if (u > UINT32_MAX) return false;
        *out = (uint32_t)u;
    }
    return true;
}

bool nm_gguf_get_i64(const nm_gguf *g, const char *key, int64_t *out) {
    const nm_gguf_kv *kv = nm_gguf_find(g, key);
    int64_t s = 0;
    uint64_t u = 0;
    bool sig;
    if (!kv || !kv_int(kv, &s, &u, &sig)) return false;
    if (!sig) {
        if (u > (uint64_t)INT64_MAX) return false;
        s = (int64_t)u;
    }
    *out = s;
    return true;
}

bool nm_gguf_get_f32(const nm_gguf *g, const char *key, float *out) {
    const nm_gguf_kv *kv = nm_gguf_find(g, key);
    if (!kv) return false;
    if (kv->type == NM_GGUF_FLOAT32) {
        memcpy(out, kv->data, 4);
        return true;
    }
    if (kv->type == NM_GGUF_FLOAT64) {
        double d;
        memcpy(&d, kv->data, 8);
        *out = (float)d;
        return true;
    }
    return false;
}

bool nm_gguf_get_bool(const nm_gguf *g, const char *key, bool *out) {
    const nm_gguf_kv *kv = nm_gguf_find(g, key);
    if (!kv || kv->type != NM_GGUF_BOOL) return false;
    *out = kv->data[0] != 0;
    return true;
}

bool nm_gguf_get_str(const nm_gguf *g, const char *key, nm_str *out) {
    const nm_gguf_kv *kv = nm_gguf_find(g, key);
    if (!kv || kv->type != NM_GGUF_STRING) return false;
    out->len = ld_u64(kv->data);
    out->ptr = (const char *)kv->data + 8;
    return true;
}

bool nm_gguf_arr_strings(const nm_gguf_kv *kv, nm_str *out, uint64_t n) {
    if (kv->type != NM_GGUF_ARRAY || kv->arr_type != NM_GGUF_STRING || n > kv->arr_n)
        return false;
    const uint8_t *p = kv->data;
    for (uint64_t i = 0; i < n; i++) {
        out[i].len = ld_u64(p);
        out[i].ptr = (const char *)p + 8;
        p += 8 + out[i].len;
    }
    return true;
}

double nm_gguf_arr_num(const nm_gguf_kv *kv, uint64_t i) {
    if (kv->type != NM_GGUF_ARRAY || i >= kv->arr_n) return NAN;
    size_t es = nm_gguf_vtype_size(kv->arr_type);
    if (!es) return NAN;
    const uint8_t *p = kv->data + i * es;
    switch (kv->arr_type) {
    case NM_GGUF_UINT8: return p[0];
    case NM_GGUF_INT8: { int8_t v; memcpy(&v, p, 1); return v; }
    case NM_GGUF_UINT16: { uint16_t v; memcpy(&v, p, 2); return v; }
    case NM_GGUF_INT16: { int16_t v; memcpy(&v, p, 2); return v; }
    case NM_GGUF_UINT32: return ld_u32(p);
    case NM_GGUF_INT32: { int32_t v; memcpy(&v, p, 4); return v; }
    case NM_GGUF_FLOAT32: { float v; memcpy(&v, p, 4); return v; }
    case NM_GGUF_BOOL: return p[0] != 0;
    case NM_GGUF_UINT64: return (double)ld_u64(p);
    case NM_GGUF_INT64: { int64_t v; memcpy(&v, p, 8); return (double)v; }
    case NM_GGUF_FLOAT64: { double v; memcpy(&v, p, 8); return v; }
    default: return NAN;
    }
}
