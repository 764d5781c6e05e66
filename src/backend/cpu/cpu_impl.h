// The CPU backend's parts (cpu_backend.c: the ops, the matmuls, the vtable;
// cpu_attention.c: causal attention over the KV cache and the encoders'
// bidirectional attention): the backend's state and what both parts use.
#ifndef NM_CPU_IMPL_H
#define NM_CPU_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "backend/cpu/gemm.h"
#include "core/threadpool.h"
#include "quant/quant.h"

// Host addresses of an op's tensors: the CPU computes on host memory only
// (its own buffers and the host's; supports_op refuses others).
#define TD(t) nm_tensor_host(t)
#define IDS(op) ((const int32_t *)TD((op)->ids))
#define KVK(op) ((uint16_t *)TD(&(op)->kv->k))
#define KVV(op) ((uint16_t *)TD(&(op)->kv->v))
#define KVROWS(op) ((op)->kv_rows ? (const int32_t *)TD((op)->kv_rows) : NULL)
// The cache row of position j: rows[j] when the op maps positions to rows.
#define KVROW(rows, j) ((rows) ? (int64_t)(rows)[j] : (int64_t)(j))
// The first key a query with cache id p attends: its sequence's first row
// (ids are s x n_ctx + position when the cache holds several), or the
// sliding window's start.
static inline int64_t attn_lo(const nm_op *op, int64_t p) {
    const int64_t base = p / op->n_ctx * op->n_ctx, w = op->i3;
    return w > 0 && p - w + 1 > base ? p - w + 1 : base;
}


typedef struct nm_cpu {
    nm_pool *pool;
    const nm_kernels *k;    // chosen for this CPU; the reference fills its holes
    const nm_kernels *kref; // what supports_op checks: a type is supported if it has a reference
    nm_gemm_fn gemm;
    const nm_gemm_panel_kernels *pk; // AVX-512 panel GEMM and softmax; NULL: none on this CPU
    nm_expsum_fn expsum;
    nm_xsigmoid_fn xsigmoid;
    int64_t max_row, max_tokens;
    float *scratch; // (n_threads, NM_MM_ROWS, max_row), or (n_threads, NM_MM_XROWS, max_row + 16) with pk
    float *xpack;   // (ceil16(max_tokens), max_row), 64-aligned: activations in 16-token panels for pk->gemm
    uint8_t *act_q; // (max_tokens, max_row * 4 bytes): activations in the weights' vec_dot_type
    uint8_t *gemv_prep; // (NM_MM_GROUP, NM_SMALL_BATCH, gemv_prep_bytes), 64-aligned: decode activations (one a
                        // token of a small batch) as each gemv wants them
    uint8_t *act_pack;  // (ceil(max_tokens / NM_GQP_TOK), NM_GQP_BYTES(max_row)), 64-aligned, where the
                        // kernels have packed prefill: act_q in token groups for gemmq_packed; else NULL
    size_t gemv_prep_bytes;
    bool no_small_batch; // NM_NO_SMALL_BATCH=1: small batches through the GEMM (the A/B of small_batch)
    bool no_multi;       // NM_NO_GEMV_MULTI=1: small batches through gemv a token at a time (the A/B of gemv_multi)
    float *attn_ws; // (n_threads, attn_ws_floats): NM_OP_ATTENTION_FULL workspace
    int64_t attn_ws_floats, attn_max_seq, attn_max_hd;
    // NM_PROFILE=1: wall time per (op kind, weight type), printed to stderr by cpu_free;
    // prof_inner: inside compute_rowwise_by_token, whose op is counted once, outside
    bool prof, prof_inner;
    struct {
        double s, bytes;
        int64_t calls;
    } prof_acc[NM_OP_COUNT][NM_TYPE_COUNT];
    // the convolutions' weights packed by prepare_op (sorted by host address and kind), the
    // threads' workspace of the largest, grown as they are prepared
    struct cpu_conv *convs;
    int32_t n_convs, cap_convs;
    float *conv_work;
    int64_t conv_work_floats;
    char err[256];
} nm_cpu;

// x[0..n) rounded to f16 and back, in place, with the chosen (F16C) kernels.
static inline void round_f16(const nm_cpu *c, float *x, int64_t n) {
    uint16_t h[256];
    for (int64_t i = 0; i < n; i += 256) {
        const int64_t m = n - i < 256 ? n - i : 256;
        c->k->quant_act[NM_TYPE_F16](x + i, h, m);
        c->k->dequant[NM_TYPE_F16](h, x + i, m);
    }
}

// ---- attention (cpu_attention.c) ------------------------------------------------------------

typedef struct attn_task {
    const nm_cpu *c;
    const nm_op *op;
} attn_task;

#define NM_ATTN_GGML_MAX 8192 // NM_OPF_GGML_F16 attention: the most keys (its scores on the stack)
#define NM_ATTN_SHARED_MAX 16384 // attn_shared_worker: queries x keys of the scores on the stack
// The encoders' attention (fa_worker) and the prefill's panel attention take queries in blocks of NM_FA_QB.
#define NM_FA_QB 32
typedef struct fa_task {
    const nm_cpu *c;
    const nm_op *op;
    int64_t n_groups; // query groups per head
} fa_task;

// Prefill of NM_ATTN_PANEL_MIN_TOKENS tokens or more goes through attn_panel_worker (AVX-512 panels).
#define NM_ATTN_PANEL_MIN_TOKENS 16
// Blocks that see more keys than this run one query at a time (attn_one),
// which needs no workspace: the panel path's grows with the keys (4096 keys
// of 128 dims: 4.7 MiB a thread).
#define NM_ATTN_PANEL_MAX_KEYS 4096

typedef struct attn_blocks {
    const nm_cpu *c;
    const nm_op *op;
    int64_t n_blocks;
} attn_blocks;

// One query row of a cache's attention a chunk (attn_task; chunks T x n_head).
void attn_worker(void *arg, int64_t i, int ith);
// NM_OPF_GGML_F16 queries at one position over the same keys (Whisper's beams): a chunk a head.
void attn_shared_worker(void *arg, int64_t h, int ith);
// The keys [klo, khi] that queries [t0, t1) of op see.
void attn_key_range(const nm_op *op, int64_t t0, int64_t t1, int64_t *klo, int64_t *khi);
// Prefill on the AVX-512 panels (attn_blocks; chunks n_blocks x n_head).
void attn_panel_worker(void *arg, int64_t chunk, int ith);
// The floats of one thread's workspace for T queries and keys of hd dims (fa_worker, attn_panel_worker).
int64_t fa_ws_floats(int64_t T, int64_t hd);
// NM_OP_ATTENTION_FULL (fa_task); fa_supported: its shapes fit the reserved workspace.
void fa_worker(void *arg, int64_t chunk, int ith);
bool fa_supported(const nm_cpu *c, const nm_op *op);

#endif
