// AVX2 + FMA + F16C kernels (compiled with -mavx2 -mfma -mf16c, chosen at run
// time by dispatch.c). NULL entries fall back to the reference.
#include <immintrin.h>

#include "quant/kernels_impl.h"

static const nm_kernels avx2_table = {
    .name = "avx2",
};

const nm_kernels *nm_kernels_avx2(void) { return &avx2_table; }
