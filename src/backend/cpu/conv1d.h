// 1-D convolutions of the CPU backend (Piper's VITS: the text encoder's FFN,
// the flows' WaveNet layers, HiFi-GAN's decoder), on time-major activations:
// x[t * C + c], channels contiguous. Direct form, the output channels in the
// vector lanes: the weights are packed once as w[tap][ic][ocp] (ocp: oc
// rounded up to 16, zeros beyond oc), and a block of output rows sums, tap by
// tap and input channel by input channel, a broadcast input value times a
// vector of weights. The inputs are read where they lie (no im2col, no
// transpose) and the sums stored as rows: a 24-accumulator block reaches
// ~9/10 of the FMA ports' rate (bench: f32 ~160 GFLOP/s a core on this Xeon).
// A transposed convolution is run phase by phase (outputs t with
// (t + pad) % stride = r), each phase an ordinary convolution of the taps
// r, r + stride, ... over the inputs backwards. The output rows are chunks
// spread over a thread pool; a chunk whose inputs cross the sequence's ends
// or take an activation is first copied (zeros outside, the activation
// applied) into its thread's part of `work`. Nothing is allocated.
// Each output is one sum in a fixed order (bias, then tap, then input
// channel), so the results do not depend on the threads or the chunks.
#ifndef NM_CPU_CONV1D_H
#define NM_CPU_CONV1D_H

#include <stdint.h>

#include "core/threadpool.h"

// A convolution's weights as nm_conv1d_run reads them: w[k][ic][ocp] (PyTorch's
// Conv1d weight is [oc][ic][k]: nm_conv1d_pack reorders it), bias[oc] or NULL;
// in_slope: a leaky ReLU on the input first, max(v, in_slope v) (1: none;
// HiFi-GAN's convolutions follow one).
typedef struct nm_conv1d {
    const float *w, *bias;
    int32_t ic, oc, k, dil;
    float in_slope;
} nm_conv1d;

// Floats of a packed weight: k * ic * ocp.
int64_t nm_conv1d_packed_size(int32_t oc, int32_t ic, int32_t k);
// PyTorch's [oc][ic][k] into nm_conv1d's w[k][ic][ocp] (dst: nm_conv1d_packed_size floats).
void nm_conv1d_pack(const float *src, int32_t oc, int32_t ic, int32_t k, float *dst);
// y[t][oc] = bias[oc] + sum_{k, ic} w[oc][k][ic] * act(x[t + k * dil - pad_l][ic]), for t < n_out, where
// n_out = n + pad_l + pad_r - dil * (k - 1) and x is zero outside [0, n). Returns n_out (0 when negative).
// pool: NULL, or the threads to spread the chunks over; work: nm_conv1d_work(c, threads) floats.
// y must not overlap x.
int64_t nm_conv1d_run(const nm_conv1d *c, const float *x, int64_t n, int32_t pad_l, int32_t pad_r, float *y,
                      float *work, nm_pool *pool);
int64_t nm_conv1d_work(const nm_conv1d *c, int threads);
// The reference: plain loops over the definition above (what the tests hold nm_conv1d_run to).
int64_t nm_conv1d_ref(const nm_conv1d *c, const float *x, int64_t n, int32_t pad_l, int32_t pad_r, float *y);

// A transposed convolution (PyTorch's ConvTranspose1d, weight [ic][oc][k]),
// packed as w[k][ic][ocp] (nm_conv_t1d_pack; nm_conv1d_packed_size(oc, ic, k)
// floats): stride, padding `pad` on both sides.
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

// The kernel under both, on `rows` output rows: y[r * ldy + o] = bias[o] + sum over taps q < ntaps of
// sum_i w[q * wstep + i * ocp + o] * x[(r + q * xstep) * ic + i], for o < oc (bias NULL: 0). It
// computes whole blocks of up to NM_CONV_ROWS rows, so it reads the inputs of rows up to
// `rows` rounded up to NM_CONV_ROWS (they must be readable; their sums are not stored).
#define NM_CONV_ROWS 24
typedef void (*nm_conv_rows_fn)(const float *restrict x, int64_t xstep, const float *restrict w, int64_t wstep,
                                int32_t ntaps, int32_t ic, int32_t oc, const float *restrict bias, int64_t rows,
                                float *restrict y, int64_t ldy);
void nm_conv_rows_ref(const float *restrict x, int64_t xstep, const float *restrict w, int64_t wstep, int32_t ntaps,
                      int32_t ic, int32_t oc, const float *restrict bias, int64_t rows, float *restrict y, int64_t ldy);
void nm_conv_rows_avx512(const float *restrict x, int64_t xstep, const float *restrict w, int64_t wstep,
                         int32_t ntaps, int32_t ic, int32_t oc, const float *restrict bias, int64_t rows,
                         float *restrict y, int64_t ldy);
// This CPU's (AVX-512F: nm_conv_rows_avx512; else, or NM_NO_AVX512=1 / NM_FORCE_REF=1: the reference).
nm_conv_rows_fn nm_conv_rows_get(void);

#endif
