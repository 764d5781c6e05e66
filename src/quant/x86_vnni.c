// AVX-VNNI build of the VNNI dots and tiles (x86_vnni_body.h: vpdpbusd in
// place of vpmaddubsw + vpmaddwd, the AVX2 build's results). dispatch.c takes
// them only where cpuid reports AVX-VNNI (leaf 7.1 eax bit 4); the file is
// compiled with -mavx2 -mfma -mf16c like the other x86 files, and the target
// pragma adds avxvnni to the functions below only.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avxvnni"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC target("avxvnni")
#endif

#include "quant/x86_vnni_body.h"

#if defined(__clang__)
#pragma clang attribute pop
#endif

const nm_kernels *nm_kernels_avxvnni(void) {
    nm_f16_table_init();
    return &vnni_table;
}
