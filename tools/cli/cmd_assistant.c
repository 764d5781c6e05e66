// nanomind assistant: a client of nm_pipeline (docs/pipeline.md, docs/cli.md).
// The options make the pipeline (Whisper, the vision encoder, the decoder,
// the voice; its mode: pipelined, --sequential, --cascade; the battery's
// policy; the wake words and the frame gate); the sources submit the
// questions (files and folders here, the microphone, a watched folder and a
// camera in assistant_events.c); the pipeline gives its events (on_event):
// the answers' text to stdout, their speech to OUT/answer-NNN.wav or a
// speaker, the power policy's lines, each question's figures for --stats
// and --json (assistant_report.c).
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "assistant.h"

// ---- the events -------------------------------------------------------------------------------

typedef struct speech_file speech_file; // (a question's answer file: assistant.h)

// The item of request id (the lock held): a question the command submitted
// (waited for: the id is set once submit returns), or one the pipeline cut
// from the microphone's stream (made here). NULL: no room for it.
static item *item_of(app *A, uint64_t id) {
    for (;;) {
        for (int i = A->n_items - 1; i >= 0; i--)
            if (A->items[i].id == id) return &A->items[i];
        if (!A->mic_dev) { // (submitted: its id comes as soon as submit returns)
            pthread_cond_wait(&A->cond, &A->lock);
            continue;
        }
        item *it = assistant_add_item(A);
        if (it) it->id = id;
        return it;
    }
}

static void speech_close(app *A, speech_file *S) {
    if (!S->id) return;
    char err[512] = "";
    uint8_t h[NM_WAV_HEADER_BYTES];
    pthread_mutex_lock(&A->lock);
    const int32_t rate = A->tts_rate;
    pthread_mutex_unlock(&A->lock);
    nm_audio_wav_header(h, (uint32_t)S->bytes, rate, 1);
    if (!S->bad && (!S->f.seekable || fseek(S->f.f, 0, SEEK_SET) != 0 || fwrite(h, 1, sizeof h, S->f.f) != sizeof h ||
                    nm_outfile_commit(&S->f, err, sizeof err) != NM_OK)) {
        fprintf(stderr, "error: %s: %s\n", S->path, err[0] ? err : "cannot write the header");
        S->bad = true;
    }
    if (S->bad) nm_outfile_abort(&S->f);
    S->id = 0;
}

// Question i's answer file (--out DIR: OUT/answer-NNN.wav, NNN its number)
// opened, a header for no samples yet written (speech_close writes the size).
static bool speech_open(app *A, speech_file *S, int i) {
    char err[512] = "";
    snprintf(S->path, sizeof S->path, "%s/answer-%03d.wav", A->out_dir, i + 1);
    uint8_t h[NM_WAV_HEADER_BYTES];
    pthread_mutex_lock(&A->lock);
    const int32_t rate = A->tts_rate > 0 ? A->tts_rate : 22050; // (a failed question's before any speech: espeak-ng's)
    pthread_mutex_unlock(&A->lock);
    nm_audio_wav_header(h, 0, rate, 1);
    S->bad = nm_outfile_open(&S->f, S->path, err, sizeof err) != NM_OK;
    S->bad = S->bad || fwrite(h, 1, sizeof h, S->f.f) != sizeof h;
    if (S->bad) fprintf(stderr, "error: %s: %s\n", S->path, err[0] ? err : strerror(errno));
    return !S->bad;
}

void assistant_silent_answer(app *A, int i) {
    if (!A->out_dir || A->speaker_dev) return;
    speech_file S = {0};
    char err[512] = "";
    if (speech_open(A, &S, i) && nm_outfile_commit(&S.f, err, sizeof err) != NM_OK)
        fprintf(stderr, "error: %s: %s\n", S.path, err);
    else if (S.bad)
        nm_outfile_abort(&S.f);
}

// An answer's speech: its samples (in the TTS ring's slot, lent until the
// next read) to the speaker, or to its WAV file.
static void speech(app *A, speech_file *S, const nm_pipeline_event *ev) {
    char err[512] = "";
    pthread_mutex_lock(&A->lock);
    A->tts_rate = ev->sample_rate;
    pthread_mutex_unlock(&A->lock);
    if (A->speaker_dev && !A->player) return; // (a heard question's: the speaker is absent)
    if (A->player) {
        if (nm_audio_player_write(A->player, ev->pcm, ev->n_samples, err, sizeof err) != NM_OK)
            fprintf(stderr, "error: speaker: %s\n", err);
        return;
    }
    if (S->id != ev->request) {
        speech_close(A, S);
        pthread_mutex_lock(&A->lock);
        item *it = item_of(A, ev->request);
        if (it) it->spoken = true;
        pthread_mutex_unlock(&A->lock);
        if (!it) return;
        S->id = ev->request;
        S->bytes = 0;
        speech_open(A, S, (int)(it - A->items));
    }
    const size_t n = sizeof(int16_t) * (size_t)ev->n_samples;
    if (!S->bad && fwrite(ev->pcm, 1, n, S->f.f) != n) {
        fprintf(stderr, "error: %s: %s\n", S->path, strerror(errno));
        S->bad = true;
    }
    S->bytes += n;
}

// Where a question came from, for its messages.
static const char *source_of(const app *A, const item *it) {
    return it->audio ? it->audio : it->camera ? A->camera_dev : it->frame ? it->frame : A->mic_dev ? "microphone" : "-p";
}

// A request's end: its figures kept, what went wrong said.
static void ended(app *A, const nm_pipeline_event *ev) {
    pthread_mutex_lock(&A->lock);
    item *it = item_of(A, ev->request);
    if (!it) {
        pthread_mutex_unlock(&A->lock);
        return;
    }
    const int i = (int)(it - A->items);
    it->t = ev->t;
    it->skipped = ev->skipped;
    it->cascade = ev->cascade;
    it->n_prompt = ev->n_prompt, it->n_tokens = ev->n_tokens;
    it->failed = ev->status != NM_OK && ev->status != NM_ERR_CANCELLED; // (a barge-in's cancel: not a failure)
    snprintf(it->why, sizeof it->why, "%s", ev->text);
    A->n_done++;
    A->n_cascaded += ev->cascade;
    // a heard question's figures count from where the utterance ended; the others' from their turn
    it->base = A->mic_dev ? 0 : it->t.started;
    it->t_start = it->t.submitted - (A->t0 - A->t_create) + it->base;
    const bool cam = it->camera && (ev->status == NM_ERR_IO || ev->status == NM_ERR_TIMEOUT);
    if (cam) A->camera_gone = true; // (the next questions go without the camera's frame, or end)
    const bool silent = !it->spoken && !it->skipped;
    pthread_cond_broadcast(&A->cond);
    pthread_mutex_unlock(&A->lock);
    if (silent) assistant_silent_answer(A, i); // (a failed question's answer file: empty)
    if (it->skipped && !strncmp(it->why, "frame ", 6))
        fprintf(stderr, "question %d: frame %s %s: not asked\n", i + 1, source_of(A, it), it->why + 6);
    else if (it->skipped)
        fprintf(stderr, "question %d: %s: \"%s\"\n", i + 1, it->why, it->heard[0] == ' ' ? it->heard + 1 : it->heard);
    else if (it->failed && ev->status != NM_ERR_CANCELLED)
        fprintf(stderr, "error: question %d (%s): %s\n", i + 1, source_of(A, it), it->why);
    else if (ev->stop == NM_LLM_STOP_CTX_FULL)
        fprintf(stderr, "[question %d: the context is full]\n", i + 1);
}

static void power(app *A, const nm_pipeline_event *ev) {
    pthread_mutex_lock(&A->lock);
    const int32_t was = A->threads_said;
    A->threads_said = ev->power.n_threads;
    A->fps_cap = ev->power.state == NM_POWER_CRITICAL ? 0 : ev->power.fps;
    pthread_mutex_unlock(&A->lock);
    fprintf(stderr, "power: %s\n", ev->text);
    if (was > 0 && was != ev->power.n_threads)
        fprintf(stderr, "power: %d thread%s a brick (was %d): the pipeline is made again\n", (int)ev->power.n_threads,
                ev->power.n_threads == 1 ? "" : "s", (int)was);
}

// Every event of the pipeline (its delivery thread: params.on_event), until
// it is closed. The answers' text goes to stdout in their order (a request's
// answer is whole before the next one's starts: the decoder serves one at a
// time), each after its question ("> ...").
static void on_event(const nm_pipeline_event *ev, void *arg) {
    app *A = arg;
    item *it = NULL;
    if (ev->kind == NM_PIPELINE_TRANSCRIPT || ev->kind == NM_PIPELINE_ASKED || ev->kind == NM_PIPELINE_TEXT) {
        pthread_mutex_lock(&A->lock);
        it = item_of(A, ev->request);
        pthread_mutex_unlock(&A->lock);
        if (!it) return;
    }
    switch (ev->kind) {
    case NM_PIPELINE_TRANSCRIPT:
        strncat(it->heard, ev->text, sizeof it->heard - strlen(it->heard) - 1);
        break;
    case NM_PIPELINE_ASKED:
        snprintf(it->question, sizeof it->question, "%s", ev->text);
        break;
    case NM_PIPELINE_TEXT:
        if (A->open_id != ev->request) {
            if (A->open_id) fputc('\n', stdout);
            printf("> %s\n", it->question);
            A->open_id = ev->request;
        }
        fwrite(ev->text, 1, ev->len, stdout);
        fflush(stdout);
        break;
    case NM_PIPELINE_AUDIO:
        speech(A, &A->speech, ev);
        break;
    case NM_PIPELINE_DONE:
        if (A->open_id == ev->request) {
            fputc('\n', stdout);
            fflush(stdout);
            A->open_id = 0;
        }
        if (A->speech.id == ev->request) speech_close(A, &A->speech);
        ended(A, ev);
        break;
    case NM_PIPELINE_NOTE:
        fprintf(stderr, "%s\n", ev->text);
        break;
    case NM_PIPELINE_POWER:
        power(A, ev);
        break;
    case NM_PIPELINE_BARGE_IN:
        fprintf(stderr, "barge-in at %.2f s: the answer in flight stopped\n", (double)ev->t0 / 100.0);
        break;
    case NM_PIPELINE_EMBD: // (a vision brick alone's: not this pipeline's)
        break;
    }
}

// The pipeline closed (its last event given): the answer being printed and the speech file ended.
static void events_end(app *A) {
    nm_pipeline_close(A->P);
    if (A->open_id) fputc('\n', stdout);
    fflush(stdout);
    A->open_id = 0;
    speech_close(A, &A->speech);
}

// ---- the pipeline -------------------------------------------------------------------------------

// A unit's name as a brick's placement: "cpu", "cpu:SPEC" (a lane: its cores),
// "opencl[:N]" (a device). False for a unit this build cannot place on (an NPU).
static bool placement(const nm_unit_profile *u, const char **device, const char **cores) {
    if (!strcmp(u->name, "cpu") || !strncmp(u->name, "cpu:", 4)) {
        *device = "cpu";
        *cores = u->name[3] ? u->name + 4 : NULL;
        return true;
    }
    if (!strcmp(u->name, "opencl") || !strncmp(u->name, "opencl:", 7)) {
        *device = u->name;
        *cores = NULL;
        return true;
    }
    return false;
}

// --plan: the planner places the bricks (those of pipeline P, loaded where
// the options put them) on the profiled units from their estimates for a
// typical question (3 s of speech, a frame at the encoder's size, 40 tokens
// of text around it, -n tokens of answer, ~4 bytes of text a token spoken);
// the plan is printed and the bricks' parameters placed. 0, or an exit status.
static int place_by_plan(app *A, nm_pipeline *P) {
    int rc = cli_load_units(A->o.profile, A->units, &A->n_units);
    if (rc) return rc;
    static const nm_brick_kind kinds[] = {NM_BRICK_STT, NM_BRICK_VISION, NM_BRICK_LLM, NM_BRICK_TTS};
    static const char *names[] = {"stt", "vision", "llm", "tts"};
    nm_brick_params *params[] = {&A->sp, &A->vp, &A->lp, &A->tp};
    nm_plan_brick b[4];
    nm_brick_params *which[4];
    int32_t n = 0;
    nm_status st = NM_OK;
    int64_t image_rows = 0;
    const int64_t n_predict = A->lp.llm.n_predict;
    memset(b, 0, sizeof b);
    for (int k = 0; k < 4 && st == NM_OK; k++) {
        nm_brick *br = nm_pipeline_brick(P, kinds[k]);
        if (!br) continue;
        b[n] = (nm_plan_brick){.kind = kinds[k], .name = names[k], .units = nm_brick_impl(br)->units};
        if (kinds[k] == NM_BRICK_TTS && strcmp(nm_brick_tts_engine(br), "piper") != 0)
            b[n].units &= NM_UNIT_BIT(NM_UNIT_CPU); // (espeak-ng's formants: the CPU only)
        which[n] = params[k];
        if (kinds[k] == NM_BRICK_STT) {
            st = nm_brick_estimate(br, &(nm_brick_input){.n_samples = 3 * 16000}, &b[n].cost);
        } else if (kinds[k] == NM_BRICK_VISION) {
            st = nm_brick_estimate(br, &(nm_brick_input){0}, &b[n].cost);
            image_rows = b[n].cost.n_out;
        } else if (kinds[k] == NM_BRICK_LLM) {
            b[n].n_layer = nm_model_n_layer(nm_brick_llm_model(br));
            const nm_brick_input li = {.n_tokens = 40 + image_rows, .n_predict = n_predict};
            st = nm_brick_estimate(br, &li, &b[n].cost);
            if (st == NM_OK)
                st = nm_brick_estimate(br, &(nm_brick_input){.n_past = li.n_tokens, .n_predict = n_predict},
                                       &b[n].decode);
        } else {
            st = nm_brick_estimate(br, &(nm_brick_input){.n_bytes = 4 * n_predict}, &b[n].cost);
        }
        n++;
    }
    if (st != NM_OK) {
        fprintf(stderr, "error: a brick's estimate: %s\n", nm_status_str(st));
        return 1;
    }
    nm_plan p;
    char err[512], buf[4096];
    if ((st = nm_plan_make(A->units, A->n_units, b, n, (nm_plan_goal)A->o.plan_goal, &p, err, sizeof err)) != NM_OK) {
        fprintf(stderr, "error: %s\n", err);
        return 1;
    }
    if (nm_plan_format(&p, A->units, b, buf, sizeof buf) > 0) fputs(buf, stderr);
    for (int32_t i = 0; i < n; i++) {
        const nm_plan_step *stp = &p.steps[i];
        const nm_unit_profile *u = &A->units[stp->unit], *u2 = stp->unit2 >= 0 ? &A->units[stp->unit2] : NULL;
        const char *dev = NULL, *cores = NULL, *dev2 = NULL, *cores2 = NULL;
        if (!placement(u, &dev, &cores) || (u2 && !placement(u2, &dev2, &cores2))) {
            fprintf(stderr, "error: the plan puts %s on %s, which this build cannot run bricks on\n", b[i].name,
                    u2 && placement(u, &dev, &cores) ? u2->name : u->name);
            return 1;
        }
        int32_t ngl = -1;
        if (u2) { // the decoder's first `split` layers on u, the rest on u2
            if (!strcmp(dev, "cpu") && strcmp(dev2, "cpu")) { // the last layers on a device: -ngl
                dev = dev2;
                ngl = b[i].n_layer - stp->split;
            } else { // two CPU lanes (or a device first): not a split we run; the larger share's unit
                if (stp->split * 2 < b[i].n_layer) dev = dev2, cores = cores2, u = u2;
                fprintf(stderr, "note: the plan splits %s over %s and %s; it runs whole on %s\n", b[i].name,
                        A->units[stp->unit].name, A->units[stp->unit2].name, u->name);
            }
        }
        which[i]->device = dev;
        which[i]->cores = cores;
        if (which[i] == &A->lp) which[i]->n_gpu_layers = ngl;
        fprintf(stderr, "placed: %s on %s%s%s", b[i].name, dev, cores ? ", cores " : "", cores ? cores : "");
        if (ngl >= 0) fprintf(stderr, ", its last %d layers there and the others on the CPU", ngl);
        fprintf(stderr, "\n");
    }
    return 0;
}

// --battery SRC: a percent, sysfs[:NAME] or trace:CSV; --power-sysfs ROOT.
// 0, or the exit status (the error said).
static int open_battery(app *A) {
    char err[512], *end;
    nm_status st;
    const double pct = strtod(A->battery_src, &end);
    if (!strncmp(A->battery_src, "trace:", 6))
        st = nm_battery_open_trace(A->battery_src + 6, &A->battery, err, sizeof err);
    else if (!strcmp(A->battery_src, "sysfs") || !strncmp(A->battery_src, "sysfs:", 6))
        st = nm_battery_open_sysfs(NULL, A->battery_src[5] ? A->battery_src + 6 : NULL, &A->battery, err, sizeof err);
    else if (end != A->battery_src && !*end)
        st = nm_battery_open_fixed(pct, &A->battery, err, sizeof err);
    else {
        snprintf(err, sizeof err, "--battery takes a percent, sysfs[:NAME] or trace:FILE, not '%s'", A->battery_src);
        st = NM_ERR_INVALID_ARG;
    }
    if (st != NM_OK) {
        fprintf(stderr, "error: %s\n", err);
        return st == NM_ERR_INVALID_ARG ? 2 : 1;
    }
    if (A->power_sysfs) {
        nm_actuator_params ap = nm_actuator_default_params();
        ap.sysfs_root = A->power_sysfs;
        if ((st = nm_power_actuators_open(&ap, &A->dvfs, err, sizeof err)) != NM_OK) {
            fprintf(stderr, "error: --power-sysfs: %s\n", err);
            return 1;
        }
        nm_power_actuators_guard(A->dvfs);
    }
    return 0;
}

// The bricks' parameters from the options (the decoder's context from the
// model's metadata, read here; each brick loads its own model, so that the
// cascade can release it). 0, or the exit status.
static int brick_params(app *A) {
    cli_opts *o = &A->o;
    char err[512];
    nm_model_params mp = nm_model_default_params();
    mp.n_threads = o->n_threads;
    mp.no_mmap = o->no_mmap;
    nm_model *m = NULL;
    nm_status st = nm_model_load(o->model, &mp, &m, err, sizeof err);
    if (st != NM_OK) {
        cli_load_error(o->model, st, err, CLI_WANT_LLM);
        return 1;
    }
    nm_chat_msg probe = {"user", "hi"};
    nm_status pst;
    char *f = cli_chat_text(m, o, &probe, 1, &pst);
    free(f);
    A->lp = cli_llm_params(o, m, NULL);
    nm_model_free(m);
    if (pst == NM_ERR_TEMPLATE && !o->jinja) {
        fprintf(stderr, "error: the model names no chat template we know: name one with --chat-template (%s)\n",
                nm_chat_template_names());
        return 1;
    }
    if (pst != NM_OK) return 1;
    A->lp.llm_model = NULL;
    A->lp.model = o->model;
    A->lp.no_mmap = o->no_mmap;
    if (A->lp.llm.n_predict < 0) A->lp.llm.n_predict = 128; // an answer must end
    if (o->mmproj) A->vp = cli_vision_params(o, o->mmproj, o->mmproj_device);
    if (A->stt_model) {
        A->sp = nm_brick_default_params(NM_BRICK_STT);
        A->sp.model = A->stt_model;
        A->sp.n_threads = o->n_threads;
        A->sp.cores = A->stt_cores;
        A->sp.stt = nm_stt_default_params(NM_STT_GREEDY); // whisper.cpp's stream example decodes greedily too
    }
    if (A->out_dir) {
        A->tp = nm_brick_default_params(NM_BRICK_TTS);
        A->tp.cores = A->tts_cores;
        A->tp.device = A->tts_device; // (a Piper voice's HiFi-GAN: NULL, the CPU)
        A->tp.n_threads = o->n_threads; // (a neural voice's threads)
        if (strcmp(A->tts_engine, "none")) A->tp.tts.engine = A->tts_engine;
        A->tp.tts.stream_ms = 200; // (a Piper voice's first long sentence: its first 0.2 s spoken first)
        if (A->voice) A->tp.tts.voice = A->voice;
    }
    return 0;
}

// The pipeline of the bricks' parameters as they are now. 0, or the exit status.
static int make_pipeline(app *A, nm_pipeline **out) {
    cli_opts *o = &A->o;
    nm_pipeline_params pp = nm_pipeline_default_params();
    pp.stt = A->stt_model ? &A->sp : NULL;
    pp.vision = o->mmproj ? &A->vp : NULL;
    pp.llm = &A->lp;
    pp.tts = A->out_dir ? &A->tp : NULL;
    pp.mode = A->cascade_always ? NM_PIPELINE_CASCADE : A->sequential ? NM_PIPELINE_SEQUENTIAL : NM_PIPELINE_PIPELINED;
    pp.chat = true;
    cli_chat_params(o, &pp);
    pp.ledger = A->ledger;
    pp.max_audio_s = MAX_QUESTION_S;
    pp.barge_in = A->barge_in;
    A->heard_cam = (nm_pipeline_image){.camera = A->camera}; // (heard questions: the camera's newest frame)
    pp.heard_images = A->mic_dev && A->camera && o->mmproj ? &A->heard_cam : NULL;
    pp.n_heard_images = pp.heard_images ? 1 : 0;
    pp.wake_words = A->wake_words;
    pp.frame_change = A->frame_change;
    nm_power_params pw = nm_power_default_params();
    pw.n_threads = o->n_threads > 0 ? o->n_threads : 0; // (the policy's threads target scales -t)
    pp.battery = A->battery;
    pp.power = A->battery ? &pw : NULL;
    pp.battery_speed = A->battery_speed;
    pp.dvfs = A->dvfs;
    pp.on_event = on_event;
    pp.on_event_user = A;
    char err[1024];
    nm_status st = nm_pipeline_create(&pp, out, err, sizeof err);
    A->t_create = cli_now(); // (about the end of create, where the requests' `submitted` counts from)
    if (st == NM_OK) return 0;
    if (!strncmp(err, "vision: ", 8)) cli_vision_error(o, o->mmproj, st, err + 8);
    else if (!strncmp(err, "stt: ", 5)) cli_load_error(A->stt_model, st, err + 5, CLI_WANT_WHISPER);
    else fprintf(stderr, "error: %s\n", err);
    return st == NM_ERR_INVALID_ARG ? 2 : 1; // (what the options asked for cannot be: --wake-words' list)
}

// The questions of files and folders (and typed ones), each submitted in
// turn; frames at --fps (or the policy's rate) at most, as a camera gives them.
static void ask_listed(app *A) {
    double next_frame = 0; // when the next frame is due
    for (int i = 0; i < A->n_items && !assistant_stopped(); i++) {
        item *it = &A->items[i];
        pthread_mutex_lock(&A->lock);
        float fps = A->fps;
        if (A->fps_cap > 0 && (fps == 0 || A->fps_cap < fps)) fps = (float)A->fps_cap;
        pthread_mutex_unlock(&A->lock);
        if (it->frame && fps > 0) {
            const double t = now(A);
            if (next_frame > t) {
                const double d = next_frame - t;
                struct timespec ts = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
                nanosleep(&ts, NULL);
            }
            next_frame = (next_frame > t ? next_frame : t) + 1.0 / fps;
        }
        assistant_submit(A, it);
    }
}

int cmd_assistant(int argc, char **argv) {
    app A;
    memset(&A, 0, sizeof A);
    A.watch_fd = -1;
    int rc = assistant_options(&A, argc, argv);
    if (rc >= 0) return rc; // --help, --version, or a usage error (exit 2)
    cli_opts *o = &A.o;
    rc = 1;
    pthread_mutex_init(&A.lock, NULL);
    pthread_cond_init(&A.cond, NULL);
    char err[512];
    if (!assistant_make_items(&A)) goto out;
    if ((o->stats || A.json_path) && !cli_energy_load(o->profile, &A.energy.model)) goto out; // the model's watts
    if ((rc = brick_params(&A)) != 0) goto out;
    rc = 1;
    cli_mlock(o);
    if (!(A.ledger = nm_ledger_create())) goto out;
    if (A.battery_src && (rc = open_battery(&A)) != 0) goto out;
    rc = 1;
    if (A.watch_dir && !assistant_watch_open(&A)) goto out;
    if (A.camera_dev && !assistant_camera_open(&A) && !A.audio) goto out; // absent: spoken questions go without one
    if (o->plan) { // placed by the planner from the bricks loaded where the options put them, then made there
        nm_pipeline *first = NULL;
        if ((rc = make_pipeline(&A, &first)) == 0) rc = place_by_plan(&A, first);
        nm_pipeline_free(first);
        if (rc) goto out;
        rc = 1;
    }
    if ((rc = make_pipeline(&A, &A.P)) != 0) goto out;
    rc = 1;
    if (A.speaker_dev) { // an absent speaker: the answers are printed only (submitted silent)
        A.tp.kind = NM_BRICK_TTS;
        nm_brick *tts = nm_pipeline_brick(A.P, NM_BRICK_TTS), *probe = NULL;
        if (!tts && nm_brick_load(NULL, &A.tp, &probe, err, sizeof err) != NM_OK) probe = NULL; // (the cascade's)
        const int32_t rate = nm_brick_tts_sample_rate(tts ? tts : probe);
        nm_brick_free(probe);
        if (nm_audio_player_open(A.speaker_dev, rate, &A.player, err, sizeof err) != NM_OK)
            fprintf(stderr, "speaker skipped: %s\n", err);
    }
    if (o->stats || A.json_path) { // the machine's energy meters, if any (else the energy is modelled only)
        if (nm_energy_meters_open(NULL, true, &A.meters, err, sizeof err) != NM_OK) {
            fprintf(stderr, "energy meters: %s: the energy is modelled only\n", err);
        } else if (nm_energy_meters_count(A.meters) == 0 || nm_energy_meters_start(A.meters, err, sizeof err) != NM_OK) {
            nm_energy_meters_free(A.meters);
            A.meters = NULL;
        }
    }
    A.t0 = cli_now();
    A.cpu0 = cli_cpu_seconds();
    bool src_ok = true;
    if (A.live) assistant_catch_sigint(); // Ctrl-C stops listening; the questions heard are answered
    if (A.mic_dev) {
        fprintf(stderr, "listening on '%s'%s\n", A.mic_dev, A.listen_s > 0 ? "" : " (Ctrl-C stops)");
        src_ok = assistant_listen_mic(&A);
    } else if (A.watch_dir) {
        fprintf(stderr, "watching '%s' for %s%s\n", A.watch_dir, A.watch_frames ? "frames" : "questions",
                A.listen_s > 0 ? "" : " (Ctrl-C stops)");
        src_ok = assistant_watch(&A);
    } else if (A.camera && !A.audio) {
        fprintf(stderr, "asking about %s's frames%s\n", A.camera_dev, A.listen_s > 0 ? "" : " (Ctrl-C stops)");
        src_ok = assistant_camera_questions(&A);
    } else {
        ask_listed(&A);
    }
    events_end(&A); // the questions asked are answered, their events given
    if (A.player) nm_audio_player_drain(A.player, err, sizeof err); // the last answer, played to its end
    const double wall = now(&A);
    rc = src_ok ? 0 : 1;
    for (int i = 0; i < A.n_items; i++) rc = A.items[i].failed ? 1 : rc;
    if (A.live && A.n_items == 0 && src_ok)
        fprintf(stderr, A.mic_dev ? "heard no question\n" : A.watch_dir ? "no file arrived: no question\n" : "no frame: no question\n");
    for (int k = NM_BRICK_STT; k <= NM_BRICK_TTS; k++) nm_pipeline_brick_stats(A.P, (nm_brick_kind)k, &A.rep[k]);
    if (o->stats || A.json_path) assistant_energy_end(&A, wall);
    if (o->stats) assistant_print_stats(&A, wall);
    if (A.json_path && !assistant_write_json(&A, wall)) rc = 1;
out:
    if (A.P) events_end(&A); // (a failure after the pipeline was made: nothing more comes)
    nm_pipeline_free(A.P);
    nm_camera_close(A.camera);
    nm_energy_meters_free(A.meters);
    nm_power_actuators_free(A.dvfs); // the frequencies as they were
    nm_battery_free(A.battery);
    nm_ledger_free(A.ledger);
    if (A.watch_fd >= 0) close(A.watch_fd);
    nm_audio_player_close(A.player);
    for (int i = 0; i < A.n_owned; i++) free(A.owned[i]);
    free(A.owned);
    free(A.items);
    cli_opts_free(o);
    pthread_cond_destroy(&A.cond);
    pthread_mutex_destroy(&A.lock);
    return rc;
}
