// The server's speech to text (POST /v1/audio/transcriptions and
// /v1/audio/translations, with --stt) and text to speech (POST
// /v1/audio/speech, with --tts) on their own bricks beside the decoder
// (docs/server.md).
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/fail.h"
#include "server/server_impl.h"

// A pipeline of the one brick *bp (its ledger the server's); err: "stt: ...", "tts: ...".
static nm_status one_brick(server *S, const nm_brick_params *bp, nm_pipeline **P, nm_brick **b, char *err,
                           size_t err_size) {
    nm_pipeline_params pp = nm_pipeline_default_params();
    if (bp->kind == NM_BRICK_STT) pp.stt = bp, pp.max_audio_s = S->audio_max_s;
    else pp.tts = bp;
    pp.ledger = S->ledger;
    pp.queue = 1; // (a request submits holding the brick's turn)
    const nm_status st = nm_pipeline_create(&pp, P, err, err_size);
    if (st == NM_OK) *b = nm_pipeline_brick(*P, bp->kind);
    return st;
}

nm_status serve_audio_start(server *S, const nm_brick_params *stt, const nm_brick_params *tts, char *err,
                            size_t err_size) {
    nm_status st;
    if (stt) { // the transcriber
        nm_brick_params bp = *stt;
        bp.kind = NM_BRICK_STT;
        if ((st = one_brick(S, &bp, &S->stt_P, &S->stt, err, err_size)) != NM_OK) return st;
        nm_brick_stt_info(S->stt, &S->stt_info);
        const char *slash = stt->model ? strrchr(stt->model, '/') : NULL;
        if (!(S->stt_alias = strdup(slash ? slash + 1 : stt->model ? stt->model : S->stt_info.name)))
            return nm_fail(NM_ERR_NOMEM, err, err_size, "server: out of memory");
    }
    if (tts) { // (OpenAI's rate is 24 kHz: the caller's choice)
        nm_brick_params tp = *tts;
        tp.kind = NM_BRICK_TTS;
        if ((st = one_brick(S, &tp, &S->tts_P, &S->tts, err, err_size)) != NM_OK) return st;
        S->tts_piper = !strcmp(nm_brick_tts_engine(S->tts), "piper");
    }
    return NM_OK;
}

void serve_audio_stop(server *S) {
    nm_pipeline_free(S->tts_P);
    nm_pipeline_free(S->stt_P);
    S->tts_P = S->stt_P = NULL;
    S->tts = S->stt = NULL;
    free(S->stt_alias);
    S->stt_alias = NULL;
}

int serve_audio_metrics(const server *S, char *buf, size_t size) {
    nm_pipeline_brick_report tr = {0};
    if (S->tts_P) nm_pipeline_brick_stats(S->tts_P, NM_BRICK_TTS, &tr);
    return snprintf(buf, size,
                    "# HELP nanomind_transcriptions_total Transcription and translation requests served.\n"
                    "# TYPE nanomind_transcriptions_total counter\nnanomind_transcriptions_total %llu\n"
                    "# TYPE nanomind_audio_seconds_total counter\nnanomind_audio_seconds_total %.3f\n"
                    "# TYPE nanomind_transcribe_seconds_total counter\nnanomind_transcribe_seconds_total %.6f\n"
                    "# TYPE nanomind_transcriptions_waiting gauge\nnanomind_transcriptions_waiting %d\n"
                    "# HELP nanomind_speech_requests_total Speech (text to speech) requests served.\n"
                    "# TYPE nanomind_speech_requests_total counter\nnanomind_speech_requests_total %llu\n"
                    "# TYPE nanomind_speech_seconds_total counter\nnanomind_speech_seconds_total %.3f\n"
                    "# HELP nanomind_speech_cancelled_total Syntheses the engine stopped: their client went away.\n"
                    "# TYPE nanomind_speech_cancelled_total counter\nnanomind_speech_cancelled_total %llu\n",
                    (unsigned long long)S->n_audio_requests, S->audio_seconds, S->stt_wall, S->stt_turn.waiting,
                    (unsigned long long)S->n_speech_requests, S->speech_seconds, (unsigned long long)tr.s.n_cancelled);
}

// The request in flight in a one-brick pipeline P (*slot: the server's record of it; 0: none now), for
// nm_server_stop to cancel; one submitted once the stop's time is up is cancelled here.
static void in_flight(server *S, nm_pipeline *P, uint64_t *slot, uint64_t id) {
    pthread_mutex_lock(&S->lock);
    *slot = id;
    const bool cancel = id && S->abandon;
    pthread_mutex_unlock(&S->lock);
    if (cancel) nm_pipeline_cancel(P, id);
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
    const double t_req = serve_now();
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
    const int turn = serve_turn_take(S, &S->stt_turn);
    if (turn) {
        code = turn == 503 ? send_error(S, c, 503, NULL, "the server is shutting down")
                           : send_error(S, c, 429, NULL, "%d requests already wait for the transcriber (--queue)",
                                        S->queue_max);
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
    // whisper-cli's defaults (the brick's: beam 5), the request's language, prompt and temperature, as the
    // STT brick's parameters for this request
    cJSON *po = cJSON_CreateObject();
    cJSON_AddStringToObject(po, "language", lang);
    cJSON_AddBoolToObject(po, "translate", translate);
    cJSON_AddNumberToObject(po, "temperature", temp);
    // the text alone (as whisper-cli -nt) for json and text; word timings where asked
    cJSON_AddBoolToObject(po, "no_timestamps", !strcmp(fmt, "json") || !strcmp(fmt, "text"));
    cJSON_AddBoolToObject(po, "token_timestamps", words);
    if (f.field[F_PROMPT] && *f.field[F_PROMPT]) cJSON_AddStringToObject(po, "prompt", f.field[F_PROMPT]);
    char *params = cJSON_PrintUnformatted(po);
    cJSON_Delete(po);
    // the PCM as one request (Whisper normalises the spectrogram over the whole recording), copied into the
    // transcriber's ring once (counted)
    uint64_t id = 0;
    code = 0;
    st = params ? nm_pipeline_submit(S->stt_P, &(nm_pipeline_input){.pcm = pcm.pcm, .n_samples = pcm.n,
                                                                      .stt_params = params}, &id, err, sizeof err)
                : NM_ERR_NOMEM;
    nm_audio_free(&pcm);
    free(params);
    if (st != NM_OK) code = send_error(S, c, 500, NULL, "%s", params ? err : "out of memory");
    else in_flight(S, S->stt_P, &S->stt_id, id);
    bool sent_head = false, gone = false;
    const double t0 = serve_now();
    nm_pipeline_event ev = {0};
    while (!code) { // (the transcriber's turn: this request is the only one in its pipeline)
        if (nm_pipeline_read(S->stt_P, -1, &ev) != NM_OK) {
            ev = (nm_pipeline_event){.kind = NM_PIPELINE_DONE, .status = NM_ERR_SHUTDOWN, .text = "stt: stopped"};
        }
        if (ev.request != id && ev.status != NM_ERR_SHUTDOWN) continue;
        if (ev.kind == NM_PIPELINE_DONE) break;
        if (ev.kind == NM_PIPELINE_TRANSCRIPT && stream && !gone && ev.len > 0) {
            if (!sent_head) {
                mg_printf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                             "Transfer-Encoding: chunked\r\n\r\n");
                sent_head = true;
            }
            gone = !send_event(c, "transcript.text.delta", "delta", ev.text); // (the segment as Whisper ended it)
            if (gone) nm_pipeline_cancel(S->stt_P, id); // the client left: the brick stops it
        }
    }
    if (!code && ev.status != NM_OK && ev.status != NM_ERR_CANCELLED) {
        const char *why = !strncmp(ev.text, "stt: ", 5) ? ev.text + 5 : ev.text;
        if (sent_head) { // the events have begun: the error is one of them
            if (!gone) send_event(c, "error", NULL, why);
            code = 500;
        } else {
            code = send_error(S, c, 500, NULL, "the transcription failed: %s", why);
        }
    }
    pthread_mutex_lock(&S->lock); // before the reply: a client reading /metrics after it sees this request
    S->stt_wall += serve_now() - t0;
    if (!code) serve_hist_add(&S->lat_transcription, serve_now() - t_req);
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
    in_flight(S, S->stt_P, &S->stt_id, 0);
    serve_turn_give(S, &S->stt_turn);
out:
    form_free(&f);
    return code;
}

// ---- text to speech -------------------------------------------------------------------------

// The encoder's bytes as chunks of the reply; false once the client has gone.
static bool send_encoded(const void *bytes, size_t n, void *user) {
    return mg_send_chunk((struct mg_connection *)user, bytes, (unsigned)n) >= 0;
}

// POST /v1/audio/speech: {"input", "voice", "response_format": mp3 | opus | flac | wav | pcm,
// "speed", "model"}. The audio is sent as the brick makes it (chunked): MP3 (constant bit rate),
// Opus in Ogg or FLAC as the encoder makes their frames, WAV with the streaming sizes (0xffffffff)
// in its header, or raw 16-bit little-endian mono PCM, at the server's rate (24 kHz, OpenAI's).
int handle_speech(server *S, struct mg_connection *c) {
    const double t_req = serve_now();
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
    const int turn = serve_turn_take(S, &S->tts_turn); // the engine's turn: one synthesis at a time
    if (turn) {
        free(pj);
        cJSON_Delete(req);
        if (turn == 503) return send_error(S, c, 503, NULL, "the server is shutting down");
        return send_error(S, c, 429, NULL, "%d requests already wait for the speech engine (--queue)", S->queue_max);
    }
    pthread_mutex_lock(&S->lock);
    S->n_speech_requests++;
    pthread_mutex_unlock(&S->lock);
    uint64_t id = 0;
    char err[512];
    const nm_status st = nm_pipeline_submit(S->tts_P, &(nm_pipeline_input){.text = text, .tts_params = pj}, &id, err,
                                            sizeof err); // (the text copied into the brick's slot, counted)
    free(pj);
    cJSON_Delete(req);
    code = st == NM_OK ? 0 : send_error(S, c, 500, NULL, "%s", err);
    if (st == NM_OK) in_flight(S, S->tts_P, &S->tts_id, id);
    bool sent_head = false, gone = false;
    uint64_t samples = 0;
    const int32_t rate = nm_brick_tts_sample_rate(S->tts);
    for (bool end = st != NM_OK; !end;) { // its events, to its end (also after a failure or a gone client)
        nm_pipeline_event ev;
        if (nm_pipeline_read(S->tts_P, -1, &ev) != NM_OK) {
            if (!code && !sent_head) code = send_error(S, c, 500, NULL, "the speech engine stopped");
            break;
        }
        if (ev.request != id) continue; // (the engine's turn: none but this request's)
        end = ev.kind == NM_PIPELINE_DONE;
        const bool failed = end && ev.status != NM_OK && ev.status != NM_ERR_CANCELLED;
        const char *why = failed && !strncmp(ev.text, "tts: ", 5) ? ev.text + 5 : ev.text;
        if (failed && !sent_head && !code) { // nothing sent yet: a proper error (an unknown voice, a bad speed)
            code = send_error(S, c, strstr(why, "parameters") ? 400 : 500, strstr(why, "voice") ? "voice" : NULL,
                              "%s", why);
        } else if (ev.kind == NM_PIPELINE_AUDIO && !code && !gone) {
            if (!sent_head) {
                char eerr[256] = "";
                if (coded && nm_audio_encoder_open(sr.container, rate, send_encoded, c, &enc, eerr, sizeof eerr) != NM_OK) {
                    code = send_error(S, c, 500, "response_format", "%s", eerr); // (this build's libsndfile lacks it)
                    nm_pipeline_cancel(S->tts_P, id);
                    continue;
                }
                mg_printf(c, "HTTP/1.1 200 OK\r\nContent-Type: %s\r\nTransfer-Encoding: chunked\r\n"
                             "Cache-Control: no-cache\r\n\r\n",
                          coded ? nm_audio_container_mime(sr.container) : wav ? "audio/wav" : "audio/pcm");
                sent_head = true;
                if (wav) {
                    uint8_t h[NM_WAV_HEADER_BYTES];
                    nm_audio_wav_header(h, 0xffffffffu - 36, rate, 1);
                    gone = mg_send_chunk(c, (const char *)h, sizeof h) < 0;
                }
            }
            if (!gone && ev.n_samples > 0) // (the samples in the engine's ring slot, lent until the next read)
                gone = enc ? nm_audio_encoder_write(enc, ev.pcm, ev.n_samples) != NM_OK
                           : mg_send_chunk(c, (const char *)ev.pcm, (unsigned)(2 * ev.n_samples)) < 0;
            samples += (uint64_t)ev.n_samples;
            if (gone) nm_pipeline_cancel(S->tts_P, id); // the client left: the brick stops it
        }
    }
    pthread_mutex_lock(&S->lock); // (before the last chunk: a client reading /metrics after it sees it)
    S->speech_seconds += (double)samples / rate;
    if (sent_head && !gone) serve_hist_add(&S->lat_speech, serve_now() - t_req);
    pthread_mutex_unlock(&S->lock);
    in_flight(S, S->tts_P, &S->tts_id, 0);
    serve_turn_give(S, &S->tts_turn);
    if (enc && nm_audio_encoder_close(enc) != NM_OK) gone = true; // (its last frames, flushed into the reply)
    if (sent_head) {
        if (!gone) mg_send_chunk(c, "", 0);
        code = 200;
    }
    return code;
}
