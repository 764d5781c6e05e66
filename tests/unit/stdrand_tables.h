// The weight tables of the stdrand check, shared by tests/unit/test_stdrand.c
// (C) and tools/stdrand_expect.cpp (C++, which writes libstdc++'s draws over
// them), so both build the same floats. Table t of n weights from a 32-bit
// LCG, every value exactly representable: a peaked softmax-like table (most
// weights tiny, a few large), one with zeros, a uniform one, a one-hot one.
#ifndef NM_TESTS_STDRAND_TABLES_H
#define NM_TESTS_STDRAND_TABLES_H

#include <stdint.h>

static inline void stdrand_table(int t, int n, float *w) {
    uint32_t x = 12345u + 7919u * (uint32_t)t;
    for (int i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        const uint32_t r = x >> 8;
        switch (t) {
        case 0: w[i] = (float)(r & 0xff) * (float)(r & 0xff) * (float)(r & 0xff) / 16777216.0f; break;
        case 1: w[i] = (r & 7) == 0 ? (float)(r >> 3 & 0xffff) : 0.0f; break;
        case 2: w[i] = 1.0f; break;
        default: w[i] = i == n / 3 ? 1.0f : 0.0f; break;
        }
    }
}

#endif
