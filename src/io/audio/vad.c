// The utterance cutter (include/nanomind.h, "utterances"): an energy
// detector over frames, with a noise floor that follows the room.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "io/audio/audio.h"
#include "core/fail.h"

struct nm_vad {
    nm_vad_params p;
    int64_t frame;              // samples a frame
    float *cur;                 // the frame being filled
    int64_t n_cur;
    float *hist;                // the last `n_hist` samples before an utterance (pre-roll and start frames), a ring
    int64_t n_hist, hist_cap, hist_head;
    float *utt;                 // the open utterance
    int64_t n_utt, utt_cap, utt_t0;
    bool in;
    int32_t speech_run;         // speech frames in a row (before an utterance)
    int64_t silence;            // samples without speech at the end of the open utterance
    double floor_db;
    bool have_floor;
    int64_t pos;                // samples fed
};

nm_vad_params nm_vad_default_params(void) {
    return (nm_vad_params){.rate = 16000, .frame_ms = 20, .threshold_db = 12.0f, .min_level_dbfs = -50.0f,
                           .start_frames = 3, .end_silence_ms = 800, .pre_ms = 300, .post_ms = 200, .max_ms = 30000};
}

static int64_t ms(const nm_vad *v, int32_t m) { return (int64_t)v->p.rate * m / 1000; }

nm_status nm_vad_create(const nm_vad_params *p, nm_vad **out, char *err, size_t err_size) {
    if (!out) return NM_ERR_INVALID_ARG;
    *out = NULL;
    if (!p) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "vad: no parameters");
    if (p->rate < NM_AUDIO_MIN_RATE || p->rate > NM_AUDIO_MAX_RATE)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "vad: rate %d Hz", p->rate);
    if (p->frame_ms < 5 || p->frame_ms > 100 || p->start_frames < 1 || p->start_frames > 100 ||
        p->end_silence_ms < p->frame_ms || p->end_silence_ms > 10000 || p->pre_ms < 0 || p->pre_ms > 2000 ||
        p->post_ms < 0 || p->post_ms > p->end_silence_ms || p->max_ms < 1000 || p->max_ms > 600000 ||
        !isfinite(p->threshold_db) || p->threshold_db < 0 || !isfinite(p->min_level_dbfs))
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size,
                       "vad: frame_ms 5..100, start_frames 1..100, end_silence_ms frame_ms..10000, pre_ms 0..2000, "
                       "post_ms 0..end_silence_ms, max_ms 1000..600000, threshold_db >= 0");
    nm_vad *v = calloc(1, sizeof *v);
    if (!v) return nm_fail(NM_ERR_NOMEM, err, err_size, "vad: out of memory");
    v->p = *p;
    v->frame = ms(v, p->frame_ms) > 0 ? ms(v, p->frame_ms) : 1;
    v->hist_cap = ms(v, p->pre_ms) + v->frame * p->start_frames;
    v->utt_cap = ms(v, p->max_ms);
    v->cur = malloc(sizeof(float) * (size_t)v->frame);
    v->hist = malloc(sizeof(float) * (size_t)(v->hist_cap > 0 ? v->hist_cap : 1));
    v->utt = malloc(sizeof(float) * (size_t)v->utt_cap);
    if (!v->cur || !v->hist || !v->utt) {
        nm_vad_free(v);
        return nm_fail(NM_ERR_NOMEM, err, err_size, "vad: out of memory");
    }
    *out = v;
    return NM_OK;
}

void nm_vad_free(nm_vad *v) {
    if (!v) return;
    free(v->cur);
    free(v->hist);
    free(v->utt);
    free(v);
}

int64_t nm_vad_position(const nm_vad *v) { return v ? v->pos : 0; }
bool nm_vad_in_speech(const nm_vad *v) { return v && v->in; }

static void hist_add(nm_vad *v, const float *x, int64_t n) {
    for (int64_t i = 0; i < n && v->hist_cap > 0; i++) {
        v->hist[(v->hist_head + v->n_hist) % v->hist_cap] = x[i];
        if (v->n_hist < v->hist_cap) v->n_hist++;
        else v->hist_head = (v->hist_head + 1) % v->hist_cap;
    }
}

static void utt_add(nm_vad *v, const float *x, int64_t n) {
    if (n > v->utt_cap - v->n_utt) n = v->utt_cap - v->n_utt;
    memcpy(v->utt + v->n_utt, x, sizeof(float) * (size_t)n);
    v->n_utt += n;
}

// Ends the open utterance, keeping post_ms of its trailing silence.
static void end_utterance(nm_vad *v, nm_vad_fn fn, void *user) {
    int64_t drop = v->silence - ms(v, v->p.post_ms);
    int64_t n = v->n_utt - (drop > 0 ? drop : 0);
    if (n > 0 && fn) fn(user, v->utt, n, v->utt_t0);
    v->in = false;
    v->n_utt = 0;
    v->silence = 0;
    v->speech_run = 0;
    v->n_hist = v->hist_head = 0;
}

static void frame_done(nm_vad *v, nm_vad_fn fn, void *user) {
    double e = 0;
    for (int64_t i = 0; i < v->frame; i++) e += (double)v->cur[i] * v->cur[i];
    if (!isfinite(e)) e = 0; // a NaN or infinite sample: the frame counts as silence
    const double db = 10.0 * log10(e / (double)v->frame + 1e-12);
    // A louder room: the floor rises 5 dB a second between utterances, 1 dB a
    // second inside one (a long vowel or a steady voice stays speech for
    // (level - floor - threshold) seconds; speech's dips between words reset it).
    if (!v->have_floor || db < v->floor_db) v->floor_db = db, v->have_floor = true;
    else v->floor_db += (v->in ? 1.0 : 5.0) * v->p.frame_ms / 1000.0;
    if (v->floor_db > db) v->floor_db = db;
    const bool speech = db > v->floor_db + v->p.threshold_db && db > v->p.min_level_dbfs;
    const int64_t t_end = v->pos; // the stream position after this frame
    if (!v->in) {
        hist_add(v, v->cur, v->frame);
        v->speech_run = speech ? v->speech_run + 1 : 0;
        if (v->speech_run >= v->p.start_frames) { // an utterance: the pre-roll and the start frames
            v->in = true;
            v->n_utt = 0;
            v->utt_t0 = t_end - v->n_hist;
            for (int64_t i = 0; i < v->n_hist; i++) utt_add(v, &v->hist[(v->hist_head + i) % v->hist_cap], 1);
            v->silence = 0;
        }
        return;
    }
    utt_add(v, v->cur, v->frame);
    v->silence = speech ? 0 : v->silence + v->frame;
    if (v->silence >= ms(v, v->p.end_silence_ms) || v->n_utt >= v->utt_cap) end_utterance(v, fn, user);
}

void nm_vad_push(nm_vad *v, const float *pcm, int64_t n, nm_vad_fn fn, void *user) {
    if (!v || !pcm) return;
    for (int64_t i = 0; i < n;) {
        int64_t k = v->frame - v->n_cur < n - i ? v->frame - v->n_cur : n - i;
        memcpy(v->cur + v->n_cur, pcm + i, sizeof(float) * (size_t)k);
        v->n_cur += k;
        v->pos += k;
        i += k;
        if (v->n_cur == v->frame) {
            frame_done(v, fn, user);
            v->n_cur = 0;
        }
    }
}

void nm_vad_flush(nm_vad *v, nm_vad_fn fn, void *user) {
    if (!v) return;
    if (v->in) {
        utt_add(v, v->cur, v->n_cur);
        v->n_cur = 0;
        end_utterance(v, fn, user);
    }
}
