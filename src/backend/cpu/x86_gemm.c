// AVX2+FMA register-blocked f32 GEMM for the prefill path: a tile of weight
// rows (already dequantized into L2-resident scratch) times a batch of token
// activations. Compiled only for x86 with -mavx2 -mfma.
#include <immintrin.h>
#include <string.h>

#include "backend/cpu/gemm.h"

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// 4 rows x 3 tokens: 12 accumulators + 4 row vectors = the 16 ymm registers;
// the token vectors are folded into the FMAs as memory operands. Each k-step
// does 12 FMAs for 7 loads.
static void block_4x3(const float *w, int64_t K, const float *x, float *y, int64_t ldy, const float *bias) {
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a10 = a00, a11 = a00, a12 = a00;
    __m256 a20 = a00, a21 = a00, a22 = a00, a30 = a00, a31 = a00, a32 = a00;
    const float *w0 = w, *w1 = w + K, *w2 = w + 2 * K, *w3 = w + 3 * K;
    const float *x0 = x, *x1 = x + K, *x2 = x + 2 * K;
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 r0 = _mm256_loadu_ps(w0 + k), r1 = _mm256_loadu_ps(w1 + k);
        __m256 r2 = _mm256_loadu_ps(w2 + k), r3 = _mm256_loadu_ps(w3 + k);
        __m256 t = _mm256_loadu_ps(x0 + k);
        a00 = _mm256_fmadd_ps(r0, t, a00);
        a10 = _mm256_fmadd_ps(r1, t, a10);
        a20 = _mm256_fmadd_ps(r2, t, a20);
        a30 = _mm256_fmadd_ps(r3, t, a30);
        t = _mm256_loadu_ps(x1 + k);
        a01 = _mm256_fmadd_ps(r0, t, a01);
        a11 = _mm256_fmadd_ps(r1, t, a11);
        a21 = _mm256_fmadd_ps(r2, t, a21);
        a31 = _mm256_fmadd_ps(r3, t, a31);
        t = _mm256_loadu_ps(x2 + k);
        a02 = _mm256_fmadd_ps(r0, t, a02);
        a12 = _mm256_fmadd_ps(r1, t, a12);
        a22 = _mm256_fmadd_ps(r2, t, a22);
        a32 = _mm256_fmadd_ps(r3, t, a32);
    }
    float s[4][3] = {{hsum(a00), hsum(a01), hsum(a02)}, {hsum(a10), hsum(a11), hsum(a12)},
                     {hsum(a20), hsum(a21), hsum(a22)}, {hsum(a30), hsum(a31), hsum(a32)}};
    for (; k < K; k++)
        for (int r = 0; r < 4; r++)
            for (int t = 0; t < 3; t++) s[r][t] += w[r * K + k] * x[t * K + k];
    for (int t = 0; t < 3; t++)
        for (int r = 0; r < 4; r++) y[t * ldy + r] = s[r][t] + (bias ? bias[r] : 0.0f);
}

static float dot1(const float *a, const float *b, int64_t K) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 8), _mm256_loadu_ps(b + k + 8), acc1);
    }
    float s = hsum(_mm256_add_ps(acc0, acc1));
    for (; k < K; k++) s += a[k] * b[k];
    return s;
}

void nm_gemm_f32_avx2(const float *restrict w, int64_t R, const float *restrict x, int64_t T, int64_t K,
                      float *restrict y, int64_t ldy, const float *restrict bias) {
    int64_t r = 0;
    for (; r + 4 <= R; r += 4) {
        int64_t t = 0;
        for (; t + 3 <= T; t += 3) block_4x3(w + r * K, K, x + t * K, y + t * ldy + r, ldy, bias ? bias + r : NULL);
        for (; t < T; t++)
            for (int64_t i = r; i < r + 4; i++) y[t * ldy + i] = dot1(w + i * K, x + t * K, K) + (bias ? bias[i] : 0.0f);
    }
    for (; r < R; r++)
        for (int64_t t = 0; t < T; t++) y[t * ldy + r] = dot1(w + r * K, x + t * K, K) + (bias ? bias[r] : 0.0f);
}

// nm_expsum_ref's polynomial, 8 lanes at a time (x already shifted).
static inline __m256 exp256(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    const __m256 magic = _mm256_set1_ps(12582912.0f);
    const __m256 nn = _mm256_sub_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), magic), magic);
    const __m256 r = _mm256_fnmadd_ps(nn, _mm256_set1_ps(1.428606765330187e-6f),
                                      _mm256_fnmadd_ps(nn, _mm256_set1_ps(0.693145751953125f), x));
    __m256 p = _mm256_set1_ps(1.0f / 720);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(nn), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

static inline __m256 xsigmoid8(__m256 v, __m256 va, __m256 vb) {
    const __m256 z = _mm256_mul_ps(v, _mm256_fmadd_ps(_mm256_mul_ps(vb, v), v, va)); // v (a + b v^2)
    const __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), z));
    return _mm256_div_ps(v, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

// The tail goes through the same vector operations (zero-padded), so that an
// element's value does not depend on where a thread's range ends.
void nm_xsigmoid_avx2(const float *x, float *y, int64_t n, float a, float b) {
    const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, xsigmoid8(_mm256_loadu_ps(x + i), va, vb));
    if (i < n) {
        float t[8] = {0};
        memcpy(t, x + i, sizeof(float) * (size_t)(n - i));
        _mm256_storeu_ps(t, xsigmoid8(_mm256_loadu_ps(t), va, vb));
        memcpy(y + i, t, sizeof(float) * (size_t)(n - i));
    }
}

// nm_expsum_ref's polynomial, 8 lanes at a time.
float nm_expsum_avx2(float *s, int64_t n, float m) {
    const __m256 vm = _mm256_set1_ps(m);
    __m256 acc = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256 v = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
        _mm256_storeu_ps(s + j, v);
        acc = _mm256_add_ps(acc, v);
    }
    float sum = hsum(acc);
    if (j < n) sum += nm_expsum_ref(s + j, n - j, m);
    return sum;
}
