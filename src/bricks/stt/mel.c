// Whisper log-mel spectrogram on kissfft's FFT (see mel.h). kissfft (BSD-3)
// replaced FFTW (GPL-2). The complex transform of the real frame, not
// kiss_fftr: fftr's extra split pass rounds further from whisper.cpp's own
// FFT (with it, tts_long.ogg's file transcript no longer matched whisper-cli's).
// Either way the mel is within 3e-5 of FFTW's, and a few near-tied greedy
// decodes flip (test_transcribe, k_mel_ties).
#include <kiss_fft.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bricks/stt/mel.h"

struct nm_mel {
    int32_t n_mel;
    const float *filters; // (n_mel, NM_MEL_N_BINS)
    float hann[NM_MEL_N_FFT];
    kiss_fft_cpx frame[NM_MEL_N_FFT]; // the windowed samples (imaginary parts 0)
    kiss_fft_cpx spec[NM_MEL_N_FFT];
    float power[NM_MEL_N_BINS];
    kiss_fft_cfg fft;
};

nm_status nm_mel_create(int32_t n_mel, const float *filters, nm_mel **out) {
    if (!out || !filters || n_mel <= 0 || n_mel > 512) return NM_ERR_INVALID_ARG;
    *out = NULL;
    nm_mel *m = calloc(1, sizeof *m);
    if (!m) return NM_ERR_NOMEM;
    m->n_mel = n_mel;
    m->filters = filters;
    // periodic Hann, as torch.hann_window(400) and whisper.cpp (cosf of a double angle)
    for (int i = 0; i < NM_MEL_N_FFT; i++) m->hann[i] = (float)(0.5 * (1.0 - cosf((float)((2.0 * M_PI * i) / NM_MEL_N_FFT))));
    m->fft = kiss_fft_alloc(NM_MEL_N_FFT, 0, NULL, NULL);
    if (!m->fft) {
        nm_mel_free(m);
        return NM_ERR_NOMEM;
    }
    *out = m;
    return NM_OK;
}

void nm_mel_free(nm_mel *m) {
    if (!m) return;
    kiss_fft_free(m->fft);
    free(m);
}

int64_t nm_mel_n_frames(int64_t n_samples) { return (n_samples + 30 * NM_MEL_SAMPLE_RATE) / NM_MEL_HOP; }

nm_status nm_mel_compute(nm_mel *m, const float *pcm, int64_t n, float *out) {
    if (!m || !pcm || !out || n < 1) return NM_ERR_INVALID_ARG;
    const int64_t n_len = nm_mel_n_frames(n), pad = NM_MEL_N_FFT / 2;
    // The padded signal: reflection of pcm[1..200] at the start, pcm, then zeros.
    // Sample j of it is read through this, without building the 30 s buffer.
    const int64_t n_refl = pad < n - 1 ? pad : n - 1;
    const int64_t n_real = n + pad; // samples before the zero tail (whisper.cpp's n_samples + stage_2_pad)
#define PADDED(j) ((j) < pad ? ((j) >= pad - n_refl ? pcm[pad - (j)] : 0.0f) : ((j) - pad < n ? pcm[(j) - pad] : 0.0f))
    const int64_t n_fft_frames = n_real / NM_MEL_HOP + 1 < n_len ? n_real / NM_MEL_HOP + 1 : n_len;
    for (int64_t i = 0; i < n_fft_frames; i++) {
        const int64_t off = i * NM_MEL_HOP;
        for (int j = 0; j < NM_MEL_N_FFT; j++)
            m->frame[j] = (kiss_fft_cpx){off + j < n_real ? m->hann[j] * PADDED(off + j) : 0.0f, 0.0f};
        kiss_fft(m->fft, m->frame, m->spec);
        for (int k = 0; k < NM_MEL_N_BINS; k++) m->power[k] = m->spec[k].r * m->spec[k].r + m->spec[k].i * m->spec[k].i;
        for (int b = 0; b < m->n_mel; b++) {
            const float *f = m->filters + (size_t)b * NM_MEL_N_BINS;
            double s = 0.0;
            for (int k = 0; k < NM_MEL_N_BINS; k++) s += m->power[k] * f[k];
            out[(size_t)b * n_len + i] = (float)log10(s > 1e-10 ? s : 1e-10);
        }
    }
#undef PADDED
    // frames wholly in the zero tail
    const float floor_db = (float)log10(1e-10);
    for (int b = 0; b < m->n_mel; b++)
        for (int64_t i = n_fft_frames; i < n_len; i++) out[(size_t)b * n_len + i] = floor_db;
    float mx = -1e20f;
    const size_t total = (size_t)m->n_mel * (size_t)n_len;
    for (size_t i = 0; i < total; i++) mx = out[i] > mx ? out[i] : mx;
    mx -= 8.0f;
    for (size_t i = 0; i < total; i++) out[i] = ((out[i] < mx ? mx : out[i]) + 4.0f) / 4.0f;
    return NM_OK;
}
