// Fuzz target for the server's request parsers (src/server/req.c): the
// first byte picks the endpoint and the server's settings, the rest is the
// body, parsed as nanomind serve parses it. Checks the contracts that do not
// depend on the bytes: a refusal is a 4xx or 5xx with a message, naming a
// request field or none, and leaves nothing allocated; an accepted request
// gives a prompt, a PARAMS object whose values lie in their documented ranges,
// at most NM_LLM_MAX_STOP non-empty stop strings of at most
// NM_LLM_MAX_STOP_LEN bytes, one media marker a served image in a chat's
// prompt, and for speech a non-empty text and PARAMS that parse back.
// Seeds: tests/fuzz/corpus/serve_req (the first byte: 'c' completion, 'C'
// chat, 'V' chat with images served and the server's -sys and -r, 's' speech;
// other values pick by their low two bits).
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve_req_chatml.h"

static void check_err(const serve_err *e) {
    static const char *const fields[] = {"stream", "temperature", "top_p", "top_k", "min_p", "presence_penalty",
                                         "frequency_penalty", "seed", "max_tokens", "max_completion_tokens",
                                         "repeat_penalty", "stop", "ignore_eos", "cache_prompt", "n", "messages",
                                         "prompt", "input", "voice", "response_format", "speed", "chat_template_kwargs"};
    if (e->code < 400 || e->code > 599 || !e->msg[0]) abort();
    if (!e->param) return;
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (!strcmp(e->param, fields[i])) return;
    abort(); // a field no request has
}

static void in_range(const cJSON *p, const char *key, double lo, double hi, bool integer) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(p, key);
    if (!v) return;
    const double x = cJSON_GetNumberValue(v);
    if (!cJSON_IsNumber(v) || !(x >= lo && x <= hi) || (integer && x != floor(x))) abort();
}

static size_t markers(const char *s) {
    size_t n = 0;
    for (const char *q = s; (q = strstr(q, NM_PIPELINE_MEDIA_MARKER)); q += strlen(NM_PIPELINE_MEDIA_MARKER)) n++;
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    const uint8_t mode = data[0] == 'c' ? 0 : data[0] == 'C' ? 1 : data[0] == 'V' ? 2 : data[0] == 's' ? 3 : data[0] & 3;
    char *body = malloc(size); // the rest, NUL-terminated (as read_body gives it)
    if (!body) return 0;
    memcpy(body, data + 1, size - 1);
    body[size - 1] = '\0';
    static const char *const server_stop[] = {"\n\nUser:", "###"};
    const serve_env env = {.vision = mode == 2, .system = mode == 2 ? "You are terse." : NULL,
                           .format = serve_req_chatml, .stop = server_stop, .n_stop = mode == 2 ? 2 : 0,
                           .jinja = mode == 2, .chat_kwargs = mode == 2 ? "{\"enable_thinking\":true}" : NULL,
                           .speech_max_chars = 4096};
    serve_err e = {0};
    cJSON *req = serve_json_object(body, &e);
    if (!req) {
        check_err(&e);
        free(body);
        return 0;
    }
    if (mode == 3) {
        serve_speech_req sr;
        if (!serve_speech_parse(&env, req, &sr, &e)) {
            check_err(&e);
            if (sr.params) abort();
        } else {
            cJSON *p = cJSON_Parse(sr.params);
            if (!sr.text || !sr.text[0] || !cJSON_IsObject(p)) abort();
            in_range(p, "speed", 0.25, 4.0, false);
            cJSON_Delete(p);
            free(sr.params);
        }
    } else {
        serve_gen_req r;
        if (!serve_gen_parse(&env, req, mode != 0, &r, &e)) {
            check_err(&e);
            if (r.prompt || r.params || r.im.n) abort(); // nothing left allocated
        } else {
            if (!r.prompt || !cJSON_IsObject(r.params) || r.n_stop > NM_LLM_MAX_STOP) abort();
            in_range(r.params, "temperature", 0, 2, false);
            in_range(r.params, "top_p", 0, 1, false);
            in_range(r.params, "top_k", 0, 1e9, true);
            in_range(r.params, "seed", -1, 4294967295.0, true);
            in_range(r.params, "n_predict", -1, 1e9, true);
            in_range(r.params, "min_p", 0, 1, false);
            in_range(r.params, "presence_penalty", -2, 2, false);
            in_range(r.params, "frequency_penalty", -2, 2, false);
            in_range(r.params, "repeat_penalty", 0, 10, false);
            for (int k = 0; k < r.n_stop; k++)
                if (!r.stop[k] || !r.stop[k][0] || strlen(r.stop[k]) > NM_LLM_MAX_STOP_LEN) abort();
            if (r.im.n < 0 || r.im.n > NM_PIPELINE_MAX_IMAGES || (mode != 2 && r.im.n)) abort();
            if (r.im.n > 0 && markers(r.prompt) != (size_t)r.im.n) abort();
            for (int k = 0; k < r.im.n; k++)
                if (!r.im.v[k].b64 || r.im.v[k].b64_len == 0 || r.im.v[k].path) abort(); // no --image-dir here
            serve_gen_free(&r);
        }
    }
    cJSON_Delete(req);
    free(body);
    return 0;
}
