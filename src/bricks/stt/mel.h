// Whisper's log-mel spectrogram: 16 kHz mono audio -> n_mel bands x frames of
// 10 ms (25 ms periodic Hann window, 400-point FFT, hop 160), computed the way
// whisper.cpp does it so that both see the same input: 200 samples of
// reflection at the start, 30 s of zeros at the end, log10 of the mel power
// (floor 1e-10), clamped to 8 (decades) below the maximum, then (x + 4) / 4.
// The filterbank comes from the model file (n_mel x 201).
#ifndef NM_STT_MEL_H
#define NM_STT_MEL_H

#include <stdint.h>

#include "nanomind.h"

#define NM_MEL_SAMPLE_RATE 16000
#define NM_MEL_N_FFT 400
#define NM_MEL_HOP 160
#define NM_MEL_N_BINS (NM_MEL_N_FFT / 2 + 1)

typedef struct nm_mel nm_mel;

// filters: n_mel rows of NM_MEL_N_BINS floats, borrowed for the life of the
// object. Sets up the FFT once (kissfft; thread-safe).
nm_status nm_mel_create(int32_t n_mel, const float *filters, nm_mel **out);
void nm_mel_free(nm_mel *m);

// Frames for n samples: (n + 30 s) / hop, as whisper.cpp (the 30 s of padding
// lets the last window be a whole 3000 frames).
int64_t nm_mel_n_frames(int64_t n_samples);

// Computes the spectrogram of pcm[0..n) into out: n_mel rows (bands) of
// nm_mel_n_frames(n) floats. n >= 1. Not thread-safe on one nm_mel.
nm_status nm_mel_compute(nm_mel *m, const float *pcm, int64_t n, float *out);

#endif
