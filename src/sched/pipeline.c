// The pipeline (include/nanomind/pipeline.h, docs/pipeline.md): the bricks
// of one assistant on TABM rings, their lanes, and three threads of its own:
//
//   feed     takes the requests in order: reads each one's transcript from
//            the STT ring (TRANSCRIPT events), writes the decoder's prompt
//            (chat turn as TEXT, the image through the vision brick, which
//            it runs), or the text for a pipeline without a decoder;
//   answers  reads the decoder's TEXT pieces (TEXT events) and hands each
//            sentence to the voice;
//   speech   reads the voice's PCM (AUDIO events, the slot lent to the reader).
//
// A request's DONE comes from the last stage it reaches. Every wait is on a
// ring or on the pipeline's one lock; free shuts the rings down, which ends
// every wait, and joins the threads.
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "core/fail.h"
#include "nanomind.h"

#define MEDIA_MARKER NM_PIPELINE_MEDIA_MARKER
#define TEXT_SLOT 4096             // a sentence for the voice
#define STT_IN_SLOTS 4             // a request's PARAMS and audio, and the next one's
#define LLM_IN_SLOTS 8             // a prompt's parts (parameters, text, image segment, text) for two requests
#define OUT_SLOTS 64

typedef struct pl_img {
    char *path;            // owned
    const void *bytes;     // the caller's, borrowed until the request's DONE
    size_t n_bytes;
} pl_img;

typedef struct pl_req {
    uint64_t id;
    double t_submit;
    char *text, *llm_params, *tts_params;
    pl_img img[NM_PIPELINE_MAX_IMAGES];
    int32_t n_images;
    bool audio, silent;
    // progress, under the lock
    bool cancelled;
    bool done;             // ended (its DONE due: status and err final) ...
    bool announced;        // ... and its DONE event made, once no lane has it (in_lanes 0)
    int32_t in_lanes;      // lanes given it that have not finished serving it
    bool answer_ended, speech_ended; // the decoder's request, the voice's request (DONE after both)
    bool fed, read;        // the feed thread is done with it; its DONE has been read: then it is freed
    char *said;            // CASCADE: the answer's sentences for the voice, each NUL-terminated
    size_t n_said, cap_said;
    nm_status status;      // a failure recorded before the request's last stage ends it
    nm_llm_stop stop;
    char err[512];
    char *turn;            // keep_history: the user's turn, joined to the history with its answer
    // the plan for it (the feed thread's, when it takes it; under the lock): the cascade (the pipeline's
    // mode, or the power policy's critical state), the bricks made again first (threads the policy
    // changed, or back from the cascade), the decoder's pace
    bool cascade, remake;
    int32_t threads;       // the bricks' threads for it (0: as their parameters say)
    double max_tps;        // 0: unpaced
    bool given[5];         // its first slot is in that brick's input ring: the lane was given it (by kind)
    nm_pipeline_timings t;
    struct pl_req *next;   // the queue of requests not yet taken
} pl_req;

typedef struct pl_event {
    nm_pipeline_event ev;
    char *text;            // owned, cap bytes (kept when the node is used again)
    size_t cap;
    nm_tabm_slot slot;     // AUDIO: the TTS ring's slot, released by the next read
    bool has_slot;
    struct pl_event *next;
} pl_event;

// A brick's lane: a thread that serves one request (nm_brick_step) each time
// the pipeline gives it one, with the brick loaded then (so that the bricks
// can be freed and loaded again between requests: the cascade, the power
// policy's threads). The vision brick's has no thread (the feed thread steps
// it): its counters only.
typedef struct pl_lane {
    struct nm_pipeline *P;
    nm_brick_kind kind;
    nm_tabm *in, *out;
    pthread_t th;
    bool started;
    // under the lock
    uint64_t given[64];    // the requests given (a slot of each in `in`), in order, that it has yet to take:
    int32_t head, n_given; // n_given of them from given[head] (at most what the ring's slots hold)
    bool busy;             // serving one
    nm_brick_stats base, cur; // the counters of the bricks it has freed, summed; of the one loaded now
} pl_lane;

struct nm_pipeline {
    nm_pipeline_params p;
    char *system_prompt, *chat_template, *jinja_template, *jinja_name;
    char *note;            // said with the next request (NOTE): the chat template's fallback
    nm_brick *stt, *vision, *llm, *tts; // loaded (in CASCADE mode: only while a request's stage runs)
    nm_model *m;           // the LLM brick's, while it is loaded
    bool has[5];           // the graph's bricks, by nm_brick_kind
    nm_brick_params given[5]; // CASCADE: the bricks' parameters, loaded again for each request
    bool resident;         // the bricks are loaded (not between two cascade requests)
    int32_t threads_now;   // the threads they were loaded with (0: as their parameters say)
    nm_tabm *stt_in, *stt_out, *img, *llm_in, *llm_out, *tts_in, *tts_out;
    nm_ledger *ledger;
    bool own_ledger;
    int ep_caller, ep_stt, ep_vision, ep_llm, ep_tts; // the ledger's endpoints of the copies the pipeline makes
    pl_lane L[5];          // by nm_brick_kind
    // power (params.battery): the policy, stepped before each request is taken
    nm_power_params power;
    nm_power_policy pol;
    double t_create;
    nm_power_targets said; // the targets the last POWER event gave
    bool power_said, dvfs_said;
    pthread_t th_feed, th_answers, th_speech;
    bool feed_started, answers_started, speech_started;
    int32_t tts_rate;
    int32_t n_predict;     // the decoder's, for the room an answer needs
    // under lock
    pthread_mutex_t lock, submit_lock;
    pthread_cond_t cond;
    pl_req **reqs;         // by id - 1
    uint64_t n_reqs, cap_reqs, n_done, done_upto; // done_upto: requests 1..done_upto are all done
    pl_req *q_head, *q_tail;
    int32_t n_queued;
    bool closed, stopping;
    pl_event *ev_head, *ev_tail, *cur;
    pl_event *spare;       // nodes read, for the next events (a token's event allocates nothing)
    nm_chat_msg *hist;     // keep_history: the turns so far (strings owned)
    size_t n_hist, cap_hist;
    // listening (nm_pipeline_hear, on its caller's thread)
    nm_vad *vad;
    nm_vad_params vad_p;
    bool vad_speech;       // an utterance was open after the last frame
};


static char *dup_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}
static char *dup_s(const char *s) { return s ? dup_n(s, strlen(s)) : NULL; }

// *buf (malloc'd, *cap bytes) grown to hold at least need bytes, doubling
// (from 1 KiB). False, *buf untouched, when out of memory.
static bool reserve(char **buf, size_t *cap, size_t need) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 1024;
    while (c < need) c *= 2;
    char *g = realloc(*buf, c);
    if (!g) return false;
    *buf = g, *cap = c;
    return true;
}

nm_pipeline_params nm_pipeline_default_params(void) {
    return (nm_pipeline_params){.mode = NM_PIPELINE_PIPELINED, .chat = true};
}

// ---- events ---------------------------------------------------------------------------------

// Queues an event (text copied) in a spare node where there is one; the lock
// held. False when out of memory (the event is lost).
static bool push_locked(nm_pipeline *P, const nm_pipeline_event *ev, const char *text, size_t len,
                        const nm_tabm_slot *slot) {
    pl_event *e = P->spare;
    if (e) P->spare = e->next;
    else if (!(e = calloc(1, sizeof *e))) return false;
    if (len + 1 > e->cap) {
        char *t = realloc(e->text, len + 1);
        if (!t) {
            e->next = P->spare, P->spare = e;
            return false;
        }
        e->text = t, e->cap = len + 1;
    }
    if (len) memcpy(e->text, text, len);
    e->text[len] = '\0';
    e->ev = *ev;
    e->ev.text = e->text;
    e->ev.len = len;
    e->has_slot = slot != NULL;
    if (slot) e->slot = *slot;
    e->next = NULL;
    if (P->ev_tail) P->ev_tail->next = e;
    else P->ev_head = e;
    P->ev_tail = e;
    pthread_cond_broadcast(&P->cond);
    return true;
}

static void push(nm_pipeline *P, const nm_pipeline_event *ev, const char *text, size_t len) {
    pthread_mutex_lock(&P->lock);
    push_locked(P, ev, text, len, NULL);
    pthread_mutex_unlock(&P->lock);
}

// A request's record (NULL: never given, or done and freed). The lock held.
static pl_req *req_of(nm_pipeline *P, uint64_t id) { return id >= 1 && id <= P->n_reqs ? P->reqs[id - 1] : NULL; }

static void free_req_body(pl_req *r);

// Frees request r's record once the feed thread is done with it and its DONE
// has been read (a long-running pipeline keeps only a pointer a request). The
// lock held.
static void retire_locked(nm_pipeline *P, pl_req *r) {
    if (!r->fed || !r->read) return;
    P->reqs[r->id - 1] = NULL;
    free_req_body(r);
    free(r->turn);
    free(r);
}

static void free_req_body(pl_req *r) {
    free(r->text), free(r->llm_params), free(r->tts_params), free(r->said);
    r->text = r->llm_params = r->tts_params = r->said = NULL;
    r->n_said = r->cap_said = 0;
    for (int32_t i = 0; i < r->n_images; i++) free(r->img[i].path);
    r->n_images = 0;
}

// The markers in text.
static int32_t n_markers(const char *text) {
    int32_t n = 0;
    for (const char *q = text; (q = strstr(q, MEDIA_MARKER)); q += strlen(MEDIA_MARKER)) n++;
    return n;
}

// text with the request's images' markers before it where it has none; malloc'd.
static char *with_markers(const pl_req *r, const char *text) {
    const size_t ml = strlen(MEDIA_MARKER), n = strlen(text);
    const int32_t k = r->n_images > 0 && n_markers(text) == 0 ? r->n_images : 0;
    char *s = malloc(ml * (size_t)k + n + 1);
    if (!s) return NULL;
    for (int32_t i = 0; i < k; i++) memcpy(s + ml * (size_t)i, MEDIA_MARKER, ml);
    memcpy(s + ml * (size_t)k, text, n + 1);
    return s;
}

// Request r's DONE event (every lane is done with it). The lock held.
static void announce_locked(nm_pipeline *P, pl_req *r) {
    r->announced = true;
    P->n_done++;
    nm_pipeline_event ev = {.kind = NM_PIPELINE_DONE, .request = r->id, .status = r->status, .stop = r->stop, .t = r->t};
    push_locked(P, &ev, r->err, strlen(r->err), NULL);
}

// The request's end: its DONE event, once the lanes serving it have finished
// (so that a brick's counters and a request's resources are settled when the
// caller reads it). status NM_OK takes what was recorded on it (a failure, a
// cancellation) first. The lock held.
static void done_locked(nm_pipeline *P, pl_req *r, nm_status status, const char *msg) {
    if (r->done) return;
    if (status == NM_OK && r->status != NM_OK) status = r->status, msg = r->err;
    if (r->cancelled && status == NM_OK) status = NM_ERR_CANCELLED;
    if (status == NM_ERR_CANCELLED) msg = "cancelled";
    r->done = true;
    r->status = status;
    if (msg != r->err) snprintf(r->err, sizeof r->err, "%s", msg ? msg : "");
    if (r->in_lanes == 0) announce_locked(P, r);
}

// A lane has finished request id: its DONE, if due and no other lane has it. The lock held.
static void served_locked(nm_pipeline *P, uint64_t id) {
    pl_req *r = req_of(P, id);
    if (r && --r->in_lanes == 0 && r->done && !r->announced) announce_locked(P, r);
}

static void done(nm_pipeline *P, pl_req *r, nm_status status, const char *msg) {
    pthread_mutex_lock(&P->lock);
    done_locked(P, r, status, msg);
    pthread_mutex_unlock(&P->lock);
}

// A failure recorded on the request, for the stage that ends it.
static void record(nm_pipeline *P, pl_req *r, nm_status st, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void record(nm_pipeline *P, pl_req *r, nm_status st, const char *fmt, ...) {
    pthread_mutex_lock(&P->lock);
    if (r->status == NM_OK && !r->done) { // (a request ended keeps what its DONE says)
        va_list ap;
        va_start(ap, fmt);
        nm_vfail(st, r->err, sizeof r->err, NULL, fmt, ap);
        va_end(ap);
        r->status = st;
    }
    pthread_mutex_unlock(&P->lock);
}

static double since(const pl_req *r) { return nm_now_s() - r->t_submit; }

// A ring failed under a thread (a lane ended): every request not done ends
// with the reason, so that no reader waits for them.
static void fail_all(nm_pipeline *P, const char *why) {
    pthread_mutex_lock(&P->lock);
    for (uint64_t i = 0; i < P->n_reqs; i++)
        if (P->reqs[i] && !P->reqs[i]->done)
            done_locked(P, P->reqs[i], P->stopping ? NM_ERR_CANCELLED : NM_ERR_SHUTDOWN, why);
    pthread_mutex_unlock(&P->lock);
}

// ---- the prompt ------------------------------------------------------------------------------

// A conversation as text (malloc'd) by the pipeline's template; NULL with
// err saying why. *fallback (may be NULL): the built-in template used where
// the Jinja one is beyond the subset.
static char *format_chat(const nm_pipeline *P, const nm_chat_msg *msgs, size_t n, const char **fallback, nm_status *st,
                         char *err, size_t err_size) {
    char e[768], *text = NULL;
    *st = nm_chat_text(P->m, P->chat_template, P->p.jinja, P->jinja_template, P->p.jinja_len, msgs, n, true, &text,
                       fallback, e, sizeof e);
    if (*st != NM_OK)
        nm_fail(*st, err, err_size, "chat template: %s%s%s", P->p.jinja ? P->jinja_name : "", P->p.jinja ? ": " : "",
                *st == NM_ERR_NOMEM ? "out of memory" : e);
    else if (fallback && *fallback)
        snprintf(err, err_size, "%s is beyond nanomind's Jinja subset (%s): formatting with the built-in '%s' template "
                 "instead", P->jinja_name, e, *fallback);
    return text;
}

// The conversation's messages: the system prompt, the history from turn
// `from` on, the user's content. The lock held.
static size_t chat_msgs(const nm_pipeline *P, size_t from, const char *content, nm_chat_msg *msgs) {
    size_t k = 0;
    if (P->system_prompt) msgs[k++] = (nm_chat_msg){"system", P->system_prompt};
    for (size_t i = from; i < P->n_hist; i++) msgs[k++] = P->hist[i];
    msgs[k++] = (nm_chat_msg){"user", content};
    return k;
}

// The chat of request r (its turn after the history) as text, malloc'd; NULL
// with the reason recorded. With keep_history, the oldest turns go while the
// conversation and room for an answer outgrow the context (a NOTE says so),
// and a turn that cannot fit alone is named.
static char *chat_text(nm_pipeline *P, pl_req *r, const char *question) {
    char *content = with_markers(r, question), err[1024];
    pthread_mutex_lock(&P->lock); // (the history changes under it; the feed thread alone changes it while a
                                  // conversation's turn is formatted: turns go one at a time)
    nm_chat_msg *msgs = content ? malloc(sizeof *msgs * (P->n_hist + 2)) : NULL;
    size_t n = msgs ? chat_msgs(P, 0, content, msgs) : 0;
    char *note = P->note;
    P->note = NULL;
    pthread_mutex_unlock(&P->lock);
    if (note) {
        push(P, &(nm_pipeline_event){.kind = NM_PIPELINE_NOTE, .request = r->id}, note, strlen(note));
        free(note);
    }
    nm_status st = NM_ERR_NOMEM;
    char *text = msgs ? format_chat(P, msgs, n, NULL, &st, err, sizeof err) : NULL;
    if (text && P->p.keep_history && r->n_images == 0) { // (else put_tokens refuses what does not fit; an image's
                                                         // positions are the decoder's to count)
        const int32_t n_ctx = nm_ctx_n_ctx(nm_brick_llm_ctx(P->llm));
        const int32_t room = P->n_predict > 0 && P->n_predict < n_ctx ? P->n_predict : n_ctx / 4;
        int32_t n_tok = -nm_tokenize(P->m, text, strlen(text), NULL, 0, true, true);
        size_t drop = 0;
        while (text && n_tok + room > n_ctx && drop + 2 <= P->n_hist) { // keep_history: a user + assistant pair goes
            drop += 2;
            free(text);
            pthread_mutex_lock(&P->lock);
            n = chat_msgs(P, drop, content, msgs);
            pthread_mutex_unlock(&P->lock);
            if ((text = format_chat(P, msgs, n, NULL, &st, err, sizeof err)))
                n_tok = -nm_tokenize(P->m, text, strlen(text), NULL, 0, true, true);
        }
        if (text && drop) {
            pthread_mutex_lock(&P->lock);
            for (size_t i = 0; i < drop; i++) free((char *)P->hist[i].content);
            memmove(P->hist, P->hist + drop, sizeof *P->hist * (P->n_hist - drop));
            P->n_hist -= drop;
            pthread_mutex_unlock(&P->lock);
            const int len = snprintf(err, sizeof err,
                                     "context of %d tokens: dropped the %zu oldest turn%s; the conversation is %d "
                                     "tokens now", n_ctx, drop / 2, drop > 2 ? "s" : "", n_tok);
            push(P, &(nm_pipeline_event){.kind = NM_PIPELINE_NOTE, .request = r->id}, err, (size_t)len);
        }
        if (text && n_tok >= n_ctx) {
            st = nm_fail(NM_ERR_RANGE, err, sizeof err, "llm: this message (%d tokens with the template%s) does not "
                         "fit the context of %d", n_tok, P->system_prompt ? " and the system prompt" : "", n_ctx);
            free(text);
            text = NULL;
        }
    }
    if (!text) record(P, r, st, "%s", st == NM_ERR_NOMEM && !msgs ? "out of memory" : err);
    free(msgs);
    free(content);
    return text;
}

// A PARAMS slot (json) of request id into ring, NM_BRICK_MORE set.
// Request r's first slot is in brick k's input ring: its lane is given the
// request (once: a lane serves a request at a time, in the ring's order).
static void give(nm_pipeline *P, nm_brick_kind k, pl_req *r) {
    pl_lane *L = &P->L[k];
    pthread_mutex_lock(&P->lock);
    if (!r->given[k] && L->n_given < (int32_t)(sizeof L->given / sizeof L->given[0])) {
        r->given[k] = true;
        r->in_lanes++;
        L->given[(L->head + L->n_given++) % (int32_t)(sizeof L->given / sizeof L->given[0])] = r->id;
        pthread_cond_broadcast(&P->cond);
    }
    pthread_mutex_unlock(&P->lock);
}

// The brick whose input ring is `ring`.
static nm_brick_kind kind_in(const nm_pipeline *P, const nm_tabm *ring) {
    return ring == P->stt_in ? NM_BRICK_STT : ring == P->llm_in ? NM_BRICK_LLM : NM_BRICK_TTS;
}

// Request r's parameters (a JSON object) into a PARAMS slot of `ring`, its first.
static nm_status put_params(nm_pipeline *P, nm_tabm *ring, const char *json, pl_req *r) {
    nm_tabm_slot s;
    const size_t n = strlen(json);
    nm_status st = nm_tabm_acquire_write(ring, 0, -1, &s);
    if (st != NM_OK) return st;
    if (n > s.capacity) {
        nm_tabm_cancel(ring, &s);
        return NM_ERR_RANGE;
    }
    memcpy(s.data, json, n); // the caller's parameters, made here: not a copy between bricks
    *s.meta = (nm_tabm_meta){.kind = NM_TABM_PARAMS, .ndim = 1, .shape = {(int64_t)n}, .size = n,
                             .user = NM_BRICK_MORE, .request = r->id};
    st = nm_tabm_publish(ring, &s);
    if (st != NM_OK) nm_tabm_cancel(ring, &s);
    else give(P, kind_in(P, ring), r);
    return st;
}

// A TEXT slot of request r: text[0..n) copied into it (counted from -> to;
// from < 0: the pipeline's own marker text, not counted), flags `user`.
static nm_status put_text(nm_pipeline *P, nm_tabm *ring, int from, int to, const char *text, size_t n, uint64_t user,
                          pl_req *r) {
    nm_tabm_slot s;
    nm_status st = nm_tabm_acquire_write(ring, 0, -1, &s);
    if (st != NM_OK) return st;
    if (n > s.capacity) {
        nm_tabm_cancel(ring, &s);
        return NM_ERR_RANGE;
    }
    if (from >= 0) nm_ledger_copy(P->ledger, from, to, s.data, text, n);
    else if (n) memcpy(s.data, text, n);
    *s.meta = (nm_tabm_meta){.kind = NM_TABM_TEXT, .ndim = n ? 1 : 0, .shape = {(int64_t)n}, .size = n, .user = user,
                             .request = r->id};
    st = nm_tabm_publish(ring, &s);
    if (st != NM_OK) nm_tabm_cancel(ring, &s);
    else give(P, kind_in(P, ring), r);
    return st;
}

// Text [text, text + n) of request r tokenized straight into a slot of the
// decoder's ring (BOS where it starts the prompt, special tokens parsed),
// flags `user`: the prompt crosses into the decoder with no copy. False with
// the reason recorded.
static bool put_tokens(nm_pipeline *P, pl_req *r, const char *text, size_t n, uint64_t user) {
    nm_tabm_slot s;
    nm_status st = nm_tabm_acquire_write(P->llm_in, 0, -1, &s);
    if (st != NM_OK) {
        record(P, r, st, "llm: its ring: %s", nm_status_str(st));
        return false;
    }
    const bool at0 = (user & NM_LLM_IN_AT_POS) && NM_LLM_IN_POS_OF(user) == 0;
    const int32_t n_ctx = nm_ctx_n_ctx(nm_brick_llm_ctx(P->llm));
    const int32_t k = nm_tokenize(P->m, text, n, s.data, (int32_t)(s.capacity / sizeof(int32_t)), at0, true);
    if (k <= 0 || k >= n_ctx) { // (a prompt that leaves no room for a token is refused, as llama.cpp does)
        nm_tabm_cancel(P->llm_in, &s);
        if (k == 0) record(P, r, NM_ERR_FORMAT, "llm: the prompt gives no tokens");
        else record(P, r, NM_ERR_RANGE, "llm: a prompt of %s%d tokens does not fit the context of %d", k < 0 ? "over " : "",
                    k < 0 ? -k : k, n_ctx);
        return false;
    }
    *s.meta = (nm_tabm_meta){.kind = NM_TABM_TOKENS, .ndim = 1, .shape = {k}, .size = sizeof(int32_t) * (uint64_t)k,
                             .user = user, .request = r->id};
    if ((st = nm_tabm_publish(P->llm_in, &s)) != NM_OK) {
        nm_tabm_cancel(P->llm_in, &s);
        record(P, r, st, "llm: its ring: %s", nm_status_str(st));
        return false;
    }
    give(P, NM_BRICK_LLM, r);
    return true;
}

// Image k of request r into the vision ring, encoded on this thread into the
// decoder's ring with the segment flags `user`. 1: done; 0: failed, nothing
// written to the decoder; -1: failed, a flagged segment written (the decoder
// ends the request). The reason recorded.
static int put_image(nm_pipeline *P, pl_req *r, int32_t k, uint64_t user) {
    const pl_img *im = &r->img[k];
    nm_tabm_slot s;
    nm_status st = nm_tabm_acquire_write(P->img, 0, -1, &s);
    if (st != NM_OK) {
        record(P, r, st, "vision: its ring: %s", nm_status_str(st));
        return 0;
    }
    size_t n = 0;
    char err[400] = "", name[32];
    snprintf(name, sizeof name, "%d (bytes)", (int)k + 1);
    const char *what = im->path ? im->path : name;
    if (im->path) {
        st = nm_infile_read_into(im->path, 0, s.data, s.capacity, &n, err, sizeof err);
    } else if (im->n_bytes > s.capacity) {
        st = nm_fail(NM_ERR_RANGE, err, sizeof err, "%s: %zu bytes (the vision brick takes %zu)", what, im->n_bytes,
                     s.capacity);
    } else {
        nm_ledger_copy(P->ledger, P->ep_caller, P->ep_vision, s.data, im->bytes, im->n_bytes); // the caller's buffer
        n = im->n_bytes;
    }
    if (st == NM_OK && n == 0) st = nm_fail(NM_ERR_FORMAT, err, sizeof err, "%s: an empty file", what);
    if (st != NM_OK) {
        nm_tabm_cancel(P->img, &s);
        record(P, r, st, "image %s (%s)", err, nm_status_str(st));
        return 0;
    }
    *s.meta = (nm_tabm_meta){.kind = NM_TABM_IMAGE, .ndim = 1, .shape = {(int64_t)n}, .size = n, .user = user,
                             .request = r->id};
    if ((st = nm_tabm_publish(P->img, &s)) != NM_OK) {
        nm_tabm_cancel(P->img, &s);
        record(P, r, st, "vision: its ring: %s", nm_status_str(st));
        return 0;
    }
    const uint64_t bad = nm_brick_get_stats(P->vision).n_bad_requests;
    st = nm_brick_step(P->vision, P->img, P->llm_in);
    const nm_brick_stats vs = nm_brick_get_stats(P->vision);
    pthread_mutex_lock(&P->lock);
    P->L[NM_BRICK_VISION].cur = vs;
    pthread_mutex_unlock(&P->lock);
    if (st == NM_OK) give(P, NM_BRICK_LLM, r); // (its segment is in the decoder's ring, flagged or not)
    if (st != NM_OK || vs.n_bad_requests != bad) {
        // the segment it wrote is flagged: the decoder fails the request, and its DONE carries this text
        record(P, r, st != NM_OK ? st : NM_ERR_FORMAT, "image %s: %s", what,
               st != NM_OK ? nm_status_str(st) : nm_brick_last_error(P->vision));
        return st == NM_OK ? -1 : 0;
    }
    return 1;
}

// The request's LLM parameters (a JSON object, or NULL: none) with the power
// policy's pace first (a key given twice: the first counts); malloc'd. Text
// that is not an object is kept as it is (the brick refuses it).
static char *with_pace(const char *json, double tps) {
    char pace[64];
    const int k = snprintf(pace, sizeof pace, "\"max_tps\":%.6g", tps);
    const char *b = json;
    while (b && (*b == ' ' || *b == '\t' || *b == '\n' || *b == '\r')) b++;
    if (b && *b != '{') return dup_s(json);
    const size_t head = b ? (size_t)(b - json) + 1 : 0, rest = b ? strlen(b + 1) : 0;
    const char *c = b ? b + 1 : NULL;
    while (c && (*c == ' ' || *c == '\t' || *c == '\n' || *c == '\r')) c++;
    const bool alone = !b || *c == '}';
    char *s = malloc(head + (size_t)k + rest + 4);
    if (!s) return NULL;
    if (b) memcpy(s, json, head);
    else s[0] = '{';
    memcpy(s + (b ? head : 1), pace, (size_t)k);
    char *t = s + (b ? head : 1) + k;
    if (!alone) *t++ = ',';
    if (b) memcpy(t, b + 1, rest + 1);
    else memcpy(t, "}", 2);
    return s;
}

// The decoder's prompt for request r: [PARAMS], then its parts in order, the
// text between markers and each image's segment at its marker (the first part
// at position 0, each but the last with NM_BRICK_MORE). The answers thread
// ends the request. A prompt that cannot be sent goes as an empty part of a
// cancelled request, so that the decoder ends it in order (the failure
// recorded is what DONE says).
static void send_prompt(nm_pipeline *P, pl_req *r, const char *question) {
    char *full = P->p.chat ? chat_text(P, r, question) : with_markers(r, question);
    if (!full && !P->p.chat) record(P, r, NM_ERR_NOMEM, "out of memory for the prompt");
    char *params = r->max_tps > 0 ? with_pace(r->llm_params, r->max_tps) : r->llm_params;
    bool ok = full != NULL, sent = false;
    nm_status st = NM_OK;
    if (ok && r->max_tps > 0 && !params) {
        record(P, r, NM_ERR_NOMEM, "out of memory for the prompt");
        ok = false;
    }
    if (ok && params && (st = put_params(P, P->llm_in, params, r)) != NM_OK) {
        record(P, r, st, "llm: the request's parameters: %s", nm_status_str(st));
        ok = false;
    }
    if (params != r->llm_params) free(params);
    sent = params != NULL && ok;
    if (ok && r->n_images > 0 && n_markers(full) != r->n_images) {
        record(P, r, NM_ERR_TEMPLATE, "the chat template dropped the images' places");
        ok = false;
    }
    const size_t ml = strlen(MEDIA_MARKER);
    // an empty first part still goes where the model starts a prompt with a BOS token
    const bool bos_alone = nm_tokenize(P->m, "", 0, NULL, 0, true, true) != 0;
    bool first = true;
    const char *p = full;
    for (int32_t k = 0; ok && k <= r->n_images; k++) {
        const bool last = k == r->n_images;
        const char *end = last ? p + strlen(p) : strstr(p, MEDIA_MARKER);
        const bool more = !last && (end[ml] != '\0' || k + 1 < r->n_images); // text or images follow the image
        if (end > p || (first && bos_alone) || (last && first)) {
            const uint64_t user = (first ? NM_LLM_IN_POS(0) : 0) | (last ? 0 : NM_BRICK_MORE);
            if (!(ok = put_tokens(P, r, p, (size_t)(end - p), user))) break;
            sent = true, first = false;
        }
        if (last) break;
        const int put = put_image(P, r, k, (first ? NM_LLM_IN_POS(0) : 0) | (more ? NM_BRICK_MORE : 0));
        if (put < 0) { // a flagged segment: the decoder fails the request (its DONE says why) at its last part
            if (more) put_text(P, P->llm_in, -1, P->ep_llm, " ", 1, 0, r);
            goto out;
        }
        if (!(ok = put > 0)) break;
        sent = true, first = false;
        p = end + ml;
    }
    // failed: the decoder ends what was sent of it (cancelled), or nothing was sent (a brick loaded for
    // the request, the cascade, is given its cancelled start, so that its stage ends as any other)
    if (!ok && (sent || r->cascade)) {
        nm_tabm_cancel_request(P->llm_in, r->id);
        put_text(P, P->llm_in, -1, P->ep_llm, " ", 1, sent ? 0 : NM_LLM_IN_POS(0), r);
    } else if (!ok) {
        done(P, r, NM_OK, NULL);
    }
out:
    free(full);
}

// Text for a pipeline with a voice and no decoder: [PARAMS], then slots of at
// most NM_TTS_MAX_TEXT bytes (a megabyte) cut after a blank, the last without
// NM_BRICK_MORE.
static void send_speech(nm_pipeline *P, pl_req *r, const char *text) {
    nm_status st = NM_OK;
    if (r->tts_params && (st = put_params(P, P->tts_in, r->tts_params, r)) != NM_OK) {
        record(P, r, st, "tts: the request's parameters: %s", nm_status_str(st));
        if (r->cascade) { // (the voice loaded for it is given its cancelled end)
            nm_tabm_cancel_request(P->tts_in, r->id);
            put_text(P, P->tts_in, -1, P->ep_tts, "", 0, 0, r);
        } else {
            done(P, r, NM_OK, NULL);
        }
        return;
    }
    size_t n = strlen(text);
    const size_t cap = nm_tabm_max_payload(P->tts_in);
    do {
        size_t k = n;
        if (k > cap) { // cut after the last blank that fits, else at a character's start
            k = cap;
            while (k > cap / 2 && text[k - 1] != ' ' && text[k - 1] != '\n') k--;
            if (text[k - 1] != ' ' && text[k - 1] != '\n')
                for (k = cap; k > 0 && ((unsigned char)text[k] & 0xc0) == 0x80;) k--;
        }
        st = put_text(P, P->tts_in, P->ep_caller, P->ep_tts, text, k, k < n ? NM_BRICK_MORE : 0, r);
        text += k, n -= k;
    } while (st == NM_OK && n > 0);
    if (st != NM_OK) {
        record(P, r, st, "tts: its ring: %s", nm_status_str(st));
        done(P, r, NM_OK, NULL);
    }
}

// ---- the threads -------------------------------------------------------------------------------

// The transcript of request r from the STT ring: TRANSCRIPT events, the text
// joined into *q (malloc'd). False when it failed or was cancelled (recorded).
static bool hear(nm_pipeline *P, pl_req *r, char **q) {
    size_t len = 0, cap = 256;
    char *t = malloc(cap);
    bool failed = false, cancelled = false;
    for (bool more = true; more && t;) {
        nm_tabm_slot s;
        nm_status st = nm_tabm_acquire_read(P->stt_out, -1, &s);
        if (st != NM_OK) {
            record(P, r, st, "stt: its ring: %s", nm_status_str(st));
            free(t);
            return false;
        }
        const uint64_t user = s.meta->user;
        more = (user & NM_BRICK_MORE) != 0;
        failed = failed || (user & NM_BRICK_ERROR);
        cancelled = cancelled || (user & NM_BRICK_CANCELLED);
        // every segment (one of no text too, as whisper.cpp keeps them); the last slot only ends the request
        if (s.meta->kind == NM_TABM_TEXT && more && !(user & (NM_BRICK_ERROR | NM_BRICK_CANCELLED))) {
            const size_t n = (size_t)s.meta->size;
            nm_pipeline_event ev = {.kind = NM_PIPELINE_TRANSCRIPT, .request = r->id, .t0 = s.meta->shape[1],
                                    .t1 = s.meta->shape[2]};
            push(P, &ev, s.data, n);
            if (!P->has[NM_BRICK_LLM] && !P->has[NM_BRICK_TTS]) { // a transcriber: the events are the transcript
                nm_tabm_release(P->stt_out, &s);
                continue;
            }
            if (!reserve(&t, &cap, len + n + 1)) {
                free(t);
                t = NULL;
                nm_tabm_release(P->stt_out, &s);
                break;
            }
            // the transcript into the chat's (or the voice's) text: a copy between bricks, counted
            nm_ledger_copy(P->ledger, P->ep_stt, P->has[NM_BRICK_LLM] ? P->ep_llm : P->ep_tts, t + len, s.data, n);
            len += n;
        }
        nm_tabm_release(P->stt_out, &s);
    }
    if (!t) {
        record(P, r, NM_ERR_NOMEM, "out of memory for the transcript");
        return false;
    }
    t[len] = '\0';
    pthread_mutex_lock(&P->lock);
    r->t.heard = since(r);
    pthread_mutex_unlock(&P->lock);
    if (cancelled) record(P, r, NM_ERR_CANCELLED, "cancelled");
    else if (failed) record(P, r, NM_ERR_FORMAT, "stt: %s", nm_brick_request_error(P->stt, r->id));
    if (failed || cancelled) {
        free(t);
        return false;
    }
    *q = t;
    return true;
}

// ---- the bricks: loaded, freed, made again ---------------------------------------------------------

static nm_brick **slot_of(nm_pipeline *P, nm_brick_kind k) {
    return k == NM_BRICK_STT ? &P->stt : k == NM_BRICK_VISION ? &P->vision : k == NM_BRICK_LLM ? &P->llm : &P->tts;
}

// Brick k from its parameters (the threads the power policy set, where it
// did) into its place (the vision brick after the LLM's, which it feeds).
static nm_status load(nm_pipeline *P, nm_brick_kind kind, char *err, size_t err_size) {
    nm_brick_params bp = P->given[kind];
    bp.kind = kind;
    bp.ledger = P->ledger;
    if (P->threads_now > 0) bp.n_threads = P->threads_now;
    if (kind == NM_BRICK_LLM) {
        bp.llm.out = P->has[NM_BRICK_TTS] ? NM_LLM_OUT_SENTENCES : NM_LLM_OUT_TEXT;
        bp.llm.out_batch = 1;
    }
    if (kind == NM_BRICK_VISION) bp.feeds = P->llm;
    static const char *kinds[] = {[NM_BRICK_STT] = "stt", [NM_BRICK_VISION] = "vision", [NM_BRICK_LLM] = "llm",
                                  [NM_BRICK_TTS] = "tts"};
    char e[512];
    nm_brick *b = NULL;
    nm_status st = nm_brick_load(NULL, &bp, &b, e, sizeof e);
    if (st != NM_OK) return nm_fail(st, err, err_size, "%s: %s", kinds[kind], e);
    pthread_mutex_lock(&P->lock);
    *slot_of(P, kind) = b;
    if (kind == NM_BRICK_LLM) P->m = nm_brick_llm_model(b);
    pthread_mutex_unlock(&P->lock);
    return NM_OK;
}

// a += c, counter by counter (the most a pass carried: the larger).
static void stats_add(nm_brick_stats *a, const nm_brick_stats *c) {
    a->n_requests += c->n_requests, a->n_in_slots += c->n_in_slots, a->n_out_slots += c->n_out_slots;
    a->n_bad_requests += c->n_bad_requests, a->n_cancelled += c->n_cancelled, a->t_busy += c->t_busy;
    a->n_prompt_tokens += c->n_prompt_tokens, a->n_gen += c->n_gen, a->t_prompt += c->t_prompt, a->t_gen += c->t_gen;
    a->n_images += c->n_images, a->n_encoded += c->n_encoded, a->t_decode += c->t_decode, a->t_encode += c->t_encode;
    a->n_samples += c->n_samples, a->n_segments += c->n_segments, a->n_passes += c->n_passes;
    a->n_pass_seqs += c->n_pass_seqs;
    if (c->max_pass_seqs > a->max_pass_seqs) a->max_pass_seqs = c->max_pass_seqs;
}

// Frees brick k (its lane idle), its counters kept in the lane's sums.
static void unload(nm_pipeline *P, nm_brick_kind k) {
    pthread_mutex_lock(&P->lock);
    nm_brick *b = *slot_of(P, k);
    *slot_of(P, k) = NULL;
    if (k == NM_BRICK_LLM) P->m = NULL;
    pl_lane *L = &P->L[k];
    stats_add(&L->base, &L->cur);
    L->cur = (nm_brick_stats){0};
    pthread_mutex_unlock(&P->lock);
    nm_brick_free(b);
}

// Every brick loaded (its lane idle); false with err on the first that fails (none left loaded).
static bool load_all(nm_pipeline *P, char *err, size_t err_size) {
    static const nm_brick_kind order[] = {NM_BRICK_STT, NM_BRICK_LLM, NM_BRICK_VISION, NM_BRICK_TTS};
    for (int i = 0; i < 4; i++)
        if (P->has[order[i]] && load(P, order[i], err, err_size) != NM_OK) {
            for (int k = 1; k < 5; k++) unload(P, (nm_brick_kind)k);
            return false;
        }
    return true;
}

// Waits (the lock held) until brick k's lane has served what it was given.
static void lane_idle_locked(nm_pipeline *P, nm_brick_kind k) {
    while ((P->L[k].busy || P->L[k].n_given > 0) && !P->stopping) pthread_cond_wait(&P->cond, &P->lock);
    while (P->L[k].busy) pthread_cond_wait(&P->cond, &P->lock); // (stopping: its step ends on the shut rings)
}

// ---- the cascade: a brick loaded for each stage of a request ------------------------------------

// The stage of request r on brick kind k begins: for a request run as the
// cascade the brick is loaded (the LLM's with the vision brick where the
// request has images); its lane serves the request once given its first
// slot. False with the reason recorded (nothing loaded).
static bool stage_begin(nm_pipeline *P, pl_req *r, nm_brick_kind k) {
    if (!r->cascade) return true;
    char err[600];
    nm_status st = load(P, k, err, sizeof err);
    if (st == NM_OK && k == NM_BRICK_LLM && r->n_images > 0 && (st = load(P, NM_BRICK_VISION, err, sizeof err)) != NM_OK)
        unload(P, NM_BRICK_LLM);
    if (st != NM_OK) record(P, r, st, "%s", err);
    return st == NM_OK;
}

// The vision brick is done with the request (its segments are in the
// decoder's ring): released (the cascade).
static void stage_vision_done(nm_pipeline *P, const pl_req *r) {
    if (r->cascade) unload(P, NM_BRICK_VISION);
}

// The stage ends (the cascade): the brick has served the request and its
// reader has seen the request's end (`ended`, under the lock); the brick is
// released.
static void stage_end(nm_pipeline *P, const pl_req *r, nm_brick_kind k, const bool *ended) {
    if (!r->cascade) return;
    pthread_mutex_lock(&P->lock);
    while (ended && !*ended && !P->stopping) pthread_cond_wait(&P->cond, &P->lock);
    lane_idle_locked(P, k);
    pthread_mutex_unlock(&P->lock);
    unload(P, NM_BRICK_VISION);
    unload(P, k);
}

// A request that failed before its STT stage: its audio (and parameters) taken out of the STT ring unheard.
static void drop_audio(nm_pipeline *P, pl_req *r) {
    for (;;) {
        nm_tabm_slot s;
        if (nm_tabm_acquire_read(P->stt_in, 0, &s) != NM_OK) return;
        const bool last = s.meta->request != r->id || !(s.meta->user & NM_BRICK_MORE);
        nm_tabm_release(P->stt_in, &s);
        if (last) return;
    }
}

// The cascade: the answer's sentences to the voice, loaded for them.
static void cascade_speak(nm_pipeline *P, pl_req *r) {
    if (!stage_begin(P, r, NM_BRICK_TTS)) {
        done(P, r, NM_OK, NULL);
        return;
    }
    nm_status st = NM_OK;
    if (r->tts_params && (st = put_params(P, P->tts_in, r->tts_params, r)) != NM_OK)
        record(P, r, st, "tts: the request's parameters: %s", nm_status_str(st));
    for (size_t at = 0; st == NM_OK && at < r->n_said;) {
        const size_t n = strlen(r->said + at);
        st = put_text(P, P->tts_in, P->ep_llm, P->ep_tts, r->said + at, n, NM_BRICK_MORE, r);
        at += n + 1;
    }
    if (st != NM_OK) nm_tabm_cancel_request(P->tts_in, r->id);
    put_text(P, P->tts_in, -1, P->ep_tts, "", 0, 0, r);
    stage_end(P, r, NM_BRICK_TTS, &r->speech_ended);
}

// Request r through the graph from the front: its transcript, then its prompt
// (or its text for a voice alone); run as the cascade, each stage's brick is
// loaded for it, serves it and is released. stop: the pipeline is being freed.
static void serve(nm_pipeline *P, pl_req *r, bool stop) {
    char *question = NULL;
    if (r->audio) { // its audio is in the STT ring: its transcript is read in any case
        if (!stage_begin(P, r, NM_BRICK_STT)) {
            drop_audio(P, r);
            done(P, r, NM_OK, NULL);
            return;
        }
        give(P, NM_BRICK_STT, r);
        const bool heard = hear(P, r, &question);
        stage_end(P, r, NM_BRICK_STT, NULL);
        if (!heard) {
            done(P, r, NM_OK, NULL);
            return;
        }
        const char *t = question;
        while (*t == ' ') t++; // Whisper's leading blank
        if (!P->has[NM_BRICK_LLM] && !P->has[NM_BRICK_TTS]) {
            done(P, r, NM_OK, NULL);
        } else if (!*t) {
            done(P, r, NM_ERR_FORMAT, "no speech heard");
        } else {
            memmove(question, t, strlen(t) + 1);
            r->text = question; // (freed with the request's body)
            question = NULL;
        }
        free(question);
        if (!r->text) return;
    }
    pthread_mutex_lock(&P->lock);
    const bool cancelled = r->cancelled || stop;
    if (!cancelled && P->has[NM_BRICK_LLM] && P->p.keep_history && (r->turn = dup_s(r->text))) // (joined by the answer)
        for (char *m; (m = strstr(r->turn, MEDIA_MARKER));) // (its images are not part of the history)
            memmove(m, m + strlen(MEDIA_MARKER), strlen(m + strlen(MEDIA_MARKER)) + 1);
    pthread_mutex_unlock(&P->lock);
    if (cancelled) {
        done(P, r, NM_ERR_CANCELLED, NULL);
    } else if (P->has[NM_BRICK_LLM]) {
        if (!stage_begin(P, r, NM_BRICK_LLM)) {
            done(P, r, NM_OK, NULL);
            return;
        }
        send_prompt(P, r, r->text);
        stage_vision_done(P, r);
        stage_end(P, r, NM_BRICK_LLM, &r->answer_ended);
        pthread_mutex_lock(&P->lock);
        const bool speak = r->cascade && !r->done && P->has[NM_BRICK_TTS] && !r->silent && r->status == NM_OK &&
                           !r->cancelled && r->n_said > 0;
        pthread_mutex_unlock(&P->lock);
        if (speak) cascade_speak(P, r);
        if (r->cascade) done(P, r, NM_OK, NULL); // (its bricks released: DONE comes after)
    } else if (stage_begin(P, r, NM_BRICK_TTS)) {
        send_speech(P, r, r->text);
        stage_end(P, r, NM_BRICK_TTS, &r->speech_ended);
        if (r->cascade) done(P, r, NM_OK, NULL);
    } else {
        done(P, r, NM_OK, NULL);
    }
}

// ---- power: the policy before each request -----------------------------------------------------

// The bricks' threads the pipeline runs with now.
static int32_t threads_of(const nm_pipeline *P) { return P->threads_now > 0 ? P->threads_now : P->power.n_threads; }

// Reads the battery and steps the policy for request r (NOTE and POWER
// events); the DVFS caps follow. The feed thread's.
static nm_power_targets power_step(nm_pipeline *P, pl_req *r) {
    double t0, t1;
    nm_battery_span(P->p.battery, &t0, &t1);
    nm_battery_reading br;
    nm_battery_read(P->p.battery, t0 + (nm_now_s() - P->t_create) * P->p.battery_speed, &br);
    char note[320];
    if (br.note[0]) {
        const int n = snprintf(note, sizeof note, "battery: %s", br.note);
        push(P, &(nm_pipeline_event){.kind = NM_PIPELINE_NOTE, .request = r->id}, note, (size_t)n);
    }
    // the decoder's speed unpaced (tokens a second of generation: pacing's waits are not in t_gen), unless given
    pthread_mutex_lock(&P->lock);
    const nm_brick_stats *a = &P->L[NM_BRICK_LLM].base, *c = &P->L[NM_BRICK_LLM].cur;
    const double n_gen = (double)(a->n_gen + c->n_gen), t_gen = a->t_gen + c->t_gen;
    pthread_mutex_unlock(&P->lock);
    if (P->power.decode_tps <= 0 && n_gen > 0 && t_gen > 0) P->pol.p.decode_tps = n_gen / t_gen;
    const nm_power_targets tg = nm_power_policy_step(&P->pol, br.pct);
    char err[512];
    if (P->p.dvfs && nm_power_actuators_apply(P->p.dvfs, &tg, err, sizeof err) != NM_OK && !P->dvfs_said) {
        P->dvfs_said = true; // (once: it fails alike each time)
        const int n = snprintf(note, sizeof note, "power: DVFS not applied: %s", err);
        push(P, &(nm_pipeline_event){.kind = NM_PIPELINE_NOTE, .request = r->id}, note, (size_t)n);
    }
    const nm_power_targets *o = &P->said;
    if (!P->power_said || tg.state != o->state || tg.alpha != o->alpha || tg.fps != o->fps ||
        tg.decode_share != o->decode_share || tg.decode_tps_cap != o->decode_tps_cap || tg.n_threads != o->n_threads ||
        tg.cascade != o->cascade || tg.freq_share != o->freq_share) {
        P->power_said = true, P->said = tg;
        char pace[64] = "";
        if (tg.decode_tps_cap > 0) snprintf(pace, sizeof pace, " (%.1f tokens/s)", tg.decode_tps_cap);
        const int n = snprintf(note, sizeof note,
                               "battery %.1f %%: %s, alpha %.2f: frames %.2f/s, decoder %.0f%% of its speed%s%s, "
                               "%d thread%s a brick%s",
                               br.pct, nm_power_state_name(tg.state), tg.alpha, tg.fps, 100 * tg.decode_share, pace,
                               tg.decode_share < 1 && tg.decode_tps_cap <= 0 ? " (once an answer has measured it)" : "",
                               (int)tg.n_threads, tg.n_threads == 1 ? "" : "s",
                               tg.cascade ? ", each brick loaded, run and released in turn" : "");
        nm_pipeline_event ev = {.kind = NM_PIPELINE_POWER, .request = r->id, .power = tg, .battery_pct = br.pct};
        push(P, &ev, note, (size_t)n);
    }
    return tg;
}

// Request r's plan, when the feed thread takes it: the cascade or the
// resident bricks, their threads, the decoder's pace.
static void plan(nm_pipeline *P, pl_req *r) {
    bool cascade = P->p.mode == NM_PIPELINE_CASCADE;
    int32_t threads = threads_of(P);
    double max_tps = 0;
    if (P->p.battery) {
        const nm_power_targets tg = power_step(P, r);
        cascade = cascade || tg.cascade;
        if (tg.n_threads > 0) threads = tg.n_threads;
        if (tg.decode_share < 1 && tg.decode_tps_cap > 0) max_tps = tg.decode_tps_cap;
    }
    if (P->p.battery && P->p.mode == NM_PIPELINE_CASCADE) P->threads_now = threads; // (none loaded between requests)
    pthread_mutex_lock(&P->lock);
    r->cascade = cascade;
    r->threads = threads;
    r->max_tps = max_tps;
    r->remake = P->p.mode != NM_PIPELINE_CASCADE && (cascade ? P->resident : !P->resident || threads != threads_of(P));
    pthread_mutex_unlock(&P->lock);
}

// The graph idle (every earlier request done, the lanes idle): the resident
// bricks freed, and made again with r's threads unless r runs as the
// cascade. False (recorded on r) when one fails to load.
static bool remake(nm_pipeline *P, pl_req *r) {
    for (int k = 1; k < 5; k++) unload(P, (nm_brick_kind)k);
    P->resident = false;
    P->threads_now = r->threads;
    if (r->cascade) return true;
    char err[600];
    if (!load_all(P, err, sizeof err)) {
        record(P, r, NM_ERR_STATE, "%s", err);
        return false;
    }
    P->resident = true;
    return true;
}

// Requests 1 .. r->id - 1 are all done. The lock held.
static bool earlier_done_locked(nm_pipeline *P, const pl_req *r) {
    while (P->done_upto + 1 < r->id) {
        const pl_req *q = req_of(P, P->done_upto + 1);
        if (q && !q->announced) return false;
        P->done_upto++;
    }
    return true;
}

static void *feed_main(void *arg) {
    nm_pipeline *P = arg;
    for (;;) {
        pthread_mutex_lock(&P->lock);
        while (!P->q_head && !P->closed && !P->stopping) pthread_cond_wait(&P->cond, &P->lock);
        pl_req *r = P->q_head;
        if (!r) {
            pthread_mutex_unlock(&P->lock);
            break;
        }
        P->q_head = r->next;
        if (!P->q_head) P->q_tail = NULL;
        P->n_queued--;
        pthread_cond_broadcast(&P->cond); // (a submit waiting for room)
        pthread_mutex_unlock(&P->lock);
        plan(P, r);
        pthread_mutex_lock(&P->lock);
        // one request at a time through the graph, or each turn after the last answer; the cascade and
        // the bricks made again with the graph idle
        const bool wait = P->p.mode != NM_PIPELINE_PIPELINED || r->cascade || r->remake ||
                          (P->p.keep_history && P->has[NM_BRICK_LLM]);
        while (wait && !earlier_done_locked(P, r) && !P->stopping) pthread_cond_wait(&P->cond, &P->lock);
        if (r->remake)
            for (int k = 1; k < 5; k++) lane_idle_locked(P, (nm_brick_kind)k);
        const bool stop = P->stopping;
        pthread_mutex_unlock(&P->lock);
        if (r->remake && !stop && !remake(P, r)) {
            if (r->audio) drop_audio(P, r);
            done(P, r, NM_OK, NULL);
        } else {
            serve(P, r, stop);
        }
        free_req_body(r); // (this thread's from the queue on: what the rest of the graph needs is in the rings)
        pthread_mutex_lock(&P->lock);
        r->fed = true;
        retire_locked(P, r);
        pthread_mutex_unlock(&P->lock);
    }
    return NULL;
}

// keep_history: the request's turn and its answer join the conversation.
static void remember(nm_pipeline *P, pl_req *r, const char *answer, size_t n) {
    pthread_mutex_lock(&P->lock);
    if (r->turn && P->n_hist + 2 > P->cap_hist) {
        size_t cap = P->cap_hist ? 2 * P->cap_hist : 16;
        nm_chat_msg *h = realloc(P->hist, sizeof *h * cap);
        if (h) P->hist = h, P->cap_hist = cap;
    }
    char *a = dup_n(answer, n);
    if (r->turn && a && P->n_hist + 2 <= P->cap_hist) {
        P->hist[P->n_hist++] = (nm_chat_msg){"user", r->turn};
        P->hist[P->n_hist++] = (nm_chat_msg){"assistant", a};
        r->turn = NULL;
    } else {
        free(a);
    }
    pthread_mutex_unlock(&P->lock);
}

static void *answers_main(void *arg) {
    nm_pipeline *P = arg;
    char *answer = NULL; // keep_history: the answer so far
    size_t len = 0, cap = 0;
    uint64_t cur = 0;
    for (;;) {
        nm_tabm_slot s;
        if (nm_tabm_acquire_read(P->llm_out, -1, &s) != NM_OK) break;
        const uint64_t id = s.meta->request, user = s.meta->user;
        pthread_mutex_lock(&P->lock);
        pl_req *r = req_of(P, id);
        const bool speak = r && P->has[NM_BRICK_TTS] && !r->silent, cascade = r && r->cascade;
        if (r && id != cur) cur = id, len = 0;
        pthread_mutex_unlock(&P->lock);
        const size_t n = s.meta->kind == NM_TABM_TEXT ? (size_t)s.meta->size : 0;
        if (r && n > 0) {
            pthread_mutex_lock(&P->lock);
            if (r->t.first_text == 0) r->t.first_text = since(r);
            pthread_mutex_unlock(&P->lock);
            nm_pipeline_event ev = {.kind = NM_PIPELINE_TEXT, .request = id};
            push(P, &ev, s.data, n);
            if (P->p.keep_history && reserve(&answer, &cap, len + n + 1)) memcpy(answer + len, s.data, n), len += n;
            // the sentence into the voice's slot: a copy between bricks, counted (CASCADE: held for the voice,
            // loaded once the decoder is released: counted here, and again into its slot)
            if (speak && !cascade) {
                put_text(P, P->tts_in, P->ep_llm, P->ep_tts, s.data, n, NM_BRICK_MORE, r);
            } else if (speak && reserve(&r->said, &r->cap_said, r->n_said + n + 1)) {
                nm_ledger_copy(P->ledger, P->ep_llm, P->ep_tts, r->said + r->n_said, s.data, n);
                r->said[r->n_said + n] = '\0';
                r->n_said += n + 1;
            }
        }
        nm_tabm_release(P->llm_out, &s);
        if ((user & NM_BRICK_MORE) || !r) continue;
        // the answer's end
        const nm_llm_stop why = NM_LLM_STOP_OF(user);
        pthread_mutex_lock(&P->lock);
        r->stop = why;
        r->t.answered = since(r);
        if ((user & NM_BRICK_CANCELLED) && r->status == NM_OK && !r->cancelled) r->cancelled = true;
        if ((user & NM_BRICK_ERROR) && r->status == NM_OK) {
            snprintf(r->err, sizeof r->err, "llm: %s", nm_brick_request_error(P->llm, id));
            r->status = why == NM_LLM_STOP_BAD_INPUT ? NM_ERR_FORMAT : NM_ERR_STATE;
        }
        const bool ok = r->status == NM_OK && !r->cancelled;
        pthread_mutex_unlock(&P->lock);
        // the turn and its answer, a cancelled one as far as it went, join the conversation
        if (P->p.keep_history && r->status == NM_OK && (ok || len > 0)) remember(P, r, answer ? answer : "", len);
        if (speak && !cascade) { // the voice's request ends (a cancelled one is marked)
            if (!ok) nm_tabm_cancel_request(P->tts_in, id);
            if (put_text(P, P->tts_in, -1, P->ep_tts, "", 0, 0, r) == NM_OK) {
                // DONE once the voice has ended it too (a cancelled voice may end it first: then here)
                pthread_mutex_lock(&P->lock);
                r->answer_ended = true;
                if (r->speech_ended) done_locked(P, r, NM_OK, NULL);
                pthread_mutex_unlock(&P->lock);
                continue;
            }
        }
        pthread_mutex_lock(&P->lock);
        r->answer_ended = true; // (the cascade: the feed thread waits for it, releases the decoder, then ends the
        if (!cascade) done_locked(P, r, NM_OK, NULL); // request or loads the voice for what it holds)
        pthread_cond_broadcast(&P->cond);
        pthread_mutex_unlock(&P->lock);
    }
    free(answer);
    fail_all(P, "the decoder's ring was shut down");
    return NULL;
}

static void *speech_main(void *arg) {
    nm_pipeline *P = arg;
    for (;;) {
        nm_tabm_slot s;
        if (nm_tabm_acquire_read(P->tts_out, -1, &s) != NM_OK) break;
        const uint64_t id = s.meta->request, user = s.meta->user;
        pthread_mutex_lock(&P->lock);
        pl_req *r = req_of(P, id);
        // (a cancelled request's speech is dropped: barge-in stops it at once)
        const bool pcm = r && !r->cancelled && s.meta->kind == NM_TABM_PCM_S16 && s.meta->size > 0;
        if (pcm) {
            if (r->t.first_audio == 0) r->t.first_audio = since(r);
            r->t.n_samples += (int64_t)(s.meta->size / 2);
            nm_pipeline_event ev = {.kind = NM_PIPELINE_AUDIO, .request = id, .pcm = s.data,
                                    .n_samples = (int64_t)(s.meta->size / 2), .sample_rate = s.meta->sample_rate};
            if (!push_locked(P, &ev, "", 0, &s)) nm_tabm_release(P->tts_out, &s); // (the slot is the reader's now)
        }
        if (r && !(user & NM_BRICK_MORE)) {
            r->t.spoken = since(r);
            if ((user & NM_BRICK_CANCELLED) && !r->cancelled) r->cancelled = true;
            if ((user & NM_BRICK_ERROR) && r->status == NM_OK) {
                snprintf(r->err, sizeof r->err, "tts: %s", nm_brick_request_error(P->tts, id));
                r->status = NM_ERR_FORMAT;
            }
            r->speech_ended = true;
            // (else the answers thread; the cascade: the feed thread, once it has released the voice)
            if (!r->cascade && (!P->has[NM_BRICK_LLM] || r->answer_ended)) done_locked(P, r, NM_OK, NULL);
            pthread_cond_broadcast(&P->cond); // (the cascade's feed thread waits for the voice's end)
        }
        pthread_mutex_unlock(&P->lock);
        if (!pcm) nm_tabm_release(P->tts_out, &s);
    }
    fail_all(P, "the voice's ring was shut down");
    return NULL;
}

static void *lane_main(void *arg) {
    pl_lane *L = arg;
    nm_pipeline *P = L->P;
    const int32_t cap = (int32_t)(sizeof L->given / sizeof L->given[0]);
    nm_status st = NM_OK;
    pthread_mutex_lock(&P->lock);
    while (st == NM_OK) {
        while (L->n_given == 0 && !P->stopping) pthread_cond_wait(&P->cond, &P->lock);
        if (P->stopping) break;
        nm_brick *b = *slot_of(P, L->kind); // (loaded before the request was given: freed only when idle)
        const uint64_t id = L->given[L->head];
        L->head = (L->head + 1) % cap, L->n_given--;
        L->busy = true;
        pthread_mutex_unlock(&P->lock);
        st = nm_brick_step(b, L->in, L->out); // (a request's failure is on its slots)
        const nm_brick_stats s = nm_brick_get_stats(b);
        pthread_mutex_lock(&P->lock);
        L->cur = s;
        L->busy = false;
        served_locked(P, id);
        pthread_cond_broadcast(&P->cond);
    }
    for (; L->n_given > 0; L->head = (L->head + 1) % cap, L->n_given--) served_locked(P, L->given[L->head]); // (never served)
    pthread_cond_broadcast(&P->cond);
    pthread_mutex_unlock(&P->lock);
    // the brick or a ring broke: its neighbours wake and end (as nm_brick_run's)
    if (st != NM_OK) nm_tabm_shutdown(L->in), nm_tabm_shutdown(L->out);
    return NULL;
}

// ---- create, free ----------------------------------------------------------------------------------

static nm_status ring(nm_tabm **r, uint32_t n, size_t bytes, char *err, size_t err_size) {
    return nm_tabm_create(NULL, n, bytes, r, err, err_size);
}

static bool start_lane(nm_pipeline *P, nm_brick_kind k, nm_tabm *in, nm_tabm *out) {
    pl_lane *L = &P->L[k];
    L->P = P, L->kind = k, L->in = in, L->out = out;
    L->started = pthread_create(&L->th, NULL, lane_main, L) == 0;
    return L->started;
}

nm_status nm_pipeline_create(const nm_pipeline_params *p, nm_pipeline **out, char *err, size_t err_size) {
    if (!out) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: no place for the handle");
    *out = NULL;
    if (p && p->vision && !p->llm)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: a vision brick needs an llm brick to feed");
    if (!p || (!p->stt && !p->llm && !p->tts))
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: no brick (give stt, llm or tts parameters)");
    if ((unsigned)p->mode > NM_PIPELINE_CASCADE)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: mode %d (pipelined 0, sequential 1, cascade 2)",
                       (int)p->mode);
    if (p->jinja_template && p->jinja_len == 0)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: a Jinja template of 0 bytes");
    nm_pipeline *P = calloc(1, sizeof *P);
    if (!P) return nm_fail(NM_ERR_NOMEM, err, err_size, "pipeline: out of memory");
    P->p = *p;
    pthread_mutex_init(&P->lock, NULL);
    pthread_mutex_init(&P->submit_lock, NULL);
    pthread_cond_init(&P->cond, NULL);
    P->system_prompt = dup_s(p->system_prompt);
    P->chat_template = dup_s(p->chat_template);
    P->jinja_template = p->jinja_template ? dup_n(p->jinja_template, p->jinja_len) : NULL;
    P->jinja_name = dup_s(p->jinja_name ? p->jinja_name : p->jinja_template ? "the Jinja template"
                                                                             : "the model's chat template");
    P->p.jinja_name = P->jinja_name;
    P->p.system_prompt = P->system_prompt;
    P->p.chat_template = P->chat_template;
    P->p.jinja_template = P->jinja_template;
    if (P->p.queue <= 0) P->p.queue = 8;
    if (P->p.max_audio_s <= 0) P->p.max_audio_s = 60;
    P->ledger = p->ledger;
    if (!P->ledger) P->ledger = nm_ledger_create(), P->own_ledger = true;
    nm_status st = NM_ERR_NOMEM;
    if (!P->ledger || (p->system_prompt && !P->system_prompt) || (p->chat_template && !P->chat_template) ||
        (p->jinja_template && !P->jinja_template) || !P->jinja_name) {
        nm_fail(st, err, err_size, "pipeline: out of memory");
        goto fail;
    }
    P->ep_caller = nm_ledger_endpoint(P->ledger, "caller");
    P->ep_vision = nm_ledger_endpoint(P->ledger, p->vision && p->vision->name ? p->vision->name : "vision");
    P->ep_stt = nm_ledger_endpoint(P->ledger, p->stt && p->stt->name ? p->stt->name : "stt");
    P->ep_llm = nm_ledger_endpoint(P->ledger, p->llm && p->llm->name ? p->llm->name : "llm");
    P->ep_tts = nm_ledger_endpoint(P->ledger, p->tts && p->tts->name ? p->tts->name : "tts");
    if (P->ep_caller < 0 || P->ep_stt < 0 || P->ep_vision < 0 || P->ep_llm < 0 || P->ep_tts < 0) {
        st = nm_fail(NM_ERR_RANGE, err, err_size, "pipeline: the ledger has no room for its endpoints");
        goto fail;
    }
    // the bricks (the vision brick writes the decoder's ring: it loads after it); CASCADE loads each once
    // here, to check it and size the rings, and again for each request's stage
    const nm_brick_params *given[5] = {NULL, p->stt, p->vision, p->llm, p->tts};
    for (int k = 1; k < 5; k++)
        if (given[k]) P->has[k] = true, P->given[k] = *given[k];
    // power: the policy's threads at full charge are the LLM brick's (all cores where it names none)
    P->power = p->power ? *p->power : nm_power_default_params();
    if (P->power.n_threads == 0) P->power.n_threads = p->llm && p->llm->n_threads > 0 ? p->llm->n_threads : nm_cpu_count();
    if (P->p.battery_speed <= 0) P->p.battery_speed = 1;
    P->t_create = nm_now_s();
    if (p->battery) {
        char e[256];
        if ((st = nm_power_policy_init(&P->pol, &P->power, e, sizeof e)) != NM_OK) {
            nm_fail(st, err, err_size, "pipeline: %s", e);
            goto fail;
        }
    }
    if ((p->stt && (st = load(P, NM_BRICK_STT, err, err_size)) != NM_OK) ||
        (p->llm && (st = load(P, NM_BRICK_LLM, err, err_size)) != NM_OK) ||
        (p->vision && (st = load(P, NM_BRICK_VISION, err, err_size)) != NM_OK) ||
        (p->tts && (st = load(P, NM_BRICK_TTS, err, err_size)) != NM_OK))
        goto fail;
    if (P->llm) P->n_predict = p->llm->llm.n_predict;
    if (P->tts) P->tts_rate = nm_brick_tts_sample_rate(P->tts);
    if (P->llm && p->chat && !p->jinja && !nm_chat_template_name(P->m, P->chat_template)) {
        st = nm_fail(NM_ERR_TEMPLATE, err, err_size, "pipeline: %s (name one: %s)",
                     P->chat_template ? "no such chat template" : "the model names no chat template nanomind knows",
                     nm_chat_template_names());
        goto fail;
    }
    if (P->llm && p->chat && p->jinja) { // a template that fails a chat of one turn fails here, not at each request
        const nm_chat_msg probe[] = {{"system", P->system_prompt}, {"user", "hi"}};
        const char *fallback = NULL;
        char e[1024];
        char *text = format_chat(P, probe + (P->system_prompt ? 0 : 1), P->system_prompt ? 2 : 1, &fallback, &st, e,
                                 sizeof e);
        free(text);
        if (!text) {
            nm_fail(st, err, err_size, "%s", e);
            goto fail;
        }
        if (fallback && !(P->note = dup_s(e))) {
            st = nm_fail(NM_ERR_NOMEM, err, err_size, "pipeline: out of memory");
            goto fail;
        }
    }
    // the rings, sized from the bricks' slots
    size_t llm_slot = P->llm ? nm_brick_in_slot_bytes(P->llm) : 0;
    if (P->vision && nm_brick_out_slot_bytes(P->vision) > llm_slot) llm_slot = nm_brick_out_slot_bytes(P->vision);
    if ((P->stt && ((st = ring(&P->stt_in, STT_IN_SLOTS, sizeof(float) * 16000 * (size_t)P->p.max_audio_s, err,
                               err_size)) != NM_OK ||
                    (st = ring(&P->stt_out, OUT_SLOTS, nm_brick_out_slot_bytes(P->stt), err, err_size)) != NM_OK)) ||
        (P->llm && ((st = ring(&P->llm_in, LLM_IN_SLOTS, llm_slot, err, err_size)) != NM_OK ||
                    (st = ring(&P->llm_out, OUT_SLOTS, nm_brick_out_slot_bytes(P->llm), err, err_size)) != NM_OK)) ||
        (P->vision && (st = ring(&P->img, 1, nm_brick_in_slot_bytes(P->vision), err, err_size)) != NM_OK) ||
        (P->tts && ((st = ring(&P->tts_in, 16, P->llm ? TEXT_SLOT : NM_TTS_MAX_TEXT, err, err_size)) != NM_OK ||
                    (st = ring(&P->tts_out, OUT_SLOTS, nm_brick_out_slot_bytes(P->tts), err, err_size)) != NM_OK)))
        goto fail;
    if (P->p.mode == NM_PIPELINE_CASCADE) { // nothing resident between requests
        for (int k = 1; k < 5; k++) unload(P, (nm_brick_kind)k);
    }
    P->resident = P->p.mode != NM_PIPELINE_CASCADE;
    // the lanes and the threads
    bool ok = (!P->has[NM_BRICK_STT] || start_lane(P, NM_BRICK_STT, P->stt_in, P->stt_out)) &&
              (!P->has[NM_BRICK_LLM] || start_lane(P, NM_BRICK_LLM, P->llm_in, P->llm_out)) &&
              (!P->has[NM_BRICK_TTS] || start_lane(P, NM_BRICK_TTS, P->tts_in, P->tts_out));
    ok = ok && (P->feed_started = pthread_create(&P->th_feed, NULL, feed_main, P) == 0);
    ok = ok && (!P->has[NM_BRICK_LLM] || (P->answers_started = pthread_create(&P->th_answers, NULL, answers_main, P) == 0));
    ok = ok && (!P->has[NM_BRICK_TTS] || (P->speech_started = pthread_create(&P->th_speech, NULL, speech_main, P) == 0));
    if (!ok) {
        st = nm_fail(NM_ERR_NOMEM, err, err_size, "pipeline: cannot start its threads");
        goto fail;
    }
    *out = P;
    return NM_OK;
fail:
    nm_pipeline_free(P);
    return st;
}

static void shut(nm_tabm *r) {
    if (r) nm_tabm_shutdown(r);
}

void nm_pipeline_free(nm_pipeline *P) {
    if (!P) return;
    pthread_mutex_lock(&P->lock);
    P->stopping = true;
    pthread_cond_broadcast(&P->cond);
    pthread_mutex_unlock(&P->lock);
    nm_tabm *rings[] = {P->stt_in, P->stt_out, P->img, P->llm_in, P->llm_out, P->tts_in, P->tts_out};
    for (size_t i = 0; i < sizeof rings / sizeof rings[0]; i++) shut(rings[i]);
    if (P->feed_started) pthread_join(P->th_feed, NULL);
    if (P->answers_started) pthread_join(P->th_answers, NULL);
    if (P->speech_started) pthread_join(P->th_speech, NULL);
    for (int k = 1; k < 5; k++)
        if (P->L[k].started) pthread_join(P->L[k].th, NULL);
    if (P->cur) P->cur->next = NULL; // the event lent to the reader, those not read, the spares
    pl_event *lists[] = {P->cur, P->ev_head, P->spare};
    for (size_t i = 0; i < 3; i++)
        for (pl_event *e = lists[i], *next; e; e = next) {
            next = e->next;
            if (e->has_slot) nm_tabm_release(P->tts_out, &e->slot);
            free(e->text);
            free(e);
        }
    for (size_t i = 0; i < sizeof rings / sizeof rings[0]; i++) nm_tabm_free(rings[i]);
    nm_brick_free(P->vision);
    nm_brick_free(P->stt);
    nm_brick_free(P->llm);
    nm_brick_free(P->tts);
    for (uint64_t i = 0; i < P->n_reqs; i++) {
        if (!P->reqs[i]) continue;
        free_req_body(P->reqs[i]);
        free(P->reqs[i]->turn);
        free(P->reqs[i]);
    }
    free(P->reqs);
    for (size_t i = 0; i < P->n_hist; i++) free((char *)P->hist[i].content);
    free(P->hist);
    nm_vad_free(P->vad);
    if (P->own_ledger) nm_ledger_free(P->ledger);
    free(P->system_prompt), free(P->chat_template), free(P->jinja_template), free(P->jinja_name), free(P->note);
    pthread_cond_destroy(&P->cond);
    pthread_mutex_destroy(&P->lock);
    pthread_mutex_destroy(&P->submit_lock);
    free(P);
}

// ---- requests ----------------------------------------------------------------------------------------

// The request's audio (and its STT parameters) into the STT ring: both slots
// held, filled, then published in order, so a failure leaves nothing behind.
static nm_status put_audio(nm_pipeline *P, const nm_pipeline_input *in, uint64_t id, char *err, size_t err_size) {
    nm_tabm_slot ps, as;
    const bool params = in->stt_params != NULL;
    nm_status st = params ? nm_tabm_acquire_write(P->stt_in, 0, -1, &ps) : NM_OK;
    if (st == NM_OK && (st = nm_tabm_acquire_write(P->stt_in, 0, -1, &as)) != NM_OK && params)
        nm_tabm_cancel(P->stt_in, &ps);
    if (st != NM_OK) return nm_fail(st, err, err_size, "stt: its ring: %s", nm_status_str(st));
    const int64_t cap = (int64_t)(as.capacity / sizeof(float));
    int64_t n = 0;
    char e[400] = "";
    if (in->audio_path) {
        st = nm_audio_load_into(in->audio_path, 16000, as.data, cap, &n, e, sizeof e);
        if (st == NM_ERR_RANGE) nm_fail(st, e, sizeof e, "%s: longer than %d s", in->audio_path, P->p.max_audio_s);
    } else if (in->n_samples > cap) {
        st = nm_fail(NM_ERR_RANGE, e, sizeof e, "%lld samples: longer than %d s", (long long)in->n_samples,
                     P->p.max_audio_s);
    } else {
        n = in->n_samples;
        nm_ledger_copy(P->ledger, P->ep_caller, P->ep_stt, as.data, in->pcm, sizeof(float) * (size_t)n); // the caller's
    }
    const size_t pn = params ? strlen(in->stt_params) : 0;
    if (st == NM_OK && params && pn > ps.capacity)
        st = nm_fail(NM_ERR_RANGE, e, sizeof e, "the STT parameters (%zu bytes) do not fit a slot", pn);
    if (st == NM_OK && n == 0) st = nm_fail(NM_ERR_FORMAT, e, sizeof e, "no audio (0 samples)");
    if (st != NM_OK) {
        if (params) nm_tabm_cancel(P->stt_in, &ps);
        nm_tabm_cancel(P->stt_in, &as);
        return nm_fail(st, err, err_size, "audio %s (%s)", e, nm_status_str(st));
    }
    if (params) {
        memcpy(ps.data, in->stt_params, pn);
        *ps.meta = (nm_tabm_meta){.kind = NM_TABM_PARAMS, .ndim = 1, .shape = {(int64_t)pn}, .size = pn,
                                  .user = NM_BRICK_MORE, .request = id};
    }
    *as.meta = (nm_tabm_meta){.kind = NM_TABM_PCM_F32, .ndim = 1, .shape = {n}, .size = sizeof(float) * (uint64_t)n,
                              .sample_rate = 16000, .request = id};
    if (params && (st = nm_tabm_publish(P->stt_in, &ps)) != NM_OK) nm_tabm_cancel(P->stt_in, &ps);
    if (st == NM_OK && (st = nm_tabm_publish(P->stt_in, &as)) != NM_OK) nm_tabm_cancel(P->stt_in, &as);
    return st == NM_OK ? NM_OK : nm_fail(st, err, err_size, "stt: its ring: %s", nm_status_str(st));
}

nm_status nm_pipeline_submit(nm_pipeline *P, const nm_pipeline_input *in, uint64_t *id, char *err, size_t err_size) {
    if (id) *id = 0;
    if (!P || !in) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: no pipeline or no input");
    const bool audio = in->audio_path || in->pcm, image = in->n_images > 0;
    if (in->audio_path && in->pcm)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: audio given twice (pcm and a file)");
    if (in->n_images < 0 || in->n_images > NM_PIPELINE_MAX_IMAGES || (in->n_images > 0 && !in->images))
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: %d images (at most %d a request)",
                       (int)in->n_images, NM_PIPELINE_MAX_IMAGES);
    for (int32_t i = 0; i < in->n_images; i++)
        if (!in->images[i].path == !in->images[i].bytes)
            return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: image %d: give a path or bytes, one of them",
                           (int)i + 1);
    const int32_t marks = in->text ? n_markers(in->text) : 0;
    if (marks > 0 && marks != in->n_images)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: the text has %d %s markers for %d images",
                       (int)marks, MEDIA_MARKER, (int)in->n_images);
    if (audio && !P->has[NM_BRICK_STT])
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: audio, and no STT brick to hear it");
    if (audio && in->text)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: audio and text: the question is one of them");
    if (image && !P->has[NM_BRICK_VISION])
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: an image, and no vision brick to see it");
    if (in->pcm && in->n_samples <= 0)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: %lld samples", (long long)in->n_samples);
    if (!audio && !in->text)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: nothing to ask (no text and no audio)");
    if (!audio && !P->has[NM_BRICK_LLM] && !P->has[NM_BRICK_TTS])
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: text, and no LLM or TTS brick to take it");
    if (in->llm_params && !P->has[NM_BRICK_LLM])
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: LLM parameters, and no LLM brick");
    if (in->tts_params && !P->has[NM_BRICK_TTS])
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: TTS parameters, and no TTS brick");
    if (in->stt_params && !audio)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: STT parameters, and no audio");
    pl_req *r = calloc(1, sizeof *r);
    if (!r) return nm_fail(NM_ERR_NOMEM, err, err_size, "pipeline: out of memory");
    r->audio = audio;
    r->silent = in->silent;
    r->text = dup_s(in->text);
    r->llm_params = dup_s(in->llm_params);
    r->tts_params = dup_s(in->tts_params);
    bool paths = true;
    for (int32_t i = 0; i < in->n_images; i++) { // (bytes: read into the vision brick's slot in their turn, one copy)
        r->img[i] = (pl_img){dup_s(in->images[i].path), in->images[i].bytes, in->images[i].n_bytes};
        paths = paths && (!in->images[i].path || r->img[i].path);
    }
    r->n_images = in->n_images;
    if ((in->text && !r->text) || !paths || (in->llm_params && !r->llm_params) || (in->tts_params && !r->tts_params)) {
        free_req_body(r);
        free(r);
        return nm_fail(NM_ERR_NOMEM, err, err_size, "pipeline: out of memory");
    }
    // ids, the STT ring's order and the queue's agree: one submit at a time
    pthread_mutex_lock(&P->submit_lock);
    pthread_mutex_lock(&P->lock);
    while (P->n_queued >= P->p.queue && !P->closed && !P->stopping) pthread_cond_wait(&P->cond, &P->lock);
    nm_status st = P->closed || P->stopping ? NM_ERR_SHUTDOWN : NM_OK;
    if (st == NM_OK && P->n_reqs == P->cap_reqs) {
        const uint64_t cap = P->cap_reqs ? 2 * P->cap_reqs : 64;
        pl_req **g = realloc(P->reqs, sizeof *g * cap);
        if (g) P->reqs = g, P->cap_reqs = cap;
        else st = NM_ERR_NOMEM;
    }
    const uint64_t rid = P->n_reqs + 1;
    pthread_mutex_unlock(&P->lock);
    if (st == NM_OK && audio) st = put_audio(P, in, rid, err, err_size);
    else if (st != NM_OK) nm_fail(st, err, err_size, "pipeline: %s", st == NM_ERR_NOMEM ? "out of memory" : "closed");
    if (st != NM_OK) {
        pthread_mutex_unlock(&P->submit_lock);
        free_req_body(r);
        free(r);
        return st;
    }
    pthread_mutex_lock(&P->lock);
    r->id = rid;
    r->t_submit = nm_now_s();
    P->reqs[P->n_reqs++] = r;
    if (P->q_tail) P->q_tail->next = r;
    else P->q_head = r;
    P->q_tail = r;
    P->n_queued++;
    pthread_cond_broadcast(&P->cond);
    pthread_mutex_unlock(&P->lock);
    pthread_mutex_unlock(&P->submit_lock);
    if (id) *id = rid;
    return NM_OK;
}

nm_status nm_pipeline_read(nm_pipeline *P, int64_t timeout_ns, nm_pipeline_event *ev) {
    if (!P || !ev) return NM_ERR_INVALID_ARG;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    if (timeout_ns > 0) {
        until.tv_sec += (time_t)(timeout_ns / 1000000000);
        until.tv_nsec += (long)(timeout_ns % 1000000000);
        if (until.tv_nsec >= 1000000000) until.tv_sec++, until.tv_nsec -= 1000000000;
    }
    pthread_mutex_lock(&P->lock);
    if (P->cur) { // what the last event lent; a DONE read: its request may go
        pl_req *done_r = P->cur->ev.kind == NM_PIPELINE_DONE ? req_of(P, P->cur->ev.request) : NULL;
        if (done_r) done_r->read = true, retire_locked(P, done_r);
        if (P->cur->has_slot) nm_tabm_release(P->tts_out, &P->cur->slot);
        P->cur->has_slot = false;
        P->cur->next = P->spare;
        P->spare = P->cur;
        P->cur = NULL;
    }
    nm_status st = NM_OK;
    for (;;) {
        if (P->ev_head) break;
        if ((P->closed || P->stopping) && P->n_done == P->n_reqs) {
            st = NM_ERR_SHUTDOWN;
            break;
        }
        if (timeout_ns == 0) {
            st = NM_ERR_AGAIN;
            break;
        }
        if (timeout_ns < 0) {
            pthread_cond_wait(&P->cond, &P->lock);
        } else if (pthread_cond_timedwait(&P->cond, &P->lock, &until) != 0 && !P->ev_head) {
            st = NM_ERR_TIMEOUT;
            break;
        }
    }
    if (st == NM_OK) {
        P->cur = P->ev_head;
        P->ev_head = P->cur->next;
        if (!P->ev_head) P->ev_tail = NULL;
        *ev = P->cur->ev;
    }
    pthread_mutex_unlock(&P->lock);
    return st;
}

nm_status nm_pipeline_cancel(nm_pipeline *P, uint64_t request) {
    if (!P) return NM_ERR_INVALID_ARG;
    pthread_mutex_lock(&P->lock);
    pl_req *r = req_of(P, request);
    if (!r) { // never given; or done, its DONE read, and its record freed
        const bool given = request >= 1 && request <= P->n_reqs;
        pthread_mutex_unlock(&P->lock);
        return given ? NM_OK : NM_ERR_RANGE;
    }
    const bool mark = !r->done && !r->cancelled;
    if (mark) { // it is silent from now: its speech not yet read goes
        r->cancelled = true;
        for (pl_event **pe = &P->ev_head, *prev = NULL; *pe;) {
            pl_event *e = *pe;
            if (e->ev.kind != NM_PIPELINE_AUDIO || e->ev.request != request) {
                prev = e, pe = &e->next;
                continue;
            }
            *pe = e->next;
            if (P->ev_tail == e) P->ev_tail = prev;
            if (e->has_slot) nm_tabm_release(P->tts_out, &e->slot);
            e->has_slot = false;
            e->next = P->spare, P->spare = e;
        }
    }
    pthread_mutex_unlock(&P->lock);
    if (!mark) return NM_OK;
    // wherever it is: each brick stops it at its next check and ends it downstream
    nm_tabm *rings[] = {P->stt_in, P->img, P->llm_in, P->tts_in};
    for (size_t i = 0; i < 4; i++)
        if (rings[i]) nm_tabm_cancel_request(rings[i], request);
    return NM_OK;
}

// ---- listening -----------------------------------------------------------------------------------

typedef struct heard_ctx {
    nm_pipeline *P;
    nm_status st;
    char *err;
    size_t err_size;
} heard_ctx;

// An utterance the VAD cut: a request of its own.
static void on_utterance(void *user, const float *pcm, int64_t n, int64_t t0) {
    heard_ctx *h = user;
    char e[512];
    const nm_status st = nm_pipeline_submit(h->P, &(nm_pipeline_input){.pcm = pcm, .n_samples = n}, NULL, e, sizeof e);
    if (st != NM_OK && h->st == NM_OK) {
        h->st = st;
        nm_fail(st, h->err, h->err_size, "pipeline: the question heard at %.2f s: %s", (double)t0 / 16000.0, e);
    }
}

// Speech began at stream position `at` (samples): every request in flight is
// cancelled, and a BARGE_IN event says so.
static void barge_in(nm_pipeline *P, int64_t at) {
    uint64_t newest = 0, oldest = 0;
    pthread_mutex_lock(&P->lock);
    for (uint64_t i = 0; i < P->n_reqs; i++)
        if (P->reqs[i] && !P->reqs[i]->done && !P->reqs[i]->cancelled) newest = i + 1, oldest = oldest ? oldest : i + 1;
    pthread_mutex_unlock(&P->lock);
    if (!newest) return;
    for (uint64_t id = oldest; id <= newest; id++) nm_pipeline_cancel(P, id);
    const int64_t voiced = (int64_t)P->vad_p.start_frames * P->vad_p.frame_ms * 16; // the frames that opened it
    nm_pipeline_event ev = {.kind = NM_PIPELINE_BARGE_IN, .request = newest, .t0 = (at - voiced) / 160, .t1 = at / 160};
    push(P, &ev, "", 0);
}

nm_status nm_pipeline_hear(nm_pipeline *P, const float *pcm, int64_t n, char *err, size_t err_size) {
    if (!P) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: no pipeline");
    if (!P->has[NM_BRICK_STT])
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: heard audio, and no STT brick to hear it");
    if (n < 0 || (n > 0 && !pcm)) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: %lld samples heard", (long long)n);
    if (!P->vad) {
        P->vad_p = P->p.vad.rate ? P->p.vad : nm_vad_default_params();
        if (P->vad_p.rate != 16000)
            return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: the VAD's rate is %d Hz (16000 heard)",
                           (int)P->vad_p.rate);
        char e[256];
        const nm_status st = nm_vad_create(&P->vad_p, &P->vad, e, sizeof e);
        if (st != NM_OK) return nm_fail(st, err, err_size, "pipeline: the VAD: %s", e);
    }
    heard_ctx h = {P, NM_OK, err, err_size};
    if (n == 0 || !pcm) {
        nm_vad_flush(P->vad, on_utterance, &h);
        P->vad_speech = false;
        return h.st;
    }
    // a frame at a time, so that speech is known (and barges in) within a frame of where the VAD sees it
    const int64_t frame = (int64_t)P->vad_p.frame_ms * 16;
    for (int64_t i = 0; i < n; i += frame) {
        nm_vad_push(P->vad, pcm + i, n - i < frame ? n - i : frame, on_utterance, &h);
        const bool speech = nm_vad_in_speech(P->vad);
        if (speech && !P->vad_speech && P->p.barge_in) barge_in(P, nm_vad_position(P->vad));
        P->vad_speech = speech;
    }
    return h.st;
}

void nm_pipeline_close(nm_pipeline *P) {
    if (!P) return;
    pthread_mutex_lock(&P->lock);
    P->closed = true;
    pthread_cond_broadcast(&P->cond);
    pthread_mutex_unlock(&P->lock);
}

nm_brick *nm_pipeline_brick(const nm_pipeline *P, nm_brick_kind kind) {
    if (!P || kind < NM_BRICK_STT || kind > NM_BRICK_TTS) return NULL;
    nm_pipeline *Q = (nm_pipeline *)P; // (the lock only)
    pthread_mutex_lock(&Q->lock);
    nm_brick *b = *slot_of(Q, kind);
    pthread_mutex_unlock(&Q->lock);
    return b;
}

nm_status nm_pipeline_brick_stats(const nm_pipeline *P, nm_brick_kind kind, nm_brick_stats *out) {
    if (!P || !out || kind < NM_BRICK_STT || kind > NM_BRICK_TTS) return NM_ERR_INVALID_ARG;
    nm_pipeline *Q = (nm_pipeline *)P; // (the lock only)
    pthread_mutex_lock(&Q->lock);
    const bool has = Q->has[kind];
    *out = Q->L[kind].base;
    stats_add(out, &Q->L[kind].cur);
    pthread_mutex_unlock(&Q->lock);
    return has ? NM_OK : NM_ERR_RANGE;
}

nm_ledger *nm_pipeline_ledger(const nm_pipeline *P) { return P ? P->ledger : NULL; }
