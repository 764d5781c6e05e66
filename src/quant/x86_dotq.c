// AVX2 (+FMA, F16C) kernels of the quantized-activation path: the activation
// quantizers and the integer weight . activation dots. Compiled with -mavx2
// -mfma -mf16c like x86_avx2.c, whose table lists them (types without an entry
// fall back to ref). The ref (ref_dotq.c) is the spec.
//
// Dots: per block, an exact int32 sum with vpmaddubsw (u8 x i8 -> i16 pairs)
// and vpmaddwd (-> i32), then one f32 FMA per block. vpmaddubsw saturates
// at int16, which no operand range here can reach: |pair| <= 2 * 128 * 127
// for the signed-times-signed trick below, 2 * 63 * 127 for unsigned quants.
// Results equal the ref up to the order of the f32 sums.
//
// Quantizers: bit-identical to the ref, which is llama.cpp's x86 numerics.
#include <immintrin.h>

#include "quant/kernels_impl.h"

static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline float hmax_ps(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}
static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

static inline __m256i load256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

// sum of u8 a[i] * i8 b[i] as 8 x i32 (four products per lane).
static inline __m256i dot_u8i8(__m256i a, __m256i b) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1));
}
// i8 x i8: move a's sign onto b so that the u8 operand is |a|.
static inline __m256i dot_i8i8(__m256i a, __m256i b) {
    return dot_u8i8(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
}

// 16 nibble bytes -> 32 bytes in element order: low nibbles are elements
// 0..15, high nibbles 16..31.
static inline __m256i nibbles32(const uint8_t *qs) {
    __m128i v = _mm_loadu_si128((const __m128i *)qs);
    __m256i r = _mm256_set_m128i(_mm_srli_epi16(v, 4), v);
    return _mm256_and_si256(r, _mm256_set1_epi8(15));
}

// Byte j = 0xff where bit j of qh is set.
static inline __m256i bits32(uint32_t qh) {
    const __m256i pick = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), pick);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

// ---- activation quantizers ----------------------------------------------------------

void nm_quant_act_f32_avx2(const float *restrict x, void *restrict xq, int64_t n) {
    memcpy(xq, x, (size_t)n * sizeof(float));
}

void nm_quant_act_f16_avx2(const float *restrict x, void *restrict xq, int64_t n) {
    uint16_t *h = xq;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(h + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) h[i] = nm_fp32_to_fp16(x[i]);
}

// Round to nearest even on the bits; NaN keeps its top bits and is made quiet.
void nm_quant_act_bf16_avx2(const float *restrict x, void *restrict xq, int64_t n) {
    uint16_t *h = xq;
    const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
    const __m256i absm = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i r[2];
        for (int k = 0; k < 2; k++) {
            __m256i u = _mm256_castps_si256(_mm256_loadu_ps(x + i + 8 * k));
            __m256i rn = _mm256_add_epi32(_mm256_add_epi32(u, bias), _mm256_and_si256(_mm256_srli_epi32(u, 16), one));
            __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, absm), inf);
            __m256i qn = _mm256_or_si256(u, _mm256_set1_epi32(0x400000));
            r[k] = _mm256_srli_epi32(_mm256_blendv_epi8(rn, qn, nan), 16);
        }
        // packus works per 128-bit lane: fix the order with a 64-bit permute.
        __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r[0], r[1]), _MM_SHUFFLE(3, 1, 2, 0));
        _mm256_storeu_si256((__m256i *)(h + i), p);
    }
    for (; i < n; i++) h[i] = nm_fp32_to_bf16(x[i]);
}

// One q8_0/q8_1 block: id = 127/amax, round half to even, vcvtps2dq, saturate
// by packing. Returns d; *sum = wrapping i32 sum of the unsaturated quants.
static inline float quant_act_q8_block(const float *x, int8_t *qs, int32_t *sum) {
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 v[4], m = _mm256_setzero_ps();
    for (int k = 0; k < 4; k++) {
        v[k] = _mm256_loadu_ps(x + 8 * k);
        m = _mm256_max_ps(_mm256_and_ps(v[k], absm), m); // NaN in x: keeps m, as fmaxf does
    }
    const float amax = hmax_ps(m);
    const float d = amax / 127.f;
    const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.f / amax : 0.0f);
    __m256i q[4];
    for (int k = 0; k < 4; k++)
        q[k] = _mm256_cvtps_epi32(
            _mm256_round_ps(_mm256_mul_ps(v[k], id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    __m256i s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(1, 0, 3, 2)));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(2, 3, 0, 1)));
    *sum = _mm_cvtsi128_si32(s4);
    // packs interleave the 128-bit lanes: 0-3 8-11 16-19 24-27 | 4-7 12-15 20-23 28-31
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)qs, p);
    return d;
}

void nm_quant_act_q8_0_avx2(const float *restrict x, void *restrict xq, int64_t n) {
    nm_block_q8_0 *b = xq;
    for (int64_t i = 0; i < n / NM_QK; i++, x += NM_QK) {
        int32_t sum;
        b[i].d = _cvtss_sh(quant_act_q8_block(x, b[i].qs, &sum), _MM_FROUND_TO_NEAREST_INT);
    }
}

void nm_quant_act_q8_1_avx2(const float *restrict x, void *restrict xq, int64_t n) {
    nm_block_q8_1 *b = xq;
    for (int64_t i = 0; i < n / NM_QK; i++, x += NM_QK) {
        int32_t sum;
        float d = quant_act_q8_block(x, b[i].qs, &sum);
        b[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        b[i].s = _cvtss_sh(d * (float)sum, _MM_FROUND_TO_NEAREST_INT);
    }
}

// quantize_row_q8_K_ref: the first element of largest |x| maps to -127
// exactly; vcvtps2dq rounds half to even like nearest_int.
void nm_quant_act_q8_K_avx2(const float *restrict x, void *restrict xq, int64_t n) {
    nm_block_q8_K *b = xq;
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int64_t i = 0; i < n / NM_QK_K; i++, x += NM_QK_K) {
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < NM_QK_K; j += 8) m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + j), absm), m);
        const float amax = hmax_ps(m);
        if (!amax) {
            memset(&b[i], 0, sizeof b[i]);
            continue;
        }
        const __m256 am = _mm256_set1_ps(amax);
        float max = 0;
        for (int j = 0; j < NM_QK_K; j += 8) {
            int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(_mm256_loadu_ps(x + j), absm), am, _CMP_EQ_OQ));
            if (hit) {
                max = x[j + __builtin_ctz((unsigned)hit)];
                break;
            }
        }
        const float iscale = -127.f / max;
        const __m256 is = _mm256_set1_ps(iscale);
        const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7), bias = _mm256_set1_epi8((char)0x80);
        for (int j = 0; j < NM_QK_K; j += 32) {
            __m256i q[4];
            for (int k = 0; k < 4; k++) q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j + 8 * k), is));
            __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            p = _mm256_permutevar8x32_epi32(p, perm);
            _mm256_storeu_si256((__m256i *)(b[i].qs + j), p);
            // bsums: sum of (q + 128) over 8 bytes by vpsadbw, pairs added, minus 16 * 128.
            __m256i sad = _mm256_sad_epu8(_mm256_xor_si256(p, bias), _mm256_setzero_si256());
            sad = _mm256_add_epi64(sad, _mm256_shuffle_epi32(sad, _MM_SHUFFLE(1, 0, 3, 2)));
            b[i].bsums[j / 16] = (int16_t)(_mm256_extract_epi32(sad, 0) - 2048);
            b[i].bsums[j / 16 + 1] = (int16_t)(_mm256_extract_epi32(sad, 4) - 2048);
        }
        b[i].d = 1 / iscale;
    }
}

// ---- 32-element blocks . q8_0 / q8_1 -------------------------------------------------
// Two f32 accumulators over alternate blocks to keep two FMA chains in flight.

#define DOTQ_BLOCK_LOOP(wtype, ytype, ...)                                           \
    const wtype *x = w;                                                              \
    const ytype *y = xq;                                                             \
    const int64_t nb = n / NM_QK;                                                    \
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();                   \
    int64_t i = 0;                                                                   \
    for (; i + 1 < nb; i += 2) {                                                     \
        { const wtype *xb = x + i; const ytype *yb = y + i; __m256 *acc = &acc0; __VA_ARGS__ } \
        { const wtype *xb = x + i + 1; const ytype *yb = y + i + 1; __m256 *acc = &acc1; __VA_ARGS__ } \
    }                                                                                \
    if (i < nb) { const wtype *xb = x + i; const ytype *yb = y + i; __m256 *acc = &acc0; __VA_ARGS__ }

float nm_dotq_q8_0_avx2(const void *restrict w, const void *restrict xq, int64_t n) {
    DOTQ_BLOCK_LOOP(nm_block_q8_0, nm_block_q8_0, {
        __m256i p = dot_i8i8(load256(xb->qs), load256(yb->qs));
        *acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(xb->d) * h2f(yb->d)), _mm256_cvtepi32_ps(p), *acc);
    })
    return hsum_ps(_mm256_add_ps(acc0, acc1));
}

// q4_0: nibble - 8 as int8, then the signed dot.
float nm_dotq_q4_0_avx2(const void *restrict w, const void *restrict xq, int64_t n) {
    const __m256i off = _mm256_set1_epi8(8);
    DOTQ_BLOCK_LOOP(nm_block_q4_0, nm_block_q8_0, {
        __m256i qy = load256(yb->qs);
        __m256i p = dot_i8i8(_mm256_sub_epi8(nibbles32(xb->qs), off), qy);
        *acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(xb->d) * h2f(yb->d)), _mm256_cvtepi32_ps(p), *acc);
    })
    return hsum_ps(_mm256_add_ps(acc0, acc1));
}

// q4_1: d_w d_x sum(q q8) + m_w s_x; the min terms summed in scalar.
float nm_dotq_q4_1_avx2(const void *restrict w, const void *restrict xq, int64_t n) {
    float summs = 0;
    DOTQ_BLOCK_LOOP(nm_block_q4_1, nm_block_q8_1, {
        __m256i p = dot_u8i8(nibbles32(xb->qs), load256(yb->qs));
        *acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(xb->d) * h2f(yb->d)), _mm256_cvtepi32_ps(p), *acc);
        summs += h2f(xb->m) * h2f(yb->s);
    })
    return hsum_ps(_mm256_add_ps(acc0, acc1)) + summs;
}

// q5_0: q - 16 is the nibble where the 5th bit is set and nibble | 0xf0
// (nibble - 16 as int8) where it is clear.
float nm_dotq_q5_0_avx2(const void *restrict w, const void *restrict xq, int64_t n) {
    const __m256i hi = _mm256_set1_epi8((char)0xf0);
    DOTQ_BLOCK_LOOP(nm_block_q5_0, nm_block_q8_0, {
        uint32_t qh;
        memcpy(&qh, xb->qh, 4);
        __m256i q = _mm256_or_si256(nibbles32(xb->qs), _mm256_andnot_si256(bits32(qh), hi));
        __m256i p = dot_i8i8(q, load256(yb->qs));
        *acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(xb->d) * h2f(yb->d)), _mm256_cvtepi32_ps(p), *acc);
    })
    return hsum_ps(_mm256_add_ps(acc0, acc1));
}

// q5_1: unsigned 5-bit quants, min term as in q4_1.
float nm_dotq_q5_1_avx2(const void *restrict w, const void *restrict xq, int64_t n) {
    const __m256i b4 = _mm256_set1_epi8(0x10);
    float summs = 0;
    DOTQ_BLOCK_LOOP(nm_block_q5_1, nm_block_q8_1, {
        uint32_t qh;
        memcpy(&qh, xb->qh, 4);
        __m256i q = _mm256_or_si256(nibbles32(xb->qs), _mm256_and_si256(bits32(qh), b4));
        __m256i p = dot_u8i8(q, load256(yb->qs));
        *acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(xb->d) * h2f(yb->d)), _mm256_cvtepi32_ps(p), *acc);
        summs += h2f(xb->m) * h2f(yb->s);
    })
    return hsum_ps(_mm256_add_ps(acc0, acc1)) + summs;
}

// mxfp4: the nibbles index the doubled E2M1 values (int8) with vpshufb.
float nm_dotq_mxfp4_avx2(const void *restrict w, const void *restrict xq, int64_t n) {
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)nm_kvalues_mxfp4));
    DOTQ_BLOCK_LOOP(nm_block_mxfp4, nm_block_q8_0, {
        __m256i q = _mm256_shuffle_epi8(table, nibbles32(xb->qs));
        __m256i p = dot_i8i8(q, load256(yb->qs));
        *acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(yb->d) * nm_e8m0_to_fp32_half(xb->e)), _mm256_cvtepi32_ps(p), *acc);
    })
    return hsum_ps(_mm256_add_ps(acc0, acc1));
}

// ---- K formats . q8_K ------------------------------------------------------------------
// A whole super-block sums in int32 (|q6 - 32| * 127 * 128 * 256 < 2^31), then
// one FMA with d_w * d_x; min terms come from the q8_K bsums.

// The 8 scales and 8 mins of a Q4_K/Q5_K super-block, and sum_j m_j * (sum of
// the q8 of sub-block j) from the bsums.
static inline int qk_sm_scales(const uint8_t *s12, const int16_t *bsums, uint8_t sc[8]) {
    int summs = 0;
    for (int j = 0; j < 8; j++) {
        uint8_t m;
        nm_get_scale_min_k4(j, s12, &sc[j], &m);
        summs += m * (bsums[2 * j] + bsums[2 * j + 1]);
    }
    return summs;
}

float nm_dotq_q4_K_avx2(const void *restrict w, const void *restrict xq, int64_t n) {
    const nm_block_q4_K *x = w;
    const nm_block_q8_K *y = xq;
    const __m256i m4 = _mm256_set1_epi8(15);
    __m256 acc = _mm256_setzero_ps();
    float accm = 0;
    for (int64_t i = 0; i < n / NM_QK_K; i++) {
        uint8_t sc[8];
        const int summs = qk_sm_scales(x[i].scales, y[i].bsums, sc);
        __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) { // 64 elements: low nibbles sub-block 2c, high 2c+1
            __m256i q4 = load256(x[i].qs + 32 * c);
            __m256i pl = _mm256_maddubs_epi16(_mm256_and_si256(q4, m4), load256(y[i].qs + 64 * c));
            __m256i qhi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
            __m256i ph = _mm256_maddubs_epi16(qhi, load256(y[i].qs + 64 * c + 32));
            s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(pl, _mm256_set1_epi16(sc[2 * c])));
            s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(ph, _mm256_set1_epi16(sc[2 * c + 1])));
        }
        const float d = h2f(x[i].d) * y[i].d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1)), acc);
        accm += h2f(x[i].dmin) * y[i].d * (float)summs;
    }
    return hsum_ps(acc) - accm;
}

float nm_dotq_q5_K_avx2(const void *restrict w, const void *restrict xq, int64_t n) {
    const nm_block_q5_K *x = w;
    const nm_block_q8_K *y = xq;
    const __m256i m4 = _mm256_set1_epi8(15), b4 = _mm256_set1_epi8(0x10);
    __m256 acc = _mm256_setzero_ps();
    float accm = 0;
    for (int64_t i = 0; i < n / NM_QK_K; i++) {
        uint8_t sc[8];
        const int summs = qk_sm_scales(x[i].scales, y[i].bsums, sc);
        const __m256i qh = load256(x[i].qh);
        __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) { // 5th bit of element 64c + 32h + l: bit 2c + h of qh[l]
            __m256i q4 = load256(x[i].qs + 32 * c);
            __m256i hl = _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(qh, 2 * c), 4), b4);
            __m256i hh = _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(qh, 2 * c + 1), 4), b4);
            __m256i ql = _mm256_or_si256(_mm256_and_si256(q4, m4), hl);
            __m256i qq = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4, 4), m4), hh);
            __m256i pl = _mm256_maddubs_epi16(ql, load256(y[i].qs + 64 * c));
            __m256i ph = _mm256_maddubs_epi16(qq, load256(y[i].qs + 64 * c + 32));
            s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(pl, _mm256_set1_epi16(sc[2 * c])));
            s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(ph, _mm256_set1_epi16(sc[2 * c + 1])));
        }
        const float d = h2f(x[i].d) * y[i].d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1)), acc);
        accm += h2f(x[i].dmin) * y[i].d * (float)summs;
    }
    return hsum_ps(acc) - accm;
}

// q6_K: unsigned q (0..63) . q8 minus 32 * sum(q8), per 16-element group, each
// group's i16 pair sums scaled by vpmaddwd with its int8 scale.
// Elements 128h + 32k + l: low 4 bits from ql[64h + 32(k&1) + l] (nibble k>>1),
// high 2 bits from qh[32h + l] bits 2k..2k+1.
float nm_dotq_q6_K_avx2(const void *restrict w, const void *restrict xq, int64_t n) {
    const nm_block_q6_K *x = w;
    const nm_block_q8_K *y = xq;
    const __m256i m4 = _mm256_set1_epi8(15), m3 = _mm256_set1_epi8(0x30), c32 = _mm256_set1_epi8(32);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / NM_QK_K; i++) {
        __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i A = load256(x[i].ql + 64 * h), B = load256(x[i].ql + 64 * h + 32);
            const __m256i H = load256(x[i].qh + 32 * h);
            const __m256i q[4] = {
                _mm256_or_si256(_mm256_and_si256(A, m4), _mm256_and_si256(_mm256_slli_epi16(H, 4), m3)),
                _mm256_or_si256(_mm256_and_si256(B, m4), _mm256_and_si256(_mm256_slli_epi16(H, 2), m3)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(A, 4), m4), _mm256_and_si256(H, m3)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(B, 4), m4),
                                _mm256_and_si256(_mm256_srli_epi16(H, 2), m3)),
            };
            for (int k = 0; k < 4; k++) {
                const int g = 8 * h + 2 * k; // this 32 is groups g (low 128 bits) and g+1
                __m256i qy = load256(y[i].qs + 128 * h + 32 * k);
                __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(q[k], qy), _mm256_maddubs_epi16(c32, qy));
                __m256i scv = _mm256_set_m128i(_mm_set1_epi16(x[i].scales[g + 1]), _mm_set1_epi16(x[i].scales[g]));
                if (k & 1) s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(p, scv));
                else s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(p, scv));
            }
        }
        const float d = h2f(x[i].d) * y[i].d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1)), acc);
    }
    return hsum_ps(acc);
}

// ---- f16 / bf16 . themselves ---------------------------------------------------------------

static inline __m256 ld_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline __m256 ld_bf16(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

#define HALF_DOTQ(name, load8, scalar)                                                           \
    float name(const void *restrict w, const void *restrict xq, int64_t n) {                     \
        const uint16_t *a = w, *b = xq;                                                          \
        __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;                \
        int64_t i = 0;                                                                           \
        for (; i + 32 <= n; i += 32) {                                                           \
            acc0 = _mm256_fmadd_ps(load8(a + i), load8(b + i), acc0);                            \
            acc1 = _mm256_fmadd_ps(load8(a + i + 8), load8(b + i + 8), acc1);                    \
            acc2 = _mm256_fmadd_ps(load8(a + i + 16), load8(b + i + 16), acc2);                  \
            acc3 = _mm256_fmadd_ps(load8(a + i + 24), load8(b + i + 24), acc3);                  \
        }                                                                                        \
        for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(load8(a + i), load8(b + i), acc0);     \
        float s = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));  \
        for (; i < n; i++) s += scalar(a[i]) * scalar(b[i]);                                     \
        return s;                                                                                \
    }
HALF_DOTQ(nm_dotq_f16_avx2, ld_f16, nm_half_to_float)
HALF_DOTQ(nm_dotq_bf16_avx2, ld_bf16, nm_bf16_to_fp32)
#undef HALF_DOTQ
