// AMX kernel of the direct-form convolutions (conv1d.h): per 16 output
// channels, blocks of 48 output rows in three f32 tiles (C0..C2, the bias
// first); for each tap and each 32 input channels the weights' hi and lo
// tiles (B: 16 rows of pairs) are loaded once and each row tile's inputs hi
// and lo (A: 16 rows of 32, read in place with the rows' stride) give three
// TDPBF16PS each: C += Ah Bh, C += Ah Bl, C += Al Bh. Three tiles of sums
// keep three independent chains in flight (a product's latency is several
// times its issue interval). Tiles: C0..C2 0..2, Bh 4, Bl 5, Ah 6, Al 7.
// Compiled with the x86 flags; the pragma adds AMX and AVX-512 to these
// functions, which conv1d.c uses only where cpuid and the OS grant them.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,avx512f,avx512bf16,amx-tile,amx-bf16"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC target("avx512f,avx512bf16,amx-tile,amx-bf16")
#endif

#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "backend/cpu/conv1d.h"

typedef struct tilecfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tilecfg;

// The three products of one row tile t into C_t (the macro: tile numbers are immediates).
#define PRODUCTS(t, ah, al, ldx)                                                                   \
    do {                                                                                           \
        _tile_loadd(6, (ah), (ldx));                                                               \
        _tile_dpbf16ps(t, 6, 4);                                                                   \
        _tile_dpbf16ps(t, 6, 5);                                                                   \
        _tile_loadd(7, (al), (ldx));                                                               \
        _tile_dpbf16ps(t, 7, 4);                                                                   \
    } while (0)

// C_t's sums to rows r0 + 16 t .. of y (those below `rows`), straight from the tile, or through stage
// where the tile is partial or add's terms join them.
#define STORE(t)                                                                                   \
    do {                                                                                           \
        const int64_t rt = r0 + 16 * (t), nr = rows - rt < 16 ? rows - rt : 16;                    \
        if (nr == 16 && plain) _tile_stored(t, y + rt * ldy + o0, ldy * (int64_t)sizeof(float));   \
        else if (nr > 0) {                                                                         \
            _tile_stored(t, stage, 64);                                                            \
            finish(stage, nr, add, rt * ldy + o0, y, ldy);                                         \
        }                                                                                          \
    } while (0)

// nr rows of 16 sums from stage to y + at (row stride ldy), add's terms added and scaled.
static void finish(const float *stage, int64_t nr, const nm_conv_add *add, int64_t at, float *y, int64_t ldy) {
    const __m512 sc = _mm512_set1_ps(add ? add->scale : 1.0f);
    for (int64_t r = 0; r < nr; r++) {
        __m512 v = _mm512_load_ps(stage + 16 * r);
        const int64_t o = at + r * ldy;
        if (add && add->a) v = _mm512_add_ps(v, _mm512_loadu_ps(add->a + o));
        if (add && add->b) v = _mm512_add_ps(v, _mm512_loadu_ps(add->b + o));
        if (add) v = _mm512_mul_ps(v, sc);
        _mm512_storeu_ps(y + o, v);
    }
}

void nm_conv_rows_amx(const uint16_t *restrict xh, const uint16_t *restrict xl, int64_t xstep,
                      const uint16_t *restrict w, int64_t wstep, int32_t ntaps, int32_t ic, int32_t oc,
                      const float *restrict bias, int64_t rows, const nm_conv_add *add, float *y, int64_t ldy) {
    const bool plain = !add || (!add->a && !add->b && add->scale == 1.0f);
    tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) cfg.colsb[i] = 64, cfg.rows[i] = 16;
    _tile_loadconfig(&cfg);
    float btile[16 * 16] __attribute__((aligned(64))), stage[16 * 16] __attribute__((aligned(64)));
    const int64_t ib_n = ic / 32, ldx = (int64_t)ic * (int64_t)sizeof(uint16_t);
    for (int32_t o0 = 0; o0 < oc; o0 += 16) {
        for (int r = 0; r < 16; r++)
            for (int n = 0; n < 16; n++) btile[16 * r + n] = bias ? bias[o0 + n] : 0.0f;
        const uint16_t *wo = w + (int64_t)(o0 / 16) * ib_n * 1024; // this column's tiles of tap 0
        for (int64_t r0 = 0; r0 < rows; r0 += 48) {
            const int nt = rows - r0 >= 48 ? 3 : (int)((rows - r0 + 15) / 16); // (the last group: the tiles it needs)
            _tile_loadd(0, btile, 64);
            if (nt > 1) _tile_loadd(1, btile, 64);
            if (nt > 2) _tile_loadd(2, btile, 64);
            for (int32_t q = 0; q < ntaps; q++) {
                const uint16_t *wq = wo + q * wstep;
                const int64_t x0 = (r0 + q * xstep) * ic;
                for (int64_t ib = 0; ib < ib_n; ib++) {
                    _tile_loadd(4, wq + ib * 1024, 64);
                    _tile_loadd(5, wq + ib * 1024 + 512, 64);
                    const int64_t o = x0 + 32 * ib;
                    PRODUCTS(0, xh + o, xl + o, ldx);
                    if (nt > 1) PRODUCTS(1, xh + o + 16 * ic, xl + o + 16 * ic, ldx);
                    if (nt > 2) PRODUCTS(2, xh + o + 32 * ic, xl + o + 32 * ic, ldx);
                }
            }
            STORE(0);
            if (nt > 1) STORE(1);
            if (nt > 2) STORE(2);
        }
    }
    _tile_release();
}

// v through the activation, split hi = bf16(v), lo = bf16(v - hi) (AVX512-BF16's conversion: round to
// nearest even), 16 at a time.
void nm_conv_split_avx512(const float *restrict x, int64_t n, int32_t ic, float slope, int64_t s0, int64_t m,
                          uint16_t *restrict xh, uint16_t *restrict xl) {
    const __m512 sv = _mm512_set1_ps(slope);
    for (int64_t s = s0; s < s0 + m; s++) {
        uint16_t *oh = xh + (s - s0) * ic, *ol = xl + (s - s0) * ic;
        if (s < 0 || s >= n) {
            memset(oh, 0, sizeof(uint16_t) * (size_t)ic);
            memset(ol, 0, sizeof(uint16_t) * (size_t)ic);
            continue;
        }
        for (int32_t i = 0; i < ic; i += 16) { // (ic: a multiple of 32)
            __m512 v = _mm512_loadu_ps(x + s * ic + i);
            v = _mm512_max_ps(v, _mm512_mul_ps(v, sv));
            const __m256i hi = (__m256i)_mm512_cvtneps_pbh(v);
            const __m512 hf = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16));
            _mm256_storeu_si256((__m256i *)(void *)(oh + i), hi);
            _mm256_storeu_si256((__m256i *)(void *)(ol + i), (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(v, hf)));
        }
    }
}

#if defined(__clang__)
#pragma clang attribute pop
#endif
