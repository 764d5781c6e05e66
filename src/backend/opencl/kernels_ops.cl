// nanomind's OpenCL C kernels, part 3 of 3 (cmake/embed.cmake joins kernels.cl, kernels_x8.cl and
// kernels_ops.cl into one program, in that order: the conventions and helpers are kernels.cl's):
// the prefill matmul, the lookup, norms, rope, the KV cache, attention, element-wise and layout ops.

// ---- mm_T: prefill matmul -----------------------------------------------------------------
//
// Y[t*N + n] = sum_k W[n,k] X[t*K + k] (+ Bias[n]), n < N, t < T.
// Launch: 2-D, local = (16, 16) (required), global = (ceil(N/32) * 16,
// ceil(T/32) * 16): a work-group computes a tile of 32 rows x 32 tokens, each
// work-item 2 rows (lx, lx + 16) x 2 tokens (ly, ly + 16). Per step of 32
// columns the group dequantizes the tile's 32 x 32 weights into __local floats
// once (4 per work-item) and loads the 32 x 32 activations next to them; edges
// past N or T load zeros and are not stored. K as for mv_T.
// Local memory: 2 x 32 x 33 floats (8.25 KiB).

#define MM_TILE 32
#define MM_KS 32

#define NM_MM(T, BLK, BSZ)                                                                                        \
    __kernel __attribute__((reqd_work_group_size(16, 16, 1))) void mm_##T(                                        \
        __global const uchar *W, ulong w_off, __global const uchar *X, ulong x_off, __global uchar *Y, ulong y_off, \
        __global const uchar *Bias, ulong b_off, int has_bias, int K, int N, int T) {                             \
        __local float ws[MM_TILE][MM_KS + 1]; /* +1: rows in different banks */                                  \
        __local float xs[MM_TILE][MM_KS + 1];                                                                     \
        const int lx = get_local_id(0), ly = get_local_id(1), lid = ly * 16 + lx;                                 \
        const int n0 = get_group_id(0) * MM_TILE, t0 = get_group_id(1) * MM_TILE;                                \
        const int lr = lid >> 3, lq = (lid & 7) * 4; /* loader: tile row lr, columns lq..lq+3 */                  \
        const int wn = n0 + lr, xt = t0 + lr;                                                                     \
        __global const uchar *wrow = W + w_off + (ulong)min(wn, N - 1) * (ulong)(K / (BLK)) * (BSZ);             \
        __global const float *xrow = (__global const float *)(X + x_off) + (ulong)min(xt, T - 1) * (ulong)K;    \
        float a00 = 0.0f, a01 = 0.0f, a10 = 0.0f, a11 = 0.0f;                                                     \
        for (int k0 = 0; k0 < K; k0 += MM_KS) {                                                                   \
            const int k = k0 + lq;                                                                                \
            float4 wv = (float4)(0.0f), xv = (float4)(0.0f);                                                      \
            if (wn < N && k < K) wv = ld4_##T(wrow, k, K);                                                        \
            if (xt < T && k < K) xv = ld4_f32((__global const uchar *)xrow, k, K);                               \
            ws[lr][lq] = wv.x, ws[lr][lq + 1] = wv.y, ws[lr][lq + 2] = wv.z, ws[lr][lq + 3] = wv.w;               \
            xs[lr][lq] = xv.x, xs[lr][lq + 1] = xv.y, xs[lr][lq + 2] = xv.z, xs[lr][lq + 3] = xv.w;               \
            barrier(CLK_LOCAL_MEM_FENCE);                                                                         \
            for (int kk = 0; kk < MM_KS; kk++) {                                                                  \
                const float w0 = ws[lx][kk], w1 = ws[lx + 16][kk], x0 = xs[ly][kk], x1 = xs[ly + 16][kk];         \
                a00 += w0 * x0, a01 += w0 * x1, a10 += w1 * x0, a11 += w1 * x1;                                   \
            }                                                                                                     \
            barrier(CLK_LOCAL_MEM_FENCE);                                                                         \
        }                                                                                                         \
        __global const float *bias = (__global const float *)(Bias + b_off);                                     \
        __global float *y = (__global float *)(Y + y_off);                                                        \
        const int na = n0 + lx, nb = n0 + lx + 16, ta = t0 + ly, tb = t0 + ly + 16;                               \
        const float ba = has_bias && na < N ? bias[na] : 0.0f, bb = has_bias && nb < N ? bias[nb] : 0.0f;         \
        if (na < N && ta < T) y[(ulong)ta * N + na] = a00 + ba;                                                   \
        if (na < N && tb < T) y[(ulong)tb * N + na] = a01 + ba;                                                   \
        if (nb < N && ta < T) y[(ulong)ta * N + nb] = a10 + bb;                                                   \
        if (nb < N && tb < T) y[(ulong)tb * N + nb] = a11 + bb;                                                   \
    }

NM_MM(f32, 1, 4)
NM_MM(f16, 1, 2)
NM_MM(q4_0, 32, 18)
NM_MM(q4_1, 32, 20)
NM_MM(q5_0, 32, 22)
NM_MM(q8_0, 32, 34)
NM_MM(mxfp4, 32, 17)
NM_MM(q4_K, 256, 144)
NM_MM(q5_K, 256, 176)
NM_MM(q6_K, 256, 210)

// ---- get_rows_T: embedding lookup -------------------------------------------------------
//
// Dst[i*K + k] = dequant(W row Ids[i])[k], k < K.
// Launch: 2-D, global = (round_up(ceil(K/4), L), n_ids), local = (L, 1) for
// any L (or NULL); work-item (g, i) writes elements 4g..4g+3 of row i.
// K as for mv_T.

#define NM_GET_ROWS(T, BLK, BSZ)                                                                                  \
    __kernel void get_rows_##T(__global const uchar *W, ulong w_off, __global const uchar *Ids, ulong ids_off,    \
                               __global uchar *Dst, ulong dst_off, int K) {                                      \
        const int k = (int)get_global_id(0) * 4, i = get_global_id(1);                                           \
        if (k >= K) return;                                                                                       \
        const int id = ((__global const int *)(Ids + ids_off))[i];                                               \
        const float4 v = ld4_##T(W + w_off + (ulong)id * (ulong)(K / (BLK)) * (BSZ), k, K);                      \
        __global float *d = (__global float *)(Dst + dst_off) + (ulong)i * K + k;                                 \
        if (k + 3 < K) {                                                                                          \
            vstore4(v, 0, d);                                                                                     \
        } else {                                                                                                  \
            d[0] = v.x;                                                                                           \
            if (k + 1 < K) d[1] = v.y;                                                                            \
            if (k + 2 < K) d[2] = v.z;                                                                            \
        }                                                                                                         \
    }

NM_GET_ROWS(f32, 1, 4)
NM_GET_ROWS(f16, 1, 2)
NM_GET_ROWS(q4_0, 32, 18)
NM_GET_ROWS(q4_1, 32, 20)
NM_GET_ROWS(q5_0, 32, 22)
NM_GET_ROWS(q8_0, 32, 34)
NM_GET_ROWS(mxfp4, 32, 17)
NM_GET_ROWS(q4_K, 256, 144)
NM_GET_ROWS(q5_K, 256, 176)
NM_GET_ROWS(q6_K, 256, 210)

// ---- norms ------------------------------------------------------------------------------
//
// Launch: 1-D, global = n_rows * LWS, local = LWS (one work-group per row of d).
// In place (X == Y, same offsets) is allowed: every item reads its elements
// for the sums before the reduction's barriers and writes only those after.

// y = x / sqrt(mean(x^2) + eps) * w (w: d floats, unless !has_w). With
// has_add, x = a + b is computed first and written to X (a residual add and
// the norm after it in one launch; each item reads back only what it wrote).
__kernel void rms_norm(__global uchar *X, ulong x_off, __global const uchar *W, ulong w_off, int has_w,
                       __global uchar *Y, ulong y_off, int d, float eps, __global const uchar *A, ulong a_off,
                       __global const uchar *B, ulong b_off, int has_add, __global uchar *Q8, ulong q8_off,
                       int has_q8) {
    __local float red[NM_MAX_LWS];
    const int r = get_group_id(0), lid = get_local_id(0), lws = get_local_size(0);
    __global float *x = (__global float *)(X + x_off) + (ulong)r * d;
    __global const float *a = (__global const float *)(A + a_off) + (ulong)r * d;
    __global const float *b = (__global const float *)(B + b_off) + (ulong)r * d;
    __global const float *w = (__global const float *)(W + w_off);
    __global float *y = (__global float *)(Y + y_off) + (ulong)r * d;
    float s = 0.0f;
    const int d4 = (d & 3) == 0 ? d / 4 : 0; // rows of whole float4s: one load per 4 elements
    for (int i = lid; i < d4; i += lws) {
        float4 v;
        if (has_add) vstore4(v = vload4(i, a) + vload4(i, b), i, x);
        else v = vload4(i, x);
        s += dot(v, v);
    }
    for (int i = 4 * d4 + lid; i < d; i += lws) {
        if (has_add) x[i] = a[i] + b[i];
        s += x[i] * x[i];
    }
    s = wg_sum(s, red);
    const float scale = 1.0f / sqrt(s / (float)d + eps);
#ifdef NM_DP4A_PTX
    if (has_q8 && (lws & 7) == 0) { // y and its x8 from registers: a block's 8 float4s lie with 8 neighbouring items
        for (int i0 = 0; i0 < d4; i0 += lws) { // the same rounds for all items (the shuffles)
            const int i = i0 + lid;
            const float4 v = i < d4 ? vload4(i, x) * scale * (has_w ? vload4(i, w) : (float4)(1.0f)) : (float4)(0.0f);
            if (i < d4) vstore4(v, i, y);
            const float4 a = fabs(v);
            float amax = fmax(fmax(a.x, a.y), fmax(a.z, a.w));
            for (int o = 1; o < 8; o <<= 1) amax = fmax(amax, shfl_xor(amax, o));
            const float dx = amax / 127.0f, idx = dx != 0.0f ? 1.0f / dx : 0.0f;
            const int4 t = convert_int4(round(v * idx));
            float sx = (float)((t.x + t.y) + (t.z + t.w));
            for (int o = 1; o < 8; o <<= 1) sx += shfl_xor(sx, o);
            if (i < d4) {
                ((__global uint *)(Q8 + q8_off))[i] = as_uint(convert_char4(t));
                if ((i & 7) == 0) ((__global float2 *)(Q8 + q8_off + (ulong)d))[i >> 3] = (float2)(dx, sx);
            }
        }
        return;
    }
#endif
    for (int i = lid; i < d4; i += lws) vstore4(vload4(i, x) * scale * (has_w ? vload4(i, w) : (float4)(1.0f)), i, y);
    for (int i = 4 * d4 + lid; i < d; i += lws) y[i] = x[i] * scale * (has_w ? w[i] : 1.0f);
    if (has_q8) { // one row, d a multiple of 32: y's rounding to 8 bits too, block by block (mvq_q4_0 reads it)
        barrier(CLK_GLOBAL_MEM_FENCE); // y as the other items wrote it
        for (int b = lid; b < d / 32; b += lws) {
            float4 v[8];
            for (int i = 0; i < 8; i++) v[i] = vload4(8 * b + i, y);
            q8_store(v, Q8, q8_off, d, b);
        }
    }
}

// y = (x - mean) / sqrt(var + eps) * w + b, var = mean((x - mean)^2).
__kernel void layer_norm(__global const uchar *X, ulong x_off, __global const uchar *W, ulong w_off, int has_w,
                         __global const uchar *Bias, ulong b_off, int has_b, __global uchar *Y, ulong y_off, int d,
                         float eps) {
    __local float red[NM_MAX_LWS];
    const int r = get_group_id(0), lid = get_local_id(0), lws = get_local_size(0);
    __global const float *x = (__global const float *)(X + x_off) + (ulong)r * d;
    __global const float *w = (__global const float *)(W + w_off);
    __global const float *b = (__global const float *)(Bias + b_off);
    __global float *y = (__global float *)(Y + y_off) + (ulong)r * d;
    float s = 0.0f;
    for (int i = lid; i < d; i += lws) s += x[i];
    const float mean = wg_sum(s, red) / (float)d;
    float ss = 0.0f;
    for (int i = lid; i < d; i += lws) ss += (x[i] - mean) * (x[i] - mean);
    const float scale = 1.0f / sqrt(wg_sum(ss, red) / (float)d + eps);
    for (int i = lid; i < d; i += lws) {
        float v = (x[i] - mean) * scale;
        if (has_w) v *= w[i];
        if (has_b) v += b[i];
        y[i] = v;
    }
}

// ---- rope -------------------------------------------------------------------------------
//
// In place on X = [n_tok, n_head, head_dim] f32; token t at position Pos[t].
// Pair i < n_rot/2 is (2i, 2i+1) for mode 0 (NORM), (i, i + n_rot/2) for
// mode 2 (NEOX), turned by theta = (pos * freq_scale) * freq_base^(-2i/n_rot),
// the same float operations as the CPU backend's op_rope (with fp64 the power
// and cos/sin are correctly rounded, as glibc's powf/cosf/sinf are in
// practice). Elements >= n_rot are untouched. X2 = [n_tok, n_head2,
// head_dim] is rotated the same way in the same launch (n_head2 = 0: none).
// Mode 24 (NM_ROPE_VISION, Qwen2-VL's ViT): pairs as NEOX; Pos holds two
// streams of n_tok (rows, then columns); pair i < sec0 turns by the row at
// frequency index i, the others by the column at index i - sec0, each over
// n_rot / 2 (backend.h).
// Launch: 3-D, global = (round_up(n_rot/2, L), n_head + n_head2, n_tok exactly), local any (NULL).

__kernel void rope(__global uchar *X, ulong x_off, __global const uchar *Pos, ulong pos_off, int n_head, int head_dim,
                   int n_rot, int mode, float freq_base, float freq_scale, __global uchar *X2, ulong x2_off,
                   int n_head2, int sec0) {
    const int i = get_global_id(0), hh = get_global_id(1), t = get_global_id(2);
    if (i >= n_rot / 2 || hh >= n_head + n_head2) return;
    // heads n_head.. are X2's (Q and K in one launch): the same positions and rotation
    const int second = hh >= n_head, h = second ? hh - n_head : hh, nh = second ? n_head2 : n_head;
    __global const int *pos = (__global const int *)(Pos + pos_off);
    // mode 24 (the 2-D vision rope): pairs below sec0 turn by the row (Pos[t]), the others by the column
    // (Pos[n_tok + t]), each section's frequency index from 0 over n_rot / 2
    const int col = mode == 24 && i >= sec0;
    const float2 cs = mode == 24 ? rope_cs(pos[col * (int)get_global_size(2) + t], col ? i - sec0 : i, n_rot / 2,
                                           freq_base, freq_scale)
                                 : rope_cs(pos[t], i, n_rot, freq_base, freq_scale);
    const float c = cs.x, s = cs.y;
    __global float *x = (__global float *)(second ? X2 + x2_off : X + x_off) + ((ulong)t * nh + h) * head_dim;
    const int a = mode != 0 ? i : 2 * i, b = mode != 0 ? i + n_rot / 2 : 2 * i + 1;
    const float x0 = x[a], x1 = x[b];
    x[a] = x0 * c - x1 * s;
    x[b] = x0 * s + x1 * c;
}

// Q's and K's ropes and the KV store after them in one launch (the backend
// joins a rope of Q, a rope of K and the store of that K and a V): heads
// [0, n_head) rotate X (Q) in place, [n_head, n_head + n_kv) rotate X2 (K) in
// place and write its elements to row Pos[t] of Kc, [n_head + n_kv, n_head +
// 2 n_kv) write V's (Vs) to row Pos[t] of Vc; the cache rows, n_kv *
// head_dim halves, rounded to nearest even as kv_store does. Item i of a head
// takes the pair the rope rotates (i < n_rot / 2, as `rope`) or elements n_rot
// + 2 (i - n_rot / 2) and the next (past n_rot: only stored). head_dim and
// n_rot even.
// Launch: 3-D, global = (head_dim / 2, n_head + 2 n_kv, n_tok), local any.
__kernel void rope_kv(__global uchar *X, ulong x_off, __global const uchar *Pos, ulong pos_off, int n_head,
                      int head_dim, int n_rot, int mode, float freq_base, float freq_scale, __global uchar *X2,
                      ulong x2_off, int n_kv, __global const uchar *Vs, ulong vs_off, __global uchar *Kc,
                      ulong kc_off, __global uchar *Vc, ulong vc_off) {
    const int i = get_global_id(0), hh = get_global_id(1), t = get_global_id(2);
    if (i >= head_dim / 2 || hh >= n_head + 2 * n_kv) return;
    const int pos = ((__global const int *)(Pos + pos_off))[t], width = n_kv * head_dim;
    const int kind = hh < n_head ? 0 : hh < n_head + n_kv ? 1 : 2; // Q, K, V
    const int h = kind == 0 ? hh : kind == 1 ? hh - n_head : hh - n_head - n_kv;
    const bool rot = i < n_rot / 2;
    const int a = rot ? (mode == 2 ? i : 2 * i) : n_rot + 2 * (i - n_rot / 2);
    const int b = rot ? (mode == 2 ? i + n_rot / 2 : 2 * i + 1) : a + 1;
    const ulong row = (ulong)pos * width + (ulong)h * head_dim;
    if (kind == 2) {
        __global const float *v = (__global const float *)(Vs + vs_off) + (ulong)t * width + (ulong)h * head_dim;
        vstore_half_rte(v[a], row + a, (__global half *)(Vc + vc_off));
        vstore_half_rte(v[b], row + b, (__global half *)(Vc + vc_off));
        return;
    }
    __global float *x = (__global float *)(kind ? X2 + x2_off : X + x_off) + ((ulong)t * (kind ? n_kv : n_head) + h) * head_dim;
    float x0 = x[a], x1 = x[b];
    if (rot) {
        const float2 cs = rope_cs(pos, i, n_rot, freq_base, freq_scale);
        const float y0 = x0 * cs.x - x1 * cs.y, y1 = x0 * cs.y + x1 * cs.x;
        x[a] = x0 = y0;
        x[b] = x1 = y1;
    }
    if (kind == 1) {
        vstore_half_rte(x0, row + a, (__global half *)(Kc + kc_off));
        vstore_half_rte(x1, row + b, (__global half *)(Kc + kc_off));
    }
}

// ---- KV cache ---------------------------------------------------------------------------
//
// Cache row Pos[t] (width halves) = Src row t (width floats) rounded to
// nearest even, for K (z = 0: Ks into Kc) and V (z = 1: Vs into Vc) in one
// launch. Launch: 3-D, global = (round_up(width, L), n_tok, 2), local any.
__kernel void kv_store(__global const uchar *Ks, ulong ks_off, __global uchar *Kc, ulong kc_off,
                       __global const uchar *Vs, ulong vs_off, __global uchar *Vc, ulong vc_off,
                       __global const uchar *Pos, ulong pos_off, int width) {
    const int i = get_global_id(0), t = get_global_id(1), z = get_global_id(2);
    if (i >= width) return;
    const int pos = ((__global const int *)(Pos + pos_off))[t];
    __global const uchar *src = z ? Vs + vs_off : Ks + ks_off;
    __global uchar *cache = z ? Vc + vc_off : Kc + kc_off;
    const float v = ((__global const float *)src)[(ulong)t * width + i];
    vstore_half_rte(v, (ulong)pos * width + i, (__global half *)cache);
}

// NM_OP_SHORT_CONV (backend.h): one work-item a channel, the tokens in order (a token reads the rows its
// sequence's earlier tokens wrote), the taps summed oldest first as the CPU's.
__kernel void short_conv(__global const uchar *X, ulong x_off, __global const uchar *Wt, ulong w_off,
                         __global uchar *Y, ulong y_off, __global uchar *St, ulong st_off,
                         __global const uchar *Ids, ulong ids_off, int d, int T, int L, int W, int R, int S,
                         int n_ctx) {
    const int ch = get_global_id(0);
    if (ch >= d) return;
    __global const float *bcx = (__global const float *)(X + x_off), *w = (__global const float *)(Wt + w_off) + ch * L;
    __global float *y = (__global float *)(Y + y_off), *st = (__global float *)(St + st_off);
    __global const int *ids = (__global const int *)(Ids + ids_off);
    const int ncp = (n_ctx - 1) / S;
    for (int t = 0; t < T; t++) {
        const int s = ids[t] / n_ctx, p = ids[t] % n_ctx;
        __global const float *b = bcx + (ulong)t * 3 * d;
        __global float *base = st + (ulong)s * R * d;
        const float bx = b[ch] * b[2 * d + ch];
        float acc = 0.0f;
        for (int k = 0; k < L - 1; k++) {
            const int q = p - (L - 1) + k;
            if (q >= 0) acc += w[k] * base[(ulong)(q % W) * d + ch];
        }
        acc += w[L - 1] * bx;
        y[(ulong)t * d + ch] = b[d + ch] * acc;
        base[(ulong)(p % W) * d + ch] = bx;
        for (int j = 1; j < L; j++) {
            const int q = p + j;
            if (q % S || q / S > ncp) continue;
            base[(ulong)(W + (q / S - 1) * (L - 1) + (L - 1 - j)) * d + ch] = bx;
        }
    }
}

// ---- attention --------------------------------------------------------------------------
//
// The core shared by both kernels: one query q against keys [lo, hi] of K/V
// (rows `stride` elements apart, f16 if f16 else f32), in chunks of `chunk`
// (<= NM_ATT_CHUNK) keys whose scores stay in local memory: scores, the
// chunk's max, exp and sum, then O += p V, with the running max and sum of
// an online softmax carried across chunks. Scores: work-item lid takes keys
// lid, lid + LWS, ... For p V, where LWS >= 2 head_dim the work-items form
// ng = LWS / head_dim groups, group g summing keys g, g + ng, ... for dim
// lid % head_dim (the groups' sums then added in order); else work-item lid
// owns dims lid, lid + LWS, ... over every key.
// qv, acc: __local float[head_dim]; red: __local float[LWS]; sc: __local float[NM_ATT_CHUNK].
#define NM_ATT_CHUNK 1024

NM_INLINE float attn_kdot(__global const uchar *K, int f16, ulong e, __local const float *q, int n) {
    float s = 0.0f;
    int d = 0;
    if (f16) {
        __global const half *k = (__global const half *)K + e;
        for (; d + 4 <= n; d += 4) s += dot(vload_half4(0, k + d), vload4(0, q + d));
        for (; d < n; d++) s += vload_half(d, k) * q[d];
    } else {
        __global const float *k = (__global const float *)K + e;
        for (; d + 4 <= n; d += 4) s += dot(vload4(0, k + d), vload4(0, q + d));
        for (; d < n; d++) s += k[d] * q[d];
    }
    return s;
}

NM_INLINE float attn_v(__global const uchar *V, int f16, ulong e) {
    return f16 ? vload_half(e, (__global const half *)V) : ((__global const float *)V)[e];
}

NM_INLINE void attn_core(__global const float *q, __global const uchar *K, __global const uchar *V, int f16, ulong stride,
                      int lo, int hi, int chunk, int head_dim, float scale, float softcap, __global float *o,
                      __local float *qv, __local float *acc, __local float *red, __local float *sc) {
    const int lid = get_local_id(0), lws = get_local_size(0);
    const int ng = lws >= 2 * head_dim ? lws / head_dim : 1, g = lid / head_dim, gd = lid - g * head_dim;
    chunk = clamp(chunk, 1, NM_ATT_CHUNK);
    for (int d = lid; d < head_dim; d += lws) qv[d] = q[d], acc[d] = 0.0f;
    barrier(CLK_LOCAL_MEM_FENCE);
    float m = -INFINITY, l = 0.0f;
    for (int c0 = lo; c0 <= hi; c0 += chunk) {
        const int nk = min(chunk, hi - c0 + 1);
        float mx = -INFINITY;
        for (int j = lid; j < nk; j += lws) {
            float s = attn_kdot(K, f16, (ulong)(c0 + j) * stride, qv, head_dim) * scale;
            if (softcap > 0.0f) s = softcap * tanh(s / softcap);
            sc[j] = s;
            mx = fmax(mx, s);
        }
        mx = wg_max(mx, red);
        const float mn = fmax(m, mx), r = exp(m - mn); // r = 0 on the first chunk (m = -inf)
        float ls = 0.0f;
        for (int j = lid; j < nk; j += lws) {
            const float e = exp(sc[j] - mn);
            sc[j] = e;
            ls += e;
        }
        ls = wg_sum(ls, red); // its barriers make every sc[] visible to all
        l = l * r + ls;
        // (the barrier below is outside any branch: some compilers reject one inside, uniform or not)
        float a = 0.0f;
        if (ng > 1 && g < ng)
            for (int j = g; j < nk; j += ng) a += sc[j] * attn_v(V, f16, (ulong)(c0 + j) * stride + gd);
        if (ng == 1)
            for (int d = lid; d < head_dim; d += lws) {
                float t = acc[d] * r;
                for (int j = 0; j < nk; j++) t += sc[j] * attn_v(V, f16, (ulong)(c0 + j) * stride + d);
                acc[d] = t;
            }
        red[lid] = a;
        barrier(CLK_LOCAL_MEM_FENCE);
        if (ng > 1 && lid < head_dim) {
            float t = acc[lid] * r;
            for (int k = 0; k < ng; k++) t += red[k * head_dim + lid];
            acc[lid] = t;
        }
        m = mn;
        barrier(CLK_LOCAL_MEM_FENCE); // sc[] and red[] read by all before the next chunk writes them
    }
    const float inv = 1.0f / l;
    for (int d = lid; d < head_dim; d += lws) o[d] = acc[d] * inv;
}

// Causal attention of n_tok queries over an f16 KV cache.
// Q, O: [n_tok, n_head * head_dim] f32; Kc, Vc: rows of kv_width halves
// (n_kv_head * head_dim), row j = position j. Query t at position Pos[t]
// sees keys [lo, Pos[t]], lo = window > 0 ? max(0, Pos[t] - window + 1) : 0
// (as the CPU backend's attn_worker). Head h reads KV head
// h / (n_head / n_kv_head). score = (q . k) * scale, then
// softcap * tanh(score / softcap) if softcap > 0; softmax in f32.
// Launch: 2-D, global = (n_head * LWS, n_tok), local = (LWS, 1): work-group
// (h, t). Keys go in chunks of max_keys (1..NM_ATT_CHUNK; more: NM_ATT_CHUNK).
// head_dim <= NM_MAX_HD. Local memory: 2 * NM_MAX_HD + NM_MAX_LWS + NM_ATT_CHUNK floats.
__kernel void attention(__global const uchar *Q, ulong q_off, __global const uchar *Kc, ulong k_off,
                        __global const uchar *Vc, ulong v_off, __global const uchar *Pos, ulong pos_off,
                        __global uchar *O, ulong o_off, int n_head, int n_kv_head, int head_dim, int kv_width,
                        int window, float scale, float softcap, int max_keys) {
    __local float qv[NM_MAX_HD], acc[NM_MAX_HD], red[NM_MAX_LWS], sc[NM_ATT_CHUNK];
    const int h = get_group_id(0), t = get_group_id(1);
    const int kvh = h / (n_head / n_kv_head);
    const int pos = ((__global const int *)(Pos + pos_off))[t];
    const int lo = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
    const ulong qo = ((ulong)t * n_head + h) * head_dim;
    attn_core((__global const float *)(Q + q_off) + qo, Kc + k_off + (ulong)kvh * head_dim * 2,
              Vc + v_off + (ulong)kvh * head_dim * 2, 1, (ulong)kv_width, lo, pos, max_keys, head_dim, scale, softcap,
              (__global float *)(O + o_off) + qo, qv, acc, red, sc);
}

#ifdef NM_DP4A_PTX
// Decode attention (one query per head) on NVIDIA's platform, where warps and
// their shuffles are at hand: the same result as `attention` for one token
// (up to the order of the sums), computed for speed. The keys of a head are
// split over n_split work-groups (8 warps each), so a short context still
// fills the GPU: work-group (h, s) takes keys [s * per, (s + 1) * per), per =
// ceil(n / n_split); each warp a key at a time (w, w + 8, ...), its 32 lanes
// head_dim / 32 elements each, so a key's row is one coalesced load and its
// dot a warp sum; the scores stay in local memory (up to NM_ATT_DEC_KEYS keys
// a work-group: the host checks n_ctx / n_split), then p V the same way, the
// warps' partial sums added in local memory. With n_split > 1 each work-group
// writes its max, its sum of exp and its unnormalised p V to Part
// ([n_head][n_split][head_dim + 2] floats) and counts itself in Cnt[h]; the
// head's last work-group to finish (the one that counts n_split) merges them
// (each scaled by exp(its max - the max of all)) and sets Cnt[h] back to 0
// for the next launch. With has_x8, the head's output is also rounded to 8
// bits (q8_store) into X8, an x8 of n_head * head_dim values (the O projection
// reads it: the x8 path). head_dim: a multiple of 32 up to 256.
// Launch: 2-D, global = (n_head * 256, n_split), local = (256, 1).
#define NM_ATT_DEC_KEYS 4096
__kernel __attribute__((reqd_work_group_size(256, 1, 1))) void attention_dec(
    __global const uchar *Q, ulong q_off, __global const uchar *Kc, ulong k_off, __global const uchar *Vc, ulong v_off,
    __global const uchar *Pos, ulong pos_off, __global uchar *O, ulong o_off, int n_head, int n_kv_head, int head_dim,
    int kv_width, int window, float scale, float softcap, __global uchar *X8, ulong x8_off, int has_x8,
    __global float *Part, __global int *Cnt) {
    __local float sc[NM_ATT_DEC_KEYS], part[8 * 256], wred[16];
    __local int last;
    const int h = get_group_id(0), s = get_group_id(1), n_split = get_num_groups(1);
    const int lid = get_local_id(0), lane = lid & 31, w = lid >> 5;
    const int kvh = h / (n_head / n_kv_head), E = head_dim >> 5; // elements per lane: 1..8
    const int pos = ((__global const int *)(Pos + pos_off))[0];
    const int lo = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0, n_all = pos - lo + 1;
    const int per = (n_all + n_split - 1) / n_split, j0 = s * per;
    const int n = n_all - j0 < per ? (n_all - j0 > 0 ? n_all - j0 : 0) : per; // this work-group's keys
    __global const float *q = (__global const float *)(Q + q_off) + (ulong)h * head_dim + lane * E;
    __global const half *kc = (__global const half *)(Kc + k_off) + (ulong)kvh * head_dim + lane * E;
    __global const half *vc = (__global const half *)(Vc + v_off) + (ulong)kvh * head_dim + lane * E;
    float qr[8];
    for (int e = 0; e < 8; e++) qr[e] = e < E ? q[e] : 0.0f;
    float mx = -INFINITY;
#pragma unroll 4
    for (int j = w; j < n; j += 8) {
        __global const half *k = kc + (ulong)(lo + j0 + j) * kv_width;
        float t = 0.0f;
        for (int e = 0; e < 8; e++)
            if (e < E) t += vload_half(e, k) * qr[e];
        t = warp_sum(t) * scale;
        if (softcap > 0.0f) t = softcap * tanh(t / softcap);
        if (lane == 0) sc[j] = t;
        mx = fmax(mx, t);
    }
    if (lane == 0) wred[w] = mx;
    barrier(CLK_LOCAL_MEM_FENCE);
    float m = wred[0];
    for (int i = 1; i < 8; i++) m = fmax(m, wred[i]);
    float l = 0.0f;
    for (int j = lid; j < n; j += 256) {
        const float e = exp(sc[j] - m);
        sc[j] = e;
        l += e;
    }
    l = warp_sum(l);
    if (lane == 0) wred[8 + w] = l;
    barrier(CLK_LOCAL_MEM_FENCE);
    float L = 0.0f;
    for (int i = 0; i < 8; i++) L += wred[8 + i];
    float acc[8];
    for (int e = 0; e < 8; e++) acc[e] = 0.0f;
#pragma unroll 4
    for (int j = w; j < n; j += 8) {
        const float pj = sc[j];
        __global const half *v = vc + (ulong)(lo + j0 + j) * kv_width;
        for (int e = 0; e < 8; e++)
            if (e < E) acc[e] += pj * vload_half(e, v);
    }
    for (int e = 0; e < 8; e++)
        if (e < E) part[w * 256 + lane * E + e] = acc[e];
    barrier(CLK_LOCAL_MEM_FENCE);
    __global float *o = (__global float *)(O + o_off) + (ulong)h * head_dim;
    if (n_split == 1) {
        const float inv = 1.0f / L;
        for (int d = lid; d < head_dim; d += 256) {
            float t = 0.0f;
            for (int i = 0; i < 8; i++) t += part[i * 256 + d];
            o[d] = t * inv;
            sc[d] = t * inv; // the scores are no longer needed
        }
    } else {
        // this work-group's share, then the count; the last one merges
        __global float *my = Part + ((ulong)h * n_split + s) * (head_dim + 2);
        for (int d = lid; d < head_dim; d += 256) {
            float t = 0.0f;
            for (int i = 0; i < 8; i++) t += part[i * 256 + d];
            my[2 + d] = t;
        }
        if (lid == 0) my[0] = m, my[1] = L; // (an empty share: m = -inf, L = 0)
        barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
        if (lid == 0) {
            asm volatile("membar.gl;" ::: "memory"); // the share is visible before the count says so
            last = atomic_inc(Cnt + h) == n_split - 1;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (!last) return;
        asm volatile("membar.gl;" ::: "memory");
        __global volatile const float *all = Part + (ulong)h * n_split * (head_dim + 2);
        float M = -INFINITY;
        for (int i = 0; i < n_split; i++) M = fmax(M, all[i * (head_dim + 2)]);
        float LL = 0.0f;
        for (int i = 0; i < n_split; i++) {
            const float mi = all[i * (head_dim + 2)];
            LL += mi == -INFINITY ? 0.0f : all[i * (head_dim + 2) + 1] * exp(mi - M);
        }
        const float inv = 1.0f / LL;
        for (int d = lid; d < head_dim; d += 256) {
            float t = 0.0f;
            for (int i = 0; i < n_split; i++) {
                const float mi = all[i * (head_dim + 2)];
                if (mi != -INFINITY) t += all[i * (head_dim + 2) + 2 + d] * exp(mi - M);
            }
            o[d] = t * inv;
            sc[d] = t * inv;
        }
        if (lid == 0) Cnt[h] = 0; // for the next launch (it starts after this one ends: an in-order queue)
    }
    if (has_x8) {
        barrier(CLK_LOCAL_MEM_FENCE);
        if (lid < head_dim / 32) {
            float4 v[8];
            for (int i = 0; i < 8; i++) v[i] = vload4(8 * lid + i, sc);
            q8_store(v, X8, x8_off, n_head * head_dim, h * (head_dim / 32) + lid);
        }
    }
}
#endif

// Bidirectional attention (vision encoders): queries over n_tok keys, all f32
// [rows, n_head * head_dim]; no mask, no softcap.
// Launch: 2-D, global = (n_head * LWS, n_q), local = (LWS, 1): work-group
// (h, t) computes query t (usually n_q = n_tok; the host may take the queries
// in batches by moving q_off/o_off). Keys in chunks of NM_ATT_CHUNK.
// head_dim <= NM_MAX_HD.
__kernel void attention_full(__global const uchar *Q, ulong q_off, __global const uchar *K, ulong k_off,
                             __global const uchar *V, ulong v_off, __global uchar *O, ulong o_off, int n_tok,
                             int n_head, int head_dim, float scale) {
    __local float qv[NM_MAX_HD], acc[NM_MAX_HD], red[NM_MAX_LWS], sc[NM_ATT_CHUNK];
    const int h = get_group_id(0), t = get_group_id(1);
    const ulong stride = (ulong)n_head * head_dim, qo = (ulong)t * stride + (ulong)h * head_dim;
    attn_core((__global const float *)(Q + q_off) + qo, K + k_off + (ulong)h * head_dim * 4,
              V + v_off + (ulong)h * head_dim * 4, 0, stride, 0, n_tok - 1, NM_ATT_CHUNK, head_dim, scale, 0.0f,
              (__global float *)(O + o_off) + qo, qv, acc, red, sc);
}

// ---- element-wise -----------------------------------------------------------------------
//
// Launch: 1-D, global = round_up(n, L), local any (NULL). In place (Y == an
// input, same offset) is allowed.


// y = act(g) * u (act 0 or 1).
__kernel void glu(__global const uchar *G, ulong g_off, __global const uchar *U, ulong u_off, __global uchar *Y,
                  ulong y_off, int n, int act) {
    const int i = get_global_id(0);
    if (i >= n) return;
    const float g = ((__global const float *)(G + g_off))[i], u = ((__global const float *)(U + u_off))[i];
    ((__global float *)(Y + y_off))[i] = nm_act(g, act) * u;
}

__kernel void act(__global const uchar *X, ulong x_off, __global uchar *Y, ulong y_off, int n, int act) {
    const int i = get_global_id(0);
    if (i >= n) return;
    ((__global float *)(Y + y_off))[i] = nm_act(((__global const float *)(X + x_off))[i], act);
}

__kernel void add(__global const uchar *A, ulong a_off, __global const uchar *B, ulong b_off, __global uchar *Y,
                  ulong y_off, int n) {
    const int i = get_global_id(0);
    if (i >= n) return;
    ((__global float *)(Y + y_off))[i] =
        ((__global const float *)(A + a_off))[i] + ((__global const float *)(B + b_off))[i];
}

__kernel void scale(__global const uchar *A, ulong a_off, __global uchar *Y, ulong y_off, int n, float f) {
    const int i = get_global_id(0);
    if (i >= n) return;
    ((__global float *)(Y + y_off))[i] = ((__global const float *)(A + a_off))[i] * f;
}

// y = cap * tanh(a / cap).
__kernel void softcap(__global const uchar *A, ulong a_off, __global uchar *Y, ulong y_off, int n, float cap) {
    const int i = get_global_id(0);
    if (i >= n) return;
    ((__global float *)(Y + y_off))[i] = cap * tanh(((__global const float *)(A + a_off))[i] / cap);
}

// ---- layout ops (vision) ----------------------------------------------------------------
//
// patches: Y row t = (py, px) of the (W / p) x (H / p) patches of side p over
// 3 planes of W x H floats, elements in (channel, y, x) order (a conv
// kernel's); rows in raster order, or (group = 2) in 2 x 2 groups (backend.h).
// Launch: 2-D, global = (round_up(3 p p, L), (W / p) (H / p)), local any.
__kernel void patches(__global const uchar *X, ulong x_off, __global uchar *Y, ulong y_off, int W, int p, int H,
                      int group) {
    const int i = get_global_id(0), t = get_global_id(1), gw = W / p, P = 3 * p * p;
    if (i >= P || t >= gw * (H / p)) return;
    const int ch = i / (p * p), r = (i / p) % p, col = i % p;
    int py = t / gw, px = t % gw;
    if (group == 2) { // 2 x 2 groups (Qwen2-VL's merge order): t = ((yb gw/2 + xb) 2 + dy) 2 + dx
        const int g = t / 4, yb = g / (gw / 2), xb = g % (gw / 2);
        py = 2 * yb + (t / 2) % 2;
        px = 2 * xb + t % 2;
    }
    ((__global float *)(Y + y_off))[(size_t)t * P + i] =
        ((__global const float *)(X + x_off))[((size_t)ch * H + py * p + r) * W + px * p + col];
}

// pixel_shuffle: X [side * side, d] -> Y [(side/s)^2, d s s]; output row
// (yb, xb) is rows (yb s + dy, xb s + dx) of X, dy outer, dx inner.
// Launch: 2-D, global = (round_up(d s s, L), (side/s)^2), local any.
__kernel void pixel_shuffle(__global const uchar *X, ulong x_off, __global uchar *Y, ulong y_off, int d, int side,
                            int s) {
    const int j = get_global_id(0), o = get_global_id(1), sb = side / s;
    if (j >= d * s * s || o >= sb * sb) return;
    const int q = j / d, c = j % d, dy = q / s, dx = q % s, yb = o / sb, xb = o % sb;
    ((__global float *)(Y + y_off))[(size_t)o * d * s * s + j] =
        ((__global const float *)(X + x_off))[((size_t)(yb * s + dy) * side + xb * s + dx) * d + c];
}

// ---- convolutions (NM_OP_CONV1D, NM_OP_CONV_T1D; weights as [k][ic][oc], prepare_op's copy) ----------

#define NM_CONV_T 8 // conv1d: output frames of a work-item (NM_CL_CONV_T)

NM_INLINE float conv_act(float v, float slope) { return fmax(v, slope * v); }

// y[t][o] = (bias[o] + sum_{j, c} w[j][c][o] act(x[t + j dil - pad_l][c]) + a0[t][o] + a1[t][o]) * scale
// for NM_CONV_T frames t of a work-item. Launch: 2-D, global = (oc up to 64, ceil(n_out / NM_CONV_T)),
// local = (64, 1): a work-group's items read the same inputs and neighbouring weights.
__kernel void conv1d(__global const uchar *X, ulong x_off, __global const float *W, __global const uchar *B,
                     ulong b_off, int has_b, __global const uchar *A0, ulong a0_off, int has_a0,
                     __global const uchar *A1, ulong a1_off, int has_a1, __global uchar *Y, ulong y_off, int n,
                     int ic, int oc, int k, int dil, int pad_l, int n_out, float slope, float scale) {
    const int o = get_global_id(0), t0 = get_global_id(1) * NM_CONV_T;
    if (o >= oc) return;
    __global const float *x = (__global const float *)(X + x_off);
    const float b = has_b ? ((__global const float *)(B + b_off))[o] : 0.0f;
    float acc[NM_CONV_T];
    for (int r = 0; r < NM_CONV_T; r++) acc[r] = b;
    for (int j = 0; j < k; j++) {
        const int s0 = t0 + j * dil - pad_l;
        for (int c = 0; c < ic; c++) {
            const float w = W[((long)j * ic + c) * oc + o];
            for (int r = 0; r < NM_CONV_T; r++) {
                const int s = s0 + r;
                const float v = s >= 0 && s < n ? conv_act(x[(long)s * ic + c], slope) : 0.0f;
                acc[r] = fma(w, v, acc[r]);
            }
        }
    }
    __global float *y = (__global float *)(Y + y_off);
    __global const float *a0 = (__global const float *)(A0 + a0_off), *a1 = (__global const float *)(A1 + a1_off);
    for (int r = 0; r < NM_CONV_T && t0 + r < n_out; r++) {
        const long at = (long)(t0 + r) * oc + o;
        float v = acc[r];
        if (has_a0) v += a0[at];
        if (has_a1) v += a1[at];
        y[at] = v * scale;
    }
}

// The transposed convolution: y[t][o] = bias[o] + sum over taps j = (t + pad) mod stride, + stride, ...
// < k with s = (t + pad - j) / stride in [0, n) of sum_c w[j][c][o] act(x[s][c]). Launch: 2-D,
// global = (oc up to 64, n_out), local = (64, 1).
__kernel void conv_t1d(__global const uchar *X, ulong x_off, __global const float *W, __global const uchar *B,
                       ulong b_off, int has_b, __global uchar *Y, ulong y_off, int n, int ic, int oc, int k,
                       int stride, int pad, int n_out, float slope) {
    const int o = get_global_id(0), t = get_global_id(1);
    if (o >= oc || t >= n_out) return;
    __global const float *x = (__global const float *)(X + x_off);
    float acc = has_b ? ((__global const float *)(B + b_off))[o] : 0.0f;
    for (int j = (t + pad) % stride; j < k; j += stride) {
        const int s = (t + pad - j) / stride;
        if (s < 0 || s >= n) continue;
        for (int c = 0; c < ic; c++) acc = fma(W[((long)j * ic + c) * oc + o], conv_act(x[(long)s * ic + c], slope), acc);
    }
    ((__global float *)(Y + y_off))[(long)t * oc + o] = acc;
}
