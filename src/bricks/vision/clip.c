// Vision encoder brick: loads an mmproj GGUF in llama.cpp's clip layout and
// runs the ViT and its projector as nm_ops on the CPU backend. Matmul weights
// stay mmapped in the file's type (f32, f16 or quantized: the LLM's fused
// kernels); the small vectors (norms, biases, position and class embeddings)
// are widened to f32 once at load. Everything a forward pass needs is sized at
// load for the encoder's one input shape, so nm_clip_encode allocates nothing.
//
// The computation follows llama.cpp's clip graphs (tools/mtmd: models/llava.cpp
// for "mlp", models/siglip.cpp + build_vit for "idefics3") so that the same
// file gives the same embeddings, including two of its conventions:
//  - mlp: the class token is appended AFTER the patches (position n_patches),
//    the layers run up to the second to last (or clip.vision.feature_layer),
//    and the projector reads rows 1..n_patches of the result: patch 0 is
//    dropped and the class token kept, each patch with its neighbour's
//    position embedding. HF's CLIP puts the class token first; this is an
//    upstream llama.cpp bug (ggml-org/llama.cpp issue 25814) that we follow
//    so that the same file gives the same embeddings in both;
//  - old conversions stored ffn_up/ffn_down swapped: detected by shape
//    (ffn_down reading n_embd inputs) and undone, as llama.cpp does.
//
// qwen2vl_merger (Qwen2-VL, llama.cpp's models/qwen2vl.cpp) takes images of
// any size of whole 28 x 28 cells: its op list is recorded again for each new
// size, into an arena sized at load for the largest (NM_CLIP_QWEN2VL_MAX_TOKENS
// cells; on the CPU anonymous memory, so only what an image touches becomes
// resident; a device buffer on OpenCL is allocated whole: ~1 GB at
// Qwen2-VL-2B's width, so "auto" falls back to the CPU where it does not fit).
// The two temporal conv kernels are summed once at load (a still image is the
// same frame twice); patches are taken in 2 x 2 groups, each patch's row and
// column turn the q and k heads (NM_ROPE_VISION), and the merger joins each
// group's four rows after the post-LN: rows are consecutive, so the joined
// rows are a view.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "bricks/vision/clip.h"
#include "gguf/gguf.h"
#include "quant/quant.h"
#include "bricks/brick_impl.h"
#include "core/fail.h"

typedef struct clip_layer {
    nm_tensor wq, wk, wv, wo, up, down;   // matmul weights, mmapped
    nm_tensor bq, bk, bv, bo, bup, bdown; // f32 vectors (data NULL if absent)
    nm_tensor ln1_w, ln1_b, ln2_w, ln2_b;
} clip_layer;

struct nm_clip {
    nm_gguf *g;
    nm_clip_info info;
    nm_backend *be;
    nm_tensor patch_w, patch_b, class_embd, pos_embd, pre_ln_w, pre_ln_b, post_ln_w, post_ln_b;
    float *patch_sum; // qwen2vl_merger: the two patch kernels summed (f32, owned)
    nm_tensor mm0_w, mm0_b, mm2_w, mm2_b, fc_w;
    clip_layer *layers;
    float *vec_mem; // owned f32 copies of the vectors
    size_t vec_used, vec_cap;
    int32_t n_pos, n_mm; // tokens through the ViT (of the recorded size); mlp hidden width
    int32_t max_pos;     // the most tokens through the ViT (the arena's size)
    int32_t rec_w, rec_h; // the image size the op list is recorded for
    nm_backend_caps caps;
    // activations: views of one buffer of the backend
    nm_buffer *arena;
    nm_tensor pix;       // (3 planes of image_size^2) the input, where the device cannot read the caller's
    nm_tensor patches;   // (n_patches, 3 p^2)
    nm_tensor x, cur, q, k, v, attn, o; // (n_pos, n_embd)
    nm_tensor ff;        // (n_pos, max(n_ff, n_mm))
    nm_tensor shuf;      // (n_out, n_embd n_merge^2): idefics3 pixel shuffle
    nm_tensor out;       // (n_out, n_out_embd) where the device cannot write the caller's
    nm_tensor vpos;      // qwen2vl_merger: i32 (2 n_pos) each patch's row, then each patch's column
    // the encoder's op list, recorded at load (one shape: the image size is fixed)
    nm_op *ops;
    nm_tensor *tens;
    int n_ops, cap_ops, n_tens, cap_tens;
    nm_tensor *in_pix, *in_out; // the graph's input and output tensors (bound per call to the caller's memory)
    char err[256];
};

// ---- loading ---------------------------------------------------------------------------

typedef struct loader {
    nm_clip *c;
    char *err;
    size_t err_size;
} loader;

#define LFAIL(L, st, ...) nm_fail(st, (L)->err, (L)->err_size, __VA_ARGS__)

static nm_status get_u32(loader *L, const char *key, bool required, int32_t *out) {
    const nm_gguf_kv *kv = nm_gguf_find(L->c->g, key);
    if (!kv) return required ? LFAIL(L, NM_ERR_FORMAT, "mmproj: missing metadata key '%s'", key) : NM_OK;
    int64_t v;
    if (!nm_gguf_get_i64(L->c->g, key, &v) || v < 0 || v > (1 << 24))
        return LFAIL(L, NM_ERR_FORMAT, "mmproj: metadata '%s' is not a valid count", key);
    *out = (int32_t)v;
    return NM_OK;
}

static nm_status get_f32_arr3(loader *L, const char *key, float out[3]) {
    const nm_gguf_kv *kv = nm_gguf_find(L->c->g, key);
    if (!kv) return LFAIL(L, NM_ERR_FORMAT, "mmproj: missing metadata key '%s'", key);
    if (kv->type != NM_GGUF_ARRAY || kv->arr_n < 3 || nm_gguf_vtype_size(kv->arr_type) == 0)
        return LFAIL(L, NM_ERR_FORMAT, "mmproj: metadata '%s' is not an array of 3 numbers", key);
    for (int i = 0; i < 3; i++) {
        out[i] = (float)nm_gguf_arr_num(kv, (uint64_t)i);
        if (!isfinite(out[i])) return LFAIL(L, NM_ERR_FORMAT, "mmproj: metadata '%s' has a non-finite value", key);
    }
    return NM_OK;
}

static bool get_flag(loader *L, const char *key) {
    bool b = false;
    return nm_gguf_get_bool(L->c->g, key, &b) && b;
}

// Finds tensor `name` and checks its shape: ne[0..n_dims) (trailing 1s may be
// omitted in the file). A missing optional tensor leaves *t zeroed.
static nm_status find(loader *L, nm_tensor *t, const char *name, bool required, int n_dims, const int64_t *ne) {
    memset(t, 0, sizeof *t);
    const nm_gguf_tensor *gt = nm_gguf_find_tensor(L->c->g, name);
    if (!gt) return required ? LFAIL(L, NM_ERR_FORMAT, "mmproj: missing tensor '%s'", name) : NM_OK;
    bool ok = true; // unused dims of a GGUF tensor read as 1
    for (int i = 0; i < 4 && ok; i++) ok = gt->ne[i] == (i < n_dims ? ne[i] : 1);
    if (!ok)
        return LFAIL(L, NM_ERR_FORMAT, "mmproj: tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld, %lld, %lld]",
                     name, (long long)gt->ne[0], (long long)gt->ne[1], (long long)gt->ne[2], (long long)gt->ne[3],
                     (long long)ne[0], (long long)(n_dims > 1 ? ne[1] : 1), (long long)(n_dims > 2 ? ne[2] : 1),
                     (long long)(n_dims > 3 ? ne[3] : 1));
    const nm_type_traits *tr = nm_type_traits_get(gt->type);
    if (!tr || !tr->supported)
        return LFAIL(L, NM_ERR_UNSUPPORTED, "mmproj: tensor '%s' has unsupported type %u (%s)", name, gt->type,
                     tr ? tr->name : "unknown");
    t->type = gt->type;
    for (int i = 0; i < 4; i++) t->ne[i] = gt->ne[i];
    t->buf = NULL; // host memory: the mapping
    t->offs = (size_t)(uintptr_t)gt->data;
    t->name = gt->name.ptr;
    return NM_OK;
}

// A matmul weight [K, O]: any supported type whose blocks divide K.
static nm_status find_mat(loader *L, nm_tensor *t, const char *name, bool required, int64_t K, int64_t O) {
    int64_t ne[2] = {K, O};
    nm_status st = find(L, t, name, required, 2, ne);
    if (st || !nm_tensor_is_set(t)) return st;
    if (nm_row_size(t->type, K) == 0)
        return LFAIL(L, NM_ERR_FORMAT, "mmproj: tensor '%s' (%s) rows of %lld are not whole blocks", name,
                     nm_type_traits_get(t->type)->name, (long long)K);
    return NM_OK;
}

// A vector of n (or an [n, rows] table), widened to f32 into the clip's own memory.
static nm_status find_vec(loader *L, nm_tensor *t, const char *name, bool required, int64_t n, int64_t rows) {
    int64_t ne[2] = {n, rows};
    nm_status st = find(L, t, name, required, 2, ne);
    if (st || !nm_tensor_is_set(t)) return st;
    nm_clip *c = L->c;
    const size_t count = (size_t)n * (size_t)rows;
    if (nm_row_size(t->type, n) == 0)
        return LFAIL(L, NM_ERR_FORMAT, "mmproj: tensor '%s' rows of %lld are not whole blocks", name, (long long)n);
    if (c->vec_used + count > c->vec_cap) return LFAIL(L, NM_ERR_FORMAT, "mmproj: vector tensors larger than sized");
    float *dst = c->vec_mem + c->vec_used;
    const nm_kernels *k = nm_kernels_get();
    const size_t rb = nm_row_size(t->type, n);
    for (int64_t r = 0; r < rows; r++) k->dequant[t->type]((const uint8_t *)nm_tensor_host(t) + (size_t)r * rb, dst + r * n, n);
    for (size_t i = 0; i < count; i++)
        if (!isfinite(dst[i])) return LFAIL(L, NM_ERR_FORMAT, "mmproj: tensor '%s' holds non-finite values", name);
    c->vec_used += count;
    t->type = NM_TYPE_F32;
    t->offs = (size_t)(uintptr_t)dst;
    return NM_OK;
}

static nm_status load_layer(loader *L, int il, clip_layer *ly) {
    const nm_clip_info *in = &L->c->info;
    const int64_t d = in->n_embd, f = in->n_ff;
    char name[96];
    nm_status st;
#define NAME(fmt) (snprintf(name, sizeof name, "v.blk.%d." fmt, il), name)
    // Fused or normed attention and gated FFNs belong to other projector families.
    static const char *const foreign[] = {"attn_qkv.weight", "attn_q_norm.weight", "ffn_gate.weight", "ls1.weight",
                                          "attn_post_norm.weight"};
    for (size_t i = 0; i < sizeof foreign / sizeof foreign[0]; i++) {
        snprintf(name, sizeof name, "v.blk.%d.%s", il, foreign[i]);
        if (nm_gguf_find_tensor(L->c->g, name))
            return LFAIL(L, NM_ERR_UNSUPPORTED, "mmproj: tensor '%s' is not part of a CLIP/SigLIP layer we run", name);
    }
    if ((st = find_mat(L, &ly->wq, NAME("attn_q.weight"), true, d, d)) ||
        (st = find_mat(L, &ly->wk, NAME("attn_k.weight"), true, d, d)) ||
        (st = find_mat(L, &ly->wv, NAME("attn_v.weight"), true, d, d)) ||
        (st = find_mat(L, &ly->wo, NAME("attn_out.weight"), true, d, d)) ||
        (st = find_vec(L, &ly->bq, NAME("attn_q.bias"), false, d, 1)) ||
        (st = find_vec(L, &ly->bk, NAME("attn_k.bias"), false, d, 1)) ||
        (st = find_vec(L, &ly->bv, NAME("attn_v.bias"), false, d, 1)) ||
        (st = find_vec(L, &ly->bo, NAME("attn_out.bias"), false, d, 1)) ||
        (st = find_vec(L, &ly->ln1_w, NAME("ln1.weight"), true, d, 1)) ||
        (st = find_vec(L, &ly->ln1_b, NAME("ln1.bias"), false, d, 1)) ||
        (st = find_vec(L, &ly->ln2_w, NAME("ln2.weight"), true, d, 1)) ||
        (st = find_vec(L, &ly->ln2_b, NAME("ln2.bias"), false, d, 1)))
        return st;
    // Up and down, in either order (old conversions swapped the names).
    const nm_gguf_tensor *tu = nm_gguf_find_tensor(L->c->g, NAME("ffn_up.weight"));
    const nm_gguf_tensor *td = nm_gguf_find_tensor(L->c->g, NAME("ffn_down.weight"));
    bool swapped = tu && td && td->ne[0] == d; // llama.cpp's test: down must read n_ff, not n_embd
    const char *up = swapped ? "ffn_down" : "ffn_up", *down = swapped ? "ffn_up" : "ffn_down";
    char nb[96];
    snprintf(nb, sizeof nb, "v.blk.%d.%s.weight", il, up);
    if ((st = find_mat(L, &ly->up, nb, true, d, f))) return st;
    snprintf(nb, sizeof nb, "v.blk.%d.%s.bias", il, up);
    if ((st = find_vec(L, &ly->bup, nb, false, f, 1))) return st;
    snprintf(nb, sizeof nb, "v.blk.%d.%s.weight", il, down);
    if ((st = find_mat(L, &ly->down, nb, true, f, d))) return st;
    snprintf(nb, sizeof nb, "v.blk.%d.%s.bias", il, down);
    if ((st = find_vec(L, &ly->bdown, nb, false, d, 1))) return st;
#undef NAME
    return NM_OK;
}

// clip.vision.image_grid_pinpoints (mlp only; llama.cpp reads them for the
// llava family): an even number of positive integers, each pair a candidate
// (width, height) of the anyres grid. We also require multiples of image_size:
// llama.cpp would encode a smaller last tile, our encoder has one input shape.
// (clip.vision.mm_patch_merge_type "spatial_unpad" is read by llama.cpp but not
// used by its mlp graph; nor here.)
static nm_status load_pinpoints(loader *L) {
    nm_clip_info *in = &L->c->info;
    const nm_gguf_kv *kv = nm_gguf_find(L->c->g, "clip.vision.image_grid_pinpoints");
    in->n_pinpoints = 0;
    if (!kv) return NM_OK;
    if (kv->type != NM_GGUF_ARRAY || nm_gguf_vtype_size(kv->arr_type) == 0 || kv->arr_type == NM_GGUF_BOOL)
        return LFAIL(L, NM_ERR_FORMAT, "mmproj: clip.vision.image_grid_pinpoints is not an array of numbers");
    if (kv->arr_n == 0 || kv->arr_n % 2 || kv->arr_n / 2 > NM_CLIP_MAX_PINPOINTS)
        return LFAIL(L, NM_ERR_FORMAT,
                     "mmproj: clip.vision.image_grid_pinpoints has %llu numbers: (width, height) pairs, 1 to %d of them",
                     (unsigned long long)kv->arr_n, NM_CLIP_MAX_PINPOINTS);
    const int32_t S = in->image_size;
    for (uint64_t i = 0; i < kv->arr_n; i += 2) {
        const double w = nm_gguf_arr_num(kv, i), h = nm_gguf_arr_num(kv, i + 1);
        const double most = (double)NM_CLIP_MAX_PINPOINT_TILES * S;
        if (!(w >= S && h >= S && w <= most && h <= most) || w != (int32_t)w || h != (int32_t)h || (int32_t)w % S ||
            (int32_t)h % S)
            return LFAIL(L, NM_ERR_UNSUPPORTED,
                         "mmproj: anyres resolution %gx%g is not a multiple of the %dx%d tile (1 to %d tiles a side)", w,
                         h, S, S, NM_CLIP_MAX_PINPOINT_TILES);
        in->pinpoints[i / 2][0] = (int32_t)w;
        in->pinpoints[i / 2][1] = (int32_t)h;
    }
    in->n_pinpoints = (int32_t)(kv->arr_n / 2);
    return NM_OK;
}

// Real ViTs have at most ~48 layers; a block_count past this is a corrupt file
// (and would size the layer table before any tensor is checked).
#define NM_CLIP_MAX_LAYERS 1024

// qwen2vl_merger: the FFN width from the first layer's fc1 (the tensor that
// reads n_embd inputs, under either name): the converters write the LLM's
// width, or 0, as clip.vision.feed_forward_length.
static nm_status qwen_ffn_width(loader *L) {
    nm_clip_info *in = &L->c->info;
    const nm_gguf_tensor *up = nm_gguf_find_tensor(L->c->g, "v.blk.0.ffn_up.weight");
    const nm_gguf_tensor *down = nm_gguf_find_tensor(L->c->g, "v.blk.0.ffn_down.weight");
    if (!up || !down) return LFAIL(L, NM_ERR_FORMAT, "mmproj: missing tensor 'v.blk.0.ffn_%s.weight'", up ? "down" : "up");
    const nm_gguf_tensor *fc1 = down->ne[0] == in->n_embd ? down : up;
    if (fc1->ne[1] <= 0 || fc1->ne[1] > (1 << 20))
        return LFAIL(L, NM_ERR_FORMAT, "mmproj: tensor '%s' gives an FFN width of %lld", fc1->name.ptr,
                     (long long)fc1->ne[1]);
    in->n_ff = (int32_t)fc1->ne[1];
    return NM_OK;
}

static nm_status qwen_hparams(loader *L) {
    nm_clip_info *in = &L->c->info;
    nm_status st;
    if (in->act == NM_CLIP_ACT_SILU)
        return LFAIL(L, NM_ERR_UNSUPPORTED, "mmproj: qwen2vl_merger with clip.use_silu (Qwen2.5-VL's gated FFN) is "
                                            "not supported");
    in->n_merge = 2;
    if ((st = get_u32(L, "clip.vision.spatial_merge_size", false, &in->n_merge))) return st;
    if (in->n_merge != 2) return LFAIL(L, NM_ERR_UNSUPPORTED, "mmproj: spatial_merge_size %d (only 2 is supported)", in->n_merge);
    if (nm_gguf_find(L->c->g, "clip.vision.n_wa_pattern"))
        return LFAIL(L, NM_ERR_UNSUPPORTED, "mmproj: window attention (clip.vision.n_wa_pattern) is not supported");
    const int32_t hd = in->n_embd / in->n_head, cell = in->patch_size * in->n_merge;
    if (hd % 4 || hd > 1024) return LFAIL(L, NM_ERR_FORMAT, "mmproj: head size %d is not a multiple of 4 up to 1024", hd);
    if (in->image_size % cell)
        return LFAIL(L, NM_ERR_FORMAT, "mmproj: image_size %d is not a multiple of the %d-pixel merge cell",
                     in->image_size, cell);
    in->n_layer_run = in->n_layer;
    in->min_tokens = NM_CLIP_QWEN2VL_MIN_TOKENS;
    in->max_tokens = NM_CLIP_QWEN2VL_MAX_TOKENS;
    const int32_t side = in->image_size / in->patch_size;
    in->n_patches = side * side;
    in->n_out = in->max_tokens;
    return NM_OK;
}

// Hyperparameters and their consistency.
static nm_status load_hparams(loader *L) {
    nm_clip *c = L->c;
    nm_clip_info *in = &c->info;
    nm_str s;
    if (!nm_gguf_get_str(c->g, "clip.projector_type", &s) && !nm_gguf_get_str(c->g, "clip.vision.projector_type", &s))
        return LFAIL(L, NM_ERR_FORMAT, "not an mmproj file: no clip.projector_type key");
    if (nm_gguf_find(c->g, "clip.has_vision_encoder") && !get_flag(L, "clip.has_vision_encoder"))
        return LFAIL(L, NM_ERR_UNSUPPORTED, "mmproj: the file has no vision encoder");
    if (nm_str_eq(s, "mlp")) in->proj = NM_CLIP_PROJ_MLP;
    else if (nm_str_eq(s, "idefics3")) in->proj = NM_CLIP_PROJ_IDEFICS3;
    else if (nm_str_eq(s, "qwen2vl_merger")) in->proj = NM_CLIP_PROJ_QWEN2VL;
    else
        return LFAIL(L, NM_ERR_UNSUPPORTED,
                     "mmproj: projector type '%.*s' is not supported (mlp, idefics3, qwen2vl_merger are)",
                     (int)(s.len < 64 ? s.len : 64), s.ptr);
    const bool qwen = in->proj == NM_CLIP_PROJ_QWEN2VL;
    nm_status st;
    in->eps = 1e-6f;
    int32_t n_head_kv = 0, head_dim = 0;
    if ((st = get_u32(L, "clip.vision.embedding_length", true, &in->n_embd)) ||
        (st = get_u32(L, "clip.vision.feed_forward_length", !qwen, &in->n_ff)) ||
        (st = get_u32(L, "clip.vision.attention.head_count", true, &in->n_head)) ||
        (st = get_u32(L, "clip.vision.attention.head_count_kv", false, &n_head_kv)) ||
        (st = get_u32(L, "clip.vision.attention.head_dim", false, &head_dim)) ||
        (st = get_u32(L, "clip.vision.block_count", true, &in->n_layer)) ||
        (st = get_u32(L, "clip.vision.image_size", true, &in->image_size)) ||
        (st = get_u32(L, "clip.vision.patch_size", true, &in->patch_size)) ||
        (st = get_u32(L, "clip.vision.preproc_image_size", false, &in->preproc_image_size)) ||
        (st = get_f32_arr3(L, "clip.vision.image_mean", in->mean)) ||
        (st = get_f32_arr3(L, "clip.vision.image_std", in->std)))
        return st;
    if (!nm_gguf_find(c->g, "clip.vision.attention.layer_norm_epsilon"))
        return LFAIL(L, NM_ERR_FORMAT, "mmproj: missing metadata key 'clip.vision.attention.layer_norm_epsilon'");
    if (!nm_gguf_get_f32(c->g, "clip.vision.attention.layer_norm_epsilon", &in->eps) || !(in->eps >= 0.0f) ||
        !isfinite(in->eps))
        return LFAIL(L, NM_ERR_FORMAT, "mmproj: layer_norm_epsilon is not a finite float >= 0");
    for (int i = 0; i < 3; i++)
        if (!(in->std[i] > 0.0f)) return LFAIL(L, NM_ERR_FORMAT, "mmproj: image_std[%d] is not positive", i);
    if (qwen && (st = qwen_ffn_width(L))) return st;
    if (in->n_embd <= 0 || in->n_ff <= 0 || in->n_head <= 0 || in->n_layer <= 0 || in->n_embd % in->n_head)
        return LFAIL(L, NM_ERR_FORMAT, "mmproj: inconsistent sizes (n_embd %d, n_ff %d, n_head %d, layers %d)",
                     in->n_embd, in->n_ff, in->n_head, in->n_layer);
    if (in->n_layer > NM_CLIP_MAX_LAYERS || in->n_embd > 65536 || in->n_ff > 1 << 20)
        return LFAIL(L, NM_ERR_FORMAT, "mmproj: sizes out of range (layers %d of at most %d, n_embd %d, n_ff %d)",
                     in->n_layer, NM_CLIP_MAX_LAYERS, in->n_embd, in->n_ff);
    if ((n_head_kv && n_head_kv != in->n_head) || (head_dim && head_dim * in->n_head != in->n_embd))
        return LFAIL(L, NM_ERR_UNSUPPORTED, "mmproj: grouped or non-standard attention heads are not supported");
    if (in->image_size <= 0 || in->image_size > 4096)
        return LFAIL(L, NM_ERR_FORMAT, "mmproj: image_size %d is out of range 1..4096", in->image_size);
    if (in->patch_size <= 0 || in->image_size % in->patch_size)
        return LFAIL(L, NM_ERR_FORMAT, "mmproj: image_size %d is not a multiple of patch_size %d", in->image_size,
                     in->patch_size);
    const bool gelu = get_flag(L, "clip.use_gelu"), silu = get_flag(L, "clip.use_silu");
    if (gelu && silu) return LFAIL(L, NM_ERR_FORMAT, "mmproj: both clip.use_gelu and clip.use_silu are set");
    in->act = gelu ? NM_CLIP_ACT_GELU : silu ? NM_CLIP_ACT_SILU : NM_CLIP_ACT_GELU_QUICK;
    if (qwen) return qwen_hparams(L);
    const int32_t side = in->image_size / in->patch_size;
    in->n_patches = side * side;
    in->n_merge = 1;
    in->n_layer_run = in->n_layer;
    if (in->proj == NM_CLIP_PROJ_MLP) {
        in->n_layer_run = in->n_layer - 1; // llava reads the second to last layer
        const nm_gguf_kv *fl = nm_gguf_find(c->g, "clip.vision.feature_layer");
        if (fl) {
            if (fl->type != NM_GGUF_ARRAY || fl->arr_n != 1 || nm_gguf_vtype_size(fl->arr_type) == 0)
                return LFAIL(L, NM_ERR_UNSUPPORTED, "mmproj: clip.vision.feature_layer with several layers (stacked "
                                                    "features) is not supported");
            double v = nm_gguf_arr_num(fl, 0);
            if (!(v >= 1 && v <= in->n_layer))
                return LFAIL(L, NM_ERR_FORMAT, "mmproj: feature layer %g out of range 1..%d", v, in->n_layer);
            in->n_layer_run = (int32_t)v;
        }
        if (in->n_layer_run < 1) return LFAIL(L, NM_ERR_FORMAT, "mmproj: an mlp encoder needs at least 2 layers");
        if ((st = load_pinpoints(L))) return st;
    } else {
        if ((st = get_u32(L, "clip.vision.projector.scale_factor", true, &in->n_merge))) return st;
        if (in->n_merge < 2 || side % in->n_merge)
            return LFAIL(L, NM_ERR_FORMAT, "mmproj: scale_factor %d does not divide the %dx%d patch grid", in->n_merge,
                         side, side);
    }
    return NM_OK;
}

// qwen2vl_merger: two patch kernels (summed here into an f32 [3 p p, n_embd]
// matrix), no bias, class token, position table or pre-LN; the layers; the
// post-LN; mm.0 over four joined patches, mm.2 to the LLM's width.
static nm_status qwen_tensors(loader *L) {
    nm_clip *c = L->c;
    nm_clip_info *in = &c->info;
    const int64_t d = in->n_embd, p = in->patch_size, K = 3 * p * p;
    int64_t pe[4] = {p, p, 3, d};
    nm_tensor k0, k1;
    nm_status st;
    if ((st = find(L, &k0, "v.patch_embd.weight", true, 4, pe)) || (st = find(L, &k1, "v.patch_embd.weight.1", true, 4, pe)))
        return st;
    static const char *const foreign[] = {"v.patch_embd.bias", "v.class_embd", "v.pre_ln.weight"};
    for (size_t i = 0; i < sizeof foreign / sizeof foreign[0]; i++)
        if (nm_gguf_find_tensor(c->g, foreign[i]))
            return LFAIL(L, NM_ERR_UNSUPPORTED, "mmproj: tensor '%s' is not part of a qwen2vl_merger encoder", foreign[i]);
    if (!(c->patch_sum = malloc((size_t)(K * d) * sizeof(float) * 2)))
        return LFAIL(L, NM_ERR_NOMEM, "mmproj: out of memory for the patch kernel");
    float *tmp = c->patch_sum + K * d;
    const nm_kernels *kr = nm_kernels_get();
    const size_t rb = nm_row_size(k0.type, K), rb1 = nm_row_size(k1.type, K);
    if (!rb || !rb1) return LFAIL(L, NM_ERR_FORMAT, "mmproj: patch kernel rows of %lld are not whole blocks", (long long)K);
    for (int64_t o = 0; o < d; o++) {
        kr->dequant[k0.type]((const uint8_t *)nm_tensor_host(&k0) + (size_t)o * rb, c->patch_sum + o * K, K);
        kr->dequant[k1.type]((const uint8_t *)nm_tensor_host(&k1) + (size_t)o * rb1, tmp, K);
        for (int64_t i = 0; i < K; i++) {
            c->patch_sum[o * K + i] += tmp[i];
            if (!isfinite(c->patch_sum[o * K + i]))
                return LFAIL(L, NM_ERR_FORMAT, "mmproj: the patch kernels hold non-finite values");
        }
    }
    c->patch_w = nm_tensor_at(c->patch_sum, NM_TYPE_F32, K, d);
    if ((st = find_vec(L, &c->post_ln_w, "v.post_ln.weight", true, d, 1)) ||
        (st = find_vec(L, &c->post_ln_b, "v.post_ln.bias", false, d, 1)))
        return st;
    for (int il = 0; il < in->n_layer_run; il++)
        if ((st = load_layer(L, il, &c->layers[il]))) return st;
    const nm_gguf_tensor *m0 = nm_gguf_find_tensor(c->g, "mm.0.weight"), *m2 = nm_gguf_find_tensor(c->g, "mm.2.weight");
    if (!m0 || !m2) return LFAIL(L, NM_ERR_FORMAT, "mmproj: missing tensor '%s'", m0 ? "mm.2.weight" : "mm.0.weight");
    c->n_mm = (int32_t)m0->ne[1];
    in->n_out_embd = (int32_t)m2->ne[1];
    if ((st = find_mat(L, &c->mm0_w, "mm.0.weight", true, 4 * d, c->n_mm)) ||
        (st = find_vec(L, &c->mm0_b, "mm.0.bias", true, c->n_mm, 1)) ||
        (st = find_mat(L, &c->mm2_w, "mm.2.weight", true, c->n_mm, in->n_out_embd)) ||
        (st = find_vec(L, &c->mm2_b, "mm.2.bias", true, in->n_out_embd, 1)))
        return st;
    if (in->n_out_embd <= 0) return LFAIL(L, NM_ERR_FORMAT, "mmproj: projector output width is 0");
    return NM_OK;
}

static nm_status load_tensors(loader *L) {
    nm_clip *c = L->c;
    nm_clip_info *in = &c->info;
    const int64_t d = in->n_embd, p = in->patch_size;
    nm_status st;
    if (in->proj == NM_CLIP_PROJ_QWEN2VL) return qwen_tensors(L);
    if (nm_gguf_find_tensor(c->g, "v.patch_embd.weight.1"))
        return LFAIL(L, NM_ERR_UNSUPPORTED, "mmproj: a second patch embedding (video models) is not supported");
    int64_t pe[4] = {p, p, 3, d};
    if ((st = find(L, &c->patch_w, "v.patch_embd.weight", true, 4, pe))) return st;
    if (nm_row_size(c->patch_w.type, 3 * p * p) == 0)
        return LFAIL(L, NM_ERR_FORMAT, "mmproj: patch embedding rows of %lld are not whole blocks of its type",
                     (long long)(3 * p * p));
    c->patch_w.ne[0] = 3 * p * p; // the kernel as a [3 p p, n_embd] matrix: row = (channel, y, x)
    c->patch_w.ne[1] = d;
    c->patch_w.ne[2] = c->patch_w.ne[3] = 1;
    if ((st = find_vec(L, &c->patch_b, "v.patch_embd.bias", false, d, 1)) ||
        (st = find_vec(L, &c->class_embd, "v.class_embd", false, d, 1)))
        return st;
    in->has_class_embd = nm_tensor_is_set(&c->class_embd);
    c->n_pos = in->n_patches + (in->has_class_embd ? 1 : 0);
    if ((st = find_vec(L, &c->pos_embd, "v.position_embd.weight", true, d, c->n_pos)) ||
        (st = find_vec(L, &c->pre_ln_w, "v.pre_ln.weight", false, d, 1)) ||
        (st = find_vec(L, &c->pre_ln_b, "v.pre_ln.bias", false, d, 1)) ||
        (st = find_vec(L, &c->post_ln_w, "v.post_ln.weight", false, d, 1)) ||
        (st = find_vec(L, &c->post_ln_b, "v.post_ln.bias", false, d, 1)))
        return st;
    for (int il = 0; il < in->n_layer_run; il++)
        if ((st = load_layer(L, il, &c->layers[il]))) return st;
    if (in->proj == NM_CLIP_PROJ_MLP) {
        const nm_gguf_tensor *m0 = nm_gguf_find_tensor(c->g, "mm.0.weight");
        if (!m0) return LFAIL(L, NM_ERR_FORMAT, "mmproj: missing tensor 'mm.0.weight'");
        c->n_mm = (int32_t)m0->ne[1];
        if ((st = find_mat(L, &c->mm0_w, "mm.0.weight", true, d, c->n_mm)) ||
            (st = find_vec(L, &c->mm0_b, "mm.0.bias", true, c->n_mm, 1)))
            return st;
        const nm_gguf_tensor *m2 = nm_gguf_find_tensor(c->g, "mm.2.weight");
        in->n_out_embd = c->n_mm;
        if (m2) {
            in->n_out_embd = (int32_t)m2->ne[1];
            if ((st = find_mat(L, &c->mm2_w, "mm.2.weight", true, c->n_mm, in->n_out_embd)) ||
                (st = find_vec(L, &c->mm2_b, "mm.2.bias", true, in->n_out_embd, 1)))
                return st;
        }
        if (nm_gguf_find_tensor(c->g, "mm.1.weight") || nm_gguf_find_tensor(c->g, "mm.3.weight"))
            return LFAIL(L, NM_ERR_UNSUPPORTED, "mmproj: an mlp projector with mm.1/mm.3 (mlp_norm) is not supported");
        in->n_out = in->n_patches;
    } else {
        const int64_t kin = d * in->n_merge * in->n_merge;
        const nm_gguf_tensor *fc = nm_gguf_find_tensor(c->g, "mm.model.fc.weight");
        if (!fc) return LFAIL(L, NM_ERR_FORMAT, "mmproj: missing tensor 'mm.model.fc.weight'");
        in->n_out_embd = (int32_t)fc->ne[1];
        if ((st = find_mat(L, &c->fc_w, "mm.model.fc.weight", true, kin, in->n_out_embd))) return st;
        in->n_out = in->n_patches / (in->n_merge * in->n_merge);
    }
    if (in->n_out_embd <= 0) return LFAIL(L, NM_ERR_FORMAT, "mmproj: projector output width is 0");
    return NM_OK;
}

// The file's layers against clip.vision.block_count (as the LLM loader does): a tensor of a layer past
// it, or a layer before it without tensors (those not run are not loaded), means a wrong block_count,
// and an encoder run with it answers wrongly. projection_dim, when given, is the projector's width.
static nm_status check_layers(loader *L) {
    const nm_clip *c = L->c;
    const nm_clip_info *in = &c->info;
    for (int64_t i = 0; i < nm_gguf_n_tensors(c->g); i++) {
        const nm_gguf_tensor *t = nm_gguf_tensor_at(c->g, i);
        if (t->name.len <= 6 || memcmp(t->name.ptr, "v.blk.", 6)) continue;
        const long blk = strtol(t->name.ptr + 6, NULL, 10);
        if (blk >= in->n_layer)
            return LFAIL(L, NM_ERR_FORMAT, "mmproj: tensor '%.*s' belongs to layer %ld, but clip.vision.block_count is %d",
                         (int)(t->name.len > 96 ? 96 : t->name.len), t->name.ptr, blk, in->n_layer);
    }
    for (int il = in->n_layer_run; il < in->n_layer; il++) {
        char name[64];
        snprintf(name, sizeof name, "v.blk.%d.attn_q.weight", il);
        if (!nm_gguf_find_tensor(c->g, name))
            return LFAIL(L, NM_ERR_FORMAT, "mmproj: clip.vision.block_count is %d, but layer %d has no tensors ('%s')",
                         in->n_layer, il, name);
    }
    int32_t proj_dim = 0;
    nm_status st = get_u32(L, "clip.vision.projection_dim", false, &proj_dim);
    if (st) return st;
    if (proj_dim && proj_dim != in->n_out_embd)
        return LFAIL(L, NM_ERR_FORMAT, "mmproj: clip.vision.projection_dim is %d, but the projector gives %d values a token",
                     proj_dim, in->n_out_embd);
    return NM_OK;
}

void nm_clip_free(nm_clip *c) {
    if (!c) return;
    if (c->be) nm_backend_buffer_free(c->be, c->arena);
    nm_backend_free(c->be);
    free(c->ops);
    free(c->tens);
    free(c->layers);
    free(c->vec_mem);
    free(c->patch_sum);
    nm_gguf_close(c->g);
    free(c);
}

// From a file (path) or from memory (data, size).
static nm_status record(nm_clip *c, int32_t W, int32_t H);

static nm_status clip_load(const char *path, const void *data, size_t size, const char *device, int32_t n_threads,
                           nm_clip **out, char *err, size_t err_size) {
    *out = NULL;
    nm_clip *c = calloc(1, sizeof *c);
    if (!c) return nm_fail(NM_ERR_NOMEM, err, err_size, "out of memory");
    loader L = {c, err, err_size};
    nm_status st = path ? nm_gguf_open(path, &c->g, err, err_size) : nm_gguf_open_memory(data, size, &c->g, err, err_size);
    if (st) goto fail;
    if ((st = load_hparams(&L))) goto fail;
    nm_clip_info *in = &c->info;
    // Upper bound of the widened vectors: every tensor of n_embd-ish size or smaller, plus the position table.
    c->vec_cap = 0;
    for (int64_t i = 0; i < nm_gguf_n_tensors(c->g); i++) {
        const nm_gguf_tensor *t = nm_gguf_tensor_at(c->g, i);
        if (t->ne[1] * t->ne[2] * t->ne[3] <= 1 || nm_str_eq(t->name, "v.position_embd.weight"))
            c->vec_cap += (size_t)(t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]);
    }
    c->vec_mem = malloc((c->vec_cap ? c->vec_cap : 1) * sizeof(float));
    c->layers = calloc((size_t)in->n_layer, sizeof *c->layers);
    if (!c->vec_mem || !c->layers) {
        st = nm_fail(NM_ERR_NOMEM, err, err_size, "out of memory");
        goto fail;
    }
    if ((st = load_tensors(&L)) || (st = check_layers(&L))) goto fail;
    if (in->proj != NM_CLIP_PROJ_QWEN2VL) in->min_tokens = in->max_tokens = in->n_out;

    const bool qwen = in->proj == NM_CLIP_PROJ_QWEN2VL;
    c->max_pos = qwen ? in->max_tokens * in->n_merge * in->n_merge : c->n_pos;
    const int64_t d = in->n_embd, T = c->max_pos, p = in->patch_size, mm = in->n_merge;
    int64_t max_row = 3 * p * p;
    const int64_t widths[] = {d, in->n_ff, c->n_mm, d * mm * mm};
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++) max_row = widths[i] > max_row ? widths[i] : max_row;
    int64_t ffw = in->n_ff > c->n_mm ? in->n_ff : c->n_mm;
    const nm_backend_params bp = {.n_threads = n_threads, .max_row = max_row, .max_tokens = T,
                                  .attn_max_seq = T, .attn_head_dim = d / in->n_head};
    char berr[512] = "";
    if ((st = nm_backend_create(device, &bp, &c->be, berr, sizeof berr)) != NM_OK) {
        nm_fail(st, err, err_size, "vision encoder: %s", berr);
        goto fail;
    }
    nm_backend_get_caps(c->be, &c->caps);
    // the weights and the widened vectors, read in place (copied once only to a device that cannot)
    const uint8_t *lo = NULL, *hi = NULL;
    for (int64_t i = 0; i < nm_gguf_n_tensors(c->g); i++) {
        const nm_gguf_tensor *t = nm_gguf_tensor_at(c->g, i);
        const uint8_t *tp = (const uint8_t *)t->data;
        if (!lo || tp < lo) lo = tp;
        if (tp + t->nbytes > hi) hi = tp + t->nbytes;
    }
    if ((hi > lo && (st = nm_backend_import_host(c->be, lo, (size_t)(hi - lo), false)) != NM_OK) ||
        (c->vec_used && (st = nm_backend_import_host(c->be, c->vec_mem, c->vec_used * sizeof(float), false)) != NM_OK) ||
        (c->patch_sum && (st = nm_backend_import_host(c->be, c->patch_sum, (size_t)(3 * p * p * d) * sizeof(float),
                                                                 false)) != NM_OK)) {
        nm_fail(st, err, err_size, "vision encoder: the weights: %s", nm_backend_last_error(c->be));
        goto fail;
    }
    const int64_t S = in->image_size, n_out_rows = in->n_out, ow = in->n_out_embd, P = 3 * p * p;
    const int64_t n_pix = qwen ? P * T : 3 * S * S, n_patch_rows = qwen ? T : in->n_patches;
    const int64_t dims[][2] = {{n_pix, 1}, {P, n_patch_rows}, {d, T}, {d, T}, {d, T}, {d, T}, {d, T},
                               {d, T}, {d, T}, {ffw, T}, {d * mm * mm, qwen ? 1 : n_out_rows}, {ow, n_out_rows},
                               {qwen ? 2 * T : 1, 1}};
    nm_tensor *views[] = {&c->pix, &c->patches, &c->x, &c->cur, &c->q, &c->k, &c->v, &c->attn, &c->o, &c->ff,
                          &c->shuf, &c->out, &c->vpos};
    size_t bytes = 0;
    for (size_t i = 0; i < sizeof views / sizeof views[0]; i++)
        bytes += ((size_t)(dims[i][0] * dims[i][1]) * sizeof(float) + 63) / 64 * 64;
    if (!(c->arena = nm_backend_buffer_alloc(c->be, bytes))) {
        st = nm_fail(NM_ERR_NOMEM, err, err_size, "vision encoder: the activations: %s", nm_backend_last_error(c->be));
        goto fail;
    }
    size_t at = 0;
    for (size_t i = 0; i < sizeof views / sizeof views[0]; i++) {
        *views[i] = (nm_tensor){.type = NM_TYPE_F32, .ne = {dims[i][0], dims[i][1], 1, 1}, .buf = c->arena, .offs = at};
        at += ((size_t)(dims[i][0] * dims[i][1]) * sizeof(float) + 63) / 64 * 64;
    }
    c->vpos.type = NM_TYPE_I32;
    if ((st = record(c, (int32_t)S, (int32_t)S)) != NM_OK) {
        nm_fail(st, err, err_size, "%s", c->err);
        goto fail;
    }
    *out = c;
    return NM_OK;
fail:
    nm_clip_free(c);
    return st;
}

// device "auto": OpenCL if it loads and runs the encoder, else the CPU.
static nm_status clip_load_auto(const char *path, const void *data, size_t size, const char *device,
                                int32_t n_threads, nm_clip **out, char *err, size_t err_size) {
    if (!device || strcmp(device, "auto") != 0) return clip_load(path, data, size, device, n_threads, out, err, err_size);
    if (clip_load(path, data, size, "opencl:auto", n_threads, out, err, err_size) == NM_OK) return NM_OK;
    return clip_load(path, data, size, "cpu", n_threads, out, err, err_size);
}

nm_status nm_clip_load(const char *path, const char *device, int32_t n_threads, nm_clip **out, char *err,
                       size_t err_size) {
    if (!path || !out) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "nm_clip_load: NULL argument");
    return clip_load_auto(path, NULL, 0, device, n_threads, out, err, err_size);
}

nm_status nm_clip_load_memory(const void *data, size_t size, const char *device, int32_t n_threads, nm_clip **out,
                              char *err, size_t err_size) {
    if (!data || !out) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "nm_clip_load_memory: NULL argument");
    return clip_load_auto(NULL, data, size, device, n_threads, out, err, err_size);
}

const char *nm_clip_device(const nm_clip *c) { return nm_backend_name(c->be); }

const nm_clip_info *nm_clip_get_info(const nm_clip *c) { return c ? &c->info : NULL; }
const char *nm_clip_last_error(const nm_clip *c) { return c ? c->err : ""; }

// ---- forward ---------------------------------------------------------------------------

// A tensor of the graph: rows [r0, r0 + n) of an activation, rows of w floats.
static nm_tensor *rows(nm_clip *c, const nm_tensor *base, int64_t w, int64_t r0, int64_t n) {
    if (c->n_tens == c->cap_tens) return NULL;
    nm_tensor *t = &c->tens[c->n_tens++];
    *t = *base;
    t->ne[0] = w;
    t->ne[1] = n;
    t->offs += (size_t)(r0 * w) * sizeof(float);
    return t;
}

static void emit(nm_clip *c, nm_op op) {
    if (c->n_ops < c->cap_ops) c->ops[c->n_ops++] = op;
    else c->n_ops = c->cap_ops + 1; // overflow: record() fails
}

static const nm_tensor *opt(const nm_tensor *t) { return t && nm_tensor_is_set(t) ? t : NULL; }

static void layer_record(nm_clip *c, const clip_layer *ly) {
    const nm_clip_info *in = &c->info;
    const int64_t d = in->n_embd, T = c->n_pos, hd = d / in->n_head;
    static const int acts[] = {[NM_CLIP_ACT_GELU_QUICK] = NM_ACT_GELU_QUICK, [NM_CLIP_ACT_GELU] = NM_ACT_GELU_TANH,
                               [NM_CLIP_ACT_SILU] = NM_ACT_SILU};
    nm_tensor *x = rows(c, &c->x, d, 0, T), *cur = rows(c, &c->cur, d, 0, T), *o = rows(c, &c->o, d, 0, T);
    nm_tensor *q = rows(c, &c->q, d, 0, T), *k = rows(c, &c->k, d, 0, T), *v = rows(c, &c->v, d, 0, T);
    nm_tensor *attn = rows(c, &c->attn, d, 0, T), *ff = rows(c, &c->ff, in->n_ff, 0, T);
    emit(c, (nm_op){.kind = NM_OP_NORM, .src0 = x, .src1 = opt(&ly->ln1_w), .src2 = opt(&ly->ln1_b), .dst = cur,
                    .f0 = in->eps});
    // Q, K and V read the same normed input: consecutive, so a backend may share its preparation
    emit(c, (nm_op){.kind = NM_OP_MATMUL, .src0 = &ly->wq, .src1 = cur, .src2 = opt(&ly->bq), .dst = q});
    emit(c, (nm_op){.kind = NM_OP_MATMUL, .src0 = &ly->wk, .src1 = cur, .src2 = opt(&ly->bk), .dst = k});
    emit(c, (nm_op){.kind = NM_OP_MATMUL, .src0 = &ly->wv, .src1 = cur, .src2 = opt(&ly->bv), .dst = v});
    if (in->proj == NM_CLIP_PROJ_QWEN2VL) { // each head's quarters: rows turn by the patch's row, then its column
        const nm_op r = {.kind = NM_OP_ROPE, .ids = &c->vpos, .f0 = 10000.0f, .f1 = 1.0f, .i0 = in->n_head,
                         .i1 = (int32_t)hd, .i2 = NM_ROPE_VISION, .i3 = (int32_t)hd, .rope_sections = {(int32_t)hd / 4}};
        nm_op rq = r, rk = r;
        rq.src0 = rq.dst = q;
        rk.src0 = rk.dst = k;
        emit(c, rq);
        emit(c, rk);
    }
    emit(c, (nm_op){.kind = NM_OP_ATTENTION_FULL, .src0 = q, .src1 = k, .src2 = v, .dst = attn,
                    .f0 = 1.0f / sqrtf((float)hd), .i0 = in->n_head, .i2 = (int32_t)hd});
    emit(c, (nm_op){.kind = NM_OP_MATMUL, .src0 = &ly->wo, .src1 = attn, .src2 = opt(&ly->bo), .dst = o});
    emit(c, (nm_op){.kind = NM_OP_ADD, .src0 = x, .src1 = o, .dst = x});
    emit(c, (nm_op){.kind = NM_OP_NORM, .src0 = x, .src1 = opt(&ly->ln2_w), .src2 = opt(&ly->ln2_b), .dst = cur,
                    .f0 = in->eps});
    emit(c, (nm_op){.kind = NM_OP_MATMUL, .src0 = &ly->up, .src1 = cur, .src2 = opt(&ly->bup), .dst = ff});
    emit(c, (nm_op){.kind = NM_OP_ACT, .src0 = ff, .dst = ff, .i0 = acts[in->act]});
    emit(c, (nm_op){.kind = NM_OP_MATMUL, .src0 = &ly->down, .src1 = ff, .src2 = opt(&ly->bdown), .dst = o});
    emit(c, (nm_op){.kind = NM_OP_ADD, .src0 = x, .src1 = o, .dst = x});
}

// qwen2vl_merger: the encoder of a W x H image (whole merge cells). Patches
// in 2 x 2 groups, each with its row and column for the rope; the post-LN;
// each group's four rows, consecutive, read as one row of 4 n_embd by mm.0.
static nm_status record_qwen(nm_clip *c, int32_t W, int32_t H) {
    const nm_clip_info *in = &c->info;
    const int64_t d = in->n_embd, p = in->patch_size, gw = W / p, gh = H / p, N = gw * gh, P = 3 * p * p;
    c->n_pos = (int32_t)N;
    int32_t *pos = malloc(2 * (size_t)N * sizeof *pos);
    if (!pos) return nm_fail(NM_ERR_NOMEM, c->err, sizeof c->err, "out of memory recording the encoder");
    for (int64_t t = 0; t < N; t++) { // the order of NM_OP_PATCHES' 2 x 2 groups
        const int64_t g = t / 4, yb = g / (gw / 2), xb = g % (gw / 2);
        pos[t] = (int32_t)(2 * yb + (t / 2) % 2);
        pos[N + t] = (int32_t)(2 * xb + t % 2);
    }
    nm_tensor *vpos = rows(c, &c->vpos, 2 * N, 0, 1);
    nm_status st = vpos ? nm_backend_tensor_set(c->be, vpos, 0, pos, 2 * (size_t)N * sizeof *pos) : NM_ERR_RANGE;
    free(pos);
    if (st != NM_OK) return nm_fail(st, c->err, sizeof c->err, "vision encoder: the positions: %s", nm_backend_last_error(c->be));
    c->vpos.ne[0] = 2 * N; // the layers' ropes read c->vpos
    c->in_pix = rows(c, &c->pix, P * N, 0, 1);
    nm_tensor *patches = rows(c, &c->patches, P, 0, N), *x = rows(c, &c->x, d, 0, N);
    emit(c, (nm_op){.kind = NM_OP_PATCHES, .src0 = c->in_pix, .dst = patches, .i0 = W, .i1 = (int32_t)p, .i2 = H, .i3 = 2});
    emit(c, (nm_op){.kind = NM_OP_MATMUL, .src0 = &c->patch_w, .src1 = patches, .dst = x});
    for (int il = 0; il < in->n_layer_run; il++) layer_record(c, &c->layers[il]);
    emit(c, (nm_op){.kind = NM_OP_NORM, .src0 = x, .src1 = &c->post_ln_w, .src2 = opt(&c->post_ln_b), .dst = x,
                    .f0 = in->eps});
    const int64_t n_out = N / 4;
    c->in_out = rows(c, &c->out, in->n_out_embd, 0, n_out);
    nm_tensor *feat = rows(c, &c->x, 4 * d, 0, n_out), *h = rows(c, &c->ff, c->n_mm, 0, n_out);
    emit(c, (nm_op){.kind = NM_OP_MATMUL, .src0 = &c->mm0_w, .src1 = feat, .src2 = opt(&c->mm0_b), .dst = h});
    emit(c, (nm_op){.kind = NM_OP_ACT, .src0 = h, .dst = h, .i0 = NM_ACT_GELU_TANH});
    emit(c, (nm_op){.kind = NM_OP_MATMUL, .src0 = &c->mm2_w, .src1 = h, .src2 = opt(&c->mm2_b), .dst = c->in_out});
    return NM_OK;
}

// Records the encoder for a W x H image: patches (rows in the order of the
// conv kernel's elements), their embedding, the class token, positions, the
// layers, the projector. Every step an op of the backend.
static nm_status record(nm_clip *c, int32_t W, int32_t H) {
    const nm_clip_info *in = &c->info;
    const int64_t d = in->n_embd, S = in->image_size, p = in->patch_size, side = S / p, P = 3 * p * p;
    const int64_t T = c->n_pos, N = in->n_patches;
    c->cap_ops = 16 * in->n_layer_run + 16;
    c->cap_tens = 12 * in->n_layer_run + 24;
    c->n_ops = c->n_tens = 0;
    c->rec_w = c->rec_h = 0;
    if (!c->ops) c->ops = calloc((size_t)c->cap_ops, sizeof *c->ops);
    if (!c->tens) c->tens = calloc((size_t)c->cap_tens, sizeof *c->tens);
    if (!c->ops || !c->tens) return nm_fail(NM_ERR_NOMEM, c->err, sizeof c->err, "out of memory recording the encoder");
    if (in->proj == NM_CLIP_PROJ_QWEN2VL) {
        nm_status st = record_qwen(c, W, H);
        if (st != NM_OK) return st;
        goto check;
    }
    c->in_pix = rows(c, &c->pix, 3 * S * S, 0, 1);
    nm_tensor *patches = rows(c, &c->patches, P, 0, N), *x = rows(c, &c->x, d, 0, T);
    nm_tensor *xp = rows(c, &c->x, d, 0, N);
    emit(c, (nm_op){.kind = NM_OP_PATCHES, .src0 = c->in_pix, .dst = patches, .i0 = (int32_t)S, .i1 = (int32_t)p});
    emit(c, (nm_op){.kind = NM_OP_MATMUL, .src0 = &c->patch_w, .src1 = patches, .src2 = opt(&c->patch_b), .dst = xp});
    if (in->has_class_embd)
        emit(c, (nm_op){.kind = NM_OP_COPY, .src0 = &c->class_embd, .dst = rows(c, &c->x, d, N, 1)});
    nm_tensor *pos = rows(c, &c->pos_embd, d, 0, T);
    emit(c, (nm_op){.kind = NM_OP_ADD, .src0 = x, .src1 = pos, .dst = x});
    if (nm_tensor_is_set(&c->pre_ln_w))
        emit(c, (nm_op){.kind = NM_OP_NORM, .src0 = x, .src1 = &c->pre_ln_w, .src2 = opt(&c->pre_ln_b), .dst = x,
                        .f0 = in->eps});
    for (int il = 0; il < in->n_layer_run; il++) layer_record(c, &c->layers[il]);
    if (nm_tensor_is_set(&c->post_ln_w))
        emit(c, (nm_op){.kind = NM_OP_NORM, .src0 = x, .src1 = &c->post_ln_w, .src2 = opt(&c->post_ln_b), .dst = x,
                        .f0 = in->eps});
    c->in_out = rows(c, &c->out, in->n_out_embd, 0, in->n_out);
    if (in->proj == NM_CLIP_PROJ_MLP) {
        // rows 1..n_patches when there is a class token (llama.cpp's "patches" indices)
        nm_tensor *feat = rows(c, &c->x, d, in->has_class_embd ? 1 : 0, N);
        if (!nm_tensor_is_set(&c->mm2_w)) {
            emit(c, (nm_op){.kind = NM_OP_MATMUL, .src0 = &c->mm0_w, .src1 = feat, .src2 = opt(&c->mm0_b), .dst = c->in_out});
            emit(c, (nm_op){.kind = NM_OP_ACT, .src0 = c->in_out, .dst = c->in_out, .i0 = NM_ACT_GELU_TANH});
        } else {
            nm_tensor *h = rows(c, &c->ff, c->n_mm, 0, N);
            emit(c, (nm_op){.kind = NM_OP_MATMUL, .src0 = &c->mm0_w, .src1 = feat, .src2 = opt(&c->mm0_b), .dst = h});
            emit(c, (nm_op){.kind = NM_OP_ACT, .src0 = h, .dst = h, .i0 = NM_ACT_GELU_TANH});
            emit(c, (nm_op){.kind = NM_OP_MATMUL, .src0 = &c->mm2_w, .src1 = h, .src2 = opt(&c->mm2_b), .dst = c->in_out});
        }
    } else {
        // idefics3: pixel shuffle. Output token (yb, xb) of the (side/s)^2 grid is
        // the concatenation, dy outer and dx inner, of the s*s patches
        // (yb*s + dy, xb*s + dx) - the order of llama.cpp's reshape/permute chain.
        const int64_t sm = in->n_merge;
        nm_tensor *shuf = rows(c, &c->shuf, d * sm * sm, 0, in->n_out);
        emit(c, (nm_op){.kind = NM_OP_PIXEL_SHUFFLE, .src0 = rows(c, &c->x, d, 0, N), .dst = shuf, .i0 = (int32_t)side,
                        .i1 = (int32_t)sm});
        emit(c, (nm_op){.kind = NM_OP_MATMUL, .src0 = &c->fc_w, .src1 = shuf, .dst = c->in_out});
    }
check:
    if (c->n_ops > c->cap_ops || c->n_tens == c->cap_tens)
        return nm_fail(NM_ERR_RANGE, c->err, sizeof c->err, "vision encoder: more ops than recorded for");
    for (int i = 0; i < c->n_ops; i++)
        if (!nm_backend_supports_op(c->be, &c->ops[i])) {
            const nm_type_traits *tr = c->ops[i].src0 ? nm_type_traits_get(c->ops[i].src0->type) : NULL;
            return nm_fail(NM_ERR_UNSUPPORTED, c->err, sizeof c->err, "vision encoder: device %s cannot run op %d (%s)",
                           nm_backend_name(c->be), c->ops[i].kind, tr ? tr->name : "?");
        }
    c->rec_w = W;
    c->rec_h = H;
    return NM_OK;
}

int32_t nm_clip_n_out(const nm_clip *c, int32_t width, int32_t height) {
    if (!c) return 0;
    const nm_clip_info *in = &c->info;
    if (in->proj != NM_CLIP_PROJ_QWEN2VL) return width == in->image_size && height == in->image_size ? in->n_out : 0;
    const int32_t cell = in->patch_size * in->n_merge;
    if (width <= 0 || height <= 0 || width % cell || height % cell || width / cell > in->max_tokens ||
        height / cell > in->max_tokens)
        return 0;
    const int64_t n = (int64_t)(width / cell) * (height / cell);
    return n <= in->max_tokens ? (int32_t)n : 0; // (min_tokens binds the preprocessing, not the encoder)
}

nm_status nm_clip_encode(nm_clip *c, const float *pixels, float *out) {
    if (!c) return NM_ERR_INVALID_ARG;
    return nm_clip_encode_size(c, pixels, c->info.image_size, c->info.image_size, out);
}

nm_status nm_clip_encode_size(nm_clip *c, const float *pixels, int32_t width, int32_t height, float *out) {
    if (!c || !pixels || !out) return NM_ERR_INVALID_ARG;
    c->err[0] = '\0';
    const nm_clip_info *in = &c->info;
    const int32_t n_rows = nm_clip_n_out(c, width, height);
    if (n_rows == 0) {
        if (in->proj != NM_CLIP_PROJ_QWEN2VL)
            return nm_fail(NM_ERR_INVALID_ARG, c->err, sizeof c->err, "vision encoder: a %dx%d image, it takes %dx%d only",
                           width, height, in->image_size, in->image_size);
        return nm_fail(NM_ERR_INVALID_ARG, c->err, sizeof c->err,
                       "vision encoder: a %dx%d image is not whole %d-pixel cells giving at most %d tokens", width,
                       height, in->patch_size * in->n_merge, in->max_tokens);
    }
    nm_status st;
    if ((width != c->rec_w || height != c->rec_h) && (st = record(c, width, height)) != NM_OK) return st;
    const size_t n_pix = 3 * (size_t)width * (size_t)height;
    const size_t n_out = (size_t)n_rows * (size_t)in->n_out_embd * sizeof(float);
    if (c->caps.host_memory) { // the CPU reads the caller's pixels and writes the caller's rows in place
        *c->in_pix = nm_tensor_at(pixels, NM_TYPE_F32, (int64_t)n_pix, 1);
        *c->in_out = nm_tensor_at(out, NM_TYPE_F32, in->n_out_embd, n_rows);
    } else if ((st = nm_backend_tensor_set(c->be, c->in_pix, 0, pixels, n_pix * sizeof(float))) != NM_OK) {
        return nm_fail(st, c->err, sizeof c->err, "vision encoder: %s", nm_backend_last_error(c->be));
    }
    if ((st = nm_backend_run(c->be, c->ops, c->n_ops)) != NM_OK)
        return nm_fail(st, c->err, sizeof c->err, "vision encoder: %s", nm_backend_last_error(c->be));
    if (!c->caps.host_memory && (st = nm_backend_tensor_get(c->be, c->in_out, 0, out, n_out)) != NM_OK)
        return nm_fail(st, c->err, sizeof c->err, "vision encoder: %s", nm_backend_last_error(c->be));
    return NM_OK;
}

// ---- cost of one encoder run (nm_brick_i.estimate of the vision brick) -------------------------
void nm_clip_estimate_run(const nm_clip *c, int32_t width, int32_t height, nm_brick_cost *e) {
    const nm_clip_info *in = &c->info;
    double np = (double)in->n_patches, npos = (double)c->n_pos, n_out = (double)in->n_out;
    if (in->proj == NM_CLIP_PROJ_QWEN2VL) {
        const int32_t w = width > 0 ? width : in->image_size, h = height > 0 ? height : in->image_size;
        np = npos = (double)(w / in->patch_size) * (double)(h / in->patch_size);
        n_out = np / 4;
    }
    const double d = (double)in->n_embd;
    double wb = nm_cost_matmul(e, &c->patch_w, np, 1);
    for (int32_t il = 0; il < in->n_layer_run; il++) {
        const clip_layer *L = &c->layers[il];
        const nm_tensor *w[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->up, &L->down};
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) wb += nm_cost_matmul(e, w[i], npos, 1);
        const double att = 4.0 * npos * npos * d; // q.k and p.v over every pair of positions
        e->flops += att;
        e->flops_by_type[0] += att;
        e->act_bytes += 4.0 * npos * npos * (double)in->n_head; // the score rows
    }
    if (in->proj == NM_CLIP_PROJ_MLP || in->proj == NM_CLIP_PROJ_QWEN2VL) {
        wb += nm_cost_matmul(e, &c->mm0_w, n_out, 1);
        wb += nm_cost_matmul(e, &c->mm2_w, n_out, 1);
    } else {
        wb += nm_cost_matmul(e, &c->fc_w, n_out, 1);
    }
    const double elem = npos * (double)in->n_layer_run * (8.0 * d + 2.0 * in->n_ff);
    e->flops += elem;
    e->flops_by_type[0] += elem;
    e->act_bytes += 4.0 * elem;
    e->n_passes++;
    e->n_out += (int64_t)n_out;
    if (e->weight_bytes < (uint64_t)wb) e->weight_bytes = (uint64_t)wb;
    const uint64_t peak = (uint64_t)wb + (c->arena ? c->arena->size : 0);
    if (e->peak_bytes < peak) e->peak_bytes = peak;
}
