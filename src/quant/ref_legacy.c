// Scalar reference kernels of the float and 32-element block formats:
// f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q8_1, mxfp4.
//
// Quantizers follow llama.cpp's quantize_row_*_ref (ggml-quants.c) so that a
// row we quantize is byte-identical to one in a GGUF file made by llama.cpp.
// The dots unpack one block into locals and multiply straight into f32 x.
#include <float.h>
#include <math.h>

#include "quant/kernels_impl.h"

const int8_t nm_kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// ---- f32 / f16 / bf16 ------------------------------------------------------------

void nm_dequant_f32_ref(const void *restrict src, float *restrict dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}
void nm_quantize_f32_ref(const float *restrict src, void *restrict dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}
float nm_dot_f32_ref(const void *restrict w, const float *restrict x, int64_t n) {
    const float *a = w;
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * x[i];
    return s;
}

void nm_dequant_f16_ref(const void *restrict src, float *restrict dst, int64_t n) {
    const uint16_t *h = src;
    for (int64_t i = 0; i < n; i++) dst[i] = nm_half_to_float(h[i]);
}
void nm_quantize_f16_ref(const float *restrict src, void *restrict dst, int64_t n) {
    uint16_t *h = dst;
    for (int64_t i = 0; i < n; i++) h[i] = nm_fp32_to_fp16(src[i]);
}
float nm_dot_f16_ref(const void *restrict w, const float *restrict x, int64_t n) {
    const uint16_t *h = w;
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += nm_half_to_float(h[i]) * x[i];
    return s;
}

void nm_dequant_bf16_ref(const void *restrict src, float *restrict dst, int64_t n) {
    const uint16_t *h = src;
    for (int64_t i = 0; i < n; i++) dst[i] = nm_bf16_to_fp32(h[i]);
}
void nm_quantize_bf16_ref(const float *restrict src, void *restrict dst, int64_t n) {
    uint16_t *h = dst;
    for (int64_t i = 0; i < n; i++) h[i] = nm_fp32_to_bf16(src[i]);
}
float nm_dot_bf16_ref(const void *restrict w, const float *restrict x, int64_t n) {
    const uint16_t *h = w;
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += nm_bf16_to_fp32(h[i]) * x[i];
    return s;
}

// ---- shared helpers --------------------------------------------------------------

// The value of largest magnitude (signed), as the symmetric formats want it.
static float signed_absmax(const float *x, int n) {
    float amax = 0, max = 0;
    for (int j = 0; j < n; j++) {
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max;
}

static void min_max(const float *x, int n, float *mn, float *mx) {
    float lo = FLT_MAX, hi = -FLT_MAX;
    for (int j = 0; j < n; j++) {
        if (x[j] < lo) lo = x[j];
        if (x[j] > hi) hi = x[j];
    }
    *mn = lo;
    *mx = hi;
}

// ---- q4_0: d * (nib - 8); low nibbles are elements 0..15, high 16..31 ----------

void nm_dequant_q4_0_ref(const void *restrict src, float *restrict dst, int64_t n) {
    const nm_block_q4_0 *b = src;
    for (int64_t i = 0; i < n / NM_QK; i++, dst += NM_QK) {
        float d = nm_half_to_float(b[i].d);
        for (int j = 0; j < 16; j++) {
            dst[j] = (float)((b[i].qs[j] & 0x0f) - 8) * d;
            dst[j + 16] = (float)((b[i].qs[j] >> 4) - 8) * d;
        }
    }
}

void nm_quantize_q4_0_ref(const float *restrict src, void *restrict dst, int64_t n) {
    nm_block_q4_0 *b = dst;
    for (int64_t i = 0; i < n / NM_QK; i++, src += NM_QK) {
        // The extreme value maps to -8 exactly, using the full [-8, 7] range.
        float d = signed_absmax(src, NM_QK) / -8;
        float id = d != 0 ? 1.0f / d : 0.0f;
        b[i].d = nm_fp32_to_fp16(d);
        for (int j = 0; j < 16; j++) {
            int q0 = (int8_t)(src[j] * id + 8.5f), q1 = (int8_t)(src[j + 16] * id + 8.5f);
            q0 = q0 > 15 ? 15 : q0;
            q1 = q1 > 15 ? 15 : q1;
            b[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

float nm_dot_q4_0_ref(const void *restrict w, const float *restrict x, int64_t n) {
    const nm_block_q4_0 *b = w;
    float s = 0;
    for (int64_t i = 0; i < n / NM_QK; i++, x += NM_QK) {
        float bs = 0;
        for (int j = 0; j < 16; j++)
            bs += (float)((b[i].qs[j] & 0x0f) - 8) * x[j] + (float)((b[i].qs[j] >> 4) - 8) * x[j + 16];
        s += bs * nm_half_to_float(b[i].d);
    }
    return s;
}

// ---- q4_1: d * nib + m -------------------------------------------------------------

void nm_dequant_q4_1_ref(const void *restrict src, float *restrict dst, int64_t n) {
    const nm_block_q4_1 *b = src;
    for (int64_t i = 0; i < n / NM_QK; i++, dst += NM_QK) {
        float d = nm_half_to_float(b[i].d), m = nm_half_to_float(b[i].m);
        for (int j = 0; j < 16; j++) {
            dst[j] = (float)(b[i].qs[j] & 0x0f) * d + m;
            dst[j + 16] = (float)(b[i].qs[j] >> 4) * d + m;
        }
    }
}

void nm_quantize_q4_1_ref(const float *restrict src, void *restrict dst, int64_t n) {
    nm_block_q4_1 *b = dst;
    for (int64_t i = 0; i < n / NM_QK; i++, src += NM_QK) {
        float mn, mx;
        min_max(src, NM_QK, &mn, &mx);
        float d = (mx - mn) / 15;
        float id = d != 0 ? 1.0f / d : 0.0f;
        b[i].d = nm_fp32_to_fp16(d);
        b[i].m = nm_fp32_to_fp16(mn);
        for (int j = 0; j < 16; j++) {
            int q0 = (int8_t)((src[j] - mn) * id + 0.5f), q1 = (int8_t)((src[j + 16] - mn) * id + 0.5f);
            q0 = q0 > 15 ? 15 : q0;
            q1 = q1 > 15 ? 15 : q1;
            b[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

float nm_dot_q4_1_ref(const void *restrict w, const float *restrict x, int64_t n) {
    const nm_block_q4_1 *b = w;
    float s = 0;
    for (int64_t i = 0; i < n / NM_QK; i++, x += NM_QK) {
        float qx = 0, sx = 0; // sum q*x and sum x: w*x = d*q*x + m*x
        for (int j = 0; j < 16; j++) {
            qx += (float)(b[i].qs[j] & 0x0f) * x[j] + (float)(b[i].qs[j] >> 4) * x[j + 16];
            sx += x[j] + x[j + 16];
        }
        s += qx * nm_half_to_float(b[i].d) + sx * nm_half_to_float(b[i].m);
    }
    return s;
}

// ---- q5_0 / q5_1: bit j of qh is the 5th bit of element j --------------------------

static inline int q5_quant(const uint8_t *qs, uint32_t qh, int j) {
    int nib = j < 16 ? (qs[j] & 0x0f) : (qs[j - 16] >> 4);
    return nib | (int)(((qh >> j) & 1) << 4);
}

void nm_dequant_q5_0_ref(const void *restrict src, float *restrict dst, int64_t n) {
    const nm_block_q5_0 *b = src;
    for (int64_t i = 0; i < n / NM_QK; i++, dst += NM_QK) {
        float d = nm_half_to_float(b[i].d);
        uint32_t qh;
        memcpy(&qh, b[i].qh, 4);
        for (int j = 0; j < NM_QK; j++) dst[j] = (float)(q5_quant(b[i].qs, qh, j) - 16) * d;
    }
}

void nm_quantize_q5_0_ref(const float *restrict src, void *restrict dst, int64_t n) {
    nm_block_q5_0 *b = dst;
    for (int64_t i = 0; i < n / NM_QK; i++, src += NM_QK) {
        float d = signed_absmax(src, NM_QK) / -16;
        float id = d != 0 ? 1.0f / d : 0.0f;
        b[i].d = nm_fp32_to_fp16(d);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            int q0 = (int8_t)(src[j] * id + 16.5f), q1 = (int8_t)(src[j + 16] * id + 16.5f);
            q0 = q0 > 31 ? 31 : q0;
            q1 = q1 > 31 ? 31 : q1;
            b[i].qs[j] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
            qh |= (uint32_t)((q0 >> 4) & 1) << j;
            qh |= (uint32_t)((q1 >> 4) & 1) << (j + 16);
        }
        memcpy(b[i].qh, &qh, 4);
    }
}

float nm_dot_q5_0_ref(const void *restrict w, const float *restrict x, int64_t n) {
    const nm_block_q5_0 *b = w;
    float s = 0;
    for (int64_t i = 0; i < n / NM_QK; i++, x += NM_QK) {
        uint32_t qh;
        memcpy(&qh, b[i].qh, 4);
        float bs = 0;
        for (int j = 0; j < NM_QK; j++) bs += (float)(q5_quant(b[i].qs, qh, j) - 16) * x[j];
        s += bs * nm_half_to_float(b[i].d);
    }
    return s;
}

void nm_dequant_q5_1_ref(const void *restrict src, float *restrict dst, int64_t n) {
    const nm_block_q5_1 *b = src;
    for (int64_t i = 0; i < n / NM_QK; i++, dst += NM_QK) {
        float d = nm_half_to_float(b[i].d), m = nm_half_to_float(b[i].m);
        uint32_t qh;
        memcpy(&qh, b[i].qh, 4);
        for (int j = 0; j < NM_QK; j++) dst[j] = (float)q5_quant(b[i].qs, qh, j) * d + m;
    }
}

void nm_quantize_q5_1_ref(const float *restrict src, void *restrict dst, int64_t n) {
    nm_block_q5_1 *b = dst;
    for (int64_t i = 0; i < n / NM_QK; i++, src += NM_QK) {
        float mn, mx;
        min_max(src, NM_QK, &mn, &mx);
        float d = (mx - mn) / 31;
        float id = d != 0 ? 1.0f / d : 0.0f;
        b[i].d = nm_fp32_to_fp16(d);
        b[i].m = nm_fp32_to_fp16(mn);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            // no clamp, as in llama.cpp: (x - min) * id + 0.5 <= 31.5 by construction
            int q0 = (uint8_t)((src[j] - mn) * id + 0.5f), q1 = (uint8_t)((src[j + 16] - mn) * id + 0.5f);
            b[i].qs[j] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
            qh |= (uint32_t)((q0 >> 4) & 1) << j;
            qh |= (uint32_t)((q1 >> 4) & 1) << (j + 16);
        }
        memcpy(b[i].qh, &qh, 4);
    }
}

float nm_dot_q5_1_ref(const void *restrict w, const float *restrict x, int64_t n) {
    const nm_block_q5_1 *b = w;
    float s = 0;
    for (int64_t i = 0; i < n / NM_QK; i++, x += NM_QK) {
        uint32_t qh;
        memcpy(&qh, b[i].qh, 4);
        float qx = 0, sx = 0;
        for (int j = 0; j < NM_QK; j++) {
            qx += (float)q5_quant(b[i].qs, qh, j) * x[j];
            sx += x[j];
        }
        s += qx * nm_half_to_float(b[i].d) + sx * nm_half_to_float(b[i].m);
    }
    return s;
}

// ---- q8_0 / q8_1 -------------------------------------------------------------------

void nm_dequant_q8_0_ref(const void *restrict src, float *restrict dst, int64_t n) {
    const nm_block_q8_0 *b = src;
    for (int64_t i = 0; i < n / NM_QK; i++, dst += NM_QK) {
        float d = nm_half_to_float(b[i].d);
        for (int j = 0; j < NM_QK; j++) dst[j] = (float)b[i].qs[j] * d;
    }
}

// Shared by q8_0 and q8_1: returns d, writes qs, and the sum of qs.
static float quantize_q8_block(const float *x, int8_t *qs, int *sum) {
    float amax = 0;
    for (int j = 0; j < NM_QK; j++) amax = fmaxf(amax, fabsf(x[j]));
    float d = amax / 127;
    float id = d != 0 ? 1.0f / d : 0.0f;
    int s = 0;
    for (int j = 0; j < NM_QK; j++) {
        qs[j] = (int8_t)roundf(x[j] * id);
        s += qs[j];
    }
    *sum = s;
    return d;
}

void nm_quantize_q8_0_ref(const float *restrict src, void *restrict dst, int64_t n) {
    nm_block_q8_0 *b = dst;
    for (int64_t i = 0; i < n / NM_QK; i++, src += NM_QK) {
        int sum;
        b[i].d = nm_fp32_to_fp16(quantize_q8_block(src, b[i].qs, &sum));
    }
}

float nm_dot_q8_0_ref(const void *restrict w, const float *restrict x, int64_t n) {
    const nm_block_q8_0 *b = w;
    float s = 0;
    for (int64_t i = 0; i < n / NM_QK; i++, x += NM_QK) {
        float bs = 0;
        for (int j = 0; j < NM_QK; j++) bs += (float)b[i].qs[j] * x[j];
        s += bs * nm_half_to_float(b[i].d);
    }
    return s;
}

void nm_dequant_q8_1_ref(const void *restrict src, float *restrict dst, int64_t n) {
    const nm_block_q8_1 *b = src;
    for (int64_t i = 0; i < n / NM_QK; i++, dst += NM_QK) {
        float d = nm_half_to_float(b[i].d);
        for (int j = 0; j < NM_QK; j++) dst[j] = (float)b[i].qs[j] * d;
    }
}

void nm_quantize_q8_1_ref(const float *restrict src, void *restrict dst, int64_t n) {
    nm_block_q8_1 *b = dst;
    for (int64_t i = 0; i < n / NM_QK; i++, src += NM_QK) {
        int sum;
        float d = quantize_q8_block(src, b[i].qs, &sum);
        b[i].d = nm_fp32_to_fp16(d);
        b[i].s = nm_fp32_to_fp16((float)sum * d);
    }
}

float nm_dot_q8_1_ref(const void *restrict w, const float *restrict x, int64_t n) {
    const nm_block_q8_1 *b = w;
    float s = 0;
    for (int64_t i = 0; i < n / NM_QK; i++, x += NM_QK) {
        float bs = 0;
        for (int j = 0; j < NM_QK; j++) bs += (float)b[i].qs[j] * x[j];
        s += bs * nm_half_to_float(b[i].d);
    }
    return s;
}

// ---- mxfp4: kvalues[nib] * 2^(e-128) -------------------------------------------

void nm_dequant_mxfp4_ref(const void *restrict src, float *restrict dst, int64_t n) {
    const nm_block_mxfp4 *b = src;
    for (int64_t i = 0; i < n / NM_QK; i++, dst += NM_QK) {
        float d = nm_e8m0_to_fp32_half(b[i].e);
        for (int j = 0; j < 16; j++) {
            dst[j] = (float)nm_kvalues_mxfp4[b[i].qs[j] & 0x0f] * d;
            dst[j + 16] = (float)nm_kvalues_mxfp4[b[i].qs[j] >> 4] * d;
        }
    }
}

static int mxfp4_best_index(float v, float d) {
    int best = 0;
    float err = fabsf((float)nm_kvalues_mxfp4[0] * d - v);
    for (int k = 1; k < 16; k++) {
        float e = fabsf((float)nm_kvalues_mxfp4[k] * d - v);
        if (e < err) {
            best = k;
            err = e;
        }
    }
    return best;
}

void nm_quantize_mxfp4_ref(const float *restrict src, void *restrict dst, int64_t n) {
    nm_block_mxfp4 *b = dst;
    for (int64_t i = 0; i < n / NM_QK; i++, src += NM_QK) {
        float amax = 0;
        for (int j = 0; j < NM_QK; j++) amax = fmaxf(amax, fabsf(src[j]));
        // The largest E2M1 magnitude is 6 = 1.5 * 2^2: put amax's octave two
        // steps above the shared exponent (llama.cpp's choice). Clamped where
        // llama.cpp's cast to uint8 would overflow for tiny amax.
        int e = 0;
        if (amax > 0) {
            float fe = floorf(log2f(amax)) - 2 + 127;
            e = fe < 0 ? 0 : fe > 254 ? 254 : (int)fe;
        }
        b[i].e = (uint8_t)e;
        float d = nm_e8m0_to_fp32_half((uint8_t)e);
        for (int j = 0; j < 16; j++)
            b[i].qs[j] = (uint8_t)(mxfp4_best_index(src[j], d) | (mxfp4_best_index(src[j + 16], d) << 4));
    }
}

float nm_dot_mxfp4_ref(const void *restrict w, const float *restrict x, int64_t n) {
    const nm_block_mxfp4 *b = w;
    float s = 0;
    for (int64_t i = 0; i < n / NM_QK; i++, x += NM_QK) {
        float bs = 0;
        for (int j = 0; j < 16; j++)
            bs += (float)nm_kvalues_mxfp4[b[i].qs[j] & 0x0f] * x[j] +
                  (float)nm_kvalues_mxfp4[b[i].qs[j] >> 4] * x[j + 16];
        s += bs * nm_e8m0_to_fp32_half(b[i].e);
    }
    return s;
}
