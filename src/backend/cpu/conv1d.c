// 1-D convolutions as products on the f32 GEMM kernel (conv1d.h).
#include "backend/cpu/conv1d.h"

#include <string.h>

#include "backend/cpu/gemm.h"

// Time steps a tile gathers: its columns about 64 KiB (L2-resident beside the weights).
static int64_t tile_of(int64_t row) {
    int64_t nt = (int64_t)16384 / (row > 0 ? row : 1);
    return nt < 16 ? 16 : nt > 512 ? 512 : nt;
}

void nm_conv1d_pack(const float *src, int32_t oc, int32_t ic, int32_t k, float *dst) {
    for (int32_t o = 0; o < oc; o++)
        for (int32_t j = 0; j < k; j++)
            for (int32_t i = 0; i < ic; i++)
                dst[((int64_t)o * k + j) * ic + i] = src[((int64_t)o * ic + i) * k + j];
}

int64_t nm_conv1d_work(const nm_conv1d *c) {
    const int64_t row = (int64_t)c->k * c->ic;
    return tile_of(row) * row;
}

int64_t nm_conv1d_run(const nm_conv1d *c, const float *x, int64_t n, int32_t pad_l, int32_t pad_r, float *y, float *work) {
    const int64_t n_out = n + pad_l + pad_r - (int64_t)c->dil * (c->k - 1);
    if (n_out <= 0) return 0;
    const nm_gemm_fn gemm = nm_gemm_f32_get();
    const int64_t row = (int64_t)c->k * c->ic;
    if (c->k == 1 && pad_l == 0) { // (a 1x1 convolution: the product itself)
        gemm(c->w, c->oc, x, n_out, row, y, c->oc, c->bias);
        return n_out;
    }
    const int64_t nt = tile_of(row);
    const size_t bytes = sizeof(float) * (size_t)c->ic;
    for (int64_t t0 = 0; t0 < n_out; t0 += nt) {
        const int64_t m = n_out - t0 < nt ? n_out - t0 : nt;
        for (int64_t t = 0; t < m; t++) {
            float *col = work + t * row;
            for (int32_t j = 0; j < c->k; j++) {
                const int64_t s = t0 + t + (int64_t)j * c->dil - pad_l;
                if (s >= 0 && s < n) memcpy(col + (int64_t)j * c->ic, x + s * c->ic, bytes);
                else memset(col + (int64_t)j * c->ic, 0, bytes);
            }
        }
        gemm(c->w, c->oc, work, m, row, y + t0 * c->oc, c->oc, c->bias);
    }
    return n_out;
}

int64_t nm_conv1d_ref(const nm_conv1d *c, const float *x, int64_t n, int32_t pad_l, int32_t pad_r, float *y) {
    const int64_t n_out = n + pad_l + pad_r - (int64_t)c->dil * (c->k - 1);
    for (int64_t t = 0; t < n_out; t++)
        for (int32_t o = 0; o < c->oc; o++) {
            float acc = c->bias ? c->bias[o] : 0.0f;
            for (int32_t j = 0; j < c->k; j++) {
                const int64_t s = t + (int64_t)j * c->dil - pad_l;
                if (s < 0 || s >= n) continue;
                const float *w = c->w + ((int64_t)o * c->k + j) * c->ic, *xs = x + s * c->ic;
                for (int32_t i = 0; i < c->ic; i++) acc += w[i] * xs[i];
            }
            y[t * c->oc + o] = acc;
        }
    return n_out > 0 ? n_out : 0;
}

void nm_conv_t1d_pack(const float *src, int32_t ic, int32_t oc, int32_t k, float *dst) {
    for (int32_t j = 0; j < k; j++)
        for (int32_t o = 0; o < oc; o++)
            for (int32_t i = 0; i < ic; i++)
                dst[((int64_t)j * oc + o) * ic + i] = src[((int64_t)i * oc + o) * k + j];
}

int64_t nm_conv_t1d_work(const nm_conv_t1d *c) {
    const int64_t row = (int64_t)c->k * c->oc;
    return tile_of(row > c->ic ? row : c->ic) * row;
}

int64_t nm_conv_t1d_run(const nm_conv_t1d *c, const float *x, int64_t n, float *y, float *work) {
    const int64_t n_out = (n - 1) * c->stride - 2 * (int64_t)c->pad + c->k;
    if (n <= 0 || n_out <= 0) return 0;
    const nm_gemm_fn gemm = nm_gemm_f32_get();
    const int64_t row = (int64_t)c->k * c->oc, nt = tile_of(row > c->ic ? row : c->ic);
    for (int64_t t = 0; t < n_out; t++) { // the bias, then each input step's taps added where they land
        float *yt = y + t * c->oc;
        if (c->bias) memcpy(yt, c->bias, sizeof(float) * (size_t)c->oc);
        else memset(yt, 0, sizeof(float) * (size_t)c->oc);
    }
    for (int64_t s0 = 0; s0 < n; s0 += nt) {
        const int64_t m = n - s0 < nt ? n - s0 : nt;
        gemm(c->w, row, x + s0 * c->ic, m, c->ic, work, row, NULL); // work[s][k * oc + o]
        for (int64_t s = 0; s < m; s++)
            for (int32_t j = 0; j < c->k; j++) {
                const int64_t t = (s0 + s) * c->stride + j - c->pad;
                if (t < 0 || t >= n_out) continue;
                float *yt = y + t * c->oc;
                const float *v = work + s * row + (int64_t)j * c->oc;
                for (int32_t o = 0; o < c->oc; o++) yt[o] += v[o];
            }
    }
    return n_out;
}

int64_t nm_conv_t1d_ref(const nm_conv_t1d *c, const float *x, int64_t n, float *y) {
    const int64_t n_out = (n - 1) * c->stride - 2 * (int64_t)c->pad + c->k;
    for (int64_t t = 0; t < n_out; t++)
        for (int32_t o = 0; o < c->oc; o++) {
            float acc = c->bias ? c->bias[o] : 0.0f;
            for (int64_t s = 0; s < n; s++) {
                const int64_t j = t + c->pad - s * c->stride;
                if (j < 0 || j >= c->k) continue;
                const float *w = c->w + (j * c->oc + o) * c->ic, *xs = x + s * c->ic;
                for (int32_t i = 0; i < c->ic; i++) acc += w[i] * xs[i];
            }
            y[t * c->oc + o] = acc;
        }
    return n_out > 0 ? n_out : 0;
}
