// AVX-512 decode GEMV (one token, many weight rows) for the block formats
// whose block is a whole number of dwords: q4_1 (20 bytes = 5 dwords).
//
// The idea: load the weight row as it lies, 64 bytes at a time, and give the
// activation the row's byte layout instead of unpacking each block into
// element order. In a q4_1 row every dword is either a block header (d, m) or
// 4 bytes of nibbles of one block, so a zmm of 16 dwords holds parts of about
// 3 blocks. The prepared activation has, at the position of each nibble byte,
// the activation of its low nibble (`lo`) and of its high nibble (`hi`), and
// zeros at the headers. Then per 64 weight bytes:
//   and 0x0f, gf2p8affine (>> 4), two vpdpbusd, vcvtdq2ps, one vpermt2ps for the
//   per-lane block scale, one fma
// where the AVX2 dot spends about that per 32-byte block. The headers of 16
// blocks (320 bytes = 5 zmm) come out of the same registers with three dword
// permutes and one vcvtph2ps per 8 blocks. The min term m * s of each block
// is a fused multiply-add on the same vector.
//
// Same integer products as the AVX2 dotq; only the order of the f32 sums
// differs. The file is compiled with the x86 flags (-mavx2 -mfma -mf16c) and
// the pragma below adds the AVX-512 subsets to these functions only;
// dispatch.c takes them only where cpuid reports every one of them.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi,gfni"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi,gfni")
#endif

#include <immintrin.h>

#include "quant/kernels_impl.h"

// Bytes of weights ahead of the current row that each row's pass prefetches
// into L1: the integer work per byte is too high for the hardware prefetchers
// to stay ahead of the DRAM stream on their own (see NM_PREFETCH_ROWS in the
// CPU backend, which this replaces for the rows these kernels take).
#define GEMV_PREFETCH_ROWS 8

// ---- q4_1 x q8_1 ---------------------------------------------------------------------

// The activation of one group of 16 q4_1 blocks (320 weight bytes), 768 bytes.
typedef struct {
    __m512i lo[5], hi[5]; // activations at the weight bytes' positions; 0 at the headers
    __m512 dys[2];        // blocks 0-7, 8-15 as (d, s) pairs of the q8_1 blocks, to multiply (d, m)
} q4_1_group;

#define Q4_1_GROUP 16

static void gemv_prep_q4_1(const void *restrict xq, int64_t K, void *restrict prep) {
    const nm_block_q8_1 *y = xq;
    q4_1_group *g = prep;
    const int64_t nb = K / NM_QK;
    for (int64_t b0 = 0; b0 < nb; b0 += Q4_1_GROUP, g++) {
        uint8_t *lo = (uint8_t *)g->lo, *hi = (uint8_t *)g->hi;
        float *dys = (float *)g->dys;
        memset(g, 0, sizeof *g);
        for (int b = 0; b < Q4_1_GROUP && b0 + b < nb; b++) {
            const nm_block_q8_1 *yb = y + b0 + b;
            // nibble byte j of block b sits at 20b + 4 + j; its low nibble is
            // element j, its high nibble element j + 16
            memcpy(lo + 20 * b + 4, yb->qs, 16);
            memcpy(hi + 20 * b + 4, yb->qs + 16, 16);
            dys[2 * b] = _cvtsh_ss(yb->d);
            dys[2 * b + 1] = _cvtsh_ss(yb->s);
        }
    }
}

// Lane l of weight register i (dword 16i + l of the group) belongs to block
// (16i + l) / 5: its scale is even lane 2 * block of the pair (lo8, hi8) of
// (d*dy, m*s) products.
#define SL(d) (2 * ((d) / 5))
#define SROW(i)                                                                                               \
    {SL(16 * i + 0),  SL(16 * i + 1),  SL(16 * i + 2),  SL(16 * i + 3),  SL(16 * i + 4),  SL(16 * i + 5),     \
     SL(16 * i + 6),  SL(16 * i + 7),  SL(16 * i + 8),  SL(16 * i + 9),  SL(16 * i + 10), SL(16 * i + 11),    \
     SL(16 * i + 12), SL(16 * i + 13), SL(16 * i + 14), SL(16 * i + 15)}
static const int32_t q4_1_scale_idx[5][16] __attribute__((aligned(64))) = {SROW(0), SROW(1), SROW(2), SROW(3),
                                                                           SROW(4)};
#undef SROW
#undef SL

// x >> 4 in every byte (the high nibble), as a GF(2) affine map: bit i of the
// result is bit i + 4 of x for i < 4, else 0.
#define GF_SHR4 0x1020408000000000ll

static inline float q4_1_row(const uint8_t *restrict row, int64_t nb, const q4_1_group *restrict g) {
    // (d, m) of block b is dword 5b of the group: 0..30 in r0:r1, 35..60 in r2:r3, 65..75 in r4
    const __m512i ia = _mm512_setr_epi32(0, 5, 10, 15, 20, 25, 30, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i ib = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 3, 8, 13, 18, 23, 28, 0, 0, 0);
    const __m512i ic = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 6, 11);
    const __m512i m4 = _mm512_set1_epi8(15);
    const __m512i shr4 = _mm512_set1_epi64(GF_SHR4);
    __m512 acc = _mm512_setzero_ps(), accm = _mm512_setzero_ps();
    for (int64_t b0 = 0; b0 < nb; b0 += Q4_1_GROUP, g++) {
        const uint8_t *base = row + b0 * sizeof(nm_block_q4_1);
        __m512i r[5];
        int nr = 5;
        if (nb - b0 >= Q4_1_GROUP) {
            for (int i = 0; i < 5; i++) r[i] = _mm512_loadu_si512(base + 64 * i);
        } else {
            // the row's last group: masked loads (they do not fault past the row)
            const int64_t bytes = (nb - b0) * (int64_t)sizeof(nm_block_q4_1);
            nr = (int)((bytes + 63) / 64);
            for (int i = 0; i < 5; i++) {
                const int64_t n = bytes - 64 * i;
                const __mmask64 k = n >= 64 ? ~0ull : n <= 0 ? 0 : (1ull << n) - 1;
                r[i] = _mm512_maskz_loadu_epi8(k, base + 64 * i);
            }
        }
        __m512i dm = _mm512_permutex2var_epi32(r[0], ia, r[1]);
        dm = _mm512_mask_mov_epi32(dm, 0x1f80, _mm512_permutex2var_epi32(r[2], ib, r[3]));
        dm = _mm512_mask_mov_epi32(dm, 0xe000, _mm512_permutexvar_epi32(ic, r[4]));
        // (d*dy, m*s) per block; the m*s lanes (odd) are the min term
        const __m512 f0 = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(dm)), g->dys[0]);
        const __m512 f1 = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(dm, 1)), g->dys[1]);
        accm = _mm512_mask_add_ps(accm, 0xaaaa, accm, f0);
        accm = _mm512_mask_add_ps(accm, 0xaaaa, accm, f1);
        for (int i = 0; i < nr; i++) {
            const __m512i lo = _mm512_and_si512(r[i], m4);
            const __m512i hi = _mm512_gf2p8affine_epi64_epi8(r[i], shr4, 0);
            __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, g->lo[i]);
            p = _mm512_dpbusd_epi32(p, hi, g->hi[i]);
            const __m512 s = _mm512_permutex2var_ps(f0, _mm512_load_si512(q4_1_scale_idx[i]), f1);
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), s, acc);
        }
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc, accm));
}

static void gemv_q4_1(const void *restrict w, size_t w_stride, int64_t n_rows, int64_t n_ahead,
                      const void *restrict prep, int64_t K, float *restrict y) {
    const uint8_t *wd = w;
    const size_t row_bytes = (size_t)(K / NM_QK) * sizeof(nm_block_q4_1);
    for (int64_t r = 0; r < n_rows; r++) {
        if (r + GEMV_PREFETCH_ROWS < n_rows + n_ahead) {
            const uint8_t *ahead = wd + (size_t)(r + GEMV_PREFETCH_ROWS) * w_stride;
            for (size_t off = 0; off < row_bytes; off += 64) _mm_prefetch((const char *)ahead + off, _MM_HINT_T0);
        }
        y[r] = q4_1_row(wd + (size_t)r * w_stride, K / NM_QK, prep);
    }
}

#if defined(__clang__)
#pragma clang attribute pop
#endif

_Static_assert(sizeof(q4_1_group) == 768, "q4_1 group layout");
_Static_assert(NM_GEMV_PREP_BYTES(NM_QK * Q4_1_GROUP) >= sizeof(q4_1_group), "q4_1 prep size");

static const nm_kernels avx512_table = {
    .name = "avx2+vnni+avx512",
    .gemv_prep = {[NM_TYPE_Q4_1] = gemv_prep_q4_1},
    .gemv = {[NM_TYPE_Q4_1] = gemv_q4_1},
};

const nm_kernels *nm_kernels_avx512(void) {
    nm_f16_table_init();
    return &avx512_table;
}
