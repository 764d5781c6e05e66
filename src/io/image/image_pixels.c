// Raw camera pixels into RGB (image.h, nm_image_from_pixels): what a V4L2
// camera writes into an IMAGE slot when it does not compress (YUYV 4:2:2,
// 8-bit grey, RGB24), and the one decoder of an IMAGE slot for the vision
// brick and the frame signature (nm_image_decode_slot: a file's bytes or
// pixels, by the slot's shape).
#include "io/image/image.h"
#include "core/fail.h"

#include <string.h>

static inline uint8_t clamp8(int32_t v) { return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v); }

// BT.601 limited range (what UVC cameras send: Y 16..235, Cb/Cr 16..240) to
// full-range RGB, the integer form of ITU-R BT.601 with 8 fractional bits.
static inline void yuv_rgb(int32_t y, int32_t u, int32_t v, uint8_t *px) {
    const int32_t c = 298 * (y - 16), d = u - 128, e = v - 128;
    px[0] = clamp8((c + 409 * e + 128) >> 8);
    px[1] = clamp8((c - 100 * d - 208 * e + 128) >> 8);
    px[2] = clamp8((c + 516 * d + 128) >> 8);
}

nm_status nm_image_from_pixels(const void *data, size_t n, int64_t h, int64_t w, int64_t c, int64_t max_pixels,
                               nm_image *out, char *err, size_t err_size) {
    if (!out) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pixels: NULL output");
    *out = (nm_image){0};
    if (!data) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pixels: NULL data");
    if (c != 1 && c != 2 && c != 3)
        return nm_fail(NM_ERR_UNSUPPORTED, err, err_size,
                       "pixels: %lld bytes a pixel (1: grey, 2: YUYV 4:2:2, 3: RGB24 are read)", (long long)c);
    nm_status st = nm_image_check_size("pixels", w, h, max_pixels > 0 ? max_pixels : NM_IMAGE_MAX_PIXELS, err,
                                       err_size);
    if (st != NM_OK) return st;
    if (c == 2 && (w & 1))
        return nm_fail(NM_ERR_FORMAT, err, err_size, "pixels: YUYV rows hold pixel pairs: width %lld is odd",
                       (long long)w);
    if ((uint64_t)n != (uint64_t)(w * h * c))
        return nm_fail(NM_ERR_FORMAT, err, err_size, "pixels: %zu bytes for %lld x %lld x %lld (%lld expected)", n,
                       (long long)w, (long long)h, (long long)c, (long long)(w * h * c));
    if ((st = nm_image_alloc((int32_t)w, (int32_t)h, out)) != NM_OK)
        return nm_fail(st, err, err_size, "pixels: no memory for %lld x %lld", (long long)w, (long long)h);
    const uint8_t *s = data;
    uint8_t *d = out->rgb;
    const size_t np = (size_t)(w * h);
    if (c == 3) {
        memcpy(d, s, np * 3);
    } else if (c == 1) {
        for (size_t i = 0; i < np; i++, d += 3) d[0] = d[1] = d[2] = s[i];
    } else {
        for (size_t i = 0; i < np; i += 2, s += 4, d += 6) { // Y0 U Y1 V: two pixels share U and V
            yuv_rgb(s[0], s[1], s[3], d);
            yuv_rgb(s[2], s[1], s[3], d + 3);
        }
    }
    return NM_OK;
}

nm_status nm_image_decode_slot(const void *data, const nm_tabm_meta *mt, size_t capacity, int64_t max_pixels,
                               nm_image *out, char *err, size_t err_size) {
    if (!out) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "image slot: NULL output");
    *out = (nm_image){0};
    if (!mt || mt->kind != NM_TABM_IMAGE || mt->size == 0 || mt->size > capacity)
        return nm_fail(NM_ERR_FORMAT, err, err_size, "not an image file or a camera's pixels (kind %u, %llu bytes)", mt ? mt->kind : 0u,
                       mt ? (unsigned long long)mt->size : 0ull);
    if (mt->ndim == 3)
        return nm_image_from_pixels(data, (size_t)mt->size, mt->shape[0], mt->shape[1], mt->shape[2], max_pixels,
                                    out, err, err_size);
    if (mt->ndim > 1)
        return nm_fail(NM_ERR_FORMAT, err, err_size, "image slot of %d dimensions (1: a file's bytes, 3: pixels)",
                       mt->ndim);
    return nm_image_decode_max(data, (size_t)mt->size, max_pixels, out, err, err_size);
}
