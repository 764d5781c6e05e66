// nanomind perplexity: perplexity of a model over a text, computed the way
// llama.cpp's perplexity tool does (chunks of n_ctx tokens, BOS at the start of
// each chunk where the model adds one, the second half of each chunk scored),
// so the two numbers are comparable. With --kl-divergence-base FILE it reads
// the log-probabilities llama.cpp saved with its own --kl-divergence-base flag
// and reports top-1 agreement, KL divergence and the largest log-prob
// difference against them.
#include <math.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void ppl_usage(void) {
    printf("usage: nanomind perplexity -m MODEL -f TEXT [-c N] [-b N] [-ub N] [-t N] [--pin]\n"
           "       nanomind perplexity -m MODEL --kl-divergence-base FILE\n"
           "\n"
           "  -f FILE                      text to score (UTF-8)\n"
           "  -c N                         chunk (context) size, default 512; the text needs >= 2 chunks\n"
           "  -b N                         tokens per forward pass, default min(c, 512)\n"
           "  -ub N                        at most N tokens per forward pass (as -b)\n"
           "  -t N                         threads (default, or -1: all cores)\n"
           "  --pin                        pin thread i to core i\n"
           "  -h, --help, --version\n"
           "  --kl-divergence-base FILE    compare with log-probs saved by llama.cpp's\n"
           "                               `llama-perplexity --kl-divergence-base FILE` on the same model:\n"
           "                               prints top-1 agreement, mean KL divergence, max |dlogp|\n"
           "Model and device:\n" CLI_HELP_MODEL);
}

typedef struct kl_stats {
    double sum_kld, max_dlogp, max_dp;
    long same_top, count;
    double nll_base;
} kl_stats;

// Negative log-likelihood of `tok` under logits; compares with a base row of
// llama.cpp's format (2 floats scale/min then n_vocab uint16) when given.
static double score_row(const float *logits, int32_t n_vocab, int32_t tok, const uint16_t *base, kl_stats *ks) {
    float mx = logits[0];
    int32_t imax = 0;
    for (int32_t i = 1; i < n_vocab; i++)
        if (logits[i] > mx) mx = logits[i], imax = i;
    double se = 0.0;
    for (int32_t i = 0; i < n_vocab; i++) se += exp((double)(logits[i] - mx));
    const double lse = mx + log(se);
    const double nll = lse - logits[tok];
    if (base) {
        float scale, minlp;
        memcpy(&scale, base, sizeof scale);
        memcpy(&minlp, base + 2, sizeof minlp);
        const uint16_t *q = base + 4;
        int32_t ibase = 0;
        float best = -INFINITY;
        double kld = 0.0;
        for (int32_t i = 0; i < n_vocab; i++) {
            float lb = scale * q[i] + minlp;
            if (lb > best) best = lb, ibase = i;
            if (lb > -16.0f) { // inside the 16-nat range the file resolves
                double lo = logits[i] - lse;
                kld += exp(lb) * (lb - lo);
                double d = fabs(lb - lo);
                if (d > ks->max_dlogp) ks->max_dlogp = d;
            }
        }
        const double nllb = -(scale * q[tok] + minlp);
        double dp = fabs(exp(-nll) - exp(-nllb));
        if (dp > ks->max_dp) ks->max_dp = dp;
        ks->nll_base += nllb;
        ks->sum_kld += kld;
        ks->same_top += imax == ibase;
        ks->count++;
    }
    return nll;
}

int cmd_perplexity(int argc, char **argv) {
    const char *kl_path = NULL;
    // pull out the one option only this command has
    char **args = malloc(sizeof(char *) * (size_t)(argc + 1));
    int n_args = 0;
    if (!args) return 1;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--kl-divergence-base")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "error: --kl-divergence-base needs a value\n");
                free(args);
                return 2;
            }
            kl_path = argv[++i];
        }
        else args[n_args++] = argv[i];
    }
    cli_opts o;
    bool ok = cli_parse("perplexity", CLI_MPATH | CLI_MODEL | CLI_CTX | CLI_FILE, n_args, args, &o, NULL);
    free(args);
    if (!ok) return 2;
    if (o.help) {
        ppl_usage();
        return 0;
    }
    if (o.version) {
        cli_print_version();
        return 0;
    }
    if (!o.model || (!o.file && !kl_path)) {
        fprintf(stderr, "error: need -m MODEL and -f TEXT (or --kl-divergence-base FILE)\n");
        return 2;
    }
    int rc = 1;
    char err[512];
    nm_model *m = NULL;
    nm_ctx *c = NULL;
    char *text = NULL;
    int32_t *toks = NULL, *chunk = NULL;
    FILE *kf = NULL;
    uint16_t *brow = NULL;
    nm_model_params mp = nm_model_default_params();
    mp.n_threads = o.n_threads;
    mp.no_mmap = o.no_mmap;
    nm_status st = nm_model_load(o.model, &mp, &m, err, sizeof err);
    if (st != NM_OK) {
        cli_load_error(o.model, st, err, CLI_WANT_LLM);
        return 1;
    }
    cli_mlock(&o);
    const int32_t n_vocab = nm_model_n_vocab(m);
    int32_t n_ctx = o.n_ctx > 0 ? o.n_ctx : o.n_ctx == 0 ? nm_model_n_ctx_train(m) : 512, n_tok = 0, n_chunk = 0;
    const size_t nv = 2 * (((size_t)n_vocab + 1) / 2) + 4; // uint16 per row in llama.cpp's file

    if (kl_path) {
        char magic[8], ferr[512];
        int32_t hdr[3];
        // (read a chunk at a time: its size is what its header says, checked below)
        if (nm_infile_open(kl_path, UINT64_MAX, 0, &kf, NULL, ferr, sizeof ferr) != NM_OK) {
            fprintf(stderr, "error: %s\n", ferr);
            goto done;
        }
        if (fread(magic, 1, 8, kf) != 8 || memcmp(magic, "_logits_", 8) || fread(hdr, 4, 3, kf) != 3) {
            fprintf(stderr, "error: %s is not a llama.cpp logits file\n", kl_path);
            goto done;
        }
        n_ctx = hdr[0];
        n_chunk = hdr[2];
        if (hdr[1] != n_vocab || n_ctx < 4 || n_ctx > (1 << 20) || n_chunk < 1 || n_chunk > (1 << 20)) {
            fprintf(stderr, "error: %s: n_ctx %d, n_vocab %d (model %d), n_chunk %d do not fit this model\n",
                    kl_path, hdr[0], hdr[1], n_vocab, hdr[2]);
            goto done;
        }
        if ((int64_t)n_ctx * n_chunk > (1 << 28)) {
            fprintf(stderr, "error: %s: %d chunks of %d tokens is not a plausible logits file\n", kl_path, n_chunk, n_ctx);
            goto done;
        }
        n_tok = n_ctx * n_chunk;
        toks = malloc(sizeof(int32_t) * (size_t)n_tok);
        brow = malloc(sizeof(uint16_t) * nv);
        if (!toks || !brow || fread(toks, 4, (size_t)n_tok, kf) != (size_t)n_tok) {
            fprintf(stderr, "error: %s: truncated token list\n", kl_path);
            goto done;
        }
    } else {
        size_t len;
        if (n_ctx < 4) {
            fprintf(stderr, "error: -c %d: a chunk needs at least 4 tokens (half of it is scored)\n", n_ctx);
            goto done;
        }
        char ferr[512];
        if (nm_infile_read(o.file, CLI_TEXT_FILE_MAX, NM_INFILE_STDIN | NM_INFILE_STREAM, &text, &len, ferr,
                           sizeof ferr) != NM_OK) {
            fprintf(stderr, "error: cannot read the text: %s\n", ferr);
            goto done;
        }
        n_tok = nm_tokenize(m, text, len, NULL, 0, true, false);
        if (n_tok < 0) n_tok = -n_tok;
        toks = malloc(sizeof(int32_t) * (size_t)(n_tok > 0 ? n_tok : 1));
        if (!toks || nm_tokenize(m, text, len, toks, n_tok, true, false) != n_tok) {
            fprintf(stderr, "error: tokenization failed\n");
            goto done;
        }
        n_chunk = n_tok / n_ctx;
        if (n_tok < 2 * n_ctx)
            fprintf(stderr, "warning: %d tokens is fewer than 2 x %d (llama.cpp refuses this)\n", n_tok, n_ctx);
        if (n_chunk < 1) {
            fprintf(stderr, "error: %d tokens do not fill one chunk of %d (%s)\n", n_tok, n_ctx,
                    o.n_ctx > 0 ? "-c" : "the default chunk size; a smaller one with -c");
            goto done;
        }
    }
    for (int32_t i = 0; i < n_tok; i++)
        if (toks[i] < 0 || toks[i] >= n_vocab) {
            fprintf(stderr, "error: token %d out of range\n", toks[i]);
            goto done;
        }
    int32_t n_batch = o.n_batch > 0 ? o.n_batch : (n_ctx < 512 ? n_ctx : 512);
    if (o.n_ubatch > 0 && n_batch > o.n_ubatch) n_batch = o.n_ubatch; // (each chunk from position 0: -ub is the batch)
    if (n_batch > n_ctx) n_batch = n_ctx;
    nm_ctx_params cp = nm_ctx_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = n_batch;
    cp.n_threads = o.n_threads;
    cp.pin_threads = o.pin;
    cp.device = o.device;
    cp.n_gpu_layers = o.n_gpu_layers;
    if ((st = nm_ctx_create(m, &cp, &c, err, sizeof err)) != NM_OK) {
        fprintf(stderr, "error: cannot create context: %s: %s\n", nm_status_str(st), err);
        goto done;
    }
    cli_ctx_note(c);
    chunk = malloc(sizeof(int32_t) * (size_t)n_ctx);
    if (!chunk) goto done;
    fprintf(stderr, "perplexity: %d tokens, %d chunks of %d, batch %d\n", n_tok, n_chunk, n_ctx, n_batch);

    // llama.cpp puts BOS at the start of every chunk when the model adds one.
    int32_t probe[4], bos = -1;
    if (nm_tokenize(m, "", 0, probe, 4, true, false) >= 1 && probe[0] == nm_token_bos(m)) bos = probe[0];
    const int32_t first = n_ctx / 2;
    double nll = 0.0, t0 = cli_now();
    long count = 0;
    kl_stats ks = {0};
    for (int32_t ch = 0; ch < n_chunk; ch++) {
        const int32_t *src = toks + (size_t)ch * n_ctx;
        memcpy(chunk, src, sizeof(int32_t) * (size_t)n_ctx);
        if (bos >= 0) chunk[0] = bos;
        for (int32_t b = 0; b < n_ctx; b += n_batch) {
            int32_t nb = n_ctx - b < n_batch ? n_ctx - b : n_batch;
            if ((st = nm_decode(c, chunk + b, nb, b, true)) != NM_OK) {
                fprintf(stderr, "error: decode: %s (%s)\n", nm_status_str(st), nm_ctx_last_error(c));
                goto done;
            }
            for (int32_t j = 0; j < nb; j++) {
                int32_t p = b + j;
                if (p < first || p >= n_ctx - 1) continue;
                if (kl_path && fread(brow, sizeof(uint16_t), nv, kf) != nv) {
                    fprintf(stderr, "error: %s: truncated log-prob rows\n", kl_path);
                    goto done;
                }
                nll += score_row(nm_get_logits(c, j), n_vocab, src[p + 1], kl_path ? brow : NULL, &ks);
                count++;
            }
        }
        fprintf(stderr, "[%d] %.4f\n", ch + 1, exp(nll / count));
    }
    printf("Final estimate: PPL = %.4f over %ld tokens (%d chunks of %d), %.2f s\n", exp(nll / count), count, n_chunk,
           n_ctx, cli_now() - t0);
    if (kl_path) {
        printf("base PPL (llama.cpp) = %.4f\n", exp(ks.nll_base / ks.count));
        printf("top-1 agreement: %.2f%% (%ld/%ld)\n", 100.0 * ks.same_top / ks.count, ks.same_top, ks.count);
        printf("mean KL divergence: %.6f\n", ks.sum_kld / ks.count);
        printf("max |dlogp| (tokens within 16 nats of the top): %.4f\n", ks.max_dlogp);
        printf("max |dp| of the scored token: %.4f\n", ks.max_dp);
    }
    rc = 0;
done:
    if (kf) fclose(kf);
    free(brow);
    free(chunk);
    free(toks);
    free(text);
    nm_ctx_free(c);
    nm_model_free(m);
    return rc;
}
