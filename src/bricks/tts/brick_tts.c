// The text-to-speech brick (nm_brick_i, include/nanomind.h): TEXT slots in,
// PCM slots out as the engine makes them. Each TEXT slot of a request is
// spoken in turn (the STT brick's segments, an LLM answer's sentences), so
// speech starts before the request's text is complete.
#include <cjson/cJSON.h>
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bricks/brick_impl.h"
#include "bricks/tts/tts.h"
#include "core/fail.h"

#define TTS_TEXT_SLOT 4096 // the input ring's slot size it suggests (a sentence or a few)

typedef struct tts_brick {
    nm_tts *tts;
    uint32_t producer;
    int64_t timeout_ns;
    int64_t wait_ns;          // this run's waits: timeout_ns, or in nm_brick_step nm_brick_wait_ns's
    int32_t rate_wpm;
    char *text;                  // the engine's input: a slot's text, NUL-terminated (grown to the
    size_t text_cap;             // largest slot, at most NM_TTS_MAX_TEXT bytes)
    nm_brick_stats st;
    nm_tabm *in;                 // the request being served: its cancellation is marked there
    uint64_t request;
    nm_brick *self;              // the handle running it (the reporter's)
    nm_tts_params base;          // the voice and settings it was loaded with (voice in base_voice)
    char base_voice[80], req_voice[80];
    bool retuned;                // a request's parameters changed them: restored before the next request
} tts_brick;

static void tts_release(void *state) {
    tts_brick *b = state;
    if (!b) return;
    nm_tts_free(b->tts);
    free(b->text);
    free(b);
}

static nm_status tts_load(const nm_brick_params *p, void **state, char *err, size_t err_size) {
    tts_brick *b = calloc(1, sizeof *b);
    if (!b) return nm_fail(NM_ERR_NOMEM, err, err_size, "tts brick: out of memory");
    nm_tts_params tp = p->tts;
    if (tp.n_threads <= 0) tp.n_threads = p->n_threads; // (a neural voice's threads: the brick's)
    if (!tp.device) tp.device = p->device;               // (a neural voice's device: the brick's)
    nm_status st = nm_tts_open(&tp, p->ledger, &b->tts, err, err_size);
    if (st != NM_OK) {
        free(b);
        return st;
    }
    b->producer = p->producer;
    b->timeout_ns = b->wait_ns = p->timeout_ns;
    b->rate_wpm = p->tts.rate_wpm > 0 ? p->tts.rate_wpm : 175;
    b->base = p->tts;
    snprintf(b->base_voice, sizeof b->base_voice, "%s", p->tts.voice ? p->tts.voice : "");
    b->base.voice = p->tts.voice ? b->base_voice : NULL; // (NULL: the engine's own)
    *state = b;
    return NM_OK;
}

// The request's text, before its flagged slot goes out.
static void report(void *state, const char *msg) {
    tts_brick *b = state;
    nm_brick_set_request_error(b->self, b->request, "%s", msg);
}

static bool cancelled(void *user) {
    const tts_brick *b = user;
    return nm_tabm_request_cancelled(b->in, b->request);
}

// A cancelled request: what it said stays said, the rest of its text is
// dropped, and it ends with a slot flagged NM_BRICK_CANCELLED (`ended`: that
// slot is out already).
static nm_status end_cancelled(tts_brick *b, nm_tabm *in, nm_tabm *out, uint64_t user, uint64_t request, bool ended) {
    b->st.n_requests++;
    b->st.n_cancelled++;
    if (!ended)
        return nm_brick_end_request(in, user, out, b->producer, b->wait_ns, NM_TABM_PCM_S16, request, NM_BRICK_CANCELLED,
                                    &b->st);
    nm_tabm_cancel_request(out, request);
    return nm_brick_drain_request(in, user, b->wait_ns, &b->st.n_in_slots);
}

static bool blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isspace((unsigned char)s[i])) return false;
    return true;
}

// A request's PARAMS slot (OpenAI's speech names where it has them): "voice"
// (the engine's voice name), "speed" (0.25..4, times the brick's rate),
// "pitch" (0..100), "volume" (0..200); others ignored. Applied for this
// request (nm_tts_retune); an unknown voice or a value outside the engine's
// range fails the request with the parameter named.
static nm_status take_params(tts_brick *b, const nm_tabm_slot *s, char *why, size_t why_size) {
    cJSON *o = nm_req_parse(s, "tts brick", why, why_size);
    if (!o) return NM_ERR_FORMAT;
    nm_tts_params p = b->base;
    const char *voice = NULL;
    double speed = 1.0;
    int64_t i = 0;
    int k = nm_req_string(o, "voice", 64, &voice, why, why_size);
    if (k == 1) snprintf(b->req_voice, sizeof b->req_voice, "%s", voice), p.voice = b->req_voice;
    if (k >= 0 && (k = nm_req_number(o, "speed", 0.25, 4.0, &speed, why, why_size)) == 1)
        p.rate_wpm = (int32_t)lround(b->rate_wpm * speed);
    if (k >= 0 && (k = nm_req_int(o, "pitch", 0, 100, &i, why, why_size)) == 1) p.pitch = (int32_t)i;
    if (k >= 0 && (k = nm_req_int(o, "volume", 0, 200, &i, why, why_size)) == 1) p.volume = (int32_t)i;
    nm_req_free(o);
    const unsigned long long seq = (unsigned long long)s->meta->seq;
    if (k < 0) {
        char m[256];
        snprintf(m, sizeof m, "%s", why);
        snprintf(why, why_size, "tts brick: parameters slot %llu: %s", seq, m);
        return NM_ERR_FORMAT;
    }
    nm_status st = nm_tts_retune(b->tts, &p); // a failed one changes nothing
    if (st == NM_OK) b->retuned = true;
    else
        snprintf(why, why_size, "tts brick: parameters slot %llu: %s%s", seq, nm_tts_last_error(b->tts),
                 p.rate_wpm != b->rate_wpm ? " (the rate after \"speed\")" : "");
    return st;
}

// One request: its TEXT slots in order. A blank slot is skipped (an STT
// request without speech ends with an empty one); a request with no text at
// all gives one empty PCM slot. A slot of another kind, or text over
// NM_TTS_MAX_TEXT, fails the request: the rest of its slots are read and dropped.
// A first slot of kind NM_TABM_PARAMS (take_params) sets the voice for it.
static nm_status tts_run(void *state, nm_brick *self, nm_tabm *in, nm_tabm *out) {
    tts_brick *b = state;
    b->self = self;
    b->wait_ns = nm_brick_wait_ns(self, b->timeout_ns);
    nm_tts_set_reporter(b->tts, report, b); // an engine failure is reported before its slot goes out
    nm_tts_set_cancel(b->tts, cancelled, b);
    b->in = in;
    if (b->retuned) { // the last request's voice: back to the brick's own
        nm_status rs = nm_tts_retune(b->tts, &b->base);
        if (rs != NM_OK) {
            nm_brick_set_error(self, "tts brick: restoring its voice: %s", nm_tts_last_error(b->tts));
            return rs;
        }
        b->retuned = false;
    }
    bool spoke = false, first = true;
    for (;;) {
        nm_tabm_slot s;
        nm_status st = nm_tabm_acquire_read(in, b->wait_ns, &s);
        if (st != NM_OK) {
            if (st == NM_ERR_SHUTDOWN) nm_tabm_shutdown(out);
            else nm_brick_set_error(self, "tts brick: waiting for a text slot: %s", nm_status_str(st));
            return st;
        }
        b->st.n_in_slots++;
        const uint64_t user = s.meta->user, request = s.meta->request;
        const bool more = user & NM_BRICK_MORE;
        const size_t n = (size_t)s.meta->size;
        b->request = request;
        if (nm_req_cancelled(in, user, request)) {
            nm_tabm_release(in, &s);
            return end_cancelled(b, in, out, user, request, false);
        }
        if (first && s.meta->kind == NM_TABM_PARAMS && more) {
            char why[400] = "";
            st = take_params(b, &s, why, sizeof why);
            nm_tabm_release(in, &s);
            first = false;
            if (st == NM_OK) continue;
            nm_brick_set_request_error(self, request, "%s", why);
            b->st.n_requests++;
            b->st.n_bad_requests++;
            return nm_brick_end_request(in, user, out, b->producer, b->wait_ns, NM_TABM_PCM_S16, request, NM_BRICK_ERROR,
                                        &b->st);
        }
        first = false;
        if (s.meta->kind == NM_TABM_TEXT && n <= NM_TTS_MAX_TEXT && n <= s.capacity && n + 1 > b->text_cap) {
            char *t = realloc(b->text, n + 1);
            if (t) b->text = t, b->text_cap = n + 1;
        }
        const bool upstream = user & NM_BRICK_ERROR;
        if (upstream || s.meta->kind != NM_TABM_TEXT || n > NM_TTS_MAX_TEXT || n > s.capacity || n + 1 > b->text_cap ||
            memchr(s.data, '\0', n)) {
            nm_brick_set_request_error(self, request, "tts brick: input slot %llu: %s", (unsigned long long)s.meta->seq,
                     upstream ? "the brick before this one failed the request (NM_BRICK_ERROR)"
                     : s.meta->kind != NM_TABM_TEXT ? "not a text slot"
                     : n > NM_TTS_MAX_TEXT || n > s.capacity ? "text longer than 1 MiB"
                     : n + 1 > b->text_cap ? "out of memory for its text"
                                           : "a NUL byte in the text");
            nm_tabm_release(in, &s);
            b->st.n_requests++;
            b->st.n_bad_requests++;
            return nm_brick_end_request(in, user, out, b->producer, b->wait_ns, NM_TABM_PCM_S16, request, NM_BRICK_ERROR,
                                        &b->st);
        }
        const bool speak = n > 0 && !blank(s.data, n);
        if (speak) nm_tts_copy_text(b->tts, b->text, s.data, n);
        b->text[n] = '\0';
        nm_tabm_release(in, &s);
        if (speak || (!more && !spoke)) {
            const nm_tts_stats before = nm_tts_get_stats(b->tts);
            if (speak) {
                st = nm_tts_synth_ring(b->tts, b->text, out, b->producer, b->wait_ns, request, more);
            } else { // nothing to say: the request still ends with a slot
                nm_tabm_slot o;
                if ((st = nm_tabm_acquire_write(out, b->producer, b->wait_ns, &o)) == NM_OK) {
                    o.meta->kind = NM_TABM_PCM_S16;
                    o.meta->sample_rate = nm_tts_sample_rate(b->tts);
                    o.meta->request = request;
                    if ((st = nm_tabm_publish(out, &o)) != NM_OK) nm_tabm_cancel(out, &o);
                    else b->st.n_out_slots++;
                }
            }
            const nm_tts_stats after = nm_tts_get_stats(b->tts);
            b->st.n_out_slots += after.n_slots - before.n_slots;
            b->st.n_samples += after.n_samples - before.n_samples;
            b->st.t_busy += after.t_synth - before.t_synth;
            spoke = spoke || speak;
            if (st == NM_ERR_CANCELLED) return end_cancelled(b, in, out, user, request, true);
            if (st != NM_OK) {
                nm_brick_set_request_error(self, request, "%s", nm_tts_last_error(b->tts)); // (again, if a slot said so)
                b->st.n_requests++;
                b->st.n_bad_requests++;
                if (st == NM_ERR_SHUTDOWN || st == NM_ERR_TIMEOUT) return st;
                // the request must end with a flagged slot: one went out unless synthesis
                // refused the text before writing any
                if (after.n_slots == before.n_slots)
                    return nm_brick_end_request(in, user, out, b->producer, b->wait_ns, NM_TABM_PCM_S16, request,
                                                NM_BRICK_ERROR, &b->st);
                return nm_brick_drain_request(in, user, b->wait_ns, &b->st.n_in_slots);
            }
        } else if (!more) {
            // blank last slot after speech: the previous utterance's last slot said more follows
            nm_tabm_slot o;
            if ((st = nm_tabm_acquire_write(out, b->producer, b->wait_ns, &o)) != NM_OK) return st;
            o.meta->kind = NM_TABM_PCM_S16;
            o.meta->sample_rate = nm_tts_sample_rate(b->tts);
            o.meta->request = request;
            if ((st = nm_tabm_publish(out, &o)) != NM_OK) {
                nm_tabm_cancel(out, &o);
                return st;
            }
            b->st.n_out_slots++;
        }
        if (!more) break;
    }
    b->st.n_requests++;
    return NM_OK;
}

static void tts_stats(void *state, nm_brick_stats *o) { *o = ((tts_brick *)state)->st; }

static size_t tts_slot_bytes(void *state, bool out) {
    const tts_brick *b = state;
    return out ? sizeof(int16_t) * (size_t)(nm_tts_sample_rate(b->tts) / 10) : TTS_TEXT_SLOT;
}

static tts_brick *of(const nm_brick *b) { return nm_brick_state_of(b, &nm_brick_tts_i); }
int32_t nm_brick_tts_sample_rate(const nm_brick *b) { return of(b) ? nm_tts_sample_rate(of(b)->tts) : 0; }
int32_t nm_brick_tts_native_rate(const nm_brick *b) { return of(b) ? nm_tts_native_rate(of(b)->tts) : 0; }
const char *nm_brick_tts_engine(const nm_brick *b) { return of(b) ? nm_tts_engine_name(of(b)->tts) : ""; }

// The speech it makes (about 6 bytes of English text per word at rate_wpm)
// and what the engine spends on it (nothing to speak of for espeak-ng; a
// Piper voice's convolutions and weights).
static nm_status tts_estimate(void *state, const nm_brick_input *in, nm_brick_cost *e) {
    const tts_brick *b = state;
    const double words = (double)(in->n_bytes > 0 ? in->n_bytes : 0) / 6.0;
    const double seconds = words * 60.0 / b->rate_wpm;
    e->n_out = (int64_t)(seconds * nm_tts_sample_rate(b->tts));
    e->act_bytes = 2.0 * (double)e->n_out;
    e->peak_bytes = (uint64_t)(2.0 * seconds * nm_tts_native_rate(b->tts)) + sizeof *b;
    e->n_passes = in->n_bytes > 0 ? 1 : 0;
    nm_tts_estimate(b->tts, seconds, e);
    return NM_OK;
}

static const char *tts_device(void *state) { return nm_tts_device(((tts_brick *)state)->tts); }

const nm_brick_i nm_brick_tts_i = {
    .version = NM_BRICK_I_VERSION,
    .kind = NM_BRICK_TTS,
    .name = "tts",
    .in_ports = NM_PORT_BIT(NM_PORT_TEXT),
    .out_ports = NM_PORT_BIT(NM_PORT_PCM),
    .units = NM_UNIT_BIT(NM_UNIT_CPU) | NM_UNIT_BIT(NM_UNIT_OPENCL), // (OpenCL: a Piper voice's HiFi-GAN)
    .load = tts_load,
    .run = tts_run,
    .release = tts_release,
    .estimate = tts_estimate,
    .stats = tts_stats,
    .device = tts_device,
    .slot_bytes = tts_slot_bytes,
};
