// nanomind bench: prompt and generation throughput, peak memory, and the
// decode roofline (memory bandwidth / bytes read per generated token); with
// --mmproj, the vision encoder's time per image on its own.
//
// Measured like llama-bench: pp = one batch of p tokens decoded from an empty
// context; tg = n tokens decoded one at a time from an empty context. Each
// repetition starts over; mean and standard deviation over the repetitions.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void bench_usage(void) {
    printf("usage: nanomind bench -m MODEL [-p 128] [-n 64] [-t N] [-r REPS] [--json | -o json]\n"
           "       nanomind bench --mmproj MMPROJ [-t N] [-r REPS] [--json | -o json]\n"
           "\n"
           "  -p N      prompt tokens decoded as one batch (0: skip)\n"
           "  -n N      tokens generated one at a time (0: skip)\n"
           "  -t N      threads (default: all cores)\n"
           "  --pin     pin thread i to core i\n"
           "  -r N      repetitions (default 5)\n"
           "  --json, -o json\n"
           "            one JSON object: pp_tps, tg_tps, peak_rss_bytes (the model's run), process_peak_rss_bytes\n"
           "            (with the bandwidth probe's buffer), roofline_pct and details\n"
           "            (-o jsonl: the same, as llama-bench's one object per line)\n"
           "  --mmproj F time the vision encoder + projector of F (llama.cpp's mmproj GGUF) instead: an\n"
           "            image of its input size per repetition through the vision brick, after one warm-up;\n"
           "            the time per encoder run (idefics3 cuts even that image into tiles and an overview),\n"
           "            which does not depend on the pixels; nothing else runs meanwhile (in `run` the LLM\n"
           "            prefills the text before the image at the same time). JSON: encode_ms, encode_ms_sd,\n"
           "            n_tokens, runs_per_image\n"
           "  -h, --help, --version\n"
           "Model and device:\n" CLI_HELP_MODEL
           "\n"
           "The roofline: memory bandwidth measured by a STREAM-style read probe over all threads,\n"
           "divided by the bytes a decode step reads (weights + the KV cache at the mean position).\n");
}

// The CPU, its features and the kernels chosen for them (quantized dots and
// GEMV; the f32 GEMM of prefill and the encoders), for the record: the three
// fields of nm_system_info.
static void what_ran(char *cpu, size_t cpu_size, char *feats, size_t feats_size, char *kern, size_t kern_size) {
    char info[640];
    nm_system_info(info, sizeof info);
    char *f = strstr(info, " | "), *k = f ? strstr(f + 3, " | ") : NULL;
    if (f) *f = '\0';
    if (k) *k = '\0';
    snprintf(cpu, cpu_size, "%.*s", (int)(cpu_size - 1), info);
    snprintf(feats, feats_size, "%.*s", (int)(feats_size - 1), f ? f + 3 : "");
    snprintf(kern, kern_size, "%.*s", (int)(kern_size - 1), k ? k + 3 : "");
    for (char *q = cpu; *q; q++)
        if (*q == '"' || *q == '\\' || (unsigned char)*q < 0x20) *q = ' '; // a JSON string as it is
}

static void json_str(const char *s) { // a path as a JSON string
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20) printf("\\u%04x", (unsigned char)*s);
        else putchar(*s);
    }
    putchar('"');
}

static void mean_sd(const double *v, int n, double *mean, double *sd);

// A PPM image (P6) of w x h pixels into buf (cap bytes); returns its size, 0 if it does not fit.
static size_t make_ppm(uint8_t *buf, size_t cap, int w, int h) {
    int k = snprintf((char *)buf, cap, "P6\n%d %d\n255\n", w, h);
    if (k < 0 || (size_t)k + 3ull * (size_t)w * (size_t)h > cap) return 0;
    for (size_t i = 0; i < 3ull * (size_t)w * (size_t)h; i++) buf[k + i] = (uint8_t)((i * 7919u) % 255u); // any image
    return (size_t)k + 3ull * (size_t)w * (size_t)h;
}

// bench --mmproj: a pipeline of the vision brick alone (feeding no LLM), an
// image of its input size per request, reps requests after a warm-up; the
// time per encoder run is the brick's own count (idefics3 cuts even that
// image into tiles and an overview: several runs a request).
static int bench_vision(const cli_opts *o, long reps, bool json) {
    char err[512];
    nm_brick_params p = nm_brick_default_params(NM_BRICK_VISION);
    p.model = o->mmproj;
    p.device = o->mmproj_device ? o->mmproj_device : o->device;
    p.n_threads = o->n_threads;
    nm_pipeline_params pp = nm_pipeline_default_params();
    pp.vision = &p;
    nm_pipeline *P = NULL;
    nm_status st = nm_pipeline_create(&pp, &P, err, sizeof err);
    if (st != NM_OK) {
        cli_load_error(o->mmproj, st, strncmp(err, "vision: ", 8) ? err : err + 8, CLI_WANT_MMPROJ);
        return 1;
    }
    nm_vision_info in;
    nm_brick_vision_info(nm_pipeline_brick(P, NM_BRICK_VISION), &in);
    const size_t cap = 64 + 3ull * (size_t)in.image_size * (size_t)in.image_size;
    double *ms = calloc((size_t)reps, sizeof(double));
    uint8_t *img = malloc(cap);
    int rc = 1;
    const size_t n = img ? make_ppm(img, cap, in.image_size, in.image_size) : 0;
    if (!ms || n == 0) {
        fprintf(stderr, "error: out of memory\n");
        goto done;
    }
    const nm_pipeline_image image = {.bytes = img, .n_bytes = n};
    int64_t runs_per = 0, n_tok = 0; // encoder runs an image takes, embeddings one run gives
    for (long r = -1; r < reps; r++) {
        nm_pipeline_brick_report before, after;
        nm_pipeline_brick_stats(P, NM_BRICK_VISION, &before);
        if ((st = nm_pipeline_submit(P, &(nm_pipeline_input){.images = &image, .n_images = 1}, NULL, err,
                                     sizeof err)) != NM_OK) {
            fprintf(stderr, "error: %s\n", err);
            goto done;
        }
        int64_t rows = 0; // the embeddings, each run's an event
        nm_pipeline_event ev;
        while ((st = nm_pipeline_read(P, -1, &ev)) == NM_OK && ev.kind != NM_PIPELINE_DONE) rows += ev.n_rows;
        if (st != NM_OK || ev.status != NM_OK) {
            fprintf(stderr, "error: encode failed: %s\n", st != NM_OK ? nm_status_str(st) : ev.text);
            goto done;
        }
        nm_pipeline_brick_stats(P, NM_BRICK_VISION, &after);
        runs_per = (int64_t)(after.s.n_encoded - before.s.n_encoded);
        n_tok = runs_per > 0 ? rows / runs_per : rows;
        if (r >= 0) ms[r] = 1e3 * (after.s.t_encode - before.s.t_encode) / (double)(runs_per > 0 ? runs_per : 1);
    }
    double m = 0, sd = 0;
    mean_sd(ms, (int)reps, &m, &sd);
    char cpu[128], feats[256], kern[160];
    what_ran(cpu, sizeof cpu, feats, sizeof feats, kern, sizeof kern);
    const int threads = o->n_threads > 0 ? o->n_threads : nm_cpu_count();
    // qwen2vl_merger: the image is resized within its token limits, its patches four a token
    const int n_patches = !strcmp(in.projector, "qwen2vl_merger") ? (int)n_tok * 4 : (int)in.n_patches;
    if (json) {
        printf("{\"cpu\": \"%s\", \"cpu_features\": \"%s\", \"kernels\": \"%s\", \"mmproj\": ", cpu, feats, kern);
        json_str(o->mmproj);
        printf(", \"threads\": %d, \"reps\": %d, \"image_size\": %d, \"n_patches\": %d, \"n_tokens\": %d, "
               "\"runs_per_image\": %d, \"encode_ms\": %.3f, \"encode_ms_sd\": %.3f}\n",
               threads, (int)reps, (int)in.image_size, n_patches, (int)n_tok, (int)runs_per, m, sd);
    } else {
        printf("vision encoder: %d px, %d patches, %d layers run -> %d embeddings of %d\n", (int)in.image_size,
               n_patches, (int)in.n_layer_run, (int)n_tok, (int)in.n_out_embd);
        printf("threads: %d, repetitions: %d\ncpu: %s (%s)\nkernels: %s\n", threads, (int)reps, cpu, feats, kern);
        printf("encode %10.2f ± %.2f ms per encoder run (%d a request)\n", m, sd, (int)runs_per);
    }
    rc = 0;
done:
    free(ms);
    free(img);
    nm_pipeline_free(P);
    return rc;
}

static void mean_sd(const double *v, int n, double *mean, double *sd) {
    double s = 0, s2 = 0;
    for (int i = 0; i < n; i++) s += v[i];
    *mean = s / n;
    for (int i = 0; i < n; i++) s2 += (v[i] - *mean) * (v[i] - *mean);
    *sd = n > 1 ? sqrt(s2 / (n - 1)) : 0.0;
}

int cmd_bench(int argc, char **argv) {
    bool json = false;
    long reps = 5, n_pp = 128, n_tg = 64;
    char **args = malloc(sizeof(char *) * (size_t)(argc + 1));
    int n_args = 0;
    if (!args) return 1;
    // -p and -n are token counts here (llama-bench's meaning), not a prompt
    for (int i = 0; i < argc; i++) {
        long *dst = !strcmp(argv[i], "-r") ? &reps : !strcmp(argv[i], "-p") ? &n_pp : !strcmp(argv[i], "-n") ? &n_tg : NULL;
        if (!strcmp(argv[i], "--json")) {
            json = true;
        } else if (!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output")) { // llama-bench's -o FORMAT
            const char *f = i + 1 < argc ? argv[i + 1] : NULL;
            if (!f || (strcmp(f, "json") && strcmp(f, "jsonl"))) {
                fprintf(stderr, "error: %s needs an output format: json or jsonl (without it: text), got '%s'\n",
                        argv[i], f ? f : "");
                free(args);
                return 2;
            }
            json = true;
            i++;
        } else if (dst) {
            char *end = NULL;
            *dst = i + 1 < argc ? strtol(argv[i + 1], &end, 10) : -1;
            if (!end || *end || *dst < 0 || *dst > 65536) {
                fprintf(stderr, "error: %s needs a count in [0, 65536]\n", argv[i]);
                free(args);
                return 2;
            }
            i++;
        } else {
            args[n_args++] = argv[i];
        }
    }
    cli_opts o;
    bool ok = cli_parse("bench", CLI_MPATH | CLI_MODEL | CLI_VISION, n_args, args, &o, NULL);
    free(args);
    if (!ok) return 2;
    if (o.help) {
        bench_usage();
        return 0;
    }
    if (o.version) {
        cli_print_version();
        return 0;
    }
    if (o.n_images > 0) {
        fprintf(stderr, "error: bench --mmproj times the encoder on its own input size: it takes no --image\n");
        return 2;
    }
    if (o.mmproj && o.model) {
        fprintf(stderr, "error: bench takes -m MODEL or --mmproj MMPROJ, one at a time\n");
        return 2;
    }
    if (o.mmproj && reps >= 1) return bench_vision(&o, reps, json);
    if (!o.model || reps < 1 || (n_pp == 0 && n_tg == 0)) {
        fprintf(stderr, "error: need -m MODEL, -r >= 1, and -p or -n > 0 (see nanomind bench --help)\n");
        return 2;
    }

    char err[512];
    nm_model *m = NULL;
    nm_ctx *c = NULL;
    nm_model_params mp = nm_model_default_params();
    mp.n_threads = o.n_threads;
    mp.no_mmap = o.no_mmap;
    nm_status st = nm_model_load(o.model, &mp, &m, err, sizeof err);
    if (st != NM_OK) {
        cli_load_error(o.model, st, err, CLI_WANT_LLM);
        return 1;
    }
    cli_mlock(&o);
    const int32_t n_ctx = (int32_t)(n_pp > n_tg ? n_pp : n_tg) + 8;
    nm_ctx_params cp = nm_ctx_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = n_pp > 0 ? (int32_t)n_pp : 1;
    cp.n_threads = o.n_threads;
    cp.pin_threads = o.pin;
    cp.device = o.device;
    cp.n_gpu_layers = o.n_gpu_layers;
    int rc = 1;
    double *pp = calloc((size_t)reps, sizeof(double)), *tg = calloc((size_t)reps, sizeof(double));
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)(n_pp > 1 ? n_pp : 1));
    if (!pp || !tg || !toks || (st = nm_ctx_create(m, &cp, &c, err, sizeof err)) != NM_OK) {
        fprintf(stderr, "error: cannot create context: %s\n", st != NM_OK ? err : "out of memory");
        goto done;
    }
    cli_ctx_note(c);
    const int32_t nv = nm_model_n_vocab(m);
    for (int32_t i = 0; i < (n_pp > 1 ? (int32_t)n_pp : 1); i++) toks[i] = (int32_t)((i * 7919u + 17u) % (uint32_t)nv);
    int threads = o.n_threads > 0 ? o.n_threads : nm_cpu_count();

    // warm-up: fault the weights in, spin the pool up
    if (nm_decode(c, toks, 1, 0, false) != NM_OK) goto decode_fail;
    for (int r = 0; r < reps; r++) {
        if (n_pp > 0) {
            double t0 = cli_now();
            if (nm_decode(c, toks, (int32_t)n_pp, 0, false) != NM_OK) goto decode_fail;
            pp[r] = n_pp / (cli_now() - t0);
        }
        if (n_tg > 0) {
            int32_t t = toks[0];
            double t0 = cli_now();
            for (int32_t i = 0; i < (int32_t)n_tg; i++) {
                if (nm_decode(c, &t, 1, i, false) != NM_OK) goto decode_fail;
                t = (t + 1) % nv; // the token does not change the cost
            }
            tg[r] = n_tg / (cli_now() - t0);
        }
    }
    double pp_m = 0, pp_sd = 0, tg_m = 0, tg_sd = 0;
    if (n_pp > 0) mean_sd(pp, (int)reps, &pp_m, &pp_sd);
    if (n_tg > 0) mean_sd(tg, (int)reps, &tg_m, &tg_sd);
    // The model's peak is taken before the bandwidth probe allocates its buffer;
    // the process's peak (what /usr/bin/time reports) includes that buffer.
    const long rss = cli_peak_rss_kb() * 1024;
    // the roofline of the unit that decodes: the CPU's probe, or the device's read kernel
    double bw = 0.0;
    const char *dev = nm_ctx_device(c);
    if (strcmp(dev, "cpu") != 0) {
        nm_device_info d[17];
        const int32_t nd = nm_list_devices(d, 17, true);
        const char *want = o.device && strchr(o.device, ':') ? o.device : "opencl:0";
        for (int32_t i = 0; i < nd && i < 17; i++)
            if (!strcmp(d[i].name, want)) bw = d[i].read_gbps * 1e9;
    } else {
        bw = nm_cpu_read_gbps(threads) * 1e9;
    }
    const long rss_process = cli_peak_rss_kb() * 1024;
    // bytes per generated token: weights + the KV cache at the mean position of tg
    const double bytes_tok =
        (double)nm_model_decode_weight_bytes(m) + (double)nm_model_kv_bytes_per_pos(m) * (n_tg / 2.0);
    const double roof = bw > 0 ? bw / bytes_tok : 0.0, pct = roof > 0 ? 100.0 * tg_m / roof : 0.0;
    char cpu[128], feats[256], kern[160];
    what_ran(cpu, sizeof cpu, feats, sizeof feats, kern, sizeof kern);
    if (json) {
        printf("{\"cpu\": \"%s\", \"cpu_features\": \"%s\", \"kernels\": \"%s\", \"device\": \"%s\", \"device_layers\": %d, ",
               cpu, feats, kern, dev, nm_ctx_device_layers(c));
        printf("\"model\": \"%s\", \"arch\": \"%s\", \"threads\": %d, \"n_prompt\": %d, \"n_gen\": %d, \"reps\": %d, "
               "\"pp_tps\": %.3f, \"pp_tps_sd\": %.3f, \"tg_tps\": %.3f, \"tg_tps_sd\": %.3f, "
               "\"peak_rss_bytes\": %ld, \"process_peak_rss_bytes\": %ld, \"mem_bw_bytes_per_s\": %.0f, "
               "\"bytes_per_token\": %.0f, \"roofline_tps\": %.3f, \"roofline_pct\": %.2f}\n",
               o.model, nm_model_arch(m), threads, (int)n_pp, (int)n_tg, (int)reps, pp_m, pp_sd, tg_m, tg_sd, rss,
               rss_process, bw, bytes_tok, roof, pct);
    } else {
        char desc[256];
        nm_model_desc(m, desc, sizeof desc);
        printf("model: %s\nthreads: %d, repetitions: %d\n", desc, threads, (int)reps);
        printf("cpu: %s (%s)\nkernels: %s\n", cpu, feats, kern);
        if (strcmp(dev, "cpu") != 0) printf("device: %s, %d layers there\n", o.device ? o.device : dev, nm_ctx_device_layers(c));
        if (n_pp > 0) printf("pp%-4d %10.2f ± %.2f tok/s\n", (int)n_pp, pp_m, pp_sd);
        if (n_tg > 0) printf("tg%-4d %10.2f ± %.2f tok/s\n", (int)n_tg, tg_m, tg_sd);
        printf("peak RSS: %.1f MiB (the model's run; with the bandwidth probe's buffer, as /usr/bin/time sees the "
               "process: %.1f MiB)\n", rss / 1048576.0, rss_process / 1048576.0);
        printf("memory bandwidth (read probe%s): %.2f GB/s; bytes per generated token: %.1f MiB\n",
               strcmp(dev, "cpu") ? ", the device's" : "", bw / 1e9,
               bytes_tok / 1048576.0);
        printf("decode roofline: %.1f tok/s; achieved %.1f%%\n", roof, pct);
    }
    rc = 0;
    goto done;
decode_fail:
    fprintf(stderr, "error: decode failed: %s\n", nm_ctx_last_error(c));
done:
    free(pp);
    free(tg);
    free(toks);
    nm_ctx_free(c);
    nm_model_free(m);
    return rc;
}
