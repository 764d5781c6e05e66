// LLM brick: decoder-only transformers from GGUF (archs llama, qwen2, qwen2vl, qwen3, smollm3, gemma3, lfm2).
// The model holds hyperparameters and views of the mmapped weights; a context
// (forward.c) holds the KV cache, the activations and the backend that runs it.
#ifndef NM_LLM_H
#define NM_LLM_H

#include <stdint.h>
#include <stdbool.h>

#include "nanomind.h"
#include "backend/backend.h"
#include "gguf/gguf.h"
#include "bricks/tokenizer/tokenizer.h"
#include "bricks/tokenizer/chat.h"

enum nm_arch { NM_ARCH_LLAMA, NM_ARCH_QWEN2, NM_ARCH_GEMMA3, NM_ARCH_QWEN2VL, NM_ARCH_QWEN3, NM_ARCH_SMOLLM3,
               NM_ARCH_LFM2 };

typedef struct nm_hparams {
    enum nm_arch arch;
    int32_t n_vocab, n_embd, n_layer, n_ff, n_ctx_train;
    int32_t n_head, n_head_kv, head_dim; // head_dim = key_length = value_length
    int32_t n_rot;                       // rotated dims per head
    int32_t rope_mode;                   // NM_ROPE_NORM, NM_ROPE_NEOX or NM_ROPE_MROPE (qwen2vl)
    int32_t rope_sections[4];            // NM_ROPE_MROPE: rotated pairs of the t, h, w (and e) position streams
    float rope_base, rope_base_swa, rope_freq_scale;
    float norm_eps;
    float attn_scale;                    // applied to q.k
    float attn_softcap, final_softcap;   // 0 = off
    float embd_scale;                    // token embeddings are multiplied by it (gemma: sqrt(n_embd))
    int32_t n_swa;                       // sliding window, 0 = none
    int32_t swa_pattern;                 // layer il uses the window if il % pattern < pattern - 1
    int32_t act;                         // NM_ACT_*
    int32_t no_rope_step;                // > 0: layer il rotates nothing where (il + 1) % step == 0 (smollm3: 4)
    int32_t conv_l;                      // lfm2: taps of the short convolutions (shortconv.l_cache); 0: none
    int32_t n_conv;                      // layers that are short convolutions (the rest attend)
} nm_hparams;

typedef struct nm_layer {
    nm_tensor attn_norm;                 // (n_embd)
    nm_tensor wq, wk, wv, wo;            // (n_embd -> n_head*hd), (-> n_head_kv*hd) x2, (n_head*hd -> n_embd)
    nm_tensor bq, bk, bv;                // qwen2 biases; unset (nm_tensor_is_set) if absent
    nm_tensor q_norm, k_norm;            // gemma3's and qwen3's per-head RMS norms (head_dim); unset if absent
    nm_tensor post_attn_norm;            // gemma3 (n_embd); unset if absent
    nm_tensor ffn_norm;                  // (n_embd)
    nm_tensor ffn_gate, ffn_up;          // (n_embd -> n_ff)
    nm_tensor ffn_down;                  // (n_ff -> n_embd)
    nm_tensor post_ffn_norm;             // gemma3 (n_embd); unset if absent
    bool swa;                            // this layer attends within the sliding window
    bool no_rope;                        // its q and k are not rotated (smollm3's every fourth layer)
    // lfm2's short-convolution layers (conv set: no attention tensors): in_proj (n_embd -> 3 n_embd: b, c, x),
    // the depthwise taps (conv_l x n_embd, f32), out_proj (n_embd -> n_embd)
    bool conv;
    int32_t kv_index;                    // attention layers: its cache's index (conv layers have none)
    nm_tensor conv_in, conv_w, conv_out;
} nm_layer;

struct nm_model {
    nm_gguf *gguf;                       // owns the mapping all tensors point into
    nm_tokenizer *tok;
    nm_hparams hp;
    char arch_name[32];
    nm_tensor tok_embd;                  // (n_vocab, n_embd)
    nm_tensor output_norm;               // (n_embd)
    nm_tensor output;                    // (n_vocab, n_embd); = tok_embd when tied
    nm_layer *layers;                    // (n_layer)
    nm_chat_tmpl chat;                   // recognised template, NM_CHAT_UNKNOWN if none
    int32_t n_threads;
    uint64_t weight_bytes;               // bytes of all tensors (mmapped)
    const uint8_t *wbase, *wend;         // the host range holding every tensor (what a backend imports)
};

// Bytes of the context's own buffers: activations and the KV cache.
uint64_t nm_ctx_buffer_bytes(const nm_ctx *c);
// The brick's estimate (nm_brick_i.estimate) of model m decoding into c.
void nm_llm_estimate_model(const nm_model *m, const nm_ctx *c, const nm_brick_input *in, nm_brick_cost *out);
// nm_brick_i.estimate of the LLM brick (brick.c's state).
nm_status nm_llm_estimate(void *state, const nm_brick_input *in, nm_brick_cost *out);

#endif
