// Every supported architecture on small random-weight models (written with our
// GGUF writer, tokenizer copied from SmolLM2): KV cache consistency, the
// embeddings entry point, and clear errors for bad models and bad calls.
#include <string.h>
#include <unistd.h>

#include "../unit/nmtest.h"
#include "genmodel.h"
#include "models.h"
#include "nanomind.h"
#include "gguf/gguf.h"
#include "quant/quant.h"

static const char *archs[] = {"llama", "qwen2", "gemma3"};

static bool make_model(const char *arch, uint32_t type, const char *out, int swa) {
    char tok[1024];
    if (golden_model(NM_SMOLLM2, tok, sizeof tok) != 0) return false;
    gen_opts o = nm_genmodel_defaults();
    o.arch = arch;
    o.tok_from = tok;
    o.out = out;
    o.type = type;
    o.layers = 3;
    o.embd = 128;
    o.heads = 4;
    o.kv_heads = 2;
    o.ff = 256;
    o.swa = swa;
    o.seed = 7;
    return nm_genmodel_write(&o) == 0;
}

NM_TEST(random_models_batch_equals_incremental) {
    char tok[1024];
    NM_NEED_MODEL(NM_SMOLLM2, tok);
    for (int a = 0; a < 3; a++) {
        char path[256];
        snprintf(path, sizeof path, "/tmp/nm-test-%s-%d.gguf", archs[a], (int)getpid());
        // window 8 < prompt length: the gemma3 local layers really slide
        NM_CHECK(make_model(archs[a], NM_TYPE_Q8_0, path, 8));
        nm_model *m = NULL;
        char err[256];
        nm_status st = nm_model_load(path, NULL, &m, err, sizeof err);
        NM_CHECK(st == NM_OK);
        if (st != NM_OK) {
            fprintf(stderr, "  %s: %s\n", archs[a], err);
            unlink(path);
            continue;
        }
        NM_CHECK(!strcmp(nm_model_arch(m), archs[a]));
        nm_ctx_params cp = nm_ctx_default_params();
        cp.n_ctx = 64;
        nm_ctx *b = NULL, *inc = NULL;
        NM_CHECK(nm_ctx_create(m, &cp, &b, NULL, 0) == NM_OK && nm_ctx_create(m, &cp, &inc, NULL, 0) == NM_OK);
        int32_t toks[40];
        for (int i = 0; i < 40; i++) toks[i] = (i * 7919 + 13) % nm_model_n_vocab(m);
        // prefill in two batches, then compare with one token at a time
        NM_CHECK(nm_decode(b, toks, 25, 0, true) == NM_OK);
        double maxd = 0.0;
        float *saved = malloc(sizeof(float) * 25 * (size_t)nm_model_n_vocab(m));
        for (int i = 0; i < 25; i++)
            memcpy(saved + (size_t)i * nm_model_n_vocab(m), nm_get_logits(b, i), sizeof(float) * nm_model_n_vocab(m));
        for (int i = 0; i < 25; i++) {
            NM_CHECK(nm_decode(inc, &toks[i], 1, i, false) == NM_OK);
            const float *la = saved + (size_t)i * nm_model_n_vocab(m), *lb = nm_get_logits(inc, -1);
            for (int v = 0; v < nm_model_n_vocab(m); v++) {
                double d = fabs((double)la[v] - lb[v]);
                if (d > maxd) maxd = d;
            }
        }
        free(saved);
        fprintf(stderr, "  %s: max |logit diff| batch vs incremental: %.2e\n", archs[a], maxd);
        NM_CHECK(maxd < 1e-3);
        // bad calls are statuses, not crashes
        int32_t bad_tok = nm_model_n_vocab(m);
        NM_CHECK(nm_decode(inc, &bad_tok, 1, 25, false) == NM_ERR_RANGE);
        NM_CHECK(strstr(nm_ctx_last_error(inc), "out of range") != NULL);
        NM_CHECK(nm_decode(inc, toks, 1, 64, false) == NM_ERR_RANGE);
        NM_CHECK(nm_decode(inc, toks, 0, 0, false) == NM_ERR_RANGE);
        nm_ctx_free(b);
        nm_ctx_free(inc);
        nm_model_free(m);
        unlink(path);
    }
}

// Feeding the token embeddings through nm_decode_embd gives the same logits as
// feeding the token ids (gemma3 scales token embeddings by sqrt(n_embd), which
// the caller of the embeddings entry point does itself).
NM_TEST(random_models_embeddings_entry_point) {
    char tok[1024];
    NM_NEED_MODEL(NM_SMOLLM2, tok);
    for (int a = 0; a < 3; a++) {
        char path[256];
        snprintf(path, sizeof path, "/tmp/nm-test-embd-%s-%d.gguf", archs[a], (int)getpid());
        NM_CHECK(make_model(archs[a], NM_TYPE_F32, path, 8));
        nm_model *m = NULL;
        NM_CHECK(nm_model_load(path, NULL, &m, NULL, 0) == NM_OK);
        if (!m) continue;
        nm_gguf *g = NULL;
        NM_CHECK(nm_gguf_open(path, &g, NULL, 0) == NM_OK);
        const nm_gguf_tensor *te = nm_gguf_find_tensor(g, "token_embd.weight");
        const int d = nm_model_n_embd(m), nv = nm_model_n_vocab(m);
        int32_t toks[6] = {1, 100, 2000, 30000, 5, 49151};
        float embd[6 * 128];
        const float scale = !strcmp(archs[a], "gemma3") ? sqrtf((float)d) : 1.0f;
        for (int i = 0; i < 6; i++)
            for (int j = 0; j < d; j++) embd[i * d + j] = ((const float *)te->data)[(size_t)toks[i] * d + j] * scale;
        nm_ctx *c1 = NULL, *c2 = NULL;
        NM_CHECK(nm_ctx_create(m, NULL, &c1, NULL, 0) == NM_OK && nm_ctx_create(m, NULL, &c2, NULL, 0) == NM_OK);
        NM_CHECK(nm_decode(c1, toks, 6, 0, false) == NM_OK);
        NM_CHECK(nm_decode_embd(c2, embd, 6, 0, false) == NM_OK);
        double maxd = 0.0;
        for (int v = 0; v < nv; v++) maxd = fmax(maxd, fabs(nm_get_logits(c1, -1)[v] - nm_get_logits(c2, -1)[v]));
        NM_CHECK(maxd < 1e-4);
        NM_CHECK(nm_get_logits(c1, 0) == NULL); // only the last row was kept
        nm_ctx_free(c1);
        nm_ctx_free(c2);
        nm_gguf_close(g);
        nm_model_free(m);
        unlink(path);
    }
}

// A model file with a tensor missing, a wrong shape or an unknown arch is
// refused with a message naming the problem.
NM_TEST(bad_models_are_clear_errors) {
    char tok[1024];
    NM_NEED_MODEL(NM_SMOLLM2, tok);
    char path[256];
    snprintf(path, sizeof path, "/tmp/nm-test-bad-%d.gguf", (int)getpid());
    nm_model *m = NULL;
    char err[256] = "";
    NM_CHECK(nm_model_load("/nonexistent/model.gguf", NULL, &m, err, sizeof err) == NM_ERR_IO && m == NULL);
    NM_CHECK(err[0] != '\0');
    // a truncated real model
    NM_CHECK(make_model("llama", NM_TYPE_Q8_0, path, 8));
    FILE *f = fopen(path, "r+b");
    NM_CHECK(f != NULL);
    if (f) {
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fclose(f);
        NM_CHECK(truncate(path, n - 1000) == 0);
        nm_status st = nm_model_load(path, NULL, &m, err, sizeof err);
        fprintf(stderr, "  truncated: %s\n", err);
        NM_CHECK(st == NM_ERR_FORMAT && m == NULL && strstr(err, "past end") != NULL);
    }
    unlink(path);
}

NM_TEST_MAIN()
