// The pipeline's gates (pipeline_impl.h): what wakes the assistant. A spoken
// request is answered only if its transcript starts with a wake word
// (params.wake_words), a request with images only if its first image differs
// enough from the last one answered (params.frame_change). A request a gate
// stops ends (DONE NM_OK, skipped, its text why) with nothing after the gate
// run for it. And a camera's newest frame, captured into its own ring's slot.
#include <ctype.h>

#include "sched/pipeline_impl.h"

#define CAMERA_WAIT_NS 5000000000ll // a camera that gives no frame for 5 s has failed

// A byte of a word: ASCII letters and digits, and any byte of a multi-byte UTF-8 character.
static bool word_byte(unsigned char c) { return c >= 0x80 || isalnum(c); }

// The comma-separated list into P->wake, each normalised (lower case, its
// words one blank apart).
nm_status pl_wake_words(nm_pipeline *P, const char *list, char *err, size_t err_size) {
    const size_t cap = sizeof P->wake / sizeof P->wake[0], room = sizeof P->wake[0] - 2;
    for (const char *p = list; *p;) {
        const char *end = strchr(p, ',');
        if (!end) end = p + strlen(p);
        char *w = P->wake[P->n_wake < (int32_t)cap ? P->n_wake : 0];
        size_t n = 0;
        bool gap = false;
        for (const char *q = p; q < end; q++) {
            if (!word_byte((unsigned char)*q)) {
                gap = n > 0;
                continue;
            }
            if (n + (gap ? 1 : 0) >= room)
                return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "wake words: '%.*s' is longer than %zu bytes",
                               (int)(end - p), p, room);
            if (gap) w[n++] = ' ';
            gap = false;
            w[n++] = (char)tolower((unsigned char)*q);
        }
        if (n == 0)
            return nm_fail(NM_ERR_INVALID_ARG, err, err_size,
                           "wake words: an empty word in '%s' (give words, comma-separated)", list);
        if (P->n_wake >= (int32_t)cap)
            return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "wake words: more than %zu in '%s'", cap, list);
        w[n] = '\0';
        P->n_wake++;
        p = *end ? end + 1 : end;
    }
    if (P->n_wake == 0) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "wake words: none in '%s'", list);
    return NM_OK;
}

// Where the question starts if text starts with the normalised word w (at a
// word's end), after the blanks and punctuation that follow; NULL if not.
static const char *after_word(const char *text, const char *w) {
    const unsigned char *t = (const unsigned char *)text;
    while (*t && !word_byte(*t)) t++;
    for (const char *c = w; *c; c++) {
        if (*c == ' ') { // between two words: at least one separator
            if (!*t || word_byte(*t)) return NULL;
            while (*t && !word_byte(*t)) t++;
            continue;
        }
        if (!*t || tolower(*t) != (unsigned char)*c) return NULL;
        t++;
    }
    if (*t && word_byte(*t)) return NULL; // "computers" does not start with "computer"
    while (*t && !word_byte(*t)) t++;
    return (const char *)t;
}

// The skipped request's end (its DONE: NM_OK, skipped, why).
static void skip(nm_pipeline *P, pl_req *r, const char *why) {
    pthread_mutex_lock(&P->lock);
    r->skipped = true;
    pl_done_locked(P, r, NM_OK, why);
    pthread_mutex_unlock(&P->lock);
}

// Spoken request r's transcript (r->text) woke the assistant: the word taken
// off it. Else (or nothing asked after the word) the request is skipped;
// false. True for every request where no wake words were given.
bool pl_woken(nm_pipeline *P, pl_req *r) {
    if (P->n_wake == 0 || !r->audio) return true;
    for (int32_t k = 0; k < P->n_wake; k++) {
        const char *rest = after_word(r->text, P->wake[k]);
        if (!rest) continue;
        if (!*rest) {
            skip(P, r, "a wake word and no question after it");
            return false;
        }
        memmove(r->text, rest, strlen(rest) + 1);
        return true;
    }
    skip(P, r, "no wake word");
    return false;
}

// A camera's newest frame into im->slot (held for write in the camera's
// ring); err names the camera.
nm_status pl_capture(pl_img *im, char *err, size_t err_size) {
    if (im->held) return NM_OK;
    const nm_status st = nm_camera_capture(im->camera, CAMERA_WAIT_NS, &im->slot);
    if (st != NM_OK) {
        const char *e = nm_camera_last_error(im->camera); // (it names the camera)
        return *e ? nm_fail(st, err, err_size, "%s", e) : nm_fail(st, err, err_size, "camera: %s", nm_status_str(st));
    }
    im->held = true;
    return NM_OK;
}

// Request r's first image differs from the last one answered by more than
// params.frame_change (or cannot be read: the vision brick says why): true,
// and it is the last one answered now. Else the request is skipped; false. A
// camera's frame is captured here (held for the vision brick).
bool pl_frame_changed(nm_pipeline *P, pl_req *r) {
    if (P->p.frame_change <= 0 || r->n_images == 0) return true;
    pl_img *im = &r->img[0];
    nm_frame_sig sig;
    char err[512];
    nm_status st;
    if (im->camera) {
        if (pl_capture(im, err, sizeof err) != NM_OK) return true; // (put_image tries again, and says why)
        st = nm_frame_signature_slot(&im->slot, &sig, err, sizeof err);
    } else if (im->path) {
        st = nm_frame_signature(im->path, &sig, err, sizeof err);
    } else {
        nm_tabm_meta m = {.kind = NM_TABM_IMAGE, .ndim = 1, .shape = {(int64_t)im->n_bytes}, .size = im->n_bytes};
        const nm_tabm_slot s = {.data = (void *)im->bytes, .meta = &m, .capacity = im->n_bytes};
        st = nm_frame_signature_slot(&s, &sig, err, sizeof err);
    }
    if (st != NM_OK) return true;
    const double d = P->have_sig ? nm_frame_difference(&P->last_sig, &sig) : 255.0;
    if (d <= P->p.frame_change) {
        char why[96];
        snprintf(why, sizeof why, "frame unchanged (difference %.2f <= %.2f)", d, (double)P->p.frame_change);
        skip(P, r, why);
        return false;
    }
    P->last_sig = sig;
    P->have_sig = true;
    return true;
}
