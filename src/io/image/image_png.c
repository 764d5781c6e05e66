// PNG decoding with libpng, to 8-bit RGB the way stb_image gives it with 3
// requested channels: palette expanded (tRNS ignored), 1/2/4-bit gray scaled
// to 8 bits (x * 255 / (2^d - 1), the same bit replication stb uses), 16-bit
// samples keep their high byte, gray replicated, alpha dropped. No gamma.
//
// libpng reports errors by longjmp out of its calls; every pointer that must
// be freed after such a jump lives in `struct png_job` (heap-stable, not a
// local modified after setjmp).
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/image/image.h"

struct png_job {
    const uint8_t *data;
    size_t n, pos;
    char msg[200];  // libpng's error message
    uint8_t *rgb;   // (h, w, 3)
    png_bytep *rows; // (h) pointers into rgb
};

static void on_error(png_structp png, png_const_charp msg) {
    struct png_job *j = png_get_error_ptr(png);
    snprintf(j->msg, sizeof j->msg, "%s", msg);
    png_longjmp(png, 1);
}

// Warnings (bad ancillary chunk CRC, an odd ICC profile, ...) are recoverable
// and the pixels are still right: keep them off stderr.
static void on_warning(png_structp png, png_const_charp msg) {
    (void)png;
    (void)msg;
}

static void on_read(png_structp png, png_bytep dst, size_t len) {
    struct png_job *j = png_get_io_ptr(png);
    if (len > j->n - j->pos) png_error(png, "truncated data");
    memcpy(dst, j->data + j->pos, len);
    j->pos += len;
}

nm_status nm_image_decode_png(const uint8_t *data, size_t n, int64_t max_pixels, nm_image *out,
                              char *err, size_t err_size) {
    *out = (nm_image){0};
    struct png_job *j = calloc(1, sizeof *j);
    if (!j) {
        if (err && err_size) snprintf(err, err_size, "png: out of memory");
        return NM_ERR_NOMEM;
    }
    j->data = data;
    j->n = n;
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, j, on_error, on_warning);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!png || !info) {
        png_destroy_read_struct(png ? &png : NULL, NULL, NULL);
        free(j);
        if (err && err_size) snprintf(err, err_size, "png: out of memory");
        return NM_ERR_NOMEM;
    }
    nm_status st = NM_ERR_FORMAT;
    if (setjmp(png_jmpbuf(png))) {
        st = NM_ERR_FORMAT; // (assigned after the jump: st is not volatile)
        if (err && err_size) snprintf(err, err_size, "png: %s", j->msg);
        goto done;
    }
    png_set_read_fn(png, j, on_read);
    // png_read_info stops at the first IDAT: only IHDR and ancillary chunks
    // (each capped here) are read and allocated before our size check.
    png_set_chunk_malloc_max(png, 64u << 20);
    png_read_info(png, info);

    png_uint_32 w32, h32;
    int depth, color, interlace;
    png_get_IHDR(png, info, &w32, &h32, &depth, &color, &interlace, NULL, NULL);
    st = nm_image_check_size("png", w32, h32, max_pixels, err, err_size);
    if (st != NM_OK) goto done;
    st = NM_ERR_FORMAT;

    if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png); // may add alpha from tRNS
    if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (depth == 16) png_set_strip_16(png); // high byte, as stb's 16 -> 8 reduction
    png_set_strip_alpha(png);
    if (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    if (png_get_bit_depth(png, info) != 8 || png_get_channels(png, info) != 3 ||
        png_get_rowbytes(png, info) != (size_t)w32 * 3) {
        if (err && err_size) snprintf(err, err_size, "png: unexpected layout after conversion");
        goto done;
    }
    size_t w = w32, h = h32;
    j->rgb = malloc(w * h * 3);
    j->rows = malloc(h * sizeof *j->rows);
    if (!j->rgb || !j->rows) {
        st = NM_ERR_NOMEM;
        if (err && err_size) snprintf(err, err_size, "png: out of memory for %zux%zu", w, h);
        goto done;
    }
    for (size_t y = 0; y < h; y++) j->rows[y] = j->rgb + y * w * 3;
    png_read_image(png, j->rows);
    png_read_end(png, NULL); // reads through IEND: a file cut after the pixels is still truncated
    out->w = (int32_t)w;
    out->h = (int32_t)h;
    out->rgb = j->rgb;
    j->rgb = NULL;
    st = NM_OK;
done:
    png_destroy_read_struct(&png, &info, NULL);
    free(j->rows);
    free(j->rgb);
    free(j);
    return st;
}
