// Internal to src/quant/x86_*.c: AVX2 helpers and the dot kernels whose inner
// product is a plain int8 dot. Included by x86_dotq.c (AVX2) and by
// x86_vnni_body.h (from x86_vnni.c and x86_vnni512.c), which defines
// NM_X86_VNNI and compiles the same bodies with vpdpbusd instead of vpmaddubsw
// + vpmaddwd; each file exports them under its own names. The K-format dots
// scale int16 pairs per 16 elements with vpmaddwd, which VNNI does not
// shorten, so they live in x86_dotq.c only.
#ifndef NM_QUANT_X86_DOTQ_BLOCKS_H
#define NM_QUANT_X86_DOTQ_BLOCKS_H

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

// fp16 -> fp32 by table for the per-block scales of the 32-element formats:
// two loads, where vpinsrw + vcvtph2ps take port 5, which the block unpack
// needs (measured 20-40% on q4_0..mxfp4). Same values as h2f. Filled by
// nm_f16_table_init() before a table holding these kernels is handed out.
extern float nm_f16_table[1 << 16];
void nm_f16_table_init(void);
static inline float h2f_tab(uint16_t h) { return nm_f16_table[h]; }

// nm_e8m0_to_fp32_half inlined: 2^(e-128), e = 0 and 1 being fp32 subnormals.
static inline float e8m0_half(uint8_t e) {
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline __m256i load256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

// vpdpbusd on ymm: the VEX encoding of AVX-VNNI (Alder Lake, Sapphire Rapids,
// Zen 5), or the EVEX one of AVX512-VNNI + VL (NM_X86_VNNI_EVEX: Ice Lake,
// Zen 4, which lack AVX-VNNI). One instruction, the same sums.
#if defined(NM_X86_VNNI_EVEX)
#define nm_dpbusd256 _mm256_dpbusd_epi32
#elif defined(NM_X86_VNNI)
#define nm_dpbusd256 _mm256_dpbusd_avx_epi32
#endif

// sum of u8 a[i] * i8 b[i] as 8 x i32 (four products per lane): one vpdpbusd
// with VNNI, else vpmaddubsw + vpmaddwd (same sums: no operand range here
// reaches the int16 saturation of vpmaddubsw).
static inline __m256i dot_u8i8(__m256i a, __m256i b) {
#ifdef NM_X86_VNNI
    return nm_dpbusd256(_mm256_setzero_si256(), a, b);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1));
#endif
}
// i8 x i8: move a's sign onto b so that the u8 operand is |a|.
static inline __m256i dot_i8i8(__m256i a, __m256i b) {
    return dot_u8i8(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
}

// 16 nibble bytes -> 32 bytes in element order: low nibbles are elements
// 0..15, high nibbles 16..31. The 16 bytes are loaded into both halves (a
// load-port broadcast, no lane shuffle) and the upper half shifted by 4.
static inline __m256i nibbles32(const uint8_t *qs) {
    __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    v = _mm256_srlv_epi64(v, _mm256_set_epi64x(4, 4, 0, 0));
    return _mm256_and_si256(v, _mm256_set1_epi8(15));
}

// Byte j = 0xff where bit j of qh is set.
static inline __m256i bits32(uint32_t qh) {
    const __m256i pick = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), pick);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

// ---- K-format scales (x86_dotq.c, x86_gemmq.c) ----------------------------------------------

// 16 int16 scales s[0..15] (8 per 128-bit half) -> s[g] in the 8 low and
// s[g+1] in the 8 high int16 lanes, for even g: the multiplier vpmaddwd needs
// for the 32 products of two 16-element groups. g is a constant after
// unrolling, so the shuffle control folds.
static inline __m256i scale_pair(__m256i s16, int g) {
    __m256i half = g < 8 ? _mm256_permute2x128_si256(s16, s16, 0x00) : _mm256_permute2x128_si256(s16, s16, 0x11);
    const int lo = 2 * (g % 8), hi = lo + 2;
    const __m256i ctl = _mm256_set_m128i(_mm_set1_epi16((short)(((hi + 1) << 8) | hi)),
                                         _mm_set1_epi16((short)(((lo + 1) << 8) | lo)));
    return _mm256_shuffle_epi8(half, ctl);
}

// Same for one scale across all 16 lanes: s[j] of 8 int16 scales in each half.
static inline __m256i scale_one(__m256i s8x2, int j) {
    return _mm256_shuffle_epi8(s8x2, _mm256_set1_epi16((short)(((2 * j + 1) << 8) | (2 * j))));
}

// Q4_K/Q5_K: the 8 six-bit scales and mins unpacked from the 12 bytes as four
// 32-bit words (scales 0-3, 4-7, mins 0-3, 4-7; see nm_get_scale_min_k4), as
// int16: scales in both 128-bit halves (for scale_one), mins once.
static inline void qk_sm_unpack(const uint8_t *s12, __m256i *scales, __m128i *mins) {
    uint32_t u[3];
    memcpy(u, s12, 12);
    const uint32_t sc_lo = u[0] & 0x3f3f3f3f, mn_lo = u[1] & 0x3f3f3f3f;
    const uint32_t sc_hi = (u[2] & 0x0f0f0f0f) | (((u[0] >> 6) & 0x03030303) << 4);
    const uint32_t mn_hi = ((u[2] >> 4) & 0x0f0f0f0f) | (((u[1] >> 6) & 0x03030303) << 4);
    __m256i sm = _mm256_cvtepu8_epi16(_mm_set_epi32((int)mn_hi, (int)mn_lo, (int)sc_hi, (int)sc_lo));
    *scales = _mm256_permute2x128_si256(sm, sm, 0x00);
    *mins = _mm256_extracti128_si256(sm, 1);
}

// ---- 32-element blocks . q8_0 / q8_1 (and q8_K weights) --------------------------------
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

static inline float dotq_q8_0_blocks(const void *restrict w, const void *restrict xq, int64_t n) {
    DOTQ_BLOCK_LOOP(nm_block_q8_0, nm_block_q8_0, {
        __m256i p = dot_i8i8(load256(xb->qs), load256(yb->qs));
        *acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f_tab(xb->d) * h2f_tab(yb->d)), _mm256_cvtepi32_ps(p), *acc);
    })
    return hsum_ps(_mm256_add_ps(acc0, acc1));
}

// q4_0: nibble - 8 as int8, then the signed dot.
static inline float dotq_q4_0_blocks(const void *restrict w, const void *restrict xq, int64_t n) {
    const __m256i off = _mm256_set1_epi8(8);
    DOTQ_BLOCK_LOOP(nm_block_q4_0, nm_block_q8_0, {
        __m256i qy = load256(yb->qs);
        __m256i p = dot_i8i8(_mm256_sub_epi8(nibbles32(xb->qs), off), qy);
        *acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f_tab(xb->d) * h2f_tab(yb->d)), _mm256_cvtepi32_ps(p), *acc);
    })
    return hsum_ps(_mm256_add_ps(acc0, acc1));
}

// q4_1: d_w d_x sum(q q8) + m_w s_x; the min terms summed in scalar.
static inline float dotq_q4_1_blocks(const void *restrict w, const void *restrict xq, int64_t n) {
    float summs = 0;
    DOTQ_BLOCK_LOOP(nm_block_q4_1, nm_block_q8_1, {
        __m256i p = dot_u8i8(nibbles32(xb->qs), load256(yb->qs));
        *acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f_tab(xb->d) * h2f_tab(yb->d)), _mm256_cvtepi32_ps(p), *acc);
        summs += h2f_tab(xb->m) * h2f_tab(yb->s);
    })
    return hsum_ps(_mm256_add_ps(acc0, acc1)) + summs;
}

// q5_0: q - 16 is the nibble where the 5th bit is set and nibble | 0xf0
// (nibble - 16 as int8) where it is clear.
static inline float dotq_q5_0_blocks(const void *restrict w, const void *restrict xq, int64_t n) {
    const __m256i hi = _mm256_set1_epi8((char)0xf0);
    DOTQ_BLOCK_LOOP(nm_block_q5_0, nm_block_q8_0, {
        uint32_t qh;
        memcpy(&qh, xb->qh, 4);
        __m256i q = _mm256_or_si256(nibbles32(xb->qs), _mm256_andnot_si256(bits32(qh), hi));
        __m256i p = dot_i8i8(q, load256(yb->qs));
        *acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f_tab(xb->d) * h2f_tab(yb->d)), _mm256_cvtepi32_ps(p), *acc);
    })
    return hsum_ps(_mm256_add_ps(acc0, acc1));
}

// q5_1: unsigned 5-bit quants, min term as in q4_1.
static inline float dotq_q5_1_blocks(const void *restrict w, const void *restrict xq, int64_t n) {
    const __m256i b4 = _mm256_set1_epi8(0x10);
    float summs = 0;
    DOTQ_BLOCK_LOOP(nm_block_q5_1, nm_block_q8_1, {
        uint32_t qh;
        memcpy(&qh, xb->qh, 4);
        __m256i q = _mm256_or_si256(nibbles32(xb->qs), _mm256_and_si256(bits32(qh), b4));
        __m256i p = dot_u8i8(q, load256(yb->qs));
        *acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f_tab(xb->d) * h2f_tab(yb->d)), _mm256_cvtepi32_ps(p), *acc);
        summs += h2f_tab(xb->m) * h2f_tab(yb->s);
    })
    return hsum_ps(_mm256_add_ps(acc0, acc1)) + summs;
}

// mxfp4: the nibbles index the doubled E2M1 values (int8) with vpshufb.
static inline float dotq_mxfp4_blocks(const void *restrict w, const void *restrict xq, int64_t n) {
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)nm_kvalues_mxfp4));
    DOTQ_BLOCK_LOOP(nm_block_mxfp4, nm_block_q8_0, {
        __m256i q = _mm256_shuffle_epi8(table, nibbles32(xb->qs));
        __m256i p = dot_i8i8(q, load256(yb->qs));
        *acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f_tab(yb->d) * e8m0_half(xb->e)), _mm256_cvtepi32_ps(p), *acc);
    })
    return hsum_ps(_mm256_add_ps(acc0, acc1));
}

// q8_1 / q8_K weights (not in ggml; for completeness): d_w d_x sum(q_w q_x).
static inline float dotq_q8_1_blocks(const void *restrict w, const void *restrict xq, int64_t n) {
    DOTQ_BLOCK_LOOP(nm_block_q8_1, nm_block_q8_1, {
        __m256i p = dot_i8i8(load256(xb->qs), load256(yb->qs));
        *acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f_tab(xb->d) * h2f_tab(yb->d)), _mm256_cvtepi32_ps(p), *acc);
    })
    return hsum_ps(_mm256_add_ps(acc0, acc1));
}

static inline float dotq_q8_K_blocks(const void *restrict w, const void *restrict xq, int64_t n) {
    const nm_block_q8_K *x = w;
    const nm_block_q8_K *y = xq;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / NM_QK_K; i++) {
        __m256i s = _mm256_setzero_si256();
        for (int j = 0; j < NM_QK_K; j += 32)
            s = _mm256_add_epi32(s, dot_i8i8(load256(x[i].qs + j), load256(y[i].qs + j)));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(x[i].d * y[i].d), _mm256_cvtepi32_ps(s), acc);
    }
    return hsum_ps(acc);
}

#endif
