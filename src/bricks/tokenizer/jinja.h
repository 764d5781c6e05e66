// A Jinja2 subset interpreter for chat templates (tokenizer.chat_template):
// renders a template the way Hugging Face's apply_chat_template sets Jinja2 up
// (trim_blocks, lstrip_blocks, loop controls; raise_exception and
// strftime_now; tojson as json.dumps(ensure_ascii=False)). The subset is
// listed in docs/jinja.md. Bounded: every limit below is an error, never a
// hang, a crash or unbounded memory.
#ifndef NM_JINJA_H
#define NM_JINJA_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "nanomind.h"

typedef struct nm_jinja_limits {
    size_t max_src;    // template bytes
    size_t max_mem;    // working memory: syntax tree, values, intermediate strings
    size_t max_out;    // output bytes
    int64_t max_steps; // statements and expressions evaluated (a runaway loop)
    int32_t max_depth; // nesting of blocks, expressions and values
} nm_jinja_limits;

// 1 MiB of template, 64 MiB of memory, 16 MiB of output, 5M steps, depth 64.
nm_jinja_limits nm_jinja_default_limits(void);

// Renders `src` (len bytes) with the members of the cJSON object `ctx` as its
// variables (objects become mappings, arrays lists; both borrowed for the
// call). lim: NULL for the defaults. On NM_OK *out is the caller's to free,
// NUL-terminated, *out_len bytes (out_len may be NULL). On an error *out is
// NULL and err (may be NULL) says what, as "line L, column C: what" where the
// template has a place for it:
//   NM_ERR_UNSUPPORTED  a syntax error, or a construct outside the subset (an
//                       unknown statement, filter, test, function or method):
//                       the caller's cue to fall back to a built-in formatter
//   NM_ERR_TEMPLATE     the template raised (raise_exception) or failed on
//                       this input (a type error, an undefined value used)
//   NM_ERR_RANGE        a limit of `lim` passed
//   NM_ERR_NOMEM, NM_ERR_INVALID_ARG
// Thread-safe: no state outside the call.
nm_status nm_jinja_render(const char *src, size_t len, const cJSON *ctx, const nm_jinja_limits *lim, char **out,
                          size_t *out_len, char *err, size_t err_size);

#endif
