// The TTS brick over an engine (tts.h): text checks, output into a caller's
// buffer or into TABM slots, resampling, stats.
#include "bricks/tts/tts.h"
#include "bricks/tts/piper/piper.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "io/audio/audio.h"
#include "core/clock.h"
#include "core/fail.h"

struct nm_tts {
    const nm_tts_engine_i *eng;
    void *state;          // the engine's
    int32_t native_rate;  // what the engine produces
    int32_t rate;         // what we hand out
    nm_ledger *ledger;    // borrowed: counts the engine's samples copied out of its buffers
    int ep_engine, ep_tts; // ledger endpoints (-1 without a ledger)
    nm_tts_stats stats;
    void (*report)(void *user, const char *msg); // told of a failure before its slot goes out
    void *report_user;
    bool (*cancel)(void *user); // asked before each chunk written into a ring (nm_tts_set_cancel)
    void *cancel_user;
    char err[512];
};

static const nm_tts_engine_i *const engines[] = {&nm_tts_espeak_engine, &nm_tts_piper_engine};


nm_tts_params nm_tts_default_params(void) {
    return (nm_tts_params){.rate_wpm = 175, .pitch = 50, .volume = 100, .length_scale = -1, .noise_scale = -1,
                           .noise_w = -1}; // (voice NULL, the scales < 0: the engine's or voice's own)
}

static const nm_tts_engine_i *find_engine(const char *name, char *err, size_t err_size) {
    if (!name) return engines[0];
    for (size_t i = 0; i < sizeof engines / sizeof engines[0]; i++)
        if (!strcmp(engines[i]->name, name)) return engines[i];
    nm_fail(NM_ERR_INVALID_ARG, err, err_size, "tts: unknown engine '%s' (known: espeak-ng, piper)", name);
    return NULL;
}

nm_status nm_tts_open(const nm_tts_params *p, nm_ledger *ledger, nm_tts **out, char *err, size_t err_size) {
    if (out) *out = NULL;
    if (!p || !out) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "tts: NULL params or output");
    const nm_tts_engine_i *eng = find_engine(p->engine, err, err_size);
    if (!eng) return NM_ERR_INVALID_ARG;
    if (p->sample_rate != 0 && (p->sample_rate < NM_AUDIO_MIN_RATE || p->sample_rate > NM_AUDIO_MAX_RATE))
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "tts: sample rate %d Hz is outside %d..%d Hz",
                       (int)p->sample_rate, NM_AUDIO_MIN_RATE, NM_AUDIO_MAX_RATE);
    const int ep_engine = ledger ? nm_ledger_endpoint(ledger, eng->name) : -1;
    const int ep_tts = ledger ? nm_ledger_endpoint(ledger, "tts") : -1;
    if (ledger && (ep_engine < 0 || ep_tts < 0))
        return nm_fail(NM_ERR_RANGE, err, err_size, "tts: the ledger has no room for the endpoints \"%s\" and \"tts\"",
                       eng->name);
    nm_tts *t = calloc(1, sizeof *t);
    if (!t) return nm_fail(NM_ERR_NOMEM, err, err_size, "tts: out of memory");
    t->eng = eng;
    t->ledger = ledger;
    t->ep_engine = ep_engine;
    t->ep_tts = ep_tts;
    nm_status st = eng->open(p, &t->state, &t->native_rate, err, err_size);
    if (st != NM_OK) {
        free(t);
        return st;
    }
    if (t->native_rate < NM_AUDIO_MIN_RATE || t->native_rate > NM_AUDIO_MAX_RATE) {
        nm_fail(NM_ERR_UNSUPPORTED, err, err_size, "tts: engine rate %d Hz is outside %d..%d Hz",
                (int)t->native_rate, NM_AUDIO_MIN_RATE, NM_AUDIO_MAX_RATE);
        eng->close(t->state);
        free(t);
        return NM_ERR_UNSUPPORTED;
    }
    t->rate = p->sample_rate ? p->sample_rate : t->native_rate;
    *out = t;
    return NM_OK;
}

void nm_tts_free(nm_tts *t) {
    if (!t) return;
    t->eng->close(t->state);
    free(t);
}

int32_t nm_tts_sample_rate(const nm_tts *t) { return t->rate; }
int32_t nm_tts_native_rate(const nm_tts *t) { return t->native_rate; }
const char *nm_tts_engine_name(const nm_tts *t) { return t->eng->name; }
void nm_tts_estimate(const nm_tts *t, double seconds, nm_brick_cost *e) {
    if (t->eng->version >= 3 && t->eng->estimate) t->eng->estimate(t->state, seconds, e);
}
const char *nm_tts_device(const nm_tts *t) {
    return t->eng->version >= 3 && t->eng->device ? t->eng->device(t->state) : "cpu";
}

nm_status nm_tts_retune(nm_tts *t, const nm_tts_params *p) {
    if (!t || !p) return NM_ERR_INVALID_ARG;
    t->err[0] = '\0';
    if (t->eng->version < 2 || !t->eng->retune)
        return nm_fail(NM_ERR_UNSUPPORTED, t->err, sizeof t->err, "tts: engine %s cannot change its voice",
                       t->eng->name);
    return t->eng->retune(t->state, p, t->err, sizeof t->err);
}
const char *nm_tts_last_error(const nm_tts *t) { return t->err; }
nm_tts_stats nm_tts_get_stats(const nm_tts *t) { return t->stats; }

static nm_status check_text(nm_tts *t, const char *text) {
    if (!text) return nm_fail(NM_ERR_INVALID_ARG, t->err, sizeof t->err, "tts: NULL text");
    size_t n = strnlen(text, (size_t)NM_TTS_MAX_TEXT + 1);
    if (n > NM_TTS_MAX_TEXT)
        return nm_fail(NM_ERR_RANGE, t->err, sizeof t->err, "tts: text longer than %u bytes", NM_TTS_MAX_TEXT);
    for (size_t i = 0; i < n; i++)
        if (!isspace((unsigned char)text[i])) return NM_OK;
    return nm_fail(NM_ERR_INVALID_ARG, t->err, sizeof t->err, "tts: empty text");
}

// Longest utterance we accept from an engine, in samples (as the audio module caps input).
static int64_t max_samples(const nm_tts *t) { return (int64_t)NM_AUDIO_MAX_SECONDS * t->native_rate; }

static inline int16_t to_s16(float x) {
    long v = lrintf(x * 32768.0f); // the audio module's writer convention (audio.h)
    return (int16_t)(v < -32768 ? -32768 : v > 32767 ? 32767 : v);
}

// ---- a whole utterance at the native rate, into a growing buffer ----------------------
typedef struct collect {
    nm_tts *t;
    int16_t *pcm; // (cap,)
    int64_t n, cap;
    // Into a caller's buffer instead (to_caller): dst (dst_cap, may be 0), growing nothing.
    bool to_caller;
    int16_t *dst;
    int64_t dst_cap;
} collect;

static nm_status collect_sink(void *user, const int16_t *pcm, int64_t n) {
    collect *c = user;
    nm_tts *t = c->t;
    if (n == 0) return NM_OK; // (a flush: nothing held here)
    if (c->n + n > max_samples(t))
        return nm_fail(NM_ERR_RANGE, t->err, sizeof t->err, "tts: utterance longer than %d s",
                       NM_AUDIO_MAX_SECONDS);
    if (c->to_caller) {
        // Straight into the caller's buffer; past its end we only count.
        if (c->n < c->dst_cap) {
            int64_t k = n < c->dst_cap - c->n ? n : c->dst_cap - c->n;
            nm_ledger_copy(t->ledger, t->ep_engine, t->ep_tts, c->dst + c->n, pcm, (size_t)k * sizeof *pcm);
        }
        c->n += n;
        return NM_OK;
    }
    if (c->n + n > c->cap) {
        int64_t cap = c->cap ? c->cap : 16384;
        while (cap < c->n + n) cap *= 2;
        int16_t *p = realloc(c->pcm, (size_t)cap * sizeof *p);
        if (!p) return nm_fail(NM_ERR_NOMEM, t->err, sizeof t->err, "tts: out of memory for %lld samples",
                               (long long)cap);
        c->pcm = p;
        c->cap = cap;
    }
    nm_ledger_copy(t->ledger, t->ep_engine, t->ep_tts, c->pcm + c->n, pcm, (size_t)n * sizeof *pcm);
    c->n += n;
    return NM_OK;
}

static nm_status run_engine(nm_tts *t, const char *text, nm_tts_sink_fn sink, void *user) {
    t->err[0] = '\0';
    return t->eng->synth(t->state, text, sink, user, t->err, sizeof t->err);
}

// Resamples native s16 pcm to the output rate (the audio module's soxr HQ).
static nm_status resample(nm_tts *t, const int16_t *pcm, int64_t n, nm_audio *out) {
    *out = (nm_audio){0};
    float *f = malloc((size_t)(n ? n : 1) * sizeof *f);
    if (!f) return nm_fail(NM_ERR_NOMEM, t->err, sizeof t->err, "tts: out of memory");
    for (int64_t i = 0; i < n; i++) f[i] = pcm[i] / 32768.0f;
    nm_status st = nm_audio_resample(f, n, t->native_rate, t->rate, out, t->err, sizeof t->err);
    free(f);
    return st;
}

// The utterance at the native rate, then resampled to the output rate (a
// float buffer, owned by the caller: nm_audio_free).
static nm_status synth_resampled(nm_tts *t, const char *text, nm_audio *a) {
    *a = (nm_audio){0};
    collect c = {.t = t};
    nm_status st = run_engine(t, text, collect_sink, &c);
    if (st == NM_OK && c.n > 0) st = resample(t, c.pcm, c.n, a);
    free(c.pcm);
    return st;
}

// The utterance at the output rate, as s16 in *pcm (owned) / *n.
static nm_status synth_whole(nm_tts *t, const char *text, int16_t **pcm, int64_t *n) {
    *pcm = NULL;
    *n = 0;
    if (t->rate == t->native_rate) {
        collect c = {.t = t};
        nm_status st = run_engine(t, text, collect_sink, &c);
        if (st != NM_OK) {
            free(c.pcm);
            return st;
        }
        *pcm = c.pcm;
        *n = c.n;
        return NM_OK;
    }
    nm_audio a;
    nm_status st = synth_resampled(t, text, &a);
    int16_t *r = st == NM_OK ? malloc((size_t)(a.n ? a.n : 1) * sizeof *r) : NULL;
    if (st == NM_OK && !r) st = nm_fail(NM_ERR_NOMEM, t->err, sizeof t->err, "tts: out of memory");
    if (st == NM_OK) {
        for (int64_t i = 0; i < a.n; i++) r[i] = to_s16(a.pcm[i]);
        *pcm = r;
        *n = a.n;
    }
    nm_audio_free(&a);
    return st;
}

nm_status nm_tts_synth(nm_tts *t, const char *text, int16_t *pcm, int64_t cap, int64_t *n) {
    if (n) *n = 0;
    if (!t) return NM_ERR_INVALID_ARG;
    if (!n || (cap > 0 && !pcm) || cap < 0)
        return nm_fail(NM_ERR_INVALID_ARG, t->err, sizeof t->err, "tts: bad output buffer");
    nm_status st = check_text(t, text);
    if (st != NM_OK) return st;
    double t0 = nm_now_s();
    int64_t got = 0;
    if (t->rate == t->native_rate) {
        collect c = {.t = t, .to_caller = true, .dst = pcm, .dst_cap = cap};
        st = run_engine(t, text, collect_sink, &c);
        got = c.n;
    } else {
        // resampled, then converted straight into the caller's buffer
        nm_audio a;
        st = synth_resampled(t, text, &a);
        if (st == NM_OK) {
            got = a.n;
            for (int64_t i = 0; i < got && i < cap; i++) pcm[i] = to_s16(a.pcm[i]);
        }
        nm_audio_free(&a);
    }
    t->stats.t_synth += nm_now_s() - t0;
    if (st != NM_OK) return st;
    *n = got;
    if (got > cap)
        return nm_fail(NM_ERR_RANGE, t->err, sizeof t->err, "tts: %lld samples do not fit a buffer of %lld",
                       (long long)got, (long long)cap);
    t->stats.n_utterances++;
    t->stats.n_samples += (uint64_t)got;
    return NM_OK;
}

nm_status nm_tts_synth_alloc(nm_tts *t, const char *text, int16_t **pcm, int64_t *n) {
    if (pcm) *pcm = NULL;
    if (n) *n = 0;
    if (!t) return NM_ERR_INVALID_ARG;
    if (!pcm || !n) return nm_fail(NM_ERR_INVALID_ARG, t->err, sizeof t->err, "tts: NULL output");
    nm_status st = check_text(t, text);
    if (st != NM_OK) return st;
    double t0 = nm_now_s();
    st = synth_whole(t, text, pcm, n);
    t->stats.t_synth += nm_now_s() - t0;
    if (st != NM_OK) return st;
    t->stats.n_utterances++;
    t->stats.n_samples += (uint64_t)*n;
    return NM_OK;
}

// ---- into ring slots ----------------------------------------------------------------
// One slot is kept in hand: a chunk goes into a new slot once the previous is
// published, so the slot in hand at the end is the last and gets END.
typedef struct ring_out {
    nm_tts *t;
    nm_tabm *ring;
    uint32_t producer;
    int64_t timeout_ns;
    uint64_t request;
    nm_tabm_slot slot; // held when `held`
    bool held;
    int64_t n;         // samples written
} ring_out;

static nm_status ring_publish(ring_out *r, uint64_t user) {
    nm_tabm_meta *m = r->slot.meta;
    if ((user & NM_BRICK_ERROR) && r->t->report) r->t->report(r->t->report_user, r->t->err);
    m->user = user;
    nm_status st = nm_tabm_publish(r->ring, &r->slot);
    if (st != NM_OK) {
        nm_fail(st, r->t->err, sizeof r->t->err, "tts: publish: %s", nm_tabm_last_error(r->ring));
        nm_tabm_cancel(r->ring, &r->slot);
    } else {
        r->t->stats.n_slots++;
    }
    r->held = false;
    return st;
}

static nm_status ring_take(ring_out *r) {
    nm_status st = nm_tabm_acquire_write(r->ring, r->producer, r->timeout_ns, &r->slot);
    if (st != NM_OK)
        return nm_fail(st, r->t->err, sizeof r->t->err, "tts: no free slot: %s", nm_status_str(st));
    r->held = true;
    nm_tabm_meta *m = r->slot.meta;
    m->kind = NM_TABM_PCM_S16;
    m->ndim = 0;
    m->size = 0;
    m->sample_rate = r->t->rate;
    m->user = 0;
    m->request = r->request;
    return NM_OK;
}

// Writes n samples into slots (the chunk's own slot or slots). At the native
// rate the engine's buffer is copied into the slot (the engine cannot write
// into memory it did not allocate): the ledger counts it, engine -> tts.
// Resampled samples are computed into the slot. The reader uses the slot in place.
static nm_status ring_write(ring_out *r, const int16_t *pcm, const float *pcmf, int64_t n) {
    int64_t per = (int64_t)(nm_tabm_max_payload(r->ring) / sizeof(int16_t));
    while (n > 0) {
        nm_status st;
        if (r->t->cancel && r->t->cancel(r->t->cancel_user))
            return nm_fail(NM_ERR_CANCELLED, r->t->err, sizeof r->t->err, "tts: the request was cancelled");
        if (r->held && (st = ring_publish(r, NM_BRICK_MORE)) != NM_OK) return st;
        if ((st = ring_take(r)) != NM_OK) return st;
        int64_t k = n < per ? n : per;
        int16_t *dst = r->slot.data;
        if (pcm) { // the engine's buffer into the slot: counted
            nm_ledger_copy(r->t->ledger, r->t->ep_engine, r->t->ep_tts, dst, pcm, (size_t)k * sizeof *dst);
            pcm += k;
        } else {
            for (int64_t i = 0; i < k; i++) dst[i] = to_s16(pcmf[i]);
            pcmf += k;
        }
        nm_tabm_meta *m = r->slot.meta;
        m->ndim = 2;
        m->shape[0] = k;
        m->shape[1] = 1;
        m->size = (uint64_t)k * sizeof *dst;
        r->n += k;
        n -= k;
    }
    return NM_OK;
}

static nm_status ring_sink(void *user, const int16_t *pcm, int64_t n) {
    ring_out *r = user;
    if (n == 0) // a flush: the slot held goes out now (more of the utterance follows)
        return r->held ? ring_publish(r, NM_BRICK_MORE) : NM_OK;
    if (r->n + n > max_samples(r->t))
        return nm_fail(NM_ERR_RANGE, r->t->err, sizeof r->t->err, "tts: utterance longer than %d s",
                       NM_AUDIO_MAX_SECONDS);
    return ring_write(r, pcm, NULL, n);
}

nm_status nm_tts_synth_ring(nm_tts *t, const char *text, nm_tabm *ring, uint32_t producer, int64_t timeout_ns,
                            uint64_t request, bool more) {
    if (!t) return NM_ERR_INVALID_ARG;
    if (!ring) return nm_fail(NM_ERR_INVALID_ARG, t->err, sizeof t->err, "tts: NULL ring");
    if (nm_tabm_max_payload(ring) < sizeof(int16_t))
        return nm_fail(NM_ERR_RANGE, t->err, sizeof t->err, "tts: the ring's slots (%zu bytes) cannot hold a sample",
                       nm_tabm_max_payload(ring));
    nm_status st = check_text(t, text);
    if (st != NM_OK) return st;
    double t0 = nm_now_s();
    ring_out r = {.t = t, .ring = ring, .producer = producer, .timeout_ns = timeout_ns, .request = request};
    if (t->rate == t->native_rate) {
        st = run_engine(t, text, ring_sink, &r); // a slot per engine chunk, as it comes
    } else {
        // soxr runs over the whole utterance (nm_audio_resample), then slots of the capacity.
        collect c = {.t = t};
        st = run_engine(t, text, collect_sink, &c);
        nm_audio a = {0};
        if (st == NM_OK && c.n > 0) st = resample(t, c.pcm, c.n, &a);
        free(c.pcm);
        if (st == NM_OK) st = ring_write(&r, NULL, a.pcm, a.n);
        nm_audio_free(&a);
    }
    // The utterance's last slot: the one in hand, or an empty one. After an
    // error a slot in hand still ends the request (flagged), so the reader is
    // not left waiting.
    uint64_t end = st == NM_ERR_CANCELLED ? NM_BRICK_CANCELLED : st != NM_OK ? NM_BRICK_ERROR : more ? NM_BRICK_MORE : 0;
    bool ring_gone = st == NM_ERR_SHUTDOWN || st == NM_ERR_TIMEOUT || st == NM_ERR_AGAIN;
    if (!r.held && !ring_gone) {
        nm_status st2 = ring_take(&r);
        if (st == NM_OK) st = st2;
    }
    if (r.held) {
        nm_status st2 = ring_publish(&r, end);
        if (st == NM_OK) st = st2;
    }
    t->stats.t_synth += nm_now_s() - t0;
    if (st != NM_OK) return st;
    t->stats.n_utterances++;
    t->stats.n_samples += (uint64_t)r.n;
    return NM_OK;
}

void nm_tts_set_reporter(nm_tts *t, void (*fn)(void *user, const char *msg), void *user) {
    t->report = fn;
    t->report_user = user;
}

void nm_tts_set_cancel(nm_tts *t, bool (*fn)(void *user), void *user) {
    t->cancel = fn;
    t->cancel_user = user;
}

void nm_tts_copy_text(nm_tts *t, char *dst, const char *src, size_t n) {
    nm_ledger_copy(t->ledger, t->ep_tts, t->ep_engine, dst, src, n);
}

nm_status nm_tts_list_voices(const char *engine, const char *data_dir, nm_tts_voice_fn fn, void *user, char *err,
                             size_t err_size) {
    if (!fn) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "tts: NULL callback");
    const nm_tts_engine_i *eng = find_engine(engine, err, err_size);
    if (!eng) return NM_ERR_INVALID_ARG;
    if (!eng->list_voices)
        return nm_fail(NM_ERR_UNSUPPORTED, err, err_size, "tts: engine %s cannot list its voices", eng->name);
    return eng->list_voices(data_dir, fn, user, err, err_size);
}
