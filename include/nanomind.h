// nanomind: on-device inference runtime for multimodal models. Public C API.
//
// Conventions
// - Handles are opaque. Every *_create/*_load has a *_free; free(NULL) is a no-op.
// - Fallible calls return nm_status (negative = error). Details of the last
//   error live on the handle (nm_*_last_error) or, for calls that create a
//   handle, in the caller's `err` buffer.
// - Threading: a handle is used by one thread at a time unless said otherwise.
//   A loaded nm_model is read-only and may be shared by several contexts.
#ifndef NANOMIND_H
#define NANOMIND_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NM_VERSION_STRING "0.1.0"

typedef enum nm_status {
    NM_OK = 0,
    NM_ERR_INVALID_ARG = -1, // a caller passed something meaningless
    NM_ERR_IO = -2,          // open/read/mmap failed
    NM_ERR_FORMAT = -3,      // the file or input is corrupt or malformed
    NM_ERR_UNSUPPORTED = -4, // well-formed but not something we run (yet)
    NM_ERR_NOMEM = -5,
    NM_ERR_RANGE = -6,       // a size, position or count out of range (e.g. context full)
    NM_ERR_TEMPLATE = -7,    // unknown chat template
} nm_status;

// Static string naming the status; never NULL.
const char *nm_status_str(nm_status s);

// ---- model -------------------------------------------------------------------
typedef struct nm_model nm_model;

typedef struct nm_model_params {
    int32_t n_threads; // default threads of the contexts made from it (each has its own pool); <= 0: all cores
} nm_model_params;

nm_model_params nm_model_default_params(void);

// Loads a GGUF language model (archs: llama, qwen2, gemma3). Weights stay
// mmapped read-only from the file and are never copied. On failure *out is
// NULL and `err` (may be NULL) receives a message naming the problem.
nm_status nm_model_load(const char *path, const nm_model_params *params, nm_model **out,
                        char *err, size_t err_size);
void nm_model_free(nm_model *m); // all contexts made from it must be freed first

const char *nm_model_arch(const nm_model *m); // borrowed, lives as long as m
int32_t nm_model_n_vocab(const nm_model *m);
int32_t nm_model_n_embd(const nm_model *m);
int32_t nm_model_n_layer(const nm_model *m);
int32_t nm_model_n_ctx_train(const nm_model *m);
// Human-readable one-line description ("llama 30L d576 q4_1 ...") into buf.
void nm_model_desc(const nm_model *m, char *buf, size_t size);
// Bytes of weights one decode step reads: every matmul weight once, the
// output head, one row of the token embeddings (all of them when the output
// head is tied to them, since the head reads the whole table).
uint64_t nm_model_decode_weight_bytes(const nm_model *m);
// Bytes of KV cache one decode step reads per cached position (all layers, K and V).
uint64_t nm_model_kv_bytes_per_pos(const nm_model *m);

// ---- tokenizer (owned by the model) ----------------------------------------------
// Tokenizes `text[0..len)`. add_special: prepend BOS / append EOS as the model's
// metadata says. parse_special: text like "<|im_start|>" becomes its special
// token instead of being split as plain text.
// Returns the number of tokens; if more than n_max are needed returns
// -(number needed) and writes nothing meaningful.
int32_t nm_tokenize(const nm_model *m, const char *text, size_t len, int32_t *out, int32_t n_max,
                    bool add_special, bool parse_special);
// Bytes of token `tok` into buf (not NUL-terminated); returns the byte count, or
// -(needed) if size is too small. Control tokens give 0 bytes unless `special`.
int32_t nm_token_to_piece(const nm_model *m, int32_t tok, char *buf, int32_t size, bool special);
int32_t nm_token_bos(const nm_model *m); // -1 if none
int32_t nm_token_eos(const nm_model *m); // -1 if none
bool nm_token_is_eog(const nm_model *m, int32_t tok); // end of generation (EOS, EOT, ...)

// Streaming detokenizer: turns a token stream into valid UTF-8, holding back a
// multi-byte sequence that is split between tokens until it is complete.
typedef struct nm_detok {
    char pending[8];
    int32_t n_pending;
} nm_detok;
// Appends the text of `tok` to out (size bytes); returns bytes written (may be
// 0 while a UTF-8 sequence is incomplete), or -(needed).
int32_t nm_detok_push(const nm_model *m, nm_detok *d, int32_t tok, char *out, int32_t size);

// ---- chat templates ------------------------------------------------------------
typedef struct nm_chat_msg {
    const char *role;    // "system", "user", "assistant"
    const char *content;
} nm_chat_msg;

// Formats a conversation with the model's chat template (recognised from
// tokenizer.chat_template) or, if tmpl_name is non-NULL, with the named one
// ("chatml", "gemma", "llama3", ...). add_assistant: end with the prompt for the
// assistant's turn. Returns the length written (NUL-terminated), -(needed) if
// buf is too small, or NM_ERR_TEMPLATE if the template is not recognised.
int32_t nm_chat_format(const nm_model *m, const char *tmpl_name, const nm_chat_msg *msgs,
                       size_t n_msgs, bool add_assistant, char *buf, int32_t size);
// Comma-separated list of the template names nm_chat_format accepts.
const char *nm_chat_template_names(void);
// Whether `name` is one of them.
bool nm_chat_template_known(const char *name);

// ---- context (KV cache + run state) ------------------------------------------------
typedef struct nm_ctx nm_ctx;

typedef struct nm_ctx_params {
    int32_t n_ctx;     // positions in the KV cache; <= 0: min(train context, 4096)
    int32_t n_batch;   // max tokens per nm_decode call; <= 0: 512
    int32_t n_threads; // <= 0: the model's
} nm_ctx_params;

nm_ctx_params nm_ctx_default_params(void);

// Creates a context; all memory for a forward pass (KV cache, activations,
// logits) is allocated here, none per token. `m` is borrowed and must outlive it.
nm_status nm_ctx_create(nm_model *m, const nm_ctx_params *params, nm_ctx **out,
                        char *err, size_t err_size);
void nm_ctx_free(nm_ctx *c);
int32_t nm_ctx_n_ctx(const nm_ctx *c);

// Runs the decoder on tokens[0..n) at positions pos..pos+n-1 (n <= n_batch,
// pos+n <= n_ctx). Cache entries at positions >= pos are overwritten.
// all_logits: keep the logits of every token; else only the last.
nm_status nm_decode(nm_ctx *c, const int32_t *tokens, int32_t n, int32_t pos, bool all_logits);
// Same with input embeddings (n rows of n_embd floats, borrowed for the call)
// instead of token ids: the vision brick feeds the decoder through this.
nm_status nm_decode_embd(nm_ctx *c, const float *embd, int32_t n, int32_t pos, bool all_logits);
// Logits (n_vocab floats) of token i of the last batch; i = -1: the last token.
// Borrowed until the next decode. NULL if i was not kept.
const float *nm_get_logits(const nm_ctx *c, int32_t i);
const char *nm_ctx_last_error(const nm_ctx *c); // "" if none

// ---- sampler ----------------------------------------------------------------------
typedef struct nm_sampler nm_sampler;

typedef struct nm_sampler_params {
    float temp;           // <= 0: greedy
    int32_t top_k;        // <= 0: off
    float top_p;          // >= 1: off
    float min_p;          // <= 0: off
    float repeat_penalty; // 1: off
    int32_t repeat_last_n;
    uint64_t seed;
} nm_sampler_params;

nm_sampler_params nm_sampler_default_params(void);
// NULL on OOM. Allocates its scratch once for n_vocab.
nm_sampler *nm_sampler_create(const nm_sampler_params *p, int32_t n_vocab);
void nm_sampler_free(nm_sampler *s);
// Picks a token from logits (n_vocab floats, not modified). Deterministic for a seed.
int32_t nm_sampler_sample(nm_sampler *s, const float *logits);
// Records a token in the repetition history (prompt and sampled tokens).
void nm_sampler_accept(nm_sampler *s, int32_t tok);
void nm_sampler_reset(nm_sampler *s);

#ifdef __cplusplus
}
#endif
#endif
