// Vocabulary, special tokens, the encode driver and detokenizing, common to
// both tokenizer models. The model-specific splitting is in bpe.c and spm.c.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bricks/tokenizer/chat.h"
#include "bricks/tokenizer/tok_impl.h"

// ---- scratch -------------------------------------------------------------------------

void *nm_scratch_get(nm_scratch *s, int slot, size_t bytes) {
    if (bytes == 0) bytes = 1;
    if (s->cap[slot] < bytes) {
        size_t cap = s->cap[slot] * 2 > bytes ? s->cap[slot] * 2 : bytes;
        free(s->buf[slot]);
        s->buf[slot] = malloc(cap);
        s->cap[slot] = s->buf[slot] ? cap : 0;
    }
    return s->buf[slot];
}

void nm_scratch_free(nm_scratch *s) {
    for (int i = 0; i < NM_SCRATCH_SLOTS; i++) free(s->buf[i]);
    memset(s, 0, sizeof(*s));
}

// ---- create / free -------------------------------------------------------------------

void nm_tokenizer_free(nm_tokenizer *t) {
    if (!t) return;
    if (t->type == NM_VOCAB_BPE) nm_bpe_free(t);
    nm_strindex_free(&t->vocab);
    nm_strindex_free(&t->special);
    free(t->tok_ptr);
    free(t->tok_len);
    free(t->scores);
    free(t->attr);
    free(t->sp_ptr);
    free(t->sp_len);
    free(t->sp_id);
    free(t->sp_lens);
    free(t->sp_first);
    free(t);
}

// A special token id: -1 when the key is absent; *bad set (and the message
// written) when it names no token of the vocabulary.
static int32_t get_id(const nm_gguf *g, const char *key, int32_t n_vocab, bool *bad, char *err, size_t err_size) {
    uint32_t v;
    if (!nm_gguf_get_u32(g, key, &v)) return -1;
    if (v >= (uint32_t)n_vocab) {
        if (!*bad) snprintf(err, err_size, "%s = %u is outside the vocabulary (%d tokens)", key, v, n_vocab);
        *bad = true;
        return -1;
    }
    return (int32_t)v;
}

// Tokens that end generation, found by text as llama.cpp does (converters do
// not always set eot_token_id). They are forced to control type.
static const char *const EOG_TEXTS[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
    "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>",
};

static nm_status load_vocab(nm_tokenizer *t, const nm_gguf *g, char *err, size_t err_size) {
    const nm_gguf_kv *kv = nm_gguf_find(g, "tokenizer.ggml.tokens");
    if (!kv) {
        snprintf(err, err_size, "tokenizer.ggml.tokens missing");
        return NM_ERR_FORMAT;
    }
    if (kv->type != NM_GGUF_ARRAY || kv->arr_type != NM_GGUF_STRING || kv->arr_n == 0 ||
        kv->arr_n >= INT32_MAX) {
        snprintf(err, err_size, "tokenizer.ggml.tokens is not a non-empty array of strings");
        return NM_ERR_FORMAT;
    }
    int32_t n = (int32_t)kv->arr_n;
    t->n_vocab = n;
    nm_str *toks = malloc((size_t)n * sizeof(nm_str));
    t->tok_ptr = malloc((size_t)n * sizeof(char *));
    t->tok_len = malloc((size_t)n * sizeof(uint32_t));
    t->attr = malloc((size_t)n);
    if (!toks || !t->tok_ptr || !t->tok_len || !t->attr) {
        free(toks);
        return NM_ERR_NOMEM;
    }
    if (!nm_gguf_arr_strings(kv, toks, (uint64_t)n)) {
        free(toks);
        snprintf(err, err_size, "tokenizer.ggml.tokens unreadable");
        return NM_ERR_FORMAT;
    }
    for (int32_t i = 0; i < n; i++) {
        if (toks[i].len > UINT32_MAX) {
            free(toks);
            snprintf(err, err_size, "token %d is too long", i);
            return NM_ERR_FORMAT;
        }
        t->tok_ptr[i] = toks[i].ptr;
        t->tok_len[i] = (uint32_t)toks[i].len;
    }
    free(toks);

    const nm_gguf_kv *tt = nm_gguf_find(g, "tokenizer.ggml.token_type");
    if (tt && (tt->type != NM_GGUF_ARRAY || tt->arr_n < (uint64_t)n ||
               !nm_gguf_vtype_size(tt->arr_type))) {
        snprintf(err, err_size, "tokenizer.ggml.token_type is not a numeric array of %d", n);
        return NM_ERR_FORMAT;
    }
    for (int32_t i = 0; i < n; i++) {
        int type = tt ? (int)nm_gguf_arr_num(tt, (uint64_t)i) : 1;
        uint8_t a = 0; // undefined types decode to nothing, as in llama.cpp
        switch (type) {
        case 1: a = NM_TOKA_NORMAL; break;
        case 2: a = NM_TOKA_UNKNOWN; break;
        case 3: a = NM_TOKA_CONTROL; break;
        case 4: a = NM_TOKA_USER; break;
        case 5: a = NM_TOKA_UNUSED; break;
        case 6: a = NM_TOKA_BYTE; break;
        }
        t->attr[i] = a;
    }

    const nm_gguf_kv *sc = nm_gguf_find(g, "tokenizer.ggml.scores");
    if (sc) {
        if (sc->type != NM_GGUF_ARRAY || sc->arr_n < (uint64_t)n ||
            !nm_gguf_vtype_size(sc->arr_type)) {
            snprintf(err, err_size, "tokenizer.ggml.scores is not a numeric array of %d", n);
            return NM_ERR_FORMAT;
        }
        t->scores = malloc((size_t)n * sizeof(float));
        if (!t->scores) return NM_ERR_NOMEM;
        for (int32_t i = 0; i < n; i++) t->scores[i] = (float)nm_gguf_arr_num(sc, (uint64_t)i);
    } else if (t->type == NM_VOCAB_SPM) {
        t->scores = calloc((size_t)n, sizeof(float));
        if (!t->scores) return NM_ERR_NOMEM;
    }
    return nm_strindex_build(&t->vocab, t->tok_ptr, t->tok_len, (uint32_t)n);
}

static nm_status load_special_ids(nm_tokenizer *t, const nm_gguf *g, char *err, size_t err_size) {
    int32_t n = t->n_vocab;
    bool bad = false;
    t->bos = get_id(g, "tokenizer.ggml.bos_token_id", n, &bad, err, err_size);
    t->eos = get_id(g, "tokenizer.ggml.eos_token_id", n, &bad, err, err_size);
    t->eot = get_id(g, "tokenizer.ggml.eot_token_id", n, &bad, err, err_size);
    t->eom = get_id(g, "tokenizer.ggml.eom_token_id", n, &bad, err, err_size);
    t->unk = get_id(g, "tokenizer.ggml.unknown_token_id", n, &bad, err, err_size);
    t->pad = get_id(g, "tokenizer.ggml.padding_token_id", n, &bad, err, err_size);
    if (bad) return NM_ERR_FORMAT;

    for (size_t i = 0; i < sizeof(EOG_TEXTS) / sizeof(EOG_TEXTS[0]); i++) {
        int32_t id = nm_strindex_find(&t->vocab, EOG_TEXTS[i], strlen(EOG_TEXTS[i]));
        if (id < 0) continue;
        if (t->eot < 0 && strcmp(EOG_TEXTS[i], "<|eom_id|>") != 0) t->eot = id;
        if (t->eom < 0 && strcmp(EOG_TEXTS[i], "<|eom_id|>") == 0) t->eom = id;
        t->attr[id] |= NM_TOKA_EOG | NM_TOKA_CONTROL;
    }
    if (t->eos >= 0) t->attr[t->eos] |= NM_TOKA_EOG;
    if (t->eot >= 0) t->attr[t->eot] |= NM_TOKA_EOG;
    if (t->eom >= 0) t->attr[t->eom] |= NM_TOKA_EOG;
    return NM_OK;
}

typedef struct sp_key {
    uint32_t len;
    int32_t id;
} sp_key;

// Longest first, then by id (plain qsort: qsort_r is not portable).
static int cmp_special(const void *a, const void *b) {
    const sp_key *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

// Control, unknown and user-defined tokens, longest first, with per-length
// first-byte sets so the scan over the text rejects most positions with one
// bit test.
static nm_status build_specials(nm_tokenizer *t) {
    int32_t ns = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if ((t->attr[i] & (NM_TOKA_CONTROL | NM_TOKA_USER | NM_TOKA_UNKNOWN)) && t->tok_len[i] > 0)
            ns++;
    t->n_special = ns;
    if (ns == 0) return NM_OK;
    t->sp_id = malloc((size_t)ns * sizeof(int32_t));
    t->sp_ptr = malloc((size_t)ns * sizeof(char *));
    t->sp_len = malloc((size_t)ns * sizeof(uint32_t));
    t->sp_lens = malloc((size_t)ns * sizeof(uint32_t));
    if (!t->sp_id || !t->sp_ptr || !t->sp_len || !t->sp_lens) return NM_ERR_NOMEM;
    sp_key *keys = malloc((size_t)ns * sizeof(sp_key));
    if (!keys) return NM_ERR_NOMEM;
    ns = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if ((t->attr[i] & (NM_TOKA_CONTROL | NM_TOKA_USER | NM_TOKA_UNKNOWN)) && t->tok_len[i] > 0)
            keys[ns++] = (sp_key){t->tok_len[i], i};
    qsort(keys, (size_t)ns, sizeof(sp_key), cmp_special);
    for (int32_t k = 0; k < ns; k++) t->sp_id[k] = keys[k].id;
    free(keys);
    int32_t nl = 0;
    for (int32_t k = 0; k < ns; k++) {
        int32_t id = t->sp_id[k];
        t->sp_ptr[k] = t->tok_ptr[id];
        t->sp_len[k] = t->tok_len[id];
        if (nl == 0 || t->sp_lens[nl - 1] != t->sp_len[k]) t->sp_lens[nl++] = t->sp_len[k];
    }
    t->n_sp_lens = nl;
    t->sp_first = calloc((size_t)nl, 32);
    if (!t->sp_first) return NM_ERR_NOMEM;
    for (int32_t k = 0, li = 0; k < ns; k++) {
        while (t->sp_lens[li] != t->sp_len[k]) li++;
        uint8_t b = (uint8_t)t->sp_ptr[k][0];
        t->sp_first[li * 32 + b / 8] |= (uint8_t)(1u << (b % 8));
    }
    // Duplicated texts: the index keeps the last, i.e. the highest id.
    return nm_strindex_build(&t->special, t->sp_ptr, t->sp_len, (uint32_t)ns);
}

nm_status nm_tokenizer_create(const nm_gguf *g, nm_tokenizer **out, char *err, size_t err_size) {
    char dummy[1];
    if (!err) {
        err = dummy;
        err_size = sizeof(dummy);
    }
    if (err_size) err[0] = 0;
    *out = NULL;
    if (!g) {
        snprintf(err, err_size, "no GGUF");
        return NM_ERR_INVALID_ARG;
    }
    nm_str model;
    if (!nm_gguf_get_str(g, "tokenizer.ggml.model", &model)) {
        snprintf(err, err_size, "tokenizer.ggml.model missing");
        return NM_ERR_FORMAT;
    }
    nm_tokenizer *t = calloc(1, sizeof(*t));
    if (!t) return NM_ERR_NOMEM;
    nm_status st;
    if (nm_str_eq(model, "gpt2")) {
        t->type = NM_VOCAB_BPE;
    } else if (nm_str_eq(model, "llama")) {
        t->type = NM_VOCAB_SPM;
        t->add_bos = true;          // llama.cpp's SPM defaults; the keys below override
        t->add_space_prefix = true;
    } else {
        snprintf(err, err_size, "tokenizer model '%.*s' not supported (gpt2, llama)",
                 (int)(model.len > 64 ? 64 : model.len), model.ptr);
        free(t);
        return NM_ERR_UNSUPPORTED;
    }

    st = load_vocab(t, g, err, err_size);
    if (st == NM_OK) {
        st = load_special_ids(t, g, err, err_size);
        if (st == NM_OK) st = build_specials(t);
    }
    if (st == NM_OK) {
        if (t->type == NM_VOCAB_BPE) {
            st = nm_bpe_init(t, g, err, err_size);
        } else {
            static const char hex[] = "0123456789ABCDEF";
            for (int b = 0; b < 256; b++) {
                char name[6] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
                int32_t id = nm_strindex_find(&t->vocab, name, 6);
                if (id < 0) {
                    char c = (char)b;
                    id = nm_strindex_find(&t->vocab, &c, 1);
                }
                t->byte_tok[b] = id;
            }
        }
    }
    if (st != NM_OK) {
        if (err_size && !err[0]) snprintf(err, err_size, "tokenizer: %s", nm_status_str(st));
        nm_tokenizer_free(t);
        return st;
    }
    bool v;
    if (nm_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &v)) t->add_bos = v;
    if (nm_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &v)) t->add_eos = v;
    if (nm_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &v)) t->add_space_prefix = v;
    if (t->type == NM_VOCAB_BPE) t->add_space_prefix = false; // the regexes handle spaces
    if (!nm_gguf_get_str(g, "tokenizer.chat_template", &t->chat_template))
        t->chat_template = (nm_str){"", 0};
    *out = t;
    return NM_OK;
}

// ---- getters -------------------------------------------------------------------------

int32_t nm_tokenizer_n_vocab(const nm_tokenizer *t) { return t->n_vocab; }
int32_t nm_tokenizer_bos(const nm_tokenizer *t) { return t->bos; }
int32_t nm_tokenizer_eos(const nm_tokenizer *t) { return t->eos; }
bool nm_tokenizer_add_bos(const nm_tokenizer *t) { return t->add_bos && t->bos >= 0; }
bool nm_tokenizer_is_eog(const nm_tokenizer *t, int32_t tok) {
    return tok >= 0 && tok < t->n_vocab && (t->attr[tok] & NM_TOKA_EOG);
}
nm_str nm_tokenizer_chat_template(const nm_tokenizer *t) { return t->chat_template; }

int32_t nm_tokenizer_find(const nm_tokenizer *t, const char *text, size_t len) {
    return nm_strindex_find(&t->vocab, text, len);
}

nm_str nm_tokenizer_text(const nm_tokenizer *t, int32_t tok) {
    if (tok < 0 || tok >= t->n_vocab) return (nm_str){"", 0};
    return (nm_str){t->tok_ptr[tok], t->tok_len[tok]};
}

nm_chat_tmpl nm_tokenizer_chat_tmpl(const nm_tokenizer *t) {
    nm_chat_tmpl c = nm_chat_detect(t->chat_template.ptr, (size_t)t->chat_template.len);
    if (c != NM_CHAT_UNKNOWN) return c;
    // No template at all: a base model (Gemma 3 270M), not made for chat, even
    // if its vocabulary has turn markers; the caller must name one.
    if (t->chat_template.len == 0) return NM_CHAT_UNKNOWN;
    // A template we cannot read: the turn markers in the vocab tell.
    static const struct {
        const char *tok;
        nm_chat_tmpl tmpl;
    } marks[] = {
        {"<start_of_turn>", NM_CHAT_GEMMA},
        {"<|start_header_id|>", NM_CHAT_LLAMA3},
        {"<|im_start|>", NM_CHAT_CHATML},
    };
    for (size_t i = 0; i < sizeof(marks) / sizeof(marks[0]); i++)
        if (nm_tokenizer_find(t, marks[i].tok, strlen(marks[i].tok)) >= 0) return marks[i].tmpl;
    return NM_CHAT_UNKNOWN;
}

// ---- encode --------------------------------------------------------------------------

// Marks where special tokens sit in the raw text: mark[i] = token id if one
// starts at byte i, -2 inside one, -1 for plain text.
//
// llama.cpp (tokenizer_st_partition) takes the special tokens longest first
// and, for each, splits every remaining plain-text fragment at its leftmost
// non-overlapping occurrences. Going through the distinct lengths longest
// first and taking, left to right, every uncovered occurrence of any token of
// that length gives the same partition (tokens of equal length can only
// disagree when they overlap each other, where llama.cpp's order is itself
// unspecified).
static void partition(const nm_tokenizer *t, const char *text, size_t len, bool parse_special,
                      int32_t *mark) {
    for (size_t i = 0; i < len; i++) mark[i] = -1;
    for (int32_t li = 0; li < t->n_sp_lens; li++) {
        size_t L = t->sp_lens[li];
        const uint8_t *first = t->sp_first + (size_t)li * 32;
        if (L > len) continue;
        for (size_t i = 0; i + L <= len;) {
            uint8_t b = (uint8_t)text[i];
            if (mark[i] != -1 || !(first[b / 8] & (1u << (b % 8)))) {
                i++;
                continue;
            }
            // The whole span must still be plain text.
            bool free_span = mark[i + L - 1] == -1;
            for (size_t j = i + 1; free_span && j + 1 < i + L; j++) free_span = mark[j] == -1;
            int32_t k = free_span ? nm_strindex_find(&t->special, text + i, L) : -1;
            if (k >= 0) {
                int32_t id = t->sp_id[k];
                // Without parse_special only user-defined tokens are matched.
                if (!parse_special && !(t->attr[id] & NM_TOKA_USER)) k = -1;
                if (k >= 0) {
                    mark[i] = id;
                    for (size_t j = 1; j < L; j++) mark[i + j] = -2;
                    i += L;
                    continue;
                }
            }
            i++;
        }
    }
}

int32_t nm_tokenizer_encode(const nm_tokenizer *t, const char *text, size_t len, int32_t *out,
                            int32_t n_max, bool add_special, bool parse_special) {
    if (!t || (!text && len) || n_max < 0 || (!out && n_max > 0)) return NM_ERR_INVALID_ARG;
    if (len > (size_t)INT32_MAX) return NM_ERR_RANGE;
    nm_tok_out o = {out, n_max, 0};
    nm_scratch s = {0};
    nm_status st = NM_OK;

    if (add_special && t->add_bos && t->bos >= 0) nm_tok_emit(&o, t->bos);

    int32_t *mark = NULL;
    if (t->n_special > 0 && len > 0) {
        mark = nm_scratch_get(&s, NM_SCRATCH_PARTITION, len * sizeof(int32_t));
        if (!mark) {
            nm_scratch_free(&s);
            return NM_ERR_NOMEM;
        }
        partition(t, text, len, parse_special, mark);
    }

    bool prev_special = true; // SPM: a space prefix goes before the first fragment too
    for (size_t i = 0; i < len && st == NM_OK;) {
        if (mark && mark[i] >= 0) {
            nm_tok_emit(&o, mark[i]);
            i += t->tok_len[mark[i]];
            prev_special = true;
            continue;
        }
        size_t j = i + 1;
        while (j < len && !(mark && mark[j] >= 0)) j++;
        if (t->type == NM_VOCAB_BPE)
            st = nm_bpe_encode(t, text + i, j - i, &o, &s);
        else
            st = nm_spm_encode(t, text + i, j - i, t->add_space_prefix && prev_special, &o, &s);
        prev_special = false;
        i = j;
    }
    nm_scratch_free(&s);
    if (st != NM_OK) return st;

    if (add_special && t->add_eos && t->eos >= 0) nm_tok_emit(&o, t->eos);
    if (o.n > INT32_MAX) return NM_ERR_RANGE;
    return o.n <= n_max ? (int32_t)o.n : -(int32_t)o.n;
}

// ---- decode --------------------------------------------------------------------------

static int32_t copy_out(const char *p, size_t n, char *buf, int32_t size) {
    if ((size_t)size < n) return -(int32_t)n;
    memcpy(buf, p, n);
    return (int32_t)n;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

int32_t nm_tokenizer_piece(const nm_tokenizer *t, int32_t tok, char *buf, int32_t size,
                           bool special) {
    if (!t || tok < 0 || tok >= t->n_vocab || size < 0 || (!buf && size > 0)) return 0;
    uint8_t a = t->attr[tok];
    const char *p = t->tok_ptr[tok];
    uint32_t n = t->tok_len[tok];
    if (a & (NM_TOKA_CONTROL | NM_TOKA_UNKNOWN)) return special ? copy_out(p, n, buf, size) : 0;
    if (a & NM_TOKA_USER) return copy_out(p, n, buf, size);
    if (a & NM_TOKA_NORMAL) {
        if (t->type == NM_VOCAB_BPE) return nm_bpe_decode_text(t, p, n, buf, size);
        // SPM: U+2581 -> ' '
        int32_t k = 0;
        for (uint32_t i = 0; i < n;) {
            bool sp = i + 3 <= n && memcmp(p + i, "\xe2\x96\x81", 3) == 0;
            if (k < size) buf[k] = sp ? ' ' : p[i];
            k++;
            i += sp ? 3 : 1;
        }
        return k <= size ? k : -k;
    }
    if (a & NM_TOKA_BYTE) {
        int hi = n == 6 ? hexval(p[3]) : -1, lo = n == 6 ? hexval(p[4]) : -1;
        if (hi < 0 || lo < 0) return copy_out(p, n, buf, size); // not <0xXX>: its text
        char c = (char)(hi * 16 + lo);
        return copy_out(&c, 1, buf, size);
    }
    return 0; // unused / undefined
}

int32_t nm_tokenizer_decode(const nm_tokenizer *t, const int32_t *toks, int32_t n, char *buf,
                            int32_t size, bool special) {
    if (!t || n < 0 || (!toks && n) || size < 0 || (!buf && size > 0)) return NM_ERR_INVALID_ARG;
    int64_t k = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t room = k < size ? (int32_t)(size - k) : 0;
        int32_t r = nm_tokenizer_piece(t, toks[i], room ? buf + k : NULL, room, special);
        k += r < 0 ? -(int64_t)r : r;
        if (k > INT32_MAX) return NM_ERR_RANGE;
    }
    return k <= size ? (int32_t)k : -(int32_t)k;
}

// Bytes at the end of s[0..n) that start a UTF-8 sequence not yet complete
// (0..3). Invalid bytes are never held: they pass through as they are.
static int32_t utf8_incomplete_tail(const uint8_t *s, int32_t n) {
    for (int32_t back = 1; back <= 3 && back <= n; back++) {
        uint8_t c = s[n - back];
        if ((c & 0xc0) == 0x80) continue; // continuation: look further back
        int32_t need = c >= 0xf0 && c < 0xf8 ? 4 : c >= 0xe0 && c < 0xf0 ? 3 : c >= 0xc0 && c < 0xe0 ? 2 : 1;
        return need > back ? back : 0;
    }
    return 0;
}

int32_t nm_tokenizer_detok_push(const nm_tokenizer *t, nm_detok *d, int32_t tok, char *out,
                                int32_t size) {
    if (!t || !d || size < 0 || (!out && size > 0) || d->n_pending < 0 ||
        d->n_pending > (int32_t)sizeof(d->pending))
        return NM_ERR_INVALID_ARG;
    int32_t np = d->n_pending;
    int32_t room = size > np ? size - np : 0;
    int32_t r = nm_tokenizer_piece(t, tok, room ? out + np : NULL, room, false);
    if (r < 0 || np > size) return -(np + (r < 0 ? -r : r));
    memcpy(out, d->pending, (size_t)np);
    int32_t total = np + r;
    int32_t hold = utf8_incomplete_tail((const uint8_t *)out, total);
    memcpy(d->pending, out + total - hold, (size_t)hold);
    d->n_pending = hold;
    return total - hold;
}
