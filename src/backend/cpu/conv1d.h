// 1-D convolutions of the CPU backend (Piper's VITS: the text encoder's FFN,
// the flows' WaveNet layers, HiFi-GAN's decoder), on time-major activations:
// x[t * C + c], channels contiguous. Direct form: a block of output rows
// sums, tap by tap and input channel by input channel, the inputs read where
// they lie (no im2col, no transpose) against the weights packed once, and
// stores its sums as rows. Two kernels, picked when the weights are packed:
// - AVX-512 (or the reference loops), f32: the output channels in the vector
//   lanes, the weights in panels of 32 output channels, each [tap][ic][32]
//   contiguous (zeros beyond oc; a block of rows streams its panel in order),
//   a broadcast input times a vector of weights into 24 accumulators (one
//   output channel: the input channels in the lanes instead);
// - AMX (Sapphire Rapids on; ic a multiple of 32, oc of 16, k > 1): tiles of 16 rows
//   by 16 output channels, each product a sum of three BF16 products with f32
//   accumulation, hi*hi + hi*lo + lo*hi, where every weight and input is
//   split as hi = bf16(v), lo = bf16(v - hi) ("bf16x3": 16 significant bits
//   of each operand, relative error ~1e-5 where one BF16 product has ~4e-3).
// Where the caller allows it (nm_conv1d.winograd: long sequences; the weights take
// n / k times the memory) and AMX does not take the shape, a convolution of
// 2 .. n - 2 taps runs Winograd's (Toom-Cook's) minimal filtering F(m, k)
// instead: tiles of m = n - k + 1 outputs (n = 6, 8 or 10 points: 0, +-1, +-2,
// +-1/2, +-3/2 in that order, then infinity; dilated tiles interleaved), each
// tile's inputs transformed to n rows (B^T, the activation applied as they are
// read), n products with the transformed weights (G g, computed in double at
// packing) on the f32 row kernel, the n rows transformed back (A^T) with the
// bias, adds and scale: m k multiply-adds per output and channel pair become n
// (10 points: 2.4x, 3x and 2.8x fewer for k 3, 5, 7). Its rounding error is
// larger than the direct form's: against a double-precision sum, ~106 dB SNR
// with 10 points, ~122 dB with 8, ~136 dB for the direct form.
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
// panels of 32 output channels, [oc / 32][k][ic][32] (ocp: oc rounded up to 32; wm > 0: Winograd's
// [n][ocp / 32][ic][32], then its A^T [m][n] and B^T [n][n]), or wx, the AMX
// kernel's tiles (the other NULL); bias[oc] or NULL; in_slope: a leaky ReLU on the input first,
// max(v, in_slope v) (1: none; HiFi-GAN's convolutions follow one); winograd (set before packing): the
// points of a Winograd tile the packing may pick (0: never; 6, 8 or 10: worth the memory where the
// convolution runs on long sequences, fewer points where its results are differenced); wm (set by
// packing): the outputs of a Winograd tile, 0 for the direct form.
typedef struct nm_conv1d {
    const float *w;
    const uint16_t *wx;
    const float *bias;
    int32_t ic, oc, k, dil;
    float in_slope;
    int32_t winograd;
    int32_t wm;
} nm_conv1d;

// Floats c's packed weight takes (c->ic, oc, k and winograd set): k * ic * ocp in the direct forms,
// n * ic * ocp + m * n + n * n in Winograd's.
int64_t nm_conv1d_packed_size(const nm_conv1d *c);
// PyTorch's Conv1d weight src [oc][ic][k] into dst (nm_conv1d_packed_size floats) in the layout this
// CPU's kernels take for c's shape (c->ic, oc, k, winograd set), pointing c->w or c->wx at dst, setting
// c->wm.
void nm_conv1d_pack(nm_conv1d *c, const float *src, float *dst);
// The outputs of a Winograd tile packing picks for c's shape (0: the direct form; NM_NO_WINOGRAD=1: never).
int32_t nm_conv1d_wino_m(const nm_conv1d *c);
// The outputs of a Winograd tile of `points` points (6, 8 or 10) for k taps, wherever the form is
// picked (0: k outside 2 .. points - 2, or points not one of those).
int32_t nm_conv1d_wino_tile(int32_t k, int32_t points);
// The points the CPU backend's NM_OP_CONV1D allows (HiFi-GAN's convolutions: long sequences, and at the
// voice's output the rounding of 10 points costs < 1 dB of SNR against onnxruntime).
#define NM_CONV_OP_WINO 10
// What a convolution adds to its sums as it stores them: y = (sums + a + b) * scale, a and b (NULL: none)
// rows laid out as y's (HiFi-GAN's residuals and the mean of its blocks, without another pass).
typedef struct nm_conv_add {
    const float *a, *b;
    float scale;
} nm_conv_add;

// y[t][oc] = bias[oc] + sum_{k, ic} w[oc][k][ic] * act(x[t + k * dil - pad_l][ic]), for t < n_out, where
// n_out = n + pad_l + pad_r - dil * (k - 1) and x is zero outside [0, n); then add's (NULL: nothing).
// Returns n_out (0 when negative). org: the index of y's first row in the whole sequence x is a part of
// (0 for a whole): Winograd's tiles start at the whole's multiples of m * dil, so a part's outputs equal
// the whole's bit for bit where the part's inputs do over the tiles' reach, (m - 1) dil + (k - 1) dil / 2
// rows each side (nm_conv_reach in backend/backend.h). pool: NULL, or the threads to spread the chunks over; work:
// nm_conv1d_work(c, threads) floats, 64-byte aligned. y must not overlap x (it may be add->a or add->b).
int64_t nm_conv1d_run(const nm_conv1d *c, const float *x, int64_t n, int32_t pad_l, int32_t pad_r, int64_t org,
                      const nm_conv_add *add, float *y, float *work, nm_pool *pool);
int64_t nm_conv1d_work(const nm_conv1d *c, int threads);
// The reference: plain loops over the definition above on PyTorch's weight w [oc][ic][k] (c's own
// weights unread; what the tests hold nm_conv1d_run to).
int64_t nm_conv1d_ref(const nm_conv1d *c, const float *w, const float *x, int64_t n, int32_t pad_l, int32_t pad_r,
                      float *y);

// A transposed convolution (PyTorch's ConvTranspose1d, weight [ic][oc][k]): stride, padding `pad` on
// both sides; its weights packed as nm_conv1d's (nm_conv_t1d_pack: f32 panels or AMX tiles, tap by tap).
// Where the caller allows it (winograd, as nm_conv1d's) and the f32 kernels run, a transposed
// convolution of Q = ceil(k / stride) >= 2 taps a phase runs as one ordinary convolution of Q taps whose
// stride * oc output channels are the phases' outputs side by side ("stacked": the inputs' row s gives
// the outputs s * stride - pad .. + stride, a contiguous run of y), in Winograd's form (wm: its tile's
// outputs, in input rows); the stacked rows that cross y's ends go through a row of the work first.
typedef struct nm_conv_t1d {
    const float *w;
    const uint16_t *wx;
    const float *bias;
    int32_t ic, oc, k, stride, pad;
    float in_slope; // as nm_conv1d's
    int32_t winograd, wm;
} nm_conv_t1d;

// Floats c's packed weight takes (c->ic, oc, k, stride and winograd set): k * ic * ocp, or the stacked
// convolution's (nm_conv1d_packed_size).
int64_t nm_conv_t1d_packed_size(const nm_conv_t1d *c);
// src [ic][oc][k] into dst (nm_conv_t1d_packed_size floats), c->w or c->wx pointed at it, c->wm set.
void nm_conv_t1d_pack(nm_conv_t1d *c, const float *src, float *dst);
// The outputs of a stacked Winograd tile packing picks for c's shape (0: phase by phase).
int32_t nm_conv_t1d_wino_m(const nm_conv_t1d *c);
// y[t][o] = bias[o] + sum over (s, k) with s * stride + k - pad = t of sum_ic w[ic][o][k] * act(x[s][ic]),
// for t < n_out = (n - 1) * stride - 2 pad + k. Returns n_out. org: x's first row's index in the whole
// sequence it is a part of (Winograd's tiles placed as the whole's; the reach of a stacked tile: wm - 1
// more input rows each side). pool and work as nm_conv1d_run's.
int64_t nm_conv_t1d_run(const nm_conv_t1d *c, const float *x, int64_t n, int64_t org, float *y, float *work,
                        nm_pool *pool);
int64_t nm_conv_t1d_work(const nm_conv_t1d *c, int threads);
int64_t nm_conv_t1d_ref(const nm_conv_t1d *c, const float *w, const float *x, int64_t n, float *y); // w [ic][oc][k]

// The f32 kernel, on `rows` output rows: y[r * ldy + o] = bias[o] + sum over taps q < ntaps of
// sum_i w[q * wstep + i * ldw + o] * x[(r + q * xstep) * ic + i], for o < oc (bias NULL: 0), then add's
// a and b (at the same offsets as y) added and the scale applied (add NULL: none). The kernels compute
// whole blocks, so they read the inputs of rows up to `rows` rounded up to NM_CONV_ROWS (they must be
// readable; their sums are not stored).
#define NM_CONV_ROWS 48
// ldw (>= oc rounded up to 16) is the weights' row (a packed weight's: its panel's, 32; the convolutions
// call the kernel a panel at a time).
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

// Winograd's transforms of one tile (n <= NM_WINO_N points). In: v[p * vstep + i] = sum_j bt[p * n + j] *
// act(xr[j][i]) for p < n, i < ic (each xr[j] a readable row: zeros where the input has none; act as
// in_slope's). Out: y[(s - s0) *
// ystep + o] = (bias[o] + sum_p at[s * n + p] * mt[p * mstep + o] + a + b) * scale for s0 <= s < s1,
// o < oc, a and b add's rows at y's offsets (add NULL: none, scale 1; bias NULL: 0); at's rows are n long.
#define NM_WINO_N 10
typedef void (*nm_wino_in_fn)(const float *const *xr, int32_t n, int32_t ic, float slope, const float *bt, float *v,
                              int64_t vstep);
typedef void (*nm_wino_out_fn)(const float *mt, int64_t mstep, int32_t n, int32_t s0, int32_t s1, int32_t oc,
                               const float *at, const float *bias, const nm_conv_add *add, float *y, int64_t ystep);
void nm_wino_in_ref(const float *const *xr, int32_t n, int32_t ic, float slope, const float *bt, float *v,
                    int64_t vstep);
void nm_wino_out_ref(const float *mt, int64_t mstep, int32_t n, int32_t s0, int32_t s1, int32_t oc, const float *at,
                     const float *bias, const nm_conv_add *add, float *y, int64_t ystep);
void nm_wino_in_avx512(const float *const *xr, int32_t n, int32_t ic, float slope, const float *bt, float *v,
                       int64_t vstep);
void nm_wino_out_avx512(const float *mt, int64_t mstep, int32_t n, int32_t s0, int32_t s1, int32_t oc,
                        const float *at, const float *bias, const nm_conv_add *add, float *y, int64_t ystep);

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
