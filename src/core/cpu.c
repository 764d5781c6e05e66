#include "core/cpu.h"

#include <pthread.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#elif defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#endif

static nm_cpu_features feats;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void detect(void) {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    const bool osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
    feats.fma = (c >> 12) & 1;
    feats.f16c = (c >> 29) & 1;
    bool ymm = false, zmm = false;
    if (osxsave && avx) {
        unsigned lo, hi;
        __asm__ __volatile__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        ymm = (lo & 0x6) == 0x6;   // XMM and YMM state saved by the OS
        zmm = (lo & 0xe6) == 0xe6; // and the AVX-512 state
    }
    if (!ymm) {
        feats.fma = feats.f16c = false;
        return;
    }
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        feats.avx2 = (b >> 5) & 1;
        feats.avx512f = zmm && ((b >> 16) & 1);
        feats.avx512bw = zmm && ((b >> 30) & 1);
        feats.avx512vl = zmm && ((b >> 31) & 1);
        feats.avx512vbmi = zmm && ((c >> 1) & 1);
        feats.avx512vnni = zmm && ((c >> 11) & 1);
        feats.avx512dq = zmm && ((b >> 17) & 1);
        feats.avx512bitalg = zmm && ((c >> 12) & 1);
        feats.gfni = (c >> 8) & 1;
    }
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) feats.avx_vnni = (a >> 4) & 1;
#elif defined(__aarch64__)
    feats.neon = true;
#if defined(__linux__)
    feats.dotprod = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#endif
#endif
}

const nm_cpu_features *nm_cpu_features_get(void) {
    pthread_once(&once, detect);
    return &feats;
}
