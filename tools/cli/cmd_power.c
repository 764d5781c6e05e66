// nanomind power: what this machine offers for power awareness (status), a
// battery day replayed through the real policy and the energy model
// (simulate), the battery-life table (project), and the restore of
// frequencies a killed process left changed (restore). docs/power.md.
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"

static void power_usage(void) {
    printf("usage: nanomind power status   [--sysfs ROOT] [--no-nvml]\n"
           "       nanomind power simulate --trace CSV --out DIR [--workload SPEC] [--step S] [policy options]\n"
           "                               [--sysfs ROOT [--dry-run] [--record FILE] [--cpu-governor G]\n"
           "                                [--devfreq-governor G]]\n"
           "       nanomind power project  [--capacity-mah MAH] [--voltage V] [--workload SPEC] [policy options]\n"
           "       nanomind power restore  [--record FILE]\n"
           "       nanomind power energy   --cpu-s S --wall-s S [--bytes B] [--questions N] [--cores N]\n"
           "                               [--idle-w W] [--active-w W] [--pj-byte P] [--profile FILE]\n"
           "       nanomind power measure  [--sysfs ROOT] [--no-nvml] [--bytes B] [--questions N] [--profile FILE]\n"
           "                               -- COMMAND [ARGS]\n"
           "\n"
           "status    the battery, the energy meters and the DVFS actuators found on this machine\n"
           "simulate  replays a battery trace (CSV rows seconds,percent[,watts]) through the policy and the\n"
           "          energy model: DIR/timeline.csv (a row per step), DIR/timeline.svg (the plot); with\n"
           "          --sysfs, the DVFS targets are written under ROOT as the state changes (DIR/dvfs.log),\n"
           "          and put back at the end\n"
           "project   battery hours for voice-only and camera use, from the model (assumptions printed)\n"
           "restore   writes back the frequencies a killed nanomind left changed (its restore record)\n"
           "energy    the energy model of a run that used S CPU-seconds (all threads) over S seconds and moved\n"
           "          B bytes of DRAM, on N cores (default the CPU unit's) at the CPU unit's watts in the unit\n"
           "          profile (--profile, default ~/.cache/nanomind/profile.json: `nanomind profile`), else the\n"
           "          board's (0.25 idle, 2.5 busy), and 80 pJ a byte: the figure `assistant --stats` gives\n"
           "measure   runs COMMAND and gives its energy: measured by every meter found (RAPL, hwmon, the battery,\n"
           "          NVML) over its run, and modelled from its CPU time (and B bytes); exits with its status\n"
           "\n"
           "policy options: --t-high PCT (60) --t-low PCT (20) --hysteresis PTS (2) --fps-max F (2)\n"
           "                --fps-min F (0.25) --share-min S (0.25)\n"
           "--workload SPEC: comma-separated key=value (docs/power.md lists each key, its default and why):\n"
           "  requests=PER_HOUR camera=on|off idle_w= active_w= camera_w= resident_w= request_s= frame_s=\n"
           "  request_mb= frame_mb= load_s= load_mb= events=PER_HOUR fmin= pj_byte=\n"
           "--step S     seconds between simulated steps (default 60)\n"
           "--record F   the restore record (default ~/.cache/nanomind/power-restore.txt)\n");
}

// ---- the workload and its energy model

typedef struct workload {
    double requests;   // spoken questions an hour
    bool camera;       // frames encoded as the policy's fps allows
    double idle_w;     // the device idle (SoC, DRAM self-refresh, microphone)
    double active_w;   // the CPU cluster busy at its top clock
    double camera_w;   // the camera and ISP streaming at the top frame rate
    double resident_w; // keeping every brick's weights resident (DRAM refresh of used pages)
    double request_s;  // CPU-busy seconds of one request at the top clock (STT + LLM + TTS)
    double frame_s;    // CPU-busy seconds to encode one frame at the top clock
    double request_mb, frame_mb; // DRAM traffic
    double load_s, load_mb;      // the cascade: loading every brick once per request
    double events;     // critical with the camera: frames that differ enough to be encoded, an hour
    double fmin;       // the lowest clock as a share of the top one
    double pj_byte;    // DRAM energy per byte moved
} workload;

static workload workload_default(void) {
    return (workload){.requests = 20, .camera = false, .idle_w = CLI_BOARD_IDLE_W, .active_w = CLI_BOARD_ACTIVE_W, .camera_w = 0.35,
                      .resident_w = 0.05, .request_s = 6, .frame_s = 0.25, .request_mb = 600, .frame_mb = 120,
                      .load_s = 1.5, .load_mb = 400, .events = 30, .fmin = 0.3, .pj_byte = 80};
}

static bool parse_workload(const char *spec, workload *w) {
    char *copy = strdup(spec), *save = NULL;
    bool ok = copy != NULL;
    for (char *kv = copy ? strtok_r(copy, ",", &save) : NULL; ok && kv; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq) {
            fprintf(stderr, "error: --workload: '%s' is not key=value\n", kv);
            ok = false;
            break;
        }
        *eq = 0;
        const char *k = kv, *v = eq + 1;
        if (!strcmp(k, "camera")) {
            if (!strcmp(v, "on")) w->camera = true;
            else if (!strcmp(v, "off")) w->camera = false;
            else {
                fprintf(stderr, "error: --workload: camera needs on or off, got '%s'\n", v);
                ok = false;
            }
            continue;
        }
        struct { const char *k; double *p; double hi; } keys[] = {
            {"requests", &w->requests, 3600}, {"idle_w", &w->idle_w, 1000},     {"active_w", &w->active_w, 1000},
            {"camera_w", &w->camera_w, 1000}, {"resident_w", &w->resident_w, 1000},
            {"request_s", &w->request_s, 3600}, {"frame_s", &w->frame_s, 3600}, {"request_mb", &w->request_mb, 1e6},
            {"frame_mb", &w->frame_mb, 1e6},  {"load_s", &w->load_s, 3600},    {"load_mb", &w->load_mb, 1e6},
            {"events", &w->events, 36000},    {"fmin", &w->fmin, 1},           {"pj_byte", &w->pj_byte, 1e5},
        };
        bool found = false;
        for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
            if (strcmp(k, keys[i].k)) continue;
            found = true;
            char *end;
            double x = strtod(v, &end);
            if (end == v || *end || !isfinite(x) || x < 0 || x > keys[i].hi || (!strcmp(k, "fmin") && x <= 0)) {
                fprintf(stderr, "error: --workload: %s needs a number in %s0, %g], got '%s'\n", k,
                        !strcmp(k, "fmin") ? "(" : "[", keys[i].hi, v);
                ok = false;
            } else {
                *keys[i].p = x;
            }
        }
        if (!found) {
            fprintf(stderr, "error: --workload: unknown key '%s' (nanomind power --help lists them)\n", k);
            ok = false;
        }
    }
    free(copy);
    return ok;
}

// Joules of work that keeps the CPU busy busy_s at the top clock, run at a
// frequency share (the energy model: only the watts the work adds over idle).
static double work_joules(const workload *w, double busy_s, double mb, double freq_share) {
    nm_unit_profile u = {.idle_w = 0, .active_w = w->active_w - w->idle_w};
    const double speed = w->fmin + freq_share * (1 - w->fmin); // the clock as a share of the top one
    return nm_energy_model_joules(&u, busy_s, 0, speed, mb * 1e6, w->pj_byte);
}

typedef struct watts_parts {
    double total, base, camera, work;
} watts_parts;

// The average watts of the workload under the policy's targets.
static watts_parts workload_watts(const workload *w, const nm_power_targets *t, double fps_max) {
    watts_parts p = {0};
    p.base = w->idle_w + (t->cascade ? 0 : w->resident_w);
    double frames_h = 0;
    if (w->camera) {
        if (t->cascade) {
            // the sensor at a low rate for frame differencing; frames encoded on events only
            p.camera = w->camera_w * 0.3;
            frames_h = w->events;
        } else if (t->fps > 0) {
            p.camera = w->camera_w * (0.3 + 0.7 * (fps_max > 0 ? t->fps / fps_max : 1));
            frames_h = t->fps * 3600;
        }
    }
    double j_h = w->requests * work_joules(w, w->request_s, w->request_mb, t->freq_share) +
                 frames_h * work_joules(w, w->frame_s, w->frame_mb, t->freq_share);
    if (t->cascade) j_h += w->requests * work_joules(w, w->load_s, w->load_mb, t->freq_share);
    p.work = j_h / 3600;
    p.total = p.base + p.camera + p.work;
    return p;
}

// ---- options

typedef struct power_opts {
    const char *sysfs, *trace, *out, *record, *cpu_gov, *dev_gov, *workload, *profile;
    bool dry_run, no_nvml;
    double step, capacity_mah, voltage;
    nm_power_params pp;
    // energy
    double cpu_s, wall_s, bytes, questions, cores, idle_w, active_w, pj_byte;
} power_opts;

static bool num_opt(const char *opt, const char *v, double lo, double hi, double *out) {
    char *end;
    double x = v ? strtod(v, &end) : 0;
    if (!v || end == v || *end || !isfinite(x) || x < lo || x > hi) {
        fprintf(stderr, "error: %s needs a number in [%g, %g], got '%s'\n", opt, lo, hi, v ? v : "");
        return false;
    }
    *out = x;
    return true;
}

// 0 ok, else the exit status. `allowed` lists the options the subcommand takes.
static int parse_opts(const char *sub, int argc, char **argv, const char *allowed, power_opts *o) {
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            power_usage();
            return -1;
        }
        char key[64];
        snprintf(key, sizeof key, " %s ", a);
        if (a[0] != '-' || !strstr(allowed, key)) {
            fprintf(stderr, "error: power %s: unknown option '%s' (nanomind power --help)\n", sub, a);
            return 2;
        }
        if (!strcmp(a, "--dry-run")) {
            o->dry_run = true;
            continue;
        }
        if (!strcmp(a, "--no-nvml")) {
            o->no_nvml = true;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "error: %s needs a value\n", a);
            return 2;
        }
        const char *v = argv[++i];
        bool ok = true;
        if (!strcmp(a, "--sysfs")) o->sysfs = v;
        else if (!strcmp(a, "--trace")) o->trace = v;
        else if (!strcmp(a, "--out")) o->out = v;
        else if (!strcmp(a, "--record")) o->record = v;
        else if (!strcmp(a, "--cpu-governor")) o->cpu_gov = v;
        else if (!strcmp(a, "--devfreq-governor")) o->dev_gov = v;
        else if (!strcmp(a, "--workload")) o->workload = v;
        else if (!strcmp(a, "--profile")) o->profile = v;
        else if (!strcmp(a, "--step")) ok = num_opt(a, v, 0.001, 86400, &o->step);
        else if (!strcmp(a, "--capacity-mah")) ok = num_opt(a, v, 1, 1e7, &o->capacity_mah);
        else if (!strcmp(a, "--voltage")) ok = num_opt(a, v, 0.1, 1000, &o->voltage);
        else if (!strcmp(a, "--t-high")) ok = num_opt(a, v, 0, 100, &o->pp.t_high);
        else if (!strcmp(a, "--t-low")) ok = num_opt(a, v, 0, 100, &o->pp.t_low);
        else if (!strcmp(a, "--hysteresis")) ok = num_opt(a, v, 0, 100, &o->pp.hysteresis);
        else if (!strcmp(a, "--fps-max")) ok = num_opt(a, v, 0, 1000, &o->pp.fps_max);
        else if (!strcmp(a, "--fps-min")) ok = num_opt(a, v, 0, 1000, &o->pp.fps_min);
        else if (!strcmp(a, "--share-min")) ok = num_opt(a, v, 0, 1, &o->pp.share_min);
        else if (!strcmp(a, "--cpu-s")) ok = num_opt(a, v, 0, 1e9, &o->cpu_s);
        else if (!strcmp(a, "--wall-s")) ok = num_opt(a, v, 1e-9, 1e9, &o->wall_s);
        else if (!strcmp(a, "--bytes")) ok = num_opt(a, v, 0, 1e18, &o->bytes);
        else if (!strcmp(a, "--questions")) ok = num_opt(a, v, 1, 1e9, &o->questions);
        else if (!strcmp(a, "--cores")) ok = num_opt(a, v, 1, 4096, &o->cores);
        else if (!strcmp(a, "--idle-w")) ok = num_opt(a, v, 0, 1e5, &o->idle_w);
        else if (!strcmp(a, "--active-w")) ok = num_opt(a, v, 0, 1e5, &o->active_w);
        else if (!strcmp(a, "--pj-byte")) ok = num_opt(a, v, 0, 1e5, &o->pj_byte);
        if (!ok) return 2;
    }
    char err[256];
    if (nm_power_params_check(&o->pp, err, sizeof err) != NM_OK) {
        fprintf(stderr, "error: %s\n", err);
        return 2;
    }
    return 0;
}

// ---- status

static int power_status(const power_opts *o) {
    char err[512], buf[8192];
    nm_battery *b = NULL;
    nm_status st = nm_battery_open_sysfs(o->sysfs, NULL, &b, err, sizeof err);
    printf("battery:\n");
    if (st == NM_OK) {
        nm_battery_reading r;
        nm_battery_read(b, 0, &r);
        nm_battery_describe(b, buf, sizeof buf);
        printf("  %s: %.1f %%%s%s", buf, r.raw_pct, r.accepted ? "" : " (", r.accepted ? "" : r.note);
        if (!r.accepted) printf(")");
        if (isfinite(r.watts)) printf(", %.3f W", r.watts);
        printf(", %s\n", r.charging == 1 ? "charging" : r.charging == 0 ? "discharging" : "status unknown");
        nm_battery_free(b);
    } else {
        printf("  none (%s): the policy needs a trace (power simulate) or a fixed charge\n", err);
    }
    nm_energy_meters *m = NULL;
    printf("energy meters:\n");
    if (nm_energy_meters_open(o->sysfs, !o->no_nvml, &m, err, sizeof err) == NM_OK) {
        int32_t n = nm_energy_meters_describe(m, buf, sizeof buf);
        if (n > 0) {
            char *save = NULL;
            for (char *l = strtok_r(buf, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) printf("  %s\n", l);
        }
        if (nm_energy_meters_count(m) == 0) printf("  none readable: energy is modelled (docs/power.md)\n");
        nm_energy_meters_free(m);
    } else {
        printf("  %s\n", err);
    }
    printf("DVFS actuators:\n");
    nm_actuator_params ap = nm_actuator_default_params();
    ap.sysfs_root = o->sysfs;
    ap.dry_run = true; // look, never write
    nm_power_actuators *a = NULL;
    if (nm_power_actuators_open(&ap, &a, err, sizeof err) == NM_OK) {
        nm_power_actuators_describe(a, buf, sizeof buf);
        char *save = NULL;
        for (char *l = strtok_r(buf, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) printf("  %s\n", l);
        nm_power_actuators_free(a);
    } else {
        printf("  none (%s)\n", err);
    }
    return 0;
}

// ---- simulate

typedef struct sim_row {
    double t, raw, pct, alpha, fps, share, freq, watts, energy;
    int state, threads;
} sim_row;

static void svg_panel(FILE *f, const sim_row *r, int n, int y0, int h, const char *title, double lo, double hi,
                      int field, const char *colour, const nm_power_params *pp) {
    const int x0 = 70, w = 820;
    const double t0 = r[0].t, t1 = r[n - 1].t > t0 ? r[n - 1].t : t0 + 1;
    fprintf(f, "<rect x='%d' y='%d' width='%d' height='%d' fill='none' stroke='#888'/>\n", x0, y0, w, h);
    fprintf(f, "<text x='%d' y='%d' font-size='12'>%s</text>\n", x0, y0 - 4, title);
    fprintf(f, "<text x='%d' y='%d' font-size='10' text-anchor='end'>%g</text>\n", x0 - 4, y0 + 10, hi);
    fprintf(f, "<text x='%d' y='%d' font-size='10' text-anchor='end'>%g</text>\n", x0 - 4, y0 + h, lo);
    if (field == 0) { // the battery panel: the states as bands, the thresholds as dashed lines
        static const char *band[3] = {"#e6f4e6", "#fff4d6", "#fbe0e0"};
        int start = 0;
        for (int i = 1; i <= n; i++) {
            if (i < n && r[i].state == r[start].state) continue;
            double xa = x0 + w * (r[start].t - t0) / (t1 - t0), xb = x0 + w * (r[i - 1 < n - 1 ? i : n - 1].t - t0) / (t1 - t0);
            fprintf(f, "<rect x='%.1f' y='%d' width='%.1f' height='%d' fill='%s'/>\n", xa, y0, xb - xa > 0 ? xb - xa : 0.5,
                    h, band[r[start].state]);
            start = i;
        }
        const double th[2] = {pp->t_high, pp->t_low};
        for (int k = 0; k < 2; k++)
            fprintf(f, "<line x1='%d' x2='%d' y1='%.1f' y2='%.1f' stroke='#c33' stroke-dasharray='4,3'/>\n", x0, x0 + w,
                    y0 + h * (1 - (th[k] - lo) / (hi - lo)), y0 + h * (1 - (th[k] - lo) / (hi - lo)));
    }
    fprintf(f, "<polyline fill='none' stroke='%s' stroke-width='1.5' points='", colour);
    for (int i = 0; i < n; i++) {
        double v = field == 0 ? r[i].pct : field == 1 ? r[i].alpha : field == 2 ? r[i].watts : r[i].fps;
        if (!isfinite(v)) continue;
        double y = y0 + h * (1 - (v - lo) / (hi - lo));
        fprintf(f, "%.1f,%.1f ", x0 + w * (r[i].t - t0) / (t1 - t0), y);
    }
    fprintf(f, "'/>\n");
}

static bool write_svg(const char *path, const sim_row *r, int n, const nm_power_params *pp, char *err, size_t es) {
    nm_outfile o = {0};
    if (nm_outfile_open(&o, path, err, es) != NM_OK) return false;
    FILE *f = o.f;
    double wmax = 0, fmax = 0;
    for (int i = 0; i < n; i++) {
        if (r[i].watts > wmax) wmax = r[i].watts;
        if (r[i].fps > fmax) fmax = r[i].fps;
    }
    wmax = wmax > 0 ? ceil(wmax * 1.1 * 10) / 10 : 1;
    fmax = fmax > 0 ? ceil(fmax * 1.1 * 10) / 10 : 1;
    fprintf(f, "<svg xmlns='http://www.w3.org/2000/svg' width='920' height='760' font-family='sans-serif'>\n"
               "<rect width='920' height='760' fill='white'/>\n");
    fprintf(f, "<text x='70' y='18' font-size='14'>nanomind power simulate: battery, state (green unconstrained, "
               "yellow proportional, red critical), alpha, watts, fps</text>\n");
    svg_panel(f, r, n, 40, 160, "battery % (dashed: t_high, t_low)", 0, 100, 0, "#1f4e9c", pp);
    svg_panel(f, r, n, 225, 120, "alpha", 0, 1, 1, "#7a3d9c", pp);
    svg_panel(f, r, n, 370, 150, "watts (modelled)", 0, wmax, 2, "#c25a00", pp);
    svg_panel(f, r, n, 545, 150, "camera fps", 0, fmax, 3, "#2a8a2a", pp);
    const double hours = (r[n - 1].t - r[0].t) / 3600;
    for (int k = 0; k <= 4; k++)
        fprintf(f, "<text x='%.1f' y='715' font-size='10' text-anchor='middle'>%.1f h</text>\n", 70 + 820 * k / 4.0,
                r[0].t / 3600 + hours * k / 4);
    fprintf(f, "</svg>\n");
    return nm_outfile_commit(&o, err, es) == NM_OK;
}

static int power_simulate(const power_opts *o, const workload *w) {
    char err[1024], path[1200];
    if (!o->trace || !o->out) {
        fprintf(stderr, "error: power simulate needs --trace CSV and --out DIR\n");
        return 2;
    }
    if (mkdir(o->out, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "error: --out %s: %s\n", o->out, strerror(errno));
        return 1;
    }
    struct stat sb;
    if (stat(o->out, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "error: --out %s: not a folder\n", o->out);
        return 1;
    }
    nm_battery *b = NULL;
    if (nm_battery_open_trace(o->trace, &b, err, sizeof err) != NM_OK) {
        fprintf(stderr, "error: %s\n", err);
        return 1;
    }
    nm_power_policy pol;
    nm_power_policy_init(&pol, &o->pp, NULL, 0);
    nm_power_actuators *act = NULL;
    FILE *dvfs_log = NULL;
    nm_outfile logf = {0};
    int rc = 0;
    if (o->sysfs) {
        snprintf(path, sizeof path, "%s/dvfs.log", o->out);
        if (nm_outfile_open(&logf, path, err, sizeof err) != NM_OK) {
            fprintf(stderr, "error: %s\n", err);
            nm_battery_free(b);
            return 1;
        }
        dvfs_log = logf.f;
        nm_actuator_params ap = nm_actuator_default_params();
        ap.sysfs_root = o->sysfs;
        ap.record = o->record;
        ap.dry_run = o->dry_run;
        ap.cpu_governor = o->cpu_gov;
        ap.devfreq_governor = o->dev_gov;
        ap.log = dvfs_log;
        if (nm_power_actuators_open(&ap, &act, err, sizeof err) != NM_OK) {
            fprintf(stderr, "error: %s\n", err);
            nm_outfile_abort(&logf);
            nm_battery_free(b);
            return 1;
        }
        nm_power_actuators_guard(act);
    }
    double t0, t1;
    nm_battery_span(b, &t0, &t1);
    const double step = o->step > 0 ? o->step : 60;
    const int64_t n_steps = (int64_t)floor((t1 - t0) / step + 1e-9) + 1;
    if (n_steps > 10 * 1000 * 1000) {
        fprintf(stderr, "error: %lld steps (the trace spans %g s at --step %g): raise --step\n", (long long)n_steps,
                t1 - t0, step);
        nm_power_actuators_free(act);
        nm_outfile_abort(&logf);
        nm_battery_free(b);
        return 2;
    }
    sim_row *rows = calloc((size_t)n_steps, sizeof *rows);
    nm_outfile csv = {0};
    snprintf(path, sizeof path, "%s/timeline.csv", o->out);
    if (!rows || nm_outfile_open(&csv, path, err, sizeof err) != NM_OK) {
        fprintf(stderr, "error: %s\n", rows ? err : "out of memory");
        free(rows);
        nm_power_actuators_free(act);
        nm_outfile_abort(&logf);
        nm_battery_free(b);
        return 1;
    }
    fprintf(csv.f, "time_s,battery_raw_pct,battery_pct,state,alpha,fps,decode_share,freq_share,threads,watts,"
                   "energy_j,battery_w,note\n");
    double energy = 0;
    int changes = 0, rejected = 0;
    nm_power_state prev = (nm_power_state)-1;
    for (int64_t i = 0; i < n_steps; i++) {
        const double t = t0 + (double)i * step;
        nm_battery_reading r;
        nm_battery_read(b, t, &r);
        if (!r.accepted) rejected++;
        nm_power_targets tg = nm_power_policy_step(&pol, r.pct);
        watts_parts wp = workload_watts(w, &tg, o->pp.fps_max);
        if (i > 0) energy += wp.total * step;
        if (act && nm_power_actuators_apply(act, &tg, err, sizeof err) != NM_OK) {
            fprintf(stderr, "error: at %g s: %s\n", t, err);
            rc = 1;
            break;
        }
        if (tg.state != prev) {
            if (i > 0) changes++;
            if (dvfs_log) fprintf(dvfs_log, "# %g s: %s, alpha %.3f\n", t, nm_power_state_name(tg.state), tg.alpha);
            prev = tg.state;
        }
        rows[i] = (sim_row){t, r.raw_pct, r.pct, tg.alpha, tg.fps, tg.decode_share, tg.freq_share, wp.total, energy,
                            (int)tg.state, tg.n_threads};
        fprintf(csv.f, "%g,%g,%g,%s,%.4f,%.4f,%.4f,%.4f,%d,%.4f,%.1f,%g,%s\n", t, r.raw_pct, r.pct,
                nm_power_state_name(tg.state), tg.alpha, tg.fps, tg.decode_share, tg.freq_share, tg.n_threads,
                wp.total, energy, r.watts, r.note);
    }
    if (act) {
        if (nm_power_actuators_restore(act, err, sizeof err) != NM_OK) {
            fprintf(stderr, "error: %s\n", err);
            rc = 1;
        }
        nm_power_actuators_free(act);
    }
    if (rc == 0 && nm_outfile_commit(&csv, err, sizeof err) != NM_OK) {
        fprintf(stderr, "error: %s\n", err);
        rc = 1;
    }
    if (rc != 0) nm_outfile_abort(&csv);
    if (dvfs_log) {
        if (rc == 0 && nm_outfile_commit(&logf, err, sizeof err) != NM_OK) {
            fprintf(stderr, "error: %s\n", err);
            rc = 1;
        }
        if (rc != 0) nm_outfile_abort(&logf);
    }
    if (rc == 0) {
        snprintf(path, sizeof path, "%s/timeline.svg", o->out);
        if (!write_svg(path, rows, (int)n_steps, &o->pp, err, sizeof err)) {
            fprintf(stderr, "error: %s\n", err);
            rc = 1;
        }
    }
    if (rc == 0)
        printf("%lld steps over %.2f h: %d state changes, %d readings rejected or held, %.1f J (%.3f Wh) modelled; "
               "%s/timeline.csv, %s/timeline.svg%s%s\n",
               (long long)n_steps, (t1 - t0) / 3600, changes, rejected, energy, energy / 3600, o->out, o->out,
               o->sysfs ? ", " : "", o->sysfs ? "dvfs.log" : "");
    free(rows);
    nm_battery_free(b);
    return rc;
}

// ---- project

// Hours from full to empty under the policy (the charge falling, so each
// threshold is crossed once), and from the thresholds' bands.
static double policy_hours(const workload *w, const nm_power_params *pp, double wh) {
    nm_power_policy pol;
    nm_power_policy_init(&pol, pp, NULL, 0);
    double hours = 0;
    const double d = 0.05; // percent a step
    for (double b = 100; b > 0; b -= d) {
        nm_power_targets t = nm_power_policy_step(&pol, b - d / 2);
        hours += wh * d / 100 / workload_watts(w, &t, pp->fps_max).total;
    }
    return hours;
}

static int power_project(const power_opts *o, const workload *base) {
    const double wh = o->capacity_mah * o->voltage / 1000;
    nm_power_targets full = {.state = NM_POWER_UNCONSTRAINED, .alpha = 1, .fps = o->pp.fps_max, .decode_share = 1,
                             .freq_share = 1};
    nm_power_targets half = full, crit = full;
    nm_power_policy pol;
    nm_power_policy_init(&pol, &o->pp, NULL, 0);
    half = nm_power_policy_step(&pol, (o->pp.t_high + o->pp.t_low) / 2);
    crit = nm_power_policy_step(&pol, o->pp.t_low / 2);
    printf("battery: %.0f mAh x %.2f V = %.2f Wh\n\n", o->capacity_mah, o->voltage, wh);
    printf("%-12s %-36s %8s %8s %8s %8s %8s\n", "mode", "state", "watts", "base", "camera", "work", "hours");
    for (int cam = 0; cam < 2; cam++) {
        workload w = *base;
        w.camera = cam;
        const char *mode = cam ? "camera" : "voice-only";
        const nm_power_targets *ts[3] = {&full, &half, &crit};
        const char *names[3] = {"unconstrained throughout", "proportional (alpha 0.5) throughout",
                                "critical (cascade) throughout"};
        for (int k = 0; k < 3; k++) {
            watts_parts p = workload_watts(&w, ts[k], o->pp.fps_max);
            printf("%-12s %-36s %8.3f %8.3f %8.3f %8.3f %8.1f\n", mode, names[k], p.total, p.base, p.camera, p.work,
                   wh / p.total);
        }
        double h = policy_hours(&w, &o->pp, wh);
        printf("%-12s %-36s %8.3f %8s %8s %8s %8.1f\n", mode, "the policy, 100 % to 0 %", wh / h, "", "", "", h);
    }
    printf("\nthe paper (2000 mAh): ~20.8 h voice-only (18.8 h in a later version), ~12 h with the camera\n");
    printf("\nassumptions (--workload overrides; docs/power.md says where each comes from):\n"
           "  requests %.0f/h; idle %.3f W; CPU busy at the top clock %.2f W; camera %.2f W at %g fps;\n"
           "  resident weights %.3f W; a request %.2f CPU-s and %.0f MB of DRAM traffic, a frame %.2f CPU-s and "
           "%.0f MB;\n  the cascade loads %.2f CPU-s and %.0f MB a request, encodes %g event frames/h; lowest clock "
           "%.0f %% of the top;\n  DRAM %.0f pJ/byte; the work's watts above idle scale as clock^3, its time as "
           "1/clock\n",
           base->requests, base->idle_w, base->active_w, base->camera_w, o->pp.fps_max, base->resident_w,
           base->request_s, base->request_mb, base->frame_s, base->frame_mb, base->load_s, base->load_mb,
           base->events, base->fmin * 100, base->pj_byte);
    printf("  policy: t_high %g %%, t_low %g %%, hysteresis %g, fps %g..%g, share_min %g\n", o->pp.t_high,
           o->pp.t_low, o->pp.hysteresis, o->pp.fps_min, o->pp.fps_max, o->pp.share_min);
    return 0;
}

// ---- energy

static bool given(int argc, char **argv, const char *opt) {
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], opt)) return true;
    return false;
}

static int power_energy(const power_opts *o, int argc, char **argv) {
    if (!given(argc, argv, "--cpu-s") || !given(argc, argv, "--wall-s")) {
        fprintf(stderr, "error: power energy needs --cpu-s and --wall-s (what the run used)\n");
        return 2;
    }
    cli_energy e;
    if (!cli_energy_load(o->profile, &e)) return 1;
    if (given(argc, argv, "--cores")) e.n_cores = (int32_t)o->cores;
    if (given(argc, argv, "--idle-w")) e.idle_w = o->idle_w;
    if (given(argc, argv, "--active-w")) e.active_w = o->active_w;
    if (given(argc, argv, "--idle-w") || given(argc, argv, "--active-w"))
        snprintf(e.source, sizeof e.source, "--idle-w and --active-w%s", given(argc, argv, "--idle-w") &&
                 given(argc, argv, "--active-w") ? "" : ", the other one's default");
    if (given(argc, argv, "--pj-byte")) e.pj_byte = o->pj_byte;
    if (e.active_w < e.idle_w) {
        fprintf(stderr, "error: --active-w %.3f is below --idle-w %.3f\n", e.active_w, e.idle_w);
        return 2;
    }
    const double q = o->questions > 0 ? o->questions : 1, j = cli_energy_run(&e, o->cpu_s, o->wall_s, o->bytes);
    printf("modelled: %.3f J, %.3f J a question (%.0f): %.3f CPU-s on %d cores in %.3f s, %.1f MB at %.0f pJ a byte; "
           "%.2f W idle, %.2f W with every core busy (%s)\n",
           j, j / q, q, o->cpu_s, e.n_cores, o->wall_s, o->bytes / 1e6, e.pj_byte > 0 ? e.pj_byte : 80.0, e.idle_w,
           e.active_w, e.source);
    fflush(stdout);
    if (o->cpu_s > o->wall_s * e.n_cores * 1.05)
        fprintf(stderr, "note: %.3f CPU-s in %.3f s is more than %d cores give: the cores are counted busy the whole "
                        "time\n", o->cpu_s, o->wall_s, e.n_cores);
    return 0;
}

// Runs argv (after "--") and reports its energy, measured and modelled; its exit status.
static int power_measure(const power_opts *o, int argc, char **argv) {
    char err[512];
    cli_energy e; // the model's watts (a --profile that cannot be read: nothing runs)
    if (!cli_energy_load(o->profile, &e)) return 1;
    nm_energy_meters *m = NULL;
    if (nm_energy_meters_open(o->sysfs, !o->no_nvml, &m, err, sizeof err) != NM_OK) {
        fprintf(stderr, "error: energy meters: %s\n", err);
        return 1;
    }
    if (nm_energy_meters_count(m) > 0 && nm_energy_meters_start(m, err, sizeof err) != NM_OK) {
        fprintf(stderr, "error: energy meters: %s\n", err);
        nm_energy_meters_free(m);
        return 1;
    }
    fflush(NULL);
    const double t0 = cli_now();
    const pid_t pid = fork();
    if (pid == 0) {
        execvp(argv[0], argv);
        fprintf(stderr, "error: power measure: %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    int status = 0;
    struct rusage ru = {0};
    bool waited = false;
    if (pid > 0) {
        // the command's Ctrl-C is its own: this process waits for it (and reports) rather than dying first
        struct sigaction ign = {.sa_handler = SIG_IGN}, old_int, old_quit;
        sigemptyset(&ign.sa_mask);
        sigaction(SIGINT, &ign, &old_int);
        sigaction(SIGQUIT, &ign, &old_quit);
        pid_t w;
        while ((w = wait4(pid, &status, 0, &ru)) < 0 && errno == EINTR) {
        }
        waited = w == pid;
        sigaction(SIGINT, &old_int, NULL);
        sigaction(SIGQUIT, &old_quit, NULL);
    } else {
        fprintf(stderr, "error: power measure: fork: %s\n", strerror(errno));
    }
    const double wall = cli_now() - t0;
    nm_energy_reading r = {0};
    bool measured = nm_energy_meters_count(m) > 0;
    if (measured && nm_energy_meters_stop(m, &r, err, sizeof err) != NM_OK) {
        fprintf(stderr, "energy meters: %s\n", err);
        measured = false;
    }
    nm_energy_meters_free(m);
    if (!waited) return 1;
    const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
    const double cpu = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
                       ru.ru_stime.tv_usec * 1e-6;
    const double q = o->questions > 0 ? o->questions : 1;
    const double j = cli_energy_run(&e, cpu, wall, o->bytes);
    fprintf(stderr, "power measure: %s exited %d: %.3f s, %.3f CPU-s (children included)\n", argv[0], rc, wall, cpu);
    fprintf(stderr, "  modelled: %.3f J, %.3f J a question (%.0f): the CPU time on %d cores at %.2f W idle, %.2f W busy "
                    "(%s), %.1f MB at 80 pJ a byte\n", j, j / q, q, e.n_cores, e.idle_w, e.active_w, e.source,
            o->bytes / 1e6);
    for (int32_t i = 0; measured && i < r.n; i++)
        fprintf(stderr, "  measured: %s: %.3f J, %.3f J a question, %.3f W on average\n", r.name[i], r.joules[i],
                r.joules[i] / q, r.seconds > 0 ? r.joules[i] / r.seconds : 0.0);
    if (!measured) fprintf(stderr, "  measured: no energy meter on this machine\n");
    return rc;
}

int cmd_power(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        power_usage();
        return argc < 2 ? 2 : 0;
    }
    const char *sub = argv[1];
    power_opts o = {.step = 60, .capacity_mah = 2000, .voltage = 3.7, .pp = nm_power_default_params()};
    const char *policy = " --t-high --t-low --hysteresis --fps-max --fps-min --share-min ";
    char allowed[512];
    int rc;
    if (!strcmp(sub, "status")) {
        rc = parse_opts(sub, argc - 2, argv + 2, " --sysfs --no-nvml ", &o);
        return rc < 0 ? 0 : rc ? rc : power_status(&o);
    }
    if (!strcmp(sub, "restore")) {
        rc = parse_opts(sub, argc - 2, argv + 2, " --record ", &o);
        if (rc) return rc < 0 ? 0 : rc;
        char path[1024], err[1200];
        const char *rec = o.record;
        if (!rec) {
            const char *home = getenv("HOME");
            if (!home || !*home) {
                fprintf(stderr, "error: no HOME: give --record FILE\n");
                return 2;
            }
            snprintf(path, sizeof path, "%s/.cache/nanomind/power-restore.txt", home);
            rec = path;
        }
        struct stat sb;
        if (stat(rec, &sb) != 0 && errno == ENOENT) {
            printf("nothing to restore: no record at %s\n", rec);
            return 0;
        }
        if (nm_power_restore_record(rec, stdout, err, sizeof err) != NM_OK) {
            fprintf(stderr, "error: %s\n", err);
            return 1;
        }
        printf("restored; %s removed\n", rec);
        return 0;
    }
    workload w = workload_default();
    if (!strcmp(sub, "simulate")) {
        snprintf(allowed, sizeof allowed,
                 "%s--trace --out --workload --step --sysfs --dry-run --record --cpu-governor --devfreq-governor ",
                 policy);
        rc = parse_opts(sub, argc - 2, argv + 2, allowed, &o);
        if (rc) return rc < 0 ? 0 : rc;
        if (o.workload && !parse_workload(o.workload, &w)) return 2;
        if ((o.dry_run || o.record || o.cpu_gov || o.dev_gov) && !o.sysfs) {
            fprintf(stderr, "error: --dry-run, --record and the governors need --sysfs ROOT\n");
            return 2;
        }
        return power_simulate(&o, &w);
    }
    if (!strcmp(sub, "project")) {
        snprintf(allowed, sizeof allowed, "%s--capacity-mah --voltage --workload ", policy);
        rc = parse_opts(sub, argc - 2, argv + 2, allowed, &o);
        if (rc) return rc < 0 ? 0 : rc;
        if (o.workload && !parse_workload(o.workload, &w)) return 2;
        return power_project(&o, &w);
    }
    if (!strcmp(sub, "energy")) {
        rc = parse_opts(sub, argc - 2, argv + 2, " --cpu-s --wall-s --bytes --questions --cores --idle-w --active-w "
                        "--pj-byte --profile ", &o);
        if (rc) return rc < 0 ? 0 : rc;
        return power_energy(&o, argc - 2, argv + 2);
    }
    if (!strcmp(sub, "measure")) {
        int dash = 2;
        while (dash < argc && strcmp(argv[dash], "--")) dash++;
        rc = parse_opts(sub, dash - 2, argv + 2, " --sysfs --no-nvml --bytes --questions --profile ", &o);
        if (rc) return rc < 0 ? 0 : rc;
        if (dash + 1 >= argc) {
            fprintf(stderr, "error: power measure needs the command after --\n");
            return 2;
        }
        return power_measure(&o, argc - dash - 1, argv + dash + 1);
    }
    fprintf(stderr, "error: power: unknown subcommand '%s' (status, simulate, project, restore, energy, measure)\n", sub);
    return 2;
}
