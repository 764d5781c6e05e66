// Byte-level BPE (tokenizer.ggml.model = "gpt2"): SmolLM2, Qwen2, Llama 3.
//
// 1. The raw text is split into pre-tokens by the regexes of the
//    pre-tokenizer (tokenizer.ggml.pre), applied one after the other: each
//    splits every piece left by the previous one into matches and the gaps
//    between them (llama.cpp's unicode_regex_split does the same).
// 2. Each pre-token's bytes are mapped to GPT-2's printable stand-in code
//    points (one symbol per byte) and adjacent symbols are merged, lowest
//    merge rank first, until no ranked pair is left.
// Symbols are token ids throughout: the merge table maps an id pair straight
// to (rank, merged id), so no strings are built on the hot path.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bricks/tokenizer/tok_impl.h"

// ---- pre-tokenizers (regexes as in llama.cpp's llama-vocab.cpp) -----------------------

#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_CONTRACTIONS_CI "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RE_LLAMA3                                                                               \
    RE_CONTRACTIONS_CI "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|" \
                       "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                                            \
    RE_CONTRACTIONS_CI "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|" \
                       "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

typedef struct pre_kind {
    const char *re[NM_BPE_MAX_REGEX]; // NULL-terminated
    bool ignore_merges;
    bool add_bos; // default when tokenizer.ggml.add_bos_token is absent
} pre_kind;

static const pre_kind PRE_DEFAULT = {
    {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}, false, false};
static const pre_kind PRE_GPT2 = {{RE_GPT2}, false, false};
static const pre_kind PRE_SMOLLM = {{"\\p{N}", RE_GPT2}, false, false}; // digits one by one
static const pre_kind PRE_QWEN2 = {{RE_QWEN2}, false, false};
static const pre_kind PRE_LLAMA3 = {{RE_LLAMA3}, true, true};

static const struct {
    const char *name;
    const pre_kind *kind;
} PRE_NAMES[] = {
    {"default", &PRE_DEFAULT},   {"gpt-2", &PRE_GPT2},        {"gpt2", &PRE_GPT2},
    {"phi-2", &PRE_GPT2},        {"mpt", &PRE_GPT2},          {"olmo", &PRE_GPT2},
    {"jais", &PRE_GPT2},         {"exaone4", &PRE_GPT2},      {"smollm", &PRE_SMOLLM},
    {"starcoder", &PRE_SMOLLM},  {"refact", &PRE_SMOLLM},     {"command-r", &PRE_SMOLLM},
    {"codeshell", &PRE_SMOLLM},  {"exaone", &PRE_SMOLLM},     {"minerva-7b", &PRE_SMOLLM},
    {"qwen2", &PRE_QWEN2},       {"deepseek-r1-qwen", &PRE_QWEN2}, {"stablelm2", &PRE_QWEN2},
    {"megrez", &PRE_QWEN2},      {"llama3", &PRE_LLAMA3},     {"llama-v3", &PRE_LLAMA3},
    {"llama-bpe", &PRE_LLAMA3},  {"falcon3", &PRE_LLAMA3},    {"dbrx", &PRE_LLAMA3},
    {"smaug-bpe", &PRE_LLAMA3},  {"lfm2", &PRE_LLAMA3},
};

// ---- GPT-2 byte <-> code point map ----------------------------------------------------
// Printable Latin-1 bytes stand for themselves; the other 68 bytes get code
// points 256, 257, ... in byte order (GPT-2's bytes_to_unicode()).

static bool byte_is_printable(int b) {
    return (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
}

static int utf8_put(char *o, uint32_t c) {
    if (c < 0x80) {
        o[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (char)(0xc0 | (c >> 6));
        o[1] = (char)(0x80 | (c & 0x3f));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (char)(0xe0 | (c >> 12));
        o[1] = (char)(0x80 | ((c >> 6) & 0x3f));
        o[2] = (char)(0x80 | (c & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (c >> 18));
    o[1] = (char)(0x80 | ((c >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((c >> 6) & 0x3f));
    o[3] = (char)(0x80 | (c & 0x3f));
    return 4;
}

static void build_byte_map(nm_tokenizer *t) {
    memset(t->cpt_byte, 0xff, sizeof(t->cpt_byte));
    int next = 256;
    for (int b = 0; b < 256; b++) {
        int c = byte_is_printable(b) ? b : next++;
        int n = utf8_put(t->byte_chr[b], (uint32_t)c);
        t->byte_chr[b][n] = 0;
        t->cpt_byte[c] = (int16_t)b;
    }
}

// ---- init ----------------------------------------------------------------------------

static nm_status load_merges(nm_tokenizer *t, const nm_gguf *g, char *err, size_t err_size) {
    const nm_gguf_kv *kv = nm_gguf_find(g, "tokenizer.ggml.merges");
    if (!kv) {
        snprintf(err, err_size, "tokenizer.ggml.merges missing (required for a gpt2 tokenizer)");
        return NM_ERR_FORMAT;
    }
    if (kv->type != NM_GGUF_ARRAY || kv->arr_type != NM_GGUF_STRING || kv->arr_n >= INT32_MAX) {
        snprintf(err, err_size, "tokenizer.ggml.merges is not an array of strings");
        return NM_ERR_FORMAT;
    }
    uint32_t n = (uint32_t)kv->arr_n;
    nm_str *m = malloc((size_t)(n ? n : 1) * sizeof(nm_str));
    if (!m) return NM_ERR_NOMEM;
    if (!nm_gguf_arr_strings(kv, m, n)) {
        free(m);
        snprintf(err, err_size, "tokenizer.ggml.merges unreadable");
        return NM_ERR_FORMAT;
    }
    nm_status st = nm_u64map_init(&t->merges, n);
    char tmp[512];
    for (uint32_t r = 0; st == NM_OK && r < n; r++) {
        // "left right": split at the first space after the first byte (a
        // byte-level token never contains a real space).
        const char *p = m[r].ptr;
        uint64_t len = m[r].len, sp = 1;
        while (sp < len && p[sp] != ' ') sp++;
        if (sp >= len) continue; // malformed line: ignored, as llama.cpp would never match it
        uint64_t rl = len - sp - 1;
        int32_t a = nm_strindex_find(&t->vocab, p, sp);
        int32_t b = nm_strindex_find(&t->vocab, p + sp + 1, rl);
        if (a < 0 || b < 0 || sp + rl > sizeof(tmp)) continue;
        memcpy(tmp, p, sp);
        memcpy(tmp + sp, p + sp + 1, rl);
        int32_t ab = nm_strindex_find(&t->vocab, tmp, sp + rl);
        if (ab < 0) continue; // merge result not in the vocab: unusable
        nm_u64map_put_first(&t->merges, ((uint64_t)(uint32_t)a << 32) | (uint32_t)b,
                            ((uint64_t)r << 32) | (uint32_t)ab);
    }
    free(m);
    return st;
}

nm_status nm_bpe_init(nm_tokenizer *t, const nm_gguf *g, char *err, size_t err_size) {
    build_byte_map(t);
    for (int b = 0; b < 256; b++)
        t->byte_tok[b] = nm_strindex_find(&t->vocab, t->byte_chr[b], strlen(t->byte_chr[b]));

    nm_str pre = {"", 0};
    nm_gguf_get_str(g, "tokenizer.ggml.pre", &pre);
    const pre_kind *kind = NULL;
    if (pre.len == 0) {
        kind = &PRE_DEFAULT; // llama.cpp: missing pre-tokenizer -> "default"
    } else {
        for (size_t i = 0; i < sizeof(PRE_NAMES) / sizeof(PRE_NAMES[0]); i++)
            if (nm_str_eq(pre, PRE_NAMES[i].name)) kind = PRE_NAMES[i].kind;
    }
    if (!kind) {
        fprintf(stderr, "nanomind: warning: unknown pre-tokenizer '%.*s', using gpt-2's regex\n",
                (int)(pre.len > 64 ? 64 : pre.len), pre.ptr);
        kind = &PRE_GPT2;
    }
    t->ignore_merges = kind->ignore_merges;
    t->add_bos = kind->add_bos; // default; tokenizer.ggml.add_bos_token overrides

    for (int i = 0; i < NM_BPE_MAX_REGEX && kind->re[i]; i++) {
        int ec;
        PCRE2_SIZE eo;
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)kind->re[i], PCRE2_ZERO_TERMINATED,
                                       PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &ec, &eo, NULL);
        if (!re) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(ec, msg, sizeof(msg));
            snprintf(err, err_size, "pre-tokenizer regex %d: %s at %zu", i, (const char *)msg,
                     (size_t)eo);
            return NM_ERR_UNSUPPORTED;
        }
        pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); // optional: interpreted if JIT is absent
        t->re[t->n_re++] = re;
    }
    return load_merges(t, g, err, err_size);
}

void nm_bpe_free(nm_tokenizer *t) {
    for (int i = 0; i < t->n_re; i++) pcre2_code_free((pcre2_code *)t->re[i]);
    t->n_re = 0;
    nm_u64map_free(&t->merges);
}

// ---- encode --------------------------------------------------------------------------

// Reads one code point at p[0..n) the way llama.cpp's unicode_cpt_from_utf8
// does: the lead byte says the length, continuation bytes must follow, and
// nothing else is checked (overlong forms and surrogates pass). Returns the
// bytes consumed (1 for an invalid byte, *cpt = U+FFFD).
static size_t utf8_read_lenient(const uint8_t *p, size_t n, uint32_t *cpt) {
    uint8_t c = p[0];
    size_t len = c < 0x80 ? 1 : !(c & 0x40) ? 0 : !(c & 0x20) ? 2 : !(c & 0x10) ? 3 : !(c & 0x08) ? 4 : 0;
    if (len == 1) {
        *cpt = c;
        return 1;
    }
    if (len == 0 || len > n) {
        *cpt = 0xfffd;
        return 1;
    }
    uint32_t v = c & (0x7f >> len);
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xc0) != 0x80) {
            *cpt = 0xfffd;
            return 1;
        }
        v = (v << 6) | (p[i] & 0x3f);
    }
    // llama.cpp keeps surrogates and fails on > U+10FFFF; neither is valid
    // UTF-8 for PCRE2, so both read as U+FFFD here (one per sequence).
    *cpt = (v >= 0xd800 && v <= 0xdfff) || v > 0x10ffff ? 0xfffd : v;
    return len;
}

static int utf8_put(char *o, uint32_t c);

// Normalises the text as llama.cpp does before splitting (it decodes to code
// points and re-encodes): invalid bytes become U+FFFD, overlong forms their
// shortest encoding. Returns text itself when that changes nothing (valid
// UTF-8, the normal case); NULL on OOM.
static const char *sanitize_utf8(const char *text, size_t len, size_t *out_len, nm_scratch *s) {
    const uint8_t *p = (const uint8_t *)text;
    *out_len = len;
    size_t i = 0;
    char enc[4];
    while (i < len) {
        if (p[i] < 0x80) { // ASCII fast path
            i++;
            continue;
        }
        uint32_t c;
        size_t l = utf8_read_lenient(p + i, len - i, &c);
        if ((size_t)utf8_put(enc, c) != l || memcmp(enc, p + i, l) != 0) break;
        i += l;
    }
    if (i == len) return text;
    char *o = nm_scratch_get(s, 0, len * 3); // every input byte yields at most 3
    if (!o) return NULL;
    memcpy(o, text, i);
    size_t k = i;
    while (i < len) {
        uint32_t c;
        i += utf8_read_lenient(p + i, len - i, &c);
        k += (size_t)utf8_put(o + k, c);
    }
    *out_len = k;
    return o;
}

typedef struct piece {
    uint32_t off, len;
} piece;

typedef struct bsym {
    int32_t id;   // token id; -1: a byte the vocab has no symbol for
    int32_t prev; // -1: none
    int32_t next; // -1: none
    int32_t alive;
} bsym;

typedef struct bigram {
    int32_t rank;
    int32_t left, right;
    int32_t lid, rid; // ids when queued: stale if either symbol changed since
    int32_t merged;
} bigram;

// Min-heap on (rank, left): equal ranks merge leftmost first, like llama.cpp's
// llm_bigram_bpe comparator.
static bool bg_less(const bigram *a, const bigram *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static void heap_push(bigram *h, int32_t *n, bigram v) {
    int32_t i = (*n)++;
    while (i > 0) {
        int32_t p = (i - 1) / 2;
        if (!bg_less(&v, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static bigram heap_pop(bigram *h, int32_t *n) {
    bigram top = h[0];
    bigram last = h[--(*n)];
    int32_t i = 0;
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && bg_less(&h[c + 1], &h[c])) c++;
        if (!bg_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = last;
    return top;
}

static void try_pair(const nm_tokenizer *t, const bsym *sy, int32_t l, int32_t r, bigram *h,
                     int32_t *nh) {
    if (l < 0 || r < 0 || sy[l].id < 0 || sy[r].id < 0) return;
    uint64_t v;
    uint64_t key = ((uint64_t)(uint32_t)sy[l].id << 32) | (uint32_t)sy[r].id;
    if (!nm_u64map_get(&t->merges, key, &v)) return;
    bigram b = {(int32_t)(v >> 32), l, r, sy[l].id, sy[r].id, (int32_t)(uint32_t)v};
    heap_push(h, nh, b);
}

// One pre-token: bytes -> symbols -> merges -> ids.
static void bpe_word(const nm_tokenizer *t, const uint8_t *w, uint32_t n, bsym *sy, bigram *h,
                     char *enc, nm_tok_out *out) {
    if (t->ignore_merges) {
        size_t k = 0;
        for (uint32_t i = 0; i < n; i++) {
            const char *c = t->byte_chr[w[i]];
            while (*c) enc[k++] = *c++;
        }
        int32_t id = nm_strindex_find(&t->vocab, enc, k);
        if (id >= 0) {
            nm_tok_emit(out, id);
            return;
        }
    }
    for (uint32_t i = 0; i < n; i++) {
        sy[i].id = t->byte_tok[w[i]];
        sy[i].prev = (int32_t)i - 1;
        sy[i].next = i + 1 < n ? (int32_t)i + 1 : -1;
        sy[i].alive = 1;
    }
    int32_t nh = 0;
    for (uint32_t i = 1; i < n; i++) try_pair(t, sy, (int32_t)i - 1, (int32_t)i, h, &nh);
    while (nh > 0) {
        bigram b = heap_pop(h, &nh);
        bsym *L = &sy[b.left], *R = &sy[b.right];
        if (!L->alive || !R->alive || L->id != b.lid || R->id != b.rid) continue; // stale
        L->id = b.merged;
        R->alive = 0;
        L->next = R->next;
        if (R->next >= 0) sy[R->next].prev = b.left;
        try_pair(t, sy, L->prev, b.left, h, &nh);
        try_pair(t, sy, b.left, L->next, h, &nh);
    }
    for (int32_t i = 0; i >= 0 && (uint32_t)i < n; i = sy[i].next)
        if (sy[i].id >= 0) nm_tok_emit(out, sy[i].id);
}

// Splits every piece of `in` by one regex into matches and the gaps between
// them. Returns the number of pieces written to `outp` (never more than the
// text's length), or -1 on a matcher error.
static int64_t regex_split(const pcre2_code *re, pcre2_match_data *md, const char *text,
                           const piece *in, int64_t n_in, piece *outp) {
    int64_t n = 0;
    for (int64_t k = 0; k < n_in; k++) {
        PCRE2_SPTR subj = (PCRE2_SPTR)(text + in[k].off);
        PCRE2_SIZE slen = in[k].len, pos = 0, gap = 0;
        while (pos < slen) {
            int rc = pcre2_match(re, subj, slen, pos, PCRE2_NO_UTF_CHECK, md, NULL);
            if (rc == PCRE2_ERROR_NOMATCH) break;
            if (rc < 0) return -1;
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            PCRE2_SIZE ms = ov[0], me = ov[1];
            if (me == ms) { // empty match: step over one character, leave it in the gap
                pos = ms + nm_utf8_len(subj[ms]);
                continue;
            }
            if (ms > gap) outp[n++] = (piece){in[k].off + (uint32_t)gap, (uint32_t)(ms - gap)};
            outp[n++] = (piece){in[k].off + (uint32_t)ms, (uint32_t)(me - ms)};
            pos = gap = me;
        }
        if (slen > gap) outp[n++] = (piece){in[k].off + (uint32_t)gap, (uint32_t)(slen - gap)};
    }
    return n;
}

nm_status nm_bpe_encode(const nm_tokenizer *t, const char *text, size_t len, nm_tok_out *out,
                        nm_scratch *s) {
    if (len == 0) return NM_OK;
    if (len > UINT32_MAX / 4) return NM_ERR_RANGE;
    size_t n;
    const char *u = sanitize_utf8(text, len, &n, s);
    if (!u) return NM_ERR_NOMEM;

    // Pre-tokenize: pieces ping-pong between two arrays, one regex at a time.
    piece *pa = nm_scratch_get(s, 1, n * sizeof(piece));
    piece *pb = nm_scratch_get(s, 2, n * sizeof(piece));
    if (!pa || !pb) return NM_ERR_NOMEM;
    int64_t np = 1;
    pa[0] = (piece){0, (uint32_t)n};
    if (t->n_re > 0) {
        pcre2_match_data *md = pcre2_match_data_create(1, NULL);
        if (!md) return NM_ERR_NOMEM;
        for (int r = 0; r < t->n_re; r++) {
            np = regex_split((const pcre2_code *)t->re[r], md, u, pa, np, pb);
            if (np < 0) {
                pcre2_match_data_free(md);
                return NM_ERR_FORMAT;
            }
            piece *tmp = pa;
            pa = pb;
            pb = tmp;
        }
        pcre2_match_data_free(md);
    }

    uint32_t wmax = 0;
    for (int64_t i = 0; i < np; i++)
        if (pa[i].len > wmax) wmax = pa[i].len;
    // A word of w bytes: w symbols; at most w-1 initial pairs plus 2 per merge.
    bsym *sy = nm_scratch_get(s, 3, (size_t)wmax * sizeof(bsym));
    bigram *h = nm_scratch_get(s, 4, (size_t)wmax * 3 * sizeof(bigram));
    char *enc = t->ignore_merges ? nm_scratch_get(s, 5, (size_t)wmax * 2) : NULL;
    if (!sy || !h || (t->ignore_merges && !enc)) return NM_ERR_NOMEM;
    for (int64_t i = 0; i < np; i++)
        bpe_word(t, (const uint8_t *)u + pa[i].off, pa[i].len, sy, h, enc, out);
    return NM_OK;
}

// ---- decode --------------------------------------------------------------------------

int32_t nm_bpe_decode_text(const nm_tokenizer *t, const char *p, uint32_t n, char *buf,
                           int32_t size) {
    // Every stand-in code point is < 324 (2 UTF-8 bytes) and decodes to one
    // byte, so the output is never longer than the token text.
    int32_t k = 0;
    const uint8_t *s = (const uint8_t *)p;
    char tmp[4];
    for (uint32_t i = 0; i < n;) {
        uint32_t c = s[i];
        size_t l = 1;
        if (c >= 0xc0 && c < 0xe0 && i + 1 < n && (s[i + 1] & 0xc0) == 0x80) {
            c = ((c & 0x1f) << 6) | (s[i + 1] & 0x3f);
            l = 2;
        }
        const char *src;
        size_t m;
        if (c < 324 && t->cpt_byte[c] >= 0 && (l == 2 || c < 0x80)) {
            tmp[0] = (char)t->cpt_byte[c];
            src = tmp;
            m = 1;
        } else { // not a byte-level character: keep it as is
            l = nm_utf8_len(s[i]);
            if (l > n - i) l = n - i;
            src = p + i;
            m = l;
        }
        if (k + (int32_t)m <= size) memcpy(buf + k, src, m);
        k += (int32_t)m;
        i += (uint32_t)l;
    }
    return k <= size ? k : -k;
}
