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
#include <sys/stat.h>
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

// ---- real models ------------------------------------------------------------------

static void check_model(int *nmtest_failed, const char *file, const char *arch) {
    const char *dir = getenv("NM_MODEL_DIR");
    char path[1024];
    if (dir && *dir) snprintf(path, sizeof path, "%s/%s", dir, file);
    else snprintf(path, sizeof path, "%s/.cache/nanomind/models/%s", getenv("HOME") ? getenv("HOME") : "", file);
    if (access(path, R_OK) != 0) NM_SKIP(file);
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
