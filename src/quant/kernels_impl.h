// Internal to src/quant: GGUF block layouts and the per-type kernels.
//
// Layouts follow ggml-common.h of llama.cpp byte for byte (that is what a GGUF
// file holds): https://github.com/ggml-org/llama.cpp/blob/master/ggml/src/ggml-common.h
// fp16 fields are raw IEEE binary16 bits.
#ifndef NM_QUANT_KERNELS_IMPL_H
#define NM_QUANT_KERNELS_IMPL_H

#include <string.h>

#include "quant/quant.h"

typedef struct { uint16_t d; uint8_t qs[NM_QK / 2]; } nm_block_q4_0;                 // q = nib - 8
typedef struct { uint16_t d, m; uint8_t qs[NM_QK / 2]; } nm_block_q4_1;              // d*nib + m
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[NM_QK / 2]; } nm_block_q5_0;  // q = (nib|h<<4) - 16
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[NM_QK / 2]; } nm_block_q5_1;
typedef struct { uint16_t d; int8_t qs[NM_QK]; } nm_block_q8_0;
typedef struct { uint16_t d, s; int8_t qs[NM_QK]; } nm_block_q8_1; // s = d * sum(qs)
typedef struct { uint8_t e; uint8_t qs[NM_QK / 2]; } nm_block_mxfp4;                 // E8M0 + E2M1 nibbles

// K formats: 256 elements per super-block.
typedef struct {
    uint8_t scales[NM_QK_K / 16]; // per 16: low nibble scale, high nibble min
    uint8_t qs[NM_QK_K / 4];      // 2-bit quants
    uint16_t d, dmin;
} nm_block_q2_K;
typedef struct {
    uint8_t hmask[NM_QK_K / 8]; // high bit of each quant
    uint8_t qs[NM_QK_K / 4];    // low 2 bits
    uint8_t scales[12];         // 16 6-bit scales, offset by 32
    uint16_t d;
} nm_block_q3_K;
typedef struct {
    uint16_t d, dmin;
    uint8_t scales[12];      // 8 6-bit scales and 8 6-bit mins, packed (see nm_get_scale_min_k4)
    uint8_t qs[NM_QK_K / 2]; // 4-bit quants
} nm_block_q4_K;
typedef struct {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qh[NM_QK_K / 8]; // 5th bit
    uint8_t qs[NM_QK_K / 2]; // low 4 bits
} nm_block_q5_K;
typedef struct {
    uint8_t ql[NM_QK_K / 2];      // low 4 bits
    uint8_t qh[NM_QK_K / 4];      // high 2 bits
    int8_t scales[NM_QK_K / 16];  // 8-bit scales per 16
    uint16_t d;
} nm_block_q6_K;
typedef struct {
    float d;
    int8_t qs[NM_QK_K];
    int16_t bsums[NM_QK_K / 16]; // sum of qs per 16
} nm_block_q8_K;

_Static_assert(sizeof(nm_block_q4_0) == 18, "q4_0 layout");
_Static_assert(sizeof(nm_block_q4_1) == 20, "q4_1 layout");
_Static_assert(sizeof(nm_block_q5_0) == 22, "q5_0 layout");
_Static_assert(sizeof(nm_block_q5_1) == 24, "q5_1 layout");
_Static_assert(sizeof(nm_block_q8_0) == 34, "q8_0 layout");
_Static_assert(sizeof(nm_block_q8_1) == 36, "q8_1 layout");
_Static_assert(sizeof(nm_block_mxfp4) == 17, "mxfp4 layout");
_Static_assert(sizeof(nm_block_q2_K) == 84, "q2_K layout");
_Static_assert(sizeof(nm_block_q3_K) == 110, "q3_K layout");
_Static_assert(sizeof(nm_block_q4_K) == 144, "q4_K layout");
_Static_assert(sizeof(nm_block_q5_K) == 176, "q5_K layout");
_Static_assert(sizeof(nm_block_q6_K) == 210, "q6_K layout");
_Static_assert(sizeof(nm_block_q8_K) == 292, "q8_K layout");

// E2M1 values times two (ggml's kvalues_mxfp4); the scale is 2^(e-128) to match.
extern const int8_t nm_kvalues_mxfp4[16];

// Inline fp16 -> fp32 for the scalar kernels (same result as nm_fp16_to_fp32).
static inline float nm_half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
    if (exp == 0) {
        // zero or subnormal: mant * 2^-24 is exact in fp32
        float f = (float)mant * 5.9604644775390625e-8f;
        return (h & 0x8000) ? -f : f;
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K super-block:
// j < 4 sit in the low 6 bits of bytes j and j+4; j >= 4 are split into a
// nibble in byte j+4 and the top 2 bits of bytes j-4 (scale) and j (min).
static inline void nm_get_scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

// Q3_K: the 16 signed scales (already minus 32).
static inline void nm_q3_K_scales(const uint8_t *s, int8_t out[16]) {
    for (int j = 0; j < 16; j++) {
        int lo = j < 8 ? (s[j] & 0x0f) : (s[j - 8] >> 4);
        int hi = (s[8 + (j & 3)] >> (2 * (j / 4))) & 3;
        out[j] = (int8_t)((lo | (hi << 4)) - 32);
    }
}

// Per-type reference kernels (ref_legacy.c, ref_kquants.c).
#define NM_DECL_REF(t)                                                                  \
    void nm_dequant_##t##_ref(const void *restrict src, float *restrict dst, int64_t n); \
    void nm_quantize_##t##_ref(const float *restrict src, void *restrict dst, int64_t n); \
    float nm_dot_##t##_ref(const void *restrict w, const float *restrict x, int64_t n);
NM_DECL_REF(f32)
NM_DECL_REF(f16)
NM_DECL_REF(bf16)
NM_DECL_REF(q4_0)
NM_DECL_REF(q4_1)
NM_DECL_REF(q5_0)
NM_DECL_REF(q5_1)
NM_DECL_REF(q8_0)
NM_DECL_REF(q8_1)
NM_DECL_REF(mxfp4)
NM_DECL_REF(q2_K)
NM_DECL_REF(q3_K)
NM_DECL_REF(q4_K)
NM_DECL_REF(q5_K)
NM_DECL_REF(q6_K)
NM_DECL_REF(q8_K)
#undef NM_DECL_REF

// Quantized-activation kernels (ref_dotq.c): dotq by weight type, quant_act by
// activation type.
#define NM_DECL_DOTQ(t) float nm_dotq_##t##_ref(const void *restrict w, const void *restrict xq, int64_t n);
NM_DECL_DOTQ(f32)
NM_DECL_DOTQ(f16)
NM_DECL_DOTQ(bf16)
NM_DECL_DOTQ(q4_0)
NM_DECL_DOTQ(q4_1)
NM_DECL_DOTQ(q5_0)
NM_DECL_DOTQ(q5_1)
NM_DECL_DOTQ(q8_0)
NM_DECL_DOTQ(q8_1)
NM_DECL_DOTQ(mxfp4)
NM_DECL_DOTQ(q2_K)
NM_DECL_DOTQ(q3_K)
NM_DECL_DOTQ(q4_K)
NM_DECL_DOTQ(q5_K)
NM_DECL_DOTQ(q6_K)
NM_DECL_DOTQ(q8_K)
#undef NM_DECL_DOTQ
// gemmq refs (ref_dotq.c): the plain loop over nm_dotq_<t>_ref.
#define NM_DECL_GEMMQ(t)                                                                                    \
    void nm_gemmq_##t##_ref(const void *restrict w, size_t w_stride, int64_t n_rows, const void *restrict xq, \
                            size_t x_stride, int64_t n_tok, int64_t K, float *restrict y, int64_t ldy);
NM_DECL_GEMMQ(f32)
NM_DECL_GEMMQ(f16)
NM_DECL_GEMMQ(bf16)
NM_DECL_GEMMQ(q4_0)
NM_DECL_GEMMQ(q4_1)
NM_DECL_GEMMQ(q5_0)
NM_DECL_GEMMQ(q5_1)
NM_DECL_GEMMQ(q8_0)
NM_DECL_GEMMQ(q8_1)
NM_DECL_GEMMQ(mxfp4)
NM_DECL_GEMMQ(q2_K)
NM_DECL_GEMMQ(q3_K)
NM_DECL_GEMMQ(q4_K)
NM_DECL_GEMMQ(q5_K)
NM_DECL_GEMMQ(q6_K)
NM_DECL_GEMMQ(q8_K)
#undef NM_DECL_GEMMQ
void nm_quant_act_f32_ref(const float *restrict x, void *restrict xq, int64_t n);
void nm_quant_act_f16_ref(const float *restrict x, void *restrict xq, int64_t n);
void nm_quant_act_bf16_ref(const float *restrict x, void *restrict xq, int64_t n);
void nm_quant_act_q8_0_ref(const float *restrict x, void *restrict xq, int64_t n);
void nm_quant_act_q8_1_ref(const float *restrict x, void *restrict xq, int64_t n);
void nm_quant_act_q8_K_ref(const float *restrict x, void *restrict xq, int64_t n);

// llama.cpp's nearest_int: round half to even via the 1.5*2^23 trick, so our
// quantizers pick the same integers as theirs. |f| must be < 2^22.
static inline int nm_nearest_int(float f) {
    float v = f + 12582912.f;
    int32_t i;
    memcpy(&i, &v, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

#ifdef NM_HAVE_X86_SIMD
// AVX2+FMA+F16C table (x86_avx2.c); entries may be NULL (use ref).
const nm_kernels *nm_kernels_avx2(void);
// AVX-VNNI overrides of some dotq entries (x86_vnni.c); the rest NULL. Only
// for CPUs whose nm_cpu_features_get()->avx_vnni is set.
const nm_kernels *nm_kernels_avxvnni(void);
// The same table built with AVX512-VNNI + VL's EVEX vpdpbusd on ymm
// (x86_vnni512.c): same results; for CPUs with those and without AVX-VNNI.
const nm_kernels *nm_kernels_avx512vnni_ymm(void);
// AVX-512 (F, BW, DQ, VL, VNNI, VBMI, BITALG) + GFNI decode GEMV entries (x86_avx512.c);
// the rest NULL. Only for CPUs that report all of these.
const nm_kernels *nm_kernels_avx512(void);
void nm_f16_table_init(void); // x86_dotq.c; the two getters above call it
// The AVX2 table's quantized-activation entries (x86_dotq.c).
#define NM_DECL_DOTQ_AVX2(t) float nm_dotq_##t##_avx2(const void *restrict w, const void *restrict xq, int64_t n);
NM_DECL_DOTQ_AVX2(f16)
NM_DECL_DOTQ_AVX2(bf16)
NM_DECL_DOTQ_AVX2(q4_0)
NM_DECL_DOTQ_AVX2(q4_1)
NM_DECL_DOTQ_AVX2(q5_0)
NM_DECL_DOTQ_AVX2(q5_1)
NM_DECL_DOTQ_AVX2(q8_0)
NM_DECL_DOTQ_AVX2(q8_1)
NM_DECL_DOTQ_AVX2(q8_K)
NM_DECL_DOTQ_AVX2(q2_K)
NM_DECL_DOTQ_AVX2(q3_K)
NM_DECL_DOTQ_AVX2(mxfp4)
NM_DECL_DOTQ_AVX2(q4_K)
NM_DECL_DOTQ_AVX2(q5_K)
NM_DECL_DOTQ_AVX2(q6_K)
#undef NM_DECL_DOTQ_AVX2
// gemmq of x86_gemmq.c (AVX2).
#define NM_DECL_GEMMQ_AVX2(t)                                                                                 \
    void nm_gemmq_##t##_avx2(const void *restrict w, size_t w_stride, int64_t n_rows, const void *restrict xq, \
                             size_t x_stride, int64_t n_tok, int64_t K, float *restrict y, int64_t ldy);
NM_DECL_GEMMQ_AVX2(q4_0)
NM_DECL_GEMMQ_AVX2(q4_1)
NM_DECL_GEMMQ_AVX2(q5_0)
NM_DECL_GEMMQ_AVX2(q5_1)
NM_DECL_GEMMQ_AVX2(q8_0)
NM_DECL_GEMMQ_AVX2(mxfp4)
NM_DECL_GEMMQ_AVX2(q4_K)
NM_DECL_GEMMQ_AVX2(q6_K)
#undef NM_DECL_GEMMQ_AVX2
#define NM_DECL_QACT_AVX2(t) void nm_quant_act_##t##_avx2(const float *restrict x, void *restrict xq, int64_t n);
NM_DECL_QACT_AVX2(f32)
NM_DECL_QACT_AVX2(f16)
NM_DECL_QACT_AVX2(bf16)
NM_DECL_QACT_AVX2(q8_0)
NM_DECL_QACT_AVX2(q8_1)
NM_DECL_QACT_AVX2(q8_K)
#undef NM_DECL_QACT_AVX2
#endif

#ifdef NM_HAVE_ARM_SIMD
// aarch64 NEON table (arm_neon.c): fused f32 dots, some dequants, the
// activation quantizers, the integer dotq (vmull_s8) and the gemmq tiles of
// arm_gemmq.c; entries may be NULL (use ref).
const nm_kernels *nm_kernels_neon(void);
// SDOT (ARMv8.2 dotprod) overrides of the neon table's integer dotq and gemmq;
// the rest NULL. Only for CPUs whose nm_cpu_features_get()->dotprod is set.
const nm_kernels *nm_kernels_neon_dotprod(void);
// gemmq of arm_gemmq.c: plain NEON (_neon) and SDOT (_neon_dp, dotprod CPUs only).
#define NM_DECL_GEMMQ_NEON(t)                                                                                      \
    void nm_gemmq_##t##_neon(const void *restrict w, size_t w_stride, int64_t n_rows, const void *restrict xq,      \
                             size_t x_stride, int64_t n_tok, int64_t K, float *restrict y, int64_t ldy);           \
    void nm_gemmq_##t##_neon_dp(const void *restrict w, size_t w_stride, int64_t n_rows, const void *restrict xq,   \
                                size_t x_stride, int64_t n_tok, int64_t K, float *restrict y, int64_t ldy);
NM_DECL_GEMMQ_NEON(q4_0)
NM_DECL_GEMMQ_NEON(q4_1)
NM_DECL_GEMMQ_NEON(q5_0)
NM_DECL_GEMMQ_NEON(q5_1)
NM_DECL_GEMMQ_NEON(q8_0)
NM_DECL_GEMMQ_NEON(mxfp4)
NM_DECL_GEMMQ_NEON(q4_K)
NM_DECL_GEMMQ_NEON(q5_K)
NM_DECL_GEMMQ_NEON(q6_K)
#undef NM_DECL_GEMMQ_NEON
#endif

#endif
