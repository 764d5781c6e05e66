// Writes libstdc++'s draws that src/bricks/stt/stdrand.c must reproduce
// (tests/unit/test_stdrand.c reads them):
//   g++ -O2 -std=c++17 tools/stdrand_expect.cpp -o /tmp/stdrand_expect
//   /tmp/stdrand_expect > tests/data/stdrand/draws.txt
// Lines: "raw SEED v1 ... v8" (the first 8 outputs of std::mt19937(SEED)),
// "raw10000 5489 V" (the 10,000th output, 4123659995 by the standard),
// "canon SEED bits..." (generate_canonical<double, 53>, as hex of the bits),
// "draw TABLE SEED d1 ... dN" (std::discrete_distribution<int> over the float
// weights of table TABLE, built as weights() in the test does).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

// Table t of n weights from a 32-bit LCG; every value exactly representable
// so that C and C++ build the same floats: a peaked softmax-like table (most
// weights tiny, a few large), one with zeros, a uniform one, a one-hot one.
static std::vector<float> weights(int t, int n) {
    std::vector<float> w(n);
    uint32_t x = 12345u + 7919u * (uint32_t)t;
    for (int i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        uint32_t r = x >> 8;
        switch (t) {
        case 0: w[i] = (float)(r & 0xff) * (float)(r & 0xff) * (float)(r & 0xff) / 16777216.0f; break;
        case 1: w[i] = (r & 7) == 0 ? (float)(r >> 3 & 0xffff) : 0.0f; break;
        case 2: w[i] = 1.0f; break;
        default: w[i] = i == n / 3 ? 1.0f : 0.0f; break;
        }
    }
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
