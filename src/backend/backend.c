// Backends by device name, and the devices there are.
#define _POSIX_C_SOURCE 200809L // clock_gettime, sysconf
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/registry.h"
#include "backend/cpu/gemm.h"
#include "core/clock.h"
#include "core/cpu.h"
#include "core/threadpool.h"
#include "quant/quant.h"

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


// ---- the host's read bandwidth: a STREAM-style sum over all threads -------------------------

typedef struct probe {
    const double *buf;
    int64_t n;       // doubles
    double sums[64]; // per chunk, so the reads cannot be optimised away
} probe;

#define PROBE_CHUNKS 64

static void probe_fn(void *arg, int64_t chunk, int ith) {
    probe *p = arg;
    int64_t b, e;
    nm_split_range(p->n, (int)chunk, PROBE_CHUNKS, &b, &e);
    // four independent sums: the loop is bound by loads, not by the add latency
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int64_t i = b;
    for (; i + 4 <= e; i += 4) {
        s0 += p->buf[i];
        s1 += p->buf[i + 1];
        s2 += p->buf[i + 2];
        s3 += p->buf[i + 3];
    }
    for (; i < e; i++) s0 += p->buf[i];
    p->sums[chunk] = s0 + s1 + s2 + s3;
}

double nm_cpu_read_gbps(int32_t n_threads) {
    const int64_t n = (512ll << 20) / (int64_t)sizeof(double);
    double *buf = malloc((size_t)n * sizeof(double));
    nm_pool *pool = nm_pool_create(n_threads > 0 ? n_threads : nm_cpu_count());
    if (!buf || !pool) {
        free(buf);
        nm_pool_free(pool);
        return 0.0;
    }
    for (int64_t i = 0; i < n; i++) buf[i] = (double)(i & 1023);
    probe p = {.buf = buf, .n = n};
    double best = 0.0;
    for (int rep = 0; rep < 5; rep++) {
        const double t0 = nm_now_s();
        nm_pool_run(pool, probe_fn, &p, PROBE_CHUNKS);
        const double dt = nm_now_s() - t0, gbps = (double)n * sizeof(double) / dt / 1e9;
        if (dt > 0 && gbps > best) best = gbps;
    }
    volatile double check = 0;
    for (int c = 0; c < PROBE_CHUNKS; c++) check += p.sums[c]; // keeps the sums observable
    (void)check;
    nm_pool_free(pool);
    free(buf);
    return best;
}

const char *nm_system_info(char *buf, size_t size) {
    char cpu[128], feats[256];
    nm_cpu_model_name(cpu, sizeof cpu);
    nm_cpu_features_str(feats, sizeof feats);
    snprintf(buf, size, "%s | %s | quant %s, f32 gemm %s", cpu, feats, nm_kernels_get()->name,
             nm_gemm_panel_get() ? "avx512-panel" : nm_gemm_f32_get() == nm_gemm_f32_ref ? "ref" : "avx2");
    return buf;
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
    if (measure) out[0].read_gbps = nm_cpu_read_gbps(0);
    snprintf(out[0].type, sizeof out[0].type, "cpu");
    const int32_t n_cl = nm_opencl_devices(out + 1, n - 1);
    for (int32_t i = 1; measure && i < n && i <= n_cl; i++) out[i].read_gbps = nm_opencl_read_gbps(i - 1);
    return 1 + n_cl;
}
