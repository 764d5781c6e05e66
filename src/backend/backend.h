// Backend interface: a versioned vtable of function pointers (cf. sqlite3_vfs,
// ggml-backend-impl.h). Members are only ever appended; a caller checks
// `version` before using a member added later. Optional members may be NULL.
//
// Bricks never #ifdef a backend: they describe ops (nm_op) and hand them to
// the backend they were placed on; supports_op lets the scheduler decide.
#ifndef NM_BACKEND_H
#define NM_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "nanomind.h"

#define NM_MAX_DIMS 4

// A view of a dense tensor. Rows (ne[0] elements) are contiguous and packed:
// row r of a 2-D tensor starts at data + r * nm_row_size(type, ne[0]).
typedef struct nm_tensor {
    uint32_t type;          // enum nm_type
    int64_t ne[NM_MAX_DIMS]; // ne[0] = row length; unused dims are 1
    void *data;             // borrowed (mmapped weights or backend buffer)
    const char *name;       // borrowed, may be NULL
} nm_tensor;

enum nm_op_kind {
    NM_OP_GET_ROWS,  // dst[i,:] = dequant(src0[ids[i], :])              (embedding lookup)
    NM_OP_RMS_NORM,  // dst[i,:] = src0[i,:] / rms(src0[i,:]) * src1     (src1 may be NULL)
    NM_OP_MATMUL,    // dst[t, o] = sum_k src0[o, k] * src1[t, k] (+ src2[o] bias if given)
    NM_OP_ROPE,      // rotate src0 [n_tok, n_head, head_dim] in place at positions
    NM_OP_ATTENTION, // causal attention of queries over the KV cache of one layer
    NM_OP_GLU,       // dst = act(src0) * src1, act = SiLU or GELU(tanh)
    NM_OP_ADD,       // dst = src0 + src1
    NM_OP_SCALE,     // dst = src0 * f0
    NM_OP_KV_STORE,  // write K (src0) and V (src1) rows of n_tok tokens into the cache at pos
    NM_OP_NORM,      // dst[i,:] = (src0[i,:] - mean) / sqrt(var + f0) * src1 + src2   (layer norm; src1, src2 may be NULL)
    NM_OP_ACT,       // dst = act(src0), act = i0 (enum nm_act)
    NM_OP_ATTENTION_FULL, // bidirectional attention of n_tok queries over the same n_tok keys (encoders):
                          // src0 = Q, src1 = K, src2 = V, each [n_tok, n_head * head_dim] f32; dst like Q;
                          // f0 = scale; i0 = n_head, i2 = head_dim. Needs nm_backend_cpu_reserve_attn on CPU.
    NM_OP_COUNT
};

enum nm_rope_mode { NM_ROPE_NORM = 0, NM_ROPE_NEOX = 2 };
enum nm_act { NM_ACT_SILU = 0, NM_ACT_GELU_TANH = 1, NM_ACT_GELU_QUICK = 2 }; // GELU_QUICK: x * sigmoid(1.702 x), ACT only

// The KV cache of one layer: [n_ctx, n_kv_head * head_dim] for K and for V,
// IEEE half precision (as llama.cpp's default cache): half the memory and half
// the bytes a decode step reads per cached position.
typedef struct nm_kv_layer {
    uint16_t *k; // (n_ctx, n_kv_head * head_dim) f16
    uint16_t *v; // (n_ctx, n_kv_head * head_dim) f16
} nm_kv_layer;

// One op. Shapes use ne[1] as the token count; f32 activations unless said.
typedef struct nm_op {
    enum nm_op_kind kind;
    const nm_tensor *src0, *src1, *src2;
    nm_tensor *dst;
    const int32_t *ids;   // GET_ROWS: token ids; ROPE/ATTENTION: positions
    float f0, f1, f2;     // RMS_NORM: eps; ROPE: freq_base, freq_scale; ATTENTION: scale, softcap; SCALE: factor
    int32_t i0, i1, i2, i3; // ROPE: n_head, head_dim, mode, n_rot
                            // ATTENTION: n_head, n_kv_head, head_dim, sliding window (0 = none)
                            // GLU: act
    const nm_kv_layer *kv; // ATTENTION, KV_STORE
    int32_t pos;           // KV_STORE: first position
    int32_t n_ctx;         // ATTENTION: cache capacity; KV_STORE too
    uint32_t flags;        // NM_OPF_*
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

typedef struct nm_backend nm_backend;

typedef struct nm_backend_caps {
    bool unified_memory;   // host pointers are usable by the device without copies
    bool static_shapes;    // needs fixed shapes (NPU-style)
    uint64_t weight_types; // bit (1 << nm_type) per weight type its matmul takes
} nm_backend_caps;

typedef struct nm_backend_profile {
    double mem_gbps;    // measured memory bandwidth, 0 if unknown
    double gflops_f32;  // measured, 0 if unknown
    double idle_watts, active_watts; // from configuration, 0 if unknown
} nm_backend_profile;

#define NM_BACKEND_IFACE_VERSION 1

typedef struct nm_backend_i {
    uint32_t version; // NM_BACKEND_IFACE_VERSION it was built against
    const char *name; // "cpu", "opencl", "cuda", ...
    void (*get_caps)(const nm_backend *b, nm_backend_caps *caps);
    void (*get_profile)(const nm_backend *b, nm_backend_profile *prof); // optional
    // Buffers for activations and caches, `align`-byte aligned; freed with buffer_free.
    void *(*buffer_alloc)(nm_backend *b, size_t size, size_t align);
    void (*buffer_free)(nm_backend *b, void *ptr);
    // Makes host memory (mmapped weights, a umem slot) usable by the backend
    // without a copy; returns the device-visible pointer or NULL if it cannot.
    void *(*buffer_import_host)(nm_backend *b, void *host_ptr, size_t size); // optional
    bool (*supports_op)(const nm_backend *b, const nm_op *op);
    // Executes ops in order. On failure returns a status; the backend's message
    // is available from last_error.
    nm_status (*compute)(nm_backend *b, const nm_op *ops, int n_ops);
    void (*synchronize)(nm_backend *b); // optional: NULL means compute is synchronous
    const char *(*last_error)(const nm_backend *b);
    void (*free)(nm_backend *b);
} nm_backend_i;

struct nm_backend {
    const nm_backend_i *iface;
    void *impl;
};

// ---- CPU backend -----------------------------------------------------------------
// n_threads <= 0: all online cores. Scratch is sized at creation from max_row
// (the longest weight row) and max_tokens (the most tokens of one matmul);
// nothing is allocated per op.
nm_backend *nm_backend_cpu_create(int n_threads, int64_t max_row, int64_t max_tokens);
// Pins the backend's threads to cores (see nm_pool_pin); 0 or -1.
int nm_backend_cpu_pin(nm_backend *b);
int nm_backend_cpu_n_threads(const nm_backend *b);
// Sizes the per-thread workspace of NM_OP_ATTENTION_FULL for sequences up to
// max_seq tokens of heads up to head_dim (load time; the op allocates nothing).
nm_status nm_backend_cpu_reserve_attn(nm_backend *b, int64_t max_seq, int64_t head_dim);

static inline void nm_backend_free(nm_backend *b) {
    if (b) b->iface->free(b);
}

#endif
