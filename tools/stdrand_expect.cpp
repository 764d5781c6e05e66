// Writes libstdc++'s draws that src/bricks/stt/stdrand.c must reproduce
// (tests/unit/test_stdrand.c reads them):
//   g++ -O2 -std=c++17 -Itests/unit tools/stdrand_expect.cpp -o /tmp/stdrand_expect
//   /tmp/stdrand_expect > tests/data/stdrand/draws.txt
// Lines: "raw SEED v1 ... v8" (the first 8 outputs of std::mt19937(SEED)),
// "raw10000 5489 V" (the 10,000th output, 4123659995 by the standard),
// "canon SEED bits..." (generate_canonical<double, 53>, as hex of the bits),
// "draw TABLE SEED d1 ... dN" (std::discrete_distribution<int> over the float
// weights of table TABLE of tests/unit/stdrand_tables.h).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "stdrand_tables.h"

// Table t (tests/unit/stdrand_tables.h, the test's own).
static std::vector<float> weights(int t, int n) {
    std::vector<float> w(n);
    stdrand_table(t, n, w.data());
    return w;
}

int main() {
    for (uint32_t seed = 0; seed < 6; seed++) {
        std::mt19937 g(seed);
        printf("raw %u", seed);
        for (int i = 0; i < 8; i++) printf(" %u", (unsigned)g());
        printf("\n");
    }
    std::mt19937 d;
    d.discard(9999);
    printf("raw10000 5489 %u\n", (unsigned)d());
    for (uint32_t seed = 0; seed < 3; seed++) {
        std::mt19937 g(seed);
        printf("canon %u", seed);
        for (int i = 0; i < 8; i++) {
            double v = std::generate_canonical<double, 53>(g);
            uint64_t b;
            memcpy(&b, &v, 8);
            printf(" %016llx", (unsigned long long)b);
        }
        printf("\n");
    }
    const int n = 51864; // whisper's multilingual vocabulary
    for (int t = 0; t < 4; t++) {
        std::vector<float> w = weights(t, n);
        for (uint32_t seed = 0; seed < 5; seed++) {
            std::mt19937 g(seed);
            std::discrete_distribution<int> dist(w.begin(), w.end());
            printf("draw %d %u", t, seed);
            for (int i = 0; i < 200; i++) printf(" %d", dist(g));
            printf("\n");
        }
    }
    return 0;
}
