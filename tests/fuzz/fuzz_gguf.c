// Fuzz target for the GGUF reader: open arbitrary bytes and, when they are
// accepted, touch everything the reader hands out (keys, strings, arrays of
// any nesting, tensor data bounds), as a loader would, plus the info printer.
// Seeds: tests/fuzz/corpus/gguf (written by `test_gguf --filter gen_corpus`).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"

static volatile uint64_t sink;

static uint64_t walk_value(uint32_t type, const uint8_t *p, int depth) {
    uint64_t h = 0;
    uint64_t sz = nm_gguf_value_size(type, p);
    if (sz) h += p[sz - 1];
    if (type == NM_GGUF_STRING) {
        uint64_t len;
        memcpy(&len, p, 8);
        for (uint64_t i = 0; i < len; i++) h = h * 31 + p[8 + i];
    } else if (type == NM_GGUF_ARRAY && depth < 16) {
        uint32_t et;
        uint64_t n;
        memcpy(&et, p, 4);
        memcpy(&n, p + 4, 8);
        const uint8_t *q = p + 12;
        for (uint64_t i = 0; i < n; i++) {
            h += walk_value(et, q, depth + 1);
            q += nm_gguf_value_size(et, q);
        }
        if (q != p + sz) abort(); // value_size and the walk disagree
    }
    return h;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    nm_gguf *g = NULL;
    char err[256];
    nm_status st = nm_gguf_open_memory(data, size, &g, err, sizeof err);
    if (st != NM_OK) {
        if (g || err[0] == '\0') abort(); // failures leave *out NULL and say why
        return 0;
    }
    uint64_t h = 0;
    for (int64_t i = 0; i < nm_gguf_n_kv(g); i++) {
        const nm_gguf_kv *kv = nm_gguf_kv_at(g, i);
        for (uint64_t j = 0; j < kv->key.len; j++) h = h * 31 + (uint8_t)kv->key.ptr[j];
        if (kv->type == NM_GGUF_ARRAY) {
            const uint8_t *p = kv->data;
            for (uint64_t j = 0; j < kv->arr_n; j++) {
                h += walk_value(kv->arr_type, p, 1);
                p += nm_gguf_value_size(kv->arr_type, p);
                if (nm_gguf_vtype_size(kv->arr_type)) {
                    double v = nm_gguf_arr_num(kv, j);
                    bool is_float = kv->arr_type == NM_GGUF_FLOAT32 || kv->arr_type == NM_GGUF_FLOAT64;
                    if (v != v && !is_float) abort(); // integers never read back as NaN
                    h += v > 0;
                }
            }
            if (kv->arr_type == NM_GGUF_STRING && kv->arr_n <= 4096) {
                nm_str *s = malloc((kv->arr_n ? kv->arr_n : 1) * sizeof *s);
                if (s && nm_gguf_arr_strings(kv, s, kv->arr_n) && kv->arr_n)
                    h += s[kv->arr_n - 1].len;
                free(s);
            }
        } else {
            h += walk_value(kv->type, kv->data, 0);
        }
        // Lookups by key find this kv (keys are unique) unless it holds a NUL.
        char key[128];
        if (kv->key.len < sizeof key && !memchr(kv->key.ptr, 0, kv->key.len)) {
            memcpy(key, kv->key.ptr, kv->key.len);
            key[kv->key.len] = '\0';
            if (nm_gguf_find(g, key) != kv) abort();
            uint32_t u32;
            int64_t i64;
            float f;
            bool b;
            nm_str s;
            h += nm_gguf_get_u32(g, key, &u32) + nm_gguf_get_i64(g, key, &i64) +
                 nm_gguf_get_f32(g, key, &f) + nm_gguf_get_bool(g, key, &b) +
                 nm_gguf_get_str(g, key, &s);
        }
    }
    for (int64_t i = 0; i < nm_gguf_n_tensors(g); i++) {
        const nm_gguf_tensor *t = nm_gguf_tensor_at(g, i);
        const uint8_t *d = t->data;
        if (t->nbytes == 0 || d < data || d + t->nbytes > data + size) abort();
        h += d[0] + d[t->nbytes - 1];
        char name[128];
        if (t->name.len < sizeof name && !memchr(t->name.ptr, 0, t->name.len)) {
            memcpy(name, t->name.ptr, t->name.len);
            name[t->name.len] = '\0';
            if (nm_gguf_find_tensor(g, name) != t) abort();
        }
    }
    static FILE *devnull;
    if (!devnull) devnull = fopen("/dev/null", "w");
    if (devnull) nm_gguf_print_info(g, devnull);
    sink = h;
    nm_gguf_close(g);
    return 0;
}
