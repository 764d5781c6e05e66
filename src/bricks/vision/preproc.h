// The vision brick's image preprocessing: exactly as llama.cpp's mtmd does
// (commit 0c1e570), so that the floats handed to nm_clip_encode are
// bit-identical to llama.cpp's. The images come decoded (io/image/image.h).
//
// Preprocessing (nm_image_preprocess), for the two projectors we run:
//
//   mlp (LLaVA 1.5, no image_grid_pinpoints): one image. The source is fitted
//     inside image_size x image_size keeping its aspect ratio (scale =
//     min(S/w, S/h), new side = min(ceil(side * scale), S), float arithmetic),
//     resized there with bicubic, and pasted centred (offset (S - new) / 2,
//     rounded down) on a canvas of the pad colour (122, 116, 104). An image
//     already S x S is used as is.
//
//   mlp anyres (LLaVA-1.6, LLaVA-OneVision: clip.vision.image_grid_pinpoints),
//     llama.cpp's mtmd_image_preprocessor_llava_uhd:
//     - an image no larger than S x S: one image, a bicubic stretch to S x S;
//     - else the refined size (RW, RH) = nm_image_anyres_resolution; the image
//       is fitted and centred in it on black (bicubic, as mlp but pad 0,0,0);
//       tiles: its S x S crops, row-major (rows = RH / S, cols = RW / S); then
//       the overview: the source stretched to S x S (bicubic).
//     The embeddings go into the prompt in that order, with nothing between
//     them: tiles first, overview last (llama.cpp's mtmd puts the overview
//     first only for templates that mark slices, which llava's has none of).
//     No spatial unpad and no image_newline: llama.cpp's mtmd does neither for
//     the mlp projector.
//
//   idefics3 (SmolVLM), with clip.vision.preproc_image_size = L (longest edge):
//     1. resize to (L, (int)(L / aspect)) if w >= h, else ((int)(L * aspect), L),
//        aspect = (double)w / h, the short side then rounded up to even;
//     2. resize that to (cols * S, rows * S), cols = ceil(w1 / S), rows = ceil(h1 / S);
//     3. tiles: the S x S crops of (2), row-major;
//     4. the global image: (2) resized to S x S.
//     All three resizes are Lanczos (a = 3). Without preproc_image_size (old
//     files), llama.cpp's fallback: the refined size is each side rounded to
//     the nearest multiple of S (at least S), the refined image is a bicubic
//     resize fitted and centred on black (as mlp, but pad 0,0,0), and the
//     global image is a bicubic stretch of the source to S x S.
//   Output order here is the order the embeddings go into the prompt: the
//   rows * cols tiles row-major, then the global image last.
//
//   SmolVLM prompt layout (llama.cpp mtmd.cpp, MTMD_SLICE_TMPL_IDEFICS3; each
//   <...> is one special token, "\n" and "\n\n" are single tokens looked up as
//   text, [tile r,c] / [global] are that image's n_out embeddings):
//
//     for r in 1..rows:
//       for c in 1..cols:
//         <fake_token_around_image><row_r_col_c> [tile r,c]
//       "\n"                       (after every row except the last)
//     "\n\n" <fake_token_around_image> <global-img> [global] <fake_token_around_image>
//
//   (row_r_col_c is 1-based, e.g. <row_1_col_2>; no marker follows a tile.)
//
// All resizes use llama.cpp's Pillow-compatible separable resampler: per
// output pixel, filter weights computed in double, normalised, rounded to
// 22-bit fixed point; a horizontal pass then a vertical pass, each rounding
// and clamping to 8 bits. Normalisation: ((float)v / 255.0f - mean[c]) / std[c]
// in float, as clip_image_f32::from_u8 + normalize.
//
// No global state: every call may run concurrently with others on other objects.
#ifndef NM_VISION_PREPROC_H
#define NM_VISION_PREPROC_H

#include <stddef.h>
#include <stdint.h>

#include "nanomind.h"
#include "bricks/vision/clip.h"
#include "io/image/image.h"

// ---- resizing (llama.cpp's img_tool, Pillow arithmetic) -------------------------

typedef enum nm_resize {
    NM_RESIZE_BILINEAR = 0, // triangle filter, support 1
    NM_RESIZE_BICUBIC = 1,  // Keys cubic with a = -0.5 (Pillow's), support 2
    NM_RESIZE_LANCZOS = 2,  // Lanczos-3, support 3
} nm_resize;


// Resizes src to w x h (stretching). A side that does not change is not
// filtered; same size is a copy. *dst is a new image (free with nm_image_free).
nm_status nm_image_resize(const nm_image *src, int32_t w, int32_t h, nm_resize algo, nm_image *dst);

// Fits src inside w x h keeping the aspect ratio (llama.cpp's PAD_CEIL), resizes
// it there and centres it on a canvas filled with pad. Same size is a copy.
nm_status nm_image_resize_pad(const nm_image *src, int32_t w, int32_t h, nm_resize algo,
                              const uint8_t pad[3], nm_image *dst);

// Writes the size x size square of img at (x, y) as 3 planes (R, G, B) of
// size * size floats, ((float)v / 255.0f - mean[c]) / std[c]. The square must
// lie inside img.
void nm_image_rect_to_f32(const nm_image *img, int32_t x, int32_t y, int32_t size,
                          const float mean[3], const float std[3], float *planar);

// The whole image (w x h, any shape) as 3 planes of w * h floats, normalized as above.
void nm_image_to_f32(const nm_image *img, const float mean[3], const float std[3], float *planar);

// ---- preprocessing for the encoder ------------------------------------------------

typedef struct nm_image_params {
    nm_clip_proj proj;     // NM_CLIP_PROJ_MLP, NM_CLIP_PROJ_IDEFICS3 or NM_CLIP_PROJ_QWEN2VL
    int32_t image_size;    // S: clip.vision.image_size
    int32_t longest_edge;  // idefics3: clip.vision.preproc_image_size; 0 = absent (old files)
    float mean[3], std[3]; // clip.vision.image_mean / image_std
    uint8_t pad[3];        // mlp: canvas colour around the fitted image
    int32_t cell;          // qwen2vl: the merge cell's side in pixels (patch_size * n_merge)
    int32_t min_tokens, max_tokens; // qwen2vl: the cells an image is resized to fill (pixel budget)
    int32_t cap_tokens;    // qwen2vl: the most cells the encoder takes (0: max_tokens); an image scaled up
                           // to min_tokens may pass max_tokens (llama.cpp's arithmetic), not this
    // mlp anyres: candidate (width, height) resolutions, multiples of image_size
    int32_t n_pinpoints;
    int32_t pinpoints[NM_CLIP_MAX_PINPOINTS][2];
} nm_image_params;

// llama.cpp's parameters for an mmproj (pad colour 122,116,104 for mlp).
nm_image_params nm_image_params_from_clip(const nm_clip_info *ci);

// The encoder inputs for one image, allocated once.
typedef struct nm_image_batch {
    int32_t n;          // images: mlp and qwen2vl 1; idefics3 and mlp anyres rows * cols tiles + 1 global
    int32_t rows, cols; // tile grid; 0, 0 for one image
    int32_t image_size; // S
    int32_t width, height; // each image's size: S x S, or qwen2vl's target size
    float *data;        // (n, 3, height, width): image i at data + i * 3 * width * height; owned
} nm_image_batch;

// Preprocesses img for p (see the top of this file). On success *out owns its
// data (nm_image_batch_free); on failure *out is zeroed: NM_ERR_INVALID_ARG for
// bad params, NM_ERR_RANGE when the image cannot be mapped (a side would become
// 0 or the grid too large), NM_ERR_NOMEM.
nm_status nm_image_preprocess(const nm_image *img, const nm_image_params *p, nm_image_batch *out,
                              char *err, size_t err_size);
void nm_image_batch_free(nm_image_batch *b);

// llama.cpp's select_best_resolution: of the pinpoints, the one that keeps the
// most of a w x h image's pixels when it is fitted inside (ties: the least
// padding; further ties: the first listed). NM_ERR_INVALID_ARG without pinpoints.
nm_status nm_image_anyres_resolution(int32_t w, int32_t h, const nm_image_params *p, int32_t *rw, int32_t *rh);

// qwen2vl (llama.cpp's calc_size_preserved_ratio, HF's smart_resize): the
// size a w x h image is resized to, whole cells keeping the aspect ratio:
// each side rounded to the nearest cell (at least one); over max_tokens cells,
// both sides scaled by sqrt(w h / budget) and floored to cells; under
// min_tokens, scaled up and ceiled (which may pass max_tokens, as in
// llama.cpp). NM_ERR_RANGE if the result is over cap_tokens (or max_tokens
// without one: a strip too long for the budget), NM_ERR_INVALID_ARG for bad
// parameters.
nm_status nm_image_qwen2vl_size(int32_t w, int32_t h, const nm_image_params *p, int32_t *tw, int32_t *th);

// The idefics3 grid (rows, cols) nm_image_preprocess would produce for a
// w x h image, without doing the work. NM_ERR_RANGE / INVALID_ARG as above.
nm_status nm_image_idefics3_grid(int32_t w, int32_t h, const nm_image_params *p, int32_t *rows,
                                 int32_t *cols);

#endif
