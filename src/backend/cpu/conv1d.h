// 1-D convolutions of the CPU backend (Piper's VITS: the text encoder's FFN,
// the flows' WaveNet layers, HiFi-GAN's decoder), on time-major activations:
// x[t * C + c], channels contiguous. Each is a product on the f32 GEMM kernels
// (gemm.h) over tiles of 32 time steps, the tiles spread over a thread pool:
// with the AVX-512 panel kernel, a tile's inputs are packed straight from x
// into panels (each tap of the kernel a block of rows); without it, gathered
// into rows (im2col) for nm_gemm_f32_get's kernel. A transposed convolution
// computes each output tile from the inputs that reach it (its taps scattered
// from the tile's product, col2im), so threads never write the same output.
// Nothing is allocated: the caller's `work` holds each thread's tile.
#ifndef NM_CPU_CONV1D_H
#define NM_CPU_CONV1D_H

#include <stdint.h>

#include "core/threadpool.h"

// A convolution's weights as nm_conv1d_run reads them: w[oc][k][ic] (PyTorch's
// Conv1d weight is [oc][ic][k]: nm_conv1d_pack reorders it), bias[oc] or NULL;
// in_slope: a leaky ReLU on the input first, max(v, in_slope v) (1: none;
// HiFi-GAN's convolutions follow one), applied as the input is packed.
typedef struct nm_conv1d {
    const float *w, *bias;
    int32_t ic, oc, k, dil;
    float in_slope;
} nm_conv1d;

// PyTorch's [oc][ic][k] into nm_conv1d's [oc][k][ic] (dst: oc * ic * k floats).
void nm_conv1d_pack(const float *src, int32_t oc, int32_t ic, int32_t k, float *dst);
// y[t][oc] = bias[oc] + sum_{k, ic} w[oc][k][ic] * act(x[t + k * dil - pad_l][ic]), for t < n_out, where
// n_out = n + pad_l + pad_r - dil * (k - 1) and x is zero outside [0, n). Returns n_out (0 when negative).
// pool: NULL, or the threads to spread the tiles over; work: nm_conv1d_work(c, threads) floats,
// 64-byte aligned. y must not overlap x. Each output is the same whatever the threads.
int64_t nm_conv1d_run(const nm_conv1d *c, const float *x, int64_t n, int32_t pad_l, int32_t pad_r, float *y,
                      float *work, nm_pool *pool);
int64_t nm_conv1d_work(const nm_conv1d *c, int threads);
// The reference: plain loops over the definition above (what the tests hold nm_conv1d_run to).
int64_t nm_conv1d_ref(const nm_conv1d *c, const float *x, int64_t n, int32_t pad_l, int32_t pad_r, float *y);

// A transposed convolution (PyTorch's ConvTranspose1d, weight [ic][oc][k]),
// packed as w[k * oc + o][ic] (nm_conv_t1d_pack): stride, padding `pad` on both sides.
typedef struct nm_conv_t1d {
    const float *w, *bias;
    int32_t ic, oc, k, stride, pad;
    float in_slope; // as nm_conv1d's
} nm_conv_t1d;

void nm_conv_t1d_pack(const float *src, int32_t ic, int32_t oc, int32_t k, float *dst);
// y[t][o] = bias[o] + sum over (s, k) with s * stride + k - pad = t of sum_ic w[ic][o][k] * act(x[s][ic]),
// for t < n_out = (n - 1) * stride - 2 pad + k. Returns n_out. pool and work as nm_conv1d_run's.
int64_t nm_conv_t1d_run(const nm_conv_t1d *c, const float *x, int64_t n, float *y, float *work, nm_pool *pool);
int64_t nm_conv_t1d_work(const nm_conv_t1d *c, int threads);
int64_t nm_conv_t1d_ref(const nm_conv_t1d *c, const float *x, int64_t n, float *y);

#endif
