// nanomind's OpenCL C kernels, part 2 of 3 (cmake/embed.cmake joins kernels.cl, kernels_x8.cl and
// kernels_ops.cl into one program, in that order: the conventions and helpers are kernels.cl's).

// ---- decode of repacked q4_0 from activations rounded once ------------------------------
//
// mv_q4_0r8 rounds the activations to 8 bits in every work-group; here the
// kernel that produces a matvec's input rounds it once, as it writes it, and
// the matvecs read the result ("x8": the K int8 of q8_0's rounding of each
// block of 32, then at byte K the K/32 float2 (d, sum of the block's q); its
// offset a multiple of 16, K of 32: the int8 go as uint4 stores). The
// rounding is mv_q4_0r8's (q8_store). Producers: rms_norm with has_q8, and
// mvq_glu_q4_0 (gate and up with the GLU). Consumers: mvq_q4_0, which also
// takes up to three matrices of one input in one launch (Q, K and V).
// On NVIDIA's OpenCL a launch costs ~5 us of host time, as much as a 4096 x
// 4096 q4_0 matvec on the H200: fewer launches is most of the gain.

// The rounding of the 32 values v (8 float4) into block b of an x8 of K values.
NM_INLINE void q8_store(const float4 *v, __global uchar *Q8, ulong q8_off, int K, int b) {
    uint q[8];
    float dx;
    const int sx = q8_round(v, q, &dx);
    __global uint4 *qs = (__global uint4 *)(Q8 + q8_off) + 2 * (ulong)b;
    qs[0] = (uint4)(q[0], q[1], q[2], q[3]);
    qs[1] = (uint4)(q[4], q[5], q[6], q[7]);
    ((__global float2 *)(Q8 + q8_off + (ulong)K))[b] = (float2)(dx, (float)sx);
}

// Rope's turn (see "rope" below): cos and sin of pair i's angle at position pos.
NM_INLINE float2 rope_cs(int pos, int i, int n_rot, float freq_base, float freq_scale) {
    const float p = (float)pos * freq_scale;
    const float ex = -2.0f * (float)i / (float)n_rot;
#ifdef NM_HAVE_FP64
    const float theta = p * (float)pow((double)freq_base, (double)ex);
    return (float2)((float)cos((double)theta), (float)sin((double)theta));
#else
    const float theta = p * pow(freq_base, ex);
    return (float2)(cos(theta), sin(theta));
#endif
}

// An RMS norm's factor 1 / sqrt(sum / d + eps), the sum being that of every
// item's pv (each work-group sums the same pieces in the same order: the same
// factor everywhere). Barriers inside: call from all items; red: __local
// float[local size].
NM_INLINE float norm_scale(float pv, __local float *red, int d, float eps) {
    return 1.0f / sqrt(wg_sum(pv, red) / (float)d + eps);
}


#ifdef NM_DP4A_PTX
// The sum over the 32 threads of a warp (NVIDIA: a work-group's items 32k..32k+31).
NM_INLINE float shfl_xor(float v, int o) {
    uint t;
    asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=r"(t) : "r"(as_uint(v)), "r"(o));
    return as_float(t);
}

NM_INLINE float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) {
        uint t;
        asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=r"(t) : "r"(as_uint(v)), "r"(o));
        v += as_float(t);
    }
    return v;
}
#endif

// y_m[n] = sum_k W_m[n, k] x[k] for up to three repacked q4_0 matrices m of
// one input (N_m rows each, N_m = 0: absent), x as x8. A work-group takes
// NM_MVQ_ROWS rows of one matrix; an item NM_MVQ_B blocks of each per step,
// every load issued before the arithmetic.
// Launch: 1-D, global = sum_m ceil(N_m / NM_MVQ_ROWS) * LWS, local = LWS, a
// power of two, 32 <= LWS <= NM_MVQ_LWS. The three are build options the host
// sets (NM_OPENCL_MVQ; NM_MVQ_ROWS even: rope's pairs stay in a work-group).
#ifndef NM_MVQ_ROWS
#define NM_MVQ_ROWS 8 // (nm_cl_x8_geom_get's defaults)
#endif
#ifndef NM_MVQ_B
#define NM_MVQ_B 2
#endif
#ifndef NM_MVQ_LWS
#define NM_MVQ_LWS 64
#endif
// With n_part > 0 the input is the x8 of an RMS norm's x w without its
// 1 / sqrt(mean(x^2) + eps) (mvq_res_q4_0 wrote it, and sum x^2 in n_part
// pieces to Part): the sums are multiplied by that factor (norm_scale).
// With rope = 1 the three matrices are one token's Q, K and V: Q's and K's
// pairs (2i, 2i + 1) of each head of head_dim (rope mode 0: a work-group's two
// rows are a pair) are turned as `rope` turns them at position Pos[0], and K
// and V go on to row Pos[0] of the caches Kc and Vc too (N1 = N2 halves a row,
// rounded to nearest even as kv_store does): the ropes and the KV store cost
// no launch of their own.
__kernel void mvq_q4_0(__global const uchar *W0, __global const uchar *W1, __global const uchar *W2, int N0, int N1,
                       int N2, __global const uchar *Q8, ulong q8_off, __global uchar *Y0, ulong y0_off,
                       __global uchar *Y1, ulong y1_off, __global uchar *Y2, ulong y2_off, int K,
                       __global const float *Part, int n_part, float eps, int rope, __global const uchar *Pos,
                       ulong pos_off, int head_dim, int n_rot, float freq_base, float freq_scale, __global uchar *Kc,
                       ulong kc_off, __global uchar *Vc, ulong vc_off) {
#ifdef NM_DP4A_PTX
    __local float red[NM_MVQ_ROWS * NM_MVQ_LWS / 32];
#else
    __local float red[NM_MVQ_ROWS * NM_MVQ_LWS];
#endif
    __local float nred[NM_MVQ_LWS];
    const int lid = get_local_id(0), lws = get_local_size(0), nb = K >> 5;
    float pv = 0.0f; // this item's pieces of sum x^2, loaded before the weights
    for (int i = lid; i < n_part; i += lws) pv += Part[i];
    const int g0 = (N0 + NM_MVQ_ROWS - 1) / NM_MVQ_ROWS, g1 = (N1 + NM_MVQ_ROWS - 1) / NM_MVQ_ROWS;
    int g = get_group_id(0), N = N0, m = 0;
    __global const uchar *W = W0;
    __global uchar *Y = Y0 + y0_off;
    if (g >= g0 + g1) g -= g0 + g1, N = N2, W = W2, Y = Y2 + y2_off, m = 2;
    else if (g >= g0) g -= g0, N = N1, W = W1, Y = Y1 + y1_off, m = 1;
    const int n0 = g * NM_MVQ_ROWS;
    __global const uint4 *qs = (__global const uint4 *)W;
    __global const half *ds = (__global const half *)(W + (ulong)N * nb * 16);
    __global const uint4 *xq = (__global const uint4 *)(Q8 + q8_off);
    __global const float2 *xd = (__global const float2 *)(Q8 + q8_off + (ulong)K);
    float acc[NM_MVQ_ROWS];
    for (int r = 0; r < NM_MVQ_ROWS; r++) acc[r] = 0.0f;
    for (int b0 = lid; b0 < nb; b0 += lws * NM_MVQ_B) {
        uint4 q[NM_MVQ_B][NM_MVQ_ROWS];
        float d[NM_MVQ_B][NM_MVQ_ROWS];
        for (int j = 0; j < NM_MVQ_B; j++) {
            const int b = min(b0 + j * lws, nb - 1); // past the row: block nb - 1 again, unused
            for (int r = 0; r < NM_MVQ_ROWS; r++) {
                const ulong i = (ulong)min(n0 + r, N - 1) * nb + b;
                q[j][r] = qs[i];
                d[j][r] = vload_half(i, ds);
            }
        }
        for (int j = 0; j < NM_MVQ_B; j++) {
            const int b = b0 + j * lws;
            if (b < nb) {
                const uint4 x0 = xq[2 * b], x1 = xq[2 * b + 1];
                const float2 xs = xd[b];
                for (int r = 0; r < NM_MVQ_ROWS; r++) acc[r] += d[j][r] * (xs.x * (float)q4x8(q[j][r], x0, x1, -8 * (int)xs.y));
            }
        }
    }
    const float sc = n_part > 0 ? norm_scale(pv, nred, K, eps) : 1.0f;
    float mine = 0.0f; // row n0 + lid's sum, lid < NM_MVQ_ROWS
#ifdef NM_DP4A_PTX
    const int nw = lws >> 5;
    for (int r = 0; r < NM_MVQ_ROWS; r++) acc[r] = warp_sum(acc[r]);
    if ((lid & 31) == 0)
        for (int r = 0; r < NM_MVQ_ROWS; r++) red[r * nw + (lid >> 5)] = acc[r];
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid < NM_MVQ_ROWS)
        for (int i = 0; i < nw; i++) mine += red[lid * nw + i];
#else
    for (int r = 0; r < NM_MVQ_ROWS; r++) red[r * lws + lid] = acc[r];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int st = lws >> 1; st > 0; st >>= 1) {
        if (lid < st)
            for (int r = 0; r < NM_MVQ_ROWS; r++) red[r * lws + lid] += red[r * lws + lid + st];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid < NM_MVQ_ROWS) mine = red[lid * lws];
#endif
    mine *= sc;
    if (rope) { // the pair's other row (n0 even, NM_MVQ_ROWS even: rows lid and lid ^ 1 are a pair)
        if (lid < NM_MVQ_ROWS) nred[lid] = mine;
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid < NM_MVQ_ROWS && n0 + lid < N) {
        const int r = n0 + lid, pos = rope ? ((__global const int *)(Pos + pos_off))[0] : 0, i = (r % head_dim) >> 1;
        if (rope && m < 2 && i < n_rot / 2) {
            const float2 cs = rope_cs(pos, i, n_rot, freq_base, freq_scale);
            const float x0 = nred[lid & ~1], x1 = nred[lid | 1];
            mine = (lid & 1) == 0 ? x0 * cs.x - x1 * cs.y : x0 * cs.y + x1 * cs.x;
        }
        ((__global float *)Y)[r] = mine;
        if (rope && m > 0) vstore_half_rte(mine, (ulong)pos * N + r, (__global half *)(m == 1 ? Kc + kc_off : Vc + vc_off));
    }
}

// y = W x (one repacked q4_0 matrix, x as x8) with the residual add and the
// first half of the RMS norm after it: s = a + y to S (S may be A), y to Y;
// for each block of 32 rows, the x8 of s w (Wn, the norm's weight; has_w = 0:
// s) into that block of Q8o and sum s^2 into Part[block]. The matvecs that
// read Q8o multiply by the norm's factor (mvq_q4_0 and mvq_glu_q4_0 with
// n_part = N / 32): the norm costs no launch of its own. N a multiple of 32.
// A group of 32 items takes NM_MVS_RPW rows (a build option, 1, 2 or 4), a
// work-group LWS / 32 groups: R = NM_MVS_RPW * LWS / 32 rows, R dividing 32.
// With R = 32 the work-group finishes its block itself. With R < 32 (NVIDIA:
// more work-groups, more loads in flight; a 4096-row matrix is only 128
// blocks) the block's 32 / R work-groups count themselves (a counter a block) and
// the last one finishes it from the sums they stored (in a fixed order: a run
// repeats bit for bit), then sets the count back to 0 for the next launch.
// NM_MVS_B: the blocks of each row an item loads before the arithmetic.
// NM_MVS_SPLIT (PTX only, else 1): the groups of 32 items that share a row,
// each taking every NM_MVS_SPLIT-th step of its blocks (more loads in flight
// where the rows are few: R = NM_MVS_RPW * LWS / 32 / NM_MVS_SPLIT).
// Launch: 1-D, global = N / R * LWS, local = LWS; R < 32 only with
// NM_DP4A_PTX (the fence is PTX's). The counters: N / 32 ints at Part +
// cnt_off, 0 before the first launch.
#define NM_MVS_ROWS 32
#ifndef NM_MVS_RPW
#define NM_MVS_RPW 2 // (nm_cl_x8_geom_get's defaults)
#endif
#ifndef NM_MVS_B
#define NM_MVS_B 1
#endif
#ifndef NM_MVS_SPLIT
#define NM_MVS_SPLIT 2
#endif
__kernel void mvq_res_q4_0(__global const uchar *W, int N, __global const uchar *Q8, ulong q8_off, __global uchar *Y,
                           ulong y_off, __global const uchar *A, ulong a_off, __global uchar *S, ulong s_off,
                           __global const uchar *Wn, ulong wn_off, int has_w, __global uchar *Q8o, ulong q8o_off,
                           __global float *Part, int cnt_off, int K) {
    __local float hv[NM_MVS_ROWS], sq[NM_MVS_ROWS];
    __local int last;
#ifndef NM_DP4A_PTX
    __local float part[32 * 32]; // R rows of 32 items' sums
#endif
    const int lid = get_local_id(0), lane = lid & 31, w = lid >> 5, nb = K >> 5, g = get_group_id(0);
    const int R = NM_MVS_RPW * (((int)get_local_size(0) >> 5) / NM_MVS_SPLIT), blk = g / (NM_MVS_ROWS / R);
    const int wr = w / NM_MVS_SPLIT, ws = w % NM_MVS_SPLIT; // the group's rows, its share of their blocks
    const int n0 = g * R + wr * NM_MVS_RPW;
    __global const uint4 *qs = (__global const uint4 *)W;
    __global const half *ds = (__global const half *)(W + (ulong)N * nb * 16);
    __global const uint4 *xq = (__global const uint4 *)(Q8 + q8_off);
    __global const float2 *xd = (__global const float2 *)(Q8 + q8_off + (ulong)K);
    __global float *y = (__global float *)(Y + y_off), *sv = (__global float *)(S + s_off);
    __global const float *av = (__global const float *)(A + a_off);
    float acc[NM_MVS_RPW];
    for (int r = 0; r < NM_MVS_RPW; r++) acc[r] = 0.0f;
    for (int b0 = lane + 32 * ws; b0 < nb; b0 += 32 * NM_MVS_SPLIT * NM_MVS_B) {
        uint4 q[NM_MVS_B][NM_MVS_RPW];
        float d[NM_MVS_B][NM_MVS_RPW];
        for (int j = 0; j < NM_MVS_B; j++) {
            const int b = min(b0 + 32 * NM_MVS_SPLIT * j, nb - 1);
            for (int r = 0; r < NM_MVS_RPW; r++) {
                const ulong i = (ulong)(n0 + r) * nb + b;
                q[j][r] = qs[i], d[j][r] = vload_half(i, ds);
            }
        }
        for (int j = 0; j < NM_MVS_B; j++) {
            const int b = b0 + 32 * NM_MVS_SPLIT * j;
            if (b < nb) {
                const uint4 x0 = xq[2 * b], x1 = xq[2 * b + 1];
                const float2 xs = xd[b];
                for (int r = 0; r < NM_MVS_RPW; r++)
                    acc[r] += d[j][r] * (xs.x * (float)q4x8(q[j][r], x0, x1, -8 * (int)xs.y));
            }
        }
    }
    // the rows' y and s = a + y (y before s: S may be Y)
#if defined(NM_DP4A_PTX) && NM_MVS_SPLIT > 1
    __local float sp[NM_MVS_ROWS * NM_MVS_SPLIT]; // each row's shares, summed in a fixed order
    for (int r = 0; r < NM_MVS_RPW; r++) acc[r] = warp_sum(acc[r]);
    if (lane == 0)
        for (int r = 0; r < NM_MVS_RPW; r++) sp[(wr * NM_MVS_RPW + r) * NM_MVS_SPLIT + ws] = acc[r];
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid < R) {
        float t = 0.0f;
        for (int i = 0; i < NM_MVS_SPLIT; i++) t += sp[lid * NM_MVS_SPLIT + i];
        const int n = g * R + lid;
        const float s = av[n] + t;
        y[n] = t, sv[n] = s;
    }
#elif defined(NM_DP4A_PTX)
    for (int r = 0; r < NM_MVS_RPW; r++) acc[r] = warp_sum(acc[r]);
    if (lane == 0)
        for (int r = 0; r < NM_MVS_RPW; r++) {
            const int n = n0 + r;
            const float s = av[n] + acc[r];
            y[n] = acc[r], sv[n] = s;
        }
#else
    for (int r = 0; r < NM_MVS_RPW; r++) part[(w * NM_MVS_RPW + r) * 32 + lane] = acc[r];
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid < R) { // row lid's 32 items
        float t = 0.0f;
        for (int l = 0; l < 32; l++) t += part[lid * 32 + l];
        const int n = g * R + lid;
        const float s = av[n] + t;
        y[n] = t, sv[n] = s;
    }
#endif
    barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
    __global volatile const float *sb = (__global volatile const float *)sv + (ulong)blk * NM_MVS_ROWS;
    if (R < NM_MVS_ROWS) {
#ifdef NM_DP4A_PTX
        __global int *cnt = (__global int *)(Part + cnt_off) + blk;
        if (lid == 0) {
            asm volatile("membar.gl;" ::: "memory"); // the sums are visible before the count says so
            last = atomic_inc(cnt) == NM_MVS_ROWS / R - 1;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (!last) return;
        asm volatile("membar.gl;" ::: "memory");
        if (lid == 0) *cnt = 0; // for the next launch (it starts after this one ends: an in-order queue)
#endif
    }
    if (lid < NM_MVS_ROWS) {
        const int r = blk * NM_MVS_ROWS + lid;
        const float s = sb[lid];
        hv[lid] = has_w ? s * ((__global const float *)(Wn + wn_off))[r] : s;
        sq[lid] = s * s;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid == 0) {
        float4 v[8];
        for (int i = 0; i < 8; i++) v[i] = vload4(i, hv);
        q8_store(v, Q8o, q8o_off, N, blk);
        float t = 0.0f;
        for (int i = 0; i < NM_MVS_ROWS; i++) t += sq[i];
        Part[blk] = t;
    }
}

// act 0: SiLU x / (1 + e^-x); 1: GELU (tanh), written as x / (1 + e^(-2z)),
// z = sqrt(2/pi) (x + 0.044715 x^3), the same function as 0.5 x (1 + tanh z)
// and the CPU backend's form; 2: GELU quick x / (1 + e^(-1.702 x)).
NM_INLINE float nm_act(float x, int act) {
    if (act == 0) return x / (1.0f + exp(-x));
    if (act == 1) return x / (1.0f + exp(-(2.0f * 0.7978845608028654f) * x * (1.0f + 0.044715f * x * x)));
    if (act == 3) return tanh(x);
    return x / (1.0f + exp(-1.702f * x));
}

// Gate and up of one input (x8) with the GLU: h[n] = act(g[n]) u[n], n < N
// (N a multiple of 32), written as f32 to Y and as x8 (of N values) to Q8o:
// the down projection's input, rounded once. A work-group takes 32 rows of
// both matrices (one x8 block of h); its 8 groups of 32 items 4 rows each.
// Launch: 1-D, global = N / 32 * 256, local = 256. NM_MVG_B (a build option,
// NM_OPENCL_MVG): the blocks of each row an item loads before the arithmetic.
#define NM_MVG_ROWS 32
#ifndef NM_MVG_B
#define NM_MVG_B 2
#endif
// With n_part > 0, the input's norm factor as in mvq_q4_0, on g and u.
__kernel __attribute__((reqd_work_group_size(256, 1, 1))) void mvq_glu_q4_0(
    __global const uchar *Wg, __global const uchar *Wu, int N, __global const uchar *Q8, ulong q8_off,
    __global uchar *Y, ulong y_off, __global uchar *Q8o, ulong q8o_off, int K, int act, __global const float *Part,
    int n_part, float eps) {
    __local float gu[2 * NM_MVG_ROWS], hv[NM_MVG_ROWS], nred[256];
#ifndef NM_DP4A_PTX
    __local float part[8 * 256];
#endif
    const int lid = get_local_id(0), lane = lid & 31, w = lid >> 5, nb = K >> 5;
    float pv = 0.0f;
    for (int i = lid; i < n_part; i += 256) pv += Part[i];
    const int n0 = get_group_id(0) * NM_MVG_ROWS + 4 * w;
    __global const uint4 *qg = (__global const uint4 *)Wg, *qu = (__global const uint4 *)Wu;
    __global const half *dg = (__global const half *)(Wg + (ulong)N * nb * 16);
    __global const half *du = (__global const half *)(Wu + (ulong)N * nb * 16);
    __global const uint4 *xq = (__global const uint4 *)(Q8 + q8_off);
    __global const float2 *xd = (__global const float2 *)(Q8 + q8_off + (ulong)K);
    float acc[8];
    for (int r = 0; r < 8; r++) acc[r] = 0.0f;
    for (int b0 = lane; b0 < nb; b0 += 32 * NM_MVG_B) {
        uint4 q[NM_MVG_B][8];
        float d[NM_MVG_B][8];
        for (int j = 0; j < NM_MVG_B; j++) {
            const int b = min(b0 + 32 * j, nb - 1);
            for (int r = 0; r < 4; r++) {
                const ulong i = (ulong)(n0 + r) * nb + b;
                q[j][r] = qg[i], d[j][r] = vload_half(i, dg);
                q[j][4 + r] = qu[i], d[j][4 + r] = vload_half(i, du);
            }
        }
        for (int j = 0; j < NM_MVG_B; j++) {
            const int b = b0 + 32 * j;
            if (b < nb) {
                const uint4 x0 = xq[2 * b], x1 = xq[2 * b + 1];
                const float2 xs = xd[b];
                for (int r = 0; r < 8; r++) acc[r] += d[j][r] * (xs.x * (float)q4x8(q[j][r], x0, x1, -8 * (int)xs.y));
            }
        }
    }
#ifdef NM_DP4A_PTX
    for (int r = 0; r < 8; r++) acc[r] = warp_sum(acc[r]);
    if (lane == 0)
        for (int r = 0; r < 4; r++) gu[4 * w + r] = acc[r], gu[NM_MVG_ROWS + 4 * w + r] = acc[4 + r];
#else
    for (int r = 0; r < 8; r++) part[r * 256 + lid] = acc[r];
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid < 2 * NM_MVG_ROWS) { // row (lid & 31) of gate (lid < 32) or up
        const int row = lid & 31, r = (row & 3) + 4 * (lid >> 5), base = r * 256 + (row >> 2) * 32;
        float s = 0.0f;
        for (int l = 0; l < 32; l++) s += part[base + l];
        gu[lid] = s;
    }
#endif
    const float sc = n_part > 0 ? norm_scale(pv, nred, K, eps) : 1.0f; // its barriers: gu[] visible
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid < NM_MVG_ROWS) {
        const float h = nm_act(gu[lid] * sc, act) * (gu[NM_MVG_ROWS + lid] * sc);
        ((__global float *)(Y + y_off))[get_group_id(0) * NM_MVG_ROWS + lid] = h;
        hv[lid] = h;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid == 0) {
        float4 v[8];
        for (int i = 0; i < 8; i++) v[i] = vload4(i, hv);
        q8_store(v, Q8o, q8o_off, N, get_group_id(0));
    }
}
