// Internal to src/io/audio: the sink every reader pushes mono samples
// into. It checks samples, enforces the duration cap, resamples (soxr,
// streaming) when the rates differ, and grows the output buffer.
#ifndef NM_AUDIO_IMPL_H
#define NM_AUDIO_IMPL_H

#include "io/audio/audio.h"
#include "core/fail.h"

typedef struct nm_audio_sink {
    int32_t rate_in, rate_out;
    int64_t max_out;   // cap on output samples
    int64_t max_in;    // the same duration in input frames
    int64_t in_frames; // pushed so far
    void *soxr;        // soxr_t; NULL when rate_in == rate_out
    float *pcm;        // (cap,) output, owned until handed over by finish (not when external)
    int64_t n, cap;
    bool external;     // pcm is the caller's buffer (nm_audio_sink_init_into): never grown or freed
} nm_audio_sink;

// NM_OK if rate is within the limits, else NM_ERR_INVALID_ARG naming `what`.
nm_status nm_audio_check_rate(const char *what, int32_t rate, char *err, size_t err_size);

// max_out <= 0: NM_AUDIO_MAX_SECONDS * rate_out. Both rates must be checked.
nm_status nm_audio_sink_init(nm_audio_sink *s, int32_t rate_in, int32_t rate_out, int64_t max_out,
                             char *err, size_t err_size);
// As nm_audio_sink_init, writing into the caller's dst (cap samples: also the
// cap on the output); finish hands out dst itself.
nm_status nm_audio_sink_init_into(nm_audio_sink *s, int32_t rate_in, int32_t rate_out, float *dst, int64_t cap,
                                  char *err, size_t err_size);
// Appends n mono samples at rate_in. NM_ERR_FORMAT on a NaN/inf (named by its
// input frame), NM_ERR_RANGE once the input is longer than the cap allows.
nm_status nm_audio_sink_push(nm_audio_sink *s, const float *mono, int64_t n, char *err, size_t err_size);
// Flushes the resampler and moves the result into *out (sink emptied).
// NM_ERR_FORMAT if nothing was pushed.
nm_status nm_audio_sink_finish(nm_audio_sink *s, nm_audio *out, char *err, size_t err_size);
// Frees what the sink holds (safe after finish, and on a zeroed sink).
void nm_audio_sink_free(nm_audio_sink *s);

#endif
