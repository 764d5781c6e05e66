// nanomind serve: the parsers of request bodies (req.h).
#include "server/req.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

bool serve_fail(serve_err *e, int code, const char *param, const char *fmt, ...) {
    e->code = code;
    e->param = param;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return false;
}

// The deepest nesting of arrays and objects in a JSON text (strings skipped).
static int json_depth(const char *t) {
    int depth = 0, most = 0;
    bool in_str = false;
    for (; *t; t++) {
        if (in_str) {
            if (*t == '\\' && t[1]) t++;
            else if (*t == '"') in_str = false;
        } else if (*t == '"') {
            in_str = true;
        } else if (*t == '[' || *t == '{') {
            if (++depth > most) most = depth;
        } else if ((*t == ']' || *t == '}') && depth > 0) {
            depth--;
        }
    }
    return most;
}

size_t serve_utf8_clean(const char *in, size_t n, char *out) {
    const uint8_t *s = (const uint8_t *)in;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        const uint8_t c = s[i];
        const size_t len = c < 0x80 ? 1 : c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
        bool ok = len > 0 && len <= n - i;
        for (size_t k = 1; ok && k < len; k++) ok = (s[i + k] & 0xc0) == 0x80;
        if (ok && len == 3) ok = !(c == 0xe0 && s[i + 1] < 0xa0) && !(c == 0xed && s[i + 1] >= 0xa0);
        if (ok && len == 4) ok = !(c == 0xf0 && s[i + 1] < 0x90) && !(c == 0xf4 && s[i + 1] >= 0x90);
        if (ok) {
            memcpy(out + o, s + i, len);
            o += len, i += len;
        } else {
            memcpy(out + o, "\xef\xbf\xbd", 3);
            o += 3, i++;
        }
    }
    return o;
}

cJSON *serve_json_object(const char *body, serve_err *e) {
    if (json_depth(body) > SERVE_JSON_MAX_DEPTH) {
        serve_fail(e, 400, NULL, "the body's JSON nests deeper than %d levels", SERVE_JSON_MAX_DEPTH);
        return NULL;
    }
    cJSON *req = cJSON_Parse(body);
    if (cJSON_IsObject(req)) return req;
    cJSON_Delete(req);
    serve_fail(e, 400, NULL, "the body is not a JSON object");
    return NULL;
}

void serve_images_free(serve_images *im) {
    for (int i = 0; i < im->n; i++) free(im->v[i].path);
    im->n = 0;
}

// ---- generation -------------------------------------------------------------------------

// Fields of OpenAI's and llama-server's requests that would change the answer and that this
// build does not serve: asked for, they are a 400 naming the field, never an answer that silently
// lacks them. A field at its "off" value (null, false, 0 or `off`, "", [], {}, or one of the strings
// `ok`) asks for nothing and passes. The fields served, and those taken with no effect on the answer
// (user, store, metadata, service_tier, parallel_tool_calls, prediction, n_keep, id_slot, ...), are
// listed in docs/server.md.
static const struct {
    const char *name, *what;
    double off;
    const char *ok[2];
} unserved[] = {
    {"tools", "tool calls", 0, {NULL, NULL}},
    {"tool_choice", "tool calls", 0, {"none", "auto"}},
    {"functions", "function calls", 0, {NULL, NULL}},
    {"function_call", "function calls", 0, {"none", "auto"}},
    {"response_format", "constrained output (json_object, json_schema)", 0, {NULL, NULL}}, // {"type": "text"} passes
    {"grammar", "constrained output (GBNF)", 0, {NULL, NULL}},
    {"json_schema", "constrained output (JSON Schema)", 0, {NULL, NULL}},
    {"logprobs", "log-probabilities", 0, {NULL, NULL}},
    {"top_logprobs", "log-probabilities", 0, {NULL, NULL}},
    {"n_probs", "log-probabilities", 0, {NULL, NULL}},
    {"post_sampling_probs", "log-probabilities", 0, {NULL, NULL}},
    {"logit_bias", "logit biases", 0, {NULL, NULL}},
    {"echo", "echoing the prompt", 0, {NULL, NULL}},
    {"best_of", "best-of sampling", 1, {NULL, NULL}},
    {"suffix", "a suffix (fill in the middle)", 0, {NULL, NULL}},
    {"modalities", "output other than text", 0, {"text", NULL}},
    {"audio", "audio output (POST /v1/audio/speech speaks text)", 0, {NULL, NULL}},
    {"mirostat", "Mirostat sampling", 0, {NULL, NULL}},
    {"typical_p", "locally typical sampling", 1, {NULL, NULL}},
    {"tfs_z", "tail-free sampling", 1, {NULL, NULL}},
    {"dynatemp_range", "dynamic temperature", 0, {NULL, NULL}},
    {"xtc_probability", "XTC sampling", 0, {NULL, NULL}},
    {"dry_multiplier", "DRY sampling", 0, {NULL, NULL}},
    {"samplers", "a sampler order", 0, {NULL, NULL}},
    {"lora", "LoRA adapters", 0, {NULL, NULL}},
};

// Whether v asks for nothing, for unserved[k].
static bool unserved_off(const cJSON *v, size_t k) {
    if (cJSON_IsNull(v) || cJSON_IsFalse(v)) return true;
    if (cJSON_IsNumber(v)) return cJSON_GetNumberValue(v) == unserved[k].off;
    if (cJSON_IsString(v)) {
        const char *s = v->valuestring;
        return !s[0] || (unserved[k].ok[0] && !strcmp(s, unserved[k].ok[0])) ||
               (unserved[k].ok[1] && !strcmp(s, unserved[k].ok[1]));
    }
    if (!strcmp(unserved[k].name, "response_format") && cJSON_IsObject(v)) { // {"type": "text"}: plain text
        const char *t = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(v, "type"));
        return (t && !strcmp(t, "text") && cJSON_GetArraySize(v) == 1) || !v->child;
    }
    if (cJSON_IsArray(v)) { // empty, or (modalities) only the strings allowed
        for (const cJSON *i = v->child; i; i = i->next)
            if (!cJSON_IsString(i) || !unserved_off(i, k) || !i->valuestring[0]) return false;
        return true;
    }
    return cJSON_IsObject(v) && !v->child;
}

// A request's generation parameters, checked: the brick's PARAMS object (NULL: e says why).
static cJSON *take_params(const cJSON *req, serve_err *e) {
    for (size_t k = 0; k < sizeof unserved / sizeof unserved[0]; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(req, unserved[k].name);
        if (v && !unserved_off(v, k)) {
            serve_fail(e, 400, unserved[k].name, "'%s' asks for %s, which this server does not implement yet: "
                       "leave it out (or at its default) for a plain-text answer", unserved[k].name, unserved[k].what);
            return NULL;
        }
    }
    cJSON *p = cJSON_CreateObject();
    if (!p) {
        serve_fail(e, 500, NULL, "out of memory");
        return NULL;
    }
    static const struct { const char *name, *as; double lo, hi; bool integer; } num[] = {
        {"temperature", "temperature", 0, 2, false},          {"top_p", "top_p", 0, 1, false},
        {"top_k", "top_k", 0, 1e9, true},                     {"min_p", "min_p", 0, 1, false},
        {"presence_penalty", "presence_penalty", -2, 2, false}, {"frequency_penalty", "frequency_penalty", -2, 2, false},
        {"seed", "seed", -1, 4294967295.0, true},            {"max_tokens", "n_predict", -1, 1e9, true},
        {"max_completion_tokens", "n_predict", -1, 1e9, true}, {"repeat_penalty", "repeat_penalty", 0, 10, false},
        {"n_predict", "n_predict", -1, 1e9, true},           {"repeat_last_n", "repeat_last_n", -1, 1e9, true},
    };
    for (size_t k = 0; k < sizeof num / sizeof num[0]; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(req, num[k].name);
        if (!v || cJSON_IsNull(v)) continue;
        const double x = cJSON_GetNumberValue(v);
        if (!cJSON_IsNumber(v) || !(x >= num[k].lo && x <= num[k].hi) || (num[k].integer && x != (double)(int64_t)x)) {
            cJSON_Delete(p);
            serve_fail(e, 400, num[k].name, "'%s' must be %s in [%g, %g]", num[k].name,
                       num[k].integer ? "an integer" : "a number", num[k].lo, num[k].hi);
            return NULL;
        }
        cJSON_DeleteItemFromObjectCaseSensitive(p, num[k].as);
        cJSON_AddNumberToObject(p, num[k].as, x);
    }
    const cJSON *stop = cJSON_GetObjectItemCaseSensitive(req, "stop");
    if (stop && !cJSON_IsNull(stop)) {
        const bool list = cJSON_IsArray(stop);
        bool ok = cJSON_IsString(stop) || (list && cJSON_GetArraySize(stop) <= NM_LLM_MAX_STOP);
        for (const cJSON *s = list ? stop->child : stop; s && ok; s = list ? s->next : NULL)
            ok = cJSON_IsString(s) && s->valuestring[0] && strlen(s->valuestring) <= NM_LLM_MAX_STOP_LEN;
        if (!ok) {
            cJSON_Delete(p);
            serve_fail(e, 400, "stop", "'stop' must be a string or an array of up to %d strings of 1 to %d bytes",
                       NM_LLM_MAX_STOP, NM_LLM_MAX_STOP_LEN);
            return NULL;
        }
        cJSON_AddItemToObject(p, "stop", cJSON_Duplicate(stop, true));
    }
    static const char *const bools[] = {"ignore_eos", "cache_prompt"}; // (llama-server's)
    for (size_t k = 0; k < sizeof bools / sizeof bools[0]; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(req, bools[k]);
        if (!v || cJSON_IsNull(v)) continue;
        if (!cJSON_IsBool(v)) {
            cJSON_Delete(p);
            serve_fail(e, 400, bools[k], "'%s' must be true or false", bools[k]);
            return NULL;
        }
        cJSON_AddBoolToObject(p, bools[k], cJSON_IsTrue(v));
    }
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(req, "n");
    if (n && !cJSON_IsNull(n) && (!cJSON_IsNumber(n) || cJSON_GetNumberValue(n) != 1)) {
        cJSON_Delete(p);
        serve_fail(e, 400, "n", "'n' must be 1 (one choice a request in this build)");
        return NULL;
    }
    return p;
}

// An image_url part of message msg into im (false: e says why).
static bool image_part(const serve_env *env, const cJSON *part, int msg, serve_images *im, serve_err *e) {
    if (!env->vision)
        return serve_fail(e, 400, "messages", "message %d: an image needs a vision encoder: this server was started "
                          "without --mmproj", msg);
    if (im->n == NM_PIPELINE_MAX_IMAGES)
        return serve_fail(e, 400, "messages", "message %d: more than %d images in one request", msg, NM_PIPELINE_MAX_IMAGES);
    const cJSON *iu = cJSON_GetObjectItemCaseSensitive(part, "image_url");
    const char *url = cJSON_IsString(iu) ? iu->valuestring
                                         : cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(iu, "url"));
    if (!url) return serve_fail(e, 400, "messages", "message %d: an image_url part needs image_url.url (a string)", msg);
    serve_image *img = &im->v[im->n];
    *img = (serve_image){0};
    if (!strncasecmp(url, "data:", 5)) {
        const char *hdr = url + 5, *comma = strchr(hdr, ',');
        const size_t hl = comma ? (size_t)(comma - hdr) : 0;
        const bool b64 = comma && hl >= 7 && !strncasecmp(comma - 7, ";base64", 7);
        const bool image = comma && (hl == 7 || !strncasecmp(hdr, "image/", 6));
        if (!b64 || !image)
            return serve_fail(e, 400, "messages", "message %d: an image's data: URL must hold an image in base64 "
                              "(data:image/png;base64,...)", msg);
        img->b64 = comma + 1;
        img->b64_len = strlen(comma + 1);
        if (img->b64_len == 0) return serve_fail(e, 400, "messages", "message %d: the image's data: URL holds no data", msg);
    } else if (!strncasecmp(url, "http://", 7) || !strncasecmp(url, "https://", 8)) {
        return serve_fail(e, 400, "messages", "message %d: image URLs are not fetched (this server reaches no "
                          "network): send the image as a data: URL (base64)", msg);
    } else if (!env->image_dir_real) {
        return serve_fail(e, 400, "messages", "message %d: the image '%.200s' is neither a data: URL nor served: local "
                          "files are read only under --image-dir", msg, url);
    } else {
        const char *p = !strncasecmp(url, "file://", 7) ? url + 7 : url;
        char *full = NULL;
        if (p[0] == '/') full = strdup(p);
        else if ((full = malloc(strlen(env->image_dir_real) + strlen(p) + 2))) sprintf(full, "%s/%s", env->image_dir_real, p);
        errno = 0;
        char *real = full ? realpath(full, NULL) : NULL;
        const int en = errno;
        const bool made = full != NULL;
        free(full);
        const size_t dl = strlen(env->image_dir_real);
        struct stat st;
        // One answer for a file out of the directory, a missing one and one that is no file: "No such file"
        // for the one and "not under" for the other told a client which files exist anywhere on the host
        const bool under = real && !strncmp(real, env->image_dir_real, dl) && real[dl] == '/';
        if (!under || stat(real, &st) != 0 || !S_ISREG(st.st_mode)) {
            const bool oom = !made || (!real && en == ENOMEM);
            free(real);
            if (oom) return serve_fail(e, 500, NULL, "out of memory");
            return serve_fail(e, 400, "messages", "message %d: image file '%.200s': no such file under --image-dir",
                              msg, p);
        }
        img->path = real;
    }
    im->n++;
    return true;
}

// The chat's text through the model's template, a media marker where each image
// part was (the images into im, in order). NULL: e says why.
// The chat's template variables (malloc'd JSON text, or NULL: none): the server's, a request's
// chat_template_kwargs members over them. false: e says why.
static bool chat_kwargs(const serve_env *env, const cJSON *req, char **out, serve_err *e) {
    *out = NULL;
    const cJSON *rk = cJSON_GetObjectItemCaseSensitive(req, "chat_template_kwargs");
    if (rk && !cJSON_IsNull(rk) && !cJSON_IsObject(rk))
        return serve_fail(e, 400, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
    if (cJSON_IsObject(rk) && rk->child && !env->jinja)
        return serve_fail(e, 400, "chat_template_kwargs", "'chat_template_kwargs' gives the Jinja template variables: "
                          "this server formats chats with a built-in template (start it with --jinja)");
    if (!cJSON_IsObject(rk) || !rk->child) {
        if (env->chat_kwargs && !(*out = strdup(env->chat_kwargs))) return serve_fail(e, 500, NULL, "out of memory");
        return true;
    }
    cJSON *all = env->chat_kwargs ? cJSON_Parse(env->chat_kwargs) : cJSON_CreateObject();
    bool ok = cJSON_IsObject(all);
    for (const cJSON *it = rk->child; it && ok; it = it->next) {
        cJSON *dup = cJSON_Duplicate(it, true);
        ok = dup && (cJSON_GetObjectItemCaseSensitive(all, it->string)
                         ? cJSON_ReplaceItemInObjectCaseSensitive(all, it->string, dup)
                         : cJSON_AddItemToObject(all, it->string, dup));
        if (!ok) cJSON_Delete(dup);
    }
    *out = ok ? cJSON_PrintUnformatted(all) : NULL;
    cJSON_Delete(all);
    if (!*out) return serve_fail(e, 500, NULL, "out of memory");
    char why[256];
    if (nm_chat_kwargs_check(*out, true, why, sizeof why) != NM_OK) {
        free(*out);
        *out = NULL;
        return serve_fail(e, 400, "chat_template_kwargs", "%s", why);
    }
    return true;
}

static char *chat_prompt(const serve_env *env, const cJSON *req, serve_images *im, serve_err *e) {
    const cJSON *messages = cJSON_GetObjectItemCaseSensitive(req, "messages");
    if (!cJSON_IsArray(messages) || cJSON_GetArraySize(messages) == 0) {
        serve_fail(e, 400, "messages", "'messages' must be a non-empty array");
        return NULL;
    }
    char *kwargs = NULL;
    if (!chat_kwargs(env, req, &kwargs, e)) return NULL;
    const int n = cJSON_GetArraySize(messages);
    nm_chat_msg *msgs = calloc((size_t)n + 1, sizeof *msgs);
    char **owned = calloc((size_t)n, sizeof *owned);
    char *buf = NULL;
    int k = 0;
    bool has_system = false, ok = msgs && owned;
    for (const cJSON *m = messages->child; m && ok; m = m->next) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role"), *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        const char *r = cJSON_GetStringValue(role);
        if (!r || (strcmp(r, "system") && strcmp(r, "developer") && strcmp(r, "user") && strcmp(r, "assistant"))) {
            ok = serve_fail(e, 400, "messages", "message %d: 'role' must be system, developer, user or assistant", k);
            break;
        }
        const char *text = cJSON_GetStringValue(content);
        if (!text && cJSON_IsArray(content)) { // parts: text ones joined, a media marker for each image
            size_t len = 1;
            for (const cJSON *part = content->child; part && ok; part = part->next) {
                const char *type = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(part, "type"));
                const char *t = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(part, "text"));
                if (type && !strcmp(type, "image_url")) {
                    ok = image_part(env, part, k, im, e);
                    len += strlen(NM_PIPELINE_MEDIA_MARKER);
                } else if (!type || strcmp(type, "text") || !t) {
                    ok = serve_fail(e, 400, "messages", "message %d: a part of type '%.64s' is not served (text and "
                                    "image_url)", k, type ? type : "?");
                } else {
                    len += strlen(t);
                }
            }
            if (ok && !(owned[k] = malloc(len))) ok = serve_fail(e, 500, NULL, "out of memory");
            if (ok) {
                owned[k][0] = '\0';
                for (const cJSON *part = content->child; part; part = part->next) {
                    const char *t = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(part, "text"));
                    strcat(owned[k], strcmp(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(part, "type")),
                                            "image_url") ? t : NM_PIPELINE_MEDIA_MARKER);
                }
                text = owned[k];
            }
        }
        if (ok && !text)
            ok = serve_fail(e, 400, "messages", "message %d: 'content' must be a string or an array of text parts", k);
        if (!ok) break;
        has_system = has_system || !strcmp(r, "system") || !strcmp(r, "developer");
        msgs[k].role = !strcmp(r, "developer") ? "system" : r;
        msgs[k++].content = text;
    }
    if (!msgs || !owned) serve_fail(e, 500, NULL, "out of memory");
    if (ok && !has_system && env->system) { // -sys: the server's system message when a chat has none
        memmove(msgs + 1, msgs, sizeof *msgs * (size_t)k);
        msgs[0] = (nm_chat_msg){"system", env->system};
        k++;
    }
    if (ok) {
        nm_status st = NM_ERR_NOMEM;
        buf = env->format(env->format_ctx, msgs, (size_t)k, kwargs, &st);
        if (!buf) {
            serve_fail(e, 500, NULL, st == NM_ERR_TEMPLATE ? "the model names no chat template we know (start with "
                                                             "--chat-template)" : "out of memory formatting the chat");
        } else {
            int n_markers = 0;
            for (const char *q = buf; (q = strstr(q, NM_PIPELINE_MEDIA_MARKER)); q += strlen(NM_PIPELINE_MEDIA_MARKER)) n_markers++;
            if (im->n > 0 && n_markers != im->n) { // the text itself holds the marker: where would the images go?
                free(buf);
                buf = NULL;
                serve_fail(e, 400, "messages", "the messages' text holds the media marker %s, which marks where an "
                           "image goes: leave it out of the text of a chat with images", NM_PIPELINE_MEDIA_MARKER);
            }
        }
    }
    for (int i = 0; owned && i < n; i++) free(owned[i]);
    free(owned);
    free(msgs);
    free(kwargs);
    return buf;
}

bool serve_gen_parse(const serve_env *env, const cJSON *req, bool chat, serve_gen_req *out, serve_err *e) {
    *out = (serve_gen_req){.im.n = 0};
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(req, "stream");
    if (st && !cJSON_IsBool(st) && !cJSON_IsNull(st)) return serve_fail(e, 400, "stream", "'stream' must be true or false");
    out->stream = cJSON_IsTrue(st);
    out->usage_in_stream = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(req, "stream_options"), "include_usage"));
    if (!(out->params = take_params(req, e))) return false;
    const cJSON *stp = cJSON_GetObjectItemCaseSensitive(out->params, "stop");
    for (const cJSON *s = cJSON_IsArray(stp) ? stp->child : stp; s && out->n_stop < NM_LLM_MAX_STOP;
         s = cJSON_IsArray(stp) ? s->next : NULL)
        out->stop[out->n_stop++] = s->valuestring;
    for (int k = 0; !stp && k < env->n_stop && k < NM_LLM_MAX_STOP; k++) out->stop[out->n_stop++] = env->stop[k];
    if (chat) {
        out->prompt = chat_prompt(env, req, &out->im, e);
    } else {
        const char *p = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(req, "prompt"));
        if (!p) serve_fail(e, 400, "prompt", "'prompt' must be a string");
        else if (!(out->prompt = strdup(p))) serve_fail(e, 500, NULL, "out of memory");
    }
    if (out->prompt) return true;
    serve_gen_free(out);
    return false;
}

void serve_gen_free(serve_gen_req *r) {
    free(r->prompt);
    serve_images_free(&r->im);
    cJSON_Delete(r->params);
    r->prompt = NULL;
    r->params = NULL;
    r->n_stop = 0;
}

// ---- speech -----------------------------------------------------------------------------

// OpenAI's voices as the engine's: espeak-ng voices (a name not here goes to espeak-ng as it is:
// "en-gb", "de", "en-us+f3"...); with a Piper voice each is the server's own voice (NULL), and any
// other name a Piper voice installed in the model folder (or a voice file).
static const char *engine_voice(const serve_env *env, const char *v) {
    static const char *const map[][2] = {
        {"alloy", "en-us"},      {"ash", "en-us+m3"},  {"ballad", "en-gb+m2"}, {"coral", "en-us+f2"},
        {"echo", "en-us+m1"},    {"fable", "en-gb"},   {"onyx", "en-us+m7"},   {"nova", "en-us+f3"},
        {"sage", "en-us+f4"},    {"shimmer", "en-us+f5"}, {"verse", "en-us+m2"},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(v, map[i][0])) return env->piper ? NULL : map[i][1];
    return v;
}

bool serve_speech_parse(const serve_env *env, const cJSON *req, serve_speech_req *out, serve_err *e) {
    *out = (serve_speech_req){0};
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(req, "input"), *vo = cJSON_GetObjectItemCaseSensitive(req, "voice");
    const cJSON *fm = cJSON_GetObjectItemCaseSensitive(req, "response_format"), *sp = cJSON_GetObjectItemCaseSensitive(req, "speed");
    const char *text = cJSON_GetStringValue(in);
    size_t chars = 0;
    for (const unsigned char *p = (const unsigned char *)(text ? text : ""); *p; p++) chars += (*p & 0xc0) != 0x80;
    if (!text || chars == 0) return serve_fail(e, 400, "input", "'input' must be a non-empty string");
    if ((int64_t)chars > env->speech_max_chars)
        return serve_fail(e, 400, "input", "'input' has %zu characters; the limit is %lld (--max-speech)", chars,
                          (long long)env->speech_max_chars);
    if (vo && !cJSON_IsNull(vo) && (!cJSON_IsString(vo) || !vo->valuestring[0] || strlen(vo->valuestring) > 48))
        return serve_fail(e, 400, "voice", "'voice' must be a voice's name");
    const char *fmt = cJSON_IsString(fm) ? fm->valuestring : "wav";
    if (fm && !cJSON_IsNull(fm) && !cJSON_IsString(fm))
        return serve_fail(e, 400, "response_format", "'response_format' must be a string");
    if (!strcmp(fmt, "aac"))
        return serve_fail(e, 400, "response_format", "'response_format' aac is not made here: mp3, opus, flac, wav or pcm");
    const bool coded = nm_audio_container_parse(fmt, &out->container) && strcmp(fmt, "ogg");
    if (strcmp(fmt, "wav") && strcmp(fmt, "pcm") && !coded)
        return serve_fail(e, 400, "response_format", "'response_format' must be mp3, opus, flac, wav or pcm");
    if (sp && !cJSON_IsNull(sp) && (!cJSON_IsNumber(sp) || !(sp->valuedouble >= 0.25 && sp->valuedouble <= 4.0)))
        return serve_fail(e, 400, "speed", "'speed' must be a number in [0.25, 4]");
    out->text = text;
    out->format = coded ? SERVE_ENCODED : !strcmp(fmt, "pcm") ? SERVE_PCM : SERVE_WAV;
    cJSON *params = cJSON_CreateObject();
    const char *voice = cJSON_IsString(vo) ? engine_voice(env, vo->valuestring) : NULL;
    if (params && voice) cJSON_AddStringToObject(params, "voice", voice);
    if (params && cJSON_IsNumber(sp)) cJSON_AddNumberToObject(params, "speed", sp->valuedouble);
    out->params = params ? cJSON_PrintUnformatted(params) : NULL;
    cJSON_Delete(params);
    if (!out->params) return serve_fail(e, 500, NULL, "out of memory");
    return true;
}
