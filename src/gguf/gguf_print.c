// Human-readable dump of an opened GGUF file (`nanomind info MODEL`).
#include "gguf/gguf.h"

#include <inttypes.h>
#include <string.h>

#include "core/fail.h"
#include "quant/quant.h"

#define PRINT_STR_MAX 60 // bytes of a string shown before "..."
#define PRINT_ARR_MAX 5  // elements of an array shown

static void print_str(FILE *f, const char *s, uint64_t len) {
    fputc('"', f);
    uint64_t n = len < PRINT_STR_MAX ? len : PRINT_STR_MAX;
    for (uint64_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c < 0x20 || c == 0x7f) fprintf(f, "\\x%02x", c);
        else fputc(c, f); // UTF-8 bytes pass through
    }
    fputc('"', f);
    if (len > n) fprintf(f, "... (%" PRIu64 " bytes)", len);
}

static void print_scalar(FILE *f, uint32_t type, const uint8_t *p) {
    union { uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32;
            float f32; uint64_t u64; int64_t i64; double f64; } v;
    memcpy(&v, p, nm_gguf_vtype_size(type));
    switch (type) {
    case NM_GGUF_UINT8: fprintf(f, "%u", v.u8); break;
    case NM_GGUF_INT8: fprintf(f, "%d", v.i8); break;
    case NM_GGUF_UINT16: fprintf(f, "%u", v.u16); break;
    case NM_GGUF_INT16: fprintf(f, "%d", v.i16); break;
    case NM_GGUF_UINT32: fprintf(f, "%" PRIu32, v.u32); break;
    case NM_GGUF_INT32: fprintf(f, "%" PRId32, v.i32); break;
    case NM_GGUF_FLOAT32: fprintf(f, "%g", v.f32); break;
    case NM_GGUF_BOOL: fputs(v.u8 ? "true" : "false", f); break;
    case NM_GGUF_UINT64: fprintf(f, "%" PRIu64, v.u64); break;
    case NM_GGUF_INT64: fprintf(f, "%" PRId64, v.i64); break;
    case NM_GGUF_FLOAT64: fprintf(f, "%g", v.f64); break;
    default: fputs("?", f);
    }
}

static void print_value(FILE *f, uint32_t type, const uint8_t *p);

// Array whose first element is at p.
static void print_array(FILE *f, uint32_t et, uint64_t n, const uint8_t *p) {
    fprintf(f, "%s[%" PRIu64 "] [", nm_gguf_vtype_name(et), n);
    for (uint64_t i = 0; i < n && i < PRINT_ARR_MAX; i++) {
        if (i) fputs(", ", f);
        print_value(f, et, p);
        p += nm_gguf_value_size(et, p);
    }
    fputs(n > PRINT_ARR_MAX ? ", ...]" : "]", f);
}

// Value at p (for ARRAY: at its element type).
static void print_value(FILE *f, uint32_t type, const uint8_t *p) {
    if (type == NM_GGUF_STRING) {
        uint64_t len;
        memcpy(&len, p, 8);
        print_str(f, (const char *)p + 8, len);
    } else if (type == NM_GGUF_ARRAY) {
        uint32_t et;
        uint64_t n;
        memcpy(&et, p, 4);
        memcpy(&n, p + 4, 8);
        print_array(f, et, n, p + 12);
    } else {
        print_scalar(f, type, p);
    }
}

void nm_gguf_print_info(const nm_gguf *g, FILE *f) {
    fprintf(f, "GGUF v%u, %" PRIu64 " bytes, alignment %" PRIu64 ", data at %" PRIu64
               ", %" PRId64 " kv, %" PRId64 " tensors\n",
            nm_gguf_version(g), nm_gguf_file_size(g), nm_gguf_alignment(g),
            nm_gguf_data_offset(g), nm_gguf_n_kv(g), nm_gguf_n_tensors(g));
    for (int64_t i = 0; i < nm_gguf_n_kv(g); i++) {
        const nm_gguf_kv *kv = nm_gguf_kv_at(g, i);
        fprintf(f, "  %-40.*s %-4s = ", (int)(kv->key.len > 200 ? 200 : kv->key.len),
                kv->key.ptr, nm_gguf_vtype_name(kv->type));
        if (kv->type == NM_GGUF_ARRAY) print_array(f, kv->arr_type, kv->arr_n, kv->data);
        else print_value(f, kv->type, kv->data);
        fputc('\n', f);
    }
    uint64_t total = 0;
    fprintf(f, "  %-5s %-40s %-6s %-28s %12s\n", "#", "tensor", "type", "shape", "bytes");
    for (int64_t i = 0; i < nm_gguf_n_tensors(g); i++) {
        const nm_gguf_tensor *t = nm_gguf_tensor_at(g, i);
        const nm_type_traits *tr = nm_type_traits_get(t->type);
        char shape[96];
        int n = snprintf(shape, sizeof shape, "[");
        for (uint32_t d = 0; d < t->n_dims && n > 0 && (size_t)n < sizeof shape; d++)
            n += snprintf(shape + n, sizeof shape - (size_t)n, "%s%" PRId64, d ? ", " : "",
                          t->ne[d]);
        if (n > 0 && (size_t)n < sizeof shape) snprintf(shape + n, sizeof shape - (size_t)n, "]");
        fprintf(f, "  %-5" PRId64 " %-40.*s %-6s %-28s %12" PRIu64 "\n", i,
                (int)(t->name.len > 200 ? 200 : t->name.len), t->name.ptr,
                tr ? tr->name : "?", shape, t->nbytes);
        total += t->nbytes;
    }
    fprintf(f, "  total tensor data: %" PRIu64 " bytes (%.1f MiB)\n", total,
            (double)total / (1024.0 * 1024.0));
}

nm_status nm_gguf_arch(const char *path, char *arch, size_t size, char *err, size_t err_size) {
    if (!path || !arch || size == 0) return NM_ERR_INVALID_ARG;
    arch[0] = '\0';
    nm_gguf *g = NULL;
    nm_status st = nm_gguf_open(path, &g, err, err_size);
    if (st != NM_OK) return st;
    nm_str s;
    if (nm_gguf_get_str(g, "general.architecture", &s)) {
        const size_t n = s.len < size - 1 ? s.len : size - 1;
        memcpy(arch, s.ptr, n);
        arch[n] = '\0';
    } else {
        st = nm_fail(NM_ERR_FORMAT, err, err_size, "%s: no general.architecture", path);
    }
    nm_gguf_close(g);
    return st;
}

nm_status nm_gguf_print_file(const char *path, FILE *f, char *err, size_t err_size) {
    nm_gguf *g = NULL;
    nm_status st = nm_gguf_open(path, &g, err, err_size);
    if (st != NM_OK) return st;
    nm_gguf_print_info(g, f);
    nm_gguf_close(g);
    return NM_OK;
}
