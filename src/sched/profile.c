// Unit profiles (include/nanomind.h, "the planner"; docs/scheduler.md): each
// compute unit measured once, through the same backend interface the bricks
// use, and kept in a JSON file for the planner.
//
//   read_gbps   CPU: a STREAM-style sum over every core of the cluster
//               (nm_cpu_read_gbps on a thread bound to it); OpenCL: the
//               device's read kernel (nm_list_devices' figure).
//   gflops[t]   a 64-token matmul of a 1024 x 2048 weight of type t (random
//               values, quantized), best of 3 after a warm-up; 0 where the
//               backend does not run that type.
//   gflops_f32  the same with f32 weights (what the other arithmetic runs at).
//   matvec_gbps[t]  decoding: a one-token matmul over 160 MiB of weights of
//               type t (far past any last-level cache: streamed from memory),
//               its weight bytes over its time, best of 3 after a warm-up.
//   launch_us   the mean time of one tiny matmul, submitted and waited for.
//   op_us       the cost of one op beyond its bytes: the 160 MiB q4_0 matvec
//               cut into ~1,100 matmuls of 64 rows, against it in one op.
//   watts       measured apart (nm_unit_measure_watts) where a meter sees the
//               unit: idle, then busy with its f32 matmul; else 0 (edit them).
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/registry.h"
#include "core/clock.h"
#include "core/fail.h"
#include "quant/quant.h"


// The weight types the profile measures: those of the default models and llama.cpp's common files.
static const uint32_t measured[] = {NM_TYPE_F32, NM_TYPE_F16, NM_TYPE_Q4_0, NM_TYPE_Q4_1, NM_TYPE_Q5_0,
                                    NM_TYPE_Q8_0, NM_TYPE_Q4_K, NM_TYPE_Q5_K, NM_TYPE_Q6_K};

#define MM_O 1024
#define MM_K 2048
#define MM_T 64

// GFLOP/s of a MM_T-token matmul of type t on backend be (0: it does not run it).
static double matmul_gflops(nm_backend *be, uint32_t t, const float *wf, const float *x, float *y, void *wq) {
    const size_t rb = nm_row_size(t, MM_K);
    for (int64_t o = 0; o < MM_O; o++) nm_quantize_row_ref(t, wf + o * MM_K, (uint8_t *)wq + o * rb, MM_K);
    nm_tensor W = {.type = t, .ne = {MM_K, MM_O, 1, 1}, .offs = (size_t)(uintptr_t)wq};
    nm_tensor X = {.type = NM_TYPE_F32, .ne = {MM_K, MM_T, 1, 1}, .offs = (size_t)(uintptr_t)x};
    nm_tensor Y = {.type = NM_TYPE_F32, .ne = {MM_O, MM_T, 1, 1}, .offs = (size_t)(uintptr_t)y};
    nm_op op = {.kind = NM_OP_MATMUL, .src0 = &W, .src1 = &X, .dst = &Y};
    if (!nm_backend_supports_op(be, &op)) return 0;
    if (nm_backend_run(be, &op, 1) != NM_OK) return 0; // warm-up
    double best = 0;
    for (int r = 0; r < 3; r++) {
        const double t0 = nm_now_s();
        if (nm_backend_run(be, &op, 1) != NM_OK) return 0;
        const double dt = nm_now_s() - t0, gf = 2.0 * MM_O * MM_K * MM_T / dt / 1e9;
        if (dt > 0 && gf > best) best = gf;
    }
    return best;
}

#define MV_K 4096
#define MV_BYTES (160u << 20)
#define MV_MAX_ROWS (MV_BYTES / 2304 + 1) // rows of the fewest bytes (4.5 bits a weight at K 4096)

// Weight GB/s of a one-token matmul of type t over MV_BYTES of weights (0:
// the backend does not run it). The first 64 rows are quantized from wf, the
// rest repeat them: the time does not depend on the values.
static double matvec_gbps(nm_backend *be, uint32_t t, const float *wf, const float *x, float *y, uint8_t *big) {
    const size_t rb = nm_row_size(t, MV_K);
    const int64_t rows = (int64_t)(MV_BYTES / rb) < MV_MAX_ROWS ? (int64_t)(MV_BYTES / rb) : MV_MAX_ROWS;
    for (int64_t o = 0; o < 64; o++) nm_quantize_row_ref(t, wf + o * MV_K, big + o * rb, MV_K);
    for (int64_t o = 64; o < rows; o++) memcpy(big + o * rb, big + (o % 64) * rb, rb);
    nm_tensor W = {.type = t, .ne = {MV_K, rows, 1, 1}, .offs = (size_t)(uintptr_t)big};
    nm_tensor X = {.type = NM_TYPE_F32, .ne = {MV_K, 1, 1, 1}, .offs = (size_t)(uintptr_t)x};
    nm_tensor Y = {.type = NM_TYPE_F32, .ne = {rows, 1, 1, 1}, .offs = (size_t)(uintptr_t)y};
    nm_op op = {.kind = NM_OP_MATMUL, .src0 = &W, .src1 = &X, .dst = &Y};
    if (!nm_backend_supports_op(be, &op) || nm_backend_run(be, &op, 1) != NM_OK) return 0;
    double best = 0;
    for (int r = 0; r < 3; r++) {
        const double t0 = nm_now_s();
        if (nm_backend_run(be, &op, 1) != NM_OK) return 0;
        const double dt = nm_now_s() - t0, gbps = (double)rows * (double)rb / dt / 1e9;
        if (dt > 0 && gbps > best) best = gbps;
    }
    return best;
}

// Launch overhead: a 64 x 64 f32 matmul of one token, submitted and waited for, 50 times.
static double launch_us(nm_backend *be, const float *wf, const float *x, float *y) {
    nm_tensor W = {.type = NM_TYPE_F32, .ne = {64, 64, 1, 1}, .offs = (size_t)(uintptr_t)wf};
    nm_tensor X = {.type = NM_TYPE_F32, .ne = {64, 1, 1, 1}, .offs = (size_t)(uintptr_t)x};
    nm_tensor Y = {.type = NM_TYPE_F32, .ne = {64, 1, 1, 1}, .offs = (size_t)(uintptr_t)y};
    nm_op op = {.kind = NM_OP_MATMUL, .src0 = &W, .src1 = &X, .dst = &Y};
    if (nm_backend_run(be, &op, 1) != NM_OK) return 0;
    const double t0 = nm_now_s();
    for (int r = 0; r < 50; r++)
        if (nm_backend_run(be, &op, 1) != NM_OK) return 0;
    return (nm_now_s() - t0) / 50 * 1e6;
}

#define OPS_ROWS 64

// Dispatch cost of one op inside a pass: the 160 MiB q4_0 matvec above cut
// into matmuls of OPS_ROWS rows (~147 KiB of weights each, as a small model's
// projections), submitted as one pass, against the same bytes in one op:
// (t_cut - t_whole) / ops, best of 3 each. Each op's split over the threads
// and its barrier are what a decode step pays beyond its bytes.
static double op_us(nm_backend *be, const float *wf, const float *x, float *y, uint8_t *big) {
    const uint32_t t = NM_TYPE_Q4_0;
    const size_t rb = nm_row_size(t, MV_K);
    const int64_t n_ops = (int64_t)(MV_BYTES / rb) / OPS_ROWS, rows = n_ops * OPS_ROWS;
    for (int64_t o = 0; o < 64; o++) nm_quantize_row_ref(t, wf + o * MV_K, big + o * rb, MV_K);
    for (int64_t o = 64; o < rows; o++) memcpy(big + o * rb, big + (o % 64) * rb, rb);
    nm_tensor X = {.type = NM_TYPE_F32, .ne = {MV_K, 1, 1, 1}, .offs = (size_t)(uintptr_t)x};
    nm_tensor W = {.type = t, .ne = {MV_K, rows, 1, 1}, .offs = (size_t)(uintptr_t)big};
    nm_tensor Y = {.type = NM_TYPE_F32, .ne = {rows, 1, 1, 1}, .offs = (size_t)(uintptr_t)y};
    nm_op whole = {.kind = NM_OP_MATMUL, .src0 = &W, .src1 = &X, .dst = &Y};
    nm_tensor *wt = malloc(sizeof *wt * (size_t)n_ops), *yt = malloc(sizeof *yt * (size_t)n_ops);
    nm_op *ops = malloc(sizeof *ops * (size_t)n_ops);
    double best_whole = 0, best_cut = 0;
    if (!wt || !yt || !ops || !nm_backend_supports_op(be, &whole) || nm_backend_run(be, &whole, 1) != NM_OK)
        goto done;
    for (int64_t i = 0; i < n_ops; i++) {
        wt[i] = nm_tensor_rows(&W, rb, i * OPS_ROWS, OPS_ROWS);
        yt[i] = (nm_tensor){.type = NM_TYPE_F32, .ne = {OPS_ROWS, 1, 1, 1},
                            .offs = (size_t)(uintptr_t)(y + i * OPS_ROWS)};
        ops[i] = (nm_op){.kind = NM_OP_MATMUL, .src0 = &wt[i], .src1 = &X, .dst = &yt[i]};
    }
    for (int r = 0; r < 3; r++) { // alternated, so both see the same machine
        double t0 = nm_now_s();
        if (nm_backend_run(be, ops, (int32_t)n_ops) != NM_OK) goto done;
        double dt = nm_now_s() - t0;
        if (r == 0 || dt < best_cut) best_cut = dt;
        t0 = nm_now_s();
        if (nm_backend_run(be, &whole, 1) != NM_OK) goto done;
        dt = nm_now_s() - t0;
        if (r == 0 || dt < best_whole) best_whole = dt;
    }
done:
    free(wt), free(yt), free(ops);
    const double us = (best_cut - best_whole) / (double)n_ops * 1e6;
    return us > 0 ? us : 0;
}

// A unit set up for measuring: this thread bound to a CPU lane's cores, the
// backend made, the buffers imported.
typedef struct unit_bench {
    bool cpu, bound, mv_ok;
    cpu_set_t old;
    int32_t n_cores;
    nm_backend *be;
    float *wf, *x, *y, *ybig;
    void *wq;
    uint8_t *big;
} unit_bench;

static void bench_close(unit_bench *b) {
    nm_backend_free(b->be);
    free(b->wf), free(b->x), free(b->y), free(b->wq), free(b->big), free(b->ybig);
    if (b->bound) pthread_setaffinity_np(pthread_self(), sizeof b->old, &b->old);
    memset(b, 0, sizeof *b);
}

// Sets the unit up; with_big: the decoding figure's 160 MiB too.
static nm_status bench_open(const char *unit, bool with_big, unit_bench *b, char *err, size_t err_size) {
    memset(b, 0, sizeof *b);
    b->cpu = !strcmp(unit, "cpu") || !strncmp(unit, "cpu:", 4);
    const bool cl = !strcmp(unit, "opencl") || !strncmp(unit, "opencl:", 7);
    if (!b->cpu && !cl)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size,
                       "profile: unit '%s': cpu, cpu:big, cpu:little, cpu:cluster:N, a core list after cpu:, "
                       "opencl or opencl:N", unit);
    // a CPU lane: this thread bound to its cores while the backend's pool is made and runs
    b->n_cores = nm_cpu_count();
    if (b->cpu && unit[3] == ':') {
        nm_cpu_topology *t = malloc(sizeof *t);
        int32_t cores[NM_MAX_CPUS];
        nm_status st = t ? nm_cpu_topology_read(NULL, t, err, err_size) : NM_ERR_NOMEM;
        if (st == NM_OK) st = nm_cores_parse(t, unit + 4, cores, NM_MAX_CPUS, &b->n_cores, err, err_size);
        free(t);
        if (st != NM_OK) return st;
        cpu_set_t set;
        CPU_ZERO(&set);
        for (int32_t i = 0; i < b->n_cores; i++) CPU_SET(cores[i], &set);
        b->bound = pthread_getaffinity_np(pthread_self(), sizeof b->old, &b->old) == 0 &&
                   pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
        if (!b->bound) return nm_fail(NM_ERR_UNSUPPORTED, err, err_size, "profile: cannot bind a thread to %s", unit);
    }
    const nm_backend_params bp = {.n_threads = b->n_cores, .max_row = MV_K, .max_tokens = MM_T};
    b->wf = malloc(sizeof(float) * MM_O * MM_K), b->x = malloc(sizeof(float) * MM_K * MM_T);
    b->y = malloc(sizeof(float) * MM_O * MM_T);
    b->wq = malloc(sizeof(float) * MM_O * MM_K);
    if (with_big) b->big = malloc(MV_BYTES), b->ybig = malloc(sizeof(float) * MV_MAX_ROWS);
    nm_status st = b->wf && b->x && b->y && b->wq && (!with_big || (b->big && b->ybig))
                       ? nm_backend_create(b->cpu ? "cpu" : unit, &bp, &b->be, err, err_size)
                       : nm_fail(NM_ERR_NOMEM, err, err_size, "profile: out of memory");
    if (st != NM_OK) {
        bench_close(b);
        return st;
    }
    nm_backend *be = b->be;
    uint32_t seed = 12345;
    for (int64_t i = 0; i < (int64_t)MM_O * MM_K; i++) { // any values: the time does not depend on them
        seed = seed * 1664525u + 1013904223u;
        b->wf[i] = (float)(seed >> 9) / 8388608.0f - 1.0f;
    }
    for (int64_t i = 0; i < (int64_t)MM_K * MM_T; i++) b->x[i] = b->wf[i % ((int64_t)MM_O * MM_K)];
    // activations and outputs readable (and, for y, writable) by the backend
    if ((st = nm_backend_import_host(be, b->x, sizeof(float) * MM_K * MM_T, false)) == NM_OK)
        st = nm_backend_import_host(be, b->y, sizeof(float) * MM_O * MM_T, true);
    if (st == NM_OK) st = nm_backend_import_host(be, b->wf, sizeof(float) * 64 * 64, false);
    // the weights of every type in one range (a device with its own memory keeps the first
    // upload's values: the time of a matmul does not depend on them)
    if (st == NM_OK) st = nm_backend_import_host(be, b->wq, sizeof(float) * MM_O * MM_K, false);
    // the decoding figure's 160 MiB: a device that cannot take them has no matvec figure (the read
    // bandwidth stands in for it), the rest is measured
    b->mv_ok = with_big && st == NM_OK && nm_backend_import_host(be, b->big, MV_BYTES, false) == NM_OK &&
               nm_backend_import_host(be, b->ybig, sizeof(float) * MV_MAX_ROWS, true) == NM_OK;
    if (st != NM_OK) {
        nm_fail(st, err, err_size, "profile: %s: %s", unit, nm_backend_last_error(be));
        bench_close(b);
    }
    return st;
}

// The OpenCL device an "opencl" or "opencl:N" unit names ("opencl": opencl:0),
// as nm_list_devices gives it (probe: its read bandwidth measured); false
// where there is none.
static bool unit_device(const char *unit, bool probe, nm_device_info *out) {
    nm_device_info d[17];
    const int32_t n = nm_list_devices(d, 17, probe);
    const char *want = strchr(unit, ':') ? unit : "opencl:0";
    for (int32_t i = 0; i < n && i < 17; i++)
        if (!strcmp(d[i].name, want)) return *out = d[i], true;
    return false;
}

nm_status nm_unit_measure(const char *unit, nm_unit_profile *out, char *err, size_t err_size) {
    if (!unit || !out) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "profile: NULL unit or output");
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", unit);
    unit_bench b;
    nm_status st = bench_open(unit, true, &b, err, err_size);
    if (st != NM_OK) return st;
    out->unit = b.cpu ? NM_UNIT_CPU : NM_UNIT_OPENCL;
    for (size_t i = 0; i < sizeof measured / sizeof measured[0]; i++)
        out->gflops[measured[i]] = matmul_gflops(b.be, measured[i], b.wf, b.x, b.y, b.wq);
    out->gflops_f32 = out->gflops[NM_TYPE_F32];
    for (size_t i = 0; i < sizeof measured / sizeof measured[0]; i++)
        if (b.mv_ok && measured[i] != NM_TYPE_F32) // f32 weights are the planner's "other" bytes (read_gbps)
            out->matvec_gbps[measured[i]] = matvec_gbps(b.be, measured[i], b.wf, b.x, b.ybig, b.big);
    out->launch_us = launch_us(b.be, b.wf, b.x, b.y);
    if (b.mv_ok) out->op_us = op_us(b.be, b.wf, b.x, b.ybig, b.big);
    if (b.cpu) {
        out->read_gbps = nm_cpu_read_gbps(b.n_cores);
    } else {
        nm_device_info d;
        if (unit_device(unit, true, &d)) out->read_gbps = d.read_gbps, out->mem_bytes = d.unified ? 0 : d.mem_bytes;
    }
    bench_close(&b);
    return NM_OK;
}

// ---- watts ----------------------------------------------------------------------------------

// Which of the meters (named as nm_energy_reading names them) see the unit:
// a CPU unit the RAPL packages, else the board's input (an INA3221 VDD_IN
// rail, the battery, a socket or package hwmon input, else the first hwmon
// input); an OpenCL unit its NVIDIA GPU's NVML meter (the one named like the
// device, or the only one). Returns how many were chosen into pick.
static int pick_meters(const char *unit, const nm_energy_reading *r, bool pick[NM_ENERGY_MAX_METERS]) {
    memset(pick, 0, sizeof(bool) * NM_ENERGY_MAX_METERS);
    int n = 0;
    if (!strncmp(unit, "cpu", 3)) {
        for (int32_t i = 0; i < r->n; i++)
            if (!strncmp(r->name[i], "rapl:", 5)) pick[i] = true, n++;
        if (n) return n;
        static const char *board[] = {"VDD_IN", "battery:", "socket", "Socket", "package", "PPT", "hwmon:"};
        for (size_t k = 0; k < sizeof board / sizeof board[0]; k++)
            for (int32_t i = 0; i < r->n; i++)
                if (strstr(r->name[i], board[k])) return pick[i] = true, 1;
        return 0;
    }
    nm_device_info d;
    const char *desc = unit_device(unit, false, &d) ? d.desc : NULL;
    int n_nvml = 0, last = -1;
    for (int32_t i = 0; i < r->n; i++) {
        if (strncmp(r->name[i], "nvml:", 5)) continue;
        n_nvml++, last = i;
        const char *model = strchr(r->name[i], ' ');
        if (desc && model && model[1] && strstr(desc, model + 1)) return pick[i] = true, 1;
    }
    if (n_nvml == 1 && desc && strstr(desc, "NVIDIA")) return pick[last] = true, 1;
    return 0;
}

static double picked_watts(const nm_energy_reading *r, const bool pick[NM_ENERGY_MAX_METERS]) {
    double j = 0;
    for (int32_t i = 0; i < r->n; i++)
        if (pick[i]) j += r->joules[i];
    return r->seconds > 0 ? j / r->seconds : 0;
}

nm_status nm_unit_measure_watts(const char *unit, const char *root, double idle_s, double busy_s,
                                nm_unit_profile *io, char *source, size_t source_size, char *err, size_t err_size) {
    if (!unit || !io || idle_s <= 0 || busy_s <= 0)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "profile: watts: NULL unit or profile, or no time");
    if (source && source_size) source[0] = '\0';
    const bool cl = !strncmp(unit, "opencl", 6);
    nm_energy_meters *m = NULL;
    nm_status st = nm_energy_meters_open(root, cl, &m, err, err_size);
    if (st != NM_OK) return st;
    if (nm_energy_meters_count(m) == 0) {
        nm_energy_meters_free(m);
        return nm_fail(NM_ERR_UNSUPPORTED, err, err_size, "no energy meter on this machine");
    }
    // the meters by name (a reading of no time), then idle: nothing of ours runs
    nm_energy_reading idle = {0}, busy = {0};
    bool pick[NM_ENERGY_MAX_METERS];
    if ((st = nm_energy_meters_start(m, err, err_size)) == NM_OK) st = nm_energy_meters_stop(m, &idle, err, err_size);
    if (st == NM_OK && pick_meters(unit, &idle, pick) == 0)
        st = nm_fail(NM_ERR_UNSUPPORTED, err, err_size, "no energy meter sees %s (%d found, none %s)", unit, idle.n,
                     cl ? "an NVML meter of this device" : "RAPL or a board input");
    if (st == NM_OK && (st = nm_energy_meters_start(m, err, err_size)) == NM_OK) {
        struct timespec ts = {(time_t)idle_s, (long)((idle_s - (double)(time_t)idle_s) * 1e9)};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
        st = nm_energy_meters_stop(m, &idle, err, err_size);
    }
    // busy: the unit's f32 matmul on all its cores, over and over
    unit_bench b;
    if (st == NM_OK && (st = bench_open(unit, false, &b, err, err_size)) == NM_OK) {
        nm_tensor W = {.type = NM_TYPE_F32, .ne = {MM_K, MM_O, 1, 1}, .offs = (size_t)(uintptr_t)b.wq};
        nm_tensor X = {.type = NM_TYPE_F32, .ne = {MM_K, MM_T, 1, 1}, .offs = (size_t)(uintptr_t)b.x};
        nm_tensor Y = {.type = NM_TYPE_F32, .ne = {MM_O, MM_T, 1, 1}, .offs = (size_t)(uintptr_t)b.y};
        nm_op op = {.kind = NM_OP_MATMUL, .src0 = &W, .src1 = &X, .dst = &Y};
        memcpy(b.wq, b.wf, sizeof(float) * MM_O * MM_K);
        st = nm_backend_run(b.be, &op, 1); // warm-up (a device builds its kernels)
        if (st == NM_OK) st = nm_energy_meters_start(m, err, err_size);
        const double t0 = nm_now_s();
        while (st == NM_OK && nm_now_s() - t0 < busy_s) st = nm_backend_run(b.be, &op, 1);
        if (st == NM_OK) st = nm_energy_meters_stop(m, &busy, err, err_size);
        else nm_fail(st, err, err_size, "profile: %s: %s", unit, nm_backend_last_error(b.be));
        bench_close(&b);
    }
    if (st == NM_OK) {
        const double iw = picked_watts(&idle, pick), aw = picked_watts(&busy, pick);
        if (!(iw > 0) || !(aw > 0)) {
            st = nm_fail(NM_ERR_UNSUPPORTED, err, err_size, "the energy meter of %s did not move (%.3f W idle, %.3f W busy)",
                         unit, iw, aw);
        } else {
            io->idle_w = iw;
            io->active_w = aw > iw ? aw : iw; // busy below idle: the meter's noise
            if (source && source_size) {
                size_t used = 0;
                for (int32_t i = 0; i < idle.n && used < source_size; i++)
                    if (pick[i])
                        used += (size_t)snprintf(source + used, source_size - used, "%s%s", used ? " + " : "", idle.name[i]);
            }
        }
    }
    nm_energy_meters_free(m);
    return st;
}

// ---- the file -------------------------------------------------------------------------------

static const char *unit_name(nm_unit u) {
    return u == NM_UNIT_CPU ? "cpu" : u == NM_UNIT_OPENCL ? "opencl" : u == NM_UNIT_NPU ? "npu" : "?";
}

nm_status nm_units_save(const char *path, const nm_unit_profile *u, int32_t n, char *err, size_t err_size) {
    cJSON *root = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(root, "units");
    cJSON_AddNumberToObject(root, "version", 1);
    for (int32_t i = 0; i < n && arr; i++) {
        cJSON *o = cJSON_CreateObject(), *g = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", u[i].name);
        cJSON_AddStringToObject(o, "unit", unit_name(u[i].unit));
        cJSON_AddNumberToObject(o, "read_gbps", u[i].read_gbps);
        cJSON_AddNumberToObject(o, "gflops_f32", u[i].gflops_f32);
        for (int t = 0; t < NM_EST_TYPES; t++) {
            const nm_type_traits *tr = nm_type_traits_get((uint32_t)t);
            if (u[i].gflops[t] > 0 && tr) cJSON_AddNumberToObject(g, tr->name, u[i].gflops[t]);
        }
        cJSON_AddItemToObject(o, "gflops", g);
        cJSON *mv = cJSON_CreateObject();
        for (int t = 0; t < NM_EST_TYPES; t++) {
            const nm_type_traits *tr = nm_type_traits_get((uint32_t)t);
            if (u[i].matvec_gbps[t] > 0 && tr) cJSON_AddNumberToObject(mv, tr->name, u[i].matvec_gbps[t]);
        }
        cJSON_AddItemToObject(o, "matvec_gbps", mv);
        cJSON_AddNumberToObject(o, "launch_us", u[i].launch_us);
        cJSON_AddNumberToObject(o, "op_us", u[i].op_us);
        cJSON_AddNumberToObject(o, "mem_bytes", (double)u[i].mem_bytes);
        cJSON_AddNumberToObject(o, "idle_w", u[i].idle_w);
        cJSON_AddNumberToObject(o, "active_w", u[i].active_w);
        cJSON_AddNumberToObject(o, "kinds", u[i].kinds);
        cJSON_AddItemToArray(arr, o);
    }
    char *text = root && arr ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!text) return nm_fail(NM_ERR_NOMEM, err, err_size, "profile: out of memory");
    nm_outfile f;
    nm_status st = nm_outfile_open(&f, path, err, err_size);
    if (st == NM_OK) {
        fputs(text, f.f);
        fputc('\n', f.f);
        st = nm_outfile_commit(&f, err, err_size);
    }
    cJSON_free(text);
    return st;
}

// An object of numbers >= 0 keyed by weight type names ("q4_0": 12.5, ...) into v[type].
static nm_status per_type(const char *path, const char *unit, const char *key, const cJSON *obj, double *v, char *err,
                          size_t err_size) {
    if (!cJSON_IsObject(obj))
        return nm_fail(NM_ERR_FORMAT, err, err_size, "%s: unit %s: %s must be an object", path, unit, key);
    const cJSON *e;
    cJSON_ArrayForEach(e, obj) {
        int t = 0;
        for (; t < NM_EST_TYPES; t++) {
            const nm_type_traits *tr = nm_type_traits_get((uint32_t)t);
            if (tr && e->string && !strcmp(tr->name, e->string)) break;
        }
        if (t == NM_EST_TYPES || !cJSON_IsNumber(e) || !(e->valuedouble >= 0))
            return nm_fail(NM_ERR_FORMAT, err, err_size, "%s: unit %s: %s \"%s\" is not a weight type with a number",
                           path, unit, key, e->string ? e->string : "?");
        v[t] = e->valuedouble;
    }
    return NM_OK;
}

nm_status nm_units_load(const char *path, nm_unit_profile *u, int32_t max, int32_t *n, char *err, size_t err_size) {
    if (n) *n = 0;
    if (!path || !u || !n) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "profile: NULL argument");
    char *text = NULL;
    nm_status rs = nm_infile_read(path, 16u << 20, 0, &text, NULL, err, err_size);
    if (rs != NM_OK) return rs;
    cJSON *root = cJSON_Parse(text);
    free(text);
    nm_status st = NM_OK;
    const cJSON *arr = root ? cJSON_GetObjectItemCaseSensitive(root, "units") : NULL;
    if (!root || !cJSON_IsArray(arr)) {
        st = nm_fail(NM_ERR_FORMAT, err, err_size, "%s: not a unit profile (a JSON object with a \"units\" array)", path);
        goto done;
    }
    const cJSON *o;
    cJSON_ArrayForEach(o, arr) {
        if (*n == max) {
            st = nm_fail(NM_ERR_RANGE, err, err_size, "%s: more than %d units", path, max);
            goto done;
        }
        nm_unit_profile *p = &u[*n];
        memset(p, 0, sizeof *p);
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name"), *kind = cJSON_GetObjectItemCaseSensitive(o, "unit");
        const cJSON *bw = cJSON_GetObjectItemCaseSensitive(o, "read_gbps"), *g = cJSON_GetObjectItemCaseSensitive(o, "gflops");
        if (!cJSON_IsString(name) || !cJSON_IsString(kind) || !cJSON_IsNumber(bw) || !cJSON_IsObject(g)) {
            st = nm_fail(NM_ERR_FORMAT, err, err_size, "%s: unit %d needs name, unit, read_gbps and gflops", path, (int)*n);
            goto done;
        }
        snprintf(p->name, sizeof p->name, "%s", name->valuestring);
        if (!strcmp(kind->valuestring, "cpu")) p->unit = NM_UNIT_CPU;
        else if (!strcmp(kind->valuestring, "opencl")) p->unit = NM_UNIT_OPENCL;
        else if (!strcmp(kind->valuestring, "npu")) p->unit = NM_UNIT_NPU;
        else {
            st = nm_fail(NM_ERR_FORMAT, err, err_size, "%s: unit %s: unknown kind '%s' (cpu, opencl, npu)", path,
                         p->name, kind->valuestring);
            goto done;
        }
        p->read_gbps = bw->valuedouble;
        const cJSON *mv = cJSON_GetObjectItemCaseSensitive(o, "matvec_gbps"); // optional (older files lack it)
        if ((st = per_type(path, p->name, "gflops", g, p->gflops, err, err_size)) != NM_OK ||
            (mv && (st = per_type(path, p->name, "matvec_gbps", mv, p->matvec_gbps, err, err_size)) != NM_OK))
            goto done;
        const struct {
            const char *key;
            double *dst;
        } nums[] = {{"gflops_f32", &p->gflops_f32}, {"launch_us", &p->launch_us}, {"op_us", &p->op_us}, {"idle_w", &p->idle_w},
                    {"active_w", &p->active_w}};
        for (size_t k = 0; k < sizeof nums / sizeof nums[0]; k++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, nums[k].key);
            if (v && (!cJSON_IsNumber(v) || v->valuedouble < 0)) {
                st = nm_fail(NM_ERR_FORMAT, err, err_size, "%s: unit %s: %s must be a number >= 0", path, p->name,
                             nums[k].key);
                goto done;
            }
            if (v) *nums[k].dst = v->valuedouble;
        }
        const cJSON *mem = cJSON_GetObjectItemCaseSensitive(o, "mem_bytes"), *kinds = cJSON_GetObjectItemCaseSensitive(o, "kinds");
        if ((mem && (!cJSON_IsNumber(mem) || !(mem->valuedouble >= 0 && mem->valuedouble < 0x1p62))) ||
            (kinds && (!cJSON_IsNumber(kinds) || !(kinds->valuedouble >= 0 && kinds->valuedouble < 0x1p31)))) {
            st = nm_fail(NM_ERR_FORMAT, err, err_size, "%s: unit %s: mem_bytes and kinds must be numbers >= 0", path,
                         p->name);
            goto done;
        }
        if (mem) p->mem_bytes = (uint64_t)mem->valuedouble;
        if (kinds) p->kinds = (uint32_t)kinds->valuedouble;
        if (!cJSON_GetObjectItemCaseSensitive(o, "gflops_f32")) {
            st = nm_fail(NM_ERR_FORMAT, err, err_size, "%s: unit %s needs gflops_f32 (the speed of its other arithmetic)",
                         path, p->name);
            goto done;
        }
        if (!(p->read_gbps > 0)) {
            st = nm_fail(NM_ERR_FORMAT, err, err_size, "%s: unit %s: read_gbps must be > 0", path, p->name);
            goto done;
        }
        (*n)++;
    }
done:
    cJSON_Delete(root);
    if (st != NM_OK) *n = 0;
    return st;
}
