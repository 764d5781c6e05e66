// CPU features, detected once (cpuid + xgetbv on x86, hwcaps on ARM) and
// handed to whoever picks kernels. Thread-safe.
#ifndef NM_CPU_H
#define NM_CPU_H

#include <stdbool.h>

typedef struct nm_cpu_features {
    bool avx2, fma, f16c, avx_vnni, avx512f; // x86 (AVX state enabled by the OS)
    // the AVX-512 subsets of the decode GEMV (x86_avx512.c): BW, DQ, VL, VNNI, VBMI, BITALG and GFNI
    bool avx512bw, avx512dq, avx512vl, avx512vnni, avx512vbmi, avx512bitalg, gfni;
    bool neon, dotprod;                       // aarch64
} nm_cpu_features;

const nm_cpu_features *nm_cpu_features_get(void);

#endif
