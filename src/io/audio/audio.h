// Audio input/output for the speech bricks (Whisper in, espeak-ng out).
//
// Everything here produces one shape: mono float PCM at a chosen rate
// (Whisper wants 16 kHz), nominally in [-1, 1].
//
//   reading   libsndfile opens the container (WAV, FLAC, OGG Vorbis/Opus, AIFF,
//             AU, CAF, W64, MP3 where the library was built with it, ...),
//             from a path, from memory, or from stdin ("-"). Integer samples
//             come back as v / 2^(bits-1) (libsndfile's normalisation: s16
//             -32768..32767 -> -1..32767/32768), float samples as stored.
//   mono      channels are AVERAGED (sum / channels) per frame: no channel is
//             preferred and a stereo recording of one voice keeps its level.
//   resample  soxr, SOXR_HQ (20-bit precision, ~120 dB stop-band rejection,
//             linear phase, pass band to 91.3% of the output Nyquist, i.e.
//             7.3 kHz at 16 kHz). HQ, not VHQ: our inputs are 16-bit at best
//             (~96 dB), so 20-bit precision already sits below the input's own
//             noise floor; VHQ's longer filters cost CPU for nothing audible to
//             the model. Done only when the rates differ; the stream is fed
//             in chunks, so memory is the output plus a fixed working set.
//   writing   16-bit PCM WAV (our own writer, no dependency): a float x is
//             stored as clamp(lrint(x * 32768), -32768, 32767), the exact
//             inverse of the reader's normalisation, so 16-bit values survive
//             a write/read round trip bit for bit.
//
// Limits (errors, never crashes): sample rates NM_AUDIO_MIN_RATE..
// NM_AUDIO_MAX_RATE, 1..NM_AUDIO_MAX_CHANNELS channels, at most
// NM_AUDIO_MAX_SECONDS of audio (checked on the input's duration before and
// during decoding, so a hostile header cannot make us allocate hours of
// output), NaN / infinite samples rejected, and stdin / pipes read fully up to
// NM_AUDIO_MAX_BUFFER_BYTES.
//
// Status codes: NM_ERR_INVALID_ARG (a caller's argument: NULL output, a rate or
// channel count outside the limits, unknown raw format), NM_ERR_IO (cannot
// open / read / write a path or device), NM_ERR_FORMAT (corrupt, truncated or
// empty data, NaN/inf samples, a partial raw frame), NM_ERR_UNSUPPORTED (a
// format libsndfile does not recognise or an encoding it cannot decode;
// capture without ALSA), NM_ERR_RANGE (a header's rate or channel count
// outside the limits, audio too long), NM_ERR_NOMEM. The message in err (may
// be NULL with err_size 0) says which and where.
//
// Thread safety: calls on different buffers may run concurrently, except that
// libsndfile keeps the error text of a failed open in a global, so two opens
// failing at the same moment may swap messages (the status is still right).
#ifndef NM_AUDIO_AUDIO_H
#define NM_AUDIO_AUDIO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nanomind.h"

// The reading and writing calls, the limits and nm_audio are public
// (include/nanomind.h, "audio"); the contract above is theirs. Internal:

// (nm_audio_decode_max is public too.)

// As nm_audio_from_raw with the same cap.
nm_status nm_audio_from_raw_max(const void *data, size_t n, nm_pcm_format fmt, int32_t rate,
                                int32_t channels, int32_t target_rate, int64_t max_samples, nm_audio *out,
                                char *err, size_t err_size);

// Microphone capture, playback and the utterance cutter: include/nanomind.h ("audio").

#endif
