// nanomind assistant: the figures at the end of a run (docs/cli.md, docs/power.md):
// --stats per question and per brick, the copy ledger, the peak RSS and the
// energy (modelled, and measured where a meter exists); --json FILE.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "assistant.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

// The median, min and max of the n values of v (sorted in place).
static void spread(const char *what, double *v, int n) {
    if (n == 0) return;
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    fprintf(stderr, "end of question -> %s: median %.3f s, min %.3f s, max %.3f s\n", what, v[n / 2], v[0], v[n - 1]);
}

static long peak_rss_kb(const app *A) {
    long peak = cli_peak_rss_kb(); // (the cascade's resets of VmHWM reset this too: its stages' peaks count)
    for (int k = 0; k < 4; k++) peak = A->stage_peak_kb[k] > peak ? A->stage_peak_kb[k] : peak;
    return peak;
}

typedef struct device_use {
    const char *source; // the profile's unit (cli_energy_device's source)
    double busy, idle_w, active_w;
} device_use;

// The run's energy, at its end: modelled for each brick (its busy threads and
// its traffic, over idle; a brick on a device whose watts the profile knows:
// its busy time at that device's watts) and for the run (the process's CPU
// time and all the traffic, idle included, plus each such device's busy and
// idle time); measured by each meter the machine has.
void assistant_energy_end(app *A, double wall) {
    energy_report *E = &A->energy; // E->model: cli_energy_load's, at the start
    E->cpu_s = cli_cpu_seconds() - A->cpu0;
    E->dram = 0;
    // the devices the bricks ran on: each busy its bricks' seconds, idle the rest of the run (once a device)
    device_use dev_use[4];
    int n_dev = 0;
    for (int k = 0; k < 4; k++) {
        cli_energy dev;
        E->brick_on_device[k] = A->acc[k].name[0] && cli_energy_device(&E->model, A->acc[k].device, &dev);
        if (E->brick_on_device[k]) {
            E->brick_j[k] = cli_energy_work(&dev, A->acc[k].busy, A->dram[k]);
            snprintf(E->brick_source[k], sizeof E->brick_source[k], "%s", dev.source);
            int d = 0;
            while (d < n_dev && strcmp(dev_use[d].source, E->brick_source[k])) d++;
            if (d == n_dev) dev_use[n_dev++] = (device_use){E->brick_source[k], 0, dev.idle_w, dev.active_w};
            dev_use[d].busy += A->acc[k].busy;
        } else {
            E->brick_j[k] = cli_energy_work(&E->model, A->acc[k].thread_s, A->dram[k]);
        }
        E->dram += A->dram[k];
    }
    E->run_j = cli_energy_run(&E->model, E->cpu_s, wall, E->dram);
    for (int d = 0; d < n_dev; d++) {
        const double busy = dev_use[d].busy < wall ? dev_use[d].busy : wall;
        E->run_j += busy * dev_use[d].active_w + (wall - busy) * dev_use[d].idle_w;
    }
    char err[256];
    if (A->meters && nm_energy_meters_stop(A->meters, &E->measured, err, sizeof err) != NM_OK) {
        fprintf(stderr, "energy meters: %s\n", err);
        E->measured.n = 0;
    }
}

// A brick's threads over its busy time (the battery's policy may have changed them between loads).
static double avg_threads(const app *A, int k) {
    return A->acc[k].busy > 0 ? A->acc[k].thread_s / A->acc[k].busy : A->acc[k].threads;
}

static void json_time(cJSON *o, const char *key, double t, double t0) {
    cJSON_AddNumberToObject(o, key, t > 0 ? t - t0 : 0);
}

// --json FILE: the questions, the bricks and the energy as one object.
bool assistant_write_json(app *A, double wall) {
    const energy_report *E = &A->energy;
    cJSON *root = cJSON_CreateObject(), *qs = cJSON_AddArrayToObject(root, "questions");
    for (int i = 0; i < A->n_items; i++) {
        const item *it = &A->items[i];
        cJSON *q = cJSON_CreateObject();
        cJSON_AddItemToArray(qs, q);
        cJSON_AddStringToObject(q, "question", it->question);
        cJSON_AddNumberToObject(q, "start_s", it->t_start);
        json_time(q, "heard_s", it->t_heard, it->t_start);
        json_time(q, "first_token_s", it->t_first_tok, it->t_start);
        json_time(q, "answered_s", it->t_answered, it->t_start);
        json_time(q, "first_audio_s", it->t_first_audio, it->t_start);
        json_time(q, "spoken_s", it->t_spoken, it->t_start);
        cJSON_AddNumberToObject(q, "prompt_tokens", it->n_prompt);
        cJSON_AddNumberToObject(q, "tokens", it->n_tokens);
        cJSON_AddNumberToObject(q, "samples", (double)it->n_samples);
        cJSON_AddBoolToObject(q, "failed", it->failed);
        if (it->skipped) cJSON_AddStringToObject(q, "skipped", it->skipped);
        else cJSON_AddNullToObject(q, "skipped");
    }
    cJSON *bs = cJSON_AddArrayToObject(root, "bricks");
    for (int k = 0; k < 4; k++) {
        if (!A->acc[k].name[0]) continue;
        cJSON *b = cJSON_CreateObject();
        cJSON_AddItemToArray(bs, b);
        cJSON_AddStringToObject(b, "name", A->acc[k].name);
        cJSON_AddStringToObject(b, "device", A->acc[k].device);
        cJSON_AddNumberToObject(b, "requests", (double)A->acc[k].n);
        cJSON_AddNumberToObject(b, "busy_s", A->acc[k].busy);
        cJSON_AddNumberToObject(b, "threads", avg_threads(A, k));
        cJSON_AddNumberToObject(b, "dram_bytes", A->dram[k]);
        cJSON_AddNumberToObject(b, "joules", E->brick_j[k]);
        cJSON_AddStringToObject(b, "energy", "modelled");
        cJSON_AddStringToObject(b, "watts_from", E->brick_on_device[k] ? E->brick_source[k] : E->model.source);
    }
    cJSON *run = cJSON_AddObjectToObject(root, "run");
    cJSON_AddNumberToObject(run, "questions", A->n_items);
    cJSON_AddStringToObject(run, "mode", A->n_cascaded == A->n_items ? "cascade" : A->n_cascaded > 0 ? "mixed"
                                         : A->sequential ? "sequential" : "pipelined");
    cJSON_AddNumberToObject(run, "wall_s", wall);
    cJSON_AddNumberToObject(run, "cpu_s", E->cpu_s);
    cJSON_AddNumberToObject(run, "dram_bytes", E->dram);
    cJSON_AddNumberToObject(run, "peak_rss_mib", peak_rss_kb(A) / 1024.0);
    cJSON_AddNumberToObject(run, "copied_bytes", (double)nm_ledger_total(A->ledger));
    cJSON *en = cJSON_AddArrayToObject(run, "energy");
    cJSON *mo = cJSON_CreateObject();
    cJSON_AddItemToArray(en, mo);
    cJSON_AddStringToObject(mo, "source", "model");
    cJSON_AddStringToObject(mo, "energy", "modelled");
    cJSON_AddNumberToObject(mo, "joules", E->run_j);
    cJSON_AddNumberToObject(mo, "joules_per_question", A->n_items ? E->run_j / A->n_items : 0);
    cJSON_AddNumberToObject(mo, "idle_w", E->model.idle_w);
    cJSON_AddNumberToObject(mo, "active_w", E->model.active_w);
    cJSON_AddNumberToObject(mo, "cores", E->model.n_cores);
    cJSON_AddStringToObject(mo, "watts_from", E->model.source);
    cJSON_AddNumberToObject(mo, "pj_byte", E->model.pj_byte > 0 ? E->model.pj_byte : 80);
    for (int32_t m = 0; m < E->measured.n; m++) {
        cJSON *me = cJSON_CreateObject();
        cJSON_AddItemToArray(en, me);
        cJSON_AddStringToObject(me, "source", E->measured.name[m]);
        cJSON_AddStringToObject(me, "energy", "measured");
        cJSON_AddNumberToObject(me, "joules", E->measured.joules[m]);
        cJSON_AddNumberToObject(me, "joules_per_question", A->n_items ? E->measured.joules[m] / A->n_items : 0);
        cJSON_AddNumberToObject(me, "seconds", E->measured.seconds);
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    nm_outfile f = {0};
    char err[512] = "";
    bool ok = text && nm_outfile_open(&f, A->json_path, err, sizeof err) == NM_OK;
    if (ok && (fputs(text, f.f) == EOF || fputc('\n', f.f) == EOF)) {
        nm_outfile_abort(&f);
        snprintf(err, sizeof err, "%s", strerror(errno));
        ok = false;
    } else if (ok) {
        ok = nm_outfile_commit(&f, err, sizeof err) == NM_OK;
    }
    if (!ok) fprintf(stderr, "error: --json %s: %s\n", A->json_path, err[0] ? err : "out of memory");
    free(text);
    return ok;
}

void assistant_print_stats(app *A, double wall) {
    double *first_audio = calloc((size_t)A->n_items, sizeof(double));
    double *done = calloc((size_t)A->n_items, sizeof(double));
    int n_fa = 0, n_done = 0;
    for (int i = 0; i < A->n_items; i++) {
        const item *it = &A->items[i];
        if (it->skipped && it->t_heard == 0) { // (a frame that did not change: nothing ran)
            fprintf(stderr, "question %d: not asked (%s)\n", i + 1, it->skipped);
            continue;
        }
        fprintf(stderr, "question %d (at %.3f s): from its end: heard %.3f s, first token %.3f s, last token %.3f s",
                i + 1, it->t_start, it->t_heard - it->t_start, it->t_first_tok > 0 ? it->t_first_tok - it->t_start : 0.0,
                it->t_answered - it->t_start);
        if (A->tts_rate > 0)
            fprintf(stderr, ", first audio %.3f s, spoken %.3f s (%.2f s of speech)",
                    it->t_first_audio > 0 ? it->t_first_audio - it->t_start : 0.0, it->t_spoken - it->t_start,
                    (double)it->n_samples / A->tts_rate);
        fprintf(stderr, "; %d tokens%s%s%s%s\n", it->n_tokens, it->failed ? " (failed)" : "",
                it->skipped ? " (not answered: " : "", it->skipped ? it->skipped : "", it->skipped ? ")" : "");
        if (first_audio && it->t_first_audio > 0) first_audio[n_fa++] = it->t_first_audio - it->t_start;
        if (done && !it->failed && !it->skipped) done[n_done++] = (A->tts_rate > 0 ? it->t_spoken : it->t_answered) - it->t_start;
    }
    fprintf(stderr, "%d questions in %.3f s: %.3f questions/s (%s)\n", A->n_items, wall, A->n_items / wall,
            A->n_cascaded == A->n_items ? "cascade" : A->n_cascaded > 0 ? "pipelined and cascade"
            : A->sequential ? "sequential" : "pipelined");
    if (first_audio) spread("first audio sample", first_audio, n_fa);
    if (done) spread(A->tts_rate > 0 ? "answer spoken" : "answer written", done, n_done);
    free(first_audio);
    free(done);
    for (int k = 0; k < 4; k++) {
        if (!A->acc[k].name[0]) continue;
        fprintf(stderr, "%s brick (%s): %llu requests, busy %.3f s (%.0f%% of the run)\n", A->acc[k].name,
                A->acc[k].device, (unsigned long long)A->acc[k].n, A->acc[k].busy, 100.0 * A->acc[k].busy / wall);
    }
    if (A->n_cascaded > 0)
        fprintf(stderr, "cascade: %d of %d questions, each brick loaded, run and released in turn; peak RSS by stage: "
                        "whisper %.1f MiB, vision %.1f MiB, decoder %.1f MiB, voice %.1f MiB\n",
                A->n_cascaded, A->n_items, A->stage_peak_kb[0] / 1024.0, A->stage_peak_kb[1] / 1024.0,
                A->stage_peak_kb[2] / 1024.0, A->stage_peak_kb[3] / 1024.0);
    const int ep_eng = nm_ledger_endpoint(A->ledger, "espeak-ng"), ep_tts = nm_ledger_endpoint(A->ledger, "tts");
    const uint64_t mic = A->mic_dev ? nm_ledger_bytes(A->ledger, A->ep_mic, A->ep_stt) : 0;
    const uint64_t heard = A->stt_model ? nm_ledger_bytes(A->ledger, A->ep_stt, A->ep_llm) : 0;
    const uint64_t engine = nm_ledger_bytes(A->ledger, ep_tts, ep_eng) + nm_ledger_bytes(A->ledger, ep_eng, ep_tts);
    const uint64_t total = nm_ledger_total(A->ledger);
    fprintf(stderr, "ledger: %llu bytes copied (%llu copies): the microphone's audio into the STT slots %llu, the "
                    "transcripts into the chats %llu, espeak-ng's text and samples %llu, anything else %llu\n",
            (unsigned long long)total, (unsigned long long)nm_ledger_copies(A->ledger, -1, -1), (unsigned long long)mic,
            (unsigned long long)heard, (unsigned long long)engine, (unsigned long long)(total - mic - heard - engine));
    fprintf(stderr, "peak RSS: %.1f MiB\n", peak_rss_kb(A) / 1024.0);
    const energy_report *E = &A->energy;
    fprintf(stderr, "energy (modelled: %.2f W idle, %.2f W with all %d cores busy, from %s; %.0f pJ a DRAM byte; "
                    "docs/power.md):\n",
            E->model.idle_w, E->model.active_w, E->model.n_cores, E->model.source,
            E->model.pj_byte > 0 ? E->model.pj_byte : 80.0);
    for (int k = 0; k < 4; k++) {
        if (!A->acc[k].name[0]) continue;
        if (E->brick_on_device[k])
            fprintf(stderr, "  %s brick: %.3f s busy on %s, %.1f MB streamed: %.3f J over idle (modelled: %s)\n",
                    A->acc[k].name, A->acc[k].busy, A->acc[k].device, A->dram[k] / 1e6, E->brick_j[k],
                    E->brick_source[k]);
        else
            fprintf(stderr, "  %s brick: %.3f s busy x %.3g threads, %.1f MB streamed: %.3f J over idle (modelled)\n",
                    A->acc[k].name, A->acc[k].busy, avg_threads(A, k), A->dram[k] / 1e6, E->brick_j[k]);
    }
    fprintf(stderr, "  the run: %.3f CPU-s in %.3f s, %.1f MB streamed: %.3f J (modelled), %.3f J a question\n",
            E->cpu_s, wall, E->dram / 1e6, E->run_j, A->n_items ? E->run_j / A->n_items : 0.0);
    for (int32_t m = 0; m < E->measured.n; m++)
        fprintf(stderr, "  %s: %.3f J in %.3f s (measured), %.3f J a question\n", E->measured.name[m],
                E->measured.joules[m], E->measured.seconds, A->n_items ? E->measured.joules[m] / A->n_items : 0.0);
    if (E->measured.n == 0) fprintf(stderr, "  no energy meter on this machine: modelled only\n");
}

