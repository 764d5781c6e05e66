// Random-weight GGUF language models for tests and cross-checks.
#ifndef NM_GENMODEL_H
#define NM_GENMODEL_H

#include <stdint.h>

typedef struct gen_opts {
    const char *arch;     // "llama", "qwen2", "qwen2vl", "qwen3", "smollm3", "gemma3", "lfm2"
    const char *tok_from; // GGUF file whose tokenizer.* metadata is copied
    const char *out;      // output path
    uint32_t type;        // weight type of the matmuls and embeddings (enum nm_type)
    int layers, embd, heads, kv_heads, ff, head_dim, swa;
    float final_softcap;  // > 0: ARCH.final_logit_softcapping (llama.cpp applies it for gemma3)
    uint64_t seed;
    int64_t vocab;        // > the tokenizer's: its tokens padded with control tokens "<|nm_pad_N|>" to this many
                          // (a model's output head of its real size; 0: the tokenizer's own)
    const char *user_tokens;  // comma-separated tokens added to the vocabulary as user-defined ("<think>,</think>")
    const char *script;       // f32: a model whose greedy answer to a prompt ending in script_after's last token
    const char *script_after; // ("\n" where NULL) is this text (its special tokens parsed), then end of generation
    // Files no model can have, for the loader's tests (0: the normal values).
    float rope_base;      // ARCH.rope.freq_base (0: 1e6 for qwen2 / qwen2vl, else 1e4)
    float bad_rope_base;  // written as ARCH.rope.freq_base
    int bad_mrope;        // qwen2vl: 1 no rope.dimension_sections, 2 sections past the head's pairs
    float bad_norm_eps;   // written as ARCH.attention.layer_norm_rms_epsilon
    int bad_block_count;  // written as ARCH.block_count (the tensors stay those of `layers`)
    int64_t bad_bos_id;   // written as tokenizer.ggml.bos_token_id
    int bad_heads;        // written as ARCH.attention.head_count, and no key_length
    const char *bad_3d;   // this tensor written with a third dimension of 1
    const char *attn_layers; // lfm2: comma-separated layers that attend (the others: short convolutions);
                             // NULL: every third (2, 5, 8, ..)
    int conv_l;           // lfm2: the short convolutions' taps (shortconv.l_cache; 0: 3)
} gen_opts;

gen_opts nm_genmodel_defaults(void);
// Writes the model; 0 on success, else a message was printed to stderr.
int nm_genmodel_write(gen_opts *o);

// Rewrites GGUF `in` as `out` with every tensor of 2+ dims converted to type
// `to` (dequantize, then reference-quantize); 1-D tensors and all metadata
// (but general.file_type) copied. 0 on success, else a message on stderr.
int nm_requant_write(const char *in, const char *out, uint32_t to);

#endif
