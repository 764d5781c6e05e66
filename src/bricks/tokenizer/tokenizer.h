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
#include "bricks/tokenizer/chat.h"
#include "gguf/gguf.h"

typedef struct nm_tokenizer nm_tokenizer;

// On failure *out is NULL and err names the problem (missing key, bad vocab...).
nm_status nm_tokenizer_create(const nm_gguf *g, nm_tokenizer **out, char *err, size_t err_size);
void nm_tokenizer_free(nm_tokenizer *t); // NULL is a no-op

int32_t nm_tokenizer_n_vocab(const nm_tokenizer *t);
int32_t nm_tokenizer_bos(const nm_tokenizer *t); // -1 if none
bool nm_tokenizer_add_bos(const nm_tokenizer *t); // whether encoding with add_special puts BOS first
int32_t nm_tokenizer_eos(const nm_tokenizer *t);
bool nm_tokenizer_is_eog(const nm_tokenizer *t, int32_t tok);

// Same contract as nm_tokenize() in nanomind.h. Thread-safe on a shared
// tokenizer: each call allocates its own scratch (sized from len) and frees it.
// Matches llama.cpp's llama_tokenize(): with parse_special, control tokens are
// found in the text (longest first); user-defined tokens are always found.
// Invalid UTF-8 reaching the BPE model is read as U+FFFD, one per bad byte.
int32_t nm_tokenizer_encode(const nm_tokenizer *t, const char *text, size_t len, int32_t *out,
                            int32_t n_max, bool add_special, bool parse_special);
// Same contract as nm_token_to_piece() in nanomind.h.
int32_t nm_tokenizer_piece(const nm_tokenizer *t, int32_t tok, char *buf, int32_t size, bool special);

// Pieces of toks[0..n) concatenated into buf; returns the byte count or
// -(needed) if size is too small (buf then holds a prefix).
int32_t nm_tokenizer_decode(const nm_tokenizer *t, const int32_t *toks, int32_t n, char *buf,
                            int32_t size, bool special);
// Core of nm_detok_push() (same contract): appends the text of `tok` (control
// tokens give nothing) after the bytes held in d, holds back a trailing
// incomplete UTF-8 sequence (at most 3 bytes) for the next call. On -(needed)
// d is unchanged, so the call can be retried with a bigger buffer. Start with
// a zeroed nm_detok. Bytes still held when the stream ends are an incomplete
// sequence; callers that want them read d->pending[0..d->n_pending).
int32_t nm_tokenizer_detok_push(const nm_tokenizer *t, nm_detok *d, int32_t tok, char *out,
                                int32_t size);

// Id of the token whose text is text[0..len) exactly, or -1.
int32_t nm_tokenizer_find(const nm_tokenizer *t, const char *text, size_t len);
// Raw vocab text of a token (in the GGUF mapping; empty if out of range).
nm_str nm_tokenizer_text(const nm_tokenizer *t, int32_t tok);

// The raw chat template string from the metadata (may be empty).
nm_str nm_tokenizer_chat_template(const nm_tokenizer *t);
// The model's chat template family: recognised from tokenizer.chat_template,
// else from the turn-marker tokens in the vocab (the Gemma 3 270M GGUF ships
// without a template); NM_CHAT_UNKNOWN if neither tells.
nm_chat_tmpl nm_tokenizer_chat_tmpl(const nm_tokenizer *t);

#endif
