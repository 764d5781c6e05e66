// nanomind's public API, part: the planner: unit profiles, bricks onto units.
// Included by <nanomind.h> (its conventions, types and visibility apply): include that.
#ifndef NANOMIND_PLANNER_H
#define NANOMIND_PLANNER_H
#ifndef NANOMIND_H
#error "include <nanomind.h>, not its parts"
#endif

// ==== the planner: bricks onto units ========================================================
// Owner: src/sched/planner.c; docs/scheduler.md. A pipeline is a chain of
// bricks every request passes through in order (STT -> LLM -> TTS, VISION ->
// LLM); the planner maps each brick, and the decoder's layers (two ranges,
// on two units), to a unit, from the units' profiles and the bricks'
// estimates (nm_brick_estimate), under the units' memory, for a goal.
//
// A brick's time on a unit is the roofline of its estimate: the larger of
// its arithmetic (each weight type's FLOPs at the unit's speed for that type,
// the rest at its f32 speed) and its streamed bytes (weights + activations at
// the unit's read bandwidth), plus a launch overhead per forward pass and a
// dispatch cost per op (n_ops x op_us). A
// request's latency is the sum over the chain (each brick waits for the
// previous one's output); the period (the time between two requests in a
// stream, e.g. camera frames) is the busiest unit's summed time; the energy
// of a request is each unit's busy time at its active watts plus, over the
// latency, the idle watts of the units that wait.

#define NM_PLAN_MAX_UNITS 8
#define NM_PLAN_MAX_BRICKS 8
#define NM_PLAN_MAX_PLACEMENTS 20000000 // the search's bound (a few seconds); more: NM_ERR_RANGE

typedef struct nm_unit_profile {
    char name[32];                 // "cpu:big", "opencl:0", "npu" ...
    nm_unit unit;
    double read_gbps;              // memory read bandwidth
    double gflops[NM_EST_TYPES];   // matmul speed by weight type (GGUF type id); 0: the unit cannot run it
    double gflops_f32;             // everything else (attention, norms, convolutions)
    double launch_us;              // overhead per forward pass
    uint64_t mem_bytes;            // memory it may hold bricks in; 0: no limit
    double idle_w, active_w;       // watts: measured (nm_unit_measure_watts) or configured; 0: unknown
    uint32_t kinds;                // bit (1 << nm_brick_kind) per kind it takes; 0: all (a static-shape NPU: vision)
    double matvec_gbps[NM_EST_TYPES]; // decoding: the weight bytes a second a one-token matmul streams from
                                      // memory, by weight type; 0: not measured (read_gbps is used)
    double op_us;                  // dispatch cost of one op inside a pass (its barrier); 0: not measured
} nm_unit_profile;

typedef struct nm_plan_brick {
    nm_brick_kind kind;
    const char *name;              // for the plan's text; borrowed
    nm_brick_cost cost;            // its estimate for a typical request
    uint32_t units;                // NM_UNIT_BIT mask of the kinds of unit it can run on (nm_brick_i.units)
    int32_t n_layer;               // LLM: layers (> 1: it may be split in two ranges); 0: never split
    nm_brick_cost decode;          // LLM: the generation's part of `cost` (one token a pass), scored apart from
                                   // the prompt's (compute-bound) at the unit's matvec_gbps; zero: one phase
} nm_plan_brick;

typedef enum nm_plan_goal {
    NM_PLAN_LATENCY = 0,    // the shortest request, then the shortest period
    NM_PLAN_THROUGHPUT = 1, // the shortest period (most frames a second), then latency
    NM_PLAN_ENERGY = 2,     // the fewest joules a request, then latency
} nm_plan_goal;

typedef struct nm_plan_step {
    int32_t unit;           // index into the profiles
    int32_t unit2;          // LLM split: the unit of its last layers (-1: not split)
    int32_t split;          // layers on `unit` (the first ones) when split
    double seconds;         // its time
    double joules;
    char why[160];          // the reason: what bounds it there, and the best other unit's time
} nm_plan_step;

typedef struct nm_plan {
    int32_t n;                                 // bricks
    nm_plan_step steps[NM_PLAN_MAX_BRICKS];
    double latency_s, period_s, joules;
    double busy_s[NM_PLAN_MAX_UNITS];          // per unit, a request's work there
    uint64_t mem[NM_PLAN_MAX_UNITS];           // per unit, the bricks' peak bytes
    int64_t n_considered;                      // placements looked at
} nm_plan;

// Measures a unit: "cpu" (every core), "cpu:big", "cpu:little",
// "cpu:cluster:N" or "cpu:LIST" (a lane: the measuring thread and its pool on
// those cores), "opencl", "opencl:N": read bandwidth, matmul GFLOP/s by
// weight type (64 tokens of a 1024 x 2048 weight; 0 where the unit has no
// kernel for the type), launch overhead. Watts are not measured here (0: see
// nm_unit_measure_watts). Takes a few seconds.
nm_status nm_unit_measure(const char *unit, nm_unit_profile *out, char *err, size_t err_size);
// The unit's watts into io->idle_w and io->active_w, measured by the energy
// meters under root (NULL: "/sys"; see nm_energy_meters_open) that see it: a
// CPU unit the RAPL packages (summed), else the board's input (an INA3221
// VDD_IN rail, the battery, a socket or package hwmon input, else the first
// hwmon input: they see the whole board); an OpenCL unit its GPU's NVML meter.
// Idle over idle_s seconds (nothing of ours running), then busy_s seconds of
// the unit's f32 matmul on all of it, over and over. source gets the meters'
// names. NM_ERR_UNSUPPORTED (why in err, io untouched) when no meter sees the
// unit or the meter did not move.
nm_status nm_unit_measure_watts(const char *unit, const char *root, double idle_s, double busy_s,
                                nm_unit_profile *io, char *source, size_t source_size, char *err, size_t err_size);
// The profiles as JSON ({"version": 1, "units": [{"name", "unit", "read_gbps",
// "gflops_f32", "gflops": {"q4_0": x, ...}, "launch_us", "op_us", "mem_bytes",
// "idle_w", "active_w", "kinds"}]}) through nm_outfile, and back (a file
// edited by hand is checked: unknown weight types, negative numbers, missing
// keys are NM_ERR_FORMAT naming the unit).
nm_status nm_units_save(const char *path, const nm_unit_profile *units, int32_t n, char *err, size_t err_size);
nm_status nm_units_load(const char *path, nm_unit_profile *units, int32_t max, int32_t *n, char *err,
                        size_t err_size);

// The best placement of the chain for the goal; deterministic (ties go to the
// lower unit index, then to no split). NM_ERR_UNSUPPORTED (err names the
// brick) when some brick fits no unit (kind, weight type, memory);
// NM_ERR_RANGE when there are more than NM_PLAN_MAX_PLACEMENTS placements.
nm_status nm_plan_make(const nm_unit_profile *units, int32_t n_units, const nm_plan_brick *bricks, int32_t n_bricks,
                       nm_plan_goal goal, nm_plan *out, char *err, size_t err_size);
// The plan as text: a line per brick (unit, time, why), then latency, period,
// energy and each unit's memory. Returns the length, or -(needed).
int32_t nm_plan_format(const nm_plan *p, const nm_unit_profile *units, const nm_plan_brick *bricks, char *buf,
                       int32_t size);

#endif
