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

// Options llama.cpp users know, parsed the same way by every subcommand.
typedef struct cli_opts {
    const char *model;      // -m
    const char *prompt;     // -p
    const char *file;       // -f
    const char *system;     // --system
    const char *chat_tmpl;  // --chat-template
    const char *mmproj;     // --mmproj: vision encoder + projector (llama.cpp's mmproj GGUF)
#define CLI_MAX_IMAGES 16
    const char *images[CLI_MAX_IMAGES]; // --image, repeatable
    int32_t n_images;
    int32_t n_predict;      // -n
    int32_t n_threads;      // -t
    int32_t n_ctx;          // -c
    int32_t n_batch;        // -b
    bool chat;              // --chat
    bool stats;             // --stats
    bool help;              // -h
    bool pin;               // --pin
    nm_sampler_params sp;
} cli_opts;

// Parses argv[1..]; the positional argument (if any) goes to *positional.
// Returns false (after printing why) on a bad option.
bool cli_parse(int argc, char **argv, cli_opts *o, const char **positional);
// Option values in [lo, hi]; false (after printing which option and range) otherwise.
bool cli_arg_int(const char *opt, const char *v, int32_t lo, int32_t hi, int32_t *out);
bool cli_arg_float(const char *opt, const char *v, float lo, float hi, float *out);
double cli_now(void); // seconds, monotonic
long cli_peak_rss_kb(void);
// Current resident memory split into anonymous (heap: our allocations) and
// file-backed (the mmapped weights) from /proc/self/status; false if unknown.
bool cli_rss_split(long *anon_kb, long *file_kb);
// Reads a whole file into a NUL-terminated malloc'd buffer; NULL on failure.
char *cli_read_file(const char *path, size_t *len);

#endif
