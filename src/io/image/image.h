// Image files and pixels into 8-bit RGB (src/io/image): PNG, JPEG, PPM, and a
// camera's raw pixels. The vision brick preprocesses what these give
// (bricks/vision/preproc.h).
//
// Decoding matches stb_image with 3 requested channels, which is what
// llama.cpp's mtmd-helper uses: alpha is dropped (not composited), gray is
// replicated to R=G=B, 16-bit PNG samples keep their high byte, gamma / sBIT /
// ICC chunks are ignored, EXIF orientation is ignored. JPEG pixels are
// rebuilt from libjpeg's coefficients with stb's own IDCT, upsampling and
// colour arithmetic (image_jpeg.c), so they match stb bit for bit too.
// Known differences (docs/correctness.md): PPM with maxval other than 255 (we
// scale to 0..255; stb does not, and reads 16-bit samples in the wrong byte
// order on little-endian hosts); ASCII PPM/PGM and arithmetic-coded JPEG (stb
// rejects them); files with bad CRCs, a missing IEND/EOI or truncated data (we
// reject them, stb is lenient).
//
// No global state: every call may run concurrently with others on other objects.
#ifndef NM_IO_IMAGE_H
#define NM_IO_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "nanomind.h"

#define NM_IMAGE_MAX_SIDE 16384           // decode limit per side
#define NM_IMAGE_MAX_PIXELS (1ll << 26)   // default decode limit on w * h (~67 MP, 201 MB of RGB)

// An 8-bit RGB image, interleaved, rows top to bottom, no padding.
typedef struct nm_image {
    int32_t w, h;
    uint8_t *rgb; // (h, w, 3); owned: release with nm_image_free
} nm_image;

// ---- decoding -------------------------------------------------------------------

// Decodes an image from memory; the format comes from the magic bytes (PNG,
// JPEG, or PPM/PGM P6/P5/P3/P2). data is only read during the call. On success
// *out owns a new buffer; on failure *out is {0, 0, NULL} and err says why:
// NM_ERR_FORMAT for corrupt or truncated data, NM_ERR_UNSUPPORTED for another
// format or a variant we do not decode, NM_ERR_RANGE for an image over the
// limits, NM_ERR_NOMEM. err may be NULL (err_size 0).
nm_status nm_image_decode(const void *data, size_t n, nm_image *out, char *err, size_t err_size);

// As nm_image_decode with a caller-chosen cap on w * h (<= 0: the default).
// Bounds the memory and time a hostile header can cost (the fuzzer uses 2^20).
nm_status nm_image_decode_max(const void *data, size_t n, int64_t max_pixels, nm_image *out,
                              char *err, size_t err_size);

// Reads a whole file and decodes it. NM_ERR_IO if it cannot be opened or read.
nm_status nm_image_load(const char *path, nm_image *out, char *err, size_t err_size);

// Raw pixels (image_pixels.c): h rows of w pixels of c bytes, packed (no row
// padding): c = 1 grey, 2 YUYV 4:2:2 (Y0 U Y1 V, BT.601 limited range, w even),
// 3 RGB24. n must be w * h * c. As nm_image_decode otherwise.
nm_status nm_image_from_pixels(const void *data, size_t n, int64_t h, int64_t w, int64_t c, int64_t max_pixels,
                               nm_image *out, char *err, size_t err_size);
// An IMAGE slot's payload (nanomind.h, NM_TABM_IMAGE): an image file's bytes
// (ndim 0 or 1) or a camera's pixels (ndim 3, shape [h, w, c] as above).
// NM_ERR_FORMAT for another kind, an empty or oversized payload.
nm_status nm_image_decode_slot(const void *data, const nm_tabm_meta *mt, size_t capacity, int64_t max_pixels,
                               nm_image *out, char *err, size_t err_size);

// A w x h image of unspecified pixels: NM_ERR_RANGE for a side outside 1..NM_IMAGE_MAX_TARGET or more than
// 2^28 pixels, NM_ERR_NOMEM.
#define NM_IMAGE_MAX_TARGET 65536 // (llama.cpp's own bound on a resize target side)
nm_status nm_image_alloc(int32_t w, int32_t h, nm_image *out);
// Frees img->rgb and zeroes *img. NULL and an empty image are no-ops.
void nm_image_free(nm_image *img);

// Per-format decoders behind nm_image_decode (same contract; the caller has
// checked the magic). max_pixels > 0.
// Shared by them: NM_OK if 0 < w, h <= NM_IMAGE_MAX_SIDE and w * h <= max_pixels,
// else NM_ERR_FORMAT (a zero side) or NM_ERR_RANGE, with a message naming fmt.
nm_status nm_image_check_size(const char *fmt, int64_t w, int64_t h, int64_t max_pixels, char *err,
                              size_t err_size);
nm_status nm_image_decode_png(const uint8_t *data, size_t n, int64_t max_pixels, nm_image *out,
                              char *err, size_t err_size);
nm_status nm_image_decode_jpeg(const uint8_t *data, size_t n, int64_t max_pixels, nm_image *out,
                               char *err, size_t err_size);
nm_status nm_image_decode_pnm(const uint8_t *data, size_t n, int64_t max_pixels, nm_image *out,
                              char *err, size_t err_size);

#endif
