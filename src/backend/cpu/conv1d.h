// 1-D convolutions of the CPU backend (Piper's VITS: the text encoder's FFN,
// the flows' WaveNet layers, HiFi-GAN's decoder), on time-major activations:
// x[t * C + c], channels contiguous. Each is a product on the f32 GEMM kernel
// (gemm.h) over tiles of time: the convolution's inputs gathered for a tile
// (im2col), or its transposed taps scattered from one (col2im), so no
// allocation scales with the input beyond the caller's `work`.
#ifndef NM_CPU_CONV1D_H
#define NM_CPU_CONV1D_H

#include <stdint.h>

// A convolution's weights as nm_conv1d reads them: w[oc][k][ic] (PyTorch's
// Conv1d weight is [oc][ic][k]: nm_conv1d_pack reorders it), bias[oc] or NULL.
typedef struct nm_conv1d {
    const float *w, *bias;
    int32_t ic, oc, k, dil;
} nm_conv1d;

// PyTorch's [oc][ic][k] into nm_conv1d's [oc][k][ic] (dst: oc * ic * k floats).
void nm_conv1d_pack(const float *src, int32_t oc, int32_t ic, int32_t k, float *dst);
// y[t][oc] = bias[oc] + sum_{k, ic} w[oc][k][ic] * x[t + k * dil - pad_l][ic], for t < n_out, where
// n_out = n + pad_l + pad_r - dil * (k - 1) and x is zero outside [0, n). Returns n_out (0 when negative).
// work: at least nm_conv1d_work(c) floats (unused for k 1, pads 0). y must not overlap x.
int64_t nm_conv1d_run(const nm_conv1d *c, const float *x, int64_t n, int32_t pad_l, int32_t pad_r, float *y, float *work);
int64_t nm_conv1d_work(const nm_conv1d *c);
// The reference: plain loops over the definition above (what the tests hold nm_conv1d to).
int64_t nm_conv1d_ref(const nm_conv1d *c, const float *x, int64_t n, int32_t pad_l, int32_t pad_r, float *y);

// A transposed convolution (PyTorch's ConvTranspose1d, weight [ic][oc][k]),
// packed as w[k * oc + o][ic] (nm_conv_t1d_pack): stride, padding `pad` on both sides.
typedef struct nm_conv_t1d {
    const float *w, *bias;
    int32_t ic, oc, k, stride, pad;
} nm_conv_t1d;

void nm_conv_t1d_pack(const float *src, int32_t ic, int32_t oc, int32_t k, float *dst);
// y[t][o] = bias[o] + sum over (s, k) with s * stride + k - pad = t of sum_ic w[ic][o][k] * x[s][ic],
// for t < n_out = (n - 1) * stride - 2 pad + k. Returns n_out. work: nm_conv_t1d_work(c) floats.
int64_t nm_conv_t1d_run(const nm_conv_t1d *c, const float *x, int64_t n, float *y, float *work);
int64_t nm_conv_t1d_work(const nm_conv_t1d *c);
int64_t nm_conv_t1d_ref(const nm_conv_t1d *c, const float *x, int64_t n, float *y);

#endif
