// nanomind assistant: the assistant's loop in one process, every brick on its
// own lane, joined by rings (docs/cli.md, docs/bricks.md):
//
//   question audio -> [STT lane] -> transcript --------+
//   frame (image)  -> [vision lane: this thread] ------+-> [LLM lane] -> tokens
//   tokens -> [answer thread: text on stdout, sentences] -> [TTS lane] -> speech -> [sink thread: WAV files]
//
// Pipelined: the next question is transcribed and the next frame encoded
// while the decoder answers, and an answer's first sentence is spoken while
// the rest is decoded. --sequential waits for each answer to be spoken
// before the next question starts (the baseline the benchmark compares
// with). Each question is its own request, with the same id on every ring.
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "assistant.h"

static void *lane_main(void *arg) {
    lane *L = arg;
    (void)nm_brick_run(L->b, L->in, L->out); // ends when a ring is shut down (and shuts the other)
    return NULL;
}


// The vision ring's slot: the largest frame file (at least a byte; at most
// what the brick takes: a larger file is refused when its turn comes).
static size_t frame_bytes(const app *A) {
    const size_t cap = nm_brick_in_slot_bytes(A->vision);
    if (A->watch_frames) return cap; // frames still to come: as large as the brick takes
    size_t most = 1;
    for (int i = 0; i < A->n_items; i++) {
        struct stat sb;
        if (A->items[i].frame && stat(A->items[i].frame, &sb) == 0 && (size_t)sb.st_size > most)
            most = (size_t)sb.st_size;
    }
    return most < cap ? most : cap;
}

// ---- prompts -------------------------------------------------------------------------------

// The chat for one question: [system], user (MEDIA_MARKER first when there is
// a frame) with the assistant's turn opened. malloc'd, NULL on failure.
static char *chat(const app *A, const char *question, bool frame) {
    char *content = malloc(strlen(question) + sizeof MEDIA_MARKER);
    if (!content) return NULL;
    sprintf(content, "%s%s", frame ? MEDIA_MARKER : "", question);
    nm_chat_msg msgs[2];
    size_t n = 0;
    if (A->o.system) msgs[n++] = (nm_chat_msg){"system", A->o.system};
    msgs[n++] = (nm_chat_msg){"user", content};
    nm_status st;
    char *buf = cli_chat_text(A->m, &A->o, msgs, n, &st);
    free(content);
    return buf;
}

// Tokenizes text straight into a slot of the LLM brick's input ring and
// publishes it as a part of request `id`.
static bool send_text(app *A, const char *text, uint64_t user, bool bos, uint64_t id) {
    nm_tabm_slot sl;
    nm_status st = nm_tabm_acquire_write(A->llm_in, 0, -1, &sl);
    if (st != NM_OK) return false;
    const int32_t cap = (int32_t)(sl.capacity / sizeof(int32_t));
    int32_t n = nm_tokenize(A->m, text, strlen(text), sl.data, cap, bos, true);
    if (n <= 0 || n >= nm_ctx_n_ctx(nm_brick_llm_ctx(A->llm))) {
        fprintf(stderr, "error: question %llu: %s\n", (unsigned long long)id,
                n == 0 ? "the prompt gives no tokens" : "the prompt does not fit the context (-c)");
        n = 0; // an empty part: the brick fails the request, flagged
    }
    if (id >= 1 && id <= (uint64_t)A->cap_items) A->items[id - 1].n_prompt += n > 0 ? n : 0;
    sl.meta->kind = NM_TABM_TOKENS;
    sl.meta->ndim = n > 0 ? 1 : 0;
    sl.meta->shape[0] = n;
    sl.meta->size = sizeof(int32_t) * (uint64_t)n;
    sl.meta->user = user;
    sl.meta->request = id;
    if ((st = nm_tabm_publish(A->llm_in, &sl)) != NM_OK) {
        nm_tabm_cancel(A->llm_in, &sl);
        return false;
    }
    return true;
}

static bool encode_frame(app *A, nm_tabm *ring, nm_tabm_slot *slot, const char *path, uint64_t id);

// The frame's file (or the camera's newest frame, where the camera wrote it)
// into the vision brick's slot, encoded on this thread into the LLM brick's
// ring (the segment flagged MORE: the question follows).
static bool send_frame(app *A, const char *path, uint64_t id) {
    nm_tabm_slot sl;
    if (A->camera_dev && !A->camera) return false; // the camera went during this question
    if (A->camera) {
        if (A->cam_held) sl = A->cam_slot; // (taken by the --frame-change gate)
        else if (!assistant_camera_frame(A, &sl)) return false;
        A->cam_held = false;
        return encode_frame(A, A->cam_ring, &sl, path, id);
    }
    if (nm_tabm_acquire_write(A->img, 0, -1, &sl) != NM_OK) return false;
    size_t n = 0;
    char ferr[512];
    const bool bad = nm_infile_read_into(path, 0, sl.data, sl.capacity, &n, ferr, sizeof ferr) != NM_OK;
    sl.meta->kind = NM_TABM_IMAGE;
    sl.meta->ndim = !bad && n > 0 ? 1 : 0;
    sl.meta->shape[0] = bad ? 0 : (int64_t)n;
    sl.meta->size = bad ? 0 : n; // an unreadable or oversized file: an empty slot, failed by the brick
    if (bad) fprintf(stderr, "error: frame %s\n", ferr);
    return encode_frame(A, A->img, &sl, path, id);
}

// A frame's slot (held for write in `ring`) published as request id's and
// encoded by the vision brick on this thread.
static bool encode_frame(app *A, nm_tabm *ring, nm_tabm_slot *slot, const char *path, uint64_t id) {
    nm_tabm_slot sl = *slot;
    sl.meta->user = NM_BRICK_MORE;
    sl.meta->request = id;
    if (nm_tabm_publish(ring, &sl) != NM_OK) {
        nm_tabm_cancel(ring, &sl);
        return false;
    }
    const uint64_t bad = nm_brick_get_stats(A->vision).n_bad_requests;
    nm_status st = nm_brick_step(A->vision, ring, A->llm_in);
    if (st == NM_OK && nm_brick_get_stats(A->vision).n_bad_requests != bad)
        fprintf(stderr, "error: frame %s: %s\n", path, nm_brick_last_error(A->vision));
    nm_brick_cost c = {0}; // the encoder's traffic, and its rows in the prompt
    if (st == NM_OK && nm_brick_estimate(A->vision, &(nm_brick_input){0}, &c) == NM_OK) {
        pthread_mutex_lock(&A->lock);
        A->dram[1] += c.weight_bytes_read + c.act_bytes;
        pthread_mutex_unlock(&A->lock);
        if (id >= 1 && id <= (uint64_t)A->cap_items) A->items[id - 1].n_prompt += (int32_t)c.n_out;
    }
    return st == NM_OK;
}

// The question's audio decoded straight into the STT brick's slot (nothing
// copied), published as request `id`. False: the question is skipped.
static bool send_audio(app *A, item *it, uint64_t id) {
    nm_tabm_slot sl;
    if (nm_tabm_acquire_write(A->pcm, 0, -1, &sl) != NM_OK) return false;
    char err[512];
    int64_t n = 0;
    nm_status st = nm_audio_load_into(it->audio, 16000, sl.data, (int64_t)(sl.capacity / sizeof(float)), &n, err,
                                      sizeof err);
    if (st != NM_OK) {
        if (st == NM_ERR_RANGE)
            fprintf(stderr, "error: question %s: longer than %d s\n", it->audio, MAX_QUESTION_S);
        else
            fprintf(stderr, "error: question %s: %s (%s)\n", it->audio, err, nm_status_str(st));
        nm_tabm_cancel(A->pcm, &sl);
        return false;
    }
    *sl.meta = (nm_tabm_meta){.kind = NM_TABM_PCM_F32, .ndim = 1, .shape = {n}, .size = sizeof(float) * (uint64_t)n,
                              .sample_rate = 16000, .request = id};
    if (nm_tabm_publish(A->pcm, &sl) != NM_OK) {
        nm_tabm_cancel(A->pcm, &sl);
        return false;
    }
    add_traffic(A, 0, A->stt, (nm_brick_input){.n_samples = n});
    return true;
}

// The STT brick's segments of request id, joined into it->question.
static bool read_transcript(app *A, item *it, uint64_t id) {
    size_t len = 0;
    bool failed = false;
    for (;;) {
        nm_tabm_slot s;
        if (nm_tabm_acquire_read(A->heard, -1, &s) != NM_OK) return false;
        const uint64_t user = s.meta->user;
        if (s.meta->request == id && !(user & NM_BRICK_ERROR)) {
            const char *t = s.data;
            size_t n = (size_t)s.meta->size;
            if (len == 0)
                while (n > 0 && *t == ' ') t++, n--; // Whisper's leading blank
            if (len + n >= sizeof it->question) n = sizeof it->question - 1 - len;
            // the transcript into the chat's text (then tokenized into the decoder's slot): counted
            nm_ledger_copy(A->ledger, A->ep_stt, A->ep_llm, it->question + len, t, n);
            len += n;
        }
        failed = failed || (user & NM_BRICK_ERROR);
        nm_tabm_release(A->heard, &s);
        if (!(user & NM_BRICK_MORE)) break;
    }
    it->question[len] = '\0';
    if (failed)
        fprintf(stderr, "error: question %s: %s\n", it->audio ? it->audio : "(microphone)", nm_brick_last_error(A->stt));
    return !failed && len > 0;
}

// A brick serving one request on a thread of its own (the cascade's bricks,
// and Whisper on a heard question, whose audio waits in the microphone's ring).
typedef struct step_arg {
    nm_brick *b;
    nm_tabm *in, *out;
    nm_status st;
} step_arg;
static void *step_main(void *p) {
    step_arg *a = p;
    a->st = nm_brick_step(a->b, a->in, a->out);
    return NULL;
}

// Whisper serves the question's audio on a thread of its own (*th; false if it
// did not start: can false, or no thread). A heard question's audio waits in
// the microphone's ring: its traffic is counted here, and it is taken out
// unheard when Whisper does not start, so that the next question's is next.
static bool start_whisper(app *A, const item *it, bool can, step_arg *sa, pthread_t *th) {
    *sa = (step_arg){A->stt, A->pcm, A->heard, NM_OK};
    const bool started = can && pthread_create(th, NULL, step_main, sa) == 0;
    if (it->from_mic) {
        nm_tabm_slot lost;
        if (!started && nm_tabm_acquire_read(A->pcm, 0, &lost) == NM_OK) nm_tabm_release(A->pcm, &lost);
        add_traffic(A, 0, A->stt, (nm_brick_input){.n_samples = it->n_heard});
    }
    return started;
}

// Waits for --sequential, and for the end: counter >= n.
static void wait_for(app *A, int *counter, int n, bool *gone) {
    pthread_mutex_lock(&A->lock);
    while (*counter < n && !*gone) pthread_cond_wait(&A->cond, &A->lock);
    pthread_mutex_unlock(&A->lock);
}

// One question: its audio to the STT lane, its frame through the vision
// brick (on this thread) while Whisper transcribes, then the question's text.
static void ask(app *A, int i) {
    item *it = &A->items[i];
    const uint64_t id = (uint64_t)i + 1;
    if (!it->from_mic && !A->cascading) it->t_start = now(A); // (a heard question's end is when the cutter closed it)
    const bool spoken = (it->audio || it->from_mic) && !A->cascading; // (the cascade transcribed it already)
    // a heard question's audio waits in the microphone's ring: Whisper serves it now, on a thread of its own
    step_arg stt;
    pthread_t th_stt;
    const bool stepping = spoken && it->from_mic && start_whisper(A, it, true, &stt, &th_stt);
    const bool heard = stepping || (spoken && it->audio && send_audio(A, it, id));
    bool sent_first = false; // a part of the prompt is in the ring: the rest must follow
    bool ok = true;
    if (it->frame && A->vision) {
        char *probe = chat(A, SENTINEL, true);
        char *mark = probe ? strstr(probe, MEDIA_MARKER) : NULL;
        if (mark) {
            *mark = '\0';
            sent_first = send_text(A, probe, NM_LLM_IN_POS(0) | NM_BRICK_MORE, true, id);
            ok = sent_first && send_frame(A, it->frame, id);
        }
        ok = ok && mark;
        free(probe);
    }
    if (spoken) ok = heard && read_transcript(A, it, id) && ok; // (the transcript is read in any case)
    if (stepping) pthread_join(th_stt, NULL);
    if (spoken && heard && !ok && !it->question[0]) fprintf(stderr, "question %d: no speech heard\n", i + 1);
    if (spoken && ok && !assistant_woken(A, it, i)) ok = false; // (skipped: not a failure)
    it->t_heard = now(A);
    char *full = ok ? chat(A, it->question, it->frame && A->vision) : NULL;
    const char *rest = full;
    if (full && sent_first) { // the part after the image: what the full chat has after its marker
        const char *mark = strstr(full, MEDIA_MARKER);
        rest = mark ? mark + strlen(MEDIA_MARKER) : NULL;
    }
    if (!rest) {
        // The request still goes through the decoder, cancelled: the brick drops
        // what was sent of it and ends it, so its (empty) answer and its speech
        // end in order with the others'.
        it->failed = !it->skipped;
        nm_tabm_cancel_request(A->llm_in, id);
        send_text(A, " ", sent_first ? 0 : NM_LLM_IN_POS(0), false, id);
    } else {
        send_text(A, rest, sent_first ? 0 : NM_LLM_IN_POS(0), !sent_first, id);
    }
    free(full);
}

// ---- answers ---------------------------------------------------------------------------

typedef struct sentence {
    nm_tabm_slot s;
    bool held;
    size_t len;
} sentence;

static void say_out(app *A, sentence *S, uint64_t id, bool more) {
    if (!S->held) {
        if (more) return; // nothing to say yet
        if (nm_tabm_acquire_write(A->say, 0, -1, &S->s) != NM_OK) return;
        S->len = 0;
    }
    nm_tabm_meta *m = S->s.meta;
    *m = (nm_tabm_meta){.kind = NM_TABM_TEXT, .ndim = S->len ? 1 : 0, .shape = {(int64_t)S->len}, .size = S->len,
                        .user = more ? NM_BRICK_MORE : 0, .request = id};
    if (nm_tabm_publish(A->say, &S->s) != NM_OK) nm_tabm_cancel(A->say, &S->s);
    S->held = false;
}

// The policy's decode cap: the reader holds each token until its time, and
// the full token ring holds the decoder (it waits, idle, for a free slot).
static void pace(app *A, const item *it) {
    pthread_mutex_lock(&A->lock);
    const double cap = A->decode_cap;
    pthread_mutex_unlock(&A->lock);
    if (cap <= 0) return;
    const double due = it->t_first_tok + (it->n_tokens - 1) / cap, t = now(A);
    if (due > t) {
        struct timespec ts = {(time_t)(due - t), (long)((due - t - (double)(time_t)(due - t)) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

// An answer's end: its unpaced speed is what the policy's decode share scales.
static void note_speed(app *A, const item *it, double t_end) {
    pthread_mutex_lock(&A->lock);
    if (A->decode_cap <= 0 && it->n_tokens > 1 && t_end > it->t_first_tok)
        A->full_tps = (it->n_tokens - 1) / (t_end - it->t_first_tok);
    pthread_mutex_unlock(&A->lock);
}

// One token of an answer: its time, its count, the policy's pace, and its
// text into piece, printed as it comes. The piece's length (0 while the
// detokenizer holds bytes back).
static int32_t answer_piece(app *A, item *it, nm_detok *dt, int32_t tok, char *piece, int32_t size) {
    if (it->t_first_tok == 0) it->t_first_tok = now(A);
    it->n_tokens++;
    pace(A, it);
    const int32_t pn = nm_detok_push(A->m, dt, tok, piece, size);
    if (pn > 0) {
        fwrite(piece, 1, (size_t)pn, stdout);
        fflush(stdout);
    }
    return pn;
}

// Where an answer is cut into the voice's slots, the pipelined reader's and
// the cascade's alike: before a piece that starts with a blank after a
// sentence's end (. ! ?), and after a line's end.
static bool ends_sentence(const char *piece, int32_t pn) {
    const char last = piece[pn - 1];
    return last == '.' || last == '!' || last == '?';
}
static bool cut_before(bool ended_sentence, const char *piece) {
    return ended_sentence && (piece[0] == ' ' || piece[0] == '\n');
}
static bool cut_after(const char *piece, int32_t pn) { return piece[pn - 1] == '\n'; }

// A TEXT slot of the voice's ring held for the sentence being read; false if none can be had.
static bool say_hold(app *A, sentence *S) {
    if (S->held) return true;
    if (nm_tabm_acquire_write(A->say, 0, -1, &S->s) != NM_OK) return false;
    S->held = true;
    S->len = 0;
    return true;
}

// Reads the decoder's tokens: the text to stdout as it comes, and, with a
// voice, into TEXT slots for the TTS brick, one sentence each, detokenized
// straight into the slot (it is what this thread makes; the TTS brick reads
// it there).
static void *answers_main(void *arg) {
    app *A = arg;
    uint64_t cur = 0;
    nm_detok dt = {0};
    sentence S = {0};
    bool ended_sentence = false;
    for (;;) {
        nm_tabm_slot sl;
        if (nm_tabm_acquire_read(A->tok, -1, &sl) != NM_OK) break;
        const uint64_t id = sl.meta->request, user = sl.meta->user;
        item *it = id >= 1 && id <= (uint64_t)A->cap_items ? &A->items[id - 1] : NULL;
        if (id != cur && it) {
            cur = id;
            memset(&dt, 0, sizeof dt);
            ended_sentence = false;
            it->t_first_tok = 0;
            if (!it->skipped) printf("> %s\n", it->question);
        }
        const int32_t *toks = sl.data;
        const int32_t n = sl.meta->ndim == 1 ? (int32_t)sl.meta->shape[0] : 0;
        for (int32_t k = 0; k < n && it; k++) {
            char piece[256];
            const int32_t pn = answer_piece(A, it, &dt, toks[k], piece, (int32_t)sizeof piece);
            if (pn <= 0 || !A->tts) continue;
            if (cut_before(ended_sentence, piece)) say_out(A, &S, id, true);
            if (!say_hold(A, &S)) continue;
            if (S.len + (size_t)pn > S.s.capacity) say_out(A, &S, id, true); // a very long sentence: cut
            if (!say_hold(A, &S)) continue;
            // the text this thread makes from the tokens, written once into the TTS brick's slot
            memcpy((char *)S.s.data + S.len, piece, (size_t)pn);
            S.len += (size_t)pn;
            it->n_said += (size_t)pn;
            ended_sentence = ends_sentence(piece, pn);
            if (cut_after(piece, pn)) say_out(A, &S, id, true);
        }
        nm_tabm_release(A->tok, &sl);
        if (user & NM_BRICK_MORE || !it) continue;
        // the answer's end
        if (!it->skipped) printf("\n");
        fflush(stdout);
        const nm_llm_stop why = NM_LLM_STOP_OF(user);
        if (user & NM_BRICK_ERROR) {
            fprintf(stderr, "error: question %llu: %s\n", (unsigned long long)id, nm_brick_last_error(A->llm));
            it->failed = true;
        } else if (why == NM_LLM_STOP_CTX_FULL) {
            fprintf(stderr, "[question %llu: the context is full]\n", (unsigned long long)id);
        }
        if (A->tts) say_out(A, &S, id, false);
        add_traffic(A, 2, A->llm, (nm_brick_input){.n_tokens = it->n_prompt, .n_predict = it->n_tokens});
        add_traffic(A, 3, A->tts, (nm_brick_input){.n_bytes = (int64_t)it->n_said});
        note_speed(A, it, now(A));
        pthread_mutex_lock(&A->lock);
        it->t_answered = now(A);
        if (!A->tts) A->n_spoken++;
        pthread_cond_broadcast(&A->cond);
        pthread_mutex_unlock(&A->lock);
    }
    if (S.held) nm_tabm_cancel(A->say, &S.s);
    if (A->say) nm_tabm_shutdown(A->say); // the voice ends too, and the speech thread after it
    pthread_mutex_lock(&A->lock);
    A->answers_gone = true;
    pthread_cond_broadcast(&A->cond);
    pthread_mutex_unlock(&A->lock);
    return NULL;
}

// Writes each answer's speech to OUT/answer-NNN.wav as it comes (the slots'
// samples straight to the file).
static void *speech_main(void *arg) {
    app *A = arg;
    nm_outfile f = {0};
    bool open = false, bad = false;
    uint64_t bytes = 0;
    char path[4096], err[512];
    const int32_t rate = nm_brick_tts_sample_rate(A->tts);
    for (;;) {
        nm_tabm_slot s;
        if (nm_tabm_acquire_read(A->speech, -1, &s) != NM_OK) break;
        const uint64_t id = s.meta->request, user = s.meta->user;
        item *it = id >= 1 && id <= (uint64_t)A->cap_items ? &A->items[id - 1] : NULL;
        if (!open && it && !A->player) {
            snprintf(path, sizeof path, "%s/answer-%03llu.wav", A->out_dir, (unsigned long long)id);
            bad = nm_outfile_open(&f, path, err, sizeof err) != NM_OK;
            uint8_t h[NM_WAV_HEADER_BYTES];
            nm_audio_wav_header(h, 0, rate, 1);
            bad = bad || fwrite(h, 1, sizeof h, f.f) != sizeof h;
            if (bad) fprintf(stderr, "error: %s: %s\n", path, err[0] ? err : strerror(errno));
            open = true;
            bytes = 0;
        }
        if (it && s.meta->size > 0) {
            if (it->t_first_audio == 0) it->t_first_audio = now(A);
            it->n_samples += (int64_t)(s.meta->size / 2);
            if (A->player && !bad && nm_audio_player_write(A->player, s.data, (int64_t)(s.meta->size / 2), err,
                                                           sizeof err) != NM_OK) { // the slot's samples, in place
                fprintf(stderr, "error: speaker: %s\n", err);
                bad = true;
            } else if (!A->player && !bad && fwrite(s.data, 1, (size_t)s.meta->size, f.f) != s.meta->size) {
                fprintf(stderr, "error: %s: %s\n", path, strerror(errno));
                bad = true;
            }
            bytes += s.meta->size;
        }
        nm_tabm_release(A->speech, &s);
        if ((user & NM_BRICK_MORE) || !it) continue;
        if (open && !bad) {
            uint8_t h[NM_WAV_HEADER_BYTES];
            nm_audio_wav_header(h, (uint32_t)bytes, rate, 1);
            if (!f.seekable || fseek(f.f, 0, SEEK_SET) != 0 || fwrite(h, 1, sizeof h, f.f) != sizeof h ||
                nm_outfile_commit(&f, err, sizeof err) != NM_OK) {
                fprintf(stderr, "error: %s: %s\n", path, err[0] ? err : "cannot write the header");
                nm_outfile_abort(&f);
            }
        } else if (open) {
            nm_outfile_abort(&f);
        }
        open = false;
        pthread_mutex_lock(&A->lock);
        it->t_spoken = now(A);
        A->n_spoken++;
        pthread_cond_broadcast(&A->cond);
        pthread_mutex_unlock(&A->lock);
    }
    if (open) nm_outfile_abort(&f);
    pthread_mutex_lock(&A->lock);
    A->speech_gone = true;
    pthread_cond_broadcast(&A->cond);
    pthread_mutex_unlock(&A->lock);
    return NULL;
}

// ---- the command ---------------------------------------------------------------------------

// The battery policy's threads target into the bricks' parameters, for the loads to come.
static void policy_threads(app *A) {
    if (A->threads_now > 0) A->lp.n_threads = A->vp.n_threads = A->sp.n_threads = A->threads_now;
}

// Loads the bricks the parameters ask for (the vision brick feeds the LLM brick).
static nm_status load_bricks(app *A) {
    char err[512];
    nm_status st;
    policy_threads(A);
    if ((st = nm_brick_load(NULL, &A->lp, &A->llm, err, sizeof err)) != NM_OK) {
        fprintf(stderr, "error: the language model's brick: %s: %s\n", nm_status_str(st), err);
        return st;
    }
    A->vp.feeds = A->llm;
    if (A->vp.model && (st = nm_brick_load(NULL, &A->vp, &A->vision, err, sizeof err)) != NM_OK) {
        cli_load_error(A->vp.model, st, err, CLI_WANT_MMPROJ);
        return st;
    }
    if (A->sp.model && (st = nm_brick_load(NULL, &A->sp, &A->stt, err, sizeof err)) != NM_OK) {
        cli_load_error(A->sp.model, st, err, CLI_WANT_WHISPER);
        return st;
    }
    if (A->out_dir && !A->no_voice && (st = nm_brick_load(NULL, &A->tp, &A->tts, err, sizeof err)) != NM_OK) {
        fprintf(stderr, "error: the voice: %s: %s\n", nm_status_str(st), err);
        return st;
    }
    if (A->tts) A->tts_rate = nm_brick_tts_sample_rate(A->tts);
    return NM_OK;
}

// A brick's counters into A->acc[k] before it is freed (0 stt, 1 vision, 2 llm, 3 tts).
static void keep_stats(app *A, int k, const nm_brick *b) {
    if (!b) return;
    nm_brick_stats bs = nm_brick_get_stats(b);
    snprintf(A->acc[k].name, sizeof A->acc[k].name, "%s", nm_brick_name(b));
    snprintf(A->acc[k].device, sizeof A->acc[k].device, "%s", nm_brick_device(b));
    A->acc[k].n += bs.n_requests;
    A->acc[k].busy += bs.t_busy;
    const nm_brick_params *p = k == 0 ? &A->sp : k == 1 ? &A->vp : k == 2 ? &A->lp : &A->tp;
    const int32_t cores = nm_cpu_count();
    A->acc[k].threads = k == 3 ? 1 : p->n_threads > 0 && p->n_threads < cores ? p->n_threads : cores; // espeak-ng: one
    A->acc[k].thread_s += bs.t_busy * A->acc[k].threads; // (the policy may change the threads between loads)
}

static void free_bricks(app *A) {
    keep_stats(A, 0, A->stt);
    keep_stats(A, 1, A->vision);
    keep_stats(A, 2, A->llm);
    keep_stats(A, 3, A->tts);
    nm_brick_free(A->vision);
    nm_brick_free(A->stt);
    nm_brick_free(A->tts);
    nm_brick_free(A->llm);
    A->vision = A->stt = A->tts = A->llm = NULL;
}

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

// --plan: the planner places the bricks on the profiled units from their
// estimates for a typical question (3 s of speech, a frame at the encoder's
// size, 40 tokens of text around it, -n tokens of answer, ~4 bytes of text a
// token spoken); the plan is printed and the bricks are loaded again there.
// 0, or an exit status.
static int place_by_plan(app *A) {
    int rc = cli_load_units(A->o.profile, A->units, &A->n_units);
    if (rc) return rc;
    nm_plan_brick b[4];
    nm_brick *which[4];
    int32_t n = 0;
    nm_status st = NM_OK;
    int64_t image_rows = 0;
    memset(b, 0, sizeof b);
    if (A->stt) {
        b[n] = (nm_plan_brick){.kind = NM_BRICK_STT, .name = "stt", .units = nm_brick_impl(A->stt)->units};
        which[n] = A->stt;
        st = nm_brick_estimate(A->stt, &(nm_brick_input){.n_samples = 3 * 16000}, &b[n++].cost);
    }
    if (st == NM_OK && A->vision) {
        b[n] = (nm_plan_brick){.kind = NM_BRICK_VISION, .name = "vision", .units = nm_brick_impl(A->vision)->units};
        which[n] = A->vision;
        st = nm_brick_estimate(A->vision, &(nm_brick_input){0}, &b[n].cost);
        image_rows = b[n++].cost.n_out;
    }
    const int64_t n_predict = A->lp.llm.n_predict;
    if (st == NM_OK) {
        b[n] = (nm_plan_brick){.kind = NM_BRICK_LLM, .name = "llm", .units = nm_brick_impl(A->llm)->units,
                               .n_layer = nm_model_n_layer(A->m)};
        which[n] = A->llm;
        const nm_brick_input li = {.n_tokens = 40 + image_rows, .n_predict = n_predict};
        st = nm_brick_estimate(A->llm, &li, &b[n].cost);
        if (st == NM_OK)
            st = nm_brick_estimate(A->llm, &(nm_brick_input){.n_past = li.n_tokens, .n_predict = n_predict},
                                   &b[n].decode);
        n++;
    }
    if (st == NM_OK && A->tts) {
        b[n] = (nm_plan_brick){.kind = NM_BRICK_TTS, .name = "tts", .units = nm_brick_impl(A->tts)->units};
        which[n] = A->tts;
        st = nm_brick_estimate(A->tts, &(nm_brick_input){.n_bytes = 4 * n_predict}, &b[n++].cost);
    }
    if (st != NM_OK) {
        fprintf(stderr, "error: a brick's estimate: %s\n", nm_status_str(st));
        return 1;
    }
    nm_plan p;
    char err[512], buf[4096];
    // under the battery's constraint (proportional), the fewest joules; else the goal asked for
    const nm_plan_goal goal = A->battery && A->policy.state == NM_POWER_PROPORTIONAL ? NM_PLAN_ENERGY
                                                                                       : (nm_plan_goal)A->o.plan_goal;
    if ((st = nm_plan_make(A->units, A->n_units, b, n, goal, &p, err, sizeof err)) != NM_OK) {
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
        nm_brick_params *bp = which[i] == A->llm ? &A->lp : which[i] == A->vision ? &A->vp
                              : which[i] == A->stt ? &A->sp : &A->tp;
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
        bp->device = dev;
        bp->cores = cores;
        if (which[i] == A->llm) bp->n_gpu_layers = ngl;
        fprintf(stderr, "placed: %s on %s%s%s", b[i].name, dev, cores ? ", cores " : "", cores ? cores : "");
        if (ngl >= 0) fprintf(stderr, ", its last %d layers there and the others on the CPU", ngl);
        fprintf(stderr, "\n");
    }
    free_bricks(A);
    return load_bricks(A) == NM_OK ? 0 : 1;
}

// ---- the cascade ---------------------------------------------------------------------------
// The critical battery state (or --cascade): each brick is loaded, runs this
// question once and is released before the next one loads, and only the
// transcript and the answer (text) pass between them; the frame's embeddings
// go straight into the decoder's input ring (the decoder's brick is made, its
// weights mapped and not yet read, while the encoder runs). Nothing stays
// resident between questions but the process itself.

// The peak RSS from here on (Linux: clear_refs 5 resets VmHWM), and what it is now.
static void peak_reset(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (f) {
        fputs("5", f);
        fclose(f);
    }
}
static long peak_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %ld", &kb) == 1) break;
    if (f) fclose(f);
    return kb;
}
static void stage_done(app *A, int k) {
    long kb = peak_kb();
    if (kb > A->stage_peak_kb[k]) A->stage_peak_kb[k] = kb;
}

static void free_ring(nm_tabm **r) {
    nm_tabm_free(*r);
    *r = NULL;
}

// The decoder's answer to request id from A->tok, printed as it comes and
// returned (malloc'd; NULL when it failed), with where the pipelined reader
// would cut it into the voice's slots (cuts[], at most MAX_CUTS: after a
// line's end, before the blank after a sentence's end), so that both speak
// alike. The decoder runs on another thread.
#define MAX_CUTS 256
static char *collect_answer(app *A, item *it, uint64_t id, size_t *cuts, int *n_cuts) {
    nm_detok dt = {0};
    size_t cap = 1024, len = 0;
    char *text = malloc(cap);
    bool failed = text == NULL, ended_sentence = false;
    *n_cuts = 0;
    printf("> %s\n", it->question);
    for (;;) {
        nm_tabm_slot sl;
        if (nm_tabm_acquire_read(A->tok, -1, &sl) != NM_OK) {
            failed = true;
            break;
        }
        const uint64_t user = sl.meta->user;
        const int32_t *toks = sl.data;
        const int32_t n = sl.meta->request == id && sl.meta->ndim == 1 ? (int32_t)sl.meta->shape[0] : 0;
        for (int32_t k = 0; k < n; k++) {
            char piece[256];
            const int32_t pn = answer_piece(A, it, &dt, toks[k], piece, (int32_t)sizeof piece);
            if (pn <= 0) continue;
            if (text && len + (size_t)pn + 1 > cap) {
                char *t = realloc(text, cap * 2 + (size_t)pn);
                if (!t) {
                    failed = true;
                    continue;
                }
                text = t;
                cap = cap * 2 + (size_t)pn;
            }
            if (cut_before(ended_sentence, piece) && *n_cuts < MAX_CUTS) cuts[(*n_cuts)++] = len;
            if (text) {
                memcpy(text + len, piece, (size_t)pn);
                len += (size_t)pn;
            }
            ended_sentence = ends_sentence(piece, pn);
            if (cut_after(piece, pn) && *n_cuts < MAX_CUTS) cuts[(*n_cuts)++] = len;
        }
        nm_tabm_release(A->tok, &sl);
        if (user & NM_BRICK_MORE) continue;
        if (user & NM_BRICK_ERROR) {
            fprintf(stderr, "error: question %llu: %s\n", (unsigned long long)id, nm_brick_last_error(A->llm));
            failed = true;
        }
        break;
    }
    printf("\n");
    fflush(stdout);
    if (failed) {
        free(text);
        return NULL;
    }
    text[len] = '\0';
    return text;
}

// The answer spoken into OUT/answer-NNN.wav: the voice loaded, fed the text a
// sentence (or a slot) at a time while its samples are written, released.
static bool cascade_speak(app *A, item *it, uint64_t id, const char *text, const size_t *cuts, int n_cuts) {
    char err[512];
    nm_status st;
    peak_reset();
    if ((st = nm_brick_load(NULL, &A->tp, &A->tts, err, sizeof err)) != NM_OK) {
        fprintf(stderr, "error: the voice: %s: %s\n", nm_status_str(st), err);
        return false;
    }
    A->tts_rate = nm_brick_tts_sample_rate(A->tts);
    if (A->speaker_dev && !A->player &&
        nm_audio_player_open(A->speaker_dev, A->tts_rate, &A->player, err, sizeof err) != NM_OK) {
        fprintf(stderr, "speaker skipped: %s: the answers are printed, not spoken\n", err); // an absent device
        A->no_voice = true;
        nm_brick_free(A->tts);
        A->tts = NULL;
        return true;
    }
    bool ok = nm_tabm_create(NULL, 16, SAY_SLOT_BYTES, &A->say, err, sizeof err) == NM_OK &&
              nm_tabm_create(NULL, SPEECH_SLOTS, nm_brick_out_slot_bytes(A->tts), &A->speech, err, sizeof err) == NM_OK;
    step_arg sa = {A->tts, A->say, A->speech, NM_OK};
    pthread_t th_step, th_sink;
    bool step = false, sink = false;
    A->speech_gone = false;
    if (ok) sink = pthread_create(&th_sink, NULL, speech_main, A) == 0;
    if (sink) step = pthread_create(&th_step, NULL, step_main, &sa) == 0;
    ok = ok && sink && step;
    // the text in slots, cut where the pipelined reader cuts it (and at SAY_SLOT_BYTES), the last one
    // (maybe empty) ending the request
    const size_t len = strlen(text);
    size_t at = 0;
    for (int c = 0; ok && c <= n_cuts; c++) {
        const size_t end = c < n_cuts ? cuts[c] : len;
        const bool last = c == n_cuts;
        while (ok && (at < end || last)) {
            nm_tabm_slot sl;
            if (nm_tabm_acquire_write(A->say, 0, -1, &sl) != NM_OK) {
                ok = false;
                break;
            }
            const size_t n = end - at < sl.capacity ? end - at : sl.capacity;
            memcpy(sl.data, text + at, n);
            at += n;
            const bool more = !(last && at == end);
            *sl.meta = (nm_tabm_meta){.kind = NM_TABM_TEXT, .ndim = n ? 1 : 0, .shape = {(int64_t)n}, .size = n,
                                      .user = more ? NM_BRICK_MORE : 0, .request = id};
            if (nm_tabm_publish(A->say, &sl) != NM_OK) {
                nm_tabm_cancel(A->say, &sl);
                ok = false;
            }
            if (!more) break;
        }
    }
    if (step) pthread_join(th_step, NULL);
    if (A->speech) nm_tabm_shutdown(A->speech); // the sink drains the answer's samples and ends
    if (sink) pthread_join(th_sink, NULL);
    ok = ok && sa.st == NM_OK;
    if (!ok) fprintf(stderr, "error: question %llu: the voice failed%s%s\n", (unsigned long long)id, err[0] ? ": " : "",
                     err);
    it->n_said = len;
    add_traffic(A, 3, A->tts, (nm_brick_input){.n_bytes = (int64_t)len});
    keep_stats(A, 3, A->tts);
    nm_brick_free(A->tts);
    A->tts = NULL;
    free_ring(&A->say);
    free_ring(&A->speech);
    stage_done(A, 3);
    return ok;
}

// One question as the cascade: Whisper, then the decoder with the frame's
// encoder feeding it, then the voice; each released before the next loads.
static void cascade_question(app *A, int i) {
    item *it = &A->items[i];
    const uint64_t id = (uint64_t)i + 1;
    char err[512];
    nm_status st;
    if (!it->from_mic) it->t_start = now(A); // (a heard question's end is when the cutter closed it)
    A->n_cascaded++;
    policy_threads(A);
    pthread_mutex_lock(&A->lock);
    const int spoken0 = A->n_spoken;
    pthread_mutex_unlock(&A->lock);
    bool ok = true;
    if (it->audio || it->from_mic) { // Whisper: load, transcribe, release
        peak_reset();
        if ((st = nm_brick_load(NULL, &A->sp, &A->stt, err, sizeof err)) != NM_OK) {
            cli_load_error(A->sp.model, st, err, CLI_WANT_WHISPER);
            ok = false;
        }
        if (ok) A->ep_stt = nm_ledger_endpoint(A->ledger, nm_brick_name(A->stt));
        // a file's audio goes into a ring of one slot made for it; a heard question's waits in the microphone's
        ok = ok && (it->from_mic ||
                    nm_tabm_create(NULL, 1, sizeof(float) * 16000 * MAX_QUESTION_S, &A->pcm, err, sizeof err) == NM_OK) &&
             nm_tabm_create(NULL, 64, nm_brick_out_slot_bytes(A->stt), &A->heard, err, sizeof err) == NM_OK;
        ok = ok && (it->from_mic || send_audio(A, it, id));
        step_arg sa;
        pthread_t th;
        const bool started = start_whisper(A, it, ok, &sa, &th);
        ok = started && read_transcript(A, it, id);
        if (started) pthread_join(th, NULL);
        if (!ok && !it->question[0]) fprintf(stderr, "question %d: no speech heard\n", i + 1);
        keep_stats(A, 0, A->stt);
        nm_brick_free(A->stt);
        A->stt = NULL;
        if (!it->from_mic) free_ring(&A->pcm);
        free_ring(&A->heard);
        stage_done(A, 0);
        if (ok && !assistant_woken(A, it, i)) { // no wake word: neither the decoder nor the voice is loaded
            it->t_heard = it->t_answered = it->t_spoken = now(A);
            goto done;
        }
    }
    it->t_heard = now(A);
    if (!ok) {
        it->failed = true;
        it->t_answered = it->t_spoken = now(A);
        goto done;
    }
    // the decoder: its model mapped and its brick made; the frame's encoder loaded to feed it
    peak_reset();
    nm_model_params mp = nm_model_default_params();
    mp.n_threads = A->o.n_threads;
    mp.no_mmap = A->o.no_mmap;
    if (!A->m && (st = nm_model_load(A->o.model, &mp, &A->m, err, sizeof err)) != NM_OK) {
        cli_load_error(A->o.model, st, err, CLI_WANT_LLM);
        ok = false;
    }
    A->lp.llm_model = A->m;
    if (ok && (st = nm_brick_load(NULL, &A->lp, &A->llm, err, sizeof err)) != NM_OK) {
        fprintf(stderr, "error: the language model's brick: %s: %s\n", nm_status_str(st), err);
        ok = false;
    }
    const bool frame = ok && it->frame && A->vp.model;
    if (frame) {
        A->vp.feeds = A->llm;
        if ((st = nm_brick_load(NULL, &A->vp, &A->vision, err, sizeof err)) != NM_OK) {
            cli_load_error(A->vp.model, st, err, CLI_WANT_MMPROJ);
            ok = false;
        }
    }
    size_t llm_slot = ok ? nm_brick_in_slot_bytes(A->llm) : 0;
    if (A->vision && nm_brick_out_slot_bytes(A->vision) > llm_slot) llm_slot = nm_brick_out_slot_bytes(A->vision);
    ok = ok && nm_tabm_create(NULL, LLM_IN_SLOTS, llm_slot, &A->llm_in, err, sizeof err) == NM_OK &&
         nm_tabm_create(NULL, 16, nm_brick_out_slot_bytes(A->llm), &A->tok, err, sizeof err) == NM_OK &&
         (!A->vision || nm_tabm_create(NULL, 1, frame_bytes(A), &A->img, err, sizeof err) == NM_OK);
    if (ok) {
        ask(A, i); // the prompt (the frame encoded on this thread into the decoder's ring)
        if (A->vision) { // the encoder is done with this question: released before the decoder runs
            keep_stats(A, 1, A->vision);
            nm_brick_free(A->vision);
            A->vision = NULL;
            free_ring(&A->img);
            stage_done(A, 1);
            peak_reset();
        }
    }
    char *answer = NULL;
    size_t cuts[MAX_CUTS];
    int n_cuts = 0;
    if (ok && !it->failed) {
        step_arg sa = {A->llm, A->llm_in, A->tok, NM_OK};
        pthread_t th;
        if (pthread_create(&th, NULL, step_main, &sa) == 0) {
            answer = collect_answer(A, it, id, cuts, &n_cuts);
            pthread_join(th, NULL);
        }
    }
    it->t_answered = now(A);
    if (!answer) it->failed = true;
    else note_speed(A, it, it->t_answered);
    add_traffic(A, 2, A->llm, (nm_brick_input){.n_tokens = it->n_prompt, .n_predict = it->n_tokens});
    keep_stats(A, 1, A->vision);
    nm_brick_free(A->vision);
    A->vision = NULL;
    keep_stats(A, 2, A->llm);
    nm_brick_free(A->llm);
    A->llm = NULL;
    nm_model_free(A->m); // its pages go with the mapping
    A->m = NULL;
    free_ring(&A->img);
    free_ring(&A->llm_in);
    free_ring(&A->tok);
    stage_done(A, 2);
    // the voice
    const bool voice = answer && A->out_dir && !A->no_voice;
    if (voice && !cascade_speak(A, it, id, answer, cuts, n_cuts)) it->failed = true;
    if (!voice || it->t_spoken == 0) it->t_spoken = now(A);
    free(answer);
done:
    // this question is answered and spoken, whatever failed (the resident pipeline, started again later,
    // waits for as many as were asked and cascaded)
    pthread_mutex_lock(&A->lock);
    A->n_spoken = spoken0 + 1;
    pthread_cond_broadcast(&A->cond);
    pthread_mutex_unlock(&A->lock);
}

// ---- the resident pipeline ----------------------------------------------------------------

// Every brick loaded (where --plan puts them, the first time), the rings, the
// lanes and the reader threads started. 0, or the exit status.
static int start_resident(app *A) {
    char err[512];
    nm_status st;
    if (!A->m) {
        nm_model_params mp = nm_model_default_params();
        mp.n_threads = A->o.n_threads;
        mp.no_mmap = A->o.no_mmap;
        if ((st = nm_model_load(A->o.model, &mp, &A->m, err, sizeof err)) != NM_OK) {
            cli_load_error(A->o.model, st, err, CLI_WANT_LLM);
            return 1;
        }
    }
    A->lp.llm_model = A->m;
    if (load_bricks(A) != NM_OK) return 1;
    if (!A->planned) cli_ctx_note(nm_brick_llm_ctx(A->llm));
    if (A->o.plan && !A->planned) { // the bricks again, where the planner puts them
        int prc = place_by_plan(A);
        if (prc) return prc;
    }
    A->planned = true;
    if (A->stt) A->ep_stt = nm_ledger_endpoint(A->ledger, nm_brick_name(A->stt));
    if (A->tts && A->speaker_dev && !A->player &&
        nm_audio_player_open(A->speaker_dev, nm_brick_tts_sample_rate(A->tts), &A->player, err, sizeof err) != NM_OK) {
        fprintf(stderr, "speaker skipped: %s: the answers are printed, not spoken\n", err); // an absent device
        A->no_voice = true;
        nm_brick_free(A->tts);
        A->tts = NULL;
    }
    // the rings
    size_t llm_slot = nm_brick_in_slot_bytes(A->llm);
    if (A->vision && nm_brick_out_slot_bytes(A->vision) > llm_slot) llm_slot = nm_brick_out_slot_bytes(A->vision);
    if ((st = nm_tabm_create(NULL, LLM_IN_SLOTS, llm_slot, &A->llm_in, err, sizeof err)) != NM_OK ||
        (st = nm_tabm_create(NULL, 16, nm_brick_out_slot_bytes(A->llm), &A->tok, err, sizeof err)) != NM_OK ||
        (A->vision && (st = nm_tabm_create(NULL, 1, frame_bytes(A), &A->img, err, sizeof err)) != NM_OK) ||
        (A->stt && !A->mic_dev &&
         (st = nm_tabm_create(NULL, 2, sizeof(float) * 16000 * MAX_QUESTION_S, &A->pcm, err, sizeof err)) != NM_OK) ||
        (A->stt && (st = nm_tabm_create(NULL, 8, nm_brick_out_slot_bytes(A->stt), &A->heard, err, sizeof err)) != NM_OK) ||
        (A->tts && (st = nm_tabm_create(NULL, 16, SAY_SLOT_BYTES, &A->say, err, sizeof err)) != NM_OK) ||
        (A->tts && (st = nm_tabm_create(NULL, SPEECH_SLOTS, nm_brick_out_slot_bytes(A->tts), &A->speech, err,
                                        sizeof err)) != NM_OK)) {
        fprintf(stderr, "error: cannot create the rings: %s: %s\n", nm_status_str(st), err);
        return 1;
    }
    // the lanes
    A->L_llm = (lane){.b = A->llm, .in = A->llm_in, .out = A->tok};
    A->L_stt = (lane){.b = A->stt, .in = A->pcm, .out = A->heard};
    A->L_tts = (lane){.b = A->tts, .in = A->say, .out = A->speech};
    A->answers_gone = A->speech_gone = false;
    A->resident = true; // (stop_resident undoes what started, whatever fails below)
    A->L_llm.started = pthread_create(&A->L_llm.th, NULL, lane_main, &A->L_llm) == 0;
    // (a heard question's Whisper is stepped when its turn comes: the microphone's ring outlives the lanes)
    if (A->stt && !A->mic_dev) A->L_stt.started = pthread_create(&A->L_stt.th, NULL, lane_main, &A->L_stt) == 0;
    if (A->tts) A->L_tts.started = pthread_create(&A->L_tts.th, NULL, lane_main, &A->L_tts) == 0;
    A->answers_started = pthread_create(&A->th_answers, NULL, answers_main, A) == 0;
    if (A->tts) A->speech_started = pthread_create(&A->th_speech, NULL, speech_main, A) == 0;
    if (!A->L_llm.started || !A->answers_started || (A->stt && !A->mic_dev && !A->L_stt.started) ||
        (A->tts && (!A->L_tts.started || !A->speech_started))) {
        fprintf(stderr, "error: cannot start the lanes' threads\n");
        return 1;
    }
    return 0;
}

// Waits until every question asked of the pipeline is answered (and
// spoken), then shuts the rings (each lane ends and shuts its other ring, the
// readers end), and frees the rings, the bricks and the model.
static void stop_resident(app *A) {
    if (A->answers_started)
        wait_for(A, &A->n_spoken, A->n_asked + A->n_cascaded, A->tts ? &A->speech_gone : &A->answers_gone);
    nm_tabm *rings[] = {A->mic_dev ? NULL : A->pcm, A->heard, A->llm_in, A->tok, A->img, A->say, A->speech};
    for (size_t k = 0; k < sizeof rings / sizeof rings[0]; k++)
        if (rings[k]) nm_tabm_shutdown(rings[k]);
    lane *lanes[] = {&A->L_llm, &A->L_stt, &A->L_tts};
    for (int k = 0; k < 3; k++)
        if (lanes[k]->started) pthread_join(lanes[k]->th, NULL);
    if (A->answers_started) pthread_join(A->th_answers, NULL);
    if (A->speech_started) pthread_join(A->th_speech, NULL);
    A->answers_started = A->speech_started = false;
    memset(&A->L_llm, 0, sizeof(lane) );
    memset(&A->L_stt, 0, sizeof(lane));
    memset(&A->L_tts, 0, sizeof(lane));
    if (!A->mic_dev) free_ring(&A->pcm); // (the microphone's lives as long as the capture)
    free_ring(&A->heard);
    free_ring(&A->llm_in);
    free_ring(&A->tok);
    free_ring(&A->img);
    free_ring(&A->say);
    free_ring(&A->speech);
    free_bricks(A);
    nm_model_free(A->m);
    A->m = NULL;
    A->resident = false;
}

// ---- the battery -----------------------------------------------------------------------------

// Reads the battery and steps the policy before a question: the frame rate,
// the decoder's pace and the DVFS caps follow it. True when the state is critical
// (the question runs as the cascade).
static bool power_step(app *A) {
    double t0, t1;
    nm_battery_span(A->battery, &t0, &t1);
    nm_battery_reading r;
    nm_battery_read(A->battery, t0 + now(A) * A->battery_speed, &r);
    if (r.note[0]) fprintf(stderr, "battery: %s\n", r.note);
    const bool started = A->policy.started;
    const nm_power_state before = A->policy.state;
    nm_power_targets tg = nm_power_policy_step(&A->policy, r.pct);
    pthread_mutex_lock(&A->lock);
    A->decode_cap = tg.decode_share < 1 && A->full_tps > 0 ? tg.decode_share * A->full_tps : 0;
    const double cap = A->decode_cap;
    pthread_mutex_unlock(&A->lock);
    A->fps_cap = tg.state == NM_POWER_CRITICAL ? 0 : tg.fps;
    // the threads target: each brick made with it (a resident pipeline again, between two questions)
    if (tg.n_threads != A->threads_now) {
        if (A->threads_now > 0)
            fprintf(stderr, "power: %d thread%s a brick (was %d)%s\n", tg.n_threads, tg.n_threads == 1 ? "" : "s",
                    A->threads_now, A->resident ? ": the pipeline is made again" : "");
        A->threads_now = tg.n_threads; // (the bricks loaded from now on; those running keep theirs)
        A->rebuild = A->resident;
    }
    if (!started || tg.state != before)
        fprintf(stderr, "power: battery %.1f %%: %s, alpha %.2f: frames %.2f/s, decoder %.0f%% of its speed%s%s\n",
                r.pct, nm_power_state_name(tg.state), tg.alpha, tg.fps, 100 * tg.decode_share,
                tg.cascade ? ", each brick loaded, run and released in turn" : "",
                cap > 0 ? "" : tg.decode_share < 1 ? " (once an answer has measured it)" : "");
    char err[512];
    if (A->dvfs && nm_power_actuators_apply(A->dvfs, &tg, err, sizeof err) != NM_OK)
        fprintf(stderr, "power: DVFS not applied: %s\n", err);
    return tg.state == NM_POWER_CRITICAL;
}

int cmd_assistant(int argc, char **argv) {
    app A;
    memset(&A, 0, sizeof A);
    int rc = assistant_options(&A, argc, argv);
    if (rc >= 0) return rc; // --help, --version, or a usage error (exit 2)
    cli_opts *o = &A.o;
    rc = 1;
    if (!assistant_make_items(&A)) goto out;
    if ((o->stats || A.json_path) && !cli_energy_load(o->profile, &A.energy.model)) goto out; // the model's watts
    pthread_mutex_init(&A.lock, NULL);
    pthread_cond_init(&A.cond, NULL);

    char err[512];
    nm_status st;
    nm_model_params mp = nm_model_default_params();
    mp.n_threads = o->n_threads;
    mp.no_mmap = o->no_mmap;
    if ((st = nm_model_load(o->model, &mp, &A.m, err, sizeof err)) != NM_OK) {
        cli_load_error(o->model, st, err, CLI_WANT_LLM);
        goto out;
    }
    cli_mlock(o);
    {
        nm_chat_msg probe = {"user", "hi"};
        nm_status pst;
        char *f = cli_chat_text(A.m, o, &probe, 1, &pst);
        free(f);
        if (pst == NM_ERR_TEMPLATE && !o->jinja) {
            fprintf(stderr, "error: the model names no chat template we know: name one with --chat-template (%s)\n",
                    nm_chat_template_names());
            goto out;
        }
        if (pst != NM_OK) goto out;
    }
    A.ledger = nm_ledger_create();
    if (!A.ledger) goto out;
    if (A.battery_src) { // PCT, sysfs[:NAME] or trace:CSV
        char *end;
        const double pct = strtod(A.battery_src, &end);
        if (!strncmp(A.battery_src, "trace:", 6))
            st = nm_battery_open_trace(A.battery_src + 6, &A.battery, err, sizeof err);
        else if (!strcmp(A.battery_src, "sysfs") || !strncmp(A.battery_src, "sysfs:", 6))
            st = nm_battery_open_sysfs(NULL, A.battery_src[5] ? A.battery_src + 6 : NULL, &A.battery, err, sizeof err);
        else if (end != A.battery_src && !*end)
            st = nm_battery_open_fixed(pct, &A.battery, err, sizeof err);
        else
        {
            snprintf(err, sizeof err, "--battery takes a percent, sysfs[:NAME] or trace:FILE, not '%s'", A.battery_src);
            st = NM_ERR_INVALID_ARG;
        }
        if (st != NM_OK) {
            fprintf(stderr, "error: %s\n", err);
            rc = st == NM_ERR_INVALID_ARG ? 2 : 1;
            goto out;
        }
        nm_power_params pp = nm_power_default_params();
        pp.n_threads = o->n_threads > 0 ? o->n_threads : 0; // the policy's threads target scales -t
        nm_power_policy_init(&A.policy, &pp, NULL, 0);
        if (A.battery_speed <= 0) A.battery_speed = 1;
        if (A.power_sysfs) {
            nm_actuator_params ap = nm_actuator_default_params();
            ap.sysfs_root = A.power_sysfs;
            if ((st = nm_power_actuators_open(&ap, &A.dvfs, err, sizeof err)) != NM_OK) {
                fprintf(stderr, "error: --power-sysfs: %s\n", err);
                goto out;
            }
            nm_power_actuators_guard(A.dvfs);
        }
    }
    A.ep_llm = nm_ledger_endpoint(A.ledger, "llm");
    A.lp = cli_llm_params(o, A.m, A.ledger);
    if (A.lp.llm.n_predict < 0) A.lp.llm.n_predict = 128; // an answer must end
    if (o->mmproj) {
        A.vp = nm_brick_default_params(NM_BRICK_VISION);
        A.vp.model = o->mmproj;
        A.vp.device = o->mmproj_device ? o->mmproj_device : o->device;
        A.vp.n_threads = o->n_threads;
        A.vp.cores = o->mmproj_cores;
        A.vp.ledger = A.ledger;
        A.vp.image_min_tokens = o->image_min_tokens;
        A.vp.image_max_tokens = o->image_max_tokens;
    }
    if (A.stt_model) {
        A.sp = nm_brick_default_params(NM_BRICK_STT);
        A.sp.model = A.stt_model;
        A.sp.n_threads = o->n_threads;
        A.sp.cores = A.stt_cores;
        A.sp.stt = nm_stt_default_params(NM_STT_GREEDY); // whisper.cpp's stream example decodes greedily too
        A.sp.ledger = A.ledger;
    }
    if (A.out_dir) {
        A.tp = nm_brick_default_params(NM_BRICK_TTS);
        A.tp.cores = A.tts_cores;
        A.tp.ledger = A.ledger;
        if (A.voice) A.tp.tts.voice = A.voice;
    }
    if (A.mic_dev) {
        nm_vad_params vp = nm_vad_default_params();
        if ((st = nm_vad_create(&vp, &A.vad, err, sizeof err)) != NM_OK) {
            fprintf(stderr, "error: %s\n", err);
            goto out;
        }
        A.ep_mic = nm_ledger_endpoint(A.ledger, "microphone");
        A.ep_stt = nm_ledger_endpoint(A.ledger, "stt");
        // the heard questions' audio: a ring that outlives the resident pipeline (the cascade reads it too)
        if ((st = nm_tabm_create(NULL, 8, sizeof(float) * 16000 * MAX_QUESTION_S, &A.pcm, err, sizeof err)) != NM_OK) {
            fprintf(stderr, "error: the microphone's ring: %s: %s\n", nm_status_str(st), err);
            goto out;
        }
    }
    if (A.watch_dir && !assistant_watch_open(&A)) goto out;
    if (A.camera_dev && !assistant_camera_open(&A) && !A.audio) { // absent: spoken questions go without a frame
        rc = 1;
        goto out;
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
    bool lanes_failed = false;
    pthread_t th_src;
    bool src = false, src_started = false;
    double next_frame = 0; // when the camera's next frame is due
    for (int i = 0;; i++) {
        if (A.live) { // the next question once it is heard or its file arrives, until the source ends
            if (!src_started) {
                src_started = true;
                // without a battery to ask first, the pipeline is there before the first question comes
                if (!A.cascade_always && !A.battery && (rc = start_resident(&A)) != 0) {
                    lanes_failed = true;
                    break;
                }
                assistant_catch_sigint(); // Ctrl-C stops listening; the questions heard are answered
                src = pthread_create(&th_src, NULL,
                                     A.mic_dev    ? assistant_mic_main
                                     : A.watch_dir ? assistant_watch_main
                                                   : assistant_camera_main,
                                     &A) == 0;
                if (!src) A.src_done = true;
                if (A.mic_dev)
                    fprintf(stderr, "listening on '%s'%s\n", A.mic_dev, A.listen_s > 0 ? "" : " (Ctrl-C stops)");
                else if (!A.watch_dir)
                    fprintf(stderr, "asking about %s's frames%s\n", A.camera_dev, A.listen_s > 0 ? "" : " (Ctrl-C stops)");
                else
                    fprintf(stderr, "watching '%s' for %s%s\n", A.watch_dir, A.watch_frames ? "frames" : "questions",
                            A.listen_s > 0 ? "" : " (Ctrl-C stops)");
            }
            pthread_mutex_lock(&A.lock);
            while (i >= A.n_items && !A.src_done) pthread_cond_wait(&A.cond, &A.lock);
            const bool more = i < A.n_items;
            A.n_taken = more ? i + 1 : A.n_taken; // (the camera's thread makes the next question)
            pthread_cond_broadcast(&A.cond);
            pthread_mutex_unlock(&A.lock);
            if (!more) break;
        } else if (i >= A.n_items) {
            break;
        }
        if (A.camera && !A.items[i].frame) A.items[i].frame = A.camera_dev; // a spoken question: the camera's frame
        bool cascade = A.cascade_always;
        if (A.battery) cascade = power_step(&A) || cascade;
        float fps = A.fps;
        if (A.fps_cap > 0 && (fps == 0 || A.fps_cap < fps)) fps = (float)A.fps_cap;
        if (A.items[i].frame && fps > 0) { // a camera gives a frame every 1/fps s
            const double t = now(&A);
            if (next_frame > t) {
                struct timespec ts = {(time_t)(next_frame - t),
                                      (long)((next_frame - t - (double)(time_t)(next_frame - t)) * 1e9)};
                nanosleep(&ts, NULL);
            }
            next_frame = (next_frame > t ? next_frame : t) + 1.0 / fps;
        }
        // the camera's event: a frame like the last one asked about wakes nothing
        if (A.frame_change > 0 && A.items[i].frame && !assistant_frame_changed(&A, &A.items[i], i)) continue;
        if (A.resident && (cascade || A.rebuild)) {
            stop_resident(&A);
            A.planned = false; // (--plan: placed again, for the new state)
        }
        A.rebuild = false;
        if (!cascade && !A.resident && (rc = start_resident(&A)) != 0) {
            lanes_failed = true;
            break;
        }
        A.cascading = cascade;
        if (!cascade && A.sequential && A.n_asked > 0)
            wait_for(&A, &A.n_spoken, A.n_asked + A.n_cascaded, A.tts ? &A.speech_gone : &A.answers_gone);
        if (cascade) {
            cascade_question(&A, i);
        } else {
            ask(&A, i);
            A.n_asked++;
        }
        if (A.cam_held) { // the frame the gate took for a question that failed before sending it
            nm_tabm_cancel(A.cam_ring, &A.cam_slot);
            A.cam_held = false;
        }
    }
    if (src) {
        if (lanes_failed) assistant_stop_listening(); // nothing would answer what comes
        pthread_join(th_src, NULL);
    }
    if (A.resident) stop_resident(&A);
    if (A.player) nm_audio_player_drain(A.player, err, sizeof err); // the last answer, played to its end
    const double wall = now(&A);
    rc = rc > 1 ? rc : A.src_failed || lanes_failed ? 1 : 0;
    for (int i = 0; i < A.n_items; i++) rc = A.items[i].failed ? 1 : rc;
    if (A.live && A.n_items == 0 && !A.src_failed)
        fprintf(stderr, A.mic_dev ? "heard no question\n" : A.watch_dir ? "no file arrived: no question\n" : "no frame: no question\n");
    if (o->stats || A.json_path) assistant_energy_end(&A, wall);
    if (o->stats) assistant_print_stats(&A, wall);
    if (A.json_path && !assistant_write_json(&A, wall)) rc = 1;
out:
    if (A.cam_held) nm_tabm_cancel(A.cam_ring, &A.cam_slot);
    nm_camera_close(A.camera);
    nm_tabm_free(A.cam_ring);
    nm_energy_meters_free(A.meters);
    nm_power_actuators_free(A.dvfs); // the frequencies as they were
    nm_battery_free(A.battery);
    free_bricks(&A);
    nm_tabm *all[] = {A.pcm, A.heard, A.llm_in, A.tok, A.img, A.say, A.speech};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) nm_tabm_free(all[k]);
    nm_ledger_free(A.ledger);
    nm_model_free(A.m);
    nm_vad_free(A.vad);
    if (A.watch_fd >= 0) close(A.watch_fd);
    nm_audio_player_close(A.player);
    for (int i = 0; i < A.n_owned; i++) free(A.owned[i]);
    free(A.owned);
    free(A.items);
    cli_opts_free(o);
    return rc;
}
