// Token sampler: repetition penalty, then greedy, or temperature with top-k,
// top-p and min-p filters. The order follows llama.cpp's common defaults
// (penalties -> top-k -> top-p -> min-p -> temperature -> draw). Scratch is
// allocated once for the vocabulary; sampling allocates nothing.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nanomind.h"

typedef struct cand {
    float logit;
    int32_t id;
} cand;

struct nm_sampler {
    nm_sampler_params p;
    int32_t n_vocab;
    cand *c;            // (n_vocab)
    uint8_t *seen;      // (n_vocab) scratch for the repetition penalty, all zero between calls
    int32_t *hist;      // ring of the last repeat_last_n accepted tokens
    int32_t n_hist, hist_head;
    uint64_t rng;
};

nm_sampler_params nm_sampler_default_params(void) {
    nm_sampler_params p = {
        .temp = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f,
        .repeat_penalty = 1.0f, .repeat_last_n = 64, .seed = 0x5eed,
    };
    return p;
}

nm_sampler *nm_sampler_create(const nm_sampler_params *p, int32_t n_vocab) {
    if (!p || n_vocab <= 0) return NULL;
    nm_sampler *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->p = *p;
    if (s->p.repeat_last_n < 0) s->p.repeat_last_n = 0;
    s->n_vocab = n_vocab;
    s->c = malloc(sizeof(cand) * (size_t)n_vocab);
    s->seen = calloc((size_t)n_vocab, 1);
    s->hist = malloc(sizeof(int32_t) * (size_t)(s->p.repeat_last_n > 0 ? s->p.repeat_last_n : 1));
    if (!s->c || !s->seen || !s->hist) {
        nm_sampler_free(s);
        return NULL;
    }
    nm_sampler_reset(s);
    return s;
}

void nm_sampler_free(nm_sampler *s) {
    if (!s) return;
    free(s->c);
    free(s->seen);
    free(s->hist);
    free(s);
}

void nm_sampler_reset(nm_sampler *s) {
    s->n_hist = s->hist_head = 0;
    s->rng = s->p.seed ? s->p.seed : 0x9e3779b97f4a7c15ull;
}

void nm_sampler_accept(nm_sampler *s, int32_t tok) {
    if (s->p.repeat_last_n <= 0) return;
    s->hist[s->hist_head] = tok;
    s->hist_head = (s->hist_head + 1) % s->p.repeat_last_n;
    if (s->n_hist < s->p.repeat_last_n) s->n_hist++;
}

// xorshift64*: small, fast, and the same sequence on every platform.
static double rng_uniform(nm_sampler *s) {
    s->rng ^= s->rng >> 12;
    s->rng ^= s->rng << 25;
    s->rng ^= s->rng >> 27;
    return (double)((s->rng * 0x2545F4914F6CDD1Dull) >> 11) * (1.0 / 9007199254740992.0);
}

// Candidate order: higher logit first, ties by lower id (deterministic).
// Logits are never NaN here (nm_sampler_sample maps NaN to -inf), so this is
// a strict weak order, which the selection below relies on.
static inline bool before(const cand *a, const cand *b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

// In-place heapsort of c[0..n) by `before`: O(n log n), no allocation
// (qsort may allocate).
static void sift(cand *c, int32_t root, int32_t n) {
    for (;;) {
        int32_t child = 2 * root + 1;
        if (child >= n) return;
        // a min-heap on `before`: the root is the candidate that sorts last
        if (child + 1 < n && before(&c[child], &c[child + 1])) child++;
        if (!before(&c[root], &c[child])) return;
        cand t = c[root];
        c[root] = c[child];
        c[child] = t;
        root = child;
    }
}

static void sort_cands(cand *c, int32_t n) {
    for (int32_t i = n / 2 - 1; i >= 0; i--) sift(c, i, n);
    for (int32_t end = n - 1; end > 0; end--) {
        cand t = c[0];
        c[0] = c[end];
        c[end] = t;
        sift(c, 0, end);
    }
}

// Moves the k first candidates (in `before` order) to the front, sorted.
// Quickselect O(n), then a sort of the k.
static void partial_sort(cand *c, int32_t n, int32_t k) {
    int32_t lo = 0, hi = n - 1;
    while (k < n && lo < hi) {
        cand pivot = c[lo + (hi - lo) / 2];
        int32_t i = lo, j = hi;
        while (i <= j) {
            while (before(&c[i], &pivot)) i++;
            while (before(&pivot, &c[j])) j--;
            if (i <= j) {
                cand t = c[i];
                c[i] = c[j];
                c[j] = t;
                i++;
                j--;
            }
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else break;
    }
    sort_cands(c, k < n ? k : n);
}

int32_t nm_sampler_sample(nm_sampler *s, const float *logits) {
    const int32_t n = s->n_vocab;
    cand *c = s->c;
    // NaN (a broken model) would break the ordering: treat it as impossible.
    for (int32_t i = 0; i < n; i++) c[i] = (cand){isnan(logits[i]) ? -INFINITY : logits[i], i};

    // The penalties, as llama.cpp's penalties sampler, over the window of the
    // last repeat_last_n tokens: repetition (CTRL-style: divide positive
    // logits, multiply negative ones, once per distinct token), then frequency
    // (per occurrence) and presence (once). seen[] counts, then is cleared.
    const bool rep = s->p.repeat_penalty != 1.0f && s->p.repeat_penalty > 0.0f;
    const bool freq = s->p.frequency_penalty != 0.0f || s->p.presence_penalty != 0.0f;
    if (rep || freq) {
        for (int32_t h = 0; h < s->n_hist; h++) {
            int32_t t = s->hist[h];
            if (t >= 0 && t < n && s->seen[t] < 255) s->seen[t]++;
        }
        for (int32_t h = 0; h < s->n_hist; h++) {
            int32_t t = s->hist[h];
            if (t < 0 || t >= n || !s->seen[t]) continue;
            if (rep) c[t].logit = c[t].logit > 0 ? c[t].logit / s->p.repeat_penalty : c[t].logit * s->p.repeat_penalty;
            c[t].logit -= (float)s->seen[t] * s->p.frequency_penalty + s->p.presence_penalty;
            s->seen[t] = 0; // once per distinct token; and clear for the next call
        }
    }

    if (s->p.temp <= 0.0f) { // greedy: first maximum
        int32_t best = 0;
        for (int32_t i = 1; i < n; i++)
            if (c[i].logit > c[best].logit) best = i;
        return c[best].id;
    }

    int32_t k = s->p.top_k > 0 && s->p.top_k < n ? s->p.top_k : n, n_c = n;
    if (k == n) {
        // No top-k: sorting the whole vocabulary (262k for Gemma) per token
        // is wasted on candidates that cannot be drawn. Drop those whose
        // probability is below e^-40 of the top one both at temperature 1
        // (what top-p and min-p read) and after temperature: all of them
        // together weigh < n * 4e-18 in either. (The floor at the sampling
        // temperature alone let a low temperature change top-p's cut.)
        float mx = -INFINITY;
        for (int32_t i = 0; i < n; i++) mx = c[i].logit > mx ? c[i].logit : mx;
        const float floor_ = mx - 40.0f * (s->p.temp > 1.0f ? s->p.temp : 1.0f);
        int32_t m = 0;
        for (int32_t i = 0; i < n; i++)
            if (c[i].logit >= floor_) c[m++] = c[i];
        k = n_c = m;
    }
    partial_sort(c, n_c, k);

    // softmax over the k candidates (sorted descending)
    float mx = c[0].logit;
    double sum = 0.0;
    for (int32_t i = 0; i < k; i++) sum += exp((double)(c[i].logit - mx));
    // top-p: smallest prefix whose probability mass reaches top_p
    if (s->p.top_p < 1.0f) {
        double cum = 0.0;
        for (int32_t i = 0; i < k; i++) {
            cum += exp((double)(c[i].logit - mx)) / sum;
            if (cum >= s->p.top_p) {
                k = i + 1;
                break;
            }
        }
    }
    // min-p: drop candidates whose probability is below min_p x the top one
    if (s->p.min_p > 0.0f) {
        float thresh = mx + logf(s->p.min_p);
        int32_t kk = 1;
        while (kk < k && c[kk].logit >= thresh) kk++;
        k = kk;
    }
    // temperature, then draw
    double tot = 0.0;
    for (int32_t i = 0; i < k; i++) tot += exp((double)(c[i].logit - mx) / s->p.temp);
    double r = rng_uniform(s) * tot, acc = 0.0;
    for (int32_t i = 0; i < k; i++) {
        acc += exp((double)(c[i].logit - mx) / s->p.temp);
        if (r < acc) return c[i].id;
    }
    return c[k - 1].id;
}
