// DVFS actuators under a sysfs root (include/nanomind.h, "power"; docs/power.md):
// cpufreq policies and devfreq devices, each capped at min + share x (max - min)
// of its range; the originals saved in a restore record before the first
// write and put back on restore, on free, on a crash (a signal handler), or by
// the next process when this one was killed outright.
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fail.h"
#include "power/sysfs.h"

#define MAX_ACTS 32
#define MAX_FREQS 64
#define MAX_SAVED (MAX_ACTS * 2)
#define PATH_CAP 1100
#define VALUE_CAP 96

typedef enum { ROLE_CPU, ROLE_MEMORY, ROLE_GPU, ROLE_NPU, ROLE_NONE } role;
static const char *const role_names[] = {"cpu", "memory", "gpu", "npu", "none"};

typedef struct act {
    role role;
    bool devfreq;
    char dir[1024];
    char name[300];
    double fmin, fmax;     // the range: kHz (cpufreq), Hz (devfreq)
    double floor;          // never capped below this (the min the system set)
    double freqs[MAX_FREQS];
    int n_freqs;           // available frequencies, ascending (0: any integer)
    char gov[64];          // the governor at open
    char govs[512];        // the governors offered
    char gov_file[PATH_CAP], value_file[PATH_CAP];
    bool write_gov;        // the configured governor differs from gov's
    bool userspace;        // the value goes to setspeed/set_freq
} act;

typedef struct saved {
    char path[PATH_CAP];
    char value[VALUE_CAP];
} saved;

struct nm_power_actuators {
    char root[400], record[512];
    char cpu_gov[64], dev_gov[64];
    bool dry;
    FILE *log;
    act acts[MAX_ACTS];
    int n;
    saved orig[MAX_SAVED]; // restore order: governors first, then values
    int n_orig;
    bool record_written;
};

nm_actuator_params nm_actuator_default_params(void) {
    return (nm_actuator_params){0};
}

static role role_of(const char *name) {
    char low[64];
    size_t i = 0;
    for (; name[i] && i + 1 < sizeof low; i++) low[i] = (char)tolower((unsigned char)name[i]);
    low[i] = 0;
    if (strstr(low, "dmc") || strstr(low, "ddr") || strstr(low, "memory") || strstr(low, "bus")) return ROLE_MEMORY;
    if (strstr(low, "gpu") || strstr(low, "mali") || strstr(low, "kgsl")) return ROLE_GPU;
    if (strstr(low, "npu")) return ROLE_NPU;
    return ROLE_NONE;
}

static int cmp_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }
static int cmp_dbl(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

// The entries of dir whose name starts with prefix, sorted; returns the count (-1: dir unreadable).
static int list_dir(const char *dir, const char *prefix, char **names, int max) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) && n < max;)
        if (e->d_name[0] != '.' && !strncmp(e->d_name, prefix, strlen(prefix))) names[n++] = strdup(e->d_name);
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, cmp_name);
    return n;
}

static int parse_freqs(const char *s, double *out, int max) {
    int n = 0;
    while (*s && n < max) {
        char *end;
        double v = strtod(s, &end);
        if (end == s) break;
        if (isfinite(v) && v > 0) out[n++] = v;
        s = end;
    }
    qsort(out, (size_t)n, sizeof *out, cmp_dbl);
    return n;
}

static bool offers(const char *govs, const char *gov) {
    size_t n = strlen(gov);
    for (const char *p = govs; (p = strstr(p, gov)); p += n)
        if ((p == govs || isspace((unsigned char)p[-1])) && (!p[n] || isspace((unsigned char)p[n]))) return true;
    return false;
}

static void logf_(nm_power_actuators *a, const char *verb, const char *path, const char *value) {
    if (a->log) fprintf(a->log, "%s %s %s\n", verb, path, value);
}

// One sysfs write: the whole value, truncating (a regular file in a test tree).
static bool write_value(const char *path, const char *value) {
    int fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC);
    if (fd < 0) return false;
    char buf[VALUE_CAP + 2];
    int n = snprintf(buf, sizeof buf, "%s\n", value);
    bool ok = write(fd, buf, (size_t)n) == n;
    int e = errno;
    if (close(fd) != 0 && ok) return false;
    errno = e;
    return ok;
}

static const char *read_cur(const char *path, char *buf, size_t size) {
    FILE *f = fopen(path, "r");
    buf[0] = 0;
    if (!f) return buf;
    if (fgets(buf, (int)size, f)) {
        size_t n = strlen(buf);
        while (n > 0 && isspace((unsigned char)buf[n - 1])) buf[--n] = 0;
    }
    fclose(f);
    return buf;
}

// ---- the restore record

static nm_status record_write(nm_power_actuators *a, char *err, size_t err_size) {
    if (a->record_written || a->dry || a->n_orig == 0) return NM_OK;
    char dir[512];
    snprintf(dir, sizeof dir, "%s", a->record);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        *slash = 0;
        // the folder of a default record (~/.cache/nanomind) may not exist yet
        char *p = dir;
        while ((p = strchr(p + 1, '/'))) {
            *p = 0;
            mkdir(dir, 0755);
            *p = '/';
        }
        mkdir(dir, 0755);
    }
    nm_outfile o = {0};
    nm_status st = nm_outfile_open(&o, a->record, err, err_size);
    if (st != NM_OK) return st;
    fprintf(o.f, "nanomind power restore record 1\npid %ld\n", (long)getpid());
    for (int i = 0; i < a->n_orig; i++) fprintf(o.f, "%s\t%s\n", a->orig[i].path, a->orig[i].value);
    st = nm_outfile_commit(&o, err, err_size);
    if (st == NM_OK) a->record_written = true;
    return st;
}

static bool pid_alive(long pid) {
    return pid > 0 && (kill((pid_t)pid, 0) == 0 || errno == EPERM);
}

nm_status nm_power_restore_record(const char *record, FILE *log, char *err, size_t err_size) {
    if (!record) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "power: record path is NULL");
    FILE *f;
    char why[512];
    if (nm_infile_open(record, 1u << 20, 0, &f, NULL, why, sizeof why) != NM_OK)
        return nm_fail(NM_ERR_IO, err, err_size, "restore record %s", why);
    char line[PATH_CAP + VALUE_CAP + 8];
    long pid = 0;
    nm_status st = NM_OK;
    if (!fgets(line, sizeof line, f) || strcmp(line, "nanomind power restore record 1\n") ||
        !fgets(line, sizeof line, f) || sscanf(line, "pid %ld", &pid) != 1 || pid <= 0) {
        fclose(f);
        return nm_fail(NM_ERR_FORMAT, err, err_size, "restore record %s: not a nanomind restore record", record);
    }
    if (pid != (long)getpid() && pid_alive(pid)) {
        fclose(f);
        return nm_fail(NM_ERR_STATE, err, err_size,
                       "restore record %s: its owner (pid %ld) is running and manages these frequencies", record, pid);
    }
    // parse every line before writing any: a damaged record restores nothing
    saved *v = calloc(MAX_SAVED, sizeof *v);
    int n = 0;
    if (!v) {
        fclose(f);
        return nm_fail(NM_ERR_NOMEM, err, err_size, "restore record: out of memory");
    }
    for (int lineno = 3; fgets(line, sizeof line, f); lineno++) {
        char *tab = strchr(line, '\t'), *nl = strchr(line, '\n');
        if (!tab || !nl || n == MAX_SAVED || tab == line || (size_t)(tab - line) >= PATH_CAP ||
            (size_t)(nl - tab - 1) >= VALUE_CAP) {
            st = nm_fail(NM_ERR_FORMAT, err, err_size, "restore record %s:%d: not 'path<TAB>value'", record, lineno);
            break;
        }
        *tab = *nl = 0;
        memcpy(v[n].path, line, (size_t)(tab - line) + 1);
        snprintf(v[n].value, VALUE_CAP, "%s", tab + 1);
        n++;
    }
    fclose(f);
    for (int i = 0; st == NM_OK && i < n; i++) {
        if (log) fprintf(log, "restore %s %s\n", v[i].path, v[i].value);
        if (!write_value(v[i].path, v[i].value))
            st = nm_fail(NM_ERR_IO, err, err_size, "restore %s to %s: %s", v[i].path, v[i].value, strerror(errno));
    }
    free(v);
    if (st == NM_OK && unlink(record) != 0)
        st = nm_fail(NM_ERR_IO, err, err_size, "restore record %s: remove: %s", record, strerror(errno));
    return st;
}

// ---- discovery

static bool add_saved(nm_power_actuators *a, const char *path, const char *value, bool first) {
    if (a->n_orig == MAX_SAVED) return false;
    if (first) { // governors go before values
        memmove(&a->orig[1], &a->orig[0], (size_t)a->n_orig * sizeof *a->orig);
        snprintf(a->orig[0].path, PATH_CAP, "%s", path);
        snprintf(a->orig[0].value, VALUE_CAP, "%s", value);
    } else {
        snprintf(a->orig[a->n_orig].path, PATH_CAP, "%s", path);
        snprintf(a->orig[a->n_orig].value, VALUE_CAP, "%s", value);
    }
    a->n_orig++;
    return true;
}

// Fills x's range, governors and files; false (why set) when it cannot be driven.
static bool act_setup(nm_power_actuators *a, act *x, const char *want_gov, char *why, size_t why_size) {
    char buf[1024];
    if (!x->devfreq) {
        double lo, hi;
        if (nm_sysfs_read_num(x->dir, NULL, "cpuinfo_min_freq", &lo) != NM_OK ||
            nm_sysfs_read_num(x->dir, NULL, "cpuinfo_max_freq", &hi) != NM_OK || !(lo > 0 && hi >= lo)) {
            snprintf(why, why_size, "no readable cpuinfo_min_freq/cpuinfo_max_freq");
            return false;
        }
        x->fmin = lo;
        x->fmax = hi;
        if (nm_sysfs_read_str(x->dir, NULL, "scaling_available_frequencies", buf, sizeof buf) == NM_OK)
            x->n_freqs = parse_freqs(buf, x->freqs, MAX_FREQS);
        if (nm_sysfs_read_num(x->dir, NULL, "scaling_min_freq", &x->floor) != NM_OK) x->floor = lo;
        nm_sysfs_read_str(x->dir, NULL, "scaling_governor", x->gov, sizeof x->gov);
        nm_sysfs_read_str(x->dir, NULL, "scaling_available_governors", x->govs, sizeof x->govs);
        nm_sysfs_path(x->gov_file, PATH_CAP, x->dir, NULL, "scaling_governor");
    } else {
        if (nm_sysfs_read_str(x->dir, NULL, "available_frequencies", buf, sizeof buf) == NM_OK)
            x->n_freqs = parse_freqs(buf, x->freqs, MAX_FREQS);
        double lo = 0, hi = 0;
        if (x->n_freqs > 0) {
            lo = x->freqs[0];
            hi = x->freqs[x->n_freqs - 1];
        } else if (nm_sysfs_read_num(x->dir, NULL, "min_freq", &lo) != NM_OK ||
                   nm_sysfs_read_num(x->dir, NULL, "max_freq", &hi) != NM_OK) {
            lo = hi = 0;
        }
        if (!(lo > 0 && hi >= lo)) {
            snprintf(why, why_size, "no available_frequencies nor min_freq/max_freq");
            return false;
        }
        x->fmin = lo;
        x->fmax = hi;
        if (nm_sysfs_read_num(x->dir, NULL, "min_freq", &x->floor) != NM_OK) x->floor = lo;
        nm_sysfs_read_str(x->dir, NULL, "governor", x->gov, sizeof x->gov);
        nm_sysfs_read_str(x->dir, NULL, "available_governors", x->govs, sizeof x->govs);
        nm_sysfs_path(x->gov_file, PATH_CAP, x->dir, NULL, "governor");
    }
    const char *gov = want_gov && *want_gov ? want_gov : x->gov;
    if (want_gov && *want_gov && strcmp(want_gov, x->gov)) {
        if (!offers(x->govs, want_gov)) {
            snprintf(why, why_size, "governor '%s' is not offered by the kernel (offered: %s)", want_gov,
                     x->govs[0] ? x->govs : "none listed");
            return false;
        }
        x->write_gov = true;
    }
    x->userspace = !strcmp(gov, "userspace");
    if (!x->devfreq)
        nm_sysfs_path(x->value_file, PATH_CAP, x->dir, NULL, x->userspace ? "scaling_setspeed" : "scaling_max_freq");
    else
        nm_sysfs_path(x->value_file, PATH_CAP, x->dir, NULL, x->userspace ? "userspace/set_freq" : "max_freq");
    // the originals: the governor if it is written; the value unless it only means something under a
    // userspace governor this process sets (restoring the governor is then enough)
    char cur[VALUE_CAP];
    if (x->write_gov && !add_saved(a, x->gov_file, x->gov, true)) return snprintf(why, why_size, "too many"), false;
    if (!(x->userspace && x->write_gov)) {
        read_cur(x->value_file, cur, sizeof cur);
        char *end;
        double v = strtod(cur, &end);
        if (end == cur || !isfinite(v)) {
            snprintf(why, why_size, "%s holds no frequency ('%s')", x->value_file, cur);
            return false;
        }
        if (!add_saved(a, x->value_file, cur, false)) return snprintf(why, why_size, "too many"), false;
    }
    return true;
}

nm_status nm_power_actuators_open(const nm_actuator_params *pp, nm_power_actuators **out, char *err,
                                  size_t err_size) {
    if (!out) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "power: out is NULL");
    *out = NULL;
    nm_actuator_params p = pp ? *pp : nm_actuator_default_params();
    nm_power_actuators *a = calloc(1, sizeof *a);
    if (!a) return nm_fail(NM_ERR_NOMEM, err, err_size, "power: out of memory");
    snprintf(a->root, sizeof a->root, "%s", p.sysfs_root ? p.sysfs_root : "/sys");
    if (p.record) snprintf(a->record, sizeof a->record, "%s", p.record);
    else if (getenv("HOME") && *getenv("HOME"))
        snprintf(a->record, sizeof a->record, "%s/.cache/nanomind/power-restore.txt", getenv("HOME"));
    else snprintf(a->record, sizeof a->record, "/tmp/nanomind-power-restore-%ld.txt", (long)getuid());
    a->dry = p.dry_run;
    a->log = p.log;
    snprintf(a->cpu_gov, sizeof a->cpu_gov, "%s", p.cpu_governor ? p.cpu_governor : "");
    snprintf(a->dev_gov, sizeof a->dev_gov, "%s", p.devfreq_governor ? p.devfreq_governor : "");
    nm_status st = NM_OK;
    struct stat sb;
    if (stat(a->root, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        st = nm_fail(NM_ERR_IO, err, err_size, "power: sysfs root %s: %s", a->root,
                     errno ? strerror(errno) : "not a folder");
        goto fail;
    }
    // a record left behind: restored first, unless its owner still runs
    if (!a->dry && access(a->record, F_OK) == 0) {
        st = nm_power_restore_record(a->record, a->log, err, err_size);
        if (st != NM_OK) goto fail;
    }
    char dir[512], why[1400];
    char *names[64];
    snprintf(dir, sizeof dir, "%s/devices/system/cpu/cpufreq", a->root);
    int nn = list_dir(dir, "policy", names, 64);
    for (int i = 0; i < nn; i++) {
        if (a->n < MAX_ACTS) {
            act *x = &a->acts[a->n];
            *x = (act){.role = ROLE_CPU};
            snprintf(x->dir, sizeof x->dir, "%s/%s", dir, names[i]);
            snprintf(x->name, sizeof x->name, "cpufreq:%s", names[i]);
            if (act_setup(a, x, p.cpu_governor, why, sizeof why)) a->n++;
            else if (strstr(why, "governor") && st == NM_OK) st = nm_fail(NM_ERR_UNSUPPORTED, err, err_size, "%s: %s", x->dir, why);
        }
        free(names[i]);
    }
    snprintf(dir, sizeof dir, "%s/class/devfreq", a->root);
    nn = st == NM_OK ? list_dir(dir, "", names, 64) : 0;
    for (int i = 0; i < nn; i++) {
        role r = role_of(names[i]);
        if (r != ROLE_NONE && a->n < MAX_ACTS && st == NM_OK) {
            act *x = &a->acts[a->n];
            *x = (act){.role = r, .devfreq = true};
            snprintf(x->dir, sizeof x->dir, "%s/%s", dir, names[i]);
            snprintf(x->name, sizeof x->name, "devfreq:%s", names[i]);
            if (act_setup(a, x, p.devfreq_governor, why, sizeof why)) a->n++;
            else if (strstr(why, "governor")) st = nm_fail(NM_ERR_UNSUPPORTED, err, err_size, "%s: %s", x->dir, why);
        }
        free(names[i]);
    }
    if (st != NM_OK) goto fail;
    if (a->n == 0) {
        st = nm_fail(NM_ERR_UNSUPPORTED, err, err_size,
                     "power: no cpufreq policy and no devfreq device with a role under %s", a->root);
        goto fail;
    }
    *out = a;
    return NM_OK;
fail:
    free(a);
    return st;
}

// The frequency for a share of x's range: rounded up to an available one, never below the floor.
static double act_target(const act *x, double share) {
    double s = share < 0 ? 0 : share > 1 ? 1 : share;
    double f = x->fmin + s * (x->fmax - x->fmin);
    if (f < x->floor) f = x->floor;
    if (x->n_freqs > 0) {
        for (int i = 0; i < x->n_freqs; i++)
            if (x->freqs[i] >= f - 0.5) return x->freqs[i];
        return x->freqs[x->n_freqs - 1];
    }
    return ceil(f - 0.5);
}

int32_t nm_power_actuators_describe(const nm_power_actuators *a, char *buf, int32_t size) {
    int need = 0;
    char line[2048];
    for (int i = 0; a && i < a->n; i++) {
        const act *x = &a->acts[i];
        int k = snprintf(line, sizeof line, "%-22s %-6s %.0f..%.0f %s (%d steps), governor %s%s%s, writes %s\n",
                         x->name, role_names[x->role], x->fmin, x->fmax, x->devfreq ? "Hz" : "kHz", x->n_freqs,
                         x->gov[0] ? x->gov : "?", x->write_gov ? " -> " : "",
                         x->write_gov ? (x->devfreq ? a->dev_gov : a->cpu_gov) : "", x->value_file);
        if (k >= (int)sizeof line) k = (int)sizeof line - 1;
        if (need + k < size) memcpy(buf + need, line, (size_t)k + 1);
        need += k;
    }
    if (size > 0 && need == 0) buf[0] = 0;
    return need < size ? need : -(need + 1);
}

typedef struct planned {
    const char *path;
    char value[VALUE_CAP], before[VALUE_CAP];
    const char *gov_of; // a governor write: the actuator's name (for messages)
    bool after_gov;     // a value whose governor is written just before it (its file may appear only then)
} planned;

nm_status nm_power_actuators_apply(nm_power_actuators *a, const nm_power_targets *t, char *err, size_t err_size) {
    if (!a || !t) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "power: actuators or targets are NULL");
    planned w[MAX_SAVED];
    int n = 0;
    // governors first (a userspace governor before its set speed), then the frequencies
    for (int i = 0; i < a->n; i++) {
        act *x = &a->acts[i];
        if (x->write_gov) {
            planned *q = &w[n];
            q->path = x->gov_file;
            snprintf(q->value, VALUE_CAP, "%s", x->devfreq ? a->dev_gov : a->cpu_gov);
            read_cur(q->path, q->before, VALUE_CAP);
            q->gov_of = x->name;
            q->after_gov = false;
            if (strcmp(q->before, q->value)) n++;
        }
    }
    for (int i = 0; i < a->n; i++) {
        act *x = &a->acts[i];
        planned *q = &w[n];
        q->path = x->value_file;
        snprintf(q->value, VALUE_CAP, "%.0f", act_target(x, t->freq_share));
        read_cur(q->path, q->before, VALUE_CAP);
        q->gov_of = NULL;
        q->after_gov = false;
        for (int k = 0; k < n; k++)
            if (w[k].gov_of && !strcmp(w[k].gov_of, x->name)) q->after_gov = true;
        if (strcmp(q->before, q->value)) n++;
    }
    if (a->dry) {
        for (int i = 0; i < n; i++) logf_(a, "would write", w[i].path, w[i].value);
        return NM_OK;
    }
    // every file writable before any is written
    for (int i = 0; i < n; i++) {
        if (w[i].after_gov && access(w[i].path, F_OK) != 0) continue;
        int fd = open(w[i].path, O_WRONLY | O_CLOEXEC);
        if (fd < 0)
            return nm_fail(NM_ERR_IO, err, err_size, "power: %s: %s (nothing was written)", w[i].path, strerror(errno));
        close(fd);
    }
    if (n == 0) return NM_OK;
    nm_status st = record_write(a, err, err_size);
    if (st != NM_OK) return st;
    for (int i = 0; i < n; i++) {
        logf_(a, "write", w[i].path, w[i].value);
        if (!write_value(w[i].path, w[i].value)) {
            int e = errno;
            for (int k = i - 1; k >= 0; k--) // back as it was (a userspace speed goes with its governor)
                if (!w[k].after_gov) write_value(w[k].path, w[k].before);
            return nm_fail(NM_ERR_IO, err, err_size, "power: write %s to %s: %s (the %d written before it put back)",
                           w[i].value, w[i].path, strerror(e), i);
        }
    }
    return NM_OK;
}

nm_status nm_power_actuators_restore(nm_power_actuators *a, char *err, size_t err_size) {
    if (!a) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "power: actuators are NULL");
    if (a->dry || !a->record_written) return NM_OK; // nothing was written
    nm_status st = NM_OK;
    char cur[VALUE_CAP];
    for (int i = 0; i < a->n_orig; i++) {
        if (!strcmp(read_cur(a->orig[i].path, cur, sizeof cur), a->orig[i].value)) continue;
        logf_(a, "restore", a->orig[i].path, a->orig[i].value);
        if (!write_value(a->orig[i].path, a->orig[i].value) && st == NM_OK)
            st = nm_fail(NM_ERR_IO, err, err_size, "power: restore %s to %s: %s", a->orig[i].path, a->orig[i].value,
                         strerror(errno));
    }
    if (st == NM_OK) {
        if (unlink(a->record) != 0 && errno != ENOENT)
            return nm_fail(NM_ERR_IO, err, err_size, "power: remove %s: %s", a->record, strerror(errno));
        a->record_written = false;
    }
    return st;
}

// ---- a crash: the originals written back from a signal handler

static nm_power_actuators *volatile guarded;
static struct sigaction old_actions[5];
static const int fatal_signals[5] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};

static void on_fatal(int sig) {
    nm_power_actuators *a = guarded;
    if (a && a->record_written) {
        for (int i = 0; i < a->n_orig; i++) { // open/write/close/unlink only: safe in a handler
            int fd = open(a->orig[i].path, O_WRONLY | O_TRUNC | O_CLOEXEC);
            if (fd < 0) continue;
            size_t len = strlen(a->orig[i].value);
            ssize_t r = write(fd, a->orig[i].value, len);
            (void)r;
            close(fd);
        }
        unlink(a->record);
    }
    for (int i = 0; i < 5; i++)
        if (fatal_signals[i] == sig) sigaction(sig, &old_actions[i], NULL);
    raise(sig);
}

void nm_power_actuators_guard(nm_power_actuators *a) {
    if (a && !guarded) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_fatal;
        sigemptyset(&sa.sa_mask);
        for (int i = 0; i < 5; i++) sigaction(fatal_signals[i], &sa, &old_actions[i]);
    } else if (!a && guarded) {
        for (int i = 0; i < 5; i++) sigaction(fatal_signals[i], &old_actions[i], NULL);
    }
    guarded = a;
}

void nm_power_actuators_free(nm_power_actuators *a) {
    if (!a) return;
    if (guarded == a) nm_power_actuators_guard(NULL);
    nm_power_actuators_restore(a, NULL, 0);
    free(a);
}
