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

#if defined(__clang__)
#pragma clang attribute pop
#endif
