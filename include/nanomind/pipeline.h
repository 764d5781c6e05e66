// nanomind's public API, part: the pipeline: bricks joined by rings, run as one assistant.
// Included by <nanomind.h> (its conventions, types and visibility apply): include that.
#ifndef NANOMIND_PIPELINE_H
#define NANOMIND_PIPELINE_H
#ifndef NANOMIND_H
#error "include <nanomind.h>, not its parts"
#endif

// ==== the pipeline ====================================================================
// Owner: src/sched/pipeline*.c (pipeline_impl.h names the parts). docs/pipeline.md has the graph and the threads.
//
// A pipeline is the bricks of one assistant joined by TABM rings:
//
//   audio -> STT --(transcript)--> LLM --(sentences)--> TTS -> speech
//                  image -> VISION --^
//
// any of them present (an LLM alone: a chat; STT alone: transcription; TTS
// alone: a voice; VISION alone: an image's embeddings, EMBD events). It loads the bricks, sizes the rings from their slot sizes,
// runs STT, LLM and TTS each on a lane (a thread of its own, on the cores its
// parameters name) and the vision encoder on the thread that writes the
// decoder's prompt, so that the image's embeddings go into the decoder's ring
// in order with the text around them. The caller submits requests and reads
// events. Payloads stay where they were written (audio decoded into the STT
// ring, image files read into the vision ring, embeddings written by the
// encoder into the decoder's ring, speech in the TTS ring until the caller has
// read it); text between bricks (a transcript into the chat turn, a sentence
// into the voice) is copied once, through the ledger, and so are the caller's
// buffers (pcm, image bytes, a voice's text); a prompt (a chat turn formatted
// by the model's template) is tokenized straight into the decoder's slot.
//
// Threading: nm_pipeline_submit, nm_pipeline_read and nm_pipeline_cancel may
// be called from any threads (read: one reader at a time); create and free
// from one.
typedef struct nm_pipeline nm_pipeline;
struct nm_pipeline_event; // (below: what read gives)

typedef enum nm_pipeline_mode {
    // Every brick serves the request it has: a request's answer is decoded and
    // spoken while the next one's audio is transcribed.
    NM_PIPELINE_PIPELINED = 0,
    // One request through the whole graph at a time: the next is taken once
    // the last one's speech (or answer) is done.
    NM_PIPELINE_SEQUENTIAL = 1,
    // As SEQUENTIAL, and no brick resident between requests (also a request
    // the power policy's critical state runs so, in either mode): each stage of a
    // request (STT; the vision brick with the LLM; TTS) loads its brick, runs
    // it on a thread of its own and releases it before the next stage loads
    // (a device short of memory: the battery policy's critical state). Only
    // the transcript and the answer's text are held between stages (the
    // answer's sentences are copied once more: held for the voice). The rings
    // stay (their pages are what the largest request wrote in them).
    // nm_pipeline_brick gives a brick only while its stage runs. The bricks'
    // parameters (and what they point to) are borrowed for the pipeline's life.
    NM_PIPELINE_CASCADE = 2,
} nm_pipeline_mode;

typedef struct nm_pipeline_params {
    // The bricks' parameters (kind set by the pipeline), NULL: not in the graph. The structs are
    // borrowed for the call (CASCADE: for the pipeline's life); what they point to that a brick keeps
    // (llm_model, the stop strings, a voice's name: bricks.h says which) for the pipeline's life;
    // the pipeline loads the bricks and frees them. VISION feeds the LLM, or is alone; the LLM brick's output kind is
    // the pipeline's (sentences with TTS, else text pieces) and its ledger the pipeline's. With its
    // n_parallel > 1 the decoder serves that many requests together (continuous batching, each on a
    // sequence of its own: PIPELINED mode without keep_history; a request's prompt goes into the
    // decoder's ring once fewer than n_parallel + 1 requests are in it; each request's DONE comes at
    // its own end; the decoder's counters (nm_pipeline_brick_stats) follow when the step that decoded
    // it with the others ends: settled at NM_ERR_SHUTDOWN).
    const nm_brick_params *stt, *vision, *llm, *tts;
    nm_pipeline_mode mode;
    // The decoder's prompt. chat: a request's text (or transcript) is a user turn formatted with the
    // model's chat template (chat_template: a built-in one named instead; jinja: rendered by the Jinja
    // interpreter from jinja_template, len bytes, or from the model's own when NULL, falling back to
    // the built-in formatter where it is beyond the subset), after system_prompt (NULL: none).
    // Not chat: the text is the prompt as is (images where its markers are, or before it).
    bool chat;
    const char *system_prompt;
    const char *chat_template;
    bool jinja;
    const char *jinja_template;
    size_t jinja_len;
    const char *jinja_name;  // what messages call jinja_template (its file); NULL: "the Jinja template"
    // jinja: more variables of the template, a JSON object's text (nm_chat_format_jinja's kwargs:
    // {"enable_thinking": false}); NULL: none. Without jinja, or not such an object: refused at create.
    const char *chat_template_kwargs;
    // chat: each request's turn follows the earlier turns and answers (a conversation, llama.cpp's
    // conversation mode; an answer cancelled joins as far as it went); false: each request is a
    // conversation of its own. When the conversation and room for an answer (the LLM's n_predict, or a
    // quarter of the context) outgrow the context, its oldest turns after the system prompt are dropped,
    // as llama.cpp's chat does, and a NOTE says so.
    bool keep_history;
    nm_ledger *ledger;       // borrowed, may be NULL: the pipeline's own (nm_pipeline_ledger)
    int32_t max_audio_s;     // the most seconds of audio a request may bring (STT ring slots); <= 0: 60
    int32_t queue;           // requests submitted and not yet taken before submit waits; <= 0: 8
    // Listening (nm_pipeline_hear): the cutter of the heard stream into questions (vad.rate 0:
    // nm_vad_default_params(); the rate must be 16000), and barge_in: speech that starts while
    // requests are in flight cancels them (a new question interrupts the answer being spoken).
    nm_vad_params vad;
    bool barge_in;
    // The images each heard question brings (a camera: its newest frame when the question's turn comes),
    // borrowed for the pipeline's life; n_heard_images 0: none. They need VISION.
    const struct nm_pipeline_image *heard_images;
    int32_t n_heard_images;
    // Power (docs/power.md): with a battery (borrowed for the pipeline's life; NULL: no policy), before
    // taking each request the pipeline reads it (a trace at its first time plus the pipeline's age (from the
    // end of create) times
    // battery_speed, <= 0: 1) and steps the policy (`power`, NULL: nm_power_default_params(); its
    // n_threads 0: the LLM brick's, or every core): a POWER event says what it set when that changed.
    // It runs the request as the cascade in the critical state (its bricks freed first, loaded again for
    // the next request that is not); loads the bricks again, with the graph idle, when the policy's
    // threads change (each brick made with them); paces the decoder to the policy's share of its speed
    // (measured from the answers so far, or power->decode_tps); and applies the DVFS caps to `dvfs`
    // (borrowed, may be NULL; a failure is a NOTE, once). The frame rate is the caller's (POWER's fps).
    nm_battery *battery;
    const nm_power_params *power;
    double battery_speed;
    nm_power_actuators *dvfs;
    // Gates (what wakes the assistant): a request they stop is not answered: its DONE comes with NM_OK,
    // `skipped` and text saying why, and nothing after the gate runs for it (in the cascade, no brick
    // after it is loaded). wake_words (copied at create): a spoken request is answered only if its
    // transcript starts with one of these words or phrases (comma-separated; case, blanks and
    // punctuation ignored; at most 16 of at most 62 bytes), the word taken off the question; NULL: every
    // one. Typed requests pass. frame_change: a request with images is answered only if its first image
    // differs from the first image of the last request that passed this gate by more than this
    // (nm_frame_difference: 0 .. 255, so below 255; an image that cannot be read passes, for the vision
    // brick to say why); 0: every one.
    const char *wake_words;
    float frame_change;
    // Events pushed, not read: with on_event set, a thread of the pipeline calls it with each event, in
    // nm_pipeline_read's order (the event and what it borrows valid for the call), user passed back;
    // nm_pipeline_read is refused (NM_ERR_INVALID_ARG), and nm_pipeline_close returns once the last
    // event has been given (where read would give NM_ERR_SHUTDOWN). The callback may submit, cancel and
    // hear; not free. NULL: the caller reads.
    void (*on_event)(const struct nm_pipeline_event *ev, void *user);
    void *on_event_user;
} nm_pipeline_params;

nm_pipeline_params nm_pipeline_default_params(void);

// Loads the bricks and starts the lanes. On failure *out is NULL and err
// names the brick and the cause ("llm: ...", "vision: ...": the brick's own
// message after its kind; "chat template: ..." for a template that fails a
// conversation of one turn).
nm_status nm_pipeline_create(const nm_pipeline_params *p, nm_pipeline **out, char *err, size_t err_size);
// Ends every request (cancelled), stops the lanes and frees the bricks, the
// rings and the events not read. NULL: a no-op.
void nm_pipeline_free(nm_pipeline *p);

// An image of a request: a file, a file's bytes, or a camera's newest frame.
typedef struct nm_pipeline_image {
    const char *path;            // an image file (PNG, JPEG, PPM), copied at submit
    const void *bytes;           // or its bytes (n_bytes), borrowed until the request's DONE has been read:
    size_t n_bytes;              // copied into the vision ring once, when its turn comes (counted caller -> vision)
    // or a camera, started (nm_camera_start on a ring of the caller's) and borrowed until the request's
    // DONE has been read: the frame is its newest when the image's turn comes (at the frame_change gate,
    // where there is one), captured into the camera's slot and encoded there (nothing copied). The
    // pipeline is the camera's one capturing thread meanwhile. A camera that gives no frame within 5 s
    // (or is gone) fails the request (DONE NM_ERR_IO / NM_ERR_TIMEOUT, text naming the camera).
    nm_camera *camera;
} nm_pipeline_image;
#define NM_PIPELINE_MAX_IMAGES 16 // images a request may bring
#define NM_PIPELINE_MEDIA_MARKER "<__media__>" // where an image goes in a text (llama.cpp's mtmd marker)

// One request. Give audio (pcm or audio_path: needs STT) or text, and with
// VISION images (a vision brick alone: images only). Strings and pcm are borrowed for the call only (audio is
// decoded or copied into the STT ring before submit returns); image bytes
// until the request's DONE has been read.
typedef struct nm_pipeline_input {
    const char *text;            // the question or prompt; NULL with audio: the transcript is
    const float *pcm;            // 16 kHz mono samples (n_samples), copied into the STT ring (counted caller -> stt)
    int64_t n_samples;
    const char *audio_path;      // or an audio file (WAV, FLAC, MP3, OGG), decoded into the STT ring
    // Images for the vision brick, n_images (at most NM_PIPELINE_MAX_IMAGES) of them: each goes where
    // the text (or the chat turn) has a NM_PIPELINE_MEDIA_MARKER, one marker an image, or all of them
    // before the text where it has none (a transcript: before it). Without images a marker is text.
    const nm_pipeline_image *images;
    int32_t n_images;
    // The bricks' parameters for this request only (JSON objects, as their PARAMS slots: docs/bricks.md);
    // NULL: none. vision_params go before each image of a file or bytes (not a camera's frame: refused).
    const char *llm_params, *stt_params, *tts_params, *vision_params;
    bool silent;                 // with TTS: the answer is not spoken
} nm_pipeline_input;

// Queues a request; *id (may be NULL) its id, from 1 up. Waits while `queue`
// requests wait for their turn. NM_ERR_INVALID_ARG (err says why) for an input
// the graph cannot take (audio without STT, an image without VISION, nothing
// to ask); the audio's errors (NM_ERR_IO, NM_ERR_FORMAT, NM_ERR_RANGE: longer
// than max_audio_s) name the file. NM_ERR_SHUTDOWN after nm_pipeline_close.
nm_status nm_pipeline_submit(nm_pipeline *p, const nm_pipeline_input *in, uint64_t *id, char *err, size_t err_size);

typedef enum nm_pipeline_event_kind {
    NM_PIPELINE_TRANSCRIPT = 1, // a segment the STT brick heard: text (its leading blank kept; maybe none), t0, t1
    NM_PIPELINE_TEXT = 2,       // a piece of the answer: text (a sentence where the pipeline has a voice)
    NM_PIPELINE_AUDIO = 3,      // the answer's speech: pcm, n_samples at sample_rate (mono s16)
    NM_PIPELINE_DONE = 4,       // the request has ended: status, stop, text (an error's message), timings
    NM_PIPELINE_NOTE = 5,       // a remark for the request's user: text (the oldest turns dropped to fit the
                                // context; a Jinja template beyond the subset, formatted by a built-in one)
    NM_PIPELINE_BARGE_IN = 6,   // speech began in the heard stream (nm_pipeline_hear) while requests were in
                                // flight: each is cancelled (no AUDIO of it follows; its DONE says cancelled),
                                // request the newest of them; t0: where the speech began, t1: where it was
                                // known (10 ms units of the heard stream). Stop a speaker playing them now.
    NM_PIPELINE_POWER = 7,      // the power policy's targets changed (params.battery), from `request` on:
                                // power, battery_pct, and text a line saying them
    NM_PIPELINE_ASKED = 8,      // a spoken request's question as the decoder (or the voice) gets it, once past
                                // the gates: text (the transcript without its leading blank and wake word)
    NM_PIPELINE_EMBD = 9,       // a vision brick alone (no LLM): an encoder run's embeddings of the request's
                                // images, in order (a tiled image: a run a tile and its overview): embd, n_rows
                                // rows of n_embd floats (a grid, qwen2vl_merger: grid[0] x grid[1] cells, row
                                // by row), in the pipeline's ring, borrowed until the next read
} nm_pipeline_event_kind;

// Seconds from the request's submit (but `submitted`): 0 where the stage did not run.
typedef struct nm_pipeline_timings {
    double submitted;    // the request's submit, in seconds from the end of the pipeline's create
    double started;      // its turn came: the pipeline took it from the queue (the earlier ones done where the
                         // mode waits for them)
    double heard;        // the transcript is whole
    double first_text;   // the answer's first piece (a vision brick alone: its first embeddings)
    double answered;     // the answer's end (a vision brick alone: its last embeddings)
    double first_audio;  // its first speech
    double spoken;       // its speech's end
    int64_t n_samples;   // speech samples
} nm_pipeline_timings;

typedef struct nm_pipeline_event {
    nm_pipeline_event_kind kind;
    uint64_t request;
    const char *text;     // TRANSCRIPT, TEXT, NOTE, DONE: UTF-8, NUL-terminated; borrowed until the next read
    size_t len;
    int64_t t0, t1;       // TRANSCRIPT: 10 ms units of the request's audio; BARGE_IN: of the heard stream
    const int16_t *pcm;   // AUDIO: the samples in the TTS ring's slot, borrowed until the next read
    int64_t n_samples;
    int32_t sample_rate;
    // DONE: NM_OK; NM_ERR_CANCELLED; or the failure (text says which brick and why: a bad image, an
    // audio file without speech, a prompt that does not fit ...)
    nm_status status;
    nm_llm_stop stop;     // DONE: why the answer ended (NM_LLM_STOP_NONE without a decoder)
    nm_pipeline_timings t; // DONE
    nm_power_targets power; // POWER: what the policy set (the cascade, threads, the decoder's pace, fps, DVFS share)
    double battery_pct;   // POWER: the charge it stepped on
    // DONE: skipped: a gate stopped it (params.wake_words, frame_change), status NM_OK, text why ("no wake
    // word", "frame unchanged (difference 1.00 <= 4.00)"); cascade: it ran as the cascade; n_prompt: prompt
    // positions the decoder decoded for it (tokens and image rows; not those its cache reused), n_cached:
    // its prompt's tokens the decoder's cache already held (reused; the prompt is n_prompt + n_cached),
    // n_tokens: tokens it generated
    bool skipped, cascade;
    int32_t n_prompt, n_tokens, n_cached;
    const float *embd;    // EMBD
    int64_t n_rows;
    int32_t n_embd, grid[2];
} nm_pipeline_event;

// The next event, in the order the pipeline made them (a request's events in
// their order: its transcript, the question asked, then its answer's pieces, its speech among
// them as it is made, its DONE last). timeout_ns as nm_tabm's (< 0: forever):
// NM_ERR_TIMEOUT (NM_ERR_AGAIN for 0) if none came; NM_ERR_SHUTDOWN once the
// pipeline is closed, every event has been read and every lane has ended its
// last step (the bricks' counters settled: a batching decoder's DONE comes at
// its request's end, before the step that decoded it with others ends).
// Releases what the previous event borrowed.
nm_status nm_pipeline_read(nm_pipeline *p, int64_t timeout_ns, nm_pipeline_event *ev);
// Stops a request wherever it is (transcribing, decoding, speaking: barge-in):
// its DONE comes with NM_ERR_CANCELLED, and no AUDIO of it after this call (its
// speech not yet read is dropped). NM_ERR_RANGE for an id that was never
// given; a request already done is left as it is (NM_OK).
nm_status nm_pipeline_cancel(nm_pipeline *p, uint64_t request);
// Live audio (16 kHz mono, as a microphone's capture gives it: n samples,
// borrowed for the call; a chunk of any length), cut into questions by the
// pipeline's VAD (params.vad): each utterance is a request of its own, its
// audio copied into the STT ring (as submit's pcm; counted caller -> stt). With
// params.barge_in, speech starting while requests are in flight cancels them
// here, before this call returns (a BARGE_IN event). pcm NULL or n 0: the
// stream's end (an utterance still open is asked). Needs STT; one thread at a
// time (e.g. nm_audio_capture's on_chunk). Errors: submit's, for an utterance
// (err says which); the stream goes on.
nm_status nm_pipeline_hear(nm_pipeline *p, const float *pcm, int64_t n, char *err, size_t err_size);
// No more requests: those submitted are served, then nm_pipeline_read gives
// NM_ERR_SHUTDOWN. With params.on_event: returns once it has been given the
// last event (called from the callback: marks the pipeline closed only).
void nm_pipeline_close(nm_pipeline *p);

// The graph's brick of a kind (NULL: none in it; none loaded now: the
// cascade), borrowed: for what each kind offers beside the rings
// (nm_brick_llm_model, nm_brick_stt_transcript of the last request). With a
// battery, only until the next request is taken (the policy may load the
// bricks again). Not for nm_brick_step or nm_brick_set_params: its lane runs it.
nm_brick *nm_pipeline_brick(const nm_pipeline *p, nm_brick_kind kind);
// What a brick kind did in the pipeline, summed over every brick of it the
// pipeline has loaded (the cascade loads one a request; the power policy
// loads them again when it changes their threads), as of the last request
// each served.
typedef struct nm_pipeline_brick_report {
    nm_brick_stats s;          // the bricks' counters, summed
    char name[24], device[24]; // nm_brick_name and nm_brick_device of the last one loaded
    int32_t n_loads;           // bricks of the kind loaded so far
    double thread_s;           // busy seconds times the threads each brick ran with (1 for the voice)
    double dram_bytes;         // the DRAM traffic of the requests served, by the brick's estimate for each
                               // request's size (nm_brick_estimate: weights streamed and activations)
    double stage_peak_mib;     // CASCADE: the process's peak RSS while a stage of this kind ran (its brick
                               // loaded, run and released; the decoder's with the vision brick), the largest;
                               // 0: none ran. The pipeline resets the process's VmHWM at each stage
                               // (/proc/self/clear_refs) to measure it.
} nm_pipeline_brick_report;
// NM_ERR_RANGE (zeros) for a kind not in the graph.
nm_status nm_pipeline_brick_stats(const nm_pipeline *p, nm_brick_kind kind, nm_pipeline_brick_report *out);
nm_ledger *nm_pipeline_ledger(const nm_pipeline *p);

#endif
