// 1-D convolutions of the CPU backend (Piper's VITS: the text encoder's FFN,
// the flows' WaveNet layers, HiFi-GAN's decoder), on time-major activations:
// x[t * C + c], channels contiguous. Direct form: a block of output rows
// sums, tap by tap and input channel by input channel, the inputs read where
// they lie (no im2col, no transpose) against the weights packed once, and
// stores its sums as rows. Two kernels, picked when the weights are packed:
// - AVX-512 (or the reference loops), f32: the output channels in the vector
//   lanes, w[tap][ic][ocp] (ocp: oc rounded up to 16, zeros beyond oc), a
//   broadcast input times a vector of weights into 24 accumulators;
// - AMX (Sapphire Rapids on; ic a multiple of 32, oc of 16, k > 1): tiles of 16 rows
//   by 16 output channels, each product a sum of three BF16 products with f32
//   accumulation, hi*hi + hi*lo + lo*hi, where every weight and input is
//   split as hi = bf16(v), lo = bf16(v - hi) ("bf16x3": 16 significant bits
//   of each operand, relative error ~1e-5 where one BF16 product has ~4e-3).
// A transposed convolution is run phase by phase (outputs t with
// (t + pad) % stride = r), each phase an ordinary convolution of the taps
// r, r + stride, ... over the inputs backwards. The output rows are chunks
// spread over a thread pool; a chunk whose inputs cross the sequence's ends,
// take an activation or are split for AMX is first copied (zeros outside, the
// activation applied) into its thread's part of `work`. Nothing is
// allocated. Each output is one sum in a fixed order (bias, then tap, then
// input channel), so the results do not depend on the threads or chunks.
#ifndef NM_CPU_CONV1D_H
#define NM_CPU_CONV1D_H

#include <stdbool.h>
#include <stdint.h>

#include "core/threadpool.h"

// A convolution's weights as nm_conv1d_run reads them (nm_conv1d_pack sets them): w, the f32 kernel's
// [k][ic][ocp], or wx, the AMX kernel's tiles (the other NULL); bias[oc] or NULL; in_slope: a leaky ReLU
// on the input first, max(v, in_slope v) (1: none; HiFi-GAN's convolutions follow one).
typedef struct nm_conv1d {
    const float *w;
    const uint16_t *wx;
    const float *bias;
    int32_t ic, oc, k, dil;
    float in_slope;
} nm_conv1d;

// Floats a packed weight takes (either layout): k * ic * ocp.
int64_t nm_conv1d_packed_size(int32_t oc, int32_t ic, int32_t k);
// PyTorch's Conv1d weight src [oc][ic][k] into dst (nm_conv1d_packed_size floats) in the layout of this
// CPU's kernel for c's shape (c->ic, oc, k set), pointing c->w or c->wx at dst.
void nm_conv1d_pack(nm_conv1d *c, const float *src, float *dst);
// What a convolution adds to its sums as it stores them: y = (sums + a + b) * scale, a and b (NULL: none)
// rows laid out as y's (HiFi-GAN's residuals and the mean of its blocks, without another pass).
typedef struct nm_conv_add {
    const float *a, *b;
    float scale;
} nm_conv_add;

// y[t][oc] = bias[oc] + sum_{k, ic} w[oc][k][ic] * act(x[t + k * dil - pad_l][ic]), for t < n_out, where
// n_out = n + pad_l + pad_r - dil * (k - 1) and x is zero outside [0, n); then add's (NULL: nothing).
// Returns n_out (0 when negative). pool: NULL, or the threads to spread the chunks over; work:
// nm_conv1d_work(c, threads) floats, 64-byte aligned. y must not overlap x (it may be add->a or add->b).
int64_t nm_conv1d_run(const nm_conv1d *c, const float *x, int64_t n, int32_t pad_l, int32_t pad_r,
                      const nm_conv_add *add, float *y, float *work, nm_pool *pool);
int64_t nm_conv1d_work(const nm_conv1d *c, int threads);
// The reference: plain loops over the definition above on PyTorch's weight w [oc][ic][k] (c's own
// weights unread; what the tests hold nm_conv1d_run to).
int64_t nm_conv1d_ref(const nm_conv1d *c, const float *w, const float *x, int64_t n, int32_t pad_l, int32_t pad_r,
                      float *y);

// A transposed convolution (PyTorch's ConvTranspose1d, weight [ic][oc][k]): stride, padding `pad` on
// both sides; its weights packed as nm_conv1d's (nm_conv_t1d_pack: w[k][ic][ocp] or AMX tiles, tap by tap).
typedef struct nm_conv_t1d {
    const float *w;
    const uint16_t *wx;
    const float *bias;
    int32_t ic, oc, k, stride, pad;
    float in_slope; // as nm_conv1d's
} nm_conv_t1d;

// src [ic][oc][k] into dst (nm_conv1d_packed_size(oc, ic, k) floats), c->w or c->wx pointed at it.
void nm_conv_t1d_pack(nm_conv_t1d *c, const float *src, float *dst);
// y[t][o] = bias[o] + sum over (s, k) with s * stride + k - pad = t of sum_ic w[ic][o][k] * act(x[s][ic]),
// for t < n_out = (n - 1) * stride - 2 pad + k. Returns n_out. pool and work as nm_conv1d_run's.
int64_t nm_conv_t1d_run(const nm_conv_t1d *c, const float *x, int64_t n, float *y, float *work, nm_pool *pool);
int64_t nm_conv_t1d_work(const nm_conv_t1d *c, int threads);
int64_t nm_conv_t1d_ref(const nm_conv_t1d *c, const float *w, const float *x, int64_t n, float *y); // w [ic][oc][k]

// The f32 kernel, on `rows` output rows: y[r * ldy + o] = bias[o] + sum over taps q < ntaps of
// sum_i w[q * wstep + i * ldw + o] * x[(r + q * xstep) * ic + i], for o < oc (bias NULL: 0), then add's
// a and b (at the same offsets as y) added and the scale applied (add NULL: none). The kernels compute
// whole blocks, so they read the inputs of rows up to `rows` rounded up to NM_CONV_ROWS (they must be
// readable; their sums are not stored).
#define NM_CONV_ROWS 48
// ldw (>= oc rounded up to 16) is the weights' row: a part of a packed weight's output channels is w
// moved to its first channel with the whole's ldw.
typedef void (*nm_conv_rows_fn)(const float *restrict x, int64_t xstep, const float *restrict w, int64_t wstep,
                                int32_t ntaps, int32_t ic, int32_t oc, int64_t ldw, const float *restrict bias,
                                int64_t rows, const nm_conv_add *add, float *y, int64_t ldy);
void nm_conv_rows_ref(const float *restrict x, int64_t xstep, const float *restrict w, int64_t wstep, int32_t ntaps,
                      int32_t ic, int32_t oc, int64_t ldw, const float *restrict bias, int64_t rows,
                      const nm_conv_add *add, float *y, int64_t ldy);
void nm_conv_rows_avx512(const float *restrict x, int64_t xstep, const float *restrict w, int64_t wstep,
                         int32_t ntaps, int32_t ic, int32_t oc, int64_t ldw, const float *restrict bias, int64_t rows,
                         const nm_conv_add *add, float *y, int64_t ldy);
// This CPU's (AVX-512F: nm_conv_rows_avx512; else, or NM_NO_AVX512=1 / NM_FORCE_REF=1: the reference).
nm_conv_rows_fn nm_conv_rows_get(void);

// The AMX kernel: the same sums on the split inputs xh, xl ([rows][ic] BF16 each) and tiles w (wstep
// uint16_t between taps; nm_conv1d_pack's AMX layout), ic a multiple of 32, oc of 16.
void nm_conv_rows_amx(const uint16_t *restrict xh, const uint16_t *restrict xl, int64_t xstep,
                      const uint16_t *restrict w, int64_t wstep, int32_t ntaps, int32_t ic, int32_t oc,
                      const float *restrict bias, int64_t rows, const nm_conv_add *add, float *y, int64_t ldy);
// Rows [s0, s0 + m) of x (n rows of ic, a multiple of 16) through the activation, zeros outside [0, n),
// split into xh, xl.
void nm_conv_split_avx512(const float *restrict x, int64_t n, int32_t ic, float slope, int64_t s0, int64_t m,
                          uint16_t *restrict xh, uint16_t *restrict xl);
// Whether packing picks AMX for a shape: this CPU has it (NM_NO_AMX, NM_NO_AVX512, NM_FORCE_REF unset),
// ic % 32 == 0, oc % 16 == 0, and k > 1. A 1x1 stays f32: in VITS they are the flows' projections and the
// encoder's, whose outputs feed differences of near-equal values (the flow's x - m); measured on the
// joe voice against onnxruntime, AMX there cost ~8 dB of SNR (72 -> 65 dB at worst) and no time.
bool nm_conv_amx_for(int32_t ic, int32_t oc, int32_t k);

#endif
