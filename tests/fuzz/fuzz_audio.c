// Fuzz target for audio input: decode arbitrary bytes as an audio file
// (libsndfile: WAV, FLAC, OGG, AIFF, ...) to mono 16 kHz, as the speech brick
// would, and read the same bytes as raw PCM with a format, rate, channel count
// and output rate taken from the first four bytes (so the resampler sees odd
// ratios). Checks the contracts that do not depend on the bytes: a failure
// leaves the output empty and says why; a success gives 1..cap samples at the
// asked rate, all finite.
// Seeds: tests/fuzz/corpus/audio (written by `NM_GEN_CORPUS=DIR test_audio --filter gen_corpus`).
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/audio/audio.h"

// libsndfile 1.2's Ogg Vorbis reader leaks the vorbis_info it initialised when
// a stream's headers are bad (vorbis_read_header returns before
// vorbis_info_clear): ~5.7 KB per refused file, in the library, not here.
// LeakSanitizer reads this hook (sanitizer builds only; unused otherwise).
const char *__lsan_default_suppressions(void);
__attribute__((used)) const char *__lsan_default_suppressions(void) { return "leak:vorbis_info_init\n"; }

#define CAP (1 << 15) // output samples: ~2 s at 16 kHz keeps each input fast

static volatile float sink;

static void check(nm_status st, const nm_audio *a, const char *err, int32_t rate) {
    if (st != NM_OK) {
        if (a->pcm || a->n || a->rate || err[0] == '\0') abort(); // failures leave *out empty and say why
        return;
    }
    if (!a->pcm || a->n < 1 || a->n > CAP || a->rate != rate) abort();
    float acc = 0;
    for (int64_t i = 0; i < a->n; i++) {
        if (!isfinite(a->pcm[i])) abort();
        acc += a->pcm[i];
    }
    sink = acc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    nm_audio a = {(float *)1, 7, 7};
    char err[256] = "";
    nm_status st = nm_audio_decode_max(data, size, 16000, CAP, &a, err, sizeof err);
    check(st, &a, err, 16000);
    nm_audio_free(&a);

    if (size < 4) return 0;
    static const int32_t rates[8] = {8000, 16000, 44100, 48000, 1000, 384000, 11025, 999};
    const nm_pcm_format fmt = data[0] & 1 ? NM_PCM_F32LE : NM_PCM_S16LE;
    const int32_t rate = rates[data[1] & 7];
    const int32_t channels = data[2] % 34; // 0 and 33 are refused
    const int32_t target = data[3] & 1 ? 16000 : rates[(data[3] >> 1) & 7];
    err[0] = '\0';
    st = nm_audio_from_raw_max(data + 4, size - 4, fmt, rate, channels, target, CAP, &a, err, sizeof err);
    const bool args_ok = rate >= NM_AUDIO_MIN_RATE && target >= NM_AUDIO_MIN_RATE && channels >= 1 &&
                         channels <= NM_AUDIO_MAX_CHANNELS;
    if (!args_ok && st != NM_ERR_INVALID_ARG) abort();
    check(st, &a, err, target);
    nm_audio_free(&a);
    return 0;
}
