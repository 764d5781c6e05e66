// Scalar reference kernels of the K formats (256-element super-blocks):
// q2_K, q3_K, q4_K, q5_K, q6_K, and q8_K (activations).
//
// Quantizers are llama.cpp's *_ref algorithms without an importance matrix
// (ggml-quants.c: make_qx_quants, make_q3_quants, make_qkx2_quants), with the
// same float operation order so that the bytes match.
#include <math.h>
#include <stdbool.h>

#include "quant/kernels_impl.h"

#define GROUP_EPS 1e-15f

static inline int imin(int a, int b) { return a < b ? a : b; }
static inline int imax(int a, int b) { return a > b ? a : b; }

// Symmetric quants in [-nmax, nmax) for a group; L gets l + nmax. With
// weighted=true the weights are x^2 and the scale is refined by a search over
// 18 nearby inverse scales (rmse_type 1 of llama.cpp). Returns the scale.
static float make_qx_quants(int n, int nmax, const float *x, int8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < GROUP_EPS) {
        memset(L, 0, (size_t)n);
        return 0;
    }
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = imax(-nmax, imin(nmax - 1, nm_nearest_int(iscale * x[i])));
        L[i] = (int8_t)(l + nmax);
        float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = imax(-nmax, imin(nmax - 1, nm_nearest_int(iscale * x[i])));
            float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++)
                L[i] = (int8_t)(nmax + imax(-nmax, imin(nmax - 1, nm_nearest_int(iscale * x[i]))));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

// Q3_K's variant: start from the plain rounding, then greedily move single
// quants while that lowers the x^2-weighted error (up to 5 passes).
static float make_q3_quants(int n, int nmax, const float *x, int8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < GROUP_EPS) {
        memset(L, 0, (size_t)n);
        return 0;
    }
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = imax(-nmax, imin(nmax - 1, nm_nearest_int(iscale * x[i])));
        L[i] = (int8_t)l;
        float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int changed = 0;
        for (int i = 0; i < n; i++) {
            float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * L[i] * L[i];
                int nl = imax(-nmax, imin(nmax - 1, nm_nearest_int(x[i] * sl2 / slx)));
                if (nl != L[i]) {
                    slx += w * x[i] * nl;
                    sl2 += w * nl * nl;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)nl;
                        sumlx = slx;
                        suml2 = sl2;
                        changed++;
                    }
                }
            }
        }
        if (!changed) break;
    }
    for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// Asymmetric quants in [0, nmax] with x ~ scale*l - min: tries nstep+1 inverse
// scales around nmax/(max-min), solving the weighted least squares for scale
// and min at each, and keeps the best (error = |diff| if use_mad else diff^2).
// Returns the scale; *the_min gets the (positive) min to subtract.
static float make_qkx2_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L,
                              float *the_min, uint8_t *Laux, float rmin, float rdelta, int nstep,
                              bool use_mad) {
    float min = x[0], max = x[0];
    float sum_w = weights[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *the_min = -min;
        return 0;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; i++) {
        int l = nm_nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)imax(0, imin(nmax, l));
        float diff = scale * L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        best_error += weights[i] * diff;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = imax(0, imin(nmax, nm_nearest_int(iscale * (x[i] - min))));
            Laux[i] = (uint8_t)l;
            float w = weights[i];
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                diff = use_mad ? fabsf(diff) : diff * diff;
                cur_error += weights[i] * diff;
            }
            if (cur_error < best_error) {
                memcpy(L, Laux, (size_t)n);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

// ---- q2_K: per 16, 4-bit scale and 4-bit min; w = d*sc*q - dmin*m ------------------
// qs byte l of 32-byte chunk c holds elements 128c + l + 32k in bits 2k..2k+1.

void nm_dequant_q2_K_ref(const void *restrict src, float *restrict y, int64_t n) {
    const nm_block_q2_K *b = src;
    for (int64_t i = 0; i < n / NM_QK_K; i++) {
        float d = nm_half_to_float(b[i].d), dmin = nm_half_to_float(b[i].dmin);
        for (int e = 0; e < NM_QK_K; e++) {
            int c = e / 128, k = (e % 128) / 32, l = e % 32;
            uint8_t sc = b[i].scales[e / 16];
            int q = (b[i].qs[32 * c + l] >> (2 * k)) & 3;
            *y++ = d * (sc & 0x0f) * q - dmin * (sc >> 4);
        }
    }
}

static void pack_2bit(const uint8_t *L, uint8_t *qs) {
    for (int j = 0; j < NM_QK_K; j += 128)
        for (int l = 0; l < 32; l++)
            qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

void nm_quantize_q2_K_ref(const float *restrict x, void *restrict dst, int64_t n) {
    nm_block_q2_K *b = dst;
    uint8_t L[NM_QK_K], Laux[16];
    float weights[16], mins[NM_QK_K / 16], scales[NM_QK_K / 16];
    for (int64_t i = 0; i < n / NM_QK_K; i++, x += NM_QK_K) {
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < NM_QK_K / 16; j++) {
            for (int l = 0; l < 16; l++) weights[l] = fabsf(x[16 * j + l]);
            scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f,
                                         0.1f, 15, true);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        if (max_scale > 0) {
            float iscale = 15.f / max_scale;
            for (int j = 0; j < NM_QK_K / 16; j++) b[i].scales[j] = (uint8_t)nm_nearest_int(iscale * scales[j]);
            b[i].d = nm_fp32_to_fp16(max_scale / 15.f);
        } else {
            memset(b[i].scales, 0, sizeof b[i].scales);
            b[i].d = nm_fp32_to_fp16(0.f);
        }
        if (max_min > 0) {
            float iscale = 15.f / max_min;
            for (int j = 0; j < NM_QK_K / 16; j++)
                b[i].scales[j] |= (uint8_t)(nm_nearest_int(iscale * mins[j]) << 4);
            b[i].dmin = nm_fp32_to_fp16(max_min / 15.f);
        } else {
            b[i].dmin = nm_fp32_to_fp16(0.f);
        }
        // Requantize against the rounded scales actually stored.
        for (int j = 0; j < NM_QK_K / 16; j++) {
            float d = nm_half_to_float(b[i].d) * (b[i].scales[j] & 0x0f);
            if (!d) continue;
            float dm = nm_half_to_float(b[i].dmin) * (b[i].scales[j] >> 4);
            for (int ii = 0; ii < 16; ii++)
                L[16 * j + ii] = (uint8_t)imax(0, imin(3, nm_nearest_int((x[16 * j + ii] + dm) / d)));
        }
        pack_2bit(L, b[i].qs);
    }
}

float nm_dot_q2_K_ref(const void *restrict w, const float *restrict x, int64_t n) {
    const nm_block_q2_K *b = w;
    float s = 0;
    for (int64_t i = 0; i < n / NM_QK_K; i++, x += NM_QK_K) {
        float qx = 0, mx = 0; // sum sc*q*x and sum m*x
        for (int g = 0; g < 16; g++) {
            int c = g / 8, k = (g % 8) / 2, l0 = (g % 2) * 16;
            const uint8_t *q = b[i].qs + 32 * c + l0;
            const float *xg = x + 16 * g;
            float gq = 0, gx = 0;
            for (int l = 0; l < 16; l++) {
                gq += (float)((q[l] >> (2 * k)) & 3) * xg[l];
                gx += xg[l];
            }
            qx += gq * (b[i].scales[g] & 0x0f);
            mx += gx * (b[i].scales[g] >> 4);
        }
        s += nm_half_to_float(b[i].d) * qx - nm_half_to_float(b[i].dmin) * mx;
    }
    return s;
}

// ---- q3_K: w = d * (sc - 32) * (q2 | h<<2 - 4); h set means +0, clear means -4 -----

static inline int q3_quant(const nm_block_q3_K *b, int e) {
    int c = e / 128, k = (e % 128) / 32, l = e % 32;
    int lo = (b->qs[32 * c + l] >> (2 * k)) & 3;
    int hbit = (b->hmask[l] >> (4 * c + k)) & 1;
    return lo - (hbit ? 0 : 4);
}

void nm_dequant_q3_K_ref(const void *restrict src, float *restrict y, int64_t n) {
    const nm_block_q3_K *b = src;
    for (int64_t i = 0; i < n / NM_QK_K; i++) {
        float d = nm_half_to_float(b[i].d);
        int8_t sc[16];
        nm_q3_K_scales(b[i].scales, sc);
        for (int e = 0; e < NM_QK_K; e++) *y++ = d * sc[e / 16] * q3_quant(&b[i], e);
    }
}

void nm_quantize_q3_K_ref(const float *restrict x, void *restrict dst, int64_t n) {
    nm_block_q3_K *b = dst;
    int8_t L[NM_QK_K];
    float scales[NM_QK_K / 16];
    for (int64_t i = 0; i < n / NM_QK_K; i++, x += NM_QK_K) {
        float max_scale = 0, amax = 0;
        for (int j = 0; j < NM_QK_K / 16; j++) {
            scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
            if (fabsf(scales[j]) > amax) {
                amax = fabsf(scales[j]);
                max_scale = scales[j];
            }
        }
        memset(b[i].scales, 0, 12);
        if (max_scale) {
            float iscale = -32.f / max_scale;
            for (int j = 0; j < NM_QK_K / 16; j++) {
                int l = imax(-32, imin(31, (int8_t)nm_nearest_int(iscale * scales[j]))) + 32;
                if (j < 8) b[i].scales[j] = (uint8_t)(l & 0x0f);
                else b[i].scales[j - 8] |= (uint8_t)((l & 0x0f) << 4);
                b[i].scales[8 + j % 4] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
            }
            b[i].d = nm_fp32_to_fp16(1 / iscale);
        } else {
            b[i].d = nm_fp32_to_fp16(0.f);
        }
        int8_t sc[16];
        nm_q3_K_scales(b[i].scales, sc);
        for (int j = 0; j < NM_QK_K / 16; j++) {
            float d = nm_half_to_float(b[i].d) * sc[j];
            if (!d) continue;
            for (int ii = 0; ii < 16; ii++)
                L[16 * j + ii] = (int8_t)(imax(-4, imin(3, nm_nearest_int(x[16 * j + ii] / d))) + 4);
        }
        // High bit of element e goes to hmask[e % 32], bit e / 32.
        memset(b[i].hmask, 0, sizeof b[i].hmask);
        for (int e = 0; e < NM_QK_K; e++) {
            if (L[e] > 3) {
                b[i].hmask[e % 32] |= (uint8_t)(1 << (e / 32));
                L[e] -= 4;
            }
        }
        pack_2bit((const uint8_t *)L, b[i].qs);
    }
}

float nm_dot_q3_K_ref(const void *restrict w, const float *restrict x, int64_t n) {
    const nm_block_q3_K *b = w;
    float s = 0;
    for (int64_t i = 0; i < n / NM_QK_K; i++, x += NM_QK_K) {
        int8_t sc[16];
        nm_q3_K_scales(b[i].scales, sc);
        float bs = 0;
        for (int g = 0; g < 16; g++) {
            float gq = 0;
            for (int l = 0; l < 16; l++) gq += (float)q3_quant(&b[i], 16 * g + l) * x[16 * g + l];
            bs += gq * sc[g];
        }
        s += bs * nm_half_to_float(b[i].d);
    }
    return s;
}

// ---- q4_K / q5_K: per 32, 6-bit scale and min; w = d*sc*q - dmin*m ---------------
// Each 64-element chunk c uses 32 bytes of qs: low nibbles are elements
// 64c..64c+31, high nibbles 64c+32..64c+63. Q5_K's 5th bit of element
// 64c + 32h + l is bit 2c+h of qh[l].

// Shared quantizer: nmax 15 or 31; qh NULL for Q4_K.
static void quantize_qk_sm(const float *x, uint16_t *pd, uint16_t *pdmin, uint8_t *scales_out, uint8_t *qs,
                           uint8_t *qh, int nmax, float rmin, int nstep) {
    uint8_t L[NM_QK_K], Laux[32];
    float weights[32], mins[8], scales[8];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += x[32 * j + l] * x[32 * j + l];
        float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) weights[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f,
                                     nstep, false);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    for (int j = 0; j < 8; j++) {
        uint8_t ls = (uint8_t)nm_nearest_int(inv_scale * scales[j]);
        uint8_t lm = (uint8_t)nm_nearest_int(inv_min * mins[j]);
        ls = ls > 63 ? 63 : ls;
        lm = lm > 63 ? 63 : lm;
        if (j < 4) {
            scales_out[j] = ls;
            scales_out[j + 4] = lm;
        } else {
            scales_out[j + 4] = (uint8_t)((ls & 0x0f) | ((lm & 0x0f) << 4));
            scales_out[j - 4] |= (uint8_t)((ls >> 4) << 6);
            scales_out[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    *pd = nm_fp32_to_fp16(max_scale / 63.f);
    *pdmin = nm_fp32_to_fp16(max_min / 63.f);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        nm_get_scale_min_k4(j, scales_out, &sc, &m);
        float d = nm_half_to_float(*pd) * sc;
        if (!d) continue;
        float dm = nm_half_to_float(*pdmin) * m;
        for (int ii = 0; ii < 32; ii++)
            L[32 * j + ii] = (uint8_t)imax(0, imin(nmax, nm_nearest_int((x[32 * j + ii] + dm) / d)));
    }
    if (qh) memset(qh, 0, NM_QK_K / 8);
    for (int c = 0; c < 4; c++) {
        for (int l = 0; l < 32; l++) {
            int l1 = L[64 * c + l], l2 = L[64 * c + 32 + l];
            if (qh) {
                qh[l] |= (uint8_t)(((l1 >> 4) << (2 * c)) | ((l2 >> 4) << (2 * c + 1)));
                l1 &= 0x0f;
                l2 &= 0x0f;
            }
            qs[32 * c + l] = (uint8_t)(l1 | (l2 << 4));
        }
    }
}

void nm_dequant_q4_K_ref(const void *restrict src, float *restrict y, int64_t n) {
    const nm_block_q4_K *b = src;
    for (int64_t i = 0; i < n / NM_QK_K; i++) {
        float d = nm_half_to_float(b[i].d), dmin = nm_half_to_float(b[i].dmin);
        for (int c = 0; c < 4; c++) {
            const uint8_t *q = b[i].qs + 32 * c;
            uint8_t sc, m;
            nm_get_scale_min_k4(2 * c, b[i].scales, &sc, &m);
            float d1 = d * sc, m1 = dmin * m;
            nm_get_scale_min_k4(2 * c + 1, b[i].scales, &sc, &m);
            float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] & 0x0f) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (q[l] >> 4) - m2;
        }
    }
}

void nm_quantize_q4_K_ref(const float *restrict x, void *restrict dst, int64_t n) {
    nm_block_q4_K *b = dst;
    for (int64_t i = 0; i < n / NM_QK_K; i++, x += NM_QK_K) {
        memset(b[i].scales, 0, 12);
        quantize_qk_sm(x, &b[i].d, &b[i].dmin, b[i].scales, b[i].qs, NULL, 15, -1.f, 20);
    }
}

float nm_dot_q4_K_ref(const void *restrict w, const float *restrict x, int64_t n) {
    const nm_block_q4_K *b = w;
    float s = 0;
    for (int64_t i = 0; i < n / NM_QK_K; i++, x += NM_QK_K) {
        float qx = 0, mx = 0;
        for (int c = 0; c < 4; c++) {
            const uint8_t *q = b[i].qs + 32 * c;
            const float *xc = x + 64 * c;
            float q1 = 0, q2 = 0, x1 = 0, x2 = 0;
            for (int l = 0; l < 32; l++) {
                q1 += (float)(q[l] & 0x0f) * xc[l];
                q2 += (float)(q[l] >> 4) * xc[l + 32];
                x1 += xc[l];
                x2 += xc[l + 32];
            }
            uint8_t sc, m;
            nm_get_scale_min_k4(2 * c, b[i].scales, &sc, &m);
            qx += q1 * sc;
            mx += x1 * m;
            nm_get_scale_min_k4(2 * c + 1, b[i].scales, &sc, &m);
            qx += q2 * sc;
            mx += x2 * m;
        }
        s += nm_half_to_float(b[i].d) * qx - nm_half_to_float(b[i].dmin) * mx;
    }
    return s;
}

void nm_dequant_q5_K_ref(const void *restrict src, float *restrict y, int64_t n) {
    const nm_block_q5_K *b = src;
    for (int64_t i = 0; i < n / NM_QK_K; i++) {
        float d = nm_half_to_float(b[i].d), dmin = nm_half_to_float(b[i].dmin);
        for (int c = 0; c < 4; c++) {
            const uint8_t *q = b[i].qs + 32 * c;
            uint8_t sc, m;
            nm_get_scale_min_k4(2 * c, b[i].scales, &sc, &m);
            float d1 = d * sc, m1 = dmin * m;
            nm_get_scale_min_k4(2 * c + 1, b[i].scales, &sc, &m);
            float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; l++)
                *y++ = d1 * ((q[l] & 0x0f) | (((b[i].qh[l] >> (2 * c)) & 1) << 4)) - m1;
            for (int l = 0; l < 32; l++)
                *y++ = d2 * ((q[l] >> 4) | (((b[i].qh[l] >> (2 * c + 1)) & 1) << 4)) - m2;
        }
    }
}

void nm_quantize_q5_K_ref(const float *restrict x, void *restrict dst, int64_t n) {
    nm_block_q5_K *b = dst;
    for (int64_t i = 0; i < n / NM_QK_K; i++, x += NM_QK_K) {
        memset(b[i].scales, 0, 12);
        quantize_qk_sm(x, &b[i].d, &b[i].dmin, b[i].scales, b[i].qs, b[i].qh, 31, -0.5f, 15);
    }
}

float nm_dot_q5_K_ref(const void *restrict w, const float *restrict x, int64_t n) {
    const nm_block_q5_K *b = w;
    float s = 0;
    for (int64_t i = 0; i < n / NM_QK_K; i++, x += NM_QK_K) {
        float qx = 0, mx = 0;
        for (int c = 0; c < 4; c++) {
            const uint8_t *q = b[i].qs + 32 * c;
            const float *xc = x + 64 * c;
            float q1 = 0, q2 = 0, x1 = 0, x2 = 0;
            for (int l = 0; l < 32; l++) {
                int h = b[i].qh[l] >> (2 * c);
                q1 += (float)((q[l] & 0x0f) | ((h & 1) << 4)) * xc[l];
                q2 += (float)((q[l] >> 4) | ((h & 2) << 3)) * xc[l + 32];
                x1 += xc[l];
                x2 += xc[l + 32];
            }
            uint8_t sc, m;
            nm_get_scale_min_k4(2 * c, b[i].scales, &sc, &m);
            qx += q1 * sc;
            mx += x1 * m;
            nm_get_scale_min_k4(2 * c + 1, b[i].scales, &sc, &m);
            qx += q2 * sc;
            mx += x2 * m;
        }
        s += nm_half_to_float(b[i].d) * qx - nm_half_to_float(b[i].dmin) * mx;
    }
    return s;
}

// ---- q6_K: w = d * sc[e/16] * (q - 32), q = 4 low bits (ql) | 2 high bits (qh) ----
// Per 128-element half h: ql[64h + l] holds elements l (low) and l+64 (high),
// ql[64h + 32 + l] holds l+32 and l+96; qh[32h + l] bits 2k..2k+1 hold element l+32k.

static inline int q6_quant(const nm_block_q6_K *b, int e) {
    int h = e / 128, r = e % 128, k = r / 32, l = r % 32;
    int lo = (b->ql[64 * h + 32 * (k & 1) + l] >> (4 * (k >> 1))) & 0x0f;
    int hi = (b->qh[32 * h + l] >> (2 * k)) & 3;
    return (lo | (hi << 4)) - 32;
}

void nm_dequant_q6_K_ref(const void *restrict src, float *restrict y, int64_t n) {
    const nm_block_q6_K *b = src;
    for (int64_t i = 0; i < n / NM_QK_K; i++) {
        float d = nm_half_to_float(b[i].d);
        for (int e = 0; e < NM_QK_K; e++) *y++ = d * b[i].scales[e / 16] * q6_quant(&b[i], e);
    }
}

void nm_quantize_q6_K_ref(const float *restrict x, void *restrict dst, int64_t n) {
    nm_block_q6_K *b = dst;
    int8_t L[NM_QK_K];
    float scales[NM_QK_K / 16];
    for (int64_t i = 0; i < n / NM_QK_K; i++, x += NM_QK_K) {
        float max_scale = 0, max_abs = 0;
        for (int ib = 0; ib < NM_QK_K / 16; ib++) {
            scales[ib] = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
            if (fabsf(scales[ib]) > max_abs) {
                max_abs = fabsf(scales[ib]);
                max_scale = scales[ib];
            }
        }
        if (max_abs < GROUP_EPS) {
            memset(&b[i], 0, sizeof b[i]);
            continue;
        }
        float iscale = -128.f / max_scale;
        b[i].d = nm_fp32_to_fp16(1 / iscale);
        for (int ib = 0; ib < NM_QK_K / 16; ib++)
            b[i].scales[ib] = (int8_t)imin(127, nm_nearest_int(iscale * scales[ib]));
        for (int j = 0; j < NM_QK_K / 16; j++) {
            float d = nm_half_to_float(b[i].d) * b[i].scales[j];
            if (!d) continue;
            for (int ii = 0; ii < 16; ii++)
                L[16 * j + ii] = (int8_t)(imax(-32, imin(31, nm_nearest_int(x[16 * j + ii] / d))) + 32);
        }
        for (int h = 0; h < 2; h++) {
            const int8_t *Lh = L + 128 * h;
            for (int l = 0; l < 32; l++) {
                b[i].ql[64 * h + l] = (uint8_t)((Lh[l] & 0x0f) | ((Lh[l + 64] & 0x0f) << 4));
                b[i].ql[64 * h + 32 + l] = (uint8_t)((Lh[l + 32] & 0x0f) | ((Lh[l + 96] & 0x0f) << 4));
                b[i].qh[32 * h + l] = (uint8_t)((Lh[l] >> 4) | ((Lh[l + 32] >> 4) << 2) | ((Lh[l + 64] >> 4) << 4) |
                                                ((Lh[l + 96] >> 4) << 6));
            }
        }
    }
}

float nm_dot_q6_K_ref(const void *restrict w, const float *restrict x, int64_t n) {
    const nm_block_q6_K *b = w;
    float s = 0;
    for (int64_t i = 0; i < n / NM_QK_K; i++, x += NM_QK_K) {
        float bs = 0;
        for (int g = 0; g < 16; g++) {
            float gq = 0;
            for (int l = 0; l < 16; l++) gq += (float)q6_quant(&b[i], 16 * g + l) * x[16 * g + l];
            bs += gq * b[i].scales[g];
        }
        s += bs * nm_half_to_float(b[i].d);
    }
    return s;
}

// ---- q8_K: float d, w = d * q; bsums are sums of q per 16 ---------------------------

void nm_dequant_q8_K_ref(const void *restrict src, float *restrict y, int64_t n) {
    const nm_block_q8_K *b = src;
    for (int64_t i = 0; i < n / NM_QK_K; i++)
        for (int e = 0; e < NM_QK_K; e++) *y++ = b[i].d * b[i].qs[e];
}

void nm_quantize_q8_K_ref(const float *restrict x, void *restrict dst, int64_t n) {
    nm_block_q8_K *b = dst;
    for (int64_t i = 0; i < n / NM_QK_K; i++, x += NM_QK_K) {
        float max = 0, amax = 0;
        for (int j = 0; j < NM_QK_K; j++) {
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        if (!amax) {
            memset(&b[i], 0, sizeof b[i]);
            continue;
        }
        float iscale = -127.f / max; // the extreme value maps to -127
        for (int j = 0; j < NM_QK_K; j++) b[i].qs[j] = (int8_t)imin(127, nm_nearest_int(iscale * x[j]));
        for (int j = 0; j < NM_QK_K / 16; j++) {
            int sum = 0;
            for (int ii = 0; ii < 16; ii++) sum += b[i].qs[16 * j + ii];
            b[i].bsums[j] = (int16_t)sum;
        }
        b[i].d = 1 / iscale;
    }
}

float nm_dot_q8_K_ref(const void *restrict w, const float *restrict x, int64_t n) {
    const nm_block_q8_K *b = w;
    float s = 0;
    for (int64_t i = 0; i < n / NM_QK_K; i++, x += NM_QK_K) {
        float bs = 0;
        for (int e = 0; e < NM_QK_K; e++) bs += (float)b[i].qs[e] * x[e];
        s += bs * b[i].d;
    }
    return s;
}
