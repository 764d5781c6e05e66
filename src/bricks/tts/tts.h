// Text-to-speech brick: UTF-8 text in, 16-bit mono PCM out, either into a
// caller's buffer or straight into TABM ring slots (NM_TABM_PCM_S16).
//
// Engines sit behind a small vtable (nm_tts_engine_i) so a neural voice can be
// added beside the first one, espeak-ng (tts_espeak.c). An engine produces
// s16 mono PCM at its native rate in chunks, handed to a sink; this layer
// (tts.c) checks the text, resamples when asked (the audio module's soxr
// resampler, nm_audio_resample), fills slots and counts.
//
// Slot protocol (nm_tts_synth_ring; docs/tts.md):
//   kind NM_TABM_PCM_S16, ndim 2, shape [n_frames, 1], size n_frames * 2,
//   sample_rate = nm_tts_sample_rate(). At the native rate a slot is written
//   per engine chunk (espeak-ng: ~100 ms), split when it exceeds the slot
//   capacity; with resampling the utterance is synthesized whole, resampled,
//   then written in slots of at most the capacity. The last slot of each
//   utterance lacks NM_BRICK_MORE in meta->user (include/nanomind.h); it holds
//   samples, or none (ndim 0, size 0) only when the engine produced none.
//
// Determinism: the same sequence of calls in a fresh process gives the same
// samples, bit for bit (no clock or random seed is involved with the default
// voices). espeak-ng keeps waveform state (pitch flutter phase, gain) across
// utterances, so the same text synthesized twice in one process may differ
// by a few percent in length (59577..61941 samples for one two-sentence text
// over four calls); a test that needs stable audio synthesizes a fixed list in
// a fixed order. Variants with breath noise (e.g. "+whisper") and klatt
// voices draw from libc rand().
//
// Threading: espeak-ng is one process-wide engine and not thread-safe. Every
// espeak-ng call (open, synthesis, voice listing) runs under one process-wide
// lock, so calls from several threads are serialized: one synthesis at a time.
// A synthesis holds the lock while it waits on a full ring, so a slow consumer
// delays other threads' syntheses; the ring's consumer must not itself call
// into TTS. A handle (nm_tts) is used by one thread at a time.
//
// Status codes: NM_ERR_INVALID_ARG (empty text, an unknown voice or engine,
// an option outside its range), NM_ERR_IO (the
// engine's data directory is missing or unreadable), NM_ERR_STATE (espeak-ng
// already initialized from another data directory), NM_ERR_RANGE (a caller
// buffer too small, text too long, or a slot that cannot hold one sample),
// NM_ERR_NOMEM, and the ring's statuses (NM_ERR_SHUTDOWN, NM_ERR_TIMEOUT).
#ifndef NM_TTS_TTS_H
#define NM_TTS_TTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nanomind.h"

// NM_TTS_MAX_TEXT (bytes of text per call): include/nanomind.h

// ---- engine interface ---------------------------------------------------------------
// Receives n >= 1 mono s16 samples at the engine's native rate, borrowed for
// the call, or (n 0, pcm NULL) a flush: what was given so far should go out
// now, more of the utterance follows (a Piper sentence sent in parts). Returns
// NM_OK to go on; any error stops the synthesis, and the engine's synth
// returns that status.
typedef nm_status (*nm_tts_sink_fn)(void *user, const int16_t *pcm, int64_t n);

// nm_tts_voice_info and nm_tts_voice_fn: include/nanomind.h

#define NM_TTS_ENGINE_VERSION 3 // 2: retune; 3: device, estimate
// An engine. Members are only ever appended (version says how many are
// there); optional ones may be NULL. Each call gets err/err_size for a message.
typedef struct nm_tts_engine_i {
    uint32_t version; // NM_TTS_ENGINE_VERSION when written
    const char *name; // "espeak-ng"
    // Validates p (voice, rate, pitch, volume: the engine's ranges) and makes
    // the engine's state for one voice. *native_rate: the rate synth produces.
    nm_status (*open)(const nm_tts_params *p, void **state, int32_t *native_rate, char *err, size_t err_size);
    // Synthesizes non-empty UTF-8 text, calling sink for each chunk, in order,
    // and returns after the last one. May be called many times.
    nm_status (*synth)(void *state, const char *text, nm_tts_sink_fn sink, void *user, char *err,
                       size_t err_size);
    void (*close)(void *state); // NULL state is a no-op
    // Optional. Lists the voices (data_dir as in nm_tts_params).
    nm_status (*list_voices)(const char *data_dir, nm_tts_voice_fn fn, void *user, char *err, size_t err_size);
    // Optional (version 2). The voice, rate, pitch and volume of p for the
    // syntheses that follow, checked as open checks them (an unknown voice
    // fails here); on error the state is unchanged. The native rate stays.
    nm_status (*retune)(void *state, const nm_tts_params *p, char *err, size_t err_size);
    // Optional (version 3): the device it computes on ("cpu", "opencl"); NULL: the CPU.
    const char *(*device)(void *state);
    // Optional (version 3): what `seconds` of speech cost (flops, weights; e's other fields the caller's).
    // NULL: next to nothing (espeak-ng's formants).
    void (*estimate)(void *state, double seconds, nm_brick_cost *e);
} nm_tts_engine_i;

extern const nm_tts_engine_i nm_tts_espeak_engine; // tts_espeak.c

// espeak-ng as a phonemizer (Piper's front end, tts_espeak.c, under its lock): text's IPA clause by
// clause (espeak_TextToPhonemes, IPA mode), each handed to fn with its terminator (one of . ? ! , : ;
// or 0: none, an ellipsis) and whether it ends a sentence (. ? ! or the text's end). Debian's
// libespeak-ng (1.51) has no espeak_TextToPhonemesWithTerminator (Piper's fork): the terminator is read
// off the text espeak-ng consumed for the clause. fn runs under espeak-ng's lock (it must not call
// espeak-ng); a status it returns stops the walk and is returned. data_dir as nm_tts_params'.
typedef nm_status (*nm_espeak_clause_fn)(void *user, const char *ipa, char terminator, bool end_of_sentence);
nm_status nm_espeak_clauses(const char *data_dir, const char *voice, const char *text, nm_espeak_clause_fn fn,
                            void *user, char *err, size_t err_size);

// ---- the brick ----------------------------------------------------------------------
typedef struct nm_tts nm_tts;

// Opens a voice of an engine. ledger (may be NULL) is borrowed and must
// outlive the brick: the brick registers the endpoints "<engine>" and "tts"
// there and counts every copy of samples out of the engine's own buffers
// (espeak-ng hands out its buffer: at the native rate each sample is copied
// once, into the caller's buffer or a slot; resampled output is computed
// there, the native samples having been copied once into a work buffer). On
// failure *out is NULL and err says why.
nm_status nm_tts_open(const nm_tts_params *p, nm_ledger *ledger, nm_tts **out, char *err, size_t err_size);
void nm_tts_free(nm_tts *t); // NULL is a no-op

int32_t nm_tts_sample_rate(const nm_tts *t); // output rate (Hz)
int32_t nm_tts_native_rate(const nm_tts *t); // the engine's own rate (Hz)
const char *nm_tts_device(const nm_tts *t);
// Adds what `seconds` of speech cost the engine to e (the brick's estimate; nothing for espeak-ng).
void nm_tts_estimate(const nm_tts *t, double seconds, nm_brick_cost *e);   // the unit it computes on ("cpu", "opencl")
const char *nm_tts_engine_name(const nm_tts *t);
const char *nm_tts_last_error(const nm_tts *t); // "" if none
// p's voice, rate_wpm, pitch and volume for the syntheses that follow (the
// engine, data_dir and sample_rate given to nm_tts_open stay; p's are not
// read). Checked as nm_tts_open checks them; on error nothing changes.
// NM_ERR_UNSUPPORTED: an engine that cannot change them.
nm_status nm_tts_retune(nm_tts *t, const nm_tts_params *p);

// Synthesizes text into pcm (cap samples). *n: the utterance's samples. If
// they do not fit, the first cap are written, *n is the number needed and
// the status NM_ERR_RANGE. Empty or whitespace-only text: NM_ERR_INVALID_ARG.
nm_status nm_tts_synth(nm_tts *t, const char *text, int16_t *pcm, int64_t cap, int64_t *n);
// As nm_tts_synth into a new buffer (*pcm, free() it; NULL on failure).
nm_status nm_tts_synth_alloc(nm_tts *t, const char *text, int16_t **pcm, int64_t *n);

// Synthesizes text into slots of `ring` (protocol above), written in place and
// published in order, every one with NM_BRICK_MORE but the utterance's last,
// which has it only if `more` (more text of the request follows). Each carries
// `request`. producer: the slots' producer id; timeout_ns bounds every wait
// for a free slot (as in nm_tabm_acquire_write). On error no slot stays held:
// a slot in hand is published with NM_BRICK_ERROR (what was synthesized);
// with none in hand, an engine error still writes an empty NM_BRICK_ERROR
// slot, while a shut-down ring or a timed-out wait writes nothing more (a
// reader then sees the shutdown, or must bound its own wait). The ring's
// slots must hold at least one sample (2 bytes), else NM_ERR_RANGE before
// anything is written.
nm_status nm_tts_synth_ring(nm_tts *t, const char *text, nm_tabm *ring, uint32_t producer,
                            int64_t timeout_ns, uint64_t request, bool more);
// fn(user, message) is called before a slot flagged NM_BRICK_ERROR is
// published (the TTS brick hands the message to its handle first); NULL: none.
void nm_tts_set_reporter(nm_tts *t, void (*fn)(void *user, const char *msg), void *user);
// fn(user) is asked before each chunk nm_tts_synth_ring writes: true stops
// the synthesis, whose last slot is then flagged NM_BRICK_CANCELLED (not
// NM_BRICK_ERROR), and nm_tts_synth_ring returns NM_ERR_CANCELLED. NULL: never.
void nm_tts_set_cancel(nm_tts *t, bool (*fn)(void *user), void *user);
// Copies n bytes of text from a slot into the engine's input buffer (dst),
// counted in the ledger (tts -> engine): the engine reads NUL-terminated text
// it owns, not a slot.
void nm_tts_copy_text(nm_tts *t, char *dst, const char *src, size_t n);

typedef struct nm_tts_stats {
    uint64_t n_utterances; // successful synth calls
    uint64_t n_samples;    // output samples (at the output rate)
    uint64_t n_slots;      // slots published
    double t_synth;        // seconds in synthesis calls (engine, resampling, slot writes, ring waits)
} nm_tts_stats;
nm_tts_stats nm_tts_get_stats(const nm_tts *t); // cumulative

#endif
