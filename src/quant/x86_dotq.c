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
#include <pthread.h>

#include "quant/x86_dotq_blocks.h"

float nm_f16_table[1 << 16];

static void f16_table_fill(void) {
    for (uint32_t h = 0; h < (1u << 16); h++) nm_f16_table[h] = _cvtsh_ss((uint16_t)h);
}

void nm_f16_table_init(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, f16_table_fill);
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

// ---- block dots (bodies in x86_dotq_blocks.h) ---------------------------------------------

float nm_dotq_q4_0_avx2(const void *restrict w, const void *restrict xq, int64_t n) {
    return dotq_q4_0_blocks(w, xq, n);
}
float nm_dotq_q4_1_avx2(const void *restrict w, const void *restrict xq, int64_t n) {
    return dotq_q4_1_blocks(w, xq, n);
}
float nm_dotq_q5_0_avx2(const void *restrict w, const void *restrict xq, int64_t n) {
    return dotq_q5_0_blocks(w, xq, n);
}
float nm_dotq_q5_1_avx2(const void *restrict w, const void *restrict xq, int64_t n) {
    return dotq_q5_1_blocks(w, xq, n);
}
float nm_dotq_q8_0_avx2(const void *restrict w, const void *restrict xq, int64_t n) {
    return dotq_q8_0_blocks(w, xq, n);
}
float nm_dotq_q8_1_avx2(const void *restrict w, const void *restrict xq, int64_t n) {
    return dotq_q8_1_blocks(w, xq, n);
}
float nm_dotq_mxfp4_avx2(const void *restrict w, const void *restrict xq, int64_t n) {
    return dotq_mxfp4_blocks(w, xq, n);
}
float nm_dotq_q8_K_avx2(const void *restrict w, const void *restrict xq, int64_t n) {
    return dotq_q8_K_blocks(w, xq, n);
}

// ---- K formats . q8_K ------------------------------------------------------------------

// A whole super-block sums in int32 (|q6 - 32| * 127 * 128 * 256 < 2^31), then
// one FMA with d_w * d_x; min terms come from the q8_K bsums.

// sum_j mins[j] * (bsums[2j] + bsums[2j+1]) as 4 int32 (pair sums fit int16: |.| <= 32 * 127).
static inline __m128i qk_min_term(__m128i mins, const int16_t *bsums) {
    const __m128i lo = _mm_loadu_si128((const __m128i *)bsums), hi = _mm_loadu_si128((const __m128i *)(bsums + 8));
    __m128i pairs = _mm_hadd_epi16(lo, hi);
    return _mm_madd_epi16(mins, pairs);
}

static inline float hsum_ps128(__m128 v) {
    v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    v = _mm_add_ss(v, _mm_movehdup_ps(v));
    return _mm_cvtss_f32(v);
}

float nm_dotq_q4_K_avx2(const void *restrict w, const void *restrict xq, int64_t n) {
    const nm_block_q4_K *x = w;
    const nm_block_q8_K *y = xq;
    const __m256i m4 = _mm256_set1_epi8(15);
    __m256 acc = _mm256_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int64_t i = 0; i < n / NM_QK_K; i++) {
        __m256i sc;
        __m128i mins;
        qk_sm_unpack(x[i].scales, &sc, &mins);
        const float dmin = h2f(x[i].dmin) * y[i].d;
        accm = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(qk_min_term(mins, y[i].bsums)), accm);
        __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) { // 64 elements: low nibbles sub-block 2c, high 2c+1
            __m256i q4 = load256(x[i].qs + 32 * c);
            __m256i pl = _mm256_maddubs_epi16(_mm256_and_si256(q4, m4), load256(y[i].qs + 64 * c));
            __m256i qhi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
            __m256i ph = _mm256_maddubs_epi16(qhi, load256(y[i].qs + 64 * c + 32));
            s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(pl, scale_one(sc, 2 * c)));
            s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(ph, scale_one(sc, 2 * c + 1)));
        }
        const float d = h2f(x[i].d) * y[i].d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1)), acc);
    }
    return hsum_ps(acc) - hsum_ps128(accm);
}

float nm_dotq_q5_K_avx2(const void *restrict w, const void *restrict xq, int64_t n) {
    const nm_block_q5_K *x = w;
    const nm_block_q8_K *y = xq;
    const __m256i m4 = _mm256_set1_epi8(15), b4 = _mm256_set1_epi8(0x10);
    __m256 acc = _mm256_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int64_t i = 0; i < n / NM_QK_K; i++) {
        __m256i sc;
        __m128i mins;
        qk_sm_unpack(x[i].scales, &sc, &mins);
        const float dmin = h2f(x[i].dmin) * y[i].d;
        accm = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(qk_min_term(mins, y[i].bsums)), accm);
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
            s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(pl, scale_one(sc, 2 * c)));
            s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(ph, scale_one(sc, 2 * c + 1)));
        }
        const float d = h2f(x[i].d) * y[i].d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1)), acc);
    }
    return hsum_ps(acc) - hsum_ps128(accm);
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
        const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[i].scales));
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
                __m256i scv = scale_pair(sc, g);
                if (k & 1) s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(p, scv));
                else s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(p, scv));
            }
        }
        const float d = h2f(x[i].d) * y[i].d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1)), acc);
    }
    return hsum_ps(acc);
}

// q2_K: w = d * (sc & 15) * q - dmin * (sc >> 4), q in 0..3. Element
// 128c + 32k + l is bits 2k..2k+1 of qs[32c + l]; group g = 8c + 2k (+1 for l >= 16).
float nm_dotq_q2_K_avx2(const void *restrict w, const void *restrict xq, int64_t n) {
    const nm_block_q2_K *x = w;
    const nm_block_q8_K *y = xq;
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m128i m4 = _mm_set1_epi8(15);
    __m256 acc = _mm256_setzero_ps();
    float accm = 0;
    for (int64_t i = 0; i < n / NM_QK_K; i++) {
        const __m128i sc = _mm_loadu_si128((const __m128i *)x[i].scales);
        // min term: sum_g bsums[g] * (sc[g] >> 4)
        __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc, 4), m4));
        __m256i mt = _mm256_madd_epi16(mins, load256(y[i].bsums));
        __m128i m4s = _mm_add_epi32(_mm256_castsi256_si128(mt), _mm256_extracti128_si256(mt, 1));
        m4s = _mm_add_epi32(m4s, _mm_shuffle_epi32(m4s, _MM_SHUFFLE(1, 0, 3, 2)));
        m4s = _mm_add_epi32(m4s, _mm_shuffle_epi32(m4s, _MM_SHUFFLE(2, 3, 0, 1)));
        const int summs = _mm_cvtsi128_si32(m4s);
        const __m256i s16 = _mm256_cvtepu8_epi16(_mm_and_si128(sc, m4));
        __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
        for (int c = 0; c < 2; c++) {
            const __m256i Q = load256(x[i].qs + 32 * c);
            for (int k = 0; k < 4; k++) {
                const int g = 8 * c + 2 * k;
                __m256i q = _mm256_and_si256(_mm256_srli_epi16(Q, 2 * k), m3);
                __m256i p = _mm256_maddubs_epi16(q, load256(y[i].qs + 128 * c + 32 * k));
                __m256i scv = scale_pair(s16, g);
                if (k & 1) s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(p, scv));
                else s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(p, scv));
            }
        }
        const float dall = y[i].d * h2f(x[i].d), dmin = y[i].d * h2f(x[i].dmin);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dall), _mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1)), acc);
        accm += dmin * (float)summs;
    }
    return hsum_ps(acc) - accm;
}

// The 16 Q3_K scales (6 bits, minus 32) as int16, from the 12 bytes as three
// 32-bit words: low nibbles of bytes 0-7 are scales 0-7, high nibbles 8-15;
// byte 8 + j%4 holds the top 2 bits of scale j at bit 2*(j/4) (nm_q3_K_scales).
static inline __m256i q3_K_scales16(const uint8_t *s12) {
    uint32_t a[3];
    memcpy(a, s12, 12);
    const uint32_t m4 = 0x0f0f0f0f, m2 = 0x03030303;
    const uint32_t s0 = (a[0] & m4) | ((a[2] & m2) << 4);               // scales 0-3
    const uint32_t s1 = (a[1] & m4) | (((a[2] >> 2) & m2) << 4);        // 4-7
    const uint32_t s2 = ((a[0] >> 4) & m4) | (((a[2] >> 4) & m2) << 4); // 8-11
    const uint32_t s3 = ((a[1] >> 4) & m4) | (((a[2] >> 6) & m2) << 4); // 12-15
    const __m128i s = _mm_set_epi32((int)s3, (int)s2, (int)s1, (int)s0);
    return _mm256_sub_epi16(_mm256_cvtepu8_epi16(s), _mm256_set1_epi16(32));
}

// q3_K: q = lo - 4 * (high bit clear), lo in 0..3 as in q2_K, the high bit of
// element 128c + 32k + l is bit 4c + k of hmask[l]; signed 6-bit scales per 16.
// q . y = lo . y - (4 where clear) . y, both unsigned x signed.
float nm_dotq_q3_K_avx2(const void *restrict w, const void *restrict xq, int64_t n) {
    const nm_block_q3_K *x = w;
    const nm_block_q8_K *y = xq;
    const __m256i m3 = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4), zero = _mm256_setzero_si256();
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / NM_QK_K; i++) {
        const __m256i sc = q3_K_scales16(x[i].scales);
        const __m256i H = load256(x[i].hmask);
        __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
        for (int c = 0; c < 2; c++) {
            const __m256i Q = load256(x[i].qs + 32 * c);
            for (int k = 0; k < 4; k++) {
                const int g = 8 * c + 2 * k;
                const __m256i qy = load256(y[i].qs + 128 * c + 32 * k);
                __m256i lo = _mm256_and_si256(_mm256_srli_epi16(Q, 2 * k), m3);
                __m256i bit = _mm256_set1_epi8((char)(1 << (4 * c + k)));
                __m256i h4 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(H, bit), zero), four);
                __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(lo, qy), _mm256_maddubs_epi16(h4, qy));
                __m256i scv = scale_pair(sc, g);
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
