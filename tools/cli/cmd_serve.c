// nanomind serve: an OpenAI-compatible HTTP server (docs/server.md). HTTP
// through civetweb (Debian's libcivetweb: a thread per open connection and a
// blocking chunk writer, so a streamed answer is a loop in its handler), JSON
// through cJSON: this file is HTTP, the routes, /metrics and the command.
//
// The decoder (with --mmproj the vision encoder before it) is a pipeline
// (serve_gen.c): a request waits its turn (--parallel requests decode
// together, at most --queue wait; more get 429), submits its prompt with its
// parameters (a new conversation at position 0: the prompt's leading tokens
// the cache already holds, a repeated system prompt, are not decoded again)
// and reads its answer back. A client that goes away cancels its request.
// With --stt, transcriptions run on the STT brick (its own thread pool, one
// at a time); with --tts, speech on the TTS brick's lane, streamed as made.
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "serve.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: nanomind serve -m MODEL [--host 127.0.0.1] [--port 8080] [--api-key KEY] [options]\n"
            "\n"
            "An OpenAI-compatible server (docs/server.md): POST /v1/chat/completions, POST /v1/completions,\n"
            "POST /v1/audio/transcriptions (with --stt), POST /v1/audio/speech (with --tts), GET /v1/models,\n"
            "images in chats (with --mmproj), "
            "GET /health, GET /metrics; streaming as server-sent events.\n"
            "\n"
            "  --host ADDR              address to listen on (default 127.0.0.1)\n"
            "  --port N                 port (default 8080)\n"
            "  --api-key KEY            require 'Authorization: Bearer KEY' (repeatable, or KEY1,KEY2);\n"
            "                           /health and /v1/models stay open, as llama-server\n"
            "  --api-key-file FILE      the keys, one a line, at most 1 MiB (a list or file with no key in it is an error)\n"
            "  -a, --alias NAME         the model's id in /v1/models and the answers (default: the file name)\n"
            "  -np, --parallel N        requests decoded together (continuous batching; default 1), each on a\n"
            "                           sequence of its own of -c / N positions (as llama-server's slots)\n"
            "  --queue N                requests that may wait their turn (default 16, at most 4096; more get 429)\n"
            "  --idle-timeout S         seconds a request's header may take to arrive whole, and a read of its\n"
            "                           body or a write of its answer may wait (default 10); a keep-alive\n"
            "                           connection idle for 0.5 s is closed; generation is not bounded\n"
            "  --timeout S              seconds SIGTERM waits for the requests in flight (default 600)\n"
            "  --body-timeout S         seconds a request's body may take to arrive, from its header's end\n"
            "                           (default 60; 0: no bound but --idle-timeout for each read; later: 408)\n"
            "  --threads-http N         connections served at once, idle ones included (default: --parallel +\n"
            "                           --queue + 64, at least 256; more wait in the listen backlog)\n"
            "  --max-body BYTES         the largest request body (default 8388608; larger get 413)\n"
            "  --stt FILE               a Whisper model (GGUF or whisper.cpp .bin): POST /v1/audio/transcriptions\n"
            "  --max-audio S            the longest audio a transcription takes, in seconds (default 1800)\n"
            "  --tts espeak             text to speech through espeak-ng: POST /v1/audio/speech (24 kHz)\n"
            "  --max-speech N           the most characters a speech request's input may have (default 4096)\n"
            "  --sysfs DIR              look for energy meters under DIR (default /sys; NVIDIA GPUs through NVML):\n"
            "                           /metrics gives each one's joules since the start\n"
            "  --mmproj FILE            a vision encoder (llama.cpp mmproj GGUF): image_url parts in chat messages\n"
            "                           (data: URLs with base64; http(s) URLs are refused)\n"
            "  --image-dir DIR          also read image_url paths (or file:// URLs) of files under DIR\n"
            "  --max-image-pixels N     the largest image, width x height (default 16777216; larger get 400)\n"
            "  --mmproj-device DEV      the vision encoder's unit (default: -dev); --mmproj-cores its lane\n"
            "  --image-min-tokens N, --image-max-tokens N  image tokens of a dynamic-resolution mmproj\n"
            "                           (qwen2vl_merger; default: the model's, 8..4096)\n"
            "also: -c, -b, -ub, -t, -n (the default max_tokens), --temp and the other sampling defaults,\n"
            "--chat-template, --jinja, --chat-template-file, -sys/-sysf (a system message when a chat has none), -dev,\n"
            "-ngl, --no-mmap, --mlock, -ctk/-ctv f16; --metrics, --log-disable, -v, --no-warmup are accepted (/metrics\n"
            "is always served).\n");
}

// ---- latency histograms ---------------------------------------------------------------

static const double LE[SERVE_N_LE] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};

void serve_hist_add(serve_hist *h, double seconds) {
    for (int i = 0; i < SERVE_N_LE; i++)
        if (seconds <= LE[i]) h->bucket[i]++;
    h->sum += seconds;
    h->count++;
}

int serve_hist_print(const serve_hist *h, const char *name, const char *help, char *buf, size_t size) {
    size_t n = 0;
#define PUT(...) \
    do { \
        int k_ = snprintf(buf + n, n < size ? size - n : 0, __VA_ARGS__); \
        if (k_ > 0) n += (size_t)k_; \
    } while (0)
    PUT("# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (int i = 0; i < SERVE_N_LE; i++) PUT("%s_bucket{le=\"%g\"} %llu\n", name, LE[i], (unsigned long long)h->bucket[i]);
    PUT("%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)h->count, name, h->sum,
        name, (unsigned long long)h->count);
#undef PUT
    return n < size ? (int)n : size ? (int)size - 1 : 0;
}

// ---- replies ----------------------------------------------------------------------------

// An error reply (4xx, 5xx) ends its connection: civetweb would otherwise read and discard the rest of a
// body it did not want (a 413's declared gigabyte) before the next request, holding the thread meanwhile.
int send_json_text(struct mg_connection *c, int code, const char *body) {
    const size_t n = strlen(body);
    const bool close = code >= 400;
    if (close) mg_disable_connection_keep_alive(c);
    mg_printf(c,
              "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
              "Cache-Control: no-cache\r\n%s\r\n",
              code, mg_get_response_code_text(c, code), n, close ? "Connection: close\r\n" : "");
    mg_write(c, body, n);
    return code;
}

int send_json(struct mg_connection *c, int code, cJSON *root) {
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    const int r = send_json_text(c, text ? code : 500, text ? text : "{}");
    free(text);
    return r;
}

// An OpenAI-style error: {"error": {"message", "type", "param", "code"}}.
int send_err(server *S, struct mg_connection *c, const serve_err *e) {
    return send_error(S, c, e->code, e->param, "%s", e->msg);
}

static char *format_chat(void *ctx, const nm_chat_msg *msgs, size_t n, nm_status *st) {
    const server *S = ctx;
    return cli_chat_text(S->m, &S->o, msgs, n, st);
}

serve_env serve_env_of(server *S) {
    return (serve_env){.vision = S->mmproj != NULL, .image_dir_real = S->image_dir_real, .system = S->o.system,
                       .format = format_chat, .format_ctx = S, .stop = (const char *const *)S->o.stop,
                       .n_stop = S->o.n_stop, .speech_max_chars = S->speech_max_chars};
}

int send_error(server *S, struct mg_connection *c, int code, const char *param, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&S->lock);
    S->n_errors++;
    pthread_mutex_unlock(&S->lock);
    cJSON *root = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type", code == 401 ? "authentication_error" : code == 429 ? "rate_limit_error"
                                       : code >= 500 ? "server_error" : "invalid_request_error");
    if (param) cJSON_AddStringToObject(e, "param", param);
    else cJSON_AddNullToObject(e, "param");
    cJSON_AddNumberToObject(e, "code", code);
    return send_json(c, code, root);
}

// ---- requests ---------------------------------------------------------------------------

void serve_turn_init(serve_turn *t, int slots) {
    pthread_cond_init(&t->free, NULL);
    t->waiting = t->busy = 0;
    t->slots = slots;
    t->next_ticket = t->serving = 0;
}

// First come, first served: a request takes a ticket and its turn comes when every earlier ticket has had
// its own (a turn given back goes to the oldest waiter, never to a request that arrives just then).
bool serve_turn_take(server *S, serve_turn *t) {
    pthread_mutex_lock(&S->lock);
    const bool room = t->waiting + t->busy < S->queue_max + t->slots;
    if (!room) {
        S->n_rejected++;
        pthread_mutex_unlock(&S->lock);
        return false;
    }
    const uint64_t ticket = t->next_ticket++;
    t->waiting++;
    while (t->busy >= t->slots || ticket != t->serving) pthread_cond_wait(&t->free, &S->lock);
    t->serving++;
    t->waiting--;
    t->busy++;
    if (t->waiting > 0 && t->busy < t->slots) pthread_cond_broadcast(&t->free); // the next ticket may go too
    pthread_mutex_unlock(&S->lock);
    return true;
}

void serve_turn_give(server *S, serve_turn *t) {
    pthread_mutex_lock(&S->lock);
    t->busy--;
    pthread_cond_broadcast(&t->free); // (the oldest ticket's holder is among those woken)
    pthread_mutex_unlock(&S->lock);
}

// Whether a Content-Type is JSON's: application/json, parameters allowed (any case, as media types are).
// Only it: a page of any web site may POST text/plain, a form or a Blob with no type to this server
// without the browser asking first (a "simple request"), and that body would be parsed as JSON.
static bool json_type(const char *ct) {
    if (!ct) return false;
    while (*ct == ' ' || *ct == '\t') ct++;
    const size_t n = strlen("application/json");
    return !strncasecmp(ct, "application/json", n) && (!ct[n] || ct[n] == ';' || ct[n] == ' ' || ct[n] == '\t');
}

cJSON *read_json(server *S, struct mg_connection *c, int *code) {
    const char *ct = mg_get_header(c, "Content-Type");
    if (!json_type(ct)) {
        *code = send_error(S, c, 415, NULL, "the body must be JSON, sent as Content-Type: application/json (not %s%.64s%s)",
                           ct ? "'" : "", ct ? ct : "none", ct ? "'" : "");
        return NULL;
    }
    char *body = read_body(S, c, code);
    if (!body) return NULL;
    serve_err e;
    cJSON *req = serve_json_object(body, &e);
    free(body);
    if (!req) *code = send_err(S, c, &e);
    return req;
}

// Whether a (na bytes) is b (nb bytes), in a time that depends on na alone: a byte-by-byte comparison
// that stops at the first difference tells a client, by its time, how much of a key it has right.
static bool same_secret(const char *a, size_t na, const char *b, size_t nb) {
    unsigned char d = na != nb;
    for (size_t i = 0; i < na; i++) d |= (unsigned char)(a[i] ^ (nb ? b[i % nb] : 0));
    return d == 0;
}

static bool authorized(const server *S, struct mg_connection *c) {
    if (S->n_keys == 0) return true;
    const char *h = mg_get_header(c, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7)) return false;
    const size_t n = strlen(h + 7);
    bool ok = false;
    for (int k = 0; k < S->n_keys; k++) // (every key, whichever matches)
        ok |= same_secret(h + 7, n, S->keys[k], strlen(S->keys[k]));
    return ok;
}

char *read_body(server *S, struct mg_connection *c, int *code) {
    const struct mg_request_info *ri = mg_get_request_info(c);
    if (ri->content_length > S->body_max) {
        *code = send_error(S, c, 413, NULL, "the body is %lld bytes; the limit is %lld (--max-body)",
                           (long long)ri->content_length, (long long)S->body_max);
        return NULL;
    }
    // a known length: that many bytes and no growth; chunked: grown as it comes, the limit checked each read
    const bool known = ri->content_length >= 0;
    size_t cap = known ? (size_t)ri->content_length + 1 : 65536, len = 0;
    char *buf = malloc(cap);
    serve_watch watch; // the body's clock (--body-timeout): ended before every return below
    serve_watch_begin(&S->watchdog, c, &watch);
    enum { BODY_OK, BODY_OOM, BODY_BIG, BODY_CUT } why = BODY_OK;
    for (;;) {
        if (!buf) {
            why = BODY_OOM;
            break;
        }
        if ((int64_t)len > S->body_max) {
            why = BODY_BIG;
            break;
        }
        if (known && len + 1 == cap) break; // all of it
        if (len + 1 == cap) {
            char *b = realloc(buf, cap * 2);
            if (!b) free(buf);
            buf = b;
            cap *= 2;
            continue;
        }
        const int n = mg_read(c, buf + len, cap - 1 - len);
        if (n < 0) why = BODY_CUT;
        if (n <= 0) break;
        len += (size_t)n;
    }
    const bool late = serve_watch_end(&S->watchdog, &watch);
    if (late || why != BODY_OK) {
        free(buf);
        if (late) // (what the read saw then is the shut socket's end)
            *code = send_error(S, c, 408, NULL, "the body did not arrive within %d s (--body-timeout)", S->body_timeout_s);
        else if (why == BODY_OOM)
            *code = send_error(S, c, 500, NULL, "out of memory");
        else if (why == BODY_BIG)
            *code = send_error(S, c, 413, NULL, "the body is over %lld bytes (--max-body)", (long long)S->body_max);
        else
            *code = send_error(S, c, 400, NULL, "the body could not be read (the connection ended early)");
        return NULL;
    }
    if (ri->content_length >= 0 && (int64_t)len != ri->content_length) {
        free(buf);
        *code = send_error(S, c, 400, NULL, "the body is %zu bytes, Content-Length says %lld", len,
                           (long long)ri->content_length);
        return NULL;
    }
    buf[len] = '\0';
    return buf;
}

// ---- routes -------------------------------------------------------------------------------

static int route(server *S, struct mg_connection *c) {
    const struct mg_request_info *ri = mg_get_request_info(c);
    const char *u = ri->local_uri ? ri->local_uri : "";
    const bool get = !strcmp(ri->request_method, "GET"), post = !strcmp(ri->request_method, "POST");
    if (!strcmp(u, "/health") || !strcmp(u, "/v1/health")) {
        if (!get) return send_error(S, c, 405, NULL, "%s takes GET", u);
        return send_json_text(c, 200, "{\"status\":\"ok\"}");
    }
    if (!strcmp(u, "/v1/models") || !strcmp(u, "/models")) {
        if (!get) return send_error(S, c, 405, NULL, "%s takes GET", u);
        cJSON *r = cJSON_CreateObject(), *d;
        cJSON_AddStringToObject(r, "object", "list");
        d = cJSON_AddArrayToObject(r, "data");
        cJSON *m = cJSON_CreateObject();
        cJSON_AddItemToArray(d, m);
        cJSON_AddStringToObject(m, "id", S->alias);
        cJSON_AddStringToObject(m, "object", "model");
        cJSON_AddNumberToObject(m, "created", (double)S->created);
        cJSON_AddStringToObject(m, "owned_by", "nanomind");
        if (S->stt) {
            cJSON *w = cJSON_CreateObject();
            cJSON_AddItemToArray(d, w);
            cJSON_AddStringToObject(w, "id", S->stt_alias);
            cJSON_AddStringToObject(w, "object", "model");
            cJSON_AddNumberToObject(w, "created", (double)S->created);
            cJSON_AddStringToObject(w, "owned_by", "nanomind");
        }
        return send_json(c, 200, r);
    }
    if (!authorized(S, c)) return send_error(S, c, 401, NULL, "a valid API key is needed (Authorization: Bearer KEY)");
    if (!strcmp(u, "/metrics")) {
        if (!get) return send_error(S, c, 405, NULL, "%s takes GET", u);
        char buf[16384];
        pthread_mutex_lock(&S->lock);
        const double cpu = cli_cpu_seconds() - S->cpu0, wall = cli_now() - S->t0;
        const double joules = cli_energy_run(&S->energy, cpu, wall, S->dram);
        int n = snprintf(buf, sizeof buf,
                               "# HELP nanomind_requests_total Generation requests served.\n# TYPE nanomind_requests_total counter\n"
                               "nanomind_requests_total %llu\n"
                               "# TYPE nanomind_errors_total counter\nnanomind_errors_total %llu\n"
                               "# TYPE nanomind_rejected_total counter\nnanomind_rejected_total %llu\n"
                               "# TYPE nanomind_prompt_tokens_total counter\nnanomind_prompt_tokens_total %llu\n"
                               "# TYPE nanomind_tokens_predicted_total counter\nnanomind_tokens_predicted_total %llu\n"
                               "# TYPE nanomind_requests_waiting gauge\nnanomind_requests_waiting %d\n"
                               "# TYPE nanomind_slots_busy gauge\nnanomind_slots_busy %d\n"
                               "# TYPE nanomind_slots_total gauge\nnanomind_slots_total %d\n"
                               "# TYPE nanomind_bytes_copied_total counter\nnanomind_bytes_copied_total %llu\n",
                               (unsigned long long)S->n_requests, (unsigned long long)S->n_errors,
                               (unsigned long long)S->n_rejected, (unsigned long long)S->n_prompt_tokens,
                               (unsigned long long)S->n_gen_tokens, S->turn.waiting, S->turn.busy, S->parallel,
                               (unsigned long long)nm_ledger_total(S->ledger));
        n += snprintf(buf + n, sizeof buf - (size_t)n,
                      "# HELP nanomind_energy_joules_total Energy since the start, modelled (docs/power.md): the CPU "
                      "time at the watts of %s, plus the DRAM traffic.\n"
                      "# TYPE nanomind_energy_joules_total counter\nnanomind_energy_joules_total{energy=\"modelled\"} %.6f\n"
                      "# TYPE nanomind_cpu_seconds_total counter\nnanomind_cpu_seconds_total %.6f\n"
                      "# TYPE nanomind_uptime_seconds gauge\nnanomind_uptime_seconds %.6f\n"
                      "# HELP nanomind_dram_bytes_total The decoder's DRAM traffic, its estimate for each request.\n"
                      "# TYPE nanomind_dram_bytes_total counter\nnanomind_dram_bytes_total %.0f\n",
                      S->energy.source, joules, cpu, wall, S->dram);
        nm_energy_reading er;
        if (S->meters && nm_energy_meters_read(S->meters, &er, NULL, 0) == NM_OK)
            for (int32_t k = 0; k < er.n && n < (int)sizeof buf - 256; k++) {
                char name[100]; // the label's value, escaped as Prometheus's text format wants (a sysfs label is free text)
                size_t j = 0;
                for (const char *q = er.name[k]; *q && j + 2 < sizeof name; q++) {
                    if (*q == '"' || *q == '\\' || *q == '\n') name[j++] = '\\';
                    name[j++] = *q == '\n' ? 'n' : *q;
                }
                name[j] = '\0';
                n += snprintf(buf + n, sizeof buf - (size_t)n,
                              "nanomind_energy_joules_total{energy=\"measured\",meter=\"%s\"} %.6f\n", name, er.joules[k]);
            }
        n += serve_audio_metrics(S, buf + n, sizeof buf - (size_t)n);
        n += serve_vision_metrics(S, buf + n, sizeof buf - (size_t)n);
        n += serve_hist_print(&S->lat_generation, "nanomind_request_seconds", "Generation requests answered: "
                              "seconds from the request's body to its last byte.", buf + n, sizeof buf - (size_t)n);
        n += serve_hist_print(&S->lat_first_token, "nanomind_first_token_seconds", "Generation requests answered: "
                              "seconds from the request's body to its first token.", buf + n, sizeof buf - (size_t)n);
        if (S->stt)
            n += serve_hist_print(&S->lat_transcription, "nanomind_transcription_seconds", "Transcriptions answered: "
                                  "seconds from the request to the transcript sent.", buf + n, sizeof buf - (size_t)n);
        if (S->tts)
            n += serve_hist_print(&S->lat_speech, "nanomind_speech_seconds", "Speech requests answered: seconds from "
                                  "the request to the last audio sent.", buf + n, sizeof buf - (size_t)n);
        pthread_mutex_unlock(&S->lock);
        mg_printf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: %d\r\n\r\n", n);
        mg_write(c, buf, (size_t)n);
        return 200;
    }
    const bool is_tr = !strcmp(u, "/v1/audio/translations") || !strcmp(u, "/audio/translations");
    if (!strcmp(u, "/v1/audio/speech") || !strcmp(u, "/audio/speech")) {
        if (!post) return send_error(S, c, 405, NULL, "%s takes POST", u);
        return handle_speech(S, c);
    }
    if (is_tr || !strcmp(u, "/v1/audio/transcriptions") || !strcmp(u, "/audio/transcriptions") ||
        !strcmp(u, "/inference")) {
        if (!post) return send_error(S, c, 405, NULL, "%s takes POST", u);
        return handle_transcription(S, c, is_tr);
    }
    const bool is_chat = !strcmp(u, "/v1/chat/completions") || !strcmp(u, "/chat/completions");
    if (is_chat || !strcmp(u, "/v1/completions") || !strcmp(u, "/completions")) {
        if (!post) return send_error(S, c, 405, NULL, "%s takes POST", u);
        return handle_generate(S, c, is_chat);
    }
    return send_error(S, c, 404, NULL, "no route %s %s", ri->request_method, u);
}

// Whether name (a Host header's, its port cut off) is a loopback name: localhost, 127.x.x.x or [::1].
static bool loopback_name(const char *name, size_t n) {
    if ((n == 9 && !strncasecmp(name, "localhost", 9)) || (n == 5 && !strncmp(name, "[::1]", 5)) ||
        (n == 3 && !strncmp(name, "::1", 3)))
        return true;
    if (n < 7 || strncmp(name, "127.", 4)) return false;
    for (size_t i = 4; i < n; i++)
        if (name[i] != '.' && (name[i] < '0' || name[i] > '9')) return false;
    return true;
}

// Whether the request's Host names this server. Bound to a loopback address, only loopback names do:
// a web page whose own name is made to resolve to 127.0.0.1 (DNS rebinding) sends its own name, and
// would otherwise drive the server as if it were one of its origin. Bound to any other address, any
// name (llama-server's practice: such a server is reached by names it cannot know). No Host: HTTP/1.0,
// never a browser's.
static bool host_ok(const server *S, struct mg_connection *c) {
    if (!S->loopback_only) return true;
    const char *h = mg_get_header(c, "Host");
    if (!h) return true;
    size_t n = strlen(h);
    const char *colon = strrchr(h, ':');
    if (colon && (h[0] != '[' || (colon > h && colon[-1] == ']')) && (h[0] == '[' || strchr(h, ':') == colon))
        n = (size_t)(colon - h); // (a port: after "]" for IPv6, or the one colon of a name)
    return loopback_name(h, n);
}

// Whether the request has two Content-Length headers that differ: which one frames the body is then
// ambiguous (civetweb takes one, a proxy in front may take the other: request smuggling).
static bool lengths_differ(struct mg_connection *c) {
    const struct mg_request_info *ri = mg_get_request_info(c);
    const char *first = NULL;
    for (int i = 0; i < ri->num_headers; i++) {
        if (strcasecmp(ri->http_headers[i].name, "Content-Length")) continue;
        const char *v = ri->http_headers[i].value ? ri->http_headers[i].value : "";
        if (first && strcmp(first, v)) return true;
        first = v;
    }
    return false;
}

static int on_request(struct mg_connection *c, void *cb) {
    server *S = cb;
    if (lengths_differ(c)) return send_error(S, c, 400, NULL, "two different Content-Length headers");
    if (!host_ok(S, c)) {
        const char *h = mg_get_header(c, "Host");
        return send_error(S, c, 403, NULL, "Host '%.64s' is not a name of this server (bound to %s: localhost, "
                          "127.x.x.x or [::1]; --host 0.0.0.0 takes any)", h ? h : "", S->host);
    }
    pthread_mutex_lock(&S->lock);
    const bool stopping = S->stopping;
    if (!stopping) S->active++;
    pthread_mutex_unlock(&S->lock);
    if (stopping) return send_error(S, c, 503, NULL, "the server is shutting down");
    const int r = route(S, c);
    pthread_mutex_lock(&S->lock);
    if (--S->active == 0) pthread_cond_broadcast(&S->idle);
    pthread_mutex_unlock(&S->lock);
    return r;
}

// ---- the command ----------------------------------------------------------------------------

// The keys of list (separated by commas or newlines, blanks around each dropped) added to S's.
// what: the flag, for the message. A list with no key in it is an error: the server would start
// open to anyone, which its user did not ask for.
static bool add_keys(server *S, const char *list, const char *what) {
    const int n0 = S->n_keys;
    for (const char *p = list; *p;) {
        const char *end = strpbrk(p, ",\n");
        if (!end) end = p + strlen(p);
        const char *q = p;
        while (q < end && (*q == ' ' || *q == '\t' || *q == '\r')) q++;
        size_t n = (size_t)(end - q);
        while (n > 0 && (q[n - 1] == '\r' || q[n - 1] == ' ' || q[n - 1] == '\t')) n--;
        if (n > 0) {
            if (S->n_keys >= MAX_KEYS) {
                fprintf(stderr, "error: more than %d API keys\n", MAX_KEYS);
                return false;
            }
            if (!(S->keys[S->n_keys++] = strndup(q, n))) return false;
        }
        p = *end ? end + 1 : end;
    }
    if (S->n_keys == n0) {
        fprintf(stderr, "error: %s holds no key (only commas and blanks): the server would answer without one\n",
                what);
        return false;
    }
    return true;
}

static bool take_own(server *S, int *argc, char **argv) {
    int w = 1;
    for (int i = 1; i < *argc; i++) {
        const char *a = argv[i];
        const bool has = i + 1 < *argc;
        if (!strcmp(a, "--host") || !strcmp(a, "-a") || !strcmp(a, "--alias") || !strcmp(a, "--api-key") ||
            !strcmp(a, "--api-key-file") || !strcmp(a, "--stt") || !strcmp(a, "--tts") || !strcmp(a, "--mmproj") ||
            !strcmp(a, "--mmproj-device") || !strcmp(a, "--image-dir") || !strcmp(a, "--sysfs")) {
            if (!has || !argv[i + 1][0]) {
                fprintf(stderr, "error: %s needs a value\n", a);
                return false;
            }
            const char *v = argv[++i];
            if ((!strcmp(a, "--stt") && !cli_part(a, NM_WITH_STT, CLI_PART_STT)) ||
                (!strcmp(a, "--tts") && !cli_part(a, NM_WITH_TTS, CLI_PART_TTS)) ||
                ((!strcmp(a, "--mmproj") || !strcmp(a, "--mmproj-device") || !strcmp(a, "--image-dir")) &&
                 !cli_part(a, NM_WITH_VISION, CLI_PART_VISION)))
                return false;
            if (!strcmp(a, "--host")) S->host = v;
            else if (!strcmp(a, "--stt")) S->stt_path = v;
            else if (!strcmp(a, "--mmproj")) S->mmproj = v;
            else if (!strcmp(a, "--mmproj-device")) S->mmproj_device = v;
            else if (!strcmp(a, "--image-dir")) S->image_dir = v;
            else if (!strcmp(a, "--sysfs")) S->sysfs = v;
            else if (!strcmp(a, "--tts")) {
                if (strcmp(v, "espeak") && strcmp(v, "espeak-ng")) {
                    fprintf(stderr, "error: --tts '%s': the engine is espeak (espeak-ng)\n", v);
                    return false;
                }
                S->tts_engine = "espeak-ng";
            }
            else if (!strcmp(a, "--api-key")) {
                char what[64];
                snprintf(what, sizeof what, "--api-key '%.40s'", v);
                if (!add_keys(S, v, what)) return false;
            } else if (!strcmp(a, "--api-key-file")) {
                // whole (a long file is not cut mid-key), up to 1 MiB; a pipe (<(pass show key)) is
                // read too, and a FIFO with no writer is an empty file, not a wait
                char *text = NULL, ferr[512];
                if (nm_infile_read(v, 1u << 20, NM_INFILE_STDIN | NM_INFILE_STREAM, &text, NULL, ferr, sizeof ferr) !=
                    NM_OK) {
                    fprintf(stderr, "error: --api-key-file: %s\n", ferr);
                    return false;
                }
                char what[PATH_MAX + 32];
                snprintf(what, sizeof what, "--api-key-file '%s'", v);
                const bool ok = add_keys(S, text, what);
                free(text);
                if (!ok) return false;
            } else S->alias = v;
        } else if (!strcmp(a, "--port") || !strcmp(a, "--parallel") || !strcmp(a, "-np") || !strcmp(a, "--queue") ||
                   !strcmp(a, "--timeout") || !strcmp(a, "-to") || !strcmp(a, "--body-timeout") || !strcmp(a, "--max-audio") ||
                   !strcmp(a, "--max-speech") || !strcmp(a, "--idle-timeout") || !strcmp(a, "--threads-http")) {
            int32_t v;
            const bool port = !strcmp(a, "--port"), par = !strcmp(a, "--parallel") || !strcmp(a, "-np");
            const bool at_least_1 = port || par || !strcmp(a, "--max-audio") || !strcmp(a, "--max-speech") ||
                                    !strcmp(a, "--idle-timeout") || !strcmp(a, "--threads-http");
            if (!has || !cli_arg_int(a, argv[i + 1], at_least_1 ? 1 : 0, port ? 65535 : 1000000, &v)) {
                if (!has) fprintf(stderr, "error: %s needs a value\n", a);
                return false;
            }
            i++;
            if (par && v > 256) {
                fprintf(stderr, "error: --parallel needs an integer in [1, 256], got '%s'\n", argv[i]);
                return false;
            }
            if (!strcmp(a, "--threads-http") && v > 4096) {
                fprintf(stderr, "error: --threads-http needs an integer in [1, 4096], got '%s'\n", argv[i]);
                return false;
            }
            if (!strcmp(a, "--queue") && v > 4096) { // (a waiting request holds an HTTP thread)
                fprintf(stderr, "error: --queue needs an integer in [0, 4096], got '%s'\n", argv[i]);
                return false;
            }
            if (port) S->port = v;
            else if (par) S->parallel = v;
            else if (!strcmp(a, "--queue")) S->queue_max = v;
            else if (!strcmp(a, "--max-audio")) S->audio_max_s = v;
            else if (!strcmp(a, "--max-speech")) S->speech_max_chars = v;
            else if (!strcmp(a, "--body-timeout")) S->body_timeout_s = v;
            else if (!strcmp(a, "--idle-timeout")) S->idle_timeout_s = v;
            else if (!strcmp(a, "--threads-http")) S->threads_http = v;
            else if (!par) S->timeout_s = v;
        } else if (!strcmp(a, "--max-image-pixels")) {
            int32_t v; // (at most 2^26, the image decoder's own limit)
            if (!has || !cli_arg_int(a, argv[i + 1], 1, 1 << 26, &v)) {
                if (!has) fprintf(stderr, "error: %s needs a value\n", a);
                return false;
            }
            i++;
            S->image_max_pixels = v;
        } else if (!strcmp(a, "--max-body")) {
            int32_t v;
            if (!has || !cli_arg_int(a, argv[i + 1], 1024, 1 << 30, &v)) {
                if (!has) fprintf(stderr, "error: --max-body needs a value\n");
                return false;
            }
            i++;
            S->body_max = v;
        } else if (!strcmp(a, "--metrics")) {
            // llama-server's switch for GET /metrics: always served here (launch scripts pass it)
        } else {
            argv[w++] = argv[i];
        }
    }
    *argc = w;
    return true;
}

int cmd_serve(int argc, char **argv) {
    server S;
    memset(&S, 0, sizeof S);
    S.host = "127.0.0.1";
    S.port = 8080;
    S.queue_max = 16;
    S.timeout_s = 600;
    S.idle_timeout_s = 10;
    S.body_timeout_s = 60;
    S.body_max = 8 << 20;
    S.audio_max_s = 1800;
    S.speech_max_chars = 4096;
    S.image_max_pixels = 4096 * 4096;
    S.parallel = 1;
    int rc = 2;
    if (!take_own(&S, &argc, argv)) goto keys;
    S.loopback_only = loopback_name(S.host, strlen(S.host));
    if (!cli_parse("serve", CLI_MPATH | CLI_MODEL | CLI_CTX | CLI_GEN | CLI_LANE | CLI_IMGTOK, argc, argv, &S.o, NULL)) goto keys;
    if (S.o.help) {
        usage(stdout);
        rc = 0;
        goto out;
    }
    if (S.o.version) {
        cli_print_version();
        rc = 0;
        goto out;
    }
    if (!S.o.model) {
        fprintf(stderr, "error: give the language model with -m FILE\n");
        goto out;
    }
    if (S.o.chat_tmpl && !nm_chat_template_known(S.o.chat_tmpl)) {
        fprintf(stderr, "error: unknown chat template '%s' (known: %s)\n", S.o.chat_tmpl, nm_chat_template_names());
        goto out;
    }
    rc = 1;
    char err[512];
    nm_status st;
    nm_model_params mp = nm_model_default_params();
    mp.n_threads = S.o.n_threads;
    mp.no_mmap = S.o.no_mmap;
    if ((st = nm_model_load(S.o.model, &mp, &S.m, err, sizeof err)) != NM_OK) {
        cli_load_error(S.o.model, st, err, CLI_WANT_LLM);
        goto out;
    }
    cli_mlock(&S.o);
    if (!S.alias) {
        const char *slash = strrchr(S.o.model, '/');
        S.alias = slash ? slash + 1 : S.o.model;
    }
    // (-n: the default max_tokens, -1 until the end or a full context; a token a slot, streamed as sampled)
    if (!(S.ledger = nm_ledger_create()) || !(S.alias_json = cJSON_CreateString(S.alias)) ||
        !(S.alias_text = cJSON_PrintUnformatted(S.alias_json))) {
        fprintf(stderr, "error: out of memory\n");
        goto out;
    }
    nm_brick_params lp = cli_llm_params(&S.o, S.m, S.ledger);
    lp.n_parallel = S.parallel;
    if (S.parallel > 1) { // llama-server's slots: -c is the whole cache, each sequence a share of it
        const int32_t train = nm_model_n_ctx_train(S.m);
        const int32_t total = S.o.n_ctx > 0 ? S.o.n_ctx : train > 0 && train < 4096 ? train : 4096; // (-c's default)
        lp.n_ctx = total / S.parallel;
        if (lp.n_ctx < 64) {
            fprintf(stderr, "error: -c %d over --parallel %d leaves %d positions a sequence (64 at least)\n", total,
                    S.parallel, lp.n_ctx);
            goto out;
        }
    }
    S.ep_server = nm_ledger_endpoint(S.ledger, "server");
    S.ep_llm = nm_ledger_endpoint(S.ledger, lp.name ? lp.name : "llm");
    pthread_mutex_init(&S.box_lock, NULL);
    pthread_cond_init(&S.box_cv, NULL);
    if (!serve_vision_start(&S) || !serve_gen_start(&S, &lp)) goto out; // the decoder (--mmproj: and the vision brick)
    cli_ctx_note(nm_brick_llm_ctx(nm_pipeline_brick(S.P, NM_BRICK_LLM)));
    if (!serve_audio_start(&S)) goto out; // --stt, --tts
    serve_turn_init(&S.turn, S.parallel);
    serve_turn_init(&S.tts_turn, 1);
    serve_turn_init(&S.stt_turn, 1);
    pthread_mutex_init(&S.lock, NULL);
    pthread_cond_init(&S.idle, NULL);
    S.created = time(NULL);
    if (!cli_energy_load(NULL, &S.energy)) goto out; // (the default profile: never fails)
    {
        char merr[512];
        if (nm_energy_meters_open(S.sysfs, true, &S.meters, merr, sizeof merr) != NM_OK ||
            nm_energy_meters_count(S.meters) == 0 || nm_energy_meters_start(S.meters, merr, sizeof merr) != NM_OK) {
            if (nm_energy_meters_count(S.meters) > 0) fprintf(stderr, "energy meters: %s: the energy is modelled only\n", merr);
            nm_energy_meters_free(S.meters);
            S.meters = NULL;
        } else {
            char d[2048];
            if (nm_energy_meters_describe(S.meters, d, sizeof d) > 0) fprintf(stderr, "energy meters:\n%s", d);
        }
    }
    S.t0 = cli_now();
    S.cpu0 = cli_cpu_seconds();
    // SIGTERM / SIGINT end the server: blocked here (every thread made after inherits it) and waited for below
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    char port[80], timeout[32], keep_alive[32], threads[16];
    snprintf(port, sizeof port, strchr(S.host, ':') ? "[%s]:%d" : "%s:%d", S.host, S.port); // (IPv6 in brackets)
    // civetweb serves a connection on one thread from its accept to its close (keep-alive included): every
    // request that may be decoded or wait its turn holds one, and the rest answer /health, /metrics and 429s
    // and hold the connections still sending their header or idle between requests (a thread is a 100 KB
    // stack, mostly untouched). Past them, connections wait in the listen backlog, each for at most
    // --idle-timeout: many idle or half-open clients delay the others by that, never starve them.
    int n_threads = S.parallel + S.queue_max + 64;
    if (n_threads < 256) n_threads = 256;
    if (S.threads_http) n_threads = S.threads_http;
    snprintf(threads, sizeof threads, "%d", n_threads);
    // request_timeout_ms is civetweb's one bound on a header's whole arrival (from the connection's first
    // wait: a header dripped a byte at a time is cut too), on each read of a body and on each write of an
    // answer; a handler's own work (the generation, the wait for a turn) is outside it.
    // keep_alive_timeout_ms replaces it for the wait before a connection's next request.
    snprintf(timeout, sizeof timeout, "%d", S.idle_timeout_s * 1000);
    snprintf(keep_alive, sizeof keep_alive, "%d", S.idle_timeout_s * 1000 < 500 ? S.idle_timeout_s * 1000 : 500);
    // tcp_nodelay: a reply's header and body, and each streamed token, are separate writes; with Nagle's
    // algorithm the second waits for the client's delayed ACK of the first (up to 40 ms each)
    // CORS off: civetweb answers a preflight (OPTIONS with an Origin) with Allow-Origin: * and the headers
    // asked for unless its allow-origin is empty; nothing here sends CORS headers, so a page of another
    // origin cannot read an answer
    const char *options[] = {"listening_ports", port, "num_threads", threads, "request_timeout_ms", timeout,
                             "keep_alive_timeout_ms", keep_alive, "listen_backlog", "1024", "connection_queue", "64",
                             "enable_keep_alive", "yes", "tcp_nodelay", "1", "access_control_allow_origin", "",
                             "access_control_allow_methods", "", "access_control_allow_headers", "", NULL};
    struct mg_callbacks cbs;
    memset(&cbs, 0, sizeof cbs);
    mg_init_library(0);
    if (!serve_watchdog_start(&S.watchdog, S.body_timeout_s))
        fprintf(stderr, "warning: no thread for the bodies' deadline: --body-timeout is not kept\n");
    struct mg_context *ctx = mg_start(&cbs, &S, options);
    if (!ctx) {
        fprintf(stderr, "error: cannot listen on %s:%d (in use, or not an address of this machine)\n", S.host, S.port);
        mg_exit_library();
        goto out;
    }
    mg_set_request_handler(ctx, "/", on_request, &S);
    fprintf(stderr, "serving %s on http://%s:%d (%d sequence%s at a time; Ctrl-C or SIGTERM stops)\n", S.alias, S.host,
            S.port, S.parallel, S.parallel > 1 ? "s" : "");
    int sig = 0;
    sigwait(&stop, &sig);
    fprintf(stderr, "%s: finishing the requests in flight\n", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += S.timeout_s;
    pthread_mutex_lock(&S.lock);
    S.stopping = true; // new requests: 503; those in flight end first (civetweb drops writes once stopped)
    while (S.active > 0 && pthread_cond_timedwait(&S.idle, &S.lock, &until) == 0) {
    }
    pthread_mutex_unlock(&S.lock);
    mg_stop(ctx);
    mg_exit_library();
    rc = 0;
out:
    serve_watchdog_stop(&S.watchdog); // (after mg_stop: no handler is left to end a watch)
    serve_gen_stop(&S);
    serve_audio_stop(&S);
    serve_vision_stop(&S);
    nm_energy_meters_free(S.meters);
    nm_ledger_free(S.ledger);
    cJSON_Delete(S.alias_json);
    free(S.alias_text);
    nm_model_free(S.m);
    cli_opts_free(&S.o);
keys:
    for (int k = 0; k < S.n_keys; k++) free(S.keys[k]);
    return rc;
}
