// Tiny unit-test runner. In a test file:
//   NM_TEST(name) { NM_CHECK(x == 1); NM_CHECK_NEAR(a, b, 1e-6); }
//   ... and at the end: NM_TEST_MAIN()
// Run: ./test_foo [--filter SUBSTR] (or NM_TEST_FILTER=SUBSTR in the environment: what a mutant
// runs through ctest). Prints "N passed, N failed, N skipped".
//
// Skips are counted apart, never as passes, and come in two kinds:
//   NM_SKIP(why)          the machine or build cannot run the case (no AVX-512,
//                         built without ALSA): a skip everywhere.
//   NM_SKIP_MISSING(why)  something set-up provides is absent (a model): a skip
//                         on a bare checkout, a failure with NM_CI=1 (.ci/run
//                         sets it after fetching every model).
// A file that exists but fails to load is a failure, never a skip.
// NM_TEST_OPTIN(name, "ENV") is a tool, not a test (corpus writers, benches):
// it runs only when ENV is set to a non-empty value, and is otherwise neither
// run nor counted.
#ifndef NM_NMTEST_H
#define NM_NMTEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef void (*nmtest_fn)(int *failed);
struct nmtest_case { const char *name; nmtest_fn fn; const char *optin_env; };

#define NMTEST_MAX 512
static struct nmtest_case nmtest_cases[NMTEST_MAX];
static int nmtest_n;
// 0: ran to the end; 1: skipped; set by the skip macros of the running case.
static int nmtest_skipped;

#define NMTEST_REGISTER(name, env)                                          \
    static void nmtest_##name(int *nmtest_failed);                          \
    __attribute__((constructor)) static void nmtest_reg_##name(void) {      \
        if (nmtest_n < NMTEST_MAX)                                          \
            nmtest_cases[nmtest_n++] = (struct nmtest_case){#name, nmtest_##name, env}; \
    }                                                                       \
    static void nmtest_##name(int *nmtest_failed)

#define NM_TEST(name) NMTEST_REGISTER(name, NULL)
#define NM_TEST_OPTIN(name, env) NMTEST_REGISTER(name, env)

#define NM_CHECK(cond)                                                      \
    do {                                                                    \
        if (!(cond)) {                                                      \
            fprintf(stderr, "  %s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            *nmtest_failed = 1;                                             \
        }                                                                   \
    } while (0)

#define NM_CHECK_NEAR(a, b, tol)                                            \
    do {                                                                    \
        double nm_a_ = (double)(a), nm_b_ = (double)(b);                    \
        if (!(fabs(nm_a_ - nm_b_) <= (tol))) {                              \
            fprintf(stderr, "  %s:%d: %s = %.9g, %s = %.9g, |diff| %.3g > %.3g\n", __FILE__, \
                    __LINE__, #a, nm_a_, #b, nm_b_, fabs(nm_a_ - nm_b_), (double)(tol)); \
            *nmtest_failed = 1;                                             \
        }                                                                   \
    } while (0)

// The larger of m and |a - b|, INFINITY where a or b is NaN (fmax passes
// over a NaN: a running maximum of differences would hide one).
static inline double nm_maxdiff(double m, double a, double b) {
    if (isnan(a) || isnan(b)) return INFINITY;
    return fmax(m, fabs(a - b));
}

static inline int nmtest_ci(void) {
    const char *ci = getenv("NM_CI");
    return ci && *ci && strcmp(ci, "0") != 0;
}

// Ends the case as skipped: the machine or build cannot run it.
#define NM_SKIP(why)                                                        \
    do {                                                                    \
        fprintf(stderr, "  skip: %s\n", why);                               \
        nmtest_skipped = 1;                                                 \
        return;                                                             \
    } while (0)

// Ends the case as skipped, or failed under NM_CI=1: set-up should have
// provided what is missing.
#define NM_SKIP_MISSING(why)                                                \
    do {                                                                    \
        if (nmtest_ci()) {                                                  \
            fprintf(stderr, "  %s:%d: NM_CI=1 and %s\n", __FILE__, __LINE__, why); \
            *nmtest_failed = 1;                                             \
            return;                                                         \
        }                                                                   \
        fprintf(stderr, "  skip: %s\n", why);                               \
        nmtest_skipped = 1;                                                 \
        return;                                                             \
    } while (0)

// The path of a model in the cache ($NM_MODEL_DIR, else ~/.cache/nanomind/models);
// returns whether a file is there (readable or not: a present file that cannot be
// read must fail, so existence is what decides a skip).
static inline int nmtest_model_path(const char *file, char *buf, size_t size) {
    const char *dir = getenv("NM_MODEL_DIR");
    const char *home = getenv("HOME");
    if (dir && *dir) snprintf(buf, size, "%s/%s", dir, file);
    else snprintf(buf, size, "%s/.cache/nanomind/models/%s", home ? home : ".", file);
    return access(buf, F_OK) == 0;
}

static int nmtest_main(int argc, char **argv) {
    const char *filter = NULL;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--filter") && i + 1 < argc) filter = argv[++i];
    if (!filter && getenv("NM_TEST_FILTER") && *getenv("NM_TEST_FILTER")) filter = getenv("NM_TEST_FILTER");
    int passed = 0, failed = 0, skipped = 0;
    const int times = getenv("NM_TEST_TIMES") && getenv("NM_TEST_TIMES")[0] == '1';
    for (int i = 0; i < nmtest_n; i++) {
        const struct nmtest_case *tc = &nmtest_cases[i];
        if (filter && !strstr(tc->name, filter)) continue;
        if (tc->optin_env) {
            const char *e = getenv(tc->optin_env);
            if (!e || !*e) continue;
        }
        int f = 0;
        nmtest_skipped = 0;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        tc->fn(&f);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        printf("%s %s", f ? "FAIL" : nmtest_skipped ? "skip" : "ok  ", tc->name);
        // NM_TEST_TIMES=1: each case's wall time (to see where a suite's minutes go; never judged)
        if (times) printf(" (%.2f s)", (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
        printf("\n");
        fflush(stdout);
        if (f) failed++;
        else if (nmtest_skipped) skipped++;
        else passed++;
    }
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}

#define NM_TEST_MAIN() \
    int main(int argc, char **argv) { return nmtest_main(argc, argv); }

#endif
