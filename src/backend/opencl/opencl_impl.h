// The OpenCL backend's internals, shared by its files (not installed): the
// backend's state (nm_ocl), how a kernel is launched and an operand found, the
// fusion tests the graph walk (opencl_backend.c, ocl_submit) and the x8 path
// (opencl_x8.c) both use, and the x8 path's entry points.
#ifndef NM_OPENCL_IMPL_H
#define NM_OPENCL_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "backend/opencl/cl_api.h"

// Work-group size of the reductions (decode matvec, norms, attention). A
// power of two; the kernels reduce through __local float[256].
#define NM_CL_LWS 64
#define NM_CL_MAX_IMPORTS 32
// The prefill matmul's geometry (kernels_ops.cl, mm_T): work-groups of 16 x 16
// items, each computing a tile of 32 weight rows x 32 tokens.
#define NM_CL_MM_LX 16
#define NM_CL_MM_LY 16
#define NM_CL_MM_TN 32
#define NM_CL_MM_TT 32
#define NM_CL_MAX_HD 512 // attention: head_dim limit of the kernels
#define NM_CL_MV_ROWS 4  // rows per work-group of the decode matvec (kernels.cl NM_MV_ROWS)
#define NM_CL_MVR_ROWS 8 // and of the repacked q4_0 one (NM_MVR_ROWS)
#define NM_CL_MVG_ROWS 32  // mvq_glu_q4_0 (NM_MVG_ROWS), local size 256
#define NM_CL_MVS_ROWS 32  // mvq_res_q4_0 (NM_MVS_ROWS)
#define NM_CL_ATT_DEC_KEYS 4096 // attention_dec's most keys (NM_ATT_DEC_KEYS)

// A weight laid out the device's way at load (prepare_weight): found by the
// host address the ops name it by.
typedef struct cl_packed {
    const uint8_t *host; // the weight's bytes on the host (its ops' src0; a convolution's src1)
    int64_t K, N;        // its shape (a convolution: K = k x ic, N = oc)
    bool conv;           // false: q4_0 for mv_q4_0r; true: a convolution's f32 weights as [k][ic][oc]
    int32_t conv_kind, conv_k; // (a convolution's: NM_OP_CONV1D or NM_OP_CONV_T1D, and its kernel size)
    cl_mem mem;          // the repacked copy
} cl_packed;

typedef struct cl_import {
    const uint8_t *base; // host address of the range (page-aligned)
    size_t size;
    cl_mem mem;
    bool copied;   // the device holds its own copy (no shared host memory, or a driver that copies)
    bool writable;
} cl_import;

enum { K_MV, K_MM, K_GET_ROWS, K_NKINDS };

// Kernels by weight type; NULL where the type has none.
typedef struct cl_typed {
    cl_kernel k[K_NKINDS][NM_TYPE_COUNT];
} cl_typed;

// NM_PROFILE=1: every kernel's time on the device (the queue's profiling),
// summed per (kernel, weight type), printed to stderr when the backend is
// freed. (Device idle time between kernels is the wall time less this: the
// start and end stamps of different commands are not comparable on every
// driver.)
#define NM_CL_PROF_PEND 4096
#define NM_CL_PROF_KEYS 32

typedef struct cl_prof_pend {
    const char *what;
    uint32_t type; // weight type, NM_TYPE_COUNT: none
    double bytes;  // weight bytes the kernel reads
    cl_event ev;
} cl_prof_pend;

typedef struct cl_prof {
    cl_prof_pend pend[NM_CL_PROF_PEND];
    int n_pend;
    const char *keys[NM_CL_PROF_KEYS];
    struct {
        double ns, bytes;
        int64_t calls;
    } acc[NM_CL_PROF_KEYS][NM_TYPE_COUNT + 1];
    double busy_ns;
    uint32_t cur_type; // of the op being enqueued
    double cur_bytes;
} cl_prof;

typedef struct nm_ocl {
    nm_backend *self;
    nm_cl_api api;
    cl_platform_id platform;
    cl_device_id dev;
    cl_context ctx;
    cl_command_queue q;
    cl_program prog;
    cl_typed typed;
    cl_kernel k_rms_norm, k_layer_norm, k_rope, k_kv_store, k_attention, k_glu, k_act, k_add, k_scale, k_softcap,
        k_attention_full, k_patches, k_pixel_shuffle, k_conv1d, k_conv_t1d, k_mv_q4_0r, k_mv_q4_0r8, k_mvq, k_mvq_glu, k_mvq_res,
        k_attention_dec, // NULL unless the program has PTX (warp shuffles)
        k_rope_kv, k_short_conv;
    bool unified;
    bool ptx;  // NVIDIA's compiler: the program is built with NM_DP4A_PTX (inline PTX dp4a)
    bool q8mv; // decode of repacked q4_0 with 8-bit activations (mv_q4_0r8): where dp4a is native, or NM_OPENCL_Q8MV=1
    char dev_name[128], driver[64];
    cl_ulong mem_bytes, max_alloc;
    size_t max_wg;
    size_t mv_lws; // work-group size of the decode matvec (NM_OPENCL_MV_LWS: 32..256, a power of two)
    size_t mvr_lws; // and of the repacked q4_0 one (NM_OPENCL_MVR_LWS: 32..128)
    bool x8_ok;     // the x8 path (mvq_q4_0 runs work-groups of mvq_lws, mvq_glu_q4_0 of 256; NM_OPENCL_X8=0: off)
    bool attn_dec;  // attention_dec for one-token attention where the program has it (NM_OPENCL_ATTN_DEC=0: never)
    cl_mem x8;      // two slots of x8_slot bytes: 8-bit activations (kernels_x8.cl, mvq_q4_0)
    size_t x8_slot;
    cl_mem x8_part; // x8_slot / 32 floats: mvq_res_q4_0's pieces of an RMS norm's sum of squares, then
                    // x8_slot / 32 ints: its counters of work-groups a block
    bool x8_res;    // mvq_res_q4_0: the residual add and the norm in the matvec before them (NM_OPENCL_X8_RES=0: off)
    bool x8_rope;   // Q's and K's ropes and the KV store in the Q/K/V launch (NM_OPENCL_X8_ROPE=0: off)
    size_t mvs_lws; // its work-group size (rows a work-group: geom.mvs_rpw * mvs_lws / 32 / geom.mvs_split)
    nm_cl_x8_geom geom; // the x8 matvecs' geometry (build options of the program)
    int attn_split;       // attention_dec's work-groups a head (0: from the compute units and the heads;
                          // NM_OPENCL_ATTN_SPLIT=N: N)
    cl_ulong n_cu;        // compute units
    cl_mem attn_part, attn_cnt; // attention_dec's shares and counters (attn_part_bytes, attn_cnt_heads)
    size_t attn_part_bytes, attn_cnt_heads;
    cl_import imports[NM_CL_MAX_IMPORTS];
    int n_imports;
    size_t lws_norm, lws_attn; // work-group sizes of the norms and the attention (up to 256, what each kernel allows)
    cl_packed *packed; // repacked weights (prepare_weight), sorted by host address
    int n_packed, cap_packed;
    bool repack;       // prepare_weight re-lays weights (device memory of its own; NM_OPENCL_REPACK=0: never)
    cl_mem dummy;   // bound where an optional operand is absent
    int64_t max_row, max_tokens;
    nm_ledger *ledger;
    int ep_host, ep_dev;
    uint64_t bytes_wrapped, bytes_uploaded;
    cl_prof *prof; // NM_PROFILE=1, else NULL
    char err[1024];
} nm_ocl;

// ---- opencl_backend.c ------------------------------------------------------------------

// Writes the message into o->err and returns st.
nm_status ocl_fail(nm_ocl *o, nm_status st, const char *fmt, ...);

// The device buffer and byte offset of t; false where the device cannot reach it.
bool ocl_mem_of(nm_ocl *o, const nm_tensor *t, cl_mem *m, cl_ulong *off);

// The backend's supports_op: whether the kernels take op with these operands.
bool ocl_supports_op(const nm_backend *b, const nm_op *op);

// One kernel argument: its size and where its value is.
typedef struct karg {
    size_t size;
    const void *p;
} karg;

#define A(x) ((karg){sizeof(x), &(x)})

// Sets k's n_args arguments and enqueues it (nothing where a global size is 0);
// `what` names it in errors and in the profile.
nm_status ocl_launch(nm_ocl *o, cl_kernel k, const char *what, cl_uint dim, const size_t *global,
                     const size_t *local, const karg *args, int n_args);

// A tensor's buffer and offset as kernel arguments.
typedef struct dmem {
    cl_mem m;
    cl_ulong off;
} dmem;

// dmem var for the tensor t (o->dummy where t is NULL), or return an error
// from the enclosing function (which has `o` and `op` in scope).
#define RESOLVE(var, t)                                                                                     \
    dmem var = {o->dummy, 0};                                                                               \
    if ((t) && !ocl_mem_of(o, (t), &var.m, &var.off))                                                       \
        return ocl_fail(o, NM_ERR_UNSUPPORTED, "opencl: op %d: an operand is in memory the device cannot reach " \
                        "(host memory not imported)", op->kind)

// The repacked copy (prepare_weight) of the weight at host address h, or NULL.
const cl_packed *ocl_packed_find(const nm_ocl *o, const uint8_t *h);

// One object, or the same place, type and shape.
bool ocl_same_tensor(const nm_tensor *a, const nm_tensor *b);

// An add and the RMS norm of its sum right after it, one launch can do.
bool add_norm_pairs(const nm_op *add, const nm_op *norm);
// Two ropes in a row (Q's and K's) one launch can do.
bool rope_pairs(const nm_op *a, const nm_op *b);
// A rope pair and the KV store of that K right after them.
bool rope_kv_joins(const nm_op *rq, const nm_op *rk, const nm_op *st);

// ---- opencl_x8.c: the x8 path ----------------------------------------------------------

// The input of an x8 matvec: its slot, and with n_part > 0 the RMS norm whose
// factor the matvec applies (mvq_res_q4_0 left it out: eps, the pieces in o->x8_part).
typedef struct x8_src {
    int slot;
    cl_int n_part;
    float eps;
} x8_src;

// The repacked weight of a one-token matmul the x8 path takes, else NULL.
const cl_packed *x8_weight(const nm_ocl *o, const nm_op *op);
// The slot (0) the RMS norm or attention at ops[j] writes its x8 to, or -1.
int x8_producer(nm_ocl *o, const nm_op *ops, int j, int n_ops);
// How many matvecs from ops[i] on (1..3) go in one launch on the input x.
int mvq_join(nm_ocl *o, const nm_op *ops, int i, int n_ops, const nm_tensor *x, const cl_packed **pk);
// Gate, up and their GLU at ops[i..i+2], on the input x, as one launch (op_mvq_glu).
bool glu_fusable(nm_ocl *o, const nm_op *ops, int i, int n_ops, const nm_tensor *x, const cl_packed **pk);
// A matvec, the residual add and the RMS norm at ops[i..i+2] as one launch (op_mvq_res).
bool res_fusable(nm_ocl *o, const nm_op *ops, int i, int n_ops, const cl_packed *pk, x8_src in);
// Q, K and V at ops[i..i+2] with the ropes and KV store after them in their launch (op_mvq).
bool rope_fusable(const nm_ocl *o, const nm_op *ops, int i, int n_ops, const cl_packed *const *pk);
// n (1..3) matvecs of the input in, one launch; with rope, also the ropes and KV store.
nm_status op_mvq(nm_ocl *o, const nm_op *ops, const cl_packed *const *pk, int n, x8_src in,
                 const nm_op *rope);
// Gate and up of the input in with the GLU (ops[2]); its output's x8 to the other slot.
nm_status op_mvq_glu(nm_ocl *o, const nm_op *ops, const cl_packed *const *pk, x8_src in);
// The matvec, the add and the norm (without its factor) as res_fusable says.
nm_status op_mvq_res(nm_ocl *o, const nm_op *ops, const cl_packed *pk, x8_src in);

#endif
