// Encoder inputs for one image, as llama.cpp's mtmd builds them (see image.h
// for the rules and the prompt layout): mtmd_image_preprocessor_fixed_size for
// "mlp", mtmd_image_preprocessor_llava_uhd for "mlp" with pinpoints (anyres)
// and mtmd_image_preprocessor_idefics3 for "idefics3".
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bricks/vision/preproc.h"
#include "core/fail.h"

#define MAX_TILES 1024 // an idefics3 grid beyond this is not an image we want to encode

nm_image_params nm_image_params_from_clip(const nm_clip_info *ci) {
    nm_image_params p = {0};
    p.proj = ci->proj;
    p.image_size = ci->image_size;
    p.longest_edge = ci->proj == NM_CLIP_PROJ_IDEFICS3 ? ci->preproc_image_size : 0;
    memcpy(p.mean, ci->mean, sizeof p.mean);
    memcpy(p.std, ci->std, sizeof p.std);
    if (ci->proj == NM_CLIP_PROJ_MLP) { // clip.cpp: image_pad_color for the llava projectors
        p.pad[0] = 122;
        p.pad[1] = 116;
        p.pad[2] = 104;
        p.n_pinpoints = ci->n_pinpoints;
        memcpy(p.pinpoints, ci->pinpoints, sizeof p.pinpoints);
    }
    if (ci->proj == NM_CLIP_PROJ_QWEN2VL) { // black around the fitted image (clip.cpp's default colour)
        p.cell = ci->patch_size * ci->n_merge;
        p.min_tokens = ci->min_tokens;
        p.max_tokens = ci->max_tokens;
        p.cap_tokens = ci->max_tokens; // (the encoder's: what the arena holds)
    }
    return p;
}

// idefics3 sizes. With longest_edge: step 1 size (w1, h1); without it (old
// files) the refined size is each side rounded to a multiple of S and there is
// no step 1 (w1 = h1 = 0). grid: cols x rows of S.
struct ide_plan {
    int32_t w1, h1;
    int32_t cols, rows;
};

static nm_status ide_plan(int32_t w, int32_t h, const nm_image_params *p, struct ide_plan *pl) {
    const int32_t S = p->image_size;
    *pl = (struct ide_plan){0};
    if (p->longest_edge > 0) {
        const int32_t L = p->longest_edge;
        const double aspect = (double)w / h;
        if (w >= h) {
            pl->w1 = L;
            pl->h1 = (int32_t)(L / aspect);
            pl->h1 += pl->h1 % 2;
        } else {
            pl->h1 = L;
            pl->w1 = (int32_t)(L * aspect);
            pl->w1 += pl->w1 % 2;
        }
        if (pl->w1 <= 0 || pl->h1 <= 0) return NM_ERR_RANGE; // too thin: a side resizes to 0 (llama.cpp throws)
        pl->cols = (pl->w1 + S - 1) / S;
        pl->rows = (pl->h1 + S - 1) / S;
    } else {
        // round_by_factor in float, then at least S
        int32_t rw = (int32_t)roundf((float)w / (float)S) * S, rh = (int32_t)roundf((float)h / (float)S) * S;
        if (rw < S) rw = S;
        if (rh < S) rh = S;
        pl->cols = (int32_t)ceilf((float)rw / (float)S);
        pl->rows = (int32_t)ceilf((float)rh / (float)S);
    }
    if ((int64_t)pl->cols * pl->rows > MAX_TILES) return NM_ERR_RANGE;
    return NM_OK;
}

static bool params_ok(const nm_image_params *p) {
    if (!p || (p->proj != NM_CLIP_PROJ_MLP && p->proj != NM_CLIP_PROJ_IDEFICS3 && p->proj != NM_CLIP_PROJ_QWEN2VL))
        return false;
    if (p->proj == NM_CLIP_PROJ_QWEN2VL &&
        (p->cell <= 0 || p->cell > 4096 || p->min_tokens < 1 || p->max_tokens < p->min_tokens || p->max_tokens > 1 << 20 ||
         p->cap_tokens < 0 || p->cap_tokens > 1 << 20))
        return false;
    if (p->image_size <= 0 || p->image_size > 4096 || p->longest_edge < 0 || p->longest_edge > 65536) return false;
    if (p->n_pinpoints < 0 || p->n_pinpoints > NM_CLIP_MAX_PINPOINTS) return false;
    for (int32_t i = 0; i < p->n_pinpoints; i++)
        for (int k = 0; k < 2; k++) {
            const int32_t v = p->pinpoints[i][k];
            if (v < p->image_size || v % p->image_size || v / p->image_size > NM_CLIP_MAX_PINPOINT_TILES) return false;
        }
    for (int c = 0; c < 3; c++)
        if (!(p->std[c] != 0.0f) || !isfinite(p->std[c]) || !isfinite(p->mean[c])) return false;
    return true;
}

nm_status nm_image_anyres_resolution(int32_t w, int32_t h, const nm_image_params *p, int32_t *rw, int32_t *rh) {
    if (!params_ok(p) || p->proj != NM_CLIP_PROJ_MLP || p->n_pinpoints == 0 || w <= 0 || h <= 0)
        return NM_ERR_INVALID_ARG;
    // llama.cpp's arithmetic (resize_maintain_aspect_ratio: float scale, int *
    // float products truncated), in 64 bits where it uses int
    int64_t max_eff = 0, min_wasted = INT32_MAX;
    int32_t best = 0;
    for (int32_t i = 0; i < p->n_pinpoints; i++) {
        const int32_t cw = p->pinpoints[i][0], ch = p->pinpoints[i][1];
        const float sw = (float)cw / (float)w, sh = (float)ch / (float)h, scale = sw < sh ? sw : sh;
        const int64_t tw = (int64_t)((float)w * scale), th = (int64_t)((float)h * scale);
        const int64_t eff = tw * th < (int64_t)w * h ? tw * th : (int64_t)w * h;
        const int64_t wasted = (int64_t)cw * ch - eff;
        if (eff > max_eff || (eff == max_eff && wasted < min_wasted)) {
            max_eff = eff;
            min_wasted = wasted;
            best = i;
        }
    }
    if (rw) *rw = p->pinpoints[best][0];
    if (rh) *rh = p->pinpoints[best][1];
    return NM_OK;
}

nm_status nm_image_qwen2vl_size(int32_t w, int32_t h, const nm_image_params *p, int32_t *tw, int32_t *th) {
    if (!params_ok(p) || p->proj != NM_CLIP_PROJ_QWEN2VL || w <= 0 || h <= 0) return NM_ERR_INVALID_ARG;
    // llama.cpp's float arithmetic: round/floor/ceil of x / f in float, times f
    const int32_t f = p->cell;
    const int64_t max_px = (int64_t)p->max_tokens * f * f, min_px = (int64_t)p->min_tokens * f * f;
#define BY(fn, x) ((int64_t)fn((float)(x) / (float)f) * f)
    int64_t wb = BY(roundf, w), hb = BY(roundf, h);
    if (wb < f) wb = f;
    if (hb < f) hb = f;
    if (wb * hb > max_px) {
        const float beta = sqrtf((float)h * (float)w / (float)max_px);
        hb = BY(floorf, (float)h / beta);
        wb = BY(floorf, (float)w / beta);
        if (hb < f) hb = f;
        if (wb < f) wb = f;
    } else if (wb * hb < min_px) {
        const float beta = sqrtf((float)min_px / ((float)h * (float)w));
        hb = BY(ceilf, (float)h * beta);
        wb = BY(ceilf, (float)w * beta);
    }
#undef BY
    const int64_t cap_px = p->cap_tokens > 0 ? (int64_t)p->cap_tokens * f * f : max_px;
    if (wb * hb > cap_px || wb > 65536 || hb > 65536) return NM_ERR_RANGE;
    if (tw) *tw = (int32_t)wb;
    if (th) *th = (int32_t)hb;
    return NM_OK;
}

nm_status nm_image_idefics3_grid(int32_t w, int32_t h, const nm_image_params *p, int32_t *rows, int32_t *cols) {
    if (!params_ok(p) || p->proj != NM_CLIP_PROJ_IDEFICS3 || w <= 0 || h <= 0) return NM_ERR_INVALID_ARG;
    struct ide_plan pl;
    nm_status st = ide_plan(w, h, p, &pl);
    if (st != NM_OK) return st;
    if (rows) *rows = pl.rows;
    if (cols) *cols = pl.cols;
    return NM_OK;
}

nm_status nm_image_preprocess(const nm_image *img, const nm_image_params *p, nm_image_batch *out,
                              char *err, size_t err_size) {
    if (err && err_size) err[0] = '\0';
    if (!out) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "preprocess: no output");
    *out = (nm_image_batch){0};
    if (!img || !img->rgb || img->w <= 0 || img->h <= 0)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "preprocess: empty image");
    if (!params_ok(p))
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size,
                       "preprocess: bad parameters (projector mlp, idefics3 or qwen2vl, image_size 1..4096, std != 0, "
                       "pinpoints multiples of image_size, qwen2vl cells and token limits)");
    const int32_t S = p->image_size;
    if (p->proj == NM_CLIP_PROJ_QWEN2VL) { // one image, fitted into its cells on black, any size of cells
        int32_t tw = 0, th = 0;
        nm_status st = nm_image_qwen2vl_size(img->w, img->h, p, &tw, &th);
        if (st != NM_OK)
            return nm_fail(st, err, err_size, "preprocess: a %dx%d image cannot be resized into %d to %d cells of %d "
                           "pixels (at most %d after scaling up)", img->w, img->h, p->min_tokens, p->max_tokens, p->cell,
                           p->cap_tokens > 0 ? p->cap_tokens : p->max_tokens);
        static const uint8_t black[3] = {0, 0, 0};
        nm_image a = {0};
        float *data = malloc((size_t)3 * tw * th * sizeof *data);
        st = data ? nm_image_resize_pad(img, tw, th, NM_RESIZE_BICUBIC, black, &a) : NM_ERR_NOMEM;
        if (st == NM_OK) nm_image_to_f32(&a, p->mean, p->std, data);
        nm_image_free(&a);
        if (st != NM_OK) {
            free(data);
            return nm_fail(st, err, err_size, "preprocess: resize to %dx%d failed (%s)", tw, th, nm_status_str(st));
        }
        *out = (nm_image_batch){.n = 1, .image_size = S, .width = tw, .height = th, .data = data};
        return NM_OK;
    }
    const size_t per = (size_t)3 * S * S;
    struct ide_plan pl = {0};
    int32_t n = 1;
    const bool anyres = p->proj == NM_CLIP_PROJ_MLP && p->n_pinpoints > 0 && (img->w > S || img->h > S);
    if (anyres) {
        int32_t rw, rh;
        nm_image_anyres_resolution(img->w, img->h, p, &rw, &rh);
        pl.cols = rw / S;
        pl.rows = rh / S;
        if ((int64_t)pl.rows * pl.cols > MAX_TILES)
            return nm_fail(NM_ERR_RANGE, err, err_size, "preprocess: an anyres grid of %dx%d tiles is more than %d",
                           pl.cols, pl.rows, MAX_TILES);
        n = pl.rows * pl.cols + 1;
    } else if (p->proj == NM_CLIP_PROJ_IDEFICS3) {
        nm_status st = ide_plan(img->w, img->h, p, &pl);
        if (st != NM_OK)
            return nm_fail(st, err, err_size, "preprocess: a %dx%d image cannot be tiled for idefics3 (%s)",
                           img->w, img->h, pl.cols ? "more than 1024 tiles" : "a side would shrink to 0");
        n = pl.rows * pl.cols + 1;
    }
    float *data = malloc(per * (size_t)n * sizeof *data);
    if (!data) return nm_fail(NM_ERR_NOMEM, err, err_size, "preprocess: out of memory for %d images", n);

    nm_status st = NM_OK;
    nm_image a = {0}, b = {0}, g = {0};
    if (p->proj == NM_CLIP_PROJ_MLP && p->n_pinpoints == 0) {
        st = nm_image_resize_pad(img, S, S, NM_RESIZE_BICUBIC, p->pad, &a);
        if (st == NM_OK) nm_image_rect_to_f32(&a, 0, 0, S, p->mean, p->std, data);
    } else {
        // tiles of a refined image b (pl.rows x pl.cols of S; none for an anyres image within S x S), then g
        const int32_t rw = pl.cols * S, rh = pl.rows * S;
        if (p->proj == NM_CLIP_PROJ_IDEFICS3 && p->longest_edge > 0) {
            // source -> (w1, h1) -> refined (cols S, rows S) -> global S x S, all Lanczos
            st = nm_image_resize(img, pl.w1, pl.h1, NM_RESIZE_LANCZOS, &a);
            if (st == NM_OK) st = nm_image_resize(&a, rw, rh, NM_RESIZE_LANCZOS, &b);
            if (st == NM_OK) st = nm_image_resize(&b, S, S, NM_RESIZE_LANCZOS, &g);
        } else {
            // llava_uhd slicing (mlp anyres; idefics3 files without preproc_image_size): refined =
            // bicubic fitted on black (pad_rf PAD_CEIL, colour 0), global = bicubic stretch (pad_ov PAD_NONE)
            static const uint8_t black[3] = {0, 0, 0};
            if (pl.rows > 0) st = nm_image_resize_pad(img, rw, rh, NM_RESIZE_BICUBIC, black, &b);
            if (st == NM_OK) st = nm_image_resize(img, S, S, NM_RESIZE_BICUBIC, &g);
        }
        if (st == NM_OK) {
            float *o = data;
            for (int32_t r = 0; r < pl.rows; r++)
                for (int32_t c = 0; c < pl.cols; c++, o += per)
                    nm_image_rect_to_f32(&b, c * S, r * S, S, p->mean, p->std, o);
            nm_image_rect_to_f32(&g, 0, 0, S, p->mean, p->std, o);
        }
    }
    nm_image_free(&a);
    nm_image_free(&b);
    nm_image_free(&g);
    if (st != NM_OK) {
        free(data);
        return nm_fail(st, err, err_size, "preprocess: resize failed (%s)", nm_status_str(st));
    }
    out->n = n;
    out->rows = pl.rows;
    out->cols = pl.cols;
    out->image_size = S;
    out->width = out->height = S;
    out->data = data;
    return NM_OK;
}

void nm_image_batch_free(nm_image_batch *b) {
    if (!b) return;
    free(b->data);
    *b = (nm_image_batch){0};
}
