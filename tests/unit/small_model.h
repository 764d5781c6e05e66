// A small random-weight llama with SmolLM2's tokenizer (copied from the real
// file in the model cache), for tests of the plumbing around the decoder.
#ifndef NM_TEST_SMALL_MODEL_H
#define NM_TEST_SMALL_MODEL_H

#include "nmtest.h"
#include "genmodel.h"
#include "nanomind.h"

// Writes the model (2 layers, n_embd embd, 4 heads / 2 KV heads, ff 128,
// weights from seed) to path and loads it into *out. Returns 1 when loaded, 0
// when SmolLM2 is not in the model cache (*out NULL), -1 when writing or
// loading failed (reported; a failure, never a skip).
static int nmtest_small_model(const char *path, int32_t embd, uint32_t seed, nm_model **out) {
    char tok[1024], err[256] = "";
    *out = NULL;
    if (!nmtest_model_path("SmolLM2-135M-Instruct.Q4_1.gguf", tok, sizeof tok)) return 0;
    gen_opts o = nm_genmodel_defaults();
    o.arch = "llama";
    o.tok_from = tok;
    o.out = path;
    o.layers = 2;
    o.embd = embd;
    o.heads = 4;
    o.kv_heads = 2;
    o.ff = 128;
    o.seed = seed;
    if (nm_genmodel_write(&o) != 0) {
        fprintf(stderr, "  cannot write the small model %s from %s\n", path, tok);
        return -1;
    }
    if (nm_model_load(path, NULL, out, err, sizeof err) != NM_OK) {
        fprintf(stderr, "  cannot load the small model %s: %s\n", path, err);
        *out = NULL;
        return -1;
    }
    return 1;
}

// Ends the case when the small model is not there: a missing SmolLM2 is a
// skip (a failure under NM_CI=1), a model that failed to build is a failure.
#define NM_NEED_SMALL_MODEL(r)                                                       \
    do {                                                                             \
        if ((r) == 0) NM_SKIP_MISSING("SmolLM2 (the tokenizer source) is not in the model cache"); \
        NM_CHECK((r) > 0);                                                           \
        if ((r) < 0) return;                                                         \
    } while (0)

#endif
