// std::mt19937 and libstdc++'s discrete_distribution (stdrand.h).
#include "bricks/stt/stdrand.h"

#include <math.h>

void nm_mt19937_seed(nm_mt19937 *m, uint32_t seed) {
    m->s[0] = seed;
    for (int i = 1; i < 624; i++) m->s[i] = 1812433253u * (m->s[i - 1] ^ (m->s[i - 1] >> 30)) + (uint32_t)i;
    m->i = 624;
}

uint32_t nm_mt19937_next(nm_mt19937 *m) {
    if (m->i >= 624) {
        for (int k = 0; k < 624; k++) {
            uint32_t y = (m->s[k] & 0x80000000u) | (m->s[(k + 1) % 624] & 0x7fffffffu);
            m->s[k] = m->s[(k + 397) % 624] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
        }
        m->i = 0;
    }
    uint32_t y = m->s[m->i++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

double nm_mt19937_canonical(nm_mt19937 *m) {
    double sum = (double)nm_mt19937_next(m);
    sum += (double)nm_mt19937_next(m) * 4294967296.0;
    double r = sum / 18446744073709551616.0;
    return r >= 1.0 ? nextafter(1.0, 0.0) : r;
}

void nm_discrete_build(const float *w, int32_t n, double *cp) {
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++) sum += (double)w[i];
    double acc = 0.0;
    for (int32_t i = 0; i < n; i++) {
        acc += (double)w[i] / sum;
        cp[i] = acc;
    }
    cp[n - 1] = 1.0;
}

// lower_bound of a uniform draw in the table.
int32_t nm_discrete_draw(const double *cp, int32_t n, nm_mt19937 *m) {
    double p = nm_mt19937_canonical(m);
    int32_t lo = 0, hi = n;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (cp[mid] < p) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}
