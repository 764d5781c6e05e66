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
#include "core/fail.h"

struct nm_llm_brick {
    nm_model *m;
    nm_ctx *c;
    nm_sampler *s;
    nm_ledger *ledger;
    int ep;                   // this brick's ledger endpoint (-1 without a ledger)
    nm_llm_brick_params p;
    int32_t n_ctx, n_batch, n_embd, n_vocab;
    int32_t pos;              // where the next slot without NM_LLM_IN_AT_POS starts
    int32_t *cached;          // (n_ctx) token id at each cached position; -1: an embedding row
    int32_t n_cached;         // positions [0, n_cached) of the KV cache hold what cached[] says
    nm_llm_brick_stats st;
    float *masked;            // (n_vocab) with ignore_eos: the logits, end-of-generation tokens at -inf
    int32_t *eog;             // with ignore_eos: the end-of-generation token ids
    int32_t n_eog;
    char tail[2 * NM_LLM_MAX_STOP_LEN + 64]; // with stop strings: the end of the text generated so far
    int32_t n_tail;
    char err[256];
};

nm_llm_brick_params nm_llm_brick_default_params(void) {
    nm_llm_brick_params p = {.n_predict = 128, .out_batch = 1, .producer = 0, .timeout_ns = -1, .name = NULL};
    return p;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// The error texts of every brick (failures are rare): a brick runs on its
// lane's thread while another reads its last error.
static pthread_mutex_t err_lock = PTHREAD_MUTEX_INITIALIZER;

static nm_status fail(nm_llm_brick *b, nm_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&err_lock);
    vsnprintf(b->err, sizeof b->err, fmt, ap);
    pthread_mutex_unlock(&err_lock);
    va_end(ap);
    return st;
}

nm_status nm_llm_brick_create(nm_model *m, nm_ctx *c, nm_sampler *s, const nm_llm_brick_params *p,
                              nm_ledger *ledger, nm_llm_brick **out, char *err, size_t err_size) {
    if (!out) return NM_ERR_INVALID_ARG;
    *out = NULL;
    if (!m || !c || !s) {
        if (err) snprintf(err, err_size, "llm brick: model, context and sampler are required");
        return NM_ERR_INVALID_ARG;
    }
    nm_llm_brick *b = calloc(1, sizeof *b);
    if (!b) return NM_ERR_NOMEM;
    b->m = m;
    b->c = c;
    b->s = s;
    b->p = p ? *p : nm_llm_brick_default_params();
    if (b->p.out_batch < 1) b->p.out_batch = 1;
    b->n_ctx = nm_ctx_n_ctx(c);
    b->n_batch = nm_ctx_n_batch(c);
    b->n_embd = nm_model_n_embd(m);
    b->n_vocab = nm_model_n_vocab(m);
    b->cached = malloc(sizeof(int32_t) * (size_t)b->n_ctx);
    if (!b->cached) {
        free(b);
        return NM_ERR_NOMEM;
    }
    if (b->p.n_stop < 0 || b->p.n_stop > NM_LLM_MAX_STOP || (b->p.n_stop > 0 && !b->p.stop)) {
        if (err) snprintf(err, err_size, "llm brick: %d stop strings (0..%d)", b->p.n_stop, NM_LLM_MAX_STOP);
        free(b->cached);
        free(b);
        return NM_ERR_INVALID_ARG;
    }
    for (int32_t i = 0; i < b->p.n_stop; i++)
        if (!b->p.stop[i] || !b->p.stop[i][0] || strlen(b->p.stop[i]) > NM_LLM_MAX_STOP_LEN) {
            if (err) snprintf(err, err_size, "llm brick: stop string %d is empty or over %d bytes", i, NM_LLM_MAX_STOP_LEN);
            free(b->cached);
            free(b);
            return NM_ERR_INVALID_ARG;
        }
    if (b->p.ignore_eos) {
        b->masked = malloc(sizeof(float) * (size_t)b->n_vocab);
        b->eog = malloc(sizeof(int32_t) * (size_t)b->n_vocab);
        if (!b->masked || !b->eog) {
            nm_llm_brick_free(b);
            return NM_ERR_NOMEM;
        }
        for (int32_t t = 0; t < b->n_vocab; t++)
            if (nm_token_is_eog(m, t)) b->eog[b->n_eog++] = t;
    }
    b->ledger = ledger;
    b->ep = ledger ? nm_ledger_endpoint(ledger, b->p.name ? b->p.name : "llm") : -1;
    if (ledger && b->ep < 0) {
        if (err) snprintf(err, err_size, "llm brick: the ledger has no room for another endpoint");
        nm_llm_brick_free(b);
        return NM_ERR_RANGE;
    }
    *out = b;
    return NM_OK;
}

void nm_llm_brick_free(nm_llm_brick *b) {
    if (!b) return;
    free(b->cached);
    free(b->masked);
    free(b->eog);
    free(b);
}

// With stop strings: appends tok's text to the tail and says whether the text
// now holds a stop string. The tail keeps the last bytes, enough for any.
static bool reached_stop(nm_llm_brick *b, nm_detok *dt, int32_t tok) {
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

int32_t nm_llm_brick_pos(const nm_llm_brick *b) { return b ? b->pos : 0; }
// Copied out under the lock into the calling thread's own buffer (as nm_umem_last_error).
const char *nm_llm_brick_last_error(const nm_llm_brick *b) {
    static _Thread_local char msg[sizeof b->err];
    return b ? nm_err_snapshot(&err_lock, b->err, msg, sizeof msg) : "";
}
nm_llm_brick_stats nm_llm_brick_get_stats(const nm_llm_brick *b) {
    nm_llm_brick_stats z = {0};
    return b ? b->st : z;
}

static const char *kind_name(uint32_t k) {
    static const char *names[] = {"bytes", "tokens", "embeddings f32", "embeddings f16", "pcm s16", "pcm f32"};
    return k < sizeof names / sizeof names[0] ? names[k] : "unknown";
}

// Checks an input slot against the model and the context; on success *n is
// its token/row count and *start its first position. NM_ERR_FORMAT (bad
// slot) or NM_ERR_RANGE (does not fit) with the reason in b->err.
static nm_status check_input(nm_llm_brick *b, const nm_tabm_slot *s, int32_t *n, int32_t *start) {
    const nm_tabm_meta *mt = s->meta;
    const unsigned long long seq = (unsigned long long)mt->seq;
    int64_t rows;
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
static nm_status decode_slot(nm_llm_brick *b, const nm_tabm_slot *s, int32_t n, int32_t p0, bool last) {
    double t0 = now_s();
    nm_status st = NM_OK;
    int32_t k = 0;
    // Positions skipped over (a slot placed past what is cached) hold unknown entries.
    for (int32_t i = b->n_cached; i < p0; i++) b->cached[i] = -1;
    if (b->n_cached < p0) b->n_cached = p0;
    if (s->meta->kind == NM_TABM_TOKENS) {
        const int32_t *t = s->data; // the slot's payload, read in place
        // Prefix reuse: positions the cache already holds with the same tokens.
        while (k < n && p0 + k < b->n_cached && b->cached[p0 + k] == t[k]) k++;
        if (k == n && last) k--; // the last position is decoded again for its logits
        for (int32_t i = k; i < n && st == NM_OK; i += b->n_batch) {
            int32_t nb = n - i < b->n_batch ? n - i : b->n_batch;
            st = nm_decode(b->c, t + i, nb, p0 + i, false);
            if (st != NM_OK) break;
            for (int32_t j = 0; j < nb; j++) {
                b->cached[p0 + i + j] = t[i + j];
                nm_sampler_accept(b->s, t[i + j]);
            }
            b->n_cached = p0 + i + nb;
        }
    } else {
        const float *x = s->data; // (n, n_embd), read in place
        for (int32_t i = 0; i < n && st == NM_OK; i += b->n_batch) {
            int32_t nb = n - i < b->n_batch ? n - i : b->n_batch;
            st = nm_decode_embd(b->c, x + (size_t)i * (size_t)b->n_embd, nb, p0 + i, false);
            if (st != NM_OK) break;
            for (int32_t j = 0; j < nb; j++) b->cached[p0 + i + j] = -1;
            b->n_cached = p0 + i + nb;
        }
    }
    if (st != NM_OK) {
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
static nm_status put_out(nm_llm_brick *b, nm_tabm *out, nm_tabm_slot *o, int32_t n, uint64_t user) {
    nm_tabm_meta *mt = o->meta;
    mt->kind = NM_TABM_TOKENS;
    mt->ndim = n > 0 ? 1 : 0;
    mt->shape[0] = n;
    mt->size = sizeof(int32_t) * (uint64_t)n;
    mt->user = user;
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
static nm_status take_out(nm_llm_brick *b, nm_tabm *in, nm_tabm *out, nm_tabm_slot *o) {
    nm_status st = nm_tabm_acquire_write(out, b->p.producer, b->p.timeout_ns, o);
    if (st == NM_ERR_SHUTDOWN) {
        nm_tabm_shutdown(in);
        return fail(b, st, "llm brick: the output ring was shut down");
    }
    if (st != NM_OK) return fail(b, st, "llm brick: waiting for an output slot: %s", nm_status_str(st));
    return NM_OK;
}

static uint64_t end_user(nm_llm_stop why) { return NM_LLM_OUT_END | ((uint64_t)why << 8); }

// Samples and decodes up to n_predict tokens after the prompt, writing them
// to `out`; ends with the END slot.
static nm_status generate(nm_llm_brick *b, nm_tabm *in, nm_tabm *out) {
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
        const float *logits = nm_get_logits(b->c, -1);
        if (b->p.ignore_eos) { // as llama.cpp's logit bias of -inf on every end-of-generation token
            memcpy(b->masked, logits, sizeof(float) * (size_t)b->n_vocab);
            for (int32_t e = 0; e < b->n_eog; e++) b->masked[b->eog[e]] = -INFINITY;
            logits = b->masked;
        }
        int32_t tok = nm_sampler_sample(b->s, logits);
        if (nm_token_is_eog(b->m, tok)) {
            why = NM_LLM_STOP_EOG;
            break;
        }
        nm_sampler_accept(b->s, tok);
        // The token goes out before it is decoded, so the consumer works on it
        // (prints it) while the next step runs.
        if (!held) {
            if ((st = take_out(b, in, out, &o)) != NM_OK) goto out;
            held = true;
        }
        ((int32_t *)o.data)[n_held++] = tok;
        if (n_held == b->p.out_batch) {
            held = false;
            st = put_out(b, out, &o, n_held, 0);
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
static nm_status end_dropped(nm_llm_brick *b, nm_tabm *in, nm_tabm *out, nm_llm_stop why) {
    nm_tabm_slot o;
    nm_status st = take_out(b, in, out, &o);
    if (st != NM_OK) return st;
    b->st.n_prompts++;
    if ((st = put_out(b, out, &o, 0, end_user(why))) != NM_OK) b->st.n_prompts--;
    return st;
}

nm_status nm_llm_brick_step(nm_llm_brick *b, nm_tabm *in, nm_tabm *out) {
    if (!b || !in || !out) return NM_ERR_INVALID_ARG;
    if (sizeof(int32_t) * (size_t)b->p.out_batch > nm_tabm_max_payload(out))
        return fail(b, NM_ERR_INVALID_ARG, "llm brick: output slots of %zu bytes cannot hold %d tokens",
                    nm_tabm_max_payload(out), b->p.out_batch);
    const int32_t prompt_pos = b->pos;
    nm_llm_stop dropped = NM_LLM_STOP_NONE; // set once a slot of this prompt failed: skip the rest
    for (;;) {
        nm_tabm_slot s;
        nm_status st = nm_tabm_acquire_read(in, b->p.timeout_ns, &s);
        if (st == NM_ERR_SHUTDOWN) {
            nm_tabm_shutdown(out);
            return fail(b, st, "llm brick: the input ring was shut down");
        }
        if (st != NM_OK) return fail(b, st, "llm brick: waiting for an input slot: %s", nm_status_str(st));
        b->st.n_in_slots++;
        const bool last = !(s.meta->user & NM_LLM_IN_MORE);
        if (dropped == NM_LLM_STOP_NONE) {
            int32_t n = 0, p0 = 0;
            st = check_input(b, &s, &n, &p0);
            if (st == NM_OK) {
                if ((st = decode_slot(b, &s, n, p0, last)) != NM_OK) dropped = NM_LLM_STOP_ERROR;
            } else {
                dropped = NM_LLM_STOP_BAD_INPUT;
                b->st.n_bad_slots++;
            }
            if (dropped != NM_LLM_STOP_NONE) b->pos = prompt_pos; // the dropped prompt leaves no position behind
        }
        nm_tabm_release(in, &s); // decoded: the payload is no longer read
        if (last) break;
    }
    if (dropped != NM_LLM_STOP_NONE) return end_dropped(b, in, out, dropped);
    return generate(b, in, out);
}

nm_status nm_llm_brick_run(nm_llm_brick *b, nm_tabm *in, nm_tabm *out) {
    nm_status st;
    while ((st = nm_llm_brick_step(b, in, out)) == NM_OK) {
    }
    return st;
}
