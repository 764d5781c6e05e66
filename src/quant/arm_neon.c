// NEON kernels for aarch64 (AdvSIMD is part of the base ISA there), chosen at
// run time by dispatch.c. Two tables:
//  - nm_kernels_neon(): fused f32 dots, a few dequants, the activation
//    quantizers and the integer dotq with plain NEON (vmull_s8 + vpadalq_s16);
//  - nm_kernels_neon_dotprod(): the same integer dotq built with SDOT
//    (vdotq_s32, ARMv8.2 dotprod), only for CPUs whose hwcaps report asimddp.
// Both also carry the matching gemmq tiles of arm_gemmq.c. Entries left NULL
// fall back to ref. The ref (ref_*.c) is the spec.
//
// Each integer dot body is written once, as an always_inline function taking
// a constant `dp`, and instantiated twice: in a plain function (dp = false)
// and in a function with the dotprod target attribute (dp = true), where the
// SDOT helper can be inlined. Both give the same exact int32 block sums, so
// results equal the ref up to the order of the f32 sums.
//
// Quantizers: bit-identical to the ref (llama.cpp's x86 numerics: id =
// 127/amax, round half to even, out-of-range and NaN products to INT32_MIN
// before the saturating narrow, as vcvtps2dq does).
#include <arm_neon.h>
#include <math.h>
#include <stdbool.h>

#include "quant/arm_neon_blocks.h"
#include "quant/kernels_impl.h"

// ---- int8 dot products -------------------------------------------------------------

// 32 quants . 32 activations.
NM_ALWAYS_INLINE int32x4_t dot_i8x32(const int8x16_t q[2], const int8_t *y, const bool dp) {
    int32x4_t p = dot_i8(vdupq_n_s32(0), q[0], vld1q_s8(y), dp);
    return dot_i8(p, q[1], vld1q_s8(y + 16), dp);
}

// ---- block unpacking: 32 quants as int8 in element order ------------------------------

static inline void q4_0_unpack(const nm_block_q4_0 *b, int8x16_t q[2]) { // nibble - 8
    uint8x16_t u[2];
    nib32(b->qs, u);
    for (int k = 0; k < 2; k++) q[k] = vsubq_s8(vreinterpretq_s8_u8(u[k]), vdupq_n_s8(8));
}
static inline void q4_1_unpack(const nm_block_q4_1 *b, int8x16_t q[2]) { // nibble
    uint8x16_t u[2];
    nib32(b->qs, u);
    for (int k = 0; k < 2; k++) q[k] = vreinterpretq_s8_u8(u[k]);
}
// q - 16: the nibble where the 5th bit is set, nibble | 0xf0 (nibble - 16 as int8) where clear.
static inline void q5_0_unpack(const nm_block_q5_0 *b, int8x16_t q[2]) {
    uint8x16_t u[2], h[2];
    nib32(b->qs, u);
    bits32(b->qh, h);
    for (int k = 0; k < 2; k++) q[k] = vreinterpretq_s8_u8(vorrq_u8(u[k], vbicq_u8(vdupq_n_u8(0xf0), h[k])));
}
static inline void q5_1_unpack(const nm_block_q5_1 *b, int8x16_t q[2]) { // 0..31
    uint8x16_t u[2], h[2];
    nib32(b->qs, u);
    bits32(b->qh, h);
    for (int k = 0; k < 2; k++) q[k] = vreinterpretq_s8_u8(vorrq_u8(u[k], vandq_u8(h[k], vdupq_n_u8(0x10))));
}
static inline void q8_unpack(const int8_t *qs, int8x16_t q[2]) {
    q[0] = vld1q_s8(qs);
    q[1] = vld1q_s8(qs + 16);
}
static inline void mxfp4_unpack(const nm_block_mxfp4 *b, int8x16_t q[2]) { // doubled E2M1 values
    const int8x16_t table = vld1q_s8(nm_kvalues_mxfp4);
    uint8x16_t u[2];
    nib32(b->qs, u);
    for (int k = 0; k < 2; k++) q[k] = vqtbl1q_s8(table, u[k]);
}

// Q4_K/Q5_K: the 8 six-bit scales and mins from the 12 packed bytes (see
// nm_get_scale_min_k4), four at a time in 32-bit words.
static inline void qk_sm_unpack(const uint8_t *s12, uint8_t sc[8], uint8_t mn[8]) {
    uint32_t u[3];
    memcpy(u, s12, 12);
    const uint32_t w[4] = {u[0] & 0x3f3f3f3f, (u[2] & 0x0f0f0f0f) | (((u[0] >> 6) & 0x03030303) << 4),
                           u[1] & 0x3f3f3f3f, ((u[2] >> 4) & 0x0f0f0f0f) | (((u[1] >> 6) & 0x03030303) << 4)};
    memcpy(sc, w, 8);
    memcpy(mn, w + 2, 8);
}

// Q6_K: the 32 quants (q - 32) of quarter k (0..3) of half h, from the low
// bits in ql (two 32-byte rows, low or high nibbles) and the 2-bit fields of qh.
static inline void q6_unpack(const nm_block_q6_K *b, int h, int k, int8x16_t q[2]) {
    const uint8_t *ql = b->ql + 64 * h + 32 * (k & 1), *qh = b->qh + 32 * h;
    for (int p = 0; p < 2; p++) {
        uint8x16_t lo = vld1q_u8(ql + 16 * p), hb = vld1q_u8(qh + 16 * p);
        lo = (k >> 1) ? vshrq_n_u8(lo, 4) : vandq_u8(lo, vdupq_n_u8(15));
        hb = vandq_u8(vshlq_u8(hb, vdupq_n_s8((int8_t)(4 - 2 * k))), vdupq_n_u8(0x30)); // bits 2k,2k+1 -> 4,5
        q[p] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo, hb)), vdupq_n_s8(32));
    }
}

// ---- fused dots against f32 activations ----------------------------------------------------

// sum q[i] * x[i] over 16 elements, as 4 partial lanes (two FMA chains).
static inline float32x4_t fdot16(int8x16_t q, const float *x) {
    const int16x8_t lo = vmovl_s8(vget_low_s8(q)), hi = vmovl_high_s8(q);
    float32x4_t s0 = vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), vld1q_f32(x));
    float32x4_t s1 = vmulq_f32(vcvtq_f32_s32(vmovl_high_s16(lo)), vld1q_f32(x + 4));
    s0 = vfmaq_f32(s0, vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), vld1q_f32(x + 8));
    s1 = vfmaq_f32(s1, vcvtq_f32_s32(vmovl_high_s16(hi)), vld1q_f32(x + 12));
    return vaddq_f32(s0, s1);
}
static inline float32x4_t fdot32(const int8x16_t q[2], const float *x) {
    return vaddq_f32(fdot16(q[0], x), fdot16(q[1], x + 16));
}
static inline float32x4_t fsum32(const float *x) {
    float32x4_t s0 = vaddq_f32(vld1q_f32(x), vld1q_f32(x + 4)), s1 = vaddq_f32(vld1q_f32(x + 8), vld1q_f32(x + 12));
    s0 = vaddq_f32(s0, vaddq_f32(vld1q_f32(x + 16), vld1q_f32(x + 20)));
    s1 = vaddq_f32(s1, vaddq_f32(vld1q_f32(x + 24), vld1q_f32(x + 28)));
    return vaddq_f32(s0, s1);
}

static float dot_f32(const void *restrict w, const float *restrict x, int64_t n) {
    const float *a = w;
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = vfmaq_f32(acc0, vld1q_f32(a + i), vld1q_f32(x + i));
        acc1 = vfmaq_f32(acc1, vld1q_f32(a + i + 4), vld1q_f32(x + i + 4));
        acc2 = vfmaq_f32(acc2, vld1q_f32(a + i + 8), vld1q_f32(x + i + 8));
        acc3 = vfmaq_f32(acc3, vld1q_f32(a + i + 12), vld1q_f32(x + i + 12));
    }
    for (; i + 4 <= n; i += 4) acc0 = vfmaq_f32(acc0, vld1q_f32(a + i), vld1q_f32(x + i));
    float s = vaddvq_f32(vaddq_f32(vaddq_f32(acc0, acc1), vaddq_f32(acc2, acc3)));
    for (; i < n; i++) s += a[i] * x[i];
    return s;
}

static inline float32x4_t load_f16x4(const uint16_t *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }
static inline float32x4_t load_bf16x4(const uint16_t *p) { return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16)); }

static float dot_f16(const void *restrict w, const float *restrict x, int64_t n) {
    const uint16_t *a = w;
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = acc0;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        acc0 = vfmaq_f32(acc0, load_f16x4(a + i), vld1q_f32(x + i));
        acc1 = vfmaq_f32(acc1, load_f16x4(a + i + 4), vld1q_f32(x + i + 4));
    }
    float s = vaddvq_f32(vaddq_f32(acc0, acc1));
    for (; i < n; i++) s += h2f(a[i]) * x[i];
    return s;
}
static float dot_bf16(const void *restrict w, const float *restrict x, int64_t n) {
    const uint16_t *a = w;
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = acc0;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        acc0 = vfmaq_f32(acc0, load_bf16x4(a + i), vld1q_f32(x + i));
        acc1 = vfmaq_f32(acc1, load_bf16x4(a + i + 4), vld1q_f32(x + i + 4));
    }
    float s = vaddvq_f32(vaddq_f32(acc0, acc1));
    for (; i < n; i++) s += nm_bf16_to_fp32(a[i]) * x[i];
    return s;
}
static void dequant_f16(const void *restrict src, float *restrict y, int64_t n) {
    const uint16_t *a = src;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, load_f16x4(a + i));
    for (; i < n; i++) y[i] = h2f(a[i]);
}
static void dequant_bf16(const void *restrict src, float *restrict y, int64_t n) {
    const uint16_t *a = src;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, load_bf16x4(a + i));
    for (; i < n; i++) y[i] = nm_bf16_to_fp32(a[i]);
}

// Symmetric 32-element formats: d * sum(q x) per block, two accumulators over
// alternate blocks so consecutive blocks don't wait on each other's FMA.
#define FDOT_BLOCK_LOOP(btype, unpack)                                                  \
    const btype *b = w;                                                                 \
    const int64_t nb = n / NM_QK;                                                       \
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = acc0;                                     \
    int8x16_t q[2];                                                                     \
    int64_t i = 0;                                                                      \
    for (; i + 1 < nb; i += 2) {                                                        \
        unpack(b + i, q);                                                               \
        acc0 = vfmaq_n_f32(acc0, fdot32(q, x + i * NM_QK), h2f(b[i].d));                \
        unpack(b + i + 1, q);                                                           \
        acc1 = vfmaq_n_f32(acc1, fdot32(q, x + (i + 1) * NM_QK), h2f(b[i + 1].d));      \
    }                                                                                   \
    if (i < nb) {                                                                       \
        unpack(b + i, q);                                                               \
        acc0 = vfmaq_n_f32(acc0, fdot32(q, x + i * NM_QK), h2f(b[i].d));                \
    }                                                                                   \
    return vaddvq_f32(vaddq_f32(acc0, acc1));

static inline void q8_0_unpack(const nm_block_q8_0 *b, int8x16_t q[2]) { q8_unpack(b->qs, q); }

static float dot_q8_0(const void *restrict w, const float *restrict x, int64_t n) {
    FDOT_BLOCK_LOOP(nm_block_q8_0, q8_0_unpack)
}
static float dot_q4_0(const void *restrict w, const float *restrict x, int64_t n) {
    FDOT_BLOCK_LOOP(nm_block_q4_0, q4_0_unpack)
}
static float dot_q5_0(const void *restrict w, const float *restrict x, int64_t n) {
    FDOT_BLOCK_LOOP(nm_block_q5_0, q5_0_unpack)
}
#undef FDOT_BLOCK_LOOP

// w = d*q + m: d * sum(q x) + m * sum(x).
static float dot_q4_1(const void *restrict w, const float *restrict x, int64_t n) {
    const nm_block_q4_1 *b = w;
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = acc0;
    int8x16_t q[2];
    for (int64_t i = 0; i < n / NM_QK; i++, x += NM_QK) {
        q4_1_unpack(b + i, q);
        acc0 = vfmaq_n_f32(acc0, fdot32(q, x), h2f(b[i].d));
        acc1 = vfmaq_n_f32(acc1, fsum32(x), h2f(b[i].m));
    }
    return vaddvq_f32(vaddq_f32(acc0, acc1));
}

// Per 32-element sub-block j: d*sc_j * sum(q x) - dmin*m_j * sum(x).
static float dot_q4_K(const void *restrict w, const float *restrict x, int64_t n) {
    const nm_block_q4_K *b = w;
    float32x4_t acc = vdupq_n_f32(0);
    uint8_t sc[8], mn[8];
    for (int64_t i = 0; i < n / NM_QK_K; i++, x += NM_QK_K) {
        qk_sm_unpack(b[i].scales, sc, mn);
        float32x4_t qx = vdupq_n_f32(0), mx = qx;
        for (int c = 0; c < 4; c++) {
            uint8x16_t u0[2], u1[2];
            nib32(b[i].qs + 32 * c, u0);      // elements 64c + 0..15 (low), 64c + 32..47 (high)
            nib32(b[i].qs + 32 * c + 16, u1); // elements 64c + 16..31, 64c + 48..63
            const int8x16_t lo[2] = {vreinterpretq_s8_u8(u0[0]), vreinterpretq_s8_u8(u1[0])};
            const int8x16_t hi[2] = {vreinterpretq_s8_u8(u0[1]), vreinterpretq_s8_u8(u1[1])};
            const float *xc = x + 64 * c;
            qx = vfmaq_n_f32(qx, fdot32(lo, xc), (float)sc[2 * c]);
            qx = vfmaq_n_f32(qx, fdot32(hi, xc + 32), (float)sc[2 * c + 1]);
            mx = vfmaq_n_f32(mx, fsum32(xc), (float)mn[2 * c]);
            mx = vfmaq_n_f32(mx, fsum32(xc + 32), (float)mn[2 * c + 1]);
        }
        acc = vfmaq_n_f32(acc, qx, h2f(b[i].d));
        acc = vfmaq_n_f32(acc, mx, -h2f(b[i].dmin));
    }
    return vaddvq_f32(acc);
}

static float dot_q6_K(const void *restrict w, const float *restrict x, int64_t n) {
    const nm_block_q6_K *b = w;
    float32x4_t acc = vdupq_n_f32(0);
    int8x16_t q[2];
    for (int64_t i = 0; i < n / NM_QK_K; i++, x += NM_QK_K) {
        float32x4_t bs = vdupq_n_f32(0);
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 4; k++) {
                const int g = 8 * h + 2 * k; // groups g, g+1: elements 128h + 32k + 0..31
                q6_unpack(&b[i], h, k, q);
                bs = vfmaq_n_f32(bs, fdot16(q[0], x + 16 * g), (float)b[i].scales[g]);
                bs = vfmaq_n_f32(bs, fdot16(q[1], x + 16 * g + 16), (float)b[i].scales[g + 1]);
            }
        acc = vfmaq_n_f32(acc, bs, h2f(b[i].d));
    }
    return vaddvq_f32(acc);
}

// (float)q * d per element, exactly the ref's product.
static inline void store_scaled(const int8x16_t q[2], float d, float *y) {
    for (int k = 0; k < 2; k++) {
        const int16x8_t lo = vmovl_s8(vget_low_s8(q[k])), hi = vmovl_high_s8(q[k]);
        vst1q_f32(y + 16 * k, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), d));
        vst1q_f32(y + 16 * k + 4, vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(lo)), d));
        vst1q_f32(y + 16 * k + 8, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), d));
        vst1q_f32(y + 16 * k + 12, vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(hi)), d));
    }
}
static void dequant_q8_0(const void *restrict src, float *restrict y, int64_t n) {
    const nm_block_q8_0 *b = src;
    int8x16_t q[2];
    for (int64_t i = 0; i < n / NM_QK; i++, y += NM_QK) {
        q8_unpack(b[i].qs, q);
        store_scaled(q, h2f(b[i].d), y);
    }
}
static void dequant_q4_0(const void *restrict src, float *restrict y, int64_t n) {
    const nm_block_q4_0 *b = src;
    int8x16_t q[2];
    for (int64_t i = 0; i < n / NM_QK; i++, y += NM_QK) {
        q4_0_unpack(b + i, q);
        store_scaled(q, h2f(b[i].d), y);
    }
}
static void dequant_q5_0(const void *restrict src, float *restrict y, int64_t n) {
    const nm_block_q5_0 *b = src;
    int8x16_t q[2];
    for (int64_t i = 0; i < n / NM_QK; i++, y += NM_QK) {
        q5_0_unpack(b + i, q);
        store_scaled(q, h2f(b[i].d), y);
    }
}

// ---- activation quantizers ---------------------------------------------------------------

static void quant_act_f32(const float *restrict x, void *restrict xq, int64_t n) {
    memcpy(xq, x, (size_t)n * sizeof(float));
}

static void quant_act_f16(const float *restrict x, void *restrict xq, int64_t n) {
    uint16_t *h = xq;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1_u16(h + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
    for (; i < n; i++) h[i] = f2h(x[i]);
}

// Round to nearest even on the bits; NaN keeps its top bits and is made quiet.
static void quant_act_bf16(const float *restrict x, void *restrict xq, int64_t n) {
    uint16_t *h = xq;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const uint32x4_t u = vreinterpretq_u32_f32(vld1q_f32(x + i));
        const uint32x4_t rn = vaddq_u32(vaddq_u32(u, vdupq_n_u32(0x7fff)), vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1)));
        const uint32x4_t nan = vcgtq_u32(vandq_u32(u, vdupq_n_u32(0x7fffffff)), vdupq_n_u32(0x7f800000));
        const uint32x4_t r = vbslq_u32(nan, vorrq_u32(u, vdupq_n_u32(0x400000)), rn);
        vst1_u16(h + i, vshrn_n_u32(r, 16));
    }
    for (; i < n; i++) h[i] = nm_fp32_to_bf16(x[i]);
}

// One q8_0/q8_1 block: id = 127/amax, round half to even, then what x86's
// vcvtps2dq gives (INT32_MIN out of range or NaN; AArch64's FCVTZS would
// saturate instead), and a saturating narrow. Returns d; *sum = wrapping int32
// sum of the unsaturated quants.
static inline float quant_act_q8_block(const float *x, int8_t *qs, int32_t *sum) {
    float32x4_t v[8], m = vdupq_n_f32(0);
    for (int k = 0; k < 8; k++) {
        v[k] = vld1q_f32(x + 4 * k);
        m = vmaxnmq_f32(m, vabsq_f32(v[k])); // NaN ignored, as fmaxf does
    }
    const float amax = vmaxnmvq_f32(m);
    const float d = amax / 127.f;
    const float id = amax != 0.0f ? 127.f / amax : 0.0f;
    const float32x4_t lim = vdupq_n_f32(2147483648.0f);
    int32x4_t q[8], s = vdupq_n_s32(0);
    for (int k = 0; k < 8; k++) {
        const float32x4_t r = vrndnq_f32(vmulq_n_f32(v[k], id));
        q[k] = vbslq_s32(vcaltq_f32(r, lim), vcvtq_s32_f32(r), vdupq_n_s32(INT32_MIN));
        s = vaddq_s32(s, q[k]);
    }
    *sum = vaddvq_s32(s);
    for (int k = 0; k < 2; k++) {
        const int16x8_t a = vcombine_s16(vqmovn_s32(q[4 * k]), vqmovn_s32(q[4 * k + 1]));
        const int16x8_t b = vcombine_s16(vqmovn_s32(q[4 * k + 2]), vqmovn_s32(q[4 * k + 3]));
        vst1q_s8(qs + 16 * k, vcombine_s8(vqmovn_s16(a), vqmovn_s16(b)));
    }
    return d;
}

static void quant_act_q8_0(const float *restrict x, void *restrict xq, int64_t n) {
    nm_block_q8_0 *b = xq;
    for (int64_t i = 0; i < n / NM_QK; i++, x += NM_QK) {
        int32_t sum;
        b[i].d = f2h(quant_act_q8_block(x, b[i].qs, &sum));
    }
}

static void quant_act_q8_1(const float *restrict x, void *restrict xq, int64_t n) {
    nm_block_q8_1 *b = xq;
    for (int64_t i = 0; i < n / NM_QK; i++, x += NM_QK) {
        int32_t sum;
        const float d = quant_act_q8_block(x, b[i].qs, &sum);
        b[i].d = f2h(d);
        b[i].s = f2h(d * (float)sum);
    }
}

// quantize_row_q8_K_ref: the first element of largest |x| maps to -127
// exactly; FCVTNS rounds half to even like nearest_int.
static void quant_act_q8_K(const float *restrict x, void *restrict xq, int64_t n) {
    nm_block_q8_K *b = xq;
    for (int64_t i = 0; i < n / NM_QK_K; i++, x += NM_QK_K) {
        float32x4_t m = vdupq_n_f32(0);
        for (int j = 0; j < NM_QK_K; j += 4) m = vmaxnmq_f32(m, vabsq_f32(vld1q_f32(x + j)));
        const float amax = vmaxnmvq_f32(m);
        if (!amax) {
            memset(&b[i], 0, sizeof b[i]);
            continue;
        }
        int j0 = 0;
        while (fabsf(x[j0]) != amax) j0++;
        const float iscale = -127.f / x[j0];
        // amax < 127 / FLT_MAX: the ref's nearest_int of +-inf and NaN is 0 mod 256
        // (all quants 0), where FCVTNS would saturate.
        if (isinf(iscale)) {
            memset(&b[i], 0, sizeof b[i]);
            b[i].d = 1 / iscale;
            continue;
        }
        for (int j = 0; j < NM_QK_K; j += 16) {
            int32x4_t q[4];
            for (int k = 0; k < 4; k++)
                q[k] = vminq_s32(vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + j + 4 * k), iscale)), vdupq_n_s32(127));
            const int16x8_t a = vcombine_s16(vqmovn_s32(q[0]), vqmovn_s32(q[1]));
            const int16x8_t c = vcombine_s16(vqmovn_s32(q[2]), vqmovn_s32(q[3]));
            const int8x16_t p = vcombine_s8(vqmovn_s16(a), vqmovn_s16(c));
            vst1q_s8(b[i].qs + j, p);
            b[i].bsums[j / 16] = vaddlvq_s8(p);
        }
        b[i].d = 1 / iscale;
    }
}

// ---- integer dots against quantized activations --------------------------------------------

static float dotq_f32(const void *restrict w, const void *restrict xq, int64_t n) { return dot_f32(w, xq, n); }

static float dotq_f16(const void *restrict w, const void *restrict xq, int64_t n) {
    const uint16_t *a = w, *b = xq;
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = acc0;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        acc0 = vfmaq_f32(acc0, load_f16x4(a + i), load_f16x4(b + i));
        acc1 = vfmaq_f32(acc1, load_f16x4(a + i + 4), load_f16x4(b + i + 4));
    }
    float s = vaddvq_f32(vaddq_f32(acc0, acc1));
    for (; i < n; i++) s += h2f(a[i]) * h2f(b[i]);
    return s;
}

static float dotq_bf16(const void *restrict w, const void *restrict xq, int64_t n) {
    const uint16_t *a = w, *b = xq;
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = acc0;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        acc0 = vfmaq_f32(acc0, load_bf16x4(a + i), load_bf16x4(b + i));
        acc1 = vfmaq_f32(acc1, load_bf16x4(a + i + 4), load_bf16x4(b + i + 4));
    }
    float s = vaddvq_f32(vaddq_f32(acc0, acc1));
    for (; i < n; i++) s += nm_bf16_to_fp32(a[i]) * nm_bf16_to_fp32(b[i]);
    return s;
}

// 32-element blocks: an exact int32 sum per block, one FMA with d_w * d_x;
// two accumulators over alternate blocks. The min formats (q4_1, q5_1) add
// m_w * s_x, summed in scalar.
#define DOTQ_BLOCK(k, j, unpack, dscale, minterm)                                                                       \
    {                                                                                            \
        unpack(xw + (j), q);                                                                     \
        const int32x4_t p = dot_i8x32(q, ya[j].qs, dp);                                          \
        acc##k = vfmaq_n_f32(acc##k, vcvtq_f32_s32(p), dscale(xw + (j), ya + (j)));              \
        minterm(xw + (j), ya + (j));                                                             \
    }
#define DOTQ_BLOCK_LOOP(wtype, ytype, unpack, dscale, minterm)                                   \
    const wtype *xw = w;                                                                         \
    const ytype *ya = xq;                                                                        \
    const int64_t nb = n / NM_QK;                                                                \
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = acc0;                                              \
    float summs = 0;                                                                             \
    int8x16_t q[2];                                                                              \
    int64_t i = 0;                                                                               \
    for (; i + 1 < nb; i += 2) {                                                                 \
        DOTQ_BLOCK(0, i, unpack, dscale, minterm)                                                \
        DOTQ_BLOCK(1, i + 1, unpack, dscale, minterm)                                            \
    }                                                                                            \
    if (i < nb) DOTQ_BLOCK(0, i, unpack, dscale, minterm)                                        \
    return vaddvq_f32(vaddq_f32(acc0, acc1)) + summs;

#define D_WD(xb, yb) (h2f((xb)->d) * h2f((yb)->d))
#define D_MXFP4(xb, yb) (h2f((yb)->d) * e8m0_half((xb)->e))
#define NO_MIN(xb, yb) (void)0
#define ADD_MIN(xb, yb) (summs += h2f((xb)->m) * h2f((yb)->s))

static inline void q8_1_unpack(const nm_block_q8_1 *b, int8x16_t q[2]) { q8_unpack(b->qs, q); }

NM_ALWAYS_INLINE float dotq_q4_0_body(const void *restrict w, const void *restrict xq, int64_t n, const bool dp) {
    DOTQ_BLOCK_LOOP(nm_block_q4_0, nm_block_q8_0, q4_0_unpack, D_WD, NO_MIN)
}
NM_ALWAYS_INLINE float dotq_q4_1_body(const void *restrict w, const void *restrict xq, int64_t n, const bool dp) {
    DOTQ_BLOCK_LOOP(nm_block_q4_1, nm_block_q8_1, q4_1_unpack, D_WD, ADD_MIN)
}
NM_ALWAYS_INLINE float dotq_q5_0_body(const void *restrict w, const void *restrict xq, int64_t n, const bool dp) {
    DOTQ_BLOCK_LOOP(nm_block_q5_0, nm_block_q8_0, q5_0_unpack, D_WD, NO_MIN)
}
NM_ALWAYS_INLINE float dotq_q5_1_body(const void *restrict w, const void *restrict xq, int64_t n, const bool dp) {
    DOTQ_BLOCK_LOOP(nm_block_q5_1, nm_block_q8_1, q5_1_unpack, D_WD, ADD_MIN)
}
NM_ALWAYS_INLINE float dotq_q8_0_body(const void *restrict w, const void *restrict xq, int64_t n, const bool dp) {
    DOTQ_BLOCK_LOOP(nm_block_q8_0, nm_block_q8_0, q8_0_unpack, D_WD, NO_MIN)
}
NM_ALWAYS_INLINE float dotq_q8_1_body(const void *restrict w, const void *restrict xq, int64_t n, const bool dp) {
    DOTQ_BLOCK_LOOP(nm_block_q8_1, nm_block_q8_1, q8_1_unpack, D_WD, NO_MIN)
}
NM_ALWAYS_INLINE float dotq_mxfp4_body(const void *restrict w, const void *restrict xq, int64_t n, const bool dp) {
    DOTQ_BLOCK_LOOP(nm_block_mxfp4, nm_block_q8_0, mxfp4_unpack, D_MXFP4, NO_MIN)
}
#undef DOTQ_BLOCK_LOOP
#undef DOTQ_BLOCK

// K formats: a whole super-block sums in int32 (|q6 - 32| * 128 * 128 * 256 <
// 2^31), scaled per 16 or 32 elements in the integer lanes; one f32 step per
// super-block with d_w * d_x; the min terms from the q8_K bsums.

// sum_j mn[j] * (bsums[2j] + bsums[2j+1]); the pair sums fit int16 (|.| <= 32 * 128).
static inline int32_t qk_min_term(const uint8_t mn[8], const int16_t *bsums) {
    const int16x8_t pairs = vpaddq_s16(vld1q_s16(bsums), vld1q_s16(bsums + 8));
    const int16x8_t m = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(mn)));
    return vaddvq_s32(vaddq_s32(vmull_s16(vget_low_s16(pairs), vget_low_s16(m)), vmull_high_s16(pairs, m)));
}

// Q4_K/Q5_K body; h5 adds the 5th bits of Q5_K (qh: bit 2c of byte l for
// element 64c + l, bit 2c+1 for 64c + 32 + l).
NM_ALWAYS_INLINE float dotq_qk_body(const uint8_t *scales, uint16_t dh, uint16_t dminh, const uint8_t *qs,
                                    const uint8_t *qh, const nm_block_q8_K *y, const bool dp) {
    uint8_t sc[8], mn[8];
    qk_sm_unpack(scales, sc, mn);
    int32x4_t isum = vdupq_n_s32(0);
    for (int c = 0; c < 4; c++) {
        uint8x16_t u0[2], u1[2];
        nib32(qs + 32 * c, u0);      // elements 64c + 0..15 (low nibbles), 64c + 32..47 (high)
        nib32(qs + 32 * c + 16, u1); // elements 64c + 16..31, 64c + 48..63
        uint8x16_t lo[2] = {u0[0], u1[0]}, hi[2] = {u0[1], u1[1]};
        if (qh) {
            const int8x16_t sh_lo = vdupq_n_s8((int8_t)(4 - 2 * c)), sh_hi = vdupq_n_s8((int8_t)(3 - 2 * c));
            for (int p = 0; p < 2; p++) {
                const uint8x16_t h = vld1q_u8(qh + 16 * p);
                lo[p] = vorrq_u8(lo[p], vandq_u8(vshlq_u8(h, sh_lo), vdupq_n_u8(0x10)));
                hi[p] = vorrq_u8(hi[p], vandq_u8(vshlq_u8(h, sh_hi), vdupq_n_u8(0x10)));
            }
        }
        const int8_t *q8 = y->qs + 64 * c;
        int32x4_t p0 = dot_i8(vdupq_n_s32(0), vreinterpretq_s8_u8(lo[0]), vld1q_s8(q8), dp);
        p0 = dot_i8(p0, vreinterpretq_s8_u8(lo[1]), vld1q_s8(q8 + 16), dp);
        int32x4_t p1 = dot_i8(vdupq_n_s32(0), vreinterpretq_s8_u8(hi[0]), vld1q_s8(q8 + 32), dp);
        p1 = dot_i8(p1, vreinterpretq_s8_u8(hi[1]), vld1q_s8(q8 + 48), dp);
        isum = vmlaq_n_s32(isum, p0, sc[2 * c]);
        isum = vmlaq_n_s32(isum, p1, sc[2 * c + 1]);
    }
    const float d = h2f(dh) * y->d, dmin = h2f(dminh) * y->d;
    return d * (float)vaddvq_s32(isum) - dmin * (float)qk_min_term(mn, y->bsums);
}

NM_ALWAYS_INLINE float dotq_q4_K_body(const void *restrict w, const void *restrict xq, int64_t n, const bool dp) {
    const nm_block_q4_K *x = w;
    const nm_block_q8_K *y = xq;
    float s = 0;
    for (int64_t i = 0; i < n / NM_QK_K; i++) s += dotq_qk_body(x[i].scales, x[i].d, x[i].dmin, x[i].qs, NULL, &y[i], dp);
    return s;
}
NM_ALWAYS_INLINE float dotq_q5_K_body(const void *restrict w, const void *restrict xq, int64_t n, const bool dp) {
    const nm_block_q5_K *x = w;
    const nm_block_q8_K *y = xq;
    float s = 0;
    for (int64_t i = 0; i < n / NM_QK_K; i++)
        s += dotq_qk_body(x[i].scales, x[i].d, x[i].dmin, x[i].qs, x[i].qh, &y[i], dp);
    return s;
}

NM_ALWAYS_INLINE float dotq_q6_K_body(const void *restrict w, const void *restrict xq, int64_t n, const bool dp) {
    const nm_block_q6_K *x = w;
    const nm_block_q8_K *y = xq;
    float s = 0;
    int8x16_t q[2];
    for (int64_t i = 0; i < n / NM_QK_K; i++) {
        int32x4_t isum = vdupq_n_s32(0);
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 4; k++) {
                const int g = 8 * h + 2 * k; // groups g, g+1: elements 128h + 32k + 0..31
                q6_unpack(&x[i], h, k, q);
                isum = vmlaq_n_s32(isum, dot_i8(vdupq_n_s32(0), q[0], vld1q_s8(y[i].qs + 16 * g), dp), x[i].scales[g]);
                isum = vmlaq_n_s32(isum, dot_i8(vdupq_n_s32(0), q[1], vld1q_s8(y[i].qs + 16 * g + 16), dp),
                                   x[i].scales[g + 1]);
            }
        s += (h2f(x[i].d) * y[i].d) * (float)vaddvq_s32(isum);
    }
    return s;
}

// Not in ggml (no q8_K weights there): d_w d_x sum(q_w q_x).
NM_ALWAYS_INLINE float dotq_q8_K_body(const void *restrict w, const void *restrict xq, int64_t n, const bool dp) {
    const nm_block_q8_K *x = w;
    const nm_block_q8_K *y = xq;
    float s = 0;
    for (int64_t i = 0; i < n / NM_QK_K; i++) {
        int32x4_t p = vdupq_n_s32(0);
        for (int j = 0; j < NM_QK_K; j += 16) p = dot_i8(p, vld1q_s8(x[i].qs + j), vld1q_s8(y[i].qs + j), dp);
        s += (x[i].d * y[i].d) * (float)vaddvq_s32(p);
    }
    return s;
}

// The two builds of each body.
static float dotq_q4_0(const void *restrict w, const void *restrict xq, int64_t n) {
    return dotq_q4_0_body(w, xq, n, false);
}
static float dotq_q4_1(const void *restrict w, const void *restrict xq, int64_t n) {
    return dotq_q4_1_body(w, xq, n, false);
}
static float dotq_q5_0(const void *restrict w, const void *restrict xq, int64_t n) {
    return dotq_q5_0_body(w, xq, n, false);
}
static float dotq_q5_1(const void *restrict w, const void *restrict xq, int64_t n) {
    return dotq_q5_1_body(w, xq, n, false);
}
static float dotq_q8_0(const void *restrict w, const void *restrict xq, int64_t n) {
    return dotq_q8_0_body(w, xq, n, false);
}
static float dotq_q8_1(const void *restrict w, const void *restrict xq, int64_t n) {
    return dotq_q8_1_body(w, xq, n, false);
}
static float dotq_mxfp4(const void *restrict w, const void *restrict xq, int64_t n) {
    return dotq_mxfp4_body(w, xq, n, false);
}
static float dotq_q4_K(const void *restrict w, const void *restrict xq, int64_t n) {
    return dotq_q4_K_body(w, xq, n, false);
}
static float dotq_q5_K(const void *restrict w, const void *restrict xq, int64_t n) {
    return dotq_q5_K_body(w, xq, n, false);
}
static float dotq_q6_K(const void *restrict w, const void *restrict xq, int64_t n) {
    return dotq_q6_K_body(w, xq, n, false);
}
static float dotq_q8_K(const void *restrict w, const void *restrict xq, int64_t n) {
    return dotq_q8_K_body(w, xq, n, false);
}

NM_TARGET_DOTPROD static float dotq_q4_0_dp(const void *restrict w, const void *restrict xq, int64_t n) {
    return dotq_q4_0_body(w, xq, n, true);
}
NM_TARGET_DOTPROD static float dotq_q4_1_dp(const void *restrict w, const void *restrict xq, int64_t n) {
    return dotq_q4_1_body(w, xq, n, true);
}
NM_TARGET_DOTPROD static float dotq_q5_0_dp(const void *restrict w, const void *restrict xq, int64_t n) {
    return dotq_q5_0_body(w, xq, n, true);
}
NM_TARGET_DOTPROD static float dotq_q5_1_dp(const void *restrict w, const void *restrict xq, int64_t n) {
    return dotq_q5_1_body(w, xq, n, true);
}
NM_TARGET_DOTPROD static float dotq_q8_0_dp(const void *restrict w, const void *restrict xq, int64_t n) {
    return dotq_q8_0_body(w, xq, n, true);
}
NM_TARGET_DOTPROD static float dotq_q8_1_dp(const void *restrict w, const void *restrict xq, int64_t n) {
    return dotq_q8_1_body(w, xq, n, true);
}
NM_TARGET_DOTPROD static float dotq_mxfp4_dp(const void *restrict w, const void *restrict xq, int64_t n) {
    return dotq_mxfp4_body(w, xq, n, true);
}
NM_TARGET_DOTPROD static float dotq_q4_K_dp(const void *restrict w, const void *restrict xq, int64_t n) {
    return dotq_q4_K_body(w, xq, n, true);
}
NM_TARGET_DOTPROD static float dotq_q5_K_dp(const void *restrict w, const void *restrict xq, int64_t n) {
    return dotq_q5_K_body(w, xq, n, true);
}
NM_TARGET_DOTPROD static float dotq_q6_K_dp(const void *restrict w, const void *restrict xq, int64_t n) {
    return dotq_q6_K_body(w, xq, n, true);
}
NM_TARGET_DOTPROD static float dotq_q8_K_dp(const void *restrict w, const void *restrict xq, int64_t n) {
    return dotq_q8_K_body(w, xq, n, true);
}

// ---- tables ----------------------------------------------------------------------------------

static const nm_kernels neon_table = {
    .name = "neon",
    .dot =
        {
            [NM_TYPE_F32] = dot_f32,
            [NM_TYPE_F16] = dot_f16,
            [NM_TYPE_BF16] = dot_bf16,
            [NM_TYPE_Q4_0] = dot_q4_0,
            [NM_TYPE_Q4_1] = dot_q4_1,
            [NM_TYPE_Q5_0] = dot_q5_0,
            [NM_TYPE_Q8_0] = dot_q8_0,
            [NM_TYPE_Q4_K] = dot_q4_K,
            [NM_TYPE_Q6_K] = dot_q6_K,
        },
    .dequant =
        {
            [NM_TYPE_F16] = dequant_f16,
            [NM_TYPE_BF16] = dequant_bf16,
            [NM_TYPE_Q4_0] = dequant_q4_0,
            [NM_TYPE_Q5_0] = dequant_q5_0,
            [NM_TYPE_Q8_0] = dequant_q8_0,
        },
    .dotq =
        {
            [NM_TYPE_F32] = dotq_f32,
            [NM_TYPE_F16] = dotq_f16,
            [NM_TYPE_BF16] = dotq_bf16,
            [NM_TYPE_Q4_0] = dotq_q4_0,
            [NM_TYPE_Q4_1] = dotq_q4_1,
            [NM_TYPE_Q5_0] = dotq_q5_0,
            [NM_TYPE_Q5_1] = dotq_q5_1,
            [NM_TYPE_Q8_0] = dotq_q8_0,
            [NM_TYPE_Q8_1] = dotq_q8_1,
            [NM_TYPE_MXFP4] = dotq_mxfp4,
            [NM_TYPE_Q4_K] = dotq_q4_K,
            [NM_TYPE_Q5_K] = dotq_q5_K,
            [NM_TYPE_Q6_K] = dotq_q6_K,
            [NM_TYPE_Q8_K] = dotq_q8_K,
        },
    .quant_act =
        {
            [NM_TYPE_F32] = quant_act_f32,
            [NM_TYPE_F16] = quant_act_f16,
            [NM_TYPE_BF16] = quant_act_bf16,
            [NM_TYPE_Q8_0] = quant_act_q8_0,
            [NM_TYPE_Q8_1] = quant_act_q8_1,
            [NM_TYPE_Q8_K] = quant_act_q8_K,
        },
    .gemmq =
        {
            [NM_TYPE_Q4_0] = nm_gemmq_q4_0_neon,
            [NM_TYPE_Q4_1] = nm_gemmq_q4_1_neon,
            [NM_TYPE_Q5_0] = nm_gemmq_q5_0_neon,
            [NM_TYPE_Q5_1] = nm_gemmq_q5_1_neon,
            [NM_TYPE_Q8_0] = nm_gemmq_q8_0_neon,
            [NM_TYPE_MXFP4] = nm_gemmq_mxfp4_neon,
            [NM_TYPE_Q4_K] = nm_gemmq_q4_K_neon,
            [NM_TYPE_Q5_K] = nm_gemmq_q5_K_neon,
            [NM_TYPE_Q6_K] = nm_gemmq_q6_K_neon,
        },
};

static const nm_kernels neon_dotprod_table = {
    .name = "neon+dotprod",
    .dotq =
        {
            [NM_TYPE_Q4_0] = dotq_q4_0_dp,
            [NM_TYPE_Q4_1] = dotq_q4_1_dp,
            [NM_TYPE_Q5_0] = dotq_q5_0_dp,
            [NM_TYPE_Q5_1] = dotq_q5_1_dp,
            [NM_TYPE_Q8_0] = dotq_q8_0_dp,
            [NM_TYPE_Q8_1] = dotq_q8_1_dp,
            [NM_TYPE_MXFP4] = dotq_mxfp4_dp,
            [NM_TYPE_Q4_K] = dotq_q4_K_dp,
            [NM_TYPE_Q5_K] = dotq_q5_K_dp,
            [NM_TYPE_Q6_K] = dotq_q6_K_dp,
            [NM_TYPE_Q8_K] = dotq_q8_K_dp,
        },
    .gemmq =
        {
            [NM_TYPE_Q4_0] = nm_gemmq_q4_0_neon_dp,
            [NM_TYPE_Q4_1] = nm_gemmq_q4_1_neon_dp,
            [NM_TYPE_Q5_0] = nm_gemmq_q5_0_neon_dp,
            [NM_TYPE_Q5_1] = nm_gemmq_q5_1_neon_dp,
            [NM_TYPE_Q8_0] = nm_gemmq_q8_0_neon_dp,
            [NM_TYPE_MXFP4] = nm_gemmq_mxfp4_neon_dp,
            [NM_TYPE_Q4_K] = nm_gemmq_q4_K_neon_dp,
            [NM_TYPE_Q5_K] = nm_gemmq_q5_K_neon_dp,
            [NM_TYPE_Q6_K] = nm_gemmq_q6_K_neon_dp,
        },
};

const nm_kernels *nm_kernels_neon(void) { return &neon_table; }
const nm_kernels *nm_kernels_neon_dotprod(void) { return &neon_dotprod_table; }
