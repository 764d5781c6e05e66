// The server (server_impl.h): start and stop, HTTP through civetweb
// (Debian's libcivetweb: a thread per open connection and a blocking chunk
// writer, so a streamed answer is a loop in its handler), the routes, the
// replies, the bricks' turns, the keys and /metrics; JSON through cJSON.
//
// The decoder (with the vision encoder before it) is a pipeline (gen.c): a
// request waits its turn (`parallel` requests decode together, at most
// `queue` wait; more get 429), submits its prompt with its parameters (a new
// conversation at position 0: the prompt's leading tokens the cache already
// holds, a repeated system prompt, are not decoded again) and reads its
// answer back. A client that goes away cancels its request. Transcriptions
// and speech go through one-brick pipelines, a request at a time (audio.c).
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <time.h>

#include "core/clock.h"
#include "core/fail.h"
#include "server/server_impl.h"

void serve_log(const server *S, const char *fmt, ...) {
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (S->log) S->log(S->log_user, line);
    else fprintf(stderr, "%s\n", line);
}

double serve_now(void) { return nm_now_s(); }

double serve_cpu_seconds(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec * 1e-6;
}

// The modelled joules since the start: the CPU busy for cpu_s of its cores' time over wall_s, at the
// watts given, plus the decoder's DRAM traffic (docs/power.md). The lock held.
static double energy_run(const server *S, double cpu_s, double wall_s) {
    const nm_unit_profile u = {.idle_w = S->idle_w, .active_w = S->active_w};
    double busy = cpu_s / (S->n_cores > 0 ? S->n_cores : 1);
    if (busy > wall_s) busy = wall_s;
    return nm_energy_model_joules(&u, busy, wall_s, 1, S->dram, S->pj_byte);
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

// A chat through the server's template (malloc'd; NULL: *st says why, and the cause is logged). A Jinja
// template beyond the subset falls back to the built-in one the model names (logged once).
static char *format_chat(void *ctx, const nm_chat_msg *msgs, size_t n, const char *kwargs, nm_status *st) {
    server *S = ctx;
    char err[768], *text = NULL;
    const char *fallback = NULL;
    *st = nm_chat_text(S->m, S->chat_template, S->jinja, S->jinja_template, S->jinja_len, msgs, n, true, kwargs, &text,
                       &fallback, err, sizeof err);
    const char *which = S->jinja_name ? S->jinja_name : "the model's chat template";
    if (*st != NM_OK && *st != NM_ERR_NOMEM && S->jinja) serve_log(S, "error: %s: %s", which, err);
    pthread_mutex_lock(&S->lock);
    const bool say = fallback && !S->template_said;
    if (fallback) S->template_said = true;
    pthread_mutex_unlock(&S->lock);
    if (say)
        serve_log(S, "note: %s is beyond nanomind's Jinja subset (%s): formatting with the built-in '%s' template "
                  "instead", which, err, fallback);
    return text;
}

serve_env serve_env_of(server *S) {
    return (serve_env){.vision = S->has_vision, .image_dir_real = S->image_dir_real, .system = S->system,
                       .format = format_chat, .format_ctx = S, .jinja = S->jinja, .chat_kwargs = S->chat_kwargs,
                       .stop = (const char *const *)S->stop,
                       .n_stop = S->n_stop, .speech_max_chars = S->speech_max_chars, .piper = S->tts_piper};
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
int serve_turn_take(server *S, serve_turn *t) {
    pthread_mutex_lock(&S->lock);
    const bool room = t->waiting + t->busy < S->queue_max + t->slots;
    if (!room) {
        S->n_rejected++;
        pthread_mutex_unlock(&S->lock);
        return 429;
    }
    const uint64_t ticket = t->next_ticket++;
    t->waiting++;
    while ((t->busy >= t->slots || ticket != t->serving) && !S->abandon) pthread_cond_wait(&t->free, &S->lock);
    if (S->abandon) { // (the stop's time is up: the requests still waiting are not served)
        t->waiting--;
        pthread_mutex_unlock(&S->lock);
        return 503;
    }
    t->serving++;
    t->waiting--;
    t->busy++;
    if (t->waiting > 0 && t->busy < t->slots) pthread_cond_broadcast(&t->free); // the next ticket may go too
    pthread_mutex_unlock(&S->lock);
    return 0;
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

// A model of /v1/models (OpenAI's object) into the array d.
static void add_model(const server *S, cJSON *d, const char *id) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddItemToArray(d, m);
    cJSON_AddStringToObject(m, "id", id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)S->created);
    cJSON_AddStringToObject(m, "owned_by", "nanomind");
}

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
        add_model(S, d, S->alias);
        if (S->stt) add_model(S, d, S->stt_alias);
        return send_json(c, 200, r);
    }
    if (!authorized(S, c)) return send_error(S, c, 401, NULL, "a valid API key is needed (Authorization: Bearer KEY)");
    if (!strcmp(u, "/metrics")) {
        if (!get) return send_error(S, c, 405, NULL, "%s takes GET", u);
        char buf[16384];
        pthread_mutex_lock(&S->lock);
        const double cpu = serve_cpu_seconds() - S->cpu0, wall = serve_now() - S->t0;
        const double joules = energy_run(S, cpu, wall);
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
                      S->energy_source, joules, cpu, wall, S->dram);
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

// ---- start and stop -------------------------------------------------------------------------------

nm_server_params nm_server_default_params(void) {
    return (nm_server_params){.host = "127.0.0.1", .port = 8080, .parallel = 1, .queue = 16, .idle_timeout_s = 10,
                              .body_timeout_s = 60, .body_max = 8 << 20, .image_max_pixels = 4096 * 4096,
                              .audio_max_s = 1800, .speech_max_chars = 4096, .idle_w = 1, .active_w = 1,
                              .reasoning_format = NM_REASONING_DEEPSEEK};
}

// s copied (NULL stays NULL); false when out of memory.
static bool dup_to(char **out, const char *s) {
    *out = s ? strdup(s) : NULL;
    return !s || *out;
}

// The parameters checked and copied into S; false with err.
static nm_status take_params(server *S, const nm_server_params *p, char *err, size_t err_size) {
    if (!p->llm) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "server: no llm brick");
    const int32_t big = 1000000; // (seconds; times 1000 fits civetweb's milliseconds)
    if (p->parallel < 1 || p->parallel > 256 || p->queue < 0 || p->queue > 4096 || p->n_api_keys < 0 ||
        p->n_api_keys > MAX_KEYS || p->n_stop < 0 || p->n_stop > NM_LLM_MAX_STOP || p->idle_timeout_s < 1 ||
        p->idle_timeout_s > big || p->body_timeout_s < 0 || p->body_timeout_s > big || p->body_max < 1024 ||
        p->body_max > (1 << 30) || p->threads_http < 0 || p->threads_http > 4096 || p->port < 0 || p->port > 65535 ||
        p->image_max_pixels < 1 || p->image_max_pixels > (1 << 26) || p->audio_max_s < 1 || p->audio_max_s > big ||
        p->speech_max_chars < 1 || (p->reasoning_format != NM_REASONING_NONE && p->reasoning_format != NM_REASONING_DEEPSEEK))
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "server: a parameter out of range (parallel 1..256, queue "
                       "0..4096, at most %d keys and %d stop strings, port 0..65535, threads_http 0..4096, body_max "
                       "1 KiB..1 GiB, image_max_pixels 1..2^26, timeouts and audio_max_s up to %d s, reasoning_format 0..1)", MAX_KEYS,
                       NM_LLM_MAX_STOP, big);
    char why[256];
    nm_status kst;
    if (p->chat_template_kwargs && (kst = nm_chat_kwargs_check(p->chat_template_kwargs, p->jinja, why, sizeof why)))
        return nm_fail(kst, err, err_size, "server: %s", why);
    const char *host = p->host ? p->host : "127.0.0.1", *model = p->llm->model;
    const char *slash = model ? strrchr(model, '/') : NULL;
    const char *alias = p->alias ? p->alias : slash ? slash + 1 : model ? model : "model";
    bool ok = dup_to(&S->host_own, host) && dup_to(&S->alias_own, alias) && dup_to(&S->system_own, p->system_prompt) &&
              dup_to(&S->chat_template, p->chat_template) && dup_to(&S->jinja_name, p->jinja_name) &&
              dup_to(&S->chat_kwargs, p->chat_template_kwargs) &&
              dup_to(&S->image_dir_own, p->image_dir) && dup_to(&S->sysfs_own, p->sysfs) &&
              dup_to(&S->energy_source, p->energy_source ? p->energy_source : "the watts given");
    if (ok && p->jinja_template && (S->jinja_template = malloc(p->jinja_len + 1))) {
        memcpy(S->jinja_template, p->jinja_template, p->jinja_len);
        S->jinja_template[p->jinja_len] = '\0';
    } else if (p->jinja_template) {
        ok = false;
    }
    for (int32_t k = 0; ok && k < p->n_api_keys; k++) ok = dup_to(&S->keys[S->n_keys++], p->api_keys[k]);
    for (int32_t k = 0; ok && k < p->n_stop; k++) ok = dup_to(&S->stop[S->n_stop++], p->stop[k]);
    if (!ok) return nm_fail(NM_ERR_NOMEM, err, err_size, "server: out of memory");
    S->host = S->host_own, S->alias = S->alias_own, S->system = S->system_own;
    S->image_dir = S->image_dir_own, S->sysfs = S->sysfs_own;
    S->jinja = p->jinja, S->jinja_len = p->jinja_len, S->reasoning_split = p->reasoning_format == NM_REASONING_DEEPSEEK;
    S->port = p->port, S->queue_max = p->queue, S->parallel = p->parallel;
    S->idle_timeout_s = p->idle_timeout_s, S->body_timeout_s = p->body_timeout_s, S->threads_http = p->threads_http;
    S->body_max = p->body_max, S->image_max_pixels = p->image_max_pixels;
    S->audio_max_s = p->audio_max_s, S->speech_max_chars = p->speech_max_chars;
    S->idle_w = p->idle_w, S->active_w = p->active_w, S->pj_byte = p->pj_byte, S->n_cores = p->n_cores;
    if (S->n_cores <= 0) S->n_cores = nm_cpu_count();
    S->log = p->log, S->log_user = p->log_user;
    S->loopback_only = loopback_name(S->host, strlen(S->host));
    return NM_OK;
}

// The energy meters of the machine (sysfs), running from now; none: the energy is modelled only.
static void meters_open(server *S) {
    char merr[512];
    if (nm_energy_meters_open(S->sysfs, true, &S->meters, merr, sizeof merr) != NM_OK ||
        nm_energy_meters_count(S->meters) == 0 || nm_energy_meters_start(S->meters, merr, sizeof merr) != NM_OK) {
        if (nm_energy_meters_count(S->meters) > 0) serve_log(S, "energy meters: %s: the energy is modelled only", merr);
        nm_energy_meters_free(S->meters);
        S->meters = NULL;
        return;
    }
    char d[2048];
    if (nm_energy_meters_describe(S->meters, d, sizeof d) > 0) {
        const size_t n = strlen(d);
        if (n && d[n - 1] == '\n') d[n - 1] = '\0';
        serve_log(S, "energy meters:\n%s", d);
    }
}

// What start made, undone (after mg_stop: no handler is left).
static void release(server *S) {
    serve_watchdog_stop(&S->watchdog); // (no handler is left to end a watch)
    serve_gen_stop(S);
    serve_audio_stop(S);
    serve_vision_stop(S);
    nm_energy_meters_free(S->meters);
    nm_ledger_free(S->ledger);
    cJSON_Delete(S->alias_json);
    free(S->alias_text);
    free(S->host_own), free(S->alias_own), free(S->system_own), free(S->chat_template), free(S->jinja_template);
    free(S->jinja_name), free(S->image_dir_own), free(S->sysfs_own), free(S->energy_source), free(S->chat_kwargs);
    for (int k = 0; k < S->n_keys; k++) free(S->keys[k]);
    for (int k = 0; k < S->n_stop; k++) free(S->stop[k]);
    pthread_mutex_destroy(&S->lock), pthread_mutex_destroy(&S->box_lock);
    pthread_cond_destroy(&S->idle), pthread_cond_destroy(&S->box_cv);
    pthread_cond_destroy(&S->turn.free), pthread_cond_destroy(&S->stt_turn.free), pthread_cond_destroy(&S->tts_turn.free);
    free(S);
}

nm_status nm_server_start(const nm_server_params *p, nm_server **out, char *err, size_t err_size) {
    if (!out || !p) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "server: no parameters or no place for it");
    *out = NULL;
    server *S = calloc(1, sizeof *S);
    if (!S) return nm_fail(NM_ERR_NOMEM, err, err_size, "server: out of memory");
    pthread_mutex_init(&S->lock, NULL);
    pthread_mutex_init(&S->box_lock, NULL);
    pthread_cond_init(&S->box_cv, NULL);
    pthread_cond_init(&S->idle, NULL);
    serve_turn_init(&S->turn, p->parallel > 0 ? p->parallel : 1);
    serve_turn_init(&S->tts_turn, 1);
    serve_turn_init(&S->stt_turn, 1);
    nm_status st = take_params(S, p, err, err_size);
    if (st == NM_OK && (!(S->ledger = nm_ledger_create()) || !(S->alias_json = cJSON_CreateString(S->alias)) ||
                        !(S->alias_text = cJSON_PrintUnformatted(S->alias_json))))
        st = nm_fail(NM_ERR_NOMEM, err, err_size, "server: out of memory");
    if (st != NM_OK) {
        release(S);
        return st;
    }
    nm_brick_params lp = *p->llm; // (the decoder's: n_parallel sequences, the server's ledger)
    lp.n_parallel = S->parallel;
    S->ep_server = nm_ledger_endpoint(S->ledger, "server");
    S->ep_llm = nm_ledger_endpoint(S->ledger, lp.name ? lp.name : "llm");
    S->has_vision = p->vision != NULL;
    if ((st = serve_vision_start(S, err, err_size)) != NM_OK ||
        (st = serve_gen_start(S, &lp, p->vision, err, err_size)) != NM_OK ||
        (st = serve_audio_start(S, p->stt, p->tts, err, err_size)) != NM_OK) {
        release(S);
        return st; // (err names the part)
    }
    nm_brick *llm = nm_pipeline_brick(S->P, NM_BRICK_LLM);
    S->m = nm_brick_llm_model(llm);
    if (nm_ctx_device_note(nm_brick_llm_ctx(llm))[0]) serve_log(S, "note: %s", nm_ctx_device_note(nm_brick_llm_ctx(llm)));
    S->created = time(NULL);
    meters_open(S);
    S->t0 = serve_now();
    S->cpu0 = serve_cpu_seconds();
    char port[80], timeout[32], keep_alive[32], threads[16];
    snprintf(port, sizeof port, strchr(S->host, ':') ? "[%s]:%d" : "%s:%d", S->host, S->port); // (IPv6 in brackets)
    // civetweb serves a connection on one thread from its accept to its close (keep-alive included): every
    // request that may be decoded or wait its turn holds one, and the rest answer /health, /metrics and 429s
    // and hold the connections still sending their header or idle between requests (a thread is a 100 KB
    // stack, mostly untouched). Past them, connections wait in the listen backlog, each for at most
    // --idle-timeout: many idle or half-open clients delay the others by that, never starve them.
    int n_threads = S->parallel + S->queue_max + 64;
    if (n_threads < 256) n_threads = 256;
    if (S->threads_http) n_threads = S->threads_http;
    snprintf(threads, sizeof threads, "%d", n_threads);
    // request_timeout_ms is civetweb's one bound on a header's whole arrival (from the connection's first
    // wait: a header dripped a byte at a time is cut too), on each read of a body and on each write of an
    // answer; a handler's own work (the generation, the wait for a turn) is outside it.
    // keep_alive_timeout_ms replaces it for the wait before a connection's next request.
    snprintf(timeout, sizeof timeout, "%d", S->idle_timeout_s * 1000);
    snprintf(keep_alive, sizeof keep_alive, "%d", S->idle_timeout_s * 1000 < 500 ? S->idle_timeout_s * 1000 : 500);
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
    if (!serve_watchdog_start(&S->watchdog, S->body_timeout_s))
        serve_log(S, "warning: no thread for the bodies' deadline: --body-timeout is not kept");
    if (!(S->ctx = mg_start(&cbs, S, options))) {
        nm_fail(NM_ERR_IO, err, err_size, "listen: cannot listen on %s:%d (in use, or not an address of this machine)",
                S->host, S->port);
        mg_exit_library();
        release(S);
        return NM_ERR_IO;
    }
    struct mg_server_port sp;
    if (mg_get_server_ports(S->ctx, 1, &sp) == 1 && sp.port > 0) S->port = sp.port; // (port 0: the one chosen)
    mg_set_request_handler(S->ctx, "/", on_request, S);
    *out = S;
    return NM_OK;
}

int32_t nm_server_port(const nm_server *s) { return s ? s->port : 0; }

void nm_server_stop(nm_server *S, int32_t timeout_s) {
    if (!S) return;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += timeout_s > 0 ? timeout_s : 0;
    pthread_mutex_lock(&S->lock);
    S->stopping = true; // new requests: 503; those in flight end first (civetweb drops writes once stopped)
    while (S->active > 0 && pthread_cond_timedwait(&S->idle, &S->lock, &until) == 0) {
    }
    // the time is up: the requests still waiting for a turn get 503, those in a pipeline are cancelled
    S->abandon = true;
    serve_turn *turns[] = {&S->turn, &S->stt_turn, &S->tts_turn};
    for (int k = 0; k < 3; k++) pthread_cond_broadcast(&turns[k]->free);
    const uint64_t stt_id = S->stt_id, tts_id = S->tts_id;
    pthread_mutex_unlock(&S->lock);
    if (stt_id) nm_pipeline_cancel(S->stt_P, stt_id);
    if (tts_id) nm_pipeline_cancel(S->tts_P, tts_id);
    pthread_mutex_lock(&S->box_lock);
    for (int32_t i = 0; S->boxes && i < S->parallel; i++)
        if (S->boxes[i].id) nm_pipeline_cancel(S->P, S->boxes[i].id);
    pthread_mutex_unlock(&S->box_lock);
    mg_stop(S->ctx);
    mg_exit_library();
    release(S);
}
