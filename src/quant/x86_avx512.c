// AVX-512 kernels (F, BW, DQ, VL, VNNI, VBMI, BITALG and GFNI, as on Ice Lake,
// Sapphire Rapids and Zen 4): the decode GEMV (one token, many weight rows)
// for q4_0, q4_1, q5_0, q8_0, q4_K and q6_K, and the prefill gemmq of q4_0,
// q5_0, q8_0, q4_K and q6_K.
//
// q4_1 (20-byte blocks = 5 dwords): load the weight row as it lies, 64
// bytes at a time, and give the activation the row's byte layout instead of
// unpacking each block into element order. In a q4_1 row every dword is
// either a block header (d, m) or 4 bytes of nibbles of one block, so a zmm
// of 16 dwords holds parts of about 3 blocks. The prepared activation has, at
// the position of each nibble byte, the activation of its low nibble (`lo`)
// and of its high nibble (`hi`), and zeros at the headers. Then per 64 weight
// bytes: and 0x0f, gf2p8affine (>> 4), two vpdpbusd, vcvtdq2ps, one vpermt2ps
// for the per-lane block scale, one fma - where the AVX2 dot spends about that
// per 32-byte block. The headers of 16 blocks (320 bytes = 5 zmm) come out of
// the same registers with three dword permutes and one vcvtph2ps per 8
// blocks; the min term m * s of each block is a multiply on the same vector.
//
// q4_0, q5_0, q8_0 (18, 22, 34 bytes: not whole dwords): two blocks per zmm,
// see pair_q4_0 below.
//
// Same integer products as the AVX2 kernels; only the order of the f32 sums
// differs. The file is compiled with the x86 flags (-mavx2 -mfma -mf16c) and
// the pragma below adds the AVX-512 subsets to these functions only;
// dispatch.c takes them only where cpuid reports every one of them
// (NM_NO_AVX512=1 leaves them out).
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi,avx512bitalg,gfni"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi,avx512bitalg,gfni")
#endif

#include <immintrin.h>

#include "quant/kernels_impl.h"
#include "quant/x86_dotq_blocks.h"
#include "quant/x86_gemmq_blocks.h" // gq_zero

// The 64 bytes at p of which only the first n (may be <= 0) belong to the row:
// a plain load inside the row, a masked one (which does not fault) at its end.
static inline __m512i load_upto(const uint8_t *p, int64_t n) {
    if (n >= 64) return _mm512_loadu_si512(p);
    return _mm512_maskz_loadu_epi8(n <= 0 ? 0 : (1ull << n) - 1, p);
}

// STEP(i, acc) for registers 0..n-1 over four accumulators (acc, acc1..acc3),
// so that the fma latency does not chain the registers of a row together.
#define STEPS_BY_4(n)                   \
    do {                                \
        int i_ = 0;                     \
        for (; i_ + 4 <= (n); i_ += 4) { \
            STEP(i_, acc);              \
            STEP(i_ + 1, acc1);         \
            STEP(i_ + 2, acc2);         \
            STEP(i_ + 3, acc3);         \
        }                               \
        for (; i_ < (n); i_++) STEP(i_, acc); \
    } while (0)

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

static inline __m512 q4_1_row(const uint8_t *restrict row, int64_t nb, const q4_1_group *restrict g) {
    // (d, m) of block b is dword 5b of the group: 0..30 in r0:r1, 35..60 in r2:r3, 65..75 in r4
    const __m512i ia = _mm512_setr_epi32(0, 5, 10, 15, 20, 25, 30, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i ib = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 3, 8, 13, 18, 23, 28, 0, 0, 0);
    const __m512i ic = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 6, 11);
    const __m512i m4 = _mm512_set1_epi8(15);
    const __m512i shr4 = _mm512_set1_epi64(GF_SHR4);
    __m512 acc = _mm512_setzero_ps(), acc1 = acc, acc2 = acc, acc3 = acc, accm = acc;
    for (int64_t b0 = 0; b0 < nb; b0 += Q4_1_GROUP, g++) {
        const uint8_t *base = row + b0 * sizeof(nm_block_q4_1);
        // the row's last group may be short: its registers past the row read as zeros
        const int64_t bytes = (nb - b0 < Q4_1_GROUP ? nb - b0 : Q4_1_GROUP) * (int64_t)sizeof(nm_block_q4_1);
        const int nr = (int)((bytes + 63) / 64);
        __m512i r[5];
        for (int i = 0; i < 5; i++) r[i] = load_upto(base + 64 * i, bytes - 64 * i);
        __m512i dm = _mm512_permutex2var_epi32(r[0], ia, r[1]);
        dm = _mm512_mask_mov_epi32(dm, 0x1f80, _mm512_permutex2var_epi32(r[2], ib, r[3]));
        dm = _mm512_mask_mov_epi32(dm, 0xe000, _mm512_permutexvar_epi32(ic, r[4]));
        // (d*dy, m*s) per block; the m*s lanes (odd) are the min term
        const __m512 f0 = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(dm)), g->dys[0]);
        const __m512 f1 = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(dm, 1)), g->dys[1]);
        accm = _mm512_mask_add_ps(accm, 0xaaaa, accm, f0);
        accm = _mm512_mask_add_ps(accm, 0xaaaa, accm, f1);
#define STEP(i, acc)                                                                                 \
    do {                                                                                             \
        const __m512i lo = _mm512_and_si512(r[i], m4);                                               \
        const __m512i hi = _mm512_gf2p8affine_epi64_epi8(r[i], shr4, 0);                             \
        __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, g->lo[i]);                       \
        p = _mm512_dpbusd_epi32(p, hi, g->hi[i]);                                                    \
        const __m512 s = _mm512_permutex2var_ps(f0, _mm512_load_si512(q4_1_scale_idx[i]), f1);     \
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), s, acc);                                        \
    } while (0)
        STEPS_BY_4(nr);
#undef STEP
    }
    return _mm512_add_ps(_mm512_add_ps(acc, acc1), _mm512_add_ps(_mm512_add_ps(acc2, acc3), accm));
}

// The rows of one call, prefetched ahead into L1 and L2 (NM_PREFETCH_ROWS in
// quant.h): the integer work per byte is too high for the hardware
// prefetchers to stay ahead of the DRAM stream on their own. The L2 prefetch
// stays within the call's rows: past them are other threads' rows. (Summing
// four rows' vectors across lanes together, a third of the shuffles, was
// slower in decode: 143 against 171 tok/s, SmolLM2 on Zen 4.)
#define GEMV_DEFINE(name, block, qk, row_fn)                                                                  \
    static void name(const void *restrict w, size_t w_stride, int64_t n_rows, int64_t n_ahead,              \
                     const void *restrict prep, int64_t K, float *restrict y) {                              \
        const uint8_t *wd = w;                                                                              \
        const size_t row_bytes = (size_t)(K / (qk)) * sizeof(block);                                        \
        const int64_t far = nm_prefetch_far_rows(w_stride);                                                 \
        for (int64_t r = 0; r < n_rows; r++) {                                                              \
            if (r + NM_PREFETCH_ROWS < n_rows + n_ahead)                                                    \
                nm_prefetch_l1(wd + (size_t)(r + NM_PREFETCH_ROWS) * w_stride, row_bytes);                  \
            if (r + far < n_rows) nm_prefetch_l2(wd + (size_t)(r + far) * w_stride, row_bytes);             \
            y[r] = _mm512_reduce_add_ps(row_fn(wd + (size_t)r * w_stride, K / (qk), prep));                 \
        }                                                                                                   \
    }

GEMV_DEFINE(gemv_q4_1, nm_block_q4_1, NM_QK, q4_1_row)

// A small batch (gemv_multi, quant.h): each row's groups unpacked once (the nibbles' and / gf2p8affine,
// the headers' permutes and widening) for every token, then per token the same operations in the same
// order as q4_1_row (its five accumulators kept in memory across the row's groups), so a token's sum has
// the bits gemv_q4_1 gives it alone.
static void gemv_multi_q4_1(const void *restrict w, size_t w_stride, int64_t n_rows, int64_t n_ahead,
                            const void *restrict prep, size_t prep_stride, int n_tok, int64_t K, float *restrict y,
                            int64_t ldy) {
    const __m512i ia = _mm512_setr_epi32(0, 5, 10, 15, 20, 25, 30, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i ib = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 3, 8, 13, 18, 23, 28, 0, 0, 0);
    const __m512i ic = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 6, 11);
    const __m512i m4 = _mm512_set1_epi8(15);
    const __m512i shr4 = _mm512_set1_epi64(GF_SHR4);
    const uint8_t *wd = w;
    const int64_t nb = K / NM_QK;
    const size_t row_bytes = (size_t)nb * sizeof(nm_block_q4_1);
    const int64_t far = nm_prefetch_far_rows(w_stride);
    __m512 accs[NM_GEMV_MULTI_MAX][5]; // per token: acc, acc1, acc2, acc3, accm
    for (int64_t r = 0; r < n_rows; r++) {
        if (r + NM_PREFETCH_ROWS < n_rows + n_ahead) nm_prefetch_l1(wd + (size_t)(r + NM_PREFETCH_ROWS) * w_stride, row_bytes);
        if (r + far < n_rows) nm_prefetch_l2(wd + (size_t)(r + far) * w_stride, row_bytes);
        const uint8_t *row = wd + (size_t)r * w_stride;
        for (int t = 0; t < n_tok; t++)
            for (int a = 0; a < 5; a++) accs[t][a] = _mm512_setzero_ps();
        for (int64_t b0 = 0, gi = 0; b0 < nb; b0 += Q4_1_GROUP, gi++) {
            const uint8_t *base = row + b0 * sizeof(nm_block_q4_1);
            const int64_t bytes = (nb - b0 < Q4_1_GROUP ? nb - b0 : Q4_1_GROUP) * (int64_t)sizeof(nm_block_q4_1);
            const int nr = (int)((bytes + 63) / 64);
            __m512i rr[5], lo[5], hi[5];
            for (int i = 0; i < 5; i++) {
                rr[i] = load_upto(base + 64 * i, bytes - 64 * i);
                lo[i] = _mm512_and_si512(rr[i], m4);
                hi[i] = _mm512_gf2p8affine_epi64_epi8(rr[i], shr4, 0);
            }
            __m512i dm = _mm512_permutex2var_epi32(rr[0], ia, rr[1]);
            dm = _mm512_mask_mov_epi32(dm, 0x1f80, _mm512_permutex2var_epi32(rr[2], ib, rr[3]));
            dm = _mm512_mask_mov_epi32(dm, 0xe000, _mm512_permutexvar_epi32(ic, rr[4]));
            const __m512 h0 = _mm512_cvtph_ps(_mm512_castsi512_si256(dm));
            const __m512 h1 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(dm, 1));
            for (int t = 0; t < n_tok; t++) {
                const q4_1_group *g = (const q4_1_group *)((const uint8_t *)prep + (size_t)t * prep_stride) + gi;
                __m512 acc = accs[t][0], acc1 = accs[t][1], acc2 = accs[t][2], acc3 = accs[t][3], accm = accs[t][4];
                const __m512 f0 = _mm512_mul_ps(h0, g->dys[0]);
                const __m512 f1 = _mm512_mul_ps(h1, g->dys[1]);
                accm = _mm512_mask_add_ps(accm, 0xaaaa, accm, f0);
                accm = _mm512_mask_add_ps(accm, 0xaaaa, accm, f1);
#define STEP(i, acc)                                                                                 \
    do {                                                                                             \
        __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[i], g->lo[i]);                    \
        p = _mm512_dpbusd_epi32(p, hi[i], g->hi[i]);                                                 \
        const __m512 s = _mm512_permutex2var_ps(f0, _mm512_load_si512(q4_1_scale_idx[i]), f1);     \
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), s, acc);                                        \
    } while (0)
                STEPS_BY_4(nr);
#undef STEP
                accs[t][0] = acc, accs[t][1] = acc1, accs[t][2] = acc2, accs[t][3] = acc3, accs[t][4] = accm;
            }
        }
        for (int t = 0; t < n_tok; t++)
            y[t * ldy + r] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(accs[t][0], accs[t][1]),
                                                                _mm512_add_ps(_mm512_add_ps(accs[t][2], accs[t][3]), accs[t][4])));
    }
}


// ---- q4_0, q5_0, q8_0 x q8_0: two blocks per zmm --------------------------------------
//
// These blocks are not whole dwords (18, 22, 34 bytes), so the row is read a
// pair of blocks at a time: the pair's quants are brought into element order
// in one zmm (a vpermb of one load for the nibble formats; two loads for
// q8_0), made unsigned (the nibbles are; q5_0's fifth bit is a masked add of
// 16 with the mask straight from qh; q8_0 flips the sign bit), and dotted with
// the activations by one vpdpbusd whose accumulator starts at -offset * (the
// activations' sum over each dword), prepared once per activation. The two
// blocks' scales come from the fp16 table by two broadcasts.

typedef struct {
    __m512i x;    // the pair's 64 activations
    __m512i corr; // -offset * sum of x over each dword (offset: 8 q4_0, 16 q5_0, 128 q8_0)
    __m512 dy;    // the two blocks' activation scales, 8 lanes each
} q8_pair;        // 192 bytes per 64 elements

// One pair (blocks b, b + 1 of activation row y; block b + 1 may be past the
// row's nb blocks: zeros).
static inline void prep_pair(const nm_block_q8_0 *y, int64_t b, int64_t nb, int32_t offset, q8_pair *pr) {
    const bool two = b + 1 < nb;
    __m512i x = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)y[b].qs));
    x = _mm512_inserti64x4(x, two ? _mm256_loadu_si256((const __m256i *)y[b + 1].qs) : _mm256_setzero_si256(), 1);
    pr->x = x;
    // the dword sums: vpdpbusd of ones (u8) with x (i8)
    pr->corr = _mm512_mullo_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), x),
                                  _mm512_set1_epi32(-offset));
    pr->dy = _mm512_mask_broadcastss_ps(_mm512_set1_ps(_cvtsh_ss(y[b].d)), 0xff00,
                                        _mm_set_ss(two ? _cvtsh_ss(y[b + 1].d) : 0.0f));
}

static inline void prep_pairs(const void *restrict xq, int64_t K, void *restrict prep, int32_t offset) {
    q8_pair *pr = prep;
    const int64_t nb = K / NM_QK;
    for (int64_t b = 0; b < nb; b += 2) prep_pair(xq, b, nb, offset, pr++);
}

static void gemv_prep_q4_0(const void *restrict xq, int64_t K, void *restrict prep) { prep_pairs(xq, K, prep, 8); }
static void gemv_prep_q5_0(const void *restrict xq, int64_t K, void *restrict prep) { prep_pairs(xq, K, prep, 16); }
static void gemv_prep_q8_0(const void *restrict xq, int64_t K, void *restrict prep) { prep_pairs(xq, K, prep, 128); }

// Weight scale of a pair: block 0's d in lanes 0-7, block 1's in 8-15.
static inline __m512 pair_scale(uint16_t d0, uint16_t d1) {
    return _mm512_mask_broadcastss_ps(_mm512_set1_ps(nm_f16_table[d0]), 0xff00, _mm_load_ss(&nm_f16_table[d1]));
}

// per 128-bit lane: low nibbles (lanes 0, 2), high nibbles (lanes 1, 3)
#define GF_LO4 0x0102040800000000ll // bit i of the result is bit i of x for i < 4, else 0
#define GF_PAIR _mm512_set_epi64(GF_SHR4, GF_SHR4, GF_LO4, GF_LO4, GF_SHR4, GF_SHR4, GF_LO4, GF_LO4)

// The constants of a pair unpacker.
typedef struct {
    __m512i perm, gf, k;
} pair_consts;

static inline pair_consts pair_consts_for(uint32_t type) {
    pair_consts c;
    // (p[0..15], p[0..15], q[0..15], q[0..15]), q = p + block size
    const int stride = type == NM_TYPE_Q4_0 ? (int)sizeof(nm_block_q4_0) : (int)sizeof(nm_block_q5_0);
    uint8_t idx[64];
    for (int i = 0; i < 64; i++) idx[i] = (uint8_t)((i / 32) * stride + i % 16);
    c.perm = _mm512_loadu_si512(idx);
    c.gf = GF_PAIR;
    c.k = type == NM_TYPE_Q8_0 ? _mm512_set1_epi8((char)0x80) : _mm512_set1_epi8(16);
    return c;
}

// A pair of weight blocks starting at xb, of which `n` bytes are the row's
// (n <= one block: the second is past the row's end and reads as zeros):
// the 64 quants in element order as u8 (q + offset) and the scales in *sw.
// The nibble formats take one 64-byte load at the first block's nibbles and
// vpermb makes (p[0..15], p[0..15], q[0..15], q[0..15]); a GF(2) affine map
// per 64-bit lane keeps the low nibbles in 128-bit lanes 0 and 2 and shifts
// the high ones down in lanes 1 and 3. q5_0's fifth bits are the mask of a
// masked add of 16, straight from qh.
static inline __m512i pair_q4_0(const nm_block_q4_0 *xb, int64_t n, const pair_consts *c, __m512 *sw) {
    const bool two = n > (int64_t)sizeof *xb;
    const __m512i v = load_upto(xb->qs, n - 2);
    *sw = pair_scale(xb->d, two ? xb[1].d : 0);
    return _mm512_gf2p8affine_epi64_epi8(_mm512_permutexvar_epi8(c->perm, v), c->gf, 0);
}

static inline __m512i pair_q5_0(const nm_block_q5_0 *xb, int64_t n, const pair_consts *c, __m512 *sw) {
    const bool two = n > (int64_t)sizeof *xb;
    uint32_t h0, h1 = 0;
    memcpy(&h0, xb->qh, 4);
    if (two) memcpy(&h1, xb[1].qh, 4);
    const __m512i v = load_upto(xb->qs, n - 6);
    const __m512i q = _mm512_gf2p8affine_epi64_epi8(_mm512_permutexvar_epi8(c->perm, v), c->gf, 0);
    *sw = pair_scale(xb->d, two ? xb[1].d : 0);
    return _mm512_mask_add_epi8(q, _cvtu64_mask64((uint64_t)h1 << 32 | h0), q, c->k);
}

static inline __m512i pair_q8_0(const nm_block_q8_0 *xb, int64_t n, const pair_consts *c, __m512 *sw) {
    const bool two = n > (int64_t)sizeof *xb;
    __m512i w = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)xb->qs));
    w = _mm512_inserti64x4(w, two ? _mm256_loadu_si256((const __m256i *)xb[1].qs) : _mm256_setzero_si256(), 1);
    *sw = pair_scale(xb->d, two ? xb[1].d : 0);
    return _mm512_xor_si512(w, c->k);
}

// Pairs of one row, two per step into two accumulators; `n` is the bytes of
// the row from the pair's first block on (a nibble pair's 64-byte load
// reaches past the pair, so it is masked near the row's end).
#define PAIR_ROW(name, block, unpack, type)                                                       \
    static inline __m512 name(const uint8_t *restrict row, int64_t nb, const q8_pair *restrict g) { \
        const pair_consts c = pair_consts_for(type);                                              \
        const block *x = (const block *)row;                                                      \
        __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, sw;                                       \
        int64_t b = 0;                                                                            \
        for (; b + 4 <= nb; b += 4) {                                                             \
            __m512i q = unpack(x + b, (nb - b) * (int64_t)sizeof(block), &c, &sw);                \
            __m512i p = _mm512_dpbusd_epi32(g[b / 2].corr, q, g[b / 2].x);                        \
            acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(sw, g[b / 2].dy), acc0);   \
            q = unpack(x + b + 2, (nb - b - 2) * (int64_t)sizeof(block), &c, &sw);                \
            p = _mm512_dpbusd_epi32(g[b / 2 + 1].corr, q, g[b / 2 + 1].x);                        \
            acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(sw, g[b / 2 + 1].dy), acc1); \
        }                                                                                         \
        for (; b < nb; b += 2) {                                                                  \
            const __m512i q = unpack(x + b, (nb - b) * (int64_t)sizeof(block), &c, &sw);          \
            const __m512i p = _mm512_dpbusd_epi32(g[b / 2].corr, q, g[b / 2].x);                  \
            acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(sw, g[b / 2].dy), acc0);   \
        }                                                                                         \
        return _mm512_add_ps(acc0, acc1);                                                         \
    }

PAIR_ROW(q4_0_row, nm_block_q4_0, pair_q4_0, NM_TYPE_Q4_0)
PAIR_ROW(q5_0_row, nm_block_q5_0, pair_q5_0, NM_TYPE_Q5_0)
PAIR_ROW(q8_0_row, nm_block_q8_0, pair_q8_0, NM_TYPE_Q8_0)

GEMV_DEFINE(gemv_q4_0, nm_block_q4_0, NM_QK, q4_0_row)
GEMV_DEFINE(gemv_q5_0, nm_block_q5_0, NM_QK, q5_0_row)
GEMV_DEFINE(gemv_q8_0, nm_block_q8_0, NM_QK, q8_0_row)

// A small batch (gemv_multi, quant.h) of the pair formats: each pair of weight blocks unpacked once, then
// per token the dot, its scale and the fma into the accumulator PAIR_ROW gives that pair (acc1 for the odd
// pairs of its four-block steps, acc0 otherwise), so a token's sum has the bits of its gemv alone.
#define PAIR_MULTI(name, block, unpack, type)                                                                \
    static void name(const void *restrict w, size_t w_stride, int64_t n_rows, int64_t n_ahead,               \
                     const void *restrict prep, size_t prep_stride, int n_tok, int64_t K, float *restrict y, \
                     int64_t ldy) {                                                                          \
        const pair_consts c = pair_consts_for(type);                                                         \
        const uint8_t *wd = w;                                                                               \
        const int64_t nb = K / NM_QK, b4 = nb / 4 * 4; /* pairs below b4: PAIR_ROW's four-block steps */     \
        const size_t row_bytes = (size_t)nb * sizeof(block);                                                 \
        const int64_t far = nm_prefetch_far_rows(w_stride);                                                  \
        __m512 accs[NM_GEMV_MULTI_MAX][2];                                                                   \
        for (int64_t r = 0; r < n_rows; r++) {                                                               \
            if (r + NM_PREFETCH_ROWS < n_rows + n_ahead)                                                     \
                nm_prefetch_l1(wd + (size_t)(r + NM_PREFETCH_ROWS) * w_stride, row_bytes);                   \
            if (r + far < n_rows) nm_prefetch_l2(wd + (size_t)(r + far) * w_stride, row_bytes);              \
            const block *x = (const block *)(wd + (size_t)r * w_stride);                                     \
            for (int t = 0; t < n_tok; t++) accs[t][0] = accs[t][1] = _mm512_setzero_ps();                   \
            for (int64_t b = 0; b < nb; b += 2) {                                                            \
                __m512 sw;                                                                                   \
                const __m512i q = unpack(x + b, (nb - b) * (int64_t)sizeof(block), &c, &sw);                 \
                const int a = b < b4 ? (int)((b / 2) & 1) : 0;                                               \
                for (int t = 0; t < n_tok; t++) {                                                            \
                    const q8_pair *g = (const q8_pair *)((const uint8_t *)prep + (size_t)t * prep_stride) + b / 2; \
                    const __m512i p = _mm512_dpbusd_epi32(g->corr, q, g->x);                                 \
                    accs[t][a] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(sw, g->dy), accs[t][a]); \
                }                                                                                            \
            }                                                                                                \
            for (int t = 0; t < n_tok; t++) y[t * ldy + r] = _mm512_reduce_add_ps(_mm512_add_ps(accs[t][0], accs[t][1])); \
        }                                                                                                    \
    }

PAIR_MULTI(gemv_multi_q4_0, nm_block_q4_0, pair_q4_0, NM_TYPE_Q4_0)
PAIR_MULTI(gemv_multi_q5_0, nm_block_q5_0, pair_q5_0, NM_TYPE_Q5_0)
PAIR_MULTI(gemv_multi_q8_0, nm_block_q8_0, pair_q8_0, NM_TYPE_Q8_0)

// ---- prefill: many rows x many tokens for the pair formats -----------------------------
//
// Tile: 2 weight rows x 8 tokens, 16 zmm accumulators. A weight pair is
// unpacked once per tile and meets the 8 tokens' prepared pairs: per (row,
// pair, token) one vpdpbusd, one vcvtdq2ps, one multiply of the scales and
// one fma. The tokens' pairs are prepared once per 8 tokens and K chunk (on
// the stack, 24 KB: it stays in L1) and shared by all the rows of the call.
#define GP_TOK 8
#define GP_CH 16 // pairs per K chunk

#define GEMMQ_PAIRS(name, block, unpack, type, offset)                                                         \
    static void name(const void *restrict w, size_t w_stride, int64_t n_rows, const void *restrict xq,        \
                     size_t x_stride, int64_t n_tok, int64_t K, float *restrict y, int64_t ldy) {             \
        const pair_consts c = pair_consts_for(type);                                                           \
        const int64_t nb = K / NM_QK, npairs = (nb + 1) / 2;                                                   \
        q8_pair pr[GP_CH][GP_TOK];                                                                             \
        for (int64_t t0 = 0; t0 < n_tok; t0 += GP_TOK) {                                                       \
            const int nt = n_tok - t0 < GP_TOK ? (int)(n_tok - t0) : GP_TOK;                                    \
            for (int64_t p0 = 0; p0 < npairs; p0 += GP_CH) {                                                   \
                const int np = npairs - p0 < GP_CH ? (int)(npairs - p0) : GP_CH;                                \
                for (int j = 0; j < np; j++)                                                                   \
                    for (int t = 0; t < GP_TOK; t++) {                                                         \
                        if (t < nt)                                                                            \
                            prep_pair((const nm_block_q8_0 *)((const uint8_t *)xq + (size_t)(t0 + t) * x_stride), \
                                      2 * (p0 + j), nb, offset, &pr[j][t]);                                    \
                        else                                                                                   \
                            memset(&pr[j][t], 0, sizeof pr[j][t]);                                             \
                    }                                                                                          \
                for (int64_t r = 0; r < n_rows; r += 2) {                                                      \
                    const block *w0 = (const block *)((const uint8_t *)w + (size_t)r * w_stride);              \
                    const block *w1 = (const block *)((const uint8_t *)w + (size_t)(r + (r + 1 < n_rows)) * w_stride); \
                    __m512 a0[GP_TOK], a1[GP_TOK];                                                             \
                    for (int t = 0; t < GP_TOK; t++) a0[t] = a1[t] = _mm512_setzero_ps();                      \
                    for (int j = 0; j < np; j++) {                                                             \
                        const int64_t b = 2 * (p0 + j), n = (nb - b) * (int64_t)sizeof(block);                 \
                        __m512 s0, s1;                                                                         \
                        const __m512i q0 = unpack(w0 + b, n, &c, &s0), q1 = unpack(w1 + b, n, &c, &s1);        \
                        _Pragma("GCC unroll 8") for (int t = 0; t < GP_TOK; t++) {                             \
                            const q8_pair *x = &pr[j][t];                                                      \
                            a0[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(x->corr, q0, x->x)), \
                                                    _mm512_mul_ps(s0, x->dy), a0[t]);                          \
                            a1[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(x->corr, q1, x->x)), \
                                                    _mm512_mul_ps(s1, x->dy), a1[t]);                          \
                        }                                                                                      \
                    }                                                                                          \
                    for (int t = 0; t < nt; t++) {                                                             \
                        float *yt = y + (size_t)(t0 + t) * (size_t)ldy + r;                                    \
                        const float v0 = _mm512_reduce_add_ps(a0[t]), v1 = _mm512_reduce_add_ps(a1[t]);        \
                        yt[0] = p0 ? yt[0] + v0 : v0;                                                          \
                        if (r + 1 < n_rows) yt[1] = p0 ? yt[1] + v1 : v1;                                      \
                    }                                                                                          \
                }                                                                                              \
            }                                                                                                  \
        }                                                                                                      \
    }

GEMMQ_PAIRS(gemmq_q4_0, nm_block_q4_0, pair_q4_0, NM_TYPE_Q4_0, 8)
GEMMQ_PAIRS(gemmq_q5_0, nm_block_q5_0, pair_q5_0, NM_TYPE_Q5_0, 16)
GEMMQ_PAIRS(gemmq_q8_0, nm_block_q8_0, pair_q8_0, NM_TYPE_Q8_0, 128)

// ---- prefill over packed activations: 16 tokens per vector ---------------------------------
//
// The tiles above put a block's elements in the lanes, so every (row, token)
// pair pays a convert, a scale multiply and an FMA per block on a whole
// vector: three float ops per vpdpbusd. Here the lanes are 16 tokens: each
// activation block is packed once per matmul (gemmq_pack) as 8 zmm whose lane
// t holds token t's quants 4j..4j+3 (as u8: x + 128), and a weight block's 8
// dwords of signed quants are the broadcast operand of 8 vpdpbusd, which leave
// the block's 16 integer dots in one register. The float work per block is
// then a convert and the reference's multiplies and add for 16 tokens at once:
// four ops per 8 vpdpbusd. The + 128 is taken off through the weight block's
// sum (the accumulator starts at -128 * sum w). Each row's sum runs over the
// blocks in order with the reference's operations (dotq_ref in ref_dotq.c;
// the build does not contract them), so the results are the reference's bits.
//
// A weight row tile (8 rows, up to GQP_KC blocks) is unpacked once and meets
// every token group (gemmq_packed_body).
typedef struct {
    uint8_t q[8][64]; // q[j][4t..4t+3]: token t's quants 4j..4j+3, + 128
    float dx[NM_GQP_TOK];
    float sx[NM_GQP_TOK]; // q8_1's s (d * sum of the quants); 0 for q8_0
} gqp_block;

typedef struct {
    int32_t q[8]; // the 32 quants, signed
    float d, m;   // scale and (q4_1, q5_1) min; d = 0 on a pad row
    int32_t corr; // -128 * sum of the quants
    int32_t pad;
} gqp_w;

#define GQP_R 8
#define GQP_KC 64

static inline void gemmq_pack_body(const void *restrict xq, size_t x_stride, int64_t n_tok, int64_t K,
                                   void *restrict pack, bool q81) {
    const size_t ysz = q81 ? sizeof(nm_block_q8_1) : sizeof(nm_block_q8_0), qo = ysz - NM_QK;
    gqp_block *out = pack;
    for (int64_t b = 0; b < K / NM_QK; b++) {
        gqp_block *o = &out[b];
        for (int t = 0; t < NM_GQP_TOK; t++) {
            uint32_t v[8];
            if (t < n_tok) {
                const uint8_t *blk = (const uint8_t *)xq + (size_t)t * x_stride + (size_t)b * ysz;
                uint16_t d, sh = 0;
                memcpy(&d, blk, 2);
                if (q81) memcpy(&sh, blk + 2, 2);
                o->dx[t] = h2f_tab(d);
                o->sx[t] = q81 ? h2f_tab(sh) : 0.0f;
                memcpy(v, blk + qo, 32);
                for (int j = 0; j < 8; j++) v[j] ^= 0x80808080u;
            } else {
                o->dx[t] = o->sx[t] = 0.0f;
                for (int j = 0; j < 8; j++) v[j] = 0x80808080u;
            }
            for (int j = 0; j < 8; j++) memcpy(&o->q[j][4 * t], &v[j], 4);
        }
    }
}

static void gemmq_pack_q8_0(const void *restrict xq, size_t x_stride, int64_t n_tok, int64_t K, void *restrict pack) {
    gemmq_pack_body(xq, x_stride, n_tok, K, pack, false);
}
static void gemmq_pack_q8_1(const void *restrict xq, size_t x_stride, int64_t n_tok, int64_t K, void *restrict pack) {
    gemmq_pack_body(xq, x_stride, n_tok, K, pack, true);
}

// Weight block -> signed quants, scales and the offset correction.
static inline void gqp_unpack(uint32_t type, const uint8_t *wb, gqp_w *o) {
    float dw, mw;
    __m256i q = gq_unpack(type, wb, &dw, &mw); // q + 8 / + 16 / + 12 for the offset formats, q8_0 as it is
    const int off = type == NM_TYPE_Q4_0 ? 8 : type == NM_TYPE_Q5_0 ? 16 : type == NM_TYPE_MXFP4 ? 12 : 0;
    q = _mm256_sub_epi8(q, _mm256_set1_epi8((char)off));
    const __m256i s = _mm256_sad_epu8(_mm256_xor_si256(q, _mm256_set1_epi8((char)0x80)), _mm256_setzero_si256());
    const __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    const int32_t sum = (int32_t)(_mm_cvtsi128_si64(s2) + _mm_extract_epi64(s2, 1)) - 32 * 128;
    _mm256_storeu_si256((__m256i *)o->q, q);
    o->d = dw;
    o->m = mw;
    o->corr = -128 * sum;
}

// Rows wt[r][0..nbk) (GQP_R of them, pad rows zero) against one token group's
// blocks x[0..nbk), continuing the sums in acc.
static inline __attribute__((always_inline)) void gqp_tile(uint32_t type, const gqp_w wt[GQP_R][GQP_KC],
                                                           const gqp_block *restrict x, int64_t nbk,
                                                           __m512 acc[GQP_R]) {
    for (int64_t b = 0; b < nbk; b++) {
        const gqp_block *xb = &x[b];
        __m512i X[8];
        for (int j = 0; j < 8; j++) X[j] = _mm512_load_si512(xb->q[j]);
        const __m512 dx = _mm512_load_ps(xb->dx);
        _Pragma("GCC unroll 8") for (int r = 0; r < GQP_R; r++) {
            const gqp_w *w = &wt[r][b];
            __m512i s = _mm512_set1_epi32(w->corr);
            for (int j = 0; j < 8; j++) s = _mm512_dpbusd_epi32(s, X[j], _mm512_set1_epi32(w->q[j]));
            const __m512 f = _mm512_cvtepi32_ps(s);
            __m512 v;
            if (type == NM_TYPE_Q4_0) { // (sumi * d_w) * d_x
                v = _mm512_mul_ps(_mm512_mul_ps(f, _mm512_set1_ps(w->d)), dx);
            } else { // (d_w * d_x) * sumi; mxfp4's d_x * e and q8_0's sumi * (d_w * d_x) are the same products
                v = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(w->d), dx), f);
                if (type == NM_TYPE_Q4_1 || type == NM_TYPE_Q5_1)
                    v = _mm512_add_ps(v, _mm512_mul_ps(_mm512_set1_ps(w->m), _mm512_load_ps(xb->sx)));
            }
            acc[r] = _mm512_add_ps(acc[r], v);
        }
    }
}

// (the driver, gemmq_packed_body, follows the K formats' packed form below)

// ---- the K formats' unpacking, shared by the prefill tiles and the decode GEMV --------------

// A q4_K super-block's 8 6-bit scales and 8 6-bit mins (nm_get_scale_min_k4's
// packing) as bytes: scales 0-3, 4-7, mins 0-3, 4-7.
static inline __m128i q4k_scales_mins(const uint8_t scales[12]) {
    uint32_t u[3];
    memcpy(u, scales, 12);
    const uint32_t sc_lo = u[0] & 0x3f3f3f3f, mn_lo = u[1] & 0x3f3f3f3f;
    const uint32_t sc_hi = (u[2] & 0x0f0f0f0f) | (((u[0] >> 6) & 0x03030303) << 4);
    const uint32_t mn_hi = ((u[2] >> 4) & 0x0f0f0f0f) | (((u[1] >> 6) & 0x03030303) << 4);
    return _mm_set_epi32((int)mn_hi, (int)mn_lo, (int)sc_hi, (int)sc_lo);
}

// A q4_K super-block's 128 nibble bytes as four zmm of quants (0..15): the low
// nibbles of the first 64 bytes hold sub-blocks 0 and 2, their high nibbles 1
// and 3, the second 64 bytes' 4, 6 and 5, 7. q4k_sidx(z) picks the scale (or
// min) of q[z]'s sub-blocks from q4k_scales_mins widened to dwords.
static inline void q4k_quants(const nm_block_q4_K *x, __m512i q[4]) {
    const __m512i low4 = _mm512_set1_epi8(15);
    const __m512i A = _mm512_loadu_si512(x->qs), B = _mm512_loadu_si512(x->qs + 64);
    q[0] = _mm512_and_si512(A, low4);
    q[1] = _mm512_and_si512(_mm512_srli_epi16(A, 4), low4);
    q[2] = _mm512_and_si512(B, low4);
    q[3] = _mm512_and_si512(_mm512_srli_epi16(B, 4), low4);
}
static inline __m512i q4k_sidx(int z) {
    const int lo = (z / 2) * 4 + z % 2, hi = lo + 2; // lanes 0-7: sub-block lo, 8-15: hi
    return _mm512_set_epi32(hi, hi, hi, hi, hi, hi, hi, hi, lo, lo, lo, lo, lo, lo, lo, lo);
}

// A q6_K super-block's quants, unsigned (0..63), in element order: q[z] holds
// elements 64z..64z+63. Each half's 64 ql bytes are a zmm whose low nibbles
// are its elements 0-63 and high nibbles 64-127; the two high bits come from
// qh by one variable shift per 16-bit lane (4 and 2 for the low zmm, 0 and 2
// for the high one).
static inline void q6k_quants(const nm_block_q6_K *x, __m512i q[4]) {
    const __m512i m4 = _mm512_set1_epi8(15), m3 = _mm512_set1_epi8(0x30);
    // words 0-15 (bytes 0-31) and 16-31 (bytes 32-63) of the [qh | qh] vector
    const __m512i cnt_lo = _mm512_mask_blend_epi16(0xffff0000u, _mm512_set1_epi16(4), _mm512_set1_epi16(2));
    const __m512i cnt_hi = _mm512_mask_blend_epi16(0xffff0000u, _mm512_set1_epi16(0), _mm512_set1_epi16(2));
    for (int h = 0; h < 2; h++) {
        const __m512i AB = _mm512_loadu_si512(x->ql + 64 * h);
        const __m512i HH = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(x->qh + 32 * h)));
        q[2 * h] = _mm512_or_si512(_mm512_and_si512(AB, m4), _mm512_and_si512(_mm512_sllv_epi16(HH, cnt_lo), m3));
        q[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(AB, 4), m4),
                                       _mm512_and_si512(_mm512_srlv_epi16(HH, cnt_hi), m3));
    }
}

// q6_K's 16 scales (one per 16 elements) as dwords, the scale in the low
// int16 and 0 above (what vpdpwssd multiplies the dword sums' low int16 by);
// the scales of q6k_quants' q[z] are lanes 4z..4z+3, one per 4 dwords:
// q6k_sidx(z) picks them.
static inline __m512i q6k_scales(const int8_t scales[16]) {
    return _mm512_and_si512(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)scales)), _mm512_set1_epi32(0xffff));
}
static inline __m512i q6k_sidx(int z) {
    return _mm512_set_epi32(4 * z + 3, 4 * z + 3, 4 * z + 3, 4 * z + 3, 4 * z + 2, 4 * z + 2, 4 * z + 2, 4 * z + 2,
                            4 * z + 1, 4 * z + 1, 4 * z + 1, 4 * z + 1, 4 * z, 4 * z, 4 * z, 4 * z);
}

// ---- prefill over packed activations: the K formats ----------------------------------------
//
// The packed form of q4_K, q5_K and q6_K against q8_K activations: as the
// 32-element formats above, lane t is token t and a weight dword the
// broadcast operand of vpdpbusd, the activations + 128 as u8 (gqk_block: one
// 256-element super-block of 16 tokens, in element order). A q4_K/q5_K
// sub-block (32 elements) takes 8 vpdpbusd into a fresh dword sum, which a
// vpmulld by its scale adds to the super-block's isum (a q6_K group of 16
// elements: 4 and its signed scale); isum starts at -128 * sum_j sc_j * sum q_j,
// which takes the + 128 off. The min term sum_j m_j * (bsums[2j] + bsums[2j+1])
// is 4 vpdpwssd on the tokens' pair sums. The floats are the reference's:
// d * isum - dmin * summs (q4_K, q5_K; d = d_w * d_x), (d_w * d_x) * isum
// (q6_K), added per super-block in order: the reference's bits.
typedef struct {
    uint8_t q[64][64];    // q[i][4t..4t+3]: token t's quants 4i..4i+3, + 128
    int32_t pairs[4][16]; // lane t: bsum pair 2i (bsums[4i] + bsums[4i+1]) low, pair 2i+1 high
    float dx[NM_GQP_TOK];
} gqk_block;

typedef struct {
    int32_t q[64];  // the 256 quants, signed bytes in element order (q6_K: q - 32)
    int32_t sc[16]; // q4_K/q5_K: the 8 sub-block scales; q6_K: the 16 group scales
    int32_t mp[4];  // q4_K/q5_K: min 2i (low int16) and min 2i+1 (high)
    int32_t corr;   // -128 * sum over sub-blocks (groups) of scale * sum of quants
    float d, dmin;  // d = 0 on a pad row
    int32_t pad[9];
} gqk_w;

#define GQK_KC 4 // super-blocks per K chunk: 8 rows x 4 x 384 B of unpacked weights

static void gemmq_pack_q8_K(const void *restrict xq, size_t x_stride, int64_t n_tok, int64_t K, void *restrict pack) {
    gqk_block *out = pack;
    for (int64_t b = 0; b < K / NM_QK_K; b++) {
        gqk_block *o = &out[b];
        int16_t pr[NM_GQP_TOK][8];
        for (int t = 0; t < NM_GQP_TOK; t++) {
            uint32_t v[64];
            if (t < n_tok) {
                const nm_block_q8_K *y = (const nm_block_q8_K *)((const uint8_t *)xq + (size_t)t * x_stride) + b;
                o->dx[t] = y->d;
                memcpy(v, y->qs, sizeof v);
                for (int i = 0; i < 64; i++) v[i] ^= 0x80808080u;
                for (int j = 0; j < 8; j++) pr[t][j] = (int16_t)(y->bsums[2 * j] + y->bsums[2 * j + 1]);
            } else {
                o->dx[t] = 0.0f;
                for (int i = 0; i < 64; i++) v[i] = 0x80808080u;
                memset(pr[t], 0, sizeof pr[t]);
            }
            for (int i = 0; i < 64; i++) memcpy(&o->q[i][4 * t], &v[i], 4);
            for (int i = 0; i < 4; i++)
                o->pairs[i][t] = (int32_t)(((uint32_t)(uint16_t)pr[t][2 * i + 1] << 16) | (uint16_t)pr[t][2 * i]);
        }
    }
}

// Sums of the bytes of q (unsigned) per 16: s[0..1] for q[0..31].
static inline void sums16(__m256i q, int32_t s[2]) {
    const __m256i sad = _mm256_sad_epu8(q, _mm256_setzero_si256()); // qwords: bytes 0-7, 8-15, 16-23, 24-31
    int64_t w[4];
    _mm256_storeu_si256((__m256i *)w, sad);
    s[0] = (int32_t)(w[0] + w[1]);
    s[1] = (int32_t)(w[2] + w[3]);
}

// q4_K/q5_K super-block -> gqk_w. Elements 64c..64c+31 are the low nibbles of
// qs[32c..32c+31], 64c+32.. their high nibbles; q5_K's fifth bit of element
// 64c + l is bit 2c of qh[l], of 64c + 32 + l bit 2c + 1.
static inline void gqk_unpack_q45(const uint8_t *qs, const uint8_t *qh, const uint8_t scales[12], uint16_t d,
                                  uint16_t dmin, gqk_w *o) {
    const __m256i low4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    const __m256i H = qh ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
    uint8_t sm[16];
    _mm_storeu_si128((__m128i *)sm, q4k_scales_mins(scales)); // scales 0-7, mins 0-7
    int32_t corr = 0;
    for (int c = 0; c < 4; c++) {
        const __m256i A = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
        __m256i lo = _mm256_and_si256(A, low4), hi = _mm256_and_si256(_mm256_srli_epi16(A, 4), low4);
        if (qh) {
            const __m256i h0 = _mm256_and_si256(_mm256_srli_epi16(H, 2 * c), one);
            const __m256i h1 = _mm256_and_si256(_mm256_srli_epi16(H, 2 * c + 1), one);
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(h0, 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(h1, 4));
        }
        _mm256_storeu_si256((__m256i *)(o->q + 16 * c), lo);
        _mm256_storeu_si256((__m256i *)(o->q + 16 * c + 8), hi);
        int32_t s[2];
        sums16(lo, s);
        corr += sm[2 * c] * (s[0] + s[1]);
        sums16(hi, s);
        corr += sm[2 * c + 1] * (s[0] + s[1]);
    }
    for (int j = 0; j < 8; j++) o->sc[j] = sm[j];
    for (int j = 8; j < 16; j++) o->sc[j] = 0;
    for (int i = 0; i < 4; i++) o->mp[i] = (int32_t)((uint32_t)sm[8 + 2 * i + 1] << 16 | sm[8 + 2 * i]);
    o->corr = -128 * corr;
    o->d = h2f_tab(d);
    o->dmin = h2f_tab(dmin);
}

// q6_K super-block -> gqk_w (element 128h + 32k + l: ql[64h + 32(k & 1) + l]'s
// nibble k >> 1, with bits 2k, 2k + 1 of qh[32h + l] above it; minus 32).
static inline void gqk_unpack_q6(const nm_block_q6_K *x, gqk_w *o) {
    const __m256i low4 = _mm256_set1_epi8(15), three = _mm256_set1_epi8(3), k32 = _mm256_set1_epi8(32);
    int32_t corr = 0;
    for (int h = 0; h < 2; h++) {
        const __m256i H = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * h));
        for (int k = 0; k < 4; k++) {
            const __m256i L = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h + 32 * (k & 1)));
            const __m256i lo = _mm256_and_si256(k >> 1 ? _mm256_srli_epi16(L, 4) : L, low4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(H, 2 * k), three);
            const __m256i q = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)); // 0..63
            const int e = 128 * h + 32 * k;
            int32_t s[2];
            sums16(q, s);
            corr += x->scales[e / 16] * (s[0] - 16 * 32) + x->scales[e / 16 + 1] * (s[1] - 16 * 32);
            _mm256_storeu_si256((__m256i *)(o->q + e / 4), _mm256_sub_epi8(q, k32));
        }
    }
    for (int g = 0; g < 16; g++) o->sc[g] = x->scales[g];
    for (int i = 0; i < 4; i++) o->mp[i] = 0;
    o->corr = -128 * corr;
    o->d = h2f_tab(x->d);
    o->dmin = 0.0f;
}

static inline void gqk_unpack(uint32_t type, const uint8_t *wb, gqk_w *o) {
    if (type == NM_TYPE_Q4_K) {
        const nm_block_q4_K *x = (const nm_block_q4_K *)wb;
        gqk_unpack_q45(x->qs, NULL, x->scales, x->d, x->dmin, o);
    } else if (type == NM_TYPE_Q5_K) {
        const nm_block_q5_K *x = (const nm_block_q5_K *)wb;
        gqk_unpack_q45(x->qs, x->qh, x->scales, x->d, x->dmin, o);
    } else {
        gqk_unpack_q6((const nm_block_q6_K *)wb, o);
    }
}

// Rows wt[r][0..nbk) against one token group's super-blocks x[0..nbk),
// continuing the sums in acc.
static inline __attribute__((always_inline)) void gqk_tile(uint32_t type, const gqk_w wt[GQP_R][GQK_KC],
                                                           const gqk_block *restrict x, int64_t nbk,
                                                           __m512 acc[GQP_R]) {
    const bool q6 = type == NM_TYPE_Q6_K;
    const int per = q6 ? 4 : 8; // dwords per scale
    for (int64_t b = 0; b < nbk; b++) {
        const gqk_block *xb = &x[b];
        __m512i isum[GQP_R];
        for (int r = 0; r < GQP_R; r++) isum[r] = _mm512_set1_epi32(wt[r][b].corr);
        for (int j = 0; j < 64 / per; j++) {
            __m512i X[8];
            for (int i = 0; i < per; i++) X[i] = _mm512_load_si512(xb->q[per * j + i]);
            _Pragma("GCC unroll 8") for (int r = 0; r < GQP_R; r++) {
                const gqk_w *w = &wt[r][b];
                __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), X[0], _mm512_set1_epi32(w->q[per * j]));
                for (int i = 1; i < per; i++) s = _mm512_dpbusd_epi32(s, X[i], _mm512_set1_epi32(w->q[per * j + i]));
                isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(s, _mm512_set1_epi32(w->sc[j])));
            }
        }
        const __m512 dx = _mm512_load_ps(xb->dx);
        if (q6) {
            _Pragma("GCC unroll 8") for (int r = 0; r < GQP_R; r++) {
                const __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(wt[r][b].d), dx), _mm512_cvtepi32_ps(isum[r]));
                acc[r] = _mm512_add_ps(acc[r], v);
            }
        } else {
            __m512i P[4];
            for (int i = 0; i < 4; i++) P[i] = _mm512_load_si512(xb->pairs[i]);
            _Pragma("GCC unroll 8") for (int r = 0; r < GQP_R; r++) {
                const gqk_w *w = &wt[r][b];
                __m512i ms = _mm512_dpwssd_epi32(_mm512_setzero_si512(), P[0], _mm512_set1_epi32(w->mp[0]));
                for (int i = 1; i < 4; i++) ms = _mm512_dpwssd_epi32(ms, P[i], _mm512_set1_epi32(w->mp[i]));
                const __m512 d = _mm512_mul_ps(_mm512_set1_ps(w->d), dx), dm = _mm512_mul_ps(_mm512_set1_ps(w->dmin), dx);
                const __m512 v = _mm512_sub_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(isum[r])),
                                               _mm512_mul_ps(dm, _mm512_cvtepi32_ps(ms)));
                acc[r] = _mm512_add_ps(acc[r], v);
            }
        }
    }
}

// The driver of both packed forms: a row tile's weights are unpacked once per
// K chunk and meet every token group (group g at pack + g * NM_GQP_BYTES(K));
// a K longer than the chunk keeps the partial sums in y.
static inline __attribute__((always_inline)) void gemmq_packed_body(uint32_t type, const void *restrict w,
                                                                    size_t w_stride, int64_t n_rows,
                                                                    const void *restrict pack, int64_t n_tok,
                                                                    int64_t K, float *restrict y, int64_t ldy) {
    const bool kf = type == NM_TYPE_Q4_K || type == NM_TYPE_Q5_K || type == NM_TYPE_Q6_K;
    const int64_t qk = kf ? NM_QK_K : NM_QK, kc = kf ? GQK_KC : GQP_KC;
    const int64_t nb = K / qk, ng = (n_tok + NM_GQP_TOK - 1) / NM_GQP_TOK;
    const size_t wsz = nm_row_size(type, qk), usz = kf ? sizeof(gqk_w) : sizeof(gqp_w);
    const size_t xsz = kf ? sizeof(gqk_block) : sizeof(gqp_block);
    if (nb == 0) gq_zero(y, ldy, n_rows, n_tok);
    union {
        gqp_w p[GQP_R][GQP_KC];
        gqk_w k[GQP_R][GQK_KC];
    } wt __attribute__((aligned(64)));
    for (int64_t r0 = 0; r0 < n_rows; r0 += GQP_R) {
        const int nr = n_rows - r0 < GQP_R ? (int)(n_rows - r0) : GQP_R;
        for (int64_t b0 = 0; b0 < nb; b0 += kc) {
            const int64_t nbk = nb - b0 < kc ? nb - b0 : kc;
            for (int r = 0; r < GQP_R; r++) {
                if (r < nr) {
                    const uint8_t *row = (const uint8_t *)w + (size_t)(r0 + r) * w_stride + (size_t)b0 * wsz;
                    for (int64_t b = 0; b < nbk; b++) {
                        if (kf) gqk_unpack(type, row + (size_t)b * wsz, &wt.k[r][b]);
                        else gqp_unpack(type, row + (size_t)b * wsz, &wt.p[r][b]);
                    }
                } else {
                    memset(kf ? (void *)wt.k[r] : (void *)wt.p[r], 0, (size_t)nbk * usz);
                }
            }
            for (int64_t g = 0; g < ng; g++) {
                const int64_t t0 = g * NM_GQP_TOK, nt = n_tok - t0 < NM_GQP_TOK ? n_tok - t0 : NM_GQP_TOK;
                const uint8_t *xg = (const uint8_t *)pack + (size_t)g * NM_GQP_BYTES(K) + (size_t)b0 * xsz;
                float v[NM_GQP_TOK] __attribute__((aligned(64)));
                __m512 acc[GQP_R];
                for (int r = 0; r < GQP_R; r++) {
                    if (b0 == 0 || r >= nr) {
                        acc[r] = _mm512_setzero_ps();
                        continue;
                    }
                    for (int64_t t = 0; t < nt; t++) v[t] = y[(t0 + t) * ldy + r0 + r]; // the sums so far
                    acc[r] = _mm512_maskz_loadu_ps((__mmask16)((1u << nt) - 1), v);
                }
                if (kf) gqk_tile(type, (const gqk_w(*)[GQK_KC])wt.k, (const gqk_block *)xg, nbk, acc);
                else gqp_tile(type, (const gqp_w(*)[GQP_KC])wt.p, (const gqp_block *)xg, nbk, acc);
                for (int r = 0; r < nr; r++) {
                    _mm512_store_ps(v, acc[r]);
                    for (int64_t t = 0; t < nt; t++) y[(t0 + t) * ldy + r0 + r] = v[t];
                }
            }
        }
    }
}

#define GEMMQ_PACKED(name, type)                                                                                 \
    static void name(const void *restrict w, size_t w_stride, int64_t n_rows, const void *restrict pack,         \
                     int64_t n_tok, int64_t K, float *restrict y, int64_t ldy) {                                 \
        gemmq_packed_body(type, w, w_stride, n_rows, pack, n_tok, K, y, ldy);                                    \
    }
GEMMQ_PACKED(gemmq_packed_q4_0, NM_TYPE_Q4_0)
GEMMQ_PACKED(gemmq_packed_q4_1, NM_TYPE_Q4_1)
GEMMQ_PACKED(gemmq_packed_q5_0, NM_TYPE_Q5_0)
GEMMQ_PACKED(gemmq_packed_q5_1, NM_TYPE_Q5_1)
GEMMQ_PACKED(gemmq_packed_q8_0, NM_TYPE_Q8_0)
GEMMQ_PACKED(gemmq_packed_mxfp4, NM_TYPE_MXFP4)
GEMMQ_PACKED(gemmq_packed_q4_K, NM_TYPE_Q4_K)
GEMMQ_PACKED(gemmq_packed_q5_K, NM_TYPE_Q5_K)
GEMMQ_PACKED(gemmq_packed_q6_K, NM_TYPE_Q6_K)

// ---- prefill: q4_K . q8_K ------------------------------------------------------------------
//
// Tile: one weight row x 8 tokens. A super-block's 128 nibble bytes are two
// zmm: the low nibbles of the first hold sub-blocks 0 and 2, its high
// nibbles 1 and 3, the second's 4, 6 and 5, 7; the tokens' activations are
// prepared once per 8 tokens and K chunk in that order. Per (row,
// super-block, token): four vpdpbusd (q . x, dword sums of 4 products, |.| <=
// 4 * 15 * 128: an int16) and four vpdpwssd that multiply each dword's low
// int16 by its sub-block's scale and add up (the high int16, a sign
// extension, meets a zero), one vcvtdq2ps and one fma by d * dx. The min term
// dmin * dx * sum_j m_j * (bsums[2j] + bsums[2j+1]) is one vpmaddwd per 4
// tokens on the prepared pair sums. Same integers as the reference; only the
// order of the f32 sums differs.
#define GK4_TOK 8
#define GK4_CH 8 // super-blocks per K chunk: the prepared tokens take 17 KB of L1

typedef struct {
    __m512i x[GK4_CH][GK4_TOK][4]; // activations in the weights' nibble order
    __m512i bs[GK4_CH][2];         // pair sums (i16 x 8 per token) of tokens 0-3, 4-7 (one per 128-bit lane)
    float dx[GK4_CH][GK4_TOK];
} q8k_prep;

static void q8k_prep_fill(const uint8_t *xq, size_t x_stride, int64_t t0, int nt, int64_t b0, int nb, q8k_prep *pp) {
    for (int b = 0; b < nb; b++) {
        int16_t pairs[GK4_TOK][8];
        for (int t = 0; t < GK4_TOK; t++) {
            if (t >= nt) {
                for (int z = 0; z < 4; z++) pp->x[b][t][z] = _mm512_setzero_si512();
                memset(pairs[t], 0, sizeof pairs[t]);
                pp->dx[b][t] = 0.0f;
                continue;
            }
            const nm_block_q8_K *y = (const nm_block_q8_K *)(xq + (size_t)(t0 + t) * x_stride) + b0 + b;
            const int8_t *q = y->qs;
            for (int z = 0; z < 4; z++) { // z: sub-blocks (0, 2), (1, 3), (4, 6), (5, 7)
                const int lo = (z / 2) * 128 + (z % 2) * 32; // the lower sub-block's first element
                pp->x[b][t][z] = _mm512_inserti64x4(_mm512_castsi256_si512(load256(q + lo)), load256(q + lo + 64), 1);
            }
            for (int j = 0; j < 8; j++) pairs[t][j] = (int16_t)(y->bsums[2 * j] + y->bsums[2 * j + 1]);
            pp->dx[b][t] = y->d;
        }
        pp->bs[b][0] = _mm512_loadu_si512(pairs[0]);
        pp->bs[b][1] = _mm512_loadu_si512(pairs[4]);
    }
}

// One q4_K row x the 8 prepared tokens over nb super-blocks: v[t] (before the store).
static inline __attribute__((always_inline)) void q4_K_tile_row(const nm_block_q4_K *row, int nb, const q8k_prep *pp,
                                                                float v[GK4_TOK]) {
    const __m512i zero = _mm512_setzero_si512();
    const __m512i pick0 = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 28, 24, 20, 16, 12, 8, 4, 0);
    const __m512i sidx[4] = {q4k_sidx(0), q4k_sidx(1), q4k_sidx(2), q4k_sidx(3)};
    __m512 acc[GK4_TOK];
    for (int t = 0; t < GK4_TOK; t++) acc[t] = _mm512_setzero_ps();
    __m256 accm = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const nm_block_q4_K *x = row + b;
        const __m128i smb = q4k_scales_mins(x->scales);
        const __m512i sm = _mm512_cvtepu8_epi32(smb);
        __m512i q[4];
        q4k_quants(x, q);
        const __m512i S[4] = {_mm512_permutexvar_epi32(sidx[0], sm), _mm512_permutexvar_epi32(sidx[1], sm),
                              _mm512_permutexvar_epi32(sidx[2], sm), _mm512_permutexvar_epi32(sidx[3], sm)};
        // min term of the 8 tokens
        const __m512i M = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_srli_si128(smb, 8)));
        __m512i h0 = _mm512_madd_epi16(M, pp->bs[b][0]), h1 = _mm512_madd_epi16(M, pp->bs[b][1]);
        h0 = _mm512_add_epi32(h0, _mm512_shuffle_epi32(h0, _MM_PERM_CDAB));
        h1 = _mm512_add_epi32(h1, _mm512_shuffle_epi32(h1, _MM_PERM_CDAB));
        h0 = _mm512_add_epi32(h0, _mm512_shuffle_epi32(h0, _MM_PERM_BADC));
        h1 = _mm512_add_epi32(h1, _mm512_shuffle_epi32(h1, _MM_PERM_BADC));
        const __m256i ms = _mm512_castsi512_si256(_mm512_permutex2var_epi32(h0, pick0, h1));
        const __m256 dx8 = _mm256_loadu_ps(pp->dx[b]);
        accm = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ms), _mm256_mul_ps(_mm256_set1_ps(h2f_tab(x->dmin)), dx8), accm);
        const float d = h2f_tab(x->d);
        _Pragma("GCC unroll 8") for (int t = 0; t < GK4_TOK; t++) {
            const __m512i *xt = pp->x[b][t];
            __m512i a = _mm512_dpwssd_epi32(zero, _mm512_dpbusd_epi32(zero, q[0], xt[0]), S[0]);
            a = _mm512_dpwssd_epi32(a, _mm512_dpbusd_epi32(zero, q[1], xt[1]), S[1]);
            a = _mm512_dpwssd_epi32(a, _mm512_dpbusd_epi32(zero, q[2], xt[2]), S[2]);
            a = _mm512_dpwssd_epi32(a, _mm512_dpbusd_epi32(zero, q[3], xt[3]), S[3]);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), _mm512_set1_ps(d * pp->dx[b][t]), acc[t]);
        }
    }
    float mins[8];
    _mm256_storeu_ps(mins, accm);
    for (int t = 0; t < GK4_TOK; t++) v[t] = _mm512_reduce_add_ps(acc[t]) - mins[t];
}

// ---- prefill: q6_K . q8_K ------------------------------------------------------------------
//
// Tile: one weight row x 8 tokens, the quants as q6k_quants unpacks them. They
// go signed (q - 32, in -32..31) and the activations unsigned (x + 128, by the
// prepared copy): vpdpbusd of x + 128 and q - 32 has dword sums of at most
// 4 * 255 * 32 < 2^15, so vpdpwssd multiplies them by the signed scale of
// their 16 elements (masked to its low int16) as in the q4_K tile; the 128 *
// sum (q - 32) it added is the same for every token and starts each token's
// accumulator. Same integers as the reference; only the f32 sums' order differs.
static void q8k_prep_fill_q6(const uint8_t *xq, size_t x_stride, int64_t t0, int nt, int64_t b0, int nb,
                             q8k_prep *pp) {
    const __m512i k80 = _mm512_set1_epi8((char)0x80);
    for (int b = 0; b < nb; b++)
        for (int t = 0; t < GK4_TOK; t++) {
            if (t >= nt) {
                for (int z = 0; z < 4; z++) pp->x[b][t][z] = k80; // x = 0
                pp->dx[b][t] = 0.0f;
                continue;
            }
            const nm_block_q8_K *y = (const nm_block_q8_K *)(xq + (size_t)(t0 + t) * x_stride) + b0 + b;
            for (int z = 0; z < 4; z++) pp->x[b][t][z] = _mm512_xor_si512(_mm512_loadu_si512(y->qs + 64 * z), k80);
            pp->dx[b][t] = y->d;
        }
}

// One q6_K row x the 8 prepared tokens over nb super-blocks: v[t] (before the store).
static inline __attribute__((always_inline)) void q6_K_tile_row(const nm_block_q6_K *row, int nb, const q8k_prep *pp,
                                                                float v[GK4_TOK]) {
    const __m512i k32 = _mm512_set1_epi8(32), ones = _mm512_set1_epi8(1), zero = _mm512_setzero_si512();
    const __m512i sidx[4] = {q6k_sidx(0), q6k_sidx(1), q6k_sidx(2), q6k_sidx(3)};
    __m512 acc[GK4_TOK];
    for (int t = 0; t < GK4_TOK; t++) acc[t] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const nm_block_q6_K *x = row + b;
        const __m512i scd = q6k_scales(x->scales);
        __m512i q[4], S[4], cc = zero;
        q6k_quants(x, q);
        for (int z = 0; z < 4; z++) q[z] = _mm512_sub_epi8(q[z], k32);
        for (int z = 0; z < 4; z++) {
            S[z] = _mm512_permutexvar_epi32(sidx[z], scd);
            cc = _mm512_dpwssd_epi32(cc, _mm512_dpbusd_epi32(zero, ones, q[z]), S[z]);
        }
        const __m512i init = _mm512_sub_epi32(zero, _mm512_slli_epi32(cc, 7));
        const float d = h2f_tab(x->d);
        _Pragma("GCC unroll 8") for (int t = 0; t < GK4_TOK; t++) {
            const __m512i *xt = pp->x[b][t];
            __m512i a = _mm512_dpwssd_epi32(init, _mm512_dpbusd_epi32(zero, xt[0], q[0]), S[0]);
            a = _mm512_dpwssd_epi32(a, _mm512_dpbusd_epi32(zero, xt[1], q[1]), S[1]);
            a = _mm512_dpwssd_epi32(a, _mm512_dpbusd_epi32(zero, xt[2], q[2]), S[2]);
            a = _mm512_dpwssd_epi32(a, _mm512_dpbusd_epi32(zero, xt[3], q[3]), S[3]);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), _mm512_set1_ps(d * pp->dx[b][t]), acc[t]);
        }
    }
    for (int t = 0; t < GK4_TOK; t++) v[t] = _mm512_reduce_add_ps(acc[t]);
}

// The K-format tiles' driver: 8 tokens prepared per K chunk, then every row.
static inline __attribute__((always_inline)) void gemmq_k512(uint32_t type, const void *restrict w, size_t w_stride,
                                                             int64_t n_rows, const void *restrict xq, size_t x_stride,
                                                             int64_t n_tok, int64_t K, float *restrict y, int64_t ldy) {
    const int64_t nbt = K / NM_QK_K;
    if (nbt == 0) gq_zero(y, ldy, n_rows, n_tok);
    q8k_prep pp;
    for (int64_t t0 = 0; t0 < n_tok; t0 += GK4_TOK) {
        const int nt = n_tok - t0 < GK4_TOK ? (int)(n_tok - t0) : GK4_TOK;
        for (int64_t b0 = 0; b0 < nbt; b0 += GK4_CH) {
            const int nb = nbt - b0 < GK4_CH ? (int)(nbt - b0) : GK4_CH;
            if (type == NM_TYPE_Q4_K) q8k_prep_fill(xq, x_stride, t0, nt, b0, nb, &pp);
            else q8k_prep_fill_q6(xq, x_stride, t0, nt, b0, nb, &pp);
            for (int64_t r = 0; r < n_rows; r++) {
                const uint8_t *row = (const uint8_t *)w + (size_t)r * w_stride;
                float v[GK4_TOK];
                if (type == NM_TYPE_Q4_K) q4_K_tile_row((const nm_block_q4_K *)row + b0, nb, &pp, v);
                else q6_K_tile_row((const nm_block_q6_K *)row + b0, nb, &pp, v);
                for (int t = 0; t < nt; t++) {
                    float *yt = y + (size_t)(t0 + t) * (size_t)ldy + r;
                    *yt = b0 ? *yt + v[t] : v[t];
                }
            }
        }
    }
}

static void gemmq_q4_K(const void *restrict w, size_t w_stride, int64_t n_rows, const void *restrict xq,
                       size_t x_stride, int64_t n_tok, int64_t K, float *restrict y, int64_t ldy) {
    gemmq_k512(NM_TYPE_Q4_K, w, w_stride, n_rows, xq, x_stride, n_tok, K, y, ldy);
}

static void gemmq_q6_K(const void *restrict w, size_t w_stride, int64_t n_rows, const void *restrict xq,
                       size_t x_stride, int64_t n_tok, int64_t K, float *restrict y, int64_t ldy) {
    gemmq_k512(NM_TYPE_Q6_K, w, w_stride, n_rows, xq, x_stride, n_tok, K, y, ldy);
}

// ---- decode: q4_K and q6_K x q8_K --------------------------------------------------------
//
// The tiles above with one token: the activation is laid out once per op (the
// weights' nibble order for q4_K with the pair sums of its 16-element sums;
// element order for q6_K with the 16-element sums as they are), and each row's
// super-block is unpacked and dotted in zmm registers: four vpdpbusd and four
// vpdpwssd (the scales per dword) into one int32 vector, one vcvtdq2ps, one
// fma by d * dx. The other term is integer too: q4_K's mins by vpmaddwd on
// the pair sums (into its own f32 accumulator, scaled by dmin * dx), q6_K's
// offset 32 * sum_j sc_j * bsums_j by vpmaddwd, taken off the int32 vector.
// Same integers as the reference; only the order of the f32 sums differs.
typedef struct {
    __m512i x[4];    // q4_K: sub-blocks (0, 2), (1, 3), (4, 6), (5, 7); q6_K: elements 64z..64z+63
    int16_t bs[16];  // q4_K: the 8 pair sums bsums[2j] + bsums[2j+1]; q6_K: the 16 bsums
    float dx;
    float pad[7];
} qk_gv;             // 320 bytes per super-block

static void gemv_prep_q4_K(const void *restrict xq, int64_t K, void *restrict prep) {
    const nm_block_q8_K *y = xq;
    qk_gv *g = prep;
    for (int64_t b = 0; b < K / NM_QK_K; b++, g++) {
        const int8_t *q = y[b].qs;
        for (int z = 0; z < 4; z++) { // as q8k_prep_fill
            const int lo = (z / 2) * 128 + (z % 2) * 32;
            g->x[z] = _mm512_inserti64x4(_mm512_castsi256_si512(load256(q + lo)), load256(q + lo + 64), 1);
        }
        memset(g->bs, 0, sizeof g->bs);
        for (int j = 0; j < 8; j++) g->bs[j] = (int16_t)(y[b].bsums[2 * j] + y[b].bsums[2 * j + 1]);
        g->dx = y[b].d;
    }
}

static void gemv_prep_q6_K(const void *restrict xq, int64_t K, void *restrict prep) {
    const nm_block_q8_K *y = xq;
    qk_gv *g = prep;
    for (int64_t b = 0; b < K / NM_QK_K; b++, g++) {
        for (int z = 0; z < 4; z++) g->x[z] = _mm512_loadu_si512(y[b].qs + 64 * z);
        memcpy(g->bs, y[b].bsums, sizeof g->bs);
        g->dx = y[b].d;
    }
}

static inline __m512 q4_K_row(const uint8_t *restrict row, int64_t nb, const qk_gv *restrict g) {
    const __m512i zero = _mm512_setzero_si512();
    const __m512i sidx[4] = {q4k_sidx(0), q4k_sidx(1), q4k_sidx(2), q4k_sidx(3)};
    const nm_block_q4_K *x = (const nm_block_q4_K *)row;
    __m512 acc = _mm512_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int64_t b = 0; b < nb; b++, g++) {
        const __m128i smb = q4k_scales_mins(x[b].scales);
        const __m512i sm = _mm512_cvtepu8_epi32(smb);
        // mins . pair sums: 8 int16 products summed in pairs to 4 int32
        const __m128i mins = _mm_cvtepu8_epi16(_mm_srli_si128(smb, 8));
        accm = _mm_fmadd_ps(_mm_cvtepi32_ps(_mm_madd_epi16(mins, _mm_load_si128((const __m128i *)g->bs))),
                            _mm_set1_ps(h2f_tab(x[b].dmin) * g->dx), accm);
        __m512i q[4], a = zero;
        q4k_quants(x + b, q);
        for (int z = 0; z < 4; z++)
            a = _mm512_dpwssd_epi32(a, _mm512_dpbusd_epi32(zero, q[z], g->x[z]), _mm512_permutexvar_epi32(sidx[z], sm));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), _mm512_set1_ps(h2f_tab(x[b].d) * g->dx), acc);
    }
    return _mm512_sub_ps(acc, _mm512_zextps128_ps512(accm));
}

// q6_K: the quants unsigned (0..63), so that vpdpbusd takes the activations
// as they are (dword sums |.| <= 4 * 63 * 128 < 2^15: vpdpwssd's low int16).
static inline __m512 q6_K_row(const uint8_t *restrict row, int64_t nb, const qk_gv *restrict g) {
    const __m512i zero = _mm512_setzero_si512();
    const __m512i sidx[4] = {q6k_sidx(0), q6k_sidx(1), q6k_sidx(2), q6k_sidx(3)};
    const nm_block_q6_K *x = (const nm_block_q6_K *)row;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, g++) {
        const __m512i scd = q6k_scales(x[b].scales);
        // 32 * sum_j sc_j * bsums_j, as 8 int32 in the low lanes
        const __m256i off = _mm256_slli_epi32(
            _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[b].scales)),
                              _mm256_load_si256((const __m256i *)g->bs)),
            5);
        __m512i a = _mm512_zextsi256_si512(_mm256_sub_epi32(_mm256_setzero_si256(), off));
        __m512i q[4];
        q6k_quants(x + b, q);
        for (int z = 0; z < 4; z++)
            a = _mm512_dpwssd_epi32(a, _mm512_dpbusd_epi32(zero, q[z], g->x[z]), _mm512_permutexvar_epi32(sidx[z], scd));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), _mm512_set1_ps(h2f_tab(x[b].d) * g->dx), acc);
    }
    return acc;
}

GEMV_DEFINE(gemv_q4_K, nm_block_q4_K, NM_QK_K, q4_K_row)
GEMV_DEFINE(gemv_q6_K, nm_block_q6_K, NM_QK_K, q6_K_row)

// A small batch (gemv_multi, quant.h) of the K formats: each super-block's scales and quants unpacked once
// (q4k_scales_mins / q6k_scales, the widenings and the scale permutes, q4k_quants / q6k_quants) for every
// token, then per token the integer dots and the f32 operations of q4_K_row / q6_K_row in their order, its
// accumulators kept across the row's super-blocks: a token's sum has the bits gemv gives it alone.
#define KQ_MULTI_ROWS(block)                                                                                  \
    const uint8_t *wd = w;                                                                                    \
    const int64_t nb = K / NM_QK_K;                                                                           \
    const size_t row_bytes = (size_t)nb * sizeof(block);                                                     \
    const int64_t far = nm_prefetch_far_rows(w_stride);                                                       \
    for (int64_t r = 0; r < n_rows; r++) {                                                                    \
        if (r + NM_PREFETCH_ROWS < n_rows + n_ahead)                                                          \
            nm_prefetch_l1(wd + (size_t)(r + NM_PREFETCH_ROWS) * w_stride, row_bytes);                        \
        if (r + far < n_rows) nm_prefetch_l2(wd + (size_t)(r + far) * w_stride, row_bytes);                   \
        const block *x = (const block *)(wd + (size_t)r * w_stride);

#define KQ_GV(t, b) ((const qk_gv *)((const uint8_t *)prep + (size_t)(t) * prep_stride) + (b))

static void gemv_multi_q4_K(const void *restrict w, size_t w_stride, int64_t n_rows, int64_t n_ahead,
                            const void *restrict prep, size_t prep_stride, int n_tok, int64_t K, float *restrict y,
                            int64_t ldy) {
    const __m512i zero = _mm512_setzero_si512();
    const __m512i sidx[4] = {q4k_sidx(0), q4k_sidx(1), q4k_sidx(2), q4k_sidx(3)};
    __m512 acc[NM_GEMV_MULTI_MAX];
    __m128 accm[NM_GEMV_MULTI_MAX];
    KQ_MULTI_ROWS(nm_block_q4_K)
        for (int t = 0; t < n_tok; t++) acc[t] = _mm512_setzero_ps(), accm[t] = _mm_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const __m128i smb = q4k_scales_mins(x[b].scales);
            const __m512i sm = _mm512_cvtepu8_epi32(smb);
            const __m128i mins = _mm_cvtepu8_epi16(_mm_srli_si128(smb, 8));
            __m512i q[4], sc[4];
            q4k_quants(x + b, q);
            for (int z = 0; z < 4; z++) sc[z] = _mm512_permutexvar_epi32(sidx[z], sm);
            const float d = h2f_tab(x[b].d), dmin = h2f_tab(x[b].dmin);
            for (int t = 0; t < n_tok; t++) {
                const qk_gv *g = KQ_GV(t, b);
                accm[t] = _mm_fmadd_ps(_mm_cvtepi32_ps(_mm_madd_epi16(mins, _mm_load_si128((const __m128i *)g->bs))),
                                       _mm_set1_ps(dmin * g->dx), accm[t]);
                __m512i a = zero;
                for (int z = 0; z < 4; z++) a = _mm512_dpwssd_epi32(a, _mm512_dpbusd_epi32(zero, q[z], g->x[z]), sc[z]);
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), _mm512_set1_ps(d * g->dx), acc[t]);
            }
        }
        for (int t = 0; t < n_tok; t++)
            y[t * ldy + r] = _mm512_reduce_add_ps(_mm512_sub_ps(acc[t], _mm512_zextps128_ps512(accm[t])));
    }
}

static void gemv_multi_q6_K(const void *restrict w, size_t w_stride, int64_t n_rows, int64_t n_ahead,
                            const void *restrict prep, size_t prep_stride, int n_tok, int64_t K, float *restrict y,
                            int64_t ldy) {
    const __m512i zero = _mm512_setzero_si512();
    const __m512i sidx[4] = {q6k_sidx(0), q6k_sidx(1), q6k_sidx(2), q6k_sidx(3)};
    __m512 acc[NM_GEMV_MULTI_MAX];
    KQ_MULTI_ROWS(nm_block_q6_K)
        for (int t = 0; t < n_tok; t++) acc[t] = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const __m512i scd = q6k_scales(x[b].scales);
            const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[b].scales));
            __m512i q[4], sc[4];
            q6k_quants(x + b, q);
            for (int z = 0; z < 4; z++) sc[z] = _mm512_permutexvar_epi32(sidx[z], scd);
            const float d = h2f_tab(x[b].d);
            for (int t = 0; t < n_tok; t++) {
                const qk_gv *g = KQ_GV(t, b);
                const __m256i off = _mm256_slli_epi32(_mm256_madd_epi16(sc16, _mm256_load_si256((const __m256i *)g->bs)), 5);
                __m512i a = _mm512_zextsi256_si512(_mm256_sub_epi32(_mm256_setzero_si256(), off));
                for (int z = 0; z < 4; z++) a = _mm512_dpwssd_epi32(a, _mm512_dpbusd_epi32(zero, q[z], g->x[z]), sc[z]);
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), _mm512_set1_ps(d * g->dx), acc[t]);
            }
        }
        for (int t = 0; t < n_tok; t++) y[t * ldy + r] = _mm512_reduce_add_ps(acc[t]);
    }
}
#undef KQ_MULTI_ROWS
#undef KQ_GV

#if defined(__clang__)
#pragma clang attribute pop
#endif

_Static_assert(sizeof(q4_1_group) == 768, "q4_1 group layout");
_Static_assert(NM_GEMV_PREP_BYTES(NM_QK * Q4_1_GROUP) >= sizeof(q4_1_group), "q4_1 prep size");
_Static_assert(sizeof(q8_pair) == 192 && NM_GEMV_PREP_BYTES(1024) >= 16 * sizeof(q8_pair), "pair prep size");
_Static_assert(sizeof(gqp_block) == NM_GQP_BYTES(NM_QK) && sizeof(gqp_w) == 48, "packed prefill layout");
_Static_assert(sizeof(gqk_block) % 64 == 0 && sizeof(gqk_block) <= NM_GQP_BYTES(NM_QK_K) && sizeof(gqk_w) == 384,
               "packed K-format prefill layout");
_Static_assert(sizeof(qk_gv) == 320 && NM_GEMV_PREP_BYTES(1024) >= 4 * sizeof(qk_gv), "K-quant prep size");

static const nm_kernels avx512_table = {
    .name = "avx512",
    .gemv_prep = {[NM_TYPE_Q4_0] = gemv_prep_q4_0, [NM_TYPE_Q4_1] = gemv_prep_q4_1,
                  [NM_TYPE_Q5_0] = gemv_prep_q5_0, [NM_TYPE_Q8_0] = gemv_prep_q8_0,
                  [NM_TYPE_Q4_K] = gemv_prep_q4_K, [NM_TYPE_Q6_K] = gemv_prep_q6_K},
    .gemmq = {[NM_TYPE_Q4_0] = gemmq_q4_0, [NM_TYPE_Q5_0] = gemmq_q5_0, [NM_TYPE_Q8_0] = gemmq_q8_0,
              [NM_TYPE_Q4_K] = gemmq_q4_K, [NM_TYPE_Q6_K] = gemmq_q6_K},
    .gemv_multi = {[NM_TYPE_Q4_0] = gemv_multi_q4_0, [NM_TYPE_Q4_1] = gemv_multi_q4_1, [NM_TYPE_Q5_0] = gemv_multi_q5_0,
                   [NM_TYPE_Q8_0] = gemv_multi_q8_0, [NM_TYPE_Q4_K] = gemv_multi_q4_K, [NM_TYPE_Q6_K] = gemv_multi_q6_K},
    .gemv = {[NM_TYPE_Q4_0] = gemv_q4_0, [NM_TYPE_Q4_1] = gemv_q4_1, [NM_TYPE_Q5_0] = gemv_q5_0,
             [NM_TYPE_Q8_0] = gemv_q8_0, [NM_TYPE_Q4_K] = gemv_q4_K, [NM_TYPE_Q6_K] = gemv_q6_K},
    .gemmq_pack = {[NM_TYPE_Q8_0] = gemmq_pack_q8_0, [NM_TYPE_Q8_1] = gemmq_pack_q8_1, [NM_TYPE_Q8_K] = gemmq_pack_q8_K},
    .gemmq_packed = {[NM_TYPE_Q4_0] = gemmq_packed_q4_0, [NM_TYPE_Q4_1] = gemmq_packed_q4_1,
                     [NM_TYPE_Q5_0] = gemmq_packed_q5_0, [NM_TYPE_Q5_1] = gemmq_packed_q5_1,
                     [NM_TYPE_Q8_0] = gemmq_packed_q8_0, [NM_TYPE_MXFP4] = gemmq_packed_mxfp4,
                     [NM_TYPE_Q4_K] = gemmq_packed_q4_K, [NM_TYPE_Q5_K] = gemmq_packed_q5_K,
                     [NM_TYPE_Q6_K] = gemmq_packed_q6_K},
};

// Called once, under dispatch.c's pthread_once.
const nm_kernels *nm_kernels_avx512(void) {
    nm_f16_table_init();
    return &avx512_table;
}
