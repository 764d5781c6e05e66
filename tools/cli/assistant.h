// nanomind assistant's parts: a client of nm_pipeline (docs/pipeline.md).
// cmd_assistant.c: the pipeline made from the options, the questions
// submitted, its events read (text to stdout, speech to files or a speaker);
// assistant_options.c: the command line; assistant_events.c: where the
// questions come from (files, folders, a watched folder, the microphone, a
// camera); assistant_report.c: --stats, --json and the energy. docs/cli.md.
#ifndef NM_CLI_ASSISTANT_H
#define NM_CLI_ASSISTANT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "cli.h"

#define MAX_ITEMS 4096
#define MAX_QUESTION_S 60 // seconds of audio a question may bring

// A question: what the command gave the pipeline, and what its events said.
typedef struct item {
    const char *audio;    // its audio file, or NULL (typed, or heard by the microphone)
    const char *frame;    // its frame (a file), or NULL
    bool camera;          // its frame is the camera's newest
    uint64_t id;          // its request (0: the pipeline refused it)
    char question[2048];  // typed (-p), or what was asked of the transcript (ASKED)
    char heard[2048];     // its transcript (TRANSCRIPT)
    bool failed, skipped, cascade;
    bool spoken;          // its speech came (AUDIO)
    char why[512];        // DONE's text: a failure's message, or why a gate stopped it
    int32_t n_prompt, n_tokens;
    nm_pipeline_timings t;
    double t_start;       // from the run's start: when it was taken (a heard one: when the utterance ended)
    double base;          // its timings (from its submit) less this: from its start
} item;

typedef struct energy_report {
    cli_energy model;
    double cpu_s, dram, run_j, brick_j[5];
    bool brick_on_device[5];      // a device's watts from the profile (else the CPU's, by its threads)
    char brick_source[5][1100];
    nm_energy_reading measured;
} energy_report;

typedef struct app {
    // options (assistant_options.c)
    const char *stt_model, *audio, *frames, *out_dir, *tts_engine, *voice, *stt_cores, *tts_cores, *json_path,
        *tts_device;
    const char *wake_words;    // --wake-words LIST (the pipeline's gate)
    float fps, listen_s, frame_change;
    bool sequential, barge_in;
    const char *mic_dev, *speaker_dev; // --audio mic[:DEV], --out speaker[:DEV]
    const char *watch_dir;     // --audio watch:DIR or --frames watch:DIR: questions as files arrive there
    bool watch_frames;         // it is the frames' folder (a typed question asked of each)
    bool live;                 // the questions come during the run (the microphone, a watched folder, a camera)
    const char *camera_dev;    // --frames /dev/videoN: each question's frame is the camera's newest
    double battery_speed;      // trace seconds a second of the run
    const char *battery_src, *power_sysfs; // --battery, --power-sysfs
    bool cascade_always;       // --cascade
    cli_opts o;
    // what runs
    nm_pipeline *P;
    nm_ledger *ledger;
    nm_brick_params lp, vp, sp, tp; // the bricks' parameters (--plan places them)
    nm_unit_profile units[NM_PLAN_MAX_UNITS]; // --plan: the profiles (the cores strings point into them)
    int32_t n_units;
    nm_battery *battery;
    nm_power_actuators *dvfs;
    nm_camera *camera;         // NULL when there is none (absent, or gone: the questions go without a frame)
    nm_pipeline_image heard_cam; // the microphone's questions' image: the camera (the pipeline borrows it)
    nm_audio_player *player;   // --out speaker (NULL: absent, the answers not spoken: submitted silent)
    int watch_fd;              // inotify's, or -1
    // the questions, in the order of their requests (under lock)
    item *items;
    int n_items, cap_items;
    char **owned; // paths listed from the folders, and the watched folder's arrivals
    int n_owned;
    double t0;                 // the run's start (the pipeline made)
    double t_create;           // when nm_pipeline_create returned (timings.submitted count from about then)
    // the events' (the pipeline's delivery thread: on_event in cmd_assistant.c): the speech file being
    // written (--out DIR: the request whose AUDIO it holds; 0: none open), the answer being printed
    struct speech_file {
        nm_outfile f;
        uint64_t id;
        bool bad;
        uint64_t bytes;
        char path[4096];
    } speech;
    uint64_t open_id;
    // the events' (under lock)
    int n_done, n_cascaded;
    int32_t threads_said;      // the bricks' threads the last POWER event gave (0: none yet)
    double fps_cap;            // frames a second the policy allows (0: no cap)
    int32_t tts_rate;          // the voice's sample rate (its AUDIO events')
    bool camera_gone;          // a request's frame failed: the camera is gone
    bool src_failed;           // the microphone's stream had an utterance the pipeline refused
    // energy (--stats, --json): the meters where the machine has some, the process's CPU time at the start
    nm_energy_meters *meters;
    double cpu0;
    energy_report energy;
    nm_pipeline_brick_report rep[5]; // the bricks' reports at the end (by nm_brick_kind)
    pthread_mutex_t lock;
    pthread_cond_t cond;
} app;

static inline double now(const app *A) { return cli_now() - A->t0; }

// ---- assistant_options.c: the command line
// The options into A (argv: the command's, argv[0] its name), checked. -1: go
// on; else the exit status (0 after --help or --version, 2 on a usage error,
// said on stderr), the options freed.
int assistant_options(app *A, int argc, char **argv);

// ---- assistant_events.c: the questions
// The questions from the options: a file or a folder's files (in name order)
// for --audio and --frames, or none yet (they come during the run). False
// (error printed) on a bad path.
bool assistant_make_items(app *A);
// A question more (under A->lock): the next item, its request not yet made;
// NULL when there is no room for another.
item *assistant_add_item(app *A);
// Submits question it (its audio, its frame, the typed question) to the
// pipeline; false (the error printed, the question marked failed) where it
// refuses it.
bool assistant_submit(app *A, item *it);
// The sources (each ends at --listen seconds or Ctrl-C, then returns):
// the microphone (each utterance a question, cut by the pipeline), a watched
// folder (each file that arrives), a camera with -p (a question of its
// newest frame each time the last is answered, at --fps and the policy's
// rate). False when the source failed (said).
bool assistant_listen_mic(app *A);
bool assistant_watch_open(app *A);
bool assistant_watch(app *A);
bool assistant_camera_open(app *A);
bool assistant_camera_questions(app *A);
// Ctrl-C stops listening (what was heard is answered); twice quits.
void assistant_catch_sigint(void);
bool assistant_stopped(void);

// With --out DIR: question i's answer file, empty (it failed: no speech).
void assistant_silent_answer(app *A, int i);

// ---- assistant_report.c: the figures at the end
void assistant_energy_end(app *A, double wall);
bool assistant_write_json(app *A, double wall);
void assistant_print_stats(app *A, double wall);

#endif
