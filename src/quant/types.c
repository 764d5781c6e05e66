// Type traits: names, block sizes and bytes per block, as ggml defines them.
#include "quant/kernels_impl.h"

static const nm_type_traits traits[NM_TYPE_COUNT] = {
    [NM_TYPE_F32] = {"f32", 1, sizeof(float), true},
    [NM_TYPE_F16] = {"f16", 1, sizeof(uint16_t), true},
    [NM_TYPE_Q4_0] = {"q4_0", NM_QK, sizeof(nm_block_q4_0), true},
    [NM_TYPE_Q4_1] = {"q4_1", NM_QK, sizeof(nm_block_q4_1), true},
    [NM_TYPE_Q5_0] = {"q5_0", NM_QK, sizeof(nm_block_q5_0), true},
    [NM_TYPE_Q5_1] = {"q5_1", NM_QK, sizeof(nm_block_q5_1), true},
    [NM_TYPE_Q8_0] = {"q8_0", NM_QK, sizeof(nm_block_q8_0), true},
    [NM_TYPE_Q8_1] = {"q8_1", NM_QK, sizeof(nm_block_q8_1), true},
    [NM_TYPE_Q2_K] = {"q2_K", NM_QK_K, sizeof(nm_block_q2_K), true},
    [NM_TYPE_Q3_K] = {"q3_K", NM_QK_K, sizeof(nm_block_q3_K), true},
    [NM_TYPE_Q4_K] = {"q4_K", NM_QK_K, sizeof(nm_block_q4_K), true},
    [NM_TYPE_Q5_K] = {"q5_K", NM_QK_K, sizeof(nm_block_q5_K), true},
    [NM_TYPE_Q6_K] = {"q6_K", NM_QK_K, sizeof(nm_block_q6_K), true},
    [NM_TYPE_Q8_K] = {"q8_K", NM_QK_K, sizeof(nm_block_q8_K), true},
    [NM_TYPE_BF16] = {"bf16", 1, sizeof(uint16_t), true},
    [NM_TYPE_MXFP4] = {"mxfp4", NM_QK, sizeof(nm_block_mxfp4), true},
    // ids and positions of ops: sized like any tensor, never a weight (no kernels)
    [NM_TYPE_I32] = {"i32", 1, sizeof(int32_t), false},
};

const nm_type_traits *nm_type_traits_get(uint32_t type) {
    if (type >= NM_TYPE_COUNT || !traits[type].name) return NULL;
    return &traits[type];
}

size_t nm_row_size(uint32_t type, int64_t n) {
    const nm_type_traits *t = nm_type_traits_get(type);
    if (!t || n < 0 || n % t->blck_size != 0) return 0;
    uint64_t blocks = (uint64_t)(n / t->blck_size);
    if (blocks > SIZE_MAX / t->type_size) return 0; // would overflow size_t
    return (size_t)blocks * t->type_size;
}
