// Piper's VITS on our kernels (src/bricks/tts/piper/vits.h) and its convolutions
// (src/backend/cpu/conv1d.h):
//   conv1d_matches_reference, conv_t1d_matches_reference  the direct forms against the
//       definition's loops, over kernels, dilations, pads, strides, channel counts around the
//       kernel's vectors (1 .. 4 of 16, a partial one) and lengths around a chunk
//   conv_rows_match_reference  this CPU's row kernel against the reference kernel, bit for bit
//   conv_ops_on_each_backend   NM_OP_CONV1D / NM_OP_CONV_T1D / ACT tanh on the CPU and OpenCL backends
//   piper_on_opencl_equals_cpu HiFi-GAN on OpenCL: the CPU's samples within 80 dB; the engine there
//   bench_conv_shapes          (NM_PIPER_BENCH=1, a bench) the kernels' GFLOP/s on the voice's shapes
//   bench_piper_phases         (NM_PIPER_BENCH=1, a bench) the default voice's 30 sentences: time by phase, RTF
//   piper_voice_loads          the default voice's rate, hop, scales and phoneme map
//   piper_refuses_bad_input    ids out of range, none, scales out of range, a GGUF that is no voice
//   piper_noise_seeded         with the noises on: the same seed the same samples, another seed others
//   piper_normals_as_drawn_one_by_one  the noises' draws against a one-at-a-time reference, bit for bit
//   piper_matches_onnxruntime  the cases tests/tools/test_piper_ort.py wrote from onnxruntime
//       (NM_PIPER_ORACLE: a folder of N.ids, N.scales, N.f32): the same length, SNR >= 80 dB on
//       the f32 kernels, >= 65 dB where AMX's bf16x3 products run
//   nfd_decomposes_and_orders  Unicode's NFD: precomposed letters, Hangul, marks in canonical order
//   piper_phonemes             text -> ids as piper-tts makes them (sentences, terminators, the map)
//   piper_engine_open_readies_espeak  a voice whose espeak-ng voice is missing fails to open, naming it
//   piper_engine_speaks        the engine through nm_tts: the samples of VITS's output as piper-tts
//       scales them, the voice's scales and ours, a pitch refused
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/cpu/conv1d.h"
#include "backend/cpu/gemm.h"
#include "bricks/tts/piper/piper.h"
#include "bricks/tts/piper/vits.h"
#include "nmtest.h"

static uint64_t g_rng = 0x1234567;
static nm_pool *g_pool; // two threads (made by the first test that needs them)
__attribute__((constructor)) static void make_pool(void) { g_pool = nm_pool_create(2); }
static float frand(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (float)((g_rng >> 11) % 2000001) / 1000000.0f - 1.0f;
}

static float *randv(int64_t n) {
    float *p = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; i < n; i++) p[i] = frand();
    return p;
}

// max |a - b| over n, relative to max |b| (or 1)
static double rel_err(const float *a, const float *b, int64_t n) {
    double e = 0, m = 1e-6;
    for (int64_t i = 0; i < n; i++) e = fmax(e, fabs((double)a[i] - b[i])), m = fmax(m, fabs((double)b[i]));
    return e / m;
}

// Error bounds against the reference (relative to the largest output): f32 sums in another order,
// AMX's bf16x3 products (each operand to 16 significant bits), and Winograd's transforms (their rounding
// ~5e-6 of the outputs' RMS, ~106 dB; the largest of ~27000 outputs ~4x that).
#define F32_BOUND 1e-5
#define AMX_BOUND 2e-5
#define WINO_BOUND 5e-5

// Each case in rounds: the layout this CPU's packing picks (AMX where it can, unless NM_NO_AMX was set
// for the run), then the f32 kernels' (NM_NO_AMX=1 for the round; round -1 puts the run's setting back);
// convolutions in 3 rounds, the last with Winograd's form not allowed (the direct f32 kernel).
static bool g_force_f32;
static void pick(int round) {
    static int saved = -1; // NM_NO_AMX=1 given to the run
    if (saved < 0) saved = getenv("NM_NO_AMX") && !strcmp(getenv("NM_NO_AMX"), "1");
    g_force_f32 = round >= 1 || saved;
    if (g_force_f32) setenv("NM_NO_AMX", "1", 1);
    else unsetenv("NM_NO_AMX");
}

NM_TEST(conv1d_matches_reference) {
    const struct { int32_t ic, oc, k, dil, pl, pr; int64_t n; bool bias; } cs[] = {
        {3, 5, 1, 1, 0, 0, 7, true},    {8, 16, 3, 1, 1, 1, 1, true},  {8, 16, 3, 1, 1, 1, 600, true},
        {32, 32, 7, 12, 36, 36, 90, true}, {16, 24, 5, 2, 4, 4, 1000, false}, {4, 6, 4, 1, 1, 2, 33, true},
        {192, 384, 5, 1, 2, 2, 70, true}, {5, 1, 7, 1, 3, 3, 300, false}, {6, 6, 3, 3, 3, 3, 5, true},
        {7, 40, 3, 1, 1, 1, 100, true},    {9, 100, 2, 5, 0, 3, 250, true},  {3, 17, 1, 1, 0, 0, 97, false},
        {64, 48, 3, 2, 2, 2, 61, true},    {96, 16, 1, 1, 0, 0, 17, false},  {32, 64, 5, 6, 12, 12, 400, true},
        {20, 17, 3, 1, 1, 1, 5, true},     {128, 128, 7, 2, 6, 6, 3000, true}, {48, 16, 4, 1, 1, 2, 33, false},
        {16, 16, 6, 3, 0, 0, 40, true},    {16, 32, 7, 1, 3, 3, 2, true},      {24, 16, 3, 64, 64, 64, 300, true},
        {16, 20, 8, 2, 7, 7, 90, true},    {32, 16, 2, 3, 1, 2, 41, false},
    };
    int amx_cases = 0, wino_cases = 0;
    for (int round = 0; round < 4; round++)
        for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
            pick(round);
            float *w = randv((int64_t)cs[i].oc * cs[i].ic * cs[i].k);
            float *b = cs[i].bias ? randv(cs[i].oc) : NULL, *x = randv(cs[i].n * cs[i].ic);
            const float slope = i % 3 == 0 ? 1.0f : i % 3 == 1 ? 0.1f : 0.0f; // (none, HiFi-GAN's leaky ReLU, a ReLU)
            nm_conv1d c = {.bias = b, .ic = cs[i].ic, .oc = cs[i].oc, .k = cs[i].k, .dil = cs[i].dil, .in_slope = slope,
                           .winograd = round < 2 ? 10 : round == 2 ? 0 : i % 2 ? 8 : 6};
            float *pk = aligned_alloc(64, sizeof(float) * (size_t)((nm_conv1d_packed_size(&c) + 15) & ~15));
            nm_conv1d_pack(&c, w, pk);
            NM_CHECK(!c.wx == !nm_conv_amx_for(c.ic, c.oc, c.k) && !c.w != !c.wx && !(g_force_f32 && c.wx));
            // Winograd's form exactly where allowed: f32, 3 .. n - 2 taps, 16 channels or more each side
            const bool wino = c.winograd && !c.wx && c.k >= 2 && c.k <= c.winograd - 2 && c.ic >= 16 && c.oc >= 16 &&
                              !getenv("NM_NO_WINOGRAD");
            NM_CHECK(wino == (c.wm > 0) && (!wino || c.wm == c.winograd + 1 - c.k));
            amx_cases += c.wx != NULL;
            wino_cases += c.wm > 0;
            const int64_t n_out = cs[i].n + cs[i].pl + cs[i].pr - (int64_t)cs[i].dil * (cs[i].k - 1);
            float *y = randv(n_out * cs[i].oc), *r = randv(n_out * cs[i].oc), *y2 = randv(n_out * cs[i].oc);
            float *work = aligned_alloc(64, sizeof(float) * (size_t)((nm_conv1d_work(&c, 2) + 15) & ~15));
            NM_CHECK(nm_conv1d_run(&c, x, cs[i].n, cs[i].pl, cs[i].pr, 0, NULL, y, work, NULL) == n_out);
            NM_CHECK(nm_conv1d_run(&c, x, cs[i].n, cs[i].pl, cs[i].pr, 0, NULL, y2, work, g_pool) == n_out); // (the same on two threads)
            NM_CHECK(!memcmp(y, y2, sizeof(float) * (size_t)(n_out * c.oc)));
            // a part of the sequence (its inputs from row a on, its first output the whole's row a): the
            // whole's outputs bit for bit, from where the part's tiles read none of its zeros before row 0 on
            const int64_t p0 = cs[i].n / 3 + 1, from = cs[i].pl + (c.wm ? (int64_t)(c.wm - 1) * c.dil : 0);
            if (n_out - p0 > 0) {
                float *yp = randv((n_out - p0) * c.oc);
                NM_CHECK(nm_conv1d_run(&c, x + p0 * c.ic, cs[i].n - p0, cs[i].pl, cs[i].pr, p0, NULL, yp, work, g_pool) ==
                         n_out - p0);
                NM_CHECK(from >= n_out - p0 || !memcmp(yp + from * c.oc, y + (p0 + from) * c.oc,
                                                       sizeof(float) * (size_t)((n_out - p0 - from) * c.oc)));
                free(yp);
            }
            NM_CHECK(nm_conv1d_ref(&c, w, x, cs[i].n, cs[i].pl, cs[i].pr, r) == n_out);
            // the terms added as the sums are stored: y2 = (conv + a + y2) * 0.5, y2 one of them (as HiFi-GAN's mean)
            float *a = randv(n_out * c.oc), *want2 = malloc(sizeof(float) * (size_t)(n_out * c.oc));
            for (int64_t e = 0; e < n_out * c.oc; e++) want2[e] = (r[e] + a[e] + y2[e]) * 0.5f;
            const nm_conv_add add = {.a = a, .b = y2, .scale = 0.5f};
            NM_CHECK(nm_conv1d_run(&c, x, cs[i].n, cs[i].pl, cs[i].pr, 0, &add, y2, work, g_pool) == n_out);
            const double bound = c.wx ? AMX_BOUND : c.wm ? WINO_BOUND : F32_BOUND;
            NM_CHECK(rel_err(y2, want2, n_out * c.oc) < bound);
            free(y2), free(a), free(want2);
            // (the reference's definition from PyTorch's layout, element by element, for one output)
            const int64_t t = n_out / 2;
            double want = b ? b[0] : 0;
            for (int32_t j = 0; j < c.k; j++)
                for (int32_t ic = 0; ic < c.ic; ic++) {
                    const int64_t s = t + (int64_t)j * c.dil - cs[i].pl;
                    if (s >= 0 && s < cs[i].n)
                        want += (double)w[((int64_t)0 * c.ic + ic) * c.k + j] * fmaxf(x[s * c.ic + ic], slope * x[s * c.ic + ic]);
                }
            NM_CHECK(fabs(r[t * c.oc] - want) < 1e-4 * (1 + fabs(want)));
            const double e = rel_err(y, r, n_out * c.oc);
            NM_CHECK(e < bound);
            if (!(e < bound)) printf("  case %zu (%s): relative error %g\n", i, c.wx ? "amx" : c.wm ? "winograd" : "f32", e);
            free(w), free(pk), free(b), free(x), free(y), free(r), free(work);
        }
    pick(-1);
    if (!nm_conv_amx_for(32, 16, 3)) printf("  (no AMX here, or NM_NO_AMX=1: the f32 kernel only)\n");
    else NM_CHECK(amx_cases == 6);
    NM_CHECK(getenv("NM_NO_WINOGRAD") || wino_cases >= 20);
    // an input shorter than the kernel's reach, unpadded: no output
    float w[16 * 6 * 3] = {0}, x[2 * 6] = {0}, y[6];
    const nm_conv1d c = {.w = w, .ic = 6, .oc = 6, .k = 3, .dil = 3, .in_slope = 1};
    NM_CHECK(nm_conv1d_run(&c, x, 2, 0, 0, 0, NULL, y, NULL, NULL) == 0 && nm_conv1d_ref(&c, w, x, 2, 0, 0, y) == 0);
}

// The row kernel this CPU uses against the reference kernel (the same sums in the same order; FMA's
// single rounding against the reference's two: relative error < 1e-6); taps forwards, dilated and
// backwards, every channel count from 1 to 70 (whole and partial vectors, 1 .. 4 at a time), rows
// that leave a partial block, and the rows between the stored ones left as they were; every third count
// as a part of a wider weight (its rows 16 channels longer: ldw).
NM_TEST(conv_rows_match_reference) {
    const nm_conv_rows_fn k = nm_conv_rows_get();
    if (k == nm_conv_rows_ref) NM_SKIP("no SIMD row kernel on this CPU");
    const int32_t ic = 11, taps = 3;
    const int64_t rows = 31, xrows = 2 * NM_CONV_ROWS + 2 * 5 * (taps - 1) + 8;
    float *x = randv(xrows * ic), *w = randv((int64_t)taps * ic * 96), *b = randv(80);
    float *y = malloc(sizeof(float) * rows * 80), *r = malloc(sizeof(float) * rows * 80);
    int bad = 0;
    for (int32_t oc = 1; oc <= 70; oc++)
        for (int s = 0; s < 3; s++) {
            const int64_t xstep = s == 0 ? 1 : s == 1 ? 5 : -1;
            const float *x0 = x + (s == 2 ? (taps - 1) * ic : 0);
            const int32_t ocp = ((oc + 15) & ~15) + (oc % 3 ? 0 : 16);
            memset(y, 0, sizeof(float) * rows * 80), memset(r, 0, sizeof(float) * rows * 80);
            k(x0, xstep, w, (int64_t)ic * ocp, taps, ic, oc, ocp, oc % 2 ? b : NULL, rows, NULL, y, oc + 3);
            nm_conv_rows_ref(x0, xstep, w, (int64_t)ic * ocp, taps, ic, oc, ocp, oc % 2 ? b : NULL, rows, NULL, r, oc + 3);
            if (rel_err(y, r, rows * (oc + 3)) > 1e-6) bad++;
        }
    NM_CHECK(bad == 0);
    if (bad) printf("  %d of 210 shapes differ\n", bad);
    free(x), free(w), free(b), free(y), free(r);
}

// The gate tanh(a) sigmoid(b) and tanh (AVX-512, exp512) against libm's, over [-12, 12] and near 0:
// absolute error below 1e-6, relative below 1e-5 where |tanh| > 1e-3; a tail of 7 elements masked.
NM_TEST(gate_tanh_match_libm) {
    const nm_gemm_panel_kernels *pk = nm_gemm_panel_get();
    if (!pk) NM_SKIP("no AVX-512 panel kernels on this CPU");
    enum { N = 4103 };
    float *a = malloc(sizeof(float) * N), *b = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * (N + 16));
    for (int i = 0; i < N; i++) a[i] = i < 2000 ? -12 + 24.0f * i / 2000 : (i - 3000) * 1e-4f, b[i] = frand() * 9;
    y[N] = 7;
    pk->gate(a, b, y, N);
    double e = 0, er = 0;
    for (int i = 0; i < N; i++) {
        const double w = tanh((double)a[i]) / (1 + exp(-(double)b[i]));
        e = fmax(e, fabs(y[i] - w));
        if (fabs(w) > 1e-3) er = fmax(er, fabs(y[i] - w) / fabs(w));
    }
    NM_CHECK(e < 1e-6 && er < 1e-5 && y[N] == 7);
    if (!(e < 1e-6 && er < 1e-5)) printf("  gate: absolute %g, relative %g\n", e, er);
    memcpy(y, a, sizeof(float) * N);
    pk->tanh(y, N);
    e = 0, er = 0;
    for (int i = 0; i < N; i++) {
        const double w = tanh((double)a[i]);
        e = fmax(e, fabs(y[i] - w));
        if (fabs(w) > 1e-3) er = fmax(er, fabs(y[i] - w) / fabs(w));
    }
    NM_CHECK(e < 1e-6 && er < 1e-5 && y[N] == 7);
    if (!(e < 1e-6 && er < 1e-5)) printf("  tanh: absolute %g, relative %g\n", e, er);
    free(a), free(b), free(y);
}

NM_TEST(conv_t1d_matches_reference) {
    const struct { int32_t ic, oc, k, stride; int64_t n; } cs[] = {
        {256, 128, 16, 8, 40}, {128, 64, 16, 8, 1}, {64, 32, 8, 4, 700}, {6, 3, 4, 2, 9}, {5, 7, 3, 1, 20},
        {4, 20, 3, 4, 9}, {8, 50, 5, 2, 300}, {32, 16, 3, 4, 33}, {64, 48, 4, 2, 250}, {48, 20, 6, 3, 57},
        {32, 16, 12, 4, 100}, {16, 16, 5, 2, 31}, {16, 8, 16, 8, 2}, {24, 24, 4, 4, 40},
    };
    int stacked_cases = 0;
    for (int round = 0; round < 3; round++) // (this CPU's, the f32 kernels' (stacked in Winograd's form), phase by phase)
        for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
            pick(round);
            const int64_t nw = (int64_t)cs[i].ic * cs[i].oc * cs[i].k;
            float *w = randv(nw), *b = randv(cs[i].oc), *x = randv(cs[i].n * cs[i].ic);
            const float slope = i % 2 ? 0.1f : 1.0f;
            nm_conv_t1d c = {.bias = b, .ic = cs[i].ic, .oc = cs[i].oc, .k = cs[i].k, .stride = cs[i].stride,
                             .pad = (cs[i].k - cs[i].stride) / 2, .in_slope = slope, .winograd = round < 2 ? 10 : 0};
            float *pk = aligned_alloc(64, sizeof(float) * (size_t)((nm_conv_t1d_packed_size(&c) + 15) & ~15));
            nm_conv_t1d_pack(&c, w, pk);
            NM_CHECK(!c.wx == !nm_conv_amx_for(c.ic, c.oc, c.k) && !c.w != !c.wx);
            // stacked exactly where allowed: f32, 2 .. 8 taps a phase, 16 channels or more in and stacked, its
            // Winograd weights (10 points) at most 2^18 floats
            const int32_t q = (c.k + c.stride - 1) / c.stride;
            const bool st = c.winograd && !c.wx && q >= 2 && q <= 8 && c.ic >= 16 && c.stride * c.oc >= 16 &&
                            10LL * c.ic * ((c.stride * c.oc + 31) / 32 * 32) + (11 - q) * 10 + 100 <= (1 << 18) &&
                            !getenv("NM_NO_WINOGRAD");
            NM_CHECK(st == (c.wm > 0) && (!st || c.wm == 11 - q));
            stacked_cases += c.wm > 0;
            const int64_t n_out = (cs[i].n - 1) * c.stride - 2 * (int64_t)c.pad + c.k;
            float *y = randv(n_out * c.oc), *r = randv(n_out * c.oc), *y2 = randv(n_out * c.oc);
            float *work = aligned_alloc(64, sizeof(float) * (size_t)((nm_conv_t1d_work(&c, 2) + 15) & ~15));
            NM_CHECK(nm_conv_t1d_run(&c, x, cs[i].n, 0, y, work, NULL) == n_out);
            NM_CHECK(nm_conv_t1d_run(&c, x, cs[i].n, 0, y2, work, g_pool) == n_out);
            NM_CHECK(!memcmp(y, y2, sizeof(float) * (size_t)(n_out * c.oc)));
            // a part (inputs from row p0 on, org p0): the whole's outputs bit for bit past the reach of
            // its first rows (the stacked tiles' too)
            const int64_t p0 = cs[i].n / 2 + 1, from = ((c.wm ? c.wm - 1 : 0) + q) * (int64_t)c.stride;
            if (cs[i].n - p0 >= 1 && n_out - p0 * c.stride > from) {
                const int64_t np = n_out - p0 * c.stride;
                NM_CHECK(nm_conv_t1d_run(&c, x + p0 * c.ic, cs[i].n - p0, p0, y2, work, g_pool) == np);
                NM_CHECK(!memcmp(y2 + from * c.oc, y + (p0 * c.stride + from) * c.oc, sizeof(float) * (size_t)((np - from) * c.oc)));
            }
            free(y2);
            NM_CHECK(nm_conv_t1d_ref(&c, w, x, cs[i].n, r) == n_out);
            // one output from PyTorch's layout [ic][oc][k]
            const int64_t t = n_out / 3;
            double want = b[1 % c.oc];
            for (int64_t s = 0; s < cs[i].n; s++) {
                const int64_t j = t + c.pad - s * c.stride;
                if (j >= 0 && j < c.k)
                    for (int32_t ic = 0; ic < c.ic; ic++)
                        want += (double)w[((int64_t)ic * c.oc + 1 % c.oc) * c.k + j] * fmaxf(x[s * c.ic + ic], slope * x[s * c.ic + ic]);
            }
            NM_CHECK(fabs(r[t * c.oc + 1 % c.oc] - want) < 1e-4 * (1 + fabs(want)));
            const double e = rel_err(y, r, n_out * c.oc), bound = c.wx ? AMX_BOUND : c.wm ? WINO_BOUND : F32_BOUND;
            NM_CHECK(e < bound);
            if (!(e < bound)) printf("  case %zu (%s): relative error %g\n", i, c.wx ? "amx" : c.wm ? "stacked" : "f32", e);
            free(w), free(pk), free(b), free(x), free(y), free(r), free(work);
        }
    pick(-1);
    NM_CHECK(getenv("NM_NO_WINOGRAD") || stacked_cases >= 8);
}

// A bench, not a test (NM_PIPER_BENCH=1): nm_conv1d_run's rate on the two threads of g_pool for the
// default voice's shapes (this CPU's packing, Winograd's form allowed; NM_NO_AMX=1 for the f32 kernels,
// NM_NO_WINOGRAD=1 as well for the direct one), best of 5: GFLOP/s (a multiply-add 2, counted as the
// direct form's: Winograd's rate is the direct form's it equals), the shape's name, its rows.
NM_TEST_OPTIN(bench_conv_shapes, "NM_PIPER_BENCH") {
    const struct { const char *what; int32_t ic, oc, k, dil; int64_t n; int32_t wino; } cs[] = { // (wino: vits.c's)
        {"encoder FFN 1, a sentence", 192, 768, 3, 1, 90, 0},     {"encoder FFN 2, a sentence", 768, 192, 3, 1, 90, 0},
        {"encoder q, a sentence", 192, 192, 1, 1, 90, 0},        {"flow WaveNet in, 250 frames", 192, 384, 5, 1, 250, 8},
        {"flow WaveNet res, 250 frames", 192, 384, 1, 1, 250, 0}, {"HiFi-GAN 128 ch, k 5 d 2", 128, 128, 5, 2, 2000, 10},
        {"HiFi-GAN 64 ch, k 7 d 12", 64, 64, 7, 12, 16000, 10},   {"HiFi-GAN 32 ch, k 3 d 1", 32, 32, 3, 1, 64000, 10},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        float *w = randv((int64_t)cs[i].oc * cs[i].ic * cs[i].k), *x = randv(cs[i].n * cs[i].ic);
        nm_conv1d c = {.ic = cs[i].ic, .oc = cs[i].oc, .k = cs[i].k, .dil = cs[i].dil, .in_slope = 0.1f,
                       .winograd = cs[i].wino};
        float *pk = aligned_alloc(64, sizeof(float) * (size_t)((nm_conv1d_packed_size(&c) + 15) & ~15));
        nm_conv1d_pack(&c, w, pk);
        const int32_t pad = cs[i].dil * (cs[i].k - 1) / 2;
        float *y = malloc(sizeof(float) * (size_t)(cs[i].n * cs[i].oc));
        float *work = aligned_alloc(64, sizeof(float) * (size_t)((nm_conv1d_work(&c, 2) + 15) & ~15));
        double best = 1e30;
        for (int r = 0; r < 5; r++) {
            struct timespec a, b;
            clock_gettime(CLOCK_MONOTONIC, &a);
            int reps = 0;
            do {
                nm_conv1d_run(&c, x, cs[i].n, pad, pad, 0, NULL, y, work, g_pool);
                reps++;
                clock_gettime(CLOCK_MONOTONIC, &b);
            } while ((double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec) < 0.05);
            const double t = ((double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec)) / reps;
            best = t < best ? t : best;
        }
        const double flops = 2.0 * cs[i].n * cs[i].oc * cs[i].ic * cs[i].k;
        printf("  %-30s %-8s %7.1f GFLOP/s  (%lld rows, %.1f us)\n", cs[i].what, c.wx ? "amx" : c.wm ? "winograd" : "f32",
               flops / best * 1e-9,
               (long long)cs[i].n, best * 1e6);
        free(w), free(x), free(pk), free(y), free(work);
    }
}

// A backend of `device` for the op tests, or NULL (why printed) where there is no such device here.
static nm_backend *backend_of(const char *device) {
    const nm_backend_params p = {.n_threads = 2, .max_row = 1, .max_tokens = 1};
    nm_backend *be = NULL;
    char err[256] = "";
    if (nm_backend_create(device, &p, &be, err, sizeof err) != NM_OK) printf("  (%s: %s)\n", device, err);
    return be;
}

// n floats of the backend's memory holding src (a fresh buffer; *buf to free).
static nm_tensor put(nm_backend *be, nm_buffer **buf, const float *src, int64_t ne0, int64_t ne1) {
    *buf = nm_backend_buffer_alloc(be, sizeof(float) * (size_t)(ne0 * ne1) + 64);
    nm_tensor t = {.type = NM_TYPE_F32, .ne = {ne0, ne1, 1, 1}, .buf = *buf, .offs = 0};
    if (*buf && src) nm_backend_tensor_set(be, &t, 0, src, sizeof(float) * (size_t)(ne0 * ne1));
    return t;
}

// NM_OP_CONV1D and NM_OP_CONV_T1D on each backend (the CPU; OpenCL where there is a device: a skip of
// that half otherwise) against the definition's loops (nm_conv1d_ref, nm_conv_t1d_ref on PyTorch's
// layouts): kernels, dilations, pads, slopes, the add terms and scale (dst one of them), output channels
// and lengths around the OpenCL kernel's 64 channels and 8 frames; then NM_OP_ACT tanh; then what is
// refused: a weight not prepared, an output over its input, a shape the weight does not have. The last
// cases' weights are f16 and q8_0 ({k ic, oc} rows, tools/convert_piper.py --q8), held to the
// definition on the weights they stand for.
NM_TEST(conv_ops_on_each_backend) {
    const struct { int32_t ic, oc, k, dil, pad; int64_t n; bool t, add; uint32_t wt; } cs[] = {
        {8, 16, 3, 1, 1, 9, false, false, NM_TYPE_F32},  {32, 70, 7, 3, 9, 37, false, true, NM_TYPE_F32},
        {5, 1, 7, 1, 3, 20, false, false, NM_TYPE_F32},  {64, 64, 11, 5, 25, 100, false, true, NM_TYPE_F32},
        {16, 8, 16, 8, 4, 6, true, false, NM_TYPE_F32},  {24, 130, 4, 2, 1, 17, true, false, NM_TYPE_F32},
        {32, 40, 5, 2, 4, 30, false, true, NM_TYPE_Q8_0}, {16, 8, 16, 8, 4, 6, true, false, NM_TYPE_Q8_0},
        {32, 24, 3, 1, 1, 50, false, false, NM_TYPE_F16},
    };
    const char *devices[] = {"cpu", "opencl"};
    float *ws[sizeof cs / sizeof cs[0]] = {0}; // (the weights outlive the backend: prepare_op's contract)
    int reach_tiled = 0; // the cases whose reach counts tiles
    // the reach's rule on known shapes: a kernel of 7 at dilation 3 reads 9 rows each side, 9 more in tiles of
    // 4; a transposed one of 16 taps at stride 8, 2 input rows and one for the phase, 8 more in tiles of 9
    NM_CHECK(nm_conv_reach(NM_OP_CONV1D, 7, 3, 0) == 9 && nm_conv_reach(NM_OP_CONV1D, 7, 3, 4) == 18);
    NM_CHECK(nm_conv_reach(NM_OP_CONV1D, 4, 1, 1) == 2 && nm_conv_reach(NM_OP_CONV_T1D, 16, 8, 0) == 3);
    NM_CHECK(nm_conv_reach(NM_OP_CONV_T1D, 16, 8, 9) == 11);
    for (int dv = 0; dv < 2; dv++) {
        nm_backend *be = backend_of(devices[dv]);
        if (!be) {
            NM_CHECK(dv == 1); // (the CPU always)
            printf("  skip: no OpenCL device: the OpenCL half not run\n");
            continue;
        }
        for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
            const int32_t ic = cs[i].ic, oc = cs[i].oc, k = cs[i].k;
            const int64_t n = cs[i].n, n_out = cs[i].t ? (n - 1) * cs[i].dil - 2 * cs[i].pad + k
                                                        : n + 2 * cs[i].pad - (int64_t)cs[i].dil * (k - 1);
            const int64_t nw = (int64_t)oc * ic * k;
            float *w = ws[i] ? ws[i] : (ws[i] = randv(nw)), *b = randv(oc), *x = randv(n * ic), *a = randv(n_out * oc),
                  *d = randv(n_out * oc), *r = randv(n_out * oc), *got = randv(n_out * oc);
            const float slope = i % 2 ? 0.1f : 1.0f, scale = cs[i].add ? 0.5f : 1.0f;
            nm_buffer *bx, *bb, *ba, *bd;
            nm_tensor tw = {.type = NM_TYPE_F32, .ne = {k, cs[i].t ? oc : ic, cs[i].t ? ic : oc, 1},
                            .offs = (size_t)(uintptr_t)w};
            if (cs[i].wt != NM_TYPE_F32) { // (stored quantized in ws[i]'s second half; w then the weights it stands for)
                const nm_kernels *kr = nm_kernels_ref();
                void *q = (char *)w + nw * sizeof(float) / 2; // (f16 and q8_0 take at most half of f32's bytes)
                if (dv == 0) { // (once: the OpenCL half reads the same)
                    float *f = malloc(sizeof(float) * (size_t)nw);
                    memcpy(f, w, sizeof(float) * (size_t)nw);
                    kr->quant_act[cs[i].wt](f, q, nw);
                    free(f);
                }
                tw = (nm_tensor){.type = cs[i].wt, .ne = {(int64_t)k * (cs[i].t ? oc : ic), cs[i].t ? ic : oc, 1, 1},
                                 .offs = (size_t)(uintptr_t)q};
                w = malloc(sizeof(float) * (size_t)nw); // (the reference's)
                kr->dequant[cs[i].wt](q, w, nw);
            }
            nm_tensor tx = put(be, &bx, x, ic, n), tb = put(be, &bb, b, oc, 1), ta = put(be, &ba, a, oc, n_out),
                      td = put(be, &bd, d, oc, n_out);
            nm_op op = {.kind = cs[i].t ? NM_OP_CONV_T1D : NM_OP_CONV1D, .src0 = &tx, .src1 = &tw, .src2 = &tb,
                        .dst = &td, .f0 = slope, .f1 = scale, .i0 = cs[i].dil, .i1 = cs[i].pad,
                        .i2 = cs[i].t ? 0 : cs[i].pad};
            if (cs[i].add) op.add[0] = &ta, op.add[1] = &td; // (dst = (conv + a + dst) / 2)
            NM_CHECK(nm_backend_supports_op(be, &op));
            NM_CHECK(nm_backend_run(be, &op, 1) != NM_OK); // not prepared: refused, naming it
            NM_CHECK(strstr(nm_backend_last_error(be), "not prepared") != NULL);
            nm_op_prep prep = {0};
            NM_CHECK(nm_backend_prepare_op(be, &op, &prep) == NM_OK && prep.copied);
            // its reach: the CPU's Winograd tiles' where its packing takes them, else each output's own
            const nm_conv1d pc = {.ic = ic, .oc = oc, .k = k, .winograd = NM_CONV_OP_WINO};
            const nm_conv_t1d pt = {.ic = ic, .oc = oc, .k = k, .stride = cs[i].dil, .winograd = NM_CONV_OP_WINO};
            const int32_t tile = dv ? 0 : cs[i].t ? nm_conv_t1d_wino_m(&pt) : nm_conv1d_wino_m(&pc);
            NM_CHECK(prep.reach == nm_conv_reach(op.kind, k, cs[i].dil, tile));
            reach_tiled += tile > 1;
            NM_CHECK(nm_backend_run(be, &op, 1) == NM_OK);
            NM_CHECK(nm_backend_tensor_get(be, &td, 0, got, sizeof(float) * (size_t)(n_out * oc)) == NM_OK);
            if (cs[i].t) {
                const nm_conv_t1d c = {.bias = b, .ic = ic, .oc = oc, .k = k, .stride = cs[i].dil, .pad = cs[i].pad,
                                       .in_slope = slope};
                NM_CHECK(nm_conv_t1d_ref(&c, w, x, n, r) == n_out);
            } else {
                const nm_conv1d c = {.bias = b, .ic = ic, .oc = oc, .k = k, .dil = cs[i].dil, .in_slope = slope};
                NM_CHECK(nm_conv1d_ref(&c, w, x, n, cs[i].pad, cs[i].pad, r) == n_out);
                if (cs[i].add)
                    for (int64_t e = 0; e < n_out * oc; e++) r[e] = (r[e] + a[e] + d[e]) * scale;
            }
            const double e = rel_err(got, r, n_out * oc);
            NM_CHECK(e < AMX_BOUND);
            if (!(e < AMX_BOUND)) printf("  %s case %zu: relative error %g\n", devices[dv], i, e);
            if (i == 1) { // what is refused
                nm_op bad;
                nm_tensor short_y = td;
                short_y.ne[1] = n_out - 1; // (not the length the shapes give)
                bad = op, bad.dst = &short_y, bad.add[0] = bad.add[1] = NULL;
                NM_CHECK(!nm_backend_supports_op(be, &bad) && nm_backend_run(be, &bad, 1) != NM_OK);
                nm_tensor w2 = tw;
                w2.ne[1] = ic + 1; // (the weight's input channels against x's)
                bad = op, bad.src1 = &w2;
                NM_CHECK(!nm_backend_supports_op(be, &bad) && nm_backend_prepare_op(be, &bad, &prep) != NM_OK);
                // the same weight at a far wider dilation (its workspace grows at prepare; Winograd's tiles past
                // 48 rows a group): the definition's sums
                nm_op wide = op;
                wide.add[0] = wide.add[1] = NULL, wide.f1 = 1.0f, wide.i0 = 100, wide.i1 = wide.i2 = 100 * (k - 1) / 2;
                NM_CHECK(nm_backend_supports_op(be, &wide) && nm_backend_prepare_op(be, &wide, &prep) == NM_OK);
                NM_CHECK(prep.copied && prep.reach == nm_conv_reach(NM_OP_CONV1D, k, 100, tile)); // (its dilation's)
                NM_CHECK(nm_backend_run(be, &wide, 1) == NM_OK);
                NM_CHECK(nm_backend_tensor_get(be, &td, 0, got, sizeof(float) * (size_t)(n_out * oc)) == NM_OK);
                const nm_conv1d c100 = {.bias = b, .ic = ic, .oc = oc, .k = k, .dil = 100, .in_slope = slope};
                float *r100 = randv(n_out * oc);
                NM_CHECK(nm_conv1d_ref(&c100, w, x, n, 100 * (k - 1) / 2, 100 * (k - 1) / 2, r100) == n_out);
                NM_CHECK(rel_err(got, r100, n_out * oc) < WINO_BOUND);
                free(r100);
            }
            if (cs[i].wt == NM_TYPE_Q8_0 && !cs[i].t) { // the same bytes read as another split (ic / 2, 2 k): refused
                nm_buffer *bh, *by;
                nm_tensor th = put(be, &bh, x, ic / 2, n), ty = put(be, &by, NULL, oc, n + 2 * cs[i].pad - (2 * k - 1) * cs[i].dil);
                nm_op other = {.kind = NM_OP_CONV1D, .src0 = &th, .src1 = &tw, .dst = &ty, .f0 = 1, .f1 = 1,
                               .i0 = cs[i].dil, .i1 = cs[i].pad, .i2 = cs[i].pad};
                NM_CHECK(ty.ne[1] == 20 && nm_backend_supports_op(be, &other)); // (a shape the rules allow ...)
                NM_CHECK(nm_backend_run(be, &other, 1) != NM_OK && strstr(nm_backend_last_error(be), "not prepared"));
                nm_backend_buffer_free(be, bh), nm_backend_buffer_free(be, by);
            }
            // tanh in place (HiFi-GAN's last step)
            nm_op th = {.kind = NM_OP_ACT, .src0 = &td, .dst = &td, .i0 = NM_ACT_TANH};
            NM_CHECK(nm_backend_run(be, &th, 1) == NM_OK);
            float *tg = randv(n_out * oc);
            NM_CHECK(nm_backend_tensor_get(be, &td, 0, tg, sizeof(float) * (size_t)(n_out * oc)) == NM_OK);
            double te = 0;
            for (int64_t q = 0; q < n_out * oc; q++) te = fmax(te, fabs((double)tg[q] - tanh((double)got[q])));
            NM_CHECK(te < 2e-6);
            free(tg);
            nm_backend_buffer_free(be, bx), nm_backend_buffer_free(be, bb), nm_backend_buffer_free(be, ba),
                nm_backend_buffer_free(be, bd);
            if (cs[i].wt != NM_TYPE_F32) free(w);
            free(b), free(x), free(a), free(d), free(r), free(got);
        }
        // an output over its input (the CPU checks the bytes at submit; OpenCL's kernels would race)
        if (dv == 0) {
            float w[4 * 4 * 3], x[4 * 10], y[4 * 10];
            for (int q = 0; q < 48; q++) w[q] = frand();
            nm_tensor tw = {.type = NM_TYPE_F32, .ne = {3, 4, 4, 1}, .offs = (size_t)(uintptr_t)w},
                      tx = nm_tensor_at(x, NM_TYPE_F32, 4, 10), ty = nm_tensor_at(y, NM_TYPE_F32, 4, 10);
            nm_op op = {.kind = NM_OP_CONV1D, .src0 = &tx, .src1 = &tw, .dst = &ty, .f0 = 1, .f1 = 1, .i0 = 1, .i1 = 1, .i2 = 1};
            nm_op_prep prep;
            NM_CHECK(nm_backend_prepare_op(be, &op, &prep) == NM_OK && nm_backend_run(be, &op, 1) == NM_OK);
            op.dst = &tx;
            NM_CHECK(nm_backend_run(be, &op, 1) == NM_ERR_INVALID_ARG && strstr(nm_backend_last_error(be), "overlaps"));
            op.dst = &ty, op.i0 = 500000, op.i1 = op.i2 = 500000; // (a dilation beyond the workspace prepared)
            NM_CHECK(nm_backend_run(be, &op, 1) == NM_ERR_INVALID_ARG && strstr(nm_backend_last_error(be), "dilation"));
            // a transposed convolution packed stacked (Winograd's form: its stride's phases side by side) run
            // with another stride: refused (the stacked weights hold the stride they were packed for)
            static float wt[16 * 16 * 4], xt[16 * 5], yt[16 * 20];
            for (int q = 0; q < 16 * 16 * 4; q++) wt[q] = frand();
            nm_tensor tw2 = {.type = NM_TYPE_F32, .ne = {4, 16, 16, 1}, .offs = (size_t)(uintptr_t)wt},
                      tx2 = nm_tensor_at(xt, NM_TYPE_F32, 16, 5), ty2 = nm_tensor_at(yt, NM_TYPE_F32, 16, 10);
            nm_op ot = {.kind = NM_OP_CONV_T1D, .src0 = &tx2, .src1 = &tw2, .dst = &ty2, .f0 = 1, .i0 = 2, .i1 = 1};
            NM_CHECK(nm_backend_prepare_op(be, &ot, &prep) == NM_OK && nm_backend_run(be, &ot, 1) == NM_OK);
            ty2 = nm_tensor_at(yt, NM_TYPE_F32, 16, 20), ot.i0 = 4, ot.i1 = 0;
            const nm_conv_t1d probe = {.ic = 16, .oc = 16, .k = 4, .stride = 2, .winograd = NM_CONV_OP_WINO};
            NM_CHECK(nm_backend_run(be, &ot, 1) == (nm_conv_t1d_wino_m(&probe) ? NM_ERR_INVALID_ARG : NM_OK));
        }
        nm_backend_free(be);
    }
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) free(ws[i]);
    // (with Winograd's form on, cases 1, 3 and 6 tile; with AMX some of them take AMX's direct form)
    NM_CHECK(getenv("NM_NO_WINOGRAD") || reach_tiled >= 1);
}

#define VOICE "piper-en_US-joe-medium.gguf"

static nm_vits *voice(void) {
    char path[1024], err[512];
    if (!nmtest_model_path(VOICE, path, sizeof path)) return NULL;
    nm_vits *v = NULL;
    if (nm_vits_load(path, &v, err, sizeof err) != NM_OK) printf("  %s\n", err);
    return v;
}

NM_TEST(piper_voice_loads) {
    char path[1024];
    if (!nmtest_model_path(VOICE, path, sizeof path)) NM_SKIP_MISSING(VOICE " is not in the model cache");
    nm_vits *v = voice();
    NM_CHECK(v != NULL);
    if (!v) return;
    const nm_vits_info *in = nm_vits_get_info(v);
    NM_CHECK(in->sample_rate == 22050 && in->hop == 256 && in->n_symbols == 256);
    NM_CHECK(fabsf(in->noise_scale - 0.667f) < 1e-6f && in->length_scale == 1.0f && fabsf(in->noise_w - 0.8f) < 1e-6f);
    NM_CHECK(!strcmp(in->espeak_voice, "en-us") && !strcmp(in->name, "piper-en_US-joe-medium"));
    int32_t ids[4];
    NM_CHECK(nm_vits_phoneme_ids(v, "_", 1, ids, 4) == 1 && ids[0] == 0);
    NM_CHECK(nm_vits_phoneme_ids(v, "^", 1, ids, 4) == 1 && ids[0] == 1);
    NM_CHECK(nm_vits_phoneme_ids(v, "$", 1, ids, 4) == 1 && ids[0] == 2);
    NM_CHECK(nm_vits_phoneme_ids(v, "\xc9\x99", 2, ids, 4) == 1 && ids[0] == 59); // ə
    NM_CHECK(nm_vits_phoneme_ids(v, "\xc9\x99", 1, ids, 4) == 0);                // (half of it: none)
    nm_vits_free(v);
}

NM_TEST(piper_refuses_bad_input) {
    char path[1024], err[512] = "";
    if (!nmtest_model_path(VOICE, path, sizeof path)) NM_SKIP_MISSING(VOICE " is not in the model cache");
    nm_vits *v = voice();
    NM_CHECK(v != NULL);
    if (!v) return;
    float *pcm = NULL;
    int64_t n = 0;
    const int32_t ok_ids[] = {1, 0, 20, 0, 2}, bad_ids[] = {1, 0, 256, 0, 2};
    nm_vits_scales s = {0, 1, 0, 1};
    NM_CHECK(nm_vits_synth(v, NULL, bad_ids, 5, &s, &pcm, &n, err, sizeof err) == NM_ERR_INVALID_ARG && !pcm &&
             strstr(err, "phoneme id 256 at 2"));
    NM_CHECK(nm_vits_synth(v, NULL, ok_ids, 0, &s, &pcm, &n, err, sizeof err) == NM_ERR_INVALID_ARG);
    s.length_scale = 0;
    NM_CHECK(nm_vits_synth(v, NULL, ok_ids, 5, &s, &pcm, &n, err, sizeof err) == NM_ERR_INVALID_ARG && strstr(err, "length"));
    s.length_scale = 1, s.noise_w = NAN;
    NM_CHECK(nm_vits_synth(v, NULL, ok_ids, 5, &s, &pcm, &n, err, sizeof err) == NM_ERR_INVALID_ARG);
    s.noise_w = 0;
    NM_CHECK(nm_vits_synth(v, NULL, ok_ids, 5, &s, &pcm, &n, err, sizeof err) == NM_OK && n > 0 && n % 256 == 0);
    free(pcm);
    nm_vits_free(v);
    // a GGUF that is not a voice: named
    char other[1024];
    if (nmtest_model_path("whisper-tiny.en.gguf", other, sizeof other)) {
        nm_vits *w = NULL;
        NM_CHECK(nm_vits_load(other, &w, err, sizeof err) == NM_ERR_FORMAT && !w && strstr(err, "not a Piper voice"));
    }
    nm_vits *w = NULL;
    NM_CHECK(nm_vits_load("/nonexistent/voice.gguf", &w, err, sizeof err) != NM_OK && !w);
}

// The noises' normal draws (nm_vits_normals) against xorshift64* and Box-Muller one draw at a time (a pair's
// cosine, then its sine): the same floats, bit for bit, on one thread and two, whatever the calls' split
// (odd counts leave a pair's sine to the next call; counts past a block of the pool's).
NM_TEST(piper_normals_as_drawn_one_by_one) {
    enum { N = 20011 };
    static float want[N], got[N];
    uint64_t st = 5 * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull; // (seed 5)
    for (int i = 0; i < N; i += 2) {
        double u[2];
        for (int j = 0; j < 2; j++) {
            st ^= st >> 12, st ^= st << 25, st ^= st >> 27;
            u[j] = ((double)((st * 0x2545F4914F6CDD1Dull) >> 11) + 0.5) / 9007199254740992.0;
        }
        const double m = sqrt(-2.0 * log(u[0])), a = 6.283185307179586 * u[1];
        want[i] = (float)(m * cos(a));
        if (i + 1 < N) want[i + 1] = (float)(m * sin(a));
    }
    const int64_t splits[][4] = {{N, 0, 0, 0}, {1, 3, 8193, N - 8197}, {2 * 4096 + 1, 1, 1, N - 8195}, {7, 0, N - 7, 0}};
    for (size_t k = 0; k < sizeof splits / sizeof splits[0]; k++)
        for (int th = 0; th < 2; th++) {
            memset(got, 0, sizeof got);
            NM_CHECK(nm_vits_normals(5, splits[k], 4, got, th ? g_pool : NULL) == NM_OK);
            NM_CHECK(!memcmp(got, want, sizeof got));
        }
    int64_t one = 4;
    NM_CHECK(nm_vits_normals(6, &one, 1, got, NULL) == NM_OK && memcmp(got, want, 4 * sizeof(float))); // (another seed)
}

NM_TEST(piper_noise_seeded) {
    char path[1024], err[512] = "";
    if (!nmtest_model_path(VOICE, path, sizeof path)) NM_SKIP_MISSING(VOICE " is not in the model cache");
    nm_vits *v = voice();
    NM_CHECK(v != NULL);
    if (!v) return;
    const int32_t ids[] = {1, 0, 20, 0, 59, 0, 24, 0, 120, 0, 27, 0, 100, 0, 10, 0, 2};
    float *a = NULL, *b = NULL, *c = NULL;
    int64_t na = 0, nb = 0, nc = 0;
    nm_vits_scales s = {0.667f, 1, 0.8f, 7};
    NM_CHECK(nm_vits_synth(v, NULL, ids, 17, &s, &a, &na, err, sizeof err) == NM_OK);
    NM_CHECK(nm_vits_synth(v, NULL, ids, 17, &s, &b, &nb, err, sizeof err) == NM_OK);
    s.seed = 8;
    NM_CHECK(nm_vits_synth(v, NULL, ids, 17, &s, &c, &nc, err, sizeof err) == NM_OK);
    NM_CHECK(na > 0 && na == nb && a && b && !memcmp(a, b, sizeof(float) * (size_t)na));
    NM_CHECK(c && (nc != na || memcmp(a, c, sizeof(float) * (size_t)na)));
    free(a), free(b), free(c);
    nm_vits_free(v);
}

typedef struct parts { // nm_vits_synth_stream's parts, joined
    float *pcm;
    int64_t n, cap;
    int n_parts, n_last;
    int64_t first;
} parts;

static nm_status on_part(void *user, const float *pcm, int64_t n, bool last) {
    parts *p = user;
    if (p->n + n > p->cap) p->pcm = realloc(p->pcm, sizeof(float) * (size_t)(p->cap = 2 * (p->n + n)));
    memcpy(p->pcm + p->n, pcm, sizeof(float) * (size_t)n);
    if (!p->n_parts) p->first = n;
    p->n += n, p->n_parts++, p->n_last += last;
    return NM_OK;
}

// The decoder in two parts (the first 20 frames, then the rest, each with the decoder's reach beyond
// its inner edge) gives the whole's samples, bit for bit, on one thread or two, with this CPU's kernels
// and the f32 ones (Winograd's tiles: placed as the whole's, their reach counted); a short utterance is
// one part.
NM_TEST(piper_stream_same_samples) {
    char path[1024], err[512] = "";
    if (!nmtest_model_path(VOICE, path, sizeof path)) NM_SKIP_MISSING(VOICE " is not in the model cache");
    static const int32_t ids[] = {1, 0, 41, 0, 59, 0, 3, 0, 23, 0, 35, 0, 120, 0, 74, 0, 23, 0, 3, 0, 15, 0, 88, 0, 120,
                                  0, 14, 0, 100, 0, 26, 0, 3, 0, 19, 0, 120, 0, 51, 0, 122, 0, 23, 0, 31, 0, 10, 0, 3,
                                  0, 41, 0, 59, 0, 3, 0, 23, 0, 35, 0, 120, 0, 74, 0, 23, 0, 3, 0, 15, 0, 88, 0, 120,
                                  0, 14, 0, 100, 0, 26, 0, 3, 0, 19, 0, 120, 0, 51, 0, 122, 0, 23, 0, 31, 0, 10, 0, 2};
    const int32_t n = sizeof ids / sizeof ids[0];
    const nm_vits_scales s = {0.667f, 1, 0.8f, 5};
    pick(0);
    const bool amx_round0 = nm_conv_amx_for(128, 128, 3);
    for (int round = 0; round < 2; round++) { // (this CPU's kernels, then the f32 ones: Winograd's tiles)
        pick(round);
        // (where this CPU's kernels are the f32 ones, no AMX for the decoder's convolutions: one round)
        if (round == 1 && !amx_round0) break;
        nm_vits *v = voice();
        NM_CHECK(v != NULL);
        if (!v) break;
        const nm_vits_info *in = nm_vits_get_info(v);
        NM_CHECK(in->reach >= 8 && in->reach <= 24);
        float *whole = NULL;
        int64_t nw = 0;
        NM_CHECK(nm_vits_synth(v, NULL, ids, n, &s, &whole, &nw, err, sizeof err) == NM_OK);
        nm_vits_ctx *two = NULL;
        NM_CHECK(nm_vits_ctx_create(v, NULL, 2, &two, err, sizeof err) == NM_OK && two);
        // the decoder's reach on this CPU: the direct form's, or (Winograd's tiles) 24 frames for this voice
        const nm_conv1d hifi = {.ic = 128, .oc = 128, .k = 3, .winograd = NM_CONV_OP_WINO};
        NM_CHECK(nm_vits_ctx_reach(two) == (nm_conv1d_wino_m(&hifi) ? 24 : in->reach));
        // (20 and 122 of the 226 frames, one thread and two: the rest's decoder and flow from frames 98 and
        // 18 on with Winograd's tiles, off their grids (108 and 76 with AMX's), or 0; 3 frames: fewer than the reach)
        static const int32_t firsts[] = {20, 122, 122, 3};
        for (int k = 0; k < 4; k++) {
            const int32_t first = firsts[k];
            parts p = {0};
            NM_CHECK(nm_vits_synth_stream(v, k == 1 ? NULL : two, ids, n, &s, first, on_part, &p, err, sizeof err) == NM_OK);
            NM_CHECK(p.n_parts == 2 && p.n_last == 1 && p.first == first * in->hop && p.n == nw && whole &&
                     !memcmp(p.pcm, whole, sizeof(float) * (size_t)nw));
            free(p.pcm);
        }
        parts q = {0}; // (more first frames than the utterance has: one part)
        NM_CHECK(nm_vits_synth_stream(v, two, ids, n, &s, 100000, on_part, &q, err, sizeof err) == NM_OK &&
                 q.n_parts == 1 && q.n == nw);
        free(q.pcm);
        nm_vits_ctx_free(two);
        free(whole);
        nm_vits_free(v);
    }
    pick(-1);
}

// The tiny random voices (tools/gen_piper_voice.py: residual blocks of type 1 and 2, other sizes than the
// default voice's): they load and speak finite samples, a whole number of frames; two threads give one
// thread's samples; a long utterance in parts gives the whole's (both reaches are the voice's own).
NM_TEST(piper_tiny_voices) {
    const char *files[] = {"tests/data/piper/tiny-rb1.gguf", "tests/data/piper/tiny-rb2.gguf"};
    for (int f = 0; f < 2; f++) {
        char err[512] = "";
        nm_vits *v = NULL;
        NM_CHECK(nm_vits_load(files[f], &v, err, sizeof err) == NM_OK);
        if (!v) {
            printf("  %s\n", err);
            continue;
        }
        const nm_vits_info *in = nm_vits_get_info(v);
        NM_CHECK(in->sample_rate == 16000 && in->hop == 4 && in->n_symbols == 12);
        nm_vits_ctx *two = NULL;
        NM_CHECK(nm_vits_ctx_create(v, NULL, 2, &two, err, sizeof err) == NM_OK && two);
        int32_t ids[64];
        for (int i = 0; i < 64; i++) ids[i] = i == 0 ? 1 : i == 63 ? 2 : i % 2 ? 0 : 3 + i % 9;
        const nm_vits_scales s = {0.667f, 4, 0.8f, 9};
        float *a = NULL, *b = NULL;
        int64_t na = 0, nb = 0;
        NM_CHECK(nm_vits_synth(v, NULL, ids, 64, &s, &a, &na, err, sizeof err) == NM_OK && na > 0 && na % 4 == 0);
        NM_CHECK(nm_vits_synth(v, two, ids, 64, &s, &b, &nb, err, sizeof err) == NM_OK && nb == na && a && b &&
                 !memcmp(a, b, sizeof(float) * (size_t)na));
        int finite = 1;
        for (int64_t i = 0; a && i < na; i++) finite &= isfinite(a[i]) && fabsf(a[i]) <= 1;
        NM_CHECK(finite);
        parts p = {0};
        NM_CHECK(nm_vits_synth_stream(v, two, ids, 64, &s, 10, on_part, &p, err, sizeof err) == NM_OK);
        NM_CHECK(p.n_parts == 2 && p.n == na && !memcmp(p.pcm, a, sizeof(float) * (size_t)na));
        if (p.n_parts != 2) printf("  %s: %lld samples, %d parts\n", files[f], (long long)na, p.n_parts);
        free(p.pcm), free(a), free(b);
        nm_vits_ctx_free(two);
        nm_vits_free(v);
    }
    // the fuzz corpus's broken voices: refused, the cause named
    const struct { const char *file, *why; } broken[] = {
        {"tests/fuzz/corpus/piper/emb-shape.gguf", "weight enc_p.emb.weight: type 0, shape [12 15] (f32 [12 16] expected)"},
        {"tests/fuzz/corpus/piper/hidden-17.gguf", "hidden 17, heads 2"},
        {"tests/fuzz/corpus/piper/arch-llama.gguf", "not a Piper voice"},
        {"tests/fuzz/corpus/piper/truncated-data.gguf", "past end of file"},
    };
    for (size_t i = 0; i < sizeof broken / sizeof broken[0]; i++) {
        char err[512] = "";
        nm_vits *v = NULL;
        NM_CHECK(nm_vits_load(broken[i].file, &v, err, sizeof err) == NM_ERR_FORMAT && !v && strstr(err, broken[i].why));
        if (!strstr(err, broken[i].why)) printf("  %s: '%s'\n", broken[i].file, err);
        nm_vits_free(v);
    }
}

static int32_t *read_ints(const char *path, int32_t *n) {
    FILE *f = fopen(path, "r");
    int32_t cap = 64, *p = malloc(sizeof(int32_t) * (size_t)cap);
    *n = 0;
    for (int x; f && p && fscanf(f, "%d", &x) == 1;) {
        if (*n == cap) p = realloc(p, sizeof(int32_t) * (size_t)(cap *= 2));
        if (p) p[(*n)++] = x;
    }
    if (f) fclose(f);
    return p;
}

// Run by tests/tools/test_piper_ort.py (ctest piper_ort), which writes the oracle and names it.
NM_TEST_OPTIN(piper_matches_onnxruntime, "NM_PIPER_ORACLE") {
    const char *dir = getenv("NM_PIPER_ORACLE");
    const char *dev = getenv("NM_PIPER_DEVICE"); // (HiFi-GAN's device: NULL, the CPU)
    const bool amx = nm_conv_amx_for(32, 16, 3); // (the voice's convolutions packed for AMX)
    nm_vits *v = voice();
    NM_CHECK(v != NULL);
    if (!v) return;
    nm_vits_ctx *cx = NULL;
    char why[512] = "";
    const nm_status cst = nm_vits_ctx_create(v, dev, 2, &cx, why, sizeof why);
    if (cst == NM_ERR_UNSUPPORTED) { // (no such device here)
        nm_vits_free(v);
        NM_SKIP(why);
    }
    NM_CHECK(cst == NM_OK);
    if (!cx) {
        printf("  %s\n", why);
        nm_vits_free(v);
        return;
    }
    printf("  HiFi-GAN on %s\n", nm_vits_ctx_device(cx));
    int cases = 0;
    for (int k = 0;; k++) {
        char p[1200], err[512];
        snprintf(p, sizeof p, "%s/%d.ids", dir, k);
        FILE *probe = fopen(p, "r");
        if (!probe) break;
        fclose(probe);
        int32_t n = 0, ns = 0;
        int32_t *ids = read_ints(p, &n);
        snprintf(p, sizeof p, "%s/%d.scales", dir, k);
        FILE *fs = fopen(p, "r");
        float sc[3] = {0, 1, 0};
        ns = fs ? fscanf(fs, "%f %f %f", &sc[0], &sc[1], &sc[2]) : 0;
        if (fs) fclose(fs);
        snprintf(p, sizeof p, "%s/%d.f32", dir, k);
        FILE *fr = fopen(p, "rb");
        fseek(fr, 0, SEEK_END);
        const int64_t nr = ftell(fr) / 4;
        fseek(fr, 0, SEEK_SET);
        float *ref = malloc(sizeof(float) * (size_t)(nr + 1));
        NM_CHECK(ns == 3 && fread(ref, 4, (size_t)nr, fr) == (size_t)nr);
        fclose(fr);
        float *pcm = NULL;
        int64_t np = 0;
        const nm_vits_scales s = {sc[0], sc[1], sc[2], 1};
        NM_CHECK(nm_vits_synth(v, cx, ids, n, &s, &pcm, &np, err, sizeof err) == NM_OK);
        NM_CHECK(np == nr);
        double se = 0, sr = 0, mx = 0;
        for (int64_t i = 0; pcm && i < (np < nr ? np : nr); i++) {
            const double d = (double)pcm[i] - ref[i];
            se += d * d, sr += (double)ref[i] * ref[i], mx = fmax(mx, fabs(d));
        }
        const double snr = se > 0 ? 10 * log10(sr / se) : 200;
        printf("  case %d: %d ids, %lld samples (onnxruntime %lld), SNR %.1f dB, max |error| %.2g\n", k, (int)n,
               (long long)np, (long long)nr, snr, mx);
        const double bound = amx ? 65 : 80; // (bf16x3 products, or f32: conv1d.h)
        NM_CHECK(snr >= bound && mx <= 2e-3);
        free(ids), free(ref), free(pcm);
        cases++;
    }
    NM_CHECK(cases > 0);
    nm_vits_ctx_free(cx);
    nm_vits_free(v);
}

NM_TEST(nfd_decomposes_and_orders) {
    uint32_t c[16];
    NM_CHECK(nm_nfd("\xc3\xa7", 2, c, 16) == 2 && c[0] == 'c' && c[1] == 0x327);                  // ç
    NM_CHECK(nm_nfd("\xe1\xbb\x87", 3, c, 16) == 3 && c[0] == 'e' && c[1] == 0x323 && c[2] == 0x302); // ệ
    NM_CHECK(nm_nfd("e\xcc\x82\xcc\xa3", 5, c, 16) == 3 && c[1] == 0x323 && c[2] == 0x302); // (reordered: 220 < 230)
    NM_CHECK(nm_nfd("\xed\x95\x9c", 3, c, 16) == 3 && c[0] == 0x1112 && c[1] == 0x1161 && c[2] == 0x11AB); // 한
    NM_CHECK(nm_nfd("\xc9\x99\xcb\x88", 4, c, 16) == 2 && c[0] == 0x259 && c[1] == 0x2C8);     // ə ˈ: as they are
    NM_CHECK(nm_nfd("a\xff\xc3", 3, c, 16) == 3 && c[1] == 0xFFFD && c[2] == 0xFFFD);            // invalid bytes
    NM_CHECK(nm_nfd("\xc3\xa7\xc3\xa7", 4, c, 3) == 4 && c[2] == 'c');                          // (cap: the count)
}

NM_TEST(piper_phonemes) {
    char path[1024], err[512] = "";
    if (!nmtest_model_path(VOICE, path, sizeof path)) NM_SKIP_MISSING(VOICE " is not in the model cache");
    nm_vits *v = voice();
    NM_CHECK(v != NULL);
    if (!v) return;
    // piper-tts 1.8's ids for "Hello world." (espeak-ng 1.51 and Piper's agree on these words)
    static const int32_t hello[] = {1, 0, 20, 0, 59, 0, 24, 0, 120, 0, 27, 0, 100, 0, 3, 0, 35, 0, 120, 0, 62, 0, 122, 0,
                                    24, 0, 17, 0, 10, 0, 2};
    nm_piper_sentences ps;
    NM_CHECK(nm_piper_phonemize(v, NULL, "Hello world.", &ps, err, sizeof err) == NM_OK);
    NM_CHECK(ps.n == 1 && ps.n_ids == 31 && ps.start[1] == 31 && !memcmp(ps.ids, hello, sizeof hello) && !ps.n_missing);
    nm_piper_sentences_free(&ps);
    // sentences end at . ? ! (not at , : ;, which a blank follows); each framed ^ _ ... $
    NM_CHECK(nm_piper_phonemize(v, NULL, "Hello, world: one; two! Three? Four", &ps, err, sizeof err) == NM_OK);
    NM_CHECK(ps.n == 3);
    const int32_t want_end[] = {4, 13, -1}; // the id before each sentence's last pad and $: ! ?, and none
    for (int32_t i = 0; i < ps.n && i < 3; i++) {
        const int32_t *s = ps.ids + ps.start[i], len = ps.start[i + 1] - ps.start[i];
        NM_CHECK(s[0] == 1 && s[1] == 0 && s[len - 1] == 2 && s[len - 2] == 0);
        if (want_end[i] >= 0) NM_CHECK(s[len - 3] == want_end[i]);
        else NM_CHECK(s[len - 3] != 10 && s[len - 3] != 4 && s[len - 3] != 13);
    }
    int commas = 0, colons = 0;
    for (int64_t i = 0; i + 2 < ps.n_ids; i++) {
        commas += ps.ids[i] == 8 && ps.ids[i + 2] == 3;  // ", " (a pad between)
        colons += ps.ids[i] == 11 && ps.ids[i + 2] == 3; // ": "
    }
    NM_CHECK(commas == 1 && colons == 1);
    nm_piper_sentences_free(&ps);
    // an ellipsis ends no sentence; language switches are dropped
    NM_CHECK(nm_piper_phonemize(v, NULL, "Wait... what?", &ps, err, sizeof err) == NM_OK && ps.n == 1);
    nm_piper_sentences_free(&ps);
    nm_vits_free(v);
}

// The engine readies espeak-ng for the voice as it opens (one short sentence spoken into nothing, so an
// answer's first audio waits for neither espeak-ng's data nor the context's first buffers): a voice whose
// espeak-ng voice does not exist (the default voice's bytes, "en-us" patched to "zz-zz") fails to open,
// naming it, not at its first sentence.
NM_TEST(piper_engine_open_readies_espeak) {
    char path[1024], err[512] = "", tmp[] = "/tmp/nm-piper-voice-XXXXXX";
    if (!nmtest_model_path(VOICE, path, sizeof path)) NM_SKIP_MISSING(VOICE " is not in the model cache");
    FILE *f = fopen(path, "rb");
    NM_CHECK(f != NULL);
    if (!f) return;
    fseek(f, 0, SEEK_END);
    const long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)size);
    NM_CHECK(b && fread(b, 1, (size_t)size, f) == (size_t)size);
    fclose(f);
    static const char key[] = "piper.espeak.voice";
    char *at = b ? memmem(b, (size_t)size, key, sizeof key - 1) : NULL;
    char *val = at ? memmem(at, 64, "en-us", 5) : NULL; // (the key, its type, its length, then the string)
    NM_CHECK(val != NULL);
    const int fd = mkstemp(tmp);
    NM_CHECK(fd >= 0);
    if (val && fd >= 0) {
        memcpy(val, "zz-zz", 5);
        NM_CHECK(write(fd, b, (size_t)size) == size);
        nm_tts_params p = nm_tts_default_params();
        p.engine = "piper", p.voice = tmp;
        nm_tts *t = NULL;
        NM_CHECK(nm_tts_open(&p, NULL, &t, err, sizeof err) == NM_ERR_INVALID_ARG && !t);
        NM_CHECK(strstr(err, "unknown espeak-ng voice 'zz-zz'") != NULL);
        if (!strstr(err, "zz-zz")) printf("  %s\n", err);
        nm_tts_free(t);
    }
    if (fd >= 0) close(fd), unlink(tmp);
    free(b);
}

NM_TEST(piper_engine_speaks) {
    char path[1024], err[512] = "";
    if (!nmtest_model_path(VOICE, path, sizeof path)) NM_SKIP_MISSING(VOICE " is not in the model cache");
    nm_tts_params p = nm_tts_default_params();
    p.engine = "piper", p.voice = path, p.noise_scale = 0, p.noise_w = 0;
    nm_tts *t = NULL;
    NM_CHECK(nm_tts_open(&p, NULL, &t, err, sizeof err) == NM_OK);
    if (!t) return;
    NM_CHECK(nm_tts_sample_rate(t) == 22050 && !strcmp(nm_tts_engine_name(t), "piper"));
    // the planner's estimate of a second of speech, by hand from the voice's shapes: HiFi-GAN ~3.9 GFLOP
    // (its three stages' residual blocks 0.68, 1.35, 1.35), the flow ~1.2, the encoder the rest; the
    // weights the file's f32 tensors
    nm_brick_cost e = {0}, two = {0};
    nm_tts_estimate(t, 1.0, &e);
    nm_tts_estimate(t, 2.0, &two);
    printf("  estimate: %.2f GFLOP a second of speech, %.1f MB of weights\n", e.flops * 1e-9, e.weight_bytes * 1e-6);
    NM_CHECK(e.flops > 5.2e9 && e.flops < 6.2e9 && e.flops_by_type[0] == e.flops &&
             two.flops >= 2 * e.flops && two.flops < 2.05 * e.flops); // (attention: quadratic in the ids)
    NM_CHECK(e.weight_bytes > 55e6 && e.weight_bytes < 70e6 && e.peak_bytes > e.weight_bytes);
    int16_t *pcm = NULL;
    int64_t n = 0;
    NM_CHECK(nm_tts_synth_alloc(t, "Hello world.", &pcm, &n) == NM_OK && n == 18432);
    // what VITS gives for the same ids, peak-normalized, scaled and truncated as piper-tts
    nm_vits *v = voice();
    static const int32_t hello[] = {1, 0, 20, 0, 59, 0, 24, 0, 120, 0, 27, 0, 100, 0, 3, 0, 35, 0, 120, 0, 62, 0, 122, 0,
                                    24, 0, 17, 0, 10, 0, 2};
    float *x = NULL;
    int64_t nx = 0;
    const nm_vits_scales s = {0, 1, 0, 1};
    NM_CHECK(v && nm_vits_synth(v, NULL, hello, 31, &s, &x, &nx, err, sizeof err) == NM_OK && nx == n);
    float mx = 0;
    for (int64_t i = 0; x && i < nx; i++) mx = fmaxf(mx, fabsf(x[i]));
    int bad = 0, peak = 0;
    for (int64_t i = 0; x && pcm && i < n && i < nx; i++) {
        bad += pcm[i] != (int16_t)(fminf(fmaxf(x[i] / mx, -1), 1) * 32767.0f);
        peak = abs(pcm[i]) > peak ? abs(pcm[i]) : peak;
    }
    NM_CHECK(bad == 0 && peak >= 32766);
    free(pcm);
    // streamed (stream_ms 60: the first 5 frames first, the rest after: a sentence long enough for both reaches):
    // the samples of the whole, scaled by max(the first part's peak, 0.5), the rest clipped
    const char *fox = "The quick brown fox jumps over the lazy dog, twice!";
    nm_piper_sentences ps;
    NM_CHECK(nm_piper_phonemize(v, NULL, fox, &ps, err, sizeof err) == NM_OK && ps.n == 1);
    free(x);
    x = NULL;
    NM_CHECK(nm_vits_synth(v, NULL, ps.ids, ps.start[1], &s, &x, &nx, err, sizeof err) == NM_OK);
    nm_piper_sentences_free(&ps);
    p.stream_ms = 60;
    NM_CHECK(nm_tts_retune(t, &p) == NM_OK && nm_tts_synth_alloc(t, fox, &pcm, &n) == NM_OK && n == nx);
    const int64_t first = (int64_t)60 * 22050 / 1000 / 256 * 256;
    float mf = 0;
    for (int64_t i = 0; x && i < first; i++) mf = fmaxf(mf, fabsf(x[i]));
    const float gain_peak = fmaxf(mf, 0.5f);
    bad = 0;
    for (int64_t i = 0; x && pcm && i < n; i++) {
        const int16_t w = (int16_t)(fminf(fmaxf(x[i] / gain_peak, -1), 1) * 32767.0f);
        if (pcm[i] != w && bad++ < 3) printf("  sample %lld: %d, not %d (x %g)\n", (long long)i, pcm[i], w, (double)x[i]);
    }
    NM_CHECK(bad == 0 && mf < 0.5f);
    if (bad || !(mf < 0.5f)) printf("  streamed: %d samples differ; first part peak %g\n", bad, (double)mf);
    free(pcm);
    p.stream_ms = 0;
    free(x);
    nm_vits_free(v);
    // slower (a length scale of 2: each phoneme's frames ceil(2 w), not twice ceil(w)); the volume halves the peak
    p.length_scale = 2, p.volume = 50;
    NM_CHECK(nm_tts_retune(t, &p) == NM_OK);
    NM_CHECK(nm_tts_synth_alloc(t, "Hello world.", &pcm, &n) == NM_OK && n > 18432 * 3 / 2 && n < 2 * 18432);
    peak = 0;
    for (int64_t i = 0; pcm && i < n; i++) peak = abs(pcm[i]) > peak ? abs(pcm[i]) : peak;
    NM_CHECK(peak >= 16380 && peak <= 16384);
    free(pcm);
    p.pitch = 60;
    NM_CHECK(nm_tts_retune(t, &p) == NM_ERR_INVALID_ARG && strstr(nm_tts_last_error(t), "pitch"));
    nm_tts_free(t);
}

// SNR of a against b in dB (200: equal).
static double snr_db(const float *a, const float *b, int64_t n) {
    double se = 0, sr = 0;
    for (int64_t i = 0; i < n; i++) se += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), sr += (double)b[i] * b[i];
    return se > 0 ? 10 * log10(sr / se) : 200;
}

// HiFi-GAN placed on OpenCL (a skip where there is no device): the CPU's samples within the bound (noises
// on, the same seed: the host makes them), for the tiny voices and, where it is cached, the default one;
// a context of one voice refused for another; through the engine (nm_tts_params.device) it says where it
// runs and espeak-ng, which cannot run there, is refused naming the device.
NM_TEST(piper_on_opencl_equals_cpu) {
    char err[512] = "", path[1024];
    const char *files[3] = {"tests/data/piper/tiny-rb1.gguf", "tests/data/piper/tiny-rb2.gguf", NULL};
    if (nmtest_model_path(VOICE, path, sizeof path)) files[2] = path;
    nm_vits *prev = NULL;
    for (int f = 0; f < 3 && files[f]; f++) {
        nm_vits *v = NULL;
        NM_CHECK(nm_vits_load(files[f], &v, err, sizeof err) == NM_OK);
        if (!v) break;
        nm_vits_ctx *cpu = NULL, *gpu = NULL;
        NM_CHECK(nm_vits_ctx_create(v, "cpu", 2, &cpu, err, sizeof err) == NM_OK);
        const nm_status st = nm_vits_ctx_create(v, "opencl", 2, &gpu, err, sizeof err);
        if (st == NM_ERR_UNSUPPORTED) {
            nm_vits_ctx_free(cpu), nm_vits_free(v), nm_vits_free(prev);
            NM_SKIP(err);
        }
        NM_CHECK(st == NM_OK && gpu && !strcmp(nm_vits_ctx_device(gpu), "opencl") && !strcmp(nm_vits_ctx_device(cpu), "cpu"));
        if (prev && gpu) { // (a context of another voice)
            float *pcm = NULL;
            int64_t np = 0;
            const int32_t two[] = {1, 2};
            const nm_vits_scales s0 = {0, 1, 0, 1};
            NM_CHECK(nm_vits_synth(prev, gpu, two, 2, &s0, &pcm, &np, err, sizeof err) == NM_ERR_INVALID_ARG && !pcm &&
                     strstr(err, "another voice"));
        }
        int32_t ids[120];
        const int32_t n = f < 2 ? 64 : 120, ns = nm_vits_get_info(v)->n_symbols;
        for (int i = 0; i < n; i++) ids[i] = i == 0 ? 1 : i == n - 1 ? 2 : i % 2 ? 0 : 3 + (i * 7) % (ns - 3);
        const nm_vits_scales s = {0.667f, 1.2f, 0.8f, 11};
        float *a = NULL, *b = NULL;
        int64_t na = 0, nb = 0;
        NM_CHECK(nm_vits_synth(v, cpu, ids, n, &s, &a, &na, err, sizeof err) == NM_OK);
        NM_CHECK(gpu && nm_vits_synth(v, gpu, ids, n, &s, &b, &nb, err, sizeof err) == NM_OK && nb == na && na > 0);
        const double snr = a && b && na == nb ? snr_db(b, a, na) : 0;
        const double bound = 80; // (measured: 99 dB with AMX on the CPU, 140 dB for the tiny voices)
        printf("  %s: %lld samples, OpenCL against the CPU: SNR %.1f dB (bound %.0f)\n", files[f], (long long)na, snr, bound);
        NM_CHECK(snr >= bound);
        free(a), free(b);
        nm_vits_ctx_free(cpu), nm_vits_ctx_free(gpu);
        nm_vits_free(prev);
        prev = v;
    }
    nm_vits_free(prev);
    // the engine on OpenCL; espeak-ng refused there
    nm_tts_params p = nm_tts_default_params();
    p.engine = "piper", p.voice = "tests/data/piper/tiny-rb1.gguf", p.device = "opencl";
    nm_tts *t = NULL;
    NM_CHECK(nm_tts_open(&p, NULL, &t, err, sizeof err) == NM_OK && t && !strcmp(nm_tts_device(t), "opencl"));
    p.voice = "tests/data/piper/tiny-rb2.gguf"; // (another voice: a context made for it, on the same device)
    NM_CHECK(t && nm_tts_retune(t, &p) == NM_OK && !strcmp(nm_tts_device(t), "opencl"));
    int16_t *pcm = NULL;
    int64_t np = 0;
    NM_CHECK(t && nm_tts_synth_alloc(t, "Hello world.", &pcm, &np) == NM_OK && np > 0);
    free(pcm);
    nm_tts_free(t);
    p = nm_tts_default_params();
    p.device = "opencl";
    t = NULL;
    NM_CHECK(nm_tts_open(&p, NULL, &t, err, sizeof err) == NM_ERR_UNSUPPORTED && !t && strstr(err, "espeak-ng runs on the CPU only"));
    nm_tts_free(t);
}

// A tool (tests/tools/test_piper_phonemes.py runs it): each line of tests/data/piper/sentences.txt
// as our phonemizer gives it, into the file NM_PIPER_IDS_OUT names: a line each, the sentences'
// ids joined by " | ".
NM_TEST_OPTIN(piper_phonemes_dump, "NM_PIPER_IDS_OUT") {
    char err[512] = "", line[2048];
    nm_vits *v = voice();
    FILE *in = fopen("tests/data/piper/sentences.txt", "r"), *out = fopen(getenv("NM_PIPER_IDS_OUT"), "w");
    NM_CHECK(v && in && out);
    while (v && in && out && fgets(line, sizeof line, in)) {
        line[strcspn(line, "\n")] = '\0';
        nm_piper_sentences ps;
        NM_CHECK(nm_piper_phonemize(v, NULL, line, &ps, err, sizeof err) == NM_OK);
        for (int32_t i = 0; i < ps.n; i++)
            for (int32_t k = ps.start[i]; k < ps.start[i + 1]; k++)
                fprintf(out, "%s%d", k > ps.start[i] ? " " : i ? " | " : "", (int)ps.ids[k]);
        fputc('\n', out);
        nm_piper_sentences_free(&ps);
    }
    if (in) fclose(in);
    if (out) fclose(out);
    nm_vits_free(v);
}

// (NM_PIPER_BENCH=1, a bench) The default voice on tests/data/piper/sentences.txt, sentence by sentence on one
// two-thread context (warm: the first sentence spoken once before), the noises at the voice's defaults: where
// the time goes (nm_vits_ctx_phases) and the real-time factor. NM_NO_AMX=1: the f32 kernels'.
NM_TEST_OPTIN(bench_piper_phases, "NM_PIPER_BENCH") {
    char err[512] = "", line[2048];
    nm_vits *v = voice();
    nm_vits_ctx *cx = NULL;
    FILE *in = fopen("tests/data/piper/sentences.txt", "r");
    NM_CHECK(v && in && nm_vits_ctx_create(v, NULL, 2, &cx, err, sizeof err) == NM_OK);
    const nm_vits_info *vi = v ? nm_vits_get_info(v) : NULL;
    nm_vits_phases p0 = {0}, p1;
    double audio_s = 0;
    for (int warm = 1; v && in && cx && fgets(line, sizeof line, in); warm = 0) {
        line[strcspn(line, "\n")] = '\0';
        nm_piper_sentences ps;
        NM_CHECK(nm_piper_phonemize(v, NULL, line, &ps, err, sizeof err) == NM_OK);
        for (int rep = 0; rep <= warm; rep++) {
            if (warm && rep) nm_vits_ctx_phases(cx, &p0); // (the first sentence's second time counts)
            for (int32_t i = 0; i < ps.n; i++) {
                const nm_vits_scales sc = {vi->noise_scale, vi->length_scale, vi->noise_w, 1};
                float *pcm = NULL;
                int64_t np = 0;
                NM_CHECK(nm_vits_synth(v, cx, ps.ids + ps.start[i], ps.start[i + 1] - ps.start[i], &sc, &pcm, &np, err,
                                       sizeof err) == NM_OK);
                if (!warm || rep) audio_s += (double)np / vi->sample_rate;
                free(pcm);
            }
        }
        nm_piper_sentences_free(&ps);
    }
    nm_vits_ctx_phases(cx, &p1);
    const double enc = p1.encoder_s - p0.encoder_s, dur = p1.durations_s - p0.durations_s, fl = p1.flow_s - p0.flow_s,
                 dec = p1.decoder_s - p0.decoder_s, all = enc + dur + fl + dec;
    printf("  %lld syntheses, %.2f s of audio in %.3f s (RTF %.4f): encoder %.3f s, durations %.3f s, flow %.3f s, "
           "HiFi-GAN %.3f s\n", (long long)(p1.n - p0.n), audio_s, all, audio_s > 0 ? all / audio_s : 0.0, enc, dur, fl, dec);
    NM_CHECK(audio_s > 60 && enc > 0 && dur > 0 && fl > 0 && dec > 0);
    if (in) fclose(in);
    nm_vits_ctx_free(cx);
    nm_vits_free(v);
}

NM_TEST_MAIN()
