// GGUF writer: metadata and tensor descriptors are built in memory; tensor data
// stays borrowed from the caller and is streamed out at write time.
// Layout: see gguf_read.c and https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
#include "gguf/gguf.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "core/outfile.h"
#include "quant/quant.h"
#include "core/fail.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF writer assumes a little-endian host"
#endif

typedef struct wbuf {
    uint8_t *p;
    size_t len, cap;
    bool oom;
} wbuf;

typedef struct wtensor {
    char *name;
    uint32_t type;
    uint32_t n_dims;
    int64_t ne[NM_GGUF_MAX_DIMS];
    uint64_t nbytes;
    const void *data; // borrowed
} wtensor;

struct nm_gguf_writer {
    uint32_t version;
    uint64_t alignment;
    wbuf kv;      // every kv, encoded, in order
    char **keys;  // (n_kv) for the uniqueness check
    int64_t n_kv, cap_kv;
    wtensor *t;   // (n_t)
    int64_t n_t, cap_t;
    char err[256];
};

static void wb_put(wbuf *b, const void *p, size_t n) {
    if (b->oom || n == 0) return;
    if (n > SIZE_MAX - b->len) { b->oom = true; return; }
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n) cap = cap > SIZE_MAX / 2 ? SIZE_MAX : cap * 2;
        uint8_t *q = realloc(b->p, cap);
        if (!q) { b->oom = true; return; }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
}
static void wb_u32(wbuf *b, uint32_t v) { wb_put(b, &v, 4); }
static void wb_u64(wbuf *b, uint64_t v) { wb_put(b, &v, 8); }
static void wb_str(wbuf *b, const char *s, size_t n) { wb_u64(b, n); wb_put(b, s, n); }

__attribute__((format(printf, 3, 4)))
static nm_status werr(nm_gguf_writer *w, nm_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    nm_vfail(st, w->err, sizeof w->err, NULL, fmt, ap);
    va_end(ap);
    return st;
}

nm_gguf_writer *nm_gguf_writer_create(void) {
    nm_gguf_writer *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->version = 3;
    w->alignment = NM_GGUF_DEFAULT_ALIGNMENT;
    return w;
}

void nm_gguf_writer_free(nm_gguf_writer *w) {
    if (!w) return;
    free(w->kv.p);
    for (int64_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    free(w->keys);
    for (int64_t i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->t);
    free(w);
}

void nm_gguf_writer_set_version(nm_gguf_writer *w, uint32_t version) {
    if (version == 2 || version == 3) w->version = version;
}

const char *nm_gguf_writer_last_error(const nm_gguf_writer *w) { return w->err; }

// Registers `key` and writes its key + type; the caller then appends the value.
static nm_status begin_kv(nm_gguf_writer *w, const char *key, uint32_t type) {
    w->err[0] = '\0';
    if (!key) return werr(w, NM_ERR_INVALID_ARG, "NULL key");
    for (int64_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->keys[i], key)) return werr(w, NM_ERR_INVALID_ARG, "duplicate key '%s'", key);
    if (w->n_kv == w->cap_kv) {
        int64_t cap = w->cap_kv ? 2 * w->cap_kv : 16;
        char **k = realloc(w->keys, (size_t)cap * sizeof *k);
        if (!k) return werr(w, NM_ERR_NOMEM, "out of memory");
        w->keys = k;
        w->cap_kv = cap;
    }
    char *copy = strdup(key);
    if (!copy) return werr(w, NM_ERR_NOMEM, "out of memory");
    w->keys[w->n_kv++] = copy;
    wb_str(&w->kv, key, strlen(key));
    wb_u32(&w->kv, type);
    return NM_OK;
}

static nm_status end_kv(nm_gguf_writer *w) {
    return w->kv.oom ? werr(w, NM_ERR_NOMEM, "out of memory") : NM_OK;
}

static nm_status add_scalar(nm_gguf_writer *w, const char *key, uint32_t type, const void *v) {
    nm_status st = begin_kv(w, key, type);
    if (st) return st;
    wb_put(&w->kv, v, nm_gguf_vtype_size(type));
    return end_kv(w);
}

nm_status nm_gguf_writer_add_u32(nm_gguf_writer *w, const char *key, uint32_t v) {
    bool is_align = key && !strcmp(key, "general.alignment");
    if (is_align && (v == 0 || (v & (v - 1))))
        return werr(w, NM_ERR_INVALID_ARG, "general.alignment %u is not a nonzero power of two", v);
    nm_status st = add_scalar(w, key, NM_GGUF_UINT32, &v);
    if (!st && is_align) w->alignment = v;
    return st;
}
nm_status nm_gguf_writer_add_i32(nm_gguf_writer *w, const char *key, int32_t v) {
    return add_scalar(w, key, NM_GGUF_INT32, &v);
}
nm_status nm_gguf_writer_add_u64(nm_gguf_writer *w, const char *key, uint64_t v) {
    return add_scalar(w, key, NM_GGUF_UINT64, &v);
}
nm_status nm_gguf_writer_add_f32(nm_gguf_writer *w, const char *key, float v) {
    return add_scalar(w, key, NM_GGUF_FLOAT32, &v);
}
nm_status nm_gguf_writer_add_bool(nm_gguf_writer *w, const char *key, bool v) {
    uint8_t b = v;
    return add_scalar(w, key, NM_GGUF_BOOL, &b);
}

nm_status nm_gguf_writer_add_str(nm_gguf_writer *w, const char *key, const char *v) {
    if (!v) return werr(w, NM_ERR_INVALID_ARG, "NULL string for '%s'", key ? key : "");
    nm_status st = begin_kv(w, key, NM_GGUF_STRING);
    if (st) return st;
    wb_str(&w->kv, v, strlen(v));
    return end_kv(w);
}

nm_status nm_gguf_writer_add_arr(nm_gguf_writer *w, const char *key, uint32_t vtype,
                                 const void *data, uint64_t n) {
    size_t es = nm_gguf_vtype_size(vtype);
    if (!es) return werr(w, NM_ERR_INVALID_ARG, "'%s': array element type %u is not a scalar",
                         key ? key : "", vtype);
    if (n > SIZE_MAX / es || (n && !data))
        return werr(w, NM_ERR_INVALID_ARG, "'%s': bad array of %llu elements", key ? key : "",
                    (unsigned long long)n);
    nm_status st = begin_kv(w, key, NM_GGUF_ARRAY);
    if (st) return st;
    wb_u32(&w->kv, vtype);
    wb_u64(&w->kv, n);
    wb_put(&w->kv, data, (size_t)(n * es));
    return end_kv(w);
}

nm_status nm_gguf_writer_add_arr_str(nm_gguf_writer *w, const char *key,
                                     const char *const *strs, uint64_t n) {
    for (uint64_t i = 0; i < n; i++)
        if (!strs[i]) return werr(w, NM_ERR_INVALID_ARG, "'%s': NULL string %llu",
                                  key ? key : "", (unsigned long long)i);
    nm_status st = begin_kv(w, key, NM_GGUF_ARRAY);
    if (st) return st;
    wb_u32(&w->kv, NM_GGUF_STRING);
    wb_u64(&w->kv, n);
    for (uint64_t i = 0; i < n; i++) wb_str(&w->kv, strs[i], strlen(strs[i]));
    return end_kv(w);
}

nm_status nm_gguf_writer_add_raw(nm_gguf_writer *w, const char *key, uint32_t type,
                                 const void *bytes, size_t nbytes) {
    if (nbytes && !bytes) return werr(w, NM_ERR_INVALID_ARG, "NULL bytes");
    nm_status st = begin_kv(w, key, type);
    if (st) return st;
    wb_put(&w->kv, bytes, nbytes);
    return end_kv(w);
}

nm_status nm_gguf_writer_add_tensor(nm_gguf_writer *w, const char *name, uint32_t type,
                                    uint32_t n_dims, const int64_t *ne, const void *data) {
    w->err[0] = '\0';
    if (!name || !ne || !data) return werr(w, NM_ERR_INVALID_ARG, "NULL name, shape or data");
    for (int64_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name))
            return werr(w, NM_ERR_INVALID_ARG, "duplicate tensor name '%s'", name);
    const nm_type_traits *tr = nm_type_traits_get(type);
    if (!tr) return werr(w, NM_ERR_INVALID_ARG, "tensor '%s': unknown type %u", name, type);
    if (n_dims == 0 || n_dims > NM_GGUF_MAX_DIMS)
        return werr(w, NM_ERR_INVALID_ARG, "tensor '%s': n_dims %u", name, n_dims);
    wtensor t = {.type = type, .n_dims = n_dims};
    int64_t nrows = 1;
    for (uint32_t d = 0; d < NM_GGUF_MAX_DIMS; d++) {
        t.ne[d] = d < n_dims ? ne[d] : 1;
        if (t.ne[d] <= 0)
            return werr(w, NM_ERR_INVALID_ARG, "tensor '%s': ne[%u] = %lld", name, d,
                        (long long)t.ne[d]);
        if (d > 0 && __builtin_mul_overflow(nrows, t.ne[d], &nrows))
            return werr(w, NM_ERR_INVALID_ARG, "tensor '%s': shape overflows", name);
    }
    size_t row = nm_row_size(type, t.ne[0]);
    if (row == 0)
        return werr(w, NM_ERR_INVALID_ARG, "tensor '%s': row of %lld is not a multiple of the %s block",
                    name, (long long)t.ne[0], tr->name);
    if (__builtin_mul_overflow((uint64_t)row, (uint64_t)nrows, &t.nbytes))
        return werr(w, NM_ERR_INVALID_ARG, "tensor '%s': byte size overflows", name);
    if (w->n_t == w->cap_t) {
        int64_t cap = w->cap_t ? 2 * w->cap_t : 16;
        wtensor *q = realloc(w->t, (size_t)cap * sizeof *q);
        if (!q) return werr(w, NM_ERR_NOMEM, "out of memory");
        w->t = q;
        w->cap_t = cap;
    }
    t.name = strdup(name);
    if (!t.name) return werr(w, NM_ERR_NOMEM, "out of memory");
    t.data = data;
    w->t[w->n_t++] = t;
    return NM_OK;
}

static uint64_t pad_to(uint64_t n, uint64_t a) { return (a - n % a) % a; }

// Output goes either to a FILE or into a wbuf.
typedef struct sink {
    FILE *f;
    wbuf *b;
    bool failed;
} sink;

static void sink_put(sink *s, const void *p, size_t n) {
    if (s->failed || n == 0) return;
    if (s->f) {
        if (fwrite(p, 1, n, s->f) != n) s->failed = true;
    } else {
        wb_put(s->b, p, n);
        if (s->b->oom) s->failed = true;
    }
}

static void sink_zeros(sink *s, uint64_t n) {
    static const uint8_t zeros[256];
    while (n > 0) {
        size_t k = n < sizeof zeros ? (size_t)n : sizeof zeros;
        sink_put(s, zeros, k);
        n -= k;
    }
}

static nm_status emit(nm_gguf_writer *w, sink *s) {
    wbuf h = {0};
    wb_u32(&h, NM_GGUF_MAGIC);
    wb_u32(&h, w->version);
    wb_u64(&h, (uint64_t)w->n_t);
    wb_u64(&h, (uint64_t)w->n_kv);
    wb_put(&h, w->kv.p, w->kv.len);
    uint64_t off = 0;
    for (int64_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        wb_str(&h, t->name, strlen(t->name));
        wb_u32(&h, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) wb_u64(&h, (uint64_t)t->ne[d]);
        wb_u32(&h, t->type);
        wb_u64(&h, off);
        off += t->nbytes + pad_to(t->nbytes, w->alignment);
    }
    if (h.oom) {
        free(h.p);
        return werr(w, NM_ERR_NOMEM, "out of memory");
    }
    sink_put(s, h.p, h.len);
    sink_zeros(s, pad_to(h.len, w->alignment));
    free(h.p);
    // Each tensor's data is padded too, so the next one starts aligned and the
    // file ends on an alignment boundary (as llama.cpp writes it).
    for (int64_t i = 0; i < w->n_t; i++) {
        sink_put(s, w->t[i].data, (size_t)w->t[i].nbytes);
        sink_zeros(s, pad_to(w->t[i].nbytes, w->alignment));
    }
    return NM_OK;
}

nm_status nm_gguf_writer_write_buf(nm_gguf_writer *w, uint8_t **out, size_t *out_size) {
    w->err[0] = '\0';
    wbuf b = {0};
    sink s = {.b = &b};
    nm_status st = emit(w, &s);
    if (!st && s.failed) st = werr(w, NM_ERR_NOMEM, "out of memory");
    if (st) {
        free(b.p);
        return st;
    }
    *out = b.p ? b.p : malloc(1);
    *out_size = b.len;
    return *out ? NM_OK : werr(w, NM_ERR_NOMEM, "out of memory");
}

nm_status nm_gguf_writer_write(nm_gguf_writer *w, const char *path) {
    w->err[0] = '\0';
    // Never damages an existing file (core/outfile.h): a temporary renamed on success.
    nm_outfile o;
    nm_status st = nm_outfile_open(&o, path, w->err, sizeof w->err);
    if (st != NM_OK) return st;
    errno = 0;
    sink s = {.f = o.f};
    st = emit(w, &s);
    if (!st && s.failed) st = werr(w, NM_ERR_IO, "%s: write failed: %s", path, strerror(errno ? errno : EIO));
    if (st) {
        nm_outfile_abort(&o);
        return st;
    }
    return nm_outfile_commit(&o, w->err, sizeof w->err);
}
