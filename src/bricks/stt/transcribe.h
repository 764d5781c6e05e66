// Whisper transcription: the decoding policy on top of the forward pass
// (whisper.h), written to give the same transcripts as whisper.cpp's
// whisper_full on the same model file. What "the same" covers:
//
//   prompt     sot [+ language + transcribe/translate for multilingual
//              models] [+ notimestamps]; with no_context false, the previous
//              window's text first (<|startofprev|> + up to n_text_ctx/2 - 1
//              tokens), dropped at temperatures >= 0.5 and near the end; an
//              initial prompt goes before that text (or, carried, before
//              every window's text).
//   filters    every step: <|notimestamps|>, sot, nospeech, solm, task,
//              prev and the 100 language ids suppressed; blank (" " and eot)
//              at the first step (suppress_blank); optionally whisper.cpp's
//              non-speech symbols (suppress_nst); timestamps in pairs, not
//              decreasing, the first one <= max_initial_ts; when the
//              timestamps together are likelier than any text token, only a
//              timestamp may follow.
//   sampling   greedy (argmax) at T = 0; at T > 0 best_of sequences sampled
//              with whisper.cpp's generator (mt19937 seeded with the
//              decoder index, libstdc++'s discrete_distribution), so even
//              the fallback samples match; beam search keeps beam_size
//              hypotheses, each extended by beam_size candidates drawn from
//              its distribution (whisper.cpp draws them, it does not take
//              the top k), ranked by summed log-probability. patience is
//              accepted and unused, as in whisper.cpp.
//   fallback   temperatures T0, T0 + inc, ... <= 1: a window is decoded
//              again at the next one when the best sequence failed
//              (repetition: entropy of its last 32 tokens < entropy_thold
//              over > 32 tokens; timestamps going back; no end) or its
//              average log-probability < logprob_thold while the no-speech
//              probability < no_speech_thold.
//   windows    30 s at a time from `seek` (10 ms frames); the next window
//              starts at the last timestamp (or 30 s later when the text ends
//              on a single timestamp or without one); windows of no speech
//              (no_speech_prob > no_speech_thold and avg logprob <
//              logprob_thold) give no segment.
//   segments   split at timestamp tokens; t0, t1 in 10 ms units from the
//              start of the audio; text = the bytes of the text tokens.
//
// Nothing is allocated per token: the decoders' logits, the beam candidates
// and the sequences are sized at creation. The transcript's segments are
// appended as windows finish (a realloc per segment at most).
#ifndef NM_STT_TRANSCRIBE_H
#define NM_STT_TRANSCRIBE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "bricks/stt/whisper.h"
#include "nanomind.h"

void nm_transcript_free(nm_transcript *t); // frees the segments; NULL and an empty one are no-ops

typedef struct nm_transcriber nm_transcriber;

// A transcriber over model m (borrowed: must outlive it) running the forward
// pass on n_threads threads (<= 0: all cores), with room for up to
// max_decoders sequences (best_of / beam_size; <= 0: 5). On failure *out is
// NULL and err says why.
nm_status nm_transcriber_create(const nm_whisper_model *m, int32_t n_threads, int32_t max_decoders,
                                nm_transcriber **out, char *err, size_t err_size);
void nm_transcriber_free(nm_transcriber *t); // NULL is a no-op

// Transcribes n samples of 16 kHz mono audio (read in place during the call).
// *out receives the transcript (the caller frees it with nm_transcript_free;
// it is zeroed first). Audio under 100 ms gives an empty transcript, as in
// whisper.cpp. Errors: NM_ERR_INVALID_ARG (bad params: unknown language,
// best_of / beam_size over max_decoders, NaN samples...), NM_ERR_NOMEM, or
// the forward pass's status; err says which.
nm_status nm_transcribe(nm_transcriber *t, const float *pcm, int64_t n, const nm_stt_params *p,
                        nm_transcript *out, char *err, size_t err_size);

nm_stt_timings nm_transcriber_timings(const nm_transcriber *t);

// Language id (index into the model's lang_codes) of a code, or -1.
int32_t nm_stt_lang_id(const nm_whisper_model *m, const char *code);

// The transcript writers and nm_stt_timestamp are public (include/nanomind.h).

#endif
