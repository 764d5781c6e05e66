// The vision brick feeding the LLM brick through a TABM ring: an image file
// in an IMAGE slot gives the same tokens as the direct path (encode, then
// nm_decode_embd), with the ledger at 0 bytes copied; bad images end the
// request with one error slot and nothing of a segment; a mismatched mmproj
// is a clear load error.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bricks/vision/clip.h"
#include "bricks/vision/preproc.h"
#include "gguf/gguf.h"
#include "genmmproj.h"
#include "genmodel.h"
#include "small_model.h"
#include "nmtest.h"

#define N_EMBD 64
#define N_GEN 8

static char tmpdir[256];

static const char *tmp(const char *name) {
    static char buf[4][512];
    static int k;
    char *b = buf[k++ & 3];
    snprintf(b, 512, "%s/%s", tmpdir, name);
    return b;
}

static int g_small_r; // nmtest_small_model's last answer

// A small random llama with SmolLM2's tokenizer; NULL when absent or failed (g_small_r).
static nm_model *small_model(void) {
    nm_model *m = NULL;
    g_small_r = nmtest_small_model(tmp("llm.gguf"), N_EMBD, 11, &m);
    return m;
}

// proj "mlp-anyres": mlp with LLaVA-1.6-style pinpoints (2x1, 1x2, 2x2 tiles of 32).
static bool write_mmproj(const char *path, const char *proj, int32_t n_out) {
    const bool anyres = !strcmp(proj, "mlp-anyres");
    nm_genmmproj_params p = nm_genmmproj_default_params(anyres ? "mlp" : proj);
    if (anyres) {
        static const int32_t pins[3][2] = {{64, 32}, {32, 64}, {64, 64}};
        p.n_pinpoints = 3;
        memcpy(p.pinpoints, pins, sizeof pins);
    }
    p.image_size = 32;
    p.patch_size = 8;
    p.n_embd = 64;
    p.n_ff = 128;
    p.n_head = 4;
    p.n_layer = 3;
    p.n_out_embd = n_out;
    p.seed = 5;
    char err[256];
    if (nm_genmmproj_write(path, &p, err, sizeof err) != NM_OK) {
        fprintf(stderr, "  genmmproj: %s\n", err);
        return false;
    }
    return true;
}

// A w x h PPM with a smooth gradient and a square.
static void write_ppm(const char *path, int w, int h) {
    FILE *f = fopen(path, "wb");
    fprintf(f, "P6\n%d %d\n255\n", w, h);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            bool sq = x > w / 4 && x < w / 2 && y > h / 3 && y < 2 * h / 3;
            unsigned char px[3] = {(unsigned char)(x * 255 / w), (unsigned char)(y * 255 / h), sq ? 255 : 40};
            fwrite(px, 1, 3, f);
        }
    fclose(f);
}

typedef struct lane {
    nm_brick *b;
    nm_tabm *in, *out;
    nm_status st;
} lane;

static void *lane_main(void *arg) {
    lane *l = arg;
    l->st = nm_brick_run(l->b, l->in, l->out);
    return NULL;
}

// The LLM brick on model m (greedy, N_GEN tokens).
static nm_brick *llm_brick(nm_model *m, nm_ledger *led) {
    nm_brick_params p = nm_brick_default_params(NM_BRICK_LLM);
    p.llm_model = m;
    p.n_ctx = 256;
    p.n_threads = 2;
    p.sampling.temp = 0;
    p.llm.n_predict = N_GEN;
    p.ledger = led;
    nm_brick *b = NULL;
    return nm_brick_load(NULL, &p, &b, NULL, 0) == NM_OK ? b : NULL;
}

static nm_status vision_brick(const char *mmproj, const nm_brick *llm, nm_ledger *led, nm_brick **out, char *err,
                              size_t err_size) {
    nm_brick_params p = nm_brick_default_params(NM_BRICK_VISION);
    p.model = mmproj;
    p.feeds = llm;
    p.n_threads = 2;
    p.ledger = led;
    return nm_brick_load(NULL, &p, out, err, err_size);
}

// Writes a token slot of `text`.
static bool put_text(nm_tabm *in, const nm_model *m, const char *text, bool more) {
    nm_tabm_slot s;
    if (nm_tabm_acquire_write(in, 0, -1, &s) != NM_OK) return false;
    int32_t n = nm_tokenize(m, text, strlen(text), s.data, (int32_t)(s.capacity / 4), false, true);
    if (n <= 0) return nm_tabm_cancel(in, &s), false;
    s.meta->kind = NM_TABM_TOKENS;
    s.meta->ndim = 1;
    s.meta->shape[0] = n;
    s.meta->size = 4 * (size_t)n;
    s.meta->user = more ? NM_BRICK_MORE : 0;
    return nm_tabm_publish(in, &s) == NM_OK;
}

// Publishes n bytes as an IMAGE slot with `user` flags and request id 7.
static bool put_image_bytes(nm_tabm *r, const void *data, size_t n, uint64_t user) {
    nm_tabm_slot s;
    if (nm_tabm_acquire_write(r, 0, -1, &s) != NM_OK) return false;
    if (n > s.capacity) return nm_tabm_cancel(r, &s), false;
    memcpy(s.data, data, n);
    s.meta->kind = NM_TABM_IMAGE;
    s.meta->ndim = 1;
    s.meta->shape[0] = (int64_t)n;
    s.meta->size = n;
    s.meta->user = user;
    s.meta->request = 7;
    return nm_tabm_publish(r, &s) == NM_OK;
}

static char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *b = malloc(1 << 20);
    *n = b ? fread(b, 1, 1 << 20, f) : 0;
    fclose(f);
    return b;
}

// Runs "before <image> after" through the rings: text slots, the image file
// in an IMAGE slot that the vision brick turns into its segment, in order;
// tokens into out (returns the count); *n_pos: the positions of the segment.
static int ring_generate(nm_model *m, const char *mmproj, const char *image, int32_t *out, nm_ledger *led,
                         int32_t *n_pos) {
    nm_tabm *in = NULL, *outr = NULL, *img = NULL;
    nm_brick *llm = llm_brick(m, led), *v = NULL;
    int n = -1;
    lane l = {0};
    pthread_t th;
    size_t n_img = 0;
    char *bytes = read_all(image, &n_img);
    if (!llm || !bytes || vision_brick(mmproj, llm, led, &v, NULL, 0) ||
        nm_tabm_create(NULL, 4, nm_brick_out_slot_bytes(v) + 4096, &in, NULL, 0) ||
        nm_tabm_create(NULL, 4, 64, &outr, NULL, 0) || nm_tabm_create(NULL, 1, n_img, &img, NULL, 0))
        goto done;
    l = (lane){llm, in, outr, NM_OK};
    pthread_create(&th, NULL, lane_main, &l);
    bool ok = put_text(in, m, "Look:", true) && put_image_bytes(img, bytes, n_img, NM_BRICK_MORE) &&
              nm_brick_step(v, img, in) == NM_OK && put_text(in, m, " it is", false);
    if (!ok) fprintf(stderr, "  the image step: %s\n", nm_brick_last_error(v));
    n = 0;
    while (ok) {
        nm_tabm_slot r;
        if (nm_tabm_acquire_read(outr, -1, &r) != NM_OK) break;
        const int32_t *t = r.data;
        for (uint64_t i = 0; i < r.meta->size / 4 && n < 64; i++) out[n++] = t[i];
        bool end = !(r.meta->user & NM_BRICK_MORE);
        nm_tabm_release(outr, &r);
        if (end) break;
    }
    nm_tabm_shutdown(in);
    pthread_join(th, NULL);
    // what the LLM brick decoded: the two texts, the segment, the generated tokens
    int32_t t1 = -nm_tokenize(m, "Look:", 5, NULL, 0, false, true), t2 = -nm_tokenize(m, " it is", 6, NULL, 0, false, true);
    *n_pos = nm_brick_llm_pos(llm) - t1 - t2 - n;
    nm_brick_stats vs = nm_brick_get_stats(v);
    if (vs.n_requests != 1 || vs.n_images != 1 || vs.n_bad_requests != 0 || vs.n_in_slots != 1) n = -2;
done:
    free(bytes);
    nm_brick_free(v);
    nm_brick_free(llm);
    nm_tabm_free(in);
    nm_tabm_free(outr);
    nm_tabm_free(img);
    return n;
}

// The same prompt the direct way (mlp: the image is its embeddings alone;
// anyres: the tiles' then the overview's, nothing between them).
static int direct_generate(nm_model *m, const char *mmproj, const char *image, int32_t *out) {
    nm_clip *clip = NULL;
    if (nm_clip_load(mmproj, NULL, 2, &clip, NULL, 0)) return -1;
    const nm_clip_info *ci = nm_clip_get_info(clip);
    nm_ctx *c = NULL;
    nm_ctx_params cp = nm_ctx_default_params();
    cp.n_ctx = 256;
    if (nm_ctx_create(m, &cp, &c, NULL, 0)) {
        nm_clip_free(clip);
        return -1;
    }
    nm_image img = {0};
    nm_image_batch bt = {0};
    nm_image_params ip = nm_image_params_from_clip(ci);
    float *embd = malloc(sizeof(float) * (size_t)ci->n_out * (size_t)ci->n_out_embd);
    int32_t tok[64], n = 0, pos = 0;
    if (nm_image_load(image, &img, NULL, 0) || nm_image_preprocess(&img, &ip, &bt, NULL, 0)) goto done;
    int32_t nt = nm_tokenize(m, "Look:", 5, tok, 64, false, true);
    nm_decode(c, tok, nt, pos, false);
    pos += nt;
    for (int32_t i = 0; i < bt.n; i++) {
        if (nm_clip_encode(clip, bt.data + (size_t)i * 3 * ci->image_size * ci->image_size, embd)) goto done;
        nm_decode_embd(c, embd, ci->n_out, pos, false);
        pos += ci->n_out;
    }
    nt = nm_tokenize(m, " it is", 6, tok, 64, false, true);
    nm_decode(c, tok, nt, pos, false);
    pos += nt;
    for (; n < N_GEN; n++) {
        const float *lg = nm_get_logits(c, -1);
        int32_t best = 0;
        for (int32_t i = 1; i < nm_model_n_vocab(m); i++) best = lg[i] > lg[best] ? i : best;
        if (nm_token_is_eog(m, best)) break;
        out[n] = best;
        if (nm_decode(c, &best, 1, pos++, false)) break;
    }
done:
    free(embd);
    nm_image_free(&img);
    nm_image_batch_free(&bt);
    nm_ctx_free(c);
    nm_clip_free(clip);
    return n;
}

NM_TEST(tabm_vision_image_prompt_in_place) {
    nm_model *m = small_model();
    if (!m) NM_NEED_SMALL_MODEL(g_small_r);
    const char *proj[3] = {"mlp", "idefics3", "mlp-anyres"};
    write_ppm(tmp("img.ppm"), 50, 40);
    for (int k = 0; k < 3; k++) {
        NM_CHECK(write_mmproj(tmp("mm.gguf"), proj[k], N_EMBD));
        nm_clip *clip = NULL;
        NM_CHECK(nm_clip_load(tmp("mm.gguf"), NULL, 1, &clip, NULL, 0) == NM_OK);
        if (!clip) continue;
        const nm_clip_info ci = *nm_clip_get_info(clip);
        nm_clip_free(clip);
        nm_ledger *led = nm_ledger_create();
        int32_t got[64], want[64], n_pos = 0;
        int n = ring_generate(m, tmp("mm.gguf"), tmp("img.ppm"), got, led, &n_pos);
        NM_CHECK(n == N_GEN); // a random model does not stop early (EOG is one id of 49152)
        NM_CHECK(nm_ledger_total(led) == 0); // the embeddings were decoded where the encoder wrote them
        if (k != 1) {
            // mlp: the embeddings alone; anyres (50x40 -> the 64x64 pinpoint): 2x2 tiles + the overview
            NM_CHECK(n_pos == (k == 0 ? 1 : 5) * ci.n_out);
            NM_CHECK(ci.n_pinpoints == (k == 0 ? 0 : 3));
            int nd = direct_generate(m, tmp("mm.gguf"), tmp("img.ppm"), want);
            NM_CHECK(nd == n);
            for (int i = 0; i < n && i < nd; i++) NM_CHECK(got[i] == want[i]);
            if (getenv("NM_TEST_VERBOSE")) for (int i = 0; i < n; i++) fprintf(stderr, "  token %d: ring %d direct %d\n", i, got[i], want[i]);
        } else {
            // tiles and the global image, each n_out embeddings, plus marker tokens
            NM_CHECK(n_pos > 2 * ci.n_out);
            NM_CHECK(n > 0);
        }
        nm_ledger_free(led);
    }
    nm_model_free(m);
}

// One request's output on `r`: exactly one slot, empty, NM_BRICK_ERROR, the
// request id and the image slot's NM_BRICK_MORE carried.
static bool one_error_slot(nm_tabm *r, bool more) {
    nm_tabm_slot s;
    if (nm_tabm_acquire_read(r, 0, &s) != NM_OK) return false;
    bool ok = s.meta->kind == NM_TABM_TOKENS && s.meta->ndim == 0 && s.meta->size == 0 &&
              (s.meta->user & NM_BRICK_ERROR) && !!(s.meta->user & NM_BRICK_MORE) == more && s.meta->request == 7;
    nm_tabm_release(r, &s);
    return ok && nm_tabm_acquire_read(r, 0, &s) == NM_ERR_AGAIN;
}

NM_TEST(tabm_vision_errors_write_no_segment) {
    nm_model *m = small_model();
    if (!m) NM_NEED_SMALL_MODEL(g_small_r);
    char err[256];
    nm_brick *llm = llm_brick(m, NULL), *v = NULL, *wide = NULL;
    nm_tabm *in = NULL, *img = NULL;
    NM_CHECK(llm != NULL);
    NM_CHECK(write_mmproj(tmp("mm.gguf"), "mlp", N_EMBD) && write_mmproj(tmp("mm48.gguf"), "mlp", 48));
    // an mmproj made for another width, and a brick to feed that is no LLM brick
    NM_CHECK(vision_brick(tmp("mm48.gguf"), llm, NULL, &wide, err, sizeof err) == NM_ERR_FORMAT && wide == NULL);
    NM_CHECK(strstr(err, "48") != NULL && strstr(err, "64") != NULL);
    nm_brick_params tp = nm_brick_default_params(NM_BRICK_TTS);
    nm_brick *tts = NULL;
    NM_CHECK(nm_brick_load(NULL, &tp, &tts, err, sizeof err) == NM_OK);
    NM_CHECK(vision_brick(tmp("mm.gguf"), tts, NULL, &wide, err, sizeof err) == NM_ERR_INVALID_ARG && wide == NULL);
    NM_CHECK(strstr(err, "not an LLM brick") != NULL);
    nm_brick_free(tts);
    NM_CHECK(vision_brick(tmp("mm.gguf"), llm, NULL, &v, err, sizeof err) == NM_OK);
    NM_CHECK(nm_tabm_create(NULL, 4, 1 << 16, &in, NULL, 0) == NM_OK);
    NM_CHECK(nm_tabm_create(NULL, 1, 1 << 16, &img, NULL, 0) == NM_OK);
    if (!v || !in || !img) goto done;
    // a corrupt and a truncated image, then a slot that is no image at all
    static const char bad_png[] = "\x89PNG\r\n\x1a\n garbage that is not a png";
    NM_CHECK(put_image_bytes(img, bad_png, 33, 0) && nm_brick_step(v, img, in) == NM_OK);
    NM_CHECK(one_error_slot(in, false));
    NM_CHECK(strlen(nm_brick_last_error(v)) > 0);
    static const char trunc[] = "P6\n20 20\n255\nabcdef";
    NM_CHECK(put_image_bytes(img, trunc, sizeof trunc - 1, NM_BRICK_MORE) && nm_brick_step(v, img, in) == NM_OK);
    NM_CHECK(one_error_slot(in, true)); // the rest of the prompt follows: the LLM brick skips it
    nm_tabm_slot s;
    NM_CHECK(nm_tabm_acquire_write(img, 0, -1, &s) == NM_OK);
    s.meta->kind = NM_TABM_TOKENS;
    s.meta->request = 7;
    NM_CHECK(nm_tabm_publish(img, &s) == NM_OK && nm_brick_step(v, img, in) == NM_OK);
    NM_CHECK(one_error_slot(in, false));
    NM_CHECK(strstr(nm_brick_last_error(v), "input slot") && strstr(nm_brick_last_error(v), "not an image file") != NULL);
    // slots too small for an image's embeddings
    write_ppm(tmp("img.ppm"), 20, 20);
    size_t n_img = 0;
    char *ppm = read_all(tmp("img.ppm"), &n_img);
    nm_tabm *tiny = NULL;
    NM_CHECK(nm_tabm_create(NULL, 2, 256, &tiny, NULL, 0) == NM_OK);
    NM_CHECK(ppm && put_image_bytes(img, ppm, n_img, 0) && nm_brick_step(v, img, tiny) == NM_OK);
    NM_CHECK(one_error_slot(tiny, false));
    NM_CHECK(strstr(nm_brick_last_error(v), "cannot hold") != NULL);
    nm_brick_stats vs = nm_brick_get_stats(v);
    NM_CHECK(vs.n_requests == 4 && vs.n_bad_requests == 4 && vs.n_images == 0 && vs.n_encoded == 0);
    free(ppm);
    nm_tabm_free(tiny);
    // a language model given as the mmproj
    nm_brick *notmm = NULL;
    NM_CHECK(vision_brick(tmp("llm.gguf"), llm, NULL, &notmm, err, sizeof err) == NM_ERR_FORMAT && notmm == NULL);
    NM_CHECK(strstr(err, "mmproj") != NULL);
done:
    nm_tabm_free(in);
    nm_tabm_free(img);
    nm_brick_free(v);
    nm_brick_free(llm);
    nm_model_free(m);
}

// Feeding no LLM: the encoder runs' embeddings alone, one slot each (tiles,
// then the overview), each what nm_clip_encode makes of that input.
NM_TEST(tabm_vision_encoder_alone) {
    NM_CHECK(write_mmproj(tmp("any.gguf"), "mlp-anyres", N_EMBD));
    write_ppm(tmp("img.ppm"), 50, 40);
    char err[256];
    nm_brick *v = NULL;
    nm_clip *clip = NULL;
    nm_tabm *img = NULL, *out = NULL;
    size_t n_img = 0;
    char *bytes = read_all(tmp("img.ppm"), &n_img);
    NM_CHECK(vision_brick(tmp("any.gguf"), NULL, NULL, &v, err, sizeof err) == NM_OK);
    NM_CHECK(nm_clip_load(tmp("any.gguf"), NULL, 2, &clip, err, sizeof err) == NM_OK);
    NM_CHECK(bytes && nm_tabm_create(NULL, 1, n_img, &img, NULL, 0) == NM_OK);
    if (!v || !clip || !img) goto done;
    NM_CHECK(nm_tabm_create(NULL, 8, nm_brick_out_slot_bytes(v), &out, NULL, 0) == NM_OK);
    // the image starts a prompt at position 5: its first slot says so, the others do not
    NM_CHECK(put_image_bytes(img, bytes, n_img, NM_LLM_IN_POS(5)) && nm_brick_step(v, img, out) == NM_OK);
    const nm_clip_info *ci = nm_clip_get_info(clip);
    nm_image im = {0};
    nm_image_batch bt = {0};
    nm_image_params ip = nm_image_params_from_clip(ci);
    NM_CHECK(nm_image_load(tmp("img.ppm"), &im, NULL, 0) == NM_OK && nm_image_preprocess(&im, &ip, &bt, NULL, 0) == NM_OK);
    NM_CHECK(bt.n == 5); // 2x2 tiles and the overview
    float *want = malloc(nm_brick_out_slot_bytes(v));
    for (int32_t i = 0; i < bt.n && want; i++) {
        nm_tabm_slot s;
        if (nm_tabm_acquire_read(out, 0, &s) != NM_OK) {
            NM_CHECK(!"a slot per encoder run");
            break;
        }
        NM_CHECK(s.meta->kind == NM_TABM_EMBD_F32 && s.meta->shape[0] == ci->n_out && s.meta->request == 7);
        NM_CHECK(!!(s.meta->user & NM_BRICK_MORE) == (i + 1 < bt.n));
        NM_CHECK(!!(s.meta->user & NM_LLM_IN_AT_POS) == (i == 0) && (i > 0 || NM_LLM_IN_POS_OF(s.meta->user) == 5));
        NM_CHECK(nm_clip_encode(clip, bt.data + (size_t)i * 3 * ci->image_size * ci->image_size, want) == NM_OK);
        NM_CHECK(!memcmp(s.data, want, nm_brick_out_slot_bytes(v)));
        nm_tabm_release(out, &s);
    }
    nm_tabm_slot s;
    NM_CHECK(nm_tabm_acquire_read(out, 0, &s) == NM_ERR_AGAIN);
    free(want);
    nm_image_free(&im);
    nm_image_batch_free(&bt);
done:
    free(bytes);
    nm_tabm_free(img);
    nm_tabm_free(out);
    nm_clip_free(clip);
    nm_brick_free(v);
}

// A camera's frame in the slot (pixels, shape [h, w, c]: RGB24, grey, YUYV)
// gives the embeddings of the same picture as a file: the brick decodes both
// into the same RGB.
NM_TEST(tabm_vision_camera_pixels_as_a_file) {
    NM_CHECK(write_mmproj(tmp("mmc.gguf"), "mlp", N_EMBD));
    char err[256];
    nm_brick *v = NULL;
    nm_tabm *img = NULL, *out = NULL;
    NM_CHECK(vision_brick(tmp("mmc.gguf"), NULL, NULL, &v, err, sizeof err) == NM_OK);
    enum { W = 40, H = 30 };
    static uint8_t rgb[H * W * 3], grey[H * W], yuyv[H * W * 2];
    for (int i = 0; i < H * W; i++) {
        const int x = i % W, y = i / W;
        rgb[3 * i] = (uint8_t)(x * 6), rgb[3 * i + 1] = (uint8_t)(y * 8), rgb[3 * i + 2] = (uint8_t)((x * y) & 255);
        grey[i] = (uint8_t)(x * 3 + y * 2);
        yuyv[2 * i] = (uint8_t)(16 + x * 5), yuyv[2 * i + 1] = (uint8_t)(x & 1 ? 60 + y * 4 : 200 - y * 3);
    }
    const struct { const uint8_t *px; int c; } frames[3] = {{rgb, 3}, {grey, 1}, {yuyv, 2}};
    NM_CHECK(nm_tabm_create(NULL, 1, sizeof rgb + 64, &img, NULL, 0) == NM_OK);
    float *got = v ? malloc(nm_brick_out_slot_bytes(v)) : NULL;
    if (v) NM_CHECK(nm_tabm_create(NULL, 8, nm_brick_out_slot_bytes(v), &out, NULL, 0) == NM_OK);
    for (int k = 0; k < 3 && got && img && out; k++) {
        const size_t n = (size_t)H * W * (size_t)frames[k].c;
        // as pixels
        nm_tabm_slot s;
        NM_CHECK(nm_tabm_acquire_write(img, 0, -1, &s) == NM_OK);
        memcpy(s.data, frames[k].px, n);
        *s.meta = (nm_tabm_meta){.kind = NM_TABM_IMAGE, .ndim = 3, .shape = {H, W, frames[k].c}, .size = n, .request = 7};
        NM_CHECK(nm_tabm_publish(img, &s) == NM_OK && nm_brick_step(v, img, out) == NM_OK);
        NM_CHECK(nm_tabm_acquire_read(out, 0, &s) == NM_OK && s.meta->kind == NM_TABM_EMBD_F32);
        memcpy(got, s.data, nm_brick_out_slot_bytes(v));
        nm_tabm_release(out, &s);
        // the same picture as a PPM file (its RGB from the decoder of pixels)
        nm_image im = {0};
        NM_CHECK(nm_image_from_pixels(frames[k].px, n, H, W, frames[k].c, 0, &im, NULL, 0) == NM_OK);
        static char ppm[64 + H * W * 3];
        const int hl = snprintf(ppm, 64, "P6\n%d %d\n255\n", W, H);
        if (im.rgb) memcpy(ppm + hl, im.rgb, sizeof rgb);
        nm_image_free(&im);
        NM_CHECK(put_image_bytes(img, ppm, (size_t)hl + sizeof rgb, 0) && nm_brick_step(v, img, out) == NM_OK);
        NM_CHECK(nm_tabm_acquire_read(out, 0, &s) == NM_OK && !memcmp(s.data, got, nm_brick_out_slot_bytes(v)));
        nm_tabm_release(out, &s);
    }
    // pixels whose shape does not hold their bytes: the request fails, named
    nm_tabm_slot s;
    if (img && out && v) {
        NM_CHECK(nm_tabm_acquire_write(img, 0, -1, &s) == NM_OK);
        *s.meta = (nm_tabm_meta){.kind = NM_TABM_IMAGE, .ndim = 3, .shape = {H, W - 1, 2}, .size = (uint64_t)H * (W - 1) * 2, .request = 7};
        NM_CHECK(nm_tabm_publish(img, &s) == NM_OK && nm_brick_step(v, img, out) == NM_OK);
        NM_CHECK(nm_tabm_acquire_read(out, 0, &s) == NM_OK && (s.meta->user & NM_BRICK_ERROR));
        nm_tabm_release(out, &s);
        NM_CHECK(strstr(nm_brick_last_error(v), "odd"));
    }
    free(got);
    nm_tabm_free(img);
    nm_tabm_free(out);
    nm_brick_free(v);
}

// A request's PARAMS slot before its image: the encoder has no parameters of
// its own, so valid JSON is skipped (the same embeddings as the image alone,
// unknown fields ignored as the other bricks ignore them) and a malformed
// slot fails the request with the cause named, its image read and dropped.
NM_TEST(tabm_vision_request_params) {
    NM_CHECK(write_mmproj(tmp("p.gguf"), "mlp", N_EMBD));
    write_ppm(tmp("imgp.ppm"), 24, 20);
    char err[256];
    nm_brick *v = NULL;
    nm_tabm *img = NULL, *out = NULL;
    size_t n_img = 0;
    char *bytes = read_all(tmp("imgp.ppm"), &n_img);
    NM_CHECK(vision_brick(tmp("p.gguf"), NULL, NULL, &v, err, sizeof err) == NM_OK);
    NM_CHECK(bytes && nm_tabm_create(NULL, 2, n_img > 256 ? n_img : 256, &img, NULL, 0) == NM_OK);
    if (!v || !img) goto done;
    NM_CHECK(nm_tabm_create(NULL, 4, nm_brick_out_slot_bytes(v), &out, NULL, 0) == NM_OK);
    float *embd[2] = {malloc(nm_brick_out_slot_bytes(v)), malloc(nm_brick_out_slot_bytes(v))};
    static const char *const js[3] = {NULL, "{\"temperature\": 0.5, \"anything\": [1, 2]}", "{\"n_predict\": "};
    for (int k = 0; k < 3; k++) {
        if (js[k]) {
            nm_tabm_slot s;
            NM_CHECK(nm_tabm_acquire_write(img, 0, -1, &s) == NM_OK);
            const size_t m = strlen(js[k]);
            memcpy(s.data, js[k], m);
            *s.meta = (nm_tabm_meta){.kind = NM_TABM_PARAMS, .ndim = 1, .shape = {(int64_t)m}, .size = m,
                                     .user = NM_BRICK_MORE, .request = 7};
            NM_CHECK(nm_tabm_publish(img, &s) == NM_OK);
        }
        NM_CHECK(put_image_bytes(img, bytes, n_img, 0) && nm_brick_step(v, img, out) == NM_OK);
        if (k == 2) {
            NM_CHECK(one_error_slot(out, false));
            NM_CHECK(strstr(nm_brick_last_error(v), "parameters slot") && strstr(nm_brick_last_error(v), "not JSON"));
            break;
        }
        nm_tabm_slot s;
        NM_CHECK(nm_tabm_acquire_read(out, 0, &s) == NM_OK);
        NM_CHECK(s.meta->kind == NM_TABM_EMBD_F32 && !(s.meta->user & (NM_BRICK_MORE | NM_BRICK_ERROR)));
        if (embd[k]) memcpy(embd[k], s.data, nm_brick_out_slot_bytes(v));
        nm_tabm_release(out, &s);
    }
    NM_CHECK(embd[0] && embd[1] && !memcmp(embd[0], embd[1], nm_brick_out_slot_bytes(v)));
    nm_tabm_slot s;
    NM_CHECK(nm_tabm_acquire_read(img, 0, &s) == NM_ERR_AGAIN); // every input slot read
    nm_brick_stats vs = nm_brick_get_stats(v);
    NM_CHECK(vs.n_requests == 3 && vs.n_bad_requests == 1 && vs.n_in_slots == 5);
    free(embd[0]), free(embd[1]);
done:
    free(bytes);
    nm_tabm_free(img);
    nm_tabm_free(out);
    nm_brick_free(v);
}

NM_TEST(tabm_vision_not_an_mmproj) {
    char err[256];
    nm_clip *v = NULL;
    FILE *f = fopen(tmp("empty.gguf"), "wb");
    fclose(f);
    NM_CHECK(nm_clip_load(tmp("empty.gguf"), NULL, 1, &v, err, sizeof err) == NM_ERR_FORMAT && v == NULL);
    NM_CHECK(nm_clip_load(tmp("absent.gguf"), NULL, 1, &v, err, sizeof err) == NM_ERR_IO && v == NULL);
}

// Anyres pinpoints: read in order; an odd count, a resolution that is not a
// multiple of the tile and a non-numeric array are clear errors.
NM_TEST(tabm_vision_anyres_pinpoints) {
    char err[256];
    nm_clip *v = NULL;
    NM_CHECK(write_mmproj(tmp("any.gguf"), "mlp-anyres", N_EMBD));
    NM_CHECK(nm_clip_load(tmp("any.gguf"), NULL, 1, &v, err, sizeof err) == NM_OK);
    if (v) {
        const nm_clip_info *ci = nm_clip_get_info(v);
        NM_CHECK(ci->n_pinpoints == 3 && ci->pinpoints[0][0] == 64 && ci->pinpoints[0][1] == 32 &&
                 ci->pinpoints[2][0] == 64 && ci->pinpoints[2][1] == 64);
        nm_clip_free(v);
    }
    struct {
        int32_t pins[64][2];
        int n; // pairs
        const char *want;
    } bad[] = {
        {{{64, 32}, {48, 64}}, 2, "not a multiple of the 32x32 tile"},
        {{{64, 0}}, 1, "not a multiple"},
        {{{32 * 65, 32}}, 1, "1 to 64 tiles a side"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        nm_genmmproj_params p = nm_genmmproj_default_params("mlp");
        p.image_size = 32;
        p.patch_size = 8;
        p.n_out_embd = N_EMBD;
        p.n_pinpoints = bad[i].n;
        memcpy(p.pinpoints, bad[i].pins, sizeof p.pinpoints);
        NM_CHECK(nm_genmmproj_write(tmp("bad-any.gguf"), &p, err, sizeof err) == NM_OK);
        v = NULL;
        NM_CHECK(nm_clip_load(tmp("bad-any.gguf"), NULL, 1, &v, err, sizeof err) == NM_ERR_UNSUPPORTED && v == NULL);
        if (!strstr(err, bad[i].want)) fprintf(stderr, "  case %zu: %s\n", i, err);
        NM_CHECK(strstr(err, bad[i].want) != NULL);
    }
    // an odd count and strings: hand-written headers (the generator writes pairs);
    // the pinpoints are checked with the hyperparameters, before any tensor
    const int32_t three[3] = {64, 32, 64};
    const char *strs[2] = {"64", "32"};
    const float mean[3] = {0.5f, 0.5f, 0.5f};
    for (int k = 0; k < 2; k++) {
        nm_gguf_writer *gw = nm_gguf_writer_create();
        NM_CHECK(gw && nm_gguf_writer_add_str(gw, "general.architecture", "clip") == NM_OK &&
                 nm_gguf_writer_add_str(gw, "clip.projector_type", "mlp") == NM_OK &&
                 nm_gguf_writer_add_u32(gw, "clip.vision.embedding_length", 64) == NM_OK &&
                 nm_gguf_writer_add_u32(gw, "clip.vision.feed_forward_length", 128) == NM_OK &&
                 nm_gguf_writer_add_u32(gw, "clip.vision.attention.head_count", 4) == NM_OK &&
                 nm_gguf_writer_add_u32(gw, "clip.vision.block_count", 3) == NM_OK &&
                 nm_gguf_writer_add_u32(gw, "clip.vision.image_size", 32) == NM_OK &&
                 nm_gguf_writer_add_u32(gw, "clip.vision.patch_size", 8) == NM_OK &&
                 nm_gguf_writer_add_f32(gw, "clip.vision.attention.layer_norm_epsilon", 1e-5f) == NM_OK &&
                 nm_gguf_writer_add_arr(gw, "clip.vision.image_mean", NM_GGUF_FLOAT32, mean, 3) == NM_OK &&
                 nm_gguf_writer_add_arr(gw, "clip.vision.image_std", NM_GGUF_FLOAT32, mean, 3) == NM_OK);
        NM_CHECK(k == 0 ? nm_gguf_writer_add_arr(gw, "clip.vision.image_grid_pinpoints", NM_GGUF_INT32, three, 3) == NM_OK
                        : nm_gguf_writer_add_arr_str(gw, "clip.vision.image_grid_pinpoints", strs, 2) == NM_OK);
        NM_CHECK(nm_gguf_writer_write(gw, tmp("bad-any2.gguf")) == NM_OK);
        nm_gguf_writer_free(gw);
        v = NULL;
        NM_CHECK(nm_clip_load(tmp("bad-any2.gguf"), NULL, 1, &v, err, sizeof err) == NM_ERR_FORMAT && v == NULL);
        if (!strstr(err, "image_grid_pinpoints")) fprintf(stderr, "  case %d: %s\n", k, err);
        NM_CHECK(strstr(err, "image_grid_pinpoints") != NULL);
    }
}

int main(int argc, char **argv) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/nm-tabm-vision-%d", (int)getpid());
    if (mkdtemp(strcpy(tmpdir, "/tmp/nm-tabm-vision-XXXXXX")) == NULL) return 1;
    int rc = nmtest_main(argc, argv);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return rc;
}
