// The pipeline's parts (include/nanomind/pipeline.h is its public face,
// docs/pipeline.md the picture): the records every part shares and what each
// part offers the others. Private to src/sched/pipeline*.c.
//
//   pipeline.c         the public calls: create, free, submit, read, cancel,
//                      close; the events and a request's end
//   pipeline_feed.c    the feed thread: takes the requests in order, reads
//                      each transcript, writes the decoder's prompt (chat
//                      turn, images through the vision brick) or the voice's
//                      text, and runs a request as the cascade
//   pipeline_lanes.c   the bricks loaded, freed and made again; a lane per
//                      brick; the answers (or embeddings) and speech threads
//   pipeline_power.c   the power policy stepped before each request: the
//                      cascade, the bricks' threads, the decoder's pace
//   pipeline_listen.c  live audio cut into questions (VAD), barge-in
//   pipeline_gates.c   what wakes the assistant: the wake words, a frame
//                      that changed; a camera's frame captured
//
// Every wait is on a ring or on the pipeline's one lock; free shuts the
// rings down, which ends every wait, and joins the threads.
#ifndef NM_SCHED_PIPELINE_IMPL_H
#define NM_SCHED_PIPELINE_IMPL_H

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "core/fail.h"
#include "nanomind.h"

#define MEDIA_MARKER NM_PIPELINE_MEDIA_MARKER
#define TEXT_SLOT 4096             // a sentence for the voice
#define STT_IN_SLOTS 4             // a request's PARAMS and audio, and the next one's
#define LLM_IN_SLOTS 4             // a prompt's parts (parameters, text, image segment, text), for each request the
                                   // decoder may hold: its n_parallel and one more (send_prompt waits for room)
#define LANE_QUEUE 512             // requests a lane may be given and not yet have taken (> the decoder's 256
                                   // sequences and one more)
#define OUT_SLOTS 64
#define EMBD_SLOTS 4              // a vision brick alone: encoder runs' embeddings between it and their events

typedef struct pl_img {
    char *path;            // owned
    const void *bytes;     // the caller's, borrowed until the request's DONE
    size_t n_bytes;
    nm_camera *camera;     // the caller's, borrowed until the request's DONE
    nm_tabm_slot slot;     // the camera's frame, held for write in its ring (the frame_change gate took it) ...
    bool held;             // ... until the vision brick is given it (or the request ends first: cancelled)
} pl_img;

typedef struct pl_req {
    uint64_t id;
    double t_submit;
    char *text, *llm_params, *tts_params, *vision_params;
    pl_img img[NM_PIPELINE_MAX_IMAGES];
    int32_t n_images;
    bool audio, silent;
    // progress, under the lock
    bool cancelled;
    bool done;             // ended (its DONE due: status and err final) ...
    bool announced;        // ... and its DONE event made, once no lane has it (in_lanes 0)
    int32_t in_lanes;      // lanes given it that have not finished serving it
    bool answer_ended, speech_ended; // the decoder's request, the voice's request (DONE after both)
    bool fed, read;        // the feed thread is done with it (DONE waits for it); its DONE has been read: then
                           // it is freed
    char *said;            // CASCADE: the answer's sentences for the voice, each NUL-terminated
    size_t n_said, cap_said;
    nm_status status;      // a failure recorded before the request's last stage ends it
    nm_llm_stop stop;
    char err[512];
    char *turn;            // keep_history: the user's turn, joined to the history with its answer
    char *head;            // a spoken request's prompt up to its last image, sent while Whisper ran (the feed's)
    bool prompt_ended;     // its prompt's last slot is in the decoder's ring (or none will be: it ended)
    // the plan for it (the feed thread's, when it takes it; under the lock): the cascade (the pipeline's
    // mode, or the power policy's critical state), the bricks made again first (threads the policy
    // changed, or back from the cascade), the decoder's pace
    bool cascade, remake;
    int32_t threads;       // the bricks' threads for it (0: as their parameters say)
    double max_tps;        // 0: unpaced
    bool given[5];         // its first slot is in that brick's input ring: the lane was given it (by kind)
    bool llm_ended;        // a batching decoder (pl_lane.by_end): its last slot came (maybe before it was given) ...
    bool llm_served;       // ... and its lane's service is counted (once: at that slot, or at give() after it)
    nm_pipeline_timings t;
    bool skipped;          // a gate stopped it (the wake words, the frame that did not change)
    int32_t n_prompt, n_tokens, n_cached; // the decoder's rows decoded, tokens generated, prompt tokens its cache
                           // held (its last slot's counts)
    int64_t n_spoken_bytes; // text given to the voice for it (its estimate's size)
    struct pl_req *next;   // the queue of requests not yet taken
} pl_req;

typedef struct pl_event {
    nm_pipeline_event ev;
    char *text;            // owned, cap bytes (kept when the node is used again)
    size_t cap;
    nm_tabm_slot slot;     // AUDIO, EMBD: the TTS ring's or the embeddings ring's slot, released by the next read
    nm_tabm *ring;         // ... in this ring
    bool has_slot;
    struct pl_event *next;
} pl_event;

// A brick's lane: a thread that serves one request (nm_brick_step) each time
// the pipeline gives it one, with the brick loaded then (so that the bricks
// can be freed and loaded again between requests: the cascade, the power
// policy's threads). The vision brick's has no thread (the feed thread steps
// it): its counters only.
typedef struct pl_lane {
    struct nm_pipeline *P;
    nm_brick_kind kind;
    nm_tabm *in, *out;
    pthread_t th;
    bool started;
    // under the lock
    uint64_t given[LANE_QUEUE]; // the requests given (a slot of each in `in`), in order, that it has yet to take:
    int32_t head, n_given; // n_given of them from given[head] (at most what the ring's slots hold)
    int32_t n_open;        // requests given and not yet served (the decoder's room: send_prompt)
    int32_t ahead;         // requests a step took before they were given (a batching decoder's step takes every one
                           // that comes while it runs: its first slot may be read before give() records it)
    bool by_end;           // a batching decoder (n_parallel > 1): its step returns once every request it took has
                           // ended, so each request is served at its last output slot (the answers thread), not
                           // at the step's end; its counters are settled when the step ends
    bool busy;             // serving one
    nm_brick_stats base, cur; // the counters of the bricks it has freed, summed; of the one loaded now
    int32_t threads;       // the threads of the one loaded now
    // the report's sums (nm_pipeline_brick_report): thread_s of the bricks freed, the rest of all of them
    double thread_s, dram_bytes, stage_peak_mib;
    int32_t n_loads;
    char name[24], device[24];
} pl_lane;

struct nm_pipeline {
    nm_pipeline_params p;
    char *system_prompt, *chat_template, *jinja_template, *jinja_name, *chat_kwargs;
    char *note;            // said with the next request (NOTE): the chat template's fallback
    nm_brick *stt, *vision, *llm, *tts; // loaded (in CASCADE mode: only while a request's stage runs)
    nm_model *m;           // the LLM brick's, while it is loaded
    bool has[5];           // the graph's bricks, by nm_brick_kind
    nm_brick_params given[5]; // CASCADE: the bricks' parameters, loaded again for each request
    bool resident;         // the bricks are loaded (not between two cascade requests)
    int32_t threads_now;   // the threads they were loaded with (0: as their parameters say)
    nm_tabm *stt_in, *stt_out, *img, *llm_in, *llm_out, *tts_in, *tts_out;
    nm_tabm *embd;         // a vision brick alone: its output (EMBD events), read by the answers thread
    nm_ledger *ledger;
    bool own_ledger;
    int ep_caller, ep_stt, ep_vision, ep_llm, ep_tts; // the ledger's endpoints of the copies the pipeline makes
    pl_lane L[5];          // by nm_brick_kind
    // power (params.battery): the policy, stepped before each request is taken
    nm_power_params power;
    nm_power_policy pol;
    double t_create;
    nm_power_targets said; // the targets the last POWER event gave
    bool power_said, dvfs_said;
    pthread_t th_feed, th_answers, th_speech, th_deliver; // th_deliver: params.on_event's
    bool feed_started, answers_started, speech_started, deliver_started;
    bool deliver_joined;   // under lock: close or free has joined (or is joining) th_deliver
    bool joined;           // under lock: free has joined every thread but th_deliver
    int32_t tts_rate;
    int32_t n_predict;     // the decoder's, for the room an answer needs
    int32_t n_parallel;    // the decoder's sequences (requests it decodes together), >= 1
    // under lock
    pthread_mutex_t lock, submit_lock;
    pthread_cond_t cond;
    pl_req **reqs;         // by id - 1
    uint64_t n_reqs, cap_reqs, n_done, done_upto; // done_upto: requests 1..done_upto are all done
    pl_req *q_head, *q_tail;
    int32_t n_queued;
    bool closed, stopping;
    pl_event *ev_head, *ev_tail, *cur;
    pl_event *spare;       // nodes read, for the next events (a token's event allocates nothing)
    nm_chat_msg *hist;     // keep_history: the turns so far (strings owned)
    size_t n_hist, cap_hist;
    // listening (nm_pipeline_hear, on its caller's thread)
    nm_vad *vad;
    nm_vad_params vad_p;
    bool vad_speech;       // an utterance was open after the last frame
    // the gates (pipeline_gates.c; the feed thread's): the wake words (normalised: lower case, words one
    // blank apart), the signature of the first image of the last request answered
    char wake[16][64];
    int32_t n_wake;
    nm_frame_sig last_sig;
    bool have_sig;
};

// ---- pipeline.c
char *pl_dup_n(const char *s, size_t n);
char *pl_dup_s(const char *s);
bool pl_reserve(char **buf, size_t *cap, size_t need);
bool pl_push_locked(nm_pipeline *P, const nm_pipeline_event *ev, const char *text, size_t len,
                    const nm_tabm_slot *slot);
void pl_push(nm_pipeline *P, const nm_pipeline_event *ev, const char *text, size_t len);
pl_req *pl_req_of(nm_pipeline *P, uint64_t id);
void pl_retire_locked(nm_pipeline *P, pl_req *r);
void pl_free_req_body(pl_req *r);
int32_t pl_n_markers(const char *text);
char *pl_with_markers(const pl_req *r, const char *text);
void pl_done_locked(nm_pipeline *P, pl_req *r, nm_status status, const char *msg);
void pl_served_locked(nm_pipeline *P, uint64_t id);
void pl_fed_locked(nm_pipeline *P, pl_req *r);
void pl_done(nm_pipeline *P, pl_req *r, nm_status status, const char *msg);
void pl_record(nm_pipeline *P, pl_req *r, nm_status st, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
double pl_since(const pl_req *r);
void pl_fail_all(nm_pipeline *P, const char *why);

// ---- pipeline_feed.c
char *pl_format_chat(const nm_pipeline *P, const nm_chat_msg *msgs, size_t n, const char **fallback, nm_status *st,
                     char *err, size_t err_size);
nm_status pl_put_text(nm_pipeline *P, nm_tabm *ring, int from, int to, const char *text, size_t n, uint64_t user,
                      pl_req *r);
void *pl_feed_main(void *arg);

// ---- pipeline_lanes.c
nm_brick **pl_slot_of(nm_pipeline *P, nm_brick_kind k);
nm_status pl_load(nm_pipeline *P, nm_brick_kind kind, char *err, size_t err_size);
void pl_stats_add(nm_brick_stats *a, const nm_brick_stats *c);
void pl_unload(nm_pipeline *P, nm_brick_kind k);
bool pl_load_all(nm_pipeline *P, char *err, size_t err_size);
void pl_lane_idle_locked(nm_pipeline *P, nm_brick_kind k);
bool pl_stage_begin(nm_pipeline *P, pl_req *r, nm_brick_kind k);
void pl_stage_vision_done(nm_pipeline *P, const pl_req *r);
void pl_stage_end(nm_pipeline *P, const pl_req *r, nm_brick_kind k, const bool *ended);
void pl_traffic(nm_pipeline *P, nm_brick_kind k, nm_brick *b, const nm_brick_input *in);
void *pl_answers_main(void *arg);
void *pl_embd_main(void *arg);
void *pl_speech_main(void *arg);
void *pl_lane_main(void *arg);

// ---- pipeline_gates.c
nm_status pl_wake_words(nm_pipeline *P, const char *list, char *err, size_t err_size);
bool pl_woken(nm_pipeline *P, pl_req *r);
bool pl_frame_changed(nm_pipeline *P, pl_req *r);
nm_status pl_capture(pl_img *im, char *err, size_t err_size);

// ---- pipeline_power.c
void pl_plan(nm_pipeline *P, pl_req *r);
bool pl_remake(nm_pipeline *P, pl_req *r);

#endif
