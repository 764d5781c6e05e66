// CPU backend: ops on f32 activations with fused dequantizing kernels chosen
// once for this CPU (src/quant), parallel over a persistent thread pool.
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/registry.h"
#include "backend/cpu/conv1d.h"
#include "backend/cpu/cpu_impl.h"
#include "backend/cpu/gemm.h"
#include "core/clock.h"
#include "core/threadpool.h"
#include "quant/quant.h"

static nm_status reserve_attn(nm_backend *b, int64_t max_seq, int64_t head_dim);

// Rows of a batched matmul dequantized together into a thread's scratch: the
// tile (NM_MM_ROWS x max_row floats) stays in L2 while every token of the
// batch is multiplied with it, so each weight block is read and unpacked once
// per batch instead of once per token.
#define NM_MM_ROWS 16
// Tokens per GEMM call: the block of activations (NM_MM_TOKENS x K floats)
// stays in L2 while the tile's rows sweep over it.
#define NM_MM_TOKENS 48
// Tokens from which the AVX-512 panel GEMM pays for packing the activations
// (T x K copies, once per matmul).
#define NM_MM_PACK_MIN_TOKENS 8
// Rows of a chunk of the panel GEMM: four of its 12-row blocks share each
// pair of activation panels while it is in L1/L2.
#define NM_MM_XROWS (4 * NM_GEMM_XPANEL_ROWS)

// Chunks of a decode matmul, guided, in rounds: each round gives every thread
// one chunk of 1/(2 n_threads) of the rows left (at least NM_MM_DEC_ROWS;
// claiming a chunk, one atomic, stays noise next to its dots), so the first
// chunks are long runs of consecutive rows and the last ones short. Long
// runs: 32-row chunks taken in turn by two threads cut the hardware
// prefetchers' streams every 20 KB (Gemma 3's head, 262144 x 640 q8_0, two
// threads on an AMD EPYC: 19-20 GB/s with 32-row chunks, 28-30 with 256 rows
// or more, against 43 GB/s that plain loads reach). Short last chunks: a
// thread that is held up (the OS, another process) leaves the other threads a
// short wait, not a quarter of the matrix. A chunk's rows are found in one
// step per round (the rows left halve each round).
#define NM_MM_DEC_ROWS 32

// The round that starts at row `start`: its chunks' size (*size) and count.
static int64_t dec_round(int64_t O, int n_threads, int64_t start, int64_t *size) {
    const int64_t left = O - start, want = (left + 2 * n_threads - 1) / (2 * n_threads);
    *size = want > NM_MM_DEC_ROWS ? want : NM_MM_DEC_ROWS;
    const int64_t fit = (left + *size - 1) / *size;
    return fit < n_threads ? fit : n_threads;
}

// Rows [*r0, *r1) of decode chunk c of a matmul of O rows; false past the last.
static bool dec_chunk(int64_t O, int n_threads, int64_t c, int64_t *r0, int64_t *r1) {
    for (int64_t start = 0, size; start < O;) {
        const int64_t n = dec_round(O, n_threads, start, &size);
        if (c < n) {
            *r0 = start + c * size;
            *r1 = *r0 + size < O ? *r0 + size : O;
            return true;
        }
        c -= n;
        start += n * size;
    }
    return false;
}

static int64_t dec_chunks(int64_t O, int n_threads) {
    int64_t count = 0;
    for (int64_t start = 0, size; start < O;) {
        const int64_t n = dec_round(O, n_threads, start, &size);
        count += n;
        start += n * size;
    }
    return count;
}

// Decode reads each weight row once per token, from DRAM. Prefetching the row
// NM_PREFETCH_ROWS ahead into L1 (quant.h; prefetcht0: the non-temporal hint
// was much worse) lifts SmolLM2 decode from ~110 to ~180 tok/s on 2 threads:
// the integer dot is too busy per byte for the hardware prefetchers to keep
// ahead. A second prefetch NM_PREFETCH_FAR_BYTES ahead into L2 keeps more
// lines in flight than L1's miss buffers allow.
// Rows per block of the one-token-at-a-time dot loop over several tokens
// (mmq_worker): this many bytes of weights, read from L1 by every token.
#define NM_ROWWISE_BLOCK_BYTES 16384

// ---- matmul ------------------------------------------------------------------------

// Up to NM_MM_GROUP matmuls that read the same activations (Q, K and V; gate
// and up) run as one job: the activations are quantized once and the pool
// synchronises once. Chunks [off[i], off[i+1]) belong to ops[i].
#define NM_MM_GROUP 4
#define NM_SMALL_BATCH NM_GEMV_MULTI_MAX // most rows of a matmul decoded as a small batch (small_batch)

typedef struct mm_task {
    const nm_cpu *c;
    const nm_op *op;              // the first (or only) op
    uint32_t act_type;            // nm_vec_dot_type of the weights
    size_t act_row;               // bytes of one quantized activation row
    const nm_op *ops[NM_MM_GROUP];
    int n_ops;
    const float *x; // mm_worker: activations to use instead of src1 (NULL: src1)
    bool packed;    // act_q is also in c->act_pack (prefill): ops with a gemmq_packed kernel use it
    int64_t off[NM_MM_GROUP + 1];
} mm_task;

// A small batch (2..NM_SMALL_BATCH rows: the sequences a server decodes
// together) runs as decode does, through the type's gemv kernel, a token at a
// time over a block of rows while the block is in L1: the weights come from
// DRAM once for every row of the batch, and each row's result has the bits it
// has decoded alone. (The GEMM's 4-token tiles cost 3.2x one token for 4.)
static bool small_batch(const nm_cpu *c, const nm_op *op) {
    const int64_t T = op->src1->ne[1];
    return T > 1 && T <= NM_SMALL_BATCH && !(op->flags & NM_OPF_ROWWISE) && c->k->gemv[op->src0->type] != NULL &&
           !c->no_small_batch;
}

static uint8_t *gemv_prep_of(const nm_cpu *c, int g, int64_t tok) {
    return c->gemv_prep + ((size_t)g * NM_SMALL_BATCH + (size_t)tok) * c->gemv_prep_bytes;
}

// Quantizes activation row `chunk` into the weights' vec_dot_type. In decode
// (one row, or a small batch) it also lays the row out for each op's gemv kernel, if it has one.
static void act_worker(void *arg, int64_t chunk, int ith) {
    const mm_task *t = arg;
    const nm_cpu *c = t->c;
    const int64_t K = t->op->src1->ne[0];
    uint8_t *xq = c->act_q + chunk * t->act_row;
    c->k->quant_act[t->act_type]((const float *)TD(t->op->src1) + chunk * K, xq, K);
    for (int g = 0; g < t->n_ops; g++) {
        nm_gemv_prep_fn prep = c->k->gemv_prep[t->ops[g]->src0->type];
        if (prep && (t->op->src1->ne[1] == 1 || small_batch(c, t->ops[g]))) prep(xq, K, gemv_prep_of(c, g, chunk));
    }
}

// act_q's token group `chunk` into act_pack (prefill, once for the group of matmuls).
static void pack_worker(void *arg, int64_t chunk, int ith) {
    const mm_task *t = arg;
    const nm_cpu *c = t->c;
    const int64_t K = t->op->src1->ne[0], T = t->op->src1->ne[1], t0 = chunk * NM_GQP_TOK;
    c->k->gemmq_pack[t->act_type](c->act_q + (size_t)t0 * t->act_row, t->act_row,
                                  T - t0 < NM_GQP_TOK ? T - t0 : NM_GQP_TOK, K,
                                  c->act_pack + (size_t)chunk * NM_GQP_BYTES(K));
}

// y[tok][o] += bias[o] for rows [r0, r1) of T tokens of O outputs (bias NULL: none).
static void add_bias(float *y, const float *bias, int64_t O, int64_t r0, int64_t r1, int64_t T) {
    if (bias)
        for (int64_t tok = 0; tok < T; tok++)
            for (int64_t o = r0; o < r1; o++) y[tok * O + o] += bias[o];
}

// Quantized weights: activations were quantized once per op to the weights'
// vec_dot_type (8-bit blocks for the Q and K formats, as llama.cpp does), so
// every (row, token) product is an integer dot unpacking the weight block in
// registers. A chunk is a few rows against all tokens: the rows stay in L1
// while the activations stream.
static void mmq_worker(void *arg, int64_t chunk, int ith) {
    const mm_task *t = arg;
    const nm_cpu *c = t->c;
    int g = 0;
    while (chunk >= t->off[g + 1]) g++;
    chunk -= t->off[g];
    const nm_op *op = t->ops[g];
    const nm_tensor *w = op->src0, *bias = op->src2;
    const int64_t K = w->ne[0], O = w->ne[1], T = op->src1->ne[1];
    const bool dec = T == 1 || (op->flags & NM_OPF_ROWWISE) || small_batch(c, op); // rows as decode computes them
    const size_t row_bytes = nm_row_size(w->type, K);
    const uint8_t *wd = TD(w);
    const float *bd = bias ? TD(bias) : NULL;
    float *yd = TD(op->dst);
    int64_t r0, r1;
    if (dec) {
        if (!dec_chunk(O, nm_pool_size(c->pool), chunk, &r0, &r1)) return;
    } else {
        r0 = chunk * NM_MM_ROWS;
        r1 = r0 + NM_MM_ROWS < O ? r0 + NM_MM_ROWS : O;
    }
    if (!dec) {
        // prefill: register-blocked kernel, each weight block unpacked once per tile of tokens
        nm_gemmq_packed_fn packed = t->packed ? c->k->gemmq_packed[w->type] : NULL;
        nm_gemmq_fn gemm = c->k->gemmq[w->type];
        if (packed) packed(wd + (size_t)r0 * row_bytes, row_bytes, r1 - r0, c->act_pack, T, K, yd + r0, O);
        else gemm(wd + (size_t)r0 * row_bytes, row_bytes, r1 - r0, c->act_q, t->act_row, T, K, yd + r0, O);
        add_bias(yd, bd, O, r0, r1, T);
        return;
    }
    nm_gemv_fn gemv = c->k->gemv[w->type];
    if (gemv && T == 1) {
        gemv(wd + (size_t)r0 * row_bytes, row_bytes, r1 - r0, O - r1, gemv_prep_of(c, g, 0), K, yd + r0);
        if (bd)
            for (int64_t o = r0; o < r1; o++) yd[o] += bd[o];
        return;
    }
    nm_gemv_multi_fn multi = c->k->gemv_multi[w->type];
    if (gemv && multi && small_batch(c, op) && !c->no_multi) { // each row read and unpacked once for the batch
        multi(wd + (size_t)r0 * row_bytes, row_bytes, r1 - r0, O - r1, gemv_prep_of(c, g, 0), c->gemv_prep_bytes,
              (int)T, K, yd + r0, O);
        add_bias(yd, bd, O, r0, r1, T);
        return;
    }
    if (gemv && small_batch(c, op)) { // blocks of ~16 KiB of rows, each read from DRAM by the first token
        const int64_t blk = row_bytes >= 16384 ? 1 : 16384 / (int64_t)row_bytes;
        for (int64_t b0 = r0; b0 < r1; b0 += blk) {
            const int64_t b1 = r1 - b0 > blk ? b0 + blk : r1;
            for (int64_t tok = 0; tok < T; tok++)
                gemv(wd + (size_t)b0 * row_bytes, row_bytes, b1 - b0, tok == 0 ? O - b1 : 0, gemv_prep_of(c, g, tok), K,
                     yd + tok * O + b0);
        }
        add_bias(yd, bd, O, r0, r1, T);
        return;
    }
    // one token, or (NM_OPF_ROWWISE, no gemv kernel for the type: Whisper's
    // beams) each token against a block of the chunk's rows while they are in
    // L1: a decode chunk is a large share of the rows (dec_chunk), which T
    // tokens would otherwise stream T times (the vocabulary head: 40 MB each)
    nm_dotq_fn dot = c->k->dotq[w->type];
    const int64_t blk = T == 1 ? r1 - r0 : row_bytes >= NM_ROWWISE_BLOCK_BYTES ? 1 : NM_ROWWISE_BLOCK_BYTES / (int64_t)row_bytes;
    const int64_t far = nm_prefetch_far_rows(row_bytes);
    for (int64_t b0 = r0; b0 < r1; b0 += blk) {
        const int64_t b1 = b0 + blk < r1 ? b0 + blk : r1;
        for (int64_t tok = 0; tok < T; tok++) {
            const uint8_t *xq = c->act_q + tok * t->act_row;
            float *yr = yd + tok * O;
            for (int64_t o = b0; o < b1; o++) {
                if (tok == 0 && o + NM_PREFETCH_ROWS < O) nm_prefetch_l1(wd + (size_t)(o + NM_PREFETCH_ROWS) * row_bytes, row_bytes);
                if (tok == 0 && o + far < r1) nm_prefetch_l2(wd + (size_t)(o + far) * row_bytes, row_bytes);
                float s = dot(wd + (size_t)o * row_bytes, xq, K);
                yr[o] = bd ? s + bd[o] : s;
            }
        }
    }
}

// Activation row `chunk` rounded to the half type of the weights (ggml's
// f16 matmul input) and widened back, as floats into act_q.
static void round_worker(void *arg, int64_t chunk, int ith) {
    const mm_task *t = arg;
    const int64_t K = t->op->src1->ne[0];
    const float *x = (const float *)TD(t->op->src1) + chunk * K;
    float *y = (float *)t->c->act_q + chunk * K;
    uint16_t h[512];
    for (int64_t k0 = 0; k0 < K; k0 += 512) {
        const int64_t n = K - k0 < 512 ? K - k0 : 512;
        t->c->k->quant_act[t->act_type](x + k0, h, n);
        t->c->k->dequant[t->act_type](h, y + k0, n);
    }
}

static int64_t mm_chunks(const nm_cpu *c, const nm_op *op) {
    const int64_t O = op->src0->ne[1];
    if (op->src1->ne[1] == 1 || (op->flags & NM_OPF_ROWWISE) || small_batch(c, op)) {
        return dec_chunks(O, nm_pool_size(c->pool));
    }
    return (O + NM_MM_ROWS - 1) / NM_MM_ROWS;
}

// The activations (src1, or the rounded copy) packed for the panel GEMM:
// chunk = one panel of 16 tokens.
static void xpack_worker(void *arg, int64_t chunk, int ith) {
    const mm_task *t = arg;
    const int64_t K = t->op->src1->ne[0], T = t->op->src1->ne[1], t0 = chunk * NM_GEMM_PACK_ROWS;
    const float *x = t->x ? t->x : TD(t->op->src1);
    nm_gemm_pack16(x + t0 * K, K, 1, T - t0 < NM_GEMM_PACK_ROWS ? T - t0 : NM_GEMM_PACK_ROWS, K, t->c->xpack + t0 * K);
}

// Prefill with the panel GEMM: a chunk of NM_MM_XROWS rows, widened once to
// f32 (f32 weights are used in place), against every pair of 16-token panels.
static void mmx_worker(void *arg, int64_t chunk, int ith) {
    const mm_task *t = arg;
    const nm_cpu *c = t->c;
    const nm_tensor *w = t->op->src0, *bias = t->op->src2;
    const int64_t K = w->ne[0], O = w->ne[1], T = t->op->src1->ne[1];
    const size_t row_bytes = nm_row_size(w->type, K);
    const uint8_t *wd = TD(w);
    const float *bd = bias ? TD(bias) : NULL;
    float *yd = TD(t->op->dst);
    const int64_t r0 = chunk * NM_MM_XROWS, r1 = r0 + NM_MM_XROWS < O ? r0 + NM_MM_XROWS : O;
    // rows K + 16 floats apart in the tile, off a multiple of 4 KiB (see
    // gemm.h); f32 weights in place unless their stride is one
    const float *tile = (const float *)(wd + (size_t)r0 * row_bytes);
    int64_t ldw = K;
    if (w->type != NM_TYPE_F32 || K % 1024 == 0) {
        float *s = c->scratch + (size_t)ith * NM_MM_XROWS * (size_t)(c->max_row + 16);
        ldw = K + 16;
        for (int64_t o = r0; o < r1; o++) c->k->dequant[w->type](wd + (size_t)o * row_bytes, s + (o - r0) * ldw, K);
        tile = s;
    }
    for (int64_t p = 0; p < T; p += 2 * NM_GEMM_PACK_ROWS)
        for (int64_t r = r0; r < r1; r += NM_GEMM_XPANEL_ROWS)
            c->pk->gemm(tile + (r - r0) * ldw, ldw, r1 - r < NM_GEMM_XPANEL_ROWS ? r1 - r : NM_GEMM_XPANEL_ROWS,
                           c->xpack + p * K, T - p < 2 * NM_GEMM_PACK_ROWS ? T - p : 2 * NM_GEMM_PACK_ROWS, K,
                           yd + p * O + r, O, bd ? bd + r : NULL);
}

static void mm_worker(void *arg, int64_t chunk, int ith) {
    const mm_task *t = arg;
    const nm_cpu *c = t->c;
    const nm_tensor *w = t->op->src0, *x = t->op->src1, *bias = t->op->src2;
    nm_tensor *y = t->op->dst;
    const int64_t K = w->ne[0], O = w->ne[1], T = x->ne[1];
    const size_t row_bytes = nm_row_size(w->type, K);
    const uint8_t *wd = TD(w);
    const float *xd = t->x ? t->x : TD(x), *bd = bias ? TD(bias) : NULL;
    float *yd = TD(y);
    nm_dot_fn dot = c->k->dot[w->type];

    int64_t r0, r1;
    if (T == 1) {
        // Decode: one pass over the weights, memory-bound.
        if (!dec_chunk(O, nm_pool_size(c->pool), chunk, &r0, &r1)) return;
        for (int64_t o = r0; o < r1; o++) {
            float s = dot(wd + (size_t)o * row_bytes, xd, K);
            yd[o] = bd ? s + bd[o] : s;
        }
        return;
    }
    // Prefill: a tile of NM_MM_ROWS rows, dequantized once, multiplied with all tokens.
    float *tile = c->scratch + (size_t)ith * NM_MM_ROWS * (size_t)c->max_row;
    nm_dequant_fn deq = c->k->dequant[w->type];
    r0 = chunk * NM_MM_ROWS;
    r1 = r0 + NM_MM_ROWS < O ? r0 + NM_MM_ROWS : O;
    for (int64_t o = r0; o < r1; o++) deq(wd + (size_t)o * row_bytes, tile + (o - r0) * K, K);
    for (int64_t tb = 0; tb < T; tb += NM_MM_TOKENS) {
        int64_t nb = T - tb < NM_MM_TOKENS ? T - tb : NM_MM_TOKENS;
        c->gemm(tile, r1 - r0, xd + tb * K, nb, K, yd + tb * O + r0, O, bd ? bd + r0 : NULL);
    }
}

// ---- element-wise ops ----------------------------------------------------------------

// Each takes a range [r0, r1) of rows (tokens; for RMS_NORM, the rows it
// normalises), so that large ones (prefill) run in parallel and small ones
// (decode) on the caller without a pool round trip.

static void op_get_rows(const nm_cpu *c, const nm_op *op, int64_t r0, int64_t r1) {
    const nm_tensor *w = op->src0;
    const int64_t K = w->ne[0];
    const size_t rb = nm_row_size(w->type, K);
    nm_dequant_fn deq = c->k->dequant[w->type];
    for (int64_t i = r0; i < r1; i++)
        deq((const uint8_t *)TD(w) + (size_t)IDS(op)[i] * rb, (float *)TD(op->dst) + i * K, K);
}

static void op_rms_norm(const nm_op *op, int64_t r0, int64_t r1) {
    const int64_t d = op->src0->ne[0];
    const float *w = op->src1 ? TD(op->src1) : NULL;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = (const float *)TD(op->src0) + r * d;
        float *y = (float *)TD(op->dst) + r * d;
        double ss = 0.0;
        for (int64_t i = 0; i < d; i++) ss += (double)x[i] * x[i];
        float scale = 1.0f / sqrtf((float)(ss / d) + op->f0);
        for (int64_t i = 0; i < d; i++) y[i] = x[i] * scale * (w ? w[i] : 1.0f);
    }
}

static void op_rope(const nm_op *op, int64_t t0, int64_t t1) {
    const int n_head = op->i0, hd = op->i1, mode = op->i2, n_rot = op->i3;
    const float base = op->f0, fscale = op->f1;
    const int64_t n_tok = op->src0->ne[1];
    const int32_t *sec = op->rope_sections;
    const int sect_dims = sec[0] + sec[1] + sec[2] + sec[3];
    float cs[512][2];
    for (int64_t t = t0; t < t1; t++) {
        float p = (float)IDS(op)[t] * fscale;
        for (int i = 0; i < n_rot / 2; i++) {
            float fi = (float)i, fn = (float)n_rot;
            if (mode == NM_ROPE_MROPE) { // the pair's stream: t, h or w (or e, 0)
                const int sector = i % sect_dims;
                const int s = sector < sec[0] ? 0 : sector < sec[0] + sec[1] ? 1 : sector < sec[0] + sec[1] + sec[2] ? 2 : 3;
                p = s < 3 ? (float)IDS(op)[s * n_tok + t] * fscale : 0.0f;
            } else if (mode == NM_ROPE_VISION) { // row pairs, then column pairs, each from frequency index 0
                const int col = i >= sec[0];
                p = (float)IDS(op)[col * n_tok + t] * fscale;
                fi = (float)(col ? i - sec[0] : i);
                fn = (float)(n_rot / 2);
            }
            float theta = p * powf(base, -2.0f * fi / fn);
            cs[i][0] = cosf(theta);
            cs[i][1] = sinf(theta);
        }
        for (int h = 0; h < n_head; h++) {
            float *x = (float *)TD(op->src0) + (t * n_head + h) * hd;
            for (int i = 0; i < n_rot / 2; i++) {
                // NORM rotates adjacent pairs; NEOX rotates element i with i + n_rot/2.
                int a = mode != NM_ROPE_NORM ? i : 2 * i;
                int b = mode != NM_ROPE_NORM ? i + n_rot / 2 : 2 * i + 1;
                float x0 = x[a], x1 = x[b];
                x[a] = x0 * cs[i][0] - x1 * cs[i][1];
                x[b] = x0 * cs[i][1] + x1 * cs[i][0];
            }
        }
    }
}

static void op_glu(const nm_op *op, int64_t r0, int64_t r1) {
    const int64_t w = op->src0->ne[0], b = r0 * w, e = r1 * w;
    const float *g = TD(op->src0), *u = TD(op->src1);
    float *y = TD(op->dst);
    if (op->i0 == NM_ACT_SILU) {
        for (int64_t i = b; i < e; i++) y[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    } else {
        // GELU(tanh): 0.5 x (1 + tanh(z)) with z = sqrt(2/pi) (x + 0.044715 x^3),
        // computed as x / (1 + e^(-2z)), the same function (0.5 (1 + tanh z) is
        // the logistic of 2z) for one expf instead of tanhf's expm1f and more.
        const float k0 = 2.0f * 0.7978845608028654f, k1 = 0.044715f;
        for (int64_t i = b; i < e; i++) {
            float x = g[i];
            y[i] = x / (1.0f + expf(-k0 * x * (1.0f + k1 * x * x))) * u[i];
        }
    }
}

static void op_norm(const nm_op *op, int64_t r0, int64_t r1) {
    const int64_t d = op->src0->ne[0];
    const float *w = op->src1 ? TD(op->src1) : NULL, *b = op->src2 ? TD(op->src2) : NULL;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = (const float *)TD(op->src0) + r * d;
        float *y = (float *)TD(op->dst) + r * d;
        double s = 0.0;
        for (int64_t i = 0; i < d; i++) s += x[i];
        const float mean = (float)(s / d);
        double ss = 0.0;
        for (int64_t i = 0; i < d; i++) ss += (double)(x[i] - mean) * (x[i] - mean);
        const float scale = 1.0f / sqrtf((float)(ss / d) + op->f0);
        for (int64_t i = 0; i < d; i++) {
            float v = (x[i] - mean) * scale;
            if (w) v *= w[i];
            if (b) v += b[i];
            y[i] = v;
        }
    }
}

// ggml's GELU table (NM_OPF_GGML_F16): gelu of every f16 value, rounded to f16.
static uint16_t gelu_f16_tab[1 << 16];
static pthread_once_t gelu_f16_once = PTHREAD_ONCE_INIT;
static void gelu_f16_init(void) {
    for (uint32_t i = 0; i < (1u << 16); i++) {
        const float h = nm_fp16_to_fp32((uint16_t)i);
        const float g = 0.5f * h * (1.0f + tanhf(0.79788456080286535587989211986876f * h * (1.0f + 0.044715f * h * h)));
        gelu_f16_tab[i] = nm_fp32_to_fp16(g);
    }
}

static void op_act(const nm_cpu *c, const nm_op *op, int64_t r0, int64_t r1) {
    const int64_t w = op->dst->ne[0], b = r0 * w, e = r1 * w;
    const float *x = TD(op->src0);
    float *y = TD(op->dst);
    switch (op->i0) {
    case NM_ACT_SILU: c->xsigmoid(x + b, y + b, e - b, 1.0f, 0.0f); break;
    case NM_ACT_GELU_TANH: {
        if (op->flags & NM_OPF_GGML_F16) { // ggml's f16 table: gelu of the f16 input, rounded to f16
            pthread_once(&gelu_f16_once, gelu_f16_init);
            const nm_kernels *k = nm_kernels_get();
            uint16_t h[256];
            float g[256];
            for (int64_t i0 = b; i0 < e; i0 += 256) {
                const int64_t n = e - i0 < 256 ? e - i0 : 256;
                k->quant_act[NM_TYPE_F16](x + i0, h, n);
                for (int64_t i = 0; i < n; i++) h[i] = gelu_f16_tab[h[i]];
                k->dequant[NM_TYPE_F16](h, g, n);
                for (int64_t i = 0; i < n; i++) {
                    const float v = x[i0 + i];
                    y[i0 + i] = v <= -10.0f ? 0.0f : v >= 10.0f ? v : g[i];
                }
            }
            break;
        }
        const float k0 = 2.0f * 0.7978845608028654f; // see op_glu
        c->xsigmoid(x + b, y + b, e - b, k0, k0 * 0.044715f);
        break;
    }
    case NM_ACT_TANH:
        if (y != x) memmove(y + b, x + b, sizeof(float) * (size_t)(e - b));
        if (c->pk) c->pk->tanh(y + b, e - b);
        else
            for (int64_t i = b; i < e; i++) y[i] = tanhf(y[i]);
        break;
    default: // NM_ACT_GELU_QUICK
        c->xsigmoid(x + b, y + b, e - b, 1.702f, 0.0f);
        break;
    }
}

static void op_add(const nm_op *op, int64_t r0, int64_t r1) {
    const int64_t w = op->dst->ne[0];
    const float *a = TD(op->src0), *b = TD(op->src1);
    float *y = TD(op->dst);
    for (int64_t i = r0 * w; i < r1 * w; i++) y[i] = a[i] + b[i];
}

static void op_scale(const nm_op *op, int64_t r0, int64_t r1) {
    const int64_t w = op->dst->ne[0];
    const float *a = TD(op->src0);
    float *y = TD(op->dst);
    for (int64_t i = r0 * w; i < r1 * w; i++) y[i] = a[i] * op->f0;
}

static void op_softcap(const nm_op *op, int64_t r0, int64_t r1) {
    const int64_t w = op->dst->ne[0];
    const float *a = TD(op->src0), cap = op->f0;
    float *y = TD(op->dst);
    for (int64_t i = r0 * w; i < r1 * w; i++) y[i] = cap * tanhf(a[i] / cap);
}

// Patches as rows (channel, y, x), the order of a conv kernel's elements;
// rows in raster order, or in 2 x 2 groups (i3 = 2).
static void op_patches(const nm_op *op, int64_t r0, int64_t r1) {
    const int64_t W = op->i0, H = op->i2 ? op->i2 : op->i0, p = op->i1, gw = W / p, P = 3 * p * p;
    const float *px = TD(op->src0);
    float *y = TD(op->dst);
    for (int64_t t = r0; t < r1; t++) {
        int64_t py = t / gw, pxi = t % gw;
        if (op->i3 == 2) { // t = ((yb * gw/2 + xb) * 2 + dy) * 2 + dx
            const int64_t g = t / 4, yb = g / (gw / 2), xb = g % (gw / 2);
            py = 2 * yb + (t / 2) % 2;
            pxi = 2 * xb + t % 2;
        }
        for (int64_t ch = 0; ch < 3; ch++)
            for (int64_t r = 0; r < p; r++)
                memcpy(y + t * P + (ch * p + r) * p, px + (ch * H + py * p + r) * W + pxi * p, sizeof(float) * (size_t)p);
    }
}

static void op_pixel_shuffle(const nm_op *op, int64_t r0, int64_t r1) {
    const int64_t side = op->i0, s = op->i1, sb = side / s, d = op->src0->ne[0];
    const float *x = TD(op->src0);
    float *y = TD(op->dst);
    for (int64_t o = r0; o < r1; o++) {
        const int64_t yb = o / sb, xb = o % sb;
        for (int64_t dy = 0; dy < s; dy++)
            for (int64_t dx = 0; dx < s; dx++)
                memcpy(y + o * d * s * s + (dy * s + dx) * d, x + ((yb * s + dy) * side + xb * s + dx) * d,
                       sizeof(float) * (size_t)d);
    }
}

static void op_im2col(const nm_op *op, int64_t r0, int64_t r1) {
    const int64_t K = op->i0, stride = op->i1, off = op->i3, W = op->dst->ne[1] * stride;
    const bool frame_major = op->i2 == 1;
    const int64_t C = frame_major ? op->src0->ne[0] : op->src0->ne[1], L = frame_major ? op->src0->ne[1] : op->src0->ne[0];
    const float *x = TD(op->src0);
    float *y = TD(op->dst);
    for (int64_t t = r0; t < r1; t++) {
        float *row = y + t * C * K;
        for (int64_t k = 0; k < K; k++) {
            const int64_t f = stride * t - K / 2 + k, g = off + f;
            const bool in = f >= 0 && f < W && g < L;
            for (int64_t c = 0; c < C; c++) row[c * K + k] = in ? x[frame_major ? g * C + c : c * L + g] : 0.0f;
        }
    }
}

static void op_kv_store(const nm_cpu *c, const nm_op *op) {
    const int64_t w = op->src0->ne[0], T = op->src0->ne[1];
    // f32 -> f16 rounding to nearest even (the activation quantizer for f16 weights)
    const nm_quant_act_fn narrow = c->k->quant_act[NM_TYPE_F16];
    const float *k = TD(op->src0), *v = TD(op->src1);
    const int32_t *pos = IDS(op), *rows = KVROWS(op);
    for (int64_t t = 0; t < T;) { // runs of consecutive cache rows in one call
        const int64_t r = KVROW(rows, pos[t]);
        int64_t n = 1;
        while (t + n < T && pos[t + n] == pos[t] + n && KVROW(rows, pos[t + n]) == r + n) n++;
        narrow(k + t * w, KVK(op) + (size_t)r * w, w * n);
        narrow(v + t * w, KVV(op) + (size_t)r * w, w * n);
        t += n;
    }
}

// NM_OP_SHORT_CONV over channels [c0, c1): each channel's tokens in order, so a token reads the rows its
// sequence's earlier tokens wrote (the sums over the taps oldest first, as ggml_ssm_conv's).
static void op_short_conv(const nm_op *op, int64_t c0, int64_t c1) {
    const int64_t d = op->dst->ne[0], T = op->src0->ne[1], L = op->i0, W = op->i1, R = op->i2, S = op->i3;
    const int64_t ncp = op->n_ctx > 0 ? (op->n_ctx - 1) / S : 0;
    const float *bcx = TD(op->src0), *w = TD(op->src1);
    float *y = TD(op->dst), *st = TD(op->state);
    const int32_t *ids = IDS(op);
    for (int64_t t = 0; t < T; t++) {
        const int64_t s = ids[t] / op->n_ctx, p = ids[t] % op->n_ctx;
        const float *b = bcx + t * 3 * d, *cg = b + d, *x = b + 2 * d;
        float *base = st + s * R * d, *ring = base + (p % W) * d;
        for (int64_t ch = c0; ch < c1; ch++) {
            const float bx = b[ch] * x[ch], *wc = w + ch * L;
            float acc = 0.0f;
            for (int64_t k = 0; k < L - 1; k++) {
                const int64_t q = p - (L - 1) + k;
                if (q >= 0) acc += wc[k] * base[(q % W) * d + ch];
            }
            acc += wc[L - 1] * bx;
            y[t * d + ch] = cg[ch] * acc;
            ring[ch] = bx;
        }
        for (int64_t j = 1; j < L; j++) { // checkpoints at p + j take p's row as their row L - 1 - j
            const int64_t q = p + j;
            if (q % S || q / S > ncp) continue;
            float *row = base + (W + (q / S - 1) * (L - 1) + (L - 1 - j)) * d;
            for (int64_t ch = c0; ch < c1; ch++) row[ch] = ring[ch];
        }
    }
}

typedef struct sc_task {
    const nm_op *op;
    int64_t n_chunks;
} sc_task;

static void sc_worker(void *arg, int64_t chunk, int ith) {
    (void)ith;
    const sc_task *t = arg;
    int64_t c0, c1;
    nm_split_range(t->op->dst->ne[0] / 16, (int)chunk, (int)t->n_chunks, &c0, &c1); // (16-channel blocks)
    const int64_t d = t->op->dst->ne[0];
    op_short_conv(t->op, c0 * 16, chunk == t->n_chunks - 1 ? d : c1 * 16);
}

static int64_t op_rows(const nm_op *op) {
    return op->kind == NM_OP_RMS_NORM || op->kind == NM_OP_NORM ? op->src0->ne[1] * op->src0->ne[2] : op->dst->ne[1];
}

static void op_rows_run(const nm_cpu *c, const nm_op *op, int64_t r0, int64_t r1) {
    switch (op->kind) {
    case NM_OP_GET_ROWS: op_get_rows(c, op, r0, r1); break;
    case NM_OP_RMS_NORM: op_rms_norm(op, r0, r1); break;
    case NM_OP_ROPE: op_rope(op, r0, r1); break;
    case NM_OP_GLU: op_glu(op, r0, r1); break;
    case NM_OP_ADD: op_add(op, r0, r1); break;
    case NM_OP_SCALE: op_scale(op, r0, r1); break;
    case NM_OP_SOFTCAP: op_softcap(op, r0, r1); break;
    case NM_OP_PATCHES: op_patches(op, r0, r1); break;
    case NM_OP_PIXEL_SHUFFLE: op_pixel_shuffle(op, r0, r1); break;
    case NM_OP_IM2COL: op_im2col(op, r0, r1); break;
    case NM_OP_NORM: op_norm(op, r0, r1); break;
    case NM_OP_ACT: op_act(c, op, r0, r1); break;
    default: break;
    }
}

typedef struct ew_task {
    const nm_cpu *c;
    const nm_op *op;
    int64_t rows, n_chunks;
} ew_task;

static void ew_worker(void *arg, int64_t chunk, int ith) {
    const ew_task *t = arg;
    int64_t r0, r1;
    nm_split_range(t->rows, (int)chunk, (int)t->n_chunks, &r0, &r1);
    op_rows_run(t->c, t->op, r0, r1);
}

// Below this many elements an op runs on the caller: a pool round trip
// (~1-2 us) costs more than the work (decode's vectors are 0.5-2k floats).
#define NM_EW_PARALLEL_MIN 32768

static void op_rows_dispatch(nm_cpu *c, const nm_op *op) {
    const int64_t rows = op_rows(op), width = op->kind == NM_OP_ROPE ? op->src0->ne[0] : op->dst->ne[0];
    const int nth = nm_pool_size(c->pool);
    if (nth == 1 || rows < 2 || rows * width < NM_EW_PARALLEL_MIN) {
        op_rows_run(c, op, 0, rows);
        return;
    }
    ew_task t = {c, op, rows, rows < 4 * nth ? rows : 4 * nth};
    nm_pool_run(c->pool, ew_worker, &t, t.n_chunks);
}

static bool cpu_supports_op(const nm_backend *b, const nm_op *op);

// ---- convolutions (NM_OP_CONV1D, NM_OP_CONV_T1D on conv1d.c's kernels) -----------------------

// A convolution's weight as prepare_op packed it (w or wx of the kernels' layout; the op's bias,
// dilation and slope are set at each submit).
typedef struct cpu_conv {
    const void *src; // the caller's weight (PyTorch's layout): the key, with kind
    int kind;
    nm_conv1d c;     // CONV1D: ic, oc, k and the packed weights
    nm_conv_t1d t;   // CONV_T1D: the same
    float *packed;
} cpu_conv;

static cpu_conv *conv_find(const nm_cpu *c, const void *src, int kind) {
    int32_t lo = 0, hi = c->n_convs;
    while (lo < hi) {
        const int32_t mid = (lo + hi) / 2;
        const cpu_conv *e = &c->convs[mid];
        if ((uintptr_t)e->src < (uintptr_t)src || (e->src == src && e->kind < kind)) lo = mid + 1;
        else hi = mid;
    }
    return lo < c->n_convs && c->convs[lo].src == src && c->convs[lo].kind == kind ? &c->convs[lo] : NULL;
}

// Whether e was packed for op's kernel size and channels (the same weight bytes read another way: refused).
static bool conv_same(const cpu_conv *e, const nm_op *op) {
    int64_t k = 0, ic = 0, oc = 0;
    nm_conv_dims(op, &k, &ic, &oc);
    return op->kind == NM_OP_CONV1D ? e->c.ic == ic && e->c.oc == oc && e->c.k == k
                                    : e->t.ic == ic && e->t.oc == oc && e->t.k == k &&
                                          (!e->t.wm || e->t.stride == op->i0); // (stacked: packed for its stride)
}

// The threads' workspace of op (its dilation or stride: e's shape), grown to it; false out of memory.
static bool conv_room(nm_cpu *c, const cpu_conv *e, const nm_op *op) {
    const int nth = nm_pool_size(c->pool);
    nm_conv1d cv = e->c;
    nm_conv_t1d ct = e->t;
    cv.dil = op->i0, ct.stride = op->i0;
    const int64_t work = op->kind == NM_OP_CONV1D ? nm_conv1d_work(&cv, nth) : nm_conv_t1d_work(&ct, nth);
    if (work <= c->conv_work_floats) return true;
    float *wk = aligned_alloc(64, ((size_t)work * sizeof(float) + 63) / 64 * 64);
    if (!wk) return false;
    free(c->conv_work);
    c->conv_work = wk, c->conv_work_floats = work;
    return true;
}

// op's reach (nm_conv_reach: its dilation or stride) with the tiles e's packing picked.
static int32_t conv_tile_reach(const cpu_conv *e, const nm_op *op) {
    return nm_conv_reach(op->kind, e->c.k, op->i0, op->kind == NM_OP_CONV1D ? e->c.wm : e->t.wm);
}

static nm_status cpu_prepare_op(nm_backend *b, const nm_op *op, nm_op_prep *p) {
    nm_cpu *c = b->impl;
    if (op->kind != NM_OP_CONV1D && op->kind != NM_OP_CONV_T1D) return NM_OK;
    if (!cpu_supports_op(b, op) || !TD(op->src1)) {
        snprintf(c->err, sizeof c->err, "cpu backend: convolution (op %d) with these operands is not supported", op->kind);
        return NM_ERR_UNSUPPORTED;
    }
    const void *src = TD(op->src1);
    const cpu_conv *have = conv_find(c, src, op->kind);
    int64_t k64 = 0, ic64 = 0, oc64 = 0; // (supports_op checked them)
    nm_conv_dims(op, &k64, &ic64, &oc64);
    const int32_t k = (int32_t)k64, ic = (int32_t)ic64, oc = (int32_t)oc64;
    if (have) {
        if (!conv_same(have, op)) {
            snprintf(c->err, sizeof c->err, "cpu backend: the convolution weight at %p was prepared with another shape", src);
            return NM_ERR_INVALID_ARG;
        }
        if (!conv_room(c, have, op)) goto oom;
        p->copied = true, p->reach = conv_tile_reach(have, op);
        return NM_OK;
    }
    if (c->n_convs == c->cap_convs) {
        const int32_t cap = c->cap_convs ? 2 * c->cap_convs : 32;
        cpu_conv *e = realloc(c->convs, sizeof *e * (size_t)cap);
        if (!e) goto oom;
        c->convs = e, c->cap_convs = cap;
    }
    cpu_conv e = {.src = src, .kind = op->kind};
    // (HiFi-GAN's convolutions, on long sequences: Winograd's form where this CPU's packing picks it)
    e.c = (nm_conv1d){.ic = ic, .oc = oc, .k = k, .dil = op->i0, .in_slope = 1.0f, .winograd = NM_CONV_OP_WINO};
    e.t = (nm_conv_t1d){.ic = ic, .oc = oc, .k = k, .stride = op->i0, .in_slope = 1.0f, .winograd = NM_CONV_OP_WINO};
    const int64_t size = op->kind == NM_OP_CONV1D ? nm_conv1d_packed_size(&e.c) : nm_conv_t1d_packed_size(&e.t);
    if (!(e.packed = aligned_alloc(64, ((size_t)size * sizeof(float) + 63) / 64 * 64))) goto oom;
    float *wide = NULL; // (f16 / q8_0 weights widened to f32 for the packing)
    if (op->src1->type != NM_TYPE_F32) {
        const int64_t nw = (int64_t)k * ic * oc;
        if (!(wide = malloc(sizeof(float) * (size_t)nw))) {
            free(e.packed);
            goto oom;
        }
        c->kref->dequant[op->src1->type](src, wide, nw);
        src = wide;
    }
    if (op->kind == NM_OP_CONV1D) nm_conv1d_pack(&e.c, src, e.packed);
    else nm_conv_t1d_pack(&e.t, src, e.packed);
    free(wide);
    src = e.src;
    if (!conv_room(c, &e, op)) {
        free(e.packed);
        goto oom;
    }
    int32_t at = 0;
    while (at < c->n_convs && ((uintptr_t)c->convs[at].src < (uintptr_t)src ||
                               (c->convs[at].src == src && c->convs[at].kind < (int)op->kind)))
        at++;
    memmove(c->convs + at + 1, c->convs + at, sizeof *c->convs * (size_t)(c->n_convs - at));
    c->convs[at] = e;
    c->n_convs++;
    p->copied = true, p->reach = conv_tile_reach(&e, op);
    return NM_OK;
oom:
    snprintf(c->err, sizeof c->err, "cpu backend: out of memory for a convolution's packed weights");
    return NM_ERR_NOMEM;
}

// Whether [a, a + na) and [b, b + nb) share a byte.
static bool overlap(const void *a, size_t na, const void *b, size_t nb) {
    return (uintptr_t)a < (uintptr_t)b + nb && (uintptr_t)b < (uintptr_t)a + na;
}

static nm_status op_conv(nm_cpu *c, const nm_op *op) {
    const cpu_conv *e = conv_find(c, TD(op->src1), op->kind);
    if (!e || !conv_same(e, op)) {
        snprintf(c->err, sizeof c->err, "cpu backend: convolution (op %d) weight %s not prepared (prepare_op)%s", op->kind,
                 op->src1->name ? op->src1->name : "", e ? " for this kernel size and these channels" : "");
        return NM_ERR_INVALID_ARG;
    }
    if (overlap(TD(op->dst), nm_tensor_bytes(op->dst), TD(op->src0), nm_tensor_bytes(op->src0))) {
        snprintf(c->err, sizeof c->err, "cpu backend: convolution (op %d): its output overlaps its input", op->kind);
        return NM_ERR_INVALID_ARG;
    }
    const float *x = TD(op->src0), *bias = op->src2 ? TD(op->src2) : NULL;
    float *y = TD(op->dst);
    const int64_t n = op->src0->ne[1];
    nm_conv1d cv = e->c;
    nm_conv_t1d ct = e->t;
    cv.dil = op->i0, ct.stride = op->i0, ct.pad = op->i1;
    const int nth = nm_pool_size(c->pool);
    if ((op->kind == NM_OP_CONV1D ? nm_conv1d_work(&cv, nth) : nm_conv_t1d_work(&ct, nth)) > c->conv_work_floats) {
        snprintf(c->err, sizeof c->err, "cpu backend: convolution (op %d): a %s of %d beyond what it was prepared with",
                 op->kind, op->kind == NM_OP_CONV1D ? "dilation" : "stride", op->i0);
        return NM_ERR_INVALID_ARG;
    }
    if (op->kind == NM_OP_CONV1D) {
        cv.bias = bias, cv.in_slope = op->f0;
        const nm_conv_add add = {.a = op->add[0] ? TD(op->add[0]) : NULL, .b = op->add[1] ? TD(op->add[1]) : NULL,
                                 .scale = op->f1};
        const bool has_add = add.a || add.b || op->f1 != 1.0f;
        nm_conv1d_run(&cv, x, n, op->i1, op->i2, op->i3, has_add ? &add : NULL, y, c->conv_work, c->pool);
    } else {
        ct.bias = bias, ct.in_slope = op->f0;
        nm_conv_t1d_run(&ct, x, n, op->i3, y, c->conv_work, c->pool);
    }
    return NM_OK;
}

// ---- vtable ---------------------------------------------------------------------------

static void cpu_get_caps(const nm_backend *b, nm_backend_caps *caps) {
    const nm_cpu *c = b->impl;
    caps->unified_memory = true;
    caps->static_shapes = false;
    caps->async = false;
    caps->host_memory = true;
    caps->n_threads = nm_pool_size(c->pool);
    caps->mem_bytes = 0;
    caps->weight_types = 0;
    for (uint32_t t = 0; t < NM_TYPE_COUNT; t++)
        if (c->kref->dot[t] && c->kref->dequant[t]) caps->weight_types |= 1ull << t;
}

// Whole pages of their own (anonymous mappings): zero pages map lazily, so
// pages never touched (a long context's KV cache) cost no resident memory,
// and a device that imports the buffer (a layer split) wraps these pages
// and no neighbour's.
static size_t page_round(size_t n) {
    const long pg = sysconf(_SC_PAGESIZE) > 0 ? sysconf(_SC_PAGESIZE) : 4096;
    return (n + (size_t)pg - 1) / (size_t)pg * (size_t)pg;
}

static nm_buffer *cpu_buffer_alloc(nm_backend *b, size_t size) {
    nm_cpu *c = b->impl;
    nm_buffer *buf = calloc(1, sizeof *buf);
    const size_t n = page_round(size ? size : 1);
    void *p = buf ? mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) : MAP_FAILED;
    if (!buf || p == MAP_FAILED) {
        free(buf);
        snprintf(c->err, sizeof c->err, "cpu backend: out of memory for a buffer of %zu bytes", size);
        return NULL;
    }
    buf->owner = b;
    buf->impl = p;
    buf->host = p;
    buf->size = size;
    return buf;
}

static void cpu_buffer_free(nm_backend *b, nm_buffer *buf) {
    if (!buf) return;
    munmap(buf->impl, page_round(buf->size ? buf->size : 1));
    free(buf);
}

// The CPU reads host memory where it is.
static nm_status cpu_buffer_import_host(nm_backend *b, const void *p, size_t size, bool writable) {
    return NM_OK;
}

static nm_status cpu_tensor_set(nm_backend *b, const nm_tensor *t, size_t offs, const void *src, size_t n) {
    void *p = TD(t);
    if (!p) {
        snprintf(((nm_cpu *)b->impl)->err, sizeof ((nm_cpu *)b->impl)->err, "cpu backend: a tensor the host cannot address");
        return NM_ERR_UNSUPPORTED;
    }
    memcpy((uint8_t *)p + offs, src, n);
    return NM_OK;
}

static nm_status cpu_tensor_get(nm_backend *b, const nm_tensor *t, size_t offs, void *dst, size_t n) {
    const void *p = TD(t);
    if (!p) {
        snprintf(((nm_cpu *)b->impl)->err, sizeof ((nm_cpu *)b->impl)->err, "cpu backend: a tensor the host cannot address");
        return NM_ERR_UNSUPPORTED;
    }
    memcpy(dst, (const uint8_t *)p + offs, n);
    return NM_OK;
}

// The CPU computes synchronously: an event is complete once recorded, and
// waiting on another backend's event waits for it on the host.
static nm_event *cpu_event_record(nm_backend *b) {
    nm_event *ev = calloc(1, sizeof *ev);
    if (ev) ev->owner = b;
    return ev;
}

static nm_status cpu_event_wait(nm_backend *b, nm_event *ev) {
    if (!ev || ev->owner == b) return NM_OK;
    return nm_backend_event_sync(ev->owner, ev);
}

static nm_status cpu_event_sync(nm_backend *b, nm_event *ev) { return NM_OK; }
static void cpu_event_free(nm_backend *b, nm_event *ev) { free(ev); }
static nm_status cpu_synchronize(nm_backend *b) { return NM_OK; }

// A position -> row map covers the positions below n_ctx.
static bool kv_rows_ok(const nm_op *op) {
    return !op->kv_rows || (op->kv_rows->type == NM_TYPE_I32 && op->kv_rows->ne[0] >= op->n_ctx);
}

static bool cpu_supports_op(const nm_backend *b, const nm_op *op) {
    const nm_cpu *c = b->impl;
    switch (op->kind) {
    case NM_OP_MATMUL:
        if (op->src1->ne[1] > c->max_tokens) return false;
        /* fall through */
    case NM_OP_GET_ROWS:
        return op->src0->type < NM_TYPE_COUNT && c->kref->dot[op->src0->type] &&
               c->kref->dequant[op->src0->type] && c->kref->dotq[op->src0->type] &&
               op->src0->ne[0] <= c->max_row;
    case NM_OP_ATTENTION:
        if (op->i2 > 1024 || op->i1 <= 0 || op->i0 % op->i1 != 0 || op->n_ctx <= 0 || !kv_rows_ok(op)) return false;
        return !(op->flags & NM_OPF_GGML_F16) || (op->n_ctx <= NM_ATTN_GGML_MAX && op->f1 <= 0.0f);
    case NM_OP_ROPE:
        if (op->i2 == NM_ROPE_VISION)
            return op->i3 <= 1024 && op->i3 <= op->i1 && op->ids && op->ids->ne[0] >= 2 * op->src0->ne[1] &&
                   op->rope_sections[0] > 0 && op->rope_sections[0] < op->i3 / 2;
        return op->i3 <= 1024 && op->i3 <= op->i1 &&
               (op->i2 != NM_ROPE_MROPE || (op->ids && op->ids->ne[0] >= 3 * op->src0->ne[1] &&
                                            op->rope_sections[0] + op->rope_sections[1] + op->rope_sections[2] +
                                                    op->rope_sections[3] > 0));
    case NM_OP_KV_STORE: return op->n_ctx > 0 && op->src0->ne[1] <= op->n_ctx && kv_rows_ok(op);
    case NM_OP_SHORT_CONV: return nm_short_conv_ok(op);
    case NM_OP_ATTENTION_FULL: return fa_supported(c, op);
    case NM_OP_ACT: return op->i0 >= NM_ACT_SILU && op->i0 <= NM_ACT_TANH;
    case NM_OP_CONV1D:
    case NM_OP_CONV_T1D: return nm_conv_op_ok(op);
    case NM_OP_COPY: return op->src0->type == op->dst->type && nm_tensor_bytes(op->src0) == nm_tensor_bytes(op->dst);
    case NM_OP_PATCHES: {
        const int64_t W = op->i0, H = op->i2 ? op->i2 : op->i0, p = op->i1;
        return p > 0 && W > 0 && H > 0 && W % p == 0 && H % p == 0 && op->dst->ne[0] == 3 * p * p &&
               op->dst->ne[1] == (W / p) * (H / p) && op->src0->ne[0] * op->src0->ne[1] >= 3 * W * H &&
               (op->i3 == 0 || (op->i3 == 2 && (W / p) % 2 == 0 && (H / p) % 2 == 0));
    }
    case NM_OP_PIXEL_SHUFFLE:
        return op->i1 > 0 && op->i0 % op->i1 == 0 && op->src0->ne[1] == (int64_t)op->i0 * op->i0 &&
               op->dst->ne[0] == op->src0->ne[0] * op->i1 * op->i1;
    case NM_OP_IM2COL:
        return op->i0 > 0 && op->i1 > 0 && op->i3 >= 0 && (op->i2 == 0 || op->i2 == 1) &&
               op->dst->ne[0] == (op->i2 ? op->src0->ne[0] : op->src0->ne[1]) * op->i0;
    default: return op->kind < NM_OP_COUNT;
    }
}

// Whether ops[j] can join the quantized-matmul group started by ops[i]: same
// activations (so the quantized copy is shared) and the same activation type.
// NM_OPF_ROWWISE groups only one weight type (whether its rows run through a
// gemv kernel, one token at a time, is decided per type).
static bool joins_group(const nm_op *a, const nm_op *b) {
    return b->kind == NM_OP_MATMUL && b->flags == a->flags &&
           (!(a->flags & NM_OPF_ROWWISE) || b->src0->type == a->src0->type) && TD(b->src1) == TD(a->src1) &&
           b->src1->ne[0] == a->src1->ne[0] &&
           b->src1->ne[1] == a->src1->ne[1] && nm_vec_dot_type(b->src0->type) == nm_vec_dot_type(a->src0->type) &&
           TD(b->dst) != TD(a->src1);
}

static nm_status cpu_compute(nm_backend *b, const nm_op *ops, int n_ops);

// An NM_OPF_ROWWISE matmul as T one-token matmuls (row views of src1 and dst).
static nm_status compute_rowwise_by_token(nm_backend *b, const nm_op *op) {
    const int64_t K = op->src1->ne[0], O = op->dst->ne[0];
    for (int64_t t = 0; t < op->src1->ne[1]; t++) {
        nm_tensor x = *op->src1, y = *op->dst;
        x.ne[1] = y.ne[1] = 1;
        x.offs += (size_t)(t * K) * sizeof(float);
        y.offs += (size_t)(t * O) * sizeof(float);
        nm_op one = *op;
        one.src1 = &x;
        one.dst = &y;
        one.flags &= ~NM_OPF_ROWWISE;
        nm_cpu *c = b->impl;
        c->prof_inner = true;
        nm_status st = cpu_compute(b, &one, 1);
        c->prof_inner = false;
        if (st != NM_OK) return st;
    }
    return NM_OK;
}

static bool host_visible(const nm_tensor *t) { return !t || TD(t) != NULL; }

// What supports_op cannot know at plan time: that the host reaches every
// operand, and the values of ids (positions inside the cache, token ids
// inside the table).
static nm_status check_operands(nm_cpu *c, const nm_op *op) {
    if (!host_visible(op->src0) || !host_visible(op->src1) || !host_visible(op->src2) || !host_visible(op->dst) ||
        !host_visible(op->ids) || !host_visible(op->kv_rows) || !host_visible(op->add[0]) || !host_visible(op->add[1]) ||
        !host_visible(op->state) ||
        (op->kv && (!host_visible(&op->kv->k) || !host_visible(&op->kv->v)))) {
        snprintf(c->err, sizeof c->err, "cpu backend: op %d has an operand in memory the host cannot address", op->kind);
        return NM_ERR_UNSUPPORTED;
    }
    int64_t lim = op->kind == NM_OP_GET_ROWS ? op->src0->ne[1] : op->n_ctx;
    if (op->kv && !op->kv_rows && op->n_ctx > 0) { // ids s x n_ctx + position: every sequence the cache holds
        const int64_t rows = op->kv->k.ne[1] < op->kv->v.ne[1] ? op->kv->k.ne[1] : op->kv->v.ne[1];
        lim = rows / op->n_ctx * op->n_ctx;
    }
    if (op->kind == NM_OP_SHORT_CONV) lim = op->state->ne[1] / op->i2 * op->n_ctx; // (the state's sequences)
    if (op->kind == NM_OP_GET_ROWS || op->kind == NM_OP_ATTENTION || op->kind == NM_OP_KV_STORE ||
        op->kind == NM_OP_SHORT_CONV) {
        const int64_t n = op->kind == NM_OP_GET_ROWS ? op->dst->ne[1] : op->src0->ne[1];
        for (int64_t t = 0; t < n; t++)
            if (IDS(op)[t] < 0 || IDS(op)[t] >= lim) {
                snprintf(c->err, sizeof c->err, "cpu backend: op %d: %s %d outside [0, %lld)", op->kind,
                         op->kind == NM_OP_GET_ROWS ? "row" : "position", IDS(op)[t], (long long)lim);
                return NM_ERR_RANGE;
            }
    }
    if (op->kv_rows && (op->kind == NM_OP_ATTENTION || op->kind == NM_OP_KV_STORE)) {
        // every row the op reads or writes lies in the cache: positions [0, max] (attention) or the ids
        const int32_t *rows = KVROWS(op), *pos = IDS(op);
        const int64_t n = op->src0->ne[1], cap = op->kv->k.ne[1] < op->kv->v.ne[1] ? op->kv->k.ne[1] : op->kv->v.ne[1];
        int64_t hi = 0;
        for (int64_t t = 0; t < n; t++) hi = pos[t] > hi ? pos[t] : hi;
        for (int64_t t = 0; t < (op->kind == NM_OP_ATTENTION ? hi + 1 : n); t++) {
            const int32_t r = rows[op->kind == NM_OP_ATTENTION ? t : pos[t]];
            if (r < 0 || r >= cap) {
                snprintf(c->err, sizeof c->err, "cpu backend: op %d: cache row %d of position %lld outside [0, %lld)",
                         op->kind, r, (long long)(op->kind == NM_OP_ATTENTION ? t : pos[t]), (long long)cap);
                return NM_ERR_RANGE;
            }
        }
    }
    return NM_OK;
}


// Adds the time since t0 to the (kind, weight type) of ops[first], and the
// bytes of the weights of ops[first..last]: a group of matmuls over the same
// activations (Q, K, V; gate, up) is one job, counted under its first op's type.
static void prof_add(nm_cpu *c, const nm_op *ops, int first, int last, double t0) {
    const nm_op *op = &ops[first];
    const uint32_t t = op->kind == NM_OP_MATMUL && op->src0->type < NM_TYPE_COUNT ? op->src0->type : NM_TYPE_F32;
    c->prof_acc[op->kind][t].s += nm_now_s() - t0;
    c->prof_acc[op->kind][t].calls++;
    if (op->kind == NM_OP_MATMUL)
        for (int j = first; j <= last; j++) c->prof_acc[op->kind][t].bytes += (double)nm_tensor_bytes(ops[j].src0);
}

// Prints the profile, largest time first.
static void prof_print(nm_cpu *c) {
    static const char *kinds[NM_OP_COUNT] = {
        [NM_OP_GET_ROWS] = "get_rows", [NM_OP_RMS_NORM] = "rms_norm", [NM_OP_MATMUL] = "matmul",
        [NM_OP_ROPE] = "rope", [NM_OP_ATTENTION] = "attention", [NM_OP_GLU] = "glu", [NM_OP_ADD] = "add",
        [NM_OP_SCALE] = "scale", [NM_OP_KV_STORE] = "kv_store", [NM_OP_NORM] = "norm", [NM_OP_ACT] = "act",
        [NM_OP_ATTENTION_FULL] = "attention_full", [NM_OP_SOFTCAP] = "softcap", [NM_OP_COPY] = "copy",
        [NM_OP_PATCHES] = "patches", [NM_OP_PIXEL_SHUFFLE] = "pixel_shuffle", [NM_OP_IM2COL] = "im2col",
        [NM_OP_CONV1D] = "conv1d", [NM_OP_CONV_T1D] = "conv_t1d", [NM_OP_SHORT_CONV] = "short_conv"};
    double total = 0;
    for (int k = 0; k < NM_OP_COUNT; k++)
        for (int t = 0; t < NM_TYPE_COUNT; t++) total += c->prof_acc[k][t].s;
    if (total <= 0) return;
    fprintf(stderr,
            "cpu profile (NM_PROFILE): %.1f ms in ops (a group of matmuls over the same activations counts under "
            "its first's weight type)\n%-15s %-6s %9s %10s %9s %6s %8s\n",
            total * 1e3, "op",
            "weight", "calls", "ms", "us/call", "share", "GB/s");
    for (;;) {
        int bk = -1, bt = -1;
        for (int k = 0; k < NM_OP_COUNT; k++)
            for (int t = 0; t < NM_TYPE_COUNT; t++)
                if (c->prof_acc[k][t].calls > 0 && (bk < 0 || c->prof_acc[k][t].s > c->prof_acc[bk][bt].s)) {
                    bk = k;
                    bt = t;
                }
        if (bk < 0) break;
        const double s = c->prof_acc[bk][bt].s, by = c->prof_acc[bk][bt].bytes;
        const int64_t n = c->prof_acc[bk][bt].calls;
        fprintf(stderr, "%-15s %-6s %9lld %10.2f %9.2f %5.1f%% ", kinds[bk] ? kinds[bk] : "?",
                bk == NM_OP_MATMUL ? nm_type_traits_get((uint32_t)bt)->name : "", (long long)n, s * 1e3,
                s * 1e6 / (double)n, 100 * s / total);
        if (by > 0) fprintf(stderr, "%8.1f\n", by / s * 1e-9);
        else fprintf(stderr, "%8s\n", "");
        c->prof_acc[bk][bt].calls = 0;
    }
}

static nm_status cpu_compute(nm_backend *b, const nm_op *ops, int n_ops) {
    nm_cpu *c = b->impl;
    for (int i = 0; i < n_ops; i++) {
        const nm_op *op = &ops[i];
        const int first = i;
        const double t0 = c->prof ? nm_now_s() : 0;
        if (!cpu_supports_op(b, op)) {
            snprintf(c->err, sizeof c->err, "cpu backend: op %d not supported with these operands", op->kind);
            return NM_ERR_UNSUPPORTED;
        }
        nm_status cst = check_operands(c, op);
        if (cst != NM_OK) return cst;
        switch (op->kind) {
        case NM_OP_MATMUL: {
            if ((op->flags & NM_OPF_ROWWISE) && op->src1->ne[1] > 1 &&
                (c->k->gemv[op->src0->type] || nm_vec_dot_type(op->src0->type) == NM_TYPE_F32)) {
                // decode runs these through a gemv kernel (or the f32 dot) for one
                // token: the same, one token at a time
                nm_status st = compute_rowwise_by_token(b, op);
                if (st != NM_OK) return st;
                break;
            }
            mm_task t = {.c = c, .op = op, .act_type = nm_vec_dot_type(op->src0->type)};
            // f32 weights, and f16/bf16 weights in prefill: tiles widened once to
            // f32 and the f32 GEMM (the pairwise half-precision dots re-read
            // and re-convert each weight row for every token).
            const bool half = t.act_type == NM_TYPE_F16 || t.act_type == NM_TYPE_BF16;
            const bool rowwise = (op->flags & NM_OPF_ROWWISE) != 0;
            if (t.act_type == NM_TYPE_F32 || (half && op->src1->ne[1] > 1 && !rowwise)) {
                if (half && (op->flags & NM_OPF_GGML_F16)) {
                    // ggml rounds the inputs to f16: round them once, then the same f32 GEMM
                    nm_pool_run(c->pool, round_worker, &t, op->src1->ne[1]);
                    t.x = (const float *)c->act_q;
                }
                const int64_t T = op->src1->ne[1], O = op->src0->ne[1];
                if (c->pk && T >= NM_MM_PACK_MIN_TOKENS) {
                    nm_pool_run(c->pool, xpack_worker, &t, (T + NM_GEMM_PACK_ROWS - 1) / NM_GEMM_PACK_ROWS);
                    nm_pool_run(c->pool, mmx_worker, &t, (O + NM_MM_XROWS - 1) / NM_MM_XROWS);
                } else {
                    nm_pool_run(c->pool, mm_worker, &t, mm_chunks(c, op));
                }
                break;
            }
            t.act_row = nm_row_size(t.act_type, op->src1->ne[0]);
            t.ops[t.n_ops++] = op;
            while (t.n_ops < NM_MM_GROUP && i + 1 < n_ops && joins_group(op, &ops[i + 1])) {
                if (!cpu_supports_op(b, &ops[i + 1])) break; // reported when its turn comes
                t.ops[t.n_ops++] = &ops[++i];
            }
            for (int g = 0; g < t.n_ops; g++) t.off[g + 1] = t.off[g] + mm_chunks(c, t.ops[g]);
            nm_pool_run(c->pool, act_worker, &t, op->src1->ne[1]);
            const int64_t T = op->src1->ne[1];
            if (c->act_pack && c->k->gemmq_pack[t.act_type] && T >= NM_GQP_MIN_TOKENS && !(op->flags & NM_OPF_ROWWISE)) {
                for (int g = 0; g < t.n_ops; g++) t.packed |= c->k->gemmq_packed[t.ops[g]->src0->type] != NULL;
                if (t.packed) nm_pool_run(c->pool, pack_worker, &t, (T + NM_GQP_TOK - 1) / NM_GQP_TOK);
            }
            nm_pool_run(c->pool, mmq_worker, &t, t.off[t.n_ops]);
            break;
        }
        case NM_OP_ATTENTION: {
            const int64_t T = op->src0->ne[1];
            // the panel path widens a block's keys from its lowest to its highest: queries of one sequence
            bool one_seq = true;
            for (int64_t q = 1; q < T && one_seq; q++) one_seq = IDS(op)[q] / op->n_ctx == IDS(op)[0] / op->n_ctx;
            if (c->pk && !(op->flags & NM_OPF_GGML_F16) && !op->kv_rows && T >= NM_ATTN_PANEL_MIN_TOKENS && one_seq) {
                attn_blocks t = {c, op, (T + NM_FA_QB - 1) / NM_FA_QB};
                int64_t nk_max = 0; // the workspace for the widest block's keys
                for (int64_t q0 = 0; q0 < T; q0 += NM_FA_QB) {
                    int64_t klo, khi;
                    attn_key_range(op, q0, T < q0 + NM_FA_QB ? T : q0 + NM_FA_QB, &klo, &khi);
                    nk_max = khi - klo + 1 > nk_max ? khi - klo + 1 : nk_max;
                }
                if (nk_max <= NM_ATTN_PANEL_MAX_KEYS && reserve_attn(b, nk_max, op->i2) == NM_OK) {
                    nm_pool_run(c->pool, attn_panel_worker, &t, t.n_blocks * op->i0);
                    break;
                }
            }
            attn_task t = {c, op};
            bool shared = (op->flags & NM_OPF_GGML_F16) && T > 1 && op->i2 <= 1024;
            for (int64_t q = 1; shared && q < T; q++) shared = IDS(op)[q] == IDS(op)[0];
            const int64_t lo = attn_lo(op, IDS(op)[0]);
            if (shared && T * (IDS(op)[0] - lo + 1) <= NM_ATTN_SHARED_MAX) {
                nm_pool_run(c->pool, attn_shared_worker, &t, op->i0);
                break;
            }
            nm_pool_run(c->pool, attn_worker, &t, T * op->i0);
            break;
        }
        case NM_OP_ATTENTION_FULL: {
            const int nth = nm_pool_size(c->pool);
            fa_task t = {c, op, 1};
            // enough chunks to balance the threads, each a whole number of query blocks if it can be
            while (op->i0 * t.n_groups < 4 * nth && op->src0->ne[1] / (t.n_groups + 1) >= NM_FA_QB) t.n_groups++;
            nm_pool_run(c->pool, fa_worker, &t, op->i0 * t.n_groups);
            break;
        }
        case NM_OP_GET_ROWS:
        case NM_OP_NORM:
        case NM_OP_ACT:
        case NM_OP_RMS_NORM:
        case NM_OP_ROPE:
        case NM_OP_GLU:
        case NM_OP_ADD:
        case NM_OP_SCALE: op_rows_dispatch(c, op); break;
        case NM_OP_SOFTCAP:
        case NM_OP_PATCHES:
        case NM_OP_PIXEL_SHUFFLE:
        case NM_OP_IM2COL: op_rows_dispatch(c, op); break;
        case NM_OP_COPY: memmove(TD(op->dst), TD(op->src0), nm_tensor_bytes(op->src0)); break;
        case NM_OP_KV_STORE: op_kv_store(c, op); break;
        case NM_OP_SHORT_CONV: {
            const int nth = nm_pool_size(c->pool);
            sc_task t = {op, op->dst->ne[0] / 16 < nth ? 1 : nth};
            if (t.n_chunks == 1 || op->src0->ne[1] * op->dst->ne[0] < NM_EW_PARALLEL_MIN)
                op_short_conv(op, 0, op->dst->ne[0]);
            else
                nm_pool_run(c->pool, sc_worker, &t, t.n_chunks);
            break;
        }
        case NM_OP_CONV1D:
        case NM_OP_CONV_T1D: {
            nm_status st = op_conv(c, op);
            if (st != NM_OK) return st;
            break;
        }
        case NM_OP_COUNT: break;
        }
        if (c->prof && !c->prof_inner) prof_add(c, ops, first, i, t0);
    }
    return NM_OK;
}

static const char *cpu_last_error(const nm_backend *b) { return ((const nm_cpu *)b->impl)->err; }

static void cpu_free(nm_backend *b) {
    nm_cpu *c = b->impl;
    if (c->prof) prof_print(c);
    nm_pool_free(c->pool);
    free(c->scratch);
    free(c->act_q);
    free(c->gemv_prep);
    free(c->act_pack);
    free(c->xpack);
    free(c->attn_ws);
    for (int32_t i = 0; i < c->n_convs; i++) free(c->convs[i].packed);
    free(c->convs);
    free(c->conv_work);
    free(c);
    free(b);
}

static const nm_backend_i cpu_iface = {
    .version = NM_BACKEND_IFACE_VERSION,
    .name = "cpu",
    .get_caps = cpu_get_caps,
    .buffer_alloc = cpu_buffer_alloc,
    .buffer_free = cpu_buffer_free,
    .buffer_import_host = cpu_buffer_import_host,
    .tensor_set = cpu_tensor_set,
    .tensor_get = cpu_tensor_get,
    .supports_op = cpu_supports_op,
    .submit = cpu_compute,
    .event_record = cpu_event_record,
    .event_wait = cpu_event_wait,
    .event_sync = cpu_event_sync,
    .event_free = cpu_event_free,
    .synchronize = cpu_synchronize,
    .prepare_weight = NULL,
    .prepare_op = cpu_prepare_op,
    .last_error = cpu_last_error,
    .free = cpu_free,
};

nm_status nm_backend_cpu_new(const nm_backend_params *p, nm_backend **out, char *err, size_t err_size) {
    *out = NULL;
    const int64_t max_row = p->max_row, max_tokens = p->max_tokens;
    if (max_row <= 0 || max_tokens <= 0 || max_row > (1 << 24) || max_tokens > (1 << 20)) {
        snprintf(err, err_size, "cpu backend: rows of %lld and batches of %lld tokens are out of range",
                 (long long)max_row, (long long)max_tokens);
        return NM_ERR_INVALID_ARG;
    }
    nm_backend *b = calloc(1, sizeof *b);
    nm_cpu *c = calloc(1, sizeof *c);
    if (c) c->prof = getenv("NM_PROFILE") && getenv("NM_PROFILE")[0] == '1';
    if (c) c->no_small_batch = getenv("NM_NO_SMALL_BATCH") && getenv("NM_NO_SMALL_BATCH")[0] == '1';
    if (c) c->no_multi = getenv("NM_NO_GEMV_MULTI") && getenv("NM_NO_GEMV_MULTI")[0] == '1';
    if (!b || !c) goto fail;
    c->pool = nm_pool_create(p->n_threads);
    if (!c->pool) goto fail;
    c->k = nm_kernels_get();
    c->kref = nm_kernels_ref();
    c->gemm = nm_gemm_f32_get();
    c->pk = nm_gemm_panel_get();
    c->expsum = nm_expsum_get();
    c->xsigmoid = nm_xsigmoid_get();
    c->max_row = max_row;
    c->max_tokens = max_tokens;
    // the panel GEMM's tile: NM_MM_XROWS rows of max_row + 16 floats
    const size_t tile = c->pk ? NM_MM_XROWS * (size_t)(max_row + 16) : NM_MM_ROWS * (size_t)max_row;
    c->scratch = calloc((size_t)nm_pool_size(c->pool) * tile, sizeof(float));
    c->act_q = malloc((size_t)max_tokens * (size_t)max_row * sizeof(float));
    c->gemv_prep_bytes = (NM_GEMV_PREP_BYTES(max_row) + 63) / 64 * 64;
    c->gemv_prep = aligned_alloc(64, NM_MM_GROUP * NM_SMALL_BATCH * c->gemv_prep_bytes);
    if (c->pk) {
        c->xpack = aligned_alloc(64, (size_t)(max_tokens + NM_GEMM_PACK_ROWS - 1) / NM_GEMM_PACK_ROWS *
                                         NM_GEMM_PACK_ROWS * (size_t)max_row * sizeof(float));
        if (!c->xpack) goto fail;
    }
    bool any_packed = false;
    for (int ty = 0; ty < NM_TYPE_COUNT; ty++) any_packed |= c->k->gemmq_pack[ty] != NULL;
    if (any_packed && max_tokens >= NM_GQP_MIN_TOKENS) {
        c->act_pack = aligned_alloc(64, (size_t)(max_tokens + NM_GQP_TOK - 1) / NM_GQP_TOK * NM_GQP_BYTES(max_row) + 64);
        if (!c->act_pack) goto fail;
    }
    if (!c->scratch || !c->act_q || !c->gemv_prep) goto fail;
    b->iface = &cpu_iface;
    b->impl = c;
    if (p->attn_max_seq > 0 && reserve_attn(b, p->attn_max_seq, p->attn_head_dim) != NM_OK) {
        cpu_free(b);
        snprintf(err, err_size, "cpu backend: out of memory for attention over %lld tokens", (long long)p->attn_max_seq);
        return NM_ERR_NOMEM;
    }
    if (p->pin_threads) (void)nm_pool_pin(c->pool); // best effort: unpinned still works
    *out = b;
    return NM_OK;
fail:
    if (c) {
        nm_pool_free(c->pool);
        free(c->scratch);
        free(c->act_q);
        free(c->gemv_prep);
        free(c->act_pack);
        free(c->xpack);
    }
    free(c);
    free(b);
    snprintf(err, err_size, "cpu backend: out of memory for rows of %lld and %lld tokens", (long long)max_row,
             (long long)max_tokens);
    return NM_ERR_NOMEM;
}

// Sizes the per-thread workspace of the panel attention (NM_OP_ATTENTION_FULL
// and prefill) for sequences up to max_seq tokens of heads up to head_dim.
static nm_status reserve_attn(nm_backend *b, int64_t max_seq, int64_t head_dim) {
    nm_cpu *c = b->impl;
    if (max_seq <= 0 || head_dim <= 0 || max_seq > (1 << 20) || head_dim > 4096) return NM_ERR_INVALID_ARG;
    if (c->attn_ws && max_seq <= c->attn_max_seq && head_dim <= c->attn_max_hd) return NM_OK;
    const int64_t T = max_seq > c->attn_max_seq ? max_seq : c->attn_max_seq;
    const int64_t hd = head_dim > c->attn_max_hd ? head_dim : c->attn_max_hd;
    const int64_t per = fa_ws_floats(T, hd);
    float *ws = aligned_alloc(64, (size_t)nm_pool_size(c->pool) * (size_t)per * sizeof(float)); // per: 16 | per
    if (!ws) return NM_ERR_NOMEM;
    free(c->attn_ws);
    c->attn_ws = ws;
    c->attn_ws_floats = per;
    c->attn_max_seq = T;
    c->attn_max_hd = hd;
    return NM_OK;
}

// ---- the registry's entry --------------------------------------------------------------------

static int32_t cpu_devices(nm_device_info *out, int32_t n, bool measure) {
    if (out && n > 0) nm_host_device_info(out, measure);
    return 1;
}

static nm_status cpu_create(int32_t index, const nm_backend_params *p, nm_backend **out, char *err, size_t err_size) {
    if (index != 0) {
        snprintf(err, err_size, "device cpu:%d: the host is one device, cpu", (int)index);
        return NM_ERR_UNSUPPORTED;
    }
    return nm_backend_cpu_new(p, out, err, err_size);
}

const nm_backend_reg nm_backend_cpu_reg = {
    .version = NM_BACKEND_IFACE_VERSION, .name = "cpu", .devices = cpu_devices, .create = cpu_create};
