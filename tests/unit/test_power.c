// The power module (src/power/): the policy's states, alpha and rates; the
// battery sources and their filter; the DVFS actuators on a fake sysfs tree
// (every write checked, restores after errors, crashes and kill -9); the
// energy meters on fake counters; the energy model's arithmetic.
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nanomind.h"
#include "nmtest.h"

// ---- a fake sysfs tree

static char root[256];

static void mkdirs(const char *path) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(buf, 0755);
            *p = '/';
        }
    mkdir(buf, 0755);
}

static void put(const char *rel, const char *value) {
    char path[1024], dir[1024];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    snprintf(dir, sizeof dir, "%s", path);
    *strrchr(dir, '/') = 0;
    mkdirs(dir);
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        abort();
    }
    fprintf(f, "%s\n", value);
    fclose(f);
}

static const char *get(const char *rel) {
    static char buf[8][256];
    static int k;
    char path[1024];
    char *b = buf[k++ % 8];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    FILE *f = fopen(path, "r");
    b[0] = 0;
    if (f) {
        if (!fgets(b, 256, f)) b[0] = 0;
        fclose(f);
    }
    size_t n = strlen(b);
    while (n && b[n - 1] == '\n') b[--n] = 0;
    return b;
}

static void rm_tree(void) {
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", root);
}

#define CPU0 "devices/system/cpu/cpufreq/policy0/"
#define CPU4 "devices/system/cpu/cpufreq/policy4/"
#define DMC "class/devfreq/dmc/"
#define GPU "class/devfreq/fb000000.gpu/"

// A big.LITTLE board: policy0 (408..1800 MHz, 5 steps), policy4 (408..2400 MHz,
// no list), a memory controller and a GPU under devfreq, and an unrelated
// devfreq device the actuators must leave alone.
static void make_tree(void) {
    snprintf(root, sizeof root, "/tmp/nm-power-test-%ld", (long)getpid());
    rm_tree();
    put(CPU0 "cpuinfo_min_freq", "408000");
    put(CPU0 "cpuinfo_max_freq", "1800000");
    put(CPU0 "scaling_available_frequencies", "408000 600000 816000 1104000 1416000 1800000");
    put(CPU0 "scaling_min_freq", "408000");
    put(CPU0 "scaling_max_freq", "1800000");
    put(CPU0 "scaling_governor", "schedutil");
    put(CPU0 "scaling_available_governors", "ondemand userspace powersave performance schedutil");
    put(CPU0 "scaling_setspeed", "<unsupported>");
    put(CPU4 "cpuinfo_min_freq", "408000");
    put(CPU4 "cpuinfo_max_freq", "2400000");
    put(CPU4 "scaling_min_freq", "408000");
    put(CPU4 "scaling_max_freq", "2400000");
    put(CPU4 "scaling_governor", "schedutil");
    put(CPU4 "scaling_available_governors", "userspace schedutil");
    put(CPU4 "scaling_setspeed", "<unsupported>");
    put(DMC "available_frequencies", "324000000 528000000 780000000 1056000000");
    put(DMC "min_freq", "324000000");
    put(DMC "max_freq", "1056000000");
    put(DMC "governor", "dmc_ondemand");
    put(DMC "available_governors", "dmc_ondemand userspace powersave performance simple_ondemand");
    put(DMC "userspace/set_freq", "0");
    put(GPU "available_frequencies", "200000000 300000000 400000000 600000000 800000000");
    put(GPU "min_freq", "200000000");
    put(GPU "max_freq", "800000000");
    put(GPU "governor", "simple_ondemand");
    put(GPU "available_governors", "userspace powersave performance simple_ondemand");
    // a kernel makes userspace/ appear with the userspace governor (the actuators allow it
    // to be absent until their governor write); a plain folder cannot, so it is here already
    put(GPU "userspace/set_freq", "0");
    put("class/devfreq/ff650000.vpu/max_freq", "600000000");
    put("class/devfreq/ff650000.vpu/available_frequencies", "300000000 600000000");
}

static char record[300];

static nm_status open_acts(nm_power_actuators **a, const char *cpu_gov, const char *dev_gov, FILE *log, char *err,
                           size_t n) {
    nm_actuator_params p = nm_actuator_default_params();
    snprintf(record, sizeof record, "%s.record", root);
    p.sysfs_root = root;
    p.record = record;
    p.cpu_governor = cpu_gov;
    p.devfreq_governor = dev_gov;
    p.log = log;
    return nm_power_actuators_open(&p, a, err, n);
}

static bool exists(const char *p) { return access(p, F_OK) == 0; }

// ---- the policy

NM_TEST(policy_states_alpha_and_rates) {
    nm_power_policy pol;
    NM_CHECK(nm_power_policy_init(&pol, NULL, NULL, 0) == NM_OK);
    nm_power_params p = nm_power_default_params();
    NM_CHECK(p.t_high == 60 && p.t_low == 20 && p.hysteresis == 2);
    nm_power_targets t = nm_power_policy_step(&pol, 80);
    NM_CHECK(t.state == NM_POWER_UNCONSTRAINED && t.alpha == 1 && t.fps == 2 && t.freq_share == 1 && !t.cascade);
    t = nm_power_policy_step(&pol, 60); // at the threshold: still unconstrained
    NM_CHECK(t.state == NM_POWER_UNCONSTRAINED);
    t = nm_power_policy_step(&pol, 59.9);
    NM_CHECK(t.state == NM_POWER_PROPORTIONAL);
    // alpha linear in B, and every rate linear in alpha
    for (double b = 59; b >= 20; b -= 3) {
        t = nm_power_policy_step(&pol, b);
        const double a = (b - 20) / 40;
        NM_CHECK(t.state == NM_POWER_PROPORTIONAL);
        NM_CHECK_NEAR(t.alpha, a, 1e-12);
        NM_CHECK_NEAR(t.fps, 0.25 + a * 1.75, 1e-12);
        NM_CHECK_NEAR(t.decode_share, 0.25 + a * 0.75, 1e-12);
        NM_CHECK_NEAR(t.freq_share, t.decode_share, 1e-12);
    }
    t = nm_power_policy_step(&pol, 40);
    NM_CHECK_NEAR(t.alpha, 0.5, 1e-12);
    NM_CHECK_NEAR(t.fps, 1.125, 1e-12);
    NM_CHECK_NEAR(t.decode_share, 0.625, 1e-12);
    NM_CHECK(t.decode_tps_cap == 0); // decode_tps unknown
    // hysteresis on the way up: 61 stays proportional (alpha clamps to 1), 62 leaves it
    t = nm_power_policy_step(&pol, 61);
    NM_CHECK(t.state == NM_POWER_PROPORTIONAL && t.alpha == 1);
    t = nm_power_policy_step(&pol, 61.99);
    NM_CHECK(t.state == NM_POWER_PROPORTIONAL);
    t = nm_power_policy_step(&pol, 62);
    NM_CHECK(t.state == NM_POWER_UNCONSTRAINED);
    // falling straight into critical
    t = nm_power_policy_step(&pol, 19.9);
    NM_CHECK(t.state == NM_POWER_CRITICAL && t.alpha == 0 && t.fps == 0 && t.cascade && t.n_threads == 1);
    NM_CHECK_NEAR(t.decode_share, 0.25, 1e-12);
    t = nm_power_policy_step(&pol, 21); // flapping around t_low: stays critical
    NM_CHECK(t.state == NM_POWER_CRITICAL);
    t = nm_power_policy_step(&pol, 19.5);
    NM_CHECK(t.state == NM_POWER_CRITICAL);
    t = nm_power_policy_step(&pol, 22);
    NM_CHECK(t.state == NM_POWER_PROPORTIONAL);
    NM_CHECK_NEAR(t.alpha, 0.05, 1e-12);
    // a charger: from critical to above t_high + h in one step goes to unconstrained
    nm_power_policy_step(&pol, 5);
    t = nm_power_policy_step(&pol, 90);
    NM_CHECK(t.state == NM_POWER_UNCONSTRAINED);
    // NAN keeps the state and the last alpha
    nm_power_policy_step(&pol, 30);
    t = nm_power_policy_step(&pol, NAN);
    NM_CHECK(t.state == NM_POWER_PROPORTIONAL);
    NM_CHECK_NEAR(t.alpha, 0.25, 1e-12);
    // the first reading sets the state without hysteresis
    nm_power_policy_init(&pol, NULL, NULL, 0);
    NM_CHECK(nm_power_policy_step(&pol, 21).state == NM_POWER_PROPORTIONAL);
}

NM_TEST(policy_decode_cap_and_threads) {
    nm_power_params p = nm_power_default_params();
    p.decode_tps = 40;
    p.n_threads = 4;
    nm_power_policy pol;
    NM_CHECK(nm_power_policy_init(&pol, &p, NULL, 0) == NM_OK);
    nm_power_targets t = nm_power_policy_step(&pol, 100);
    NM_CHECK(t.decode_tps_cap == 0 && t.n_threads == 4);
    t = nm_power_policy_step(&pol, 40); // share 0.625
    NM_CHECK_NEAR(t.decode_tps_cap, 25, 1e-9);
    NM_CHECK(t.n_threads == 3);
    t = nm_power_policy_step(&pol, 20); // share 0.25
    NM_CHECK_NEAR(t.decode_tps_cap, 10, 1e-9);
    NM_CHECK(t.n_threads == 1);
}

NM_TEST(policy_params_checked) {
    char err[256];
    nm_power_params p = nm_power_default_params();
    NM_CHECK(nm_power_params_check(&p, err, sizeof err) == NM_OK);
    p.t_low = 70;
    NM_CHECK(nm_power_params_check(&p, err, sizeof err) == NM_ERR_INVALID_ARG && strstr(err, "t_low 70"));
    p = nm_power_default_params();
    p.hysteresis = 40;
    NM_CHECK(nm_power_params_check(&p, err, sizeof err) == NM_ERR_INVALID_ARG && strstr(err, "hysteresis"));
    p = nm_power_default_params();
    p.fps_min = 3;
    NM_CHECK(nm_power_params_check(&p, err, sizeof err) == NM_ERR_INVALID_ARG && strstr(err, "fps"));
    p = nm_power_default_params();
    p.share_min = 1.5;
    NM_CHECK(nm_power_params_check(&p, err, sizeof err) == NM_ERR_INVALID_ARG);
    p = nm_power_default_params();
    p.t_high = 101;
    nm_power_policy pol;
    NM_CHECK(nm_power_policy_init(&pol, &p, err, sizeof err) == NM_ERR_INVALID_ARG);
}

// ---- battery sources

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

NM_TEST(trace_replay_and_filter) {
    char path[256], err[256];
    snprintf(path, sizeof path, "/tmp/nm-power-trace-%ld.csv", (long)getpid());
    write_file(path, "seconds,percent,watts\n"
                     "0,80,0.5\n"
                     "60,79.5,0.5\n"
                     "120,-3,0.5\n"     // nonsense: rejected
                     "180,150\n"        // nonsense
                     "240,\n"           // missing
                     "300,79\n"
                     "360,40\n"         // a jump: held
                     "420,79\n"         // back: the glitch is gone
                     "480,30\n"         // a real change: held twice, then taken
                     "540,30.5\n"
                     "600,31\n"
                     "660,30,-1.5\n");  // charging
    nm_battery *b = NULL;
    NM_CHECK(nm_battery_open_trace(path, &b, err, sizeof err) == NM_OK);
    double t0, t1;
    nm_battery_span(b, &t0, &t1);
    NM_CHECK(t0 == 0 && t1 == 660);
    nm_battery_reading r;
    nm_battery_read(b, -5, &r); // before the first row: the first row
    NM_CHECK(r.accepted && r.pct == 80 && r.watts == 0.5 && r.charging == 0);
    nm_battery_read(b, 90, &r); // between rows: the last one at or before
    NM_CHECK(r.accepted && r.pct == 79.5);
    nm_battery_read(b, 120, &r);
    NM_CHECK(!r.accepted && r.raw_pct == -3 && r.pct == 79.5 && strstr(r.note, "outside 0..100"));
    nm_battery_read(b, 180, &r);
    NM_CHECK(!r.accepted && r.pct == 79.5 && strstr(r.note, "150 % is outside 0..100"));
    nm_battery_read(b, 240, &r);
    NM_CHECK(!r.accepted && isnan(r.raw_pct) && r.pct == 79.5 && strstr(r.note, "no charge"));
    nm_battery_read(b, 300, &r);
    NM_CHECK(r.accepted && r.pct == 79);
    nm_battery_read(b, 360, &r);
    NM_CHECK(!r.accepted && r.pct == 79 && strstr(r.note, "held"));
    nm_battery_read(b, 420, &r);
    NM_CHECK(r.accepted && r.pct == 79);
    nm_battery_read(b, 480, &r);
    NM_CHECK(!r.accepted && r.pct == 79);
    nm_battery_read(b, 540, &r);
    NM_CHECK(!r.accepted && r.pct == 79);
    nm_battery_read(b, 600, &r);
    NM_CHECK(r.accepted && r.pct == 31 && strstr(r.note, "confirmed"));
    nm_battery_read(b, 700, &r);
    NM_CHECK(r.accepted && r.pct == 30 && r.watts == -1.5 && r.charging == 1);
    char d[512];
    NM_CHECK(nm_battery_describe(b, d, sizeof d) > 0 && strstr(d, "12 rows"));
    nm_battery_free(b);
    unlink(path);
}

NM_TEST(trace_bad_input) {
    char path[256], err[512];
    snprintf(path, sizeof path, "/tmp/nm-power-bad-%ld.csv", (long)getpid());
    nm_battery *b = (nm_battery *)1;
    NM_CHECK(nm_battery_open_trace("/nonexistent/trace.csv", &b, err, sizeof err) == NM_ERR_IO);
    NM_CHECK(b == NULL && strstr(err, "/nonexistent/trace.csv") && strstr(err, "No such file"));
    struct { const char *text, *want; } cases[] = {
        {"0,50\n60,abc\n", ":2: expected 'seconds,percent[,watts]', got '60,abc'"},
        {"0,50\n60\n", ":2: expected"},
        {"0,50\n60,40,1,2\n", ":2: expected"},
        {"0,50\n0,40\n", ":2: time 0 s is not after"},
        {"0,50\n-10,40\n", ":2: time -10 s"},
        {"", "no rows"},
        {"seconds,percent\n", "no rows"},
        {"seconds,percent\nfoo,bar\n", ":2: expected"},
        {"0,50\n,40\n", ":2: expected"},
        {"0,1e999\n", ":1: expected"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        write_file(path, cases[i].text);
        nm_status st = nm_battery_open_trace(path, &b, err, sizeof err);
        NM_CHECK(st == NM_ERR_FORMAT && b == NULL);
        if (!strstr(err, cases[i].want)) {
            fprintf(stderr, "  case %zu: '%s' lacks '%s'\n", i, err, cases[i].want);
            NM_CHECK(0);
        }
    }
    FILE *f = fopen(path, "wb"); // a NUL byte
    fwrite("0,50\n6\0,1\n", 1, 10, f);
    fclose(f);
    NM_CHECK(nm_battery_open_trace(path, &b, err, sizeof err) == NM_ERR_FORMAT && strstr(err, "NUL"));
    unlink(path);
    NM_CHECK(nm_battery_open_fixed(101, &b, err, sizeof err) == NM_ERR_INVALID_ARG);
    NM_CHECK(nm_battery_open_fixed(NAN, &b, err, sizeof err) == NM_ERR_INVALID_ARG);
    NM_CHECK(nm_battery_open_fixed(55, &b, err, sizeof err) == NM_OK);
    nm_battery_reading r;
    nm_battery_read(b, 0, &r);
    NM_CHECK(r.accepted && r.pct == 55);
    nm_battery_free(b);
}

NM_TEST(sysfs_battery) {
    make_tree();
    char err[512];
    nm_battery *b = NULL;
    NM_CHECK(nm_battery_open_sysfs(root, NULL, &b, err, sizeof err) == NM_ERR_UNSUPPORTED && strstr(err, root));
    put("class/power_supply/AC/type", "Mains");
    put("class/power_supply/BAT1/type", "Battery");
    put("class/power_supply/BAT1/energy_now", "18500000");
    put("class/power_supply/BAT1/energy_full", "37000000");
    put("class/power_supply/BAT1/current_now", "500000");
    put("class/power_supply/BAT1/voltage_now", "3800000");
    put("class/power_supply/BAT1/status", "Discharging");
    put("class/power_supply/BAT0/type", "Battery");
    put("class/power_supply/BAT0/capacity", "73");
    put("class/power_supply/BAT0/power_now", "1250000");
    put("class/power_supply/BAT0/status", "Charging");
    NM_CHECK(nm_battery_open_sysfs(root, NULL, &b, err, sizeof err) == NM_OK); // BAT0: the first by name
    nm_battery_reading r;
    nm_battery_read(b, 0, &r);
    NM_CHECK(r.accepted && r.pct == 73 && r.charging == 1);
    NM_CHECK_NEAR(r.watts, -1.25, 1e-12);
    put("class/power_supply/BAT0/capacity", "0x41"); // garbled: rejected, kept
    nm_battery_read(b, 1, &r);
    NM_CHECK(!r.accepted && r.pct == 73);
    nm_battery_free(b);
    NM_CHECK(nm_battery_open_sysfs(root, "BAT1", &b, err, sizeof err) == NM_OK);
    nm_battery_read(b, 0, &r);
    NM_CHECK(r.accepted && r.pct == 50 && r.charging == 0);
    NM_CHECK_NEAR(r.watts, 1.9, 1e-12);
    nm_battery_free(b);
    NM_CHECK(nm_battery_open_sysfs(root, "AC", &b, err, sizeof err) == NM_ERR_UNSUPPORTED);
    NM_CHECK(nm_battery_open_sysfs(root, "../x", &b, err, sizeof err) == NM_ERR_INVALID_ARG);
    rm_tree();
}

// ---- actuators

NM_TEST(actuators_follow_the_policy_and_restore) {
    make_tree();
    char err[512], d[4096];
    nm_power_actuators *a = NULL;
    NM_CHECK(open_acts(&a, NULL, NULL, NULL, err, sizeof err) == NM_OK);
    if (!a) {
        fprintf(stderr, "  %s\n", err);
        return;
    }
    NM_CHECK(nm_power_actuators_describe(a, d, sizeof d) > 0);
    NM_CHECK(strstr(d, "cpufreq:policy0") && strstr(d, "cpufreq:policy4") && strstr(d, "devfreq:dmc") &&
             strstr(d, "memory") && strstr(d, "gpu") && !strstr(d, "vpu"));
    nm_power_policy pol;
    nm_power_policy_init(&pol, NULL, NULL, 0);
    nm_power_targets t = nm_power_policy_step(&pol, 90);
    NM_CHECK(nm_power_actuators_apply(a, &t, err, sizeof err) == NM_OK);
    NM_CHECK(!exists(record)); // nothing to change at full speed: nothing written, no record
    t = nm_power_policy_step(&pol, 40); // share 0.625
    NM_CHECK(nm_power_actuators_apply(a, &t, err, sizeof err) == NM_OK);
    NM_CHECK(exists(record));
    // policy0: 408000 + 0.625 x 1392000 = 1278000, up to 1416000; policy4 (no list): 1653000
    NM_CHECK(!strcmp(get(CPU0 "scaling_max_freq"), "1416000"));
    NM_CHECK(!strcmp(get(CPU4 "scaling_max_freq"), "1653000"));
    // dmc: 324e6 + 0.625 x 732e6 = 781.5e6, up to 1056e6; gpu: 575e6 up to 600e6
    NM_CHECK(!strcmp(get(DMC "max_freq"), "1056000000"));
    NM_CHECK(!strcmp(get(GPU "max_freq"), "600000000"));
    t = nm_power_policy_step(&pol, 24); // share 0.325
    NM_CHECK(nm_power_actuators_apply(a, &t, err, sizeof err) == NM_OK);
    NM_CHECK(!strcmp(get(CPU0 "scaling_max_freq"), "1104000")); // 860400 -> 1104000
    NM_CHECK(!strcmp(get(DMC "max_freq"), "780000000"));         // 561.9e6 -> 780e6
    NM_CHECK(!strcmp(get(GPU "max_freq"), "400000000"));         // 395e6 -> 400e6
    NM_CHECK(!strcmp(get("class/devfreq/ff650000.vpu/max_freq"), "600000000"));
    NM_CHECK(!strcmp(get(CPU0 "scaling_governor"), "schedutil")); // no governor configured: untouched
    // the record names every original
    FILE *f = fopen(record, "r");
    char rec[4096] = "";
    if (f) {
        size_t n = fread(rec, 1, sizeof rec - 1, f);
        rec[n] = 0;
        fclose(f);
    }
    NM_CHECK(strstr(rec, "pid ") && strstr(rec, "policy0/scaling_max_freq\t1800000") &&
             strstr(rec, "dmc/max_freq\t1056000000"));
    NM_CHECK(nm_power_actuators_restore(a, err, sizeof err) == NM_OK);
    NM_CHECK(!strcmp(get(CPU0 "scaling_max_freq"), "1800000"));
    NM_CHECK(!strcmp(get(CPU4 "scaling_max_freq"), "2400000"));
    NM_CHECK(!strcmp(get(DMC "max_freq"), "1056000000"));
    NM_CHECK(!strcmp(get(GPU "max_freq"), "800000000"));
    NM_CHECK(!exists(record));
    // free restores too
    t = nm_power_policy_step(&pol, 5);
    NM_CHECK(nm_power_actuators_apply(a, &t, err, sizeof err) == NM_OK);
    NM_CHECK(!strcmp(get(CPU0 "scaling_max_freq"), "816000")); // critical: share_min 0.25 -> 756000 -> 816000
    nm_power_actuators_free(a);
    NM_CHECK(!strcmp(get(CPU0 "scaling_max_freq"), "1800000"));
    NM_CHECK(!exists(record));
    rm_tree();
}

NM_TEST(actuators_governors) {
    make_tree();
    char err[512];
    nm_power_actuators *a = NULL;
    // a governor the kernel lacks: refused at open, nothing written
    NM_CHECK(open_acts(&a, "conservative", NULL, NULL, err, sizeof err) == NM_ERR_UNSUPPORTED && a == NULL);
    NM_CHECK(strstr(err, "governor 'conservative' is not offered by the kernel") && strstr(err, "policy0"));
    NM_CHECK(!strcmp(get(CPU0 "scaling_governor"), "schedutil") && !exists(record));
    // userspace: the governor, then the set speed; restore puts the governor back
    NM_CHECK(open_acts(&a, "userspace", "userspace", NULL, err, sizeof err) == NM_OK);
    nm_power_policy pol;
    nm_power_policy_init(&pol, NULL, NULL, 0);
    nm_power_targets t = nm_power_policy_step(&pol, 40);
    NM_CHECK(nm_power_actuators_apply(a, &t, err, sizeof err) == NM_OK);
    NM_CHECK(!strcmp(get(CPU0 "scaling_governor"), "userspace") && !strcmp(get(CPU0 "scaling_setspeed"), "1416000"));
    NM_CHECK(!strcmp(get(CPU0 "scaling_max_freq"), "1800000"));
    NM_CHECK(!strcmp(get(DMC "governor"), "userspace") && !strcmp(get(DMC "userspace/set_freq"), "1056000000"));
    NM_CHECK(nm_power_actuators_restore(a, err, sizeof err) == NM_OK);
    NM_CHECK(!strcmp(get(CPU0 "scaling_governor"), "schedutil") && !strcmp(get(DMC "governor"), "dmc_ondemand"));
    NM_CHECK(!strcmp(get(GPU "governor"), "simple_ondemand"));
    nm_power_actuators_free(a);
    rm_tree();
}

NM_TEST(actuators_nothing_half_written) {
    make_tree();
    char err[512], path[600];
    nm_power_actuators *a = NULL;
    NM_CHECK(open_acts(&a, NULL, NULL, NULL, err, sizeof err) == NM_OK);
    if (!a) return;
    nm_power_policy pol;
    nm_power_policy_init(&pol, NULL, NULL, 0);
    nm_power_targets t = nm_power_policy_step(&pol, 40);
    // a file that vanished: found before any write
    snprintf(path, sizeof path, "%s/" GPU "max_freq", root);
    unlink(path);
    NM_CHECK(nm_power_actuators_apply(a, &t, err, sizeof err) == NM_ERR_IO);
    NM_CHECK(strstr(err, "fb000000.gpu/max_freq") && strstr(err, "nothing was written"));
    NM_CHECK(!strcmp(get(CPU0 "scaling_max_freq"), "1800000") && !strcmp(get(DMC "max_freq"), "1056000000"));
    // a write that fails midway (the device is full): what was written before it is put back
    if (symlink("/dev/full", path) == 0) {
        NM_CHECK(nm_power_actuators_apply(a, &t, err, sizeof err) == NM_ERR_IO);
        NM_CHECK(strstr(err, "No space left") && strstr(err, "put back"));
        NM_CHECK(!strcmp(get(CPU0 "scaling_max_freq"), "1800000"));
        NM_CHECK(!strcmp(get(CPU4 "scaling_max_freq"), "2400000"));
        NM_CHECK(!strcmp(get(DMC "max_freq"), "1056000000"));
        unlink(path);
    }
    put(GPU "max_freq", "800000000");
    nm_power_actuators_free(a);
    NM_CHECK(!exists(record));
    rm_tree();
}

// As an unprivileged user (root writes anywhere: a child drops to nobody).
NM_TEST(actuators_without_permission) {
    make_tree();
    chmod(root, 0755);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "chmod -R a+rX '%s'", root);
    NM_CHECK(system(cmd) == 0);
    int fds[2];
    NM_CHECK(pipe(fds) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        if (getuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) _exit(3);
        char err[512] = "";
        nm_power_actuators *a = NULL;
        nm_actuator_params p = nm_actuator_default_params();
        char rec[300];
        snprintf(rec, sizeof rec, "/tmp/nm-power-nobody-%ld.record", (long)getpid());
        p.sysfs_root = root;
        p.record = rec;
        nm_status st = nm_power_actuators_open(&p, &a, err, sizeof err);
        if (st == NM_OK) {
            nm_power_policy pol;
            nm_power_policy_init(&pol, NULL, NULL, 0);
            nm_power_targets t = nm_power_policy_step(&pol, 30);
            st = nm_power_actuators_apply(a, &t, err, sizeof err);
            nm_power_actuators_free(a);
        }
        ssize_t w = write(fds[1], err, strlen(err) + 1);
        (void)w;
        _exit(st == NM_ERR_IO ? 0 : 1);
    }
    close(fds[1]);
    char msg[512] = "";
    ssize_t n = read(fds[0], msg, sizeof msg - 1);
    close(fds[0]);
    if (n > 0) msg[n] = 0;
    int status = 0;
    waitpid(pid, &status, 0);
    NM_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    NM_CHECK(strstr(msg, "Permission denied") && strstr(msg, "nothing was written"));
    NM_CHECK(!strcmp(get(CPU0 "scaling_max_freq"), "1800000") && !strcmp(get(DMC "max_freq"), "1056000000"));
    rm_tree();
}

// A child applies then dies: by a fatal signal (its handler restores) or by
// SIGKILL (the record restores, refused while the owner lives).
NM_TEST(actuators_restore_after_a_crash_and_a_kill) {
    for (int kill9 = 0; kill9 < 2; kill9++) {
        make_tree();
        snprintf(record, sizeof record, "%s.record", root);
        pid_t pid = fork();
        if (pid == 0) {
            char err[512];
            nm_power_actuators *a = NULL;
            if (open_acts(&a, "userspace", NULL, NULL, err, sizeof err) != NM_OK) _exit(3);
            nm_power_actuators_guard(a);
            nm_power_policy pol;
            nm_power_policy_init(&pol, NULL, NULL, 0);
            nm_power_targets t = nm_power_policy_step(&pol, 10);
            if (nm_power_actuators_apply(a, &t, err, sizeof err) != NM_OK) _exit(4);
            if (kill9) raise(SIGKILL);
            abort();
        }
        int status = 0;
        waitpid(pid, &status, 0);
        NM_CHECK(WIFSIGNALED(status) && WTERMSIG(status) == (kill9 ? SIGKILL : SIGABRT));
        if (!kill9) {
            NM_CHECK(!strcmp(get(CPU0 "scaling_governor"), "schedutil"));
            NM_CHECK(!strcmp(get(CPU4 "scaling_governor"), "schedutil"));
            NM_CHECK(!strcmp(get(DMC "max_freq"), "1056000000"));
            NM_CHECK(!exists(record));
        } else {
            NM_CHECK(!strcmp(get(CPU0 "scaling_governor"), "userspace") && exists(record));
            NM_CHECK(!strcmp(get(DMC "max_freq"), "528000000")); // 507e6 -> 528e6
            char err[512];
            NM_CHECK(nm_power_restore_record(record, NULL, err, sizeof err) == NM_OK);
            NM_CHECK(!strcmp(get(CPU0 "scaling_governor"), "schedutil"));
            NM_CHECK(!strcmp(get(DMC "max_freq"), "1056000000"));
            NM_CHECK(!exists(record));
        }
        rm_tree();
    }
}

NM_TEST(restore_record_checked) {
    make_tree();
    char err[512];
    snprintf(record, sizeof record, "%s.record", root);
    // a live owner (pid 1): refused, by restore and by a second open
    FILE *f = fopen(record, "w");
    fprintf(f, "nanomind power restore record 1\npid 1\n%s/%s\t1800000\n", root, CPU0 "scaling_max_freq");
    fclose(f);
    put(CPU0 "scaling_max_freq", "600000");
    NM_CHECK(nm_power_restore_record(record, NULL, err, sizeof err) == NM_ERR_STATE && strstr(err, "pid 1"));
    nm_power_actuators *a = NULL;
    NM_CHECK(open_acts(&a, NULL, NULL, NULL, err, sizeof err) == NM_ERR_STATE && a == NULL);
    NM_CHECK(!strcmp(get(CPU0 "scaling_max_freq"), "600000") && exists(record));
    // garbled: nothing written, the record kept
    f = fopen(record, "w");
    fprintf(f, "nanomind power restore record 1\npid 999999999\n%s/%s\t1800000\nno tab here\n", root,
            CPU0 "scaling_max_freq");
    fclose(f);
    NM_CHECK(nm_power_restore_record(record, NULL, err, sizeof err) == NM_ERR_FORMAT && strstr(err, ":4:"));
    NM_CHECK(!strcmp(get(CPU0 "scaling_max_freq"), "600000") && exists(record));
    write_file(record, "something else\n");
    NM_CHECK(nm_power_restore_record(record, NULL, err, sizeof err) == NM_ERR_FORMAT);
    // a dead owner's record: restored by the next open
    f = fopen(record, "w");
    fprintf(f, "nanomind power restore record 1\npid 999999999\n%s/%s\t1800000\n", root, CPU0 "scaling_max_freq");
    fclose(f);
    NM_CHECK(open_acts(&a, NULL, NULL, NULL, err, sizeof err) == NM_OK);
    NM_CHECK(!strcmp(get(CPU0 "scaling_max_freq"), "1800000") && !exists(record));
    nm_power_actuators_free(a);
    NM_CHECK(nm_power_restore_record("/nonexistent/rec", NULL, err, sizeof err) == NM_ERR_IO);
    rm_tree();
    // nothing to drive
    mkdirs(root);
    NM_CHECK(open_acts(&a, NULL, NULL, NULL, err, sizeof err) == NM_ERR_UNSUPPORTED && strstr(err, "no cpufreq"));
    rm_tree();
    NM_CHECK(open_acts(&a, NULL, NULL, NULL, err, sizeof err) == NM_ERR_IO && strstr(err, root));
}

NM_TEST(actuators_dry_run_writes_nothing) {
    make_tree();
    char err[512], *buf = NULL;
    size_t size = 0;
    FILE *log = open_memstream(&buf, &size);
    nm_actuator_params p = nm_actuator_default_params();
    snprintf(record, sizeof record, "%s.record", root);
    p.sysfs_root = root;
    p.record = record;
    p.dry_run = true;
    p.log = log;
    nm_power_actuators *a = NULL;
    NM_CHECK(nm_power_actuators_open(&p, &a, err, sizeof err) == NM_OK);
    nm_power_policy pol;
    nm_power_policy_init(&pol, NULL, NULL, 0);
    nm_power_targets t = nm_power_policy_step(&pol, 40);
    NM_CHECK(nm_power_actuators_apply(a, &t, err, sizeof err) == NM_OK);
    nm_power_actuators_free(a);
    fclose(log);
    NM_CHECK(buf && strstr(buf, "would write ") && strstr(buf, "policy0/scaling_max_freq 1416000"));
    NM_CHECK(!strcmp(get(CPU0 "scaling_max_freq"), "1800000") && !exists(record));
    free(buf);
    rm_tree();
}

// ---- energy

NM_TEST(meters_rapl_wrap_hwmon_ina3221) {
    make_tree();
    char err[512], d[4096];
    put("class/powercap/intel-rapl:0/name", "package-0");
    put("class/powercap/intel-rapl:0/energy_uj", "262143000000");
    put("class/powercap/intel-rapl:0/max_energy_range_uj", "262143328850");
    put("class/powercap/intel-rapl:0:0/energy_uj", "5"); // a subdomain: inside the package, not counted
    put("class/hwmon/hwmon0/name", "ina3221");
    put("class/hwmon/hwmon0/in1_label", "VDD_IN");
    put("class/hwmon/hwmon0/in1_input", "5000");
    put("class/hwmon/hwmon0/curr1_input", "400");
    put("class/hwmon/hwmon0/in2_input", "1000"); // no current: not a rail
    put("class/hwmon/hwmon1/name", "acpi_power");
    put("class/hwmon/hwmon1/power1_input", "3000000");
    nm_energy_meters *m = NULL;
    NM_CHECK(nm_energy_meters_open(root, false, &m, err, sizeof err) == NM_OK);
    NM_CHECK(nm_energy_meters_count(m) == 3);
    NM_CHECK(nm_energy_meters_describe(m, d, sizeof d) > 0 && strstr(d, "rapl:package-0") &&
             strstr(d, "hwmon:ina3221:VDD_IN") && strstr(d, "hwmon:acpi_power:power1_input"));
    NM_CHECK(nm_energy_meters_start(m, err, sizeof err) == NM_OK);
    struct timespec ts = {0, 300 * 1000000L};
    nanosleep(&ts, NULL);
    put("class/powercap/intel-rapl:0/energy_uj", "1000000"); // wrapped
    nm_energy_reading r;
    NM_CHECK(nm_energy_meters_stop(m, &r, err, sizeof err) == NM_OK);
    NM_CHECK(r.n == 3 && !strcmp(r.name[0], "rapl:package-0"));
    NM_CHECK_NEAR(r.joules[0], (262143328850.0 - 262143000000.0 + 1000000.0) * 1e-6, 1e-6);
    NM_CHECK_NEAR(r.joules[1], 2.0 * r.seconds, 0.02); // 5 V x 0.4 A
    NM_CHECK_NEAR(r.joules[2], 3.0 * r.seconds, 0.02);
    NM_CHECK(r.seconds >= 0.29);
    nm_energy_meters_free(m);
    rm_tree();
    NM_CHECK(nm_energy_meters_open(root, false, &m, err, sizeof err) == NM_OK && nm_energy_meters_count(m) == 0);
    nm_energy_meters_free(m);
}

// A server's counters: the joules read while the meters run, a counter followed across two
// wraps (read between them), a power meter integrated to each read.
NM_TEST(meters_read_while_running) {
    make_tree();
    char err[512];
    put("class/powercap/intel-rapl:0/name", "package-0");
    put("class/powercap/intel-rapl:0/energy_uj", "900000");
    put("class/powercap/intel-rapl:0/max_energy_range_uj", "1000000"); // a 1 J counter
    put("class/hwmon/hwmon1/name", "acpi_power");
    put("class/hwmon/hwmon1/power1_input", "2000000");
    nm_energy_meters *m = NULL;
    nm_energy_reading r;
    NM_CHECK(nm_energy_meters_open(root, false, &m, err, sizeof err) == NM_OK && nm_energy_meters_count(m) == 2);
    NM_CHECK(nm_energy_meters_read(m, &r, err, sizeof err) == NM_ERR_STATE); // not started
    NM_CHECK(nm_energy_meters_start(m, err, sizeof err) == NM_OK);
    static const char *const uj[] = {"100000", "800000", "300000", "300000"}; // wrap, up, wrap, still
    static const double want[] = {0.2, 0.9, 1.4, 1.4};
    double prev = 0;
    for (int k = 0; k < 4; k++) {
        struct timespec ts = {0, 120 * 1000000L};
        nanosleep(&ts, NULL);
        put("class/powercap/intel-rapl:0/energy_uj", uj[k]);
        NM_CHECK(nm_energy_meters_read(m, &r, err, sizeof err) == NM_OK && r.n == 2);
        NM_CHECK_NEAR(r.joules[0], want[k], 1e-9);
        NM_CHECK_NEAR(r.joules[1], 2.0 * r.seconds, 0.02); // 2 W since start, growing with each read
        NM_CHECK(r.joules[1] > prev);
        prev = r.joules[1];
    }
    NM_CHECK(nm_energy_meters_stop(m, &r, err, sizeof err) == NM_OK);
    NM_CHECK_NEAR(r.joules[0], 1.4, 1e-9);
    nm_energy_meters_free(m);
    rm_tree();
}

NM_TEST(energy_model_arithmetic) {
    nm_unit_profile u = {.idle_w = 1, .active_w = 3};
    // at the top clock: 2 s x 3 W, 3 s idle at 1 W, 1 GB at 80 pJ/byte
    NM_CHECK_NEAR(nm_energy_model_joules(&u, 2, 5, 1, 1e9, 0), 6 + 3 + 0.08, 1e-12);
    // half the clock: 4 s at 1 + 2 x (0.3 + 0.7 / 8) W, 1 s idle
    NM_CHECK_NEAR(nm_energy_model_joules(&u, 2, 5, 0.5, 0, 0), 4 * (1 + 2 * (0.3 + 0.7 * 0.125)) + 1, 1e-12);
    // the span shorter than the work: no idle part; another pJ figure
    NM_CHECK_NEAR(nm_energy_model_joules(&u, 2, 0, 1, 1e9, 100), 6 + 0.1, 1e-12);
    NM_CHECK(isnan(nm_energy_model_joules(&u, -1, 0, 1, 0, 0)));
    // a slower clock costs less down to a point, then more
    nm_unit_profile v = {.idle_w = 0, .active_w = 2};
    const double e1 = nm_energy_model_joules(&v, 1, 0, 1, 0, 0), e6 = nm_energy_model_joules(&v, 1, 0, 0.6, 0, 0),
                 e2 = nm_energy_model_joules(&v, 1, 0, 0.2, 0, 0);
    NM_CHECK(e6 < e1 && e2 > e6);
}

NM_TEST_MAIN()
