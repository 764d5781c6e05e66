// The library's one clock: CLOCK_MONOTONIC, for timings, deadlines and stats.
#ifndef NM_CORE_CLOCK_H
#define NM_CORE_CLOCK_H

#include <stdint.h>

uint64_t nm_now_ns(void); // nanoseconds since an arbitrary start (boot), monotonic
double nm_now_s(void);    // the same in seconds

#endif
