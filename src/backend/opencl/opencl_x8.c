// OpenCL backend, the x8 path: decode of repacked q4_0 from activations
// rounded once.
//
// With 8-bit activations (q8mv) and repacked q4_0 weights, the op that writes
// a matvec's input also writes its rounding to 8 bits into a slot of o->x8
// (kernels_x8.cl), and the matvecs that read that input take it from there:
// an RMS norm (or residual add and norm) before Q, K and V, the FFN and the
// output head; gate and up, fused with the GLU, before the down projection.
// Q, K and V (or any run of up to three matvecs of one input) go in one
// launch, gate, up and the GLU in one. A slot is valid for the op right after
// its producer only.
#include "backend/backend.h"
#include "backend/opencl/cl_api.h"
#include "backend/opencl/opencl_impl.h"

// The repacked weight of a one-token matmul the x8 path takes, else NULL.
const cl_packed *x8_weight(const nm_ocl *o, const nm_op *op) {
    if (!o->q8mv || !o->x8_ok || !o->n_packed || op->kind != NM_OP_MATMUL || op->src2 ||
        op->src0->type != NM_TYPE_Q4_0 || op->src1->ne[1] != 1 || op->src1->ne[2] * op->src1->ne[3] != 1 ||
        op->src0->ne[0] % 32 != 0)
        return NULL;
    const cl_packed *pk = ocl_packed_find(o, nm_tensor_host(op->src0));
    return pk && !pk->conv && pk->K == op->src0->ne[0] && pk->N == op->src0->ne[1] ? pk : NULL;
}

static size_t x8_bytes(int64_t K) { return (size_t)K + (size_t)K / 32 * 8; }

// Room for x8s of K values in both slots (a new buffer only between uses).
static bool x8_reserve(nm_ocl *o, int64_t K) {
    if (o->x8 && o->x8_slot >= x8_bytes(K)) return true;
    const size_t slot = (x8_bytes(K > o->max_row ? K : o->max_row) + 255) & ~(size_t)255;
    cl_int e, e2 = CL_SUCCESS;
    cl_mem m = o->api.clCreateBuffer(o->ctx, CL_MEM_READ_WRITE, 2 * slot, NULL, &e);
    // the pieces, then as many counters (mvq_res_q4_0's), 0 before the first launch
    cl_mem mp = m ? o->api.clCreateBuffer(o->ctx, CL_MEM_READ_WRITE, slot / 32 * 2 * sizeof(float), NULL, &e2) : NULL;
    const cl_int zero = 0;
    if (mp && e2 == CL_SUCCESS)
        e2 = o->api.clEnqueueFillBuffer(o->q, mp, &zero, sizeof zero, 0, slot / 32 * 2 * sizeof(float), 0, NULL, NULL);
    if (!m || !mp || e != CL_SUCCESS || e2 != CL_SUCCESS) { // the f32 path serves
        if (m) o->api.clReleaseMemObject(m);
        if (mp) o->api.clReleaseMemObject(mp);
        return false;
    }
    if (o->x8) o->api.clReleaseMemObject(o->x8); // queued kernels keep them until they are done
    if (o->x8_part) o->api.clReleaseMemObject(o->x8_part);
    o->x8 = m, o->x8_part = mp;
    o->x8_slot = slot;
    return true;
}

// The slot (0) an RMS norm or the attention at ops[j] writes its x8 to, or
// -1: one row whose next op is a matvec of the x8 path reading its output.
int x8_producer(nm_ocl *o, const nm_op *ops, int j, int n_ops) {
    const nm_op *nm = &ops[j];
    if (j + 1 >= n_ops || nm->src0->ne[1] * nm->src0->ne[2] != 1 || nm->src0->ne[0] % 32 != 0 ||
        !x8_weight(o, &ops[j + 1]) || !ocl_same_tensor(ops[j + 1].src1, nm->dst) || !x8_reserve(o, nm->src0->ne[0]))
        return -1;
    return 0;
}

static void prof_weights(nm_ocl *o, const cl_packed *const *pk, int n) {
    if (!o->prof) return;
    o->prof->cur_type = NM_TYPE_Q4_0;
    o->prof->cur_bytes = 0;
    for (int m = 0; m < n; m++) o->prof->cur_bytes += (double)pk[m]->N * (double)(pk[m]->K / 32) * 18.0;
}

// n (1..3) matvecs of the input in, one launch. With rope (NULL: none): ops
// are Q, K and V and rope[0..2] their ropes and KV store (rope_fusable), done
// in the same launch.
nm_status op_mvq(nm_ocl *o, const nm_op *ops, const cl_packed *const *pk, int n, x8_src in,
                 const nm_op *rope) {
    cl_mem wm[3], ym[3];
    cl_ulong yo[3];
    cl_int N[3];
    size_t groups = 0;
    for (int m = 0; m < 3; m++) {
        wm[m] = pk[m < n ? m : 0]->mem;
        N[m] = m < n ? (cl_int)pk[m]->N : 0;
        ym[m] = o->dummy, yo[m] = 0;
        if (m < n && !ocl_mem_of(o, ops[m].dst, &ym[m], &yo[m]))
            return ocl_fail(o, NM_ERR_UNSUPPORTED, "opencl: a matmul's output is in memory the device cannot reach");
        groups += ((size_t)N[m] + o->geom.mvq_rows - 1) / o->geom.mvq_rows;
    }
    const cl_int K = (cl_int)pk[0]->K;
    const cl_ulong q8_off = (cl_ulong)in.slot * o->x8_slot;
    const cl_mem part = in.n_part > 0 ? o->x8_part : o->dummy;
    const nm_op *op = rope ? &rope[2] : &ops[0]; // (for RESOLVE's message)
    RESOLVE(pos, rope ? rope[0].ids : NULL);
    RESOLVE(kc, rope ? &rope[2].kv->k : NULL);
    RESOLVE(vc, rope ? &rope[2].kv->v : NULL);
    const cl_int has_rope = rope != NULL, hd = rope ? rope[0].i1 : 0, n_rot = rope ? rope[0].i3 : 0;
    const float base = rope ? rope[0].f0 : 0.0f, fscale = rope ? rope[0].f1 : 0.0f;
    const karg args[] = {A(wm[0]),    A(wm[1]),  A(wm[2]), A(N[0]),   A(N[1]),   A(N[2]),   A(o->x8),  A(q8_off),
                         A(ym[0]),    A(yo[0]),  A(ym[1]), A(yo[1]),  A(ym[2]),  A(yo[2]),  A(K),      A(part),
                         A(in.n_part), A(in.eps), A(has_rope), A(pos.m), A(pos.off), A(hd),   A(n_rot),  A(base),
                         A(fscale),   A(kc.m),   A(kc.off), A(vc.m),   A(vc.off)};
    const size_t local = (size_t)o->geom.mvq_lws, global = groups * local;
    prof_weights(o, pk, n);
    return ocl_launch(o, o->k_mvq, rope ? "matvec_x8_rope_kv" : "matvec_x8", 1, &global, &local, args, 29);
}

// Gate (ops[0]) and up (ops[1]) of the input in with the GLU (ops[2]): h to
// the GLU's output and its x8 to the other slot.
nm_status op_mvq_glu(nm_ocl *o, const nm_op *ops, const cl_packed *const *pk, x8_src in) {
    cl_mem ym;
    cl_ulong yo;
    if (!ocl_mem_of(o, ops[2].dst, &ym, &yo))
        return ocl_fail(o, NM_ERR_UNSUPPORTED, "opencl: a GLU's output is in memory the device cannot reach");
    const cl_int N = (cl_int)pk[0]->N, K = (cl_int)pk[0]->K, act = ops[2].i0;
    const cl_ulong in_off = (cl_ulong)in.slot * o->x8_slot, out_off = (cl_ulong)(1 - in.slot) * o->x8_slot;
    const cl_mem part = in.n_part > 0 ? o->x8_part : o->dummy;
    const karg args[] = {A(pk[0]->mem), A(pk[1]->mem), A(N), A(o->x8), A(in_off), A(ym), A(yo),
                         A(o->x8), A(out_off), A(K), A(act), A(part), A(in.n_part), A(in.eps)};
    const size_t local = 256, global = (size_t)N / NM_CL_MVG_ROWS * local;
    prof_weights(o, pk, 2);
    return ocl_launch(o, o->k_mvq_glu, "matvec_x8_glu", 1, &global, &local, args, 14);
}

// Gate, up and their GLU at ops[i..i+2], all on the input x, fusable.
bool glu_fusable(nm_ocl *o, const nm_op *ops, int i, int n_ops, const nm_tensor *x, const cl_packed **pk) {
    if (i + 2 >= n_ops) return false;
    const nm_op *g = &ops[i], *u = &ops[i + 1], *glu = &ops[i + 2];
    pk[0] = x8_weight(o, g), pk[1] = x8_weight(o, u);
    if (!(pk[0] && pk[1] && ocl_same_tensor(g->src1, x) && ocl_same_tensor(u->src1, x) && pk[0]->N == pk[1]->N &&
          pk[0]->K == pk[1]->K && pk[0]->N % NM_CL_MVG_ROWS == 0 && glu->kind == NM_OP_GLU &&
          (glu->i0 == NM_ACT_SILU || glu->i0 == NM_ACT_GELU_TANH) && ocl_same_tensor(glu->src0, g->dst) &&
          ocl_same_tensor(glu->src1, u->dst) && ocl_same_tensor(glu->dst, g->dst) && !ocl_same_tensor(g->dst, u->dst) &&
          !ocl_same_tensor(g->dst, x) && !ocl_same_tensor(u->dst, x) && glu->dst->ne[0] == pk[0]->N && glu->dst->ne[1] == 1 &&
          o->x8_slot >= x8_bytes(pk[0]->N) && ocl_supports_op(o->self, u) && ocl_supports_op(o->self, glu)))
        return false;
    // the fused launch never writes up's output: nothing may read it before it is written again
    for (int j = i + 3; j < n_ops; j++) {
        const nm_op *r = &ops[j];
        if ((r->src0 && ocl_same_tensor(r->src0, u->dst)) || (r->src1 && ocl_same_tensor(r->src1, u->dst)) ||
            (r->src2 && ocl_same_tensor(r->src2, u->dst)))
            return false;
        if (r->dst && ocl_same_tensor(r->dst, u->dst)) break;
    }
    return true;
}

// How many matvecs from ops[i] on (1..3) go in one launch on the input x: a
// matmul joins while it reads x and none before it wrote x.
int mvq_join(nm_ocl *o, const nm_op *ops, int i, int n_ops, const nm_tensor *x, const cl_packed **pk) {
    int n = 0;
    while (n < 3 && i + n < n_ops && (pk[n] = x8_weight(o, &ops[i + n])) && pk[n]->K == pk[0]->K &&
           ocl_same_tensor(ops[i + n].src1, x) && (n == 0 || ocl_supports_op(o->self, &ops[i + n])) &&
           (n == 0 || !ocl_same_tensor(ops[i + n - 1].dst, x)))
        n++;
    return n;
}

// The matvec at ops[i] (one matrix, on an x8 without a norm factor), the
// residual add of its output at i + 1 and the RMS norm of the sum at i + 2
// as one launch (mvq_res_q4_0): where the norm's output is one row read by
// nothing but the x8 matvecs right after it (never written as f32: they
// apply its factor).
bool res_fusable(nm_ocl *o, const nm_op *ops, int i, int n_ops, const cl_packed *pk, x8_src in) {
    if (!o->x8_res || in.n_part > 0 || i + 3 >= n_ops) return false;
    const nm_op *mm = &ops[i], *add = &ops[i + 1], *nm = &ops[i + 2];
    const int64_t N = pk->N;
    if (!add_norm_pairs(add, nm) || N % NM_CL_MVS_ROWS != 0 || nm->src0->ne[0] != N ||
        nm->src0->ne[1] * nm->src0->ne[2] != 1 || (nm->src1 && nm->src1->ne[0] != N) ||
        !(ocl_same_tensor(add->src0, mm->dst) || ocl_same_tensor(add->src1, mm->dst)) ||
        ocl_same_tensor(add->src0, add->src1) || !ocl_supports_op(o->self, add) || !ocl_supports_op(o->self, nm) ||
        x8_producer(o, ops, i + 2, n_ops) < 0)
        return false;
    const cl_packed *pk2[3];
    int j = i + 3;
    if (glu_fusable(o, ops, j, n_ops, nm->dst, pk2)) j += 3;
    else j += mvq_join(o, ops, j, n_ops, nm->dst, pk2);
    for (; j < n_ops; j++) { // nothing after those reads the norm's output before it is written again
        const nm_op *r = &ops[j];
        if ((r->src0 && ocl_same_tensor(r->src0, nm->dst)) || (r->src1 && ocl_same_tensor(r->src1, nm->dst)) ||
            (r->src2 && ocl_same_tensor(r->src2, nm->dst)) || (r->ids && ocl_same_tensor(r->ids, nm->dst)))
            return false;
        if (r->dst && ocl_same_tensor(r->dst, nm->dst)) break;
    }
    return true;
}

// ops[0..2] as res_fusable says: the matvec on the input in, the add, the norm's
// x8 (without its factor) into the other slot, its sum of squares in pieces
// into o->x8_part.
nm_status op_mvq_res(nm_ocl *o, const nm_op *ops, const cl_packed *pk, x8_src in) {
    const nm_op *op = &ops[0], *add = &ops[1], *nm = &ops[2];
    const nm_tensor *a = ocl_same_tensor(add->src0, op->dst) ? add->src1 : add->src0;
    RESOLVE(y, op->dst);
    RESOLVE(ra, a);
    RESOLVE(sm, add->dst);
    RESOLVE(wn, nm->src1 ? nm->src1 : nm->src0);
    const cl_int N = (cl_int)pk->N, K = (cl_int)pk->K, has_w = nm->src1 != NULL;
    const cl_ulong in_off = (cl_ulong)in.slot * o->x8_slot, out_off = (cl_ulong)(1 - in.slot) * o->x8_slot;
    const cl_int cnt_off = (cl_int)(o->x8_slot / 32);
    const karg args[] = {A(pk->mem), A(N),      A(o->x8),  A(in_off), A(y.m),   A(y.off),   A(ra.m),
                         A(ra.off),  A(sm.m),   A(sm.off), A(wn.m),   A(wn.off), A(has_w),  A(o->x8),
                         A(out_off), A(o->x8_part), A(cnt_off), A(K)};
    const size_t local = o->mvs_lws, rows = (size_t)o->geom.mvs_rpw * (local / 32) / (size_t)o->geom.mvs_split, global = (size_t)N / rows * local;
    prof_weights(o, &pk, 1);
    // (the profile tells the down projection, K > N, from the others)
    return ocl_launch(o, o->k_mvq_res, K > N ? "matvec_x8_res_w" : "matvec_x8_res", 1, &global, &local, args, 18);
}

// Q, K and V at ops[i..i+2] (one launch of 3 matvecs), then the ropes of Q
// and K in place (mode 0: the pairs are neighbouring rows) and the KV store of
// that K and that V, for one token: all in the matvecs' launch.
bool rope_fusable(const nm_ocl *o, const nm_op *ops, int i, int n_ops, const cl_packed *const *pk) {
    if (!o->x8_rope || i + 5 >= n_ops) return false;
    const nm_op *rq = &ops[i + 3], *rk = &ops[i + 4], *st = &ops[i + 5];
    return rope_pairs(rq, rk) && rope_kv_joins(rq, rk, st) && rq->i2 == 0 && rq->src0->ne[1] == 1 &&
           rq->i3 <= rq->i1 && rq->dst == rq->src0 && rk->dst == rk->src0 && ocl_same_tensor(rq->src0, ops[i].dst) &&
           ocl_same_tensor(rk->src0, ops[i + 1].dst) && ocl_same_tensor(st->src1, ops[i + 2].dst) && rk->i1 == rq->i1 &&
           pk[0]->N == rq->src0->ne[0] && pk[1]->N == st->src0->ne[0] && pk[2]->N == st->src1->ne[0] &&
           ocl_supports_op(o->self, rq) && ocl_supports_op(o->self, rk) && ocl_supports_op(o->self, st);
}
