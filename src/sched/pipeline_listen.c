// The pipeline's listening (pipeline_impl.h): live audio cut into questions
// by the VAD, each utterance a request; speech that starts while requests are
// in flight cancels them (barge-in).
#include "sched/pipeline_impl.h"

// ---- listening -----------------------------------------------------------------------------------

typedef struct heard_ctx {
    nm_pipeline *P;
    nm_status st;
    char *err;
    size_t err_size;
} heard_ctx;

// An utterance the VAD cut: a request of its own.
static void on_utterance(void *user, const float *pcm, int64_t n, int64_t t0) {
    heard_ctx *h = user;
    char e[512];
    const nm_pipeline_input in = {.pcm = pcm, .n_samples = n, .images = h->P->p.heard_images,
                                  .n_images = h->P->p.n_heard_images};
    const nm_status st = nm_pipeline_submit(h->P, &in, NULL, e, sizeof e);
    if (st != NM_OK && h->st == NM_OK) {
        h->st = st;
        nm_fail(st, h->err, h->err_size, "pipeline: the question heard at %.2f s: %s", (double)t0 / 16000.0, e);
    }
}

// Speech began at stream position `at` (samples): every request in flight is
// cancelled, and a BARGE_IN event says so.
static void barge_in(nm_pipeline *P, int64_t at) {
    uint64_t newest = 0, oldest = 0;
    pthread_mutex_lock(&P->lock);
    for (uint64_t i = 0; i < P->n_reqs; i++)
        if (P->reqs[i] && !P->reqs[i]->done && !P->reqs[i]->cancelled) newest = i + 1, oldest = oldest ? oldest : i + 1;
    pthread_mutex_unlock(&P->lock);
    if (!newest) return;
    for (uint64_t id = oldest; id <= newest; id++) nm_pipeline_cancel(P, id);
    const int64_t voiced = (int64_t)P->vad_p.start_frames * P->vad_p.frame_ms * 16; // the frames that opened it
    nm_pipeline_event ev = {.kind = NM_PIPELINE_BARGE_IN, .request = newest, .t0 = (at - voiced) / 160, .t1 = at / 160};
    pl_push(P, &ev, "", 0);
}

nm_status nm_pipeline_hear(nm_pipeline *P, const float *pcm, int64_t n, char *err, size_t err_size) {
    if (!P) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: no pipeline");
    if (!P->has[NM_BRICK_STT])
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: heard audio, and no STT brick to hear it");
    if (n < 0 || (n > 0 && !pcm)) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: %lld samples heard", (long long)n);
    if (!P->vad) {
        P->vad_p = P->p.vad.rate ? P->p.vad : nm_vad_default_params();
        if (P->vad_p.rate != 16000)
            return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "pipeline: the VAD's rate is %d Hz (16000 heard)",
                           (int)P->vad_p.rate);
        char e[256];
        const nm_status st = nm_vad_create(&P->vad_p, &P->vad, e, sizeof e);
        if (st != NM_OK) return nm_fail(st, err, err_size, "pipeline: the VAD: %s", e);
    }
    heard_ctx h = {P, NM_OK, err, err_size};
    if (n == 0 || !pcm) {
        nm_vad_flush(P->vad, on_utterance, &h);
        P->vad_speech = false;
        return h.st;
    }
    // a frame at a time, so that speech is known (and barges in) within a frame of where the VAD sees it
    const int64_t frame = (int64_t)P->vad_p.frame_ms * 16;
    for (int64_t i = 0; i < n; i += frame) {
        nm_vad_push(P->vad, pcm + i, n - i < frame ? n - i : frame, on_utterance, &h);
        const bool speech = nm_vad_in_speech(P->vad);
        if (speech && !P->vad_speech && P->p.barge_in) barge_in(P, nm_vad_position(P->vad));
        P->vad_speech = speech;
    }
    return h.st;
}
