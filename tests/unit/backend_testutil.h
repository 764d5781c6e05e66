// Backends and tensors for the op tests: a CPU backend by its parameters,
// host tensors of ids and caches.
#ifndef NM_BACKEND_TESTUTIL_H
#define NM_BACKEND_TESTUTIL_H

#include <stdio.h>

#include "backend/backend.h"
#include "quant/quant.h"

// A CPU backend; attn_seq > 0 sizes NM_OP_ATTENTION_FULL for sequences up to
// attn_seq tokens of heads up to attn_hd. NULL (with a message) on failure.
static inline nm_backend *cpu_backend_attn(int n_threads, int64_t max_row, int64_t max_tokens, int64_t attn_seq,
                                           int64_t attn_hd) {
    const nm_backend_params p = {.n_threads = n_threads, .max_row = max_row, .max_tokens = max_tokens,
                                 .attn_max_seq = attn_seq, .attn_head_dim = attn_hd};
    nm_backend *be = NULL;
    char err[256] = "";
    if (nm_backend_create("cpu", &p, &be, err, sizeof err) != NM_OK) fprintf(stderr, "cpu backend: %s\n", err);
    return be;
}

static inline nm_backend *cpu_backend(int n_threads, int64_t max_row, int64_t max_tokens) {
    return cpu_backend_attn(n_threads, max_row, max_tokens, 0, 0);
}

static inline int cpu_backend_threads(const nm_backend *be) {
    nm_backend_caps caps;
    nm_backend_get_caps(be, &caps);
    return caps.n_threads;
}

// An i32 tensor of n ids at p (token ids, positions), for nm_op.ids.
#define IDT(p, n) (&(nm_tensor){.type = NM_TYPE_I32, .ne = {(n), 1, 1, 1}, .offs = (size_t)(uintptr_t)(p)})

// pos, pos + 1, ..., pos + n - 1 in buf (n <= cap).
static inline const int32_t *seq_ids(int32_t *buf, int32_t pos, int n) {
    for (int i = 0; i < n; i++) buf[i] = pos + i;
    return buf;
}

// The f16 caches k and v, rows of w, n_ctx rows.
static inline nm_kv_layer kv_at(uint16_t *k, uint16_t *v, int64_t w, int64_t n_ctx) {
    nm_kv_layer kv = {nm_tensor_at(k, NM_TYPE_F16, w, n_ctx), nm_tensor_at(v, NM_TYPE_F16, w, n_ctx)};
    return kv;
}

#endif
