// Internals shared by tokenizer.c (vocab, special tokens, detok), bpe.c and
// spm.c. Not part of any public contract.
#ifndef NM_TOK_IMPL_H
#define NM_TOK_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "bricks/tokenizer/tokenizer.h"
#include "core/hashmap.h"

// Token attributes (from tokenizer.ggml.token_type, numbered differently so
// they can be or'ed; llama.cpp's llama_token_attr works the same way).
enum {
    NM_TOKA_NORMAL = 1 << 0,  // type 1
    NM_TOKA_UNKNOWN = 1 << 1, // type 2
    NM_TOKA_CONTROL = 1 << 2, // type 3
    NM_TOKA_USER = 1 << 3,    // type 4: user-defined, matched whole in raw text
    NM_TOKA_UNUSED = 1 << 4,  // type 5
    NM_TOKA_BYTE = 1 << 5,    // type 6: <0xXX>
    NM_TOKA_EOG = 1 << 6,     // ends generation (not a GGUF type; ours)
};

typedef enum nm_vocab_type { NM_VOCAB_BPE, NM_VOCAB_SPM } nm_vocab_type;

#define NM_BPE_MAX_REGEX 4

struct nm_tokenizer {
    nm_vocab_type type;
    int32_t n_vocab;
    const char **tok_ptr; // (n_vocab) token text, in the GGUF mapping (not NUL-terminated)
    uint32_t *tok_len;    // (n_vocab)
    float *scores;        // (n_vocab) SPM merge priority; NULL for BPE
    uint8_t *attr;        // (n_vocab) NM_TOKA_*
    nm_strindex vocab;    // token text -> id

    // Tokens matched whole in the raw text before the model's own splitting:
    // control, unknown (only when parse_special) and user-defined (always).
    int32_t n_special;
    const char **sp_ptr; // (n_special)
    uint32_t *sp_len;    // (n_special)
    int32_t *sp_id;      // (n_special)
    nm_strindex special; // text -> index into sp_*
    int32_t n_sp_lens;
    uint32_t *sp_lens;   // (n_sp_lens) distinct special-token lengths, longest first
    uint8_t *sp_first;   // (n_sp_lens, 32) bitset of first bytes of specials of that length

    int32_t bos, eos, eot, eom, unk, pad; // -1 if none
    bool add_bos, add_eos, add_space_prefix;

    // SPM: id of "<0xXX>" (or of the 1-byte string) for byte fallback.
    // BPE: id of the GPT-2 byte-level character standing for that byte.
    int32_t byte_tok[256];

    // ---- BPE -----------------------------------------------------------------
    nm_u64map merges;   // (left id << 32 | right id) -> (rank << 32 | merged id)
    void *re[NM_BPE_MAX_REGEX]; // pcre2_code_8 *, applied one after the other
    int n_re;
    bool ignore_merges; // a whole pre-token that is in the vocab is emitted as is (llama3)
    char byte_chr[256][3]; // GPT-2 byte -> UTF-8 of its stand-in code point (NUL-terminated)
    int16_t cpt_byte[324]; // stand-in code point -> byte, -1 if none

    nm_str chat_template;
};

// Token ids collected from the encoders; counts past n_max without writing.
typedef struct nm_tok_out {
    int32_t *ids;
    int32_t n_max;
    int64_t n;
} nm_tok_out;

static inline void nm_tok_emit(nm_tok_out *o, int32_t id) {
    if (o->n < o->n_max) o->ids[o->n] = id;
    o->n++;
}

// Per-call scratch: a few independent growable buffers, freed at the end of
// one encode call. Sized from the input, never kept between calls (so a
// const tokenizer can be used from several threads).
#define NM_SCRATCH_SLOTS 8
#define NM_SCRATCH_PARTITION 7 // slot used by tokenizer.c across fragments
typedef struct nm_scratch {
    void *buf[NM_SCRATCH_SLOTS];
    size_t cap[NM_SCRATCH_SLOTS];
} nm_scratch;

// Buffer `slot` with room for at least `bytes` (contents not preserved); NULL on OOM.
void *nm_scratch_get(nm_scratch *s, int slot, size_t bytes);
void nm_scratch_free(nm_scratch *s);

// Length of the UTF-8 sequence a lead byte announces, as llama.cpp counts it
// (continuation and invalid lead bytes count 1).
static inline size_t nm_utf8_len(uint8_t c) {
    static const uint8_t lens[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lens[c >> 4];
}

// ---- bpe.c -------------------------------------------------------------------------
nm_status nm_bpe_init(nm_tokenizer *t, const nm_gguf *g, char *err, size_t err_size);
void nm_bpe_free(nm_tokenizer *t);
// Tokenizes one raw-text fragment (no special tokens in it).
nm_status nm_bpe_encode(const nm_tokenizer *t, const char *text, size_t len, nm_tok_out *out,
                        nm_scratch *s);
// Bytes of a normal token: GPT-2 byte-level text mapped back to raw bytes.
int32_t nm_bpe_decode_text(const nm_tokenizer *t, const char *p, uint32_t n, char *buf,
                           int32_t size);

// ---- spm.c -------------------------------------------------------------------------
// Tokenizes one raw-text fragment; prefix_space: prepend U+2581 first.
nm_status nm_spm_encode(const nm_tokenizer *t, const char *text, size_t len, bool prefix_space,
                        nm_tok_out *out, nm_scratch *s);

#endif
