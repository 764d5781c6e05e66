// Forward pass of the decoder, readable top to bottom. Each step is an nm_op
// handed to the context's backend; all buffers are sized at context creation,
// so a decode call allocates nothing.
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bricks/llm/llm.h"

struct nm_ctx {
    nm_model *m;
    nm_backend *be;
    int32_t n_ctx, n_batch;
    nm_kv_layer *kv;   // (n_layer)
    uint16_t *kv_mem;  // backing store of all layers' K and V, f16: (n_layer, 2, n_ctx, n_head_kv * hd)
    // activations, each (n_batch, width)
    float *x;          // residual stream (n_embd)
    float *cur;        // normed input (n_embd)
    float *q, *attn;   // (n_head * hd)
    float *k, *v;      // (n_head_kv * hd)
    float *o;          // (n_embd)
    float *g, *u;      // (n_ff)
    float *logits;     // (n_batch, n_vocab)
    int32_t *pos;      // (n_batch)
    int32_t n_out;     // logits rows kept by the last decode
    int32_t out_first; // batch index of logits row 0
    char err[256];
};

nm_ctx_params nm_ctx_default_params(void) {
    nm_ctx_params p = {.n_ctx = 0, .n_batch = 0, .n_threads = 0, .pin_threads = false};
    return p;
}

static void *zalloc(size_t n, size_t sz) {
    // calloc of large blocks maps zero pages lazily: KV and logits pages that
    // are never touched cost no resident memory.
    return calloc(n ? n : 1, sz);
}

nm_status nm_ctx_create(nm_model *m, const nm_ctx_params *params, nm_ctx **out, char *err, size_t err_size) {
    if (!m || !out) return NM_ERR_INVALID_ARG;
    *out = NULL;
    nm_ctx_params p = params ? *params : nm_ctx_default_params();
    const nm_hparams *hp = &m->hp;
    if (p.n_ctx <= 0) p.n_ctx = hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096;
    if (p.n_batch <= 0) p.n_batch = 512;
    if (p.n_batch > p.n_ctx) p.n_batch = p.n_ctx;
    if (p.n_ctx > (1 << 24) || p.n_batch > (1 << 16)) {
        if (err) snprintf(err, err_size, "context %d / batch %d too large", p.n_ctx, p.n_batch);
        return NM_ERR_RANGE;
    }
    int n_threads = p.n_threads > 0 ? p.n_threads : m->n_threads;
    nm_ctx *c = calloc(1, sizeof *c);
    if (!c) return NM_ERR_NOMEM;
    c->m = m;
    c->n_ctx = p.n_ctx;
    c->n_batch = p.n_batch;
    int64_t max_row = hp->n_embd > hp->n_ff ? hp->n_embd : hp->n_ff;
    if ((int64_t)hp->n_head * hp->head_dim > max_row) max_row = (int64_t)hp->n_head * hp->head_dim;
    c->be = nm_backend_cpu_create(n_threads, max_row, p.n_batch);
    if (c->be && p.pin_threads) (void)nm_backend_cpu_pin(c->be); // best effort: unpinned still works
    const size_t B = (size_t)p.n_batch, kvw = (size_t)hp->n_head_kv * hp->head_dim;
    const size_t qw = (size_t)hp->n_head * hp->head_dim;
    c->kv = zalloc((size_t)hp->n_layer, sizeof *c->kv);
    c->kv_mem = zalloc((size_t)hp->n_layer * 2 * (size_t)p.n_ctx * kvw, sizeof(uint16_t));
    c->x = zalloc(B * hp->n_embd, sizeof(float));
    c->cur = zalloc(B * hp->n_embd, sizeof(float));
    c->o = zalloc(B * hp->n_embd, sizeof(float));
    c->q = zalloc(B * qw, sizeof(float));
    c->attn = zalloc(B * qw, sizeof(float));
    c->k = zalloc(B * kvw, sizeof(float));
    c->v = zalloc(B * kvw, sizeof(float));
    c->g = zalloc(B * hp->n_ff, sizeof(float));
    c->u = zalloc(B * hp->n_ff, sizeof(float));
    c->logits = zalloc(B * (size_t)hp->n_vocab, sizeof(float));
    c->pos = zalloc(B, sizeof(int32_t));
    if (!c->be || !c->kv || !c->kv_mem || !c->x || !c->cur || !c->o || !c->q || !c->attn || !c->k || !c->v ||
        !c->g || !c->u || !c->logits || !c->pos) {
        nm_ctx_free(c);
        if (err) snprintf(err, err_size, "out of memory for a context of %d positions", p.n_ctx);
        return NM_ERR_NOMEM;
    }
    for (int il = 0; il < hp->n_layer; il++) {
        c->kv[il].k = c->kv_mem + (size_t)il * 2 * p.n_ctx * kvw;
        c->kv[il].v = c->kv[il].k + (size_t)p.n_ctx * kvw;
    }
    *out = c;
    return NM_OK;
}

void nm_ctx_free(nm_ctx *c) {
    if (!c) return;
    nm_backend_free(c->be);
    free(c->kv);
    free(c->kv_mem);
    free(c->x);
    free(c->cur);
    free(c->o);
    free(c->q);
    free(c->attn);
    free(c->k);
    free(c->v);
    free(c->g);
    free(c->u);
    free(c->logits);
    free(c->pos);
    free(c);
}

int32_t nm_ctx_n_ctx(const nm_ctx *c) { return c->n_ctx; }
int32_t nm_ctx_n_batch(const nm_ctx *c) { return c->n_batch; }
const char *nm_ctx_last_error(const nm_ctx *c) { return c->err; }

static nm_status ctx_fail(nm_ctx *c, nm_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    return st;
}

// An activation view of T rows of width w.
static inline nm_tensor act(float *data, int64_t w, int64_t T) {
    nm_tensor t = {.type = 0, .ne = {w, T, 1, 1}, .data = data, .name = NULL};
    return t;
}

// Runs one op on the context's backend.
static inline nm_status run(nm_ctx *c, const nm_op *op) {
    nm_status st = c->be->iface->compute(c->be, op, 1);
    if (st != NM_OK) ctx_fail(c, st, "%s", c->be->iface->last_error(c->be));
    return st;
}

#define RUN(...)                                          \
    do {                                                  \
        nm_op op_ = {__VA_ARGS__};                        \
        if ((st = run(c, &op_)) != NM_OK) return st;      \
    } while (0)

static nm_status norm(nm_ctx *c, float *dst, const float *src, const nm_tensor *w, int64_t width, int64_t rows) {
    nm_status st;
    nm_tensor s = act((float *)src, width, rows), d = act(dst, width, rows);
    RUN(.kind = NM_OP_RMS_NORM, .src0 = &s, .src1 = w, .dst = &d, .f0 = c->m->hp.norm_eps);
    return NM_OK;
}

static nm_status matmul(nm_ctx *c, float *dst, const nm_tensor *w, const float *src, const nm_tensor *bias,
                        int64_t T) {
    nm_status st;
    nm_tensor s = act((float *)src, w->ne[0], T), d = act(dst, w->ne[1], T);
    RUN(.kind = NM_OP_MATMUL, .src0 = w, .src1 = &s, .src2 = bias && bias->data ? bias : NULL, .dst = &d);
    return NM_OK;
}

// Several matmuls of the same input, handed over together so the backend can
// share the input's quantization and one synchronisation between them.
static nm_status matmul_shared(nm_ctx *c, int n, float *const *dst, const nm_tensor *const *w,
                               const nm_tensor *const *bias, const float *src, int64_t T) {
    nm_tensor s = act((float *)src, w[0]->ne[0], T), d[3];
    nm_op ops[3];
    for (int i = 0; i < n; i++) {
        d[i] = act(dst[i], w[i]->ne[1], T);
        ops[i] = (nm_op){.kind = NM_OP_MATMUL, .src0 = w[i], .src1 = &s,
                         .src2 = bias[i] && bias[i]->data ? bias[i] : NULL, .dst = &d[i]};
    }
    nm_status st = c->be->iface->compute(c->be, ops, n);
    if (st != NM_OK) ctx_fail(c, st, "%s", c->be->iface->last_error(c->be));
    return st;
}

static nm_status add(nm_ctx *c, float *dst, const float *a, const float *b, int64_t width, int64_t T) {
    nm_status st;
    nm_tensor ta = act((float *)a, width, T), tb = act((float *)b, width, T), d = act(dst, width, T);
    RUN(.kind = NM_OP_ADD, .src0 = &ta, .src1 = &tb, .dst = &d);
    return NM_OK;
}

// x_in: the layer's input rows; layer 0 reads them where they are (the token
// embeddings in c->x, or another brick's slot), every layer writes c->x.
static nm_status layer_forward(nm_ctx *c, int il, const float *x_in, int32_t T, int32_t pos0) {
    const nm_hparams *hp = &c->m->hp;
    const nm_layer *ly = &c->m->layers[il];
    const int64_t d = hp->n_embd, hd = hp->head_dim;
    const int64_t qw = (int64_t)hp->n_head * hd, kvw = (int64_t)hp->n_head_kv * hd;
    nm_status st;

    // attention block
    float *qkv[3] = {c->q, c->k, c->v};
    const nm_tensor *wqkv[3] = {&ly->wq, &ly->wk, &ly->wv}, *bqkv[3] = {&ly->bq, &ly->bk, &ly->bv};
    if ((st = norm(c, c->cur, x_in, &ly->attn_norm, d, T)) || (st = matmul_shared(c, 3, qkv, wqkv, bqkv, c->cur, T)))
        return st;
    if (ly->q_norm.data) { // gemma3: RMS norm of each head of q and k
        if ((st = norm(c, c->q, c->q, &ly->q_norm, hd, T * hp->n_head)) ||
            (st = norm(c, c->k, c->k, &ly->k_norm, hd, T * hp->n_head_kv)))
            return st;
    }
    const float base = ly->swa ? hp->rope_base_swa : hp->rope_base;
    const float fscale = ly->swa ? 1.0f : hp->rope_freq_scale;
    nm_tensor tq = act(c->q, qw, T), tk = act(c->k, kvw, T), tv = act(c->v, kvw, T), ta = act(c->attn, qw, T);
    RUN(.kind = NM_OP_ROPE, .src0 = &tq, .dst = &tq, .ids = c->pos, .f0 = base, .f1 = fscale, .i0 = hp->n_head,
        .i1 = (int32_t)hd, .i2 = hp->rope_mode, .i3 = hp->n_rot);
    RUN(.kind = NM_OP_ROPE, .src0 = &tk, .dst = &tk, .ids = c->pos, .f0 = base, .f1 = fscale, .i0 = hp->n_head_kv,
        .i1 = (int32_t)hd, .i2 = hp->rope_mode, .i3 = hp->n_rot);
    RUN(.kind = NM_OP_KV_STORE, .src0 = &tk, .src1 = &tv, .kv = &c->kv[il], .pos = pos0, .n_ctx = c->n_ctx);
    RUN(.kind = NM_OP_ATTENTION, .src0 = &tq, .dst = &ta, .ids = c->pos, .kv = &c->kv[il], .f0 = hp->attn_scale,
        .f1 = hp->attn_softcap, .i0 = hp->n_head, .i1 = hp->n_head_kv, .i2 = (int32_t)hd,
        .i3 = ly->swa ? hp->n_swa : 0, .n_ctx = c->n_ctx);
    if ((st = matmul(c, c->o, &ly->wo, c->attn, NULL, T))) return st;
    if (ly->post_attn_norm.data && (st = norm(c, c->o, c->o, &ly->post_attn_norm, d, T))) return st;
    if ((st = add(c, c->x, x_in, c->o, d, T))) return st;

    // feed-forward block: down(act(gate(x)) * up(x))
    float *gu[2] = {c->g, c->u};
    const nm_tensor *wgu[2] = {&ly->ffn_gate, &ly->ffn_up}, *bgu[2] = {NULL, NULL};
    if ((st = norm(c, c->cur, c->x, &ly->ffn_norm, d, T)) || (st = matmul_shared(c, 2, gu, wgu, bgu, c->cur, T)))
        return st;
    nm_tensor tg = act(c->g, hp->n_ff, T), tu = act(c->u, hp->n_ff, T);
    RUN(.kind = NM_OP_GLU, .src0 = &tg, .src1 = &tu, .dst = &tg, .i0 = hp->act);
    if ((st = matmul(c, c->o, &ly->ffn_down, c->g, NULL, T))) return st;
    if (ly->post_ffn_norm.data && (st = norm(c, c->o, c->o, &ly->post_ffn_norm, d, T))) return st;
    return add(c, c->x, c->x, c->o, d, T);
}

// Runs all layers over the input rows x_in (T, n_embd), read in place, and the output head.
static nm_status forward(nm_ctx *c, const float *x_in, int32_t T, int32_t pos0, bool all_logits) {
    const nm_hparams *hp = &c->m->hp;
    nm_status st;
    for (int32_t i = 0; i < T; i++) c->pos[i] = pos0 + i;
    for (int il = 0; il < hp->n_layer; il++)
        if ((st = layer_forward(c, il, il == 0 ? x_in : c->x, T, pos0)) != NM_OK) return st;
    const float *x_out = hp->n_layer > 0 ? c->x : x_in;
    // Only the rows whose logits are wanted go through the (large) output head.
    const int32_t first = all_logits ? 0 : T - 1, n = T - first;
    const int64_t d = hp->n_embd;
    if ((st = norm(c, c->cur, x_out + (size_t)first * d, &c->m->output_norm, d, n)) ||
        (st = matmul(c, c->logits, &c->m->output, c->cur, NULL, n)))
        return st;
    if (hp->final_softcap > 0.0f) {
        const float cap = hp->final_softcap;
        for (size_t i = 0; i < (size_t)n * hp->n_vocab; i++) c->logits[i] = cap * tanhf(c->logits[i] / cap);
    }
    c->n_out = n;
    c->out_first = first;
    return NM_OK;
}

static nm_status check_batch(nm_ctx *c, int32_t n, int32_t pos) {
    c->err[0] = '\0';
    c->n_out = 0;
    if (n <= 0 || n > c->n_batch) return ctx_fail(c, NM_ERR_RANGE, "batch of %d tokens (1..%d allowed)", n, c->n_batch);
    if (pos < 0 || pos > c->n_ctx - n)
        return ctx_fail(c, NM_ERR_RANGE, "positions %d..%d do not fit in a context of %d", pos, pos + n - 1, c->n_ctx);
    return NM_OK;
}

nm_status nm_decode(nm_ctx *c, const int32_t *tokens, int32_t n, int32_t pos, bool all_logits) {
    nm_status st;
    if (!c || !tokens) return NM_ERR_INVALID_ARG;
    if ((st = check_batch(c, n, pos))) return st;
    const nm_hparams *hp = &c->m->hp;
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= hp->n_vocab)
            return ctx_fail(c, NM_ERR_RANGE, "token id %d out of range [0, %d)", tokens[i], hp->n_vocab);
    nm_tensor tx = act(c->x, hp->n_embd, n);
    RUN(.kind = NM_OP_GET_ROWS, .src0 = &c->m->tok_embd, .ids = tokens, .dst = &tx);
    if (hp->embd_scale != 1.0f) RUN(.kind = NM_OP_SCALE, .src0 = &tx, .dst = &tx, .f0 = hp->embd_scale);
    return forward(c, c->x, n, pos, all_logits);
}

nm_status nm_decode_embd(nm_ctx *c, const float *embd, int32_t n, int32_t pos, bool all_logits) {
    nm_status st;
    if (!c || !embd) return NM_ERR_INVALID_ARG;
    if ((st = check_batch(c, n, pos))) return st;
    // read where the caller put them (another brick's slot): no copy into c->x
    return forward(c, embd, n, pos, all_logits);
}

const float *nm_get_logits(const nm_ctx *c, int32_t i) {
    if (!c || c->n_out == 0) return NULL;
    if (i < 0) i = c->out_first + c->n_out - 1;
    if (i < c->out_first || i >= c->out_first + c->n_out) return NULL;
    return c->logits + (size_t)(i - c->out_first) * c->m->hp.n_vocab;
}
