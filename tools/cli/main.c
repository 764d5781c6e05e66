// nanomind: command-line entry point.
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

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
            "  profile     measure each compute unit for the planner (run --plan)\n"
            "  assistant   the assistant's loop: spoken questions and camera frames in, spoken answers out,\n"
            "              every model on its own lane\n"
            "  power       battery policy, DVFS and energy: status, simulate a battery day, project battery life\n"
            "  serve       an OpenAI-compatible HTTP server (chat and text completions, models, health, metrics)\n"
            "\n"
            "`nanomind COMMAND --help` (or `nanomind help COMMAND`) describes each command's options;\n"
            "`nanomind --list-devices` lists the compute units (--device).\n"
            "`nanomind --version` prints the version. docs/cli.md maps them to llama.cpp's and whisper-cli's.\n",
            NM_VERSION_STRING);
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

// An integer option in [lo, hi]; note says what the special values mean.
static bool want_int_in(const char *opt, const char *v, long lo, long hi, const char *note, int64_t *out) {
    char *end;
    errno = 0;
    long long x = v ? strtoll(v, &end, 10) : 0;
    if (!v || end == v || *end || errno || x < lo || x > hi) {
        fprintf(stderr, "error: %s needs an integer in [%ld, %ld]%s, got '%s'\n", opt, lo, hi, note, v ? v : "");
        return false;
    }
    *out = x;
    return true;
}

// A number in the range lo..hi, ends open or closed as the flags say.
static bool want_float_in(const char *opt, const char *v, float lo, bool lo_open, float hi, const char *note,
                          float *out) {
    char *end;
    float x = v ? strtof(v, &end) : 0.0f;
    if (!v || end == v || *end || !isfinite(x) || (lo_open ? x <= lo : x < lo) || x > hi) {
        if (isinf(hi) && isinf(lo))
            fprintf(stderr, "error: %s needs a finite number%s, got '%s'\n", opt, note, v ? v : "");
        else if (isinf(hi))
            fprintf(stderr, "error: %s needs a number %s %g%s, got '%s'\n", opt, lo_open ? ">" : ">=", lo, note,
                    v ? v : "");
        else
            fprintf(stderr, "error: %s needs a number in %s%g, %g]%s, got '%s'\n", opt, lo_open ? "(" : "[", lo, hi,
                    note, v ? v : "");
        return false;
    }
    *out = x;
    return true;
}

// llama.cpp's prompt escapes (its default; --no-escape turns them off):
// \n \r \t \a \b \f \v \\ \' \" \? and \xHH. Others are kept as written.
static char *unescape(const char *s) {
    char *out = malloc(strlen(s) + 1), *d = out;
    if (!out) return NULL;
    for (; *s; s++) {
        if (*s != '\\' || !s[1]) {
            *d++ = *s;
            continue;
        }
        char c = *++s;
        switch (c) {
        case 'n': *d++ = '\n'; break;
        case 'r': *d++ = '\r'; break;
        case 't': *d++ = '\t'; break;
        case 'a': *d++ = '\a'; break;
        case 'b': *d++ = '\b'; break;
        case 'f': *d++ = '\f'; break;
        case 'v': *d++ = '\v'; break;
        case '\\': case '\'': case '"': case '?': *d++ = c; break;
        case 'x': {
            int v = 0, k = 0;
            while (k < 2 && isxdigit((unsigned char)s[1])) {
                char h = *++s;
                v = v * 16 + (isdigit((unsigned char)h) ? h - '0' : (tolower((unsigned char)h) - 'a' + 10));
                k++;
            }
            if (k) *d++ = (char)v;
            else *d++ = '\\', *d++ = 'x';
            break;
        }
        default: *d++ = '\\', *d++ = c; break;
        }
    }
    *d = '\0';
    return out;
}

bool cli_part(const char *asked, bool built, const char *part, const char *option) {
    if (built) return true;
    fprintf(stderr, "error: %s: %s is not in this build of nanomind (configure with -D%s=ON)\n", asked, part, option);
    return false;
}

bool cli_parse(const char *cmd, unsigned groups, int argc, char **argv, cli_opts *o, const char **positional) {
    memset(o, 0, sizeof *o);
    o->n_predict = -1;
    o->n_ctx = -1;
    o->n_gpu_layers = -1;
    o->sp = nm_sampler_default_params();
    o->seed_random = true;
    if (positional) *positional = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true, takes = true;
        unsigned g = 0; // the group of the option matched
        int64_t iv = 0;
#define IS(x) (!strcmp(a, x))
        if (IS("-m") || IS("--model")) g = CLI_MPATH, o->model = v;
        else if (IS("-t") || IS("--threads")) {
            g = CLI_MODEL;
            if ((ok = want_int_in(a, v, -1, 4L * nm_cpu_count(), " (-1: all cores; at most 4 per core)", &iv)) &&
                iv == 0) {
                fprintf(stderr, "error: %s 0: give a thread count, or -1 for all cores\n", a);
                ok = false;
            }
            o->n_threads = iv < 0 ? 0 : (int32_t)iv;
        } else if (IS("-ngl") || IS("--n-gpu-layers") || IS("--gpu-layers")) {
            g = CLI_MODEL;
            if (v && (!strcmp(v, "all") || !strcmp(v, "auto"))) iv = -1;
            else ok = want_int_in(a, v, -1, 1 << 20, " (-1, all or auto: every layer)", &iv);
            o->n_gpu_layers = (int32_t)iv;
        } else if (IS("-dev") || IS("--device")) {
            g = CLI_MODEL;
            o->device = v;
            if (v && strcmp(v, "cpu") && strcmp(v, "auto") && strcmp(v, "opencl") && strncmp(v, "opencl:", 7)) {
                fprintf(stderr, "error: %s '%s': expected cpu, auto, opencl or opencl:N (--list-devices lists them)\n",
                        a, v);
                ok = false;
            }
        } else if (IS("-c") || IS("--ctx-size")) {
            g = CLI_CTX;
            ok = want_int_in(a, v, 0, 1 << 24, " (0: the model's training context)", &iv);
            o->n_ctx = (int32_t)iv;
        } else if (IS("-b") || IS("--batch-size")) {
            g = CLI_CTX;
            ok = want_int_in(a, v, 1, 1 << 20, "", &iv);
            o->n_batch = (int32_t)iv;
        } else if (IS("-ub") || IS("--ubatch-size")) {
            g = CLI_CTX;
            ok = want_int_in(a, v, 1, 1 << 20, "", &iv);
            o->n_ubatch = (int32_t)iv;
        } else if (IS("-f") || IS("--file")) g = CLI_FILE, o->file = v;
        else if (IS("-p") || IS("--prompt")) g = CLI_PROMPT, o->prompt = v;
        else if (IS("-sys") || IS("--system-prompt") || IS("--system")) g = CLI_GEN, o->system = v;
        else if (IS("-sysf") || IS("--system-prompt-file")) g = CLI_GEN, o->system_file = v;
        else if (IS("-ctk") || IS("--cache-type-k") || IS("-ctv") || IS("--cache-type-v")) {
            g = CLI_CTX; // the KV cache is f16; q8_0 and q4_0 caches are not written yet
            if (v && strcmp(v, "f16")) {
                fprintf(stderr, "error: %s %s: the KV cache is f16 in this build (a q8_0 or q4_0 cache is not "
                                "implemented yet); -ctk/-ctv take f16 only\n", a, v);
                ok = false;
            }
        }
        else if (IS("--chat-template")) g = CLI_GEN, o->chat_tmpl = v;
        else if (IS("--chat-template-file")) g = CLI_GEN, o->chat_tmpl_file = v, o->jinja = true;
        else if (IS("--chat-template-kwargs")) {
            g = CLI_GEN, o->chat_tmpl_kwargs = v;
            char why[256];
            if (v && nm_chat_kwargs_check(v, true, why, sizeof why) != NM_OK) { // (--jinja checked once all are read)
                fprintf(stderr, "error: --chat-template-kwargs: %s\n", why);
                ok = false;
            }
        }
        else if (IS("--mmproj")) g = CLI_VISION, o->mmproj = v;
        else if (IS("--cores") || IS("--mmproj-cores")) {
            g = CLI_LANE;
            *(IS("--cores") ? &o->cores : &o->mmproj_cores) = v;
            nm_cpu_topology *t = malloc(sizeof *t);
            int32_t cores[NM_MAX_CPUS], n = 0;
            char err[256];
            if (v && (!t || nm_cpu_topology_read(NULL, t, err, sizeof err) != NM_OK ||
                      nm_cores_parse(t, v, cores, NM_MAX_CPUS, &n, err, sizeof err) != NM_OK)) {
                fprintf(stderr, "error: %s: %s\n", a, t ? err : "out of memory");
                ok = false;
            }
            free(t);
        } else if (IS("--mmproj-device")) {
            g = CLI_VISION;
            o->mmproj_device = v;
            if (v && strcmp(v, "cpu") && strcmp(v, "auto") && strcmp(v, "opencl") && strncmp(v, "opencl:", 7)) {
                fprintf(stderr, "error: %s '%s': expected cpu, auto, opencl or opencl:N (--list-devices lists them)\n",
                        a, v);
                ok = false;
            }
        }
        else if (IS("--image-min-tokens") || IS("--image-max-tokens")) {
            g = CLI_IMGTOK;
            ok = want_int_in(a, v, 1, 4096, " (image tokens of a dynamic-resolution mmproj, qwen2vl_merger)", &iv);
            *(IS("--image-min-tokens") ? &o->image_min_tokens : &o->image_max_tokens) = (int32_t)iv;
        }
        else if (IS("--image")) {
            g = CLI_VISION;
            if (o->n_images >= CLI_MAX_IMAGES) {
                fprintf(stderr, "error: at most %d --image\n", CLI_MAX_IMAGES);
                return false;
            }
            o->images[o->n_images++] = v;
        } else if (IS("-r") || IS("--reverse-prompt")) {
            g = CLI_GEN;
            if (o->n_stop >= NM_LLM_MAX_STOP || (v && (!v[0] || strlen(v) > NM_LLM_MAX_STOP_LEN))) {
                fprintf(stderr, "error: %s: at most %d stop strings of 1..%d bytes\n", a, NM_LLM_MAX_STOP,
                        NM_LLM_MAX_STOP_LEN);
                return false;
            }
            o->stop[o->n_stop++] = v;
        } else if (IS("-n") || IS("--n-predict") || IS("--predict")) {
            g = CLI_GEN;
            ok = want_int_in(a, v, -1, 1 << 24, " (-1: until the end of text or a full context)", &iv);
            o->n_predict = (int32_t)iv;
        } else if (IS("--temp")) {
            g = CLI_GEN;
            ok = want_float_in(a, v, 0.0f, false, INFINITY, " (0: greedy)", &o->sp.temp);
        } else if (IS("--top-k")) {
            g = CLI_GEN;
            ok = want_int_in(a, v, 0, 1 << 24, " (0: off)", &iv);
            o->sp.top_k = (int32_t)iv;
        } else if (IS("--top-p")) {
            g = CLI_GEN;
            ok = want_float_in(a, v, 0.0f, true, 1.0f, " (1: off)", &o->sp.top_p);
        } else if (IS("--min-p")) {
            g = CLI_GEN;
            ok = want_float_in(a, v, 0.0f, false, 1.0f, " (0: off)", &o->sp.min_p);
        } else if (IS("--repeat-penalty")) {
            g = CLI_GEN;
            ok = want_float_in(a, v, 0.0f, true, INFINITY, " (1: off)", &o->sp.repeat_penalty);
        } else if (IS("--repeat-last-n")) {
            g = CLI_GEN;
            ok = want_int_in(a, v, -1, 1 << 24, " (0: off, -1: the whole context)", &iv);
            o->sp.repeat_last_n = (int32_t)iv;
        } else if (IS("--presence-penalty") || IS("--frequency-penalty")) {
            g = CLI_GEN; // llama.cpp's: any number, negative values favour repetition
            ok = want_float_in(a, v, -INFINITY, false, INFINITY, " (0: off)",
                               IS("--presence-penalty") ? &o->sp.presence_penalty : &o->sp.frequency_penalty);
        } else if (IS("-s") || IS("--seed")) {
            g = CLI_GEN;
            ok = want_int_in(a, v, -1, 4294967295L, " (-1: a random seed)", &iv);
            o->seed_random = iv < 0;
            o->sp.seed = (uint64_t)iv;
        } else if (IS("--plan-goal")) {
            g = CLI_PLAN;
            if (v && !strcmp(v, "latency")) o->plan_goal = NM_PLAN_LATENCY;
            else if (v && !strcmp(v, "throughput")) o->plan_goal = NM_PLAN_THROUGHPUT;
            else if (v && !strcmp(v, "energy")) o->plan_goal = NM_PLAN_ENERGY;
            else if (v) {
                fprintf(stderr, "error: %s '%s': latency, throughput or energy\n", a, v);
                ok = false;
            }
        } else if (IS("--profile")) {
            g = CLI_PLAN, o->profile = v;
        } else if ((IS("-fa") || IS("--flash-attn"))) {
            g = CLI_MODEL;
            // the value is optional (on|off|auto); attention here is one fused kernel either way
            takes = v && (!strcmp(v, "on") || !strcmp(v, "off") || !strcmp(v, "auto"));
        } else {
            takes = false;
            if (IS("--chat") || IS("-cnv") || IS("--conversation")) g = CLI_GEN, o->chat = o->chat_given = true;
            else if (IS("-no-cnv") || IS("--no-conversation")) g = CLI_GEN, o->chat = false, o->chat_given = true;
            else if (IS("-e") || IS("--escape")) g = CLI_PROMPT, o->no_escape = false;
            else if (IS("--no-escape")) g = CLI_PROMPT, o->no_escape = true;
            else if (IS("--stats")) g = CLI_STATS, o->stats = true;
            else if (IS("--plan")) g = CLI_PLAN, o->plan = true;
            else if (IS("--pin")) g = CLI_MODEL, o->pin = true;
            else if (IS("--mlock")) g = CLI_MODEL, o->mlock = true;
            else if (IS("--no-mmap")) g = CLI_MODEL, o->no_mmap = true;
            else if (IS("--ignore-eos")) g = CLI_GEN, o->ignore_eos = true;
            else if (IS("--jinja")) g = CLI_GEN, o->jinja = true;
            else if (IS("-h") || IS("--help")) g = ~0u, o->help = true;
            else if (IS("--version")) g = ~0u, o->version = true;
            else if (IS("--no-display-prompt")) g = CLI_PROMPT, o->no_display_prompt = true;
            // llama.cpp's launch-script habits, accepted: nanomind logs nothing but errors and notes (--stats
            // prints timings), does no warm-up run, and always serves /metrics
            else if (IS("--log-disable") || IS("-v") || IS("--verbose") || IS("--no-warmup")) g = ~0u;
            else if (a[0] != '-' || !a[1]) {
                if (positional && !*positional) {
                    *positional = a;
                    continue;
                }
                fprintf(stderr, "error: unexpected argument '%s': nanomind %s takes %s (see nanomind %s --help)\n", a,
                        cmd, positional ? "one file" : "no positional argument (a prompt goes with -p)", cmd);
                return false;
            } else {
                fprintf(stderr, "error: unknown option '%s' (see nanomind %s --help)\n", a, cmd);
                return false;
            }
        }
#undef IS
        if (!(g & groups)) {
            fprintf(stderr, "error: nanomind %s does not take %s (see nanomind %s --help)\n", cmd, a, cmd);
            return false;
        }
        if ((g & (CLI_VISION | CLI_IMGTOK)) && !cli_part(a, NM_WITH_VISION, CLI_PART_VISION)) return false;
        if (takes) {
            if (!v) {
                fprintf(stderr, "error: %s needs a value\n", a);
                return false;
            }
            if (!ok) return false;
            i++;
        } else if (!ok) {
            return false;
        }
    }
    if (o->chat_tmpl_kwargs && !o->jinja) {
        fprintf(stderr, "error: --chat-template-kwargs gives the Jinja template variables: add --jinja (or "
                        "--chat-template-file)\n");
        return false;
    }
    if (o->chat_tmpl_file) {
        char err[512];
        nm_status st = nm_infile_read(o->chat_tmpl_file, 1u << 20, 0, &o->chat_tmpl_src, &o->chat_tmpl_len, err,
                                      sizeof err);
        if (st != NM_OK) {
            fprintf(stderr, "error: --chat-template-file: %s\n", err);
            return false;
        }
    }
    if (o->seed_random) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        o->sp.seed = (uint32_t)((uint64_t)ts.tv_sec * 1000003u ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 16));
    }
    if (o->n_gpu_layers > 0 && (!o->device || !strcmp(o->device, "cpu")))
        fprintf(stderr, "note: -ngl %d without --device opencl: every layer runs on the CPU\n", o->n_gpu_layers);
    if (o->system_file) {
        if (o->system) {
            fprintf(stderr, "error: -sys and -sysf both give the system message: give one\n");
            return false;
        }
        char ferr[512];
        if (nm_infile_read(o->system_file, 1 << 20, NM_INFILE_STDIN | NM_INFILE_STREAM, &o->system_owned, NULL, ferr,
                           sizeof ferr) != NM_OK) {
            fprintf(stderr, "error: -sysf: %s\n", ferr);
            return false;
        }
        size_t n = strlen(o->system_owned); // a file's last newline is not part of the message
        while (n > 0 && (o->system_owned[n - 1] == '\n' || o->system_owned[n - 1] == '\r')) o->system_owned[--n] = '\0';
        o->system = o->system_owned;
    }
    if (o->prompt && !o->no_escape) {
        if (!(o->prompt_owned = unescape(o->prompt))) {
            fprintf(stderr, "error: out of memory\n");
            return false;
        }
        o->prompt = o->prompt_owned;
    }
    return true;
}

void cli_opts_free(cli_opts *o) {
    free(o->prompt_owned);
    free(o->system_owned);
    free(o->chat_tmpl_src);
    o->prompt_owned = o->system_owned = o->chat_tmpl_src = NULL;
}

void cli_load_error(const char *path, nm_status st, const char *err, cli_want want) {
    static const char *const what[] = {"", "", " mmproj"};
    fprintf(stderr, "error: cannot load%s '%s': %s: %s\n", what[want], path, nm_status_str(st), err);
    char arch[64], e2[256];
    if (nm_gguf_arch(path, arch, sizeof arch, e2, sizeof e2) != NM_OK) return;
    const bool whisper = !strcmp(arch, "whisper"), clip = !strcmp(arch, "clip");
    if (whisper && want != CLI_WANT_WHISPER)
        fprintf(stderr, "hint: '%s' is a Whisper model (speech to text): nanomind transcribe -m %s AUDIO\n", path, path);
    else if (clip && want != CLI_WANT_MMPROJ)
        fprintf(stderr, "hint: '%s' is an mmproj (a vision encoder): give it with --mmproj beside the language model: "
                        "nanomind run -m LLM.gguf --mmproj %s --image IMAGE -p TEXT\n", path, path);
    else if (!whisper && !clip && want != CLI_WANT_LLM)
        fprintf(stderr, "hint: '%s' is a language model (%s): give it with -m: nanomind run -m %s -p TEXT\n", path,
                arch, path);
}

nm_brick_params cli_llm_params(const cli_opts *o, nm_model *m, nm_ledger *ledger) {
    nm_brick_params lp = nm_brick_default_params(NM_BRICK_LLM);
    lp.llm_model = m;
    lp.n_ctx = cli_ctx_size(o, m);
    lp.n_batch = o->n_batch;
    lp.n_ubatch = o->n_ubatch;
    lp.n_threads = o->n_threads;
    lp.pin_threads = o->pin;
    lp.cores = o->cores;
    lp.device = o->device;
    lp.n_gpu_layers = o->n_gpu_layers;
    lp.sampling = o->sp;
    lp.llm.n_predict = o->n_predict; // < 0: until end of text or a full context
    lp.llm.out_batch = 1;            // a slot per token: shown as it is sampled
    lp.llm.stop = o->stop;
    lp.llm.n_stop = o->n_stop;
    lp.llm.ignore_eos = o->ignore_eos;
    lp.ledger = ledger;
    return lp;
}

void cli_chat_params(const cli_opts *o, nm_pipeline_params *pp) {
    pp->system_prompt = o->system;
    pp->chat_template = o->chat_tmpl;
    pp->jinja = o->jinja;
    pp->jinja_template = o->chat_tmpl_src;
    pp->jinja_len = o->chat_tmpl_len;
    pp->jinja_name = o->chat_tmpl_file;
    pp->chat_template_kwargs = o->chat_tmpl_kwargs;
}

int32_t cli_ctx_size(const cli_opts *o, const nm_model *m) {
    if (o->n_ctx < 0) return 0; // the library's default: the training context, at most 4096
    if (o->n_ctx == 0) return nm_model_n_ctx_train(m);
    const int32_t train = nm_model_n_ctx_train(m);
    if (train > 0 && o->n_ctx > train) // (as llama.cpp warns: positions past training may not be modelled)
        fprintf(stderr, "warning: -c %d is more than the model's training context (%d): the positions past it may "
                        "give worse text\n", o->n_ctx, train);
    return o->n_ctx;
}

void cli_mlock(const cli_opts *o) {
    if (o->mlock && mlockall(MCL_CURRENT) != 0)
        fprintf(stderr, "warning: --mlock: cannot lock the model in RAM: %s (ulimit -l)\n", strerror(errno));
}

void cli_print_version(void) { printf("nanomind %s\n", NM_VERSION_STRING); }

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

// Whether the fall back from the Jinja template was said (once a process: serve formats on many threads).
static atomic_bool jinja_fallback_said;

char *cli_chat_text(const nm_model *m, const cli_opts *o, const nm_chat_msg *msgs, size_t n, nm_status *st) {
    char err[768], *text = NULL;
    const char *fallback = NULL;
    *st = nm_chat_text(m, o->chat_tmpl, o->jinja, o->chat_tmpl_src, o->chat_tmpl_len, msgs, n, true, o->chat_tmpl_kwargs,
                       &text, &fallback,
                       err, sizeof err);
    const char *which = o->chat_tmpl_file ? o->chat_tmpl_file : "the model's chat template";
    if (*st != NM_OK && *st != NM_ERR_NOMEM && o->jinja) fprintf(stderr, "error: %s: %s\n", which, err);
    if (fallback && !atomic_exchange(&jinja_fallback_said, true))
        fprintf(stderr, "note: %s is beyond nanomind's Jinja subset (%s): formatting with the built-in '%s' "
                "template instead\n", which, err, fallback);
    return text;
}

cli_energy cli_energy_default(void) {
    cli_energy e = {.idle_w = CLI_BOARD_IDLE_W, .active_w = CLI_BOARD_ACTIVE_W, .n_cores = nm_cpu_count()};
    snprintf(e.source, sizeof e.source, "the board of docs/power.md (no watts in a unit profile)");
    return e;
}

// The cores of a CPU unit's name ("cpu", "cpu:big", "cpu:cluster:1", "cpu:0-3").
static int32_t unit_cores(const char *name) {
    int32_t n = nm_cpu_count(), cores[NM_MAX_CPUS];
    if (strncmp(name, "cpu:", 4)) return n;
    nm_cpu_topology *t = malloc(sizeof *t);
    char err[256];
    if (!t || nm_cpu_topology_read(NULL, t, err, sizeof err) != NM_OK ||
        nm_cores_parse(t, name + 4, cores, NM_MAX_CPUS, &n, err, sizeof err) != NM_OK)
        n = nm_cpu_count();
    free(t);
    return n > 0 ? n : 1;
}

bool cli_energy_load(const char *profile, cli_energy *e) {
    *e = cli_energy_default();
    char path[1024], err[512];
    const char *file = profile ? profile : cli_profile_path(path, sizeof path) ? path : NULL;
    if (!file) return true;
    nm_status st = nm_units_load(file, e->units, NM_PLAN_MAX_UNITS, &e->n_units, err, sizeof err);
    if (st != NM_OK) {
        e->n_units = 0;
        if (profile) {
            fprintf(stderr, "error: --profile: %s (%s)\n", err, nm_status_str(st));
            return false;
        }
        if (st != NM_ERR_IO) fprintf(stderr, "warning: %s (%s): the energy model uses the board of docs/power.md\n",
                                     err, nm_status_str(st));
        return true;
    }
    snprintf(e->file, sizeof e->file, "%s", file);
    const nm_unit_profile *cpu = NULL;
    for (int32_t i = 0; i < e->n_units; i++) {
        const nm_unit_profile *u = &e->units[i];
        if (u->unit != NM_UNIT_CPU || !(u->active_w > 0) || u->active_w < u->idle_w) continue;
        if (!cpu || !strcmp(u->name, "cpu")) cpu = u;
    }
    if (cpu) {
        e->idle_w = cpu->idle_w;
        e->active_w = cpu->active_w;
        e->n_cores = unit_cores(cpu->name);
        snprintf(e->source, sizeof e->source, "profile %s, unit %s", e->file, cpu->name);
    }
    return true;
}

bool cli_energy_device(const cli_energy *e, const char *device, cli_energy *out) {
    const bool cl0 = !strcmp(device, "opencl") || !strcmp(device, "opencl:0");
    for (int32_t i = 0; i < e->n_units; i++) {
        const nm_unit_profile *u = &e->units[i];
        const bool same = !strcmp(u->name, device) || (cl0 && (!strcmp(u->name, "opencl") || !strcmp(u->name, "opencl:0")));
        if (!same || u->unit == NM_UNIT_CPU || !(u->active_w > 0) || u->active_w < u->idle_w) continue;
        *out = *e;
        out->idle_w = u->idle_w;
        out->active_w = u->active_w;
        out->n_cores = 1; // a device: busy or not, as a whole
        snprintf(out->source, sizeof out->source, "profile %s, unit %s", e->file, u->name);
        return true;
    }
    return false;
}

double cli_energy_run(const cli_energy *e, double cpu_s, double wall_s, double dram_bytes) {
    const nm_unit_profile u = {.idle_w = e->idle_w, .active_w = e->active_w};
    double busy = cpu_s / (e->n_cores > 0 ? e->n_cores : 1);
    if (busy > wall_s) busy = wall_s;
    return nm_energy_model_joules(&u, busy, wall_s, 1, dram_bytes, e->pj_byte);
}

double cli_energy_work(const cli_energy *e, double thread_s, double dram_bytes) {
    const nm_unit_profile u = {.idle_w = 0, .active_w = e->active_w - e->idle_w};
    return nm_energy_model_joules(&u, thread_s / (e->n_cores > 0 ? e->n_cores : 1), 0, 1, dram_bytes, e->pj_byte);
}

double cli_cpu_seconds(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec * 1e-6;
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

void cli_ctx_note(const nm_ctx *c) {
    if (nm_ctx_device_note(c)[0]) fprintf(stderr, "note: %s\n", nm_ctx_device_note(c));
}

// --list-devices: every unit --device takes, with its memory and measured read bandwidth.
static int list_devices(void) {
    nm_device_info d[17];
    const int32_t n = nm_list_devices(d, 17, true);
    printf("Available devices:\n");
    for (int32_t i = 0; i < n && i < 17; i++)
        printf("  %-10s %s %s (%s), %.1f GiB%s, read %.1f GB/s\n", d[i].name, d[i].type, d[i].desc, d[i].driver,
               d[i].mem_bytes / 1073741824.0, d[i].unified ? ", shares host memory" : ", own memory", d[i].read_gbps);
    if (n == 1) printf("  (no OpenCL device: install an OpenCL ICD, e.g. pocl-opencl-icd)\n");
    // the CPU's clusters: what --cores takes (big, little, cluster:N or a list)
    nm_cpu_topology *t = malloc(sizeof *t);
    char err[256];
    if (t && nm_cpu_topology_read(NULL, t, err, sizeof err) == NM_OK) {
        printf("CPU clusters (--cores):\n");
        for (int32_t c = 0; c < t->n_clusters; c++) {
            const nm_cpu_cluster *k = &t->clusters[c];
            printf("  cluster:%d%s cores ", (int)c, t->n_clusters > 1 ? (c == 0 ? " (big)" : c == t->n_clusters - 1 ? " (little)" : "") : "");
            for (int32_t i = 0; i < k->n_cpus; i++) {
                int32_t j = i;
                while (j + 1 < k->n_cpus && k->cpus[j + 1] == k->cpus[j] + 1) j++;
                printf("%s%d", i ? "," : "", (int)k->cpus[i]);
                if (j > i) printf("-%d", (int)k->cpus[j]);
                i = j;
            }
            printf(", capacity %d, ", (int)k->capacity);
            if (k->max_khz > 0) printf("max %.2f GHz", k->max_khz / 1e6);
            else printf("max clock unknown (no cpufreq)");
            printf(", shared cache %lld KiB\n", (long long)(k->cache_bytes >> 10));
        }
    }
    free(t);
    return 0;
}

// SIGTERM, SIGINT, SIGHUP: the output files' temporaries go (nm_outfile_remove_temps),
// then the signal ends the process as it would have. A signal the shell had us
// ignore (nohup, a background job's SIGINT) stays ignored. Commands that catch
// SIGINT themselves (run, assistant) call nm_outfile_remove_temps as they re-raise.
static void on_ending_signal(int sig) {
    nm_outfile_remove_temps();
    signal(sig, SIG_DFL);
    raise(sig);
}

static void catch_ending_signals(void) {
    const int sigs[] = {SIGTERM, SIGINT, SIGHUP};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        struct sigaction old, sa = {.sa_handler = on_ending_signal, .sa_flags = SA_RESTART};
        sigemptyset(&sa.sa_mask);
        if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN) sigaction(sigs[i], &sa, NULL);
    }
}

int main(int argc, char **argv) {
    catch_ending_signals();
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--list-devices")) return list_devices();
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("nanomind %s\n", NM_VERSION_STRING);
        return 0;
    }
    // nanomind help [CMD]: the command's --help
    static char help_flag[] = "--help";
    char *help_argv[4];
    if (!strcmp(argv[1], "help")) {
        if (argc < 3) {
            usage(stdout);
            return 0;
        }
        help_argv[0] = argv[0];
        help_argv[1] = argv[2];
        help_argv[2] = help_flag;
        help_argv[3] = NULL;
        argv = help_argv;
        argc = 3;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "run")) return cmd_run(argc - 1, argv + 1);
    if (!strcmp(cmd, "info")) return cmd_info(argc - 1, argv + 1);
    if (!strcmp(cmd, "perplexity")) return cmd_perplexity(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return cmd_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "say"))
        return cli_part("nanomind say", NM_WITH_TTS, CLI_PART_TTS) ? cmd_say(argc - 1, argv + 1) : 1;
    if (!strcmp(cmd, "transcribe"))
        return cli_part("nanomind transcribe", NM_WITH_STT, CLI_PART_STT) ? cmd_transcribe(argc - 1, argv + 1) : 1;
    if (!strcmp(cmd, "profile")) return cmd_profile(argc - 1, argv + 1);
    if (!strcmp(cmd, "assistant")) return cmd_assistant(argc - 1, argv + 1);
#if NM_WITH_SERVER
    if (!strcmp(cmd, "serve")) return cmd_serve(argc - 1, argv + 1);
#else
    if (!strcmp(cmd, "serve")) return cli_part("nanomind serve", false, CLI_PART_SERVER) ? 0 : 1;
#endif
    if (!strcmp(cmd, "power")) return cmd_power(argc - 1, argv + 1);
    fprintf(stderr, "nanomind: unknown command '%s'\n", cmd);
    if (cmd[0] == '-') // llama-cli's habit: flags straight after the program's name
        fprintf(stderr, "hint: a command comes first: nanomind run %s ... (or transcribe, serve, say, assistant)\n",
                cmd);
    fputc('\n', stderr);
    usage(stderr);
    return 2;
}
