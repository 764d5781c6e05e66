// The pipeline's feed thread (pipeline_impl.h): takes the requests in order,
// reads each one's transcript from the STT ring (TRANSCRIPT events), writes
// the decoder's prompt (the chat turn tokenized into its slots, each image
// through the vision brick, which it runs) or the text for a pipeline without
// a decoder, and runs a request as the cascade (each stage's brick loaded for
// it, run and released).
#include "sched/pipeline_impl.h"

// ---- the prompt ------------------------------------------------------------------------------

// A conversation as text (malloc'd) by the pipeline's template; NULL with
// err saying why. *fallback (may be NULL): the built-in template used where
// the Jinja one is beyond the subset.
char *pl_format_chat(const nm_pipeline *P, const nm_chat_msg *msgs, size_t n, const char **fallback, nm_status *st,
                     char *err, size_t err_size) {
    char e[768], *text = NULL;
    *st = nm_chat_text(P->m, P->chat_template, P->p.jinja, P->jinja_template, P->p.jinja_len, msgs, n, true,
                       P->chat_kwargs, &text,
                       fallback, e, sizeof e);
    if (*st != NM_OK)
        nm_fail(*st, err, err_size, "chat template: %s%s%s", P->p.jinja ? P->jinja_name : "", P->p.jinja ? ": " : "",
                *st == NM_ERR_NOMEM ? "out of memory" : e);
    else if (fallback && *fallback)
        snprintf(err, err_size, "%s is beyond nanomind's Jinja subset (%s): formatting with the built-in '%s' template "
                 "instead", P->jinja_name, e, *fallback);
    return text;
}

// The conversation's messages: the system prompt, the history from turn
// `from` on, the user's content. The lock held.
static size_t chat_msgs(const nm_pipeline *P, size_t from, const char *content, nm_chat_msg *msgs) {
    size_t k = 0;
    if (P->system_prompt) msgs[k++] = (nm_chat_msg){"system", P->system_prompt};
    for (size_t i = from; i < P->n_hist; i++) msgs[k++] = P->hist[i];
    msgs[k++] = (nm_chat_msg){"user", content};
    return k;
}

// The chat of request r (its turn after the history) as text, malloc'd; NULL
// with the reason recorded. With keep_history, the oldest turns go while the
// conversation and room for an answer outgrow the context (a NOTE says so),
// and a turn that cannot fit alone is named.
static char *chat_text(nm_pipeline *P, pl_req *r, const char *question) {
    char *content = pl_with_markers(r, question), err[1024];
    pthread_mutex_lock(&P->lock); // (the history changes under it; the feed thread alone changes it while a
                                  // conversation's turn is formatted: turns go one at a time)
    nm_chat_msg *msgs = content ? malloc(sizeof *msgs * (P->n_hist + 2)) : NULL;
    size_t n = msgs ? chat_msgs(P, 0, content, msgs) : 0;
    char *note = P->note;
    P->note = NULL;
    pthread_mutex_unlock(&P->lock);
    if (note) {
        pl_push(P, &(nm_pipeline_event){.kind = NM_PIPELINE_NOTE, .request = r->id}, note, strlen(note));
        free(note);
    }
    nm_status st = NM_ERR_NOMEM;
    char *text = msgs ? pl_format_chat(P, msgs, n, NULL, &st, err, sizeof err) : NULL;
    if (text && P->p.keep_history && r->n_images == 0) { // (else put_tokens refuses what does not fit; an image's
                                                         // positions are the decoder's to count)
        const int32_t n_ctx = nm_ctx_n_ctx(nm_brick_llm_ctx(P->llm));
        const int32_t room = P->n_predict > 0 && P->n_predict < n_ctx ? P->n_predict : n_ctx / 4;
        int32_t n_tok = -nm_tokenize(P->m, text, strlen(text), NULL, 0, true, true);
        size_t drop = 0;
        while (text && n_tok + room > n_ctx && drop + 2 <= P->n_hist) { // keep_history: a user + assistant pair goes
            drop += 2;
            free(text);
            pthread_mutex_lock(&P->lock);
            n = chat_msgs(P, drop, content, msgs);
            pthread_mutex_unlock(&P->lock);
            if ((text = pl_format_chat(P, msgs, n, NULL, &st, err, sizeof err)))
                n_tok = -nm_tokenize(P->m, text, strlen(text), NULL, 0, true, true);
        }
        if (text && drop) {
            pthread_mutex_lock(&P->lock);
            for (size_t i = 0; i < drop; i++) free((char *)P->hist[i].content);
            memmove(P->hist, P->hist + drop, sizeof *P->hist * (P->n_hist - drop));
            P->n_hist -= drop;
            pthread_mutex_unlock(&P->lock);
            const int len = snprintf(err, sizeof err,
                                     "context of %d tokens: dropped the %zu oldest turn%s; the conversation is %d "
                                     "tokens now", n_ctx, drop / 2, drop > 2 ? "s" : "", n_tok);
            pl_push(P, &(nm_pipeline_event){.kind = NM_PIPELINE_NOTE, .request = r->id}, err, (size_t)len);
        }
        if (text && n_tok >= n_ctx) {
            st = nm_fail(NM_ERR_RANGE, err, sizeof err, "llm: this message (%d tokens with the template%s) does not "
                         "fit the context of %d", n_tok, P->system_prompt ? " and the system prompt" : "", n_ctx);
            free(text);
            text = NULL;
        }
    }
    if (!text) pl_record(P, r, st, "%s", st == NM_ERR_NOMEM && !msgs ? "out of memory" : err);
    free(msgs);
    free(content);
    return text;
}

// A PARAMS slot (json) of request id into ring, NM_BRICK_MORE set.
// Request r's first slot is in brick k's input ring: its lane is given the
// request (once: a lane serves a request at a time, in the ring's order).
static void give(nm_pipeline *P, nm_brick_kind k, pl_req *r) {
    pl_lane *L = &P->L[k];
    pthread_mutex_lock(&P->lock);
    if (!r->given[k] && (L->ahead > 0 || L->n_given < LANE_QUEUE)) {
        r->given[k] = true;
        if (L->by_end && r->llm_ended) { // (its end came first: nothing of it is open)
            r->llm_served = true;
        } else {
            r->in_lanes++;
            L->n_open++;
        }
        if (L->ahead > 0) L->ahead--; // (a batching step took it already)
        else L->given[(L->head + L->n_given++) % LANE_QUEUE] = r->id;
        pthread_cond_broadcast(&P->cond);
    }
    pthread_mutex_unlock(&P->lock);
}

// The brick whose input ring is `ring`.
static nm_brick_kind kind_in(const nm_pipeline *P, const nm_tabm *ring) {
    return ring == P->stt_in ? NM_BRICK_STT : ring == P->llm_in ? NM_BRICK_LLM : NM_BRICK_TTS;
}

// Request r's parameters (a JSON object) into a PARAMS slot of `ring`, its first.
static nm_status put_params(nm_pipeline *P, nm_tabm *ring, const char *json, pl_req *r) {
    nm_tabm_slot s;
    const size_t n = strlen(json);
    nm_status st = nm_tabm_acquire_write(ring, 0, -1, &s);
    if (st != NM_OK) return st;
    if (n > s.capacity) {
        nm_tabm_cancel(ring, &s);
        return NM_ERR_RANGE;
    }
    memcpy(s.data, json, n); // the caller's parameters, made here: not a copy between bricks
    *s.meta = (nm_tabm_meta){.kind = NM_TABM_PARAMS, .ndim = 1, .shape = {(int64_t)n}, .size = n,
                             .user = NM_BRICK_MORE, .request = r->id};
    st = nm_tabm_publish(ring, &s);
    if (st != NM_OK) nm_tabm_cancel(ring, &s);
    else give(P, kind_in(P, ring), r);
    return st;
}

// A TEXT slot of request r: text[0..n) copied into it (counted from -> to;
// from < 0: the pipeline's own marker text, not counted), flags `user`.
nm_status pl_put_text(nm_pipeline *P, nm_tabm *ring, int from, int to, const char *text, size_t n, uint64_t user,
                      pl_req *r) {
    nm_tabm_slot s;
    nm_status st = nm_tabm_acquire_write(ring, 0, -1, &s);
    if (st != NM_OK) return st;
    if (n > s.capacity) {
        nm_tabm_cancel(ring, &s);
        return NM_ERR_RANGE;
    }
    if (from >= 0) nm_ledger_copy(P->ledger, from, to, s.data, text, n);
    else if (n) memcpy(s.data, text, n);
    *s.meta = (nm_tabm_meta){.kind = NM_TABM_TEXT, .ndim = n ? 1 : 0, .shape = {(int64_t)n}, .size = n, .user = user,
                             .request = r->id};
    st = nm_tabm_publish(ring, &s);
    if (st != NM_OK) {
        nm_tabm_cancel(ring, &s);
        return st;
    }
    if (ring == P->tts_in) { // (the voice's request's size, for its estimate)
        pthread_mutex_lock(&P->lock);
        r->n_spoken_bytes += (int64_t)n;
        pthread_mutex_unlock(&P->lock);
    }
    give(P, kind_in(P, ring), r);
    return st;
}

// Text [text, text + n) of request r tokenized straight into a slot of the
// decoder's ring (BOS where it starts the prompt, special tokens parsed),
// flags `user`: the prompt crosses into the decoder with no copy. False with
// the reason recorded.
static bool put_tokens(nm_pipeline *P, pl_req *r, const char *text, size_t n, uint64_t user) {
    nm_tabm_slot s;
    nm_status st = nm_tabm_acquire_write(P->llm_in, 0, -1, &s);
    if (st != NM_OK) {
        pl_record(P, r, st, "llm: its ring: %s", nm_status_str(st));
        return false;
    }
    const bool at0 = (user & NM_LLM_IN_AT_POS) && NM_LLM_IN_POS_OF(user) == 0;
    const int32_t n_ctx = nm_ctx_n_ctx(nm_brick_llm_ctx(P->llm));
    const int32_t k = nm_tokenize(P->m, text, n, s.data, (int32_t)(s.capacity / sizeof(int32_t)), at0, true);
    if (k <= 0 || k >= n_ctx) { // (a prompt that leaves no room for a token is refused, as llama.cpp does)
        nm_tabm_cancel(P->llm_in, &s);
        if (k == 0) pl_record(P, r, NM_ERR_FORMAT, "llm: the prompt gives no tokens");
        else pl_record(P, r, NM_ERR_RANGE, "llm: a prompt of %s%d tokens does not fit the context of %d", k < 0 ? "over " : "",
                       k < 0 ? -k : k, n_ctx);
        return false;
    }
    *s.meta = (nm_tabm_meta){.kind = NM_TABM_TOKENS, .ndim = 1, .shape = {k}, .size = sizeof(int32_t) * (uint64_t)k,
                             .user = user, .request = r->id};
    if ((st = nm_tabm_publish(P->llm_in, &s)) != NM_OK) {
        nm_tabm_cancel(P->llm_in, &s);
        pl_record(P, r, st, "llm: its ring: %s", nm_status_str(st));
        return false;
    }
    give(P, NM_BRICK_LLM, r);
    return true;
}

// An image's parameters taken back out of the vision ring (in: they were put
// there) when the image does not follow them: this thread is its one reader
// (it steps the vision brick). 0: put_image's "failed, nothing written".
static int take_back(nm_pipeline *P, bool in) {
    nm_tabm_slot s;
    if (in && nm_tabm_acquire_read(P->img, 0, &s) == NM_OK) nm_tabm_release(P->img, &s);
    return 0;
}

// Image k of request r into the vision ring, encoded on this thread into the
// decoder's ring (a vision brick alone: the embeddings ring) with the segment
// flags `user`. 1: done; 0: failed, nothing
// written to the decoder; -1: failed, a flagged segment written (the decoder
// ends the request). The reason recorded.
static int put_image(nm_pipeline *P, pl_req *r, int32_t k, uint64_t user) {
    pl_img *im = &r->img[k];
    nm_tabm_slot s;
    char err[400] = "", name[48];
    snprintf(name, sizeof name, "%d (%s)", (int)k + 1, im->camera ? "the camera's frame" : "bytes");
    const char *what = im->path ? im->path : name;
    nm_tabm *ring = im->camera ? nm_camera_ring(im->camera) : P->img;
    nm_status st = NM_OK;
    bool params_in = false; // (an image that does not follow them: they are taken back, for the next image's sake)
    if (r->vision_params && (st = nm_tabm_acquire_write(P->img, 0, -1, &s)) == NM_OK) { // its parameters first
        const size_t n = strlen(r->vision_params);
        st = n <= s.capacity ? NM_OK : NM_ERR_RANGE;
        if (st == NM_OK) {
            memcpy(s.data, r->vision_params, n); // (the caller's, made here: not a copy between bricks)
            *s.meta = (nm_tabm_meta){.kind = NM_TABM_PARAMS, .ndim = 1, .shape = {(int64_t)n}, .size = n,
                                     .user = NM_BRICK_MORE, .request = r->id};
        }
        if (st != NM_OK || (st = nm_tabm_publish(P->img, &s)) != NM_OK) nm_tabm_cancel(P->img, &s);
        params_in = st == NM_OK;
    }
    if (st == NM_OK) st = im->camera ? pl_capture(im, err, sizeof err) : nm_tabm_acquire_write(P->img, 0, -1, &s);
    if (st != NM_OK) {
        if (im->camera) pl_record(P, r, st, "image %s: %s", what, err);
        else pl_record(P, r, st, "vision: its ring: %s", nm_status_str(st));
        return take_back(P, params_in);
    }
    size_t n = 0;
    if (im->camera) { // the frame is in the camera's slot: the brick reads it there
        s = im->slot;
        im->held = false;
        n = (size_t)s.meta->size;
    } else if (im->path) {
        st = nm_infile_read_into(im->path, 0, s.data, s.capacity, &n, err, sizeof err);
    } else if (im->n_bytes > s.capacity) {
        st = nm_fail(NM_ERR_RANGE, err, sizeof err, "%s: %zu bytes (the vision brick takes %zu)", what, im->n_bytes,
                     s.capacity);
    } else {
        nm_ledger_copy(P->ledger, P->ep_caller, P->ep_vision, s.data, im->bytes, im->n_bytes); // the caller's buffer
        n = im->n_bytes;
    }
    if (st == NM_OK && n == 0) st = nm_fail(NM_ERR_FORMAT, err, sizeof err, "%s: an empty file", what);
    if (st != NM_OK) {
        nm_tabm_cancel(ring, &s);
        pl_record(P, r, st, "image %s (%s)", err, nm_status_str(st));
        return take_back(P, params_in);
    }
    if (im->camera) { // (its shape: the pixels, as the camera set it)
        s.meta->user = user;
        s.meta->request = r->id;
    } else {
        *s.meta = (nm_tabm_meta){.kind = NM_TABM_IMAGE, .ndim = 1, .shape = {(int64_t)n}, .size = n, .user = user,
                                 .request = r->id};
    }
    if ((st = nm_tabm_publish(ring, &s)) != NM_OK) {
        nm_tabm_cancel(ring, &s);
        pl_record(P, r, st, "vision: its ring: %s", nm_status_str(st));
        return take_back(P, params_in);
    }
    const uint64_t bad = nm_brick_get_stats(P->vision).n_bad_requests;
    st = nm_brick_step(P->vision, ring, P->embd ? P->embd : P->llm_in);
    const nm_brick_stats vs = nm_brick_get_stats(P->vision);
    pthread_mutex_lock(&P->lock);
    P->L[NM_BRICK_VISION].cur = vs;
    pthread_mutex_unlock(&P->lock);
    if (st == NM_OK && !P->embd) give(P, NM_BRICK_LLM, r); // (its segment is in the decoder's ring, flagged or not)
    if (st == NM_OK) pl_traffic(P, NM_BRICK_VISION, P->vision, &(nm_brick_input){0}); // (an image at the brick's size)
    if (st != NM_OK || vs.n_bad_requests != bad) {
        // the segment it wrote is flagged: the decoder fails the request, and its DONE carries this text
        pl_record(P, r, st != NM_OK ? st : NM_ERR_FORMAT, "image %s: %s", what,
                  st != NM_OK ? nm_status_str(st) : nm_brick_last_error(P->vision));
        return st == NM_OK ? -1 : 0;
    }
    return 1;
}

// The request's LLM parameters (a JSON object, or NULL: none) with the power
// policy's pace first (a key given twice: the first counts); malloc'd. Text
// that is not an object is kept as it is (the brick refuses it).
static char *with_pace(const char *json, double tps) {
    char pace[64];
    const int k = snprintf(pace, sizeof pace, "\"max_tps\":%.6g", tps);
    const char *b = json;
    while (b && (*b == ' ' || *b == '\t' || *b == '\n' || *b == '\r')) b++;
    if (b && *b != '{') return pl_dup_s(json);
    const size_t head = b ? (size_t)(b - json) + 1 : 0, rest = b ? strlen(b + 1) : 0;
    const char *c = b ? b + 1 : NULL;
    while (c && (*c == ' ' || *c == '\t' || *c == '\n' || *c == '\r')) c++;
    const bool alone = !b || *c == '}';
    char *s = malloc(head + (size_t)k + rest + 4);
    if (!s) return NULL;
    if (b) memcpy(s, json, head);
    else s[0] = '{';
    memcpy(s + (b ? head : 1), pace, (size_t)k);
    char *t = s + (b ? head : 1) + k;
    if (!alone) *t++ = ',';
    if (b) memcpy(t, b + 1, rest + 1);
    else memcpy(t, "}", 2);
    return s;
}

// A question's place in a prompt's head (send_prompt's `head`): text no transcript holds.
#define PLACEHOLDER "\x1fthe question\x1f"

// The decoder's prompt for request r: [PARAMS], then its parts in order, the
// text between markers and each image's segment at its marker (the first part
// at position 0, each but the last with NM_BRICK_MORE). The answers thread
// ends the request. A prompt that cannot be sent goes as an empty part of a
// cancelled request, so that the decoder ends it in order (the failure
// recorded is what DONE says).
//
// head: a spoken request's images go before its transcript, so the prompt up
// to its last image does not depend on it: that head (the chat formatted
// around a placeholder question) is sent while Whisper transcribes, the
// images encoded meanwhile, and the decoder reads it. False where there is no
// such head (nothing sent: the whole prompt goes later). Then (r->head set)
// the call with the question sends the rest: what the chat has after the head.
static bool send_prompt(nm_pipeline *P, pl_req *r, const char *question, bool head) {
    if (head && (!r->audio || r->n_images == 0 || !P->p.chat || r->cascade)) return false;
    if (!head && r->prompt_ended) return false; // (its head failed: the decoder has ended it)
    if (!r->head) { // its first part: the decoder holds at most n_parallel + 1 requests (its ring's room)
        pthread_mutex_lock(&P->lock);
        while (P->L[NM_BRICK_LLM].n_open > P->n_parallel && !P->stopping) pthread_cond_wait(&P->cond, &P->lock);
        pthread_mutex_unlock(&P->lock);
    }
    char *full = P->p.chat ? chat_text(P, r, head ? PLACEHOLDER : question) : pl_with_markers(r, question);
    if (!full && !P->p.chat) pl_record(P, r, NM_ERR_NOMEM, "out of memory for the prompt");
    const size_t ml = strlen(MEDIA_MARKER);
    if (head && full) { // the placeholder after the last image, else no head
        const char *q = strstr(full, PLACEHOLDER), *m = NULL;
        for (const char *k = full; (k = strstr(k, MEDIA_MARKER)); k += ml) m = k;
        if (!q || !m || q < m || pl_n_markers(full) != r->n_images ||
            !(r->head = pl_dup_n(full, (size_t)(m + ml - full)))) {
            free(full);
            return false;
        }
    }
    const bool tail = r->head && !head; // (the head is in the decoder's ring)
    const size_t hl = tail ? strlen(r->head) : 0;
    bool ok = full != NULL, sent = tail;
    if (tail && ok && strncmp(full, r->head, hl) != 0) {
        pl_record(P, r, NM_ERR_TEMPLATE, "the chat template changed the prompt before the question");
        ok = false;
    }
    char *params = tail ? NULL : r->max_tps > 0 ? with_pace(r->llm_params, r->max_tps) : r->llm_params;
    nm_status st = NM_OK;
    if (ok && !tail && r->max_tps > 0 && !params) {
        pl_record(P, r, NM_ERR_NOMEM, "out of memory for the prompt");
        ok = false;
    }
    if (ok && params && (st = put_params(P, P->llm_in, params, r)) != NM_OK) {
        pl_record(P, r, st, "llm: the request's parameters: %s", nm_status_str(st));
        ok = false;
    }
    if (params != r->llm_params) free(params);
    sent = sent || (params != NULL && ok);
    if (ok && !tail && r->n_images > 0 && pl_n_markers(full) != r->n_images) {
        pl_record(P, r, NM_ERR_TEMPLATE, "the chat template dropped the images' places");
        ok = false;
    }
    // an empty first part still goes where the model starts a prompt with a BOS token
    const bool bos_alone = nm_tokenize(P->m, "", 0, NULL, 0, true, true) != 0;
    bool first = !tail; // (after a head: its parts are in)
    const char *p = ok ? full + hl : NULL;
    for (int32_t k = tail ? r->n_images : 0; ok && k <= r->n_images; k++) {
        const bool last = k == r->n_images;
        if (last && head) break; // (the rest once the question is known)
        const char *end = last ? p + strlen(p) : strstr(p, MEDIA_MARKER);
        const bool more = !last && (end[ml] != '\0' || k + 1 < r->n_images); // text or images follow the image
        if (end > p || (first && bos_alone) || (last && first)) {
            const uint64_t user = (first ? NM_LLM_IN_POS(0) : 0) | (last ? 0 : NM_BRICK_MORE);
            if (!(ok = put_tokens(P, r, p, (size_t)(end - p), user))) break;
            sent = true, first = false;
        }
        if (last) break;
        const int put = put_image(P, r, k, (first ? NM_LLM_IN_POS(0) : 0) | (more ? NM_BRICK_MORE : 0));
        if (put < 0) { // a flagged segment: the decoder fails the request (its DONE says why) at its last part
            if (more) pl_put_text(P, P->llm_in, -1, P->ep_llm, " ", 1, 0, r);
            r->prompt_ended = true;
            goto out;
        }
        if (!(ok = put > 0)) break;
        sent = true, first = false;
        p = end + ml;
    }
    // failed: the decoder ends what was sent of it (cancelled), or nothing was sent (a brick loaded for
    // the request, the cascade, is given its cancelled start, so that its stage ends as any other)
    if (!ok && (sent || r->cascade)) {
        nm_tabm_cancel_request(P->llm_in, r->id);
        pl_put_text(P, P->llm_in, -1, P->ep_llm, " ", 1, sent ? 0 : NM_LLM_IN_POS(0), r);
        r->prompt_ended = true;
    } else if (!ok) {
        pl_done(P, r, NM_OK, NULL);
        r->prompt_ended = true;
    }
out:
    free(full);
    return ok && head;
}

// A vision brick alone: request r's images encoded into the embeddings ring,
// each run's embeddings an EMBD event, then an empty slot ending it there
// (the embeddings thread ends the request at it: its DONE after its events).
// A failed image ends the request with the reason; the cascade loads the
// brick for it.
static void see(nm_pipeline *P, pl_req *r) {
    if (!pl_stage_begin(P, r, NM_BRICK_VISION)) {
        pl_done(P, r, NM_OK, NULL);
        return;
    }
    for (int32_t k = 0; k < r->n_images; k++) {
        pthread_mutex_lock(&P->lock);
        const bool cancelled = r->cancelled;
        pthread_mutex_unlock(&P->lock);
        if (cancelled || put_image(P, r, k, NM_BRICK_MORE) <= 0) break; // (a failure's reason recorded)
    }
    nm_tabm_slot s;
    nm_status st = nm_tabm_acquire_write(P->embd, 0, -1, &s);
    if (st == NM_OK) {
        *s.meta = (nm_tabm_meta){.kind = NM_TABM_EMBD_F32, .request = r->id};
        if ((st = nm_tabm_publish(P->embd, &s)) != NM_OK) nm_tabm_cancel(P->embd, &s);
    }
    if (st == NM_OK) pl_stage_end(P, r, NM_BRICK_VISION, &r->answer_ended);
    else pl_done(P, r, st, "vision: its ring was shut down");
    if (r->cascade) pl_done(P, r, NM_OK, NULL); // (its brick released: DONE comes after)
}

// A prompt's head was sent and its question will not be asked (not heard, no
// wake word, cancelled; its end already decided): the decoder ends the
// request (cancelled), and this thread waits until the answers thread has
// seen that end (the request and the graph's idleness are settled when the
// next request is taken).
static void end_head(nm_pipeline *P, pl_req *r) {
    if (!r->head || r->prompt_ended) return;
    nm_tabm_cancel_request(P->llm_in, r->id);
    const bool put = pl_put_text(P, P->llm_in, -1, P->ep_llm, " ", 1, 0, r) == NM_OK;
    r->prompt_ended = true;
    pthread_mutex_lock(&P->lock);
    while (put && !r->answer_ended && !P->stopping) pthread_cond_wait(&P->cond, &P->lock);
    pthread_mutex_unlock(&P->lock);
}

// Text for a pipeline with a voice and no decoder: [PARAMS], then slots of at
// most NM_TTS_MAX_TEXT bytes (a megabyte) cut after a blank, the last without
// NM_BRICK_MORE.
static void send_speech(nm_pipeline *P, pl_req *r, const char *text) {
    nm_status st = NM_OK;
    if (r->tts_params && (st = put_params(P, P->tts_in, r->tts_params, r)) != NM_OK) {
        pl_record(P, r, st, "tts: the request's parameters: %s", nm_status_str(st));
        if (r->cascade) { // (the voice loaded for it is given its cancelled end)
            nm_tabm_cancel_request(P->tts_in, r->id);
            pl_put_text(P, P->tts_in, -1, P->ep_tts, "", 0, 0, r);
        } else {
            pl_done(P, r, NM_OK, NULL);
        }
        return;
    }
    size_t n = strlen(text);
    const size_t cap = nm_tabm_max_payload(P->tts_in);
    do {
        size_t k = n;
        if (k > cap) { // cut after the last blank that fits, else at a character's start
            k = cap;
            while (k > cap / 2 && text[k - 1] != ' ' && text[k - 1] != '\n') k--;
            if (text[k - 1] != ' ' && text[k - 1] != '\n')
                for (k = cap; k > 0 && ((unsigned char)text[k] & 0xc0) == 0x80;) k--;
        }
        st = pl_put_text(P, P->tts_in, P->ep_caller, P->ep_tts, text, k, k < n ? NM_BRICK_MORE : 0, r);
        text += k, n -= k;
    } while (st == NM_OK && n > 0);
    if (st != NM_OK) {
        pl_record(P, r, st, "tts: its ring: %s", nm_status_str(st));
        pl_done(P, r, NM_OK, NULL);
    }
}

// ---- the threads -------------------------------------------------------------------------------

// The transcript of request r from the STT ring: TRANSCRIPT events, the text
// joined into *q (malloc'd). False when it failed or was cancelled (recorded).
static bool hear(nm_pipeline *P, pl_req *r, char **q) {
    size_t len = 0, cap = 256;
    char *t = malloc(cap);
    bool failed = false, cancelled = false;
    for (bool more = true; more && t;) {
        nm_tabm_slot s;
        nm_status st = nm_tabm_acquire_read(P->stt_out, -1, &s);
        if (st != NM_OK) {
            pl_record(P, r, st, "stt: its ring: %s", nm_status_str(st));
            free(t);
            return false;
        }
        const uint64_t user = s.meta->user;
        more = (user & NM_BRICK_MORE) != 0;
        failed = failed || (user & NM_BRICK_ERROR);
        cancelled = cancelled || (user & NM_BRICK_CANCELLED);
        // every segment (one of no text too, as whisper.cpp keeps them); the last slot only ends the request
        if (s.meta->kind == NM_TABM_TEXT && more && !(user & (NM_BRICK_ERROR | NM_BRICK_CANCELLED))) {
            const size_t n = (size_t)s.meta->size;
            nm_pipeline_event ev = {.kind = NM_PIPELINE_TRANSCRIPT, .request = r->id, .t0 = s.meta->shape[1],
                                    .t1 = s.meta->shape[2]};
            pl_push(P, &ev, s.data, n);
            if (!P->has[NM_BRICK_LLM] && !P->has[NM_BRICK_TTS]) { // a transcriber: the events are the transcript
                nm_tabm_release(P->stt_out, &s);
                continue;
            }
            if (!pl_reserve(&t, &cap, len + n + 1)) {
                free(t);
                t = NULL;
                nm_tabm_release(P->stt_out, &s);
                break;
            }
            // the transcript into the chat's (or the voice's) text: a copy between bricks, counted
            nm_ledger_copy(P->ledger, P->ep_stt, P->has[NM_BRICK_LLM] ? P->ep_llm : P->ep_tts, t + len, s.data, n);
            len += n;
        }
        nm_tabm_release(P->stt_out, &s);
    }
    if (!t) {
        pl_record(P, r, NM_ERR_NOMEM, "out of memory for the transcript");
        return false;
    }
    t[len] = '\0';
    pthread_mutex_lock(&P->lock);
    r->t.heard = pl_since(r);
    pthread_mutex_unlock(&P->lock);
    if (cancelled) pl_record(P, r, NM_ERR_CANCELLED, "cancelled");
    else if (failed) pl_record(P, r, NM_ERR_FORMAT, "stt: %s", nm_brick_request_error(P->stt, r->id));
    if (failed || cancelled) {
        free(t);
        return false;
    }
    *q = t;
    return true;
}

// A request that failed before its STT stage: its audio (and parameters) taken out of the STT ring unheard.
static void drop_audio(nm_pipeline *P, pl_req *r) {
    for (;;) {
        nm_tabm_slot s;
        if (nm_tabm_acquire_read(P->stt_in, 0, &s) != NM_OK) return;
        const bool last = s.meta->request != r->id || !(s.meta->user & NM_BRICK_MORE);
        nm_tabm_release(P->stt_in, &s);
        if (last) return;
    }
}

// The cascade: the answer's sentences to the voice, loaded for them.
static void cascade_speak(nm_pipeline *P, pl_req *r) {
    if (!pl_stage_begin(P, r, NM_BRICK_TTS)) {
        pl_done(P, r, NM_OK, NULL);
        return;
    }
    nm_status st = NM_OK;
    if (r->tts_params && (st = put_params(P, P->tts_in, r->tts_params, r)) != NM_OK)
        pl_record(P, r, st, "tts: the request's parameters: %s", nm_status_str(st));
    for (size_t at = 0; st == NM_OK && at < r->n_said;) {
        const size_t n = strlen(r->said + at);
        st = pl_put_text(P, P->tts_in, P->ep_llm, P->ep_tts, r->said + at, n, NM_BRICK_MORE, r);
        at += n + 1;
    }
    if (st != NM_OK) nm_tabm_cancel_request(P->tts_in, r->id);
    pl_put_text(P, P->tts_in, -1, P->ep_tts, "", 0, 0, r);
    pl_stage_end(P, r, NM_BRICK_TTS, &r->speech_ended);
}

// Request r through the graph from the front: its transcript, then its prompt
// (or its text for a voice alone); run as the cascade, each stage's brick is
// loaded for it, serves it and is released. stop: the pipeline is being freed.
static void serve(nm_pipeline *P, pl_req *r, bool stop) {
    char *question = NULL;
    pthread_mutex_lock(&P->lock);
    r->t.started = pl_since(r);
    pthread_mutex_unlock(&P->lock);
    if (!stop && !pl_frame_changed(P, r)) { // (skipped: nothing of it runs)
        if (r->audio) drop_audio(P, r);
        return;
    }
    if (r->audio) { // its audio is in the STT ring: its transcript is read in any case
        if (!pl_stage_begin(P, r, NM_BRICK_STT)) {
            drop_audio(P, r);
            pl_done(P, r, NM_OK, NULL);
            return;
        }
        give(P, NM_BRICK_STT, r);
        // its images (before its transcript) encoded, and the prompt up to them in, while Whisper runs
        if (!stop && P->has[NM_BRICK_LLM]) send_prompt(P, r, NULL, true);
        const bool heard = hear(P, r, &question);
        pl_stage_end(P, r, NM_BRICK_STT, NULL);
        if (!heard) {
            pl_done(P, r, NM_OK, NULL);
            end_head(P, r);
            return;
        }
        const char *t = question;
        while (*t == ' ') t++; // Whisper's leading blank
        if (!P->has[NM_BRICK_LLM] && !P->has[NM_BRICK_TTS]) {
            pl_done(P, r, NM_OK, NULL);
        } else if (!*t) {
            pl_done(P, r, NM_ERR_FORMAT, "no speech heard");
            end_head(P, r);
        } else {
            memmove(question, t, strlen(t) + 1);
            r->text = question; // (freed with the request's body)
            question = NULL;
        }
        free(question);
        if (r->text && !pl_woken(P, r)) end_head(P, r); // (not woken: skipped, no brick after Whisper runs for it)
        if (!r->text || r->skipped) return;
    }
    if (!stop && r->audio && (P->has[NM_BRICK_LLM] || P->has[NM_BRICK_TTS])) // (a typed question is the caller's)
        pl_push(P, &(nm_pipeline_event){.kind = NM_PIPELINE_ASKED, .request = r->id}, r->text, strlen(r->text));
    pthread_mutex_lock(&P->lock);
    const bool cancelled = r->cancelled || stop;
    if (!cancelled && P->has[NM_BRICK_LLM] && P->p.keep_history && (r->turn = pl_dup_s(r->text))) // (joined by the answer)
        for (char *m; (m = strstr(r->turn, MEDIA_MARKER));) // (its images are not part of the history)
            memmove(m, m + strlen(MEDIA_MARKER), strlen(m + strlen(MEDIA_MARKER)) + 1);
    pthread_mutex_unlock(&P->lock);
    if (cancelled) {
        pl_done(P, r, NM_ERR_CANCELLED, NULL);
        end_head(P, r);
    } else if (P->has[NM_BRICK_LLM]) {
        if (!pl_stage_begin(P, r, NM_BRICK_LLM)) {
            pl_done(P, r, NM_OK, NULL);
            return;
        }
        send_prompt(P, r, r->text, false);
        pl_stage_vision_done(P, r);
        pl_stage_end(P, r, NM_BRICK_LLM, &r->answer_ended);
        pthread_mutex_lock(&P->lock);
        const bool speak = r->cascade && !r->done && P->has[NM_BRICK_TTS] && !r->silent && r->status == NM_OK &&
                           !r->cancelled && r->n_said > 0;
        pthread_mutex_unlock(&P->lock);
        if (speak) cascade_speak(P, r);
        if (r->cascade) pl_done(P, r, NM_OK, NULL); // (its bricks released: DONE comes after)
    } else if (P->embd) {
        see(P, r);
    } else if (pl_stage_begin(P, r, NM_BRICK_TTS)) {
        send_speech(P, r, r->text);
        pl_stage_end(P, r, NM_BRICK_TTS, &r->speech_ended);
        if (r->cascade) pl_done(P, r, NM_OK, NULL);
    } else {
        pl_done(P, r, NM_OK, NULL);
    }
}

// Requests 1 .. r->id - 1 are all done. The lock held.
static bool earlier_done_locked(nm_pipeline *P, const pl_req *r) {
    while (P->done_upto + 1 < r->id) {
        const pl_req *q = pl_req_of(P, P->done_upto + 1);
        if (q && !q->announced) return false;
        P->done_upto++;
    }
    return true;
}

void *pl_feed_main(void *arg) {
    nm_pipeline *P = arg;
    for (;;) {
        pthread_mutex_lock(&P->lock);
        while (!P->q_head && !P->closed && !P->stopping) pthread_cond_wait(&P->cond, &P->lock);
        pl_req *r = P->q_head;
        if (!r) {
            pthread_mutex_unlock(&P->lock);
            break;
        }
        P->q_head = r->next;
        if (!P->q_head) P->q_tail = NULL;
        P->n_queued--;
        pthread_cond_broadcast(&P->cond); // (a submit waiting for room)
        pthread_mutex_unlock(&P->lock);
        pl_plan(P, r);
        pthread_mutex_lock(&P->lock);
        // one request at a time through the graph, or each turn after the last answer; the cascade and
        // the bricks made again with the graph idle
        const bool wait = P->p.mode != NM_PIPELINE_PIPELINED || r->cascade || r->remake ||
                          (P->p.keep_history && P->has[NM_BRICK_LLM]);
        while (wait && !earlier_done_locked(P, r) && !P->stopping) pthread_cond_wait(&P->cond, &P->lock);
        if (r->remake)
            for (int k = 1; k < 5; k++) pl_lane_idle_locked(P, (nm_brick_kind)k);
        const bool stop = P->stopping;
        pthread_mutex_unlock(&P->lock);
        if (r->remake && !stop && !pl_remake(P, r)) {
            if (r->audio) drop_audio(P, r);
            pl_done(P, r, NM_OK, NULL);
        } else {
            serve(P, r, stop);
        }
        pl_free_req_body(r); // (this thread's from the queue on: what the rest of the graph needs is in the rings)
        pthread_mutex_lock(&P->lock);
        pl_fed_locked(P, r);
        pthread_mutex_unlock(&P->lock);
    }
    return NULL;
}
