// The decoder's cost for a request, from its shapes: what the planner
// multiplies with a unit's measured speeds (docs/bricks.md, "Estimates").
//
// A forward pass over n rows multiplies every matmul weight of the layers by
// n rows (2 * rows * cols FLOPs per row) and reads the weight once; the
// output head runs on the last row only (the logits of a prompt's last token,
// or of each generated token). Attention at position t reads t + 1 cached
// positions (a sliding-window layer at most the window): q.k and p.v are
// 2 * head_dim FLOPs per head and position each.
#include <string.h>

#include "bricks/brick_impl.h"
#include "bricks/llm/llm.h"
#include "quant/quant.h"

// A layer's matmul weights (attention's or a short convolution's projections, the FFN's); unset ones skipped.
#define LAYER_WEIGHTS(L) {&(L)->wq, &(L)->wk, &(L)->wv, &(L)->wo, &(L)->ffn_gate, &(L)->ffn_up, &(L)->ffn_down, \
                          &(L)->conv_in, &(L)->conv_out}

static double layer_weight_bytes(const nm_layer *L) {
    const nm_tensor *w[] = LAYER_WEIGHTS(L);
    double b = 0;
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
        if (nm_tensor_is_set(w[i])) b += (double)nm_row_size(w[i]->type, w[i]->ne[0]) * (double)w[i]->ne[1];
    return b;
}

// Ops a pass dispatches for layer L: those forward.c's layer_record emits
// (norm, q/k/v, rope x2, KV store, attention, o, add, norm, gate, up, GLU,
// down, add; gemma3's head norms and post-norms where the layer has them;
// a short convolution's norm, in_proj, convolution, out_proj, add: 5 in
// place of the attention block's 9).
static double layer_ops(const nm_layer *L) {
    return (L->conv ? 11.0 : 15.0) + (nm_tensor_is_set(&L->q_norm) ? 2 : 0) +
           (nm_tensor_is_set(&L->post_attn_norm) ? 1 : 0) + (nm_tensor_is_set(&L->post_ffn_norm) ? 1 : 0);
}

// Positions a query at position t attends in layer L.
static double attended(const nm_hparams *hp, const nm_layer *L, int64_t t) {
    double n = (double)t + 1;
    if (L->swa && hp->n_swa > 0 && n > hp->n_swa) n = hp->n_swa;
    return n;
}

void nm_llm_estimate_model(const nm_model *m, const nm_ctx *c, const nm_brick_input *in, nm_brick_cost *e) {
    memset(e, 0, sizeof *e);
    const nm_hparams *hp = &m->hp;
    const int64_t n_batch = c ? nm_ctx_n_batch(c) : 512;
    const int64_t n_tok = in->n_tokens > 0 ? in->n_tokens : 0, n_gen = in->n_predict > 0 ? in->n_predict : 0;
    const int64_t past = in->n_past > 0 ? in->n_past : 0;
    const int64_t passes_prompt = (n_tok + n_batch - 1) / n_batch;
    const double rows = (double)(n_tok + n_gen); // every position through every layer once
    double wbytes_layers = 0, ops_pass = 0;
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const nm_layer *L = &m->layers[il];
        ops_pass += layer_ops(L);
        const nm_tensor *w[] = LAYER_WEIGHTS(L);
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) nm_cost_matmul(e, w[i], rows, 0);
        wbytes_layers += layer_weight_bytes(L);
        if (L->conv) { // b x, the taps, the gate: (L + 2) multiply-adds a channel; the state's row in and out
            const double f = 2.0 * (hp->conv_l + 2) * (double)hp->n_embd * rows;
            e->flops += f;
            e->flops_by_type[0] += f;
            e->act_bytes += 4.0 * (double)hp->n_embd * (double)hp->conv_l * rows;
            continue;
        }
        double att = 0; // positions attended, summed over the request's rows
        for (int64_t t = past; t < past + n_tok + n_gen; t++) att += attended(hp, L, t);
        const double f = 4.0 * (double)hp->n_head * (double)hp->head_dim * att;
        e->flops += f;
        e->flops_by_type[0] += f;
        // K and V read per attended position, K and V written per row (f16)
        e->act_bytes += 2.0 * 2.0 * (double)hp->n_head_kv * (double)hp->head_dim * (att + rows);
    }
    // norms, activations, residual adds: a few operations per element of each row
    const double elem = rows * (double)hp->n_layer * (8.0 * hp->n_embd + 4.0 * hp->n_ff);
    e->flops += elem;
    e->flops_by_type[0] += elem;
    e->act_bytes += 4.0 * elem;
    // the output head: the last row of each prompt pass that ends the prompt, and every generated token
    const double head_rows = (double)((n_tok > 0 ? 1 : 0) + n_gen);
    nm_cost_matmul(e, &m->output, head_rows, 0);
    const double head_bytes = (double)nm_row_size(m->output.type, m->output.ne[0]) * (double)m->output.ne[1];
    e->n_passes = passes_prompt + n_gen;
    // and per pass: the embedding lookup (and its scale), the output norm, the head (and its softcap)
    ops_pass += 3.0 + (hp->embd_scale != 1.0f ? 1 : 0) + (hp->final_softcap > 0.0f ? 1 : 0);
    e->n_ops = ops_pass * (double)e->n_passes;
    e->weight_bytes_read = (wbytes_layers) * (double)e->n_passes + head_bytes * head_rows;
    e->weight_bytes = m->weight_bytes;
    e->peak_bytes = m->weight_bytes + (c ? nm_ctx_buffer_bytes(c) : 0);
    e->n_out = n_gen;
}
