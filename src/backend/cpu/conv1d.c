// 1-D convolutions in direct form on the row kernel (conv1d.h).
#include "backend/cpu/conv1d.h"

#include <stdlib.h>
#include <string.h>

#include "core/cpu.h"

#define CHUNK 96 // output rows a chunk computes at most (a multiple of NM_CONV_ROWS)

static int32_t ocp_of(int32_t oc) { return (oc + 15) & ~15; }
static int64_t up_rows(int64_t n) { return (n + NM_CONV_ROWS - 1) / NM_CONV_ROWS * NM_CONV_ROWS; }
static int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

static inline float act(float v, float slope) {
    const float a = slope * v;
    return v > a ? v : a;
}

int64_t nm_conv1d_packed_size(int32_t oc, int32_t ic, int32_t k) { return (int64_t)k * ic * ocp_of(oc); }

void nm_conv1d_pack(const float *src, int32_t oc, int32_t ic, int32_t k, float *dst) {
    const int32_t ocp = ocp_of(oc);
    for (int32_t j = 0; j < k; j++)
        for (int32_t i = 0; i < ic; i++)
            for (int32_t o = 0; o < ocp; o++)
                dst[((int64_t)j * ic + i) * ocp + o] = o < oc ? src[((int64_t)o * ic + i) * k + j] : 0.0f;
}

void nm_conv_t1d_pack(const float *src, int32_t ic, int32_t oc, int32_t k, float *dst) {
    const int32_t ocp = ocp_of(oc);
    for (int32_t j = 0; j < k; j++)
        for (int32_t i = 0; i < ic; i++)
            for (int32_t o = 0; o < ocp; o++)
                dst[((int64_t)j * ic + i) * ocp + o] = o < oc ? src[((int64_t)i * oc + o) * k + j] : 0.0f;
}

// The reference kernel, also the one where there is no SIMD one: 4 rows against 16 channels at a time
// (the channel loop is what a compiler vectorizes), each sum in the kernel's order.
void nm_conv_rows_ref(const float *restrict x, int64_t xstep, const float *restrict w, int64_t wstep, int32_t ntaps,
                      int32_t ic, int32_t oc, const float *restrict bias, int64_t rows, float *restrict y, int64_t ldy) {
    const int32_t ocp = ocp_of(oc);
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
                for (int o = 0; o < 16 && o0 + o < oc; o++) y[(r0 + r) * ldy + o0 + o] = acc[r][o];
        }
}

nm_conv_rows_fn nm_conv_rows_get(void) {
    const char *force = getenv("NM_FORCE_REF"), *no512 = getenv("NM_NO_AVX512");
    if ((force && !strcmp(force, "1")) || (no512 && !strcmp(no512, "1"))) return nm_conv_rows_ref;
#ifdef NM_HAVE_X86_SIMD
    const nm_cpu_features *cpu = nm_cpu_features_get();
    if (cpu->avx512f) return nm_conv_rows_avx512;
#endif
    return nm_conv_rows_ref;
}

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

// Output rows a chunk takes: CHUNK, or fewer where that would leave a thread idle on a short sequence.
static int64_t chunk_rows(int64_t n_out, nm_pool *pool) {
    const int64_t want = 4 * (pool ? nm_pool_size(pool) : 1);
    int64_t m = up_rows((n_out + want - 1) / want);
    return m < NM_CONV_ROWS ? NM_CONV_ROWS : m > CHUNK ? CHUNK : m;
}

// ---- ordinary -------------------------------------------------------------------------------------

static int64_t conv_reach(const nm_conv1d *c) { return (int64_t)c->dil * (c->k - 1); }
static int64_t conv_per_thread(const nm_conv1d *c) { return (CHUNK + NM_CONV_ROWS + conv_reach(c)) * c->ic; }
int64_t nm_conv1d_work(const nm_conv1d *c, int threads) { return (threads > 0 ? threads : 1) * conv_per_thread(c); }

typedef struct conv_job {
    const nm_conv1d *c;
    const float *x;
    float *y, *work;
    int64_t n, n_out, rows;
    int32_t pad_l;
    nm_conv_rows_fn kern;
} conv_job;

static void conv_chunk(void *arg, int64_t chunk, int ith) {
    const conv_job *J = arg;
    const nm_conv1d *c = J->c;
    const int64_t t0 = chunk * J->rows, m = J->n_out - t0 < J->rows ? J->n_out - t0 : J->rows;
    const int64_t s0 = t0 - J->pad_l, span = up_rows(m) + conv_reach(c); // the input rows the kernel reads
    const float *xw = J->x + s0 * c->ic;
    if (c->in_slope != 1.0f || s0 < 0 || s0 + span > J->n) {
        float *win = J->work + ith * conv_per_thread(c);
        window(J->x, J->n, c->ic, c->in_slope, s0, span, win);
        xw = win;
    }
    J->kern(xw, c->dil, c->w, (int64_t)c->ic * ocp_of(c->oc), c->k, c->ic, c->oc, c->bias, m, J->y + t0 * c->oc, c->oc);
}

int64_t nm_conv1d_run(const nm_conv1d *c, const float *x, int64_t n, int32_t pad_l, int32_t pad_r, float *y,
                      float *work, nm_pool *pool) {
    const int64_t n_out = n + pad_l + pad_r - conv_reach(c);
    if (n_out <= 0) return 0;
    conv_job J = {.c = c, .x = x, .y = y, .work = work, .n = n, .n_out = n_out, .rows = chunk_rows(n_out, pool),
                  .pad_l = pad_l, .kern = nm_conv_rows_get()};
    const int64_t chunks = (n_out + J.rows - 1) / J.rows;
    if (pool && chunks > 1) nm_pool_run(pool, conv_chunk, &J, chunks);
    else
        for (int64_t i = 0; i < chunks; i++) conv_chunk(&J, i, 0);
    return n_out;
}

int64_t nm_conv1d_ref(const nm_conv1d *c, const float *x, int64_t n, int32_t pad_l, int32_t pad_r, float *y) {
    const int64_t n_out = n + pad_l + pad_r - conv_reach(c);
    const int32_t ocp = ocp_of(c->oc);
    for (int64_t t = 0; t < n_out; t++)
        for (int32_t o = 0; o < c->oc; o++) {
            float acc = c->bias ? c->bias[o] : 0.0f;
            for (int32_t j = 0; j < c->k; j++) {
                const int64_t s = t + (int64_t)j * c->dil - pad_l;
                if (s < 0 || s >= n) continue;
                for (int32_t i = 0; i < c->ic; i++)
                    acc += c->w[((int64_t)j * c->ic + i) * ocp + o] * act(x[s * c->ic + i], c->in_slope);
            }
            y[t * c->oc + o] = acc;
        }
    return n_out > 0 ? n_out : 0;
}

// ---- transposed -----------------------------------------------------------------------------------
// Output t = m * stride + r - pad (phase r) sums the taps j = r + q * stride over inputs s = m - q.

static int64_t t_taps(const nm_conv_t1d *c) { return (c->k + c->stride - 1) / c->stride; } // the most a phase has
static int64_t t_per_thread(const nm_conv_t1d *c) { return (CHUNK + 2 * NM_CONV_ROWS + t_taps(c)) * c->ic; }
int64_t nm_conv_t1d_work(const nm_conv_t1d *c, int threads) { return (threads > 0 ? threads : 1) * t_per_thread(c); }

typedef struct conv_t_job {
    const nm_conv_t1d *c;
    const float *x;
    float *y, *work;
    int64_t n, n_out, m_lo, m_hi, rows; // m in [m_lo, m_hi]
    nm_conv_rows_fn kern;
} conv_t_job;

static void conv_t_chunk(void *arg, int64_t chunk, int ith) {
    const conv_t_job *J = arg;
    const nm_conv_t1d *c = J->c;
    const int64_t m0 = J->m_lo + chunk * J->rows, m1 = m0 + J->rows - 1 < J->m_hi ? m0 + J->rows - 1 : J->m_hi;
    const int64_t back = t_taps(c) - 1, ocp = ocp_of(c->oc);
    // the inputs [m0 - back, m0 + up_rows(rows) + NM_CONV_ROWS): a phase's rows start up to a block past m0
    float *win = J->work + ith * t_per_thread(c);
    window(J->x, J->n, c->ic, c->in_slope, m0 - back, back + up_rows(m1 - m0 + 1) + NM_CONV_ROWS, win);
    for (int32_t r = 0; r < c->stride; r++) { // phase r's outputs in range: 0 <= m * stride + r - pad < n_out
        int64_t a = -floor_div(r - c->pad, c->stride), b = floor_div(J->n_out - 1 + c->pad - r, c->stride);
        a = a < m0 ? m0 : a, b = b > m1 ? m1 : b;
        if (a > b) continue;
        const int32_t taps = r < c->k ? (c->k - r + c->stride - 1) / c->stride : 0;
        J->kern(win + (a - m0 + back) * c->ic, -1, c->w + (int64_t)r * c->ic * ocp, (int64_t)c->stride * c->ic * ocp,
                taps, c->ic, c->oc, c->bias, b - a + 1, J->y + (a * c->stride + r - c->pad) * c->oc,
                (int64_t)c->stride * c->oc);
    }
}

int64_t nm_conv_t1d_run(const nm_conv_t1d *c, const float *x, int64_t n, float *y, float *work, nm_pool *pool) {
    const int64_t n_out = (n - 1) * c->stride - 2 * (int64_t)c->pad + c->k;
    if (n <= 0 || n_out <= 0) return 0;
    conv_t_job J = {.c = c, .x = x, .y = y, .work = work, .n = n, .n_out = n_out, .kern = nm_conv_rows_get()};
    J.m_lo = -floor_div(c->stride - 1 - c->pad, c->stride), J.m_hi = floor_div(n_out - 1 + c->pad, c->stride);
    J.rows = chunk_rows(J.m_hi - J.m_lo + 1, pool);
    const int64_t chunks = (J.m_hi - J.m_lo + J.rows) / J.rows;
    if (pool && chunks > 1) nm_pool_run(pool, conv_t_chunk, &J, chunks);
    else
        for (int64_t i = 0; i < chunks; i++) conv_t_chunk(&J, i, 0);
    return n_out;
}

int64_t nm_conv_t1d_ref(const nm_conv_t1d *c, const float *x, int64_t n, float *y) {
    const int64_t n_out = (n - 1) * c->stride - 2 * (int64_t)c->pad + c->k;
    const int32_t ocp = ocp_of(c->oc);
    for (int64_t t = 0; t < n_out; t++)
        for (int32_t o = 0; o < c->oc; o++) {
            float acc = c->bias ? c->bias[o] : 0.0f;
            for (int64_t s = 0; s < n; s++) {
                const int64_t j = t + c->pad - s * c->stride;
                if (j < 0 || j >= c->k) continue;
                for (int32_t i = 0; i < c->ic; i++)
                    acc += c->w[(j * c->ic + i) * ocp + o] * act(x[s * c->ic + i], c->in_slope);
            }
            y[t * c->oc + o] = acc;
        }
    return n_out > 0 ? n_out : 0;
}
