// A chat answer's thinking kept out of its content, as llama-server's --reasoning-format deepseek does:
// an answer that opens with <think> (whitespace before it allowed) has the text up to </think> as its
// reasoning_content (leading and trailing whitespace dropped), the rest as content (its leading whitespace
// dropped); an answer that does not open with <think> is all content, as it came; a <think> never closed
// is reasoning to the end (Qwen3, SmolLM3, DeepSeek-R1 and QwQ write these tags).
//
// Fed piece by piece (a streamed answer's tokens): a tag split over pieces, and whitespace that may still
// turn out to lead or trail, are held back until they are whole or cannot be, so what comes out in pieces
// joins to what the whole answer split at once gives (test_tabm_llm_brick `think_split_as_whole`).
//
// The server splits a chat's answer so (reasoning_content, content); the LLM brick's sentences for a voice
// (NM_LLM_OUT_SENTENCES) keep the content only: the reasoning is not spoken.
#ifndef NM_LLM_THINK_H
#define NM_LLM_THINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// The most bytes one call of an nm_think_fn receives (what was held back and a piece fed after it).
#define NM_THINK_RUN_MAX 512

// Receives n >= 1 bytes (at most NM_THINK_RUN_MAX) of reasoning (reasoning) or of content, borrowed for the call.
typedef void (*nm_think_fn)(void *user, bool reasoning, const char *p, size_t n);

typedef struct nm_think {
    int state;    // (think.c: before the answer's first text, reasoning, content after </think>, content)
    bool begun;   // the reasoning's first text went out (its leading whitespace is dropped before it)
    char held[256];
    size_t n_held; // bytes held back: a tag's beginning, or whitespace
} nm_think;

// A new answer's split (a zeroed nm_think is one too).
void nm_think_init(nm_think *t);
// The answer's next n bytes (end: it is over, what is held goes out as it must), out to `out`.
void nm_think_feed(nm_think *t, const char *p, size_t n, bool end, nm_think_fn out, void *user);

#endif
