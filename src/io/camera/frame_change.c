// A frame's signature and the difference of two (nanomind.h, "A camera's
// frame in brief"): the cascade's camera event asks about a frame only when
// it differs from the last one asked about. Integer arithmetic throughout, so
// the verdict on a pair of files is the same on every CPU.
#include "io/image/image.h"
#include "core/fail.h"

#include <stdlib.h>
#include <string.h>

static void signature_of(const nm_image *img_, nm_frame_sig *out) {
    const nm_image img = *img_;
    const int64_t w = img.w, h = img.h, S = NM_FRAME_SIG_SIDE;
    for (int64_t cy = 0; cy < S; cy++) {
        // a frame smaller than the grid: a cell takes its nearest row / column
        int64_t y0 = cy * h / S, y1 = (cy + 1) * h / S;
        if (y1 <= y0) y1 = y0 + 1;
        for (int64_t cx = 0; cx < S; cx++) {
            int64_t x0 = cx * w / S, x1 = (cx + 1) * w / S;
            if (x1 <= x0) x1 = x0 + 1;
            uint64_t sum = 0;
            for (int64_t y = y0; y < y1; y++) {
                const uint8_t *px = img.rgb + (y * w + x0) * 3;
                for (int64_t x = x0; x < x1; x++, px += 3) sum += (77u * px[0] + 150u * px[1] + 29u * px[2] + 128u) >> 8;
            }
            const uint64_t n = (uint64_t)((y1 - y0) * (x1 - x0));
            out->luma[cy * S + cx] = (uint8_t)((sum + n / 2) / n);
        }
    }
    out->width = (int32_t)w;
    out->height = (int32_t)h;
}

nm_status nm_frame_signature(const char *path, nm_frame_sig *out, char *err, size_t err_size) {
    if (!path || !out) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "frame: NULL path or output");
    memset(out, 0, sizeof *out);
    nm_image img = {0};
    nm_status st = nm_image_load(path, &img, err, err_size);
    if (st != NM_OK) return st;
    signature_of(&img, out);
    nm_image_free(&img);
    return NM_OK;
}

nm_status nm_frame_signature_slot(const nm_tabm_slot *s, nm_frame_sig *out, char *err, size_t err_size) {
    if (!s || !s->meta || !out) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "frame: NULL slot or output");
    memset(out, 0, sizeof *out);
    nm_image img = {0};
    nm_status st = nm_image_decode_slot(s->data, s->meta, s->capacity, 0, &img, err, err_size);
    if (st != NM_OK) return st;
    signature_of(&img, out);
    nm_image_free(&img);
    return NM_OK;
}

double nm_frame_difference(const nm_frame_sig *a, const nm_frame_sig *b) {
    if (!a || !b) return 255.0;
    uint64_t d = 0;
    for (int i = 0; i < NM_FRAME_SIG_SIDE * NM_FRAME_SIG_SIDE; i++) d += (uint64_t)abs((int)a->luma[i] - (int)b->luma[i]);
    return (double)d / (NM_FRAME_SIG_SIDE * NM_FRAME_SIG_SIDE);
}
