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

#ifdef __cplusplus
extern "C" {
#endif

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
} nm_status;

// Static string naming the status; never NULL.
const char *nm_status_str(nm_status s);

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

// Runs the decoder on tokens[0..n) at positions pos..pos+n-1 (n <= n_batch,
// pos+n <= n_ctx). Cache entries at positions >= pos are overwritten.
// all_logits: keep the logits of every token; else only the last.
nm_status nm_decode(nm_ctx *c, const int32_t *tokens, int32_t n, int32_t pos, bool all_logits);
// Same with input embeddings (n rows of n_embd floats, borrowed for the call)
// instead of token ids: the vision brick feeds the decoder through this. The
// first layer reads the rows where they are (a slot in shared memory): they
// are never copied, and nothing writes to them.
nm_status nm_decode_embd(nm_ctx *c, const float *embd, int32_t n, int32_t pos, bool all_logits);
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
} nm_tabm_kind;

// A slot's header, in the ring's shared memory. The writer fills kind, ndim,
// shape, size (and sample_rate, user) between acquire_write and publish; the
// ring sets producer, seq and the timestamps. Readers must not modify it.
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
    uint64_t user;         // free for the producer (frame id, position, ...)
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
// Stops new writes and wakes every waiter (all processes). Idempotent.
void nm_tabm_shutdown(nm_tabm *r);
bool nm_tabm_is_shutdown(const nm_tabm *r);
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
    double seconds;         // since create
    double slots_per_s, bytes_per_s; // published / seconds
    // Wait time in acquire_write / acquire_read: bucket 0 no wait, bucket 1 a
    // wait under 1 us, bucket i >= 2 a wait in [2^(i-2), 2^(i-1)) us (the last: longer).
    uint64_t write_wait_hist[NM_TABM_HIST_BUCKETS];
    uint64_t read_wait_hist[NM_TABM_HIST_BUCKETS];
} nm_tabm_stats;
// Ring-wide (all processes). Counters are read one by one, not as a snapshot.
nm_tabm_stats nm_tabm_get_stats(const nm_tabm *r);

// ---- LLM brick on TABM rings ------------------------------------------------------------
// Owner: src/bricks/llm/brick.c; docs/tabm.md ("LLM brick") has the slot protocol.
// The decoder as a brick: prompts arrive as slots of an input ring and are
// decoded in place (the pointer given to nm_decode / nm_decode_embd is the
// slot's payload); sampled tokens leave as slots of an output ring.
//
// Input: a prompt is one or more slots, decoded at consecutive positions:
//   NM_TABM_TOKENS   int32 ids, ndim 1, shape [n], n >= 1
//   NM_TABM_EMBD_F32 floats, ndim 2, shape [n, n_embd of the model], n >= 1
//   meta->user: NM_LLM_IN_MORE set: more slots of this prompt follow (text,
//   image, text ...); clear: the slot ends the prompt and generation starts.
//   NM_LLM_IN_AT_POS set: the slot starts at position NM_LLM_IN_POS_OF(user)
//   (a new conversation: 0); clear: where the brick stands (after the last
//   slot or generated token). Leading tokens of a token slot that the cache
//   already holds at those positions are not decoded again (prefix reuse).
// Output: NM_TABM_TOKENS slots, ndim 1, up to out_batch tokens each (1: a slot
//   per token, as it is sampled). The last slot of each prompt's generation
//   has NM_LLM_OUT_END in meta->user and the reason in NM_LLM_OUT_STOP_OF(user);
//   it holds the tokens still pending (ndim 0, size 0 when there are none).
//   The end-of-generation token itself is not written.
// A malformed input slot (other kind, wrong n_embd, empty, past the context)
// is released, its prompt dropped (the rest of its slots skipped), the reason
// kept in nm_llm_brick_last_error, and an END slot with NM_LLM_STOP_BAD_INPUT
// is written; the brick goes on with the next prompt.
#define NM_LLM_IN_MORE 1u
#define NM_LLM_IN_AT_POS 2u
#define NM_LLM_IN_POS(pos) (((uint64_t)(uint32_t)(pos) << 32) | NM_LLM_IN_AT_POS)
#define NM_LLM_IN_POS_OF(user) ((int32_t)((user) >> 32))
#define NM_LLM_OUT_END 1u
#define NM_LLM_OUT_STOP_OF(user) ((nm_llm_stop)(((user) >> 8) & 0xff))

typedef enum nm_llm_stop {
    NM_LLM_STOP_NONE = 0,      // not an END slot
    NM_LLM_STOP_EOG = 1,       // the model sampled an end-of-generation token
    NM_LLM_STOP_N_PREDICT = 2, // n_predict tokens written
    NM_LLM_STOP_CTX_FULL = 3,  // the context has no room for another token
    NM_LLM_STOP_BAD_INPUT = 4, // a slot of the prompt was malformed (see last error)
    NM_LLM_STOP_ERROR = 5,     // a decode failed (see last error)
    NM_LLM_STOP_STRING = 6,    // the text reached a stop string
} nm_llm_stop;

typedef struct nm_llm_brick nm_llm_brick;

typedef struct nm_llm_brick_params {
    int32_t n_predict;  // tokens per prompt; < 0: until end of generation or a full context. Default 128
    int32_t out_batch;  // tokens per output slot (<= 1: one, streaming); the output ring's slots must hold them
    uint32_t producer;  // producer id of the output slots
    int64_t timeout_ns; // every wait on either ring (as in nm_tabm_*); default -1: forever
    const char *name;   // the brick's endpoint in the ledger; NULL: "llm"
    // Stop strings (llama.cpp's -r/--reverse-prompt): generation ends once the
    // text generated for the prompt contains one (the token that completes it
    // is written and decoded). Borrowed; at most NM_LLM_MAX_STOP of at most
    // NM_LLM_MAX_STOP_LEN bytes each.
    const char *const *stop;
    int32_t n_stop;
    bool ignore_eos;    // never sample an end-of-generation token (llama.cpp's --ignore-eos)
} nm_llm_brick_params;
#define NM_LLM_MAX_STOP 16
#define NM_LLM_MAX_STOP_LEN 256

nm_llm_brick_params nm_llm_brick_default_params(void);
// A brick over a context `c` made from `m`, sampling with `s`; all three and
// `ledger` (may be NULL) are borrowed and must outlive the brick, and are used
// by the brick's thread only while it runs. The brick copies nothing between
// rings; a copy it ever has to make goes through nm_ledger_copy on `ledger`.
nm_status nm_llm_brick_create(nm_model *m, nm_ctx *c, nm_sampler *s, const nm_llm_brick_params *p,
                              nm_ledger *ledger, nm_llm_brick **out, char *err, size_t err_size);
void nm_llm_brick_free(nm_llm_brick *b);
// Serves one prompt: reads its slots from `in`, decodes them, generates into
// `out`, and returns NM_OK once the END slot is published (also for a prompt
// dropped as malformed: see the END slot's reason). NM_ERR_SHUTDOWN when
// either ring is shut down (the input one once drained): then the brick shuts
// down the other ring too, so both neighbours wake and end. NM_ERR_TIMEOUT
// when a wait ran past timeout_ns (the prompt is abandoned).
nm_status nm_llm_brick_step(nm_llm_brick *b, nm_tabm *in, nm_tabm *out);
// Serves prompts until a ring shuts down (NM_ERR_SHUTDOWN) or a wait times out.
// Run it on the brick's own thread (lane).
nm_status nm_llm_brick_run(nm_llm_brick *b, nm_tabm *in, nm_tabm *out);
// Where the next slot without NM_LLM_IN_AT_POS starts.
int32_t nm_llm_brick_pos(const nm_llm_brick *b);
// "" if none. Any thread may read it, also while the brick runs (the text is
// the reader's copy, as nm_umem_last_error's); after the END slot it is the run's.
const char *nm_llm_brick_last_error(const nm_llm_brick *b);

typedef struct nm_llm_brick_stats {
    uint64_t n_prompts;         // prompts served (END slots written)
    uint64_t n_prompt_tokens;   // prompt positions decoded (tokens and embedding rows, not reused ones)
    uint64_t n_gen;             // tokens sampled and decoded
    uint64_t n_in_slots, n_out_slots, n_bad_slots;
    double t_prompt, t_gen;     // seconds decoding prompts / generating (sampling, decoding, writing)
} nm_llm_brick_stats;
// Cumulative. Read it while the brick is idle, like the last error.
nm_llm_brick_stats nm_llm_brick_get_stats(const nm_llm_brick *b);

// ---- TTS brick output on TABM rings ---------------------------------------------------
// Owner: src/bricks/tts/ (tts.h); docs/tts.md has the protocol. The
// text-to-speech brick writes NM_TABM_PCM_S16 slots (ndim 2, shape
// [n_frames, 1], sample_rate set). The last slot of an utterance has
// NM_TTS_OUT_END in meta->user; NM_TTS_OUT_ERROR beside it: the utterance was
// cut short by an error (the slot holds what was synthesized, maybe nothing:
// ndim 0, size 0).
#define NM_TTS_OUT_END 1u
#define NM_TTS_OUT_ERROR 2u
// ==== end of zero-copy plumbing =============================================================

#ifdef __cplusplus
}
#endif
#endif
