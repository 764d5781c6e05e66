// nanomind's public API, part: the OpenAI-compatible server over pipelines.
// Included by <nanomind.h> (its conventions, types and visibility apply): include that.
#ifndef NANOMIND_SERVER_H
#define NANOMIND_SERVER_H
#ifndef NANOMIND_H
#error "include <nanomind.h>, not its parts"
#endif

// ==== the server ======================================================================
// Owner: src/server/ (server_impl.h names the parts). docs/server.md has the routes and the figures.
//
// HTTP (civetweb: a thread per open connection) with llama-server's and OpenAI's routes: POST
// /v1/chat/completions and /v1/completions over a pipeline of the LLM brick (with the vision brick:
// images in chats), /v1/audio/transcriptions and /translations over a pipeline of the STT brick,
// /v1/audio/speech over one of the TTS brick, GET /v1/models, /health, /metrics. A build without
// NM_WITH_SERVER has the calls; start fails with NM_ERR_UNSUPPORTED naming the option.
//
// Threading: start and stop from one thread; the server's own threads serve the requests.
typedef struct nm_server nm_server;

enum { NM_REASONING_NONE = 0, NM_REASONING_DEEPSEEK = 1 };

typedef struct nm_server_params {
    const char *host;            // the address to listen on ("127.0.0.1"; an IPv6 address without brackets)
    int32_t port;                // 8080
    const char *alias;           // the model's id in /v1/models and the answers; NULL: the LLM file's name
    // Keys a request must bring (Authorization: Bearer KEY; /health and /v1/models stay open), copied;
    // none: no key asked.
    const char *const *api_keys;
    int32_t n_api_keys;
    int32_t parallel;            // requests decoded together (the LLM brick's n_parallel), 1 .. 256
    int32_t queue;               // requests that may wait for a brick's turn (more get 429), 0 .. 4096
    int32_t idle_timeout_s;      // a header's arrival, a body's read, an answer's write; 10
    int32_t body_timeout_s;      // a body's whole arrival from its header's end (later: 408); 0: none; 60
    int32_t threads_http;        // connections served at once; 0: parallel + queue + 64, at least 256
    int64_t body_max;            // the largest request body (larger: 413); 8 MiB
    // The bricks (the structs borrowed for the call; what they point to that a brick keeps, llm_model,
    // the stop strings, a voice's name, for the server's life): llm needed (its n_ctx a sequence's;
    // n_parallel set from parallel; its model loaded by the caller or from its path), vision: images in
    // chats (NULL: none), stt: transcriptions (NULL: 404), tts: speech (NULL: 404). Their ledger is the
    // server's.
    const nm_brick_params *llm, *vision, *stt, *tts;
    const char *image_dir;       // image_url paths (file:// too) of files under it; NULL: data: URLs only
    int64_t image_max_pixels;    // an image's width x height (larger: 400); 16777216
    int32_t audio_max_s;         // the longest transcription, seconds; 1800
    int32_t speech_max_chars;    // the most characters a speech request's input may have; 4096
    // Chats: the template (chat_template: a built-in one named; jinja: rendered from jinja_template,
    // jinja_len bytes, or the model's own where NULL; jinja_name: what messages call it), the system
    // message of chats that have none, and the stop strings of requests that name none (copied).
    const char *chat_template;
    bool jinja;
    const char *jinja_template;
    size_t jinja_len;
    const char *jinja_name;
    // jinja: the template's variables of every chat (nm_chat_format_jinja's kwargs; NULL: none), a
    // request's chat_template_kwargs members over them; refused at create without jinja
    const char *chat_template_kwargs;
    // A chat answer's thinking (<think>...</think> opening it) as message.reasoning_content (streamed:
    // delta.reasoning_content), out of its content, as llama-server's --reasoning-format deepseek (its
    // default, auto): NM_REASONING_DEEPSEEK (the default); NM_REASONING_NONE: left in the content.
    int32_t reasoning_format;
    const char *system_prompt;
    const char *const *stop;
    int32_t n_stop;
    // Energy in /metrics: modelled from the process's CPU time at these watts (idle, all cores busy) over
    // n_cores (0: every core), plus pJ a byte of the decoder's DRAM traffic; energy_source says where the
    // figures come from. Measured where meters are found under sysfs (NULL: /sys; NVIDIA GPUs via NVML).
    double idle_w, active_w, pj_byte;
    int32_t n_cores;
    const char *energy_source;
    const char *sysfs;
    // Lines for the operator (the energy meters found, a chat template's fallback, a warning), each whole
    // and without its newline; NULL: stderr.
    void (*log)(void *user, const char *line);
    void *log_user;
} nm_server_params;

nm_server_params nm_server_default_params(void);

// Loads the bricks (each in its pipeline) and starts listening. On failure *out is NULL and err says
// why, after the part's name: "llm: ...", "vision: ...", "stt: ...", "tts: ...", "listen: ..." (the
// address in use, or not this machine's), "server: ..." (a parameter out of range).
nm_status nm_server_start(const nm_server_params *p, nm_server **out, char *err, size_t err_size);
// Stops: new requests get 503, those in flight get up to timeout_s seconds to end, then the server
// stops listening and frees everything. NULL: a no-op.
void nm_server_stop(nm_server *s, int32_t timeout_s);
// The port it listens on (p->port, or the one the system chose for port 0).
int32_t nm_server_port(const nm_server *s);

#endif
