// Tiny unit-test runner. In a test file:
//   NM_TEST(name) { NM_CHECK(x == 1); NM_CHECK_NEAR(a, b, 1e-6); }
//   ... and at the end: NM_TEST_MAIN()
// Run: ./test_foo [--filter SUBSTR]. Prints "N passed, N failed".
#ifndef NM_NMTEST_H
#define NM_NMTEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*nmtest_fn)(int *failed);
struct nmtest_case { const char *name; nmtest_fn fn; };

#define NMTEST_MAX 512
static struct nmtest_case nmtest_cases[NMTEST_MAX];
static int nmtest_n;

#define NM_TEST(name)                                                       \
    static void nmtest_##name(int *nmtest_failed);                          \
    __attribute__((constructor)) static void nmtest_reg_##name(void) {      \
        if (nmtest_n < NMTEST_MAX)                                          \
            nmtest_cases[nmtest_n++] = (struct nmtest_case){#name, nmtest_##name}; \
    }                                                                       \
    static void nmtest_##name(int *nmtest_failed)

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

// Skip the rest of a test (counted as passed) with a reason.
#define NM_SKIP(why)                                                        \
    do {                                                                    \
        fprintf(stderr, "  skipped: %s\n", why);                            \
        return;                                                             \
    } while (0)

static int nmtest_main(int argc, char **argv) {
    const char *filter = NULL;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--filter") && i + 1 < argc) filter = argv[++i];
    int passed = 0, failed = 0;
    for (int i = 0; i < nmtest_n; i++) {
        if (filter && !strstr(nmtest_cases[i].name, filter)) continue;
        int f = 0;
        nmtest_cases[i].fn(&f);
        printf("%s %s\n", f ? "FAIL" : "ok  ", nmtest_cases[i].name);
        fflush(stdout);
        if (f) failed++; else passed++;
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

#define NM_TEST_MAIN() \
    int main(int argc, char **argv) { return nmtest_main(argc, argv); }

#endif
