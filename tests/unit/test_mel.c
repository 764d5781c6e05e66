// Whisper log-mel spectrogram against a direct double-precision DFT of the
// same padded, windowed frames, and its shape on known signals.
#include <math.h>
#include <stdlib.h>

#include "bricks/stt/mel.h"
#include "nmtest.h"

#define N_MEL 8

// Band b sums bins [25b, 25b + 25): a crude filterbank, enough to test the arithmetic.
static void box_filters(float *f) {
    for (int b = 0; b < N_MEL; b++)
        for (int k = 0; k < NM_MEL_N_BINS; k++) f[b * NM_MEL_N_BINS + k] = (k >= 25 * b && k < 25 * b + 25) ? 1.0f : 0.0f;
}

// log10 mel power of frame i, before the clamp, by a direct DFT.
static void direct_frame(const float *pcm, int64_t n, int64_t i, const float *filt, double *out) {
    double x[NM_MEL_N_FFT];
    const int64_t pad = 200;
    for (int j = 0; j < NM_MEL_N_FFT; j++) {
        int64_t p = i * NM_MEL_HOP + j; // index into the padded signal
        double v = 0;
        if (p < pad) v = (pad - p <= n - 1) ? pcm[pad - p] : 0.0;
        else if (p - pad < n) v = pcm[p - pad];
        x[j] = v * 0.5 * (1 - cos(2 * M_PI * j / NM_MEL_N_FFT));
    }
    for (int b = 0; b < N_MEL; b++) out[b] = 0;
    for (int k = 0; k < NM_MEL_N_BINS; k++) {
        double re = 0, im = 0;
        for (int j = 0; j < NM_MEL_N_FFT; j++) {
            re += x[j] * cos(2 * M_PI * k * j / NM_MEL_N_FFT);
            im -= x[j] * sin(2 * M_PI * k * j / NM_MEL_N_FFT);
        }
        for (int b = 0; b < N_MEL; b++) out[b] += (re * re + im * im) * filt[b * NM_MEL_N_BINS + k];
    }
    for (int b = 0; b < N_MEL; b++) out[b] = log10(out[b] > 1e-10 ? out[b] : 1e-10);
}

NM_TEST(mel_equals_direct_dft) {
    static float filt[N_MEL * NM_MEL_N_BINS];
    box_filters(filt);
    const int64_t n = 16000 + 123; // odd length: the last frames straddle the end
    float *pcm = malloc(sizeof(float) * n);
    uint64_t s = 1;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        pcm[i] = 0.3f * sinf(2 * (float)M_PI * 440.0f * i / 16000) + 0.05f * ((float)(s >> 40) / 16777216.0f - 0.5f);
    }
    nm_mel *m = NULL;
    NM_CHECK(nm_mel_create(N_MEL, filt, &m) == NM_OK);
    const int64_t T = nm_mel_n_frames(n);
    NM_CHECK(T == (n + 480000) / 160);
    float *out = malloc(sizeof(float) * N_MEL * T);
    NM_CHECK(nm_mel_compute(m, pcm, n, out) == NM_OK);
    // the clamp floor and scaling, from the direct maximum
    double mx = -1e20, d[N_MEL];
    static double all[N_MEL][120];
    const int64_t frames[] = {0, 1, 2, 50, 99, 100, 101, 102, 103, 110};
    int nf = (int)(sizeof frames / sizeof frames[0]);
    for (int64_t i = 0; i < 120; i++) { // frames past (n + 200) / 160 are wholly in the zero tail
        direct_frame(pcm, n, i, filt, d);
        for (int b = 0; b < N_MEL; b++) {
            mx = fmax(mx, d[b]);
            if (i < 120) all[b][i] = d[b];
        }
    }
    double maxd = 0;
    for (int f = 0; f < nf; f++)
        for (int b = 0; b < N_MEL; b++) {
            double want = (fmax(all[b][frames[f]], mx - 8.0) + 4.0) / 4.0;
            maxd = fmax(maxd, fabs(want - out[b * T + frames[f]]));
            if (getenv("NM_TEST_VERBOSE")) fprintf(stderr, "  f %lld b %d want %g got %g\n", (long long)frames[f], b, want, out[b * T + frames[f]]);
        }
    if (maxd >= 2e-4) fprintf(stderr, "  max diff %g\n", maxd);
    NM_CHECK(maxd < 2e-4);
    // the zero tail sits at the floor
    NM_CHECK_NEAR(out[3 * T + T - 1], (fmax(-10.0, mx - 8.0) + 4.0) / 4.0, 1e-5);
    // the 440 Hz tone is in band 0 (bins 0..24 = 0..1000 Hz), far above band 5
    NM_CHECK(out[0 * T + 50] > out[5 * T + 50] + 0.5);
    free(out);
    free(pcm);
    nm_mel_free(m);
}

NM_TEST(mel_short_and_bad_input) {
    static float filt[N_MEL * NM_MEL_N_BINS];
    box_filters(filt);
    nm_mel *m = NULL;
    NM_CHECK(nm_mel_create(0, filt, &m) == NM_ERR_INVALID_ARG && m == NULL);
    NM_CHECK(nm_mel_create(N_MEL, NULL, &m) == NM_ERR_INVALID_ARG);
    NM_CHECK(nm_mel_create(N_MEL, filt, &m) == NM_OK);
    float one = 0.5f, *out = malloc(sizeof(float) * N_MEL * nm_mel_n_frames(1));
    NM_CHECK(nm_mel_compute(m, &one, 1, out) == NM_OK); // a single sample: no reflection, no crash
    for (int64_t i = 0; i < N_MEL * nm_mel_n_frames(1); i++) NM_CHECK(isfinite(out[i]));
    NM_CHECK(nm_mel_compute(m, &one, 0, out) == NM_ERR_INVALID_ARG);
    free(out);
    nm_mel_free(m);
}

NM_TEST_MAIN()
