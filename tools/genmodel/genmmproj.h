// Random-weight mmproj files (vision encoder + projector) in llama.cpp's
// `clip` GGUF layout, for tests and cross-checks against llama.cpp's mtmd.
// Layout, keys and the math of each projector: docs/mmproj.md.
#ifndef NM_GENMMPROJ_H
#define NM_GENMMPROJ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nanomind.h"

typedef struct nm_genmmproj_params {
    const char *proj;    // "mlp" (LLaVA: mm.0 -> GELU -> mm.2), "idefics3" (SmolVLM: pixel shuffle -> mm.model.fc)
                         // or "qwen2vl_merger" (Qwen2-VL: two patch kernels, 2-D rope, post-LN, 2x2 merge ->
                         // mm.0 (4 n_embd wide) -> GELU -> mm.2; n_ff from the tensors, the key holds n_out_embd)
    int32_t image_size;  // clip.vision.image_size (square input)
    int32_t patch_size;  // clip.vision.patch_size; divides image_size
    int32_t n_embd;      // ViT width; a multiple of n_head
    int32_t n_ff;        // ViT FFN width
    int32_t n_head;
    int32_t n_layer;     // layers written (mlp: llama.cpp runs n_layer - 1 of them)
    int32_t n_out_embd;  // projector output width = the LLM's n_embd (clip.vision.projection_dim)
    int32_t scale_factor; // idefics3: pixel-shuffle factor (>= 2, divides image_size / patch_size); else ignored
    int32_t preproc_image_size; // idefics3: clip.vision.preproc_image_size (the longest edge);
                                // 0 = image_size, -1 = no key (old files)
    bool class_embd;     // v.class_embd
    bool patch_bias;     // v.patch_embd.bias (SigLIP has one, CLIP does not)
    bool pre_ln;         // v.pre_ln.{weight,bias}
    bool post_ln;        // v.post_ln.{weight,bias}
    bool use_gelu;       // clip.use_gelu: tanh GELU in the ViT FFN; false: quick GELU x*sigmoid(1.702x)
    bool legacy_ffn_names; // fc1 written as ffn_down and fc2 as ffn_up, as old LLaVA converters did
    float eps;           // clip.vision.attention.layer_norm_epsilon
    float mean[3], std[3]; // clip.vision.image_mean / image_std
    uint32_t wtype;      // enum nm_type of the 2-D matmul weights; embeddings, norms and biases stay f32
    bool f16_embd;       // patch kernel and position table in f16, as the legacy LLaVA converter wrote them
    uint64_t seed;
    // mlp anyres: clip.vision.image_grid_pinpoints as n_pinpoints (width, height)
    // pairs (written as given, int32; 0: no key)
    int32_t n_pinpoints;
    int32_t pinpoints[64][2];
} nm_genmmproj_params;

// Defaults shaped like the real files, small: "mlp" like a LLaVA-1.5 CLIP
// (class token, pre-LN, quick GELU, no patch bias), "idefics3" like SmolVLM's
// SigLIP (patch bias, post-LN, GELU, scale factor 2). Unknown proj: the mlp set
// with proj left as given (nm_genmmproj_write then rejects it).
nm_genmmproj_params nm_genmmproj_default_params(const char *proj);

// Writes the mmproj to `path`. Weights are random from `seed`: norms near 1,
// matmul weights ~ N(0, 1/fan_in), so activations stay O(1) through the layers.
// Returns NM_OK, or NM_ERR_INVALID_ARG (inconsistent sizes, a row length the
// weight type cannot hold, an unknown projector or type), NM_ERR_NOMEM or
// NM_ERR_IO, with a message in err.
nm_status nm_genmmproj_write(const char *path, const nm_genmmproj_params *p, char *err, size_t err_size);

// Writes a random planar image (3 x image_size x image_size floats, R, G, B
// planes, row-major, values as a normalized image has: roughly N(0, 1)) to
// `path` as raw little-endian f32. For the reference and the oracle.
nm_status nm_genmmproj_write_input(const char *path, int32_t image_size, uint64_t seed, char *err, size_t err_size);
// The same for a width x height image (3 planes of height rows of width floats).
nm_status nm_genmmproj_write_input_size(const char *path, int32_t width, int32_t height, uint64_t seed, char *err,
                                        size_t err_size);

// Weight types the generator writes and tools/vision_ref/clip_ref.py reads.
bool nm_genmmproj_type_ok(uint32_t type);

#endif
