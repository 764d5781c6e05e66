// Image input for the vision brick: PNG / JPEG / PPM decoding of files the
// test writes itself (libpng and libjpeg encoders, PPM by hand), every
// truncation and random byte flips of them, the Pillow-style resizers against
// values computed here independently, and the mlp / idefics3 preprocessing
// (layout, padding, tile grid and order).
//
// NM_GEN_CORPUS=DIR with `--filter gen_corpus` writes the fuzz seed corpus
// (tests/fuzz/corpus/image); NM_IMAGE_SAMPLES=DIR with `--filter gen_samples`
// writes larger sample images for the golden check against llama.cpp.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <jpeglib.h> // after stdio.h: it uses FILE and size_t without including them
#include <png.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bricks/vision/clip.h"
#include "bricks/vision/preproc.h"
#include "genmmproj.h"
#include "nmtest.h"

// ---- growable byte buffer and deterministic data ----------------------------------

typedef struct buf { uint8_t *p; size_t n, cap; } buf;

static void buf_put(buf *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->n + n) cap *= 2;
        b->p = realloc(b->p, cap);
        if (!b->p) abort(); // test harness only
        b->cap = cap;
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}

static uint32_t rng(uint32_t *s) {
    *s ^= *s << 13; *s ^= *s >> 17; *s ^= *s << 5;
    return *s;
}

// A smooth picture with some edges: what a camera gives, more or less.
static uint8_t pic(int x, int y, int c, int w, int h) {
    int v = (x * 255 / (w > 1 ? w - 1 : 1) * (c + 1) + y * 255 / (h > 1 ? h - 1 : 1) * (3 - c)) / 4;
    if ((x / 8 + y / 8) % 5 == 0) v = 255 - v;
    return (uint8_t)(v & 255);
}

// ---- PNG writer (libpng) --------------------------------------------------------------

static void png_write_cb(png_structp png, png_bytep d, size_t n) { buf_put(png_get_io_ptr(png), d, n); }
static void png_flush_cb(png_structp png) { (void)png; }

// samples: rows of packed samples as libpng expects for (color, depth); for
// depth 16 big-endian pairs. palette/trns optional.
static buf png_encode(int w, int h, int color, int depth, int interlace, const uint8_t *samples,
                      const png_color *pal, int n_pal, const uint8_t *trns_a, int n_trns,
                      const png_color_16 *trns_c) {
    buf b = {0};
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png_create_info_struct(png);
    if (setjmp(png_jmpbuf(png))) abort();
    png_set_write_fn(png, &b, png_write_cb, png_flush_cb);
    png_set_IHDR(png, info, w, h, depth, color, interlace, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    if (pal) png_set_PLTE(png, info, pal, n_pal);
    if (trns_a || trns_c) png_set_tRNS(png, info, trns_a, n_trns, trns_c);
    png_write_info(png, info);
    size_t rowbytes = png_get_rowbytes(png, info);
    png_bytep *rows = malloc(sizeof *rows * h);
    for (int y = 0; y < h; y++) rows[y] = (png_bytep)samples + y * rowbytes;
    png_write_image(png, rows);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    free(rows);
    return b;
}

// ---- JPEG writer (libjpeg) -----------------------------------------------------------

// Options beyond the defaults (quality 75 with 2x2 luma sampling for colour).
typedef struct jopt {
    int quality;
    int h0, v0;      // luma sampling factors (0: libjpeg's 2x2); chroma stays 1x1
    int progressive;
    int ycck;        // 4 channels: YCCK (Adobe transform 2) instead of CMYK (0)
    int stored_rgb;  // 3 channels stored as RGB: Adobe transform 0, no JFIF
    int no_adobe;    // 4 channels without the Adobe marker
    int restart;     // restart interval in MCU rows
    int arith;       // arithmetic coding
} jopt;

// nc: 1 gray, 3 RGB, 4 CMYK.
static buf jpeg_encode_opt(int w, int h, int nc, const uint8_t *px, jopt o) {
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr e;
    c.err = jpeg_std_error(&e);
    jpeg_create_compress(&c);
    unsigned char *mem = NULL;
    unsigned long n = 0;
    jpeg_mem_dest(&c, &mem, &n);
    c.image_width = w;
    c.image_height = h;
    c.input_components = nc;
    c.in_color_space = nc == 1 ? JCS_GRAYSCALE : nc == 3 ? JCS_RGB : JCS_CMYK;
    jpeg_set_defaults(&c);
    if (nc == 4) jpeg_set_colorspace(&c, o.ycck ? JCS_YCCK : JCS_CMYK);
    if (nc == 3 && o.stored_rgb) jpeg_set_colorspace(&c, JCS_RGB);
    if (o.no_adobe) c.write_Adobe_marker = FALSE;
    jpeg_set_quality(&c, o.quality ? o.quality : 75, TRUE);
    if (o.h0) {
        c.comp_info[0].h_samp_factor = o.h0;
        c.comp_info[0].v_samp_factor = o.v0;
        for (int i = 1; i < c.num_components; i++) c.comp_info[i].h_samp_factor = c.comp_info[i].v_samp_factor = 1;
    }
    if (o.progressive) jpeg_simple_progression(&c);
    c.restart_in_rows = o.restart;
    c.arith_code = o.arith ? TRUE : FALSE;
    jpeg_start_compress(&c, TRUE);
    while (c.next_scanline < c.image_height) {
        JSAMPROW r = (JSAMPROW)(px + (size_t)c.next_scanline * w * nc);
        jpeg_write_scanlines(&c, &r, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    buf b = {0};
    buf_put(&b, mem, n);
    free(mem);
    return b;
}

static buf jpeg_encode(int w, int h, int nc, const uint8_t *px, int quality, int sub444, int progressive,
                       int ycck) {
    jopt o = {.quality = quality, .h0 = sub444, .v0 = sub444, .progressive = progressive, .ycck = ycck};
    return jpeg_encode_opt(w, h, nc, px, o);
}

// ---- PPM writer ----------------------------------------------------------------------

static buf pnm_encode(char kind, int w, int h, int maxval, const uint16_t *s, const char *comment) {
    buf b = {0};
    char hdr[256];
    int nch = kind == '6' || kind == '3' ? 3 : 1;
    int k = snprintf(hdr, sizeof hdr, "P%c\n%s%s%d %d\n%d\n", kind, comment ? comment : "", comment ? "\n" : "",
                     w, h, maxval);
    buf_put(&b, hdr, (size_t)k);
    for (size_t i = 0; i < (size_t)w * h * nch; i++) {
        if (kind == '5' || kind == '6') {
            uint8_t v[2] = {(uint8_t)(s[i] >> 8), (uint8_t)s[i]};
            if (maxval > 255) buf_put(&b, v, 2);
            else buf_put(&b, v + 1, 1);
        } else {
            k = snprintf(hdr, sizeof hdr, "%u%c", s[i], i % 7 == 6 ? '\n' : ' ');
            buf_put(&b, hdr, (size_t)k);
        }
    }
    return b;
}

// ---- helpers ---------------------------------------------------------------------------

static nm_status dec(const buf *b, nm_image *im) {
    char err[256];
    return nm_image_decode(b->p, b->n, im, err, sizeof err);
}

static int max_diff(const uint8_t *a, const uint8_t *b, size_t n) {
    int m = 0;
    for (size_t i = 0; i < n; i++) {
        int d = abs((int)a[i] - (int)b[i]);
        if (d > m) m = d;
    }
    return m;
}

static uint8_t *rgb_pic(int w, int h) {
    uint8_t *p = malloc((size_t)w * h * 3);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < 3; c++) p[((size_t)y * w + x) * 3 + c] = pic(x, y, c, w, h);
    return p;
}

// Every prefix of the file must fail cleanly: an error status, a message, and
// an empty image. Returns how many prefixes were accepted (should be 0).
// ASCII PPM/PGM cut inside its last number is still a valid file (with a
// smaller last sample), so for those only cuts before the last number count.
static int truncations_accepted(const buf *b) {
    int bad = 0;
    size_t upto = b->n;
    if (b->n > 2 && b->p[0] == 'P' && (b->p[1] == '2' || b->p[1] == '3')) {
        while (upto > 0 && (b->p[upto - 1] < '0' || b->p[upto - 1] > '9')) upto--;
        while (upto > 0 && b->p[upto - 1] >= '0' && b->p[upto - 1] <= '9') upto--;
    }
    for (size_t n = 0; n < upto; n++) {
        // a fresh allocation of exactly n bytes, so ASan sees any over-read
        uint8_t *p = malloc(n ? n : 1);
        memcpy(p, b->p, n);
        nm_image im = {1, 1, (uint8_t *)1};
        char err[256] = "";
        nm_status st = nm_image_decode(p, n, &im, err, sizeof err);
        if (st == NM_OK) {
            bad++;
            nm_image_free(&im);
        } else if (im.rgb || im.w || im.h || !err[0]) {
            bad++;
        }
        free(p);
    }
    return bad;
}

// Random byte flips: the decoder may accept or reject, but must not crash,
// and a rejection must leave the image empty with a message.
static int flips_misbehaved(const buf *b, uint32_t seed, int rounds) {
    int bad = 0;
    uint8_t *p = malloc(b->n);
    for (int r = 0; r < rounds; r++) {
        memcpy(p, b->p, b->n);
        int nflip = 1 + (int)(rng(&seed) % 4);
        for (int k = 0; k < nflip; k++) p[rng(&seed) % b->n] ^= (uint8_t)(1 + rng(&seed) % 255);
        nm_image im;
        char err[256] = "";
        nm_status st = nm_image_decode(p, b->n, &im, err, sizeof err);
        if (st == NM_OK) {
            if (!im.rgb || im.w <= 0 || im.h <= 0) bad++;
            volatile uint8_t sink = im.rgb[(size_t)im.w * im.h * 3 - 1];
            (void)sink;
            nm_image_free(&im);
        } else if (im.rgb || !err[0]) {
            bad++;
        }
    }
    free(p);
    return bad;
}

// ---- PNG ------------------------------------------------------------------------------

NM_TEST(png_rgb_rgba_exact) {
    const int w = 13, h = 7;
    uint8_t *rgb = rgb_pic(w, h);
    buf b = png_encode(w, h, PNG_COLOR_TYPE_RGB, 8, PNG_INTERLACE_NONE, rgb, NULL, 0, NULL, 0, NULL);
    nm_image im;
    NM_CHECK(dec(&b, &im) == NM_OK);
    NM_CHECK(im.w == w && im.h == h && !memcmp(im.rgb, rgb, (size_t)w * h * 3));
    nm_image_free(&im);
    NM_CHECK(im.rgb == NULL && im.w == 0);
    free(b.p);
    // RGBA: alpha dropped, colour kept as is (not composited on anything)
    uint8_t *rgba = malloc((size_t)w * h * 4);
    for (int i = 0; i < w * h; i++) {
        memcpy(rgba + 4 * i, rgb + 3 * i, 3);
        rgba[4 * i + 3] = (uint8_t)(i * 37);
    }
    b = png_encode(w, h, PNG_COLOR_TYPE_RGBA, 8, PNG_INTERLACE_NONE, rgba, NULL, 0, NULL, 0, NULL);
    NM_CHECK(dec(&b, &im) == NM_OK);
    NM_CHECK(im.w == w && im.h == h && !memcmp(im.rgb, rgb, (size_t)w * h * 3));
    nm_image_free(&im);
    free(b.p);
    // RGB with a tRNS colour key: ignored
    png_color_16 key = {0, 10, 20, 30, 0};
    b = png_encode(w, h, PNG_COLOR_TYPE_RGB, 8, PNG_INTERLACE_NONE, rgb, NULL, 0, NULL, 0, &key);
    NM_CHECK(dec(&b, &im) == NM_OK);
    NM_CHECK(!memcmp(im.rgb, rgb, (size_t)w * h * 3));
    nm_image_free(&im);
    free(b.p);
    free(rgba);
    free(rgb);
}

NM_TEST(png_gray_depths_and_alpha) {
    const int w = 11, h = 5;
    // 1, 2, 4, 8-bit gray: v scaled to 8 bits as v * 255 / (2^d - 1)
    for (int depth = 1; depth <= 8; depth *= 2) {
        int maxv = (1 << depth) - 1;
        size_t rowbytes = ((size_t)w * depth + 7) / 8;
        uint8_t *s = calloc(rowbytes * h, 1);
        uint8_t *want = malloc((size_t)w * h * 3);
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++) {
                int v = (x * 3 + y * 5) % (maxv + 1);
                int bit = x * depth;
                s[y * rowbytes + bit / 8] |= (uint8_t)(v << (8 - depth - bit % 8));
                uint8_t g = (uint8_t)(v * 255 / maxv);
                want[(y * w + x) * 3] = want[(y * w + x) * 3 + 1] = want[(y * w + x) * 3 + 2] = g;
            }
        buf b = png_encode(w, h, PNG_COLOR_TYPE_GRAY, depth, PNG_INTERLACE_NONE, s, NULL, 0, NULL, 0, NULL);
        nm_image im;
        NM_CHECK(dec(&b, &im) == NM_OK);
        NM_CHECK(im.w == w && im.h == h && !memcmp(im.rgb, want, (size_t)w * h * 3));
        if (depth == 2) NM_CHECK(truncations_accepted(&b) == 0);
        nm_image_free(&im);
        free(b.p);
        free(s);
        free(want);
    }
    // gray + alpha (8 and 16 bit): gray replicated, alpha dropped, 16 -> high byte
    for (int depth = 8; depth <= 16; depth += 8) {
        int bps = depth / 8;
        uint8_t *s = malloc((size_t)w * h * 2 * bps);
        uint8_t *want = malloc((size_t)w * h * 3);
        for (int i = 0; i < w * h; i++) {
            uint16_t g = (uint16_t)(i * 4099 + 7), a = (uint16_t)(i * 977);
            if (bps == 1) {
                s[2 * i] = (uint8_t)g;
                s[2 * i + 1] = (uint8_t)a;
            } else {
                s[4 * i] = (uint8_t)(g >> 8); s[4 * i + 1] = (uint8_t)g;
                s[4 * i + 2] = (uint8_t)(a >> 8); s[4 * i + 3] = (uint8_t)a;
            }
            want[3 * i] = want[3 * i + 1] = want[3 * i + 2] = bps == 1 ? (uint8_t)g : (uint8_t)(g >> 8);
        }
        buf b = png_encode(w, h, PNG_COLOR_TYPE_GRAY_ALPHA, depth, PNG_INTERLACE_NONE, s, NULL, 0, NULL, 0, NULL);
        nm_image im;
        NM_CHECK(dec(&b, &im) == NM_OK);
        NM_CHECK(im.w == w && !memcmp(im.rgb, want, (size_t)w * h * 3));
        nm_image_free(&im);
        free(b.p);
        free(s);
        free(want);
    }
}

NM_TEST(png_16bit_rgb_keeps_high_byte) {
    const int w = 9, h = 4;
    uint8_t *s = malloc((size_t)w * h * 6), *want = malloc((size_t)w * h * 3);
    for (int i = 0; i < w * h * 3; i++) {
        uint16_t v = (uint16_t)(i * 1237 + 0x80ff); // low bytes >= 0x80: a rounding reducer would differ
        s[2 * i] = (uint8_t)(v >> 8);
        s[2 * i + 1] = (uint8_t)v;
        want[i] = (uint8_t)(v >> 8);
    }
    buf b = png_encode(w, h, PNG_COLOR_TYPE_RGB, 16, PNG_INTERLACE_NONE, s, NULL, 0, NULL, 0, NULL);
    nm_image im;
    NM_CHECK(dec(&b, &im) == NM_OK);
    NM_CHECK(im.w == w && im.h == h && !memcmp(im.rgb, want, (size_t)w * h * 3));
    nm_image_free(&im);
    NM_CHECK(truncations_accepted(&b) == 0);
    free(b.p);
    free(s);
    free(want);
}

NM_TEST(png_palette_with_trns) {
    const int w = 10, h = 6;
    png_color pal[16];
    uint8_t alpha[16];
    for (int i = 0; i < 16; i++) {
        pal[i] = (png_color){(uint8_t)(i * 16), (uint8_t)(255 - i * 9), (uint8_t)(i * i)};
        alpha[i] = (uint8_t)(i * 17);
    }
    for (int depth = 4; depth <= 8; depth += 4) {
        size_t rowbytes = ((size_t)w * depth + 7) / 8;
        uint8_t *s = calloc(rowbytes * h, 1), *want = malloc((size_t)w * h * 3);
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++) {
                int idx = (x * 7 + y * 3) % 16;
                if (depth == 4) s[y * rowbytes + x / 2] |= (uint8_t)(idx << (x % 2 ? 0 : 4));
                else s[y * rowbytes + x] = (uint8_t)idx;
                uint8_t *o = want + (y * w + x) * 3;
                o[0] = pal[idx].red; o[1] = pal[idx].green; o[2] = pal[idx].blue;
            }
        for (int with_trns = 0; with_trns < 2; with_trns++) {
            buf b = png_encode(w, h, PNG_COLOR_TYPE_PALETTE, depth, PNG_INTERLACE_NONE, s, pal, 16,
                               with_trns ? alpha : NULL, with_trns ? 16 : 0, NULL);
            nm_image im;
            NM_CHECK(dec(&b, &im) == NM_OK);
            NM_CHECK(im.w == w && im.h == h && !memcmp(im.rgb, want, (size_t)w * h * 3));
            nm_image_free(&im);
            if (with_trns && depth == 8) {
                NM_CHECK(truncations_accepted(&b) == 0);
                NM_CHECK(flips_misbehaved(&b, 7, 300) == 0);
            }
            free(b.p);
        }
        free(s);
        free(want);
    }
}

NM_TEST(png_interlaced_matches_plain) {
    const int w = 23, h = 17; // not multiples of 8: partial Adam7 passes
    uint8_t *rgb = rgb_pic(w, h);
    buf b = png_encode(w, h, PNG_COLOR_TYPE_RGB, 8, PNG_INTERLACE_ADAM7, rgb, NULL, 0, NULL, 0, NULL);
    nm_image im;
    NM_CHECK(dec(&b, &im) == NM_OK);
    NM_CHECK(im.w == w && im.h == h && !memcmp(im.rgb, rgb, (size_t)w * h * 3));
    nm_image_free(&im);
    NM_CHECK(truncations_accepted(&b) == 0);
    NM_CHECK(flips_misbehaved(&b, 11, 500) == 0);
    free(b.p);
    free(rgb);
}

NM_TEST(png_limits) {
    // A valid header claiming 20000 x 1: rejected before any pixel allocation.
    uint8_t *row = calloc(20000 * 3, 1);
    buf b = png_encode(20000, 1, PNG_COLOR_TYPE_RGB, 8, PNG_INTERLACE_NONE, row, NULL, 0, NULL, 0, NULL);
    nm_image im;
    char err[256] = "";
    nm_status st = nm_image_decode(b.p, b.n, &im, err, sizeof err);
    NM_CHECK(st == NM_ERR_RANGE && im.rgb == NULL && strstr(err, "20000x1"));
    free(b.p);
    // Under the per-side limit but over a caller's pixel cap.
    b = png_encode(2000, 1, PNG_COLOR_TYPE_RGB, 8, PNG_INTERLACE_NONE, row, NULL, 0, NULL, 0, NULL);
    NM_CHECK(nm_image_decode_max(b.p, b.n, 1000, &im, err, sizeof err) == NM_ERR_RANGE && im.rgb == NULL);
    NM_CHECK(strstr(err, "2000x1") != NULL);
    NM_CHECK(nm_image_decode_max(b.p, b.n, 2000, &im, err, sizeof err) == NM_OK && im.w == 2000);
    nm_image_free(&im);
    free(b.p);
    free(row);
}

// ---- JPEG ------------------------------------------------------------------------------

NM_TEST(jpeg_rgb_gray_close) {
    const int w = 40, h = 24;
    uint8_t *rgb = malloc((size_t)w * h * 3), *gray = malloc((size_t)w * h);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) { // smooth: JPEG keeps it to within a few levels
            uint8_t *o = rgb + (y * w + x) * 3;
            o[0] = (uint8_t)(40 + x * 4);
            o[1] = (uint8_t)(200 - y * 5);
            o[2] = (uint8_t)(100 + (x + y) * 2);
            gray[y * w + x] = (uint8_t)(30 + x * 3 + y * 2);
        }
    struct { int sub444, progressive, maxd; } cfg[] = {{1, 0, 4}, {0, 0, 8}, {1, 1, 4}, {0, 1, 8}};
    for (int k = 0; k < 4; k++) {
        buf b = jpeg_encode(w, h, 3, rgb, 95, cfg[k].sub444, cfg[k].progressive, 0);
        nm_image im;
        NM_CHECK(dec(&b, &im) == NM_OK);
        NM_CHECK(im.w == w && im.h == h);
        if (im.rgb) {
            int d = max_diff(im.rgb, rgb, (size_t)w * h * 3);
            if (d > cfg[k].maxd) fprintf(stderr, "  jpeg cfg %d: max diff %d\n", k, d);
            NM_CHECK(d <= cfg[k].maxd);
        }
        nm_image_free(&im);
        if (k == 1 || k == 2) {
            NM_CHECK(truncations_accepted(&b) == 0);
            NM_CHECK(flips_misbehaved(&b, 100 + k, 300) == 0);
        }
        free(b.p);
    }
    buf b = jpeg_encode(w, h, 1, gray, 95, 1, 0, 0);
    nm_image im;
    NM_CHECK(dec(&b, &im) == NM_OK);
    int d = 0;
    for (int i = 0; im.rgb && i < w * h; i++) {
        NM_CHECK(im.rgb[3 * i] == im.rgb[3 * i + 1] && im.rgb[3 * i] == im.rgb[3 * i + 2]);
        int e = abs(im.rgb[3 * i] - gray[i]);
        if (e > d) d = e;
    }
    NM_CHECK(im.rgb && d <= 3);
    nm_image_free(&im);
    NM_CHECK(truncations_accepted(&b) == 0);
    free(b.p);
    free(rgb);
    free(gray);
}

// Every layout the reconstruction branches on decodes close to the source
// (bit-exactness against stb_image is the golden check, docs/correctness.md).
NM_TEST(jpeg_layouts_close) {
    const int w = 37, h = 29;
    uint8_t *rgb = malloc((size_t)w * h * 4);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            uint8_t *o = rgb + (y * w + x) * 3;
            o[0] = (uint8_t)(60 + x * 3);
            o[1] = (uint8_t)(180 - y * 3);
            o[2] = (uint8_t)(90 + x + y);
        }
    const struct { jopt o; int maxd; } v[] = {
        {{.quality = 95, .h0 = 2, .v0 = 1}, 8},
        {{.quality = 95, .h0 = 1, .v0 = 2}, 8},
        {{.quality = 95, .h0 = 4, .v0 = 1}, 12},
        {{.quality = 95, .h0 = 1, .v0 = 1, .restart = 1}, 4},
        {{.quality = 95, .h0 = 1, .v0 = 1, .stored_rgb = 1}, 4},
        {{.quality = 95, .h0 = 1, .v0 = 1, .arith = 1}, 4},
        {{.quality = 95, .h0 = 2, .v0 = 2, .progressive = 1, .arith = 1}, 8},
    };
    for (size_t k = 0; k < sizeof v / sizeof v[0]; k++) {
        buf b = jpeg_encode_opt(w, h, 3, rgb, v[k].o);
        nm_image im;
        char err[256] = "";
        NM_CHECK(nm_image_decode(b.p, b.n, &im, err, sizeof err) == NM_OK);
        if (im.rgb) {
            int d = max_diff(im.rgb, rgb, (size_t)w * h * 3);
            if (d > v[k].maxd) fprintf(stderr, "  layout %zu: max diff %d\n", k, d);
            NM_CHECK(im.w == w && im.h == h && d <= v[k].maxd);
        } else {
            fprintf(stderr, "  layout %zu: %s\n", k, err);
        }
        nm_image_free(&im);
        if (k == 2 || k == 6) NM_CHECK(truncations_accepted(&b) == 0);
        free(b.p);
    }
    free(rgb);
}

static uint8_t blinn_ref(int x, int y) { return (uint8_t)((x * y + 127) / 255); } // x * y / 255 rounded

NM_TEST(jpeg_adobe_cmyk_and_ycck) {
    const int w = 16, h = 16;
    uint8_t *cmyk = malloc((size_t)w * h * 4);
    for (int i = 0; i < w * h; i++) {
        cmyk[4 * i + 0] = 200;
        cmyk[4 * i + 1] = 90;
        cmyk[4 * i + 2] = 30;
        cmyk[4 * i + 3] = 160;
    }
    for (int ycck = 0; ycck < 2; ycck++) {
        buf b = jpeg_encode(w, h, 4, cmyk, 100, 1, 0, ycck);
        nm_image im;
        char err[256];
        nm_status st = nm_image_decode(b.p, b.n, &im, err, sizeof err);
        NM_CHECK(st == NM_OK);
        if (st == NM_OK) {
            // R = C * K / 255 on the stored (Adobe: inverted) samples, as stb_image
            int d = 0;
            for (int i = 0; i < w * h; i++)
                for (int c = 0; c < 3; c++) {
                    int e = abs(im.rgb[3 * i + c] - blinn_ref(cmyk[4 * i + c], cmyk[4 * i + 3]));
                    if (e > d) d = e;
                }
            NM_CHECK(d <= 3);
        } else {
            fprintf(stderr, "  %s\n", err);
        }
        nm_image_free(&im);
        free(b.p);
    }
    free(cmyk);
}

NM_TEST(jpeg_corrupt_never_exits) {
    const int w = 32, h = 32;
    uint8_t *rgb = rgb_pic(w, h);
    buf b = jpeg_encode(w, h, 3, rgb, 80, 0, 0, 0);
    // a bad marker right after SOI, a zeroed SOF, garbage in the scan
    const size_t offs[] = {3, 20, b.n / 2, b.n - 3};
    for (size_t k = 0; k < sizeof offs / sizeof offs[0]; k++) {
        uint8_t *p = malloc(b.n);
        memcpy(p, b.p, b.n);
        memset(p + offs[k], 0xff, b.n - offs[k] < 8 ? b.n - offs[k] : 8);
        nm_image im;
        char err[256] = "";
        nm_status st = nm_image_decode(p, b.n, &im, err, sizeof err);
        NM_CHECK(st == NM_OK || (st == NM_ERR_FORMAT && err[0] && im.rgb == NULL));
        nm_image_free(&im);
        free(p);
    }
    free(b.p);
    free(rgb);
}

// ---- PPM / PGM ------------------------------------------------------------------------

NM_TEST(pnm_all_kinds) {
    const int w = 5, h = 3;
    uint16_t s[5 * 3 * 3];
    uint8_t want[5 * 3 * 3];
    for (int i = 0; i < w * h * 3; i++) s[i] = (uint16_t)(i * 17 % 256);
    for (int i = 0; i < w * h * 3; i++) want[i] = (uint8_t)s[i];
    const char kinds[] = {'6', '3'};
    for (int k = 0; k < 2; k++) {
        buf b = pnm_encode(kinds[k], w, h, 255, s, "# made by test_image");
        nm_image im;
        NM_CHECK(dec(&b, &im) == NM_OK);
        NM_CHECK(im.w == w && im.h == h && !memcmp(im.rgb, want, sizeof want));
        nm_image_free(&im);
        NM_CHECK(truncations_accepted(&b) == 0);
        NM_CHECK(flips_misbehaved(&b, 3 + k, 300) == 0);
        free(b.p);
    }
    // gray P5 / P2 replicate
    for (int k = 0; k < 2; k++) {
        buf b = pnm_encode(k ? '2' : '5', w, h, 255, s, NULL);
        nm_image im;
        NM_CHECK(dec(&b, &im) == NM_OK);
        for (int i = 0; im.rgb && i < w * h; i++)
            NM_CHECK(im.rgb[3 * i] == s[i] && im.rgb[3 * i + 1] == s[i] && im.rgb[3 * i + 2] == s[i]);
        nm_image_free(&im);
        NM_CHECK(truncations_accepted(&b) == 0);
        free(b.p);
    }
    // 16-bit big-endian samples and a small maxval: scaled to round(v * 255 / maxval)
    const int maxvals[] = {65535, 1000, 15, 1};
    for (int m = 0; m < 4; m++) {
        for (int i = 0; i < w * h * 3; i++) s[i] = (uint16_t)((i * 7919u) % (maxvals[m] + 1u));
        for (int k = 0; k < 2; k++) {
            buf b = pnm_encode(k ? '3' : '6', w, h, maxvals[m], s, NULL);
            nm_image im;
            NM_CHECK(dec(&b, &im) == NM_OK);
            for (int i = 0; im.rgb && i < w * h * 3; i++) {
                double exact = s[i] * 255.0 / maxvals[m];
                NM_CHECK(fabs(im.rgb[i] - exact) <= 0.5);
            }
            nm_image_free(&im);
            free(b.p);
        }
    }
}

static nm_status dec_str(const char *s, char *err, size_t err_size) {
    nm_image im;
    nm_status st = nm_image_decode(s, strlen(s), &im, err, err_size);
    nm_image_free(&im);
    return st;
}

NM_TEST(pnm_header_errors) {
    char err[256];
    NM_CHECK(dec_str("P3\n# c1\n 2 # c2\n 1\n# c3\n255\n1 2 3 4 5 6\n", err, sizeof err) == NM_OK);
    NM_CHECK(dec_str("P3 2 1 255 1 2 3 4 5 6", err, sizeof err) == NM_OK);
    NM_CHECK(dec_str("P3 2 1 255 1 2 3 4 5", err, sizeof err) == NM_ERR_FORMAT);
    NM_CHECK(dec_str("P3 2 1 255 1 2 3 4 5 256", err, sizeof err) == NM_ERR_FORMAT);
    NM_CHECK(strstr(err, "maxval") != NULL);
    NM_CHECK(dec_str("P3 2 1 255 1 2 3 4 5 x", err, sizeof err) == NM_ERR_FORMAT);
    NM_CHECK(dec_str("P3 2 1 0 0 0 0 0 0 0", err, sizeof err) == NM_ERR_FORMAT);
    NM_CHECK(dec_str("P3 2 1 65536 0 0 0 0 0 0", err, sizeof err) == NM_ERR_FORMAT);
    NM_CHECK(dec_str("P3 0 1 255 ", err, sizeof err) == NM_ERR_FORMAT);
    NM_CHECK(dec_str("P6 16385 1 255 ", err, sizeof err) == NM_ERR_RANGE);
    NM_CHECK(dec_str("P6 99999999999999999999 1 255 ", err, sizeof err) == NM_ERR_RANGE);
    NM_CHECK(dec_str("P6 2 1 255 abcdef", err, sizeof err) == NM_OK);
    NM_CHECK(dec_str("P6 2 1 255abcdef", err, sizeof err) == NM_ERR_FORMAT);
    NM_CHECK(dec_str("P62 1 255 abcdef", err, sizeof err) == NM_ERR_FORMAT);
    NM_CHECK(dec_str("P6 2 1 255 abcde", err, sizeof err) == NM_ERR_FORMAT);
    NM_CHECK(strstr(err, "truncated") != NULL);
    NM_CHECK(dec_str("P1 2 1 0 1", err, sizeof err) == NM_ERR_UNSUPPORTED);
    NM_CHECK(dec_str("P4 2 1 x", err, sizeof err) == NM_ERR_UNSUPPORTED);
    NM_CHECK(dec_str("P7\nWIDTH 1\n", err, sizeof err) == NM_ERR_UNSUPPORTED);
}

// ---- dispatch and files ---------------------------------------------------------------

NM_TEST(unknown_formats_and_files) {
    char err[256];
    NM_CHECK(dec_str("GIF89a....", err, sizeof err) == NM_ERR_UNSUPPORTED && strstr(err, "GIF"));
    NM_CHECK(dec_str("BM......", err, sizeof err) == NM_ERR_UNSUPPORTED && strstr(err, "BMP"));
    nm_image im = {3, 3, NULL};
    NM_CHECK(nm_image_decode("RIFF\x10\0\0\0WEBPVP8 ", 16, &im, err, sizeof err) == NM_ERR_UNSUPPORTED &&
             strstr(err, "WebP"));
    NM_CHECK(dec_str("hello", err, sizeof err) == NM_ERR_UNSUPPORTED && strstr(err, "unknown"));
    NM_CHECK(nm_image_decode("", 0, &im, err, sizeof err) == NM_ERR_FORMAT && im.w == 0);
    NM_CHECK(nm_image_decode(NULL, 4, &im, err, sizeof err) == NM_ERR_INVALID_ARG);
    NM_CHECK(nm_image_decode("P6 1 1 255 abc", 14, &im, NULL, 0) == NM_OK); // err may be NULL
    nm_image_free(&im);
    nm_image_free(NULL);

    NM_CHECK(nm_image_load("/nonexistent/x.png", &im, err, sizeof err) == NM_ERR_IO && strstr(err, "x.png"));
    NM_CHECK(nm_image_load("/tmp", &im, err, sizeof err) == NM_ERR_IO);
    char path[] = "/tmp/nm_test_image_XXXXXX";
    int fd = mkstemp(path);
    NM_CHECK(fd >= 0);
    if (fd < 0) return;
    const int w = 6, h = 4;
    uint8_t *rgb = rgb_pic(w, h);
    buf b = png_encode(w, h, PNG_COLOR_TYPE_RGB, 8, PNG_INTERLACE_NONE, rgb, NULL, 0, NULL, 0, NULL);
    NM_CHECK(write(fd, b.p, b.n) == (ssize_t)b.n);
    close(fd);
    NM_CHECK(nm_image_load(path, &im, err, sizeof err) == NM_OK && im.w == w && !memcmp(im.rgb, rgb, (size_t)w * h * 3));
    nm_image_free(&im);
    // the same file cut short: a format error that names the file
    NM_CHECK(truncate(path, (off_t)b.n - 20) == 0);
    NM_CHECK(nm_image_load(path, &im, err, sizeof err) == NM_ERR_FORMAT && strstr(err, path) && im.rgb == NULL);
    unlink(path);
    free(b.p);
    free(rgb);
}

// ---- resizing -------------------------------------------------------------------------

NM_TEST(resize_constant_stays_constant) {
    const int sizes[][4] = {{7, 5, 19, 3}, {64, 48, 13, 29}, {3, 3, 1, 1}, {1, 1, 17, 9}, {100, 7, 100, 31}};
    for (int algo = NM_RESIZE_BILINEAR; algo <= NM_RESIZE_LANCZOS; algo++)
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            nm_image src, dst;
            NM_CHECK(nm_image_alloc(sizes[k][0], sizes[k][1], &src) == NM_OK);
            for (int i = 0; i < src.w * src.h; i++) {
                src.rgb[3 * i] = 13; src.rgb[3 * i + 1] = 200; src.rgb[3 * i + 2] = 255;
            }
            NM_CHECK(nm_image_resize(&src, sizes[k][2], sizes[k][3], algo, &dst) == NM_OK);
            NM_CHECK(dst.w == sizes[k][2] && dst.h == sizes[k][3]);
            int ok = 1;
            for (int i = 0; dst.rgb && i < dst.w * dst.h; i++)
                ok &= dst.rgb[3 * i] == 13 && dst.rgb[3 * i + 1] == 200 && dst.rgb[3 * i + 2] == 255;
            NM_CHECK(ok);
            nm_image_free(&src);
            nm_image_free(&dst);
        }
}

NM_TEST(resize_bilinear_2x2_to_3x3_by_hand) {
    // Pillow bilinear 2 -> 3: out[0] = in[0], out[1] = (in[0] + in[1]) / 2 (half up),
    // out[2] = in[1] (scale 2/3: the edge outputs see one input each); rows first,
    // then columns on the rounded row results.
    nm_image src;
    NM_CHECK(nm_image_alloc(2, 2, &src) == NM_OK);
    const uint8_t px[4] = {0, 255, 10, 21}; // a b / c d, same in all channels
    for (int i = 0; i < 4; i++) src.rgb[3 * i] = src.rgb[3 * i + 1] = src.rgb[3 * i + 2] = px[i];
    const uint8_t want[9] = {
        0,  128, 255, // a, (0 + 255) / 2 = 127.5 -> 128, b
        5,  72,  138, // (0+10)/2 = 5, (128 + 16) / 2 = 72, (255 + 21) / 2 = 138
        10, 16,  21,  // c, (10 + 21) / 2 = 15.5 -> 16, d
    };
    nm_image dst;
    NM_CHECK(nm_image_resize(&src, 3, 3, NM_RESIZE_BILINEAR, &dst) == NM_OK);
    for (int i = 0; dst.rgb && i < 9; i++)
        for (int c = 0; c < 3; c++) NM_CHECK(dst.rgb[3 * i + c] == want[i]);
    nm_image_free(&dst);
    // same size: a copy; a change along one axis only filters that axis
    NM_CHECK(nm_image_resize(&src, 2, 2, NM_RESIZE_LANCZOS, &dst) == NM_OK && !memcmp(dst.rgb, src.rgb, 12));
    nm_image_free(&dst);
    NM_CHECK(nm_image_resize(&src, 3, 2, NM_RESIZE_BILINEAR, &dst) == NM_OK);
    NM_CHECK(dst.rgb && dst.rgb[3 * 1] == 128 && dst.rgb[3 * 4] == 16 && dst.rgb[3 * 3] == 10);
    nm_image_free(&dst);
    NM_CHECK(nm_image_resize(&src, 0, 2, NM_RESIZE_BILINEAR, &dst) == NM_ERR_RANGE && dst.rgb == NULL);
    NM_CHECK(nm_image_resize(&src, 2, 70000, NM_RESIZE_BILINEAR, &dst) == NM_ERR_RANGE);
    NM_CHECK(nm_image_resize(&src, 2, 2, (nm_resize)7, &dst) == NM_ERR_INVALID_ARG);
    nm_image_free(&src);
}

static double kern(int algo, double x) {
    x = fabs(x);
    if (algo == NM_RESIZE_BICUBIC) { // Keys, a = -0.5
        if (x < 1) return 1.5 * x * x * x - 2.5 * x * x + 1;
        if (x < 2) return -0.5 * x * x * x + 2.5 * x * x - 4 * x + 2;
        return 0;
    }
    if (x == 0) return 1;
    if (x >= 3) return 0;
    return 3 * sin(M_PI * x) * sin(M_PI * x / 3) / (M_PI * M_PI * x * x);
}

// One row resized horizontally (height kept, so one pass), against a direct
// evaluation of the filter in double: exact up to the fixed-point rounding.
NM_TEST(resize_bicubic_lanczos_match_kernel_formula) {
    const int in_w = 37;
    nm_image src;
    NM_CHECK(nm_image_alloc(in_w, 1, &src) == NM_OK);
    uint32_t seed = 99;
    for (int i = 0; i < in_w * 3; i++) src.rgb[i] = (uint8_t)(rng(&seed) & 255);
    const int outs[] = {11, 24, 37 * 2 + 5, 160};
    for (int algo = NM_RESIZE_BICUBIC; algo <= NM_RESIZE_LANCZOS; algo++)
        for (size_t k = 0; k < sizeof outs / sizeof outs[0]; k++) {
            int ow = outs[k];
            nm_image dst;
            NM_CHECK(nm_image_resize(&src, ow, 1, algo, &dst) == NM_OK);
            if (!dst.rgb) continue;
            double scale = (double)in_w / ow, fs = scale > 1 ? scale : 1;
            double support = (algo == NM_RESIZE_BICUBIC ? 2 : 3) * fs;
            int exact = 0, worst = 0;
            for (int x = 0; x < ow; x++) {
                double center = (x + 0.5) * scale;
                for (int c = 0; c < 3; c++) {
                    double sw = 0, sv = 0;
                    for (int j = 0; j < in_w; j++) { // every input pixel whose centre is in reach
                        double d = (j + 0.5 - center) / fs;
                        if (fabs(j + 0.5 - center) >= support + 0.5) continue;
                        double wgt = kern(algo, d);
                        sw += wgt;
                        sv += wgt * src.rgb[3 * j + c];
                    }
                    double v = sv / sw;
                    int want = v < 0 ? 0 : v > 255 ? 255 : (int)floor(v + 0.5);
                    int e = abs(dst.rgb[3 * x + c] - want);
                    if (e > worst) worst = e;
                    exact += e == 0;
                }
            }
            NM_CHECK(worst <= 1);
            NM_CHECK(exact >= ow * 3 * 9 / 10);
            nm_image_free(&dst);
        }
    nm_image_free(&src);
}

NM_TEST(resize_pad_fits_and_centres) {
    nm_image src, dst;
    NM_CHECK(nm_image_alloc(200, 100, &src) == NM_OK);
    memset(src.rgb, 50, 200 * 100 * 3);
    const uint8_t pad[3] = {122, 116, 104};
    // scale min(64/200, 64/100) = 0.32: 64 x 32, centred at y = 16
    NM_CHECK(nm_image_resize_pad(&src, 64, 64, NM_RESIZE_BICUBIC, pad, &dst) == NM_OK);
    int ok = 1;
    for (int y = 0; dst.rgb && y < 64; y++)
        for (int x = 0; x < 64; x++) {
            const uint8_t *p = dst.rgb + (y * 64 + x) * 3;
            if (y >= 16 && y < 48) ok &= p[0] == 50 && p[1] == 50 && p[2] == 50;
            else ok &= p[0] == 122 && p[1] == 116 && p[2] == 104;
        }
    NM_CHECK(ok);
    nm_image_free(&dst);
    // 3 x 7 into 10 x 10: scale 10/7, width ceil(3 * 1.4285715) = 5, at x = 2
    nm_image_free(&src);
    NM_CHECK(nm_image_alloc(3, 7, &src) == NM_OK);
    memset(src.rgb, 9, 3 * 7 * 3);
    NM_CHECK(nm_image_resize_pad(&src, 10, 10, NM_RESIZE_BILINEAR, pad, &dst) == NM_OK);
    for (int x = 0; dst.rgb && x < 10; x++) NM_CHECK(dst.rgb[(5 * 10 + x) * 3] == ((x >= 2 && x < 7) ? 9 : 122));
    nm_image_free(&dst);
    nm_image_free(&src);
}

NM_TEST(to_f32_planar_normalized) {
    nm_image im;
    NM_CHECK(nm_image_alloc(3, 2, &im) == NM_OK);
    for (int i = 0; i < 18; i++) im.rgb[i] = (uint8_t)(i * 14);
    const float mean[3] = {0.5f, 0.25f, 0.0f}, sd[3] = {0.5f, 2.0f, 1.0f};
    float out[18];
    nm_image_to_f32(&im, mean, sd, out);
    for (int i = 0; i < 6; i++)
        for (int c = 0; c < 3; c++) {
            float want = ((float)im.rgb[3 * i + c] / 255.0f - mean[c]) / sd[c];
            NM_CHECK(memcmp(&out[c * 6 + i], &want, 4) == 0);
        }
    float sq[12];
    nm_image_rect_to_f32(&im, 1, 0, 2, mean, sd, sq); // the 2x2 square at x = 1
    NM_CHECK(sq[0] == out[1] && sq[1] == out[2] && sq[2] == out[4] && sq[3] == out[5]);
    NM_CHECK(sq[4 + 3] == out[6 + 5] && sq[8 + 2] == out[12 + 4]);
    nm_image_free(&im);
}

// ---- preprocessing -------------------------------------------------------------------

static nm_image_params params(nm_clip_proj proj, int S, int L) {
    nm_image_params p = {.proj = proj, .image_size = S, .longest_edge = L,
                         .mean = {0.5f, 0.5f, 0.5f}, .std = {0.5f, 0.5f, 0.5f}, .pad = {122, 116, 104}};
    return p;
}

NM_TEST(preprocess_mlp) {
    nm_image im;
    NM_CHECK(nm_image_alloc(30, 15, &im) == NM_OK);
    for (int i = 0; i < 30 * 15; i++) { im.rgb[3 * i] = 255; im.rgb[3 * i + 1] = 0; im.rgb[3 * i + 2] = 51; }
    nm_image_params p = params(NM_CLIP_PROJ_MLP, 16, 0);
    nm_image_batch b;
    char err[256];
    NM_CHECK(nm_image_preprocess(&im, &p, &b, err, sizeof err) == NM_OK);
    NM_CHECK(b.n == 1 && b.rows == 0 && b.cols == 0 && b.image_size == 16);
    // 30x15 -> 16x8 at y = 4; pad rows elsewhere. (v/255 - 0.5)/0.5
    for (int y = 0; b.data && y < 16; y++) {
        bool in = y >= 4 && y < 12;
        float r = b.data[y * 16 + 3], g = b.data[256 + y * 16 + 3], bl = b.data[512 + y * 16 + 3];
        NM_CHECK_NEAR(r, in ? 1.0 : (122 / 255.0 - 0.5) / 0.5, 1e-6);
        NM_CHECK_NEAR(g, in ? -1.0 : (116 / 255.0 - 0.5) / 0.5, 1e-6);
        NM_CHECK_NEAR(bl, in ? (51 / 255.0 - 0.5) / 0.5 : (104 / 255.0 - 0.5) / 0.5, 1e-6);
    }
    nm_image_batch_free(&b);
    NM_CHECK(b.data == NULL);
    nm_image_free(&im);
    // an image already S x S goes through untouched
    NM_CHECK(nm_image_alloc(16, 16, &im) == NM_OK);
    for (int i = 0; i < 16 * 16 * 3; i++) im.rgb[i] = (uint8_t)(i * 31);
    NM_CHECK(nm_image_preprocess(&im, &p, &b, err, sizeof err) == NM_OK);
    float *direct = malloc(sizeof(float) * 3 * 256);
    nm_image_to_f32(&im, p.mean, p.std, direct);
    NM_CHECK(b.data && !memcmp(direct, b.data, sizeof(float) * 3 * 256));
    free(direct);
    nm_image_batch_free(&b);
    nm_image_free(&im);
}

NM_TEST(preprocess_idefics3_grid) {
    // (w, h, S, L) -> rows x cols: L / aspect truncated, then made even, then ceil(/ S)
    const struct { int w, h, S, L, rows, cols; } cases[] = {
        {1000, 1000, 512, 1536, 3, 3},
        {2000, 1000, 512, 1536, 2, 3},  // 1536 x 768
        {1000, 3000, 512, 1536, 3, 1},  // 512 x 1536
        {640, 480, 512, 1536, 3, 3},    // 1536 x 1152
        {100, 37, 512, 1536, 2, 3},     // 1536 x 568
        {300, 200, 384, 1536, 3, 4},    // 1536 x 1024
        {512, 512, 512, 2048, 4, 4},    // upscaled to the longest edge
        {1537, 511, 512, 512, 1, 1},    // 512 x 170
        {1000, 500, 512, 0, 1, 2},      // old file: 1000/512 -> 2, 500/512 -> 1
        {100, 900, 512, 0, 2, 1},       // 0.195 -> at least 1; 1.76 -> 2
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        nm_image_params p = params(NM_CLIP_PROJ_IDEFICS3, cases[k].S, cases[k].L);
        int32_t rows = -1, cols = -1;
        NM_CHECK(nm_image_idefics3_grid(cases[k].w, cases[k].h, &p, &rows, &cols) == NM_OK);
        if (rows != cases[k].rows || cols != cases[k].cols)
            fprintf(stderr, "  case %zu: %dx%d, want %dx%d\n", k, rows, cols, cases[k].rows, cases[k].cols);
        NM_CHECK(rows == cases[k].rows && cols == cases[k].cols);
    }
    nm_image_params p = params(NM_CLIP_PROJ_IDEFICS3, 512, 1536);
    int32_t rows, cols;
    NM_CHECK(nm_image_idefics3_grid(10000, 1, &p, &rows, &cols) == NM_ERR_RANGE); // 1536 x 0
    NM_CHECK(nm_image_idefics3_grid(0, 1, &p, &rows, &cols) == NM_ERR_INVALID_ARG);
    p.longest_edge = 65536;
    p.image_size = 16;
    NM_CHECK(nm_image_idefics3_grid(100, 100, &p, &rows, &cols) == NM_ERR_RANGE); // 4096^2 tiles
    p = params(NM_CLIP_PROJ_MLP, 512, 0);
    NM_CHECK(nm_image_idefics3_grid(100, 100, &p, &rows, &cols) == NM_ERR_INVALID_ARG);
}

NM_TEST(preprocess_idefics3_tiles_in_order) {
    // 2:1 image, left half red, right half blue, L = 4S: 4 x 2 tiles.
    const int S = 16, L = 64;
    nm_image im;
    NM_CHECK(nm_image_alloc(80, 40, &im) == NM_OK);
    for (int y = 0; y < 40; y++)
        for (int x = 0; x < 80; x++) {
            uint8_t *o = im.rgb + (y * 80 + x) * 3;
            o[0] = x < 40 ? 255 : 0;
            o[1] = (uint8_t)(y < 20 ? 0 : 255); // top half green = 0, bottom 255
            o[2] = x < 40 ? 0 : 255;
        }
    nm_image_params p = params(NM_CLIP_PROJ_IDEFICS3, S, L);
    nm_image_batch b;
    char err[256];
    NM_CHECK(nm_image_preprocess(&im, &p, &b, err, sizeof err) == NM_OK);
    NM_CHECK(b.rows == 2 && b.cols == 4 && b.n == 9 && b.image_size == S);
    const size_t per = 3 * S * S;
    for (int t = 0; b.data && t < 8; t++) {
        int r = t / 4, c = t % 4;
        const float *img = b.data + t * per;
        float red = img[(S / 2) * S + S / 2], green = img[S * S + (S / 2) * S + S / 2];
        NM_CHECK_NEAR(red, c < 2 ? 1.0 : -1.0, 1e-6);   // tile centres are far from the edges
        NM_CHECK_NEAR(green, r == 0 ? -1.0 : 1.0, 1e-6);
    }
    if (b.data) { // the global image (last) is the whole picture shrunk: red on the left, blue on the right
        const float *g = b.data + 8 * per;
        NM_CHECK_NEAR(g[(S / 4) * S + 1], 1.0, 1e-6);
        NM_CHECK_NEAR(g[2 * S * S + (S / 4) * S + S - 2], 1.0, 1e-6);
    }
    nm_image_batch_free(&b);
    // too thin to tile: an error, not a crash
    nm_image thin;
    NM_CHECK(nm_image_alloc(200, 1, &thin) == NM_OK);
    memset(thin.rgb, 0, 600);
    NM_CHECK(nm_image_preprocess(&thin, &p, &b, err, sizeof err) == NM_ERR_RANGE && b.data == NULL && err[0]);
    nm_image_free(&thin);
    // bad params
    p.image_size = 0;
    NM_CHECK(nm_image_preprocess(&im, &p, &b, err, sizeof err) == NM_ERR_INVALID_ARG);
    p = params(NM_CLIP_PROJ_IDEFICS3, S, L);
    p.std[1] = 0;
    NM_CHECK(nm_image_preprocess(&im, &p, &b, err, sizeof err) == NM_ERR_INVALID_ARG);
    p.proj = (nm_clip_proj)9;
    NM_CHECK(nm_image_preprocess(&im, &p, &b, err, sizeof err) == NM_ERR_INVALID_ARG);
    nm_image_free(&im);
}

// ---- mlp anyres (LLaVA-1.6 / OneVision pinpoints) -------------------------------------------

static nm_image_params anyres_params(int S, int n, const int32_t (*pins)[2]) {
    nm_image_params p = params(NM_CLIP_PROJ_MLP, S, 0);
    p.n_pinpoints = n;
    for (int i = 0; i < n; i++) p.pinpoints[i][0] = pins[i][0], p.pinpoints[i][1] = pins[i][1];
    return p;
}

NM_TEST(anyres_best_resolution) {
    // llama.cpp's select_best_resolution, by hand: the most pixels kept, then the
    // least padding, then the first listed
    static const int32_t p4[4][2] = {{64, 128}, {128, 64}, {128, 128}, {192, 64}};
    static const int32_t sq[4][2] = {{64, 32}, {32, 64}, {64, 64}, {96, 96}};
    static const int32_t pad2[2][2] = {{128, 64}, {64, 64}};
    static const int32_t first[2][2] = {{64, 128}, {128, 64}};
    static const int32_t up[3][2] = {{32, 16}, {16, 32}, {32, 32}};
    const struct { int S, n; const int32_t (*pins)[2]; int w, h, rw, rh; } cases[] = {
        {64, 4, p4, 150, 90, 128, 128},  // 128x76 kept beats 106x64 and 64x38
        {32, 4, sq, 100, 100, 96, 96},   // the largest keeps the most
        {64, 2, pad2, 64, 64, 64, 64},   // same pixels kept (all): the one with no padding
        {64, 2, first, 64, 64, 64, 128}, // same pixels, same padding: the first
        {16, 3, up, 40, 20, 32, 16},     // upscaled 0.8x to 32x16 either way: the exact fit
        {16, 3, up, 20, 40, 16, 32},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        nm_image_params p = anyres_params(cases[k].S, cases[k].n, cases[k].pins);
        int32_t rw = 0, rh = 0;
        NM_CHECK(nm_image_anyres_resolution(cases[k].w, cases[k].h, &p, &rw, &rh) == NM_OK);
        if (rw != cases[k].rw || rh != cases[k].rh) fprintf(stderr, "  case %zu: %dx%d\n", k, rw, rh);
        NM_CHECK(rw == cases[k].rw && rh == cases[k].rh);
    }
    nm_image_params p = params(NM_CLIP_PROJ_MLP, 16, 0);
    NM_CHECK(nm_image_anyres_resolution(40, 20, &p, NULL, NULL) == NM_ERR_INVALID_ARG); // no pinpoints
    p = anyres_params(16, 3, up);
    NM_CHECK(nm_image_anyres_resolution(0, 20, &p, NULL, NULL) == NM_ERR_INVALID_ARG);
}

static bool same_floats(const float *a, const float *b, size_t n) { return !memcmp(a, b, n * sizeof(float)); }

NM_TEST(preprocess_anyres_tiles_then_overview) {
    static const int32_t up[3][2] = {{32, 16}, {16, 32}, {32, 32}};
    const int S = 16;
    const size_t per = 3 * S * S;
    nm_image_params p = anyres_params(S, 3, up);
    nm_image im;
    NM_CHECK(nm_image_alloc(40, 20, &im) == NM_OK);
    for (int i = 0; i < 40 * 20 * 3; i++) im.rgb[i] = (uint8_t)(i * 7 + i / 120);
    nm_image_batch b;
    char err[256];
    NM_CHECK(nm_image_preprocess(&im, &p, &b, err, sizeof err) == NM_OK);
    NM_CHECK(b.n == 3 && b.rows == 1 && b.cols == 2 && b.image_size == S);
    // tiles: crops of the image fitted in 32x16 on black; the overview: a stretch to S x S
    nm_image refined, ov;
    const uint8_t black[3] = {0, 0, 0};
    NM_CHECK(nm_image_resize_pad(&im, 32, 16, NM_RESIZE_BICUBIC, black, &refined) == NM_OK);
    NM_CHECK(nm_image_resize(&im, S, S, NM_RESIZE_BICUBIC, &ov) == NM_OK);
    float *want = malloc(per * sizeof(float));
    for (int t = 0; b.data && t < 2; t++) {
        nm_image_rect_to_f32(&refined, t * S, 0, S, p.mean, p.std, want);
        NM_CHECK(same_floats(want, b.data + t * per, per));
    }
    nm_image_rect_to_f32(&ov, 0, 0, S, p.mean, p.std, want);
    NM_CHECK(b.data && same_floats(want, b.data + 2 * per, per));
    nm_image_batch_free(&b);
    nm_image_free(&refined);
    nm_image_free(&ov);
    nm_image_free(&im);
    // an image within S x S: the overview alone, stretched (not fitted on the pad colour as plain mlp)
    NM_CHECK(nm_image_alloc(16, 10, &im) == NM_OK);
    for (int i = 0; i < 16 * 10 * 3; i++) im.rgb[i] = (uint8_t)(i * 13);
    NM_CHECK(nm_image_preprocess(&im, &p, &b, err, sizeof err) == NM_OK);
    NM_CHECK(b.n == 1 && b.rows == 0 && b.cols == 0);
    NM_CHECK(nm_image_resize(&im, S, S, NM_RESIZE_BICUBIC, &ov) == NM_OK);
    nm_image_rect_to_f32(&ov, 0, 0, S, p.mean, p.std, want);
    NM_CHECK(b.data && same_floats(want, b.data, per));
    nm_image_batch_free(&b);
    nm_image_free(&ov);
    // pinpoints that are not multiples of S are refused
    p.pinpoints[1][0] = 24;
    NM_CHECK(nm_image_preprocess(&im, &p, &b, err, sizeof err) == NM_ERR_INVALID_ARG && b.data == NULL);
    nm_image_free(&im);
    free(want);
}

NM_TEST(params_from_clip) {
    nm_clip_info ci = {0};
    ci.proj = NM_CLIP_PROJ_MLP;
    ci.image_size = 336;
    ci.preproc_image_size = 999;
    ci.mean[1] = 0.25f;
    ci.std[2] = 0.75f;
    ci.n_pinpoints = 2;
    ci.pinpoints[1][0] = 1008;
    ci.pinpoints[1][1] = 336;
    nm_image_params p = nm_image_params_from_clip(&ci);
    NM_CHECK(p.proj == NM_CLIP_PROJ_MLP && p.image_size == 336 && p.longest_edge == 0);
    NM_CHECK(p.n_pinpoints == 2 && p.pinpoints[1][0] == 1008 && p.pinpoints[1][1] == 336);
    NM_CHECK(p.pad[0] == 122 && p.pad[1] == 116 && p.pad[2] == 104 && p.mean[1] == 0.25f && p.std[2] == 0.75f);
    ci.proj = NM_CLIP_PROJ_IDEFICS3;
    p = nm_image_params_from_clip(&ci);
    NM_CHECK(p.longest_edge == 999 && p.pad[0] == 0 && p.n_pinpoints == 0); // idefics3 ignores them, as llama.cpp
}

// ---- corpus and samples ------------------------------------------------------------------

static void write_file(const char *dir, const char *name, const void *d, size_t n) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(d, 1, n, f) != n) fprintf(stderr, "  cannot write %s\n", path);
    if (f) fclose(f);
}

// Small seeds (< 4 KB): one of each kind the decoders branch on, plus broken ones.
NM_TEST_OPTIN(gen_corpus, "NM_GEN_CORPUS") {
    const char *dir = getenv("NM_GEN_CORPUS");
    mkdir(dir, 0755);
    const int w = 12, h = 9;
    uint8_t *rgb = rgb_pic(w, h), *rgba = malloc((size_t)w * h * 4), *s16 = malloc((size_t)w * h * 6);
    uint8_t *gray = malloc((size_t)w * h);
    for (int i = 0; i < w * h; i++) {
        memcpy(rgba + 4 * i, rgb + 3 * i, 3);
        rgba[4 * i + 3] = (uint8_t)(i * 7);
        gray[i] = rgb[3 * i];
    }
    for (int i = 0; i < w * h * 3; i++) { s16[2 * i] = rgb[i]; s16[2 * i + 1] = (uint8_t)(i * 3); }
    png_color pal[4] = {{0, 0, 0}, {255, 0, 0}, {0, 255, 0}, {9, 9, 200}};
    uint8_t pal_a[4] = {0, 128, 255, 7};
    uint8_t idx2[3 * 9];
    for (int i = 0; i < 27; i++) idx2[i] = (uint8_t)(i * 0x1b);
    png_color_16 key = {0, 1, 2, 3, 4};
    typedef struct { const char *name; buf b; } seed;
    seed f[32];
    int n = 0;
    f[n++] = (seed){"rgb8.png", png_encode(w, h, PNG_COLOR_TYPE_RGB, 8, 0, rgb, NULL, 0, NULL, 0, NULL)};
    f[n++] = (seed){"rgba8.png", png_encode(w, h, PNG_COLOR_TYPE_RGBA, 8, 0, rgba, NULL, 0, NULL, 0, NULL)};
    f[n++] = (seed){"rgb16.png", png_encode(w, h, PNG_COLOR_TYPE_RGB, 16, 0, s16, NULL, 0, NULL, 0, NULL)};
    f[n++] = (seed){"gray8.png", png_encode(w, h, PNG_COLOR_TYPE_GRAY, 8, 0, gray, NULL, 0, NULL, 0, &key)};
    f[n++] = (seed){"gray-alpha8.png", png_encode(w, h / 3, PNG_COLOR_TYPE_GRAY_ALPHA, 8, 0, rgba, NULL, 0, NULL, 0, NULL)};
    f[n++] = (seed){"gray2.png", png_encode(w, h, PNG_COLOR_TYPE_GRAY, 2, 0, idx2, NULL, 0, NULL, 0, NULL)};
    f[n++] = (seed){"palette2-trns.png", png_encode(w, h, PNG_COLOR_TYPE_PALETTE, 2, 0, idx2, pal, 4, pal_a, 4, NULL)};
    f[n++] = (seed){"rgb8-adam7.png", png_encode(w, h, PNG_COLOR_TYPE_RGB, 8, 1, rgb, NULL, 0, NULL, 0, NULL)};
    f[n++] = (seed){"420.jpg", jpeg_encode(w, h, 3, rgb, 75, 0, 0, 0)};
    f[n++] = (seed){"444.jpg", jpeg_encode(w, h, 3, rgb, 90, 1, 0, 0)};
    f[n++] = (seed){"progressive.jpg", jpeg_encode(w, h, 3, rgb, 75, 0, 1, 0)};
    f[n++] = (seed){"gray.jpg", jpeg_encode(w, h, 1, gray, 75, 0, 0, 0)};
    f[n++] = (seed){"cmyk.jpg", jpeg_encode(w / 2, h / 2, 4, rgba, 75, 0, 0, 0)};
    f[n++] = (seed){"ycck.jpg", jpeg_encode(w / 2, h / 2, 4, rgba, 75, 0, 0, 1)};
    f[n++] = (seed){"411.jpg", jpeg_encode_opt(w, h, 3, rgb, (jopt){.h0 = 4, .v0 = 1})};
    f[n++] = (seed){"arith.jpg", jpeg_encode_opt(w, h, 3, rgb, (jopt){.arith = 1, .progressive = 1})};
    f[n++] = (seed){"rgb-adobe.jpg", jpeg_encode_opt(w, h, 3, rgb, (jopt){.stored_rgb = 1, .h0 = 1, .v0 = 1})};
    f[n++] = (seed){"restart.jpg", jpeg_encode_opt(w, h, 3, rgb, (jopt){.restart = 1})};
    uint16_t s[12 * 9 * 3];
    for (int i = 0; i < w * h * 3; i++) s[i] = rgb[i];
    f[n++] = (seed){"p6.ppm", pnm_encode('6', w, h, 255, s, "# seed")};
    f[n++] = (seed){"p5.pgm", pnm_encode('5', w, h, 255, s, NULL)};
    f[n++] = (seed){"p3.ppm", pnm_encode('3', 4, 3, 255, s, "# ascii")};
    f[n++] = (seed){"p2.pgm", pnm_encode('2', 5, 4, 255, s, NULL)};
    for (int i = 0; i < w * h * 3; i++) s[i] = (uint16_t)(rgb[i] * 257 + i);
    f[n++] = (seed){"p6-16bit.ppm", pnm_encode('6', w / 2, h / 2, 65535, s, NULL)};
    for (int i = 0; i < w * h * 3; i++) s[i] = rgb[i] % 16;
    f[n++] = (seed){"p3-maxval15.ppm", pnm_encode('3', 3, 2, 15, s, NULL)};
    for (int i = 0; i < n; i++) write_file(dir, f[i].name, f[i].b.p, f[i].b.n);
    // broken ones: truncated PNG / JPEG / PPM, a flipped CRC, a bad Huffman table
    write_file(dir, "rgb8-trunc.png", f[0].b.p, f[0].b.n / 2);
    write_file(dir, "420-trunc.jpg", f[8].b.p, f[8].b.n * 2 / 3);
    write_file(dir, "p6-trunc.ppm", f[18].b.p, f[18].b.n - 5);
    f[0].b.p[40] ^= 0x55;
    write_file(dir, "rgb8-badcrc.png", f[0].b.p, f[0].b.n);
    // JPEG scan data has no checksum (libjpeg-turbo even supplies missing
    // Huffman tables), so break the frame header: sample precision 7.
    for (size_t i = 0; i + 4 < f[9].b.n; i++)
        if (f[9].b.p[i] == 0xff && f[9].b.p[i + 1] == 0xc0) {
            f[9].b.p[i + 4] = 7;
            break;
        }
    write_file(dir, "444-corrupt.jpg", f[9].b.p, f[9].b.n);
    write_file(dir, "gif.gif", "GIF89a\x01\0\x01\0\0\0\0;", 14);
    write_file(dir, "p6-huge.ppm", "P6 16384 16384 255\n\0\0\0", 23);
    for (int i = 0; i < n; i++) free(f[i].b.p);
    free(rgb);
    free(rgba);
    free(s16);
    free(gray);
}

// The checked-in seeds are what their names say: broken ones are rejected,
// the others decode (so the fuzzer starts from inputs that reach the pixels).
NM_TEST(corpus_seeds_as_named) {
    const char *names[] = {"rgb8.png", "rgba8.png", "rgb16.png", "gray8.png", "gray-alpha8.png", "gray2.png",
                           "palette2-trns.png", "rgb8-adam7.png", "420.jpg", "444.jpg", "progressive.jpg",
                           "gray.jpg", "cmyk.jpg", "ycck.jpg", "411.jpg", "arith.jpg", "rgb-adobe.jpg",
                           "restart.jpg", "p6.ppm", "p5.pgm", "p3.ppm", "p2.pgm",
                           "p6-16bit.ppm", "p3-maxval15.ppm", "rgb8-trunc.png", "420-trunc.jpg",
                           "p6-trunc.ppm", "rgb8-badcrc.png", "444-corrupt.jpg", "gif.gif", "p6-huge.ppm"};
    int n_ok = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[256], err[256];
        snprintf(path, sizeof path, "tests/fuzz/corpus/image/%s", names[i]);
        if (access(path, F_OK) != 0) NM_SKIP_MISSING("corpus not found (run from the repository root)");
        bool broken = strstr(names[i], "trunc") || strstr(names[i], "bad") || strstr(names[i], "corrupt") ||
                      strstr(names[i], "gif") || strstr(names[i], "huge");
        nm_image im;
        nm_status st = nm_image_load(path, &im, err, sizeof err);
        if ((st == NM_OK) == broken) fprintf(stderr, "  %s: %s\n", names[i], st == NM_OK ? "decoded" : err);
        NM_CHECK((st == NM_OK) != broken);
        n_ok += st == NM_OK;
        nm_image_free(&im);
    }
    NM_CHECK(n_ok == 24);
}

// Larger images for the golden check (see docs/correctness.md): PNG and JPEG
// of a few shapes and kinds.
NM_TEST_OPTIN(gen_samples, "NM_IMAGE_SAMPLES") {
    const char *dir = getenv("NM_IMAGE_SAMPLES");
    mkdir(dir, 0755);
    const struct { int w, h; } sz[] = {{640, 480}, {333, 777}, {1280, 300}, {64, 64}, {500, 500}};
    for (size_t k = 0; k < sizeof sz / sizeof sz[0]; k++) {
        int w = sz[k].w, h = sz[k].h;
        uint8_t *rgb = malloc((size_t)w * h * 3), *rgba = malloc((size_t)w * h * 4);
        uint32_t seed = 1234 + (uint32_t)k;
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++)
                for (int c = 0; c < 3; c++) {
                    int v = pic(x, y, c, w, h) + (int)(rng(&seed) % 21) - 10; // some noise
                    rgb[((size_t)y * w + x) * 3 + c] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
                }
        for (size_t i = 0; i < (size_t)w * h; i++) {
            memcpy(rgba + 4 * i, rgb + 3 * i, 3);
            rgba[4 * i + 3] = (uint8_t)(i * 13);
        }
        char name[64];
        buf b = png_encode(w, h, k == 1 ? PNG_COLOR_TYPE_RGBA : PNG_COLOR_TYPE_RGB, 8, k == 2, k == 1 ? rgba : rgb,
                           NULL, 0, NULL, 0, NULL);
        snprintf(name, sizeof name, "s%zu-%dx%d.png", k, w, h);
        write_file(dir, name, b.p, b.n);
        free(b.p);
        b = jpeg_encode(w, h, 3, rgb, 90, k == 3, k == 4, 0);
        snprintf(name, sizeof name, "s%zu-%dx%d.jpg", k, w, h);
        write_file(dir, name, b.p, b.n);
        free(b.p);
        free(rgb);
        free(rgba);
    }
    // JPEG layouts the reconstruction branches on: sampling factors, odd sizes,
    // stored RGB, 4 channels with and without the Adobe marker, restarts.
    const struct { int w, h, nc; jopt o; const char *name; } jv[] = {
        {97, 61, 3, {.h0 = 2, .v0 = 1}, "j422"},
        {97, 61, 3, {.h0 = 1, .v0 = 2}, "j440"},
        {97, 61, 3, {.h0 = 4, .v0 = 1}, "j411"},
        {97, 61, 3, {.h0 = 2, .v0 = 2, .progressive = 1, .quality = 40}, "j420p"},
        {1, 1, 3, {0}, "j420-1x1"},
        {2, 1, 3, {0}, "j420-2x1"},
        {17, 33, 3, {0}, "j420-17x33"},
        {250, 3, 3, {.restart = 1}, "j420-rst"},
        {40, 30, 3, {.stored_rgb = 1}, "jrgb"},
        {40, 30, 4, {.no_adobe = 1}, "jcmyk-noadobe"},
        {40, 30, 4, {.ycck = 1, .h0 = 2, .v0 = 2}, "jycck420"},
        {40, 30, 1, {.quality = 95}, "jgray"},
        {40, 30, 3, {.arith = 1}, "jarith"},
    };
    for (size_t k = 0; k < sizeof jv / sizeof jv[0]; k++) {
        uint8_t *px = malloc((size_t)jv[k].w * jv[k].h * jv[k].nc);
        uint32_t seed = 77 + (uint32_t)k;
        for (int y = 0; y < jv[k].h; y++)
            for (int x = 0; x < jv[k].w; x++)
                for (int c = 0; c < jv[k].nc; c++)
                    px[((size_t)y * jv[k].w + x) * jv[k].nc + c] = (uint8_t)(pic(x, y, c % 3, jv[k].w, jv[k].h) ^ (rng(&seed) & 15));
        buf b = jpeg_encode_opt(jv[k].w, jv[k].h, jv[k].nc, px, jv[k].o);
        char name[64];
        snprintf(name, sizeof name, "%s-%dx%d.jpg", jv[k].name, jv[k].w, jv[k].h);
        write_file(dir, name, b.p, b.n);
        free(b.p);
        free(px);
    }
}

// ---- against llama.cpp: decoding and preprocessing, bit for bit -------------------
// tests/data/image_golden/llama.txt (README there): for 11 mmproj configurations
// (mlp S 336 / 224; idefics3 S 512 / 384 with longest edge 1536 / 2048 / none;
// mlp anyres with 5 pinpoint sets) and 51 images (tests/data/image_golden and
// the fuzz corpus), llama.cpp's stb decode (W, H, an FNV-1a hash of the RGB
// bytes) and mtmd preprocessing (images, grid, a hash of every float, planar,
// tiles row-major then the overview), or "refused" where stb refuses the file.
// Ours: nm_image_load + nm_image_preprocess with the parameters nm_clip_load
// reads from the same configuration, written by nm_genmmproj_write.
typedef struct golden_cfg {
    const char *name, *proj;
    int32_t image_size, patch_size, scale_factor, preproc;
    const char *pinpoints; // "W,H,W,H,..." or NULL
} golden_cfg;

static const golden_cfg GOLDEN_CFGS[] = {
    {"mlp336", "mlp", 336, 14, 0, 0, NULL},
    {"mlp224", "mlp", 224, 14, 0, 0, NULL},
    {"id512-1536", "idefics3", 512, 16, 4, 1536, NULL},
    {"id384-1536", "idefics3", 384, 16, 4, 1536, NULL},
    {"id512-2048", "idefics3", 512, 16, 4, 2048, NULL},
    {"id512-none", "idefics3", 512, 16, 4, -1, NULL},
    {"any336", "mlp", 336, 14, 0, 0, "336,672,672,336,672,672,1008,336,336,1008"},
    {"any384", "mlp", 384, 16, 0, 0, "ONEVISION"}, // every c x r grid, 1..6 each
    {"any64", "mlp", 64, 16, 0, 0, "64,128,128,64,128,128,192,64,64,192"},
    {"any32", "mlp", 32, 16, 0, 0, "32,64,64,32,64,64,96,96"},
    {"any16", "mlp", 16, 16, 0, 0, "16,32,32,16,32,32,48,16"},
};

// Known, intended differences (docs/correctness.md, "Image decoding"): stb
// accepts the truncated JPEG (we refuse it), and keeps the low byte of each
// big-endian 16-bit PPM sample (we scale the value).
static bool golden_known_difference(const char *path) {
    return strstr(path, "420-trunc.jpg") != NULL || strstr(path, "p6-16bit.ppm") != NULL;
}

static uint64_t golden_fnv(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static nm_clip *golden_clip(const golden_cfg *g) {
    nm_genmmproj_params p = nm_genmmproj_default_params(g->proj);
    p.image_size = g->image_size;
    p.patch_size = g->patch_size;
    p.n_embd = 32;
    p.n_ff = 64;
    p.n_head = 2;
    p.n_layer = 2;
    p.n_out_embd = 64;
    p.seed = 1;
    if (g->scale_factor) p.scale_factor = g->scale_factor;
    p.preproc_image_size = g->preproc;
    if (g->pinpoints && !strcmp(g->pinpoints, "ONEVISION")) {
        for (int r = 1; r <= 6; r++)
            for (int c = 1; c <= 6; c++) {
                p.pinpoints[p.n_pinpoints][0] = g->image_size * c;
                p.pinpoints[p.n_pinpoints++][1] = g->image_size * r;
            }
    } else if (g->pinpoints) {
        const char *q = g->pinpoints;
        while (*q) {
            char *end;
            int32_t w = (int32_t)strtol(q, &end, 10), h = (int32_t)strtol(end + 1, &end, 10);
            p.pinpoints[p.n_pinpoints][0] = w;
            p.pinpoints[p.n_pinpoints++][1] = h;
            q = *end ? end + 1 : end;
        }
    }
    char path[128], err[256];
    snprintf(path, sizeof path, "/tmp/nm-test-image-golden-%d.gguf", (int)getpid());
    nm_clip *c = NULL;
    if (nm_genmmproj_write(path, &p, err, sizeof err) != NM_OK || nm_clip_load(path, NULL, 1, &c, err, sizeof err) != NM_OK)
        fprintf(stderr, "  %s: %s\n", g->name, err);
    unlink(path);
    return c;
}

NM_TEST(preprocess_equals_llama_cpp) {
    FILE *f = fopen("tests/data/image_golden/llama.txt", "r");
    if (!f) NM_SKIP_MISSING("tests/data/image_golden/llama.txt not found (run from the repository root)");
    char line[512], cfg[32], path[256], cur[32] = "";
    nm_clip *c = NULL;
    nm_image_params ip;
    int n_same = 0, n_known = 0, n_refused = 0, n_lines = 0;
    while (fgets(line, sizeof line, f)) {
        int w, h, n, rows, cols, off = 0;
        unsigned long long hdec, hpre;
        if (sscanf(line, "%31s %255s %n", cfg, path, &off) != 2) {
            NM_CHECK(!"a malformed line");
            break;
        }
        n_lines++;
        if (strcmp(cfg, cur)) {
            nm_clip_free(c);
            c = NULL;
            for (size_t i = 0; i < sizeof GOLDEN_CFGS / sizeof GOLDEN_CFGS[0]; i++)
                if (!strcmp(GOLDEN_CFGS[i].name, cfg)) c = golden_clip(&GOLDEN_CFGS[i]);
            NM_CHECK(c != NULL);
            if (!c) break;
            ip = nm_image_params_from_clip(nm_clip_get_info(c));
            snprintf(cur, sizeof cur, "%s", cfg);
        }
        if (!strncmp(line + off, "refused", 7)) { // stb refuses it; what we do is tested elsewhere
            n_refused++;
            continue;
        }
        if (sscanf(line + off, "dec %d %d %llx pre %d %d %d %llx", &w, &h, &hdec, &n, &rows, &cols, &hpre) != 7) {
            NM_CHECK(!"a malformed line");
            break;
        }
        nm_image img = {0};
        nm_image_batch b = {0};
        char err[256];
        bool same = false;
        if (nm_image_load(path, &img, err, sizeof err) == NM_OK &&
            nm_image_preprocess(&img, &ip, &b, err, sizeof err) == NM_OK) {
            const uint64_t d = golden_fnv(1469598103934665603ull, img.rgb, (size_t)img.w * img.h * 3);
            const uint64_t pr = golden_fnv(1469598103934665603ull, b.data, sizeof(float) * (size_t)b.n * 3 *
                                                                                 (size_t)b.image_size * b.image_size);
            same = img.w == w && img.h == h && d == hdec && b.n == n && b.rows == rows && b.cols == cols &&
                   pr == hpre;
        }
        if (golden_known_difference(path)) {
            if (same) fprintf(stderr, "  %s %s: now equal to llama.cpp: remove it from the known differences\n", cfg, path);
            NM_CHECK(!same);
            n_known++;
        } else {
            if (!same) fprintf(stderr, "  %s %s: differs from llama.cpp\n", cfg, path);
            NM_CHECK(same);
            n_same += same;
        }
        nm_image_batch_free(&b);
        nm_image_free(&img);
    }
    nm_clip_free(c);
    fclose(f);
    printf("  %d cases: %d equal bit for bit, %d known differences, %d refused by stb\n", n_lines, n_same, n_known,
           n_refused);
    NM_CHECK(n_lines == 11 * 51);
}

// ---- a camera's pixels (nm_image_from_pixels, nm_image_decode_slot) ----------------------------

// BT.601 limited range to RGB in doubles (the spec's coefficients), clamped and rounded.
static int bt601(int y, int u, int v, int ch) {
    const double Y = 1.164383 * (y - 16), U = u - 128.0, V = v - 128.0;
    const double x = ch == 0 ? Y + 1.596027 * V : ch == 1 ? Y - 0.391762 * U - 0.812968 * V : Y + 2.017232 * U;
    return x < 0 ? 0 : x > 255 ? 255 : (int)(x + 0.5);
}

NM_TEST(pixels_yuyv_grey_rgb_into_rgb) {
    // YUYV: every Y in steps of 3 against U and V in steps of 17, two pixels a pair
    enum { W = 86, H = 17 * 16 / 1 };
    static uint8_t yuyv[H * W * 2];
    int worst = 0;
    for (int r = 0; r < H; r++)
        for (int x = 0; x < W; x += 2) {
            uint8_t *p = yuyv + (r * W + x) * 2;
            p[0] = (uint8_t)(x * 3), p[2] = (uint8_t)(x * 3 + 3), p[1] = (uint8_t)((r % 16) * 17), p[3] = (uint8_t)((r / 16) * 17);
        }
    nm_image img = {0};
    NM_CHECK(nm_image_from_pixels(yuyv, sizeof yuyv, H, W, 2, 0, &img, NULL, 0) == NM_OK && img.w == W && img.h == H);
    for (int r = 0; r < H && img.rgb; r++)
        for (int x = 0; x < W; x++) {
            const uint8_t *p = yuyv + (r * W + (x & ~1)) * 2;
            for (int ch = 0; ch < 3; ch++) {
                const int d = abs(img.rgb[(r * W + x) * 3 + ch] - bt601(p[(x & 1) * 2], p[1], p[3], ch));
                worst = d > worst ? d : worst;
            }
        }
    NM_CHECK(worst <= 1); // the integer form against the spec's coefficients
    nm_image_free(&img);
    // black, white and the primaries' corners where the formula says
    const uint8_t ref[8] = {16, 128, 235, 128, 81, 90, 81, 240}; // black, white; then red (Y 81, Cb 90, Cr 240)
    NM_CHECK(nm_image_from_pixels(ref, 8, 1, 4, 2, 0, &img, NULL, 0) == NM_OK);
    NM_CHECK(img.rgb && img.rgb[0] == 0 && img.rgb[1] == 0 && img.rgb[2] == 0 && img.rgb[3] == 255 && img.rgb[5] == 255);
    NM_CHECK(img.rgb && img.rgb[6] >= 254 && img.rgb[7] <= 1 && img.rgb[8] <= 1);
    nm_image_free(&img);
    // grey: replicated; RGB24: as is
    const uint8_t grey[6] = {0, 50, 100, 150, 200, 255}, rgb[6] = {1, 2, 3, 4, 5, 6};
    NM_CHECK(nm_image_from_pixels(grey, 6, 2, 3, 1, 0, &img, NULL, 0) == NM_OK);
    NM_CHECK(img.rgb && img.rgb[3 * 4] == 200 && img.rgb[3 * 4 + 1] == 200 && img.rgb[3 * 4 + 2] == 200);
    nm_image_free(&img);
    NM_CHECK(nm_image_from_pixels(rgb, 6, 1, 2, 3, 0, &img, NULL, 0) == NM_OK && img.rgb && !memcmp(img.rgb, rgb, 6));
    nm_image_free(&img);
    // bad shapes: named, nothing allocated
    char err[256];
    NM_CHECK(nm_image_from_pixels(rgb, 6, 1, 3, 2, 0, &img, err, sizeof err) == NM_ERR_FORMAT && strstr(err, "odd"));
    NM_CHECK(nm_image_from_pixels(rgb, 5, 1, 2, 3, 0, &img, err, sizeof err) == NM_ERR_FORMAT && strstr(err, "5 bytes"));
    NM_CHECK(nm_image_from_pixels(rgb, 6, 1, 2, 4, 0, &img, err, sizeof err) == NM_ERR_UNSUPPORTED);
    NM_CHECK(nm_image_from_pixels(rgb, 6, 0, 2, 3, 0, &img, err, sizeof err) != NM_OK && !img.rgb);
    NM_CHECK(nm_image_from_pixels(rgb, 6, 3, 2, 1, 4, &img, err, sizeof err) == NM_ERR_RANGE); // over max_pixels
    // a slot: pixels by shape, else a file's bytes; another kind or 2 dimensions refused
    nm_tabm_meta mt = {.kind = NM_TABM_IMAGE, .size = 6, .ndim = 3, .shape = {1, 2, 3}};
    NM_CHECK(nm_image_decode_slot(rgb, &mt, 6, 0, &img, NULL, 0) == NM_OK && img.w == 2 && img.rgb && img.rgb[5] == 6);
    nm_image_free(&img);
    mt.ndim = 1, mt.shape[0] = 6;
    NM_CHECK(nm_image_decode_slot(rgb, &mt, 6, 0, &img, err, sizeof err) == NM_ERR_UNSUPPORTED); // not a file format
    mt.ndim = 2;
    NM_CHECK(nm_image_decode_slot(rgb, &mt, 6, 0, &img, err, sizeof err) == NM_ERR_FORMAT && strstr(err, "2 dimensions"));
    mt.ndim = 3, mt.kind = NM_TABM_TEXT;
    NM_CHECK(nm_image_decode_slot(rgb, &mt, 6, 0, &img, err, sizeof err) == NM_ERR_FORMAT);
    mt.kind = NM_TABM_IMAGE, mt.size = 7;
    NM_CHECK(nm_image_decode_slot(rgb, &mt, 6, 0, &img, err, sizeof err) == NM_ERR_FORMAT && !img.rgb);
}

// ---- a camera frame's signature (nm_frame_signature / nm_frame_difference) ----------------------

// A P6 file of w x h grey pixels v(x, y) at path.
static bool write_grey_ppm(const char *path, int w, int h, uint8_t (*v)(int x, int y)) {
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    fprintf(f, "P6\n%d %d\n255\n", w, h);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            const uint8_t g = v(x, y);
            fputc(g, f), fputc(g, f), fputc(g, f);
        }
    return fclose(f) == 0;
}
static uint8_t stripes(int x, int y) { return (void)y, x % 2 ? 255 : 0; }       // 64 wide: two columns a cell
static uint8_t bars(int x, int y) { return (void)x, y < 32 ? 10 : 200; }        // top half dark
static uint8_t flat60(int x, int y) { return (void)x, (void)y, 60; }
static uint8_t flat61(int x, int y) { return (void)x, (void)y, 61; }

NM_TEST(frame_signature_averages_cells_and_differences) {
    char dir[] = "/tmp/nm-frame-XXXXXX", p[4][64];
    NM_CHECK(mkdtemp(dir) != NULL);
    const char *names[4] = {"stripes", "bars", "flat60", "flat61"};
    uint8_t (*fns[4])(int, int) = {stripes, bars, flat60, flat61};
    nm_frame_sig sig[4];
    char err[256];
    for (int k = 0; k < 4; k++) {
        snprintf(p[k], sizeof p[k], "%s/%s.ppm", dir, names[k]);
        // the flat frames are small (8 x 6): each cell takes its nearest pixel
        NM_CHECK(write_grey_ppm(p[k], k < 2 ? 64 : 8, k < 2 ? 64 : 6, fns[k]));
        NM_CHECK(nm_frame_signature(p[k], &sig[k], err, sizeof err) == NM_OK);
    }
    int bad = 0;
    for (int i = 0; i < NM_FRAME_SIG_SIDE * NM_FRAME_SIG_SIDE; i++) {
        bad += sig[0].luma[i] != 128;                                     // (0 + 255) / 2, rounded up
        bad += sig[1].luma[i] != (i / NM_FRAME_SIG_SIDE < 16 ? 10 : 200); // two rows a cell, one half each
        bad += sig[2].luma[i] != 60 || sig[3].luma[i] != 61;
    }
    NM_CHECK(bad == 0);
    NM_CHECK(sig[0].width == 64 && sig[0].height == 64 && sig[2].width == 8 && sig[2].height == 6);
    NM_CHECK_NEAR(nm_frame_difference(&sig[2], &sig[3]), 1.0, 1e-12);
    NM_CHECK_NEAR(nm_frame_difference(&sig[3], &sig[2]), 1.0, 1e-12);
    NM_CHECK_NEAR(nm_frame_difference(&sig[1], &sig[1]), 0.0, 1e-12);
    NM_CHECK_NEAR(nm_frame_difference(&sig[0], &sig[2]), 68.0, 1e-12); // 128 against 60 everywhere
    // bad input: named, nothing left in the output
    NM_CHECK(nm_frame_signature("/nonexistent.ppm", &sig[0], err, sizeof err) == NM_ERR_IO && strstr(err, "nonexistent"));
    NM_CHECK(sig[0].width == 0);
    FILE *f = fopen(p[0], "wb");
    if (f) fputs("P6\n4 4\n255\nxx", f), fclose(f);
    NM_CHECK(nm_frame_signature(p[0], &sig[0], err, sizeof err) != NM_OK);
    for (int k = 0; k < 4; k++) unlink(p[k]);
    rmdir(dir);
}

NM_TEST_MAIN()
