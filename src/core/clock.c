// The library's one clock (core/clock.h).
#include "core/clock.h"

#include <time.h>

uint64_t nm_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double nm_now_s(void) { return (double)nm_now_ns() * 1e-9; }
