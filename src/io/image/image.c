// Image decoding entry points: pick the decoder by magic bytes, read files.
// The per-format decoders live in image_png.c, image_jpeg.c and image_pnm.c.
#include "io/image/image.h"
#include "core/fail.h"
#include "io/infile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_FILE_BYTES (1ull << 30) // an image file larger than this is not one we want

static bool has_prefix(const uint8_t *d, size_t n, const char *magic, size_t len) {
    return n >= len && memcmp(d, magic, len) == 0;
}

nm_status nm_image_check_size(const char *fmt, int64_t w, int64_t h, int64_t max_pixels, char *err,
                              size_t err_size) {
    if (w <= 0 || h <= 0)
        return nm_fail(NM_ERR_FORMAT, err, err_size, "%s: bad size %lldx%lld", fmt, (long long)w, (long long)h);
    if (w > NM_IMAGE_MAX_SIDE || h > NM_IMAGE_MAX_SIDE || w * h > max_pixels)
        return nm_fail(NM_ERR_RANGE, err, err_size, "%s: %lldx%lld is over the limit (%d per side, %lld pixels)",
                       fmt, (long long)w, (long long)h, NM_IMAGE_MAX_SIDE, (long long)max_pixels);
    return NM_OK;
}

nm_status nm_image_decode_max(const void *data, size_t n, int64_t max_pixels, nm_image *out,
                              char *err, size_t err_size) {
    if (err && err_size) err[0] = '\0';
    if (!out) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "image: no output");
    *out = (nm_image){0};
    if (!data && n) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "image: no data");
    if (max_pixels <= 0) max_pixels = NM_IMAGE_MAX_PIXELS;
    const uint8_t *d = data;
    if (n == 0) return nm_fail(NM_ERR_FORMAT, err, err_size, "image: empty input");
    if (has_prefix(d, n, "\x89PNG\r\n\x1a\n", 8)) return nm_image_decode_png(d, n, max_pixels, out, err, err_size);
    if (has_prefix(d, n, "\xff\xd8\xff", 3)) return nm_image_decode_jpeg(d, n, max_pixels, out, err, err_size);
    if (n >= 2 && d[0] == 'P' && d[1] >= '1' && d[1] <= '7')
        return nm_image_decode_pnm(d, n, max_pixels, out, err, err_size);
    // Name the formats people are likely to try (stb_image, and so llama.cpp, reads some of them).
    const char *what = NULL;
    if (has_prefix(d, n, "GIF87a", 6) || has_prefix(d, n, "GIF89a", 6)) what = "GIF";
    else if (has_prefix(d, n, "BM", 2)) what = "BMP";
    else if (n >= 12 && has_prefix(d, n, "RIFF", 4) && !memcmp(d + 8, "WEBP", 4)) what = "WebP";
    else if (has_prefix(d, n, "8BPS", 4)) what = "PSD";
    else if (has_prefix(d, n, "#?RADIANCE", 10) || has_prefix(d, n, "#?RGBE", 6)) what = "HDR";
    else if (has_prefix(d, n, "II*\0", 4) || has_prefix(d, n, "MM\0*", 4)) what = "TIFF";
    else if (n >= 12 && !memcmp(d + 4, "ftyp", 4)) what = "HEIF/AVIF";
    if (what)
        return nm_fail(NM_ERR_UNSUPPORTED, err, err_size,
                       "image: %s is not supported (PNG, JPEG and PPM/PGM are)", what);
    return nm_fail(NM_ERR_UNSUPPORTED, err, err_size,
                   "image: unknown format (first bytes %02x %02x; PNG, JPEG and PPM/PGM are supported)",
                   d[0], n > 1 ? d[1] : 0);
}

nm_status nm_image_decode(const void *data, size_t n, nm_image *out, char *err, size_t err_size) {
    return nm_image_decode_max(data, n, 0, out, err, err_size);
}

nm_status nm_image_load(const char *path, nm_image *out, char *err, size_t err_size) {
    if (err && err_size) err[0] = '\0';
    if (!out) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "image: no output");
    *out = (nm_image){0};
    if (!path) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "image: no path");
    char *buf = NULL;
    size_t n = 0;
    nm_status rs = nm_infile_read(path, MAX_FILE_BYTES, 0, &buf, &n, err, err_size);
    if (rs != NM_OK) return rs;
    char sub[256] = "";
    nm_status s = nm_image_decode(buf, n, out, sub, sizeof sub);
    free(buf);
    if (s != NM_OK) return nm_fail(s, err, err_size, "%s: %s", path, sub);
    return NM_OK;
}

nm_status nm_image_alloc(int32_t w, int32_t h, nm_image *out) {
    *out = (nm_image){0};
    if (w <= 0 || h <= 0 || w > NM_IMAGE_MAX_TARGET || h > NM_IMAGE_MAX_TARGET || (int64_t)w * h > (1ll << 28))
        return NM_ERR_RANGE;
    out->rgb = malloc((size_t)w * (size_t)h * 3);
    if (!out->rgb) return NM_ERR_NOMEM;
    out->w = w;
    out->h = h;
    return NM_OK;
}

void nm_image_free(nm_image *img) {
    if (!img) return;
    free(img->rgb);
    *img = (nm_image){0};
}
