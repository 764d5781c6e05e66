// nanomind serve: the command that starts the OpenAI-compatible server of
// the library (include/nanomind/server.h, src/server/; docs/server.md): its
// flags, the model loaded (mmap, --mlock), the bricks' parameters, the
// energy model's watts; then it waits for SIGTERM or SIGINT and stops the
// server, which finishes the requests in flight first.
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli.h"

#define MAX_KEYS 16

// The command's flags (take_own) and what cli_parse fills.
typedef struct serve_cli {
    cli_opts o;
    const char *host, *alias, *mmproj, *mmproj_device, *image_dir, *stt_path, *tts_engine, *voice, *sysfs, *tts_device;
    int32_t reasoning_format; // --reasoning-format (NM_REASONING_*)
    int32_t port, queue_max, timeout_s, body_timeout_s, idle_timeout_s, threads_http, parallel, audio_max_s;
    int32_t speech_max_chars;
    int64_t body_max, image_max_pixels;
    char *keys[MAX_KEYS];
    int n_keys;
} serve_cli;

static void usage(FILE *f) {
    fprintf(f,
            "usage: nanomind serve -m MODEL [--host 127.0.0.1] [--port 8080] [--api-key KEY] [options]\n"
            "\n"
            "An OpenAI-compatible server (docs/server.md): POST /v1/chat/completions, POST /v1/completions,\n"
            "POST /v1/audio/transcriptions (with --stt), POST /v1/audio/speech (with --tts), GET /v1/models,\n"
            "images in chats (with --mmproj), "
            "GET /health, GET /metrics; streaming as server-sent events.\n"
            "\n"
            "  --host ADDR              address to listen on (default 127.0.0.1)\n"
            "  --port N                 port (default 8080)\n"
            "  --api-key KEY            require 'Authorization: Bearer KEY' (repeatable, or KEY1,KEY2);\n"
            "                           /health and /v1/models stay open, as llama-server\n"
            "  --api-key-file FILE      the keys, one a line, at most 1 MiB (a list or file with no key in it is an error)\n"
            "  -a, --alias NAME         the model's id in /v1/models and the answers (default: the file name)\n"
            "  -np, --parallel N        requests decoded together (continuous batching; default 1), each on a\n"
            "                           sequence of its own of -c / N positions (as llama-server's slots)\n"
            "  --queue N                requests that may wait their turn (default 16, at most 4096; more get 429)\n"
            "  --idle-timeout S         seconds a request's header may take to arrive whole, and a read of its\n"
            "                           body or a write of its answer may wait (default 10); a keep-alive\n"
            "                           connection idle for 0.5 s is closed; generation is not bounded\n"
            "  --timeout S              seconds SIGTERM waits for the requests in flight (default 600)\n"
            "  --body-timeout S         seconds a request's body may take to arrive, from its header's end\n"
            "                           (default 60; 0: no bound but --idle-timeout for each read; later: 408)\n"
            "  --threads-http N         connections served at once, idle ones included (default: --parallel +\n"
            "                           --queue + 64, at least 256; more wait in the listen backlog)\n"
            "  --max-body BYTES         the largest request body (default 8388608; larger get 413)\n"
            "  --stt FILE               a Whisper model (GGUF or whisper.cpp .bin): POST /v1/audio/transcriptions\n"
            "  --max-audio S            the longest audio a transcription takes, in seconds (default 1800)\n"
            "  --tts espeak|piper       text to speech through espeak-ng or a Piper voice: POST /v1/audio/speech\n"
            "                           (24 kHz); with piper, OpenAI's voice names (alloy, ...) are --voice's,\n"
            "                           another name a Piper voice installed in the model folder\n"
            "  --voice V                the speech's voice (espeak-ng: en-us; piper: en_US-joe-medium, or a GGUF)\n"
            "  --tts-device DEV         where a Piper voice's decoder runs: cpu (default), opencl, opencl:N, auto\n"
            "  --max-speech N           the most characters a speech request's input may have (default 4096)\n"
            "  --sysfs DIR              look for energy meters under DIR (default /sys; NVIDIA GPUs through NVML):\n"
            "                           /metrics gives each one's joules since the start\n"
            "  --mmproj FILE            a vision encoder (llama.cpp mmproj GGUF): image_url parts in chat messages\n"
            "                           (data: URLs with base64; http(s) URLs are refused)\n"
            "  --image-dir DIR          also read image_url paths (or file:// URLs) of files under DIR\n"
            "  --reasoning-format F     deepseek or auto (default): a chat answer opening with <think> (Qwen3,\n"
            "                           SmolLM3) has that block as reasoning_content, out of content; none: kept\n"
            "  --max-image-pixels N     the largest image, width x height (default 16777216; larger get 400)\n"
            "  --mmproj-device DEV      the vision encoder's unit (default: -dev); --mmproj-cores its lane\n"
            "  --image-min-tokens N, --image-max-tokens N  image tokens of a dynamic-resolution mmproj\n"
            "                           (qwen2vl_merger; default: the model's, 8..4096)\n"
            "also: -c, -b, -ub, -t, -n (the default max_tokens), --temp and the other sampling defaults,\n"
            "--chat-template, --jinja, --chat-template-file, --chat-template-kwargs (a request's chat_template_kwargs\n"
            "go over it), -sys/-sysf (a system message when a chat has none), -dev,\n"
            "-ngl, --no-mmap, --mlock, -ctk/-ctv f16; --metrics, --log-disable, -v, --no-warmup are accepted (/metrics\n"
            "is always served).\n");
}

// ---- the command ----------------------------------------------------------------------------

// The keys of list (separated by commas or newlines, blanks around each dropped) added to S's.
// what: the flag, for the message. A list with no key in it is an error: the server would start
// open to anyone, which its user did not ask for.
static bool add_keys(serve_cli *S, const char *list, const char *what) {
    const int n0 = S->n_keys;
    for (const char *p = list; *p;) {
        const char *end = strpbrk(p, ",\n");
        if (!end) end = p + strlen(p);
        const char *q = p;
        while (q < end && (*q == ' ' || *q == '\t' || *q == '\r')) q++;
        size_t n = (size_t)(end - q);
        while (n > 0 && (q[n - 1] == '\r' || q[n - 1] == ' ' || q[n - 1] == '\t')) n--;
        if (n > 0) {
            if (S->n_keys >= MAX_KEYS) {
                fprintf(stderr, "error: more than %d API keys\n", MAX_KEYS);
                return false;
            }
            if (!(S->keys[S->n_keys++] = strndup(q, n))) return false;
        }
        p = *end ? end + 1 : end;
    }
    if (S->n_keys == n0) {
        fprintf(stderr, "error: %s holds no key (only commas and blanks): the server would answer without one\n",
                what);
        return false;
    }
    return true;
}

static bool take_own(serve_cli *S, int *argc, char **argv) {
    int w = 1;
    for (int i = 1; i < *argc; i++) {
        const char *a = argv[i];
        const bool has = i + 1 < *argc;
        if (!strcmp(a, "--host") || !strcmp(a, "-a") || !strcmp(a, "--alias") || !strcmp(a, "--api-key") ||
            !strcmp(a, "--api-key-file") || !strcmp(a, "--stt") || !strcmp(a, "--tts") || !strcmp(a, "--mmproj") ||
            !strcmp(a, "--mmproj-device") || !strcmp(a, "--image-dir") || !strcmp(a, "--sysfs") || !strcmp(a, "--voice") ||
            !strcmp(a, "--tts-device") || !strcmp(a, "--reasoning-format")) {
            if (!has || !argv[i + 1][0]) {
                fprintf(stderr, "error: %s needs a value\n", a);
                return false;
            }
            const char *v = argv[++i];
            if ((!strcmp(a, "--stt") && !cli_part(a, NM_WITH_STT, CLI_PART_STT)) ||
                ((!strcmp(a, "--tts") || !strcmp(a, "--voice") || !strcmp(a, "--tts-device")) &&
                 !cli_part(a, NM_WITH_TTS, CLI_PART_TTS)) ||
                ((!strcmp(a, "--mmproj") || !strcmp(a, "--mmproj-device") || !strcmp(a, "--image-dir")) &&
                 !cli_part(a, NM_WITH_VISION, CLI_PART_VISION)))
                return false;
            if (!strcmp(a, "--host")) S->host = v;
            else if (!strcmp(a, "--stt")) S->stt_path = v;
            else if (!strcmp(a, "--mmproj")) S->mmproj = v;
            else if (!strcmp(a, "--mmproj-device")) S->mmproj_device = v;
            else if (!strcmp(a, "--image-dir")) S->image_dir = v;
            else if (!strcmp(a, "--sysfs")) S->sysfs = v;
            else if (!strcmp(a, "--reasoning-format")) { // (llama-server's; auto is deepseek for every model here)
                if (strcmp(v, "none") && strcmp(v, "deepseek") && strcmp(v, "auto")) {
                    fprintf(stderr, "error: --reasoning-format '%s': none, deepseek or auto\n", v);
                    return false;
                }
                S->reasoning_format = strcmp(v, "none") ? NM_REASONING_DEEPSEEK : NM_REASONING_NONE;
            }
            else if (!strcmp(a, "--tts")) {
                if (strcmp(v, "espeak") && strcmp(v, "espeak-ng") && strcmp(v, "piper")) {
                    fprintf(stderr, "error: --tts '%s': the engines are espeak (espeak-ng) and piper\n", v);
                    return false;
                }
                S->tts_engine = strcmp(v, "piper") ? "espeak-ng" : "piper";
            }
            else if (!strcmp(a, "--voice")) S->voice = v;
            else if (!strcmp(a, "--tts-device")) S->tts_device = v;
            else if (!strcmp(a, "--api-key")) {
                char what[64];
                snprintf(what, sizeof what, "--api-key '%.40s'", v);
                if (!add_keys(S, v, what)) return false;
            } else if (!strcmp(a, "--api-key-file")) {
                // whole (a long file is not cut mid-key), up to 1 MiB; a pipe (<(pass show key)) is
                // read too, and a FIFO with no writer is an empty file, not a wait
                char *text = NULL, ferr[512];
                if (nm_infile_read(v, 1u << 20, NM_INFILE_STDIN | NM_INFILE_STREAM, &text, NULL, ferr, sizeof ferr) !=
                    NM_OK) {
                    fprintf(stderr, "error: --api-key-file: %s\n", ferr);
                    return false;
                }
                char what[PATH_MAX + 32];
                snprintf(what, sizeof what, "--api-key-file '%s'", v);
                const bool ok = add_keys(S, text, what);
                free(text);
                if (!ok) return false;
            } else S->alias = v;
        } else if (!strcmp(a, "--port") || !strcmp(a, "--parallel") || !strcmp(a, "-np") || !strcmp(a, "--queue") ||
                   !strcmp(a, "--timeout") || !strcmp(a, "-to") || !strcmp(a, "--body-timeout") || !strcmp(a, "--max-audio") ||
                   !strcmp(a, "--max-speech") || !strcmp(a, "--idle-timeout") || !strcmp(a, "--threads-http")) {
            int32_t v;
            const bool port = !strcmp(a, "--port"), par = !strcmp(a, "--parallel") || !strcmp(a, "-np");
            const bool at_least_1 = port || par || !strcmp(a, "--max-audio") || !strcmp(a, "--max-speech") ||
                                    !strcmp(a, "--idle-timeout") || !strcmp(a, "--threads-http");
            if (!has || !cli_arg_int(a, argv[i + 1], at_least_1 ? 1 : 0, port ? 65535 : 1000000, &v)) {
                if (!has) fprintf(stderr, "error: %s needs a value\n", a);
                return false;
            }
            i++;
            if (par && v > 256) {
                fprintf(stderr, "error: --parallel needs an integer in [1, 256], got '%s'\n", argv[i]);
                return false;
            }
            if (!strcmp(a, "--threads-http") && v > 4096) {
                fprintf(stderr, "error: --threads-http needs an integer in [1, 4096], got '%s'\n", argv[i]);
                return false;
            }
            if (!strcmp(a, "--queue") && v > 4096) { // (a waiting request holds an HTTP thread)
                fprintf(stderr, "error: --queue needs an integer in [0, 4096], got '%s'\n", argv[i]);
                return false;
            }
            if (port) S->port = v;
            else if (par) S->parallel = v;
            else if (!strcmp(a, "--queue")) S->queue_max = v;
            else if (!strcmp(a, "--max-audio")) S->audio_max_s = v;
            else if (!strcmp(a, "--max-speech")) S->speech_max_chars = v;
            else if (!strcmp(a, "--body-timeout")) S->body_timeout_s = v;
            else if (!strcmp(a, "--idle-timeout")) S->idle_timeout_s = v;
            else if (!strcmp(a, "--threads-http")) S->threads_http = v;
            else if (!par) S->timeout_s = v;
        } else if (!strcmp(a, "--max-image-pixels")) {
            int32_t v; // (at most 2^26, the image decoder's own limit)
            if (!has || !cli_arg_int(a, argv[i + 1], 1, 1 << 26, &v)) {
                if (!has) fprintf(stderr, "error: %s needs a value\n", a);
                return false;
            }
            i++;
            S->image_max_pixels = v;
        } else if (!strcmp(a, "--max-body")) {
            int32_t v;
            if (!has || !cli_arg_int(a, argv[i + 1], 1024, 1 << 30, &v)) {
                if (!has) fprintf(stderr, "error: --max-body needs a value\n");
                return false;
            }
            i++;
            S->body_max = v;
        } else if (!strcmp(a, "--metrics")) {
            // llama-server's switch for GET /metrics: always served here (launch scripts pass it)
        } else {
            argv[w++] = argv[i];
        }
    }
    *argc = w;
    return true;
}

// The server's operator lines, on stderr.
static void log_line(void *user, const char *line) {
    (void)user;
    fprintf(stderr, "%s\n", line);
}

int cmd_serve(int argc, char **argv) {
    serve_cli S;
    memset(&S, 0, sizeof S);
    const nm_server_params dp = nm_server_default_params();
    S.host = dp.host;
    S.port = dp.port;
    S.queue_max = dp.queue;
    S.timeout_s = 600;
    S.idle_timeout_s = dp.idle_timeout_s;
    S.body_timeout_s = dp.body_timeout_s;
    S.body_max = dp.body_max;
    S.audio_max_s = dp.audio_max_s;
    S.reasoning_format = dp.reasoning_format;
    S.speech_max_chars = dp.speech_max_chars;
    S.image_max_pixels = dp.image_max_pixels;
    S.parallel = dp.parallel;
    int rc = 2;
    nm_model *m = NULL;
    if (!take_own(&S, &argc, argv)) goto keys;
    if (!cli_parse("serve", CLI_MPATH | CLI_MODEL | CLI_CTX | CLI_GEN | CLI_LANE | CLI_IMGTOK, argc, argv, &S.o, NULL)) goto keys;
    if (S.o.help) {
        usage(stdout);
        rc = 0;
        goto out;
    }
    if (S.o.version) {
        cli_print_version();
        rc = 0;
        goto out;
    }
    if (!S.o.model) {
        fprintf(stderr, "error: give the language model with -m FILE\n");
        goto out;
    }
    if (S.o.chat_tmpl && !nm_chat_template_known(S.o.chat_tmpl)) {
        fprintf(stderr, "error: unknown chat template '%s' (known: %s)\n", S.o.chat_tmpl, nm_chat_template_names());
        goto out;
    }
    if (!S.mmproj && (S.image_dir || S.mmproj_device || S.o.mmproj_cores || S.o.image_min_tokens || S.o.image_max_tokens)) {
        fprintf(stderr, "error: %s needs --mmproj (the vision encoder)\n",
                S.image_dir ? "--image-dir" : S.mmproj_device ? "--mmproj-device" : S.o.mmproj_cores ? "--mmproj-cores"
                : S.o.image_min_tokens ? "--image-min-tokens" : "--image-max-tokens");
        goto out;
    }
    rc = 1;
    char err[1024];
    nm_status st;
    nm_model_params mp = nm_model_default_params();
    mp.n_threads = S.o.n_threads;
    mp.no_mmap = S.o.no_mmap;
    if ((st = nm_model_load(S.o.model, &mp, &m, err, sizeof err)) != NM_OK) {
        cli_load_error(S.o.model, st, err, CLI_WANT_LLM);
        goto out;
    }
    cli_mlock(&S.o);
    const char *slash = strrchr(S.o.model, '/');
    // (-n: the default max_tokens, -1 until the end or a full context; a token a slot, streamed as sampled)
    nm_brick_params lp = cli_llm_params(&S.o, m, NULL);
    if (S.parallel > 1) { // llama-server's slots: -c is the whole cache, each sequence a share of it
        const int32_t train = nm_model_n_ctx_train(m);
        const int32_t total = S.o.n_ctx > 0 ? S.o.n_ctx : train > 0 && train < 4096 ? train : 4096; // (-c's default)
        lp.n_ctx = total / S.parallel;
        if (lp.n_ctx < 64) {
            fprintf(stderr, "error: -c %d over --parallel %d leaves %d positions a sequence (64 at least)\n", total,
                    S.parallel, lp.n_ctx);
            goto out;
        }
    }
    const nm_brick_params vp = cli_vision_params(&S.o, S.mmproj, S.mmproj_device);
    nm_brick_params sp = nm_brick_default_params(NM_BRICK_STT), tp = nm_brick_default_params(NM_BRICK_TTS);
    sp.model = S.stt_path; // the transcriber: its own thread pool, beam 5 as whisper-cli
    sp.n_threads = S.o.n_threads;
    sp.stt_max_decoders = 5;
    sp.stt = nm_stt_default_params(NM_STT_BEAM);
    tp.tts.engine = S.tts_engine;
    tp.tts.voice = S.voice; // (NULL: the engine's own)
    tp.device = S.tts_device; // (a Piper voice's HiFi-GAN; NULL: the CPU)
    tp.tts.stream_ms = 200; // (a Piper voice's first long sentence: its first 0.2 s sent first)
    tp.tts.sample_rate = 24000; // (OpenAI's rate: 24 kHz, 16-bit mono)
    cli_energy e;
    if (!cli_energy_load(NULL, &e)) goto out; // (the default profile: never fails)
    nm_server_params p = dp;
    p.host = S.host, p.port = S.port, p.alias = S.alias ? S.alias : slash ? slash + 1 : S.o.model;
    p.api_keys = (const char *const *)S.keys, p.n_api_keys = S.n_keys;
    p.parallel = S.parallel, p.queue = S.queue_max;
    p.idle_timeout_s = S.idle_timeout_s, p.body_timeout_s = S.body_timeout_s, p.threads_http = S.threads_http;
    p.body_max = S.body_max;
    p.llm = &lp, p.vision = S.mmproj ? &vp : NULL, p.stt = S.stt_path ? &sp : NULL, p.tts = S.tts_engine ? &tp : NULL;
    p.image_dir = S.image_dir, p.image_max_pixels = S.image_max_pixels;
    p.audio_max_s = S.audio_max_s, p.speech_max_chars = S.speech_max_chars;
    p.chat_template = S.o.chat_tmpl, p.jinja = S.o.jinja, p.jinja_template = S.o.chat_tmpl_src;
    p.jinja_len = S.o.chat_tmpl_len, p.jinja_name = S.o.chat_tmpl_file, p.system_prompt = S.o.system;
    p.chat_template_kwargs = S.o.chat_tmpl_kwargs, p.reasoning_format = S.reasoning_format;
    p.stop = (const char *const *)S.o.stop, p.n_stop = S.o.n_stop;
    p.idle_w = e.idle_w, p.active_w = e.active_w, p.pj_byte = e.pj_byte, p.n_cores = e.n_cores;
    p.energy_source = e.source, p.sysfs = S.sysfs;
    p.log = log_line;
    // SIGTERM / SIGINT end the server: blocked here (every thread made after inherits it) and waited for below
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    nm_server *srv = NULL;
    if ((st = nm_server_start(&p, &srv, err, sizeof err)) != NM_OK) {
        if (!strncmp(err, "llm: ", 5))
            fprintf(stderr, "error: the language model's brick: %s: %s\n", nm_status_str(st), err + 5);
        else if (!strncmp(err, "vision: ", 8)) cli_vision_error(&S.o, S.mmproj, st, err + 8);
        else if (!strncmp(err, "stt: ", 5)) cli_load_error(S.stt_path, st, err + 5, CLI_WANT_WHISPER);
        else if (!strncmp(err, "tts: ", 5))
            fprintf(stderr, "error: cannot start the speech engine: %s: %s\n", nm_status_str(st), err + 5);
        else if (!strncmp(err, "listen: ", 8)) fprintf(stderr, "error: %s\n", err + 8);
        else if (!strncmp(err, "server: image directory ", 24)) fprintf(stderr, "error: --image-dir %s\n", err + 24);
        else fprintf(stderr, "error: %s\n", !strncmp(err, "server: ", 8) ? err + 8 : err);
        goto out;
    }
    fprintf(stderr, "serving %s on http://%s:%d (%d sequence%s at a time; Ctrl-C or SIGTERM stops)\n", p.alias, S.host,
            nm_server_port(srv), S.parallel, S.parallel > 1 ? "s" : "");
    int sig = 0;
    sigwait(&stop, &sig);
    fprintf(stderr, "%s: finishing the requests in flight\n", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    nm_server_stop(srv, S.timeout_s);
    rc = 0;
out:
    nm_model_free(m);
    cli_opts_free(&S.o);
keys:
    for (int k = 0; k < S.n_keys; k++) free(S.keys[k]);
    return rc;
}
