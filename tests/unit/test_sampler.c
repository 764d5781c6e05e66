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

NM_TEST_MAIN()
