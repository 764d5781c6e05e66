// nanomind's public API, part: the bricks: one interface for speech-to-text, vision, the decoder, text-to-speech; the camera.
// Included by <nanomind.h> (its conventions, types and visibility apply): include that.
#ifndef NANOMIND_BRICKS_H
#define NANOMIND_BRICKS_H
#ifndef NANOMIND_H
#error "include <nanomind.h>, not its parts"
#endif

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
//   LLM     NM_TABM_TOKENS / NM_TABM_EMBD_F32 / NM_TABM_TOKENS, the sampled tokens (TOKENS), or
//           NM_TABM_TEXT (TOKENS, EMBD, TEXT):   their text: pieces or sentences (TEXT; nm_llm_params.out)
//           a prompt
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
//          beam search), best_of, no_timestamps, token_timestamps, prompt (text of at most
//          NM_STT_MAX_PROMPT bytes, as whisper-cli --prompt), carry_initial_prompt
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
//          generation stopped in NM_LLM_STOP_OF(user), and the request's counts:
//          meta->shape[1] its prompt's rows decoded, shape[2] the tokens it
//          generated (written out), shape[3] its prompt's tokens the cache
//          already held (reused, not decoded). The end-of-generation
//          token itself is not written. A TEXT slot is a part of the prompt as text
//          (a formatted chat turn, or plain text): the brick tokenizes it into
//          its own slot in place (the slot becomes a TOKENS slot of the same
//          request; special tokens written as text, e.g. "<|im_start|>", are
//          parsed; BOS is added where the slot starts at position 0); text
//          whose tokens would not fit the slot or the context, or none, fails
//          the request. With n_parallel > 1 (continuous
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

typedef enum nm_llm_out {
    NM_LLM_OUT_TOKENS = 0,
    NM_LLM_OUT_TEXT = 1,
    NM_LLM_OUT_SENTENCES = 2,
} nm_llm_out;

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
    // What the output slots carry: NM_LLM_OUT_TOKENS (token ids, out_batch a slot), NM_LLM_OUT_TEXT (the
    // tokens' text, UTF-8 whole: each slot the text of up to out_batch tokens), NM_LLM_OUT_SENTENCES (text
    // cut for a voice: a slot ends before a blank that follows a sentence's end (. ! ?), after a line's end,
    // or where the slot is full; the TTS brick speaks each slot in turn; an answer that opens with a
    // <think> block, as Qwen3's and SmolLM3's do, has it left out: the reasoning is not spoken, up to
    // </think> or, never closed, to the end). Text slots are NM_TABM_TEXT of
    // nm_brick_out_slot_bytes (4 KiB); a request's last slot holds what text is left (maybe none). Set at
    // load; NM_LLM_OUT_SENTENCES with n_parallel 1 (a request holds its slot across passes).
    nm_llm_out out;
    // The most tokens a second the request generates (0: as fast as it can): a generation pass waits
    // until the next token of a request in it is due (the first token plus n / max_tps seconds), each
    // request at its own pace, a pass with prompt rows or an unpaced request never (the power policy's
    // decode share: the decoder idles between tokens). PARAMS: "max_tps".
    float max_tps;
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

#define NM_STT_MAX_PROMPT 16384 // bytes of a request's prompt text (its last tokens are used)
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
    const char *engine;   // NULL or "espeak-ng" (formant voices), or "piper" (neural: a Piper voice, docs/piper.md)
    const char *voice;    // engine voice: espeak-ng language or voice name, e.g. "en-us", "en", "de",
                          // "en+f3" (a variant); NULL: "en-us". Piper: a voice GGUF (tools/convert_piper.py),
                          // or the name of one in the model folder ("en_US-joe-medium": piper-NAME.gguf);
                          // NULL: en_US-joe-medium
    int32_t rate_wpm;     // speaking rate, words per minute, 80..450, default 175 (Piper: the voice's
                          // length scale times 175 / rate_wpm)
    int32_t pitch;        // 0..100, default 50 (espeak-ng's base pitch; Piper: 50 only)
    int32_t volume;       // 0..200, default 100 (espeak-ng's amplitude, in percent; Piper: of each sentence
                          // normalized to its peak, as piper-tts)
    // Piper's scales (< 0: the voice's own, from its config; nm_tts_default_params sets -1): length_scale
    // 0.05..20 (larger: slower), noise_scale 0..5 (the prior's noise), noise_w 0..5 (the durations' noise;
    // both 0: the same samples for the same text whatever the seed).
    float length_scale, noise_scale, noise_w;
    int32_t n_threads;    // Piper: the synthesis's threads (<= 0: the TTS brick's n_threads, else every core)
    int32_t stream_ms;    // Piper: > 0: a sentence longer than about this (and the decoder's reach twice) has its
                          // first stream_ms of speech made and sent first, the rest after (the same samples; the
                          // peak that scales the sentence is its first part's: the rest clipped where louder);
                          // 0: each sentence whole, scaled by its own peak as piper-tts. 0 .. 60000.
    int32_t sample_rate;  // output rate in Hz; 0: the engine's native rate (espeak-ng 22050), else 8000..192000
    const char *data_dir; // espeak-ng-data directory (or a directory holding one); NULL: espeak-ng's
                          // own search (ESPEAK_DATA_PATH, then the installed data)
    const char *device;   // Piper: where HiFi-GAN runs: NULL or "cpu", "opencl", "opencl:N", "opencl:auto"
                          // (the TTS brick sets it from its own device); espeak-ng: NULL or "cpu" only
} nm_tts_params;

// engine NULL, voice NULL (the engine's own), 175 wpm, pitch 50, volume 100, the voice's scales, native rate,
// data_dir NULL.
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
                            // TTS: the same for a Piper voice (its HiFi-GAN; espeak-ng: the CPU only);
                            // STT: the CPU only
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
    // Prompts are decoded in chunks that end at multiples of n_ubatch positions (llama.cpp's -ub; <= 0: 128;
    // at most n_batch). A cached prompt prefix is reused up to such a boundary, within what was decoded as a
    // fresh prompt is (whole chunks, each alone in its pass, from position 0), so a reused prefix gives the
    // logits of decoding the prompt afresh, to the bit: the answer does not depend on cache_prompt.
    int32_t n_ubatch;
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
    // VISION, dynamic-resolution projectors (qwen2vl_merger): the image tokens an image is resized to
    // (llama.cpp's --image-min-tokens / --image-max-tokens); <= 0: the model's (8 and 4096). Larger
    // images are scaled down to at most image_max_tokens; smaller ones up to at least image_min_tokens,
    // rounding up, which may pass image_max_tokens as in llama.cpp (never the encoder's 4096). Each at
    // most 4096; with only image_max_tokens given, below the model's least, the least follows it.
    // Fixed-size projectors ignore both, as llama.cpp.
    int32_t image_min_tokens, image_max_tokens;
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

// For implementations, from run: the wait to give the rings (nm_tabm_acquire_*,
// nm_brick_put_end, ...) for the brick's timeout_ns: the same in a lane; in
// nm_brick_step, NM_TABM_WAIT_PEER for "forever", so a wait only the caller's
// own thread could end returns NM_ERR_AGAIN instead of hanging.
int64_t nm_brick_wait_ns(const nm_brick *self, int64_t timeout_ns);
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
// own thread (lane) or the caller's. A wait that no other thread can end
// (NM_TABM_WAIT_PEER: the caller wrote the request and reads the output
// after this returns) does not block: NM_ERR_AGAIN, and nm_brick_last_error
// names the ring (an output ring too small for the request, a request whose
// last slot never came); the request is not finished (what it wrote stays).
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
    int32_t token_eot;  // <|endoftext|>: the ids below it are text
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
    const char *projector;  // "mlp", "idefics3" or "qwen2vl_merger"
    int32_t image_size;     // one encoder input is image_size x image_size (qwen2vl_merger: any whole
                            // cells of patch_size * 2 pixels, image_size is the file's nominal size)
    int32_t patch_size, n_patches, n_layer, n_layer_run;
    int32_t n_out, n_out_embd; // embeddings one encoder run yields (qwen2vl_merger: at most), and their width
    int32_t min_tokens, max_tokens; // the image tokens an image is resized to (fixed-size projectors: n_out)
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
// info's slot_bytes, else NM_ERR_RANGE), holding slots for write as `producer`;
// ring NULL: a ring of the camera's own (NM_CAMERA_MAX_BUFFERS, the most it takes
// from a driver, and two more: a frame a reader holds and one compared), freed
// by nm_camera_close.
// USERPTR is tried first and MMAP taken when the driver refuses it.
nm_status nm_camera_start(nm_camera *c, nm_tabm *ring, uint32_t producer);
// The ring the camera was started on (NULL: not started, or c NULL).
nm_tabm *nm_camera_ring(const nm_camera *c);
// The newest frame, in a slot of the ring held for write: *slot's meta has
// kind IMAGE, its shape and size set (request and user 0); the caller
// publishes it (or cancels it). Older frames waiting in the driver are
// recycled (dropped), as is a frame taken more than two frame periods before
// the call (the camera went on while nobody asked: the next one is fresher);
// a frame taken since the call began is never passed over. Waits up to timeout_ns (< 0: forever) for a frame and, when
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

#endif
