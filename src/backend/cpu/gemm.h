// f32 GEMM kernels of the CPU backend's prefill path:
//   y[t * ldy + r] = sum_k w[r * K + k] * x[t * K + k] (+ bias[r])
// for rows r in [0, R) of a dequantized weight tile and tokens t in [0, T).
#ifndef NM_CPU_GEMM_H
#define NM_CPU_GEMM_H

#include <stdint.h>

typedef void (*nm_gemm_fn)(const float *restrict w, int64_t R, const float *restrict x, int64_t T, int64_t K,
                           float *restrict y, int64_t ldy, const float *restrict bias);

// Reference: plain loops, the spec the SIMD variants are tested against.
void nm_gemm_f32_ref(const float *restrict w, int64_t R, const float *restrict x, int64_t T, int64_t K,
                     float *restrict y, int64_t ldy, const float *restrict bias);
#ifdef NM_HAVE_X86_SIMD
void nm_gemm_f32_avx2(const float *restrict w, int64_t R, const float *restrict x, int64_t T, int64_t K,
                      float *restrict y, int64_t ldy, const float *restrict bias);
#endif
// The best kernel for this CPU (NM_FORCE_REF=1 forces the reference).
nm_gemm_fn nm_gemm_f32_get(void);

// The AVX-512 panel kernel (x86_gemm512.c), the same product from the other
// side: the activations packed into panels of 16 tokens
//   nm_gemm_pack16(x + 16 p K, K, 1, n, K, xp + 16 p K): xp[k * 16 + l] = x[l * K + k],
// zeros for lanes n..15, 64-byte aligned; R <= 12 weight rows read in place
// (row r at w + r * ldw; a row stride of K + 16 rather than a multiple of
// 4 KiB keeps the rows off one L1 set) against nt <= 32 tokens (one panel,
// or two back to back), y[l * ldy + r] for l < nt. Each output is one FMA
// chain: fmaf(w[r][k], x[l][k], .) from the bias (0 without one) for k in
// order, whatever the tile and panel counts; equal to nm_gemm_fn up to the
// order of the f32 sums.
#define NM_GEMM_PACK_ROWS 16
#define NM_GEMM_XPANEL_ROWS 12
// Packs R <= 16 rows of K elements, element (r, k) at w[r * rs + k * ks]:
// wp[k * 16 + r], zeros for rows R..15 (rs = K, ks = 1 for a row-major tile).
void nm_gemm_pack16(const float *restrict w, int64_t rs, int64_t ks, int64_t R, int64_t K, float *restrict wp);
#ifdef NM_HAVE_X86_SIMD
void nm_gate_avx512(const float *a, const float *b, float *y, int64_t n);
void nm_tanh_avx512(float *x, int64_t n);
#endif
typedef void (*nm_gemm_xpanel_fn)(const float *restrict w, int64_t ldw, int64_t R, const float *restrict xp, int64_t nt,
                                  int64_t K, float *restrict y, int64_t ldy, const float *restrict bias);
// The same sums left in panel layout, for attention (the scores are the next
// product's packed activations): row r's 16 lanes at y + 16 r, the second
// panel's at y + ys; no bias; all 16 lanes written (zeros for x's zero lanes).
typedef void (*nm_gemm_xpanel_pout_fn)(const float *restrict w, int64_t ldw, int64_t R, const float *restrict xp,
                                       int64_t nt, int64_t K, float *restrict y, int64_t ys);
// Softmax over the n rows of one panel, per lane: sp[16 j + l] for j < n
// becomes e^(s - max_l) / sum_l, with nm_expsum's exponential; a score of
// -inf (masked) gives exactly 0. Each lane needs one finite score.
typedef void (*nm_softmax_panel_fn)(float *restrict sp, int64_t n);
// The C library's expf on x <= 0 (x < -103.97: 0), in double as glibc
// computes it; tab = nm_expf_libm_table(). And ggml's softmax of a panel
// with it: per lane, s * scale, the max, expf(s - max) summed in order of
// j, times 1 / sum - what the scalar loop computes, the same bits.
typedef void (*nm_expf_libm_fn)(const float *x, float *y, int64_t n, const double *tab);
typedef void (*nm_softmax_panel_ggml_fn)(float *restrict sp, int64_t n, float scale, const double *tab);
// 2^(i / 32) for i < 32, as the bits of a double minus i << 47 (the table of glibc's expf).
const double *nm_expf_libm_table(void);
#ifdef NM_HAVE_X86_SIMD
void nm_gemm_f32_xpanel_avx512(const float *restrict w, int64_t ldw, int64_t R, const float *restrict xp, int64_t nt,
                               int64_t K, float *restrict y, int64_t ldy, const float *restrict bias);
void nm_gemm_f32_xpanel_pout_avx512(const float *restrict w, int64_t ldw, int64_t R, const float *restrict xp,
                                    int64_t nt, int64_t K, float *restrict y, int64_t ys);
void nm_softmax_panel_avx512(float *restrict sp, int64_t n);
void nm_expf_libm_avx512(const float *x, float *y, int64_t n, const double *tab);
void nm_softmax_panel_ggml_avx512(float *restrict sp, int64_t n, float scale, const double *tab);
#endif
// The panel kernels for this CPU, or NULL where there are none (no AVX-512F,
// NM_FORCE_REF=1 or NM_NO_AVX512=1): then use nm_gemm_f32_get.
typedef struct nm_gemm_panel_kernels {
    nm_gemm_xpanel_fn gemm;
    nm_gemm_xpanel_pout_fn gemm_pout;
    nm_softmax_panel_fn softmax;
    nm_expf_libm_fn expf_libm;             // NULL where it disagrees with this libm's expf on
    nm_softmax_panel_ggml_fn softmax_ggml; // a sample at start (then: scalar expf)
    // y[i] = tanh(a[i]) sigmoid(b[i]) (WaveNet's gate), and x[i] = tanh(x[i]) in place, for n elements,
    // through exp512 (absolute error below 1e-6 against libm's tanhf and expf)
    void (*gate)(const float *a, const float *b, float *y, int64_t n);
    void (*tanh)(float *x, int64_t n);
} nm_gemm_panel_kernels;
const nm_gemm_panel_kernels *nm_gemm_panel_get(void);

// Softmax numerators: s[j] = e^(s[j] - m) for j < n, returning their sum.
// The exponential is Cody-Waite reduction + a degree-6 polynomial (relative
// error < 2.5e-7); nm_expf is the same for one value.
float nm_expf(float x);
typedef float (*nm_expsum_fn)(float *s, int64_t n, float m);
float nm_expsum_ref(float *s, int64_t n, float m);
#ifdef NM_HAVE_X86_SIMD
float nm_expsum_avx2(float *s, int64_t n, float m);
#endif
nm_expsum_fn nm_expsum_get(void);

// y[i] = x[i] * sigmoid(x[i] (a + b x[i]^2)) = x / (1 + e^(-x (a + b x^2))),
// with the exponential above: GELU(tanh) (a = 2 sqrt(2/pi), b = 0.044715 a:
// 0.5 (1 + tanh z) is the logistic of 2z), quick GELU (a = 1.702, b = 0).
// In place allowed.
typedef void (*nm_xsigmoid_fn)(const float *x, float *y, int64_t n, float a, float b);
void nm_xsigmoid_ref(const float *x, float *y, int64_t n, float a, float b);
#ifdef NM_HAVE_X86_SIMD
void nm_xsigmoid_avx2(const float *x, float *y, int64_t n, float a, float b);
#endif
nm_xsigmoid_fn nm_xsigmoid_get(void);

#endif
