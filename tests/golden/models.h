// Locating the default models for golden tests. They are fetched by
// `make test` (scripts/fetch_models.sh), which runs the suite with NM_CI=1: a
// missing model is then a failure; on a bare checkout it is a counted skip.
#ifndef NM_GOLDEN_MODELS_H
#define NM_GOLDEN_MODELS_H

#include "../unit/nmtest.h"

#define NM_SMOLLM2 "SmolLM2-135M-Instruct.Q4_1.gguf"
#define NM_GEMMA3 "gemma-3-270m-q4_k_m.gguf"

// Fills buf with the model's path; returns 0 if present, 1 if not.
static int golden_model(const char *name, char *buf, size_t size) {
    return nmtest_model_path(name, buf, size) ? 0 : 1;
}

#define NM_NEED_MODEL(name, buf)                                            \
    do {                                                                    \
        if (golden_model(name, buf, sizeof buf) != 0) {                     \
            fprintf(stderr, "  %s: not found\n", buf);                      \
            NM_SKIP_MISSING("a default model is not in the model cache (scripts/fetch_models.sh)"); \
        }                                                                   \
    } while (0)

#endif
