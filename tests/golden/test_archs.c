// Every supported architecture on small random-weight models (written with our
// GGUF writer, tokenizer copied from SmolLM2): KV cache consistency, the
// embeddings entry point, and clear errors for bad models and bad calls.
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "../unit/nmtest.h"
#include "bricks/vision/clip.h"
#include "bricks/vision/preproc.h"
#include "genmmproj.h"
#include "genmodel.h"
#include "models.h"
#include "nanomind.h"
#include "gguf/gguf.h"
#include "quant/quant.h"

static const char *archs[] = {"llama", "qwen2", "gemma3"};

static bool make_model(const char *arch, uint32_t type, const char *out, int swa) {
    char tok[1024];
    if (golden_model(NM_SMOLLM2, tok, sizeof tok) != 0) return false;
    gen_opts o = nm_genmodel_defaults();
    o.arch = arch;
    o.tok_from = tok;
    o.out = out;
    o.type = type;
    o.layers = 3;
    o.embd = 128;
    o.heads = 4;
    o.kv_heads = 2;
    o.ff = 256;
    o.swa = swa;
    o.seed = 7;
    return nm_genmodel_write(&o) == 0;
}

// f32 weights: prefill (tiled f32 GEMM) and decode (dot products) agree to
// float rounding, plus the odd f16 rounding flip of a cached K/V value
// (measured llama 1.35e-3, qwen2 2.39e-3, gemma3 2.93e-4; bound 5e-3). q8_0 weights: both round activations to 8 bits,
// and a different summation order flips some roundings, which the layers
// amplify, so there the check is the top-1 token at each position.
NM_TEST(random_models_batch_equals_incremental) {
    char tok[1024];
    NM_NEED_MODEL(NM_SMOLLM2, tok);
    for (int a = 0; a < 6; a++) {
        char path[256];
        const uint32_t wtype = a < 3 ? NM_TYPE_F32 : NM_TYPE_Q8_0;
        snprintf(path, sizeof path, "/tmp/nm-test-%s-%d.gguf", archs[a % 3], (int)getpid());
        // window 8 < prompt length: the gemma3 local layers really slide
        NM_CHECK(make_model(archs[a % 3], wtype, path, 8));
        nm_model *m = NULL;
        char err[256];
        nm_status st = nm_model_load(path, NULL, &m, err, sizeof err);
        NM_CHECK(st == NM_OK);
        if (st != NM_OK) {
            fprintf(stderr, "  %s: %s\n", archs[a % 3], err);
            unlink(path);
            continue;
        }
        NM_CHECK(!strcmp(nm_model_arch(m), archs[a % 3]));
        nm_ctx_params cp = nm_ctx_default_params();
        cp.n_ctx = 64;
        nm_ctx *b = NULL, *inc = NULL;
        NM_CHECK(nm_ctx_create(m, &cp, &b, NULL, 0) == NM_OK && nm_ctx_create(m, &cp, &inc, NULL, 0) == NM_OK);
        int32_t toks[40];
        for (int i = 0; i < 40; i++) toks[i] = (i * 7919 + 13) % nm_model_n_vocab(m);
        // prefill in two batches, then compare with one token at a time
        NM_CHECK(nm_decode(b, toks, 25, 0, true) == NM_OK);
        double maxd = 0.0;
        int same_top = 0;
        float *saved = malloc(sizeof(float) * 25 * (size_t)nm_model_n_vocab(m));
        for (int i = 0; i < 25; i++)
            memcpy(saved + (size_t)i * nm_model_n_vocab(m), nm_get_logits(b, i), sizeof(float) * nm_model_n_vocab(m));
        for (int i = 0; i < 25; i++) {
            NM_CHECK(nm_decode(inc, &toks[i], 1, i, false) == NM_OK);
            const float *la = saved + (size_t)i * nm_model_n_vocab(m), *lb = nm_get_logits(inc, -1);
            int ta = 0, tb = 0;
            for (int v = 0; v < nm_model_n_vocab(m); v++) {
                double d = fabs((double)la[v] - lb[v]);
                if (d > maxd) maxd = d;
                if (la[v] > la[ta]) ta = v;
                if (lb[v] > lb[tb]) tb = v;
            }
            same_top += ta == tb;
        }
        free(saved);
        fprintf(stderr, "  %s %s: batch vs incremental: max |logit diff| %.2e, same top-1 %d/25\n", archs[a % 3],
                nm_type_traits_get(wtype)->name, maxd, same_top);
        if (wtype == NM_TYPE_F32) NM_CHECK(maxd < 5e-3);
        NM_CHECK(same_top >= 24);
        // bad calls are statuses, not crashes
        int32_t bad_tok = nm_model_n_vocab(m);
        NM_CHECK(nm_decode(inc, &bad_tok, 1, 25, false) == NM_ERR_RANGE);
        NM_CHECK(strstr(nm_ctx_last_error(inc), "out of range") != NULL);
        NM_CHECK(nm_decode(inc, toks, 1, 64, false) == NM_ERR_RANGE);
        NM_CHECK(nm_decode(inc, toks, 0, 0, false) == NM_ERR_RANGE);
        nm_ctx_free(b);
        nm_ctx_free(inc);
        nm_model_free(m);
        unlink(path);
    }
}

// lfm2's short convolutions carry a state from token to token: a prompt decoded at once, one token at a
// time, and again from the checkpoint at 32 (its positions from 33 replaced) give the same logits (f32);
// a position whose state is not kept is refused, and nm_ctx_resume_pos says where to go on.
NM_TEST(lfm2_state_batch_steps_and_checkpoints) {
    char tok[1024], path[256];
    NM_NEED_MODEL(NM_SMOLLM2, tok);
    snprintf(path, sizeof path, "/tmp/nm-test-lfm2-%d.gguf", (int)getpid());
    gen_opts o = nm_genmodel_defaults();
    o.arch = "lfm2", o.tok_from = tok, o.out = path, o.type = NM_TYPE_F32;
    o.layers = 4, o.embd = 128, o.heads = 4, o.kv_heads = 2, o.ff = 256, o.seed = 5, o.attn_layers = "1";
    NM_CHECK(nm_genmodel_write(&o) == 0);
    nm_model *m = NULL;
    char err[256];
    NM_CHECK(nm_model_load(path, NULL, &m, err, sizeof err) == NM_OK);
    unlink(path);
    if (!m) return (void)fprintf(stderr, "  %s\n", err);
    nm_ctx_params cp = nm_ctx_default_params();
    cp.n_ctx = 128;
    nm_ctx *b = NULL, *inc = NULL;
    NM_CHECK(nm_ctx_create(m, &cp, &b, NULL, 0) == NM_OK && nm_ctx_create(m, &cp, &inc, NULL, 0) == NM_OK);
    enum { N = 80 };
    const int32_t nv = nm_model_n_vocab(m);
    int32_t toks[N];
    for (int i = 0; i < N; i++) toks[i] = (i * 7919 + 13) % nv;
    float *saved = malloc(sizeof(float) * N * (size_t)nv);
    NM_CHECK(saved && b && inc && nm_decode(b, toks, N, 0, true) == NM_OK);
    if (!saved || !b || !inc) goto out;
    for (int i = 0; i < N; i++) memcpy(saved + (size_t)i * nv, nm_get_logits(b, i), sizeof(float) * nv);
    double d_inc = 0, d_cp = 0;
    for (int i = 0; i < N; i++) {
        NM_CHECK(nm_decode(inc, &toks[i], 1, i, false) == NM_OK);
        for (int v = 0; v < nv; v++) d_inc = fmax(d_inc, fabs(saved[(size_t)i * nv + v] - nm_get_logits(inc, -1)[v]));
    }
    // the ring keeps the last 32 positions: 50 is there; 33 is not, the checkpoint at 32 is
    NM_CHECK(nm_ctx_resume_pos(b, 0, 50) == 50 && nm_ctx_resume_pos(b, 0, 33) == 32 &&
             nm_ctx_resume_pos(b, 0, 20) == 0 && nm_ctx_resume_pos(b, 0, 100) == N);
    NM_CHECK(nm_decode(b, toks + 33, 1, 33, false) == NM_ERR_RANGE && strstr(nm_ctx_last_error(b), "no state kept"));
    NM_CHECK(nm_decode(b, toks, 1, N + 1, false) == NM_ERR_RANGE && strstr(nm_ctx_last_error(b), "past the"));
    NM_CHECK(nm_decode(b, toks + 32, N - 32, 32, true) == NM_OK); // from the checkpoint: the same again
    for (int i = 32; i < N; i++)
        for (int v = 0; v < nv; v++)
            d_cp = fmax(d_cp, fabs(saved[(size_t)i * nv + v] - nm_get_logits(b, i - 32)[v]));
    fprintf(stderr, "  lfm2: batch vs one at a time max |logit diff| %.2e, from the checkpoint %.2e\n", d_inc, d_cp);
    NM_CHECK(d_inc < 5e-3 && d_cp < 5e-3);
    // OpenCL, every layer there: the prompt, then again from the checkpoint at 32, as the CPU's
    nm_ctx *dev = NULL;
    cp.device = "opencl";
    if (nm_ctx_create(m, &cp, &dev, err, sizeof err) != NM_OK) {
        printf("  skip: OpenCL: %s\n", err);
        goto out;
    }
    double d_dev = 0;
    NM_CHECK(nm_decode(dev, toks, N, 0, true) == NM_OK);
    for (int i = 0; i < N; i++)
        for (int v = 0; v < nv; v++) d_dev = fmax(d_dev, fabs(saved[(size_t)i * nv + v] - nm_get_logits(dev, i)[v]));
    NM_CHECK(nm_decode(dev, toks + 32, N - 32, 32, true) == NM_OK);
    for (int i = 32; i < N; i++)
        for (int v = 0; v < nv; v++)
            d_dev = fmax(d_dev, fabs(saved[(size_t)i * nv + v] - nm_get_logits(dev, i - 32)[v]));
    fprintf(stderr, "  lfm2 on %s: max |logit diff| %.2e from the CPU's\n", nm_ctx_device(dev), d_dev);
    NM_CHECK(d_dev < 5e-3);
    nm_ctx_free(dev);
out:
    free(saved);
    nm_ctx_free(b);
    nm_ctx_free(inc);
    nm_model_free(m);
}

// Feeding the token embeddings through nm_decode_embd gives the same logits as
// feeding the token ids (gemma3 scales token embeddings by sqrt(n_embd), which
// the caller of the embeddings entry point does itself).
NM_TEST(random_models_embeddings_entry_point) {
    char tok[1024];
    NM_NEED_MODEL(NM_SMOLLM2, tok);
    for (int a = 0; a < 3; a++) {
        char path[256];
        snprintf(path, sizeof path, "/tmp/nm-test-embd-%s-%d.gguf", archs[a], (int)getpid());
        NM_CHECK(make_model(archs[a], NM_TYPE_F32, path, 8));
        nm_model *m = NULL;
        NM_CHECK(nm_model_load(path, NULL, &m, NULL, 0) == NM_OK);
        if (!m) continue;
        nm_gguf *g = NULL;
        NM_CHECK(nm_gguf_open(path, &g, NULL, 0) == NM_OK);
        const nm_gguf_tensor *te = nm_gguf_find_tensor(g, "token_embd.weight");
        const int d = nm_model_n_embd(m), nv = nm_model_n_vocab(m);
        int32_t toks[6] = {1, 100, 2000, 30000, 5, 49151};
        float embd[6 * 128];
        const float scale = !strcmp(archs[a], "gemma3") ? sqrtf((float)d) : 1.0f;
        for (int i = 0; i < 6; i++)
            for (int j = 0; j < d; j++) embd[i * d + j] = ((const float *)te->data)[(size_t)toks[i] * d + j] * scale;
        nm_ctx *c1 = NULL, *c2 = NULL;
        NM_CHECK(nm_ctx_create(m, NULL, &c1, NULL, 0) == NM_OK && nm_ctx_create(m, NULL, &c2, NULL, 0) == NM_OK);
        NM_CHECK(nm_decode(c1, toks, 6, 0, false) == NM_OK);
        NM_CHECK(nm_decode_embd(c2, embd, 6, 0, false) == NM_OK);
        double maxd = 0.0;
        for (int v = 0; v < nv; v++) maxd = nm_maxdiff(maxd, nm_get_logits(c1, -1)[v], nm_get_logits(c2, -1)[v]);
        NM_CHECK(maxd < 1e-4);
        NM_CHECK(nm_get_logits(c1, 0) == NULL); // only the last row was kept
        nm_ctx_free(c1);
        nm_ctx_free(c2);
        nm_gguf_close(g);
        nm_model_free(m);
        unlink(path);
    }
}

// Writes a GGUF with only llama-style hyperparameters (no tensors).
static bool write_meta(const char *path, const char *arch, uint32_t heads, uint32_t kv_heads, uint32_t head_dim) {
    nm_gguf_writer *w = nm_gguf_writer_create();
    char k[128];
    bool ok = w && nm_gguf_writer_add_str(w, "general.architecture", arch) == NM_OK;
#define U32(key, v) (snprintf(k, sizeof k, "%s." key, arch), ok = ok && nm_gguf_writer_add_u32(w, k, v) == NM_OK)
    U32("embedding_length", 96);
    U32("block_count", 1);
    U32("feed_forward_length", 128);
    U32("attention.head_count", heads);
    U32("attention.head_count_kv", kv_heads);
    if (head_dim) U32("attention.key_length", head_dim);
#undef U32
    ok = ok && nm_gguf_writer_write(w, path) == NM_OK;
    nm_gguf_writer_free(w);
    return ok;
}

// lfm2's keys but the epsilon: head_count_kv one count a layer (array) or one for all (not), shortconv.l_cache
// where l_cache > 0.
static bool write_meta_lfm2(const char *path, bool array, uint32_t l_cache) {
    nm_gguf_writer *w = nm_gguf_writer_create();
    const int32_t kv[2] = {0, 2};
    bool ok = w && nm_gguf_writer_add_str(w, "general.architecture", "lfm2") == NM_OK &&
              nm_gguf_writer_add_u32(w, "lfm2.embedding_length", 96) == NM_OK &&
              nm_gguf_writer_add_u32(w, "lfm2.block_count", 2) == NM_OK &&
              nm_gguf_writer_add_u32(w, "lfm2.feed_forward_length", 128) == NM_OK &&
              nm_gguf_writer_add_u32(w, "lfm2.attention.head_count", 4) == NM_OK &&
              (array ? nm_gguf_writer_add_arr(w, "lfm2.attention.head_count_kv", NM_GGUF_INT32, kv, 2)
                     : nm_gguf_writer_add_u32(w, "lfm2.attention.head_count_kv", 2)) == NM_OK &&
              (!l_cache || nm_gguf_writer_add_u32(w, "lfm2.shortconv.l_cache", l_cache) == NM_OK) &&
              nm_gguf_writer_write(w, path) == NM_OK;
    nm_gguf_writer_free(w);
    return ok;
}

static void expect_load_error(const char *path, nm_status want, const char *msg, int *nmtest_failed) {
    nm_model *m = NULL;
    char err[256] = "";
    nm_status st = nm_model_load(path, NULL, &m, err, sizeof err);
    fprintf(stderr, "  %s -> %s: %s\n", path, nm_status_str(st), err);
    NM_CHECK(st == want && m == NULL);
    NM_CHECK(strstr(err, msg) != NULL);
    nm_model_free(m);
}

// A model file with an unknown arch, inconsistent dimensions, a tensor
// missing or cut short is refused with a message naming the problem.
// ---- qwen2vl: M-RoPE against a scalar reference -------------------------------------------------

// f32 tensor `name` of the model file (the generator's f32 weights), or NULL.
static const float *ref_w(const nm_gguf *g, const char *fmt, int il) {
    char n[96];
    snprintf(n, sizeof n, fmt, il);
    const nm_gguf_tensor *t = nm_gguf_find_tensor(g, n);
    return t && t->type == NM_TYPE_F32 ? (const float *)t->data : NULL;
}

// y[o] = sum_k W[o][k] x[k] + b[o]
static void ref_mv(const float *W, const float *b, const float *x, int K, int O, float *y) {
    for (int o = 0; o < O; o++) {
        double s = b ? b[o] : 0.0;
        for (int k = 0; k < K; k++) s += (double)W[(size_t)o * K + k] * x[k];
        y[o] = (float)s;
    }
}

static void ref_rms(const float *x, const float *w, int d, float eps, float *y) {
    double ss = 0;
    for (int i = 0; i < d; i++) ss += (double)x[i] * x[i];
    const float sc = 1.0f / sqrtf((float)(ss / d) + eps);
    for (int i = 0; i < d; i++) y[i] = x[i] * sc * w[i];
}

// Rotates one head (NeoX halves) by M-RoPE: pair k turns by stream sec(k) of pos3 at base^(-2k/hd).
static void ref_mrope(float *x, int hd, const int32_t pos3[3], const int32_t sec[4], double base) {
    const int sd = sec[0] + sec[1] + sec[2] + sec[3];
    for (int k = 0; k < hd / 2; k++) {
        const int r = k % sd, st = r < sec[0] ? 0 : r < sec[0] + sec[1] ? 1 : r < sec[0] + sec[1] + sec[2] ? 2 : 3;
        const double th = (st < 3 ? pos3[st] : 0) * pow(base, -2.0 * k / hd);
        const double c = cos(th), sn = sin(th), x0 = x[k], x1 = x[k + hd / 2];
        x[k] = (float)(x0 * c - x1 * sn);
        x[k + hd / 2] = (float)(x0 * sn + x1 * c);
    }
}

// The test model's rope base: Qwen2-VL's 1e6 turns the w section's pairs (the slowest) by 1e-4 rad a
// position at a head of 32, too little to see a stream mixed up in 13 positions; at 100 they turn by 0.01-0.06.
#define ROPE_BASE 100.0

// The last row's logits of a qwen2vl model (L layers, d, H heads of hd, KV heads, ff) over n input rows
// (embeddings in X) with rope positions pos3, causal by row.
static void ref_qwen2vl(const nm_gguf *g, int L, int d, int H, int KV, int hd, int ff, int vocab, const int32_t sec[4],
                        const float *X, const int32_t (*pos3)[3], int n, float *logits) {
    float *x = malloc(sizeof(float) * (size_t)n * d), *h = malloc(sizeof(float) * d);
    float *q = malloc(sizeof(float) * (size_t)n * H * hd), *k = malloc(sizeof(float) * (size_t)n * KV * hd);
    float *v = malloc(sizeof(float) * (size_t)n * KV * hd), *a = malloc(sizeof(float) * H * hd);
    float *o = malloc(sizeof(float) * d), *gt = malloc(sizeof(float) * ff), *up = malloc(sizeof(float) * ff);
    double *sc = malloc(sizeof(double) * n);
    memcpy(x, X, sizeof(float) * (size_t)n * d);
    for (int il = 0; il < L; il++) {
        for (int t = 0; t < n; t++) {
            ref_rms(x + (size_t)t * d, ref_w(g, "blk.%d.attn_norm.weight", il), d, 1e-6f, h);
            ref_mv(ref_w(g, "blk.%d.attn_q.weight", il), ref_w(g, "blk.%d.attn_q.bias", il), h, d, H * hd, q + (size_t)t * H * hd);
            ref_mv(ref_w(g, "blk.%d.attn_k.weight", il), ref_w(g, "blk.%d.attn_k.bias", il), h, d, KV * hd, k + (size_t)t * KV * hd);
            ref_mv(ref_w(g, "blk.%d.attn_v.weight", il), ref_w(g, "blk.%d.attn_v.bias", il), h, d, KV * hd, v + (size_t)t * KV * hd);
            for (int hh = 0; hh < H; hh++) ref_mrope(q + ((size_t)t * H + hh) * hd, hd, pos3[t], sec, ROPE_BASE);
            for (int hh = 0; hh < KV; hh++) ref_mrope(k + ((size_t)t * KV + hh) * hd, hd, pos3[t], sec, ROPE_BASE);
        }
        for (int t = 0; t < n; t++) {
            for (int hh = 0; hh < H; hh++) {
                const int kh = hh / (H / KV);
                double mx = -1e300, sum = 0;
                for (int u = 0; u <= t; u++) {
                    double s = 0;
                    for (int i = 0; i < hd; i++) s += (double)q[((size_t)t * H + hh) * hd + i] * k[((size_t)u * KV + kh) * hd + i];
                    sc[u] = s / sqrt((double)hd);
                    if (sc[u] > mx) mx = sc[u];
                }
                for (int u = 0; u <= t; u++) sum += (sc[u] = exp(sc[u] - mx));
                for (int i = 0; i < hd; i++) {
                    double s = 0;
                    for (int u = 0; u <= t; u++) s += sc[u] / sum * v[((size_t)u * KV + kh) * hd + i];
                    a[hh * hd + i] = (float)s;
                }
            }
            ref_mv(ref_w(g, "blk.%d.attn_output.weight", il), NULL, a, H * hd, d, o);
            float *xt = x + (size_t)t * d;
            for (int i = 0; i < d; i++) xt[i] += o[i];
        }
        for (int t = 0; t < n; t++) {
            float *xt = x + (size_t)t * d;
            ref_rms(xt, ref_w(g, "blk.%d.ffn_norm.weight", il), d, 1e-6f, h);
            ref_mv(ref_w(g, "blk.%d.ffn_gate.weight", il), NULL, h, d, ff, gt);
            ref_mv(ref_w(g, "blk.%d.ffn_up.weight", il), NULL, h, d, ff, up);
            for (int i = 0; i < ff; i++) gt[i] = gt[i] / (1.0f + expf(-gt[i])) * up[i];
            ref_mv(ref_w(g, "blk.%d.ffn_down.weight", il), NULL, gt, ff, d, o);
            for (int i = 0; i < d; i++) xt[i] += o[i];
        }
    }
    ref_rms(x + (size_t)(n - 1) * d, ref_w(g, "output_norm.weight", 0), d, 1e-6f, h);
    ref_mv(ref_w(g, "output.weight", 0), NULL, h, d, vocab, logits);
    free(x), free(h), free(q), free(k), free(v), free(a), free(o), free(gt), free(up), free(sc);
}

// A qwen2vl model decodes text, a 4 x 2 image (M-RoPE: (p0, p0 + row, p0 + column)) and text after it
// (rope positions on by max(4, 2) = 4 from p0, though the image takes 8 cache rows), in batches of 4 so
// that the image spans three; the logits equal a scalar reference with those positions (f16 cache: 5e-4
// of the logits' range). Decoding text again over the image's
// positions forgets its shift.
NM_TEST(qwen2vl_mrope_matches_reference) {
    char tok[1024];
    NM_NEED_MODEL(NM_SMOLLM2, tok);
    char path[256];
    snprintf(path, sizeof path, "/tmp/nm-test-qwen2vl-%d.gguf", (int)getpid());
    enum { L = 2, D = 128, H = 4, KV = 2, HD = 32, FF = 256 };
    gen_opts o = nm_genmodel_defaults();
    o.arch = "qwen2vl", o.tok_from = tok, o.out = path, o.type = NM_TYPE_F32;
    o.layers = L, o.embd = D, o.heads = H, o.kv_heads = KV, o.ff = FF, o.seed = 11, o.rope_base = (float)ROPE_BASE;
    NM_CHECK(nm_genmodel_write(&o) == 0);
    nm_model *m = NULL;
    char err[256];
    NM_CHECK(nm_model_load(path, NULL, &m, err, sizeof err) == NM_OK);
    nm_gguf *g = NULL;
    NM_CHECK(nm_gguf_open(path, &g, err, sizeof err) == NM_OK);
    if (!m || !g) {
        fprintf(stderr, "  %s\n", err);
        nm_model_free(m);
        unlink(path);
        return;
    }
    NM_CHECK(!strcmp(nm_model_arch(m), "qwen2vl"));
    const int vocab = nm_model_n_vocab(m);
    const int32_t sec[4] = {4, 6, 6, 0}; // the generator's, for a head of 32
    const int32_t text0[3] = {17, 4242, 999}, text1[2] = {12345, 77};
    float X[13 * D];
    int32_t pos3[13][3];
    const float *emb = ref_w(g, "token_embd.weight", 0);
    uint64_t rng = 5;
    for (int t = 0; t < 13; t++) {
        const bool img = t >= 3 && t < 11;
        const int32_t id = t < 3 ? text0[t] : t >= 11 ? text1[t - 11] : 0;
        for (int i = 0; i < D; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            X[t * D + i] = img ? (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0) * 1.7f : emb[(size_t)id * D + i];
        }
        const int32_t p = t < 3 ? t : t >= 11 ? 3 + 4 + (t - 11) : 3; // after the image: p0 + max(nx, ny)
        pos3[t][0] = p;
        pos3[t][1] = img ? 3 + (t - 3) / 4 : p;
        pos3[t][2] = img ? 3 + (t - 3) % 4 : p;
    }
    float *want = malloc(sizeof(float) * (size_t)vocab);
    ref_qwen2vl(g, L, D, H, KV, HD, FF, vocab, sec, X, (const int32_t(*)[3])pos3, 13, want);
    nm_ctx_params cp = nm_ctx_default_params();
    cp.n_ctx = 32, cp.n_batch = 4;
    nm_ctx *c = NULL;
    NM_CHECK(nm_ctx_create(m, &cp, &c, NULL, 0) == NM_OK);
    if (c) {
        NM_CHECK(nm_decode(c, text0, 3, 0, false) == NM_OK);
        NM_CHECK(nm_decode_embd_grid(c, X + 3 * D, 4, 2, 3, 0, false) == NM_OK);
        const int32_t bad = vocab; // a refused call over the image leaves it (and its shift) in place
        NM_CHECK(nm_decode(c, &bad, 1, 3, false) == NM_ERR_RANGE);
        NM_CHECK(nm_decode(c, text1, 2, 11, false) == NM_OK);
        const float *got = nm_get_logits(c, -1);
        double maxd = 0, lo = 1e30, hi = -1e30;
        int tw = 0, tg = 0;
        for (int v = 0; got && v < vocab; v++) {
            maxd = fmax(maxd, fabs((double)got[v] - want[v]));
            lo = fmin(lo, want[v]), hi = fmax(hi, want[v]);
            if (want[v] > want[tw]) tw = v;
            if (got[v] > got[tg]) tg = v;
        }
        fprintf(stderr, "  qwen2vl: max |logit - reference| %.2e of a range %.2f; top-1 %d / %d\n", maxd, hi - lo, tg, tw);
        NM_CHECK(got && tw == tg && maxd <= 5e-4 * (hi - lo));
        // text over the image's positions again: as a context that never saw it
        nm_ctx *fresh = NULL;
        NM_CHECK(nm_ctx_create(m, &cp, &fresh, NULL, 0) == NM_OK);
        const int32_t again[8] = {5, 6, 7, 8, 9, 10, 11, 12}; // over the image's rows 3..10, then past them
        NM_CHECK(nm_decode(c, again, 4, 3, false) == NM_OK && nm_decode(c, again + 4, 4, 7, false) == NM_OK &&
                 nm_decode(c, text1, 2, 11, false) == NM_OK);
        NM_CHECK(fresh && nm_decode(fresh, text0, 3, 0, false) == NM_OK && nm_decode(fresh, again, 4, 3, false) == NM_OK &&
                 nm_decode(fresh, again + 4, 4, 7, false) == NM_OK && nm_decode(fresh, text1, 2, 11, false) == NM_OK);
        const float *la = nm_get_logits(c, -1), *lb = fresh ? nm_get_logits(fresh, -1) : NULL;
        NM_CHECK(la && lb && !memcmp(la, lb, sizeof(float) * (size_t)vocab));
        nm_ctx_free(fresh);
        // bad calls: an empty grid, a grid past the context
        NM_CHECK(nm_decode_embd_grid(c, X, 0, 2, 0, 0, false) == NM_ERR_INVALID_ARG);
        NM_CHECK(nm_decode_embd_grid(c, X, 4, 2, 30, 0, false) == NM_ERR_RANGE);
        nm_ctx_free(c);
    }
    free(want);
    nm_gguf_close(g);
    nm_model_free(m);
    unlink(path);
}

// ---- qwen2vl: an image in the prompt, logits against llama.cpp ----------------------------------
//
// tests/vlm/test_vlm.py's random qwen2vl LLM and qwen2vl_merger mmproj (the same seeds and sizes as
// its nm-genmodel / nm-genmmproj commands) on three images of three aspect ratios
// (tests/data/qwen2vl/img*.png: 11 x 7, 4 x 11 and 8 x 8 image tokens). llama.cpp's mtmd tokenized
// "<|im_start|>user\n<__media__>What is it?<|im_end|>\n<|im_start|>assistant\n", evaluated it
// and decoded 24 tokens greedily, writing at each step its top 20 log-probabilities (the full
// vocabulary's log-softmax of its logits): tests/data/qwen2vl/logits-*.txt, README there. Here the
// same text tokens, our encoder's embeddings of the image (decode, preprocess, nm_clip_encode_size)
// through nm_decode_embd_grid, and llama.cpp's tokens fed back step by step: each step's top-1 must
// be llama.cpp's and each of its 20 log-probabilities within QWEN_DLOGP of ours. Measured (AMD EPYC
// Zen 4, 2026-12-05): 24 / 24 top-1 on each image, max |dlogp| 1.08e-2, 1.66e-2, 1.25e-2 (at
// log-probabilities of -8 to -16; the top token's within 3.1e-3). The encoders differ by ~5e-4
// relative (llama.cpp's f16 im2col and GELU tables: test_vision_encoder); with llama.cpp's own
// embeddings of the first image fed in, the decoders alone differ by 4.8e-3 there.
#define QWEN_DLOGP 5e-2

typedef struct qwen_oracle {
    int32_t text[2][64], n_text[2];
    int32_t nx, ny, n_step;
    int32_t gen[32], top_id[32][20];
    double top_lp[32][20];
} qwen_oracle;

// An oracle file: n_text `text` lines (and an `image` line where image), then 24 `step` lines.
static bool read_oracle(const char *path, qwen_oracle *o, int n_text, bool image) {
    memset(o, 0, sizeof *o);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    char word[16];
    int nt = 0;
    bool ok = true;
    while (ok && fscanf(f, "%15s", word) == 1) {
        if (!strcmp(word, "text") && nt < n_text) {
            ok = fscanf(f, "%d", &o->n_text[nt]) == 1 && o->n_text[nt] > 0 && o->n_text[nt] <= 64;
            for (int32_t i = 0; ok && i < o->n_text[nt]; i++) ok = fscanf(f, "%d", &o->text[nt][i]) == 1;
            nt++;
        } else if (!strcmp(word, "image") && image) {
            ok = fscanf(f, "%d %d", &o->nx, &o->ny) == 2;
        } else if (!strcmp(word, "step") && o->n_step < 32) {
            int32_t k = o->n_step++, idx;
            ok = fscanf(f, "%d %d", &idx, &o->gen[k]) == 2 && idx == k;
            for (int j = 0; ok && j < 20; j++) ok = fscanf(f, "%d:%lf", &o->top_id[k][j], &o->top_lp[k][j]) == 2;
        } else ok = false;
    }
    fclose(f);
    return ok && nt == n_text && (!image || (o->nx > 0 && o->ny > 0)) && o->n_step == 24;
}

// The image's embeddings by our encoder (nx x ny of n_out_embd), or NULL.
static float *qwen_encode(const char *mmproj, const char *png, int32_t *nx, int32_t *ny) {
    FILE *f = fopen(png, "rb");
    if (!f) return NULL;
    static uint8_t buf[1 << 18];
    const size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    char err[256];
    nm_image img = {0};
    nm_clip *clip = NULL;
    nm_image_batch b = {0};
    float *e = NULL;
    if (nm_image_decode(buf, n, &img, err, sizeof err) != NM_OK || nm_clip_load(mmproj, "cpu", 2, &clip, err, sizeof err) != NM_OK) {
        fprintf(stderr, "  %s: %s\n", png, err);
        goto out;
    }
    const nm_clip_info *in = nm_clip_get_info(clip);
    const nm_image_params ip = nm_image_params_from_clip(in);
    if (nm_image_preprocess(&img, &ip, &b, err, sizeof err) != NM_OK) goto out;
    const int32_t rows = nm_clip_n_out(clip, b.width, b.height), cell = in->patch_size * in->n_merge;
    *nx = b.width / cell, *ny = b.height / cell;
    if (rows != *nx * *ny || !(e = malloc(sizeof(float) * (size_t)rows * (size_t)in->n_out_embd))) goto out;
    if (nm_clip_encode_size(clip, b.data, b.width, b.height, e) != NM_OK) free(e), e = NULL;
out:
    nm_image_batch_free(&b);
    nm_image_free(&img);
    nm_clip_free(clip);
    return e;
}

// Steps through want's 24 tokens on c (its prompt decoded at 0 first): the top-1s equal to llama.cpp's,
// *maxd the largest |dlogp| over its top 20s.
// A step's top-1 counts as llama.cpp's where it is, or where llama.cpp puts ours within STEP_TIE of its own
// (a tie finer than the log-probabilities agree: lfm2 shape a's step 15 is 0.0018 apart there).
#define STEP_TIE 0.02
static int steps_against(nm_ctx *c, int32_t nv, const qwen_oracle *want, int32_t pos, double *maxd) {
    int top1 = 0;
    *maxd = 0;
    for (int32_t s = 0; s < want->n_step; s++) {
        const float *lg = nm_get_logits(c, -1);
        if (!lg) return -1;
        double mx = -INFINITY, z = 0;
        int32_t arg = 0;
        for (int32_t v = 0; v < nv; v++)
            if (lg[v] > mx) mx = lg[v], arg = v;
        for (int32_t v = 0; v < nv; v++) z += exp((double)lg[v] - mx);
        bool same = arg == want->gen[s];
        for (int j = 1; j < 20 && !same; j++)
            if (want->top_id[s][j] == arg && want->top_lp[s][0] - want->top_lp[s][j] <= STEP_TIE) {
                same = true;
                fprintf(stderr, "  step %d: a tie (llama.cpp's top two %.4f apart)\n", s,
                        want->top_lp[s][0] - want->top_lp[s][j]);
            }
        top1 += same;
        for (int j = 0; j < 20; j++) {
            const double d = fabs((double)lg[want->top_id[s][j]] - mx - log(z) - want->top_lp[s][j]);
            if (d > *maxd) *maxd = d;
        }
        if (nm_decode(c, &want->gen[s], 1, pos++, false) != NM_OK) return -1; // llama.cpp's token, as it went on
    }
    return top1;
}

NM_TEST(qwen2vl_image_prompt_logits_match_llama_cpp) {
    char tok[1024];
    NM_NEED_MODEL(NM_SMOLLM2, tok);
    char llm[256], mm[256], err[256];
    snprintf(llm, sizeof llm, "/tmp/nm-test-qwen2vl-llm-%d.gguf", (int)getpid());
    snprintf(mm, sizeof mm, "/tmp/nm-test-qwen2vl-mm-%d.gguf", (int)getpid());
    gen_opts o = nm_genmodel_defaults(); // nm-genmodel --arch qwen2vl --type f32 --layers 2 --embd 256 ...
    o.arch = "qwen2vl", o.tok_from = tok, o.out = llm, o.type = NM_TYPE_F32;
    o.layers = 2, o.embd = 256, o.heads = 4, o.kv_heads = 2, o.ff = 512, o.seed = 3;
    NM_CHECK(nm_genmodel_write(&o) == 0);
    nm_genmmproj_params p = nm_genmmproj_default_params("qwen2vl_merger"); // nm-genmmproj --proj qwen2vl_merger ...
    p.n_out_embd = 256, p.n_embd = 128, p.n_ff = 256, p.n_head = 2, p.n_layer = 2, p.image_size = 56, p.seed = 4;
    NM_CHECK(nm_genmmproj_write(mm, &p, err, sizeof err) == NM_OK);
    nm_model *m = NULL;
    NM_CHECK(nm_model_load(llm, NULL, &m, err, sizeof err) == NM_OK);
    static const char *imgs[] = {"img320x200", "img120x300", "img224x224"};
    for (int k = 0; k < 3 && m; k++) {
        char path[256];
        static qwen_oracle want;
        snprintf(path, sizeof path, "tests/data/qwen2vl/logits-%s.txt", imgs[k]);
        NM_CHECK(read_oracle(path, &want, 2, true));
        snprintf(path, sizeof path, "tests/data/qwen2vl/%s.png", imgs[k]);
        int32_t nx = 0, ny = 0;
        float *e = qwen_encode(mm, path, &nx, &ny);
        NM_CHECK(e != NULL && nx == want.nx && ny == want.ny);
        nm_ctx_params cp = nm_ctx_default_params();
        cp.n_ctx = 256, cp.n_threads = 2;
        nm_ctx *c = NULL;
        NM_CHECK(nm_ctx_create(m, &cp, &c, err, sizeof err) == NM_OK);
        if (!e || !c || nx != want.nx || ny != want.ny) {
            free(e);
            nm_ctx_free(c);
            continue;
        }
        int32_t pos = 0;
        NM_CHECK(nm_decode(c, want.text[0], want.n_text[0], pos, false) == NM_OK);
        pos += want.n_text[0];
        NM_CHECK(nm_decode_embd_grid(c, e, nx, ny, pos, 0, false) == NM_OK);
        pos += nx * ny;
        NM_CHECK(nm_decode(c, want.text[1], want.n_text[1], pos, false) == NM_OK);
        pos += want.n_text[1];
        double maxd = 0;
        const int top1 = steps_against(c, nm_model_n_vocab(m), &want, pos, &maxd);
        fprintf(stderr, "  %s (%d x %d image tokens): top-1 %d / %d as llama.cpp, max |dlogp| %.2e over its top 20\n",
                imgs[k], nx, ny, top1, want.n_step, maxd);
        NM_CHECK(top1 == want.n_step && maxd <= QWEN_DLOGP);
        free(e);
        nm_ctx_free(c);
    }
    nm_model_free(m);
    unlink(llm);
    unlink(mm);
}

// ---- the 2026 archs against llama.cpp: prompt and 24 greedy steps ---------------------------------
//
// Random-weight files of each arch in two shapes (the generator calls below; nm-genmodel's flags in
// tests/data/archs/README.md): llama.cpp tokenized ARCH_PROMPT (special tokens parsed), evaluated it and
// decoded 24 tokens greedily, writing at each step the 20 largest log-probabilities (the whole
// vocabulary's log-softmax, in double): tests/data/archs/logits-ARCH-SHAPE.txt. Here the same tokens and
// llama.cpp's choices fed back step by step: each step's top-1 must be llama.cpp's and each of its 20
// log-probabilities within ARCH_DLOGP of ours (measured: README).
#define ARCH_PROMPT "The quick brown fox jumps over the lazy dog. Once upon a time, in a small town by the sea,"
#define ARCH_DLOGP 5e-2

typedef struct arch_case {
    const char *arch, *shape;
    uint32_t type;
    int layers, embd, heads, kv_heads, ff, head_dim;
    uint64_t seed;
    const char *attn_layers; // lfm2 (NULL: every third)
    int conv_l;              // lfm2 (0: 3)
} arch_case;

static const arch_case arch_cases[] = {
    {"qwen3", "a", NM_TYPE_F32, 4, 256, 4, 2, 512, 96, 11, NULL, 0},  {"qwen3", "b", NM_TYPE_F32, 5, 192, 6, 2, 384, 0, 12, NULL, 0},
    {"smollm3", "a", NM_TYPE_F32, 4, 256, 4, 2, 512, 0, 11, NULL, 0}, {"smollm3", "b", NM_TYPE_F32, 5, 192, 6, 2, 384, 0, 12, NULL, 0},
    {"lfm2", "a", NM_TYPE_F32, 6, 256, 4, 2, 512, 0, 11, NULL, 0},
    {"lfm2", "b", NM_TYPE_F32, 5, 192, 6, 2, 384, 0, 12, "0,3", 4},
};


NM_TEST(new_archs_logits_match_llama_cpp) {
    char tok[1024];
    NM_NEED_MODEL(NM_SMOLLM2, tok);
    bool no_device = false;
    for (size_t kk = 0; kk < 2 * (sizeof arch_cases / sizeof arch_cases[0]); kk++) {
        const size_t k = kk % (sizeof arch_cases / sizeof arch_cases[0]);
        const char *dev = kk == k ? "cpu" : "opencl"; // (each case on the CPU, then on OpenCL with every layer)
        if (no_device && kk != k) continue;
        const arch_case *a = &arch_cases[k];
        char path[256], err[256];
        static qwen_oracle want;
        snprintf(path, sizeof path, "tests/data/archs/logits-%s-%s.txt", a->arch, a->shape);
        NM_CHECK(read_oracle(path, &want, 1, false));
        snprintf(path, sizeof path, "/tmp/nm-test-%s-%s-%d.gguf", a->arch, a->shape, (int)getpid());
        gen_opts o = nm_genmodel_defaults();
        o.arch = a->arch, o.tok_from = tok, o.out = path, o.type = a->type, o.layers = a->layers, o.embd = a->embd;
        o.heads = a->heads, o.kv_heads = a->kv_heads, o.ff = a->ff, o.head_dim = a->head_dim, o.seed = a->seed;
        o.attn_layers = a->attn_layers, o.conv_l = a->conv_l;
        NM_CHECK(nm_genmodel_write(&o) == 0);
        nm_model *m = NULL;
        nm_ctx *c = NULL;
        NM_CHECK(nm_model_load(path, NULL, &m, err, sizeof err) == NM_OK);
        nm_ctx_params cp = nm_ctx_default_params();
        cp.n_ctx = 256, cp.n_threads = 2, cp.device = dev, cp.n_gpu_layers = a->layers;
        const nm_status cst = m ? nm_ctx_create(m, &cp, &c, err, sizeof err) : NM_ERR_FORMAT;
        if (cst == NM_ERR_UNSUPPORTED && kk != k) { // (no OpenCL device here)
            printf("  skip: OpenCL: %s\n", err);
            no_device = true;
            nm_model_free(m);
            unlink(path);
            continue;
        }
        NM_CHECK(cst == NM_OK && !strcmp(nm_ctx_device(c), dev));
        // our tokenizer gives llama.cpp's ids for the prompt
        int32_t ids[128];
        const int32_t n = m ? nm_tokenize(m, ARCH_PROMPT, strlen(ARCH_PROMPT), ids, 128, true, true) : 0;
        NM_CHECK(n == want.n_text[0] && !memcmp(ids, want.text[0], sizeof(int32_t) * (size_t)(n > 0 ? n : 0)));
        double maxd = 0;
        int top1 = -1;
        if (c && nm_decode(c, want.text[0], want.n_text[0], 0, false) == NM_OK)
            top1 = steps_against(c, nm_model_n_vocab(m), &want, want.n_text[0], &maxd);
        fprintf(stderr, "  %s %s on %s: top-1 %d / %d as llama.cpp, max |dlogp| %.2e over its top 20\n", a->arch,
                a->shape, dev, top1, want.n_step, maxd);
        NM_CHECK(top1 == want.n_step && maxd <= ARCH_DLOGP);
        nm_ctx_free(c);
        nm_model_free(m);
        unlink(path);
    }
}

NM_TEST(bad_models_are_clear_errors) {
    char tok[1024];
    NM_NEED_MODEL(NM_SMOLLM2, tok);
    char path[256];
    snprintf(path, sizeof path, "/tmp/nm-test-bad-%d.gguf", (int)getpid());
    nm_model *m = NULL;
    char err[256] = "";
    NM_CHECK(nm_model_load("/nonexistent/model.gguf", NULL, &m, err, sizeof err) == NM_ERR_IO && m == NULL);
    NM_CHECK(err[0] != '\0');
    NM_CHECK(write_meta(path, "rwkv7", 4, 2, 0));
    expect_load_error(path, NM_ERR_UNSUPPORTED, "architecture 'rwkv7' is not supported", nmtest_failed);
    NM_CHECK(write_meta(path, "llama", 3, 2, 0));
    expect_load_error(path, NM_ERR_FORMAT, "bad dimensions", nmtest_failed);
    NM_CHECK(write_meta(path, "llama", 4, 2, 7));
    expect_load_error(path, NM_ERR_UNSUPPORTED, "head dimension 7", nmtest_failed);
    NM_CHECK(write_meta(path, "llama", 4, 2, 0)); // valid hyperparameters, no tokenizer, no tensors
    expect_load_error(path, NM_ERR_FORMAT, "tokenizer", nmtest_failed);
    // qwen3 and smollm3 need their norms' epsilon (llama.cpp reads it as a required key)
    NM_CHECK(write_meta(path, "qwen3", 4, 2, 0));
    expect_load_error(path, NM_ERR_FORMAT, "missing metadata key 'qwen3.attention.layer_norm_rms_epsilon'", nmtest_failed);
    NM_CHECK(write_meta(path, "smollm3", 4, 2, 0));
    expect_load_error(path, NM_ERR_FORMAT, "missing metadata key 'smollm3.attention.layer_norm_rms_epsilon'", nmtest_failed);
    // lfm2: which layers attend comes from head_count_kv's array; the taps and epsilon are required
    NM_CHECK(write_meta_lfm2(path, false, 3));
    expect_load_error(path, NM_ERR_FORMAT, "'lfm2.attention.head_count_kv' must be an array of 2 counts", nmtest_failed);
    NM_CHECK(write_meta_lfm2(path, true, 0));
    expect_load_error(path, NM_ERR_FORMAT, "missing metadata key 'lfm2.shortconv.l_cache'", nmtest_failed);
    NM_CHECK(write_meta_lfm2(path, true, 1));
    expect_load_error(path, NM_ERR_FORMAT, "lfm2.shortconv.l_cache 1 must be 2..64", nmtest_failed);
    NM_CHECK(write_meta_lfm2(path, true, 3));
    expect_load_error(path, NM_ERR_FORMAT, "missing metadata key 'lfm2.attention.layer_norm_rms_epsilon'", nmtest_failed);
    // a truncated real model
    NM_CHECK(make_model("llama", NM_TYPE_Q8_0, path, 8));
    FILE *f = fopen(path, "r+b");
    NM_CHECK(f != NULL);
    if (f) {
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fclose(f);
        NM_CHECK(truncate(path, n - 1000) == 0);
        nm_status st = nm_model_load(path, NULL, &m, err, sizeof err);
        fprintf(stderr, "  truncated: %s\n", err);
        NM_CHECK(st == NM_ERR_FORMAT && m == NULL && strstr(err, "past end") != NULL);
    }
    unlink(path);
}

NM_TEST_MAIN()
