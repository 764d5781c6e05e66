// The pipeline's public calls (include/nanomind/pipeline.h; its parts:
// pipeline_impl.h): create and free, submit, read, cancel and close; the
// events; a request's end (its DONE, once every lane given it is done).
#include "sched/pipeline_impl.h"

char *pl_dup_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}
char *pl_dup_s(const char *s) { return s ? pl_dup_n(s, strlen(s)) : NULL; }

// *buf (malloc'd, *cap bytes) grown to hold at least need bytes, doubling
// (from 1 KiB). False, *buf untouched, when out of memory.
bool pl_reserve(char **buf, size_t *cap, size_t need) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 1024;
    while (c < need) c *= 2;
    char *g = realloc(*buf, c);
    if (!g) return false;
    *buf = g, *cap = c;
    return true;
}

static void *deliver_main(void *arg);
static void join_delivery(nm_pipeline *P);

nm_pipeline_params nm_pipeline_default_params(void) {
    return (nm_pipeline_params){.mode = NM_PIPELINE_PIPELINED, .chat = true};
}

// ---- events ---------------------------------------------------------------------------------

// Queues an event (text copied) in a spare node where there is one; the lock
// held. False when out of memory (the event is lost).
bool pl_push_locked(nm_pipeline *P, const nm_pipeline_event *ev, const char *text, size_t len,
                    const nm_tabm_slot *slot) {
    pl_event *e = P->spare;
    if (e) P->spare = e->next;
    else if (!(e = calloc(1, sizeof *e))) return false;
    if (len + 1 > e->cap) {
        char *t = realloc(e->text, len + 1);
        if (!t) {
            e->next = P->spare, P->spare = e;
            return false;
        }
        e->text = t, e->cap = len + 1;
    }
    if (len) memcpy(e->text, text, len);
    e->text[len] = '\0';
    e->ev = *ev;
    e->ev.text = e->text;
    e->ev.len = len;
    e->has_slot = slot != NULL;
    e->ring = ev->kind == NM_PIPELINE_EMBD ? P->embd : P->tts_out;
    if (slot) e->slot = *slot;
    e->next = NULL;
    if (P->ev_tail) P->ev_tail->next = e;
    else P->ev_head = e;
    P->ev_tail = e;
    pthread_cond_broadcast(&P->cond);
    return true;
}

void pl_push(nm_pipeline *P, const nm_pipeline_event *ev, const char *text, size_t len) {
    pthread_mutex_lock(&P->lock);
    pl_push_locked(P, ev, text, len, NULL);
    pthread_mutex_unlock(&P->lock);
}

// A request's pl_record (NULL: never given, or done and freed). The lock held.
pl_req *pl_req_of(nm_pipeline *P, uint64_t id) { return id >= 1 && id <= P->n_reqs ? P->reqs[id - 1] : NULL; }



// Frees request r's record once the feed thread is done with it and its DONE
// has been read (a long-running pipeline keeps only a pointer a request). The
// lock held.
void pl_retire_locked(nm_pipeline *P, pl_req *r) {
    if (!r->fed || !r->read) return;
    P->reqs[r->id - 1] = NULL;
    pl_free_req_body(r);
    free(r->turn);
    free(r);
}

void pl_free_req_body(pl_req *r) {
    free(r->text), free(r->llm_params), free(r->tts_params), free(r->vision_params), free(r->said), free(r->head);
    r->text = r->llm_params = r->tts_params = r->vision_params = r->said = r->head = NULL;
    r->n_said = r->cap_said = 0;
    for (int32_t i = 0; i < r->n_images; i++) {
        free(r->img[i].path);
        if (r->img[i].held) nm_tabm_cancel(nm_camera_ring(r->img[i].camera), &r->img[i].slot); // (back to the camera)
        r->img[i].held = false;
    }
    r->n_images = 0;
}

// The markers in text.
int32_t pl_n_markers(const char *text) {
    int32_t n = 0;
    for (const char *q = text; (q = strstr(q, MEDIA_MARKER)); q += strlen(MEDIA_MARKER)) n++;
    return n;
}

// text with the request's images' markers before it where it has none; malloc'd.
char *pl_with_markers(const pl_req *r, const char *text) {
    const size_t ml = strlen(MEDIA_MARKER), n = strlen(text);
    const int32_t k = r->n_images > 0 && pl_n_markers(text) == 0 ? r->n_images : 0;
    char *s = malloc(ml * (size_t)k + n + 1);
    if (!s) return NULL;
    for (int32_t i = 0; i < k; i++) memcpy(s + ml * (size_t)i, MEDIA_MARKER, ml);
    memcpy(s + ml * (size_t)k, text, n + 1);
    return s;
}

// Request r's DONE event (every lane is done with it). The lock held.
static void announce_locked(nm_pipeline *P, pl_req *r) {
    r->announced = true;
    P->n_done++;
    nm_pipeline_event ev = {.kind = NM_PIPELINE_DONE, .request = r->id, .status = r->status, .stop = r->stop, .t = r->t,
                            .skipped = r->skipped, .cascade = r->cascade, .n_prompt = r->n_prompt,
                            .n_tokens = r->n_tokens, .n_cached = r->n_cached};
    pl_push_locked(P, &ev, r->err, strlen(r->err), NULL);
}

// The request's end: its DONE event, once the lanes serving it have finished
// and the feed thread is done with it (so that a brick's counters and a
// request's resources are settled, and none of its events follows, when the
// caller reads it). status NM_OK takes what was recorded on it (a failure, a
// cancellation) first. The lock held.
void pl_done_locked(nm_pipeline *P, pl_req *r, nm_status status, const char *msg) {
    if (r->done) return;
    if (status == NM_OK && r->status != NM_OK) status = r->status, msg = r->err;
    if (r->cancelled && status == NM_OK) status = NM_ERR_CANCELLED;
    if (status == NM_ERR_CANCELLED) msg = "cancelled";
    r->done = true;
    r->status = status;
    if (msg != r->err) snprintf(r->err, sizeof r->err, "%s", msg ? msg : "");
    if (r->in_lanes == 0 && r->fed) announce_locked(P, r);
}

// A lane has finished request id: its DONE, if due and no other lane has it. The lock held.
void pl_served_locked(nm_pipeline *P, uint64_t id) {
    pl_req *r = pl_req_of(P, id);
    if (r && --r->in_lanes == 0 && r->done && r->fed && !r->announced) announce_locked(P, r);
}

// The feed thread is done with request r (its last event but DONE made, its
// held frames given back): its DONE, if due; freed once that is read.
void pl_fed_locked(nm_pipeline *P, pl_req *r) {
    r->fed = true;
    if (r->done && r->in_lanes == 0 && !r->announced) announce_locked(P, r);
    pl_retire_locked(P, r);
}

void pl_done(nm_pipeline *P, pl_req *r, nm_status status, const char *msg) {
    pthread_mutex_lock(&P->lock);
    pl_done_locked(P, r, status, msg);
    pthread_mutex_unlock(&P->lock);
}

// A failure recorded on the request, for the stage that ends it.
void pl_record(nm_pipeline *P, pl_req *r, nm_status st, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
void pl_record(nm_pipeline *P, pl_req *r, nm_status st, const char *fmt, ...) {
    pthread_mutex_lock(&P->lock);
    if (r->status == NM_OK && !r->done) { // (a request ended keeps what its DONE says)
        va_list ap;
        va_start(ap, fmt);
        nm_vfail(st, r->err, sizeof r->err, NULL, fmt, ap);
        va_end(ap);
        r->status = st;
    }
    pthread_mutex_unlock(&P->lock);
}

double pl_since(const pl_req *r) { return nm_now_s() - r->t_submit; }

// A ring failed under a thread (a lane ended): every request not done ends
// with the reason, so that no reader waits for them.
void pl_fail_all(nm_pipeline *P, const char *why) {
    pthread_mutex_lock(&P->lock);
    for (uint64_t i = 0; i < P->n_reqs; i++)
        if (P->reqs[i] && !P->reqs[i]->done)
            pl_done_locked(P, P->reqs[i], P->stopping ? NM_ERR_CANCELLED : NM_ERR_SHUTDOWN, why);
    pthread_mutex_unlock(&P->lock);
}

// ---- create, free ----------------------------------------------------------------------------------

static nm_status ring(nm_tabm **r, uint32_t n, size_t bytes, char *err, size_t err_size) {
    return nm_tabm_create(NULL, n, bytes, r, err, err_size);
}

static bool start_lane(nm_pipeline *P, nm_brick_kind k, nm_tabm *in, nm_tabm *out) {
    pl_lane *L = &P->L[k];
    L->P = P, L->kind = k, L->in = in, L->out = out;
    L->started = pthread_create(&L->th, NULL, pl_lane_main, L) == 0;
    return L->started;
}

nm_status nm_pipeline_create(const nm_pipeline_params *p, nm_pipeline **out, char *err, size_t err_size) {
    if (!out) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: no place for the handle");
    *out = NULL;
    if (p && p->vision && !p->llm && (p->stt || p->tts))
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: a vision brick feeds an llm brick, or is alone");
    if (!p || (!p->stt && !p->vision && !p->llm && !p->tts))
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: no brick (give stt, vision, llm or tts "
                       "parameters)");
    if ((unsigned)p->mode > NM_PIPELINE_CASCADE)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: mode %d (pipelined 0, sequential 1, cascade 2)",
                       (int)p->mode);
    if (p->jinja_template && p->jinja_len == 0)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: a Jinja template of 0 bytes");
    char why[256];
    nm_status kst;
    if (p->chat_template_kwargs && (kst = nm_chat_kwargs_check(p->chat_template_kwargs, p->jinja, why, sizeof why)))
        return nm_fail(kst, err, err_size, "pipeline: %s", why);
    if (p->frame_change < 0 || p->frame_change >= 255)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: frame_change %.2f (0 .. 255)",
                       (double)p->frame_change);
    if (p->n_heard_images < 0 || p->n_heard_images > NM_PIPELINE_MAX_IMAGES ||
        (p->n_heard_images > 0 && (!p->heard_images || !p->stt || !p->vision)))
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: %d heard images (at most %d, with STT and "
                       "VISION bricks)", (int)p->n_heard_images, NM_PIPELINE_MAX_IMAGES);
    if (p->wake_words && !p->stt)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: wake words, and no STT brick to hear them");
    nm_pipeline *P = calloc(1, sizeof *P);
    if (!P) return nm_fail(NM_ERR_NOMEM, err, err_size, "pipeline: out of memory");
    P->p = *p;
    P->p.wake_words = NULL; // (normalised into P->wake)
    nm_status wst = p->wake_words ? pl_wake_words(P, p->wake_words, err, err_size) : NM_OK;
    if (wst != NM_OK) {
        free(P);
        return wst;
    }
    pthread_mutex_init(&P->lock, NULL);
    pthread_mutex_init(&P->submit_lock, NULL);
    pthread_cond_init(&P->cond, NULL);
    P->system_prompt = pl_dup_s(p->system_prompt);
    P->chat_template = pl_dup_s(p->chat_template);
    P->jinja_template = p->jinja_template ? pl_dup_n(p->jinja_template, p->jinja_len) : NULL;
    P->jinja_name = pl_dup_s(p->jinja_name ? p->jinja_name : p->jinja_template ? "the Jinja template"
                                                                             : "the model's chat template");
    P->p.jinja_name = P->jinja_name;
    P->p.system_prompt = P->system_prompt;
    P->p.chat_template = P->chat_template;
    P->p.jinja_template = P->jinja_template;
    P->chat_kwargs = pl_dup_s(p->chat_template_kwargs);
    P->p.chat_template_kwargs = P->chat_kwargs;
    if (P->p.queue <= 0) P->p.queue = 8;
    if (P->p.max_audio_s <= 0) P->p.max_audio_s = 60;
    P->ledger = p->ledger;
    if (!P->ledger) P->ledger = nm_ledger_create(), P->own_ledger = true;
    nm_status st = NM_ERR_NOMEM;
    if (!P->ledger || (p->system_prompt && !P->system_prompt) || (p->chat_template && !P->chat_template) ||
        (p->jinja_template && !P->jinja_template) || !P->jinja_name || (p->chat_template_kwargs && !P->chat_kwargs)) {
        nm_fail(st, err, err_size, "pipeline: out of memory");
        goto fail;
    }
    P->ep_caller = nm_ledger_endpoint(P->ledger, "caller");
    P->ep_vision = nm_ledger_endpoint(P->ledger, p->vision && p->vision->name ? p->vision->name : "vision");
    P->ep_stt = nm_ledger_endpoint(P->ledger, p->stt && p->stt->name ? p->stt->name : "stt");
    P->ep_llm = nm_ledger_endpoint(P->ledger, p->llm && p->llm->name ? p->llm->name : "llm");
    P->ep_tts = nm_ledger_endpoint(P->ledger, p->tts && p->tts->name ? p->tts->name : "tts");
    if (P->ep_caller < 0 || P->ep_stt < 0 || P->ep_vision < 0 || P->ep_llm < 0 || P->ep_tts < 0) {
        st = nm_fail(NM_ERR_RANGE, err, err_size, "pipeline: the ledger has no room for its endpoints");
        goto fail;
    }
    // the bricks (the vision brick writes the decoder's ring: it loads after it); CASCADE loads each once
    // here, to check it and size the rings, and again for each request's stage
    const nm_brick_params *given[5] = {NULL, p->stt, p->vision, p->llm, p->tts};
    for (int k = 1; k < 5; k++)
        if (given[k]) P->has[k] = true, P->given[k] = *given[k];
    // power: the policy's threads at full charge are the LLM brick's (all cores where it names none)
    P->power = p->power ? *p->power : nm_power_default_params();
    if (P->power.n_threads == 0) P->power.n_threads = p->llm && p->llm->n_threads > 0 ? p->llm->n_threads : nm_cpu_count();
    if (P->p.battery_speed <= 0) P->p.battery_speed = 1;
    if (p->battery) {
        char e[256];
        if ((st = nm_power_policy_init(&P->pol, &P->power, e, sizeof e)) != NM_OK) {
            nm_fail(st, err, err_size, "pipeline: %s", e);
            goto fail;
        }
    }
    if ((p->stt && (st = pl_load(P, NM_BRICK_STT, err, err_size)) != NM_OK) ||
        (p->llm && (st = pl_load(P, NM_BRICK_LLM, err, err_size)) != NM_OK) ||
        (p->vision && (st = pl_load(P, NM_BRICK_VISION, err, err_size)) != NM_OK) ||
        (p->tts && (st = pl_load(P, NM_BRICK_TTS, err, err_size)) != NM_OK))
        goto fail;
    if (P->llm) P->n_predict = p->llm->llm.n_predict;
    P->n_parallel = p->llm && p->llm->n_parallel > 1 ? p->llm->n_parallel : 1;
    P->L[NM_BRICK_LLM].by_end = P->n_parallel > 1;
    if (P->tts) P->tts_rate = nm_brick_tts_sample_rate(P->tts);
    if (P->llm && p->chat && !p->jinja && !nm_chat_template_name(P->m, P->chat_template)) {
        st = nm_fail(NM_ERR_TEMPLATE, err, err_size, "pipeline: %s (name one: %s)",
                     P->chat_template ? "no such chat template" : "the model names no chat template nanomind knows",
                     nm_chat_template_names());
        goto fail;
    }
    if (P->llm && p->chat && p->jinja) { // a template that fails a chat of one turn fails here, not at each request
        const nm_chat_msg probe[] = {{"system", P->system_prompt}, {"user", "hi"}};
        const char *fallback = NULL;
        char e[1024];
        char *text = pl_format_chat(P, probe + (P->system_prompt ? 0 : 1), P->system_prompt ? 2 : 1, &fallback, &st, e,
                                    sizeof e);
        free(text);
        if (!text) {
            nm_fail(st, err, err_size, "%s", e);
            goto fail;
        }
        if (fallback && !(P->note = pl_dup_s(e))) {
            st = nm_fail(NM_ERR_NOMEM, err, err_size, "pipeline: out of memory");
            goto fail;
        }
    }
    // the rings, sized from the bricks' slots
    size_t llm_slot = P->llm ? nm_brick_in_slot_bytes(P->llm) : 0;
    if (P->vision && nm_brick_out_slot_bytes(P->vision) > llm_slot) llm_slot = nm_brick_out_slot_bytes(P->vision);
    if ((P->stt && ((st = ring(&P->stt_in, STT_IN_SLOTS, sizeof(float) * 16000 * (size_t)P->p.max_audio_s, err,
                               err_size)) != NM_OK ||
                    (st = ring(&P->stt_out, OUT_SLOTS, nm_brick_out_slot_bytes(P->stt), err, err_size)) != NM_OK)) ||
        (P->llm && ((st = ring(&P->llm_in, LLM_IN_SLOTS * (uint32_t)(P->n_parallel + 1), llm_slot, err, err_size)) != NM_OK ||
                    (st = ring(&P->llm_out, OUT_SLOTS + 4 * (uint32_t)P->n_parallel, nm_brick_out_slot_bytes(P->llm), err,
                               err_size)) != NM_OK)) ||
        (P->vision && (st = ring(&P->img, 2, nm_brick_in_slot_bytes(P->vision), err, err_size)) != NM_OK) ||
        (P->vision && !P->has[NM_BRICK_LLM] &&
         (st = ring(&P->embd, EMBD_SLOTS, nm_brick_out_slot_bytes(P->vision), err, err_size)) != NM_OK) ||
        (P->tts && ((st = ring(&P->tts_in, 16, P->llm ? TEXT_SLOT : NM_TTS_MAX_TEXT, err, err_size)) != NM_OK ||
                    (st = ring(&P->tts_out, OUT_SLOTS, nm_brick_out_slot_bytes(P->tts), err, err_size)) != NM_OK)))
        goto fail;
    if (P->p.mode == NM_PIPELINE_CASCADE) { // nothing resident between requests
        for (int k = 1; k < 5; k++) pl_unload(P, (nm_brick_kind)k);
    }
    P->resident = P->p.mode != NM_PIPELINE_CASCADE;
    P->t_create = nm_now_s(); // (the pipeline's age, the battery trace's clock, counts from here: its bricks loaded)
    // the lanes and the threads
    bool ok = (!P->has[NM_BRICK_STT] || start_lane(P, NM_BRICK_STT, P->stt_in, P->stt_out)) &&
              (!P->has[NM_BRICK_LLM] || start_lane(P, NM_BRICK_LLM, P->llm_in, P->llm_out)) &&
              (!P->has[NM_BRICK_TTS] || start_lane(P, NM_BRICK_TTS, P->tts_in, P->tts_out));
    ok = ok && (P->feed_started = pthread_create(&P->th_feed, NULL, pl_feed_main, P) == 0);
    ok = ok && (!P->has[NM_BRICK_LLM] || (P->answers_started = pthread_create(&P->th_answers, NULL, pl_answers_main, P) == 0));
    ok = ok && (!P->embd || (P->answers_started = pthread_create(&P->th_answers, NULL, pl_embd_main, P) == 0));
    ok = ok && (!P->has[NM_BRICK_TTS] || (P->speech_started = pthread_create(&P->th_speech, NULL, pl_speech_main, P) == 0));
    ok = ok && (!p->on_event || (P->deliver_started = pthread_create(&P->th_deliver, NULL, deliver_main, P) == 0));
    if (!ok) {
        st = nm_fail(NM_ERR_NOMEM, err, err_size, "pipeline: cannot start its threads");
        goto fail;
    }
    *out = P;
    return NM_OK;
fail:
    nm_pipeline_free(P);
    return st;
}

static void shut(nm_tabm *r) {
    if (r) nm_tabm_shutdown(r);
}

void nm_pipeline_free(nm_pipeline *P) {
    if (!P) return;
    pthread_mutex_lock(&P->lock);
    P->stopping = true;
    pthread_cond_broadcast(&P->cond);
    pthread_mutex_unlock(&P->lock);
    nm_tabm *rings[] = {P->stt_in, P->stt_out, P->img, P->llm_in, P->llm_out, P->tts_in, P->tts_out, P->embd};
    for (size_t i = 0; i < sizeof rings / sizeof rings[0]; i++) shut(rings[i]);
    if (P->feed_started) pthread_join(P->th_feed, NULL);
    if (P->answers_started) pthread_join(P->th_answers, NULL);
    if (P->speech_started) pthread_join(P->th_speech, NULL);
    for (int k = 1; k < 5; k++)
        if (P->L[k].started) pthread_join(P->L[k].th, NULL);
    pthread_mutex_lock(&P->lock);
    P->joined = true; // (the delivery thread gives what is queued, then ends)
    pthread_cond_broadcast(&P->cond);
    pthread_mutex_unlock(&P->lock);
    join_delivery(P);
    if (P->cur) P->cur->next = NULL; // the event lent to the reader, those not read, the spares
    pl_event *lists[] = {P->cur, P->ev_head, P->spare};
    for (size_t i = 0; i < 3; i++)
        for (pl_event *e = lists[i], *next; e; e = next) {
            next = e->next;
            if (e->has_slot) nm_tabm_release(e->ring, &e->slot);
            free(e->text);
            free(e);
        }
    for (size_t i = 0; i < sizeof rings / sizeof rings[0]; i++) nm_tabm_free(rings[i]);
    nm_brick_free(P->vision);
    nm_brick_free(P->stt);
    nm_brick_free(P->llm);
    nm_brick_free(P->tts);
    for (uint64_t i = 0; i < P->n_reqs; i++) {
        if (!P->reqs[i]) continue;
        pl_free_req_body(P->reqs[i]);
        free(P->reqs[i]->turn);
        free(P->reqs[i]);
    }
    free(P->reqs);
    for (size_t i = 0; i < P->n_hist; i++) free((char *)P->hist[i].content);
    free(P->hist);
    nm_vad_free(P->vad);
    if (P->own_ledger) nm_ledger_free(P->ledger);
    free(P->system_prompt), free(P->chat_template), free(P->jinja_template), free(P->jinja_name), free(P->note);
    free(P->chat_kwargs);
    pthread_cond_destroy(&P->cond);
    pthread_mutex_destroy(&P->lock);
    pthread_mutex_destroy(&P->submit_lock);
    free(P);
}

// ---- requests ----------------------------------------------------------------------------------------

// The request's audio (and its STT parameters) into the STT ring: both slots
// held, filled, then published in order, so a failure leaves nothing behind.
static nm_status put_audio(nm_pipeline *P, const nm_pipeline_input *in, uint64_t id, char *err, size_t err_size) {
    nm_tabm_slot ps, as;
    const bool params = in->stt_params != NULL;
    nm_status st = params ? nm_tabm_acquire_write(P->stt_in, 0, -1, &ps) : NM_OK;
    if (st == NM_OK && (st = nm_tabm_acquire_write(P->stt_in, 0, -1, &as)) != NM_OK && params)
        nm_tabm_cancel(P->stt_in, &ps);
    if (st != NM_OK) return nm_fail(st, err, err_size, "stt: its ring: %s", nm_status_str(st));
    const int64_t cap = (int64_t)(as.capacity / sizeof(float));
    int64_t n = 0;
    char e[400] = "";
    if (in->audio_path) {
        st = nm_audio_load_into(in->audio_path, 16000, as.data, cap, &n, e, sizeof e);
        if (st == NM_ERR_RANGE) nm_fail(st, e, sizeof e, "%s: longer than %d s", in->audio_path, P->p.max_audio_s);
    } else if (in->n_samples > cap) {
        st = nm_fail(NM_ERR_RANGE, e, sizeof e, "%lld samples: longer than %d s", (long long)in->n_samples,
                     P->p.max_audio_s);
    } else {
        n = in->n_samples;
        nm_ledger_copy(P->ledger, P->ep_caller, P->ep_stt, as.data, in->pcm, sizeof(float) * (size_t)n); // the caller's
    }
    const size_t pn = params ? strlen(in->stt_params) : 0;
    if (st == NM_OK && params && pn > ps.capacity)
        st = nm_fail(NM_ERR_RANGE, e, sizeof e, "the STT parameters (%zu bytes) do not fit a slot", pn);
    if (st == NM_OK && n == 0) st = nm_fail(NM_ERR_FORMAT, e, sizeof e, "no audio (0 samples)");
    if (st != NM_OK) {
        if (params) nm_tabm_cancel(P->stt_in, &ps);
        nm_tabm_cancel(P->stt_in, &as);
        return nm_fail(st, err, err_size, "audio %s (%s)", e, nm_status_str(st));
    }
    if (params) {
        memcpy(ps.data, in->stt_params, pn);
        *ps.meta = (nm_tabm_meta){.kind = NM_TABM_PARAMS, .ndim = 1, .shape = {(int64_t)pn}, .size = pn,
                                  .user = NM_BRICK_MORE, .request = id};
    }
    *as.meta = (nm_tabm_meta){.kind = NM_TABM_PCM_F32, .ndim = 1, .shape = {n}, .size = sizeof(float) * (uint64_t)n,
                              .sample_rate = 16000, .request = id};
    if (params && (st = nm_tabm_publish(P->stt_in, &ps)) != NM_OK) nm_tabm_cancel(P->stt_in, &ps);
    if (st == NM_OK && (st = nm_tabm_publish(P->stt_in, &as)) != NM_OK) nm_tabm_cancel(P->stt_in, &as);
    return st == NM_OK ? NM_OK : nm_fail(st, err, err_size, "stt: its ring: %s", nm_status_str(st));
}

nm_status nm_pipeline_submit(nm_pipeline *P, const nm_pipeline_input *in, uint64_t *id, char *err, size_t err_size) {
    if (id) *id = 0;
    if (!P || !in) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: no pipeline or no input");
    const bool audio = in->audio_path || in->pcm, image = in->n_images > 0;
    if (in->audio_path && in->pcm)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: audio given twice (pcm and a file)");
    if (in->n_images < 0 || in->n_images > NM_PIPELINE_MAX_IMAGES || (in->n_images > 0 && !in->images))
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: %d images (at most %d a request)",
                       (int)in->n_images, NM_PIPELINE_MAX_IMAGES);
    for (int32_t i = 0; i < in->n_images; i++) {
        const nm_pipeline_image *im = &in->images[i];
        if ((im->path != NULL) + (im->bytes != NULL) + (im->camera != NULL) != 1)
            return nm_fail(NM_ERR_INVALID_ARG, err, err_size,
                           "pipeline: image %d: give a path, bytes or a camera, one of them", (int)i + 1);
        if (im->camera && !nm_camera_ring(im->camera))
            return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: image %d: a camera not started", (int)i + 1);
        if (im->camera && in->vision_params)
            return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: image %d: vision parameters for a camera's "
                           "frame (its ring holds frames only)", (int)i + 1);
    }
    const int32_t marks = in->text && in->n_images > 0 ? pl_n_markers(in->text) : 0; // (no image: a marker is text)
    if (marks > 0 && marks != in->n_images)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: the text has %d %s markers for %d images",
                       (int)marks, MEDIA_MARKER, (int)in->n_images);
    if (audio && !P->has[NM_BRICK_STT])
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: audio, and no STT brick to hear it");
    if (audio && in->text)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: audio and text: the question is one of them");
    if (image && !P->has[NM_BRICK_VISION])
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: an image, and no vision brick to see it");
    if (in->pcm && in->n_samples <= 0)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: %lld samples", (long long)in->n_samples);
    if (P->embd && (in->text || !image)) // (audio: refused above, no STT)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: %s, and a vision brick alone: images only",
                       in->text ? "text" : "no image");
    if (!audio && !in->text && !P->embd)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: nothing to ask (no text and no audio)");
    if (in->text && !audio && !P->has[NM_BRICK_LLM] && !P->has[NM_BRICK_TTS])
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: text, and no LLM or TTS brick to take it");
    if (in->llm_params && !P->has[NM_BRICK_LLM])
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: LLM parameters, and no LLM brick");
    if (in->tts_params && !P->has[NM_BRICK_TTS])
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: TTS parameters, and no TTS brick");
    if (in->stt_params && !audio)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: STT parameters, and no audio");
    pl_req *r = calloc(1, sizeof *r);
    if (!r) return nm_fail(NM_ERR_NOMEM, err, err_size, "pipeline: out of memory");
    r->audio = audio;
    r->silent = in->silent;
    r->text = pl_dup_s(in->text);
    r->llm_params = pl_dup_s(in->llm_params);
    r->tts_params = pl_dup_s(in->tts_params);
    r->vision_params = image ? pl_dup_s(in->vision_params) : NULL;
    bool paths = true;
    for (int32_t i = 0; i < in->n_images; i++) { // (bytes: read into the vision brick's slot in their turn, one copy)
        r->img[i] = (pl_img){.path = pl_dup_s(in->images[i].path), .bytes = in->images[i].bytes,
                             .n_bytes = in->images[i].n_bytes, .camera = in->images[i].camera};
        paths = paths && (!in->images[i].path || r->img[i].path);
    }
    r->n_images = in->n_images;
    if ((in->text && !r->text) || !paths || (in->llm_params && !r->llm_params) || (in->tts_params && !r->tts_params) ||
        (image && in->vision_params && !r->vision_params)) {
        pl_free_req_body(r);
        free(r);
        return nm_fail(NM_ERR_NOMEM, err, err_size, "pipeline: out of memory");
    }
    // ids, the STT ring's order and the queue's agree: one submit at a time
    pthread_mutex_lock(&P->submit_lock);
    pthread_mutex_lock(&P->lock);
    while (P->n_queued >= P->p.queue && !P->closed && !P->stopping) pthread_cond_wait(&P->cond, &P->lock);
    nm_status st = P->closed || P->stopping ? NM_ERR_SHUTDOWN : NM_OK;
    if (st == NM_OK && P->n_reqs == P->cap_reqs) {
        const uint64_t cap = P->cap_reqs ? 2 * P->cap_reqs : 64;
        pl_req **g = realloc(P->reqs, sizeof *g * cap);
        if (g) P->reqs = g, P->cap_reqs = cap;
        else st = NM_ERR_NOMEM;
    }
    const uint64_t rid = P->n_reqs + 1;
    pthread_mutex_unlock(&P->lock);
    if (st == NM_OK && audio) st = put_audio(P, in, rid, err, err_size);
    else if (st != NM_OK) nm_fail(st, err, err_size, "pipeline: %s", st == NM_ERR_NOMEM ? "out of memory" : "closed");
    if (st != NM_OK) {
        pthread_mutex_unlock(&P->submit_lock);
        pl_free_req_body(r);
        free(r);
        return st;
    }
    pthread_mutex_lock(&P->lock);
    r->id = rid;
    r->t_submit = nm_now_s();
    r->t.submitted = r->t_submit - P->t_create;
    P->reqs[P->n_reqs++] = r;
    if (P->q_tail) P->q_tail->next = r;
    else P->q_head = r;
    P->q_tail = r;
    P->n_queued++;
    pthread_cond_broadcast(&P->cond);
    pthread_mutex_unlock(&P->lock);
    pthread_mutex_unlock(&P->submit_lock);
    if (id) *id = rid;
    return NM_OK;
}

// Every lane has ended its last step (a batching decoder's DONEs come before it). The lock held.
static bool lanes_idle_locked(const nm_pipeline *P) {
    for (int k = 1; k < 5; k++)
        if (P->L[k].busy || P->L[k].n_given > 0) return false;
    return true;
}

// nm_pipeline_read's work: the caller's, or the delivery thread's (params.on_event).
static nm_status read_event(nm_pipeline *P, int64_t timeout_ns, nm_pipeline_event *ev) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    if (timeout_ns > 0) {
        until.tv_sec += (time_t)(timeout_ns / 1000000000);
        until.tv_nsec += (long)(timeout_ns % 1000000000);
        if (until.tv_nsec >= 1000000000) until.tv_sec++, until.tv_nsec -= 1000000000;
    }
    pthread_mutex_lock(&P->lock);
    if (P->cur) { // what the last event lent; a DONE read: its request may go
        pl_req *done_r = P->cur->ev.kind == NM_PIPELINE_DONE ? pl_req_of(P, P->cur->ev.request) : NULL;
        if (done_r) done_r->read = true, pl_retire_locked(P, done_r);
        if (P->cur->has_slot) nm_tabm_release(P->cur->ring, &P->cur->slot);
        P->cur->has_slot = false;
        P->cur->next = P->spare;
        P->spare = P->cur;
        P->cur = NULL;
    }
    nm_status st = NM_OK;
    for (;;) {
        if (P->ev_head) break;
        if (((P->closed || P->stopping) && P->n_done == P->n_reqs && (P->stopping || lanes_idle_locked(P))) ||
            P->joined) { // (joined: free has ended every other thread; what is queued was given)
            st = NM_ERR_SHUTDOWN; // (closed: after every lane's last step, so every counter is settled)
            break;
        }
        if (timeout_ns == 0) {
            st = NM_ERR_AGAIN;
            break;
        }
        if (timeout_ns < 0) {
            pthread_cond_wait(&P->cond, &P->lock);
        } else if (pthread_cond_timedwait(&P->cond, &P->lock, &until) != 0 && !P->ev_head) {
            st = NM_ERR_TIMEOUT;
            break;
        }
    }
    if (st == NM_OK) {
        P->cur = P->ev_head;
        P->ev_head = P->cur->next;
        if (!P->ev_head) P->ev_tail = NULL;
        *ev = P->cur->ev;
    }
    pthread_mutex_unlock(&P->lock);
    return st;
}

nm_status nm_pipeline_read(nm_pipeline *P, int64_t timeout_ns, nm_pipeline_event *ev) {
    if (!P || !ev || P->p.on_event) return NM_ERR_INVALID_ARG;
    return read_event(P, timeout_ns, ev);
}

// params.on_event: each event given to it, in read's order, until the end.
static void *deliver_main(void *arg) {
    nm_pipeline *P = arg;
    nm_pipeline_event ev;
    while (read_event(P, -1, &ev) == NM_OK) P->p.on_event(&ev, P->p.on_event_user);
    return NULL;
}

// The delivery thread joined, once (by close or free; not from the callback itself).
static void join_delivery(nm_pipeline *P) {
    pthread_mutex_lock(&P->lock);
    const bool join = P->deliver_started && !P->deliver_joined && !pthread_equal(pthread_self(), P->th_deliver);
    if (join) P->deliver_joined = true;
    pthread_mutex_unlock(&P->lock);
    if (join) pthread_join(P->th_deliver, NULL);
}

nm_status nm_pipeline_cancel(nm_pipeline *P, uint64_t request) {
    if (!P) return NM_ERR_INVALID_ARG;
    pthread_mutex_lock(&P->lock);
    pl_req *r = pl_req_of(P, request);
    if (!r) { // never given; or done, its DONE read, and its record freed
        const bool given = request >= 1 && request <= P->n_reqs;
        pthread_mutex_unlock(&P->lock);
        return given ? NM_OK : NM_ERR_RANGE;
    }
    const bool mark = !r->done && !r->cancelled;
    if (mark) { // it is silent from now: its speech not yet read goes
        r->cancelled = true;
        for (pl_event **pe = &P->ev_head, *prev = NULL; *pe;) {
            pl_event *e = *pe;
            if (e->ev.kind != NM_PIPELINE_AUDIO || e->ev.request != request) {
                prev = e, pe = &e->next;
                continue;
            }
            *pe = e->next;
            if (P->ev_tail == e) P->ev_tail = prev;
            if (e->has_slot) nm_tabm_release(e->ring, &e->slot);
            e->has_slot = false;
            e->next = P->spare, P->spare = e;
        }
    }
    pthread_mutex_unlock(&P->lock);
    if (!mark) return NM_OK;
    // wherever it is: each brick stops it at its next check and ends it downstream
    nm_tabm *rings[] = {P->stt_in, P->img, P->llm_in, P->tts_in};
    for (size_t i = 0; i < 4; i++)
        if (rings[i]) nm_tabm_cancel_request(rings[i], request);
    return NM_OK;
}

void nm_pipeline_close(nm_pipeline *P) {
    if (!P) return;
    pthread_mutex_lock(&P->lock);
    P->closed = true;
    pthread_cond_broadcast(&P->cond);
    pthread_mutex_unlock(&P->lock);
    join_delivery(P); // (on_event: the last event given)
}

nm_brick *nm_pipeline_brick(const nm_pipeline *P, nm_brick_kind kind) {
    if (!P || kind < NM_BRICK_STT || kind > NM_BRICK_TTS) return NULL;
    nm_pipeline *Q = (nm_pipeline *)P; // (the lock only)
    pthread_mutex_lock(&Q->lock);
    nm_brick *b = *pl_slot_of(Q, kind);
    pthread_mutex_unlock(&Q->lock);
    return b;
}

nm_status nm_pipeline_brick_stats(const nm_pipeline *P, nm_brick_kind kind, nm_pipeline_brick_report *out) {
    if (!P || !out || kind < NM_BRICK_STT || kind > NM_BRICK_TTS) return NM_ERR_INVALID_ARG;
    nm_pipeline *Q = (nm_pipeline *)P; // (the lock only)
    pthread_mutex_lock(&Q->lock);
    const bool has = Q->has[kind];
    const pl_lane *L = &Q->L[kind];
    *out = (nm_pipeline_brick_report){.s = L->base, .n_loads = L->n_loads, .dram_bytes = L->dram_bytes,
                                      .stage_peak_mib = L->stage_peak_mib};
    pl_stats_add(&out->s, &L->cur);
    out->thread_s = L->thread_s + (*pl_slot_of(Q, kind) ? L->cur.t_busy * L->threads : 0);
    memcpy(out->name, L->name, sizeof out->name);
    memcpy(out->device, L->device, sizeof out->device);
    pthread_mutex_unlock(&Q->lock);
    return has ? NM_OK : NM_ERR_RANGE;
}

nm_ledger *nm_pipeline_ledger(const nm_pipeline *P) { return P ? P->ledger : NULL; }
