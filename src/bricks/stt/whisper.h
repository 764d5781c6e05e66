// Whisper forward pass on the backend's ops: the encoder (two convolutions,
// sinusoidal positions, transformer layers) over one 30 s window of a log-mel
// spectrogram, the cross-attention K/V each decoder layer reads, and the
// decoder (token + learned positions, causal self-attention with a KV cache
// per sequence, cross-attention, MLP, tied output head). The decoding policy
// (prompts, timestamps, suppression, fallback, beams, seeking) lives above
// this in transcribe.c; this file only computes.
//
// Everything is sized at creation for the model's fixed shapes (1500 audio
// positions, 448 text positions, n_seq sequences), so encode and decode
// allocate nothing.
#ifndef NM_STT_WHISPER_H
#define NM_STT_WHISPER_H

#include <stdbool.h>
#include <stdint.h>

#include "bricks/stt/whisper_model.h"
#include "nanomind.h"

typedef struct nm_whisper nm_whisper;

// A runtime over `m` (borrowed; must outlive it): n_threads (<= 0: all
// cores), n_seq decoder sequences with their own self-attention caches (1 for
// greedy, the beam or best-of count otherwise), each able to take up to
// n_batch tokens per nm_whisper_decode call (<= 0: the text context).
nm_status nm_whisper_create(const nm_whisper_model *m, int32_t n_threads, int32_t n_seq, int32_t n_batch,
                            nm_whisper **out, char *err, size_t err_size);
void nm_whisper_free(nm_whisper *w);
const nm_whisper_model *nm_whisper_get_model(const nm_whisper *w);
int32_t nm_whisper_n_seq(const nm_whisper *w);

// Encodes the window of 2 * n_audio_ctx mel frames starting at frame
// `offset` of a spectrogram of n_mels rows x n_len frames (row b at
// mel + b * n_len; frames past n_len read as 0, as whisper.cpp does), then
// computes every decoder layer's cross-attention keys and values from it.
// Until the next call, all sequences decode against this window.
nm_status nm_whisper_encode(nm_whisper *w, const float *mel, int64_t n_len, int64_t offset);
// The encoder output of the last window: n_audio_ctx rows of n_audio_state floats.
const float *nm_whisper_encoder_output(const nm_whisper *w);

// Runs the decoder for sequence `seq` on tokens[0..n) at positions
// pos..pos+n-1 (that sequence's cache rows >= pos are overwritten). Keeps the
// logits of every token if all_logits, else of the last one only.
nm_status nm_whisper_decode(nm_whisper *w, int32_t seq, const int32_t *tokens, int32_t n, int32_t pos,
                            bool all_logits);
// One token for each of n distinct sequences (seqs[i] gets tokens[i]), all at
// position pos, in one pass: the weights are read once for all of them (beam
// search), and each sequence's logits are exactly what nm_whisper_decode of
// its token alone gives. Keeps every token's logits (i = the index in seqs).
nm_status nm_whisper_decode_seqs(nm_whisper *w, const int32_t *seqs, const int32_t *tokens, int32_t n, int32_t pos);
// Logits (n_vocab floats) of token i of the last decode call (-1: its last
// token), NULL if not kept. Borrowed until the next decode.
const float *nm_whisper_logits(const nm_whisper *w, int32_t i);
// Gives sequence dst sequence src's cache for positions [0, n_pos) (beam
// search forks a hypothesis): dst's positions point at src's rows, shared
// and reference counted, no bytes copied; the first write to a shared
// position gives the writer a row of its own.
nm_status nm_whisper_seq_share(nm_whisper *w, int32_t dst, int32_t src, int32_t n_pos);

typedef struct nm_whisper_timings {
    double t_encode, t_decode; // seconds
    int64_t n_encode, n_decode_calls, n_decode_tokens;
} nm_whisper_timings;
nm_whisper_timings nm_whisper_get_timings(const nm_whisper *w);
const char *nm_whisper_last_error(const nm_whisper *w); // "" if none

#endif
