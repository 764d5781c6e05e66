// Whisper model loader (src/bricks/stt/whisper_model.c): both formats.
//  - The converted tiny.en GGUF from set-up (skipped if absent): hparams,
//    special ids, known token strings, mel filters against a slaney filterbank
//    computed here in double precision, stored vs computed encoder positions.
//    It is also written back as a whisper.cpp ggml .bin here and the two loads
//    compared tensor by tensor (NM_WHISPER_BIN=path compares another .bin too,
//    e.g. one from `convert_whisper_ct2.py --ggml-bin`).
//  - Small random models written in both layouts (f32, f16, q8_0 matrices)
//    load to identical models; truncations and byte flips give errors, not
//    crashes; malformed headers give the right status.
// `--filter gen_corpus` with NM_GEN_CORPUS=DIR writes the fuzz seeds
// (tests/fuzz/corpus/whisper_bin).
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bricks/stt/whisper.h"
#include "bricks/stt/whisper_model.h"
#include "gguf/gguf.h"
#include "quant/quant.h"
#include "nmtest.h"

// ---- independent references ------------------------------------------------------------

// Slaney mel scale (librosa's default, htk=False): linear below 1 kHz, log above.
static double ref_hz_to_mel(double f) {
    const double f_sp = 200.0 / 3, min_log_hz = 1000.0, logstep = log(6.4) / 27.0;
    return f < min_log_hz ? f / f_sp : min_log_hz / f_sp + log(f / min_log_hz) / logstep;
}

static double ref_mel_to_hz(double m) {
    const double f_sp = 200.0 / 3, min_log_mel = 1000.0 / f_sp, logstep = log(6.4) / 27.0;
    return m < min_log_mel ? f_sp * m : 1000.0 * exp(logstep * (m - min_log_mel));
}

// librosa.filters.mel(sr, n_fft, n_mels): triangles between consecutive mel
// points, each scaled to unit area (2 / bandwidth in Hz). out (n_mels, n_fft/2+1).
static void ref_mel_filters(double *out, int sr, int n_fft, int n_mels) {
    const int nb = n_fft / 2 + 1;
    double *pts = malloc((size_t)(n_mels + 2) * sizeof *pts);
    const double top = ref_hz_to_mel(sr / 2.0);
    for (int i = 0; i < n_mels + 2; i++) pts[i] = ref_mel_to_hz(top * i / (n_mels + 1));
    for (int m = 0; m < n_mels; m++)
        for (int k = 0; k < nb; k++) {
            const double f = (double)sr / 2 * k / (nb - 1);
            const double up = (f - pts[m]) / (pts[m + 1] - pts[m]), down = (pts[m + 2] - f) / (pts[m + 2] - pts[m + 1]);
            double w = up < down ? up : down;
            out[(size_t)m * nb + k] = (w > 0 ? w : 0) * 2.0 / (pts[m + 2] - pts[m]);
        }
    free(pts);
}

// GPT-2's byte -> printable code point map, written as its definition reads.
static uint32_t gpt2_cp(uint8_t b) {
    if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) return b;
    uint32_t n = 0;
    for (int c = 0; c < b; c++)
        if (!((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE)) n++;
    return 256 + n;
}

// Raw bytes -> byte-level BPE text (UTF-8, NUL-terminated) into out.
static void gpt2_encode(const uint8_t *b, size_t n, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t cp = gpt2_cp(b[i]);
        if (cp < 0x80) out[o++] = (char)cp;
        else { out[o++] = (char)(0xC0 | (cp >> 6)); out[o++] = (char)(0x80 | (cp & 0x3F)); }
    }
    out[o] = '\0';
}

static bool tok_is(const nm_whisper_model *m, int32_t id, const char *s) {
    uint32_t len;
    const char *t = nm_whisper_token(m, id, &len);
    return t && len == strlen(s) && memcmp(t, s, len) == 0;
}

static const char *model_dir(void) {
    static char buf[1024];
    const char *d = getenv("NM_MODEL_DIR");
    if (d && *d) return d;
    const char *home = getenv("HOME");
    snprintf(buf, sizeof buf, "%s/.cache/nanomind/models", home ? home : ".");
    return buf;
}

// ---- tensors of a model in one fixed order, with their names ------------------------------

typedef struct tref {
    char name[96];
    const nm_tensor *t;
    int file_dims;      // dims as whisper.cpp stores it (conv biases: 2, [1, d])
} tref;

static int collect(const nm_whisper_model *m, tref *out) {
    int n = 0;
#define ADD(tt, dims, ...) (snprintf(out[n].name, sizeof out[n].name, __VA_ARGS__), out[n].t = (tt), out[n].file_dims = (dims), n++)
#define ATTN(a, pre, ln)                                                                          \
    ADD(&(a).ln_w, 1, "%s.weight", ln), ADD(&(a).ln_b, 1, "%s.bias", ln),                          \
    ADD(&(a).q_w, 2, "%s.query.weight", pre), ADD(&(a).q_b, 1, "%s.query.bias", pre),              \
    ADD(&(a).k_w, 2, "%s.key.weight", pre), ADD(&(a).v_w, 2, "%s.value.weight", pre),              \
    ADD(&(a).v_b, 1, "%s.value.bias", pre), ADD(&(a).o_w, 2, "%s.out.weight", pre),                \
    ADD(&(a).o_b, 1, "%s.out.bias", pre)
#define MLP(ml, pre)                                                                              \
    ADD(&(ml).ln_w, 1, "%s.mlp_ln.weight", pre), ADD(&(ml).ln_b, 1, "%s.mlp_ln.bias", pre),        \
    ADD(&(ml).fc1_w, 2, "%s.mlp.0.weight", pre), ADD(&(ml).fc1_b, 1, "%s.mlp.0.bias", pre),        \
    ADD(&(ml).fc2_w, 2, "%s.mlp.2.weight", pre), ADD(&(ml).fc2_b, 1, "%s.mlp.2.bias", pre)
    char pre[48], ln[48];
    ADD(&m->e_pe, 2, "encoder.positional_embedding");
    ADD(&m->conv1_w, 3, "encoder.conv1.weight");
    ADD(&m->conv1_b, 2, "encoder.conv1.bias");
    ADD(&m->conv2_w, 3, "encoder.conv2.weight");
    ADD(&m->conv2_b, 2, "encoder.conv2.bias");
    ADD(&m->e_ln_w, 1, "encoder.ln_post.weight");
    ADD(&m->e_ln_b, 1, "encoder.ln_post.bias");
    for (int i = 0; i < m->hp.n_audio_layer; i++) {
        snprintf(pre, sizeof pre, "encoder.blocks.%d.attn", i);
        snprintf(ln, sizeof ln, "encoder.blocks.%d.attn_ln", i);
        ATTN(m->enc[i].attn, pre, ln);
        snprintf(pre, sizeof pre, "encoder.blocks.%d", i);
        MLP(m->enc[i].mlp, pre);
    }
    ADD(&m->d_pe, 2, "decoder.positional_embedding");
    ADD(&m->d_te, 2, "decoder.token_embedding.weight");
    ADD(&m->d_ln_w, 1, "decoder.ln.weight");
    ADD(&m->d_ln_b, 1, "decoder.ln.bias");
    for (int i = 0; i < m->hp.n_text_layer; i++) {
        snprintf(pre, sizeof pre, "decoder.blocks.%d.attn", i);
        snprintf(ln, sizeof ln, "decoder.blocks.%d.attn_ln", i);
        ATTN(m->dec[i].attn, pre, ln);
        snprintf(pre, sizeof pre, "decoder.blocks.%d.cross_attn", i);
        snprintf(ln, sizeof ln, "decoder.blocks.%d.cross_attn_ln", i);
        ATTN(m->dec[i].cross, pre, ln);
        snprintf(pre, sizeof pre, "decoder.blocks.%d", i);
        MLP(m->dec[i].mlp, pre);
    }
#undef ADD
#undef ATTN
#undef MLP
    return n;
}

static int max_tensors(const nm_whisper_hparams *hp) { return 16 + 15 * hp->n_audio_layer + 24 * hp->n_text_layer; }

static size_t tensor_bytes(const nm_tensor *t) {
    return nm_row_size(t->type, t->ne[0]) * (size_t)(t->ne[1] * t->ne[2] * t->ne[3]);
}

// ---- writers -------------------------------------------------------------------------

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 1 << 16;
        while (cap < b->n + n) cap *= 2;
        b->p = realloc(b->p, cap);
        b->cap = cap;
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}

static void put_i32(buf *b, int32_t v) { put(b, &v, 4); }

// Where the writer put things (for targeted corruption).
typedef struct bin_layout {
    size_t vocab_at;      // the token count
    size_t tensor_at[8];  // headers of the first tensors
    int n_tensor_at;
} bin_layout;

// whisper.cpp's layout from a loaded model (tensors in reverse order: the
// loader must not depend on it). n_file_tokens: the ordinary tokens stored.
static buf write_bin(const nm_whisper_model *m, int32_t ftype, bool with_epe, bin_layout *lay) {
    buf b = {0};
    const nm_whisper_hparams *h = &m->hp;
    put_i32(&b, 0x67676d6c);
    const int32_t hv[11] = {h->n_vocab, h->n_audio_ctx, h->n_audio_state, h->n_audio_head, h->n_audio_layer,
                            h->n_text_ctx, h->n_text_state, h->n_text_head, h->n_text_layer, h->n_mels, ftype};
    put(&b, hv, sizeof hv);
    put_i32(&b, h->n_mels);
    put_i32(&b, h->n_fft_bins);
    put(&b, m->mel_filters, (size_t)h->n_mels * (size_t)h->n_fft_bins * sizeof(float));
    if (lay) lay->vocab_at = b.n, lay->n_tensor_at = 0;
    put_i32(&b, m->special.eot);
    for (int32_t i = 0; i < m->special.eot; i++) {
        uint32_t len;
        const char *t = nm_whisper_token(m, i, &len);
        put_i32(&b, (int32_t)len);
        put(&b, t, len);
    }
    tref *tr = calloc((size_t)max_tensors(h), sizeof *tr);
    int n = collect(m, tr);
    for (int i = n - 1; i >= 0; i--) {
        const nm_tensor *t = tr[i].t;
        if (!with_epe && !strcmp(tr[i].name, "encoder.positional_embedding")) continue;
        if (lay && lay->n_tensor_at < 8) lay->tensor_at[lay->n_tensor_at++] = b.n;
        int32_t nd = tr[i].file_dims, ne[4] = {(int32_t)t->ne[0], (int32_t)t->ne[1], (int32_t)t->ne[2], 1};
        if (nd == 2 && t->ne[1] == 1) ne[0] = 1, ne[1] = (int32_t)t->ne[0]; // conv bias [1, d]
        put_i32(&b, nd);
        put_i32(&b, (int32_t)strlen(tr[i].name));
        put_i32(&b, (int32_t)t->type);
        put(&b, ne, (size_t)nd * 4);
        put(&b, tr[i].name, strlen(tr[i].name));
        put(&b, nm_tensor_host(t), tensor_bytes(t));
    }
    free(tr);
    return b;
}

// Our GGUF layout from a loaded model (as convert_whisper_ct2.py writes it).
static buf write_gguf(const nm_whisper_model *m, bool with_epe) {
    const nm_whisper_hparams *h = &m->hp;
    nm_gguf_writer *w = nm_gguf_writer_create();
    nm_gguf_writer_add_str(w, "general.architecture", "whisper");
    nm_gguf_writer_add_str(w, "general.name", "test");
    const char *keys[] = {"n_vocab", "n_audio_ctx", "n_audio_state", "n_audio_head", "n_audio_layer",
                          "n_text_ctx", "n_text_state", "n_text_head", "n_text_layer", "n_mels"};
    const int32_t vals[] = {h->n_vocab, h->n_audio_ctx, h->n_audio_state, h->n_audio_head, h->n_audio_layer,
                            h->n_text_ctx, h->n_text_state, h->n_text_head, h->n_text_layer, h->n_mels};
    char key[96];
    for (int i = 0; i < 10; i++) {
        snprintf(key, sizeof key, "whisper.%s", keys[i]);
        nm_gguf_writer_add_u32(w, key, (uint32_t)vals[i]);
    }
    const nm_whisper_special *s = &m->special;
    const char *sk[] = {"eot", "sot", "translate", "transcribe", "solm", "prev", "nospeech", "notimestamps",
                        "timestamp_begin"};
    const int32_t sv[] = {s->eot, s->sot, s->translate, s->transcribe, s->solm, s->prev, s->nospeech,
                          s->notimestamps, s->timestamp_begin};
    for (int i = 0; i < 9; i++) {
        snprintf(key, sizeof key, "whisper.token.%s", sk[i]);
        nm_gguf_writer_add_u32(w, key, (uint32_t)sv[i]);
    }
    char **toks = calloc((size_t)h->n_vocab, sizeof *toks);
    for (int32_t i = 0; i < h->n_vocab; i++) {
        uint32_t len;
        const char *t = nm_whisper_token(m, i, &len);
        toks[i] = malloc(2 * (size_t)len + 1);
        gpt2_encode((const uint8_t *)t, len, toks[i]);
    }
    nm_gguf_writer_add_arr_str(w, "whisper.tokenizer.tokens", (const char *const *)toks, (uint64_t)h->n_vocab);
    for (int32_t i = 0; i < h->n_vocab; i++) free(toks[i]);
    free(toks);
    nm_gguf_writer_add_arr_str(w, "whisper.languages", m->lang_codes, (uint64_t)s->n_langs);
    nm_gguf_writer_add_arr(w, "whisper.suppress_tokens", NM_GGUF_INT32, m->suppress, (uint64_t)m->n_suppress);
    nm_gguf_writer_add_arr(w, "whisper.begin_suppress_tokens", NM_GGUF_INT32, m->begin_suppress,
                           (uint64_t)m->n_begin_suppress);
    nm_gguf_writer_add_arr(w, "whisper.alignment_heads", NM_GGUF_INT32, m->align_heads, 2 * (uint64_t)m->n_align_heads);
    const int64_t fne[2] = {h->n_fft_bins, h->n_mels};
    nm_gguf_writer_add_tensor(w, "mel_filters", NM_TYPE_F32, 2, fne, m->mel_filters);
    tref *tr = calloc((size_t)max_tensors(h), sizeof *tr);
    int n = collect(m, tr);
    for (int i = 0; i < n; i++) {
        const nm_tensor *t = tr[i].t;
        if (!with_epe && !strcmp(tr[i].name, "encoder.positional_embedding")) continue;
        int64_t ne[3] = {t->ne[0], t->ne[1], t->ne[2]};
        int nd = tr[i].file_dims;
        if (nd == 2 && t->ne[1] == 1) ne[0] = 1, ne[1] = t->ne[0];
        nm_gguf_writer_add_tensor(w, tr[i].name, t->type, (uint32_t)nd, ne, nm_tensor_host(t));
    }
    buf b = {0};
    if (nm_gguf_writer_write_buf(w, &b.p, &b.n) != NM_OK) {
        fprintf(stderr, "  gguf writer: %s\n", nm_gguf_writer_last_error(w));
        b.p = NULL, b.n = 0;
    }
    free(tr);
    nm_gguf_writer_free(w);
    return b;
}

// ---- a random model, built as a loaded model would look ------------------------------------

typedef struct rand_model {
    nm_whisper_model m; // views into the storage below
    nm_whisper_enc_layer enc[2];
    nm_whisper_dec_layer dec[2];
    float *filters;
    char *tok_data;
    uint32_t *tok_off;
    int32_t ints[8];
    void *store[2048];
    int n_store;
} rand_model;

static uint32_t rng_state;
static float frand(void) {
    rng_state = rng_state * 1664525u + 1013904223u;
    return ((float)(rng_state >> 8) / (float)(1 << 24)) * 2.0f - 1.0f;
}

// Fills t with ne0 x ne1 x ne2 random values stored as `type`.
static void rand_tensor(rand_model *r, nm_tensor *t, uint32_t type, int64_t ne0, int64_t ne1, int64_t ne2) {
    *t = (nm_tensor){.type = type, .ne = {ne0, ne1, ne2, 1}};
    const int64_t rows = ne1 * ne2;
    const size_t rb = nm_row_size(type, ne0);
    uint8_t *d = malloc(rb * (size_t)rows);
    float *row = malloc((size_t)ne0 * sizeof *row);
    for (int64_t i = 0; i < rows; i++) {
        for (int64_t j = 0; j < ne0; j++) row[j] = frand() * 0.5f;
        nm_quantize_row_ref(type, row, d + (size_t)i * rb, ne0);
    }
    free(row);
    r->store[r->n_store++] = d;
    t->offs = (size_t)(uintptr_t)d;
}

static const char *const test_langs[] = {
    "en", "zh", "de", "es", "ru", "ko", "fr", "ja", "pt", "tr", "pl", "ca", "nl", "ar", "sv", "it", "id",
    "hi", "fi", "vi", "he", "uk", "el", "ms", "cs", "ro", "da", "hu", "ta", "no", "th", "ur", "hr", "bg",
    "lt", "la", "mi", "ml", "cy", "sk", "te", "fa", "lv", "bn", "sr", "az", "sl", "kn", "et", "mk", "br",
    "eu", "is", "hy", "ne", "mn", "bs", "kk", "sq", "sw", "gl", "mr", "pa", "si", "km", "sn", "yo", "so",
    "af", "oc", "ka", "be", "tg", "sd", "gu", "am", "yi", "lo", "uz", "fo", "ht", "ps", "tk", "nn", "mt",
    "sa", "lb", "my", "bo", "tl", "mg", "as", "tt", "haw", "ln", "ha", "ba", "jw", "su",
};

// An .en-sized vocabulary (the .bin format implies whisper's special ids) with
// a tiny network: d 32, 4 heads, 2 encoder layers, 1 decoder layer.
static void rand_model_init(rand_model *r, uint32_t wtype, uint32_t seed) {
    memset(r, 0, sizeof *r);
    rng_state = seed;
    nm_whisper_model *m = &r->m;
    m->hp = (nm_whisper_hparams){.n_vocab = 51864, .n_audio_ctx = 6, .n_audio_state = 32, .n_audio_head = 4,
                                 .n_audio_layer = 2, .n_text_ctx = 5, .n_text_state = 32, .n_text_head = 4,
                                 .n_text_layer = 1, .n_mels = 80, .n_fft_bins = 201};
    const int64_t d = 32;
    double *ref = malloc(80 * 201 * sizeof *ref);
    ref_mel_filters(ref, 16000, 400, 80);
    r->filters = malloc(80 * 201 * sizeof(float));
    for (int i = 0; i < 80 * 201; i++) r->filters[i] = (float)ref[i];
    free(ref);
    m->mel_filters = r->filters;
    nm_whisper_special *s = &m->special;
    *s = (nm_whisper_special){.eot = 50256, .sot = 50257, .lang_begin = 50258, .n_langs = 99, .translate = 50357,
                              .transcribe = 50358, .solm = 50359, .prev = 50360, .nospeech = 50361,
                              .notimestamps = 50362, .timestamp_begin = 50363};
    m->lang_codes = test_langs;
    // Tokens: ids < 256 are the single bytes, then 1..6 random bytes each; specials by name.
    r->tok_off = malloc((51864 + 1) * sizeof *r->tok_off);
    r->tok_data = malloc(51864 * 24);
    uint32_t off = 0;
    for (int32_t i = 0; i < 51864; i++) {
        r->tok_off[i] = off;
        if (i < 256) {
            r->tok_data[off++] = (char)i;
        } else if (i < s->eot) {
            int n = 1 + (int)((frand() + 1) * 2.9f);
            for (int k = 0; k < n; k++) r->tok_data[off++] = (char)(uint8_t)((frand() + 1) * 127.9f);
        } else {
            char name[32];
            if (i >= s->timestamp_begin) snprintf(name, sizeof name, "<|%.2f|>", 0.02 * (i - s->timestamp_begin));
            else if (i == s->eot) snprintf(name, sizeof name, "<|endoftext|>");
            else if (i == s->sot) snprintf(name, sizeof name, "<|startoftranscript|>");
            else if (i < s->translate) snprintf(name, sizeof name, "<|%s|>", test_langs[i - s->lang_begin]);
            else {
                const char *n5[] = {"<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>",
                                    "<|nospeech|>", "<|notimestamps|>"};
                snprintf(name, sizeof name, "%s", n5[i - s->translate]);
            }
            memcpy(r->tok_data + off, name, strlen(name));
            off += (uint32_t)strlen(name);
        }
    }
    r->tok_off[51864] = off;
    m->tok_data = r->tok_data;
    m->tok_off = r->tok_off;
    const int32_t ints[8] = {1, 2, 50357, 220, 50256, 0, 1, 0};
    memcpy(r->ints, ints, sizeof ints);
    m->suppress = r->ints, m->n_suppress = 3;
    m->begin_suppress = r->ints + 3, m->n_begin_suppress = 2;
    m->align_heads = r->ints + 5, m->n_align_heads = 1;
    m->enc = r->enc;
    m->dec = r->dec;
    const uint32_t ct = wtype == NM_TYPE_F32 ? NM_TYPE_F32 : NM_TYPE_F16, V = NM_TYPE_F32;
    rand_tensor(r, &m->e_pe, V, d, 6, 1);
    rand_tensor(r, &m->conv1_w, ct, 3, 80, d);
    rand_tensor(r, &m->conv1_b, V, d, 1, 1);
    rand_tensor(r, &m->conv2_w, ct, 3, d, d);
    rand_tensor(r, &m->conv2_b, V, d, 1, 1);
    rand_tensor(r, &m->e_ln_w, V, d, 1, 1);
    rand_tensor(r, &m->e_ln_b, V, d, 1, 1);
    nm_whisper_attn *ats[5] = {&r->enc[0].attn, &r->enc[1].attn, &r->dec[0].attn, &r->dec[0].cross, NULL};
    for (int i = 0; ats[i]; i++) {
        nm_whisper_attn *a = ats[i];
        rand_tensor(r, &a->ln_w, V, d, 1, 1), rand_tensor(r, &a->ln_b, V, d, 1, 1);
        rand_tensor(r, &a->q_w, wtype, d, d, 1), rand_tensor(r, &a->q_b, V, d, 1, 1);
        rand_tensor(r, &a->k_w, wtype, d, d, 1);
        rand_tensor(r, &a->v_w, wtype, d, d, 1), rand_tensor(r, &a->v_b, V, d, 1, 1);
        rand_tensor(r, &a->o_w, wtype, d, d, 1), rand_tensor(r, &a->o_b, V, d, 1, 1);
    }
    nm_whisper_mlp *mls[4] = {&r->enc[0].mlp, &r->enc[1].mlp, &r->dec[0].mlp, NULL};
    for (int i = 0; mls[i]; i++) {
        nm_whisper_mlp *ml = mls[i];
        rand_tensor(r, &ml->ln_w, V, d, 1, 1), rand_tensor(r, &ml->ln_b, V, d, 1, 1);
        rand_tensor(r, &ml->fc1_w, wtype, d, 4 * d, 1), rand_tensor(r, &ml->fc1_b, V, 4 * d, 1, 1);
        rand_tensor(r, &ml->fc2_w, wtype, 4 * d, d, 1), rand_tensor(r, &ml->fc2_b, V, d, 1, 1);
    }
    rand_tensor(r, &m->d_pe, V, d, 5, 1);
    rand_tensor(r, &m->d_te, wtype, d, 51864, 1);
    rand_tensor(r, &m->d_ln_w, V, d, 1, 1);
    rand_tensor(r, &m->d_ln_b, V, d, 1, 1);
}

static void rand_model_free(rand_model *r) {
    for (int i = 0; i < r->n_store; i++) free(r->store[i]);
    free(r->filters);
    free(r->tok_data);
    free(r->tok_off);
}

// Rows of x and y (same shape, any types) agree within tol x the row's largest |value|.
static bool same_values(const nm_tensor *x, const nm_tensor *y, double tol) {
    const int64_t n = x->ne[0], rows = x->ne[1] * x->ne[2] * x->ne[3];
    const size_t rx = nm_row_size(x->type, n), ry = nm_row_size(y->type, n);
    float *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b);
    bool ok = rx && ry && a && b;
    for (int64_t r = 0; ok && r < rows; r++) {
        nm_dequantize_row_ref(x->type, (const uint8_t *)nm_tensor_host(x) + (size_t)r * rx, a, n);
        nm_dequantize_row_ref(y->type, (const uint8_t *)nm_tensor_host(y) + (size_t)r * ry, b, n);
        double mx = 0;
        for (int64_t i = 0; i < n; i++) mx = fmax(mx, fabs(a[i]));
        for (int64_t i = 0; i < n && ok; i++) ok = fabs(a[i] - b[i]) <= tol * mx + 1e-6;
    }
    free(a);
    free(b);
    return ok;
}

// Two models hold the same hparams, vocabulary, filters and tensor bytes.
// tokens_from: compare tokens [0, tokens_to) only.
static int same_model(const nm_whisper_model *a, const nm_whisper_model *b, int32_t tokens_to, bool check_lists) {
    int bad = 0;
    if (memcmp(&a->hp, &b->hp, sizeof a->hp)) { fprintf(stderr, "  hparams differ\n"); return 1; }
    if (memcmp(&a->special, &b->special, sizeof a->special)) { fprintf(stderr, "  special ids differ\n"); bad++; }
    if (memcmp(a->mel_filters, b->mel_filters, (size_t)a->hp.n_mels * (size_t)a->hp.n_fft_bins * 4)) {
        fprintf(stderr, "  mel filters differ\n");
        bad++;
    }
    for (int32_t i = 0; i < tokens_to; i++) {
        uint32_t la, lb;
        const char *ta = nm_whisper_token(a, i, &la), *tb = nm_whisper_token(b, i, &lb);
        if (la != lb || memcmp(ta, tb, la)) {
            if (bad++ < 5) fprintf(stderr, "  token %d differs: '%.*s' vs '%.*s'\n", i, (int)la, ta, (int)lb, tb);
        }
    }
    for (int32_t i = 0; i < a->special.n_langs; i++)
        if (strcmp(a->lang_codes[i], b->lang_codes[i])) { fprintf(stderr, "  language %d differs\n", i); bad++; }
    if (check_lists &&
        (a->n_suppress != b->n_suppress || a->n_begin_suppress != b->n_begin_suppress ||
         a->n_align_heads != b->n_align_heads || memcmp(a->suppress, b->suppress, 4 * (size_t)a->n_suppress) ||
         memcmp(a->begin_suppress, b->begin_suppress, 4 * (size_t)a->n_begin_suppress) ||
         memcmp(a->align_heads, b->align_heads, 8 * (size_t)a->n_align_heads))) {
        fprintf(stderr, "  suppress lists / alignment heads differ\n");
        bad++;
    }
    tref *ta = calloc((size_t)max_tensors(&a->hp), sizeof *ta), *tb = calloc((size_t)max_tensors(&a->hp), sizeof *tb);
    int n = collect(a, ta), nb = collect(b, tb);
    if (n != nb) bad++;
    for (int i = 0; i < n && i < nb; i++) {
        const nm_tensor *x = ta[i].t, *y = tb[i].t;
        if (x->type != y->type && !memcmp(x->ne, y->ne, sizeof x->ne) && nm_tensor_is_set(x) && nm_tensor_is_set(y)) {
            // A quantized copy (whisper.cpp's quantize tool): values within the
            // format's step of the row's range. A wrong layout is far off.
            if (same_values(x, y, 0.05)) continue;
            if (bad++ < 5) fprintf(stderr, "  tensor %s (%u vs %u) differs beyond quantization\n", ta[i].name, x->type, y->type);
            continue;
        }
        if (x->type != y->type || memcmp(x->ne, y->ne, sizeof x->ne) || !nm_tensor_is_set(x) || !nm_tensor_is_set(y) ||
            memcmp(nm_tensor_host(x), nm_tensor_host(y), tensor_bytes(x))) {
            if (bad++ < 5) fprintf(stderr, "  tensor %s differs\n", ta[i].name);
        }
        if (nm_tensor_is_set(x) && (uintptr_t)nm_tensor_host(x) % (x->type == NM_TYPE_F32 ? 4 : 2)) {
            if (bad++ < 5) fprintf(stderr, "  tensor %s is misaligned\n", ta[i].name);
        }
    }
    free(ta);
    free(tb);
    return bad;
}

static nm_status load_buf(const buf *b, nm_whisper_model **out, char *err, size_t es) {
    return nm_whisper_model_load_memory(b->p, b->n, out, err, es);
}

// ---- tests ---------------------------------------------------------------------------

NM_TEST(sinusoids_formula) {
    const int n = 7, d = 10;
    float pe[70];
    nm_whisper_sinusoids(pe, n, d);
    // whisper: inv_timescales_i = exp(-log(10000) / (d/2 - 1) * i); [sin(p t_i) | cos(p t_i)]
    for (int p = 0; p < n; p++)
        for (int i = 0; i < d / 2; i++) {
            double t = p * pow(10000.0, -(double)i / (d / 2 - 1));
            NM_CHECK_NEAR(pe[p * d + i], sin(t), 1e-6);
            NM_CHECK_NEAR(pe[p * d + d / 2 + i], cos(t), 1e-6);
        }
    NM_CHECK_NEAR(pe[1 * d + 4], sin(1e-4), 1e-9); // the slowest frequency is 1/10000
}

NM_TEST(reference_mel_filters_sane) {
    // Sanity of the reference itself: triangles of unit area (in Hz), so each row
    // sums to about 1 / (bin width 40 Hz) = 0.025 once it spans several bins.
    double *f = malloc(80 * 201 * sizeof *f);
    ref_mel_filters(f, 16000, 400, 80);
    double s = 0;
    for (int k = 0; k < 201; k++) s += f[79 * 201 + k];
    NM_CHECK_NEAR(s, 0.025, 0.001);
    NM_CHECK(f[0] == 0.0);                     // 0 Hz is the first triangle's foot
    NM_CHECK(f[1] > 0.02 && f[1] < 0.03);      // 40 Hz sits on its falling edge
    free(f);
}

NM_TEST(real_tiny_en_gguf) {
    char path[1200];
    snprintf(path, sizeof path, "%s/whisper-tiny.en.gguf", model_dir());
    if (access(path, F_OK) != 0) NM_SKIP_MISSING("whisper-tiny.en.gguf not found (run scripts/fetch_models.sh)");
    nm_whisper_model *m = NULL;
    char err[512];
    nm_status st = nm_whisper_model_load(path, &m, err, sizeof err);
    NM_CHECK(st == NM_OK);
    if (st) { fprintf(stderr, "  %s\n", err); return; }
    const nm_whisper_hparams *h = &m->hp;
    NM_CHECK(m->format == NM_WHISPER_GGUF);
    NM_CHECK(h->n_vocab == 51864 && h->n_audio_ctx == 1500 && h->n_audio_state == 384 && h->n_audio_head == 6 &&
             h->n_audio_layer == 4 && h->n_text_ctx == 448 && h->n_text_state == 384 && h->n_text_head == 6 &&
             h->n_text_layer == 4 && h->n_mels == 80 && h->n_fft_bins == 201);
    NM_CHECK(!nm_whisper_is_multilingual(m));
    const nm_whisper_special *s = &m->special;
    NM_CHECK(s->eot == 50256 && s->sot == 50257 && s->lang_begin == 50258 && s->n_langs == 99 &&
             s->translate == 50357 && s->transcribe == 50358 && s->solm == 50359 && s->prev == 50360 &&
             s->nospeech == 50361 && s->notimestamps == 50362 && s->timestamp_begin == 50363);
    NM_CHECK(!strcmp(m->lang_codes[0], "en") && !strcmp(m->lang_codes[98], "su"));
    // Known GPT-2 tokens, as bytes.
    NM_CHECK(tok_is(m, 0, "!"));
    NM_CHECK(tok_is(m, 198, "\n"));
    NM_CHECK(tok_is(m, 220, " "));
    NM_CHECK(tok_is(m, 262, " the"));
    NM_CHECK(tok_is(m, 11, ","));
    NM_CHECK(tok_is(m, 50256, "<|endoftext|>"));
    NM_CHECK(tok_is(m, 50257, "<|startoftranscript|>"));
    NM_CHECK(tok_is(m, 50258, "<|en|>"));
    NM_CHECK(tok_is(m, 50358, "<|transcribe|>"));
    NM_CHECK(tok_is(m, 50278, "<|he|>") && !strcmp(m->lang_codes[20], "he"));
    NM_CHECK(tok_is(m, 50361, "<|nospeech|>"));
    NM_CHECK(tok_is(m, 50362, "<|notimestamps|>"));
    NM_CHECK(tok_is(m, 50363, "<|0.00|>"));
    NM_CHECK(tok_is(m, 51863, "<|30.00|>"));
    NM_CHECK(nm_whisper_token_find(m, " the") == 262);
    uint32_t l;
    const char *t = nm_whisper_token(m, 255, &l); // GPT-2's id 255 is byte 0xff... its 256 first ids are the bytes
    NM_CHECK(t && l == 1);
    NM_CHECK(nm_whisper_token(m, 51864, &l) == NULL && l == 0);
    // Mel filters against the double-precision slaney reference.
    double *ref = malloc(80 * 201 * sizeof *ref);
    ref_mel_filters(ref, 16000, 400, 80);
    double maxd = 0;
    for (int i = 0; i < 80 * 201; i++) maxd = fmax(maxd, fabs(m->mel_filters[i] - ref[i]));
    NM_CHECK(maxd < 1e-7);
    for (int r = 0; r < 80; r += 13) {
        double a = 0, b = 0;
        for (int k = 0; k < 201; k++) a += m->mel_filters[r * 201 + k], b += ref[r * 201 + k];
        NM_CHECK_NEAR(a, b, 1e-6);
    }
    free(ref);
    // Stored encoder positions are whisper's sinusoids (to f16 precision).
    NM_CHECK(!m->e_pe_computed && m->e_pe.type == NM_TYPE_F32);
    float *pe = malloc(1500 * 384 * sizeof *pe);
    nm_whisper_sinusoids(pe, 1500, 384);
    double maxp = 0;
    for (int i = 0; i < 1500 * 384; i++) maxp = fmax(maxp, fabs(((const float *)nm_tensor_host(&m->e_pe))[i] - pe[i]));
    NM_CHECK(maxp < 2e-3);
    free(pe);
    // Config lists from CTranslate2's config.json.
    NM_CHECK(m->n_begin_suppress == 2 && m->begin_suppress[0] == 220 && m->begin_suppress[1] == 50256);
    NM_CHECK(m->n_suppress > 50 && m->suppress[0] == 1);
    NM_CHECK(m->n_align_heads == 8 && m->align_heads[0] == 1 && m->align_heads[1] == 0);
    // Matrices f16 in place; vectors f32; nothing copied.
    NM_CHECK(m->wtype == NM_TYPE_F16 && m->enc[0].attn.q_w.type == NM_TYPE_F16 && m->conv1_w.type == NM_TYPE_F16);
    NM_CHECK(m->conv1_w.ne[0] == 3 && m->conv1_w.ne[1] == 80 && m->conv1_w.ne[2] == 384);
    NM_CHECK(m->conv1_b.ne[0] == 384 && m->conv1_b.ne[1] == 1);
    NM_CHECK(!nm_tensor_is_set(&m->dec[3].cross.k_b) && nm_tensor_is_set(&m->dec[3].cross.v_b));
    NM_CHECK(m->bytes_copied == 0 && m->bytes_mapped > 70u * 1000 * 1000);
    if (getenv("NM_VERBOSE"))
        fprintf(stderr, "  %s: mel max |diff| %.3g, positions max |diff| %.3g, %llu bytes mapped\n", m->name, maxd, maxp,
                (unsigned long long)m->bytes_mapped);
    nm_whisper_model_free(m);
}

// Text to tokens as whisper.cpp's whisper_tokenize gives them (the --prompt
// path): tests/data/whisper_tok/tiny_en.txt holds its ids for 33 texts (GPT-2
// pieces, contractions, blanks and newlines, digits, UTF-8, special-token
// names as text, a word longer than any token), one "TEXT<tab>IDS" per line,
// \n \t \r \\ escaped; whisper.cpp 233fe1fc on ggml-tiny.en.bin.
NM_TEST(tokenize_matches_whisper_cpp) {
    char path[1200];
    snprintf(path, sizeof path, "%s/whisper-tiny.en.gguf", model_dir());
    if (access(path, F_OK) != 0) NM_SKIP_MISSING("whisper-tiny.en.gguf not found (run scripts/fetch_models.sh)");
    nm_whisper_model *m = NULL;
    NM_CHECK(nm_whisper_model_load(path, &m, NULL, 0) == NM_OK);
    FILE *f = fopen("tests/data/whisper_tok/tiny_en.txt", "r");
    NM_CHECK(f != NULL);
    if (!m || !f) {
        if (f) fclose(f);
        nm_whisper_model_free(m);
        return;
    }
    char line[4096], text[4096];
    int32_t want[1024], got[1024];
    int n_lines = 0, n_tokens = 0;
    while (fgets(line, sizeof line, f)) {
        char *tab = strrchr(line, '\t');
        NM_CHECK(tab != NULL);
        if (!tab) break;
        *tab = '\0';
        size_t k = 0;
        for (const char *c = line; *c; c++) {
            if (*c == '\\' && c[1]) {
                c++;
                text[k++] = *c == 'n' ? '\n' : *c == 't' ? '\t' : *c == 'r' ? '\r' : *c;
            } else {
                text[k++] = *c;
            }
        }
        text[k] = '\0';
        int32_t n_want = 0;
        for (char *e = tab + 1; n_want < 1024;) {
            char *end;
            long v = strtol(e, &end, 10);
            if (end == e) break;
            want[n_want++] = (int32_t)v;
            e = end;
        }
        const int32_t n_got = nm_whisper_tokenize(m, text, got, 1024);
        const bool same = n_got == n_want && !memcmp(got, want, sizeof(int32_t) * (size_t)n_want);
        if (!same) {
            fprintf(stderr, "  '%s': %d tokens, whisper.cpp %d:", line, n_got, n_want);
            for (int32_t i = 0; i < n_got && i < 24; i++) fprintf(stderr, " %d", got[i]);
            fprintf(stderr, "\n");
        }
        NM_CHECK(same);
        n_lines++;
        n_tokens += n_want;
    }
    fclose(f);
    NM_CHECK(n_lines == 33);
    fprintf(stderr, "  %d texts, %d tokens compared\n", n_lines, n_tokens);
    // Room for fewer than the text has: the count, and only cap written.
    int32_t two[3] = {-7, -7, -7};
    NM_CHECK(nm_whisper_tokenize(m, "Hello world, again", two, 2) == 4 && two[0] == 15496 && two[1] == 995 &&
             two[2] == -7);
    NM_CHECK(nm_whisper_tokenize(m, "", two, 2) == 0);
    // The names whisper.cpp gives the special tokens of a text-tokens-only ggml file (-ojf prints them).
    static const struct { int32_t id; const char *name; } names[] = {
        {262, " the"}, {50256, "[_EOT_]"}, {50257, "[_SOT_]"}, {50258, "[_LANG_en]"}, {50356, "[_LANG_su]"},
        {50357, "[_TRANSLATE_]"}, {50358, "[_TRANSCRIBE_]"}, {50359, "[_SOLM_]"}, {50360, "[_PREV_]"},
        {50361, "[_NOSP_]"}, {50362, "[_NOT_]"}, {50363, "[_BEG_]"}, {50364, "[_TT_1]"}, {51863, "[_TT_1500]"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char nbuf[24];
        uint32_t len = 0;
        const char *t = nm_whisper_token_text_cpp(m, names[i].id, nbuf, &len);
        const bool ok = t && len == strlen(names[i].name) && !memcmp(t, names[i].name, len);
        if (!ok) fprintf(stderr, "  token %d: '%.*s', whisper.cpp '%s'\n", names[i].id, t ? (int)len : 0, t ? t : "", names[i].name);
        NM_CHECK(ok);
    }
    NM_CHECK(nm_whisper_token_text_cpp(m, 51864, (char[24]){0}, NULL) == NULL);
    nm_whisper_model_free(m);
}

NM_TEST(real_tiny_en_bin_roundtrip) {
    char path[1200];
    snprintf(path, sizeof path, "%s/whisper-tiny.en.gguf", model_dir());
    if (access(path, F_OK) != 0) NM_SKIP_MISSING("whisper-tiny.en.gguf not found (run scripts/fetch_models.sh)");
    nm_whisper_model *g = NULL, *b = NULL;
    char err[512];
    NM_CHECK(nm_whisper_model_load(path, &g, err, sizeof err) == NM_OK);
    if (!g) return;
    buf bin = write_bin(g, 1, true, NULL);
    nm_status st = load_buf(&bin, &b, err, sizeof err);
    NM_CHECK(st == NM_OK);
    if (st) fprintf(stderr, "  %s\n", err);
    if (b) {
        NM_CHECK(b->format == NM_WHISPER_GGML_BIN && !strcmp(b->name, "ggml-tiny.en"));
        NM_CHECK(same_model(g, b, g->hp.n_vocab, false) == 0);
        NM_CHECK(tok_is(b, 50256, "<|endoftext|>") && tok_is(b, 50363, "<|0.00|>") && tok_is(b, 262, " the"));
        NM_CHECK(b->n_suppress == 0 && b->n_align_heads == 0);
        NM_CHECK(b->bytes_copied > 0 && b->bytes_mapped > 0); // unaligned data copied, the rest in place
        if (getenv("NM_VERBOSE"))
            fprintf(stderr, "  .bin: %llu bytes mapped, %llu copied (misaligned)\n", (unsigned long long)b->bytes_mapped,
                    (unsigned long long)b->bytes_copied);
    }
    nm_whisper_model_free(b);
    free(bin.p);
    // NM_WHISPER_BIN=a.bin:b.bin: other .bin files of this model, e.g. from
    // convert_whisper_ct2.py --ggml-bin, or quantized by whisper.cpp's whisper-quantize.
    const char *env = getenv("NM_WHISPER_BIN");
    char list[4096];
    snprintf(list, sizeof list, "%s", env ? env : "");
    for (char *save = NULL, *other = strtok_r(list, ":", &save); other; other = strtok_r(NULL, ":", &save)) {
        b = NULL;
        st = nm_whisper_model_load(other, &b, err, sizeof err);
        NM_CHECK(st == NM_OK);
        if (st) fprintf(stderr, "  %s\n", err);
        if (b) NM_CHECK(same_model(g, b, g->hp.n_vocab, false) == 0);
        if (b && getenv("NM_VERBOSE"))
            fprintf(stderr, "  %s: %s, %s matrices, %llu bytes mapped, %llu copied\n", other, b->name,
                    nm_type_traits_get(b->wtype)->name, (unsigned long long)b->bytes_mapped,
                    (unsigned long long)b->bytes_copied);
        nm_whisper_model_free(b);
    }
    nm_whisper_model_free(g);
}

// The optional larger model (scripts/fetch_models.sh whisper-base.gguf): multilingual ids.
NM_TEST(real_base_gguf) {
    char path[1200];
    snprintf(path, sizeof path, "%s/whisper-base.gguf", model_dir());
    if (access(path, F_OK) != 0) NM_SKIP("whisper-base.gguf not found (optional: scripts/fetch_models.sh whisper-base.gguf)");
    nm_whisper_model *g = NULL, *b = NULL;
    char err[512];
    NM_CHECK(nm_whisper_model_load(path, &g, err, sizeof err) == NM_OK);
    if (!g) { fprintf(stderr, "  %s\n", err); return; }
    const nm_whisper_hparams *h = &g->hp;
    NM_CHECK(h->n_vocab == 51865 && h->n_audio_state == 512 && h->n_audio_head == 8 && h->n_audio_layer == 6 &&
             h->n_text_layer == 6 && h->n_text_ctx == 448 && h->n_audio_ctx == 1500);
    NM_CHECK(nm_whisper_is_multilingual(g));
    const nm_whisper_special *s = &g->special;
    NM_CHECK(s->eot == 50257 && s->sot == 50258 && s->n_langs == 99 && s->translate == 50358 &&
             s->transcribe == 50359 && s->notimestamps == 50363 && s->timestamp_begin == 50364);
    uint32_t len = 1;
    NM_CHECK(nm_whisper_token(g, 50256, &len) != NULL && len == 0); // the multilingual vocabulary's empty token
    NM_CHECK(tok_is(g, 50259, "<|en|>") && tok_is(g, 50260, "<|zh|>") && tok_is(g, 264, " the")); // multilingual BPE: " the" is 264
    buf bin = write_bin(g, 1, true, NULL);
    NM_CHECK(load_buf(&bin, &b, err, sizeof err) == NM_OK);
    if (b) {
        NM_CHECK(!strcmp(b->name, "ggml-base"));
        NM_CHECK(same_model(g, b, h->n_vocab, false) == 0);
    }
    nm_whisper_model_free(b);
    free(bin.p);
    nm_whisper_model_free(g);
}

static void roundtrip(int *nmtest_failed, uint32_t wtype) {
    rand_model *r = malloc(sizeof *r);
    rand_model_init(r, wtype, 1234 + wtype);
    buf gg = write_gguf(&r->m, true), bb = write_bin(&r->m, wtype == NM_TYPE_F32 ? 0 : 1, true, NULL);
    nm_whisper_model *a = NULL, *b = NULL;
    char err[512];
    nm_status st = load_buf(&gg, &a, err, sizeof err);
    NM_CHECK(st == NM_OK);
    if (st) fprintf(stderr, "  gguf: %s\n", err);
    st = load_buf(&bb, &b, err, sizeof err);
    NM_CHECK(st == NM_OK);
    if (st) fprintf(stderr, "  bin: %s\n", err);
    if (a && b) {
        NM_CHECK(same_model(&r->m, a, 51864, true) == 0);
        NM_CHECK(same_model(&r->m, b, 51864, false) == 0);
        NM_CHECK(same_model(a, b, 51864, false) == 0);
        NM_CHECK(a->wtype == wtype && b->wtype == wtype);
        NM_CHECK(a->bytes_copied == 0);
        NM_CHECK(!a->e_pe_computed && !b->e_pe_computed);
        NM_CHECK(!strcmp(a->name, "test") && !strcmp(b->name, "ggml-custom.en"));
    }
    nm_whisper_model_free(a);
    nm_whisper_model_free(b);
    free(gg.p);
    free(bb.p);
    rand_model_free(r);
    free(r);
}

NM_TEST(random_roundtrip_f16) { roundtrip(nmtest_failed, NM_TYPE_F16); }
NM_TEST(random_roundtrip_f32) { roundtrip(nmtest_failed, NM_TYPE_F32); }
NM_TEST(random_roundtrip_q8_0) { roundtrip(nmtest_failed, NM_TYPE_Q8_0); }
// Beams in one pass: nm_whisper_decode_seqs gives each sequence exactly the
// logits nm_whisper_decode of its token alone gives (f16 weights: the
// batched decode dots; f32 and q8_0: their decode kernels one token at a
// time), and refuses a repeated or unknown sequence and a position past the
// text context.
static void decode_seqs_equal_one_by_one(int *nmtest_failed, uint32_t wtype) {
    rand_model *r = malloc(sizeof *r);
    rand_model_init(r, wtype, 4321 + wtype);
    buf gg = write_gguf(&r->m, true);
    nm_whisper_model *m = NULL;
    nm_whisper *w = NULL;
    char err[512] = "";
    NM_CHECK(load_buf(&gg, &m, err, sizeof err) == NM_OK);
    NM_CHECK(m && nm_whisper_create(m, 2, 3, 0, &w, err, sizeof err) == NM_OK);
    if (w) {
        const nm_whisper_hparams *hp = &m->hp;
        const int64_t n_len = 2 * hp->n_audio_ctx, nv = hp->n_vocab;
        float *mel = malloc(sizeof(float) * (size_t)(hp->n_mels * n_len));
        for (int64_t i = 0; i < hp->n_mels * n_len; i++) mel[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
        NM_CHECK(nm_whisper_encode(w, mel, n_len, 0) == NM_OK);
        const int32_t prompt[2] = {50257, 50362}, seqs[3] = {2, 0, 1}, toks[3] = {11, 4000, 51000};
        NM_CHECK(nm_whisper_decode(w, 0, prompt, 2, 0, false) == NM_OK);
        NM_CHECK(nm_whisper_seq_share(w, 1, 0, 2) == NM_OK && nm_whisper_seq_share(w, 2, 0, 2) == NM_OK);
        NM_CHECK(nm_whisper_decode_seqs(w, seqs, toks, 3, 2) == NM_OK);
        float *batched = malloc(sizeof(float) * (size_t)(3 * nv));
        for (int k = 0; k < 3; k++) {
            const float *l = nm_whisper_logits(w, k);
            NM_CHECK(l != NULL);
            if (l) memcpy(batched + k * nv, l, sizeof(float) * (size_t)nv);
        }
        NM_CHECK(nm_whisper_logits(w, 3) == NULL);
        for (int k = 0; k < 3; k++) { // the same token again at the same position: the same cache rows
            NM_CHECK(nm_whisper_decode(w, seqs[k], &toks[k], 1, 2, false) == NM_OK);
            const float *l = nm_whisper_logits(w, -1);
            const bool same = l && !memcmp(l, batched + k * nv, sizeof(float) * (size_t)nv);
            if (!same) fprintf(stderr, "  %s weights, sequence %d: logits differ\n", nm_type_traits_get(wtype)->name, seqs[k]);
            NM_CHECK(same);
        }
        const int32_t dup[2] = {1, 1}, bad[2] = {0, 3};
        NM_CHECK(nm_whisper_decode_seqs(w, dup, toks, 2, 2) == NM_ERR_INVALID_ARG && strstr(nm_whisper_last_error(w), "twice"));
        NM_CHECK(nm_whisper_decode_seqs(w, bad, toks, 2, 2) == NM_ERR_RANGE && strstr(nm_whisper_last_error(w), "sequence 3 of 3"));
        NM_CHECK(nm_whisper_decode_seqs(w, seqs, toks, 3, hp->n_text_ctx) == NM_ERR_RANGE);
        free(mel);
        free(batched);
    }
    nm_whisper_free(w);
    nm_whisper_model_free(m);
    free(gg.p);
    rand_model_free(r);
    free(r);
}
NM_TEST(decode_seqs_equal_one_by_one_f16) { decode_seqs_equal_one_by_one(nmtest_failed, NM_TYPE_F16); }
NM_TEST(decode_seqs_equal_one_by_one_f32) { decode_seqs_equal_one_by_one(nmtest_failed, NM_TYPE_F32); }
NM_TEST(decode_seqs_equal_one_by_one_q8_0) { decode_seqs_equal_one_by_one(nmtest_failed, NM_TYPE_Q8_0); }

// Shared cache rows: sequences share their prefixes (nm_whisper_seq_share)
// and overwrite positions at random, far more often than the pool has spare
// rows; after every step each sequence's next logits equal those of its own
// token history decoded alone, one token at a time, in a cache nobody shares
// (a write to a shared row must not reach the other sequences, and the pool
// must never run dry).
NM_TEST(shared_rows_copy_on_write) {
    rand_model *r = malloc(sizeof *r);
    rand_model_init(r, NM_TYPE_F16, 99);
    buf gg = write_gguf(&r->m, true);
    nm_whisper_model *m = NULL;
    nm_whisper *w = NULL, *solo = NULL;
    char err[512] = "";
    enum { S = 3 };
    NM_CHECK(load_buf(&gg, &m, err, sizeof err) == NM_OK);
    NM_CHECK(m && nm_whisper_create(m, 1, S, 0, &w, err, sizeof err) == NM_OK &&
             nm_whisper_create(m, 1, 1, 0, &solo, err, sizeof err) == NM_OK);
    if (w && solo) {
        const nm_whisper_hparams *hp = &m->hp;
        const int32_t C = hp->n_text_ctx, nv = hp->n_vocab;
        const int64_t n_len = 2 * hp->n_audio_ctx;
        float *mel = malloc(sizeof(float) * (size_t)(hp->n_mels * n_len));
        for (int64_t i = 0; i < hp->n_mels * n_len; i++) mel[i] = (float)((i * 53) % 97) / 48.0f - 1.0f;
        NM_CHECK(nm_whisper_encode(w, mel, n_len, 0) == NM_OK && nm_whisper_encode(solo, mel, n_len, 0) == NM_OK);
        int32_t hist[S][8] = {{0}}, len[S] = {0};
        float *got = malloc(sizeof(float) * (size_t)nv);
        uint32_t rs = 12345;
        int bad = 0, shares = 0;
        for (int step = 0; step < 120 && !bad; step++) {
            rs ^= rs << 13, rs ^= rs >> 17, rs ^= rs << 5; // xorshift32
            const int32_t s = (int32_t)((rs >> 16) % S), o = (int32_t)((rs >> 8) % S);
            if ((rs >> 4) % 3 == 0 && o != s && len[o] > 0) { // s takes o's first n positions
                const int32_t n = 1 + (int32_t)((rs >> 20) % (uint32_t)len[o]);
                NM_CHECK(nm_whisper_seq_share(w, s, o, n) == NM_OK);
                memcpy(hist[s], hist[o], sizeof(int32_t) * (size_t)n);
                len[s] = n;
                shares++;
                continue;
            }
            // a token at the end (or, when full, over a random earlier position)
            const int32_t p = len[s] < C ? len[s] : (int32_t)((rs >> 20) % (uint32_t)C);
            const int32_t tok = (int32_t)((rs >> 3) % 50000u);
            NM_CHECK(nm_whisper_decode(w, s, &tok, 1, p, false) == NM_OK);
            hist[s][p] = tok;
            len[s] = p + 1;
            const float *l = nm_whisper_logits(w, -1);
            if (l) memcpy(got, l, sizeof(float) * (size_t)nv);
            for (int32_t k = 0; k < len[s]; k++) NM_CHECK(nm_whisper_decode(solo, 0, &hist[s][k], 1, k, false) == NM_OK);
            const float *want = nm_whisper_logits(solo, -1);
            if (!l || !want || memcmp(got, want, sizeof(float) * (size_t)nv)) {
                fprintf(stderr, "  step %d: sequence %d at position %d differs from its history decoded alone\n", step, s, p);
                bad = 1;
            }
        }
        if (shares <= 20) fprintf(stderr, "  only %d shares\n", shares);
        NM_CHECK(!bad && shares > 20);
        free(mel);
        free(got);
    }
    nm_whisper_free(w);
    nm_whisper_free(solo);
    nm_whisper_model_free(m);
    free(gg.p);
    rand_model_free(r);
    free(r);
}

NM_TEST(random_roundtrip_q4_k) { // rows of 32 are not whole q4_K blocks: refused with a message
    rand_model *r = malloc(sizeof *r);
    rand_model_init(r, NM_TYPE_F16, 7);
    r->m.enc[0].attn.q_w.type = NM_TYPE_Q4_K; // claims 256-blocks for rows of 32
    buf bb = write_bin(&r->m, 1, true, NULL);
    nm_whisper_model *b = NULL;
    char err[512] = "";
    NM_CHECK(load_buf(&bb, &b, err, sizeof err) == NM_ERR_FORMAT && !b && strstr(err, "whole blocks"));
    free(bb.p);
    rand_model_free(r);
    free(r);
}

NM_TEST(positions_computed_when_absent) {
    rand_model *r = malloc(sizeof *r);
    rand_model_init(r, NM_TYPE_F16, 99);
    buf gg = write_gguf(&r->m, false), bb = write_bin(&r->m, 1, false, NULL);
    nm_whisper_model *a = NULL, *b = NULL;
    char err[512];
    NM_CHECK(load_buf(&gg, &a, err, sizeof err) == NM_OK);
    NM_CHECK(load_buf(&bb, &b, err, sizeof err) == NM_OK);
    float pe[6 * 32];
    nm_whisper_sinusoids(pe, 6, 32);
    if (a && b) {
        NM_CHECK(a->e_pe_computed && b->e_pe_computed);
        NM_CHECK(a->e_pe.ne[0] == 32 && a->e_pe.ne[1] == 6 && a->e_pe.type == NM_TYPE_F32);
        NM_CHECK(!memcmp(nm_tensor_host(&a->e_pe), pe, sizeof pe) && !memcmp(nm_tensor_host(&b->e_pe), pe, sizeof pe));
    }
    nm_whisper_model_free(a);
    nm_whisper_model_free(b);
    free(gg.p);
    free(bb.p);
    rand_model_free(r);
    free(r);
}

// Every proper prefix of a file must be refused with a message.
static int check_truncations(const buf *b, size_t limit, const size_t *extra, int n_extra) {
    int bad = 0;
    size_t cuts[600];
    int n = 0;
    for (size_t c = 0; c < 64 && c < b->n; c++) cuts[n++] = c;              // the header, byte by byte
    for (int i = 0; i < 150; i++) cuts[n++] = (size_t)((double)b->n * i / 150); // spread over the file
    for (int i = 0; i < n_extra && n < 598; i++) cuts[n++] = extra[i], cuts[n++] = extra[i] + 7;
    cuts[n++] = b->n - 1;
    for (int i = 0; i < n; i++) {
        if (cuts[i] >= limit) continue;
        uint8_t *p = malloc(cuts[i] ? cuts[i] : 1);
        memcpy(p, b->p, cuts[i]);
        nm_whisper_model *m = (nm_whisper_model *)1;
        char err[512] = "";
        nm_status st = nm_whisper_model_load_memory(p, cuts[i], &m, err, sizeof err);
        if (st == NM_OK || m != NULL || !err[0]) {
            if (bad++ < 5) fprintf(stderr, "  cut at %zu of %zu: status %d, '%s'\n", cuts[i], b->n, st, err);
            if (st == NM_OK) nm_whisper_model_free(m);
        }
        free(p);
    }
    return bad;
}

NM_TEST(truncations_give_errors) {
    rand_model *r = malloc(sizeof *r);
    rand_model_init(r, NM_TYPE_F16, 5);
    bin_layout lay;
    buf gg = write_gguf(&r->m, true), bb = write_bin(&r->m, 1, true, &lay);
    size_t extra[16];
    int ne = 0;
    extra[ne++] = lay.vocab_at;
    for (int i = 0; i < lay.n_tensor_at; i++) extra[ne++] = lay.tensor_at[i];
    NM_CHECK(check_truncations(&bb, bb.n, extra, ne) == 0);
    // A GGUF may end in padding after the last tensor: cuts from there on stay valid.
    nm_gguf *g = NULL;
    NM_CHECK(nm_gguf_open_memory(gg.p, gg.n, &g, NULL, 0) == NM_OK);
    size_t end = 0;
    for (int64_t i = 0; g && i < nm_gguf_n_tensors(g); i++) {
        const nm_gguf_tensor *t = nm_gguf_tensor_at(g, i);
        size_t e = (size_t)((const uint8_t *)t->data - gg.p) + (size_t)t->nbytes;
        if (e > end) end = e;
    }
    nm_gguf_close(g);
    NM_CHECK(end > gg.n / 2);
    NM_CHECK(check_truncations(&gg, end, NULL, 0) == 0);
    free(gg.p);
    free(bb.p);
    rand_model_free(r);
    free(r);
}

// Flips bytes one at a time: loading must either succeed or fail with a
// message; never crash (the ASan build checks the reads). Returns the errors seen.
static int flips(int *nmtest_failed, const buf *b, const size_t *pos, int n_pos) {
    int errors = 0;
    uint8_t *p = malloc(b->n);
    memcpy(p, b->p, b->n);
    for (int i = 0; i < n_pos; i++) {
        if (pos[i] >= b->n) continue;
        const uint8_t keep = p[pos[i]];
        static const uint8_t masks[] = {0x01, 0x80, 0xff, 0x40};
        p[pos[i]] ^= masks[i % 4];
        nm_whisper_model *m = NULL;
        char err[512] = "";
        nm_status st = nm_whisper_model_load_memory(p, b->n, &m, err, sizeof err);
        if (st != NM_OK) {
            errors++;
            NM_CHECK(m == NULL && err[0] != '\0');
        } else {
            NM_CHECK(m != NULL);
            nm_whisper_model_free(m);
        }
        p[pos[i]] = keep;
    }
    free(p);
    return errors;
}

NM_TEST(byte_flips_bin) {
    rand_model *r = malloc(sizeof *r);
    rand_model_init(r, NM_TYPE_Q8_0, 11);
    bin_layout lay;
    buf bb = write_bin(&r->m, 1, true, &lay);
    size_t pos[1200];
    int n = 0;
    for (size_t i = 0; i < 60; i++) pos[n++] = i;                              // magic, hparams, filter dims
    for (size_t i = 0; i < 40; i++) pos[n++] = lay.vocab_at + i;               // token count and first tokens
    for (int t = 0; t < lay.n_tensor_at; t++)                                  // tensor headers
        for (size_t i = 0; i < 40; i++) pos[n++] = lay.tensor_at[t] + i;
    rng_state = 3;
    for (int i = 0; i < 100; i++) pos[n++] = (size_t)((frand() + 1) * 0.5 * (double)(bb.n - 1)); // anywhere
    int errors = flips(nmtest_failed, &bb, pos, n);
    NM_CHECK(errors > 100); // header and tensor-header flips must mostly be caught
    // Targeted: each must be refused.
    struct { size_t at; uint8_t v; } must[] = {
        {0, 0x00},                        // magic
        {4 + 4 * 2 + 3, 0x80},            // n_audio_state negative
        {lay.vocab_at + 3, 0x7f},         // token count beyond n_vocab
        {lay.tensor_at[0] + 3, 0x40},     // n_dims huge
        {lay.tensor_at[0] + 4, 0x00},     // name length 0 (low byte; it was < 256)
        {lay.tensor_at[0] + 8, 0x63},     // type 99
        {lay.tensor_at[1] + 12, 0x00},    // first dimension 0
    };
    uint8_t *p = malloc(bb.n);
    for (size_t i = 0; i < sizeof must / sizeof must[0]; i++) {
        memcpy(p, bb.p, bb.n);
        p[must[i].at] = must[i].v;
        nm_whisper_model *m = NULL;
        char err[512] = "";
        nm_status st = nm_whisper_model_load_memory(p, bb.n, &m, err, sizeof err);
        NM_CHECK(st != NM_OK && !m && err[0]);
        if (st == NM_OK) { fprintf(stderr, "  targeted flip %zu accepted\n", i); nm_whisper_model_free(m); }
    }
    free(p);
    free(bb.p);
    rand_model_free(r);
    free(r);
}

NM_TEST(byte_flips_gguf) {
    rand_model *r = malloc(sizeof *r);
    rand_model_init(r, NM_TYPE_F16, 12);
    buf gg = write_gguf(&r->m, true);
    size_t pos[800];
    int n = 0;
    for (size_t i = 0; i < 240; i++) pos[n++] = i; // header and the first keys
    rng_state = 4;
    for (int i = 0; i < 160; i++) pos[n++] = (size_t)((frand() + 1) * 0.5 * (double)(gg.n - 1));
    int errors = flips(nmtest_failed, &gg, pos, n);
    NM_CHECK(errors > 100);
    free(gg.p);
    rand_model_free(r);
    free(r);
}

// Loads b and expects status `want` with `needle` in the message.
static bool expect(const buf *b, nm_status want, const char *needle) {
    nm_whisper_model *m = NULL;
    char err[512] = "";
    nm_status st = nm_whisper_model_load_memory(b->p, b->n, &m, err, sizeof err);
    bool ok = st == want && (st == NM_OK ? m != NULL : m == NULL && strstr(err, needle) != NULL);
    if (!ok) fprintf(stderr, "  got %s '%s', wanted %s '%s'\n", nm_status_str(st), err, nm_status_str(want), needle);
    nm_whisper_model_free(m);
    return ok;
}

NM_TEST(malformed_files) {
    rand_model *r = malloc(sizeof *r);
    rand_model_init(r, NM_TYPE_F16, 21);
    nm_whisper_model *m = NULL;
    char err[512];
    NM_CHECK(nm_whisper_model_load("/nonexistent/whisper.bin", &m, err, sizeof err) == NM_ERR_IO && !m);
    NM_CHECK(nm_whisper_model_load("/", &m, err, sizeof err) == NM_ERR_IO && !m);
    NM_CHECK(nm_whisper_model_load_memory(NULL, 0, &m, err, sizeof err) == NM_ERR_FORMAT && !m);
    buf x = {(uint8_t *)"RIFF....WAVE", 12, 0};
    NM_CHECK(expect(&x, NM_ERR_FORMAT, "not a whisper model"));
    // A vocabulary too small for whisper's special ids.
    bin_layout lay;
    buf bb = write_bin(&r->m, 1, true, &lay);
    int32_t v = 1000;
    memcpy(bb.p + 4, &v, 4);
    NM_CHECK(expect(&bb, NM_ERR_UNSUPPORTED, "n_vocab"));
    v = 51864;
    memcpy(bb.p + 4, &v, 4);
    NM_CHECK(expect(&bb, NM_OK, ""));
    // Heads that do not divide the width.
    v = 5;
    memcpy(bb.p + 4 + 3 * 4, &v, 4);
    NM_CHECK(expect(&bb, NM_ERR_FORMAT, "head counts"));
    v = 4;
    memcpy(bb.p + 4 + 3 * 4, &v, 4);
    // A renamed tensor: the original goes missing.
    int32_t nd;
    memcpy(&nd, bb.p + lay.tensor_at[0], 4);
    const size_t name_at = lay.tensor_at[0] + 12 + 4 * (size_t)nd;
    bb.p[name_at + 6] = 'x'; // "decoder." -> "decodex."
    NM_CHECK(expect(&bb, NM_ERR_FORMAT, "missing tensor 'decoder.blocks.0.mlp.2.bias'"));
    bb.p[name_at + 6] = 'r';
    // An extra tensor nobody asked for.
    {
        buf d = {0};
        put(&d, bb.p, bb.n);
        const size_t at = d.n;
        put(&d, bb.p + lay.tensor_at[0], lay.tensor_at[1] - lay.tensor_at[0]);
        d.p[at + (name_at - lay.tensor_at[0]) + 6] = 'x';
        NM_CHECK(expect(&d, NM_ERR_FORMAT, "unknown tensor 'decodex."));
        free(d.p);
    }
    // Extra bytes after the last tensor read as a truncated tensor header.
    put(&bb, "\1\0\0", 3);
    NM_CHECK(expect(&bb, NM_ERR_FORMAT, "truncated tensor header"));
    bb.n -= 3;
    // A duplicated tensor.
    {
        buf d = {0};
        put(&d, bb.p, bb.n);
        size_t len = lay.tensor_at[1] - lay.tensor_at[0];
        put(&d, bb.p + lay.tensor_at[0], len);
        NM_CHECK(expect(&d, NM_ERR_FORMAT, "duplicate tensor"));
        free(d.p);
    }
    // A wrong shape: the decoder norm claims 33 elements (data follows for 32 -> the sizes fail).
    free(bb.p);
    r->m.d_ln_w.ne[0] = 16; // write half of it
    bb = write_bin(&r->m, 1, true, NULL);
    NM_CHECK(expect(&bb, NM_ERR_FORMAT, "decoder.ln.weight' has shape"));
    r->m.d_ln_w.ne[0] = 32;
    free(bb.p);
    // Non-finite values in a vector.
    ((float *)nm_tensor_host(&r->m.e_ln_b))[3] = NAN;
    bb = write_bin(&r->m, 1, true, NULL);
    NM_CHECK(expect(&bb, NM_ERR_FORMAT, "non-finite"));
    free(bb.p);
    ((float *)nm_tensor_host(&r->m.e_ln_b))[3] = 0.5f;
    // GGUF: another architecture; a token that is not byte-level text.
    buf gg = write_gguf(&r->m, true);
    NM_CHECK(expect(&gg, NM_OK, ""));
    uint8_t *a = memmem(gg.p, gg.n, "whisper\x0c", 8); // the first value "whisper" is followed by the next key's length
    if (a) {
        memcpy(a, "whispex", 7);
        NM_CHECK(expect(&gg, NM_ERR_UNSUPPORTED, "architecture"));
        memcpy(a, "whisper", 7);
    } else {
        NM_CHECK(a != NULL);
    }
    uint8_t *endoftext = memmem(gg.p, gg.n, "<|endoftext|>", 13);
    NM_CHECK(endoftext != NULL);
    if (endoftext) {
        endoftext[2] = 'E';
        NM_CHECK(expect(&gg, NM_ERR_FORMAT, "expected '<|endoftext|>'"));
        endoftext[2] = 0xff; // not UTF-8
        NM_CHECK(expect(&gg, NM_ERR_FORMAT, "byte-level"));
        endoftext[2] = 'e';
    }
    free(gg.p);
    rand_model_free(r);
    free(r);
}

// The bytes of GGUF key `key`'s value in b (after its name and its u32 type
// `type`), or NULL. Arrays: element type, count, then the elements.
static uint8_t *kv_value(const buf *b, const char *key, uint32_t type) {
    uint8_t pat[128];
    const uint64_t n = strlen(key);
    memcpy(pat, &n, 8);
    memcpy(pat + 8, key, n);
    memcpy(pat + 8 + n, &type, 4);
    uint8_t *a = memmem(b->p, b->n, pat, 12 + n);
    return a ? a + 12 + n : NULL;
}

// Each metadata value a Whisper model cannot have is refused by name (issue
// 12): one edit of a good GGUF per case, the message it must give.
NM_TEST(gguf_bad_values_refused) {
    rand_model *r = malloc(sizeof *r);
    rand_model_init(r, NM_TYPE_F16, 31);
    buf gg = write_gguf(&r->m, true);
    NM_CHECK(expect(&gg, NM_OK, ""));
    const struct {
        const char *key;
        uint32_t type;
        int elem;  // arrays: the element changed; -1 for a scalar
        int32_t v; // its new value
        nm_status want;
        const char *needle;
    } cases[] = {
        {"whisper.n_audio_ctx", NM_GGUF_UINT32, -1, 0, NM_ERR_FORMAT, "n_audio_ctx = 0 is out of range [1, 65536]"},
        {"whisper.n_audio_state", NM_GGUF_UINT32, -1, 1 << 16, NM_ERR_FORMAT, "n_audio_state = 65536 is out of range"},
        {"whisper.n_audio_head", NM_GGUF_UINT32, -1, 0, NM_ERR_FORMAT, "n_audio_head = 0 is out of range [1, 1024]"},
        {"whisper.n_audio_layer", NM_GGUF_UINT32, -1, 0, NM_ERR_FORMAT, "n_audio_layer = 0 is out of range [1, 256]"},
        {"whisper.n_audio_layer", NM_GGUF_UINT32, -1, 300, NM_ERR_FORMAT, "n_audio_layer = 300 is out of range"},
        {"whisper.n_text_ctx", NM_GGUF_UINT32, -1, 0, NM_ERR_FORMAT, "n_text_ctx = 0 is out of range [1, 65536]"},
        {"whisper.n_text_head", NM_GGUF_UINT32, -1, 0, NM_ERR_FORMAT, "n_text_head = 0 is out of range"},
        {"whisper.n_text_layer", NM_GGUF_UINT32, -1, 257, NM_ERR_FORMAT, "n_text_layer = 257 is out of range [1, 256]"},
        {"whisper.n_mels", NM_GGUF_UINT32, -1, 0, NM_ERR_FORMAT, "n_mels = 0 is out of range [1, 512]"},
        {"whisper.n_text_state", NM_GGUF_UINT32, -1, 64, NM_ERR_FORMAT, "n_text_state 64 differs from n_audio_state 32"},
        {"whisper.n_audio_head", NM_GGUF_UINT32, -1, 5, NM_ERR_FORMAT, "the head counts (5, 4) do not divide the width 32"},
        {"whisper.n_text_head", NM_GGUF_UINT32, -1, 3, NM_ERR_FORMAT, "the head counts (4, 3) do not divide the width 32"},
        {"whisper.n_mels", NM_GGUF_UINT32, -1, 128, NM_ERR_FORMAT, "mel filterbank has 80 filters, n_mels is 128"},
        {"whisper.n_vocab", NM_GGUF_UINT32, -1, 1000, NM_ERR_FORMAT, "is beyond n_vocab 1000"},
        {"whisper.token.eot", NM_GGUF_UINT32, -1, 60000, NM_ERR_FORMAT, "special token id 60000 is beyond n_vocab 51864"},
        {"whisper.token.timestamp_begin", NM_GGUF_UINT32, -1, 50362, NM_ERR_FORMAT,
         "special token ids are out of whisper's order"},
        {"whisper.token.translate", NM_GGUF_UINT32, -1, 50300, NM_ERR_FORMAT,
         "'whisper.languages' must list the 42 language codes"},
        {"whisper.suppress_tokens", NM_GGUF_ARRAY, 0, 51864, NM_ERR_FORMAT,
         "metadata 'whisper.suppress_tokens'[0] = 51864 is out of range"},
        {"whisper.begin_suppress_tokens", NM_GGUF_ARRAY, 1, -1, NM_ERR_FORMAT,
         "'whisper.begin_suppress_tokens'[1] = -1 is out of range"},
        {"whisper.alignment_heads", NM_GGUF_ARRAY, 0, 1, NM_ERR_FORMAT, "alignment head (1, 1) is out of range"},
        {"whisper.alignment_heads", NM_GGUF_ARRAY, 1, 4, NM_ERR_FORMAT, "'whisper.alignment_heads'[1] = 4 is out of range"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        buf d = {0};
        put(&d, gg.p, gg.n);
        uint8_t *v = kv_value(&d, cases[i].key, cases[i].type);
        NM_CHECK(v != NULL);
        if (!v) {
            free(d.p);
            continue;
        }
        if (cases[i].elem >= 0) v += 12 + 4 * (size_t)cases[i].elem;
        memcpy(v, &cases[i].v, 4);
        const bool ok = expect(&d, cases[i].want, cases[i].needle);
        if (!ok) fprintf(stderr, "  case %zu: %s\n", i, cases[i].key);
        NM_CHECK(ok);
        free(d.p);
    }
    // A required key renamed away; a count given as a float.
    {
        buf d = {0};
        put(&d, gg.p, gg.n);
        uint8_t *v = kv_value(&d, "whisper.token.prev", NM_GGUF_UINT32);
        NM_CHECK(v != NULL);
        if (v) v[-5] = 'z'; // "whisper.token.prev" -> "whisper.token.prez"
        NM_CHECK(expect(&d, NM_ERR_FORMAT, "missing metadata key 'whisper.token.prev'"));
        free(d.p);
        d = (buf){0};
        put(&d, gg.p, gg.n);
        v = kv_value(&d, "whisper.token.sot", NM_GGUF_UINT32);
        NM_CHECK(v != NULL);
        if (v) {
            const uint32_t f32 = NM_GGUF_FLOAT32;
            const float x = 50257.5f;
            memcpy(v - 4, &f32, 4);
            memcpy(v, &x, 4);
        }
        NM_CHECK(expect(&d, NM_ERR_FORMAT, "metadata 'whisper.token.sot' is not a valid count"));
        free(d.p);
    }
    free(gg.p);
    // A negative mel filter weight.
    r->filters[7] = -0.25f; // the storage r->m.mel_filters views
    gg = write_gguf(&r->m, true);
    NM_CHECK(expect(&gg, NM_ERR_FORMAT, "mel filter value 7 is -0.25"));
    free(gg.p);
    rand_model_free(r);
    free(r);
}

NM_TEST(misaligned_bin_data_is_copied_aligned) {
    // The .bin layout has no padding: with these names some tensors start at odd
    // offsets. They must come back aligned and equal (same_model checks both).
    rand_model *r = malloc(sizeof *r);
    rand_model_init(r, NM_TYPE_F16, 31);
    buf bb = write_bin(&r->m, 1, true, NULL);
    // Load from a buffer shifted by one byte as well: every alignment changes.
    uint8_t *sh = malloc(bb.n + 1);
    memcpy(sh + 1, bb.p, bb.n);
    nm_whisper_model *a = NULL, *b = NULL;
    char err[512];
    NM_CHECK(load_buf(&bb, &a, err, sizeof err) == NM_OK);
    NM_CHECK(nm_whisper_model_load_memory(sh + 1, bb.n, &b, err, sizeof err) == NM_OK);
    if (a && b) {
        NM_CHECK(a->bytes_copied > 0 && b->bytes_copied > 0);
        NM_CHECK(same_model(&r->m, a, 51864, false) == 0 && same_model(&r->m, b, 51864, false) == 0);
    }
    nm_whisper_model_free(a);
    nm_whisper_model_free(b);
    free(sh);
    free(bb.p);
    rand_model_free(r);
    free(r);
}

// Fuzz seeds: files under 8 KB, so the network is tiny and the embedding too
// small for the vocabulary (bind stops at the decoder's token embedding); they
// still walk the header, filters, vocabulary and the whole tensor directory.
static buf small_bin(int variant) {
    buf b = {0};
    put_i32(&b, 0x67676d6c);
    const int32_t d = 4;
    const int32_t hv[11] = {51864, 2, d, 1, 1, 2, d, 1, 1, 1, 1};
    put(&b, hv, sizeof hv);
    put_i32(&b, 1);
    put_i32(&b, 201);
    for (int k = 0; k < 201; k++) {
        float f = k < 3 ? 0.01f * (float)k : 0.0f;
        put(&b, &f, 4);
    }
    put_i32(&b, 3);
    const char *toks[] = {"!", "\"", " the"};
    for (int i = 0; i < 3; i++) put_i32(&b, (int32_t)strlen(toks[i])), put(&b, toks[i], strlen(toks[i]));
    struct { const char *name; int nd; int32_t ne[3]; int type; } ts[] = {
        {"encoder.positional_embedding", 2, {d, 2}, 0}, {"encoder.conv1.weight", 3, {3, 1, d}, 1},
        {"encoder.conv1.bias", 2, {1, d}, 0},           {"encoder.conv2.weight", 3, {3, d, d}, 1},
        {"encoder.conv2.bias", 2, {1, d}, 0},           {"encoder.ln_post.weight", 1, {d}, 0},
        {"encoder.ln_post.bias", 1, {d}, 0},
        {"encoder.blocks.0.attn_ln.weight", 1, {d}, 0}, {"encoder.blocks.0.attn_ln.bias", 1, {d}, 0},
        {"encoder.blocks.0.attn.query.weight", 2, {d, d}, 1}, {"encoder.blocks.0.attn.query.bias", 1, {d}, 0},
        {"encoder.blocks.0.attn.key.weight", 2, {d, d}, 1},   {"encoder.blocks.0.attn.value.weight", 2, {d, d}, 1},
        {"encoder.blocks.0.attn.value.bias", 1, {d}, 0},      {"encoder.blocks.0.attn.out.weight", 2, {d, d}, 1},
        {"encoder.blocks.0.attn.out.bias", 1, {d}, 0},        {"encoder.blocks.0.mlp_ln.weight", 1, {d}, 0},
        {"encoder.blocks.0.mlp_ln.bias", 1, {d}, 0},          {"encoder.blocks.0.mlp.0.weight", 2, {d, 4 * d}, 1},
        {"encoder.blocks.0.mlp.0.bias", 1, {4 * d}, 0},       {"encoder.blocks.0.mlp.2.weight", 2, {4 * d, d}, 1},
        {"encoder.blocks.0.mlp.2.bias", 1, {d}, 0},           {"decoder.positional_embedding", 2, {d, 2}, 0},
        {"decoder.token_embedding.weight", 2, {d, 3}, 1},     {"decoder.ln.weight", 1, {d}, 0},
    };
    const int n = (int)(sizeof ts / sizeof ts[0]) - (variant == 1 ? 3 : 0);
    for (int i = 0; i < n; i++) {
        int j = variant == 2 ? n - 1 - i : i;
        put_i32(&b, ts[j].nd);
        put_i32(&b, (int32_t)strlen(ts[j].name));
        put_i32(&b, ts[j].type);
        put(&b, ts[j].ne, 4 * (size_t)ts[j].nd);
        put(&b, ts[j].name, strlen(ts[j].name));
        int64_t cnt = 1;
        for (int k = 0; k < ts[j].nd; k++) cnt *= ts[j].ne[k];
        for (int64_t k = 0; k < cnt; k++) {
            if (ts[j].type == 0) { float f = 0.125f * (float)(k % 7); put(&b, &f, 4); }
            else { uint16_t h = nm_fp32_to_fp16(0.25f * (float)(k % 5) - 0.5f); put(&b, &h, 2); }
        }
    }
    return b;
}

NM_TEST(small_bin_walks_to_the_embedding) {
    for (int v = 0; v < 3; v++) {
        buf b = small_bin(v);
        NM_CHECK(b.n < 8192);
        NM_CHECK(expect(&b, NM_ERR_FORMAT, v == 1 ? "missing tensor 'decoder.positional_embedding'"
                                                  : "decoder.token_embedding.weight' has shape"));
        free(b.p);
    }
}

NM_TEST_OPTIN(gen_corpus, "NM_GEN_CORPUS") {
    const char *dir = getenv("NM_GEN_CORPUS");
    mkdir(dir, 0755);
    for (int v = 0; v < 3; v++) {
        buf b = small_bin(v);
        const size_t cuts[] = {b.n, 3, 30, 52, 900, 935, 960, b.n / 2, b.n - 5};
        for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
            if (v && i) break; // variants only whole
            char path[1200];
            snprintf(path, sizeof path, "%s/%s-%zu.bin", dir, v == 0 ? "small" : v == 1 ? "no-decoder" : "reversed",
                     cuts[i]);
            FILE *f = fopen(path, "wb");
            NM_CHECK(f != NULL);
            if (f) fwrite(b.p, 1, cuts[i], f), fclose(f);
        }
        free(b.p);
    }
}

NM_TEST_MAIN()
