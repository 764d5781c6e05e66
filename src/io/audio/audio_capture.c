// Microphone capture through ALSA (built when pkg-config finds alsa:
// NM_HAVE_ALSA). Without it, nm_audio_capture says so with NM_ERR_UNSUPPORTED.
#include "io/audio/audio_impl.h"

#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef NM_HAVE_ALSA
#include <alsa/asoundlib.h>
#endif

#define CAPTURE_CHUNK_MS 100 // frames handed to on_chunk at a time

nm_audio_capture_params nm_audio_capture_default_params(void) {
    return (nm_audio_capture_params){
        .device = "default", .rate = NM_AUDIO_RATE, .format = NM_PCM_S16LE, .seconds = 5.0};
}

bool nm_audio_capture_available(void) {
#ifdef NM_HAVE_ALSA
    return true;
#else
    return false;
#endif
}

#ifdef NM_HAVE_ALSA
// ALSA prints its own diagnostics to stderr (e.g. "cannot find card '0'" for
// every attempt); we return its reason in err instead.
static void alsa_quiet(const char *file, int line, const char *function, int e, const char *fmt, ...) {}

static void close_quietly(snd_pcm_t *pcm) {
    snd_lib_error_set_handler(alsa_quiet);
    snd_pcm_close(pcm);
    snd_lib_error_set_handler(NULL);
}
#endif

nm_status nm_audio_capture(const nm_audio_capture_params *p, nm_audio *out, char *err, size_t err_size) {
    if (err && err_size) err[0] = '\0';
    if (!out) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "audio: no output");
    *out = (nm_audio){0};
    if (!p) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "audio: no capture parameters");
    nm_status st = nm_audio_check_rate("capture rate", p->rate, err, err_size);
    if (st != NM_OK) return st;
    if (p->format != NM_PCM_S16LE && p->format != NM_PCM_F32LE)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "audio: unknown capture format %d", (int)p->format);
    if (p->stream && !p->on_chunk)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "audio: a streamed capture needs an on_chunk callback");
    if (!(p->seconds > 0) && !p->on_chunk)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size,
                       "audio: capture needs a duration (seconds > 0) or an on_chunk callback to stop it");
    const char *dev = p->device ? p->device : "default";
#ifndef NM_HAVE_ALSA
    return nm_fail(NM_ERR_UNSUPPORTED, err, err_size,
                   "audio: cannot capture from %s: nanomind was built without ALSA (install libasound2-dev and rebuild)",
                   dev);
#else
    const double max_s = NM_AUDIO_MAX_SECONDS;
    int64_t want = (int64_t)((p->seconds > 0 && p->seconds < max_s ? p->seconds : max_s) * p->rate + 0.5);
    if (p->stream && !(p->seconds > 0)) want = INT64_MAX; // kept nowhere: no cap
    if (want < 1) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "audio: capture of %g s is empty", p->seconds);

    snd_pcm_t *pcm = NULL;
    snd_lib_error_set_handler(alsa_quiet);
    int rc = snd_pcm_open(&pcm, dev, SND_PCM_STREAM_CAPTURE, 0);
    if (rc < 0) {
        snd_lib_error_set_handler(NULL);
        return nm_fail(NM_ERR_IO, err, err_size, "audio: cannot open capture device '%s': %s", dev,
                       snd_strerror(rc));
    }
    const snd_pcm_format_t fmt = p->format == NM_PCM_S16LE ? SND_PCM_FORMAT_S16 : SND_PCM_FORMAT_FLOAT; // native endian
    // Mono first; a hw: device may only do stereo, which we average.
    int channels = 1;
    rc = snd_pcm_set_params(pcm, fmt, SND_PCM_ACCESS_RW_INTERLEAVED, 1, (unsigned)p->rate, 1, 200000);
    if (rc < 0) {
        channels = 2;
        rc = snd_pcm_set_params(pcm, fmt, SND_PCM_ACCESS_RW_INTERLEAVED, 2, (unsigned)p->rate, 1, 200000);
    }
    snd_lib_error_set_handler(NULL);
    if (rc < 0) {
        close_quietly(pcm);
        return nm_fail(NM_ERR_IO, err, err_size, "audio: capture device '%s' refuses %s at %d Hz: %s", dev,
                       p->format == NM_PCM_S16LE ? "s16" : "float", (int)p->rate, snd_strerror(rc));
    }

    const int64_t chunk = p->rate * CAPTURE_CHUNK_MS / 1000 > 0 ? p->rate * CAPTURE_CHUNK_MS / 1000 : 1;
    const size_t bs = p->format == NM_PCM_S16LE ? 2 : 4;
    uint8_t *raw = malloc((size_t)chunk * channels * bs);
    float *mono = malloc((size_t)chunk * sizeof *mono);
    nm_audio_sink s;
    memset(&s, 0, sizeof s);
    int64_t taken = 0; // samples captured (s.n when they are kept)
    if (!p->stream) st = nm_audio_sink_init(&s, p->rate, p->rate, want, err, err_size);
    if (st == NM_OK && (!raw || !mono)) st = nm_fail(NM_ERR_NOMEM, err, err_size, "audio: out of memory");
    int overruns = 0;
    while (st == NM_OK && taken < want) {
        int64_t k = want - taken < chunk ? want - taken : chunk;
        // Some plugins (ALSA's "null") report frames without writing them:
        // start from silence so they read as such, not as stale memory.
        memset(raw, 0, (size_t)k * channels * bs);
        snd_pcm_sframes_t got = snd_pcm_readi(pcm, raw, (snd_pcm_uframes_t)k);
        if (got == -EAGAIN || got == -EINTR) continue;
        if (got == -EPIPE || got == -ESTRPIPE) { // overrun / suspend: lose those frames, keep going
            if (++overruns > 100 || snd_pcm_recover(pcm, (int)got, 1) < 0)
                st = nm_fail(NM_ERR_IO, err, err_size, "audio: capture from '%s' keeps failing: %s", dev,
                             snd_strerror((int)got));
            continue;
        }
        if (got < 0) {
            st = nm_fail(NM_ERR_IO, err, err_size, "audio: capture from '%s' failed: %s", dev,
                         snd_strerror((int)got));
            break;
        }
        if (got == 0) continue;
        overruns = 0; // "keeps failing" means 100 in a row, not 100 in an hour of listening
        for (snd_pcm_sframes_t i = 0; i < got; i++) {
            float acc = 0.0f;
            for (int c = 0; c < channels; c++) {
                const uint8_t *q = raw + ((size_t)i * channels + c) * bs;
                if (bs == 2) {
                    int16_t v;
                    memcpy(&v, q, 2);
                    acc += (float)v * (1.0f / 32768.0f);
                } else {
                    float v;
                    memcpy(&v, q, 4);
                    acc += v;
                }
            }
            mono[i] = acc / (float)channels;
        }
        taken += got;
        if (p->stream) {
            if (p->on_chunk(mono, got, p->user)) break;
            continue;
        }
        st = nm_audio_sink_push(&s, mono, got, err, err_size);
        if (st == NM_OK && p->on_chunk && p->on_chunk(s.pcm + s.n - got, got, p->user)) break;
    }
    if (st == NM_OK && !p->stream) st = nm_audio_sink_finish(&s, out, err, err_size);
    if (!p->stream) nm_audio_sink_free(&s);
    free(raw);
    free(mono);
    close_quietly(pcm);
    return st;
#endif
}

// ---- playback -------------------------------------------------------------------------
struct nm_audio_player {
#ifdef NM_HAVE_ALSA
    snd_pcm_t *pcm;
#endif
    char device[128];
};

nm_status nm_audio_player_open(const char *device, int32_t rate, nm_audio_player **out, char *err, size_t err_size) {
    if (err && err_size) err[0] = '\0';
    if (!out) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "audio: no output");
    *out = NULL;
    nm_status st = nm_audio_check_rate("playback rate", rate, err, err_size);
    if (st != NM_OK) return st;
    const char *dev = device ? device : "default";
#ifndef NM_HAVE_ALSA
    return nm_fail(NM_ERR_UNSUPPORTED, err, err_size,
                   "audio: cannot play on %s: nanomind was built without ALSA (install libasound2-dev and rebuild)", dev);
#else
    nm_audio_player *p = calloc(1, sizeof *p);
    if (!p) return nm_fail(NM_ERR_NOMEM, err, err_size, "audio: out of memory");
    snprintf(p->device, sizeof p->device, "%s", dev);
    snd_lib_error_set_handler(alsa_quiet);
    int rc = snd_pcm_open(&p->pcm, dev, SND_PCM_STREAM_PLAYBACK, 0);
    if (rc >= 0) rc = snd_pcm_set_params(p->pcm, SND_PCM_FORMAT_S16, SND_PCM_ACCESS_RW_INTERLEAVED, 1, (unsigned)rate, 1,
                                         200000);
    snd_lib_error_set_handler(NULL);
    if (rc < 0) {
        st = nm_fail(NM_ERR_IO, err, err_size, "audio: cannot play on '%s' (mono s16 at %d Hz): %s", dev, (int)rate,
                     snd_strerror(rc));
        if (p->pcm) close_quietly(p->pcm);
        free(p);
        return st;
    }
    *out = p;
    return NM_OK;
#endif
}

nm_status nm_audio_player_write(nm_audio_player *p, const int16_t *pcm, int64_t n, char *err, size_t err_size) {
    if (!p || (n > 0 && !pcm) || n < 0) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "audio: bad playback buffer");
#ifdef NM_HAVE_ALSA
    int recovered = 0;
    while (n > 0) {
        snd_pcm_sframes_t w = snd_pcm_writei(p->pcm, pcm, (snd_pcm_uframes_t)n);
        if (w == -EAGAIN || w == -EINTR) continue;
        if (w < 0) {
            if (++recovered > 100 || snd_pcm_recover(p->pcm, (int)w, 1) < 0)
                return nm_fail(NM_ERR_IO, err, err_size, "audio: playback on '%s' failed: %s", p->device,
                               snd_strerror((int)w));
            continue; // an underrun: the device starts again
        }
        pcm += w;
        n -= w;
    }
#endif
    return NM_OK;
}

nm_status nm_audio_player_drain(nm_audio_player *p, char *err, size_t err_size) {
    if (!p) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "audio: no player");
#ifdef NM_HAVE_ALSA
    int rc = snd_pcm_drain(p->pcm);
    if (rc < 0) return nm_fail(NM_ERR_IO, err, err_size, "audio: playback on '%s': %s", p->device, snd_strerror(rc));
    snd_pcm_prepare(p->pcm); // ready for more
#endif
    return NM_OK;
}

void nm_audio_player_close(nm_audio_player *p) {
    if (!p) return;
#ifdef NM_HAVE_ALSA
    close_quietly(p->pcm);
#endif
    free(p);
}
