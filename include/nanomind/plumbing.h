// nanomind's public API, part: the zero-copy plumbing: umem pool, copy ledger, TABM ring.
// Included by <nanomind.h> (its conventions, types and visibility apply): include that.
#ifndef NANOMIND_PLUMBING_H
#define NANOMIND_PLUMBING_H
#ifndef NANOMIND_H
#error "include <nanomind.h>, not its parts"
#endif

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
    NM_TABM_EMBD_F32 = 2, // float embeddings, shape [n_tokens, n_embd]; an image's grid (Qwen2-VL, whose decoder
                          // places its tokens by row and column): ndim 3, [rows, columns, n_embd], row-major
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
// zeroes the rest). Readers must not modify it (but for a reader that rewrites a
// slot it holds into another payload of the same request for itself: the LLM
// brick's TEXT -> TOKENS).
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
// NM_TABM_WAIT_PEER: wait forever if the other side is another thread (of this or another process): the
// thread that last asked to read the ring (for acquire_write) or to write it (for acquire_read). If that
// thread is the caller, NM_ERR_AGAIN at once: it would wait for itself forever (nm_brick_step on a thread
// that reads the output afterwards). If none has asked yet, wait up to 1 s for one (a lane just started),
// then NM_ERR_AGAIN.
#define NM_TABM_WAIT_PEER (-2)
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

#endif
