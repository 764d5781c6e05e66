// Energy (include/nanomind.h, "power"; docs/power.md): measured where the
// machine has a meter (RAPL, hwmon, INA3221, the battery, NVML), modelled from
// the unit profiles where it has none.
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "core/fail.h"
#include "power/sysfs.h"

typedef enum { M_RAPL, M_HWMON_ENERGY, M_HWMON_POWER, M_INA3221, M_BATTERY, M_NVML } meter_kind;

typedef struct meter {
    meter_kind kind;
    char name[48];
    char dir[1024];
    char file[32], file2[32]; // the value (INA3221: voltage, then current)
    double wrap;              // RAPL: max_energy_range_uj (0: none)
    unsigned nvml_index;
    double last;              // cumulative: the counter's last value read; power: joules so far
    double acc;               // cumulative: joules since start (each read adds what the counter moved)
    double last_w, last_t;    // power: the previous sample
} meter;

// NVML, dlopen'd: the few calls used (nvml.h's signatures).
typedef int (*nvml_init_fn)(void);
typedef int (*nvml_count_fn)(unsigned *);
typedef int (*nvml_handle_fn)(unsigned, void **);
typedef int (*nvml_energy_fn)(void *, unsigned long long *);
typedef int (*nvml_name_fn)(void *, char *, unsigned);

struct nm_energy_meters {
    meter m[NM_ENERGY_MAX_METERS];
    int n;
    char unreadable[8][1400];
    int n_unreadable;
    void *nvml;
    nvml_handle_fn nvml_handle;
    nvml_energy_fn nvml_energy;
    pthread_t sampler;
    bool sampling;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool stop;
    double t_start;
};


static bool cumulative(const meter *x) { return x->kind == M_RAPL || x->kind == M_HWMON_ENERGY || x->kind == M_NVML; }

// The meter's value now: joules for the cumulative ones, watts for the others.
static bool meter_value(nm_energy_meters *ms, const meter *x, double *out) {
    double v, w;
    switch (x->kind) {
    case M_RAPL:
    case M_HWMON_ENERGY:
        if (nm_sysfs_read_num(x->dir, NULL, x->file, &v) != NM_OK) return false;
        return *out = v * 1e-6, true;
    case M_HWMON_POWER:
    case M_BATTERY:
        if (nm_sysfs_read_num(x->dir, NULL, x->file, &v) != NM_OK) return false;
        if (x->file2[0]) { // current_now (uA) x voltage_now (uV)
            if (nm_sysfs_read_num(x->dir, NULL, x->file2, &w) != NM_OK) return false;
            return *out = fabs(v) * 1e-6 * fabs(w) * 1e-6, true;
        }
        return *out = fabs(v) * 1e-6, true;
    case M_INA3221:
        if (nm_sysfs_read_num(x->dir, NULL, x->file, &v) != NM_OK ||
            nm_sysfs_read_num(x->dir, NULL, x->file2, &w) != NM_OK)
            return false;
        return *out = v * 1e-3 * w * 1e-3, true; // mV x mA
    case M_NVML: {
        void *h;
        unsigned long long mj;
        if (!ms->nvml || ms->nvml_handle(x->nvml_index, &h) != 0 || ms->nvml_energy(h, &mj) != 0) return false;
        return *out = (double)mj * 1e-3, true;
    }
    }
    return false;
}

static void add_meter(nm_energy_meters *ms, const meter *x) {
    double v;
    if (ms->n == NM_ENERGY_MAX_METERS) return;
    if (!meter_value(ms, x, &v)) {
        if (ms->n_unreadable < 8)
            snprintf(ms->unreadable[ms->n_unreadable++], sizeof ms->unreadable[0], "%s: %s/%s unreadable (%s)", x->name, x->dir, x->file,
                     errno == EACCES ? "permission denied: often root only" : strerror(errno));
        return;
    }
    ms->m[ms->n++] = *x;
}

static int cmp_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int list_dir(const char *dir, char **names, int max) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) && n < max;)
        if (e->d_name[0] != '.') names[n++] = strdup(e->d_name);
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, cmp_name);
    return n;
}

static void find_rapl(nm_energy_meters *ms, const char *root) {
    char dir[512], *names[64];
    snprintf(dir, sizeof dir, "%s/class/powercap", root);
    int n = list_dir(dir, names, 64);
    for (int i = 0; i < n; i++) {
        // packages only (intel-rapl:N): their subdomains (intel-rapl:N:M) are inside them
        const char *p = names[i];
        if (!strncmp(p, "intel-rapl:", 11) && !strchr(p + 11, ':')) {
            meter x = {.kind = M_RAPL};
            snprintf(x.dir, sizeof x.dir, "%s/%s", dir, p);
            char nm[32] = "";
            nm_sysfs_read_str(x.dir, NULL, "name", nm, sizeof nm);
            snprintf(x.name, sizeof x.name, "rapl:%s", nm[0] ? nm : p);
            snprintf(x.file, sizeof x.file, "energy_uj");
            if (nm_sysfs_read_num(x.dir, NULL, "max_energy_range_uj", &x.wrap) == NM_OK) x.wrap *= 1e-6;
            add_meter(ms, &x);
        }
        free(names[i]);
    }
}

static void find_hwmon(nm_energy_meters *ms, const char *root) {
    char dir[512], *names[64];
    snprintf(dir, sizeof dir, "%s/class/hwmon", root);
    int n = list_dir(dir, names, 64);
    for (int i = 0; i < n; i++) {
        meter base = {0};
        snprintf(base.dir, sizeof base.dir, "%s/%s", dir, names[i]);
        char chip[32] = "";
        nm_sysfs_read_str(base.dir, NULL, "name", chip, sizeof chip);
        char *files[128];
        int nf = list_dir(base.dir, files, 128);
        for (int k = 0; k < nf; k++) {
            const char *f = files[k];
            int idx;
            char tail[16];
            meter x = base;
            char label[32] = "", lf[32];
            if (sscanf(f, "energy%d_%15s", &idx, tail) == 2 && !strcmp(tail, "input")) x.kind = M_HWMON_ENERGY;
            else if (sscanf(f, "power%d_%15s", &idx, tail) == 2 && !strcmp(tail, "input")) x.kind = M_HWMON_POWER;
            else if (!strcmp(chip, "ina3221") && sscanf(f, "in%d_%15s", &idx, tail) == 2 && !strcmp(tail, "input")) {
                x.kind = M_INA3221;
                snprintf(x.file2, sizeof x.file2, "curr%d_input", idx);
                snprintf(lf, sizeof lf, "in%d_label", idx);
                nm_sysfs_read_str(x.dir, NULL, lf, label, sizeof label);
                double c;
                if (nm_sysfs_read_num(x.dir, NULL, x.file2, &c) != NM_OK) { // a voltage without a current
                    free(files[k]);
                    continue;
                }
            } else {
                free(files[k]);
                continue;
            }
            snprintf(x.file, sizeof x.file, "%s", f);
            if (!label[0]) {
                snprintf(lf, sizeof lf, "%s%d_label", x.kind == M_HWMON_ENERGY ? "energy" : "power", idx);
                nm_sysfs_read_str(x.dir, NULL, lf, label, sizeof label);
            }
            snprintf(x.name, sizeof x.name, "hwmon:%.16s:%.20s", chip[0] ? chip : names[i], label[0] ? label : f);
            add_meter(ms, &x);
            free(files[k]);
        }
        free(names[i]);
    }
}

static void find_battery(nm_energy_meters *ms, const char *root) {
    char dir[512], *names[32];
    snprintf(dir, sizeof dir, "%s/class/power_supply", root);
    int n = list_dir(dir, names, 32);
    for (int i = 0; i < n; i++) {
        char type[32] = "";
        meter x = {.kind = M_BATTERY};
        snprintf(x.dir, sizeof x.dir, "%s/%s", dir, names[i]);
        nm_sysfs_read_str(x.dir, NULL, "type", type, sizeof type);
        if (!strcmp(type, "Battery")) {
            snprintf(x.name, sizeof x.name, "battery:%s", names[i]);
            double v;
            if (nm_sysfs_read_num(x.dir, NULL, "power_now", &v) == NM_OK) snprintf(x.file, sizeof x.file, "power_now");
            else {
                snprintf(x.file, sizeof x.file, "current_now");
                snprintf(x.file2, sizeof x.file2, "voltage_now");
            }
            add_meter(ms, &x);
        }
        free(names[i]);
    }
}

static void find_nvml(nm_energy_meters *ms) {
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return;
    nvml_init_fn init = (nvml_init_fn)dlsym(h, "nvmlInit_v2");
    nvml_count_fn count = (nvml_count_fn)dlsym(h, "nvmlDeviceGetCount_v2");
    ms->nvml_handle = (nvml_handle_fn)dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    ms->nvml_energy = (nvml_energy_fn)dlsym(h, "nvmlDeviceGetTotalEnergyConsumption");
    nvml_name_fn name = (nvml_name_fn)dlsym(h, "nvmlDeviceGetName");
    unsigned n = 0;
    if (!init || !count || !ms->nvml_handle || !ms->nvml_energy || init() != 0 || count(&n) != 0) {
        dlclose(h);
        return;
    }
    ms->nvml = h;
    for (unsigned i = 0; i < n; i++) {
        meter x = {.kind = M_NVML, .nvml_index = i};
        char dn[64] = "";
        void *dev;
        if (name && ms->nvml_handle(i, &dev) == 0) name(dev, dn, sizeof dn);
        snprintf(x.name, sizeof x.name, "nvml:%u %s", i, dn);
        snprintf(x.dir, sizeof x.dir, "nvml");
        snprintf(x.file, sizeof x.file, "%u", i);
        add_meter(ms, &x);
    }
}

nm_status nm_energy_meters_open(const char *root, bool nvml, nm_energy_meters **out, char *err, size_t err_size) {
    if (!out) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "energy: out is NULL");
    nm_energy_meters *ms = calloc(1, sizeof *ms);
    if (!ms) return nm_fail(NM_ERR_NOMEM, err, err_size, "energy: out of memory");
    pthread_mutex_init(&ms->lock, NULL);
    pthread_cond_init(&ms->cond, NULL);
    const char *r = root ? root : "/sys";
    find_rapl(ms, r);
    find_hwmon(ms, r);
    find_battery(ms, r);
    if (nvml) find_nvml(ms);
    *out = ms;
    return NM_OK;
}

int32_t nm_energy_meters_count(const nm_energy_meters *m) { return m ? m->n : 0; }

int32_t nm_energy_meters_describe(const nm_energy_meters *ms, char *buf, int32_t size) {
    int need = 0;
    size_t used = 0;
#define PUT(...)                                                                                                       \
    do {                                                                                                               \
        int k_ = snprintf(used < (size_t)size ? buf + used : NULL, used < (size_t)size ? (size_t)size - used : 0,     \
                          __VA_ARGS__);                                                                                \
        need += k_;                                                                                                    \
        used += (size_t)k_;                                                                                            \
    } while (0)
    for (int i = 0; ms && i < ms->n; i++) {
        const meter *x = &ms->m[i];
        PUT("%-32s %s %s%s%s\n", x->name, cumulative(x) ? "energy" : "power (sampled every 50 ms)",
            x->kind == M_NVML ? "libnvidia-ml.so.1" : x->dir, x->kind == M_NVML ? "" : "/", x->kind == M_NVML ? "" : x->file);
    }
    for (int i = 0; ms && i < ms->n_unreadable; i++) PUT("%s\n", ms->unreadable[i]);
#undef PUT
    return need < size ? need : -(need + 1);
}

// A meter brought to time t (under the lock where the sampler runs): a
// counter adds what it moved since its last read (a wrap-around at most once
// between two reads: the sampler reads every 50 ms), a power meter its trapezoid.
static void update_meter(nm_energy_meters *ms, meter *x, double t) {
    double v;
    if (!meter_value(ms, x, &v)) return;
    if (cumulative(x)) {
        double d = v - x->last;
        if (d < 0 && x->wrap > 0) d += x->wrap; // the counter wrapped
        x->acc += d > 0 ? d : 0;
        x->last = v;
    } else {
        x->last += 0.5 * (v + x->last_w) * (t - x->last_t);
        x->last_w = v;
        x->last_t = t;
    }
}

static void *sampler_main(void *arg) {
    nm_energy_meters *ms = arg;
    pthread_mutex_lock(&ms->lock);
    while (!ms->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&ms->cond, &ms->lock, &ts);
        const double t = nm_now_s();
        for (int i = 0; i < ms->n; i++) update_meter(ms, &ms->m[i], t);
    }
    pthread_mutex_unlock(&ms->lock);
    return NULL;
}

nm_status nm_energy_meters_start(nm_energy_meters *ms, char *err, size_t err_size) {
    if (!ms) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "energy: meters are NULL");
    if (ms->sampling) return nm_fail(NM_ERR_STATE, err, err_size, "energy: already started");
    bool any = false;
    const double t = nm_now_s();
    for (int i = 0; i < ms->n; i++) {
        meter *x = &ms->m[i];
        double v = 0;
        meter_value(ms, x, &v);
        if (cumulative(x)) {
            x->last = v;
            x->acc = 0;
        } else {
            x->last = 0;
            x->last_w = v;
            x->last_t = t;
        }
        any = true;
    }
    ms->t_start = t;
    ms->stop = false;
    if (any) { // power meters are integrated, counters followed across their wrap-arounds
        if (pthread_create(&ms->sampler, NULL, sampler_main, ms) != 0)
            return nm_fail(NM_ERR_NOMEM, err, err_size, "energy: cannot start the sampling thread");
        ms->sampling = true;
    }
    return NM_OK;
}

// Every meter brought to now (under the lock where a sampler runs).
static void reading_now(nm_energy_meters *ms, nm_energy_reading *out) {
    memset(out, 0, sizeof *out);
    const double t = nm_now_s();
    out->seconds = t - ms->t_start;
    out->n = ms->n;
    for (int i = 0; i < ms->n; i++) {
        meter *x = &ms->m[i];
        snprintf(out->name[i], sizeof out->name[i], "%s", x->name);
        update_meter(ms, x, t);
        out->joules[i] = cumulative(x) ? x->acc : x->last;
    }
}

nm_status nm_energy_meters_read(nm_energy_meters *ms, nm_energy_reading *out, char *err, size_t err_size) {
    if (!ms || !out) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "energy: meters or out are NULL");
    if (ms->t_start <= 0) return nm_fail(NM_ERR_STATE, err, err_size, "energy: not started");
    pthread_mutex_lock(&ms->lock);
    reading_now(ms, out);
    pthread_mutex_unlock(&ms->lock);
    return NM_OK;
}

nm_status nm_energy_meters_stop(nm_energy_meters *ms, nm_energy_reading *out, char *err, size_t err_size) {
    if (!ms || !out) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "energy: meters or out are NULL");
    if (ms->sampling) {
        pthread_mutex_lock(&ms->lock);
        ms->stop = true;
        pthread_cond_signal(&ms->cond);
        pthread_mutex_unlock(&ms->lock);
        pthread_join(ms->sampler, NULL);
        ms->sampling = false;
    }
    reading_now(ms, out);
    return NM_OK;
}

void nm_energy_meters_free(nm_energy_meters *ms) {
    if (!ms) return;
    if (ms->sampling) {
        nm_energy_reading r;
        nm_energy_meters_stop(ms, &r, NULL, 0);
    }
    if (ms->nvml) {
        typedef int (*shutdown_fn)(void);
        shutdown_fn sd = (shutdown_fn)dlsym(ms->nvml, "nvmlShutdown");
        if (sd) sd();
        dlclose(ms->nvml);
    }
    pthread_mutex_destroy(&ms->lock);
    pthread_cond_destroy(&ms->cond);
    free(ms);
}

double nm_energy_model_joules(const nm_unit_profile *u, double busy_s, double span_s, double freq_share,
                              double dram_bytes, double pj_per_byte) {
    if (!u || !(busy_s >= 0) || !(dram_bytes >= 0)) return NAN;
    const double s = freq_share > 0 && freq_share <= 1 ? freq_share : 1;
    const double pj = pj_per_byte > 0 ? pj_per_byte : 80;
    const double t_busy = busy_s / s;                  // slower at a lower clock
    const double over = u->active_w - u->idle_w;       // watts the work adds at full clock
    const double add = over > 0 ? over : 0;
    double j = t_busy * (u->idle_w + add * (NM_ENERGY_STATIC_SHARE + (1 - NM_ENERGY_STATIC_SHARE) * s * s * s));
    if (span_s > t_busy) j += (span_s - t_busy) * u->idle_w;
    return j + dram_bytes * pj * 1e-12;
}
