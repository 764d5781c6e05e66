// Public tokenizer and chat entry points of a loaded model: thin wrappers
// over the tokenizer brick.
#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "bricks/llm/llm.h"
#include "bricks/tokenizer/jinja.h"

int32_t nm_tokenize(const nm_model *m, const char *text, size_t len, int32_t *out, int32_t n_max, bool add_special,
                    bool parse_special) {
    return nm_tokenizer_encode(m->tok, text, len, out, n_max, add_special, parse_special);
}

int32_t nm_token_to_piece(const nm_model *m, int32_t tok, char *buf, int32_t size, bool special) {
    return nm_tokenizer_piece(m->tok, tok, buf, size, special);
}

int32_t nm_token_bos(const nm_model *m) { return nm_tokenizer_bos(m->tok); }
int32_t nm_token_eos(const nm_model *m) { return nm_tokenizer_eos(m->tok); }
bool nm_token_is_eog(const nm_model *m, int32_t tok) { return nm_tokenizer_is_eog(m->tok, tok); }

int32_t nm_detok_push(const nm_model *m, nm_detok *d, int32_t tok, char *out, int32_t size) {
    return nm_tokenizer_detok_push(m->tok, d, tok, out, size);
}

int32_t nm_chat_format(const nm_model *m, const char *tmpl_name, const nm_chat_msg *msgs, size_t n_msgs,
                       bool add_assistant, char *buf, int32_t size) {
    nm_chat_tmpl t = tmpl_name ? nm_chat_from_name(tmpl_name) : m->chat;
    if (t == NM_CHAT_UNKNOWN) return NM_ERR_TEMPLATE;
    char sys[512];
    nm_str src = nm_tokenizer_chat_template(m->tok);
    const char *def_sys =
        t == NM_CHAT_CHATML && nm_chat_default_system(src.ptr, src.len, sys, sizeof sys) > 0 ? sys : NULL;
    // BOS is added by the tokenizer (add_special), not written as text.
    return nm_chat_apply(t, def_sys, msgs, n_msgs, add_assistant, NULL, buf, size);
}

// kwargs' members into ctx (nm_chat_format_jinja's rules).
static nm_status add_kwargs(cJSON *ctx, const char *kwargs, char *err, size_t err_size) {
    cJSON *kw = cJSON_Parse(kwargs);
    nm_status st = NM_OK;
    if (!cJSON_IsObject(kw)) {
        st = kw || cJSON_GetErrorPtr() ? NM_ERR_INVALID_ARG : NM_ERR_NOMEM;
        if (err && err_size) snprintf(err, err_size, "chat template kwargs: not a JSON object: %.80s", kwargs);
    }
    static const char *const reserved[] = {"messages", "add_generation_prompt", "bos_token", "eos_token"};
    for (cJSON *it = st == NM_OK ? kw->child : NULL; it && st == NM_OK; it = it->next) {
        for (size_t r = 0; r < sizeof reserved / sizeof reserved[0] && st == NM_OK; r++)
            if (!strcmp(it->string, reserved[r])) {
                st = NM_ERR_INVALID_ARG;
                if (err && err_size) snprintf(err, err_size, "chat template kwargs: '%s' is the conversation's own", it->string);
            }
        cJSON *dup = st == NM_OK ? cJSON_Duplicate(it, true) : NULL;
        if (st == NM_OK && (!dup || !(cJSON_GetObjectItemCaseSensitive(ctx, it->string)
                                          ? cJSON_ReplaceItemInObjectCaseSensitive(ctx, it->string, dup)
                                          : cJSON_AddItemToObject(ctx, it->string, dup)))) {
            cJSON_Delete(dup);
            st = NM_ERR_NOMEM;
        }
    }
    cJSON_Delete(kw);
    return st;
}

nm_status nm_chat_kwargs_check(const char *kwargs, bool jinja, char *err, size_t err_size) {
    if (err && err_size) err[0] = 0;
    if (!jinja) {
        if (err && err_size) snprintf(err, err_size, "chat template kwargs need the Jinja template (jinja)");
        return NM_ERR_INVALID_ARG;
    }
    cJSON *scratch = cJSON_CreateObject();
    const nm_status st = !kwargs ? NM_ERR_INVALID_ARG : scratch ? add_kwargs(scratch, kwargs, err, err_size) : NM_ERR_NOMEM;
    cJSON_Delete(scratch);
    return st;
}

nm_status nm_chat_format_jinja(const nm_model *m, const char *tmpl, size_t len, const nm_chat_msg *msgs,
                               size_t n_msgs, bool add_assistant, const char *kwargs, char **text, size_t *n,
                               char *err, size_t err_size) {
    if (err && err_size) err[0] = 0;
    if (text) *text = NULL;
    if (n) *n = 0;
    if (!m || !text || (!msgs && n_msgs)) return NM_ERR_INVALID_ARG;
    if (!tmpl) {
        nm_str src = nm_tokenizer_chat_template(m->tok);
        if (!src.len) {
            if (err && err_size) snprintf(err, err_size, "the model has no chat template (tokenizer.chat_template)");
            return NM_ERR_TEMPLATE;
        }
        tmpl = src.ptr;
        len = (size_t)src.len;
    }
    nm_str bos = nm_tokenizer_text(m->tok, nm_tokenizer_bos(m->tok));
    nm_str eos = nm_tokenizer_text(m->tok, nm_tokenizer_eos(m->tok));
    cJSON *ctx = cJSON_CreateObject(), *list = cJSON_AddArrayToObject(ctx, "messages");
    bool ok = ctx && list;
    for (size_t i = 0; ok && i < n_msgs; i++) {
        cJSON *msg = cJSON_CreateObject();
        ok = msg && cJSON_AddItemToArray(list, msg) && cJSON_AddStringToObject(msg, "role", msgs[i].role ? msgs[i].role : "") &&
             cJSON_AddStringToObject(msg, "content", msgs[i].content ? msgs[i].content : "");
    }
    char *b = ok ? strndup(bos.ptr, (size_t)bos.len) : NULL, *e = ok ? strndup(eos.ptr, (size_t)eos.len) : NULL;
    ok = ok && b && e && cJSON_AddStringToObject(ctx, "bos_token", b) && cJSON_AddStringToObject(ctx, "eos_token", e) &&
         cJSON_AddNullToObject(ctx, "tools") && cJSON_AddNullToObject(ctx, "documents") &&
         cJSON_AddBoolToObject(ctx, "add_generation_prompt", add_assistant);
    free(b);
    free(e);
    if (!ok) {
        cJSON_Delete(ctx);
        return NM_ERR_NOMEM;
    }
    if (kwargs) {
        const nm_status kst = add_kwargs(ctx, kwargs, err, err_size);
        if (kst != NM_OK) {
            cJSON_Delete(ctx);
            return kst;
        }
    }
    char *out = NULL;
    size_t on = 0;
    nm_status st = nm_jinja_render(tmpl, len, ctx, NULL, &out, &on, err, err_size);
    cJSON_Delete(ctx);
    if (st != NM_OK) return st;
    // The tokenizer puts BOS first itself (add_special): not twice (llama.cpp does the same).
    if (nm_tokenizer_add_bos(m->tok) && bos.len > 0 && on >= (size_t)bos.len && !memcmp(out, bos.ptr, (size_t)bos.len)) {
        memmove(out, out + bos.len, on - (size_t)bos.len + 1);
        on -= (size_t)bos.len;
    }
    *text = out;
    if (n) *n = on;
    return NM_OK;
}

nm_status nm_chat_text(const nm_model *m, const char *tmpl_name, bool jinja, const char *tmpl, size_t len,
                       const nm_chat_msg *msgs, size_t n_msgs, bool add_assistant, const char *kwargs, char **text,
                       const char **fallback, char *err, size_t err_size) {
    if (fallback) *fallback = NULL;
    if (text) *text = NULL;
    if (err && err_size) err[0] = 0;
    if (!m || !text || (!msgs && n_msgs)) return NM_ERR_INVALID_ARG;
    if (kwargs && !jinja) {
        if (err && err_size) snprintf(err, err_size, "chat template kwargs need the Jinja template (--jinja)");
        return NM_ERR_INVALID_ARG;
    }
    if (jinja) {
        const nm_status st =
            nm_chat_format_jinja(m, tmpl, len, msgs, n_msgs, add_assistant, kwargs, text, NULL, err, err_size);
        if (st == NM_ERR_UNSUPPORTED && kwargs) { // no fall back: the built-in template would drop the variables
            const size_t k = err ? strlen(err) : 0;
            if (err && k < err_size)
                snprintf(err + k, err_size - k, " (with template variables given there is no falling back to a "
                         "built-in template, which would drop them)");
        }
        if (st != NM_ERR_UNSUPPORTED || kwargs) return st;
        const char *name = nm_chat_template_name(m, tmpl_name);
        if (!name) {
            const size_t k = err ? strlen(err) : 0;
            if (err && k < err_size)
                snprintf(err + k, err_size - k, " (and no built-in formatter to fall back to: name one of %s)",
                         nm_chat_template_names());
            return NM_ERR_TEMPLATE;
        }
        if (fallback) *fallback = name; // err keeps why the template is beyond the subset
    }
    int32_t need = nm_chat_format(m, tmpl_name, msgs, n_msgs, add_assistant, NULL, 0);
    if (need == NM_ERR_TEMPLATE) {
        if (err && err_size && tmpl_name)
            snprintf(err, err_size, "no built-in chat template '%s' (known: %s)", tmpl_name, nm_chat_template_names());
        else if (err && err_size)
            snprintf(err, err_size, "the model names no chat template nanomind knows (name one: %s)",
                     nm_chat_template_names());
        return NM_ERR_TEMPLATE;
    }
    if (need < 0) need = -need;
    char *buf = malloc((size_t)need + 1);
    if (!buf || nm_chat_format(m, tmpl_name, msgs, n_msgs, add_assistant, buf, need + 1) < 0) {
        free(buf);
        return NM_ERR_NOMEM;
    }
    *text = buf;
    return NM_OK;
}

const char *nm_chat_template_name(const nm_model *m, const char *tmpl_name) {
    nm_chat_tmpl t = tmpl_name ? nm_chat_from_name(tmpl_name) : m ? m->chat : NM_CHAT_UNKNOWN;
    return t == NM_CHAT_UNKNOWN ? NULL : nm_chat_name(t);
}

bool nm_chat_template_known(const char *name) { return name && nm_chat_from_name(name) != NM_CHAT_UNKNOWN; }

static char tmpl_names[256];
static void build_tmpl_names(void) {
    size_t n = 0;
    for (int t = NM_CHAT_UNKNOWN + 1; t < NM_CHAT_COUNT && n < sizeof tmpl_names; t++) {
        int k = snprintf(tmpl_names + n, sizeof tmpl_names - n, "%s%s", n ? ", " : "", nm_chat_name((nm_chat_tmpl)t));
        if (k < 0) break;
        n += (size_t)k; // may pass the end on truncation: the loop condition stops there
    }
}

const char *nm_chat_template_names(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, build_tmpl_names);
    return tmpl_names;
}
