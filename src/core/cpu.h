// CPU features, detected once (cpuid + xgetbv on x86, hwcaps on ARM) and
// handed to whoever picks kernels. Thread-safe.
#ifndef NM_CPU_H
#define NM_CPU_H

#include <stdbool.h>
#include <stddef.h>

typedef struct nm_cpu_features {
    bool avx2, fma, f16c, avx_vnni, avx512f; // x86 (AVX state enabled by the OS)
    // the AVX-512 subsets of the decode GEMV (x86_avx512.c): BW, DQ, VL, VNNI, VBMI, BITALG and GFNI
    bool avx512bw, avx512dq, avx512vl, avx512vnni, avx512vbmi, avx512bitalg, gfni;
    // AVX512-BF16 (its conversions); AMX tiles with the BF16 product (Sapphire Rapids on), their state
    // saved by the OS (before a tile instruction runs, nm_cpu_amx_granted must have said yes)
    bool avx512bf16, amx_bf16;
    bool neon, dotprod;                       // aarch64
} nm_cpu_features;

const nm_cpu_features *nm_cpu_features_get(void);
// Whether this process may use the AMX tiles: the CPU and OS have them and Linux granted the tile data
// (ARCH_REQ_XCOMP_PERM, asked on the first call only: a process granted it needs larger signal stacks).
bool nm_cpu_amx_granted(void);

// The CPU's name (x86: the cpuid brand string, as /proc/cpuinfo's "model
// name"; elsewhere that line of /proc/cpuinfo), blanks trimmed, into buf;
// "unknown" when there is none. Returns buf.
char *nm_cpu_model_name(char *buf, size_t size);
// The features above that this CPU has, space-separated ("avx2 fma f16c ..."), into buf. Returns buf.
char *nm_cpu_features_str(char *buf, size_t size);

#endif
