// The espeak-ng engine of the TTS brick (tts.h): libespeak-ng in synchronous
// mode, its audio handed to the brick's sink chunk by chunk.
//
// espeak-ng is one engine per process (global state, not thread-safe), so
// everything here runs under g_lock. It is initialized on first use and never
// terminated: espeak_ng_Terminate in 1.51 can hang joining its event thread,
// and initializing twice is not supported. What it allocates stays reachable
// from its globals (no leak report).
#include "bricks/tts/tts.h"
#include "core/fail.h"

#include <errno.h>
#include <limits.h>
#include <locale.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include <espeak-ng/espeak_ng.h>
#include <espeak-ng/speak_lib.h>

#define ESPEAK_CHUNK_MS 100 // audio per synthesis callback (espeak-ng's buffer length)
#define VOICE_MAX 64        // longest voice name we pass on

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static bool g_ready;                // espeak-ng initialized
static int32_t g_rate;              // its sample rate
static char g_dir[PATH_MAX];        // data_dir given at initialization ("" for the default search)
static char g_cur_voice[VOICE_MAX + 1]; // the voice espeak-ng has loaded ("" none)
static locale_t g_utf8 = (locale_t)0;   // C.UTF-8 for synthesis (espeak-ng classifies characters with it)
// The names a voice may have, listed by espeak-ng once at initialization (voice_listed): every voice's
// identifier, name and languages, and the variants' names (the files of its voices/!v folder).
static char **g_voices, **g_variants;
static int g_n_voices, g_n_variants;

// The synthesis in progress (under g_lock): where the callback sends audio.
typedef struct job {
    nm_tts_sink_fn sink;
    void *user;
    nm_status st; // the sink's error, if it stopped the synthesis
} job;
static job *g_job;

typedef struct espeak_state {
    char voice[VOICE_MAX + 1];
    int32_t rate_wpm, pitch, volume;
} espeak_state;

// espeak-ng's message for a status, with the detail its context holds (the
// file it could not open), on one line.
static void status_message(espeak_ng_STATUS s, espeak_ng_ERROR_CONTEXT ctx, char *buf, size_t size) {
    buf[0] = '\0';
    char *mem = NULL;
    size_t len = 0;
    FILE *f = ctx ? open_memstream(&mem, &len) : NULL;
    if (f) {
        espeak_ng_PrintStatusCodeMessage(s, f, ctx);
        fclose(f);
        snprintf(buf, size, "%s", mem ? mem : "");
        free(mem);
    }
    if (!buf[0]) espeak_ng_GetStatusCodeMessage(s, buf, size);
    for (char *p = buf; *p; p++)
        if (*p == '\n' || *p == '\r') *p = (p[1] ? ' ' : '\0');
}

static int synth_cb(short *wav, int n, espeak_EVENT *events) {
    (void)events;
    job *j = g_job;
    if (!j || j->st != NM_OK) return 1; // 1: abort the synthesis
    if (wav && n > 0) {
        nm_status st = j->sink(j->user, (const int16_t *)wav, n);
        if (st != NM_OK) {
            j->st = st;
            return 1;
        }
    }
    return 0;
}

static bool is_file(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

// Appends a copy of name to *list (*n entries). False: out of memory.
static bool list_add(char ***list, int *n, const char *name) {
    char **l = realloc(*list, sizeof *l * (size_t)(*n + 1));
    if (!l) return false;
    *list = l;
    if (!(l[*n] = strdup(name))) return false;
    ++*n;
    return true;
}

// The voices and variants espeak-ng lists, into g_voices and g_variants (under g_lock, once).
static nm_status list_names_locked(char *err, size_t err_size) {
    bool ok = true;
    const espeak_VOICE **vs = espeak_ListVoices(NULL); // (no variants, no mbrola voices)
    for (int i = 0; ok && vs && vs[i]; i++) {
        if (vs[i]->identifier) ok = list_add(&g_voices, &g_n_voices, vs[i]->identifier);
        if (ok && vs[i]->name) ok = list_add(&g_voices, &g_n_voices, vs[i]->name);
        // languages: a priority byte, then the language, repeated; a 0 byte ends them
        for (const char *l = vs[i]->languages; ok && l && *l; l += strlen(l + 1) + 2)
            ok = list_add(&g_voices, &g_n_voices, l + 1);
    }
    espeak_VOICE sel;
    memset(&sel, 0, sizeof sel);
    sel.languages = "variant";
    vs = ok ? espeak_ListVoices(&sel) : NULL; // identifiers "!v/NAME"
    for (int i = 0; ok && vs && vs[i]; i++)
        if (vs[i]->identifier && !strncmp(vs[i]->identifier, "!v/", 3))
            ok = list_add(&g_variants, &g_n_variants, vs[i]->identifier + 3);
    return ok ? NM_OK : nm_fail(NM_ERR_NOMEM, err, err_size, "tts: out of memory");
}

// Whether espeak-ng lists voice: a voice's identifier, name or language (any case, as espeak-ng
// takes them), then optionally "+" and a variant's name (as its file is named) or number. espeak-ng
// makes file paths of these names: "en+../../../etc/passwd" opened a file out of its folder, and a
// variant name of 40 bytes or more overflowed its buffer (glibc's abort). Only a listed name gets there.
static bool voice_listed(const char *voice) {
    const char *plus = strchr(voice, '+');
    const size_t nb = plus ? (size_t)(plus - voice) : strlen(voice);
    bool base = false;
    for (int i = 0; i < g_n_voices && !base; i++)
        base = strlen(g_voices[i]) == nb && !strncasecmp(g_voices[i], voice, nb);
    if (!base || !plus) return base;
    const char *var = plus + 1;
    if (var[0] >= '0' && var[0] <= '9') // a variant number: one or two digits
        return !var[1] || (var[1] >= '0' && var[1] <= '9' && !var[2]);
    for (int i = 0; i < g_n_variants; i++)
        if (!strcmp(g_variants[i], var)) return true;
    return false;
}

// Initializes espeak-ng once (under g_lock). data_dir NULL: espeak-ng's own search.
static nm_status init_locked(const char *data_dir, char *err, size_t err_size) {
    const char *want = data_dir ? data_dir : "";
    if (g_ready) {
        if (!data_dir || !strcmp(g_dir, want)) return NM_OK;
        return nm_fail(NM_ERR_STATE, err, err_size,
                       "tts: espeak-ng is already initialized from %s; one data directory per process",
                       g_dir[0] ? g_dir : "its default data directory");
    }
    if (strlen(want) >= sizeof g_dir)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "tts: espeak-ng data directory path too long");
    if (data_dir) {
        // espeak-ng silently falls back to its default data when this path is
        // not a directory: check it here so the caller learns about a typo.
        char p[PATH_MAX + 32];
        struct stat sb;
        if (stat(data_dir, &sb) != 0)
            return nm_fail(NM_ERR_IO, err, err_size, "tts: espeak-ng data directory '%s': %s", data_dir,
                           strerror(errno));
        if (!S_ISDIR(sb.st_mode))
            return nm_fail(NM_ERR_IO, err, err_size, "tts: espeak-ng data directory '%s' is not a directory",
                           data_dir);
        snprintf(p, sizeof p, "%s/espeak-ng-data/phondata", data_dir);
        bool nested = is_file(p);
        snprintf(p, sizeof p, "%s/phondata", data_dir);
        if (!nested && !is_file(p))
            return nm_fail(NM_ERR_IO, err, err_size,
                           "tts: no espeak-ng data in '%s' (no phondata there or in its espeak-ng-data/): "
                           "install espeak-ng-data or give the directory that holds it",
                           data_dir);
    }
    if (!g_utf8) g_utf8 = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t)0);
    if (!g_utf8) g_utf8 = newlocale(LC_CTYPE_MASK, "en_US.UTF-8", (locale_t)0);

    // espeak_ng_Initialize sets the process's LC_CTYPE to a UTF-8 locale; put
    // the caller's back (synthesis uses g_utf8 on its own thread instead).
    char old_ctype[256];
    const char *cur = setlocale(LC_CTYPE, NULL);
    snprintf(old_ctype, sizeof old_ctype, "%s", cur ? cur : "C");
    espeak_ng_InitializePath(data_dir);
    espeak_ng_ERROR_CONTEXT ctx = NULL;
    espeak_ng_STATUS s = espeak_ng_Initialize(&ctx);
    setlocale(LC_CTYPE, old_ctype);
    if (s != ENS_OK) {
        char msg[512];
        const char *path = NULL;
        espeak_Info(&path);
        status_message(s, ctx, msg, sizeof msg);
        espeak_ng_ClearErrorContext(&ctx);
        return nm_fail(NM_ERR_IO, err, err_size,
                       "tts: espeak-ng cannot load its data from %s: %s (install espeak-ng-data, or set "
                       "ESPEAK_DATA_PATH / data_dir)",
                       path && path[0] ? path : "its data directory", msg);
    }
    s = espeak_ng_InitializeOutput(ENOUTPUT_MODE_SYNCHRONOUS, ESPEAK_CHUNK_MS, NULL);
    if (s != ENS_OK) {
        char msg[256];
        status_message(s, NULL, msg, sizeof msg);
        return nm_fail(NM_ERR_NOMEM, err, err_size, "tts: espeak-ng output buffers: %s", msg);
    }
    espeak_SetSynthCallback(synth_cb);
    nm_status st = list_names_locked(err, err_size);
    if (st != NM_OK) return st;
    g_rate = espeak_ng_GetSampleRate();
    snprintf(g_dir, sizeof g_dir, "%s", want);
    g_cur_voice[0] = '\0';
    g_ready = true;
    return NM_OK;
}

// Loads a voice unless it is the one loaded (under g_lock).
static nm_status set_voice_locked(const char *voice, char *err, size_t err_size) {
    if (!strcmp(g_cur_voice, voice)) return NM_OK;
    if (!voice_listed(voice))
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size,
                       "tts: unknown espeak-ng voice '%s' (`nanomind say --list-voices` lists them; a variant "
                       "after '+' is a file of espeak-ng-data/voices/!v)", voice);
    g_cur_voice[0] = '\0';
    espeak_ng_STATUS s = espeak_ng_SetVoiceByName(voice); // a voice file ("en-us", "gmw/en", "en+f3")
    if (s == ENS_VOICE_NOT_FOUND) {
        // A language without a file of its name ("en-gb", "fr-fr"), as the espeak-ng command does.
        espeak_VOICE sel;
        memset(&sel, 0, sizeof sel);
        sel.languages = voice;
        s = espeak_ng_SetVoiceByProperties(&sel);
    }
    if (s == ENS_VOICE_NOT_FOUND)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size,
                       "tts: unknown espeak-ng voice '%s' (`nanomind say --list-voices` lists them)", voice);
    if (s != ENS_OK) {
        char msg[256];
        status_message(s, NULL, msg, sizeof msg);
        return nm_fail(NM_ERR_IO, err, err_size, "tts: cannot load espeak-ng voice '%s': %s", voice, msg);
    }
    snprintf(g_cur_voice, sizeof g_cur_voice, "%s", voice);
    return NM_OK;
}

static nm_status set_params_locked(const espeak_state *v, char *err, size_t err_size) {
    espeak_ng_STATUS s = espeak_ng_SetParameter(espeakRATE, v->rate_wpm, 0);
    if (s == ENS_OK) s = espeak_ng_SetParameter(espeakPITCH, v->pitch, 0);
    if (s == ENS_OK) s = espeak_ng_SetParameter(espeakVOLUME, v->volume, 0);
    if (s != ENS_OK) {
        char msg[256];
        status_message(s, NULL, msg, sizeof msg);
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "tts: espeak-ng parameters: %s", msg);
    }
    return NM_OK;
}

// p's voice, rate, pitch and volume within espeak-ng's ranges.
static nm_status check_params(const nm_tts_params *p, char *err, size_t err_size) {
    const char *voice = p->voice ? p->voice : "en-us";
    if (!voice[0]) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "tts: empty voice name");
    if (strlen(voice) > VOICE_MAX)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "tts: voice name longer than %d bytes", VOICE_MAX);
    if (p->rate_wpm < espeakRATE_MINIMUM || p->rate_wpm > espeakRATE_MAXIMUM)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "tts: rate %d words per minute is outside %d..%d",
                       (int)p->rate_wpm, espeakRATE_MINIMUM, espeakRATE_MAXIMUM);
    if (p->pitch < 0 || p->pitch > 100)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "tts: pitch %d is outside 0..100", (int)p->pitch);
    if (p->volume < 0 || p->volume > 200)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "tts: volume %d is outside 0..200", (int)p->volume);
    return NM_OK;
}

// Another voice and settings for the syntheses that follow: the voice is
// loaded now, so an unknown one fails here and the state stays as it was.
static nm_status es_retune(void *state, const nm_tts_params *p, char *err, size_t err_size) {
    espeak_state *v = state;
    nm_status st = check_params(p, err, err_size);
    if (st != NM_OK) return st;
    const char *voice = p->voice ? p->voice : "en-us";
    pthread_mutex_lock(&g_lock);
    st = g_ready ? set_voice_locked(voice, err, err_size)
                 : nm_fail(NM_ERR_STATE, err, err_size, "tts: espeak-ng is not initialized");
    pthread_mutex_unlock(&g_lock);
    if (st != NM_OK) return st;
    snprintf(v->voice, sizeof v->voice, "%s", voice);
    v->rate_wpm = p->rate_wpm;
    v->pitch = p->pitch;
    v->volume = p->volume;
    return NM_OK;
}

static nm_status es_open(const nm_tts_params *p, void **state, int32_t *native_rate, char *err, size_t err_size) {
    *state = NULL;
    const char *voice = p->voice ? p->voice : "en-us";
    if (p->device && strcmp(p->device, "cpu") != 0)
        return nm_fail(NM_ERR_UNSUPPORTED, err, err_size, "tts: espeak-ng runs on the CPU only, not on '%s' (a Piper "
                       "voice can run on OpenCL: --tts piper)", p->device);
    nm_status cst = check_params(p, err, err_size);
    if (cst != NM_OK) return cst;
    espeak_state *v = calloc(1, sizeof *v);
    if (!v) return nm_fail(NM_ERR_NOMEM, err, err_size, "tts: out of memory");
    snprintf(v->voice, sizeof v->voice, "%s", voice);
    v->rate_wpm = p->rate_wpm;
    v->pitch = p->pitch;
    v->volume = p->volume;

    pthread_mutex_lock(&g_lock);
    nm_status st = init_locked(p->data_dir, err, err_size);
    if (st == NM_OK) st = set_voice_locked(v->voice, err, err_size); // an unknown voice fails here, not later
    if (st == NM_OK) *native_rate = g_rate;
    pthread_mutex_unlock(&g_lock);
    if (st != NM_OK) {
        free(v);
        return st;
    }
    *state = v;
    return NM_OK;
}

static nm_status es_synth(void *state, const char *text, nm_tts_sink_fn sink, void *user, char *err,
                          size_t err_size) {
    espeak_state *v = state;
    job j = {.sink = sink, .user = user, .st = NM_OK};
    pthread_mutex_lock(&g_lock);
    nm_status st = g_ready ? NM_OK : nm_fail(NM_ERR_STATE, err, err_size, "tts: espeak-ng is not initialized");
    if (st == NM_OK) st = set_voice_locked(v->voice, err, err_size);
    if (st == NM_OK) st = set_params_locked(v, err, err_size);
    if (st == NM_OK) {
        locale_t old = g_utf8 ? uselocale(g_utf8) : (locale_t)0;
        g_job = &j;
        // No SSML, no end-of-text pause: the text is read as written.
        espeak_ERROR e = espeak_Synth(text, strlen(text) + 1, 0, POS_CHARACTER, 0, espeakCHARS_UTF8, NULL, NULL);
        g_job = NULL;
        if (old) uselocale(old);
        if (j.st != NM_OK) st = j.st; // the sink stopped it and said why
        else if (e != EE_OK)
            st = nm_fail(NM_ERR_IO, err, err_size, "tts: espeak-ng synthesis failed (%s)",
                         e == EE_BUFFER_FULL ? "buffer full" : e == EE_NOT_FOUND ? "not found" : "internal error");
    }
    pthread_mutex_unlock(&g_lock);
    return st;
}

static void es_close(void *state) { free(state); }

// The list is copied out under the lock and fn is called without it, so fn
// may open voices.
static nm_status es_list_voices(const char *data_dir, nm_tts_voice_fn fn, void *user, char *err, size_t err_size) {
    char **strs = NULL; // 3 per voice: name, description, identifier
    int n = 0;
    bool oom = false;
    pthread_mutex_lock(&g_lock);
    nm_status st = init_locked(data_dir, err, err_size);
    if (st == NM_OK) {
        const espeak_VOICE **vs = espeak_ListVoices(NULL); // espeak-ng's own array, valid until the next call
        while (vs && vs[n]) n++;
        strs = calloc((size_t)n * 3 + 1, sizeof *strs);
        oom = !strs;
        for (int i = 0; !oom && i < n; i++) {
            // languages: a priority byte, then the language name, repeated; the first is the voice's own.
            const char *lang = vs[i]->languages ? vs[i]->languages + 1 : "";
            const char *id = vs[i]->identifier ? vs[i]->identifier : "";
            strs[3 * i] = strdup(lang[0] ? lang : id);
            strs[3 * i + 1] = strdup(vs[i]->name ? vs[i]->name : "");
            strs[3 * i + 2] = strdup(id);
            oom = !strs[3 * i] || !strs[3 * i + 1] || !strs[3 * i + 2];
        }
        // The language is the name to offer if it selects a voice (most do);
        // else the identifier, which always does ("iro/chr"). Loading each
        // voice to know costs a few ms per voice. (After copying: loading a
        // voice may touch espeak-ng's list.)
        for (int i = 0; !oom && i < n; i++) {
            const char *name = strs[3 * i];
            if (strlen(name) <= VOICE_MAX && set_voice_locked(name, NULL, 0) == NM_OK) continue;
            char *id = strdup(strs[3 * i + 2]);
            if (!id) oom = true;
            else free(strs[3 * i]), strs[3 * i] = id;
        }
    }
    g_cur_voice[0] = '\0'; // the espeak_VOICE array is gone with the next call; the voice changed too
    pthread_mutex_unlock(&g_lock);
    if (st == NM_OK && oom) st = nm_fail(NM_ERR_NOMEM, err, err_size, "tts: out of memory");
    for (int i = 0; st == NM_OK && i < n; i++) {
        nm_tts_voice_info info = {.name = strs[3 * i], .description = strs[3 * i + 1], .identifier = strs[3 * i + 2]};
        if (!fn(user, &info)) break;
    }
    for (int i = 0; strs && i < 3 * n; i++) free(strs[i]);
    free(strs);
    return st;
}

// The clause's terminator as the text that espeak-ng consumed for it shows it ([a, b): the clause, what
// follows it up to the next one and, unless it is the last, the next one's first character, which
// espeak-ng reads ahead and keeps): the first of the punctuation run that ends it, after closing quotes
// and brackets; an ellipsis ("...", U+2026) is none, and not a sentence's end.
static void terminator_of(const char *a, const char *b, bool last, char *term, bool *eos) {
    *term = 0;
    *eos = last;
    if (!last && b > a) // (the look-ahead character: a UTF-8 sequence)
        for (b--; b > a && ((unsigned char)*b & 0xC0) == 0x80; b--) {}
    while (b > a && (b[-1] == ' ' || b[-1] == '\t' || b[-1] == '\n' || b[-1] == '\r')) b--;
    for (;;) { // closing quotes and brackets: " ' ) ] } and the UTF-8 ones (U+2019, U+201D, U+00BB)
        if (b > a && strchr("\"')]}", b[-1])) b--;
        else if (b - a >= 3 && (!memcmp(b - 3, "\xe2\x80\x99", 3) || !memcmp(b - 3, "\xe2\x80\x9d", 3))) b -= 3;
        else if (b - a >= 2 && !memcmp(b - 2, "\xc2\xbb", 2)) b -= 2;
        else break;
    }
    if (b - a >= 3 && !memcmp(b - 3, "\xe2\x80\xa6", 3)) { // …
        *eos = false;
        return;
    }
    const char *r = b;
    while (r > a && strchr(".?!,:;", r[-1])) r--;
    if (r == b) return;
    if (b - r >= 2 && r[0] == '.' && r[1] == '.') { // an ellipsis
        *eos = false;
        return;
    }
    *term = r[0];
    *eos = *term == '.' || *term == '?' || *term == '!';
}

nm_status nm_espeak_clauses(const char *data_dir, const char *voice, const char *text, nm_espeak_clause_fn fn,
                            void *user, char *err, size_t err_size) {
    if (!voice || !voice[0] || strlen(voice) > VOICE_MAX)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "tts: espeak-ng voice '%s'", voice ? voice : "");
    pthread_mutex_lock(&g_lock);
    nm_status st = init_locked(data_dir, err, err_size);
    if (st == NM_OK) st = set_voice_locked(voice, err, err_size);
    if (st == NM_OK) {
        locale_t old = g_utf8 ? uselocale(g_utf8) : (locale_t)0;
        const void *p = text;
        while (p) { // (to the text's end even after fn stopped: espeak-ng keeps its look-ahead between calls)
            const char *a = p;
            const char *ipa = espeak_TextToPhonemes(&p, espeakCHARS_UTF8, 0x02); // 0x02: IPA
            const char *b = p ? (const char *)p : a + strlen(a);
            char term;
            bool eos;
            terminator_of(a, b, p == NULL, &term, &eos);
            if (st == NM_OK) st = fn(user, ipa ? ipa : "", term, eos);
        }
        if (old) uselocale(old);
    }
    pthread_mutex_unlock(&g_lock);
    return st;
}

const nm_tts_engine_i nm_tts_espeak_engine = {
    .version = NM_TTS_ENGINE_VERSION,
    .name = "espeak-ng",
    .open = es_open,
    .synth = es_synth,
    .close = es_close,
    .list_voices = es_list_voices,
    .retune = es_retune,
};
