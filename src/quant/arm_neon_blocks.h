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

#endif
