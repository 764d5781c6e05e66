// Vision encoder brick: a CLIP/SigLIP ViT plus projector, loaded from an
// mmproj GGUF in llama.cpp's clip layout (`v.*`, `mm.*` tensors, `clip.*`
// keys). Projectors: `mlp` (LLaVA, LLaVA-OneVision) and `idefics3` (SmolVLM:
// pixel shuffle + linear). One fixed input shape per encoder: a square
// image_size x image_size RGB image, normalized, planar (see nm_clip_encode).
#ifndef NM_CLIP_H
#define NM_CLIP_H

#include <stddef.h>
#include <stdint.h>

#include "nanomind.h"

typedef struct nm_clip nm_clip;

typedef enum nm_clip_proj {
    NM_CLIP_PROJ_MLP = 1,      // "mlp": [post_ln] -> mm.0 -> GELU -> mm.2 (LLaVA)
    NM_CLIP_PROJ_IDEFICS3 = 2, // "idefics3": pixel shuffle by scale_factor -> mm.model.fc (SmolVLM)
    NM_CLIP_PROJ_QWEN2VL = 3,  // "qwen2vl_merger": dynamic resolution, 2-D rope ViT, 2x2 patch merger -> mm.0 ->
                               // GELU -> mm.2 (Qwen2-VL)
} nm_clip_proj;

// qwen2vl_merger: the image tokens an image may give (llama.cpp's defaults: its
// preprocessing resizes an image into this range).
#define NM_CLIP_QWEN2VL_MIN_TOKENS 8
#define NM_CLIP_QWEN2VL_MAX_TOKENS 4096

typedef enum nm_clip_act {
    NM_CLIP_ACT_GELU_QUICK = 0, // x * sigmoid(1.702 x): the default (clip.use_gelu absent/false)
    NM_CLIP_ACT_GELU = 1,       // tanh-approximated GELU (clip.use_gelu = true)
    NM_CLIP_ACT_SILU = 2,       // clip.use_silu = true
} nm_clip_act;

// Most anyres resolutions an mmproj may list (LLaVA-OneVision lists 36), and
// most tiles a side of one.
#define NM_CLIP_MAX_PINPOINTS 64
#define NM_CLIP_MAX_PINPOINT_TILES 64

typedef struct nm_clip_info {
    nm_clip_proj proj;
    nm_clip_act act;
    int32_t image_size;      // clip.vision.image_size: input is image_size x image_size (qwen2vl_merger: any
                             // size of whole merge cells, see nm_clip_encode_size; image_size is the default)
    int32_t patch_size;      // clip.vision.patch_size
    int32_t n_embd;          // clip.vision.embedding_length
    int32_t n_ff;            // clip.vision.feed_forward_length
    int32_t n_head;          // clip.vision.attention.head_count
    int32_t n_layer;         // clip.vision.block_count (layers in the file)
    int32_t n_layer_run;     // layers actually run (mlp: the second to last layer's output, as llama.cpp)
    float eps;               // clip.vision.attention.layer_norm_epsilon (required, as in llama.cpp)
    int32_t n_merge;         // idefics3: clip.vision.projector.scale_factor; qwen2vl_merger: 2 (a merge
                             // cell is n_merge x n_merge patches); else 1
    int32_t min_tokens, max_tokens; // qwen2vl_merger: the image tokens preprocessing aims for (the encoder
                                    // takes 1..max_tokens); else n_out
    int32_t preproc_image_size; // idefics3: clip.vision.preproc_image_size (longest edge), 0 if absent
    bool has_class_embd;     // v.class_embd present (llama.cpp's order: appended after the patches, and
                             // the projector reads rows 1..n_patches, i.e. drops patch 0; see clip.c)
    int32_t n_patches;       // (image_size / patch_size)^2
    int32_t n_out;           // embeddings one image yields (qwen2vl_merger: at most; nm_clip_n_out gives them)
    int32_t n_out_embd;      // width of each (the LLM's n_embd must equal it)
    float mean[3], std[3];   // clip.vision.image_mean / image_std
    // mlp "anyres" (LLaVA-1.6, LLaVA-OneVision): clip.vision.image_grid_pinpoints as
    // (width, height) pairs, each a multiple of image_size (so every tile keeps the
    // encoder's one input shape); 0 pairs: one image per picture (LLaVA-1.5)
    int32_t n_pinpoints;
    int32_t pinpoints[NM_CLIP_MAX_PINPOINTS][2];
} nm_clip_info;

// Loads an mmproj file. Weights stay mmapped; f32, f16 and the quantized types
// of the LLM run through the same kernels. n_threads <= 0: all cores.
// A file with missing tensors, inconsistent shapes or an unknown projector
// gives an error naming the problem.
// device: where it computes ("cpu" or NULL, "opencl", "opencl:N", "auto": OpenCL if the
// encoder loads there, else the CPU).
nm_status nm_clip_load(const char *path, const char *device, int32_t n_threads, nm_clip **out, char *err,
                       size_t err_size);
// The same from an mmproj image in memory, which must stay valid and unchanged
// until nm_clip_free (the weights are used in place).
nm_status nm_clip_load_memory(const void *data, size_t size, const char *device, int32_t n_threads, nm_clip **out,
                              char *err, size_t err_size);
// The backend it computes on ("cpu", "opencl").
const char *nm_clip_device(const nm_clip *c);
void nm_clip_free(nm_clip *c);
const nm_clip_info *nm_clip_get_info(const nm_clip *c);

// Encodes one image. pixels: 3 planes (R, G, B) of image_size x image_size
// floats, row-major, already normalized ((v/255 - mean) / std). out: n_out rows
// of n_out_embd floats. Allocates nothing (all scratch comes from load).
nm_status nm_clip_encode(nm_clip *c, const float *pixels, float *out);
// The same for an image of width x height pixels (3 planes of height rows of
// width floats): for qwen2vl_merger, any size of whole merge cells (multiples
// of patch_size * n_merge) giving at most max_tokens embeddings, n_out
// rows in raster order over the merge cells; for the other projectors only
// image_size x image_size. A new size records the encoder's op list again.
nm_status nm_clip_encode_size(nm_clip *c, const float *pixels, int32_t width, int32_t height, float *out);
// Embeddings an image of width x height gives (0 if the encoder cannot take it).
int32_t nm_clip_n_out(const nm_clip *c, int32_t width, int32_t height);
const char *nm_clip_last_error(const nm_clip *c); // "" if none

// Adds the cost of one encoder run (one image or tile of width x height;
// 0, 0: image_size) to e: its matmuls by weight type, attention, the weights
// it streams, its buffers.
void nm_clip_estimate_run(const nm_clip *c, int32_t width, int32_t height, nm_brick_cost *e);

#endif
