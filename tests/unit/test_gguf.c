// GGUF reader/writer: round trips of every value type and several tensor
// types, v2 and custom alignment, a corpus of corrupt files that must all be
// rejected cleanly, and the real models when present.
//
// NM_VERBOSE=1 prints the rejection messages; NM_GEN_CORPUS=DIR with
// `--filter gen_corpus` writes the fuzz seed corpus (tests/fuzz/corpus/gguf).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "quant/quant.h"
#include "nmtest.h"

static bool verbose(void) {
    const char *v = getenv("NM_VERBOSE");
    return v && *v && strcmp(v, "0");
}

// Deterministic filler bytes.
static void fill(uint8_t *p, size_t n, uint32_t seed) {
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13; x ^= x >> 17; x ^= x << 5;
        p[i] = (uint8_t)x;
    }
}


// ---- the rich test file ---------------------------------------------------------

#define N_TENSORS 6
static const struct {
    const char *name;
    uint32_t type;
    uint32_t n_dims;
    int64_t ne[4];
} tensor_specs[N_TENSORS] = {
    {"token_embd.weight", NM_TYPE_F32, 1, {7}},
    {"blk.0.attn_q.weight", NM_TYPE_F16, 2, {16, 3}},
    {"blk.0.ffn_up.weight", NM_TYPE_Q4_0, 2, {64, 2}},
    {"blk.0.ffn_down.weight", NM_TYPE_Q8_0, 3, {32, 1, 2}},
    {"blk.1.attn_k.weight", NM_TYPE_Q4_K, 2, {256, 2}},
    {"output.weight", NM_TYPE_BF16, 4, {4, 3, 2, 1}},
};

static const char *const arr_strs[] = {"hello", "", "w\xc3\xb6rld", "<|im_start|>"};
static const uint32_t nested_u32[3][3] = {{1, 2, 3}, {0}, {4}};
static const uint64_t nested_n[3] = {3, 0, 1};
static const float arr_f32[5] = {1.5f, -2.25f, 0.0f, 3e10f, -1e-10f};
static const int16_t arr_i16[4] = {-32768, -1, 0, 32767};
static const double arr_f64[2] = {3.141592653589793, -1e300};
static const uint64_t arr_u64[2] = {0, UINT64_MAX};
static const uint8_t arr_bool[3] = {1, 0, 1};
static const uint8_t arr_u8[4] = {0, 1, 127, 255};

typedef struct wb { uint8_t b[1024]; size_t n; } wb;
static void wb_u32(wb *w, uint32_t v) { memcpy(w->b + w->n, &v, 4); w->n += 4; }
static void wb_u64(wb *w, uint64_t v) { memcpy(w->b + w->n, &v, 8); w->n += 8; }
static void wb_str(wb *w, const char *s) {
    wb_u64(w, strlen(s));
    memcpy(w->b + w->n, s, strlen(s));
    w->n += strlen(s);
}

// Raw encoding of an array of arrays of u32 (for add_raw).
static void enc_nested_u32(wb *w) {
    wb_u32(w, NM_GGUF_ARRAY);
    wb_u64(w, 3);
    for (int i = 0; i < 3; i++) {
        wb_u32(w, NM_GGUF_UINT32);
        wb_u64(w, nested_n[i]);
        for (uint64_t j = 0; j < nested_n[i]; j++) wb_u32(w, nested_u32[i][j]);
    }
}

// Array of 2 arrays of strings: ["a", "bc"], [].
static void enc_nested_str(wb *w) {
    wb_u32(w, NM_GGUF_ARRAY);
    wb_u64(w, 2);
    wb_u32(w, NM_GGUF_STRING);
    wb_u64(w, 2);
    wb_str(w, "a");
    wb_str(w, "bc");
    wb_u32(w, NM_GGUF_STRING);
    wb_u64(w, 0);
}

static uint8_t *tensor_data[N_TENSORS];

static void make_tensor_data(void) {
    for (int i = 0; i < N_TENSORS; i++) {
        if (tensor_data[i]) continue;
        int64_t rows = 1;
        for (uint32_t d = 1; d < tensor_specs[i].n_dims; d++) rows *= tensor_specs[i].ne[d];
        size_t n = nm_row_size(tensor_specs[i].type, tensor_specs[i].ne[0]) * (size_t)rows;
        tensor_data[i] = malloc(n);
        fill(tensor_data[i], n, (uint32_t)i + 100);
    }
}

// The rich file: every value type, nested arrays, N_TENSORS tensors.
// alignment 0: leave general.alignment out.
static nm_gguf_writer *make_rich(uint32_t version, uint32_t alignment) {
    make_tensor_data();
    nm_gguf_writer *w = nm_gguf_writer_create();
    if (!w) return NULL;
    nm_gguf_writer_set_version(w, version);
    int bad = 0;
    bad |= nm_gguf_writer_add_str(w, "general.architecture", "llama");
    if (alignment) bad |= nm_gguf_writer_add_u32(w, "general.alignment", alignment);
    uint8_t u8 = 200; int8_t i8 = -100; uint16_t u16 = 60000; int16_t i16 = -30000;
    int64_t i64 = INT64_MIN + 5; double f64 = -2.5e-300;
    bad |= nm_gguf_writer_add_raw(w, "t.u8", NM_GGUF_UINT8, &u8, 1);
    bad |= nm_gguf_writer_add_raw(w, "t.i8", NM_GGUF_INT8, &i8, 1);
    bad |= nm_gguf_writer_add_raw(w, "t.u16", NM_GGUF_UINT16, &u16, 2);
    bad |= nm_gguf_writer_add_raw(w, "t.i16", NM_GGUF_INT16, &i16, 2);
    bad |= nm_gguf_writer_add_u32(w, "t.u32", 4000000000u);
    bad |= nm_gguf_writer_add_i32(w, "t.i32", -2000000000);
    bad |= nm_gguf_writer_add_f32(w, "t.f32", 0.125f);
    bad |= nm_gguf_writer_add_bool(w, "t.bool", true);
    bad |= nm_gguf_writer_add_str(w, "t.str", "a string \xe2\x9c\x93");
    bad |= nm_gguf_writer_add_str(w, "t.empty_str", "");
    bad |= nm_gguf_writer_add_u64(w, "t.u64", UINT64_MAX - 1);
    bad |= nm_gguf_writer_add_raw(w, "t.i64", NM_GGUF_INT64, &i64, 8);
    bad |= nm_gguf_writer_add_raw(w, "t.f64", NM_GGUF_FLOAT64, &f64, 8);
    bad |= nm_gguf_writer_add_arr(w, "a.u8", NM_GGUF_UINT8, arr_u8, 4);
    bad |= nm_gguf_writer_add_arr(w, "a.i16", NM_GGUF_INT16, arr_i16, 4);
    bad |= nm_gguf_writer_add_arr(w, "a.f32", NM_GGUF_FLOAT32, arr_f32, 5);
    bad |= nm_gguf_writer_add_arr(w, "a.f64", NM_GGUF_FLOAT64, arr_f64, 2);
    bad |= nm_gguf_writer_add_arr(w, "a.u64", NM_GGUF_UINT64, arr_u64, 2);
    bad |= nm_gguf_writer_add_arr(w, "a.bool", NM_GGUF_BOOL, arr_bool, 3);
    bad |= nm_gguf_writer_add_arr(w, "a.empty", NM_GGUF_INT32, NULL, 0);
    bad |= nm_gguf_writer_add_arr_str(w, "a.str", arr_strs, 4);
    wb raw = {0};
    enc_nested_u32(&raw);
    bad |= nm_gguf_writer_add_raw(w, "a.nested_u32", NM_GGUF_ARRAY, raw.b, raw.n);
    raw.n = 0;
    enc_nested_str(&raw);
    bad |= nm_gguf_writer_add_raw(w, "a.nested_str", NM_GGUF_ARRAY, raw.b, raw.n);
    for (int i = 0; i < N_TENSORS; i++)
        bad |= nm_gguf_writer_add_tensor(w, tensor_specs[i].name, tensor_specs[i].type,
                                         tensor_specs[i].n_dims, tensor_specs[i].ne,
                                         tensor_data[i]);
    if (bad) {
        fprintf(stderr, "  writer: %s\n", nm_gguf_writer_last_error(w));
        nm_gguf_writer_free(w);
        return NULL;
    }
    return w;
}

static uint8_t *write_buf(nm_gguf_writer *w, size_t *size) {
    uint8_t *buf = NULL;
    if (!w || nm_gguf_writer_write_buf(w, &buf, size) != NM_OK) return NULL;
    return buf;
}

static bool str_is(nm_str s, const char *c) { return nm_str_eq(s, c); }

// Checks every value and tensor byte of the rich file.
static void check_rich(int *nmtest_failed, const nm_gguf *g, const uint8_t *base,
                       uint32_t version, uint64_t alignment) {
    NM_CHECK(nm_gguf_version(g) == version);
    NM_CHECK(nm_gguf_alignment(g) == alignment);
    NM_CHECK(nm_gguf_data_offset(g) % alignment == 0);
    NM_CHECK(nm_gguf_n_kv(g) == 24 + (alignment != 32 ? 1 : 0));
    NM_CHECK(nm_gguf_n_tensors(g) == N_TENSORS);
    NM_CHECK(nm_gguf_kv_at(g, -1) == NULL && nm_gguf_kv_at(g, nm_gguf_n_kv(g)) == NULL);
    NM_CHECK(str_is(nm_gguf_kv_at(g, 0)->key, "general.architecture"));

    nm_str s;
    NM_CHECK(nm_gguf_get_str(g, "general.architecture", &s) && str_is(s, "llama"));
    NM_CHECK(nm_gguf_get_str(g, "t.str", &s) && str_is(s, "a string \xe2\x9c\x93"));
    NM_CHECK(nm_gguf_get_str(g, "t.empty_str", &s) && s.len == 0);
    NM_CHECK(!nm_gguf_get_str(g, "t.u32", &s));
    NM_CHECK(!nm_gguf_get_str(g, "absent", &s));
    NM_CHECK(nm_gguf_find(g, "absent") == NULL);
    NM_CHECK(nm_gguf_find(g, "t.u") == NULL);   // prefix of a key
    NM_CHECK(nm_gguf_find(g, "t.u322") == NULL); // key + more

    uint32_t u32;
    int64_t i64;
    float f;
    bool b;
    NM_CHECK(nm_gguf_get_u32(g, "t.u8", &u32) && u32 == 200);
    NM_CHECK(nm_gguf_get_u32(g, "t.u16", &u32) && u32 == 60000);
    NM_CHECK(nm_gguf_get_u32(g, "t.u32", &u32) && u32 == 4000000000u);
    NM_CHECK(!nm_gguf_get_u32(g, "t.i8", &u32));  // negative
    NM_CHECK(!nm_gguf_get_u32(g, "t.u64", &u32)); // too big
    NM_CHECK(!nm_gguf_get_u32(g, "t.f32", &u32)); // not an integer
    NM_CHECK(!nm_gguf_get_u32(g, "t.bool", &u32));
    NM_CHECK(nm_gguf_get_i64(g, "t.i8", &i64) && i64 == -100);
    NM_CHECK(nm_gguf_get_i64(g, "t.i16", &i64) && i64 == -30000);
    NM_CHECK(nm_gguf_get_i64(g, "t.i32", &i64) && i64 == -2000000000);
    NM_CHECK(nm_gguf_get_i64(g, "t.i64", &i64) && i64 == INT64_MIN + 5);
    NM_CHECK(nm_gguf_get_i64(g, "t.u32", &i64) && i64 == 4000000000);
    NM_CHECK(!nm_gguf_get_i64(g, "t.u64", &i64)); // > INT64_MAX
    NM_CHECK(nm_gguf_get_f32(g, "t.f32", &f) && f == 0.125f);
    NM_CHECK(nm_gguf_get_f32(g, "t.f64", &f) && f == (float)-2.5e-300);
    NM_CHECK(!nm_gguf_get_f32(g, "t.i32", &f));
    NM_CHECK(nm_gguf_get_bool(g, "t.bool", &b) && b);
    NM_CHECK(!nm_gguf_get_bool(g, "t.u8", &b));
    const nm_gguf_kv *kv = nm_gguf_find(g, "t.u64");
    NM_CHECK(kv && kv->type == NM_GGUF_UINT64);
    if (kv) {
        uint64_t v;
        memcpy(&v, kv->data, 8);
        NM_CHECK(v == UINT64_MAX - 1);
    }
    kv = nm_gguf_find(g, "t.f64");
    NM_CHECK(kv && kv->type == NM_GGUF_FLOAT64);
    if (kv) {
        double v;
        memcpy(&v, kv->data, 8);
        NM_CHECK(v == -2.5e-300);
    }

    // Numeric arrays.
    kv = nm_gguf_find(g, "a.u8");
    NM_CHECK(kv && kv->type == NM_GGUF_ARRAY && kv->arr_type == NM_GGUF_UINT8 && kv->arr_n == 4);
    for (int i = 0; kv && i < 4; i++) NM_CHECK(nm_gguf_arr_num(kv, (uint64_t)i) == arr_u8[i]);
    kv = nm_gguf_find(g, "a.i16");
    NM_CHECK(kv && kv->arr_type == NM_GGUF_INT16 && kv->arr_n == 4);
    for (int i = 0; kv && i < 4; i++) NM_CHECK(nm_gguf_arr_num(kv, (uint64_t)i) == arr_i16[i]);
    kv = nm_gguf_find(g, "a.f32");
    NM_CHECK(kv && kv->arr_type == NM_GGUF_FLOAT32 && kv->arr_n == 5);
    for (int i = 0; kv && i < 5; i++) NM_CHECK(nm_gguf_arr_num(kv, (uint64_t)i) == arr_f32[i]);
    if (kv) NM_CHECK(memcmp(kv->data, arr_f32, sizeof arr_f32) == 0);
    if (kv) NM_CHECK(isnan(nm_gguf_arr_num(kv, 5))); // out of range
    kv = nm_gguf_find(g, "a.f64");
    NM_CHECK(kv && kv->arr_type == NM_GGUF_FLOAT64 && kv->arr_n == 2);
    for (int i = 0; kv && i < 2; i++) NM_CHECK(nm_gguf_arr_num(kv, (uint64_t)i) == arr_f64[i]);
    kv = nm_gguf_find(g, "a.u64");
    NM_CHECK(kv && kv->arr_type == NM_GGUF_UINT64 && kv->arr_n == 2);
    if (kv) NM_CHECK(memcmp(kv->data, arr_u64, sizeof arr_u64) == 0);
    kv = nm_gguf_find(g, "a.bool");
    NM_CHECK(kv && kv->arr_type == NM_GGUF_BOOL && kv->arr_n == 3);
    for (int i = 0; kv && i < 3; i++) NM_CHECK(nm_gguf_arr_num(kv, (uint64_t)i) == arr_bool[i]);
    kv = nm_gguf_find(g, "a.empty");
    NM_CHECK(kv && kv->arr_type == NM_GGUF_INT32 && kv->arr_n == 0);

    // Strings.
    kv = nm_gguf_find(g, "a.str");
    NM_CHECK(kv && kv->arr_type == NM_GGUF_STRING && kv->arr_n == 4);
    if (kv) {
        nm_str strs[4];
        NM_CHECK(nm_gguf_arr_strings(kv, strs, 4));
        for (int i = 0; i < 4; i++) NM_CHECK(str_is(strs[i], arr_strs[i]));
        NM_CHECK(!nm_gguf_arr_strings(kv, strs, 5));
        NM_CHECK(isnan(nm_gguf_arr_num(kv, 0)));
    }
    NM_CHECK(!nm_gguf_arr_strings(nm_gguf_find(g, "a.u8"), &s, 1));

    // Array of arrays of u32.
    kv = nm_gguf_find(g, "a.nested_u32");
    NM_CHECK(kv && kv->arr_type == NM_GGUF_ARRAY && kv->arr_n == 3);
    if (kv) {
        const uint8_t *p = kv->data;
        for (int i = 0; i < 3; i++) {
            uint32_t et;
            uint64_t n;
            memcpy(&et, p, 4);
            memcpy(&n, p + 4, 8);
            NM_CHECK(et == NM_GGUF_UINT32 && n == nested_n[i]);
            NM_CHECK(memcmp(p + 12, nested_u32[i], n * 4) == 0);
            NM_CHECK(nm_gguf_value_size(NM_GGUF_ARRAY, p) == 12 + n * 4);
            p += nm_gguf_value_size(NM_GGUF_ARRAY, p);
        }
        NM_CHECK(nm_gguf_find(g, "a.nested_str")->key.ptr == (const char *)p + 8);
    }
    // Array of arrays of strings.
    kv = nm_gguf_find(g, "a.nested_str");
    NM_CHECK(kv && kv->arr_type == NM_GGUF_ARRAY && kv->arr_n == 2);
    if (kv) {
        const uint8_t *p = kv->data;
        uint32_t et;
        uint64_t n, len;
        memcpy(&et, p, 4);
        memcpy(&n, p + 4, 8);
        NM_CHECK(et == NM_GGUF_STRING && n == 2);
        memcpy(&len, p + 12, 8);
        NM_CHECK(len == 1 && p[20] == 'a');
        NM_CHECK(nm_gguf_value_size(NM_GGUF_ARRAY, p) == 12 + 9 + 10);
        p += nm_gguf_value_size(NM_GGUF_ARRAY, p);
        memcpy(&et, p, 4);
        memcpy(&n, p + 4, 8);
        NM_CHECK(et == NM_GGUF_STRING && n == 0);
    }

    // Tensors, in file order and by name, byte for byte.
    NM_CHECK(nm_gguf_tensor_at(g, -1) == NULL && nm_gguf_tensor_at(g, N_TENSORS) == NULL);
    NM_CHECK(nm_gguf_find_tensor(g, "output") == NULL);
    NM_CHECK(nm_gguf_find_tensor(g, "output.weight.") == NULL);
    for (int i = 0; i < N_TENSORS; i++) {
        const nm_gguf_tensor *t = nm_gguf_tensor_at(g, i);
        NM_CHECK(t && str_is(t->name, tensor_specs[i].name));
        if (!t) continue;
        NM_CHECK(nm_gguf_find_tensor(g, tensor_specs[i].name) == t);
        NM_CHECK(t->type == tensor_specs[i].type);
        NM_CHECK(t->n_dims == tensor_specs[i].n_dims);
        int64_t rows = 1;
        for (uint32_t d = 0; d < 4; d++) {
            int64_t want = d < t->n_dims ? tensor_specs[i].ne[d] : 1;
            NM_CHECK(t->ne[d] == want);
            if (d) rows *= want;
        }
        uint64_t nbytes = nm_row_size(t->type, t->ne[0]) * (uint64_t)rows;
        NM_CHECK(t->nbytes == nbytes);
        NM_CHECK(t->offset % alignment == 0);
        NM_CHECK((const uint8_t *)t->data == base + nm_gguf_data_offset(g) + t->offset);
        NM_CHECK(memcmp(t->data, tensor_data[i], nbytes) == 0);
    }
}

NM_TEST(roundtrip_v3_memory) {
    size_t size = 0;
    nm_gguf_writer *w = make_rich(3, 0);
    uint8_t *buf = write_buf(w, &size);
    NM_CHECK(buf != NULL);
    if (!buf) { nm_gguf_writer_free(w); return; }
    NM_CHECK(size % 32 == 0);
    nm_gguf *g = NULL;
    char err[256] = "x";
    nm_status st = nm_gguf_open_memory(buf, size, &g, err, sizeof err);
    if (st) fprintf(stderr, "  %s\n", err);
    NM_CHECK(st == NM_OK && g != NULL && err[0] == '\0');
    if (g) check_rich(nmtest_failed, g, buf, 3, 32);
    if (g && verbose()) nm_gguf_print_info(g, stdout);
    nm_gguf_close(g);
    free(buf);
    nm_gguf_writer_free(w);
}

static char *tmp_path(const char *name) {
    const char *dir = getenv("TMPDIR");
    static char path[512];
    snprintf(path, sizeof path, "%s/nm_test_gguf_%d_%s", dir && *dir ? dir : "/tmp", (int)getpid(),
             name);
    return path;
}

static void roundtrip_file(int *nmtest_failed, uint32_t version, uint32_t alignment) {
    nm_gguf_writer *w = make_rich(version, alignment);
    size_t size = 0;
    uint8_t *buf = write_buf(w, &size);
    NM_CHECK(buf != NULL);
    const char *path = tmp_path("rt.gguf");
    nm_status st = w ? nm_gguf_writer_write(w, path) : NM_ERR_NOMEM;
    NM_CHECK(st == NM_OK);
    nm_gguf *g = NULL;
    char err[256];
    st = nm_gguf_open(path, &g, err, sizeof err);
    if (st) fprintf(stderr, "  %s\n", err);
    NM_CHECK(st == NM_OK && g);
    uint32_t al = alignment ? alignment : 32;
    if (g && buf) {
        // The file and the buffer writer produce the same bytes.
        NM_CHECK(nm_gguf_file_size(g) == size);
        const nm_gguf_tensor *t0 = nm_gguf_tensor_at(g, 0);
        const uint8_t *base = (const uint8_t *)t0->data - nm_gguf_data_offset(g) - t0->offset;
        NM_CHECK(memcmp(base, buf, size) == 0);
        NM_CHECK(size % al == 0);
        check_rich(nmtest_failed, g, base, version, al);
        // Tensor data in the mapping is aligned in memory too (mmap is page aligned).
        for (int64_t i = 0; i < nm_gguf_n_tensors(g); i++)
            NM_CHECK((uintptr_t)nm_gguf_tensor_at(g, i)->data % al == 0);
    }
    nm_gguf_close(g);
    unlink(path);
    free(buf);
    nm_gguf_writer_free(w);
}

NM_TEST(roundtrip_v3_file) { roundtrip_file(nmtest_failed, 3, 0); }
NM_TEST(roundtrip_v2_file) { roundtrip_file(nmtest_failed, 2, 0); }
NM_TEST(roundtrip_align64) { roundtrip_file(nmtest_failed, 3, 64); }
NM_TEST(roundtrip_align4096_v2) { roundtrip_file(nmtest_failed, 2, 4096); }

NM_TEST(empty_file_is_valid) {
    nm_gguf_writer *w = nm_gguf_writer_create();
    size_t size = 0;
    uint8_t *buf = write_buf(w, &size);
    NM_CHECK(buf && size == 32); // 24-byte header padded to 32
    nm_gguf *g = NULL;
    NM_CHECK(buf && nm_gguf_open_memory(buf, size, &g, NULL, 0) == NM_OK);
    NM_CHECK(g && nm_gguf_n_kv(g) == 0 && nm_gguf_n_tensors(g) == 0);
    if (g) NM_CHECK(nm_gguf_find(g, "x") == NULL && nm_gguf_find_tensor(g, "x") == NULL);
    nm_gguf_close(g);
    // Without the trailing padding: still valid (no tensor data to find).
    g = NULL;
    NM_CHECK(buf && nm_gguf_open_memory(buf, 24, &g, NULL, 0) == NM_OK);
    nm_gguf_close(g);
    free(buf);
    nm_gguf_writer_free(w);
    nm_gguf_close(NULL);
    nm_gguf_writer_free(NULL);
}

NM_TEST(writer_rejects_bad_input) {
    nm_gguf_writer *w = nm_gguf_writer_create();
    NM_CHECK(w != NULL);
    if (!w) return;
    float x[64] = {0};
    int64_t ne[4] = {64, 1, 1, 1};
    NM_CHECK(nm_gguf_writer_add_u32(w, "k", 1) == NM_OK);
    NM_CHECK(nm_gguf_writer_add_str(w, "k", "dup") == NM_ERR_INVALID_ARG);
    NM_CHECK(strstr(nm_gguf_writer_last_error(w), "duplicate") != NULL);
    NM_CHECK(nm_gguf_writer_add_u32(w, "general.alignment", 0) == NM_ERR_INVALID_ARG);
    NM_CHECK(nm_gguf_writer_add_u32(w, "general.alignment", 48) == NM_ERR_INVALID_ARG);
    NM_CHECK(nm_gguf_writer_add_arr(w, "a", NM_GGUF_STRING, x, 1) == NM_ERR_INVALID_ARG);
    NM_CHECK(nm_gguf_writer_add_tensor(w, "t", NM_TYPE_F32, 1, ne, x) == NM_OK);
    NM_CHECK(nm_gguf_writer_add_tensor(w, "t", NM_TYPE_F32, 1, ne, x) == NM_ERR_INVALID_ARG);
    NM_CHECK(nm_gguf_writer_add_tensor(w, "u", 4, 1, ne, x) == NM_ERR_INVALID_ARG);
    NM_CHECK(nm_gguf_writer_add_tensor(w, "u", NM_TYPE_F32, 5, ne, x) == NM_ERR_INVALID_ARG);
    NM_CHECK(nm_gguf_writer_add_tensor(w, "u", NM_TYPE_Q4_0, 1, (int64_t[]){33}, x) ==
             NM_ERR_INVALID_ARG);
    NM_CHECK(nm_gguf_writer_add_tensor(w, "u", NM_TYPE_F32, 2, (int64_t[]){4, 0}, x) ==
             NM_ERR_INVALID_ARG);
    NM_CHECK(nm_gguf_writer_write(w, "/nonexistent-dir/x.gguf") == NM_ERR_IO);
    NM_CHECK(nm_gguf_writer_last_error(w)[0] != '\0');
    nm_gguf_writer_free(w);
}

// The writer never damages an existing file (core/outfile.h): a write that
// fails half way (here a file-size limit, as a full disk) leaves the old file
// as it was and no temporary beside it; a good write replaces it whole and
// keeps its mode. Run in a child: the limit is per process.
static int count_temporaries(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += strstr(e->d_name, ".nm-") != NULL;
    if (d) closedir(d);
    return n;
}

NM_TEST(writer_never_damages_an_existing_file) {
    char dir[] = "/tmp/nm_gguf_outXXXXXX", path[64];
    NM_CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/old.gguf", dir);
    FILE *f = fopen(path, "wb");
    NM_CHECK(f && fputs("old contents\n", f) >= 0 && fclose(f) == 0);
    chmod(path, 0640);
    static float big[1 << 18]; // 1 MiB of tensor data
    const int64_t ne[1] = {1 << 18};
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {64 * 1024, 64 * 1024};
        setrlimit(RLIMIT_FSIZE, &rl);
        nm_gguf_writer *w = nm_gguf_writer_create();
        nm_status st = w && nm_gguf_writer_add_tensor(w, "t", NM_TYPE_F32, 1, ne, big) == NM_OK
                           ? nm_gguf_writer_write(w, path) : NM_ERR_NOMEM;
        if (w) fprintf(stderr, "  write past the limit: %s\n", nm_gguf_writer_last_error(w));
        _exit(st == NM_ERR_IO && strstr(nm_gguf_writer_last_error(w), "File too large") ? 0 : 1);
    }
    int ws = 0;
    NM_CHECK(pid > 0 && waitpid(pid, &ws, 0) == pid && WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    char got[64] = "";
    f = fopen(path, "rb");
    NM_CHECK(f && fgets(got, sizeof got, f) && !strcmp(got, "old contents\n"));
    if (f) fclose(f);
    NM_CHECK(count_temporaries(dir) == 0);
    // A good write replaces it, whole, with the old mode.
    nm_gguf_writer *w = nm_gguf_writer_create();
    NM_CHECK(w && nm_gguf_writer_add_tensor(w, "t", NM_TYPE_F32, 1, ne, big) == NM_OK &&
             nm_gguf_writer_write(w, path) == NM_OK);
    nm_gguf_writer_free(w);
    struct stat sb;
    NM_CHECK(stat(path, &sb) == 0 && (sb.st_mode & 0777) == 0640 && sb.st_size > (off_t)sizeof big);
    nm_gguf *g = NULL;
    NM_CHECK(nm_gguf_open(path, &g, NULL, 0) == NM_OK);
    nm_gguf_close(g);
    NM_CHECK(count_temporaries(dir) == 0);
    unlink(path);
    NM_CHECK(rmdir(dir) == 0);
}

NM_TEST(open_errors) {
    nm_gguf *g = (nm_gguf *)1;
    char err[256] = "";
    NM_CHECK(nm_gguf_open("/nonexistent/file.gguf", &g, err, sizeof err) == NM_ERR_IO);
    NM_CHECK(g == NULL && strstr(err, "/nonexistent/file.gguf") != NULL);
    NM_CHECK(nm_gguf_open("/", &g, err, sizeof err) == NM_ERR_IO);
    NM_CHECK(nm_gguf_open_memory(NULL, 0, &g, err, sizeof err) == NM_ERR_FORMAT);
    NM_CHECK(err[0] != '\0');
    // A tiny error buffer is truncated, not overrun.
    char small[8];
    NM_CHECK(nm_gguf_open_memory("GGUF\x01\0\0\0", 8, &g, small, sizeof small) ==
             NM_ERR_UNSUPPORTED);
    NM_CHECK(strlen(small) == 7);
}

// ---- corrupt files ------------------------------------------------------------------

static void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

// A small valid file (~400 bytes) whose fields the corrupt cases patch.
static uint8_t *make_seed(size_t *size) {
    static float a[8];
    static uint8_t b[36];
    static uint16_t c[8];
    fill((uint8_t *)a, sizeof a, 1);
    fill(b, sizeof b, 2);
    fill((uint8_t *)c, sizeof c, 3);
    nm_gguf_writer *w = nm_gguf_writer_create();
    if (!w) return NULL;
    static const uint32_t u[3] = {1, 2, 3};
    static const char *const strs[2] = {"a", "bc"};
    wb raw = {0};
    wb_u32(&raw, NM_GGUF_ARRAY); // [[7], [8, 9]]
    wb_u64(&raw, 2);
    wb_u32(&raw, NM_GGUF_UINT32);
    wb_u64(&raw, 1);
    wb_u32(&raw, 7);
    wb_u32(&raw, NM_GGUF_UINT32);
    wb_u64(&raw, 2);
    wb_u32(&raw, 8);
    wb_u32(&raw, 9);
    int bad = nm_gguf_writer_add_str(w, "general.architecture", "llama");
    bad |= nm_gguf_writer_add_arr(w, "t.arr_u32", NM_GGUF_UINT32, u, 3);
    bad |= nm_gguf_writer_add_arr_str(w, "t.arr_str", strs, 2);
    bad |= nm_gguf_writer_add_raw(w, "t.nested", NM_GGUF_ARRAY, raw.b, raw.n);
    bad |= nm_gguf_writer_add_tensor(w, "a.weight", NM_TYPE_F32, 1, (int64_t[]){8}, a);
    bad |= nm_gguf_writer_add_tensor(w, "b.weight", NM_TYPE_Q4_0, 2, (int64_t[]){32, 2}, b);
    bad |= nm_gguf_writer_add_tensor(w, "c.weight", NM_TYPE_F16, 2, (int64_t[]){4, 2}, c);
    uint8_t *buf = bad ? NULL : write_buf(w, size);
    nm_gguf_writer_free(w);
    return buf;
}

// Byte offsets of the seed's fields, found by reading it.
typedef struct layout {
    size_t kv_keylen[4], kv_type[4], kv_data[4];
    size_t t_namelen[3], t_ndims[3], t_ne[3], t_type[3], t_off[3];
    size_t header_end, data_off, data_end;
} layout;

static bool seed_layout(const uint8_t *buf, size_t size, layout *l) {
    nm_gguf *g = NULL;
    if (nm_gguf_open_memory(buf, size, &g, NULL, 0) != NM_OK) return false;
    if (nm_gguf_n_kv(g) != 4 || nm_gguf_n_tensors(g) != 3) { nm_gguf_close(g); return false; }
    for (int i = 0; i < 4; i++) {
        const nm_gguf_kv *kv = nm_gguf_kv_at(g, i);
        l->kv_keylen[i] = (size_t)((const uint8_t *)kv->key.ptr - buf) - 8;
        l->kv_type[i] = (size_t)((const uint8_t *)kv->key.ptr - buf) + kv->key.len;
        l->kv_data[i] = (size_t)(kv->data - buf);
    }
    l->data_end = 0;
    for (int i = 0; i < 3; i++) {
        const nm_gguf_tensor *t = nm_gguf_tensor_at(g, i);
        l->t_namelen[i] = (size_t)((const uint8_t *)t->name.ptr - buf) - 8;
        l->t_ndims[i] = (size_t)((const uint8_t *)t->name.ptr - buf) + t->name.len;
        l->t_ne[i] = l->t_ndims[i] + 4;
        l->t_type[i] = l->t_ne[i] + 8 * t->n_dims;
        l->t_off[i] = l->t_type[i] + 4;
        size_t end = (size_t)((const uint8_t *)t->data - buf) + t->nbytes;
        if (end > l->data_end) l->data_end = end;
    }
    l->header_end = l->t_off[2] + 8;
    l->data_off = nm_gguf_data_offset(g);
    nm_gguf_close(g);
    return true;
}

typedef struct gcase {
    char name[48];
    uint8_t *buf;
    size_t size;
    nm_status want; // NM_OK for the valid ones
} gcase;

typedef struct gcases {
    gcase c[160];
    int n;
} gcases;

static void add_case(gcases *cs, const char *name, const uint8_t *buf, size_t size, nm_status want) {
    if (cs->n >= (int)(sizeof cs->c / sizeof cs->c[0]) || !buf) return;
    gcase *c = &cs->c[cs->n++];
    snprintf(c->name, sizeof c->name, "%s", name);
    c->buf = malloc(size ? size : 1);
    memcpy(c->buf, buf, size);
    c->size = size;
    c->want = want;
}

// The seed with a u32 / u64 / bytes patched at off.
static void add_u32(gcases *cs, const char *name, const uint8_t *seed, size_t size, size_t off,
                    uint32_t v, nm_status want) {
    add_case(cs, name, seed, size, want);
    put_u32(cs->c[cs->n - 1].buf + off, v);
}
static void add_u64(gcases *cs, const char *name, const uint8_t *seed, size_t size, size_t off,
                    uint64_t v) {
    add_case(cs, name, seed, size, NM_ERR_FORMAT);
    put_u64(cs->c[cs->n - 1].buf + off, v);
}
static void add_bytes(gcases *cs, const char *name, const uint8_t *seed, size_t size, size_t off,
                      const char *bytes) {
    add_case(cs, name, seed, size, NM_ERR_FORMAT);
    memcpy(cs->c[cs->n - 1].buf + off, bytes, strlen(bytes));
}

// A file with `key` of type `type` holding raw bytes, plus one tensor.
static void add_raw_file(gcases *cs, const char *name, const char *key, uint32_t type,
                         const void *bytes, size_t n, nm_status want) {
    static const float x[4] = {1, 2, 3, 4};
    nm_gguf_writer *w = nm_gguf_writer_create();
    if (!w) return;
    nm_gguf_writer_add_str(w, "general.architecture", "llama");
    nm_gguf_writer_add_raw(w, key, type, bytes, n);
    nm_gguf_writer_add_tensor(w, "x", NM_TYPE_F32, 1, (int64_t[]){4}, x);
    size_t size = 0;
    uint8_t *buf = write_buf(w, &size);
    add_case(cs, name, buf, size, want);
    free(buf);
    nm_gguf_writer_free(w);
}

// Arrays nested `depth` deep around one u8.
static void add_nested(gcases *cs, const char *name, int depth, nm_status want) {
    wb raw = {0};
    for (int i = 1; i < depth; i++) {
        wb_u32(&raw, NM_GGUF_ARRAY);
        wb_u64(&raw, 1);
    }
    wb_u32(&raw, NM_GGUF_UINT8);
    wb_u64(&raw, 1);
    raw.b[raw.n++] = 42;
    add_raw_file(cs, name, "t.deep", NM_GGUF_ARRAY, raw.b, raw.n, want);
}

// Every named case (valid ones included); truncations are generated by the callers.
static bool make_cases(gcases *cs, uint8_t **seed_out, size_t *seed_size, layout *l) {
    size_t n = 0;
    uint8_t *s = make_seed(&n);
    if (!s || !seed_layout(s, n, l)) { free(s); return false; }
    *seed_out = s;
    *seed_size = n;
    const nm_status F = NM_ERR_FORMAT, U = NM_ERR_UNSUPPORTED;
    const uint64_t H63 = 1ull << 63, MAX = UINT64_MAX;

    add_case(cs, "ok-seed", s, n, NM_OK);
    {
        uint8_t *t = malloc(n + 100);
        memcpy(t, s, n);
        fill(t + n, 100, 9);
        add_case(cs, "ok-trailing-bytes", t, n + 100, NM_OK);
        free(t);
    }
    add_nested(cs, "ok-nested-depth8", 8, NM_OK);
    {
        nm_gguf_writer *w = nm_gguf_writer_create();
        size_t en = 0;
        uint8_t *e = write_buf(w, &en);
        add_case(cs, "ok-empty", e, en, NM_OK);
        add_case(cs, "ok-empty-unpadded", e, 24, NM_OK);
        free(e);
        nm_gguf_writer_free(w);
    }

    add_bytes(cs, "bad-magic", s, n, 0, "GGUX");
    add_bytes(cs, "bad-magic-ggml", s, n, 0, "ggml");
    add_u32(cs, "bad-version-0", s, n, 4, 0, U);
    add_u32(cs, "bad-version-1", s, n, 4, 1, U);
    add_u32(cs, "bad-version-4", s, n, 4, 4, U);
    add_u32(cs, "bad-version-99", s, n, 4, 99, U);
    add_u32(cs, "bad-version-bigendian", s, n, 4, 0x03000000u, U);

    add_u64(cs, "bad-n-tensors-2e63", s, n, 8, H63);
    add_u64(cs, "bad-n-tensors-max", s, n, 8, MAX);
    add_u64(cs, "bad-n-tensors-1e6", s, n, 8, 1000000);
    add_u64(cs, "bad-n-kv-2e63", s, n, 16, H63);
    add_u64(cs, "bad-n-kv-max", s, n, 16, MAX);
    add_u64(cs, "bad-n-kv-1e6", s, n, 16, 1000000);

    add_u64(cs, "bad-key-len-max", s, n, l->kv_keylen[0], MAX);
    add_u64(cs, "bad-key-len-2e63", s, n, l->kv_keylen[0], H63);
    add_u64(cs, "bad-key-len-filesize", s, n, l->kv_keylen[1], n);
    add_u64(cs, "bad-str-len-max", s, n, l->kv_data[0], MAX);
    add_u64(cs, "bad-str-len-filesize", s, n, l->kv_data[0], n);
    add_u32(cs, "bad-vtype-13", s, n, l->kv_type[0], 13, F);
    add_u32(cs, "bad-vtype-max", s, n, l->kv_type[2], UINT32_MAX, F);

    // t.arr_u32: type at kv_type[1], elem type +4, count +8.
    add_u64(cs, "bad-arr-n-2e62", s, n, l->kv_type[1] + 8, 1ull << 62); // x4 wraps
    add_u64(cs, "bad-arr-n-max", s, n, l->kv_type[1] + 8, MAX);
    add_u64(cs, "bad-arr-n-past-end", s, n, l->kv_type[1] + 8, n / 4);
    add_u32(cs, "bad-arr-elem-type-13", s, n, l->kv_type[1] + 4, 13, F);
    add_u32(cs, "bad-arr-elem-type-max", s, n, l->kv_type[1] + 4, UINT32_MAX, F);
    // t.arr_str: count, and the first string's length.
    add_u64(cs, "bad-str-arr-n-max", s, n, l->kv_type[2] + 8, MAX);
    add_u64(cs, "bad-str-arr-n-2e61", s, n, l->kv_type[2] + 8, 1ull << 61); // x8 wraps
    add_u64(cs, "bad-str-arr-elem-len-max", s, n, l->kv_data[2], MAX);
    // t.nested: outer count, first inner array's type and count.
    add_u64(cs, "bad-nested-n-max", s, n, l->kv_type[3] + 8, MAX);
    add_u64(cs, "bad-nested-inner-n-max", s, n, l->kv_data[3] + 4, MAX);
    add_u64(cs, "bad-nested-inner-n-2e62", s, n, l->kv_data[3] + 4, 1ull << 62);
    add_u32(cs, "bad-nested-inner-type-99", s, n, l->kv_data[3], 99, F);
    add_nested(cs, "bad-nested-depth9", 9, F);

    add_bytes(cs, "bad-dup-key", s, n, l->kv_keylen[2] + 8 + 6, "u32");
    add_bytes(cs, "bad-dup-tensor", s, n, l->t_namelen[1] + 8, "a");

    // Tensor 0: a.weight f32 [8]; 1: b.weight q4_0 [32, 2]; 2: c.weight f16 [4, 2] (last in data).
    add_u64(cs, "bad-tensor-name-len-max", s, n, l->t_namelen[0], MAX);
    add_u32(cs, "bad-tensor-type-4", s, n, l->t_type[0], 4, F);
    add_u32(cs, "bad-tensor-type-40", s, n, l->t_type[1], 40, F);
    add_u32(cs, "bad-tensor-type-max", s, n, l->t_type[2], UINT32_MAX, F);
    add_u32(cs, "bad-tensor-block", s, n, l->t_type[0], NM_TYPE_Q4_0, F); // 8 % 32
    add_u32(cs, "bad-n-dims-0", s, n, l->t_ndims[0], 0, F);
    add_u32(cs, "bad-n-dims-5", s, n, l->t_ndims[1], 5, F);
    add_u32(cs, "bad-n-dims-max", s, n, l->t_ndims[2], UINT32_MAX, F);
    add_u64(cs, "bad-ne0-zero", s, n, l->t_ne[0], 0);
    add_u64(cs, "bad-ne1-zero", s, n, l->t_ne[1] + 8, 0);
    add_u64(cs, "bad-ne-2e63", s, n, l->t_ne[1], H63);
    add_u64(cs, "bad-ne-max", s, n, l->t_ne[2] + 8, MAX);
    add_u64(cs, "bad-ne-product-overflow", s, n, l->t_ne[1] + 8, 1ull << 62);
    add_u64(cs, "bad-row-size-overflow", s, n, l->t_ne[0], 1ull << 62);
    add_u64(cs, "bad-ne-past-end", s, n, l->t_ne[2] + 8, 1000);
    add_u64(cs, "bad-offset-past-end", s, n, l->t_off[2], (n + 31) / 32 * 32);
    add_u64(cs, "bad-offset-max", s, n, l->t_off[0], MAX - 31); // aligned, start overflows
    add_u64(cs, "bad-offset-misaligned-1", s, n, l->t_off[1], 33);
    add_u64(cs, "bad-offset-misaligned-16", s, n, l->t_off[2], 16);

    uint32_t a0 = 0, a3 = 3;
    uint64_t a64 = 32;
    int32_t ai = 32;
    add_raw_file(cs, "bad-align-0", "general.alignment", NM_GGUF_UINT32, &a0, 4, F);
    add_raw_file(cs, "bad-align-3", "general.alignment", NM_GGUF_UINT32, &a3, 4, F);
    add_raw_file(cs, "bad-align-u64", "general.alignment", NM_GGUF_UINT64, &a64, 8, F);
    add_raw_file(cs, "bad-align-i32", "general.alignment", NM_GGUF_INT32, &ai, 4, F);
    add_raw_file(cs, "bad-align-str", "general.alignment", NM_GGUF_STRING,
                 "\x02\0\0\0\0\0\0\0" "32", 10, F);
    return true;
}

static void free_cases(gcases *cs) {
    for (int i = 0; i < cs->n; i++) free(cs->c[i].buf);
    cs->n = 0;
}

// Touches everything an opened file exposes, as a loader would.
static uint64_t walk(const nm_gguf *g) {
    uint64_t h = 0;
    for (int64_t i = 0; i < nm_gguf_n_kv(g); i++) {
        const nm_gguf_kv *kv = nm_gguf_kv_at(g, i);
        for (uint64_t j = 0; j < kv->key.len; j++) h = h * 31 + (uint8_t)kv->key.ptr[j];
        if (kv->type == NM_GGUF_ARRAY) {
            const uint8_t *p = kv->data;
            for (uint64_t j = 0; j < kv->arr_n; j++) {
                uint64_t sz = nm_gguf_value_size(kv->arr_type, p);
                if (sz) h += p[sz - 1];
                p += sz;
            }
        } else {
            uint64_t sz = nm_gguf_value_size(kv->type, kv->data);
            if (sz) h += kv->data[sz - 1];
        }
    }
    for (int64_t i = 0; i < nm_gguf_n_tensors(g); i++) {
        const nm_gguf_tensor *t = nm_gguf_tensor_at(g, i);
        const uint8_t *d = t->data;
        h += d[0] + d[t->nbytes - 1];
    }
    return h;
}

// Opens a copy of exactly `size` bytes (so ASan sees any read past the end).
static nm_status open_copy(const uint8_t *buf, size_t size, char *err, size_t err_size) {
    uint8_t *copy = malloc(size ? size : 1);
    memcpy(copy, buf, size);
    nm_gguf *g = NULL;
    nm_status st = nm_gguf_open_memory(copy, size, &g, err, err_size);
    if (st == NM_OK) {
        (void)walk(g);
        nm_gguf_close(g);
    } else if (g != NULL) {
        st = NM_ERR_INVALID_ARG; // *out must stay NULL on failure
    }
    free(copy);
    return st;
}

NM_TEST(corrupt_named_cases) {
    gcases *cs = calloc(1, sizeof *cs);
    uint8_t *seed = NULL;
    size_t n = 0;
    layout l;
    NM_CHECK(cs && make_cases(cs, &seed, &n, &l));
    if (!cs || !seed) { free(cs); return; }
    NM_CHECK(cs->n >= 60);
    for (int i = 0; i < cs->n; i++) {
        char err[256] = "";
        nm_status st = open_copy(cs->c[i].buf, cs->c[i].size, err, sizeof err);
        if (st != cs->c[i].want || (st != NM_OK && err[0] == '\0')) {
            fprintf(stderr, "  %s: got %d (%s), want %d\n", cs->c[i].name, st, err, cs->c[i].want);
            *nmtest_failed = 1;
        }
        if (st != NM_OK && verbose()) printf("    %-28s %s\n", cs->c[i].name, err);
    }
    free_cases(cs);
    free(cs);
    free(seed);
}

NM_TEST(corrupt_truncated_everywhere) {
    uint8_t *seed = NULL;
    size_t n = 0;
    layout l;
    gcases *cs = calloc(1, sizeof *cs);
    NM_CHECK(cs && make_cases(cs, &seed, &n, &l));
    if (!cs || !seed) { free(cs); return; }
    free_cases(cs);
    NM_CHECK(l.data_end <= n && l.data_end > l.data_off); // the writer pads past the last tensor
    // Every prefix shorter than the end of the last tensor's data is corrupt.
    int bad = 0;
    for (size_t len = 0; len < l.data_end; len++) {
        char err[256] = "";
        nm_status st = open_copy(seed, len, err, sizeof err);
        if (st != NM_ERR_FORMAT || err[0] == '\0') {
            if (bad++ < 5) fprintf(stderr, "  truncated at %zu: got %d (%s)\n", len, st, err);
            *nmtest_failed = 1;
        }
        if (verbose() && (len == 3 || len == 20 || len == l.kv_keylen[1] + 3 ||
                          len == l.t_ne[1] + 2 || len == l.header_end || len == l.data_end - 1))
            printf("    truncated at %-4zu %s\n", len, err);
    }
    free(cs);
    free(seed);
}

// Every header byte set to a few values: any outcome but a crash (ASan/UBSan
// watch this one), and an error always comes with a message.
NM_TEST(corrupt_byte_flips) {
    uint8_t *seed = NULL;
    size_t n = 0;
    layout l;
    gcases *cs = calloc(1, sizeof *cs);
    NM_CHECK(cs && make_cases(cs, &seed, &n, &l));
    if (!cs || !seed) { free(cs); return; }
    free_cases(cs);
    static const uint8_t vals[] = {0x00, 0x01, 0x7f, 0x80, 0xff};
    uint8_t *buf = malloc(n);
    int n_ok = 0, n_err = 0;
    for (size_t off = 0; off < l.data_off; off++) {
        for (size_t v = 0; v < sizeof vals; v++) {
            memcpy(buf, seed, n);
            if (buf[off] == vals[v]) continue;
            buf[off] = vals[v];
            char err[256] = "";
            nm_status st = open_copy(buf, n, err, sizeof err);
            if (st == NM_OK) n_ok++;
            else n_err++;
            NM_CHECK(st == NM_OK || st == NM_ERR_FORMAT || st == NM_ERR_UNSUPPORTED);
            NM_CHECK(st == NM_OK || err[0] != '\0');
        }
    }
    if (verbose()) printf("    %d flips accepted, %d rejected\n", n_ok, n_err);
    NM_CHECK(n_err > 0);
    free(buf);
    free(cs);
    free(seed);
}

// Writes the fuzz seed corpus into $NM_GEN_CORPUS: the named cases and
// truncations at the section boundaries of the seed.
NM_TEST_OPTIN(gen_corpus, "NM_GEN_CORPUS") {
    const char *dir = getenv("NM_GEN_CORPUS");
    gcases *cs = calloc(1, sizeof *cs);
    uint8_t *seed = NULL;
    size_t n = 0;
    layout l;
    NM_CHECK(cs && make_cases(cs, &seed, &n, &l));
    if (!cs || !seed) { free(cs); return; }
    const size_t cuts[] = {3, 7, 16, 24, l.kv_keylen[1] + 5, l.kv_data[3] + 6,
                           l.t_namelen[0], l.t_ne[1] + 4, l.header_end, l.data_off + 10};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        char name[48];
        snprintf(name, sizeof name, "trunc-%zu", cuts[i]);
        add_case(cs, name, seed, cuts[i], NM_ERR_FORMAT);
    }
    for (int v = 3; v >= 2; v--) { // the rich file, v3 and v2
        nm_gguf_writer *w = make_rich((uint32_t)v, v == 2 ? 64 : 0);
        size_t rn = 0;
        uint8_t *rich = write_buf(w, &rn);
        add_case(cs, v == 3 ? "ok-rich-v3" : "ok-rich-v2-align64", rich, rn, NM_OK);
        free(rich);
        nm_gguf_writer_free(w);
    }
    char d[1024]; // mkdir -p
    snprintf(d, sizeof d, "%s", dir);
    for (char *p = d + 1; *p; p++)
        if (*p == '/') { *p = '\0'; mkdir(d, 0755); *p = '/'; }
    mkdir(d, 0755);
    // Near-duplicates of other cases add nothing to a seed corpus.
    static const char *const skip[] = {"bad-version-4", "bad-n-tensors-max", "bad-n-kv-max",
        "bad-key-len-2e63", "bad-str-len-filesize", "bad-arr-n-max", "bad-arr-elem-type-max",
        "bad-str-arr-n-2e61", "bad-nested-inner-n-2e62", "bad-tensor-type-max", "bad-n-dims-max",
        "bad-ne-max", "bad-magic-ggml", "bad-align-i32", "trunc-3", "trunc-16", "ok-empty-unpadded"};
    int written = 0;
    for (int i = 0; i < cs->n; i++) {
        bool skipped = false;
        for (size_t k = 0; k < sizeof skip / sizeof skip[0]; k++)
            skipped |= !strcmp(cs->c[i].name, skip[k]);
        if (skipped) continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s.gguf", dir, cs->c[i].name);
        FILE *f = fopen(path, "wb");
        NM_CHECK(f != NULL);
        if (!f) continue;
        NM_CHECK(cs->c[i].size < 4096);
        NM_CHECK(fwrite(cs->c[i].buf, 1, cs->c[i].size, f) == cs->c[i].size || cs->c[i].size == 0);
        fclose(f);
        written++;
    }
    printf("    wrote %d files to %s\n", written, dir);
    free_cases(cs);
    free(cs);
    free(seed);
}

// ---- real models ------------------------------------------------------------------

static void check_model(int *nmtest_failed, const char *file, const char *arch) {
    const char *dir = getenv("NM_MODEL_DIR");
    char path[1024];
    if (dir && *dir) snprintf(path, sizeof path, "%s/%s", dir, file);
    else snprintf(path, sizeof path, "%s/.cache/nanomind/models/%s", getenv("HOME") ? getenv("HOME") : "", file);
    if (access(path, F_OK) != 0) NM_SKIP_MISSING("a default model is not in the model cache (scripts/fetch_models.sh)");
    nm_gguf *g = NULL;
    char err[512];
    nm_status st = nm_gguf_open(path, &g, err, sizeof err);
    if (st) fprintf(stderr, "  %s\n", err);
    NM_CHECK(st == NM_OK && g);
    if (!g) return;
    nm_str s;
    NM_CHECK(nm_gguf_get_str(g, "general.architecture", &s) && nm_str_eq(s, arch));
    NM_CHECK(nm_gguf_n_tensors(g) > 0);
    NM_CHECK(nm_gguf_find_tensor(g, "token_embd.weight") != NULL);
    // The vocabulary is an array of strings; walking it must stay in the file.
    const nm_gguf_kv *kv = nm_gguf_find(g, "tokenizer.ggml.tokens");
    NM_CHECK(kv && kv->type == NM_GGUF_ARRAY && kv->arr_type == NM_GGUF_STRING && kv->arr_n > 1000);
    if (kv) {
        nm_str *toks = malloc(kv->arr_n * sizeof *toks);
        NM_CHECK(toks && nm_gguf_arr_strings(kv, toks, kv->arr_n));
        const uint8_t *end = (const uint8_t *)toks[kv->arr_n - 1].ptr + toks[kv->arr_n - 1].len;
        NM_CHECK(end <= (const uint8_t *)nm_gguf_tensor_at(g, 0)->data);
        free(toks);
    }
    uint64_t total = 0;
    for (int64_t i = 0; i < nm_gguf_n_tensors(g); i++) {
        const nm_gguf_tensor *t = nm_gguf_tensor_at(g, i);
        char name[256];
        if (t->name.len < sizeof name) {
            memcpy(name, t->name.ptr, t->name.len);
            name[t->name.len] = '\0';
            NM_CHECK(nm_gguf_find_tensor(g, name) == t);
        }
        NM_CHECK(nm_type_traits_get(t->type) != NULL);
        total += t->nbytes;
    }
    NM_CHECK(total <= nm_gguf_file_size(g) - nm_gguf_data_offset(g));
    if (verbose()) {
        printf("%s:\n", file);
        nm_gguf_print_info(g, stdout);
    }
    nm_gguf_close(g);
}

NM_TEST(model_smollm2) { check_model(nmtest_failed, "SmolLM2-135M-Instruct.Q4_1.gguf", "llama"); }
NM_TEST(model_gemma3) { check_model(nmtest_failed, "gemma-3-270m-q4_k_m.gguf", "gemma3"); }

NM_TEST_MAIN()
