// The CPU's topology from sysfs (include/nanomind.h, "the machine"): which
// online cores form a cluster (big.LITTLE: the same cpu_capacity and top
// frequency; x86: one cluster per package), the cache its cores share, and
// core lists for lanes ("0-3,6", "big", "little", "cluster:1").
//
// Files read under ROOT/devices/system/cpu (ROOT "/sys" unless given, so
// tests build a fake tree): online; cpuN/cpu_capacity (ARM: 1024 for the
// biggest core), cpuN/cpufreq/cpuinfo_max_freq (kHz),
// cpuN/topology/physical_package_id, cpuN/cache/indexK/{level,size,
// shared_cpu_list}. Each is optional but `online`.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fail.h"

// Parses a CPU list ("0-3,6,8-9") into a bitmap of NM_MAX_CPUS; false on a
// malformed list or a CPU past the bitmap.
static bool parse_list(const char *s, bool *set, char *bad, size_t bad_size) {
    const char *p = s;
    while (*p == ' ' || *p == '\t') p++;
    if (!*p || *p == '\n') return snprintf(bad, bad_size, "an empty list"), false;
    for (;;) {
        char *end;
        errno = 0;
        long a = strtol(p, &end, 10), b = a;
        if (end == p || errno || a < 0) return snprintf(bad, bad_size, "'%.32s' is not a core number", p), false;
        p = end;
        if (*p == '-') {
            const char *q = p + 1;
            b = strtol(q, &end, 10);
            if (end == q || errno || b < a) return snprintf(bad, bad_size, "'%.32s' is not a range", q - 1), false;
            p = end;
        }
        if (b >= NM_MAX_CPUS) return snprintf(bad, bad_size, "core %ld is past the %d we handle", b, NM_MAX_CPUS), false;
        for (long i = a; i <= b; i++) set[i] = true;
        if (*p == ',') {
            p++;
            continue;
        }
        while (*p == ' ' || *p == '\n' || *p == '\t') p++;
        if (*p) return snprintf(bad, bad_size, "'%.32s' after the list", p), false;
        return true;
    }
}

// The first line of ROOT/devices/system/cpu/REL into buf; false if absent.
static bool read_line(const char *root, const char *rel, char *buf, size_t size) {
    char path[1024];
    snprintf(path, sizeof path, "%s/devices/system/cpu/%s", root, rel);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    bool ok = fgets(buf, (int)size, f) != NULL;
    fclose(f);
    return ok;
}

static int64_t read_int(const char *root, const char *rel, int64_t dflt) {
    char buf[64];
    if (!read_line(root, rel, buf, sizeof buf)) return dflt;
    char *end;
    long long v = strtoll(buf, &end, 10);
    return end == buf ? dflt : (int64_t)v;
}

// The largest cache cpu shares with other cores (its highest level), in bytes.
static void shared_cache(const char *root, int cpu, int64_t *bytes) {
    *bytes = 0;
    int best_level = 0;
    for (int k = 0; k < 8; k++) {
        char rel[128], buf[512];
        snprintf(rel, sizeof rel, "cpu%d/cache/index%d/level", cpu, k);
        int64_t level = read_int(root, rel, -1);
        if (level < 0) continue;
        snprintf(rel, sizeof rel, "cpu%d/cache/index%d/shared_cpu_list", cpu, k);
        bool set[NM_MAX_CPUS] = {0};
        char bad[96];
        if (!read_line(root, rel, buf, sizeof buf) || !parse_list(buf, set, bad, sizeof bad)) continue;
        int n = 0;
        for (int i = 0; i < NM_MAX_CPUS; i++) n += set[i];
        if (n < 2 || level < best_level) continue; // private caches say nothing of clusters
        snprintf(rel, sizeof rel, "cpu%d/cache/index%d/size", cpu, k);
        if (!read_line(root, rel, buf, sizeof buf)) continue;
        char *end;
        long long v = strtoll(buf, &end, 10);
        if (*end == 'K') v <<= 10;
        else if (*end == 'M') v <<= 20;
        best_level = (int)level;
        *bytes = v;
    }
}

// Top frequencies within 10% are one cluster's: Intel's Turbo Boost Max 3.0
// and AMD's preferred cores give a few cores of one kind a slightly higher
// maximum; big and little cores differ far more.
static bool same_khz(int64_t a, int64_t b) {
    const int64_t hi = a > b ? a : b, lo = a > b ? b : a;
    return hi - lo <= hi / 10;
}

static int cmp_cluster(const void *a, const void *b) {
    const nm_cpu_cluster *x = a, *y = b;
    if (x->capacity != y->capacity) return x->capacity > y->capacity ? -1 : 1;
    if (x->max_khz != y->max_khz) return x->max_khz > y->max_khz ? -1 : 1;
    return x->cpus[0] - y->cpus[0];
}

nm_status nm_cpu_topology_read(const char *root, nm_cpu_topology *t, char *err, size_t err_size) {
    if (!t) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "topology: no output");
    memset(t, 0, sizeof *t);
    if (!root) root = "/sys";
    char buf[1024], bad[96];
    bool online[NM_MAX_CPUS] = {0};
    if (!read_line(root, "online", buf, sizeof buf))
        return nm_fail(NM_ERR_IO, err, err_size, "topology: cannot read %s/devices/system/cpu/online", root);
    if (!parse_list(buf, online, bad, sizeof bad))
        return nm_fail(NM_ERR_FORMAT, err, err_size, "topology: %s/devices/system/cpu/online: %s", root, bad);
    // a cluster per (capacity, top frequency, package)
    for (int cpu = 0; cpu < NM_MAX_CPUS; cpu++) {
        if (!online[cpu]) continue;
        char rel[128];
        snprintf(rel, sizeof rel, "cpu%d/cpu_capacity", cpu);
        const int32_t cap = (int32_t)read_int(root, rel, 0);
        snprintf(rel, sizeof rel, "cpu%d/cpufreq/cpuinfo_max_freq", cpu);
        const int64_t khz = read_int(root, rel, 0);
        snprintf(rel, sizeof rel, "cpu%d/topology/physical_package_id", cpu);
        const int64_t pkg = read_int(root, rel, 0);
        int64_t cache = 0;
        shared_cache(root, cpu, &cache);
        t->n_cpus++;
        int c = 0;
        for (; c < t->n_clusters; c++) {
            const nm_cpu_cluster *k = &t->clusters[c];
            if (k->capacity == cap && same_khz(k->max_khz, khz) && k->package == pkg) break;
        }
        if (c == t->n_clusters) {
            if (c == NM_MAX_CLUSTERS)
                return nm_fail(NM_ERR_UNSUPPORTED, err, err_size, "topology: more than %d clusters", NM_MAX_CLUSTERS);
            t->n_clusters++;
            t->clusters[c] = (nm_cpu_cluster){.capacity = cap, .max_khz = khz, .package = pkg, .cache_bytes = cache};
        }
        nm_cpu_cluster *k = &t->clusters[c];
        k->cpus[k->n_cpus++] = cpu;
        if (khz > k->max_khz) k->max_khz = khz; // the cluster's best core
        if (cache > k->cache_bytes) k->cache_bytes = cache;
    }
    qsort(t->clusters, (size_t)t->n_clusters, sizeof t->clusters[0], cmp_cluster);
    return NM_OK;
}

nm_status nm_cores_parse(const nm_cpu_topology *t, const char *spec, int32_t *cores, int32_t max, int32_t *n,
                         char *err, size_t err_size) {
    if (n) *n = 0;
    if (!t || !spec || !cores || !n || max < 1) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "cores: NULL argument");
    bool set[NM_MAX_CPUS] = {0}, online[NM_MAX_CPUS] = {0};
    for (int c = 0; c < t->n_clusters; c++)
        for (int i = 0; i < t->clusters[c].n_cpus; i++) online[t->clusters[c].cpus[i]] = true;
    int cl = -1;
    if (!strcmp(spec, "big")) cl = 0;
    else if (!strcmp(spec, "little")) cl = t->n_clusters - 1;
    else if (!strncmp(spec, "cluster:", 8)) {
        char *end;
        long v = strtol(spec + 8, &end, 10);
        if (end == spec + 8 || *end || v < 0 || v >= t->n_clusters)
            return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "cores '%s': this CPU has clusters 0..%d", spec,
                           t->n_clusters - 1);
        cl = (int)v;
    }
    if (cl >= 0) {
        if (cl >= t->n_clusters) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "cores '%s': no cluster", spec);
        for (int i = 0; i < t->clusters[cl].n_cpus; i++) set[t->clusters[cl].cpus[i]] = true;
    } else {
        char bad[96];
        if (!parse_list(spec, set, bad, sizeof bad))
            return nm_fail(NM_ERR_INVALID_ARG, err, err_size,
                           "cores '%s': %s (a list such as 0-3,6, or big, little, cluster:N)", spec, bad);
    }
    for (int i = 0; i < NM_MAX_CPUS; i++) {
        if (!set[i]) continue;
        if (!online[i])
            return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "cores '%s': core %d is not online (%d online)", spec, i,
                           t->n_cpus);
        if (*n == max) return nm_fail(NM_ERR_RANGE, err, err_size, "cores '%s': more than %d cores", spec, max);
        cores[(*n)++] = i;
    }
    return NM_OK;
}
