// Tensor element types: layouts, conversions, ref kernels, and the SIMD table
// checked against the ref.
#include <stdint.h>
#include <time.h>

#include "nmtest.h"
#include "quant/kernels_impl.h"
#include "quant_testutil.h"

// ---- helpers -------------------------------------------------------------------

static double rms(const float *x, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return sqrt(s / (double)n);
}
static double rms_diff(const float *a, const float *b, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    return sqrt(s / (double)n);
}

#define all_types weight_types
#define N_TYPES N_WTYPES

// Bound on rms(dequant(quant(x)) - x) / rms(x) for Gaussian x (4096 values).
// The measured value of each is in the comment (NM_TEST_VERBOSE=1 prints them).
static double roundtrip_bound(uint32_t t) {
    switch (t) {
    case NM_TYPE_F32: return 0;
    case NM_TYPE_F16: return 3e-4;   // 0.00021: 2^-11 relative rounding
    case NM_TYPE_BF16: return 2.5e-3; // 0.00165: 2^-8
    case NM_TYPE_Q8_0: return 0.007; // 0.0055: step amax/127 per 32
    case NM_TYPE_Q8_1: return 0.007; // 0.0055
    case NM_TYPE_Q8_K: return 0.009; // 0.0071: one scale per 256, so a larger amax
    case NM_TYPE_Q4_0: return 0.10;  // 0.088: step amax/8
    case NM_TYPE_Q4_1: return 0.09;  // 0.080: step (max-min)/15
    case NM_TYPE_Q5_0: return 0.05;  // 0.044
    case NM_TYPE_Q5_1: return 0.045; // 0.039
    case NM_TYPE_MXFP4: return 0.14; // 0.120: E2M1 with a power-of-two scale
    case NM_TYPE_Q2_K: return 0.34;  // 0.302
    case NM_TYPE_Q3_K: return 0.18;  // 0.157
    case NM_TYPE_Q4_K: return 0.085; // 0.072
    case NM_TYPE_Q5_K: return 0.043; // 0.037
    case NM_TYPE_Q6_K: return 0.022; // 0.018
    }
    return -1;
}

// ---- traits and row sizes ------------------------------------------------------

NM_TEST(traits_names_and_sizes) {
    struct { uint32_t t; const char *name; int64_t blck; size_t size; } want[] = {
        {NM_TYPE_F32, "f32", 1, 4},       {NM_TYPE_F16, "f16", 1, 2},       {NM_TYPE_Q4_0, "q4_0", 32, 18},
        {NM_TYPE_Q4_1, "q4_1", 32, 20},   {NM_TYPE_Q5_0, "q5_0", 32, 22},   {NM_TYPE_Q5_1, "q5_1", 32, 24},
        {NM_TYPE_Q8_0, "q8_0", 32, 34},   {NM_TYPE_Q8_1, "q8_1", 32, 36},   {NM_TYPE_Q2_K, "q2_K", 256, 84},
        {NM_TYPE_Q3_K, "q3_K", 256, 110}, {NM_TYPE_Q4_K, "q4_K", 256, 144}, {NM_TYPE_Q5_K, "q5_K", 256, 176},
        {NM_TYPE_Q6_K, "q6_K", 256, 210}, {NM_TYPE_Q8_K, "q8_K", 256, 292}, {NM_TYPE_BF16, "bf16", 1, 2},
        {NM_TYPE_MXFP4, "mxfp4", 32, 17},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const nm_type_traits *tr = nm_type_traits_get(want[i].t);
        NM_CHECK(tr != NULL);
        if (!tr) continue;
        NM_CHECK(strcmp(tr->name, want[i].name) == 0);
        NM_CHECK(tr->blck_size == want[i].blck);
        NM_CHECK(tr->type_size == want[i].size);
        NM_CHECK(tr->supported);
    }
    NM_CHECK(nm_type_traits_get(4) == NULL); // removed Q4_2
    NM_CHECK(nm_type_traits_get(16) == NULL); // IQ2_XXS: not ours
    NM_CHECK(nm_type_traits_get(NM_TYPE_COUNT) == NULL);
    NM_CHECK(nm_type_traits_get(0xffffffffu) == NULL);
}

NM_TEST(row_size) {
    NM_CHECK(nm_row_size(NM_TYPE_F32, 7) == 28);
    NM_CHECK(nm_row_size(NM_TYPE_Q4_0, 64) == 36);
    NM_CHECK(nm_row_size(NM_TYPE_Q4_K, 512) == 288);
    NM_CHECK(nm_row_size(NM_TYPE_MXFP4, 2880) == 90 * 17);
    NM_CHECK(nm_row_size(NM_TYPE_Q4_0, 0) == 0);
    NM_CHECK(nm_row_size(NM_TYPE_I32, 3) == 12 && !nm_type_traits_get(NM_TYPE_I32)->supported); // op ids, no kernels
    // errors: not a multiple of the block, unknown type, negative, overflow
    NM_CHECK(nm_row_size(NM_TYPE_Q4_0, 33) == 0);
    NM_CHECK(nm_row_size(NM_TYPE_Q6_K, 128) == 0);
    NM_CHECK(nm_row_size(5, 32) == 0);
    NM_CHECK(nm_row_size(NM_TYPE_F32, -4) == 0);
    NM_CHECK(nm_row_size(NM_TYPE_F32, INT64_MAX) == 0);                 // 4 * n overflows size_t
    NM_CHECK(nm_row_size(NM_TYPE_F32, INT64_MAX / 8) == (size_t)(INT64_MAX / 8) * 4); // fits
}

// ---- half-precision conversions -------------------------------------------------

static uint32_t fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bitsf(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

NM_TEST(fp16_known_values) {
    NM_CHECK(nm_fp32_to_fp16(1.0f) == 0x3c00);
    NM_CHECK(nm_fp32_to_fp16(-2.0f) == 0xc000);
    NM_CHECK(nm_fp32_to_fp16(0.5f) == 0x3800);
    NM_CHECK(nm_fp32_to_fp16(65504.0f) == 0x7bff);
    NM_CHECK(nm_fp32_to_fp16(65519.0f) == 0x7bff); // below the midpoint to 65536
    NM_CHECK(nm_fp32_to_fp16(65520.0f) == 0x7c00); // tie rounds to even: inf
    NM_CHECK(nm_fp32_to_fp16(1e10f) == 0x7c00);
    NM_CHECK(nm_fp32_to_fp16(-INFINITY) == 0xfc00);
    NM_CHECK(nm_fp32_to_fp16(0.0f) == 0x0000);
    NM_CHECK(nm_fp32_to_fp16(-0.0f) == 0x8000);
    NM_CHECK(nm_fp32_to_fp16(ldexpf(1, -24)) == 0x0001); // smallest subnormal
    NM_CHECK(nm_fp32_to_fp16(ldexpf(1, -25)) == 0x0000); // tie to even: 0
    NM_CHECK(nm_fp32_to_fp16(ldexpf(1.5f, -25)) == 0x0001);
    NM_CHECK(nm_fp32_to_fp16(ldexpf(3, -25)) == 0x0002); // 1.5 ulp: tie to even 2
    NM_CHECK(nm_fp32_to_fp16(ldexpf(1, -14)) == 0x0400); // smallest normal
    NM_CHECK(nm_fp32_to_fp16(ldexpf(1023.5f, -24)) == 0x0400); // subnormal rounding up into normal
    NM_CHECK(nm_fp32_to_fp16(1.0f + ldexpf(1, -11)) == 0x3c00); // tie, even stays
    NM_CHECK(nm_fp32_to_fp16(1.0f + ldexpf(3, -11)) == 0x3c02); // tie, odd rounds up
    NM_CHECK(nm_fp32_to_fp16(1.0f + ldexpf(1, -11) + ldexpf(1, -20)) == 0x3c01);
    uint16_t hn = nm_fp32_to_fp16(NAN);
    NM_CHECK((hn & 0x7c00) == 0x7c00 && (hn & 0x3ff) != 0);
    NM_CHECK((nm_fp32_to_fp16(bitsf(0x7f800001u)) & 0x3ff) != 0); // signalling NaN stays NaN

    NM_CHECK(nm_fp16_to_fp32(0x3c00) == 1.0f);
    NM_CHECK(nm_fp16_to_fp32(0x7bff) == 65504.0f);
    NM_CHECK(nm_fp16_to_fp32(0x0001) == ldexpf(1, -24));
    NM_CHECK(nm_fp16_to_fp32(0x03ff) == ldexpf(1023, -24));
    NM_CHECK(nm_fp16_to_fp32(0x8000) == 0.0f && signbit(nm_fp16_to_fp32(0x8000)));
    NM_CHECK(nm_fp16_to_fp32(0x7c00) == INFINITY);
    NM_CHECK(nm_fp16_to_fp32(0xfc00) == -INFINITY);
    NM_CHECK(isnan(nm_fp16_to_fp32(0x7e00)));
    NM_CHECK(isnan(nm_fp16_to_fp32(0x7c01)));
}

NM_TEST(fp16_roundtrip_all_finite) {
    // Every finite half survives half -> float -> half unchanged.
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00) continue;
        if (nm_fp32_to_fp16(nm_fp16_to_fp32((uint16_t)h)) != h) bad++;
    }
    NM_CHECK(bad == 0);
}

NM_TEST(bf16_known_values) {
    NM_CHECK(nm_fp32_to_bf16(1.0f) == 0x3f80);
    NM_CHECK(nm_bf16_to_fp32(0x3f80) == 1.0f);
    NM_CHECK(nm_bf16_to_fp32(0xc040) == -3.0f);
    NM_CHECK(nm_fp32_to_bf16(bitsf(0x3f808000u)) == 0x3f80); // tie, even stays
    NM_CHECK(nm_fp32_to_bf16(bitsf(0x3f818000u)) == 0x3f82); // tie, odd rounds up
    NM_CHECK(nm_fp32_to_bf16(bitsf(0x3f808001u)) == 0x3f81); // above the tie
    NM_CHECK(nm_fp32_to_bf16(bitsf(0x7f7fffffu)) == 0x7f80); // FLT_MAX rounds to inf
    NM_CHECK(nm_fp32_to_bf16(INFINITY) == 0x7f80);
    uint16_t q = nm_fp32_to_bf16(bitsf(0x7f800001u)); // NaN with only low payload bits
    NM_CHECK((q & 0x7f80) == 0x7f80 && (q & 0x7f) != 0);
    NM_CHECK(isnan(nm_bf16_to_fp32(q)));
    NM_CHECK(fbits(nm_bf16_to_fp32(0x0001)) == 0x00010000u); // subnormal, exact
}

NM_TEST(e8m0_half_scale) {
    NM_CHECK(nm_e8m0_to_fp32_half(128) == 1.0f);
    NM_CHECK(nm_e8m0_to_fp32_half(129) == 2.0f);
    NM_CHECK(nm_e8m0_to_fp32_half(127) == 0.5f);
    NM_CHECK(nm_e8m0_to_fp32_half(1) == ldexpf(1, -127));
    NM_CHECK(nm_e8m0_to_fp32_half(0) == ldexpf(1, -128));
    NM_CHECK(nm_e8m0_to_fp32_half(255) == ldexpf(1, 127));
}

// ---- hand-built blocks ---------------------------------------------------------

NM_TEST(q4_0_hand_block) {
    nm_block_q4_0 b;
    b.d = 0x3800; // 0.5
    for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)(j | ((15 - j) << 4));
    float y[32];
    nm_dequantize_row_ref(NM_TYPE_Q4_0, &b, y, 32);
    for (int j = 0; j < 16; j++) {
        NM_CHECK(y[j] == 0.5f * (float)(j - 8));
        NM_CHECK(y[j + 16] == 0.5f * (float)(7 - j));
    }
    float x[32];
    for (int j = 0; j < 32; j++) x[j] = (float)(j % 3);
    double want = 0;
    for (int j = 0; j < 32; j++) want += y[j] * x[j];
    NM_CHECK(nm_vec_dot_ref(NM_TYPE_Q4_0, &b, x, 32) == (float)want);
}

NM_TEST(q8_0_and_q5_0_hand_block) {
    nm_block_q8_0 b8;
    b8.d = 0x4000; // 2
    for (int j = 0; j < 32; j++) b8.qs[j] = (int8_t)(j * 8 - 128);
    float y[32];
    nm_dequantize_row_ref(NM_TYPE_Q8_0, &b8, y, 32);
    for (int j = 0; j < 32; j++) NM_CHECK(y[j] == 2.0f * (float)(j * 8 - 128));

    nm_block_q5_0 b5;
    b5.d = 0x3c00;
    for (int j = 0; j < 16; j++) b5.qs[j] = (uint8_t)(j | (j << 4));
    uint32_t qh = 0x8000ffffu; // 5th bit set on elements 0..15 and 31
    memcpy(b5.qh, &qh, 4);
    nm_dequantize_row_ref(NM_TYPE_Q5_0, &b5, y, 32);
    for (int j = 0; j < 16; j++) NM_CHECK(y[j] == (float)j); // (j | 16) - 16
    for (int j = 0; j < 15; j++) NM_CHECK(y[16 + j] == (float)(j - 16));
    NM_CHECK(y[31] == 15.0f);
}

NM_TEST(mxfp4_hand_block) {
    nm_block_mxfp4 b;
    b.e = 128 + 1; // scale 2^(129-128) = 2, on the doubled E2M1 values
    for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)(j | ((15 - j) << 4));
    float y[32];
    nm_dequantize_row_ref(NM_TYPE_MXFP4, &b, y, 32);
    static const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    for (int j = 0; j < 16; j++) {
        NM_CHECK(y[j] == 4.0f * e2m1[j]); // E2M1 value * 2^(e-127)
        NM_CHECK(y[16 + j] == 4.0f * e2m1[15 - j]);
    }
    NM_CHECK(y[7] == 24.0f && y[16] == -24.0f);
    // Quantizing those values back gives the same nibbles and exponent
    // (index 8, -0, quantizes as +0: nibble 0).
    nm_block_mxfp4 q;
    nm_quantize_row_ref(NM_TYPE_MXFP4, y, &q, 32);
    NM_CHECK(q.e == b.e);
    for (int j = 0; j < 16; j++) {
        uint8_t lo = b.qs[j] & 15, hi = b.qs[j] >> 4;
        NM_CHECK((q.qs[j] & 15) == (lo == 8 ? 0 : lo));
        NM_CHECK((q.qs[j] >> 4) == (hi == 8 ? 0 : hi));
    }
}

NM_TEST(q4_K_hand_block) {
    nm_block_q4_K b;
    memset(&b, 0, sizeof b);
    b.d = 0x3c00;    // 1
    b.dmin = 0x3800; // 0.5
    // sub-block j: scale j+1, min 2j (j>=4 use the split 6-bit encoding: scale 40+j, min 50+j)
    uint8_t sc[8], mn[8];
    for (int j = 0; j < 8; j++) {
        sc[j] = (uint8_t)(j < 4 ? j + 1 : 40 + j);
        mn[j] = (uint8_t)(j < 4 ? 2 * j : 50 + j);
    }
    for (int j = 0; j < 4; j++) {
        b.scales[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        b.scales[j + 4] = (uint8_t)(mn[j] | ((mn[j + 4] >> 4) << 6));
        b.scales[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
    }
    for (int l = 0; l < 128; l++) b.qs[l] = (uint8_t)((l % 16) | ((15 - l % 16) << 4));
    for (int j = 0; j < 8; j++) {
        uint8_t s, m;
        nm_get_scale_min_k4(j, b.scales, &s, &m);
        NM_CHECK(s == sc[j] && m == mn[j]);
    }
    float y[256];
    nm_dequantize_row_ref(NM_TYPE_Q4_K, &b, y, 256);
    for (int e = 0; e < 256; e++) {
        int j = e / 32, c = e / 64, l = e % 32;
        int q = (e % 64) < 32 ? (l % 16) : (15 - l % 16);
        (void)c;
        NM_CHECK(y[e] == (float)(sc[j] * q) - 0.5f * (float)mn[j]);
    }
}

NM_TEST(q6_K_hand_block) {
    nm_block_q6_K b;
    memset(&b, 0, sizeof b);
    b.d = 0x3400; // 0.25
    for (int g = 0; g < 16; g++) b.scales[g] = (int8_t)(g - 8);
    // element e gets q = e % 64 (stored q, value q - 32)
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            int q[4];
            for (int k = 0; k < 4; k++) q[k] = (128 * h + 32 * k + l) % 64;
            b.ql[64 * h + l] = (uint8_t)((q[0] & 15) | ((q[2] & 15) << 4));
            b.ql[64 * h + 32 + l] = (uint8_t)((q[1] & 15) | ((q[3] & 15) << 4));
            b.qh[32 * h + l] = (uint8_t)((q[0] >> 4) | ((q[1] >> 4) << 2) | ((q[2] >> 4) << 4) | ((q[3] >> 4) << 6));
        }
    float y[256];
    nm_dequantize_row_ref(NM_TYPE_Q6_K, &b, y, 256);
    for (int e = 0; e < 256; e++) NM_CHECK(y[e] == 0.25f * (float)(e / 16 - 8) * (float)(e % 64 - 32));
}

// ---- quantize -> dequantize, fused dot vs dequant-then-dot --------------------

#define NROW 4096 // 16 K super-blocks, 128 legacy blocks

NM_TEST(roundtrip_error_bounds) {
    static float x[NROW], y[NROW];
    static uint8_t q[NROW * 4 + 64];
    fill_gauss(x, NROW, 0.7f);
    double xr = rms(x, NROW);
    for (size_t i = 0; i < N_TYPES; i++) {
        uint32_t t = all_types[i];
        memset(q, 0xa5, sizeof q);
        nm_quantize_row_ref(t, x, q, NROW);
        nm_dequantize_row_ref(t, q, y, NROW);
        double rel = rms_diff(x, y, NROW) / xr, bound = roundtrip_bound(t);
        if (!(rel <= bound))
            fprintf(stderr, "  %s: relative rms error %.5f > %.5f\n", nm_type_traits_get(t)->name, rel, bound);
        NM_CHECK(rel <= bound);
        if (getenv("NM_TEST_VERBOSE")) printf("  %-6s rel rms err %.5f (bound %.3f)\n", nm_type_traits_get(t)->name, rel, bound);
    }
}

NM_TEST(quantize_zeros_and_constants) {
    // All-zero and constant rows must not produce NaN/inf.
    static float x[512], y[512];
    static uint8_t q[4096];
    for (size_t i = 0; i < N_TYPES; i++) {
        uint32_t t = all_types[i];
        for (int c = 0; c < 2; c++) {
            for (int j = 0; j < 512; j++) x[j] = c ? 0.375f : 0.0f;
            nm_quantize_row_ref(t, x, q, 512);
            nm_dequantize_row_ref(t, q, y, 512);
            int ok = 1;
            for (int j = 0; j < 512; j++) ok &= isfinite(y[j]) && fabsf(y[j] - x[j]) <= 0.1f;
            if (!ok) fprintf(stderr, "  %s const %d\n", nm_type_traits_get(t)->name, c);
            NM_CHECK(ok);
        }
    }
}

NM_TEST(fused_dot_matches_dequant_dot) {
    static float w[NROW], x[NROW], y[NROW];
    static uint8_t q[NROW * 4 + 64];
    fill_gauss(w, NROW, 1.0f);
    fill_gauss(x, NROW, 1.0f);
    for (size_t i = 0; i < N_TYPES; i++) {
        uint32_t t = all_types[i];
        nm_quantize_row_ref(t, w, q, NROW);
        nm_dequantize_row_ref(t, q, y, NROW);
        double want = dot_d(y, x, NROW), scale = abs_dot(y, x, NROW);
        float got = nm_vec_dot_ref(t, q, x, NROW);
        NM_CHECK_NEAR(got, want, 1e-5 * scale);
        // and the dot of the quantized row is close to the unquantized one
        NM_CHECK_NEAR(got, dot_d(w, x, NROW), 2 * roundtrip_bound(t) * sqrt((double)NROW) * 3 + 1e-3);
    }
}

// Quantizer determinism details that make our files match llama.cpp's.
NM_TEST(q8_0_quantizer_details) {
    float x[32];
    for (int j = 0; j < 32; j++) x[j] = (float)(j - 16) * 0.25f;
    x[5] = -5.08f; // amax: d = 5.08/127 = 0.04
    nm_block_q8_0 b;
    nm_quantize_row_ref(NM_TYPE_Q8_0, x, &b, 32);
    NM_CHECK(b.d == nm_fp32_to_fp16(5.08f / 127));
    NM_CHECK(b.qs[5] == -127);
    NM_CHECK(b.qs[16] == 0);
    NM_CHECK(b.qs[17] == (int8_t)roundf(0.25f * (127 / 5.08f)));
    // q4_0: the signed extreme maps to nibble 0 (value -8 * d, d = max / -8)
    nm_block_q4_0 b4;
    nm_quantize_row_ref(NM_TYPE_Q4_0, x, &b4, 32);
    NM_CHECK((b4.qs[5] & 15) == 0);
    NM_CHECK(b4.d == nm_fp32_to_fp16(-5.08f / -8));
}

// ---- SIMD table vs ref ---------------------------------------------------------

NM_TEST(dispatch_table_complete) {
    const nm_kernels *k = nm_kernels_get(), *r = nm_kernels_ref();
    NM_CHECK(k == nm_kernels_get()); // chosen once
    NM_CHECK(strcmp(r->name, "ref") == 0);
    for (size_t i = 0; i < N_TYPES; i++) {
        NM_CHECK(k->dot[all_types[i]] != NULL);
        NM_CHECK(k->dequant[all_types[i]] != NULL);
    }
    const char *force = getenv("NM_FORCE_REF");
    if (force && force[0] == '1') NM_CHECK(strcmp(k->name, "ref") == 0);
    printf("  kernels: %s\n", k->name);
}

NM_TEST(simd_matches_ref) {
    const nm_kernels *k = nm_kernels_get(), *r = nm_kernels_ref();
    if (k->name == r->name) NM_SKIP("reference table chosen");
    static const int blocks[] = {1, 3, 7, 64};
    static float w[256 * 64], x[256 * 64], ys[256 * 64], yr[256 * 64];
    static uint8_t q[256 * 64 * 4];
    for (size_t i = 0; i < N_TYPES; i++) {
        uint32_t t = all_types[i];
        const nm_type_traits *tr = nm_type_traits_get(t);
        for (size_t b = 0; b < sizeof blocks / sizeof blocks[0]; b++) {
            int64_t n = tr->blck_size == 1 ? 32 * blocks[b] + 5 : tr->blck_size * blocks[b]; // odd tail for floats
            fill_gauss(w, n, 0.5f);
            fill_gauss(x, n, 1.0f);
            if (t == NM_TYPE_Q4_1 || t == NM_TYPE_Q5_1)
                for (int64_t j = 0; j < n; j++) w[j] += 0.3f; // exercise the min term
            nm_quantize_row_ref(t, w, q, n);
            k->dequant[t](q, ys, n);
            r->dequant[t](q, yr, n);
            double maxd = 0;
            for (int64_t j = 0; j < n; j++) maxd = fmax(maxd, fabs((double)ys[j] - yr[j]) / (fabs(yr[j]) + 1e-6));
            if (maxd > 1e-6) fprintf(stderr, "  %s dequant n=%lld rel diff %.3g\n", tr->name, (long long)n, maxd);
            NM_CHECK(maxd <= 1e-6);
            double scale = abs_dot(yr, x, n);
            float ds = k->dot[t](q, x, n), dr = r->dot[t](q, x, n);
            if (!(fabs((double)ds - dr) <= 2e-6 * scale))
                fprintf(stderr, "  %s dot n=%lld\n", tr->name, (long long)n);
            NM_CHECK_NEAR(ds, dr, 2e-6 * scale);
        }
    }
}

// ns per 1000 weights of fd (f32 activations x) or fq (quantized activations
// xq) over the rows, the best of `trials` runs of `reps` passes (the machine
// is shared: the minimum is the least disturbed run).
static double bench_ns_per_1k(nm_dot_fn fd, nm_dotq_fn fq, const void *rows, size_t row_bytes, int nrows,
                              const void *x, int64_t n, int reps, int trials) {
    double best = INFINITY;
    for (int tr = 0; tr < trials; tr++) {
        struct timespec a, b;
        volatile float sink = 0;
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (int rep = 0; rep < reps; rep++)
            for (int rr = 0; rr < nrows; rr++) {
                const uint8_t *w = (const uint8_t *)rows + rr * row_bytes;
                sink += fd ? fd(w, x, n) : fq(w, x, n);
            }
        clock_gettime(CLOCK_MONOTONIC, &b);
        (void)sink;
        best = fmin(best, ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / ((double)reps * nrows * n / 1000));
    }
    return best;
}

NM_TEST_OPTIN(simd_dot_speed, "NM_TEST_BENCH") {
    // Not a pass/fail benchmark: ns per 1k weights of the f32-activation dot
    // (ref and SIMD table) and of the quantized-activation dotq of the SIMD
    // table (the activation row is quantized once per matmul and reused by
    // every weight row, so that cost is not in it).
    const nm_kernels *k = nm_kernels_get(), *r = nm_kernels_ref();
    enum { N = 4096, ROWS = 256 };
    static float w[N], x[N];
    static uint8_t q[ROWS][N * 4], xq[N * 4];
    fill_gauss(x, N, 1);
    for (size_t i = 0; i < N_TYPES; i++) {
        uint32_t t = all_types[i], at = nm_vec_dot_type(t);
        for (int rr = 0; rr < ROWS; rr++) {
            fill_gauss(w, N, 1);
            nm_quantize_row_ref(t, w, q[rr], N);
        }
        k->quant_act[at](x, xq, N);
        double nr = bench_ns_per_1k(r->dot[t], NULL, q, sizeof q[0], ROWS, x, N, 2, 1);
        double nd = bench_ns_per_1k(k->dot[t], NULL, q, sizeof q[0], ROWS, x, N, 10, 3);
        double nq = bench_ns_per_1k(NULL, k->dotq[t], q, sizeof q[0], ROWS, xq, N, 10, 3);
        printf("  %-6s ref %7.1f ns/1k  %s %6.1f ns/1k  x%.1f | dotq(.%s) %s %6.1f ns/1k  x%.2f vs %s dot\n",
               nm_type_traits_get(t)->name, nr, k->name, nd, nr / nd, nm_type_traits_get(at)->name, k->name, nq,
               nd / nq, k->name);
    }
}

// ---- byte for byte against ggml ----------------------------------------------------
// tests/data/ggml_quant/rows.hex (its README says how it was made): six kinds
// of 256-value rows, each quantized by ggml's reference quantizers
// (ggml_get_type_traits(t)->from_float_ref, llama.cpp 0c1e570) for the 12
// weight types that have one, and by ggml-cpu's x86 activation quantizers
// (q8_0, q8_1, q8_K). Ours must give the same bytes: nm_quantize_row_ref for
// the weights; for the activations the reference and the chosen kernels.
// The rows both sides quantize: kind 0..5, 256 values.
static void gen_row(int kind, float *x) {
    uint32_t s = 12345u + 977u * (uint32_t)kind;
    for (int i = 0; i < 256; i++) {
        float u[4];
        for (int k = 0; k < 4; k++) {
            s = s * 1664525u + 1013904223u;
            u[k] = (float)(s >> 8) / 16777216.0f;
        }
        float v;
        switch (kind) {
        case 0: v = u[0] + u[1] + u[2] + u[3] - 2.0f; break;                  // bell-shaped
        case 1: v = (u[0] * 2.0f - 1.0f) * 3.0f; break;                       // uniform
        case 2: v = (i & 1) ? 0.0f : u[0] - 0.5f; break;                      // half zeros
        case 3: v = (u[0] - 0.5f) * 1e-6f; break;                             // tiny
        case 4: v = (u[0] - 0.5f) * 2e4f * (i % 37 == 0 ? 8.0f : 1.0f); break; // large, outliers
        default: v = i == 17 ? -7.0f : 0.5f; break;                           // constant, one outlier
        }
        x[i] = v;
    }
}

static int hex_bytes(const char *h, uint8_t *out, int cap) {
    int n = 0;
    while (h[0] && h[1] && h[0] != '\n' && n < cap) {
        unsigned v;
        if (sscanf(h, "%2x", &v) != 1) return -1;
        out[n++] = (uint8_t)v;
        h += 2;
    }
    return n;
}

NM_TEST(blocks_equal_ggml_byte_for_byte) {
    FILE *f = fopen("tests/data/ggml_quant/rows.hex", "r");
    if (!f) NM_SKIP_MISSING("tests/data/ggml_quant/rows.hex not found (run from the repository root)");
    const nm_kernels *k = nm_kernels_get();
    char line[4096], kind[8];
    int n_ref = 0, n_act = 0;
    while (fgets(line, sizeof line, f)) {
        int type, rk, off;
        if (sscanf(line, "%7s %d %d %n", kind, &type, &rk, &off) != 3 || rk < 0 || rk > 5) {
            NM_CHECK(!"a malformed line");
            break;
        }
        uint8_t want[1024], got[1024];
        const int nw = hex_bytes(line + off, want, (int)sizeof want);
        float x[256];
        gen_row(rk, x);
        const bool ref = !strcmp(kind, "ref");
        NM_CHECK(nw > 0 && (size_t)nw == nm_row_size((uint32_t)type, 256));
        if (nw <= 0) continue;
        memset(got, 0xAA, sizeof got);
        if (ref) nm_quantize_row_ref((uint32_t)type, x, got, 256);
        else nm_kernels_ref()->quant_act[type](x, got, 256);
        const bool same = !memcmp(got, want, (size_t)nw);
        if (!same) fprintf(stderr, "  %s type %d row kind %d: bytes differ from ggml's\n", kind, type, rk);
        NM_CHECK(same);
        if (!ref) { // the chosen (SIMD) activation quantizer too
            memset(got, 0xAA, sizeof got);
            k->quant_act[type](x, got, 256);
            NM_CHECK(!memcmp(got, want, (size_t)nw));
        }
        n_ref += ref;
        n_act += !ref;
    }
    fclose(f);
    NM_CHECK(n_ref == 6 * 12 && n_act == 6 * 3);
}

// tests/data/ggml_quant/deq_dot.txt (README there): for the 11 weight types,
// ggml's to_float of its own blocks of each row kind (an FNV-1a hash of the
// 256 float bits) and ggml-cpu's vec_dot of those blocks with the next row
// kind quantized to the vec_dot_type (%a). Ours: every dequantizer equal bit
// for bit; dotq (reference and chosen kernels) within 4e-7 of sum |w x|: the
// integer block dots are exact, only the order and rounding of the f32 sums of
// the 8 to 16 block results differ (a few f32 roundings, 6e-8 each; measured
// 1.7e-7 at worst, q5_K on the large row with outliers). Where q8_1's f16
// block sum overflows (q4_1, q5_1 on the large row) both give the same -inf.
static uint64_t fnv1a(const void *p, size_t n) {
    const uint8_t *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

NM_TEST(dequant_and_dots_equal_ggml) {
    FILE *f = fopen("tests/data/ggml_quant/deq_dot.txt", "r");
    if (!f) NM_SKIP_MISSING("tests/data/ggml_quant/deq_dot.txt not found (run from the repository root)");
    const nm_kernels *tabs[2] = {nm_kernels_ref(), nm_kernels_get()};
    char line[256], kind[8];
    int n_deq = 0, n_dot = 0;
    double worst = 0;
    while (fgets(line, sizeof line, f)) {
        int type, kw, kx = 0, off = 0;
        if (sscanf(line, "%7s %d %d %n", kind, &type, &kw, &off) != 3 || kw < 0 || kw > 5 ||
            !nm_type_traits_get((uint32_t)type)) {
            NM_CHECK(!"a malformed line");
            break;
        }
        float x[256], y[256];
        uint8_t w[1024];
        gen_row(kw, x);
        nm_quantize_row_ref((uint32_t)type, x, w, 256); // = ggml's bytes (blocks_equal_ggml_byte_for_byte)
        if (!strcmp(kind, "deq")) {
            const uint64_t want = strtoull(line + off, NULL, 16);
            nm_dequantize_row_ref((uint32_t)type, w, y, 256);
            NM_CHECK(fnv1a(y, sizeof y) == want);
            for (int t = 0; t < 2; t++) {
                memset(y, 0, sizeof y);
                tabs[t]->dequant[type](w, y, 256);
                if (fnv1a(y, sizeof y) != want)
                    fprintf(stderr, "  dequant type %d kind %d (%s): differs from ggml\n", type, kw, tabs[t]->name);
                NM_CHECK(fnv1a(y, sizeof y) == want);
            }
            n_deq++;
        } else {
            float want;
            NM_CHECK(sscanf(line + off, "%d %a", &kx, &want) == 2 && kx >= 0 && kx <= 5);
            float xa[256];
            uint8_t xq[1024];
            gen_row(kx, xa);
            const uint32_t at = nm_vec_dot_type((uint32_t)type);
            nm_dequantize_row_ref((uint32_t)type, w, y, 256);
            double mag = 0;
            for (int i = 0; i < 256; i++) mag += fabs((double)y[i] * xa[i]);
            for (int t = 0; t < 2; t++) {
                tabs[t]->quant_act[at](xa, xq, 256);
                const float got = tabs[t]->dotq[type](w, xq, 256);
                // q4_1 / q5_1 on the large row: q8_1's f16 block sum overflows, in ggml as here
                const double d = isinf(want) ? (got == want ? 0.0 : INFINITY) : fabs((double)got - want);
                const double rel = mag > 0 ? d / mag : d;
                if (rel > worst) worst = rel;
                if (!(rel <= 4e-7))
                    fprintf(stderr, "  dot type %d kinds %d.%d (%s): %g from ggml's %a (%.1e of sum |w x|)\n", type,
                            kw, kx, tabs[t]->name, d, want, rel);
                NM_CHECK(rel <= 4e-7);
            }
            n_dot++;
        }
    }
    fclose(f);
    fprintf(stderr, "  %d dequantized rows, %d dots; worst dot %.1e of sum |w x|\n", n_deq, n_dot, worst);
    NM_CHECK(n_deq == 6 * 11 && n_dot == 6 * 11);
}

NM_TEST_MAIN()
