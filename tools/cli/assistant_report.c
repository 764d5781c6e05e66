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

// The bricks' reports, by nm_brick_kind: those in the graph.
#define KINDS for (int k = NM_BRICK_STT; k <= NM_BRICK_TTS; k++) if (A->rep[k].name[0])
#define NAME(k) (A->rep[k].name)
#define DEV(k) (A->rep[k].device)
#define BUSY(k) (A->rep[k].s.t_busy)

static double peak_rss_mib(const app *A) {
    double peak = cli_peak_rss_kb() / 1024.0; // (the cascade's resets of VmHWM reset this too: its stages' peaks count)
    for (int k = NM_BRICK_STT; k <= NM_BRICK_TTS; k++) peak = A->rep[k].stage_peak_mib > peak ? A->rep[k].stage_peak_mib : peak;
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
    device_use dev_use[5];
    int n_dev = 0;
    KINDS {
        cli_energy dev;
        E->brick_on_device[k] = cli_energy_device(&E->model, DEV(k), &dev);
        if (E->brick_on_device[k]) {
            E->brick_j[k] = cli_energy_work(&dev, BUSY(k), A->rep[k].dram_bytes);
            snprintf(E->brick_source[k], sizeof E->brick_source[k], "%s", dev.source);
            int d = 0;
            while (d < n_dev && strcmp(dev_use[d].source, E->brick_source[k])) d++;
            if (d == n_dev) dev_use[n_dev++] = (device_use){E->brick_source[k], 0, dev.idle_w, dev.active_w};
            dev_use[d].busy += BUSY(k);
        } else {
            E->brick_j[k] = cli_energy_work(&E->model, A->rep[k].thread_s, A->rep[k].dram_bytes);
        }
        E->dram += A->rep[k].dram_bytes;
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
static double avg_threads(const app *A, int k) { return BUSY(k) > 0 ? A->rep[k].thread_s / BUSY(k) : 0; }

// The questions' mode, as the run went.
static const char *mode_of(const app *A) {
    return A->n_cascaded == A->n_items && A->n_items > 0 ? "cascade" : A->n_cascaded > 0 ? "pipelined and cascade"
           : A->sequential ? "sequential" : "pipelined";
}

// Question it's stage at t (seconds from its submit; 0: the stage did not run), from its start.
static double from_start(const item *it, double t) { return t > 0 ? t - it->base : 0; }

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
        cJSON_AddNumberToObject(q, "heard_s", from_start(it, it->t.heard));
        cJSON_AddNumberToObject(q, "first_text_s", from_start(it, it->t.first_text));
        cJSON_AddNumberToObject(q, "answered_s", from_start(it, it->t.answered));
        cJSON_AddNumberToObject(q, "first_audio_s", from_start(it, it->t.first_audio));
        cJSON_AddNumberToObject(q, "spoken_s", from_start(it, it->t.spoken));
        cJSON_AddNumberToObject(q, "prompt_tokens", it->n_prompt);
        cJSON_AddNumberToObject(q, "tokens", it->n_tokens);
        cJSON_AddNumberToObject(q, "samples", (double)it->t.n_samples);
        cJSON_AddBoolToObject(q, "failed", it->failed);
        cJSON_AddBoolToObject(q, "cascade", it->cascade);
        if (it->skipped) cJSON_AddStringToObject(q, "skipped", it->why);
        else cJSON_AddNullToObject(q, "skipped");
    }
    cJSON *bs = cJSON_AddArrayToObject(root, "bricks");
    KINDS {
        cJSON *b = cJSON_CreateObject();
        cJSON_AddItemToArray(bs, b);
        cJSON_AddStringToObject(b, "name", NAME(k));
        cJSON_AddStringToObject(b, "device", DEV(k));
        cJSON_AddNumberToObject(b, "requests", (double)A->rep[k].s.n_requests);
        cJSON_AddNumberToObject(b, "busy_s", BUSY(k));
        cJSON_AddNumberToObject(b, "threads", avg_threads(A, k));
        cJSON_AddNumberToObject(b, "dram_bytes", A->rep[k].dram_bytes);
        cJSON_AddNumberToObject(b, "joules", E->brick_j[k]);
        cJSON_AddStringToObject(b, "energy", "modelled");
        cJSON_AddStringToObject(b, "watts_from", E->brick_on_device[k] ? E->brick_source[k] : E->model.source);
        if (A->rep[k].stage_peak_mib > 0) cJSON_AddNumberToObject(b, "stage_peak_rss_mib", A->rep[k].stage_peak_mib);
    }
    cJSON *run = cJSON_AddObjectToObject(root, "run");
    cJSON_AddNumberToObject(run, "questions", A->n_items);
    cJSON_AddStringToObject(run, "mode", A->n_cascaded == A->n_items && A->n_items > 0 ? "cascade"
                                         : A->n_cascaded > 0 ? "mixed" : A->sequential ? "sequential" : "pipelined");
    cJSON_AddNumberToObject(run, "wall_s", wall);
    cJSON_AddNumberToObject(run, "cpu_s", E->cpu_s);
    cJSON_AddNumberToObject(run, "dram_bytes", E->dram);
    cJSON_AddNumberToObject(run, "peak_rss_mib", peak_rss_mib(A));
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
    double *first_audio = calloc((size_t)A->n_items + 1, sizeof(double));
    double *done = calloc((size_t)A->n_items + 1, sizeof(double));
    int n_fa = 0, n_done = 0;
    const bool voice = A->out_dir != NULL;
    for (int i = 0; i < A->n_items; i++) {
        const item *it = &A->items[i];
        if (it->skipped && it->t.heard == 0) { // (a frame that did not change: nothing ran)
            fprintf(stderr, "question %d: not asked (%s)\n", i + 1, it->why);
            continue;
        }
        fprintf(stderr, "question %d (at %.3f s): from its end: heard %.3f s, first text %.3f s, last token %.3f s",
                i + 1, it->t_start, from_start(it, it->t.heard), from_start(it, it->t.first_text),
                from_start(it, it->t.answered));
        if (voice)
            fprintf(stderr, ", first audio %.3f s, spoken %.3f s (%.2f s of speech)", from_start(it, it->t.first_audio),
                    from_start(it, it->t.spoken), A->tts_rate > 0 ? (double)it->t.n_samples / A->tts_rate : 0.0);
        fprintf(stderr, "; %d tokens%s%s%s%s%s\n", it->n_tokens, it->failed ? " (failed)" : "",
                it->skipped ? " (not answered: " : "", it->skipped ? it->why : "", it->skipped ? ")" : "",
                it->cascade ? " (the cascade)" : "");
        if (first_audio && it->t.first_audio > 0) first_audio[n_fa++] = from_start(it, it->t.first_audio);
        if (done && !it->failed && !it->skipped)
            done[n_done++] = from_start(it, voice ? it->t.spoken : it->t.answered);
    }
    fprintf(stderr, "%d questions in %.3f s: %.3f questions/s (%s)\n", A->n_items, wall, A->n_items / wall, mode_of(A));
    if (first_audio) spread("first audio sample", first_audio, n_fa);
    if (done) spread(voice ? "answer spoken" : "answer written", done, n_done);
    free(first_audio);
    free(done);
    KINDS fprintf(stderr, "%s brick (%s): %llu requests, busy %.3f s (%.0f%% of the run)\n", NAME(k), DEV(k),
                  (unsigned long long)A->rep[k].s.n_requests, BUSY(k), 100.0 * BUSY(k) / wall);
    if (A->n_cascaded > 0)
        fprintf(stderr, "cascade: %d of %d questions, each brick loaded, run and released in turn; peak RSS by stage: "
                        "whisper %.1f MiB, decoder (and the vision encoder) %.1f MiB, voice %.1f MiB\n",
                A->n_cascaded, A->n_items, A->rep[NM_BRICK_STT].stage_peak_mib, A->rep[NM_BRICK_LLM].stage_peak_mib,
                A->rep[NM_BRICK_TTS].stage_peak_mib);
    nm_ledger *L = A->ledger;
    const int ep_caller = nm_ledger_endpoint(L, "caller"), ep_stt = nm_ledger_endpoint(L, "stt"),
              ep_llm = nm_ledger_endpoint(L, "llm"), ep_tts = nm_ledger_endpoint(L, "tts"),
              ep_eng = nm_ledger_endpoint(L, A->tts_engine); // (the voice's engine: espeak-ng, piper)
    const uint64_t mic = nm_ledger_bytes(L, ep_caller, ep_stt), heard = nm_ledger_bytes(L, ep_stt, ep_llm);
    const uint64_t said = nm_ledger_bytes(L, ep_llm, ep_tts);
    const uint64_t engine = nm_ledger_bytes(L, ep_tts, ep_eng) + nm_ledger_bytes(L, ep_eng, ep_tts);
    const uint64_t total = nm_ledger_total(L);
    fprintf(stderr, "ledger: %llu bytes copied (%llu copies): the microphone's audio into the STT slots %llu, the "
                    "transcripts into the chats %llu, the answers' sentences into the voice %llu, %s's text and "
                    "samples %llu, anything else %llu\n",
            (unsigned long long)total, (unsigned long long)nm_ledger_copies(L, -1, -1), (unsigned long long)mic,
            (unsigned long long)heard, (unsigned long long)said, A->tts_engine, (unsigned long long)engine,
            (unsigned long long)(total - mic - heard - said - engine));
    fprintf(stderr, "peak RSS: %.1f MiB\n", peak_rss_mib(A));
    const energy_report *E = &A->energy;
    fprintf(stderr, "energy (modelled: %.2f W idle, %.2f W with all %d cores busy, from %s; %.0f pJ a DRAM byte; "
                    "docs/power.md):\n",
            E->model.idle_w, E->model.active_w, E->model.n_cores, E->model.source,
            E->model.pj_byte > 0 ? E->model.pj_byte : 80.0);
    KINDS {
        if (E->brick_on_device[k])
            fprintf(stderr, "  %s brick: %.3f s busy on %s, %.1f MB streamed: %.3f J over idle (modelled: %s)\n",
                    NAME(k), BUSY(k), DEV(k), A->rep[k].dram_bytes / 1e6, E->brick_j[k], E->brick_source[k]);
        else
            fprintf(stderr, "  %s brick: %.3f s busy x %.3g threads, %.1f MB streamed: %.3f J over idle (modelled)\n",
                    NAME(k), BUSY(k), avg_threads(A, k), A->rep[k].dram_bytes / 1e6, E->brick_j[k]);
    }
    fprintf(stderr, "  the run: %.3f CPU-s in %.3f s, %.1f MB streamed: %.3f J (modelled), %.3f J a question\n",
            E->cpu_s, wall, E->dram / 1e6, E->run_j, A->n_items ? E->run_j / A->n_items : 0.0);
    for (int32_t m = 0; m < E->measured.n; m++)
        fprintf(stderr, "  %s: %.3f J in %.3f s (measured), %.3f J a question\n", E->measured.name[m],
                E->measured.joules[m], E->measured.seconds, A->n_items ? E->measured.joules[m] / A->n_items : 0.0);
    if (E->measured.n == 0) fprintf(stderr, "  no energy meter on this machine: modelled only\n");
}
