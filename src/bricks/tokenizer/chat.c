// Chat templates, formatted by hand exactly as the Jinja templates shipped
// with the models render them (llama.cpp renders the same templates with
// --jinja; its built-in formatters are the fallback reference):
//   chatml  SmolLM2-Instruct / Qwen2:
//           {% for m %}<|im_start|>{{role}}\n{{content}}<|im_end|>\n{% endfor %}
//           [<|im_start|>assistant\n]
//           SmolLM2 and Qwen2.5 insert a default system turn when the first
//           message is not a system one (nm_chat_default_system finds it).
//   gemma   Gemma 3: {{bos}}; a leading system message becomes a prefix
//           (content + "\n\n") of the first remaining turn; role assistant ->
//           model; <start_of_turn>{{role}}\n{{content|trim}}<end_of_turn>\n
//           [<start_of_turn>model\n]
//   llama3  Llama 3 Instruct: {{bos}} then per message
//           <|start_header_id|>{{role}}<|end_header_id|>\n\n{{content|trim}}<|eot_id|>
//           [<|start_header_id|>assistant<|end_header_id|>\n\n]
#include <string.h>

#include "bricks/tokenizer/chat.h"

static const char *const NAMES[NM_CHAT_COUNT] = {"unknown", "chatml", "gemma", "llama3"};

static bool has(const char *src, size_t len, const char *needle) {
    return src && memmem(src, len, needle, strlen(needle)) != NULL;
}

nm_chat_tmpl nm_chat_detect(const char *src, size_t len) {
    if (!src || !len) return NM_CHAT_UNKNOWN;
    if (has(src, len, "<|im_start|>")) return NM_CHAT_CHATML;
    if (has(src, len, "<start_of_turn>")) return NM_CHAT_GEMMA;
    if (has(src, len, "<|start_header_id|>")) return NM_CHAT_LLAMA3;
    return NM_CHAT_UNKNOWN;
}

nm_chat_tmpl nm_chat_from_name(const char *name) {
    if (!name) return NM_CHAT_UNKNOWN;
    for (int i = 1; i < NM_CHAT_COUNT; i++)
        if (!strcmp(name, NAMES[i])) return (nm_chat_tmpl)i;
    if (!strcmp(name, "gemma3")) return NM_CHAT_GEMMA;
    if (!strcmp(name, "llama-3")) return NM_CHAT_LLAMA3;
    return NM_CHAT_UNKNOWN;
}

const char *nm_chat_name(nm_chat_tmpl t) {
    return (unsigned)t < NM_CHAT_COUNT ? NAMES[t] : NAMES[0];
}

// ---- output ----------------------------------------------------------------------------

typedef struct sink {
    char *buf;
    int64_t size; // capacity including the NUL
    int64_t n;    // bytes produced so far (may exceed size)
} sink;

static void put_n(sink *s, const char *p, size_t n) {
    if (s->n + (int64_t)n < s->size) {
        memcpy(s->buf + s->n, p, n);
    } else if (s->n < s->size - 1) {
        memcpy(s->buf + s->n, p, (size_t)(s->size - 1 - s->n)); // keep a usable prefix
    }
    s->n += (int64_t)n;
}

static void put(sink *s, const char *p) { put_n(s, p, strlen(p)); }

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// Jinja's |trim (ASCII whitespace).
static void put_trim(sink *s, const char *p) {
    size_t n = strlen(p), a = 0;
    while (a < n && is_ws(p[a])) a++;
    while (n > a && is_ws(p[n - 1])) n--;
    put_n(s, p + a, n - a);
}

static const char *nz(const char *p) { return p ? p : ""; }

static bool is_role(const nm_chat_msg *m, const char *role) { return m->role && !strcmp(m->role, role); }

int32_t nm_chat_apply(nm_chat_tmpl t, const char *default_system, const nm_chat_msg *msgs,
                      size_t n, bool add_assistant, const char *bos_text, char *buf, int32_t size) {
    if (t <= NM_CHAT_UNKNOWN || t >= NM_CHAT_COUNT) return NM_ERR_TEMPLATE;
    if ((!msgs && n) || size < 0 || (!buf && size > 0)) return NM_ERR_INVALID_ARG;
    sink s = {buf, size, 0};
    // The default system turn goes first when the conversation has its own none.
    nm_chat_msg dflt = {"system", default_system};
    bool use_dflt = default_system && n > 0 && !is_role(&msgs[0], "system");
    size_t total = n + (use_dflt ? 1 : 0);
#define MSG(i) (use_dflt ? ((i) == 0 ? &dflt : &msgs[(i) - 1]) : &msgs[(i)])

    switch (t) {
    case NM_CHAT_CHATML:
        for (size_t i = 0; i < total; i++) {
            put(&s, "<|im_start|>");
            put(&s, nz(MSG(i)->role));
            put(&s, "\n");
            put(&s, nz(MSG(i)->content));
            put(&s, "<|im_end|>\n");
        }
        if (add_assistant) put(&s, "<|im_start|>assistant\n");
        break;
    case NM_CHAT_GEMMA: {
        if (bos_text) put(&s, bos_text);
        size_t first = 0;
        const char *prefix = NULL;
        if (total > 0 && is_role(MSG(0), "system")) {
            prefix = nz(MSG(0)->content);
            first = 1;
        }
        for (size_t i = first; i < total; i++) {
            const nm_chat_msg *m = MSG(i);
            put(&s, "<start_of_turn>");
            put(&s, is_role(m, "assistant") ? "model" : nz(m->role));
            put(&s, "\n");
            if (prefix && i == first) {
                put(&s, prefix); // not trimmed: the template concatenates it as is
                put(&s, "\n\n");
            }
            put_trim(&s, nz(m->content));
            put(&s, "<end_of_turn>\n");
        }
        if (add_assistant) put(&s, "<start_of_turn>model\n");
        break;
    }
    case NM_CHAT_LLAMA3:
        if (bos_text) put(&s, bos_text);
        for (size_t i = 0; i < total; i++) {
            put(&s, "<|start_header_id|>");
            put(&s, nz(MSG(i)->role));
            put(&s, "<|end_header_id|>\n\n");
            put_trim(&s, nz(MSG(i)->content));
            put(&s, "<|eot_id|>");
        }
        if (add_assistant) put(&s, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    default:
        return NM_ERR_TEMPLATE;
    }
#undef MSG
    if (s.n + 1 > INT32_MAX) return NM_ERR_RANGE;
    if (s.n + 1 > size) {
        if (size > 0) buf[size - 1] = 0;
        return -(int32_t)(s.n + 1);
    }
    buf[s.n] = 0;
    return (int32_t)s.n;
}

// ---- default system prompt -------------------------------------------------------------

int32_t nm_chat_default_system(const char *src, size_t len, char *buf, int32_t size) {
    static const char open[] = "<|im_start|>system";
    static const char close[] = "<|im_end|>";
    if (!src || size < 0 || (!buf && size > 0)) return 0;
    const char *end = src + len;
    for (const char *p = src; (p = memmem(p, (size_t)(end - p), open, sizeof(open) - 1));
         p += sizeof(open) - 1) {
        // It must sit at the start of a string literal: '<|im_start|>system\n...'
        if (p == src || (p[-1] != '\'' && p[-1] != '"')) continue;
        char quote = p[-1];
        const char *q = p + sizeof(open) - 1;
        if (q < end && *q == '\n') {
            q++;
        } else if (q + 1 < end && q[0] == '\\' && q[1] == 'n') {
            q += 2;
        } else {
            continue;
        }
        const char *e = memmem(q, (size_t)(end - q), close, sizeof(close) - 1);
        if (!e) break;
        // The literal must run unbroken up to <|im_end|>: a quote in between
        // means the content is an expression (messages[0]['content']).
        if (memchr(q, quote, (size_t)(e - q)) || e == q) continue;
        sink s = {buf, size, 0};
        for (const char *c = q; c < e; c++) {
            if (*c == '\\' && c + 1 < e) { // Jinja string escapes
                c++;
                char x = *c == 'n' ? '\n' : *c == 't' ? '\t' : *c;
                put_n(&s, &x, 1);
            } else {
                put_n(&s, c, 1);
            }
        }
        if (s.n + 1 > size) {
            if (size > 0) buf[size - 1] = 0;
            return -(int32_t)(s.n + 1);
        }
        buf[s.n] = 0;
        return (int32_t)s.n;
    }
    return 0;
}
