// The same VNNI dots and tiles as x86_vnni.c (x86_vnni_body.h), with the EVEX
// vpdpbusd of AVX512-VNNI + AVX512VL on ymm registers: for CPUs with AVX-512
// VNNI but not AVX-VNNI (Zen 4, Ice Lake, Cascade Lake), where the VEX form
// faults. Same instructions otherwise, so the same results as the AVX2 and
// AVX-VNNI builds. dispatch.c takes them only where cpuid reports avx512f,
// avx512vl and avx512vnni and not AVX-VNNI; the pragma adds those subsets to
// the functions below only.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC target("avx512f,avx512vl,avx512vnni")
#endif

#define NM_X86_VNNI_EVEX 1
#include "quant/x86_vnni_body.h"

#if defined(__clang__)
#pragma clang attribute pop
#endif

const nm_kernels *nm_kernels_avx512vnni_ymm(void) {
    nm_f16_table_init();
    return &vnni_table;
}
