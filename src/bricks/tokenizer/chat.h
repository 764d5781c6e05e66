// Chat templates: recognised from the Jinja source in tokenizer.chat_template
// (no Jinja engine: each known family is formatted by hand, exactly as its
// template renders), or named explicitly.
#ifndef NM_CHAT_H
#define NM_CHAT_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "nanomind.h"

typedef enum nm_chat_tmpl {
    NM_CHAT_UNKNOWN = 0,
    NM_CHAT_CHATML,  // <|im_start|>role\n...<|im_end|>\n  (SmolLM2, Qwen2)
    NM_CHAT_GEMMA,   // <start_of_turn>user\n...<end_of_turn>\n (system folded into first user turn)
    NM_CHAT_LLAMA3,  // <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>
    NM_CHAT_COUNT
} nm_chat_tmpl;

// Recognises a template from its Jinja source; NM_CHAT_UNKNOWN if none fits.
nm_chat_tmpl nm_chat_detect(const char *src, size_t len);
// By name ("chatml", "gemma", "llama3"); NM_CHAT_UNKNOWN if unknown.
nm_chat_tmpl nm_chat_from_name(const char *name);
const char *nm_chat_name(nm_chat_tmpl t);
// `default_system`: a system prompt the template inserts when the conversation
// has none (SmolLM2's template does), or NULL.
// `bos_text`: the templates that begin with {{ bos_token }} (gemma, llama3)
// start with this text; pass NULL when the prompt will be tokenized with
// add_special (the tokenizer adds BOS itself, as llama.cpp's built-in
// formatters assume), the BOS token's text ("<bos>") to render the template
// verbatim. chatml ignores it.
// Message roles and contents are borrowed for the call; NULL reads as "".
// Returns the length written (NUL-terminated) or -(needed) if size is too
// small (buf then holds a NUL-terminated prefix); NM_ERR_TEMPLATE for
// NM_CHAT_UNKNOWN.
int32_t nm_chat_apply(nm_chat_tmpl t, const char *default_system, const nm_chat_msg *msgs,
                      size_t n, bool add_assistant, const char *bos_text, char *buf, int32_t size);
// The default system prompt a chatml template inserts, taken from the
// template's Jinja source (a literal '<|im_start|>system\n...<|im_end|>'
// string, as in SmolLM2's and Qwen2.5's templates). Writes it NUL-terminated;
// returns its length, 0 if the template has none, -(needed) if size is too small.
int32_t nm_chat_default_system(const char *src, size_t len, char *buf, int32_t size);

#endif
