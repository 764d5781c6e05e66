// Audio I/O (src/io/audio): files written here with our WAV writer and
// with libsndfile (WAV of several sample formats, FLAC, OGG Vorbis) are read
// back and compared sample by sample (or, for Vorbis, by frequency and level);
// resampling keeps a tone's frequency and amplitude; raw PCM; every error case;
// truncated and bit-flipped files never crash; capture skips without a device.
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sndfile.h>
#include <soxr.h>
#include <time.h>

#include "io/audio/audio.h"
#include "nmtest.h"

// libsndfile 1.2's Ogg Vorbis reader leaks the vorbis_info it initialised when
// a stream's headers are bad (vorbis_read_header returns before
// vorbis_info_clear): ~5.7 KB per refused file, in the library, not here.
// LeakSanitizer reads this hook (sanitizer builds only; unused otherwise).
const char *__lsan_default_suppressions(void);
__attribute__((used)) const char *__lsan_default_suppressions(void) { return "leak:vorbis_info_init\n"; }

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

// ---- helpers ------------------------------------------------------------------------

static char tmp_dir[64];

// A path in this run's temp dir (created on first use, removed at exit).
static const char *tmp_path(const char *name) {
    static char p[4][256];
    static int k;
    if (!tmp_dir[0]) {
        snprintf(tmp_dir, sizeof tmp_dir, "/tmp/nm_test_audio_XXXXXX");
        if (!mkdtemp(tmp_dir)) {
            perror("mkdtemp");
            exit(1);
        }
    }
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", tmp_dir, name);
    return p[k];
}

static void cleanup_tmp(void) {
    if (!tmp_dir[0]) return;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp_dir);
}

// x[i] = amp * sin(2 pi f i / rate)
static float *tone(int64_t n, double rate, double f, double amp) {
    float *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; i < n; i++) x[i] = (float)(amp * sin(2 * M_PI * f * (double)i / rate));
    return x;
}

// A linear sweep f0 -> f1 over n samples.
static float *sweep(int64_t n, double rate, double f0, double f1, double amp) {
    float *x = malloc((size_t)n * sizeof *x);
    double T = (double)n / rate;
    for (int64_t i = 0; i < n; i++) {
        double t = (double)i / rate;
        x[i] = (float)(amp * sin(2 * M_PI * (f0 * t + (f1 - f0) * t * t / (2 * T))));
    }
    return x;
}

// Frequency from upward zero crossings (linearly interpolated) in [a, b).
static double zc_freq(const float *x, int64_t a, int64_t b, double rate) {
    double first = -1, last = -1;
    int64_t k = 0;
    for (int64_t i = a; i + 1 < b; i++) {
        if (x[i] < 0 && x[i + 1] >= 0) {
            double t = i + x[i] / (x[i] - x[i + 1]);
            if (first < 0) first = t;
            last = t;
            k++;
        }
    }
    return k < 2 ? 0 : (double)(k - 1) * rate / (last - first);
}

// Amplitude of a sine from its RMS over [a, b).
static double amp_of(const float *x, int64_t a, int64_t b) {
    double s = 0;
    for (int64_t i = a; i < b; i++) s += (double)x[i] * x[i];
    return sqrt(2 * s / (double)(b - a));
}

// Power of frequency f in x[a, b) relative to a full-scale sine (Goertzel).
static double goertzel_amp(const float *x, int64_t a, int64_t b, double rate, double f) {
    double w = 2 * M_PI * f / rate, c = 2 * cos(w), s1 = 0, s2 = 0;
    for (int64_t i = a; i < b; i++) {
        double s0 = x[i] + c * s1 - s2;
        s2 = s1;
        s1 = s0;
    }
    double p = s1 * s1 + s2 * s2 - c * s1 * s2;
    return 2 * sqrt(p) / (double)(b - a);
}

// Writes frames with libsndfile in the given format.
static int sf_write(const char *path, int format, int rate, int ch, const float *x, int64_t frames) {
    SF_INFO info = {.samplerate = rate, .channels = ch, .format = format};
    SNDFILE *sf = sf_open(path, SFM_WRITE, &info);
    if (!sf) {
        fprintf(stderr, "  sf_open(%s): %s\n", path, sf_strerror(NULL));
        return -1;
    }
    sf_count_t w = sf_writef_float(sf, x, frames);
    sf_close(sf);
    return w == frames ? 0 : -1;
}

static uint8_t *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(len > 0 ? (size_t)len : 1);
    *n = fread(b, 1, (size_t)len, f);
    fclose(f);
    return b;
}

static void write_file(const char *path, const void *d, size_t n) {
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(d, 1, n, f);
        fclose(f);
    }
}

// Makes fd 0 read `path` (for the "-" tests).
static int stdin_from(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    int r = dup2(fd, 0);
    close(fd);
    clearerr(stdin);
    return r;
}

static bool all_finite(const nm_audio *a) {
    for (int64_t i = 0; i < a->n; i++)
        if (!isfinite(a->pcm[i])) return false;
    return true;
}

// 16-bit values of a sweep, plus the extremes.
static void s16_signal(int16_t *q, int64_t n) {
    float *x = sweep(n, 16000, 50, 7000, 0.9);
    for (int64_t i = 0; i < n; i++) q[i] = (int16_t)lrintf(x[i] * 32767.0f);
    q[0] = -32768;
    q[1] = 32767;
    q[2] = 0;
    q[3] = -1;
    free(x);
}

// ---- reading and writing ------------------------------------------------------------

NM_TEST(wav_own_writer_roundtrip_exact) {
    enum { N = 12000 };
    int16_t q[N];
    s16_signal(q, N);
    float x[N];
    for (int i = 0; i < N; i++) x[i] = q[i] / 32768.0f;
    const char *p = tmp_path("own.wav");
    char err[256];
    NM_CHECK(nm_audio_write_wav(p, x, N, 16000, 1, err, sizeof err) == NM_OK);
    // libsndfile reads our header and the exact 16-bit values.
    SF_INFO info = {0};
    SNDFILE *sf = sf_open(p, SFM_READ, &info);
    NM_CHECK(sf != NULL);
    if (sf) {
        NM_CHECK(info.samplerate == 16000 && info.channels == 1 && info.frames == N);
        NM_CHECK(info.format == (SF_FORMAT_WAV | SF_FORMAT_PCM_16));
        short back[N];
        NM_CHECK(sf_readf_short(sf, back, N) == N);
        NM_CHECK(memcmp(back, q, sizeof q) == 0);
        sf_close(sf);
    }
    size_t fn = 0;
    uint8_t *bytes = read_file(p, &fn);
    NM_CHECK(fn == 44 + 2 * N);
    free(bytes);
    // ... and so do we, from the path and from memory.
    nm_audio a;
    NM_CHECK(nm_audio_load(p, 0, &a, err, sizeof err) == NM_OK);
    NM_CHECK(a.n == N && a.rate == 16000);
    int bad = 0;
    for (int i = 0; i < N && a.n == N; i++) bad += a.pcm[i] != x[i];
    NM_CHECK(bad == 0);
    nm_audio_free(&a);
    NM_CHECK(a.pcm == NULL && a.n == 0);
    nm_audio_free(&a); // twice is fine
    nm_audio_free(NULL);
}

NM_TEST(wav_writer_clamps_and_rounds) {
    const float x[] = {1.0f, 1.5f, -1.0f, -3.0f, 0.5f / 32768.0f, -0.49f / 32768.0f, 100.4f / 32768.0f};
    const short want[] = {32767, 32767, -32768, -32768, 0, 0, 100};
    const char *p = tmp_path("clamp.wav");
    NM_CHECK(nm_audio_write_wav(p, x, 7, 8000, 1, NULL, 0) == NM_OK);
    SF_INFO info = {0};
    SNDFILE *sf = sf_open(p, SFM_READ, &info);
    short back[7] = {0};
    NM_CHECK(sf && sf_readf_short(sf, back, 7) == 7);
    if (sf) sf_close(sf);
    NM_CHECK(memcmp(back, want, sizeof want) == 0);
    // Stereo, interleaved.
    const float st[] = {0.25f, -0.25f, 0.5f, -0.5f};
    NM_CHECK(nm_audio_write_wav(p, st, 2, 22050, 2, NULL, 0) == NM_OK);
    info = (SF_INFO){0};
    sf = sf_open(p, SFM_READ, &info);
    NM_CHECK(sf && info.channels == 2 && info.samplerate == 22050 && info.frames == 2);
    short b2[4] = {0};
    if (sf) {
        NM_CHECK(sf_readf_short(sf, b2, 2) == 2);
        sf_close(sf);
    }
    NM_CHECK(b2[0] == 8192 && b2[1] == -8192 && b2[2] == 16384 && b2[3] == -16384);
    // "-" writes to stdout (redirected to a file here).
    const char *po = tmp_path("stdout.wav");
    fflush(stdout);
    int saved = dup(1), fd = open(po, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    NM_CHECK(saved >= 0 && fd >= 0 && dup2(fd, 1) == 1);
    nm_status wst = nm_audio_write_wav("-", st, 2, 22050, 2, NULL, 0);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    close(fd);
    NM_CHECK(wst == NM_OK);
    size_t n1 = 0, n2 = 0;
    uint8_t *f1 = read_file(po, &n1), *f2 = read_file(p, &n2);
    NM_CHECK(f1 && f2 && n1 == 52 && n1 == n2 && !memcmp(f1, f2, n1));
    free(f1);
    free(f2);
    // No frames: a valid, empty file (which the reader then rejects as empty).
    NM_CHECK(nm_audio_write_wav(p, NULL, 0, 16000, 1, NULL, 0) == NM_OK);
    nm_audio a;
    char err[256];
    NM_CHECK(nm_audio_load(p, 16000, &a, err, sizeof err) == NM_ERR_FORMAT);
    NM_CHECK(strstr(err, "no audio") != NULL);
}

NM_TEST(wav_sndfile_formats) {
    // u8, s16, s24, s32, f32, f64 through libsndfile; mono at odd rates and stereo.
    struct { int fmt; const char *name; double tol; } fmts[] = {
        // libsndfile writes round(x * (2^(b-1) - 1)) and reads v / 2^(b-1): within 2 steps.
        {SF_FORMAT_WAV | SF_FORMAT_PCM_U8, "u8", 2.0 / 128},
        {SF_FORMAT_WAV | SF_FORMAT_PCM_16, "s16", 2.0 / 32768},
        {SF_FORMAT_WAV | SF_FORMAT_PCM_24, "s24", 2.0 / 8388608},
        {SF_FORMAT_WAV | SF_FORMAT_PCM_32, "s32", 1e-7},
        {SF_FORMAT_WAV | SF_FORMAT_FLOAT, "f32", 0},
        {SF_FORMAT_WAV | SF_FORMAT_DOUBLE, "f64", 1e-7},
        {SF_FORMAT_AIFF | SF_FORMAT_PCM_16, "aiff", 2.0 / 32768},
        {SF_FORMAT_WAVEX | SF_FORMAT_PCM_16, "wavex", 2.0 / 32768},
        {SF_FORMAT_CAF | SF_FORMAT_PCM_16, "caf", 2.0 / 32768},
        {SF_FORMAT_AU | SF_FORMAT_ULAW, "au mu-law", 0.03},
    };
    enum { N = 4000 };
    float *x = sweep(N, 11025, 100, 4000, 0.7);
    for (size_t k = 0; k < sizeof fmts / sizeof fmts[0]; k++) {
        const char *p = tmp_path("fmt.bin");
        NM_CHECK(sf_write(p, fmts[k].fmt, 11025, 1, x, N) == 0);
        nm_audio a;
        char err[256];
        nm_status st = nm_audio_load(p, 0, &a, err, sizeof err);
        if (st != NM_OK) fprintf(stderr, "  %s: %s\n", fmts[k].name, err);
        NM_CHECK(st == NM_OK && a.n == N && a.rate == 11025);
        double worst = 0;
        for (int64_t i = 0; i < a.n; i++) worst = fmax(worst, fabs(a.pcm[i] - x[i]));
        if (!(worst <= fmts[k].tol)) fprintf(stderr, "  %s: worst error %g\n", fmts[k].name, worst);
        NM_CHECK(worst <= fmts[k].tol);
        nm_audio_free(&a);
    }
    free(x);
}

NM_TEST(stereo_is_averaged) {
    enum { N = 8000 };
    float *l = sweep(N, 16000, 200, 3000, 0.8), *r = tone(N, 16000, 440, 0.5);
    float lr[2 * N];
    for (int i = 0; i < N; i++) {
        // Quantize to 16 bits first so the file holds exactly these values.
        lr[2 * i] = roundf(l[i] * 32768.0f) / 32768.0f;
        lr[2 * i + 1] = roundf(r[i] * 32768.0f) / 32768.0f;
    }
    const char *p = tmp_path("stereo.wav");
    NM_CHECK(nm_audio_write_wav(p, lr, N, 16000, 2, NULL, 0) == NM_OK);
    nm_audio a;
    char err[256];
    NM_CHECK(nm_audio_load(p, 16000, &a, err, sizeof err) == NM_OK);
    NM_CHECK(a.n == N);
    int bad = 0;
    for (int i = 0; i < N && a.n == N; i++) bad += a.pcm[i] != (lr[2 * i] + lr[2 * i + 1]) / 2;
    NM_CHECK(bad == 0);
    nm_audio_free(&a);
    // Opposite channels cancel: a 6-channel file with +x, -x pairs is silent.
    float six[6 * 100];
    for (int i = 0; i < 100; i++)
        for (int c = 0; c < 6; c++) six[6 * i + c] = (c & 1 ? -1.0f : 1.0f) * (float)(i % 7) / 8.0f;
    NM_CHECK(sf_write(p, SF_FORMAT_WAV | SF_FORMAT_FLOAT, 16000, 6, six, 100) == 0);
    NM_CHECK(nm_audio_load(p, 0, &a, err, sizeof err) == NM_OK && a.n == 100);
    double e = 0;
    for (int64_t i = 0; i < a.n; i++) e += fabs(a.pcm[i]);
    NM_CHECK(e == 0);
    nm_audio_free(&a);
    free(l);
    free(r);
}

NM_TEST(flac_lossless_from_memory) {
    enum { N = 16000 };
    int16_t q[N];
    s16_signal(q, N);
    float x[N];
    for (int i = 0; i < N; i++) x[i] = q[i] / 32768.0f;
    const char *p = tmp_path("a.flac");
    SF_INFO info = {.samplerate = 16000, .channels = 1, .format = SF_FORMAT_FLAC | SF_FORMAT_PCM_16};
    SNDFILE *sf = sf_open(p, SFM_WRITE, &info);
    NM_CHECK(sf && sf_writef_short(sf, q, N) == N); // shorts: exactly these values in the file
    if (sf) sf_close(sf);
    size_t n = 0;
    uint8_t *d = read_file(p, &n);
    NM_CHECK(d && n > 4 && !memcmp(d, "fLaC", 4) && n < sizeof q); // really compressed FLAC
    nm_audio a;
    char err[256];
    NM_CHECK(nm_audio_decode(d, n, 16000, &a, err, sizeof err) == NM_OK);
    NM_CHECK(a.n == N && a.rate == 16000);
    int bad = 0;
    for (int i = 0; i < N && a.n == N; i++) bad += a.pcm[i] != x[i];
    NM_CHECK(bad == 0);
    nm_audio_free(&a);
    free(d);
}

NM_TEST(ogg_vorbis_close) {
    enum { N = 32000 };
    float *x = tone(N, 16000, 1000, 0.5);
    const char *p = tmp_path("a.ogg");
    NM_CHECK(sf_write(p, SF_FORMAT_OGG | SF_FORMAT_VORBIS, 16000, 1, x, N) == 0);
    nm_audio a;
    char err[256];
    NM_CHECK(nm_audio_load(p, 16000, &a, err, sizeof err) == NM_OK);
    NM_CHECK(llabs(a.n - N) <= 64);
    if (a.n > 8000) {
        double f = zc_freq(a.pcm, 2000, a.n - 2000, 16000), amp = amp_of(a.pcm, 2000, a.n - 2000);
        NM_CHECK_NEAR(f, 1000, 1.0);
        NM_CHECK_NEAR(amp, 0.5, 0.025);
        NM_CHECK_NEAR(goertzel_amp(a.pcm, 2000, 2000 + 16000, 16000, 1000), 0.5, 0.025);
    }
    nm_audio_free(&a);
    free(x);
}

// ---- the streamed encoder (nm_audio_encoder_*) --------------------------------------

typedef struct membuf { uint8_t *b; size_t n, cap; int calls, stop_after; } membuf;
static bool to_mem(const void *bytes, size_t n, void *user) {
    membuf *m = user;
    if (m->stop_after && ++m->calls > m->stop_after) return false;
    if (m->n + n > m->cap) {
        size_t cap = (m->n + n) * 2;
        uint8_t *b = realloc(m->b, cap);
        if (!b) return false;
        m->b = b, m->cap = cap;
    }
    memcpy(m->b + m->n, bytes, n);
    m->n += n;
    return true;
}

// 1.5 s of a 1 kHz tone at 24 kHz (the server's speech rate), fed in chunks of 960 as the
// TTS brick's slots come, into each container, and decoded back: the same tone, the
// same length (the codecs' own delay and padding aside), FLAC to the sample.
NM_TEST(encoder_flac_mp3_opus_roundtrip) {
    enum { N = 36000, R = 24000 };
    float *x = tone(N, R, 1000, 0.5);
    int16_t *s16 = malloc(sizeof(int16_t) * N);
    for (int i = 0; i < N && x && s16; i++) s16[i] = (int16_t)lrintf(x[i] * 32767.0f);
    static const char *const magic[] = {[NM_AUDIO_FLAC] = "fLaC", [NM_AUDIO_MP3] = "\xff", [NM_AUDIO_OPUS] = "OggS"};
    for (int c = NM_AUDIO_FLAC; c <= NM_AUDIO_OPUS && s16; c++) {
        membuf m = {0};
        nm_audio_encoder *e = NULL;
        char err[256];
        NM_CHECK(nm_audio_encoder_open((nm_audio_container)c, R, to_mem, &m, &e, err, sizeof err) == NM_OK);
        for (int i = 0; e && i < N; i += 960) NM_CHECK(nm_audio_encoder_write(e, s16 + i, N - i < 960 ? N - i : 960) == NM_OK);
        const size_t before_close = m.n;
        NM_CHECK(nm_audio_encoder_close(e) == NM_OK);
        NM_CHECK(m.n > before_close || c == NM_AUDIO_FLAC); // the lossy ones hold their last frames until the end
        NM_CHECK(m.n > 4 && !memcmp(m.b, magic[c], strlen(magic[c])));
        if (c == NM_AUDIO_OPUS) NM_CHECK(m.n > 40 && !memcmp(m.b + 28, "OpusHead", 8));
        if (c == NM_AUDIO_MP3) NM_CHECK(m.n > 2 && (m.b[1] & 0xe6) == 0xe2); // frame sync, layer III

        nm_audio a = {0};
        NM_CHECK(nm_audio_decode(m.b, m.n, R, &a, err, sizeof err) == NM_OK);
        fprintf(stderr, "  %s: %zu bytes, %lld samples back\n", nm_audio_container_name((nm_audio_container)c), m.n,
                (long long)a.n);
        if (c == NM_AUDIO_FLAC) {
            // as long as the same samples written to a file (whose header libsndfile rewrites in place): the
            // header's rewrite at close, refused to the stream, left nothing at its end
            SF_INFO fi = {.samplerate = R, .channels = 1, .format = SF_FORMAT_FLAC | SF_FORMAT_PCM_16};
            SNDFILE *sf = sf_open(tmp_path("enc.flac"), SFM_WRITE, &fi);
            NM_CHECK(sf && sf_write_short(sf, s16, N) == N);
            if (sf) sf_close(sf);
            struct stat sb;
            NM_CHECK(stat(tmp_path("enc.flac"), &sb) == 0 && (size_t)sb.st_size == m.n);
            int bad = a.n != N;
            for (int64_t i = 0; !bad && i < N; i++) bad = lrintf(a.pcm[i] * 32768.0f) != s16[i];
            NM_CHECK(!bad);
        } else {
            NM_CHECK(a.n >= N && a.n <= N + 2400); // the encoder's delay and its last frame's padding
            if (a.n > 12000) {
                NM_CHECK_NEAR(goertzel_amp(a.pcm, 6000, 6000 + R / 2, R, 1000), 0.5, 0.05);
                NM_CHECK(goertzel_amp(a.pcm, 6000, 6000 + R / 2, R, 1500) < 0.02);
            }
        }
        nm_audio_free(&a);
        free(m.b);
    }
    free(s16);
    free(x);
}

NM_TEST(encoder_refuses_and_stops) {
    nm_audio_encoder *e = NULL;
    char err[256];
    membuf m = {0};
    NM_CHECK(nm_audio_encoder_open(NM_AUDIO_OPUS, 22050, to_mem, &m, &e, err, sizeof err) == NM_ERR_UNSUPPORTED && !e);
    NM_CHECK(strstr(err, "Opus takes 8, 12, 16, 24 or 48 kHz, not 22050 Hz"));
    NM_CHECK(nm_audio_encoder_open(NM_AUDIO_MP3, 0, to_mem, &m, &e, err, sizeof err) != NM_OK && !e);
    NM_CHECK(nm_audio_encoder_open((nm_audio_container)9, 16000, to_mem, &m, &e, err, sizeof err) == NM_ERR_INVALID_ARG);
    NM_CHECK(nm_audio_encoder_open(NM_AUDIO_MP3, 16000, NULL, &m, &e, err, sizeof err) == NM_ERR_INVALID_ARG);
    nm_audio_container c;
    NM_CHECK(nm_audio_container_parse("mp3", &c) && c == NM_AUDIO_MP3 && nm_audio_container_parse("ogg", &c) &&
             c == NM_AUDIO_OPUS && !nm_audio_container_parse("aac", &c) && !nm_audio_container_parse(NULL, &c));
    NM_CHECK(!strcmp(nm_audio_container_mime(NM_AUDIO_MP3), "audio/mpeg") && !strcmp(nm_audio_container_name(9), "?"));
    // a sink that stops (the client went): the next write says so, close too
    m.stop_after = 2;
    NM_CHECK(nm_audio_encoder_open(NM_AUDIO_FLAC, 16000, to_mem, &m, &e, err, sizeof err) == NM_OK);
    int16_t z[4096] = {0};
    nm_status st = NM_OK;
    for (int i = 0; e && i < 50 && st == NM_OK; i++) st = nm_audio_encoder_write(e, z, 4096);
    NM_CHECK(st == NM_ERR_IO && strstr(nm_audio_encoder_error(e), "stopped"));
    NM_CHECK(nm_audio_encoder_close(e) == NM_ERR_IO);
    NM_CHECK(nm_audio_encoder_close(NULL) == NM_OK && nm_audio_encoder_write(NULL, z, 1) == NM_ERR_INVALID_ARG);
    free(m.b);
}

// ---- resampling ---------------------------------------------------------------------

// A tone at `rate` read back at 16 kHz keeps its frequency and level.
static void check_resampled_tone(int *nmtest_failed, int rate, int ch, double f) {
    const int64_t n = (int64_t)rate * 2; // 2 s
    float *m = tone(n, rate, f, 0.5);
    float *x = malloc((size_t)(n * ch) * sizeof *x);
    for (int64_t i = 0; i < n; i++)
        for (int c = 0; c < ch; c++) x[i * ch + c] = m[i];
    const char *p = tmp_path("rs.wav");
    NM_CHECK(sf_write(p, SF_FORMAT_WAV | SF_FORMAT_FLOAT, rate, ch, x, n) == 0);
    nm_audio a;
    char err[256];
    NM_CHECK(nm_audio_load(p, 16000, &a, err, sizeof err) == NM_OK);
    NM_CHECK(a.rate == 16000);
    NM_CHECK(llabs(a.n - 32000) <= 1);
    if (a.n > 30000) {
        double fm = zc_freq(a.pcm, 1000, a.n - 1000, 16000);
        double am = amp_of(a.pcm, 1000, a.n - 1000);
        fprintf(stderr, "  %d Hz x%d -> 16 kHz: %lld samples, tone %.4f Hz (want %.0f), amplitude %.5f\n",
                rate, ch, (long long)a.n, fm, f, am);
        NM_CHECK_NEAR(fm, f, f * 1e-4);
        NM_CHECK_NEAR(am, 0.5, 0.005);
        // Aligned in time: the resampler's delay is compensated.
        double ph = 0;
        for (int64_t i = 4000; i < 4100; i++) ph = fmax(ph, fabs(a.pcm[i] - 0.5 * sin(2 * M_PI * f * i / 16000.0)));
        NM_CHECK(ph < 0.01);
    }
    nm_audio_free(&a);
    free(m);
    free(x);
}

NM_TEST(resample_8k_to_16k) { check_resampled_tone(nmtest_failed, 8000, 1, 440); }
NM_TEST(resample_48k_to_16k) {
    check_resampled_tone(nmtest_failed, 48000, 2, 440);
    check_resampled_tone(nmtest_failed, 48000, 1, 3000);
}
NM_TEST(resample_44k1_to_16k) {
    check_resampled_tone(nmtest_failed, 44100, 2, 440);
    check_resampled_tone(nmtest_failed, 44100, 1, 5000);
}

// Output length: soxr's count after its flush is round(n * rate_out / rate_in)
// exactly (its header promises "within one sample"); an input too short to
// give one sample is an error. 8 x 8 rates x 6 lengths, outputs kept below
// 4M samples so the case stays fast.
NM_TEST(resample_output_length_rule) {
    static const int32_t rates[] = {1000, 8000, 11025, 16000, 22050, 44100, 48000, 384000};
    static const int64_t lens[] = {1, 2, 7, 333, 4801, 200003};
    enum { NR = sizeof rates / sizeof rates[0] };
    float *x = malloc(sizeof(float) * 200003);
    for (int64_t i = 0; i < 200003; i++) x[i] = 0.3f * sinf(0.001f * (float)i);
    int checked = 0, refused = 0, wrong = 0;
    for (int a = 0; a < NR; a++)
        for (int b = 0; b < NR; b++)
            for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++) {
                const int64_t n = lens[l];
                const double want = floor((double)n * rates[b] / rates[a] + 0.5);
                if (want > 4e6 || rates[a] == rates[b]) continue;
                nm_audio o;
                char err[256];
                nm_status st = nm_audio_resample(x, n, rates[a], rates[b], &o, err, sizeof err);
                if (want < 1) {
                    refused += st != NM_OK;
                    wrong += st == NM_OK;
                } else if (st != NM_OK || o.n != (int64_t)want) {
                    fprintf(stderr, "  %lld samples %d -> %d Hz: %s %lld, want %.0f\n", (long long)n, rates[a],
                            rates[b], st == NM_OK ? "got" : err, (long long)(st == NM_OK ? o.n : -1), want);
                    wrong++;
                }
                checked++;
                if (st == NM_OK) nm_audio_free(&o);
            }
    fprintf(stderr, "  %d rate/length combinations, %d too short and refused\n", checked, refused);
    NM_CHECK(wrong == 0 && checked > 300);
    free(x);
}

NM_TEST(resample_direct_and_antialias) {
    // Upsampling 16k -> 48k keeps the tone; 48k -> 16k removes what is above 8 kHz.
    float *x = tone(16000, 16000, 1234, 0.25);
    nm_audio a;
    char err[256];
    NM_CHECK(nm_audio_resample(x, 16000, 16000, 48000, &a, err, sizeof err) == NM_OK);
    NM_CHECK(a.rate == 48000 && llabs(a.n - 48000) <= 1);
    if (a.n > 40000) {
        NM_CHECK_NEAR(zc_freq(a.pcm, 3000, a.n - 3000, 48000), 1234, 0.1);
        NM_CHECK_NEAR(amp_of(a.pcm, 3000, a.n - 3000), 0.25, 0.0025);
    }
    nm_audio_free(&a);
    free(x);
    float *hi = tone(48000, 48000, 12000, 0.5); // 12 kHz: above the 8 kHz Nyquist of 16 kHz
    NM_CHECK(nm_audio_resample(hi, 48000, 48000, 16000, &a, err, sizeof err) == NM_OK);
    NM_CHECK(llabs(a.n - 16000) <= 1);
    if (a.n > 8000) {
        double rest = amp_of(a.pcm, 1000, a.n - 1000);
        fprintf(stderr, "  12 kHz at 48k -> 16k: residual amplitude %.2e (%.0f dB)\n", rest, 20 * log10(rest / 0.5 + 1e-30));
        NM_CHECK(rest < 0.5e-4); // >= 80 dB down (HQ: ~120 dB)
    }
    nm_audio_free(&a);
    free(hi);
    // Same rate: an exact copy.
    float y[5] = {0.1f, -0.2f, 0.3f, 0, 1};
    NM_CHECK(nm_audio_resample(y, 5, 22050, 22050, &a, err, sizeof err) == NM_OK);
    NM_CHECK(a.n == 5 && a.pcm && !memcmp(a.pcm, y, sizeof y));
    nm_audio_free(&a);
    // Errors.
    NM_CHECK(nm_audio_resample(y, 5, 999, 16000, &a, err, sizeof err) == NM_ERR_INVALID_ARG);
    NM_CHECK(strstr(err, "999") != NULL);
    NM_CHECK(nm_audio_resample(y, 5, 16000, 384001, &a, err, sizeof err) == NM_ERR_INVALID_ARG);
    NM_CHECK(nm_audio_resample(y, 0, 16000, 8000, &a, err, sizeof err) == NM_ERR_FORMAT);
    NM_CHECK(nm_audio_resample(NULL, 5, 16000, 8000, &a, err, sizeof err) == NM_ERR_INVALID_ARG);
    y[2] = NAN;
    NM_CHECK(nm_audio_resample(y, 5, 16000, 8000, &a, err, sizeof err) == NM_ERR_FORMAT);
    NM_CHECK(strstr(err, "NaN") != NULL && a.pcm == NULL);
    y[2] = INFINITY;
    NM_CHECK(nm_audio_resample(y, 5, 16000, 16000, &a, err, sizeof err) == NM_ERR_FORMAT);
    NM_CHECK(strstr(err, "infinite") != NULL);
    // Finite but huge samples overflow the filter: an error, not inf in the output.
    float big[64];
    for (int i = 0; i < 64; i++) big[i] = (i & 1) ? 3e38f : -3e38f;
    NM_CHECK(nm_audio_resample(big, 64, 16000, 44100, &a, err, sizeof err) != NM_OK || all_finite(&a));
    nm_audio_free(&a);
}

// ---- raw PCM ------------------------------------------------------------------------

NM_TEST(raw_s16_and_f32) {
    enum { N = 3000 };
    int16_t q[N];
    s16_signal(q, N);
    // s16le stereo: (q, -q/2) per frame -> mono (q - q/2) / 2 in float.
    uint8_t s16[N * 4];
    for (int i = 0; i < N; i++) {
        int16_t r = (int16_t)(-q[i] / 2);
        s16[4 * i] = (uint8_t)q[i], s16[4 * i + 1] = (uint8_t)((uint16_t)q[i] >> 8);
        s16[4 * i + 2] = (uint8_t)r, s16[4 * i + 3] = (uint8_t)((uint16_t)r >> 8);
    }
    nm_audio a;
    char err[256];
    NM_CHECK(nm_audio_from_raw(s16, sizeof s16, NM_PCM_S16LE, 16000, 2, 0, &a, err, sizeof err) == NM_OK);
    NM_CHECK(a.n == N && a.rate == 16000);
    int bad = 0;
    for (int i = 0; i < N && a.n == N; i++)
        bad += a.pcm[i] != (q[i] / 32768.0f + (int16_t)(-q[i] / 2) / 32768.0f) / 2;
    NM_CHECK(bad == 0);
    nm_audio_free(&a);
    // f32le mono at 8 kHz, upsampled to 16 kHz through a file and through stdin.
    float *x = tone(8000, 8000, 300, 0.6);
    const char *p = tmp_path("raw.f32");
    write_file(p, x, 8000 * sizeof(float)); // this host is little-endian (checked below)
    uint16_t one = 1;
    NM_CHECK(*(uint8_t *)&one == 1);
    NM_CHECK(nm_audio_from_raw(x, 8000 * sizeof(float), NM_PCM_F32LE, 8000, 1, 0, &a, err, sizeof err) == NM_OK);
    NM_CHECK(a.n == 8000 && a.pcm && !memcmp(a.pcm, x, 8000 * sizeof(float)));
    nm_audio_free(&a);
    for (int via_stdin = 0; via_stdin < 2; via_stdin++) {
        if (via_stdin) NM_CHECK(stdin_from(p) == 0);
        NM_CHECK(nm_audio_load_raw(via_stdin ? "-" : p, NM_PCM_F32LE, 8000, 1, 16000, &a, err, sizeof err) == NM_OK);
        NM_CHECK(llabs(a.n - 16000) <= 1);
        if (a.n > 10000) {
            NM_CHECK_NEAR(zc_freq(a.pcm, 1000, a.n - 1000, 16000), 300, 0.05);
            NM_CHECK_NEAR(amp_of(a.pcm, 1000, a.n - 1000), 0.6, 0.006);
        }
        nm_audio_free(&a);
    }
    // A partial frame, from a buffer and from a file.
    NM_CHECK(nm_audio_from_raw(s16, 6, NM_PCM_S16LE, 16000, 2, 0, &a, err, sizeof err) == NM_ERR_FORMAT);
    NM_CHECK(strstr(err, "whole number") != NULL);
    write_file(p, x, 8000 * sizeof(float) - 2);
    NM_CHECK(nm_audio_load_raw(p, NM_PCM_F32LE, 8000, 1, 16000, &a, err, sizeof err) == NM_ERR_FORMAT);
    NM_CHECK(strstr(err, p) != NULL && strstr(err, "whole number") != NULL);
    // Bad arguments.
    NM_CHECK(nm_audio_from_raw(s16, 8, NM_PCM_S16LE, 16000, 0, 0, &a, err, sizeof err) == NM_ERR_INVALID_ARG);
    NM_CHECK(nm_audio_from_raw(s16, 8, NM_PCM_S16LE, 16000, 33, 0, &a, err, sizeof err) == NM_ERR_INVALID_ARG);
    NM_CHECK(strstr(err, "33 channels") != NULL);
    NM_CHECK(nm_audio_from_raw(s16, 8, NM_PCM_S16LE, 999, 1, 0, &a, err, sizeof err) == NM_ERR_INVALID_ARG);
    NM_CHECK(nm_audio_from_raw(s16, 8, NM_PCM_S16LE, 384001, 1, 0, &a, err, sizeof err) == NM_ERR_INVALID_ARG);
    NM_CHECK(nm_audio_from_raw(s16, 8, (nm_pcm_format)7, 16000, 1, 0, &a, err, sizeof err) == NM_ERR_INVALID_ARG);
    NM_CHECK(nm_audio_from_raw(s16, 8, NM_PCM_S16LE, 16000, 1, 5, &a, err, sizeof err) == NM_ERR_INVALID_ARG);
    NM_CHECK(nm_audio_from_raw(s16, 0, NM_PCM_S16LE, 16000, 1, 0, &a, err, sizeof err) == NM_ERR_FORMAT);
    NM_CHECK(nm_audio_from_raw(NULL, 8, NM_PCM_S16LE, 16000, 1, 0, &a, err, sizeof err) == NM_ERR_INVALID_ARG);
    NM_CHECK(nm_audio_from_raw(s16, 8, NM_PCM_S16LE, 16000, 1, 0, NULL, err, sizeof err) == NM_ERR_INVALID_ARG);
    write_file(p, "", 0);
    NM_CHECK(nm_audio_load_raw(p, NM_PCM_S16LE, 16000, 1, 0, &a, err, sizeof err) == NM_ERR_FORMAT);
    NM_CHECK(strstr(err, "empty") != NULL);
    // NaN / inf in f32 data.
    float f[4] = {0, 0.5f, NAN, 0};
    NM_CHECK(nm_audio_from_raw(f, sizeof f, NM_PCM_F32LE, 16000, 1, 0, &a, err, sizeof err) == NM_ERR_FORMAT);
    NM_CHECK(strstr(err, "sample 2 is NaN") != NULL);
    f[2] = -INFINITY;
    NM_CHECK(nm_audio_from_raw(f, sizeof f, NM_PCM_F32LE, 16000, 2, 0, &a, err, sizeof err) == NM_ERR_FORMAT);
    NM_CHECK(strstr(err, "sample 1 is infinite") != NULL);
    NM_CHECK(a.pcm == NULL && a.n == 0);
    free(x);
}

// ---- files from stdin ---------------------------------------------------------------

NM_TEST(stdin_file) {
    enum { N = 4410 };
    float *x = tone(N, 44100, 1000, 0.3);
    const char *p = tmp_path("stdin.flac");
    NM_CHECK(sf_write(p, SF_FORMAT_FLAC | SF_FORMAT_PCM_16, 44100, 1, x, N) == 0);
    NM_CHECK(stdin_from(p) == 0);
    nm_audio a;
    char err[256];
    NM_CHECK(nm_audio_load("-", 16000, &a, err, sizeof err) == NM_OK);
    NM_CHECK(a.rate == 16000 && llabs(a.n - 1600) <= 1);
    if (a.n > 1000) NM_CHECK_NEAR(zc_freq(a.pcm, 200, a.n - 200, 16000), 1000, 0.5);
    nm_audio_free(&a);
    // Garbage on stdin names stdin.
    const char *g = tmp_path("garbage.txt");
    write_file(g, "hello, this is not audio at all\n", 32);
    NM_CHECK(stdin_from(g) == 0);
    nm_status st = nm_audio_load("-", 16000, &a, err, sizeof err);
    NM_CHECK(st == NM_ERR_UNSUPPORTED);
    NM_CHECK(strncmp(err, "stdin: ", 7) == 0);
    fprintf(stderr, "  garbage on stdin: %s\n", err);
    free(x);
}

// ---- error cases --------------------------------------------------------------------

// A canonical 44-byte PCM WAV header.
static void wav_header(uint8_t *h, int ch, int rate, int bits, uint32_t data_bytes) {
    memcpy(h, "RIFF", 4);
    uint32_t v = 36 + data_bytes;
    memcpy(h + 4, &v, 4);
    memcpy(h + 8, "WAVEfmt ", 8);
    v = 16;
    memcpy(h + 16, &v, 4);
    uint16_t s = 1;
    memcpy(h + 20, &s, 2);
    s = (uint16_t)ch;
    memcpy(h + 22, &s, 2);
    v = (uint32_t)rate;
    memcpy(h + 24, &v, 4);
    v = (uint32_t)rate * ch * bits / 8;
    memcpy(h + 28, &v, 4);
    s = (uint16_t)(ch * bits / 8);
    memcpy(h + 32, &s, 2);
    s = (uint16_t)bits;
    memcpy(h + 34, &s, 2);
    memcpy(h + 36, "data", 4);
    memcpy(h + 40, &data_bytes, 4);
}

NM_TEST(errors_headers_rates_channels) {
    uint8_t buf[44 + 4000] = {0};
    nm_audio a;
    char err[256];
    // Sanity: the hand-made header decodes.
    wav_header(buf, 1, 16000, 16, 4000);
    NM_CHECK(nm_audio_decode(buf, sizeof buf, 16000, &a, err, sizeof err) == NM_OK && a.n == 2000);
    nm_audio_free(&a);
    // Zero-length data, empty input.
    wav_header(buf, 1, 16000, 16, 0);
    NM_CHECK(nm_audio_decode(buf, 44, 16000, &a, err, sizeof err) == NM_ERR_FORMAT);
    NM_CHECK(strstr(err, "no audio frames") != NULL);
    NM_CHECK(nm_audio_decode(buf, 0, 16000, &a, err, sizeof err) == NM_ERR_FORMAT);
    NM_CHECK(strstr(err, "empty") != NULL);
    // Truncated headers: every cut inside the 44 bytes is an error with a message.
    wav_header(buf, 1, 16000, 16, 4000);
    for (size_t cut = 1; cut < 44; cut++) {
        err[0] = '\0';
        nm_status st = nm_audio_decode(buf, cut, 16000, &a, err, sizeof err);
        if (st == NM_OK || !err[0]) fprintf(stderr, "  cut %zu: status %d, '%s'\n", cut, st, err);
        NM_CHECK(st < 0 && err[0] && a.pcm == NULL);
    }
    // Absurd sample rates.
    int rates[] = {0, 1, 999, 384001, 10000000, 0x7fffffff};
    for (size_t i = 0; i < sizeof rates / sizeof rates[0]; i++) {
        wav_header(buf, 1, rates[i], 16, 4000);
        nm_status st = nm_audio_decode(buf, sizeof buf, 16000, &a, err, sizeof err);
        if (st == NM_OK) fprintf(stderr, "  rate %d accepted\n", rates[i]);
        NM_CHECK(st < 0 && err[0]);
        if (rates[i] > 0 && rates[i] < 0x7fffffff) NM_CHECK(st == NM_ERR_RANGE && strstr(err, "sample rate"));
    }
    wav_header(buf, 1, 1000, 16, 4000);
    NM_CHECK(nm_audio_decode(buf, sizeof buf, 16000, &a, err, sizeof err) == NM_OK); // the lowest we take
    nm_audio_free(&a);
    wav_header(buf, 1, 384000, 16, 4000);
    NM_CHECK(nm_audio_decode(buf, sizeof buf, 16000, &a, err, sizeof err) == NM_OK); // and the highest
    nm_audio_free(&a);
    // Channel counts: 0 and more than 32 (block align consistent with them).
    int chans[] = {0, 33, 40, 1000};
    for (size_t i = 0; i < sizeof chans / sizeof chans[0]; i++) {
        wav_header(buf, chans[i], 16000, 16, 4000 - 4000 % (chans[i] ? chans[i] * 2 : 1));
        nm_status st = nm_audio_decode(buf, sizeof buf, 16000, &a, err, sizeof err);
        fprintf(stderr, "  %d channels: %s\n", chans[i], err);
        NM_CHECK(st < 0 && err[0] && a.pcm == NULL);
        if (chans[i] == 33 || chans[i] == 40) NM_CHECK(st == NM_ERR_RANGE && strstr(err, "channels"));
    }
    wav_header(buf, 32, 16000, 16, 64 * 62);
    NM_CHECK(nm_audio_decode(buf, 44 + 64 * 62, 16000, &a, err, sizeof err) == NM_OK && a.n == 62); // 32 is fine
    nm_audio_free(&a);
    // A target rate outside the limits.
    NM_CHECK(nm_audio_decode(buf, sizeof buf, 500, &a, err, sizeof err) == NM_ERR_INVALID_ARG);
    NM_CHECK(nm_audio_decode(buf, sizeof buf, 400000, &a, err, sizeof err) == NM_ERR_INVALID_ARG);
    NM_CHECK(nm_audio_decode(buf, sizeof buf, 16000, NULL, err, sizeof err) == NM_ERR_INVALID_ARG);
    NM_CHECK(nm_audio_decode(NULL, 10, 16000, &a, err, sizeof err) == NM_ERR_INVALID_ARG);
    // err may be NULL.
    NM_CHECK(nm_audio_decode(buf, 3, 16000, &a, NULL, 0) < 0);
}

NM_TEST(errors_files) {
    nm_audio a;
    char err[256];
    NM_CHECK(nm_audio_load(tmp_path("does-not-exist.wav"), 16000, &a, err, sizeof err) == NM_ERR_IO);
    NM_CHECK(strstr(err, "does-not-exist.wav") && strstr(err, "No such file"));
    NM_CHECK(nm_audio_load(tmp_dir, 16000, &a, err, sizeof err) == NM_ERR_IO);
    NM_CHECK(strstr(err, "directory") != NULL);
    NM_CHECK(nm_audio_load(NULL, 16000, &a, err, sizeof err) == NM_ERR_INVALID_ARG);
    const char *p = tmp_path("empty.wav");
    write_file(p, "", 0);
    NM_CHECK(nm_audio_load(p, 16000, &a, err, sizeof err) == NM_ERR_FORMAT);
    NM_CHECK(strstr(err, "empty") != NULL);
    // Not audio: libsndfile does not recognise it.
    write_file(p, "{\"this\": \"is json\", \"and not\": \"a sound file\"}", 46);
    NM_CHECK(nm_audio_load(p, 16000, &a, err, sizeof err) == NM_ERR_UNSUPPORTED);
    fprintf(stderr, "  json as audio: %s\n", err);
    NM_CHECK(strstr(err, p) != NULL);
    // NaN and inf in a float WAV written by libsndfile.
    float x[200];
    for (int i = 0; i < 200; i++) x[i] = (float)sin(i * 0.1);
    x[150] = NAN;
    NM_CHECK(sf_write(p, SF_FORMAT_WAV | SF_FORMAT_FLOAT, 16000, 2, x, 100) == 0);
    NM_CHECK(nm_audio_load(p, 16000, &a, err, sizeof err) == NM_ERR_FORMAT);
    fprintf(stderr, "  NaN: %s\n", err);
    NM_CHECK(strstr(err, "sample 75 (channel 0) is NaN") != NULL && a.pcm == NULL);
    x[150] = 0;
    x[3] = INFINITY;
    NM_CHECK(sf_write(p, SF_FORMAT_WAV | SF_FORMAT_FLOAT, 8000, 1, x, 200) == 0);
    NM_CHECK(nm_audio_load(p, 16000, &a, err, sizeof err) == NM_ERR_FORMAT);
    NM_CHECK(strstr(err, "sample 3 (channel 0) is infinite") != NULL);
    // Unwritable output.
    x[3] = 0;
    NM_CHECK(nm_audio_write_wav(tmp_path("no/such/dir/x.wav"), x, 10, 16000, 1, err, sizeof err) == NM_ERR_IO);
    NM_CHECK(strstr(err, "cannot create") != NULL);
    x[3] = INFINITY;
    NM_CHECK(nm_audio_write_wav(p, x, 10, 16000, 1, err, sizeof err) == NM_ERR_INVALID_ARG);
    NM_CHECK(strstr(err, "sample 3") != NULL);
    NM_CHECK(nm_audio_write_wav(p, x, 3, 16000, 0, err, sizeof err) == NM_ERR_INVALID_ARG);
    NM_CHECK(nm_audio_write_wav(p, x, 3, 50, 1, err, sizeof err) == NM_ERR_INVALID_ARG);
    NM_CHECK(nm_audio_write_wav(p, NULL, 3, 16000, 1, err, sizeof err) == NM_ERR_INVALID_ARG);
    NM_CHECK(nm_audio_write_wav(p, x, (int64_t)1 << 31, 16000, 1, err, sizeof err) == NM_ERR_RANGE);
}

NM_TEST(errors_too_long) {
    // The default cap (4 h): a 4 h + 1 s file at 1 kHz (14.4 MB of u8) is refused
    // from its header, before decoding; exactly 4 h is accepted.
    const int rate = 1000;
    const int64_t n = (int64_t)NM_AUDIO_MAX_SECONDS * rate + rate;
    uint8_t *d = malloc(44 + (size_t)n);
    wav_header(d, 1, rate, 8, (uint32_t)n);
    memset(d + 44, 128, (size_t)n);
    const char *p = tmp_path("long.wav");
    write_file(p, d, 44 + (size_t)n);
    nm_audio a;
    char err[256];
    NM_CHECK(nm_audio_load(p, 0, &a, err, sizeof err) == NM_ERR_RANGE);
    fprintf(stderr, "  4 h + 1 s: %s\n", err);
    NM_CHECK(strstr(err, "too long") != NULL && a.pcm == NULL);
    NM_CHECK(strstr(err, "the limit is 14400.0 s") != NULL);
    // Raw s16 of the same duration is refused too, before any work.
    uint8_t *r = calloc((size_t)n, 2);
    NM_CHECK(nm_audio_from_raw(r, (size_t)n * 2, NM_PCM_S16LE, rate, 1, 0, &a, err, sizeof err) == NM_ERR_RANGE);
    NM_CHECK(strstr(err, "too long") != NULL);
    // ... and at 16 kHz output the cap is the same duration (4 h at 16 kHz).
    NM_CHECK(nm_audio_from_raw(r, (size_t)n * 2, NM_PCM_S16LE, rate, 1, 16000, &a, err, sizeof err) == NM_ERR_RANGE);
    free(r);
    wav_header(d, 1, rate, 8, (uint32_t)(n - rate));
    write_file(p, d, 44 + (size_t)(n - rate));
    NM_CHECK(nm_audio_load(p, 0, &a, err, sizeof err) == NM_OK);
    NM_CHECK(a.n == n - rate && a.rate == rate);
    nm_audio_free(&a);
    free(d);
    // A caller's cap: 1000 samples at 16 kHz.
    uint8_t w[44 + 8000] = {0};
    wav_header(w, 1, 16000, 16, 8000);
    NM_CHECK(nm_audio_decode_max(w, sizeof w, 16000, 1000, &a, err, sizeof err) == NM_ERR_RANGE);
    NM_CHECK(nm_audio_decode_max(w, sizeof w, 16000, 4000, &a, err, sizeof err) == NM_OK && a.n == 4000);
    nm_audio_free(&a);
    // ... counted in output samples: 4000 input frames at 16k are 2000 at 8k.
    NM_CHECK(nm_audio_decode_max(w, sizeof w, 8000, 2000, &a, err, sizeof err) == NM_OK && llabs(a.n - 2000) <= 1);
    nm_audio_free(&a);
    NM_CHECK(nm_audio_decode_max(w, sizeof w, 8000, 1999, &a, err, sizeof err) == NM_ERR_RANGE);
    // A header that claims more than the data holds is read for what is there.
    wav_header(w, 1, 16000, 16, 0x7ffff000);
    NM_CHECK(nm_audio_decode(w, sizeof w, 16000, &a, err, sizeof err) == NM_OK && a.n == 4000);
    nm_audio_free(&a);
}

// Every prefix and thousands of byte flips of a valid file decode or fail
// cleanly (under ASan in CI: no bad access either).
static void mutate_file(int *nmtest_failed, const uint8_t *d, size_t n, const char *what) {
    uint8_t *m = malloc(n);
    int ok = 0, failed = 0;
    nm_audio a;
    char err[256];
    for (size_t cut = 0; cut < n; cut += cut < 512 ? 1 : 97) {
        nm_status st = nm_audio_decode_max(d, cut, 16000, 1 << 16, &a, err, sizeof err);
        if (st == NM_OK) {
            ok++;
            NM_CHECK(a.n > 0 && a.rate == 16000 && all_finite(&a));
        } else {
            failed++;
            NM_CHECK(err[0] && a.pcm == NULL && a.n == 0);
        }
        nm_audio_free(&a);
    }
    uint64_t r = 0x9e3779b97f4a7c15ull;
    for (int k = 0; k < 1500; k++) {
        memcpy(m, d, n);
        int flips = 1 + k % 4;
        for (int j = 0; j < flips; j++) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            // Mostly the first 256 bytes (headers), sometimes anywhere.
            size_t at = (r >> 8) % ((k & 3) ? (n < 256 ? n : 256) : n);
            m[at] ^= (uint8_t)(1u << (r % 8));
            if (k % 7 == 0) m[at] = (uint8_t)(r >> 32);
        }
        nm_status st = nm_audio_decode_max(m, n, 16000, 1 << 16, &a, err, sizeof err);
        if (st == NM_OK) {
            ok++;
            NM_CHECK(a.n > 0 && all_finite(&a));
        } else {
            failed++;
            NM_CHECK(err[0] && a.pcm == NULL);
        }
        nm_audio_free(&a);
    }
    fprintf(stderr, "  %s (%zu bytes): %d mutants decoded, %d refused\n", what, n, ok, failed);
    free(m);
}

NM_TEST(mutations_never_crash) {
    float *x = sweep(4000, 16000, 100, 6000, 0.5);
    struct { int fmt; int ch; const char *name; } fs[] = {
        {SF_FORMAT_WAV | SF_FORMAT_PCM_16, 1, "wav s16"},
        {SF_FORMAT_WAV | SF_FORMAT_FLOAT, 2, "wav f32 stereo"},
        {SF_FORMAT_WAV | SF_FORMAT_IMA_ADPCM, 1, "wav ima-adpcm"},
        {SF_FORMAT_FLAC | SF_FORMAT_PCM_16, 1, "flac"},
        {SF_FORMAT_OGG | SF_FORMAT_VORBIS, 1, "ogg vorbis"},
        {SF_FORMAT_AIFF | SF_FORMAT_PCM_24, 1, "aiff s24"},
    };
    for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++) {
        const char *p = tmp_path("mut.bin");
        NM_CHECK(sf_write(p, fs[i].fmt, 16000, fs[i].ch, x, 4000 / fs[i].ch) == 0);
        size_t n = 0;
        uint8_t *d = read_file(p, &n);
        if (d && n) mutate_file(nmtest_failed, d, n, fs[i].name);
        free(d);
    }
    free(x);
}

// ---- the fuzz seed corpus -----------------------------------------------------------
//
// NM_GEN_CORPUS=DIR ./test_audio --filter gen_corpus writes the seeds of
// tests/fuzz/corpus/audio: small valid files of many encodings, and truncated /
// corrupted / out-of-limit variants. Each is under 8 KB.

static int gen_one(const char *dir, const char *name, int format, int rate, int ch, int64_t frames) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    float *x = malloc((size_t)(frames * ch) * sizeof *x);
    for (int64_t i = 0; i < frames; i++)
        for (int c = 0; c < ch; c++)
            x[i * ch + c] = (float)(0.5 * sin(2 * M_PI * (300.0 + 200 * c) * (double)i / rate) * (1 - (double)i / frames));
    int r = sf_write(p, format, rate, ch, x, frames);
    free(x);
    if (r) return r;
    struct stat sb;
    if (stat(p, &sb) != 0 || sb.st_size >= 8192) {
        fprintf(stderr, "  %s: %lld bytes (seeds must be < 8 KB)\n", name, (long long)sb.st_size);
        return -1;
    }
    return 0;
}

// Writes a variant of DIR/src: the first `cut` bytes, with flips at `at` (xor), and
// optionally a 4-byte raw-path prefix.
static int gen_variant(const char *dir, const char *src, const char *name, size_t cut, const size_t *at,
                       int n_at) {
    char p[512], q[512];
    snprintf(p, sizeof p, "%s/%s", dir, src);
    snprintf(q, sizeof q, "%s/%s", dir, name);
    size_t n = 0;
    uint8_t *d = read_file(p, &n);
    if (!d) return -1;
    if (cut && cut < n) n = cut;
    for (int i = 0; i < n_at; i++)
        if (at[i] < n) d[at[i]] ^= 0x5a;
    write_file(q, d, n);
    free(d);
    return 0;
}

// The figures of docs/audio.md ("Why HQ"): soxr's one-shot time for 60 s of
// noise at each input rate to 16 kHz, quality MQ / HQ / VHQ, one thread, best
// of 3. A benchmark: prints, asserts nothing but that soxr ran.
NM_TEST_OPTIN(resample_quality_speed, "NM_TEST_BENCH") {
    static const double rates[] = {48000, 44100, 8000};
    static const struct { const char *name; unsigned long recipe; } q[] = {
        {"MQ", SOXR_MQ}, {"HQ", SOXR_HQ}, {"VHQ", SOXR_VHQ}};
    for (int r = 0; r < 3; r++) {
        const size_t n = (size_t)(60 * rates[r]), n_out = (size_t)(60 * 16000) + 64;
        float *in = malloc(sizeof(float) * n), *out = malloc(sizeof(float) * n_out);
        NM_CHECK(in && out);
        if (!in || !out) break;
        uint32_t x = 1;
        for (size_t i = 0; i < n; i++) x = x * 1664525u + 1013904223u, in[i] = (float)(x >> 8) / 8388608.0f - 1.0f;
        printf("  %5.0f Hz -> 16 kHz:", rates[r]);
        for (int k = 0; k < 3; k++) {
            double best = 1e9;
            for (int rep = 0; rep < 3; rep++) {
                soxr_io_spec_t io = soxr_io_spec(SOXR_FLOAT32_I, SOXR_FLOAT32_I);
                soxr_quality_spec_t qs = soxr_quality_spec(q[k].recipe, 0);
                soxr_runtime_spec_t rt = soxr_runtime_spec(1);
                size_t done = 0;
                struct timespec t0, t1;
                clock_gettime(CLOCK_MONOTONIC, &t0);
                soxr_error_t e = soxr_oneshot(rates[r], 16000, 1, in, n, NULL, out, n_out, &done, &io, &qs, &rt);
                clock_gettime(CLOCK_MONOTONIC, &t1);
                NM_CHECK(!e && done > 0);
                double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
                if (ms < best) best = ms;
            }
            printf(" %s %.0f ms", q[k].name, best);
        }
        printf("\n");
        free(in);
        free(out);
    }
}

NM_TEST_OPTIN(gen_corpus, "NM_GEN_CORPUS") {
    const char *dir = getenv("NM_GEN_CORPUS");
    mkdir(dir, 0755);
    struct { const char *name; int fmt, rate, ch; int64_t frames; } v[] = {
        {"u8-8k.wav", SF_FORMAT_WAV | SF_FORMAT_PCM_U8, 8000, 1, 800},
        {"s16-16k.wav", SF_FORMAT_WAV | SF_FORMAT_PCM_16, 16000, 1, 1600},
        {"s16-44k1-stereo.wav", SF_FORMAT_WAV | SF_FORMAT_PCM_16, 44100, 2, 1000},
        {"s24-48k.wav", SF_FORMAT_WAV | SF_FORMAT_PCM_24, 48000, 1, 1600},
        {"s32-22k05.wav", SF_FORMAT_WAV | SF_FORMAT_PCM_32, 22050, 1, 1000},
        {"f32-stereo-32k.wav", SF_FORMAT_WAV | SF_FORMAT_FLOAT, 32000, 2, 600},
        {"f64-11k025.wav", SF_FORMAT_WAV | SF_FORMAT_DOUBLE, 11025, 1, 500},
        {"f32-6ch.wavex", SF_FORMAT_WAVEX | SF_FORMAT_FLOAT, 48000, 6, 200},
        {"ulaw-8k.wav", SF_FORMAT_WAV | SF_FORMAT_ULAW, 8000, 1, 1600},
        {"alaw-8k.wav", SF_FORMAT_WAV | SF_FORMAT_ALAW, 8000, 1, 1600},
        {"ima-adpcm-16k.wav", SF_FORMAT_WAV | SF_FORMAT_IMA_ADPCM, 16000, 1, 4000},
        {"ms-adpcm-stereo.wav", SF_FORMAT_WAV | SF_FORMAT_MS_ADPCM, 16000, 2, 2000},
        {"gsm610-8k.wav", SF_FORMAT_WAV | SF_FORMAT_GSM610, 8000, 1, 4000},
        {"rate-1000.wav", SF_FORMAT_WAV | SF_FORMAT_PCM_16, 1000, 1, 300},
        {"rate-384000.wav", SF_FORMAT_WAV | SF_FORMAT_PCM_16, 384000, 1, 3000},
        {"odd-7919.wav", SF_FORMAT_WAV | SF_FORMAT_PCM_16, 7919, 3, 400},
        {"s16.aiff", SF_FORMAT_AIFF | SF_FORMAT_PCM_16, 16000, 1, 1600},
        {"s16.au", SF_FORMAT_AU | SF_FORMAT_PCM_16, 16000, 1, 1600},
        {"s16.caf", SF_FORMAT_CAF | SF_FORMAT_PCM_16, 16000, 1, 1600},
        {"s16.w64", SF_FORMAT_W64 | SF_FORMAT_PCM_16, 16000, 1, 1600},
        {"s16-16k.flac", SF_FORMAT_FLAC | SF_FORMAT_PCM_16, 16000, 1, 4000},
        {"s24-stereo-48k.flac", SF_FORMAT_FLAC | SF_FORMAT_PCM_24, 48000, 2, 1200},
        {"vorbis-16k.ogg", SF_FORMAT_OGG | SF_FORMAT_VORBIS, 16000, 1, 1600},
        {"opus-48k.opus", SF_FORMAT_OGG | SF_FORMAT_OPUS, 48000, 1, 4800},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        NM_CHECK(gen_one(dir, v[i].name, v[i].fmt, v[i].rate, v[i].ch, v[i].frames) == 0);
    // Truncated and corrupted variants.
    const size_t hdr[] = {4, 22, 24, 40}; // RIFF size, channels, rate, data size
    NM_CHECK(gen_variant(dir, "s16-16k.wav", "trunc-header.wav", 30, NULL, 0) == 0);
    NM_CHECK(gen_variant(dir, "s16-16k.wav", "trunc-data.wav", 1001, NULL, 0) == 0);
    NM_CHECK(gen_variant(dir, "s16-16k.wav", "corrupt-header.wav", 0, hdr, 4) == 0);
    NM_CHECK(gen_variant(dir, "s16-16k.flac", "trunc.flac", 700, NULL, 0) == 0);
    const size_t fl[] = {8, 20, 600, 900};
    NM_CHECK(gen_variant(dir, "s16-16k.flac", "corrupt.flac", 0, fl, 4) == 0);
    NM_CHECK(gen_variant(dir, "vorbis-16k.ogg", "trunc.ogg", 3000, NULL, 0) == 0);
    // Hand-made headers: no data, absurd rate, too many channels, NaN samples.
    char p[512];
    uint8_t w[44 + 256] = {0};
    wav_header(w, 1, 16000, 16, 0);
    snprintf(p, sizeof p, "%s/no-data.wav", dir);
    write_file(p, w, 44);
    wav_header(w, 1, 5, 16, 256);
    snprintf(p, sizeof p, "%s/rate-5.wav", dir);
    write_file(p, w, sizeof w);
    wav_header(w, 40, 16000, 16, 240);
    snprintf(p, sizeof p, "%s/channels-40.wav", dir);
    write_file(p, w, 44 + 240);
    float nan[64];
    for (int i = 0; i < 64; i++) nan[i] = i == 40 ? NAN : 0.01f * i;
    snprintf(p, sizeof p, "%s/nan-f32.wav", dir);
    NM_CHECK(sf_write(p, SF_FORMAT_WAV | SF_FORMAT_FLOAT, 16000, 1, nan, 64) == 0);
    // For the raw path: 4 control bytes (format, rate, channels, target) then PCM.
    uint8_t raw[4 + 2000];
    raw[0] = 0, raw[1] = 0, raw[2] = 1, raw[3] = 1; // s16, 8 kHz, mono, to 16 kHz
    for (int i = 0; i < 1000; i++) {
        int16_t s = (int16_t)(8000 * sin(i * 0.2));
        memcpy(raw + 4 + 2 * i, &s, 2);
    }
    snprintf(p, sizeof p, "%s/raw-s16-8k.bin", dir);
    write_file(p, raw, sizeof raw);
    raw[0] = 1, raw[1] = 3, raw[2] = 2, raw[3] = 1; // f32, 48 kHz, stereo, to 16 kHz
    for (int i = 0; i < 500; i++) {
        float f = (float)(0.3 * sin(i * 0.05));
        memcpy(raw + 4 + 4 * i, &f, 4);
    }
    snprintf(p, sizeof p, "%s/raw-f32-48k-stereo.bin", dir);
    write_file(p, raw, sizeof raw);
}

// ---- capture ------------------------------------------------------------------------

static bool stop_after_first(const float *pcm, int64_t n, void *user) {
    *(int64_t *)user += n;
    return true;
}

NM_TEST(capture) {
    nm_audio a;
    char err[256];
    nm_audio_capture_params p = nm_audio_capture_default_params();
    NM_CHECK(p.rate == 16000 && p.seconds > 0 && !strcmp(p.device, "default"));
    // Argument errors come first, with or without ALSA.
    p.seconds = 0;
    NM_CHECK(nm_audio_capture(&p, &a, err, sizeof err) == NM_ERR_INVALID_ARG);
    p = nm_audio_capture_default_params();
    p.rate = 50;
    NM_CHECK(nm_audio_capture(&p, &a, err, sizeof err) == NM_ERR_INVALID_ARG);
    NM_CHECK(nm_audio_capture(NULL, &a, err, sizeof err) == NM_ERR_INVALID_ARG);
    p = nm_audio_capture_default_params();
    if (!nm_audio_capture_available()) {
        NM_CHECK(nm_audio_capture(&p, &a, err, sizeof err) == NM_ERR_UNSUPPORTED);
        NM_CHECK(strstr(err, "without ALSA") != NULL);
        NM_SKIP("built without ALSA: capture checked to say so");
    }
    p.device = "nm-no-such-device";
    NM_CHECK(nm_audio_capture(&p, &a, err, sizeof err) == NM_ERR_IO);
    NM_CHECK(strstr(err, "nm-no-such-device") != NULL);
    // ALSA's "null" device: a real capture path (open, set up, read, convert)
    // that needs no hardware. It reports frames without writing them, which
    // must come out as silence (not stale memory: that once read as NaN).
    p.device = "null";
    p.seconds = 0.25;
    nm_status st = nm_audio_capture(&p, &a, err, sizeof err);
    if (st == NM_OK) {
        NM_CHECK(a.n == 4000 && a.rate == 16000);
        int nonzero = 0;
        for (int64_t i = 0; i < a.n; i++) nonzero += a.pcm[i] != 0;
        NM_CHECK(nonzero == 0);
        nm_audio_free(&a);
        int64_t seen = 0;
        p.format = NM_PCM_F32LE;
        p.seconds = 0; // only the callback stops it
        p.on_chunk = stop_after_first;
        p.user = &seen;
        st = nm_audio_capture(&p, &a, err, sizeof err);
        if (st != NM_OK) fprintf(stderr, "  null device, float, callback: %s\n", err);
        NM_CHECK(st == NM_OK);
        NM_CHECK(a.n > 0 && a.n <= 1600 && seen == a.n);
        nonzero = 0;
        for (int64_t i = 0; i < a.n; i++) nonzero += a.pcm[i] != 0;
        NM_CHECK(nonzero == 0);
        nm_audio_free(&a);
    } else {
        fprintf(stderr, "  skipped ALSA null device: %s\n", err);
        NM_CHECK(st == NM_ERR_IO && err[0]);
    }
    // The default device: there is none on a headless machine.
    p = nm_audio_capture_default_params();
    p.seconds = 0.2;
    st = nm_audio_capture(&p, &a, err, sizeof err);
    if (st != NM_OK) {
        NM_CHECK((st == NM_ERR_IO || st == NM_ERR_UNSUPPORTED) && err[0]);
        fprintf(stderr, "  no capture device (%s): skipped recording from it\n", err);
        return;
    }
    NM_CHECK(a.n == 3200 && all_finite(&a));
    nm_audio_free(&a);
}

// A streamed capture keeps nothing: every sample goes to the callback once.
static bool count_chunk(const float *pcm, int64_t n, void *user) {
    (void)pcm;
    *(int64_t *)user += n;
    return false;
}

NM_TEST(capture_streamed_and_playback) {
    char err[256];
    nm_audio a = {0};
    nm_audio_capture_params p = nm_audio_capture_default_params();
    p.stream = true; // without a callback: refused
    NM_CHECK(nm_audio_capture(&p, &a, err, sizeof err) == NM_ERR_INVALID_ARG && strstr(err, "on_chunk"));
    nm_audio_player *pl = NULL;
    NM_CHECK(nm_audio_player_open("null", 5, &pl, err, sizeof err) == NM_ERR_INVALID_ARG && !pl);
    if (!nm_audio_capture_available()) {
        NM_CHECK(nm_audio_player_open("null", 16000, &pl, err, sizeof err) == NM_ERR_UNSUPPORTED);
        NM_SKIP("built without ALSA: capture and playback checked to say so");
    }
    NM_CHECK(nm_audio_player_open("nm-no-such-device", 16000, &pl, err, sizeof err) == NM_ERR_IO && !pl);
    NM_CHECK(strstr(err, "nm-no-such-device") != NULL);
    int64_t seen = 0;
    p.device = "null";
    p.seconds = 0.3;
    p.on_chunk = count_chunk;
    p.user = &seen;
    nm_status st = nm_audio_capture(&p, &a, err, sizeof err);
    if (st != NM_OK) {
        fprintf(stderr, "  skipped ALSA null device: %s\n", err);
        NM_CHECK(st == NM_ERR_IO && err[0]);
        return;
    }
    NM_CHECK(seen == 4800 && a.pcm == NULL && a.n == 0);
    // playback: 0.2 s to the null device, drained, closed
    int16_t tone[3200];
    for (int i = 0; i < 3200; i++) tone[i] = (int16_t)(8000 * sin(2 * M_PI * 440 * i / 16000.0));
    NM_CHECK(nm_audio_player_open("null", 16000, &pl, err, sizeof err) == NM_OK && pl);
    NM_CHECK(nm_audio_player_write(pl, tone, 3200, err, sizeof err) == NM_OK);
    NM_CHECK(nm_audio_player_write(pl, tone, -1, err, sizeof err) == NM_ERR_INVALID_ARG);
    NM_CHECK(nm_audio_player_drain(pl, err, sizeof err) == NM_OK);
    nm_audio_player_close(pl);
    nm_audio_player_close(NULL);
}

// ---- the utterance cutter ------------------------------------------------------------

typedef struct utts {
    int n;
    int64_t t0[8], len[8];
} utts;

static void on_utt(void *user, const float *pcm, int64_t n, int64_t t0) {
    utts *u = user;
    (void)pcm;
    if (u->n < 8) u->t0[u->n] = t0, u->len[u->n] = n;
    u->n++;
}

// Quiet noise (about -60 dBFS), deterministic.
static void noise(float *x, int64_t n, uint32_t *seed) {
    for (int64_t i = 0; i < n; i++) {
        *seed = *seed * 1664525u + 1013904223u;
        x[i] = ((float)(*seed >> 8) / 16777216.0f - 0.5f) * 0.002f;
    }
}

// The first and last sample of the speech file louder than -40 dBFS.
static void loud_span(const nm_audio *a, int64_t *first, int64_t *last) {
    *first = -1;
    *last = -1;
    for (int64_t i = 0; i < a->n; i++)
        if (fabsf(a->pcm[i]) > 0.01f) {
            if (*first < 0) *first = i;
            *last = i;
        }
}

// Two spoken sentences in a room: silence, speech, 1.5 s of silence, speech,
// silence: two utterances, each holding its speech, fed in odd-sized chunks.
NM_TEST(vad_two_questions) {
    nm_audio sp = {0};
    char err[256];
    NM_CHECK(nm_audio_load("tests/data/speech/tts_16k.wav", 16000, &sp, err, sizeof err) == NM_OK);
    if (!sp.pcm) return;
    int64_t first = 0, last = 0;
    loud_span(&sp, &first, &last);
    const int64_t gap0 = 16000, gap1 = 24000, gap2 = 16000;
    const int64_t n = gap0 + sp.n + gap1 + sp.n + gap2;
    float *x = malloc(sizeof(float) * (size_t)n);
    uint32_t seed = 7;
    noise(x, n, &seed);
    for (int64_t i = 0; i < sp.n; i++) {
        x[gap0 + i] += sp.pcm[i];
        x[gap0 + sp.n + gap1 + i] += sp.pcm[i];
    }
    nm_vad_params p = nm_vad_default_params();
    nm_vad *v = NULL;
    NM_CHECK(nm_vad_create(&p, &v, err, sizeof err) == NM_OK);
    utts u = {0};
    for (int64_t i = 0; i < n;) {
        int64_t k = n - i < 777 ? n - i : 777;
        nm_vad_push(v, x + i, k, on_utt, &u);
        i += k;
    }
    nm_vad_flush(v, on_utt, &u);
    NM_CHECK(nm_vad_position(v) == n && !nm_vad_in_speech(v));
    printf("  speech at %.2f-%.2f s and %.2f-%.2f s; utterances:", (gap0 + first) / 16000.0, (gap0 + last) / 16000.0,
           (gap0 + sp.n + gap1 + first) / 16000.0, (gap0 + sp.n + gap1 + last) / 16000.0);
    for (int i = 0; i < u.n && i < 8; i++) printf(" %.2f-%.2f s", u.t0[i] / 16000.0, (u.t0[i] + u.len[i]) / 16000.0);
    printf("\n");
    NM_CHECK(u.n == 2);
    for (int k = 0; k < 2 && u.n == 2; k++) {
        const int64_t s0 = (k ? gap0 + sp.n + gap1 : gap0) + first, s1 = (k ? gap0 + sp.n + gap1 : gap0) + last;
        NM_CHECK(u.t0[k] <= s0 && u.t0[k] >= s0 - 16000 * 4 / 10);                  // starts at most 0.4 s early
        NM_CHECK(u.t0[k] + u.len[k] >= s1 && u.t0[k] + u.len[k] <= s1 + 16000 * 3 / 10); // ends within 0.3 s after
    }
    nm_vad_free(v);
    // a steady noise is no speech; a loud tone after silence is cut at max_ms
    NM_CHECK(nm_vad_create(&p, &v, err, sizeof err) == NM_OK);
    u.n = 0;
    seed = 9;
    noise(x, n, &seed);
    for (int64_t i = 0; i < n; i++) x[i] *= 100.0f; // -20 dBFS, from the first frame on
    nm_vad_push(v, x, n, on_utt, &u);
    nm_vad_flush(v, on_utt, &u);
    NM_CHECK(u.n == 0);
    nm_vad_free(v);
    p.max_ms = 5000;
    NM_CHECK(nm_vad_create(&p, &v, err, sizeof err) == NM_OK);
    u.n = 0;
    for (int64_t i = 0; i < 16000 * 9; i++) x[i] = i < 16000 ? 0.0f : 0.1f * (float)sin(2 * M_PI * 300 * i / 16000.0);
    nm_vad_push(v, x, 16000 * 9, on_utt, &u);
    NM_CHECK(u.n >= 1 && u.len[0] == 16000 * 5 && u.t0[0] >= 16000 - 16000 * 3 / 10 && u.t0[0] <= 16000);
    nm_vad_free(v);
    // a room that gets louder (a fan starts): speech for a while, until the floor has risen to it;
    // then no more utterances however long it lasts
    p = nm_vad_default_params();
    NM_CHECK(nm_vad_create(&p, &v, err, sizeof err) == NM_OK);
    u.n = 0;
    float *room = malloc(sizeof(float) * 16000 * 61);
    seed = 11;
    noise(room, 16000 * 61, &seed);
    for (int64_t i = 16000; i < 16000 * 61; i++) room[i] *= 100.0f; // -60 dBFS for 1 s, then -20 dBFS
    nm_vad_push(v, room, 16000 * 61, on_utt, &u);
    nm_vad_flush(v, on_utt, &u);
    printf("  a fan from 1 s to 61 s: %d utterance(s), the first %.2f-%.2f s\n", u.n, u.t0[0] / 16000.0,
           (u.t0[0] + u.len[0]) / 16000.0);
    NM_CHECK(u.n == 1 && u.t0[0] + u.len[0] < 16000 * 31);
    nm_vad_free(v);
    // a steady sound 20 dB over the room (a long vowel, a hum) for 6 s: one utterance, all of it
    NM_CHECK(nm_vad_create(&p, &v, err, sizeof err) == NM_OK);
    u.n = 0;
    seed = 13;
    noise(room, 16000 * 9, &seed); // -60 dBFS
    for (int64_t i = 16000; i < 16000 * 7; i++) room[i] += 0.0141f * (float)sin(2 * M_PI * 200 * i / 16000.0); // -40 dBFS
    nm_vad_push(v, room, 16000 * 9, on_utt, &u);
    nm_vad_flush(v, on_utt, &u);
    printf("  6 s of a steady sound 20 dB over the room: %d utterance(s), the first %.2f-%.2f s\n", u.n,
           u.t0[0] / 16000.0, (u.t0[0] + u.len[0]) / 16000.0);
    NM_CHECK(u.n == 1 && u.t0[0] <= 16000 && u.t0[0] + u.len[0] >= 16000 * 7);
    nm_vad_free(v);
    // a NaN in the stream is a silent frame, and the cutter goes on
    NM_CHECK(nm_vad_create(&p, &v, err, sizeof err) == NM_OK);
    u.n = 0;
    room[0] = NAN;
    nm_vad_push(v, room, 16000 * 9, on_utt, &u);
    nm_vad_flush(v, on_utt, &u);
    NM_CHECK(u.n == 1);
    free(room);
    nm_vad_free(v);
    // parameters out of range
    p = nm_vad_default_params();
    p.post_ms = 900; // more than end_silence_ms
    NM_CHECK(nm_vad_create(&p, &v, err, sizeof err) == NM_ERR_INVALID_ARG && !v && strstr(err, "post_ms"));
    p = nm_vad_default_params();
    p.rate = 10;
    NM_CHECK(nm_vad_create(&p, &v, err, sizeof err) == NM_ERR_INVALID_ARG);
    NM_CHECK(nm_vad_create(NULL, &v, err, sizeof err) == NM_ERR_INVALID_ARG);
    nm_vad_push(NULL, x, 10, on_utt, &u); // no-ops
    nm_vad_flush(NULL, on_utt, &u);
    free(x);
    nm_audio_free(&sp);
}


// Decoding straight into a caller's buffer (a slot) gives the samples
// nm_audio_load gives, bit for bit, resampled or not; a buffer too small is
// NM_ERR_RANGE; the probe sizes the buffer from the header.
NM_TEST(load_into_a_slot) {
    static const char *files[] = {"tests/data/speech/tts_16k.wav", "tests/data/speech/tts_48k.wav",
                                  "tests/data/speech/tts_8k.wav", "tests/data/speech/tts_long.ogg"};
    char err[256];
    for (size_t k = 0; k < sizeof files / sizeof files[0]; k++) {
        nm_audio a = {0};
        NM_CHECK(nm_audio_load(files[k], 16000, &a, err, sizeof err) == NM_OK);
        if (a.n < 2) continue; // (not there: run from the repo root; below writes at a.n - 1)
        int64_t cap = 0, n = -1;
        NM_CHECK(nm_audio_probe(files[k], 16000, &cap, err, sizeof err) == NM_OK);
        NM_CHECK(cap >= a.n && cap <= a.n + 70);
        float *dst = malloc(sizeof(float) * (size_t)(cap + 1));
        dst[cap] = 12345.0f; // past the end: never written
        NM_CHECK(nm_audio_load_into(files[k], 16000, dst, cap, &n, err, sizeof err) == NM_OK);
        NM_CHECK(n == a.n && a.pcm && !memcmp(dst, a.pcm, sizeof(float) * (size_t)a.n) && dst[cap] == 12345.0f);
        // one sample short of the audio: refused, nothing past the buffer written
        dst[a.n - 1] = 12345.0f;
        nm_status st = nm_audio_load_into(files[k], 16000, dst, a.n - 1, &n, err, sizeof err);
        NM_CHECK(st == NM_ERR_RANGE && n == 0 && dst[a.n - 1] == 12345.0f);
        if (st != NM_ERR_RANGE) fprintf(stderr, "  %s: %s (%s)\n", files[k], nm_status_str(st), err);
        free(dst);
        nm_audio_free(&a);
    }
    int64_t cap = 0, n = 0;
    float one;
    NM_CHECK(nm_audio_probe("-", 16000, &cap, err, sizeof err) == NM_ERR_UNSUPPORTED && cap == 0);
    NM_CHECK(nm_audio_probe("/nonexistent.wav", 16000, &cap, err, sizeof err) == NM_ERR_UNSUPPORTED);
    NM_CHECK(nm_audio_load_into("tests/data/speech/tts_16k.wav", 0, &one, 1, &n, err, sizeof err) == NM_ERR_INVALID_ARG);
    NM_CHECK(nm_audio_load_into("tests/data/speech/tts_16k.wav", 16000, NULL, 1, &n, err, sizeof err) == NM_ERR_INVALID_ARG);
    NM_CHECK(nm_audio_load_into("/nonexistent.wav", 16000, &one, 1, &n, err, sizeof err) == NM_ERR_IO);
}

int main(int argc, char **argv) {
    atexit(cleanup_tmp);
    return nmtest_main(argc, argv);
}
