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
#include "bricks/llm/think.h"
#include "bricks/brick_impl.h"
#include "core/clock.h"
#include "core/fail.h"

typedef struct llm_stats {
    uint64_t n_prompts, n_prompt_tokens, n_gen, n_in_slots, n_out_slots, n_bad_slots, n_cancelled;
    uint64_t n_passes, n_pass_seqs;
    uint32_t max_pass_seqs;
    double t_prompt, t_gen;
} llm_stats;

// The part of an input slot a pass takes, and what a request's row in the pass is.
enum { ROW_NONE, ROW_PROMPT, ROW_PROMPT_END, ROW_GEN };

#define NM_LLM_MAX_PARTS 64 // input slots of one request held at once

// Prompt chunks (nm_brick_params.n_ubatch). A row's bits depend on the batch
// it was computed in (the CPU's decode kernels and its GEMM sum in other
// orders), so a cached prefix gives the logits of recomputing it only if it
// was computed in the chunks a fresh prompt is: a reused prefix ends at a
// chunk boundary, and the rest is decoded in the same chunks (llm_seq.n_exact).
// 128 by default: prefill in 128-row chunks is within 1-3% of 512-row ones
// (64: 12% slower; docs/server.md), and a repeated prefix decodes at most 127
// positions again.
#define NM_LLM_UBATCH 128

// A request being served: its input slots (held, decoded in place), the
// sequence it is bound to, its parameters and sampler, its output.
typedef struct llm_req {
    bool used;
    uint64_t id;
    uint64_t arrival;          // order of its first slot
    int32_t seq;               // its sequence (-1: not bound yet)
    nm_tabm_slot parts[NM_LLM_MAX_PARTS];
    int32_t n_parts, head;     // held slots; parts[head] is the one being decoded
    bool got_last;             // its last input slot has been read
    bool started;              // a part of it has been checked (a PARAMS slot must come first)
    bool checked;              // parts[head] is checked: n, p0, last, off below
    int32_t n, p0, off;        // the head part's rows, first position, rows decoded (or reused)
    bool last;                 // the head part ends the prompt
    nm_llm_stop dropped;       // set: the prompt failed or was cancelled; ended once its last slot is read
    nm_llm_stop end_why;       // with dropped: the END is written when its last slot comes
    int32_t prompt_pos;        // the sequence's position when the request began
    char err[256];             // why it failed (the brick's error when it was dropped), for its END
    // generation
    bool generating;
    int32_t pending;           // the token sampled, decoded by the next pass
    bool stop_after;           // it completed a stop string: ends once decoded
    int32_t n_gen;
    int32_t n_decoded, n_reused; // its prompt's rows decoded; its tokens the cache already held (not decoded)
    double t_gen0;             // its first token was sampled (p.max_tps paces from there)
    nm_sampler *cur;           // the sequence's sampler, or own_s
    nm_sampler *own_s;         // a PARAMS slot's own
    nm_llm_params p;           // the brick's, or with the PARAMS slot's fields over them
    char stop[NM_LLM_MAX_STOP][NM_LLM_MAX_STOP_LEN + 1]; // a PARAMS slot's stop strings
    const char *stop_p[NM_LLM_MAX_STOP];
    nm_detok dt;               // the stop strings look at this request's generated text only
    char tail[2 * NM_LLM_MAX_STOP_LEN + 64]; // with stop strings: the end of the text generated so far
    int32_t n_tail;
    nm_tabm_slot out;          // the output slot being filled (out_batch tokens, or text)
    bool held;
    int32_t n_held;            // tokens in it
    size_t n_text;             // text modes: bytes in it
    nm_detok odt;              // text modes: the output's detokenizer
    bool ended_sentence;       // NM_LLM_OUT_SENTENCES: the text so far ends with . ! ?
    nm_think think;            // NM_LLM_OUT_SENTENCES: the answer's <think> block left out (not spoken)
    // this pass
    int row_kind, row, chunk;
    bool bind_skip;            // bind_requests passed it by (it waits for its first prompt slot)
} llm_req;

// A sequence of the context: its cache's contents and position.
typedef struct llm_seq {
    llm_req *r;               // the request on it (NULL: free)
    nm_sampler *s;            // its sampler (the brick's parameters), kept across its requests
    int32_t pos;              // where its next slot without NM_LLM_IN_AT_POS starts
    int32_t *cached;          // (n_ctx) token id at each cached position; -1: an embedding row
    int32_t n_cached;         // positions [0, n_cached) of its cache hold what cached[] says
    int32_t n_exact;          // [0, n_exact) were decoded as a fresh prompt decodes them (whole chunks, each
                              // alone in its pass, from 0): reusable to the bit; a multiple of the chunk
    uint64_t used;            // tick of its last binding
} llm_seq;

typedef struct llm_brick {
    nm_model *m;
    nm_ctx *c;
    nm_sampler_params sp;     // the brick's sampling parameters
    nm_llm_params p;          // the brick's generation parameters
    bool own_model;           // loaded by the brick (else borrowed: nm_brick_params.llm_model)
    nm_ledger *ledger;
    int ep;                   // this brick's ledger endpoint (-1 without a ledger)
    uint32_t producer;
    int64_t timeout_ns;
    int64_t wait_ns;          // this run's waits: timeout_ns, or in nm_brick_step nm_brick_wait_ns's
    int32_t n_ctx, n_batch, n_embd, n_vocab;
    int32_t n_ubatch;         // prompt chunks end at multiples of this (at most n_batch)
    int32_t n_seq;            // sequences (n_parallel)
    llm_seq *seq;
    llm_req *req;             // (n_req) requests held: those on sequences and those waiting for one
    int32_t n_req;
    int32_t *order;           // (n_req) a pass's requests by arrival
    int32_t *bt, *bp, *bs;    // (n_batch) a pass's tokens, positions, sequences
    uint64_t tick;
    nm_tabm *in, *out;        // the rings of the run
    bool in_shut;             // the input ring was shut down (and drained)
    llm_stats st;
    float *masked;            // (n_vocab) with ignore_eos: the logits, end-of-generation tokens at -inf
    int32_t *eog;             // the end-of-generation token ids (for ignore_eos)
    int32_t n_eog;
    int32_t *tok;             // (n_ctx + 1) a TEXT slot's tokens, before they go into the slot
    nm_brick *self;           // the handle, while it runs the brick: failures are reported there
} llm_brick;


static nm_status fail(llm_brick *b, nm_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
// The message goes to the handle at once: before the slot that reports the failure.
static nm_status fail(llm_brick *b, nm_status st, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    nm_vfail(st, msg, sizeof msg, NULL, fmt, ap);
    va_end(ap);
    nm_brick_set_error(b->self, "%s", msg);
    return st;
}

static void release_held(llm_brick *b) {
    for (int32_t i = 0; i < b->n_req; i++) {
        llm_req *r = &b->req[i];
        if (!r->used) continue;
        for (int32_t k = r->head; k < r->n_parts; k++) nm_tabm_release(b->in, &r->parts[k]);
        if (r->held) nm_tabm_cancel(b->out, &r->out);
        nm_sampler_free(r->own_s);
        memset(r, 0, sizeof *r);
    }
    for (int32_t s = 0; s < b->n_seq; s++) b->seq[s].r = NULL;
}

static void llm_release(void *state) {
    llm_brick *b = state;
    if (!b) return;
    for (int32_t i = 0; b->req && i < b->n_req; i++) nm_sampler_free(b->req[i].own_s);
    for (int32_t s = 0; b->seq && s < b->n_seq; s++) {
        nm_sampler_free(b->seq[s].s);
        free(b->seq[s].cached);
    }
    free(b->seq);
    free(b->req);
    free(b->order);
    free(b->bt), free(b->bp), free(b->bs);
    nm_ctx_free(b->c);
    if (b->own_model) nm_model_free(b->m);
    free(b->masked);
    free(b->eog);
    free(b->tok);
    free(b);
}

static nm_status check_llm_params(const nm_llm_params *p, char *err, size_t err_size) {
    if ((unsigned)p->out > NM_LLM_OUT_SENTENCES)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "llm brick: output kind %d (tokens 0, text 1, sentences 2)",
                       (int)p->out);
    if (p->n_stop < 0 || p->n_stop > NM_LLM_MAX_STOP || (p->n_stop > 0 && !p->stop))
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "llm brick: %d stop strings (0..%d)", p->n_stop,
                       NM_LLM_MAX_STOP);
    for (int32_t i = 0; i < p->n_stop; i++)
        if (!p->stop[i] || !p->stop[i][0] || strlen(p->stop[i]) > NM_LLM_MAX_STOP_LEN)
            return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "llm brick: stop string %d is empty or over %d bytes", i,
                           NM_LLM_MAX_STOP_LEN);
    if (!(p->max_tps >= 0) || !isfinite(p->max_tps))
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "llm brick: max_tps %g (0: no pace; else tokens a second)",
                       (double)p->max_tps);
    return NM_OK;
}

#define NM_LLM_MAX_SEQ 256

static nm_status llm_load(const nm_brick_params *p, void **state, char *err, size_t err_size) {
    llm_brick *b = calloc(1, sizeof *b);
    if (!b) return nm_fail(NM_ERR_NOMEM, err, err_size, "llm brick: out of memory");
    nm_status st;
    b->p = p->llm;
    b->producer = p->producer;
    b->timeout_ns = b->wait_ns = p->timeout_ns;
    b->n_seq = p->n_parallel > 1 ? p->n_parallel : 1;
    if (b->p.out_batch < 1) b->p.out_batch = 1;
    if ((st = check_llm_params(&b->p, err, err_size)) != NM_OK) goto fail;
    if (b->p.out == NM_LLM_OUT_SENTENCES && b->n_seq > 1) {
        st = nm_fail(NM_ERR_INVALID_ARG, err, err_size, "llm brick: sentence output serves one sequence (n_parallel "
                     "%d)", b->n_seq);
        goto fail;
    }
    if (b->n_seq > NM_LLM_MAX_SEQ) {
        st = nm_fail(NM_ERR_INVALID_ARG, err, err_size, "llm brick: %d sequences in parallel (1..%d)", b->n_seq,
                     NM_LLM_MAX_SEQ);
        goto fail;
    }
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
    cp.n_seq = b->n_seq;
    if ((st = nm_ctx_create(b->m, &cp, &b->c, err, err_size)) != NM_OK) goto fail;
    b->n_ctx = nm_ctx_n_ctx(b->c);
    b->n_batch = nm_ctx_n_batch(b->c);
    b->n_ubatch = p->n_ubatch > 0 ? p->n_ubatch : NM_LLM_UBATCH;
    if (b->n_ubatch > b->n_batch) b->n_ubatch = b->n_batch;
    b->n_embd = nm_model_n_embd(b->m);
    b->n_vocab = nm_model_n_vocab(b->m);
    nm_sampler_params sp = p->sampling;
    if (sp.repeat_last_n < 0) sp.repeat_last_n = b->n_ctx; // llama.cpp's -1: the whole context
    b->sp = sp;
    b->n_req = b->n_seq + 8; // those on sequences, and some waiting (a run makes room for its input ring's)
    b->seq = calloc((size_t)b->n_seq, sizeof *b->seq);
    b->req = calloc((size_t)b->n_req, sizeof *b->req);
    b->order = calloc((size_t)b->n_req, sizeof *b->order);
    b->bt = malloc(sizeof(int32_t) * (size_t)b->n_batch);
    b->bp = malloc(sizeof(int32_t) * (size_t)b->n_batch);
    b->bs = malloc(sizeof(int32_t) * (size_t)b->n_batch);
    // the end-of-generation tokens, for ignore_eos (also when set later)
    b->masked = malloc(sizeof(float) * (size_t)b->n_vocab);
    b->eog = malloc(sizeof(int32_t) * (size_t)b->n_vocab);
    b->tok = malloc(sizeof(int32_t) * ((size_t)b->n_ctx + 1));
    bool ok = b->seq && b->req && b->order && b->bt && b->bp && b->bs && b->masked && b->eog && b->tok;
    for (int32_t s = 0; ok && s < b->n_seq; s++) {
        b->seq[s].s = nm_sampler_create(&sp, b->n_vocab);
        b->seq[s].cached = malloc(sizeof(int32_t) * (size_t)b->n_ctx);
        ok = b->seq[s].s && b->seq[s].cached;
    }
    if (!ok) {
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

// With stop strings: appends tok's text to the request's tail and says
// whether the text now holds a stop string. The tail keeps the last bytes,
// enough for any.
static bool reached_stop(llm_brick *b, llm_req *r, int32_t tok) {
    char piece[256];
    int32_t k = nm_detok_push(b->m, &r->dt, tok, piece, (int32_t)sizeof piece);
    if (k <= 0) return false;
    const int32_t cap = (int32_t)sizeof r->tail - 1;
    if (r->n_tail + k > cap) { // keep the last NM_LLM_MAX_STOP_LEN bytes
        int32_t keep = r->n_tail < NM_LLM_MAX_STOP_LEN ? r->n_tail : NM_LLM_MAX_STOP_LEN;
        memmove(r->tail, r->tail + r->n_tail - keep, (size_t)keep);
        r->n_tail = keep;
    }
    if (k > cap - r->n_tail) k = cap - r->n_tail;
    memcpy(r->tail + r->n_tail, piece, (size_t)k);
    r->n_tail += k;
    r->tail[r->n_tail] = '\0';
    for (int32_t i = 0; i < r->p.n_stop; i++)
        if (strstr(r->tail, r->p.stop[i])) return true;
    return false;
}

// New generation and sampling parameters; the sequences' samplers start afresh.
static nm_status llm_set_params(void *state, const nm_brick_params *p, char *err, size_t err_size) {
    llm_brick *b = state;
    nm_llm_params lp = p->llm;
    if (lp.out_batch < 1) lp.out_batch = 1;
    nm_status st = check_llm_params(&lp, err, err_size);
    if (st != NM_OK) return st;
    if (lp.out != b->p.out) // (the output ring's slots were sized for it)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "llm brick: the output kind is set at load (%d, asked %d)",
                       (int)b->p.out, (int)lp.out);
    nm_sampler_params sp = p->sampling;
    if (sp.repeat_last_n < 0) sp.repeat_last_n = b->n_ctx;
    nm_sampler **fresh = calloc((size_t)b->n_seq, sizeof *fresh);
    bool ok = fresh != NULL;
    for (int32_t s = 0; ok && s < b->n_seq; s++) ok = (fresh[s] = nm_sampler_create(&sp, b->n_vocab)) != NULL;
    if (!ok) {
        for (int32_t s = 0; fresh && s < b->n_seq; s++) nm_sampler_free(fresh[s]);
        free(fresh);
        return nm_fail(NM_ERR_NOMEM, err, err_size, "llm brick: out of memory");
    }
    for (int32_t s = 0; s < b->n_seq; s++) {
        nm_sampler_free(b->seq[s].s);
        b->seq[s].s = fresh[s];
    }
    free(fresh);
    b->sp = sp;
    b->p = lp;
    return NM_OK;
}

// A request's PARAMS slot: its fields over the brick's parameters, for this
// request only. NM_ERR_FORMAT, the field named, for a wrong one.
static nm_status take_params(llm_brick *b, llm_req *r, const nm_tabm_slot *s) {
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
    NUM("max_tps", 0, 1e6, lp.max_tps);
    INT("max_tokens", -2, INT32_MAX, lp.n_predict); // OpenAI's name; n_predict wins when both are given
    INT("n_predict", -2, INT32_MAX, lp.n_predict);
#undef NUM
#undef INT
    if (k >= 0 && (k = nm_req_int(o, "seed", -1, 9007199254740992.0, &i, why, sizeof why)) == 1)
        sp.seed = i >= 0 ? (uint64_t)i : (uint64_t)(nm_now_s() * 1e9) ^ r->id; // llama-server's -1: a random seed
    if (k >= 0) k = nm_req_bool(o, "ignore_eos", &lp.ignore_eos, why, sizeof why);
    if (k >= 0) k = nm_req_bool(o, "cache_prompt", &lp.cache_prompt, why, sizeof why);
    if (k >= 0 && (k = nm_req_strings(o, "stop", NM_LLM_MAX_STOP, NM_LLM_MAX_STOP_LEN, stop, &n_stop, why,
                                      sizeof why)) == 1) {
        for (int32_t j = 0; j < n_stop; j++) {
            snprintf(r->stop[j], sizeof r->stop[j], "%s", stop[j]);
            r->stop_p[j] = r->stop[j];
        }
        lp.stop = r->stop_p;
        lp.n_stop = n_stop;
    }
    nm_req_free(o);
    if (k < 0) return fail(b, NM_ERR_FORMAT, "llm brick: parameters slot %llu: %s", (unsigned long long)s->meta->seq, why);
    if (sp.repeat_last_n < 0) sp.repeat_last_n = b->n_ctx;
    nm_sampler *rs = nm_sampler_create(&sp, b->n_vocab);
    if (!rs) return fail(b, NM_ERR_NOMEM, "llm brick: out of memory for a request's sampler");
    nm_sampler_free(r->own_s);
    r->own_s = r->cur = rs;
    r->p = lp;
    return NM_OK;
}

static llm_brick *of(const nm_brick *b) { return nm_brick_state_of(b, &nm_brick_llm_i); }
nm_model *nm_brick_llm_model(const nm_brick *b) { return of(b) ? of(b)->m : NULL; }
nm_ctx *nm_brick_llm_ctx(const nm_brick *b) { return of(b) ? of(b)->c : NULL; }
int32_t nm_brick_llm_pos(const nm_brick *b) { return of(b) ? of(b)->seq[0].pos : 0; }

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
    o->n_passes = b->st.n_passes;
    o->n_pass_seqs = b->st.n_pass_seqs;
    o->max_pass_seqs = b->st.max_pass_seqs;
}

static const char *llm_device(void *state) { return nm_ctx_device(((llm_brick *)state)->c); }

#define NM_LLM_TEXT_SLOT 4096 // bytes of an output TEXT slot (a sentence, or the text of out_batch tokens)
#define NM_LLM_PIECE 256      // the most bytes one token's text gives (nm_detok_push's piece)

static size_t llm_slot_bytes(void *state, bool out) {
    const llm_brick *b = state;
    if (out && b->p.out != NM_LLM_OUT_TOKENS) return NM_LLM_TEXT_SLOT;
    return sizeof(int32_t) * (size_t)(out ? b->p.out_batch : b->n_ctx);
}

static const char *kind_name(uint32_t k) {
    static const char *names[] = {"bytes", "tokens", "embeddings f32", "embeddings f16", "pcm s16", "pcm f32",
                                  "text", "image", "parameters (only as a request's first slot)"};
    return k < sizeof names / sizeof names[0] ? names[k] : "unknown";
}

// Checks an input slot against the model and the context (q: its request's
// sequence); on success *n is its token/row count and *start its first
// position. NM_ERR_FORMAT (bad slot) or NM_ERR_RANGE (does not fit), the
// reason reported.
static nm_status check_input(llm_brick *b, const llm_seq *q, const nm_tabm_slot *s, int32_t *n, int32_t *start) {
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
        // [n_tokens, n_embd], or an image's grid [rows, columns, n_embd]
        const bool grid = mt->ndim == 3;
        const int64_t width = mt->shape[grid ? 2 : 1], n_rows = grid ? mt->shape[0] * mt->shape[1] : mt->shape[0];
        if ((mt->ndim != 2 && !grid) || mt->shape[0] < 1 || (grid && (mt->shape[1] < 1 || mt->shape[0] > INT32_MAX ||
                                                                    mt->shape[1] > INT32_MAX)) ||
            width < 1 || width > INT32_MAX || n_rows > INT32_MAX ||
            mt->size != sizeof(float) * (uint64_t)n_rows * (uint64_t)width)
            return fail(b, NM_ERR_FORMAT, "llm brick: input slot %llu: an embedding slot needs ndim 2 [n_tokens, "
                        "n_embd] or 3 [rows, columns, n_embd] and at least one row (ndim %d, %llu bytes)", seq, mt->ndim,
                        (unsigned long long)mt->size);
        if (width != b->n_embd)
            return fail(b, NM_ERR_FORMAT, "llm brick: input slot %llu: embeddings of width %lld, the model's n_embd is %d",
                        seq, (long long)width, b->n_embd);
        rows = n_rows;
    } else {
        return fail(b, NM_ERR_FORMAT, "llm brick: input slot %llu: payload kind %u (%s) is not taken: token ids, "
                    "text or f32 embeddings", seq, mt->kind, kind_name(mt->kind));
    }
    int64_t p0 = (mt->user & NM_LLM_IN_AT_POS) ? NM_LLM_IN_POS_OF(mt->user) : q->pos;
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

// Publishes a held output slot with n tokens (text modes: n bytes of text;
// ndim 0 when none) and `user`.
static nm_status put_out(llm_brick *b, const llm_req *r, nm_tabm_slot *o, int32_t n, uint64_t user) {
    nm_tabm_meta *mt = o->meta;
    const bool text = b->p.out != NM_LLM_OUT_TOKENS, end = !(user & NM_BRICK_MORE);
    mt->kind = text ? NM_TABM_TEXT : NM_TABM_TOKENS;
    mt->ndim = n > 0 ? 1 : 0;
    mt->shape[0] = n;
    // the last slot: the request's counts (bricks.h)
    mt->shape[1] = end ? r->n_decoded : 0, mt->shape[2] = end ? r->n_gen : 0, mt->shape[3] = end ? r->n_reused : 0;
    mt->size = (text ? 1 : sizeof(int32_t)) * (uint64_t)n;
    mt->user = user;
    mt->request = r->id;
    b->st.n_out_slots++; // stats and the last error are written before the slot is visible
    nm_status st = nm_tabm_publish(b->out, o);
    if (st != NM_OK) {
        b->st.n_out_slots--;
        fail(b, st, "llm brick: publish on the output ring: %s", nm_tabm_last_error(b->out));
        nm_tabm_cancel(b->out, o);
    }
    return st;
}

// Takes an output slot; on shutdown of the output ring, shuts the input one too.
static nm_status take_out(llm_brick *b, nm_tabm_slot *o) {
    nm_status st = nm_tabm_acquire_write(b->out, b->producer, b->wait_ns, o);
    if (st == NM_ERR_SHUTDOWN) {
        nm_tabm_shutdown(b->in);
        return fail(b, st, "llm brick: the output ring was shut down");
    }
    if (st != NM_OK) return fail(b, st, "llm brick: waiting for an output slot: %s", nm_status_str(st));
    return NM_OK;
}

// The last slot of a request's output: the stop reason, and NM_BRICK_ERROR when the request failed.
static uint64_t end_user(nm_llm_stop why) {
    const bool failed = why == NM_LLM_STOP_BAD_INPUT || why == NM_LLM_STOP_ERROR;
    return ((uint64_t)why << 8) | (failed ? NM_BRICK_ERROR : 0) | (why == NM_LLM_STOP_CANCELLED ? NM_BRICK_CANCELLED : 0);
}

// ---- the engine: requests on sequences, decoded together ---------------------------------
//
// Each request is bound to one of the context's sequences and goes through
// it: its input slots are held in order and decoded in place (token parts
// in prefill chunks, embedding parts in passes of their own), then it
// generates a token a step. A step is one forward pass (nm_decode_seqs)
// carrying the pending token of every generating request and prompt chunks
// of the others, up to n_batch rows, those whose logits are wanted last.
// With one sequence a run serves one request (the next is not read before
// it ends, as the brick protocol's step); with several, every request that
// comes while others are served, returning once none is left.

static bool req_bound(const llm_req *r) { return r->used && r->seq >= 0; }

// The request a slot belongs to, or NULL: with one sequence the one still
// reading its input (its slots may carry other ids: it answers with its
// first slot's), with several the one of the slot's id.
static llm_req *req_of(llm_brick *b, uint64_t id) {
    for (int32_t i = 0; i < b->n_req; i++)
        if (b->req[i].used && !b->req[i].got_last && (b->n_seq == 1 || b->req[i].id == id)) return &b->req[i];
    return NULL;
}

// Releases the head part (decoded, or dropped).
static void part_done(llm_brick *b, llm_req *r) {
    nm_tabm_release(b->in, &r->parts[r->head]);
    r->head++;
    r->off = 0;
    r->checked = false;
}

// Holds a slot read from the input: onto its request's parts, or a new request's.
static nm_status end_request(llm_brick *b, llm_req *r, nm_llm_stop why);

// A TEXT part of a prompt tokenized into its own slot, which becomes a TOKENS
// slot of the request (the reader holds it: nobody else looks at it now).
// BOS where it starts at position 0; special tokens written as text parsed.
static nm_status text_part(llm_brick *b, nm_tabm_slot *s) {
    nm_tabm_meta *mt = s->meta;
    const unsigned long long seq = (unsigned long long)mt->seq;
    if (mt->user & NM_BRICK_ERROR) return NM_OK; // failed upstream: check_input says so, as for any kind
    if (mt->ndim > 1 || (mt->ndim == 1 && (uint64_t)mt->shape[0] != mt->size))
        return fail(b, NM_ERR_FORMAT, "llm brick: input slot %llu: a text slot needs ndim 1 [n_bytes] (ndim %d, %llu "
                    "bytes)", seq, mt->ndim, (unsigned long long)mt->size);
    const bool at0 = (mt->user & NM_LLM_IN_AT_POS) && NM_LLM_IN_POS_OF(mt->user) == 0;
    const int32_t n = mt->size > 0 ? nm_tokenize(b->m, s->data, (size_t)mt->size, b->tok, b->n_ctx + 1, at0, true) : 0;
    if (n == 0) return fail(b, NM_ERR_FORMAT, "llm brick: input slot %llu: the text gives no tokens", seq);
    const int32_t need = n < 0 ? -n : n;
    if (n < 0 || need > b->n_ctx || sizeof(int32_t) * (size_t)need > s->capacity)
        return fail(b, NM_ERR_RANGE, "llm brick: input slot %llu: the text's %s%d tokens do not fit %s of %d", seq,
                    n < 0 ? "over " : "", need, need > b->n_ctx ? "the context" : "the slot",
                    need > b->n_ctx ? b->n_ctx : (int32_t)(s->capacity / sizeof(int32_t)));
    memcpy(s->data, b->tok, sizeof(int32_t) * (size_t)n); // (within the slot: nothing crosses bricks)
    mt->kind = NM_TABM_TOKENS;
    mt->ndim = 1;
    mt->shape[0] = n;
    mt->size = sizeof(int32_t) * (uint64_t)n;
    return NM_OK;
}

// Holds a slot read from the input: onto its request's parts, or a new
// request's. A record is free for every request that holds a slot (llm_run
// sizes them by the ring); when dropped requests whose last slot never came
// took the rest, the oldest of them is ended now to make room.
static nm_status take_slot(llm_brick *b, nm_tabm_slot *s) {
    b->st.n_in_slots++;
    llm_req *r = req_of(b, s->meta->request);
    if (!r) {
        llm_req *oldest = NULL;
        for (int32_t i = 0; i < b->n_req && !r; i++) {
            llm_req *x = &b->req[i];
            if (!x->used) r = x;
            else if (x->seq < 0 && x->dropped != NM_LLM_STOP_NONE && (!oldest || x->arrival < oldest->arrival))
                oldest = x;
        }
        if (!r && oldest) {
            const nm_status st = end_request(b, oldest, oldest->dropped);
            if (st != NM_OK) {
                nm_tabm_release(b->in, s);
                return st;
            }
            r = oldest;
        }
        if (!r) { // (cannot happen: every other record holds a slot of the ring)
            nm_tabm_release(b->in, s);
            return fail(b, NM_ERR_RANGE, "llm brick: no room for request %llu", (unsigned long long)s->meta->request);
        }
        memset(r, 0, sizeof *r);
        r->used = true;
        r->id = s->meta->request;
        r->seq = -1;
        r->arrival = ++b->tick;
    }
    if (!(s->meta->user & NM_BRICK_MORE)) r->got_last = true;
    if (r->n_parts == NM_LLM_MAX_PARTS && r->head > 0) { // room again: what was decoded goes
        memmove(r->parts, r->parts + r->head, sizeof r->parts[0] * (size_t)(r->n_parts - r->head));
        r->n_parts -= r->head;
        r->head = 0;
    }
    if (r->dropped != NM_LLM_STOP_NONE) { // a dropped request's rest: read and dropped
        nm_tabm_release(b->in, s);
    } else if (s->meta->kind == NM_TABM_TEXT && text_part(b, s) != NM_OK) {
        nm_tabm_release(b->in, s);
        r->dropped = NM_LLM_STOP_BAD_INPUT;
        snprintf(r->err, sizeof r->err, "%s", nm_brick_last_error(b->self));
        b->st.n_bad_slots++;
    } else if (r->n_parts == NM_LLM_MAX_PARTS) {
        nm_tabm_release(b->in, s);
        fail(b, NM_ERR_RANGE, "llm brick: request %llu: more than %d of its input slots wait to be decoded",
             (unsigned long long)r->id, NM_LLM_MAX_PARTS);
        r->dropped = NM_LLM_STOP_BAD_INPUT; // (its END may come after other requests' failures: its text now)
        snprintf(r->err, sizeof r->err, "%s", nm_brick_last_error(b->self));
        b->st.n_bad_slots++;
    } else {
        r->parts[r->n_parts++] = *s;
    }
    return NM_OK;
}

// How many of the n tokens t from position p0 the sequence's cache holds and
// may give again: the same tokens, up to a chunk boundary within what was
// decoded as a fresh prompt decodes it (n_exact). The last position of a
// prompt (last) is decoded again for its logits: its whole chunk then is.
static int32_t reusable(const llm_brick *b, const llm_seq *q, const int32_t *t, int32_t n, int32_t p0, bool last) {
    int32_t k = 0;
    while (p0 >= 0 && k < n && p0 + k < q->n_cached && q->cached[p0 + k] == t[k]) k++;
    int32_t e = p0 + k < q->n_exact ? p0 + k : q->n_exact;
    if (last && e >= p0 + n) e = p0 + n - 1;
    e -= e % b->n_ubatch;
    // a model with recurrent layers goes on only where their state is kept (a chunk's end, at the default sizes)
    for (int32_t r; e > 0 && (r = nm_ctx_resume_pos(b->c, (int32_t)(q - b->seq), e)) != e;) e = r - r % b->n_ubatch;
    return e > p0 ? e - p0 : 0;
}

// How many of the slot's tokens the sequence's cache may give again.
static int32_t cached_run(const llm_brick *b, const llm_seq *q, const nm_tabm_slot *s) {
    if (s->meta->kind != NM_TABM_TOKENS || s->meta->ndim != 1 || !(s->meta->user & NM_LLM_IN_AT_POS)) return 0;
    return reusable(b, q, s->data, (int32_t)s->meta->shape[0], NM_LLM_IN_POS_OF(s->meta->user),
                    !(s->meta->user & NM_BRICK_MORE));
}

// Rows are decoded into q from position `at`: what lay there is replaced.
static void overwritten(const llm_brick *b, llm_seq *q, int32_t at) {
    if (q->n_exact > at) q->n_exact = at - at % b->n_ubatch;
}

// Binds the requests that wait, in arrival order, to free sequences: the one
// whose cache holds the longest start of the request's first prompt part (a
// repeated system prompt is not decoded again), else the least recently used.
static void bind_requests(llm_brick *b) {
    for (int32_t i = 0; i < b->n_req; i++) b->req[i].bind_skip = false;
    for (;;) {
        llm_req *r = NULL;
        for (int32_t i = 0; i < b->n_req; i++) {
            llm_req *x = &b->req[i];
            if (x->used && x->seq < 0 && x->dropped == NM_LLM_STOP_NONE && !x->bind_skip &&
                (!r || x->arrival < r->arrival))
                r = x;
        }
        if (!r) return;
        const nm_tabm_slot *first = NULL; // its first prompt part (after its PARAMS), if it has come
        for (int32_t k = r->head; k < r->n_parts && !first; k++)
            if (r->parts[k].meta->kind != NM_TABM_PARAMS) first = &r->parts[k];
        if (!first && !r->got_last && b->n_seq > 1) { // the choice waits for it; the next ones go on
            r->bind_skip = true;
            continue;
        }
        int32_t best = -1, best_run = -1;
        for (int32_t s = 0; s < b->n_seq; s++) {
            const llm_seq *q = &b->seq[s];
            if (q->r) continue;
            const int32_t run = first ? cached_run(b, q, first) : 0;
            if (run > best_run || (run == best_run && q->used < b->seq[best].used)) best = s, best_run = run;
        }
        if (best < 0) return; // every sequence is busy
        llm_seq *q = &b->seq[best];
        q->r = r;
        q->used = ++b->tick;
        r->seq = best;
        r->prompt_pos = q->pos;
        r->cur = q->s; // the sequence's sampler, unless a PARAMS slot brings the request's own
        r->p = b->p;
    }
}

// Text modes: the held slot's text goes out (more of the request follows).
static nm_status flush_text(llm_brick *b, llm_req *r) {
    r->held = false;
    const nm_status st = put_out(b, r, &r->out, (int32_t)r->n_text, NM_BRICK_MORE);
    r->n_text = 0;
    r->n_held = 0;
    return st;
}

// Text modes: n >= 1 bytes of the answer into the request's output slot, which
// goes out where the mode cuts: every out_batch tokens (every token with
// several sequences: out_text), or, for a voice, before a blank that follows a
// sentence's end, after a line's end, and where the next bytes would not fit.
static nm_status put_text_bytes(llm_brick *b, llm_req *r, const char *p, size_t n) {
    const bool sentences = b->p.out == NM_LLM_OUT_SENTENCES;
    nm_status st = NM_OK;
    if (sentences && r->held && r->n_text > 0 && r->ended_sentence && (p[0] == ' ' || p[0] == '\n'))
        st = flush_text(b, r);
    if (st == NM_OK && r->held && r->n_text + n > r->out.capacity) st = flush_text(b, r);
    if (st == NM_OK && !r->held && (st = take_out(b, &r->out)) == NM_OK) r->held = true, r->n_text = 0;
    if (st != NM_OK) return st;
    memcpy((char *)r->out.data + r->n_text, p, n);
    r->n_text += n;
    const char last = p[n - 1];
    r->ended_sentence = last == '.' || last == '!' || last == '?';
    return sentences && last == '\n' ? flush_text(b, r) : NM_OK;
}

// A voice's sentences: the answer's content goes into the slots, its reasoning
// (a <think> block that opens it, as Qwen3 and SmolLM3 write) nowhere.
typedef struct spoken {
    llm_brick *b;
    llm_req *r;
    nm_status st;
} spoken;

static void spoken_out(void *user, bool reasoning, const char *p, size_t n) {
    spoken *k = user;
    if (!reasoning && k->st == NM_OK) k->st = put_text_bytes(k->b, k->r, p, n);
}

// Publishes a request's last slot (the tokens it still holds, the reason)
// and frees its sequence and itself.
static nm_status end_request(llm_brick *b, llm_req *r, nm_llm_stop why) {
    if (end_user(why) & NM_BRICK_ERROR) // the request's own text (with several at once the last error may be another's)
        nm_brick_set_request_error(b->self, r->id, "%s", r->err[0] ? r->err : nm_brick_last_error(b->self));
    if (why == NM_LLM_STOP_CANCELLED) {
        nm_tabm_cancel_request(b->out, r->id); // what went out may still be queued downstream
        b->st.n_cancelled++;
    }
    while (r->head < r->n_parts) part_done(b, r);
    nm_status st = NM_OK;
    if (b->p.out == NM_LLM_OUT_SENTENCES && why != NM_LLM_STOP_CANCELLED && !(end_user(why) & NM_BRICK_ERROR)) {
        spoken k = {b, r, NM_OK}; // (what the split held back: a blank, or what might have begun a tag)
        nm_think_feed(&r->think, "", 0, true, spoken_out, &k);
        st = k.st;
    }
    if (st == NM_OK && !r->held && (st = take_out(b, &r->out)) == NM_OK) r->held = true;
    if (st == NM_OK) {
        b->st.n_prompts++; // the END slot makes the brick idle for its reader: account first
        r->held = false;
        const int32_t n = b->p.out == NM_LLM_OUT_TOKENS ? r->n_held : (int32_t)r->n_text;
        if ((st = put_out(b, r, &r->out, n, end_user(why))) != NM_OK) b->st.n_prompts--;
    }
    if (r->seq >= 0) {
        llm_seq *q = &b->seq[r->seq];
        if (!r->generating) q->pos = r->prompt_pos; // a dropped prompt leaves no position behind
        q->r = NULL;
    }
    nm_sampler_free(r->own_s);
    memset(r, 0, sizeof *r);
    return st;
}

// Drops a request whose prompt failed or was cancelled: its held parts now,
// its END once its last slot has been read.
static nm_status drop(llm_brick *b, llm_req *r, nm_llm_stop why) {
    if ((end_user(why) & NM_BRICK_ERROR) && !r->err[0]) // (the failure was just recorded: this lane's last error)
        snprintf(r->err, sizeof r->err, "%s", nm_brick_last_error(b->self));
    if (r->dropped == NM_LLM_STOP_NONE) r->dropped = why;
    while (r->head < r->n_parts) part_done(b, r);
    if (r->seq >= 0) { // its sequence goes back now
        llm_seq *q = &b->seq[r->seq];
        q->pos = r->prompt_pos;
        q->r = NULL;
        r->seq = -1;
    }
    return r->got_last ? end_request(b, r, r->dropped) : NM_OK;
}

// Checks r's head part: a PARAMS slot (taken), a cancelled request, the
// slot's kind, shape and room; sets n, p0, last and the rows the cache
// already holds. False when the request is dropped.
static bool check_part(llm_brick *b, llm_req *r, nm_tabm_slot *s) {
    llm_seq *q = &b->seq[r->seq];
    const bool last = !(s->meta->user & NM_BRICK_MORE), first = !r->started;
    r->started = true;
    if (first && s->meta->kind == NM_TABM_PARAMS) {
        const nm_status st = last ? fail(b, NM_ERR_FORMAT, "llm brick: request %llu is parameters alone: no prompt "
                                         "follows (the parameters slot lacks NM_BRICK_MORE)", (unsigned long long)r->id)
                                  : take_params(b, r, s);
        if (st != NM_OK) {
            b->st.n_bad_slots++;
            r->dropped = NM_LLM_STOP_BAD_INPUT;
            return false;
        }
        part_done(b, r);
        return true;
    }
    if (nm_req_cancelled(b->in, s->meta->user, r->id)) {
        r->dropped = NM_LLM_STOP_CANCELLED;
        return false;
    }
    int32_t n = 0, p0 = 0;
    if (check_input(b, q, s, &n, &p0) != NM_OK) {
        b->st.n_bad_slots++;
        r->dropped = NM_LLM_STOP_BAD_INPUT;
        return false;
    }
    // Positions skipped over (a slot placed past what is cached) hold unknown entries.
    for (int32_t i = q->n_cached; i < p0; i++) q->cached[i] = -1;
    if (q->n_cached < p0) q->n_cached = p0;
    r->n = n, r->p0 = p0, r->last = last, r->off = 0;
    if (s->meta->kind == NM_TABM_TOKENS && r->p.cache_prompt)
        r->off = reusable(b, q, s->data, n, p0, last); // prefix reuse, exact
    r->n_reused += r->off;
    r->checked = true;
    q->pos = p0 + r->off;
    if (r->off == n) { // every token already there
        q->pos = p0 + n;
        part_done(b, r);
    }
    return true;
}

// Text modes: tok's text into the request's output slot (put_text_bytes; for
// a voice through the thinking's split). The detokenizer holds back the bytes
// of a character split between tokens: slots hold whole UTF-8.
static nm_status out_text(llm_brick *b, llm_req *r, int32_t tok) {
    char piece[NM_LLM_PIECE];
    const int32_t pn = nm_detok_push(b->m, &r->odt, tok, piece, (int32_t)sizeof piece);
    const bool sentences = b->p.out == NM_LLM_OUT_SENTENCES;
    nm_status st = NM_OK;
    r->n_held++;
    if (pn > 0 && sentences) {
        spoken k = {b, r, NM_OK};
        nm_think_feed(&r->think, piece, (size_t)pn, false, spoken_out, &k);
        st = k.st;
    } else if (pn > 0) {
        st = put_text_bytes(b, r, piece, (size_t)pn);
    }
    if (st == NM_OK && !sentences && r->held && (r->n_held >= r->p.out_batch || b->n_seq > 1)) st = flush_text(b, r);
    return st;
}

// Samples r's next token and writes it out (it is decoded by the next pass):
// NM_LLM_STOP_NONE, or why r stops here (*st set when a ring failed).
static nm_llm_stop sample(llm_brick *b, llm_req *r, const float *logits, nm_status *st) {
    const double t0 = nm_now_s();
    llm_seq *q = &b->seq[r->seq];
    *st = NM_OK;
    if (!r->generating) r->t_gen0 = t0;
    r->generating = true;
    if (r->p.n_predict >= 0 && r->n_gen >= r->p.n_predict) return NM_LLM_STOP_N_PREDICT;
    if (q->pos >= b->n_ctx) return NM_LLM_STOP_CTX_FULL;
    if (nm_tabm_request_cancelled(b->in, r->id)) return NM_LLM_STOP_CANCELLED;
    if (r->p.ignore_eos) { // as llama.cpp's logit bias of -inf on every end-of-generation token
        memcpy(b->masked, logits, sizeof(float) * (size_t)b->n_vocab);
        for (int32_t e = 0; e < b->n_eog; e++) b->masked[b->eog[e]] = -INFINITY;
        logits = b->masked;
    }
    const int32_t tok = nm_sampler_sample(r->cur, logits);
    if (nm_token_is_eog(b->m, tok)) return NM_LLM_STOP_EOG;
    nm_sampler_accept(r->cur, tok);
    // The token goes out before it is decoded, so the consumer works on it
    // (prints it) while the next pass runs. With several sequences each
    // token goes at once (a slot held across passes by each could fill the ring).
    if (b->p.out != NM_LLM_OUT_TOKENS) {
        if ((*st = out_text(b, r, tok)) != NM_OK) return NM_LLM_STOP_ERROR;
    } else {
        if (!r->held) {
            if ((*st = take_out(b, &r->out)) != NM_OK) return NM_LLM_STOP_ERROR;
            r->held = true;
        }
        ((int32_t *)r->out.data)[r->n_held++] = tok;
        if (r->n_held == r->p.out_batch || b->n_seq > 1) {
            r->held = false;
            *st = put_out(b, r, &r->out, r->n_held, NM_BRICK_MORE);
            r->n_held = 0;
            if (*st != NM_OK) return NM_LLM_STOP_ERROR;
        }
    }
    r->pending = tok;
    q->cached[q->pos] = tok;
    r->n_gen++;
    if (r->p.n_stop > 0 && reached_stop(b, r, tok)) r->stop_after = true; // written and decoded, then it stops
    b->st.t_gen += nm_now_s() - t0;
    return NM_LLM_STOP_NONE;
}

// After a sample: ends r when it stopped. A ring failure stops the brick.
static nm_status sampled(llm_brick *b, llm_req *r, const float *logits) {
    nm_status st;
    const nm_llm_stop why = sample(b, r, logits, &st);
    if (st != NM_OK) return st;
    return why != NM_LLM_STOP_NONE ? end_request(b, r, why) : NM_OK;
}

// Decodes r's embedding part in passes of its own, reading the slot's rows
// in place; samples when it ends the prompt. A failed ring stops the brick.
static nm_status embd_part(llm_brick *b, llm_req *r, nm_tabm_slot *s) {
    llm_seq *q = &b->seq[r->seq];
    const float *x = s->data;
    while (r->off < r->n) {
        if (nm_tabm_request_cancelled(b->in, r->id)) return drop(b, r, NM_LLM_STOP_CANCELLED);
        // an image's grid [rows, columns, n_embd] goes whole: its rows and columns place its tokens (M-RoPE)
        const bool grid = s->meta->ndim == 3;
        const int32_t nb = grid || r->n - r->off < b->n_batch ? r->n - r->off : b->n_batch, at = r->p0 + r->off;
        overwritten(b, q, at);
        const double t0 = nm_now_s();
        const nm_status st =
            grid ? nm_decode_embd_grid(b->c, x, (int32_t)s->meta->shape[1], (int32_t)s->meta->shape[0], at, r->seq, false)
                 : nm_decode_embd_seq(b->c, x + (size_t)r->off * (size_t)b->n_embd, nb, at, r->seq, false);
        b->st.t_prompt += nm_now_s() - t0;
        b->st.n_passes++;
        b->st.n_pass_seqs++;
        if (b->st.max_pass_seqs < 1) b->st.max_pass_seqs = 1;
        if (st != NM_OK) {
            if (q->n_cached > at) q->n_cached = at; // a failed decode may have written from there on
            fail(b, st, "llm brick: decode of input slot %llu failed: %s (%s)", (unsigned long long)s->meta->seq,
                 nm_status_str(st), nm_ctx_last_error(b->c));
            return drop(b, r, NM_LLM_STOP_ERROR);
        }
        for (int32_t j = 0; j < nb; j++) q->cached[at + j] = -1;
        r->off += nb;
        q->pos = r->p0 + r->off;
        q->n_cached = q->pos; // what lay beyond was computed over another prefix
        b->st.n_prompt_tokens += (uint64_t)nb;
        r->n_decoded += nb;
    }
    const bool end = r->last;
    part_done(b, r);
    return end ? sampled(b, r, nm_get_logits(b->c, -1)) : NM_OK;
}

// Reads what the input has: a wait when nothing else can move, else only
// what is there. *idle: the run is over (every request it took has ended).
static nm_status read_input(llm_brick *b, bool *served, bool *idle) {
    *idle = false;
    for (;;) {
        bind_requests(b);
        int32_t active = 0;
        bool work = false, need = false; // something to decode; a request still reading its input
        for (int32_t i = 0; i < b->n_req; i++) {
            const llm_req *r = &b->req[i];
            if (!r->used) continue;
            active++;
            need = need || !r->got_last;
            if (req_bound(r) && (r->generating || r->head < r->n_parts)) work = true;
            if (r->dropped != NM_LLM_STOP_NONE && (r->got_last || req_bound(r))) work = true; // its END or its drop
        }
        if (active == 0 && *served) {
            *idle = true;
            return NM_OK;
        }
        const bool new_ones = b->n_seq > 1 || active == 0; // (one sequence: one request a run)
        if (b->in_shut || (!need && !new_ones)) return NM_OK;
        nm_tabm_slot s;
        nm_status st = nm_tabm_acquire_read(b->in, work ? 0 : b->wait_ns, &s);
        if (st == NM_ERR_AGAIN && !work) return st; // (nm_brick_step: no other thread writes the input)
        if (st == NM_ERR_AGAIN) return NM_OK;
        if (st == NM_ERR_SHUTDOWN) {
            b->in_shut = true;
            if (active > 0) return NM_OK; // those that have their input are served first
            nm_tabm_shutdown(b->out);
            return fail(b, st, "llm brick: the input ring was shut down");
        }
        if (st != NM_OK) return fail(b, st, "llm brick: waiting for an input slot: %s", nm_status_str(st));
        *served = true;
        if ((st = take_slot(b, &s)) != NM_OK) return st;
    }
}

// The requests whose input will not come (the ring was shut down) fail.
static nm_status input_gone(llm_brick *b) {
    for (int32_t i = 0; i < b->n_req; i++) {
        llm_req *r = &b->req[i];
        if (!r->used || r->got_last) continue;
        fail(b, NM_ERR_SHUTDOWN, "llm brick: request %llu: the input ring was shut down before its last slot",
             (unsigned long long)r->id);
        r->got_last = true;
        if (r->dropped == NM_LLM_STOP_NONE) r->dropped = NM_LLM_STOP_ERROR;
        nm_status st = drop(b, r, r->dropped);
        if (st != NM_OK) return st;
    }
    return NM_OK;
}

// A pass of generating rows only, each of a request with a pace (max_tps), waits
// until the soonest of their next tokens is due.
static void pace(const llm_brick *b, int32_t n_prompt) {
    if (n_prompt > 0) return;
    double due = INFINITY;
    for (int32_t i = 0; i < b->n_req; i++) {
        const llm_req *r = &b->req[i];
        if (!r->used || r->row_kind != ROW_GEN) continue;
        if (!(r->p.max_tps > 0)) return;
        const double t = r->t_gen0 + r->n_gen / (double)r->p.max_tps;
        if (t < due) due = t;
    }
    const double wait = due - nm_now_s();
    if (!(wait > 0) || wait == INFINITY) return;
    struct timespec ts = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
    nanosleep(&ts, NULL);
}

// One pass: the generating requests' tokens and prompt chunks, then what it gave.
static nm_status pass(llm_brick *b) {
    int32_t n = 0, n_gen = 0, n_prompt = 0, n_used = 0;
    for (int32_t i = 0; i < b->n_req; i++) { // the requests by arrival (the oldest served first)
        b->req[i].row_kind = ROW_NONE;
        if (!b->req[i].used) continue;
        int32_t j = n_used++;
        for (; j > 0 && b->req[b->order[j - 1]].arrival > b->req[i].arrival; j--) b->order[j] = b->order[j - 1];
        b->order[j] = i;
    }
    // the generating requests' pending tokens first in line for the batch's rows
    for (int32_t k = 0; k < n_used; k++) {
        llm_req *r = &b->req[b->order[k]];
        if (req_bound(r) && r->generating && n_gen < b->n_batch) r->row_kind = ROW_GEN, n_gen++;
    }
    // prompt chunks in the room left, rows without logits first
    for (int32_t k = 0; k < n_used && n_gen + n_prompt < b->n_batch; k++) {
        llm_req *r = &b->req[b->order[k]];
        if (!req_bound(r) || r->generating || !r->checked || r->head >= r->n_parts) continue;
        nm_tabm_slot *s = &r->parts[r->head];
        if (s->meta->kind != NM_TABM_TOKENS) continue;
        if (nm_tabm_request_cancelled(b->in, r->id)) { // stopped between chunks: what is cached is whole
            nm_status st = drop(b, r, NM_LLM_STOP_CANCELLED);
            if (st != NM_OK) return st;
            continue;
        }
        const int32_t *t = s->data, at = r->p0 + r->off;
        int32_t take = r->n - r->off;
        if (take > b->n_batch - n_gen - n_prompt) take = b->n_batch - n_gen - n_prompt;
        if (take > b->n_ubatch - at % b->n_ubatch) take = b->n_ubatch - at % b->n_ubatch; // to the next chunk boundary
        const bool ends = r->last && r->off + take == r->n;
        r->row_kind = ends ? ROW_PROMPT_END : ROW_PROMPT;
        r->chunk = take;
        for (int32_t j = 0; j < take - (ends ? 1 : 0); j++) {
            b->bt[n] = t[r->off + j];
            b->bp[n] = r->p0 + r->off + j;
            b->bs[n++] = r->seq;
        }
        n_prompt += take;
    }
    const int32_t first_logit = n;
    for (int32_t i = 0; i < b->n_req; i++) { // the rows whose logits are wanted: prompt ends, then tokens
        llm_req *r = &b->req[i];
        if (r->row_kind != ROW_PROMPT_END) continue;
        const int32_t j = r->off + r->chunk - 1;
        r->row = n;
        b->bt[n] = ((const int32_t *)r->parts[r->head].data)[j], b->bp[n] = r->p0 + j, b->bs[n++] = r->seq;
    }
    for (int32_t i = 0; i < b->n_req; i++) {
        llm_req *r = &b->req[i];
        if (r->row_kind != ROW_GEN) continue;
        r->row = n;
        b->bt[n] = r->pending, b->bp[n] = b->seq[r->seq].pos, b->bs[n++] = r->seq;
    }
    if (n == 0) return NM_OK;
    uint32_t seqs = 0;
    for (int32_t i = 0; i < b->n_req; i++) {
        llm_req *r = &b->req[i];
        if (!r->used || r->row_kind == ROW_NONE) continue;
        seqs++;
        overwritten(b, &b->seq[r->seq], r->row_kind == ROW_GEN ? b->seq[r->seq].pos : r->p0 + r->off);
    }
    pace(b, n_prompt);
    b->st.n_passes++;
    b->st.n_pass_seqs += seqs;
    if (seqs > b->st.max_pass_seqs) b->st.max_pass_seqs = seqs;
    const double t0 = nm_now_s();
    const nm_status dst = nm_decode_seqs(b->c, b->bt, b->bp, b->bs, n, n - first_logit);
    const double dt = nm_now_s() - t0;
    b->st.t_prompt += dt * n_prompt / n;
    b->st.t_gen += dt * (n - n_prompt) / n;
    for (int32_t i = 0; i < b->n_req; i++) {
        llm_req *r = &b->req[i];
        if (!r->used || r->row_kind == ROW_NONE) continue;
        llm_seq *q = &b->seq[r->seq];
        nm_status st = NM_OK;
        if (r->row_kind == ROW_GEN) {
            if (dst != NM_OK) {
                fail(b, dst, "llm brick: decode failed at position %d: %s (%s)", q->pos, nm_status_str(dst),
                     nm_ctx_last_error(b->c));
                if (q->n_cached > q->pos) q->n_cached = q->pos;
                st = end_request(b, r, NM_LLM_STOP_ERROR);
            } else {
                q->pos++;
                q->n_cached = q->pos; // (beyond: computed over another prefix)
                b->st.n_gen++;
                st = r->stop_after ? end_request(b, r, NM_LLM_STOP_STRING)
                                   : sampled(b, r, nm_get_logits(b->c, r->row));
            }
        } else {
            const nm_tabm_slot *s = &r->parts[r->head];
            const int32_t at = r->p0 + r->off;
            if (dst != NM_OK) {
                if (q->n_cached > at) q->n_cached = at; // a failed decode may have written from there on
                fail(b, dst, "llm brick: decode of input slot %llu failed: %s (%s)", (unsigned long long)s->meta->seq,
                     nm_status_str(dst), nm_ctx_last_error(b->c));
                st = drop(b, r, NM_LLM_STOP_ERROR);
            } else {
                const int32_t *t = s->data;
                for (int32_t j = 0; j < r->chunk; j++) {
                    q->cached[at + j] = t[r->off + j];
                    nm_sampler_accept(r->cur, t[r->off + j]);
                }
                // a whole chunk alone in its pass, right after the exact ones: as a fresh prompt decodes it
                if (seqs == 1 && r->chunk == n && r->chunk == b->n_ubatch && at == q->n_exact) q->n_exact += b->n_ubatch;
                r->off += r->chunk;
                q->pos = r->p0 + r->off;
                q->n_cached = q->pos; // (beyond: computed over another prefix)
                b->st.n_prompt_tokens += (uint64_t)r->chunk;
                r->n_decoded += r->chunk;
                const bool end = r->row_kind == ROW_PROMPT_END;
                if (r->off == r->n) part_done(b, r);
                if (end) st = sampled(b, r, nm_get_logits(b->c, r->row));
            }
        }
        if (st != NM_OK) return st;
    }
    return NM_OK;
}

static nm_status engine_run(llm_brick *b) {
    bool served = false;
    for (;;) {
        bool idle;
        nm_status st = read_input(b, &served, &idle);
        if (st != NM_OK || idle) return st;
        if (b->in_shut && (st = input_gone(b)) != NM_OK) return st;
        bind_requests(b);
        // each bound request's parts up to its next token part: PARAMS, checks, embeddings
        for (int32_t i = 0; i < b->n_req; i++) {
            llm_req *r = &b->req[i];
            if (req_bound(r) && r->dropped != NM_LLM_STOP_NONE && (st = drop(b, r, r->dropped)) != NM_OK)
                return st; // (dropped while its slots were read: too many held at once)
            while (req_bound(r) && !r->generating && r->head < r->n_parts) {
                nm_tabm_slot *s = &r->parts[r->head];
                if (!r->checked && !check_part(b, r, s)) {
                    st = drop(b, r, r->dropped);
                    break;
                }
                if (!r->checked) continue; // (a PARAMS slot, taken; or a part the cache held whole)
                if (s->meta->kind != NM_TABM_EMBD_F32) break; // a token part: rows of the pass
                if ((st = embd_part(b, r, s)) != NM_OK) break;
            }
            if (st != NM_OK) return st;
            if (r->used && r->seq < 0 && r->dropped != NM_LLM_STOP_NONE && r->got_last &&
                (st = end_request(b, r, r->dropped)) != NM_OK) // (dropped before a sequence took it)
                return st;
        }
        if ((st = pass(b)) != NM_OK) return st;
        if (b->in_shut) {
            bool any = false;
            for (int32_t i = 0; i < b->n_req; i++) any = any || b->req[i].used;
            if (!any) {
                nm_tabm_shutdown(b->out);
                return fail(b, NM_ERR_SHUTDOWN, "llm brick: the input ring was shut down");
            }
        }
    }
}

// Serves requests: one with one sequence, every one that comes while others
// are served with several (it returns once none is left).
static nm_status llm_run(void *state, nm_brick *self, nm_tabm *in, nm_tabm *out) {
    llm_brick *b = state;
    b->self = self;
    b->wait_ns = nm_brick_wait_ns(self, b->timeout_ns);
    b->in = in;
    b->out = out;
    b->in_shut = false;
    if (b->p.out == NM_LLM_OUT_TOKENS && sizeof(int32_t) * (size_t)b->p.out_batch > nm_tabm_max_payload(out))
        return fail(b, NM_ERR_INVALID_ARG, "llm brick: output slots of %zu bytes cannot hold %d tokens",
                    nm_tabm_max_payload(out), b->p.out_batch);
    if (b->p.out == NM_LLM_OUT_TEXT && nm_tabm_max_payload(out) < NM_LLM_PIECE)
        return fail(b, NM_ERR_INVALID_ARG, "llm brick: output slots of %zu bytes cannot hold a token's text (%d)",
                    nm_tabm_max_payload(out), NM_LLM_PIECE);
    // (the thinking's split hands on up to NM_THINK_RUN_MAX bytes at once: what it held back, and a token's text)
    if (b->p.out == NM_LLM_OUT_SENTENCES && nm_tabm_max_payload(out) < NM_THINK_RUN_MAX)
        return fail(b, NM_ERR_INVALID_ARG, "llm brick: output slots of %zu bytes cannot hold a sentence's run (%d)",
                    nm_tabm_max_payload(out), NM_THINK_RUN_MAX);
    // room for a request per slot the input ring can hold, besides those on sequences (a run starts
    // with none held: each ended when the last run returned)
    const int32_t want = b->n_seq + (int32_t)nm_tabm_n_slots(in) + 8;
    if (want > b->n_req) {
        llm_req *more = realloc(b->req, sizeof *more * (size_t)want);
        if (more) b->req = more;
        int32_t *order = more ? realloc(b->order, sizeof *order * (size_t)want) : NULL;
        if (!order) return fail(b, NM_ERR_NOMEM, "llm brick: out of memory for %d requests", want);
        b->order = order;
        memset(more + b->n_req, 0, sizeof *more * (size_t)(want - b->n_req));
        b->n_req = want;
    }
    nm_status st = engine_run(b);
    if (st != NM_OK) release_held(b);
    return st;
}

const nm_brick_i nm_brick_llm_i = {
    .version = NM_BRICK_I_VERSION,
    .kind = NM_BRICK_LLM,
    .name = "llm",
    .in_ports = NM_PORT_BIT(NM_PORT_TOKENS) | NM_PORT_BIT(NM_PORT_EMBD) | NM_PORT_BIT(NM_PORT_TEXT),
    .out_ports = NM_PORT_BIT(NM_PORT_TOKENS) | NM_PORT_BIT(NM_PORT_TEXT),
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
