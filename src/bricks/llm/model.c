// Model loading: hyperparameters from GGUF metadata, weights as views into
// the mapping (never copied), every shape and type checked before use.
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bricks/llm/llm.h"
#include "quant/quant.h"
#include "core/fail.h"

typedef struct loader {
    const nm_gguf *g;
    const char *arch;
    char *err;
    size_t err_size;
} loader;

static nm_status fail(loader *L, nm_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    nm_vfail(st, L->err, L->err_size, NULL, fmt, ap);
    va_end(ap);
    return st;
}

static bool arch_key(loader *L, const char *suffix, char *buf, size_t size) {
    return snprintf(buf, size, "%s.%s", L->arch, suffix) < (int)size;
}

// Reads "<arch>.<suffix>" as an int. Returns false if absent and !required.
static nm_status get_int(loader *L, const char *suffix, bool required, int32_t *out) {
    char key[128];
    int64_t v;
    arch_key(L, suffix, key, sizeof key);
    const nm_gguf_kv *kv = nm_gguf_find(L->g, key);
    if (!kv) return required ? fail(L, NM_ERR_FORMAT, "missing metadata key '%s'", key) : NM_OK;
    if (kv->type == NM_GGUF_ARRAY)
        return fail(L, NM_ERR_UNSUPPORTED, "metadata '%s' is a per-layer array; only a single value is supported", key);
    if (!nm_gguf_get_i64(L->g, key, &v) || v < 0 || v > (1 << 30))
        return fail(L, NM_ERR_FORMAT, "metadata '%s' is not a valid count", key);
    *out = (int32_t)v;
    return NM_OK;
}

static nm_status get_float(loader *L, const char *suffix, bool required, float *out) {
    char key[128];
    arch_key(L, suffix, key, sizeof key);
    if (!nm_gguf_find(L->g, key)) return required ? fail(L, NM_ERR_FORMAT, "missing metadata key '%s'", key) : NM_OK;
    if (!nm_gguf_get_f32(L->g, key, out) || !isfinite(*out))
        return fail(L, NM_ERR_FORMAT, "metadata '%s' is not a finite float", key);
    return NM_OK;
}

// Binds tensor `name` with the expected shape (ne1 = 1 for vectors). Weights
// of matmuls may be any supported type; vectors (norms, biases) must be f32.
static nm_status bind(loader *L, nm_tensor *t, const char *name, int64_t ne0, int64_t ne1, bool required,
                      bool vector) {
    memset(t, 0, sizeof *t);
    const nm_gguf_tensor *gt = nm_gguf_find_tensor(L->g, name);
    if (!gt) return required ? fail(L, NM_ERR_FORMAT, "missing tensor '%s'", name) : NM_OK;
    int64_t ne0f = gt->ne[0], ne1f = gt->n_dims > 1 ? gt->ne[1] : 1;
    if (gt->n_dims > 2 || ne0f != ne0 || ne1f != ne1) {
        char shape[128];
        int k = snprintf(shape, sizeof shape, "[");
        for (uint32_t d = 0; d < gt->n_dims && k < (int)sizeof shape - 24; d++)
            k += snprintf(shape + k, sizeof shape - (size_t)k, "%s%lld", d ? ", " : "", (long long)gt->ne[d]);
        snprintf(shape + k, sizeof shape - (size_t)k, "]");
        return fail(L, NM_ERR_FORMAT, "tensor '%s' has shape %s, expected [%lld, %lld]", name, shape, (long long)ne0,
                    (long long)ne1);
    }
    const nm_type_traits *tr = nm_type_traits_get(gt->type);
    if (!tr || !tr->supported)
        return fail(L, NM_ERR_UNSUPPORTED, "tensor '%s' has unsupported type %u (%s)", name, gt->type,
                    tr ? tr->name : "unknown");
    if (vector && gt->type != 0 /* f32 */)
        return fail(L, NM_ERR_UNSUPPORTED, "tensor '%s' must be f32, is %s", name, tr->name);
    t->type = gt->type;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->ne[2] = t->ne[3] = 1;
    t->buf = NULL; // host memory: the read-only mapping (weights are never written)
    t->offs = (size_t)(uintptr_t)gt->data;
    t->name = gt->name.ptr;
    return NM_OK;
}

static nm_status bind_layer(loader *L, const nm_hparams *hp, int il, nm_layer *ly) {
    char n[96];
    nm_status st;
    const int64_t d = hp->n_embd, hd = hp->head_dim, qd = (int64_t)hp->n_head * hd, kvd = (int64_t)hp->n_head_kv * hd;
    const bool gemma = hp->arch == NM_ARCH_GEMMA3, qwen = hp->arch == NM_ARCH_QWEN2 || hp->arch == NM_ARCH_QWEN2VL;
    const bool qk_norm = gemma || hp->arch == NM_ARCH_QWEN3 || hp->arch == NM_ARCH_LFM2; // (per-head RMS norms)
#define B(field, suffix, ne0, ne1, req, vec)                                   \
    do {                                                                       \
        snprintf(n, sizeof n, "blk.%d." suffix ".weight", il);                 \
        if ((st = bind(L, &ly->field, n, ne0, ne1, req, vec)) != NM_OK) return st; \
    } while (0)
#define BB(field, suffix, ne0, req)                                            \
    do {                                                                       \
        snprintf(n, sizeof n, "blk.%d." suffix ".bias", il);                   \
        if ((st = bind(L, &ly->field, n, ne0, 1, req, true)) != NM_OK) return st; \
    } while (0)
    B(attn_norm, "attn_norm", d, 1, true, true);
    if (ly->conv) { // lfm2: a gated short convolution in place of attention
        B(conv_in, "shortconv.in_proj", d, 3 * d, true, false);
        B(conv_w, "shortconv.conv", hp->conv_l, d, true, true);
        B(conv_out, "shortconv.out_proj", d, d, true, false);
        goto ffn;
    }
    B(wq, "attn_q", d, qd, true, false);
    B(wk, "attn_k", d, kvd, true, false);
    B(wv, "attn_v", d, kvd, true, false);
    B(wo, "attn_output", qd, d, true, false);
    BB(bq, "attn_q", qd, qwen);
    BB(bk, "attn_k", kvd, qwen);
    BB(bv, "attn_v", kvd, qwen);
    if (qk_norm) { // (other archs have none: llama.cpp refuses such a file of theirs)
        B(q_norm, "attn_q_norm", hd, 1, true, true);
        B(k_norm, "attn_k_norm", hd, 1, true, true);
    }
    B(post_attn_norm, "post_attention_norm", d, 1, gemma, true);
ffn:
    B(ffn_norm, "ffn_norm", d, 1, true, true);
    B(ffn_gate, "ffn_gate", d, hp->n_ff, true, false);
    B(ffn_up, "ffn_up", d, hp->n_ff, true, false);
    B(ffn_down, "ffn_down", hp->n_ff, d, true, false);
    B(post_ffn_norm, "post_ffw_norm", d, 1, gemma, true);
#undef B
#undef BB
    ly->swa = hp->n_swa > 0 && hp->swa_pattern > 0 && (il % hp->swa_pattern) < hp->swa_pattern - 1;
    if (hp->arch == NM_ARCH_LFM2) ly->swa = !ly->conv && hp->n_swa > 0; // (every attention layer, as llama.cpp)
    ly->no_rope = hp->no_rope_step > 0 && (il + 1) % hp->no_rope_step == 0;
    return NM_OK;
}

// lfm2: attention.head_count_kv is one count a layer, 0 where the layer is a short convolution (llama.cpp's
// rule); the attention layers' counts must agree. shortconv.l_cache is the convolution's taps.
static nm_status lfm2_layers(loader *L, nm_hparams *hp) {
    char key[128];
    nm_status st;
    arch_key(L, "attention.head_count_kv", key, sizeof key);
    const nm_gguf_kv *kv = nm_gguf_find(L->g, key);
    if (!kv) return fail(L, NM_ERR_FORMAT, "missing metadata key '%s' (lfm2: which layers attend)", key);
    if (kv->type != NM_GGUF_ARRAY || kv->arr_n != (uint64_t)hp->n_layer)
        return fail(L, NM_ERR_FORMAT, "metadata '%s' must be an array of %d counts, one a layer", key, hp->n_layer);
    hp->n_head_kv = 0;
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        const double v = nm_gguf_arr_num(kv, i);
        if (!(v >= 0 && v <= 4096) || v != (double)(int32_t)v)
            return fail(L, NM_ERR_FORMAT, "metadata '%s'[%d] = %g is not a head count", key, (int)i, v);
        if (v == 0) {
            hp->n_conv++;
            continue;
        }
        if (hp->n_head_kv && hp->n_head_kv != (int32_t)v)
            return fail(L, NM_ERR_UNSUPPORTED, "metadata '%s': attention layers with %d and %g key/value heads "
                        "(one count for all is supported)", key, hp->n_head_kv, v);
        hp->n_head_kv = (int32_t)v;
    }
    if (!hp->n_head_kv) hp->n_head_kv = hp->n_head; // (no attention layer: the cache is never used)
    if ((st = get_int(L, "shortconv.l_cache", true, &hp->conv_l))) return st;
    if ((st = get_int(L, "attention.sliding_window", false, &hp->n_swa))) return st;
    if (hp->conv_l < 2 || hp->conv_l > 64)
        return fail(L, NM_ERR_FORMAT, "%s.shortconv.l_cache %d must be 2..64 (the convolution's taps)", L->arch,
                    hp->conv_l);
    return NM_OK;
}

static nm_status load_hparams(loader *L, nm_hparams *hp) {
    nm_status st;
    memset(hp, 0, sizeof *hp);
    if (!strcmp(L->arch, "llama")) hp->arch = NM_ARCH_LLAMA;
    else if (!strcmp(L->arch, "qwen2")) hp->arch = NM_ARCH_QWEN2;
    else if (!strcmp(L->arch, "gemma3")) hp->arch = NM_ARCH_GEMMA3;
    else if (!strcmp(L->arch, "qwen2vl")) hp->arch = NM_ARCH_QWEN2VL;
    else if (!strcmp(L->arch, "qwen3")) hp->arch = NM_ARCH_QWEN3;
    else if (!strcmp(L->arch, "smollm3")) hp->arch = NM_ARCH_SMOLLM3;
    else if (!strcmp(L->arch, "lfm2")) hp->arch = NM_ARCH_LFM2;
    else return fail(L, NM_ERR_UNSUPPORTED, "architecture '%s' is not supported (llama, qwen2, qwen2vl, qwen3, smollm3, gemma3, lfm2)", L->arch);

    if ((st = get_int(L, "embedding_length", true, &hp->n_embd)) ||
        (st = get_int(L, "block_count", true, &hp->n_layer)) ||
        (st = get_int(L, "feed_forward_length", true, &hp->n_ff)) ||
        (st = get_int(L, "attention.head_count", true, &hp->n_head)))
        return st;
    hp->n_head_kv = hp->n_head;
    hp->n_ctx_train = 2048;
    if ((hp->arch == NM_ARCH_LFM2 ? (st = lfm2_layers(L, hp)) : (st = get_int(L, "attention.head_count_kv", false, &hp->n_head_kv))) ||
        (st = get_int(L, "context_length", false, &hp->n_ctx_train)))
        return st;
    if (hp->n_ctx_train <= 0) hp->n_ctx_train = 2048; // absent or 0: a conservative default
    if (hp->n_embd <= 0 || hp->n_layer <= 0 || hp->n_ff <= 0 || hp->n_head <= 0 || hp->n_head_kv <= 0 ||
        hp->n_head % hp->n_head_kv != 0)
        return fail(L, NM_ERR_FORMAT, "bad dimensions: n_embd %d, n_layer %d, n_ff %d, n_head %d, n_head_kv %d",
                    hp->n_embd, hp->n_layer, hp->n_ff, hp->n_head, hp->n_head_kv);
    hp->head_dim = hp->n_embd / hp->n_head;
    int32_t vlen = -1;
    if ((st = get_int(L, "attention.key_length", false, &hp->head_dim)) ||
        (st = get_int(L, "attention.value_length", false, &vlen)))
        return st;
    char key[128];
    arch_key(L, "attention.key_length", key, sizeof key);
    if (!nm_gguf_find(L->g, key) && hp->n_embd % hp->n_head != 0)
        return fail(L, NM_ERR_FORMAT, "%s.attention.head_count %d does not divide %s.embedding_length %d", L->arch,
                    hp->n_head, L->arch, hp->n_embd);
    if (vlen >= 0 && vlen != hp->head_dim)
        return fail(L, NM_ERR_UNSUPPORTED, "key_length %d != value_length %d", hp->head_dim, vlen);
    if (hp->head_dim <= 0 || hp->head_dim > 1024 || hp->head_dim % 2)
        return fail(L, NM_ERR_UNSUPPORTED, "head dimension %d not supported (even, <= 1024)", hp->head_dim);
    hp->n_rot = hp->head_dim;
    if ((st = get_int(L, "rope.dimension_count", false, &hp->n_rot))) return st;
    if (hp->n_rot <= 0 || hp->n_rot > hp->head_dim || hp->n_rot % 2)
        return fail(L, NM_ERR_FORMAT, "rope.dimension_count %d invalid for head dimension %d", hp->n_rot, hp->head_dim);

    hp->norm_eps = 1e-5f;
    hp->rope_base = 10000.0f;
    // (llama.cpp reads qwen3's and smollm3's epsilon as a required key: a file without it is refused there)
    const bool eps_required = hp->arch == NM_ARCH_QWEN3 || hp->arch == NM_ARCH_SMOLLM3 || hp->arch == NM_ARCH_LFM2;
    if ((st = get_float(L, "attention.layer_norm_rms_epsilon", eps_required, &hp->norm_eps)) ||
        (st = get_float(L, "rope.freq_base", false, &hp->rope_base)))
        return st;
    // Values no model can have: refused by name, never run.
    if (!(hp->norm_eps > 0.0f) || !isfinite(hp->norm_eps))
        return fail(L, NM_ERR_FORMAT, "%s.attention.layer_norm_rms_epsilon %g must be a positive number", L->arch,
                    hp->norm_eps);
    if (!(hp->rope_base > 0.0f) || !isfinite(hp->rope_base))
        return fail(L, NM_ERR_FORMAT, "%s.rope.freq_base %g must be a positive number", L->arch, hp->rope_base);
    hp->rope_freq_scale = 1.0f;
    float factor = 0.0f;
    nm_str rs;
    arch_key(L, "rope.scaling.type", key, sizeof key);
    if (nm_gguf_get_str(L->g, key, &rs) && !nm_str_eq(rs, "none")) {
        if (!nm_str_eq(rs, "linear"))
            return fail(L, NM_ERR_UNSUPPORTED, "rope scaling '%.*s' not supported (linear only)", (int)rs.len, rs.ptr);
        if ((st = get_float(L, "rope.scaling.factor", false, &factor))) return st;
        if (factor < 0.0f || !isfinite(factor))
            return fail(L, NM_ERR_FORMAT, "%s.rope.scaling.factor %g must be a positive number", L->arch, factor);
        if (factor > 0.0f) hp->rope_freq_scale = 1.0f / factor;
    }
    hp->rope_base_swa = hp->rope_base;
    hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
    hp->embd_scale = 1.0f;
    hp->act = NM_ACT_SILU;
    hp->rope_mode = NM_ROPE_NORM;
    // Soft-capping, as llama.cpp's graphs do it: of our archs only gemma3 caps
    // the final logits, none caps attention logits (gemma2's attn_logit_softcapping;
    // gemma3 files may carry the key, llama.cpp ignores it). A key the arch does
    // not use is ignored, never applied.
    hp->attn_softcap = 0.0f;
    hp->final_softcap = 0.0f;
    if (hp->arch == NM_ARCH_GEMMA3 && (st = get_float(L, "final_logit_softcapping", false, &hp->final_softcap)))
        return st;

    switch (hp->arch) {
    case NM_ARCH_LLAMA: break;
    case NM_ARCH_QWEN2: hp->rope_mode = NM_ROPE_NEOX; break;
    case NM_ARCH_QWEN3: // qwen2 with RMS norms of each head of q and k before the rotation, no biases
        hp->rope_mode = NM_ROPE_NEOX;
        break;
    case NM_ARCH_LFM2: // short-convolution layers beside qwen3-like attention ones (RMS norms of q and k, NeoX)
        hp->rope_mode = NM_ROPE_NEOX;
        break;
    case NM_ARCH_SMOLLM3:
        // llama with no rotation in every fourth layer (llama.cpp fixes the step at 4: no GGUF key says it)
        hp->no_rope_step = 4;
        break;
    case NM_ARCH_QWEN2VL: {
        // Qwen2-VL: qwen2 with M-RoPE. Rotated pair k (of n_rot / 2, NeoX halves) turns by the position of the
        // stream its section names, t for k in [0, s0), h in [s0, s0 + s1), w up to s0 + s1 + s2, e after
        // (llama.cpp's ggml_rope_multi; the sections repeat past their sum). Text tokens have t = h = w.
        hp->rope_mode = NM_ROPE_MROPE;
        arch_key(L, "rope.dimension_sections", key, sizeof key);
        const nm_gguf_kv *kv = nm_gguf_find(L->g, key);
        if (!kv) return fail(L, NM_ERR_FORMAT, "missing metadata key '%s' (M-RoPE's sections)", key);
        if (kv->type != NM_GGUF_ARRAY || kv->arr_n < 3 || kv->arr_n > 4)
            return fail(L, NM_ERR_FORMAT, "metadata '%s' must be an array of 3 or 4 integers", key);
        int64_t sum = 0;
        for (uint64_t i = 0; i < kv->arr_n; i++) {
            const double v = nm_gguf_arr_num(kv, i);
            if (!(v >= 0 && v <= 4096) || v != (double)(int32_t)v)
                return fail(L, NM_ERR_FORMAT, "metadata '%s'[%d] = %g is not a section size", key, (int)i, v);
            hp->rope_sections[i] = (int32_t)v;
            sum += hp->rope_sections[i];
        }
        if (sum <= 0 || sum > hp->n_rot / 2)
            return fail(L, NM_ERR_FORMAT, "metadata '%s' sums to %lld pairs; a head rotates %d (1..%d needed)", key,
                        (long long)sum, hp->n_rot / 2, hp->n_rot / 2);
        if (hp->n_rot != hp->head_dim)
            return fail(L, NM_ERR_UNSUPPORTED, "M-RoPE over %d of %d dimensions (qwen2vl rotates the whole head)",
                        hp->n_rot, hp->head_dim);
        break;
    }
    case NM_ARCH_GEMMA3:
        // Gemma 3: GELU(tanh) MLP, NEOX rope, token embeddings scaled by
        // sqrt(n_embd), local (sliding-window) layers with rope base 10000 in
        // a 5 local : 1 global pattern, global layers with rope.freq_base.
        hp->rope_mode = NM_ROPE_NEOX;
        hp->act = NM_ACT_GELU_TANH;
        hp->embd_scale = sqrtf((float)hp->n_embd);
        hp->rope_base_swa = 10000.0f;
        hp->swa_pattern = 6;
        hp->norm_eps = 1e-6f;
        // As llama.cpp: the 27B model (62 layers) scales q by 1/sqrt(n_embd / n_head)
        // (its query_pre_attn_scalar), the others by 1/sqrt(head_dim).
        if (hp->n_layer == 62) hp->attn_scale = 1.0f / sqrtf((float)hp->n_embd / (float)hp->n_head);
        if ((st = get_float(L, "attention.layer_norm_rms_epsilon", false, &hp->norm_eps)) ||
            (st = get_float(L, "rope.freq_base_swa", false, &hp->rope_base_swa)) ||
            (st = get_int(L, "attention.sliding_window", false, &hp->n_swa)) ||
            (st = get_int(L, "attention.sliding_window_pattern", false, &hp->swa_pattern)))
            return st;
        if (!(hp->norm_eps > 0.0f) || !isfinite(hp->norm_eps))
            return fail(L, NM_ERR_FORMAT, "%s.attention.layer_norm_rms_epsilon %g must be a positive number", L->arch,
                        hp->norm_eps);
        if (!(hp->rope_base_swa > 0.0f) || !isfinite(hp->rope_base_swa))
            return fail(L, NM_ERR_FORMAT, "%s.rope.freq_base_swa %g must be a positive number", L->arch,
                        hp->rope_base_swa);
        if (hp->n_swa < 0 || hp->swa_pattern < 0)
            return fail(L, NM_ERR_FORMAT, "%s.attention.sliding_window %d / _pattern %d must be >= 0", L->arch,
                        hp->n_swa, hp->swa_pattern);
        if (hp->final_softcap < 0.0f || !isfinite(hp->final_softcap))
            return fail(L, NM_ERR_FORMAT, "%s.final_logit_softcapping %g must be >= 0 (0: off)", L->arch,
                        hp->final_softcap);
        break;
    }
    return NM_OK;
}

// Whether lfm2's layer il is a short convolution (its head_count_kv is 0; the array checked by lfm2_layers).
static bool lfm2_is_conv(const nm_gguf *g, int il) {
    const nm_gguf_kv *kv = nm_gguf_find(g, "lfm2.attention.head_count_kv");
    return kv && nm_gguf_arr_num(kv, (uint64_t)il) == 0;
}

nm_model_params nm_model_default_params(void) {
    nm_model_params p = {.n_threads = 0};
    return p;
}

nm_status nm_model_load(const char *path, const nm_model_params *params, nm_model **out, char *err,
                        size_t err_size) {
    if (!out) return NM_ERR_INVALID_ARG;
    *out = NULL;
    if (err && err_size) err[0] = '\0';
    nm_model *m = calloc(1, sizeof *m);
    if (!m) return NM_ERR_NOMEM;
    nm_status st = params && params->no_mmap ? nm_gguf_open_read(path, &m->gguf, err, err_size)
                                             : nm_gguf_open(path, &m->gguf, err, err_size);
    if (st != NM_OK) goto fail;

    loader L = {m->gguf, NULL, err, err_size};
    nm_str arch;
    if (!nm_gguf_get_str(m->gguf, "general.architecture", &arch) || arch.len == 0 || arch.len >= sizeof m->arch_name) {
        st = fail(&L, NM_ERR_FORMAT, "missing or invalid general.architecture");
        goto fail;
    }
    memcpy(m->arch_name, arch.ptr, arch.len);
    m->arch_name[arch.len] = '\0';
    L.arch = m->arch_name;
    if ((st = load_hparams(&L, &m->hp)) != NM_OK) goto fail;

    if ((st = nm_tokenizer_create(m->gguf, &m->tok, err, err_size)) != NM_OK) goto fail;
    m->hp.n_vocab = nm_tokenizer_n_vocab(m->tok);

    const nm_hparams *hp = &m->hp;
    if ((st = bind(&L, &m->tok_embd, "token_embd.weight", hp->n_embd, hp->n_vocab, true, false)) ||
        // (lfm2's final norm is named token_embd_norm: llama.cpp's name for it)
        (st = bind(&L, &m->output_norm, hp->arch == NM_ARCH_LFM2 ? "token_embd_norm.weight" : "output_norm.weight",
                   hp->n_embd, 1, true, true)) ||
        (st = bind(&L, &m->output, "output.weight", hp->n_embd, hp->n_vocab, false, false)))
        goto fail;
    if (!nm_tensor_is_set(&m->output)) m->output = m->tok_embd; // tied embeddings
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) { st = NM_ERR_NOMEM; goto fail; }
    for (int il = 0, n_kv = 0; il < hp->n_layer; il++) {
        nm_layer *ly = &m->layers[il];
        ly->conv = hp->arch == NM_ARCH_LFM2 && lfm2_is_conv(m->gguf, il);
        ly->kv_index = ly->conv ? -1 : n_kv++;
        if ((st = bind_layer(&L, hp, il, ly)) != NM_OK) goto fail;
    }
    // Tensors of blocks past block_count would be ignored: a wrong block_count.
    for (int64_t i = 0; i < nm_gguf_n_tensors(m->gguf); i++) {
        const nm_gguf_tensor *t = nm_gguf_tensor_at(m->gguf, i);
        long blk = -1;
        if (t->name.len > 4 && !memcmp(t->name.ptr, "blk.", 4)) blk = strtol(t->name.ptr + 4, NULL, 10);
        if (blk >= hp->n_layer) {
            st = fail(&L, NM_ERR_FORMAT, "tensor '%.*s' belongs to block %ld, but %s.block_count is %d",
                      (int)(t->name.len > 96 ? 96 : t->name.len), t->name.ptr, blk, L.arch, hp->n_layer);
            goto fail;
        }
    }

    for (int64_t i = 0; i < nm_gguf_n_tensors(m->gguf); i++) {
        const nm_gguf_tensor *t = nm_gguf_tensor_at(m->gguf, i);
        m->weight_bytes += t->nbytes;
        const uint8_t *lo = t->data, *hi = lo + t->nbytes;
        if (!m->wbase || lo < m->wbase) m->wbase = lo;
        if (hi > m->wend) m->wend = hi;
    }
    m->chat = nm_tokenizer_chat_tmpl(m->tok);
    m->n_threads = params && params->n_threads > 0 ? params->n_threads : 0;
    *out = m;
    return NM_OK;
fail:
    nm_model_free(m);
    return st;
}

void nm_model_free(nm_model *m) {
    if (!m) return;
    nm_tokenizer_free(m->tok);
    free(m->layers);
    nm_gguf_close(m->gguf);
    free(m);
}

const char *nm_model_arch(const nm_model *m) { return m->arch_name; }
int32_t nm_model_n_vocab(const nm_model *m) { return m->hp.n_vocab; }
int32_t nm_model_n_embd(const nm_model *m) { return m->hp.n_embd; }
int32_t nm_model_n_layer(const nm_model *m) { return m->hp.n_layer; }
int32_t nm_model_n_ctx_train(const nm_model *m) { return m->hp.n_ctx_train; }

uint64_t nm_model_decode_weight_bytes(const nm_model *m) {
    const uint64_t embd = nm_row_size(m->tok_embd.type, m->tok_embd.ne[0]) * (uint64_t)m->tok_embd.ne[1];
    const bool tied = m->output.offs == m->tok_embd.offs;
    // all tensors, less the embedding table unless the output head reads it
    return m->weight_bytes - (tied ? 0 : embd) + nm_row_size(m->tok_embd.type, m->tok_embd.ne[0]);
}

uint64_t nm_model_kv_bytes_per_pos(const nm_model *m) {
    return (uint64_t)(m->hp.n_layer - m->hp.n_conv) * 2 * (uint64_t)m->hp.n_head_kv * (uint64_t)m->hp.head_dim *
           sizeof(uint16_t);
}

void nm_model_desc(const nm_model *m, char *buf, size_t size) {
    const nm_hparams *hp = &m->hp;
    const nm_type_traits *tr = nm_type_traits_get(m->layers[0].ffn_down.type);
    snprintf(buf, size, "%s: %d layers, d %d, heads %d/%d x %d, ff %d, vocab %d, ffn_down %s, %.1f MiB of weights",
             m->arch_name, hp->n_layer, hp->n_embd, hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_ff, hp->n_vocab,
             tr ? tr->name : "?", m->weight_bytes / 1048576.0);
}
