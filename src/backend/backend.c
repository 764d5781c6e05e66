// Backends by device name, and the devices there are.
#define _POSIX_C_SOURCE 200809L // clock_gettime, sysconf
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/registry.h"

nm_status nm_backend_create(const char *device, const nm_backend_params *p, nm_backend **out, char *err,
                            size_t err_size) {
    if (!out || !p) return NM_ERR_INVALID_ARG;
    *out = NULL;
    if (!device || !*device || strcmp(device, "cpu") == 0) return nm_backend_cpu_new(p, out, err, err_size);
    if (strcmp(device, "opencl:auto") == 0) {
        // the first OpenCL GPU or accelerator: an OpenCL device on the CPU (PoCL) competes with the CPU
        // backend for the same cores (NM_OPENCL_AUTO_CPU=1 takes it too, for tests)
        nm_device_info d[16];
        const int32_t n = nm_opencl_devices(d, 16);
        const bool cpu_ok = getenv("NM_OPENCL_AUTO_CPU") && atoi(getenv("NM_OPENCL_AUTO_CPU")) == 1;
        for (int32_t i = 0; i < n && i < 16; i++)
            if (cpu_ok || strcmp(d[i].type, "cpu") != 0) return nm_backend_opencl_new(i, p, out, err, err_size);
        if (n == 0) return nm_backend_opencl_new(0, p, out, err, err_size); // its message: no device
        snprintf(err, err_size, "opencl: no OpenCL GPU or accelerator (%s is a CPU device: the CPU backend is "
                 "faster there)", d[0].desc);
        return NM_ERR_UNSUPPORTED;
    }
    if (strncmp(device, "opencl", 6) == 0 && (device[6] == '\0' || device[6] == ':')) {
        int index = 0;
        if (device[6] == ':') {
            char *end;
            long v = strtol(device + 7, &end, 10);
            if (end == device + 7 || *end || v < 0 || v > 64) {
                snprintf(err, err_size, "device '%s': expected opencl or opencl:N", device);
                return NM_ERR_INVALID_ARG;
            }
            index = (int)v;
        }
        return nm_backend_opencl_new(index, p, out, err, err_size);
    }
    snprintf(err, err_size, "unknown device '%s' (cpu, opencl, opencl:N)", device);
    return NM_ERR_INVALID_ARG;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// Read bandwidth of the host: the best of 5 sums over 256 MiB (beyond any cache).
static double cpu_read_gbps(void) {
    const size_t n = (size_t)64 << 20; // floats
    float *a = malloc(n * sizeof *a);
    if (!a) return 0.0;
    for (size_t i = 0; i < n; i++) a[i] = (float)(i & 7);
    double best = 0.0;
    volatile float sink = 0.0f;
    for (int r = 0; r < 5; r++) {
        const double t0 = now_s();
        float s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
        for (size_t i = 0; i < n; i += 8)
            s0 += a[i], s1 += a[i + 1], s2 += a[i + 2], s3 += a[i + 3], s4 += a[i + 4], s5 += a[i + 5],
                s6 += a[i + 6], s7 += a[i + 7];
        sink = s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7;
        const double dt = now_s() - t0;
        if (dt > 0 && n * sizeof *a / dt / 1e9 > best) best = n * sizeof *a / dt / 1e9;
    }
    (void)sink;
    free(a);
    return best;
}

static void cpu_name(char *buf, size_t n) {
    snprintf(buf, n, "CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
            const char *v = strchr(line, ':') + 1;
            while (*v == ' ') v++;
            snprintf(buf, n, "%.*s", (int)strcspn(v, "\n"), v);
            break;
        }
    fclose(f);
}

int32_t nm_list_devices(nm_device_info *out, int32_t n, bool measure) {
    if (!out || n <= 0) return 1 + nm_opencl_devices(NULL, 0);
    memset(&out[0], 0, sizeof out[0]);
    snprintf(out[0].name, sizeof out[0].name, "cpu");
    cpu_name(out[0].desc, sizeof out[0].desc);
    snprintf(out[0].driver, sizeof out[0].driver, "%ld online cores", sysconf(_SC_NPROCESSORS_ONLN));
    out[0].mem_bytes = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
    out[0].unified = true;
    if (measure) out[0].read_gbps = cpu_read_gbps();
    snprintf(out[0].type, sizeof out[0].type, "cpu");
    const int32_t n_cl = nm_opencl_devices(out + 1, n - 1);
    for (int32_t i = 1; measure && i < n && i <= n_cl; i++) out[i].read_gbps = nm_opencl_read_gbps(i - 1);
    return 1 + n_cl;
}
