// AVX-512 f32 GEMM for the prefill path and the encoders' attention, in
// outer-product form: the activations are packed into 16-token panels
// (xp[k * 16 + l], token l in lane l; once per matmul) and nr <= 12 weight rows
// are read in place and broadcast against two panels, so one k-step is 2
// loads, nr broadcasts and 2 nr FMAs into 2 nr accumulators of 16 tokens each
// (24 FMAs to 14 loads; a 16-row x 14-token form with the weights packed
// issues a load per FMA and reached ~3/4 of the FMA ports' rate even in L1,
// and packing every weight tile cost a fifth of the time at 200 tokens).
// Nothing is summed horizontally: each output is one FMA chain, bias first,
// then k in order. Row j of the block is at p[j / 3] + (j % 3) * ldw, four
// pointers for twelve rows, so the addresses need no more registers than
// x86 has. Compiled with the x86 flags; the pragma adds AVX-512F to these
// functions, which gemm.c hands out only where cpuid reports it.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,avx512f"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC target("avx512f")
#endif

#include <immintrin.h>
#include <math.h>

#include "backend/cpu/gemm.h"

#define XR NM_GEMM_XPANEL_ROWS // weight rows per block

// pout: the sums stay in panel layout (row j's lanes at y + 16 j, the second
// panel's at y + ys) instead of being scattered to y[l * ldy + j].
static inline __attribute__((always_inline)) void xblock(const float *restrict w, int64_t ldw, const float *restrict xp,
                                                          int64_t K, float *restrict y, int64_t ldy, int64_t ys,
                                                          __mmask16 tm0, __mmask16 tm1, __m512i idx,
                                                          const float *restrict bias, int nr, int np, int pout) {
    __m512 a0[XR], a1[XR];
    for (int j = 0; j < XR; j++) a0[j] = a1[j] = j < nr && bias ? _mm512_set1_ps(bias[j]) : _mm512_setzero_ps();
    const float *p[4];
    for (int i = 0; i < 4; i++) p[i] = 3 * i < nr ? w + 3 * i * ldw : w;
    const float *xq = xp + (np > 1 ? K * NM_GEMM_PACK_ROWS : 0);
    for (int64_t k = 0; k < K; k++) {
        const __m512 x0 = _mm512_load_ps(xp + k * NM_GEMM_PACK_ROWS);
        const __m512 x1 = np > 1 ? _mm512_load_ps(xq + k * NM_GEMM_PACK_ROWS) : x0;
#pragma GCC unroll 12
        for (int j = 0; j < XR; j++)
            if (j < nr) {
                const __m512 wv = _mm512_set1_ps(p[j / 3][k + (j % 3) * ldw]);
                a0[j] = _mm512_fmadd_ps(wv, x0, a0[j]);
                if (np > 1) a1[j] = _mm512_fmadd_ps(wv, x1, a1[j]);
            }
    }
    if (pout) {
#pragma GCC unroll 12
        for (int j = 0; j < nr; j++) {
            _mm512_store_ps(y + 16 * j, a0[j]);
            if (np > 1) _mm512_store_ps(y + ys + 16 * j, a1[j]);
        }
        return;
    }
    // Token l's nr sums are one masked store to y + l * ldy: a scatter per row
    // would touch every token's line once per row, and with a row stride that
    // is a multiple of 4 KiB (3072 floats: a ViT's FFN) all of them fall in one
    // L1 set, so each row's scatter evicted the lines the one before it wrote.
    float buf[2][XR][16] __attribute__((aligned(64)));
#pragma GCC unroll 12
    for (int j = 0; j < nr; j++) {
        _mm512_store_ps(buf[0][j], a0[j]);
        if (np > 1) _mm512_store_ps(buf[1][j], a1[j]);
    }
    const __mmask16 rm = (__mmask16)((1u << nr) - 1);
    for (int h = 0; h < np; h++) {
        const int n = _mm_popcnt_u32(h ? tm1 : tm0);
        for (int l = 0; l < n; l++)
            _mm512_mask_storeu_ps(y + (16 * h + l) * ldy, rm, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), rm, idx, &buf[h][0][l], 4));
    }
}

#define XBLOCK_CASE(n)                                                                        \
    case n:                                                                                       \
        if (pout && np > 1) xblock(w, ldw, xp, K, y, ldy, ys, tm0, tm1, idx, bias, n, 2, 1);      \
        else if (pout) xblock(w, ldw, xp, K, y, ldy, ys, tm0, tm1, idx, bias, n, 1, 1);           \
        else if (np > 1) xblock(w, ldw, xp, K, y, ldy, ys, tm0, tm1, idx, bias, n, 2, 0);         \
        else xblock(w, ldw, xp, K, y, ldy, ys, tm0, tm1, idx, bias, n, 1, 0);                     \
        break;

static inline void xpanel(const float *restrict w, int64_t ldw, int64_t R, const float *restrict xp, int64_t nt,
                          int64_t K, float *restrict y, int64_t ldy, int64_t ys, const float *restrict bias, int pout) {
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32(16)); // row j of a panel's sums in xblock's buf
    const int np = nt > NM_GEMM_PACK_ROWS ? 2 : 1;
    const __mmask16 tm0 = (__mmask16)((1u << (nt < 16 ? nt : 16)) - 1);
    const __mmask16 tm1 = (__mmask16)((1u << (nt > 16 ? nt - 16 : 0)) - 1);
    switch ((int)R) {
        XBLOCK_CASE(1) XBLOCK_CASE(2) XBLOCK_CASE(3) XBLOCK_CASE(4) XBLOCK_CASE(5) XBLOCK_CASE(6) XBLOCK_CASE(7)
        XBLOCK_CASE(8) XBLOCK_CASE(9) XBLOCK_CASE(10) XBLOCK_CASE(11) XBLOCK_CASE(12)
    }
}

void nm_gemm_f32_xpanel_avx512(const float *restrict w, int64_t ldw, int64_t R, const float *restrict xp, int64_t nt,
                               int64_t K, float *restrict y, int64_t ldy, const float *restrict bias) {
    xpanel(w, ldw, R, xp, nt, K, y, ldy, 0, bias, 0);
}

void nm_gemm_f32_xpanel_pout_avx512(const float *restrict w, int64_t ldw, int64_t R, const float *restrict xp,
                                    int64_t nt, int64_t K, float *restrict y, int64_t ys) {
    xpanel(w, ldw, R, xp, nt, K, y, 1, ys, NULL, 1);
}

static inline __m512 exp512(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    const __m512 magic = _mm512_set1_ps(12582912.0f);
    const __m512 nn = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), magic), magic);
    const __m512 r = _mm512_fnmadd_ps(nn, _mm512_set1_ps(1.428606765330187e-6f),
                                      _mm512_fnmadd_ps(nn, _mm512_set1_ps(0.693145751953125f), x));
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(nn), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

// WaveNet's gate y = tanh(a) sigmoid(b) and tanh, with exp512: tanh(a) = 1 - 2 / (e^(2a) + 1),
// sigmoid(b) = 1 / (1 + e^(-b)) (absolute error below 1e-6 against libm's); tails 16 lanes masked.
static inline __m512 tanh512(__m512 a) {
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512 big = _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(exp512(_mm512_add_ps(a, a)), one)));
    // |a| < 0.25: its odd Taylor polynomial to a^7 (the formula above cancels there; the polynomial's error
    // is below 1e-7 of a)
    const __m512 a2 = _mm512_mul_ps(a, a);
    __m512 p = _mm512_set1_ps(-17.0f / 315.0f);
    p = _mm512_fmadd_ps(p, a2, _mm512_set1_ps(2.0f / 15.0f));
    p = _mm512_fmadd_ps(p, a2, _mm512_set1_ps(-1.0f / 3.0f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, a2), a, a);
    const __mmask16 small = _mm512_cmp_ps_mask(_mm512_abs_ps(a), _mm512_set1_ps(0.25f), _CMP_LT_OQ);
    return _mm512_mask_blend_ps(small, big, p);
}

void nm_gate_avx512(const float *a, const float *b, float *y, int64_t n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        const __m512 va = _mm512_maskz_loadu_ps(m, a + i), vb = _mm512_maskz_loadu_ps(m, b + i);
        const __m512 sg = _mm512_div_ps(one, _mm512_add_ps(one, exp512(_mm512_sub_ps(_mm512_setzero_ps(), vb))));
        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(tanh512(va), sg));
    }
}

void nm_tanh_avx512(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(x + i, m, tanh512(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

// nm_expsum_avx2's exponential, 16 lanes at a time (the same operations, so
// the same values).

void nm_softmax_panel_avx512(float *restrict sp, int64_t n) {
    __m512 m = _mm512_set1_ps(-INFINITY), sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j++) m = _mm512_max_ps(m, _mm512_load_ps(sp + 16 * j));
    for (int64_t j = 0; j < n; j++) {
        const __m512 x = _mm512_load_ps(sp + 16 * j);
        const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ); // masked: exact 0
        const __m512 e = _mm512_maskz_mov_ps(live, exp512(_mm512_sub_ps(x, m)));
        _mm512_store_ps(sp + 16 * j, e);
        sum = _mm512_add_ps(sum, e);
    }
    const __m512 inv = _mm512_div_ps(_mm512_set1_ps(1.0f), sum);
    for (int64_t j = 0; j < n; j++) _mm512_store_ps(sp + 16 * j, _mm512_mul_ps(_mm512_load_ps(sp + 16 * j), inv));
}

// The C library's expf, 16 lanes at a time, for x <= 0: the same operations
// in double precision as glibc's (since 2.27) - x widened, k = round(x 32 /
// ln 2) by the 1.5 * 2^52 shift, r = x 32 / ln 2 - k in one FMA (as glibc's
// FMA build: with r from a rounded product, one float in 1.1e9 differs), 2^(k / 32) from a
// 32-entry table of 2^(i / 32) with k / 32 added to the exponent, a degree-3
// polynomial in r with FMAs - then rounded to float; x < -103.97 gives 0
// (glibc's underflow). tab: nm_expf_libm_table. Equal to expf on every float
// in [-103.97, 0] with this machine's libm (tests/unit/test_backend.c
// `expf_libm_equals_expf`, every float with NM_TEST_EXHAUSTIVE=1); gemm.c
// checks a sample at start and uses it only if it agrees.
static inline __m512 expf_libm16(__m512 x, const double *tab) {
    const __m512d t0 = _mm512_loadu_pd(tab), t1 = _mm512_loadu_pd(tab + 8), t2 = _mm512_loadu_pd(tab + 16),
                  t3 = _mm512_loadu_pd(tab + 24);
    const __m512d invln2n = _mm512_set1_pd(0x1.71547652b82fep+0 * 32), shift = _mm512_set1_pd(0x1.8p+52);
    const __m512d c0 = _mm512_set1_pd(0x1.c6af84b912394p-5 / 32 / 32 / 32), c1 = _mm512_set1_pd(0x1.ebfce50fac4f3p-3 / 32 / 32);
    const __m512d c2 = _mm512_set1_pd(0x1.62e42ff0c52d6p-1 / 32), one = _mm512_set1_pd(1.0);
    __m256 half[2];
    for (int h = 0; h < 2; h++) {
        const __m256 xh = h ? _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)) : _mm512_castps512_ps256(x);
        const __m512d xd = _mm512_cvtps_pd(xh);
        __m512d kd = _mm512_fmadd_pd(invln2n, xd, shift);
        const __m512i ki = _mm512_castpd_si512(kd);
        kd = _mm512_sub_pd(kd, shift);
        const __m512d r = _mm512_fmsub_pd(invln2n, xd, kd); // fused, as the FMA build of glibc: r exact
        const __m512i idx = _mm512_and_si512(ki, _mm512_set1_epi64(31));
        const __m512d lo = _mm512_permutex2var_pd(t0, idx, t1), hi = _mm512_permutex2var_pd(t2, idx, t3);
        const __mmask8 up = _mm512_test_epi64_mask(idx, _mm512_set1_epi64(16));
        const __m512i t = _mm512_add_epi64(_mm512_castpd_si512(_mm512_mask_blend_pd(up, lo, hi)), _mm512_slli_epi64(ki, 47));
        const __m512d r2 = _mm512_mul_pd(r, r);
        __m512d y = _mm512_fmadd_pd(_mm512_fmadd_pd(c0, r, c1), r2, _mm512_fmadd_pd(c2, r, one));
        y = _mm512_mul_pd(y, _mm512_castsi512_pd(t));
        half[h] = _mm512_cvtpd_ps(y);
    }
    const __m512 e = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(half[0])),
                                                         _mm256_castps_pd(half[1]), 1));
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-0x1.9fe368p6f), _CMP_GE_OQ), e);
}

void nm_expf_libm_avx512(const float *x, float *y, int64_t n, const double *tab) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, expf_libm16(_mm512_loadu_ps(x + i), tab));
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(y + i, m, expf_libm16(_mm512_maskz_loadu_ps(m, x + i), tab));
    }
}

void nm_softmax_panel_ggml_avx512(float *restrict sp, int64_t n, float scale, const double *tab) {
    const __m512 vs = _mm512_set1_ps(scale);
    __m512 m = _mm512_set1_ps(-INFINITY), sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j++) {
        const __m512 v = _mm512_mul_ps(_mm512_load_ps(sp + 16 * j), vs);
        _mm512_store_ps(sp + 16 * j, v);
        m = _mm512_max_ps(m, v);
    }
    for (int64_t j = 0; j < n; j++) {
        const __m512 e = expf_libm16(_mm512_sub_ps(_mm512_load_ps(sp + 16 * j), m), tab);
        _mm512_store_ps(sp + 16 * j, e);
        sum = _mm512_add_ps(sum, e);
    }
    const __m512 inv = _mm512_div_ps(_mm512_set1_ps(1.0f), sum);
    for (int64_t j = 0; j < n; j++) _mm512_store_ps(sp + 16 * j, _mm512_mul_ps(_mm512_load_ps(sp + 16 * j), inv));
}

#if defined(__clang__)
#pragma clang attribute pop
#endif
