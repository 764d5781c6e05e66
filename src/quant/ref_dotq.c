// Scalar reference of llama.cpp's quantized-activation matmul path: the
// activation quantizers (vec_dot_type rows) and the weight . activation dots.
//
// The dots are ggml's generic ggml_vec_dot_<w>_<a> (ggml-cpu/quants.c): an
// exact integer sum per block, scaled once per block in f32 (K formats: the
// min term from the q8_K bsums). Only the order of the f32 sums may differ.
//
// The q8_0/q8_1 quantizers are NOT quantize_row_q8_0_ref: llama.cpp on x86
// (ggml-cpu/arch/x86/quants.c, AVX/AVX2 build) uses id = 127/amax and rounds
// half to even, where the ref uses id = 1/(amax/127) and rounds half away from
// zero; the two differ in about one value in a few thousand. We follow x86,
// the machine whose logits we compare against. q8_K is ggml's ref on x86 too.
#include <math.h>

#include "quant/kernels_impl.h"

// ---- activation quantizers --------------------------------------------------------

void nm_quant_act_f32_ref(const float *restrict x, void *restrict xq, int64_t n) {
    memcpy(xq, x, (size_t)n * sizeof(float));
}
void nm_quant_act_f16_ref(const float *restrict x, void *restrict xq, int64_t n) {
    uint16_t *h = xq;
    for (int64_t i = 0; i < n; i++) h[i] = nm_fp32_to_fp16(x[i]);
}
void nm_quant_act_bf16_ref(const float *restrict x, void *restrict xq, int64_t n) {
    uint16_t *h = xq;
    for (int64_t i = 0; i < n; i++) h[i] = nm_fp32_to_bf16(x[i]);
}

// vcvtps2dq of a value already rounded to an integer: out of range or NaN
// gives INT32_MIN ("integer indefinite"), as the x86 code sees it.
static inline int32_t cvt_i32(float v) {
    if (!(v > -2147483648.0f && v < 2147483648.0f)) return INT32_MIN;
    return (int32_t)v;
}
static inline int8_t sat_i8(int32_t v) { return (int8_t)(v < -128 ? -128 : v > 127 ? 127 : v); } // packs

// One q8_0/q8_1 block the x86 way; returns d and the int32 sum of the
// unsaturated quants (what quantize_row_q8_1 scales into s).
static float quant_act_q8_block(const float *x, int8_t *qs, int32_t *sum) {
    float amax = 0;
    for (int j = 0; j < NM_QK; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float d = amax / 127.f;
    const float id = amax != 0.0f ? 127.f / amax : 0.0f;
    uint32_t s = 0; // wraps like the vector adds
    for (int j = 0; j < NM_QK; j++) {
        int32_t q = cvt_i32(rintf(x[j] * id)); // default rounding mode: half to even
        qs[j] = sat_i8(q);
        s += (uint32_t)q;
    }
    *sum = (int32_t)s;
    return d;
}

void nm_quant_act_q8_0_ref(const float *restrict x, void *restrict xq, int64_t n) {
    nm_block_q8_0 *b = xq;
    for (int64_t i = 0; i < n / NM_QK; i++, x += NM_QK) {
        int32_t sum;
        b[i].d = nm_fp32_to_fp16(quant_act_q8_block(x, b[i].qs, &sum));
    }
}

void nm_quant_act_q8_1_ref(const float *restrict x, void *restrict xq, int64_t n) {
    nm_block_q8_1 *b = xq;
    for (int64_t i = 0; i < n / NM_QK; i++, x += NM_QK) {
        int32_t sum;
        float d = quant_act_q8_block(x, b[i].qs, &sum);
        b[i].d = nm_fp32_to_fp16(d);
        b[i].s = nm_fp32_to_fp16(d * (float)sum);
    }
}

// quantize_row_q8_K_ref (d = max / -127 of the signed extreme, bsums per 16).
void nm_quant_act_q8_K_ref(const float *restrict x, void *restrict xq, int64_t n) { nm_quantize_q8_K_ref(x, xq, n); }

// ---- f32 / f16 / bf16 weights ----------------------------------------------------------

float nm_dotq_f32_ref(const void *restrict w, const void *restrict xq, int64_t n) {
    return nm_dot_f32_ref(w, xq, n);
}
float nm_dotq_f16_ref(const void *restrict w, const void *restrict xq, int64_t n) {
    const uint16_t *a = w, *b = xq;
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += nm_half_to_float(a[i]) * nm_half_to_float(b[i]);
    return s;
}
float nm_dotq_bf16_ref(const void *restrict w, const void *restrict xq, int64_t n) {
    const uint16_t *a = w, *b = xq;
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += nm_bf16_to_fp32(a[i]) * nm_bf16_to_fp32(b[i]);
    return s;
}

// ---- 32-element blocks . q8_0 / q8_1 ----------------------------------------------------

float nm_dotq_q4_0_ref(const void *restrict w, const void *restrict xq, int64_t n) {
    const nm_block_q4_0 *x = w;
    const nm_block_q8_0 *y = xq;
    float s = 0;
    for (int64_t i = 0; i < n / NM_QK; i++) {
        int sumi = 0;
        for (int j = 0; j < 16; j++)
            sumi += ((x[i].qs[j] & 0x0f) - 8) * y[i].qs[j] + ((x[i].qs[j] >> 4) - 8) * y[i].qs[j + 16];
        s += (float)sumi * nm_half_to_float(x[i].d) * nm_half_to_float(y[i].d);
    }
    return s;
}

// w = d*q + m: the m term is m * sum(x) = m * s, with s from the q8_1 block.
float nm_dotq_q4_1_ref(const void *restrict w, const void *restrict xq, int64_t n) {
    const nm_block_q4_1 *x = w;
    const nm_block_q8_1 *y = xq;
    float s = 0;
    for (int64_t i = 0; i < n / NM_QK; i++) {
        int sumi = 0;
        for (int j = 0; j < 16; j++) sumi += (x[i].qs[j] & 0x0f) * y[i].qs[j] + (x[i].qs[j] >> 4) * y[i].qs[j + 16];
        s += (nm_half_to_float(x[i].d) * nm_half_to_float(y[i].d)) * (float)sumi +
             nm_half_to_float(x[i].m) * nm_half_to_float(y[i].s);
    }
    return s;
}

static inline int q5_nib(const uint8_t *qs, uint32_t qh, int j) { // 0..31
    int nib = j < 16 ? (qs[j] & 0x0f) : (qs[j - 16] >> 4);
    return nib | (int)(((qh >> j) & 1) << 4);
}

float nm_dotq_q5_0_ref(const void *restrict w, const void *restrict xq, int64_t n) {
    const nm_block_q5_0 *x = w;
    const nm_block_q8_0 *y = xq;
    float s = 0;
    for (int64_t i = 0; i < n / NM_QK; i++) {
        uint32_t qh;
        memcpy(&qh, x[i].qh, 4);
        int sumi = 0;
        for (int j = 0; j < NM_QK; j++) sumi += (q5_nib(x[i].qs, qh, j) - 16) * y[i].qs[j];
        s += (nm_half_to_float(x[i].d) * nm_half_to_float(y[i].d)) * (float)sumi;
    }
    return s;
}

float nm_dotq_q5_1_ref(const void *restrict w, const void *restrict xq, int64_t n) {
    const nm_block_q5_1 *x = w;
    const nm_block_q8_1 *y = xq;
    float s = 0;
    for (int64_t i = 0; i < n / NM_QK; i++) {
        uint32_t qh;
        memcpy(&qh, x[i].qh, 4);
        int sumi = 0;
        for (int j = 0; j < NM_QK; j++) sumi += q5_nib(x[i].qs, qh, j) * y[i].qs[j];
        s += (nm_half_to_float(x[i].d) * nm_half_to_float(y[i].d)) * (float)sumi +
             nm_half_to_float(x[i].m) * nm_half_to_float(y[i].s);
    }
    return s;
}

float nm_dotq_q8_0_ref(const void *restrict w, const void *restrict xq, int64_t n) {
    const nm_block_q8_0 *x = w;
    const nm_block_q8_0 *y = xq;
    float s = 0;
    for (int64_t i = 0; i < n / NM_QK; i++) {
        int sumi = 0;
        for (int j = 0; j < NM_QK; j++) sumi += x[i].qs[j] * y[i].qs[j];
        s += (float)sumi * (nm_half_to_float(x[i].d) * nm_half_to_float(y[i].d));
    }
    return s;
}

// Not in ggml (q8_1 weights have no vec_dot there): d_w * d_x * sum(q_w q_x).
float nm_dotq_q8_1_ref(const void *restrict w, const void *restrict xq, int64_t n) {
    const nm_block_q8_1 *x = w;
    const nm_block_q8_1 *y = xq;
    float s = 0;
    for (int64_t i = 0; i < n / NM_QK; i++) {
        int sumi = 0;
        for (int j = 0; j < NM_QK; j++) sumi += x[i].qs[j] * y[i].qs[j];
        s += (float)sumi * (nm_half_to_float(x[i].d) * nm_half_to_float(y[i].d));
    }
    return s;
}

float nm_dotq_mxfp4_ref(const void *restrict w, const void *restrict xq, int64_t n) {
    const nm_block_mxfp4 *x = w;
    const nm_block_q8_0 *y = xq;
    float s = 0;
    for (int64_t i = 0; i < n / NM_QK; i++) {
        const float d = nm_half_to_float(y[i].d) * nm_e8m0_to_fp32_half(x[i].e);
        int sumi = 0;
        for (int j = 0; j < 16; j++)
            sumi += y[i].qs[j] * nm_kvalues_mxfp4[x[i].qs[j] & 0x0f] +
                    y[i].qs[j + 16] * nm_kvalues_mxfp4[x[i].qs[j] >> 4];
        s += d * (float)sumi;
    }
    return s;
}

// ---- K formats . q8_K -------------------------------------------------------------------
// Integer sums per super-block; ggml keeps the f32 partials in 8 lanes, we in one.

float nm_dotq_q2_K_ref(const void *restrict w, const void *restrict xq, int64_t n) {
    const nm_block_q2_K *x = w;
    const nm_block_q8_K *y = xq;
    float s = 0;
    for (int64_t i = 0; i < n / NM_QK_K; i++) {
        int summs = 0, isum = 0;
        for (int g = 0; g < 16; g++) summs += y[i].bsums[g] * (x[i].scales[g] >> 4);
        for (int g = 0; g < 16; g++) { // group g = elements 16g..16g+15
            const int c = g / 8, k = (g % 8) / 2, l0 = (g % 2) * 16;
            const uint8_t *q2 = x[i].qs + 32 * c + l0;
            const int8_t *q8 = y[i].qs + 16 * g;
            int isuml = 0;
            for (int l = 0; l < 16; l++) isuml += q8[l] * ((q2[l] >> (2 * k)) & 3);
            isum += (x[i].scales[g] & 0x0f) * isuml;
        }
        const float dall = y[i].d * nm_half_to_float(x[i].d), dmin = y[i].d * nm_half_to_float(x[i].dmin);
        s += dall * (float)isum - dmin * (float)summs;
    }
    return s;
}

float nm_dotq_q3_K_ref(const void *restrict w, const void *restrict xq, int64_t n) {
    const nm_block_q3_K *x = w;
    const nm_block_q8_K *y = xq;
    float s = 0;
    for (int64_t i = 0; i < n / NM_QK_K; i++) {
        int8_t sc[16];
        nm_q3_K_scales(x[i].scales, sc);
        int isum = 0;
        for (int g = 0; g < 16; g++) {
            int gs = 0;
            for (int l = 0; l < 16; l++) {
                const int e = 16 * g + l, c = e / 128, k = (e % 128) / 32, ll = e % 32;
                const int lo = (x[i].qs[32 * c + ll] >> (2 * k)) & 3;
                const int hbit = (x[i].hmask[ll] >> (4 * c + k)) & 1;
                gs += (lo - (hbit ? 0 : 4)) * y[i].qs[e];
            }
            isum += sc[g] * gs;
        }
        s += (nm_half_to_float(x[i].d) * y[i].d) * (float)isum;
    }
    return s;
}

// Q4_K/Q5_K: the 8 scales and mins, then sum_j sc_j * sum(q*q8) and the min
// term from the 16 bsums (two per 32-element sub-block).
static inline float dotq_qk_sm(const uint8_t *scales, uint16_t dh, uint16_t dminh, const nm_block_q8_K *y,
                               const uint8_t q[NM_QK_K]) {
    int isum = 0, summs = 0;
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        nm_get_scale_min_k4(j, scales, &sc, &m);
        int gs = 0;
        for (int l = 0; l < 32; l++) gs += q[32 * j + l] * y->qs[32 * j + l];
        isum += sc * gs;
        summs += m * (y->bsums[2 * j] + y->bsums[2 * j + 1]);
    }
    const float d = nm_half_to_float(dh) * y->d, dmin = nm_half_to_float(dminh) * y->d;
    return d * (float)isum - dmin * (float)summs;
}

float nm_dotq_q4_K_ref(const void *restrict w, const void *restrict xq, int64_t n) {
    const nm_block_q4_K *x = w;
    const nm_block_q8_K *y = xq;
    float s = 0;
    uint8_t q[NM_QK_K];
    for (int64_t i = 0; i < n / NM_QK_K; i++) {
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                q[64 * c + l] = x[i].qs[32 * c + l] & 0x0f;
                q[64 * c + 32 + l] = x[i].qs[32 * c + l] >> 4;
            }
        s += dotq_qk_sm(x[i].scales, x[i].d, x[i].dmin, &y[i], q);
    }
    return s;
}

float nm_dotq_q5_K_ref(const void *restrict w, const void *restrict xq, int64_t n) {
    const nm_block_q5_K *x = w;
    const nm_block_q8_K *y = xq;
    float s = 0;
    uint8_t q[NM_QK_K];
    for (int64_t i = 0; i < n / NM_QK_K; i++) {
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                const int h = x[i].qh[l] >> (2 * c);
                q[64 * c + l] = (uint8_t)((x[i].qs[32 * c + l] & 0x0f) | ((h & 1) << 4));
                q[64 * c + 32 + l] = (uint8_t)((x[i].qs[32 * c + l] >> 4) | ((h & 2) << 3));
            }
        s += dotq_qk_sm(x[i].scales, x[i].d, x[i].dmin, &y[i], q);
    }
    return s;
}

float nm_dotq_q6_K_ref(const void *restrict w, const void *restrict xq, int64_t n) {
    const nm_block_q6_K *x = w;
    const nm_block_q8_K *y = xq;
    float s = 0;
    for (int64_t i = 0; i < n / NM_QK_K; i++) {
        int isum = 0;
        for (int g = 0; g < 16; g++) {
            int gs = 0;
            for (int l = 0; l < 16; l++) {
                const int e = 16 * g + l, h = e / 128, r = e % 128, k = r / 32, ll = r % 32;
                const int lo = (x[i].ql[64 * h + 32 * (k & 1) + ll] >> (4 * (k >> 1))) & 0x0f;
                const int hi = (x[i].qh[32 * h + ll] >> (2 * k)) & 3;
                gs += ((lo | (hi << 4)) - 32) * y[i].qs[e];
            }
            isum += x[i].scales[g] * gs;
        }
        s += (nm_half_to_float(x[i].d) * y[i].d) * (float)isum;
    }
    return s;
}

// Not in ggml (no q8_K weights there): d_w * d_x * sum(q_w q_x).
float nm_dotq_q8_K_ref(const void *restrict w, const void *restrict xq, int64_t n) {
    const nm_block_q8_K *x = w;
    const nm_block_q8_K *y = xq;
    float s = 0;
    for (int64_t i = 0; i < n / NM_QK_K; i++) {
        int sumi = 0;
        for (int e = 0; e < NM_QK_K; e++) sumi += x[i].qs[e] * y[i].qs[e];
        s += (x[i].d * y[i].d) * (float)sumi;
    }
    return s;
}

// ---- many rows x many tokens ------------------------------------------------------------
// The spec of gemmq: every (row, token) pair through the ref dot.

#define GEMMQ_REF(t)                                                                                        \
    void nm_gemmq_##t##_ref(const void *restrict w, size_t w_stride, int64_t n_rows, const void *restrict xq, \
                            size_t x_stride, int64_t n_tok, int64_t K, float *restrict y, int64_t ldy) {     \
        for (int64_t tok = 0; tok < n_tok; tok++)                                                           \
            for (int64_t r = 0; r < n_rows; r++)                                                            \
                y[tok * ldy + r] = nm_dotq_##t##_ref((const uint8_t *)w + (size_t)r * w_stride,             \
                                                     (const uint8_t *)xq + (size_t)tok * x_stride, K);      \
    }
GEMMQ_REF(f32)
GEMMQ_REF(f16)
GEMMQ_REF(bf16)
GEMMQ_REF(q4_0)
GEMMQ_REF(q4_1)
GEMMQ_REF(q5_0)
GEMMQ_REF(q5_1)
GEMMQ_REF(q8_0)
GEMMQ_REF(q8_1)
GEMMQ_REF(mxfp4)
GEMMQ_REF(q2_K)
GEMMQ_REF(q3_K)
GEMMQ_REF(q4_K)
GEMMQ_REF(q5_K)
GEMMQ_REF(q6_K)
GEMMQ_REF(q8_K)
#undef GEMMQ_REF
