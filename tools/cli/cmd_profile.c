// nanomind profile: measure every compute unit once (each CPU cluster, each
// OpenCL device) into the profile file the planner reads (`run --plan`).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void profile_usage(void) {
    printf("usage: nanomind profile [--units LIST] [-o FILE] [--show] [--watts-only | --no-watts] [--sysfs DIR]\n"
           "\n"
           "Measures each compute unit: read bandwidth, matmul GFLOP/s by weight type (64 tokens of a\n"
           "1024 x 2048 weight), decoding's weight GB/s by type (one token over 160 MiB of weights),\n"
           "launch overhead, and its watts where an energy meter sees it; saves them for the planner (run --plan)\n"
           "and the energy model (assistant --stats/--json, power energy).\n"
           "\n"
           "  --units LIST  comma-separated units (default: each CPU cluster, then each OpenCL device):\n"
           "                cpu, cpu:big, cpu:little, cpu:cluster:N, cpu:CORES, opencl, opencl:N\n"
           "  -o FILE       where to save (default %s; \"-\": stdout)\n"
           "  --show        print the saved profile; measure nothing\n"
           "  --watts-only  measure the watts of the units in the saved profile, keep the rest\n"
           "  --no-watts    measure no watts (those of the saved profile are kept)\n"
           "  --sysfs DIR   where the meters are (default /sys; tests use a fake tree)\n"
           "  --watt-seconds S  seconds idle, then busy, for each unit's watts (default 2)\n"
           "  -h, --help    this help\n"
           "\n"
           "Watts: a CPU unit's from RAPL, else the board's input (INA3221 VDD_IN, the battery, hwmon);\n"
           "an OpenCL unit's from NVML (NVIDIA). Where no meter sees a unit its watts stay 0 (or what the\n"
           "saved profile had): edit idle_w and active_w in the file, else the energy model uses the\n"
           "board of docs/power.md.\n",
           "~/.cache/nanomind/profile.json");
}

bool cli_profile_path(char *buf, size_t size) {
    const char *home = getenv("HOME");
    if (!home || !*home) return false;
    snprintf(buf, size, "%s/.cache/nanomind/profile.json", home);
    return true;
}

int cli_load_units(const char *file, nm_unit_profile *units, int32_t *n_units) {
    char path[1024], err[512];
    if (!file && !cli_profile_path(path, sizeof path)) {
        fprintf(stderr, "error: no HOME: give --profile FILE\n");
        return 2;
    }
    if (!file) file = path;
    nm_status st = nm_units_load(file, units, NM_PLAN_MAX_UNITS, n_units, err, sizeof err);
    if (st != NM_OK) {
        fprintf(stderr, "error: %s (%s)%s\n", err, nm_status_str(st),
                st == NM_ERR_IO ? ": measure the units first with `nanomind profile`" : "");
        return 1;
    }
    return 0;
}

static void print_units(const nm_unit_profile *u, int32_t n) {
    // GGUF type ids: f32 0, f16 1, q4_0 2, q4_1 3, q5_0 6, q8_0 8, q4_K 12, q6_K 14
    printf("%-16s %9s %8s %8s %8s %8s %8s %8s %8s %9s %6s\n", "unit", "read GB/s", "f32", "f16", "q4_0", "q4_1",
           "q8_0", "q4_K", "q6_K", "launch us", "op us");
    for (int32_t i = 0; i < n; i++)
        printf("%-16s %9.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %9.1f %6.2f\n", u[i].name, u[i].read_gbps,
               u[i].gflops[0], u[i].gflops[1], u[i].gflops[2], u[i].gflops[3], u[i].gflops[8], u[i].gflops[12],
               u[i].gflops[14], u[i].launch_us, u[i].op_us);
    printf("(matmul GFLOP/s; 0: no kernel for that type)\n");
    printf("%-16s %9s %8s %8s %8s %8s %8s %8s %8s\n", "decode", "", "", "f16", "q4_0", "q4_1", "q8_0", "q4_K", "q6_K");
    for (int32_t i = 0; i < n; i++)
        printf("%-16s %9s %8s %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f\n", u[i].name, "", "", u[i].matvec_gbps[1],
               u[i].matvec_gbps[2], u[i].matvec_gbps[3], u[i].matvec_gbps[8], u[i].matvec_gbps[12],
               u[i].matvec_gbps[14]);
    printf("(one-token matmul over 160 MiB of weights: GB/s of weights; 0: not measured)\n");
    printf("%-16s %9s %9s\n", "watts", "idle", "busy");
    for (int32_t i = 0; i < n; i++)
        if (u[i].idle_w > 0 || u[i].active_w > 0) printf("%-16s %9.2f %9.2f\n", u[i].name, u[i].idle_w, u[i].active_w);
        else printf("%-16s %9s %9s\n", u[i].name, "-", "-");
    printf("(- : not known: the energy model uses the board of docs/power.md)\n");
}

// The watts of unit u measured into it; a unit no meter sees keeps what it
// had (the old profile's, or 0), and says so.
static void measure_watts(nm_unit_profile *u, const char *sysfs, double secs) {
    char src[256], err[512];
    // (the time is spent only where a meter sees the unit: the message comes after, not a promise before)
    if (nm_unit_measure_watts(u->name, sysfs, secs, secs, u, src, sizeof src, err, sizeof err) == NM_OK)
        fprintf(stderr, "watts of %s (%.1f s idle, %.1f s busy): %.2f W idle, %.2f W busy (measured: %s)\n", u->name,
                secs, secs, u->idle_w, u->active_w, src);
    else if (u->idle_w > 0 || u->active_w > 0)
        fprintf(stderr, "watts of %s: not measured (%s): kept %.2f W idle, %.2f W busy\n", u->name, err, u->idle_w,
                u->active_w);
    else
        fprintf(stderr, "watts of %s: not measured (%s): 0; the energy model uses the board of docs/power.md\n",
                u->name, err);
}

int cmd_profile(int argc, char **argv) {
    const char *units = NULL, *out = NULL, *sysfs = NULL;
    bool show = false, watts_only = false, no_watts = false;
    double secs = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            profile_usage();
            return 0;
        } else if (!strcmp(a, "--version")) {
            cli_print_version();
            return 0;
        } else if (!strcmp(a, "--show") || !strcmp(a, "--watts-only") || !strcmp(a, "--no-watts")) {
            *(!strcmp(a, "--show") ? &show : !strcmp(a, "--no-watts") ? &no_watts : &watts_only) = true;
        } else if (!strcmp(a, "--units") || !strcmp(a, "-o") || !strcmp(a, "--sysfs")) {
            if (!v || !*v) {
                fprintf(stderr, "error: %s needs a value\n", a);
                return 2;
            }
            *(!strcmp(a, "-o") ? &out : !strcmp(a, "--sysfs") ? &sysfs : &units) = v;
            i++;
        } else if (!strcmp(a, "--watt-seconds")) {
            char *end;
            secs = v ? strtod(v, &end) : 0;
            if (!v || end == v || *end || !(secs >= 0.1 && secs <= 600)) {
                fprintf(stderr, "error: --watt-seconds needs a number in [0.1, 600], got '%s'\n", v ? v : "");
                return 2;
            }
            i++;
        } else {
            fprintf(stderr, "error: nanomind profile does not take %s (see nanomind profile --help)\n", a);
            return 2;
        }
    }
    if (watts_only && (no_watts || show || units)) {
        fprintf(stderr, "error: --watts-only goes with neither %s\n", no_watts ? "--no-watts" : show ? "--show" : "--units");
        return 2;
    }
    char path[1024], err[512];
    if (!out && !cli_profile_path(path, sizeof path)) {
        fprintf(stderr, "error: no HOME to keep the profile in: give -o FILE\n");
        return 2;
    }
    if (!out) out = path;
    nm_unit_profile u[NM_PLAN_MAX_UNITS], old[NM_PLAN_MAX_UNITS];
    int32_t n = 0, n_old = 0;
    nm_status st;
    if (show || watts_only) {
        if ((st = nm_units_load(out, u, NM_PLAN_MAX_UNITS, &n, err, sizeof err)) != NM_OK) {
            fprintf(stderr, "error: %s (%s)%s\n", err, nm_status_str(st),
                    watts_only && st == NM_ERR_IO ? ": measure the units first with `nanomind profile`" : "");
            return 1;
        }
        if (show) {
            print_units(u, n);
            return 0;
        }
        for (int32_t i = 0; i < n; i++) measure_watts(&u[i], sysfs, secs);
    } else {
        // a saved profile's watts outlive a new measurement of its units where no meter sees them
        if (nm_units_load(out, old, NM_PLAN_MAX_UNITS, &n_old, err, sizeof err) != NM_OK) n_old = 0;
        // the units: as asked, or every CPU cluster and every OpenCL device
        char names[NM_PLAN_MAX_UNITS][64];
        int32_t n_names = 0;
        if (units) {
            const char *p = units;
            while (*p && n_names < NM_PLAN_MAX_UNITS) {
                size_t k = strcspn(p, ",");
                snprintf(names[n_names++], sizeof names[0], "%.*s", (int)k, p);
                p += k + (p[k] == ',');
            }
            if (*p) {
                fprintf(stderr, "error: --units: at most %d units\n", NM_PLAN_MAX_UNITS);
                return 2;
            }
        } else {
            nm_cpu_topology *t = malloc(sizeof *t);
            if (t && nm_cpu_topology_read(NULL, t, err, sizeof err) == NM_OK && t->n_clusters > 1) {
                for (int32_t c = 0; c < t->n_clusters && n_names < NM_PLAN_MAX_UNITS; c++)
                    snprintf(names[n_names++], sizeof names[0], "cpu:cluster:%d", (int)c);
            } else {
                snprintf(names[n_names++], sizeof names[0], "cpu");
            }
            free(t);
            nm_device_info d[NM_PLAN_MAX_UNITS + 1];
            const int32_t nd = nm_list_devices(d, NM_PLAN_MAX_UNITS + 1, false);
            for (int32_t i = 1; i < nd && i <= NM_PLAN_MAX_UNITS && n_names < NM_PLAN_MAX_UNITS; i++)
                snprintf(names[n_names++], sizeof names[0], "%s", d[i].name);
        }
        for (int32_t i = 0; i < n_names; i++) {
            fprintf(stderr, "measuring %s ...\n", names[i]);
            const double t0 = cli_now();
            if ((st = nm_unit_measure(names[i], &u[n], err, sizeof err)) != NM_OK) {
                fprintf(stderr, "error: %s (%s)\n", err, nm_status_str(st));
                return st == NM_ERR_INVALID_ARG ? 2 : 1;
            }
            fprintf(stderr, "  %.1f s\n", cli_now() - t0);
            for (int32_t k = 0; k < n_old; k++)
                if (!strcmp(old[k].name, u[n].name)) u[n].idle_w = old[k].idle_w, u[n].active_w = old[k].active_w;
            if (!no_watts) measure_watts(&u[n], sysfs, secs);
            n++;
        }
    }
    print_units(u, n);
    if ((st = nm_units_save(out, u, n, err, sizeof err)) != NM_OK) {
        fprintf(stderr, "error: %s\n", err);
        return 1;
    }
    if (strcmp(out, "-")) fprintf(stderr, "saved %s\n", out);
    return 0;
}
