// CPU backend ops against plain reference computations.
#include <string.h>

#include "backend/backend.h"
#include "backend/registry.h"
#include "backend_testutil.h"
#include "backend/cpu/gemm.h"
#include "nmtest.h"
#include "quant/quant.h"

static uint64_t rs = 12345;
static float frand(void) {
    rs = rs * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rs >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

NM_TEST(gemm_simd_equals_reference_odd_sizes) {
    nm_gemm_fn g = nm_gemm_f32_get();
    const int64_t shapes[][3] = {{1, 1, 8}, {4, 3, 64}, {5, 7, 13}, {16, 48, 576}, {13, 50, 130}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t R = shapes[s][0], T = shapes[s][1], K = shapes[s][2];
        float *w = malloc(sizeof(float) * R * K), *x = malloc(sizeof(float) * T * K), *b = malloc(sizeof(float) * R);
        float *y1 = malloc(sizeof(float) * T * (R + 3)), *y2 = malloc(sizeof(float) * T * (R + 3));
        for (int64_t i = 0; i < R * K; i++) w[i] = frand();
        for (int64_t i = 0; i < T * K; i++) x[i] = frand();
        for (int64_t i = 0; i < R; i++) b[i] = frand();
        nm_gemm_f32_ref(w, R, x, T, K, y1, R + 3, b);
        g(w, R, x, T, K, y2, R + 3, b);
        double maxd = 0;
        for (int64_t t = 0; t < T; t++)
            for (int64_t r = 0; r < R; r++) maxd = nm_maxdiff(maxd, y1[t * (R + 3) + r], y2[t * (R + 3) + r]);
        NM_CHECK(maxd < 1e-4 * sqrt((double)K));
        free(w), free(x), free(b), free(y1), free(y2);
    }
}

// The AVX-512 panel GEMM, where this CPU has it, is one FMA chain per output
// (from the bias, k in order): bit for bit equal to fmaf in a loop, for every
// row count of its blocks (1..12), one and two panels (token counts around
// 16 and 32), odd K, a row stride past K, with and without bias; rows of y
// past R and tokens past nt stay untouched. The panel-layout variant gives the
// same sums in its layout.
NM_TEST(gemm_panel_is_one_fma_chain_per_output) {
    const nm_gemm_panel_kernels *pk = nm_gemm_panel_get();
    if (!pk) NM_SKIP("no AVX-512 GEMM on this CPU");
    const int64_t Ts[] = {1, 5, 15, 16, 17, 31, 32}, Ks[] = {1, 7, 64, 130};
    for (int64_t R = 1; R <= NM_GEMM_XPANEL_ROWS; R++)
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++)
            for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++) {
                const int64_t T = Ts[ti], K = Ks[ki], ldw = K + 3, ldy = R + 5, Tb = T + 2;
                float *w = malloc(sizeof(float) * R * ldw), *x = malloc(sizeof(float) * T * K), *b = malloc(sizeof(float) * R);
                float *y1 = malloc(sizeof(float) * Tb * ldy), *y2 = malloc(sizeof(float) * Tb * ldy);
                float *xp = aligned_alloc(64, sizeof(float) * 2 * NM_GEMM_PACK_ROWS * (size_t)((K + 3) / 4 * 4));
                float *yp = aligned_alloc(64, sizeof(float) * 2 * NM_GEMM_PACK_ROWS * 16);
                for (int64_t i = 0; i < R * ldw; i++) w[i] = frand();
                for (int64_t i = 0; i < T * K; i++) x[i] = frand();
                for (int64_t i = 0; i < R; i++) b[i] = frand();
                for (int64_t i = 0; i < Tb * ldy; i++) y1[i] = y2[i] = 777.0f;
                const float *bias = (R + T + K) % 2 ? b : NULL;
                for (int64_t t = 0; t < T; t++)
                    for (int64_t r = 0; r < R; r++) {
                        float acc = bias ? bias[r] : 0.0f;
                        for (int64_t k = 0; k < K; k++) acc = fmaf(w[r * ldw + k], x[t * K + k], acc);
                        y1[t * ldy + r] = acc;
                    }
                for (int64_t t0 = 0; t0 < T; t0 += NM_GEMM_PACK_ROWS)
                    nm_gemm_pack16(x + t0 * K, K, 1, T - t0 < NM_GEMM_PACK_ROWS ? T - t0 : NM_GEMM_PACK_ROWS, K, xp + t0 * K);
                pk->gemm(w, ldw, R, xp, T, K, y2, ldy, bias);
                const bool same = !memcmp(y1, y2, sizeof(float) * Tb * ldy);
                if (!same) fprintf(stderr, "  R=%lld T=%lld K=%lld: differs\n", (long long)R, (long long)T, (long long)K);
                NM_CHECK(same);
                pk->gemm_pout(w, ldw, R, xp, T, K, yp, 16 * 16);
                bool same_p = true;
                for (int64_t t = 0; t < T; t++)
                    for (int64_t r = 0; r < R; r++) {
                        float acc = 0.0f;
                        for (int64_t k = 0; k < K; k++) acc = fmaf(w[r * ldw + k], x[t * K + k], acc);
                        same_p &= yp[(t / 16) * 256 + r * 16 + t % 16] == acc;
                    }
                NM_CHECK(same_p);
                free(w), free(x), free(b), free(y1), free(y2), free(xp), free(yp);
            }
}

// The vector expf equals this libm's expf bit for bit on floats in [-103.97, 0]
// (every 61st float; every one with NM_TEST_EXHAUSTIVE=1, ~25 s) and gives 0
// below; and ggml's panel softmax with it equals the scalar loop (s * scale,
// max, expf(s - max) summed in order, times 1 / sum) bit for bit.
// The kernel itself is tested (not only through the start-up check, which
// would turn a broken kernel into the scalar path); under NM_CI=1 (Debian's
// glibc) the start-up check must also have taken it.
static void expf_libm_check(int *nmtest_failed, uint32_t step) {
    const nm_gemm_panel_kernels *pk = nm_gemm_panel_get();
    if (!pk) NM_SKIP("no AVX-512 kernels on this CPU");
    if (!pk->expf_libm && !nmtest_ci()) NM_SKIP("this libm's expf is not glibc's algorithm: the scalar expf runs");
    NM_CHECK(pk->expf_libm != NULL);
    enum { B = 4096 };
    static float x[B], y[B];
    float lim = -0x1.9fe368p6f;
    uint32_t hi;
    memcpy(&hi, &lim, sizeof hi);
    long n = 0, bad = 0;
    int k = 0;
    for (uint64_t u = 0x80000000u; u <= (uint64_t)hi + 64 * (uint64_t)step; u += step) {
        const uint32_t v = (uint32_t)u;
        memcpy(&x[k++], &v, sizeof v);
        if (k < B && u + step <= (uint64_t)hi + 64 * (uint64_t)step) continue;
        nm_expf_libm_avx512(x, y, k, nm_expf_libm_table());
        for (int i = 0; i < k; i++) {
            const float want = x[i] < lim ? 0.0f : expf(x[i]);
            if (memcmp(&want, &y[i], sizeof want) && bad++ < 3)
                fprintf(stderr, "  expf(%a): %a, libm %a\n", x[i], y[i], want);
        }
        n += k;
        k = 0;
    }
    // the one float in [-103.97, 0] where r from a rounded product gives another result
    // and far below the range (a softmax's s - max can be): 0
    x[0] = -0x1.f8cbb2p+5f, x[1] = -200.0f, x[2] = -1e4f, x[3] = -INFINITY;
    nm_expf_libm_avx512(x, y, 4, nm_expf_libm_table());
    NM_CHECK(y[0] == expf(x[0]) && y[1] == 0.0f && y[2] == 0.0f && y[3] == 0.0f);
    fprintf(stderr, "  %ld floats, %ld differ\n", n, bad);
    NM_CHECK(bad == 0 && n > 1000);
}
NM_TEST(expf_libm_equals_expf) {
    expf_libm_check(nmtest_failed, 61);
    if (!nm_gemm_panel_get()) return;
    const int64_t n = 1500;
    float *sp = aligned_alloc(64, sizeof(float) * 16 * n), *ref = malloc(sizeof(float) * 16 * n);
    for (int64_t i = 0; i < 16 * n; i++) ref[i] = sp[i] = 12.0f * frand();
    nm_softmax_panel_ggml_avx512(sp, n, 0.125f, nm_expf_libm_table());
    for (int l = 0; l < 16; l++) {
        float m = -INFINITY, sum = 0.0f;
        for (int64_t j = 0; j < n; j++) m = (ref[16 * j + l] *= 0.125f) > m ? ref[16 * j + l] : m;
        for (int64_t j = 0; j < n; j++) sum += (ref[16 * j + l] = expf(ref[16 * j + l] - m));
        const float inv = 1.0f / sum;
        for (int64_t j = 0; j < n; j++) ref[16 * j + l] *= inv;
    }
    NM_CHECK(!memcmp(sp, ref, sizeof(float) * 16 * n));
    free(sp), free(ref);
}
NM_TEST_OPTIN(expf_libm_equals_expf_every_float, "NM_TEST_EXHAUSTIVE") { expf_libm_check(nmtest_failed, 1); }

// The panel softmax: each lane a softmax over the panel's rows, against
// double precision (n around its loop ends). Relative error: the polynomial's
// 2.5e-7 plus the f32 rounding of s - m, up to 2^-24 |s - m| (~2e-6 at the
// spread of 35 used here).
NM_TEST(softmax_panel_equals_softmax) {
    const nm_gemm_panel_kernels *pk = nm_gemm_panel_get();
    if (!pk) NM_SKIP("no AVX-512 GEMM on this CPU");
    const int64_t ns[] = {1, 2, 17, 200};
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
        const int64_t n = ns[ni];
        float *sp = aligned_alloc(64, sizeof(float) * 16 * (size_t)n), *s0 = malloc(sizeof(float) * 16 * (size_t)n);
        for (int64_t i = 0; i < 16 * n; i++) s0[i] = sp[i] = 20.0f * frand() + (float)(i % 16);
        pk->softmax(sp, n);
        double maxd = 0;
        for (int l = 0; l < 16; l++) {
            double m = -INFINITY, sum = 0;
            for (int64_t j = 0; j < n; j++) m = fmax(m, s0[16 * j + l]);
            for (int64_t j = 0; j < n; j++) sum += exp(s0[16 * j + l] - m);
            for (int64_t j = 0; j < n; j++) {
                const double p = exp(s0[16 * j + l] - m) / sum;
                maxd = fmax(maxd, fabs(sp[16 * j + l] - p) / p);
            }
        }
        if (maxd > 3e-6) fprintf(stderr, "  n=%lld: max rel diff %g\n", (long long)n, maxd);
        NM_CHECK(maxd < 3e-6);
        free(sp), free(s0);
    }
}

// MATMUL of quantized weights, decode (T = 1) and prefill (T > 1) paths, equals
// dequantize-then-multiply with the activations rounded as the kernels round
// them (to the weights' vec_dot_type: 8-bit blocks, f16, ...).
// O = 1037: decode splits the rows into rounds of long chunks, then short ones
// (at least 32 rows, the last one shorter), with 2, 3 and 8 threads.
static void check_matmul_quantized(int *nmtest_failed, int n_threads, int64_t O) {
    const uint32_t types[] = {NM_TYPE_F32, NM_TYPE_F16, NM_TYPE_Q8_0, NM_TYPE_Q4_0, NM_TYPE_Q4_1,
                              NM_TYPE_Q5_0, NM_TYPE_Q4_K, NM_TYPE_Q6_K, NM_TYPE_MXFP4};
    const int64_t K = 512;
    nm_backend *be = cpu_backend(n_threads, K, 16);
    NM_CHECK(be != NULL);
    if (!be) return;
    float *wf = malloc(sizeof(float) * K * O), *deq = malloc(sizeof(float) * K * O);
    float *x = malloc(sizeof(float) * K * 9), *y = malloc(sizeof(float) * O * 9);
    float *xr = malloc(sizeof(float) * K * 9);
    void *xq = malloc(sizeof(float) * K);
    void *wq = malloc(nm_row_size(NM_TYPE_F32, K) * O);
    for (int64_t i = 0; i < K * O; i++) wf[i] = frand();
    for (int64_t i = 0; i < K * 9; i++) x[i] = frand();
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        uint32_t t = types[ti];
        size_t rb = nm_row_size(t, K);
        for (int64_t o = 0; o < O; o++) {
            nm_quantize_row_ref(t, wf + o * K, (uint8_t *)wq + o * rb, K);
            nm_dequantize_row_ref(t, (uint8_t *)wq + o * rb, deq + o * K, K);
        }
        nm_tensor W = {.type = t, .ne = {K, O, 1, 1}, .offs = (size_t)(uintptr_t)(wq)};
        const uint32_t at = nm_vec_dot_type(t);
        for (int tok = 0; tok < 9; tok++) { // the activations as the kernels see them
            nm_kernels_ref()->quant_act[at](x + tok * K, xq, K);
            nm_dequantize_row_ref(at, xq, xr + tok * K, K);
        }
        for (int T = 1; T <= 9; T += 8) {
            nm_tensor X = {.type = NM_TYPE_F32, .ne = {K, T, 1, 1}, .offs = (size_t)(uintptr_t)(x)};
            nm_tensor Y = {.type = NM_TYPE_F32, .ne = {O, T, 1, 1}, .offs = (size_t)(uintptr_t)(y)};
            nm_op op = {.kind = NM_OP_MATMUL, .src0 = &W, .src1 = &X, .dst = &Y};
            NM_CHECK(nm_backend_supports_op(be, &op));
            for (int64_t i = 0; i < O * T; i++) y[i] = NAN; // a row the chunks miss stays NaN
            NM_CHECK(nm_backend_run(be, &op, 1) == NM_OK);
            // error relative to sum |w x|: q4_1/q5_1 fold the block minimum with
            // the fp16-rounded activation block sum, as llama.cpp does
            double maxd = 0;
            for (int tok = 0; tok < T; tok++)
                for (int64_t o = 0; o < O; o++) {
                    double s = 0, sa = 0;
                    for (int64_t k = 0; k < K; k++) {
                        s += (double)deq[o * K + k] * xr[tok * K + k];
                        sa += fabs((double)deq[o * K + k] * xr[tok * K + k]);
                    }
                    const double e = fabs(s - y[tok * O + o]) / sa;
                    if (!(e <= maxd)) maxd = isnan(e) ? INFINITY : e; // a NaN (a row never written) fails
                }
            if (maxd > 1e-4)
                fprintf(stderr, "  type %s O=%lld T=%d, %d threads: max rel diff %g\n", nm_type_traits_get(t)->name,
                        (long long)O, T, n_threads, maxd);
            NM_CHECK(maxd < 1e-4);
        }
    }
    free(wf), free(deq), free(x), free(y), free(wq), free(xr), free(xq);
    nm_backend_free(be);
}

NM_TEST(matmul_quantized_decode_and_prefill) {
    check_matmul_quantized(nmtest_failed, 2, 37);
    check_matmul_quantized(nmtest_failed, 2, 1037);
    check_matmul_quantized(nmtest_failed, 3, 1037);
    check_matmul_quantized(nmtest_failed, 8, 1037);
}

// NM_OPF_ROWWISE: a batch of 9 tokens gives each row exactly what a one-token
// call gives, for every weight type (the decode dots; types with a gemv
// kernel, and f32, one token at a time), also in a group of two matmuls
// over the same activations whose types share the activation format but not
// the kernel (q8_0 has a gemv kernel, mxfp4 not).
// T rows of a matmul (with `flags`) against T one-token calls, bit for bit, for each type in types.
static void rows_equal_one_token_calls(int *nmtest_failed, const uint32_t *types, int NT, uint32_t flags, int64_t T,
                                      int64_t K) {
    enum { O = 37 };
    nm_backend *be = cpu_backend(2, K, 16);
    NM_CHECK(be != NULL);
    if (!be) return;
    float *wf = malloc(sizeof(float) * K * O), *x = malloc(sizeof(float) * K * T);
    float *yb = malloc(sizeof(float) * O * T * 2), *y1 = malloc(sizeof(float) * O * 2);
    uint8_t *wq[16];
    nm_tensor W[16];
    NM_CHECK(NT <= 16);
    for (int64_t i = 0; i < K * O; i++) wf[i] = frand();
    for (int64_t i = 0; i < K * T; i++) x[i] = frand();
    for (int ti = 0; ti < NT; ti++) {
        const size_t rb = nm_row_size(types[ti], K);
        wq[ti] = malloc(rb * O);
        for (int64_t o = 0; o < O; o++) nm_quantize_row_ref(types[ti], wf + o * K, wq[ti] + o * rb, K);
        W[ti] = (nm_tensor){.type = types[ti], .ne = {K, O, 1, 1}, .offs = (size_t)(uintptr_t)(wq[ti])};
    }
    // each type alone, then q8_0 and mxfp4 as one group
    for (int ti = 0; ti <= NT; ti++) {
        const int a = ti < NT ? ti : NT - 1, b = ti < NT ? -1 : 2, n_ops = b < 0 ? 1 : 2;
        nm_tensor X = {.type = NM_TYPE_F32, .ne = {K, T, 1, 1}, .offs = (size_t)(uintptr_t)(x)};
        nm_tensor Y[2] = {{.type = NM_TYPE_F32, .ne = {O, T, 1, 1}, .offs = (size_t)(uintptr_t)(yb)}, {.type = NM_TYPE_F32, .ne = {O, T, 1, 1}, .offs = (size_t)(uintptr_t)(yb + O * T)}};
        nm_op ops[2] = {{.kind = NM_OP_MATMUL, .src0 = &W[a], .src1 = &X, .dst = &Y[0], .flags = flags},
                        {.kind = NM_OP_MATMUL, .src0 = &W[b < 0 ? a : b], .src1 = &X, .dst = &Y[1], .flags = flags}};
        for (int64_t i = 0; i < O * T * 2; i++) yb[i] = 777.0f;
        NM_CHECK(nm_backend_run(be, ops, n_ops) == NM_OK);
        bool same = true;
        for (int g = 0; g < n_ops; g++)
            for (int tok = 0; tok < T; tok++) {
                nm_tensor X1 = {.type = NM_TYPE_F32, .ne = {K, 1, 1, 1}, .offs = (size_t)(uintptr_t)(x + tok * K)};
                nm_tensor Y1 = {.type = NM_TYPE_F32, .ne = {O, 1, 1, 1}, .offs = (size_t)(uintptr_t)(y1)};
                nm_op one = {.kind = NM_OP_MATMUL, .src0 = ops[g].src0, .src1 = &X1, .dst = &Y1};
                NM_CHECK(nm_backend_run(be, &one, 1) == NM_OK);
                same &= !memcmp(y1, yb + g * O * T + tok * O, sizeof(float) * O);
            }
        if (!same)
            fprintf(stderr, "  %s%s, %lld rows%s: differs from one-token calls\n", nm_type_traits_get(types[a])->name,
                    b < 0 ? "" : " + the group", (long long)T, flags & NM_OPF_ROWWISE ? " (rowwise)" : "");
        NM_CHECK(same);
    }
    for (int ti = 0; ti < NT; ti++) free(wq[ti]);
    free(wf), free(x), free(yb), free(y1);
    nm_backend_free(be);
}

NM_TEST(matmul_rowwise_equals_one_token_calls) {
    const uint32_t types[] = {NM_TYPE_F32, NM_TYPE_F16, NM_TYPE_Q8_0, NM_TYPE_Q4_0, NM_TYPE_Q4_1,
                              NM_TYPE_Q5_0, NM_TYPE_Q4_K, NM_TYPE_Q6_K, NM_TYPE_MXFP4};
    rows_equal_one_token_calls(nmtest_failed, types, sizeof types / sizeof types[0], NM_OPF_ROWWISE, 9, 512);
}

// A small batch (2..8 rows: sequences decoded together) through the gemv kernels: every row has the bits
// it has decoded alone, for each type that has one (the others and 9 rows go through the GEMM), both
// through gemv_multi and, with NM_NO_GEMV_MULTI=1 (read when the backend is made), through the gemv
// kernel a token at a time, each token with its own prepared row.
NM_TEST(matmul_small_batch_equals_one_token_calls) {
    const uint32_t types[] = {NM_TYPE_Q8_0, NM_TYPE_Q4_0, NM_TYPE_Q4_1, NM_TYPE_Q5_0, NM_TYPE_Q4_K, NM_TYPE_Q6_K};
    const nm_kernels *k = nm_kernels_get();
    uint32_t with[8];
    int n = 0;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (k->gemv[types[i]]) with[n++] = types[i];
    if (n == 0) {
        NM_SKIP("no gemv kernel on this CPU (AVX-512 VNNI): small batches go through the GEMM");
        return;
    }
    // K 768: a q4_1 row of 24 blocks, a group of 16 and a short one (gemv_multi's masked loads)
    const char *env = getenv("NM_NO_GEMV_MULTI");
    char *was = env ? strdup(env) : NULL;
    for (int no_multi = 0; no_multi <= 1; no_multi++) {
        setenv("NM_NO_GEMV_MULTI", no_multi ? "1" : "0", 1);
        for (int64_t T = 2; T <= 8; T++)
            for (int64_t K = 512; K <= 768; K += 256) rows_equal_one_token_calls(nmtest_failed, with, n, 0, T, K);
    }
    if (was) setenv("NM_NO_GEMV_MULTI", was, 1);
    else unsetenv("NM_NO_GEMV_MULTI");
    free(was);
}

// The prefill matmul of f32 and f16 weights in chunks of rows against panel
// pairs: rows in chunks and their remainders (O = 100), token counts of one
// and of several panels, with a bias, at row lengths whose f32 rows are used
// in place (1008) and copied into the padded tile (1024).
NM_TEST(matmul_half_and_f32_prefill_chunks) {
    const int64_t Ks[] = {1008, 1024}, Ts[] = {8, 40}, O = 100;
    const uint32_t types[] = {NM_TYPE_F32, NM_TYPE_F16};
    nm_backend *be = cpu_backend(2, 1024, 40);
    NM_CHECK(be != NULL);
    if (!be) return;
    float *wf = malloc(sizeof(float) * 1024 * O), *x = malloc(sizeof(float) * 1024 * 40), *b = malloc(sizeof(float) * O);
    float *y = malloc(sizeof(float) * O * 41);
    void *wq = malloc(sizeof(float) * 1024 * O);
    for (int64_t i = 0; i < 1024 * O; i++) wf[i] = frand();
    for (int64_t i = 0; i < 1024 * 40; i++) x[i] = frand();
    for (int64_t i = 0; i < O; i++) b[i] = frand();
    for (size_t ki = 0; ki < 2; ki++)
        for (size_t ti = 0; ti < 2; ti++)
            for (size_t yi = 0; yi < 2; yi++) {
                const int64_t K = Ks[ki], T = Ts[ti];
                const uint32_t t = types[yi];
                const size_t rb = nm_row_size(t, K);
                for (int64_t o = 0; o < O; o++) nm_quantize_row_ref(t, wf + o * K, (uint8_t *)wq + o * rb, K);
                nm_tensor W = {.type = t, .ne = {K, O, 1, 1}, .offs = (size_t)(uintptr_t)(wq)}, B = {.type = NM_TYPE_F32, .ne = {O, 1, 1, 1}, .offs = (size_t)(uintptr_t)(b)};
                nm_tensor X = {.type = NM_TYPE_F32, .ne = {K, T, 1, 1}, .offs = (size_t)(uintptr_t)(x)};
                nm_tensor Y = {.type = NM_TYPE_F32, .ne = {O, T, 1, 1}, .offs = (size_t)(uintptr_t)(y)};
                for (int64_t i = 0; i < O * 41; i++) y[i] = 777.0f;
                nm_op op = {.kind = NM_OP_MATMUL, .src0 = &W, .src1 = &X, .src2 = &B, .dst = &Y};
                NM_CHECK(nm_backend_run(be, &op, 1) == NM_OK);
                double maxd = 0;
                float wr[1024];
                for (int64_t o = 0; o < O; o++) {
                    nm_dequantize_row_ref(t, (uint8_t *)wq + o * rb, wr, K);
                    for (int64_t tok = 0; tok < T; tok++) {
                        double s = b[o];
                        for (int64_t k = 0; k < K; k++) s += (double)wr[k] * x[tok * K + k];
                        maxd = nm_maxdiff(maxd, s, y[tok * O + o]);
                    }
                }
                if (maxd > 1e-3) fprintf(stderr, "  %s K=%lld T=%lld: max diff %g\n", nm_type_traits_get(t)->name, (long long)K, (long long)T, maxd);
                NM_CHECK(maxd < 1e-3);
                NM_CHECK(y[T * O] == 777.0f); // nothing written past the T tokens
            }
    free(wf), free(x), free(b), free(y), free(wq);
    nm_backend_free(be);
}

// KV_STORE rounds K and V to f16 in the cache; attention with GQA, a sliding
// window and a softcap over that cache equals a two-pass softmax on the same
// values, for a decode-sized batch (5 tokens: one query at a time) and a
// prefill (40: the panel path where the CPU has it, a full and a partial
// block of 32).
NM_TEST(attention_gqa_window_equals_naive) {
    enum { H = 4, KV = 2, hd = 16, n_ctx = 64, TMAX = 40 };
    const int pos0 = 20, win = 7;
    nm_backend *be = cpu_backend(2, 64, 16);
    float *kc = malloc(sizeof(float) * n_ctx * KV * hd), *vc = malloc(sizeof(float) * n_ctx * KV * hd);
    uint16_t *kh = calloc((size_t)n_ctx * KV * hd, 2), *vh = calloc((size_t)n_ctx * KV * hd, 2);
    float *q = malloc(sizeof(float) * TMAX * H * hd), *out = malloc(sizeof(float) * TMAX * H * hd);
    for (int i = 0; i < n_ctx * KV * hd; i++) kc[i] = frand(), vc[i] = frand();
    for (int i = 0; i < TMAX * H * hd; i++) q[i] = 3.0f * frand();
    int32_t pos[TMAX];
    for (int i = 0; i < TMAX; i++) pos[i] = pos0 + i;
    nm_kv_layer kv = kv_at(kh, vh, KV * hd, n_ctx);
    int32_t ids[n_ctx];
    // fill the cache through the op, then read back what it holds
    nm_tensor Kt = {.ne = {KV * hd, n_ctx, 1, 1}, .offs = (size_t)(uintptr_t)(kc)}, Vt = {.ne = {KV * hd, n_ctx, 1, 1}, .offs = (size_t)(uintptr_t)(vc)};
    nm_op st = {.kind = NM_OP_KV_STORE, .src0 = &Kt, .src1 = &Vt, .ids = IDT(seq_ids(ids, 0, n_ctx), n_ctx), .kv = &kv,
                .n_ctx = n_ctx};
    NM_CHECK(nm_backend_run(be, &st, 1) == NM_OK);
    for (int i = 0; i < n_ctx * KV * hd; i++) {
        NM_CHECK(kh[i] == nm_fp32_to_fp16(kc[i]) && vh[i] == nm_fp32_to_fp16(vc[i]));
        kc[i] = nm_fp16_to_fp32(kh[i]), vc[i] = nm_fp16_to_fp32(vh[i]);
    }
    st.ids = IDT(seq_ids(ids, n_ctx - 3, n_ctx), n_ctx); // a store that would run past the cache is refused
    NM_CHECK(nm_backend_run(be, &st, 1) == NM_ERR_RANGE);
    const int Ts[2] = {5, TMAX};
    const float caps[2] = {0.0f, 0.8f};
    for (int ti = 0; ti < 2; ti++)
        for (int w = 0; w <= win; w += win)
            for (int ci = 0; ci < 2; ci++) {
                const int T = Ts[ti];
                const float cap = caps[ci];
                nm_tensor Q = {.ne = {H * hd, T, 1, 1}, .offs = (size_t)(uintptr_t)(q)}, O = {.ne = {H * hd, T, 1, 1}, .offs = (size_t)(uintptr_t)(out)};
                nm_op op = {.kind = NM_OP_ATTENTION, .src0 = &Q, .dst = &O, .ids = IDT(pos, T), .kv = &kv, .f0 = 0.25f,
                            .f1 = cap, .i0 = H, .i1 = KV, .i2 = hd, .i3 = w, .n_ctx = n_ctx};
                NM_CHECK(nm_backend_run(be, &op, 1) == NM_OK);
                double maxd = 0;
                for (int t = 0; t < T; t++)
                    for (int h = 0; h < H; h++) {
                        int g = h / (H / KV), lo = w ? pos[t] - w + 1 : 0;
                        double sc[n_ctx], mx = -1e30, sum = 0;
                        for (int j = lo; j <= pos[t]; j++) {
                            double s = 0;
                            for (int d = 0; d < hd; d++) s += q[(t * H + h) * hd + d] * kc[(j * KV + g) * hd + d];
                            sc[j] = cap > 0 ? cap * tanh(s * 0.25 / cap) : s * 0.25;
                            mx = fmax(mx, sc[j]);
                        }
                        for (int j = lo; j <= pos[t]; j++) sum += exp(sc[j] - mx);
                        for (int d = 0; d < hd; d++) {
                            double o = 0;
                            for (int j = lo; j <= pos[t]; j++) o += exp(sc[j] - mx) / sum * vc[(j * KV + g) * hd + d];
                            maxd = fmax(maxd, fabs(o - out[(t * H + h) * hd + d]));
                        }
                    }
                if (maxd >= 1e-5) fprintf(stderr, "  T=%d window %d softcap %g: max diff %g\n", T, w, cap, maxd);
                NM_CHECK(maxd < 1e-5);
            }
    free(kc), free(vc), free(kh), free(vh), free(q), free(out);
    nm_backend_free(be);
}

// A position -> row map (kv_rows): KV_STORE writes each position's row of the
// map and ATTENTION reads through it, giving the bits the same cache laid out
// by position gives, on each path (online softmax, ggml's f16 rounding one
// query at a time, and several queries at one position sharing the V rows).
// A row outside the cache and a map shorter than n_ctx are refused.
NM_TEST(attention_through_a_row_map_equals_contiguous) {
    enum { H = 4, KV = 2, hd = 16, n_ctx = 24, ROWS = 3 * n_ctx, T = 4, W = KV * hd };
    nm_backend *be = cpu_backend(2, 64, 16);
    float *kf = malloc(sizeof(float) * n_ctx * W), *vf = malloc(sizeof(float) * n_ctx * W);
    uint16_t *kh = calloc((size_t)n_ctx * W, 2), *vh = calloc((size_t)n_ctx * W, 2);
    uint16_t *kp = calloc((size_t)ROWS * W, 2), *vp = calloc((size_t)ROWS * W, 2);
    float *q = malloc(sizeof(float) * T * H * hd), *o1 = malloc(sizeof(float) * T * H * hd),
          *o2 = malloc(sizeof(float) * T * H * hd);
    for (int i = 0; i < n_ctx * W; i++) kf[i] = frand(), vf[i] = frand();
    for (int i = 0; i < T * H * hd; i++) q[i] = 3.0f * frand();
    int32_t map[n_ctx], ids[n_ctx];
    for (int p = 0; p < n_ctx; p++) map[p] = (p * 7 + 5) % ROWS; // scattered, no two positions on one row
    nm_kv_layer kc = kv_at(kh, vh, W, n_ctx), kvp = kv_at(kp, vp, W, ROWS);
    nm_tensor Kt = {.ne = {W, n_ctx, 1, 1}, .offs = (size_t)(uintptr_t)(kf)}, Vt = {.ne = {W, n_ctx, 1, 1}, .offs = (size_t)(uintptr_t)(vf)};
    nm_op st[2] = {{.kind = NM_OP_KV_STORE, .src0 = &Kt, .src1 = &Vt, .ids = IDT(seq_ids(ids, 0, n_ctx), n_ctx), .kv = &kc,
                    .n_ctx = n_ctx},
                   {.kind = NM_OP_KV_STORE, .src0 = &Kt, .src1 = &Vt, .ids = IDT(ids, n_ctx), .kv = &kvp, .n_ctx = n_ctx,
                    .kv_rows = IDT(map, n_ctx)}};
    NM_CHECK(nm_backend_supports_op(be, &st[1]) && nm_backend_run(be, st, 2) == NM_OK);
    bool placed = true;
    for (int p = 0; p < n_ctx; p++)
        placed = placed && !memcmp(kp + (size_t)map[p] * W, kh + (size_t)p * W, 2 * W) &&
                 !memcmp(vp + (size_t)map[p] * W, vh + (size_t)p * W, 2 * W);
    NM_CHECK(placed);
    const int32_t spread[T] = {3, 11, 17, 23}, same[T] = {19, 19, 19, 19};
    const struct { const int32_t *pos; uint32_t flags; float cap; } cases[] = {
        {spread, 0, 0.0f}, {spread, 0, 0.7f}, {spread, NM_OPF_GGML_F16, 0.0f}, {same, NM_OPF_GGML_F16, 0.0f}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        nm_tensor Q = {.ne = {H * hd, T, 1, 1}, .offs = (size_t)(uintptr_t)(q)};
        nm_tensor O1 = {.ne = {H * hd, T, 1, 1}, .offs = (size_t)(uintptr_t)(o1)}, O2 = O1;
        O2.offs = (size_t)(uintptr_t)(o2);
        nm_op a = {.kind = NM_OP_ATTENTION, .src0 = &Q, .dst = &O1, .ids = IDT(cases[ci].pos, T), .kv = &kc,
                   .f0 = 0.25f, .f1 = cases[ci].cap, .i0 = H, .i1 = KV, .i2 = hd, .n_ctx = n_ctx, .flags = cases[ci].flags};
        nm_op b = a;
        b.dst = &O2, b.kv = &kvp, b.kv_rows = IDT(map, n_ctx);
        NM_CHECK(nm_backend_run(be, &a, 1) == NM_OK && nm_backend_run(be, &b, 1) == NM_OK);
        const bool eq = !memcmp(o1, o2, sizeof(float) * T * H * hd);
        if (!eq) fprintf(stderr, "  case %zu: attention through the map differs\n", ci);
        NM_CHECK(eq);
    }
    map[2] = ROWS; // one row past the pool
    nm_tensor Q = {.ne = {H * hd, 1, 1, 1}, .offs = (size_t)(uintptr_t)(q)}, O = {.ne = {H * hd, 1, 1, 1}, .offs = (size_t)(uintptr_t)(o1)};
    nm_op bad = {.kind = NM_OP_ATTENTION, .src0 = &Q, .dst = &O, .ids = IDT(spread, 1), .kv = &kvp, .f0 = 0.25f,
                 .i0 = H, .i1 = KV, .i2 = hd, .n_ctx = n_ctx, .kv_rows = IDT(map, n_ctx)};
    NM_CHECK(nm_backend_run(be, &bad, 1) == NM_ERR_RANGE && strstr(nm_backend_last_error(be), "cache row"));
    st[1].ids = IDT(seq_ids(ids, 2, 1), 1);
    NM_CHECK(nm_backend_run(be, &st[1], 1) == NM_ERR_RANGE);
    bad.kv_rows = IDT(map, n_ctx - 1); // a map that does not cover the context
    NM_CHECK(!nm_backend_supports_op(be, &bad));
    free(kf), free(vf), free(kh), free(vh), free(kp), free(vp), free(q), free(o1), free(o2);
    nm_backend_free(be);
}

// RoPE at position 1 with base 1 rotates every pair by 1 radian; NORM pairs
// adjacent elements, NEOX pairs i with i + n/2.
NM_TEST(rope_orderings) {
    nm_backend *be = cpu_backend(1, 16, 16);
    float x[4] = {1, 0, 0, 1};
    int32_t pos = 1;
    nm_tensor X = {.ne = {4, 1, 1, 1}, .offs = (size_t)(uintptr_t)(x)};
    nm_op op = {.kind = NM_OP_ROPE, .src0 = &X, .dst = &X, .ids = IDT(&pos, 1), .f0 = 1.0f, .f1 = 1.0f,
                .i0 = 1, .i1 = 4, .i2 = NM_ROPE_NORM, .i3 = 4};
    NM_CHECK(nm_backend_run(be, &op, 1) == NM_OK);
    float c = cosf(1), s = sinf(1);
    NM_CHECK_NEAR(x[0], c, 1e-6);  // (1,0) -> (c, s)
    NM_CHECK_NEAR(x[1], s, 1e-6);
    NM_CHECK_NEAR(x[2], -s, 1e-6); // (0,1) -> (-s, c)
    NM_CHECK_NEAR(x[3], c, 1e-6);
    float y[4] = {1, 0, 0, 1};
    X.offs = (size_t)(uintptr_t)y;
    op.i2 = NM_ROPE_NEOX; // pairs (y0, y2) = (1, 0) and (y1, y3) = (0, 1)
    NM_CHECK(nm_backend_run(be, &op, 1) == NM_OK);
    NM_CHECK_NEAR(y[0], c, 1e-6);
    NM_CHECK_NEAR(y[2], s, 1e-6);
    NM_CHECK_NEAR(y[1], -s, 1e-6);
    NM_CHECK_NEAR(y[3], c, 1e-6);
    nm_backend_free(be);
}

// GLU: SiLU and GELU(tanh) gates against their textbook formulas, over a wide
// range (the backend evaluates GELU through the logistic identity).
NM_TEST(glu_activations) {
    nm_backend *be = cpu_backend(2, 64, 16);
    enum { N = 4001 };
    static float g[N], u[N], y[N];
    for (int i = 0; i < N; i++) g[i] = (i - N / 2) * 0.02f, u[i] = 1.0f + 0.001f * i; // -40 .. 40
    nm_tensor G = {.ne = {N, 1, 1, 1}, .offs = (size_t)(uintptr_t)(g)}, U = {.ne = {N, 1, 1, 1}, .offs = (size_t)(uintptr_t)(u)}, Y = {.ne = {N, 1, 1, 1}, .offs = (size_t)(uintptr_t)(y)};
    for (int a = 0; a < 2; a++) {
        nm_op op = {.kind = NM_OP_GLU, .src0 = &G, .src1 = &U, .dst = &Y, .i0 = a};
        NM_CHECK(nm_backend_run(be, &op, 1) == NM_OK);
        double maxd = 0;
        for (int i = 0; i < N; i++) {
            double x = g[i], want = a == NM_ACT_SILU ? x / (1 + exp(-x))
                                                     : 0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
            maxd = fmax(maxd, fabs(want * u[i] - y[i]) / (1 + fabs(want * u[i])));
            NM_CHECK(isfinite(y[i]));
        }
        NM_CHECK(maxd < 1e-6);
    }
    nm_backend_free(be);
}

NM_TEST(layer_norm_and_activations) {
    nm_backend *be = cpu_backend(2, 64, 16);
    enum { D = 197, R = 300 }; // R * D above the parallel threshold
    static float x[R * D], y[R * D], w[D], b[D];
    for (int i = 0; i < R * D; i++) x[i] = frand() * 3.0f + 0.5f;
    for (int i = 0; i < D; i++) w[i] = 1.0f + 0.1f * frand(), b[i] = 0.2f * frand();
    nm_tensor X = {.ne = {D, R, 1, 1}, .offs = (size_t)(uintptr_t)(x)}, Y = {.ne = {D, R, 1, 1}, .offs = (size_t)(uintptr_t)(y)};
    nm_tensor Wt = {.ne = {D, 1, 1, 1}, .offs = (size_t)(uintptr_t)(w)}, Bt = {.ne = {D, 1, 1, 1}, .offs = (size_t)(uintptr_t)(b)};
    for (int variant = 0; variant < 2; variant++) {
        nm_op op = {.kind = NM_OP_NORM, .src0 = &X, .src1 = variant ? &Wt : NULL, .src2 = variant ? &Bt : NULL,
                    .dst = &Y, .f0 = 1e-6f};
        NM_CHECK(nm_backend_run(be, &op, 1) == NM_OK);
        double maxd = 0;
        for (int r = 0; r < R; r++) {
            double m = 0, v = 0;
            for (int i = 0; i < D; i++) m += x[r * D + i];
            m /= D;
            for (int i = 0; i < D; i++) v += (x[r * D + i] - m) * (x[r * D + i] - m);
            v /= D;
            for (int i = 0; i < D; i++) {
                double want = (x[r * D + i] - m) / sqrt(v + 1e-6);
                if (variant) want = want * w[i] + b[i];
                maxd = fmax(maxd, fabs(want - y[r * D + i]));
            }
        }
        NM_CHECK(maxd < 1e-5);
    }
    enum { N = 4001 };
    static float a[N], o[N];
    for (int i = 0; i < N; i++) a[i] = (i - N / 2) * 0.02f; // -40 .. 40
    nm_tensor A = {.ne = {N, 1, 1, 1}, .offs = (size_t)(uintptr_t)(a)}, O = {.ne = {N, 1, 1, 1}, .offs = (size_t)(uintptr_t)(o)};
    for (int act = NM_ACT_SILU; act <= NM_ACT_GELU_QUICK; act++) {
        nm_op op = {.kind = NM_OP_ACT, .src0 = &A, .dst = &O, .i0 = act};
        NM_CHECK(nm_backend_run(be, &op, 1) == NM_OK);
        double maxd = 0;
        for (int i = 0; i < N; i++) {
            double v = a[i];
            double want = act == NM_ACT_SILU       ? v / (1 + exp(-v))
                          : act == NM_ACT_GELU_TANH ? 0.5 * v * (1 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)))
                                                    : v / (1 + exp(-1.702 * v));
            maxd = fmax(maxd, fabs(want - o[i]) / (1 + fabs(want)));
        }
        NM_CHECK(maxd < 1e-6);
    }
    nm_op bad = {.kind = NM_OP_ACT, .src0 = &A, .dst = &O, .i0 = 9};
    NM_CHECK(nm_backend_run(be, &bad, 1) == NM_ERR_UNSUPPORTED);
    nm_backend_free(be);
}

// Bidirectional attention against a double-precision softmax(QK^T s) V, for
// sequence lengths around the query block (32) and odd head sizes.
NM_TEST(attention_full_equals_naive) {
    const int shapes[][3] = {{1, 1, 8}, {5, 3, 8}, {31, 2, 16}, {33, 4, 64}, {70, 3, 20}, {129, 2, 32}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int T = shapes[si][0], H = shapes[si][1], hd = shapes[si][2], W = H * hd;
        for (int nth = 1; nth <= 2; nth++) {
            nm_backend *be = cpu_backend(nth, 64, 16);
            float *q = malloc(sizeof(float) * T * W), *k = malloc(sizeof(float) * T * W);
            float *v = malloc(sizeof(float) * T * W), *o = malloc(sizeof(float) * T * W);
            for (int i = 0; i < T * W; i++) q[i] = 2 * frand(), k[i] = 2 * frand(), v[i] = frand();
            nm_tensor Q = {.ne = {W, T, 1, 1}, .offs = (size_t)(uintptr_t)(q)}, K = {.ne = {W, T, 1, 1}, .offs = (size_t)(uintptr_t)(k)};
            nm_tensor V = {.ne = {W, T, 1, 1}, .offs = (size_t)(uintptr_t)(v)}, O = {.ne = {W, T, 1, 1}, .offs = (size_t)(uintptr_t)(o)};
            const float scale = 1.0f / sqrtf((float)hd);
            nm_op op = {.kind = NM_OP_ATTENTION_FULL, .src0 = &Q, .src1 = &K, .src2 = &V, .dst = &O, .f0 = scale,
                        .i0 = H, .i2 = hd};
            NM_CHECK(!nm_backend_supports_op(be, &op)); // no workspace reserved
            nm_backend_free(be);
            be = cpu_backend_attn(nth, 64, 16, T, hd);
            NM_CHECK(nm_backend_run(be, &op, 1) == NM_OK);
            double maxd = 0, *p = malloc(sizeof(double) * T);
            for (int h = 0; h < H; h++)
                for (int i = 0; i < T; i++) {
                    double m = -INFINITY, sum = 0;
                    for (int j = 0; j < T; j++) {
                        double s = 0;
                        for (int d = 0; d < hd; d++) s += (double)q[i * W + h * hd + d] * k[j * W + h * hd + d];
                        p[j] = s * scale;
                        m = fmax(m, p[j]);
                    }
                    for (int j = 0; j < T; j++) sum += (p[j] = exp(p[j] - m));
                    for (int d = 0; d < hd; d++) {
                        double want = 0;
                        for (int j = 0; j < T; j++) want += p[j] / sum * v[j * W + h * hd + d];
                        maxd = fmax(maxd, fabs(want - o[i * W + h * hd + d]));
                    }
                }
            if (maxd >= 1e-5) fprintf(stderr, "  T=%d H=%d hd=%d threads=%d: max diff %.3g\n", T, H, hd, nth, maxd);
            NM_CHECK(maxd < 1e-5);
            Q.ne[1] = K.ne[1] = V.ne[1] = O.ne[1] = T + 1; // longer than reserved
            NM_CHECK(!nm_backend_supports_op(be, &op));
            free(p), free(q), free(k), free(v), free(o);
            nm_backend_free(be);
        }
    }
}

// Softmax numerators (the attention ops' exponential) against exp() in double:
// every value on [-93, 87] (both clamps) and, as softmax uses it, the sum.
// x sigmoid(x (a + b x^2)), reference and chosen kernel, for GELU(tanh),
// quick GELU and SiLU, against double precision over [-60, 60] (past the
// exponential's clamps: 0 far left, x far right), odd n (the scalar tail).
// Computed in two pieces it gives the same bits (a thread's range can end
// anywhere). The error is measured against |x| (y = x s with s in [0, 1]): where s is
// tiny its relative error is the f32 rounding of the exponent's argument, up
// to 2^-24 x 87.
NM_TEST(xsigmoid_equals_gelu_and_silu) {
    const nm_xsigmoid_fn fns[2] = {nm_xsigmoid_ref, nm_xsigmoid_get()};
    const float k0 = 2.0f * 0.7978845608028654f;
    const float as[3] = {k0, 1.702f, 1.0f}, bs[3] = {k0 * 0.044715f, 0.0f, 0.0f};
    enum { N = 2001 };
    static float x[N], y[N];
    for (int i = 0; i < N; i++) x[i] = -60.0f + 120.0f * i / (N - 1);
    for (int f = 0; f < 2; f++)
        for (int a = 0; a < 3; a++) {
            fns[f](x, y, N, as[a], bs[a]);
            double maxd = 0;
            for (int i = 0; i < N; i++) {
                const double v = x[i], want = v / (1.0 + exp(-v * (as[a] + bs[a] * v * v)));
                maxd = fmax(maxd, fabs(y[i] - want) / fmax(fabs(v), 1e-30));
            }
            if (maxd >= 5e-7) fprintf(stderr, "  %s, a %g: max error / |x| %g\n", f ? "chosen" : "ref", as[a], maxd);
            NM_CHECK(maxd < 5e-7);
            // split where a thread's range may end: every element the same bits
            static float y2[N];
            for (int cut = 8; cut < N; cut += 61) { // tails of every length
                fns[f](x, y2, cut, as[a], bs[a]);
                fns[f](x + cut, y2 + cut, N - cut, as[a], bs[a]);
                NM_CHECK(!memcmp(y, y2, sizeof y));
            }
        }
}

NM_TEST(expsum_equals_exp) {
    for (int i = -87000; i <= 88000; i += 7) {
        float x = i / 1000.0f;
        double want = exp((double)x), got = nm_expsum_ref(&x, 1, 0.0f);
        if (fabs(got - want) / want >= 1e-6) {
            fprintf(stderr, "  nm_expsum_ref at %g: %g, want %g\n", i / 1000.0, got, want);
            NM_CHECK(0);
            break;
        }
    }
    // the reference and the chosen kernel (the same function where the CPU has no SIMD one),
    // each at m = 3 and at m = 90 (the softmax case: m = max, every x <= 0)
    const nm_expsum_fn fns[2] = {nm_expsum_ref, nm_expsum_get()};
    const float ms[2] = {3.0f, 90.0f};
    enum { N = 1003 };
    static float s[N];
    for (int f = 0; f < 2; f++)
        for (int k = 0; k < 2; k++) {
            static float in[N];
            for (int i = 0; i < N; i++) s[i] = in[i] = -90.0f + 180.0f * i / (N - 1); // past both clamps
            const float m = ms[k];
            float sum = fns[f](s, N, m);
            double maxrel = 0, want_sum = 0;
            for (int i = 0; i < N; i++) {
                double x = (double)(in[i] - m), want = exp(fmin(fmax(x, -87.0), 88.0));
                want_sum += want;
                maxrel = fmax(maxrel, fabs(s[i] - want) / want);
            }
            if (maxrel >= 1e-6) fprintf(stderr, "  expsum %s, m %g: max rel %g\n", f ? "chosen" : "ref", m, maxrel);
            NM_CHECK(maxrel < 1e-6);
            if (k == 1) NM_CHECK(fabs(sum - want_sum) / want_sum < 1e-5); // (m = 3 overflows a float sum)
        }
}

NM_TEST(unsupported_op_is_a_status) {
    nm_backend *be = cpu_backend(1, 64, 16);
    float w[128], x[128], y[2];
    nm_tensor W = {.type = 77, .ne = {64, 2, 1, 1}, .offs = (size_t)(uintptr_t)(w)}, X = {.ne = {64, 1, 1, 1}, .offs = (size_t)(uintptr_t)(x)},
              Y = {.ne = {2, 1, 1, 1}, .offs = (size_t)(uintptr_t)(y)};
    nm_op op = {.kind = NM_OP_MATMUL, .src0 = &W, .src1 = &X, .dst = &Y};
    NM_CHECK(!nm_backend_supports_op(be, &op));
    NM_CHECK(nm_backend_run(be, &op, 1) == NM_ERR_UNSUPPORTED);
    NM_CHECK(strlen(nm_backend_last_error(be)) > 0);
    W.type = NM_TYPE_F32;
    W.ne[0] = 128; // longer than the backend's max row
    NM_CHECK(!nm_backend_supports_op(be, &op));
    nm_backend_free(be);
}

// ---- the registry ---------------------------------------------------------------------------
// A backend "fake" of one device: the CPU backend's operations with its
// optional members left out (prepare_weight, get_stats), or with a required
// one left out, or of another interface version (g_fake_kind).
static nm_backend_i g_fake_iface;
static int g_fake_kind; // 0 optional members out, 1 submit out, 2 version 1
static int32_t fake_devices(nm_device_info *out, int32_t n, bool measure) {
    (void)measure;
    if (out && n > 0) {
        memset(out, 0, sizeof *out);
        snprintf(out->name, sizeof out->name, "fake:0");
        snprintf(out->type, sizeof out->type, "other");
    }
    return 1;
}
static nm_status fake_create(int32_t index, const nm_backend_params *p, nm_backend **out, char *err, size_t err_size) {
    if (index != 0) return snprintf(err, err_size, "fake:%d: no such device", (int)index), NM_ERR_UNSUPPORTED;
    nm_status st = nm_backend_create("cpu", p, out, err, err_size);
    if (st != NM_OK) return st;
    g_fake_iface = *(*out)->iface;
    g_fake_iface.name = "fake";
    g_fake_iface.prepare_weight = NULL, g_fake_iface.get_stats = NULL;
    if (g_fake_kind == 1) g_fake_iface.submit = NULL;
    if (g_fake_kind == 2) g_fake_iface.version = 1;
    (*out)->iface = &g_fake_iface; // (its free is the CPU backend's: it frees what the CPU backend made)
    return NM_OK;
}
static const nm_backend_reg g_fake = {.version = NM_BACKEND_IFACE_VERSION, .name = "fake", .devices = fake_devices,
                                      .create = fake_create};

// Backends are registered, not named: a backend registered here is created by
// its name and listed among the devices; its interface version is checked at
// registration and its table when it is created (a required member missing
// fails, optional ones may be NULL: the wrappers give them their meaning);
// an unknown device's error lists the registered names.
NM_TEST(backend_registry_registers_and_checks) {
    char err[256] = "";
    nm_backend_reg old = g_fake;
    old.version = NM_BACKEND_IFACE_VERSION - 1;
    old.name = "old";
    NM_CHECK(nm_backend_register(&old, err, sizeof err) == NM_ERR_INVALID_ARG && strstr(err, "interface version"));
    NM_CHECK(nm_backend_register(&nm_backend_cpu_reg, err, sizeof err) == NM_ERR_INVALID_ARG && strstr(err, "already"));
    nm_backend_reg nocreate = g_fake;
    nocreate.create = NULL;
    NM_CHECK(nm_backend_register(&nocreate, err, sizeof err) == NM_ERR_INVALID_ARG);
    const int32_t n0 = nm_list_devices(NULL, 0, false);
    NM_CHECK(nm_backend_register(&g_fake, err, sizeof err) == NM_OK);
    NM_CHECK(nm_backend_reg_find("fake", 4) == &g_fake && nm_backend_reg_find("old", 3) == NULL);
    nm_device_info d[16];
    const int32_t n1 = nm_list_devices(d, 16, false);
    NM_CHECK(n1 == n0 + 1 && n1 <= 16 && !strcmp(d[n1 - 1].name, "fake:0") && !strcmp(d[0].name, "cpu"));
    // optional members NULL: the wrappers do without them; the backend computes
    const nm_backend_params p = {.n_threads = 1, .max_row = 64, .max_tokens = 4};
    nm_backend *be = NULL;
    NM_CHECK(nm_backend_create("fake", &p, &be, err, sizeof err) == NM_OK && be);
    if (be) {
        NM_CHECK(!strcmp(nm_backend_name(be), "fake") && !nm_backend_prepares_weights(be));
        float w[64 * 2], x[64], y[2] = {0};
        for (int i = 0; i < 128; i++) w[i] = (float)(i % 7);
        for (int i = 0; i < 64; i++) x[i] = 1.0f;
        nm_tensor W = nm_tensor_at(w, NM_TYPE_F32, 64, 2), X = nm_tensor_at(x, NM_TYPE_F32, 64, 1),
                  Y = nm_tensor_at(y, NM_TYPE_F32, 2, 1);
        NM_CHECK(nm_backend_prepare_weight(be, &W) == NM_OK);
        nm_op op = {.kind = NM_OP_MATMUL, .src0 = &W, .src1 = &X, .dst = &Y};
        NM_CHECK(nm_backend_run(be, &op, 1) == NM_OK);
        float want0 = 0;
        for (int i = 0; i < 64; i++) want0 += (float)(i % 7);
        NM_CHECK(y[0] == want0);
        nm_backend_stats st;
        memset(&st, 0xff, sizeof st);
        nm_backend_get_stats(be, &st);
        NM_CHECK(st.bytes_wrapped == 0 && st.bytes_uploaded == 0);
        nm_backend_free(be);
    }
    NM_CHECK(nm_backend_create("fake:1", &p, &be, err, sizeof err) == NM_ERR_UNSUPPORTED && !be);
    // a required member missing, another interface version: refused when created
    g_fake_kind = 1;
    NM_CHECK(nm_backend_create("fake", &p, &be, err, sizeof err) == NM_ERR_INVALID_ARG && !be && strstr(err, "no submit"));
    g_fake_kind = 2;
    NM_CHECK(nm_backend_create("fake", &p, &be, err, sizeof err) == NM_ERR_INVALID_ARG && !be &&
             strstr(err, "interface version 1"));
    g_fake_kind = 0;
    NM_CHECK(nm_backend_create("nosuch:0", &p, &be, err, sizeof err) == NM_ERR_INVALID_ARG &&
             strstr(err, "unknown device 'nosuch:0' (cpu, opencl, opencl:N, opencl:auto, fake)"));
    if (!strstr(err, "(cpu, opencl, opencl:N, opencl:auto, fake)")) fprintf(stderr, "  %s\n", err);
    NM_CHECK(nm_backend_create("opencl:x", &p, &be, err, sizeof err) == NM_ERR_INVALID_ARG && strstr(err, "opencl:N"));
}

NM_TEST_MAIN()
