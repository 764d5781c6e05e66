// AVX-512 row kernel of the direct-form convolutions (conv1d.h): a block of
// 12 output rows by 2 vectors of 16 output channels kept in 24 accumulators
// (the last odd vector: 12); each input channel of each tap loads 2 weight
// vectors and broadcasts 12 input values from their rows, 14 loads for 24
// FMAs. Wider blocks of fewer rows (4 vectors by 6) read the weights, which
// outgrow L1 (7 taps x 64 channels x 64 is 112 KiB), from L2 twice as often
// per FMA and ran at a third of the rate. Each sum is one FMA chain: bias, then tap,
// then input channel, the reference's order (but one output channel's: below).
// Winograd's transforms (conv1d.h) follow. The pragma adds AVX-512F to
// these functions, which conv1d.c hands out only where cpuid reports it.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,avx512f"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC target("avx512f")
#endif

#include <immintrin.h>
#include <stdbool.h>

#include "backend/cpu/conv1d.h"

// The first block of rows of a column prefetches its weights PF_FLOATS (2 KB) ahead, the column's next
// rows and then the next panel's (they follow in memory): a short sequence (a sentence's phonemes, a
// flow window) reads each weight a few times, cold, and streamed them from memory at the rate the
// hardware's prefetchers allowed (the flows' WaveNet convolutions: 258 -> 213 ms for 88 s of speech
// without AMX); the later blocks find the column in L1 or L2.
#define PF_FLOATS 512
// One block of NT rows by NV vectors (the dimensions constants, so the accumulators live in registers).
#define BLOCK(NV, NT)                                                                                            \
    static void block_##NV(const float *restrict x, int64_t xstep, const float *restrict w, int64_t wstep,        \
                           int32_t ntaps, int32_t ic, int64_t ocp, const float *restrict bias, __mmask16 last,   \
                           int nr, const float *ya, const float *yb, float scale, float *y, int64_t ldy, bool pf) { \
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
                if (pf) {                                                                                        \
                    _mm_prefetch((const char *)(wq + (int64_t)i * ocp + PF_FLOATS), _MM_HINT_T0);               \
                    _mm_prefetch((const char *)(wq + (int64_t)i * ocp + PF_FLOATS + 16), _MM_HINT_T0);          \
                }                                                                                                \
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
                   yb ? yb + r * ldy + o0 : NULL, scale, y + r * ldy + o0, ldy, r == 0)

// One output channel (HiFi-GAN's last convolution, 32 channels to 1): the lanes hold input channels, not
// output channels (15 of 16 lanes would be padding), each row a dot product of its taps' inputs with the
// weights (gathered from their column first), 8 rows at a time; one sum in a fixed order per row (lane by
// lane, then the lanes': not the reference's order, within its rounding).
#define OC1_MAX 4096
#define OC1_ROWS 8
static inline __m512 oc1_row(const float *restrict x, int64_t xstep, const float *restrict wc, int32_t ntaps, int32_t ic) {
    __m512 acc = _mm512_setzero_ps();
    for (int32_t q = 0; q < ntaps; q++)
        for (int32_t i = 0; i < ic; i += 16) {
            const __mmask16 mk = ic - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (ic - i)) - 1);
            acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, wc + q * ic + i), _mm512_maskz_loadu_ps(mk, x + q * xstep * ic + i),
                                  acc);
        }
    return acc;
}
static void rows_oc1(const float *restrict x, int64_t xstep, const float *restrict w, int64_t wstep, int32_t ntaps,
                     int32_t ic, int64_t ldw, const float *restrict bias, int64_t rows, const nm_conv_add *add,
                     float *y, int64_t ldy) {
    float wc[OC1_MAX];
    for (int32_t q = 0; q < ntaps; q++)
        for (int32_t i = 0; i < ic; i++) wc[q * ic + i] = w[q * wstep + i * ldw];
    const float b = bias ? bias[0] : 0.0f;
    for (int64_t r = 0; r < rows; r += OC1_ROWS) {
        const int nr = rows - r < OC1_ROWS ? (int)(rows - r) : OC1_ROWS;
        float sums[OC1_ROWS];
        if (nr == OC1_ROWS) {
            __m512 acc[OC1_ROWS];
            _Pragma("GCC unroll 8") for (int t = 0; t < OC1_ROWS; t++) acc[t] = oc1_row(x + (r + t) * ic, xstep, wc, ntaps, ic);
            _Pragma("GCC unroll 8") for (int t = 0; t < OC1_ROWS; t++) sums[t] = _mm512_reduce_add_ps(acc[t]);
        } else
            for (int t = 0; t < nr; t++) sums[t] = _mm512_reduce_add_ps(oc1_row(x + (r + t) * ic, xstep, wc, ntaps, ic));
        for (int t = 0; t < nr; t++) {
            const int64_t at = (r + t) * ldy;
            float v = b + sums[t];
            if (add && add->a) v += add->a[at];
            if (add && add->b) v += add->b[at];
            y[at] = add ? v * add->scale : v;
        }
    }
}

void nm_conv_rows_avx512(const float *restrict x, int64_t xstep, const float *restrict w, int64_t wstep,
                         int32_t ntaps, int32_t ic, int32_t oc, int64_t ldw, const float *restrict bias, int64_t rows,
                         const nm_conv_add *add, float *y, int64_t ldy) {
    if (oc == 1 && (int64_t)ntaps * ic <= OC1_MAX) {
        rows_oc1(x, xstep, w, wstep, ntaps, ic, ldw, bias, rows, add, y, ldy);
        return;
    }
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

// Winograd's transforms (conv1d.h), 16 channels at a time: the tile's n rows of them in registers (n a
// constant in the bodies, the loops unrolled). They rest on the points' order, 0, then pairs +a, -a, then
// infinity (conv1d.c): B^T's row for -a is +a's with the odd columns negated, so a pair's two rows are
// E + O and E - O of the even and odd columns' sums; A^T's columns for +a and -a are a^s and (-a)^s, so
// an output sums a^s (M+ + M-) for even s, a^s (M+ - M-) for odd; 0's column is 1 at s = 0 only and
// infinity's at s = m - 1 only.
#define WINO_BODIES(N)                                                                                           \
    static void wino_in_##N(const float *const *xr, int32_t ic, float slope, const float *bt, float *v,         \
                            int64_t vstep) {                                                                    \
        const __m512 sl = _mm512_set1_ps(slope);                                                                 \
        const bool leaky = slope != 1.0f;                                                                        \
        for (int32_t i = 0; i < ic; i += 16) {                                                                   \
            const __mmask16 mk = ic - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (ic - i)) - 1);           \
            __m512 xv[N];                                                                                        \
            _Pragma("GCC unroll 16") for (int j = 0; j < N; j++) xv[j] = _mm512_maskz_loadu_ps(mk, xr[j] + i);  \
            if (leaky) _Pragma("GCC unroll 16") for (int j = 0; j < N; j++) xv[j] = _mm512_max_ps(xv[j], _mm512_mul_ps(xv[j], sl)); \
            _Pragma("GCC unroll 16") for (int p = 0; p < N; p += (p == 0 || p == N - 1) ? 1 : 2) {               \
                const float *b = bt + p * N;                                                                     \
                __m512 e = _mm512_mul_ps(_mm512_set1_ps(b[0]), xv[0]);                                           \
                __m512 o = _mm512_mul_ps(_mm512_set1_ps(b[1]), xv[1]);                                           \
                _Pragma("GCC unroll 16") for (int j = 2; j < N; j += 2) {                                        \
                    e = _mm512_fmadd_ps(_mm512_set1_ps(b[j]), xv[j], e);                                         \
                    o = _mm512_fmadd_ps(_mm512_set1_ps(b[j + 1]), xv[j + 1], o);                                 \
                }                                                                                                \
                _mm512_mask_storeu_ps(v + p * vstep + i, mk, _mm512_add_ps(e, o));                               \
                if (p > 0 && p < N - 1) _mm512_mask_storeu_ps(v + (p + 1) * vstep + i, mk, _mm512_sub_ps(e, o)); \
            }                                                                                                    \
        }                                                                                                        \
    }                                                                                                            \
    static void wino_out_##N(const float *mt, int64_t mstep, int32_t s0, int32_t s1, int32_t oc, const float *at, \
                             const float *bias, const nm_conv_add *add, float *y, int64_t ystep) {              \
        for (int32_t o = 0; o < oc; o += 16) {                                                                   \
            const __mmask16 mk = oc - o >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (oc - o)) - 1);           \
            __m512 sd[N]; /* [0]: M_0, [2k - 1], [2k]: the pair's sum and difference, [N - 1]: M_inf */           \
            _Pragma("GCC unroll 16") for (int p = 0; p < N; p++) sd[p] = _mm512_maskz_loadu_ps(mk, mt + p * mstep + o); \
            _Pragma("GCC unroll 16") for (int p = 1; p < N - 1; p += 2) {                                        \
                const __m512 a = sd[p], b = sd[p + 1];                                                           \
                sd[p] = _mm512_add_ps(a, b), sd[p + 1] = _mm512_sub_ps(a, b);                                    \
            }                                                                                                    \
            const __m512 b0 = bias ? _mm512_maskz_loadu_ps(mk, bias + o) : _mm512_setzero_ps();                 \
            for (int32_t s = s0; s < s1; s++) {                                                                  \
                const float *c = at + s * N;                                                                     \
                __m512 acc = s == 0 ? _mm512_add_ps(b0, sd[0]) : b0;                                             \
                if (s & 1) {                                                                                     \
                    _Pragma("GCC unroll 16") for (int p = 1; p < N - 1; p += 2)                                  \
                        acc = _mm512_fmadd_ps(_mm512_set1_ps(c[p]), sd[p + 1], acc);                             \
                } else {                                                                                         \
                    _Pragma("GCC unroll 16") for (int p = 1; p < N - 1; p += 2)                                  \
                        acc = _mm512_fmadd_ps(_mm512_set1_ps(c[p]), sd[p], acc);                                 \
                }                                                                                                \
                if (c[N - 1] != 0.0f) acc = _mm512_add_ps(acc, sd[N - 1]);                                       \
                const int64_t e = (s - s0) * ystep + o;                                                          \
                if (add && add->a) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(mk, add->a + e));              \
                if (add && add->b) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(mk, add->b + e));              \
                if (add) acc = _mm512_mul_ps(acc, _mm512_set1_ps(add->scale));                                   \
                _mm512_mask_storeu_ps(y + e, mk, acc);                                                           \
            }                                                                                                    \
        }                                                                                                        \
    }
WINO_BODIES(6)
WINO_BODIES(8)
WINO_BODIES(10)

void nm_wino_in_avx512(const float *const *xr, int32_t n, int32_t ic, float slope, const float *bt, float *v,
                       int64_t vstep) {
    if (n == 10) wino_in_10(xr, ic, slope, bt, v, vstep);
    else if (n == 8) wino_in_8(xr, ic, slope, bt, v, vstep);
    else if (n == 6) wino_in_6(xr, ic, slope, bt, v, vstep);
    else nm_wino_in_ref(xr, n, ic, slope, bt, v, vstep);
}

void nm_wino_out_avx512(const float *mt, int64_t mstep, int32_t n, int32_t s0, int32_t s1, int32_t oc,
                        const float *at, const float *bias, const nm_conv_add *add, float *y, int64_t ystep) {
    if (n == 10) wino_out_10(mt, mstep, s0, s1, oc, at, bias, add, y, ystep);
    else if (n == 8) wino_out_8(mt, mstep, s0, s1, oc, at, bias, add, y, ystep);
    else if (n == 6) wino_out_6(mt, mstep, s0, s1, oc, at, bias, add, y, ystep);
    else nm_wino_out_ref(mt, mstep, n, s0, s1, oc, at, bias, add, y, ystep);
}

#if defined(__clang__)
#pragma clang attribute pop
#endif
