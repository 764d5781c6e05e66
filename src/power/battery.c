// Battery sources (include/nanomind.h, "power"; docs/power.md): Linux
// power_supply, a replayed CSV trace, a fixed charge; and the filter every
// reading passes before the policy sees it.
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fail.h"
#include "power/sysfs.h"

typedef enum { SRC_SYSFS, SRC_TRACE, SRC_FIXED } src_kind;

typedef struct trace_row {
    double t, pct, watts; // pct, watts NAN when the row has none
} trace_row;

struct nm_battery {
    src_kind kind;
    char dir[1024];       // sysfs: the supply's folder
    char path[512];       // trace: the file
    trace_row *rows;
    int64_t n_rows;
    double fixed;
    // the filter
    double pct;           // last accepted (NAN: none yet)
    double held;          // a jump being confirmed (NAN: none)
    int32_t n_held;
};

const char *nm_power_state_name(nm_power_state s) {
    switch (s) {
    case NM_POWER_UNCONSTRAINED: return "unconstrained";
    case NM_POWER_PROPORTIONAL: return "proportional";
    case NM_POWER_CRITICAL: return "critical";
    }
    return "?";
}

static nm_battery *battery_new(src_kind k) {
    nm_battery *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    b->kind = k;
    b->pct = NAN;
    b->held = NAN;
    return b;
}

nm_status nm_battery_open_fixed(double pct, nm_battery **out, char *err, size_t err_size) {
    if (!out) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "battery: out is NULL");
    *out = NULL;
    if (!isfinite(pct) || pct < 0 || pct > 100)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "battery: a fixed charge must be in 0..100 %%, got %g", pct);
    nm_battery *b = battery_new(SRC_FIXED);
    if (!b) return nm_fail(NM_ERR_NOMEM, err, err_size, "battery: out of memory");
    b->fixed = pct;
    *out = b;
    return NM_OK;
}

// A supply of type Battery under dir/NAME.
static bool is_battery(const char *dir, const char *name) {
    char t[64];
    return nm_sysfs_read_str(dir, name, "type", t, sizeof t) == NM_OK && !strcmp(t, "Battery");
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

nm_status nm_battery_open_sysfs(const char *root, const char *name, nm_battery **out, char *err, size_t err_size) {
    if (!out) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "battery: out is NULL");
    *out = NULL;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/class/power_supply", root ? root : "/sys");
    char chosen[300] = "";
    if (name) {
        if (strchr(name, '/') || !*name || !strcmp(name, ".") || !strcmp(name, ".."))
            return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "battery: '%s' is not a supply name", name);
        if (!is_battery(dir, name))
            return nm_fail(NM_ERR_UNSUPPORTED, err, err_size, "battery: %s/%s is not a supply of type Battery", dir,
                           name);
        snprintf(chosen, sizeof chosen, "%s", name);
    } else {
        DIR *d = opendir(dir);
        if (!d) return nm_fail(NM_ERR_UNSUPPORTED, err, err_size, "battery: no battery (%s: %s)", dir, strerror(errno));
        char *names[256];
        int n = 0;
        for (struct dirent *e; (e = readdir(d)) && n < 256;)
            if (e->d_name[0] != '.' && is_battery(dir, e->d_name)) names[n++] = strdup(e->d_name);
        closedir(d);
        qsort(names, (size_t)n, sizeof *names, cmp_str);
        if (n > 0 && names[0]) snprintf(chosen, sizeof chosen, "%s", names[0]);
        for (int i = 0; i < n; i++) free(names[i]);
        if (!chosen[0])
            return nm_fail(NM_ERR_UNSUPPORTED, err, err_size, "battery: no supply of type Battery in %s", dir);
    }
    nm_battery *b = battery_new(SRC_SYSFS);
    if (!b) return nm_fail(NM_ERR_NOMEM, err, err_size, "battery: out of memory");
    snprintf(b->dir, sizeof b->dir, "%s/%s", dir, chosen);
    *out = b;
    return NM_OK;
}

// The first number of a CSV field (leading/trailing blanks allowed); false
// when the field holds anything else. An empty field is NAN and true.
static bool csv_number(const char *s, const char *end, double *out) {
    while (s < end && (*s == ' ' || *s == '\t')) s++;
    while (end > s && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r')) end--;
    if (s == end) return *out = NAN, true;
    char buf[64];
    if ((size_t)(end - s) >= sizeof buf) return false;
    memcpy(buf, s, (size_t)(end - s));
    buf[end - s] = 0;
    char *e;
    errno = 0;
    double v = strtod(buf, &e);
    if (e == buf || *e || errno == ERANGE || !isfinite(v)) return false;
    *out = v;
    return true;
}

nm_status nm_battery_open_trace(const char *path, nm_battery **out, char *err, size_t err_size) {
    if (!out || !path) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "battery: trace path or out is NULL");
    *out = NULL;
    FILE *f = fopen(path, "r");
    if (!f) return nm_fail(NM_ERR_IO, err, err_size, "trace %s: %s", path, strerror(errno));
    nm_battery *b = battery_new(SRC_TRACE);
    if (!b) {
        fclose(f);
        return nm_fail(NM_ERR_NOMEM, err, err_size, "battery: out of memory");
    }
    snprintf(b->path, sizeof b->path, "%s", path);
    nm_status st = NM_OK;
    char *line = NULL;
    size_t cap = 0, n_cap = 0;
    ssize_t len;
    int64_t lineno = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        if ((size_t)len != strlen(line)) {
            st = nm_fail(NM_ERR_FORMAT, err, err_size, "trace %s:%lld: a NUL byte in the line", path, (long long)lineno);
            break;
        }
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        const char *p = line;
        while (*p == ' ' || *p == '\t') p++;
        if (!*p || *p == '#') continue;
        // split on commas: 2 or 3 fields
        const char *f0 = line, *c1 = strchr(f0, ','), *c2 = c1 ? strchr(c1 + 1, ',') : NULL;
        const char *c3 = c2 ? strchr(c2 + 1, ',') : NULL;
        double t = NAN, pct = NAN, w = NAN;
        bool ok = c1 && !c3 && csv_number(f0, c1, &t) && !isnan(t) &&
                  csv_number(c1 + 1, c2 ? c2 : line + len, &pct) && (!c2 || csv_number(c2 + 1, line + len, &w));
        if (!ok) {
            if (b->n_rows == 0 && lineno == 1 && c1 && !isdigit((unsigned char)*p) && *p != '-' && *p != '+' &&
                *p != '.')
                continue; // a header
            st = nm_fail(NM_ERR_FORMAT, err, err_size, "trace %s:%lld: expected 'seconds,percent[,watts]', got '%.60s'",
                         path, (long long)lineno, line);
            break;
        }
        if (b->n_rows > 0 && !(t > b->rows[b->n_rows - 1].t)) {
            st = nm_fail(NM_ERR_FORMAT, err, err_size, "trace %s:%lld: time %g s is not after the previous row's %g s",
                         path, (long long)lineno, t, b->rows[b->n_rows - 1].t);
            break;
        }
        if ((size_t)b->n_rows == n_cap) {
            size_t nc = n_cap ? n_cap * 2 : 256;
            trace_row *r = realloc(b->rows, nc * sizeof *r);
            if (!r) {
                st = nm_fail(NM_ERR_NOMEM, err, err_size, "trace %s: out of memory", path);
                break;
            }
            b->rows = r;
            n_cap = nc;
        }
        b->rows[b->n_rows++] = (trace_row){t, pct, w};
    }
    if (st == NM_OK && ferror(f)) st = nm_fail(NM_ERR_IO, err, err_size, "trace %s: %s", path, strerror(errno));
    if (st == NM_OK && b->n_rows == 0)
        st = nm_fail(NM_ERR_FORMAT, err, err_size, "trace %s: no rows ('seconds,percent[,watts]')", path);
    free(line);
    fclose(f);
    if (st != NM_OK) {
        nm_battery_free(b);
        return st;
    }
    *out = b;
    return NM_OK;
}

void nm_battery_span(const nm_battery *b, double *t0, double *t1) {
    *t0 = *t1 = 0;
    if (b && b->kind == SRC_TRACE && b->n_rows > 0) {
        *t0 = b->rows[0].t;
        *t1 = b->rows[b->n_rows - 1].t;
    }
}

// The source's raw values at t.
static void source_read(nm_battery *b, double t, nm_battery_reading *r) {
    r->raw_pct = NAN;
    r->watts = NAN;
    r->charging = -1;
    switch (b->kind) {
    case SRC_FIXED: r->raw_pct = b->fixed; break;
    case SRC_TRACE: {
        int64_t lo = 0, hi = b->n_rows - 1; // the last row with t <= time (the first before it)
        while (lo < hi) {
            int64_t mid = (lo + hi + 1) / 2;
            if (b->rows[mid].t <= t) lo = mid;
            else hi = mid - 1;
        }
        r->raw_pct = b->rows[lo].pct;
        r->watts = b->rows[lo].watts;
        if (isfinite(r->watts)) r->charging = r->watts < 0;
        break;
    }
    case SRC_SYSFS: {
        double v, full;
        if (nm_sysfs_read_num(b->dir, NULL, "capacity", &v) == NM_OK) r->raw_pct = v;
        else if (nm_sysfs_read_num(b->dir, NULL, "energy_now", &v) == NM_OK &&
                 nm_sysfs_read_num(b->dir, NULL, "energy_full", &full) == NM_OK && full > 0)
            r->raw_pct = 100.0 * v / full;
        else if (nm_sysfs_read_num(b->dir, NULL, "charge_now", &v) == NM_OK &&
                 nm_sysfs_read_num(b->dir, NULL, "charge_full", &full) == NM_OK && full > 0)
            r->raw_pct = 100.0 * v / full;
        char st[32];
        if (nm_sysfs_read_str(b->dir, NULL, "status", st, sizeof st) == NM_OK) {
            if (!strcmp(st, "Charging") || !strcmp(st, "Full")) r->charging = 1;
            else if (!strcmp(st, "Discharging") || !strcmp(st, "Not charging")) r->charging = 0;
        }
        double uv;
        if (nm_sysfs_read_num(b->dir, NULL, "power_now", &v) == NM_OK) r->watts = fabs(v) * 1e-6;
        else if (nm_sysfs_read_num(b->dir, NULL, "current_now", &v) == NM_OK &&
                 nm_sysfs_read_num(b->dir, NULL, "voltage_now", &uv) == NM_OK)
            r->watts = fabs(v) * 1e-6 * fabs(uv) * 1e-6;
        if (isfinite(r->watts) && r->charging == 1) r->watts = -r->watts;
        break;
    }
    }
}

void nm_battery_read(nm_battery *b, double t_s, nm_battery_reading *r) {
    memset(r, 0, sizeof *r);
    r->t_s = t_s;
    if (!b) {
        r->raw_pct = r->pct = r->watts = NAN;
        r->charging = -1;
        snprintf(r->note, sizeof r->note, "no battery source");
        return;
    }
    source_read(b, t_s, r);
    const double v = r->raw_pct;
    if (!isfinite(v)) {
        snprintf(r->note, sizeof r->note, "no charge readable: kept %.1f %%", b->pct);
    } else if (v < 0 || v > 100) {
        snprintf(r->note, sizeof r->note, "charge %g %% is outside 0..100: rejected, kept %.1f %%", v, b->pct);
    } else if (isnan(b->pct) || fabs(v - b->pct) <= NM_BATTERY_JUMP_PCT) {
        b->pct = v;
        b->held = NAN;
        b->n_held = 0;
        r->accepted = true;
    } else {
        // a jump: held until NM_BATTERY_CONFIRM readings in a row agree with it
        if (!isnan(b->held) && fabs(v - b->held) <= 2.0) b->n_held++;
        else b->n_held = 1;
        b->held = v;
        if (b->n_held >= NM_BATTERY_CONFIRM) {
            snprintf(r->note, sizeof r->note, "jump from %.1f %% to %g %% confirmed by %d readings", b->pct, v,
                     b->n_held);
            b->pct = v;
            b->held = NAN;
            b->n_held = 0;
            r->accepted = true;
        } else {
            snprintf(r->note, sizeof r->note, "jump from %.1f %% to %g %%: held (%d of %d readings)", b->pct, v,
                     b->n_held, NM_BATTERY_CONFIRM);
        }
    }
    r->pct = b->pct;
}

int32_t nm_battery_describe(const nm_battery *b, char *buf, int32_t size) {
    int n = 0;
    if (!b) n = snprintf(buf, (size_t)size, "none");
    else if (b->kind == SRC_FIXED) n = snprintf(buf, (size_t)size, "fixed:%g%%", b->fixed);
    else if (b->kind == SRC_SYSFS) n = snprintf(buf, (size_t)size, "sysfs:%s", b->dir);
    else
        n = snprintf(buf, (size_t)size, "trace:%s (%lld rows, %g..%g s)", b->path, (long long)b->n_rows, b->rows[0].t,
                     b->rows[b->n_rows - 1].t);
    return n < size ? n : -(n + 1);
}

void nm_battery_free(nm_battery *b) {
    if (!b) return;
    free(b->rows);
    free(b);
}
