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

// ---- output files ----------------------------------------------------------------------
// Files written without damaging what is on disk (every writer of nanomind
// goes through these): "-" is stdout; a regular file (or a new path) is
// written to a temporary beside it and renamed over it on commit, so until
// then the old file is untouched and a failure removes only the temporary (an
// existing file keeps its mode; a symlink's target is replaced; a file we may
// not write is refused); a device, FIFO or socket is written in place, never
// truncated or removed (a FIFO without a reader is an error, not a hang); a
// folder is an error. Errors name the path and the errno of the call that failed.
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
// order). The last n_logits rows keep their logits (0 <= n_logits <= n):
// put the rows whose logits are wanted last. nm_decode is this on sequence
// 0 with consecutive positions.
nm_status nm_decode_seqs(nm_ctx *c, const int32_t *tokens, const int32_t *pos, const int32_t *seq, int32_t n,
                         int32_t n_logits);
// nm_decode_embd into sequence seq (0..n_seq-1).
nm_status nm_decode_embd_seq(nm_ctx *c, const float *embd, int32_t n, int32_t pos, int32_t seq, bool all_logits);
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


// ==== zero-copy plumbing: umem pool, copy ledger, TABM ring (issue 4) ==========
// Owner: src/mem/, src/tabm/. Everything in this section is thread-safe unless
// said otherwise. docs/tabm.md describes the slot protocol.

// The zero-copy calls also return NM_ERR_AGAIN, NM_ERR_TIMEOUT, NM_ERR_SHUTDOWN
// and NM_ERR_STATE (see nm_status); the handle's last error
// (nm_umem_last_error, nm_tabm_last_error) says more.

// ---- umem: unified-memory pool ----------------------------------------------------
// Buffers that another engine (GPU, NPU, another process) can import without a
// copy: a dma-buf heap where the kernel has one, else a sealed memfd, else an
// anonymous shared mapping (not exportable).
typedef struct nm_umem nm_umem;
typedef struct nm_umem_buf nm_umem_buf;

typedef enum nm_umem_kind {
    NM_UMEM_DMABUF = 1, // from a /dev/dma_heap heap; CPU access bracketed by begin/end
    NM_UMEM_MEMFD = 2,  // memfd_create, size sealed (F_SEAL_SHRINK | F_SEAL_GROW)
    NM_UMEM_ANON = 3,   // MAP_SHARED|MAP_ANONYMOUS: no fd, shared only with forked children
} nm_umem_kind;

// nm_umem_alloc flags
#define NM_UMEM_F_FD 1u         // must be fd-backed (exportable): never anon
#define NM_UMEM_F_NO_DMABUF 2u  // skip the dma-buf heap (e.g. memory that holds futex words)
#define NM_UMEM_F_HUGEPAGE 4u   // madvise(MADV_HUGEPAGE) on this buffer

typedef struct nm_umem_params {
    const char *dma_heap; // heap device; NULL: "/dev/dma_heap/system"; "": never use a heap
    uint32_t kinds;       // allowed kinds, bit (1 << kind); 0: all
    size_t align;         // power of two >= 64 (64, 128, a page, 2 MiB ...); sizes round up to it; 0: 64
    bool hugepage;        // MADV_HUGEPAGE on every buffer (a hint; ignored where unsupported)
    uint64_t limit;       // max live bytes of the pool; 0: unlimited
} nm_umem_params;

nm_umem_params nm_umem_default_params(void);
// Creates a pool (probes the heap once). On failure *out is NULL and err gets a message.
nm_status nm_umem_create(const nm_umem_params *params, nm_umem **out, char *err, size_t err_size);
// Frees the pool. Buffers still allocated from it are freed too (their pointers
// die), except the memory of TABM rings made in it: a ring keeps it (and the
// pool's bookkeeping) until nm_tabm_free, so the two may be freed in any order.
void nm_umem_free(nm_umem *p);
// "" if none; the last failing call of any thread. The text is the calling
// thread's copy, valid until this thread calls the function again.
const char *nm_umem_last_error(const nm_umem *p);
// Which kind a new buffer gets (the first allowed one that works on this machine).
nm_umem_kind nm_umem_default_kind(const nm_umem *p);

// Allocates size bytes (rounded up to the alignment), zeroed, mapped read-write.
nm_status nm_umem_alloc(nm_umem *p, size_t size, uint32_t flags, nm_umem_buf **out);
// Maps a buffer exported by another process (fd from nm_umem_buf_fd, received by
// nm_fd_recv). fd is borrowed (dup'd inside); size 0: the fd's size. Accounted to p.
nm_status nm_umem_import(nm_umem *p, int fd, size_t size, nm_umem_buf **out);
void nm_umem_buf_free(nm_umem_buf *b); // unmaps and closes; NULL is a no-op

void *nm_umem_buf_data(const nm_umem_buf *b); // borrowed, valid until nm_umem_buf_free
size_t nm_umem_buf_size(const nm_umem_buf *b);
nm_umem_kind nm_umem_buf_kind(const nm_umem_buf *b);
int nm_umem_buf_fd(const nm_umem_buf *b); // borrowed fd (send it with nm_fd_send); -1 for anon

// CPU access brackets: DMA_BUF_IOCTL_SYNC START/END on dma-buf buffers (cache
// maintenance for devices), no-ops otherwise. write: the CPU will write.
nm_status nm_umem_begin_cpu(nm_umem_buf *b, bool write);
nm_status nm_umem_end_cpu(nm_umem_buf *b, bool write);

typedef struct nm_umem_stats {
    uint64_t live_bytes, peak_bytes; // mapped bytes of live buffers (after rounding)
    uint64_t n_live, n_allocs;
    uint64_t bytes_by_kind[4];       // live bytes, indexed by nm_umem_kind
} nm_umem_stats;
nm_umem_stats nm_umem_get_stats(const nm_umem *p);

// Passes an fd over a unix socket (SCM_RIGHTS) with an optional small message.
// nm_fd_recv: *fd is a new fd the caller closes; *n_msg bytes went into msg.
nm_status nm_fd_send(int sock, int fd, const void *msg, size_t n_msg);
nm_status nm_fd_recv(int sock, int *fd, void *msg, size_t msg_size, size_t *n_msg);

// ---- copy ledger ----------------------------------------------------------------------
// Every copy of data between engines or bricks goes through nm_ledger_copy,
// which counts bytes per (from, to) pair: "zero copy" is a measured fact.
typedef struct nm_ledger nm_ledger;
#define NM_LEDGER_MAX_ENDPOINTS 32

nm_ledger *nm_ledger_create(void); // NULL on OOM
void nm_ledger_free(nm_ledger *l);
// Id of the endpoint (brick or engine) called `name`, registering it if new
// (setup time: takes a lock). -1 if the table is full or name is empty.
int nm_ledger_endpoint(nm_ledger *l, const char *name);
// Copies n bytes src -> dst (memcpy; the ranges must not overlap) and counts
// them against (from, to). Lock-free. l may be NULL: a plain copy, uncounted.
void nm_ledger_copy(nm_ledger *l, int from, int to, void *dst, const void *src, size_t n);
// Counts a copy of n bytes someone else made (a device's DMA, an upload by a
// driver) against (from, to), as nm_ledger_copy would.
void nm_ledger_count(nm_ledger *l, int from, int to, size_t n);
uint64_t nm_ledger_bytes(const nm_ledger *l, int from, int to);  // from or to -1: any
uint64_t nm_ledger_copies(const nm_ledger *l, int from, int to); // number of calls
uint64_t nm_ledger_total(const nm_ledger *l);                    // bytes, all pairs
void nm_ledger_reset(nm_ledger *l);
// "ledger: N bytes copied between bricks (K copies)" then one line per pair
// with bytes, into buf (NUL-terminated). Returns the length, or -(needed).
int32_t nm_ledger_format(const nm_ledger *l, char *buf, int32_t size);

// ---- TABM: Token-Aware Buffer Manager ------------------------------------------------
// A ring of n_slots slots, each a header plus max_payload bytes, all in one
// memfd so another process can attach it. Slot life: FREE -> acquire_write ->
// ALLOCATED_FOR_WRITE -> publish -> READY_TO_READ -> acquire_read (in publish
// order) -> ALLOCATED_FOR_READ -> release -> FREE. Any number of producer and
// consumer threads or processes. Payloads are used in place: a reader's
// slot.data points at the bytes the writer wrote.
typedef struct nm_tabm nm_tabm;

typedef enum nm_tabm_kind {
    NM_TABM_BYTES = 0,    // opaque bytes
    NM_TABM_TOKENS = 1,   // int32 token ids, shape [n]
    NM_TABM_EMBD_F32 = 2, // float embeddings, shape [n_tokens, n_embd]
    NM_TABM_EMBD_F16 = 3, // IEEE half embeddings, shape [n_tokens, n_embd]
    NM_TABM_PCM_S16 = 4,  // int16 samples, shape [n_frames, channels], sample_rate set
    NM_TABM_PCM_F32 = 5,  // float samples, same
    NM_TABM_TEXT = 6,     // UTF-8 text (not NUL-terminated), shape [n_bytes]
    NM_TABM_IMAGE = 7,    // an image file's bytes (PNG, JPEG, PPM), shape [n_bytes]; or a camera's
                          // pixels, shape [h, w, c], rows packed: c = 1 grey, 2 YUYV 4:2:2, 3 RGB24
    NM_TABM_PARAMS = 8,   // a request's own parameters: a JSON object (UTF-8, not NUL-terminated), shape
                          // [n_bytes]; a brick takes it as the first slot of a request (see "Requests")
} nm_tabm_kind;

// A slot's header, in the ring's shared memory. The writer fills kind, ndim,
// shape, size (and sample_rate, user, request) between acquire_write and
// publish; the ring sets producer, seq and the timestamps (acquire_write
// zeroes the rest). Readers must not modify it.
typedef struct nm_tabm_meta {
    uint32_t kind;         // nm_tabm_kind
    uint32_t producer;     // as given to acquire_write
    uint64_t seq;          // publish order, from 0, ring-wide
    uint64_t size;         // payload bytes (<= capacity)
    int32_t ndim;          // 0..4; when > 0 for a typed kind, size must equal the shape's bytes
    int32_t sample_rate;   // PCM kinds
    int64_t shape[4];
    uint64_t t_acquire_ns; // CLOCK_MONOTONIC at acquire_write, publish, acquire_read
    uint64_t t_publish_ns;
    uint64_t t_read_ns;
    uint64_t user;         // free for the producer; bricks: flags (NM_BRICK_MORE, ...)
    uint64_t request;      // request id: a brick's output slots carry their request's (0: none)
} nm_tabm_meta;

// A held slot. Filled by acquire_*; pass it back to publish / release / cancel.
typedef struct nm_tabm_slot {
    void *data;         // payload (capacity bytes, 128-byte aligned) in shared memory; borrowed until publish/release
    size_t capacity;    // the ring's max_payload
    nm_tabm_meta *meta; // the slot's header (see above)
    uint32_t index;     // opaque: slot index
    uint32_t gen;       // opaque: generation, makes stale handles fail with NM_ERR_STATE
} nm_tabm_slot;

// pool: where the ring's memory comes from (a memfd buffer); NULL: a memfd of
// the ring's own. n_slots in [1, 65536]; max_payload >= 1.
nm_status nm_tabm_create(nm_umem *pool, uint32_t n_slots, size_t max_payload, nm_tabm **out,
                         char *err, size_t err_size);
// Maps a ring created elsewhere from its fd (nm_tabm_fd, passed with nm_fd_send),
// checking its magic, version and sizes. efd: the creator's nm_tabm_poll_fd to
// signal pollers across processes, or -1. Both fds are borrowed (dup'd).
nm_status nm_tabm_attach(int fd, int efd, nm_tabm **out, char *err, size_t err_size);
// Unmaps this handle. Slots it holds stay held; other handles are unaffected.
void nm_tabm_free(nm_tabm *r);
int nm_tabm_fd(const nm_tabm *r); // borrowed
uint32_t nm_tabm_n_slots(const nm_tabm *r);
size_t nm_tabm_max_payload(const nm_tabm *r);
const char *nm_tabm_last_error(const nm_tabm *r); // "" if none; as nm_umem_last_error

// timeout_ns: < 0 wait forever, 0 try once (NM_ERR_AGAIN if none), > 0 wait at most that long (NM_ERR_TIMEOUT).
// Takes a FREE slot to write (blocks while the ring is full: backpressure).
// NM_ERR_SHUTDOWN once the ring is shut down.
nm_status nm_tabm_acquire_write(nm_tabm *r, uint32_t producer, int64_t timeout_ns, nm_tabm_slot *slot);
// Makes a written slot readable. NM_ERR_RANGE if meta->size > capacity or does
// not match the shape; NM_ERR_STATE if the slot is not held for write. On error
// the slot stays held. Succeeds after shutdown (a slot taken before is not lost).
nm_status nm_tabm_publish(nm_tabm *r, nm_tabm_slot *slot);
// Gives a slot held for write back unpublished.
nm_status nm_tabm_cancel(nm_tabm *r, nm_tabm_slot *slot);
// Takes the oldest published slot. After shutdown, returns what is left, then
// NM_ERR_SHUTDOWN once nothing is left and no writer holds a slot.
nm_status nm_tabm_acquire_read(nm_tabm *r, int64_t timeout_ns, nm_tabm_slot *slot);
// Returns a read slot to FREE. NM_ERR_STATE if not held for read (e.g. released twice).
nm_status nm_tabm_release(nm_tabm *r, nm_tabm_slot *slot);
// Stops new writes and wakes every waiter (all processes), then reclaims what
// dead processes hold (nm_tabm_reclaim). Idempotent.
void nm_tabm_shutdown(nm_tabm *r);
// Dead peers. A process that dies (kill -9, a crash) holding slots or inside a
// ring call stalls no one: the ring lock it held is taken over and its
// half-done step undone, and the slots it held for write (never published) or
// read (the message is lost) go back to FREE. Waiters that could be waiting on
// a dead process look every 100 ms; this call looks now (e.g. for a poller, or
// a supervisor that saw a child die) and returns the number of slots taken
// back. Every process of a ring must be in one pid namespace; a ring attached
// from another one trusts every holder to be alive.
uint32_t nm_tabm_reclaim(nm_tabm *r);
bool nm_tabm_is_shutdown(const nm_tabm *r);
// Cancellation. Marks a request id cancelled, for every process of the ring:
// a brick reading the request from this ring stops it at its next check
// (between slots, prefill batches, tokens, windows, sentences), reads and
// drops the request's remaining input slots, ends its output with a last slot
// flagged NM_BRICK_CANCELLED, and marks the request on its output ring too,
// so what is downstream stops as well. The ring keeps the last
// NM_TABM_MAX_CANCELLED marks, so request ids must not be reused while a
// mark may still be there (ids that count up, as the bricks' users here do).
// NM_ERR_INVALID_ARG for id 0 (no request).
#define NM_TABM_MAX_CANCELLED 64
nm_status nm_tabm_cancel_request(nm_tabm *r, uint64_t request);
bool nm_tabm_request_cancelled(const nm_tabm *r, uint64_t request);
// An eventfd that becomes readable when a slot is published or the ring shuts
// down, for poll/epoll beside other fds. Usage: poll; read() the eventfd to
// clear it; then acquire_read with timeout 0 until NM_ERR_AGAIN. Borrowed.
int nm_tabm_poll_fd(nm_tabm *r);

#define NM_TABM_HIST_BUCKETS 24
typedef struct nm_tabm_stats {
    uint32_t n_slots;
    uint32_t occupancy;     // slots not FREE now
    uint32_t ready;         // slots READY_TO_READ now
    uint32_t max_occupancy; // high-water mark of occupancy
    uint64_t published, released, bytes_published;
    uint64_t full_waits;    // acquire_write calls that found the ring full (backpressure)
    uint64_t empty_waits;   // acquire_read calls that found it empty
    uint64_t reclaimed_write, reclaimed_read; // slots taken back from dead processes (see nm_tabm_reclaim)
    uint64_t recoveries;    // ring locks taken over from a dead process (its half-done step undone)
    uint64_t cancelled;     // marks made by nm_tabm_cancel_request (a request already marked is not marked again,
                            // unless two threads mark it at the same moment)
    double seconds;         // since create
    double slots_per_s, bytes_per_s; // published / seconds
    // Wait time in acquire_write / acquire_read: bucket 0 no wait, bucket 1 a
    // wait under 1 us, bucket i >= 2 a wait in [2^(i-2), 2^(i-1)) us (the last: longer).
    uint64_t write_wait_hist[NM_TABM_HIST_BUCKETS];
    uint64_t read_wait_hist[NM_TABM_HIST_BUCKETS];
} nm_tabm_stats;
// Ring-wide (all processes). Counters are read one by one, not as a snapshot.
nm_tabm_stats nm_tabm_get_stats(const nm_tabm *r);

// ==== end of zero-copy plumbing =============================================================

// ==== bricks: one interface for speech-to-text, vision, the decoder, text-to-speech ====
// Owner: src/bricks/brick.c (the handle, the dispatch) and one implementation
// per brick (src/bricks/*/brick_*.c). docs/bricks.md has the slot protocols
// in full.
//
// A brick is one model (or engine) placed on one compute unit. It reads
// requests from an input ring and writes what it makes into an output ring,
// in place: a payload is written once, into the slot its reader reads.
//
//   kind    input slots (port)                  output slots (port)
//   STT     NM_TABM_PCM_F32, 16 kHz mono (PCM)  NM_TABM_TEXT, one per segment (TEXT)
//   VISION  NM_TABM_IMAGE (IMAGE)                the image's prompt segment for the LLM
//                                                brick: NM_TABM_TOKENS + NM_TABM_EMBD_F32
//   LLM     NM_TABM_TOKENS / NM_TABM_EMBD_F32    NM_TABM_TOKENS, the sampled tokens (TOKENS)
//           (TOKENS, EMBD): a prompt
//   TTS     NM_TABM_TEXT (TEXT)                  NM_TABM_PCM_S16 mono (PCM)
//
// Requests. A request is one or more slots: every slot of it but the last has
// NM_BRICK_MORE in meta->user, in and out alike, so one brick's output is the
// next one's input (STT segments -> TTS, the vision segment -> LLM). Output
// slots carry their request's id in meta->request (the first input slot's).
// The last output slot of a failed request has NM_BRICK_ERROR (its message:
// nm_brick_request_error, or nm_brick_last_error where one request runs at a
// time); the brick goes on with the next request. A malformed
// input slot (another kind, a wrong shape) fails its request: its remaining
// slots are read and dropped.
//
// Parameters of one request. A request may start with an NM_TABM_PARAMS slot
// (NM_BRICK_MORE set): a JSON object whose fields replace the brick's own
// parameters for this request only (the next request has the brick's again).
// The names are the peers' (llama-server's /completion, whisper-server's
// /inference, OpenAI's /v1/audio/speech); unknown fields are ignored, as
// llama-server does, and a known one of the wrong type or out of range fails
// the request (flagged, the field named).
//   LLM    temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n
//          (-1: the context), presence_penalty, frequency_penalty, seed (-1: a
//          random one), n_predict (or max_tokens; -1: no limit), stop (a
//          string or an array of up to NM_LLM_MAX_STOP), ignore_eos,
//          cache_prompt
//   STT    language, translate, temperature, temperature_inc, beam_size (> 1:
//          beam search), best_of, no_timestamps
//   TTS    voice, speed (0.25..4: times the brick's rate, OpenAI's name;
//          the rate must stay in the engine's range, espeak-ng 80..450
//          words per minute), pitch (0..100), volume (0..200)
//   VISION max_pixels (the image's width x height may not exceed it: a
//          server's limit; default 2^26, the decoder's own)
//
// Cancellation (nm_tabm_cancel_request): a brick stops a cancelled request at
// its next check, drops the rest of its input, ends it with a last slot
// flagged NM_BRICK_CANCELLED (no NM_BRICK_ERROR: nothing failed) and marks the
// request cancelled on its output ring. A slot flagged NM_BRICK_CANCELLED from
// upstream cancels the request the same way.
//
// Per kind:
//   STT    a request is one PCM slot (an utterance, any length: 30 s windows
//          are decoded in turn). Each segment is a TEXT slot, written as its
//          window ends; meta->shape[1], shape[2]: its start and end in 10 ms
//          units of the audio (ndim 1; a segment without text, which
//          whisper.cpp keeps too, has ndim 0). An empty TEXT slot without
//          NM_BRICK_MORE ends the request (only the end of the audio tells
//          which segment is the last).
//   VISION a request is one IMAGE slot. Its segment (marker tokens and the
//          encoder's embeddings, written by the encoder straight into the
//          slots) carries the IMAGE slot's flags on: NM_LLM_IN_AT_POS and its
//          position go to the first slot, NM_BRICK_MORE (more of the prompt
//          follows: text, another image) to the last.
//   LLM    a request is a prompt, decoded in place; NM_LLM_IN_AT_POS set: the
//          slot starts at position NM_LLM_IN_POS_OF(user) (0: a new
//          conversation; leading tokens the cache already holds at those
//          positions are not decoded again), clear: where the brick stands.
//          Output: up to out_batch tokens per slot; the last slot holds the
//          tokens still pending (maybe none: ndim 0, size 0) and the reason
//          generation stopped in NM_LLM_STOP_OF(user). The end-of-generation
//          token itself is not written. With n_parallel > 1 (continuous
//          batching) the brick serves requests together, each on a sequence
//          of its own: their slots may interleave in the rings and are told
//          apart by request id (one sequence: the slots up to a request's
//          last are its own, whatever their ids; it answers with the first's);
//          a slot without NM_LLM_IN_AT_POS continues the sequence the request
//          was given (the free one whose cache holds the longest start of its
//          first prompt slot, else the least recently used); each token goes
//          out in a slot of its own; a run returns once no request is left.
//   TTS    each TEXT slot of a request is spoken in turn; PCM slots (shape
//          [n_frames, 1], sample_rate set) as the engine makes them.
#define NM_BRICK_MORE 1u   // meta->user: more slots of this request follow
#define NM_LLM_IN_AT_POS 2u // LLM input: the slot starts at NM_LLM_IN_POS_OF(user)
#define NM_BRICK_ERROR 4u  // meta->user of a request's last output slot: the request failed
#define NM_BRICK_CANCELLED 8u // meta->user of a request's last output slot: the request was cancelled
#define NM_LLM_IN_POS(pos) (((uint64_t)(uint32_t)(pos) << 32) | NM_LLM_IN_AT_POS)
#define NM_LLM_IN_POS_OF(user) ((int32_t)((user) >> 32))
#define NM_LLM_STOP_OF(user) ((nm_llm_stop)(((user) >> 8) & 0xff))

typedef enum nm_llm_stop {
    NM_LLM_STOP_NONE = 0,      // not a request's last slot
    NM_LLM_STOP_EOG = 1,       // the model sampled an end-of-generation token
    NM_LLM_STOP_N_PREDICT = 2, // n_predict tokens written
    NM_LLM_STOP_CTX_FULL = 3,  // the context has no room for another token
    NM_LLM_STOP_BAD_INPUT = 4, // a slot of the prompt was malformed (NM_BRICK_ERROR set)
    NM_LLM_STOP_ERROR = 5,     // a decode failed (NM_BRICK_ERROR set)
    NM_LLM_STOP_STRING = 6,    // the text reached a stop string
    NM_LLM_STOP_CANCELLED = 7, // the request was cancelled (NM_BRICK_CANCELLED set)
} nm_llm_stop;

typedef enum nm_brick_kind {
    NM_BRICK_STT = 1,
    NM_BRICK_VISION = 2,
    NM_BRICK_LLM = 3,
    NM_BRICK_TTS = 4,
} nm_brick_kind;

// Ports: what a ring between bricks carries. NM_PORT_BIT(p) in the masks below.
typedef enum nm_port {
    NM_PORT_PCM = 0,    // NM_TABM_PCM_F32 or NM_TABM_PCM_S16
    NM_PORT_IMAGE = 1,  // NM_TABM_IMAGE
    NM_PORT_TOKENS = 2, // NM_TABM_TOKENS
    NM_PORT_EMBD = 3,   // NM_TABM_EMBD_F32
    NM_PORT_TEXT = 4,   // NM_TABM_TEXT
} nm_port;
#define NM_PORT_BIT(p) (1u << (p))

// Compute units a brick can run on. NM_UNIT_BIT(u) in nm_brick_i.units.
typedef enum nm_unit {
    NM_UNIT_CPU = 0,
    NM_UNIT_OPENCL = 1,
    NM_UNIT_NPU = 2, // a vendor plugin (static shapes): the planner's profiles may name one
} nm_unit;
#define NM_UNIT_BIT(u) (1u << (u))

// ---- parameters of each kind ------------------------------------------------------------

// The decoder's generation (LLM).
typedef struct nm_llm_params {
    int32_t n_predict; // tokens per prompt; < 0: until end of generation or a full context. Default 128
    int32_t out_batch; // tokens per output slot (<= 1: one, streaming); the output ring's slots must hold them
    // Stop strings (llama.cpp's -r/--reverse-prompt): generation ends once the
    // text generated for the prompt contains one (the token that completes it
    // is written and decoded). Borrowed for the brick's life; at most
    // NM_LLM_MAX_STOP of at most NM_LLM_MAX_STOP_LEN bytes each.
    const char *const *stop;
    int32_t n_stop;
    bool ignore_eos;   // never sample an end-of-generation token (llama.cpp's --ignore-eos)
    // A prompt at a position the cache already holds with the same tokens is
    // not decoded again there, only its last position (for its logits).
    // Default true (llama-server's cache_prompt). The reused entries were
    // computed in another batch shape than a fresh decode would use, so a
    // request's text may differ from a cold run's in the last bits (as
    // llama-server says of its own); false decodes every prompt whole.
    bool cache_prompt;
} nm_llm_params;
#define NM_LLM_MAX_STOP 16
#define NM_LLM_MAX_STOP_LEN 256
#define NM_TTS_MAX_TEXT (1u << 20) // bytes of text per TTS slot (about an hour of speech)

// Speech-to-text (Whisper), written to give the same transcripts as
// whisper.cpp's whisper_full on the same model file (docs/correctness.md).
typedef enum nm_stt_strategy {
    NM_STT_GREEDY = 0,
    NM_STT_BEAM = 1,
} nm_stt_strategy;

#define NM_STT_MAX_DECODERS 8 // best_of and beam_size cap (whisper.cpp's WHISPER_MAX_DECODERS)

typedef struct nm_transcript nm_transcript;

typedef struct nm_stt_params {
    nm_stt_strategy strategy;
    int32_t best_of;         // sequences sampled at T > 0 (greedy: 5)
    int32_t beam_size;       // hypotheses at T = 0 with NM_STT_BEAM (5)
    float patience;          // unused (whisper.cpp: "not implemented"); -1

    const char *language;    // "en", "de", ... or "auto" (multilingual models: detect from the first
                             // window); NULL = "en". English-only models always use English.
    bool translate;          // <|translate|> instead of <|transcribe|> (multilingual models)
    bool no_timestamps;      // decode with <|notimestamps|>: one segment per window
    bool single_segment;     // one segment per window even with timestamps
    bool no_context;         // do not condition on the previous window's text (default true)
    int32_t n_max_text_ctx;  // cap on the previous-text tokens (16384: n_text_ctx / 2 decides)
    const int32_t *prompt_tokens; // initial prompt (whisper-cli --prompt), read during a request;
    int32_t n_prompt_tokens;      // it goes before the previous text
    bool carry_initial_prompt;    // the prompt leads every window's prompt (whisper-cli --carry-initial-prompt)

    bool suppress_blank;     // true
    bool suppress_nst;       // false: whisper.cpp's non-speech symbol list

    float temperature;       // 0
    float temperature_inc;   // 0.2 (0: no fallback)
    float entropy_thold;     // 2.4
    float logprob_thold;     // -1
    float no_speech_thold;   // 0.6
    float max_initial_ts;    // 1.0 s
    float length_penalty;    // -1: score = sum logprob / length
    int32_t max_tokens;      // 0: no limit on the tokens of a segment

    // Token-level timestamps (whisper.cpp's experimental heuristic): each
    // token's t0, t1. Needed by max_len.
    bool token_timestamps;   // false
    float thold_pt;          // 0.01: a token's own timestamp is used above this probability
    float thold_ptsum;       // 0.01: ... and above this summed timestamp probability
    int32_t max_len;         // 0; > 0: segments split to at most this many characters (UTF-8 code points)
    bool split_on_word;      // with max_len: split only before a token that starts with a blank

    int64_t offset_ms;       // start of the audio to transcribe (0)
    int64_t duration_ms;     // 0: to the end

    // Called after each window with its new segments [i0, n) of the
    // transcript so far. Optional; the STT brick writes them as slots.
    void (*on_segments)(const nm_transcript *t, int32_t i0, void *user);
    void *user;
    // Called before each 30 s window (whisper.cpp's abort_callback): true
    // stops the transcription, which fails with NM_ERR_SHUTDOWN. Optional;
    // the STT brick stops so when its output ring is gone.
    bool (*abort_callback)(void *user);
    void *abort_user;
} nm_stt_params;

// whisper.cpp's whisper_full_default_params(strategy) in our terms.
nm_stt_params nm_stt_default_params(nm_stt_strategy strategy);

typedef struct nm_stt_token {
    int32_t id;    // token id
    int32_t tid;   // likeliest timestamp token at this step (id itself for a timestamp)
    float p, plog; // probability and log-probability it was chosen with
    float pt;      // probability of tid among the timestamps
    float ptsum;   // summed probability of the timestamps
    int64_t t0, t1; // token-level timestamps (10 ms units; -1 when not computed)
    float vlen;    // its "voice length" (token_timestamps)
} nm_stt_token;

typedef struct nm_stt_segment {
    int64_t t0, t1;        // 10 ms units from the start of the audio
    char *text;            // UTF-8 (the tokens' bytes), NUL-terminated; owned by the transcript
    nm_stt_token *tokens;  // (n_tokens): text and timestamp tokens of the segment; owned
    int32_t n_tokens;
    float avg_logprob;     // average log-probability of the window's sequence
    float no_speech_prob;  // P(<|nospeech|>) after the window's prompt
    float temperature;     // the temperature the window was decoded at
} nm_stt_segment;

struct nm_transcript {
    nm_stt_segment *seg;   // (n_seg), owned
    int32_t n_seg, cap_seg;
    char language[8];      // the language used ("en", or the detected one)
    float language_prob;   // probability of the detected language (1 if not detected)
    int64_t n_samples;     // audio length
    int32_t n_windows;     // windows encoded
    int32_t n_fallbacks;   // windows decoded again at a higher temperature
};

// Text-to-speech.
typedef struct nm_tts_params {
    const char *engine;   // NULL or "espeak-ng" (the only engine so far)
    const char *voice;    // engine voice: espeak-ng language or voice name, e.g. "en-us", "en", "de",
                          // "en+f3" (a variant); NULL: "en-us"
    int32_t rate_wpm;     // speaking rate, words per minute; espeak-ng: 80..450, default 175
    int32_t pitch;        // 0..100, default 50 (espeak-ng's base pitch)
    int32_t volume;       // 0..200, default 100 (espeak-ng's amplitude, in percent)
    int32_t sample_rate;  // output rate in Hz; 0: the engine's native rate (espeak-ng 22050), else 8000..192000
    const char *data_dir; // espeak-ng-data directory (or a directory holding one); NULL: espeak-ng's
                          // own search (ESPEAK_DATA_PATH, then the installed data)
} nm_tts_params;

// engine NULL, voice "en-us", 175 wpm, pitch 50, volume 100, native rate, data_dir NULL.
nm_tts_params nm_tts_default_params(void);

// ---- the brick ------------------------------------------------------------------------
typedef struct nm_brick nm_brick;

typedef struct nm_brick_params {
    nm_brick_kind kind;
    const char *model;      // the model file: LLM a GGUF decoder; VISION an mmproj GGUF; STT a Whisper GGUF
                            // or whisper.cpp ggml .bin; TTS none (the engine is tts.engine)
    nm_model *llm_model;    // LLM: a loaded model to run instead of loading `model` (borrowed: outlives the brick)
    const nm_brick *feeds;  // VISION: the LLM brick whose input ring it writes (its tokenizer writes the image
                            // markers, its embedding width is checked); borrowed. NULL: the encoder alone,
                            // one EMBD_F32 slot per encoder run (tiles, then the overview), no markers
    // placement
    const char *device;     // LLM, VISION: "cpu" (NULL), "opencl", "opencl:N", "auto" (as nm_ctx_params);
                            // STT, TTS: the CPU only
    int32_t n_threads;      // <= 0: all cores (with `cores`: one per core of the lane)
    bool pin_threads;       // LLM: pin each thread to a core of its lane (as nm_ctx_params)
    const char *cores;      // the lane's cores (nm_cores_parse: "0-3,6", "big", "little", "cluster:N"): its
                            // threads are made there at load, and the thread that serves a request is
                            // bound there while it does; NULL: anywhere
    // plumbing
    const char *name;       // its endpoint in the ledger; NULL: the kind's name ("llm", "vision", "stt", "tts")
    nm_ledger *ledger;      // borrowed, may be NULL: the copies the brick makes between bricks are counted there
    uint32_t producer;      // producer id of its output slots
    int64_t timeout_ns;     // each wait on a ring (as nm_tabm_*); default -1: forever
    // LLM
    int32_t n_ctx, n_batch, n_gpu_layers; // as nm_ctx_params
    bool no_mmap;                          // as nm_model_params
    nm_sampler_params sampling;
    nm_llm_params llm;
    // STT
    nm_stt_params stt;
    int32_t stt_max_decoders; // room for best_of / beam_size sequences (<= 0: 5)
    // TTS
    nm_tts_params tts;
    // LLM: requests decoded together (continuous batching), each on a sequence of its own of n_ctx
    // positions (llama-server's --parallel); <= 1: one at a time. More than one: the CPU backend
    int32_t n_parallel;
} nm_brick_params;

// The defaults of every field for a brick of `kind`.
nm_brick_params nm_brick_default_params(nm_brick_kind kind);

// What a brick is asked to estimate: the size of one request.
typedef struct nm_brick_input {
    int64_t n_tokens;      // LLM: prompt positions to decode (tokens and embedding rows)
    int64_t n_past;        // LLM: positions already in the cache before them
    int64_t n_predict;     // LLM: tokens to generate
    int64_t n_samples;     // STT: 16 kHz samples
    int32_t width, height; // VISION: the image, in pixels
    int64_t n_bytes;       // TTS: bytes of text
} nm_brick_input;

#define NM_EST_TYPES 48 // GGUF tensor type ids 0..47
// A brick's cost for one request, from its shapes (no run): what the planner
// multiplies with a unit's measured speeds.
typedef struct nm_brick_cost {
    double flops;                       // all arithmetic (a multiply-add counts 2)
    double flops_by_type[NM_EST_TYPES]; // of it, the matmuls by their weight's GGUF type; [0] (F32) also holds
                                        // attention, convolutions, norms and activations
    double weight_bytes_read;           // weight bytes streamed: every forward pass reads its matmul weights
    double act_bytes;                   // activations and KV cache read and written (an approximation)
    uint64_t weight_bytes;              // weights resident (mapped from the file)
    uint64_t peak_bytes;                // memory held at the peak: weights and every buffer
    int64_t n_passes;                   // forward passes: prefill batches + decode steps, encoder runs, windows
    int64_t n_out;                      // what it makes: tokens, embedding rows, segments (upper bound), samples
    double n_ops;                       // ops dispatched, summed over the passes (0: not counted)
} nm_brick_cost;

// Cumulative counters, read while the brick is idle (or from the lane that runs it).
typedef struct nm_brick_stats {
    uint64_t n_requests, n_in_slots, n_out_slots, n_bad_requests;
    uint64_t n_cancelled;         // requests ended cancelled (counted in n_requests, not n_bad_requests)
    double t_busy;                // seconds working on requests (LLM t_prompt + t_gen, VISION decode + encode,
                                  // STT transcription, TTS synthesis), waits on the output ring included
    // LLM
    uint64_t n_prompt_tokens;     // prompt positions decoded (not the reused ones)
    uint64_t n_gen;               // tokens sampled and decoded
    double t_prompt, t_gen;
    // VISION
    uint64_t n_images, n_encoded; // images, encoder runs (tiles and overviews)
    double t_decode, t_encode;    // reading + preprocessing the images, the encoder
    // STT, TTS
    uint64_t n_samples;           // audio samples in (STT) or out (TTS)
    uint64_t n_segments;          // STT
    // LLM
    uint64_t n_passes;            // forward passes (a prompt chunk, a step of the generating sequences)
    uint64_t n_pass_seqs;         // sequences those passes carried, summed (/ n_passes: the mean batch)
    uint32_t max_pass_seqs;       // the most one pass carried
} nm_brick_stats;

// A brick's implementation. Members are only ever appended (version says how
// many are there); optional ones may be NULL. The four built in: nm_brick_builtin.
#define NM_BRICK_I_VERSION 1
typedef struct nm_brick_i {
    uint32_t version;   // NM_BRICK_I_VERSION when written
    nm_brick_kind kind;
    const char *name;   // "llm", ...
    uint32_t in_ports;  // NM_PORT_BIT mask of the slots it reads
    uint32_t out_ports; // ... and writes
    uint32_t units;     // NM_UNIT_BIT mask of where it can run
    // Loads the model onto p->device; *state is the implementation's.
    nm_status (*load)(const nm_brick_params *p, void **state, char *err, size_t err_size);
    // Serves one request (the protocol above). NM_OK also for a request that
    // failed: its last slot says so, and its message goes to
    // nm_brick_set_error(self, ...) before that slot is published (a reader
    // that sees the slot then finds the message). NM_ERR_SHUTDOWN when a ring
    // is shut down (the input one once drained); NM_ERR_TIMEOUT.
    nm_status (*run)(void *state, nm_brick *self, nm_tabm *in, nm_tabm *out);
    void (*release)(void *state); // NULL state: a no-op
    // Optional: the cost of a request of the given size.
    nm_status (*estimate)(void *state, const nm_brick_input *in, nm_brick_cost *out);
    // Optional: the counters (nm_brick_stats, zeroed before; all of them are the implementation's).
    void (*stats)(void *state, nm_brick_stats *out);
    // Optional: the unit it computes on ("cpu" when NULL).
    const char *(*device)(void *state);
    // Bytes the slots of its input ring (out false) or output ring (out true)
    // must hold: see nm_brick_in_slot_bytes.
    size_t (*slot_bytes)(void *state, bool out);
    // Optional: takes the per-request parameters of p for the next requests
    // (LLM sampling and llm, STT stt); the rest of p is ignored.
    nm_status (*set_params)(void *state, const nm_brick_params *p, char *err, size_t err_size);
} nm_brick_i;

// For implementations, from run: the text nm_brick_last_error returns from
// now on (printf-style; longer than 511 bytes is cut).
void nm_brick_set_error(nm_brick *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// For implementations, from run: request `request` failed with this text
// (nm_brick_request_error's; longer than 511 bytes is cut); also the last error.
void nm_brick_set_request_error(nm_brick *b, uint64_t request, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

// The built-in implementation of a kind (NULL for an unknown one).
const nm_brick_i *nm_brick_builtin(nm_brick_kind kind);

// Loads a brick: impl NULL takes the built-in one of p->kind. On failure
// *out is NULL and err says why (the file, the device, the parameter).
nm_status nm_brick_load(const nm_brick_i *impl, const nm_brick_params *p, nm_brick **out, char *err,
                        size_t err_size);
// Releases the model and every buffer. Not while a lane runs it. NULL: a no-op.
void nm_brick_free(nm_brick *b);

const nm_brick_i *nm_brick_impl(const nm_brick *b);
nm_brick_kind nm_brick_get_kind(const nm_brick *b);
const char *nm_brick_name(const nm_brick *b);   // the ledger endpoint's name
const char *nm_brick_device(const nm_brick *b); // the unit it computes on ("cpu", "opencl")

// Changes the per-request parameters for the next requests: LLM sampling and
// llm (the sampler starts afresh), STT stt. Not while a lane runs the brick.
// NM_ERR_UNSUPPORTED for a kind without them (TTS: load another voice);
// NM_ERR_INVALID_ARG (err says why) for bad LLM values, the old ones kept;
// Whisper's are checked by each request (a bad one fails it, flagged).
nm_status nm_brick_set_params(nm_brick *b, const nm_brick_params *p, char *err, size_t err_size);
// Serves one request from `in` into `out` (see nm_brick_i.run); the brick's
// own thread (lane) or the caller's.
nm_status nm_brick_step(nm_brick *b, nm_tabm *in, nm_tabm *out);
// Serves requests until a ring shuts down or a wait times out, then shuts
// down the other ring too, so both neighbours wake and end. The calling
// thread is the brick's lane: with cores set it stays bound to them
// (nm_brick_step binds a thread only while it serves the request). Returns
// NM_ERR_SHUTDOWN or NM_ERR_TIMEOUT (or an error that stopped the brick).
nm_status nm_brick_run(nm_brick *b, nm_tabm *in, nm_tabm *out);
// Bytes an input ring's slots must hold: LLM a context of token ids, VISION
// an image file of up to 64 MiB, STT 30 s of audio (longer requests need
// larger slots), TTS 4 KiB of text (a sentence or a few; a slot may hold up to
// 1 MiB). For the output ring: nm_brick_out_slot_bytes.
size_t nm_brick_in_slot_bytes(const nm_brick *b);
// LLM out_batch tokens; VISION an image's embeddings (its output is an LLM
// input ring: that ring's slots need the larger of the two); STT 4 KiB; TTS
// 100 ms of samples (larger chunks are split).
size_t nm_brick_out_slot_bytes(const nm_brick *b);
// The cost of a request of the given size. NM_ERR_UNSUPPORTED if the
// implementation has no estimate.
nm_status nm_brick_estimate(const nm_brick *b, const nm_brick_input *in, nm_brick_cost *out);
// "" if none. Any thread may read it, also while a lane runs the brick (the
// text is the reader's copy, valid until it calls again).
const char *nm_brick_last_error(const nm_brick *b);
// The text of failed request `request` (its last output slot has
// NM_BRICK_ERROR) among the brick's last NM_BRICK_ERRORS_KEPT failures, or ""
// (not failed, forgotten, or an implementation that does not say). Where a
// brick serves several requests at once (the LLM brick's n_parallel) the last
// error may be another request's; this is the request's own. Request ids are
// taken to be unique on a brick's rings (an id used again finds the earlier
// failure's text until it fails again). A reader's copy, as nm_brick_last_error's.
#define NM_BRICK_ERRORS_KEPT 32
const char *nm_brick_request_error(const nm_brick *b, uint64_t request);
nm_brick_stats nm_brick_get_stats(const nm_brick *b);

// ---- what each kind offers beside the rings -----------------------------------------------
// LLM: the model (tokenizer, chat template: nm_tokenize, nm_chat_format ...)
// and the context it decodes into; borrowed, live as long as the brick.
nm_model *nm_brick_llm_model(const nm_brick *b);
nm_ctx *nm_brick_llm_ctx(const nm_brick *b);
int32_t nm_brick_llm_pos(const nm_brick *b); // where the next slot without NM_LLM_IN_AT_POS starts
// STT: the whole transcript of the last request (segments with their tokens,
// probabilities, the language); borrowed until the next request.
const nm_transcript *nm_brick_stt_transcript(const nm_brick *b);
// STT: the Whisper model it runs.
typedef struct nm_stt_model_info {
    const char *name;   // general.name, or "ggml" + the size for .bin files; borrowed
    const char *format; // "gguf" or "ggml .bin"
    bool multilingual;
    int32_t n_vocab, n_audio_ctx, n_audio_state, n_audio_head, n_audio_layer;
    int32_t n_text_ctx, n_text_state, n_text_head, n_text_layer, n_mels;
    uint32_t wtype;     // GGUF type of the big matrices
} nm_stt_model_info;
// false (and *out zeroed) for a brick of another kind.
bool nm_brick_stt_info(const nm_brick *b, nm_stt_model_info *out);
// The id of a language code ("en", "de", ...) among the model's, or -1.
int32_t nm_brick_stt_lang_id(const nm_brick *b, const char *code);
// Tokens of text as whisper.cpp's whisper_tokenize gives them (an initial
// prompt): up to cap ids to out; returns how many the text has (more than
// cap: call again with room), or -1.
int32_t nm_brick_stt_tokenize(const nm_brick *b, const char *text, int32_t *out, int32_t cap);
// The text whisper.cpp gives a token (whisper_token_to_str: its bytes below
// <|endoftext|>, whisper.cpp's own names from there on), into buf; its length
// in *len. NULL if out of range.
const char *nm_brick_stt_token_text(const nm_brick *b, int32_t id, char buf[24], uint32_t *len);
typedef struct nm_stt_timings {
    double t_mel, t_encode, t_decode, t_sample; // seconds, last request
    int64_t n_encode, n_decode_calls, n_decode_tokens;
} nm_stt_timings;
nm_stt_timings nm_brick_stt_timings(const nm_brick *b);

// Transcript formats; each writes the whole transcript to f and returns false
// on a write error.
//   text:  one segment per line, leading blanks trimmed (whisper-cli -otxt); with
//          timestamps as whisper-cli prints them, text untrimmed
//          ("[00:00:00.000 --> 00:00:02.500]  text").
//   SRT:   numbered cues "HH:MM:SS,mmm --> HH:MM:SS,mmm", text as the segment has it
//          (its leading blank too, as whisper-cli -osrt).
//   WebVTT: "WEBVTT", then cues "HH:MM:SS.mmm --> HH:MM:SS.mmm" and the text as is
//          (whisper-cli -ovtt).
//   JSON:  {"model": model_name, "language": "en", "duration": seconds,
//          "segments": [{"t0": s, "t1": s, "text": "...", "avg_logprob": x,
//          "no_speech_prob": x, "temperature": x, "tokens": [id, ...]}]} (times in
//          seconds, 2 decimals; docs/correctness.md, Whisper). model_name may be NULL.
bool nm_transcript_write_text(const nm_transcript *t, bool timestamps, FILE *f);
bool nm_transcript_write_srt(const nm_transcript *t, FILE *f);
bool nm_transcript_write_vtt(const nm_transcript *t, FILE *f);
bool nm_transcript_write_json(const nm_transcript *t, const char *model_name, FILE *f);
// "HH:MM:SS.mmm" (comma: ',' as SRT wants) of t in 10 ms units into buf (>= 16 bytes).
void nm_stt_timestamp(int64_t t, bool comma, char *buf);
// VISION: the encoder it runs.
typedef struct nm_vision_info {
    const char *projector;  // "mlp" or "idefics3"
    int32_t image_size;     // one encoder input is image_size x image_size
    int32_t patch_size, n_patches, n_layer, n_layer_run;
    int32_t n_out, n_out_embd; // embeddings one encoder run yields, and their width
} nm_vision_info;
// false (and *out zeroed) for a brick of another kind.
bool nm_brick_vision_info(const nm_brick *b, nm_vision_info *out);

// A camera's frame in brief, to tell a frame that changed from one that did
// not (the cascade's camera event): the image's luma (BT.601 integer weights,
// (77 R + 150 G + 29 B + 128) >> 8) averaged over a NM_FRAME_SIG_SIDE x
// NM_FRAME_SIG_SIDE grid of equal cells (cell x spans columns
// [x w / S, (x + 1) w / S), rows likewise; integer sums, rounded), so the
// same file gives the same bytes on every CPU. Frames of any size compare.
#define NM_FRAME_SIG_SIDE 32
typedef struct nm_frame_sig {
    uint8_t luma[NM_FRAME_SIG_SIDE * NM_FRAME_SIG_SIDE];
    int32_t width, height; // the frame's
} nm_frame_sig;
// The signature of an image file (PNG, JPEG, PPM). NM_ERR_IO / NM_ERR_FORMAT /
// NM_ERR_RANGE as the vision brick's decoder, err saying why.
nm_status nm_frame_signature(const char *path, nm_frame_sig *out, char *err, size_t err_size);
// The signature of the image in an IMAGE slot (a file's bytes or a camera's
// pixels, as the vision brick reads it); the slot is only read.
nm_status nm_frame_signature_slot(const nm_tabm_slot *s, nm_frame_sig *out, char *err, size_t err_size);
// How much b differs from a: the mean absolute difference of their cells,
// 0 (the same) .. 255 (black against white).
double nm_frame_difference(const nm_frame_sig *a, const nm_frame_sig *b);

// ---- the camera (V4L2) --------------------------------------------------------------------------
// Frames from a V4L2 capture device (/dev/videoN) straight into IMAGE slots of
// a ring, for the vision brick. Where the driver takes user pointers
// (V4L2_MEMORY_USERPTR: UVC webcams and most others that DMA into pinned
// pages) the camera queues the ring's slots themselves: the driver writes each
// frame where the brick reads it, nothing copied. Else it maps the driver's
// buffers (V4L2_MEMORY_MMAP) and copies each frame into its slot, counted in
// the params' ledger ("camera" -> "vision"). Formats, in this order of
// preference: YUYV 4:2:2, Motion-JPEG (the slot holds the JPEG), RGB24, grey
// (nanomind.h, NM_TABM_IMAGE: pixels as shape [h, w, c]). Not thread-safe:
// one thread captures.
typedef struct nm_camera nm_camera;
#define NM_CAMERA_MAX_BUFFERS 16
typedef struct nm_camera_params {
    int32_t width, height; // asked of the driver (it may choose the nearest it has); 0: 640 x 480
    float fps;             // asked of the driver (VIDIOC_S_PARM) where it sets its rate; 0: its own
    uint32_t fourcc;       // a V4L2_PIX_FMT_ code to insist on; 0: the first of the preference above
    uint32_t n_buffers;    // frames queued to the driver, 2..NM_CAMERA_MAX_BUFFERS; 0: 4
    bool no_userptr;       // always capture into the driver's buffers and copy (MMAP)
    nm_ledger *ledger;     // borrowed, may be NULL: where the MMAP path's copies are counted
} nm_camera_params;
nm_camera_params nm_camera_default_params(void);

typedef struct nm_camera_info {
    char driver[16], card[32]; // VIDIOC_QUERYCAP's
    int32_t width, height;     // as the driver set them
    uint32_t fourcc;           // V4L2_PIX_FMT_YUYV, _MJPEG, _RGB24 or _GREY
    size_t slot_bytes;         // the ring's max_payload a frame needs (the driver's sizeimage)
    uint32_t n_slots;          // slots of the ring the camera holds at once (its buffers with
                               // USERPTR, else none): the ring needs this many more than its readers hold
    float fps;                 // the driver's frame rate (0: it does not say)
    bool zero_copy;            // USERPTR: frames land in the slots (known once started)
} nm_camera_info;

typedef struct nm_camera_stats {
    uint64_t n_frames;   // handed out by nm_camera_capture
    uint64_t n_dropped;  // captured but older than a frame handed out, or stale (see capture)
    uint64_t n_errors;   // frames the driver flagged as corrupt, or short: skipped
    uint64_t bytes_copied; // MMAP: bytes copied into slots (0 with USERPTR)
} nm_camera_stats;

// Opens `device` and negotiates the format and rate (no capture yet). *out
// is freed with nm_camera_close. NM_ERR_IO: it cannot be opened (absent, no
// permission); NM_ERR_UNSUPPORTED: not a single-planar capture device with
// streaming I/O, or none of the formats above (err lists the ones it has).
nm_status nm_camera_open(const char *device, const nm_camera_params *p, nm_camera **out, char *err,
                         size_t err_size);
nm_camera_info nm_camera_get_info(const nm_camera *c); // zeroed for NULL
nm_camera_stats nm_camera_get_stats(const nm_camera *c);
const char *nm_camera_last_error(const nm_camera *c); // "" if none; valid until the next call on c
// Starts capturing into `ring` (borrowed until close; its max_payload >= the
// info's slot_bytes, else NM_ERR_RANGE), holding slots for write as `producer`.
// USERPTR is tried first and MMAP taken when the driver refuses it.
nm_status nm_camera_start(nm_camera *c, nm_tabm *ring, uint32_t producer);
// The newest frame, in a slot of the ring held for write: *slot's meta has
// kind IMAGE, its shape and size set (request and user 0); the caller
// publishes it (or cancels it). Older frames waiting in the driver are
// recycled (dropped), as is a frame older than two frame periods (the camera
// went on while nobody asked: the next one is fresher), so the frame is at
// most that old. Waits up to timeout_ns (< 0: forever) for a frame and, when
// every slot is taken, for a free one: NM_ERR_TIMEOUT. NM_ERR_IO when the
// device fails or is gone (unplugged); NM_ERR_SHUTDOWN when the ring is shut.
nm_status nm_camera_capture(nm_camera *c, int64_t timeout_ns, nm_tabm_slot *slot);
// Stops the stream, gives the slots it holds back to the ring (cancelled),
// unmaps and closes the device. NULL is a no-op.
void nm_camera_close(nm_camera *c);

// TTS: the rate of the PCM slots it writes (Hz), the engine's own rate (Hz;
// the output is resampled from it when they differ), the engine's name.
int32_t nm_brick_tts_sample_rate(const nm_brick *b);
int32_t nm_brick_tts_native_rate(const nm_brick *b);
const char *nm_brick_tts_engine(const nm_brick *b); // "" for another kind

// TTS voices, listed without loading a brick.
typedef struct nm_tts_voice_info {
    const char *name;        // what nm_tts_params.voice takes (espeak-ng: the language, e.g. "en-us")
    const char *description; // human name ("English_(America)")
    const char *identifier;  // engine's own id (espeak-ng: "gmw/en-US")
} nm_tts_voice_info;
// Called once per voice, the strings borrowed for the call. Return false to stop.
typedef bool (*nm_tts_voice_fn)(void *user, const nm_tts_voice_info *v);
// Lists an engine's voices (engine NULL: espeak-ng; data_dir as in nm_tts_params).
nm_status nm_tts_list_voices(const char *engine, const char *data_dir, nm_tts_voice_fn fn, void *user,
                             char *err, size_t err_size);


// ==== the planner: bricks onto units ========================================================
// Owner: src/sched/planner.c; docs/scheduler.md. A pipeline is a chain of
// bricks every request passes through in order (STT -> LLM -> TTS, VISION ->
// LLM); the planner maps each brick, and the decoder's layers (two ranges,
// on two units), to a unit, from the units' profiles and the bricks'
// estimates (nm_brick_estimate), under the units' memory, for a goal.
//
// A brick's time on a unit is the roofline of its estimate: the larger of
// its arithmetic (each weight type's FLOPs at the unit's speed for that type,
// the rest at its f32 speed) and its streamed bytes (weights + activations at
// the unit's read bandwidth), plus a launch overhead per forward pass and a
// dispatch cost per op (n_ops x op_us). A
// request's latency is the sum over the chain (each brick waits for the
// previous one's output); the period (the time between two requests in a
// stream, e.g. camera frames) is the busiest unit's summed time; the energy
// of a request is each unit's busy time at its active watts plus, over the
// latency, the idle watts of the units that wait.

#define NM_PLAN_MAX_UNITS 8
#define NM_PLAN_MAX_BRICKS 8
#define NM_PLAN_MAX_PLACEMENTS 20000000 // the search's bound (a few seconds); more: NM_ERR_RANGE

typedef struct nm_unit_profile {
    char name[32];                 // "cpu:big", "opencl:0", "npu" ...
    nm_unit unit;
    double read_gbps;              // memory read bandwidth
    double gflops[NM_EST_TYPES];   // matmul speed by weight type (GGUF type id); 0: the unit cannot run it
    double gflops_f32;             // everything else (attention, norms, convolutions)
    double launch_us;              // overhead per forward pass
    uint64_t mem_bytes;            // memory it may hold bricks in; 0: no limit
    double idle_w, active_w;       // watts: measured (nm_unit_measure_watts) or configured; 0: unknown
    uint32_t kinds;                // bit (1 << nm_brick_kind) per kind it takes; 0: all (a static-shape NPU: vision)
    double matvec_gbps[NM_EST_TYPES]; // decoding: the weight bytes a second a one-token matmul streams from
                                      // memory, by weight type; 0: not measured (read_gbps is used)
    double op_us;                  // dispatch cost of one op inside a pass (its barrier); 0: not measured
} nm_unit_profile;

typedef struct nm_plan_brick {
    nm_brick_kind kind;
    const char *name;              // for the plan's text; borrowed
    nm_brick_cost cost;            // its estimate for a typical request
    uint32_t units;                // NM_UNIT_BIT mask of the kinds of unit it can run on (nm_brick_i.units)
    int32_t n_layer;               // LLM: layers (> 1: it may be split in two ranges); 0: never split
    nm_brick_cost decode;          // LLM: the generation's part of `cost` (one token a pass), scored apart from
                                   // the prompt's (compute-bound) at the unit's matvec_gbps; zero: one phase
} nm_plan_brick;

typedef enum nm_plan_goal {
    NM_PLAN_LATENCY = 0,    // the shortest request, then the shortest period
    NM_PLAN_THROUGHPUT = 1, // the shortest period (most frames a second), then latency
    NM_PLAN_ENERGY = 2,     // the fewest joules a request, then latency
} nm_plan_goal;

typedef struct nm_plan_step {
    int32_t unit;           // index into the profiles
    int32_t unit2;          // LLM split: the unit of its last layers (-1: not split)
    int32_t split;          // layers on `unit` (the first ones) when split
    double seconds;         // its time
    double joules;
    char why[160];          // the reason: what bounds it there, and the best other unit's time
} nm_plan_step;

typedef struct nm_plan {
    int32_t n;                                 // bricks
    nm_plan_step steps[NM_PLAN_MAX_BRICKS];
    double latency_s, period_s, joules;
    double busy_s[NM_PLAN_MAX_UNITS];          // per unit, a request's work there
    uint64_t mem[NM_PLAN_MAX_UNITS];           // per unit, the bricks' peak bytes
    int64_t n_considered;                      // placements looked at
} nm_plan;

// Measures a unit: "cpu" (every core), "cpu:big", "cpu:little",
// "cpu:cluster:N" or "cpu:LIST" (a lane: the measuring thread and its pool on
// those cores), "opencl", "opencl:N": read bandwidth, matmul GFLOP/s by
// weight type (64 tokens of a 1024 x 2048 weight; 0 where the unit has no
// kernel for the type), launch overhead. Watts are not measured here (0: see
// nm_unit_measure_watts). Takes a few seconds.
nm_status nm_unit_measure(const char *unit, nm_unit_profile *out, char *err, size_t err_size);
// The unit's watts into io->idle_w and io->active_w, measured by the energy
// meters under root (NULL: "/sys"; see nm_energy_meters_open) that see it: a
// CPU unit the RAPL packages (summed), else the board's input (an INA3221
// VDD_IN rail, the battery, a socket or package hwmon input, else the first
// hwmon input: they see the whole board); an OpenCL unit its GPU's NVML meter.
// Idle over idle_s seconds (nothing of ours running), then busy_s seconds of
// the unit's f32 matmul on all of it, over and over. source gets the meters'
// names. NM_ERR_UNSUPPORTED (why in err, io untouched) when no meter sees the
// unit or the meter did not move.
nm_status nm_unit_measure_watts(const char *unit, const char *root, double idle_s, double busy_s,
                                nm_unit_profile *io, char *source, size_t source_size, char *err, size_t err_size);
// The profiles as JSON ({"version": 1, "units": [{"name", "unit", "read_gbps",
// "gflops_f32", "gflops": {"q4_0": x, ...}, "launch_us", "op_us", "mem_bytes",
// "idle_w", "active_w", "kinds"}]}) through nm_outfile, and back (a file
// edited by hand is checked: unknown weight types, negative numbers, missing
// keys are NM_ERR_FORMAT naming the unit).
nm_status nm_units_save(const char *path, const nm_unit_profile *units, int32_t n, char *err, size_t err_size);
nm_status nm_units_load(const char *path, nm_unit_profile *units, int32_t max, int32_t *n, char *err,
                        size_t err_size);

// The best placement of the chain for the goal; deterministic (ties go to the
// lower unit index, then to no split). NM_ERR_UNSUPPORTED (err names the
// brick) when some brick fits no unit (kind, weight type, memory);
// NM_ERR_RANGE when there are more than NM_PLAN_MAX_PLACEMENTS placements.
nm_status nm_plan_make(const nm_unit_profile *units, int32_t n_units, const nm_plan_brick *bricks, int32_t n_bricks,
                       nm_plan_goal goal, nm_plan *out, char *err, size_t err_size);
// The plan as text: a line per brick (unit, time, why), then latency, period,
// energy and each unit's memory. Returns the length, or -(needed).
int32_t nm_plan_format(const nm_plan *p, const nm_unit_profile *units, const nm_plan_brick *bricks, char *buf,
                       int32_t size);

// ==== power: the battery, the policy, the actuators, energy ================================
// Owner: src/power/; docs/power.md. A battery source gives the charge B; the
// policy turns it into one of three states and the rates every other part
// follows (the camera's frame rate, the decoder's pace, threads, DVFS); the
// actuators write the DVFS targets under a sysfs root and put everything back;
// meters measure energy where the machine has one, the model estimates it
// where it has none, and every figure says which.

typedef enum nm_power_state {
    NM_POWER_UNCONSTRAINED = 0, // B >= T_high: everything at full speed
    NM_POWER_PROPORTIONAL = 1,  // T_low <= B < T_high: rates scaled by alpha = (B - T_low) / (T_high - T_low)
    NM_POWER_CRITICAL = 2,      // B < T_low: the cascade (event-triggered; each brick load -> run -> release)
} nm_power_state;
// "unconstrained", "proportional", "critical" (static strings).
const char *nm_power_state_name(nm_power_state s);

// --- battery sources
// A reading the source gives is checked before the policy sees it: a missing
// or unreadable value, a non-finite one, one below 0 % or above 100 % is
// rejected (the last accepted charge is kept); a jump of more than
// NM_BATTERY_JUMP_PCT points from the last accepted charge is held until
// NM_BATTERY_CONFIRM readings in a row agree with it (within 2 points), so one
// glitch moves nothing while a real change (a swapped battery) is taken.
// Every rejection and hold is reported in the reading's note.
#define NM_BATTERY_JUMP_PCT 10.0
#define NM_BATTERY_CONFIRM 3

typedef struct nm_battery nm_battery;

typedef struct nm_battery_reading {
    double t_s;       // when: the trace's clock, or the caller's
    double raw_pct;   // what the source gave (NAN: nothing readable)
    double pct;       // the charge the policy uses (the last accepted; NAN until one is)
    double watts;     // drawn from the battery (NAN: unknown); negative while charging
    int32_t charging; // 1 charging or full, 0 discharging, -1 unknown
    bool accepted;    // raw_pct was taken as pct
    char note[160];   // why a reading was rejected or held ("" when accepted)
} nm_battery_reading;

// Linux power_supply: the first supply of type "Battery" (by name) under
// root/class/power_supply (root NULL: "/sys"), or the one named. Charge from
// `capacity`, else energy_now/energy_full or charge_now/charge_full; watts from
// power_now, else current_now x voltage_now; `status` for charging. No battery:
// NM_ERR_UNSUPPORTED naming the folder looked in.
nm_status nm_battery_open_sysfs(const char *root, const char *name, nm_battery **out, char *err, size_t err_size);
// A replayed trace: CSV rows `seconds,percent[,watts]`, seconds strictly
// increasing, an optional header line (a first line that is not numbers); an
// empty percent is a missing reading (rejected at replay, not a format
// error); out-of-range percents are replayed as the nonsense they are. A
// reading at time t is the last row at or before t (the first before it
// starts). NM_ERR_IO (the path and errno), NM_ERR_FORMAT (path:line and the text).
nm_status nm_battery_open_trace(const char *path, nm_battery **out, char *err, size_t err_size);
// A fixed charge (0..100), for a machine without a battery or a what-if.
nm_status nm_battery_open_fixed(double pct, nm_battery **out, char *err, size_t err_size);
// The trace's first and last time (0, 0 for the other sources).
void nm_battery_span(const nm_battery *b, double *t0, double *t1);
// Reads the source at time t_s (a trace's clock; recorded for the others) and
// filters it (above). Never fails on a bad value: that is a rejected reading.
void nm_battery_read(nm_battery *b, double t_s, nm_battery_reading *out);
// "sysfs:/sys/class/power_supply/BAT0", "trace:FILE (N rows, T0..T1 s)", "fixed:55%".
int32_t nm_battery_describe(const nm_battery *b, char *buf, int32_t size);
void nm_battery_free(nm_battery *b); // NULL: no-op

// --- the policy
typedef struct nm_power_params {
    double t_high, t_low;   // percent: unconstrained at or above t_high, critical below t_low (60, 20)
    double hysteresis;      // points B must climb past a threshold before the state rises again (2)
    double fps_max;         // camera frames a second unconstrained (2)
    double fps_min;         // ... at alpha 0 in the proportional state (0.25); critical: 0 (event-triggered)
    double share_min;       // the decoder's pace and each unit's frequency share at alpha 0 (0.25)
    double decode_tps;      // tokens/s the decoder reaches unthrottled (0: unknown, no tokens/s cap given)
    int32_t n_threads;      // threads unconstrained (0: every core)
} nm_power_params;
nm_power_params nm_power_default_params(void);
// NM_ERR_INVALID_ARG naming the field: thresholds outside 0..100 or t_low >=
// t_high, hysteresis negative or not below t_high - t_low, rates negative or
// fps_min > fps_max, share_min outside 0..1.
nm_status nm_power_params_check(const nm_power_params *p, char *err, size_t err_size);

// What the policy asks of everything else at one charge.
typedef struct nm_power_targets {
    nm_power_state state;
    double alpha;          // 1 unconstrained; (B - t_low) / (t_high - t_low) in [0, 1] proportional; 0 critical
    double fps;            // camera: fps_max; fps_min + alpha (fps_max - fps_min); 0 (frames on events only)
    double decode_share;   // the decoder's pace as a share of its full speed: 1; share_min + alpha (1 - share_min)
    double decode_tps_cap; // decode_share x decode_tps (0: no cap: unconstrained, or decode_tps unknown)
    double freq_share;     // DVFS: each unit's top frequency at min + share x (max - min): decode_share (not the
                           // lowest clock in the critical state: below a point a slower clock costs more energy)
    int32_t n_threads;     // n_threads; at least 1, scaled by decode_share; critical: 1
    bool cascade;          // critical: each brick load -> run -> release
} nm_power_targets;

typedef struct nm_power_policy {
    nm_power_params p;
    nm_power_state state;
    double pct;            // the last charge stepped (NAN before the first)
    bool started;          // the first step sets the state from B without hysteresis
} nm_power_policy;
// p NULL: the defaults. NM_ERR_INVALID_ARG as nm_power_params_check.
nm_status nm_power_policy_init(nm_power_policy *pol, const nm_power_params *p, char *err, size_t err_size);
// One charge reading (percent; NAN: keep the state) -> the state and targets.
// Falling: below t_high -> proportional, below t_low -> critical, at once.
// Rising: a state is left upward only when B >= its upper threshold + hysteresis.
nm_power_targets nm_power_policy_step(nm_power_policy *pol, double pct);

// --- actuators: DVFS under a sysfs root
// Found under root (NULL: "/sys"): cpufreq policies
// (devices/system/cpu/cpufreq/policyN: scaling_max_freq within
// cpuinfo_min_freq..cpuinfo_max_freq, or the userspace governor's
// scaling_setspeed) and devfreq devices (class/devfreq/NAME: max_freq within
// available_frequencies, or the userspace governor's userspace/set_freq), each
// given a role by its name (memory: dmc/ddr/bus/memory; gpu: gpu/mali/kgsl;
// npu: npu; others are left alone). A target is min + freq_share x (max - min),
// rounded up to the next available frequency.
//
// Before the first write the original value of every file that may be written
// is saved in the restore record (a small text file: the owner's pid, then
// `path<TAB>value` lines, written whole or not at all). A record left by a
// process that is gone is restored first; one whose owner lives is refused.
// Every apply checks every file it will write (present, writable, the governor
// offered by the kernel) before writing any, and puts back what it wrote if a
// write fails midway: nothing is left half-written. Restore (and free, and a
// crash of the process: SIGSEGV/SIGBUS/SIGILL/SIGFPE/SIGABRT, with
// nm_power_actuators_guard) writes the originals back and removes the record.
typedef struct nm_power_actuators nm_power_actuators;

typedef struct nm_actuator_params {
    const char *sysfs_root;      // NULL: "/sys"
    const char *record;          // the restore record's path (NULL: ~/.cache/nanomind/power-restore.txt)
    const char *cpu_governor;    // NULL: keep the governor, cap scaling_max_freq; "userspace": set scaling_setspeed;
                                 // another name: set that governor and cap scaling_max_freq
    const char *devfreq_governor;// the same for devfreq (max_freq; "userspace": userspace/set_freq)
    bool dry_run;                // write nothing (no record either); print each write to log
    FILE *log;                   // each write as "write PATH VALUE" (dry run: "would write ..."); NULL: none
} nm_actuator_params;
nm_actuator_params nm_actuator_default_params(void);

// NM_ERR_UNSUPPORTED when the root has no cpufreq policy and no devfreq
// device with a role; NM_ERR_STATE when a live process holds the record;
// NM_ERR_IO naming the path when the root cannot be read.
nm_status nm_power_actuators_open(const nm_actuator_params *p, nm_power_actuators **out, char *err,
                                  size_t err_size);
// One line per actuator: its path, role, range, governor, what it would be set to.
int32_t nm_power_actuators_describe(const nm_power_actuators *a, char *buf, int32_t size);
// Writes the targets' frequency share (and governor) to every actuator; a
// value already there is not written again. Errors name the file and errno;
// on any error nothing stays changed by this call.
nm_status nm_power_actuators_apply(nm_power_actuators *a, const nm_power_targets *t, char *err, size_t err_size);
// Writes every saved original back (each tried; the first error returned) and
// removes the record once all are back.
nm_status nm_power_actuators_restore(nm_power_actuators *a, char *err, size_t err_size);
// Restores on a fatal signal of this process (one actuator set at a time;
// NULL: no longer guarded). The originals are written from memory prepared
// here, with calls safe in a signal handler; then the signal is raised again.
void nm_power_actuators_guard(nm_power_actuators *a);
// Restores (errors ignored) and frees. NULL: no-op.
void nm_power_actuators_free(nm_power_actuators *a);
// Restores what a record names (a process that died without restoring):
// NM_ERR_STATE while its owner lives, NM_ERR_FORMAT for a record that is not
// one; removes the record once every value is back.
nm_status nm_power_restore_record(const char *record, FILE *log, char *err, size_t err_size);

// --- energy: measured where a meter exists
// Meters found under root (NULL: "/sys"): RAPL packages
// (class/powercap/intel-rapl:N/energy_uj, wrap-around at max_energy_range_uj),
// hwmon energy (energyN_input, uJ) and power (powerN_input, uW) inputs, INA3221
// rails (inN_input mV x currN_input mA), the battery's power_supply power; and,
// with nvml, NVIDIA GPUs through libnvidia-ml.so.1 (dlopen'd; total energy in mJ).
// Power meters are sampled by a thread (every 50 ms) between start and stop.
typedef struct nm_energy_meters nm_energy_meters;
#define NM_ENERGY_MAX_METERS 16
typedef struct nm_energy_reading {
    int32_t n;                            // meters
    char name[NM_ENERGY_MAX_METERS][48];  // "rapl:package-0", "nvml:0 NVIDIA H200", "hwmon:ina3221:VDD_IN" ...
    double joules[NM_ENERGY_MAX_METERS];  // between start and stop
    double seconds;
} nm_energy_reading;
// NM_OK with no meter at all is possible (count 0): the energy is then modelled.
nm_status nm_energy_meters_open(const char *root, bool nvml, nm_energy_meters **out, char *err, size_t err_size);
int32_t nm_energy_meters_count(const nm_energy_meters *m);
// One line per meter found, and one per meter found but unreadable (with why).
int32_t nm_energy_meters_describe(const nm_energy_meters *m, char *buf, int32_t size);
nm_status nm_energy_meters_start(nm_energy_meters *m, char *err, size_t err_size);
nm_status nm_energy_meters_stop(nm_energy_meters *m, nm_energy_reading *out, char *err, size_t err_size);
// The joules since start so far, the meters still running (a server's counters): thread-safe
// against the sampler and other readers. A counter that wraps is followed across wraps as long
// as it is read at least once a wrap period (RAPL: ~1 h at 65 W). NM_ERR_STATE before start.
nm_status nm_energy_meters_read(nm_energy_meters *m, nm_energy_reading *out, char *err, size_t err_size);
void nm_energy_meters_free(nm_energy_meters *m); // NULL: no-op

// --- energy: modelled where none exists
// A unit's energy for work that kept it busy busy_s within span_s seconds, at
// the clock at a share s in (0, 1] of its top (the work takes busy_s / s): the
// watts the work adds over idle are a static part, NM_ENERGY_STATIC_SHARE of
// them (an awake core leaks and clocks whether it switches or not), and a
// dynamic part that falls as s^3 (f x V^2, V following f); so a lower clock
// saves energy only down to a point, past which the longer time costs more.
// Plus the idle watts over the rest of span_s and dram_bytes of memory traffic
// at pj_per_byte (0: 80 pJ, an LPDDR4X-class figure; docs/power.md).
#define NM_ENERGY_STATIC_SHARE 0.3
double nm_energy_model_joules(const nm_unit_profile *u, double busy_s, double span_s, double freq_share,
                              double dram_bytes, double pj_per_byte);

// ==== audio files ==========================================================================
// Owner: src/bricks/audio/ (audio.h has the full contract). Every reader gives
// one shape: mono float PCM at a chosen rate, nominally in [-1, 1]: libsndfile
// opens the container (WAV, FLAC, OGG Vorbis/Opus, AIFF, ...), channels are
// averaged, soxr (HQ) resamples when the rates differ. The writer stores 16-bit
// PCM WAV. Limits are errors, never crashes: rates NM_AUDIO_MIN_RATE..
// NM_AUDIO_MAX_RATE, 1..NM_AUDIO_MAX_CHANNELS channels, at most
// NM_AUDIO_MAX_SECONDS, NaN/inf samples rejected. Statuses: NM_ERR_INVALID_ARG
// (a caller's argument), NM_ERR_IO, NM_ERR_FORMAT (corrupt, truncated, empty),
// NM_ERR_UNSUPPORTED (a format libsndfile does not read), NM_ERR_RANGE, NM_ERR_NOMEM;
// err says which and where.

#define NM_AUDIO_RATE 16000               // Whisper's input rate
#define NM_AUDIO_MIN_RATE 1000            // Hz, inclusive
#define NM_AUDIO_MAX_RATE 384000          // Hz, inclusive
#define NM_AUDIO_MAX_CHANNELS 32
#define NM_AUDIO_MAX_SECONDS (4 * 3600)   // default cap on duration (4 h: 230.4 M samples at 16 kHz)
#define NM_AUDIO_MAX_BUFFER_BYTES (1ull << 30) // stdin / pipes are read whole, up to 1 GiB

// Mono float PCM. pcm is owned: release with nm_audio_free.
typedef struct nm_audio {
    float *pcm;   // (n,) samples
    int64_t n;    // samples (= frames: mono)
    int32_t rate; // Hz
} nm_audio;

// Raw (headerless) PCM sample formats, little-endian, channels interleaved.
typedef enum nm_pcm_format {
    NM_PCM_S16LE = 1, // int16, v / 32768
    NM_PCM_F32LE = 2, // IEEE float32, as is
} nm_pcm_format;

// ---- reading ------------------------------------------------------------------------
//
// target_rate: the output rate (NM_AUDIO_MIN_RATE..NM_AUDIO_MAX_RATE), or <= 0
// to keep the input's own rate. On success *out owns a new buffer of n >= 1
// samples; on failure *out is {NULL, 0, 0} and err says why (see above).

// Decodes a whole audio file held in memory (any container libsndfile opens;
// it is read through sf_open_virtual, no temporary file). data is only read
// during the call.
nm_status nm_audio_decode(const void *data, size_t n, int32_t target_rate, nm_audio *out, char *err,
                          size_t err_size);

// Reads and decodes a file. A regular file is streamed by libsndfile; "-"
// (stdin), a pipe or another non-seekable file is first read whole (up to
// NM_AUDIO_MAX_BUFFER_BYTES), then decoded as nm_audio_decode does.
nm_status nm_audio_load(const char *path, int32_t target_rate, nm_audio *out, char *err, size_t err_size);

// As nm_audio_load, decoding (and resampling to target_rate, which is
// required) straight into dst, e.g. a TABM slot, so the samples are written
// once where their reader reads them: *n samples. NM_ERR_RANGE when the audio
// needs more than cap samples.
nm_status nm_audio_load_into(const char *path, int32_t target_rate, float *dst, int64_t cap, int64_t *n, char *err,
                             size_t err_size);
// The most samples nm_audio_load_into can write for a regular file at
// target_rate, from its header (to size a buffer first). NM_ERR_UNSUPPORTED
// for stdin, a pipe, or a header without a length.
nm_status nm_audio_probe(const char *path, int32_t target_rate, int64_t *max_samples, char *err, size_t err_size);

// Raw PCM from a buffer: n bytes of interleaved frames of `channels` samples in
// fmt at `rate`. n must be a whole number of frames (>= 1); a partial frame is
// NM_ERR_FORMAT. rate / channels outside the limits are NM_ERR_INVALID_ARG.
nm_status nm_audio_from_raw(const void *data, size_t n, nm_pcm_format fmt, int32_t rate, int32_t channels,
                            int32_t target_rate, nm_audio *out, char *err, size_t err_size);
// Raw PCM from a path or "-" (stdin), streamed in chunks (no size cap beyond
// the duration limit). Same contract as nm_audio_from_raw.
nm_status nm_audio_load_raw(const char *path, nm_pcm_format fmt, int32_t rate, int32_t channels,
                            int32_t target_rate, nm_audio *out, char *err, size_t err_size);

// Resamples n mono samples from rate_in to rate_out (both within the limits;
// equal rates copy) with the settings above. *out is a new buffer of about
// n * rate_out / rate_in samples (soxr's count after flushing its filter,
// within one sample of that; exactly round(n * rate_out / rate_in) in all
// the cases tested). An input too short to give one sample, or NaN/inf, is
// NM_ERR_FORMAT.
nm_status nm_audio_resample(const float *in, int64_t n, int32_t rate_in, int32_t rate_out, nm_audio *out,
                            char *err, size_t err_size);

// Frees a->pcm and zeroes *a. NULL and an empty struct are no-ops.
void nm_audio_free(nm_audio *a);

// ---- microphone capture (ALSA) ------------------------------------------------------

// Called with each captured chunk (mono float at the capture rate, about
// 100 ms), borrowed for the call. Return true to stop capturing.
typedef bool (*nm_audio_capture_cb)(const float *pcm, int64_t n, void *user);

typedef struct nm_audio_capture_params {
    const char *device;      // ALSA PCM name ("default", "hw:1,0", "null", ...); NULL: "default"
    int32_t rate;            // capture rate, NM_AUDIO_MIN_RATE..NM_AUDIO_MAX_RATE (16000)
    nm_pcm_format format;    // what the device is asked for: NM_PCM_S16LE (default) or NM_PCM_F32LE;
                             // the output is float either way
    double seconds;          // stop after this long; <= 0: only on_chunk stops it (then it must be
                             // set), still capped at NM_AUDIO_MAX_SECONDS
    nm_audio_capture_cb on_chunk; // optional, see above
    void *user;              // passed to on_chunk
    bool stream;             // the samples go to on_chunk only (which must be set): *out stays empty,
                             // so a capture may run for hours (seconds <= 0: until on_chunk stops it)
} nm_audio_capture_params;

// device "default", 16 kHz, s16, 5 seconds, no callback.
nm_audio_capture_params nm_audio_capture_default_params(void);

// True when the library was built with ALSA (NM_HAVE_ALSA).
bool nm_audio_capture_available(void);

// Records from an ALSA capture device into *out (mono float at p->rate; a
// device that will not give mono is opened in stereo and averaged). Blocks
// until `seconds` have been captured or on_chunk returns true. Without ALSA:
// NM_ERR_UNSUPPORTED. No such device, or one that refuses the format / rate:
// NM_ERR_IO with ALSA's reason. ALSA's own stderr chatter is silenced while
// the device is opened (a process-wide ALSA setting, restored afterwards).
nm_status nm_audio_capture(const nm_audio_capture_params *p, nm_audio *out, char *err, size_t err_size);

// Playback through ALSA: 16-bit mono at a rate, written as it comes (e.g. the
// TTS brick's slots, in place). Without ALSA: NM_ERR_UNSUPPORTED.
typedef struct nm_audio_player nm_audio_player;
// device: an ALSA PCM name ("default", "hw:0,0", "null"; NULL: "default").
// No such device, or one that refuses mono s16 at `rate`: NM_ERR_IO with ALSA's reason.
nm_status nm_audio_player_open(const char *device, int32_t rate, nm_audio_player **out, char *err,
                               size_t err_size);
// Queues n samples; blocks while the device's buffer is full (so a writer
// goes at the speed of playback). An underrun is recovered from.
nm_status nm_audio_player_write(nm_audio_player *p, const int16_t *pcm, int64_t n, char *err, size_t err_size);
// Waits until everything written has been played.
nm_status nm_audio_player_drain(nm_audio_player *p, char *err, size_t err_size);
void nm_audio_player_close(nm_audio_player *p); // NULL: a no-op

// ---- utterances: where speech starts and ends --------------------------------------
// Cuts a stream of mono samples into utterances (speech between silences),
// as a microphone's questions: an energy detector. A frame is speech when its
// level is threshold_db over the noise floor (the quietest recent frames: the
// floor follows a quieter frame at once and a louder room at 5 dB a second)
// and above min_level_dbfs; an utterance starts after start_frames speech
// frames in a row (with pre_ms of audio before them) and ends after
// end_silence_ms without speech (keeping post_ms of it), or at max_ms.
typedef struct nm_vad_params {
    int32_t rate;           // Hz (16000)
    int32_t frame_ms;       // 20
    float threshold_db;     // 12
    float min_level_dbfs;   // -50
    int32_t start_frames;   // 3
    int32_t end_silence_ms; // 800
    int32_t pre_ms;         // 300
    int32_t post_ms;        // 200
    int32_t max_ms;         // 30000 (Whisper's window)
} nm_vad_params;
nm_vad_params nm_vad_default_params(void);

typedef struct nm_vad nm_vad;
// An utterance: n samples (borrowed for the call) starting at sample t0 of the stream.
typedef void (*nm_vad_fn)(void *user, const float *pcm, int64_t n, int64_t t0);
// NM_ERR_INVALID_ARG (err says which) for a parameter out of range.
nm_status nm_vad_create(const nm_vad_params *p, nm_vad **out, char *err, size_t err_size);
void nm_vad_free(nm_vad *v);
// Feeds n samples: fn is called for each utterance that ends in them.
void nm_vad_push(nm_vad *v, const float *pcm, int64_t n, nm_vad_fn fn, void *user);
// The stream's end: an utterance still open ends here.
void nm_vad_flush(nm_vad *v, nm_vad_fn fn, void *user);
// Samples fed so far, and whether an utterance is open now.
int64_t nm_vad_position(const nm_vad *v);
bool nm_vad_in_speech(const nm_vad *v);

// ---- writing ------------------------------------------------------------------------

// The canonical 44-byte header of a 16-bit PCM WAV file (RIFF/WAVE,
// WAVE_FORMAT_PCM) whose data chunk holds data_bytes (<= 4 GiB - 37).
#define NM_WAV_HEADER_BYTES 44
void nm_audio_wav_header(uint8_t h[NM_WAV_HEADER_BYTES], uint32_t data_bytes, int32_t rate, int32_t channels);

// Writes n_frames frames of `channels` interleaved floats (pcm holds
// n_frames * channels values) as a 16-bit PCM WAV file (that header). path "-"
// writes to stdout; an existing file is replaced only once the new one is
// complete, a device or FIFO is written in place (core/outfile.h). Samples are clamped to
// the 16-bit range (see the top of this file); NaN/inf are NM_ERR_INVALID_ARG;
// a data chunk over 4 GiB is NM_ERR_RANGE; n_frames 0 writes a valid empty file.
nm_status nm_audio_write_wav(const char *path, const float *pcm, int64_t n_frames, int32_t rate,
                             int32_t channels, char *err, size_t err_size);

// A streamed encoder of 16-bit mono PCM into a compressed file's bytes,
// handed to a sink as they are made (an answer sent while it is spoken):
// FLAC (lossless), MP3 (LAME) and Opus in Ogg, through libsndfile. A
// stream's encoder cannot seek back, so a FLAC stream's header has no length
// (readers take it as unknown), as with any streamed FLAC.
typedef enum nm_audio_container {
    NM_AUDIO_FLAC = 1,
    NM_AUDIO_MP3 = 2,
    NM_AUDIO_OPUS = 3, // 8, 12, 16, 24 or 48 kHz only (Opus's rates)
} nm_audio_container;
// "flac", "mp3", "opus" (also "ogg"); false for another name.
bool nm_audio_container_parse(const char *name, nm_audio_container *out);
const char *nm_audio_container_name(nm_audio_container c);  // "flac", "mp3", "opus"; "?" for another value
const char *nm_audio_container_mime(nm_audio_container c);  // "audio/flac", "audio/mpeg", "audio/ogg"
// The encoder's bytes: n of them at `bytes` (borrowed during the call). false: stop (the client went).
typedef bool (*nm_audio_bytes_fn)(const void *bytes, size_t n, void *user);
typedef struct nm_audio_encoder nm_audio_encoder;
// An encoder of `rate` Hz mono (1..384000; Opus: its rates) into sink.
// NM_ERR_UNSUPPORTED when this build's libsndfile cannot write the
// container (err says which); *out freed with nm_audio_encoder_close.
nm_status nm_audio_encoder_open(nm_audio_container c, int32_t rate, nm_audio_bytes_fn sink, void *user,
                                nm_audio_encoder **out, char *err, size_t err_size);
// Encodes n samples (the encoder may hold some back until it has a frame).
// NM_ERR_IO when the sink said stop or the encoder failed (nm_audio_encoder_error).
nm_status nm_audio_encoder_write(nm_audio_encoder *e, const int16_t *pcm, int64_t n);
// Flushes what it holds into the sink and frees e. NM_ERR_IO as write. NULL: NM_OK.
nm_status nm_audio_encoder_close(nm_audio_encoder *e);
const char *nm_audio_encoder_error(const nm_audio_encoder *e); // "" if none

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
