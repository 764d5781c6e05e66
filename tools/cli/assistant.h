// nanomind assistant's parts (cmd_assistant.c: the loop, the pipeline and
// the cascade; assistant_options.c: the command line; assistant_events.c:
// where the questions come from; assistant_report.c: --stats, --json and the
// energy). docs/cli.md.
#ifndef NM_CLI_ASSISTANT_H
#define NM_CLI_ASSISTANT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "cli.h"

#define MAX_ITEMS 4096
#define MAX_QUESTION_S 60     // seconds of audio a question slot holds
#define SAY_SLOT_BYTES 4096   // text of a sentence (or a few) for the TTS brick
#define LLM_IN_SLOTS 8        // a prompt's parts (text, image segment, text) for two questions
#define SPEECH_SLOTS 64
#define SENTINEL "\x1fQUESTION\x1f"

typedef struct item {
    const char *audio;   // the question's audio file, or NULL (typed)
    const char *frame;   // its frame, or NULL
    char question[2048]; // transcript (or -p)
    bool from_mic;       // an utterance the microphone heard: its audio is in the STT ring already
    bool failed;         // heard nothing or a brick failed it: the answer is empty
    const char *skipped; // not answered, and why (no wake word, the frame unchanged); not a failure
    int64_t n_heard;     // a heard question's samples (in the microphone's ring)
    int32_t n_tokens;
    int32_t n_prompt;    // prompt positions sent to the decoder (text tokens and image rows)
    size_t n_said;       // bytes of the answer given to the voice
    int64_t n_samples;
    // seconds, from the loop's start
    double t_start;      // the question is whole (its audio read)
    double t_heard, t_first_tok, t_answered, t_first_audio, t_spoken;
} item;

typedef struct lane {
    nm_brick *b;
    nm_tabm *in, *out;
    pthread_t th;
    bool started;
} lane;

typedef struct energy_report {
    cli_energy model;
    double cpu_s, dram, run_j, brick_j[4];
    bool brick_on_device[4];      // a device's watts from the profile (else the CPU's, by its threads)
    char brick_source[4][1100];
    nm_energy_reading measured;
} energy_report;

typedef struct app {
    // options
    const char *stt_model, *audio, *frames, *out_dir, *tts_engine, *voice, *stt_cores, *tts_cores;
    float fps, listen_s;
    bool sequential;
    const char *mic_dev, *speaker_dev; // --audio mic[:DEV], --out speaker[:DEV]
    const char *watch_dir;     // --audio watch:DIR or --frames watch:DIR: questions as files arrive there
    bool watch_frames;         // it is the frames' folder (a typed question asked of each)
    bool live;                 // the questions come during the run (the microphone or a watched folder)
    char wake[16][64];         // --wake-words: normalised (lower case, words one blank apart)
    int n_wake;
    const char *camera_dev;    // --frames /dev/videoN: each question's frame is the camera's newest
    nm_camera *camera;         // NULL when there is none (absent: the questions go without a frame)
    nm_tabm *cam_ring;         // the camera's IMAGE slots (its own ring: it outlives the pipeline's)
    nm_tabm_slot cam_slot;     // --frame-change: the frame compared, held for send_frame
    bool cam_held;
    int n_taken;               // questions the loop has taken (under lock; the camera's thread waits on it)
    float frame_change;        // --frame-change: a frame is asked about only if it differs more than this
    nm_frame_sig last_sig;     // the last frame asked about
    bool have_sig;
    cli_opts o;
    // bricks and rings
    nm_model *m;
    nm_brick *llm, *vision, *stt, *tts;
    nm_tabm *pcm, *heard, *llm_in, *tok, *img, *say, *speech;
    nm_ledger *ledger;
    int ep_stt, ep_llm, ep_mic;
    nm_audio_player *player; // --out speaker
    nm_vad *vad;             // --audio mic: cuts the capture into questions
    bool src_done;           // the microphone or the watch has ended (its questions are all in items)
    bool src_failed;
    int watch_fd;            // inotify's, or -1
    int cap_items;
    // the bricks' parameters (kept: --plan loads them again where the planner puts them)
    nm_brick_params lp, vp, sp, tp;
    nm_unit_profile units[NM_PLAN_MAX_UNITS]; // --plan: the profiles (the cores strings point into them)
    int32_t n_units;
    // the questions
    item *items;
    int n_items;
    char **owned; // paths listed from the folders
    int n_owned;
    double t0;
    // power: --battery (a source and the policy), --power-sysfs (DVFS), --cascade
    nm_battery *battery;
    nm_power_policy policy;
    nm_power_actuators *dvfs;
    double battery_speed;      // trace seconds a second of the loop
    const char *battery_src, *power_sysfs; // --battery, --power-sysfs
    bool cascade_always;       // --cascade
    bool cascading;            // this question runs as the cascade
    double decode_cap;         // tokens/s the answer reader paces the decoder to (0: none; under lock)
    double fps_cap;            // frames/s the policy allows (0: none)
    int n_cascaded;
    int32_t threads_now;       // the bricks' threads as the policy last set them (0: as the options say)
    bool rebuild;              // the policy changed the threads: the resident pipeline is made again
    int32_t tts_rate;          // the voice's sample rate once it has been loaded
    long stage_peak_kb[4];     // the cascade: each stage's peak RSS (stt, vision + llm, llm, tts), the largest seen
    // the bricks' counters, kept across loads (the cascade frees each brick after its question)
    struct { char name[24], device[24]; uint64_t n; double busy, thread_s; int32_t threads; } acc[4];
    // energy (--stats, --json): each brick's DRAM traffic (its estimate for each request's size, under
    // lock), the meters where the machine has some, the process's CPU time at the loop's start
    double dram[4];
    nm_energy_meters *meters;
    double cpu0;
    const char *json_path;     // --json FILE
    energy_report energy;
    // the resident pipeline's lanes and threads
    bool resident, planned;
    bool no_voice;             // the speaker could not be opened: answers printed only
    lane L_llm, L_stt, L_tts;
    pthread_t th_answers, th_speech;
    bool answers_started, speech_started;
    int n_asked;               // questions asked of the resident pipeline so far
    double full_tps;           // the decoder's tokens/s on the last answer it decoded unpaced
    // progress, for --sequential and the end
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int n_spoken;
    bool answers_gone, speech_gone; // their thread ended
} app;

static inline double now(const app *A) { return cli_now() - A->t0; }

// A request's DRAM traffic as brick k's estimate for its size has it (0 stt,
// 1 vision, 2 llm, 3 tts): the weights its passes stream and the activations.
static inline void add_traffic(app *A, int k, const nm_brick *b, nm_brick_input in) {
    nm_brick_cost c = {0};
    if (!b || nm_brick_estimate(b, &in, &c) != NM_OK) return;
    pthread_mutex_lock(&A->lock);
    A->dram[k] += c.weight_bytes_read + c.act_bytes;
    pthread_mutex_unlock(&A->lock);
}

// ---- assistant_options.c: the command line
// The options into A (argv: the command's, argv[0] its name), checked. -1: go
// on; else the exit status (0 after --help or --version, 2 on a usage error,
// said on stderr), the options freed.
int assistant_options(app *A, int argc, char **argv);

// ---- assistant_events.c: the questions
// The questions from the options: a file or a folder's files (in name order)
// for --audio and --frames, or none yet (the microphone adds them as it hears
// them). False (error printed) on a bad path.
bool assistant_make_items(app *A);
// The microphone's thread: listens until --listen seconds or Ctrl-C, each
// utterance a question (its audio in a slot of A->pcm, which outlives the
// resident pipeline: the cascade's Whisper reads it there too).
void *assistant_mic_main(void *arg);
// --audio/--frames watch:DIR: the folder watched (inotify) for files written
// and closed there or moved in. False (error printed) if it cannot be.
bool assistant_watch_open(app *A);
// The watch's thread: each file that arrives is a question, until --listen
// seconds or Ctrl-C (or the folder goes).
void *assistant_watch_main(void *arg);
// --frames /dev/videoN with -p: a question (the typed one, of the camera's
// newest frame) each time the loop has taken the last, until --listen
// seconds or Ctrl-C.
void *assistant_camera_main(void *arg);
// --frames /dev/videoN: the camera opened and started on a ring of its own.
// False (the camera closed, the message printed) where it cannot be.
bool assistant_camera_open(app *A);
// The camera's newest frame in a slot of A->cam_ring, held for write. False
// (error printed) if none comes.
bool assistant_camera_frame(app *A, nm_tabm_slot *sl);
// Ctrl-C stops listening (what was heard is answered); twice quits.
void assistant_catch_sigint(void);
// The microphone's or the watch's thread ends soon (as after Ctrl-C).
void assistant_stop_listening(void);
// --wake-words LIST (comma-separated) into A->wake. False (error printed) on a bad list.
bool assistant_wake_words(app *A, const char *list);
// A transcript that starts with a wake word: the word (and the blanks and
// punctuation after it) taken off the question; true. Without one, the
// question is marked skipped; false. True when no wake words were given.
bool assistant_woken(app *A, item *it, int i);
// --frame-change: true if the item's frame differs from the last frame asked
// about by more than the threshold (or cannot be read: the vision brick says
// why); else the item is marked skipped.
bool assistant_frame_changed(app *A, item *it, int i);

// ---- assistant_report.c: the figures at the end
void assistant_energy_end(app *A, double wall);
bool assistant_write_json(app *A, double wall);
void assistant_print_stats(app *A, double wall);

#endif
