// Internal to src/quant/arm_*.c: the small NEON helpers the dot products
// (arm_neon.c) and the prefill tiles (arm_gemmq.c) share. Static inline, one
// copy per file that includes it.
#ifndef NM_QUANT_ARM_NEON_BLOCKS_H
#define NM_QUANT_ARM_NEON_BLOCKS_H

#include <arm_neon.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#define NM_ALWAYS_INLINE static inline __attribute__((always_inline))
#if defined(__clang__)
#define NM_TARGET_DOTPROD __attribute__((target("dotprod")))
#else
#define NM_TARGET_DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))
#endif

// fp16 <-> fp32 with FCVT (single rounding, nearest even; NaN kept quiet with
// its top payload bits, as nm_fp32_to_fp16 does).
static inline float h2f(uint16_t h) {
    __fp16 f;
    memcpy(&f, &h, sizeof f);
    return (float)f;
}
static inline uint16_t f2h(float f) {
    __fp16 h = (__fp16)f;
    uint16_t u;
    memcpy(&u, &h, sizeof u);
    return u;
}

// nm_e8m0_to_fp32_half inlined: 2^(e-128), e = 0 and 1 being fp32 subnormals.
static inline float e8m0_half(uint8_t e) {
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

// acc + sum of a[i]*b[i] in groups of four per lane. Plain NEON: the int16
// products (|.| <= 128 * 128) are pairwise added into the int32 lanes.
static inline int32x4_t dot_mull(int32x4_t acc, int8x16_t a, int8x16_t b) {
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
    return vpadalq_s16(acc, vmull_high_s8(a, b));
}
NM_TARGET_DOTPROD static inline int32x4_t dot_sdot(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__clang__) && !defined(__ARM_FEATURE_DOTPROD)
    // clang 14's arm_neon.h declares vdotq_s32 only under a dotprod -march;
    // the target attribute lets the assembler take sdot here.
    __asm__("sdot %0.4s, %1.16b, %2.16b" : "+w"(acc) : "w"(a), "w"(b));
    return acc;
#else
    return vdotq_s32(acc, a, b);
#endif
}
// Lane contents differ between the two; lane sums are equal.
NM_ALWAYS_INLINE int32x4_t dot_i8(int32x4_t acc, int8x16_t a, int8x16_t b, const bool dp) {
    return dp ? dot_sdot(acc, a, b) : dot_mull(acc, a, b);
}

// 16 nibble bytes -> 32 quants in element order: low nibbles 0..15, high 16..31.
static inline void nib32(const uint8_t *qs, uint8x16_t q[2]) {
    const uint8x16_t v = vld1q_u8(qs);
    q[0] = vandq_u8(v, vdupq_n_u8(15));
    q[1] = vshrq_n_u8(v, 4);
}

// Byte j = 0xff where bit j of the 32-bit qh is set.
static inline void bits32(const uint8_t qh4[4], uint8x16_t out[2]) {
    static const uint8_t sel[2][16] = {{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1},
                                       {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3}};
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    uint32_t qh;
    memcpy(&qh, qh4, 4);
    const uint8x16_t v = vreinterpretq_u8_u32(vdupq_n_u32(qh)), m = vld1q_u8(bit);
    out[0] = vtstq_u8(vqtbl1q_u8(v, vld1q_u8(sel[0])), m);
    out[1] = vtstq_u8(vqtbl1q_u8(v, vld1q_u8(sel[1])), m);
}

#endif
