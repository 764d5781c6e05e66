// Backend interface v2: a versioned vtable of function pointers (cf.
// sqlite3_vfs, ggml-backend-impl.h). From version 2 on, members are only ever
// appended; a caller checks `version` before using a member added later.
// Optional members may be NULL. (Version 1 had bare host pointers for
// tensors and synchronous compute; nothing of it remains.)
//
// Bricks never name a backend: they create one by device name, describe ops
// (nm_op) on tensors in its buffers or in imported host memory, record them
// once per batch shape and submit the list; supports_op lets a planner decide.
#ifndef NM_BACKEND_H
#define NM_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "nanomind.h"
#include "quant/quant.h"

#define NM_MAX_DIMS 4

typedef struct nm_backend nm_backend;

// A block of memory a backend can read and write: allocated by one (device
// memory, a CPU arena) or wrapping host memory imported into it. `host` is
// where the host sees byte 0, NULL when the host cannot address it (device
// memory of a discrete GPU): then only tensor_set/tensor_get reach it.
typedef struct nm_buffer {
    nm_backend *owner; // the backend that allocated it
    uint8_t *host;     // host address of byte 0, or NULL
    size_t size;
    void *impl;        // the owner's handle (a cl_mem)
} nm_buffer;

// A dense tensor: (buffer, offset, type, shape). Rows (ne[0] elements) are
// contiguous and packed: row r of a 2-D tensor starts nm_row_size(type, ne[0])
// * r bytes after offs. buf == NULL is host memory (the process's own: a
// mapped model file, malloc, a umem slot), where offs is the address itself;
// a backend that is not the host's reads it where the caller imported the
// range (buffer_import_host) - in place on unified memory, once copied on a
// discrete device.
typedef struct nm_tensor {
    uint32_t type;           // enum nm_type
    int64_t ne[NM_MAX_DIMS]; // ne[0] = row length; unused dims are 1
    nm_buffer *buf;          // NULL: host memory
    size_t offs;             // bytes into buf; the address when buf is NULL
    const char *name;        // borrowed, may be NULL
} nm_tensor;

// Where the host sees element 0 of t, or NULL if it cannot (device memory).
static inline void *nm_tensor_host(const nm_tensor *t) {
    if (!t->buf) return (void *)(uintptr_t)t->offs;
    return t->buf->host ? t->buf->host + t->offs : NULL;
}
// Whether t names memory (optional weights absent from a file have neither).
static inline bool nm_tensor_is_set(const nm_tensor *t) { return t->buf != NULL || t->offs != 0; }
// A tensor of host memory at p.
static inline nm_tensor nm_tensor_at(const void *p, uint32_t type, int64_t ne0, int64_t ne1) {
    nm_tensor t = {.type = type, .ne = {ne0, ne1, 1, 1}, .buf = NULL, .offs = (size_t)(uintptr_t)p, .name = NULL};
    return t;
}
// Bytes of t's elements (rows of nm_row_size each); 0 if the type is unknown.
static inline size_t nm_tensor_bytes(const nm_tensor *t) {
    return nm_row_size(t->type, t->ne[0]) * (size_t)(t->ne[1] * t->ne[2] * t->ne[3]);
}
// The view of rows [r0, r0 + n) of a 2-D tensor.
static inline nm_tensor nm_tensor_rows(const nm_tensor *t, size_t row_bytes, int64_t r0, int64_t n) {
    nm_tensor v = *t;
    v.offs += (size_t)r0 * row_bytes;
    v.ne[1] = n;
    return v;
}

enum nm_op_kind {
    NM_OP_GET_ROWS,  // dst[i,:] = dequant(src0[ids[i], :])              (embedding lookup)
    NM_OP_RMS_NORM,  // dst[i,:] = src0[i,:] / rms(src0[i,:]) * src1     (src1 may be NULL)
    NM_OP_MATMUL,    // dst[t, o] = sum_k src0[o, k] * src1[t, k] (+ src2[o] bias if given)
    NM_OP_ROPE,      // rotate src0 [n_tok, n_head, head_dim] in place at positions
    NM_OP_ATTENTION, // causal attention of queries over the KV cache of one layer
    NM_OP_GLU,       // dst = act(src0) * src1, act = SiLU or GELU(tanh)
    NM_OP_ADD,       // dst = src0 + src1
    NM_OP_SCALE,     // dst = src0 * f0
    NM_OP_KV_STORE,  // write K (src0) and V (src1) rows of n_tok tokens into the cache rows ids[t]
    NM_OP_NORM,      // dst[i,:] = (src0[i,:] - mean) / sqrt(var + f0) * src1 + src2   (layer norm; src1, src2 may be NULL)
    NM_OP_ACT,       // dst = act(src0), act = i0 (enum nm_act)
    NM_OP_ATTENTION_FULL, // bidirectional attention of n_tok queries over the same n_tok keys (encoders):
                          // src0 = Q, src1 = K, src2 = V, each [n_tok, n_head * head_dim] f32; dst like Q;
                          // f0 = scale; i0 = n_head, i2 = head_dim (up to the sizes in nm_backend_params)
    NM_OP_SOFTCAP,   // dst = f0 * tanh(src0 / f0)   (final logit softcap)
    NM_OP_COPY,      // dst = src0, the same number of elements and type (a row into place)
    NM_OP_PATCHES,   // image patches as rows: src0 = 3 planes of i0 wide x i2 high f32 (channel, y, x; i2 = 0:
                     // square), patch side i1; dst row = the patch's (channel, y, x) elements, rows in raster
                     // order (py * gw + px, gw = i0 / i1) or, i3 = 2, in 2 x 2 groups (Qwen2-VL's merge order):
                     // row ((py/2 * gw/2 + px/2) * 2 + py%2) * 2 + px%2
    NM_OP_PIXEL_SHUFFLE, // src0 [side * side, d] -> dst [(side / s)^2, d s s], side = i0, s = i1: output row
                         // (yb, xb) = rows (yb s + dy, xb s + dx), dy outer, dx inner (idefics3)
    NM_OP_IM2COL,    // a 1-D convolution's input windows as rows (then one MATMUL is the conv): dst row t,
                     // element c * K + k = in(c, f) with f = stride t - K/2 + k, zero unless 0 <= f < T_out
                     // stride and i3 + f < L. K = i0, stride = i1, i3 = frames of the input skipped;
                     // i2 = 0: src0 is [L frames, C channels] channel-major (ne[0] = L, ne[1] = C),
                     // 1: frame-major (ne[0] = C, ne[1] = L). dst [T_out, C K] (Whisper's convs)
    NM_OP_CONV1D,    // a 1-D convolution of frame-major rows (VITS's HiFi-GAN): src0 x [n frames, ic] f32 (ne[0] = ic),
                     // src1 PyTorch's Conv1d weight [oc][ic][k]: f32 ne = {k, ic, oc}, or f16 / q8_0 ne = {k ic, oc}
                     // (an output channel's weights a row, in the same order), src2 bias [oc] or NULL;
                     // dst [n_out, oc], n_out = n + pad_l + pad_r - dil (k - 1): dst[t][o] = bias[o] + sum over
                     // j < k, c < ic of w[o][c][j] act(x[t + j dil - pad_l][c]), x zero outside [0, n), act(v) =
                     // max(v, f0 v) (a leaky ReLU first; f0 = 1: none); then dst = (dst + add[0] + add[1]) * f1
                     // (add[i] NULL: none; rows laid out as dst's; dst may be add[i], never x). i0 = dil,
                     // i1 = pad_l, i2 = pad_r, i3 = the index of dst's first row in a whole sequence that x is
                     // a part of (0: x is whole; a backend whose sums depend on a row's place, the CPU's
                     // Winograd tiles, places them as in the whole). The sums' order is the backend's
                     // (results within rounding)
    NM_OP_CONV_T1D,  // PyTorch's ConvTranspose1d on frame-major rows: src0 x [n, ic], src1 weight [ic][oc][k] (f32
                     // ne = {k, oc, ic}, f16 / q8_0 {k oc, ic}), src2 bias [oc] or NULL, dst [n_out, oc], n_out = (n - 1) stride - 2 pad
                     // + k: dst[t][o] = bias[o] + sum over (s, j) with s stride + j - pad = t of sum_c w[c][o][j]
                     // act(x[s][c]); act as CONV1D's (f0). i0 = stride, i1 = pad, i3 = x's first row's index
                     // in a whole sequence (as CONV1D's i3)
    NM_OP_SHORT_CONV, // LFM2's gated short convolution, causal over each sequence's positions: src0 [n_tok, 3 d]
                     // rows (b | c | x), src1 f32 [d][L] (ne = {L, d}: a channel's taps, oldest first), dst [n_tok,
                     // d] = c * sum_{k < L} w[k] bx(p - L + 1 + k), bx = b * x, bx of positions < 0 zero. ids:
                     // s n_ctx + p, as KV_STORE's; a sequence's rows in order. state (f32, d wide): i2 rows a
                     // sequence, the first i1 a ring (position p's bx in row p % i1, i1 >= L), then for each
                     // checkpoint position q = j i3 (j = 1, 2, ..) L - 1 rows, bx of q - L + 1 .. q - 1. Reads
                     // the L - 1 rows before p from the ring; writes p's row and the checkpoint rows it fills.
                     // i0 = L
    NM_OP_COUNT
};

// NM_ROPE_MROPE (Qwen2-VL's multi-axis rope, ggml's mode 8): NeoX halves; ids hold three position streams
// (t, h, w) of n_tok each, one after the other; pair k of n_rot / 2 turns by stream t, h or w as
// k % (s0 + s1 + s2 + s3) falls in section 0, 1 or 2 of op.rope_sections, and not at all in section 3
// (llama.cpp's fourth stream, 0 for text and images alike).
// NM_ROPE_VISION (Qwen2-VL's ViT, ggml's mode 24): ids hold two streams (row, column) of n_tok each; the
// head's n_rot / 2 pairs (k, k + n_rot / 2) split at s = rope_sections[0]: pair k < s turns by the row at
// frequency index k, pair k >= s by the column at index k - s; the frequency of index j is
// base^(-2 j / (n_rot / 2)) (the index restarts at the split, ggml's independent sections).
enum nm_rope_mode { NM_ROPE_NORM = 0, NM_ROPE_NEOX = 2, NM_ROPE_MROPE = 8, NM_ROPE_VISION = 24 };
// GELU_QUICK: x * sigmoid(1.702 x); TANH: tanh(x) (HiFi-GAN's last step); both ACT only.
enum nm_act { NM_ACT_SILU = 0, NM_ACT_GELU_TANH = 1, NM_ACT_GELU_QUICK = 2, NM_ACT_TANH = 3 };

// The KV cache of one layer: K and V, each [n_kv_head * head_dim, n_ctx],
// IEEE half precision (as llama.cpp's default cache): half the memory and half
// the bytes a decode step reads per cached position.
typedef struct nm_kv_layer {
    nm_tensor k, v; // f16 (n_ctx rows of n_kv_head * head_dim)
} nm_kv_layer;

// One op. Shapes use ne[1] as the token count; f32 activations unless said.
// Everything an op reads at run time is a tensor (token ids and positions
// too), so a recorded op list replays with new inputs written into them.
typedef struct nm_op {
    enum nm_op_kind kind;
    const nm_tensor *src0, *src1, *src2;
    nm_tensor *dst;
    const nm_tensor *ids; // i32 (n_tok): GET_ROWS token ids; ROPE/ATTENTION/KV_STORE positions
    float f0, f1, f2;     // RMS_NORM: eps; ROPE: freq_base, freq_scale; ATTENTION: scale, softcap; SCALE: factor
    int32_t i0, i1, i2, i3; // ROPE: n_head, head_dim, mode, n_rot
                            // ATTENTION: n_head, n_kv_head, head_dim, sliding window (0 = none)
                            // GLU: act
    int32_t rope_sections[4]; // ROPE, mode NM_ROPE_MROPE: the pairs of the t, h, w and e streams;
                              // NM_ROPE_VISION: [0] the pairs of the row stream
    const nm_kv_layer *kv; // ATTENTION, KV_STORE (rows at the positions in ids)
    int32_t n_ctx;         // ATTENTION, KV_STORE: cache capacity of a sequence. Without kv_rows the cache
                           // may hold several sequences of n_ctx rows each (rows = n_seq x n_ctx): an id
                           // is then s x n_ctx + position, and a query attends only its sequence's rows
    uint32_t flags;        // NM_OPF_*
    // ATTENTION, KV_STORE: i32 (>= n_ctx entries), the cache row that holds
    // each position; NULL: position p is row p. Sequences that share a prefix
    // (Whisper's beams) point at the same rows instead of copying them.
    const nm_tensor *kv_rows;
    const nm_tensor *add[2]; // CONV1D: terms added to the sums as they are stored (NULL: none); f1 the scale
    nm_tensor *state;        // SHORT_CONV: the sequences' convolution state (read and written)
} nm_op;

// Round as ggml's CPU backend does around half-precision tensors, for bricks
// that must reproduce a ggml-based engine bit for bit in practice (Whisper
// against whisper.cpp). MATMUL: inputs go through the weights' vec_dot type
// (f16 for f16 weights) in prefill too. ACT GELU_TANH: through f16, as ggml's
// lookup table (input and result rounded; x <= -10 gives 0, x >= 10 gives x).
// ATTENTION, ATTENTION_FULL: Q (and K, V for ATTENTION_FULL) rounded to f16,
// the scale applied after the dot, the softmax normalized and rounded to f16
// before the weighted sum of V (ggml's K*Q, soft_max_ext, V*KQ), the C
// library's expf (or, on AVX-512, a vector form checked to give its bits).
#define NM_OPF_GGML_F16 1u
// MATMUL: each token's row of the product exactly as a one-token call
// computes it (the decode kernels, in their order of sums), the weights read
// once for all the tokens: a batch of independent sequences, one token each
// (Whisper's beams), gives what decoding them one by one gives.
#define NM_OPF_ROWWISE 2u

typedef struct nm_backend_caps {
    bool unified_memory;   // host memory is the device's: an import wraps it in place, never copies
    bool static_shapes;    // needs fixed shapes (NPU-style)
    bool async;            // submit returns before the work is done (wait on an event)
    bool host_memory;      // ops read any host memory as it is, no import needed (the CPU)
    uint64_t weight_types; // bit (1 << nm_type) per weight type its matmul takes
    int n_threads;         // CPU threads it computes on (0 for a device)
    uint64_t mem_bytes;    // memory it can allocate (0 if unknown)
} nm_backend_caps;

// What a backend did with memory, for --stats.
typedef struct nm_backend_stats {
    uint64_t bytes_wrapped;  // host memory imported in place (no copy)
    uint64_t bytes_uploaded; // host memory copied to the device (imports on a discrete device, repacks)
    char device[128];        // the device's own name
} nm_backend_stats;

// A point in a backend's stream of work (see event_record). Backends extend
// it (this struct first).
typedef struct nm_event {
    nm_backend *owner; // the backend that recorded it
} nm_event;

// What prepare_op made of an op (nm_backend_prepare_op).
typedef struct nm_op_prep {
    bool copied;   // the op reads the backend's copy of its weight only (the caller may give the pages back)
    int32_t reach; // a convolution's reach (nm_conv_reach) as this backend places its sums; 0 for other ops
} nm_op_prep;

#define NM_BACKEND_IFACE_VERSION 7 // 3: nm_op.kv_rows; 4: no get_profile (the units' profiles are measured by
                                   // src/sched); 5: CONV1D, CONV_T1D, nm_op.add, prepare_op; 6: nm_op_prep;
                                   // 7: SHORT_CONV, nm_op.state

// A backend's operations. Callers go through the nm_backend_* wrappers below,
// never through the members: the wrappers give the optional members (marked)
// their meaning when they are NULL. nm_backend_create checks a new backend's
// table (its version, every member not marked optional set).
typedef struct nm_backend_i {
    uint32_t version; // NM_BACKEND_IFACE_VERSION it was built against
    const char *name; // "cpu", "opencl", "cuda", ...
    void (*get_caps)(const nm_backend *b, nm_backend_caps *caps);
    // A buffer of `size` bytes, contents unspecified (pages a device never
    // touches may cost nothing); NULL on failure, last_error says why.
    nm_buffer *(*buffer_alloc)(nm_backend *b, size_t size);
    void (*buffer_free)(nm_backend *b, nm_buffer *buf);
    // Makes host memory [p, p + size) (mapped weights, a umem slot) readable
    // by the backend's ops: wrapped in place where memory is unified (nothing
    // copied), uploaded once otherwise (counted in the ledger as a copy).
    // Ops may then take host tensors inside the range. Writable: the host and
    // the device both write it (a hand-over slot); fence with events.
    nm_status (*buffer_import_host)(nm_backend *b, const void *p, size_t size, bool writable);
    // Host <-> tensor bytes [offs, offs + n) of t (a buffer of this backend or
    // imported host memory); ordered after the work submitted before, and
    // complete on return.
    nm_status (*tensor_set)(nm_backend *b, const nm_tensor *t, size_t offs, const void *src, size_t n);
    nm_status (*tensor_get)(nm_backend *b, const nm_tensor *t, size_t offs, void *dst, size_t n);
    // Whether the backend runs op, from its kind, types and shapes alone (plan
    // time: the values in ids are checked when it runs).
    bool (*supports_op)(const nm_backend *b, const nm_op *op);
    // Runs an op list (a recorded graph) in order. Returns once it is queued
    // where caps.async, else once it is done. On failure returns a status;
    // the message is in last_error.
    nm_status (*submit)(nm_backend *b, const nm_op *ops, int n_ops);
    // An event marking the end of the work submitted so far; event_wait makes
    // b's later work wait for an event of any backend; event_sync waits on
    // the host. Events are freed by the backend that recorded them.
    nm_event *(*event_record)(nm_backend *b);
    nm_status (*event_wait)(nm_backend *b, nm_event *ev);
    nm_status (*event_sync)(nm_backend *b, nm_event *ev);
    void (*event_free)(nm_backend *b, nm_event *ev);
    nm_status (*synchronize)(nm_backend *b); // waits for all submitted work
    // Optional: lets a backend lay a weight out its own way at load (a
    // repack, an upload), counted in the ledger and in --stats; ops then name
    // the weight as before.
    nm_status (*prepare_weight)(nm_backend *b, const nm_tensor *w);
    // Optional: lays out the weight an op reads (a convolution's src1) its own
    // way once, before the op is first submitted (at load; where a backend
    // has it, a CONV1D or CONV_T1D it did not prepare is refused at submit:
    // nothing is laid out mid-stream). *p comes set as a backend without it
    // would leave it (nm_backend_prepare_op); it sets p->copied where the op
    // now reads the backend's copy only (the caller may give the weight's
    // pages back), and p->reach where its sums reach further (tiles). The
    // copies live as long as the backend, found by the weight's address: that
    // memory must hold the same weights (not be freed and reused for others)
    // until the backend is freed.
    nm_status (*prepare_op)(nm_backend *b, const nm_op *op, nm_op_prep *p);
    const char *(*last_error)(const nm_backend *b);
    void (*free)(nm_backend *b);
    void (*get_stats)(const nm_backend *b, nm_backend_stats *s); // optional
} nm_backend_i;

struct nm_backend {
    const nm_backend_i *iface;
    void *impl;
};

// What a brick asks of a backend at creation: sizes of its largest ops, so
// that nothing is allocated per op.
typedef struct nm_backend_params {
    int n_threads;          // CPU threads; <= 0: all online cores
    bool pin_threads;       // pin the threads to cores (best effort)
    int64_t max_row;        // longest weight row
    int64_t max_tokens;     // most tokens of one matmul
    int64_t attn_max_seq;   // NM_OP_ATTENTION_FULL: longest sequence (0: none)
    int64_t attn_head_dim;  // and its head size
    nm_ledger *ledger;      // where copies the backend makes are counted; may be NULL
} nm_backend_params;

// Creates a backend by device name, through the registry (registry.h): a
// backend's name alone (its first device: "cpu", "opencl"), NAME:N, or
// NAME:auto where the backend picks ("opencl:auto": the first GPU). The new
// backend's table is checked (nm_backend_iface_check). NM_ERR_INVALID_ARG
// for a name no backend has (err lists those there are); NM_ERR_UNSUPPORTED
// with a message in err when the device does not exist here.
nm_status nm_backend_create(const char *device, const nm_backend_params *p, nm_backend **out, char *err,
                            size_t err_size);

// ---- the wrappers: what callers use (the members' contracts above) -----------------------
static inline void nm_backend_free(nm_backend *b) {
    if (b) b->iface->free(b);
}
static inline const char *nm_backend_name(const nm_backend *b) { return b->iface->name; }
static inline void nm_backend_get_caps(const nm_backend *b, nm_backend_caps *caps) { b->iface->get_caps(b, caps); }
static inline nm_buffer *nm_backend_buffer_alloc(nm_backend *b, size_t size) { return b->iface->buffer_alloc(b, size); }
static inline void nm_backend_buffer_free(nm_backend *b, nm_buffer *buf) { b->iface->buffer_free(b, buf); }
static inline nm_status nm_backend_import_host(nm_backend *b, const void *p, size_t size, bool writable) {
    return b->iface->buffer_import_host(b, p, size, writable);
}
static inline nm_status nm_backend_tensor_set(nm_backend *b, const nm_tensor *t, size_t offs, const void *src, size_t n) {
    return b->iface->tensor_set(b, t, offs, src, n);
}
static inline nm_status nm_backend_tensor_get(nm_backend *b, const nm_tensor *t, size_t offs, void *dst, size_t n) {
    return b->iface->tensor_get(b, t, offs, dst, n);
}
static inline bool nm_backend_supports_op(const nm_backend *b, const nm_op *op) { return b->iface->supports_op(b, op); }
static inline nm_status nm_backend_submit(nm_backend *b, const nm_op *ops, int n_ops) {
    return b->iface->submit(b, ops, n_ops);
}
static inline nm_event *nm_backend_event_record(nm_backend *b) { return b->iface->event_record(b); }
static inline nm_status nm_backend_event_wait(nm_backend *b, nm_event *ev) { return b->iface->event_wait(b, ev); }
static inline nm_status nm_backend_event_sync(nm_backend *b, nm_event *ev) { return b->iface->event_sync(b, ev); }
static inline void nm_backend_event_free(nm_backend *b, nm_event *ev) { b->iface->event_free(b, ev); }
static inline nm_status nm_backend_synchronize(nm_backend *b) { return b->iface->synchronize(b); }
// Whether the backend lays weights out its own way (prepare_weight set).
static inline bool nm_backend_prepares_weights(const nm_backend *b) { return b->iface->prepare_weight != NULL; }
// NM_OK with nothing done where the backend reads weights as they are.
static inline nm_status nm_backend_prepare_weight(nm_backend *b, const nm_tensor *w) {
    return b->iface->prepare_weight ? b->iface->prepare_weight(b, w) : NM_OK;
}
// A convolution op's kernel size, input and output channels from its weight's shape and type (f32
// {k, ic, oc}, f16 / q8_0 {k ic, oc}; transposed with ic and oc swapped), false where they do not fit.
static inline bool nm_conv_dims(const nm_op *op, int64_t *k, int64_t *ic, int64_t *oc) {
    const nm_tensor *w = op->src1;
    const bool t = op->kind == NM_OP_CONV_T1D;
    int64_t a, b;
    if (w->type == NM_TYPE_F32) {
        *k = w->ne[0], a = w->ne[1], b = w->ne[2];
        if (w->ne[3] != 1) return false;
    } else if (w->type == NM_TYPE_F16 || w->type == NM_TYPE_Q8_0) {
        a = t ? op->dst->ne[0] : op->src0->ne[0], b = w->ne[1];
        if (a < 1 || w->ne[0] % a || w->ne[2] != 1 || w->ne[3] != 1) return false;
        *k = w->ne[0] / a;
    } else {
        return false;
    }
    *ic = t ? b : a, *oc = t ? a : b;
    return *k >= 1;
}

// Rows a sequence's NM_OP_SHORT_CONV state takes: a ring of W rows, then L - 1 rows for each checkpoint
// position j S (j >= 1) below n_ctx.
static inline int64_t nm_short_conv_rows(int64_t L, int64_t W, int64_t S, int64_t n_ctx) {
    return W + (n_ctx - 1) / S * (L - 1);
}

// The shape rules of NM_OP_SHORT_CONV (above).
static inline bool nm_short_conv_ok(const nm_op *op) {
    const nm_tensor *x = op->src0, *w = op->src1, *y = op->dst, *st = op->state;
    if (!x || !w || !y || !st || !op->ids || op->n_ctx <= 0) return false;
    const int64_t d = y->ne[0], L = op->i0, W = op->i1, R = op->i2, S = op->i3;
    return x->type == NM_TYPE_F32 && w->type == NM_TYPE_F32 && y->type == NM_TYPE_F32 && st->type == NM_TYPE_F32 &&
           op->ids->type == NM_TYPE_I32 && L >= 2 && L <= 64 && W >= L && S >= 1 && d >= 1 && x->ne[0] == 3 * d &&
           x->ne[1] == y->ne[1] && w->ne[0] == L && w->ne[1] == d && st->ne[0] == d &&
           R == nm_short_conv_rows(L, W, S, op->n_ctx) && st->ne[1] >= R && st->ne[1] % R == 0 &&
           op->ids->ne[0] >= x->ne[1];
}

// The shape rules of NM_OP_CONV1D and NM_OP_CONV_T1D (above): f32 activations, the weight against x's
// and dst's channels, the output length, the add terms.
static inline bool nm_conv_op_ok(const nm_op *op) {
    const nm_tensor *x = op->src0, *y = op->dst;
    int64_t k, ic, oc;
    if (x->type != NM_TYPE_F32 || y->type != NM_TYPE_F32 || (op->src2 && op->src2->type != NM_TYPE_F32) ||
        !nm_conv_dims(op, &k, &ic, &oc) || !(op->f0 == op->f0))
        return false;
    const int64_t n = x->ne[1];
    if (n < 1 || x->ne[2] * x->ne[3] != 1 || y->ne[2] * y->ne[3] != 1 || x->ne[0] != ic || y->ne[0] != oc ||
        (op->src2 && op->src2->ne[0] != oc))
        return false;
    if (op->kind == NM_OP_CONV_T1D)
        return op->i0 >= 1 && op->i1 >= 0 && y->ne[1] == (n - 1) * op->i0 - 2 * (int64_t)op->i1 + k && y->ne[1] >= 1 &&
               !op->add[0] && !op->add[1];
    if (op->i0 < 1 || op->i1 < 0 || op->i2 < 0 || y->ne[1] != n + op->i1 + op->i2 - (int64_t)op->i0 * (k - 1) ||
        y->ne[1] < 1 || !(op->f1 == op->f1))
        return false;
    for (int i = 0; i < 2; i++)
        if (op->add[i] && (op->add[i]->type != NM_TYPE_F32 || op->add[i]->ne[0] != oc || op->add[i]->ne[1] != y->ne[1]))
            return false;
    return true;
}

// The input rows beyond an output's own (each side) that a convolution's output depends on: kernel k,
// dilation dil (CONV1D) or stride (CONV_T1D, in input rows: its taps' span, and one for the phase), its
// sums placed in tiles of `tile` outputs on the whole sequence's grid (0 or 1: each output alone; a tile
// of m adds its other m - 1 outputs' rows, times dil). A part of a sequence given this many rows of its
// neighbours (its i3 set) computes the whole's outputs there bit for bit.
static inline int32_t nm_conv_reach(enum nm_op_kind kind, int32_t k, int32_t dil_or_stride, int32_t tile) {
    const int32_t d = dil_or_stride, more = tile > 1 ? tile - 1 : 0;
    if (kind == NM_OP_CONV_T1D) return (k + d - 1) / d + 1 + more;
    return (d * (k - 1) + 1) / 2 + more * d;
}

// NM_OK with *p {false, the direct form's reach} where the backend reads an op's weights as they are.
static inline nm_status nm_backend_prepare_op(nm_backend *b, const nm_op *op, nm_op_prep *p) {
    int64_t k = 0, ic, oc;
    const bool conv = (op->kind == NM_OP_CONV1D || op->kind == NM_OP_CONV_T1D) && nm_conv_dims(op, &k, &ic, &oc);
    *p = (nm_op_prep){.reach = conv ? nm_conv_reach(op->kind, (int32_t)k, op->i0, 0) : 0};
    return b->iface->prepare_op ? b->iface->prepare_op(b, op, p) : NM_OK;
}
static inline const char *nm_backend_last_error(const nm_backend *b) { return b->iface->last_error(b); }
// Zeroes *s where the backend keeps no stats.
static inline void nm_backend_get_stats(const nm_backend *b, nm_backend_stats *s) {
    *s = (nm_backend_stats){0};
    if (b->iface->get_stats) b->iface->get_stats(b, s);
}

// Submits ops and waits for them (the host reads their results next).
static inline nm_status nm_backend_run(nm_backend *b, const nm_op *ops, int n_ops) {
    nm_status st = nm_backend_submit(b, ops, n_ops);
    return st == NM_OK ? nm_backend_synchronize(b) : st;
}

#endif
