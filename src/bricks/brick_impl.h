// The built-in bricks' implementations (nm_brick_i, include/nanomind.h) and
// what the handle (brick.c) asks of each beyond the interface.
#ifndef NM_BRICK_IMPL_H
#define NM_BRICK_IMPL_H

#include "nanomind.h"

extern const nm_brick_i nm_brick_llm_i;    // bricks/llm/brick.c
extern const nm_brick_i nm_brick_vision_i; // bricks/vision/vision.c
extern const nm_brick_i nm_brick_stt_i;    // bricks/stt/brick_stt.c
extern const nm_brick_i nm_brick_tts_i;    // bricks/tts/brick_tts.c

// The states of the built-in implementations (NULL-safe).
nm_model *nm_llm_state_model(void *state);
nm_ctx *nm_llm_state_ctx(void *state);
int32_t nm_llm_state_pos(void *state);
const nm_transcript *nm_stt_state_transcript(void *state);
struct nm_whisper_model;
const struct nm_whisper_model *nm_stt_state_model(void *state);
// The STT brick's Whisper model (tokenizer, languages) for the transcribe command; NULL for another brick.
const struct nm_whisper_model *nm_brick_stt_whisper(const nm_brick *b);
struct nm_transcriber;
struct nm_transcriber *nm_stt_state_transcriber(void *state);
struct nm_transcriber *nm_brick_stt_transcriber(const nm_brick *b); // its timings
int32_t nm_tts_state_sample_rate(void *state);
struct nm_tts;
struct nm_tts *nm_tts_state_handle(void *state);
// The TTS brick's engine handle (its voice, native rate) for the say command; NULL for another brick.
struct nm_tts *nm_brick_tts_handle(const nm_brick *b);
// The vision brick writes into the LLM brick's input ring: the model it tokenizes markers with.
nm_model *nm_brick_feeds_model(const nm_brick *llm);

// Ends a request whose output is not written yet: an empty slot of `kind`
// with NM_BRICK_ERROR (and `extra` flags) carrying `request`. For the
// implementations' failure paths.
nm_status nm_brick_put_error(nm_tabm *out, uint32_t producer, int64_t timeout_ns, uint32_t kind, uint64_t request,
                             uint64_t extra);
// Reads and releases the rest of a request whose slot `user` flags say more follow.
nm_status nm_brick_drain_request(nm_tabm *in, uint64_t user, int64_t timeout_ns, uint64_t *n_slots);

#endif
