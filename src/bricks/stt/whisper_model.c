// Whisper model loader: nanomind's GGUF and whisper.cpp's legacy ggml .bin.
//
// Both formats are reduced to one tensor directory (name, type, shape, data
// in the mapping) plus hyperparameters, vocabulary and mel filters; the model
// is then bound from the directory by name with every shape checked, so the
// two paths share all the semantics.
//
// ggml .bin layout (little-endian; whisper.cpp's models/convert-pt-to-ggml.py
// writes it and src/whisper.cpp whisper_model_load reads it):
//   u32 magic 0x67676d6c
//   i32 n_vocab, n_audio_ctx, n_audio_state, n_audio_head, n_audio_layer,
//       n_text_ctx, n_text_state, n_text_head, n_text_layer, n_mels, ftype
//   i32 n_mel, n_fft; f32 filters[n_mel][n_fft]
//   i32 n_tokens; n_tokens x { u32 len; bytes }   (ids 0..n_tokens-1; whisper.cpp
//                                                  names the rest itself)
//   tensors until end of file: { i32 n_dims, i32 name_len, i32 ggml type,
//                                i32 ne[n_dims], name, data }  (no padding)
// Layout of the GGUF: docs/whisper_gguf.md.
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bricks/stt/whisper_model.h"
#include "gguf/gguf.h"
#include "io/infile.h"
#include "quant/quant.h"
#include "core/fail.h"

#define BIN_MAGIC 0x67676d6cu
#define MAX_NAME 256
#define N_FFT_BINS 201 // whisper's n_fft = 400

// One tensor of the file.
typedef struct entry {
    const char *name; // not NUL-terminated
    uint32_t name_len;
    uint32_t type;
    uint32_t n_dims;
    int64_t ne[4];    // unused dims are 1
    const uint8_t *data;
    uint64_t nbytes;
    bool used;
} entry;

typedef struct priv {
    nm_gguf *g;           // GGUF: owns (or borrows) the bytes
    void *map;            // .bin opened from a path: our mapping
    size_t map_size;
    entry *dir;
    int64_t n_dir;
    float *filters;       // .bin: copied out of the file (unaligned there)
    char *tok_data;
    uint32_t *tok_off;
    char **langs;         // GGUF: owned codes
    int32_t *ints;        // suppress lists and alignment heads
    void **owned;         // copied / widened / computed tensors
    size_t n_owned, cap_owned;
    nm_whisper_enc_layer *enc;
    nm_whisper_dec_layer *dec;
} priv;

typedef struct loader {
    nm_whisper_model *m;
    priv *p;
    char *err;
    size_t err_size;
} loader;

static nm_status fail(loader *L, nm_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    nm_vfail(st, L->err, L->err_size, "whisper: ", fmt, ap);
    va_end(ap);
    return st;
}

// whisper's tokenizer.py LANGUAGES, in token order (large-v3 added "yue").
static const char *const k_langs[] = {
    "en", "zh", "de", "es", "ru", "ko", "fr", "ja", "pt", "tr", "pl", "ca", "nl", "ar", "sv", "it", "id",
    "hi", "fi", "vi", "he", "uk", "el", "ms", "cs", "ro", "da", "hu", "ta", "no", "th", "ur", "hr", "bg",
    "lt", "la", "mi", "ml", "cy", "sk", "te", "fa", "lv", "bn", "sr", "az", "sl", "kn", "et", "mk", "br",
    "eu", "is", "hy", "ne", "mn", "bs", "kk", "sq", "sw", "gl", "mr", "pa", "si", "km", "sn", "yo", "so",
    "af", "oc", "ka", "be", "tg", "sd", "gu", "am", "yi", "lo", "uz", "fo", "ht", "ps", "tk", "nn", "mt",
    "sa", "lb", "my", "bo", "tl", "mg", "as", "tt", "haw", "ln", "ha", "ba", "jw", "su", "yue",
};
#define N_KNOWN_LANGS ((int32_t)(sizeof k_langs / sizeof k_langs[0]))

static void *own(loader *L, size_t size) {
    priv *p = L->p;
    if (p->n_owned == p->cap_owned) {
        size_t cap = p->cap_owned ? p->cap_owned * 2 : 64;
        void **o = realloc(p->owned, cap * sizeof *o);
        if (!o) return NULL;
        p->owned = o;
        p->cap_owned = cap;
    }
    void *ptr = NULL;
    if (posix_memalign(&ptr, 64, size ? size : 1) != 0) return NULL;
    p->owned[p->n_owned++] = ptr;
    return ptr;
}

// ---- fixed pieces -------------------------------------------------------------------

void nm_whisper_sinusoids(float *out, int32_t n_ctx, int32_t d) {
    const int32_t h = d / 2;
    const double inc = h > 1 ? log(10000.0) / (h - 1) : 0.0;
    for (int32_t p = 0; p < n_ctx; p++)
        for (int32_t i = 0; i < h; i++) {
            const double t = p * exp(-inc * i);
            out[(size_t)p * d + i] = (float)sin(t);
            out[(size_t)p * d + h + i] = (float)cos(t);
        }
}

// Special ids as whisper's tokenizer lays them out for a vocabulary of n_vocab:
// eot, sot, the languages, then translate .. notimestamps, then 1501 timestamps.
static nm_status derive_special(loader *L, int32_t n_vocab, nm_whisper_special *s) {
    const int32_t ml = n_vocab >= 51865;
    const int32_t n_langs = n_vocab - 51765 - ml;
    if (n_langs < 1 || n_langs > N_KNOWN_LANGS)
        return fail(L, NM_ERR_UNSUPPORTED, "n_vocab %d is not a whisper vocabulary (51864 .en, 51865, 51866)", n_vocab);
    s->eot = 50256 + ml;
    s->sot = s->eot + 1;
    s->lang_begin = s->sot + 1;
    s->n_langs = n_langs;
    s->translate = s->lang_begin + n_langs;
    s->transcribe = s->translate + 1;
    s->solm = s->translate + 2;
    s->prev = s->translate + 3;
    s->nospeech = s->translate + 4;
    s->notimestamps = s->translate + 5;
    s->timestamp_begin = s->translate + 6;
    return NM_OK;
}

// Name whisper's tokenizer gives special id `id` (buf of 32).
static void special_name(const nm_whisper_special *s, const char *const *langs, int32_t id, char *buf, size_t size) {
    if (id >= s->timestamp_begin) snprintf(buf, size, "<|%.2f|>", 0.02 * (id - s->timestamp_begin));
    else if (id == s->eot) snprintf(buf, size, "<|endoftext|>");
    else if (id == s->sot) snprintf(buf, size, "<|startoftranscript|>");
    else if (id >= s->lang_begin && id < s->lang_begin + s->n_langs) snprintf(buf, size, "<|%s|>", langs[id - s->lang_begin]);
    else if (id == s->translate) snprintf(buf, size, "<|translate|>");
    else if (id == s->transcribe) snprintf(buf, size, "<|transcribe|>");
    else if (id == s->solm) snprintf(buf, size, "<|startoflm|>");
    else if (id == s->prev) snprintf(buf, size, "<|startofprev|>");
    else if (id == s->nospeech) snprintf(buf, size, "<|nospeech|>");
    else if (id == s->notimestamps) snprintf(buf, size, "<|notimestamps|>");
    else snprintf(buf, size, "<|extra_%d|>", id);
}

// ---- tensor binding (both formats) ------------------------------------------------------

static entry *find_entry(loader *L, const char *name) {
    const size_t n = strlen(name);
    for (int64_t i = 0; i < L->p->n_dir; i++) {
        entry *e = &L->p->dir[i];
        if (e->name_len == n && memcmp(e->name, name, n) == 0) return e;
    }
    return NULL;
}

// Alignment a pointer needs for the type's kernels to read it in place.
static uintptr_t type_align(uint32_t type) {
    switch (type) {
    case NM_TYPE_F32:
    case NM_TYPE_Q8_K: return 4;
    case NM_TYPE_MXFP4: return 1;
    default: return 2; // f16, bf16 and blocks led by half-precision scales
    }
}

enum kind {
    K_MAT,   // matmul weight: any supported type, mapped (copied only if misaligned)
    K_CONV,  // conv kernel: f16 or f32
    K_VEC,   // vector or table: f32 (f16 widened); [n] or [1, n] for the conv biases
};

static bool shape_is(const entry *e, int n_dims, const int64_t *ne) {
    for (int i = 0; i < 4; i++)
        if (e->ne[i] != (i < n_dims ? ne[i] : 1)) return false;
    return true;
}

// Binds `name` with shape ne[0..n_dims). A missing optional tensor leaves t zeroed.
static nm_status bind(loader *L, nm_tensor *t, const char *name, enum kind k, int n_dims, const int64_t *ne,
                      bool required) {
    memset(t, 0, sizeof *t);
    entry *e = find_entry(L, name);
    if (!e) return required ? fail(L, NM_ERR_FORMAT, "missing tensor '%s'", name) : NM_OK;
    e->used = true;
    bool ok = shape_is(e, n_dims, ne);
    if (!ok && k == K_VEC && n_dims == 1) { // whisper.cpp stores the conv biases as [1, n]
        const int64_t alt[2] = {1, ne[0]};
        ok = shape_is(e, 2, alt);
    }
    if (!ok)
        return fail(L, NM_ERR_FORMAT, "tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld, %lld]",
                    name, (long long)e->ne[0], (long long)e->ne[1], (long long)e->ne[2], (long long)e->ne[3],
                    (long long)ne[0], (long long)(n_dims > 1 ? ne[1] : 1), (long long)(n_dims > 2 ? ne[2] : 1));
    const nm_type_traits *tr = nm_type_traits_get(e->type);
    if (!tr || !tr->supported)
        return fail(L, NM_ERR_UNSUPPORTED, "tensor '%s' has unsupported type %u", name, e->type);
    if ((k == K_CONV || k == K_VEC) && e->type != NM_TYPE_F32 && e->type != NM_TYPE_F16)
        return fail(L, NM_ERR_UNSUPPORTED, "tensor '%s' is %s; it must be f32 or f16", name, tr->name);
    if (k == K_MAT && nm_row_size(e->type, ne[0]) == 0)
        return fail(L, NM_ERR_FORMAT, "tensor '%s' (%s): rows of %lld are not whole blocks", name, tr->name,
                    (long long)ne[0]);
    nm_whisper_model *m = L->m;
    int64_t n = 1;
    for (int i = 0; i < n_dims; i++) n *= ne[i];
    t->type = e->type;
    for (int i = 0; i < 4; i++) t->ne[i] = i < n_dims ? ne[i] : 1;
    if (k == K_VEC && (e->type != NM_TYPE_F32 || (uintptr_t)e->data % 4 != 0)) {
        float *dst = own(L, (size_t)n * sizeof(float));
        if (!dst) return fail(L, NM_ERR_NOMEM, "out of memory widening '%s'", name);
        if (e->type == NM_TYPE_F32) {
            memcpy(dst, e->data, (size_t)n * sizeof(float));
        } else {
            for (int64_t i = 0; i < n; i++) {
                uint16_t h;
                memcpy(&h, e->data + 2 * i, 2);
                dst[i] = nm_fp16_to_fp32(h);
            }
        }
        t->type = NM_TYPE_F32;
        t->offs = (size_t)(uintptr_t)dst; // host memory (buf NULL)
        m->bytes_copied += (uint64_t)n * sizeof(float);
    } else if ((uintptr_t)e->data % type_align(e->type) != 0) {
        void *dst = own(L, (size_t)e->nbytes);
        if (!dst) return fail(L, NM_ERR_NOMEM, "out of memory copying '%s'", name);
        memcpy(dst, e->data, (size_t)e->nbytes);
        t->offs = (size_t)(uintptr_t)dst;
        m->bytes_copied += e->nbytes;
    } else {
        t->offs = (size_t)(uintptr_t)e->data; // the read-only mapping: weights are never written
        m->bytes_mapped += e->nbytes;
    }
    if (k == K_VEC) {
        const float *f = nm_tensor_host(t);
        for (int64_t i = 0; i < n; i++)
            if (!isfinite(f[i])) return fail(L, NM_ERR_FORMAT, "tensor '%s' holds non-finite values", name);
    }
    return NM_OK; // t->name stays NULL: names in the files are not NUL-terminated
}

#define B1(t, name, k, a, req) bind(L, t, name, k, 1, (const int64_t[]){a}, req)
#define B2(t, name, k, a, b, req) bind(L, t, name, k, 2, (const int64_t[]){a, b}, req)

static nm_status bind_attn(loader *L, nm_whisper_attn *at, const char *pre, const char *ln, int64_t d) {
    char n[MAX_NAME];
    nm_status st;
#define N(suffix) (snprintf(n, sizeof n, "%s.%s", pre, suffix), n)
#define NL(suffix) (snprintf(n, sizeof n, "%s.%s", ln, suffix), n)
    if ((st = B1(&at->ln_w, NL("weight"), K_VEC, d, true)) || (st = B1(&at->ln_b, NL("bias"), K_VEC, d, true)) ||
        (st = B2(&at->q_w, N("query.weight"), K_MAT, d, d, true)) ||
        (st = B1(&at->q_b, N("query.bias"), K_VEC, d, true)) ||
        (st = B2(&at->k_w, N("key.weight"), K_MAT, d, d, true)) ||
        (st = B1(&at->k_b, N("key.bias"), K_VEC, d, false)) ||
        (st = B2(&at->v_w, N("value.weight"), K_MAT, d, d, true)) ||
        (st = B1(&at->v_b, N("value.bias"), K_VEC, d, true)) ||
        (st = B2(&at->o_w, N("out.weight"), K_MAT, d, d, true)) ||
        (st = B1(&at->o_b, N("out.bias"), K_VEC, d, true)))
        return st;
#undef N
#undef NL
    return NM_OK;
}

static nm_status bind_mlp(loader *L, nm_whisper_mlp *ml, const char *pre, int64_t d) {
    char n[MAX_NAME];
    nm_status st;
#define N(suffix) (snprintf(n, sizeof n, "%s.%s", pre, suffix), n)
    if ((st = B1(&ml->ln_w, N("mlp_ln.weight"), K_VEC, d, true)) ||
        (st = B1(&ml->ln_b, N("mlp_ln.bias"), K_VEC, d, true)) ||
        (st = B2(&ml->fc1_w, N("mlp.0.weight"), K_MAT, d, 4 * d, true)) ||
        (st = B1(&ml->fc1_b, N("mlp.0.bias"), K_VEC, 4 * d, true)) ||
        (st = B2(&ml->fc2_w, N("mlp.2.weight"), K_MAT, 4 * d, d, true)) ||
        (st = B1(&ml->fc2_b, N("mlp.2.bias"), K_VEC, d, true)))
        return st;
#undef N
    return NM_OK;
}

static nm_status bind_all(loader *L) {
    nm_whisper_model *m = L->m;
    const nm_whisper_hparams *hp = &m->hp;
    const int64_t d = hp->n_audio_state;
    nm_status st;
    char pre[MAX_NAME], ln[MAX_NAME];

    if ((st = B2(&m->e_pe, "encoder.positional_embedding", K_VEC, d, hp->n_audio_ctx, false))) return st;
    if (!nm_tensor_is_set(&m->e_pe)) {
        float *pe = own(L, (size_t)d * (size_t)hp->n_audio_ctx * sizeof(float));
        if (!pe) return fail(L, NM_ERR_NOMEM, "out of memory for the encoder positions");
        nm_whisper_sinusoids(pe, hp->n_audio_ctx, (int32_t)d);
        m->e_pe = nm_tensor_at(pe, NM_TYPE_F32, d, hp->n_audio_ctx);
        m->e_pe_computed = true;
    }
    if ((st = bind(L, &m->conv1_w, "encoder.conv1.weight", K_CONV, 3, (const int64_t[]){3, hp->n_mels, d}, true)) ||
        (st = B1(&m->conv1_b, "encoder.conv1.bias", K_VEC, d, true)) ||
        (st = bind(L, &m->conv2_w, "encoder.conv2.weight", K_CONV, 3, (const int64_t[]){3, d, d}, true)) ||
        (st = B1(&m->conv2_b, "encoder.conv2.bias", K_VEC, d, true)) ||
        (st = B1(&m->e_ln_w, "encoder.ln_post.weight", K_VEC, d, true)) ||
        (st = B1(&m->e_ln_b, "encoder.ln_post.bias", K_VEC, d, true)))
        return st;
    for (int i = 0; i < hp->n_audio_layer; i++) {
        snprintf(pre, sizeof pre, "encoder.blocks.%d.attn", i);
        snprintf(ln, sizeof ln, "encoder.blocks.%d.attn_ln", i);
        if ((st = bind_attn(L, &m->enc[i].attn, pre, ln, d))) return st;
        snprintf(pre, sizeof pre, "encoder.blocks.%d", i);
        if ((st = bind_mlp(L, &m->enc[i].mlp, pre, d))) return st;
    }
    if ((st = B2(&m->d_pe, "decoder.positional_embedding", K_VEC, d, hp->n_text_ctx, true)) ||
        (st = B2(&m->d_te, "decoder.token_embedding.weight", K_MAT, d, hp->n_vocab, true)) ||
        (st = B1(&m->d_ln_w, "decoder.ln.weight", K_VEC, d, true)) ||
        (st = B1(&m->d_ln_b, "decoder.ln.bias", K_VEC, d, true)))
        return st;
    for (int i = 0; i < hp->n_text_layer; i++) {
        snprintf(pre, sizeof pre, "decoder.blocks.%d.attn", i);
        snprintf(ln, sizeof ln, "decoder.blocks.%d.attn_ln", i);
        if ((st = bind_attn(L, &m->dec[i].attn, pre, ln, d))) return st;
        snprintf(pre, sizeof pre, "decoder.blocks.%d.cross_attn", i);
        snprintf(ln, sizeof ln, "decoder.blocks.%d.cross_attn_ln", i);
        if ((st = bind_attn(L, &m->dec[i].cross, pre, ln, d))) return st;
        snprintf(pre, sizeof pre, "decoder.blocks.%d", i);
        if ((st = bind_mlp(L, &m->dec[i].mlp, pre, d))) return st;
    }
    m->wtype = m->d_te.type;
    return NM_OK;
}

#undef B1
#undef B2

// ---- hyperparameters -----------------------------------------------------------------

static nm_status check_hparams(loader *L) {
    const nm_whisper_hparams *h = &L->m->hp;
    struct { const char *name; int32_t v, lo, hi; } c[] = {
        {"n_vocab", h->n_vocab, 1, 1 << 20},          {"n_audio_ctx", h->n_audio_ctx, 1, 1 << 16},
        {"n_audio_state", h->n_audio_state, 2, 1 << 15}, {"n_audio_head", h->n_audio_head, 1, 1 << 10},
        {"n_audio_layer", h->n_audio_layer, 1, 256},  {"n_text_ctx", h->n_text_ctx, 1, 1 << 16},
        {"n_text_state", h->n_text_state, 2, 1 << 15}, {"n_text_head", h->n_text_head, 1, 1 << 10},
        {"n_text_layer", h->n_text_layer, 1, 256},    {"n_mels", h->n_mels, 1, 512},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
        if (c[i].v < c[i].lo || c[i].v > c[i].hi)
            return fail(L, NM_ERR_FORMAT, "%s = %d is out of range [%d, %d]", c[i].name, c[i].v, c[i].lo, c[i].hi);
    if (h->n_text_state != h->n_audio_state)
        return fail(L, NM_ERR_FORMAT, "n_text_state %d differs from n_audio_state %d", h->n_text_state, h->n_audio_state);
    if (h->n_audio_state % h->n_audio_head || h->n_text_state % h->n_text_head)
        return fail(L, NM_ERR_FORMAT, "the head counts (%d, %d) do not divide the width %d", h->n_audio_head,
                    h->n_text_head, h->n_audio_state);
    if (h->n_audio_state % 2)
        return fail(L, NM_ERR_FORMAT, "n_audio_state %d is odd (the sinusoids need pairs)", h->n_audio_state);
    return NM_OK;
}

static nm_status alloc_layers(loader *L) {
    priv *p = L->p;
    p->enc = calloc((size_t)L->m->hp.n_audio_layer, sizeof *p->enc);
    p->dec = calloc((size_t)L->m->hp.n_text_layer, sizeof *p->dec);
    if (!p->enc || !p->dec) return fail(L, NM_ERR_NOMEM, "out of memory for the layer tables");
    L->m->enc = p->enc;
    L->m->dec = p->dec;
    return NM_OK;
}

// Fills the mel-filter pointer and checks the values.
static nm_status check_filters(loader *L, const float *f, int32_t n_mel, int32_t n_bins) {
    if (n_mel != L->m->hp.n_mels)
        return fail(L, NM_ERR_FORMAT, "mel filterbank has %d filters, n_mels is %d", n_mel, L->m->hp.n_mels);
    if (n_bins != N_FFT_BINS)
        return fail(L, NM_ERR_UNSUPPORTED, "mel filterbank has %d frequency bins; whisper's n_fft 400 gives %d",
                    n_bins, N_FFT_BINS);
    for (size_t i = 0; i < (size_t)n_mel * (size_t)n_bins; i++)
        if (!isfinite(f[i]) || f[i] < 0) return fail(L, NM_ERR_FORMAT, "mel filter value %zu is %g", i, (double)f[i]);
    L->m->mel_filters = f;
    L->m->hp.n_fft_bins = n_bins;
    return NM_OK;
}

// ---- GGUF ---------------------------------------------------------------------------

// GPT-2's byte <-> code point map (printable code points stand for bytes):
// bytes '!'..'~', 0xA1..0xAC, 0xAE..0xFF are themselves; the other 68 bytes
// are 256, 257, ... in byte order.
static void byte_decoder(int16_t dec[324]) {
    for (int i = 0; i < 324; i++) dec[i] = -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        dec[printable ? b : 256 + n++] = (int16_t)b;
    }
}

// Decodes one UTF-8 code point from s[0..n); returns its length or 0 if invalid.
static int utf8_cp(const uint8_t *s, uint64_t n, uint32_t *cp) {
    if (n == 0) return 0;
    if (s[0] < 0x80) { *cp = s[0]; return 1; }
    int len = (s[0] & 0xE0) == 0xC0 ? 2 : (s[0] & 0xF0) == 0xE0 ? 3 : (s[0] & 0xF8) == 0xF0 ? 4 : 0;
    if (!len || (uint64_t)len > n) return 0;
    uint32_t c = s[0] & (0x7F >> len);
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        c = (c << 6) | (s[i] & 0x3F);
    }
    *cp = c;
    return len;
}

static nm_status gguf_u32(loader *L, const char *key, int32_t *out) {
    int64_t v;
    if (!nm_gguf_find(L->p->g, key)) return fail(L, NM_ERR_FORMAT, "missing metadata key '%s'", key);
    if (!nm_gguf_get_i64(L->p->g, key, &v) || v < 0 || v > INT32_MAX)
        return fail(L, NM_ERR_FORMAT, "metadata '%s' is not a valid count", key);
    *out = (int32_t)v;
    return NM_OK;
}

// An optional array of integers into p->ints at *used.
static nm_status gguf_ints(loader *L, const char *key, int32_t *dst, int32_t *n_out, int32_t max, int32_t lo,
                           int32_t hi) {
    const nm_gguf_kv *kv = nm_gguf_find(L->p->g, key);
    *n_out = 0;
    if (!kv) return NM_OK;
    if (kv->type != NM_GGUF_ARRAY || nm_gguf_vtype_size(kv->arr_type) == 0 || kv->arr_type == NM_GGUF_FLOAT32 ||
        kv->arr_type == NM_GGUF_FLOAT64 || kv->arr_type == NM_GGUF_BOOL)
        return fail(L, NM_ERR_FORMAT, "metadata '%s' is not an array of integers", key);
    if (kv->arr_n > (uint64_t)max) return fail(L, NM_ERR_FORMAT, "metadata '%s' has %llu entries", key,
                                               (unsigned long long)kv->arr_n);
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        double v = nm_gguf_arr_num(kv, i);
        if (!(v >= lo && v < hi)) return fail(L, NM_ERR_FORMAT, "metadata '%s'[%llu] = %g is out of range", key,
                                              (unsigned long long)i, v);
        dst[i] = (int32_t)v;
    }
    *n_out = (int32_t)kv->arr_n;
    return NM_OK;
}

static nm_status load_gguf(loader *L) {
    nm_whisper_model *m = L->m;
    priv *p = L->p;
    nm_gguf *g = p->g;
    nm_status st;
    nm_str arch;
    if (!nm_gguf_get_str(g, "general.architecture", &arch) || !nm_str_eq(arch, "whisper"))
        return fail(L, NM_ERR_UNSUPPORTED, "GGUF general.architecture is not 'whisper'");
    nm_whisper_hparams *h = &m->hp;
    if ((st = gguf_u32(L, "whisper.n_vocab", &h->n_vocab)) || (st = gguf_u32(L, "whisper.n_audio_ctx", &h->n_audio_ctx)) ||
        (st = gguf_u32(L, "whisper.n_audio_state", &h->n_audio_state)) ||
        (st = gguf_u32(L, "whisper.n_audio_head", &h->n_audio_head)) ||
        (st = gguf_u32(L, "whisper.n_audio_layer", &h->n_audio_layer)) ||
        (st = gguf_u32(L, "whisper.n_text_ctx", &h->n_text_ctx)) ||
        (st = gguf_u32(L, "whisper.n_text_state", &h->n_text_state)) ||
        (st = gguf_u32(L, "whisper.n_text_head", &h->n_text_head)) ||
        (st = gguf_u32(L, "whisper.n_text_layer", &h->n_text_layer)) ||
        (st = gguf_u32(L, "whisper.n_mels", &h->n_mels)) || (st = check_hparams(L)))
        return st;
    nm_str name;
    snprintf(m->name, sizeof m->name, "whisper");
    if (nm_gguf_get_str(g, "general.name", &name))
        snprintf(m->name, sizeof m->name, "%.*s", (int)(name.len < 63 ? name.len : 63), name.ptr);

    // Tensor directory.
    const int64_t nt = nm_gguf_n_tensors(g);
    p->dir = calloc((size_t)(nt ? nt : 1), sizeof *p->dir);
    if (!p->dir) return fail(L, NM_ERR_NOMEM, "out of memory for %lld tensors", (long long)nt);
    for (int64_t i = 0; i < nt; i++) {
        const nm_gguf_tensor *t = nm_gguf_tensor_at(g, i);
        entry *e = &p->dir[i];
        if (t->name.len >= MAX_NAME) return fail(L, NM_ERR_FORMAT, "tensor %lld has a %llu-byte name", (long long)i,
                                                 (unsigned long long)t->name.len);
        e->name = t->name.ptr;
        e->name_len = (uint32_t)t->name.len;
        e->type = t->type;
        e->n_dims = t->n_dims;
        for (int j = 0; j < 4; j++) e->ne[j] = t->ne[j];
        e->data = t->data;
        e->nbytes = t->nbytes;
    }
    p->n_dir = nt;

    // Mel filters: tensor [n_fft_bins, n_mels] f32.
    entry *mf = find_entry(L, "mel_filters");
    if (!mf) return fail(L, NM_ERR_FORMAT, "missing tensor 'mel_filters'");
    mf->used = true;
    if (mf->type != NM_TYPE_F32 || mf->ne[2] != 1 || mf->ne[3] != 1 || mf->ne[0] > 4096 || mf->ne[1] > 4096 ||
        (uintptr_t)mf->data % 4)
        return fail(L, NM_ERR_FORMAT, "tensor 'mel_filters' must be an aligned f32 [n_fft/2+1, n_mels] matrix");
    if ((st = check_filters(L, (const float *)mf->data, (int32_t)mf->ne[1], (int32_t)mf->ne[0]))) return st;

    // Special tokens and languages.
    nm_whisper_special *s = &m->special;
    if ((st = gguf_u32(L, "whisper.token.eot", &s->eot)) || (st = gguf_u32(L, "whisper.token.sot", &s->sot)) ||
        (st = gguf_u32(L, "whisper.token.translate", &s->translate)) ||
        (st = gguf_u32(L, "whisper.token.transcribe", &s->transcribe)) ||
        (st = gguf_u32(L, "whisper.token.solm", &s->solm)) || (st = gguf_u32(L, "whisper.token.prev", &s->prev)) ||
        (st = gguf_u32(L, "whisper.token.nospeech", &s->nospeech)) ||
        (st = gguf_u32(L, "whisper.token.notimestamps", &s->notimestamps)) ||
        (st = gguf_u32(L, "whisper.token.timestamp_begin", &s->timestamp_begin)))
        return st;
    const int32_t ids[] = {s->eot, s->sot, s->translate, s->transcribe, s->solm, s->prev, s->nospeech,
                           s->notimestamps, s->timestamp_begin};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
        if (ids[i] >= h->n_vocab) return fail(L, NM_ERR_FORMAT, "special token id %d is beyond n_vocab %d", ids[i], h->n_vocab);
    s->lang_begin = s->sot + 1;
    s->n_langs = s->translate - s->lang_begin;
    if (s->n_langs < 0 || s->timestamp_begin <= s->notimestamps)
        return fail(L, NM_ERR_FORMAT, "special token ids are out of whisper's order");
    const nm_gguf_kv *lk = nm_gguf_find(g, "whisper.languages");
    if (!lk || lk->type != NM_GGUF_ARRAY || lk->arr_type != NM_GGUF_STRING || lk->arr_n != (uint64_t)s->n_langs)
        return fail(L, NM_ERR_FORMAT, "metadata 'whisper.languages' must list the %d language codes", s->n_langs);
    nm_str *codes = calloc((size_t)s->n_langs + 1, sizeof *codes);
    p->langs = calloc((size_t)s->n_langs + 1, sizeof *p->langs);
    if (!codes || !p->langs) { free(codes); return fail(L, NM_ERR_NOMEM, "out of memory for languages"); }
    nm_gguf_arr_strings(lk, codes, (uint64_t)s->n_langs);
    for (int32_t i = 0; i < s->n_langs; i++) {
        if (codes[i].len == 0 || codes[i].len > 15 || memchr(codes[i].ptr, 0, codes[i].len)) {
            free(codes);
            return fail(L, NM_ERR_FORMAT, "language code %d is empty, too long or holds a NUL", i);
        }
        p->langs[i] = strndup(codes[i].ptr, codes[i].len);
        if (!p->langs[i]) { free(codes); return fail(L, NM_ERR_NOMEM, "out of memory for languages"); }
    }
    free(codes);
    m->lang_codes = (const char *const *)p->langs;

    // Vocabulary: GPT-2 byte-level strings, decoded to bytes.
    const nm_gguf_kv *tk = nm_gguf_find(g, "whisper.tokenizer.tokens");
    if (!tk || tk->type != NM_GGUF_ARRAY || tk->arr_type != NM_GGUF_STRING || tk->arr_n != (uint64_t)h->n_vocab)
        return fail(L, NM_ERR_FORMAT, "metadata 'whisper.tokenizer.tokens' must be %d strings", h->n_vocab);
    nm_str *toks = malloc((size_t)h->n_vocab * sizeof *toks);
    if (!toks) return fail(L, NM_ERR_NOMEM, "out of memory for the vocabulary");
    nm_gguf_arr_strings(tk, toks, (uint64_t)h->n_vocab);
    uint64_t total = 0;
    for (int32_t i = 0; i < h->n_vocab; i++) total += toks[i].len;
    p->tok_off = malloc(((size_t)h->n_vocab + 1) * sizeof *p->tok_off);
    p->tok_data = malloc(total ? (size_t)total : 1);
    if (total > UINT32_MAX || !p->tok_off || !p->tok_data) {
        free(toks);
        return fail(L, NM_ERR_NOMEM, "vocabulary of %llu bytes", (unsigned long long)total);
    }
    int16_t dec[324];
    byte_decoder(dec);
    uint32_t off = 0;
    for (int32_t i = 0; i < h->n_vocab; i++) {
        p->tok_off[i] = off;
        const uint8_t *q = (const uint8_t *)toks[i].ptr;
        uint64_t left = toks[i].len;
        while (left) {
            uint32_t cp;
            int n = utf8_cp(q, left, &cp);
            if (!n || cp >= 324 || dec[cp] < 0) {
                free(toks);
                return fail(L, NM_ERR_FORMAT, "token %d is not GPT-2 byte-level BPE text", i);
            }
            p->tok_data[off++] = (char)dec[cp];
            q += n;
            left -= (uint64_t)n;
        }
    }
    p->tok_off[h->n_vocab] = off;
    free(toks);
    m->tok_data = p->tok_data;
    m->tok_off = p->tok_off;
    // The special ids must name what they claim.
    char want[32];
    const int32_t named[] = {s->eot, s->sot, s->transcribe, s->notimestamps, s->timestamp_begin};
    for (size_t i = 0; i < sizeof named / sizeof named[0]; i++) {
        special_name(s, m->lang_codes, named[i], want, sizeof want);
        uint32_t len;
        const char *t = nm_whisper_token(m, named[i], &len);
        if (len != strlen(want) || memcmp(t, want, len) != 0)
            return fail(L, NM_ERR_FORMAT, "token %d is '%.*s', expected '%s'", named[i], (int)(len < 40 ? len : 40), t, want);
    }

    // Suppress lists and alignment heads.
    const int32_t cap = 4 * 65536;
    const nm_gguf_kv *k1 = nm_gguf_find(g, "whisper.suppress_tokens"), *k2 = nm_gguf_find(g, "whisper.begin_suppress_tokens"),
                     *k3 = nm_gguf_find(g, "whisper.alignment_heads");
    uint64_t n_ints = (k1 ? k1->arr_n : 0) + (k2 ? k2->arr_n : 0) + (k3 ? k3->arr_n : 0);
    if (n_ints > (uint64_t)cap) return fail(L, NM_ERR_FORMAT, "suppress lists of %llu entries", (unsigned long long)n_ints);
    p->ints = malloc((size_t)(n_ints ? n_ints : 1) * sizeof *p->ints);
    if (!p->ints) return fail(L, NM_ERR_NOMEM, "out of memory for the suppress lists");
    int32_t used = 0, n;
    if ((st = gguf_ints(L, "whisper.suppress_tokens", p->ints, &n, cap, 0, h->n_vocab))) return st;
    m->suppress = p->ints;
    m->n_suppress = n;
    used += n;
    if ((st = gguf_ints(L, "whisper.begin_suppress_tokens", p->ints + used, &n, cap, 0, h->n_vocab))) return st;
    m->begin_suppress = p->ints + used;
    m->n_begin_suppress = n;
    used += n;
    const int32_t max_head = h->n_text_layer > h->n_text_head ? h->n_text_layer : h->n_text_head;
    if ((st = gguf_ints(L, "whisper.alignment_heads", p->ints + used, &n, cap, 0, max_head))) return st;
    if (n % 2) return fail(L, NM_ERR_FORMAT, "metadata 'whisper.alignment_heads' has an odd count");
    for (int32_t i = 0; i < n; i += 2)
        if (p->ints[used + i] >= h->n_text_layer || p->ints[used + i + 1] >= h->n_text_head)
            return fail(L, NM_ERR_FORMAT, "alignment head (%d, %d) is out of range", p->ints[used + i],
                        p->ints[used + i + 1]);
    m->align_heads = p->ints + used;
    m->n_align_heads = n / 2;
    return NM_OK;
}

// ---- ggml .bin -------------------------------------------------------------------------

typedef struct cursor {
    const uint8_t *base;
    size_t size, pos;
} cursor;

static bool rd_i32(cursor *c, int32_t *v) {
    if (c->size - c->pos < 4) return false;
    memcpy(v, c->base + c->pos, 4);
    c->pos += 4;
    return true;
}

static nm_status load_bin(loader *L, const uint8_t *base, size_t size) {
    nm_whisper_model *m = L->m;
    priv *p = L->p;
    nm_status st;
    cursor c = {base, size, 4}; // past the magic
    int32_t hv[11];
    for (int i = 0; i < 11; i++)
        if (!rd_i32(&c, &hv[i])) return fail(L, NM_ERR_FORMAT, "truncated ggml header (%zu bytes)", size);
    nm_whisper_hparams *h = &m->hp;
    *h = (nm_whisper_hparams){hv[0], hv[1], hv[2], hv[3], hv[4], hv[5], hv[6], hv[7], hv[8], hv[9], 0};
    const int32_t ftype = hv[10];
    if ((st = check_hparams(L))) return st;
    if (ftype < 0) return fail(L, NM_ERR_FORMAT, "ftype %d is negative", ftype);

    // Mel filters (copied: the file gives no alignment).
    int32_t n_mel, n_fft;
    if (!rd_i32(&c, &n_mel) || !rd_i32(&c, &n_fft)) return fail(L, NM_ERR_FORMAT, "truncated before the mel filters");
    if (n_mel < 1 || n_mel > 512 || n_fft < 1 || n_fft > 4096)
        return fail(L, NM_ERR_FORMAT, "mel filterbank of %d x %d", n_mel, n_fft);
    const size_t fb = (size_t)n_mel * (size_t)n_fft * sizeof(float);
    if (c.size - c.pos < fb) return fail(L, NM_ERR_FORMAT, "truncated in the mel filters");
    p->filters = malloc(fb);
    if (!p->filters) return fail(L, NM_ERR_NOMEM, "out of memory for the mel filters");
    memcpy(p->filters, c.base + c.pos, fb);
    c.pos += fb;
    if ((st = check_filters(L, p->filters, n_mel, n_fft))) return st;

    // Vocabulary: the file's tokens, then whisper's special names for the rest.
    if ((st = derive_special(L, h->n_vocab, &m->special))) return st;
    m->lang_codes = k_langs;
    int32_t n_tok;
    if (!rd_i32(&c, &n_tok)) return fail(L, NM_ERR_FORMAT, "truncated before the vocabulary");
    if (n_tok < 0 || n_tok > h->n_vocab)
        return fail(L, NM_ERR_FORMAT, "vocabulary of %d tokens for n_vocab %d", n_tok, h->n_vocab);
    const size_t vocab_start = c.pos;
    uint64_t total = 0;
    for (int32_t i = 0; i < n_tok; i++) {
        int32_t len;
        if (!rd_i32(&c, &len)) return fail(L, NM_ERR_FORMAT, "truncated in the vocabulary (token %d)", i);
        if (len < 0 || (size_t)len > c.size - c.pos)
            return fail(L, NM_ERR_FORMAT, "token %d has length %d, past the end of the file", i, len);
        c.pos += (size_t)len;
        total += (uint64_t)len;
    }
    // Tensors until the end of the file. At most as many as whisper has
    // (whisper.cpp's count: 10 + 15 + 15 per encoder layer + 24 per decoder layer).
    const int64_t max_t = 25 + 15 * (int64_t)h->n_audio_layer + 24 * (int64_t)h->n_text_layer + 8;
    p->dir = calloc((size_t)max_t, sizeof *p->dir);
    if (!p->dir) return fail(L, NM_ERR_NOMEM, "out of memory for the tensor table");
    while (c.pos < c.size) {
        const size_t at = c.pos;
        int32_t n_dims, name_len, type;
        if (!rd_i32(&c, &n_dims) || !rd_i32(&c, &name_len) || !rd_i32(&c, &type))
            return fail(L, NM_ERR_FORMAT, "truncated tensor header at offset %zu", at);
        if (p->n_dir == max_t) return fail(L, NM_ERR_FORMAT, "more than %lld tensors", (long long)max_t);
        if (n_dims < 1 || n_dims > 4) return fail(L, NM_ERR_FORMAT, "tensor at offset %zu has %d dims", at, n_dims);
        if (name_len < 1 || name_len >= MAX_NAME)
            return fail(L, NM_ERR_FORMAT, "tensor at offset %zu has a name of %d bytes", at, name_len);
        entry *e = &p->dir[p->n_dir];
        e->n_dims = (uint32_t)n_dims;
        e->ne[0] = e->ne[1] = e->ne[2] = e->ne[3] = 1;
        for (int i = 0; i < n_dims; i++) {
            int32_t ne;
            if (!rd_i32(&c, &ne)) return fail(L, NM_ERR_FORMAT, "truncated tensor header at offset %zu", at);
            if (ne < 1) return fail(L, NM_ERR_FORMAT, "tensor at offset %zu has dimension %d = %d", at, i, ne);
            e->ne[i] = ne;
        }
        if (c.size - c.pos < (size_t)name_len) return fail(L, NM_ERR_FORMAT, "truncated tensor name at offset %zu", at);
        e->name = (const char *)c.base + c.pos;
        e->name_len = (uint32_t)name_len;
        c.pos += (size_t)name_len;
        if (memchr(e->name, 0, e->name_len)) return fail(L, NM_ERR_FORMAT, "tensor name at offset %zu holds a NUL", at);
        const nm_type_traits *tr = type >= 0 ? nm_type_traits_get((uint32_t)type) : NULL;
        if (!tr) return fail(L, NM_ERR_FORMAT, "tensor '%.*s' has unknown type %d", name_len, e->name, type);
        if (!tr->supported)
            return fail(L, NM_ERR_UNSUPPORTED, "tensor '%.*s' has unsupported type %s", name_len, e->name, tr->name);
        e->type = (uint32_t)type;
        const size_t row = nm_row_size(e->type, e->ne[0]);
        if (!row) return fail(L, NM_ERR_FORMAT, "tensor '%.*s' (%s): rows of %lld are not whole blocks", name_len,
                              e->name, tr->name, (long long)e->ne[0]);
        uint64_t nb = row;
        for (int i = 1; i < 4; i++)
            if (__builtin_mul_overflow(nb, (uint64_t)e->ne[i], &nb))
                return fail(L, NM_ERR_FORMAT, "tensor '%.*s' is too large", name_len, e->name);
        if (nb > c.size - c.pos)
            return fail(L, NM_ERR_FORMAT, "tensor '%.*s' needs %llu bytes, %zu remain (truncated file?)", name_len, e->name,
                        (unsigned long long)nb, c.size - c.pos);
        e->data = c.base + c.pos;
        e->nbytes = nb;
        c.pos += (size_t)nb;
        for (int64_t j = 0; j < p->n_dir; j++)
            if (p->dir[j].name_len == e->name_len && !memcmp(p->dir[j].name, e->name, e->name_len))
                return fail(L, NM_ERR_FORMAT, "duplicate tensor '%.*s'", name_len, e->name);
        p->n_dir++;
    }
    // The vocabulary tables, once the whole file is known to parse.
    total += 32ull * (uint64_t)(h->n_vocab - n_tok); // room for the special names
    p->tok_off = malloc(((size_t)h->n_vocab + 1) * sizeof *p->tok_off);
    p->tok_data = malloc((size_t)total + 1);
    if (total > UINT32_MAX || !p->tok_off || !p->tok_data) return fail(L, NM_ERR_NOMEM, "out of memory for the vocabulary");
    cursor v = {base, size, vocab_start};
    uint32_t off = 0;
    for (int32_t i = 0; i < n_tok; i++) {
        int32_t len = 0;
        rd_i32(&v, &len); // validated by the first pass
        p->tok_off[i] = off;
        memcpy(p->tok_data + off, v.base + v.pos, (size_t)len);
        v.pos += (size_t)len;
        off += (uint32_t)len;
    }
    for (int32_t i = n_tok; i < h->n_vocab; i++) {
        char buf[32];
        special_name(&m->special, m->lang_codes, i, buf, sizeof buf);
        p->tok_off[i] = off;
        size_t len = strlen(buf);
        memcpy(p->tok_data + off, buf, len);
        off += (uint32_t)len;
    }
    p->tok_off[h->n_vocab] = off;
    m->tok_data = p->tok_data;
    m->tok_off = p->tok_off;

    static const char *const sizes[] = {[4] = "tiny", [6] = "base", [12] = "small", [24] = "medium", [32] = "large"};
    const char *sz = h->n_audio_layer < 33 && sizes[h->n_audio_layer] ? sizes[h->n_audio_layer] : "custom";
    snprintf(m->name, sizeof m->name, "ggml-%s%s", sz, nm_whisper_is_multilingual(m) ? "" : ".en");
    return NM_OK;
}

// ---- entry points ------------------------------------------------------------------------

void nm_whisper_model_free(nm_whisper_model *m) {
    if (!m) return;
    priv *p = m->priv;
    if (p) {
        nm_gguf_close(p->g);
        if (p->map) munmap(p->map, p->map_size);
        free(p->dir);
        free(p->filters);
        free(p->tok_data);
        free(p->tok_off);
        if (p->langs)
            for (char **l = p->langs; *l; l++) free(*l);
        free(p->langs);
        free(p->ints);
        for (size_t i = 0; i < p->n_owned; i++) free(p->owned[i]);
        free(p->owned);
        free(p->enc);
        free(p->dec);
        free(p);
    }
    free(m);
}

// buf/size: the whole file. gguf_path non-NULL: open the GGUF from the path
// (it maps it itself); else over the bytes.
static nm_status load_common(const uint8_t *buf, size_t size, const char *gguf_path, void *map, nm_whisper_model **out,
                             char *err, size_t err_size) {
    *out = NULL;
    if (err && err_size) err[0] = '\0';
    nm_whisper_model *m = calloc(1, sizeof *m);
    priv *p = calloc(1, sizeof *p);
    loader L = {m, p, err, err_size};
    if (!m || !p) {
        free(m);
        free(p);
        if (map) munmap(map, size);
        return fail(&L, NM_ERR_NOMEM, "out of memory");
    }
    m->priv = p;
    p->map = map;
    p->map_size = map ? size : 0;
    nm_status st;
    uint32_t magic = 0;
    if (size >= 4) memcpy(&magic, buf, 4);
    if (size >= 4 && magic == NM_GGUF_MAGIC) {
        m->format = NM_WHISPER_GGUF;
        char gerr[200] = "";
        st = gguf_path ? nm_gguf_open(gguf_path, &p->g, gerr, sizeof gerr)
                       : nm_gguf_open_memory(buf, size, &p->g, gerr, sizeof gerr);
        if (st) fail(&L, st, "%s", gerr);
        else st = load_gguf(&L);
    } else if (size >= 4 && magic == BIN_MAGIC) {
        m->format = NM_WHISPER_GGML_BIN;
        st = load_bin(&L, buf, size);
    } else {
        st = fail(&L, NM_ERR_FORMAT, "not a whisper model: the file starts with neither 'GGUF' nor the ggml magic");
    }
    if (!st) st = alloc_layers(&L);
    if (!st) st = bind_all(&L);
    if (!st && m->format == NM_WHISPER_GGML_BIN)
        for (int64_t i = 0; i < p->n_dir; i++)
            if (!p->dir[i].used) {
                st = fail(&L, NM_ERR_FORMAT, "unknown tensor '%.*s'", (int)p->dir[i].name_len, p->dir[i].name);
                break;
            }
    if (st) {
        nm_whisper_model_free(m);
        return st;
    }
    *out = m;
    return NM_OK;
}

nm_status nm_whisper_model_load_memory(const void *buf, size_t size, nm_whisper_model **out, char *err,
                                       size_t err_size) {
    if (!out || (!buf && size)) {
        if (err && err_size) snprintf(err, err_size, "whisper: invalid arguments");
        if (out) *out = NULL;
        return NM_ERR_INVALID_ARG;
    }
    return load_common(buf, size, NULL, NULL, out, err, err_size);
}

nm_status nm_whisper_model_load(const char *path, nm_whisper_model **out, char *err, size_t err_size) {
    if (!out || !path) {
        if (err && err_size) snprintf(err, err_size, "whisper: invalid arguments");
        if (out) *out = NULL;
        return NM_ERR_INVALID_ARG;
    }
    *out = NULL;
    int fd;
    int64_t fsize;
    char why[512];
    nm_status ost = nm_infile_fd(path, SIZE_MAX, 0, &fd, &fsize, why, sizeof why); // a FIFO: refused, never waited on
    if (ost != NM_OK) {
        if (err && err_size) snprintf(err, err_size, "whisper: %s", why);
        return ost;
    }
    const size_t size = (size_t)fsize;
    if (size < 4) {
        close(fd);
        if (err && err_size) snprintf(err, err_size, "whisper: %s: %zu bytes is too short for a model", path, size);
        return NM_ERR_FORMAT;
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) {
        if (err && err_size) snprintf(err, err_size, "whisper: %s: mmap: %s", path, strerror(e));
        return NM_ERR_IO;
    }
    uint32_t magic;
    memcpy(&magic, map, 4);
    nm_status st;
    if (magic == NM_GGUF_MAGIC) { // the GGUF reader maps the file itself
        munmap(map, size);
        st = load_common((const uint8_t *)&magic, sizeof magic, path, NULL, out, err, err_size);
    } else {
        st = load_common(map, size, NULL, map, out, err, err_size); // the model owns the mapping now
    }
    if (st && err && err_size) {
        char tmp[512];
        snprintf(tmp, sizeof tmp, "%s (%s)", err, path);
        snprintf(err, err_size, "%s", tmp);
    }
    return st;
}

const char *nm_whisper_token(const nm_whisper_model *m, int32_t id, uint32_t *len) {
    if (!m || id < 0 || id >= m->hp.n_vocab) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = m->tok_off[id + 1] - m->tok_off[id];
    return m->tok_data + m->tok_off[id];
}

int32_t nm_whisper_token_find(const nm_whisper_model *m, const char *text) {
    if (!m || !text) return -1;
    const size_t n = strlen(text);
    for (int32_t i = 0; i < m->hp.n_vocab; i++)
        if (m->tok_off[i + 1] - m->tok_off[i] == n && memcmp(m->tok_data + m->tok_off[i], text, n) == 0) return i;
    return -1;
}

const char *nm_whisper_token_text_cpp(const nm_whisper_model *m, int32_t id, char buf[24], uint32_t *len) {
    if (!m || id < m->special.eot || id >= m->hp.n_vocab) return nm_whisper_token(m, id, len);
    // whisper.cpp's names, in the order its loader gives them
    const nm_whisper_special *s = &m->special;
    int w;
    if (id > s->timestamp_begin) w = snprintf(buf, 24, "[_TT_%d]", (int)(id - s->timestamp_begin));
    else if (id == s->eot) w = snprintf(buf, 24, "[_EOT_]");
    else if (id == s->sot) w = snprintf(buf, 24, "[_SOT_]");
    else if (id == s->translate) w = snprintf(buf, 24, "[_TRANSLATE_]");
    else if (id == s->transcribe) w = snprintf(buf, 24, "[_TRANSCRIBE_]");
    else if (id == s->solm) w = snprintf(buf, 24, "[_SOLM_]");
    else if (id == s->prev) w = snprintf(buf, 24, "[_PREV_]");
    else if (id == s->nospeech) w = snprintf(buf, 24, "[_NOSP_]");
    else if (id == s->notimestamps) w = snprintf(buf, 24, "[_NOT_]");
    else if (id == s->timestamp_begin) w = snprintf(buf, 24, "[_BEG_]");
    else if (id > s->sot && id <= s->sot + s->n_langs) w = snprintf(buf, 24, "[_LANG_%.8s]", m->lang_codes[id - s->sot - 1]);
    else w = snprintf(buf, 24, "[_extra_token_%d]", (int)id);
    if (len) *len = (uint32_t)w;
    return buf;
}

// ---- text to tokens, as whisper.cpp's whisper_tokenize -------------------------------
//
// whisper.cpp splits the text with GPT-2's pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?[[:alpha:]]+| ?[[:digit:]]+| ?[^\s[:alpha:][:digit:]]+|\s+(?!\S)|\s+
// (std::regex, ECMAScript: the first alternative that matches wins; classes of
// the "C" locale, so every byte >= 0x80 is "other"), then covers each piece
// greedily with the longest vocabulary entries from its left end (not BPE
// merges). The vocabulary here is the text tokens (ids below <|endoftext|>);
// of tokens with equal bytes the last id wins, as in its token_to_id map.

static bool c_space(uint8_t c) { return c == ' ' || (c >= '\t' && c <= '\r'); }
static bool c_alpha(uint8_t c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
static bool c_digit(uint8_t c) { return c >= '0' && c <= '9'; }
static bool c_other(uint8_t c) { return !c_space(c) && !c_alpha(c) && !c_digit(c); }

// Length of the piece of s[0..n) that the pattern matches at its start (>= 1 for n >= 1).
static size_t piece_len(const uint8_t *s, size_t n) {
    static const char *const contr[] = {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"};
    for (size_t i = 0; i < sizeof contr / sizeof contr[0]; i++) {
        const size_t k = strlen(contr[i]);
        if (n >= k && !memcmp(s, contr[i], k)) return k;
    }
    bool (*const cls[3])(uint8_t) = {c_alpha, c_digit, c_other};
    for (int c = 0; c < 3; c++) {
        size_t i = n >= 2 && s[0] == ' ' && cls[c](s[1]) ? 1 : 0; // " ?" takes the blank when a run follows
        if (i < n && cls[c](s[i])) {
            while (i < n && cls[c](s[i])) i++;
            return i;
        }
    }
    size_t k = 0;
    while (k < n && c_space(s[k])) k++;
    // \s+(?!\S): the run, less its last blank when a non-blank follows; else \s+.
    return k < n && k >= 2 ? k - 1 : k;
}

static uint64_t fnv1a(const uint8_t *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

int32_t nm_whisper_tokenize(const nm_whisper_model *m, const char *text, int32_t *out, int32_t cap) {
    if (!m || !text) return -1;
    const int32_t n_text = m->special.eot;
    size_t size = 1;
    while (size < 2 * (size_t)n_text) size <<= 1;
    int32_t *slot = calloc(size, sizeof *slot); // id + 1, 0 = empty
    if (!slot) return -1;
    uint32_t max_len = 0;
    for (int32_t id = 0; id < n_text; id++) {
        uint32_t len;
        const uint8_t *t = (const uint8_t *)nm_whisper_token(m, id, &len);
        if (len == 0) continue;
        if (len > max_len) max_len = len;
        size_t h = fnv1a(t, len) & (size - 1);
        while (slot[h]) {
            uint32_t l2;
            const char *t2 = nm_whisper_token(m, slot[h] - 1, &l2);
            if (l2 == len && !memcmp(t2, t, len)) break; // the same bytes: the later id wins
            h = (h + 1) & (size - 1);
        }
        slot[h] = id + 1;
    }
    int32_t n_out = 0;
    const uint8_t *s = (const uint8_t *)text;
    size_t n = strlen(text);
    while (n > 0) {
        const size_t w = piece_len(s, n);
        for (size_t i = 0; i < w;) {
            size_t j = w - i < max_len ? w : i + max_len;
            int32_t found = -1;
            for (; j > i && found < 0; j--) {
                size_t h = fnv1a(s + i, j - i) & (size - 1);
                for (; slot[h]; h = (h + 1) & (size - 1)) {
                    uint32_t len;
                    const char *t = nm_whisper_token(m, slot[h] - 1, &len);
                    if (len == j - i && !memcmp(t, s + i, len)) {
                        found = slot[h] - 1;
                        break;
                    }
                }
                if (found >= 0) break;
            }
            if (found >= 0) {
                if (n_out < cap) out[n_out] = found;
                n_out++;
                i = j;
            } else {
                i++; // a byte no token holds (whisper.cpp: "unknown token", skipped)
            }
        }
        s += w;
        n -= w;
    }
    free(slot);
    return n_out;
}

bool nm_whisper_is_multilingual(const nm_whisper_model *m) { return m && m->hp.n_vocab >= 51865; }
