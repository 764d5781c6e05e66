// Netpbm PPM / PGM decoding (http://netpbm.sourceforge.net/doc/ppm.html):
// binary P6 (RGB) and P5 (gray), ASCII P3 and P2. Header: magic, width,
// height, maxval as decimal numbers separated by whitespace, with '#'
// comments to the end of a line; binary samples follow one whitespace byte,
// 1 byte each for maxval < 256, else 2 bytes big-endian. Samples are scaled
// to 0..255 as round(v * 255 / maxval), so maxval 255 is the identity (the
// only case stb_image and we agree on: stb neither scales other maxvals nor,
// on little-endian hosts, reads 16-bit samples in the right byte order).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/image/image.h"

struct cursor {
    const uint8_t *d;
    size_t n, pos;
};

static bool is_space(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'; }

// Skips whitespace and comments. At least one separator must precede a number
// in the header; in ASCII data too.
static void skip_space(struct cursor *c) {
    while (c->pos < c->n) {
        uint8_t ch = c->d[c->pos];
        if (is_space(ch)) {
            c->pos++;
        } else if (ch == '#') {
            while (c->pos < c->n && c->d[c->pos] != '\n' && c->d[c->pos] != '\r') c->pos++;
        } else {
            break;
        }
    }
}

// Reads a decimal number <= limit after optional whitespace/comments.
// Returns -1 if there is none (end of data or another byte), -2 if it is over limit.
static int64_t read_number(struct cursor *c, int64_t limit) {
    skip_space(c);
    if (c->pos >= c->n || c->d[c->pos] < '0' || c->d[c->pos] > '9') return -1;
    int64_t v = 0;
    while (c->pos < c->n && c->d[c->pos] >= '0' && c->d[c->pos] <= '9') {
        v = v * 10 + (c->d[c->pos++] - '0');
        if (v > limit) return -2;
    }
    return v;
}

nm_status nm_image_decode_pnm(const uint8_t *data, size_t n, int64_t max_pixels, nm_image *out,
                              char *err, size_t err_size) {
    *out = (nm_image){0};
    char kind = n >= 2 ? (char)data[1] : 0;
    if (n < 2 || data[0] != 'P' || !strchr("2356", kind) || kind == 0) {
        if (err && err_size)
            snprintf(err, err_size, "pnm: P%c is not supported (P6, P5, P3 and P2 are)", n >= 2 ? kind : '?');
        return NM_ERR_UNSUPPORTED;
    }
    const char *name = kind == '6' ? "ppm (P6)" : kind == '5' ? "pgm (P5)" : kind == '3' ? "ppm (P3)" : "pgm (P2)";
    struct cursor c = {data, n, 2};
    if (c.pos < n && !is_space(data[c.pos]) && data[c.pos] != '#') {
        if (err && err_size) snprintf(err, err_size, "%s: no separator after the magic", name);
        return NM_ERR_FORMAT;
    }
    int64_t w = read_number(&c, NM_IMAGE_MAX_SIDE + 1);
    int64_t h = w >= 0 ? read_number(&c, NM_IMAGE_MAX_SIDE + 1) : w;
    int64_t maxval = h >= 0 ? read_number(&c, 65535) : h;
    if (w == -2 || h == -2) {
        if (err && err_size) snprintf(err, err_size, "%s: image over %d per side", name, NM_IMAGE_MAX_SIDE);
        return NM_ERR_RANGE;
    }
    if (maxval == -2 || maxval == 0) {
        if (err && err_size) snprintf(err, err_size, "%s: maxval must be 1..65535", name);
        return NM_ERR_FORMAT;
    }
    if (w < 0 || h < 0 || maxval < 0) {
        if (err && err_size) snprintf(err, err_size, "%s: truncated or malformed header", name);
        return NM_ERR_FORMAT;
    }
    nm_status st = nm_image_check_size(name, w, h, max_pixels, err, err_size);
    if (st != NM_OK) return st;
    const bool binary = kind == '6' || kind == '5';
    const size_t nch = kind == '6' || kind == '3' ? 3 : 1;
    const size_t bps = maxval > 255 ? 2 : 1;
    const size_t n_samples = (size_t)w * (size_t)h * nch;
    if (binary) {
        // Exactly one whitespace byte separates maxval from the samples.
        if (c.pos >= n || !is_space(data[c.pos])) {
            if (err && err_size) snprintf(err, err_size, "%s: truncated or malformed header", name);
            return NM_ERR_FORMAT;
        }
        c.pos++;
        if (n - c.pos < n_samples * bps) {
            if (err && err_size)
                snprintf(err, err_size, "%s: truncated: %zu bytes of samples, %zu needed", name, n - c.pos,
                         n_samples * bps);
            return NM_ERR_FORMAT;
        }
    } else if (n - c.pos < n_samples) { // every ASCII sample takes at least a separator and a digit
        if (err && err_size) snprintf(err, err_size, "%s: truncated: too few samples", name);
        return NM_ERR_FORMAT;
    }
    uint8_t *rgb = malloc((size_t)w * (size_t)h * 3);
    if (!rgb) {
        if (err && err_size) snprintf(err, err_size, "%s: out of memory", name);
        return NM_ERR_NOMEM;
    }
    const uint32_t mv = (uint32_t)maxval;
    for (size_t i = 0; i < n_samples; i++) {
        uint32_t v;
        if (binary) {
            const uint8_t *p = data + c.pos + i * bps;
            v = bps == 2 ? (uint32_t)p[0] << 8 | p[1] : p[0];
        } else {
            if (c.pos < n && !is_space(data[c.pos]) && data[c.pos] != '#') {
                free(rgb);
                if (err && err_size) snprintf(err, err_size, "%s: bad byte in sample %zu", name, i);
                return NM_ERR_FORMAT;
            }
            int64_t s = read_number(&c, 65535);
            if (s < 0) {
                free(rgb);
                if (err && err_size)
                    snprintf(err, err_size, "%s: %s at sample %zu", name, s == -2 ? "sample over 65535" : "truncated or malformed data", i);
                return NM_ERR_FORMAT;
            }
            v = (uint32_t)s;
        }
        if (v > mv) {
            free(rgb);
            if (err && err_size) snprintf(err, err_size, "%s: sample %zu is %u, over maxval %u", name, i, v, mv);
            return NM_ERR_FORMAT;
        }
        uint8_t b = mv == 255 ? (uint8_t)v : (uint8_t)((v * 255u + mv / 2) / mv);
        if (nch == 3) rgb[i] = b;
        else rgb[3 * i] = rgb[3 * i + 1] = rgb[3 * i + 2] = b;
    }
    out->w = (int32_t)w;
    out->h = (int32_t)h;
    out->rgb = rgb;
    return NM_OK;
}
