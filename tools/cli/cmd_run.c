// nanomind run: text completion, a one-shot chat turn, or an interactive chat.
#include <errno.h>
#include <pthread.h>
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

// The generation runs as the LLM brick on its own thread (a lane): a prompt
// goes in as slots of the input ring (text tokenized straight into a slot,
// images as the vision brick's segments), the sampled tokens come back one
// per slot of the output ring and are printed as they arrive. Every brick
// shares one copy ledger (--stats prints it), so "0 bytes copied" is
// measured on the path that produced the text.
typedef struct session {
    nm_brick *llm;      // owns the model and the context
    nm_model *m;        // the LLM brick's (tokenizer, template)
    nm_ctx *c;
    nm_tabm *in, *out;  // prompt slots -> LLM brick -> token slots
    nm_ledger *ledger;
    nm_brick *vision;   // --mmproj: an IMAGE slot in, its segment out into `in`
    nm_tabm *img;       // the vision brick's input: image files, read into its slot
    const char *const *images; // --image files, in the order of the prompt's media markers
    double t_first;     // seconds from the first prompt slot to the first generated token
    uint64_t request;   // the id of the prompt being sent and answered (1, 2, ...)
    bool cancelled;     // the last answer was cut short by Ctrl-C
    pthread_t lane;
    bool lane_started;
} session;

// Ctrl-C while the model answers cancels the answer (the request's id is
// marked on the LLM brick's input ring; it stops before its next token); a
// second one before the answer ends, or one at the chat prompt, ends the
// command as SIGINT does.
static volatile sig_atomic_t g_interrupts, g_at_prompt;

static void on_sigint(int sig) {
    if (g_at_prompt || g_interrupts++ > 0) {
        nm_outfile_remove_temps();
        signal(sig, SIG_DFL);
        raise(sig);
    }
}

static void *lane_main(void *arg) {
    session *S = arg;
    (void)nm_brick_run(S->llm, S->in, S->out); // returns when a ring is shut down
    return NULL;
}

// Creates the rings and starts the LLM brick's lane. Input slots hold a whole
// context of token ids or one encoder run's embeddings; the image ring one
// file (the largest given, at most what the vision brick takes; stdin: that).
static bool start_lane(session *S, const cli_opts *o, char *err, size_t err_size) {
    size_t in_bytes = nm_brick_in_slot_bytes(S->llm);
    if (S->vision && nm_brick_out_slot_bytes(S->vision) > in_bytes) in_bytes = nm_brick_out_slot_bytes(S->vision);
    nm_status st = nm_tabm_create(NULL, 4, in_bytes, &S->in, err, err_size);
    if (st == NM_OK) st = nm_tabm_create(NULL, 16, nm_brick_out_slot_bytes(S->llm), &S->out, err, err_size);
    if (st == NM_OK && S->vision) {
        const size_t cap = nm_brick_in_slot_bytes(S->vision);
        size_t img_bytes = 1;
        for (int i = 0; i < o->n_images; i++) { // each opened now: a missing or too large one fails the run here
            FILE *f;
            int64_t n;
            char ferr[512];
            if ((st = nm_infile_open(o->images[i], cap, NM_INFILE_STDIN, &f, &n, ferr, sizeof ferr)) != NM_OK) {
                fprintf(stderr, "error: image %s (%s)\n", ferr, nm_status_str(st));
                return false;
            }
            fclose(f);
            if (n < 0 || (size_t)n > img_bytes) img_bytes = n < 0 ? cap : (size_t)n; // a stream: as large as taken
        }
        st = nm_tabm_create(NULL, 1, img_bytes, &S->img, err, err_size);
    }
    if (st != NM_OK) {
        fprintf(stderr, "error: cannot create the TABM rings: %s: %s\n", nm_status_str(st), err);
        return false;
    }
    if (nm_ledger_endpoint(S->ledger, "cli") < 0 || pthread_create(&S->lane, NULL, lane_main, S) != 0) {
        fprintf(stderr, "error: cannot start the LLM brick's thread\n");
        return false;
    }
    S->lane_started = true;
    return true;
}

// Shuts both rings (the brick returns, also if it waits on a full output
// ring) and joins the lane. After this the brick's stats can be read.
static void stop_lane(session *S) {
    if (S->in) nm_tabm_shutdown(S->in);
    if (S->out) nm_tabm_shutdown(S->out);
    if (S->lane_started) pthread_join(S->lane, NULL);
    S->lane_started = false;
}

// A prompt's text part (cli_prompt_i.text; ctx: the session): tokenizes
// [text, text + len) straight into a slot of the input ring and publishes it.
// user: NM_LLM_IN_POS(0) for a prompt (the brick reuses the cached prefix it
// shares with the last one), | NM_BRICK_MORE when more parts follow (e.g.
// image embeddings, then more text). add_special: BOS on the first part.
// False (error printed) if it gives no tokens or does not fit.
static bool send_text(void *ctx, const char *text, size_t len, uint64_t user, bool add_special) {
    session *S = ctx;
    nm_tabm_slot sl;
    nm_status st = nm_tabm_acquire_write(S->in, 0, -1, &sl);
    if (st != NM_OK) {
        fprintf(stderr, "error: the LLM brick's input ring: %s (%s)\n", nm_status_str(st), nm_tabm_last_error(S->in));
        return false;
    }
    const int32_t n_ctx = nm_ctx_n_ctx(S->c);
    int32_t cap = (int32_t)(sl.capacity / sizeof(int32_t));
    int32_t n = nm_tokenize(S->m, text, len, sl.data, cap, add_special, true);
    if (n == 0 || n < 0 || n >= n_ctx) {
        if (n == 0) fprintf(stderr, "error: the prompt gives no tokens\n");
        else fprintf(stderr, "error: prompt of %d tokens does not fit the context of %d (-c)\n", n < 0 ? -n : n, n_ctx);
        nm_tabm_cancel(S->in, &sl);
        return false;
    }
    sl.meta->kind = NM_TABM_TOKENS;
    sl.meta->ndim = 1;
    sl.meta->shape[0] = n;
    sl.meta->size = sizeof(int32_t) * (uint64_t)n;
    sl.meta->user = user;
    sl.meta->request = S->request;
    if ((st = nm_tabm_publish(S->in, &sl)) != NM_OK) {
        fprintf(stderr, "error: the LLM brick's input ring: %s (%s)\n", nm_status_str(st), nm_tabm_last_error(S->in));
        nm_tabm_cancel(S->in, &sl);
        return false;
    }
    return true;
}

// A prompt's image k (cli_prompt_i.image; ctx: the session): reads the file
// into the vision brick's input slot (the file's bytes go from the page cache
// into the slot once; the brick decodes them there), then runs the brick on
// this thread: it writes the image's segment into the LLM brick's input ring,
// in order with the text around it. user: the segment's flags (its position,
// NM_BRICK_MORE). False (error printed) on a bad image.
static bool send_image(void *ctx, int k, uint64_t user) {
    session *S = ctx;
    const char *path = S->images[k];
    nm_tabm_slot sl;
    nm_status st = nm_tabm_acquire_write(S->img, 0, -1, &sl);
    if (st != NM_OK) {
        fprintf(stderr, "error: the vision brick's input ring: %s\n", nm_status_str(st));
        return false;
    }
    size_t n = 0;
    char ferr[512];
    st = nm_infile_read_into(path, NM_INFILE_STDIN, sl.data, sl.capacity, &n, ferr, sizeof ferr);
    if (st != NM_OK || n == 0) {
        if (st != NM_OK) fprintf(stderr, "error: image %s (%s)\n", ferr, nm_status_str(st));
        else fprintf(stderr, "error: image %s: empty file (%s)\n", path, nm_status_str(NM_ERR_FORMAT));
        nm_tabm_cancel(S->img, &sl);
        return false;
    }
    sl.meta->kind = NM_TABM_IMAGE;
    sl.meta->ndim = 1;
    sl.meta->shape[0] = (int64_t)n;
    sl.meta->size = n;
    sl.meta->user = user;
    sl.meta->request = S->request;
    if ((st = nm_tabm_publish(S->img, &sl)) != NM_OK) {
        fprintf(stderr, "error: the vision brick's input ring: %s\n", nm_status_str(st));
        nm_tabm_cancel(S->img, &sl);
        return false;
    }
    const uint64_t bad_before = nm_brick_get_stats(S->vision).n_bad_requests;
    st = nm_brick_step(S->vision, S->img, S->in);
    if (st != NM_OK || nm_brick_get_stats(S->vision).n_bad_requests != bad_before) {
        // the brick's messages say what is wrong with the image (and where in it)
        fprintf(stderr, "error: image %s: %s\n", path, st != NM_OK ? nm_status_str(st) : nm_brick_last_error(S->vision));
        return false;
    }
    return true;
}

// The prompt's parts, text and images, go into the LLM brick's input ring.
static const cli_prompt_i to_llm = {send_text, send_image};

// Reads the brick's token slots until the END slot of the generation,
// printing the text as it arrives; the text also goes to `text` (may be
// NULL) up to text_size bytes. The token ids are read in place.
static bool receive(session *S, char *text, size_t text_size, double t_sent) {
    nm_detok dt = {0};
    char piece[256];
    size_t tl = 0;
    bool ok = true;
    S->cancelled = false;
    bool asked = false; // the request was marked cancelled
    for (bool end = false; !end;) {
        nm_tabm_slot sl;
        if (g_interrupts > 0 && !asked) { // Ctrl-C: stop this answer
            nm_tabm_cancel_request(S->in, S->request);
            asked = true;
        }
        nm_status st = nm_tabm_acquire_read(S->out, 100000000, &sl); // looks at Ctrl-C every 100 ms
        if (st == NM_ERR_TIMEOUT) continue;
        if (st != NM_OK) {
            fprintf(stderr, "\nerror: the LLM brick stopped: %s (%s)\n", nm_status_str(st), nm_brick_last_error(S->llm));
            ok = false;
            break;
        }
        const int32_t *toks = sl.data;
        const int32_t n = sl.meta->ndim == 1 ? (int32_t)sl.meta->shape[0] : 0;
        // the first sampled token: a text token, or an end-of-generation token the brick does not pass on
        const bool eog_end = !(sl.meta->user & NM_BRICK_MORE) && NM_LLM_STOP_OF(sl.meta->user) == NM_LLM_STOP_EOG;
        if ((n > 0 || eog_end) && S->t_first == 0.0) S->t_first = cli_now() - t_sent;
        for (int32_t i = 0; i < n; i++) {
            int32_t k = nm_detok_push(S->m, &dt, toks[i], piece, (int32_t)sizeof piece);
            if (k <= 0) continue;
            fwrite(piece, 1, (size_t)k, stdout);
            fflush(stdout);
            if (text && tl + (size_t)k < text_size) {
                memcpy(text + tl, piece, (size_t)k);
                tl += (size_t)k;
            }
        }
        const uint64_t user = sl.meta->user;
        nm_tabm_release(S->out, &sl);
        if (user & NM_BRICK_MORE) continue;
        end = true;
        nm_llm_stop why = NM_LLM_STOP_OF(user);
        if (why == NM_LLM_STOP_CANCELLED) {
            fprintf(stderr, "\n[cancelled]\n");
            S->cancelled = true; // (a Ctrl-C after the answer's last token cancels nothing)
        } else if (why == NM_LLM_STOP_CTX_FULL) {
            fprintf(stderr, "\n[context full: %d tokens]\n", nm_ctx_n_ctx(S->c));
        } else if (why == NM_LLM_STOP_ERROR || why == NM_LLM_STOP_BAD_INPUT) {
            fprintf(stderr, "\nerror: %s\n", nm_brick_last_error(S->llm));
            ok = false;
        }
    }
    if (text) text[tl < text_size ? tl : text_size - 1] = '\0';
    g_interrupts = 0; // a Ctrl-C during this answer is spent: the next one cancels the next answer
    return ok;
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
static int print_plan(const session *S, const cli_opts *o) {
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
    if (S->vision) {
        memset(&b[n], 0, sizeof b[n]);
        b[n].kind = NM_BRICK_VISION;
        b[n].name = "vision";
        b[n].units = nm_brick_impl(S->vision)->units;
        for (int i = 0; i < o->n_images; i++) {
            nm_brick_cost c;
            if (nm_brick_estimate(S->vision, &(nm_brick_input){0}, &c) != NM_OK) break;
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
    const int32_t n_tok = o->prompt ? -nm_tokenize(S->m, o->prompt, strlen(o->prompt), NULL, 0, true, true) : 0;
    const nm_brick_input li = {.n_tokens = n_tok + image_rows, .n_predict = o->n_predict > 0 ? o->n_predict : 128};
    memset(&b[n], 0, sizeof b[n]);
    b[n].kind = NM_BRICK_LLM;
    b[n].name = "llm";
    b[n].units = nm_brick_impl(S->llm)->units;
    b[n].n_layer = nm_model_n_layer(S->m);
    // the whole request, and its generation alone (scored apart: compute-bound prompt, memory-bound tokens)
    const nm_brick_input gi = {.n_past = li.n_tokens, .n_predict = li.n_predict};
    if ((st = nm_brick_estimate(S->llm, &li, &b[n].cost)) != NM_OK ||
        (st = nm_brick_estimate(S->llm, &gi, &b[n].decode)) != NM_OK) {
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

    char err[512];
    nm_model_params mp = nm_model_default_params();
    mp.n_threads = o.n_threads;
    mp.no_mmap = o.no_mmap;
    session S = {.images = o.images};
    char *media_prompt = NULL;
    int rc = 1;
    double t_load = cli_now();
    nm_status st = nm_model_load(o.model, &mp, &S.m, err, sizeof err);
    if (st != NM_OK) {
        cli_load_error(o.model, st, err, CLI_WANT_LLM);
        free(file_prompt);
        return 1;
    }
    cli_mlock(&o);
    // The LLM brick decodes on the model loaded here (the command reads its
    // training context for -c 0, its tokenizer and template for the prompt).
    S.ledger = nm_ledger_create();
    if (!S.ledger) {
        fprintf(stderr, "error: out of memory\n");
        goto done;
    }
    nm_brick_params lp = cli_llm_params(&o, S.m, S.ledger);
    if ((st = nm_brick_load(NULL, &lp, &S.llm, err, sizeof err)) != NM_OK) {
        fprintf(stderr, "error: cannot create context: %s: %s\n", nm_status_str(st), err);
        goto done;
    }
    S.c = nm_brick_llm_ctx(S.llm);
    cli_ctx_note(S.c);
    if (o.mmproj && !cli_vision_load(&o, o.mmproj, o.mmproj_device, S.llm, S.ledger, &S.vision)) goto done;
    // The prompt's media markers: one per image, or none (then the images go first).
    if (o.n_images > 0) {
        int n_markers = 0;
        for (const char *q = o.prompt; (q = strstr(q, MEDIA_MARKER)); q += strlen(MEDIA_MARKER)) n_markers++;
        if (n_markers == 0) {
            size_t ml = strlen(MEDIA_MARKER), pl = strlen(o.prompt);
            media_prompt = malloc(ml * (size_t)o.n_images + pl + 1);
            if (!media_prompt) goto done;
            for (int i = 0; i < o.n_images; i++) memcpy(media_prompt + ml * (size_t)i, MEDIA_MARKER, ml);
            memcpy(media_prompt + ml * (size_t)o.n_images, o.prompt, pl + 1);
            o.prompt = media_prompt;
        } else if (n_markers != o.n_images) {
            fprintf(stderr, "error: the prompt has %d %s markers for %d images\n", n_markers, MEDIA_MARKER, o.n_images);
            goto done;
        }
    }
    if (cnv_auto && !o.chat) { // the model's own template, if it has one we format, makes it a conversation
        nm_chat_msg probe = {"user", "hi"};
        char buf[16];
        o.chat = nm_chat_format(S.m, NULL, &probe, 1, true, buf, sizeof buf) != NM_ERR_TEMPLATE;
        if (!o.chat && !o.prompt) {
            fprintf(stderr, "error: give a prompt with -p or -f (the model has no chat template we know for a "
                            "conversation)\n");
            goto done;
        }
    }
    if (o.chat) { // a model without a usable template fails here, before any input is read
        nm_chat_msg probe = {"user", "hi"};
        char *f = format_chat(S.m, &o, &probe, 1);
        if (!f) goto done;
        free(f);
    }
    t_load = cli_now() - t_load;
    if (o.plan) {
        rc = print_plan(&S, &o);
        goto done;
    }
    if (!start_lane(&S, &o, err, sizeof err)) goto done;
    struct sigaction sa = {.sa_handler = on_sigint, .sa_flags = SA_RESTART}; // kept until the command ends
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    if (o.stats) {
        char desc[256];
        nm_model_desc(S.m, desc, sizeof desc);
        fprintf(stderr, "model: %s\n", desc);
        fprintf(stderr, "seed: %llu%s\n", (unsigned long long)o.sp.seed, o.seed_random ? " (random)" : "");
        fprintf(stderr, "context: %d tokens (training context %d)\n", nm_ctx_n_ctx(S.c), nm_model_n_ctx_train(S.m));
    }

    if (!o.chat) {
        // plain completion: the prompt is printed, then continued
        double t_sent = cli_now();
        S.request++;
        if (!cli_prompt_send(S.m, o.prompt, o.n_images, true, &to_llm, &S)) goto done_stats;
        if (!o.no_display_prompt) fputs(o.prompt, stdout);
        if (!receive(&S, NULL, 0, t_sent)) goto done_stats;
        putchar('\n');
        rc = S.cancelled ? 130 : 0; // as a shell reports SIGINT, after the stats
        goto done_stats;
    }

    // chat: one turn with -p, else a loop over stdin lines
    nm_chat_msg msgs[256];
    char *owned[256];
    size_t n_msgs = 0, n_owned = 0;
    if (o.system) msgs[n_msgs++] = (nm_chat_msg){"system", o.system};
    bool interactive = o.prompt == NULL;
    char line[8192];
    for (;;) {
        const char *user = o.prompt;
        if (interactive) {
            fprintf(stderr, "> ");
            g_at_prompt = 1; // Ctrl-C here ends the command
            char *got = fgets(line, sizeof line, stdin);
            g_at_prompt = 0;
            if (!got) break;
            line[strcspn(line, "\n")] = '\0';
            if (!line[0]) continue;
            if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
            user = owned[n_owned++] = strdup(line);
        }
        if (n_msgs + 2 > sizeof msgs / sizeof msgs[0] || n_owned + 1 >= sizeof owned / sizeof owned[0]) {
            fprintf(stderr, "error: conversation too long\n");
            break;
        }
        msgs[n_msgs++] = (nm_chat_msg){"user", user};
        char *formatted = format_chat(S.m, &o, msgs, n_msgs);
        if (!formatted) goto done_chat;
        // When the conversation no longer fits (with room for an answer: -n, or
        // a quarter of the context), drop the oldest turns after the system
        // message, as llama.cpp's chat does, and say so; a single message that
        // does not fit is an error for that turn only.
        const int32_t n_ctx = nm_ctx_n_ctx(S.c);
        const int32_t room = o.n_predict > 0 && o.n_predict < n_ctx ? o.n_predict : n_ctx / 4;
        const size_t first = o.system ? 1 : 0;
        int32_t n_tok = -nm_tokenize(S.m, formatted, strlen(formatted), NULL, 0, true, true);
        int dropped = 0;
        while (n_tok + room > n_ctx && n_msgs - first >= 3) { // a user + assistant pair can go
            memmove(msgs + first, msgs + first + 2, sizeof msgs[0] * (n_msgs - first - 2));
            n_msgs -= 2;
            dropped++;
            free(formatted);
            if (!(formatted = format_chat(S.m, &o, msgs, n_msgs))) goto done_chat;
            n_tok = -nm_tokenize(S.m, formatted, strlen(formatted), NULL, 0, true, true);
        }
        if (dropped)
            fprintf(stderr, "[context of %d tokens: dropped the %d oldest turn%s; the conversation is %d tokens now]\n",
                    n_ctx, dropped, dropped > 1 ? "s" : "", n_tok);
        if (n_tok >= n_ctx) {
            fprintf(stderr, "error: this message (%d tokens with the template%s) does not fit the context of %d "
                            "(-c); the conversation goes on\n",
                    n_tok, o.system ? " and the system message" : "", n_ctx);
            free(formatted);
            n_msgs--; // the message is not part of the conversation
            if (!interactive) goto done_chat;
            continue;
        }
        // The whole conversation from position 0: the brick decodes only what
        // its cache does not already hold.
        double t_sent = cli_now();
        S.request++;
        bool ok = cli_prompt_send(S.m, formatted, o.n_images, true, &to_llm, &S);
        free(formatted);
        if (!ok) goto done_chat;
        char *answer = malloc(65536);
        if (!answer || !receive(&S, answer, 65536, t_sent)) {
            free(answer);
            goto done_chat;
        }
        putchar('\n');
        fflush(stdout);
        owned[n_owned++] = answer;
        msgs[n_msgs++] = (nm_chat_msg){"assistant", answer}; // a cancelled answer as far as it went
        if (!interactive) break;
    }
    rc = !interactive && S.cancelled ? 130 : 0;
done_chat:
    for (size_t i = 0; i < n_owned; i++) free(owned[i]);
done_stats:
    stop_lane(&S);
    if (o.stats) {
        nm_brick_stats bs = nm_brick_get_stats(S.llm);
        fprintf(stderr, "load: %.2f s\n", t_load);
        fprintf(stderr, "prompt: %d tokens in %.3f s (%.2f tok/s)\n", (int)bs.n_prompt_tokens, bs.t_prompt,
                bs.t_prompt > 0 ? bs.n_prompt_tokens / bs.t_prompt : 0.0);
        fprintf(stderr, "generation: %d tokens in %.3f s (%.2f tok/s)\n", (int)bs.n_gen, bs.t_gen,
                bs.t_gen > 0 ? bs.n_gen / bs.t_gen : 0.0);
        if (S.vision) {
            nm_brick_stats vs = nm_brick_get_stats(S.vision);
            fprintf(stderr, "vision: %d images, %d encoder runs in %.3f s (%.1f ms each), decode+preprocess %.3f s\n",
                    (int)vs.n_images, (int)vs.n_encoded, vs.t_encode,
                    vs.n_encoded ? 1e3 * vs.t_encode / (double)vs.n_encoded : 0.0, vs.t_decode);
        }
        if (strcmp(nm_ctx_device(S.c), "cpu") != 0) {
            uint64_t wrapped = 0, uploaded = 0;
            nm_ctx_device_stats(S.c, &wrapped, &uploaded);
            fprintf(stderr, "device: %s, %d of %d layers; host memory it reads in place %.1f MiB, copied to it %.1f MiB\n",
                    o.device ? o.device : nm_ctx_device(S.c), nm_ctx_device_layers(S.c), nm_model_n_layer(S.m),
                    wrapped / 1048576.0, uploaded / 1048576.0);
        }
        if (S.t_first > 0) fprintf(stderr, "time to first token: %.3f s\n", S.t_first);
        char led[1024];
        if (nm_ledger_format(S.ledger, led, sizeof led) > 0) fputs(led, stderr);
        long anon, file;
        fprintf(stderr, "peak RSS: %.1f MiB\n", cli_peak_rss_kb() / 1024.0);
        if (cli_rss_split(&anon, &file))
            fprintf(stderr, "RSS now: %.1f MiB mapped from the model file (weights, %s) + %.1f MiB allocated\n",
                    file / 1024.0, o.no_mmap ? "--no-mmap: read into the allocations" : "not copied", anon / 1024.0);
    }
done:
    stop_lane(&S);
    nm_brick_free(S.vision);
    nm_brick_free(S.llm);
    free(media_prompt);
    nm_tabm_free(S.in);
    nm_tabm_free(S.out);
    nm_tabm_free(S.img);
    nm_ledger_free(S.ledger);
    nm_model_free(S.m);
    free(file_prompt);
    return rc;
}

int cmd_run(int argc, char **argv) {
    cli_opts o;
    int rc = run_main(&o, argc, argv);
    cli_opts_free(&o);
    return rc;
}
