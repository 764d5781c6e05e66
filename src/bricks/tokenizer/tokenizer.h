// Tokenizer built from GGUF metadata (tokenizer.ggml.*).
//   model "gpt2":  byte-level BPE with the pre-tokenizer regex of
//                  tokenizer.ggml.pre (PCRE2, Unicode): SmolLM2, Qwen2.
//   model "llama": SentencePiece-style BPE over scores, byte fallback <0xXX>,
//                  U+2581 for spaces: Gemma.
// Vocabulary strings point into the GGUF mapping: the nm_gguf must outlive
// the tokenizer.
#ifndef NM_TOKENIZER_H
#define NM_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "nanomind.h"
#include "gguf/gguf.h"

typedef struct nm_tokenizer nm_tokenizer;

// On failure *out is NULL and err names the problem (missing key, bad vocab...).
nm_status nm_tokenizer_create(const nm_gguf *g, nm_tokenizer **out, char *err, size_t err_size);
void nm_tokenizer_free(nm_tokenizer *t); // NULL is a no-op

int32_t nm_tokenizer_n_vocab(const nm_tokenizer *t);
int32_t nm_tokenizer_bos(const nm_tokenizer *t); // -1 if none
int32_t nm_tokenizer_eos(const nm_tokenizer *t);
bool nm_tokenizer_is_eog(const nm_tokenizer *t, int32_t tok);

// Same contract as nm_tokenize() in nanomind.h.
int32_t nm_tokenizer_encode(const nm_tokenizer *t, const char *text, size_t len, int32_t *out,
                            int32_t n_max, bool add_special, bool parse_special);
// Same contract as nm_token_to_piece() in nanomind.h.
int32_t nm_tokenizer_piece(const nm_tokenizer *t, int32_t tok, char *buf, int32_t size, bool special);

// The raw chat template string from the metadata (may be empty).
nm_str nm_tokenizer_chat_template(const nm_tokenizer *t);

#endif
