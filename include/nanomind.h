// nanomind: on-device inference runtime for multimodal models. Public C API.
//
// Conventions
// - Handles are opaque. Every *_create/*_load has a *_free; free(NULL) is a no-op.
// - Fallible calls return nm_status (negative = error). Details of the last
//   error live on the handle (nm_*_last_error) or, for calls that create a
//   handle, in the caller's `err` buffer.
// - Threading: a handle is used by one thread at a time unless said otherwise.
//   A loaded nm_model is read-only and may be shared by several contexts.
#ifndef NANOMIND_H
#define NANOMIND_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

// The library is built with hidden visibility: what this header declares is
// its whole exported API.
#pragma GCC visibility push(default)

#define NM_VERSION_STRING "0.1.0"

typedef enum nm_status {
    NM_OK = 0,
    NM_ERR_INVALID_ARG = -1, // a caller passed something meaningless
    NM_ERR_IO = -2,          // open/read/mmap failed
    NM_ERR_FORMAT = -3,      // the file or input is corrupt or malformed
    NM_ERR_UNSUPPORTED = -4, // well-formed but not something we run (yet)
    NM_ERR_NOMEM = -5,
    NM_ERR_RANGE = -6,       // a size, position or count out of range (e.g. context full)
    NM_ERR_TEMPLATE = -7,    // unknown chat template
    NM_ERR_AGAIN = -8,       // a try (timeout 0) found nothing to take
    NM_ERR_TIMEOUT = -9,     // a blocking call ran out of time
    NM_ERR_SHUTDOWN = -10,   // the ring was shut down (and, for reads, drained)
    NM_ERR_STATE = -11,      // the slot is not in the state the call needs
    NM_ERR_CANCELLED = -12,  // the request was cancelled (nm_tabm_cancel_request)
} nm_status;

// Static string naming the status; never NULL.
const char *nm_status_str(nm_status s);

// ---- the machine ---------------------------------------------------------------------
int32_t nm_cpu_count(void); // online cores, >= 1
// "CPU MODEL | FEATURES | quant X, f32 gemm Y": the CPU, the features found
// and the kernels chosen for them (what ran, for the record) into buf;
// returns buf.
const char *nm_system_info(char *buf, size_t size);
// Read bandwidth of host memory in GB/s: the best of 5 passes over a 512 MiB
// buffer (far beyond the caches), n_threads (<= 0: all cores) reading disjoint
// slices. Takes about a second; 0 if the buffer cannot be had.
double nm_cpu_read_gbps(int32_t n_threads);

// CPU topology from sysfs: the online cores in clusters, the fastest first
// (big.LITTLE: cores of the same cpu_capacity and top frequency within 10%;
// x86: a package, or P- and E-cores apart by their top frequency).
#define NM_MAX_CPUS 256
#define NM_MAX_CLUSTERS 16
typedef struct nm_cpu_cluster {
    int32_t n_cpus;
    int32_t cpus[NM_MAX_CPUS]; // ascending
    int32_t capacity;          // cpu_capacity (1024: the biggest core); 0 where the kernel does not say (x86)
    int64_t max_khz;           // cpuinfo_max_freq; 0 if unknown (a VM)
    int64_t package;           // physical_package_id
    int64_t cache_bytes;       // the highest-level cache its cores share (ARM L2 or L3, x86 L3); 0 if unknown
} nm_cpu_cluster;
typedef struct nm_cpu_topology {
    int32_t n_cpus;     // online
    int32_t n_clusters;
    nm_cpu_cluster clusters[NM_MAX_CLUSTERS];
} nm_cpu_topology;
// Reads ROOT/devices/system/cpu (root NULL: "/sys"; tests give a fake tree).
// Only `online` is required; the rest refines the clusters.
nm_status nm_cpu_topology_read(const char *root, nm_cpu_topology *out, char *err, size_t err_size);
// A lane's cores from a spec: a list ("0-3,6"), "big" (the fastest cluster),
// "little" (the slowest), "cluster:N". Every core must be online. Ascending
// into cores (room for max); *n their count.
nm_status nm_cores_parse(const nm_cpu_topology *t, const char *spec, int32_t *cores, int32_t max, int32_t *n,
                         char *err, size_t err_size);

// ---- GGUF files ------------------------------------------------------------------------
// Prints a GGUF file's version, every metadata key (arrays abbreviated) and its
// tensor table (name, type, shape, bytes) to f. A corrupt or truncated file is
// an error naming the problem (nothing is printed).
nm_status nm_gguf_print_file(const char *path, FILE *f, char *err, size_t err_size);
// A GGUF file's general.architecture ("llama", "whisper", "clip" for an mmproj, ...) into arch (cut to
// size - 1 bytes): what a file is, to say which command takes it. NM_ERR_FORMAT (err says why) if it is
// not a GGUF file or names none.
nm_status nm_gguf_arch(const char *path, char *arch, size_t size, char *err, size_t err_size);

// ---- output files ----------------------------------------------------------------------
// Files written without damaging what is on disk (every writer of nanomind
// goes through these): "-" and "/dev/stdout" are stdout; a regular file (or a
// new path) is written to a temporary beside it (.NAME.nm-PID-N.tmp) and
// renamed over it on commit, so until then the old file is untouched and a
// failure removes only the temporary (an existing file keeps its mode; a
// symlink's target is replaced; a file we may not write is refused); a device,
// FIFO or socket is written in place, never truncated or removed (a FIFO
// without a reader is an error, not a hang); a folder is an error. Errors name
// the path and the errno of the call that failed. Opening a temporary first
// removes the ones of the same output that runs now gone left (their PID is no
// process: a SIGKILL, a crash); nothing else in the folder is touched.
typedef struct nm_outfile {
    FILE *f;         // write here between open and commit
    char *path;      // as given (for messages)
    char *final;     // what commit renames onto; NULL when written in place
    char *tmp;       // the temporary file; NULL when written in place
    bool seekable;   // f can seek (the temporary file): a header can be rewritten
    bool is_stdout;
} nm_outfile;

nm_status nm_outfile_open(nm_outfile *o, const char *path, char *err, size_t err_size);
// Flushes (and syncs a temporary file), closes, renames. On failure the
// temporary is removed and the old file, if any, is as it was.
nm_status nm_outfile_commit(nm_outfile *o, char *err, size_t err_size);
// Closes and removes the temporary (a no-op after commit or on a zeroed o).
void nm_outfile_abort(nm_outfile *o);
// Removes every temporary this process has open (not closed, not committed).
// Async-signal-safe: for a handler of SIGTERM, SIGINT or SIGHUP, which should
// then end the process as the signal would (the nanomind CLI's do). Any thread.
void nm_outfile_remove_temps(void);

// ---- input files -----------------------------------------------------------------------
// Files read without hanging and without reading more than a cap (every reader
// of nanomind goes through these): the open never blocks (a FIFO with no writer
// is not waited on); a folder is an error; anything but a regular file (a FIFO,
// a pipe, a device, a socket) is refused unless flags take it as a stream. A
// regular file larger than max_bytes is refused from its size, before a byte is
// read; a stream is read up to max_bytes + 1 bytes and refused at that. Errors
// name the path and the cap: NM_ERR_IO (cannot open or read, not a regular
// file), NM_ERR_RANGE (over the cap).
#define NM_INFILE_STDIN 1u  // "-", and a path naming our standard input (/dev/stdin), read as a stream
#define NM_INFILE_STREAM 2u // any pipe, FIFO, device or socket read as a stream (a FIFO with no writer: empty)

// Opens path. On success *f is the caller's to fclose (for "-", a duplicate of
// stdin's descriptor) and *size (may be NULL) the file's size, or -1 for a
// stream: the caller bounds what it reads from one.
nm_status nm_infile_open(const char *path, uint64_t max_bytes, uint32_t flags, FILE **f, int64_t *size,
                         char *err, size_t err_size);
// Reads path whole into *data (the caller frees it; a '\0' follows the *n
// bytes; n may be NULL).
nm_status nm_infile_read(const char *path, uint64_t max_bytes, uint32_t flags, char **data, size_t *n,
                         char *err, size_t err_size);
// Reads path whole into buf: *n bytes, at most cap (also the cap on the file).
nm_status nm_infile_read_into(const char *path, uint32_t flags, void *buf, size_t cap, size_t *n, char *err,
                              size_t err_size);

// ---- model -------------------------------------------------------------------
typedef struct nm_model nm_model;

typedef struct nm_model_params {
    int32_t n_threads; // default threads of the contexts made from it (each has its own pool); <= 0: all cores
    bool no_mmap;      // read the file into memory instead of mapping it (llama.cpp's --no-mmap)
} nm_model_params;

nm_model_params nm_model_default_params(void);

// Loads a GGUF language model (archs: llama, qwen2, gemma3). Weights stay
// mmapped read-only from the file and are never copied. On failure *out is
// NULL and `err` (may be NULL) receives a message naming the problem.
nm_status nm_model_load(const char *path, const nm_model_params *params, nm_model **out,
                        char *err, size_t err_size);
void nm_model_free(nm_model *m); // all contexts made from it must be freed first

const char *nm_model_arch(const nm_model *m); // borrowed, lives as long as m
int32_t nm_model_n_vocab(const nm_model *m);
int32_t nm_model_n_embd(const nm_model *m);
int32_t nm_model_n_layer(const nm_model *m);
int32_t nm_model_n_ctx_train(const nm_model *m);
// Human-readable one-line description ("llama 30L d576 q4_1 ...") into buf.
void nm_model_desc(const nm_model *m, char *buf, size_t size);
// Bytes of weights one decode step reads: every matmul weight once, the
// output head, one row of the token embeddings (all of them when the output
// head is tied to them, since the head reads the whole table).
uint64_t nm_model_decode_weight_bytes(const nm_model *m);
// Bytes of KV cache one decode step reads per cached position (all layers, K and V, f16).
uint64_t nm_model_kv_bytes_per_pos(const nm_model *m);

// ---- tokenizer (owned by the model) ----------------------------------------------
// Tokenizes `text[0..len)`. add_special: prepend BOS / append EOS as the model's
// metadata says. parse_special: text like "<|im_start|>" becomes its special
// token instead of being split as plain text.
// Returns the number of tokens; if more than n_max are needed returns
// -(number needed) and writes nothing meaningful.
int32_t nm_tokenize(const nm_model *m, const char *text, size_t len, int32_t *out, int32_t n_max,
                    bool add_special, bool parse_special);
// Bytes of token `tok` into buf (not NUL-terminated); returns the byte count, or
// -(needed) if size is too small. Control tokens give 0 bytes unless `special`.
int32_t nm_token_to_piece(const nm_model *m, int32_t tok, char *buf, int32_t size, bool special);
int32_t nm_token_bos(const nm_model *m); // -1 if none
int32_t nm_token_eos(const nm_model *m); // -1 if none
bool nm_token_is_eog(const nm_model *m, int32_t tok); // end of generation (EOS, EOT, ...)

// Streaming detokenizer: turns a token stream into valid UTF-8, holding back a
// multi-byte sequence that is split between tokens until it is complete.
typedef struct nm_detok {
    char pending[8];
    int32_t n_pending;
} nm_detok;
// Appends the text of `tok` to out (size bytes); returns bytes written (may be
// 0 while a UTF-8 sequence is incomplete), or -(needed).
int32_t nm_detok_push(const nm_model *m, nm_detok *d, int32_t tok, char *out, int32_t size);

// ---- chat templates ------------------------------------------------------------
typedef struct nm_chat_msg {
    const char *role;    // "system", "user", "assistant"
    const char *content;
} nm_chat_msg;

// Formats a conversation with the model's chat template (recognised from
// tokenizer.chat_template) or, if tmpl_name is non-NULL, with the named one
// ("chatml", "gemma", "llama3", ...). add_assistant: end with the prompt for the
// assistant's turn. Returns the length written (NUL-terminated), -(needed) if
// buf is too small, or NM_ERR_TEMPLATE if the template is not recognised.
int32_t nm_chat_format(const nm_model *m, const char *tmpl_name, const nm_chat_msg *msgs,
                       size_t n_msgs, bool add_assistant, char *buf, int32_t size);
// Formats a conversation by rendering a Jinja chat template with nanomind's
// interpreter (a subset of Jinja2: docs/jinja.md), as transformers'
// apply_chat_template and llama.cpp's --jinja do: the variables are messages
// (role, content), add_generation_prompt (= add_assistant), bos_token,
// eos_token, tools and documents (none). tmpl: the template's text (len
// bytes), or NULL for the model's own tokenizer.chat_template. A BOS text the
// template writes first is dropped when the tokenizer adds BOS itself, so the
// text tokenizes with add_special as nm_chat_format's does.
// On NM_OK *text is the caller's to free (NUL-terminated; *n its length, n may
// be NULL). Errors, with err (may be NULL) saying what and, where the template
// has one, where ("line L, column C: ..."):
//   NM_ERR_UNSUPPORTED  the template does not parse, or uses a construct the
//                       interpreter lacks: nm_chat_format is the fallback
//   NM_ERR_TEMPLATE     no template (tmpl NULL and the model has none), or the
//                       template refused this conversation (raise_exception, a
//                       type error)
//   NM_ERR_RANGE        it ran past the interpreter's limits (steps, nesting,
//                       memory, output): a runaway template
// Thread-safe, also on a shared model; msgs and tmpl are borrowed for the call.
// kwargs: NULL, or a JSON object's text whose members are more variables of the
// template (llama.cpp's --chat-template-kwargs, a request's chat_template_kwargs:
// {"enable_thinking": false} for Qwen3's and SmolLM3's thinking switch; tools
// and documents replace the defaults); NM_ERR_INVALID_ARG where it is not an
// object or sets messages, add_generation_prompt, bos_token or eos_token.
nm_status nm_chat_format_jinja(const nm_model *m, const char *tmpl, size_t len, const nm_chat_msg *msgs,
                               size_t n_msgs, bool add_assistant, const char *kwargs, char **text, size_t *n,
                               char *err, size_t err_size);
// Whether kwargs (nm_chat_format_jinja's) would be taken by chats formatted with (jinja) or without the
// Jinja template: NM_OK, or NM_ERR_INVALID_ARG with err saying why (without jinja, not a JSON object, a
// reserved name), NM_ERR_NOMEM. What a front end checks before a request runs.
nm_status nm_chat_kwargs_check(const char *kwargs, bool jinja, char *err, size_t err_size);
// The built-in formatter nm_chat_format(m, tmpl_name, ...) uses ("chatml",
// "gemma", ...: static), or NULL where it has none (it would return
// NM_ERR_TEMPLATE): what a caller falling back from nm_chat_format_jinja names.
const char *nm_chat_template_name(const nm_model *m, const char *tmpl_name);
// A conversation as text, the way nanomind's commands and pipeline format it:
// with jinja, nm_chat_format_jinja (tmpl, len: the template; NULL: the model's
// own), and where that template is beyond the interpreter's subset
// (NM_ERR_UNSUPPORTED) the built-in formatter nm_chat_template_name(m,
// tmpl_name) names instead: *fallback (may be NULL) gets its name and err
// keeps why; without jinja, nm_chat_format(m, tmpl_name). On NM_OK *text is
// the caller's to free. kwargs (nm_chat_format_jinja's) need jinja and a
// template inside the subset: NM_ERR_INVALID_ARG where given without jinja,
// NM_ERR_UNSUPPORTED (no fall back: the variables would be dropped) where the
// template is beyond it. Errors (err says why): nm_chat_format_jinja's;
// NM_ERR_TEMPLATE where no template applies (none known, or beyond the
// subset with no built-in one); NM_ERR_NOMEM. Thread-safe, as nm_chat_format_jinja.
nm_status nm_chat_text(const nm_model *m, const char *tmpl_name, bool jinja, const char *tmpl, size_t len,
                       const nm_chat_msg *msgs, size_t n_msgs, bool add_assistant, const char *kwargs, char **text,
                       const char **fallback, char *err, size_t err_size);
// Comma-separated list of the template names nm_chat_format accepts.
const char *nm_chat_template_names(void);
// Whether `name` is one of them.
bool nm_chat_template_known(const char *name);

// ---- context (KV cache + run state) ------------------------------------------------
typedef struct nm_ctx nm_ctx;

typedef struct nm_ctx_params {
    int32_t n_ctx;     // positions in the KV cache; <= 0: min(train context, 4096)
    int32_t n_batch;   // max tokens per nm_decode call; <= 0: 512
    int32_t n_threads; // <= 0: the model's
    bool pin_threads;  // best effort: pin thread i to core i (the calling thread is thread 0); default off
    const char *device; // "cpu" (NULL: the default), "opencl", "opencl:N", or "auto" (the first OpenCL GPU
                        // or accelerator if the model loads and fits there, else the CPU: nm_ctx_device_note
                        // says why)
    int32_t n_gpu_layers; // with a device other than the CPU: the last N layers (and the output head)
                          // there, the rest on the CPU, the hidden state handed over in place; < 0 (the
                          // default): every layer there; 0: none (the CPU computes everything)
    int32_t n_seq;        // sequences decoded together (nm_decode_seqs), each with n_ctx positions of its
                          // own in the KV cache; <= 0: 1. More than one: the CPU backend (1..256)
} nm_ctx_params;

nm_ctx_params nm_ctx_default_params(void);
// The backend a context computes on ("cpu", "opencl").
const char *nm_ctx_device(const nm_ctx *c);
// Layers on that device (the rest, before them, on the CPU).
int32_t nm_ctx_device_layers(const nm_ctx *c);
// With device "auto": why the CPU was chosen ("" when the device was).
const char *nm_ctx_device_note(const nm_ctx *c);
// Bytes of host memory the device reads in place (wrapped) and bytes it had
// copied to its own memory (uploaded): weights, and shared activations.
void nm_ctx_device_stats(const nm_ctx *c, uint64_t *wrapped, uint64_t *uploaded);

// A compute unit this process can place work on.
typedef struct nm_device_info {
    char name[32];       // what --device takes: "cpu", "opencl:0", ...
    char desc[128];      // the device's own name
    char driver[128];    // API version and driver
    uint64_t mem_bytes;  // memory it can use (0 if unknown)
    char type[16];       // "cpu", "gpu", "accelerator" (an OpenCL device's type), "other"
    bool unified;        // it shares the host's memory (imports are wraps, not copies)
    double read_gbps;    // measured read bandwidth (0 if not measured)
} nm_device_info;
// Up to n devices into out, the CPU first, then every OpenCL device; returns
// how many exist. measure: time a read of a large buffer on each (slow).
int32_t nm_list_devices(nm_device_info *out, int32_t n, bool measure);

// Creates a context; all memory for a forward pass (KV cache, activations,
// logits) is allocated here, none per token. `m` is borrowed and must outlive it.
nm_status nm_ctx_create(nm_model *m, const nm_ctx_params *params, nm_ctx **out,
                        char *err, size_t err_size);
void nm_ctx_free(nm_ctx *c);
int32_t nm_ctx_n_ctx(const nm_ctx *c);
int32_t nm_ctx_n_batch(const nm_ctx *c); // max tokens per nm_decode call
int32_t nm_ctx_n_seq(const nm_ctx *c);   // sequences it holds (nm_ctx_params.n_seq)
int32_t nm_ctx_n_threads(const nm_ctx *c); // threads its passes run on (the CPU's; a device's host side)
// Where sequence seq can go on decoding if its positions from pos on are to be replaced: pos itself for an
// attention-only model; for one with recurrent layers (lfm2's short convolutions), whose state at a
// position is kept only for the last positions decoded and at checkpoints (every 32nd position; every
// 128th past 8192 positions of context), the largest such position <= pos (0: from the start). A decode
// at a position where the state is not kept fails with NM_ERR_RANGE.
int32_t nm_ctx_resume_pos(const nm_ctx *c, int32_t seq, int32_t pos);

// Runs the decoder on tokens[0..n) at positions pos..pos+n-1 (n <= n_batch,
// pos+n <= n_ctx). Cache entries at positions >= pos are overwritten.
// all_logits: keep the logits of every token; else only the last.
nm_status nm_decode(nm_ctx *c, const int32_t *tokens, int32_t n, int32_t pos, bool all_logits);
// Same with input embeddings (n rows of n_embd floats, borrowed for the call)
// instead of token ids: the vision brick feeds the decoder through this. The
// first layer reads the rows where they are (a slot in shared memory): they
// are never copied, and nothing writes to them.
nm_status nm_decode_embd(nm_ctx *c, const float *embd, int32_t n, int32_t pos, bool all_logits);
// Continuous batching: one forward pass over n rows of any of the context's
// sequences, row i token tokens[i] at position pos[i] of sequence seq[i]
// (each pos + 1 <= n_ctx; a sequence's cache entries at the rows' positions
// are overwritten, and row i attends its sequence's positions 0..pos[i],
// those of this batch included: the rows of one sequence may come in any
// order; with recurrent layers (lfm2), in order and consecutive, from a position nm_ctx_resume_pos gives).
// The last n_logits rows keep their logits (0 <= n_logits <= n):
// put the rows whose logits are wanted last. nm_decode is this on sequence
// 0 with consecutive positions.
nm_status nm_decode_seqs(nm_ctx *c, const int32_t *tokens, const int32_t *pos, const int32_t *seq, int32_t n,
                         int32_t n_logits);
// nm_decode_embd into sequence seq (0..n_seq-1).
nm_status nm_decode_embd_seq(nm_ctx *c, const float *embd, int32_t n, int32_t pos, int32_t seq, bool all_logits);
// An image's nx x ny embeddings (row-major: row i / nx, column i % nx) at positions pos.. of sequence seq,
// in batches of n_batch. M-RoPE models (qwen2vl) give token i the rope positions (p0, p0 + row, p0 + column),
// p0 the rope position of pos, and move what follows the image on by max(nx, ny) rope positions (its
// cache rows stay nx ny); decoding at or before an image's positions again forgets it. Other models: as
// nm_decode_embd_seq, one position a token.
nm_status nm_decode_embd_grid(nm_ctx *c, const float *embd, int32_t nx, int32_t ny, int32_t pos, int32_t seq,
                              bool all_logits);
// Logits (n_vocab floats) of token i of the last batch; i = -1: the last token.
// Borrowed until the next decode. NULL if i was not kept.
const float *nm_get_logits(const nm_ctx *c, int32_t i);
const char *nm_ctx_last_error(const nm_ctx *c); // "" if none

// ---- sampler ----------------------------------------------------------------------
typedef struct nm_sampler nm_sampler;

typedef struct nm_sampler_params {
    float temp;           // <= 0: greedy
    int32_t top_k;        // <= 0: off
    float top_p;          // >= 1: off
    float min_p;          // <= 0: off
    float repeat_penalty; // 1: off
    int32_t repeat_last_n;
    // llama.cpp's penalties over the same window of repeat_last_n tokens: a
    // token seen c times loses c * frequency_penalty + presence_penalty (if
    // c > 0) from its logit (c counted up to 255). 0: off.
    float presence_penalty, frequency_penalty;
    uint64_t seed;
} nm_sampler_params;

nm_sampler_params nm_sampler_default_params(void);
// NULL on OOM. Allocates its scratch once for n_vocab.
nm_sampler *nm_sampler_create(const nm_sampler_params *p, int32_t n_vocab);
void nm_sampler_free(nm_sampler *s);
// Picks a token from logits (n_vocab floats, not modified). Deterministic for a seed.
int32_t nm_sampler_sample(nm_sampler *s, const float *logits);
// Records a token in the repetition history (prompt and sampled tokens).
void nm_sampler_accept(nm_sampler *s, int32_t tok);
void nm_sampler_reset(nm_sampler *s);


// The rest of the API, one part a concept (include/nanomind/), in the order they build on each other.
#include "nanomind/plumbing.h"
#include "nanomind/bricks.h"
#include "nanomind/planner.h"
#include "nanomind/power.h"
#include "nanomind/audio.h"
#include "nanomind/pipeline.h"
#include "nanomind/server.h"

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
