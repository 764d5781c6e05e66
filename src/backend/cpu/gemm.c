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
