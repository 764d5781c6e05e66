// nanomind serve: speech to text (POST /v1/audio/transcriptions and
// /v1/audio/translations, with --stt) and text to speech (POST
// /v1/audio/speech, with --tts) on their own bricks beside the decoder
// (docs/server.md).
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "serve.h"

static void *tts_lane_main(void *arg) {
    server *S = arg;
    (void)nm_brick_run(S->tts, S->tts_in, S->tts_out);
    return NULL;
}

bool serve_audio_start(server *S) {
    char err[512];
    nm_status st;
    if (S->stt_path) { // the transcriber: its own thread pool, beam 5 as whisper-cli, on the same ledger
        S->stt_params = nm_brick_default_params(NM_BRICK_STT);
        S->stt_params.model = S->stt_path;
        S->stt_params.n_threads = S->o.n_threads;
        S->stt_params.stt_max_decoders = 5;
        S->stt_params.ledger = S->ledger;
        if ((st = nm_brick_load(NULL, &S->stt_params, &S->stt, err, sizeof err)) != NM_OK) {
            cli_load_error(S->stt_path, st, err, CLI_WANT_WHISPER);
            return false;
        }
        nm_brick_stt_info(S->stt, &S->stt_info);
        S->ep_stt = nm_ledger_endpoint(S->ledger, nm_brick_name(S->stt));
        const char *slash = strrchr(S->stt_path, '/');
        S->stt_alias = slash ? slash + 1 : S->stt_path;
        if ((st = nm_tabm_create(NULL, 8, 2 * nm_brick_out_slot_bytes(S->stt), &S->stt_text, err, sizeof err)) != NM_OK) {
            fprintf(stderr, "error: cannot create the transcriber's ring: %s: %s\n", nm_status_str(st), err);
            return false;
        }
    }
    if (S->tts_engine) { // OpenAI's rate: 24 kHz, 16-bit mono
        nm_brick_params tp = nm_brick_default_params(NM_BRICK_TTS);
        tp.tts.engine = S->tts_engine;
        tp.tts.sample_rate = 24000;
        tp.ledger = S->ledger;
        if ((st = nm_brick_load(NULL, &tp, &S->tts, err, sizeof err)) != NM_OK) {
            fprintf(stderr, "error: cannot start the speech engine: %s: %s\n", nm_status_str(st), err);
            return false;
        }
        S->ep_tts = nm_ledger_endpoint(S->ledger, nm_brick_name(S->tts));
        const size_t text_slot = 4 * (size_t)S->speech_max_chars + 1024; // (UTF-8: up to 4 bytes a character)
        if ((st = nm_tabm_create(NULL, 4, text_slot, &S->tts_in, err, sizeof err)) != NM_OK ||
            (st = nm_tabm_create(NULL, 16, nm_brick_out_slot_bytes(S->tts), &S->tts_out, err, sizeof err)) != NM_OK) {
            fprintf(stderr, "error: cannot create the speech engine's rings: %s: %s\n", nm_status_str(st), err);
            return false;
        }
        if (pthread_create(&S->tts_lane, NULL, tts_lane_main, S) != 0) {
            fprintf(stderr, "error: cannot start the speech engine's lane\n");
            return false;
        }
        S->tts_lane_started = true;
    }
    return true;
}

void serve_audio_stop(server *S) {
    if (S->tts_in) nm_tabm_shutdown(S->tts_in);
    if (S->tts_lane_started) pthread_join(S->tts_lane, NULL);
    nm_tabm_free(S->tts_in);
    nm_tabm_free(S->tts_out);
    nm_brick_free(S->tts);
    nm_tabm_free(S->stt_text);
    nm_brick_free(S->stt);
}

int serve_audio_metrics(const server *S, char *buf, size_t size) {
    return snprintf(buf, size,
                    "# HELP nanomind_transcriptions_total Transcription and translation requests served.\n"
                    "# TYPE nanomind_transcriptions_total counter\nnanomind_transcriptions_total %llu\n"
                    "# TYPE nanomind_audio_seconds_total counter\nnanomind_audio_seconds_total %.3f\n"
                    "# TYPE nanomind_transcribe_seconds_total counter\nnanomind_transcribe_seconds_total %.6f\n"
                    "# TYPE nanomind_transcriptions_waiting gauge\nnanomind_transcriptions_waiting %d\n"
                    "# HELP nanomind_speech_requests_total Speech (text to speech) requests served.\n"
                    "# TYPE nanomind_speech_requests_total counter\nnanomind_speech_requests_total %llu\n"
                    "# TYPE nanomind_speech_seconds_total counter\nnanomind_speech_seconds_total %.3f\n",
                    (unsigned long long)S->n_audio_requests, S->audio_seconds, S->stt_wall, S->stt_turn.waiting,
                    (unsigned long long)S->n_speech_requests, S->speech_seconds);
}

// ---- speech to text -------------------------------------------------------------------------

// A multipart body's fields as mg_handle_form_request hands them over: the
// audio file, and the small text fields (a field of a name not here is skipped).
enum { F_MODEL, F_LANGUAGE, F_PROMPT, F_TEMPERATURE, F_FORMAT, F_GRAN, F_STREAM, F_COUNT };
static const char *const form_names[F_COUNT] = {"model", "language", "prompt", "temperature", "response_format",
                                                "timestamp_granularities[]", "stream"};
#define FORM_FIELD_MAX 8192 // a text field's bytes

typedef struct form {
    const server *S;
    char *file;
    size_t n_file, cap_file;
    bool has_file;
    char *field[F_COUNT];
    size_t n_field[F_COUNT];
    int cur;               // the field being read: F_*, F_FILE (civetweb names a field in its first
                           // chunk only: the key of the chunks after it is empty)
    bool too_big;          // the body went past --max-body
    const char *too_long;  // a text field past FORM_FIELD_MAX
} form;
#define F_FILE F_COUNT

static int form_index(const char *key) {
    for (int i = 0; i < F_COUNT; i++)
        if (!strcmp(key, form_names[i])) return i;
    return -1;
}

static int form_found(const char *key, const char *filename, char *path, size_t pathlen, void *user) {
    (void)filename, (void)path, (void)pathlen;
    form *f = user;
    if (!strcmp(key, "file")) {
        f->has_file = true;
        f->cur = F_FILE;
        return MG_FORM_FIELD_STORAGE_GET;
    }
    const int i = form_index(key);
    f->cur = i;
    if (i < 0) return MG_FORM_FIELD_STORAGE_SKIP;
    if (i == F_GRAN && f->n_field[i] > 0) { // repeated: the values ','-separated
        char *b = realloc(f->field[i], f->n_field[i] + 2);
        if (!b) return MG_FORM_FIELD_STORAGE_ABORT;
        f->field[i] = b;
        b[f->n_field[i]++] = ',';
        b[f->n_field[i]] = '\0';
    }
    return MG_FORM_FIELD_STORAGE_GET;
}

static bool form_append(char **buf, size_t *n, size_t *cap, const char *v, size_t len) {
    if (*n + len + 1 > *cap) {
        size_t c = *cap ? *cap : 65536;
        while (c < *n + len + 1) c *= 2;
        char *b = realloc(*buf, c);
        if (!b) return false;
        *buf = b, *cap = c;
    }
    memcpy(*buf + *n, v, len);
    *n += len;
    (*buf)[*n] = '\0';
    return true;
}

static int form_get(const char *key, const char *value, size_t len, void *user) {
    (void)key; // (see cur)
    form *f = user;
    size_t total = f->n_file + len;
    for (int i = 0; i < F_COUNT; i++) total += f->n_field[i];
    if ((int64_t)total > f->S->body_max) {
        f->too_big = true;
        return MG_FORM_FIELD_HANDLE_ABORT;
    }
    if (f->cur == F_FILE) {
        if (!form_append(&f->file, &f->n_file, &f->cap_file, value, len)) return MG_FORM_FIELD_HANDLE_ABORT;
        return MG_FORM_FIELD_HANDLE_GET;
    }
    const int i = f->cur;
    if (i < 0) return MG_FORM_FIELD_HANDLE_GET;
    if (f->n_field[i] + len > FORM_FIELD_MAX) {
        f->too_long = form_names[i];
        return MG_FORM_FIELD_HANDLE_ABORT;
    }
    size_t cap = f->field[i] ? f->n_field[i] + 1 : 0;
    if (!form_append(&f->field[i], &f->n_field[i], &cap, value, len)) return MG_FORM_FIELD_HANDLE_ABORT;
    return MG_FORM_FIELD_HANDLE_GET;
}

static void form_free(form *f) {
    free(f->file);
    for (int i = 0; i < F_COUNT; i++) free(f->field[i]);
}

// The transcript's text as OpenAI gives it: the segments one after the other, the blanks at
// either end trimmed. malloc'd, or NULL.
static char *transcript_text(const nm_transcript *t) {
    size_t n = 0;
    for (int32_t i = 0; i < t->n_seg; i++) n += strlen(t->seg[i].text);
    char *s = malloc(n + 1), *p = s;
    if (!s) return NULL;
    for (int32_t i = 0; i < t->n_seg; i++) p = stpcpy(p, t->seg[i].text);
    *p = '\0';
    const char *b = s;
    while (*b == ' ' || *b == '\n' || *b == '\t') b++;
    size_t len = strlen(b);
    while (len > 0 && (b[len - 1] == ' ' || b[len - 1] == '\n' || b[len - 1] == '\t')) len--;
    memmove(s, b, len);
    s[len] = '\0';
    return s;
}

static int send_text(struct mg_connection *c, const char *type, const char *body, size_t n) {
    mg_printf(c, "HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %zu\r\nCache-Control: no-cache\r\n\r\n", type,
              n);
    mg_write(c, body, n);
    return 200;
}

// stream=true: one server-sent event (OpenAI's transcription events: {"type": "transcript.text.delta",
// "delta"} a segment as Whisper ends it, then {"type": "transcript.text.done", "text"}; or {"type":
// "error", "error": {"message"}}) as a chunk of the reply. False once the client has gone.
static bool send_event(struct mg_connection *c, const char *type, const char *key, const char *text) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", type);
    if (!strcmp(type, "error")) cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "error"), "message", text);
    else cJSON_AddStringToObject(o, key, text);
    return serve_sse(c, o);
}

// timestamp_granularities[]=word: the transcript's words with their times, from the token-level timestamps
// (whisper.cpp's, as `transcribe -ml 1 -sow` splits them): a text token whose text starts with a blank
// starts a word, the others join the one before; a word runs from its first token's t0 to its last one's
// t1, its text without the blank (punctuation stays with its word, as Whisper's word timestamps keep it).
static void add_words(server *S, const nm_transcript *t, cJSON *r) {
    cJSON *words = cJSON_AddArrayToObject(r, "words");
    char word[1024];
    size_t n = 0;
    bool full = false; // the word outgrew the buffer: its further tokens are left out
    int64_t w0 = 0, w1 = 0;
    for (int32_t i = 0; i <= t->n_seg; i++) {
        const nm_stt_segment *g = i < t->n_seg ? &t->seg[i] : NULL;
        bool first = true; // the segment's first text token: a new word even without a blank (no-space scripts)
        for (int32_t k = 0; k <= (g ? g->n_tokens : 0); k++) {
            const nm_stt_token *tk = g && k < g->n_tokens ? &g->tokens[k] : NULL;
            if (tk && tk->id >= S->stt_info.token_eot) continue;
            char buf[24];
            uint32_t len = 0;
            const char *txt = tk ? nm_brick_stt_token_text(S->stt, tk->id, buf, &len) : NULL;
            if (tk && !txt) continue;
            const bool starts = !tk || (len > 0 && txt[0] == ' ') || n == 0 || first; // (a segment starts one)
            first = false;
            if (starts && n > 0) { // the word so far is whole
                word[n] = '\0';
                cJSON *o = cJSON_CreateObject();
                cJSON_AddStringToObject(o, "word", word);
                cJSON_AddNumberToObject(o, "start", (double)w0 / 100);
                cJSON_AddNumberToObject(o, "end", (double)w1 / 100);
                cJSON_AddItemToArray(words, o);
                n = 0;
                full = false;
            }
            if (!tk) continue;
            if (n == 0) {
                while (len > 0 && *txt == ' ') txt++, len--;
                if (len == 0) continue; // (a lone blank starts nothing)
                w0 = tk->t0;
            }
            if (full || n + len >= sizeof word) { // (a word longer than the buffer ends at a whole character)
                while (!full && n > 0 && ((unsigned char)word[n - 1] & 0xC0) == 0x80) n--;
                if (!full && n > 0 && ((unsigned char)word[n - 1] & 0xC0) == 0xC0) n--;
                full = true;
            } else {
                memcpy(word + n, txt, len), n += len;
            }
            w1 = tk->t1 > w0 ? tk->t1 : w0;
        }
    }
}

// The reply in response_format fmt (checked before).
static int send_transcript(server *S, struct mg_connection *c, const nm_transcript *t, const char *fmt,
                           bool translate, bool words) {
    if (!strcmp(fmt, "srt") || !strcmp(fmt, "vtt")) {
        char *buf = NULL;
        size_t n = 0;
        FILE *f = open_memstream(&buf, &n);
        const bool ok = f && (!strcmp(fmt, "srt") ? nm_transcript_write_srt(t, f) : nm_transcript_write_vtt(t, f));
        if (f) fclose(f);
        const int r = ok && buf ? send_text(c, !strcmp(fmt, "vtt") ? "text/vtt; charset=utf-8" : "text/plain; charset=utf-8",
                                            buf, n)
                                : send_error(S, c, 500, NULL, "out of memory");
        free(buf);
        return r;
    }
    char *text = transcript_text(t);
    if (!text) return send_error(S, c, 500, NULL, "out of memory");
    if (!strcmp(fmt, "text")) {
        const size_t n = strlen(text);
        text[n] = '\n'; // (its NUL: the reply is its bytes and the newline)
        const int r = send_text(c, "text/plain; charset=utf-8", text, n + 1);
        free(text);
        return r;
    }
    cJSON *r = cJSON_CreateObject();
    if (!strcmp(fmt, "verbose_json")) {
        cJSON_AddStringToObject(r, "task", translate ? "translate" : "transcribe");
        cJSON_AddStringToObject(r, "language", t->language);
        cJSON_AddNumberToObject(r, "duration", (double)t->n_samples / NM_AUDIO_RATE);
    }
    cJSON_AddStringToObject(r, "text", text);
    free(text);
    if (!strcmp(fmt, "verbose_json")) {
        cJSON *segs = cJSON_AddArrayToObject(r, "segments");
        for (int32_t i = 0; i < t->n_seg; i++) {
            const nm_stt_segment *g = &t->seg[i];
            cJSON *o = cJSON_CreateObject(), *tok;
            cJSON_AddItemToArray(segs, o);
            cJSON_AddNumberToObject(o, "id", i);
            cJSON_AddNumberToObject(o, "seek", (double)g->t0); // (10 ms units, as Whisper's)
            cJSON_AddNumberToObject(o, "start", (double)g->t0 / 100);
            cJSON_AddNumberToObject(o, "end", (double)g->t1 / 100);
            cJSON_AddStringToObject(o, "text", g->text);
            tok = cJSON_AddArrayToObject(o, "tokens");
            for (int32_t k = 0; k < g->n_tokens; k++) cJSON_AddItemToArray(tok, cJSON_CreateNumber(g->tokens[k].id));
            cJSON_AddNumberToObject(o, "temperature", g->temperature);
            cJSON_AddNumberToObject(o, "avg_logprob", g->avg_logprob);
            cJSON_AddNumberToObject(o, "no_speech_prob", g->no_speech_prob);
        }
        if (words) add_words(S, t, r);
    }
    return send_json(c, 200, r);
}

// POST /v1/audio/transcriptions (and whisper.cpp's /inference): multipart with
// file, model (any: the server has one), language, prompt, temperature,
// response_format, timestamp_granularities[] (segment). /v1/audio/translations
// (translate): the same into English, a multilingual model only.
int handle_transcription(server *S, struct mg_connection *c, bool translate) {
    const double t_req = cli_now();
    if (!S->stt) return send_error(S, c, 404, NULL, "no speech-to-text model: start the server with --stt FILE");
    if (translate && !S->stt_info.multilingual)
        return send_error(S, c, 400, NULL, "%s is an English-only model: it does not translate", S->stt_info.name);
    const struct mg_request_info *ri = mg_get_request_info(c);
    const char *ct = mg_get_header(c, "Content-Type");
    if (!ct || strncasecmp(ct, "multipart/form-data", 19))
        return send_error(S, c, 400, "file", "send the audio as multipart/form-data, in a field named 'file'");
    if (ri->content_length > S->body_max)
        return send_error(S, c, 413, NULL, "the body is %lld bytes; the limit is %lld (--max-body)",
                          (long long)ri->content_length, (long long)S->body_max);
    form f = {.S = S, .cur = -1};
    struct mg_form_data_handler h = {form_found, form_get, NULL, &f};
    serve_watch watch; // the body's clock (--body-timeout)
    serve_watch_begin(&S->watchdog, c, &watch);
    const int nf = mg_handle_form_request(c, &h);
    int code;
    if (serve_watch_end(&S->watchdog, &watch)) {
        code = send_error(S, c, 408, NULL, "the body did not arrive within %d s (--body-timeout)", S->body_timeout_s);
        goto out;
    }
    if (f.too_big) {
        code = send_error(S, c, 413, NULL, "the body is over %lld bytes (--max-body)", (long long)S->body_max);
        goto out;
    }
    if (f.too_long) {
        code = send_error(S, c, 400, f.too_long, "'%s' is over %d bytes", f.too_long, FORM_FIELD_MAX);
        goto out;
    }
    if (nf < 0) {
        code = send_error(S, c, 400, NULL, "the multipart body could not be read");
        goto out;
    }
    if (!f.has_file || f.n_file == 0) {
        code = send_error(S, c, 400, "file", "no audio: a non-empty field named 'file' is needed");
        goto out;
    }
    const char *fmt = f.field[F_FORMAT] && *f.field[F_FORMAT] ? f.field[F_FORMAT] : "json";
    if (strcmp(fmt, "json") && strcmp(fmt, "text") && strcmp(fmt, "srt") && strcmp(fmt, "vtt") &&
        strcmp(fmt, "verbose_json")) {
        code = send_error(S, c, 400, "response_format",
                          "'response_format' must be json, text, srt, vtt or verbose_json");
        goto out;
    }
    float temp = 0.0f;
    if (f.field[F_TEMPERATURE] && *f.field[F_TEMPERATURE]) {
        char *end;
        errno = 0;
        const double v = strtod(f.field[F_TEMPERATURE], &end);
        if (errno || *end || !(v >= 0 && v <= 1)) {
            code = send_error(S, c, 400, "temperature", "'temperature' must be a number in [0, 1]");
            goto out;
        }
        temp = (float)v;
    }
    bool words = false;
    for (char *g = f.field[F_GRAN], *save = NULL, *tok = g ? strtok_r(g, ",", &save) : NULL; tok;
         tok = strtok_r(NULL, ",", &save)) {
        words = words || !strcmp(tok, "word");
        if (strcmp(tok, "segment") && strcmp(tok, "word")) {
            code = send_error(S, c, 400, "timestamp_granularities[]",
                              "timestamp granularity '%.40s': 'segment' or 'word'", tok);
            goto out;
        }
    }
    if (words && strcmp(fmt, "verbose_json")) { // (as OpenAI: the words come in verbose_json only)
        code = send_error(S, c, 400, "timestamp_granularities[]",
                          "word timestamps need response_format verbose_json, not %s", fmt);
        goto out;
    }
    const char *sv = f.field[F_STREAM];
    const bool stream = sv && (!strcasecmp(sv, "true") || !strcmp(sv, "1"));
    if (sv && *sv && !stream && strcasecmp(sv, "false") && strcmp(sv, "0")) {
        code = send_error(S, c, 400, "stream", "'stream' must be true or false");
        goto out;
    }
    if (stream && strcmp(fmt, "json") && strcmp(fmt, "text")) {
        code = send_error(S, c, 400, "stream", "a streamed transcription is text: response_format json or text, not %s",
                          fmt);
        goto out;
    }
    const char *lang = f.field[F_LANGUAGE] && *f.field[F_LANGUAGE] ? f.field[F_LANGUAGE] : NULL;
    if (lang && nm_brick_stt_lang_id(S->stt, lang) < 0) {
        code = send_error(S, c, 400, "language", "unknown language '%.40s' (an ISO-639-1 code such as en, de, fr)", lang);
        goto out;
    }
    if (!S->stt_info.multilingual && lang && strcmp(lang, "en")) {
        code = send_error(S, c, 400, "language", "%s is an English-only model: language '%.40s' is not served",
                          S->stt_info.name, lang);
        goto out;
    }
    if (!lang) lang = S->stt_info.multilingual ? "auto" : "en";
    char err[512];
    nm_audio pcm = {0};
    // The transcriber's turn first, then the decoding: requests that wait hold their bodies, never their
    // samples (a few KB of FLAC can be hours of them). The decoder stops at --max-audio: a header that
    // announces more fails before a sample is decoded, a stream that does not say stops at the limit.
    if (!serve_turn_take(S, &S->stt_turn)) {
        code = send_error(S, c, 429, NULL, "%d requests already wait for the transcriber (--queue)", S->queue_max);
        goto out;
    }
    nm_status st = nm_audio_decode_max(f.file, f.n_file, NM_AUDIO_RATE, (int64_t)S->audio_max_s * NM_AUDIO_RATE,
                                       &pcm, err, sizeof err);
    free(f.file);
    f.file = NULL;
    if (st != NM_OK) {
        serve_turn_give(S, &S->stt_turn);
        if (st == NM_ERR_RANGE && strstr(err, "too long")) // (not a channel count or rate out of range)
            code = send_error(S, c, 400, "file", "the audio is longer than %d s, the limit (--max-audio)",
                              S->audio_max_s);
        else
            code = send_error(S, c, 400, "file", "the audio cannot be decoded: %s", err);
        goto out;
    }
    const double secs = (double)pcm.n / NM_AUDIO_RATE;
    pthread_mutex_lock(&S->lock);
    S->n_audio_requests++;
    S->audio_seconds += secs; // (counted before the answer goes: a client reading /metrics after it sees it)
    pthread_mutex_unlock(&S->lock);
    int32_t *prompt_tok = NULL, n_prompt_tok = 0;
    nm_tabm *ring = NULL;
    code = 0;
    if (f.field[F_PROMPT] && *f.field[F_PROMPT]) {
        n_prompt_tok = nm_brick_stt_tokenize(S->stt, f.field[F_PROMPT], NULL, 0);
        if (n_prompt_tok < 0 || !(prompt_tok = malloc(sizeof(int32_t) * (size_t)(n_prompt_tok + 1))))
            code = send_error(S, c, 500, NULL, "out of memory for the prompt");
        else
            nm_brick_stt_tokenize(S->stt, f.field[F_PROMPT], prompt_tok, n_prompt_tok);
    }
    // the PCM as one slot (Whisper normalises the spectrogram over the whole recording)
    nm_tabm_slot sl;
    const size_t bytes = sizeof(float) * (size_t)pcm.n;
    if (!code && (nm_tabm_create(NULL, 1, bytes, &ring, err, sizeof err) != NM_OK ||
                  nm_tabm_acquire_write(ring, 0, -1, &sl) != NM_OK))
        code = send_error(S, c, 500, NULL, "cannot make room for %zu bytes of audio", bytes);
    if (!code) {
        nm_ledger_copy(S->ledger, S->ep_server, S->ep_stt, sl.data, pcm.pcm, bytes); // the one counted copy
        sl.meta->kind = NM_TABM_PCM_F32;
        sl.meta->ndim = 2;
        sl.meta->shape[0] = pcm.n;
        sl.meta->shape[1] = 1;
        sl.meta->size = bytes;
        sl.meta->sample_rate = NM_AUDIO_RATE;
        if (nm_tabm_publish(ring, &sl) != NM_OK) code = send_error(S, c, 500, NULL, "the PCM ring failed");
    }
    nm_audio_free(&pcm);
    nm_brick_params bp = S->stt_params;
    if (!code) { // whisper-cli's defaults (beam 5), the request's language, prompt and temperature
        nm_stt_params p = nm_stt_default_params(NM_STT_BEAM);
        p.language = lang;
        p.translate = translate;
        p.temperature = temp;
        p.prompt_tokens = prompt_tok;
        p.n_prompt_tokens = n_prompt_tok;
        p.no_timestamps = !strcmp(fmt, "json") || !strcmp(fmt, "text"); // the text alone: as whisper-cli -nt
        p.token_timestamps = words;
        bp.stt = p;
        if ((st = nm_brick_set_params(S->stt, &bp, err, sizeof err)) != NM_OK)
            code = send_error(S, c, 400, NULL, "%s", err);
    }
    bool failed = false, sent_head = false, gone = false;
    const double t0 = cli_now();
    if (!code) {
        cli_step R = {.b = S->stt, .in = ring, .out = S->stt_text, .st = NM_OK}; // one request: this audio
        pthread_t th;
        if (pthread_create(&th, NULL, cli_step_main, &R) != 0) {
            code = send_error(S, c, 500, NULL, "cannot start the transcriber's thread");
        } else {
            for (bool end = false; !end;) {
                nm_tabm_slot ts;
                if (nm_tabm_acquire_read(S->stt_text, -1, &ts) != NM_OK) break; // shut down: the lane failed
                end = !(ts.meta->user & NM_BRICK_MORE);
                failed = failed || (ts.meta->user & NM_BRICK_ERROR);
                if (stream && !failed && !gone && ts.meta->kind == NM_TABM_TEXT && ts.meta->size > 0) {
                    if (!sent_head) {
                        mg_printf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                                     "Transfer-Encoding: chunked\r\n\r\n");
                        sent_head = true;
                    }
                    char *seg = strndup(ts.data, (size_t)ts.meta->size); // (the segment as Whisper ended it)
                    gone = !seg || !send_event(c, "transcript.text.delta", "delta", seg);
                    free(seg);
                }
                nm_tabm_release(S->stt_text, &ts);
            }
            pthread_join(th, NULL);
            if (R.st != NM_OK) { // the ring was shut down to wake this thread: a new one for the next request
                nm_tabm *fresh = NULL;
                if (nm_tabm_create(NULL, 8, 2 * nm_brick_out_slot_bytes(S->stt), &fresh, err, sizeof err) == NM_OK) {
                    nm_tabm_free(S->stt_text);
                    S->stt_text = fresh;
                }
            }
            if ((R.st != NM_OK || failed) && sent_head) { // the events have begun: the error is one of them
                if (!gone) send_event(c, "error", NULL, nm_brick_last_error(S->stt));
                code = 500;
            } else if (R.st != NM_OK || failed) {
                code = send_error(S, c, 500, NULL, "the transcription failed: %s", nm_brick_last_error(S->stt));
            }
        }
    }
    pthread_mutex_lock(&S->lock); // before the reply: a client reading /metrics after it sees this request
    S->stt_wall += cli_now() - t0;
    if (!code) serve_hist_add(&S->lat_transcription, cli_now() - t_req);
    pthread_mutex_unlock(&S->lock);
    if (!code && stream) { // the whole text last (also where no segment had any: the head goes now)
        if (!sent_head)
            mg_printf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                         "Transfer-Encoding: chunked\r\n\r\n");
        sent_head = true;
        char *text = transcript_text(nm_brick_stt_transcript(S->stt));
        if (!gone) gone = !send_event(c, text ? "transcript.text.done" : "error", "text", text ? text : "out of memory");
        free(text);
        code = 200;
    } else if (!code) {
        code = send_transcript(S, c, nm_brick_stt_transcript(S->stt), fmt, translate, words);
    }
    if (sent_head && !gone) mg_send_chunk(c, "", 0);
    serve_turn_give(S, &S->stt_turn);
    nm_tabm_free(ring);
    free(prompt_tok);
out:
    form_free(&f);
    return code;
}

// ---- text to speech -------------------------------------------------------------------------

// One slot into the TTS brick's input ring (the request's PARAMS or its TEXT).
static bool tts_put(server *S, uint32_t kind, const void *data, size_t n, uint64_t user, uint64_t id) {
    nm_tabm_slot sl;
    if (nm_tabm_acquire_write(S->tts_in, 0, -1, &sl) != NM_OK) return false;
    if (n > sl.capacity) {
        nm_tabm_cancel(S->tts_in, &sl);
        return false;
    }
    nm_ledger_copy(S->ledger, S->ep_server, S->ep_tts, sl.data, data, n); // (the text into the brick's slot)
    *sl.meta = (nm_tabm_meta){.kind = kind, .ndim = 1, .shape = {(int64_t)n}, .size = n, .user = user, .request = id};
    if (nm_tabm_publish(S->tts_in, &sl) != NM_OK) {
        nm_tabm_cancel(S->tts_in, &sl);
        return false;
    }
    return true;
}

// The encoder's bytes as chunks of the reply; false once the client has gone.
static bool send_encoded(const void *bytes, size_t n, void *user) {
    return mg_send_chunk((struct mg_connection *)user, bytes, (unsigned)n) >= 0;
}

// POST /v1/audio/speech: {"input", "voice", "response_format": mp3 | opus | flac | wav | pcm,
// "speed", "model"}. The audio is sent as the brick makes it (chunked): MP3 (constant bit rate),
// Opus in Ogg or FLAC as the encoder makes their frames, WAV with the streaming sizes (0xffffffff)
// in its header, or raw 16-bit little-endian mono PCM, at the server's rate (24 kHz, OpenAI's).
int handle_speech(server *S, struct mg_connection *c) {
    const double t_req = cli_now();
    if (!S->tts) return send_error(S, c, 404, NULL, "no text-to-speech engine: start the server with --tts espeak");
    int code = 200;
    cJSON *req = read_json(S, c, &code);
    if (!req) return code;
    const serve_env env = serve_env_of(S);
    serve_speech_req sr;
    serve_err e;
    if (!serve_speech_parse(&env, req, &sr, &e)) {
        cJSON_Delete(req);
        return send_err(S, c, &e);
    }
    const bool wav = sr.format == SERVE_WAV, coded = sr.format == SERVE_ENCODED;
    nm_audio_encoder *enc = NULL;
    const char *text = sr.text;
    char *pj = sr.params;
    if (!serve_turn_take(S, &S->tts_turn)) { // the engine's turn: one synthesis at a time
        free(pj);
        cJSON_Delete(req);
        return send_error(S, c, 429, NULL, "%d requests already wait for the speech engine (--queue)", S->queue_max);
    }
    pthread_mutex_lock(&S->lock);
    const uint64_t id = ++S->next_id;
    S->n_speech_requests++;
    pthread_mutex_unlock(&S->lock);
    const bool put = tts_put(S, NM_TABM_PARAMS, pj, strlen(pj), NM_BRICK_MORE, id) &&
                     tts_put(S, NM_TABM_TEXT, text, strlen(text), 0, id);
    free(pj);
    cJSON_Delete(req);
    code = put ? 0 : send_error(S, c, 500, NULL, "the speech engine's input ring failed");
    bool sent_head = false, gone = false;
    uint64_t samples = 0;
    for (bool end = !put; !end;) { // its slots, to the end of the request (also after a failure or a gone client)
        nm_tabm_slot s;
        if (nm_tabm_acquire_read(S->tts_out, -1, &s) != NM_OK) {
            if (!code && !sent_head) code = send_error(S, c, 500, NULL, "the speech engine stopped");
            break;
        }
        end = !(s.meta->user & NM_BRICK_MORE);
        const bool failed = (s.meta->user & NM_BRICK_ERROR) != 0;
        if (failed && !sent_head && !code) { // nothing sent yet: a proper error (an unknown voice, a bad speed)
            const char *why = nm_brick_last_error(S->tts);
            code = send_error(S, c, strstr(why, "parameters") ? 400 : 500, strstr(why, "voice") ? "voice" : NULL,
                              "%s", why);
        } else if (!failed && !code && !gone) {
            if (!sent_head) {
                char eerr[256] = "";
                if (coded && nm_audio_encoder_open(sr.container, nm_brick_tts_sample_rate(S->tts), send_encoded, c, &enc,
                                                   eerr, sizeof eerr) != NM_OK) {
                    code = send_error(S, c, 500, "response_format", "%s", eerr); // (this build's libsndfile lacks it)
                    nm_tabm_cancel_request(S->tts_in, id);
                    nm_tabm_release(S->tts_out, &s);
                    continue;
                }
                mg_printf(c, "HTTP/1.1 200 OK\r\nContent-Type: %s\r\nTransfer-Encoding: chunked\r\n"
                             "Cache-Control: no-cache\r\n\r\n",
                          coded ? nm_audio_container_mime(sr.container) : wav ? "audio/wav" : "audio/pcm");
                sent_head = true;
                if (wav) {
                    uint8_t h[NM_WAV_HEADER_BYTES];
                    nm_audio_wav_header(h, 0xffffffffu - 36, nm_brick_tts_sample_rate(S->tts), 1);
                    gone = mg_send_chunk(c, (const char *)h, sizeof h) < 0;
                }
            }
            if (!gone && s.meta->size > 0)
                gone = enc ? nm_audio_encoder_write(enc, s.data, (int64_t)(s.meta->size / 2)) != NM_OK
                           : mg_send_chunk(c, s.data, (unsigned)s.meta->size) < 0;
            samples += s.meta->size / 2;
            if (gone) nm_tabm_cancel_request(S->tts_in, id); // the client left: the brick stops it
        }
        nm_tabm_release(S->tts_out, &s);
    }
    pthread_mutex_lock(&S->lock); // (before the last chunk: a client reading /metrics after it sees it)
    S->speech_seconds += (double)samples / nm_brick_tts_sample_rate(S->tts);
    if (sent_head && !gone) serve_hist_add(&S->lat_speech, cli_now() - t_req);
    pthread_mutex_unlock(&S->lock);
    serve_turn_give(S, &S->tts_turn);
    if (enc && nm_audio_encoder_close(enc) != NM_OK) gone = true; // (its last frames, flushed into the reply)
    if (sent_head) {
        if (!gone) mg_send_chunk(c, "", 0);
        code = 200;
    }
    return code;
}
