// AVX-512 row kernel of the direct-form convolutions (conv1d.h): a block of
// 12 output rows by 2 vectors of 16 output channels kept in 24 accumulators
// (the last odd vector: 12); each input channel of each tap loads 2 weight
// vectors and broadcasts 12 input values from their rows, 14 loads for 24
// FMAs. Wider blocks of fewer rows (4 vectors by 6) read the weights, which
// outgrow L1 (7 taps x 64 channels x 64 is 112 KiB), from L2 twice as often
// per FMA and ran at a third of the rate. Each sum is one FMA chain: bias, then tap,
// then input channel, the reference's order. The pragma adds AVX-512F to
// these functions, which conv1d.c hands out only where cpuid reports it.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,avx512f"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC target("avx512f")
#endif

#include <immintrin.h>

#include "backend/cpu/conv1d.h"

// One block of NT rows by NV vectors (the dimensions constants, so the accumulators live in registers).
#define BLOCK(NV, NT)                                                                                            \
    static void block_##NV(const float *restrict x, int64_t xstep, const float *restrict w, int64_t wstep,        \
                           int32_t ntaps, int32_t ic, int64_t ocp, const float *restrict bias, __mmask16 last,   \
                           int nr, const float *ya, const float *yb, float scale, float *y, int64_t ldy) {       \
        __m512 a[NT][NV];                                                                                        \
        for (int v = 0; v < NV; v++) {                                                                           \
            const __mmask16 m = v == NV - 1 ? last : (__mmask16)0xFFFF;                                          \
            const __m512 b = bias ? _mm512_maskz_loadu_ps(m, bias + 16 * v) : _mm512_setzero_ps();               \
            for (int t = 0; t < NT; t++) a[t][v] = b;                                                            \
        }                                                                                                        \
        for (int32_t q = 0; q < ntaps; q++) {                                                                    \
            const float *xq = x + q * xstep * ic, *wq = w + q * wstep;                                           \
            for (int32_t i = 0; i < ic; i++) {                                                                   \
                __m512 wv[NV];                                                                                   \
                for (int v = 0; v < NV; v++) wv[v] = _mm512_loadu_ps(wq + (int64_t)i * ocp + 16 * v);           \
                for (int t = 0; t < NT; t++) {                                                                   \
                    const __m512 xv = _mm512_set1_ps(xq[(int64_t)t * ic + i]);                                   \
                    for (int v = 0; v < NV; v++) a[t][v] = _mm512_fmadd_ps(wv[v], xv, a[t][v]);                  \
                }                                                                                                \
            }                                                                                                    \
        }                                                                                                        \
        const __m512 sc = _mm512_set1_ps(scale);                                                                 \
        for (int t = 0; t < nr; t++)                                                                             \
            for (int v = 0; v < NV; v++) {                                                                       \
                const __mmask16 m = v == NV - 1 ? last : (__mmask16)0xFFFF;                                      \
                const int64_t at = t * ldy + 16 * v;                                                             \
                if (ya) a[t][v] = _mm512_add_ps(a[t][v], _mm512_maskz_loadu_ps(m, ya + at));                     \
                if (yb) a[t][v] = _mm512_add_ps(a[t][v], _mm512_maskz_loadu_ps(m, yb + at));                     \
                if (scale != 1.0f) a[t][v] = _mm512_mul_ps(a[t][v], sc);                                         \
                _mm512_mask_storeu_ps(y + at, m, a[t][v]);                                                       \
            }                                                                                                    \
    }
BLOCK(2, 12)
BLOCK(1, 12)

// NV vectors of channels from o0 over all the rows, NT at a time.
#define COLUMN(NV, NT)                                                                                          \
    for (int64_t r = 0; r < rows; r += NT)                                                                      \
        block_##NV(x + r * ic, xstep, w + o0, wstep, ntaps, ic, ocp, bias ? bias + o0 : NULL, last,             \
                   rows - r < NT ? (int)(rows - r) : NT, ya ? ya + r * ldy + o0 : NULL,                         \
                   yb ? yb + r * ldy + o0 : NULL, scale, y + r * ldy + o0, ldy)

void nm_conv_rows_avx512(const float *restrict x, int64_t xstep, const float *restrict w, int64_t wstep,
                         int32_t ntaps, int32_t ic, int32_t oc, int64_t ldw, const float *restrict bias, int64_t rows,
                         const nm_conv_add *add, float *y, int64_t ldy) {
    const int32_t ocv = (oc + 15) & ~15; // (the vectors this part has)
    const int64_t ocp = ldw;
    const float *ya = add ? add->a : NULL, *yb = add ? add->b : NULL, scale = add ? add->scale : 1.0f;
    for (int32_t o0 = 0; o0 < oc;) {
        const int nv = ocv - o0 >= 32 ? 2 : 1;
        const __mmask16 last = o0 + 16 * nv <= oc ? (__mmask16)0xFFFF : (__mmask16)((1u << (oc & 15)) - 1);
        if (nv == 2) COLUMN(2, 12);
        else COLUMN(1, 12);
        o0 += 16 * nv;
    }
}

#if defined(__clang__)
#pragma clang attribute pop
#endif
