// GEMM GFLOP/s at a model's own matmul shapes against the planner profile's
// one (64 tokens of a 1024 x 2048 weight): is the profile's speed the speed a
// prompt's matmuls run at? (docs/benchmarks.md, "The planner's estimates").
// The CPU backend, best of 7 after a warm-up, the weights' values irrelevant.
//   build/gemm_shapes [THREADS] [TOKENS]   (default 2 threads; 226 tokens: SmolLM2's
//                                           test prompt of docs/benchmarks.md)
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "backend/backend.h"
#include "quant/quant.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

// GFLOP/s of a T-token matmul of an O x K weight of type t (0: it failed).
static double gemm(nm_backend *be, uint32_t t, int64_t O, int64_t K, int64_t T) {
    const size_t rb = nm_row_size(t, K);
    float *wf = malloc(sizeof(float) * (size_t)K), *x = malloc(sizeof(float) * (size_t)(K * T));
    float *y = malloc(sizeof(float) * (size_t)(O * T));
    uint8_t *wq = aligned_alloc(64, (rb * (size_t)O + 63) / 64 * 64);
    double best = 0;
    if (wf && x && y && wq) {
        for (int64_t i = 0; i < K * T; i++) x[i] = (float)((i * 104729) % 1000) / 1000.0f - 0.5f;
        for (int64_t o = 0; o < O; o++) {
            for (int64_t k = 0; k < K; k++) wf[k] = (float)(((o * K + k) * 7919) % 1000) / 1000.0f - 0.5f;
            nm_quantize_row_ref(t, wf, wq + (size_t)o * rb, K);
        }
        nm_tensor W = {.type = t, .ne = {K, O, 1, 1}, .offs = (size_t)(uintptr_t)wq};
        nm_tensor X = {.type = NM_TYPE_F32, .ne = {K, T, 1, 1}, .offs = (size_t)(uintptr_t)x};
        nm_tensor Y = {.type = NM_TYPE_F32, .ne = {O, T, 1, 1}, .offs = (size_t)(uintptr_t)y};
        nm_op op = {.kind = NM_OP_MATMUL, .src0 = &W, .src1 = &X, .dst = &Y};
        if (nm_backend_run(be, &op, 1) == NM_OK)
            for (int r = 0; r < 7; r++) {
                const double t0 = now_s();
                if (nm_backend_run(be, &op, 1) != NM_OK) break;
                const double g = 2.0 * (double)(O * K * T) / (now_s() - t0) / 1e9;
                best = g > best ? g : best;
            }
    }
    free(wf), free(x), free(y), free(wq);
    return best;
}

int main(int argc, char **argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 2;
    const int64_t T = argc > 2 ? atoll(argv[2]) : 226;
    if (threads < 1 || T < 1 || T > 4096) {
        fprintf(stderr, "usage: %s [THREADS] [TOKENS 1..4096]\n", argv[0]);
        return 2;
    }
    nm_backend_params bp = {.n_threads = threads, .max_row = 8192, .max_tokens = 4096};
    nm_backend *be = NULL;
    char err[256];
    if (nm_backend_create("cpu", &bp, &be, err, sizeof err) != NM_OK) {
        fprintf(stderr, "error: %s\n", err);
        return 1;
    }
    // the profile's, then SmolLM2-135M's (Q, O: 576 x 576; K, V: 192 x 576; gate, up: 1536 x 576; down:
    // 576 x 1536), then a wide and a narrow one
    static const struct { const char *what; int64_t O, K, T; } s[] = {
        {"profile", 1024, 2048, 64}, {"profile at T", 1024, 2048, 0}, {"SmolLM2 Q, O", 576, 576, 0},
        {"SmolLM2 K, V", 192, 576, 0}, {"SmolLM2 gate, up", 1536, 576, 0}, {"SmolLM2 down", 576, 1536, 0},
        {"4096 x 4096", 4096, 4096, 0}, {"2048 x 512", 2048, 512, 0}};
    static const uint32_t types[] = {NM_TYPE_Q4_0, NM_TYPE_Q4_1, NM_TYPE_Q8_0, NM_TYPE_F16};
    printf("| shape | O x K | tokens | q4_0 | q4_1 | q8_0 | f16 |\n|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) {
        const int64_t t = s[i].T ? s[i].T : T;
        printf("| %s | %lld x %lld | %lld |", s[i].what, (long long)s[i].O, (long long)s[i].K, (long long)t);
        for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) printf(" %.0f |", gemm(be, types[k], s[i].O, s[i].K, t));
        printf("\n");
        fflush(stdout);
    }
    nm_backend_free(be);
    return 0;
}
