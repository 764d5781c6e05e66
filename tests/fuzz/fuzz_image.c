// Fuzz target for image input: decode arbitrary bytes as PNG / JPEG / PPM
// (chosen by magic) and, when they decode, preprocess the image for both
// projectors at a small image_size, as the vision brick would. Checks the
// contracts that do not depend on the bytes: a failure leaves the image empty
// and says why; a success gives a sane size, every pixel readable, and finite
// encoder inputs in the documented layout.
// Seeds: tests/fuzz/corpus/image (written by `test_image --filter gen_corpus`),
// plus regress-* files: inputs libFuzzer found that once tripped a sanitizer.
// More inputs for a replay: tests/fuzz/mutate_image.py.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bricks/vision/preproc.h"

static volatile float sink;

static void check_batch(const nm_image_batch *b, int S) {
    if (!b->data || b->n < 1 || b->image_size != S) abort();
    if (b->n != (b->rows * b->cols) + 1 && !(b->rows == 0 && b->cols == 0 && b->n == 1)) abort();
    float acc = 0;
    const size_t n = (size_t)b->n * 3 * S * S;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(b->data[i]) || fabsf(b->data[i]) > 10.0f) abort(); // (v/255 - 0.5) / 0.25 is in [-2, 2]
        acc += b->data[i];
    }
    sink = acc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    nm_image im = {7, 7, NULL};
    char err[256] = "";
    // A small pixel cap keeps hostile headers from costing seconds per input.
    nm_status st = nm_image_decode_max(data, size, 1 << 20, &im, err, sizeof err);
    if (st != NM_OK) {
        if (im.rgb || im.w || im.h || err[0] == '\0') abort(); // failures leave *out empty and say why
        return 0;
    }
    if (!im.rgb || im.w <= 0 || im.h <= 0 || (int64_t)im.w * im.h > (1 << 20)) abort();
    uint32_t h = 0;
    for (size_t i = 0; i < (size_t)im.w * im.h * 3; i += 61) h = h * 31 + im.rgb[i];
    h += im.rgb[(size_t)im.w * im.h * 3 - 1];
    sink = (float)h;

    nm_image_params p = {.proj = NM_CLIP_PROJ_MLP, .image_size = 16, .longest_edge = 0,
                         .mean = {0.5f, 0.5f, 0.5f}, .std = {0.25f, 0.25f, 0.25f}, .pad = {122, 116, 104}};
    nm_image_batch b;
    if (nm_image_preprocess(&im, &p, &b, err, sizeof err) != NM_OK) abort(); // any decoded image maps
    check_batch(&b, 16);
    if (b.n != 1) abort();
    nm_image_batch_free(&b);

    // idefics3 with a longest edge (thin images may be refused: RANGE), and the old-file fallback.
    const int32_t edges[2] = {48, 0};
    for (int k = 0; k < 2; k++) {
        p.proj = NM_CLIP_PROJ_IDEFICS3;
        p.longest_edge = edges[k];
        int32_t rows = 0, cols = 0;
        nm_status gs = nm_image_idefics3_grid(im.w, im.h, &p, &rows, &cols);
        st = nm_image_preprocess(&im, &p, &b, err, sizeof err);
        if (st != gs) abort(); // the grid query and the real thing agree
        if (st == NM_OK) {
            if (b.rows != rows || b.cols != cols) abort();
            check_batch(&b, 16);
            nm_image_batch_free(&b);
        } else if (st != NM_ERR_RANGE || b.data || err[0] == '\0') {
            abort();
        }
    }
    nm_image_free(&im);
    return 0;
}
