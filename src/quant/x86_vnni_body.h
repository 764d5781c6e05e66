// Internal to x86_vnni.c and x86_vnni512.c: the VNNI builds of the int8 block
// dots of x86_dotq_blocks.h and the gemmq tiles of x86_gemmq_blocks.h (q4_0,
// q4_1, q5_0, q5_1, q8_0, q8_1, mxfp4, q8_K weights): vpdpbusd in place of
// vpmaddubsw + vpmaddwd, same integer sums, so the same results as the AVX2
// build. Each includer sets its target (AVX-VNNI's VEX vpdpbusd, or AVX512-VNNI
// + VL's EVEX one with NM_X86_VNNI_EVEX) before including this, and exports
// vnni_table under its own name.
#ifndef NM_QUANT_X86_VNNI_BODY_H
#define NM_QUANT_X86_VNNI_BODY_H

#define NM_X86_VNNI 1
#include "quant/x86_dotq_blocks.h"
#include "quant/x86_gemmq_blocks.h"

static NM_GQ_DEFINE(gemmq_q4_0, NM_TYPE_Q4_0)
static NM_GQ_DEFINE(gemmq_q4_1, NM_TYPE_Q4_1)
static NM_GQ_DEFINE(gemmq_q5_0, NM_TYPE_Q5_0)
static NM_GQ_DEFINE(gemmq_q5_1, NM_TYPE_Q5_1)
static NM_GQ_DEFINE(gemmq_q8_0, NM_TYPE_Q8_0)
static NM_GQ_DEFINE(gemmq_mxfp4, NM_TYPE_MXFP4)

static float dotq_q4_0(const void *restrict w, const void *restrict xq, int64_t n) {
    return dotq_q4_0_blocks(w, xq, n);
}
static float dotq_q4_1(const void *restrict w, const void *restrict xq, int64_t n) {
    return dotq_q4_1_blocks(w, xq, n);
}
static float dotq_q5_0(const void *restrict w, const void *restrict xq, int64_t n) {
    return dotq_q5_0_blocks(w, xq, n);
}
static float dotq_q5_1(const void *restrict w, const void *restrict xq, int64_t n) {
    return dotq_q5_1_blocks(w, xq, n);
}
static float dotq_q8_0(const void *restrict w, const void *restrict xq, int64_t n) {
    return dotq_q8_0_blocks(w, xq, n);
}
static float dotq_q8_1(const void *restrict w, const void *restrict xq, int64_t n) {
    return dotq_q8_1_blocks(w, xq, n);
}
static float dotq_mxfp4(const void *restrict w, const void *restrict xq, int64_t n) {
    return dotq_mxfp4_blocks(w, xq, n);
}
static float dotq_q8_K(const void *restrict w, const void *restrict xq, int64_t n) {
    return dotq_q8_K_blocks(w, xq, n);
}


static const nm_kernels vnni_table = {
    .name = "avx2+vnni",
    .dotq =
        {
            [NM_TYPE_Q4_0] = dotq_q4_0,
            [NM_TYPE_Q4_1] = dotq_q4_1,
            [NM_TYPE_Q5_0] = dotq_q5_0,
            [NM_TYPE_Q5_1] = dotq_q5_1,
            [NM_TYPE_Q8_0] = dotq_q8_0,
            [NM_TYPE_Q8_1] = dotq_q8_1,
            [NM_TYPE_MXFP4] = dotq_mxfp4,
            [NM_TYPE_Q8_K] = dotq_q8_K,
        },
    .gemmq =
        {
            [NM_TYPE_Q4_0] = gemmq_q4_0,
            [NM_TYPE_Q4_1] = gemmq_q4_1,
            [NM_TYPE_Q5_0] = gemmq_q5_0,
            [NM_TYPE_Q5_1] = gemmq_q5_1,
            [NM_TYPE_Q8_0] = gemmq_q8_0,
            [NM_TYPE_MXFP4] = gemmq_mxfp4,
        },
};

#endif
