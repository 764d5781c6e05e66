// The sample sink (checks, duration cap, growth) and the soxr resampler.
#include "io/audio/audio_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <soxr.h>

nm_status nm_audio_check_rate(const char *what, int32_t rate, char *err, size_t err_size) {
    if (rate < NM_AUDIO_MIN_RATE || rate > NM_AUDIO_MAX_RATE)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "audio: %s %d Hz is outside %d..%d Hz", what,
                       (int)rate, NM_AUDIO_MIN_RATE, NM_AUDIO_MAX_RATE);
    return NM_OK;
}

nm_status nm_audio_sink_init(nm_audio_sink *s, int32_t rate_in, int32_t rate_out, int64_t max_out,
                             char *err, size_t err_size) {
    *s = (nm_audio_sink){.rate_in = rate_in, .rate_out = rate_out};
    s->max_out = max_out > 0 ? max_out : (int64_t)NM_AUDIO_MAX_SECONDS * rate_out;
    if (s->max_out > (int64_t)1 << 40) s->max_out = (int64_t)1 << 40; // keeps the products below in range
    s->max_in = s->max_out / rate_out * rate_in + s->max_out % rate_out * rate_in / rate_out;
    if (rate_in == rate_out) return NM_OK;
    soxr_error_t e = NULL;
    soxr_io_spec_t io = soxr_io_spec(SOXR_FLOAT32_I, SOXR_FLOAT32_I);
    soxr_quality_spec_t q = soxr_quality_spec(SOXR_HQ, 0); // see audio.h for why HQ
    soxr_runtime_spec_t rt = soxr_runtime_spec(1);          // one thread: bricks own the cores
    s->soxr = soxr_create((double)rate_in, (double)rate_out, 1, &e, &io, &q, &rt);
    if (!s->soxr || e)
        return nm_fail(NM_ERR_NOMEM, err, err_size, "audio: cannot create the %d -> %d Hz resampler: %s",
                       (int)rate_in, (int)rate_out, e ? e : "unknown error");
    return NM_OK;
}

nm_status nm_audio_sink_init_into(nm_audio_sink *s, int32_t rate_in, int32_t rate_out, float *dst, int64_t cap,
                                  char *err, size_t err_size) {
    nm_status st = nm_audio_sink_init(s, rate_in, rate_out, cap, err, err_size);
    s->pcm = dst;
    s->cap = cap;
    s->external = true;
    return st;
}

// Room for `more` samples past s->n.
static nm_status reserve(nm_audio_sink *s, int64_t more, char *err, size_t err_size) {
    int64_t need = s->n + more;
    if (need <= s->cap) return NM_OK;
    if (s->external)
        return nm_fail(NM_ERR_RANGE, err, err_size, "audio: more than the %lld samples the buffer holds",
                       (long long)s->cap);
    int64_t cap = s->cap ? s->cap : 16384;
    while (cap < need) cap *= 2;
    // Growth past the cap (+ soxr's flush margin) is never needed: push stops first.
    float *p = realloc(s->pcm, (size_t)cap * sizeof *p);
    if (!p)
        return nm_fail(NM_ERR_NOMEM, err, err_size, "audio: out of memory for %lld samples",
                       (long long)cap);
    s->pcm = p;
    s->cap = cap;
    return NM_OK;
}

// Feeds n samples (in may be NULL with n 0: flush) through soxr into the output.
static nm_status run_soxr(nm_audio_sink *s, const float *in, int64_t n, char *err, size_t err_size) {
    soxr_t x = s->soxr;
    double ratio = (double)s->rate_out / s->rate_in;
    for (int guard = 0;; guard++) {
        // Enough room that soxr can take all of `in` in one call (it keeps
        // the filter's history internally); flushing drains in a few rounds.
        int64_t room = (int64_t)ceil((double)n * ratio) + 4096;
        if (s->external && room > s->cap - s->n) { // the caller's buffer: what is left of it
            room = s->cap - s->n;
            if (room == 0) { // full: the filter's tail past the cap is dropped, as finish drops it
                if (!in) return NM_OK;
                return nm_fail(NM_ERR_RANGE, err, err_size, "audio: more than the %lld samples the buffer holds",
                               (long long)s->cap);
            }
        }
        nm_status st = reserve(s, room, err, err_size);
        if (st != NM_OK) return st;
        size_t idone = 0, odone = 0;
        soxr_error_t e = soxr_process(x, in, (size_t)n, in ? &idone : NULL, s->pcm + s->n, (size_t)room, &odone);
        if (e) return nm_fail(NM_ERR_FORMAT, err, err_size, "audio: resampler: %s", e);
        s->n += (int64_t)odone;
        if (in) {
            in += idone;
            n -= (int64_t)idone;
            if (n == 0) return NM_OK;
        } else if (odone == 0) {
            return NM_OK;
        }
        if (guard > 1000000)
            return nm_fail(NM_ERR_FORMAT, err, err_size, "audio: resampler made no progress");
    }
}

nm_status nm_audio_sink_push(nm_audio_sink *s, const float *mono, int64_t n, char *err, size_t err_size) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(mono[i]))
            return nm_fail(NM_ERR_FORMAT, err, err_size, "audio: sample %lld is %s",
                           (long long)(s->in_frames + i), isnan(mono[i]) ? "NaN" : "infinite");
    // Duration cap on the input side: in_frames / rate_in <= max_out / rate_out.
    int64_t total = s->in_frames + n;
    if (total > s->max_in)
        return nm_fail(NM_ERR_RANGE, err, err_size,
                       "audio: too long: over %lld samples (%.1f s) at %d Hz, the limit", (long long)s->max_out,
                       (double)s->max_out / s->rate_out, (int)s->rate_out);
    s->in_frames = total;
    if (!s->soxr) {
        nm_status st = reserve(s, n, err, err_size);
        if (st != NM_OK) return st;
        memcpy(s->pcm + s->n, mono, (size_t)n * sizeof *mono);
        s->n += n;
        return NM_OK;
    }
    return run_soxr(s, mono, n, err, err_size);
}

nm_status nm_audio_sink_finish(nm_audio_sink *s, nm_audio *out, char *err, size_t err_size) {
    *out = (nm_audio){0};
    if (s->in_frames == 0) return nm_fail(NM_ERR_FORMAT, err, err_size, "audio: no samples");
    if (s->soxr) {
        nm_status st = run_soxr(s, NULL, 0, err, err_size);
        if (st != NM_OK) return st;
    }
    if (s->n > s->max_out) s->n = s->max_out; // the filter's tail may add a sample
    if (s->n == 0) {
        // Very short input downsampled a lot (e.g. 1 frame at 384 kHz to 1 kHz).
        return nm_fail(NM_ERR_FORMAT, err, err_size, "audio: %lld samples at %d Hz is too short to resample to %d Hz",
                       (long long)s->in_frames, (int)s->rate_in, (int)s->rate_out);
    }
    // Finite in gives finite out, unless huge (~1e38) samples overflow the filter.
    for (int64_t i = 0; i < s->n; i++)
        if (!isfinite(s->pcm[i]))
            return nm_fail(NM_ERR_FORMAT, err, err_size,
                           "audio: samples too large to resample (output %lld is not finite)", (long long)i);
    float *p = s->external ? s->pcm : realloc(s->pcm, (size_t)s->n * sizeof *p); // shrink to fit
    if (p) s->pcm = p;
    *out = (nm_audio){.pcm = s->pcm, .n = s->n, .rate = s->rate_out};
    s->pcm = NULL;
    s->n = s->cap = 0;
    return NM_OK;
}

void nm_audio_sink_free(nm_audio_sink *s) {
    if (s->soxr) soxr_delete(s->soxr);
    if (!s->external) free(s->pcm);
    *s = (nm_audio_sink){0};
}

nm_status nm_audio_resample(const float *in, int64_t n, int32_t rate_in, int32_t rate_out, nm_audio *out,
                            char *err, size_t err_size) {
    if (err && err_size) err[0] = '\0';
    if (!out) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "audio: no output");
    *out = (nm_audio){0};
    if (n < 0 || (!in && n)) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "audio: no input");
    nm_status st = nm_audio_check_rate("input rate", rate_in, err, err_size);
    if (st == NM_OK) st = nm_audio_check_rate("output rate", rate_out, err, err_size);
    if (st != NM_OK) return st;
    nm_audio_sink s;
    st = nm_audio_sink_init(&s, rate_in, rate_out, 0, err, err_size);
    // Chunked so a long buffer does not make soxr allocate one huge block.
    for (int64_t i = 0; st == NM_OK && i < n; i += 1 << 16)
        st = nm_audio_sink_push(&s, in + i, n - i < (1 << 16) ? n - i : 1 << 16, err, err_size);
    if (st == NM_OK) st = nm_audio_sink_finish(&s, out, err, err_size);
    nm_audio_sink_free(&s);
    return st;
}
