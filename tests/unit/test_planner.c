// The planner (src/sched/planner.c) on synthetic profiles: a phone with a
// 4+4 big.LITTLE CPU, a weak GPU and a static-shape NPU that only takes the
// vision encoder. The plans one expects, worked out by hand from the roofline
// in the comments: latency puts each brick on its fastest unit, throughput
// splits the decoder's layers between the big cores and the GPU, energy moves
// it to the little cores; memory limits and missing kernels are respected;
// the same inputs give the same plan.
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "nanomind.h"
#include "nmtest.h"

enum { BIG, LITTLE, GPU, NPU };

static void phone(nm_unit_profile u[4]) {
    memset(u, 0, 4 * sizeof u[0]);
    // big: 20 GB/s, q4_0 60 GFLOP/s, f16 40, f32 30, 3.5 W busy
    u[BIG] = (nm_unit_profile){.name = "cpu:big", .unit = NM_UNIT_CPU, .read_gbps = 20, .gflops_f32 = 30,
                               .launch_us = 20, .idle_w = 0.3, .active_w = 3.5};
    u[BIG].gflops[2] = 60, u[BIG].gflops[1] = 40;
    // little: 8 GB/s, q4_0 12, f16 8, f32 6, 0.5 W busy
    u[LITTLE] = (nm_unit_profile){.name = "cpu:little", .unit = NM_UNIT_CPU, .read_gbps = 8, .gflops_f32 = 6,
                                  .launch_us = 20, .idle_w = 0.1, .active_w = 0.5};
    u[LITTLE].gflops[2] = 12, u[LITTLE].gflops[1] = 8;
    // a weak GPU: 15 GB/s, q4_0 30, f16 60, f32 40, 150 us a launch, 2 GiB, 2.5 W
    u[GPU] = (nm_unit_profile){.name = "gpu", .unit = NM_UNIT_OPENCL, .read_gbps = 15, .gflops_f32 = 40,
                               .launch_us = 150, .mem_bytes = 2ull << 30, .idle_w = 0.2, .active_w = 2.5};
    u[GPU].gflops[2] = 30, u[GPU].gflops[1] = 60;
    // an NPU that takes only the vision encoder (static shapes), f16 400, 1 W
    u[NPU] = (nm_unit_profile){.name = "npu", .unit = NM_UNIT_NPU, .read_gbps = 10, .gflops_f32 = 200,
                               .launch_us = 500, .mem_bytes = 1ull << 30, .idle_w = 0.05, .active_w = 1.0,
                               .kinds = 1u << NM_BRICK_VISION};
    u[NPU].gflops[1] = 400;
}

// vision: 20 GFLOP of f16 matmuls and 2 of the rest, 0.25 GB moved, 300 MB held.
// llm (32 tokens of a 135M q4_0 model): 8.6 GFLOP q4_0 + 1 of the rest, 3.2 GB streamed, 33 passes.
static void bricks(nm_plan_brick b[2]) {
    memset(b, 0, 2 * sizeof b[0]);
    b[0] = (nm_plan_brick){.kind = NM_BRICK_VISION, .name = "vision",
                           .units = NM_UNIT_BIT(NM_UNIT_CPU) | NM_UNIT_BIT(NM_UNIT_OPENCL) | NM_UNIT_BIT(NM_UNIT_NPU)};
    b[0].cost.flops_by_type[1] = 20e9, b[0].cost.flops_by_type[0] = 2e9, b[0].cost.flops = 22e9;
    b[0].cost.weight_bytes_read = 0.2e9, b[0].cost.act_bytes = 0.05e9, b[0].cost.n_passes = 1;
    b[0].cost.peak_bytes = 300ull << 20;
    b[1] = (nm_plan_brick){.kind = NM_BRICK_LLM, .name = "llm", .n_layer = 30,
                           .units = NM_UNIT_BIT(NM_UNIT_CPU) | NM_UNIT_BIT(NM_UNIT_OPENCL)};
    b[1].cost.flops_by_type[2] = 8.6e9, b[1].cost.flops_by_type[0] = 1e9, b[1].cost.flops = 9.6e9;
    b[1].cost.weight_bytes_read = 3.2e9, b[1].cost.n_passes = 33, b[1].cost.peak_bytes = 200ull << 20;
}

static void show(const nm_plan *p, const nm_unit_profile *u, const nm_plan_brick *b, const char *title) {
    char buf[4096];
    if (nm_plan_format(p, u, b, buf, sizeof buf) > 0) printf("  -- %s\n%s", title, buf);
}

NM_TEST(latency_each_on_its_fastest_unit) {
    nm_unit_profile u[4];
    nm_plan_brick b[2];
    phone(u), bricks(b);
    nm_plan p;
    char err[256];
    NM_CHECK(nm_plan_make(u, 4, b, 2, NM_PLAN_LATENCY, &p, err, sizeof err) == NM_OK);
    show(&p, u, b, "latency");
    // vision: npu 20/400 + 2/200 = 60 ms (+0.5) against gpu 383, big 567; llm: big max(8.6/60 + 1/30,
    // 3.2/20) = 177 ms (+0.7) against gpu 317 (+5), little 883
    NM_CHECK(p.steps[0].unit == NPU && p.steps[0].unit2 == -1 && fabs(p.steps[0].seconds - 0.0605) < 1e-4);
    NM_CHECK(p.steps[1].unit == BIG && p.steps[1].unit2 == -1 && fabs(p.steps[1].seconds - (0.14333 + 0.03333 + 0.00066)) < 1e-4);
    NM_CHECK(fabs(p.latency_s - (p.steps[0].seconds + p.steps[1].seconds)) < 1e-12 && fabs(p.period_s - p.steps[1].seconds) < 1e-12);
    NM_CHECK(strstr(p.steps[1].why, "compute-bound") && strstr(p.steps[1].why, "alone on gpu"));
    NM_CHECK(p.n_considered > 4 * 4);
    // the same inputs, the same plan
    nm_plan q;
    NM_CHECK(nm_plan_make(u, 4, b, 2, NM_PLAN_LATENCY, &q, err, sizeof err) == NM_OK);
    NM_CHECK(!memcmp(p.steps, q.steps, sizeof p.steps) && p.latency_s == q.latency_s);
}

NM_TEST(throughput_splits_the_decoder) {
    nm_unit_profile u[4];
    nm_plan_brick b[2];
    phone(u), bricks(b);
    nm_plan lat, thr;
    char err[256];
    NM_CHECK(nm_plan_make(u, 4, b, 2, NM_PLAN_LATENCY, &lat, err, sizeof err) == NM_OK);
    NM_CHECK(nm_plan_make(u, 4, b, 2, NM_PLAN_THROUGHPUT, &thr, err, sizeof err) == NM_OK);
    show(&thr, u, b, "throughput");
    // big and the GPU each take a share of the layers; balanced near 19 / 11
    // (19/30 * 177 = 112 ms on big against 11/30 * 312 + 5 = 119 ms on the GPU)
    const nm_plan_step *s = &thr.steps[1];
    NM_CHECK(s->unit2 >= 0 && ((s->unit == BIG && s->unit2 == GPU) || (s->unit == GPU && s->unit2 == BIG)));
    const int32_t on_big = s->unit == BIG ? s->split : 30 - s->split;
    NM_CHECK(on_big >= 17 && on_big <= 21);
    NM_CHECK(thr.period_s < 0.75 * lat.period_s && thr.latency_s >= lat.latency_s);
    NM_CHECK(thr.steps[0].unit == NPU);
}

NM_TEST(energy_prefers_the_little_cores) {
    nm_unit_profile u[4];
    nm_plan_brick b[2];
    phone(u), bricks(b);
    nm_plan lat, en;
    char err[256];
    NM_CHECK(nm_plan_make(u, 4, b, 2, NM_PLAN_LATENCY, &lat, err, sizeof err) == NM_OK);
    NM_CHECK(nm_plan_make(u, 4, b, 2, NM_PLAN_ENERGY, &en, err, sizeof err) == NM_OK);
    show(&en, u, b, "energy");
    // llm on little: 883 ms at 0.5 W = 0.44 J against 0.62 J on big
    NM_CHECK(en.steps[1].unit == LITTLE && en.steps[1].unit2 == -1 && en.steps[0].unit == NPU);
    NM_CHECK(en.joules < lat.joules && en.latency_s > lat.latency_s);
    // an NPU that draws 3 W while it waits: the decoder moves to the big cores so that it waits
    // 177 ms, not 884 (npu 0.06 + 0.53 J, big 0.62 J: 1.23 J against 3.16 with the little cores)
    u[NPU].idle_w = 3.0;
    NM_CHECK(nm_plan_make(u, 4, b, 2, NM_PLAN_ENERGY, &en, err, sizeof err) == NM_OK);
    NM_CHECK(en.steps[0].unit == NPU && en.steps[1].unit == BIG && fabs(en.joules - 1.23) < 0.02);
}

NM_TEST(memory_and_kernels_respected) {
    nm_unit_profile u[4];
    nm_plan_brick b[2];
    phone(u), bricks(b);
    nm_plan p;
    char err[256];
    // an NPU with 128 MiB cannot hold the 300 MB encoder: the GPU takes it (383 ms against 567 on big)
    u[NPU].mem_bytes = 128ull << 20;
    NM_CHECK(nm_plan_make(u, 4, b, 2, NM_PLAN_LATENCY, &p, err, sizeof err) == NM_OK);
    NM_CHECK(p.steps[0].unit == GPU && p.mem[GPU] <= u[GPU].mem_bytes);
    // the GPU without q4_0 kernels: the decoder cannot go there, so no split for throughput
    phone(u);
    u[GPU].gflops[2] = 0;
    NM_CHECK(nm_plan_make(u, 4, b, 2, NM_PLAN_THROUGHPUT, &p, err, sizeof err) == NM_OK);
    NM_CHECK(p.steps[1].unit != GPU && p.steps[1].unit2 != GPU);
    // a weight type no unit runs (q4_K, GGUF type 12): an error naming the brick and why
    phone(u);
    b[1].cost.flops_by_type[12] = 1e9;
    NM_CHECK(nm_plan_make(u, 4, b, 2, NM_PLAN_LATENCY, &p, err, sizeof err) == NM_ERR_UNSUPPORTED);
    NM_CHECK(strstr(err, "llm") && strstr(err, "weight type"));
    // a vision brick only the NPU could run, on a phone without one: no unit takes it
    bricks(b);
    b[0].units = NM_UNIT_BIT(NM_UNIT_NPU);
    NM_CHECK(nm_plan_make(u, 3, b, 2, NM_PLAN_LATENCY, &p, err, sizeof err) == NM_ERR_UNSUPPORTED);
    NM_CHECK(strstr(err, "vision") && strstr(err, "no implementation"));
    // two bricks that each fit the GPU's 2 GiB but not together: one goes elsewhere
    phone(u), bricks(b);
    for (int i = 0; i < 4; i++) u[i].mem_bytes = i == GPU ? 2ull << 30 : (i == NPU ? 0 : 64ull << 20);
    u[NPU].kinds = 1u << NM_BRICK_TTS; // takes nothing here
    b[0].cost.peak_bytes = b[1].cost.peak_bytes = 1500ull << 20;
    NM_CHECK(nm_plan_make(u, 4, b, 2, NM_PLAN_LATENCY, &p, err, sizeof err) == NM_ERR_UNSUPPORTED);
    NM_CHECK(strstr(err, "memory"));
    // a decoder too large for any one unit that fits split over two
    phone(u), bricks(b);
    u[BIG].mem_bytes = u[LITTLE].mem_bytes = u[GPU].mem_bytes = 1ull << 30;
    b[1].cost.peak_bytes = 1536ull << 20;
    NM_CHECK(nm_plan_make(u, 4, b, 2, NM_PLAN_LATENCY, &p, err, sizeof err) == NM_OK);
    NM_CHECK(p.steps[1].unit2 >= 0 && p.mem[p.steps[1].unit] <= 1ull << 30 && p.mem[p.steps[1].unit2] <= 1ull << 30);
    // more placements than the search takes
    phone(u), bricks(b);
    nm_unit_profile many[8];
    nm_plan_brick llms[4];
    for (int i = 0; i < 8; i++) many[i] = u[BIG];
    for (int i = 0; i < 4; i++) llms[i] = b[1], llms[i].n_layer = 80;
    NM_CHECK(nm_plan_make(many, 8, llms, 4, NM_PLAN_LATENCY, &p, err, sizeof err) == NM_ERR_RANGE);
    NM_CHECK(strstr(err, "placements to look at"));
    // bad arguments
    NM_CHECK(nm_plan_make(u, 0, b, 2, NM_PLAN_LATENCY, &p, err, sizeof err) == NM_ERR_INVALID_ARG);
    NM_CHECK(nm_plan_make(u, 4, b, 2, (nm_plan_goal)7, &p, err, sizeof err) == NM_ERR_INVALID_ARG);
    char small[8];
    phone(u), bricks(b);
    NM_CHECK(nm_plan_make(u, 4, b, 2, NM_PLAN_LATENCY, &p, err, sizeof err) == NM_OK);
    NM_CHECK(nm_plan_format(&p, u, b, small, sizeof small) < -(int32_t)sizeof small);
}

// A decoder with its generation scored apart: the prompt at the roofline of
// its arithmetic, then the tokens at the unit's measured matvec speed for
// their weight type (not the read bandwidth the old one-phase model took for
// both). Worked by hand on the big cores: prompt 8 GFLOP q4_0 + 0.5 f32 over
// 0.1 GB; 32 tokens 0.6 GFLOP q4_0 + 0.5 f32 over 0.34 GB of q4_0 weights and
// 0.05 GB of f32 and activations.
NM_TEST(decoder_in_two_phases) {
    nm_unit_profile u[4];
    nm_plan_brick b[2];
    phone(u), bricks(b);
    nm_plan_brick *l = &b[1];
    memset(&l->cost, 0, sizeof l->cost);
    l->decode.flops_by_type[2] = 0.6e9, l->decode.flops_by_type[0] = 0.5e9, l->decode.flops = 1.1e9;
    // 0.3e9 q4_0 weights at 18 bytes a block of 32: 0.16875 GB; plus 0.05 GB of the rest
    const double q4_bytes = 0.6e9 / 2 * 18.0 / 32.0;
    l->decode.weight_bytes_read = q4_bytes + 0.03e9, l->decode.act_bytes = 0.02e9, l->decode.n_passes = 32;
    l->cost = l->decode; // the whole: the generation and the prompt
    l->cost.flops_by_type[2] += 8e9, l->cost.flops_by_type[0] += 0.5e9, l->cost.flops += 8.5e9;
    l->cost.weight_bytes_read += 0.1e9, l->cost.n_passes += 1, l->cost.peak_bytes = 200ull << 20;
    u[BIG].matvec_gbps[2] = 5; // a quarter of the read bandwidth: what decoding really gets here
    nm_plan p;
    char err[256];
    NM_CHECK(nm_plan_make(u, 4, b, 2, NM_PLAN_LATENCY, &p, err, sizeof err) == NM_OK);
    show(&p, u, b, "a decoder in two phases");
    // prompt: max(8/60 + 0.5/30, 0.1/20) = 150.0 ms + 20 us; generation: max(0.6/60 + 0.5/30 = 26.7 ms,
    // 0.16875/5 + 0.05/20 = 36.25 ms) = 36.25 ms + 32 x 20 us
    const double want = (8.0 / 60 + 0.5 / 30) + 20e-6 + (q4_bytes / 5e9 + 0.05e9 / 20e9) + 32 * 20e-6;
    NM_CHECK(p.steps[1].unit == BIG && fabs(p.steps[1].seconds - want) < 1e-6);
    NM_CHECK(strstr(p.steps[1].why, "prompt 150.0 ms, generation 36.9 ms") != NULL);
    // without a matvec figure the generation's weights go at the read bandwidth
    u[BIG].matvec_gbps[2] = 0;
    NM_CHECK(nm_plan_make(u, 4, b, 2, NM_PLAN_LATENCY, &p, err, sizeof err) == NM_OK);
    const double at_read = (8.0 / 60 + 0.5 / 30) + 20e-6 + 26.6667e-3 + 32 * 20e-6; // compute-bound then
    NM_CHECK(fabs(p.steps[1].seconds - at_read) < 1e-6);
    // the one-phase model of the same request: one roofline over both, shorter than either sum
    nm_plan_brick one[2] = {b[0], b[1]};
    memset(&one[1].decode, 0, sizeof one[1].decode);
    u[BIG].matvec_gbps[2] = 5;
    NM_CHECK(nm_plan_make(u, 4, one, 2, NM_PLAN_LATENCY, &p, err, sizeof err) == NM_OK);
    NM_CHECK(fabs(p.steps[1].seconds - ((8.6 / 60 + 1.0 / 30) + 33 * 20e-6)) < 1e-6 && p.steps[1].seconds < want);
    // a dispatch cost per op: 400 ops a pass, 33 passes, 3 us an op, charged in each phase
    u[BIG].op_us = 3;
    l->cost.n_ops = 33 * 400, l->decode.n_ops = 32 * 400;
    NM_CHECK(nm_plan_make(u, 4, b, 2, NM_PLAN_LATENCY, &p, err, sizeof err) == NM_OK);
    NM_CHECK(fabs(p.steps[1].seconds - (want + 33 * 400 * 3e-6)) < 1e-6);
    NM_CHECK(strstr(p.steps[1].why, "prompt 151.2 ms, generation 75.3 ms") != NULL);
}

// Profiles measured here and kept in a file: the CPU runs every type the
// profile measures; the file reads back the same; a file edited by hand is
// checked.
NM_TEST(profile_measure_save_load) {
    nm_unit_profile u[2];
    char err[256], path[64];
    NM_CHECK(nm_unit_measure("cpu", &u[0], err, sizeof err) == NM_OK);
    printf("  cpu: read %.1f GB/s, f32 %.1f, f16 %.1f, q4_0 %.1f, q8_0 %.1f GFLOP/s, launch %.1f us\n", u[0].read_gbps,
           u[0].gflops[0], u[0].gflops[1], u[0].gflops[2], u[0].gflops[8], u[0].launch_us);
    NM_CHECK(u[0].unit == NM_UNIT_CPU && u[0].read_gbps > 0.5 && u[0].gflops_f32 > 0.5 && u[0].launch_us > 0);
    printf("  cpu: %.2f us an op beyond its bytes\n", u[0].op_us);
    // (10-13 us on an EPYC Zen 3 VM, 3-9 us on a Zen 4 one; 0 when the cut pass happens to run no slower
    // than the whole, as once beside a busy process: a timing, so no lower bound)
    NM_CHECK(u[0].op_us >= 0 && u[0].op_us < 1000);
    const int types[] = {0, 1, 2, 3, 6, 8, 12, 13, 14};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) NM_CHECK(u[0].gflops[types[i]] > 0.5);
    // decoding streams the weights from memory: near the read bandwidth, never above it by much
    printf("  cpu matvec: q4_0 %.1f, q8_0 %.1f, f16 %.1f, q4_K %.1f GB/s of weights (read %.1f GB/s)\n",
           u[0].matvec_gbps[2], u[0].matvec_gbps[8], u[0].matvec_gbps[1], u[0].matvec_gbps[12], u[0].read_gbps);
    for (size_t i = 1; i < sizeof types / sizeof types[0]; i++)
        NM_CHECK(u[0].matvec_gbps[types[i]] > 0.1 && u[0].matvec_gbps[types[i]] < 3 * u[0].read_gbps);
    NM_CHECK(u[0].matvec_gbps[0] == 0); // f32 weights: read_gbps
    NM_CHECK(nm_unit_measure("cpu:0", &u[1], err, sizeof err) == NM_OK && u[1].gflops[2] > 0); // a lane of one core
    NM_CHECK(nm_unit_measure("gpu", &u[1], err, sizeof err) == NM_ERR_INVALID_ARG && strstr(err, "'gpu'"));
    NM_CHECK(nm_unit_measure("cpu:999", &u[1], err, sizeof err) == NM_ERR_INVALID_ARG);
    // round trip
    nm_unit_profile ph[4], back[8];
    phone(ph);
    ph[BIG].matvec_gbps[2] = 7.5, ph[GPU].matvec_gbps[8] = 11.25, ph[GPU].op_us = 12.5;
    snprintf(path, sizeof path, "/tmp/nm-profile-%d.json", (int)getpid());
    int32_t n = 0;
    NM_CHECK(nm_units_save(path, ph, 4, err, sizeof err) == NM_OK);
    NM_CHECK(nm_units_load(path, back, 8, &n, err, sizeof err) == NM_OK && n == 4);
    for (int32_t i = 0; i < n && i < 4; i++) {
        NM_CHECK(!strcmp(back[i].name, ph[i].name) && back[i].unit == ph[i].unit && back[i].read_gbps == ph[i].read_gbps);
        NM_CHECK(!memcmp(back[i].gflops, ph[i].gflops, sizeof ph[i].gflops) && back[i].gflops_f32 == ph[i].gflops_f32);
        NM_CHECK(!memcmp(back[i].matvec_gbps, ph[i].matvec_gbps, sizeof ph[i].matvec_gbps));
        NM_CHECK(back[i].mem_bytes == ph[i].mem_bytes && back[i].kinds == ph[i].kinds &&
                 back[i].active_w == ph[i].active_w && back[i].launch_us == ph[i].launch_us &&
                 back[i].op_us == ph[i].op_us);
    }
    NM_CHECK(nm_units_load(path, back, 2, &n, err, sizeof err) == NM_ERR_RANGE && n == 0);
    // hand-edited files: each mistake named
    const struct {
        const char *text, *want;
    } bad[] = {
        {"not json", "not a unit profile"},
        {"{\"units\": 3}", "not a unit profile"},
        {"{\"units\": [{\"name\": \"x\"}]}", "needs name, unit, read_gbps and gflops"},
        {"{\"units\": [{\"name\": \"x\", \"unit\": \"tpu\", \"read_gbps\": 1, \"gflops\": {}}]}", "unknown kind 'tpu'"},
        {"{\"units\": [{\"name\": \"x\", \"unit\": \"cpu\", \"read_gbps\": 1, \"gflops\": {\"q9_9\": 1}}]}", "\"q9_9\" is not a weight type"},
        {"{\"units\": [{\"name\": \"x\", \"unit\": \"cpu\", \"read_gbps\": 0, \"gflops\": {}, \"gflops_f32\": 1}]}", "read_gbps must be > 0"},
        {"{\"units\": [{\"name\": \"x\", \"unit\": \"cpu\", \"read_gbps\": 1, \"gflops\": {}}]}", "needs gflops_f32"},
        {"{\"units\": [{\"name\": \"x\", \"unit\": \"cpu\", \"read_gbps\": 1, \"gflops\": {}, \"gflops_f32\": 1, \"mem_bytes\": -5}]}", "mem_bytes and kinds must be numbers >= 0"},
        {"{\"units\": [{\"name\": \"x\", \"unit\": \"cpu\", \"read_gbps\": 1, \"gflops\": {}, \"active_w\": -2}]}", "active_w must be a number >= 0"},
        {"{\"units\": [{\"name\": \"x\", \"unit\": \"cpu\", \"read_gbps\": 1, \"gflops\": {}, \"op_us\": \"3\"}]}", "op_us must be a number >= 0"},
        {"{\"units\": [{\"name\": \"x\", \"unit\": \"cpu\", \"read_gbps\": 1, \"gflops\": {}, \"gflops_f32\": 1, \"matvec_gbps\": {\"q4_0\": -1}}]}", "matvec_gbps \"q4_0\" is not a weight type with a number"},
        {"{\"units\": [{\"name\": \"x\", \"unit\": \"cpu\", \"read_gbps\": 1, \"gflops\": {}, \"gflops_f32\": 1, \"matvec_gbps\": 3}]}", "matvec_gbps must be an object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        FILE *f = fopen(path, "w");
        if (f) fputs(bad[i].text, f), fclose(f);
        err[0] = '\0';
        NM_CHECK(nm_units_load(path, back, 8, &n, err, sizeof err) == NM_ERR_FORMAT && n == 0);
        if (!strstr(err, bad[i].want)) fprintf(stderr, "  case %zu: %s\n", i, err);
        NM_CHECK(strstr(err, bad[i].want) != NULL);
    }
    unlink(path);
    NM_CHECK(nm_units_load(path, back, 8, &n, err, sizeof err) == NM_ERR_IO);
}

NM_TEST_MAIN()
