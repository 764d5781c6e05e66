// The Piper engine (piper.h): phonemes as Piper makes them, VITS (vits.c), and
// the samples as piper-tts gives them (each sentence peak-normalized, times the
// volume, clipped, scaled by 32767 and truncated to 16 bits).
#include "bricks/tts/piper/piper.h"

#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/fail.h"
#include "gguf/gguf.h"

#include "bricks/tts/piper/nfd_table.h"

#define DEFAULT_VOICE "en_US-joe-medium"
#define STREAM_PEAK 0.5f // the peak a streamed sentence is scaled by at least (see emit)

// ---- NFD ---------------------------------------------------------------------------------------

static int cmp_dec(const void *k, const void *e) {
    const uint32_t a = *(const uint32_t *)k, b = *(const uint32_t *)e;
    return a < b ? -1 : a > b;
}

static uint8_t ccc_of(uint32_t cp) {
    size_t lo = 0, hi = sizeof nfd_ccc / sizeof nfd_ccc[0];
    while (lo < hi) {
        const size_t mid = (lo + hi) / 2;
        if (nfd_ccc[mid].cp == cp) return nfd_ccc[mid].ccc;
        if (nfd_ccc[mid].cp < cp) lo = mid + 1;
        else hi = mid;
    }
    return 0;
}

// One code point of UTF-8 at s (n bytes left): its value, *len its bytes (1 and U+FFFD where invalid).
static uint32_t utf8_next(const unsigned char *s, size_t n, size_t *len) {
    const unsigned char c = s[0];
    const int k = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    *len = 1;
    if (k == 0 || (size_t)k > n) return k == 1 ? c : 0xFFFD;
    uint32_t cp = k == 1 ? c : k == 2 ? c & 0x1Fu : k == 3 ? c & 0x0Fu : c & 0x07u;
    for (int i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0xFFFD;
        cp = cp << 6 | (s[i] & 0x3Fu);
    }
    static const uint32_t least[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < least[k] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0xFFFD;
    *len = (size_t)k;
    return cp;
}

int64_t nm_nfd(const char *s, size_t n, uint32_t *cps, int64_t cap) {
    int64_t m = 0;
    const unsigned char *p = (const unsigned char *)s;
#define PUT(x) (m < cap ? (void)(cps[m] = (x)) : (void)0, m++)
    for (size_t i = 0; i < n;) {
        size_t len;
        const uint32_t cp = utf8_next(p + i, n - i, &len);
        i += len;
        if (cp >= 0xAC00 && cp <= 0xD7A3) { // Hangul: L V (T)
            const uint32_t k = cp - 0xAC00;
            PUT(0x1100 + k / 588);
            PUT(0x1161 + (k % 588) / 28);
            if (k % 28) PUT(0x11A7 + k % 28);
            continue;
        }
        const void *e = bsearch(&cp, nfd_dec, sizeof nfd_dec / sizeof nfd_dec[0], sizeof nfd_dec[0], cmp_dec);
        if (!e) {
            PUT(cp);
            continue;
        }
        const uint32_t *d = nfd_dec[(size_t)((const char *)e - (const char *)nfd_dec) / sizeof nfd_dec[0]].d;
        for (int j = 0; j < NFD_MAX && d[j]; j++) PUT(d[j]);
    }
#undef PUT
    // canonical order: within each run of marks (class > 0), a stable sort by class
    const int64_t k = m < cap ? m : cap;
    for (int64_t i = 1; i < k; i++) {
        const uint8_t c = ccc_of(cps[i]);
        if (!c) continue;
        for (int64_t j = i; j > 0; j--) {
            const uint8_t b = ccc_of(cps[j - 1]);
            if (!b || b <= c) break;
            const uint32_t t = cps[j];
            cps[j] = cps[j - 1], cps[j - 1] = t;
        }
    }
    return m;
}

// ---- phonemes ---------------------------------------------------------------------------------

typedef struct ph_job {
    const nm_vits *v;
    nm_piper_sentences *out;
    int64_t cap_ids;
    int32_t cap_sent;
    bool open;       // a sentence has begun (its ^ _ written)
    uint32_t *cps;   // scratch for a clause's code points
    int64_t cap_cps;
    char *buf;       // a clause's IPA, its flags dropped, its terminator added
    size_t cap_buf;
} ph_job;

static bool push_id(ph_job *j, int32_t id) {
    nm_piper_sentences *o = j->out;
    if (o->n_ids == j->cap_ids) {
        const int64_t cap = j->cap_ids ? 2 * j->cap_ids : 256;
        int32_t *p = realloc(o->ids, sizeof *p * (size_t)cap);
        if (!p) return false;
        o->ids = p, j->cap_ids = cap;
    }
    o->ids[o->n_ids++] = id;
    return true;
}

// The ids of a phoneme string (a code point's UTF-8, or "^" "_" "$") and a pad after it (pad: false for "$").
static bool push_phoneme(ph_job *j, const char *s, size_t len, bool pad) {
    int32_t ids[16];
    const int32_t k = nm_vits_phoneme_ids(j->v, s, len, ids, 16);
    if (k == 0) {
        j->out->n_missing++;
        return true;
    }
    for (int32_t i = 0; i < k && i < 16; i++)
        if (!push_id(j, ids[i])) return false;
    if (pad) {
        const int32_t kp = nm_vits_phoneme_ids(j->v, "_", 1, ids, 16);
        for (int32_t i = 0; i < kp && i < 16; i++)
            if (!push_id(j, ids[i])) return false;
    }
    return true;
}

static bool begin_sentence(ph_job *j) {
    if (j->open) return true;
    nm_piper_sentences *o = j->out;
    if (o->n + 2 > j->cap_sent) {
        const int32_t cap = j->cap_sent ? 2 * j->cap_sent : 16;
        int32_t *p = realloc(o->start, sizeof *p * (size_t)cap);
        if (!p) return false;
        o->start = p, j->cap_sent = cap;
    }
    o->start[o->n] = (int32_t)o->n_ids;
    j->open = true;
    return push_phoneme(j, "^", 1, true);
}

static bool end_sentence(ph_job *j) {
    if (!j->open) return true;
    if (!push_phoneme(j, "$", 1, false)) return false;
    j->out->n++;
    j->out->start[j->out->n] = (int32_t)j->out->n_ids;
    j->open = false;
    return true;
}

static nm_status on_clause(void *user, const char *ipa, char term, bool eos) {
    ph_job *j = user;
    const size_t n = strlen(ipa);
    if (n + 3 > j->cap_buf) {
        char *b = realloc(j->buf, n + 64);
        if (!b) return NM_ERR_NOMEM;
        j->buf = b, j->cap_buf = n + 64;
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++) { // the language switches "(en)" dropped
        if (ipa[i] == '(') {
            const char *c = strchr(ipa + i + 1, ')');
            if (c && c > ipa + i + 1) {
                i = (size_t)(c - ipa);
                continue;
            }
        }
        j->buf[m++] = ipa[i];
    }
    if (term) j->buf[m++] = term;
    if (term == ',' || term == ':' || term == ';') j->buf[m++] = ' ';
    const int64_t k = nm_nfd(j->buf, m, NULL, 0);
    if (k > j->cap_cps) {
        uint32_t *c = realloc(j->cps, sizeof *c * (size_t)k);
        if (!c) return NM_ERR_NOMEM;
        j->cps = c, j->cap_cps = k;
    }
    nm_nfd(j->buf, m, j->cps, k);
    if (k > 0 && !begin_sentence(j)) return NM_ERR_NOMEM; // (an empty clause, a closing quote's: no sentence)
    for (int64_t i = 0; i < k; i++) {
        char u[4];
        const uint32_t c = j->cps[i];
        const size_t len = c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
        if (len == 1) u[0] = (char)c;
        else if (len == 2) u[0] = (char)(0xC0 | c >> 6), u[1] = (char)(0x80 | (c & 0x3F));
        else if (len == 3) u[0] = (char)(0xE0 | c >> 12), u[1] = (char)(0x80 | (c >> 6 & 0x3F)), u[2] = (char)(0x80 | (c & 0x3F));
        else
            u[0] = (char)(0xF0 | c >> 18), u[1] = (char)(0x80 | (c >> 12 & 0x3F)), u[2] = (char)(0x80 | (c >> 6 & 0x3F)),
            u[3] = (char)(0x80 | (c & 0x3F));
        if (!push_phoneme(j, u, len, true)) return NM_ERR_NOMEM;
    }
    if (eos && !end_sentence(j)) return NM_ERR_NOMEM;
    return NM_OK;
}

nm_status nm_piper_phonemize(const nm_vits *v, const char *data_dir, const char *text, nm_piper_sentences *out,
                             char *err, size_t err_size) {
    memset(out, 0, sizeof *out);
    ph_job j = {.v = v, .out = out};
    const char *voice = nm_vits_get_info(v)->espeak_voice;
    nm_status st = nm_espeak_clauses(data_dir, voice[0] ? voice : "en-us", text, on_clause, &j, err, err_size);
    if (st == NM_OK && !end_sentence(&j)) st = NM_ERR_NOMEM;
    if (st == NM_ERR_NOMEM) nm_fail(st, err, err_size, "piper: out of memory for the phonemes");
    free(j.cps);
    free(j.buf);
    if (st != NM_OK) nm_piper_sentences_free(out);
    return st;
}

void nm_piper_sentences_free(nm_piper_sentences *s) {
    if (!s) return;
    free(s->ids);
    free(s->start);
    memset(s, 0, sizeof *s);
}

// ---- voices -------------------------------------------------------------------------------------

static void model_dir(char *buf, size_t size) {
    const char *d = getenv("NM_MODEL_DIR"), *home = getenv("HOME");
    if (d && *d) snprintf(buf, size, "%s", d);
    else snprintf(buf, size, "%s/.cache/nanomind/models", home ? home : ".");
}

static bool is_file(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

bool nm_piper_voice_path(const char *name, char *path, size_t size) {
    if (!name) name = DEFAULT_VOICE;
    const size_t n = strlen(name);
    if (strchr(name, '/') || (n > 5 && !strcmp(name + n - 5, ".gguf"))) {
        snprintf(path, size, "%s", name);
        return is_file(path);
    }
    char dir[PATH_MAX];
    model_dir(dir, sizeof dir);
    snprintf(path, size, "%s/piper-%s.gguf", dir, name);
    if (is_file(path)) return true;
    snprintf(path, size, "%s/%s.gguf", dir, name);
    return is_file(path);
}

// ---- the engine -------------------------------------------------------------------------------

typedef struct piper_state {
    nm_vits *v;
    nm_vits_ctx *cx;         // the synthesis's threads, scratch and device (made for v)
    char device[64];         // the device HiFi-GAN runs on ("" : the CPU)
    int32_t n_threads;
    char path[PATH_MAX];
    char data_dir[PATH_MAX]; // espeak-ng's ("": its own search)
    int32_t rate_wpm, volume, stream_ms;
    float noise_scale, length_scale, noise_w; // < 0: the voice's
    uint64_t n_synth;                       // sentences so far: each one's noise seed
} piper_state;

static nm_status check(const nm_tts_params *p, char *err, size_t err_size) {
    if (p->rate_wpm < 80 || p->rate_wpm > 450)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "tts: rate %d words per minute is outside 80..450",
                       (int)p->rate_wpm);
    if (p->pitch != 50)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "tts: pitch %d: a Piper voice has no pitch control "
                       "(espeak-ng's)", (int)p->pitch);
    if (p->volume < 0 || p->volume > 200)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "tts: volume %d is outside 0..200", (int)p->volume);
    if (p->stream_ms < 0 || p->stream_ms > 60000)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "tts: stream_ms %d is outside 0..60000", (int)p->stream_ms);
    if (!(p->length_scale < 0 || (p->length_scale >= 0.05f && p->length_scale <= 20)) ||
        !(p->noise_scale < 0 || p->noise_scale <= 5) || !(p->noise_w < 0 || p->noise_w <= 5))
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "tts: length scale %g (0.05..20), noise scale %g (0..5) or "
                       "noise w %g (0..5) out of range", (double)p->length_scale, (double)p->noise_scale,
                       (double)p->noise_w);
    return NM_OK;
}

// The voice of p into s (loaded unless it is the one s has).
static nm_status load_voice(piper_state *s, const nm_tts_params *p, char *err, size_t err_size) {
    char path[PATH_MAX];
    if (!nm_piper_voice_path(p->voice, path, sizeof path)) {
        char dir[PATH_MAX];
        model_dir(dir, sizeof dir);
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "tts: no Piper voice '%s' (a voice GGUF, or a name "
                       "of one in %s: `nanomind say --tts piper --list-voices` lists them)", p->voice ? p->voice :
                       DEFAULT_VOICE, dir);
    }
    if (s->v && !strcmp(path, s->path)) return NM_OK;
    nm_vits *v = NULL;
    nm_status st = nm_vits_load(path, &v, err, err_size);
    if (st != NM_OK) return st;
    nm_vits_free(s->v);
    s->v = v;
    snprintf(s->path, sizeof s->path, "%s", path);
    return NM_OK;
}

static void set(piper_state *s, const nm_tts_params *p) {
    s->rate_wpm = p->rate_wpm, s->volume = p->volume, s->stream_ms = p->stream_ms;
    s->noise_scale = p->noise_scale, s->length_scale = p->length_scale, s->noise_w = p->noise_w;
}

static nm_status warm(piper_state *s, char *err, size_t err_size);

static nm_status pi_open(const nm_tts_params *p, void **state, int32_t *native_rate, char *err, size_t err_size) {
    *state = NULL;
    nm_status st = check(p, err, err_size);
    if (st != NM_OK) return st;
    piper_state *s = calloc(1, sizeof *s);
    if (!s) return nm_fail(NM_ERR_NOMEM, err, err_size, "tts: out of memory");
    if ((st = load_voice(s, p, err, err_size)) != NM_OK) {
        free(s);
        return st;
    }
    snprintf(s->device, sizeof s->device, "%s", p->device ? p->device : "");
    s->n_threads = p->n_threads;
    if (!strcmp(s->device, "auto")) { // OpenCL's first GPU where there is one, else the CPU
        st = nm_vits_ctx_create(s->v, "opencl:auto", s->n_threads, &s->cx, err, err_size);
        snprintf(s->device, sizeof s->device, "%s", st == NM_OK ? "opencl:auto" : "cpu");
        if (st == NM_ERR_UNSUPPORTED) st = nm_vits_ctx_create(s->v, NULL, s->n_threads, &s->cx, err, err_size);
    } else {
        st = nm_vits_ctx_create(s->v, s->device[0] ? s->device : NULL, s->n_threads, &s->cx, err, err_size);
    }
    if (st != NM_OK) {
        nm_vits_free(s->v);
        free(s);
        return st;
    }
    snprintf(s->data_dir, sizeof s->data_dir, "%s", p->data_dir ? p->data_dir : "");
    set(s, p);
    if ((st = warm(s, err, err_size)) != NM_OK) {
        nm_vits_ctx_free(s->cx);
        nm_vits_free(s->v);
        free(s);
        return st;
    }
    *native_rate = nm_vits_get_info(s->v)->sample_rate;
    *state = s;
    return NM_OK;
}

static nm_status pi_retune(void *state, const nm_tts_params *p, char *err, size_t err_size) {
    piper_state *s = state;
    nm_status st = check(p, err, err_size);
    if (st != NM_OK) return st;
    const int32_t rate = nm_vits_get_info(s->v)->sample_rate;
    piper_state t = *s;
    t.v = NULL;
    if ((st = load_voice(&t, p, err, err_size)) != NM_OK) return st;
    if (t.v && nm_vits_get_info(t.v)->sample_rate != rate) {
        nm_vits_free(t.v);
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "tts: voice '%s' speaks at %d Hz, not this one's %d Hz",
                       p->voice ? p->voice : DEFAULT_VOICE, (int)nm_vits_get_info(t.v)->sample_rate, (int)rate);
    }
    if (t.v) { // another voice: a context made for it, on the same device
        nm_vits_ctx *cx = NULL;
        if ((st = nm_vits_ctx_create(t.v, s->device[0] ? s->device : NULL, s->n_threads, &cx, err, err_size)) != NM_OK) {
            nm_vits_free(t.v);
            return st;
        }
        t.cx = cx;
        set(&t, p);
        if ((st = warm(&t, err, err_size)) != NM_OK) { // (its espeak-ng voice missing: this one stays)
            nm_vits_ctx_free(cx);
            nm_vits_free(t.v);
            return st;
        }
        nm_vits_ctx_free(s->cx);
        nm_vits_free(s->v);
        *s = t;
    }
    set(s, p);
    return NM_OK;
}

// A sentence's samples as piper-tts writes them (divided by the peak, times the volume, clipped, times 32767,
// truncated), to the sink in chunks of 0.1 s. A sentence sent in parts (stream_ms) cannot know its peak
// when its first part goes: it takes that part's peak, or STREAM_PEAK where that is lower (a quiet start:
// Piper voices' tanh output peaks near 0.45 in a sentence), for all of its parts, the rest clipped.
typedef struct out_job {
    nm_tts_sink_fn sink;
    void *user;
    int32_t volume, rate;
    bool have_peak;
    float peak;
} out_job;

static nm_status emit(void *user, const float *x, int64_t n, bool last) {
    out_job *o = user;
    if (!o->have_peak) {
        o->peak = 0;
        for (int64_t i = 0; i < n; i++) o->peak = fmaxf(o->peak, fabsf(x[i]));
        if (!last && o->peak < STREAM_PEAK) o->peak = STREAM_PEAK;
        o->have_peak = true;
    }
    const float mx = o->peak, vol = (float)o->volume / 100.0f;
    int16_t buf[4096];
    const int64_t chunk = o->rate / 10 < 4096 ? o->rate / 10 : 4096;
    for (int64_t i = 0; i < n; i += chunk) {
        const int64_t m = n - i < chunk ? n - i : chunk;
        for (int64_t k = 0; k < m; k++) { // (piper-tts's float32 steps: / peak, * volume, clip, * 32767, truncate)
            float y = mx < 1e-8f ? 0.0f : x[i + k] / mx;
            if (o->volume != 100) y *= vol;
            buf[k] = (int16_t)(fminf(fmaxf(y, -1.0f), 1.0f) * 32767.0f);
        }
        nm_status st = o->sink(o->user, buf, m);
        if (st != NM_OK) return st;
    }
    return last ? NM_OK : o->sink(o->user, NULL, 0); // (a part before the rest: out now)
}

static nm_status pi_synth(void *state, const char *text, nm_tts_sink_fn sink, void *user, char *err, size_t err_size) {
    piper_state *s = state;
    nm_piper_sentences ps;
    nm_status st = nm_piper_phonemize(s->v, s->data_dir[0] ? s->data_dir : NULL, text, &ps, err, err_size);
    if (st != NM_OK) return st;
    const nm_vits_info *in = nm_vits_get_info(s->v);
    const float length = (s->length_scale >= 0 ? s->length_scale : in->length_scale) * 175.0f / (float)s->rate_wpm;
    const int32_t first = s->stream_ms > 0 ? (int32_t)((int64_t)s->stream_ms * in->sample_rate / 1000 / in->hop) : 0;
    for (int32_t i = 0; i < ps.n && st == NM_OK; i++) {
        const int32_t a = ps.start[i], b = ps.start[i + 1];
        if (b - a <= 3) continue; // (^ _ $: nothing said)
        const nm_vits_scales sc = {.noise_scale = s->noise_scale >= 0 ? s->noise_scale : in->noise_scale,
                                   .length_scale = length < 0.05f ? 0.05f : length > 20 ? 20 : length,
                                   .noise_w = s->noise_w >= 0 ? s->noise_w : in->noise_w,
                                   .seed = ++s->n_synth};
        out_job o = {.sink = sink, .user = user, .volume = s->volume, .rate = in->sample_rate};
        // (only the first sentence in parts: the later ones are made while the earlier ones play)
        st = nm_vits_synth_stream(s->v, s->cx, ps.ids + a, b - a, &sc, first > 0 && i == 0 ? first : 0, emit, &o, err,
                                  err_size);
    }
    nm_piper_sentences_free(&ps);
    return st;
}

static nm_status discard(void *user, const int16_t *pcm, int64_t n) {
    (void)user, (void)pcm, (void)n;
    return NM_OK;
}

// One short sentence spoken into nothing, as the engine opens: espeak-ng's data and dictionary read, the
// context's buffers grown and their pages touched, so an answer's first audio waits for none of it. Its
// espeak-ng voice or data missing fails here. The sentences' seeds start after it as before.
static nm_status warm(piper_state *s, char *err, size_t err_size) {
    const uint64_t n = s->n_synth;
    const nm_status st = pi_synth(s, "Ready.", discard, NULL, err, err_size);
    s->n_synth = n;
    return st;
}

// The voice's arithmetic (all f32: flops_by_type[0]) and weights, and its buffers' peak: about the
// decoder's widest activations six times over (a sentence of `seconds`).
static void pi_estimate(void *state, double seconds, nm_brick_cost *e) {
    const piper_state *s = state;
    double flops = 0, dec = 0;
    uint64_t wb = 0;
    nm_vits_cost(s->v, seconds, &flops, &dec, &wb);
    const double samples = seconds * nm_vits_get_info(s->v)->sample_rate;
    e->flops += flops;
    e->flops_by_type[0] += flops;
    e->weight_bytes_read += (double)wb;
    e->weight_bytes += wb;
    e->act_bytes += 4.0 * 6 * 32 * samples; // (the last stage's 32 channels a sample, each tensor read and written)
    e->peak_bytes += wb + (uint64_t)(4.0 * 6 * 32 * samples);
}

static const char *pi_device(void *state) { return nm_vits_ctx_device(((piper_state *)state)->cx); }

static void pi_close(void *state) {
    piper_state *s = state;
    if (!s) return;
    nm_vits_free(s->v);
    nm_vits_ctx_free(s->cx);
    free(s);
}

// The voices in the model folder (piper-NAME.gguf), each named NAME, described by its language and quality.
static nm_status pi_list_voices(const char *data_dir, nm_tts_voice_fn fn, void *user, char *err, size_t err_size) {
    (void)data_dir;
    char dir[PATH_MAX];
    model_dir(dir, sizeof dir);
    DIR *d = opendir(dir);
    if (!d) return NM_OK; // (no folder: no voices)
    char **names = NULL;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        const size_t len = strlen(e->d_name);
        if (len <= 11 || strncmp(e->d_name, "piper-", 6) || strcmp(e->d_name + len - 5, ".gguf")) continue;
        char **m = realloc(names, sizeof *m * (size_t)(n + 1));
        if (!m) break;
        names = m;
        if ((names[n] = strdup(e->d_name))) n++;
    }
    closedir(d);
    for (int i = 1; i < n; i++) // (sorted: the same list everywhere)
        for (int k = i; k > 0 && strcmp(names[k - 1], names[k]) > 0; k--) {
            char *t = names[k];
            names[k] = names[k - 1], names[k - 1] = t;
        }
    bool go = true;
    for (int i = 0; i < n; i++) {
        char path[PATH_MAX + 300], name[256], desc[256] = "", id[64] = "piper";
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        snprintf(name, sizeof name, "%.*s", (int)(strlen(names[i]) - 11), names[i] + 6);
        nm_gguf *g = NULL;
        if (go && nm_gguf_open(path, &g, NULL, 0) == NM_OK) {
            nm_str lang, q, arch;
            if (nm_gguf_get_str(g, "general.architecture", &arch) && nm_str_eq(arch, "piper")) {
                const bool hl = nm_gguf_get_str(g, "piper.language", &lang), hq = nm_gguf_get_str(g, "piper.quality", &q);
                snprintf(desc, sizeof desc, "Piper %.*s%s%.*s", hl ? (int)lang.len : 0, hl ? lang.ptr : "",
                         hq ? ", " : "", hq ? (int)q.len : 0, hq ? q.ptr : "");
                nm_tts_voice_info info = {.name = name, .description = desc, .identifier = id};
                go = fn(user, &info);
            }
            nm_gguf_close(g);
        }
        free(names[i]);
    }
    free(names);
    (void)err, (void)err_size; // (a voice that cannot be read is not listed: nothing fails)
    return NM_OK;
}

const nm_tts_engine_i nm_tts_piper_engine = {
    .version = NM_TTS_ENGINE_VERSION,
    .name = "piper",
    .open = pi_open,
    .synth = pi_synth,
    .close = pi_close,
    .list_voices = pi_list_voices,
    .retune = pi_retune,
    .device = pi_device,
    .estimate = pi_estimate,
};
