// Whisper forward pass (see whisper.h) as nm_ops on the CPU backend.
//
// Encoder, as whisper.cpp computes it: conv1d(k 3, pad 1) + bias, GELU,
// conv1d(k 3, stride 2, pad 1) + bias, GELU, + sinusoidal positions, pre-norm
// transformer layers (the key projection has no bias), final layer norm. The
// convolutions are im2col + the matmul kernels: a convolution's output channel
// is a row of (in_channel, tap) weights, as the [3, C_in, C_out] tensor lies.
// GELU is the tanh form whisper.cpp uses (ggml_gelu), not PyTorch's erf form.
// Every matmul, GELU and attention op carries NM_OPF_GGML_F16: the roundings
// of ggml's CPU backend (f16 matmul inputs, the f16 GELU table, f16 Q and
// softmax in attention), so that logits track whisper.cpp's (run without
// flash attention, whose f16 accumulation of V we do not copy) closely enough
// for identical transcripts.
//
// Decoder: token embedding + learned positions, layers of causal
// self-attention (f16 cache per sequence), cross-attention over the window's
// keys/values (f16, computed once per window), MLP; final layer norm; logits
// against the token embedding (tied head). Cross-attention reuses the causal
// attention op with every query at the last audio position, so it sees all
// n_audio_ctx keys.
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "bricks/stt/whisper.h"
#include "core/clock.h"
#include "quant/quant.h"
#include "core/fail.h"

struct nm_whisper {
    const nm_whisper_model *m;
    nm_backend *be;
    int32_t n_seq, n_batch, d, n_ff, n_vocab;
    // encoder activations
    float *col1;  // (2 n_audio_ctx, 3 n_mels)
    float *h1;    // (2 n_audio_ctx, d)
    float *col2;  // (n_audio_ctx, 3 d)
    float *ex, *ecur, *eq, *ek, *ev, *eattn, *eo; // (n_audio_ctx, d)
    float *eff;   // (n_audio_ctx, n_ff)
    // caches (f16)
    nm_kv_layer *cross;    // (n_text_layer)
    uint16_t *cross_mem;
    // Self-attention caches: per layer one pool of n_seq * n_text_ctx rows.
    // Sequence s keeps position p in row rowmap[s * n_text_ctx + p]; sequences
    // that share a prefix (beams forked from one hypothesis) point at the same
    // rows, each reference counted in rowref. Every map entry holds one
    // reference, so the references always number the pool's rows and a row
    // is free whenever one is shared: a write to a shared row takes a free one
    // (copy on write, and nothing is copied, the whole row is written).
    nm_kv_layer *self;     // (n_text_layer)
    uint16_t *self_mem;
    int32_t *rowmap;       // (n_seq, n_text_ctx)
    int32_t *rowref;       // (n_seq * n_text_ctx)
    int32_t *freerows;     // stack of rows no entry holds
    int32_t n_free;
    int32_t *cross_ids;    // (n_batch): all n_audio_ctx - 1
    int32_t *cross_pos;    // (n_audio_ctx): 0, 1, ... (where the cross K/V rows go)
    // decoder activations, (n_batch, width)
    float *x, *cur, *q, *k, *v, *attn, *o, *ff;
    float *logits;         // (n_batch, n_vocab)
    int32_t *pos;          // (n_batch)
    int32_t *seqs;         // (n_batch): the sequence of each token of a decode call
    uint32_t mm_flags;     // NM_OPF_* added to the decoder's matmuls (NM_OPF_ROWWISE for nm_whisper_decode_seqs)
    int32_t n_out, out_first;
    bool encoded;
    nm_whisper_timings tm;
    char err[256];
};


static nm_status wfail(nm_whisper *w, nm_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    nm_vfail(st, w->err, sizeof w->err, NULL, fmt, ap);
    va_end(ap);
    return st;
}

void nm_whisper_free(nm_whisper *w) {
    if (!w) return;
    nm_backend_free(w->be);
    float *bufs[] = {w->col1, w->h1, w->col2, w->ex, w->ecur, w->eq, w->ek, w->ev, w->eattn, w->eo, w->eff,
                     w->x, w->cur, w->q, w->k, w->v, w->attn, w->o, w->ff, w->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(w->cross);
    free(w->cross_mem);
    free(w->self);
    free(w->self_mem);
    free(w->rowmap);
    free(w->rowref);
    free(w->freerows);
    free(w->cross_ids);
    free(w->cross_pos);
    free(w->pos);
    free(w->seqs);
    free(w);
}

const nm_whisper_model *nm_whisper_get_model(const nm_whisper *w) { return w->m; }
int32_t nm_whisper_n_seq(const nm_whisper *w) { return w->n_seq; }
const char *nm_whisper_last_error(const nm_whisper *w) { return w ? w->err : ""; }
nm_whisper_timings nm_whisper_get_timings(const nm_whisper *w) { return w->tm; }
const float *nm_whisper_encoder_output(const nm_whisper *w) { return w->encoded ? w->ex : NULL; }

nm_status nm_whisper_create(const nm_whisper_model *m, int32_t n_threads, int32_t n_seq, int32_t n_batch,
                            nm_whisper **out, char *err, size_t err_size) {
    if (!m || !out) return NM_ERR_INVALID_ARG;
    *out = NULL;
    const nm_whisper_hparams *hp = &m->hp;
    if (n_seq <= 0) n_seq = 1;
    if (n_batch <= 0 || n_batch > hp->n_text_ctx) n_batch = hp->n_text_ctx;
    if (n_seq > 64) {
        if (err) snprintf(err, err_size, "%d decoder sequences (at most 64)", n_seq);
        return NM_ERR_RANGE;
    }
    const int64_t d = hp->n_audio_state, A = hp->n_audio_ctx, M = hp->n_mels, L = hp->n_text_layer;
    if (hp->n_text_state != d || d % hp->n_audio_head || d % hp->n_text_head) {
        if (err) snprintf(err, err_size, "whisper: unsupported shapes (audio state %d, text state %d)", (int)d,
                          hp->n_text_state);
        return NM_ERR_UNSUPPORTED;
    }
    nm_whisper *w = calloc(1, sizeof *w);
    if (!w) return NM_ERR_NOMEM;
    w->m = m;
    w->n_seq = n_seq;
    w->n_batch = n_batch;
    w->d = (int32_t)d;
    w->n_ff = (int32_t)m->enc[0].mlp.fc1_w.ne[1];
    w->n_vocab = hp->n_vocab;
    const int64_t ff = w->n_ff > (int32_t)m->dec[0].mlp.fc1_w.ne[1] ? w->n_ff : m->dec[0].mlp.fc1_w.ne[1];
    w->n_ff = (int32_t)ff;
    int64_t max_row = 3 * M > 3 * d ? 3 * M : 3 * d;
    if (ff > max_row) max_row = ff;
    const int64_t max_tok = 2 * A > n_batch ? 2 * A : n_batch;
    const nm_backend_params bp = {.n_threads = n_threads, .max_row = max_row, .max_tokens = max_tok,
                                  .attn_max_seq = A, .attn_head_dim = d / hp->n_audio_head};
    char berr[256] = "";
    if (nm_backend_create(NULL, &bp, &w->be, berr, sizeof berr) != NM_OK) {
        nm_whisper_free(w);
        if (err) snprintf(err, err_size, "whisper: %s", berr);
        return NM_ERR_NOMEM;
    }
    const size_t fs = sizeof(float);
    w->col1 = malloc(fs * (size_t)(2 * A * 3 * M));
    w->h1 = malloc(fs * (size_t)(2 * A * d));
    w->col2 = malloc(fs * (size_t)(A * 3 * d));
    float **enc[] = {&w->ex, &w->ecur, &w->eq, &w->ek, &w->ev, &w->eattn, &w->eo};
    bool ok = w->be && w->col1 && w->h1 && w->col2;
    for (size_t i = 0; i < sizeof enc / sizeof enc[0]; i++) ok = ok && (*enc[i] = malloc(fs * (size_t)(A * d)));
    ok = ok && (w->eff = malloc(fs * (size_t)(A * ff)));
    float **dec[] = {&w->x, &w->cur, &w->q, &w->k, &w->v, &w->attn, &w->o};
    for (size_t i = 0; i < sizeof dec / sizeof dec[0]; i++) ok = ok && (*dec[i] = malloc(fs * (size_t)(n_batch * d)));
    ok = ok && (w->ff = malloc(fs * (size_t)(n_batch * ff)));
    ok = ok && (w->logits = calloc((size_t)n_batch * (size_t)w->n_vocab, fs)); // pages touched as used
    ok = ok && (w->pos = calloc((size_t)n_batch, sizeof(int32_t))) && (w->cross_ids = malloc(sizeof(int32_t) * (size_t)n_batch)) &&
         (w->cross_pos = malloc(sizeof(int32_t) * (size_t)A)) &&
         (w->seqs = calloc((size_t)n_batch, sizeof(int32_t)));
    ok = ok && (w->cross = calloc((size_t)L, sizeof *w->cross)) &&
         (w->cross_mem = calloc((size_t)(L * 2 * A * d), sizeof(uint16_t)));
    const size_t n_rows = (size_t)n_seq * (size_t)hp->n_text_ctx;
    ok = ok && (w->self = calloc((size_t)L, sizeof *w->self)) &&
         (w->self_mem = calloc(n_rows * (size_t)(L * 2 * d), sizeof(uint16_t)));
    ok = ok && (w->rowmap = malloc(sizeof(int32_t) * n_rows)) && (w->rowref = malloc(sizeof(int32_t) * n_rows)) &&
         (w->freerows = malloc(sizeof(int32_t) * n_rows));
    if (!ok) {
        nm_whisper_free(w);
        if (err) snprintf(err, err_size, "out of memory for the Whisper runtime");
        return NM_ERR_NOMEM;
    }
    for (int32_t i = 0; i < n_batch; i++) w->cross_ids[i] = (int32_t)A - 1;
    for (int32_t i = 0; i < A; i++) w->cross_pos[i] = i;
    for (int64_t il = 0; il < L; il++) {
        w->cross[il].k = nm_tensor_at(w->cross_mem + (size_t)il * 2 * A * d, NM_TYPE_F16, d, A);
        w->cross[il].v = nm_tensor_at(w->cross_mem + (size_t)(il * 2 + 1) * A * d, NM_TYPE_F16, d, A);
    }
    const size_t per = n_rows * (size_t)d;
    for (int64_t il = 0; il < L; il++) {
        w->self[il].k = nm_tensor_at(w->self_mem + (size_t)il * 2 * per, NM_TYPE_F16, d, (int64_t)n_rows);
        w->self[il].v = nm_tensor_at(w->self_mem + ((size_t)il * 2 + 1) * per, NM_TYPE_F16, d, (int64_t)n_rows);
    }
    for (size_t r = 0; r < n_rows; r++) w->rowmap[r] = (int32_t)r, w->rowref[r] = 1; // sequence s: rows s n_ctx + p
    w->n_free = 0;
    *out = w;
    return NM_OK;
}

// ---- op helpers ------------------------------------------------------------------------------

static inline nm_tensor act(float *data, int64_t width, int64_t T) {
    return nm_tensor_at(data, NM_TYPE_F32, width, T); // host memory: Whisper runs where the host computes
}

static nm_status run(nm_whisper *w, const nm_op *ops, int n) {
    nm_status st = nm_backend_run(w->be, ops, n);
    if (st != NM_OK) wfail(w, st, "whisper: %s", nm_backend_last_error(w->be));
    return st;
}

static const nm_tensor *opt(const nm_tensor *t) { return t && nm_tensor_is_set(t) ? t : NULL; }

static nm_status norm(nm_whisper *w, float *dst, const float *src, const nm_tensor *g, const nm_tensor *b, int64_t T) {
    nm_tensor s = act((float *)src, w->d, T), y = act(dst, w->d, T);
    nm_op op = {.kind = NM_OP_NORM, .src0 = &s, .src1 = opt(g), .src2 = opt(b), .dst = &y, .f0 = 1e-5f};
    return run(w, &op, 1);
}

static nm_status matmul(nm_whisper *w, float *dst, const nm_tensor *wt, const float *src, const nm_tensor *bias,
                        int64_t T) {
    nm_tensor s = act((float *)src, wt->ne[0], T), y = act(dst, wt->ne[1], T);
    nm_op op = {.kind = NM_OP_MATMUL, .src0 = wt, .src1 = &s, .src2 = opt(bias), .dst = &y,
                .flags = NM_OPF_GGML_F16 | w->mm_flags};
    return run(w, &op, 1);
}

static nm_status add(nm_whisper *w, float *dst, const float *a, const float *b, int64_t width, int64_t T) {
    nm_tensor ta = act((float *)a, width, T), tb = act((float *)b, width, T), y = act(dst, width, T);
    nm_op op = {.kind = NM_OP_ADD, .src0 = &ta, .src1 = &tb, .dst = &y};
    return run(w, &op, 1);
}

static nm_status gelu(nm_whisper *w, float *x, int64_t width, int64_t T) {
    nm_tensor t = act(x, width, T);
    nm_op op = {.kind = NM_OP_ACT, .src0 = &t, .dst = &t, .i0 = NM_ACT_GELU_TANH, .flags = NM_OPF_GGML_F16};
    return run(w, &op, 1);
}

// Q, K and V of the same normed input as one job (K has no bias in Whisper).
static nm_status qkv(nm_whisper *w, const nm_whisper_attn *a, const float *src, float *q, float *k, float *v,
                     int64_t T, bool want_q, bool want_kv) {
    nm_tensor s = act((float *)src, w->d, T), tq = act(q, w->d, T), tk = act(k, w->d, T), tv = act(v, w->d, T);
    nm_op ops[3];
    int n = 0;
    const uint32_t f = NM_OPF_GGML_F16 | w->mm_flags;
    if (want_q)
        ops[n++] = (nm_op){.kind = NM_OP_MATMUL, .src0 = &a->q_w, .src1 = &s, .src2 = opt(&a->q_b), .dst = &tq, .flags = f};
    if (want_kv) {
        ops[n++] = (nm_op){.kind = NM_OP_MATMUL, .src0 = &a->k_w, .src1 = &s, .src2 = opt(&a->k_b), .dst = &tk, .flags = f};
        ops[n++] = (nm_op){.kind = NM_OP_MATMUL, .src0 = &a->v_w, .src1 = &s, .src2 = opt(&a->v_b), .dst = &tv, .flags = f};
    }
    return run(w, ops, n);
}

static nm_status mlp(nm_whisper *w, const nm_whisper_mlp *p, float *x, float *cur, float *ff, float *o, int64_t T) {
    nm_status st;
    if ((st = norm(w, cur, x, &p->ln_w, &p->ln_b, T)) || (st = matmul(w, ff, &p->fc1_w, cur, &p->fc1_b, T)) ||
        (st = gelu(w, ff, p->fc1_w.ne[1], T)) || (st = matmul(w, o, &p->fc2_w, ff, &p->fc2_b, T)))
        return st;
    return add(w, x, x, o, w->d, T);
}

// ---- encoder --------------------------------------------------------------------------------

nm_status nm_whisper_encode(nm_whisper *w, const float *mel, int64_t n_len, int64_t offset) {
    if (!w || !mel || n_len <= 0 || offset < 0) return NM_ERR_INVALID_ARG;
    w->err[0] = '\0';
    w->encoded = false;
    const double t0 = nm_now_s();
    const nm_whisper_model *m = w->m;
    const nm_whisper_hparams *hp = &m->hp;
    const int64_t d = w->d, A = hp->n_audio_ctx, F = 2 * A, M = hp->n_mels;
    nm_status st;
    if (offset > INT32_MAX) return wfail(w, NM_ERR_RANGE, "whisper: offset %lld past the input", (long long)offset);
    // conv1: output frame t reads window frames t-1, t, t+1 (zero outside the window / past n_len)
    nm_tensor tmel = nm_tensor_at(mel, NM_TYPE_F32, n_len, M), tc1 = act(w->col1, 3 * M, F);
    nm_op cols1 = {.kind = NM_OP_IM2COL, .src0 = &tmel, .dst = &tc1, .i0 = 3, .i1 = 1, .i2 = 0, .i3 = (int32_t)offset};
    if ((st = run(w, &cols1, 1))) return st;
    nm_tensor c1 = m->conv1_w, c2 = m->conv2_w; // [3, C_in, d] viewed as [3 C_in, d]
    c1.ne[0] = 3 * M, c1.ne[1] = d, c1.ne[2] = 1;
    c2.ne[0] = 3 * d, c2.ne[1] = d, c2.ne[2] = 1;
    if ((st = matmul(w, w->h1, &c1, w->col1, &m->conv1_b, F)) || (st = gelu(w, w->h1, d, F))) return st;
    // conv2, stride 2: output t reads conv1 frames 2t-1, 2t, 2t+1
    nm_tensor th1 = act(w->h1, d, F), tc2 = act(w->col2, 3 * d, A);
    nm_op cols2 = {.kind = NM_OP_IM2COL, .src0 = &th1, .dst = &tc2, .i0 = 3, .i1 = 2, .i2 = 1, .i3 = 0};
    if ((st = run(w, &cols2, 1))) return st;
    if ((st = matmul(w, w->ex, &c2, w->col2, &m->conv2_b, A)) || (st = gelu(w, w->ex, d, A)) ||
        (st = add(w, w->ex, w->ex, nm_tensor_host(&m->e_pe), d, A)))
        return st;
    const int64_t hd = d / hp->n_audio_head;
    for (int il = 0; il < hp->n_audio_layer; il++) {
        const nm_whisper_enc_layer *ly = &m->enc[il];
        if ((st = norm(w, w->ecur, w->ex, &ly->attn.ln_w, &ly->attn.ln_b, A)) ||
            (st = qkv(w, &ly->attn, w->ecur, w->eq, w->ek, w->ev, A, true, true)))
            return st;
        nm_tensor tq = act(w->eq, d, A), tk = act(w->ek, d, A), tv = act(w->ev, d, A), ta = act(w->eattn, d, A);
        nm_op fa = {.kind = NM_OP_ATTENTION_FULL, .src0 = &tq, .src1 = &tk, .src2 = &tv, .dst = &ta,
                    .f0 = 1.0f / sqrtf((float)hd), .i0 = hp->n_audio_head, .i2 = (int32_t)hd, .flags = NM_OPF_GGML_F16};
        if ((st = run(w, &fa, 1)) || (st = matmul(w, w->eo, &ly->attn.o_w, w->eattn, &ly->attn.o_b, A)) ||
            (st = add(w, w->ex, w->ex, w->eo, d, A)) || (st = mlp(w, &ly->mlp, w->ex, w->ecur, w->eff, w->eo, A)))
            return st;
    }
    if ((st = norm(w, w->ex, w->ex, &m->e_ln_w, &m->e_ln_b, A))) return st;
    // cross-attention keys and values of every decoder layer, into their f16 caches
    for (int il = 0; il < hp->n_text_layer; il++) {
        const nm_whisper_attn *cr = &m->dec[il].cross;
        if ((st = qkv(w, cr, w->ex, NULL, w->ek, w->ev, A, false, true))) return st;
        nm_tensor tk = act(w->ek, d, A), tv = act(w->ev, d, A);
        nm_tensor tp = nm_tensor_at(w->cross_pos, NM_TYPE_I32, A, 1);
        nm_op store = {.kind = NM_OP_KV_STORE, .src0 = &tk, .src1 = &tv, .ids = &tp, .kv = &w->cross[il],
                       .n_ctx = (int32_t)A};
        if ((st = run(w, &store, 1))) return st;
    }
    w->encoded = true;
    w->tm.t_encode += nm_now_s() - t0;
    w->tm.n_encode++;
    return NM_OK;
}

// ---- decoder --------------------------------------------------------------------------------

// ---- cache rows --------------------------------------------------------------------------

static void row_release(nm_whisper *w, int32_t r) {
    if (--w->rowref[r] == 0) w->freerows[w->n_free++] = r;
}

// Sequence s's entry for position p points at a row only it holds (the row
// the decoder is about to write).
static void row_own(nm_whisper *w, int32_t s, int32_t p) {
    int32_t *e = &w->rowmap[(size_t)s * (size_t)w->m->hp.n_text_ctx + (size_t)p];
    if (w->rowref[*e] == 1) return;
    row_release(w, *e); // still held by another sequence, so a row is free (the pool's invariant)
    *e = w->freerows[--w->n_free];
    w->rowref[*e] = 1;
}

// The decoder over n tokens, token i in sequence w->seqs[i] at position
// w->pos[i] (both filled, checked): runs of consecutive tokens of one
// sequence store and attend to its cache together.
static nm_status decode_tokens(nm_whisper *w, const int32_t *tokens, int32_t n, bool all_logits) {
    const nm_whisper_model *m = w->m;
    const nm_whisper_hparams *hp = &m->hp;
    const double t0 = nm_now_s();
    const int64_t d = w->d, hd = d / hp->n_text_head, L = hp->n_text_layer;
    nm_status st;
    nm_tensor tx = act(w->x, d, n);
    nm_tensor tt = nm_tensor_at(tokens, NM_TYPE_I32, n, 1);
    nm_op emb = {.kind = NM_OP_GET_ROWS, .src0 = &m->d_te, .ids = &tt, .dst = &tx};
    if ((st = run(w, &emb, 1))) return st;
    for (int32_t a = 0, b; a < n; a = b) { // positional embeddings, a run of positions at a time
        for (b = a + 1; b < n && w->pos[b] == w->pos[b - 1] + 1; b++) {}
        if ((st = add(w, w->x + (size_t)a * d, w->x + (size_t)a * d, (const float *)nm_tensor_host(&m->d_pe) + (size_t)w->pos[a] * d,
                      d, b - a)))
            return st;
    }
    const float scale = 1.0f / sqrtf((float)hd);
    for (int32_t i = 0; i < n; i++) row_own(w, w->seqs[i], w->pos[i]);
    for (int64_t il = 0; il < L; il++) {
        const nm_whisper_dec_layer *ly = &m->dec[il];
        nm_tensor tq = act(w->q, d, n), ta = act(w->attn, d, n);
        // causal self-attention over each sequence's cache
        if ((st = norm(w, w->cur, w->x, &ly->attn.ln_w, &ly->attn.ln_b, n)) ||
            (st = qkv(w, &ly->attn, w->cur, w->q, w->k, w->v, n, true, true)))
            return st;
        for (int32_t a = 0, b; a < n; a = b) {
            for (b = a + 1; b < n && w->seqs[b] == w->seqs[a]; b++) {}
            const nm_kv_layer *kv = &w->self[il];
            const size_t off = (size_t)a * d;
            nm_tensor rq = act(w->q + off, d, b - a), rk = act(w->k + off, d, b - a), rv = act(w->v + off, d, b - a);
            nm_tensor ra = act(w->attn + off, d, b - a), rp = nm_tensor_at(w->pos + a, NM_TYPE_I32, b - a, 1);
            nm_tensor rows = nm_tensor_at(w->rowmap + (size_t)w->seqs[a] * (size_t)hp->n_text_ctx, NM_TYPE_I32,
                                          hp->n_text_ctx, 1);
            nm_op sa[2] = {
                {.kind = NM_OP_KV_STORE, .src0 = &rk, .src1 = &rv, .ids = &rp, .kv = kv, .n_ctx = hp->n_text_ctx,
                 .kv_rows = &rows},
                {.kind = NM_OP_ATTENTION, .src0 = &rq, .dst = &ra, .ids = &rp, .kv = kv, .f0 = scale,
                 .i0 = hp->n_text_head, .i1 = hp->n_text_head, .i2 = (int32_t)hd, .n_ctx = hp->n_text_ctx,
                 .flags = NM_OPF_GGML_F16, .kv_rows = &rows},
            };
            if ((st = run(w, sa, 2))) return st;
        }
        if ((st = matmul(w, w->o, &ly->attn.o_w, w->attn, &ly->attn.o_b, n)) || (st = add(w, w->x, w->x, w->o, d, n)))
            return st;
        // cross-attention: every query at the last audio position sees all of the window
        if ((st = norm(w, w->cur, w->x, &ly->cross.ln_w, &ly->cross.ln_b, n)) ||
            (st = matmul(w, w->q, &ly->cross.q_w, w->cur, &ly->cross.q_b, n)))
            return st;
        nm_tensor tc = nm_tensor_at(w->cross_ids, NM_TYPE_I32, n, 1);
        nm_op ca = {.kind = NM_OP_ATTENTION, .src0 = &tq, .dst = &ta, .ids = &tc, .kv = &w->cross[il],
                    .f0 = scale, .i0 = hp->n_text_head, .i1 = hp->n_text_head, .i2 = (int32_t)hd,
                    .n_ctx = hp->n_audio_ctx, .flags = NM_OPF_GGML_F16};
        if ((st = run(w, &ca, 1)) || (st = matmul(w, w->o, &ly->cross.o_w, w->attn, &ly->cross.o_b, n)) ||
            (st = add(w, w->x, w->x, w->o, d, n)) || (st = mlp(w, &ly->mlp, w->x, w->cur, w->ff, w->o, n)))
            return st;
    }
    const int32_t first = all_logits ? 0 : n - 1, n_out = n - first;
    if ((st = norm(w, w->cur, w->x + (size_t)first * d, &m->d_ln_w, &m->d_ln_b, n_out)) ||
        (st = matmul(w, w->logits, &m->d_te, w->cur, NULL, n_out)))
        return st;
    w->n_out = n_out;
    w->out_first = first;
    w->tm.t_decode += nm_now_s() - t0;
    w->tm.n_decode_calls++;
    w->tm.n_decode_tokens += n;
    return NM_OK;
}

static nm_status decode_check(nm_whisper *w, const int32_t *tokens, int32_t n) {
    if (!w->encoded) return wfail(w, NM_ERR_STATE, "whisper: decode before any window was encoded");
    if (n <= 0 || n > w->n_batch) return wfail(w, NM_ERR_RANGE, "whisper: %d tokens per call (1..%d)", n, w->n_batch);
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= w->n_vocab)
            return wfail(w, NM_ERR_RANGE, "whisper: token id %d out of range [0, %d)", tokens[i], w->n_vocab);
    return NM_OK;
}

nm_status nm_whisper_decode(nm_whisper *w, int32_t seq, const int32_t *tokens, int32_t n, int32_t pos,
                            bool all_logits) {
    if (!w || !tokens) return NM_ERR_INVALID_ARG;
    w->err[0] = '\0';
    w->n_out = 0;
    const nm_whisper_hparams *hp = &w->m->hp;
    nm_status st = decode_check(w, tokens, n);
    if (st != NM_OK) return st;
    if (seq < 0 || seq >= w->n_seq) return wfail(w, NM_ERR_RANGE, "whisper: sequence %d of %d", seq, w->n_seq);
    if (pos < 0 || pos > hp->n_text_ctx - n)
        return wfail(w, NM_ERR_RANGE, "whisper: positions %d..%d past the text context of %d", pos, pos + n - 1,
                     hp->n_text_ctx);
    for (int32_t i = 0; i < n; i++) w->pos[i] = pos + i, w->seqs[i] = seq;
    w->mm_flags = 0;
    return decode_tokens(w, tokens, n, all_logits);
}

nm_status nm_whisper_decode_seqs(nm_whisper *w, const int32_t *seqs, const int32_t *tokens, int32_t n, int32_t pos) {
    if (!w || !seqs || !tokens) return NM_ERR_INVALID_ARG;
    w->err[0] = '\0';
    w->n_out = 0;
    const nm_whisper_hparams *hp = &w->m->hp;
    nm_status st = decode_check(w, tokens, n);
    if (st != NM_OK) return st;
    if (pos < 0 || pos >= hp->n_text_ctx)
        return wfail(w, NM_ERR_RANGE, "whisper: position %d past the text context of %d", pos, hp->n_text_ctx);
    for (int32_t i = 0; i < n; i++) {
        if (seqs[i] < 0 || seqs[i] >= w->n_seq) return wfail(w, NM_ERR_RANGE, "whisper: sequence %d of %d", seqs[i], w->n_seq);
        for (int32_t j = 0; j < i; j++)
            if (seqs[j] == seqs[i]) return wfail(w, NM_ERR_INVALID_ARG, "whisper: sequence %d twice in one call", seqs[i]);
        w->pos[i] = pos, w->seqs[i] = seqs[i];
    }
    w->mm_flags = NM_OPF_ROWWISE; // each row as a one-token call computes it
    st = decode_tokens(w, tokens, n, true);
    w->mm_flags = 0;
    return st;
}

const float *nm_whisper_logits(const nm_whisper *w, int32_t i) {
    if (!w || w->n_out == 0) return NULL;
    if (i < 0) i = w->out_first + w->n_out - 1;
    if (i < w->out_first || i >= w->out_first + w->n_out) return NULL;
    return w->logits + (size_t)(i - w->out_first) * (size_t)w->n_vocab;
}

nm_status nm_whisper_seq_share(nm_whisper *w, int32_t dst, int32_t src, int32_t n_pos) {
    const nm_whisper_hparams *hp = &w->m->hp;
    if (dst < 0 || dst >= w->n_seq || src < 0 || src >= w->n_seq || n_pos < 0 || n_pos > hp->n_text_ctx)
        return wfail(w, NM_ERR_RANGE, "whisper: seq_share %d <- %d of %d positions", dst, src, n_pos);
    int32_t *a = w->rowmap + (size_t)src * (size_t)hp->n_text_ctx, *b = w->rowmap + (size_t)dst * (size_t)hp->n_text_ctx;
    for (int32_t p = 0; p < n_pos; p++) { // dst's entries take src's rows: references, not bytes
        if (b[p] == a[p]) continue;
        w->rowref[a[p]]++;
        row_release(w, b[p]);
        b[p] = a[p];
    }
    return NM_OK;
}
