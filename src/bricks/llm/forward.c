// Forward pass of the decoder, readable top to bottom. Each step is an nm_op;
// the pass for one batch size is recorded once into an op list over tensors
// of the backend's arena and replayed with new inputs (token ids, positions)
// written into its tensors. Buffers are sized at context creation; a decode
// call allocates nothing once its shape has been recorded. With -ngl the
// first layers' ops go to the CPU and the rest to the device, the two lists
// submitted in turn with an event between them.
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bricks/llm/llm.h"
#include "quant/quant.h"
#include "core/fail.h"

// The op list of one forward pass for one batch shape, recorded once and
// replayed: its tensors live in `tens` (ops point at them), inputs (token
// ids, positions, embeddings) are written into tensors before each submit.
typedef struct graph {
    int32_t T;         // tokens; 0: empty slot
    int32_t n_out;     // the last n_out rows go through the output head
    bool embd_in;
    nm_op *ops;
    uint8_t *unit;     // (cap_ops) the backend (index in nm_ctx.be) each op runs on
    int n_ops, cap_ops;
    nm_tensor *tens;
    int n_tens, cap_tens;
    nm_tensor *in;     // the input rows (embeddings read in place: offs set per call)
    uint64_t used;     // tick of the last use (the least recent slot is re-recorded)
    uint8_t cur_unit;  // where the ops being recorded go
    bool overflow;
} graph;

#define NM_CTX_GRAPHS 4
#define NM_MROPE_IMAGES 64 // images a sequence may hold (M-RoPE's shifts, nm_ctx)

struct nm_ctx {
    nm_model *m;
    // be[0] runs the last n_dev layers and the output head; be[1], the CPU,
    // the layers before them when the model is split (n_be == 2)
    nm_backend *be[2];
    int n_be;
    int32_t n_dev;     // layers on be[0]
    nm_backend *mem;   // the backend whose buffers hold the activations and the cache
    nm_backend *host;  // a device sharing host memory, whole model there: the CPU backend whose
                       // buffers (host pages, wrapped by the device) hold them; it runs no op
    nm_backend_caps caps; // of be[0]
    int32_t n_ctx, n_batch;
    int32_t n_seq;     // sequences, n_ctx cache rows each (sequence s: rows s n_ctx ..)
    int32_t n_threads; // the backend's (the cores where neither the context nor the model names them)
    nm_buffer *arena;  // every activation, in the backend's memory
    nm_buffer *kvbuf;  // the attention layers' K and V, f16: (n_attn, 2, n_seq x n_ctx, n_head_kv * hd), then
                       // the short convolutions' state, f32: (n_conv, n_seq x cs_rows, n_embd)
    nm_kv_layer *kv;   // (n_layer) views of kvbuf (attention layers')
    nm_tensor *cstate; // (n_layer) views of kvbuf (short-convolution layers'; NM_OP_SHORT_CONV's state)
    // the short convolutions' state, per sequence: a ring of cs_ring rows, then checkpoints every cs_step
    // positions; the ring holds the positions [cs_lo, cs_hi2), checkpoints <= cs_hi are of its history
    int32_t cs_ring, cs_step, cs_rows;
    int32_t *cs_lo, *cs_hi2, *cs_hi; // (n_seq)
    // activations, each (n_batch, width), views of the arena
    nm_tensor x;       // residual stream (n_embd)
    nm_tensor cur;     // normed input (n_embd)
    nm_tensor q, attn; // (n_head * hd)
    nm_tensor k, v;    // (n_head_kv * hd)
    nm_tensor o;       // (n_embd)
    nm_tensor g, u;    // (n_ff)
    nm_tensor bcx;     // (3 n_embd) a short convolution's in_proj (lfm2; else 0 wide)
    nm_tensor logits;  // (n_batch, n_vocab)
    nm_tensor pos;     // i32 (n_batch)
    nm_tensor kvpos;   // i32 (n_batch): the rows' cache ids, s n_ctx + position (n_seq > 1; else pos)
    nm_tensor tok;     // i32 (n_batch)
    nm_tensor rpos;    // i32 (3 n_batch): M-RoPE's position streams t, h, w of the batch, one after the other
    float *logits_host;  // where the host reads logits when it cannot address the arena
    int32_t *pos_host;   // (5 n_batch) staging of the positions, the cache ids, then M-RoPE's three streams
    // M-RoPE (qwen2vl): an image of nx x ny tokens takes nx ny cache rows but moves the rope position on by
    // max(nx, ny) only, so a sequence's rope position is its cache position plus the shifts of the images
    // before it: per sequence, the images' ends (cache position after the last token) and shifts
    int32_t (*shift)[NM_MROPE_IMAGES][2];
    int32_t *n_shift; // (n_seq)
    graph graphs[NM_CTX_GRAPHS];
    uint64_t tick;
    int32_t n_out;     // logits rows kept by the last decode
    int32_t out_first; // batch index of logits row 0
    char note[512];    // why --device auto chose the CPU ("" otherwise)
    char err[256];
};

nm_ctx_params nm_ctx_default_params(void) {
    nm_ctx_params p = {.n_ctx = 0, .n_batch = 0, .n_threads = 0, .pin_threads = false, .device = NULL,
                       .n_gpu_layers = -1, .n_seq = 1};
    return p;
}

// The rope position of cache position p of sequence seq (M-RoPE: p plus the shifts of the images that
// end at or before p).
static int32_t rope_pos(const nm_ctx *c, int32_t seq, int32_t p) {
    int32_t r = p;
    for (int32_t i = 0; c->n_shift && i < c->n_shift[seq]; i++)
        if (c->shift[seq][i][0] <= p) r += c->shift[seq][i][1];
    return r;
}

// Positions from p on of sequence seq are being written: the images there are gone (their shifts with them).
static void forget_from(nm_ctx *c, int32_t seq, int32_t p) {
    if (!c->n_shift) return;
    int32_t k = 0;
    for (int32_t i = 0; i < c->n_shift[seq]; i++)
        if (c->shift[seq][i][0] <= p) {
            c->shift[seq][k][0] = c->shift[seq][i][0];
            c->shift[seq][k][1] = c->shift[seq][i][1];
            k++;
        }
    c->n_shift[seq] = k;
}

static nm_tensor arena_view(nm_buffer *buf, size_t *at, uint32_t type, int64_t w, int64_t rows) {
    nm_tensor t = {.type = type, .ne = {w, rows, 1, 1}, .buf = buf, .offs = *at, .name = NULL};
    *at += ((size_t)w * (size_t)rows * 4 + 63) / 64 * 64; // f32 and i32: 4 bytes
    return t;
}

// Whether the device multiplies every weight type of the model (and looks up
// its embeddings): known from the types alone, before anything is placed.
static nm_status weights_supported(const nm_model *m, nm_backend *b, const nm_backend_caps *caps, char *err,
                                   size_t err_size) {
    const nm_hparams *hp = &m->hp;
    const nm_tensor *ws[16 + 1];
    for (int il = 0; il <= hp->n_layer; il++) { // the layers, then the output head
        int n = 0;
        if (il == hp->n_layer) {
            ws[n++] = &m->output;
        } else {
            const nm_layer *ly = &m->layers[il];
            const nm_tensor *all[] = {&ly->wq, &ly->wk, &ly->wv, &ly->wo, &ly->ffn_gate, &ly->ffn_up, &ly->ffn_down};
            for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ws[n++] = all[i];
        }
        for (int i = 0; i < n; i++)
            if (ws[i]->type >= 64 || !(caps->weight_types >> ws[i]->type & 1)) {
                const nm_type_traits *tr = nm_type_traits_get(ws[i]->type);
                if (il == hp->n_layer) snprintf(err, err_size, "%s has no kernel for %s weights (the output head)", nm_backend_name(b),
                                     tr ? tr->name : "?");
                else snprintf(err, err_size, "%s has no kernel for %s weights (in layer %d)", nm_backend_name(b),
                              tr ? tr->name : "?", il);
                return NM_ERR_UNSUPPORTED;
            }
    }
    nm_tensor ids = {.type = NM_TYPE_I32, .ne = {1, 1, 1, 1}};
    nm_tensor row = {.type = NM_TYPE_F32, .ne = {hp->n_embd, 1, 1, 1}};
    const nm_op lookup = {.kind = NM_OP_GET_ROWS, .src0 = &m->tok_embd, .ids = &ids, .dst = &row};
    if (!nm_backend_supports_op(b, &lookup)) {
        const nm_type_traits *tr = nm_type_traits_get(m->tok_embd.type);
        snprintf(err, err_size, "%s cannot look up %s embeddings", nm_backend_name(b), tr ? tr->name : "?");
        return NM_ERR_UNSUPPORTED;
    }
    if (hp->rope_mode == NM_ROPE_MROPE) { // (the rope's kind, known before anything is placed)
        nm_tensor q = {.type = NM_TYPE_F32, .ne = {(int64_t)hp->n_head * hp->head_dim, 1, 1, 1}};
        nm_tensor pos3 = {.type = NM_TYPE_I32, .ne = {3, 1, 1, 1}};
        nm_op rope = {.kind = NM_OP_ROPE, .src0 = &q, .dst = &q, .ids = &pos3, .f0 = hp->rope_base, .f1 = 1.0f,
                      .i0 = hp->n_head, .i1 = hp->head_dim, .i2 = NM_ROPE_MROPE, .i3 = hp->n_rot};
        memcpy(rope.rope_sections, hp->rope_sections, sizeof rope.rope_sections);
        if (!nm_backend_supports_op(b, &rope)) {
            snprintf(err, err_size, "%s has no M-RoPE (%s's multi-axis rope): run it on the CPU", nm_backend_name(b),
                     m->arch_name);
            return NM_ERR_UNSUPPORTED;
        }
    }
    return NM_OK;
}

static nm_status ctx_create(nm_model *m, const nm_ctx_params *params, bool device_arena, nm_ctx **out, char *err,
                            size_t err_size);

nm_status nm_ctx_create(nm_model *m, const nm_ctx_params *params, nm_ctx **out, char *err, size_t err_size) {
    const char *da = getenv("NM_DEVICE_ARENA");
    return ctx_create(m, params, da && !strcmp(da, "1"), out, err, err_size);
}

// device_arena: the activations and the cache in the device's own buffers even
// where it shares host memory.
static nm_status ctx_create(nm_model *m, const nm_ctx_params *params, bool device_arena, nm_ctx **out, char *err,
                            size_t err_size) {
    if (!m || !out) return NM_ERR_INVALID_ARG;
    *out = NULL;
    nm_ctx_params p = params ? *params : nm_ctx_default_params();
    if (p.device && !strcmp(p.device, "auto")) { // OpenCL if it takes the model whole, else the CPU, saying why
        char why[400] = "";
        nm_ctx_params q = p;
        q.device = "opencl:auto";
        if (p.n_gpu_layers != 0 && nm_ctx_create(m, &q, out, why, sizeof why) == NM_OK) return NM_OK;
        q.device = "cpu";
        nm_status st = nm_ctx_create(m, &q, out, err, err_size);
        if (st == NM_OK && p.n_gpu_layers != 0)
            snprintf((*out)->note, sizeof (*out)->note, "--device auto: %s; running on the CPU", why);
        return st;
    }
    const nm_hparams *hp = &m->hp;
    if (p.n_ctx <= 0) p.n_ctx = hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096;
    if (p.n_batch <= 0) p.n_batch = 512;
    if (p.n_batch > p.n_ctx) p.n_batch = p.n_ctx;
    if (p.n_seq <= 0) p.n_seq = 1;
    if (p.n_ctx > (1 << 24) || p.n_batch > (1 << 16) || p.n_seq > 256 || (int64_t)p.n_ctx * p.n_seq > (1 << 24)) {
        if (err) snprintf(err, err_size, "context %d x %d sequences / batch %d too large", p.n_ctx, p.n_seq, p.n_batch);
        return NM_ERR_RANGE;
    }
    nm_ctx *c = calloc(1, sizeof *c);
    if (!c) return NM_ERR_NOMEM;
    c->m = m;
    c->n_ctx = p.n_ctx;
    c->n_batch = p.n_batch;
    c->n_seq = p.n_seq;
    int64_t max_row = hp->n_embd > hp->n_ff ? hp->n_embd : hp->n_ff;
    if ((int64_t)hp->n_head * hp->head_dim > max_row) max_row = (int64_t)hp->n_head * hp->head_dim;
    const nm_backend_params bp = {.n_threads = p.n_threads > 0 ? p.n_threads : m->n_threads,
                                  .pin_threads = p.pin_threads, .max_row = max_row, .max_tokens = p.n_batch};
    c->n_threads = bp.n_threads > 0 ? bp.n_threads : nm_cpu_count();
    char berr[512] = "";
    const bool on_cpu = !p.device || !strcmp(p.device, "cpu") || p.n_gpu_layers == 0;
    if (!on_cpu && p.n_seq > 1) {
        nm_ctx_free(c);
        if (err) snprintf(err, err_size, "%d sequences in one context: the CPU backend decodes several together, %s "
                          "does not yet (use the CPU, or one sequence)", p.n_seq, p.device);
        return NM_ERR_UNSUPPORTED;
    }
    nm_status st = nm_backend_create(on_cpu ? "cpu" : p.device, &bp, &c->be[0], berr, sizeof berr);
    if (st == NM_OK) {
        nm_backend_get_caps(c->be[0], &c->caps);
        if (!on_cpu) st = weights_supported(m, c->be[0], &c->caps, berr, sizeof berr);
    }
    if (st != NM_OK) {
        nm_ctx_free(c);
        if (err) snprintf(err, err_size, "%s", berr);
        return st;
    }
    c->n_be = 1;
    c->n_dev = p.n_gpu_layers < 0 || p.n_gpu_layers > hp->n_layer || on_cpu ? hp->n_layer : p.n_gpu_layers;
    c->mem = c->be[0];
    if (c->n_dev < hp->n_layer) { // a split: the first layers on the CPU, in host memory the device shares
        if (!c->caps.unified_memory) {
            nm_ctx_free(c);
            if (err)
                snprintf(err, err_size, "-ngl %d: a layer split hands the hidden state over in shared memory, and "
                         "%s has its own (use every layer there, or the CPU)", p.n_gpu_layers, p.device);
            return NM_ERR_UNSUPPORTED;
        }
        if ((st = nm_backend_create("cpu", &bp, &c->be[1], berr, sizeof berr)) != NM_OK) {
            nm_ctx_free(c);
            if (err) snprintf(err, err_size, "%s", berr);
            return st;
        }
        c->n_be = 2;
        c->mem = c->be[1];
    } else if (!on_cpu && c->caps.unified_memory && !device_arena) {
        // every layer on a device that shares host memory: the activations and the
        // cache in host pages it wraps, so the host writes the inputs and reads the
        // logits in place (NM_DEVICE_ARENA=1: in the device's own buffers, copied)
        nm_backend_params hb = bp;
        hb.n_threads = 1; // memory only: no pool
        hb.pin_threads = false;
        if (nm_backend_create("cpu", &hb, &c->host, berr, sizeof berr) == NM_OK) c->mem = c->host;
    }
    const size_t B = (size_t)p.n_batch, kvw = (size_t)hp->n_head_kv * hp->head_dim;
    const size_t qw = (size_t)hp->n_head * hp->head_dim;
    const int64_t widths[] = {hp->n_embd, hp->n_embd, hp->n_embd, (int64_t)qw, (int64_t)qw, (int64_t)kvw,
                              (int64_t)kvw, hp->n_ff, hp->n_ff, hp->n_vocab, hp->n_conv ? 3 * (int64_t)hp->n_embd : 0,
                              1, 1, 1, 3};
    size_t size = 0;
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++) size += ((size_t)widths[i] * B * 4 + 63) / 64 * 64;
    c->arena = nm_backend_buffer_alloc(c->mem, size);
    const size_t kv_rows = (size_t)p.n_ctx * (size_t)p.n_seq, kv_layer = 2 * kv_rows * kvw * sizeof(uint16_t);
    const size_t n_attn = (size_t)(hp->n_layer - hp->n_conv);
    size_t cs_layer = 0; // a short convolution's state, every sequence's
    if (hp->n_conv) {
        c->cs_step = p.n_ctx <= 8192 ? 32 : 128; // (divides the server's prompt chunks: 128)
        c->cs_ring = c->cs_step + hp->conv_l - 1;
        c->cs_rows = (int32_t)nm_short_conv_rows(hp->conv_l, c->cs_ring, c->cs_step, p.n_ctx);
        cs_layer = (size_t)c->cs_rows * (size_t)p.n_seq * (size_t)hp->n_embd * sizeof(float);
        c->cs_lo = calloc((size_t)p.n_seq * 3, sizeof *c->cs_lo);
        c->cs_hi2 = c->cs_lo ? c->cs_lo + p.n_seq : NULL;
        c->cs_hi = c->cs_lo ? c->cs_lo + 2 * (size_t)p.n_seq : NULL;
    }
    c->kvbuf = c->arena && (!hp->n_conv || c->cs_lo)
                   ? nm_backend_buffer_alloc(c->mem, n_attn * kv_layer + (size_t)hp->n_conv * cs_layer)
                   : NULL;
    c->kv = calloc((size_t)hp->n_layer + 1, sizeof *c->kv);
    c->cstate = calloc((size_t)hp->n_layer + 1, sizeof *c->cstate);
    c->pos_host = calloc(5 * B, sizeof(int32_t));
    if (hp->rope_mode == NM_ROPE_MROPE) {
        c->shift = calloc((size_t)p.n_seq, sizeof *c->shift);
        c->n_shift = calloc((size_t)p.n_seq, sizeof *c->n_shift);
    }
    if (!c->arena || !c->kvbuf || !c->kv || !c->cstate || !c->pos_host || (hp->rope_mode == NM_ROPE_MROPE && (!c->shift || !c->n_shift))) {
        if (err) snprintf(err, err_size, "out of memory for a context of %d positions%s%s", p.n_ctx,
                          c->arena && c->kvbuf ? "" : ": ", c->arena && c->kvbuf ? "" : nm_backend_last_error(c->mem));
        nm_ctx_free(c);
        return NM_ERR_NOMEM;
    }
    size_t at = 0;
    nm_tensor *views[] = {&c->x, &c->cur, &c->o, &c->q, &c->attn, &c->k, &c->v, &c->g, &c->u, &c->logits, &c->bcx};
    for (size_t i = 0; i < sizeof views / sizeof views[0]; i++)
        *views[i] = arena_view(c->arena, &at, NM_TYPE_F32, widths[i], (int64_t)B);
    c->pos = arena_view(c->arena, &at, NM_TYPE_I32, 1, (int64_t)B);
    c->kvpos = arena_view(c->arena, &at, NM_TYPE_I32, 1, (int64_t)B);
    c->tok = arena_view(c->arena, &at, NM_TYPE_I32, 1, (int64_t)B);
    c->rpos = arena_view(c->arena, &at, NM_TYPE_I32, 3, (int64_t)B);
    c->rpos.ne[0] = 3 * (int64_t)B;
    c->rpos.ne[1] = 1;
    c->pos.ne[0] = c->kvpos.ne[0] = c->tok.ne[0] = (int64_t)B; // one row of n_batch ids
    c->pos.ne[1] = c->kvpos.ne[1] = c->tok.ne[1] = 1;
    for (int il = 0, ic = 0; il < hp->n_layer; il++) {
        const nm_layer *ly = &m->layers[il];
        if (ly->conv) {
            c->cstate[il] = (nm_tensor){.type = NM_TYPE_F32, .ne = {hp->n_embd, (int64_t)c->cs_rows * p.n_seq, 1, 1},
                                        .buf = c->kvbuf, .offs = n_attn * kv_layer + (size_t)ic++ * cs_layer};
            continue;
        }
        const nm_tensor k = {.type = NM_TYPE_F16, .ne = {(int64_t)kvw, (int64_t)kv_rows, 1, 1}, .buf = c->kvbuf,
                             .offs = (size_t)ly->kv_index * kv_layer};
        c->kv[il].k = k;
        c->kv[il].v = k;
        c->kv[il].v.offs += kv_layer / 2;
    }
    if (!c->arena->host && !(c->logits_host = malloc(B * (size_t)hp->n_vocab * sizeof(float)))) {
        nm_ctx_free(c);
        if (err) snprintf(err, err_size, "out of memory for the logits");
        return NM_ERR_NOMEM;
    }
    // the weights, read where they are mapped (a copy only on a device that cannot see host memory)
    if (m->wend > m->wbase &&
        (st = nm_backend_import_host(c->be[0], m->wbase, (size_t)(m->wend - m->wbase), false)) != NM_OK) {
        if (err) snprintf(err, err_size, "the weights: %s", nm_backend_last_error(c->be[0]));
        nm_ctx_free(c);
        return st;
    }
    // the device's own layout for the weights of its layers, where it has one
    if (nm_backend_prepares_weights(c->be[0])) {
        st = nm_backend_prepare_weight(c->be[0], &m->output);
        for (int il = hp->n_layer - c->n_dev; il < hp->n_layer && st == NM_OK; il++) {
            const nm_layer *ly = &m->layers[il];
            const nm_tensor *ws[] = {&ly->wq,       &ly->wk,     &ly->wv,       &ly->wo,      &ly->ffn_gate,
                                     &ly->ffn_up,   &ly->ffn_down, &ly->conv_in, &ly->conv_out};
            for (size_t i = 0; i < sizeof ws / sizeof ws[0] && st == NM_OK; i++)
                if (nm_tensor_is_set(ws[i])) st = nm_backend_prepare_weight(c->be[0], ws[i]);
        }
        if (st != NM_OK) {
            if (err) snprintf(err, err_size, "the weights: %s", nm_backend_last_error(c->be[0]));
            nm_ctx_free(c);
            return st;
        }
    }
    // a split, or host memory the device shares: the device works in the CPU's activations and cache, in place
    if (c->mem != c->be[0] &&
        ((st = nm_backend_import_host(c->be[0], c->arena->host, c->arena->size, true)) != NM_OK ||
         (st = nm_backend_import_host(c->be[0], c->kvbuf->host, c->kvbuf->size, true)) != NM_OK)) {
        const bool retry = c->host != NULL; // not a split: the device's own buffers will do
        if (err) snprintf(err, err_size, "sharing the activations: %s", nm_backend_last_error(c->be[0]));
        nm_ctx_free(c);
        return retry ? ctx_create(m, params, true, out, err, err_size) : st;
    }
    *out = c;
    return NM_OK;
}

static void graph_clear(graph *g) {
    free(g->ops);
    free(g->unit);
    free(g->tens);
    memset(g, 0, sizeof *g);
}

void nm_ctx_free(nm_ctx *c) {
    if (!c) return;
    for (int i = 0; i < NM_CTX_GRAPHS; i++) graph_clear(&c->graphs[i]);
    // a split or host memory the device wraps: the device first (it wraps the CPU backend's pages), then those buffers
    if (c->mem != c->be[0]) {
        nm_backend_free(c->be[0]);
        c->be[0] = NULL;
    }
    if (c->mem) {
        nm_backend_buffer_free(c->mem, c->arena);
        nm_backend_buffer_free(c->mem, c->kvbuf);
    }
    nm_backend_free(c->be[0]);
    nm_backend_free(c->be[1]);
    nm_backend_free(c->host);
    free(c->kv);
    free(c->cstate);
    free(c->cs_lo);
    free(c->logits_host);
    free(c->pos_host);
    free(c->shift);
    free(c->n_shift);
    free(c);
}

int32_t nm_ctx_n_ctx(const nm_ctx *c) { return c->n_ctx; }
int32_t nm_ctx_n_batch(const nm_ctx *c) { return c->n_batch; }
int32_t nm_ctx_n_seq(const nm_ctx *c) { return c->n_seq; }
int32_t nm_ctx_n_threads(const nm_ctx *c) { return c->n_threads; }
const char *nm_ctx_last_error(const nm_ctx *c) { return c->err; }
const char *nm_ctx_device(const nm_ctx *c) { return nm_backend_name(c->be[0]); }
int32_t nm_ctx_device_layers(const nm_ctx *c) { return c->n_dev; }
const char *nm_ctx_device_note(const nm_ctx *c) { return c->note; }

void nm_ctx_device_stats(const nm_ctx *c, uint64_t *wrapped, uint64_t *uploaded) {
    nm_backend_stats s = {0};
    nm_backend_get_stats(c->be[0], &s);
    *wrapped = s.bytes_wrapped;
    *uploaded = s.bytes_uploaded;
}

static nm_status ctx_fail(nm_ctx *c, nm_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    nm_vfail(st, c->err, sizeof c->err, NULL, fmt, ap);
    va_end(ap);
    return st;
}

// ---- recording -------------------------------------------------------------------------

// A tensor of the graph: rows [r0, r0 + T) of an activation (f32 rows of width w).
static nm_tensor *rows(graph *g, const nm_tensor *base, int64_t w, int64_t r0, int64_t T) {
    if (g->n_tens == g->cap_tens) {
        g->overflow = true;
        return &g->tens[g->cap_tens - 1];
    }
    nm_tensor *t = &g->tens[g->n_tens++];
    *t = *base;
    t->ne[0] = w;
    t->ne[1] = T;
    t->offs += (size_t)(r0 * w) * sizeof(float);
    return t;
}

static nm_op *emit(graph *g, nm_op op) {
    if (g->n_ops == g->cap_ops) {
        g->overflow = true;
        return &g->ops[g->cap_ops - 1];
    }
    g->unit[g->n_ops] = g->cur_unit;
    g->ops[g->n_ops] = op;
    return &g->ops[g->n_ops++];
}

static const nm_tensor *opt(const nm_tensor *t) { return t && nm_tensor_is_set(t) ? t : NULL; }

static void norm(nm_ctx *c, graph *g, nm_tensor *dst, nm_tensor *src, const nm_tensor *w) {
    emit(g, (nm_op){.kind = NM_OP_RMS_NORM, .src0 = src, .src1 = w, .dst = dst, .f0 = c->m->hp.norm_eps});
}

static void matmul(graph *g, nm_tensor *dst, const nm_tensor *w, nm_tensor *src, const nm_tensor *bias) {
    emit(g, (nm_op){.kind = NM_OP_MATMUL, .src0 = w, .src1 = src, .src2 = opt(bias), .dst = dst});
}

// Records one layer: its input rows in x_in, its output in x.
static void layer_record(nm_ctx *c, graph *g, int il, nm_tensor *x_in, int32_t T) {
    const nm_hparams *hp = &c->m->hp;
    const nm_layer *ly = &c->m->layers[il];
    const int64_t d = hp->n_embd, hd = hp->head_dim;
    const int64_t qw = (int64_t)hp->n_head * hd, kvw = (int64_t)hp->n_head_kv * hd;
    nm_tensor *x = rows(g, &c->x, d, 0, T), *cur = rows(g, &c->cur, d, 0, T), *o = rows(g, &c->o, d, 0, T);
    nm_tensor *q = rows(g, &c->q, qw, 0, T), *k = rows(g, &c->k, kvw, 0, T), *v = rows(g, &c->v, kvw, 0, T);
    nm_tensor *attn = rows(g, &c->attn, qw, 0, T), *pos = rows(g, &c->pos, T, 0, 1);
    pos->type = NM_TYPE_I32;
    nm_tensor *kvpos = pos; // the cache ids: the positions, or s n_ctx + position with several sequences
    if (c->n_seq > 1) {
        kvpos = rows(g, &c->kvpos, T, 0, 1);
        kvpos->type = NM_TYPE_I32;
    }

    if (ly->conv) { // lfm2: y = out_proj(c * conv(b * x)), [b | c | x] = in_proj(norm(x_in)), causal taps
        nm_tensor *bcx = rows(g, &c->bcx, 3 * d, 0, T);
        norm(c, g, cur, x_in, &ly->attn_norm);
        matmul(g, bcx, &ly->conv_in, cur, NULL);
        emit(g, (nm_op){.kind = NM_OP_SHORT_CONV, .src0 = bcx, .src1 = &ly->conv_w, .dst = cur, .ids = kvpos,
                        .state = &c->cstate[il], .n_ctx = c->n_ctx, .i0 = hp->conv_l, .i1 = c->cs_ring,
                        .i2 = c->cs_rows, .i3 = c->cs_step});
        matmul(g, o, &ly->conv_out, cur, NULL);
        goto mixed;
    }
    // attention block; q, k and v share the normed input (the backend may quantize it once)
    norm(c, g, cur, x_in, &ly->attn_norm);
    matmul(g, q, &ly->wq, cur, &ly->bq);
    matmul(g, k, &ly->wk, cur, &ly->bk);
    matmul(g, v, &ly->wv, cur, &ly->bv);
    if (nm_tensor_is_set(&ly->q_norm)) { // gemma3, qwen3: RMS norm of each head of q and k
        norm(c, g, rows(g, &c->q, hd, 0, T * hp->n_head), rows(g, &c->q, hd, 0, T * hp->n_head), &ly->q_norm);
        norm(c, g, rows(g, &c->k, hd, 0, T * hp->n_head_kv), rows(g, &c->k, hd, 0, T * hp->n_head_kv), &ly->k_norm);
    }
    const bool swa_rope = ly->swa && hp->arch == NM_ARCH_GEMMA3; // (gemma3's local layers rotate their own way)
    const float base = swa_rope ? hp->rope_base_swa : hp->rope_base;
    const float fscale = swa_rope ? 1.0f : hp->rope_freq_scale;
    nm_tensor *rp = pos; // the rope's positions: M-RoPE's three streams
    if (hp->rope_mode == NM_ROPE_MROPE) {
        rp = rows(g, &c->rpos, 3 * (int64_t)T, 0, 1);
        rp->type = NM_TYPE_I32;
    }
    nm_op rope = {.kind = NM_OP_ROPE, .src0 = q, .dst = q, .ids = rp, .f0 = base, .f1 = fscale, .i0 = hp->n_head,
                  .i1 = (int32_t)hd, .i2 = hp->rope_mode, .i3 = hp->n_rot};
    memcpy(rope.rope_sections, hp->rope_sections, sizeof rope.rope_sections);
    if (!ly->no_rope) {
        emit(g, rope);
        rope.src0 = rope.dst = k;
        rope.i0 = hp->n_head_kv;
        emit(g, rope);
    }
    emit(g, (nm_op){.kind = NM_OP_KV_STORE, .src0 = k, .src1 = v, .ids = kvpos, .kv = &c->kv[il], .n_ctx = c->n_ctx});
    emit(g, (nm_op){.kind = NM_OP_ATTENTION, .src0 = q, .dst = attn, .ids = kvpos, .kv = &c->kv[il],
                    .f0 = hp->attn_scale, .f1 = hp->attn_softcap, .i0 = hp->n_head, .i1 = hp->n_head_kv,
                    .i2 = (int32_t)hd, .i3 = ly->swa ? hp->n_swa : 0, .n_ctx = c->n_ctx});
    matmul(g, o, &ly->wo, attn, NULL);
mixed: // (the token mixer's output in o: attention's, or the short convolution's)
    if (nm_tensor_is_set(&ly->post_attn_norm)) norm(c, g, o, o, &ly->post_attn_norm);
    emit(g, (nm_op){.kind = NM_OP_ADD, .src0 = x_in, .src1 = o, .dst = x});

    // feed-forward block: down(act(gate(x)) * up(x))
    nm_tensor *gt = rows(g, &c->g, hp->n_ff, 0, T), *ut = rows(g, &c->u, hp->n_ff, 0, T);
    norm(c, g, cur, x, &ly->ffn_norm);
    matmul(g, gt, &ly->ffn_gate, cur, NULL);
    matmul(g, ut, &ly->ffn_up, cur, NULL);
    emit(g, (nm_op){.kind = NM_OP_GLU, .src0 = gt, .src1 = ut, .dst = gt, .i0 = hp->act});
    matmul(g, o, &ly->ffn_down, gt, NULL);
    if (nm_tensor_is_set(&ly->post_ffn_norm)) norm(c, g, o, o, &ly->post_ffn_norm);
    emit(g, (nm_op){.kind = NM_OP_ADD, .src0 = x, .src1 = o, .dst = x});
}

// Records the pass for T tokens: the embedding lookup (or embeddings read
// where the caller has them), every layer, the output head.
static nm_status graph_record(nm_ctx *c, graph *g, int32_t T, int32_t n_out, bool embd_in) {
    const nm_hparams *hp = &c->m->hp;
    graph_clear(g);
    g->cap_ops = 24 * hp->n_layer + 8;
    g->cap_tens = 24 * hp->n_layer + 16;
    g->ops = calloc((size_t)g->cap_ops, sizeof *g->ops);
    g->unit = calloc((size_t)g->cap_ops, sizeof *g->unit);
    g->tens = calloc((size_t)g->cap_tens, sizeof *g->tens);
    if (!g->ops || !g->unit || !g->tens) {
        graph_clear(g);
        return ctx_fail(c, NM_ERR_NOMEM, "out of memory recording a pass of %d tokens", T);
    }
    const int64_t d = hp->n_embd;
    const int32_t first_dev = hp->n_layer - c->n_dev; // layers before it run on be[1]
    g->cur_unit = first_dev > 0 ? 1 : 0;
    nm_tensor *x = rows(g, &c->x, d, 0, T);
    if (embd_in) {
        g->in = rows(g, &c->x, d, 0, T); // rebound to the caller's rows per call
    } else {
        nm_tensor *tok = rows(g, &c->tok, T, 0, 1);
        tok->type = NM_TYPE_I32;
        emit(g, (nm_op){.kind = NM_OP_GET_ROWS, .src0 = &c->m->tok_embd, .ids = tok, .dst = x});
        if (hp->embd_scale != 1.0f) emit(g, (nm_op){.kind = NM_OP_SCALE, .src0 = x, .dst = x, .f0 = hp->embd_scale});
        g->in = x;
    }
    for (int il = 0; il < hp->n_layer; il++) {
        g->cur_unit = il < first_dev ? 1 : 0;
        layer_record(c, g, il, il == 0 ? g->in : x, T);
    }
    g->cur_unit = 0;
    if (hp->n_layer == 0 && embd_in) emit(g, (nm_op){.kind = NM_OP_SCALE, .src0 = g->in, .dst = x, .f0 = 1.0f});
    // Only the rows whose logits are wanted (the last n_out) go through the (large) output head.
    const int32_t first = T - n_out, n = n_out;
    if (n > 0) {
        nm_tensor *x_out = rows(g, &c->x, d, first, n);
        nm_tensor *cur = rows(g, &c->cur, d, 0, n), *logits = rows(g, &c->logits, hp->n_vocab, 0, n);
        norm(c, g, cur, x_out, &c->m->output_norm);
        matmul(g, logits, &c->m->output, cur, NULL);
        if (hp->final_softcap > 0.0f)
            emit(g, (nm_op){.kind = NM_OP_SOFTCAP, .src0 = logits, .dst = logits, .f0 = hp->final_softcap});
    }
    if (g->overflow) {
        graph_clear(g);
        return ctx_fail(c, NM_ERR_RANGE, "a pass of %d tokens has more ops than recorded for", T);
    }
    for (int i = 0; i < g->n_ops; i++)
        if (!nm_backend_supports_op(c->be[g->unit[i]], &g->ops[i])) {
            const nm_op *op = &g->ops[i];
            const nm_type_traits *tr = op->src0 ? nm_type_traits_get(op->src0->type) : NULL;
            nm_status st = ctx_fail(c, NM_ERR_UNSUPPORTED, "device %s cannot run op %d (%s, %lld x %lld)",
                                    nm_backend_name(c->be[g->unit[i]]), op->kind, tr ? tr->name : "?",
                                    (long long)(op->src0 ? op->src0->ne[0] : 0),
                                    (long long)(op->src0 ? op->src0->ne[1] : 0));
            graph_clear(g);
            return st;
        }
    g->T = T;
    g->n_out = n_out;
    g->embd_in = embd_in;
    return NM_OK;
}

// The recorded pass for this shape, recording it in the least recently used slot if new.
static nm_status graph_get(nm_ctx *c, int32_t T, int32_t n_out, bool embd_in, graph **out) {
    graph *lru = &c->graphs[0];
    for (int i = 0; i < NM_CTX_GRAPHS; i++) {
        graph *g = &c->graphs[i];
        if (g->T == T && g->n_out == n_out && g->embd_in == embd_in) {
            g->used = ++c->tick;
            *out = g;
            return NM_OK;
        }
        if (g->used < lru->used) lru = g;
    }
    nm_status st = graph_record(c, lru, T, n_out, embd_in);
    if (st != NM_OK) return st;
    lru->used = ++c->tick;
    *out = lru;
    return NM_OK;
}

// Runs the pass: each run of ops of one unit submitted there, after the
// previous unit's work (an event: the hand-over is a fence, the data stays
// where it is), then waits for the last.
static nm_status submit(nm_ctx *c, const graph *g) {
    nm_event *prev = NULL;
    nm_backend *prev_be = NULL;
    nm_status st = NM_OK;
    for (int i = 0; i < g->n_ops && st == NM_OK;) {
        int j = i + 1;
        while (j < g->n_ops && g->unit[j] == g->unit[i]) j++;
        nm_backend *b = c->be[g->unit[i]];
        if (prev && (st = nm_backend_event_wait(b, prev)) != NM_OK) {
            ctx_fail(c, st, "%s", nm_backend_last_error(b));
            break;
        }
        if (prev) nm_backend_event_free(prev_be, prev);
        prev = NULL;
        if ((st = nm_backend_submit(b, g->ops + i, j - i)) != NM_OK) {
            ctx_fail(c, st, "%s", nm_backend_last_error(b));
            break;
        }
        if (j < g->n_ops && !(prev = nm_backend_event_record(b))) {
            st = ctx_fail(c, NM_ERR_IO, "%s", nm_backend_last_error(b));
            break;
        }
        prev_be = b;
        i = j;
    }
    if (prev) nm_backend_event_free(prev_be, prev);
    for (int k = 0; k < c->n_be; k++) { // both, even after a failure: nothing of this pass left queued
        nm_status s2 = nm_backend_synchronize(c->be[k]);
        if (st == NM_OK && s2 != NM_OK) st = ctx_fail(c, s2, "%s", nm_backend_last_error(c->be[k]));
    }
    return st;
}

// The short convolutions' state before a pass of T rows (their cache ids in pos_host): each sequence's rows
// in order and consecutive, from a position whose state is kept (in the ring, or at a checkpoint: then
// copied into the ring). first[s]: the sequence's first position in the pass, -1 if none; next[s]: after
// its last.
static nm_status conv_begin(nm_ctx *c, int32_t T, int32_t *first, int32_t *next) {
    const nm_hparams *hp = &c->m->hp;
    const int32_t L1 = hp->conv_l - 1, ncp = (c->n_ctx - 1) / c->cs_step;
    for (int32_t s = 0; s < c->n_seq; s++) first[s] = next[s] = -1;
    for (int32_t i = 0; i < T; i++) {
        const int32_t id = c->pos_host[c->n_batch + i], s = id / c->n_ctx, p = id % c->n_ctx;
        if (first[s] >= 0 && p != next[s])
            return ctx_fail(c, NM_ERR_INVALID_ARG, "sequence %d: position %d after %d in one pass (a model with short "
                            "convolutions takes a sequence's positions in order)", s, p, next[s] - 1);
        if (first[s] < 0) first[s] = p;
        next[s] = p + 1;
    }
    for (int32_t s = 0; s < c->n_seq; s++) {
        const int32_t p = first[s];
        if (p < 0) continue;
        if (p > c->cs_hi[s])
            return ctx_fail(c, NM_ERR_RANGE, "sequence %d: position %d is past the %d decoded (a model with short "
                            "convolutions goes on from its state)", s, p, c->cs_hi[s]);
        if (p == 0) { // (nothing before it: zeros)
            c->cs_lo[s] = c->cs_hi2[s] = 0;
            continue;
        }
        if ((p - L1 < 0 ? 0 : p - L1) >= c->cs_lo[s] && p <= c->cs_hi2[s]) continue; // in the ring
        if (p % c->cs_step || p / c->cs_step > ncp)
            return ctx_fail(c, NM_ERR_RANGE, "sequence %d: no state kept at position %d (the last %d positions and "
                            "every %d-th are: nm_ctx_resume_pos)", s, p, c->cs_ring - L1, c->cs_step);
        // the checkpoint's L - 1 rows into the ring, every layer's
        const size_t d = (size_t)hp->n_embd, row = d * sizeof(float);
        float *tmp = malloc(row * (size_t)L1);
        if (!tmp) return ctx_fail(c, NM_ERR_NOMEM, "out of memory restoring a state");
        nm_status st = NM_OK;
        for (int il = 0; il < hp->n_layer && st == NM_OK; il++) {
            const nm_tensor *t = &c->cstate[il];
            if (!c->m->layers[il].conv) continue;
            const size_t base = (size_t)s * (size_t)c->cs_rows;
            const size_t cp = base + (size_t)c->cs_ring + (size_t)(p / c->cs_step - 1) * (size_t)L1;
            st = nm_backend_tensor_get(c->mem, t, cp * row, tmp, row * (size_t)L1);
            for (int32_t j = 0; j < L1 && st == NM_OK; j++)
                st = nm_backend_tensor_set(c->mem, t, (base + (size_t)((p - L1 + j) % c->cs_ring)) * row, tmp + j * d,
                                           row);
        }
        free(tmp);
        if (st != NM_OK) return ctx_fail(c, st, "restoring a state: %s", nm_backend_last_error(c->mem));
        c->cs_lo[s] = p - L1;
        c->cs_hi2[s] = p;
    }
    return NM_OK;
}

// After the pass (ok or not): what the ring and the checkpoints of each sequence in it hold.
static void conv_end(nm_ctx *c, const int32_t *first, const int32_t *next, bool ok) {
    for (int32_t s = 0; s < c->n_seq; s++) {
        if (first[s] < 0) continue;
        if (!ok) { // (what the pass wrote is unknown: the sequence starts again)
            c->cs_lo[s] = c->cs_hi2[s] = c->cs_hi[s] = 0;
            continue;
        }
        c->cs_hi[s] = c->cs_hi2[s] = next[s];
        if (c->cs_lo[s] < next[s] - c->cs_ring) c->cs_lo[s] = next[s] - c->cs_ring;
    }
}

int32_t nm_ctx_resume_pos(const nm_ctx *c, int32_t seq, int32_t pos) {
    if (!c || seq < 0 || seq >= c->n_seq || pos <= 0) return 0;
    if (pos > c->n_ctx) pos = c->n_ctx;
    if (!c->m->hp.n_conv) return pos;
    const int32_t L1 = c->m->hp.conv_l - 1, ncp = (c->n_ctx - 1) / c->cs_step;
    if (pos > c->cs_hi[seq]) pos = c->cs_hi[seq];
    if ((pos - L1 < 0 ? 0 : pos - L1) >= c->cs_lo[seq] && pos <= c->cs_hi2[seq]) return pos;
    const int32_t q = pos / c->cs_step;
    return q > ncp ? ncp * c->cs_step : q * c->cs_step;
}

// Writes the inputs (the positions and cache ids already in pos_host),
// submits the pass, waits, and exposes the logits of the last n_out rows.
static nm_status forward(nm_ctx *c, const int32_t *tokens, const float *embd, int32_t T, int32_t n_out) {
    const nm_hparams *hp = &c->m->hp;
    graph *g;
    nm_status st = graph_get(c, T, n_out, embd != NULL, &g);
    if (st != NM_OK) return st;
    if ((st = nm_backend_tensor_set(c->mem, &c->pos, 0, c->pos_host, sizeof(int32_t) * (size_t)T)) != NM_OK ||
        (c->n_seq > 1 &&
         (st = nm_backend_tensor_set(c->mem, &c->kvpos, 0, c->pos_host + c->n_batch, sizeof(int32_t) * (size_t)T)) != NM_OK) ||
        (tokens && (st = nm_backend_tensor_set(c->mem, &c->tok, 0, tokens, sizeof(int32_t) * (size_t)T)) != NM_OK) ||
        (c->n_shift &&
         (st = nm_backend_tensor_set(c->mem, &c->rpos, 0, c->pos_host + 2 * c->n_batch, sizeof(int32_t) * 3 * (size_t)T)) != NM_OK))
        return ctx_fail(c, st, "writing the inputs: %s", nm_backend_last_error(c->mem));
    if (embd) {
        if (c->n_be == 2 || c->caps.host_memory) { // read where the caller put them (another brick's slot)
            g->in->buf = NULL;
            g->in->offs = (size_t)(uintptr_t)embd;
        } else if ((st = nm_backend_tensor_set(c->mem, &c->x, 0, embd, sizeof(float) * (size_t)T * (size_t)hp->n_embd)) != NM_OK) {
            return ctx_fail(c, st, "writing the embeddings: %s", nm_backend_last_error(c->mem));
        }
    }
    int32_t first[256], next[256]; // (n_seq <= 256)
    if (hp->n_conv && (st = conv_begin(c, T, first, next)) != NM_OK) return st;
    st = submit(c, g);
    if (hp->n_conv) conv_end(c, first, next, st == NM_OK);
    if (st != NM_OK) return st;
    if (c->logits_host && n_out > 0 &&
        (st = nm_backend_tensor_get(c->mem, &c->logits, 0, c->logits_host, sizeof(float) * (size_t)n_out * hp->n_vocab)) != NM_OK)
        return ctx_fail(c, st, "reading the logits: %s", nm_backend_last_error(c->mem));
    c->n_out = n_out;
    c->out_first = T - n_out;
    return NM_OK;
}

// Checks a run of n positions from pos in sequence seq and stages them.
static nm_status check_batch(nm_ctx *c, int32_t n, int32_t pos, int32_t seq) {
    c->err[0] = '\0';
    c->n_out = 0;
    if (n <= 0 || n > c->n_batch) return ctx_fail(c, NM_ERR_RANGE, "batch of %d tokens (1..%d allowed)", n, c->n_batch);
    if (pos < 0 || pos > c->n_ctx - n)
        return ctx_fail(c, NM_ERR_RANGE, "positions %d..%d do not fit in a context of %d", pos, pos + n - 1, c->n_ctx);
    if (seq < 0 || seq >= c->n_seq)
        return ctx_fail(c, NM_ERR_RANGE, "sequence %d: the context holds %d (0..%d)", seq, c->n_seq, c->n_seq - 1);
    for (int32_t i = 0; i < n; i++) {
        c->pos_host[i] = pos + i;
        c->pos_host[c->n_batch + i] = seq * c->n_ctx + pos + i;
    }
    if (c->n_shift) { // text: the three streams at the rope position
        forget_from(c, seq, pos);
        int32_t *rs = c->pos_host + 2 * c->n_batch;
        for (int32_t i = 0; i < n; i++) rs[i] = rs[n + i] = rs[2 * n + i] = rope_pos(c, seq, pos + i);
    }
    return NM_OK;
}

static nm_status check_tokens(nm_ctx *c, const int32_t *tokens, int32_t n) {
    const int32_t n_vocab = c->m->hp.n_vocab;
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= n_vocab)
            return ctx_fail(c, NM_ERR_RANGE, "token id %d out of range [0, %d)", tokens[i], n_vocab);
    return NM_OK;
}

nm_status nm_decode(nm_ctx *c, const int32_t *tokens, int32_t n, int32_t pos, bool all_logits) {
    nm_status st;
    if (!c || !tokens) return NM_ERR_INVALID_ARG;
    // (the tokens checked first: a refused call leaves the context as it was, M-RoPE's images too)
    if ((st = check_tokens(c, tokens, n)) || (st = check_batch(c, n, pos, 0))) return st;
    return forward(c, tokens, NULL, n, all_logits ? n : 1);
}

nm_status nm_decode_embd(nm_ctx *c, const float *embd, int32_t n, int32_t pos, bool all_logits) {
    return nm_decode_embd_seq(c, embd, n, pos, 0, all_logits);
}

nm_status nm_decode_embd_seq(nm_ctx *c, const float *embd, int32_t n, int32_t pos, int32_t seq, bool all_logits) {
    nm_status st;
    if (!c || !embd) return NM_ERR_INVALID_ARG;
    if ((st = check_batch(c, n, pos, seq))) return st;
    return forward(c, NULL, embd, n, all_logits ? n : 1);
}

nm_status nm_decode_embd_grid(nm_ctx *c, const float *embd, int32_t nx, int32_t ny, int32_t pos, int32_t seq,
                              bool all_logits) {
    if (!c || !embd || nx <= 0 || ny <= 0 || (int64_t)nx * ny > INT32_MAX) return NM_ERR_INVALID_ARG;
    const int32_t n = nx * ny;
    if (!c->n_shift) { // one position a token, in batches of n_batch (the last's logits kept)
        for (int32_t i0 = 0; i0 < n; i0 += c->n_batch) {
            const int32_t m = n - i0 < c->n_batch ? n - i0 : c->n_batch;
            nm_status st = nm_decode_embd_seq(c, embd + (size_t)i0 * c->m->hp.n_embd, m, pos + i0, seq, all_logits);
            if (st != NM_OK) return st;
        }
        return NM_OK;
    }
    if (seq < 0 || seq >= c->n_seq)
        return ctx_fail(c, NM_ERR_RANGE, "sequence %d: the context holds %d (0..%d)", seq, c->n_seq, c->n_seq - 1);
    if (pos < 0 || pos > c->n_ctx - n)
        return ctx_fail(c, NM_ERR_RANGE, "positions %d..%d do not fit in a context of %d", pos, pos + n - 1, c->n_ctx);
    int32_t kept = 0; // the images before pos (those from pos on are decoded over)
    for (int32_t i = 0; i < c->n_shift[seq]; i++) kept += c->shift[seq][i][0] <= pos;
    if (kept == NM_MROPE_IMAGES)
        return ctx_fail(c, NM_ERR_RANGE, "sequence %d already holds %d images (the most M-RoPE tracks)", seq,
                        NM_MROPE_IMAGES);
    forget_from(c, seq, pos);
    // token i at row i / nx, column i % nx: (p0, p0 + row, p0 + column) from the image's rope position p0
    const int32_t p0 = rope_pos(c, seq, pos);
    for (int32_t i0 = 0; i0 < n; i0 += c->n_batch) {
        const int32_t m = n - i0 < c->n_batch ? n - i0 : c->n_batch;
        nm_status st = check_batch(c, m, pos + i0, seq);
        if (st != NM_OK) return st;
        int32_t *rs = c->pos_host + 2 * c->n_batch;
        for (int32_t j = 0; j < m; j++) {
            const int32_t i = i0 + j;
            rs[j] = p0;
            rs[m + j] = p0 + i / nx;
            rs[2 * m + j] = p0 + i % nx;
        }
        if ((st = forward(c, NULL, embd + (size_t)i0 * c->m->hp.n_embd, m, all_logits ? m : 1)) != NM_OK) return st;
    }
    c->shift[seq][c->n_shift[seq]][0] = pos + n; // what follows the image is max(nx, ny) on from p0
    c->shift[seq][c->n_shift[seq]][1] = (nx > ny ? nx : ny) - n;
    c->n_shift[seq]++;
    return NM_OK;
}

nm_status nm_decode_seqs(nm_ctx *c, const int32_t *tokens, const int32_t *pos, const int32_t *seq, int32_t n,
                         int32_t n_logits) {
    if (!c || !tokens || !pos || !seq) return NM_ERR_INVALID_ARG;
    c->err[0] = '\0';
    c->n_out = 0;
    if (n <= 0 || n > c->n_batch) return ctx_fail(c, NM_ERR_RANGE, "batch of %d tokens (1..%d allowed)", n, c->n_batch);
    if (n_logits < 0 || n_logits > n)
        return ctx_fail(c, NM_ERR_RANGE, "logits of the last %d rows of a batch of %d", n_logits, n);
    for (int32_t i = 0; i < n; i++) {
        if (seq[i] < 0 || seq[i] >= c->n_seq)
            return ctx_fail(c, NM_ERR_RANGE, "row %d: sequence %d: the context holds %d (0..%d)", i, seq[i], c->n_seq,
                            c->n_seq - 1);
        if (pos[i] < 0 || pos[i] >= c->n_ctx)
            return ctx_fail(c, NM_ERR_RANGE, "row %d: position %d outside a context of %d", i, pos[i], c->n_ctx);
        for (int32_t j = 0; j < i; j++) // (a batch is at most n_batch rows, and checked once)
            if (seq[j] == seq[i] && pos[j] == pos[i])
                return ctx_fail(c, NM_ERR_INVALID_ARG, "rows %d and %d: the same position %d of sequence %d", j, i,
                                pos[i], seq[i]);
        c->pos_host[i] = pos[i];
        c->pos_host[c->n_batch + i] = seq[i] * c->n_ctx + pos[i];
    }
    nm_status st = check_tokens(c, tokens, n); // (before any image is forgotten)
    if (st != NM_OK) return st;
    if (c->n_shift) {
        for (int32_t i = 0; i < n; i++) forget_from(c, seq[i], pos[i]); // (a sequence's rows come in order)
        int32_t *rs = c->pos_host + 2 * c->n_batch;
        for (int32_t i = 0; i < n; i++) rs[i] = rs[n + i] = rs[2 * n + i] = rope_pos(c, seq[i], pos[i]);
    }
    return forward(c, tokens, NULL, n, n_logits);
}

const float *nm_get_logits(const nm_ctx *c, int32_t i) {
    if (!c || c->n_out == 0) return NULL;
    if (i < 0) i = c->out_first + c->n_out - 1;
    if (i < c->out_first || i >= c->out_first + c->n_out) return NULL;
    const float *base = c->logits_host ? c->logits_host : nm_tensor_host(&c->logits);
    return base + (size_t)(i - c->out_first) * c->m->hp.n_vocab;
}

uint64_t nm_ctx_buffer_bytes(const nm_ctx *c) {
    return (c->arena ? c->arena->size : 0) + (c->kvbuf ? c->kvbuf->size : 0);
}
