// Backends by device name, and the devices there are.
#define _POSIX_C_SOURCE 200809L // clock_gettime, sysconf
#include <pthread.h>
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
#include "core/fail.h"
#include "core/threadpool.h"
#include "quant/quant.h"

// ---- the registry ---------------------------------------------------------------------------

static struct {
    pthread_mutex_t lock;
    const nm_backend_reg *regs[NM_BACKEND_MAX_REGS];
    int32_t n;
} g_reg = {.lock = PTHREAD_MUTEX_INITIALIZER};
static pthread_once_t g_builtins = PTHREAD_ONCE_INIT;

static nm_status add(const nm_backend_reg *r, char *err, size_t err_size);

static void register_builtins(void) {
    char err[256];
    (void)add(&nm_backend_cpu_reg, err, sizeof err);
    (void)add(&nm_backend_opencl_reg, err, sizeof err);
}

nm_status nm_backend_register(const nm_backend_reg *r, char *err, size_t err_size) {
    pthread_once(&g_builtins, register_builtins);
    return add(r, err, err_size);
}

static nm_status add(const nm_backend_reg *r, char *err, size_t err_size) {
    if (!r || !r->name || !*r->name || !r->devices || !r->create)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "backend registry: a backend without a name, devices or create");
    if (r->version != NM_BACKEND_IFACE_VERSION)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "backend registry: '%s' was built for interface version %u, "
                       "this build has %u", r->name, r->version, NM_BACKEND_IFACE_VERSION);
    if (strchr(r->name, ':'))
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "backend registry: a name with ':' ('%s')", r->name);
    pthread_mutex_lock(&g_reg.lock);
    nm_status st = NM_OK;
    for (int32_t i = 0; i < g_reg.n && st == NM_OK; i++)
        if (!strcmp(g_reg.regs[i]->name, r->name))
            st = nm_fail(NM_ERR_INVALID_ARG, err, err_size, "backend registry: '%s' is registered already", r->name);
    if (st == NM_OK && g_reg.n == NM_BACKEND_MAX_REGS)
        st = nm_fail(NM_ERR_RANGE, err, err_size, "backend registry: full (%d backends)", NM_BACKEND_MAX_REGS);
    if (st == NM_OK) g_reg.regs[g_reg.n++] = r;
    pthread_mutex_unlock(&g_reg.lock);
    return st;
}

int32_t nm_backend_regs(const nm_backend_reg *const **out) {
    pthread_once(&g_builtins, register_builtins);
    pthread_mutex_lock(&g_reg.lock);
    const int32_t n = g_reg.n; // (entries are only added: those read stay valid)
    pthread_mutex_unlock(&g_reg.lock);
    if (out) *out = g_reg.regs;
    return n;
}

const nm_backend_reg *nm_backend_reg_find(const char *name, size_t len) {
    const nm_backend_reg *const *regs;
    const int32_t n = nm_backend_regs(&regs);
    for (int32_t i = 0; i < n; i++)
        if (strlen(regs[i]->name) == len && !strncmp(regs[i]->name, name, len)) return regs[i];
    return NULL;
}

bool nm_backend_iface_check(const nm_backend_i *i, char *err, size_t err_size) {
    if (!i) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "a backend without an interface"), false;
    if (i->version != NM_BACKEND_IFACE_VERSION)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "backend '%s': interface version %u, this build has %u",
                       i->name ? i->name : "?", i->version, NM_BACKEND_IFACE_VERSION), false;
    const struct {
        const char *what;
        bool set;
    } need[] = {{"name", i->name}, {"get_caps", i->get_caps}, {"buffer_alloc", i->buffer_alloc},
                {"buffer_free", i->buffer_free}, {"buffer_import_host", i->buffer_import_host},
                {"tensor_set", i->tensor_set}, {"tensor_get", i->tensor_get}, {"supports_op", i->supports_op},
                {"submit", i->submit}, {"event_record", i->event_record}, {"event_wait", i->event_wait},
                {"event_sync", i->event_sync}, {"event_free", i->event_free}, {"synchronize", i->synchronize},
                {"last_error", i->last_error}, {"free", i->free}};
    for (size_t k = 0; k < sizeof need / sizeof need[0]; k++)
        if (!need[k].set)
            return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "backend '%s': no %s (it is not optional)",
                           i->name ? i->name : "?", need[k].what), false;
    return true;
}

// "cpu, opencl, opencl:N, opencl:auto": the devices the registry names (NAME:N and NAME:auto for the
// backends of many devices, those with an auto pick).
static void device_names(char *buf, size_t n) {
    const nm_backend_reg *const *regs;
    const int32_t k = nm_backend_regs(&regs);
    size_t at = 0;
    buf[0] = '\0';
    for (int32_t i = 0; i < k && at < n; i++) {
        const char *nm = regs[i]->name;
        const int w = regs[i]->pick_auto ? snprintf(buf + at, n - at, "%s%s, %s:N, %s:auto", i ? ", " : "", nm, nm, nm)
                                         : snprintf(buf + at, n - at, "%s%s", i ? ", " : "", nm);
        if (w < 0) break;
        at += (size_t)w;
    }
}

nm_status nm_backend_create(const char *device, const nm_backend_params *p, nm_backend **out, char *err,
                            size_t err_size) {
    if (!out || !p) return NM_ERR_INVALID_ARG;
    *out = NULL;
    if (!device || !*device) device = "cpu";
    const char *colon = strchr(device, ':');
    const nm_backend_reg *r = nm_backend_reg_find(device, colon ? (size_t)(colon - device) : strlen(device));
    char names[256];
    if (!r) {
        device_names(names, sizeof names);
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "unknown device '%s' (%s)", device, names);
    }
    int32_t index = 0;
    if (colon && !strcmp(colon + 1, "auto") && r->pick_auto) {
        if ((index = r->pick_auto(err, err_size)) < 0) return NM_ERR_UNSUPPORTED;
    } else if (colon) {
        char *end;
        const long v = strtol(colon + 1, &end, 10);
        if (end == colon + 1 || *end || v < 0 || v > 64)
            return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "device '%s': expected %s or %s:N%s", device, r->name,
                           r->name, r->pick_auto ? " or :auto" : "");
        index = (int32_t)v;
    }
    nm_status st = r->create(index, p, out, err, err_size);
    if (st == NM_OK && !nm_backend_iface_check((*out)->iface, err, err_size)) {
        if ((*out)->iface && (*out)->iface->free) (*out)->iface->free(*out);
        *out = NULL;
        st = NM_ERR_INVALID_ARG;
    }
    return st;
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

void nm_host_device_info(nm_device_info *d, bool measure) {
    memset(d, 0, sizeof *d);
    snprintf(d->name, sizeof d->name, "cpu");
    cpu_name(d->desc, sizeof d->desc);
    snprintf(d->driver, sizeof d->driver, "%ld online cores", sysconf(_SC_NPROCESSORS_ONLN));
    d->mem_bytes = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
    d->unified = true;
    if (measure) d->read_gbps = nm_cpu_read_gbps(0);
    snprintf(d->type, sizeof d->type, "cpu");
}

int32_t nm_list_devices(nm_device_info *out, int32_t n, bool measure) {
    const nm_backend_reg *const *regs;
    const int32_t k = nm_backend_regs(&regs);
    int32_t total = 0;
    for (int32_t i = 0; i < k; i++) {
        const int32_t room = out && n > total ? n - total : 0;
        total += regs[i]->devices(room ? out + total : NULL, room, measure);
    }
    return total;
}
