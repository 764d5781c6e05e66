// The server's parts (include/nanomind/server.h is its public face,
// docs/server.md the routes):
//
//   server.c   start and stop, HTTP (civetweb), the routes, replies, turns,
//              keys, /metrics
//   gen.c      the generation routes over the decoder's pipeline, its events
//              thread and the requests' boxes
//   image.c    images in chats: their bytes, the vision brick's parameters
//   audio.c    transcriptions and speech over one-brick pipelines
//   req.c      the request bodies' parsers (no HTTP: fuzzed on their own)
//   watch.c    the bodies' deadline (--body-timeout)
#ifndef NM_SERVER_IMPL_H
#define NM_SERVER_IMPL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include <civetweb.h>
#include <cjson/cJSON.h>

#include "nanomind.h"
#include "server/req.h"

// A brick's turn: `slots` requests at a time hold it (the decoder's: --parallel;
// the transcriber's and the voice's: one); --queue of them may wait, in the
// order they came (waiting, busy: counted under the server's lock, for 429 and
// /metrics).
typedef struct serve_turn {
    pthread_cond_t free; // (with the server's lock) a request gave its turn back
    int waiting, busy, slots;
    uint64_t next_ticket, serving; // first come, first served: the ticket whose turn is next
} serve_turn;

// A request's answer as the pipeline gives it: the pipeline's events (requests decoded together share
// them) are given to gen.c's on_event, which puts each request's text pieces and its end into
// its box, which the request's handler takes (under box_lock).
typedef struct serve_box {
    uint64_t id;          // the pipeline's request (0: a free box)
    char *text;           // pieces come, not yet taken: text[0, n), the k-th ending at end[k]
    size_t n, cap, *end;
    int32_t n_end, cap_end;
    double t_first;       // the first piece came (serve_now); 0: none yet
    bool ended, lost;     // its DONE came (with the figures below); the pipeline closed before it
    nm_status status;
    nm_llm_stop stop;
    int32_t n_prompt, n_tokens, n_cached;
    char err[512];
} serve_box;

#define MAX_KEYS 16

// A Prometheus histogram of seconds (latency): per bucket the observations at
// most its bound (cumulative, as Prometheus reads them), their sum and count.
#define SERVE_N_LE 12
typedef struct serve_hist {
    uint64_t bucket[SERVE_N_LE];
    double sum;
    uint64_t count;
} serve_hist;
void serve_hist_add(serve_hist *h, double seconds); // under the server's lock
// Its lines (HELP, TYPE, buckets, +Inf, sum, count) into buf; the bytes written.
int serve_hist_print(const serve_hist *h, const char *name, const char *help, char *buf, size_t size);

// A body's deadline (--body-timeout; watch.c). civetweb waits up to --idle-timeout for each read of a body
// and every byte that comes starts that wait again, so a client dripping a body holds a thread for ever. A
// watch names the request's socket (found by its two endpoints) and its deadline; the watchdog thread shuts
// the socket for reading when the deadline passes, the read blocked on it returns, and the handler answers
// 408 (the reply still goes out: only reading is shut).
typedef struct serve_watch {
    struct serve_watch *next;
    int fd;          // -1: no deadline (none asked, or the socket not found)
    double deadline; // CLOCK_MONOTONIC seconds
    bool fired;
} serve_watch;
typedef struct serve_watchdog {
    pthread_mutex_t lock;
    pthread_cond_t cv; // (CLOCK_MONOTONIC) a watch came or the server stops
    pthread_t thread;
    bool started, stop;
    int timeout_s; // 0: none
    serve_watch *head;
} serve_watchdog;
// The request's socket (the one open file whose peer is the client's address and port), or -1.
int serve_conn_fd(struct mg_connection *c);
// Whether the client closed (or reset) the connection: a read would give end of file. Data it sent
// ahead (a pipelined request) leaves it open.
bool serve_peer_closed(int fd);
bool serve_watchdog_start(serve_watchdog *w, int timeout_s);
void serve_watchdog_stop(serve_watchdog *w);
void serve_watch_begin(serve_watchdog *w, struct mg_connection *c, serve_watch *e); // the body's clock starts
bool serve_watch_end(serve_watchdog *w, serve_watch *e); // true: the deadline passed (reading was shut)

struct nm_server {
    const char *host, *alias;  // (strings owned: the copies below)
    char *host_own, *alias_own, *system_own, *chat_template, *jinja_template, *jinja_name, *image_dir_own, *sysfs_own;
    char *chat_kwargs; // --chat-template-kwargs (NULL: none)
    char *energy_source;
    cJSON *alias_json;
    char *alias_text; // the alias as a JSON string (quoted, escaped): the streamed chunks' "model"
    int32_t port, queue_max, body_timeout_s;
    int32_t idle_timeout_s; // a header's arrival, a body's read, an answer's write (civetweb's request_timeout_ms)
    int32_t threads_http;   // civetweb's num_threads; 0: from --parallel and --queue
    serve_watchdog watchdog;
    int64_t body_max;
    char *keys[MAX_KEYS];
    int n_keys;
    bool loopback_only; // --host is a loopback address: only loopback names in a Host header
    bool jinja;         // the chats' template (chat_template, jinja_template: NULL where not given)
    bool reasoning_split; // a chat answer's <think> block as reasoning_content (NM_REASONING_DEEPSEEK)
    size_t jinja_len;
    const char *system; // a chat's system message where it has none (NULL: none)
    char *stop[NM_LLM_MAX_STOP]; // the stop strings of requests that name none
    int n_stop;
    bool template_said; // a Jinja template's fallback was logged (once)
    void (*log)(void *user, const char *line);
    void *log_user;
    struct mg_context *ctx;
    nm_model *m;      // the decoder's model (its brick's)
    // the decoder (and the vision encoder): a pipeline (gen.c), its events pushed (on_event) into the boxes
    nm_pipeline *P;
    // speech to text: a pipeline of the STT brick (its own thread pool), one transcription at a
    // time (its turn: the request holding it reads the pipeline's events); stt is its brick (borrowed)
    char *stt_alias;  // the STT model's id in /v1/models (its file's name)
    nm_pipeline *stt_P;
    nm_brick *stt;
    nm_stt_model_info stt_info;
    int32_t audio_max_s;
    serve_turn stt_turn;
    uint64_t n_audio_requests;
    double audio_seconds, stt_wall;
    // text to speech: a pipeline of the TTS brick on its lane, one synthesis at a time (as above)
    nm_pipeline *tts_P;
    nm_brick *tts;
    int32_t speech_max_chars;
    serve_turn tts_turn;
    uint64_t n_speech_requests;
    double speech_seconds;
    // images in chats: the pipeline's vision brick (has_vision), each image's parameters (the pixel limit)
    bool has_vision;
    bool tts_piper;    // the speech engine is Piper (OpenAI's voice names: its voice)
    const char *image_dir;
    char *image_dir_real; // image_dir resolved (realpath), for the containment check
    char vision_params[64];
    int64_t image_max_pixels;
    nm_ledger *ledger; // bytes copied (/metrics): the answers' text out of the pipeline's events, the images'
                       // bytes into the vision brick's slot, the audio; the prompt is tokenized into the
                       // decoder's slot (nothing copied)
    int ep_server, ep_llm;
    time_t created;
    serve_turn turn; // the decoder's: --parallel sequences at a time
    int32_t parallel;
    serve_box *boxes; // (parallel) under box_lock; box_cv: a box got pieces or ended
    pthread_mutex_t box_lock;
    pthread_cond_t box_cv;
    pthread_mutex_t lock; // the counters, the turns' counts
    int active;    // requests being handled
    pthread_cond_t idle; // active dropped to 0
    bool stopping; // stopping: new requests get 503, those in flight finish ...
    bool abandon;  // ... until the stop's time is up: those waiting for a turn get 503, those running are cancelled
    uint64_t stt_id, tts_id; // the transcription's and the speech's request in their pipelines (0: none)
    uint64_t next_id;
    // counters for /metrics
    uint64_t n_requests, n_errors, n_prompt_tokens, n_gen_tokens, n_rejected;
    // latencies of the requests answered (200): a generation's whole time and its first token's, from the
    // body read; a transcription's and a speech request's whole time
    serve_hist lat_generation, lat_first_token, lat_transcription, lat_speech;
    // energy (modelled, docs/power.md): the process's CPU time since t0 at the watts given, and the decoder's
    // DRAM traffic as its estimate has it for each request
    double idle_w, active_w, pj_byte;
    int32_t n_cores;
    double t0, cpu0, dram;
    // energy measured where the machine has meters (RAPL, hwmon, INA3221 rails, the battery, NVML), running since t0
    const char *sysfs;          // where they are looked for (NULL: /sys)
    nm_energy_meters *meters;   // NULL where none
};
typedef struct nm_server server; // (the parts' name for it)

// A line for the operator (params.log, or stderr), printf-style.
void serve_log(const server *S, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
double serve_now(void);          // seconds, monotonic
double serve_cpu_seconds(void);  // this process's user + system time


// Replies (server.c). send_error: OpenAI's error object; counts the error.
int send_json_text(struct mg_connection *c, int code, const char *body);
int send_json(struct mg_connection *c, int code, cJSON *root); // takes root
// One server-sent event, "data: JSON\n\n", as a chunk of a chunked reply; obj is freed. False once the
// client has gone (or out of memory).
bool serve_sse(struct mg_connection *c, cJSON *obj);
int send_error(server *S, struct mg_connection *c, int code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
int send_err(server *S, struct mg_connection *c, const serve_err *e); // a parser's error (req.h)
// What the server lets a request use (req.h), as it stands now.
serve_env serve_env_of(server *S);
// The body, NUL-terminated (malloc'd), or NULL with the error sent (*code).
char *read_body(server *S, struct mg_connection *c, int *code);
// The body as a JSON object, or NULL with the error sent (*code).
cJSON *read_json(server *S, struct mg_connection *c, int *code);
// Waits for t (true: held, busy), or counts a rejection and returns false when
// --queue requests already wait behind those it serves.
void serve_turn_init(serve_turn *t, int slots);
int serve_turn_take(server *S, serve_turn *t); // 0: taken; 429: --queue wait already; 503: the server stops
void serve_turn_give(server *S, serve_turn *t);


// gen.c: the pipeline of the decoder (lp) and, with vp, the vision brick (err says why), its end, and the
// generation routes.
nm_status serve_gen_start(server *S, const nm_brick_params *lp, const nm_brick_params *vp, char *err, size_t err_size);
void serve_gen_stop(server *S);
int handle_generate(server *S, struct mg_connection *c, bool chat);

// image.c: --image-dir resolved and the images' parameters (err says why), the end, an image's
// bytes (malloc'd into *bytes; err says why: NM_ERR_NOMEM the server's fault, others the client's), and
// its /metrics lines.
nm_status serve_vision_start(server *S, char *err, size_t err_size);
void serve_vision_stop(server *S);
nm_status serve_image_bytes(server *S, const serve_image *img, void **bytes, size_t *n, char *err, size_t err_size);
int serve_vision_metrics(const server *S, char *buf, size_t size);

// audio.c: the STT and TTS bricks' pipelines (err says why), their end, their routes and their
// /metrics lines (under S->lock).
nm_status serve_audio_start(server *S, const nm_brick_params *stt, const nm_brick_params *tts, char *err,
                            size_t err_size);
void serve_audio_stop(server *S);
int handle_transcription(server *S, struct mg_connection *c, bool translate);
int handle_speech(server *S, struct mg_connection *c);
int serve_audio_metrics(const server *S, char *buf, size_t size);

#endif
