// AVX2 gemmq: many weight rows x many quantized activation rows, the prefill
// matmul. The legacy formats' bodies are in x86_gemmq_blocks.h (shared with
// the AVX-VNNI build); the K formats are here. The ref (nm_gemmq_*_ref, the
// dotq_ref loop) is the spec; results differ from it only in the order of the
// f32 sums.
#include "quant/x86_dotq_blocks.h"
#include "quant/x86_gemmq_blocks.h"

NM_GQ_DEFINE(nm_gemmq_q4_0_avx2, NM_TYPE_Q4_0)
NM_GQ_DEFINE(nm_gemmq_q4_1_avx2, NM_TYPE_Q4_1)
NM_GQ_DEFINE(nm_gemmq_q5_0_avx2, NM_TYPE_Q5_0)
NM_GQ_DEFINE(nm_gemmq_q5_1_avx2, NM_TYPE_Q5_1)
NM_GQ_DEFINE(nm_gemmq_q8_0_avx2, NM_TYPE_Q8_0)
NM_GQ_DEFINE(nm_gemmq_mxfp4_avx2, NM_TYPE_MXFP4)

// ---- K formats . q8_K ---------------------------------------------------------------------
// Tile: one weight row x 8 tokens. The super-block's scales are unpacked and
// each 32 quants extracted once, then multiplied with the 8 token blocks:
// vpmaddubsw, vpmaddwd by the sub-block scale, int32 sum per token over the
// super-block (< 2^31 as in the dotq). Per super-block the 4 int32 vectors of
// a token group are reduced into [t0 t1 t2 t3 | ..] lanes for one cvt + FMA.

#define GK_CH 32 // super-blocks per K chunk

typedef struct {
    __m128 dx[GK_CH];
    __m256i bp[GK_CH][2]; // q4_K: bsum pairs (8 x i16) of tokens [0 | 2] and [1 | 3]
} gk_tokgrp;

enum { Q8K_QS = 4, Q8K_BSUMS = 4 + NM_QK_K }; // offsetof in nm_block_q8_K

NM_GQ_INLINE void gk_prep(uint32_t type, const uint8_t *const yp[4], int64_t b0, int64_t nb, gk_tokgrp *g) {
    for (int64_t b = 0; b < nb; b++) {
        const size_t o = (size_t)(b0 + b) * sizeof(nm_block_q8_K);
        float d[4];
        for (int t = 0; t < 4; t++) memcpy(&d[t], yp[t] + o, 4);
        g->dx[b] = _mm_loadu_ps(d);
        if (type == NM_TYPE_Q4_K) {
            __m128i p[4];
            for (int t = 0; t < 4; t++) {
                const int16_t *bs = (const int16_t *)(yp[t] + o + Q8K_BSUMS); // pair sums fit int16: |.| <= 32 * 128
                p[t] = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)bs), _mm_loadu_si128((const __m128i *)(bs + 8)));
            }
            g->bp[b][0] = _mm256_set_m128i(p[2], p[0]);
            g->bp[b][1] = _mm256_set_m128i(p[3], p[1]);
        }
    }
}

// q4_K min term of 4 tokens: sum_j mins[j] * bsum_pair_j(t) as [t0 t1 t2 t3].
NM_GQ_INLINE __m128i gk_min4(__m128i mins, const __m256i bp[2]) {
    const __m256i m = _mm256_broadcastsi128_si256(mins);
    __m256i h = _mm256_hadd_epi32(_mm256_madd_epi16(m, bp[0]), _mm256_madd_epi16(m, bp[1]));
    h = _mm256_hadd_epi32(h, h); // [t0 t1 t0 t1 | t2 t3 t2 t3]
    return _mm_unpacklo_epi64(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

// One row (q4_K or q6_K) x ng groups of 4 tokens over super-blocks [b0, b0 + nb): acc (halves to add) and accm (to subtract).
NM_GQ_INLINE void gk_tile(uint32_t type, const uint8_t *w, const uint8_t *const yp[8], const gk_tokgrp *tg, int ng,
                          int64_t b0, int64_t nb, __m256 acc[2], __m128 accm[2]) {
    const __m256i m4 = _mm256_set1_epi8(15);
    for (int g = 0; g < ng; g++) acc[g] = _mm256_setzero_ps(), accm[g] = _mm_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const size_t yo = (size_t)(b0 + b) * sizeof(nm_block_q8_K);
        __m256i a[2][4];
        float dw;
        if (type == NM_TYPE_Q4_K) {
            const nm_block_q4_K *x = (const nm_block_q4_K *)w + b0 + b;
            __m256i sc;
            __m128i mins;
            qk_sm_unpack(x->scales, &sc, &mins);
            dw = h2f(x->d);
            const float dmin = h2f(x->dmin);
            for (int g = 0; g < ng; g++) {
                accm[g] = _mm_fmadd_ps(_mm_cvtepi32_ps(gk_min4(mins, tg[g].bp[b])),
                                       _mm_mul_ps(_mm_set1_ps(dmin), tg[g].dx[b]), accm[g]);
                for (int t = 0; t < 4; t++) a[g][t] = _mm256_setzero_si256();
            }
            for (int j = 0; j < 8; j++) { // sub-block j: low nibbles of qs[32(j/2)..] for even j, high for odd
                const __m256i q4 = load256(x->qs + 32 * (j / 2));
                const __m256i q = _mm256_and_si256(j & 1 ? _mm256_srli_epi16(q4, 4) : q4, m4);
                const __m256i sj = scale_one(sc, j); // one sub-block at a time: 8 accumulators + 2 live
                for (int g = 0; g < ng; g++)
                    for (int t = 0; t < 4; t++) {
                        const __m256i yq = load256(yp[4 * g + t] + yo + Q8K_QS + 32 * j);
                        a[g][t] = _mm256_add_epi32(a[g][t], _mm256_madd_epi16(_mm256_maddubs_epi16(q, yq), sj));
                    }
            }
        } else { // q6_K: unsigned q (0..63); the -32 comes off as 32 * sum_g sc[g] * bsums[g]
            const nm_block_q6_K *x = (const nm_block_q6_K *)w + b0 + b;
            const __m256i m3 = _mm256_set1_epi8(0x30);
            const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales));
            dw = h2f(x->d);
            for (int g = 0; g < ng; g++)
                for (int t = 0; t < 4; t++) {
                    const __m256i bs = load256(yp[4 * g + t] + yo + Q8K_BSUMS);
                    a[g][t] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(sc, bs), 5));
                }
            for (int h = 0; h < 2; h++) {
                const __m256i A = load256(x->ql + 64 * h), B = load256(x->ql + 64 * h + 32);
                const __m256i H = load256(x->qh + 32 * h);
                for (int k = 0; k < 4; k++) {
                    const __m256i lo = _mm256_and_si256(k < 2 ? (k ? B : A) : _mm256_srli_epi16(k == 2 ? A : B, 4), m4);
                    const __m256i hb = k == 0 ? _mm256_slli_epi16(H, 4) : k == 1 ? _mm256_slli_epi16(H, 2)
                                     : k == 2 ? H : _mm256_srli_epi16(H, 2);
                    const __m256i q = _mm256_or_si256(lo, _mm256_and_si256(hb, m3));
                    const __m256i scv = scale_pair(sc, 8 * h + 2 * k);
                    for (int g = 0; g < ng; g++)
                        for (int t = 0; t < 4; t++) {
                            const uint8_t *yq = yp[4 * g + t] + yo + Q8K_QS + 128 * h + 32 * k;
                            a[g][t] = _mm256_add_epi32(a[g][t], _mm256_madd_epi16(_mm256_maddubs_epi16(q, load256(yq)), scv));
                        }
                }
            }
        }
        const __m256 vdw = _mm256_set1_ps(dw);
        for (int g = 0; g < ng; g++) {
            const __m256i s = gq_reduce4_i32(a[g][0], a[g][1], a[g][2], a[g][3]);
            acc[g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(vdw, _mm256_broadcast_ps(&tg[g].dx[b])), acc[g]);
        }
    }
}

NM_GQ_INLINE void gk_gemmq(uint32_t type, const void *restrict w, size_t w_stride, int64_t n_rows,
                           const void *restrict xq, size_t x_stride, int64_t n_tok, int64_t K, float *restrict y,
                           int64_t ldy) {
    const int64_t nbt = K / NM_QK_K;
    const uint8_t *wr = w, *x = xq;
    if (nbt == 0) gq_zero(y, ldy, n_rows, n_tok);
    gk_tokgrp tg[2];
    for (int64_t b0 = 0; b0 < nbt; b0 += GK_CH) {
        const int64_t nb = nbt - b0 < GK_CH ? nbt - b0 : GK_CH;
        for (int64_t t0 = 0; t0 < n_tok; t0 += 8) {
            const int ng = n_tok - t0 > 4 ? 2 : 1;
            const uint8_t *yp[8];
            for (int i = 0; i < 8; i++) yp[i] = x + (size_t)(t0 + i < n_tok ? t0 + i : n_tok - 1) * x_stride;
            for (int g = 0; g < ng; g++) gk_prep(type, yp + 4 * g, b0, nb, &tg[g]);
            for (int64_t r = 0; r < n_rows; r++) {
                __m256 acc[2];
                __m128 accm[2];
                if (ng == 2) gk_tile(type, wr + (size_t)r * w_stride, yp, tg, 2, b0, nb, acc, accm);
                else gk_tile(type, wr + (size_t)r * w_stride, yp, tg, 1, b0, nb, acc, accm);
                for (int g = 0; g < ng; g++) {
                    __m128 v = _mm_sub_ps(_mm_add_ps(_mm256_castps256_ps128(acc[g]), _mm256_extractf128_ps(acc[g], 1)),
                                          accm[g]);
                    gq_store(_mm256_castps128_ps256(v), y, ldy, r, t0 + 4 * g, n_tok, b0 == 0, 1);
                }
            }
        }
    }
}

void nm_gemmq_q4_K_avx2(const void *restrict w, size_t w_stride, int64_t n_rows, const void *restrict xq,
                        size_t x_stride, int64_t n_tok, int64_t K, float *restrict y, int64_t ldy) {
    gk_gemmq(NM_TYPE_Q4_K, w, w_stride, n_rows, xq, x_stride, n_tok, K, y, ldy);
}
void nm_gemmq_q6_K_avx2(const void *restrict w, size_t w_stride, int64_t n_rows, const void *restrict xq,
                        size_t x_stride, int64_t n_tok, int64_t K, float *restrict y, int64_t ldy) {
    gk_gemmq(NM_TYPE_Q6_K, w, w_stride, n_rows, xq, x_stride, n_tok, K, y, ldy);
}
