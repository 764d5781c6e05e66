// The vision brick (nm_brick_i, include/nanomind.h): an mmproj encoder
// (clip.h) with its projector's image preprocessing (image.h) and prompt
// layout, turning each IMAGE slot of its input ring into that image's prompt
// segment in the LLM brick's input ring. Each encoder output goes into the
// payload of a TABM slot (nm_clip_encode's destination is the slot), and the
// LLM brick decodes that payload in place: no byte of an embedding is copied
// between the bricks. The image file is decoded from its slot in place too.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bricks/brick_impl.h"
#include "bricks/vision/clip.h"
#include "bricks/vision/preproc.h"
#include "core/clock.h"
#include "core/fail.h"

typedef struct vision_brick {
    nm_clip *clip;
    const nm_model *m;  // the LLM brick's model: its tokenizer writes the markers (NULL: embeddings alone)
    nm_image_params ip;
    uint32_t producer;
    int64_t timeout_ns;
    int64_t wait_ns;          // this run's waits: timeout_ns, or in nm_brick_step nm_brick_wait_ns's
    uint64_t request;
    nm_brick_stats st;
    char err[256];
} vision_brick;


static nm_status vfail(vision_brick *v, nm_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static nm_status vfail(vision_brick *v, nm_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    nm_vfail(st, v->err, sizeof v->err, NULL, fmt, ap);
    va_end(ap);
    return st;
}

static void vision_release(void *state) {
    vision_brick *v = state;
    if (!v) return;
    nm_clip_free(v->clip);
    free(v);
}

// The image token limits asked for (<= 0: the model's) over those of a
// dynamic-resolution projector; fixed-size ones ignore them, as llama.cpp.
static nm_status token_limits(nm_image_params *ip, int32_t lo, int32_t hi, char *err, size_t err_size) {
    if (ip->proj != NM_CLIP_PROJ_QWEN2VL || (lo <= 0 && hi <= 0)) return NM_OK;
    if (hi > NM_CLIP_QWEN2VL_MAX_TOKENS || lo > NM_CLIP_QWEN2VL_MAX_TOKENS)
        return nm_fail(NM_ERR_RANGE, err, err_size,
                       "vision brick: image tokens %d: this encoder takes at most %d image tokens",
                       hi > NM_CLIP_QWEN2VL_MAX_TOKENS ? hi : lo, NM_CLIP_QWEN2VL_MAX_TOKENS);
    if (hi > 0) ip->max_tokens = hi;
    if (lo > 0) ip->min_tokens = lo;
    else if (ip->min_tokens > ip->max_tokens) ip->min_tokens = ip->max_tokens; // only the most given: the least follows
    if (ip->min_tokens > ip->max_tokens)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size,
                       "vision brick: at least %d image tokens is more than the most, %d", ip->min_tokens,
                       ip->max_tokens);
    return NM_OK;
}

static nm_status vision_load(const nm_brick_params *p, void **state, char *err, size_t err_size) {
    if (!p->model) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "vision brick: no mmproj file");
    const nm_model *m = p->feeds ? nm_brick_llm_model(p->feeds) : NULL;
    if (p->feeds && !m)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size,
                       "vision brick: nm_brick_params.feeds is not an LLM brick");
    vision_brick *v = calloc(1, sizeof *v);
    if (!v) return nm_fail(NM_ERR_NOMEM, err, err_size, "vision brick: out of memory");
    nm_status st = nm_clip_load(p->model, p->device, p->n_threads, &v->clip, err, err_size);
    if (st) {
        free(v);
        return st;
    }
    const nm_clip_info *in = nm_clip_get_info(v->clip);
    if (m && in->n_out_embd != nm_model_n_embd(m)) {
        st = nm_fail(NM_ERR_FORMAT, err, err_size,
                     "the mmproj projects images to %d-wide embeddings but the language model's embedding width is "
                     "%d: this mmproj belongs to another model",
                     in->n_out_embd, nm_model_n_embd(m));
        vision_release(v);
        return st;
    }
    v->m = m;
    v->ip = nm_image_params_from_clip(in);
    if ((st = token_limits(&v->ip, p->image_min_tokens, p->image_max_tokens, err, err_size)) != NM_OK) {
        vision_release(v);
        return st;
    }
    v->producer = p->producer;
    v->timeout_ns = v->wait_ns = p->timeout_ns;
    *state = v;
    return NM_OK;
}

bool nm_brick_vision_info(const nm_brick *b, nm_vision_info *o) {
    memset(o, 0, sizeof *o);
    const vision_brick *v = nm_brick_state_of(b, &nm_brick_vision_i);
    if (!v) return false;
    const nm_clip_info *in = nm_clip_get_info(v->clip);
    *o = (nm_vision_info){.projector = in->proj == NM_CLIP_PROJ_MLP        ? "mlp"
                                       : in->proj == NM_CLIP_PROJ_IDEFICS3 ? "idefics3"
                                                                           : "qwen2vl_merger",
                          .image_size = in->image_size, .patch_size = in->patch_size, .n_patches = in->n_patches,
                          .n_layer = in->n_layer, .n_layer_run = in->n_layer_run, .n_out = in->n_out,
                          .n_out_embd = in->n_out_embd};
    if (in->proj == NM_CLIP_PROJ_QWEN2VL) o->min_tokens = v->ip.min_tokens, o->max_tokens = v->ip.max_tokens;
    else o->min_tokens = o->max_tokens = in->n_out;
    return true;
}

static void vision_stats(void *state, nm_brick_stats *o) {
    *o = ((vision_brick *)state)->st;
    o->t_busy = o->t_decode + o->t_encode;
}
static const char *vision_device(void *state) { return nm_clip_device(((vision_brick *)state)->clip); }

// Input: an image file of up to 64 MiB; output: one encoder run's embeddings
// (the marker token slots are far smaller).
static size_t vision_slot_bytes(void *state, bool out) {
    const nm_clip_info *in = nm_clip_get_info(((vision_brick *)state)->clip);
    return out ? sizeof(float) * (size_t)in->n_out * (size_t)in->n_out_embd : (size_t)64 << 20;
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
static int layout(const vision_brick *v, const nm_image_batch *b, piece *p, int max) {
    int n = 0;
    if (!v->m) { // feeding no LLM: the encoder runs' embeddings, nothing between them
        for (int i = 0; i < b->n && n < max; i++) p[n].text[0] = '\0', p[n].image = i, n++;
        return n;
    }
#define TEXT(...) (n < max ? (snprintf(p[n].text, sizeof p[n].text, __VA_ARGS__), p[n].image = -1, n++) : n)
#define IMAGE(i) (n < max ? (p[n].text[0] = '\0', p[n].image = (i), n++) : n)
    if (nm_clip_get_info(v->clip)->proj == NM_CLIP_PROJ_MLP) {
        for (int i = 0; i < b->n; i++) IMAGE(i);
        return n;
    }
    if (nm_clip_get_info(v->clip)->proj == NM_CLIP_PROJ_QWEN2VL) { // mtmd's img_beg / img_end for qwen2vl_merger
        TEXT("<|vision_start|>");
        IMAGE(0);
        TEXT("<|vision_end|>");
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

// Writes the segment of a decoded image into `ring` (see the top of the
// file): every slot carries NM_BRICK_MORE but the last, which carries it only
// if more_follows; first_flags go to the first slot.
static nm_status put_segment(vision_brick *v, const nm_image *img, nm_tabm *ring, uint64_t first_flags,
                             bool more_follows, int32_t *n_published) {
    const nm_clip_info *in = nm_clip_get_info(v->clip);
    char err[256];
    nm_image_batch b = {0};
    double t0 = nm_now_s();
    nm_status st = nm_image_preprocess(img, &v->ip, &b, err, sizeof err);
    if (st) return vfail(v, st, "%s", err);
    v->st.t_decode += nm_now_s() - t0;
    enum { MAX_PIECES = 2 * 64 + 8 };
    piece pieces[MAX_PIECES];
    const int n_pieces = layout(v, &b, pieces, MAX_PIECES);
    if (b.n > 64 || n_pieces >= MAX_PIECES) {
        nm_image_batch_free(&b);
        return vfail(v, NM_ERR_RANGE, "%d tiles is more than the 64 we lay out", b.n);
    }
    // every run of this image: b.width x b.height (qwen2vl: its cells; else S x S)
    const int32_t n_rows = nm_clip_n_out(v->clip, b.width, b.height);
    const size_t per = 3 * (size_t)b.width * (size_t)b.height;
    const size_t embd_bytes = sizeof(float) * (size_t)n_rows * (size_t)in->n_out_embd;
    const int32_t cell = in->patch_size * in->n_merge;
    if (embd_bytes > nm_tabm_max_payload(ring)) {
        nm_image_batch_free(&b);
        return vfail(v, NM_ERR_RANGE, "output ring slots of %zu bytes cannot hold an image's %zu bytes of embeddings",
                     nm_tabm_max_payload(ring), embd_bytes);
    }
    for (int i = 0; i < n_pieces && st == NM_OK; i++) {
        nm_tabm_slot slot;
        if ((st = nm_tabm_acquire_write(ring, v->producer, v->wait_ns, &slot))) {
            vfail(v, st, "output ring: %s", nm_tabm_last_error(ring));
            break;
        }
        nm_tabm_meta *meta = slot.meta;
        if (pieces[i].image >= 0) {
            // The encoder writes its output straight into the slot.
            double te = nm_now_s();
            st = nm_clip_encode_size(v->clip, b.data + (size_t)pieces[i].image * per, b.width, b.height, slot.data);
            v->st.t_encode += nm_now_s() - te;
            v->st.n_encoded++;
            if (st) {
                vfail(v, st, "%s", nm_clip_last_error(v->clip));
                nm_tabm_cancel(ring, &slot);
                break;
            }
            meta->kind = NM_TABM_EMBD_F32;
            if (in->proj == NM_CLIP_PROJ_QWEN2VL) { // a grid [rows, columns, n_embd]: the decoder's 2-D positions
                meta->ndim = 3;
                meta->shape[0] = b.height / cell;
                meta->shape[1] = b.width / cell;
                meta->shape[2] = in->n_out_embd;
            } else {
                meta->ndim = 2;
                meta->shape[0] = n_rows;
                meta->shape[1] = in->n_out_embd;
            }
            meta->size = embd_bytes;
        } else {
            const int32_t cap = (int32_t)(slot.capacity / sizeof(int32_t) < INT32_MAX ? slot.capacity / sizeof(int32_t) : INT32_MAX);
            int32_t nt = nm_tokenize(v->m, pieces[i].text, strlen(pieces[i].text), slot.data, cap, false, true);
            if (nt <= 0) {
                st = vfail(v, nt < 0 ? NM_ERR_RANGE : NM_ERR_FORMAT, "image marker '%s' gives %d tokens", pieces[i].text, nt);
                nm_tabm_cancel(ring, &slot);
                break;
            }
            meta->kind = NM_TABM_TOKENS;
            meta->ndim = 1;
            meta->shape[0] = nt;
            meta->size = sizeof(int32_t) * (size_t)nt;
        }
        meta->user = ((i + 1 < n_pieces || more_follows) ? NM_BRICK_MORE : 0) | (i == 0 ? first_flags : 0);
        meta->request = v->request;
        if ((st = nm_tabm_publish(ring, &slot))) {
            vfail(v, st, "output ring: %s", nm_tabm_last_error(ring));
            nm_tabm_cancel(ring, &slot);
        } else {
            (*n_published)++;
            v->st.n_out_slots++;
        }
    }
    nm_image_batch_free(&b);
    return st;
}

// One IMAGE slot -> its segment. A bad image (corrupt, truncated, another
// kind of slot) writes nothing of a segment, only an empty TOKENS slot with
// NM_BRICK_ERROR (and the image slot's NM_BRICK_MORE): the LLM brick drops
// the prompt. So does a failure half way through the segment.
static nm_status vision_run(void *state, nm_brick *self, nm_tabm *in, nm_tabm *out) {
    vision_brick *v = state;
    v->wait_ns = nm_brick_wait_ns(self, v->timeout_ns);
    v->err[0] = '\0';
    nm_tabm_slot s;
    nm_status st = nm_tabm_acquire_read(in, v->wait_ns, &s);
    if (st != NM_OK) {
        if (st == NM_ERR_SHUTDOWN) nm_tabm_shutdown(out);
        else nm_brick_set_error(self, "vision brick: waiting for an image slot: %s", nm_status_str(st));
        return st;
    }
    v->st.n_in_slots++;
    // A PARAMS slot before the image (the request's parameters, as the other
    // bricks take them): the encoder has none of its own, so it is checked as
    // JSON and skipped; a malformed one fails the request.
    char pwhy[256] = "";
    bool bad_params = false;
    int64_t max_pixels = 0; // the request's "max_pixels" (a server's limit); 0: the decoder's own
    if (s.meta->kind == NM_TABM_PARAMS && (s.meta->user & NM_BRICK_MORE)) {
        cJSON *o = nm_req_parse(&s, "vision brick", pwhy, sizeof pwhy);
        bad_params = !o;
        if (o && nm_req_int(o, "max_pixels", 1, 1e15, &max_pixels, pwhy, sizeof pwhy) < 0) bad_params = true;
        nm_req_free(o);
        nm_tabm_release(in, &s);
        if ((st = nm_tabm_acquire_read(in, v->wait_ns, &s)) != NM_OK) {
            if (st == NM_ERR_SHUTDOWN) nm_tabm_shutdown(out);
            else nm_brick_set_error(self, "vision brick: waiting for an image slot: %s", nm_status_str(st));
            return st;
        }
        v->st.n_in_slots++;
    }
    const nm_tabm_meta *mt = s.meta;
    const uint64_t user = mt->user;
    const bool more = user & NM_BRICK_MORE;
    v->request = mt->request;
    nm_image img = {0};
    int32_t n_published = 0;
    char msg[256];
    const double t0 = nm_now_s();
    if (nm_req_cancelled(in, user, v->request)) { // the LLM brick learns it from a flagged slot, and the mark
        nm_tabm_release(in, &s);
        v->st.n_requests++;
        v->st.n_cancelled++;
        return nm_brick_end_request(in, 0, out, v->producer, v->wait_ns, NM_TABM_TOKENS, v->request,
                                    NM_BRICK_CANCELLED | (more ? NM_BRICK_MORE : 0), &v->st); // (its one slot read)
    }
    if (bad_params) {
        st = vfail(v, NM_ERR_FORMAT, "%s", pwhy);
    } else if (mt->kind != NM_TABM_IMAGE || mt->size == 0 || mt->size > s.capacity) {
        st = vfail(v, NM_ERR_FORMAT, "vision brick: input slot %llu is not an image file or a camera's pixels (kind %u, "
                   "%llu bytes)", (unsigned long long)mt->seq, mt->kind, (unsigned long long)mt->size);
    } else if ((st = nm_image_decode_slot(s.data, mt, s.capacity, max_pixels, &img, msg, sizeof msg)) != NM_OK) {
        vfail(v, st, "%s", msg);
    }
    v->st.t_decode += nm_now_s() - t0;
    if (st == NM_OK) {
        st = put_segment(v, &img, out, user & ~(uint64_t)(NM_BRICK_MORE | NM_BRICK_ERROR), more, &n_published);
        nm_image_free(&img);
    }
    nm_tabm_release(in, &s);
    v->st.n_requests++;
    if (st == NM_OK) {
        v->st.n_images++;
        return NM_OK;
    }
    v->st.n_bad_requests++;
    nm_brick_set_request_error(self, v->request, "%s (%s)", v->err, nm_status_str(st));
    if (st == NM_ERR_SHUTDOWN || st == NM_ERR_TIMEOUT) return st;
    // the LLM brick learns that this part of its prompt failed
    return nm_brick_end_request(in, 0, out, v->producer, v->wait_ns, NM_TABM_TOKENS, v->request,
                                NM_BRICK_ERROR | (more ? NM_BRICK_MORE : 0), &v->st); // (its one slot read)
}

static nm_status vision_estimate(void *state, const nm_brick_input *in, nm_brick_cost *e) {
    vision_brick *v = state;
    const nm_clip_info *ci = nm_clip_get_info(v->clip);
    const int32_t S = ci->image_size;
    const int32_t w = in->width > 0 ? in->width : S, h = in->height > 0 ? in->height : S;
    int32_t runs = 1;
    if (ci->proj == NM_CLIP_PROJ_IDEFICS3) {
        int32_t rows = 0, cols = 0;
        if (nm_image_idefics3_grid(w, h, &v->ip, &rows, &cols) != NM_OK) return NM_ERR_RANGE;
        runs = rows * cols + 1;
    } else if (ci->n_pinpoints > 0 && (w > S || h > S)) {
        int32_t rw = 0, rh = 0;
        if (nm_image_anyres_resolution(w, h, &v->ip, &rw, &rh) != NM_OK) return NM_ERR_RANGE;
        runs = (rw / S) * (rh / S) + 1;
    }
    int32_t tw = S, th = S;
    if (ci->proj == NM_CLIP_PROJ_QWEN2VL && nm_image_qwen2vl_size(w, h, &v->ip, &tw, &th) != NM_OK) return NM_ERR_RANGE;
    for (int32_t i = 0; i < runs; i++) nm_clip_estimate_run(v->clip, tw, th, e);
    // the decoded image and its preprocessed inputs
    e->peak_bytes += 3ull * (uint64_t)w * (uint64_t)h + sizeof(float) * 3ull * (uint64_t)tw * (uint64_t)th * (uint64_t)runs;
    return NM_OK;
}

const nm_brick_i nm_brick_vision_i = {
    .version = NM_BRICK_I_VERSION,
    .kind = NM_BRICK_VISION,
    .name = "vision",
    .in_ports = NM_PORT_BIT(NM_PORT_IMAGE),
    .out_ports = NM_PORT_BIT(NM_PORT_TOKENS) | NM_PORT_BIT(NM_PORT_EMBD),
    .units = NM_UNIT_BIT(NM_UNIT_CPU) | NM_UNIT_BIT(NM_UNIT_OPENCL),
    .load = vision_load,
    .run = vision_run,
    .release = vision_release,
    .estimate = vision_estimate,
    .stats = vision_stats,
    .device = vision_device,
    .slot_bytes = vision_slot_bytes,
};
