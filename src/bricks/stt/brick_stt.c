// The speech-to-text brick (nm_brick_i, include/nanomind.h): a PCM slot in,
// the transcript's segments out as TEXT slots, each written as its 30 s
// window is decoded, then an empty slot that ends the request (so a reader starts on the first sentence while the rest
// of a long utterance is still being decoded). The samples are read in place:
// the log-mel spectrogram is computed from the slot's payload.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bricks/brick_impl.h"
#include "bricks/stt/mel.h"
#include "bricks/stt/transcribe.h"
#include "core/clock.h"
#include "core/fail.h"
#include "quant/quant.h"


typedef struct stt_brick {
    nm_whisper_model *model;
    nm_transcriber *tr;
    nm_stt_params p;
    nm_transcript last;  // the last request's transcript
    uint32_t producer;
    int64_t timeout_ns;
    int64_t wait_ns;          // this run's waits: timeout_ns, or in nm_brick_step nm_brick_wait_ns's
    // the request being served
    nm_tabm *in, *out;
    uint64_t request;
    bool cancelled;      // its cancellation stopped the transcription
    char req_lang[16];   // a PARAMS slot's language
    int32_t *req_prompt; // a PARAMS slot's prompt, tokenized (cap_prompt ids)
    int32_t cap_prompt;
    int32_t n_written;   // segments of `last` written as slots
    nm_status out_st;    // the first failure writing them
    nm_brick_stats st;
    char err[256];
} stt_brick;

static void stt_release(void *state) {
    stt_brick *b = state;
    if (!b) return;
    nm_transcript_free(&b->last);
    free(b->req_prompt);
    nm_transcriber_free(b->tr);
    nm_whisper_model_free(b->model);
    free(b);
}

static nm_status stt_load(const nm_brick_params *p, void **state, char *err, size_t err_size) {
    if (!p->model) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "stt brick: no Whisper model file");
    if (p->device && strcmp(p->device, "cpu") != 0)
        return nm_fail(NM_ERR_UNSUPPORTED, err, err_size, "stt brick: runs on the CPU only, not on '%s'", p->device);
    stt_brick *b = calloc(1, sizeof *b);
    if (!b) return nm_fail(NM_ERR_NOMEM, err, err_size, "stt brick: out of memory");
    nm_status st = nm_whisper_model_load(p->model, &b->model, err, err_size);
    if (st == NM_OK) st = nm_transcriber_create(b->model, p->n_threads, p->stt_max_decoders, &b->tr, err, err_size);
    if (st != NM_OK) {
        stt_release(b);
        return st;
    }
    b->p = p->stt;
    b->producer = p->producer;
    b->timeout_ns = b->wait_ns = p->timeout_ns;
    *state = b;
    return NM_OK;
}

// Publishes segment i of the last transcript as a TEXT slot.
static nm_status put_segment(stt_brick *b, int32_t i, bool more) {
    nm_tabm_slot o;
    nm_status st = nm_tabm_acquire_write(b->out, b->producer, b->wait_ns, &o);
    if (st != NM_OK) return st;
    size_t n = 0;
    int64_t t0 = 0, t1 = 0;
    if (i >= 0) {
        const nm_stt_segment *sg = &b->last.seg[i];
        n = strlen(sg->text);
        if (n > o.capacity) n = o.capacity; // the text is what the brick makes: written once, here
        memcpy(o.data, sg->text, n);
        t0 = sg->t0;
        t1 = sg->t1;
    }
    o.meta->kind = NM_TABM_TEXT;
    o.meta->ndim = n > 0 ? 1 : 0; // a segment of no text (whisper.cpp keeps them) has ndim 0 too: NM_BRICK_MORE tells
    o.meta->shape[0] = (int64_t)n;
    o.meta->shape[1] = t0;
    o.meta->shape[2] = t1;
    o.meta->size = n;
    o.meta->user = more ? NM_BRICK_MORE : 0;
    o.meta->request = b->request;
    if ((st = nm_tabm_publish(b->out, &o)) != NM_OK) {
        nm_tabm_cancel(b->out, &o);
        return st;
    }
    b->st.n_out_slots++;
    return NM_OK;
}

// After each window: its segments go out (an empty slot ends the request,
// since only the end of the audio tells which segment is the last).
static void on_segments(const nm_transcript *t, int32_t i0, void *user) {
    stt_brick *b = user;
    b->last = *t; // the transcript grows in place: read its segments through this copy
    for (; b->out_st == NM_OK && b->n_written < t->n_seg; b->n_written++)
        b->out_st = put_segment(b, b->n_written, true);
    if (b->p.on_segments) b->p.on_segments(t, i0, b->p.user);
}

// A request's PARAMS slot over the brick's parameters, into *p (this request only).
static nm_status take_params(stt_brick *b, const nm_tabm_slot *s, nm_stt_params *p) {
    char why[200] = "";
    cJSON *o = nm_req_parse(s, "stt brick", why, sizeof why);
    if (!o) return nm_fail(NM_ERR_FORMAT, b->err, sizeof b->err, "%s", why);
    const char *lang = NULL;
    double d = 0;
    int64_t i = 0;
    int k = nm_req_string(o, "language", sizeof b->req_lang - 1, &lang, why, sizeof why);
    if (k == 1) {
        snprintf(b->req_lang, sizeof b->req_lang, "%s", lang); // checked by the transcription
        p->language = b->req_lang;
    }
    if (k >= 0) k = nm_req_bool(o, "translate", &p->translate, why, sizeof why);
    if (k >= 0) k = nm_req_bool(o, "no_timestamps", &p->no_timestamps, why, sizeof why);
    if (k >= 0) k = nm_req_bool(o, "token_timestamps", &p->token_timestamps, why, sizeof why);
    // whisper-server's prompt: its tokens go before the previous text (whisper-cli --prompt)
    const char *prompt = NULL;
    if (k >= 0 && (k = nm_req_string(o, "prompt", NM_STT_MAX_PROMPT, &prompt, why, sizeof why)) == 1) {
        const int32_t n = nm_whisper_tokenize(b->model, prompt, NULL, 0);
        if (n > b->cap_prompt) {
            int32_t *t = n > 0 ? realloc(b->req_prompt, sizeof(int32_t) * (size_t)n) : NULL;
            if (t) b->req_prompt = t, b->cap_prompt = n;
        }
        if (n < 0 || n > b->cap_prompt) {
            nm_req_free(o);
            return nm_fail(NM_ERR_NOMEM, b->err, sizeof b->err, "stt brick: out of memory for the prompt");
        }
        nm_whisper_tokenize(b->model, prompt, b->req_prompt, n);
        p->prompt_tokens = b->req_prompt;
        p->n_prompt_tokens = n;
    }
    if (k >= 0) k = nm_req_bool(o, "carry_initial_prompt", &p->carry_initial_prompt, why, sizeof why);
    if (k >= 0 && (k = nm_req_number(o, "temperature", 0, 2, &d, why, sizeof why)) == 1) p->temperature = (float)d;
    if (k >= 0 && (k = nm_req_number(o, "temperature_inc", 0, 2, &d, why, sizeof why)) == 1) p->temperature_inc = (float)d;
    if (k >= 0 && (k = nm_req_int(o, "best_of", 1, NM_STT_MAX_DECODERS, &i, why, sizeof why)) == 1) p->best_of = (int32_t)i;
    // whisper-server's beam_size: above 1 a beam search of that width, else greedy
    if (k >= 0 && (k = nm_req_int(o, "beam_size", 1, NM_STT_MAX_DECODERS, &i, why, sizeof why)) == 1) {
        p->strategy = i > 1 ? NM_STT_BEAM : NM_STT_GREEDY;
        p->beam_size = (int32_t)i;
    }
    nm_req_free(o);
    if (k < 0)
        return nm_fail(NM_ERR_FORMAT, b->err, sizeof b->err, "stt brick: parameters slot %llu: %s",
                       (unsigned long long)s->meta->seq, why);
    return NM_OK;
}

// Whisper stops before its next window once the output ring is gone (a long
// recording would otherwise be decoded for nobody, and the lane could not end).
static bool output_gone(void *user) {
    stt_brick *b = user;
    if (nm_tabm_request_cancelled(b->in, b->request)) return b->cancelled = true; // and a cancelled request
    return b->out_st != NM_OK || nm_tabm_is_shutdown(b->out) ||
           (b->p.abort_callback && b->p.abort_callback(b->p.abort_user)); // and the caller's own
}

static nm_status stt_run(void *state, nm_brick *self, nm_tabm *in, nm_tabm *out) {
    stt_brick *b = state;
    b->wait_ns = nm_brick_wait_ns(self, b->timeout_ns);
    nm_tabm_slot s;
    nm_stt_params p = b->p;
    b->err[0] = '\0';
    bool first = true;
    nm_status pst = NM_OK; // the PARAMS slot's verdict
    for (;;) {
        nm_status st = nm_tabm_acquire_read(in, b->wait_ns, &s);
        if (st != NM_OK) {
            if (st == NM_ERR_SHUTDOWN) nm_tabm_shutdown(out);
            else nm_brick_set_error(self, "stt brick: waiting for a PCM slot: %s", nm_status_str(st));
            return st;
        }
        b->st.n_in_slots++;
        if (!first || s.meta->kind != NM_TABM_PARAMS || !(s.meta->user & NM_BRICK_MORE)) break;
        b->request = s.meta->request; // a request's parameters, then its audio
        pst = take_params(b, &s, &p);
        nm_tabm_release(in, &s);
        first = false;
    }
    nm_status st = pst;
    b->st.n_requests++;
    nm_transcript_free(&b->last);
    memset(&b->last, 0, sizeof b->last);
    b->in = in;
    b->out = out;
    if (first) b->request = s.meta->request;
    b->n_written = 0;
    b->out_st = NM_OK;
    b->cancelled = false;
    const nm_tabm_meta *mt = s.meta;
    const uint64_t user = mt->user;
    int64_t n = mt->ndim >= 1 ? mt->shape[0] : 0;
    if (st != NM_OK) {
        // the parameters were refused: the request fails
    } else if (nm_req_cancelled(in, user, b->request)) {
        b->cancelled = true;
    } else if (mt->kind != NM_TABM_PCM_F32) {
        st = nm_fail(NM_ERR_FORMAT, b->err, sizeof b->err, "stt brick: slot of kind %u, want PCM f32 (%d)", mt->kind,
                     NM_TABM_PCM_F32);
    } else if (mt->ndim < 1 || mt->ndim > 2 || (mt->ndim == 2 && mt->shape[1] != 1) || n < 0 ||
               (uint64_t)n * sizeof(float) != mt->size || mt->size > s.capacity) {
        st = nm_fail(NM_ERR_FORMAT, b->err, sizeof b->err,
                     "stt brick: a PCM slot must be mono float [n] or [n, 1] with size 4n bytes");
    } else if (mt->sample_rate != NM_MEL_SAMPLE_RATE) {
        st = nm_fail(NM_ERR_FORMAT, b->err, sizeof b->err, "stt brick: PCM slot at %d Hz, Whisper needs %d Hz",
                     mt->sample_rate, NM_MEL_SAMPLE_RATE);
    } else if (user & NM_BRICK_MORE) {
        st = nm_fail(NM_ERR_FORMAT, b->err, sizeof b->err,
                     "stt brick: a request is one PCM slot (this one says more follow)");
    } else {
        p.on_segments = on_segments;
        p.user = b;
        p.abort_callback = output_gone;
        p.abort_user = b;
        nm_transcript t;
        const double t0 = nm_now_s();
        st = nm_transcribe(b->tr, (const float *)s.data, n, &p, &t, b->err, sizeof b->err);
        b->st.t_busy += nm_now_s() - t0;
        if (st == NM_OK) {
            b->last = t;
            b->st.n_samples += (uint64_t)n;
            b->st.n_segments += (uint64_t)t.n_seg;
        } else {
            memset(&b->last, 0, sizeof b->last); // freed by nm_transcribe
        }
    }
    nm_tabm_release(in, &s);
    if (b->cancelled && b->out_st == NM_OK) { // the segments written stay; the request ends flagged
        b->st.n_cancelled++;
        return nm_brick_end_request(in, user, out, b->producer, b->wait_ns, NM_TABM_TEXT, b->request, NM_BRICK_CANCELLED,
                                    &b->st);
    }
    if (st == NM_OK) {
        // any segment not out yet, then the empty slot that ends the request
        for (; b->out_st == NM_OK && b->n_written < b->last.n_seg; b->n_written++)
            b->out_st = put_segment(b, b->n_written, true);
        if (b->out_st == NM_OK) b->out_st = put_segment(b, -1, false);
        if (b->out_st != NM_OK) {
            nm_brick_set_error(self, "stt brick: output ring: %s", nm_status_str(b->out_st));
            if (b->out_st == NM_ERR_SHUTDOWN) nm_tabm_shutdown(in);
            return b->out_st;
        }
        return NM_OK;
    }
    b->st.n_bad_requests++;
    nm_brick_set_request_error(self, b->request, "%s: %s", nm_status_str(st), b->err);
    if (b->out_st != NM_OK) return b->out_st;
    // a request is one slot: any that said more follow are read and dropped with it
    return nm_brick_end_request(in, user, out, b->producer, b->wait_ns, NM_TABM_TEXT, b->request, NM_BRICK_ERROR, &b->st);
}

static nm_status stt_set_params(void *state, const nm_brick_params *p, char *err, size_t err_size) {
    ((stt_brick *)state)->p = p->stt; // checked by the transcription of each request
    return NM_OK;
}

static void stt_stats(void *state, nm_brick_stats *o) { *o = ((stt_brick *)state)->st; }

static size_t stt_slot_bytes(void *state, bool out) {
    return out ? 4096 : sizeof(float) * 30 * (size_t)NM_MEL_SAMPLE_RATE;
}

static stt_brick *of(const nm_brick *b) { return nm_brick_state_of(b, &nm_brick_stt_i); }
const nm_transcript *nm_brick_stt_transcript(const nm_brick *b) { return of(b) ? &of(b)->last : NULL; }

bool nm_brick_stt_info(const nm_brick *b, nm_stt_model_info *o) {
    memset(o, 0, sizeof *o);
    if (!of(b)) return false;
    const nm_whisper_model *m = of(b)->model;
    *o = (nm_stt_model_info){.name = m->name, .format = m->format == NM_WHISPER_GGUF ? "gguf" : "ggml .bin",
                             .multilingual = nm_whisper_is_multilingual(m), .n_vocab = m->hp.n_vocab,
                             .n_audio_ctx = m->hp.n_audio_ctx, .n_audio_state = m->hp.n_audio_state,
                             .n_audio_head = m->hp.n_audio_head, .n_audio_layer = m->hp.n_audio_layer,
                             .n_text_ctx = m->hp.n_text_ctx, .n_text_state = m->hp.n_text_state,
                             .n_text_head = m->hp.n_text_head, .n_text_layer = m->hp.n_text_layer,
                             .n_mels = m->hp.n_mels, .wtype = m->wtype, .token_eot = m->special.eot};
    return true;
}

int32_t nm_brick_stt_lang_id(const nm_brick *b, const char *code) {
    return of(b) && code ? nm_stt_lang_id(of(b)->model, code) : -1;
}

int32_t nm_brick_stt_tokenize(const nm_brick *b, const char *text, int32_t *out, int32_t cap) {
    return of(b) ? nm_whisper_tokenize(of(b)->model, text, out, cap) : -1;
}

const char *nm_brick_stt_token_text(const nm_brick *b, int32_t id, char buf[24], uint32_t *len) {
    return of(b) ? nm_whisper_token_text_cpp(of(b)->model, id, buf, len) : NULL;
}

nm_stt_timings nm_brick_stt_timings(const nm_brick *b) {
    nm_stt_timings z = {0};
    return of(b) ? nm_transcriber_timings(of(b)->tr) : z;
}

// ---- estimate ---------------------------------------------------------------------------
static double attn_mm(nm_brick_cost *e, const nm_whisper_attn *a, double rows, double passes, bool qo_only) {
    double b = nm_cost_matmul(e, &a->q_w, rows, passes) + nm_cost_matmul(e, &a->o_w, rows, passes);
    if (!qo_only) b += nm_cost_matmul(e, &a->k_w, rows, passes) + nm_cost_matmul(e, &a->v_w, rows, passes);
    return b;
}

// Per 30 s window: the two convolutions, the encoder over n_audio_ctx
// positions, each decoder layer's cross K/V, then the decoder: a prompt of a
// few tokens and about 3 tokens per second of speech (English read at ~150
// words a minute), times the beam or best-of sequences, each step reading
// every decoder weight once for all of them (beams are decoded together).
static nm_status stt_estimate(void *state, const nm_brick_input *in, nm_brick_cost *e) {
    const stt_brick *b = state;
    const nm_whisper_model *m = b->model;
    const nm_whisper_hparams *hp = &m->hp;
    const int64_t win = 30 * (int64_t)NM_MEL_SAMPLE_RATE;
    const int64_t n = in->n_samples > 0 ? in->n_samples : 0;
    const double windows = n > 0 ? (double)((n + win - 1) / win) : 0;
    const double d = hp->n_audio_state, actx = hp->n_audio_ctx;
    const int32_t seqs = b->p.strategy == NM_STT_BEAM ? b->p.beam_size : 1;
    const double tokens = 4.0 + 3.0 * (double)n / NM_MEL_SAMPLE_RATE / (windows > 0 ? windows : 1); // per window
    const double steps = tokens;                                                                 // decode passes per window
    double wb = 0;
    // convolutions: kernel 3 over n_mels -> d at 2 * actx frames, then d -> d at actx
    const double conv = 2.0 * 3.0 * (hp->n_mels * d * 2.0 * actx + d * d * actx) * windows;
    e->flops += conv;
    e->flops_by_type[0] += conv;
    for (int32_t il = 0; il < hp->n_audio_layer; il++) {
        const nm_whisper_enc_layer *L = &m->enc[il];
        wb += attn_mm(e, &L->attn, actx * windows, windows, false);
        wb += nm_cost_matmul(e, &L->mlp.fc1_w, actx * windows, windows) + nm_cost_matmul(e, &L->mlp.fc2_w, actx * windows, windows);
        const double att = 4.0 * actx * actx * d * windows;
        e->flops += att;
        e->flops_by_type[0] += att;
    }
    const double rows = tokens * seqs * windows; // decoder rows
    for (int32_t il = 0; il < hp->n_text_layer; il++) {
        const nm_whisper_dec_layer *L = &m->dec[il];
        wb += attn_mm(e, &L->attn, rows, steps * windows, false);
        wb += attn_mm(e, &L->cross, rows, steps * windows, true);
        wb += nm_cost_matmul(e, &L->cross.k_w, actx * windows, windows) + nm_cost_matmul(e, &L->cross.v_w, actx * windows, windows);
        wb += nm_cost_matmul(e, &L->mlp.fc1_w, rows, steps * windows) + nm_cost_matmul(e, &L->mlp.fc2_w, rows, steps * windows);
        const double att = 4.0 * rows * d * (actx + tokens / 2.0);
        e->flops += att;
        e->flops_by_type[0] += att;
        e->act_bytes += 2.0 * 4.0 * rows * d * actx; // cross K and V read per row
    }
    wb += nm_cost_matmul(e, &m->d_te, rows, steps * windows); // the tied output head
    e->n_passes = (int64_t)(windows * (1 + steps));
    e->n_out = (int64_t)(tokens * windows);
    e->weight_bytes = m->bytes_mapped + m->bytes_copied;
    e->act_bytes += 4.0 * (windows * actx * d * 16.0 * hp->n_audio_layer) + 4.0 * (double)n;
    // the spectrogram of the whole request, the encoder's buffers, the decoders' caches
    e->peak_bytes = e->weight_bytes + (uint64_t)(4.0 * hp->n_mels * ((double)n / 160.0 + 3000.0)) +
                    (uint64_t)(4.0 * actx * d * 8.0) +
                    (uint64_t)(2.0 * 2.0 * hp->n_text_layer * (double)hp->n_text_ctx * d * seqs) +
                    (uint64_t)(2.0 * 2.0 * hp->n_text_layer * actx * d);
    (void)wb;
    return NM_OK;
}

const nm_brick_i nm_brick_stt_i = {
    .version = NM_BRICK_I_VERSION,
    .kind = NM_BRICK_STT,
    .name = "stt",
    .in_ports = NM_PORT_BIT(NM_PORT_PCM),
    .out_ports = NM_PORT_BIT(NM_PORT_TEXT),
    .units = NM_UNIT_BIT(NM_UNIT_CPU),
    .load = stt_load,
    .run = stt_run,
    .release = stt_release,
    .estimate = stt_estimate,
    .stats = stt_stats,
    .device = NULL,
    .slot_bytes = stt_slot_bytes,
    .set_params = stt_set_params,
};
