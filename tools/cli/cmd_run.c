// nanomind run: text completion, a one-shot chat turn, or an interactive chat.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void run_usage(void) {
    printf("usage: nanomind run -m MODEL [-p PROMPT] [options]\n"
           "\n"
           "  -m, --model FILE       GGUF language model (llama, qwen2, gemma3)\n"
           "  -p, --prompt TEXT      prompt; with --chat, the user's message of a one-shot chat turn\n"
           "  -f, --file FILE        read the prompt from a file\n"
           "  -n, --n-predict N      tokens to generate (default 128; -1: until end of text or context)\n"
           "  -t, --threads N        threads (default: all cores)\n"
           "  --pin                  pin thread i to core i\n"
           "  -c, --ctx-size N       context size (default: min(train context, 4096))\n"
           "  -b, --batch-size N     prompt tokens per forward pass (default 512)\n"
           "  --chat                 chat with the model's template (interactive without -p)\n"
           "  -s, --system TEXT      system message for --chat\n"
           "  --chat-template NAME   force a template: %s\n"
           "  --temp T               temperature (default 0.8; 0 = greedy)\n"
           "  --top-k K              top-k (default 40; 0 = off)\n"
           "  --top-p P              top-p (default 0.95; 1 = off)\n"
           "  --min-p P              min-p (default 0.05; 0 = off)\n"
           "  --repeat-penalty R     repetition penalty (default 1.0 = off)\n"
           "  --repeat-last-n N      tokens the penalty looks back (default 64)\n"
           "  --seed S               sampling seed (same seed, same text)\n"
           "  --stats                print timings and memory to stderr\n",
           nm_chat_template_names());
}

typedef struct session {
    nm_model *m;
    nm_ctx *c;
    nm_sampler *s;
    int32_t *toks;    // tokens whose K/V are in the cache, in order
    int32_t n_past;
    int32_t n_batch;
    double t_prompt, t_gen;
    int32_t n_prompt, n_gen;
} session;

// Decodes toks[n_past..n) into the cache; the logits of the last are kept.
static bool feed(session *S, const int32_t *toks, int32_t n) {
    double t0 = cli_now();
    for (int32_t i = S->n_past; i < n; i += S->n_batch) {
        int32_t nb = n - i < S->n_batch ? n - i : S->n_batch;
        nm_status st = nm_decode(S->c, toks + i, nb, i, false);
        if (st != NM_OK) {
            fprintf(stderr, "error: decode failed: %s (%s)\n", nm_status_str(st), nm_ctx_last_error(S->c));
            return false;
        }
        for (int32_t j = 0; j < nb; j++) {
            S->toks[i + j] = toks[i + j];
            nm_sampler_accept(S->s, toks[i + j]);
        }
    }
    S->t_prompt += cli_now() - t0;
    S->n_prompt += n - S->n_past;
    S->n_past = n;
    return true;
}

// Samples up to n_predict tokens, printing them; the text also goes to `text`
// (may be NULL) up to text_size bytes.
static bool generate(session *S, int32_t n_predict, char *text, size_t text_size) {
    nm_detok dt = {0};
    char piece[256];
    size_t tl = 0;
    const int32_t n_ctx = nm_ctx_n_ctx(S->c);
    double t0 = cli_now();
    for (int32_t i = 0; n_predict < 0 || i < n_predict; i++) {
        if (S->n_past >= n_ctx) {
            fprintf(stderr, "\n[context full: %d tokens]\n", n_ctx);
            break;
        }
        int32_t tok = nm_sampler_sample(S->s, nm_get_logits(S->c, -1));
        if (nm_token_is_eog(S->m, tok)) break;
        nm_sampler_accept(S->s, tok);
        int32_t n = nm_detok_push(S->m, &dt, tok, piece, (int32_t)sizeof piece);
        if (n > 0) {
            fwrite(piece, 1, (size_t)n, stdout);
            fflush(stdout);
            if (text && tl + (size_t)n < text_size) {
                memcpy(text + tl, piece, (size_t)n);
                tl += (size_t)n;
            }
        }
        S->toks[S->n_past] = tok;
        nm_status st = nm_decode(S->c, &tok, 1, S->n_past, false);
        if (st != NM_OK) {
            fprintf(stderr, "\nerror: decode failed: %s (%s)\n", nm_status_str(st), nm_ctx_last_error(S->c));
            return false;
        }
        S->n_past++;
        S->n_gen++;
    }
    if (text) text[tl < text_size ? tl : text_size - 1] = '\0';
    S->t_gen += cli_now() - t0;
    return true;
}

// Tokenizes `text`, growing the buffer as needed.
static int32_t tokenize_all(const nm_model *m, const char *text, int32_t **buf, int32_t *cap) {
    int32_t n = nm_tokenize(m, text, strlen(text), *buf, *cap, true, true);
    if (n < 0) {
        int32_t need = -n;
        int32_t *nb = realloc(*buf, sizeof(int32_t) * (size_t)need);
        if (!nb) return -1;
        *buf = nb;
        *cap = need;
        n = nm_tokenize(m, text, strlen(text), *buf, *cap, true, true);
    }
    return n;
}

// Formats the conversation; returns a malloc'd string or NULL (error printed).
static char *format_chat(const nm_model *m, const char *tmpl, const nm_chat_msg *msgs, size_t n) {
    int32_t need = nm_chat_format(m, tmpl, msgs, n, true, NULL, 0);
    if (need == NM_ERR_TEMPLATE) {
        fprintf(stderr, "error: the model's chat template is not recognised; name one with --chat-template (%s)\n",
                nm_chat_template_names());
        return NULL;
    }
    if (need < 0) need = -need;
    char *buf = malloc((size_t)need + 1);
    if (buf && nm_chat_format(m, tmpl, msgs, n, true, buf, need + 1) < 0) {
        free(buf);
        buf = NULL;
    }
    return buf;
}

static bool prompt_turn(session *S, const cli_opts *o, const char *formatted, int32_t **tok_buf, int32_t *tok_cap) {
    int32_t n = tokenize_all(S->m, formatted, tok_buf, tok_cap);
    if (n < 0) return false;
    if (n >= nm_ctx_n_ctx(S->c)) {
        fprintf(stderr, "error: prompt of %d tokens does not fit the context of %d (-c)\n", n,
                nm_ctx_n_ctx(S->c));
        return false;
    }
    // Keep the cached prefix the new prompt shares with what is in the cache.
    int32_t keep = 0;
    while (keep < S->n_past && keep < n && S->toks[keep] == (*tok_buf)[keep]) keep++;
    if (keep == n) keep--; // recompute the last token to get its logits
    S->n_past = keep;
    return feed(S, *tok_buf, n);
}

int cmd_run(int argc, char **argv) {
    cli_opts o;
    if (!cli_parse(argc, argv, &o, NULL)) return 2;
    if (o.help) {
        run_usage();
        return 0;
    }
    if (!o.model) {
        fprintf(stderr, "error: -m MODEL is required (see nanomind run --help)\n");
        return 2;
    }
    char *file_prompt = NULL;
    if (o.file) {
        file_prompt = cli_read_file(o.file, NULL);
        if (!file_prompt) {
            fprintf(stderr, "error: cannot read prompt file '%s'\n", o.file);
            return 1;
        }
        o.prompt = file_prompt;
    }
    if (o.chat_tmpl && !o.chat) {
        fprintf(stderr, "error: --chat-template only applies with --chat\n");
        return 2;
    }
    if (o.system && !o.chat) {
        fprintf(stderr, "error: --system only applies with --chat\n");
        return 2;
    }
    if (o.chat_tmpl && !nm_chat_template_known(o.chat_tmpl)) {
        fprintf(stderr, "error: unknown chat template '%s' (known: %s)\n", o.chat_tmpl, nm_chat_template_names());
        return 2;
    }
    if (!o.prompt && !o.chat) {
        fprintf(stderr, "error: give a prompt with -p or -f, or use --chat\n");
        free(file_prompt);
        return 2;
    }

    char err[512];
    nm_model_params mp = nm_model_default_params();
    mp.n_threads = o.n_threads;
    session S = {0};
    int rc = 1;
    double t_load = cli_now();
    nm_status st = nm_model_load(o.model, &mp, &S.m, err, sizeof err);
    if (st != NM_OK) {
        fprintf(stderr, "error: cannot load '%s': %s: %s\n", o.model, nm_status_str(st), err);
        free(file_prompt);
        return 1;
    }
    nm_ctx_params cp = nm_ctx_default_params();
    cp.n_ctx = o.n_ctx;
    cp.n_batch = o.n_batch;
    cp.n_threads = o.n_threads;
    cp.pin_threads = o.pin;
    if ((st = nm_ctx_create(S.m, &cp, &S.c, err, sizeof err)) != NM_OK) {
        fprintf(stderr, "error: cannot create context: %s: %s\n", nm_status_str(st), err);
        goto done;
    }
    t_load = cli_now() - t_load;
    S.n_batch = o.n_batch > 0 ? o.n_batch : 512;
    S.toks = malloc(sizeof(int32_t) * (size_t)nm_ctx_n_ctx(S.c));
    S.s = nm_sampler_create(&o.sp, nm_model_n_vocab(S.m));
    if (!S.toks || !S.s) {
        fprintf(stderr, "error: out of memory\n");
        goto done;
    }
    if (o.stats) {
        char desc[256];
        nm_model_desc(S.m, desc, sizeof desc);
        fprintf(stderr, "model: %s\n", desc);
    }

    int32_t *tok_buf = NULL, tok_cap = 0;
    if (!o.chat) {
        // plain completion: the prompt is printed, then continued
        int32_t n = tokenize_all(S.m, o.prompt, &tok_buf, &tok_cap);
        if (n <= 0) {
            fprintf(stderr, "error: the prompt gives no tokens\n");
            goto done_tok;
        }
        if (n >= nm_ctx_n_ctx(S.c)) {
            fprintf(stderr, "error: prompt of %d tokens does not fit the context of %d (-c)\n", n,
                    nm_ctx_n_ctx(S.c));
            goto done_tok;
        }
        fputs(o.prompt, stdout);
        if (!feed(&S, tok_buf, n) || !generate(&S, o.n_predict, NULL, 0)) goto done_tok;
        putchar('\n');
        rc = 0;
        goto done_tok;
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
            if (!fgets(line, sizeof line, stdin)) break;
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
        char *formatted = format_chat(S.m, o.chat_tmpl, msgs, n_msgs);
        if (!formatted) goto done_chat;
        bool ok = prompt_turn(&S, &o, formatted, &tok_buf, &tok_cap);
        free(formatted);
        if (!ok) goto done_chat;
        char *answer = malloc(65536);
        if (!answer || !generate(&S, o.n_predict, answer, 65536)) {
            free(answer);
            goto done_chat;
        }
        putchar('\n');
        fflush(stdout);
        owned[n_owned++] = answer;
        msgs[n_msgs++] = (nm_chat_msg){"assistant", answer};
        if (!interactive) break;
    }
    rc = 0;
done_chat:
    for (size_t i = 0; i < n_owned; i++) free(owned[i]);
done_tok:
    free(tok_buf);
    if (o.stats) {
        fprintf(stderr, "load: %.2f s\n", t_load);
        fprintf(stderr, "prompt: %d tokens in %.3f s (%.2f tok/s)\n", S.n_prompt, S.t_prompt,
                S.t_prompt > 0 ? S.n_prompt / S.t_prompt : 0.0);
        fprintf(stderr, "generation: %d tokens in %.3f s (%.2f tok/s)\n", S.n_gen, S.t_gen,
                S.t_gen > 0 ? S.n_gen / S.t_gen : 0.0);
        long anon, file;
        fprintf(stderr, "peak RSS: %.1f MiB\n", cli_peak_rss_kb() / 1024.0);
        if (cli_rss_split(&anon, &file))
            fprintf(stderr, "RSS now: %.1f MiB mapped from the model file (weights, not copied) + %.1f MiB allocated\n",
                    file / 1024.0, anon / 1024.0);
    }
done:
    nm_sampler_free(S.s);
    free(S.toks);
    nm_ctx_free(S.c);
    nm_model_free(S.m);
    free(file_prompt);
    return rc;
}
