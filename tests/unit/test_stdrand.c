// whisper.cpp's random numbers (src/bricks/stt/stdrand.c) against libstdc++'s
// own: std::mt19937, generate_canonical<double, 53> and discrete_distribution
// over a 51,864-entry table, draw for draw. The expected values are
// tests/data/stdrand/draws.txt, written by tools/stdrand_expect.cpp (its
// header has the command) over the tables of stdrand_tables.h.
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bricks/stt/stdrand.h"
#include "nmtest.h"
#include "stdrand_tables.h"

#define N_VOCAB 51864

// Every line of the file whose first word is kind, as a callback on the rest.
static int each_line(const char *kind, void (*fn)(char *rest, int *nmtest_failed), int *nmtest_failed) {
    FILE *f = fopen("tests/data/stdrand/draws.txt", "r");
    if (!f) return -1;
    static char line[1 << 16];
    int n = 0;
    const size_t kl = strlen(kind);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, kind, kl) && line[kl] == ' ') fn(line + kl + 1, nmtest_failed), n++;
    fclose(f);
    return n;
}

static void check_raw(char *rest, int *nmtest_failed) {
    char *e;
    nm_mt19937 m;
    nm_mt19937_seed(&m, (uint32_t)strtoul(rest, &e, 10));
    for (int i = 0; i < 8; i++) NM_CHECK(nm_mt19937_next(&m) == (uint32_t)strtoul(e, &e, 10));
}

static void check_raw10000(char *rest, int *nmtest_failed) {
    char *e;
    nm_mt19937 m;
    nm_mt19937_seed(&m, (uint32_t)strtoul(rest, &e, 10));
    for (int i = 0; i < 9999; i++) nm_mt19937_next(&m);
    NM_CHECK(nm_mt19937_next(&m) == (uint32_t)strtoul(e, &e, 10));
}

static void check_canon(char *rest, int *nmtest_failed) {
    char *e;
    nm_mt19937 m;
    nm_mt19937_seed(&m, (uint32_t)strtoul(rest, &e, 10));
    for (int i = 0; i < 8; i++) {
        double v = nm_mt19937_canonical(&m);
        uint64_t b;
        memcpy(&b, &v, 8);
        NM_CHECK(b == (uint64_t)strtoull(e, &e, 16));
    }
}

static long n_draws;

static void check_draw(char *rest, int *nmtest_failed) {
    char *e;
    const int t = (int)strtol(rest, &e, 10);
    const uint32_t seed = (uint32_t)strtoul(e, &e, 10);
    float *w = malloc(sizeof(float) * N_VOCAB);
    double *cp = malloc(sizeof(double) * N_VOCAB);
    NM_CHECK(w && cp);
    if (w && cp) {
        stdrand_table(t, N_VOCAB, w);
        nm_discrete_build(w, N_VOCAB, cp);
        nm_mt19937 m;
        nm_mt19937_seed(&m, seed);
        int bad = 0;
        for (int i = 0; i < 200; i++) {
            const int32_t want = (int32_t)strtol(e, &e, 10), got = nm_discrete_draw(cp, N_VOCAB, &m);
            if (got != want && bad++ < 3) fprintf(stderr, "  table %d seed %u draw %d: %d, libstdc++ %d\n", t, seed, i, got, want);
            n_draws++;
        }
        NM_CHECK(bad == 0);
    }
    free(w);
    free(cp);
}

NM_TEST(mt19937_outputs_equal_libstdcxx) {
    NM_CHECK(each_line("raw", check_raw, nmtest_failed) == 6);
    NM_CHECK(each_line("raw10000", check_raw10000, nmtest_failed) == 1);
}

NM_TEST(generate_canonical_equals_libstdcxx) { NM_CHECK(each_line("canon", check_canon, nmtest_failed) == 3); }

NM_TEST(discrete_distribution_equals_libstdcxx) {
    n_draws = 0;
    NM_CHECK(each_line("draw", check_draw, nmtest_failed) == 20);
    fprintf(stderr, "  %ld draws compared\n", n_draws);
}

NM_TEST_MAIN()
