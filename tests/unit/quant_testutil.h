// Helpers shared by the quant tests: a seeded random stream, Gaussian data,
// double-precision reference sums and the list of every weight type.
// Define QT_SEED before including to pick a file's own stream.
#ifndef NM_QUANT_TESTUTIL_H
#define NM_QUANT_TESTUTIL_H

#include <math.h>
#include <stdint.h>

#include "quant/quant.h"

#ifndef QT_SEED
#define QT_SEED 0x9e3779b97f4a7c15ull
#endif

static uint64_t rng_state = QT_SEED;
static double urand(void) { // xorshift64*, in (0, 1)
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return ((double)((rng_state * 2685821657736338717ull) >> 11) + 0.5) / 9007199254740992.0;
}
static float grand(void) { // standard normal (Box-Muller)
    return (float)(sqrt(-2.0 * log(urand())) * cos(6.283185307179586 * urand()));
}
static inline void fill_gauss(float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) x[i] = grand() * scale;
}
static inline double dot_d(const float *a, const float *b, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}
static inline double abs_dot(const float *a, const float *b, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += fabs((double)a[i] * b[i]);
    return s;
}

static const uint32_t weight_types[] = {NM_TYPE_F32,  NM_TYPE_F16,  NM_TYPE_BF16, NM_TYPE_Q4_0, NM_TYPE_Q4_1,
                                        NM_TYPE_Q5_0, NM_TYPE_Q5_1, NM_TYPE_Q8_0, NM_TYPE_Q8_1, NM_TYPE_MXFP4,
                                        NM_TYPE_Q2_K, NM_TYPE_Q3_K, NM_TYPE_Q4_K, NM_TYPE_Q5_K, NM_TYPE_Q6_K,
                                        NM_TYPE_Q8_K};
#define N_WTYPES (sizeof weight_types / sizeof weight_types[0])

#endif
