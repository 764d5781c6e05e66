// JPEG decoding with libjpeg(-turbo), to 8-bit RGB as stb_image gives it:
// gray replicated, YCbCr (or RGB) to RGB, and Adobe CMYK / YCCK files turned
// into RGB the way stb does (R = C * K / 255 on the inverted-CMYK samples
// Adobe writes). Other 4-channel files (no Adobe marker, or transform 1) are
// NM_ERR_UNSUPPORTED: libjpeg calls them CMYK, stb decodes them as YCbCr.
// Default libjpeg settings otherwise (islow IDCT, fancy upsampling), the
// closest to stb's decoder; the pixels may still differ by a few levels.
//
// Errors come back through a setjmp/longjmp error manager, so a corrupt file
// never reaches libjpeg's default exit(). Warnings that mean lost pixels
// (truncated data, bad Huffman codes, ...) are errors too: libjpeg would fill
// the rest with gray, stb would fail.
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <jerror.h>

#include "bricks/vision/image.h"

struct jpeg_job {
    struct jpeg_error_mgr pub; // first: libjpeg hands us a pointer to it
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX];
    nm_status st;
    uint8_t *rgb; // (h, w, 3)
    uint8_t *row; // one output row of libjpeg's (w * components)
};

static void on_error_exit(j_common_ptr c) {
    struct jpeg_job *j = (struct jpeg_job *)c->err;
    c->err->format_message(c, j->msg);
    j->st = NM_ERR_FORMAT;
    longjmp(j->jb, 1);
}

static void on_message(j_common_ptr c, int level) {
    if (level >= 0) return; // trace messages
    switch (c->err->msg_code) {
    case JWRN_JPEG_EOF:
    case JWRN_HIT_MARKER:
    case JWRN_HUFF_BAD_CODE:
    case JWRN_ARITH_BAD_CODE:
    case JWRN_MUST_RESYNC:
    case JWRN_NOT_SEQUENTIAL:
    case JWRN_BOGUS_PROGRESSION:
        on_error_exit(c);
        break;
    default: // e.g. junk bytes before a marker, an unknown JFIF revision: the pixels are fine
        c->err->num_warnings++;
        break;
    }
}

static uint8_t blinn(uint8_t x, uint8_t y) { // x * y / 255, rounded, as stb
    unsigned t = (unsigned)x * y + 128;
    return (uint8_t)((t + (t >> 8)) >> 8);
}

nm_status nm_image_decode_jpeg(const uint8_t *data, size_t n, int64_t max_pixels, nm_image *out,
                               char *err, size_t err_size) {
    *out = (nm_image){0};
    struct jpeg_job *j = calloc(1, sizeof *j);
    struct jpeg_decompress_struct *ci = calloc(1, sizeof *ci);
    if (!j || !ci) {
        free(j);
        free(ci);
        if (err && err_size) snprintf(err, err_size, "jpeg: out of memory");
        return NM_ERR_NOMEM;
    }
    ci->err = jpeg_std_error(&j->pub);
    j->pub.error_exit = on_error_exit;
    j->pub.emit_message = on_message;
    j->st = NM_ERR_FORMAT;
    if (setjmp(j->jb)) {
        if (err && err_size) snprintf(err, err_size, "jpeg: %s", j->msg[0] ? j->msg : "decoding failed");
        goto done;
    }
    jpeg_create_decompress(ci);
    jpeg_mem_src(ci, data, (unsigned long)n);
    jpeg_read_header(ci, TRUE);

    nm_status st = nm_image_check_size("jpeg", ci->image_width, ci->image_height, max_pixels, err, err_size);
    if (st != NM_OK) {
        j->st = st;
        goto done;
    }
    int cmyk = 0;
    switch (ci->jpeg_color_space) {
    case JCS_GRAYSCALE: ci->out_color_space = JCS_GRAYSCALE; break;
    case JCS_YCbCr:
    case JCS_RGB: ci->out_color_space = JCS_RGB; break;
    case JCS_CMYK:
    case JCS_YCCK:
        if (!ci->saw_Adobe_marker || (ci->Adobe_transform != 0 && ci->Adobe_transform != 2)) {
            j->st = NM_ERR_UNSUPPORTED;
            if (err && err_size)
                snprintf(err, err_size, "jpeg: 4-channel image without an Adobe CMYK/YCCK marker is not supported");
            goto done;
        }
        ci->out_color_space = JCS_CMYK; // libjpeg turns YCCK into CMYK
        cmyk = 1;
        break;
    default:
        j->st = NM_ERR_UNSUPPORTED;
        if (err && err_size)
            snprintf(err, err_size, "jpeg: colour space %d with %d components is not supported",
                     (int)ci->jpeg_color_space, ci->num_components);
        goto done;
    }
    jpeg_start_decompress(ci);
    size_t w = ci->output_width, h = ci->output_height, nc = (size_t)ci->output_components;
    if (nc != (cmyk ? 4u : ci->out_color_space == JCS_RGB ? 3u : 1u) ||
        w != ci->image_width || h != ci->image_height) {
        if (err && err_size) snprintf(err, err_size, "jpeg: unexpected output layout");
        goto done;
    }
    j->rgb = malloc(w * h * 3);
    j->row = malloc(w * nc);
    if (!j->rgb || !j->row) {
        j->st = NM_ERR_NOMEM;
        if (err && err_size) snprintf(err, err_size, "jpeg: out of memory for %zux%zu", w, h);
        goto done;
    }
    while (ci->output_scanline < h) {
        size_t y = ci->output_scanline;
        JSAMPROW rp = nc == 3 ? (JSAMPROW)(j->rgb + y * w * 3) : j->row;
        if (jpeg_read_scanlines(ci, &rp, 1) != 1) {
            if (err && err_size) snprintf(err, err_size, "jpeg: no data for row %zu", y);
            goto done;
        }
        uint8_t *o = j->rgb + y * w * 3;
        if (nc == 1) {
            for (size_t x = 0; x < w; x++) o[3 * x] = o[3 * x + 1] = o[3 * x + 2] = j->row[x];
        } else if (nc == 4) {
            const uint8_t *s = j->row;
            for (size_t x = 0; x < w; x++, s += 4) {
                o[3 * x + 0] = blinn(s[0], s[3]);
                o[3 * x + 1] = blinn(s[1], s[3]);
                o[3 * x + 2] = blinn(s[2], s[3]);
            }
        }
    }
    jpeg_finish_decompress(ci); // reads up to EOI: a file cut after the last scan is truncated
    out->w = (int32_t)w;
    out->h = (int32_t)h;
    out->rgb = j->rgb;
    j->rgb = NULL;
    j->st = NM_OK;
done:
    jpeg_destroy_decompress(ci);
    nm_status ret = j->st;
    free(j->rgb);
    free(j->row);
    free(j);
    free(ci);
    return ret;
}
