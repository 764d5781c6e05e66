// The `nanomind` command: shared helpers of the subcommands.
#ifndef NM_CLI_H
#define NM_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "nanomind.h"

int cmd_run(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_say(int argc, char **argv);
int cmd_transcribe(int argc, char **argv);
int cmd_profile(int argc, char **argv);
int cmd_assistant(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_power(int argc, char **argv);
// The optional parts (CMakeLists.txt, NM_WITH_*: 1 where built, 0 where left
// out). cli_part: true where `built`; else prints that `asked` (a command or a
// flag) needs `part`, naming the CMake option, and returns false.
#ifndef NM_WITH_STT
#define NM_WITH_STT 1
#define NM_WITH_TTS 1
#define NM_WITH_VISION 1
#define NM_WITH_SERVER 1
#define NM_WITH_OPENCL 1
#endif
#define CLI_PART_STT "speech to text (Whisper)", "NM_WITH_STT"
#define CLI_PART_TTS "text to speech (espeak-ng)", "NM_WITH_TTS"
#define CLI_PART_VISION "vision (images, mmproj encoders, the camera)", "NM_WITH_VISION"
#define CLI_PART_SERVER "the HTTP server", "NM_WITH_SERVER"
bool cli_part(const char *asked, bool built, const char *part, const char *option);
// ~/.cache/nanomind/profile.json into buf; false without a HOME.
bool cli_profile_path(char *buf, size_t size);
// The unit profiles from file (NULL: cli_profile_path) into units (NM_PLAN_MAX_UNITS);
// 0, or the exit status after printing why (2: no HOME, 1: a missing or bad file).
int cli_load_units(const char *file, nm_unit_profile *units, int32_t *n_units);

// Options llama.cpp users know, parsed the same way by every subcommand that
// takes them. Each command names the groups it takes; any other option is an
// error naming the command, never silently ignored.
enum {
    CLI_MPATH = 1 << 0,  // -m
    CLI_MODEL = 1 << 1,  // -t --pin -ngl -fa --mlock --no-mmap
    CLI_CTX = 1 << 2,    // -c -b
    CLI_FILE = 1 << 3,   // -f
    CLI_PROMPT = 1 << 4, // -p -e/--no-escape
    CLI_GEN = 1 << 5,    // -n, sampling, --chat, -sys, --chat-template, --jinja, --chat-template-file, --chat-template-kwargs
    CLI_VISION = 1 << 6, // --mmproj --image
    CLI_STATS = 1 << 7,  // --stats
    CLI_LANE = 1 << 8,   // --cores --mmproj-cores
    CLI_PLAN = 1 << 9,   // --plan --plan-goal --profile
    CLI_IMGTOK = 1 << 10, // --image-min-tokens --image-max-tokens
};

typedef struct cli_opts {
    const char *model;      // -m
    const char *prompt;     // -p (escapes processed unless --no-escape, as llama.cpp)
    const char *file;       // -f
    const char *system;     // -sys, --system-prompt (or -sysf's file)
    const char *system_file; // -sysf, --system-prompt-file
    bool no_display_prompt; // run: the completion without the prompt before it
    const char *chat_tmpl;  // --chat-template: a built-in formatter (with --jinja: the fallback)
    bool jinja;             // --jinja: render the model's tokenizer.chat_template (or the file's)
    const char *chat_tmpl_file; // --chat-template-file (implies --jinja)
    char *chat_tmpl_src;    // its text (cli_parse reads it; freed by cli_opts_free)
    const char *chat_tmpl_kwargs; // --chat-template-kwargs: a JSON object of more template variables (needs --jinja)
    size_t chat_tmpl_len;
    const char *mmproj;     // --mmproj: vision encoder + projector (llama.cpp's mmproj GGUF)
#define CLI_MAX_IMAGES 16
#define MEDIA_MARKER "<__media__>" // where an image goes in a prompt (llama.cpp's mtmd marker)
    const char *images[CLI_MAX_IMAGES]; // --image, repeatable
    int32_t n_images;
    int32_t n_predict;      // -n: -1 (default) until end of text or a full context
    int32_t n_threads;      // -t: 0 (default, or -1) all cores
    int32_t n_ctx;          // -c: -1 not given (the model's training context, at most 4096); 0 the training context
    int32_t n_batch;        // -b
    int32_t n_ubatch;       // -ub
    int32_t n_gpu_layers;   // -ngl: layers on --device (the last N); -1 (default, or all/auto) every one
    const char *device;     // -dev, --device: cpu (default), opencl, opencl:N
    const char *mmproj_device; // --mmproj-device: the vision encoder's (default: --device)
    int32_t image_min_tokens, image_max_tokens; // --image-min-tokens, --image-max-tokens (0: the model's)
    const char *cores;      // --cores: the LLM brick's lane (a core list, big, little, cluster:N)
    const char *mmproj_cores; // --mmproj-cores: the vision brick's lane
    bool plan;              // --plan: print the planner's placement and exit
    int plan_goal;          // --plan-goal: nm_plan_goal
    const char *profile;    // --profile FILE: unit profiles (default ~/.cache/nanomind/profile.json)
    bool chat;              // --chat, -cnv; -no-cnv clears it
    bool chat_given;        // one of them was given (run: else a conversation if the model has a chat template,
                            // as llama-completion; -sys and --chat-template ask for one)
    bool stats;             // --stats
    bool help;              // -h
    bool version;           // --version
    bool pin;               // --pin
    bool mlock;             // --mlock: keep every page in RAM (mlockall)
    bool no_mmap;           // --no-mmap: read the model into memory instead of mapping it
    bool no_escape;         // --no-escape
    bool seed_random;       // --seed -1 (or none): a random seed, printed by --stats
    bool ignore_eos;        // --ignore-eos
    const char *stop[NM_LLM_MAX_STOP]; // -r, --reverse-prompt (repeatable): stop strings
    int32_t n_stop;
    char *prompt_owned;     // the escape-processed -p (freed by cli_opts_free)
    char *system_owned;     // -sysf's text (freed by cli_opts_free)
    nm_sampler_params sp;
} cli_opts;

// Parses argv[1..] for command `cmd` taking the option groups `groups`; the
// positional argument (if the command takes one) goes to *positional.
// Returns false (after printing why) on a bad option or value.
bool cli_parse(const char *cmd, unsigned groups, int argc, char **argv, cli_opts *o, const char **positional);
void cli_opts_free(cli_opts *o);
// Prints, on stderr, where the context computes when it is not the CPU, and
// why --device auto fell back to the CPU.
void cli_ctx_note(const nm_ctx *c);
// The context size for -c: the given value, the training context for 0, or the default.
int32_t cli_ctx_size(const cli_opts *o, const nm_model *m);
// The conversation through the chat template with the assistant's turn
// opened: malloc'd, or NULL with *st. With --jinja (or --chat-template-file)
// the Jinja template renders it (nm_chat_format_jinja); one beyond the
// interpreter's subset falls back to the built-in formatter, said once on
// stderr, naming both; a template that refuses the conversation is
// NM_ERR_TEMPLATE (printed). Otherwise the built-in formatter (--chat-template
// or the model's family): NULL with *st NM_ERR_TEMPLATE (no template we know,
// nothing printed) or NM_ERR_NOMEM. Thread-safe.
char *cli_chat_text(const nm_model *m, const cli_opts *o, const nm_chat_msg *msgs, size_t n, nm_status *st);
// The LLM brick's parameters from the options (run's and the assistant's):
// the loaded model, context, threads, lane, device, sampling, -n, stop strings,
// a slot per token; counted in ledger.
// The model and device options every command that loads an LLM takes (CLI_MODEL), for its --help.
#define CLI_HELP_MODEL                                                                                           \
    "  -dev, --device DEV       the LLM's unit: cpu (the default), opencl, opencl:N, or auto (the first OpenCL\n" \
    "                           GPU if the model fits there, else the CPU); nanomind --list-devices lists them\n" \
    "  -ngl, --n-gpu-layers N   with a device: the last N layers and the output head on it (-1, all: every\n"   \
    "                           layer, the default); with the CPU a note that every layer runs there\n"           \
    "  --no-mmap                read the model into memory instead of mapping the file\n"                        \
    "  --mlock                  keep the model's pages in RAM\n"

// What a command loads (for the hint a failed load gives).
typedef enum { CLI_WANT_LLM, CLI_WANT_WHISPER, CLI_WANT_MMPROJ } cli_want;
// Prints "error: cannot load[ WHAT] 'PATH': STATUS: ERR" and, when PATH is another kind of model (its
// general.architecture), which command or flag takes it.
void cli_load_error(const char *path, nm_status st, const char *err, cli_want want);
nm_brick_params cli_llm_params(const cli_opts *o, nm_model *m, nm_ledger *ledger);
// The chat's options (-sys, --chat-template, --jinja, --chat-template-file) into a pipeline's parameters
// (chat: the caller's).
void cli_chat_params(const cli_opts *o, nm_pipeline_params *pp);
// The vision brick's parameters for --mmproj FILE `mmproj` (media.c), for a
// pipeline (which sets the LLM brick it feeds and its ledger), on `device`
// (NULL: -dev), with -t and --mmproj-cores.
nm_brick_params cli_vision_params(const cli_opts *o, const char *mmproj, const char *device);
// Prints why the vision brick of `mmproj` did not load (err: the brick's message).
void cli_vision_error(const cli_opts *o, const char *mmproj, nm_status st, const char *err);
// --mlock, after the model is loaded: every mapped page kept in RAM (a
// warning, not an error, when the system refuses, as llama.cpp).
void cli_mlock(const cli_opts *o);
void cli_print_version(void); // "nanomind VERSION"
// Option values in [lo, hi]; false (after printing which option and range) otherwise.
bool cli_arg_int(const char *opt, const char *v, int32_t lo, int32_t hi, int32_t *out);
bool cli_arg_float(const char *opt, const char *v, float lo, float hi, float *out);
double cli_now(void); // seconds, monotonic

long cli_peak_rss_kb(void);
// Current resident memory split into anonymous (heap: our allocations) and
// file-backed (the mmapped weights) from /proc/self/status; false if unknown.
bool cli_rss_split(long *anon_kb, long *file_kb);
// The cap on a text file read whole (a prompt, a perplexity text, a key list):
// nm_infile_read refuses a larger one before reading it.
#define CLI_TEXT_FILE_MAX (256ull << 20)
// The cap on an image read from stdin (--image -): what the vision brick's slot takes.
#define CLI_IMAGE_FILE_MAX (64ull << 20)

// ---- energy of a run (the assistant's --stats and --json, `power energy`):
// the model of docs/power.md (nm_energy_model_joules) for the machine's CPU
// unit, from what a run used. Its watts are the unit profile's (`nanomind
// profile`: measured where a meter sees the unit, or written there by hand);
// else those of the board docs/power.md assumes (an RK3566-class board,
// screen off).
#define CLI_BOARD_IDLE_W 0.25
#define CLI_BOARD_ACTIVE_W 2.5 // its CPU cluster, every core busy at the top clock
typedef struct cli_energy {
    double idle_w, active_w; // the unit idle; with every core of it busy
    double pj_byte;          // DRAM energy a byte (0: the model's default)
    int32_t n_cores;         // the unit's cores (the machine's online CPUs for "cpu")
    char source[1100];       // where the watts come from: "profile FILE, unit cpu" or the board's
    char file[1024];         // the profile read ("": none)
    nm_unit_profile units[NM_PLAN_MAX_UNITS]; // its units (other units' watts: cli_energy_device)
    int32_t n_units;
} cli_energy;
// The board's figures, the machine's online CPUs.
cli_energy cli_energy_default(void);
// The figures from the profile (NULL: the default one, ~/.cache/nanomind/
// profile.json, whose absence is no error): its CPU unit's watts ("cpu", else
// the first CPU unit with watts), else the board's. false (after a message)
// where a profile named by the caller cannot be read; a broken default one is
// reported and the board used.
bool cli_energy_load(const char *profile, cli_energy *e);
// The watts of the unit a brick ran on ("opencl:0" ...) where the profile
// knows them: true and the unit's figures in *out.
bool cli_energy_device(const cli_energy *e, const char *device, cli_energy *out);
// A run that used cpu_s CPU-seconds (every thread, user + system) over wall_s
// seconds and moved dram_bytes: the cluster busy cpu_s / n_cores, idle the rest.
double cli_energy_run(const cli_energy *e, double cpu_s, double wall_s, double dram_bytes);
// Work of thread_s thread-seconds moving dram_bytes: what it adds over idle.
double cli_energy_work(const cli_energy *e, double thread_s, double dram_bytes);
double cli_cpu_seconds(void); // this process's user + system time

#endif
