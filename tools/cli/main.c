// nanomind: command-line entry point.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "cli.h"
#include "core/threadpool.h"

static void usage(FILE *f) {
    fprintf(f,
            "nanomind %s: on-device inference runtime\n"
            "\n"
            "usage: nanomind COMMAND [options]\n"
            "\n"
            "commands:\n"
            "  run         generate text, or chat (--chat), with a GGUF language model\n"
            "  perplexity  perplexity of a model on a text file\n"
            "  info        print a GGUF file's metadata and tensor table\n"
            "  bench       prompt/generation speed, peak memory, decode roofline\n"
            "  say         text to speech into a WAV file (espeak-ng)\n"
            "  transcribe  speech to text with a Whisper model (as whisper.cpp's whisper-cli)\n"
            "\n"
            "`nanomind COMMAND --help` describes each command's options.\n",
            NM_VERSION_STRING);
}

static bool want_int(const char *opt, const char *v, int32_t *out) {
    char *end;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || end == v || *end || x < -2147483647L || x > 2147483647L) {
        fprintf(stderr, "error: %s needs an integer, got '%s'\n", opt, v ? v : "");
        return false;
    }
    *out = (int32_t)x;
    return true;
}

static bool want_float(const char *opt, const char *v, float *out) {
    char *end;
    float x = v ? strtof(v, &end) : 0.0f;
    if (!v || end == v || *end || !isfinite(x)) {
        fprintf(stderr, "error: %s needs a number, got '%s'\n", opt, v ? v : "");
        return false;
    }
    *out = x;
    return true;
}

bool cli_arg_int(const char *opt, const char *v, int32_t lo, int32_t hi, int32_t *out) {
    char *end;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "error: %s needs an integer in [%d, %d], got '%s'\n", opt, lo, hi, v ? v : "");
        return false;
    }
    *out = (int32_t)x;
    return true;
}

bool cli_arg_float(const char *opt, const char *v, float lo, float hi, float *out) {
    char *end;
    float x = v ? strtof(v, &end) : 0.0f;
    if (!v || end == v || *end || !isfinite(x) || x < lo || x > hi) {
        fprintf(stderr, "error: %s needs a number in [%g, %g], got '%s'\n", opt, lo, hi, v ? v : "");
        return false;
    }
    *out = x;
    return true;
}

bool cli_parse(int argc, char **argv, cli_opts *o, const char **positional) {
    memset(o, 0, sizeof *o);
    o->n_predict = 128;
    o->sp = nm_sampler_default_params();
    o->sp.seed = (uint64_t)time(NULL);
    if (positional) *positional = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true, takes = true;
        int32_t iv;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) o->model = v;
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) o->prompt = v;
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) o->file = v;
        else if (!strcmp(a, "-s") || !strcmp(a, "--system")) o->system = v;
        else if (!strcmp(a, "--chat-template")) o->chat_tmpl = v;
        else if (!strcmp(a, "--mmproj")) o->mmproj = v;
        else if (!strcmp(a, "--image")) {
            if (o->n_images >= CLI_MAX_IMAGES) {
                fprintf(stderr, "error: at most %d --image\n", CLI_MAX_IMAGES);
                ok = false;
            } else {
                o->images[o->n_images++] = v;
            }
        }
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) ok = want_int(a, v, &o->n_predict);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) ok = want_int(a, v, &o->n_threads);
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) ok = want_int(a, v, &o->n_ctx);
        else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) ok = want_int(a, v, &o->n_batch);
        else if (!strcmp(a, "--temp")) ok = want_float(a, v, &o->sp.temp);
        else if (!strcmp(a, "--top-k")) ok = want_int(a, v, &o->sp.top_k);
        else if (!strcmp(a, "--top-p")) ok = want_float(a, v, &o->sp.top_p);
        else if (!strcmp(a, "--min-p")) ok = want_float(a, v, &o->sp.min_p);
        else if (!strcmp(a, "--repeat-penalty")) ok = want_float(a, v, &o->sp.repeat_penalty);
        else if (!strcmp(a, "--repeat-last-n")) ok = want_int(a, v, &o->sp.repeat_last_n);
        else if (!strcmp(a, "--seed")) {
            ok = want_int(a, v, &iv);
            o->sp.seed = (uint64_t)(uint32_t)iv;
        } else {
            takes = false;
            if (!strcmp(a, "--chat") || !strcmp(a, "-cnv") || !strcmp(a, "--conversation")) o->chat = true;
            else if (!strcmp(a, "--stats")) o->stats = true;
            else if (!strcmp(a, "--pin")) o->pin = true;
            else if (!strcmp(a, "-h") || !strcmp(a, "--help")) o->help = true;
            else if (a[0] != '-' && positional && !*positional) *positional = a;
            else {
                fprintf(stderr, "error: unknown option '%s'\n", a);
                return false;
            }
        }
        if (takes) {
            if (!v) {
                fprintf(stderr, "error: %s needs a value\n", a);
                return false;
            }
            if (!ok) return false;
            i++;
        }
    }
    if (o->n_threads > 4 * nm_cpu_count()) {
        fprintf(stderr, "error: -t %d: more than 4 threads per core (%d cores) only slows things down\n", o->n_threads,
                nm_cpu_count());
        return false;
    }
    return true;
}

double cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

long cli_peak_rss_kb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

bool cli_rss_split(long *anon_kb, long *file_kb) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    int got = 0;
    *anon_kb = *file_kb = 0;
    while (f && fgets(line, sizeof line, f)) {
        if (sscanf(line, "RssAnon: %ld", anon_kb) == 1) got++;
        if (sscanf(line, "RssFile: %ld", file_kb) == 1) got++;
    }
    if (f) fclose(f);
    return got == 2;
}

char *cli_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) break;
        if (n + 1 == cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) { free(buf); buf = NULL; break; }
            buf = nb;
            cap *= 2;
        }
    }
    bool bad = ferror(f);
    fclose(f);
    if (!buf || bad) { free(buf); return NULL; }
    buf[n] = '\0';
    if (len) *len = n;
    return buf;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("nanomind %s\n", NM_VERSION_STRING);
        return 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "run")) return cmd_run(argc - 1, argv + 1);
    if (!strcmp(cmd, "info")) return cmd_info(argc - 1, argv + 1);
    if (!strcmp(cmd, "perplexity")) return cmd_perplexity(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return cmd_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "say")) return cmd_say(argc - 1, argv + 1);
    if (!strcmp(cmd, "transcribe")) return cmd_transcribe(argc - 1, argv + 1);
    fprintf(stderr, "nanomind: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
