// A chat answer's thinking kept out of its content, as llama-server's --reasoning-format deepseek does:
// an answer that opens with <think> (whitespace before it allowed) has the text up to </think> as its
// reasoning_content (leading and trailing whitespace dropped), the rest as content (its leading whitespace
// dropped); an answer that does not open with <think> is all content, as it came; a <think> never closed
// is reasoning to the end (Qwen3, SmolLM3, DeepSeek-R1 and QwQ write these tags).
//
// Fed piece by piece (a streamed answer's tokens): a tag split over pieces, and whitespace that may still
// turn out to lead or trail, are held back until they are whole or cannot be, so what comes out in pieces
// joins to what the whole answer split at once gives (test_serve_req `think_split_as_whole`).
#ifndef NM_SERVER_THINK_H
#define NM_SERVER_THINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// Receives n >= 1 bytes of reasoning (reasoning) or of content, borrowed for the call.
typedef void (*serve_think_fn)(void *user, bool reasoning, const char *p, size_t n);

typedef struct serve_think {
    int state;    // (think.c: before the answer's first text, reasoning, content after </think>, content)
    bool begun;   // the reasoning's first text went out (its leading whitespace is dropped before it)
    char held[256];
    size_t n_held; // bytes held back: a tag's beginning, or whitespace
    serve_think_fn out;
    void *user;
} serve_think;

void serve_think_init(serve_think *t, serve_think_fn out, void *user);
// The answer's next n bytes (end: it is over, what is held goes out as it must).
void serve_think_feed(serve_think *t, const char *p, size_t n, bool end);

#endif
