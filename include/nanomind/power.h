// nanomind's public API, part: power: the battery, the policy, the actuators, energy.
// Included by <nanomind.h> (its conventions, types and visibility apply): include that.
#ifndef NANOMIND_POWER_H
#define NANOMIND_POWER_H
#ifndef NANOMIND_H
#error "include <nanomind.h>, not its parts"
#endif

// ==== power: the battery, the policy, the actuators, energy ================================
// Owner: src/power/; docs/power.md. A battery source gives the charge B; the
// policy turns it into one of three states and the rates every other part
// follows (the camera's frame rate, the decoder's pace, threads, DVFS); the
// actuators write the DVFS targets under a sysfs root and put everything back;
// meters measure energy where the machine has one, the model estimates it
// where it has none, and every figure says which.

typedef enum nm_power_state {
    NM_POWER_UNCONSTRAINED = 0, // B >= T_high: everything at full speed
    NM_POWER_PROPORTIONAL = 1,  // T_low <= B < T_high: rates scaled by alpha = (B - T_low) / (T_high - T_low)
    NM_POWER_CRITICAL = 2,      // B < T_low: the cascade (event-triggered; each brick load -> run -> release)
} nm_power_state;
// "unconstrained", "proportional", "critical" (static strings).
const char *nm_power_state_name(nm_power_state s);

// --- battery sources
// A reading the source gives is checked before the policy sees it: a missing
// or unreadable value, a non-finite one, one below 0 % or above 100 % is
// rejected (the last accepted charge is kept); a jump of more than
// NM_BATTERY_JUMP_PCT points from the last accepted charge is held until
// NM_BATTERY_CONFIRM readings in a row agree with it (within 2 points), so one
// glitch moves nothing while a real change (a swapped battery) is taken.
// Every rejection and hold is reported in the reading's note.
#define NM_BATTERY_JUMP_PCT 10.0
#define NM_BATTERY_CONFIRM 3

typedef struct nm_battery nm_battery;

typedef struct nm_battery_reading {
    double t_s;       // when: the trace's clock, or the caller's
    double raw_pct;   // what the source gave (NAN: nothing readable)
    double pct;       // the charge the policy uses (the last accepted; NAN until one is)
    double watts;     // drawn from the battery (NAN: unknown); negative while charging
    int32_t charging; // 1 charging or full, 0 discharging, -1 unknown
    bool accepted;    // raw_pct was taken as pct
    char note[160];   // why a reading was rejected or held ("" when accepted)
} nm_battery_reading;

// Linux power_supply: the first supply of type "Battery" (by name) under
// root/class/power_supply (root NULL: "/sys"), or the one named. Charge from
// `capacity`, else energy_now/energy_full or charge_now/charge_full; watts from
// power_now, else current_now x voltage_now; `status` for charging. No battery:
// NM_ERR_UNSUPPORTED naming the folder looked in.
nm_status nm_battery_open_sysfs(const char *root, const char *name, nm_battery **out, char *err, size_t err_size);
// A replayed trace: CSV rows `seconds,percent[,watts]`, seconds strictly
// increasing, an optional header line (a first line that is not numbers); an
// empty percent is a missing reading (rejected at replay, not a format
// error); out-of-range percents are replayed as the nonsense they are. A
// reading at time t is the last row at or before t (the first before it
// starts). NM_ERR_IO (the path and errno), NM_ERR_FORMAT (path:line and the text).
nm_status nm_battery_open_trace(const char *path, nm_battery **out, char *err, size_t err_size);
// A fixed charge (0..100), for a machine without a battery or a what-if.
nm_status nm_battery_open_fixed(double pct, nm_battery **out, char *err, size_t err_size);
// The trace's first and last time (0, 0 for the other sources).
void nm_battery_span(const nm_battery *b, double *t0, double *t1);
// Reads the source at time t_s (a trace's clock; recorded for the others) and
// filters it (above). Never fails on a bad value: that is a rejected reading.
void nm_battery_read(nm_battery *b, double t_s, nm_battery_reading *out);
// "sysfs:/sys/class/power_supply/BAT0", "trace:FILE (N rows, T0..T1 s)", "fixed:55%".
int32_t nm_battery_describe(const nm_battery *b, char *buf, int32_t size);
void nm_battery_free(nm_battery *b); // NULL: no-op

// --- the policy
typedef struct nm_power_params {
    double t_high, t_low;   // percent: unconstrained at or above t_high, critical below t_low (60, 20)
    double hysteresis;      // points B must climb past a threshold before the state rises again (2)
    double fps_max;         // camera frames a second unconstrained (2)
    double fps_min;         // ... at alpha 0 in the proportional state (0.25); critical: 0 (event-triggered)
    double share_min;       // the decoder's pace and each unit's frequency share at alpha 0 (0.25)
    double decode_tps;      // tokens/s the decoder reaches unthrottled (0: unknown, no tokens/s cap given)
    int32_t n_threads;      // threads unconstrained (0: every core)
} nm_power_params;
nm_power_params nm_power_default_params(void);
// NM_ERR_INVALID_ARG naming the field: thresholds outside 0..100 or t_low >=
// t_high, hysteresis negative or not below t_high - t_low, rates negative or
// fps_min > fps_max, share_min outside 0..1.
nm_status nm_power_params_check(const nm_power_params *p, char *err, size_t err_size);

// What the policy asks of everything else at one charge.
typedef struct nm_power_targets {
    nm_power_state state;
    double alpha;          // 1 unconstrained; (B - t_low) / (t_high - t_low) in [0, 1] proportional; 0 critical
    double fps;            // camera: fps_max; fps_min + alpha (fps_max - fps_min); 0 (frames on events only)
    double decode_share;   // the decoder's pace as a share of its full speed: 1; share_min + alpha (1 - share_min)
    double decode_tps_cap; // decode_share x decode_tps (0: no cap: unconstrained, or decode_tps unknown)
    double freq_share;     // DVFS: each unit's top frequency at min + share x (max - min): decode_share (not the
                           // lowest clock in the critical state: below a point a slower clock costs more energy)
    int32_t n_threads;     // n_threads; at least 1, scaled by decode_share; critical: 1
    bool cascade;          // critical: each brick load -> run -> release
} nm_power_targets;

typedef struct nm_power_policy {
    nm_power_params p;
    nm_power_state state;
    double pct;            // the last charge stepped (NAN before the first)
    bool started;          // the first step sets the state from B without hysteresis
} nm_power_policy;
// p NULL: the defaults. NM_ERR_INVALID_ARG as nm_power_params_check.
nm_status nm_power_policy_init(nm_power_policy *pol, const nm_power_params *p, char *err, size_t err_size);
// One charge reading (percent; NAN: keep the state) -> the state and targets.
// Falling: below t_high -> proportional, below t_low -> critical, at once.
// Rising: a state is left upward only when B >= its upper threshold + hysteresis.
nm_power_targets nm_power_policy_step(nm_power_policy *pol, double pct);

// --- actuators: DVFS under a sysfs root
// Found under root (NULL: "/sys"): cpufreq policies
// (devices/system/cpu/cpufreq/policyN: scaling_max_freq within
// cpuinfo_min_freq..cpuinfo_max_freq, or the userspace governor's
// scaling_setspeed) and devfreq devices (class/devfreq/NAME: max_freq within
// available_frequencies, or the userspace governor's userspace/set_freq), each
// given a role by its name (memory: dmc/ddr/bus/memory; gpu: gpu/mali/kgsl;
// npu: npu; others are left alone). A target is min + freq_share x (max - min),
// rounded up to the next available frequency.
//
// Before the first write the original value of every file that may be written
// is saved in the restore record (a small text file: the owner's pid, then
// `path<TAB>value` lines, written whole or not at all). A record left by a
// process that is gone is restored first; one whose owner lives is refused.
// Every apply checks every file it will write (present, writable, the governor
// offered by the kernel) before writing any, and puts back what it wrote if a
// write fails midway: nothing is left half-written. Restore (and free, and a
// crash of the process: SIGSEGV/SIGBUS/SIGILL/SIGFPE/SIGABRT, with
// nm_power_actuators_guard) writes the originals back and removes the record.
typedef struct nm_power_actuators nm_power_actuators;

typedef struct nm_actuator_params {
    const char *sysfs_root;      // NULL: "/sys"
    const char *record;          // the restore record's path (NULL: ~/.cache/nanomind/power-restore.txt)
    const char *cpu_governor;    // NULL: keep the governor, cap scaling_max_freq; "userspace": set scaling_setspeed;
                                 // another name: set that governor and cap scaling_max_freq
    const char *devfreq_governor;// the same for devfreq (max_freq; "userspace": userspace/set_freq)
    bool dry_run;                // write nothing (no record either); print each write to log
    FILE *log;                   // each write as "write PATH VALUE" (dry run: "would write ..."); NULL: none
} nm_actuator_params;
nm_actuator_params nm_actuator_default_params(void);

// NM_ERR_UNSUPPORTED when the root has no cpufreq policy and no devfreq
// device with a role; NM_ERR_STATE when a live process holds the record;
// NM_ERR_IO naming the path when the root cannot be read.
nm_status nm_power_actuators_open(const nm_actuator_params *p, nm_power_actuators **out, char *err,
                                  size_t err_size);
// One line per actuator: its path, role, range, governor, what it would be set to.
int32_t nm_power_actuators_describe(const nm_power_actuators *a, char *buf, int32_t size);
// Writes the targets' frequency share (and governor) to every actuator; a
// value already there is not written again. Errors name the file and errno;
// on any error nothing stays changed by this call.
nm_status nm_power_actuators_apply(nm_power_actuators *a, const nm_power_targets *t, char *err, size_t err_size);
// Writes every saved original back (each tried; the first error returned) and
// removes the record once all are back.
nm_status nm_power_actuators_restore(nm_power_actuators *a, char *err, size_t err_size);
// Restores on a fatal signal of this process (one actuator set at a time;
// NULL: no longer guarded). The originals are written from memory prepared
// here, with calls safe in a signal handler; then the signal is raised again.
void nm_power_actuators_guard(nm_power_actuators *a);
// Restores (errors ignored) and frees. NULL: no-op.
void nm_power_actuators_free(nm_power_actuators *a);
// Restores what a record names (a process that died without restoring):
// NM_ERR_STATE while its owner lives, NM_ERR_FORMAT for a record that is not
// one; removes the record once every value is back.
nm_status nm_power_restore_record(const char *record, FILE *log, char *err, size_t err_size);

// --- energy: measured where a meter exists
// Meters found under root (NULL: "/sys"): RAPL packages
// (class/powercap/intel-rapl:N/energy_uj, wrap-around at max_energy_range_uj),
// hwmon energy (energyN_input, uJ) and power (powerN_input, uW) inputs, INA3221
// rails (inN_input mV x currN_input mA), the battery's power_supply power; and,
// with nvml, NVIDIA GPUs through libnvidia-ml.so.1 (dlopen'd; total energy in mJ).
// Power meters are sampled by a thread (every 50 ms) between start and stop.
typedef struct nm_energy_meters nm_energy_meters;
#define NM_ENERGY_MAX_METERS 16
typedef struct nm_energy_reading {
    int32_t n;                            // meters
    char name[NM_ENERGY_MAX_METERS][48];  // "rapl:package-0", "nvml:0 NVIDIA H200", "hwmon:ina3221:VDD_IN" ...
    double joules[NM_ENERGY_MAX_METERS];  // between start and stop
    double seconds;
} nm_energy_reading;
// NM_OK with no meter at all is possible (count 0): the energy is then modelled.
nm_status nm_energy_meters_open(const char *root, bool nvml, nm_energy_meters **out, char *err, size_t err_size);
int32_t nm_energy_meters_count(const nm_energy_meters *m);
// One line per meter found, and one per meter found but unreadable (with why).
int32_t nm_energy_meters_describe(const nm_energy_meters *m, char *buf, int32_t size);
nm_status nm_energy_meters_start(nm_energy_meters *m, char *err, size_t err_size);
nm_status nm_energy_meters_stop(nm_energy_meters *m, nm_energy_reading *out, char *err, size_t err_size);
// The joules since start so far, the meters still running (a server's counters): thread-safe
// against the sampler and other readers. A counter that wraps is followed across wraps as long
// as it is read at least once a wrap period (RAPL: ~1 h at 65 W). NM_ERR_STATE before start.
nm_status nm_energy_meters_read(nm_energy_meters *m, nm_energy_reading *out, char *err, size_t err_size);
void nm_energy_meters_free(nm_energy_meters *m); // NULL: no-op

// --- energy: modelled where none exists
// A unit's energy for work that kept it busy busy_s within span_s seconds, at
// the clock at a share s in (0, 1] of its top (the work takes busy_s / s): the
// watts the work adds over idle are a static part, NM_ENERGY_STATIC_SHARE of
// them (an awake core leaks and clocks whether it switches or not), and a
// dynamic part that falls as s^3 (f x V^2, V following f); so a lower clock
// saves energy only down to a point, past which the longer time costs more.
// Plus the idle watts over the rest of span_s and dram_bytes of memory traffic
// at pj_per_byte (0: 80 pJ, an LPDDR4X-class figure; docs/power.md).
#define NM_ENERGY_STATIC_SHARE 0.3
double nm_energy_model_joules(const nm_unit_profile *u, double busy_s, double span_s, double freq_share,
                              double dram_bytes, double pj_per_byte);

#endif
