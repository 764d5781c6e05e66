// Locating the default models for golden tests. They are fetched by
// `make test` (scripts/fetch_models.sh); a missing model fails the test unless
// NM_ALLOW_MISSING_MODELS=1 (then it is skipped), so CI cannot pass silently.
#ifndef NM_GOLDEN_MODELS_H
#define NM_GOLDEN_MODELS_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define NM_SMOLLM2 "SmolLM2-135M-Instruct.Q4_1.gguf"
#define NM_GEMMA3 "gemma-3-270m-q4_k_m.gguf"

// Fills buf with the model's path; returns 0 if present, 1 to skip, -1 to fail.
static int golden_model(const char *name, char *buf, size_t size) {
    const char *dir = getenv("NM_MODEL_DIR");
    const char *home = getenv("HOME");
    if (dir) snprintf(buf, size, "%s/%s", dir, name);
    else snprintf(buf, size, "%s/.cache/nanomind/models/%s", home ? home : ".", name);
    if (access(buf, R_OK) == 0) return 0;
    const char *allow = getenv("NM_ALLOW_MISSING_MODELS");
    fprintf(stderr, "  model %s not found (run scripts/fetch_models.sh)\n", buf);
    return allow && *allow == '1' ? 1 : -1;
}

#define NM_NEED_MODEL(name, buf)                               \
    do {                                                       \
        int r_ = golden_model(name, buf, sizeof buf);          \
        if (r_ > 0) NM_SKIP("model absent");                   \
        NM_CHECK(r_ == 0);                                     \
        if (r_ < 0) return;                                    \
    } while (0)

#endif
