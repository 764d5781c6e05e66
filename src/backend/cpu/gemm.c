#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/gemm.h"
#include "core/cpu.h"

void nm_gemm_f32_ref(const float *restrict w, int64_t R, const float *restrict x, int64_t T, int64_t K,
                     float *restrict y, int64_t ldy, const float *restrict bias) {
    for (int64_t t = 0; t < T; t++)
        for (int64_t r = 0; r < R; r++) {
            float s = 0.0f;
            for (int64_t k = 0; k < K; k++) s += w[r * K + k] * x[t * K + k];
            y[t * ldy + r] = s + (bias ? bias[r] : 0.0f);
        }
}

nm_gemm_fn nm_gemm_f32_get(void) {
    const char *force = getenv("NM_FORCE_REF");
    if (force && !strcmp(force, "1")) return nm_gemm_f32_ref;
#ifdef NM_HAVE_X86_SIMD
    const nm_cpu_features *cpu = nm_cpu_features_get();
    if (cpu->avx2 && cpu->fma) return nm_gemm_f32_avx2;
#endif
    return nm_gemm_f32_ref;
}

void nm_gemm_pack16(const float *restrict w, int64_t rs, int64_t ks, int64_t R, int64_t K, float *restrict wp) {
    for (int64_t k = 0; k < K; k++) {
        float *o = wp + k * NM_GEMM_PACK_ROWS;
        int64_t r = 0;
        for (; r < R; r++) o[r] = w[r * rs + k * ks];
        for (; r < NM_GEMM_PACK_ROWS; r++) o[r] = 0.0f;
    }
}

static double expf_tab[32];
static void expf_tab_init(void) {
    for (int i = 0; i < 32; i++) {
        const double v = exp2(i / 32.0);
        uint64_t u;
        memcpy(&u, &v, sizeof u);
        u -= (uint64_t)i << 47;
        memcpy(&expf_tab[i], &u, sizeof u);
    }
}

const double *nm_expf_libm_table(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, expf_tab_init);
    return expf_tab;
}

#ifdef NM_HAVE_X86_SIMD
static nm_gemm_panel_kernels k512 = {nm_gemm_f32_xpanel_avx512, nm_gemm_f32_xpanel_pout_avx512, nm_softmax_panel_avx512,
                                     NULL, NULL, nm_gate_avx512, nm_tanh_avx512};
// The vector expf where it gives this libm's bits: every 2^15th float of
// [-104, 0] and its two neighbours, and the range's ends (in blocks on the
// stack: a heap block here would move malloc's mmap threshold).
static bool k512_agrees(const float *x, int n) {
    float y[512];
    nm_expf_libm_avx512(x, y, n, nm_expf_libm_table());
    for (int i = 0; i < n; i++) {
        const float want = expf(x[i]);
        if (memcmp(&want, &y[i], sizeof want)) return false;
    }
    return true;
}

static void k512_init(void) {
    float x[512];
    int n = 0;
    bool same = true;
    for (uint32_t u = 0x80000000u; u <= 0xc2d00000u && same; u += 1u << 15)
        for (uint32_t d = 0; d < 3; d++) {
            const uint32_t v = u + d;
            memcpy(&x[n++], &v, sizeof v);
            if (n == 512) same = k512_agrees(x, n), n = 0;
        }
    const float ends[] = {-0.0f, -0x1.9fe368p6f, -0x1.9fe366p6f, -0x1.9fe36ap6f, -87.33654f, -1e-30f, -104.0f, -0x1.f8cbb2p+5f};
    if (same && n + (int)(sizeof ends / sizeof ends[0]) > 512) same = k512_agrees(x, n), n = 0;
    for (size_t i = 0; i < sizeof ends / sizeof ends[0]; i++) x[n++] = ends[i];
    if (!same || !k512_agrees(x, n)) return;
    k512.expf_libm = nm_expf_libm_avx512;
    k512.softmax_ggml = nm_softmax_panel_ggml_avx512;
}
#endif

const nm_gemm_panel_kernels *nm_gemm_panel_get(void) {
    const char *force = getenv("NM_FORCE_REF"), *no512 = getenv("NM_NO_AVX512");
    if ((force && !strcmp(force, "1")) || (no512 && !strcmp(no512, "1"))) return NULL;
#ifdef NM_HAVE_X86_SIMD
    const nm_cpu_features *cpu = nm_cpu_features_get();
    if (cpu->avx2 && cpu->fma && cpu->avx512f) {
        static pthread_once_t once = PTHREAD_ONCE_INIT;
        pthread_once(&once, k512_init);
        return &k512;
    }
#endif
    return NULL;
}

// e^x = 2^n e^r: n = round(x log2 e), r = x - n ln 2 with ln 2 split in two
// (Cody-Waite: r exact enough for any n), e^r by its degree-6 Taylor
// polynomial (|r| <= 0.35: relative error < 2.5e-7). x clamped to [-87, 88]
// (normal results). The AVX2 version computes the same.
static inline float poly_expf(float x) {
    x = x < -87.0f ? -87.0f : x > 88.0f ? 88.0f : x;
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    const float r = (x - n * 0.693145751953125f) - n * 1.428606765330187e-6f;
    float p = 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union {
        int32_t i;
        float f;
    } sc = {.i = ((int32_t)n + 127) << 23};
    return p * sc.f;
}

float nm_expf(float x) { return poly_expf(x); }

float nm_expsum_ref(float *s, int64_t n, float m) {
    float sum = 0.0f;
    for (int64_t j = 0; j < n; j++) sum += (s[j] = poly_expf(s[j] - m));
    return sum;
}

nm_expsum_fn nm_expsum_get(void) {
    const char *force = getenv("NM_FORCE_REF");
    if (force && !strcmp(force, "1")) return nm_expsum_ref;
#ifdef NM_HAVE_X86_SIMD
    const nm_cpu_features *cpu = nm_cpu_features_get();
    if (cpu->avx2 && cpu->fma) return nm_expsum_avx2;
#endif
    return nm_expsum_ref;
}

void nm_xsigmoid_ref(const float *x, float *y, int64_t n, float a, float b) {
    for (int64_t i = 0; i < n; i++) {
        const float v = x[i];
        y[i] = v / (1.0f + poly_expf(-v * (a + b * v * v)));
    }
}

nm_xsigmoid_fn nm_xsigmoid_get(void) {
    const char *force = getenv("NM_FORCE_REF");
    if (force && !strcmp(force, "1")) return nm_xsigmoid_ref;
#ifdef NM_HAVE_X86_SIMD
    const nm_cpu_features *cpu = nm_cpu_features_get();
    if (cpu->avx2 && cpu->fma) return nm_xsigmoid_avx2;
#endif
    return nm_xsigmoid_ref;
}
