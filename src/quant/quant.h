// Tensor element types and their kernels.
//
// Block layouts are bit-compatible with the GGUF files written by llama.cpp
// (ggml type numbering). Every type has a scalar reference (`_ref`): it is the
// spec, the fallback, and what SIMD variants are tested against.
//
// Kernels operate on whole rows: `n` must be a multiple of the type's block size.
#ifndef NM_QUANT_H
#define NM_QUANT_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

// ggml numbering (GGUF tensor type field).
enum nm_type {
    NM_TYPE_F32 = 0,
    NM_TYPE_F16 = 1,
    NM_TYPE_Q4_0 = 2,
    NM_TYPE_Q4_1 = 3,
    NM_TYPE_Q5_0 = 6,
    NM_TYPE_Q5_1 = 7,
    NM_TYPE_Q8_0 = 8,
    NM_TYPE_Q8_1 = 9,
    NM_TYPE_Q2_K = 10,
    NM_TYPE_Q3_K = 11,
    NM_TYPE_Q4_K = 12,
    NM_TYPE_Q5_K = 13,
    NM_TYPE_Q6_K = 14,
    NM_TYPE_Q8_K = 15,
    NM_TYPE_I32 = 26, // ids and positions (nm_op.ids); a row size, no kernels (traits: not supported)
    NM_TYPE_BF16 = 30,
    NM_TYPE_MXFP4 = 39,
    NM_TYPE_COUNT = 40
};

#define NM_QK 32    // block size of the legacy formats and MXFP4
#define NM_QK_K 256 // super-block size of the K formats

typedef struct nm_type_traits {
    const char *name;   // "q4_K", as llama.cpp prints it
    int64_t blck_size;  // elements per block
    size_t type_size;   // bytes per block
    bool supported;     // we have kernels for it
} nm_type_traits;

// Traits of `type`, or NULL if the number is not a known type.
const nm_type_traits *nm_type_traits_get(uint32_t type);
// Bytes of a row of n elements; 0 if the type is unknown or n is not a multiple
// of its block size.
size_t nm_row_size(uint32_t type, int64_t n);

// ---- half precision ----------------------------------------------------------
float nm_fp16_to_fp32(uint16_t h);
uint16_t nm_fp32_to_fp16(float f); // round to nearest even
float nm_bf16_to_fp32(uint16_t h);
uint16_t nm_fp32_to_bf16(float f); // round to nearest even, NaN kept quiet
float nm_e8m0_to_fp32_half(uint8_t e); // 2^(e-128): the MXFP4 scale convention of ggml

// ---- reference kernels ---------------------------------------------------------
// dst[0..n) = dequantized src row.
void nm_dequantize_row_ref(uint32_t type, const void *src, float *dst, int64_t n);
// Quantizes n floats into dst (nm_row_size(type, n) bytes). Same algorithm as
// llama.cpp's reference quantizers (no importance matrix).
void nm_quantize_row_ref(uint32_t type, const float *src, void *dst, int64_t n);
// Fused dequant-dot: sum_i w[i] * x[i], unpacking w block by block in registers
// (no dequantized copy of the row).
float nm_vec_dot_ref(uint32_t type, const void *w, const float *x, int64_t n);

// ---- dispatch -------------------------------------------------------------------
typedef float (*nm_dot_fn)(const void *restrict w, const float *restrict x, int64_t n);
typedef void (*nm_dequant_fn)(const void *restrict src, float *restrict dst, int64_t n);

// ---- quantized activations (llama.cpp's vec_dot_type path) ------------------------
// llama.cpp multiplies a quantized weight row by first quantizing the
// activation row to the weight's vec_dot_type and then taking an integer dot.
// Matching its logits needs the same numerics, so we do the same.

// The activation type paired with weight type `type` (ggml's vec_dot_type):
// q4_0, q5_0, q8_0, mxfp4 -> q8_0; q4_1, q5_1, q8_1 -> q8_1; q2_K..q6_K, q8_K ->
// q8_K; f32, f16, bf16 -> themselves. NM_TYPE_COUNT for an unknown type.
uint32_t nm_vec_dot_type(uint32_t type);

// Activation row x[0..n) -> n elements of the activation type (nm_row_size bytes
// at xq): f32 copies, f16/bf16 round to nearest even, q8_0/q8_1/q8_K give the
// same bytes as llama.cpp's x86 quantize_row_q8_0/q8_1/q8_K (see ref_dotq.c).
typedef void (*nm_quant_act_fn)(const float *restrict x, void *restrict xq, int64_t n);
// Weight row w . activation row xq (of type nm_vec_dot_type(weight type)), n elements.
typedef float (*nm_dotq_fn)(const void *restrict w, const void *restrict xq, int64_t n);
// Many weight rows x many activation rows (prefill): for r < n_rows, t < n_tok,
//   y[t*ldy + r] = dotq(w + r*w_stride, xq + t*x_stride, K)
// (strides in bytes; xq rows of type nm_vec_dot_type(weight type)). Equal to the
// dotq loop up to the order of the f32 sums; SIMD versions unpack each weight
// block once for several tokens. Writes only those y entries.
typedef void (*nm_gemmq_fn)(const void *restrict w, size_t w_stride, int64_t n_rows, const void *restrict xq,
                            size_t x_stride, int64_t n_tok, int64_t K, float *restrict y, int64_t ldy);

// Decode matmul (one token): many weight rows x one activation row. gemv_prep
// turns the activation row xq (of type nm_vec_dot_type(weight type)) into the
// layout the kernel wants, once per activation (at most NM_GEMV_PREP_BYTES(K)
// bytes at prep, 64-byte aligned); gemv then computes, for r < n_rows,
//   y[r] = dotq(w + r*w_stride, xq, K)
// up to the order of the f32 sums, prefetching rows ahead of the one it works
// on, but never beyond row n_rows + n_ahead. Only in tables where the CPU pays
// for it (the AVX-512 table); elsewhere NULL and the backend loops over dotq.
//
// Decode streams each weight row once per token from DRAM; every decode loop
// (gemv, and the backend's dotq loop) prefetches rows NM_PREFETCH_ROWS ahead
// into L1 and NM_PREFETCH_FAR_BYTES ahead into L2. The L1 prefetches alone
// leave a core as many lines in flight as L1 has miss buffers: Gemma 3's q8_0
// head read 12 GB/s from DRAM on one Zen 4 core with them, 18 with both.
#define NM_PREFETCH_ROWS 8
#define NM_PREFETCH_FAR_BYTES 32768
static inline int64_t nm_prefetch_far_rows(size_t row_bytes) {
    const int64_t far = (int64_t)(NM_PREFETCH_FAR_BYTES / (row_bytes ? row_bytes : 1));
    return far > 2 * NM_PREFETCH_ROWS ? far : 2 * NM_PREFETCH_ROWS;
}
// The bytes of one row into L1 (prefetcht0 on x86), or into L2 (prefetcht2).
static inline void nm_prefetch_l1(const void *p, size_t bytes) {
    for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch((const char *)p + off, 0, 3);
}
static inline void nm_prefetch_l2(const void *p, size_t bytes) {
    for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch((const char *)p + off, 0, 1);
}
#define NM_GEMV_PREP_BYTES(K) ((size_t)((K) + 1023) / 1024 * 4096 + 256)
typedef void (*nm_gemv_prep_fn)(const void *restrict xq, int64_t K, void *restrict prep);
typedef void (*nm_gemv_fn)(const void *restrict w, size_t w_stride, int64_t n_rows, int64_t n_ahead,
                           const void *restrict prep, int64_t K, float *restrict y);

// A small batch (2..NM_GEMV_MULTI_MAX tokens, a server's decode step): gemv_multi computes, for r < n_rows,
// t < n_tok, y[t*ldy + r] with the bits gemv gives it for token t alone (prepared by gemv_prep at
// prep + t * prep_stride), each weight row read and unpacked once for all the tokens. Where a type has
// none, the backend calls gemv a token at a time over blocks of rows.
#define NM_GEMV_MULTI_MAX 8
typedef void (*nm_gemv_multi_fn)(const void *restrict w, size_t w_stride, int64_t n_rows, int64_t n_ahead,
                                 const void *restrict prep, size_t prep_stride, int n_tok, int64_t K,
                                 float *restrict y, int64_t ldy);

// Prefill over packed activations (tables where the CPU pays for it: the
// AVX-512 one). gemmq_pack lays out one group of n_tok <= NM_GQP_TOK
// activation rows xq (of the ACTIVATION type it is indexed by: q8_0 or q8_1)
// as the packed kernels read them, NM_GQP_BYTES(K) bytes at pack (64-byte
// aligned; lanes past n_tok are zero activations). The layout is the same for
// every weight type of one activation type, so the matmuls of a group share
// it. gemmq_packed then computes, for r < n_rows, t < n_tok,
//   y[t*ldy + r] = dotq_ref(w + r*w_stride, xq row t, K)
// from the packed groups (group g at pack + g * NM_GQP_BYTES(K)), bit for bit
// the reference's sums (the same integer block sums, the same f32 operations
// in the same order). Cheaper than gemmq from about NM_GQP_MIN_TOKENS tokens.
#define NM_GQP_TOK 16
#define NM_GQP_MIN_TOKENS 8
#define NM_GQP_BYTES(K) ((size_t)(K) / 32 * 640)
typedef void (*nm_gemmq_pack_fn)(const void *restrict xq, size_t x_stride, int64_t n_tok, int64_t K,
                                 void *restrict pack);
typedef void (*nm_gemmq_packed_fn)(const void *restrict w, size_t w_stride, int64_t n_rows, const void *restrict pack,
                                   int64_t n_tok, int64_t K, float *restrict y, int64_t ldy);

typedef struct nm_kernels {
    const char *name;                  // "ref", "avx2", "neon"
    nm_dot_fn dot[NM_TYPE_COUNT];      // NULL where the type is unsupported
    nm_dequant_fn dequant[NM_TYPE_COUNT];
    nm_dotq_fn dotq[NM_TYPE_COUNT];           // by WEIGHT type; xq is nm_vec_dot_type(type)
    nm_quant_act_fn quant_act[NM_TYPE_COUNT]; // by ACTIVATION type: f32, f16, bf16, q8_0, q8_1, q8_K
    nm_gemmq_fn gemmq[NM_TYPE_COUNT];         // by WEIGHT type, where dotq is set (see nm_gemmq_fn)
    nm_gemv_prep_fn gemv_prep[NM_TYPE_COUNT]; // by WEIGHT type; NULL: no gemv (see nm_gemv_fn)
    nm_gemv_fn gemv[NM_TYPE_COUNT];           // set exactly where gemv_prep is
    nm_gemv_multi_fn gemv_multi[NM_TYPE_COUNT]; // by WEIGHT type, only where gemv is (same prep); NULL: none
    nm_gemmq_pack_fn gemmq_pack[NM_TYPE_COUNT];     // by ACTIVATION type (q8_0, q8_1)
    nm_gemmq_packed_fn gemmq_packed[NM_TYPE_COUNT]; // by WEIGHT type; its activation type has a gemmq_pack
} nm_kernels;

// The kernel table for this CPU, chosen once (thread-safe) from the CPU
// features. NM_FORCE_REF=1 in the environment forces the reference kernels.
const nm_kernels *nm_kernels_get(void);
// The reference table (always available).
const nm_kernels *nm_kernels_ref(void);

#endif
