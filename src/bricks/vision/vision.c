// The vision brick as the rest of the runtime sees it: an encoder plus the
// preprocessing and prompt layout of its projector, writing straight into the
// LLM brick's input ring. Each encoder output goes into the payload of a TABM
// slot (nm_clip_encode's destination is the slot), and the LLM brick decodes
// that payload in place: no byte of an embedding is copied between the bricks.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bricks/vision/image.h"
#include "bricks/vision/vision.h"

struct nm_vision {
    nm_clip *clip;
    nm_image_params ip;
    nm_vision_stats stats;
    char err[256];
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

nm_vision_stats nm_vision_get_stats(const nm_vision *v) { return v->stats; }

static nm_status vfail(nm_vision *v, nm_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->err, sizeof v->err, fmt, ap);
    va_end(ap);
    return st;
}

nm_status nm_vision_load(const char *mmproj, const char *device, int32_t n_threads, nm_vision **out, char *err, size_t err_size) {
    if (!mmproj || !out) return NM_ERR_INVALID_ARG;
    *out = NULL;
    nm_vision *v = calloc(1, sizeof *v);
    if (!v) return NM_ERR_NOMEM;
    nm_status st = nm_clip_load(mmproj, device, n_threads, &v->clip, err, err_size);
    if (st) {
        free(v);
        return st;
    }
    v->ip = nm_image_params_from_clip(nm_clip_get_info(v->clip));
    *out = v;
    return NM_OK;
}

void nm_vision_free(nm_vision *v) {
    if (!v) return;
    nm_clip_free(v->clip);
    free(v);
}

const char *nm_vision_last_error(const nm_vision *v) { return v ? v->err : ""; }
const nm_clip_info *nm_vision_info(const nm_vision *v) { return nm_clip_get_info(v->clip); }
nm_clip *nm_vision_clip(nm_vision *v) { return v->clip; }

nm_status nm_vision_check_model(const nm_vision *v, const nm_model *m, char *err, size_t err_size) {
    const nm_clip_info *in = nm_clip_get_info(v->clip);
    if (in->n_out_embd != nm_model_n_embd(m)) {
        if (err)
            snprintf(err, err_size,
                     "the mmproj projects images to %d-wide embeddings but the language model's embedding width is %d: "
                     "this mmproj belongs to another model",
                     in->n_out_embd, nm_model_n_embd(m));
        return NM_ERR_FORMAT;
    }
    return NM_OK;
}

// ---- the prompt segment of one image -------------------------------------------------------

// A piece of the segment: marker text (tokenized with special tokens parsed)
// or the embeddings of encoder input `image`.
typedef struct piece {
    char text[64];
    int32_t image; // -1: text
} piece;

// The layout of llama.cpp's mtmd for the projector (see image.h): mlp is the
// embeddings alone (anyres: the tiles', then the overview's, nothing between
// them); idefics3 wraps tiles and the global image in SmolVLM's markers.
// Returns the number of pieces written to p (at most max).
static int layout(const nm_vision *v, const nm_image_batch *b, piece *p, int max) {
    int n = 0;
#define TEXT(...) (n < max ? (snprintf(p[n].text, sizeof p[n].text, __VA_ARGS__), p[n].image = -1, n++) : n)
#define IMAGE(i) (n < max ? (p[n].text[0] = '\0', p[n].image = (i), n++) : n)
    if (nm_clip_get_info(v->clip)->proj == NM_CLIP_PROJ_MLP) {
        for (int i = 0; i < b->n; i++) IMAGE(i);
        return n;
    }
    for (int r = 0; r < b->rows; r++) {
        for (int c = 0; c < b->cols; c++) {
            TEXT("<fake_token_around_image><row_%d_col_%d>", r + 1, c + 1);
            IMAGE(r * b->cols + c);
        }
        if (r != b->rows - 1) TEXT("\n");
    }
    TEXT("\n\n<fake_token_around_image><global-img>");
    IMAGE(b->n - 1);
    TEXT("<fake_token_around_image>");
    return n;
#undef TEXT
#undef IMAGE
}

nm_status nm_vision_put_image(nm_vision *v, const nm_model *m, const char *image_path, nm_tabm *ring,
                              uint32_t producer, int64_t timeout_ns, uint64_t first_flags, bool more_follows,
                              int32_t *n_pos_out) {
    if (!v || !m || !image_path || !ring) return NM_ERR_INVALID_ARG;
    v->err[0] = '\0';
    const nm_clip_info *in = nm_clip_get_info(v->clip);
    char err[256];
    nm_status st = nm_vision_check_model(v, m, err, sizeof err);
    if (st) return vfail(v, st, "%s", err);
    nm_image img = {0};
    nm_image_batch b = {0};
    double t0 = now_s();
    if ((st = nm_image_load(image_path, &img, err, sizeof err))) return vfail(v, st, "%s", err); // names the file
    st = nm_image_preprocess(&img, &v->ip, &b, err, sizeof err);
    nm_image_free(&img);
    if (st) return vfail(v, st, "%s: %s", image_path, err);
    v->stats.t_decode += now_s() - t0;
    enum { MAX_PIECES = 2 * 64 + 8 };
    piece pieces[MAX_PIECES];
    const int n_pieces = layout(v, &b, pieces, MAX_PIECES);
    if (b.n > 64 || n_pieces >= MAX_PIECES) {
        nm_image_batch_free(&b);
        return vfail(v, NM_ERR_RANGE, "%s: %d tiles is more than the 64 we lay out", image_path, b.n);
    }
    const size_t S = (size_t)in->image_size, embd_bytes = sizeof(float) * (size_t)in->n_out * (size_t)in->n_out_embd;
    if (embd_bytes > nm_tabm_max_payload(ring)) {
        nm_image_batch_free(&b);
        return vfail(v, NM_ERR_RANGE, "ring slots of %zu bytes cannot hold an image's %zu bytes of embeddings",
                     nm_tabm_max_payload(ring), embd_bytes);
    }
    int32_t n_pos = 0, n_published = 0;
    for (int i = 0; i < n_pieces && st == NM_OK; i++) {
        nm_tabm_slot slot;
        if ((st = nm_tabm_acquire_write(ring, producer, timeout_ns, &slot))) {
            vfail(v, st, "input ring: %s", nm_tabm_last_error(ring));
            break;
        }
        nm_tabm_meta *meta = slot.meta;
        if (pieces[i].image >= 0) {
            // The encoder writes its output straight into the slot.
            double te = now_s();
            st = nm_clip_encode(v->clip, b.data + (size_t)pieces[i].image * 3 * S * S, slot.data);
            v->stats.t_encode += now_s() - te;
            v->stats.n_encoded++;
            if (st) {
                vfail(v, st, "%s", nm_clip_last_error(v->clip));
                nm_tabm_cancel(ring, &slot);
                break;
            }
            meta->kind = NM_TABM_EMBD_F32;
            meta->ndim = 2;
            meta->shape[0] = in->n_out;
            meta->shape[1] = in->n_out_embd;
            meta->size = embd_bytes;
            n_pos += in->n_out;
        } else {
            const int32_t cap = (int32_t)(slot.capacity / sizeof(int32_t) < INT32_MAX ? slot.capacity / sizeof(int32_t) : INT32_MAX);
            int32_t nt = nm_tokenize(m, pieces[i].text, strlen(pieces[i].text), slot.data, cap, false, true);
            if (nt <= 0) {
                st = vfail(v, nt < 0 ? NM_ERR_RANGE : NM_ERR_FORMAT, "image marker '%s' gives %d tokens", pieces[i].text, nt);
                nm_tabm_cancel(ring, &slot);
                break;
            }
            meta->kind = NM_TABM_TOKENS;
            meta->ndim = 1;
            meta->shape[0] = nt;
            meta->size = sizeof(int32_t) * (size_t)nt;
            n_pos += nt;
        }
        meta->user = ((i + 1 < n_pieces || more_follows) ? NM_LLM_IN_MORE : 0) | (i == 0 ? first_flags : 0);
        if ((st = nm_tabm_publish(ring, &slot))) {
            vfail(v, st, "input ring: %s", nm_tabm_last_error(ring));
            nm_tabm_cancel(ring, &slot);
        } else {
            n_published++;
        }
    }
    nm_image_batch_free(&b);
    if (st == NM_OK) v->stats.n_images++;
    if (st && n_published > 0) {
        // The brick holds a prompt that says more follows: an empty slot ends
        // it (the brick drops a prompt with a malformed slot and goes on).
        nm_tabm_slot slot;
        if (nm_tabm_acquire_write(ring, producer, timeout_ns, &slot) == NM_OK) {
            slot.meta->kind = NM_TABM_TOKENS;
            slot.meta->ndim = 0;
            slot.meta->size = 0;
            slot.meta->user = 0;
            if (nm_tabm_publish(ring, &slot) != NM_OK) nm_tabm_cancel(ring, &slot);
        }
    }
    if (n_pos_out) *n_pos_out = n_pos;
    return st;
}

size_t nm_vision_slot_bytes(const nm_vision *v) {
    const nm_clip_info *in = nm_clip_get_info(v->clip);
    return sizeof(float) * (size_t)in->n_out * (size_t)in->n_out_embd;
}
