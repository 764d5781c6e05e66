// nanomind's OpenCL C kernels: OpenCL C 1.2, no extension required (cl_khr_fp64
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
// Launch: 3-D, global = (round_up(n_rot/2, L), n_head + n_head2, n_tok), local any (NULL).

__kernel void rope(__global uchar *X, ulong x_off, __global const uchar *Pos, ulong pos_off, int n_head, int head_dim,
                   int n_rot, int mode, float freq_base, float freq_scale, __global uchar *X2, ulong x2_off,
                   int n_head2) {
    const int i = get_global_id(0), hh = get_global_id(1), t = get_global_id(2);
    if (i >= n_rot / 2 || hh >= n_head + n_head2) return;
    // heads n_head.. are X2's (Q and K in one launch): the same positions and rotation
    const int second = hh >= n_head, h = second ? hh - n_head : hh, nh = second ? n_head2 : n_head;
    const float2 cs = rope_cs(((__global const int *)(Pos + pos_off))[t], i, n_rot, freq_base, freq_scale);
    const float c = cs.x, s = cs.y;
    __global float *x = (__global float *)(second ? X2 + x2_off : X + x_off) + ((ulong)t * nh + h) * head_dim;
    const int a = mode == 2 ? i : 2 * i, b = mode == 2 ? i + n_rot / 2 : 2 * i + 1;
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
// patches: Y row t = (py, px) of side x side patches of side p over 3 planes
// of S x S floats, elements in (channel, y, x) order (a conv kernel's).
// Launch: 2-D, global = (round_up(3 p p, L), side * side), local any.
__kernel void patches(__global const uchar *X, ulong x_off, __global uchar *Y, ulong y_off, int S, int p) {
    const int i = get_global_id(0), t = get_global_id(1), side = S / p, P = 3 * p * p;
    if (i >= P || t >= side * side) return;
    const int ch = i / (p * p), r = (i / p) % p, col = i % p, py = t / side, px = t % side;
    ((__global float *)(Y + y_off))[(size_t)t * P + i] =
        ((__global const float *)(X + x_off))[((size_t)ch * S + py * p + r) * S + px * p + col];
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
