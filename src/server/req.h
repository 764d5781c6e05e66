// nanomind serve: the parsers of request bodies, apart from HTTP (no civetweb,
// no server): each takes the body's JSON and gives what the bricks need, or the
// error to send (code, parameter, message). tests/fuzz/fuzz_serve_req.c runs
// them on any bytes; server.c, gen.c and audio.c send what they return.
#ifndef NM_SERVER_REQ_H
#define NM_SERVER_REQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "nanomind.h"

// An error to send as OpenAI's {"error": {"message", "type", "param", "code"}}.
typedef struct serve_err {
    int code;          // an HTTP status, 400..599
    const char *param; // the request's field it names (static), or NULL
    char msg[512];
} serve_err;
// Fills e; returns false (for `return serve_fail(...)`).
bool serve_fail(serve_err *e, int code, const char *param, const char *fmt, ...);

// The body as a JSON object (NULL: e says why). Bodies nesting deeper than
// SERVE_JSON_MAX_DEPTH are refused before parsing: cJSON parses and frees
// recursively, a stack frame a level, and a connection thread's stack is small.
#define SERVE_JSON_MAX_DEPTH 64
cJSON *serve_json_object(const char *body, serve_err *e);

// Text for a JSON string: in[0..n) as valid UTF-8 into out (room for 3 n bytes), each byte that does not
// start a well-formed sequence (RFC 3629: no overlong forms, surrogates or code points past U+10FFFF; a
// sequence cut by the end of in counts as malformed) replaced by U+FFFD (llama-server's JSON writer
// replaces them too, though one U+FFFD for a cut sequence's whole prefix). A model's tokens can spell any bytes (a random model's, or byte-fallback pieces out of order);
// JSON must not carry them. Returns the bytes written.
size_t serve_utf8_clean(const char *in, size_t n, char *out);

// An image of a chat message: a data: URL's base64 payload (borrowed from the
// request, which outlives the decode) or a file under --image-dir (owned).
typedef struct serve_image {
    const char *b64;
    size_t b64_len;
    char *path;
} serve_image;
typedef struct serve_images {
    serve_image v[NM_PIPELINE_MAX_IMAGES];
    int n;
} serve_images;
void serve_images_free(serve_images *im);

// What the server lets a request use.
// kwargs: the template's variables for this chat (nm_chat_format_jinja's; NULL: none).
typedef char *(*serve_chat_fmt)(void *ctx, const nm_chat_msg *msgs, size_t n, const char *kwargs, nm_status *st);
typedef struct serve_env {
    bool vision;                // images are served (--mmproj)
    const char *image_dir_real; // --image-dir, resolved (NULL: none)
    const char *system;         // -sys: the system message of chats that have none (NULL: none)
    serve_chat_fmt format;      // the chat's text through the model's template (malloc'd; NULL: *st says why)
    void *format_ctx;
    bool jinja;                 // the template is Jinja's (a request may give chat_template_kwargs)
    const char *chat_kwargs;    // --chat-template-kwargs: every chat's (a request's members go over them)
    const char *const *stop; // -r: the stop strings of requests that name none
    int n_stop;
    int64_t speech_max_chars; // --max-speech
    bool piper;               // the voice is a Piper voice (--tts piper): OpenAI's voice names are the server's
} serve_env;

// POST /v1/chat/completions (chat) and /v1/completions: the PARAMS object for
// the LLM brick, the prompt (chat: through the template, a media marker where
// each image goes, the images in im), streaming, and the stop strings (the
// request's, pointing into params, else the server's).
typedef struct serve_gen_req {
    bool stream, usage_in_stream;
    cJSON *params;
    char *prompt;
    serve_images im;
    const char *stop[NM_LLM_MAX_STOP];
    int n_stop;
} serve_gen_req;
bool serve_gen_parse(const serve_env *env, const cJSON *req, bool chat, serve_gen_req *out, serve_err *e);
void serve_gen_free(serve_gen_req *r);

// POST /v1/audio/speech: the text (pointing into req), the reply's format, and
// the TTS brick's PARAMS as JSON text (malloc'd).
typedef enum serve_audio_format { SERVE_WAV = 0, SERVE_PCM = 1, SERVE_ENCODED = 2 } serve_audio_format;
typedef struct serve_speech_req {
    const char *text;
    serve_audio_format format;
    nm_audio_container container; // SERVE_ENCODED: FLAC, MP3 or Opus
    char *params;
} serve_speech_req;
bool serve_speech_parse(const serve_env *env, const cJSON *req, serve_speech_req *out, serve_err *e);

#endif
