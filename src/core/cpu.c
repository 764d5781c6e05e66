#include "core/cpu.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
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
        // AMX-TILE and AMX-BF16 (EDX bits 24, 22), the OS saving XTILECFG and XTILEDATA (XCR0 bits 17, 18)
        if (zmm && ((d >> 24) & 1) && ((d >> 22) & 1)) {
            unsigned lo, hi;
            __asm__ __volatile__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
            feats.amx_bf16 = (lo & 0x60000) == 0x60000;
        }
    }
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) feats.avx_vnni = (a >> 4) & 1, feats.avx512bf16 = zmm && ((a >> 5) & 1);
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

// Linux grants a process the tile data only on request (a first tile instruction without it is SIGILL),
// and a process granted it needs larger signal stacks: asked once, by the first kernel that would use the
// tiles, not when the features are read.
static bool amx_granted;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;
static void amx_request(void) {
#if defined(__linux__) && defined(__x86_64__)
    amx_granted = nm_cpu_features_get()->amx_bf16 && syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18) == 0;
#endif
}

bool nm_cpu_amx_granted(void) {
    pthread_once(&amx_once, amx_request);
    return amx_granted;
}

static char *trimmed(char *buf) {
    size_t a = 0, n = strlen(buf);
    while (buf[a] == ' ' || buf[a] == '\t') a++;
    while (n > a && (buf[n - 1] == ' ' || buf[n - 1] == '\n' || buf[n - 1] == '\t')) n--;
    memmove(buf, buf + a, n - a);
    buf[n - a] = '\0';
    return buf;
}

char *nm_cpu_model_name(char *buf, size_t size) {
    if (!buf || size == 0) return buf;
    buf[0] = '\0';
#if defined(__x86_64__) || defined(__i386__)
    unsigned r[12];
    if (__get_cpuid(0x80000000u, &r[0], &r[1], &r[2], &r[3]) && r[0] >= 0x80000004u) {
        for (unsigned i = 0; i < 3; i++) __get_cpuid(0x80000002u + i, &r[4 * i], &r[4 * i + 1], &r[4 * i + 2], &r[4 * i + 3]);
        char brand[49];
        memcpy(brand, r, 48);
        brand[48] = '\0';
        snprintf(buf, size, "%s", brand);
        trimmed(buf);
    }
#endif
    if (!buf[0]) {
        FILE *f = fopen("/proc/cpuinfo", "r");
        char line[512];
        while (f && fgets(line, sizeof line, f)) {
            char *colon = strchr(line, ':');
            if (!colon || (strncmp(line, "model name", 10) && strncmp(line, "Hardware", 8))) continue;
            snprintf(buf, size, "%s", colon + 1);
            trimmed(buf);
            break;
        }
        if (f) fclose(f);
    }
    if (!buf[0]) snprintf(buf, size, "unknown");
    return buf;
}

char *nm_cpu_features_str(char *buf, size_t size) {
    if (!buf || size == 0) return buf;
    const nm_cpu_features *c = nm_cpu_features_get();
    const struct { bool on; const char *name; } f[] = {
        {c->avx2, "avx2"}, {c->fma, "fma"}, {c->f16c, "f16c"}, {c->avx_vnni, "avx_vnni"}, {c->avx512f, "avx512f"},
        {c->avx512bw, "avx512bw"}, {c->avx512dq, "avx512dq"}, {c->avx512vl, "avx512vl"},
        {c->avx512vnni, "avx512vnni"}, {c->avx512vbmi, "avx512vbmi"}, {c->avx512bitalg, "avx512bitalg"},
        {c->gfni, "gfni"}, {c->avx512bf16, "avx512bf16"}, {c->amx_bf16, "amx_bf16"}, {c->neon, "neon"}, {c->dotprod, "dotprod"},
    };
    size_t n = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].on && n + strlen(f[i].name) + 2 < size) n += (size_t)snprintf(buf + n, size - n, "%s%s", n ? " " : "", f[i].name);
    return buf;
}
