// whisper.cpp's random numbers, reproduced draw for draw: std::mt19937 and
// libstdc++'s std::discrete_distribution<int> (built from float weights,
// drawn with generate_canonical<double, 53>). whisper.cpp's beam search
// samples its candidates even at temperature 0, so the same text needs the
// same draws. tests/unit/test_stdrand.c checks them against libstdc++'s
// (tools/stdrand_expect.cpp wrote tests/data/stdrand/draws.txt).
#ifndef NM_STT_STDRAND_H
#define NM_STT_STDRAND_H

#include <stdint.h>

typedef struct nm_mt19937 {
    uint32_t s[624];
    int i;
} nm_mt19937;

void nm_mt19937_seed(nm_mt19937 *m, uint32_t seed);
uint32_t nm_mt19937_next(nm_mt19937 *m);
// generate_canonical<double, 53>: [0, 1) from two 32-bit draws, low word first.
double nm_mt19937_canonical(nm_mt19937 *m);
// The distribution's table: cp[i] = the cumulative normalised weights, cp[n - 1] = 1.
void nm_discrete_build(const float *w, int32_t n, double *cp);
// One draw: the first i with cp[i] >= a canonical draw.
int32_t nm_discrete_draw(const double *cp, int32_t n, nm_mt19937 *m);

#endif
