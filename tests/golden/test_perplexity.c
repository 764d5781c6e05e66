// Perplexity of the default models on tests/data/declaration.txt (1,337 words,
// public domain), chunks of 256 tokens scored on their second half exactly as
// llama.cpp's perplexity tool does, against the values llama.cpp gives on the
// same files (docs/correctness.md has the commands).
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#include "../unit/nmtest.h"
#include "genmodel.h"
#include "models.h"
#include "backend/cpu/gemm.h"
#include "quant/quant.h"
#include "nanomind.h"

// llama-perplexity -c 256 -b 256 -t 2 at llama.cpp 0c1e570 (docs/correctness.md).
#define NM_PPL_SMOLLM2 20.9808
#define NM_PPL_GEMMA3 11.0402
// The same on SmolLM2 rewritten with f32 matrices (nm-requant --type f32), -ctk f32 -ctv f32.
#define NM_PPL_SMOLLM2_F32 20.9300
#define NM_PPL_GEMMA3_F32 10.9119
// Ours, measured (build/golden_test_perplexity, 2026-12-01, AVX-512 Xeon). The
// integer dots are exact on every kernel table; only the order of the f32 sums
// differs between kernel sets, and the models amplify it. The AVX-512 set
// (quantized tiles, the panel GEMM and the panel attention of prefill):
// SmolLM2 21.0126, Gemma 3 10.9946 since the packed prefill kernels (2026-12-03,
// AMD EPYC: the q4_0..q8_0 and q4_K..q6_K prefill sums are the reference's
// bits; 20.9073 and 11.1050 before, Gemma 3 11.1270 with only the 32-element
// formats packed; 10.9511 with prefill attention one query at a time, 11.1705
// before the q4_K and q6_K prefill tiles). The AVX2 set,
// with or without VNNI (ctests golden_test_perplexity_avx2*): 20.9462 and
// 11.1553; the scalar reference (NM_FORCE_REF=1, not run here) gives Gemma 3
// 11.0701. Each set is held to its own figure (limits 0.1% and 0.3%); a CPU
// that mixes them (AVX-512F without the AVX-512 integer set) is held to
// llama.cpp's figure only.
#define NM_PPL_SMOLLM2_OURS_AVX512 21.0126
#define NM_PPL_SMOLLM2_OURS_AVX2 20.9462
#define NM_PPL_GEMMA3_OURS_AVX512 10.9946
#define NM_PPL_GEMMA3_OURS_AVX2 11.1553
static double ours_for(double avx512, double avx2) {
    const bool quant512 = strstr(nm_kernels_get()->name, "avx512") != NULL, panel = nm_gemm_panel_get() != NULL;
    return quant512 && panel ? avx512 : !quant512 && !panel ? avx2 : 0.0;
}

static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) b[n] = '\0', *len = (size_t)n;
    return b;
}

// llama.cpp's log-probs at every scored position, reduced by tools/kld_topk.py
// to the 16 likeliest tokens (tests/data/kld, README there).
typedef struct topk_ref {
    int32_t n_pos, k, n_vocab, has_other;
    size_t rec; // bytes per position
    unsigned char *data;
} topk_ref;

static int topk_load(const char *name, topk_ref *r) {
    char path[512];
    size_t len = 0;
    snprintf(path, sizeof path, "tests/data/kld/%s.topk", name);
    memset(r, 0, sizeof *r);
    r->data = (unsigned char *)read_all(path, &len);
    if (!r->data || len < 24 || memcmp(r->data, "NMTOPK01", 8)) return -1;
    memcpy(&r->n_pos, r->data + 8, 4);
    memcpy(&r->k, r->data + 12, 4);
    memcpy(&r->n_vocab, r->data + 16, 4);
    memcpy(&r->has_other, r->data + 20, 4);
    if (r->k < 1 || r->k > 64 || r->n_pos < 1) return -1;
    r->rec = 8 + 8 * (size_t)r->k + (r->has_other ? 4 * (size_t)r->k + 4 : 0);
    return len == 24 + r->rec * (size_t)r->n_pos ? 0 : -1;
}

static void topk_free(topk_ref *r) { free(r->data); }

typedef struct kl_stats {
    long count, same_top, same_next; // positions, top-1 agreements, same scored token
    double kl, max_dlogp;            // KL summed (lower bound: the k tokens + one bin), max |dlogp| among the k
} kl_stats;

// Position i of r against log-probs q (one value per token id; NULL: the
// other run stored in r). tok: the token scored at that position.
static void topk_compare(const topk_ref *r, int32_t i, const float *q, int32_t tok, kl_stats *ks) {
    const unsigned char *rec = r->data + 24 + (size_t)i * r->rec;
    int32_t next, id, q_top = -1;
    float lp, lq;
    memcpy(&next, rec, 4);
    ks->same_next += next == tok;
    double sp = 0, sq = 0, kl = 0;
    for (int32_t j = 0; j < r->k; j++) {
        memcpy(&id, rec + 8 + 4 * (size_t)j, 4);
        memcpy(&lp, rec + 8 + 4 * (size_t)(r->k + j), 4);
        if (q) lq = q[id];
        else memcpy(&lq, rec + 8 + 4 * (size_t)(2 * r->k + j), 4);
        sp += exp(lp);
        sq += exp(lq);
        kl += exp(lp) * (lp - lq);
        if (lp > -16.0f && fabs(lp - lq) > ks->max_dlogp) ks->max_dlogp = fabs(lp - lq);
    }
    int32_t p_top;
    memcpy(&p_top, rec + 8, 4);
    if (q) {
        float best = q[0];
        q_top = 0;
        for (int32_t v = 1; v < r->n_vocab; v++)
            if (q[v] > best) best = q[v], q_top = v;
    } else {
        memcpy(&q_top, rec + 8 + 12 * (size_t)r->k, 4);
    }
    // A tie in llama.cpp's 16-bit log-probs (a soft-capped model saturates many
    // tokens at the cap) counts as agreement when ours picks any of the tied.
    bool same = p_top == q_top;
    float lp_top;
    memcpy(&lp_top, rec + 8 + 4 * (size_t)r->k, 4);
    for (int32_t j = 1; j < r->k && !same; j++) {
        memcpy(&id, rec + 8 + 4 * (size_t)j, 4);
        memcpy(&lp, rec + 8 + 4 * (size_t)(r->k + j), 4);
        same = id == q_top && lp == lp_top;
    }
    const double pt = 1 - sp, qt = 1 - sq;
    if (pt > 1e-12) kl += pt * log(pt / (qt > 1e-12 ? qt : 1e-12));
    ks->kl += kl;
    ks->same_top += same;
    ks->count++;
}

// The perplexity tool's method (tools/cli/cmd_perplexity.c), through the
// public API with one batch per chunk; the CLI's multi-batch path is checked
// by tests/cli/test_cli.sh. With ref, also compares every scored position's
// log-probs with llama.cpp's. Returns -1 on any failure.
static double perplexity(nm_model *m, const char *text, size_t len, int n_ctx, const topk_ref *ref,
                         kl_stats *ks) {
    double ppl = -1, nll = 0;
    long count = 0;
    nm_ctx *c = NULL;
    int32_t probe[4], *chunk = malloc(sizeof(int32_t) * (size_t)n_ctx);
    int32_t n = -nm_tokenize(m, text, len, NULL, 0, true, false);
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
    const int nv = nm_model_n_vocab(m), first = n_ctx / 2;
    float *lq = ref ? malloc(sizeof(float) * (size_t)nv) : NULL;
    nm_ctx_params cp = nm_ctx_default_params();
    cp.n_ctx = cp.n_batch = n_ctx;
    if (!toks || !chunk || (ref && (!lq || ref->n_vocab != nv)) || n <= 0 ||
        nm_tokenize(m, text, len, toks, n, true, false) != n || nm_ctx_create(m, &cp, &c, NULL, 0) != NM_OK)
        goto out;
    const int32_t bos = nm_tokenize(m, "", 0, probe, 4, true, false) >= 1 ? probe[0] : -1;
    if (ref && ref->n_pos != (n / n_ctx) * (n_ctx - 1 - first)) goto out;
    for (int ch = 0; ch < n / n_ctx; ch++) {
        memcpy(chunk, toks + ch * n_ctx, sizeof(int32_t) * (size_t)n_ctx);
        if (bos >= 0) chunk[0] = bos;
        if (nm_decode(c, chunk, n_ctx, 0, true) != NM_OK) goto out;
        for (int p = first; p < n_ctx - 1; p++) {
            const float *l = nm_get_logits(c, p);
            float mx = l[0];
            for (int v = 1; v < nv; v++) mx = fmaxf(mx, l[v]);
            double se = 0;
            for (int v = 0; v < nv; v++) se += exp((double)l[v] - mx);
            const double lse = mx + log(se);
            const int32_t next = toks[ch * n_ctx + p + 1];
            nll += lse - l[next];
            if (ref) {
                for (int v = 0; v < nv; v++) lq[v] = (float)(l[v] - lse);
                topk_compare(ref, (int32_t)count, lq, next, ks);
            }
            count++;
        }
    }
    if (count > 0) ppl = exp(nll / (double)count);
out:
    free(lq);
    free(chunk);
    free(toks);
    nm_ctx_free(c);
    return ppl;
}

// What a comparison with llama.cpp's stored log-probs must show: at least
// top1 positions with the same likeliest token, a mean KL (lower bound) and a
// largest log-prob difference among the 16 likeliest at most kl and dlogp.
typedef struct kl_limits {
    const char *topk; // tests/data/kld/NAME.topk
    long top1;
    double kl, dlogp;
} kl_limits;

static void kl_report(const char *name, const kl_stats *ks, const kl_limits *lim, int *nmtest_failed) {
    fprintf(stderr, "  %s vs llama.cpp: top-1 %.2f%% (%ld/%ld), mean KL %.2e, max |dlogp| %.4f (limits %ld, %.1e, %.4f)\n",
            name, 100.0 * ks->same_top / (ks->count ? ks->count : 1), ks->same_top, ks->count,
            ks->kl / (ks->count ? ks->count : 1), ks->max_dlogp, lim->top1, lim->kl, lim->dlogp);
    NM_CHECK(ks->count > 0 && ks->same_next == ks->count); // the same text, token for token
    NM_CHECK(ks->same_top >= lim->top1);
    NM_CHECK(ks->kl / (ks->count ? ks->count : 1) <= lim->kl);
    NM_CHECK(ks->max_dlogp <= lim->dlogp);
}

// ours > 0: also within ours_tol of our own measured value. lim: also
// against llama.cpp's log-probs.
static void check_path(const char *path, const char *name, double want, double rel_tol, double ours,
                       double ours_tol, const kl_limits *lim, int *nmtest_failed) {
    size_t len = 0;
    char *text = read_all("tests/data/declaration.txt", &len);
    NM_CHECK(text != NULL);
    nm_model *m = NULL;
    topk_ref ref = {0};
    kl_stats ks = {0};
    NM_CHECK(!lim || topk_load(lim->topk, &ref) == 0);
    NM_CHECK(nm_model_load(path, NULL, &m, NULL, 0) == NM_OK);
    if (text && m && (!lim || ref.data)) {
        double ppl = perplexity(m, text, len, 256, lim ? &ref : NULL, &ks);
        fprintf(stderr, "  %s: PPL %.4f, llama.cpp %.4f (%+.2f%%)\n", name, ppl, want, 100 * (ppl / want - 1));
        NM_CHECK(fabs(ppl / want - 1) <= rel_tol);
        if (ours > 0) {
            fprintf(stderr, "  %s: ours as measured %.4f (%+.3f%%)\n", name, ours, 100 * (ppl / ours - 1));
            NM_CHECK(fabs(ppl / ours - 1) <= ours_tol);
        }
        if (lim) kl_report(name, &ks, lim, nmtest_failed);
    }
    topk_free(&ref);
    nm_model_free(m);
    free(text);
}

static void check(const char *name, double want, double rel_tol, double ours, double ours_tol,
                  const kl_limits *lim, int *nmtest_failed) {
    char path[1024];
    NM_NEED_MODEL(name, path);
    check_path(path, name, want, rel_tol, ours, ours_tol, lim, nmtest_failed);
}

// Against llama.cpp: both round activations to 8 bits before the quantized
// dot products and keep K/V in f16, but the models amplify the smallest
// difference in summation order; measured -0.35% (SmolLM2; -0.17% and -0.49%
// with earlier kernel sets) and +0.59% (Gemma 3; -0.81% and +1.18% with
// earlier sets): limits 1% and 2%. Log-probs against llama.cpp's (AVX-512
// Xeon, 2026-12-01): top-1 713 / 762 and 703 / 762, mean KL (lower bound, top
// 16 + rest) 5.1e-3 and 1.59e-2, max |dlogp| among the 16 likeliest 1.55 and 3.96
// - as far as llama.cpp is from itself (llama_cpp_against_itself: 718 and
// 720, 5.0e-3 and 1.92e-2). With NM_NO_AVX512=1 (the AVX2 kernels, another
// order of the f32 sums): 718 and 711, 5.0e-3 and 1.64e-2. Limits: 706 and
// 700 positions, KL and dlogp about +40% of the first figures measured.
NM_TEST(smollm2_perplexity_matches_llama_cpp) {
    static const kl_limits lim = {"smollm2-q", 706, 7e-3, 2.0};
    check(NM_SMOLLM2, NM_PPL_SMOLLM2, 0.01, ours_for(NM_PPL_SMOLLM2_OURS_AVX512, NM_PPL_SMOLLM2_OURS_AVX2), 0.001, &lim,
          nmtest_failed);
}
NM_TEST(gemma3_perplexity_matches_llama_cpp) {
    static const kl_limits lim = {"gemma3-q", 700, 2.4e-2, 5.0};
    check(NM_GEMMA3, NM_PPL_GEMMA3, 0.02, ours_for(NM_PPL_GEMMA3_OURS_AVX512, NM_PPL_GEMMA3_OURS_AVX2), 0.003, &lim,
          nmtest_failed);
}

// Real weights without 8-bit activation rounding (SmolLM2's matrices in f32):
// the forward passes agree to 0.1% (measured: 20.9308 vs 20.9300); log-probs:
// top-1 762 / 762, mean KL 4.3e-7, max |dlogp| 0.0171 (limits 1e-6, 0.025).
static void check_f32(const char *name, const char *label, const char *tag, double want, const kl_limits *lim,
                      int *nmtest_failed) {
    char path[1024], out[256];
    NM_NEED_MODEL(name, path);
    snprintf(out, sizeof out, "/tmp/nm-test-%s-f32-%d.gguf", tag, (int)getpid());
    NM_CHECK(nm_requant_write(path, out, NM_TYPE_F32) == 0);
    check_path(out, label, want, 0.001, 0, 0, lim, nmtest_failed);
    unlink(out);
}

NM_TEST(smollm2_f32_perplexity_matches_llama_cpp_closely) {
    static const kl_limits lim = {"smollm2-f32", 762, 1e-6, 0.025};
    check_f32(NM_SMOLLM2, "SmolLM2 (f32 matrices)", "smollm2", NM_PPL_SMOLLM2_F32, &lim, nmtest_failed);
}

// The same for Gemma 3 (measured: 10.9106 vs 10.9119; top-1 762 / 762, mean
// KL 2.5e-6, max |dlogp| 0.058; limits 5e-6, 0.08).
NM_TEST(gemma3_f32_perplexity_matches_llama_cpp_closely) {
    static const kl_limits lim = {"gemma3-f32", 762, 5e-6, 0.08};
    check_f32(NM_GEMMA3, "Gemma 3 (f32 matrices)", "gemma3", NM_PPL_GEMMA3_F32, &lim, nmtest_failed);
}

// llama.cpp against itself: its default run (flash attention, K and V in f16)
// and its -fa off -ctk f32 -ctv f32 run, both stored (tests/data/kld): the
// distance between its own two attention modes, the yardstick for ours above.
// Pure data, so exact: top-1 718 and 720 / 762, mean KL 4.99e-3 and 1.92e-2.
NM_TEST(llama_cpp_against_itself) {
    static const struct { const char *topk; long top1; double kl; } SELF[] = {
        {"smollm2-q-vs-nofa", 718, 4.99e-3 + 5e-5},
        {"gemma3-q-vs-nofa", 720, 1.92e-2 + 5e-5},
    };
    for (size_t i = 0; i < sizeof SELF / sizeof SELF[0]; i++) {
        topk_ref r;
        kl_stats ks = {0};
        NM_CHECK(topk_load(SELF[i].topk, &r) == 0 && r.has_other);
        for (int32_t p = 0; r.data && r.has_other && p < r.n_pos; p++) {
            int32_t next;
            memcpy(&next, r.data + 24 + (size_t)p * r.rec, 4);
            topk_compare(&r, p, NULL, next, &ks);
        }
        fprintf(stderr, "  %s: top-1 %.2f%% (%ld/%ld), mean KL %.2e\n", SELF[i].topk,
                100.0 * ks.same_top / (ks.count ? ks.count : 1), ks.same_top, ks.count, ks.kl / (ks.count ? ks.count : 1));
        NM_CHECK(ks.count == 762 && ks.same_top >= SELF[i].top1 && ks.kl / ks.count <= SELF[i].kl);
        topk_free(&r);
    }
}

// Random-weight models of each architecture (f32, 3 layers, d 256, 4 heads / 2
// KV heads, ff 512, SmolLM2's tokenizer, seed 3; gemma3 with a 64-token window
// and final_logit_softcapping 10), against llama.cpp 0c1e570 on the same files:
//   nm-genmodel --arch ARCH --tokenizer-from SmolLM2-135M-Instruct.Q4_1.gguf -o rand-ARCH.gguf
//       --type f32 --embd 256 --heads 4 --kv-heads 2 --ff 512 --layers 3 --swa 64 --seed 3
//       [--final-softcap 10]        (one command line)
//   llama-perplexity -m rand-ARCH.gguf -f tests/data/declaration.txt -c 256 -b 256 -t 2 -ctk f32 -ctv f32
// The values stored are ln(PPL), the mean negative log-likelihood of the 762
// scored tokens (a random model's PPL is astronomic). Measured: ours differ by
// 1.4e-5, 1.3e-5 and 2.7e-5; the limit is 2e-4. Log-probs: top-1 762 / 762
// each (a tie in the stored 16-bit values counts), max |dlogp| 0.0015, 0.0009,
// 0.0001 (limit 0.003); mean KL 1.3e-5, 1.3e-5, 5e-12 (limit 2e-5: the stored
// file's resolution, not ours - the full rows give < 1e-6). Unlike the real models, every
// architecture's own parts (qwen2's attention biases, gemma3's norms, window,
// embedding scale and final softcap) carry weight here.
static const struct {
    const char *arch;
    float final_softcap;
    double ln_ppl; // llama.cpp's
    kl_limits lim; // against its log-probs
} RANDOM_ARCHS[] = {
    {"llama", 0.0f, 67.991476, {"rand-llama", 762, 2e-5, 0.003}},
    {"qwen2", 0.0f, 68.382328, {"rand-qwen2", 762, 2e-5, 0.003}},
    {"gemma3", 10.0f, 19.000320, {"rand-gemma3", 762, 2e-5, 0.003}},
    // llama.cpp ignores final_logit_softcapping for llama: the same log-probs
    {"llama", 10.0f, 67.991476, {"rand-llama", 762, 2e-5, 0.003}},
};

NM_TEST(random_archs_match_llama_cpp) {
    char tok[1024], out[256];
    NM_NEED_MODEL(NM_SMOLLM2, tok);
    size_t len = 0;
    char *text = read_all("tests/data/declaration.txt", &len);
    NM_CHECK(text != NULL);
    for (size_t i = 0; text && i < sizeof RANDOM_ARCHS / sizeof RANDOM_ARCHS[0]; i++) {
        snprintf(out, sizeof out, "/tmp/nm-test-rand-%s-%d.gguf", RANDOM_ARCHS[i].arch, (int)getpid());
        gen_opts o = nm_genmodel_defaults();
        o.arch = RANDOM_ARCHS[i].arch;
        o.tok_from = tok;
        o.out = out;
        o.type = NM_TYPE_F32;
        o.embd = 256;
        o.heads = 4;
        o.kv_heads = 2;
        o.ff = 512;
        o.layers = 3;
        o.swa = 64;
        o.seed = 3;
        o.final_softcap = RANDOM_ARCHS[i].final_softcap;
        NM_CHECK(nm_genmodel_write(&o) == 0);
        nm_model *m = NULL;
        topk_ref ref = {0};
        kl_stats ks = {0};
        NM_CHECK(topk_load(RANDOM_ARCHS[i].lim.topk, &ref) == 0);
        NM_CHECK(nm_model_load(out, NULL, &m, NULL, 0) == NM_OK);
        if (m && ref.data) {
            const double ln_ppl = log(perplexity(m, text, len, 256, &ref, &ks));
            fprintf(stderr, "  random %s: ln PPL %.6f, llama.cpp %.6f (%+.2g)\n", o.arch, ln_ppl,
                    RANDOM_ARCHS[i].ln_ppl, ln_ppl - RANDOM_ARCHS[i].ln_ppl);
            NM_CHECK(fabs(ln_ppl - RANDOM_ARCHS[i].ln_ppl) <= 2e-4);
            kl_report(o.arch, &ks, &RANDOM_ARCHS[i].lim, nmtest_failed);
        }
        topk_free(&ref);
        nm_model_free(m);
        unlink(out);
    }
    free(text);
}

NM_TEST_MAIN()
