// 1-D convolutions as products on the f32 GEMM kernels (conv1d.h).
#include "backend/cpu/conv1d.h"

#include <string.h>

#include "backend/cpu/gemm.h"

#define TILE 32 // time steps a chunk computes: two panels of 16

static int64_t up16(int64_t n) { return (n + 15) & ~(int64_t)15; }

static inline float act(float v, float slope) {
    const float a = slope * v;
    return v > a ? v : a;
}

void nm_conv1d_pack(const float *src, int32_t oc, int32_t ic, int32_t k, float *dst) {
    for (int32_t o = 0; o < oc; o++)
        for (int32_t j = 0; j < k; j++)
            for (int32_t i = 0; i < ic; i++)
                dst[((int64_t)o * k + j) * ic + i] = src[((int64_t)o * ic + i) * k + j];
}

static int64_t conv_per_thread(const nm_conv1d *c) { return up16((int64_t)TILE * c->k * c->ic); }

int64_t nm_conv1d_work(const nm_conv1d *c, int threads) { return (threads > 0 ? threads : 1) * conv_per_thread(c); }

typedef struct conv_job {
    const nm_conv1d *c;
    const float *x;
    float *y, *work;
    int64_t n, n_out;
    int32_t pad_l;
    const nm_gemm_panel_kernels *pk;
} conv_job;

// Tile `chunk` (outputs [t0, t0 + 32)) on thread ith.
static void conv_tile(void *arg, int64_t chunk, int ith) {
    const conv_job *J = arg;
    const nm_conv1d *c = J->c;
    const int64_t K = (int64_t)c->k * c->ic, t0 = chunk * TILE, m = J->n_out - t0 < TILE ? J->n_out - t0 : TILE;
    float *w = J->work + ith * conv_per_thread(c);
    if (J->pk) { // the tile's inputs packed into two panels: xp[(j * ic + i) * 16 + l], the second 16 K on
        for (int64_t p = 0; p * 16 < m; p++) {
            float *xp = w + p * 16 * K;
            const int64_t l0 = t0 + p * 16, nl = m - p * 16 < 16 ? m - p * 16 : 16;
            for (int32_t j = 0; j < c->k; j++) {
                const int64_t s0 = l0 + (int64_t)j * c->dil - J->pad_l;
                float *o = xp + (int64_t)j * c->ic * 16;
                if (nl == 16 && s0 >= 0 && s0 + 16 <= J->n) {
                    J->pk->pack16(J->x + s0 * c->ic, c->ic, c->ic, c->in_slope, o);
                    continue;
                }
                for (int32_t i = 0; i < c->ic; i++)
                    for (int64_t l = 0; l < 16; l++) {
                        const int64_t s = s0 + l;
                        o[i * 16 + l] = l < nl && s >= 0 && s < J->n ? act(J->x[s * c->ic + i], c->in_slope) : 0.0f;
                    }
            }
        }
        for (int32_t r = 0; r < c->oc; r += NM_GEMM_XPANEL_ROWS)
            J->pk->gemm(c->w + r * K, K, c->oc - r < NM_GEMM_XPANEL_ROWS ? c->oc - r : NM_GEMM_XPANEL_ROWS, w, m, K,
                        J->y + t0 * c->oc + r, c->oc, c->bias ? c->bias + r : NULL);
        return;
    }
    const size_t bytes = sizeof(float) * (size_t)c->ic; // the tile's rows gathered (im2col)
    for (int64_t t = 0; t < m; t++)
        for (int32_t j = 0; j < c->k; j++) {
            const int64_t s = t0 + t + (int64_t)j * c->dil - J->pad_l;
            float *col = w + t * K + (int64_t)j * c->ic;
            if (s < 0 || s >= J->n) memset(col, 0, bytes);
            else if (c->in_slope == 1.0f) memcpy(col, J->x + s * c->ic, bytes);
            else
                for (int32_t i = 0; i < c->ic; i++) col[i] = act(J->x[s * c->ic + i], c->in_slope);
        }
    nm_gemm_f32_get()(c->w, c->oc, w, m, K, J->y + t0 * c->oc, c->oc, c->bias);
}

int64_t nm_conv1d_run(const nm_conv1d *c, const float *x, int64_t n, int32_t pad_l, int32_t pad_r, float *y,
                      float *work, nm_pool *pool) {
    const int64_t n_out = n + pad_l + pad_r - (int64_t)c->dil * (c->k - 1);
    if (n_out <= 0) return 0;
    conv_job J = {.c = c, .x = x, .y = y, .work = work, .n = n, .n_out = n_out, .pad_l = pad_l, .pk = nm_gemm_panel_get()};
    const int64_t tiles = (n_out + TILE - 1) / TILE;
    if (pool && tiles > 1) nm_pool_run(pool, conv_tile, &J, tiles);
    else
        for (int64_t i = 0; i < tiles; i++) conv_tile(&J, i, 0);
    return n_out;
}

int64_t nm_conv1d_ref(const nm_conv1d *c, const float *x, int64_t n, int32_t pad_l, int32_t pad_r, float *y) {
    const int64_t n_out = n + pad_l + pad_r - (int64_t)c->dil * (c->k - 1);
    for (int64_t t = 0; t < n_out; t++)
        for (int32_t o = 0; o < c->oc; o++) {
            float acc = c->bias ? c->bias[o] : 0.0f;
            for (int32_t j = 0; j < c->k; j++) {
                const int64_t s = t + (int64_t)j * c->dil - pad_l;
                if (s < 0 || s >= n) continue;
                const float *w = c->w + ((int64_t)o * c->k + j) * c->ic, *xs = x + s * c->ic;
                for (int32_t i = 0; i < c->ic; i++) acc += w[i] * act(xs[i], c->in_slope);
            }
            y[t * c->oc + o] = acc;
        }
    return n_out > 0 ? n_out : 0;
}

// ---- transposed -----------------------------------------------------------------------------------

void nm_conv_t1d_pack(const float *src, int32_t ic, int32_t oc, int32_t k, float *dst) {
    for (int32_t j = 0; j < k; j++)
        for (int32_t o = 0; o < oc; o++)
            for (int32_t i = 0; i < ic; i++)
                dst[((int64_t)j * oc + o) * ic + i] = src[((int64_t)i * oc + o) * k + j];
}

// Inputs an output tile (TILE * stride outputs) reaches back to, at most: rounded up to panels.
static int64_t t_inputs(const nm_conv_t1d *c) { return (TILE + c->k / c->stride + 2 + 31) / 32 * 32; }

static int64_t t_per_thread(const nm_conv_t1d *c) {
    return up16(t_inputs(c) * (int64_t)c->k * c->oc) + up16((int64_t)TILE * c->ic);
}

int64_t nm_conv_t1d_work(const nm_conv_t1d *c, int threads) { return (threads > 0 ? threads : 1) * t_per_thread(c); }

typedef struct conv_t_job {
    const nm_conv_t1d *c;
    const float *x;
    float *y, *work;
    int64_t n, n_out;
    const nm_gemm_panel_kernels *pk;
} conv_t_job;

static int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

// Output tile `chunk` ([T0, T1): TILE * stride outputs) from the inputs that reach it.
static void conv_t_tile(void *arg, int64_t chunk, int ith) {
    const conv_t_job *J = arg;
    const nm_conv_t1d *c = J->c;
    const int64_t R = (int64_t)c->k * c->oc, span = (int64_t)TILE * c->stride;
    const int64_t T0 = chunk * span, T1 = T0 + span < J->n_out ? T0 + span : J->n_out;
    int64_t lo = floor_div(T0 + c->pad - c->k, c->stride) + 1, hi = floor_div(T1 - 1 + c->pad, c->stride);
    lo = lo < 0 ? 0 : lo, hi = hi > J->n - 1 ? J->n - 1 : hi;
    float *cols = J->work + ith * t_per_thread(c), *xp = cols + up16(t_inputs(c) * R); // cols[s - lo][j * oc + o]
    for (int64_t s0 = lo; s0 <= hi; s0 += TILE) {
        const int64_t m = hi + 1 - s0 < TILE ? hi + 1 - s0 : TILE;
        float *out = cols + (s0 - lo) * R;
        if (!J->pk) { // (the input rows as they are, or through the activation into xp's room)
            const float *rows = J->x + s0 * c->ic;
            if (c->in_slope != 1.0f) {
                for (int64_t i = 0; i < m * c->ic; i++) xp[i] = act(rows[i], c->in_slope);
                rows = xp;
            }
            nm_gemm_f32_get()(c->w, R, rows, m, c->ic, out, R, NULL);
            continue;
        }
        for (int64_t p = 0; p * 16 < m; p++) {
            const float *rows = J->x + (s0 + p * 16) * c->ic;
            float *o = xp + p * 16 * (int64_t)c->ic;
            const int64_t nl = m - p * 16 < 16 ? m - p * 16 : 16;
            if (nl == 16) {
                J->pk->pack16(rows, c->ic, c->ic, c->in_slope, o);
                continue;
            }
            for (int32_t i = 0; i < c->ic; i++)
                for (int64_t l = 0; l < 16; l++) o[i * 16 + l] = l < nl ? act(rows[l * c->ic + i], c->in_slope) : 0.0f;
        }
        for (int64_t r = 0; r < R; r += NM_GEMM_XPANEL_ROWS)
            J->pk->gemm(c->w + r * c->ic, c->ic, R - r < NM_GEMM_XPANEL_ROWS ? R - r : NM_GEMM_XPANEL_ROWS, xp, m, c->ic,
                        out + r, R, NULL);
    }
    for (int64_t t = T0; t < T1; t++) { // the bias, then the taps that land on t, the inputs in order
        float *yt = J->y + t * c->oc;
        if (c->bias) memcpy(yt, c->bias, sizeof(float) * (size_t)c->oc);
        else memset(yt, 0, sizeof(float) * (size_t)c->oc);
        int64_t s = floor_div(t + c->pad - c->k, c->stride) + 1;
        for (s = s < lo ? lo : s; s <= hi && s * c->stride <= t + c->pad; s++) {
            const int64_t j = t + c->pad - s * c->stride; // (its tap)
            const float *v = cols + (s - lo) * R + j * c->oc;
            for (int32_t o = 0; o < c->oc; o++) yt[o] += v[o];
        }
    }
}

int64_t nm_conv_t1d_run(const nm_conv_t1d *c, const float *x, int64_t n, float *y, float *work, nm_pool *pool) {
    const int64_t n_out = (n - 1) * c->stride - 2 * (int64_t)c->pad + c->k;
    if (n <= 0 || n_out <= 0) return 0;
    conv_t_job J = {.c = c, .x = x, .y = y, .work = work, .n = n, .n_out = n_out, .pk = nm_gemm_panel_get()};
    const int64_t span = (int64_t)TILE * c->stride, tiles = (n_out + span - 1) / span;
    if (pool && tiles > 1) nm_pool_run(pool, conv_t_tile, &J, tiles);
    else
        for (int64_t i = 0; i < tiles; i++) conv_t_tile(&J, i, 0);
    return n_out;
}

int64_t nm_conv_t1d_ref(const nm_conv_t1d *c, const float *x, int64_t n, float *y) {
    const int64_t n_out = (n - 1) * c->stride - 2 * (int64_t)c->pad + c->k;
    for (int64_t t = 0; t < n_out; t++)
        for (int32_t o = 0; o < c->oc; o++) {
            float acc = c->bias ? c->bias[o] : 0.0f;
            for (int64_t s = 0; s < n; s++) {
                const int64_t j = t + c->pad - s * c->stride;
                if (j < 0 || j >= c->k) continue;
                const float *w = c->w + (j * c->oc + o) * c->ic, *xs = x + s * c->ic;
                for (int32_t i = 0; i < c->ic; i++) acc += w[i] * act(xs[i], c->in_slope);
            }
            y[t * c->oc + o] = acc;
        }
    return n_out > 0 ? n_out : 0;
}
