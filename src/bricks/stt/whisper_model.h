// Whisper model files: hyperparameters, vocabulary, mel filters and weight
// views, loaded from either
//  - nanomind's Whisper GGUF (tools/convert_whisper_ct2.py; layout in
//    docs/whisper_gguf.md), or
//  - whisper.cpp's legacy `ggml-*.bin` files (magic 0x67676d6c), f32, f16 or
//    quantized (the types src/quant runs).
// Both give the same nm_whisper_model: tensor names and shapes follow
// whisper.cpp (ne[0] is the contiguous dimension).
//
// Weights stay in the read-only mapping of the file. The one exception is a
// ggml .bin tensor whose data starts at an offset its element type cannot be
// read from (that format has no padding): it is copied once into memory the
// model owns, and counted in bytes_copied. Small vectors (biases, norms,
// position tables) that are not f32 in the file are widened to f32 (owned).
//
// Every count, length, shape and offset is checked against the file; a corrupt
// or truncated file gives NM_ERR_FORMAT (NM_ERR_UNSUPPORTED for a well-formed
// file we cannot run) and a message, never a crash.
#ifndef NM_WHISPER_MODEL_H
#define NM_WHISPER_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "backend/backend.h"
#include "nanomind.h"

typedef enum nm_whisper_format {
    NM_WHISPER_GGUF = 1,
    NM_WHISPER_GGML_BIN = 2,
} nm_whisper_format;

typedef struct nm_whisper_hparams {
    int32_t n_vocab;
    int32_t n_audio_ctx;   // encoder positions (1500 = 30 s after the stride-2 conv)
    int32_t n_audio_state;
    int32_t n_audio_head;
    int32_t n_audio_layer;
    int32_t n_text_ctx;    // decoder positions (448)
    int32_t n_text_state;  // == n_audio_state
    int32_t n_text_head;
    int32_t n_text_layer;
    int32_t n_mels;        // 80 (128 for large-v3)
    int32_t n_fft_bins;    // columns of the mel filterbank: n_fft / 2 + 1 = 201
} nm_whisper_hparams;

// Special token ids (whisper's tokenizer.py order; the multilingual models
// shift them by one, and by the language count beyond 99).
typedef struct nm_whisper_special {
    int32_t eot;             // <|endoftext|>
    int32_t sot;             // <|startoftranscript|>
    int32_t lang_begin;      // <|en|> = sot + 1; language i is lang_begin + i
    int32_t n_langs;         // 99 (100 for large-v3)
    int32_t translate;       // <|translate|>
    int32_t transcribe;      // <|transcribe|>
    int32_t solm;            // <|startoflm|>
    int32_t prev;            // <|startofprev|>
    int32_t nospeech;        // <|nospeech|> (older name <|nocaptions|>)
    int32_t notimestamps;    // <|notimestamps|>
    int32_t timestamp_begin; // <|0.00|>; token timestamp_begin + k is k * 0.02 s
} nm_whisper_special;

// Per layer: views into the file (or owned f32 copies for vectors), shapes as
// whisper.cpp: matrices [n_in, n_out] (ne[0] = n_in), vectors [n]. A bias that
// Whisper does not have (the key projections) is unset (nm_tensor_is_set). nm_tensor.name
// is NULL (names in the files are not NUL-terminated). All live until
// nm_whisper_model_free; a loaded model is read-only and may be shared by threads.
typedef struct nm_whisper_attn {
    nm_tensor ln_w, ln_b;        // (d) f32: the layer norm before this attention
    nm_tensor q_w, q_b;          // [d, d], (d)
    nm_tensor k_w, k_b;          // [d, d], k_b absent in Whisper (unset) unless the file has one
    nm_tensor v_w, v_b;          // [d, d], (d)
    nm_tensor o_w, o_b;          // [d, d], (d)
} nm_whisper_attn;

typedef struct nm_whisper_mlp {
    nm_tensor ln_w, ln_b;        // (d) f32
    nm_tensor fc1_w, fc1_b;      // mlp.0: [d, 4d], (4d)
    nm_tensor fc2_w, fc2_b;      // mlp.2: [4d, d], (d)
} nm_whisper_mlp;

typedef struct nm_whisper_enc_layer {
    nm_whisper_attn attn;
    nm_whisper_mlp mlp;
} nm_whisper_enc_layer;

typedef struct nm_whisper_dec_layer {
    nm_whisper_attn attn;        // causal self-attention
    nm_whisper_attn cross;       // over the encoder output
    nm_whisper_mlp mlp;
} nm_whisper_dec_layer;

typedef struct nm_whisper_model {
    nm_whisper_format format;
    nm_whisper_hparams hp;
    uint32_t wtype;              // type of the big matrices (token embedding), for printing
    char name[64];               // general.name, or "ggml" + size for .bin files

    // Mel filterbank: (n_mels, n_fft_bins) row-major, filter m at mel_filters + m * n_fft_bins.
    const float *mel_filters;

    // Vocabulary: token i is the bytes tok_data[tok_off[i] .. tok_off[i+1]) (raw
    // bytes, not byte-level-BPE text; the specials read "<|endoftext|>", "<|en|>",
    // "<|0.00|>", ... in both formats).
    const char *tok_data;        // owned
    const uint32_t *tok_off;     // (n_vocab + 1), owned
    nm_whisper_special special;
    const char *const *lang_codes; // (n_langs) "en", "zh", ...; borrowed from a static table or owned

    // From the GGUF's metadata (copied from the CTranslate2 config); n = 0
    // for ggml .bin files, which carry none: the decoder derives them.
    const int32_t *suppress;     int32_t n_suppress;
    const int32_t *begin_suppress; int32_t n_begin_suppress;
    const int32_t *align_heads;  int32_t n_align_heads; // pairs (layer, head), 2 * n ints

    // Encoder.
    nm_tensor e_pe;              // [d, n_audio_ctx] f32 (computed sinusoids if the file has none)
    nm_tensor conv1_w, conv1_b;  // [3, n_mels, d] f16/f32, (d) f32
    nm_tensor conv2_w, conv2_b;  // [3, d, d] f16/f32, (d) f32
    nm_tensor e_ln_w, e_ln_b;    // ln_post (d) f32
    nm_whisper_enc_layer *enc;   // (n_audio_layer), owned

    // Decoder.
    nm_tensor d_pe;              // [d, n_text_ctx] f32
    nm_tensor d_te;              // token embedding [d, n_vocab]; also the output head (tied)
    nm_tensor d_ln_w, d_ln_b;    // (d) f32
    nm_whisper_dec_layer *dec;   // (n_text_layer), owned

    bool e_pe_computed;          // the file had no encoder.positional_embedding
    uint64_t bytes_mapped;       // tensor bytes used in place from the mapping
    uint64_t bytes_copied;       // tensor bytes copied (misaligned .bin data, widened vectors)

    // Ownership (private).
    void *priv;
} nm_whisper_model;

// Loads `path` (format detected from its magic). On success *out owns the
// mapping and all tables; free with nm_whisper_model_free. On failure *out is
// NULL and `err` (may be NULL) receives a message naming the problem.
nm_status nm_whisper_model_load(const char *path, nm_whisper_model **out, char *err, size_t err_size);
// Same over a caller-owned buffer, borrowed until nm_whisper_model_free (used
// by the fuzzer and tests).
nm_status nm_whisper_model_load_memory(const void *buf, size_t size, nm_whisper_model **out, char *err,
                                       size_t err_size);
void nm_whisper_model_free(nm_whisper_model *m); // NULL is a no-op

// Bytes of token `id` (not NUL-terminated) and their count in *len; NULL if
// id is out of range.
const char *nm_whisper_token(const nm_whisper_model *m, int32_t id, uint32_t *len);
// The text whisper.cpp gives token `id` (whisper_token_to_str) on a ggml file
// holding the text tokens only, as whisper.cpp's converters and ours write
// them: the bytes below <|endoftext|>, whisper.cpp's own names from there on
// ("[_EOT_]", "[_SOT_]", "[_LANG_en]", ..., "[_BEG_]", "[_TT_N]"), written to
// buf. Its length in *len; NULL if id is out of range.
const char *nm_whisper_token_text_cpp(const nm_whisper_model *m, int32_t id, char buf[24], uint32_t *len);
// Id of the token whose bytes are exactly `text`, or -1 (linear search: setup only).
int32_t nm_whisper_token_find(const nm_whisper_model *m, const char *text);
bool nm_whisper_is_multilingual(const nm_whisper_model *m); // n_vocab >= 51865
// Tokens of `text` as whisper.cpp's whisper_tokenize gives them (GPT-2's
// pre-tokenizer pattern, then the longest vocabulary entries left to right;
// text tokens only, so "<|endoftext|>" in the text is plain text). Writes up
// to cap ids to out and returns how many the text has (more than cap: call
// again with room), or -1 (out of memory, no model or text).
int32_t nm_whisper_tokenize(const nm_whisper_model *m, const char *text, int32_t *out, int32_t cap);

// whisper's sinusoidal encoder positions: out[p * d + i] = sin(p * f_i) for
// i < d/2 and cos(p * f_{i - d/2}) after, f_i = 10000^(-i / (d/2 - 1)).
void nm_whisper_sinusoids(float *out, int32_t n_ctx, int32_t d);

#endif
