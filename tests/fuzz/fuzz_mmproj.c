// Fuzz target for the mmproj loader (src/bricks/vision/clip.c): arbitrary
// bytes through nm_clip_load_memory. Accepted files are used as the vision
// brick would: the info read back, the preprocessing parameters and (for
// anyres files) the best resolution of a few image sizes, and one encode of a
// constant image when the encoder is small enough to run per input.
// Seeds: tests/fuzz/corpus/mmproj (written by
// `NM_GEN_CORPUS=DIR test_vision_encoder --filter gen_corpus`).
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bricks/vision/clip.h"
#include "bricks/vision/preproc.h"

static volatile uint64_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    nm_clip *c = NULL;
    char err[256];
    nm_status st = nm_clip_load_memory(data, size, NULL, 1, &c, err, sizeof err);
    if (st != NM_OK) {
        if (c || err[0] == '\0') abort(); // failures leave *out NULL and say why
        return 0;
    }
    const nm_clip_info *in = nm_clip_get_info(c);
    if (in->n_out <= 0 || in->n_out_embd <= 0 || in->image_size <= 0 || in->n_pinpoints < 0 ||
        in->n_pinpoints > NM_CLIP_MAX_PINPOINTS)
        abort();
    nm_image_params p = nm_image_params_from_clip(in);
    uint64_t h = 0;
    static const int32_t sizes[][2] = {{1, 1}, {640, 480}, {17, 4000}, {4000, 17}};
    for (int i = 0; i < 4 && in->n_pinpoints > 0; i++) {
        int32_t rw = 0, rh = 0;
        if (nm_image_anyres_resolution(sizes[i][0], sizes[i][1], &p, &rw, &rh) != NM_OK) abort();
        if (rw % in->image_size || rh % in->image_size) abort(); // the loader only accepts multiples
        h += (uint64_t)rw + (uint64_t)rh;
    }
    for (int i = 0; i < 4 && in->proj == NM_CLIP_PROJ_QWEN2VL; i++) { // qwen2vl: sizes of whole cells, in the budget
        int32_t tw = 0, th = 0;
        if (nm_image_qwen2vl_size(sizes[i][0], sizes[i][1], &p, &tw, &th) == NM_OK &&
            (tw % p.cell || th % p.cell || nm_clip_n_out(c, tw, th) <= 0))
            abort();
        h += (uint64_t)tw + (uint64_t)th;
    }
    // one encode when it is cheap: a constant image
    const int64_t S = in->image_size;
    if (S <= 64 && (int64_t)in->n_embd * in->n_layer <= 1 << 12 && (int64_t)in->n_ff <= 1 << 10) {
        float *px = malloc(sizeof(float) * 3 * (size_t)(S * S));
        float *out = malloc(sizeof(float) * (size_t)nm_clip_n_out(c, (int32_t)S, (int32_t)S) * (size_t)in->n_out_embd + 4);
        if (px && out) {
            for (int64_t i = 0; i < 3 * S * S; i++) px[i] = 0.25f;
            if (nm_clip_encode(c, px, out) == NM_OK) h += isfinite(out[0]);
            else if (nm_clip_last_error(c)[0] == '\0') abort();
        }
        free(px);
        free(out);
    }
    sink += h;
    nm_clip_free(c);
    return 0;
}
