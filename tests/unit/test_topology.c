// CPU topology from sysfs (src/core/topology.c) on fake trees (a 4+4
// big.LITTLE phone, a two-socket x86 box) and on this machine; core lists for
// lanes; a pool made on a lane's cores runs there.
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/threadpool.h"
#include "nmtest.h"

static char root[256];

static void put(const char *rel, const char *text) {
    char path[512], dir[512];
    snprintf(path, sizeof path, "%s/devices/system/cpu/%s", root, rel);
    snprintf(dir, sizeof dir, "%s", path);
    for (char *p = dir + strlen(root) + 1; (p = strchr(p, '/')); p++) { // mkdir -p of the folders
        *p = '\0';
        mkdir(dir, 0755);
        *p = '/';
    }
    FILE *f = fopen(path, "w");
    if (f) fputs(text, f), fclose(f);
}

static void fresh_tree(const char *name) {
    snprintf(root, sizeof root, "/tmp/nm-topo-%d-%s", (int)getpid(), name);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", root, root);
    if (system(cmd) != 0) fprintf(stderr, "  cannot make %s\n", root);
}

static void remove_tree(void) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) fprintf(stderr, "  cannot remove %s\n", root);
}

// cpus 0-3: little (capacity 446, 1.8 GHz), 4-5: middle (800, 2.4 GHz), 6-7:
// big (1024, 2.4 GHz: the same top frequency as the middle ones, so only the
// capacity tells them apart), an L2 per group of four, an L3 over all
// (DynamIQ), private L1s.
static void phone(void) {
    fresh_tree("phone");
    put("online", "0-7\n");
    for (int c = 0; c < 8; c++) {
        char rel[128], v[64];
        const bool big = c >= 4;
        snprintf(rel, sizeof rel, "cpu%d/cpu_capacity", c);
        put(rel, c >= 6 ? "1024\n" : big ? "800\n" : "446\n");
        snprintf(rel, sizeof rel, "cpu%d/cpufreq/cpuinfo_max_freq", c);
        put(rel, big ? "2400000\n" : "1800000\n");
        snprintf(rel, sizeof rel, "cpu%d/cache/index0/level", c);
        put(rel, "1\n");
        snprintf(rel, sizeof rel, "cpu%d/cache/index0/size", c);
        put(rel, "32K\n");
        snprintf(rel, sizeof rel, "cpu%d/cache/index0/shared_cpu_list", c);
        snprintf(v, sizeof v, "%d\n", c);
        put(rel, v);
        snprintf(rel, sizeof rel, "cpu%d/cache/index2/level", c);
        put(rel, "2\n");
        snprintf(rel, sizeof rel, "cpu%d/cache/index2/size", c);
        put(rel, big ? "1024K\n" : "256K\n");
        snprintf(rel, sizeof rel, "cpu%d/cache/index2/shared_cpu_list", c);
        put(rel, big ? "4-7\n" : "0-3\n");
        snprintf(rel, sizeof rel, "cpu%d/cache/index3/level", c);
        put(rel, "3\n");
        snprintf(rel, sizeof rel, "cpu%d/cache/index3/size", c);
        put(rel, "4096K\n");
        snprintf(rel, sizeof rel, "cpu%d/cache/index3/shared_cpu_list", c);
        put(rel, "0-7\n");
    }
}

static bool list_is(const int32_t *got, int32_t n, const int32_t *want, int32_t nw) {
    return n == nw && !memcmp(got, want, sizeof(int32_t) * (size_t)n);
}

NM_TEST(big_little_clusters) {
    phone();
    nm_cpu_topology t;
    char err[256];
    NM_CHECK(nm_cpu_topology_read(root, &t, err, sizeof err) == NM_OK);
    NM_CHECK(t.n_cpus == 8 && t.n_clusters == 3);
    const int32_t big[] = {6, 7}, mid[] = {4, 5}, little[] = {0, 1, 2, 3};
    NM_CHECK(list_is(t.clusters[0].cpus, t.clusters[0].n_cpus, big, 2)); // the fastest first
    NM_CHECK(t.clusters[0].capacity == 1024 && t.clusters[0].max_khz == 2400000 && t.clusters[0].cache_bytes == 4 << 20);
    NM_CHECK(list_is(t.clusters[1].cpus, t.clusters[1].n_cpus, mid, 2) && t.clusters[1].capacity == 800);
    NM_CHECK(list_is(t.clusters[2].cpus, t.clusters[2].n_cpus, little, 4) && t.clusters[2].capacity == 446);
    int32_t c[NM_MAX_CPUS], n = 0;
    NM_CHECK(nm_cores_parse(&t, "big", c, NM_MAX_CPUS, &n, err, sizeof err) == NM_OK && list_is(c, n, big, 2));
    NM_CHECK(nm_cores_parse(&t, "little", c, NM_MAX_CPUS, &n, err, sizeof err) == NM_OK && list_is(c, n, little, 4));
    NM_CHECK(nm_cores_parse(&t, "cluster:1", c, NM_MAX_CPUS, &n, err, sizeof err) == NM_OK && list_is(c, n, mid, 2));
    const int32_t mix[] = {0, 1, 2, 5};
    NM_CHECK(nm_cores_parse(&t, "5,0-2", c, NM_MAX_CPUS, &n, err, sizeof err) == NM_OK && list_is(c, n, mix, 4));
    // bad lists name the problem
    const struct {
        const char *spec, *want;
    } bad[] = {{"9", "core 9 is not online"}, {"3-1", "not a range"}, {"x", "not a core number"},
               {"cluster:3", "clusters 0..2"}, {"", "an empty list"}, {"1,", "not a core number"},
               {"0-3 junk", "after the list"}, {"300", "past the 256"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        NM_CHECK(nm_cores_parse(&t, bad[i].spec, c, NM_MAX_CPUS, &n, err, sizeof err) != NM_OK && n == 0);
        if (!strstr(err, bad[i].want)) fprintf(stderr, "  '%s': %s\n", bad[i].spec, err);
        NM_CHECK(strstr(err, bad[i].want) != NULL);
    }
    NM_CHECK(nm_cores_parse(&t, "0-7", c, 4, &n, err, sizeof err) == NM_ERR_RANGE); // no room
    remove_tree();
}

// A hybrid x86: P-cores 0-3 (two of them favoured, 4.8 GHz against 4.6: one
// cluster all the same) and E-cores 4-7 at 3.2 GHz.
NM_TEST(hybrid_x86_turbo_max) {
    fresh_tree("hybrid");
    put("online", "0-7\n");
    const char *khz[8] = {"4600000\n", "4800000\n", "4800000\n", "4600000\n", "3200000\n", "3200000\n", "3200000\n", "3200000\n"};
    for (int c = 0; c < 8; c++) {
        char rel[128];
        snprintf(rel, sizeof rel, "cpu%d/cpufreq/cpuinfo_max_freq", c);
        put(rel, khz[c]);
    }
    nm_cpu_topology t;
    char err[256];
    NM_CHECK(nm_cpu_topology_read(root, &t, err, sizeof err) == NM_OK);
    const int32_t p[] = {0, 1, 2, 3}, e[] = {4, 5, 6, 7};
    NM_CHECK(t.n_clusters == 2 && list_is(t.clusters[0].cpus, t.clusters[0].n_cpus, p, 4) &&
             list_is(t.clusters[1].cpus, t.clusters[1].n_cpus, e, 4));
    NM_CHECK(t.clusters[0].max_khz == 4800000 && t.clusters[1].max_khz == 3200000);
    remove_tree();
}

// x86: no capacity, no frequency (a VM): one cluster per package; offline cores left out.
NM_TEST(packages_and_offline_cores) {
    fresh_tree("x86");
    put("online", "0-2,4-5\n");
    for (int c = 0; c < 6; c++) {
        char rel[128];
        snprintf(rel, sizeof rel, "cpu%d/topology/physical_package_id", c);
        put(rel, c < 3 ? "0\n" : "1\n");
    }
    nm_cpu_topology t;
    char err[256];
    NM_CHECK(nm_cpu_topology_read(root, &t, err, sizeof err) == NM_OK);
    const int32_t p0[] = {0, 1, 2}, p1[] = {4, 5};
    NM_CHECK(t.n_cpus == 5 && t.n_clusters == 2);
    NM_CHECK(list_is(t.clusters[0].cpus, t.clusters[0].n_cpus, p0, 3) && list_is(t.clusters[1].cpus, t.clusters[1].n_cpus, p1, 2));
    NM_CHECK(t.clusters[0].capacity == 0 && t.clusters[0].max_khz == 0 && t.clusters[1].package == 1);
    int32_t c[8], n;
    NM_CHECK(nm_cores_parse(&t, "3", c, 8, &n, err, sizeof err) == NM_ERR_INVALID_ARG && strstr(err, "not online"));
    // broken trees
    put("online", "0-x\n");
    NM_CHECK(nm_cpu_topology_read(root, &t, err, sizeof err) == NM_ERR_FORMAT && strstr(err, "online"));
    remove_tree();
    NM_CHECK(nm_cpu_topology_read(root, &t, err, sizeof err) == NM_ERR_IO && strstr(err, "cannot read"));
    NM_CHECK(nm_cpu_topology_read(NULL, NULL, err, sizeof err) == NM_ERR_INVALID_ARG);
}

NM_TEST(this_machine) {
    nm_cpu_topology t;
    char err[256];
    NM_CHECK(nm_cpu_topology_read(NULL, &t, err, sizeof err) == NM_OK);
    int32_t sum = 0;
    for (int32_t i = 0; i < t.n_clusters; i++) sum += t.clusters[i].n_cpus;
    printf("  %d online cores in %d cluster(s); the first: %d cores, capacity %d, %lld kHz, %lld KiB shared cache\n",
           t.n_cpus, t.n_clusters, t.clusters[0].n_cpus, t.clusters[0].capacity, (long long)t.clusters[0].max_khz,
           (long long)(t.clusters[0].cache_bytes >> 10));
    NM_CHECK(t.n_cpus == nm_cpu_count() && t.n_clusters >= 1 && sum == t.n_cpus);
}

// A pool made on a thread bound to one core has its workers there too, pinned or not.
static _Atomic int g_off_core;
static void where(void *arg, int64_t chunk, int ith) {
    (void)arg, (void)chunk, (void)ith;
    for (volatile int i = 0; i < 20000; i++) {
    }
    if (sched_getcpu() != *(int *)arg) g_off_core++;
}

NM_TEST(pool_on_a_lanes_cores) {
    cpu_set_t one, old;
    NM_CHECK(pthread_getaffinity_np(pthread_self(), sizeof old, &old) == 0);
    int core = -1;
    for (int c = NM_MAX_CPUS - 1; c >= 0; c--)
        if (CPU_ISSET(c, &old)) core = c, c = -1; // the last core this thread may use
    CPU_ZERO(&one);
    CPU_SET(core, &one);
    NM_CHECK(pthread_setaffinity_np(pthread_self(), sizeof one, &one) == 0);
    nm_pool *p = nm_pool_create(3);
    NM_CHECK(pthread_setaffinity_np(pthread_self(), sizeof old, &old) == 0); // the creator moves on; the pool stays
    NM_CHECK(p != NULL);
    if (!p) return;
    g_off_core = 0;
    nm_pool_run(p, where, &core, 64);
    NM_CHECK(nm_pool_pin(p) == 0);
    nm_pool_run(p, where, &core, 64); // the driving thread is pinned to the lane's first core too
    printf("  3 threads made on core %d: %d of 128 chunks ran elsewhere\n", core, (int)g_off_core);
    // the caller's chunks of the first job may run elsewhere (it is not the lane's thread yet)
    NM_CHECK(g_off_core <= 64);
    g_off_core = 0;
    nm_pool_run(p, where, &core, 64);
    NM_CHECK(g_off_core == 0);
    nm_pool_free(p);
    NM_CHECK(pthread_setaffinity_np(pthread_self(), sizeof old, &old) == 0);
}

NM_TEST_MAIN()
