// Golden generation checks on the real default models.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../unit/nmtest.h"
#include "models.h"
#include "nanomind.h"

// Greedy continuation of `prompt` (n tokens) into out.
static bool greedy(nm_model *m, const char *prompt, int n, char *out, size_t size) {
    nm_ctx *c = NULL;
    nm_ctx_params cp = nm_ctx_default_params();
    cp.n_ctx = 256;
    char err[256];
    if (nm_ctx_create(m, &cp, &c, err, sizeof err) != NM_OK) return false;
    int32_t toks[256];
    int32_t nt = nm_tokenize(m, prompt, strlen(prompt), toks, 200, true, true);
    bool ok = nt > 0 && nm_decode(c, toks, nt, 0, false) == NM_OK;
    nm_sampler_params sp = nm_sampler_default_params();
    sp.temp = 0.0f;
    nm_sampler *s = nm_sampler_create(&sp, nm_model_n_vocab(m));
    nm_detok dt = {0};
    size_t len = 0;
    for (int i = 0; ok && i < n; i++) {
        int32_t t = nm_sampler_sample(s, nm_get_logits(c, -1));
        if (nm_token_is_eog(m, t)) break;
        char piece[128];
        int32_t k = nm_detok_push(m, &dt, t, piece, sizeof piece);
        if (k > 0 && len + (size_t)k < size) {
            memcpy(out + len, piece, (size_t)k);
            len += (size_t)k;
        }
        ok = nm_decode(c, &t, 1, nt + i, false) == NM_OK;
    }
    out[len] = '\0';
    nm_sampler_free(s);
    nm_ctx_free(c);
    return ok;
}

// Greedy continuation of `prompt` contains `want`.
static void continues_with(const char *name, const char *prompt, int n, const char *want, int *nmtest_failed) {
    char path[1024], out[1024];
    NM_NEED_MODEL(name, path);
    nm_model *m = NULL;
    char err[256];
    nm_status st = nm_model_load(path, NULL, &m, err, sizeof err);
    NM_CHECK(st == NM_OK);
    if (st != NM_OK) {
        fprintf(stderr, "  %s\n", err);
        return;
    }
    NM_CHECK(greedy(m, prompt, n, out, sizeof out));
    fprintf(stderr, "  %s: '%s' -> '%s'\n", name, prompt, out);
    NM_CHECK(strstr(out, want) != NULL);
    nm_model_free(m);
}

NM_TEST(smollm2_capital_of_france) {
    continues_with(NM_SMOLLM2, "The capital of France is", 8, "Paris", nmtest_failed);
}

// The Gemma 3 270M file is the base (not instruction-tuned) model. On "The
// capital of France is" it continues, in llama.cpp too (llama-simple -n 10 at
// llama.cpp 0c1e570), " the capital of the country of France. It is": we
// check that exact continuation, and Paris where the prompt asks for a name.
NM_TEST(gemma3_capital_of_france) {
    continues_with(NM_GEMMA3, "The capital of France is", 10, " the capital of the country of France. It is",
                   nmtest_failed);
    continues_with(NM_GEMMA3, "The capital of France is the city of", 4, "Paris", nmtest_failed);
    continues_with(NM_GEMMA3, "Question: What is the capital of France?\nAnswer:", 4, "Paris", nmtest_failed);
}

// Chat turn through the model's own template: the answer names Paris. (The
// 135M model is fragile: asked "What is the capital of France?" it answers
// "L'Étoile, la ..." greedily, in llama.cpp as well; this phrasing is robust.)
NM_TEST(smollm2_chat_answer) {
    char path[1024], out[2048], prompt[2048];
    NM_NEED_MODEL(NM_SMOLLM2, path);
    nm_model *m = NULL;
    NM_CHECK(nm_model_load(path, NULL, &m, NULL, 0) == NM_OK);
    if (!m) return;
    nm_chat_msg msgs[] = {{"user", "Name the capital of France."}};
    int32_t n = nm_chat_format(m, NULL, msgs, 1, true, prompt, sizeof prompt);
    NM_CHECK(n > 0);
    NM_CHECK(strstr(prompt, "<|im_start|>user\nName the capital of France.<|im_end|>\n<|im_start|>assistant\n") != NULL);
    if (n > 0) {
        NM_CHECK(greedy(m, prompt, 40, out, sizeof out));
        fprintf(stderr, "  chat answer: '%s'\n", out);
        NM_CHECK(strstr(out, "Paris") != NULL);
    }
    nm_model_free(m);
}

// KL(a || b) of two logit rows' distributions, and whether their top-1 agree.
// KL(a || b) of two rows of logits; *same_top: the same argmax; *lead (may be NULL): how far a's top
// logit leads its runner-up (a near tie, under ~0.1, may flip between any two kernels).
static double kl_row_lead(const float *la, const float *lb, int32_t nv, bool *same_top, double *lead) {
    double ma = -1e30, mb = -1e30, sa = 0, sb = 0, kl = 0, second = -1e30;
    int ta = 0, tb = 0;
    for (int32_t v = 0; v < nv; v++) {
        if (la[v] > ma) second = ma, ma = la[v], ta = v;
        else if (la[v] > second) second = la[v];
        if (lb[v] > mb) mb = lb[v], tb = v;
    }
    if (lead) *lead = ma - second;
    for (int32_t v = 0; v < nv; v++) sa += exp(la[v] - ma), sb += exp(lb[v] - mb);
    for (int32_t v = 0; v < nv; v++) {
        const double pa = exp(la[v] - ma) / sa;
        if (pa > 1e-12) kl += pa * ((la[v] - ma - log(sa)) - (lb[v] - mb - log(sb)));
    }
    *same_top = ta == tb;
    return kl;
}

static double kl_row(const float *la, const float *lb, int32_t nv, bool *same_top) {
    return kl_row_lead(la, lb, nv, same_top, NULL);
}

// Prefill in one batch and token-by-token decoding must give the same
// distributions: checks the KV cache, positions and the batched matmul path
// together. Not bit-identical: prefill runs register-blocked kernels that sum
// in another order, and the models' 8-bit activation rounding amplifies such
// differences (as between any two kernels, llama.cpp's included), so the
// check is on the distributions. A cache or position bug gives KL >> 1.
static void batch_equals_incremental(const char *name, int *nmtest_failed) {
    char path[1024];
    NM_NEED_MODEL(name, path);
    nm_model *m = NULL;
    NM_CHECK(nm_model_load(path, NULL, &m, NULL, 0) == NM_OK);
    if (!m) return;
    nm_ctx_params cp = nm_ctx_default_params();
    cp.n_ctx = 64;
    nm_ctx *a = NULL, *b = NULL;
    NM_CHECK(nm_ctx_create(m, &cp, &a, NULL, 0) == NM_OK && nm_ctx_create(m, &cp, &b, NULL, 0) == NM_OK);
    const char *text = "Once upon a time, in a small village by the sea, there lived an old fisherman.";
    int32_t toks[64];
    int32_t n = nm_tokenize(m, text, strlen(text), toks, 64, true, false);
    NM_CHECK(n > 8);
    NM_CHECK(nm_decode(a, toks, n, 0, true) == NM_OK);
    const int32_t nv = nm_model_n_vocab(m);
    double maxd = 0.0, kl_sum = 0.0;
    int same_top = 0;
    for (int32_t i = 0; i < n; i++) {
        NM_CHECK(nm_decode(b, &toks[i], 1, i, false) == NM_OK);
        const float *la = nm_get_logits(a, i), *lb = nm_get_logits(b, -1);
        for (int32_t v = 0; v < nv; v++) maxd = nm_maxdiff(maxd, la[v], lb[v]);
        bool top;
        kl_sum += kl_row(la, lb, nv, &top);
        same_top += top;
    }
    fprintf(stderr, "  %s: batch vs incremental over %d positions: same top-1 %d, mean KL %.2e, max |dlogit| %.2e\n",
            name, n, same_top, kl_sum / n, maxd);
    // measured: same top-1 19/19 and 20/20, mean KL 3.7e-3 and 2.6e-3 (docs/correctness.md);
    // one flip of a near-tie is allowed
    NM_CHECK(kl_sum / n < 0.005);
    NM_CHECK(same_top >= n - 1);
    nm_ctx_free(a);
    nm_ctx_free(b);
    nm_model_free(m);
}

NM_TEST(smollm2_batch_equals_incremental) { batch_equals_incremental(NM_SMOLLM2, nmtest_failed); }
NM_TEST(gemma3_batch_equals_incremental) { batch_equals_incremental(NM_GEMMA3, nmtest_failed); }

// Continuous batching (nm_decode_seqs): three prompts of different lengths in
// one context of three sequences, their prompts in one pass (the rows whose
// logits are wanted last), then a pass a step with one token of each, against
// each prompt alone in a context of its own fed the same tokens: the same
// distributions (as above: other kernels, not the same bits). A row's logits
// do not depend on the other sequences' rows in its batch (bit for bit); bad
// batches are refused with the reason.
#define SEQ_STEPS 12
static void seqs_equal_alone(const char *name, int *nmtest_failed) {
    char path[1024];
    NM_NEED_MODEL(name, path);
    nm_model *m = NULL;
    NM_CHECK(nm_model_load(path, NULL, &m, NULL, 0) == NM_OK);
    if (!m) return;
    const char *prompts[3] = {"The capital of France is", "Once upon a time, in a small village by the sea, there lived",
                              "1, 2, 3, 4,"};
    const int32_t nv = nm_model_n_vocab(m);
    int32_t toks[3][64 + SEQ_STEPS], nt[3];
    float *ref = malloc(sizeof(float) * 3 * (SEQ_STEPS + 1) * (size_t)nv);
    nm_ctx_params cp = nm_ctx_default_params();
    cp.n_ctx = 64;
    nm_sampler_params sp = nm_sampler_default_params();
    sp.temp = 0.0f;
    nm_sampler *s = nm_sampler_create(&sp, nv);
    for (int k = 0; k < 3 && ref; k++) { // alone: the prompt, then greedy tokens one at a time
        nm_ctx *a = NULL;
        NM_CHECK(nm_ctx_create(m, &cp, &a, NULL, 0) == NM_OK);
        if (!a) break;
        nt[k] = nm_tokenize(m, prompts[k], strlen(prompts[k]), toks[k], 64, true, false);
        NM_CHECK(nt[k] > 0 && nm_decode(a, toks[k], nt[k], 0, false) == NM_OK);
        for (int i = 0; i <= SEQ_STEPS; i++) {
            const float *l = nm_get_logits(a, -1);
            memcpy(ref + ((size_t)k * (SEQ_STEPS + 1) + (size_t)i) * (size_t)nv, l, sizeof(float) * (size_t)nv);
            if (i == SEQ_STEPS) break;
            toks[k][nt[k] + i] = nm_sampler_sample(s, l);
            NM_CHECK(nm_decode(a, &toks[k][nt[k] + i], 1, nt[k] + i, false) == NM_OK);
        }
        nm_ctx_free(a);
    }
    nm_sampler_free(s);
    cp.n_seq = 3;
    nm_ctx *c = NULL;
    NM_CHECK(nm_ctx_create(m, &cp, &c, NULL, 0) == NM_OK && nm_ctx_n_seq(c) == 3);
    if (!c || !ref) {
        free(ref);
        nm_ctx_free(c);
        nm_model_free(m);
        return;
    }
    // the prompts in one pass: every row but the prompts' last, then their last three
    int32_t bt[192], bp[192], bs[192], n = 0;
    for (int k = 0; k < 3; k++)
        for (int32_t i = 0; i < nt[k] - 1; i++) bt[n] = toks[k][i], bp[n] = i, bs[n++] = k;
    for (int k = 0; k < 3; k++) bt[n] = toks[k][nt[k] - 1], bp[n] = nt[k] - 1, bs[n++] = k;
    NM_CHECK(nm_decode_seqs(c, bt, bp, bs, n, 3) == NM_OK);
    double kl_sum = 0, worst_flip = 0;
    int same = 0, rows = 0;
    for (int i = 0; i <= SEQ_STEPS; i++) {
        for (int k = 0; k < 3; k++) {
            const float *l = nm_get_logits(c, (i == 0 ? n - 3 : 0) + k);
            bool top;
            double lead;
            NM_CHECK(l != NULL);
            if (!l) continue;
            kl_sum += kl_row_lead(ref + ((size_t)k * (SEQ_STEPS + 1) + (size_t)i) * (size_t)nv, l, nv, &top, &lead);
            same += top, rows++;
            if (!top && lead > worst_flip) worst_flip = lead;
        }
        if (i == SEQ_STEPS) break;
        for (int k = 0; k < 3; k++) bt[k] = toks[k][nt[k] + i], bp[k] = nt[k] + i, bs[k] = k;
        NM_CHECK(nm_decode_seqs(c, bt, bp, bs, 3, 3) == NM_OK);
    }
    fprintf(stderr, "  %s: 3 sequences together vs alone over %d rows: same top-1 %d (the largest lead of a flipped "
            "one: %.3f), mean KL %.2e\n", name, rows, same, worst_flip, kl_sum / rows);
    // the prompts' pass (one GEMM over all three) leaves caches a little off each prompt's own; the rows drift
    // from there (the decode steps' matmuls have the bits of one sequence's: test_backend), and a top-1 with a
    // small lead may flip (leads of 0.11 and 0.30 have, on Gemma 3 and SmolLM2)
    NM_CHECK(rows == 3 * (SEQ_STEPS + 1) && kl_sum / rows < 0.005 && same >= rows - 2 && worst_flip < 1.0);
    // isolation: sequence 0's row, the same bits whatever the other rows hold
    const int32_t p0 = nt[0] + SEQ_STEPS;
    int32_t t1[3] = {toks[0][3], toks[1][2], toks[2][1]}, t2[3] = {toks[0][3], toks[2][0], toks[1][4]};
    int32_t ps[3] = {p0, nt[1] + SEQ_STEPS, nt[2] + SEQ_STEPS}, sq[3] = {0, 1, 2};
    float *keep = malloc(sizeof(float) * (size_t)nv);
    NM_CHECK(keep && nm_decode_seqs(c, t1, ps, sq, 3, 3) == NM_OK);
    if (keep) memcpy(keep, nm_get_logits(c, 0), sizeof(float) * (size_t)nv);
    NM_CHECK(nm_decode_seqs(c, t2, ps, sq, 3, 3) == NM_OK);
    NM_CHECK(keep && !memcmp(keep, nm_get_logits(c, 0), sizeof(float) * (size_t)nv));
    NM_CHECK(memcmp(nm_get_logits(c, 1), nm_get_logits(c, 2), sizeof(float) * (size_t)nv) != 0);
    free(keep);
    // bad batches
    int32_t bad_seq[2] = {0, 3}, dup_pos[2] = {5, 5}, far[2] = {5, 64}, two[2] = {0, 0}, ok_pos[2] = {5, 6};
    NM_CHECK(nm_decode_seqs(c, t1, ok_pos, bad_seq, 2, 1) == NM_ERR_RANGE && strstr(nm_ctx_last_error(c), "sequence 3"));
    NM_CHECK(nm_decode_seqs(c, t1, dup_pos, two, 2, 1) == NM_ERR_INVALID_ARG && strstr(nm_ctx_last_error(c), "same position 5"));
    NM_CHECK(nm_decode_seqs(c, t1, far, two, 2, 1) == NM_ERR_RANGE && strstr(nm_ctx_last_error(c), "position 64"));
    NM_CHECK(nm_decode_seqs(c, t1, ok_pos, two, 2, 3) == NM_ERR_RANGE && nm_get_logits(c, 0) == NULL);
    NM_CHECK(nm_decode_embd_seq(c, (const float[1]){0}, 1, 0, 5, false) == NM_ERR_RANGE);
    nm_ctx_free(c);
    // a device context decodes one sequence (the CPU backend several)
    cp.device = "opencl";
    char err[300] = "";
    NM_CHECK(nm_ctx_create(m, &cp, &c, err, sizeof err) != NM_OK && c == NULL);
    NM_CHECK(strstr(err, "3 sequences") || strstr(err, "OpenCL") || strstr(err, "opencl"));
    free(ref);
    nm_model_free(m);
}

NM_TEST(smollm2_seqs_equal_alone) { seqs_equal_alone(NM_SMOLLM2, nmtest_failed); }
NM_TEST(gemma3_seqs_equal_alone) { seqs_equal_alone(NM_GEMMA3, nmtest_failed); }

NM_TEST_MAIN()
