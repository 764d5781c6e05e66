// Every op of the CPU backend against a plain reference written here, in
// double where it matters, with the tolerance next to the error measured on
// x86-64 AVX-512 with this file's seed, and the largest over eight other
// seeds (the margin is stated with each). NM_TEST_VERBOSE=1 prints every
// measured error beside its bound, to re-measure on another machine.
//
// Outputs are pre-filled with NaN and checked one element past their end, so
// an element an op forgets (a short loop, a lost thread chunk) or one it
// writes past its rows fails; `worst` keeps a NaN.
#include <float.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "backend/backend.h"
#include "backend_testutil.h"
#include "nmtest.h"
#include "quant/quant.h"

static uint64_t rs = 0x6a09e667f3bcc909ull;
static float frand(void) { // uniform on [-1, 1)
    rs = rs * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rs >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

// The larger error; a NaN sticks (fmax would drop it).
static double worst(double m, double e) { return e > m || isnan(e) ? e : m; }

static int verbose(void) {
    const char *v = getenv("NM_TEST_VERBOSE");
    return v && *v && strcmp(v, "0") != 0;
}

// err <= tol, printing both when it fails or when asked.
#define CHECK_ERR(what, err, tol)                                                              \
    do {                                                                                       \
        const double e_ = (err), t_ = (tol);                                                   \
        if (!(e_ <= t_) || verbose()) fprintf(stderr, "  %s: error %.3g (bound %.3g)\n", what, e_, t_); \
        NM_CHECK(e_ <= t_);                                                                    \
    } while (0)

// An f32 output of n elements plus one guard element, all NaN.
#define GUARD 1234.5f
static float *out_buf(int64_t n) {
    float *p = malloc(sizeof(float) * (size_t)(n + 1));
    for (int64_t i = 0; i < n; i++) p[i] = NAN;
    p[n] = GUARD;
    return p;
}

static nm_tensor f32t(void *data, int64_t ne0, int64_t ne1) {
    return (nm_tensor){.type = NM_TYPE_F32, .ne = {ne0, ne1, 1, 1}, .offs = (size_t)(uintptr_t)(data)};
}

static nm_status run1(nm_backend *be, const nm_op *op) { return nm_backend_run(be, op, 1); }

// ---- half precision, written from the IEEE 754 binary16 definition ------------------

static double ref_half(uint16_t h) {
    const int e = (h >> 10) & 31, m = h & 1023;
    const double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return h >> 15 ? -v : v;
}

// Round to nearest, ties to even (nearbyint in the default rounding mode).
static uint16_t ref_half_bits(float f) {
    const uint16_t sign = signbit(f) ? 0x8000 : 0;
    const double a = fabs((double)f);
    if (isnan(f)) return 0x7e00;
    if (a >= 65520.0) return sign | 0x7c00; // 65504 + half an ulp ties to the even 2^16: overflow
    if (a < 0x1p-14) return sign | (uint16_t)nearbyint(a * 0x1p24); // subnormal; 1024 is the least normal
    int e;
    frexp(a, &e); // a in [2^(e-1), 2^e)
    double m = nearbyint(ldexp(a, 11 - e)); // 11 significant bits: 1024..2048
    int E = e - 1;
    if (m == 2048.0) m = 1024.0, E++;
    return sign | (uint16_t)((E + 15) << 10) | (uint16_t)(m - 1024.0);
}

static float f16_round(float x) { return nm_fp16_to_fp32(nm_fp32_to_fp16(x)); }

// ---- GET_ROWS ---------------------------------------------------------------------

// Element j of a row of `type` from its bytes (ggml's block layouts).
static double ref_dequant(uint32_t type, const uint8_t *row, int64_t j) {
    switch (type) {
    case NM_TYPE_F32: {
        float f;
        memcpy(&f, row + 4 * j, 4);
        return f;
    }
    case NM_TYPE_F16: {
        uint16_t h;
        memcpy(&h, row + 2 * j, 2);
        return ref_half(h);
    }
    case NM_TYPE_Q8_0: { // blocks of 32: f16 scale d, 32 int8 q; x = d q
        const uint8_t *b = row + (j / 32) * 34;
        uint16_t d;
        memcpy(&d, b, 2);
        return ref_half(d) * (int8_t)b[2 + j % 32];
    }
    case NM_TYPE_Q4_0: { // blocks of 32: f16 d, 16 bytes; low nibbles are 0..15, high 16..31; x = d (q - 8)
        const uint8_t *b = row + (j / 32) * 18;
        uint16_t d;
        memcpy(&d, b, 2);
        const int i = (int)(j % 32), q = i < 16 ? b[2 + i] & 15 : b[2 + i - 16] >> 4;
        return ref_half(d) * (q - 8);
    }
    default: return NAN;
    }
}

// Embedding lookup, repeated and out-of-order ids, decode-sized (on the caller)
// and prefill-sized (T x K >= 32768: two threads). Dequantization is exact in
// f32 (an 11-bit scale times a small integer), so the bound is 0.
NM_TEST(get_rows_f32_f16_q8_0_q4_0) {
    const uint32_t types[] = {NM_TYPE_F32, NM_TYPE_F16, NM_TYPE_Q8_0, NM_TYPE_Q4_0};
    const size_t block_bytes[] = {4, 2, 34, 18}; // per element for f32/f16, per 32 for q8_0/q4_0
    enum { K = 512, V = 61, TMAX = 80 };
    nm_backend *be = cpu_backend(2, K, 16);
    float *wf = malloc(sizeof(float) * V * K); // (V, K)
    for (int i = 0; i < V * K; i++) wf[i] = 2.0f * frand();
    int32_t ids[TMAX];
    for (int i = 0; i < TMAX; i++) ids[i] = (i * 37 + 5) % V;
    ids[1] = ids[0], ids[2] = V - 1, ids[3] = 0;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const uint32_t t = types[ti];
        const size_t rb = nm_row_size(t, K);
        NM_CHECK(rb == (t <= NM_TYPE_F16 ? block_bytes[ti] * K : block_bytes[ti] * K / 32));
        uint8_t *w = malloc(rb * V); // (V, rb)
        for (int r = 0; r < V; r++) nm_quantize_row_ref(t, wf + r * K, w + r * rb, K);
        nm_tensor W = {.type = t, .ne = {K, V, 1, 1}, .offs = (size_t)(uintptr_t)(w)};
        const int Ts[] = {1, 3, TMAX};
        for (int k = 0; k < 3; k++) {
            const int T = Ts[k];
            float *y = out_buf((int64_t)T * K); // (T, K)
            nm_tensor Y = f32t(y, K, T);
            nm_op op = {.kind = NM_OP_GET_ROWS, .src0 = &W, .dst = &Y, .ids = IDT(ids, T)};
            NM_CHECK(run1(be, &op) == NM_OK);
            double maxd = 0, maxq = 0;
            for (int i = 0; i < T; i++)
                for (int j = 0; j < K; j++) {
                    const double want = ref_dequant(t, w + (size_t)ids[i] * rb, j);
                    maxd = worst(maxd, fabs(want - y[i * K + j]));
                    maxq = worst(maxq, fabs(want - wf[ids[i] * K + j])); // the quantizer did its job
                }
            char what[64];
            snprintf(what, sizeof what, "get_rows %s T=%d", nm_type_traits_get(t)->name, T);
            CHECK_ERR(what, maxd, 0.0); // measured 0
            NM_CHECK(maxq < (t == NM_TYPE_Q4_0 ? 0.26 : t == NM_TYPE_Q8_0 ? 0.01 : 1e-3));
            NM_CHECK(y[T * K] == GUARD);
            free(y);
        }
        free(w);
    }
    free(wf);
    nm_backend_free(be);
}

// ---- RMS_NORM, NORM -------------------------------------------------------------------

// Widths 1, odd and past every SIMD multiple; 2-D and 3-D (per-head norm)
// inputs; the last shapes exceed NM_EW_PARALLEL_MIN (32768) elements so the
// rows are split over the two threads.
static const int64_t norm_shapes[][3] = {{1, 3, 1},   {7, 5, 1},    {13, 4, 1},  {100, 3, 1},   {1023, 2, 1},
                                         {4099, 9, 1}, {1000, 41, 1}, {64, 9, 61}, {197, 300, 1}};

NM_TEST(rms_norm_with_and_without_weight) {
    nm_backend *be = cpu_backend(2, 64, 16);
    NM_CHECK(cpu_backend_threads(be) == 2);
    for (size_t si = 0; si < sizeof norm_shapes / sizeof norm_shapes[0]; si++) {
        const int64_t d = norm_shapes[si][0], r1 = norm_shapes[si][1], r2 = norm_shapes[si][2], R = r1 * r2;
        float *x = malloc(sizeof(float) * (size_t)(d * R)), *w = malloc(sizeof(float) * (size_t)d); // (R, d), (d)
        for (int64_t r = 0; r < R; r++) {
            const float amp = r % 3 == 0 ? 40.0f : r % 3 == 1 ? 1.0f : 0.01f; // at 0.01, eps weighs in
            for (int64_t i = 0; i < d; i++) x[r * d + i] = amp * (frand() + 0.3f);
        }
        for (int64_t i = 0; i < d; i++) w[i] = 1.0f + 0.5f * frand();
        for (int wi = 0; wi < 2; wi++) {
            const float eps = wi ? 1e-6f : 1e-5f;
            float *y = out_buf(d * R);
            nm_tensor X = {.type = NM_TYPE_F32, .ne = {d, r1, r2, 1}, .offs = (size_t)(uintptr_t)(x)}, Wt = f32t(w, d, 1);
            nm_tensor Y = {.type = NM_TYPE_F32, .ne = {d, r1, r2, 1}, .offs = (size_t)(uintptr_t)(y)};
            nm_op op = {.kind = NM_OP_RMS_NORM, .src0 = &X, .src1 = wi ? &Wt : NULL, .dst = &Y, .f0 = eps};
            NM_CHECK(run1(be, &op) == NM_OK);
            double maxd = 0;
            for (int64_t r = 0; r < R; r++) {
                double ss = 0;
                for (int64_t i = 0; i < d; i++) ss += (double)x[r * d + i] * x[r * d + i];
                const double inv = 1.0 / sqrt(ss / d + eps);
                for (int64_t i = 0; i < d; i++) {
                    const double want = x[r * d + i] * inv * (wi ? w[i] : 1.0);
                    maxd = worst(maxd, fabs(want - y[r * d + i]) / (1.0 + fabs(want)));
                }
            }
            char what[80];
            snprintf(what, sizeof what, "rms_norm d=%lld rows=%lldx%lld weight=%d", (long long)d, (long long)r1,
                     (long long)r2, wi);
            CHECK_ERR(what, maxd, 5e-7); // measured 1.25e-7, seeds 1.4e-7: 3.6x margin
            NM_CHECK(y[d * R] == GUARD);
            free(y);
        }
        free(x), free(w);
    }
    nm_backend_free(be);
}

// Layer norm with each of weight and bias present or absent, on rows whose
// mean is far from 0 (the variance is of the centred values).
NM_TEST(layer_norm_weight_bias_variants) {
    nm_backend *be = cpu_backend(2, 64, 16);
    for (size_t si = 0; si < sizeof norm_shapes / sizeof norm_shapes[0]; si++) {
        const int64_t d = norm_shapes[si][0], R = norm_shapes[si][1] * norm_shapes[si][2];
        if (d == 1) continue; // variance 0: (x - mean) = 0 exactly, nothing to compare
        float *x = malloc(sizeof(float) * (size_t)(d * R)); // (R, d)
        float *w = malloc(sizeof(float) * (size_t)d), *b = malloc(sizeof(float) * (size_t)d);
        for (int64_t r = 0; r < R; r++)
            for (int64_t i = 0; i < d; i++) x[r * d + i] = 3.0f * frand() + (r % 2 ? 5.0f : -0.5f);
        for (int64_t i = 0; i < d; i++) w[i] = 1.0f + 0.5f * frand(), b[i] = 0.3f * frand();
        nm_tensor X = f32t(x, d, R), Wt = f32t(w, d, 1), Bt = f32t(b, d, 1);
        for (int v = 0; v < 4; v++) {
            const bool hw = v & 1, hb = v & 2;
            float *y = out_buf(d * R);
            nm_tensor Y = f32t(y, d, R);
            nm_op op = {.kind = NM_OP_NORM, .src0 = &X, .src1 = hw ? &Wt : NULL, .src2 = hb ? &Bt : NULL, .dst = &Y,
                        .f0 = 1e-5f};
            NM_CHECK(run1(be, &op) == NM_OK);
            double maxd = 0;
            for (int64_t r = 0; r < R; r++) {
                double m = 0, var = 0;
                for (int64_t i = 0; i < d; i++) m += x[r * d + i];
                m /= d;
                for (int64_t i = 0; i < d; i++) var += (x[r * d + i] - m) * (x[r * d + i] - m);
                var /= d; // population variance, as ggml_norm
                for (int64_t i = 0; i < d; i++) {
                    double want = (x[r * d + i] - m) / sqrt(var + 1e-5);
                    if (hw) want *= w[i];
                    if (hb) want += b[i];
                    maxd = worst(maxd, fabs(want - y[r * d + i]) / (1.0 + fabs(want)));
                }
            }
            char what[80];
            snprintf(what, sizeof what, "norm d=%lld rows=%lld weight=%d bias=%d", (long long)d, (long long)R, hw, hb);
            CHECK_ERR(what, maxd, 1e-6); // measured 2.4e-7, seeds 2.4e-7: 4x margin
            NM_CHECK(y[d * R] == GUARD);
            free(y);
        }
        free(x), free(w), free(b);
    }
    nm_backend_free(be);
}

// ---- ADD, SCALE ----------------------------------------------------------------------

// One f32 add or multiply is correctly rounded, and so is the exact double
// result rounded once to f32: the two must be equal.
NM_TEST(add_and_scale_exact) {
    nm_backend *be = cpu_backend(2, 64, 16);
    const int64_t shapes[][2] = {{1, 1}, {37, 3}, {1001, 40}, {4096, 9}}; // the last two run on both threads
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t d = shapes[si][0], R = shapes[si][1], n = d * R;
        float *a = malloc(sizeof(float) * (size_t)n), *b = malloc(sizeof(float) * (size_t)n); // (R, d)
        for (int64_t i = 0; i < n; i++) a[i] = 10.0f * frand(), b[i] = frand() * (i % 5 ? 1.0f : 1e-4f);
        nm_tensor A = f32t(a, d, R), B = f32t(b, d, R);
        float *y = out_buf(n);
        nm_tensor Y = f32t(y, d, R);
        nm_op add = {.kind = NM_OP_ADD, .src0 = &A, .src1 = &B, .dst = &Y};
        NM_CHECK(run1(be, &add) == NM_OK);
        int64_t bad = 0;
        for (int64_t i = 0; i < n; i++) bad += y[i] != (float)((double)a[i] + (double)b[i]);
        CHECK_ERR("add: elements not correctly rounded", (double)bad, 0.0); // measured 0
        NM_CHECK(y[n] == GUARD);
        const float factors[] = {0.37f, -3.0f, 0.0f};
        for (int f = 0; f < 3; f++) {
            nm_op sc = {.kind = NM_OP_SCALE, .src0 = &A, .dst = &Y, .f0 = factors[f]};
            NM_CHECK(run1(be, &sc) == NM_OK);
            bad = 0;
            for (int64_t i = 0; i < n; i++) bad += y[i] != (float)((double)a[i] * factors[f]);
            CHECK_ERR("scale: elements not correctly rounded", (double)bad, 0.0); // measured 0
            NM_CHECK(y[n] == GUARD);
        }
        // in place (the residual stream: dst = src0)
        float *acc = malloc(sizeof(float) * (size_t)n);
        memcpy(acc, a, sizeof(float) * (size_t)n);
        nm_tensor Acc = f32t(acc, d, R);
        nm_op inplace = {.kind = NM_OP_ADD, .src0 = &Acc, .src1 = &B, .dst = &Acc};
        NM_CHECK(run1(be, &inplace) == NM_OK);
        bad = 0;
        for (int64_t i = 0; i < n; i++) bad += acc[i] != (float)((double)a[i] + (double)b[i]);
        NM_CHECK(bad == 0);
        free(a), free(b), free(y), free(acc);
    }
    nm_backend_free(be);
}

// ---- ACT, GLU --------------------------------------------------------------------------

static double ref_act(int act, double x) {
    switch (act) {
    case NM_ACT_SILU: return x / (1.0 + exp(-x));
    case NM_ACT_GELU_TANH: return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    default: return x / (1.0 + exp(-1.702 * x)); // GELU_QUICK
    }
}

// x on a grid over [-40, 40] then random values, R rows of D: 33 x 1001 =
// 33033 elements, above the parallel threshold.
enum { ACT_D = 1001, ACT_R = 33 };
static void act_inputs(float *x) {
    for (int i = 0; i < ACT_D * ACT_R; i++) x[i] = i < 4001 ? (i - 2000) * 0.02f : 6.0f * frand();
}

NM_TEST(act_silu_gelu_tanh_gelu_quick) {
    nm_backend *be = cpu_backend(2, 64, 16);
    static float x[ACT_D * ACT_R];
    act_inputs(x);
    const char *names[] = {"silu", "gelu_tanh", "gelu_quick"};
    for (int act = NM_ACT_SILU; act <= NM_ACT_GELU_QUICK; act++)
        for (int R = 1; R <= ACT_R; R += ACT_R - 1) {
            float *y = out_buf((int64_t)ACT_D * R);
            nm_tensor X = f32t(x, ACT_D, R), Y = f32t(y, ACT_D, R);
            nm_op op = {.kind = NM_OP_ACT, .src0 = &X, .dst = &Y, .i0 = act};
            NM_CHECK(run1(be, &op) == NM_OK);
            double maxd = 0;
            for (int i = 0; i < ACT_D * R; i++) {
                const double want = ref_act(act, x[i]);
                maxd = worst(maxd, fabs(want - y[i]) / (1.0 + fabs(want)));
            }
            char what[64];
            snprintf(what, sizeof what, "act %s rows=%d", names[act], R);
            CHECK_ERR(what, maxd, 4e-7); // measured 9.3e-8 (all three), seeds 9.4e-8: 4x margin
            NM_CHECK(y[ACT_D * R] == GUARD);
            free(y);
        }
    nm_backend_free(be);
}

// ggml_gelu_f32, the formula ggml's f16 table is built from: f32 and tanhf.
// Its 1 + tanh cancels for x below about -3 (gelu(-5.29) comes out 0, not
// -3e-8), so for NM_OPF_GGML_F16 the f32 formula is the spec, not double.
static float ggml_gelu_f32(float x) {
    return 0.5f * x * (1.0f + tanhf(0.79788456080286535587989211986876f * x * (1.0f + 0.044715f * x * x)));
}

// ggml's f16 GELU: the input rounded to f16, gelu of that, rounded to f16;
// x <= -10 gives 0 and x >= 10 gives x unrounded. Bit for bit against the
// f32 formula, and within the f16 rounding (plus the f32 cancellation) of
// gelu in double.
NM_TEST(act_gelu_tanh_ggml_f16) {
    nm_backend *be = cpu_backend(2, 64, 16);
    static float x[ACT_D * ACT_R];
    act_inputs(x);
    const float edges[] = {-10.0f, 10.0f, -10.0001f, 9.999f, 10.0001f, -9.999f, 0.0f, -0.0f, 1e-5f, 123.456f};
    for (int i = 0; i < 10; i++) x[4001 + i] = edges[i];
    const int n = ACT_D * ACT_R;
    float *y = out_buf(n);
    nm_tensor X = f32t(x, ACT_D, ACT_R), Y = f32t(y, ACT_D, ACT_R);
    nm_op op = {.kind = NM_OP_ACT, .src0 = &X, .dst = &Y, .i0 = NM_ACT_GELU_TANH, .flags = NM_OPF_GGML_F16};
    NM_CHECK(run1(be, &op) == NM_OK);
    int mismatches = 0;
    double excess = 0;
    for (int i = 0; i < n; i++) {
        const float h = f16_round(x[i]);
        const float want = x[i] <= -10.0f ? 0.0f : x[i] >= 10.0f ? x[i] : f16_round(ggml_gelu_f32(h));
        mismatches += !(y[i] == want);
        const double exact = x[i] <= -10.0f ? 0.0 : x[i] >= 10.0f ? x[i] : ref_act(NM_ACT_GELU_TANH, h);
        excess = worst(excess, fabs(y[i] - exact) - 0x1p-11 * fabs(exact)); // past half an f16 ulp
    }
    CHECK_ERR("act gelu_tanh ggml: elements unlike the f32 table", mismatches, 0.0); // measured 0
    CHECK_ERR("act gelu_tanh ggml: error past f16 rounding", excess, 4e-7); // measured 1.0e-7, seeds 1.0e-7: 4x margin
    NM_CHECK(y[n] == GUARD);
    free(y);
    nm_backend_free(be);
}

NM_TEST(glu_silu_and_gelu_tanh) {
    nm_backend *be = cpu_backend(2, 64, 16);
    static float g[ACT_D * ACT_R], u[ACT_D * ACT_R];
    act_inputs(g);
    for (int i = 0; i < ACT_D * ACT_R; i++) u[i] = 2.0f * frand();
    for (int act = NM_ACT_SILU; act <= NM_ACT_GELU_TANH; act++)
        for (int R = 1; R <= ACT_R; R += ACT_R - 1) {
            float *y = out_buf((int64_t)ACT_D * R);
            nm_tensor G = f32t(g, ACT_D, R), U = f32t(u, ACT_D, R), Y = f32t(y, ACT_D, R);
            nm_op op = {.kind = NM_OP_GLU, .src0 = &G, .src1 = &U, .dst = &Y, .i0 = act};
            NM_CHECK(run1(be, &op) == NM_OK);
            double maxd = 0;
            for (int i = 0; i < ACT_D * R; i++) {
                const double want = ref_act(act, g[i]) * u[i];
                maxd = worst(maxd, fabs(want - y[i]) / (1.0 + fabs(want)));
            }
            char what[64];
            snprintf(what, sizeof what, "glu %s rows=%d", act == NM_ACT_SILU ? "silu" : "gelu_tanh", R);
            CHECK_ERR(what, maxd, 6e-7); // measured 1.4e-7 (silu), 1.5e-7 (gelu_tanh), seeds 1.5e-7: 4x margin
            NM_CHECK(y[ACT_D * R] == GUARD);
            free(y);
        }
    nm_backend_free(be);
}

// ---- ROPE --------------------------------------------------------------------------------

// theta_i = pos * freq_scale * base^(-2i / n_rot) in double. The op computes
// theta in f32, whose error grows with theta (an ulp of 1e5 is 0.008), so the
// bound on each output is (|x0| + |x1|) * FLT_EPSILON * (1 + theta) * ROPE_K.
// Rotated elements pair (2i, 2i+1) in NORM mode, (i, i + n_rot/2) in NEOX
// mode; elements from n_rot on are left exactly as they were.
#define ROPE_K 10.0 // measured 2.5, seeds 2.5 (base 1e6, n_rot 20: the f32 exponent -2i/20 is inexact): 4x margin

NM_TEST(rope_norm_neox_partial_bases_positions) {
    static const struct { int n_head, hd, n_rot; float base, fscale; } cfg[] = {
        {2, 64, 64, 10000.0f, 1.0f},  {3, 64, 32, 10000.0f, 1.0f},  {2, 128, 128, 1e6f, 1.0f},
        {2, 80, 20, 1e6f, 0.25f},     {1, 16, 8, 500000.0f, 0.3f},  {4, 32, 0, 10000.0f, 1.0f},
        {1, 2, 2, 10000.0f, 1.0f},
    };
    const int32_t positions[] = {0, 1, 2, 7, 100, 1000, 4095, 40000, 131071};
    enum { NP = sizeof positions / sizeof positions[0] };
    nm_backend *be = cpu_backend(2, 64, 16);
    for (size_t ci = 0; ci < sizeof cfg / sizeof cfg[0]; ci++)
        for (int mode = NM_ROPE_NORM; mode <= NM_ROPE_NEOX; mode += NM_ROPE_NEOX - NM_ROPE_NORM) {
            const int H = cfg[ci].n_head, hd = cfg[ci].hd, nr = cfg[ci].n_rot, W = H * hd;
            float x[NP * 4 * 128], x0[NP * 4 * 128]; // (NP, H, hd)
            for (int i = 0; i < NP * W; i++) x0[i] = x[i] = frand();
            x[NP * W] = GUARD;
            nm_tensor X = f32t(x, W, NP);
            nm_op op = {.kind = NM_OP_ROPE, .src0 = &X, .dst = &X, .ids = IDT(positions, NP), .f0 = cfg[ci].base,
                        .f1 = cfg[ci].fscale, .i0 = H, .i1 = hd, .i2 = mode, .i3 = nr};
            NM_CHECK(nm_backend_supports_op(be, &op));
            NM_CHECK(run1(be, &op) == NM_OK);
            double maxn = 0;
            int unrotated_changed = 0;
            for (int t = 0; t < NP; t++)
                for (int h = 0; h < H; h++) {
                    const float *in = x0 + (t * H + h) * hd, *got = x + (t * H + h) * hd;
                    for (int i = 0; i < nr / 2; i++) {
                        const double theta = (double)positions[t] * cfg[ci].fscale *
                                             pow(cfg[ci].base, -2.0 * i / nr);
                        const int a = mode == NM_ROPE_NEOX ? i : 2 * i, b = mode == NM_ROPE_NEOX ? i + nr / 2 : 2 * i + 1;
                        const double wa = in[a] * cos(theta) - in[b] * sin(theta);
                        const double wb = in[a] * sin(theta) + in[b] * cos(theta);
                        const double unit = (fabs(in[a]) + fabs(in[b])) * FLT_EPSILON * (1.0 + theta);
                        maxn = worst(maxn, fmax(fabs(wa - got[a]), fabs(wb - got[b])) / unit);
                    }
                    for (int i = nr; i < hd; i++) unrotated_changed += got[i] != in[i];
                }
            char what[96];
            snprintf(what, sizeof what, "rope %s H=%d hd=%d n_rot=%d base=%g scale=%g (in eps*(1+theta))",
                     mode == NM_ROPE_NEOX ? "neox" : "norm", H, hd, nr, cfg[ci].base, cfg[ci].fscale);
            CHECK_ERR(what, maxn, ROPE_K);
            NM_CHECK(unrotated_changed == 0);
            NM_CHECK(x[NP * W] == GUARD);
        }
    nm_backend_free(be);
}

// Prefill: 130 tokens x 4 heads x 64 = 33280 elements, split over two threads.
NM_TEST(rope_prefill_two_threads) {
    enum { T = 130, H = 4, HD = 64, W = H * HD };
    nm_backend *be = cpu_backend(2, 64, 16);
    static float x[T * W + 1], x0[T * W];
    static int32_t pos[T];
    for (int t = 0; t < T; t++) pos[t] = (t * 7919) % 50000;
    for (int mode = NM_ROPE_NORM; mode <= NM_ROPE_NEOX; mode += NM_ROPE_NEOX - NM_ROPE_NORM) {
        for (int i = 0; i < T * W; i++) x0[i] = x[i] = frand();
        x[T * W] = GUARD;
        nm_tensor X = f32t(x, W, T);
        nm_op op = {.kind = NM_OP_ROPE, .src0 = &X, .dst = &X, .ids = IDT(pos, T), .f0 = 1e6f, .f1 = 1.0f, .i0 = H,
                    .i1 = HD, .i2 = mode, .i3 = HD};
        NM_CHECK(run1(be, &op) == NM_OK);
        double maxn = 0;
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++)
                for (int i = 0; i < HD / 2; i++) {
                    const float *in = x0 + (t * H + h) * HD, *got = x + (t * H + h) * HD;
                    const double theta = pos[t] * pow(1e6, -2.0 * i / HD);
                    const int a = mode == NM_ROPE_NEOX ? i : 2 * i, b = mode == NM_ROPE_NEOX ? i + HD / 2 : 2 * i + 1;
                    const double wa = in[a] * cos(theta) - in[b] * sin(theta), wb = in[a] * sin(theta) + in[b] * cos(theta);
                    const double unit = (fabs(in[a]) + fabs(in[b])) * FLT_EPSILON * (1.0 + theta);
                    maxn = worst(maxn, fmax(fabs(wa - got[a]), fabs(wb - got[b])) / unit);
                }
        CHECK_ERR(mode == NM_ROPE_NEOX ? "rope prefill neox" : "rope prefill norm", maxn, ROPE_K);
        NM_CHECK(x[T * W] == GUARD);
    }
    nm_backend_free(be);
}

// ---- KV_STORE ------------------------------------------------------------------------------

// The stored bits are round-to-nearest-even f16 of K and V at rows
// pos..pos+n_tok-1, and not one other element of either cache changes.
NM_TEST(kv_store_exact_bits_and_nothing_else) {
    enum { KVH = 2, HD = 24, W = KVH * HD, NCTX = 40 };
    nm_backend *be = cpu_backend(2, 64, 16);
    static uint16_t kc[NCTX * W], vc[NCTX * W], kwant[NCTX * W], vwant[NCTX * W]; // (NCTX, W)
    for (int i = 0; i < NCTX * W; i++) kc[i] = kwant[i] = (uint16_t)(0x1234 + 7 * i), vc[i] = vwant[i] = (uint16_t)(0x4321 + 3 * i);
    nm_kv_layer kv = kv_at(kc, vc, W, NCTX);
    int32_t ids[8];
    // ties to even at 1 and in the subnormals, the largest finite, overflow, underflow, signed zero
    const float special[] = {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, -(1.0f + 0x1p-11f), 3 * 0x1p-25f, 5 * 0x1p-25f,
                             0x1p-24f,        0x1p-26f,            0x1p-14f - 0x1p-26f, 65504.0f, 65519.0f,
                             65520.0f,        -1e6f,               -0.0f,             1e-9f,    0.1f,
                             2049.0f,         2051.0f,             -7.0e-5f,          6.1e-5f,  1.0f / 3.0f};
    const int stores[][2] = {{11, 5}, {0, 1}, {NCTX - 3, 3}, {20, 0}}; // (pos, n_tok)
    for (int s = 0; s < 4; s++) {
        const int pos = stores[s][0], T = stores[s][1];
        float k[5 * W], v[5 * W]; // (T, W)
        for (int i = 0; i < T * W; i++) {
            k[i] = 4.0f * frand(), v[i] = frand() * 100.0f;
            if (i < 20) k[i] = special[i], v[i] = -special[19 - i];
        }
        for (int i = 0; i < T * W; i++) kwant[pos * W + i] = ref_half_bits(k[i]), vwant[pos * W + i] = ref_half_bits(v[i]);
        nm_tensor Kt = f32t(k, W, T), Vt = f32t(v, W, T);
        nm_op op = {.kind = NM_OP_KV_STORE, .src0 = &Kt, .src1 = &Vt, .ids = IDT(seq_ids(ids, pos, T), T), .kv = &kv, .n_ctx = NCTX};
        NM_CHECK(run1(be, &op) == NM_OK);
        int bad = 0;
        for (int i = 0; i < NCTX * W; i++) bad += kc[i] != kwant[i] || vc[i] != vwant[i];
        CHECK_ERR("kv_store: cache elements not as expected", bad, 0.0); // measured 0
    }
    // past the end or before the start: refused, the cache untouched
    float k[4 * W] = {0}, v[4 * W] = {0};
    nm_tensor Kt = f32t(k, W, 4), Vt = f32t(v, W, 4);
    nm_op past = {.kind = NM_OP_KV_STORE, .src0 = &Kt, .src1 = &Vt, .ids = IDT(seq_ids(ids, NCTX - 3, 4), 4),
                  .kv = &kv, .n_ctx = NCTX};
    NM_CHECK(run1(be, &past) == NM_ERR_RANGE);
    past.ids = IDT(seq_ids(ids, -1, 4), 4);
    NM_CHECK(run1(be, &past) == NM_ERR_RANGE);
    NM_CHECK(!memcmp(kc, kwant, sizeof kc) && !memcmp(vc, vwant, sizeof vc));
    nm_backend_free(be);
}

// ---- ATTENTION, ATTENTION_FULL ---------------------------------------------------------

// One query over keys [lo, hi] in double: s_j = (q . k_j) scale, capped as
// c tanh(s/c) if c > 0, softmax, sum_j p_j v_j. Rows of k and v are `stride`
// floats apart. slack != NULL: each p_j is rounded to f16 first (ggml), and
// where p_j lies within P_AMBIG (relative) of an f16 rounding point, the f32
// softmax of the op may round it the other way: slack[d] adds that ulp of
// p_j times |v_j[d]|, the most such a flip can move out[d]. Over nine seeds
// the f32 p_j stayed within 5e-7 of the double one (2e-7 let flips through):
// 2e-6 is a 4x margin.
#define P_AMBIG 2e-6
static void ref_attend(const float *q, const float *k, const float *v, int64_t stride, int hd, int lo, int hi,
                       double scale, double softcap, double *out, double *slack) {
    static double p[1024], amb[1024]; // (hi - lo + 1)
    double m = -INFINITY, sum = 0;
    for (int j = lo; j <= hi; j++) {
        double s = 0;
        for (int d = 0; d < hd; d++) s += (double)q[d] * k[(int64_t)j * stride + d];
        s *= scale;
        if (softcap > 0) s = softcap * tanh(s / softcap);
        p[j - lo] = s;
        m = fmax(m, s);
    }
    for (int j = lo; j <= hi; j++) sum += (p[j - lo] = exp(p[j - lo] - m));
    for (int j = lo; j <= hi; j++) {
        p[j - lo] /= sum;
        if (!slack) continue;
        const double pj = p[j - lo];
        p[j - lo] = f16_round((float)pj);
        amb[j - lo] = f16_round((float)(pj * (1 + P_AMBIG))) - f16_round((float)(pj * (1 - P_AMBIG)));
    }
    for (int d = 0; d < hd; d++) {
        double o = 0, sl = 0;
        for (int j = lo; j <= hi; j++) {
            o += p[j - lo] * v[(int64_t)j * stride + d];
            if (slack) sl += amb[j - lo] * fabs(v[(int64_t)j * stride + d]);
        }
        out[d] = o;
        if (slack) slack[d] = sl;
    }
}

// Causal attention over a cache filled by KV_STORE (two stores), queries at
// scattered positions (first, last, middle), grouped-query heads (6 over 2,
// 4 over 1, and 4 over 4), sliding windows 1 and 8, softcap 2.5 (scores up to
// ~4, well inside its bend). The reference reads K and V rounded to f16, as
// the cache holds them.
NM_TEST(attention_causal_gqa_window_softcap) {
    enum { HD = 40, NCTX = 64, T = 6, MAXW = 6 * HD };
    static const int heads[][2] = {{6, 2}, {4, 1}, {4, 4}};
    const int32_t pos[T] = {0, 1, 9, 33, 34, 63};
    nm_backend *be = cpu_backend(2, 64, 16);
    for (int hi = 0; hi < 3; hi++) {
        const int H = heads[hi][0], KVH = heads[hi][1], KW = KVH * HD;
        static float k[NCTX * MAXW], v[NCTX * MAXW], kr[NCTX * MAXW], vr[NCTX * MAXW]; // (NCTX, KW)
        static uint16_t kc[NCTX * MAXW], vc[NCTX * MAXW];
        static float q[T * MAXW], qr[T * MAXW], o[T * MAXW + 1]; // (T, H, HD)
        for (int i = 0; i < NCTX * KW; i++) {
            k[i] = 2.0f * frand(), v[i] = frand();
            kr[i] = f16_round(k[i]), vr[i] = f16_round(v[i]);
        }
        for (int i = 0; i < T * H * HD; i++) q[i] = 2.0f * frand(), qr[i] = f16_round(q[i]);
        nm_kv_layer kv = kv_at(kc, vc, KW, NCTX);
        int32_t ids[32];
        for (int half = 0; half < 2; half++) {
            nm_tensor Kt = f32t(k + half * 32 * KW, KW, 32), Vt = f32t(v + half * 32 * KW, KW, 32);
            nm_op st = {.kind = NM_OP_KV_STORE, .src0 = &Kt, .src1 = &Vt, .ids = IDT(seq_ids(ids, half * 32, 32), 32), .kv = &kv,
                        .n_ctx = NCTX};
            NM_CHECK(run1(be, &st) == NM_OK);
        }
        nm_tensor Q = f32t(q, H * HD, T), O = f32t(o, H * HD, T);
        const float scale = 1.0f / sqrtf((float)HD);
        for (int ggml = 0; ggml < 2; ggml++)
            for (int win = 0; win <= 8; win += win ? 7 : 1)
                for (int cap = 0; cap < 2; cap++) {
                    const float softcap = cap ? 2.5f : 0.0f;
                    nm_op op = {.kind = NM_OP_ATTENTION, .src0 = &Q, .dst = &O, .ids = IDT(pos, T), .kv = &kv, .f0 = scale,
                                .f1 = softcap, .i0 = H, .i1 = KVH, .i2 = HD, .i3 = win, .n_ctx = NCTX,
                                .flags = ggml ? NM_OPF_GGML_F16 : 0};
                    if (ggml && cap) { // ggml's path has no softcap: refused, not ignored
                        NM_CHECK(!nm_backend_supports_op(be, &op));
                        continue;
                    }
                    for (int i = 0; i < T * H * HD; i++) o[i] = NAN;
                    o[T * H * HD] = GUARD;
                    NM_CHECK(run1(be, &op) == NM_OK);
                    double maxd = 0, want[HD], slack[HD];
                    for (int t = 0; t < T; t++)
                        for (int h = 0; h < H; h++) {
                            const int g = h * KVH / H; // heads [g H/KVH, (g+1) H/KVH) share KV head g
                            const int lo = win && pos[t] - win + 1 > 0 ? pos[t] - win + 1 : 0;
                            ref_attend((ggml ? qr : q) + (t * H + h) * HD, kr + g * HD, vr + g * HD, KW, HD, lo, pos[t],
                                       scale, softcap, want, ggml ? slack : NULL);
                            for (int d = 0; d < HD; d++)
                                maxd = worst(maxd, fabs(want[d] - o[(t * H + h) * HD + d]) - (ggml ? slack[d] : 0));
                        }
                    char what[96];
                    snprintf(what, sizeof what, "attention H=%d KV=%d window=%d softcap=%g ggml=%d", H, KVH, win,
                             softcap, ggml);
                    CHECK_ERR(what, maxd, 1.2e-6); // measured 2.4e-7 (f32), 1.1e-7 (ggml, past the slack); seeds 2.9e-7: 4x margin
                    NM_CHECK(o[T * H * HD] == GUARD);
                }
    }
    nm_backend_free(be);
}

// Bidirectional attention, several heads, T around and off the 16-key panels
// and 32-query blocks (1, 17, 45, 77, 100), head sizes off 16; two threads
// split the queries of a head. ggml mode rounds Q, K, V and p to f16.
NM_TEST(attention_full_heads_and_odd_lengths) {
    static const int shapes[][3] = {{1, 1, 8}, {17, 2, 24}, {45, 3, 24}, {77, 2, 40}, {100, 4, 16}}; // T, H, hd
    nm_backend *be = cpu_backend_attn(2, 64, 16, 100, 40);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int T = shapes[si][0], H = shapes[si][1], hd = shapes[si][2], W = H * hd;
        float *q = malloc(sizeof(float) * T * W), *k = malloc(sizeof(float) * T * W), *v = malloc(sizeof(float) * T * W);
        float *qr = malloc(sizeof(float) * T * W), *kr = malloc(sizeof(float) * T * W), *vr = malloc(sizeof(float) * T * W);
        for (int i = 0; i < T * W; i++) { // (T, H, hd) each
            q[i] = 2.0f * frand(), k[i] = 2.0f * frand(), v[i] = frand();
            qr[i] = f16_round(q[i]), kr[i] = f16_round(k[i]), vr[i] = f16_round(v[i]);
        }
        const float scale = 1.0f / sqrtf((float)hd);
        for (int ggml = 0; ggml < 2; ggml++) {
            float *o = out_buf((int64_t)T * W);
            nm_tensor Q = f32t(q, W, T), K = f32t(k, W, T), V = f32t(v, W, T), O = f32t(o, W, T);
            nm_op op = {.kind = NM_OP_ATTENTION_FULL, .src0 = &Q, .src1 = &K, .src2 = &V, .dst = &O, .f0 = scale,
                        .i0 = H, .i2 = hd, .flags = ggml ? NM_OPF_GGML_F16 : 0};
            NM_CHECK(run1(be, &op) == NM_OK);
            double maxd = 0, want[64], slack[64];
            for (int t = 0; t < T; t++)
                for (int h = 0; h < H; h++) {
                    const float *qq = (ggml ? qr : q) + t * W + h * hd;
                    ref_attend(qq, (ggml ? kr : k) + h * hd, (ggml ? vr : v) + h * hd, W, hd, 0, T - 1, scale, 0, want,
                               ggml ? slack : NULL);
                    for (int d = 0; d < hd; d++)
                        maxd = worst(maxd, fabs(want[d] - o[t * W + h * hd + d]) - (ggml ? slack[d] : 0));
                }
            char what[80];
            snprintf(what, sizeof what, "attention_full T=%d H=%d hd=%d ggml=%d", T, H, hd, ggml);
            CHECK_ERR(what, maxd, 1.6e-6); // measured 3.4e-7 (f32), 1.7e-7 (ggml, past the slack); seeds 4.3e-7: 3.7x margin
            NM_CHECK(o[T * W] == GUARD);
            free(o);
        }
        free(q), free(k), free(v), free(qr), free(kr), free(vr);
    }
    nm_backend_free(be);
}

// ---- MATMUL ----------------------------------------------------------------------------------

// Activation j of a row as the q8_0 and q4_0 dots see it: llama.cpp's x86
// quantize_row_q8_0 per block of 32, q = rint(x 127 / amax) (half to even),
// d = amax / 127 stored as f16.
static double ref_act_q8_0(const float *x, int64_t j) {
    const float *b = x + j / 32 * 32;
    float amax = 0;
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(b[i]));
    if (amax == 0) return 0;
    return ref_half(ref_half_bits(amax / 127.0f)) * rintf(x[j] * (127.0f / amax));
}

// f32 and f16 weights (K = 77) and q8_0, q4_0 (K = 96) with and without a
// bias, decode (T = 1), a few tokens and a packed prefill batch. Activations
// as each path takes them: f16 weights take f16 activations in decode (their
// vec_dot type) and in prefill only with NM_OPF_GGML_F16; q8_0 and q4_0 take
// q8_0 activations. Error relative to sum_k |w x| + |b|.
NM_TEST(matmul_f32_f16_q8_0_q4_0_bias) {
    enum { KMAX = 96, O = 21, TMAX = 20 };
    nm_backend *be = cpu_backend(2, KMAX, TMAX);
    static float wf[O * KMAX], x[TMAX * KMAX], bias[O]; // (O, K), (T, K)
    for (int i = 0; i < O * KMAX; i++) wf[i] = frand();
    for (int i = 0; i < TMAX * KMAX; i++) x[i] = 3.0f * frand();
    for (int i = 0; i < O; i++) bias[i] = frand();
    const uint32_t types[] = {NM_TYPE_F32, NM_TYPE_F16, NM_TYPE_Q8_0, NM_TYPE_Q4_0};
    for (int ti = 0; ti < 4; ti++) {
        const uint32_t t = types[ti];
        const int K = t <= NM_TYPE_F16 ? 77 : KMAX;
        const size_t rb = nm_row_size(t, K);
        uint8_t *w = malloc(rb * O);
        for (int r = 0; r < O; r++) nm_quantize_row_ref(t, wf + r * K, w + r * rb, K);
        nm_tensor Wt = {.type = t, .ne = {K, O, 1, 1}, .offs = (size_t)(uintptr_t)(w)}, Bt = f32t(bias, O, 1);
        const int Ts[] = {1, 3, TMAX};
        for (int k = 0; k < 3; k++)
            for (int ggml = 0; ggml < 2; ggml++)
                for (int hb = 0; hb < 2; hb++) {
                    const int T = Ts[k];
                    float *y = out_buf((int64_t)T * O);
                    nm_tensor X = f32t(x, K, T), Y = f32t(y, O, T);
                    nm_op op = {.kind = NM_OP_MATMUL, .src0 = &Wt, .src1 = &X, .src2 = hb ? &Bt : NULL, .dst = &Y,
                                .flags = ggml ? NM_OPF_GGML_F16 : 0};
                    NM_CHECK(run1(be, &op) == NM_OK);
                    const bool round_x = t == NM_TYPE_F16 && (T == 1 || ggml), q8 = t > NM_TYPE_F16;
                    double maxd = 0;
                    for (int tok = 0; tok < T; tok++)
                        for (int r = 0; r < O; r++) {
                            double s = hb ? bias[r] : 0.0, sa = fabs(s);
                            for (int j = 0; j < K; j++) {
                                const float *xr = x + tok * K;
                                const double xv = q8 ? ref_act_q8_0(xr, j) : round_x ? f16_round(xr[j]) : xr[j];
                                const double p = ref_dequant(t, w + (size_t)r * rb, j) * xv;
                                s += p, sa += fabs(p);
                            }
                            maxd = worst(maxd, fabs(s - y[tok * O + r]) / sa);
                        }
                    char what[80];
                    snprintf(what, sizeof what, "matmul %s T=%d ggml=%d bias=%d", nm_type_traits_get(t)->name, T, ggml, hb);
                    // measured 1.3e-7 (f32, f16: sums of 77 f32 products), 3.5e-8 (q8_0, q4_0: integer block dots);
                    // seeds 2.6e-7 and 3.9e-8: 3.8x and 5x margins
                    CHECK_ERR(what, maxd, q8 ? 2e-7 : 1e-6);
                    NM_CHECK(y[T * O] == GUARD);
                    free(y);
                }
        free(w);
    }
    nm_backend_free(be);
}

NM_TEST_MAIN()
