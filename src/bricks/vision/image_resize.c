// Resizing as llama.cpp's img_tool (mtmd-image.cpp), which follows Pillow's
// Resample.c: a separable filter, horizontal pass then vertical pass. For each
// output pixel i (of out, from in pixels): scale = in / out, the filter is
// widened by fs = max(scale, 1), centre = (i + 0.5) * scale, taps j in
// [(int)(centre - support + 0.5), (int)(centre + support + 0.5)) clipped to the
// image, weight_j = K((j - centre + 0.5) / fs), normalised to sum 1, then
// stored as round-half-away(weight * 2^22). A pass sums v * weight in int32
// from 2^21 (rounding) and keeps clamp(sum >> 22, 0, 255).
// The double expressions are written in the same order as the reference so
// the weights, and so the pixels, come out bit-identical.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bricks/vision/preproc.h"

#define PRECISION_BITS 22 // 32 - 8 (pixel) - 2 (headroom for sums and negative lobes)

static double filter_support(nm_resize algo) {
    return algo == NM_RESIZE_BILINEAR ? 1.0 : algo == NM_RESIZE_BICUBIC ? 2.0 : 3.0;
}

static double sinc(double v) {
    if (v == 0.0) return 1.0;
    const double pv = v * 3.141592653589793238462643383279502884;
    return sin(pv) / pv;
}

static double filter(nm_resize algo, double x) {
    if (algo == NM_RESIZE_LANCZOS) return (-3.0 <= x && x < 3.0) ? sinc(x) * sinc(x / 3.0) : 0.0;
    if (x < 0.0) x = -x;
    if (algo == NM_RESIZE_BILINEAR) return x < 1.0 ? 1.0 - x : 0.0;
    const double a = -0.5; // Pillow's bicubic (PyTorch and ggml use -0.75)
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
    if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
    return 0.0;
}

// Per output pixel: first tap and tap count in bounds[2i], bounds[2i+1];
// ksize fixed-point weights in k[i * ksize ...]. Returns ksize, 0 on no memory.
static int taps(nm_resize algo, int in, int out, int **bounds_out, int32_t **k_out) {
    double scale = (double)in / out, fs = scale < 1.0 ? 1.0 : scale;
    double support = filter_support(algo) * fs;
    int ksize = (int)ceil(support) * 2 + 1;
    int *bounds = malloc((size_t)out * 2 * sizeof *bounds);
    double *pre = malloc((size_t)out * ksize * sizeof *pre);
    int32_t *k = malloc((size_t)out * ksize * sizeof *k);
    if (!bounds || !pre || !k) {
        free(bounds);
        free(pre);
        free(k);
        return 0;
    }
    for (int i = 0; i < out; i++) {
        double center = (i + 0.5) * scale, ww = 0.0, ss = 1.0 / fs;
        int xmin = (int)(center - support + 0.5);
        if (xmin < 0) xmin = 0;
        int xmax = (int)(center + support + 0.5);
        if (xmax > in) xmax = in;
        xmax -= xmin;
        double *w = pre + (size_t)i * ksize;
        int x = 0;
        for (; x < xmax; x++) {
            w[x] = filter(algo, (x + xmin - center + 0.5) * ss);
            ww += w[x];
        }
        for (x = 0; x < xmax; x++)
            if (ww != 0.0) w[x] /= ww;
        for (; x < ksize; x++) w[x] = 0;
        bounds[2 * i] = xmin;
        bounds[2 * i + 1] = xmax;
    }
    const double fxp = ldexp(1.0, PRECISION_BITS);
    for (size_t i = 0; i < (size_t)out * ksize; i++)
        k[i] = (int32_t)(pre[i] * fxp + (pre[i] < 0 ? -0.5 : 0.5)); // truncation after +-0.5, as Pillow
    free(pre);
    *bounds_out = bounds;
    *k_out = k;
    return ksize;
}

static uint8_t clip8(int32_t v) { return v < 0 ? 0 : v > 255 ? 255 : (uint8_t)v; }

// src (in_w x h) -> dst (out_w x h)
static void pass_h(const uint8_t *restrict src, int in_w, int h, uint8_t *restrict dst, int out_w, int ksize,
                   const int *restrict bounds, const int32_t *restrict k) {
    for (int y = 0; y < h; y++) {
        const uint8_t *row = src + (size_t)y * in_w * 3;
        uint8_t *o = dst + (size_t)y * out_w * 3;
        for (int x = 0; x < out_w; x++) {
            const int32_t *kk = k + (size_t)x * ksize;
            const uint8_t *p = row + (size_t)bounds[2 * x] * 3;
            int32_t s0 = 1 << (PRECISION_BITS - 1), s1 = s0, s2 = s0;
            for (int t = 0; t < bounds[2 * x + 1]; t++, p += 3) {
                s0 += p[0] * kk[t];
                s1 += p[1] * kk[t];
                s2 += p[2] * kk[t];
            }
            o[3 * x + 0] = clip8(s0 >> PRECISION_BITS);
            o[3 * x + 1] = clip8(s1 >> PRECISION_BITS);
            o[3 * x + 2] = clip8(s2 >> PRECISION_BITS);
        }
    }
}

// src (w x in_h) -> dst (w x out_h); acc holds one row of int32 sums (w * 3).
// Whole rows at a time: contiguous, and (restrict) the compiler vectorizes the inner loops.
static void pass_v(const uint8_t *restrict src, int w, uint8_t *restrict dst, int out_h, int ksize,
                   const int *restrict bounds, const int32_t *restrict k, int32_t *restrict acc) {
    const size_t n = (size_t)w * 3;
    for (int y = 0; y < out_h; y++) {
        const int32_t *kk = k + (size_t)y * ksize;
        for (size_t i = 0; i < n; i++) acc[i] = 1 << (PRECISION_BITS - 1);
        for (int t = 0; t < bounds[2 * y + 1]; t++) {
            const uint8_t *row = src + (size_t)(bounds[2 * y] + t) * n;
            const int32_t wt = kk[t];
            for (size_t i = 0; i < n; i++) acc[i] += row[i] * wt;
        }
        uint8_t *o = dst + (size_t)y * n;
        for (size_t i = 0; i < n; i++) o[i] = clip8(acc[i] >> PRECISION_BITS);
    }
}

nm_status nm_image_resize(const nm_image *src, int32_t w, int32_t h, nm_resize algo, nm_image *dst) {
    *dst = (nm_image){0};
    if (!src || !src->rgb || src->w <= 0 || src->h <= 0 || algo < NM_RESIZE_BILINEAR || algo > NM_RESIZE_LANCZOS)
        return NM_ERR_INVALID_ARG;
    nm_status st = nm_image_alloc(w, h, dst);
    if (st != NM_OK) return st;
    const bool need_h = w != src->w, need_v = h != src->h;
    if (!need_h && !need_v) {
        memcpy(dst->rgb, src->rgb, (size_t)w * h * 3);
        return NM_OK;
    }
    int *bh = NULL, *bv = NULL;
    int32_t *kh = NULL, *kv = NULL, *acc = NULL;
    uint8_t *tmp = NULL;
    int ksh = 0, ksv = 0;
    st = NM_ERR_NOMEM;
    if (need_h && !(ksh = taps(algo, src->w, w, &bh, &kh))) goto done;
    if (need_v && !(ksv = taps(algo, src->h, h, &bv, &kv))) goto done;
    if (need_h && need_v) {
        tmp = malloc((size_t)w * src->h * 3);
        acc = malloc((size_t)w * 3 * sizeof *acc);
        if (!tmp || !acc) goto done;
        pass_h(src->rgb, src->w, src->h, tmp, w, ksh, bh, kh);
        pass_v(tmp, w, dst->rgb, h, ksv, bv, kv, acc);
    } else if (need_h) {
        pass_h(src->rgb, src->w, src->h, dst->rgb, w, ksh, bh, kh);
    } else {
        acc = malloc((size_t)w * 3 * sizeof *acc);
        if (!acc) goto done;
        pass_v(src->rgb, w, dst->rgb, h, ksv, bv, kv, acc);
    }
    st = NM_OK;
done:
    free(bh);
    free(kh);
    free(bv);
    free(kv);
    free(tmp);
    free(acc);
    if (st != NM_OK) nm_image_free(dst);
    return st;
}

nm_status nm_image_resize_pad(const nm_image *src, int32_t w, int32_t h, nm_resize algo,
                              const uint8_t pad[3], nm_image *dst) {
    *dst = (nm_image){0};
    if (!src || !src->rgb || src->w <= 0 || src->h <= 0 || !pad) return NM_ERR_INVALID_ARG;
    if (w == src->w && h == src->h) return nm_image_resize(src, w, h, algo, dst); // a copy
    // float, as the reference: the new size can differ by one from a double computation
    float sw = (float)w / (float)src->w, sh = (float)h / (float)src->h;
    float scale = sw < sh ? sw : sh;
    float fw = ceilf((float)src->w * scale), fh = ceilf((float)src->h * scale);
    int32_t nw = fw < (float)w ? (int32_t)fw : w, nh = fh < (float)h ? (int32_t)fh : h;
    nm_image fit;
    nm_status st = nm_image_resize(src, nw, nh, algo, &fit);
    if (st != NM_OK) return st;
    st = nm_image_alloc(w, h, dst);
    if (st != NM_OK) {
        nm_image_free(&fit);
        return st;
    }
    for (size_t i = 0; i < (size_t)w * h; i++) memcpy(dst->rgb + 3 * i, pad, 3);
    int32_t ox = (w - nw) / 2, oy = (h - nh) / 2;
    for (int32_t y = 0; y < nh; y++)
        memcpy(dst->rgb + ((size_t)(y + oy) * w + ox) * 3, fit.rgb + (size_t)y * nw * 3, (size_t)nw * 3);
    nm_image_free(&fit);
    return NM_OK;
}

void nm_image_rect_to_f32(const nm_image *img, int32_t x0, int32_t y0, int32_t size, const float mean[3],
                          const float std[3], float *planar) {
    // Per channel, each of the 256 byte values maps to one float: a table gives
    // the same bits as computing (v / 255.0f - mean) / std per pixel.
    float lut[3][256];
    for (int c = 0; c < 3; c++)
        for (int v = 0; v < 256; v++) lut[c][v] = ((float)v / 255.0f - mean[c]) / std[c];
    const size_t plane = (size_t)size * size;
    for (int32_t y = 0; y < size; y++) {
        const uint8_t *row = img->rgb + ((size_t)(y0 + y) * img->w + x0) * 3;
        float *r = planar + (size_t)y * size, *g = r + plane, *b = g + plane;
        for (int32_t x = 0; x < size; x++) {
            r[x] = lut[0][row[3 * x + 0]];
            g[x] = lut[1][row[3 * x + 1]];
            b[x] = lut[2][row[3 * x + 2]];
        }
    }
}

void nm_image_to_f32(const nm_image *img, const float mean[3], const float std[3], float *planar) {
    float lut[3][256];
    for (int c = 0; c < 3; c++)
        for (int v = 0; v < 256; v++) lut[c][v] = ((float)v / 255.0f - mean[c]) / std[c];
    const size_t plane = (size_t)img->w * img->h;
    for (size_t i = 0; i < plane; i++)
        for (int c = 0; c < 3; c++) planar[c * plane + i] = lut[c][img->rgb[3 * i + c]];
}
