#include "nanomind.h"
#include "nmtest.h"

static float logits[1000];

static void fill(void) {
    for (int i = 0; i < 1000; i++) logits[i] = (float)((i * 37) % 101) / 10.0f;
    logits[123] = 20.0f; // clear winner
    logits[456] = 19.0f;
}

NM_TEST(greedy_takes_the_max) {
    fill();
    nm_sampler_params p = nm_sampler_default_params();
    p.temp = 0.0f;
    nm_sampler *s = nm_sampler_create(&p, 1000);
    NM_CHECK(s && nm_sampler_sample(s, logits) == 123);
    nm_sampler_free(s);
}

NM_TEST(same_seed_same_tokens_other_seed_differs) {
    fill();
    nm_sampler_params p = nm_sampler_default_params();
    p.temp = 5.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = 42;
    nm_sampler *a = nm_sampler_create(&p, 1000), *b = nm_sampler_create(&p, 1000);
    p.seed = 43;
    nm_sampler *c = nm_sampler_create(&p, 1000);
    int same = 1, diff = 0;
    for (int i = 0; i < 200; i++) {
        int x = nm_sampler_sample(a, logits), y = nm_sampler_sample(b, logits), z = nm_sampler_sample(c, logits);
        same &= x == y;
        diff += x != z;
    }
    NM_CHECK(same);
    NM_CHECK(diff > 50);
    nm_sampler_free(a);
    nm_sampler_free(b);
    nm_sampler_free(c);
}

NM_TEST(top_k_restricts_choices) {
    fill();
    nm_sampler_params p = nm_sampler_default_params();
    p.temp = 100.0f; // nearly uniform
    p.top_k = 2;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    nm_sampler *s = nm_sampler_create(&p, 1000);
    int seen123 = 0, seen456 = 0, other = 0;
    for (int i = 0; i < 500; i++) {
        int t = nm_sampler_sample(s, logits);
        seen123 += t == 123;
        seen456 += t == 456;
        other += t != 123 && t != 456;
    }
    NM_CHECK(other == 0);
    NM_CHECK(seen123 > 100 && seen456 > 100);
    nm_sampler_free(s);
}

NM_TEST(top_p_and_min_p_cut_the_tail) {
    fill();
    nm_sampler_params p = nm_sampler_default_params();
    p.temp = 1.0f;
    p.top_k = 0;
    p.top_p = 0.5f; // token 123 alone has p = e/(e+1+tail) > 0.5
    p.min_p = 0.0f;
    nm_sampler *s = nm_sampler_create(&p, 1000);
    for (int i = 0; i < 100; i++) NM_CHECK(nm_sampler_sample(s, logits) == 123);
    nm_sampler_free(s);
    p.top_p = 1.0f;
    p.min_p = 0.3f; // 456 has p ratio e^-1 = 0.37 to the top: kept; everything else dropped
    s = nm_sampler_create(&p, 1000);
    for (int i = 0; i < 200; i++) {
        int t = nm_sampler_sample(s, logits);
        NM_CHECK(t == 123 || t == 456);
    }
    nm_sampler_free(s);
}

NM_TEST(repetition_penalty_demotes_seen_tokens) {
    fill();
    nm_sampler_params p = nm_sampler_default_params();
    p.temp = 0.0f;
    p.repeat_penalty = 1.5f; // 20 / 1.5 = 13.3 < 19
    nm_sampler *s = nm_sampler_create(&p, 1000);
    nm_sampler_accept(s, 123);
    NM_CHECK(nm_sampler_sample(s, logits) == 456);
    nm_sampler_reset(s);
    NM_CHECK(nm_sampler_sample(s, logits) == 123);
    nm_sampler_free(s);
}

// Frequency and presence penalties (llama.cpp's): token 123 (logit 20), seen
// twice, against 456 (19): frequency 0.4 takes 0.8 -> 19.2, still first; 0.6
// takes 1.2 -> 18.8, second; presence 1.5 takes it once -> 18.5; presence 0.5
// -> 19.5, first. Computed by hand from fill()'s logits.
NM_TEST(frequency_and_presence_penalties) {
    fill();
    static const struct { float freq, pres; int32_t want; } C[] = {
        {0.4f, 0.0f, 123}, {0.6f, 0.0f, 456}, {0.0f, 1.5f, 456}, {0.0f, 0.5f, 123}, {0.3f, 0.5f, 456}};
    for (size_t i = 0; i < sizeof C / sizeof C[0]; i++) {
        nm_sampler_params p = nm_sampler_default_params();
        p.temp = 0.0f;
        p.frequency_penalty = C[i].freq;
        p.presence_penalty = C[i].pres;
        nm_sampler *s = nm_sampler_create(&p, 1000);
        nm_sampler_accept(s, 123);
        nm_sampler_accept(s, 123);
        NM_CHECK(nm_sampler_sample(s, logits) == C[i].want);
        NM_CHECK(nm_sampler_sample(s, logits) == C[i].want); // the counts are cleared between calls
        nm_sampler_free(s);
    }
}

// A broken model can produce NaN and infinite logits: sampling must still
// return a valid id (never NaN's), with every filter on and off.
NM_TEST(nan_and_inf_logits_are_safe) {
    static float l[5000];
    for (int i = 0; i < 5000; i++) l[i] = (i % 3 == 0) ? NAN : (i % 7 == 0 ? -INFINITY : (float)(i % 50));
    l[4321] = INFINITY;
    for (int mode = 0; mode < 4; mode++) {
        nm_sampler_params p = nm_sampler_default_params();
        p.temp = mode == 0 ? 0.0f : 1.0f;
        p.top_k = mode == 1 ? 0 : 40;
        p.top_p = mode == 2 ? 1.0f : 0.9f;
        p.min_p = mode == 3 ? 0.0f : 0.05f;
        p.repeat_penalty = 1.3f;
        nm_sampler *s = nm_sampler_create(&p, 5000);
        nm_sampler_accept(s, 4321);
        for (int r = 0; r < 20; r++) {
            int t = nm_sampler_sample(s, l);
            NM_CHECK(t >= 0 && t < 5000 && !isnan(l[t]));
        }
        nm_sampler_free(s);
    }
    for (int i = 0; i < 5000; i++) l[i] = NAN; // all NaN: still an id in range
    nm_sampler_params p = nm_sampler_default_params();
    p.top_k = 0;
    nm_sampler *s = nm_sampler_create(&p, 5000);
    int t = nm_sampler_sample(s, l);
    NM_CHECK(t >= 0 && t < 5000);
    nm_sampler_free(s);
}

// Without top-k the draw still follows the softmax: two tokens at logits 1
// and 0 (the rest far below) come out about e:1.
NM_TEST(no_top_k_follows_softmax) {
    static float l[300000];
    for (int i = 0; i < 300000; i++) l[i] = -100.0f;
    l[7] = 1.0f;
    l[299999] = 0.0f;
    nm_sampler_params p = nm_sampler_default_params();
    p.temp = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    nm_sampler *s = nm_sampler_create(&p, 300000);
    int a = 0, b = 0, other = 0;
    for (int r = 0; r < 4000; r++) {
        int t = nm_sampler_sample(s, l);
        a += t == 7;
        b += t == 299999;
        other += t != 7 && t != 299999;
    }
    NM_CHECK(other == 0);
    NM_CHECK(fabs((double)a / (a + b) - 2.718281828 / 3.718281828) < 0.03);
    nm_sampler_free(s);
}

// ---- the filters' math ----------------------------------------------------------------
//
// Expected survivor sets and probabilities below are worked out by hand from
// the rules (llama.cpp's: top-k, then top-p and min-p on the softmax at T = 1,
// then temperature), never by asking the sampler. A set of survivors is seen
// by sampling at a huge temperature: the filters run before it, so every
// survivor is about equally likely and shows up, and nothing else ever does.

static nm_sampler_params filters(float temp, int32_t top_k, float top_p, float min_p) {
    nm_sampler_params p = nm_sampler_default_params();
    p.temp = temp, p.top_k = top_k, p.top_p = top_p, p.min_p = min_p;
    p.repeat_penalty = 1.0f;
    p.seed = 0x1234567;
    return p;
}

// Draws n_draws tokens into counts[0..n_vocab); any id outside is a failure.
static void draw(const nm_sampler_params *p, const float *l, int n_vocab, int n_draws, int *counts, int *failed) {
    nm_sampler *s = nm_sampler_create(p, n_vocab);
    memset(counts, 0, sizeof(int) * (size_t)n_vocab);
    for (int i = 0; i < n_draws; i++) {
        const int t = nm_sampler_sample(s, l);
        if (t < 0 || t >= n_vocab) *failed = 1;
        else counts[t]++;
    }
    nm_sampler_free(s);
}

// Whether the ids drawn are exactly want[0..n_want); prints the difference.
static bool drawn_exactly(const int *counts, int n_vocab, const int *want, int n_want, const char *what) {
    bool ok = true;
    for (int id = 0; id < n_vocab; id++) {
        bool wanted = false;
        for (int i = 0; i < n_want; i++) wanted |= want[i] == id;
        if (wanted != (counts[id] > 0)) {
            fprintf(stderr, "  %s: id %d drawn %d times, %s\n", what, id, counts[id], wanted ? "a survivor" : "filtered out");
            ok = false;
        }
    }
    return ok;
}

// Ties at the k boundary: candidates order by logit, then by lower id, so
// the lower ids of a tied group get the last places.
NM_TEST(top_k_ties_keep_lower_ids) {
    enum { N = 1000 };
    static float l[N];
    static int counts[N];
    int failed = 0;
    // one top token, six tied behind it, k = 5 cuts the tie after four
    for (int i = 0; i < N; i++) l[i] = -1.0f - 0.001f * (float)(i % 500);
    l[900] = 3.0f;
    const int tied[] = {999, 20, 500, 10, 700, 850};
    for (int i = 0; i < 6; i++) l[tied[i]] = 2.0f;
    nm_sampler_params p = filters(100.0f, 5, 1.0f, 0.0f);
    draw(&p, l, N, 3000, counts, &failed);
    const int want1[] = {900, 10, 20, 500, 700};
    NM_CHECK(drawn_exactly(counts, N, want1, 5, "top-k 5 of a 6-way tie"));
    // everything tied: the k lowest ids; k = 1 picks id 0
    for (int i = 0; i < N; i++) l[i] = 0.5f;
    p.top_k = 7;
    draw(&p, l, N, 3000, counts, &failed);
    const int want2[] = {0, 1, 2, 3, 4, 5, 6};
    NM_CHECK(drawn_exactly(counts, N, want2, 7, "top-k 7, all tied"));
    p.top_k = 1;
    draw(&p, l, N, 200, counts, &failed);
    NM_CHECK(counts[0] == 200);
    // eight levels scattered over the vocabulary: k takes all of levels 7
    // and 6, then the lowest ids of level 5, half of them
    int n_level[8] = {0}, want3[N], n3 = 0;
    for (int i = 0; i < N; i++) {
        const int lev = (int)(((uint32_t)i * 2654435761u) >> 29); // 0..7
        l[i] = (float)lev;
        n_level[lev]++;
    }
    const int k3 = n_level[7] + n_level[6] + n_level[5] / 2;
    for (int lev = 7; lev >= 5; lev--)
        for (int i = 0; i < N && n3 < k3; i++)
            if (l[i] == (float)lev) want3[n3++] = i;
    p = filters(1000.0f, k3, 1.0f, 0.0f);
    draw(&p, l, N, 40 * k3, counts, &failed); // 40 draws per survivor: one is missed with odds e^-40
    NM_CHECK(n_level[5] > 50 && drawn_exactly(counts, N, want3, k3, "top-k through a tied level"));
    NM_CHECK(!failed);
}

// Top-p keeps the smallest prefix whose probability reaches top_p, the
// token that crosses it included. Four equal logits: p = 1/4 each exactly,
// cumulative 0.25, 0.5, 0.75, 1, so every boundary is exact.
NM_TEST(top_p_includes_the_crossing_token) {
    const float l[4] = {0, 0, 0, 0};
    int counts[6], failed = 0;
    static const struct { float top_p; int n; } cases[] = {
        {0.2f, 1}, {0.25f, 1}, {0.26f, 2}, {0.5f, 2}, {0.51f, 3}, {0.75f, 3}, {0.7501f, 4}, {0.99f, 4},
    };
    const int ids[4] = {0, 1, 2, 3};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        nm_sampler_params p = filters(1000.0f, 0, cases[c].top_p, 0.0f);
        draw(&p, l, 4, 2000, counts, &failed);
        char what[64];
        snprintf(what, sizeof what, "top-p %g of four equal", cases[c].top_p);
        NM_CHECK(drawn_exactly(counts, 4, ids, cases[c].n, what));
    }
    // Top-p reads the softmax of what top-k left: two of the four, 1/2 each,
    // so 0.5 keeps one (over the whole vocabulary it would keep two).
    nm_sampler_params p = filters(1000.0f, 2, 0.5f, 0.0f);
    draw(&p, l, 4, 2000, counts, &failed);
    NM_CHECK(drawn_exactly(counts, 4, ids, 1, "top-k 2 then top-p 0.5"));
    // Logits 0, -1, ..., -5 on scrambled ids, at T = 1 (temperature comes
    // after): Z = sum e^-i = 1.578055, p = .63369 .23312 .08576 .03155 .01161
    // .00427, cumulative .63369 .86681 .95257 .98412 .99573 1. (At T = 1000
    // the cumulative would be about i/6 and 0.9 would keep all six.)
    const float l6[6] = {-3, -1, -5, -4, 0, -2}; // by logit: ids 4, 1, 5, 0, 3, 2
    const int by_logit[6] = {4, 1, 5, 0, 3, 2};
    static const struct { float top_p; int n; } cases6[] = {{0.6f, 1}, {0.7f, 2}, {0.86f, 2}, {0.87f, 3},
                                                            {0.9f, 3}, {0.95f, 3}, {0.96f, 4}, {0.99f, 5}};
    for (size_t c = 0; c < sizeof cases6 / sizeof cases6[0]; c++) {
        p = filters(1000.0f, 0, cases6[c].top_p, 0.0f);
        draw(&p, l6, 6, 3000, counts, &failed);
        char what[64];
        snprintf(what, sizeof what, "top-p %g of e^-i", cases6[c].top_p);
        NM_CHECK(drawn_exactly(counts, 6, by_logit, cases6[c].n, what));
    }
    NM_CHECK(!failed);
}

// Min-p keeps p_i >= min_p * p_max: relative to the top token, not an
// absolute floor. 30 tokens in three levels of ten, weights 1, 0.5 and 0.2
// (p = 1/17, 0.5/17, 0.2/17): min_p 0.3 keeps the first two levels, while an
// absolute p_i >= 0.3 would keep not even the top one.
NM_TEST(min_p_is_relative_to_the_top_probability) {
    float l[30];
    int counts[30], failed = 0, want[20], nw = 0;
    const float weight[3] = {1.0f, 0.5f, 0.2f};
    for (int i = 0; i < 30; i++) {
        const int lev = (i * 7) % 3; // levels interleaved over the ids
        l[i] = logf(weight[lev]);
        if (lev < 2) want[nw++] = i;
    }
    nm_sampler_params p = filters(1000.0f, 0, 1.0f, 0.3f);
    draw(&p, l, 30, 6000, counts, &failed);
    NM_CHECK(drawn_exactly(counts, 30, want, 20, "min-p 0.3 over levels 1, .5, .2"));
    // near the boundary: ratio 0.2501 stays, 0.2499 goes
    const float l4[4] = {logf(0.2499f), 0.0f, logf(0.2501f), -5.0f};
    const int want4[2] = {1, 2};
    p = filters(1000.0f, 0, 1.0f, 0.25f);
    draw(&p, l4, 4, 2000, counts, &failed);
    NM_CHECK(drawn_exactly(counts, 4, want4, 2, "min-p 0.25 at ratios .2501 and .2499"));
    // at the boundary exactly: min_p = 1 keeps every token tied with the top
    const float l5[5] = {1.0f, 2.0f, 2.0f, nextafterf(2.0f, 0.0f), 2.0f};
    const int want5[3] = {1, 2, 4};
    p = filters(1000.0f, 0, 1.0f, 1.0f);
    draw(&p, l5, 5, 2000, counts, &failed);
    NM_CHECK(drawn_exactly(counts, 5, want5, 3, "min-p 1 keeps the tied top"));
    NM_CHECK(!failed);
}

// Temperature divides the logits after the filters: the draws follow
// softmax(l / T) over the survivors. Chi-square of N draws against it, with
// k - 1 <= 5 degrees of freedom: the bound 30 is a tail of 1.5e-5 for 5.
NM_TEST(temperature_after_filters_follows_softmax) {
    // ids scrambled against the logits
    const float l[12] = {0.3f, -2.0f, 1.5f, -0.2f, 2.0f, -4.0f, 1.0f, -0.5f, 0.7f, -3.0f, 1.2f, -1.0f};
    // T = 1 weights of the top ten (ids 4 2 10 6 8 0 3 7 11 1): 7.389 4.482
    // 3.320 2.718 2.014 1.350 .819 .607 .368 .135, Z = 23.20; cumulative
    // .3185 .5117 .6548 .7720 .8588 .9170: top-p 0.9 keeps six. min-p 0.1
    // keeps l >= 2 + ln 0.1 = -0.303 (seven); min-p 0.2 keeps l >= 0.391.
    static const struct { float temp; int32_t top_k; float top_p, min_p; int n; int ids[6]; } cases[] = {
        {0.7f, 10, 0.9f, 0.1f, 6, {4, 2, 10, 6, 8, 0}}, // top-p decides
        {1.8f, 0, 1.0f, 0.2f, 5, {4, 2, 10, 6, 8}},     // min-p alone, no top-k
        {0.4f, 3, 1.0f, 0.0f, 3, {4, 2, 10}},           // top-k alone
        {2.5f, 10, 0.9f, 0.1f, 6, {4, 2, 10, 6, 8, 0}}, // as the first, hotter than T = 1
    };
    enum { DRAWS = 40000 };
    int counts[12], failed = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        nm_sampler_params p = filters(cases[c].temp, cases[c].top_k, cases[c].top_p, cases[c].min_p);
        draw(&p, l, 12, DRAWS, counts, &failed);
        double z = 0, chi2 = 0;
        for (int i = 0; i < cases[c].n; i++) z += exp(l[cases[c].ids[i]] / (double)cases[c].temp);
        int inside = 0;
        for (int i = 0; i < cases[c].n; i++) {
            const double e = DRAWS * exp(l[cases[c].ids[i]] / (double)cases[c].temp) / z;
            const int o = counts[cases[c].ids[i]];
            chi2 += (o - e) * (o - e) / e;
            inside += o;
        }
        if (chi2 > 30 || inside != DRAWS || getenv("NM_TEST_VERBOSE"))
            fprintf(stderr, "  T=%g top_k=%d top_p=%g min_p=%g: chi2 %.2f (df %d), %d of %d drawn outside\n",
                    cases[c].temp, cases[c].top_k, cases[c].top_p, cases[c].min_p, chi2, cases[c].n - 1,
                    DRAWS - inside, DRAWS);
        NM_CHECK(inside == DRAWS);
        NM_CHECK(chi2 < 30); // measured 4.4, 4.4, 1.6, 1.2; at most 14.2 over ten other seeds
    }
    NM_CHECK(!failed);
}

// llama.cpp's repetition penalty: a token among the last repeat_last_n
// accepted has its logit divided by the penalty if positive, multiplied if
// negative, once however often it occurs. Greedy picks bracket the result.
NM_TEST(repetition_penalty_rule_and_window) {
    float l[8];
    for (int i = 0; i < 8; i++) l[i] = -9.0f;
    nm_sampler_params p = filters(0.0f, 0, 1.0f, 0.0f);
    // positive: 3 / 1.49 = 2.013 beats 2, 3 / 1.51 = 1.987 does not
    l[2] = 3.0f, l[5] = 2.0f;
    const float pens[2] = {1.49f, 1.51f};
    const int winner_pos[2] = {2, 5};
    for (int k = 0; k < 2; k++) {
        p.repeat_penalty = pens[k];
        nm_sampler *s = nm_sampler_create(&p, 8);
        nm_sampler_accept(s, 2);
        NM_CHECK(nm_sampler_sample(s, l) == winner_pos[k]);
        nm_sampler_free(s);
    }
    // negative: -1 x 1.49 = -1.49 stays above -1.5, -1 x 1.51 = -1.51 falls below
    l[2] = -1.0f, l[5] = -1.5f;
    const int winner_neg[2] = {2, 5};
    for (int k = 0; k < 2; k++) {
        p.repeat_penalty = pens[k];
        nm_sampler *s = nm_sampler_create(&p, 8);
        nm_sampler_accept(s, 2);
        NM_CHECK(nm_sampler_sample(s, l) == winner_neg[k]);
        nm_sampler_free(s);
    }
    // zero stays zero (and still beats -0.001)
    l[2] = 0.0f, l[5] = -0.001f;
    p.repeat_penalty = 2.0f;
    nm_sampler *s = nm_sampler_create(&p, 8);
    nm_sampler_accept(s, 2);
    NM_CHECK(nm_sampler_sample(s, l) == 2);
    nm_sampler_free(s);
    // once per distinct token: 3 / 1.4 = 2.14 > 2, however often 2 was seen
    // (three times would give 1.09)
    l[2] = 3.0f, l[5] = 2.0f;
    p.repeat_penalty = 1.4f;
    s = nm_sampler_create(&p, 8);
    for (int i = 0; i < 3; i++) nm_sampler_accept(s, 2);
    nm_sampler_accept(s, 5); // 2 / 1.4 = 1.43: 2 still wins
    NM_CHECK(nm_sampler_sample(s, l) == 2);
    nm_sampler_free(s);
    // the window: the last 4 accepted. 3 / 1.6 = 1.875 < 2 while 2 is in it.
    p.repeat_penalty = 1.6f;
    p.repeat_last_n = 4;
    s = nm_sampler_create(&p, 8);
    nm_sampler_accept(s, 2);
    for (int i = 0; i < 3; i++) nm_sampler_accept(s, 7);
    NM_CHECK(nm_sampler_sample(s, l) == 5); // 2 is the oldest of the four
    nm_sampler_accept(s, 7);
    NM_CHECK(nm_sampler_sample(s, l) == 2); // 2 has left the window
    for (int i = 0; i < 9; i++) nm_sampler_accept(s, 7 - i % 2); // the ring wraps
    nm_sampler_accept(s, 2);
    NM_CHECK(nm_sampler_sample(s, l) == 5);
    nm_sampler_accept(s, -1), nm_sampler_accept(s, 8), nm_sampler_accept(s, 1 << 30); // out of range: no effect
    NM_CHECK(nm_sampler_sample(s, l) == 5);
    nm_sampler_accept(s, 7);
    NM_CHECK(nm_sampler_sample(s, l) == 2);
    nm_sampler_free(s);
    // repeat_penalty 1 is off
    p.repeat_penalty = 1.0f;
    s = nm_sampler_create(&p, 8);
    nm_sampler_accept(s, 2);
    NM_CHECK(nm_sampler_sample(s, l) == 2);
    nm_sampler_free(s);
}

// Greedy (temp <= 0) takes the first maximum, the lowest id of a tie, after
// the penalty and whatever the filters say (none can drop the top token).
NM_TEST(greedy_ties_take_the_lowest_id) {
    const float l[6] = {1.0f, 3.0f, 2.0f, 3.0f, 3.0f, -1.0f};
    nm_sampler_params p = filters(0.0f, 40, 0.95f, 0.05f);
    nm_sampler *s = nm_sampler_create(&p, 6);
    NM_CHECK(nm_sampler_sample(s, l) == 1);
    nm_sampler_free(s);
    p.repeat_penalty = 1.5f; // 3 / 1.5 = 2: ids 3 and 4 tie at the top
    s = nm_sampler_create(&p, 6);
    nm_sampler_accept(s, 1);
    NM_CHECK(nm_sampler_sample(s, l) == 3);
    nm_sampler_free(s);
}

// The penalized logits are what the softmax sees when sampling: 1.0 / 2 =
// 0.5 ties with 0.5, so the two come out half and half (unpenalized: 62%).
NM_TEST(repetition_penalty_feeds_the_softmax) {
    float l[3] = {1.0f, 0.5f, -30.0f};
    nm_sampler_params p = filters(1.0f, 0, 1.0f, 0.0f);
    p.repeat_penalty = 2.0f;
    nm_sampler *s = nm_sampler_create(&p, 3);
    nm_sampler_accept(s, 0);
    enum { DRAWS = 20000 };
    int a = 0, other = 0;
    for (int i = 0; i < DRAWS; i++) {
        const int t = nm_sampler_sample(s, l);
        a += t == 0;
        other += t != 0 && t != 1;
    }
    NM_CHECK(other == 0);
    NM_CHECK_NEAR((double)a / DRAWS, 0.5, 0.015); // 4.2 sigma of 20000 fair draws; measured 0.0013
    nm_sampler_free(s);
}

// Without top-k, top-p reads the temperature-1 probabilities of the whole
// vocabulary, however low the temperature. Ids 0 and 1 at 0 and -0.01, 20k
// tokens at -2.5: at T = 1 the tail holds 99.9% of the mass, so top-p 0.5
// keeps ids 0, 1 and the tail; at T = 0.05 the tail weighs e^-50 and the draw
// is 0 or 1 in the ratio e^(0.01 / 0.05) = 1.2214, p(0) = 0.5498. (Dropping
// the tail before top-p, as a floor at the sampling temperature did, keeps id
// 0 alone: p(0) = 1.)
NM_TEST(top_p_without_top_k_sees_the_whole_tail) {
    enum { V = 20002, DRAWS = 1000 };
    float *l = malloc(sizeof(float) * V);
    for (int i = 0; i < V; i++) l[i] = -2.5f;
    l[0] = 0.0f;
    l[1] = -0.01f;
    nm_sampler_params p = nm_sampler_default_params();
    p.temp = 0.05f;
    p.top_k = 0;
    p.top_p = 0.5f;
    p.min_p = 0.0f;
    p.seed = 7;
    nm_sampler *s = nm_sampler_create(&p, V);
    int n0 = 0, n1 = 0;
    for (int i = 0; i < DRAWS; i++) {
        int32_t t = nm_sampler_sample(s, l);
        n0 += t == 0;
        n1 += t == 1;
    }
    NM_CHECK(n0 + n1 == DRAWS);
    NM_CHECK_NEAR((double)n0 / DRAWS, 0.5498, 0.063); // 4 sigma of 1000 draws
    nm_sampler_free(s);
    free(l);
}

NM_TEST_MAIN()
