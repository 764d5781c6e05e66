// The pipeline's bricks and lanes (pipeline_impl.h): the bricks loaded,
// freed and made again (their counters summed across loads), a lane per
// brick (a thread that serves a request each time it is given one), the
// cascade's stages, and the threads that read the decoder's answers (TEXT
// events, sentences to the voice) and the voice's speech (AUDIO events).
#include "sched/pipeline_impl.h"

// ---- the bricks: loaded, freed, made again ---------------------------------------------------------

nm_brick **pl_slot_of(nm_pipeline *P, nm_brick_kind k) {
    return k == NM_BRICK_STT ? &P->stt : k == NM_BRICK_VISION ? &P->vision : k == NM_BRICK_LLM ? &P->llm : &P->tts;
}

// Brick k from its parameters (the threads the power policy set, where it
// did) into its place (the vision brick after the LLM's, which it feeds).
nm_status pl_load(nm_pipeline *P, nm_brick_kind kind, char *err, size_t err_size) {
    nm_brick_params bp = P->given[kind];
    bp.kind = kind;
    bp.ledger = P->ledger;
    if (P->threads_now > 0) bp.n_threads = P->threads_now;
    if (kind == NM_BRICK_LLM) {
        bp.llm.out = P->has[NM_BRICK_TTS] ? NM_LLM_OUT_SENTENCES : NM_LLM_OUT_TEXT;
        bp.llm.out_batch = 1;
    }
    if (kind == NM_BRICK_VISION) bp.feeds = P->llm;
    static const char *kinds[] = {[NM_BRICK_STT] = "stt", [NM_BRICK_VISION] = "vision", [NM_BRICK_LLM] = "llm",
                                  [NM_BRICK_TTS] = "tts"};
    char e[512];
    nm_brick *b = NULL;
    nm_status st = nm_brick_load(NULL, &bp, &b, e, sizeof e);
    if (st != NM_OK) { // (the brick's name once: a message that starts with it keeps its own)
        const size_t k = strlen(kinds[kind]);
        const bool named = !strncmp(e, kinds[kind], k) && e[k] == ':';
        return nm_fail(st, err, err_size, "%s%s%s", named ? "" : kinds[kind], named ? "" : ": ", e);
    }
    const int32_t cores = nm_cpu_count();
    pthread_mutex_lock(&P->lock);
    *pl_slot_of(P, kind) = b;
    if (kind == NM_BRICK_LLM) P->m = nm_brick_llm_model(b);
    pl_lane *L = &P->L[kind];
    L->threads = kind == NM_BRICK_TTS ? 1 : bp.n_threads > 0 && bp.n_threads < cores ? bp.n_threads : cores; // (espeak-ng: one)
    L->n_loads++;
    snprintf(L->name, sizeof L->name, "%s", nm_brick_name(b));
    snprintf(L->device, sizeof L->device, "%s", nm_brick_device(b));
    pthread_mutex_unlock(&P->lock);
    return NM_OK;
}

// Brick k's estimate of a request of size *in (its DRAM traffic: the weights
// its passes stream and the activations) added to its kind's sum.
void pl_traffic(nm_pipeline *P, nm_brick_kind k, nm_brick *b, const nm_brick_input *in) {
    nm_brick_cost c = {0};
    if (!b || nm_brick_estimate(b, in, &c) != NM_OK) return;
    pthread_mutex_lock(&P->lock);
    P->L[k].dram_bytes += c.weight_bytes_read + c.act_bytes;
    pthread_mutex_unlock(&P->lock);
}

// a += c, counter by counter (the most a pass carried: the larger).
void pl_stats_add(nm_brick_stats *a, const nm_brick_stats *c) {
    a->n_requests += c->n_requests, a->n_in_slots += c->n_in_slots, a->n_out_slots += c->n_out_slots;
    a->n_bad_requests += c->n_bad_requests, a->n_cancelled += c->n_cancelled, a->t_busy += c->t_busy;
    a->n_prompt_tokens += c->n_prompt_tokens, a->n_gen += c->n_gen, a->t_prompt += c->t_prompt, a->t_gen += c->t_gen;
    a->n_images += c->n_images, a->n_encoded += c->n_encoded, a->t_decode += c->t_decode, a->t_encode += c->t_encode;
    a->n_samples += c->n_samples, a->n_segments += c->n_segments, a->n_passes += c->n_passes;
    a->n_pass_seqs += c->n_pass_seqs;
    if (c->max_pass_seqs > a->max_pass_seqs) a->max_pass_seqs = c->max_pass_seqs;
}

// Frees brick k (its lane idle), its counters kept in the lane's sums.
void pl_unload(nm_pipeline *P, nm_brick_kind k) {
    pthread_mutex_lock(&P->lock);
    nm_brick *b = *pl_slot_of(P, k);
    *pl_slot_of(P, k) = NULL;
    if (k == NM_BRICK_LLM) P->m = NULL;
    pl_lane *L = &P->L[k];
    if (b) L->thread_s += L->cur.t_busy * L->threads;
    pl_stats_add(&L->base, &L->cur);
    L->cur = (nm_brick_stats){0};
    pthread_mutex_unlock(&P->lock);
    nm_brick_free(b);
}

// Every brick loaded (its lane idle); false with err on the first that fails (none left loaded).
bool pl_load_all(nm_pipeline *P, char *err, size_t err_size) {
    static const nm_brick_kind order[] = {NM_BRICK_STT, NM_BRICK_LLM, NM_BRICK_VISION, NM_BRICK_TTS};
    for (int i = 0; i < 4; i++)
        if (P->has[order[i]] && pl_load(P, order[i], err, err_size) != NM_OK) {
            for (int k = 1; k < 5; k++) pl_unload(P, (nm_brick_kind)k);
            return false;
        }
    return true;
}

// Waits (the lock held) until brick k's lane has served what it was given.
void pl_lane_idle_locked(nm_pipeline *P, nm_brick_kind k) {
    while ((P->L[k].busy || P->L[k].n_given > 0) && !P->stopping) pthread_cond_wait(&P->cond, &P->lock);
    while (P->L[k].busy) pthread_cond_wait(&P->cond, &P->lock); // (stopping: its step ends on the shut rings)
}

// The process's peak RSS (VmHWM) reset to what it holds now (a stage of the
// cascade begins; Linux's clear_refs, where it has it).
static void peak_reset(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return;
    fputs("5", f);
    fclose(f);
}

// The process's peak RSS since the last reset, MiB (0 where /proc has none).
static double peak_mib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %ld kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb / 1024.0;
}

// ---- the cascade: a brick loaded for each stage of a request ------------------------------------

// The stage of request r on brick kind k begins: for a request run as the
// cascade the brick is loaded (the LLM's with the vision brick where the
// request has images); its lane serves the request once given its first
// slot. False with the reason recorded (nothing loaded).
bool pl_stage_begin(nm_pipeline *P, pl_req *r, nm_brick_kind k) {
    if (!r->cascade) return true;
    peak_reset();
    char err[600];
    nm_status st = pl_load(P, k, err, sizeof err);
    if (st == NM_OK && k == NM_BRICK_LLM && r->n_images > 0 && (st = pl_load(P, NM_BRICK_VISION, err, sizeof err)) != NM_OK)
        pl_unload(P, NM_BRICK_LLM);
    if (st != NM_OK) pl_record(P, r, st, "%s", err);
    return st == NM_OK;
}

// The vision brick is done with the request (its segments are in the
// decoder's ring): released (the cascade).
void pl_stage_vision_done(nm_pipeline *P, const pl_req *r) {
    if (r->cascade) pl_unload(P, NM_BRICK_VISION);
}

// The stage ends (the cascade): the brick has served the request and its
// reader has seen the request's end (`ended`, under the lock); the brick is
// released.
void pl_stage_end(nm_pipeline *P, const pl_req *r, nm_brick_kind k, const bool *ended) {
    if (!r->cascade) return;
    pthread_mutex_lock(&P->lock);
    while (ended && !*ended && !P->stopping) pthread_cond_wait(&P->cond, &P->lock);
    pl_lane_idle_locked(P, k);
    pthread_mutex_unlock(&P->lock);
    pl_unload(P, NM_BRICK_VISION);
    pl_unload(P, k);
    const double peak = peak_mib(); // (the stage's: VmHWM was reset when it began)
    pthread_mutex_lock(&P->lock);
    if (peak > P->L[k].stage_peak_mib) P->L[k].stage_peak_mib = peak;
    pthread_mutex_unlock(&P->lock);
}

// A batching decoder's request r ended (its last output slot came; the lock held): its lane's service is
// counted now, or at give() where its end came first.
static void llm_ended_locked(nm_pipeline *P, pl_req *r) {
    pl_lane *L = &P->L[NM_BRICK_LLM];
    if (!L->by_end) return;
    r->llm_ended = true;
    if (!r->given[NM_BRICK_LLM] || r->llm_served) return;
    r->llm_served = true;
    L->n_open--;
    pl_served_locked(P, r->id);
    pthread_cond_broadcast(&P->cond); // (the feed thread may wait for room)
}

// keep_history: the request's turn and its answer join the conversation.
static void remember(nm_pipeline *P, pl_req *r, const char *answer, size_t n) {
    pthread_mutex_lock(&P->lock);
    if (r->turn && P->n_hist + 2 > P->cap_hist) {
        size_t cap = P->cap_hist ? 2 * P->cap_hist : 16;
        nm_chat_msg *h = realloc(P->hist, sizeof *h * cap);
        if (h) P->hist = h, P->cap_hist = cap;
    }
    char *a = pl_dup_n(answer, n);
    if (r->turn && a && P->n_hist + 2 <= P->cap_hist) {
        P->hist[P->n_hist++] = (nm_chat_msg){"user", r->turn};
        P->hist[P->n_hist++] = (nm_chat_msg){"assistant", a};
        r->turn = NULL;
    } else {
        free(a);
    }
    pthread_mutex_unlock(&P->lock);
}

void *pl_answers_main(void *arg) {
    nm_pipeline *P = arg;
    char *answer = NULL; // keep_history: the answer so far
    size_t len = 0, cap = 0;
    uint64_t cur = 0;
    for (;;) {
        nm_tabm_slot s;
        if (nm_tabm_acquire_read(P->llm_out, -1, &s) != NM_OK) break;
        const uint64_t id = s.meta->request, user = s.meta->user;
        pthread_mutex_lock(&P->lock);
        pl_req *r = pl_req_of(P, id);
        const bool speak = r && P->has[NM_BRICK_TTS] && !r->silent, cascade = r && r->cascade;
        if (r && id != cur) cur = id, len = 0;
        pthread_mutex_unlock(&P->lock);
        const size_t n = s.meta->kind == NM_TABM_TEXT ? (size_t)s.meta->size : 0;
        if (r && n > 0) {
            pthread_mutex_lock(&P->lock);
            if (r->t.first_text == 0) r->t.first_text = pl_since(r);
            pthread_mutex_unlock(&P->lock);
            nm_pipeline_event ev = {.kind = NM_PIPELINE_TEXT, .request = id};
            pl_push(P, &ev, s.data, n);
            if (P->p.keep_history && pl_reserve(&answer, &cap, len + n + 1)) memcpy(answer + len, s.data, n), len += n;
            // the sentence into the voice's slot: a copy between bricks, counted (CASCADE: held for the voice,
            // loaded once the decoder is released: counted here, and again into its slot)
            if (speak && !cascade) {
                pl_put_text(P, P->tts_in, P->ep_llm, P->ep_tts, s.data, n, NM_BRICK_MORE, r);
            } else if (speak && pl_reserve(&r->said, &r->cap_said, r->n_said + n + 1)) {
                nm_ledger_copy(P->ledger, P->ep_llm, P->ep_tts, r->said + r->n_said, s.data, n);
                r->said[r->n_said + n] = '\0';
                r->n_said += n + 1;
            }
        }
        const int64_t n_decoded = s.meta->shape[1], n_gen = s.meta->shape[2], n_reused = s.meta->shape[3];
        nm_tabm_release(P->llm_out, &s);
        if ((user & NM_BRICK_MORE) || !r) continue;
        // the answer's end (its counts in its last slot)
        const nm_llm_stop why = NM_LLM_STOP_OF(user);
        pthread_mutex_lock(&P->lock);
        r->n_prompt += (int32_t)n_decoded, r->n_tokens += (int32_t)n_gen, r->n_cached += (int32_t)n_reused;
        r->stop = why;
        llm_ended_locked(P, r); // (a batching decoder: its lane is done with it)
        r->t.answered = pl_since(r);
        if ((user & NM_BRICK_CANCELLED) && r->status == NM_OK && !r->cancelled) r->cancelled = true;
        if ((user & NM_BRICK_ERROR) && r->status == NM_OK) {
            snprintf(r->err, sizeof r->err, "llm: %s", nm_brick_request_error(P->llm, id));
            r->status = why == NM_LLM_STOP_BAD_INPUT ? NM_ERR_FORMAT : NM_ERR_STATE;
        }
        const bool ok = r->status == NM_OK && !r->cancelled, status_ok = r->status == NM_OK;
        pthread_mutex_unlock(&P->lock);
        // the turn and its answer, a cancelled one as far as it went, join the conversation
        if (P->p.keep_history && status_ok && (ok || len > 0)) remember(P, r, answer ? answer : "", len);
        if (speak && !cascade) { // the voice's request ends (a cancelled one is marked)
            if (!ok) nm_tabm_cancel_request(P->tts_in, id);
            if (pl_put_text(P, P->tts_in, -1, P->ep_tts, "", 0, 0, r) == NM_OK) {
                // DONE once the voice has ended it too (a cancelled voice may end it first: then here)
                pthread_mutex_lock(&P->lock);
                r->answer_ended = true;
                if (r->speech_ended) pl_done_locked(P, r, NM_OK, NULL);
                pthread_cond_broadcast(&P->cond); // (the feed thread may wait for it: end_head)
                pthread_mutex_unlock(&P->lock);
                continue;
            }
        }
        pthread_mutex_lock(&P->lock);
        r->answer_ended = true; // (the cascade: the feed thread waits for it, releases the decoder, then ends the
        if (!cascade) pl_done_locked(P, r, NM_OK, NULL); // request or loads the voice for what it holds)
        pthread_cond_broadcast(&P->cond);
        pthread_mutex_unlock(&P->lock);
    }
    free(answer);
    pl_fail_all(P, "the decoder's ring was shut down");
    return NULL;
}

// A vision brick alone: each encoder run's embeddings an EMBD event (its
// slot lent to the reader until the next read), the request's empty last
// slot its end.
void *pl_embd_main(void *arg) {
    nm_pipeline *P = arg;
    for (;;) {
        nm_tabm_slot s;
        if (nm_tabm_acquire_read(P->embd, -1, &s) != NM_OK) break;
        const nm_tabm_meta *m = s.meta;
        const uint64_t id = m->request, user = m->user;
        pthread_mutex_lock(&P->lock);
        pl_req *r = pl_req_of(P, id);
        // (a failed run's flagged slot, a cancelled request's: no event)
        const bool give = r && !r->cancelled && m->kind == NM_TABM_EMBD_F32 && m->size > 0 && m->ndim >= 2 &&
                          !(user & (NM_BRICK_ERROR | NM_BRICK_CANCELLED));
        if (give) {
            if (r->t.first_text == 0) r->t.first_text = pl_since(r);
            const bool grid = m->ndim == 3;
            nm_pipeline_event ev = {.kind = NM_PIPELINE_EMBD, .request = id, .embd = s.data,
                                    .n_rows = grid ? m->shape[0] * m->shape[1] : m->shape[0],
                                    .n_embd = (int32_t)m->shape[m->ndim - 1],
                                    .grid = {grid ? (int32_t)m->shape[0] : 0, grid ? (int32_t)m->shape[1] : 0}};
            if (!pl_push_locked(P, &ev, "", 0, &s)) nm_tabm_release(P->embd, &s); // (the slot is the reader's now)
        } else {
            nm_tabm_release(P->embd, &s);
        }
        if (r && !(user & NM_BRICK_MORE)) { // its end (the feed thread's empty slot)
            r->t.answered = pl_since(r); // (its last embeddings came)
            r->answer_ended = true;
            if (!r->cascade) pl_done_locked(P, r, NM_OK, NULL);
            pthread_cond_broadcast(&P->cond); // (the cascade's feed thread waits for it)
        }
        pthread_mutex_unlock(&P->lock);
    }
    pl_fail_all(P, "the embeddings ring was shut down");
    return NULL;
}

void *pl_speech_main(void *arg) {
    nm_pipeline *P = arg;
    for (;;) {
        nm_tabm_slot s;
        if (nm_tabm_acquire_read(P->tts_out, -1, &s) != NM_OK) break;
        const uint64_t id = s.meta->request, user = s.meta->user;
        pthread_mutex_lock(&P->lock);
        pl_req *r = pl_req_of(P, id);
        // (a cancelled request's speech is dropped: barge-in stops it at once)
        const bool pcm = r && !r->cancelled && s.meta->kind == NM_TABM_PCM_S16 && s.meta->size > 0;
        if (pcm) {
            if (r->t.first_audio == 0) r->t.first_audio = pl_since(r);
            r->t.n_samples += (int64_t)(s.meta->size / 2);
            nm_pipeline_event ev = {.kind = NM_PIPELINE_AUDIO, .request = id, .pcm = s.data,
                                    .n_samples = (int64_t)(s.meta->size / 2), .sample_rate = s.meta->sample_rate};
            if (!pl_push_locked(P, &ev, "", 0, &s)) nm_tabm_release(P->tts_out, &s); // (the slot is the reader's now)
        }
        if (r && !(user & NM_BRICK_MORE)) {
            r->t.spoken = pl_since(r);
            if ((user & NM_BRICK_CANCELLED) && !r->cancelled) r->cancelled = true;
            if ((user & NM_BRICK_ERROR) && r->status == NM_OK) {
                snprintf(r->err, sizeof r->err, "tts: %s", nm_brick_request_error(P->tts, id));
                r->status = NM_ERR_FORMAT;
            }
            r->speech_ended = true;
            // (else the answers thread; the cascade: the feed thread, once it has released the voice)
            if (!r->cascade && (!P->has[NM_BRICK_LLM] || r->answer_ended)) pl_done_locked(P, r, NM_OK, NULL);
            pthread_cond_broadcast(&P->cond); // (the cascade's feed thread waits for the voice's end)
        }
        pthread_mutex_unlock(&P->lock);
        if (!pcm) nm_tabm_release(P->tts_out, &s);
    }
    pl_fail_all(P, "the voice's ring was shut down");
    return NULL;
}

void *pl_lane_main(void *arg) {
    pl_lane *L = arg;
    nm_pipeline *P = L->P;
    const int32_t cap = LANE_QUEUE;
    nm_status st = NM_OK;
    pthread_mutex_lock(&P->lock);
    while (st == NM_OK) {
        while (L->n_given == 0 && !P->stopping) pthread_cond_wait(&P->cond, &P->lock);
        if (P->stopping) break;
        nm_brick *b = *pl_slot_of(P, L->kind); // (loaded before the request was given: freed only when idle)
        const uint64_t id = L->given[L->head];
        L->head = (L->head + 1) % cap, L->n_given--;
        L->busy = true;
        pthread_mutex_unlock(&P->lock);
        const nm_brick_stats s0 = nm_brick_get_stats(b);
        st = nm_brick_step(b, L->in, L->out); // (a request's failure is on its slots)
        const nm_brick_stats s = nm_brick_get_stats(b);
        pthread_mutex_lock(&P->lock);
        pl_req *r = pl_req_of(P, id);
        // the size of what the step served (one request, or those a batching decoder took while it ran)
        nm_brick_input in = {0};
        in.n_tokens = (int64_t)(s.n_prompt_tokens - s0.n_prompt_tokens), in.n_predict = (int64_t)(s.n_gen - s0.n_gen);
        in.n_samples = (int64_t)(s.n_samples - s0.n_samples);
        in.n_bytes = r ? r->n_spoken_bytes : 0;
        nm_brick_cost c = {0}; // (its DRAM traffic by its estimate; b stays loaded while the lane is busy)
        if (nm_brick_estimate(b, &in, &c) == NM_OK) L->dram_bytes += c.weight_bytes_read + c.act_bytes;
        L->cur = s;
        L->busy = false;
        if (!L->by_end) {
            L->n_open--;
            pl_served_locked(P, id);
        }
        // a batching decoder took every request that came while it ran (each served at its end): the next
        // given ones (the ring's order) are not to be stepped for, nor ones not given yet (give() skips them)
        for (uint64_t k = 1; L->by_end && k < s.n_requests - s0.n_requests; k++) {
            if (L->n_given == 0) L->ahead++;
            else L->head = (L->head + 1) % cap, L->n_given--;
        }
        pthread_cond_broadcast(&P->cond);
    }
    for (; L->n_given > 0; L->head = (L->head + 1) % cap, L->n_given--) { // (never served)
        pl_req *q = pl_req_of(P, L->given[L->head]);
        if (L->by_end && (!q || q->llm_served)) continue;
        if (q) q->llm_served = true;
        L->n_open--;
        pl_served_locked(P, L->given[L->head]);
    }
    pthread_cond_broadcast(&P->cond);
    pthread_mutex_unlock(&P->lock);
    // the brick or a ring broke: its neighbours wake and end (as nm_brick_run's)
    if (st != NM_OK) nm_tabm_shutdown(L->in), nm_tabm_shutdown(L->out);
    return NULL;
}
