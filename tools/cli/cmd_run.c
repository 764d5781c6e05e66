// nanomind run: text completion, a one-shot chat turn, or an interactive chat.
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"


static void run_usage(void) {
    printf("usage: nanomind run -m MODEL [-p PROMPT] [options]\n"
           "\n"
           "  -m, --model FILE         GGUF language model (llama, qwen2, gemma3)\n"
           "  -p, --prompt TEXT        prompt; with --chat, the user's message of a one-shot chat turn.\n"
           "                           Escapes (\\n \\t \\\\ \\\" \\xHH ...) are processed, as llama.cpp\n"
           "  -e, --escape             process the prompt's escapes (the default)\n"
           "  --no-escape              take the prompt as written\n"
           "  -f, --file FILE          read the prompt from a file (as written)\n"
           "  -n, --n-predict N        tokens to generate (default -1: until end of text or a full context)\n"
           "  -t, --threads N          threads (default, or -1: all cores)\n"
           "  --pin                    pin each thread to a core (of its lane, with --cores)\n"
           "  --cores LIST             the LLM brick's lane: its threads on these cores (0-3,6 / big / little /\n"
           "                           cluster:N; nanomind --list-devices shows the clusters)\n"
           "  --mmproj-cores LIST      the vision brick's lane (disjoint from --cores: encoder and decoder\n"
           "                           run at the same time without taking each other's cores)\n"
           "  -c, --ctx-size N         context size (default: min(train context, 4096); 0: the training context)\n"
           "  -b, --batch-size N       prompt tokens per forward pass (default 512)\n"
           "  -ub, --ubatch-size N     prompt chunks end at multiples of N positions (default 128, at most -b):\n"
           "                           a cached prefix is reused to such a boundary, so the answer is the same\n"
           "                           with the cache as without it\n"
           "  --chat, -cnv, --conversation\n"
           "                           chat with the model's template (interactive without -p); the default\n"
           "                           when the model has a chat template, as llama-completion\n"
           "  -no-cnv, --no-conversation  plain completion: the prompt printed, then continued (the default\n"
           "                           for a model without a chat template)\n"
           "  --no-display-prompt      plain completion: print only what is generated\n"
           "  -sys, --system-prompt TEXT  the conversation's system message\n"
           "  -sysf, --system-prompt-file FILE  the same from a file (its last newline dropped)\n"
           "  -ctk, -ctv TYPE          the KV cache's type: f16 (the only one here; q8_0 and q4_0 are refused)\n"
           "  --log-disable, -v, --verbose, --no-warmup  accepted (llama.cpp's): nanomind prints only errors\n"
           "                           and notes (--stats: timings) and does no warm-up run\n"
           "  --chat-template NAME     force a built-in template: %s (with --jinja: the fallback)\n"
           "  --jinja                  render the model's own Jinja template (tokenizer.chat_template) with\n"
           "                           nanomind's interpreter; one beyond its subset falls back to the\n"
           "                           built-in template, said on stderr (docs/jinja.md)\n"
           "  --chat-template-file FILE  render the Jinja template in FILE instead (implies --jinja)\n"
           "  --chat-template-kwargs JSON  more variables of the Jinja template, as llama.cpp's: e.g.\n"
           "                           '{\"enable_thinking\": false}' (Qwen3's, SmolLM3's thinking off); needs --jinja\n"
           "  --temp T                 temperature (default 0.8; 0 = greedy)\n"
           "  --top-k K                top-k (default 40; 0 = off)\n"
           "  --top-p P                top-p in (0, 1] (default 0.95; 1 = off)\n"
           "  --min-p P                min-p in [0, 1] (default 0.05; 0 = off)\n"
           "  --repeat-penalty R       repetition penalty > 0 (default 1.0 = off)\n"
           "  --repeat-last-n N        tokens the penalties look back (default 64; 0 = off, -1 = the context)\n"
           "  --presence-penalty P     subtracted once from the logit of a token in that window (default 0 = off)\n"
           "  --frequency-penalty F    subtracted per occurrence in that window (default 0 = off)\n"
           "  -s, --seed S             sampling seed (same seed, same text; default -1: random, --stats prints it)\n"
           "  -r, --reverse-prompt TEXT  stop once the generated text contains TEXT (repeatable; with --chat the\n"
           "                           turn ends there)\n"
           "  --ignore-eos             never stop at an end-of-generation token\n"
           "  --mmproj FILE            vision encoder + projector (llama.cpp mmproj GGUF: mlp, idefics3,\n"
           "                           qwen2vl_merger)\n"
           "  --image-min-tokens N, --image-max-tokens N  the fewest and most image tokens an image is\n"
           "                           resized to (dynamic-resolution mmproj only; default: the model's, 8..4096)\n"
           "  --image FILE             image (PNG, JPEG, PPM) for the prompt; repeatable. Each goes where\n"
           "                           the prompt says " MEDIA_MARKER ", or before the prompt if it has none;\n"
           "                           a regular file of at most 64 MiB, or - (stdin)\n"
           "  -fa, --flash-attn [on|off|auto]  accepted: attention is always one fused kernel here\n"
           CLI_HELP_MODEL
           "  --plan                   print where the planner would run each brick (from `nanomind profile`'s\n"
           "                           measurements and the bricks' estimates for this prompt) and exit\n"
           "  --plan-goal G            latency (default), throughput or energy\n"
           "  --profile FILE           the unit profiles (default ~/.cache/nanomind/profile.json)\n"
           "  --stats                  print timings, the seed, the bytes copied between bricks, and memory\n"
           "                           to stderr\n"
           "  -h, --help               this help;  --version  the version\n"
           "Ctrl-C while the model answers cancels the answer (a chat goes on; a one-shot run exits 130).\n",
           nm_chat_template_names());
}

// The generation runs in an nm_pipeline: the LLM brick on its lane (and the
// vision brick of --mmproj, on the thread that writes the prompt); a prompt
// goes in as a request, the answer comes back as TEXT events, printed as they
// arrive. The pipeline keeps a chat's turns. --stats prints the bricks' stats
// and the pipeline's copy ledger.

// Ctrl-C while the model answers cancels the answer (nm_pipeline_cancel; it
// stops before its next token); a second one before the answer ends, or one
// at the chat prompt, ends the command as SIGINT does.
static volatile sig_atomic_t g_interrupts, g_at_prompt;

static void on_sigint(int sig) {
    if (g_at_prompt || g_interrupts++ > 0) {
        nm_outfile_remove_temps();
        signal(sig, SIG_DFL);
        raise(sig);
    }
}

typedef struct reply {
    bool ok, cancelled;
    double t_first; // seconds from the request to the answer's first text
} reply;

// Reads request id's events up to its DONE, printing the answer as it
// arrives; its notes and its end (cancelled, context full, an error, with
// `goes_on` after it) to stderr.
static reply receive(nm_pipeline *P, uint64_t id, int32_t n_ctx, const char *goes_on) {
    reply R = {.ok = true};
    bool asked = false; // the request was cancelled
    for (;;) {
        if (g_interrupts > 0 && !asked) { // Ctrl-C: stop this answer
            nm_pipeline_cancel(P, id);
            asked = true;
        }
        nm_pipeline_event ev;
        const nm_status st = nm_pipeline_read(P, 100000000, &ev); // looks at Ctrl-C every 100 ms
        if (st == NM_ERR_TIMEOUT) continue;
        if (st != NM_OK) {
            fprintf(stderr, "\nerror: the pipeline stopped: %s\n", nm_status_str(st));
            R.ok = false;
            break;
        }
        if (ev.kind == NM_PIPELINE_TEXT) {
            fwrite(ev.text, 1, ev.len, stdout);
            fflush(stdout);
        } else if (ev.kind == NM_PIPELINE_NOTE) { // (the oldest turns dropped, a template's fallback)
            fprintf(stderr, "[%s]\n", ev.text);
        } else if (ev.kind == NM_PIPELINE_DONE) {
            R.t_first = ev.t.first_text;
            if (ev.status == NM_ERR_CANCELLED) {
                fprintf(stderr, "\n[cancelled]\n");
                R.cancelled = true; // (a Ctrl-C after the answer's last token cancels nothing)
            } else if (ev.status != NM_OK) {
                fprintf(stderr, "\nerror: %s%s\n", ev.text, goes_on);
                R.ok = false;
            } else if (ev.stop == NM_LLM_STOP_CTX_FULL) {
                fprintf(stderr, "\n[context full: %d tokens]\n", n_ctx);
            }
            break;
        }
    }
    g_interrupts = 0; // a Ctrl-C during this answer is spent: the next one cancels the next answer
    return R;
}

// Formats the conversation; returns a malloc'd string or NULL (error printed).
static char *format_chat(const nm_model *m, const cli_opts *o, const nm_chat_msg *msgs, size_t n) {
    nm_status st;
    char *buf = cli_chat_text(m, o, msgs, n, &st);
    if (st == NM_ERR_TEMPLATE && !o->jinja)
        fprintf(stderr,
                "error: the model names no chat template we know (tokenizer.chat_template is absent or not one we "
                "read; a base model such as Gemma 3 270M has none and is not made for chat): run it without --chat, "
                "or name a template with --chat-template (%s)\n",
                nm_chat_template_names());
    return buf;
}

// --plan: the planner's placement of this run's bricks on the profiled units,
// from their estimates for this prompt (its tokens, the images' embeddings,
// -n tokens generated: 128 when -n is -1). The images are taken at the
// encoder's input size. Printed; nothing is generated.
static int print_plan(nm_brick *llm, nm_brick *vision, const nm_model *m, const cli_opts *o) {
    char path[1024], err[512];
    const char *file = o->profile;
    if (!file && cli_profile_path(path, sizeof path)) file = path;
    nm_unit_profile units[NM_PLAN_MAX_UNITS];
    int32_t n_units = 0;
    int rc = cli_load_units(file, units, &n_units);
    if (rc) return rc;
    nm_status st;
    nm_plan_brick b[2];
    int32_t n = 0;
    int64_t image_rows = 0;
    if (vision) {
        memset(&b[n], 0, sizeof b[n]);
        b[n].kind = NM_BRICK_VISION;
        b[n].name = "vision";
        b[n].units = nm_brick_impl(vision)->units;
        for (int i = 0; i < o->n_images; i++) {
            nm_brick_cost c;
            if (nm_brick_estimate(vision, &(nm_brick_input){0}, &c) != NM_OK) break;
            image_rows += c.n_out;
            b[n].cost.flops += c.flops;
            for (int t = 0; t < NM_EST_TYPES; t++) b[n].cost.flops_by_type[t] += c.flops_by_type[t];
            b[n].cost.weight_bytes_read += c.weight_bytes_read;
            b[n].cost.act_bytes += c.act_bytes;
            b[n].cost.n_passes += c.n_passes;
            b[n].cost.n_ops += c.n_ops;
            b[n].cost.n_out += c.n_out;
            b[n].cost.weight_bytes = c.weight_bytes;
            if (c.peak_bytes > b[n].cost.peak_bytes) b[n].cost.peak_bytes = c.peak_bytes;
        }
        n++;
    }
    const int32_t n_tok = o->prompt ? -nm_tokenize(m, o->prompt, strlen(o->prompt), NULL, 0, true, true) : 0;
    const nm_brick_input li = {.n_tokens = n_tok + image_rows, .n_predict = o->n_predict > 0 ? o->n_predict : 128};
    memset(&b[n], 0, sizeof b[n]);
    b[n].kind = NM_BRICK_LLM;
    b[n].name = "llm";
    b[n].units = nm_brick_impl(llm)->units;
    b[n].n_layer = nm_model_n_layer(m);
    // the whole request, and its generation alone (scored apart: compute-bound prompt, memory-bound tokens)
    const nm_brick_input gi = {.n_past = li.n_tokens, .n_predict = li.n_predict};
    if ((st = nm_brick_estimate(llm, &li, &b[n].cost)) != NM_OK ||
        (st = nm_brick_estimate(llm, &gi, &b[n].decode)) != NM_OK) {
        fprintf(stderr, "error: the LLM brick's estimate: %s\n", nm_status_str(st));
        return 1;
    }
    n++;
    nm_plan p;
    if ((st = nm_plan_make(units, n_units, b, n, (nm_plan_goal)o->plan_goal, &p, err, sizeof err)) != NM_OK) {
        fprintf(stderr, "error: %s\n", err);
        return 1;
    }
    static const char *goals[] = {"latency", "throughput", "energy"};
    printf("request: %lld prompt positions (%d text tokens, %lld image embeddings), %lld generated; goal: %s; "
           "units from %s\n",
           (long long)li.n_tokens, (int)n_tok, (long long)image_rows, (long long)li.n_predict, goals[o->plan_goal], file);
    for (int32_t i = 0; i < n; i++)
        printf("  %-6s estimate: %.2f GFLOP, %.1f MB of weights streamed, %lld passes, %.1f MiB held\n", b[i].name,
               b[i].cost.flops / 1e9, b[i].cost.weight_bytes_read / 1e6, (long long)b[i].cost.n_passes,
               b[i].cost.peak_bytes / 1048576.0);
    char buf[4096];
    if (nm_plan_format(&p, units, b, buf, sizeof buf) > 0) fputs(buf, stdout);
    return 0;
}

static int run_main(cli_opts *op, int argc, char **argv) {
    if (!cli_parse("run", CLI_MPATH | CLI_MODEL | CLI_CTX | CLI_FILE | CLI_PROMPT | CLI_GEN | CLI_VISION | CLI_IMGTOK | CLI_STATS | CLI_LANE | CLI_PLAN,
                   argc, argv, op, NULL))
        return 2;
    cli_opts o = *op;
    if (o.help) {
        run_usage();
        return 0;
    }
    if (o.version) {
        cli_print_version();
        return 0;
    }
    if (!o.model) {
        fprintf(stderr, "error: -m MODEL is required (see nanomind run --help)\n");
        return 2;
    }
    char *file_prompt = NULL;
    if (o.file) {
        char ferr[512];
        nm_status fst = nm_infile_read(o.file, CLI_TEXT_FILE_MAX, NM_INFILE_STDIN | NM_INFILE_STREAM, &file_prompt,
                                       NULL, ferr, sizeof ferr);
        if (fst != NM_OK) {
            fprintf(stderr, "error: cannot read prompt file: %s\n", ferr);
            return 1;
        }
        o.prompt = file_prompt;
    }
    // Without --chat or -no-cnv: a conversation if the model has a chat template (decided once it is
    // loaded), as llama-completion; -sys, --chat-template and --jinja ask for one.
    const bool cnv_auto = !o.chat_given;
    if (cnv_auto && (o.system || o.chat_tmpl || o.jinja)) o.chat = true;
    if ((o.chat_tmpl || o.jinja) && !o.chat && !cnv_auto) {
        fprintf(stderr, "error: %s only applies to a conversation (not with -no-cnv)\n",
                o.chat_tmpl ? "--chat-template" : o.chat_tmpl_file ? "--chat-template-file" : "--jinja");
        return 2;
    }
    if (o.system && !o.chat && !cnv_auto) {
        fprintf(stderr, "error: -sys (the system message) only applies to a conversation (not with -no-cnv)\n");
        return 2;
    }
    if (o.n_images > 0 && !o.mmproj) {
        fprintf(stderr, "error: --image needs --mmproj (the vision encoder of the model)\n");
        return 2;
    }
    for (int i = 0; i < o.n_images; i++)
        if (!o.images[i]) {
            fprintf(stderr, "error: --image needs a file\n");
            return 2;
        }
    if ((o.image_min_tokens || o.image_max_tokens) && !o.mmproj) {
        fprintf(stderr, "error: %s needs --mmproj (the vision encoder of the model)\n",
                o.image_min_tokens ? "--image-min-tokens" : "--image-max-tokens");
        return 2;
    }
    if (o.mmproj && o.n_images == 0) {
        fprintf(stderr, "error: --mmproj needs at least one --image\n");
        return 2;
    }
    if (o.n_images > 0 && o.chat && !o.prompt) {
        fprintf(stderr, "error: images go with a one-shot prompt (-p or -f), not an interactive chat\n");
        return 2;
    }
    if (o.chat_tmpl && !nm_chat_template_known(o.chat_tmpl)) {
        fprintf(stderr, "error: unknown chat template '%s' (known: %s)\n", o.chat_tmpl, nm_chat_template_names());
        return 2;
    }
    if ((o.plan_goal || o.profile) && !o.plan) {
        fprintf(stderr, "error: --plan-goal and --profile go with --plan\n");
        free(file_prompt);
        return 2;
    }
    if (!o.prompt && !o.chat && !cnv_auto) {
        fprintf(stderr, "error: give a prompt with -p or -f, or use --chat\n");
        free(file_prompt);
        return 2;
    }

    nm_model_params mp = nm_model_default_params();
    mp.n_threads = o.n_threads;
    mp.no_mmap = o.no_mmap;
    nm_model *m = NULL;
    nm_pipeline *P = NULL;
    nm_ledger *ledger = NULL;
    nm_pipeline_image *images = NULL;
    char *stdin_image = NULL;
    int rc = 1;
    double t_load = cli_now();
    char err[1024];
    nm_status st = nm_model_load(o.model, &mp, &m, err, sizeof err);
    if (st != NM_OK) {
        cli_load_error(o.model, st, err, CLI_WANT_LLM);
        free(file_prompt);
        return 1;
    }
    cli_mlock(&o);
    // The images: files, or - (stdin) read here, at most what the vision brick takes
    if (o.n_images > 0 && !(images = calloc((size_t)o.n_images, sizeof *images))) goto done;
    for (int i = 0; i < o.n_images; i++) {
        if (strcmp(o.images[i], "-") != 0) {
            images[i].path = o.images[i];
            continue;
        }
        size_t n = 0;
        char ferr[512];
        if (stdin_image) {
            fprintf(stderr, "error: --image -: stdin can be read once\n");
            goto done;
        }
        if ((st = nm_infile_read(o.images[i], CLI_IMAGE_FILE_MAX, NM_INFILE_STDIN | NM_INFILE_STREAM, &stdin_image, &n,
                                 ferr, sizeof ferr)) != NM_OK) {
            fprintf(stderr, "error: image %s (%s)\n", ferr, nm_status_str(st));
            goto done;
        }
        images[i].bytes = stdin_image, images[i].n_bytes = n;
    }
    if (cnv_auto && !o.chat) { // the model's own template, if it has one we format, makes it a conversation
        nm_chat_msg probe = {"user", "hi"};
        char buf[16];
        o.chat = nm_chat_format(m, NULL, &probe, 1, true, buf, sizeof buf) != NM_ERR_TEMPLATE;
        if (!o.chat && !o.prompt) {
            fprintf(stderr, "error: give a prompt with -p or -f (the model has no chat template we know for a "
                            "conversation)\n");
            goto done;
        }
    }
    if (o.chat && !o.jinja) { // a model without a usable template fails here, before any input is read
        nm_chat_msg probe = {"user", "hi"};
        char *f = format_chat(m, &o, &probe, 1);
        if (!f) goto done;
        free(f);
    }
    // The pipeline: the LLM brick (and the vision brick) on the model loaded
    // here (the command read its training context for -c 0, its template).
    const bool interactive = o.chat && !o.prompt;
    if (!(ledger = nm_ledger_create()) || nm_ledger_endpoint(ledger, "cli") < 0) {
        fprintf(stderr, "error: out of memory\n");
        goto done;
    }
    nm_brick_params lp = cli_llm_params(&o, m, NULL);
    nm_brick_params vp = cli_vision_params(&o, o.mmproj, o.mmproj_device);
    nm_pipeline_params pp = nm_pipeline_default_params();
    pp.llm = &lp;
    pp.vision = o.mmproj ? &vp : NULL;
    pp.ledger = ledger;
    pp.chat = o.chat;
    cli_chat_params(&o, &pp);
    pp.keep_history = interactive; // llama.cpp's conversation: the turns so far, the oldest dropped to fit
    pp.queue = 1;
    if ((st = nm_pipeline_create(&pp, &P, err, sizeof err)) != NM_OK) {
        if (!strncmp(err, "vision: ", 8)) cli_vision_error(&o, o.mmproj, st, err + 8);
        else if (!strncmp(err, "llm: ", 5)) fprintf(stderr, "error: cannot create context: %s: %s\n", nm_status_str(st), err + 5);
        else fprintf(stderr, "error: %s\n", err);
        goto done;
    }
    nm_brick *llm = nm_pipeline_brick(P, NM_BRICK_LLM), *vision = nm_pipeline_brick(P, NM_BRICK_VISION);
    nm_ctx *c = nm_brick_llm_ctx(llm);
    cli_ctx_note(c);
    t_load = cli_now() - t_load;
    if (o.plan) {
        rc = print_plan(llm, vision, m, &o);
        goto done;
    }
    struct sigaction sa = {.sa_handler = on_sigint, .sa_flags = SA_RESTART}; // kept until the command ends
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    if (o.stats) {
        char desc[256];
        nm_model_desc(m, desc, sizeof desc);
        fprintf(stderr, "model: %s\n", desc);
        fprintf(stderr, "seed: %llu%s\n", (unsigned long long)o.sp.seed, o.seed_random ? " (random)" : "");
        fprintf(stderr, "context: %d tokens (training context %d)\n", nm_ctx_n_ctx(c), nm_model_n_ctx_train(m));
    }
    reply R = {.ok = true};
    uint64_t id = 0;
    if (!interactive) {
        // one request: a completion (the prompt printed, then continued) or a chat turn
        const nm_pipeline_input in = {.text = o.prompt, .images = images, .n_images = o.n_images};
        if ((st = nm_pipeline_submit(P, &in, &id, err, sizeof err)) != NM_OK) {
            fprintf(stderr, "error: %s\n", err);
            goto done_stats;
        }
        if (!o.chat && !o.no_display_prompt) fputs(o.prompt, stdout);
        R = receive(P, id, nm_ctx_n_ctx(c), "");
        if (R.ok) putchar('\n');
        fflush(stdout); // (before the stats on stderr)
        rc = !R.ok ? 1 : R.cancelled ? 130 : 0; // (130: as a shell reports SIGINT, after the stats)
        goto done_stats;
    }
    // an interactive chat: a turn a line of stdin
    char line[8192];
    for (;;) {
        fprintf(stderr, "> ");
        g_at_prompt = 1; // Ctrl-C here ends the command
        char *got = fgets(line, sizeof line, stdin);
        g_at_prompt = 0;
        if (!got) break;
        line[strcspn(line, "\n")] = '\0';
        if (!line[0]) continue;
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
        if ((st = nm_pipeline_submit(P, &(nm_pipeline_input){.text = line}, &id, err, sizeof err)) != NM_OK) {
            fprintf(stderr, "error: %s\n", err);
            break;
        }
        const reply r = receive(P, id, nm_ctx_n_ctx(c), "; the conversation goes on");
        if (r.t_first > 0 && R.t_first == 0) R.t_first = r.t_first;
        if (r.ok) putchar('\n');
        fflush(stdout);
    }
    rc = 0;
done_stats:
    nm_pipeline_close(P);
    if (o.stats) {
        nm_pipeline_brick_report lr, vr;
        nm_pipeline_brick_stats(P, NM_BRICK_LLM, &lr);
        const nm_brick_stats bs = lr.s;
        fprintf(stderr, "load: %.2f s\n", t_load);
        fprintf(stderr, "prompt: %d tokens in %.3f s (%.2f tok/s)\n", (int)bs.n_prompt_tokens, bs.t_prompt,
                bs.t_prompt > 0 ? bs.n_prompt_tokens / bs.t_prompt : 0.0);
        fprintf(stderr, "generation: %d tokens in %.3f s (%.2f tok/s)\n", (int)bs.n_gen, bs.t_gen,
                bs.t_gen > 0 ? bs.n_gen / bs.t_gen : 0.0);
        if (nm_pipeline_brick_stats(P, NM_BRICK_VISION, &vr) == NM_OK) {
            const nm_brick_stats vs = vr.s;
            fprintf(stderr, "vision: %d images, %d encoder runs in %.3f s (%.1f ms each), decode+preprocess %.3f s\n",
                    (int)vs.n_images, (int)vs.n_encoded, vs.t_encode,
                    vs.n_encoded ? 1e3 * vs.t_encode / (double)vs.n_encoded : 0.0, vs.t_decode);
        }
        if (strcmp(nm_ctx_device(c), "cpu") != 0) {
            uint64_t wrapped = 0, uploaded = 0;
            nm_ctx_device_stats(c, &wrapped, &uploaded);
            fprintf(stderr, "device: %s, %d of %d layers; host memory it reads in place %.1f MiB, copied to it %.1f MiB\n",
                    o.device ? o.device : nm_ctx_device(c), nm_ctx_device_layers(c), nm_model_n_layer(m),
                    wrapped / 1048576.0, uploaded / 1048576.0);
        }
        if (R.t_first > 0) fprintf(stderr, "time to first token: %.3f s\n", R.t_first);
        char led[1024];
        if (nm_ledger_format(ledger, led, sizeof led) > 0) fputs(led, stderr);
        long anon, file;
        fprintf(stderr, "peak RSS: %.1f MiB\n", cli_peak_rss_kb() / 1024.0);
        if (cli_rss_split(&anon, &file))
            fprintf(stderr, "RSS now: %.1f MiB mapped from the model file (weights, %s) + %.1f MiB allocated\n",
                    file / 1024.0, o.no_mmap ? "--no-mmap: read into the allocations" : "not copied", anon / 1024.0);
    }
done:
    nm_pipeline_free(P);
    nm_ledger_free(ledger);
    nm_model_free(m);
    free(images);
    free(stdin_image);
    free(file_prompt);
    return rc;
}

int cmd_run(int argc, char **argv) {
    cli_opts o;
    int rc = run_main(&o, argc, argv);
    cli_opts_free(&o);
    return rc;
}
