// The default models on the OpenCL backend (PoCL on the CPU here and in CI;
// any OpenCL device with NM_OPENCL_DEVICE=opencl:N) against the CPU backend:
// greedy text, per-position distributions, perplexity, a layer split, and
// that the weights are read in place. Skips where no OpenCL device exists.
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../unit/nmtest.h"
#include "models.h"
#include "bricks/vision/clip.h"
#include "genmmproj.h"
#include "genmodel.h"
#include "backend/backend.h"
#include "gguf/gguf.h"
#include "nanomind.h"
#include "quant/quant.h"

static const char *device(void) {
    const char *d = getenv("NM_OPENCL_DEVICE");
    return d && *d ? d : "opencl";
}

// Whether device() is NVIDIA's OpenCL (its name, as the backend reports it).
static bool on_nvidia(void) {
    nm_backend *b = NULL;
    const nm_backend_params bp = {.n_threads = 1, .max_row = 64, .max_tokens = 1};
    bool nv = false;
    char err[256];
    if (nm_backend_create(device(), &bp, &b, err, sizeof err) == NM_OK) {
        nm_backend_stats st;
        nm_backend_get_stats(b, &st);
        nv = strstr(st.device, "NVIDIA") != NULL;
    }
    nm_backend_free(b);
    return nv;
}

// Skips the case unless an OpenCL device exists (and builds our kernels).
#define NEED_OPENCL(m)                                                                    \
    do {                                                                                  \
        nm_ctx_params cp_ = nm_ctx_default_params();                                      \
        cp_.n_ctx = 16;                                                                   \
        cp_.device = device();                                                            \
        nm_ctx *c_ = NULL;                                                                \
        char e_[512];                                                                     \
        nm_status st_ = nm_ctx_create((m), &cp_, &c_, e_, sizeof e_);                     \
        nm_ctx_free(c_);                                                                  \
        if (st_ == NM_ERR_UNSUPPORTED && strstr(e_, "no OpenCL")) {                       \
            nm_model_free(m);                                                             \
            NM_SKIP(e_);                                                                  \
        }                                                                                 \
        NM_CHECK(st_ == NM_OK);                                                           \
        if (st_ != NM_OK) {                                                               \
            fprintf(stderr, "  %s\n", e_);                                                \
            nm_model_free(m);                                                             \
            return;                                                                       \
        }                                                                                 \
    } while (0)

static nm_ctx *ctx_on(nm_model *m, const char *dev, int32_t ngl, int32_t n_ctx) {
    nm_ctx_params cp = nm_ctx_default_params();
    cp.n_ctx = cp.n_batch = n_ctx;
    cp.device = dev;
    cp.n_gpu_layers = ngl;
    nm_ctx *c = NULL;
    char err[512];
    if (nm_ctx_create(m, &cp, &c, err, sizeof err) != NM_OK) fprintf(stderr, "  ctx on %s: %s\n", dev, err);
    return c;
}

static int argmax(const float *l, int32_t n) {
    int b = 0;
    for (int32_t v = 1; v < n; v++)
        if (l[v] > l[b]) b = v;
    return b;
}

// Greedy: n tokens after prompt into out (ids).
static int greedy(nm_model *m, nm_ctx *c, const char *prompt, int n, int32_t *out) {
    int32_t toks[128];
    int32_t nt = nm_tokenize(m, prompt, strlen(prompt), toks, 100, true, true);
    if (nt <= 0 || nm_decode(c, toks, nt, 0, false) != NM_OK) return -1;
    int k = 0;
    for (; k < n; k++) {
        out[k] = argmax(nm_get_logits(c, -1), nm_model_n_vocab(m));
        if (nm_decode(c, &out[k], 1, nt + k, false) != NM_OK) return -1;
    }
    return k;
}

static nm_model *load(const char *path) {
    nm_model *m = NULL;
    char err[256];
    if (nm_model_load(path, NULL, &m, err, sizeof err) != NM_OK) fprintf(stderr, "  %s: %s\n", path, err);
    return m;
}

#define LOAD(m, name)                     \
    char path_[1024];                     \
    NM_NEED_MODEL(name, path_);           \
    nm_model *m = load(path_);            \
    NM_CHECK(m != NULL);                  \
    if (!m) return

// Greedy text on the device equals the CPU's, for `want` tokens or up to a
// near tie (where they part, the device's token within NM_TIE of the CPU's
// top logit on the CPU: the CPU's 8-bit activations and the device's f32
// ones may order two such tokens either way); then the CPU's continuation
// replayed on the device (teacher forcing): the top-1 agrees at `min_same`
// positions or more and the mean KL stays under max_kl.
#define NM_TIE 0.1 // logits

// Where two greedy texts of n tokens from prompt part (n if nowhere), and the margin of a's token over b's
// there in c's logits (prompt and a decoded at once; 0 where they do not part).
static int parting(nm_model *m, nm_ctx *c, const char *prompt, const int32_t *a, const int32_t *b, int n,
                   double *margin) {
    int k = 0;
    while (k < n && a[k] == b[k]) k++;
    *margin = 0;
    if (k == n) return n;
    int32_t toks[256];
    const int32_t nt = nm_tokenize(m, prompt, strlen(prompt), toks, 128, true, true);
    if (nt <= 0 || nt + n > 256) return *margin = INFINITY, k;
    memcpy(toks + nt, a, sizeof *a * (size_t)n);
    const float *l = nm_decode(c, toks, nt + n, 0, true) == NM_OK ? nm_get_logits(c, nt - 1 + k) : NULL;
    *margin = l ? l[a[k]] - l[b[k]] : INFINITY;
    return k;
}
static void same_as_cpu(const char *name, const char *prompt, int want_equal, int min_same, double max_kl,
                        int *nmtest_failed) {
    LOAD(m, name);
    NEED_OPENCL(m);
    enum { N = 24 };
    nm_ctx *cpu = ctx_on(m, "cpu", -1, 256), *dev = ctx_on(m, device(), -1, 256);
    NM_CHECK(cpu && dev);
    int32_t a[N], b[N];
    NM_CHECK(cpu && dev && greedy(m, cpu, prompt, N, a) == N && greedy(m, dev, prompt, N, b) == N);
    int equal = 0;
    while (equal < N && a[equal] == b[equal]) equal++;
    // teacher forcing over prompt + the CPU's tokens, all logits at once
    int32_t toks[160];
    int32_t nt = nm_tokenize(m, prompt, strlen(prompt), toks, 100, true, true);
    memcpy(toks + nt, a, sizeof a);
    const int32_t n = nt + N, nv = nm_model_n_vocab(m);
    NM_CHECK(nm_decode(cpu, toks, n, 0, true) == NM_OK && nm_decode(dev, toks, n, 0, true) == NM_OK);
    double kl_sum = 0;
    int same = 0;
    for (int32_t i = 0; i < n; i++) {
        const float *la = nm_get_logits(cpu, i), *lb = nm_get_logits(dev, i);
        if (!la || !lb) break;
        double ma = la[argmax(la, nv)], mb = lb[argmax(lb, nv)], sa = 0, sb = 0, kl = 0;
        for (int32_t v = 0; v < nv; v++) sa += exp(la[v] - ma), sb += exp(lb[v] - mb);
        for (int32_t v = 0; v < nv; v++) {
            const double pa = exp(la[v] - ma) / sa;
            if (pa > 1e-12) kl += pa * ((la[v] - ma - log(sa)) - (lb[v] - mb - log(sb)));
        }
        kl_sum += kl;
        same += argmax(la, nv) == argmax(lb, nv);
    }
    double tie = 0; // where the greedy texts part: the CPU's margin for its token over the device's
    if (equal < N) {
        const float *la = nm_get_logits(cpu, nt - 1 + equal);
        tie = la ? la[a[equal]] - la[b[equal]] : INFINITY;
    }
    fprintf(stderr, "  %s on %s: greedy equal for %d of %d tokens (then a margin of %.3f); teacher-forced top-1 %d "
            "of %d, mean KL %.2e\n", name, device(), equal, N, tie, same, n, kl_sum / n);
    NM_CHECK(equal >= want_equal || tie <= NM_TIE);
    NM_CHECK(same >= min_same);
    NM_CHECK(kl_sum / n < max_kl);
    nm_ctx_free(cpu);
    nm_ctx_free(dev);
    nm_model_free(m);
}

// SmolLM2: the same 24 greedy tokens; measured on PoCL: 24 of 24, top-1 29 of 29, mean KL 1.1e-3.
NM_TEST(smollm2_opencl_equals_cpu) {
    same_as_cpu(NM_SMOLLM2, "The capital of France is", 24, 28, 0.01, nmtest_failed);
}

// Every layer on a device that shares host memory (PoCL): the activations and
// the KV cache are host pages the device wraps (the host writes the inputs and
// reads the logits in place), against NM_DEVICE_ARENA=1 (the device's own
// buffers, inputs and logits copied): the same kernels, so the same logits
// bit for bit, and the wrapped bytes grow by at least the cache.
NM_TEST(activations_in_shared_memory) {
    char path[1024];
    NM_NEED_MODEL(NM_SMOLLM2, path);
    nm_model *m = load(path);
    NM_CHECK(m != NULL);
    if (!m) return;
    NEED_OPENCL(m);
    nm_ctx *host = ctx_on(m, device(), -1, 64);
    setenv("NM_DEVICE_ARENA", "1", 1);
    nm_ctx *own = ctx_on(m, device(), -1, 64);
    unsetenv("NM_DEVICE_ARENA");
    NM_CHECK(host && own);
    if (host && own) {
        uint64_t wh, uh, wo, uo;
        nm_ctx_device_stats(host, &wh, &uh);
        nm_ctx_device_stats(own, &wo, &uo);
        // K and V, f16: 64 positions of SmolLM2's 3 KV heads of 64 per layer
        const uint64_t cache = 2ull * 64 * (uint64_t)nm_model_n_layer(m) * 64 * 3 * 2;
        fprintf(stderr, "  wrapped: shared activations %.1f MiB, own buffers %.1f MiB (cache %.1f MiB)\n",
                wh / 1048576.0, wo / 1048576.0, cache / 1048576.0);
        NM_CHECK(wh >= wo + cache && uh == 0 && uo == 0);
        const int32_t nv = nm_model_n_vocab(m);
        int32_t toks[6] = {504, 3458, 282, 4649, 314, 2}; // any ids
        bool same = nm_decode(host, toks, 5, 0, false) == NM_OK && nm_decode(own, toks, 5, 0, false) == NM_OK &&
                    !memcmp(nm_get_logits(host, -1), nm_get_logits(own, -1), sizeof(float) * (size_t)nv);
        for (int i = 0; i < 4 && same; i++) {
            const int32_t t = argmax(nm_get_logits(host, -1), nv);
            same = nm_decode(host, &t, 1, 5 + i, false) == NM_OK && nm_decode(own, &t, 1, 5 + i, false) == NM_OK &&
                   !memcmp(nm_get_logits(host, -1), nm_get_logits(own, -1), sizeof(float) * (size_t)nv);
        }
        NM_CHECK(same);
    }
    nm_ctx_free(host);
    nm_ctx_free(own);
    nm_model_free(m);
}

// Gemma 3: the CPU quantizes activations to 8 bits (as llama.cpp's CPU
// backend); the OpenCL kernels multiply them in f32, so the two differ by
// that rounding (docs/correctness.md: the OpenCL perplexity equals the CPU's
// on f32 weights to 1e-4). Measured on PoCL: greedy equal for 24 of 24, top-1
// 30 of 30, mean KL 6e-3.
NM_TEST(gemma3_opencl_close_to_cpu) {
    same_as_cpu(NM_GEMMA3, "The capital of France is", 8, 27, 0.03, nmtest_failed);
}

// Perplexity over the first 512 tokens of tests/data/declaration.txt (two
// chunks of 256, the second halves scored as llama.cpp's tool does).
static double ppl(nm_model *m, nm_ctx *c, const int32_t *toks, int n_chunks) {
    const int nc = 256, first = nc / 2, nv = nm_model_n_vocab(m);
    double nll = 0;
    int cnt = 0;
    for (int ch = 0; ch < n_chunks; ch++) {
        if (nm_decode(c, toks + ch * nc, nc, 0, true) != NM_OK) return NAN;
        for (int p = first; p < nc - 1; p++) {
            const float *l = nm_get_logits(c, p);
            double mx = l[argmax(l, nv)], s = 0;
            for (int v = 0; v < nv; v++) s += exp(l[v] - mx);
            nll += -(l[toks[ch * nc + p + 1]] - mx - log(s));
            cnt++;
        }
    }
    return exp(nll / cnt);
}

static int32_t *declaration(nm_model *m, int32_t *n) {
    FILE *f = fopen("tests/data/declaration.txt", "rb");
    if (!f) return NULL;
    static char text[1 << 16];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = '\0';
    int32_t *toks = malloc(sizeof(int32_t) * 4096);
    *n = toks ? nm_tokenize(m, text, (int32_t)len, toks, 4096, true, false) : 0;
    return toks;
}

// The model with every matrix widened to f32 (the same values): on the CPU,
// f32 weights take f32 activations, so its perplexity is the exact-math
// reference of what the device computes. Written into dir; NULL on failure.
static nm_model *exact_twin(const char *path, char *dir, size_t n) {
    snprintf(dir, n, "/tmp/nm-opencl-XXXXXX");
    if (!mkdtemp(dir)) return NULL;
    char out[1100];
    snprintf(out, sizeof out, "%s/f32.gguf", dir);
    nm_model *m = nm_requant_write(path, out, NM_TYPE_F32) == 0 ? load(out) : NULL;
    unlink(out); // the mapping stays readable until the model is freed
    rmdir(dir);
    return m;
}

// Perplexity (2 chunks; Gemma 3: 1) of the quantized model on the device against the
// exact-math reference (f32 weights on the CPU): within 0.1%. The CPU's own
// value on the quantized model is printed beside it; it differs by its 8-bit
// activations (SmolLM2 ~0.4%, Gemma 3 ~3% on these chunks).
static void perplexity_exact(const char *name, int n_chunks, int *nmtest_failed) {
    LOAD(m, name);
    NEED_OPENCL(m);
    char dir[64];
    nm_model *ref = exact_twin(path_, dir, sizeof dir);
    NM_CHECK(ref != NULL);
    int32_t n = 0, *toks = declaration(m, &n);
    NM_CHECK(toks && n >= 512);
    nm_ctx *cpu = ctx_on(m, "cpu", -1, 256), *dev = ctx_on(m, device(), -1, 256);
    nm_ctx *exact = ref ? ctx_on(ref, "cpu", -1, 256) : NULL;
    NM_CHECK(cpu && dev && exact);
    if (toks && n >= 512 && cpu && dev && exact) {
        const double pc = ppl(m, cpu, toks, n_chunks), pd = ppl(m, dev, toks, n_chunks), pe = ppl(ref, exact, toks, n_chunks);
        fprintf(stderr, "  %s: perplexity exact (f32 weights, cpu) %.4f, %s %.4f (%+.3f%%), cpu %.4f (%+.2f%%)\n",
                name, pe, device(), pd, 100 * (pd / pe - 1), pc, 100 * (pc / pe - 1));
        NM_CHECK(fabs(pd / pe - 1) <= 1e-3);
    }
    free(toks);
    nm_ctx_free(cpu);
    nm_ctx_free(dev);
    nm_ctx_free(exact);
    nm_model_free(ref);
    nm_model_free(m);
}

NM_TEST(smollm2_opencl_perplexity_is_exact_math) { perplexity_exact(NM_SMOLLM2, 2, nmtest_failed); }
// one chunk: Gemma's 262144-entry head makes each one slow on PoCL
NM_TEST(gemma3_opencl_perplexity_is_exact_math) { perplexity_exact(NM_GEMMA3, 1, nmtest_failed); }

// -ngl 15 on SmolLM2's 30 layers: the first 15 on the CPU, the last 15 and the
// head on the device, the hidden state handed over in the memory both share.
// Greedy text equal to the CPU's; perplexity between the CPU's (8-bit
// activations everywhere) and the exact one (none), 0.2% either side: half
// of the layers round as the CPU does, half compute exactly. The weights and
// activations are read in place (nothing uploaded).
NM_TEST(smollm2_layer_split_equals_cpu) {
    LOAD(m, NM_SMOLLM2);
    NEED_OPENCL(m);
    char dir[64];
    nm_model *ref = exact_twin(path_, dir, sizeof dir);
    {
        nm_ctx_params cp = nm_ctx_default_params();
        cp.n_ctx = 16;
        cp.device = device();
        cp.n_gpu_layers = 15;
        nm_ctx *probe = NULL;
        char e[512];
        nm_status st = nm_ctx_create(m, &cp, &probe, e, sizeof e);
        nm_ctx_free(probe);
        if (st == NM_ERR_UNSUPPORTED && strstr(e, "shared memory")) { // a discrete GPU
            nm_model_free(ref);
            nm_model_free(m);
            NM_SKIP(e);
        }
    }
    nm_ctx *cpu = ctx_on(m, "cpu", -1, 256), *split = ctx_on(m, device(), 15, 256);
    nm_ctx *exact = ref ? ctx_on(ref, "cpu", -1, 256) : NULL;
    NM_CHECK(cpu && split && exact);
    if (!cpu || !split || !exact) {
        nm_ctx_free(cpu);
        nm_ctx_free(split);
        nm_ctx_free(exact);
        nm_model_free(ref);
        nm_model_free(m);
        return;
    }
    NM_CHECK(nm_ctx_device_layers(split) == 15);
    enum { N = 16 };
    int32_t a[N], b[N];
    NM_CHECK(greedy(m, cpu, "The capital of France is", N, a) == N);
    NM_CHECK(greedy(m, split, "The capital of France is", N, b) == N);
    double tie = 0;
    const int part = parting(m, cpu, "The capital of France is", a, b, N, &tie);
    if (part < N) fprintf(stderr, "  -ngl 15: greedy equal for %d of %d tokens, then a margin of %.3f\n", part, N, tie);
    NM_CHECK(part == N || tie <= NM_TIE);
    int32_t n = 0, *toks = declaration(m, &n);
    NM_CHECK(toks && n >= 512);
    if (toks && n >= 512) {
        nm_ctx *all = ctx_on(m, device(), -1, 256);
        const double pc = ppl(m, cpu, toks, 2), ps = ppl(m, split, toks, 2), pe = ppl(ref, exact, toks, 2);
        const double pd = all ? ppl(m, all, toks, 2) : NAN;
        nm_ctx_free(all);
        fprintf(stderr, "  -ngl 15: perplexity cpu %.4f, split %.4f (%+.2f%% of cpu), all on the device %.4f, exact %.4f\n",
                pc, ps, 100 * (ps / pc - 1), pd, pe);
        NM_CHECK(ps >= fmin(pc, pe) * (1 - 2e-3) && ps <= fmax(pc, pe) * (1 + 2e-3));
        NM_CHECK(ps != pd && ps != pc); // the two halves really ran on two units
    }
    uint64_t wrapped = 0, uploaded = 0;
    nm_ctx_device_stats(split, &wrapped, &uploaded);
    fprintf(stderr, "  device reads %.1f MiB in place, %.1f MiB uploaded\n", wrapped / 1048576.0, uploaded / 1048576.0);
    NM_CHECK(uploaded == 0); // a split runs only where the device shares host memory
    NM_CHECK(wrapped > 0);
    free(toks);
    nm_ctx_free(cpu);
    nm_ctx_free(split);
    nm_ctx_free(exact);
    nm_model_free(ref);
    nm_model_free(m);
}

// qwen2vl's M-RoPE has no OpenCL kernel: a context on the device is refused at creation, naming it
// (not a failure at the first decode).
NM_TEST(mrope_refused_on_the_device_by_name) {
    char tok[1024], path[256];
    NM_NEED_MODEL(NM_SMOLLM2, tok);
    snprintf(path, sizeof path, "/tmp/nm-opencl-qwen2vl-%d.gguf", (int)getpid());
    gen_opts o = nm_genmodel_defaults();
    o.arch = "qwen2vl", o.tok_from = tok, o.out = path, o.type = NM_TYPE_F32;
    o.layers = 1, o.embd = 128, o.heads = 4, o.kv_heads = 2, o.ff = 256;
    NM_CHECK(nm_genmodel_write(&o) == 0);
    nm_model *m = load(path);
    unlink(path);
    if (!m) return;
    nm_ctx_params cp = nm_ctx_default_params();
    cp.n_ctx = 16;
    cp.device = device();
    nm_ctx *c = NULL;
    char err[512] = "";
    const nm_status st = nm_ctx_create(m, &cp, &c, err, sizeof err);
    nm_ctx_free(c);
    nm_model_free(m);
    if (st == NM_ERR_UNSUPPORTED && strstr(err, "no OpenCL")) NM_SKIP(err);
    NM_CHECK(st == NM_ERR_UNSUPPORTED && strstr(err, "M-RoPE") && strstr(err, "qwen2vl"));
}

// The three architectures on small random-weight f32 models (qwen2's biases,
// gemma3's sliding window of 8 over a 30-token prompt, its per-head norms and
// embedding scale): f32 weights take f32 activations on both units, so the
// logits agree to float rounding, in prefill and decode, through token ids and
// through nm_decode_embd (the caller's rows copied to the device).
NM_TEST(archs_equal_cpu_to_rounding) {
    char tok[1024];
    NM_NEED_MODEL(NM_SMOLLM2, tok);
    static const char *archs[] = {"llama", "qwen2", "gemma3"};
    for (int a = 0; a < 3; a++) {
        char path[256];
        snprintf(path, sizeof path, "/tmp/nm-opencl-%s-%d.gguf", archs[a], (int)getpid());
        gen_opts o = nm_genmodel_defaults();
        o.arch = archs[a];
        o.tok_from = tok;
        o.out = path;
        o.type = NM_TYPE_F32;
        o.layers = 3;
        o.embd = 128;
        o.heads = 4;
        o.kv_heads = 2;
        o.ff = 256;
        o.swa = 8;
        o.seed = 11;
        NM_CHECK(nm_genmodel_write(&o) == 0);
        nm_model *m = load(path);
        nm_gguf *g = NULL;
        NM_CHECK(nm_gguf_open(path, &g, NULL, 0) == NM_OK);
        unlink(path); // the mappings stay readable
        NM_CHECK(m != NULL);
        if (!m || !g) {
            nm_gguf_close(g);
            nm_model_free(m);
            continue;
        }
        const nm_gguf_tensor *te = nm_gguf_find_tensor(g, "token_embd.weight");
        if (a == 0) NEED_OPENCL(m);
        nm_ctx *cpu = ctx_on(m, "cpu", -1, 64), *dev = ctx_on(m, device(), -1, 64);
        NM_CHECK(cpu && dev);
        const int32_t nv = nm_model_n_vocab(m), d = nm_model_n_embd(m);
        int32_t toks[31];
        for (int i = 0; i < 31; i++) toks[i] = (i * 7919 + 13) % nv;
        double maxd = 0, maxl = 0;
        if (cpu && dev) {
            // prefill of 30, then one more token; every logit compared
            NM_CHECK(nm_decode(cpu, toks, 30, 0, true) == NM_OK && nm_decode(dev, toks, 30, 0, true) == NM_OK);
            for (int i = 0; i < 30; i++)
                for (int32_t v = 0; v < nv; v++) {
                    maxd = nm_maxdiff(maxd, nm_get_logits(cpu, i)[v], nm_get_logits(dev, i)[v]);
                    maxl = fmax(maxl, fabs((double)nm_get_logits(cpu, i)[v]));
                }
            NM_CHECK(nm_decode(cpu, toks + 30, 1, 30, false) == NM_OK && nm_decode(dev, toks + 30, 1, 30, false) == NM_OK);
            for (int32_t v = 0; v < nv; v++)
                maxd = nm_maxdiff(maxd, nm_get_logits(cpu, -1)[v], nm_get_logits(dev, -1)[v]);
            // the embeddings entry point: rows the caller holds (gemma3's scale applied by the caller)
            float *e = malloc(sizeof(float) * (size_t)d * 4);
            const float sc = !strcmp(archs[a], "gemma3") ? sqrtf((float)d) : 1.0f;
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < d; j++) e[(size_t)i * d + j] = ((const float *)te->data)[(size_t)toks[i] * d + j] * sc;
            NM_CHECK(nm_decode_embd(cpu, e, 4, 0, false) == NM_OK && nm_decode_embd(dev, e, 4, 0, false) == NM_OK);
            for (int32_t v = 0; v < nv; v++)
                maxd = nm_maxdiff(maxd, nm_get_logits(cpu, -1)[v], nm_get_logits(dev, -1)[v]);
            free(e);
        }
        fprintf(stderr, "  %s f32: cpu vs %s: max |logit diff| %.2e (logits up to %.1f)\n", archs[a], device(), maxd, maxl);
        NM_CHECK(maxd < 2e-3);
        nm_ctx_free(cpu);
        nm_ctx_free(dev);
        nm_gguf_close(g);
        nm_model_free(m);
    }
}

// q4_0 weights laid out again by prepare_weight (a device with its own
// memory does it; NM_OPENCL_REPACK=1 makes PoCL do it too): the decode matvec
// on the repacked copy gives the plain kernel's logits to float rounding
// (the two sum in other orders), and the copy is counted as uploaded. With
// NM_OPENCL_Q8MV=1 (the default where dp4a is native) the repacked matvec
// takes 8-bit activations: logits within 3% of the largest, as the CPU's
// q8_0 activations give. Those come by default from the op before the
// matvecs (the x8 path: the norm rounds its output once, Q/K/V and gate/up
// with the GLU each one launch; ff = 544 is a multiple of 32, so the GLU is
// fused), and with NM_OPENCL_X8=0 from each matvec's work-groups: the same
// rounding, so the two agree to float rounding (the GLU's h may round one
// step apart: 1e-3 of the largest logit). The O and down projections take
// the residual add and the next norm into their launch (mvq_res_q4_0: the
// norm's x8 rounded before its factor, which the next matvecs apply); with
// NM_OPENCL_X8_RES=0 the add and the norm have a launch of their own: the
// same to 3e-3 of the largest logit, not bit for bit (the rounding differs).
// Q/K/V's launch also turns Q and K and stores K and V in the cache
// (mode 0 ropes, one token); with NM_OPENCL_X8_ROPE=0 the ropes and the store
// have a launch of their own: the same operations, the same logits bit for bit.
// Another geometry of the x8 matvecs (NM_OPENCL_MVQ/MVS/MVG: rows a work-group,
// blocks a step) sums in another order at most: within 3e-3 of the largest.
NM_TEST(q4_0_repacked_equals_plain) {
    char tok[1024], path[256];
    NM_NEED_MODEL(NM_SMOLLM2, tok);
    snprintf(path, sizeof path, "/tmp/nm-opencl-q4_0-%d.gguf", (int)getpid());
    gen_opts o = nm_genmodel_defaults();
    o.arch = "llama";
    o.tok_from = tok;
    o.out = path;
    o.type = NM_TYPE_Q4_0;
    o.layers = 2;
    o.embd = 256;
    o.heads = 4;
    o.kv_heads = 2;
    o.ff = 544; // 17 blocks: a last step of the staged activations with idle items
    o.seed = 7;
    NM_CHECK(nm_genmodel_write(&o) == 0);
    nm_model *m = load(path);
    unlink(path);
    NM_CHECK(m != NULL);
    if (!m) return;
    NEED_OPENCL(m);
    const char *old = getenv("NM_OPENCL_REPACK");
    char saved[16] = "";
    if (old) snprintf(saved, sizeof saved, "%s", old);
    setenv("NM_OPENCL_REPACK", "0", 1);
    nm_ctx *plain = ctx_on(m, device(), -1, 64);
    setenv("NM_OPENCL_REPACK", "1", 1);
    setenv("NM_OPENCL_Q8MV", "0", 1);
    nm_ctx *rep = ctx_on(m, device(), -1, 64);
    setenv("NM_OPENCL_Q8MV", "1", 1);
    nm_ctx *rep8 = ctx_on(m, device(), -1, 64);
    setenv("NM_OPENCL_X8_RES", "0", 1);
    nm_ctx *unfused = ctx_on(m, device(), -1, 64);
    unsetenv("NM_OPENCL_X8_RES");
    setenv("NM_OPENCL_X8_ROPE", "0", 1);
    nm_ctx *ropes = ctx_on(m, device(), -1, 64);
    unsetenv("NM_OPENCL_X8_ROPE");
    setenv("NM_OPENCL_X8", "0", 1);
    nm_ctx *staged = ctx_on(m, device(), -1, 64);
    unsetenv("NM_OPENCL_X8");
    setenv("NM_OPENCL_MVQ", "4,32,4", 1); // another geometry of the x8 matvecs (a tuning setting)
    setenv("NM_OPENCL_MVS", "2,4,128", 1);
    setenv("NM_OPENCL_MVG", "4", 1);
    nm_ctx *geom = ctx_on(m, device(), -1, 64);
    unsetenv("NM_OPENCL_MVQ"), unsetenv("NM_OPENCL_MVS"), unsetenv("NM_OPENCL_MVG");
    unsetenv("NM_OPENCL_Q8MV");
    if (old) setenv("NM_OPENCL_REPACK", saved, 1);
    else unsetenv("NM_OPENCL_REPACK");
    NM_CHECK(plain && rep && rep8 && staged && unfused && ropes && geom);
    if (plain && rep && rep8 && staged && unfused && ropes && geom) {
        uint64_t w0, up0, w1, up1;
        nm_ctx_device_stats(plain, &w0, &up0);
        nm_ctx_device_stats(rep, &w1, &up1);
        fprintf(stderr, "  uploaded: plain %.1f MiB, repacked %.1f MiB\n", up0 / 1048576.0, up1 / 1048576.0);
        NM_CHECK(up1 > up0); // the repacked copies
        const int32_t nv = nm_model_n_vocab(m);
        double maxd = 0, maxd8 = 0, maxdx = 0, maxdr = 0, maxdo = 0, maxdg = 0, maxl = 0;
        int64_t nonfinite = 0;
        for (int32_t i = 0; i < 8; i++) { // decode: one token at a time (the matvec)
            const int32_t t = (i * 7919 + 13) % nv;
            NM_CHECK(nm_decode(plain, &t, 1, i, false) == NM_OK && nm_decode(rep, &t, 1, i, false) == NM_OK &&
                     nm_decode(rep8, &t, 1, i, false) == NM_OK && nm_decode(staged, &t, 1, i, false) == NM_OK &&
                     nm_decode(unfused, &t, 1, i, false) == NM_OK && nm_decode(ropes, &t, 1, i, false) == NM_OK &&
                     nm_decode(geom, &t, 1, i, false) == NM_OK);
            for (int32_t v = 0; v < nv; v++) {
                const double a = nm_get_logits(plain, -1)[v], b = nm_get_logits(rep, -1)[v];
                const double c = nm_get_logits(rep8, -1)[v], e = nm_get_logits(staged, -1)[v];
                const double u = nm_get_logits(unfused, -1)[v];
                if (!isfinite(a) || !isfinite(b) || !isfinite(c) || !isfinite(e) || !isfinite(u))
                    nonfinite++; // fmax would pass over a NaN
                maxd = nm_maxdiff(maxd, a, b);
                maxd8 = nm_maxdiff(maxd8, a, c);
                maxdx = nm_maxdiff(maxdx, e, u);
                maxdr = nm_maxdiff(maxdr, u, c);
                maxdo = nm_maxdiff(maxdo, nm_get_logits(ropes, -1)[v], c);
                maxdg = nm_maxdiff(maxdg, nm_get_logits(geom, -1)[v], c);
                maxl = fmax(maxl, fabs(a));
            }
        }
        NM_CHECK(nonfinite == 0);
        fprintf(stderr, "  q4_0 plain vs repacked: max |logit diff| %.2e, with 8-bit activations %.2e (logits up to %.1f); "
                "x8 path vs rounding in each matvec %.2e; add and norm in the matvec vs a launch of their own %.2e; "
                "ropes and KV store in the Q/K/V launch vs their own %.2e; another geometry %.2e\n",
                maxd, maxd8, maxl, maxdx, maxdr, maxdo, maxdg);
        NM_CHECK(maxd < 1e-4 * (maxl > 1 ? maxl : 1));
        NM_CHECK(maxd8 > maxd && maxd8 < 3e-2 * (maxl > 1 ? maxl : 1)); // it did round x, and not wildly
        NM_CHECK(maxdx < 1e-3 * (maxl > 1 ? maxl : 1));
        // it ran (another rounding), and agrees: a value's 8-bit rounding one step
        // apart here and there (PoCL 1.9e-5, the H200 1.4e-3 of the largest logit)
        NM_CHECK(maxdr > 0.0 && maxdr < 3e-3 * (maxl > 1 ? maxl : 1));
        NM_CHECK(maxdo == 0.0);
        NM_CHECK(maxdg < 3e-3 * (maxl > 1 ? maxl : 1)); // the sums in another order at most (as maxdr's)
        // That the x8 path ran shows where its sums go in another order than the
        // staged kernel's: PoCL (no warps: the GLU kernel adds its 32 partial
        // sums in a row). NVIDIA's warp sums pair them as the staged tree does,
        // bit for bit at these sizes, so there the figures say it (benchmarks.md).
        if (!on_nvidia()) NM_CHECK(maxdx > 0.0);
    }
    nm_ctx_free(plain);
    nm_ctx_free(rep);
    nm_ctx_free(rep8);
    nm_ctx_free(staged);
    nm_ctx_free(unfused);
    nm_ctx_free(ropes);
    nm_ctx_free(geom);
    nm_model_free(m);
}

// Writes gp to a temporary file and loads it on the CPU and on the device:
// 1 both loaded; 0 the device has no OpenCL (err says why, nothing held);
// -1 a load failed (checked and reported, nothing held).
static int load_clip_pair(int *nmtest_failed, const nm_genmmproj_params *gp, const char *tag, nm_clip **cpu,
                          nm_clip **dev, char *err, size_t err_size) {
    char path[256];
    snprintf(path, sizeof path, "/tmp/nm-opencl-%s-%d.gguf", tag, (int)getpid());
    *cpu = *dev = NULL;
    NM_CHECK(nm_genmmproj_write(path, gp, err, err_size) == NM_OK);
    NM_CHECK(nm_clip_load(path, "cpu", 2, cpu, err, err_size) == NM_OK);
    const nm_status st = nm_clip_load(path, device(), 2, dev, err, err_size);
    unlink(path);
    if (st == NM_ERR_UNSUPPORTED && strstr(err, "no OpenCL")) {
        nm_clip_free(*cpu);
        *cpu = NULL;
        return 0;
    }
    NM_CHECK(st == NM_OK);
    if (st != NM_OK) fprintf(stderr, "  %s\n", err);
    if (!*cpu || !*dev) {
        nm_clip_free(*cpu);
        nm_clip_free(*dev);
        *cpu = *dev = NULL;
        return -1;
    }
    NM_CHECK(!strcmp(nm_clip_device(*dev), "opencl"));
    return 1;
}

// The vision encoder on the device: random-weight mmproj files of both
// projectors (LLaVA's CLIP: class token, pre-LN, quick GELU, mlp; SmolVLM's
// SigLIP: patch bias, post-LN, GELU, pixel shuffle), f32 and q8_0 weights,
// against the CPU. f32: float rounding (the two sum in other orders); q8_0:
// the CPU's 8-bit activations against the device's f32 ones.
NM_TEST(vision_encoder_equals_cpu) {
    static const char *projs[] = {"mlp", "idefics3"};
    for (int k = 0; k < 4; k++) {
        nm_genmmproj_params gp = nm_genmmproj_default_params(projs[k % 2]);
        gp.wtype = k < 2 ? NM_TYPE_F32 : NM_TYPE_Q8_0;
        gp.seed = 5 + (uint64_t)k;
        char tag[32], err[512];
        snprintf(tag, sizeof tag, "mmproj-%d", k);
        nm_clip *cpu, *dev;
        const int got = load_clip_pair(nmtest_failed, &gp, tag, &cpu, &dev, err, sizeof err);
        if (got == 0) NM_SKIP(err);
        if (got < 0) continue;
        const nm_clip_info *in = nm_clip_get_info(cpu);
        const size_t n_pix = 3 * (size_t)in->image_size * in->image_size, n_out = (size_t)in->n_out * in->n_out_embd;
        float *pix = malloc(sizeof(float) * n_pix), *a = malloc(sizeof(float) * n_out), *b = malloc(sizeof(float) * n_out);
        uint64_t r = 0x9e3779b97f4a7c15ull + (uint64_t)k;
        for (size_t i = 0; i < n_pix; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            pix[i] = (float)((double)(r >> 11) / 9007199254740992.0 * 4.0 - 2.0);
        }
        NM_CHECK(nm_clip_encode(cpu, pix, a) == NM_OK && nm_clip_encode(dev, pix, b) == NM_OK);
        double maxd = 0, maxa = 0;
        for (size_t i = 0; i < n_out; i++) maxd = nm_maxdiff(maxd, a[i], b[i]), maxa = fmax(maxa, fabs((double)a[i]));
        fprintf(stderr, "  %s %s: cpu vs %s: max |diff| %.2e of max |value| %.2f (%d x %d)\n", projs[k % 2],
                k < 2 ? "f32" : "q8_0", device(), maxd, maxa, in->n_out, in->n_out_embd);
        NM_CHECK(maxd <= (k < 2 ? 1e-4 : 2e-2) * maxa);
        free(pix), free(a), free(b);
        nm_clip_free(cpu);
        nm_clip_free(dev);
    }
}

// Qwen2-VL's encoder on the device (the 2-D vision rope, patches in 2 x 2
// groups of a non-square image, the merger): a random qwen2vl_merger file,
// f32 and q8_0, at three sizes (one square, two not: each a new op list in the
// same arena), against the CPU, as above.
NM_TEST(qwen2vl_encoder_equals_cpu) {
    static const int32_t sizes[3][2] = {{56, 56}, {84, 112}, {140, 56}};
    for (int k = 0; k < 2; k++) {
        nm_genmmproj_params gp = nm_genmmproj_default_params("qwen2vl_merger");
        gp.n_out_embd = 256, gp.n_embd = 128, gp.n_ff = 256, gp.n_head = 2, gp.n_layer = 2, gp.image_size = 56;
        gp.wtype = k == 0 ? NM_TYPE_F32 : NM_TYPE_Q8_0;
        gp.seed = 21 + (uint64_t)k;
        char tag[32], err[512];
        snprintf(tag, sizeof tag, "qwen-%d", k);
        nm_clip *cpu, *dev;
        const int got = load_clip_pair(nmtest_failed, &gp, tag, &cpu, &dev, err, sizeof err);
        if (got == 0) NM_SKIP(err);
        if (got < 0) continue;
        const int32_t ow = nm_clip_get_info(cpu)->n_out_embd;
        for (int z = 0; z < 3; z++) {
            const int32_t W = sizes[z][0], H = sizes[z][1], rows = nm_clip_n_out(cpu, W, H);
            const size_t n_pix = 3 * (size_t)W * H, n_out = (size_t)rows * ow;
            float *pix = malloc(sizeof(float) * n_pix), *a = malloc(sizeof(float) * n_out), *b = malloc(sizeof(float) * n_out);
            uint64_t r = 0x9e3779b97f4a7c15ull + (uint64_t)(k * 3 + z);
            for (size_t i = 0; i < n_pix; i++) {
                r = r * 6364136223846793005ull + 1442695040888963407ull;
                pix[i] = (float)((double)(r >> 11) / 9007199254740992.0 * 4.0 - 2.0);
            }
            NM_CHECK(rows > 0 && nm_clip_n_out(dev, W, H) == rows);
            NM_CHECK(nm_clip_encode_size(cpu, pix, W, H, a) == NM_OK && nm_clip_encode_size(dev, pix, W, H, b) == NM_OK);
            double maxd = 0, maxa = 0;
            for (size_t i = 0; i < n_out; i++) maxd = nm_maxdiff(maxd, a[i], b[i]), maxa = fmax(maxa, fabs((double)a[i]));
            fprintf(stderr, "  qwen2vl_merger %s %dx%d: cpu vs %s: max |diff| %.2e of max |value| %.2f (%d x %d)\n",
                    k == 0 ? "f32" : "q8_0", W, H, device(), maxd, maxa, rows, ow);
            NM_CHECK(maxd <= (k == 0 ? 1e-4 : 2e-2) * maxa);
            free(pix), free(a), free(b);
        }
        nm_clip_free(cpu);
        nm_clip_free(dev);
    }
}

// The backend runs an add and the RMS norm of its sum in one launch: an add
// followed by the norm of another tensor must not be fused (each op as it
// gives alone), the norm of the sum after that as usual. Host memory, imported.
NM_TEST(fused_neighbours_only_when_they_pair) {
    nm_backend_params bp = {.n_threads = 1, .max_row = 256, .max_tokens = 4};
    nm_backend *be = NULL;
    char err[512];
    const nm_status cst = nm_backend_create(device(), &bp, &be, err, sizeof err);
    if (cst == NM_ERR_UNSUPPORTED && strstr(err, "no OpenCL")) NM_SKIP(err);
    NM_CHECK(cst == NM_OK && be != NULL);
    if (!be) return;
    enum { D = 256, R = 3, N = D * R };
    float *mem = aligned_alloc(4096, 8 * 4096 * 4); // a, b, s, other, y, w, -, y2 (4096 floats each)
    memset(mem, 0, 8 * 4096 * 4);
    float *a = mem, *b = mem + 4096, *s = mem + 2 * 4096, *other = mem + 3 * 4096, *y = mem + 4 * 4096;
    float *w = mem + 5 * 4096, *y2 = mem + 7 * 4096;
    for (int i = 0; i < N; i++) a[i] = sinf(0.1f * i), b[i] = cosf(0.07f * i), other[i] = 0.5f + 0.01f * (i % 97);
    for (int i = 0; i < D; i++) w[i] = 1.0f + 0.001f * i;
    NM_CHECK(nm_backend_import_host(be, mem, 8 * 4096 * 4, true) == NM_OK);
#define HT(p, n0, n1) ((nm_tensor){.type = NM_TYPE_F32, .ne = {(n0), (n1), 1, 1}, .offs = (size_t)(uintptr_t)(p)})
    nm_tensor tA = HT(a, D, R), tB = HT(b, D, R), tS = HT(s, D, R), tO = HT(other, D, R), tY = HT(y, D, R);
    nm_tensor tW = HT(w, D, 1), tY2 = HT(y2, D, R);
    // an add, then the norm of another tensor (must not take the sum), then of the sum
    nm_op ops[3] = {{.kind = NM_OP_ADD, .src0 = &tA, .src1 = &tB, .dst = &tS},
                    {.kind = NM_OP_RMS_NORM, .src0 = &tO, .src1 = &tW, .dst = &tY, .f0 = 1e-5f},
                    {.kind = NM_OP_RMS_NORM, .src0 = &tS, .src1 = &tW, .dst = &tY2, .f0 = 1e-5f}};
    NM_CHECK(nm_backend_run(be, ops, 3) == NM_OK);
    double e_other = 0, e_sum = 0;
    int s_exact = 1;
    for (int r = 0; r < R; r++) {
        double so = 0, ss = 0;
        for (int i = 0; i < D; i++) so += (double)other[r * D + i] * other[r * D + i];
        for (int i = 0; i < D; i++) ss += ((double)a[r * D + i] + b[r * D + i]) * ((double)a[r * D + i] + b[r * D + i]);
        const double sco = 1.0 / sqrt(so / D + 1e-5), scs = 1.0 / sqrt(ss / D + 1e-5);
        for (int i = 0; i < D; i++) {
            s_exact &= s[r * D + i] == a[r * D + i] + b[r * D + i];
            e_other = fmax(e_other, fabs(y[r * D + i] - other[r * D + i] * sco * w[i]));
            e_sum = fmax(e_sum, fabs(y2[r * D + i] - ((double)a[r * D + i] + b[r * D + i]) * scs * w[i]));
        }
    }
    fprintf(stderr, "  add, norm of another tensor, norm of the sum: max errors %.2e, %.2e\n", e_other, e_sum);
    NM_CHECK(s_exact);
    NM_CHECK(e_other < 1e-5 && e_sum < 1e-5);
#undef HT
    nm_backend_free(be);
    free(mem);
}

// Q's and K's ropes with no KV store after them go in one launch (rope_pairs,
// op_rope with two tensors): each turned as the CPU backend turns it, at
// three positions, both halves of the rotation (n_rot < head_dim), the Llama
// and the NEOX layouts. Host memory, imported.
NM_TEST(rope_pair_without_kv_store) {
    nm_backend_params bp = {.n_threads = 1, .max_row = 256, .max_tokens = 4};
    nm_backend *be = NULL, *cpu = NULL;
    char err[512];
    const nm_status cst = nm_backend_create(device(), &bp, &be, err, sizeof err);
    if (cst == NM_ERR_UNSUPPORTED && strstr(err, "no OpenCL")) NM_SKIP(err);
    NM_CHECK(cst == NM_OK && be != NULL && nm_backend_create("cpu", &bp, &cpu, err, sizeof err) == NM_OK);
    if (!be || !cpu) {
        nm_backend_free(be);
        return;
    }
    enum { HD = 64, NQ = 4, NK = 2, T = 3 };
    for (int mode = 0; mode <= 2; mode += 2) { // 0: Llama's pairs, 2: NEOX's halves
        float *mem = aligned_alloc(4096, 2 * 4096 * 4); // q, k, positions (device); then the CPU's copies
        memset(mem, 0, 2 * 4096 * 4);
        float *q = mem, *k = mem + NQ * HD * T, *qc = mem + 4096, *kc = qc + NQ * HD * T;
        int32_t *pos = (int32_t *)(k + NK * HD * T);
        for (int i = 0; i < NQ * HD * T; i++) q[i] = qc[i] = sinf(0.37f * i);
        for (int i = 0; i < NK * HD * T; i++) k[i] = kc[i] = cosf(0.23f * i);
        for (int t = 0; t < T; t++) pos[t] = 5 + 11 * t;
        NM_CHECK(nm_backend_import_host(be, mem, 2 * 4096 * 4, true) == NM_OK);
#define HT(p, n0, n1, ty) ((nm_tensor){.type = (ty), .ne = {(n0), (n1), 1, 1}, .offs = (size_t)(uintptr_t)(p)})
        nm_tensor tq = HT(q, NQ * HD, T, NM_TYPE_F32), tk = HT(k, NK * HD, T, NM_TYPE_F32);
        nm_tensor tqc = HT(qc, NQ * HD, T, NM_TYPE_F32), tkc = HT(kc, NK * HD, T, NM_TYPE_F32);
        nm_tensor tp = HT(pos, T, 1, NM_TYPE_I32);
#undef HT
        const nm_op rq = {.kind = NM_OP_ROPE, .src0 = &tq, .dst = &tq, .ids = &tp, .f0 = 10000.0f, .f1 = 1.0f,
                          .i0 = NQ, .i1 = HD, .i2 = mode, .i3 = HD / 2};
        nm_op ops[2] = {rq, rq}, ops_c[2] = {rq, rq};
        ops[1].src0 = ops[1].dst = &tk, ops[1].i0 = NK;
        ops_c[0].src0 = ops_c[0].dst = &tqc;
        ops_c[1].src0 = ops_c[1].dst = &tkc, ops_c[1].i0 = NK;
        NM_CHECK(nm_backend_run(be, ops, 2) == NM_OK && nm_backend_run(cpu, ops_c, 2) == NM_OK);
        double eq = 0, ek = 0;
        for (int i = 0; i < NQ * HD * T; i++) eq = fmax(eq, fabs((double)q[i] - qc[i]));
        for (int i = 0; i < NK * HD * T; i++) ek = fmax(ek, fabs((double)k[i] - kc[i]));
        fprintf(stderr, "  rope mode %d, Q and K in one launch: max |diff| from the CPU %.2e (Q), %.2e (K)\n", mode,
                eq, ek);
        NM_CHECK(eq < 1e-5 && ek < 1e-5);
        free(mem);
    }
    nm_backend_free(cpu);
    nm_backend_free(be);
}

// Q's and K's ropes, then the KV store with cache ids of its own tensor (as
// several sequences give: s n_ctx + position), which rope_kv_joins keeps apart
// (it wants the ropes' ids): the pair's launch, then kv_store's, writing K and
// V of 3 tokens into rows 13, 3 and 8 of a 16-row cache. Both caches as the
// CPU backend leaves them, the Llama and the NEOX layouts: V bit for bit (both
// round to nearest even), K to an f16 step (its rope's float rounding), rows
// not written untouched. Host memory, imported. No model's graph launches
// kv_store alone (its ropes and store go in one launch; several sequences are
// the CPU's): only this case runs it.
NM_TEST(ropes_then_kv_store_apart) {
    nm_backend_params bp = {.n_threads = 1, .max_row = 256, .max_tokens = 4};
    nm_backend *be = NULL, *cpu = NULL;
    char err[512];
    const nm_status cst = nm_backend_create(device(), &bp, &be, err, sizeof err);
    if (cst == NM_ERR_UNSUPPORTED && strstr(err, "no OpenCL")) NM_SKIP(err);
    NM_CHECK(cst == NM_OK && be != NULL && nm_backend_create("cpu", &bp, &cpu, err, sizeof err) == NM_OK);
    if (!be || !cpu) {
        nm_backend_free(be);
        return;
    }
    enum { HD = 64, NQ = 4, NK = 2, T = 3, W = NK * HD, ROWS = 16, F = 4096 }; // F: floats a unit's block
    for (int mode = 0; mode <= 2; mode += 2) { // 0: Llama's pairs, 2: NEOX's halves
        // a block for each unit: q, k, v, positions, cache ids, then the K and V caches (f16)
        float *mem = aligned_alloc(4096, 2 * F * 4);
        memset(mem, 0, 2 * F * 4);
        float *q[2], *k[2], *v[2];
        int32_t *pos[2], *ids[2];
        uint16_t *kc[2], *vc[2];
        for (int u = 0; u < 2; u++) { // 0: the device's, 1: the CPU's
            q[u] = mem + u * F, k[u] = q[u] + NQ * HD * T, v[u] = k[u] + W * T;
            pos[u] = (int32_t *)(v[u] + W * T), ids[u] = pos[u] + T;
            kc[u] = (uint16_t *)(ids[u] + T), vc[u] = kc[u] + W * ROWS;
            for (int i = 0; i < NQ * HD * T; i++) q[u][i] = sinf(0.37f * i);
            for (int i = 0; i < W * T; i++) k[u][i] = cosf(0.23f * i), v[u][i] = sinf(0.11f * i + 1.0f);
            for (int i = 0; i < W * ROWS; i++) kc[u][i] = vc[u][i] = 0x7bff; // 65504: rows not written keep it
            const int32_t p[T] = {5, 3, 0}, r[T] = {8 + 5, 3, 8 + 0}; // sequences 1, 0, 1 of 8 positions
            memcpy(pos[u], p, sizeof p), memcpy(ids[u], r, sizeof r);
        }
        NM_CHECK(nm_backend_import_host(be, mem, F * 4, true) == NM_OK);
#define HT(p, n0, n1, ty) ((nm_tensor){.type = (ty), .ne = {(n0), (n1), 1, 1}, .offs = (size_t)(uintptr_t)(p)})
        nm_tensor tq[2], tk[2], tv[2], tp[2], ti[2];
        nm_kv_layer kv[2];
        nm_op ops[2][3];
        for (int u = 0; u < 2; u++) {
            tq[u] = HT(q[u], NQ * HD, T, NM_TYPE_F32), tk[u] = HT(k[u], W, T, NM_TYPE_F32);
            tv[u] = HT(v[u], W, T, NM_TYPE_F32), tp[u] = HT(pos[u], T, 1, NM_TYPE_I32);
            ti[u] = HT(ids[u], T, 1, NM_TYPE_I32);
            kv[u] = (nm_kv_layer){.k = HT(kc[u], W, ROWS, NM_TYPE_F16), .v = HT(vc[u], W, ROWS, NM_TYPE_F16)};
            const nm_op rq = {.kind = NM_OP_ROPE, .src0 = &tq[u], .dst = &tq[u], .ids = &tp[u], .f0 = 10000.0f,
                              .f1 = 1.0f, .i0 = NQ, .i1 = HD, .i2 = mode, .i3 = HD};
            ops[u][0] = ops[u][1] = rq;
            ops[u][1].src0 = ops[u][1].dst = &tk[u], ops[u][1].i0 = NK;
            ops[u][2] = (nm_op){.kind = NM_OP_KV_STORE, .src0 = &tk[u], .src1 = &tv[u], .ids = &ti[u], .kv = &kv[u],
                                .n_ctx = 8};
        }
#undef HT
        NM_CHECK(nm_backend_run(be, ops[0], 3) == NM_OK && nm_backend_run(cpu, ops[1], 3) == NM_OK);
        double ek = 0;
        int v_same = !memcmp(vc[0], vc[1], sizeof(uint16_t) * W * ROWS), kept = 1;
        for (int i = 0; i < W * ROWS; i++) ek = nm_maxdiff(ek, nm_fp16_to_fp32(kc[0][i]), nm_fp16_to_fp32(kc[1][i]));
        for (int r = 0; r < ROWS; r++)
            if (r != 13 && r != 3 && r != 8)
                for (int i = 0; i < W; i++) kept &= kc[0][r * W + i] == 0x7bff && vc[0][r * W + i] == 0x7bff;
        fprintf(stderr, "  rope mode %d, then the KV store apart: max |diff| from the CPU %.2e (K cache); V cache %s\n",
                mode, ek, v_same ? "the same bits" : "differs");
        NM_CHECK(ek <= 1e-3); // an f16 step near 1: 9.8e-4
        NM_CHECK(v_same);
        NM_CHECK(kept);
        free(mem);
    }
    nm_backend_free(cpu);
    nm_backend_free(be);
}

NM_TEST_MAIN()
