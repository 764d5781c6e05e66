// IEEE binary16, bfloat16 and E8M0 conversions, exact and round-to-nearest-even.
#include <string.h>

#include "quant/kernels_impl.h"

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float nm_fp16_to_fp32(uint16_t h) { return nm_half_to_float(h); }

uint16_t nm_fp32_to_fp16(float f) {
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) // NaN: keep the top payload bits, force quiet
        return (uint16_t)(sign | 0x7e00 | ((a >> 13) & 0x3ff));
    if (a >= 0x477ff000u) // >= 65520 rounds past 65504 (ties go to the even inf)
        return (uint16_t)(sign | 0x7c00);
    if (a < 0x38800000u) { // below 2^-14: a half subnormal, in units of 2^-24
        uint32_t exp = a >> 23;
        int shift = 126 - (int)exp; // mant * 2^(exp-150) / 2^-24 = mant >> shift
        if (exp == 0 || shift > 24) return sign; // under half an ulp: +-0
        uint32_t mant = (a & 0x7fffff) | 0x800000;
        uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++; // may carry into the smallest normal: fine
        return (uint16_t)(sign | q);
    }
    uint32_t h = ((((a >> 23) - 112) << 10) | ((a >> 13) & 0x3ff));
    uint32_t rem = a & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++; // carry into the exponent is correct
    return (uint16_t)(sign | h);
}

float nm_bf16_to_fp32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t nm_fp32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); // quiet NaN
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

float nm_e8m0_to_fp32_half(uint8_t e) {
    // 2^(e-128): e = 0 and 1 land on fp32 subnormals (2^-128, 2^-127).
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    return bits_f32(bits);
}
