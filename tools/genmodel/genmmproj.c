// Random-weight mmproj files in llama.cpp's clip layout (see genmmproj.h and
// docs/mmproj.md). Tensor shapes are written in ggml order: ne[0] is the
// contiguous dimension, so a PyTorch Linear(in, out) weight is ne = {in, out}.
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "genmmproj.h"

#include "core/outfile.h"
#include "gguf/gguf.h"
#include "quant/quant.h"

typedef struct gen {
    uint64_t rng;
    nm_gguf_writer *w;
    void **keep; // tensor data, borrowed by the writer until it writes
    int n_keep, cap;
    char *err;
    size_t err_size;
} gen;

static nm_status fail(gen *g, nm_status st, const char *fmt, ...) {
    if (g->err && g->err_size) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(g->err, g->err_size, fmt, ap);
        va_end(ap);
    }
    return st;
}

static double urand(uint64_t *s) { // xorshift64*, uniform in [0, 1)
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return (double)((*s * 0x2545F4914F6CDD1Dull) >> 11) / 9007199254740992.0;
}
static float nrand(uint64_t *s) { // standard normal (Box-Muller)
    double u = urand(s), v = urand(s);
    return (float)(sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v));
}

bool nm_genmmproj_type_ok(uint32_t type) {
    switch (type) {
    case NM_TYPE_F32: case NM_TYPE_F16: case NM_TYPE_BF16: case NM_TYPE_Q4_0: case NM_TYPE_Q4_1:
    case NM_TYPE_Q5_0: case NM_TYPE_Q5_1: case NM_TYPE_Q8_0: case NM_TYPE_Q4_K: case NM_TYPE_Q5_K:
    case NM_TYPE_Q6_K:
        return true;
    default:
        return false;
    }
}

// llama.cpp's general.file_type for a file whose matmul weights are `type`.
static int file_type(uint32_t type) {
    switch (type) {
    case NM_TYPE_F32: return 0;
    case NM_TYPE_F16: return 1;
    case NM_TYPE_Q4_0: return 2;
    case NM_TYPE_Q4_1: return 3;
    case NM_TYPE_Q8_0: return 7;
    case NM_TYPE_Q5_0: return 8;
    case NM_TYPE_Q5_1: return 9;
    case NM_TYPE_Q4_K: return 15; // Q4_K_M
    case NM_TYPE_Q5_K: return 17; // Q5_K_M
    case NM_TYPE_Q6_K: return 18;
    case NM_TYPE_BF16: return 32;
    default: return -1;
    }
}

// Adds tensor `name` of `n_dims` dims (ggml order) filled with mean + std * N(0, 1),
// converted to `type` row by row (rows of ne[0]).
static nm_status add(gen *g, const char *name, uint32_t type, uint32_t n_dims, int64_t ne0, int64_t ne1, int64_t ne2,
                     int64_t ne3, float mean, float std) {
    const int64_t ne[4] = {ne0, ne1, ne2, ne3};
    const int64_t rows = ne1 * ne2 * ne3;
    const size_t rb = nm_row_size(type, ne0);
    if (!rb)
        return fail(g, NM_ERR_INVALID_ARG, "%s: a row of %lld elements cannot be stored as %s (block size %lld)", name,
                    (long long)ne0, nm_type_traits_get(type)->name, (long long)nm_type_traits_get(type)->blck_size);
    if (g->n_keep >= g->cap) return fail(g, NM_ERR_NOMEM, "%s: too many tensors", name);
    float *row = malloc(sizeof(float) * (size_t)ne0);
    void *data = malloc(rb * (size_t)rows);
    if (!row || !data) {
        free(row);
        free(data);
        return fail(g, NM_ERR_NOMEM, "%s: out of memory", name);
    }
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < ne0; i++) row[i] = mean + std * nrand(&g->rng);
        if (type == NM_TYPE_F32) memcpy((uint8_t *)data + (size_t)r * rb, row, rb);
        else nm_quantize_row_ref(type, row, (uint8_t *)data + (size_t)r * rb, ne0);
    }
    free(row);
    g->keep[g->n_keep++] = data;
    nm_status st = nm_gguf_writer_add_tensor(g->w, name, type, n_dims, ne, data);
    if (st != NM_OK) return fail(g, st, "%s: %s", name, nm_gguf_writer_last_error(g->w));
    return NM_OK;
}

static nm_status add_1d(gen *g, const char *name, int64_t n, float mean, float std) {
    return add(g, name, NM_TYPE_F32, 1, n, 1, 1, 1, mean, std);
}
// A Linear(in, out) weight, ~ N(0, 1/in) so that outputs keep the scale of the inputs.
static nm_status add_mat(gen *g, const char *name, uint32_t type, int64_t in, int64_t out) {
    return add(g, name, type, 2, in, out, 1, 1, 0.0f, 1.0f / sqrtf((float)in));
}
// Norm weight ~ 1 + N(0, 0.1^2), bias ~ N(0, 0.05^2).
static nm_status add_norm(gen *g, const char *prefix, int64_t n) {
    char name[96];
    snprintf(name, sizeof name, "%s.weight", prefix);
    nm_status st = add_1d(g, name, n, 1.0f, 0.1f);
    if (st != NM_OK) return st;
    snprintf(name, sizeof name, "%s.bias", prefix);
    return add_1d(g, name, n, 0.0f, 0.05f);
}
// Linear with bias.
static nm_status add_linear(gen *g, const char *prefix, uint32_t type, int64_t in, int64_t out) {
    char name[96];
    snprintf(name, sizeof name, "%s.weight", prefix);
    nm_status st = add_mat(g, name, type, in, out);
    if (st != NM_OK) return st;
    snprintf(name, sizeof name, "%s.bias", prefix);
    return add_1d(g, name, out, 0.0f, 0.05f);
}

nm_genmmproj_params nm_genmmproj_default_params(const char *proj) {
    const bool idefics3 = proj && !strcmp(proj, "idefics3");
    if (proj && !strcmp(proj, "qwen2vl_merger")) { // Qwen2-VL's layout (patch 14, merge 2, eps 1e-6), small
        nm_genmmproj_params q = nm_genmmproj_default_params("mlp");
        q.proj = proj;
        q.image_size = 56;
        q.patch_size = 14;
        q.n_out_embd = 256;
        q.class_embd = q.pre_ln = false;
        q.post_ln = true;
        q.eps = 1e-6f;
        return q;
    }
    nm_genmmproj_params p = {
        .proj = proj ? proj : "mlp",
        .image_size = 64,
        .patch_size = idefics3 ? 8 : 16,
        .n_embd = 128,
        .n_ff = 256,
        .n_head = 4,
        .n_layer = 3,
        .n_out_embd = 576, // SmolLM2-135M
        .scale_factor = idefics3 ? 2 : 0,
        .class_embd = !idefics3,
        .patch_bias = idefics3,
        .pre_ln = !idefics3,
        .post_ln = idefics3,
        .use_gelu = idefics3,
        .eps = idefics3 ? 1e-6f : 1e-5f,
        .wtype = NM_TYPE_F32,
        .seed = 1,
    };
    // CLIP's (OpenAI) and SigLIP's normalization constants.
    static const float clip_mean[3] = {0.48145466f, 0.4578275f, 0.40821073f};
    static const float clip_std[3] = {0.26862954f, 0.26130258f, 0.27577711f};
    for (int c = 0; c < 3; c++) {
        p.mean[c] = idefics3 ? 0.5f : clip_mean[c];
        p.std[c] = idefics3 ? 0.5f : clip_std[c];
    }
    return p;
}

static bool is_qwen(const nm_genmmproj_params *p) { return p->proj && !strcmp(p->proj, "qwen2vl_merger"); }

static nm_status check(gen *g, const nm_genmmproj_params *p, bool idefics3) {
    if (p->n_pinpoints < 0 || p->n_pinpoints > 64)
        return fail(g, NM_ERR_INVALID_ARG, "%d anyres resolutions: 0 to 64", p->n_pinpoints);
    if (!p->proj || (!idefics3 && strcmp(p->proj, "mlp") && !is_qwen(p)))
        return fail(g, NM_ERR_INVALID_ARG, "unknown projector '%s' (mlp, idefics3, qwen2vl_merger)",
                    p->proj ? p->proj : "(null)");
    if (is_qwen(p) && (p->class_embd || p->pre_ln || !p->post_ln || p->patch_bias || p->use_gelu || p->n_pinpoints ||
                       p->image_size % (2 * p->patch_size) || (p->n_embd / (p->n_head ? p->n_head : 1)) % 4))
        return fail(g, NM_ERR_INVALID_ARG, "qwen2vl_merger: post-LN only (no class token, pre-LN, patch bias, GELU or "
                    "pinpoints), image_size a multiple of 2 patch_size, head size a multiple of 4");
    if (p->image_size < 1 || p->image_size > 8192 || p->patch_size < 1 || p->image_size % p->patch_size)
        return fail(g, NM_ERR_INVALID_ARG, "image_size %d must be a multiple of patch_size %d (1..8192)", p->image_size,
                    p->patch_size);
    if (p->n_embd < 1 || p->n_head < 1 || p->n_embd % p->n_head || p->n_ff < 1 || p->n_out_embd < 1)
        return fail(g, NM_ERR_INVALID_ARG, "n_embd %d must be a multiple of n_head %d; n_ff, n_out_embd >= 1",
                    p->n_embd, p->n_head);
    // llama.cpp swaps ffn_up/ffn_down when ffn_down takes n_embd inputs (files
    // of old converters named them the other way round): with n_ff == n_embd
    // that check cannot tell, and it would swap our correctly named tensors.
    if (p->n_ff == p->n_embd)
        return fail(g, NM_ERR_INVALID_ARG, "n_ff must differ from n_embd (%d): llama.cpp's ffn_up/ffn_down swap check "
                    "cannot tell the two apart", p->n_embd);
    const int32_t min_layers = idefics3 || is_qwen(p) ? 1 : 2;
    if (p->n_layer < min_layers || p->n_layer > 256)
        return fail(g, NM_ERR_INVALID_ARG, "n_layer %d out of range (%d..256; mlp runs n_layer - 1 layers)", p->n_layer,
                    min_layers);
    const int32_t grid = p->image_size / p->patch_size;
    if (idefics3 && (p->scale_factor < 2 || grid % p->scale_factor))
        return fail(g, NM_ERR_INVALID_ARG, "scale_factor %d must be >= 2 and divide the patch grid side %d",
                    p->scale_factor, grid);
    if (idefics3 && p->class_embd)
        return fail(g, NM_ERR_INVALID_ARG, "idefics3 has no class token (llama.cpp's siglip graph would ignore it)");
    if (!nm_genmmproj_type_ok(p->wtype))
        return fail(g, NM_ERR_INVALID_ARG, "weight type %u not supported (f32 f16 bf16 q4_0 q4_1 q5_0 q5_1 q8_0 q4_K q5_K q6_K)",
                    p->wtype);
    if (!(p->eps > 0.0f)) return fail(g, NM_ERR_INVALID_ARG, "eps must be > 0");
    for (int c = 0; c < 3; c++)
        if (!(p->std[c] > 0.0f)) return fail(g, NM_ERR_INVALID_ARG, "image_std must be > 0");
    return NM_OK;
}

static nm_status add_keys(gen *g, const nm_genmmproj_params *p, bool idefics3) {
    nm_gguf_writer *w = g->w;
    nm_status st = NM_OK;
#define K(call) \
    if (st == NM_OK) st = (call)
    K(nm_gguf_writer_add_str(w, "general.architecture", "clip"));
    K(nm_gguf_writer_add_str(w, "general.type", "mmproj"));
    K(nm_gguf_writer_add_str(w, "general.name", "nanomind random mmproj"));
    if (file_type(p->wtype) >= 0) K(nm_gguf_writer_add_u32(w, "general.file_type", (uint32_t)file_type(p->wtype)));
    K(nm_gguf_writer_add_bool(w, "clip.has_vision_encoder", true));
    const bool qwen = is_qwen(p);
    if (!idefics3 && !qwen) K(nm_gguf_writer_add_bool(w, "clip.has_llava_projector", true)); // legacy converter key
    K(nm_gguf_writer_add_str(w, "clip.projector_type", p->proj));
    if (!qwen) K(nm_gguf_writer_add_bool(w, "clip.use_gelu", p->use_gelu));
    K(nm_gguf_writer_add_u32(w, "clip.vision.image_size", (uint32_t)p->image_size));
    K(nm_gguf_writer_add_u32(w, "clip.vision.patch_size", (uint32_t)p->patch_size));
    K(nm_gguf_writer_add_u32(w, "clip.vision.embedding_length", (uint32_t)p->n_embd));
    // Qwen2-VL's converter writes the LLM's width here (its vision config's hidden_size); readers take the
    // FFN width from the tensors
    K(nm_gguf_writer_add_u32(w, "clip.vision.feed_forward_length", (uint32_t)(qwen ? p->n_out_embd : p->n_ff)));
    K(nm_gguf_writer_add_u32(w, "clip.vision.block_count", (uint32_t)p->n_layer));
    K(nm_gguf_writer_add_u32(w, "clip.vision.projection_dim", (uint32_t)p->n_out_embd));
    K(nm_gguf_writer_add_u32(w, "clip.vision.attention.head_count", (uint32_t)p->n_head));
    K(nm_gguf_writer_add_f32(w, "clip.vision.attention.layer_norm_epsilon", p->eps));
    K(nm_gguf_writer_add_arr(w, "clip.vision.image_mean", NM_GGUF_FLOAT32, p->mean, 3));
    K(nm_gguf_writer_add_arr(w, "clip.vision.image_std", NM_GGUF_FLOAT32, p->std, 3));
    if (p->n_pinpoints > 0) {
        K(nm_gguf_writer_add_arr(w, "clip.vision.image_grid_pinpoints", NM_GGUF_INT32, p->pinpoints,
                                 2 * (uint64_t)p->n_pinpoints));
        K(nm_gguf_writer_add_str(w, "clip.vision.mm_patch_merge_type", "spatial_unpad"));
    }
    if (idefics3) {
        K(nm_gguf_writer_add_u32(w, "clip.vision.projector.scale_factor", (uint32_t)p->scale_factor));
        if (p->preproc_image_size >= 0)
            K(nm_gguf_writer_add_u32(w, "clip.vision.preproc_image_size",
                                     (uint32_t)(p->preproc_image_size ? p->preproc_image_size : p->image_size)));
    }
#undef K
    if (st != NM_OK) return fail(g, st, "metadata: %s", nm_gguf_writer_last_error(w));
    return NM_OK;
}

static nm_status add_tensors(gen *g, const nm_genmmproj_params *p, bool idefics3) {
    const int64_t d = p->n_embd, ff = p->n_ff, ps = p->patch_size, grid = p->image_size / p->patch_size;
    const int64_t n_pos = grid * grid + (p->class_embd ? 1 : 0);
    const uint32_t wt = p->wtype;
    nm_status st = NM_OK;
#define T(call) \
    if (st == NM_OK) st = (call)
    // Conv2d(3, d, ps, stride ps) as ggml stores it: ne = {kw, kh, c_in, c_out}.
    const uint32_t et = p->f16_embd ? NM_TYPE_F16 : NM_TYPE_F32;
    const bool qwen = is_qwen(p);
    T(add(g, "v.patch_embd.weight", et, 4, ps, ps, 3, d, 0.0f, 1.0f / sqrtf((float)(3 * ps * ps))));
    // Qwen2-VL: its Conv3d's two temporal slices (a still image passes through both)
    if (qwen) T(add(g, "v.patch_embd.weight.1", et, 4, ps, ps, 3, d, 0.0f, 1.0f / sqrtf((float)(3 * ps * ps))));
    if (p->patch_bias) T(add_1d(g, "v.patch_embd.bias", d, 0.0f, 0.1f));
    if (p->class_embd) T(add_1d(g, "v.class_embd", d, 0.0f, 0.5f));
    if (!qwen) T(add(g, "v.position_embd.weight", et, 2, d, n_pos, 1, 1, 0.0f, 0.3f));
    if (p->pre_ln) T(add_norm(g, "v.pre_ln", d));
    char pre[64], name[96];
    for (int il = 0; il < p->n_layer && st == NM_OK; il++) {
        snprintf(pre, sizeof pre, "v.blk.%d", il);
#define N(s) (snprintf(name, sizeof name, "%s.%s", pre, s), name)
        T(add_norm(g, N("ln1"), d));
        T(add_linear(g, N("attn_q"), wt, d, d));
        T(add_linear(g, N("attn_k"), wt, d, d));
        T(add_linear(g, N("attn_v"), wt, d, d));
        T(add_linear(g, N("attn_out"), wt, d, d));
        T(add_norm(g, N("ln2"), d));
        // fc1 (d -> ff) is ffn_up and fc2 (ff -> d) ffn_down; old LLaVA
        // converters wrote them the other way round, which llama.cpp detects
        // from ffn_down's shape and swaps back.
        T(add_linear(g, N(p->legacy_ffn_names ? "ffn_down" : "ffn_up"), wt, d, ff));
        T(add_linear(g, N(p->legacy_ffn_names ? "ffn_up" : "ffn_down"), wt, ff, d));
#undef N
    }
    if (p->post_ln) T(add_norm(g, "v.post_ln", d));
    if (idefics3) {
        const int64_t s = p->scale_factor;
        T(add_mat(g, "mm.model.fc.weight", wt, d * s * s, p->n_out_embd)); // no bias
    } else if (qwen) { // the merger: four patches joined, 4 d -> 4 d -> the LLM's width (Qwen2-VL's shape)
        T(add_linear(g, "mm.0", wt, 4 * d, 4 * d));
        T(add_linear(g, "mm.2", wt, 4 * d, p->n_out_embd));
    } else {
        T(add_linear(g, "mm.0", wt, d, p->n_out_embd));
        T(add_linear(g, "mm.2", wt, p->n_out_embd, p->n_out_embd));
    }
#undef T
    return st;
}

nm_status nm_genmmproj_write(const char *path, const nm_genmmproj_params *p, char *err, size_t err_size) {
    gen g = {.err = err, .err_size = err_size};
    if (err && err_size) err[0] = '\0';
    if (!path || !p) return fail(&g, NM_ERR_INVALID_ARG, "path and params are required");
    const bool idefics3 = p->proj && !strcmp(p->proj, "idefics3");
    nm_status st = check(&g, p, idefics3);
    if (st != NM_OK) return st;
    g.rng = p->seed * 0x9E3779B97F4A7C15ull + 0x5EED;
    g.cap = 16 + 16 * p->n_layer;
    g.keep = calloc((size_t)g.cap, sizeof(void *));
    g.w = nm_gguf_writer_create();
    if (!g.keep || !g.w) st = fail(&g, NM_ERR_NOMEM, "out of memory");
    if (st == NM_OK) st = add_keys(&g, p, idefics3);
    if (st == NM_OK) st = add_tensors(&g, p, idefics3);
    if (st == NM_OK) {
        st = nm_gguf_writer_write(g.w, path);
        if (st != NM_OK) fail(&g, st, "writing %s: %s", path, nm_gguf_writer_last_error(g.w));
    }
    for (int i = 0; i < g.n_keep; i++) free(g.keep[i]);
    free(g.keep);
    nm_gguf_writer_free(g.w);
    return st;
}

nm_status nm_genmmproj_write_input(const char *path, int32_t image_size, uint64_t seed, char *err, size_t err_size) {
    return nm_genmmproj_write_input_size(path, image_size, image_size, seed, err, err_size);
}

nm_status nm_genmmproj_write_input_size(const char *path, int32_t width, int32_t height, uint64_t seed, char *err,
                                        size_t err_size) {
    gen g = {.err = err, .err_size = err_size};
    if (err && err_size) err[0] = '\0';
    if (!path || width < 1 || width > 8192 || height < 1 || height > 8192)
        return fail(&g, NM_ERR_INVALID_ARG, "a path and a width and height in 1..8192 are required");
    const size_t n = 3 * (size_t)width * (size_t)height;
    float *px = malloc(n * sizeof(float));
    if (!px) return fail(&g, NM_ERR_NOMEM, "out of memory");
    uint64_t rng = seed * 0xD1B54A32D192ED03ull + 0x1A6E;
    for (size_t i = 0; i < n; i++) px[i] = nrand(&rng);
    nm_outfile o;
    nm_status st = nm_outfile_open(&o, path, err, err_size);
    if (st == NM_OK) {
        errno = 0;
        if (fwrite(px, sizeof(float), n, o.f) != n) {
            st = fail(&g, NM_ERR_IO, "%s: write failed: %s", path, strerror(errno ? errno : EIO));
            nm_outfile_abort(&o);
        } else {
            st = nm_outfile_commit(&o, err, err_size);
        }
    }
    free(px);
    return st;
}
