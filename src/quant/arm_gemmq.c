// NEON gemmq for aarch64: many weight rows x many q8 activation rows, the
// prefill matmul. Types: the 32-element formats (q4_0, q4_1, q5_0, q5_1,
// q8_0, mxfp4 . q8_0/q8_1) and q4_K, q5_K, q6_K (. q8_K). Each body is
// written once with a constant `dp` and built twice, as in arm_neon.c: plain
// NEON (vmull_s8 + vpadalq_s16, any ARMv8-A) and SDOT (vdotq_s32, dotprod;
// the neon+dotprod table). The ref (nm_gemmq_*_ref, the dotq_ref loop) is the
// spec: the int32 block sums are exact, only the order of the f32 sums
// differs.
//
// Blocking (for a Cortex-A76/A78: 32 vector registers, two 128-bit pipes that
// both run SDOT and ADDP, integer MLA at half that rate):
//  - tile = 4 weight rows x 4 tokens. Per 32 elements the 4 token blocks (8
//    registers) are loaded once and each row's block is unpacked once into 2
//    registers, then 16 int dots of 32 (2 SDOT or 4 SMULL + 4 SADALP each);
//  - the 4 int32x4 dot vectors of a row are folded by 3 ADDP into one vector
//    whose lanes are the 4 tokens, so a block costs one cvt and one FMA per
//    row (d_w times the 4 tokens' d_x), not one horizontal add per pair. The
//    accumulators are 4 f32x4 (row x [t0 t1 t2 t3]); about 24 registers are
//    live (GCC 12 -O2: the SDOT block loop moves 2 accumulators through the
//    stack, the plain one a few of its int16 products);
//  - K formats: the same tile per 32 (16 for q6_K's scales) elements; the
//    folded vector is scaled by the sub-block scale into an int32x4 per row
//    (one MLA per row and 32 elements, not per pair), one f32 step per
//    super-block; the q4_K/q5_K mins come from the q8_K bsums, folded the
//    same way;
//  - loop order: rows outside, tokens inside. The caller hands a few rows
//    against all tokens: the 4 weight rows (a few KiB) stay in L1 while the
//    q8 activations stream from L2, so the weights are read from memory once.
//    Tails: past the last token the tile repeats it (computed, not stored);
//    the last n_rows % 4 rows run as 1-row tiles.
#include <arm_neon.h>
#include <stdbool.h>
#include <stddef.h>

#include "quant/arm_neon_blocks.h"
#include "quant/kernels_impl.h"

// The loops over the 4 tokens and the nr rows of a tile must be flat: their
// arrays of vectors (acc[r], yv[t]) then live in registers, not on the stack.
#define NM_UNROLL _Pragma("GCC unroll 4")

// [sum a, sum b, sum c, sum d].
static inline int32x4_t fold4(int32x4_t a, int32x4_t b, int32x4_t c, int32x4_t d) {
    return vpaddq_s32(vpaddq_s32(a, b), vpaddq_s32(c, d));
}

// The 4 tokens' 32-element dots with one unpacked weight block, as [t0 t1 t2 t3].
NM_ALWAYS_INLINE int32x4_t dot32x4(const int8x16_t q[2], int8x16_t yv[4][2], const bool dp) {
    int32x4_t p[4];
    NM_UNROLL for (int t = 0; t < 4; t++) p[t] = dot_i8(dot_i8(vdupq_n_s32(0), q[0], yv[t][0], dp), q[1], yv[t][1], dp);
    return fold4(p[0], p[1], p[2], p[3]);
}
// Same for 16 elements (q6_K: one scale per 16).
NM_ALWAYS_INLINE int32x4_t dot16x4(int8x16_t q, int8x16_t yv[4][2], int half, const bool dp) {
    int32x4_t p[4];
    NM_UNROLL for (int t = 0; t < 4; t++) p[t] = dot_i8(vdupq_n_s32(0), q, yv[t][half], dp);
    return fold4(p[0], p[1], p[2], p[3]);
}

static inline void load_y32(const int8_t *const qs[4], int8x16_t yv[4][2]) {
    NM_UNROLL for (int t = 0; t < 4; t++) {
        yv[t][0] = vld1q_s8(qs[t]);
        yv[t][1] = vld1q_s8(qs[t] + 16);
    }
}

// Four fp16 fields as f32 lanes.
static inline float32x4_t half4(const uint16_t *a, const uint16_t *b, const uint16_t *c, const uint16_t *d) {
    uint16x4_t v = vld1_dup_u16(a);
    v = vld1_lane_u16(b, v, 1);
    v = vld1_lane_u16(c, v, 2);
    v = vld1_lane_u16(d, v, 3);
    return vcvt_f32_f16(vreinterpret_f16_u16(v));
}

// Column r of y from the token lanes of v, tokens t0.. < n_tok.
static inline void store_col(float32x4_t v, float *y, int64_t ldy, int64_t r, int64_t t0, int64_t n_tok) {
    float s[4];
    vst1q_f32(s, v);
    for (int i = 0; i < 4 && t0 + i < n_tok; i++) y[(t0 + i) * ldy + r] = s[i];
}

// ---- 32-element formats . q8_0 / q8_1 -------------------------------------------------------

// 0x10 in byte j where bit j of the 32-bit qh is set.
static inline void bit4_32(const uint8_t qh4[4], uint8x16_t out[2]) {
    bits32(qh4, out);
    NM_UNROLL for (int k = 0; k < 2; k++) out[k] = vandq_u8(out[k], vdupq_n_u8(0x10));
}

static inline size_t lg_wsize(uint32_t type) {
    switch (type) {
    case NM_TYPE_Q4_0: return sizeof(nm_block_q4_0);
    case NM_TYPE_Q4_1: return sizeof(nm_block_q4_1);
    case NM_TYPE_Q5_0: return sizeof(nm_block_q5_0);
    case NM_TYPE_Q5_1: return sizeof(nm_block_q5_1);
    case NM_TYPE_MXFP4: return sizeof(nm_block_mxfp4);
    default: return sizeof(nm_block_q8_0);
    }
}
static inline bool lg_has_min(uint32_t type) { return type == NM_TYPE_Q4_1 || type == NM_TYPE_Q5_1; }

// One weight block: its 32 quants (signed, in element order, the values the
// ref multiplies), d and, for q4_1/q5_1, m.
NM_ALWAYS_INLINE void lg_unpack(uint32_t type, const uint8_t *wb, int8x16_t q[2], float *dw, float *mw) {
    uint8x16_t u[2], h[2];
    switch (type) {
    case NM_TYPE_Q4_0: {
        const nm_block_q4_0 *b = (const nm_block_q4_0 *)wb;
        nib32(b->qs, u);
        NM_UNROLL for (int k = 0; k < 2; k++) q[k] = vsubq_s8(vreinterpretq_s8_u8(u[k]), vdupq_n_s8(8));
        *dw = h2f(b->d);
        break;
    }
    case NM_TYPE_Q4_1: {
        const nm_block_q4_1 *b = (const nm_block_q4_1 *)wb;
        nib32(b->qs, u);
        NM_UNROLL for (int k = 0; k < 2; k++) q[k] = vreinterpretq_s8_u8(u[k]);
        *dw = h2f(b->d);
        *mw = h2f(b->m);
        break;
    }
    case NM_TYPE_Q5_0: {
        const nm_block_q5_0 *b = (const nm_block_q5_0 *)wb;
        nib32(b->qs, u);
        bit4_32(b->qh, h);
        NM_UNROLL for (int k = 0; k < 2; k++) q[k] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(u[k], h[k])), vdupq_n_s8(16));
        *dw = h2f(b->d);
        break;
    }
    case NM_TYPE_Q5_1: {
        const nm_block_q5_1 *b = (const nm_block_q5_1 *)wb;
        nib32(b->qs, u);
        bit4_32(b->qh, h);
        NM_UNROLL for (int k = 0; k < 2; k++) q[k] = vreinterpretq_s8_u8(vorrq_u8(u[k], h[k]));
        *dw = h2f(b->d);
        *mw = h2f(b->m);
        break;
    }
    case NM_TYPE_MXFP4: { // doubled E2M1 values, scale 2^(e-128)
        const nm_block_mxfp4 *b = (const nm_block_mxfp4 *)wb;
        const int8x16_t table = vld1q_s8(nm_kvalues_mxfp4);
        nib32(b->qs, u);
        NM_UNROLL for (int k = 0; k < 2; k++) q[k] = vqtbl1q_s8(table, u[k]);
        *dw = e8m0_half(b->e);
        break;
    }
    default: { // q8_0
        const nm_block_q8_0 *b = (const nm_block_q8_0 *)wb;
        q[0] = vld1q_s8(b->qs);
        q[1] = vld1q_s8(b->qs + 16);
        *dw = h2f(b->d);
        break;
    }
    }
}

// nr weight rows w[] x 4 tokens y[] over nb blocks into acc[r] (lanes = tokens).
// Activation blocks: q8_1 (d, s, qs) for the min formats, q8_0 (d, qs) else.
NM_ALWAYS_INLINE void lg_tile(uint32_t type, const int nr, const uint8_t *const w[4], const uint8_t *const y[4],
                              int64_t nb, float32x4_t acc[4], const bool dp) {
    const bool min = lg_has_min(type);
    const size_t wsz = lg_wsize(type), ysz = min ? sizeof(nm_block_q8_1) : sizeof(nm_block_q8_0);
    NM_UNROLL for (int r = 0; r < nr; r++) acc[r] = vdupq_n_f32(0);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *yb[4];
        const int8_t *yq[4];
        NM_UNROLL for (int t = 0; t < 4; t++) {
            yb[t] = y[t] + (size_t)b * ysz;
            yq[t] = min ? ((const nm_block_q8_1 *)yb[t])->qs : ((const nm_block_q8_0 *)yb[t])->qs;
        }
        int8x16_t yv[4][2];
        load_y32(yq, yv);
        // d comes first in q8_0 and q8_1 alike; q8_1's s follows it
        _Static_assert(offsetof(nm_block_q8_0, d) == offsetof(nm_block_q8_1, d), "q8_0/q8_1 d");
#define Y8(t) ((const nm_block_q8_1 *)yb[t])
        const float32x4_t dx = half4(&Y8(0)->d, &Y8(1)->d, &Y8(2)->d, &Y8(3)->d);
        const float32x4_t sx = min ? half4(&Y8(0)->s, &Y8(1)->s, &Y8(2)->s, &Y8(3)->s) : vdupq_n_f32(0);
#undef Y8
        NM_UNROLL for (int r = 0; r < nr; r++) {
            int8x16_t q[2];
            float dw, mw = 0;
            lg_unpack(type, w[r] + (size_t)b * wsz, q, &dw, &mw);
            const int32x4_t s = dot32x4(q, yv, dp);
            acc[r] = vfmaq_f32(acc[r], vcvtq_f32_s32(s), vmulq_n_f32(dx, dw));
            if (min) acc[r] = vfmaq_n_f32(acc[r], sx, mw); // m_w * s_x
        }
    }
}

// ---- K formats . q8_K -----------------------------------------------------------------------

// Q4_K/Q5_K: the 8 six-bit scales and mins (see nm_get_scale_min_k4).
static inline void qk_sm_unpack(const uint8_t *s12, uint8_t sc[8], uint8_t mn[8]) {
    uint32_t u[3];
    memcpy(u, s12, 12);
    const uint32_t v[4] = {u[0] & 0x3f3f3f3f, (u[2] & 0x0f0f0f0f) | (((u[0] >> 6) & 0x03030303) << 4),
                           u[1] & 0x3f3f3f3f, ((u[2] >> 4) & 0x0f0f0f0f) | (((u[1] >> 6) & 0x03030303) << 4)};
    memcpy(sc, v, 8);
    memcpy(mn, v + 2, 8);
}

// Sub-block j (elements 32j..32j+31) of a Q4_K/Q5_K super-block: low nibbles
// of qs[32(j/2)..] for even j, high for odd; Q5_K's 5th bit is bit j of qh[l].
NM_ALWAYS_INLINE void qk_unpack(const uint8_t *qs, const uint8_t *qh, int j, int8x16_t q[2]) {
    NM_UNROLL for (int p = 0; p < 2; p++) {
        const uint8x16_t v = vld1q_u8(qs + 32 * (j / 2) + 16 * p);
        uint8x16_t u = j & 1 ? vshrq_n_u8(v, 4) : vandq_u8(v, vdupq_n_u8(15));
        if (qh) u = vorrq_u8(u, vandq_u8(vshlq_u8(vld1q_u8(qh + 16 * p), vdupq_n_s8((int8_t)(4 - j))), vdupq_n_u8(0x10)));
        q[p] = vreinterpretq_s8_u8(u);
    }
}

// Q6_K: the 32 quants (q - 32) of quarter k (0..3) of half h: elements
// 128h + 32k + 0..31, low bits in ql (two 32-byte rows, low or high nibbles),
// the 2-bit fields of qh.
static inline void q6_unpack(const nm_block_q6_K *b, int h, int k, int8x16_t q[2]) {
    const uint8_t *ql = b->ql + 64 * h + 32 * (k & 1), *qh = b->qh + 32 * h;
    NM_UNROLL for (int p = 0; p < 2; p++) {
        uint8x16_t lo = vld1q_u8(ql + 16 * p), hb = vld1q_u8(qh + 16 * p);
        lo = (k >> 1) ? vshrq_n_u8(lo, 4) : vandq_u8(lo, vdupq_n_u8(15));
        hb = vandq_u8(vshlq_u8(hb, vdupq_n_s8((int8_t)(4 - 2 * k))), vdupq_n_u8(0x30)); // bits 2k,2k+1 -> 4,5
        q[p] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo, hb)), vdupq_n_s8(32));
    }
}

// nr weight rows x 4 tokens over nb super-blocks into acc[r] (lanes = tokens).
// Per super-block and row the int32 sum (< 2^31 as in the dotq) is kept per
// token lane, then one FMA with d_w * d_x (and one for the min term).
NM_ALWAYS_INLINE void qk_tile(uint32_t type, const int nr, const uint8_t *const w[4], const uint8_t *const y[4],
                              int64_t nb, float32x4_t acc[4], const bool dp) {
    const size_t wsz = type == NM_TYPE_Q4_K ? sizeof(nm_block_q4_K)
                     : type == NM_TYPE_Q5_K ? sizeof(nm_block_q5_K) : sizeof(nm_block_q6_K);
    NM_UNROLL for (int r = 0; r < nr; r++) acc[r] = vdupq_n_f32(0);
    for (int64_t b = 0; b < nb; b++) {
        const nm_block_q8_K *yb[4];
        NM_UNROLL for (int t = 0; t < 4; t++) yb[t] = (const nm_block_q8_K *)y[t] + b;
        float32x4_t dx = vld1q_dup_f32(&yb[0]->d);
        dx = vld1q_lane_f32(&yb[1]->d, dx, 1);
        dx = vld1q_lane_f32(&yb[2]->d, dx, 2);
        dx = vld1q_lane_f32(&yb[3]->d, dx, 3);
        int32x4_t isum[4];
        int8x16_t yv[4][2];
        const int8_t *yq[4];
        int8x16_t q[2];
        NM_UNROLL for (int r = 0; r < nr; r++) isum[r] = vdupq_n_s32(0);
        if (type == NM_TYPE_Q6_K) {
            const nm_block_q6_K *x[4];
            NM_UNROLL for (int r = 0; r < nr; r++) x[r] = (const nm_block_q6_K *)(w[r] + (size_t)b * wsz);
            for (int h = 0; h < 2; h++)
                for (int k = 0; k < 4; k++) {
                    const int g = 8 * h + 2 * k; // scales g, g+1: elements 16g..16g+31
                    NM_UNROLL for (int t = 0; t < 4; t++) yq[t] = yb[t]->qs + 16 * g;
                    load_y32(yq, yv);
                    NM_UNROLL for (int r = 0; r < nr; r++) {
                        q6_unpack(x[r], h, k, q);
                        isum[r] = vmlaq_n_s32(isum[r], dot16x4(q[0], yv, 0, dp), x[r]->scales[g]);
                        isum[r] = vmlaq_n_s32(isum[r], dot16x4(q[1], yv, 1, dp), x[r]->scales[g + 1]);
                    }
                }
            NM_UNROLL for (int r = 0; r < nr; r++)
                acc[r] = vfmaq_f32(acc[r], vcvtq_f32_s32(isum[r]), vmulq_n_f32(dx, h2f(x[r]->d)));
            continue;
        }
        // q4_K, q5_K (same head: d, dmin, scales, then q5_K's qh before qs)
        const nm_block_q4_K *x[4];
        const uint8_t *qs[4], *qh[4];
        uint8_t sc[4][8], mn[4][8];
        NM_UNROLL for (int r = 0; r < nr; r++) {
            x[r] = (const nm_block_q4_K *)(w[r] + (size_t)b * wsz);
            qs[r] = type == NM_TYPE_Q5_K ? ((const nm_block_q5_K *)x[r])->qs : x[r]->qs;
            qh[r] = type == NM_TYPE_Q5_K ? ((const nm_block_q5_K *)x[r])->qh : NULL;
            qk_sm_unpack(x[r]->scales, sc[r], mn[r]);
        }
        for (int j = 0; j < 8; j++) {
            NM_UNROLL for (int t = 0; t < 4; t++) yq[t] = yb[t]->qs + 32 * j;
            load_y32(yq, yv);
            NM_UNROLL for (int r = 0; r < nr; r++) {
                qk_unpack(qs[r], qh[r], j, q);
                isum[r] = vmlaq_n_s32(isum[r], dot32x4(q, yv, dp), sc[r][j]);
            }
        }
        // min term: sum_j mn[j] * (bsums[2j] + bsums[2j+1]); the pair sums fit int16 (|.| <= 32 * 128)
        int16x8_t bp[4];
        NM_UNROLL for (int t = 0; t < 4; t++) bp[t] = vpaddq_s16(vld1q_s16(yb[t]->bsums), vld1q_s16(yb[t]->bsums + 8));
        NM_UNROLL for (int r = 0; r < nr; r++) {
            const int16x8_t m = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(mn[r])));
            int32x4_t p[4];
            NM_UNROLL for (int t = 0; t < 4; t++) p[t] = vmlal_high_s16(vmull_s16(vget_low_s16(m), vget_low_s16(bp[t])), m, bp[t]);
            const int32x4_t msum = fold4(p[0], p[1], p[2], p[3]);
            acc[r] = vfmaq_f32(acc[r], vcvtq_f32_s32(isum[r]), vmulq_n_f32(dx, h2f(x[r]->d)));
            acc[r] = vfmsq_f32(acc[r], vcvtq_f32_s32(msum), vmulq_n_f32(dx, h2f(x[r]->dmin)));
        }
    }
}

// ---- drivers ---------------------------------------------------------------------------------

// Rows [r0, r0 + nr) (nr = 4, or 1 for the tail) against all tokens.
NM_ALWAYS_INLINE void gq_rows(uint32_t type, const int nr, const uint8_t *w, size_t w_stride, int64_t r0,
                              const uint8_t *x, size_t x_stride, int64_t n_tok, int64_t K, float *y, int64_t ldy,
                              const bool dp) {
    const bool kq = type == NM_TYPE_Q4_K || type == NM_TYPE_Q5_K || type == NM_TYPE_Q6_K;
    const int64_t nb = K / (kq ? NM_QK_K : NM_QK);
    const uint8_t *wp[4];
    NM_UNROLL for (int r = 0; r < nr; r++) wp[r] = w + (size_t)(r0 + r) * w_stride;
    for (int64_t t0 = 0; t0 < n_tok; t0 += 4) {
        const uint8_t *yp[4];
        NM_UNROLL for (int t = 0; t < 4; t++) yp[t] = x + (size_t)(t0 + t < n_tok ? t0 + t : n_tok - 1) * x_stride;
        float32x4_t acc[4];
        if (kq) qk_tile(type, nr, wp, yp, nb, acc, dp);
        else lg_tile(type, nr, wp, yp, nb, acc, dp);
        NM_UNROLL for (int r = 0; r < nr; r++) store_col(acc[r], y, ldy, r0 + r, t0, n_tok);
    }
}

NM_ALWAYS_INLINE void gq_body(uint32_t type, const void *restrict w, size_t w_stride, int64_t n_rows,
                              const void *restrict xq, size_t x_stride, int64_t n_tok, int64_t K, float *restrict y,
                              int64_t ldy, const bool dp) {
    int64_t r = 0;
    for (; r + 4 <= n_rows; r += 4) gq_rows(type, 4, w, w_stride, r, xq, x_stride, n_tok, K, y, ldy, dp);
    for (; r < n_rows; r++) gq_rows(type, 1, w, w_stride, r, xq, x_stride, n_tok, K, y, ldy, dp);
}

#define GQ_DEFINE(t, T)                                                                                             \
    void nm_gemmq_##t##_neon(const void *restrict w, size_t w_stride, int64_t n_rows, const void *restrict xq,      \
                             size_t x_stride, int64_t n_tok, int64_t K, float *restrict y, int64_t ldy) {           \
        gq_body(NM_TYPE_##T, w, w_stride, n_rows, xq, x_stride, n_tok, K, y, ldy, false);                          \
    }                                                                                                               \
    NM_TARGET_DOTPROD void nm_gemmq_##t##_neon_dp(const void *restrict w, size_t w_stride, int64_t n_rows,          \
                                                  const void *restrict xq, size_t x_stride, int64_t n_tok,          \
                                                  int64_t K, float *restrict y, int64_t ldy) {                      \
        gq_body(NM_TYPE_##T, w, w_stride, n_rows, xq, x_stride, n_tok, K, y, ldy, true);                           \
    }
GQ_DEFINE(q4_0, Q4_0)
GQ_DEFINE(q4_1, Q4_1)
GQ_DEFINE(q5_0, Q5_0)
GQ_DEFINE(q5_1, Q5_1)
GQ_DEFINE(q8_0, Q8_0)
GQ_DEFINE(mxfp4, MXFP4)
GQ_DEFINE(q4_K, Q4_K)
GQ_DEFINE(q5_K, Q5_K)
GQ_DEFINE(q6_K, Q6_K)
#undef GQ_DEFINE
