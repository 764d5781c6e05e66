// Internal to src/quant/x86_*.c: gemmq (many weight rows x many activation
// rows) for the 32-element formats . q8_0 / q8_1. Included by x86_gemmq.c
// (AVX2) and x86_vnni_body.h (NM_X86_VNNI: vpdpbusd; from x86_vnni.c and
// x86_vnni512.c), after x86_dotq_blocks.h; each file exports the bodies under
// its own names.
//
// Register tile: 2 weight rows x 8 tokens (two groups of 4). A weight block
// is unpacked once per tile and multiplied with the 8 token blocks. The four
// int dots of a group are reduced horizontally into one vector whose lanes
// are the tokens ([t0 t1 t2 t3 | t0 t1 t2 t3], elements 0-15 | 16-31), so a
// block costs one cvt and one FMA per 4 tokens instead of per token, and the
// f32 accumulators need no horizontal sum per pair. Without VNNI the
// reduction runs on the vpmaddubsw int16 sums (hadd of 8-element sums: <= 8 *
// 31 * 128 for the unsigned 5-bit quants, no overflow) and a single vpmaddwd;
// with VNNI vpdpbusd gives int32 and the reduction is vphaddd.
//
// Signed quants are used as unsigned (q + off, off = 8, 16 or 12 for mxfp4)
// and off * sum(x) subtracted per block; the sums of the token blocks are
// computed once per tile column and shared by all rows. q8_0 weights keep
// the sign trick of dot_i8i8 without VNNI (int16 pair sums too large for
// vphaddw); with VNNI they take the offset path (off = 128).
#ifndef NM_QUANT_X86_GEMMQ_BLOCKS_H
#define NM_QUANT_X86_GEMMQ_BLOCKS_H

#define NM_GQ_INLINE static inline __attribute__((always_inline))
#define GQ_CH 128 // blocks per K chunk: the token data of a chunk is kept on the stack
#define GQ_RB 32  // weight rows per block (a chunk of them, <= 32 x 4.3 KiB for q8_0, stays in L2)

// 4 x (8 x i32) -> [sum a0, sum a1, sum a2, sum a3] per 128-bit half.
NM_GQ_INLINE __m256i gq_reduce4_i32(__m256i a0, __m256i a1, __m256i a2, __m256i a3) {
    return _mm256_hadd_epi32(_mm256_hadd_epi32(a0, a1), _mm256_hadd_epi32(a2, a3));
}

// sum over 16-element halves of u8 q . i8 y for 4 token blocks: [t0 t1 t2 t3 | t0 t1 t2 t3].
NM_GQ_INLINE __m256i gq_dot4_u8(__m256i q, __m256i y0, __m256i y1, __m256i y2, __m256i y3) {
#ifdef NM_X86_VNNI
    const __m256i z = _mm256_setzero_si256();
    return gq_reduce4_i32(nm_dpbusd256(z, q, y0), nm_dpbusd256(z, q, y1),
                          nm_dpbusd256(z, q, y2), nm_dpbusd256(z, q, y3));
#else
    __m256i h = _mm256_hadd_epi16(_mm256_hadd_epi16(_mm256_maddubs_epi16(q, y0), _mm256_maddubs_epi16(q, y1)),
                                  _mm256_hadd_epi16(_mm256_maddubs_epi16(q, y2), _mm256_maddubs_epi16(q, y3)));
    return _mm256_madd_epi16(h, _mm256_set1_epi16(1));
#endif
}

// Same for i8 q (sign trick, int32 all the way).
NM_GQ_INLINE __m256i gq_dot4_i8(__m256i q, __m256i y0, __m256i y1, __m256i y2, __m256i y3) {
    const __m256i a = _mm256_sign_epi8(q, q);
    return gq_reduce4_i32(dot_u8i8(a, _mm256_sign_epi8(y0, q)), dot_u8i8(a, _mm256_sign_epi8(y1, q)),
                          dot_u8i8(a, _mm256_sign_epi8(y2, q)), dot_u8i8(a, _mm256_sign_epi8(y3, q)));
}

enum { GQ_OFF, GQ_MIN, GQ_SIGNED }; // q - off (corrected with sum x), d q + m (q8_1 s), signed i8

// Per token group of 4 and block of the chunk: the activation scales, the
// offset correction (off * sum x per 16-element half, int32, same lanes as
// gq_dot4_*), and for the min formats the q8_1 s field (low half only, so
// that adding the halves at the end counts it once).
typedef struct {
    __m128 dx[GQ_CH];
    __m256i corr[GQ_CH];
    __m256 sx[GQ_CH];
} gq_tokgrp;

NM_GQ_INLINE void gq_prep(int kind, int off, const uint8_t *const yp[4], int64_t b0, int64_t nb, gq_tokgrp *g) {
    const size_t ysz = kind == GQ_MIN ? sizeof(nm_block_q8_1) : sizeof(nm_block_q8_0);
    for (int64_t b = 0; b < nb; b++) {
        const size_t o = (size_t)(b0 + b) * ysz;
        uint16_t d[4], s[4];
        for (int t = 0; t < 4; t++) {
            memcpy(&d[t], yp[t] + o, 2);
            if (kind == GQ_MIN) memcpy(&s[t], yp[t] + o + 2, 2);
        }
        g->dx[b] = _mm_setr_ps(h2f_tab(d[0]), h2f_tab(d[1]), h2f_tab(d[2]), h2f_tab(d[3]));
        if (kind == GQ_MIN)
            g->sx[b] = _mm256_setr_ps(h2f_tab(s[0]), h2f_tab(s[1]), h2f_tab(s[2]), h2f_tab(s[3]), 0, 0, 0, 0);
        if (kind == GQ_OFF) {
            const __m256i one8 = _mm256_set1_epi8(1), one16 = _mm256_set1_epi16(1);
            __m256i sm[4];
            for (int t = 0; t < 4; t++)
                sm[t] = _mm256_madd_epi16(_mm256_maddubs_epi16(one8, load256(yp[t] + o + 2)), one16);
            g->corr[b] = _mm256_mullo_epi32(gq_reduce4_i32(sm[0], sm[1], sm[2], sm[3]), _mm256_set1_epi32(off));
        }
    }
}

// Unpacked weight block: 32 quants in element order (u8, or i8 for q8_0) and its scales.
NM_GQ_INLINE __m256i gq_unpack(uint32_t type, const uint8_t *wb, float *dw, float *mw) {
    uint16_t d, m = 0;
    __m256i q;
    if (type == NM_TYPE_MXFP4) {
        const __m256i tab = _mm256_broadcastsi128_si256(
            _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0)); // nm_kvalues_mxfp4 + 12
        *dw = e8m0_half(wb[0]);
        *mw = 0;
        return _mm256_shuffle_epi8(tab, nibbles32(wb + 1));
    }
    memcpy(&d, wb, 2);
    *dw = h2f_tab(d);
    switch (type) {
    case NM_TYPE_Q4_0: q = nibbles32(wb + 2); break;
    case NM_TYPE_Q4_1: memcpy(&m, wb + 2, 2); q = nibbles32(wb + 4); break;
    case NM_TYPE_Q5_0: case NM_TYPE_Q5_1: {
        const int hoff = type == NM_TYPE_Q5_0 ? 2 : 4;
        uint32_t qh;
        if (type == NM_TYPE_Q5_1) memcpy(&m, wb + 2, 2);
        memcpy(&qh, wb + hoff, 4);
        q = _mm256_or_si256(nibbles32(wb + hoff + 4), _mm256_and_si256(bits32(qh), _mm256_set1_epi8(0x10)));
        break;
    }
    default: // q8_0
#ifdef NM_X86_VNNI
        q = _mm256_xor_si256(load256(wb + 2), _mm256_set1_epi8((char)0x80)); // q + 128 as u8 (see gq_legacy)
#else
        q = load256(wb + 2);
#endif
        break;
    }
    *mw = h2f_tab(m);
    return q;
}

// nr rows x ng groups of 4 tokens over blocks [b0, b0 + nb) into acc[r][g].
NM_GQ_INLINE void gq_tile(uint32_t type, int kind, size_t wsz, const uint8_t *w, size_t w_stride, int nr,
                          const uint8_t *const yp[8], const gq_tokgrp *tg, int ng, int64_t b0, int64_t nb,
                          __m256 acc[2][2]) {
    const size_t ysz = kind == GQ_MIN ? sizeof(nm_block_q8_1) : sizeof(nm_block_q8_0), yq = ysz - NM_QK;
    for (int r = 0; r < nr; r++)
        for (int g = 0; g < ng; g++) acc[r][g] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const size_t wo = (size_t)(b0 + b) * wsz, yo = (size_t)(b0 + b) * ysz + yq;
        for (int r = 0; r < nr; r++) {
            float dw, mw;
            const __m256i q = gq_unpack(type, w + r * w_stride + wo, &dw, &mw);
            const __m256 vdw = _mm256_set1_ps(dw);
            for (int g = 0; g < ng; g++) {
                const uint8_t *const *y = yp + 4 * g;
                const __m256i y0 = load256(y[0] + yo), y1 = load256(y[1] + yo), y2 = load256(y[2] + yo),
                              y3 = load256(y[3] + yo);
                __m256i s = kind == GQ_SIGNED ? gq_dot4_i8(q, y0, y1, y2, y3) : gq_dot4_u8(q, y0, y1, y2, y3);
                if (kind == GQ_OFF) s = _mm256_sub_epi32(s, tg[g].corr[b]);
                const __m256 d = _mm256_mul_ps(vdw, _mm256_broadcast_ps(&tg[g].dx[b]));
                acc[r][g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), d, acc[r][g]);
                if (kind == GQ_MIN) acc[r][g] = _mm256_fmadd_ps(_mm256_set1_ps(mw), tg[g].sx[b], acc[r][g]);
            }
        }
    }
}

// The 4 token sums of acc (halves added, or the low half alone) into column r
// of y, tokens t0.. < n_tok; the first K chunk stores, the others add.
NM_GQ_INLINE void gq_store(__m256 acc, float *y, int64_t ldy, int64_t r, int64_t t0, int64_t n_tok, int first,
                           int low_only) {
    float v[4];
    const __m128 lo = _mm256_castps256_ps128(acc);
    _mm_storeu_ps(v, low_only ? lo : _mm_add_ps(lo, _mm256_extractf128_ps(acc, 1)));
    for (int i = 0; i < 4 && t0 + i < n_tok; i++) {
        float *p = y + (t0 + i) * ldy + r;
        *p = first ? v[i] : *p + v[i];
    }
}

static inline void gq_zero(float *y, int64_t ldy, int64_t n_rows, int64_t n_tok) {
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t r = 0; r < n_rows; r++) y[t * ldy + r] = 0;
}

NM_GQ_INLINE void gq_legacy(uint32_t type, const void *restrict w, size_t w_stride, int64_t n_rows,
                            const void *restrict xq, size_t x_stride, int64_t n_tok, int64_t K, float *restrict y,
                            int64_t ldy) {
#ifdef NM_X86_VNNI
    // vpdpbusd sums u8 x i8 products in int32 without saturating, so q8_0
    // weights can go as q + 128 with 128 * sum(x) taken off, like q4_0's
    // offset: five fewer sign ops per block than the signed path.
    const int kind = type == NM_TYPE_Q4_1 || type == NM_TYPE_Q5_1 ? GQ_MIN : GQ_OFF;
#else
    const int kind = type == NM_TYPE_Q4_1 || type == NM_TYPE_Q5_1 ? GQ_MIN : type == NM_TYPE_Q8_0 ? GQ_SIGNED : GQ_OFF;
#endif
    const int off = type == NM_TYPE_Q4_0 ? 8 : type == NM_TYPE_Q5_0 ? 16 : type == NM_TYPE_Q8_0 ? 128 : 12;
    const size_t wsz = type == NM_TYPE_Q4_0 ? sizeof(nm_block_q4_0) : type == NM_TYPE_Q4_1 ? sizeof(nm_block_q4_1)
                     : type == NM_TYPE_Q5_0 ? sizeof(nm_block_q5_0) : type == NM_TYPE_Q5_1 ? sizeof(nm_block_q5_1)
                     : type == NM_TYPE_MXFP4 ? sizeof(nm_block_mxfp4) : sizeof(nm_block_q8_0);
    const int64_t nbt = K / NM_QK;
    if (nbt == 0) gq_zero(y, ldy, n_rows, n_tok);
    const uint8_t *wr = w, *x = xq;
    gq_tokgrp tg[2];
    for (int64_t b0 = 0; b0 < nbt; b0 += GQ_CH) {
        const int64_t nb = nbt - b0 < GQ_CH ? nbt - b0 : GQ_CH;
        // rows in blocks of GQ_RB whose chunk of weights stays in L2 while every token group passes over it
        for (int64_t rb = 0; rb < n_rows; rb += GQ_RB)
        for (int64_t t0 = 0; t0 < n_tok; t0 += 8) {
            const int64_t r_end = rb + GQ_RB < n_rows ? rb + GQ_RB : n_rows;
            const int ng = n_tok - t0 > 4 ? 2 : 1;
            const uint8_t *yp[8];
            for (int i = 0; i < 8; i++) // past the end: repeat the last token (computed, not stored)
                yp[i] = x + (size_t)(t0 + i < n_tok ? t0 + i : n_tok - 1) * x_stride;
            for (int g = 0; g < ng; g++) gq_prep(kind, off, yp + 4 * g, b0, nb, &tg[g]);
            __m256 acc[2][2];
            int64_t r = rb;
            for (; r + 2 <= r_end; r += 2) {
                const uint8_t *wt = wr + (size_t)r * w_stride;
                if (ng == 2) gq_tile(type, kind, wsz, wt, w_stride, 2, yp, tg, 2, b0, nb, acc);
                else gq_tile(type, kind, wsz, wt, w_stride, 2, yp, tg, 1, b0, nb, acc);
                for (int i = 0; i < 2; i++)
                    for (int g = 0; g < ng; g++) gq_store(acc[i][g], y, ldy, r + i, t0 + 4 * g, n_tok, b0 == 0, 0);
            }
            if (r < r_end) {
                const uint8_t *wt = wr + (size_t)r * w_stride;
                if (ng == 2) gq_tile(type, kind, wsz, wt, w_stride, 1, yp, tg, 2, b0, nb, acc);
                else gq_tile(type, kind, wsz, wt, w_stride, 1, yp, tg, 1, b0, nb, acc);
                for (int g = 0; g < ng; g++) gq_store(acc[0][g], y, ldy, r, t0 + 4 * g, n_tok, b0 == 0, 0);
            }
        }
    }
}

#define NM_GQ_DEFINE(name, T)                                                                                     \
    void name(const void *restrict w, size_t w_stride, int64_t n_rows, const void *restrict xq, size_t x_stride, \
              int64_t n_tok, int64_t K, float *restrict y, int64_t ldy) {                                        \
        gq_legacy(T, w, w_stride, n_rows, xq, x_stride, n_tok, K, y, ldy);                                        \
    }

#endif
