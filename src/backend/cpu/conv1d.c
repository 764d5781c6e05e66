// 1-D convolutions in direct form on the row kernels (conv1d.h).
#include "backend/cpu/conv1d.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu.h"

#define CHUNK 192 // output rows a chunk computes at most (a multiple of NM_CONV_ROWS)

// The f32 kernels' weights are panels of PANEL output channels, each panel's [tap][ic][PANEL] contiguous
// (streamed in order as a block of rows sums them; the row-major [tap][ic][oc] strode oc floats between
// input channels, which the prefetchers did not follow: the encoder's FFN ran at half its rate on cold
// weights), oc rounded up to whole panels with zeros.
#define PANEL 32
static int32_t ocp_of(int32_t oc) { return (oc + PANEL - 1) / PANEL * PANEL; }
static int64_t up_rows(int64_t n) { return (n + NM_CONV_ROWS - 1) / NM_CONV_ROWS * NM_CONV_ROWS; }
static int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

static inline float act(float v, float slope) {
    const float a = slope * v;
    return v > a ? v : a;
}

static bool env_on(const char *name) {
    const char *v = getenv(name);
    return v && !strcmp(v, "1");
}

bool nm_conv_amx_for(int32_t ic, int32_t oc, int32_t k) {
#ifdef NM_HAVE_AMX
    const nm_cpu_features *cpu = nm_cpu_features_get();
    return cpu->amx_bf16 && cpu->avx512bf16 && k > 1 && ic % 32 == 0 && oc % 16 == 0 && !env_on("NM_NO_AMX") &&
           !env_on("NM_NO_AVX512") && !env_on("NM_FORCE_REF") && nm_cpu_amx_granted();
#else
    (void)ic, (void)oc, (void)k;
    return false;
#endif
}

// Winograd's tiles: n points (the first n - 1 of these, then infinity), m = n - k + 1 outputs. The order
// (0, then pairs +a, -a) is what the AVX-512 transforms rest on (x86_conv512.c).
#define WINO_N NM_WINO_N
static const double wino_pts[WINO_N - 1] = {0, 1, -1, 2, -2, 0.5, -0.5, 1.5, -1.5};

int32_t nm_conv1d_wino_tile(int32_t k, int32_t points) {
    return (points == 6 || points == 8 || points == 10) && k >= 2 && k <= points - 2 ? points - k + 1 : 0;
}

int32_t nm_conv1d_wino_m(const nm_conv1d *c) {
    if (c->ic < 16 || c->oc < 16 || env_on("NM_NO_WINOGRAD") || nm_conv_amx_for(c->ic, c->oc, c->k)) return 0;
    return nm_conv1d_wino_tile(c->k, c->winograd);
}

int64_t nm_conv1d_packed_size(const nm_conv1d *c) {
    const int32_t m = nm_conv1d_wino_m(c), n = m + c->k - 1;
    return m ? (int64_t)n * c->ic * ocp_of(c->oc) + m * n + n * n : (int64_t)c->k * c->ic * ocp_of(c->oc);
}
static nm_conv1d stacked(const nm_conv_t1d *c);
int64_t nm_conv_t1d_packed_size(const nm_conv_t1d *c) {
    if (nm_conv_t1d_wino_m(c)) {
        nm_conv1d sc = stacked(c);
        return nm_conv1d_packed_size(&sc);
    }
    return (int64_t)c->k * c->ic * ocp_of(c->oc);
}

// Toom-Cook's F(m, r) on the points wino_pts[0 .. n - 2] and infinity, n = m + r - 1: the correlation
// y_s = sum_q g_q d_{s+q} (s < m) is y = AT [(G g) .* (BT d)], with V the n x n evaluation matrix (row
// j: a_j^0 .. a_j^(n-1); infinity's: the leading coefficient), AT = Vm^T, G = Vr (V's first m, r
// columns, infinity's row picking the last) and BT = V^-T. Each row of BT is scaled to a largest |entry|
// of 1 and G's row by the same factor, so the factors fold into the weights (in double).
static void wino_mats(int32_t m, int32_t r, double *at, double *g, double *bt) {
    const int32_t n = m + r - 1;
    double a[WINO_N][2 * WINO_N];
    for (int32_t j = 0; j < n; j++)
        for (int32_t e = 0; e < 2 * n; e++) {
            double v = e >= n ? (e - n == j) : j == n - 1 ? (e == n - 1) : 1.0;
            if (e < n && j < n - 1)
                for (int32_t q = 0; q < e; q++) v *= wino_pts[j];
            a[j][e] = v;
        }
    for (int32_t col = 0; col < n; col++) { // Gauss-Jordan, partial pivoting: a = [V | I] -> [I | V^-1]
        int32_t piv = col;
        for (int32_t j = col + 1; j < n; j++)
            if (fabs(a[j][col]) > fabs(a[piv][col])) piv = j;
        for (int32_t e = 0; e < 2 * n; e++) {
            const double t = a[col][e];
            a[col][e] = a[piv][e], a[piv][e] = t;
        }
        const double d = a[col][col];
        for (int32_t e = 0; e < 2 * n; e++) a[col][e] /= d;
        for (int32_t j = 0; j < n; j++)
            if (j != col) {
                const double f = a[j][col];
                for (int32_t e = 0; e < 2 * n; e++) a[j][e] -= f * a[col][e];
            }
    }
    for (int32_t p = 0; p < n; p++) {
        double big = 0;
        for (int32_t j = 0; j < n; j++) {
            bt[p * n + j] = a[j][n + p]; // (V^-T)
            big = fabs(bt[p * n + j]) > big ? fabs(bt[p * n + j]) : big;
        }
        for (int32_t j = 0; j < n; j++) bt[p * n + j] /= big;
        for (int32_t q = 0; q < r; q++) {
            double v = p == n - 1 ? (q == r - 1) : 1.0;
            if (p < n - 1)
                for (int32_t e = 0; e < q; e++) v *= wino_pts[p];
            g[p * r + q] = v * big;
        }
        for (int32_t s2 = 0; s2 < m; s2++) {
            double v = p == n - 1 ? (s2 == m - 1) : 1.0;
            if (p < n - 1)
                for (int32_t e = 0; e < s2; e++) v *= wino_pts[p];
            at[s2 * n + p] = v;
        }
    }
}

// BF16 of v rounded to nearest even (v finite), and v's split hi + lo.
static uint16_t bf16(float v) {
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
static float from_bf16(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

// Tap j's weight W_j[i][o] = src at (i, o, j) (the strides of PyTorch's layout) into the f32 kernel's
// [k][ic][ocp], or the AMX tiles: per tap, per 16 output channels, per 32 input channels, the hi tile then
// the lo tile, each 16 rows of pairs: row kk, column 2 n + e holds channel (32 ib + 2 kk + e, 16 nb + n).
static void pack(const float *src, int64_t si, int64_t so, int64_t sj, int32_t ic, int32_t oc, int32_t k, bool amx,
                 float *dst) {
    if (!amx) {
        const int32_t ocp = ocp_of(oc);
        for (int32_t o = 0; o < ocp; o++)
            for (int32_t j = 0; j < k; j++)
                for (int32_t i = 0; i < ic; i++)
                    dst[(((int64_t)(o / PANEL) * k + j) * ic + i) * PANEL + o % PANEL] =
                        o < oc ? src[i * si + o * so + j * sj] : 0.0f;
        return;
    }
    uint16_t *t = (uint16_t *)(void *)dst;
    for (int32_t j = 0; j < k; j++)
        for (int32_t nb = 0; nb < oc / 16; nb++)
            for (int32_t ib = 0; ib < ic / 32; ib++)
                for (int32_t kk = 0; kk < 16; kk++)
                    for (int32_t n = 0; n < 16; n++)
                        for (int32_t e = 0; e < 2; e++) {
                            const float v = src[(32 * ib + 2 * kk + e) * si + (16 * nb + n) * so + j * sj];
                            const uint16_t hi = bf16(v), lo = bf16(v - from_bf16(hi));
                            uint16_t *tile = t + ((((int64_t)j * (oc / 16) + nb) * (ic / 32) + ib) * 2) * 512;
                            tile[kk * 32 + 2 * n + e] = hi, tile[512 + kk * 32 + 2 * n + e] = lo;
                        }
}

// Winograd's weights U_p[i][o] = sum_q G[p][q] W[o][i][q] as [n][ocp / PANEL][ic][PANEL], then A^T and B^T
// as floats.
// A weight as pack_wino reads it: W[o][i][j] = p[i si + o so + j sj]; a transposed convolution's stacked
// taps where stride > 0 (tconv_oc its channels): output o = r tconv_oc + oo, tap j the transposed
// convolution's r + (q - 1 - j) stride, zero past its k.
typedef struct wsrc {
    const float *p;
    int64_t si, so, sj;
    int32_t stride, tconv_oc, tconv_k, q;
} wsrc;
static float wsrc_at(const wsrc *s, int32_t i, int32_t o, int32_t j) {
    if (!s->stride) return s->p[i * s->si + o * s->so + j * s->sj];
    const int32_t tap = o / s->tconv_oc + (s->q - 1 - j) * s->stride;
    return tap < s->tconv_k ? s->p[i * s->si + (o % s->tconv_oc) * s->so + tap * s->sj] : 0.0f;
}

static void pack_wino(const wsrc *src, int32_t ic, int32_t oc, int32_t k, int32_t m, float *dst) {
    const int32_t n = m + k - 1, ocp = ocp_of(oc);
    double at[WINO_N * WINO_N], g[WINO_N * WINO_N], bt[WINO_N * WINO_N]; // (g: n x k, k <= n - 2)
    wino_mats(m, k, at, g, bt);
    for (int32_t p = 0; p < n; p++) // ([p][panel][ic][PANEL])
        for (int32_t i = 0; i < ic; i++)
            for (int32_t o = 0; o < ocp; o++) {
                double u = 0;
                for (int32_t q = 0; o < oc && q < k; q++) u += g[p * k + q] * wsrc_at(src, i, o, q);
                dst[(((int64_t)p * ocp + (o / PANEL) * PANEL) * ic + (int64_t)i * PANEL) + o % PANEL] = (float)u;
            }
    float *tail = dst + (int64_t)n * ic * ocp;
    for (int32_t e = 0; e < m * n; e++) tail[e] = (float)at[e];
    for (int32_t e = 0; e < n * n; e++) tail[m * n + e] = (float)bt[e];
}

void nm_conv1d_pack(nm_conv1d *c, const float *src, float *dst) {
    const bool amx = nm_conv_amx_for(c->ic, c->oc, c->k);
    c->wm = nm_conv1d_wino_m(c);
    if (c->wm) pack_wino(&(wsrc){.p = src, .si = c->k, .so = (int64_t)c->ic * c->k, .sj = 1}, c->ic, c->oc, c->k, c->wm, dst);
    else pack(src, c->k, (int64_t)c->ic * c->k, 1, c->ic, c->oc, c->k, amx, dst); // src [oc][ic][k]
    c->w = amx ? NULL : dst;
    c->wx = amx ? (const uint16_t *)(const void *)dst : NULL;
}

// The stacked convolution of a transposed one (nm_conv_t1d's comment), its weights c's.
static int32_t t_q(const nm_conv_t1d *c) { return (c->k + c->stride - 1) / c->stride; }
static nm_conv1d stacked(const nm_conv_t1d *c) {
    return (nm_conv1d){.w = c->w, .ic = c->ic, .oc = c->stride * c->oc, .k = t_q(c), .dil = 1, .in_slope = c->in_slope,
                       .winograd = c->winograd, .wm = c->wm};
}

// Stacked only where its Winograd weights stay small (T_STACK_MAX floats): they are n / Q times the
// phases' and read once per chunk of inputs, and an upsampling at the frame rate (HiFi-GAN's first:
// 256 -> 1024 stacked channels, 10.5 MB, ~30 tiles a sentence) streamed them for little work: 30 -> 76
// ms of 88 s of speech, where its last (64 -> 128, 0.3 MB, 16000 rows) went 66 -> 54 ms.
#define T_STACK_MAX (1 << 18)
int32_t nm_conv_t1d_wino_m(const nm_conv_t1d *c) {
    if (c->stride < 1 || t_q(c) < 2 || nm_conv_amx_for(c->ic, c->oc, c->k)) return 0;
    const nm_conv1d sc = stacked(c);
    const int32_t m = nm_conv1d_wino_m(&sc);
    return m && nm_conv1d_packed_size(&sc) <= T_STACK_MAX ? m : 0;
}

void nm_conv_t1d_pack(nm_conv_t1d *c, const float *src, float *dst) {
    const bool amx = nm_conv_amx_for(c->ic, c->oc, c->k);
    c->wm = nm_conv_t1d_wino_m(c);
    if (c->wm) { // src [ic][oc][k]
        const wsrc ws = {.p = src, .si = (int64_t)c->oc * c->k, .so = c->k, .sj = 1, .stride = c->stride,
                         .tconv_oc = c->oc, .tconv_k = c->k, .q = t_q(c)};
        pack_wino(&ws, c->ic, c->stride * c->oc, t_q(c), c->wm, dst);
    } else
        pack(src, (int64_t)c->oc * c->k, c->k, 1, c->ic, c->oc, c->k, amx, dst);
    c->w = amx ? NULL : dst;
    c->wx = amx ? (const uint16_t *)(const void *)dst : NULL;
}

// The reference kernel, also the one where there is no SIMD one: 4 rows against 16 channels at a time
// (the channel loop is what a compiler vectorizes), each sum in the kernel's order.
void nm_conv_rows_ref(const float *restrict x, int64_t xstep, const float *restrict w, int64_t wstep, int32_t ntaps,
                      int32_t ic, int32_t oc, int64_t ldw, const float *restrict bias, int64_t rows,
                      const nm_conv_add *add, float *y, int64_t ldy) {
    const int64_t ocp = ldw;
    for (int64_t r0 = 0; r0 < rows; r0 += 4)
        for (int32_t o0 = 0; o0 < oc; o0 += 16) {
            float acc[4][16];
            for (int r = 0; r < 4; r++)
                for (int o = 0; o < 16; o++) acc[r][o] = bias && o0 + o < oc ? bias[o0 + o] : 0.0f;
            const int nr = rows - r0 < 4 ? (int)(rows - r0) : 4;
            for (int32_t q = 0; q < ntaps; q++) {
                const float *wq = w + q * wstep + o0, *xq = x + (r0 + q * xstep) * ic;
                for (int32_t i = 0; i < ic; i++)
                    for (int r = 0; r < nr; r++) {
                        const float xv = xq[r * ic + i];
                        for (int o = 0; o < 16; o++) acc[r][o] += wq[(int64_t)i * ocp + o] * xv;
                    }
            }
            for (int r = 0; r < nr; r++)
                for (int o = 0; o < 16 && o0 + o < oc; o++) {
                    const int64_t at = (r0 + r) * ldy + o0 + o;
                    float v = acc[r][o];
                    if (add && add->a) v += add->a[at];
                    if (add && add->b) v += add->b[at];
                    y[at] = add ? v * add->scale : v;
                }
        }
}

void nm_wino_in_ref(const float *const *xr, int32_t n, int32_t ic, float slope, const float *bt, float *v,
                    int64_t vstep) {
    for (int32_t p = 0; p < n; p++)
        for (int32_t i = 0; i < ic; i++) {
            float acc = 0.0f;
            for (int32_t j = 0; j < n; j++)
                if (bt[p * n + j] != 0.0f) acc += bt[p * n + j] * act(xr[j][i], slope);
            v[p * vstep + i] = acc;
        }
}

void nm_wino_out_ref(const float *mt, int64_t mstep, int32_t n, int32_t s0, int32_t s1, int32_t oc, const float *at,
                     const float *bias, const nm_conv_add *add, float *y, int64_t ystep) {
    for (int32_t s = s0; s < s1; s++)
        for (int32_t o = 0; o < oc; o++) {
            float acc = bias ? bias[o] : 0.0f;
            for (int32_t p = 0; p < n; p++)
                if (at[s * n + p] != 0.0f) acc += at[s * n + p] * mt[p * mstep + o];
            const int64_t e = (s - s0) * ystep + o;
            if (add && add->a) acc += add->a[e];
            if (add && add->b) acc += add->b[e];
            y[e] = add ? acc * add->scale : acc;
        }
}

// Whether this CPU's AVX-512 kernels run (AVX-512F; not NM_NO_AVX512=1 / NM_FORCE_REF=1): the row
// kernel's and Winograd's transforms'; else the reference's.
static bool simd512(void) {
    if (env_on("NM_FORCE_REF") || env_on("NM_NO_AVX512")) return false;
#ifdef NM_HAVE_X86_SIMD
    return nm_cpu_features_get()->avx512f;
#else
    return false;
#endif
}

#ifndef NM_HAVE_X86_SIMD // (never called: simd512() is false)
#define nm_conv_rows_avx512 nm_conv_rows_ref
#define nm_wino_in_avx512 nm_wino_in_ref
#define nm_wino_out_avx512 nm_wino_out_ref
#endif
nm_conv_rows_fn nm_conv_rows_get(void) { return simd512() ? nm_conv_rows_avx512 : nm_conv_rows_ref; }
static nm_wino_in_fn wino_in_get(void) { return simd512() ? nm_wino_in_avx512 : nm_wino_in_ref; }
static nm_wino_out_fn wino_out_get(void) { return simd512() ? nm_wino_out_avx512 : nm_wino_out_ref; }

// Input rows [s0, s0 + m) of x (n rows of ic) through the activation into win, zeros outside [0, n).
static void window(const float *x, int64_t n, int32_t ic, float slope, int64_t s0, int64_t m, float *win) {
    for (int64_t s = s0; s < s0 + m; s++) {
        float *o = win + (s - s0) * ic;
        if (s < 0 || s >= n) memset(o, 0, sizeof(float) * (size_t)ic);
        else if (slope == 1.0f) memcpy(o, x + s * ic, sizeof(float) * (size_t)ic);
        else
            for (int32_t i = 0; i < ic; i++) o[i] = act(x[s * ic + i], slope);
    }
}

// A convolution's taps as the kernels take them.
typedef struct taps {
    int64_t xstep, wstep; // rows, and weights (floats, or BF16 halves: a hi and a lo each) between taps
    int64_t pstep;        // f32: weights between panels
    int32_t ntaps, ic, oc;
    const float *w, *bias;
    const uint16_t *wx;
} taps;

// Input rows [s0, s0 + span) as the kernel reads them: in place (f32, no activation, inside [0, n)), or
// through window() into win, or (AMX) split into win's two halves.
typedef struct rows_in {
    const float *x; // (f32)
    const uint16_t *xh, *xl;
    int32_t ic;
} rows_in;

static rows_in prepare(const taps *t, const float *x, int64_t n, float slope, int64_t s0, int64_t span, float *win) {
    rows_in in = {.ic = t->ic};
#ifdef NM_HAVE_AMX
    if (t->wx) { // (the window's floats hold the two BF16 halves: xh, then xl)
        uint16_t *xh = (uint16_t *)(void *)win, *xl = xh + span * t->ic;
        nm_conv_split_avx512(x, n, t->ic, slope, s0, span, xh, xl);
        in.xh = xh, in.xl = xl;
        return in;
    }
#endif
    in.x = x + s0 * t->ic;
    if (slope != 1.0f || s0 < 0 || s0 + span > n) {
        window(x, n, t->ic, slope, s0, span, win);
        in.x = win;
    }
    return in;
}

// The f32 kernel on the oc output channels of the panels from w on (pstep floats apart), a call each.
static void kern_panels(nm_conv_rows_fn kern, const float *x, int64_t xstep, const float *w, int64_t wstep,
                        int64_t pstep, int32_t ntaps, int32_t ic, int32_t oc, const float *bias, int64_t rows,
                        const nm_conv_add *add, float *y, int64_t ldy) {
    for (int32_t o = 0; o < oc; o += PANEL) {
        nm_conv_add a;
        if (add) a = (nm_conv_add){.a = add->a ? add->a + o : NULL, .b = add->b ? add->b + o : NULL, .scale = add->scale};
        kern(x, xstep, w + (int64_t)(o / PANEL) * pstep, wstep, ntaps, ic, oc - o < PANEL ? oc - o : PANEL, PANEL,
             bias ? bias + o : NULL, rows, add ? &a : NULL, y + o, ldy);
    }
}

// The kernel on `rows` output rows from prepared row `row0` on.
static void run_rows(const taps *t, const rows_in *in, int64_t row0, nm_conv_rows_fn kern, int64_t rows,
                     const nm_conv_add *add, float *y, int64_t ldy) {
#ifdef NM_HAVE_AMX
    if (t->wx) {
        nm_conv_rows_amx(in->xh + row0 * in->ic, in->xl + row0 * in->ic, t->xstep, t->wx, t->wstep, t->ntaps, t->ic,
                         t->oc, t->bias, rows, add, y, ldy);
        return;
    }
#endif
    kern_panels(kern, in->x + row0 * in->ic, t->xstep, t->w, t->wstep, t->pstep, t->ntaps, t->ic, t->oc, t->bias, rows,
                add, y, ldy);
}

// How a convolution's outputs are cut into the pool's chunks: rows (any count works: a chunk's window
// covers the rows its kernel reads past it; multiples of the kernel's block, AMX's 16-row tile or the
// f32 kernel's 12 rows, so no chunk computes rows it throws away) and, on a short sequence (fewer than
// two chunks of CHUNK rows a thread), parts of the output channels as well (multiples of the block's
// 16 or 32 channels), so that the threads get even shares and each weight is read by one chunk rather
// than by every chunk of rows (the encoder's FFN: 1.8 MB of weights against ~100 rows of 192 inputs;
// its f32 rate on a sentence went from ~180 to ~300 GFLOP/s on two threads, bench_conv_shapes).
typedef struct cut {
    int64_t rows, row_chunks;
    int32_t parts, part_w; // output channels: parts of part_w (a multiple of 16; the last may be fewer)
} cut;

static int64_t up_to(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

static cut cut_of(int64_t n_out, int32_t oc, bool amx, nm_pool *pool) {
    const int64_t want = 2 * (pool ? nm_pool_size(pool) : 1), block = amx ? 16 : 12, unit = amx ? 16 : 32;
    cut k = {.parts = 1, .part_w = oc};
    if ((n_out + CHUNK - 1) / CHUNK < want && oc > unit) {
        k.row_chunks = (n_out + CHUNK - 1) / CHUNK;
        k.rows = up_to((n_out + k.row_chunks - 1) / k.row_chunks, block);
        const int64_t parts = (want + k.row_chunks - 1) / k.row_chunks;
        k.part_w = (int32_t)up_to((oc + parts - 1) / parts, unit);
        k.parts = (oc + k.part_w - 1) / k.part_w;
    } else {
        k.rows = up_to((n_out + want - 1) / want, block);
        k.rows = k.rows > CHUNK ? CHUNK : k.rows;
    }
    k.row_chunks = (n_out + k.rows - 1) / k.rows;
    return k;
}

// t narrowed to the output channels [o0, o0 + w) (AMX's tiles: a column of them is contiguous per tap).
static taps narrow(taps t, int32_t o0, int32_t w) {
    if (t.wx) t.wx += (int64_t)(o0 / 16) * (t.ic / 32) * 1024;
    if (t.w) t.w += (int64_t)(o0 / PANEL) * t.pstep; // (f32: the part's panels, o0 a multiple of PANEL)
    if (t.bias) t.bias += o0;
    t.oc = w;
    return t;
}

// ---- ordinary -------------------------------------------------------------------------------------

static int64_t conv_reach(const nm_conv1d *c) { return (int64_t)c->dil * (c->k - 1); }
// Winograd: a group of m * dil outputs is dil interleaved tiles; a chunk takes up to WINO_TILES tiles (its
// transformed inputs, n rows of ic each, and products, n of ocp, in the thread's work).
#define WINO_TILES 48
static int64_t wino_groups_max(const nm_conv1d *c) { return c->dil < WINO_TILES ? WINO_TILES / c->dil : 1; }
static int64_t wino_tcp(const nm_conv1d *c) { return up_rows(wino_groups_max(c) * c->dil); }
static int64_t conv_per_thread(const nm_conv1d *c) {
    if (c->wm) return (int64_t)(c->wm + c->k - 1) * wino_tcp(c) * (c->ic + ocp_of(c->oc)) + up_to(c->ic, 16);
    return (CHUNK + NM_CONV_ROWS + conv_reach(c)) * c->ic;
}
int64_t nm_conv1d_work(const nm_conv1d *c, int threads) { return (threads > 0 ? threads : 1) * conv_per_thread(c); }

typedef struct conv_job {
    const nm_conv1d *c;
    taps t;
    const float *x;
    const nm_conv_add *add; // (its a and b at the outputs' offsets: y's)
    float *y, *work;
    int64_t n, n_out, org;
    cut k;
    int32_t pad_l;
    nm_conv_rows_fn kern;
    nm_wino_in_fn win; // (Winograd's)
    nm_wino_out_fn wout;
} conv_job;

static void conv_chunk(void *arg, int64_t chunk, int ith) {
    const conv_job *J = arg;
    const nm_conv1d *c = J->c;
    const int64_t t0 = chunk / J->k.parts * J->k.rows, m = J->n_out - t0 < J->k.rows ? J->n_out - t0 : J->k.rows;
    const int32_t o0 = (int32_t)(chunk % J->k.parts) * J->k.part_w, w = c->oc - o0 < J->k.part_w ? c->oc - o0 : J->k.part_w;
    const int64_t s0 = t0 - J->pad_l, span = up_rows(m) + conv_reach(c); // the input rows the kernel reads
    const rows_in in = prepare(&J->t, J->x, J->n, c->in_slope, s0, span, J->work + ith * conv_per_thread(c));
    const int64_t at = t0 * c->oc + o0; // (the chunk's first output)
    nm_conv_add add;
    if (J->add)
        add = (nm_conv_add){.a = J->add->a ? J->add->a + at : NULL, .b = J->add->b ? J->add->b + at : NULL,
                            .scale = J->add->scale};
    const taps t = narrow(J->t, o0, w);
    run_rows(&t, &in, 0, J->kern, m, J->add ? &add : NULL, J->y + at, c->oc);
}

// Winograd's groups of tiles: those of the whole sequence's (multiples of m dil from its first row) that
// y's rows [org, org + n_out) of it meet, the first at *first.
static int64_t wino_groups(const nm_conv1d *c, int64_t n_out, int64_t org, int64_t *first) {
    const int64_t md = (int64_t)c->wm * c->dil;
    *first = floor_div(org, md);
    return floor_div(org + n_out - 1, md) - *first + 1;
}

// Winograd's chunk: groups [g0, g0 + rows) of tiles, output channels [o0, o0 + w): the tiles' inputs
// transformed into V (n rows of TCP x ic), n products into M (n rows of TCP x ocp), transformed back into y.
static void wino_chunk(void *arg, int64_t chunk, int ith) {
    const conv_job *J = arg;
    const nm_conv1d *c = J->c;
    const int32_t m = c->wm, n = m + c->k - 1, d = c->dil, ocp = ocp_of(c->oc);
    int64_t G0;
    const int64_t groups = wino_groups(c, J->n_out, J->org, &G0), g0 = chunk / J->k.parts * J->k.rows;
    const int64_t tiles = (groups - g0 < J->k.rows ? groups - g0 : J->k.rows) * d, tcp = wino_tcp(c);
    const int32_t o0 = (int32_t)(chunk % J->k.parts) * J->k.part_w, w = c->oc - o0 < J->k.part_w ? c->oc - o0 : J->k.part_w;
    float *V = J->work + ith * conv_per_thread(c), *M = V + (int64_t)n * tcp * c->ic;
    float *zero = M + (int64_t)n * tcp * ocp; // (a row of zeros: the inputs outside x)
    memset(zero, 0, sizeof(float) * (size_t)c->ic);
    const float *at = c->w + (int64_t)n * c->ic * ocp, *bt = at + m * n;
    // (a tile's first output t: a row of y, before it or past it at the ends)
#define TILE_T(u) ((G0 + g0 + (u) / d) * m * d + (u) % d - J->org)
    for (int64_t u = 0; u < tiles; u++) { // (a part of the channels transforms its tiles' inputs again)
        const int64_t s = TILE_T(u) - J->pad_l;
        if (u % d == 0) { // (the input rows the next group reads first, m dil of them past this group's)
            const int64_t r0 = s + (int64_t)n * d > 0 ? s + (int64_t)n * d : 0;
            const int64_t r1 = s + (int64_t)(n + m) * d < J->n ? s + (int64_t)(n + m) * d : J->n;
            for (const float *p = J->x + r0 * c->ic, *e = J->x + r1 * c->ic; p < e; p += 16) __builtin_prefetch(p);
        }
        const float *xr[WINO_N];
        for (int32_t j = 0; j < n; j++) {
            const int64_t row = s + (int64_t)j * d;
            xr[j] = row >= 0 && row < J->n ? J->x + row * c->ic : zero;
        }
        J->win(xr, n, c->ic, c->in_slope, bt, V + u * c->ic, tcp * c->ic);
    }
    for (int32_t p = 0; p < n; p++) { // ([p][panel][ic][PANEL]: a part's panels from o0 / PANEL)
        // (the rows the row kernels may read past the tiles, up to NM_CONV_ROWS: zeros, not stale values)
        memset(V + (p * tcp + tiles) * c->ic, 0, sizeof(float) * (size_t)((up_rows(tiles) - tiles) * c->ic));
        kern_panels(J->kern, V + p * tcp * c->ic, 0, c->w + ((int64_t)p * ocp + o0) * c->ic, 0,
                    (int64_t)PANEL * c->ic, 1, c->ic, w, NULL, tiles, NULL, M + p * tcp * ocp + o0, ocp);
    }
    for (int64_t u = 0; u < tiles; u++) { // outputs t + s d, s in [s0, s1), inside y
        if (u % d == 0 && u + d < tiles) { // (the next group's rows: added ones read, y's written, dilated)
            const int64_t tn = TILE_T(u + d), r0 = tn > 0 ? tn : 0;
            const int64_t r1 = tn + (int64_t)m * d < J->n_out ? tn + (int64_t)m * d : J->n_out;
            const float *a = J->add ? J->add->a : NULL, *b = J->add ? J->add->b : NULL;
            for (int64_t r = r0; r < r1; r++)
                for (int32_t o = 0; o < w; o += 16) {
                    const int64_t e = r * c->oc + o0 + o;
                    if (a) __builtin_prefetch(a + e);
                    if (b) __builtin_prefetch(b + e);
                    __builtin_prefetch(J->y + e, 1);
                }
        }
        const int64_t t = TILE_T(u), s0 = t < 0 ? (-t + d - 1) / d : 0, last = floor_div(J->n_out - 1 - t, d);
        const int64_t s1 = last + 1 < m ? last + 1 : m;
        if (s1 <= s0) continue;
        const int64_t at0 = (t + s0 * d) * c->oc + o0;
        nm_conv_add add;
        if (J->add)
            add = (nm_conv_add){.a = J->add->a ? J->add->a + at0 : NULL, .b = J->add->b ? J->add->b + at0 : NULL,
                                .scale = J->add->scale};
        J->wout(M + u * ocp + o0, tcp * ocp, n, (int32_t)s0, (int32_t)s1, w, at, c->bias ? c->bias + o0 : NULL,
                J->add ? &add : NULL, J->y + at0, (int64_t)d * c->oc);
    }
#undef TILE_T
}

// Winograd's cut: groups of tiles in place of rows (cut_of's rules: even shares, channel parts of 32
// on short sequences; tiles a multiple of the row kernel's 12 where the dilation divides 12).
static cut wino_cut(const nm_conv1d *c, int64_t n_out, int64_t org, nm_pool *pool) {
    const int64_t want = 2 * (pool ? nm_pool_size(pool) : 1), d = c->dil, gmax = wino_groups_max(c);
    int64_t first;
    const int64_t groups = wino_groups(c, n_out, org, &first);
    cut k = {.parts = 1, .part_w = c->oc};
    if ((groups + gmax - 1) / gmax < want && c->oc > 32) {
        k.row_chunks = (groups + gmax - 1) / gmax;
        k.rows = (groups + k.row_chunks - 1) / k.row_chunks;
        const int64_t parts = (want + k.row_chunks - 1) / k.row_chunks;
        k.part_w = (int32_t)up_to((c->oc + parts - 1) / parts, 32);
        k.parts = (c->oc + k.part_w - 1) / k.part_w;
    } else {
        k.rows = (groups + want - 1) / want;
        if (12 % d == 0) k.rows = up_to(k.rows * d, 12) / d;
        k.rows = k.rows > gmax ? gmax : k.rows;
    }
    k.row_chunks = (groups + k.rows - 1) / k.rows;
    return k;
}

int64_t nm_conv1d_run(const nm_conv1d *c, const float *x, int64_t n, int32_t pad_l, int32_t pad_r, int64_t org,
                      const nm_conv_add *add, float *y, float *work, nm_pool *pool) {
    const int64_t n_out = n + pad_l + pad_r - conv_reach(c);
    if (n_out <= 0) return 0;
    if (c->wm) {
        conv_job J = {.c = c, .x = x, .add = add, .y = y, .work = work, .n = n, .n_out = n_out, .org = org,
                      .k = wino_cut(c, n_out, org, pool), .pad_l = pad_l, .kern = nm_conv_rows_get(),
                      .win = wino_in_get(), .wout = wino_out_get()};
        const int64_t chunks = J.k.row_chunks * J.k.parts;
        if (pool && chunks > 1) nm_pool_run(pool, wino_chunk, &J, chunks);
        else
            for (int64_t i = 0; i < chunks; i++) wino_chunk(&J, i, 0);
        return n_out;
    }
    conv_job J = {.c = c, .x = x, .add = add, .y = y, .work = work, .n = n, .n_out = n_out,
                  .k = cut_of(n_out, c->oc, c->wx != NULL, pool), .pad_l = pad_l, .kern = nm_conv_rows_get()};
    J.t = (taps){.xstep = c->dil, .wstep = c->wx ? (int64_t)c->ic * c->oc * 2 : (int64_t)c->ic * PANEL,
                 .pstep = (int64_t)c->k * c->ic * PANEL,
                 .ntaps = c->k, .ic = c->ic, .oc = c->oc, .w = c->w, .bias = c->bias, .wx = c->wx};
    const int64_t chunks = J.k.row_chunks * J.k.parts;
    if (pool && chunks > 1) nm_pool_run(pool, conv_chunk, &J, chunks);
    else
        for (int64_t i = 0; i < chunks; i++) conv_chunk(&J, i, 0);
    return n_out;
}

int64_t nm_conv1d_ref(const nm_conv1d *c, const float *w, const float *x, int64_t n, int32_t pad_l, int32_t pad_r,
                      float *y) {
    const int64_t n_out = n + pad_l + pad_r - conv_reach(c);
    for (int64_t t = 0; t < n_out; t++)
        for (int32_t o = 0; o < c->oc; o++) {
            float acc = c->bias ? c->bias[o] : 0.0f;
            for (int32_t j = 0; j < c->k; j++) {
                const int64_t s = t + (int64_t)j * c->dil - pad_l;
                if (s < 0 || s >= n) continue;
                for (int32_t i = 0; i < c->ic; i++)
                    acc += w[((int64_t)o * c->ic + i) * c->k + j] * act(x[s * c->ic + i], c->in_slope);
            }
            y[t * c->oc + o] = acc;
        }
    return n_out > 0 ? n_out : 0;
}

// ---- transposed -----------------------------------------------------------------------------------
// Output t = m * stride + r - pad (phase r) sums the taps j = r + q * stride over inputs s = m - q.

static int64_t t_taps(const nm_conv_t1d *c) { return (c->k + c->stride - 1) / c->stride; } // the most a phase has
static int64_t t_per_thread(const nm_conv_t1d *c) { return (CHUNK + 2 * NM_CONV_ROWS + t_taps(c)) * c->ic; }
// Stacked: the stacked bias and an edge row (stride * oc each, whole vectors), then the stacked convolution's.
static int64_t t_row(const nm_conv_t1d *c) { return ((int64_t)c->stride * c->oc + 15) & ~(int64_t)15; }
int64_t nm_conv_t1d_work(const nm_conv_t1d *c, int threads) {
    if (c->wm) {
        const nm_conv1d sc = stacked(c);
        return 2 * t_row(c) + nm_conv1d_work(&sc, threads);
    }
    return (threads > 0 ? threads : 1) * t_per_thread(c);
}

// Stacked: its row m is y's rows m stride - pad .. + stride; the rows [m1, m2) that lie inside y straight
// into y, the others (at y's ends) through a row of the work, their rows inside y copied.
static void t_stacked_run(const nm_conv_t1d *c, const float *x, int64_t n, int64_t org, int64_t n_out, float *y,
                          float *work, nm_pool *pool) {
    const int32_t S = c->stride, Q = t_q(c);
    nm_conv1d sc = stacked(c);
    float *bias = work, *row = work + t_row(c), *w2 = work + 2 * t_row(c);
    if (c->bias)
        for (int32_t r = 0; r < S; r++) memcpy(bias + (int64_t)r * c->oc, c->bias, sizeof(float) * (size_t)c->oc);
    sc.bias = c->bias ? bias : NULL;
    const int64_t m1 = (c->pad + S - 1) / S, m2 = (n_out + c->pad) / S, rows = n + Q - 1;
    // (row m of the stacked convolution from row 0 of a run: pad_l = Q - 1 - m; pad_r for `count` rows)
#define STACKED(m, count, out, p)                                                                                \
    nm_conv1d_run(&sc, x, n, (int32_t)(Q - 1 - (m)), (int32_t)((count) - n - (Q - 1 - (m)) + Q - 1), org + (m), NULL, \
                  out, w2, p)
    if (m2 > m1) STACKED(m1, m2 - m1, y + (m1 * S - c->pad) * c->oc, pool);
    for (int64_t m = 0; m < rows; m++) {
        if (m >= m1 && m < m2) m = m2; // (the inner rows: done)
        if (m >= rows) break;
        const int64_t t0 = m * S - c->pad;
        if (t0 + S <= 0 || t0 >= n_out) continue;
        STACKED(m, 1, row, NULL);
        for (int32_t r = 0; r < S; r++)
            if (t0 + r >= 0 && t0 + r < n_out)
                memcpy(y + (t0 + r) * c->oc, row + (int64_t)r * c->oc, sizeof(float) * (size_t)c->oc);
    }
#undef STACKED
}

typedef struct conv_t_job {
    const nm_conv_t1d *c;
    const float *x;
    float *y, *work;
    int64_t n, n_out, m_lo, m_hi; // m in [m_lo, m_hi]
    cut k;                        // (its rows: m's)
    int64_t tap;                  // weights of one tap
    nm_conv_rows_fn kern;
} conv_t_job;

static void conv_t_chunk(void *arg, int64_t chunk, int ith) {
    const conv_t_job *J = arg;
    const nm_conv_t1d *c = J->c;
    const int64_t m0 = J->m_lo + chunk / J->k.parts * J->k.rows;
    const int64_t m1 = m0 + J->k.rows - 1 < J->m_hi ? m0 + J->k.rows - 1 : J->m_hi;
    const int32_t o0 = (int32_t)(chunk % J->k.parts) * J->k.part_w, w = c->oc - o0 < J->k.part_w ? c->oc - o0 : J->k.part_w;
    const int64_t back = t_taps(c) - 1;
    // the inputs [m0 - back, m0 + up_rows(rows) + NM_CONV_ROWS): a phase's rows start up to a block past m0
    const int64_t span = back + up_rows(m1 - m0 + 1) + NM_CONV_ROWS;
    const taps t0 = {.ic = c->ic, .wx = c->wx};
    const rows_in in = prepare(&t0, J->x, J->n, c->in_slope, m0 - back, span, J->work + ith * t_per_thread(c));
    for (int32_t r = 0; r < c->stride; r++) { // phase r's outputs in range: 0 <= m * stride + r - pad < n_out
        int64_t a = -floor_div(r - c->pad, c->stride), b = floor_div(J->n_out - 1 + c->pad - r, c->stride);
        a = a < m0 ? m0 : a, b = b > m1 ? m1 : b;
        if (a > b) continue;
        const taps t = {.xstep = -1, .wstep = c->stride * J->tap, .ntaps = r < c->k ? (c->k - r + c->stride - 1) / c->stride : 0,
                        .ic = c->ic, .oc = c->oc, .pstep = (int64_t)c->k * c->ic * PANEL,
                        .w = c->w ? c->w + r * J->tap : NULL,
                        .bias = c->bias,
                        .wx = c->wx ? c->wx + r * J->tap : NULL};
        const taps tn = narrow(t, o0, w);
        run_rows(&tn, &in, a - m0 + back, J->kern, b - a + 1, NULL, J->y + (a * c->stride + r - c->pad) * c->oc + o0,
                 (int64_t)c->stride * c->oc);
    }
}

int64_t nm_conv_t1d_run(const nm_conv_t1d *c, const float *x, int64_t n, int64_t org, float *y, float *work,
                        nm_pool *pool) {
    const int64_t n_out = (n - 1) * c->stride - 2 * (int64_t)c->pad + c->k;
    if (n <= 0 || n_out <= 0) return 0;
    if (c->wm) {
        t_stacked_run(c, x, n, org, n_out, y, work, pool);
        return n_out;
    }
    conv_t_job J = {.c = c, .x = x, .y = y, .work = work, .n = n, .n_out = n_out, .kern = nm_conv_rows_get()};
    J.tap = c->wx ? (int64_t)c->ic * c->oc * 2 : (int64_t)c->ic * PANEL; // (f32: within a panel)
    J.m_lo = -floor_div(c->stride - 1 - c->pad, c->stride), J.m_hi = floor_div(n_out - 1 + c->pad, c->stride);
    J.k = cut_of(J.m_hi - J.m_lo + 1, c->oc, c->wx != NULL, pool);
    const int64_t chunks = J.k.row_chunks * J.k.parts;
    if (pool && chunks > 1) nm_pool_run(pool, conv_t_chunk, &J, chunks);
    else
        for (int64_t i = 0; i < chunks; i++) conv_t_chunk(&J, i, 0);
    return n_out;
}

int64_t nm_conv_t1d_ref(const nm_conv_t1d *c, const float *w, const float *x, int64_t n, float *y) {
    const int64_t n_out = (n - 1) * c->stride - 2 * (int64_t)c->pad + c->k;
    for (int64_t t = 0; t < n_out; t++)
        for (int32_t o = 0; o < c->oc; o++) {
            float acc = c->bias ? c->bias[o] : 0.0f;
            for (int64_t s = 0; s < n; s++) {
                const int64_t j = t + c->pad - s * c->stride;
                if (j < 0 || j >= c->k) continue;
                for (int32_t i = 0; i < c->ic; i++)
                    acc += w[((int64_t)i * c->oc + o) * c->k + j] * act(x[s * c->ic + i], c->in_slope);
            }
            y[t * c->oc + o] = acc;
        }
    return n_out > 0 ? n_out : 0;
}
