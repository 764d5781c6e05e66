// Random-weight GGUF language models (see genmodel.h).
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "genmodel.h"
#include "gguf/gguf.h"
#include "quant/quant.h"

// State of one generation: the random stream and the tensor data that must
// live until the file is written.
typedef struct gen_state {
    uint64_t rng;
    void **keep;
    int n_keep, cap;
    const char *bad_3d; // gen_opts.bad_3d
} gen_state;

static uint64_t xs_next(uint64_t *s) { // xorshift64*: the next 64-bit draw
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1Dull;
}
static double u53(uint64_t r) { return (double)(r >> 11) / 9007199254740992.0; } // uniform in [0, 1)
static float box_muller(uint64_t a, uint64_t b) { // a standard normal from two draws
    return (float)(sqrt(-2.0 * log(u53(a) + 1e-300)) * cos(6.283185307179586 * u53(b)));
}

// Rows of a tensor filled and quantized by threads: the draws are made in
// order first (the stream is sequential), the normals and the quantization
// of rows [r0, r1) are a thread's (the same bytes as one thread makes).
typedef struct fill_job {
    const uint64_t *draws; // 2 per value, from row r0 on
    float *f;              // scratch for rows [r0, r1)
    uint8_t *q;            // row r0's quantized bytes
    uint32_t type;
    int64_t ne0, r0, r1;
    size_t rb;
    float mean, std;
} fill_job;

static void *fill_rows(void *arg) {
    fill_job *j = arg;
    for (int64_t r = j->r0; r < j->r1; r++) {
        float *f = j->f + (r - j->r0) * j->ne0;
        const uint64_t *d = j->draws + 2 * (size_t)((r - j->r0) * j->ne0);
        for (int64_t i = 0; i < j->ne0; i++) f[i] = j->mean + j->std * box_muller(d[2 * i], d[2 * i + 1]);
        nm_quantize_row_ref(j->type, f, j->q + (size_t)(r - j->r0) * j->rb, j->ne0);
    }
    return NULL;
}

static int add(gen_state *g, nm_gguf_writer *w, const char *name, uint32_t type, int64_t ne0, int64_t ne1,
               float mean, float std) {
    int64_t ne[2] = {ne0, ne1};
    size_t rb = nm_row_size(type, ne0);
    // chunks of rows of about 4M values: draws (2 per value) and floats for them
    int64_t chunk = ((int64_t)1 << 22) / ne0;
    chunk = chunk < 1 ? 1 : chunk > ne1 ? ne1 : chunk;
    uint64_t *draws = malloc(2 * sizeof(uint64_t) * (size_t)(chunk * ne0));
    float *f = malloc(sizeof(float) * (size_t)(chunk * ne0));
    void *q = rb ? malloc(rb * (size_t)ne1) : NULL;
    if (!draws || !f || !q || g->n_keep >= g->cap) {
        fprintf(stderr, "nm-genmodel: cannot make tensor %s (type %u, row %lld)\n", name, type, (long long)ne0);
        free(draws);
        free(f);
        free(q);
        return 1;
    }
    long nt = sysconf(_SC_NPROCESSORS_ONLN);
    nt = nt < 1 ? 1 : nt > 64 ? 64 : nt;
    for (int64_t c0 = 0; c0 < ne1; c0 += chunk) {
        const int64_t c1 = c0 + chunk < ne1 ? c0 + chunk : ne1;
        for (size_t i = 0; i < 2 * (size_t)((c1 - c0) * ne0); i++) draws[i] = xs_next(&g->rng);
        fill_job jobs[64];
        pthread_t th[64];
        bool started[64] = {false};
        const int64_t per = (c1 - c0 + nt - 1) / nt;
        for (long t = 0; t < nt; t++) {
            const int64_t r0 = c0 + t * per < c1 ? c0 + t * per : c1, r1 = r0 + per < c1 ? r0 + per : c1;
            jobs[t] = (fill_job){.draws = draws + 2 * (size_t)((r0 - c0) * ne0), .f = f + (size_t)((r0 - c0) * ne0),
                                 .q = (uint8_t *)q + (size_t)r0 * rb, .type = type, .ne0 = ne0, .r0 = r0,
                                 .r1 = r1 > r0 ? r1 : r0, .rb = rb, .mean = mean, .std = std};
            started[t] = t > 0 && r1 > r0 && pthread_create(&th[t], NULL, fill_rows, &jobs[t]) == 0;
        }
        for (long t = 1; t < nt; t++)
            if (!started[t]) fill_rows(&jobs[t]); // no thread: this one does it
        fill_rows(&jobs[0]);
        for (long t = 1; t < nt; t++)
            if (started[t]) pthread_join(th[t], NULL);
    }
    free(draws);
    free(f);
    g->keep[g->n_keep++] = q;
    // bad_3d: this tensor written with a third dimension of 1 (a shape no loader may take)
    const int64_t ne3[3] = {ne0, ne1, 1};
    const bool three = g->bad_3d && !strcmp(name, g->bad_3d);
    nm_status st = three ? nm_gguf_writer_add_tensor(w, name, type, 3, ne3, q)
                         : nm_gguf_writer_add_tensor(w, name, type, ne1 > 1 ? 2 : 1, ne, q);
    if (st != NM_OK) fprintf(stderr, "nm-genmodel: %s: %s\n", name, nm_gguf_writer_last_error(w));
    return st != NM_OK;
}

// The tokenizer's array `key` (tokens, token_type or scores) grown to `vocab` entries: first the n_user
// tokens of user (type 4, user-defined: written as their text), then pad tokens "<|nm_pad_N|>" of type 3
// (control), scores 0. 0 when written.
static int pad_vocab(nm_gguf_writer *w, const nm_gguf_kv *kv, const char *key, int64_t vocab, char *const *user,
                     int n_user) {
    const uint64_t n = kv->arr_n;
    int bad = 1;
    if (!strcmp(key, "tokenizer.ggml.tokens") && kv->arr_type == NM_GGUF_STRING) {
        nm_str *have = calloc(n, sizeof *have);
        char **s = calloc((size_t)vocab, sizeof *s);
        if (have && s && nm_gguf_arr_strings(kv, have, n)) {
            bad = 0;
            for (int64_t i = 0; i < vocab && !bad; i++) {
                s[i] = malloc(i < (int64_t)n ? have[i].len + 1 : 32);
                if (!s[i]) bad = 1;
                else if (i < (int64_t)n) memcpy(s[i], have[i].ptr, have[i].len), s[i][have[i].len] = '\0';
                else if (i < (int64_t)n + n_user) snprintf(s[i], 32, "%s", user[i - (int64_t)n]);
                else snprintf(s[i], 32, "<|nm_pad_%lld|>", (long long)(i - (int64_t)n - n_user));
            }
            bad = bad || nm_gguf_writer_add_arr_str(w, key, (const char *const *)s, (uint64_t)vocab) != NM_OK;
        }
        for (int64_t i = 0; s && i < vocab; i++) free(s[i]);
        free(s), free(have);
    } else if (kv->arr_type == NM_GGUF_INT32 || kv->arr_type == NM_GGUF_FLOAT32) {
        const bool ty = !strcmp(key, "tokenizer.ggml.token_type");
        uint32_t *v = calloc((size_t)vocab, 4);
        if (v) {
            memcpy(v, kv->data, 4 * n);
            for (int64_t i = (int64_t)n; i < vocab; i++) {
                const float zero = 0.0f;
                if (ty) v[i] = i < (int64_t)n + n_user ? 4 : 3;
                else memcpy(&v[i], &zero, 4);
            }
            bad = nm_gguf_writer_add_arr(w, key, kv->arr_type, v, (uint64_t)vocab) != NM_OK;
        }
        free(v);
    }
    if (bad) fprintf(stderr, "nm-genmodel: cannot pad %s to %lld entries\n", key, (long long)vocab);
    return bad;
}

static int copy_tokenizer(nm_gguf_writer *w, const nm_gguf *src, int64_t bad_bos, int64_t vocab, char *const *user,
                          int n_user, int64_t *n_vocab) {
    *n_vocab = 0;
    const nm_gguf_kv *tk = nm_gguf_find(src, "tokenizer.ggml.tokens");
    if (!tk || tk->type != NM_GGUF_ARRAY) return 1;
    const int64_t have = (int64_t)tk->arr_n;
    if (vocab == 0 && n_user > 0) vocab = have + n_user;
    if (vocab > 0 && vocab < have + n_user) {
        fprintf(stderr, "nm-genmodel: --vocab %lld is below the tokenizer's %lld tokens and %d more\n", (long long)vocab,
                (long long)have, n_user);
        return 1;
    }
    *n_vocab = vocab > have ? vocab : have;
    if (bad_bos && nm_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)bad_bos) != NM_OK) return 1;
    for (int64_t i = 0; i < nm_gguf_n_kv(src); i++) {
        const nm_gguf_kv *kv = nm_gguf_kv_at(src, i);
        if (kv->key.len < 10 || memcmp(kv->key.ptr, "tokenizer.", 10)) continue;
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)kv->key.len, kv->key.ptr);
        if (bad_bos && !strcmp(key, "tokenizer.ggml.bos_token_id")) continue;
        const bool per_token = !strcmp(key, "tokenizer.ggml.tokens") || !strcmp(key, "tokenizer.ggml.token_type") ||
                               !strcmp(key, "tokenizer.ggml.scores");
        if (per_token && kv->type == NM_GGUF_ARRAY && vocab > (int64_t)kv->arr_n) {
            if (pad_vocab(w, kv, key, vocab, user, n_user)) return 1;
            continue;
        }
        // ARRAY values start 12 bytes before their first element (type + count).
        const uint8_t *p = kv->type == NM_GGUF_ARRAY ? kv->data - 12 : kv->data;
        uint64_t sz = nm_gguf_value_size(kv->type, p);
        if (nm_gguf_writer_add_raw(w, key, kv->type, p, sz) != NM_OK) return 1;
    }
    return *n_vocab > 0 ? 0 : 1;
}

// --script: every layer adds nothing (attn_output, ffn_down zero), so the last layer's output is the token's
// embedding E[a], normed; the output head's row of b gets 0.25 E[a] for each step a -> b of the chain (the
// prompt's last token, from script_after; the script's tokens, special ones parsed; end of generation), so
// greedy decoding says the script after any prompt ending in that token. A token followed by two different
// ones is refused (the model sees one token).
static int teach_script(const gen_opts *o, const float *E, float *W, int64_t d, int64_t n_vocab) {
    char err[256];
    nm_model *m = NULL;
    if (nm_model_load(o->out, NULL, &m, err, sizeof err) != NM_OK) {
        fprintf(stderr, "nm-genmodel: --script: %s\n", err);
        return 1;
    }
    int32_t chain[258];
    const char *after = o->script_after ? o->script_after : "\n";
    int32_t n0 = nm_tokenize(m, after, strlen(after), chain, 1, false, true), n = 0;
    if (n0 != 1) n0 = nm_tokenize(m, after, strlen(after), chain, 256, false, true), chain[0] = n0 > 0 ? chain[n0 - 1] : -1;
    if (chain[0] >= 0) n = nm_tokenize(m, o->script, strlen(o->script), chain + 1, 256, false, true);
    const int32_t eos = nm_token_eos(m);
    nm_model_free(m);
    if (chain[0] < 0 || n <= 0 || eos < 0) {
        fprintf(stderr, "nm-genmodel: --script: no tokens (or more than 256, or no end-of-generation token)\n");
        return 1;
    }
    chain[1 + n] = eos;
    for (int32_t i = 0; i <= n; i++)
        for (int32_t j = 0; j < i; j++)
            if (chain[j] == chain[i] && chain[j + 1] != chain[i + 1]) {
                fprintf(stderr, "nm-genmodel: --script: token %d is followed by %d and by %d (a script a one-token "
                                "model can say follows each token by one)\n", (int)chain[i], (int)chain[j + 1],
                        (int)chain[i + 1]);
                return 1;
            }
    for (int32_t i = 0; i <= n; i++) {
        if (chain[i + 1] >= n_vocab) return 1;
        float *row = W + (int64_t)chain[i + 1] * d;
        const float *e = E + (int64_t)chain[i] * d;
        bool seen = false; // (a pair taught once)
        for (int32_t j = 0; j < i; j++) seen |= chain[j] == chain[i];
        for (int64_t c = 0; c < d && !seen; c++) row[c] += 0.25f * e[c];
    }
    return 0;
}

gen_opts nm_genmodel_defaults(void) {
    gen_opts o = {.type = NM_TYPE_F32, .layers = 2, .embd = 128, .heads = 4, .kv_heads = 2, .ff = 256,
                  .seed = 1, .swa = 16};
    return o;
}

int nm_genmodel_write(gen_opts *o) {
    if (!o->arch || !o->tok_from || !o->out || o->layers < 1 || o->layers > 256 || o->embd < 1 || o->heads < 1 ||
        o->kv_heads < 1 || o->heads % o->kv_heads || o->ff < 1 || o->swa < 0 || o->head_dim < 0 ||
        !(o->final_softcap >= 0.0f) ||
        (o->head_dim == 0 && o->embd % o->heads)) {
        fprintf(stderr, "nm-genmodel: invalid options (layers 1..256, embd, ff >= 1, heads a multiple of kv-heads, "
                        "embd divisible by heads unless --head-dim is given)\n");
        return 2;
    }
    const bool gemma = !strcmp(o->arch, "gemma3"), qwen2vl = !strcmp(o->arch, "qwen2vl"), qwen3 = !strcmp(o->arch, "qwen3");
    const bool qwen = !strcmp(o->arch, "qwen2") || qwen2vl; // (q, k and v biases)
    const bool lfm2 = !strcmp(o->arch, "lfm2");
    if (!gemma && !qwen && !qwen3 && !lfm2 && strcmp(o->arch, "llama") && strcmp(o->arch, "smollm3")) {
        fprintf(stderr, "nm-genmodel: unknown arch '%s' (llama, qwen2, qwen2vl, qwen3, smollm3, gemma3, lfm2)\n",
                o->arch);
        return 2;
    }
    int32_t kv_of[256]; // lfm2: each layer's key/value heads (0: a short convolution)
    for (int il = 0; il < o->layers; il++) kv_of[il] = !lfm2 || (!o->attn_layers && il % 3 == 2) ? o->kv_heads : 0;
    for (const char *t = o->attn_layers; t && *t;) {
        char *e;
        const long il = strtol(t, &e, 10);
        if (e == t || il < 0 || il >= o->layers || (*e && *e != ',')) {
            fprintf(stderr, "nm-genmodel: --attn-layers '%s': layers 0..%d, comma-separated\n", o->attn_layers,
                    o->layers - 1);
            return 2;
        }
        kv_of[il] = o->kv_heads;
        t = *e ? e + 1 : e;
    }
    const int conv_l = o->conv_l > 0 ? o->conv_l : 3;
    gen_state gs = {.cap = 4 + 20 * o->layers, .bad_3d = o->bad_3d};
    if (o->head_dim <= 0) o->head_dim = o->embd / o->heads;
    gs.rng = o->seed * 0x9E3779B97F4A7C15ull + 1;

    char err[256];
    nm_gguf *src = NULL;
    gs.keep = calloc((size_t)gs.cap, sizeof(void *));
    if (!gs.keep || nm_gguf_open(o->tok_from, &src, err, sizeof err) != NM_OK) {
        fprintf(stderr, "nm-genmodel: %s: %s\n", o->tok_from, gs.keep ? err : "out of memory");
        free(gs.keep);
        return 1;
    }
    if (o->script && (o->type != NM_TYPE_F32 || o->bad_3d)) {
        fprintf(stderr, "nm-genmodel: --script writes f32 weights\n");
        nm_gguf_close(src);
        free(gs.keep);
        return 2;
    }
    char *user[16];
    int n_user = 0;
    for (const char *t = o->user_tokens; t && *t && n_user < 16;) { // (comma-separated)
        const char *e = strchr(t, ',');
        const size_t n = e ? (size_t)(e - t) : strlen(t);
        if (n > 0 && n < 32 && (user[n_user] = strndup(t, n))) n_user++;
        t += n + (e ? 1 : 0);
    }
    nm_gguf_writer *w = nm_gguf_writer_create();
    int64_t n_vocab = 0;
    int bad = !w || copy_tokenizer(w, src, o->bad_bos_id, o->vocab, user, n_user, &n_vocab);
    for (int i = 0; i < n_user; i++) free(user[i]);
    char k[160];
#define KEY(s) (snprintf(k, sizeof k, "%s." s, o->arch), k)
    bad |= nm_gguf_writer_add_str(w, "general.architecture", o->arch) != NM_OK;
    bad |= nm_gguf_writer_add_str(w, "general.name", "nanomind random test model") != NM_OK;
    bad |= nm_gguf_writer_add_u32(w, KEY("context_length"), 4096) != NM_OK;
    bad |= nm_gguf_writer_add_u32(w, KEY("embedding_length"), (uint32_t)o->embd) != NM_OK;
    bad |= nm_gguf_writer_add_u32(w, KEY("block_count"), (uint32_t)(o->bad_block_count ? o->bad_block_count : o->layers)) != NM_OK;
    bad |= nm_gguf_writer_add_u32(w, KEY("feed_forward_length"), (uint32_t)o->ff) != NM_OK;
    bad |= nm_gguf_writer_add_u32(w, KEY("attention.head_count"), (uint32_t)(o->bad_heads ? o->bad_heads : o->heads)) != NM_OK;
    if (lfm2) {
        bad |= nm_gguf_writer_add_arr(w, KEY("attention.head_count_kv"), NM_GGUF_INT32, kv_of, (uint64_t)o->layers) != NM_OK;
        bad |= nm_gguf_writer_add_u32(w, KEY("shortconv.l_cache"), (uint32_t)conv_l) != NM_OK;
    } else {
        bad |= nm_gguf_writer_add_u32(w, KEY("attention.head_count_kv"), (uint32_t)o->kv_heads) != NM_OK;
    }
    if (!o->bad_heads) {
        bad |= nm_gguf_writer_add_u32(w, KEY("attention.key_length"), (uint32_t)o->head_dim) != NM_OK;
        bad |= nm_gguf_writer_add_u32(w, KEY("attention.value_length"), (uint32_t)o->head_dim) != NM_OK;
    }
    bad |= nm_gguf_writer_add_f32(w, KEY("attention.layer_norm_rms_epsilon"), o->bad_norm_eps ? o->bad_norm_eps : 1e-6f) != NM_OK;
    bad |= nm_gguf_writer_add_f32(w, KEY("rope.freq_base"), o->bad_rope_base ? o->bad_rope_base : o->rope_base > 0.0f ? o->rope_base : qwen || qwen3 ? 1000000.0f : 10000.0f) != NM_OK;
    if (gemma) bad |= nm_gguf_writer_add_u32(w, KEY("attention.sliding_window"), (uint32_t)o->swa) != NM_OK;
    if (qwen2vl) { // M-RoPE's sections in Qwen2-VL's proportions (16, 24, 24 of 64 pairs), the 4th empty
        const int32_t h = o->head_dim / 2, s0 = h / 4, s1 = (h - s0) / 2;
        const int32_t sec[4] = {s0, s1, h - s0 - s1, o->bad_mrope == 2 ? 1 : 0};
        if (o->bad_mrope != 1)
            bad |= nm_gguf_writer_add_arr(w, KEY("rope.dimension_sections"), NM_GGUF_INT32, sec, 4) != NM_OK;
    }
    if (o->final_softcap > 0.0f)
        bad |= nm_gguf_writer_add_f32(w, KEY("final_logit_softcapping"), o->final_softcap) != NM_OK;

    const int64_t d = o->embd, qd = (int64_t)o->heads * o->head_dim, kvd = (int64_t)o->kv_heads * o->head_dim;
    // Scales keep activations O(1) and make the output distribution peaked, so
    // that top-1 comparisons are meaningful.
    const float wd = 1.0f / sqrtf((float)d), wq = 1.0f / sqrtf((float)qd), wf = 1.0f / sqrtf((float)o->ff);
    bad = bad || add(&gs, w, "token_embd.weight", o->type, d, n_vocab, 0.0f, 1.0f);
    bad = bad || add(&gs, w, lfm2 ? "token_embd_norm.weight" : "output_norm.weight", NM_TYPE_F32, d, 1, 1.0f, 0.1f);
    // An untied output head: with tied embeddings a random model mostly
    // predicts its input token back, which makes top-1 comparisons trivial.
    bad = bad || add(&gs, w, "output.weight", o->type, d, n_vocab, 0.0f, o->script ? 0.01f : 1.0f);
    for (int il = 0; il < o->layers && !bad; il++) {
        char n[96];
#define T(name, type, ne0, ne1, mean, std) \
    (snprintf(n, sizeof n, "blk.%d." name, il), add(&gs, w, n, type, ne0, ne1, mean, std))
        if (!kv_of[il]) { // lfm2's short convolution: in_proj (b, c, x), the taps, out_proj; then the FFN
            bad = T("attn_norm.weight", NM_TYPE_F32, d, 1, 1.0f, 0.1f) ||
                  T("shortconv.in_proj.weight", o->type, d, 3 * d, 0.0f, wd) ||
                  T("shortconv.conv.weight", NM_TYPE_F32, conv_l, d, 0.0f, 0.5f) ||
                  T("shortconv.out_proj.weight", o->type, d, d, 0.0f, o->script ? 0.0f : wd) ||
                  T("ffn_norm.weight", NM_TYPE_F32, d, 1, 1.0f, 0.1f) ||
                  T("ffn_gate.weight", o->type, d, o->ff, 0.0f, wd) || T("ffn_up.weight", o->type, d, o->ff, 0.0f, wd) ||
                  T("ffn_down.weight", o->type, o->ff, d, 0.0f, o->script ? 0.0f : wf);
            continue;
        }
        bad = T("attn_norm.weight", NM_TYPE_F32, d, 1, 1.0f, 0.1f) || T("attn_q.weight", o->type, d, qd, 0.0f, wd) ||
              T("attn_k.weight", o->type, d, kvd, 0.0f, wd) || T("attn_v.weight", o->type, d, kvd, 0.0f, wd) ||
              T("attn_output.weight", o->type, qd, d, 0.0f, o->script ? 0.0f : wq) ||
              T("ffn_norm.weight", NM_TYPE_F32, d, 1, 1.0f, 0.1f) ||
              T("ffn_gate.weight", o->type, d, o->ff, 0.0f, wd) || T("ffn_up.weight", o->type, d, o->ff, 0.0f, wd) ||
              T("ffn_down.weight", o->type, o->ff, d, 0.0f, o->script ? 0.0f : wf);
        if (!bad && qwen)
            bad = T("attn_q.bias", NM_TYPE_F32, qd, 1, 0.0f, 0.1f) || T("attn_k.bias", NM_TYPE_F32, kvd, 1, 0.0f, 0.1f) ||
                  T("attn_v.bias", NM_TYPE_F32, kvd, 1, 0.0f, 0.1f);
        if (!bad && (gemma || qwen3 || lfm2))
            bad = T("attn_q_norm.weight", NM_TYPE_F32, o->head_dim, 1, 1.0f, 0.1f) ||
                  T("attn_k_norm.weight", NM_TYPE_F32, o->head_dim, 1, 1.0f, 0.1f);
        if (!bad && gemma)
            bad = T("post_attention_norm.weight", NM_TYPE_F32, d, 1, 1.0f, 0.1f) ||
                  T("post_ffw_norm.weight", NM_TYPE_F32, d, 1, 1.0f, 0.1f);
#undef T
    }
    if (!bad && nm_gguf_writer_write(w, o->out) != NM_OK) {
        fprintf(stderr, "nm-genmodel: writing %s: %s\n", o->out, nm_gguf_writer_last_error(w));
        bad = 1;
    }
    if (!bad && o->script) { // the output head taught the script, the file written again
        bad = teach_script(o, (const float *)gs.keep[0], (float *)gs.keep[2], d, n_vocab);
        if (!bad && nm_gguf_writer_write(w, o->out) != NM_OK) {
            fprintf(stderr, "nm-genmodel: writing %s: %s\n", o->out, nm_gguf_writer_last_error(w));
            bad = 1;
        }
    }
    for (int i = 0; i < gs.n_keep; i++) free(gs.keep[i]);
    free(gs.keep);
    nm_gguf_writer_free(w);
    nm_gguf_close(src);
    return bad;
}

int nm_requant_write(const char *in, const char *out, uint32_t to) {
    char err[512];
    nm_gguf *g = NULL;
    if (nm_gguf_open(in, &g, err, sizeof err) != NM_OK) {
        fprintf(stderr, "nm-requant: %s: %s\n", in, err);
        return 1;
    }
    nm_gguf_writer *w = nm_gguf_writer_create();
    int bad = !w;
    for (int64_t i = 0; i < nm_gguf_n_kv(g) && !bad; i++) {
        const nm_gguf_kv *kv = nm_gguf_kv_at(g, i);
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)kv->key.len, kv->key.ptr);
        if (!strcmp(key, "general.file_type")) continue; // no longer true
        const uint8_t *p = kv->type == NM_GGUF_ARRAY ? kv->data - 12 : kv->data; // arrays: type + count first
        bad = nm_gguf_writer_add_raw(w, key, kv->type, p, nm_gguf_value_size(kv->type, p)) != NM_OK;
    }
    const int64_t nt = nm_gguf_n_tensors(g);
    void **bufs = calloc((size_t)(nt > 0 ? nt : 1), sizeof *bufs);
    for (int64_t i = 0; i < nt && !bad; i++) {
        const nm_gguf_tensor *t = nm_gguf_tensor_at(g, i);
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        const void *data = t->data;
        uint32_t type = t->type;
        // only weights are converted, as llama.cpp's quantize does (a name ending in "weight": not
        // whisper's positional embeddings or mel filters), and only where the type holds their rows
        // (not whisper's convolutions' 3-wide kernels)
        const size_t nl = strlen(name);
        const bool weight = nl >= 6 && !strcmp(name + nl - 6, "weight");
        if (t->n_dims >= 2 && t->type != to && weight && nm_row_size(to, t->ne[0]) != 0) {
            const int64_t K = t->ne[0], rows = t->ne[1] * t->ne[2] * t->ne[3];
            const size_t in_rb = nm_row_size(t->type, K), out_rb = nm_row_size(to, K);
            float *row = malloc(sizeof(float) * (size_t)K);
            bufs[i] = malloc(out_rb * (size_t)rows);
            if (!row || !bufs[i] || !out_rb) {
                fprintf(stderr, "nm-requant: %s: cannot convert rows of %lld to %s\n", name, (long long)K, nm_type_traits_get(to)->name);
                free(row);
                bad = 1;
                break;
            }
            for (int64_t r = 0; r < rows; r++) {
                nm_dequantize_row_ref(t->type, (const uint8_t *)t->data + (size_t)r * in_rb, row, K);
                nm_quantize_row_ref(to, row, (uint8_t *)bufs[i] + (size_t)r * out_rb, K);
            }
            free(row);
            data = bufs[i];
            type = to;
        }
        if (nm_gguf_writer_add_tensor(w, name, type, t->n_dims, t->ne, data) != NM_OK) {
            fprintf(stderr, "nm-requant: %s: %s\n", name, nm_gguf_writer_last_error(w));
            bad = 1;
        }
    }
    if (!bad && nm_gguf_writer_write(w, out) != NM_OK) {
        fprintf(stderr, "nm-requant: writing %s: %s\n", out, nm_gguf_writer_last_error(w));
        bad = 1;
    }
    for (int64_t i = 0; i < nt; i++) free(bufs[i]);
    free(bufs);
    nm_gguf_writer_free(w);
    nm_gguf_close(g);
    return bad;
}
