// nanomind's OpenCL C kernels, part 1 of 3: the conventions, helpers, dot units, dequantization and
// the decode matvecs (kernels_x8.cl: the repacked q4_0 decode; kernels_ops.cl: the rest; cmake/embed.cmake
// joins the three into one program). OpenCL C 1.2, no extension required (cl_khr_fp64
// is used where present, for rope's angles only), no images, no subgroups, no
// cl_khr_fp16 (f16 data goes through vload_half / vstore_half; math is f32).
//
// Build with "-cl-std=CL1.2" and nothing that relaxes math (-cl-fast-relaxed-math,
// -cl-unsafe-math-optimizations, -cl-finite-math-only): the tests hold the kernels
// to 1e-5 of a double reference and softmax relies on exp(-inf) = 0.
//
// Conventions of every kernel:
// - Every buffer comes as `__global uchar *` plus a `ulong` byte offset, because
//   tensors sit at arbitrary offsets inside larger buffers (the mmapped GGUF).
//   Offsets must be 4-byte aligned (weights: GGUF gives 32; the kernels need 4).
// - Activations are contiguous f32 rows: row t of width w starts at float t*w.
// - Weight rows are ggml blocks (layouts in src/quant/kernels_impl.h; element
//   order as in src/quant/ref_legacy.c and ref_kquants.c). Row n of a weight
//   with K columns starts at byte n * nm_row_size(type, K).
// - "LWS" is the local size the host picks: a power of two, 32 <= LWS <= 256
//   (NM_MAX_LWS); kernels read it with get_local_size(0) and reduce through
//   __local memory, so no warp or wavefront size is assumed.
// - Integer arguments are cl_int (int), offsets cl_ulong, floats cl_float.

#ifdef cl_khr_fp64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#define NM_HAVE_FP64 1
#endif

// Helpers are forced inline: NVIDIA's compiler otherwise may keep them as
// calls, passing the float16/uchar16 arguments through memory.
#define NM_INLINE static inline __attribute__((always_inline))

#define NM_MAX_LWS 256 // largest local size of the 1-D kernels
#define NM_MAX_HD 512  // largest head_dim of the attention kernels

// ---- helpers --------------------------------------------------------------------------

NM_INLINE float ld_half(__global const uchar *p) { return vload_half(0, (__global const half *)p); }

// ggml's E8M0 scale for MXFP4, halved (2^(e-128)) because mxfp4_val gives
// E2M1 values times two (ggml's kvalues_mxfp4); e = 0, 1 give fp32
// subnormals (as the C reference).
NM_INLINE float e8m0_half(uchar e) {
    return e < 2 ? as_float(0x00200000u << e) : as_float((uint)(e - 1) << 23);
}

NM_INLINE float hsum4(float4 v) { return (v.x + v.y) + (v.z + v.w); }
NM_INLINE float hsum8(float8 v) { return hsum4(v.lo + v.hi); }
NM_INLINE float hsum16(float16 v) { return hsum8(v.lo + v.hi); }

// Sum over the work-group (1-D, power-of-two size), returned to every item.
// red: __local float[get_local_size(0)]. Barriers inside: call from all items.
NM_INLINE float wg_sum(float v, __local float *red) {
    const int lid = get_local_id(0);
    red[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = (int)get_local_size(0) >> 1; s > 0; s >>= 1) {
        if (lid < s) red[lid] += red[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    v = red[0];
    barrier(CLK_LOCAL_MEM_FENCE); // red is free again when we return
    return v;
}

NM_INLINE float wg_max(float v, __local float *red) {
    const int lid = get_local_id(0);
    red[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = (int)get_local_size(0) >> 1; s > 0; s >>= 1) {
        if (lid < s) red[lid] = fmax(red[lid], red[lid + s]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    v = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return v;
}

// Scale and min of sub-block j (0..7) of a q4_K/q5_K super-block (q = its 12
// scale bytes), as nm_get_scale_min_k4.
NM_INLINE float2 scale_min_k4(int j, __global const uchar *q) {
    uint sc, m;
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
    return (float2)((float)sc, (float)m);
}

// ---- dot units (matvec) ------------------------------------------------------------------
//
// dot_T(row, u, x): the dot of unit u of a weight row with the matching
// elements of the f32 activation x (x = the row's start). Units are small
// (4 bytes of quants: 8 elements, 16 for q6_K; 4 elements for f32/f16) and
// numbered so that consecutive work-items read consecutive words of the row
// AND consecutive 16-byte pieces of x: a unit per block (32 floats of x per
// work-item) made x's reads strided and cost 4x on an H200.

NM_INLINE uint ld32_a2(__global const uchar *p) { // 4 bytes at a 2-byte aligned address
    __global const ushort *q = (__global const ushort *)p;
    return (uint)q[0] | ((uint)q[1] << 16);
}
// Low / high nibbles of the 4 bytes of w, byte 0 first.
NM_INLINE uint4 nib_lo(uint w) { return (uint4)(w, w >> 8, w >> 16, w >> 24) & 15u; }
NM_INLINE uint4 nib_hi(uint w) { return (uint4)(w >> 4, w >> 12, w >> 20, w >> 28) & 15u; }
NM_INLINE uint4 bytes4(uint w) { return (uint4)(w, w >> 8, w >> 16, w >> 24) & 255u; }
// Low / high nibbles of w as floats minus 8 (q4_0's values), made by their
// bits (2^23 + n, minus 2^23 + 8: exact) rather than by int-to-float
// conversions, which run at an eighth of the rate of float arithmetic on
// NVIDIA GPUs.
NM_INLINE float4 q4_lo(uint w) { return as_float4(((uint4)(w, w >> 8, w >> 16, w >> 24) & 15u) | 0x4B000000u) - 8388616.0f; }
NM_INLINE float4 q4_hi(uint w) { return as_float4(((uint4)(w >> 4, w >> 12, w >> 20, w >> 28) & 15u) | 0x4B000000u) - 8388616.0f; }

NM_INLINE float dot_f32(__global const uchar *row, int u, __global const float *x) {
    return dot(vload4(u, (__global const float *)row), vload4(u, x));
}

NM_INLINE float dot_f16(__global const uchar *row, int u, __global const float *x) {
    return dot(vload_half4(u, (__global const half *)row), vload4(u, x));
}

// Legacy blocks: unit u = 4 b + i is bytes 4i..4i+3 of block b's nibbles,
// elements 4i + j (low nibbles) and 16 + 4i + j (high).
NM_INLINE float dot_q4_0(__global const uchar *row, int u, __global const float *x) {
    const int b = u >> 2, i = u & 3;
    __global const uchar *p = row + b * 18; // d | qs[16]; 2-byte aligned
    const uint w = ld32_a2(p + 2 + 4 * i);
    __global const float *xb = x + b * 32 + 4 * i;
    const float s = dot(convert_float4(nib_lo(w)) - 8.0f, vload4(0, xb)) +
                    dot(convert_float4(nib_hi(w)) - 8.0f, vload4(0, xb + 16));
    return ld_half(p) * s;
}

NM_INLINE float dot_q4_1(__global const uchar *row, int u, __global const float *x) {
    const int b = u >> 2, i = u & 3;
    __global const uchar *p = row + b * 20; // d | m | qs[16]; 4-byte aligned
    const uint w = *(__global const uint *)(p + 4 + 4 * i);
    __global const float *xb = x + b * 32 + 4 * i;
    const float4 x0 = vload4(0, xb), x1 = vload4(0, xb + 16);
    return ld_half(p) * (dot(convert_float4(nib_lo(w)), x0) + dot(convert_float4(nib_hi(w)), x1)) +
           ld_half(p + 2) * hsum4(x0 + x1);
}

NM_INLINE float dot_q5_0(__global const uchar *row, int u, __global const float *x) {
    const int b = u >> 2, i = u & 3;
    __global const uchar *p = row + b * 22; // d | qh[4] | qs[16]; 2-byte aligned
    const uint qh = ld32_a2(p + 2), w = ld32_a2(p + 6 + 4 * i); // qh bit j: 5th bit of element j
    const uint4 sh = (uint4)(0, 1, 2, 3);
    const uint4 hl = ((uint4)(qh >> (4 * i)) >> sh) & 1u, hh = ((uint4)(qh >> (16 + 4 * i)) >> sh) & 1u;
    __global const float *xb = x + b * 32 + 4 * i;
    const float s = dot(convert_float4(nib_lo(w) | (hl << 4)) - 16.0f, vload4(0, xb)) +
                    dot(convert_float4(nib_hi(w) | (hh << 4)) - 16.0f, vload4(0, xb + 16));
    return ld_half(p) * s;
}

// q8_0: unit u = 4 b + i is elements 8i..8i+7 of block b.
NM_INLINE float dot_q8_0(__global const uchar *row, int u, __global const float *x) {
    const int b = u >> 2, i = u & 3;
    __global const uchar *p = row + b * 34; // d | qs[32] (int8); 2-byte aligned
    const float8 q = convert_float8(as_char8(vload4(0, (__global const ushort *)(p + 2 + 8 * i))));
    const float8 v = vload8(0, x + b * 32 + 8 * i);
    return ld_half(p) * (dot(q.lo, v.lo) + dot(q.hi, v.hi));
}

// E2M1 nibbles -> {0, 1, 2, 3, 4, 6, 8, 12, -0, -1, ..., -12} (times two), without a table: a
// __constant lookup with 16 different addresses per warp serializes.
NM_INLINE float4 mxfp4_val(uint4 v) {
    const int4 e = convert_int4(v & 7u);
    const int4 mag = select(select(4 * e - 16, 2 * e - 4, e < 6), e, e < 4);
    return convert_float4(select(mag, -mag, convert_int4(v & 8u) != 0));
}

NM_INLINE float dot_mxfp4(__global const uchar *row, int u, __global const float *x) {
    const int b = u >> 2, i = u & 3;
    __global const uchar *p = row + b * 17; // e | qs[16]; byte aligned
    const uint w = as_uint(vload4(0, p + 1 + 4 * i));
    __global const float *xb = x + b * 32 + 4 * i;
    const float s = dot(mxfp4_val(nib_lo(w)), vload4(0, xb)) + dot(mxfp4_val(nib_hi(w)), vload4(0, xb + 16));
    return e8m0_half(p[0]) * s;
}

// q4_K (144 B: d | dmin | scales[12] | qs[128]): qs[32c + l] holds element
// 64c + l (low nibble, sub-block 2c) and 64c + 32 + l (high, sub-block 2c + 1).
// Unit u = 32 i + 8 c + m is qs[32c + 4m ..+4] of super-block i.
NM_INLINE float dot_q4_K(__global const uchar *row, int u, __global const float *x) {
    const int i = u >> 5, c = (u >> 3) & 3, m = u & 7;
    __global const uchar *p = row + i * 144; // 4-byte aligned
    const uint w = *(__global const uint *)(p + 16 + 32 * c + 4 * m);
    __global const float *xb = x + i * 256 + 64 * c + 4 * m;
    const float4 x0 = vload4(0, xb), x1 = vload4(0, xb + 32);
    const float2 sm0 = scale_min_k4(2 * c, p + 4), sm1 = scale_min_k4(2 * c + 1, p + 4);
    return ld_half(p) * (sm0.x * dot(convert_float4(nib_lo(w)), x0) + sm1.x * dot(convert_float4(nib_hi(w)), x1)) -
           ld_half(p + 2) * (sm0.y * hsum4(x0) + sm1.y * hsum4(x1));
}

// q5_K (176 B: d | dmin | scales[12] | qh[32] | qs[128]): as q4_K, plus bit
// 2c (low) or 2c + 1 (high) of qh[l] as the 5th bit.
NM_INLINE float dot_q5_K(__global const uchar *row, int u, __global const float *x) {
    const int i = u >> 5, c = (u >> 3) & 3, m = u & 7;
    __global const uchar *p = row + i * 176; // 4-byte aligned
    const uint w = *(__global const uint *)(p + 48 + 32 * c + 4 * m);
    const uint qh = *(__global const uint *)(p + 16 + 4 * m);
    const uint4 sh = (uint4)(0, 8, 16, 24) + (uint)(2 * c);
    const uint4 hl = ((uint4)(qh) >> sh) & 1u, hh = ((uint4)(qh) >> (sh + 1u)) & 1u;
    __global const float *xb = x + i * 256 + 64 * c + 4 * m;
    const float4 x0 = vload4(0, xb), x1 = vload4(0, xb + 32);
    const float2 sm0 = scale_min_k4(2 * c, p + 4), sm1 = scale_min_k4(2 * c + 1, p + 4);
    return ld_half(p) * (sm0.x * dot(convert_float4(nib_lo(w) | (hl << 4)), x0) +
                         sm1.x * dot(convert_float4(nib_hi(w) | (hh << 4)), x1)) -
           ld_half(p + 2) * (sm0.y * hsum4(x0) + sm1.y * hsum4(x1));
}

// q6_K (210 B: ql[128] | qh[64] | scales[16] (int8) | d): element
// 128h + 32k + l has low bits ql[64h + 32(k&1) + l] >> 4(k>>1) and high bits
// qh[32h + l] >> 2k. Unit u = 16 i + 8 h + m covers l in [4m, 4m + 4) for the
// four k (16 elements): 4 bytes of each of ql's two rows and of qh.
NM_INLINE float dot_q6_K(__global const uchar *row, int u, __global const float *x) {
    const int i = u >> 4, h = (u >> 3) & 1, l0 = (u & 7) * 4;
    __global const uchar *p = row + i * 210; // 2-byte aligned
    const uint4 a = bytes4(ld32_a2(p + 64 * h + l0)), b = bytes4(ld32_a2(p + 64 * h + 32 + l0));
    const uint4 qh = bytes4(ld32_a2(p + 128 + 32 * h + l0));
    __global const char *sc = (__global const char *)(p + 192) + 8 * h + (l0 >> 4);
    __global const float *xb = x + i * 256 + 128 * h + l0;
    const float4 q0 = convert_float4(convert_int4((a & 15u) | ((qh & 3u) << 4)) - 32);
    const float4 q1 = convert_float4(convert_int4((b & 15u) | (((qh >> 2) & 3u) << 4)) - 32);
    const float4 q2 = convert_float4(convert_int4((a >> 4) | (((qh >> 4) & 3u) << 4)) - 32);
    const float4 q3 = convert_float4(convert_int4((b >> 4) | ((qh >> 6) << 4)) - 32);
    const float s = (float)sc[0] * dot(q0, vload4(0, xb)) + (float)sc[2] * dot(q1, vload4(0, xb + 32)) +
                    (float)sc[4] * dot(q2, vload4(0, xb + 64)) + (float)sc[6] * dot(q3, vload4(0, xb + 96));
    return ld_half(p + 208) * s;
}

// ---- 4-element dequantization (matmul tiles, get_rows) ------------------------------------
//
// ld4_T(row, k, K): elements k..k+3 of a weight row, k % 4 == 0. Quantized
// types need k + 3 < K (K is a multiple of their block); f32 and f16 return 0
// past K, so their K may be anything.

NM_INLINE float4 ld4_f32(__global const uchar *row, int k, int K) {
    __global const float *w = (__global const float *)row;
    if (k + 3 < K) return vload4(0, w + k);
    return (float4)(w[k], k + 1 < K ? w[k + 1] : 0.0f, k + 2 < K ? w[k + 2] : 0.0f, 0.0f);
}

NM_INLINE float4 ld4_f16(__global const uchar *row, int k, int K) {
    __global const half *w = (__global const half *)row;
    if (k + 3 < K) return vload_half4(0, w + k);
    return (float4)(vload_half(k, w), k + 1 < K ? vload_half(k + 1, w) : 0.0f, k + 2 < K ? vload_half(k + 2, w) : 0.0f,
                    0.0f);
}

NM_INLINE float4 ld4_q4_0(__global const uchar *row, int k, int K) {
    const int j = k & 31;
    __global const uchar *p = row + (k >> 5) * 18;
    const uchar4 q = vload4(0, p + 2 + (j & 15));
    return (convert_float4(j < 16 ? (q & (uchar4)15) : (q >> (uchar4)4)) - 8.0f) * ld_half(p);
}

NM_INLINE float4 ld4_q4_1(__global const uchar *row, int k, int K) {
    const int j = k & 31;
    __global const uchar *p = row + (k >> 5) * 20;
    const uchar4 q = vload4(0, p + 4 + (j & 15));
    return convert_float4(j < 16 ? (q & (uchar4)15) : (q >> (uchar4)4)) * ld_half(p) + ld_half(p + 2);
}

NM_INLINE float4 ld4_q5_0(__global const uchar *row, int k, int K) {
    const int j = k & 31;
    __global const uchar *p = row + (k >> 5) * 22;
    __global const ushort *p16 = (__global const ushort *)p;
    const uint qh = (uint)p16[1] | ((uint)p16[2] << 16);
    const uchar4 q = vload4(0, p + 6 + (j & 15));
    const uint4 nib = convert_uint4(j < 16 ? (q & (uchar4)15) : (q >> (uchar4)4));
    const uint4 hb = ((uint4)(qh) >> (uint4)(j, j + 1, j + 2, j + 3)) & 1u;
    return (convert_float4(nib | (hb << 4)) - 16.0f) * ld_half(p);
}

NM_INLINE float4 ld4_q8_0(__global const uchar *row, int k, int K) {
    __global const uchar *p = row + (k >> 5) * 34;
    return convert_float4(vload4(0, (__global const char *)(p + 2 + (k & 31)))) * ld_half(p);
}

NM_INLINE float4 ld4_mxfp4(__global const uchar *row, int k, int K) {
    const int j = k & 31;
    __global const uchar *p = row + (k >> 5) * 17;
    const uchar4 q = vload4(0, p + 1 + (j & 15));
    return mxfp4_val(convert_uint4(j < 16 ? (q & (uchar4)15) : (q >> (uchar4)4))) * e8m0_half(p[0]);
}

NM_INLINE float4 ld4_q4_K(__global const uchar *row, int k, int K) {
    const int r = k & 255, c = r >> 6, hi = (r >> 5) & 1, l = r & 31;
    __global const uchar *p = row + (k >> 8) * 144;
    const uchar4 q = vload4(0, p + 16 + 32 * c + l);
    const float2 sm = scale_min_k4(2 * c + hi, p + 4);
    const float d = ld_half(p) * sm.x, m = ld_half(p + 2) * sm.y;
    return d * convert_float4(hi ? (q >> (uchar4)4) : (q & (uchar4)15)) - m;
}

NM_INLINE float4 ld4_q5_K(__global const uchar *row, int k, int K) {
    const int r = k & 255, c = r >> 6, hi = (r >> 5) & 1, l = r & 31;
    __global const uchar *p = row + (k >> 8) * 176;
    const uchar4 q = vload4(0, p + 48 + 32 * c + l), qh = vload4(0, p + 16 + l);
    const uchar4 nib = hi ? (q >> (uchar4)4) : (q & (uchar4)15);
    const uchar4 h5 = ((qh >> (uchar4)(uchar)(2 * c + hi)) & (uchar4)1) << (uchar4)4;
    const float2 sm = scale_min_k4(2 * c + hi, p + 4);
    const float d = ld_half(p) * sm.x, m = ld_half(p + 2) * sm.y;
    return d * convert_float4(nib | h5) - m;
}

NM_INLINE float4 ld4_q6_K(__global const uchar *row, int k, int K) {
    const int r = k & 255, h = r >> 7, kk = (r >> 5) & 3, l = r & 31;
    __global const uchar *p = row + (k >> 8) * 210;
    const uchar4 a = vload4(0, p + 64 * h + 32 * (kk & 1) + l), qh = vload4(0, p + 128 + 32 * h + l);
    const uchar4 lo = (a >> (uchar4)(uchar)(4 * (kk >> 1))) & (uchar4)15;
    const uchar4 hb = (qh >> (uchar4)(uchar)(2 * kk)) & (uchar4)3;
    const float d = ld_half(p + 208) * (float)((__global const char *)(p + 192))[r >> 4];
    return d * convert_float4(convert_int4(lo | (hb << (uchar4)4)) - 32);
}

// ---- mv_T: decode matvec ----------------------------------------------------------------
//
// Y[n] = sum_k W[n,k] X[k] (+ Bias[n] if has_bias), n < N; W is N rows of K.
// Launch: 1-D, global = ceil(N / NM_MV_ROWS) * LWS, local = LWS: a work-group
// computes NM_MV_ROWS consecutive rows, each work-item the same slice of K in
// all of them (the activations it reads serve every row, from registers or
// L1), and one reduction through __local memory serves the rows together: the
// per-row cost of the group (its launch, the barriers) is shared.
// K: a multiple of the type's block (32; 256 for q4_K/q5_K/q6_K); any K for
// f32/f16. Local memory: NM_MV_ROWS * NM_MAX_LWS floats.
#define NM_MV_ROWS 4

#define NM_MV(T, UE, BLK, BSZ, TAIL)                                                                              \
    __kernel void mv_##T(__global const uchar *W, ulong w_off, __global const uchar *X, ulong x_off,              \
                         __global uchar *Y, ulong y_off, __global const uchar *Bias, ulong b_off, int has_bias,   \
                         int K, int N) {                                                                          \
        __local float red[NM_MV_ROWS * NM_MAX_LWS];                                                               \
        const int n0 = get_group_id(0) * NM_MV_ROWS, lid = get_local_id(0), lws = get_local_size(0);             \
        const ulong rb = (ulong)(K / (BLK)) * (BSZ);                                                              \
        __global const float *x = (__global const float *)(X + x_off);                                           \
        const int nu = K / (UE);                                                                                  \
        float acc[NM_MV_ROWS];                                                                                    \
        for (int r = 0; r < NM_MV_ROWS; r++) {                                                                    \
            float s = 0.0f;                                                                                       \
            if (n0 + r < N) {                                                                                     \
                __global const uchar *row = W + w_off + (ulong)(n0 + r) * rb;                                     \
                for (int u = lid; u < nu; u += lws) s += dot_##T(row, u, x);                                      \
                TAIL                                                                                              \
            }                                                                                                     \
            acc[r] = s;                                                                                           \
        }                                                                                                         \
        for (int r = 0; r < NM_MV_ROWS; r++) red[r * lws + lid] = acc[r];                                         \
        barrier(CLK_LOCAL_MEM_FENCE);                                                                             \
        for (int st = lws >> 1; st > 0; st >>= 1) {                                                               \
            if (lid < st)                                                                                         \
                for (int r = 0; r < NM_MV_ROWS; r++) red[r * lws + lid] += red[r * lws + lid + st];               \
            barrier(CLK_LOCAL_MEM_FENCE);                                                                         \
        }                                                                                                         \
        if (lid < NM_MV_ROWS && n0 + lid < N) {                                                                   \
            float s = red[lid * lws];                                                                             \
            if (has_bias) s += ((__global const float *)(Bias + b_off))[n0 + lid];                               \
            ((__global float *)(Y + y_off))[n0 + lid] = s;                                                        \
        }                                                                                                         \
    }

NM_MV(f32, 4, 1, 4, for (int k = nu * 4 + lid; k < K; k += lws) s += ((__global const float *)row)[k] * x[k];)
NM_MV(f16, 4, 1, 2, for (int k = nu * 4 + lid; k < K; k += lws) s += vload_half(k, (__global const half *)row) * x[k];)
// q4_0, the decode type of most models: the activations a work-item needs
// (8 floats per 4 bytes of quants) are loaded once into registers and serve
// the group's NM_MV_ROWS rows, so L1 carries 2 floats per weight byte, not 8.
__kernel void mv_q4_0(__global const uchar *W, ulong w_off, __global const uchar *X, ulong x_off, __global uchar *Y,
                      ulong y_off, __global const uchar *Bias, ulong b_off, int has_bias, int K, int N) {
    __local float red[NM_MV_ROWS * NM_MAX_LWS];
    const int n0 = get_group_id(0) * NM_MV_ROWS, lid = get_local_id(0), lws = get_local_size(0);
    const ulong rb = (ulong)(K / 32) * 18;
    __global const float *x = (__global const float *)(X + x_off);
    __global const uchar *w0 = W + w_off + (ulong)n0 * rb;
    const int nu = K / 8, nr = N - n0 < NM_MV_ROWS ? N - n0 : NM_MV_ROWS;
    float acc[NM_MV_ROWS];
    for (int r = 0; r < NM_MV_ROWS; r++) acc[r] = 0.0f;
    for (int u = lid; u < nu; u += lws) {
        const int b = u >> 2, i = u & 3;
        const float4 x0 = vload4(0, x + b * 32 + 4 * i), x1 = vload4(0, x + b * 32 + 4 * i + 16);
        uint w[NM_MV_ROWS]; // every row's loads first (see mv_q4_0r)
        float d[NM_MV_ROWS];
        for (int r = 0; r < NM_MV_ROWS; r++) {
            __global const uchar *p = w0 + (ulong)(r < nr ? r : 0) * rb + b * 18;
            w[r] = ld32_a2(p + 2 + 4 * i);
            d[r] = ld_half(p);
        }
        for (int r = 0; r < NM_MV_ROWS; r++)
            acc[r] += d[r] * (dot(q4_lo(w[r]), x0) + dot(q4_hi(w[r]), x1));
    }
    for (int r = 0; r < NM_MV_ROWS; r++) red[r * lws + lid] = acc[r];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int st = lws >> 1; st > 0; st >>= 1) {
        if (lid < st)
            for (int r = 0; r < NM_MV_ROWS; r++) red[r * lws + lid] += red[r * lws + lid + st];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid < nr) {
        float s = red[lid * lws];
        if (has_bias) s += ((__global const float *)(Bias + b_off))[n0 + lid];
        ((__global float *)(Y + y_off))[n0 + lid] = s;
    }
}
NM_MV(q4_1, 8, 32, 20, )
NM_MV(q5_0, 8, 32, 22, )
NM_MV(q8_0, 8, 32, 34, )
NM_MV(mxfp4, 8, 32, 17, )
NM_MV(q4_K, 8, 256, 144, )
NM_MV(q5_K, 8, 256, 176, )
NM_MV(q6_K, 16, 256, 210, )

// q4_0 repacked (prepare_weight on a device with its own memory, where the
// weights are copied anyway): the N x K/32 blocks' quants first, 16 bytes
// each and 16-byte aligned (row n, block b at (n * K/32 + b) * 16), then their
// f16 scales in the same order. A work-item takes a whole block: one 16-byte
// load and one scale per row for NM_MVR_ROWS rows. The activations of the
// group's LWS blocks are staged in local memory first, read from global
// memory by consecutive items at consecutive addresses (each item reading its
// own block's 128 bytes from global memory would touch 32 cache lines per
// warp and load instruction), 36 floats per block so that items reading
// their blocks' float4s at once hit different banks. Nibbles: q4_lo/q4_hi.
// Launch: 1-D, global = ceil(N / NM_MVR_ROWS) * LWS, local = LWS <= NM_MVR_LWS.
#define NM_MVR_ROWS 8
#define NM_MVR_LWS 128
#define NM_MVR_XS 36 // floats per staged block


// The same product with the activations in 8 bits (mv_q4_0r8): each
// work-item quantizes its own block of the staged activations as q8_0 does
// (d = max |x| / 127, q = round(x / d), in f32 here), and a block's sum is
// d_w * d_x * (sum q_w q_x - 8 sum q_x) from four-byte integer dot products:
// PTX dp4a where the program is built with NM_DP4A_PTX (NVIDIA's compiler
// takes inline PTX), the same sum in C elsewhere. Per block and row that is 8
// dot instructions and the nibble masks instead of 32 float multiply-adds and
// 32 conversions. The rounding of x to 8 bits is the CPU backend's for q4_0
// (its activations are q8_0 there too).
NM_INLINE int dp4(uint a, uint b, int c) {
#ifdef NM_DP4A_PTX
    int r;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
#else
    const char4 x = as_char4(a), y = as_char4(b);
    return c + x.s0 * y.s0 + x.s1 * y.s1 + x.s2 * y.s2 + x.s3 * y.s3;
#endif
}

// x8's rounding of 32 values v (8 float4), as q8_0 rounds a block: d = max|v|
// / 127 into *dx, q = round(v / d) (through 1 / d) packed 4 to a uint into q;
// returns the sum of the q.
NM_INLINE int q8_round(const float4 *v, uint *q, float *dx) {
    float amax = 0.0f;
    for (int i = 0; i < 8; i++) {
        const float4 a = fabs(v[i]);
        amax = fmax(amax, fmax(fmax(a.x, a.y), fmax(a.z, a.w)));
    }
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    int sx = 0;
    for (int i = 0; i < 8; i++) {
        const int4 t = convert_int4(round(v[i] * id));
        sx += (t.x + t.y) + (t.z + t.w);
        q[i] = as_uint(convert_char4(t));
    }
    *dx = d;
    return sx;
}

// sum_i (q_i - 8) x_i of one q4_0 block (16 bytes of nibbles) and one x8 block
// (x0: elements 0..15, x1: 16..31) added to s (start: -8 sum x_i).
NM_INLINE int q4x8(const uint4 q, const uint4 x0, const uint4 x1, int s) {
    const uint m = 0x0F0F0F0Fu;
    s = dp4(q.x & m, x0.x, s);
    s = dp4(q.y & m, x0.y, s);
    s = dp4(q.z & m, x0.z, s);
    s = dp4(q.w & m, x0.w, s);
    s = dp4((q.x >> 4) & m, x1.x, s);
    s = dp4((q.y >> 4) & m, x1.y, s);
    s = dp4((q.z >> 4) & m, x1.z, s);
    s = dp4((q.w >> 4) & m, x1.w, s);
    return s;
}

// One block of the product: f32 activations (q8 = 0, mv_q4_0r) or 8-bit (q8 = 1, mv_q4_0r8).
NM_INLINE void mvr_block(const uint4 *q, const float *d, __local const float *xs, float *acc, const int q8) {
    float4 xv[8];
    for (int i = 0; i < 8; i++) xv[i] = vload4(0, xs + 4 * i);
    if (!q8) {
        for (int r = 0; r < NM_MVR_ROWS; r++) {
            const float s = (dot(q4_lo(q[r].x), xv[0]) + dot(q4_lo(q[r].y), xv[1])) +
                            (dot(q4_lo(q[r].z), xv[2]) + dot(q4_lo(q[r].w), xv[3])) +
                            (dot(q4_hi(q[r].x), xv[4]) + dot(q4_hi(q[r].y), xv[5])) +
                            (dot(q4_hi(q[r].z), xv[6]) + dot(q4_hi(q[r].w), xv[7]));
            acc[r] += d[r] * s;
        }
        return;
    }
    uint xq[8];
    float dx;
    const int sx = q8_round(xv, xq, &dx);
    const uint4 x0 = (uint4)(xq[0], xq[1], xq[2], xq[3]), x1 = (uint4)(xq[4], xq[5], xq[6], xq[7]);
    for (int r = 0; r < NM_MVR_ROWS; r++) acc[r] += d[r] * (dx * (float)q4x8(q[r], x0, x1, -8 * sx));
}

NM_INLINE void mvr(__global const uchar *W, ulong w_off, __global const uchar *X, ulong x_off, __global uchar *Y,
                   ulong y_off, __global const uchar *Bias, ulong b_off, int has_bias, int K, int N,
                   __local float *red, __local float *xs, const int q8) {
    const int n0 = get_group_id(0) * NM_MVR_ROWS, lid = get_local_id(0), lws = get_local_size(0);
    const int nb = K / 32, nr = N - n0 < NM_MVR_ROWS ? N - n0 : NM_MVR_ROWS;
    __global const uint4 *qs = (__global const uint4 *)(W + w_off) + (ulong)n0 * nb;
    __global const half *ds = (__global const half *)(W + w_off + (ulong)N * nb * 16) + (ulong)n0 * nb;
    __global const float *x = (__global const float *)(X + x_off);
    float acc[NM_MVR_ROWS];
    for (int r = 0; r < NM_MVR_ROWS; r++) acc[r] = 0.0f;
    for (int b0 = 0; b0 < nb; b0 += lws) {
        const int nbk = min(lws, nb - b0); // blocks of this step
        barrier(CLK_LOCAL_MEM_FENCE);      // the last step's reads are done
        for (int i = lid; i < nbk * 8; i += lws) vstore4(vload4(8 * b0 + i, x), 0, xs + (i >> 3) * NM_MVR_XS + 4 * (i & 7));
        barrier(CLK_LOCAL_MEM_FENCE);
        if (lid < nbk) {
            const int b = b0 + lid;
            // every row's loads first, then the arithmetic: a loop that may stop early
            // (rows past N) would issue them one after the other, each waiting for memory
            uint4 q[NM_MVR_ROWS];
            float d[NM_MVR_ROWS];
            for (int r = 0; r < NM_MVR_ROWS; r++) {
                const int rr = r < nr ? r : 0; // rows past N read row 0 again, unused
                q[r] = qs[(ulong)rr * nb + b];
                d[r] = vload_half((ulong)rr * nb + b, ds);
            }
            mvr_block(q, d, xs + lid * NM_MVR_XS, acc, q8);
        }
    }
    for (int r = 0; r < NM_MVR_ROWS; r++) red[r * lws + lid] = acc[r];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int st = lws >> 1; st > 0; st >>= 1) {
        if (lid < st)
            for (int r = 0; r < NM_MVR_ROWS; r++) red[r * lws + lid] += red[r * lws + lid + st];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid < nr) {
        float s = red[lid * lws];
        if (has_bias) s += ((__global const float *)(Bias + b_off))[n0 + lid];
        ((__global float *)(Y + y_off))[n0 + lid] = s;
    }
}

#define NM_MVR_KERNEL(name, q8)                                                                                   \
    __kernel void name(__global const uchar *W, ulong w_off, __global const uchar *X, ulong x_off,                \
                       __global uchar *Y, ulong y_off, __global const uchar *Bias, ulong b_off, int has_bias, int K, \
                       int N) {                                                                                   \
        __local float red[NM_MVR_ROWS * NM_MVR_LWS];                                                              \
        __local float xs[NM_MVR_LWS * NM_MVR_XS];                                                                 \
        mvr(W, w_off, X, x_off, Y, y_off, Bias, b_off, has_bias, K, N, red, xs, q8);                              \
    }
NM_MVR_KERNEL(mv_q4_0r, 0)
NM_MVR_KERNEL(mv_q4_0r8, 1)
