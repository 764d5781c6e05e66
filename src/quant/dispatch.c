// Kernel tables: the scalar reference, and the one chosen for this CPU.
#include <assert.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>

#include "core/cpu.h"
#include "quant/kernels_impl.h"

typedef void (*quantize_fn)(const float *restrict src, void *restrict dst, int64_t n);

#define NM_EACH_TYPE(X)                                                                           \
    X(F32, f32) X(F16, f16) X(BF16, bf16) X(Q4_0, q4_0) X(Q4_1, q4_1) X(Q5_0, q5_0) X(Q5_1, q5_1) \
    X(Q8_0, q8_0) X(Q8_1, q8_1) X(MXFP4, mxfp4) X(Q2_K, q2_K) X(Q3_K, q3_K) X(Q4_K, q4_K)         \
    X(Q5_K, q5_K) X(Q6_K, q6_K) X(Q8_K, q8_K)

#define DOT_ENTRY(T, t) [NM_TYPE_##T] = nm_dot_##t##_ref,
#define DEQ_ENTRY(T, t) [NM_TYPE_##T] = nm_dequant_##t##_ref,
#define QUANT_ENTRY(T, t) [NM_TYPE_##T] = nm_quantize_##t##_ref,
#define DOTQ_ENTRY(T, t) [NM_TYPE_##T] = nm_dotq_##t##_ref,
#define GEMMQ_ENTRY(T, t) [NM_TYPE_##T] = nm_gemmq_##t##_ref,

static const nm_kernels ref_table = {
    .name = "ref",
    .dot = {NM_EACH_TYPE(DOT_ENTRY)},
    .dequant = {NM_EACH_TYPE(DEQ_ENTRY)},
    .dotq = {NM_EACH_TYPE(DOTQ_ENTRY)},
    .gemmq = {NM_EACH_TYPE(GEMMQ_ENTRY)},
    .quant_act =
        {
            [NM_TYPE_F32] = nm_quant_act_f32_ref,
            [NM_TYPE_F16] = nm_quant_act_f16_ref,
            [NM_TYPE_BF16] = nm_quant_act_bf16_ref,
            [NM_TYPE_Q8_0] = nm_quant_act_q8_0_ref,
            [NM_TYPE_Q8_1] = nm_quant_act_q8_1_ref,
            [NM_TYPE_Q8_K] = nm_quant_act_q8_K_ref,
        },
};
static const quantize_fn quantize_table[NM_TYPE_COUNT] = {NM_EACH_TYPE(QUANT_ENTRY)};

const nm_kernels *nm_kernels_ref(void) { return &ref_table; }

uint32_t nm_vec_dot_type(uint32_t type) {
    switch (type) {
    case NM_TYPE_F32: case NM_TYPE_F16: case NM_TYPE_BF16: return type;
    case NM_TYPE_Q4_0: case NM_TYPE_Q5_0: case NM_TYPE_Q8_0: case NM_TYPE_MXFP4: return NM_TYPE_Q8_0;
    case NM_TYPE_Q4_1: case NM_TYPE_Q5_1: case NM_TYPE_Q8_1: return NM_TYPE_Q8_1;
    case NM_TYPE_Q2_K: case NM_TYPE_Q3_K: case NM_TYPE_Q4_K: case NM_TYPE_Q5_K: case NM_TYPE_Q6_K:
    case NM_TYPE_Q8_K: return NM_TYPE_Q8_K;
    default: return NM_TYPE_COUNT;
    }
}

// Callers check nm_type_traits_get(type)->supported first; an unknown type
// here is a bug of ours.
void nm_dequantize_row_ref(uint32_t type, const void *src, float *dst, int64_t n) {
    assert(type < NM_TYPE_COUNT && ref_table.dequant[type]);
    if (type < NM_TYPE_COUNT && ref_table.dequant[type]) ref_table.dequant[type](src, dst, n);
}

void nm_quantize_row_ref(uint32_t type, const float *src, void *dst, int64_t n) {
    assert(type < NM_TYPE_COUNT && quantize_table[type]);
    if (type < NM_TYPE_COUNT && quantize_table[type]) quantize_table[type](src, dst, n);
}

float nm_vec_dot_ref(uint32_t type, const void *w, const float *x, int64_t n) {
    assert(type < NM_TYPE_COUNT && ref_table.dot[type]);
    if (type < NM_TYPE_COUNT && ref_table.dot[type]) return ref_table.dot[type](w, x, n);
    return NAN;
}

static nm_kernels chosen;
static pthread_once_t chosen_once = PTHREAD_ONCE_INIT;

// Types with a SIMD dotq but no SIMD gemmq get the pair loop over the chosen
// dotq, so that a caller of gemmq is never slower than its own loop would be.
static inline void gemmq_loop(nm_dotq_fn dot, const void *restrict w, size_t w_stride, int64_t n_rows,
                              const void *restrict xq, size_t x_stride, int64_t n_tok, int64_t K, float *restrict y,
                              int64_t ldy) {
    for (int64_t tok = 0; tok < n_tok; tok++)
        for (int64_t r = 0; r < n_rows; r++)
            y[tok * ldy + r] =
                dot((const uint8_t *)w + (size_t)r * w_stride, (const uint8_t *)xq + (size_t)tok * x_stride, K);
}
#define GEMMQ_VIA_DOTQ(T, t)                                                                                   \
    static void gemmq_via_dotq_##t(const void *restrict w, size_t w_stride, int64_t n_rows,                    \
                                   const void *restrict xq, size_t x_stride, int64_t n_tok, int64_t K,         \
                                   float *restrict y, int64_t ldy) {                                           \
        gemmq_loop(chosen.dotq[NM_TYPE_##T], w, w_stride, n_rows, xq, x_stride, n_tok, K, y, ldy);             \
    }
NM_EACH_TYPE(GEMMQ_VIA_DOTQ)
#undef GEMMQ_VIA_DOTQ
#define VIA_ENTRY(T, t) [NM_TYPE_##T] = gemmq_via_dotq_##t,
static const nm_gemmq_fn gemmq_via_dotq[NM_TYPE_COUNT] = {NM_EACH_TYPE(VIA_ENTRY)};

// Lays the non-NULL entries of a SIMD table over the chosen one (the
// reference stays where the SIMD table has a hole). A type with a fast dotq
// but no fast gemmq gets the loop over the chosen dotq, unless an earlier
// table already gave it a real gemmq.
#if defined(NM_HAVE_X86_SIMD) || defined(NM_HAVE_ARM_SIMD)
static void overlay(const nm_kernels *simd) {
    chosen.name = simd->name;
    for (int t = 0; t < NM_TYPE_COUNT; t++) {
        if (simd->dot[t]) chosen.dot[t] = simd->dot[t];
        if (simd->dequant[t]) chosen.dequant[t] = simd->dequant[t];
        if (simd->dotq[t]) chosen.dotq[t] = simd->dotq[t];
        if (simd->quant_act[t]) chosen.quant_act[t] = simd->quant_act[t];
        if (simd->gemv[t]) {
            chosen.gemv_prep[t] = simd->gemv_prep[t];
            chosen.gemv[t] = simd->gemv[t];
            chosen.gemv_multi[t] = simd->gemv_multi[t];
        }
        if (simd->gemmq_pack[t]) chosen.gemmq_pack[t] = simd->gemmq_pack[t];
        if (simd->gemmq_packed[t]) chosen.gemmq_packed[t] = simd->gemmq_packed[t];
        if (simd->gemmq[t]) chosen.gemmq[t] = simd->gemmq[t];
        else if (simd->dotq[t] && chosen.gemmq[t] == ref_table.gemmq[t]) chosen.gemmq[t] = gemmq_via_dotq[t];
    }
}
#endif

static bool env_on(const char *name) {
    const char *v = getenv(name);
    return v && v[0] == '1';
}

static void choose(void) {
    chosen = ref_table;
    if (env_on("NM_FORCE_REF")) return;
    const nm_cpu_features *cpu = nm_cpu_features_get();
    (void)cpu;
#if defined(NM_HAVE_X86_SIMD) && (defined(__x86_64__) || defined(__i386__))
    if (cpu->avx2 && cpu->fma && cpu->f16c) {
        overlay(nm_kernels_avx2());
        // NM_NO_VNNI=1 keeps the AVX2 dots (to compare, or to test them). The
        // VNNI dots take AVX-VNNI's encoding, or AVX512-VNNI's on ymm where a
        // CPU has only that (Zen 4): the same sums either way. That one is an
        // AVX-512 instruction: NM_NO_AVX512=1 (a CPU without AVX-512) leaves it out.
        const bool evex_vnni = cpu->avx512f && cpu->avx512vl && cpu->avx512vnni && !env_on("NM_NO_AVX512");
        const bool vnni = (cpu->avx_vnni || evex_vnni) && !env_on("NM_NO_VNNI");
        if (vnni) overlay(cpu->avx_vnni ? nm_kernels_avxvnni() : nm_kernels_avx512vnni_ymm());
        // NM_NO_AVX512=1 keeps the AVX2 / AVX-VNNI dots in place of the AVX-512 decode GEMV of q4_0, q4_1,
        // q5_0, q8_0, q4_K, q6_K and the prefill tiles of q4_0, q5_0, q8_0, q4_K, q6_K.
        if (cpu->avx512f && cpu->avx512bw && cpu->avx512dq && cpu->avx512vl && cpu->avx512vnni && cpu->avx512vbmi &&
            cpu->avx512bitalg && cpu->gfni && !env_on("NM_NO_AVX512")) {
            overlay(nm_kernels_avx512());
            chosen.name = vnni ? "avx2+vnni+avx512" : "avx2+avx512";
        }
    }
#elif defined(NM_HAVE_ARM_SIMD) && defined(__aarch64__)
    if (cpu->neon) {
        overlay(nm_kernels_neon());
        // NM_NO_DOTPROD=1 keeps the plain NEON dots (to compare, or to test them).
        if (cpu->dotprod && !env_on("NM_NO_DOTPROD")) overlay(nm_kernels_neon_dotprod());
    }
#endif
}

const nm_kernels *nm_kernels_get(void) {
    pthread_once(&chosen_once, choose);
    return &chosen;
}
