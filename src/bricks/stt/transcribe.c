// Whisper decoding policy (transcribe.h): whisper.cpp's whisper_full, step
// for step, over our forward pass. The comments name the whisper.cpp
// behaviour each piece reproduces; where that behaviour is odd (beam search
// drawing its candidates at random, a failed window keeping an earlier
// decoder's tokens), it is reproduced on purpose: the goal is the same text.
#include "bricks/stt/transcribe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bricks/stt/mel.h"
#include "bricks/stt/stdrand.h"
#include "core/clock.h"
#include "core/fail.h"

#define CHUNK_SECONDS 30
#define DELTA_MIN 10               // frames: windows shorter than 100 ms are not decoded
#define HISTORY_TEMP_CUTOFF 0.5f   // no previous-text prompt at temperatures from here
#define N_LANG_TOKENS 100          // whisper.cpp suppresses sot+1 .. sot+100 (its language table)

// ---- state ---------------------------------------------------------------------------

typedef struct sequence {
    nm_stt_token *tok; // (cap)
    int32_t n;
    int32_t result_len;
    double sum_logprobs_all, sum_logprobs, avg_logprobs, entropy, score;
} sequence;

typedef struct decoder {
    sequence seq;
    int32_t seek_delta;
    bool failed, completed, has_ts;
    int32_t phys; // the forward pass's sequence holding this decoder's cache
    float *logits, *logprobs, *probs; // (n_vocab)
    nm_mt19937 rng;
} decoder;

typedef struct candidate {
    int32_t decoder_idx, seek_delta;
    bool has_ts;
    sequence seq;
} candidate;

struct nm_transcriber {
    const nm_whisper_model *m;
    nm_whisper *w;
    nm_mel *mel;
    int32_t n_vocab, n_text_ctx, max_dec, n_phys;
    int32_t tok_space;              // id of " "
    int32_t *nst;                   // whisper.cpp's non-speech token ids
    int32_t n_nst;
    decoder dec[NM_STT_MAX_DECODERS];
    candidate *cand;                // (max_dec * max_dec)
    int32_t *cand_order;
    int32_t n_cand;
    double *cp;                     // (n_vocab) discrete_distribution table
    float *raw_lp, *raw_p;          // (n_vocab) no-speech probability scratch
    int32_t *prompt, *past0, *past1, *tmp;  // (2 * n_text_ctx)
    int32_t n_prompt, n_past0, n_past1;   // past0: the carried initial prompt
    // Token-level timestamps (one call): the signal's energy, whisper.cpp's state.
    float *energy;
    int32_t n_energy;
    int64_t t_beg, t_last;
    int32_t tid_last;
    nm_stt_timings tm;
    char err[256];
};



nm_stt_params nm_stt_default_params(nm_stt_strategy strategy) {
    nm_stt_params p = {
        .strategy = strategy,
        .best_of = strategy == NM_STT_GREEDY ? 5 : -1,
        .beam_size = strategy == NM_STT_BEAM ? 5 : -1,
        .patience = -1.0f,
        .language = "en",
        .no_context = true,
        .n_max_text_ctx = 16384,
        .suppress_blank = true,
        .temperature = 0.0f,
        .temperature_inc = 0.2f,
        .entropy_thold = 2.4f,
        .logprob_thold = -1.0f,
        .no_speech_thold = 0.6f,
        .max_initial_ts = 1.0f,
        .length_penalty = -1.0f,
        .thold_pt = 0.01f,
        .thold_ptsum = 0.01f,
    };
    return p;
}

// whisper.cpp's non_speech_tokens (tokens matched exactly, and with a leading space).
static const char *const k_non_speech[] = {
    "\"", "#", "(", ")", "*", "+", "/", ":", ";", "<", "=", ">", "@", "[", "\\", "]", "^",
    "_", "`", "{", "|", "}", "~", "\xe3\x80\x8c", "\xe3\x80\x8d", "\xe3\x80\x8e", "\xe3\x80\x8f",
    "<<", ">>", "<<<", ">>>", "--", "---", "-(", "-[", "('", "(\"", "((", "))", "(((", ")))",
    "[[", "]]", "{{", "}}", "\xe2\x99\xaa\xe2\x99\xaa", "\xe2\x99\xaa\xe2\x99\xaa\xe2\x99\xaa",
    "\xe2\x99\xa9", "\xe2\x99\xaa", "\xe2\x99\xab", "\xe2\x99\xac", "\xe2\x99\xad", "\xe2\x99\xae",
    "\xe2\x99\xaf",
};

// Token id of `s` as whisper.cpp's token_to_id map finds it (the last token
// with those bytes), or -1. Setup only.
static int32_t find_token_last(const nm_whisper_model *m, const char *s) {
    size_t n = strlen(s);
    for (int32_t id = m->hp.n_vocab - 1; id >= 0; id--) {
        uint32_t len;
        const char *t = nm_whisper_token(m, id, &len);
        if (t && len == n && !memcmp(t, s, n)) return id;
    }
    return -1;
}

static bool seq_alloc(sequence *s, int32_t cap) {
    s->tok = calloc((size_t)cap, sizeof *s->tok);
    return s->tok != NULL;
}

static void seq_copy(sequence *dst, const sequence *src) {
    memcpy(dst->tok, src->tok, (size_t)src->n * sizeof *src->tok);
    dst->n = src->n;
    dst->result_len = src->result_len;
    dst->sum_logprobs_all = src->sum_logprobs_all;
    dst->sum_logprobs = src->sum_logprobs;
    dst->avg_logprobs = src->avg_logprobs;
    dst->entropy = src->entropy;
    dst->score = src->score;
}

nm_status nm_transcriber_create(const nm_whisper_model *m, int32_t n_threads, int32_t max_decoders,
                                nm_transcriber **out, char *err, size_t err_size) {
    if (out) *out = NULL;
    if (!m || !out) {
        nm_fail(NM_OK, err, err_size, "transcriber: NULL model or output");
        return NM_ERR_INVALID_ARG;
    }
    if (max_decoders <= 0) max_decoders = 5;
    if (max_decoders > NM_STT_MAX_DECODERS) {
        nm_fail(NM_OK, err, err_size, "transcriber: %d decoders requested, at most %d", max_decoders, NM_STT_MAX_DECODERS);
        return NM_ERR_INVALID_ARG;
    }
    nm_transcriber *t = calloc(1, sizeof *t);
    if (!t) {
        nm_fail(NM_OK, err, err_size, "transcriber: out of memory");
        return NM_ERR_NOMEM;
    }
    t->m = m;
    t->n_vocab = m->hp.n_vocab;
    t->n_text_ctx = m->hp.n_text_ctx;
    t->max_dec = max_decoders;
    // Beam search moves caches between hypotheses: twice the sequences lets
    // every move share a source's rows into a free sequence (beam_reassign).
    t->n_phys = max_decoders > 1 ? 2 * max_decoders : 1;
    nm_status st = nm_whisper_create(m, n_threads, t->n_phys, 0, &t->w, err, err_size);
    if (st != NM_OK) {
        free(t);
        return st;
    }
    st = nm_mel_create(m->hp.n_mels, m->mel_filters, &t->mel);
    if (st != NM_OK) {
        nm_fail(NM_OK, err, err_size, "transcriber: cannot set up the mel spectrogram (%s)", nm_status_str(st));
        nm_transcriber_free(t);
        return st;
    }
    const int32_t nv = t->n_vocab, cap = t->n_text_ctx;
    bool ok = true;
    for (int32_t j = 0; j < max_decoders && ok; j++) {
        decoder *d = &t->dec[j];
        d->logits = malloc(sizeof(float) * (size_t)nv);
        d->logprobs = malloc(sizeof(float) * (size_t)nv);
        d->probs = malloc(sizeof(float) * (size_t)nv);
        ok = d->logits && d->logprobs && d->probs && seq_alloc(&d->seq, cap);
    }
    t->cand = calloc((size_t)max_decoders * max_decoders, sizeof *t->cand);
    t->cand_order = calloc((size_t)max_decoders * max_decoders, sizeof *t->cand_order);
    ok = ok && t->cand && t->cand_order;
    for (int32_t c = 0; ok && c < max_decoders * max_decoders; c++) ok = seq_alloc(&t->cand[c].seq, cap);
    t->cp = malloc(sizeof(double) * (size_t)nv);
    t->raw_lp = malloc(sizeof(float) * (size_t)nv);
    t->raw_p = malloc(sizeof(float) * (size_t)nv);
    t->prompt = malloc(sizeof(int32_t) * 2 * (size_t)cap);
    t->past0 = malloc(sizeof(int32_t) * 2 * (size_t)cap);
    t->past1 = malloc(sizeof(int32_t) * 2 * (size_t)cap);
    t->tmp = malloc(sizeof(int32_t) * 2 * (size_t)cap);
    t->nst = malloc(sizeof(int32_t) * 2 * (sizeof k_non_speech / sizeof *k_non_speech) + 2 * sizeof(int32_t));
    if (!ok || !t->cp || !t->raw_lp || !t->raw_p || !t->prompt || !t->past0 || !t->past1 || !t->tmp || !t->nst) {
        nm_fail(NM_OK, err, err_size, "transcriber: out of memory");
        nm_transcriber_free(t);
        return NM_ERR_NOMEM;
    }
    t->tok_space = find_token_last(m, " ");
    char buf[16];
    for (size_t i = 0; i < sizeof k_non_speech / sizeof *k_non_speech; i++) {
        int32_t id = find_token_last(m, k_non_speech[i]);
        if (id >= 0) t->nst[t->n_nst++] = id;
        snprintf(buf, sizeof buf, " %s", k_non_speech[i]);
        if ((id = find_token_last(m, buf)) >= 0) t->nst[t->n_nst++] = id;
    }
    int32_t id;
    if ((id = find_token_last(m, " -")) >= 0) t->nst[t->n_nst++] = id;
    if ((id = find_token_last(m, " '")) >= 0) t->nst[t->n_nst++] = id;
    *out = t;
    return NM_OK;
}

void nm_transcriber_free(nm_transcriber *t) {
    if (!t) return;
    for (int32_t j = 0; j < NM_STT_MAX_DECODERS; j++) {
        free(t->dec[j].logits);
        free(t->dec[j].logprobs);
        free(t->dec[j].probs);
        free(t->dec[j].seq.tok);
    }
    if (t->cand)
        for (int32_t c = 0; c < t->max_dec * t->max_dec; c++) free(t->cand[c].seq.tok);
    free(t->cand);
    free(t->cand_order);
    free(t->cp);
    free(t->raw_lp);
    free(t->raw_p);
    free(t->prompt);
    free(t->past0);
    free(t->past1);
    free(t->tmp);
    free(t->nst);
    nm_mel_free(t->mel);
    nm_whisper_free(t->w);
    free(t);
}

nm_stt_timings nm_transcriber_timings(const nm_transcriber *t) {
    nm_stt_timings z = {0};
    return t ? t->tm : z;
}

int32_t nm_stt_lang_id(const nm_whisper_model *m, const char *code) {
    if (!m || !code || !m->lang_codes) return -1;
    for (int32_t i = 0; i < m->special.n_langs; i++)
        if (m->lang_codes[i] && !strcmp(m->lang_codes[i], code)) return i;
    return -1;
}

void nm_transcript_free(nm_transcript *t) {
    if (!t) return;
    for (int32_t i = 0; i < t->n_seg; i++) {
        free(t->seg[i].text);
        free(t->seg[i].tokens);
    }
    free(t->seg);
    memset(t, 0, sizeof *t);
}

// ---- logits -> probabilities (whisper_process_logits) ---------------------------------

static void log_softmax(const float *logits, int32_t n, float *logprobs) {
    float mx = -INFINITY;
    for (int32_t i = 0; i < n; i++) mx = logits[i] > mx ? logits[i] : mx;
    float sum = 0.0f;
    for (int32_t i = 0; i < n; i++)
        if (logits[i] > -INFINITY) sum += expf(logits[i] - mx);
    sum = logf(sum) + mx;
    for (int32_t i = 0; i < n; i++) logprobs[i] = logits[i] > -INFINITY ? logits[i] - sum : -INFINITY;
}

static void probs_of(const float *logits, const float *logprobs, int32_t n, float *probs) {
    for (int32_t i = 0; i < n; i++) probs[i] = logits[i] == -INFINITY ? 0.0f : expf(logprobs[i]);
}

static void process_logits(nm_transcriber *t, decoder *d, const float *raw, const nm_stt_params *p, float temp) {
    const nm_whisper_special *sp = &t->m->special;
    const int32_t nv = t->n_vocab, beg = sp->timestamp_begin;
    const nm_stt_token *cur = d->seq.tok;
    const int32_t n_cur = d->seq.n;
    const bool is_initial = n_cur == 0;
    float *logits = d->logits, *logprobs = d->logprobs;

    memcpy(logits, raw, sizeof(float) * (size_t)nv);
    if (temp > 0.0f)
        for (int32_t i = 0; i < nv; i++) logits[i] /= temp;

    if (p->suppress_blank && is_initial) {
        logits[sp->eot] = -INFINITY;
        if (t->tok_space >= 0) logits[t->tok_space] = -INFINITY;
    }
    logits[sp->notimestamps] = -INFINITY;
    if (p->no_timestamps)
        for (int32_t i = beg; i < nv; i++) logits[i] = -INFINITY;
    if (!p->no_timestamps && !p->single_segment && p->max_tokens > 0 && n_cur >= p->max_tokens)
        for (int32_t i = 0; i < sp->eot; i++) logits[i] = -INFINITY;
    logits[sp->sot] = -INFINITY;
    logits[sp->nospeech] = -INFINITY;
    logits[sp->solm] = -INFINITY;
    logits[sp->translate] = -INFINITY;
    logits[sp->transcribe] = -INFINITY;
    logits[sp->prev] = -INFINITY;
    for (int32_t i = 0; i < N_LANG_TOKENS; i++)
        if (sp->sot + 1 + i < nv) logits[sp->sot + 1 + i] = -INFINITY;
    if (p->suppress_nst)
        for (int32_t i = 0; i < t->n_nst; i++) logits[t->nst[i]] = -INFINITY;

    // Timestamps come in pairs, except right before the end.
    const bool last_ts = n_cur > 0 && cur[n_cur - 1].id >= beg;
    const bool penult_ts = n_cur < 2 || cur[n_cur - 2].id >= beg;
    if (last_ts) {
        if (penult_ts)
            for (int32_t i = beg; i < nv; i++) logits[i] = -INFINITY;
        else
            for (int32_t i = 0; i < sp->eot; i++) logits[i] = -INFINITY;
    }
    // The first timestamp is at most max_initial_ts.
    if (is_initial && p->max_initial_ts > 0.0f) {
        const float precision = (float)CHUNK_SECONDS / (float)t->m->hp.n_audio_ctx;
        const int32_t tid0 = (int32_t)roundf(p->max_initial_ts / precision);
        for (int32_t i = beg + tid0 + 1; i < nv; i++) logits[i] = -INFINITY;
    }
    // Timestamps do not go back.
    if (d->has_ts) {
        const int32_t tid0 = d->seek_delta / 2;
        for (int32_t i = beg; i < beg + tid0 && i < nv; i++) logits[i] = -INFINITY;
    }

    log_softmax(logits, nv, logprobs);

    // When the timestamps together are likelier than any text token, a timestamp it is.
    float ts_lp = -INFINITY, lp_max = -INFINITY, text_max = -INFINITY;
    for (int32_t i = beg; i < nv; i++) lp_max = logprobs[i] > lp_max ? logprobs[i] : lp_max;
    float sum = 0.0f;
    for (int32_t i = beg; i < nv; i++)
        if (logprobs[i] > -INFINITY) sum += expf(logprobs[i] - lp_max);
    if (sum > 0.0f) ts_lp = logf(sum) + lp_max;
    for (int32_t i = 0; i < beg; i++) text_max = logprobs[i] > text_max ? logprobs[i] : text_max;
    if (ts_lp > text_max)
        for (int32_t i = 0; i < beg; i++) logits[i] = logprobs[i] = -INFINITY;

    probs_of(logits, logprobs, nv, d->probs);
}

// Timestamp summary of a step: the likeliest timestamp and its share.
static void ts_summary(const nm_transcriber *t, const float *probs, int32_t tid_init, nm_stt_token *r) {
    double sum_ts = 0.0, max_ts = 0.0;
    r->tid = tid_init;
    for (int32_t i = t->m->special.timestamp_begin; i < t->n_vocab; i++) {
        sum_ts += probs[i];
        if (max_ts < probs[i]) {
            max_ts = probs[i];
            r->tid = i;
        }
    }
    r->pt = (float)(max_ts / (sum_ts + 1e-10));
    r->ptsum = (float)sum_ts;
}

static nm_stt_token sample_token(nm_transcriber *t, decoder *d, bool best) {
    nm_stt_token r = {0};
    ts_summary(t, d->probs, 0, &r);
    if (best) {
        for (int32_t i = 0; i < t->n_vocab; i++)
            if (r.p < d->probs[i]) {
                r.id = i;
                r.p = d->probs[i];
                r.plog = d->logprobs[i];
            }
    } else {
        nm_discrete_build(d->probs, t->n_vocab, t->cp);
        r.id = nm_discrete_draw(t->cp, t->n_vocab, &d->rng);
        r.p = d->probs[r.id];
        r.plog = d->logprobs[r.id];
    }
    if (r.id >= t->m->special.timestamp_begin) {
        r.tid = r.id;
        r.pt = r.p;
    }
    return r;
}

// whisper_sample_token_topk: k draws from the distribution (with replacement).
static void sample_topk(nm_transcriber *t, decoder *d, int32_t j, int32_t k) {
    nm_stt_token base = {0};
    ts_summary(t, d->probs, t->m->special.timestamp_begin, &base);
    nm_discrete_build(d->probs, t->n_vocab, t->cp);
    for (int32_t c = 0; c < k; c++) {
        nm_stt_token r = base;
        r.id = nm_discrete_draw(t->cp, t->n_vocab, &d->rng);
        r.p = d->probs[r.id];
        r.plog = d->logprobs[r.id];
        if (r.id >= t->m->special.timestamp_begin) {
            r.tid = r.id;
            r.pt = r.p;
        }
        candidate *cd = &t->cand[t->n_cand++];
        cd->decoder_idx = j;
        cd->seek_delta = d->seek_delta;
        cd->has_ts = d->has_ts;
        seq_copy(&cd->seq, &d->seq);
        cd->seq.tok[cd->seq.n++] = r;
        cd->seq.sum_logprobs_all += r.plog;
    }
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

// whisper_sequence_score: sum / length (or a length penalty), and the entropy
// of the last 32 tokens (repetition detector).
static void sequence_score(nm_transcriber *t, const nm_stt_params *p, sequence *s) {
    if (s->result_len == 0) return;
    double sum = 0.0;
    for (int32_t i = 0; i < s->result_len; i++) sum += s->tok[i].plog;
    s->sum_logprobs = sum;
    s->avg_logprobs = sum / s->result_len;
    double penalty = s->result_len;
    if (p->length_penalty > 0.0f) penalty = pow((5.0 + penalty) / 6.0, p->length_penalty);
    s->score = sum / penalty;

    int32_t i0 = s->result_len > 32 ? s->result_len - 32 : 0, cnt = s->result_len - i0;
    for (int32_t i = 0; i < cnt; i++) t->tmp[i] = s->tok[i0 + i].id;
    qsort(t->tmp, (size_t)cnt, sizeof *t->tmp, cmp_i32); // std::map order
    double entropy = 0.0;
    for (int32_t i = 0; i < cnt;) {
        int32_t j = i;
        while (j < cnt && t->tmp[j] == t->tmp[i]) j++;
        double q = (j - i) / (double)cnt;
        entropy -= q * log(q);
        i = j;
    }
    s->entropy = entropy;
}

// Candidate a before b: higher summed log-probability, then lower decoder index.
static bool cand_before(const candidate *a, const candidate *b) {
    if (a->seq.sum_logprobs_all != b->seq.sum_logprobs_all) return a->seq.sum_logprobs_all > b->seq.sum_logprobs_all;
    return a->decoder_idx < b->decoder_idx;
}

// Insertion sort of the candidate order (at most 64 entries).
static void sort_candidates(nm_transcriber *t) {
    for (int32_t c = 0; c < t->n_cand; c++) {
        int32_t v = c, k = c;
        while (k > 0 && cand_before(&t->cand[v], &t->cand[t->cand_order[k - 1]])) {
            t->cand_order[k] = t->cand_order[k - 1];
            k--;
        }
        t->cand_order[k] = v;
    }
}

static bool seq_equal(const sequence *a, const sequence *b) {
    if (a->n != b->n) return false;
    for (int32_t i = a->n - 1; i >= 0; i--)
        if (a->tok[i].id != b->tok[i].id) return false;
    return true;
}

// ---- transcript ----------------------------------------------------------------------

static nm_status add_segment(nm_transcriber *t, nm_transcript *tr, int64_t t0, int64_t t1, const char *text,
                             size_t text_len, const nm_stt_token *tok, int32_t n_tok, const sequence *s,
                             float no_speech, float temp) {
    (void)t;
    if (tr->n_seg == tr->cap_seg) {
        int32_t cap = tr->cap_seg ? 2 * tr->cap_seg : 16;
        nm_stt_segment *ns = realloc(tr->seg, sizeof *ns * (size_t)cap);
        if (!ns) return NM_ERR_NOMEM;
        tr->seg = ns;
        tr->cap_seg = cap;
    }
    nm_stt_segment *sg = &tr->seg[tr->n_seg];
    memset(sg, 0, sizeof *sg);
    sg->text = malloc(text_len + 1);
    sg->tokens = malloc(sizeof *tok * (size_t)(n_tok > 0 ? n_tok : 1));
    if (!sg->text || !sg->tokens) {
        free(sg->text);
        free(sg->tokens);
        return NM_ERR_NOMEM;
    }
    memcpy(sg->text, text, text_len);
    sg->text[text_len] = '\0';
    if (n_tok > 0) memcpy(sg->tokens, tok, sizeof *tok * (size_t)n_tok);
    for (int32_t i = 0; i < n_tok; i++) sg->tokens[i].t0 = sg->tokens[i].t1 = -1, sg->tokens[i].vlen = 0.0f;
    sg->n_tokens = n_tok;
    sg->t0 = t0;
    sg->t1 = t1;
    sg->avg_logprob = (float)s->avg_logprobs;
    sg->no_speech_prob = no_speech;
    sg->temperature = temp;
    tr->n_seg++;
    return NM_OK;
}

// Appends the bytes of token id to buf (cap bytes, *len used).
static void text_append(const nm_whisper_model *m, int32_t id, char *buf, size_t cap, size_t *len) {
    uint32_t n;
    const char *s = nm_whisper_token(m, id, &n);
    if (!s) return;
    if (*len + n >= cap) n = (uint32_t)(cap - 1 - *len);
    memcpy(buf + *len, s, n);
    *len += n;
}

// The segments of a window (whisper.cpp: the "output results" block).
// ---- token-level timestamps and segment wrapping (whisper.cpp's, to the rounding) ------------
//
// whisper.cpp's whisper_exp_compute_token_level_timestamps and
// whisper_wrap_segment, arithmetic for arithmetic (float and double where it
// has them), so -ml output is the same. Two of its quirks are kept on
// purpose: the energy window of a token is looked up with the token's time
// relative to its segment while the energy covers the whole recording, and a
// split before a segment's first text token leaves an empty segment.

// Mean |x| over the 65 samples centred on each sample (whisper.cpp's
// get_signal_energy with a half window of 32).
static void signal_energy(const float *x, int32_t n, float *e) {
    const int32_t hw = 32;
    for (int32_t i = 0; i < n; i++) {
        float sum = 0.0f;
        for (int32_t j = -hw; j <= hw; j++)
            if (i + j >= 0 && i + j < n) sum += fabsf(x[i + j]);
        e[i] = sum / (float)(2 * hw + 1);
    }
}

// whisper.cpp's voice_length: per code point, 0.01 for a blank, 2 for a comma
// or pause mark, 3 for a full stop, question, exclamation mark or digit, 1
// otherwise (full-width forms weigh as their ASCII ones).
static float voice_length(const char *s, uint32_t n) {
    const uint8_t *u = (const uint8_t *)s;
    float res = 0.0f;
    for (uint32_t i = 0; i < n;) {
        const uint8_t c = u[i];
        uint32_t cp = c, len = 1;
        if (c >= 0x80) {
            if ((c >> 5) == 0x6) cp = c & 0x1F, len = 2;
            else if ((c >> 4) == 0xE) cp = c & 0x0F, len = 3;
            else if ((c >> 3) == 0x1E) cp = c & 0x07, len = 4;
            if (len > 1) {
                bool ok = i + len <= n;
                for (uint32_t k = 1; ok && k < len; k++) {
                    if ((u[i + k] & 0xC0) != 0x80) ok = false;
                    else cp = (cp << 6) | (u[i + k] & 0x3F);
                }
                if (!ok) cp = c, len = 1;
            }
        }
        i += len;
        switch (cp) {
        case ' ': case 0x3000: res += 0.01f; break;
        case ',': case 0xFF0C: case 0x3001: case 0xFF1B: case 0xFF1A: res += 2.00f; break;
        case '.': case '!': case '?': case 0x3002: case 0xFF0E: case 0xFF01: case 0xFF1F: case 0x2026: res += 3.00f; break;
        default: res += (cp >= '0' && cp <= '9') || (cp >= 0xFF10 && cp <= 0xFF19) ? 3.00f : 1.00f; break;
        }
    }
    return res;
}

static int32_t ts_to_sample(int64_t ts, int64_t seg_t0, int32_t n) {
    const int32_t s = (int32_t)(((ts - seg_t0) * NM_MEL_SAMPLE_RATE) / 100);
    return s < 0 ? 0 : s > n - 1 ? n - 1 : s;
}

static int64_t sample_to_ts(int32_t i, int64_t seg_t0) { return (100ll * i) / NM_MEL_SAMPLE_RATE + seg_t0; }

static void token_timestamps(nm_transcriber *t, nm_stt_segment *sg, const nm_stt_params *p) {
    const nm_whisper_special *sp = &t->m->special;
    const int32_t beg = sp->timestamp_begin, n_samples = t->n_energy, n = sg->n_tokens;
    nm_stt_token *tk = sg->tokens;
    const float *energy = t->energy;
    if (n_samples == 0 || n == 0) return;
    const int64_t t0 = sg->t0, t1 = sg->t1;
    if (n == 1) {
        tk[0].t0 = t0;
        tk[0].t1 = t1;
        return;
    }
    for (int32_t j = 0; j < n; j++) {
        if (j == 0) {
            if (tk[0].id == beg) {
                tk[0].t0 = tk[0].t1 = tk[1].t0 = t0;
                t->t_beg = t->t_last = t0;
                t->tid_last = beg;
            } else {
                tk[0].t0 = t->t_last;
            }
        }
        const int64_t tt = t->t_beg + 2 * (int64_t)(tk[j].tid - beg);
        char name[24];
        uint32_t len;
        const char *txt = nm_whisper_token_text_cpp(t->m, tk[j].id, name, &len); // "[_TT_7]" weighs too
        tk[j].vlen = txt ? voice_length(txt, len) : 0.0f;
        if (tk[j].pt > p->thold_pt && tk[j].ptsum > p->thold_ptsum && tk[j].tid > t->tid_last && tt <= t1) {
            if (j > 0) tk[j - 1].t1 = tt;
            tk[j].t0 = tt;
            t->tid_last = tk[j].tid;
        }
    }
    tk[n - 2].t1 = t1;
    tk[n - 1].t0 = t1;
    tk[n - 1].t1 = t1;
    t->t_last = t1;
    // Runs of tokens without an end time share their span by voice length.
    for (int32_t p0 = 0, p1 = 0;;) {
        while (p1 < n && tk[p1].t1 < 0) p1++;
        if (p1 >= n) p1--;
        if (p1 > p0) {
            double psum = 0.0;
            for (int32_t j = p0; j <= p1; j++) psum += tk[j].vlen;
            const double dt = (double)(tk[p1].t1 - tk[p0].t0);
            for (int32_t j = p0 + 1; j <= p1; j++) {
                const double ct = (double)tk[j - 1].t0 + dt * tk[j - 1].vlen / psum;
                tk[j - 1].t1 = (int64_t)ct;
                tk[j].t0 = (int64_t)ct;
            }
        }
        p1++;
        p0 = p1;
        if (p1 >= n) break;
    }
    for (int32_t j = 0; j < n - 1; j++) {
        if (tk[j].t1 < 0) tk[j + 1].t0 = tk[j].t1;
        if (j > 0 && tk[j - 1].t1 > tk[j].t0) {
            tk[j].t0 = tk[j - 1].t1;
            if (tk[j].t1 < tk[j].t0) tk[j].t1 = tk[j].t0;
        }
    }
    // Each text token's edges moved to where the energy crosses half its local mean.
    const int32_t hw = NM_MEL_SAMPLE_RATE / 8;
    for (int32_t j = 0; j < n; j++) {
        if (tk[j].id >= sp->eot) continue;
        int32_t s0 = ts_to_sample(tk[j].t0, sg->t0, n_samples), s1 = ts_to_sample(tk[j].t1, sg->t0, n_samples);
        const int32_t ss0 = s0 - hw > 0 ? s0 - hw : 0, ss1 = s1 + hw < n_samples ? s1 + hw : n_samples;
        const int32_t ns = ss1 - ss0;
        float sum = 0.0f;
        for (int32_t k = ss0; k < ss1; k++) sum += energy[k];
        const float thold = (float)(0.5 * sum / ns);
        int32_t k = s0;
        if (energy[k] > thold && j > 0) {
            while (k > 0 && energy[k] > thold) k--;
            tk[j].t0 = sample_to_ts(k, sg->t0);
            if (tk[j].t0 < tk[j - 1].t1) tk[j].t0 = tk[j - 1].t1;
            else s0 = k;
        } else {
            while (energy[k] < thold && k < s1) k++;
            s0 = k;
            tk[j].t0 = sample_to_ts(k, sg->t0);
        }
        k = s1;
        if (energy[k] > thold) {
            while (k < n_samples - 1 && energy[k] > thold) k++;
            tk[j].t1 = sample_to_ts(k, sg->t0);
            if (j < n - 1 && tk[j].t1 > tk[j + 1].t0) tk[j].t1 = tk[j + 1].t0;
            else s1 = k;
        } else {
            while (energy[k] < thold && k > s0) k--;
            s1 = k;
            tk[j].t1 = sample_to_ts(k, sg->t0);
        }
    }
}

static int32_t utf8_chars(const char *s, uint32_t n) {
    int32_t c = 0;
    for (uint32_t i = 0; i < n; i++) c += ((uint8_t)s[i] & 0xC0) != 0x80;
    return c;
}

// Splits the transcript's last segment into pieces of at most max_len
// characters, at token starts (split_on_word: only before a blank), each
// piece starting at its first token's t0.
static nm_status wrap_segment(nm_transcriber *t, nm_transcript *tr, const nm_stt_params *p, char *text, size_t cap) {
    const int32_t eot = t->m->special.eot;
    int32_t acc = 0;
    size_t len = 0;
    for (int32_t i = 0; i < tr->seg[tr->n_seg - 1].n_tokens; i++) {
        nm_stt_segment *sg = &tr->seg[tr->n_seg - 1];
        const nm_stt_token *tk = &sg->tokens[i];
        if (tk->id >= eot) continue;
        uint32_t n;
        const char *txt = nm_whisper_token(t->m, tk->id, &n);
        const int32_t cur = utf8_chars(txt, n);
        if (acc + cur > p->max_len && i > 0 && (!p->split_on_word || (n > 0 && txt[0] == ' '))) {
            // This segment ends before token i; the rest is a new last segment.
            const nm_stt_segment old = *sg;
            sequence s = {.avg_logprobs = old.avg_logprob};
            nm_status st = add_segment(t, tr, tk->t0, old.t1, "", 0, old.tokens + i, old.n_tokens - i, &s,
                                       old.no_speech_prob, old.temperature);
            if (st != NM_OK) return st;
            nm_stt_segment *prev = &tr->seg[tr->n_seg - 2], *next = &tr->seg[tr->n_seg - 1];
            memcpy(next->tokens, old.tokens + i, sizeof *next->tokens * (size_t)(old.n_tokens - i)); // keep t0/t1
            char *nt = realloc(prev->text, len + 1);
            if (!nt) return NM_ERR_NOMEM;
            memcpy(nt, text, len);
            nt[len] = '\0';
            prev->text = nt;
            prev->t1 = next->t0;
            prev->n_tokens = i;
            acc = 0;
            len = 0;
            i = -1;
        } else {
            acc += cur;
            if (len + n < cap) {
                memcpy(text + len, txt, n);
                len += n;
            }
        }
    }
    nm_stt_segment *last = &tr->seg[tr->n_seg - 1];
    char *nt = realloc(last->text, len + 1);
    if (!nt) return NM_ERR_NOMEM;
    memcpy(nt, text, len);
    nt[len] = '\0';
    last->text = nt;
    return NM_OK;
}

// After a segment is added: its token timestamps and the split, as asked.
static nm_status finish_segment(nm_transcriber *t, nm_transcript *tr, const nm_stt_params *p, char *text, size_t cap) {
    if (!p->token_timestamps) return NM_OK;
    token_timestamps(t, &tr->seg[tr->n_seg - 1], p);
    return p->max_len > 0 ? wrap_segment(t, tr, p, text, cap) : NM_OK;
}

static nm_status emit_window(nm_transcriber *t, nm_transcript *tr, const nm_stt_params *p, const decoder *best,
                             int32_t seek, int32_t seek_delta, float no_speech, float temp, char *text, size_t cap) {
    const nm_whisper_special *sp = &t->m->special;
    const int32_t beg = sp->timestamp_begin;
    const nm_stt_token *tok = best->seq.tok;
    const int32_t n = best->seq.n;
    int32_t i0 = 0;
    // Without timestamps whisper.cpp's t0 is computed from a tid of 0 (far
    // negative); it never prints it. We start the segment at the window.
    int64_t t0 = p->no_timestamps ? seek : seek + 2 * (int64_t)(tok[0].tid - beg);
    size_t len = 0;
    nm_status st;
    for (int32_t i = 0; i < n; i++) {
        if (tok[i].id < sp->eot) text_append(t->m, tok[i].id, text, cap, &len);
        if (tok[i].id > beg && !p->single_segment) {
            const int64_t t1 = seek + 2 * (int64_t)(tok[i].tid - beg);
            if (len > 0) {
                if ((st = add_segment(t, tr, t0, t1, text, len, tok + i0, i - i0 + 1, &best->seq, no_speech, temp)) !=
                        NM_OK ||
                    (st = finish_segment(t, tr, p, text, cap)) != NM_OK)
                    return st;
            }
            len = 0;
            t0 = t1;
            while (i + 1 < n && tok[i + 1].id > beg) {
                i++;
                t0 = seek + 2 * (int64_t)(tok[i].tid - beg);
            }
            i0 = i + 1;
        }
    }
    if (len > 0) {
        const int64_t t1 = seek + seek_delta;
        if ((st = add_segment(t, tr, t0, t1, text, len, tok + i0, n - i0, &best->seq, no_speech, temp)) != NM_OK ||
            (st = finish_segment(t, tr, p, text, cap)) != NM_OK)
            return st;
    }
    return NM_OK;
}

// ---- beam search cache moves -----------------------------------------------------------

// After beam selection decoder j continues candidate src[j]'s hypothesis, whose
// cache sits in forward-pass sequence from[j]. The first decoder to take a
// source keeps that sequence as is; the others get a free sequence that shares
// the source's cache rows (nm_whisper_seq_share: no bytes move). Sources and
// inactive decoders' sequences are never written, so the order of the shares
// does not matter.
static nm_status beam_reassign(nm_transcriber *t, int32_t n_dec, const int32_t *from, int32_t n_pos) {
    bool reserved[2 * NM_STT_MAX_DECODERS] = {0}, taken[2 * NM_STT_MAX_DECODERS] = {0};
    for (int32_t j = 0; j < n_dec; j++) {
        const decoder *d = &t->dec[j];
        reserved[(d->completed || d->failed) ? d->phys : from[j]] = true;
    }
    int32_t next_free = 0;
    for (int32_t j = 0; j < n_dec; j++) {
        decoder *d = &t->dec[j];
        if (d->completed || d->failed) continue;
        const int32_t s = from[j];
        if (!taken[s]) {
            taken[s] = true;
            d->phys = s;
            continue;
        }
        while (next_free < t->n_phys && (reserved[next_free] || taken[next_free])) next_free++;
        if (next_free >= t->n_phys) return NM_ERR_RANGE; // cannot happen: n_phys = 2 * max_dec
        taken[next_free] = true;
        d->phys = next_free;
        nm_status st = nm_whisper_seq_share(t->w, d->phys, s, n_pos);
        if (st != NM_OK) return st;
    }
    return NM_OK;
}

// ---- the main loop (whisper_full_with_state) ---------------------------------------------

static nm_status fwd_err(nm_transcriber *t, nm_status st, const char *what, char *err, size_t err_size) {
    nm_fail(NM_OK, err, err_size, "whisper %s: %s (%s)", what, nm_status_str(st), nm_whisper_last_error(t->w));
    return st;
}

static nm_status detect_language(nm_transcriber *t, const float *mel, int64_t n_len, int32_t *lang, float *prob,
                                 char *err, size_t err_size) {
    const nm_whisper_special *sp = &t->m->special;
    nm_status st = nm_whisper_encode(t->w, mel, n_len, 0);
    if (st != NM_OK) return fwd_err(t, st, "encode", err, err_size);
    int32_t sot = sp->sot;
    st = nm_whisper_decode(t->w, 0, &sot, 1, 0, false);
    if (st != NM_OK) return fwd_err(t, st, "decode", err, err_size);
    const float *lg = nm_whisper_logits(t->w, -1);
    int32_t bestl = 0;
    float mx = -INFINITY;
    for (int32_t i = 0; i < sp->n_langs; i++)
        if (lg[sp->lang_begin + i] > mx) {
            mx = lg[sp->lang_begin + i];
            bestl = i;
        }
    double sum = 0.0;
    for (int32_t i = 0; i < sp->n_langs; i++) sum += exp((double)(lg[sp->lang_begin + i] - mx));
    *lang = bestl;
    *prob = (float)(1.0 / sum);
    return NM_OK;
}

static nm_status check_params(const nm_transcriber *t, const nm_stt_params *p, char *err, size_t err_size) {
    if (p->strategy != NM_STT_GREEDY && p->strategy != NM_STT_BEAM) {
        nm_fail(NM_OK, err, err_size, "transcribe: unknown strategy %d", (int)p->strategy);
        return NM_ERR_INVALID_ARG;
    }
    int32_t n_dec = p->strategy == NM_STT_GREEDY ? p->best_of
                                                  : (p->best_of > p->beam_size ? p->best_of : p->beam_size);
    if (n_dec > t->max_dec) {
        nm_fail(NM_OK, err, err_size, "transcribe: best_of / beam_size %d exceeds the %d decoders this transcriber has",
                n_dec, t->max_dec);
        return NM_ERR_INVALID_ARG;
    }
    if (!isfinite(p->temperature) || p->temperature < 0.0f || !isfinite(p->temperature_inc) ||
        p->temperature_inc < 0.0f || p->temperature > 1.0f + 1e-6f) {
        nm_fail(NM_OK, err, err_size, "transcribe: temperature must be in [0, 1] and its increment >= 0");
        return NM_ERR_INVALID_ARG;
    }
    if (p->max_len < 0 || !(p->thold_pt >= 0.0f) || !(p->thold_ptsum >= 0.0f)) {
        nm_fail(NM_OK, err, err_size, "transcribe: max_len and the timestamp thresholds must be >= 0");
        return NM_ERR_INVALID_ARG;
    }
    if (p->offset_ms < 0 || p->duration_ms < 0) {
        nm_fail(NM_OK, err, err_size, "transcribe: negative offset or duration");
        return NM_ERR_INVALID_ARG;
    }
    const char *lang = p->language ? p->language : "en";
    if (strcmp(lang, "auto") && nm_stt_lang_id(t->m, lang) < 0) {
        nm_fail(NM_OK, err, err_size, "transcribe: unknown language '%s' (use a code such as en, de, fr, or auto)", lang);
        return NM_ERR_INVALID_ARG;
    }
    return NM_OK;
}

nm_status nm_transcribe(nm_transcriber *t, const float *pcm, int64_t n, const nm_stt_params *pp,
                        nm_transcript *out, char *err, size_t err_size) {
    if (out) memset(out, 0, sizeof *out);
    if (!t || !pp || !out || (!pcm && n > 0) || n < 0) {
        nm_fail(NM_OK, err, err_size, "transcribe: NULL argument or negative length");
        return NM_ERR_INVALID_ARG;
    }
    nm_stt_params p = *pp;
    nm_status st = check_params(t, &p, err, err_size);
    if (st != NM_OK) return st;
    if (n > (int64_t)INT32_MAX - 16000 * 31) {
        nm_fail(NM_OK, err, err_size, "transcribe: %lld samples is too long", (long long)n);
        return NM_ERR_RANGE;
    }
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(pcm[i])) {
            nm_fail(NM_OK, err, err_size, "transcribe: sample %lld is not a finite number", (long long)i);
            return NM_ERR_INVALID_ARG;
        }
    const nm_whisper_model *m = t->m;
    const nm_whisper_special *sp = &m->special;
    const nm_whisper_hparams *hp = &m->hp;
    const int32_t nv = t->n_vocab, beg = sp->timestamp_begin;
    memset(&t->tm, 0, sizeof t->tm);
    const nm_whisper_timings w0 = nm_whisper_get_timings(t->w);
    out->n_samples = n;
    out->language_prob = 1.0f;
    snprintf(out->language, sizeof out->language, "en");

    const int32_t n_len_org = (int32_t)(1 + (n + NM_MEL_N_FFT / 2 - NM_MEL_N_FFT) / NM_MEL_HOP);
    const int32_t seek_start = (int32_t)(p.offset_ms / 10);
    const int32_t seek_end = p.duration_ms == 0 ? n_len_org : seek_start + (int32_t)(p.duration_ms / 10);
    if (n == 0 || seek_end < seek_start + DELTA_MIN) return NM_OK; // under 100 ms: nothing, as whisper.cpp

    float *mel = NULL;
    char *text = NULL;
    const int64_t n_len = nm_mel_n_frames(n);
    const size_t text_cap = 64 * (size_t)t->n_text_ctx + 1;
    mel = malloc(sizeof(float) * (size_t)hp->n_mels * (size_t)n_len);
    text = malloc(text_cap);
    if (!mel || !text) {
        free(mel);
        free(text);
        nm_fail(NM_OK, err, err_size, "transcribe: out of memory for the spectrogram of %lld samples", (long long)n);
        return NM_ERR_NOMEM;
    }
    t->t_beg = t->t_last = 0;
    t->tid_last = 0;
    t->n_energy = 0;
    if (p.token_timestamps) {
        if (!(t->energy = malloc(sizeof(float) * (size_t)n))) {
            free(mel);
            free(text);
            nm_fail(NM_OK, err, err_size, "transcribe: out of memory for the signal energy of %lld samples", (long long)n);
            return NM_ERR_NOMEM;
        }
        signal_energy(pcm, (int32_t)n, t->energy);
        t->n_energy = (int32_t)n;
    }
    double t_start = nm_now_s();
    st = nm_mel_compute(t->mel, pcm, n, mel);
    t->tm.t_mel = nm_now_s() - t_start;
    if (st != NM_OK) {
        nm_fail(NM_OK, err, err_size, "transcribe: mel spectrogram: %s", nm_status_str(st));
        goto done;
    }

    // Language.
    const char *lang = p.language ? p.language : "en";
    int32_t lang_id = 0;
    if (nm_whisper_is_multilingual(m)) {
        if (!strcmp(lang, "auto")) {
            float prob;
            if ((st = detect_language(t, mel, n_len, &lang_id, &prob, err, err_size)) != NM_OK) goto done;
            out->language_prob = prob;
        } else {
            lang_id = nm_stt_lang_id(m, lang);
        }
        snprintf(out->language, sizeof out->language, "%s", m->lang_codes[lang_id]);
    }

    // Temperatures T0, T0 + inc, ... < 1 + 1e-6 (accumulated in float, as whisper.cpp).
    float temps[64];
    int32_t n_temps = 0;
    if (p.temperature_inc > 0.0f) {
        for (float tc = p.temperature; tc < 1.0f + 1e-6f && n_temps < 64; tc += p.temperature_inc) temps[n_temps++] = tc;
    } else {
        temps[n_temps++] = p.temperature;
    }

    int32_t n_decoders = p.strategy == NM_STT_GREEDY ? p.best_of
                                                      : (p.best_of > p.beam_size ? p.best_of : p.beam_size);
    if (n_decoders < 1) n_decoders = 1;
    for (int32_t j = 0; j < n_decoders; j++) nm_mt19937_seed(&t->dec[j].rng, (uint32_t)j);

    if (p.no_context) t->n_past0 = t->n_past1 = 0;
    const int32_t max_prompt_ctx = p.n_max_text_ctx < t->n_text_ctx / 2 ? p.n_max_text_ctx : t->n_text_ctx / 2;
    // The initial prompt, as whisper.cpp: carried, its last max_prompt_ctx - 1
    // tokens lead every window's prompt (set once while past0 is empty); else
    // it goes before the previous text, which the windows then roll on.
    // Only the last n_text_ctx / 2 tokens can ever be used: 2 * n_text_ctx are kept.
    if (p.prompt_tokens && p.n_prompt_tokens > 0) {
        const int32_t room = 2 * t->n_text_ctx;
        if (p.carry_initial_prompt) {
            if (t->n_past0 == 0) {
                const int32_t most = max_prompt_ctx - 1 > 1 ? max_prompt_ctx - 1 : 1;
                const int32_t k = p.n_prompt_tokens < most ? p.n_prompt_tokens : most;
                memcpy(t->past0, p.prompt_tokens + p.n_prompt_tokens - k, sizeof(int32_t) * (size_t)k);
                t->n_past0 = k;
            }
        } else {
            // [prompt][previous text], of which the windows take the end: the
            // previous text's tail first, then the prompt's tail in the room left.
            const int32_t keep = t->n_past1 < room ? t->n_past1 : room;
            const int32_t k = p.n_prompt_tokens < room - keep ? p.n_prompt_tokens : room - keep;
            memmove(t->past1 + k, t->past1 + t->n_past1 - keep, sizeof(int32_t) * (size_t)keep);
            memcpy(t->past1, p.prompt_tokens + p.n_prompt_tokens - k, sizeof(int32_t) * (size_t)k);
            t->n_past1 = k + keep;
        }
    }

    int32_t prompt_init[4], n_init = 0;
    prompt_init[n_init++] = sp->sot;
    if (nm_whisper_is_multilingual(m)) {
        prompt_init[n_init++] = sp->lang_begin + lang_id;
        prompt_init[n_init++] = p.translate ? sp->translate : sp->transcribe;
    }
    if (hp->n_text_layer == 2 && hp->n_vocab != 51866) p.no_timestamps = true; // first distil-whisper releases
    if (p.no_timestamps) prompt_init[n_init++] = sp->notimestamps;

    int32_t seek = seek_start;
    const int32_t n_max = t->n_text_ctx / 2 - 4;
    int32_t from[NM_STT_MAX_DECODERS];

    while (seek + DELTA_MIN < seek_end) {
        if (p.abort_callback && p.abort_callback(p.abort_user)) {
            st = NM_ERR_SHUTDOWN;
            nm_fail(NM_OK, err, err_size, "transcribe: stopped by its caller after %d windows", out->n_windows);
            goto done;
        }
        if ((st = nm_whisper_encode(t->w, mel, n_len, seek)) != NM_OK) {
            fwd_err(t, st, "encode", err, err_size);
            goto done;
        }
        out->n_windows++;
        if (seek > seek_start && seek + 500 >= seek_end) t->n_past0 = t->n_past1 = 0;

        int32_t best_id = 0;
        float no_speech = 0.0f, t_used = temps[0];
        for (int32_t it = 0; it < n_temps; it++) {
            const float tc = temps[it];
            int32_t n_cur = 1;
            if (p.strategy == NM_STT_GREEDY) n_cur = tc > 0.0f ? p.best_of : 1;
            else n_cur = tc > 0.0f ? p.best_of : p.beam_size;
            if (n_cur < 1) n_cur = 1;
            if (it > 0) out->n_fallbacks++;
            t_used = tc;

            for (int32_t j = 0; j < n_cur; j++) {
                decoder *d = &t->dec[j];
                d->seq.n = 0;
                d->seq.result_len = 0;
                d->seq.sum_logprobs_all = 0.0;
                d->seq.sum_logprobs = d->seq.avg_logprobs = -INFINITY;
                d->seq.entropy = 0.0;
                d->seq.score = -INFINITY;
                d->seek_delta = 100 * CHUNK_SECONDS;
                d->failed = d->completed = d->has_ts = false;
                d->phys = j;
            }

            // Prompt: [prev + carried prompt + past text] + sot [+ language + task] [+ notimestamps].
            t->n_prompt = 0;
            const bool take0 = p.carry_initial_prompt && t->n_past0 > 0;
            if (p.n_max_text_ctx > 0 && tc < HISTORY_TEMP_CUTOFF && max_prompt_ctx > 0 && (take0 || t->n_past1 > 0)) {
                t->prompt[t->n_prompt++] = sp->prev;
                const int32_t n0 = take0 ? t->n_past0 : 0;
                memcpy(t->prompt + t->n_prompt, t->past0, sizeof(int32_t) * (size_t)n0);
                t->n_prompt += n0;
                int32_t take = max_prompt_ctx - n0 - 1 < t->n_past1 ? max_prompt_ctx - n0 - 1 : t->n_past1;
                if (take < 0) take = 0;
                memcpy(t->prompt + t->n_prompt, t->past1 + t->n_past1 - take, sizeof(int32_t) * (size_t)take);
                t->n_prompt += take;
            }
            memcpy(t->prompt + t->n_prompt, prompt_init, sizeof(int32_t) * (size_t)n_init);
            t->n_prompt += n_init;

            if ((st = nm_whisper_decode(t->w, 0, t->prompt, t->n_prompt, 0, false)) != NM_OK) {
                fwd_err(t, st, "decode", err, err_size);
                goto done;
            }
            const float *raw = nm_whisper_logits(t->w, -1);
            log_softmax(raw, nv, t->raw_lp);
            probs_of(raw, t->raw_lp, nv, t->raw_p);
            no_speech = t->raw_p[sp->nospeech];

            double ts0 = nm_now_s();
            process_logits(t, &t->dec[0], raw, &p, tc);
            for (int32_t j = 1; j < n_cur; j++) {
                decoder *d = &t->dec[j];
                if ((st = nm_whisper_seq_share(t->w, d->phys, t->dec[0].phys, t->n_prompt)) != NM_OK) {
                    fwd_err(t, st, "cache share", err, err_size);
                    goto done;
                }
                memcpy(d->probs, t->dec[0].probs, sizeof(float) * (size_t)nv);
                memcpy(d->logits, t->dec[0].logits, sizeof(float) * (size_t)nv);
                memcpy(d->logprobs, t->dec[0].logprobs, sizeof(float) * (size_t)nv);
            }
            t->tm.t_sample += nm_now_s() - ts0;

            for (int32_t i = 0; i < n_max; i++) {
                ts0 = nm_now_s();
                t->n_cand = 0;
                for (int32_t j = 0; j < n_cur; j++) {
                    decoder *d = &t->dec[j];
                    if (d->completed || d->failed) continue;
                    if (p.strategy == NM_STT_GREEDY) {
                        nm_stt_token tk = sample_token(t, d, tc < 1e-6f);
                        d->seq.tok[d->seq.n++] = tk;
                        d->seq.sum_logprobs_all += tk.plog;
                    } else {
                        sample_topk(t, d, j, p.beam_size);
                    }
                }

                if (p.strategy == NM_STT_BEAM) {
                    sort_candidates(t);
                    int32_t cur_c = 0;
                    for (int32_t j = 0; j < n_cur; j++) {
                        decoder *d = &t->dec[j];
                        if (d->completed || d->failed) continue;
                        if (cur_c >= t->n_cand) cur_c = 0;
                        const candidate *cur = &t->cand[t->cand_order[cur_c++]];
                        while (t->n_cand > cur_c && i > 0 && seq_equal(&t->cand[t->cand_order[cur_c]].seq, &cur->seq))
                            cur_c++;
                        d->seek_delta = cur->seek_delta;
                        d->has_ts = cur->has_ts;
                        seq_copy(&d->seq, &cur->seq);
                        from[j] = t->dec[cur->decoder_idx].phys;
                    }
                    if ((st = beam_reassign(t, n_cur, from, t->n_prompt + i)) != NM_OK) {
                        fwd_err(t, st, "cache share", err, err_size);
                        goto done;
                    }
                }

                // Completion, failure, and the window's advance from timestamps.
                for (int32_t j = 0; j < n_cur; j++) {
                    decoder *d = &t->dec[j];
                    if (d->completed || d->failed) continue;
                    const nm_stt_token *tk = &d->seq.tok[d->seq.n - 1];
                    if (tk->id > beg) {
                        const int32_t sd_new = 2 * (tk->id - beg);
                        if (d->has_ts && d->seek_delta > sd_new && d->seq.result_len < i) {
                            d->failed = true;
                            continue;
                        }
                        d->seek_delta = sd_new;
                        d->seq.result_len = i + 1;
                        d->has_ts = true;
                    }
                    if (tk->id == sp->eot || (p.max_tokens > 0 && i >= p.max_tokens) ||
                        (d->has_ts && seek + d->seek_delta + DELTA_MIN >= seek_end)) {
                        if (d->seq.result_len == 0 && !p.no_timestamps) {
                            if (seek + d->seek_delta + DELTA_MIN >= seek_end) {
                                d->seq.result_len = i + 1;
                            } else {
                                d->failed = true;
                                continue;
                            }
                        }
                        if (p.single_segment || p.no_timestamps) {
                            d->seq.result_len = i + 1;
                            d->seek_delta = 100 * CHUNK_SECONDS;
                        }
                        d->completed = true;
                        continue;
                    }
                    // Stuck in a loop: no end in n_max tokens.
                    if (i == n_max - 1 && (d->seq.result_len == 0 || d->seek_delta < 100 * CHUNK_SECONDS / 2)) {
                        d->failed = true;
                        continue;
                    }
                }
                bool all_done = true;
                for (int32_t j = 0; j < n_cur; j++)
                    if (!t->dec[j].completed && !t->dec[j].failed) all_done = false;
                t->tm.t_sample += nm_now_s() - ts0;
                if (all_done) break;

                // every live decoder's last token in one pass (the weights read
                // once), each one's logits as if it ran alone
                const int32_t n_past = t->n_prompt + i;
                int32_t seqs[NM_STT_MAX_DECODERS], toks[NM_STT_MAX_DECODERS], live[NM_STT_MAX_DECODERS], n_live = 0;
                for (int32_t j = 0; j < n_cur; j++) {
                    decoder *d = &t->dec[j];
                    if (d->completed || d->failed) continue;
                    seqs[n_live] = d->phys;
                    toks[n_live] = d->seq.tok[d->seq.n - 1].id;
                    live[n_live++] = j;
                }
                if ((st = nm_whisper_decode_seqs(t->w, seqs, toks, n_live, n_past)) != NM_OK) {
                    fwd_err(t, st, "decode", err, err_size);
                    goto done;
                }
                ts0 = nm_now_s();
                for (int32_t k = 0; k < n_live; k++)
                    process_logits(t, &t->dec[live[k]], nm_whisper_logits(t->w, k), &p, tc);
                t->tm.t_sample += nm_now_s() - ts0;
            }

            // Rank the sequences.
            double best_score = -INFINITY;
            for (int32_t j = 0; j < n_cur; j++) {
                decoder *d = &t->dec[j];
                if (d->failed) continue;
                d->seq.n = d->seq.result_len;
                sequence_score(t, &p, &d->seq);
                if (d->seq.result_len > 32 && d->seq.entropy < p.entropy_thold) {
                    d->failed = true;
                    continue;
                }
                if (best_score < d->seq.score) {
                    best_score = d->seq.score;
                    best_id = j;
                }
            }
            bool success = true;
            if (it != n_temps - 1) {
                const decoder *d = &t->dec[best_id];
                if (d->failed || (d->seq.avg_logprobs < p.logprob_thold && no_speech < p.no_speech_thold))
                    success = false;
            }
            if (success) break;
        }

        // Segments of the window.
        const decoder *best = &t->dec[best_id];
        int32_t seek_delta = best->seek_delta;
        const int32_t result_len = best->seq.result_len;
        const bool is_no_speech = no_speech > p.no_speech_thold && best->seq.avg_logprobs < p.logprob_thold;

        // Previous text for the next window. As in whisper.cpp this is kept
        // within a call whatever no_context says (no_context only forgets the
        // last call's text); n_max_text_ctx = 0 turns it off.
        {
            int32_t k = 0;
            if (!p.carry_initial_prompt && t->n_prompt > 0 && t->prompt[0] == sp->prev)
                for (int32_t i = 1; i < t->n_prompt - n_init; i++) t->tmp[k++] = t->prompt[i];
            if (!is_no_speech)
                for (int32_t i = 0; i < result_len; i++) t->tmp[k++] = best->seq.tok[i].id;
            memcpy(t->past1, t->tmp, sizeof(int32_t) * (size_t)k);
            t->n_past1 = k;
        }
        if (best->seq.n > 0 && !is_no_speech) {
            int32_t seg0 = out->n_seg;
            if ((st = emit_window(t, out, &p, best, seek, seek_delta, no_speech, t_used, text, text_cap)) != NM_OK) {
                nm_fail(NM_OK, err, err_size, "transcribe: out of memory for the transcript");
                goto done;
            }
            if (p.on_segments && out->n_seg > seg0) p.on_segments(out, seg0, p.user);
        }
        // A text that ends on a single timestamp: the rest of the window is done.
        const nm_stt_token *tc = best->seq.tok;
        const int32_t nt = best->seq.n;
        const bool max_tokens_end = p.max_tokens > 0 && !p.single_segment && nt > p.max_tokens;
        if (nt > 1 && !max_tokens_end && tc[nt - 2].id < beg && tc[nt - 1].id > beg) {
            seek_delta = seek_end - seek < 100 * CHUNK_SECONDS ? seek_end - seek : 100 * CHUNK_SECONDS;
        }
        seek += seek_delta;
    }
    st = NM_OK;

done: {
    const nm_whisper_timings w1 = nm_whisper_get_timings(t->w);
    t->tm.t_encode = w1.t_encode - w0.t_encode;
    t->tm.t_decode = w1.t_decode - w0.t_decode;
    t->tm.n_encode = w1.n_encode - w0.n_encode;
    t->tm.n_decode_calls = w1.n_decode_calls - w0.n_decode_calls;
    t->tm.n_decode_tokens = w1.n_decode_tokens - w0.n_decode_tokens;
}
    free(mel);
    free(text);
    free(t->energy);
    t->energy = NULL;
    t->n_energy = 0;
    if (st != NM_OK) nm_transcript_free(out);
    return st;
}

// ---- output formats ------------------------------------------------------------------

void nm_stt_timestamp(int64_t t, bool comma, char *buf) {
    int64_t ms = t * 10;
    if (ms < 0) ms = 0;
    int64_t hr = ms / 3600000;
    ms -= hr * 3600000;
    int64_t mn = ms / 60000;
    ms -= mn * 60000;
    int64_t s = ms / 1000;
    ms -= s * 1000;
    snprintf(buf, 32, "%02d:%02d:%02d%c%03d", (int)hr, (int)mn, (int)s, comma ? ',' : '.', (int)ms);
}

bool nm_transcript_write_text(const nm_transcript *t, bool timestamps, FILE *f) {
    char a[32], b[32];
    for (int32_t i = 0; i < t->n_seg; i++) {
        if (timestamps) {
            nm_stt_timestamp(t->seg[i].t0, false, a);
            nm_stt_timestamp(t->seg[i].t1, false, b);
            fprintf(f, "[%s --> %s]  ", a, b);
        }
        const char *s = t->seg[i].text;
        if (!timestamps)
            while (*s == ' ' || *s == '\t') s++;
        fprintf(f, "%s\n", s);
    }
    return !ferror(f);
}

bool nm_transcript_write_srt(const nm_transcript *t, FILE *f) {
    char a[32], b[32];
    for (int32_t i = 0; i < t->n_seg; i++) {
        const char *s = t->seg[i].text; // as it is, leading blank included, as whisper-cli -osrt
        nm_stt_timestamp(t->seg[i].t0, true, a);
        nm_stt_timestamp(t->seg[i].t1, true, b);
        fprintf(f, "%d\n%s --> %s\n%s\n\n", i + 1, a, b, s);
    }
    return !ferror(f);
}

bool nm_transcript_write_vtt(const nm_transcript *t, FILE *f) {
    char a[32], b[32];
    fputs("WEBVTT\n\n", f);
    for (int32_t i = 0; i < t->n_seg; i++) { // the text as it is, as whisper-cli -ovtt
        nm_stt_timestamp(t->seg[i].t0, false, a);
        nm_stt_timestamp(t->seg[i].t1, false, b);
        fprintf(f, "%s --> %s\n%s\n\n", a, b, t->seg[i].text);
    }
    return !ferror(f);
}

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p == '\n') fputs("\\n", f);
        else if (*p == '\t') fputs("\\t", f);
        else if (*p == '\r') fputs("\\r", f);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

bool nm_transcript_write_json(const nm_transcript *t, const char *model_name, FILE *f) {
    fprintf(f, "{\n  \"model\": ");
    json_string(f, model_name ? model_name : "");
    fprintf(f, ",\n  \"language\": ");
    json_string(f, t->language);
    fprintf(f, ",\n  \"duration\": %.3f,\n  \"segments\": [", (double)t->n_samples / NM_MEL_SAMPLE_RATE);
    for (int32_t i = 0; i < t->n_seg; i++) {
        const nm_stt_segment *s = &t->seg[i];
        fprintf(f, "%s\n    {\"t0\": %.2f, \"t1\": %.2f, \"text\": ", i ? "," : "", s->t0 / 100.0, s->t1 / 100.0);
        json_string(f, s->text);
        fprintf(f, ", \"avg_logprob\": %.4f, \"no_speech_prob\": %.4f, \"temperature\": %.2f, \"tokens\": [",
                s->avg_logprob, s->no_speech_prob, s->temperature);
        for (int32_t k = 0; k < s->n_tokens; k++) fprintf(f, "%s%d", k ? ", " : "", s->tokens[k].id);
        fprintf(f, "]}");
    }
    fprintf(f, "%s]\n}\n", t->n_seg ? "\n  " : "");
    return !ferror(f);
}
