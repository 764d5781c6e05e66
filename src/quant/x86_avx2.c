// AVX2 + FMA + F16C kernels, compiled with -mavx2 -mfma -mf16c and chosen at
// run time by dispatch.c. Activations are f32 and sums are f32, so results
// match the reference up to summation order. NULL entries fall back to ref.
//
// Two ways to widen packed quants to 8 x int32 for the f32 FMAs:
//  - nibbles (q4_0, q4_1, q4_K): vpmovzxbd straight from memory puts byte j
//    in lane j; & 15 gives element j, >> 4 gives element j + 16 (or j + 32 in
//    q4_K). One shuffle per 16 elements, the rest is cheap integer ALU work.
//  - formats whose bits are spread over several arrays (q5_0, q6_K, mxfp4)
//    are first assembled as 32 signed bytes in element order with 256-bit
//    byte ops, then widened 8 at a time.
// Symmetric formats sum q*x per block and scale once; formats with a min use
// w = q*d + m per element (two FMAs), which keeps the accumulator chains short.
#include <immintrin.h>

#include "quant/kernels_impl.h"

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

static inline __m256i zx8(const uint8_t *p) { // 8 bytes -> 8 x u32
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}

// 32 int8 in element order -> 4 x 8 floats.
static inline void i8x32_to_ps(__m256i q, __m256 f[4]) {
    __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    f[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
    f[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(lo, lo)));
    f[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
    f[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(hi, hi)));
}

// sum_j q[j] * x[j] over 32 elements, as 8 partial lanes.
static inline __m256 dot_i8x32(__m256i q, const float *x) {
    __m256 f[4];
    i8x32_to_ps(q, f);
    __m256 s0 = _mm256_mul_ps(f[0], _mm256_loadu_ps(x));
    __m256 s1 = _mm256_mul_ps(f[1], _mm256_loadu_ps(x + 8));
    s0 = _mm256_fmadd_ps(f[2], _mm256_loadu_ps(x + 16), s0);
    s1 = _mm256_fmadd_ps(f[3], _mm256_loadu_ps(x + 24), s1);
    return _mm256_add_ps(s0, s1);
}

static inline void store_i8x32_scaled(__m256i q, float d, float *y) {
    __m256 f[4], dv = _mm256_set1_ps(d);
    i8x32_to_ps(q, f);
    for (int k = 0; k < 4; k++) _mm256_storeu_ps(y + 8 * k, _mm256_mul_ps(f[k], dv));
}

// ---- f32 / f16 / bf16 ------------------------------------------------------------

static float dot_f32(const void *restrict w, const float *restrict x, int64_t n) {
    const float *a = w;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(x + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(x + i + 8), acc1);
        acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(x + i + 16), acc2);
        acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(x + i + 24), acc3);
    }
    for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(x + i), acc0);
    float s = hsum(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
    for (; i < n; i++) s += a[i] * x[i];
    return s;
}

static inline __m256 load_f16x8(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline __m256 load_bf16x8(const uint16_t *p) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

#define HALF_DOT(name, load8, scalar)                                                            \
    static float name(const void *restrict w, const float *restrict x, int64_t n) {              \
        const uint16_t *a = w;                                                                   \
        __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;                \
        int64_t i = 0;                                                                           \
        for (; i + 32 <= n; i += 32) {                                                           \
            acc0 = _mm256_fmadd_ps(load8(a + i), _mm256_loadu_ps(x + i), acc0);                  \
            acc1 = _mm256_fmadd_ps(load8(a + i + 8), _mm256_loadu_ps(x + i + 8), acc1);          \
            acc2 = _mm256_fmadd_ps(load8(a + i + 16), _mm256_loadu_ps(x + i + 16), acc2);        \
            acc3 = _mm256_fmadd_ps(load8(a + i + 24), _mm256_loadu_ps(x + i + 24), acc3);        \
        }                                                                                        \
        for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(load8(a + i), _mm256_loadu_ps(x + i), acc0); \
        float s = hsum(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));     \
        for (; i < n; i++) s += scalar(a[i]) * x[i];                                             \
        return s;                                                                                \
    }                                                                                            \
    static void name##_dequant(const void *restrict src, float *restrict y, int64_t n) {         \
        const uint16_t *a = src;                                                                 \
        int64_t i = 0;                                                                           \
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, load8(a + i));                        \
        for (; i < n; i++) y[i] = scalar(a[i]);                                                  \
    }
HALF_DOT(dot_f16, load_f16x8, nm_half_to_float)
HALF_DOT(dot_bf16, load_bf16x8, nm_bf16_to_fp32)
#undef HALF_DOT

// ---- q8_0 ----------------------------------------------------------------------------

static inline __m256 sx8(const int8_t *p) { // 8 int8 -> 8 floats
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

static inline __m256 q8_0_bsum(const nm_block_q8_0 *b, const float *x) {
    __m256 s0 = _mm256_mul_ps(sx8(b->qs), _mm256_loadu_ps(x));
    __m256 s1 = _mm256_mul_ps(sx8(b->qs + 8), _mm256_loadu_ps(x + 8));
    s0 = _mm256_fmadd_ps(sx8(b->qs + 16), _mm256_loadu_ps(x + 16), s0);
    s1 = _mm256_fmadd_ps(sx8(b->qs + 24), _mm256_loadu_ps(x + 24), s1);
    return _mm256_add_ps(s0, s1);
}

// Two accumulators over alternate blocks so consecutive blocks don't wait on
// each other's scale FMA.
#define BLOCK_DOT_LOOP(btype, bsum, dexpr)                                                          \
    const btype *b = w;                                                                             \
    const int64_t nb = n / NM_QK;                                                                   \
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();                                  \
    int64_t i = 0;                                                                                  \
    for (; i + 1 < nb; i += 2) {                                                                    \
        const btype *b0 = b + i, *b1 = b + i + 1;                                                   \
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(dexpr(b0)), bsum(b0, x + i * NM_QK), acc0);           \
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(dexpr(b1)), bsum(b1, x + (i + 1) * NM_QK), acc1);     \
    }                                                                                               \
    if (i < nb) acc0 = _mm256_fmadd_ps(_mm256_set1_ps(dexpr((b + i))), bsum((b + i), x + i * NM_QK), acc0); \
    return hsum(_mm256_add_ps(acc0, acc1));

#define D_HALF(p) h2f((p)->d)

static float dot_q8_0(const void *restrict w, const float *restrict x, int64_t n) {
    BLOCK_DOT_LOOP(nm_block_q8_0, q8_0_bsum, D_HALF)
}

static void dequant_q8_0(const void *restrict src, float *restrict y, int64_t n) {
    const nm_block_q8_0 *b = src;
    for (int64_t i = 0; i < n / NM_QK; i++, y += NM_QK) {
        __m256 d = _mm256_set1_ps(h2f(b[i].d));
        for (int k = 0; k < 4; k++) _mm256_storeu_ps(y + 8 * k, _mm256_mul_ps(sx8(b[i].qs + 8 * k), d));
    }
}

// ---- q4_0 / q4_1 -----------------------------------------------------------------------

// Elements 0..7, 8..15, 16..23, 24..31 of a 16-byte nibble block as u32.
static inline void nib32(const uint8_t *qs, __m256i q[4]) {
    const __m256i m4 = _mm256_set1_epi32(15);
    __m256i a = zx8(qs), c = zx8(qs + 8);
    q[0] = _mm256_and_si256(a, m4);
    q[1] = _mm256_and_si256(c, m4);
    q[2] = _mm256_srli_epi32(a, 4);
    q[3] = _mm256_srli_epi32(c, 4);
}

static inline __m256 q4_0_bsum(const nm_block_q4_0 *b, const float *x) {
    const __m256i off = _mm256_set1_epi32(8);
    __m256i q[4];
    nib32(b->qs, q);
    __m256 s0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q[0], off)), _mm256_loadu_ps(x));
    __m256 s1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q[1], off)), _mm256_loadu_ps(x + 8));
    s0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q[2], off)), _mm256_loadu_ps(x + 16), s0);
    s1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q[3], off)), _mm256_loadu_ps(x + 24), s1);
    return _mm256_add_ps(s0, s1);
}

static float dot_q4_0(const void *restrict w, const float *restrict x, int64_t n) {
    BLOCK_DOT_LOOP(nm_block_q4_0, q4_0_bsum, D_HALF)
}

static void dequant_q4_0(const void *restrict src, float *restrict y, int64_t n) {
    const nm_block_q4_0 *b = src;
    const __m256i off = _mm256_set1_epi32(8);
    for (int64_t i = 0; i < n / NM_QK; i++, y += NM_QK) {
        __m256 d = _mm256_set1_ps(h2f(b[i].d));
        __m256i q[4];
        nib32(b[i].qs, q);
        for (int k = 0; k < 4; k++)
            _mm256_storeu_ps(y + 8 * k, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q[k], off)), d));
    }
}

// w*x = d*q*x + m*x: sum q*x and x per block, scale each once.
static float dot_q4_1(const void *restrict w, const float *restrict x, int64_t n) {
    const nm_block_q4_1 *b = w;
    __m256 accd = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / NM_QK; i++, x += NM_QK) {
        __m256i q[4];
        nib32(b[i].qs, q);
        __m256 x0 = _mm256_loadu_ps(x), x1 = _mm256_loadu_ps(x + 8);
        __m256 x2 = _mm256_loadu_ps(x + 16), x3 = _mm256_loadu_ps(x + 24);
        __m256 s0 = _mm256_mul_ps(_mm256_cvtepi32_ps(q[0]), x0);
        __m256 s1 = _mm256_mul_ps(_mm256_cvtepi32_ps(q[1]), x1);
        s0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q[2]), x2, s0);
        s1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q[3]), x3, s1);
        __m256 sx = _mm256_add_ps(_mm256_add_ps(x0, x1), _mm256_add_ps(x2, x3));
        accd = _mm256_fmadd_ps(_mm256_set1_ps(h2f(b[i].d)), _mm256_add_ps(s0, s1), accd);
        accm = _mm256_fmadd_ps(_mm256_set1_ps(h2f(b[i].m)), sx, accm);
    }
    return hsum(_mm256_add_ps(accd, accm));
}

static void dequant_q4_1(const void *restrict src, float *restrict y, int64_t n) {
    const nm_block_q4_1 *b = src;
    for (int64_t i = 0; i < n / NM_QK; i++, y += NM_QK) {
        __m256 d = _mm256_set1_ps(h2f(b[i].d)), m = _mm256_set1_ps(h2f(b[i].m));
        __m256i q[4];
        nib32(b[i].qs, q);
        for (int k = 0; k < 4; k++) _mm256_storeu_ps(y + 8 * k, _mm256_fmadd_ps(_mm256_cvtepi32_ps(q[k]), d, m));
    }
}

// ---- q5_0 ------------------------------------------------------------------------------

// Byte j = 0xff where bit j of qh is set.
static inline __m256i bits_to_bytes(uint32_t qh) {
    const __m256i pick = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    const __m256i notbit = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe); // ~(1 << (j % 8))
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), pick);
    return _mm256_cmpeq_epi8(_mm256_or_si256(v, notbit), _mm256_set1_epi64x(-1));
}

// 16 nibble bytes -> 32 bytes in element order (low nibbles, then high).
static inline __m256i nib_bytes(const uint8_t *qs) {
    const __m128i m4 = _mm_set1_epi8(15);
    __m128i v = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4));
}

static inline __m256i q5_0_bytes(const nm_block_q5_0 *b) {
    uint32_t qh;
    memcpy(&qh, b->qh, 4);
    // q - 16 is the nibble where the 5th bit is set, and nibble | 0xf0
    // (nibble - 16 as int8) where it is clear.
    __m256i clear = _mm256_andnot_si256(bits_to_bytes(qh), _mm256_set1_epi8((char)0xf0));
    return _mm256_or_si256(nib_bytes(b->qs), clear);
}

static inline __m256 q5_0_bsum(const nm_block_q5_0 *b, const float *x) { return dot_i8x32(q5_0_bytes(b), x); }

static float dot_q5_0(const void *restrict w, const float *restrict x, int64_t n) {
    BLOCK_DOT_LOOP(nm_block_q5_0, q5_0_bsum, D_HALF)
}

static void dequant_q5_0(const void *restrict src, float *restrict y, int64_t n) {
    const nm_block_q5_0 *b = src;
    for (int64_t i = 0; i < n / NM_QK; i++, y += NM_QK) store_i8x32_scaled(q5_0_bytes(&b[i]), h2f(b[i].d), y);
}

// ---- mxfp4 -------------------------------------------------------------------------------

static inline __m256i mxfp4_bytes(const nm_block_mxfp4 *b) {
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)nm_kvalues_mxfp4));
    return _mm256_shuffle_epi8(table, nib_bytes(b->qs));
}

static inline __m256 mxfp4_bsum(const nm_block_mxfp4 *b, const float *x) { return dot_i8x32(mxfp4_bytes(b), x); }
#define D_E8M0(p) nm_e8m0_to_fp32_half((p)->e)

static float dot_mxfp4(const void *restrict w, const float *restrict x, int64_t n) {
    BLOCK_DOT_LOOP(nm_block_mxfp4, mxfp4_bsum, D_E8M0)
}

static void dequant_mxfp4(const void *restrict src, float *restrict y, int64_t n) {
    const nm_block_mxfp4 *b = src;
    for (int64_t i = 0; i < n / NM_QK; i++, y += NM_QK)
        store_i8x32_scaled(mxfp4_bytes(&b[i]), nm_e8m0_to_fp32_half(b[i].e), y);
}

// ---- q4_K --------------------------------------------------------------------------------

static inline void q4_K_scales(const nm_block_q4_K *b, float dsc[8], float dm[8]) {
    float d = h2f(b->d), dmin = h2f(b->dmin);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        nm_get_scale_min_k4(j, b->scales, &sc, &m);
        dsc[j] = d * sc;
        dm[j] = -dmin * m;
    }
}

// Chunk c of 64 elements: byte l of qs[32c..] holds element 64c+l (low) and
// 64c+32+l (high), with sub-block scales 2c and 2c+1. w = q*d*sc - dmin*m.
static float dot_q4_K(const void *restrict w, const float *restrict x, int64_t n) {
    const nm_block_q4_K *b = w;
    const __m256i m4 = _mm256_set1_epi32(15);
    // Four chains: low/high nibble x even/odd 8-group.
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    for (int64_t i = 0; i < n / NM_QK_K; i++, x += NM_QK_K) {
        float dsc[8], dm[8];
        q4_K_scales(&b[i], dsc, dm);
        for (int c = 0; c < 4; c++) {
            const uint8_t *q = b[i].qs + 32 * c;
            const float *xc = x + 64 * c;
            __m256 da = _mm256_set1_ps(dsc[2 * c]), ma = _mm256_set1_ps(dm[2 * c]);
            __m256 db = _mm256_set1_ps(dsc[2 * c + 1]), mb = _mm256_set1_ps(dm[2 * c + 1]);
            for (int k = 0; k < 4; k += 2) {
                __m256i a0 = zx8(q + 8 * k), a1 = zx8(q + 8 * k + 8);
                __m256 wa0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(a0, m4)), da, ma);
                __m256 wa1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(a1, m4)), da, ma);
                __m256 wb0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(a0, 4)), db, mb);
                __m256 wb1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(a1, 4)), db, mb);
                acc0 = _mm256_fmadd_ps(wa0, _mm256_loadu_ps(xc + 8 * k), acc0);
                acc1 = _mm256_fmadd_ps(wa1, _mm256_loadu_ps(xc + 8 * k + 8), acc1);
                acc2 = _mm256_fmadd_ps(wb0, _mm256_loadu_ps(xc + 32 + 8 * k), acc2);
                acc3 = _mm256_fmadd_ps(wb1, _mm256_loadu_ps(xc + 32 + 8 * k + 8), acc3);
            }
        }
    }
    return hsum(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
}

static void dequant_q4_K(const void *restrict src, float *restrict y, int64_t n) {
    const nm_block_q4_K *b = src;
    const __m256i m4 = _mm256_set1_epi32(15);
    for (int64_t i = 0; i < n / NM_QK_K; i++, y += NM_QK_K) {
        float dsc[8], dm[8];
        q4_K_scales(&b[i], dsc, dm);
        for (int c = 0; c < 4; c++) {
            __m256 da = _mm256_set1_ps(dsc[2 * c]), ma = _mm256_set1_ps(dm[2 * c]);
            __m256 db = _mm256_set1_ps(dsc[2 * c + 1]), mb = _mm256_set1_ps(dm[2 * c + 1]);
            for (int k = 0; k < 4; k++) {
                __m256i a = zx8(b[i].qs + 32 * c + 8 * k);
                _mm256_storeu_ps(y + 64 * c + 8 * k,
                                 _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(a, m4)), da, ma));
                _mm256_storeu_ps(y + 64 * c + 32 + 8 * k,
                                 _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(a, 4)), db, mb));
            }
        }
    }
}

// ---- q6_K --------------------------------------------------------------------------------

// Elements 128h + 32k + l (l = 0..31) as 32 int8 values q - 32, from the
// 32-byte rows A = ql[64h..], B = ql[64h+32..] and H = qh[32h..].
static inline __m256i q6_bytes(__m256i A, __m256i B, __m256i H, int k) {
    const __m256i m4 = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30), off = _mm256_set1_epi8(32);
    __m256i lo, hi;
    switch (k) { // 16-bit shifts are fine: the masks drop bits crossing bytes
    case 0: lo = _mm256_and_si256(A, m4); hi = _mm256_and_si256(_mm256_slli_epi16(H, 4), m30); break;
    case 1: lo = _mm256_and_si256(B, m4); hi = _mm256_and_si256(_mm256_slli_epi16(H, 2), m30); break;
    case 2: lo = _mm256_and_si256(_mm256_srli_epi16(A, 4), m4); hi = _mm256_and_si256(H, m30); break;
    default: lo = _mm256_and_si256(_mm256_srli_epi16(B, 4), m4); hi = _mm256_and_si256(_mm256_srli_epi16(H, 2), m30); break;
    }
    return _mm256_sub_epi8(_mm256_or_si256(lo, hi), off);
}

static float dot_q6_K(const void *restrict w, const float *restrict x, int64_t n) {
    const nm_block_q6_K *b = w;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / NM_QK_K; i++, x += NM_QK_K) {
        const float d = h2f(b[i].d);
        for (int h = 0; h < 2; h++) {
            __m256i A = _mm256_loadu_si256((const __m256i *)(b[i].ql + 64 * h));
            __m256i B = _mm256_loadu_si256((const __m256i *)(b[i].ql + 64 * h + 32));
            __m256i H = _mm256_loadu_si256((const __m256i *)(b[i].qh + 32 * h));
            for (int k = 0; k < 4; k++) {
                const float *xk = x + 128 * h + 32 * k;
                const int g = 8 * h + 2 * k; // 16-element groups g, g+1
                __m256 f[4];
                i8x32_to_ps(q6_bytes(A, B, H, k), f);
                __m256 sa = _mm256_fmadd_ps(f[1], _mm256_loadu_ps(xk + 8), _mm256_mul_ps(f[0], _mm256_loadu_ps(xk)));
                __m256 sb = _mm256_fmadd_ps(f[3], _mm256_loadu_ps(xk + 24), _mm256_mul_ps(f[2], _mm256_loadu_ps(xk + 16)));
                acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d * b[i].scales[g]), sa, acc0);
                acc1 = _mm256_fmadd_ps(_mm256_set1_ps(d * b[i].scales[g + 1]), sb, acc1);
            }
        }
    }
    return hsum(_mm256_add_ps(acc0, acc1));
}

static void dequant_q6_K(const void *restrict src, float *restrict y, int64_t n) {
    const nm_block_q6_K *b = src;
    for (int64_t i = 0; i < n / NM_QK_K; i++, y += NM_QK_K) {
        const float d = h2f(b[i].d);
        for (int h = 0; h < 2; h++) {
            __m256i A = _mm256_loadu_si256((const __m256i *)(b[i].ql + 64 * h));
            __m256i B = _mm256_loadu_si256((const __m256i *)(b[i].ql + 64 * h + 32));
            __m256i H = _mm256_loadu_si256((const __m256i *)(b[i].qh + 32 * h));
            for (int k = 0; k < 4; k++) {
                float *yk = y + 128 * h + 32 * k;
                const int g = 8 * h + 2 * k;
                __m256 f[4];
                i8x32_to_ps(q6_bytes(A, B, H, k), f);
                __m256 da = _mm256_set1_ps(d * b[i].scales[g]), db = _mm256_set1_ps(d * b[i].scales[g + 1]);
                _mm256_storeu_ps(yk, _mm256_mul_ps(f[0], da));
                _mm256_storeu_ps(yk + 8, _mm256_mul_ps(f[1], da));
                _mm256_storeu_ps(yk + 16, _mm256_mul_ps(f[2], db));
                _mm256_storeu_ps(yk + 24, _mm256_mul_ps(f[3], db));
            }
        }
    }
}

static void dequant_f32(const void *restrict src, float *restrict y, int64_t n) {
    memcpy(y, src, (size_t)n * sizeof(float));
}

static float dotq_f32(const void *restrict w, const void *restrict xq, int64_t n) { return dot_f32(w, xq, n); }

static const nm_kernels avx2_table = {
    .name = "avx2",
    .dot =
        {
            [NM_TYPE_F32] = dot_f32,
            [NM_TYPE_F16] = dot_f16,
            [NM_TYPE_BF16] = dot_bf16,
            [NM_TYPE_Q8_0] = dot_q8_0,
            [NM_TYPE_Q4_0] = dot_q4_0,
            [NM_TYPE_Q4_1] = dot_q4_1,
            [NM_TYPE_Q5_0] = dot_q5_0,
            [NM_TYPE_MXFP4] = dot_mxfp4,
            [NM_TYPE_Q4_K] = dot_q4_K,
            [NM_TYPE_Q6_K] = dot_q6_K,
        },
    .dequant =
        {
            [NM_TYPE_F32] = dequant_f32,
            [NM_TYPE_F16] = dot_f16_dequant,
            [NM_TYPE_BF16] = dot_bf16_dequant,
            [NM_TYPE_Q8_0] = dequant_q8_0,
            [NM_TYPE_Q4_0] = dequant_q4_0,
            [NM_TYPE_Q4_1] = dequant_q4_1,
            [NM_TYPE_Q5_0] = dequant_q5_0,
            [NM_TYPE_MXFP4] = dequant_mxfp4,
            [NM_TYPE_Q4_K] = dequant_q4_K,
            [NM_TYPE_Q6_K] = dequant_q6_K,
        },
    .dotq =
        {
            [NM_TYPE_F32] = dotq_f32,
            [NM_TYPE_F16] = nm_dotq_f16_avx2,
            [NM_TYPE_BF16] = nm_dotq_bf16_avx2,
            [NM_TYPE_Q4_0] = nm_dotq_q4_0_avx2,
            [NM_TYPE_Q4_1] = nm_dotq_q4_1_avx2,
            [NM_TYPE_Q5_0] = nm_dotq_q5_0_avx2,
            [NM_TYPE_Q5_1] = nm_dotq_q5_1_avx2,
            [NM_TYPE_Q8_0] = nm_dotq_q8_0_avx2,
            [NM_TYPE_Q8_1] = nm_dotq_q8_1_avx2,
            [NM_TYPE_Q8_K] = nm_dotq_q8_K_avx2,
            [NM_TYPE_Q2_K] = nm_dotq_q2_K_avx2,
            [NM_TYPE_Q3_K] = nm_dotq_q3_K_avx2,
            [NM_TYPE_MXFP4] = nm_dotq_mxfp4_avx2,
            [NM_TYPE_Q4_K] = nm_dotq_q4_K_avx2,
            [NM_TYPE_Q5_K] = nm_dotq_q5_K_avx2,
            [NM_TYPE_Q6_K] = nm_dotq_q6_K_avx2,
        },
    .gemmq =
        {
            [NM_TYPE_Q4_0] = nm_gemmq_q4_0_avx2,
            [NM_TYPE_Q4_1] = nm_gemmq_q4_1_avx2,
            [NM_TYPE_Q5_0] = nm_gemmq_q5_0_avx2,
            [NM_TYPE_Q5_1] = nm_gemmq_q5_1_avx2,
            [NM_TYPE_Q8_0] = nm_gemmq_q8_0_avx2,
            [NM_TYPE_MXFP4] = nm_gemmq_mxfp4_avx2,
            [NM_TYPE_Q4_K] = nm_gemmq_q4_K_avx2,
            [NM_TYPE_Q6_K] = nm_gemmq_q6_K_avx2,
        },
    .quant_act =
        {
            [NM_TYPE_F32] = nm_quant_act_f32_avx2,
            [NM_TYPE_F16] = nm_quant_act_f16_avx2,
            [NM_TYPE_BF16] = nm_quant_act_bf16_avx2,
            [NM_TYPE_Q8_0] = nm_quant_act_q8_0_avx2,
            [NM_TYPE_Q8_1] = nm_quant_act_q8_1_avx2,
            [NM_TYPE_Q8_K] = nm_quant_act_q8_K_avx2,
        },
};

const nm_kernels *nm_kernels_avx2(void) {
    nm_f16_table_init(); // for the block dots of x86_dotq_blocks.h
    return &avx2_table;
}
