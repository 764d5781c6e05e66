// The server's generation routes (POST /v1/chat/completions and
// /v1/completions) as a client of the server's pipeline (docs/server.md): the
// LLM brick, decoding --parallel requests together, with --mmproj the vision
// brick before it. A request formats its prompt (req.c), submits it with
// its parameters and images, and takes its answer's pieces from its box: the
// pipeline's delivery thread (params.on_event) hands each piece to the box of
// its request, so a slow client never holds the others.
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/fail.h"
#include "server/server_impl.h"
#include "bricks/llm/think.h"

// ---- the pipeline's events, each into its request's box -----------------------------------

// A piece of request b's answer into its box: copied once, counted (llm -> server). The lock held.
static void box_put(server *S, serve_box *b, const char *p, size_t n) {
    if (b->n + n > b->cap) {
        const size_t cap = (b->n + n) * 2 + 256;
        char *t = realloc(b->text, cap);
        if (!t) {
            b->lost = true; // (out of memory: the request ends failed)
            return;
        }
        b->text = t, b->cap = cap;
    }
    if (b->n_end == b->cap_end) {
        const int32_t cap = b->cap_end * 2 + 16;
        size_t *e = realloc(b->end, sizeof *e * (size_t)cap);
        if (!e) {
            b->lost = true;
            return;
        }
        b->end = e, b->cap_end = cap;
    }
    nm_ledger_copy(S->ledger, S->ep_llm, S->ep_server, b->text + b->n, p, n);
    b->n += n;
    b->end[b->n_end++] = b->n;
    if (b->t_first == 0) b->t_first = serve_now();
}

// The pipeline's events (params.on_event): each request's text pieces and its
// DONE into its box (an event of no box, its handler gone, is dropped).
static void on_event(const nm_pipeline_event *ev, void *arg) {
    server *S = arg;
    if (ev->kind != NM_PIPELINE_TEXT && ev->kind != NM_PIPELINE_DONE) return;
    pthread_mutex_lock(&S->box_lock);
    serve_box *b = NULL;
    for (int32_t i = 0; i < S->parallel && !b; i++)
        if (S->boxes[i].id == ev->request) b = &S->boxes[i];
    if (b && ev->kind == NM_PIPELINE_TEXT) {
        box_put(S, b, ev->text, ev->len);
    } else if (b) {
        b->ended = true;
        b->status = ev->status, b->stop = ev->stop;
        b->n_prompt = ev->n_prompt, b->n_tokens = ev->n_tokens, b->n_cached = ev->n_cached;
        snprintf(b->err, sizeof b->err, "%s", ev->text ? ev->text : "");
    }
    pthread_cond_broadcast(&S->box_cv);
    pthread_mutex_unlock(&S->box_lock);
}

// Waits up to wait_s for box b's pieces or its end, then swaps its pieces
// into *got (whose emptied buffers b takes in exchange). True once b has
// ended: its figures are in *got.
static bool box_wait(server *S, serve_box *b, serve_box *got, double wait_s) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    const long ns = until.tv_nsec + (long)(wait_s * 1e9);
    until.tv_sec += ns / 1000000000, until.tv_nsec = ns % 1000000000;
    pthread_mutex_lock(&S->box_lock);
    if (b->n_end == 0 && !b->ended) pthread_cond_timedwait(&S->box_cv, &S->box_lock, &until);
    char *t = got->text;
    size_t cap = got->cap, *e = got->end;
    int32_t cap_end = got->cap_end;
    got->text = b->text, got->cap = b->cap, got->n = b->n, got->end = b->end, got->cap_end = b->cap_end;
    got->n_end = b->n_end;
    b->text = t, b->cap = cap, b->end = e, b->cap_end = cap_end, b->n = 0, b->n_end = 0;
    got->t_first = b->t_first;
    const bool ended = b->ended;
    if (ended) {
        got->lost = b->lost, got->status = b->status, got->stop = b->stop;
        got->n_prompt = b->n_prompt, got->n_tokens = b->n_tokens, got->n_cached = b->n_cached;
        memcpy(got->err, b->err, sizeof got->err);
    }
    pthread_mutex_unlock(&S->box_lock);
    return ended;
}

nm_status serve_gen_start(server *S, const nm_brick_params *lp, const nm_brick_params *vp, char *err, size_t err_size) {
    nm_pipeline_params pp = nm_pipeline_default_params();
    pp.llm = lp;
    pp.vision = vp;
    pp.ledger = S->ledger;
    pp.chat = false; // (the prompt comes formatted: req.c)
    pp.queue = S->parallel + 1; // (a request submits holding the decoder's turn: submit never waits)
    pp.on_event = on_event;
    pp.on_event_user = S;
    if (!(S->boxes = calloc((size_t)S->parallel, sizeof *S->boxes)))
        return nm_fail(NM_ERR_NOMEM, err, err_size, "server: out of memory");
    return nm_pipeline_create(&pp, &S->P, err, err_size); // ("llm: ...", "vision: ...")
}

void serve_gen_stop(server *S) {
    if (S->P) nm_pipeline_close(S->P); // (its last event given: every box still open ends lost)
    if (S->boxes) {
        pthread_mutex_lock(&S->box_lock);
        for (int32_t i = 0; i < S->parallel; i++)
            if (S->boxes[i].id && !S->boxes[i].ended) S->boxes[i].ended = S->boxes[i].lost = true;
        pthread_cond_broadcast(&S->box_cv);
        pthread_mutex_unlock(&S->box_lock);
    }
    nm_pipeline_free(S->P);
    S->P = NULL;
    for (int32_t i = 0; S->boxes && i < S->parallel; i++) free(S->boxes[i].text), free(S->boxes[i].end);
    free(S->boxes);
    S->boxes = NULL;
}

// ---- the decoder's turn -----------------------------------------------------------------

// A token's text as it goes out: up to 256 bytes of the model's, each stray byte written as U+FFFD's 3.
#define SERVE_PIECE_MAX (3 * 256)

typedef struct gen {
    server *S;
    struct mg_connection *c;
    // an error found while decoding, sent once the decoder's turn is given back (so that a client that has
    // its reply finds the decoder free: --queue 0 does not refuse its next request). The message is
    // allocated: this struct lives on a civetweb thread's 100 KB stack, which every route shares.
    int err_code;
    const char *err_param;
    char *err_msg;
    bool chat, stream, usage_in_stream;
    uint64_t id;       // the server's (its answer's id), and the pipeline's
    uint64_t pid;
    char cid[48];
    long long created; // the answer's time (OpenAI's `created`: when the request was taken)
    int32_t n_prompt, n_tokens;
    nm_llm_stop why;
    bool gone; // the client went away
    int fd;    // a whole (not streamed) answer's socket, watched for the client leaving; -1: none
    double t0, t_first; // the body read, the first token come (0: none)
    char *text;
    size_t len, cap;
    // a chat's thinking kept out of its content (--reasoning-format deepseek): split as it comes, the
    // reasoning streamed as delta.reasoning_content, or kept for message.reasoning_content
    bool split;
    nm_think think;
    char *rtext;
    size_t rlen, rcap;
    // stop strings: the text is cut before the first (OpenAI's stop is not part of the answer); what may
    // still begin one is held back until it cannot
    const char *stop[NM_LLM_MAX_STOP];
    int n_stop;
    char held[NM_LLM_MAX_STOP_LEN + SERVE_PIECE_MAX];
    size_t n_held;
    bool stopped;
    // a streamed token's event, written in place: the chunk's JSON up to the text (made once a request),
    // the text escaped, the rest (nothing allocated a token)
    char *ev, *ev_r; // (ev_r: a reasoning chunk's)
    size_t n_pre, n_pre_r;
} gen;

#define EV_TEXT_MAX (6 * (NM_LLM_MAX_STOP_LEN + SERVE_PIECE_MAX)) // the largest piece, every byte escaped as \u00XX
#define EV_SUFFIX_CHAT "\"},\"finish_reason\":null}]}\n\n"
#define EV_SUFFIX_TEXT "\",\"finish_reason\":null}]}\n\n"

// The streamed chunks' common start, into g->ev (malloc'd once a request). False: out of memory.
static bool ev_begin(gen *g) {
    char pre[512];
    const int n = snprintf(pre, sizeof pre, "data: {\"id\":\"%s\",\"object\":\"%s\",\"created\":%lld,\"model\":", g->cid,
                           g->chat ? "chat.completion.chunk" : "text_completion", g->created);
    const char *tail = g->chat ? ",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" : ",\"choices\":[{\"index\":0,\"text\":\"";
    const char *tail_r = ",\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"";
    g->n_pre = (size_t)n + strlen(g->S->alias_text) + strlen(tail);
    g->n_pre_r = (size_t)n + strlen(g->S->alias_text) + strlen(tail_r);
    if (!(g->ev = malloc(g->n_pre + EV_TEXT_MAX + sizeof EV_SUFFIX_CHAT))) return false;
    snprintf(g->ev, g->n_pre + 1, "%s%s%s", pre, g->S->alias_text, tail);
    if (g->split) {
        if (!(g->ev_r = malloc(g->n_pre_r + EV_TEXT_MAX + sizeof EV_SUFFIX_CHAT))) return false;
        snprintf(g->ev_r, g->n_pre_r + 1, "%s%s%s", pre, g->S->alias_text, tail_r);
    }
    return true;
}

// One piece of text (or of reasoning) as a streamed chunk: escaped for JSON after the common start.
static void ev_send(gen *g, bool reasoning, const char *p, int32_t n) {
    static const char hex[] = "0123456789abcdef";
    char *ev = reasoning ? g->ev_r : g->ev, *o = ev + (reasoning ? g->n_pre_r : g->n_pre);
    for (int32_t i = 0; i < n; i++) {
        const unsigned char ch = (unsigned char)p[i];
        if (ch == '"' || ch == '\\') {
            *o++ = '\\';
            *o++ = (char)ch;
        } else if (ch == '\n') {
            *o++ = '\\';
            *o++ = 'n';
        } else if (ch < 0x20) {
            memcpy(o, "\\u00", 4);
            o[4] = hex[ch >> 4];
            o[5] = hex[ch & 15];
            o += 6;
        } else {
            *o++ = (char)ch;
        }
    }
    const char *suffix = g->chat ? EV_SUFFIX_CHAT : EV_SUFFIX_TEXT;
    const size_t ns = strlen(suffix);
    memcpy(o, suffix, ns);
    if (mg_send_chunk(g->c, ev, (unsigned)(o + ns - ev)) <= 0) g->gone = true;
}

bool serve_sse(struct mg_connection *c, cJSON *obj) {
    char *t = cJSON_PrintUnformatted(obj);
    cJSON_Delete(obj);
    if (!t) return false;
    const size_t n = strlen(t);
    char *ev = malloc(n + 9);
    bool ok = ev != NULL;
    if (ok) {
        memcpy(ev, "data: ", 6);
        memcpy(ev + 6, t, n);
        memcpy(ev + 6 + n, "\n\n", 3);
        ok = mg_send_chunk(c, ev, (unsigned)(n + 8)) > 0;
    }
    free(ev);
    free(t);
    return ok;
}

static bool sse(gen *g, cJSON *obj) { return serve_sse(g->c, obj); }

static const char *finish_reason(nm_llm_stop why) {
    return why == NM_LLM_STOP_N_PREDICT || why == NM_LLM_STOP_CTX_FULL ? "length" : "stop";
}

// A chunk or a whole answer's envelope: id, object, created, model, choices[0].
static cJSON *envelope(const gen *g, bool chunk, cJSON **choice) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "id", g->cid);
    cJSON_AddStringToObject(r, "object", g->chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion");
    cJSON_AddNumberToObject(r, "created", (double)g->created);
    cJSON_AddStringToObject(r, "model", g->S->alias);
    cJSON *cs = cJSON_AddArrayToObject(r, "choices");
    *choice = cJSON_CreateObject();
    cJSON_AddItemToArray(cs, *choice);
    cJSON_AddNumberToObject(*choice, "index", 0);
    return r;
}

static void add_usage(const gen *g, cJSON *r) {
    cJSON *u = cJSON_AddObjectToObject(r, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", g->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", g->n_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", g->n_prompt + g->n_tokens);
}

// A piece of the answer's content or reasoning: streamed as a chunk, or kept for the whole reply.
static void emit_as(gen *g, bool reasoning, const char *p, size_t n) {
    if (n == 0) return;
    if (g->stream) {
        if (!g->gone) ev_send(g, reasoning, p, (int32_t)n);
        return;
    }
    char **text = reasoning ? &g->rtext : &g->text;
    size_t *len = reasoning ? &g->rlen : &g->len, *cap = reasoning ? &g->rcap : &g->cap;
    if (*len + n + 1 > *cap) {
        size_t c = *cap * 2 + n + 64;
        char *t = realloc(*text, c);
        if (!t) return;
        *text = t;
        *cap = c;
    }
    memcpy(*text + *len, p, n);
    *len += n;
    (*text)[*len] = '\0';
}

static void think_out(void *user, bool reasoning, const char *p, size_t n) { emit_as(user, reasoning, p, n); }

// A piece of the answer past the stop strings: through the thinking's split where the chat has it.
static void emit(gen *g, const char *p, int32_t n) {
    if (g->split) nm_think_feed(&g->think, p, n > 0 ? (size_t)n : 0, false, think_out, g);
    else if (n > 0) emit_as(g, false, p, (size_t)n);
}

// A piece through the stop strings: cut before a whole one (and nothing after it), hold back a tail that
// may begin one. end: the answer is over (what is held goes out).
static void piece(gen *g, const char *p, int32_t n, bool end) {
    if (g->stopped) return;
    if (g->n_stop == 0) {
        emit(g, p, n);
        return;
    }
    if (g->n_held + (size_t)n > sizeof g->held) { // (a piece longer than any stop string: the held part goes)
        emit(g, g->held, (int32_t)g->n_held);
        g->n_held = 0;
    }
    if ((size_t)n > sizeof g->held) {
        emit(g, p, n);
        return;
    }
    memcpy(g->held + g->n_held, p, (size_t)n);
    g->n_held += (size_t)n;
    size_t cut = g->n_held; // the first stop string's start
    for (int k = 0; k < g->n_stop; k++) {
        const size_t sl = strlen(g->stop[k]);
        for (size_t i = 0; sl && i + sl <= g->n_held && i < cut; i++)
            if (!memcmp(g->held + i, g->stop[k], sl)) cut = i;
    }
    if (cut < g->n_held) {
        emit(g, g->held, (int32_t)cut);
        g->stopped = true;
        g->n_held = 0;
        return;
    }
    size_t keep = 0; // the longest tail that begins a stop string
    for (int k = 0; k < g->n_stop && !end; k++) {
        const size_t sl = strlen(g->stop[k]);
        for (size_t t = sl > 1 ? sl - 1 : 0; t > keep; t--)
            if (t <= g->n_held && !memcmp(g->held + g->n_held - t, g->stop[k], t)) {
                keep = t;
                break;
            }
    }
    emit(g, g->held, (int32_t)(g->n_held - keep));
    memmove(g->held, g->held + g->n_held - keep, keep);
    g->n_held = keep;
}


// The request's error reply, kept until the decoder's turn is given back (gen.err_code).
static bool fail_later(gen *g, int code, const char *param, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static bool fail_later(gen *g, int code, const char *param, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    free(g->err_msg);
    g->err_msg = strdup(msg);
    g->err_code = code, g->err_param = param;
    return false;
}

// A piece of the answer as it goes out: cut at characters into pieces of at most 256 bytes, each stray
// byte written as U+FFFD (JSON carries valid UTF-8 only), through the stop strings.
static void out_piece(gen *g, const char *p, size_t n) {
    while (n > 0) {
        size_t k = n < 256 ? n : 256;
        while (k < n && k > 253 && ((unsigned char)p[k] & 0xc0) == 0x80) k--; // (not inside a character)
        char q[SERVE_PIECE_MAX];
        piece(g, q, (int32_t)serve_utf8_clean(p, k, q), false);
        p += k, n -= k;
    }
}

// A failure after a stream's headers: an error event, as llama-server sends (nothing where the client left).
static void stream_error(gen *g, const char *msg) {
    if (g->gone) return;
    cJSON *r = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(r, "error");
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type", "server_error");
    sse(g, r);
}

// Submits the request (its parameters' JSON, the prompt, its images' bytes)
// and reads its answer from its box. False with the error kept (fail_later)
// where it failed before its answer began (or a whole answer failed).
static bool decode(gen *g, cJSON *params, const char *prompt, const serve_images *im) {
    server *S = g->S;
    char *pj = cJSON_PrintUnformatted(params);
    if (!pj) return fail_later(g, 500, NULL, "out of memory");
    nm_pipeline_image img[NM_PIPELINE_MAX_IMAGES];
    void *bytes[NM_PIPELINE_MAX_IMAGES] = {0};
    char err[600];
    bool ok = true;
    for (int k = 0; k < im->n && ok; k++) {
        size_t n = 0;
        const nm_status ist = serve_image_bytes(S, &im->v[k], &bytes[k], &n, err, sizeof err);
        if (!(ok = ist == NM_OK))
            fail_later(g, ist == NM_ERR_NOMEM ? 500 : 400, ist == NM_ERR_NOMEM ? NULL : "messages", "%s (image %d)", err,
                       k + 1);
        img[k] = (nm_pipeline_image){.bytes = bytes[k], .n_bytes = n};
    }
    const nm_pipeline_input in = {.text = prompt, .images = img, .n_images = im->n, .llm_params = pj,
                                  .vision_params = im->n ? S->vision_params : NULL};
    serve_box *box = NULL;
    nm_status st = NM_OK;
    if (ok) { // (the box is the request's before any event of it can come)
        pthread_mutex_lock(&S->box_lock);
        for (int32_t i = 0; i < S->parallel && !box; i++)
            if (!S->boxes[i].id) box = &S->boxes[i];
        if (box && (st = nm_pipeline_submit(S->P, &in, &g->pid, err, sizeof err)) == NM_OK) {
            box->id = g->pid;
            box->n = 0, box->n_end = 0, box->t_first = 0, box->ended = box->lost = false;
        }
        pthread_mutex_unlock(&S->box_lock);
        pthread_mutex_lock(&S->lock);
        const bool abandon = S->abandon; // (the stop's time is up: nm_server_stop cancels those in the boxes)
        pthread_mutex_unlock(&S->lock);
        if (box && st == NM_OK && abandon) nm_pipeline_cancel(S->P, g->pid);
        if (!box) ok = fail_later(g, 503, NULL, "no room for another request in the decoder");
        else if (st != NM_OK) // (the request's fault: INVALID_ARG; the server stopping: SHUTDOWN)
            ok = fail_later(g, st == NM_ERR_SHUTDOWN ? 503 : st == NM_ERR_INVALID_ARG ? 400 : 500,
                            st == NM_ERR_INVALID_ARG ? (g->chat ? "messages" : "prompt") : NULL, "%s", err), box = NULL;
    }
    free(pj); // (copied by submit)
    if (!ok) {
        for (int k = 0; k < im->n; k++) free(bytes[k]);
        return false;
    }
    g->fd = g->stream ? -1 : serve_conn_fd(g->c); // (a stream notices at its next write)
    serve_box got = {0};
    bool started = false, cancelled = false;
    for (bool ended = false; !ended;) {
        ended = box_wait(S, box, &got, 0.1);
        for (int32_t k = 0; k < got.n_end; k++) {
            const size_t from = k ? got.end[k - 1] : 0;
            if (!started) { // the headers once the first piece is there (an error before it is a status)
                started = true;
                g->t_first = got.t_first;
                if (g->stream && !g->gone) mg_send_http_ok(g->c, "text/event-stream", -1);
            }
            out_piece(g, got.text + from, got.end[k] - from);
        }
        if (!g->gone && g->fd >= 0 && serve_peer_closed(g->fd)) g->gone = true;
        if (g->gone && !cancelled) cancelled = true, nm_pipeline_cancel(S->P, g->pid); // the client left: stopped
    }
    pthread_mutex_lock(&S->box_lock);
    box->id = 0;
    pthread_mutex_unlock(&S->box_lock);
    free(got.text), free(got.end);
    for (int k = 0; k < im->n; k++) free(bytes[k]); // (borrowed by the pipeline until the request's DONE)
    g->why = got.stop;
    g->n_prompt = got.n_prompt + got.n_cached, g->n_tokens = got.n_tokens;
    piece(g, "", 0, true); // (what was held back)
    if (g->split) nm_think_feed(&g->think, "", 0, true, think_out, g);
    if (got.lost && (!started || !g->stream)) return fail_later(g, 503, NULL, "the decoder stopped");
    if (got.lost) return stream_error(g, "the decoder stopped"), true; // (mid-stream: the headers are out)
    if (got.status != NM_OK && got.status != NM_ERR_CANCELLED) {
        // the prompt's or an image's fault (it does not fit, gives no tokens, cannot be read), or the decoder's
        const char *why = !strncmp(got.err, "llm: ", 5) ? got.err + 5 : got.err;
        const bool bad = got.status == NM_ERR_FORMAT || got.status == NM_ERR_RANGE || got.status == NM_ERR_IO;
        g->n_prompt = bad && !started ? 0 : g->n_prompt; // (the metrics count decoded prompts only)
        if (bad && !started) return fail_later(g, 400, g->chat ? "messages" : "prompt", "%s", why);
        if (!started || !g->stream) return fail_later(g, 500, NULL, "the decoder failed: %s", why);
        stream_error(g, why); // mid-stream: an error event, as llama-server
    }
    if (!started && g->stream && !g->gone) mg_send_http_ok(g->c, "text/event-stream", -1); // (an empty answer)
    return true;
}

// An answered generation's latencies, into the histograms.
static void generation_latency(const gen *g) {
    const double t = serve_now();
    pthread_mutex_lock(&g->S->lock);
    serve_hist_add(&g->S->lat_generation, t - g->t0);
    if (g->t_first > 0) serve_hist_add(&g->S->lat_first_token, g->t_first - g->t0);
    pthread_mutex_unlock(&g->S->lock);
}

// POST /v1/chat/completions and /v1/completions.
int handle_generate(server *S, struct mg_connection *c, bool chat) {
    int code = 200;
    cJSON *req = read_json(S, c, &code);
    if (!req) return code;
    gen g = {.S = S, .c = c, .chat = chat, .t0 = serve_now(), .split = chat && S->reasoning_split};
    nm_think_init(&g.think);
    const serve_env env = serve_env_of(S);
    serve_gen_req rq; // (the images' data: URLs point into req, kept until the decode ends)
    serve_err e;
    if (!serve_gen_parse(&env, req, chat, &rq, &e)) {
        cJSON_Delete(req);
        return send_err(S, c, &e);
    }
    g.stream = rq.stream, g.usage_in_stream = rq.usage_in_stream;
    memcpy(g.stop, rq.stop, sizeof rq.stop);
    g.n_stop = rq.n_stop;
    const int turn = serve_turn_take(S, &S->turn); // the decoder's turn
    if (turn) {
        serve_gen_free(&rq);
        cJSON_Delete(req);
        if (turn == 503) return send_error(S, c, 503, NULL, "the server is shutting down");
        return send_error(S, c, 429, NULL, "%d requests already wait for the decoder (--queue)", S->queue_max);
    }
    pthread_mutex_lock(&S->lock);
    g.id = ++S->next_id;
    S->n_requests++;
    pthread_mutex_unlock(&S->lock);
    snprintf(g.cid, sizeof g.cid, "%s-%llu", chat ? "chatcmpl" : "cmpl", (unsigned long long)g.id);
    g.created = (long long)time(NULL);
    bool ok = !g.stream || ev_begin(&g);
    if (!ok) code = send_error(S, c, 500, NULL, "out of memory");
    ok = ok && decode(&g, rq.params, rq.prompt, &rq.im); // (BOS as the model asks: add_special)
    pthread_mutex_lock(&S->lock);
    S->n_prompt_tokens += (uint64_t)g.n_prompt;
    S->n_gen_tokens += (uint64_t)g.n_tokens;
    pthread_mutex_unlock(&S->lock);
    nm_brick_cost cost = {0};
    if (g.n_prompt > 0 && nm_brick_estimate(nm_pipeline_brick(S->P, NM_BRICK_LLM), &(nm_brick_input){.n_tokens = g.n_prompt, .n_predict = g.n_tokens}, &cost) == NM_OK) {
        pthread_mutex_lock(&S->lock);
        S->dram += cost.weight_bytes_read + cost.act_bytes;
        pthread_mutex_unlock(&S->lock);
    }
    serve_turn_give(S, &S->turn);
    if (!ok && g.err_code) // (after the turn)
        code = send_error(S, c, g.err_code, g.err_param, "%s", g.err_msg ? g.err_msg : "out of memory");
    free(g.err_msg);
    cJSON_Delete(req);
    free(g.ev), free(g.ev_r);
    serve_gen_free(&rq);
    if (!ok) {
        free(g.text), free(g.rtext);
        return code;
    }
    cJSON *ch, *r;
    if (g.stream) {
        if (!g.gone) {
            r = envelope(&g, true, &ch);
            if (chat) cJSON_AddObjectToObject(ch, "delta");
            else cJSON_AddStringToObject(ch, "text", "");
            cJSON_AddStringToObject(ch, "finish_reason", finish_reason(g.why));
            sse(&g, r);
            if (g.usage_in_stream) { // OpenAI: a last chunk with no choices and the usage
                r = envelope(&g, true, &ch);
                cJSON_DeleteItemFromObjectCaseSensitive(r, "choices");
                cJSON_AddArrayToObject(r, "choices");
                add_usage(&g, r);
                sse(&g, r);
            }
            generation_latency(&g); // before the end: a client reading /metrics after it sees it
            mg_send_chunk(c, "data: [DONE]\n\n", 14);
            mg_send_chunk(c, "", 0);
        }
        return 200;
    }
    if (g.gone) { // the client left before its answer: nobody to send it to (its request was stopped)
        free(g.text), free(g.rtext);
        return 200;
    }
    r = envelope(&g, false, &ch);
    if (chat) {
        cJSON *msg = cJSON_AddObjectToObject(ch, "message");
        cJSON_AddStringToObject(msg, "role", "assistant");
        cJSON_AddStringToObject(msg, "content", g.text ? g.text : "");
        if (g.rlen) cJSON_AddStringToObject(msg, "reasoning_content", g.rtext); // (llama-server's: where there was some)
    } else {
        cJSON_AddStringToObject(ch, "text", g.text ? g.text : "");
    }
    cJSON_AddStringToObject(ch, "finish_reason", finish_reason(g.why));
    add_usage(&g, r);
    free(g.text), free(g.rtext);
    generation_latency(&g); // before the reply, as above
    code = send_json(c, 200, r);
    return code;
}
