// Perplexity of the default models on tests/data/declaration.txt (1,337 words,
// public domain), chunks of 256 tokens scored on their second half exactly as
// llama.cpp's perplexity tool does, against the values llama.cpp gives on the
// same files (docs/correctness.md has the commands).
#include <string.h>
#include <unistd.h>

#include "../unit/nmtest.h"
#include "genmodel.h"
#include "models.h"
#include "quant/quant.h"
#include "nanomind.h"

// llama-perplexity -c 256 -b 256 -t 2 at llama.cpp 0c1e570 (docs/correctness.md).
#define NM_PPL_SMOLLM2 20.9808
#define NM_PPL_GEMMA3 11.0402
// The same on SmolLM2 rewritten with f32 matrices (nm-requant --type f32), -ctk f32 -ctv f32.
#define NM_PPL_SMOLLM2_F32 20.9300
// Ours, measured (build/golden_test_perplexity, 2026-12-01, AVX-512 Xeon). The
// integer dots are exact on every kernel table; only the order of the f32 sums
// differs between kernel sets. SmolLM2 gives 20.9462 with every x86 set;
// Gemma 3 amplifies the order: 11.1705 (AVX-512), 11.1553 (AVX2, with or
// without VNNI: -0.14%), and the scalar reference (NM_FORCE_REF=1, not run
// here) 11.0701. Limits: 0.1% and 0.3%.
#define NM_PPL_SMOLLM2_OURS 20.9462
#define NM_PPL_GEMMA3_OURS 11.1705

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

// The perplexity tool's method (tools/cli/cmd_perplexity.c), through the
// public API with one batch per chunk; the CLI's multi-batch path is checked
// by tests/cli/test_cli.sh. Returns -1 on any failure.
static double perplexity(nm_model *m, const char *text, size_t len, int n_ctx) {
    double ppl = -1, nll = 0;
    long count = 0;
    nm_ctx *c = NULL;
    int32_t probe[4], *chunk = malloc(sizeof(int32_t) * (size_t)n_ctx);
    int32_t n = -nm_tokenize(m, text, len, NULL, 0, true, false);
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
    nm_ctx_params cp = nm_ctx_default_params();
    cp.n_ctx = cp.n_batch = n_ctx;
    if (!toks || !chunk || n <= 0 || nm_tokenize(m, text, len, toks, n, true, false) != n ||
        nm_ctx_create(m, &cp, &c, NULL, 0) != NM_OK)
        goto out;
    const int32_t bos = nm_tokenize(m, "", 0, probe, 4, true, false) >= 1 ? probe[0] : -1;
    const int nv = nm_model_n_vocab(m), first = n_ctx / 2;
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
            nll += mx + log(se) - l[toks[ch * n_ctx + p + 1]];
            count++;
        }
    }
    if (count > 0) ppl = exp(nll / (double)count);
out:
    free(chunk);
    free(toks);
    nm_ctx_free(c);
    return ppl;
}

// ours > 0: also within ours_tol of our own measured value.
static void check_path(const char *path, const char *name, double want, double rel_tol, double ours,
                       double ours_tol, int *nmtest_failed) {
    size_t len = 0;
    char *text = read_all("tests/data/declaration.txt", &len);
    NM_CHECK(text != NULL);
    nm_model *m = NULL;
    NM_CHECK(nm_model_load(path, NULL, &m, NULL, 0) == NM_OK);
    if (text && m) {
        double ppl = perplexity(m, text, len, 256);
        fprintf(stderr, "  %s: PPL %.4f, llama.cpp %.4f (%+.2f%%)\n", name, ppl, want, 100 * (ppl / want - 1));
        NM_CHECK(fabs(ppl / want - 1) <= rel_tol);
        if (ours > 0) {
            fprintf(stderr, "  %s: ours as measured %.4f (%+.3f%%)\n", name, ours, 100 * (ppl / ours - 1));
            NM_CHECK(fabs(ppl / ours - 1) <= ours_tol);
        }
    }
    nm_model_free(m);
    free(text);
}

static void check(const char *name, double want, double rel_tol, double ours, double ours_tol,
                  int *nmtest_failed) {
    char path[1024];
    NM_NEED_MODEL(name, path);
    check_path(path, name, want, rel_tol, ours, ours_tol, nmtest_failed);
}

// Against llama.cpp: both round activations to 8 bits before the quantized
// dot products and keep K/V in f16, but the models amplify the smallest
// difference in summation order; measured -0.17% (SmolLM2; -0.49% with an
// earlier kernel set) and +1.18% (Gemma 3): limits 1% and 2%.
NM_TEST(smollm2_perplexity_matches_llama_cpp) {
    check(NM_SMOLLM2, NM_PPL_SMOLLM2, 0.01, NM_PPL_SMOLLM2_OURS, 0.001, nmtest_failed);
}
NM_TEST(gemma3_perplexity_matches_llama_cpp) {
    check(NM_GEMMA3, NM_PPL_GEMMA3, 0.02, NM_PPL_GEMMA3_OURS, 0.003, nmtest_failed);
}

// Real weights without 8-bit activation rounding (SmolLM2's matrices in f32):
// the forward passes agree to 0.1% (measured: 20.9308 vs 20.9300).
NM_TEST(smollm2_f32_perplexity_matches_llama_cpp_closely) {
    char path[1024], out[256];
    NM_NEED_MODEL(NM_SMOLLM2, path);
    snprintf(out, sizeof out, "/tmp/nm-test-smollm2-f32-%d.gguf", (int)getpid());
    NM_CHECK(nm_requant_write(path, out, NM_TYPE_F32) == 0);
    check_path(out, "SmolLM2 (f32 matrices)", NM_PPL_SMOLLM2_F32, 0.001, 0, 0, nmtest_failed);
    unlink(out);
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
// 1.4e-5, 1.3e-5 and 2.7e-5; the limit is 2e-4. Unlike the real models, every
// architecture's own parts (qwen2's attention biases, gemma3's norms, window,
// embedding scale and final softcap) carry weight here.
static const struct {
    const char *arch;
    float final_softcap;
    double ln_ppl; // llama.cpp's
} RANDOM_ARCHS[] = {
    {"llama", 0.0f, 67.991476},
    {"qwen2", 0.0f, 68.382328},
    {"gemma3", 10.0f, 19.000320},
    {"llama", 10.0f, 67.991476}, // llama.cpp ignores final_logit_softcapping for llama: the same PPL
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
        NM_CHECK(nm_model_load(out, NULL, &m, NULL, 0) == NM_OK);
        if (m) {
            const double ln_ppl = log(perplexity(m, text, len, 256));
            fprintf(stderr, "  random %s: ln PPL %.6f, llama.cpp %.6f (%+.2g)\n", o.arch, ln_ppl,
                    RANDOM_ARCHS[i].ln_ppl, ln_ppl - RANDOM_ARCHS[i].ln_ppl);
            NM_CHECK(fabs(ln_ppl - RANDOM_ARCHS[i].ln_ppl) <= 2e-4);
        }
        nm_model_free(m);
        unlink(out);
    }
    free(text);
}

NM_TEST_MAIN()
