// SentencePiece-style BPE (tokenizer.ggml.model = "llama"): Gemma, Llama 2.
//
// Spaces become U+2581; the text starts as one symbol per UTF-8 character;
// the adjacent pair whose concatenation is the highest-scoring vocab token is
// merged first (ties: leftmost), until no adjacent pair forms a token.
// Symbols left that are not tokens fall back to <0xXX> byte tokens.
// Same algorithm as llama.cpp's llm_tokenizer_spm (and sentencepiece's BPE
// model); a symbol's text is always a contiguous slice of the escaped text,
// so a pair's text is looked up in place, without building strings.
#include <stdlib.h>
#include <string.h>

#include "bricks/tokenizer/tok_impl.h"

typedef struct ssym {
    uint32_t off, n; // slice of the escaped text; n == 0: merged away
    int32_t id;      // token id of the slice, -1 if it is not a token
    int32_t prev, next;
} ssym;

typedef struct sbigram {
    float score;
    int32_t left, right;
    int32_t id;    // token formed by the pair
    uint32_t size; // bytes of the pair when queued: stale if it changed
} sbigram;

// Max-heap on score; ties go to the leftmost pair (llama.cpp's llm_bigram_spm).
static bool sb_before(const sbigram *a, const sbigram *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void heap_push(sbigram *h, int32_t *n, sbigram v) {
    int32_t i = (*n)++;
    while (i > 0) {
        int32_t p = (i - 1) / 2;
        if (!sb_before(&v, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static sbigram heap_pop(sbigram *h, int32_t *n) {
    sbigram top = h[0];
    sbigram last = h[--(*n)];
    int32_t i = 0;
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && sb_before(&h[c + 1], &h[c])) c++;
        if (!sb_before(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = last;
    return top;
}

static void try_pair(const nm_tokenizer *t, const char *txt, const ssym *sy, int32_t l, int32_t r,
                     sbigram *h, int32_t *nh) {
    if (l < 0 || r < 0) return;
    uint32_t size = sy[l].n + sy[r].n;
    int32_t id = nm_strindex_find(&t->vocab, txt + sy[l].off, size);
    if (id < 0) return;
    sbigram b = {t->scores[id], l, r, id, size};
    heap_push(h, nh, b);
}

nm_status nm_spm_encode(const nm_tokenizer *t, const char *text, size_t len, bool prefix_space,
                        nm_tok_out *out, nm_scratch *s) {
    if (len > UINT32_MAX / 4) return NM_ERR_RANGE;
    size_t n_sp = 0;
    for (size_t i = 0; i < len; i++) n_sp += text[i] == ' ';
    size_t n = len + 2 * n_sp + (prefix_space ? 3 : 0); // each space grows from 1 byte to 3
    if (n == 0) return NM_OK;

    char *e = nm_scratch_get(s, 0, n);
    ssym *sy = nm_scratch_get(s, 1, n * sizeof(ssym));
    sbigram *h = nm_scratch_get(s, 2, n * 3 * sizeof(sbigram));
    if (!e || !sy || !h) return NM_ERR_NOMEM;
    size_t k = 0;
    if (prefix_space) {
        memcpy(e, "\xe2\x96\x81", 3);
        k = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(e + k, "\xe2\x96\x81", 3);
            k += 3;
        } else {
            e[k++] = text[i];
        }
    }

    int32_t ns = 0;
    for (size_t off = 0; off < n;) {
        size_t l = nm_utf8_len((uint8_t)e[off]);
        if (l > n - off) l = n - off;
        sy[ns] = (ssym){(uint32_t)off, (uint32_t)l, nm_strindex_find(&t->vocab, e + off, l),
                        ns - 1, off + l < n ? ns + 1 : -1};
        ns++;
        off += l;
    }
    int32_t nh = 0;
    for (int32_t i = 1; i < ns; i++) try_pair(t, e, sy, i - 1, i, h, &nh);
    while (nh > 0) {
        sbigram b = heap_pop(h, &nh);
        ssym *L = &sy[b.left], *R = &sy[b.right];
        if (L->n == 0 || R->n == 0 || L->n + R->n != b.size) continue; // stale
        L->n += R->n;
        L->id = b.id;
        R->n = 0;
        L->next = R->next;
        if (R->next >= 0) sy[R->next].prev = b.left;
        try_pair(t, e, sy, L->prev, b.left, h, &nh);
        try_pair(t, e, sy, b.left, L->next, h, &nh);
    }
    for (int32_t i = 0; i >= 0; i = sy[i].next) {
        if (sy[i].id >= 0) {
            nm_tok_emit(out, sy[i].id);
            continue;
        }
        // Byte fallback: a symbol that is not a token is only ever a single
        // character (merges always form tokens).
        for (uint32_t j = 0; j < sy[i].n; j++) {
            int32_t b = t->byte_tok[(uint8_t)e[sy[i].off + j]];
            if (b < 0) b = t->unk;
            if (b >= 0) nm_tok_emit(out, b);
        }
    }
    return NM_OK;
}
