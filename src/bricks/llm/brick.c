// The LLM brick on TABM rings: prompt slots in, sampled-token slots out.
// The slot protocol is written in include/nanomind.h ("LLM brick on TABM
// rings") and docs/tabm.md. Payloads are used in place: the pointer handed
// to nm_decode / nm_decode_embd is the input slot's data, and sampled tokens
// are written straight into the output slot. Nothing is copied between the
// rings and the brick, so the ledger this brick is given stays at 0 bytes.
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bricks/llm/llm.h"
#include "bricks/brick_impl.h"
#include "core/fail.h"

typedef struct llm_stats {
    uint64_t n_prompts, n_prompt_tokens, n_gen, n_in_slots, n_out_slots, n_bad_slots, n_cancelled;
    double t_prompt, t_gen;
} llm_stats;

typedef struct llm_brick {
    nm_model *m;
    nm_ctx *c;
    nm_sampler *s;            // the brick's sampler (its parameters: sp)
    nm_sampler *cur;          // the request's: s, or req_s (a PARAMS slot's own parameters)
    nm_sampler *req_s;
    nm_sampler_params sp;
    nm_llm_params base;       // the brick's generation parameters while a request has its own in p
    bool own_model;           // loaded by the brick (else borrowed: nm_brick_params.llm_model)
    nm_ledger *ledger;
    int ep;                   // this brick's ledger endpoint (-1 without a ledger)
    nm_llm_params p;
    uint32_t producer;
    int64_t timeout_ns;
    int32_t n_ctx, n_batch, n_embd, n_vocab;
    int32_t pos;              // where the next slot without NM_LLM_IN_AT_POS starts
    int32_t *cached;          // (n_ctx) token id at each cached position; -1: an embedding row
    int32_t n_cached;         // positions [0, n_cached) of the KV cache hold what cached[] says
    uint64_t request;         // the id of the prompt being served
    nm_tabm *in;              // the rings of the request being served (cancellation is marked there)
    char req_stop[NM_LLM_MAX_STOP][NM_LLM_MAX_STOP_LEN + 1]; // a PARAMS slot's stop strings
    const char *req_stop_p[NM_LLM_MAX_STOP];
    llm_stats st;
    float *masked;            // (n_vocab) with ignore_eos: the logits, end-of-generation tokens at -inf
    int32_t *eog;             // the end-of-generation token ids (for ignore_eos)
    int32_t n_eog;
    char tail[2 * NM_LLM_MAX_STOP_LEN + 64]; // with stop strings: the end of the text generated so far
    int32_t n_tail;
    nm_brick *self;           // the handle, while it runs the brick: failures are reported there
} llm_brick;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static nm_status fail(llm_brick *b, nm_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
// The message goes to the handle at once: before the slot that reports the failure.
static nm_status fail(llm_brick *b, nm_status st, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    nm_brick_set_error(b->self, "%s", msg);
    return st;
}

static void llm_release(void *state) {
    llm_brick *b = state;
    if (!b) return;
    nm_sampler_free(b->s);
    nm_sampler_free(b->req_s);
    nm_ctx_free(b->c);
    if (b->own_model) nm_model_free(b->m);
    free(b->cached);
    free(b->masked);
    free(b->eog);
    free(b);
}

static nm_status check_llm_params(const nm_llm_params *p, char *err, size_t err_size) {
    if (p->n_stop < 0 || p->n_stop > NM_LLM_MAX_STOP || (p->n_stop > 0 && !p->stop))
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "llm brick: %d stop strings (0..%d)", p->n_stop,
                       NM_LLM_MAX_STOP);
    for (int32_t i = 0; i < p->n_stop; i++)
        if (!p->stop[i] || !p->stop[i][0] || strlen(p->stop[i]) > NM_LLM_MAX_STOP_LEN)
            return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "llm brick: stop string %d is empty or over %d bytes", i,
                           NM_LLM_MAX_STOP_LEN);
    return NM_OK;
}

static nm_status llm_load(const nm_brick_params *p, void **state, char *err, size_t err_size) {
    llm_brick *b = calloc(1, sizeof *b);
    if (!b) return nm_fail(NM_ERR_NOMEM, err, err_size, "llm brick: out of memory");
    nm_status st;
    b->p = p->llm;
    b->producer = p->producer;
    b->timeout_ns = p->timeout_ns;
    if (b->p.out_batch < 1) b->p.out_batch = 1;
    if ((st = check_llm_params(&b->p, err, err_size)) != NM_OK) goto fail;
    if (p->llm_model) {
        b->m = p->llm_model;
    } else {
        if (!p->model) {
            st = nm_fail(NM_ERR_INVALID_ARG, err, err_size, "llm brick: no model (a file or a loaded model)");
            goto fail;
        }
        nm_model_params mp = nm_model_default_params();
        mp.n_threads = p->n_threads;
        mp.no_mmap = p->no_mmap;
        if ((st = nm_model_load(p->model, &mp, &b->m, err, err_size)) != NM_OK) goto fail;
        b->own_model = true;
    }
    nm_ctx_params cp = nm_ctx_default_params();
    cp.n_ctx = p->n_ctx;
    cp.n_batch = p->n_batch;
    cp.n_threads = p->n_threads;
    cp.pin_threads = p->pin_threads;
    cp.device = p->device;
    cp.n_gpu_layers = p->n_gpu_layers;
    if ((st = nm_ctx_create(b->m, &cp, &b->c, err, err_size)) != NM_OK) goto fail;
    b->n_ctx = nm_ctx_n_ctx(b->c);
    b->n_batch = nm_ctx_n_batch(b->c);
    b->n_embd = nm_model_n_embd(b->m);
    b->n_vocab = nm_model_n_vocab(b->m);
    nm_sampler_params sp = p->sampling;
    if (sp.repeat_last_n < 0) sp.repeat_last_n = b->n_ctx; // llama.cpp's -1: the whole context
    b->s = b->cur = nm_sampler_create(&sp, b->n_vocab);
    b->sp = sp;
    b->cached = malloc(sizeof(int32_t) * (size_t)b->n_ctx);
    if (!b->s || !b->cached) {
        st = nm_fail(NM_ERR_NOMEM, err, err_size, "llm brick: out of memory");
        goto fail;
    }
    // the end-of-generation tokens, for ignore_eos (also when set later)
    b->masked = malloc(sizeof(float) * (size_t)b->n_vocab);
    b->eog = malloc(sizeof(int32_t) * (size_t)b->n_vocab);
    if (!b->masked || !b->eog) {
        st = nm_fail(NM_ERR_NOMEM, err, err_size, "llm brick: out of memory");
        goto fail;
    }
    for (int32_t t = 0; t < b->n_vocab; t++)
        if (nm_token_is_eog(b->m, t)) b->eog[b->n_eog++] = t;
    b->ledger = p->ledger;
    b->ep = p->ledger ? nm_ledger_endpoint(p->ledger, p->name ? p->name : "llm") : -1;
    if (p->ledger && b->ep < 0) {
        st = nm_fail(NM_ERR_RANGE, err, err_size, "llm brick: the ledger has no room for another endpoint");
        goto fail;
    }
    *state = b;
    return NM_OK;
fail:
    llm_release(b);
    return st;
}

// With stop strings: appends tok's text to the tail and says whether the text
// now holds a stop string. The tail keeps the last bytes, enough for any.
static bool reached_stop(llm_brick *b, nm_detok *dt, int32_t tok) {
    char piece[256];
    int32_t k = nm_detok_push(b->m, dt, tok, piece, (int32_t)sizeof piece);
    if (k <= 0) return false;
    const int32_t cap = (int32_t)sizeof b->tail - 1;
    if (b->n_tail + k > cap) { // keep the last NM_LLM_MAX_STOP_LEN bytes
        int32_t keep = b->n_tail < NM_LLM_MAX_STOP_LEN ? b->n_tail : NM_LLM_MAX_STOP_LEN;
        memmove(b->tail, b->tail + b->n_tail - keep, (size_t)keep);
        b->n_tail = keep;
    }
    if (k > cap - b->n_tail) k = cap - b->n_tail;
    memcpy(b->tail + b->n_tail, piece, (size_t)k);
    b->n_tail += k;
    b->tail[b->n_tail] = '\0';
    for (int32_t i = 0; i < b->p.n_stop; i++)
        if (strstr(b->tail, b->p.stop[i])) return true;
    return false;
}

// New generation and sampling parameters; the sampler starts afresh.
static nm_status llm_set_params(void *state, const nm_brick_params *p, char *err, size_t err_size) {
    llm_brick *b = state;
    nm_llm_params lp = p->llm;
    if (lp.out_batch < 1) lp.out_batch = 1;
    nm_status st = check_llm_params(&lp, err, err_size);
    if (st != NM_OK) return st;
    nm_sampler_params sp = p->sampling;
    if (sp.repeat_last_n < 0) sp.repeat_last_n = b->n_ctx;
    nm_sampler *s = nm_sampler_create(&sp, b->n_vocab);
    if (!s) return nm_fail(NM_ERR_NOMEM, err, err_size, "llm brick: out of memory");
    nm_sampler_free(b->s);
    b->s = b->cur = s;
    b->sp = sp;
    b->p = lp;
    return NM_OK;
}

// A request's PARAMS slot: its fields over the brick's parameters, for this
// request only (end_request puts the brick's back). NM_ERR_FORMAT, the field
// named, for a wrong one: the brick's parameters stay.
static nm_status take_params(llm_brick *b, const nm_tabm_slot *s) {
    char why[200] = "";
    cJSON *o = nm_req_parse(s, "llm brick", why, sizeof why);
    if (!o) return fail(b, NM_ERR_FORMAT, "%s", why);
    nm_sampler_params sp = b->sp;
    nm_llm_params lp = b->p;
    const char *stop[NM_LLM_MAX_STOP];
    int32_t n_stop = 0;
    double d = 0;
    int64_t i = 0;
    int k = 0;
#define NUM(key, lo, hi, dst) \
    if (k >= 0 && (k = nm_req_number(o, key, lo, hi, &d, why, sizeof why)) == 1) dst = (float)d
#define INT(key, lo, hi, dst) \
    if (k >= 0 && (k = nm_req_int(o, key, lo, hi, &i, why, sizeof why)) == 1) dst = (int32_t)i
    NUM("temperature", -100, 100, sp.temp);
    INT("top_k", INT32_MIN, INT32_MAX, sp.top_k);
    NUM("top_p", 0, 1, sp.top_p);
    NUM("min_p", 0, 1, sp.min_p);
    NUM("repeat_penalty", 0, 100, sp.repeat_penalty);
    INT("repeat_last_n", -1, b->n_ctx, sp.repeat_last_n);
    NUM("presence_penalty", -100, 100, sp.presence_penalty);
    NUM("frequency_penalty", -100, 100, sp.frequency_penalty);
    INT("max_tokens", -2, INT32_MAX, lp.n_predict); // OpenAI's name; n_predict wins when both are given
    INT("n_predict", -2, INT32_MAX, lp.n_predict);
#undef NUM
#undef INT
    if (k >= 0 && (k = nm_req_int(o, "seed", -1, 9007199254740992.0, &i, why, sizeof why)) == 1)
        sp.seed = i >= 0 ? (uint64_t)i : (uint64_t)(now_s() * 1e9) ^ b->request; // llama-server's -1: a random seed
    if (k >= 0) k = nm_req_bool(o, "ignore_eos", &lp.ignore_eos, why, sizeof why);
    if (k >= 0) k = nm_req_bool(o, "cache_prompt", &lp.cache_prompt, why, sizeof why);
    if (k >= 0 && (k = nm_req_strings(o, "stop", NM_LLM_MAX_STOP, NM_LLM_MAX_STOP_LEN, stop, &n_stop, why,
                                      sizeof why)) == 1) {
        for (int32_t j = 0; j < n_stop; j++) {
            snprintf(b->req_stop[j], sizeof b->req_stop[j], "%s", stop[j]);
            b->req_stop_p[j] = b->req_stop[j];
        }
        lp.stop = b->req_stop_p;
        lp.n_stop = n_stop;
    }
    nm_req_free(o);
    if (k < 0) return fail(b, NM_ERR_FORMAT, "llm brick: parameters slot %llu: %s", (unsigned long long)s->meta->seq, why);
    if (sp.repeat_last_n < 0) sp.repeat_last_n = b->n_ctx;
    nm_sampler *rs = nm_sampler_create(&sp, b->n_vocab);
    if (!rs) return fail(b, NM_ERR_NOMEM, "llm brick: out of memory for a request's sampler");
    nm_sampler_free(b->req_s);
    b->req_s = b->cur = rs;
    b->base = b->p;
    b->p = lp;
    return NM_OK;
}

// The next request has the brick's own parameters again.
static void end_request(llm_brick *b) {
    if (b->cur == b->req_s) {
        b->p = b->base;
        b->cur = b->s;
    }
}

static llm_brick *of(const nm_brick *b) { return nm_brick_state_of(b, &nm_brick_llm_i); }
nm_model *nm_brick_llm_model(const nm_brick *b) { return of(b) ? of(b)->m : NULL; }
nm_ctx *nm_brick_llm_ctx(const nm_brick *b) { return of(b) ? of(b)->c : NULL; }
int32_t nm_brick_llm_pos(const nm_brick *b) { return of(b) ? of(b)->pos : 0; }

static void llm_stats_of(void *state, nm_brick_stats *o) {
    const llm_brick *b = state;
    o->n_requests = b->st.n_prompts;
    o->n_in_slots = b->st.n_in_slots;
    o->n_out_slots = b->st.n_out_slots;
    o->n_bad_requests = b->st.n_bad_slots;
    o->n_cancelled = b->st.n_cancelled;
    o->n_prompt_tokens = b->st.n_prompt_tokens;
    o->n_gen = b->st.n_gen;
    o->t_prompt = b->st.t_prompt;
    o->t_gen = b->st.t_gen;
    o->t_busy = b->st.t_prompt + b->st.t_gen;
}

static const char *llm_device(void *state) { return nm_ctx_device(((llm_brick *)state)->c); }

static size_t llm_slot_bytes(void *state, bool out) {
    const llm_brick *b = state;
    return sizeof(int32_t) * (size_t)(out ? b->p.out_batch : b->n_ctx);
}

static const char *kind_name(uint32_t k) {
    static const char *names[] = {"bytes", "tokens", "embeddings f32", "embeddings f16", "pcm s16", "pcm f32",
                                  "text", "image", "parameters (only as a request's first slot)"};
    return k < sizeof names / sizeof names[0] ? names[k] : "unknown";
}

// Checks an input slot against the model and the context; on success *n is
// its token/row count and *start its first position. NM_ERR_FORMAT (bad
// slot) or NM_ERR_RANGE (does not fit), the reason reported.
static nm_status check_input(llm_brick *b, const nm_tabm_slot *s, int32_t *n, int32_t *start) {
    const nm_tabm_meta *mt = s->meta;
    const unsigned long long seq = (unsigned long long)mt->seq;
    int64_t rows;
    if (mt->user & NM_BRICK_ERROR)
        return fail(b, NM_ERR_FORMAT, "llm brick: input slot %llu: the brick before this one failed this part of the "
                    "prompt (NM_BRICK_ERROR; its own last error says why)", seq);
    if (mt->kind == NM_TABM_TOKENS) {
        if (mt->ndim != 1 || mt->shape[0] < 1 || mt->size != sizeof(int32_t) * (uint64_t)mt->shape[0])
            return fail(b, NM_ERR_FORMAT, "llm brick: input slot %llu: a token slot needs ndim 1 and at least one "
                        "token (ndim %d, %llu bytes)", seq, mt->ndim, (unsigned long long)mt->size);
        rows = mt->shape[0];
    } else if (mt->kind == NM_TABM_EMBD_F32) {
        if (mt->ndim != 2 || mt->shape[0] < 1 || mt->size != sizeof(float) * (uint64_t)mt->shape[0] * (uint64_t)mt->shape[1])
            return fail(b, NM_ERR_FORMAT, "llm brick: input slot %llu: an embedding slot needs ndim 2 [n_tokens, "
                        "n_embd] and at least one row (ndim %d, %llu bytes)", seq, mt->ndim, (unsigned long long)mt->size);
        if (mt->shape[1] != b->n_embd)
            return fail(b, NM_ERR_FORMAT, "llm brick: input slot %llu: embeddings of width %lld, the model's n_embd is %d",
                        seq, (long long)mt->shape[1], b->n_embd);
        rows = mt->shape[0];
    } else {
        return fail(b, NM_ERR_FORMAT, "llm brick: input slot %llu: payload kind %u (%s) is not taken: token ids or "
                    "f32 embeddings", seq, mt->kind, kind_name(mt->kind));
    }
    int64_t p0 = (mt->user & NM_LLM_IN_AT_POS) ? NM_LLM_IN_POS_OF(mt->user) : b->pos;
    if (p0 < 0 || rows > b->n_ctx || p0 > b->n_ctx - rows)
        return fail(b, NM_ERR_RANGE, "llm brick: input slot %llu: %lld positions from %lld do not fit the context of %d",
                    seq, (long long)rows, (long long)p0, b->n_ctx);
    if (mt->kind == NM_TABM_TOKENS) {
        const int32_t *t = s->data;
        for (int64_t i = 0; i < rows; i++)
            if (t[i] < 0 || t[i] >= b->n_vocab)
                return fail(b, NM_ERR_FORMAT, "llm brick: input slot %llu: token %lld is %d, not in [0, %d)", seq,
                            (long long)i, t[i], b->n_vocab);
    }
    *n = (int32_t)rows;
    *start = (int32_t)p0;
    return NM_OK;
}

// Decodes one valid input slot in place, in batches of n_batch. last: the
// slot ends the prompt (its last position must be decoded for the logits).
static nm_status decode_slot(llm_brick *b, const nm_tabm_slot *s, int32_t n, int32_t p0, bool last) {
    double t0 = now_s();
    nm_status st = NM_OK;
    int32_t k = 0;
    // Positions skipped over (a slot placed past what is cached) hold unknown entries.
    for (int32_t i = b->n_cached; i < p0; i++) b->cached[i] = -1;
    if (b->n_cached < p0) b->n_cached = p0;
    if (s->meta->kind == NM_TABM_TOKENS) {
        const int32_t *t = s->data; // the slot's payload, read in place
        // Prefix reuse: positions the cache already holds with the same tokens.
        while (b->p.cache_prompt && k < n && p0 + k < b->n_cached && b->cached[p0 + k] == t[k]) k++;
        if (k == n && last) k--; // the last position is decoded again for its logits
        for (int32_t i = k; i < n && st == NM_OK; i += b->n_batch) {
            int32_t nb = n - i < b->n_batch ? n - i : b->n_batch;
            if (nm_tabm_request_cancelled(b->in, b->request)) {
                st = NM_ERR_CANCELLED;
                break;
            }
            st = nm_decode(b->c, t + i, nb, p0 + i, false);
            if (st != NM_OK) break;
            for (int32_t j = 0; j < nb; j++) {
                b->cached[p0 + i + j] = t[i + j];
                nm_sampler_accept(b->cur, t[i + j]);
            }
            b->n_cached = p0 + i + nb;
        }
    } else {
        const float *x = s->data; // (n, n_embd), read in place
        for (int32_t i = 0; i < n && st == NM_OK; i += b->n_batch) {
            int32_t nb = n - i < b->n_batch ? n - i : b->n_batch;
            if (nm_tabm_request_cancelled(b->in, b->request)) {
                st = NM_ERR_CANCELLED;
                break;
            }
            st = nm_decode_embd(b->c, x + (size_t)i * (size_t)b->n_embd, nb, p0 + i, false);
            if (st != NM_OK) break;
            for (int32_t j = 0; j < nb; j++) b->cached[p0 + i + j] = -1;
            b->n_cached = p0 + i + nb;
        }
    }
    if (st == NM_ERR_CANCELLED) {
        // stopped between batches: what is cached is whole
    } else if (st != NM_OK) {
        // A failed decode may have written part of the cache from its first position on.
        int32_t bad_from = p0 + k;
        if (b->n_cached > bad_from) b->n_cached = bad_from;
        fail(b, st, "llm brick: decode of input slot %llu failed: %s (%s)", (unsigned long long)s->meta->seq,
             nm_status_str(st), nm_ctx_last_error(b->c));
    } else {
        if (b->n_cached < p0 + n) b->n_cached = p0 + n; // a fully reused slot
        b->st.n_prompt_tokens += (uint64_t)(n - k);
    }
    b->pos = p0 + n;
    b->st.t_prompt += now_s() - t0;
    return st;
}

// Publishes a held output slot with n tokens (ndim 0 when none) and `user`.
static nm_status put_out(llm_brick *b, nm_tabm *out, nm_tabm_slot *o, int32_t n, uint64_t user) {
    nm_tabm_meta *mt = o->meta;
    mt->kind = NM_TABM_TOKENS;
    mt->ndim = n > 0 ? 1 : 0;
    mt->shape[0] = n;
    mt->size = sizeof(int32_t) * (uint64_t)n;
    mt->user = user;
    mt->request = b->request;
    b->st.n_out_slots++; // stats and the last error are written before the slot is visible
    nm_status st = nm_tabm_publish(out, o);
    if (st != NM_OK) {
        b->st.n_out_slots--;
        fail(b, st, "llm brick: publish on the output ring: %s", nm_tabm_last_error(out));
        nm_tabm_cancel(out, o);
    }
    return st;
}

// Takes an output slot; on shutdown of the output ring, shuts the input one too.
static nm_status take_out(llm_brick *b, nm_tabm *in, nm_tabm *out, nm_tabm_slot *o) {
    nm_status st = nm_tabm_acquire_write(out, b->producer, b->timeout_ns, o);
    if (st == NM_ERR_SHUTDOWN) {
        nm_tabm_shutdown(in);
        return fail(b, st, "llm brick: the output ring was shut down");
    }
    if (st != NM_OK) return fail(b, st, "llm brick: waiting for an output slot: %s", nm_status_str(st));
    return NM_OK;
}

// The last slot of a prompt's output: the stop reason, and NM_BRICK_ERROR when the prompt failed.
static uint64_t end_user(nm_llm_stop why) {
    const bool failed = why == NM_LLM_STOP_BAD_INPUT || why == NM_LLM_STOP_ERROR;
    return ((uint64_t)why << 8) | (failed ? NM_BRICK_ERROR : 0) | (why == NM_LLM_STOP_CANCELLED ? NM_BRICK_CANCELLED : 0);
}

// Samples and decodes up to n_predict tokens after the prompt, writing them
// to `out`; ends with the END slot.
static nm_status generate(llm_brick *b, nm_tabm *in, nm_tabm *out) {
    double t0 = now_s();
    nm_tabm_slot o;
    bool held = false;
    int32_t n_held = 0;
    nm_llm_stop why = NM_LLM_STOP_N_PREDICT;
    nm_status st = NM_OK;
    nm_detok dt = {0}; // the stop strings look at this prompt's generated text only
    b->n_tail = 0;
    b->tail[0] = '\0';
    for (int32_t i = 0; b->p.n_predict < 0 || i < b->p.n_predict; i++) {
        if (b->pos >= b->n_ctx) {
            why = NM_LLM_STOP_CTX_FULL;
            break;
        }
        if (nm_tabm_request_cancelled(in, b->request)) {
            why = NM_LLM_STOP_CANCELLED;
            break;
        }
        const float *logits = nm_get_logits(b->c, -1);
        if (b->p.ignore_eos) { // as llama.cpp's logit bias of -inf on every end-of-generation token
            memcpy(b->masked, logits, sizeof(float) * (size_t)b->n_vocab);
            for (int32_t e = 0; e < b->n_eog; e++) b->masked[b->eog[e]] = -INFINITY;
            logits = b->masked;
        }
        int32_t tok = nm_sampler_sample(b->cur, logits);
        if (nm_token_is_eog(b->m, tok)) {
            why = NM_LLM_STOP_EOG;
            break;
        }
        nm_sampler_accept(b->cur, tok);
        // The token goes out before it is decoded, so the consumer works on it
        // (prints it) while the next step runs.
        if (!held) {
            if ((st = take_out(b, in, out, &o)) != NM_OK) goto out;
            held = true;
        }
        ((int32_t *)o.data)[n_held++] = tok;
        if (n_held == b->p.out_batch) {
            held = false;
            st = put_out(b, out, &o, n_held, NM_BRICK_MORE);
            n_held = 0;
            if (st != NM_OK) goto out;
        }
        b->cached[b->pos] = tok;
        st = nm_decode(b->c, &tok, 1, b->pos, false);
        if (st != NM_OK) {
            fail(b, st, "llm brick: decode failed at position %d: %s (%s)", b->pos, nm_status_str(st),
                 nm_ctx_last_error(b->c));
            if (b->n_cached > b->pos) b->n_cached = b->pos;
            why = NM_LLM_STOP_ERROR;
            break;
        }
        b->pos++;
        if (b->n_cached < b->pos) b->n_cached = b->pos;
        b->st.n_gen++;
        if (b->p.n_stop > 0 && reached_stop(b, &dt, tok)) {
            why = NM_LLM_STOP_STRING;
            break;
        }
    }
    if (why == NM_LLM_STOP_CANCELLED) {
        nm_tabm_cancel_request(out, b->request); // what went out may still be queued downstream
        b->st.n_cancelled++;
    }
    if (!held && (st = take_out(b, in, out, &o)) != NM_OK) goto out;
    // The END slot makes the brick idle for its reader: account first.
    b->st.n_prompts++;
    b->st.t_gen += now_s() - t0;
    if ((st = put_out(b, out, &o, n_held, end_user(why))) != NM_OK) b->st.n_prompts--;
    return st;
out:
    if (held) nm_tabm_cancel(out, &o);
    b->st.t_gen += now_s() - t0;
    return st;
}

// Writes the END slot of a prompt that was dropped.
static nm_status end_dropped(llm_brick *b, nm_tabm *in, nm_tabm *out, nm_llm_stop why) {
    if (why == NM_LLM_STOP_CANCELLED) {
        nm_tabm_cancel_request(out, b->request);
        b->st.n_cancelled++;
    }
    nm_tabm_slot o;
    nm_status st = take_out(b, in, out, &o);
    if (st != NM_OK) return st;
    b->st.n_prompts++;
    if ((st = put_out(b, out, &o, 0, end_user(why))) != NM_OK) b->st.n_prompts--;
    return st;
}

static nm_status llm_step(llm_brick *b, nm_tabm *in, nm_tabm *out) {
    if (sizeof(int32_t) * (size_t)b->p.out_batch > nm_tabm_max_payload(out))
        return fail(b, NM_ERR_INVALID_ARG, "llm brick: output slots of %zu bytes cannot hold %d tokens",
                    nm_tabm_max_payload(out), b->p.out_batch);
    const int32_t prompt_pos = b->pos;
    nm_llm_stop dropped = NM_LLM_STOP_NONE; // set once a slot of this prompt failed: skip the rest
    bool first = true;
    for (;;) {
        nm_tabm_slot s;
        nm_status st = nm_tabm_acquire_read(in, b->timeout_ns, &s);
        if (st == NM_ERR_SHUTDOWN) {
            nm_tabm_shutdown(out);
            return fail(b, st, "llm brick: the input ring was shut down");
        }
        if (st != NM_OK) return fail(b, st, "llm brick: waiting for an input slot: %s", nm_status_str(st));
        b->st.n_in_slots++;
        const bool last = !(s.meta->user & NM_BRICK_MORE);
        if (first) b->request = s.meta->request;
        const bool params = first && s.meta->kind == NM_TABM_PARAMS;
        first = false;
        if (dropped == NM_LLM_STOP_NONE && params) {
            st = last ? fail(b, NM_ERR_FORMAT, "llm brick: request %llu is parameters alone: no prompt follows (the "
                             "parameters slot lacks NM_BRICK_MORE)", (unsigned long long)b->request)
                      : take_params(b, &s);
            if (st != NM_OK) {
                dropped = NM_LLM_STOP_BAD_INPUT;
                b->st.n_bad_slots++;
            }
        } else if (dropped == NM_LLM_STOP_NONE && nm_req_cancelled(in, s.meta->user, b->request)) {
            dropped = NM_LLM_STOP_CANCELLED;
        } else if (dropped == NM_LLM_STOP_NONE) {
            int32_t n = 0, p0 = 0;
            st = check_input(b, &s, &n, &p0);
            if (st == NM_OK) {
                st = decode_slot(b, &s, n, p0, last);
                if (st != NM_OK) dropped = st == NM_ERR_CANCELLED ? NM_LLM_STOP_CANCELLED : NM_LLM_STOP_ERROR;
            } else {
                dropped = NM_LLM_STOP_BAD_INPUT;
                b->st.n_bad_slots++;
            }
        }
        if (dropped != NM_LLM_STOP_NONE) b->pos = prompt_pos; // the dropped prompt leaves no position behind
        nm_tabm_release(in, &s); // decoded: the payload is no longer read
        if (last) break;
    }
    if (dropped != NM_LLM_STOP_NONE) return end_dropped(b, in, out, dropped);
    return generate(b, in, out);
}

// One prompt.
static nm_status llm_run(void *state, nm_brick *self, nm_tabm *in, nm_tabm *out) {
    llm_brick *b = state;
    b->self = self;
    b->in = in;
    nm_status st = llm_step(b, in, out);
    end_request(b);
    return st;
}

const nm_brick_i nm_brick_llm_i = {
    .version = NM_BRICK_I_VERSION,
    .kind = NM_BRICK_LLM,
    .name = "llm",
    .in_ports = NM_PORT_BIT(NM_PORT_TOKENS) | NM_PORT_BIT(NM_PORT_EMBD),
    .out_ports = NM_PORT_BIT(NM_PORT_TOKENS),
    .units = NM_UNIT_BIT(NM_UNIT_CPU) | NM_UNIT_BIT(NM_UNIT_OPENCL),
    .load = llm_load,
    .run = llm_run,
    .release = llm_release,
    .estimate = nm_llm_estimate,
    .stats = llm_stats_of,
    .device = llm_device,
    .slot_bytes = llm_slot_bytes,
    .set_params = llm_set_params,
};

nm_status nm_llm_estimate(void *state, const nm_brick_input *in, nm_brick_cost *out) {
    const llm_brick *b = state;
    nm_llm_estimate_model(b->m, b->c, in, out);
    return NM_OK;
}
