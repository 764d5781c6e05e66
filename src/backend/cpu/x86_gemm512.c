// AVX-512 f32 GEMM for the prefill path, on a packed weight tile: a zmm holds
// one k of all 16 rows of the tile (wp[k * 16 + r]), and each token's x[k] is
// broadcast, so one k-step is 1 load, NR broadcasts and NR FMAs into NR
// accumulators of 16 rows each (outer-product form). Nothing is summed
// horizontally and each weight and activation is read once per 16 x NR block,
// where the AVX2 kernel's dot-product form re-reads rows and tokens for every
// 4 x 3 block and is bound by L2 bandwidth. The tile is packed once for all
// the tokens of the call. Compiled with the x86 flags; the pragma adds
// AVX-512F to these functions, which gemm.c hands out only where cpuid reports it.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,avx512f"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC target("avx512f")
#endif

#include <immintrin.h>

#include "backend/cpu/gemm.h"

#define NR 14 // tokens per block: 14 accumulators + the weight vector + broadcasts fit the 32 zmm

// nr tokens (nr <= NR, a constant after inlining) x the 16 rows of wp, rows
// >= R masked off at the store. Token j's activations are x + j * K, read
// through five pointers (tokens 3i, 3i+1, 3i+2 at p_i, p_i + K, p_i + 2K) so
// that the addresses need no more registers than x86 has.
static inline __attribute__((always_inline)) void block(const float *restrict wp, const float *restrict x, int64_t K,
                                                         float *restrict y, int64_t ldy, __mmask16 m, __m512 b0, int nr) {
    __m512 acc[NR];
    for (int j = 0; j < NR; j++) acc[j] = b0;
    const float *p[5];
    for (int i = 0; i < 5; i++) p[i] = 3 * i < nr ? x + 3 * i * K : x;
    for (int64_t k = 0; k < K; k++) {
        const __m512 wv = _mm512_load_ps(wp + k * NM_GEMM_PACK_ROWS);
#pragma GCC unroll 14
        for (int j = 0; j < NR; j++)
            if (j < nr) acc[j] = _mm512_fmadd_ps(wv, _mm512_set1_ps(p[j / 3][k + (j % 3) * K]), acc[j]);
    }
#pragma GCC unroll 14
    for (int j = 0; j < NR; j++)
        if (j < nr) _mm512_mask_storeu_ps(y + j * ldy, m, acc[j]);
}

#define BLOCK_CASE(n) \
    case n: block(wp, x + t * K, K, y + t * ldy, ldy, m, b0, n); break;

void nm_gemm_f32_packed_avx512(const float *restrict wp, int64_t R, const float *restrict x, int64_t T, int64_t K,
                               float *restrict y, int64_t ldy, const float *restrict bias) {
    const __mmask16 m = (__mmask16)((1u << R) - 1);
    const __m512 b0 = bias ? _mm512_maskz_loadu_ps(m, bias) : _mm512_setzero_ps();
    for (int64_t t = 0; t < T; t += NR) {
        switch (T - t < NR ? (int)(T - t) : NR) {
            BLOCK_CASE(1) BLOCK_CASE(2) BLOCK_CASE(3) BLOCK_CASE(4) BLOCK_CASE(5) BLOCK_CASE(6) BLOCK_CASE(7)
            BLOCK_CASE(8) BLOCK_CASE(9) BLOCK_CASE(10) BLOCK_CASE(11) BLOCK_CASE(12) BLOCK_CASE(13) BLOCK_CASE(14)
        }
    }
}

// The same outer product with the roles swapped, for matmuls: the activations
// are packed once per matmul into 16-token panels (xp[k * 16 + l], token l in
// lane l) and nr <= 12 weight rows are read in place and broadcast against two
// panels, so one k-step is 2 loads, nr broadcasts and 2 nr FMAs into 2 nr
// accumulators of 16 tokens each (24 FMAs to 14 loads: the 16 x 14 form above
// issues a load per FMA and reaches ~3/4 of the FMA ports' rate even in L1).
// Packing x (T x K) once replaces packing every 16-row weight tile (O x K per
// matmul), and a panel is one sequential stream where the tile form read 14
// token rows at once. Each output is the same FMA chain as in
// nm_gemm_f32_packed_avx512 (bias first, then k in order; w * x is the same
// product), so the two give the same bits. Row j of the tile is at
// p[j / 3] + (j % 3) * ldw, four pointers for twelve rows.
#define XR NM_GEMM_XPANEL_ROWS // weight rows per block

static inline __attribute__((always_inline)) void xblock(const float *restrict w, int64_t ldw, const float *restrict xp,
                                                          int64_t K, float *restrict y, int64_t ldy, __mmask16 tm0,
                                                          __mmask16 tm1, __m512i idx, const float *restrict bias,
                                                          int nr, int np) {
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
#pragma GCC unroll 12
    for (int j = 0; j < XR; j++)
        if (j < nr) {
            _mm512_mask_i32scatter_ps(y + j, tm0, idx, a0[j], 4);
            if (np > 1) _mm512_mask_i32scatter_ps(y + 16 * ldy + j, tm1, idx, a1[j], 4);
        }
}

#define XBLOCK_CASE(n)                                                         \
    case n:                                                                    \
        if (np > 1) xblock(w, ldw, xp, K, y, ldy, tm0, tm1, idx, bias, n, 2); \
        else xblock(w, ldw, xp, K, y, ldy, tm0, tm1, idx, bias, n, 1);        \
        break;

void nm_gemm_f32_xpanel_avx512(const float *restrict w, int64_t ldw, int64_t R, const float *restrict xp, int64_t nt,
                               int64_t K, float *restrict y, int64_t ldy, const float *restrict bias) {
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32((int)ldy));
    const int np = nt > NM_GEMM_PACK_ROWS ? 2 : 1;
    const __mmask16 tm0 = (__mmask16)((1u << (nt < 16 ? nt : 16)) - 1);
    const __mmask16 tm1 = (__mmask16)((1u << (nt > 16 ? nt - 16 : 0)) - 1);
    switch ((int)R) {
        XBLOCK_CASE(1) XBLOCK_CASE(2) XBLOCK_CASE(3) XBLOCK_CASE(4) XBLOCK_CASE(5) XBLOCK_CASE(6) XBLOCK_CASE(7)
        XBLOCK_CASE(8) XBLOCK_CASE(9) XBLOCK_CASE(10) XBLOCK_CASE(11) XBLOCK_CASE(12)
    }
}

#if defined(__clang__)
#pragma clang attribute pop
#endif
