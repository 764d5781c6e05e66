// JPEG decoding, bit-identical to stb_image (v2.30, 3 channels requested),
// which is what llama.cpp decodes with.
//
// libjpeg(-turbo) does the parsing and entropy decoding only
// (jpeg_read_coefficients: baseline, progressive and arithmetic coding), so
// the quantized DCT coefficients are exactly the file's. The pixels are then
// rebuilt with stb's arithmetic rather than libjpeg's, which rounds
// differently at every stage:
//   - dequantize in 16 bits, integer IDCT with 12-bit constants (the islow
//     algorithm; columns keep 2 extra bits, rows round at 17 bits and add 128);
//   - chroma upsampling per component from (h_max / h, v_max / v): 1x1 as is,
//     1x2 / 2x1 / 2x2 with the 3/4 - 1/4 triangle ("fancy") filter and stb's
//     rounding, anything else nearest neighbour; the row pair for vertical
//     filtering chosen as stb does;
//   - YCbCr to RGB in 20-bit fixed point with stb's constants, truncating the
//     Cb term of green to 16 fractional bits;
//   - 3 channels: RGB stored as is when the ids are 'R','G','B' or an Adobe
//     marker says transform 0 without JFIF; 4 channels: Adobe transform 0 is
//     CMYK, 2 is YCCK (R = (255 - r) * K / 255 after YCbCr), anything else
//     is YCbCr with K ignored; 1 channel is replicated.
// Files stb rejects for their layout (2 components, fractional sampling
// ratios) are NM_ERR_UNSUPPORTED.
//
// Errors come back through a setjmp/longjmp error manager, so a corrupt file
// never reaches libjpeg's default exit(). Warnings that mean lost data
// (truncated file, bad Huffman code, ...) are errors too: libjpeg would carry
// on with zeros.
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <jerror.h>

#include "io/image/image.h"

struct jpeg_job {
    struct jpeg_error_mgr pub; // first: libjpeg hands us a pointer to it
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX];
    nm_status st;
    uint8_t *rgb;       // (h, w, 3)
    uint8_t *plane[4];  // per component: (height_in_blocks * 8, stride[c]) samples
    uint8_t *line[4];   // per component: one upsampled row (w + 4)
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
    default: // e.g. junk bytes before a marker, an unknown JFIF revision: the data is fine
        c->err->num_warnings++;
        break;
    }
}

// ---- stb's reconstruction arithmetic ----------------------------------------------

static uint8_t clamp8(int x) { return x < 0 ? 0 : x > 255 ? 255 : (uint8_t)x; }

#define K12(x) ((uint32_t)(int)((x) * 4096 + 0.5)) // a constant in 12-bit fixed point (x a float literal)

// One 8-point islow IDCT: the even part sums x0..x3 and the odd part t0..t3,
// combined by the caller as x_i +- t_(3-i). The arithmetic wraps modulo 2^32
// (unsigned), which is what stb's int code does in practice on corrupt input
// where it overflows; valid data never comes near.
struct idct8 { uint32_t x0, x1, x2, x3, t0, t1, t2, t3; };

static struct idct8 idct_1d(int s0, int s1, int s2, int s3, int s4, int s5, int s6, int s7) {
    struct idct8 r;
    // even part
    uint32_t p1 = ((uint32_t)s2 + (uint32_t)s6) * K12(0.5411961f);
    uint32_t t2 = p1 + (uint32_t)s6 * K12(-1.847759065f);
    uint32_t t3 = p1 + (uint32_t)s2 * K12(0.765366865f);
    uint32_t t0 = ((uint32_t)s0 + (uint32_t)s4) * 4096u;
    uint32_t t1 = ((uint32_t)s0 - (uint32_t)s4) * 4096u;
    r.x0 = t0 + t3;
    r.x3 = t0 - t3;
    r.x1 = t1 + t2;
    r.x2 = t1 - t2;
    // odd part, inputs in the order s7, s5, s3, s1
    uint32_t a0 = (uint32_t)s7, a1 = (uint32_t)s5, a2 = (uint32_t)s3, a3 = (uint32_t)s1;
    uint32_t q3 = a0 + a2, q4 = a1 + a3, q1 = a0 + a3, q2 = a1 + a2;
    uint32_t q5 = (q3 + q4) * K12(1.175875602f);
    a0 = a0 * K12(0.298631336f);
    a1 = a1 * K12(2.053119869f);
    a2 = a2 * K12(3.072711026f);
    a3 = a3 * K12(1.501321110f);
    q1 = q5 + q1 * K12(-0.899976223f);
    q2 = q5 + q2 * K12(-2.562915447f);
    q3 = q3 * K12(-1.961570560f);
    q4 = q4 * K12(-0.390180644f);
    r.t3 = a3 + q1 + q4;
    r.t2 = a2 + q2 + q3;
    r.t1 = a1 + q2 + q4;
    r.t0 = a0 + q1 + q3;
    return r;
}

// (a + b) >> n on the wrapped 32-bit sum, as a signed (arithmetic) shift.
static int sum_shr(uint32_t a, uint32_t b, int n) { return (int32_t)(a + b) >> n; }

// d: 64 dequantized coefficients, natural order. out: 8x8 samples at stride.
static void idct_block(uint8_t *out, size_t stride, const short d[64]) {
    int v[64];
    for (int i = 0; i < 8; i++) { // columns; an all-zero AC column is just its DC
        const short *c = d + i;
        if (!c[8] && !c[16] && !c[24] && !c[32] && !c[40] && !c[48] && !c[56]) {
            for (int k = 0; k < 8; k++) v[i + 8 * k] = c[0] * 4;
            continue;
        }
        struct idct8 r = idct_1d(c[0], c[8], c[16], c[24], c[32], c[40], c[48], c[56]);
        r.x0 += 512; r.x1 += 512; r.x2 += 512; r.x3 += 512; // back to 2 extra bits, rounded
        v[i + 0] = sum_shr(r.x0, r.t3, 10);
        v[i + 56] = sum_shr(r.x0, -r.t3, 10);
        v[i + 8] = sum_shr(r.x1, r.t2, 10);
        v[i + 48] = sum_shr(r.x1, -r.t2, 10);
        v[i + 16] = sum_shr(r.x2, r.t1, 10);
        v[i + 40] = sum_shr(r.x2, -r.t1, 10);
        v[i + 24] = sum_shr(r.x3, r.t0, 10);
        v[i + 32] = sum_shr(r.x3, -r.t0, 10);
    }
    for (int i = 0; i < 8; i++, out += stride) { // rows: 12 + 2 + 3 bits to drop, +128 level shift
        const int *s = v + 8 * i;
        struct idct8 r = idct_1d(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]);
        const uint32_t bias = 65536u + (128u << 17);
        r.x0 += bias; r.x1 += bias; r.x2 += bias; r.x3 += bias;
        out[0] = clamp8(sum_shr(r.x0, r.t3, 17));
        out[7] = clamp8(sum_shr(r.x0, -r.t3, 17));
        out[1] = clamp8(sum_shr(r.x1, r.t2, 17));
        out[6] = clamp8(sum_shr(r.x1, -r.t2, 17));
        out[2] = clamp8(sum_shr(r.x2, r.t1, 17));
        out[5] = clamp8(sum_shr(r.x2, -r.t1, 17));
        out[3] = clamp8(sum_shr(r.x3, r.t0, 17));
        out[4] = clamp8(sum_shr(r.x3, -r.t0, 17));
    }
}

// Upsamplers: w low-res samples of the near row (and the far row for
// vertical filtering) -> one output row. Return the row to use.
static const uint8_t *up_1x1(uint8_t *out, const uint8_t *near, const uint8_t *far, int w, int hs) {
    (void)out; (void)far; (void)w; (void)hs;
    return near;
}

static const uint8_t *up_v2(uint8_t *out, const uint8_t *near, const uint8_t *far, int w, int hs) {
    (void)hs;
    for (int i = 0; i < w; i++) out[i] = (uint8_t)((3 * near[i] + far[i] + 2) >> 2);
    return out;
}

static const uint8_t *up_h2(uint8_t *out, const uint8_t *in, const uint8_t *far, int w, int hs) {
    (void)far; (void)hs;
    if (w == 1) {
        out[0] = out[1] = in[0];
        return out;
    }
    out[0] = in[0];
    out[1] = (uint8_t)((in[0] * 3 + in[1] + 2) >> 2);
    int i = 1;
    for (; i < w - 1; i++) {
        int n = 3 * in[i] + 2;
        out[2 * i] = (uint8_t)((n + in[i - 1]) >> 2);
        out[2 * i + 1] = (uint8_t)((n + in[i + 1]) >> 2);
    }
    out[2 * i] = (uint8_t)((in[w - 2] * 3 + in[w - 1] + 2) >> 2);
    out[2 * i + 1] = in[w - 1];
    return out;
}

static const uint8_t *up_hv2(uint8_t *out, const uint8_t *near, const uint8_t *far, int w, int hs) {
    (void)hs;
    if (w == 1) {
        out[0] = out[1] = (uint8_t)((3 * near[0] + far[0] + 2) >> 2);
        return out;
    }
    int t1 = 3 * near[0] + far[0];
    out[0] = (uint8_t)((t1 + 2) >> 2);
    for (int i = 1; i < w; i++) {
        int t0 = t1;
        t1 = 3 * near[i] + far[i];
        out[2 * i - 1] = (uint8_t)((3 * t0 + t1 + 8) >> 4);
        out[2 * i] = (uint8_t)((3 * t1 + t0 + 8) >> 4);
    }
    out[2 * w - 1] = (uint8_t)((t1 + 2) >> 2);
    return out;
}

static const uint8_t *up_nearest(uint8_t *out, const uint8_t *near, const uint8_t *far, int w, int hs) {
    (void)far;
    for (int i = 0; i < w; i++)
        for (int k = 0; k < hs; k++) out[i * hs + k] = near[i];
    return out;
}

#define FIX20(x) (((int)((x) * 4096.0f + 0.5f)) << 8)

static void ycc_to_rgb(uint8_t *out, const uint8_t *y, const uint8_t *cb, const uint8_t *cr, int n) {
    for (int i = 0; i < n; i++, out += 3) {
        int yf = (y[i] << 20) + (1 << 19);
        int vr = cr[i] - 128, vb = cb[i] - 128;
        int r = (yf + vr * FIX20(1.40200f)) >> 20;
        int g = (yf + vr * -FIX20(0.71414f) + (int)((unsigned)(vb * -FIX20(0.34414f)) & 0xffff0000u)) >> 20;
        int b = (yf + vb * FIX20(1.77200f)) >> 20;
        out[0] = clamp8(r);
        out[1] = clamp8(g);
        out[2] = clamp8(b);
    }
}

static uint8_t blinn(uint8_t x, uint8_t y) { // x * y / 255, rounded
    unsigned t = (unsigned)x * y + 128;
    return (uint8_t)((t + (t >> 8)) >> 8);
}

// ---- decoder ---------------------------------------------------------------------

typedef const uint8_t *(*upsample_fn)(uint8_t *, const uint8_t *, const uint8_t *, int, int);

static nm_status set_err(struct jpeg_job *j, nm_status st, char *err, size_t err_size, const char *msg) {
    if (err && err_size) snprintf(err, err_size, "jpeg: %s", msg);
    j->st = st;
    return st;
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
    jpeg_save_markers(ci, JPEG_APP0, 64);      // JFIF
    jpeg_save_markers(ci, JPEG_APP0 + 14, 64); // Adobe
    jpeg_read_header(ci, TRUE);

    nm_status st = nm_image_check_size("jpeg", ci->image_width, ci->image_height, max_pixels, err, err_size);
    if (st != NM_OK) {
        j->st = st;
        goto done;
    }
    const int nc = ci->num_components;
    if (nc != 1 && nc != 3 && nc != 4) {
        set_err(j, NM_ERR_UNSUPPORTED, err, err_size, "only 1, 3 or 4 components are supported");
        goto done;
    }
    if (ci->data_precision != 8) {
        set_err(j, NM_ERR_UNSUPPORTED, err, err_size, "only 8-bit samples are supported");
        goto done;
    }
    int hmax = 1, vmax = 1;
    for (int c = 0; c < nc; c++) {
        if (ci->comp_info[c].h_samp_factor > hmax) hmax = ci->comp_info[c].h_samp_factor;
        if (ci->comp_info[c].v_samp_factor > vmax) vmax = ci->comp_info[c].v_samp_factor;
    }
    for (int c = 0; c < nc; c++)
        if (hmax % ci->comp_info[c].h_samp_factor || vmax % ci->comp_info[c].v_samp_factor) {
            set_err(j, NM_ERR_UNSUPPORTED, err, err_size, "fractional chroma sampling ratios are not supported");
            goto done;
        }
    // stb's colour rules read the raw APP0/APP14 markers and the component ids.
    int jfif = 0, app14 = -1, rgb_ids = 0;
    for (jpeg_saved_marker_ptr m = ci->marker_list; m; m = m->next) {
        if (m->marker == JPEG_APP0 && m->original_length >= 5 && m->data_length >= 5 && !memcmp(m->data, "JFIF", 5))
            jfif = 1;
        if (m->marker == JPEG_APP0 + 14 && m->original_length >= 12 && m->data_length >= 12 &&
            !memcmp(m->data, "Adobe", 6))
            app14 = m->data[11];
    }
    for (int c = 0; c < nc && nc == 3; c++) rgb_ids += ci->comp_info[c].component_id == "RGB"[c];
    const bool is_rgb = nc == 3 && (rgb_ids == 3 || (app14 == 0 && !jfif));

    jvirt_barray_ptr *coefs = jpeg_read_coefficients(ci);
    const size_t W = ci->image_width, H = ci->image_height;
    size_t stride[4];
    for (int c = 0; c < nc; c++) {
        jpeg_component_info *cp = &ci->comp_info[c];
        const JQUANT_TBL *q = cp->quant_table;
        if (!q) {
            set_err(j, NM_ERR_FORMAT, err, err_size, "a component has no scan data");
            goto done;
        }
        stride[c] = (size_t)cp->width_in_blocks * 8;
        j->plane[c] = malloc(stride[c] * cp->height_in_blocks * 8);
        j->line[c] = malloc(W + 4);
        if (!j->plane[c] || !j->line[c]) {
            set_err(j, NM_ERR_NOMEM, err, err_size, "out of memory");
            goto done;
        }
        for (JDIMENSION by = 0; by < cp->height_in_blocks; by++) {
            JBLOCKARRAY row = ci->mem->access_virt_barray((j_common_ptr)ci, coefs[c], by, 1, FALSE);
            for (JDIMENSION bx = 0; bx < cp->width_in_blocks; bx++) {
                short d[64];
                for (int k = 0; k < 64; k++) d[k] = (short)(row[0][bx][k] * q->quantval[k]); // wraps as stb
                idct_block(j->plane[c] + (size_t)by * 8 * stride[c] + (size_t)bx * 8, stride[c], d);
            }
        }
    }

    j->rgb = malloc(W * H * 3);
    if (!j->rgb) {
        set_err(j, NM_ERR_NOMEM, err, err_size, "out of memory for the pixels");
        goto done;
    }
    struct { int hs, vs, ystep, w_lo, ypos, rows; const uint8_t *l0, *l1; upsample_fn f; } r[4];
    for (int c = 0; c < nc; c++) {
        r[c].hs = hmax / ci->comp_info[c].h_samp_factor;
        r[c].vs = vmax / ci->comp_info[c].v_samp_factor;
        r[c].ystep = r[c].vs >> 1;
        r[c].w_lo = (int)((W + r[c].hs - 1) / r[c].hs);
        r[c].ypos = 0;
        r[c].rows = (int)((H * ci->comp_info[c].v_samp_factor + vmax - 1) / vmax);
        r[c].l0 = r[c].l1 = j->plane[c];
        r[c].f = r[c].hs == 1 && r[c].vs == 1 ? up_1x1
               : r[c].hs == 1 && r[c].vs == 2 ? up_v2
               : r[c].hs == 2 && r[c].vs == 1 ? up_h2
               : r[c].hs == 2 && r[c].vs == 2 ? up_hv2
               : up_nearest;
    }
    for (size_t y = 0; y < H; y++) {
        const uint8_t *row[4];
        for (int c = 0; c < nc; c++) {
            // Between two low-res rows: the nearer is "near" (stb's y_bot test).
            bool bot = r[c].ystep >= (r[c].vs >> 1);
            row[c] = r[c].f(j->line[c], bot ? r[c].l1 : r[c].l0, bot ? r[c].l0 : r[c].l1, r[c].w_lo, r[c].hs);
            if (++r[c].ystep >= r[c].vs) {
                r[c].ystep = 0;
                r[c].l0 = r[c].l1;
                if (++r[c].ypos < r[c].rows) r[c].l1 += stride[c];
            }
        }
        uint8_t *o = j->rgb + y * W * 3;
        if (nc == 1) {
            for (size_t x = 0; x < W; x++) o[3 * x] = o[3 * x + 1] = o[3 * x + 2] = row[0][x];
        } else if (nc == 3 && is_rgb) {
            for (size_t x = 0; x < W; x++) {
                o[3 * x] = row[0][x];
                o[3 * x + 1] = row[1][x];
                o[3 * x + 2] = row[2][x];
            }
        } else if (nc == 4 && app14 == 0) { // CMYK
            for (size_t x = 0; x < W; x++)
                for (int c = 0; c < 3; c++) o[3 * x + c] = blinn(row[c][x], row[3][x]);
        } else {
            ycc_to_rgb(o, row[0], row[1], row[2], (int)W);
            if (nc == 4 && app14 == 2) // YCCK
                for (size_t x = 0; x < W; x++)
                    for (int c = 0; c < 3; c++) o[3 * x + c] = blinn((uint8_t)(255 - o[3 * x + c]), row[3][x]);
        }
    }
    jpeg_finish_decompress(ci); // reads up to EOI: a file cut after the last scan is truncated
    out->w = (int32_t)W;
    out->h = (int32_t)H;
    out->rgb = j->rgb;
    j->rgb = NULL;
    j->st = NM_OK;
done:
    jpeg_destroy_decompress(ci);
    nm_status ret = j->st;
    free(j->rgb);
    for (int c = 0; c < 4; c++) {
        free(j->plane[c]);
        free(j->line[c]);
    }
    free(j);
    free(ci);
    return ret;
}
