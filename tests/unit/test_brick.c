// The brick interface (include/nanomind.h, "bricks"): the four built-in
// implementations as the table says; a brick written outside the library
// plugs in through the same nm_brick_i; the run loop and its shutdown; the
// cost estimates against what the models are; and a pipeline of two bricks
// on their own lanes, speech in, speech out, with every copy counted.
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/audio/audio.h"
#include "genmmproj.h"
#include "genmodel.h"
#include "quant/quant.h"
#include "nmtest.h"

// ---- the table --------------------------------------------------------------------------

NM_TEST(builtin_table) {
    const struct {
        nm_brick_kind kind;
        const char *name;
        uint32_t in, out, units;
    } want[] = {
        {NM_BRICK_STT, "stt", NM_PORT_BIT(NM_PORT_PCM), NM_PORT_BIT(NM_PORT_TEXT), NM_UNIT_BIT(NM_UNIT_CPU)},
        {NM_BRICK_VISION, "vision", NM_PORT_BIT(NM_PORT_IMAGE), NM_PORT_BIT(NM_PORT_TOKENS) | NM_PORT_BIT(NM_PORT_EMBD),
         NM_UNIT_BIT(NM_UNIT_CPU) | NM_UNIT_BIT(NM_UNIT_OPENCL)},
        {NM_BRICK_LLM, "llm", NM_PORT_BIT(NM_PORT_TOKENS) | NM_PORT_BIT(NM_PORT_EMBD) | NM_PORT_BIT(NM_PORT_TEXT),
         NM_PORT_BIT(NM_PORT_TOKENS) | NM_PORT_BIT(NM_PORT_TEXT),
         NM_UNIT_BIT(NM_UNIT_CPU) | NM_UNIT_BIT(NM_UNIT_OPENCL)},
        {NM_BRICK_TTS, "tts", NM_PORT_BIT(NM_PORT_TEXT), NM_PORT_BIT(NM_PORT_PCM),
         NM_UNIT_BIT(NM_UNIT_CPU) | NM_UNIT_BIT(NM_UNIT_OPENCL)},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const nm_brick_i *b = nm_brick_builtin(want[i].kind);
        NM_CHECK(b != NULL);
        if (!b) continue;
        NM_CHECK(b->version == NM_BRICK_I_VERSION && b->kind == want[i].kind && !strcmp(b->name, want[i].name));
        NM_CHECK(b->in_ports == want[i].in && b->out_ports == want[i].out && b->units == want[i].units);
        NM_CHECK(b->load && b->run && b->release && b->estimate && b->stats && b->slot_bytes);
    }
    NM_CHECK(nm_brick_builtin((nm_brick_kind)99) == NULL);
    // the defaults of each kind
    nm_brick_params p = nm_brick_default_params(NM_BRICK_LLM);
    NM_CHECK(p.kind == NM_BRICK_LLM && p.timeout_ns == -1 && p.n_gpu_layers == -1 && p.llm.n_predict == 128 &&
             p.llm.out_batch == 1 && p.stt.strategy == NM_STT_BEAM && p.tts.rate_wpm == 175);
    nm_brick *b = (nm_brick *)1;
    char err[256];
    p.kind = (nm_brick_kind)99;
    NM_CHECK(nm_brick_load(NULL, &p, &b, err, sizeof err) == NM_ERR_INVALID_ARG && b == NULL);
    NM_CHECK(strstr(err, "unknown kind 99") != NULL);
    p = nm_brick_default_params(NM_BRICK_STT);
    p.model = "/nonexistent/whisper.gguf";
    NM_CHECK(nm_brick_load(NULL, &p, &b, err, sizeof err) == NM_ERR_IO && b == NULL);
    NM_CHECK(strstr(err, "/nonexistent/whisper.gguf") != NULL);
    NM_CHECK(nm_brick_get_kind(NULL) == 0 && !strcmp(nm_brick_last_error(NULL), "") &&
             nm_brick_estimate(NULL, NULL, NULL) == NM_ERR_INVALID_ARG);
}

// ---- a brick from outside the library ----------------------------------------------------
// "upper": TEXT in, the same text in capitals out, one slot per input slot;
// a slot holding "fail" fails its request with a message.
typedef struct upper {
    int *released; // set on release, so the test sees it
    uint64_t n;
} upper;

static int g_upper_mask_cpus, g_upper_mask_first; // the serving thread's allowed cores (count, first) at the last request

static nm_status upper_load(const nm_brick_params *p, void **state, char *err, size_t err_size) {
    if (!p->model) {
        snprintf(err, err_size, "upper: the model names the release flag");
        return NM_ERR_INVALID_ARG;
    }
    upper *u = calloc(1, sizeof *u);
    if (!u) return NM_ERR_NOMEM;
    u->released = (int *)(uintptr_t)strtoull(p->model, NULL, 16);
    *state = u;
    return NM_OK;
}

static nm_status upper_run(void *state, nm_brick *self, nm_tabm *in, nm_tabm *out) {
    upper *u = state;
    cpu_set_t m;
    if (pthread_getaffinity_np(pthread_self(), sizeof m, &m) == 0) {
        g_upper_mask_cpus = CPU_COUNT(&m);
        for (g_upper_mask_first = 0; g_upper_mask_first < CPU_SETSIZE && !CPU_ISSET(g_upper_mask_first, &m);
             g_upper_mask_first++) {
        }
    }
    for (;;) {
        nm_tabm_slot s, o;
        nm_status st = nm_tabm_acquire_read(in, -1, &s);
        if (st != NM_OK) return st;
        const uint64_t user = s.meta->user;
        if ((st = nm_tabm_acquire_write(out, 0, -1, &o)) != NM_OK) {
            nm_tabm_release(in, &s);
            return st;
        }
        const bool fail = s.meta->size == 4 && !memcmp(s.data, "fail", 4);
        if (fail) nm_brick_set_error(self, "upper: asked to %s", "fail"); // before the slot that says so
        size_t n = fail ? 0 : (size_t)s.meta->size;
        for (size_t i = 0; i < n; i++) {
            char c = ((const char *)s.data)[i];
            ((char *)o.data)[i] = c >= 'a' && c <= 'z' ? (char)(c - 32) : c;
        }
        *o.meta = (nm_tabm_meta){.kind = NM_TABM_TEXT, .ndim = n ? 1 : 0, .shape = {(int64_t)n}, .size = n,
                                 .user = fail ? NM_BRICK_ERROR : user & NM_BRICK_MORE, .request = s.meta->request};
        nm_tabm_release(in, &s);
        if ((st = nm_tabm_publish(out, &o)) != NM_OK) return st;
        u->n++;
        if (fail) return NM_OK;
        if (!(user & NM_BRICK_MORE)) return NM_OK;
    }
}

static void upper_release(void *state) {
    upper *u = state;
    if (!u) return;
    *u->released = 1;
    free(u);
}

static void upper_stats(void *state, nm_brick_stats *s) { s->n_out_slots = ((upper *)state)->n; }

static const nm_brick_i upper_i = {
    .version = NM_BRICK_I_VERSION,
    .kind = NM_BRICK_TTS, // a kind the planner knows: it stands where a TTS brick would
    .name = "upper",
    .in_ports = NM_PORT_BIT(NM_PORT_TEXT),
    .out_ports = NM_PORT_BIT(NM_PORT_TEXT),
    .units = NM_UNIT_BIT(NM_UNIT_CPU),
    .load = upper_load,
    .run = upper_run,
    .release = upper_release,
    .stats = upper_stats,
};

static bool put_text(nm_tabm *r, const char *text, uint64_t user, uint64_t request) {
    nm_tabm_slot s;
    if (nm_tabm_acquire_write(r, 0, -1, &s) != NM_OK) return false;
    size_t n = strlen(text);
    memcpy(s.data, text, n);
    *s.meta = (nm_tabm_meta){.kind = NM_TABM_TEXT, .ndim = 1, .shape = {(int64_t)n}, .size = n, .user = user,
                             .request = request};
    return nm_tabm_publish(r, &s) == NM_OK;
}

// The text of the next slot into buf; its flags into *user (false if none).
static bool get_text(nm_tabm *r, char *buf, size_t size, uint64_t *user, uint64_t *request) {
    nm_tabm_slot s;
    if (nm_tabm_acquire_read(r, 60000000000ll, &s) != NM_OK) return false; // a Whisper window under TSan takes seconds
    size_t n = s.meta->size < size - 1 ? (size_t)s.meta->size : size - 1;
    memcpy(buf, s.data, n);
    buf[n] = '\0';
    *user = s.meta->user;
    *request = s.meta->request;
    nm_tabm_release(r, &s);
    return true;
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

NM_TEST(outside_implementation) {
    int released = 0;
    char flag[32], err[256];
    snprintf(flag, sizeof flag, "%llx", (unsigned long long)(uintptr_t)&released);
    nm_brick_params p = nm_brick_default_params(NM_BRICK_TTS);
    p.model = flag;
    nm_brick *b = NULL;
    // versions and kinds are checked
    nm_brick_i old = upper_i;
    old.version = 0;
    NM_CHECK(nm_brick_load(&old, &p, &b, err, sizeof err) == NM_ERR_INVALID_ARG && b == NULL);
    nm_brick_params other = p;
    other.kind = NM_BRICK_STT;
    NM_CHECK(nm_brick_load(&upper_i, &other, &b, err, sizeof err) == NM_ERR_INVALID_ARG && b == NULL);
    NM_CHECK(strstr(err, "is a tts brick, the parameters ask for a stt one") != NULL);
    p.model = NULL;
    NM_CHECK(nm_brick_load(&upper_i, &p, &b, err, sizeof err) == NM_ERR_INVALID_ARG && b == NULL);
    NM_CHECK(strstr(err, "release flag") != NULL);
    p.model = flag;
    p.name = "shouter";
    NM_CHECK(nm_brick_load(&upper_i, &p, &b, err, sizeof err) == NM_OK);
    if (!b) return;
    NM_CHECK(nm_brick_impl(b) == &upper_i && !strcmp(nm_brick_name(b), "shouter") && !strcmp(nm_brick_device(b), "cpu"));
    // the optional members it lacks
    nm_brick_input in = {.n_bytes = 10};
    nm_brick_cost e;
    NM_CHECK(nm_brick_estimate(b, &in, &e) == NM_ERR_UNSUPPORTED);
    NM_CHECK(nm_brick_set_params(b, &p, err, sizeof err) == NM_ERR_UNSUPPORTED && nm_brick_in_slot_bytes(b) == 0);
    NM_CHECK(nm_brick_tts_sample_rate(b) == 0); // not the built-in TTS brick
    // on a lane: two requests, the second failing, then shutdown
    nm_tabm *ri = NULL, *ro = NULL;
    NM_CHECK(nm_tabm_create(NULL, 4, 64, &ri, NULL, 0) == NM_OK && nm_tabm_create(NULL, 4, 64, &ro, NULL, 0) == NM_OK);
    lane l = {b, ri, ro, NM_OK};
    pthread_t th;
    NM_CHECK(pthread_create(&th, NULL, lane_main, &l) == 0);
    NM_CHECK(put_text(ri, "hello, ", NM_BRICK_MORE, 3) && put_text(ri, "bricks", 0, 3));
    char buf[64];
    uint64_t user = 0, req = 0;
    NM_CHECK(get_text(ro, buf, sizeof buf, &user, &req) && !strcmp(buf, "HELLO, ") && user == NM_BRICK_MORE && req == 3);
    NM_CHECK(get_text(ro, buf, sizeof buf, &user, &req) && !strcmp(buf, "BRICKS") && user == 0 && req == 3);
    NM_CHECK(put_text(ri, "fail", 0, 4));
    NM_CHECK(get_text(ro, buf, sizeof buf, &user, &req) && buf[0] == '\0' && user == NM_BRICK_ERROR && req == 4);
    NM_CHECK(!strcmp(nm_brick_last_error(b), "upper: asked to fail")); // there once the slot is
    nm_tabm_shutdown(ri);
    pthread_join(th, NULL);
    NM_CHECK(l.st == NM_ERR_SHUTDOWN && nm_tabm_is_shutdown(ro)); // the run loop ends the other side too
    NM_CHECK(nm_brick_get_stats(b).n_out_slots == 3);
    nm_brick_free(b);
    NM_CHECK(released == 1);
    nm_tabm_free(ri);
    nm_tabm_free(ro);
}

// A lane's cores: the thread that serves a request runs on them while it
// does, and has its own mask back after; a bad list is a load error.
NM_TEST(lane_cores) {
    int released = 0;
    char flag[32], err[256], cores[16];
    snprintf(flag, sizeof flag, "%llx", (unsigned long long)(uintptr_t)&released);
    cpu_set_t mine;
    NM_CHECK(pthread_getaffinity_np(pthread_self(), sizeof mine, &mine) == 0);
    int last = -1;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &mine)) last = c;
    snprintf(cores, sizeof cores, "%d", last);
    nm_brick_params p = nm_brick_default_params(NM_BRICK_TTS);
    p.model = flag;
    nm_brick *b = NULL;
    const char *bad[] = {"999", "0-", "little-ish", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        p.cores = bad[i];
        NM_CHECK(nm_brick_load(&upper_i, &p, &b, err, sizeof err) == NM_ERR_INVALID_ARG && b == NULL);
        NM_CHECK(strstr(err, "cores") != NULL);
    }
    p.cores = cores;
    NM_CHECK(nm_brick_load(&upper_i, &p, &b, err, sizeof err) == NM_OK);
    if (!b) return;
    nm_tabm *ri = NULL, *ro = NULL;
    NM_CHECK(nm_tabm_create(NULL, 2, 64, &ri, NULL, 0) == NM_OK && nm_tabm_create(NULL, 2, 64, &ro, NULL, 0) == NM_OK);
    NM_CHECK(put_text(ri, "x", 0, 1) && nm_brick_step(b, ri, ro) == NM_OK);
    cpu_set_t after;
    NM_CHECK(pthread_getaffinity_np(pthread_self(), sizeof after, &after) == 0 && CPU_EQUAL(&after, &mine));
    nm_brick_free(b);
    nm_tabm_free(ri);
    nm_tabm_free(ro);
    NM_CHECK(g_upper_mask_cpus == 1 && g_upper_mask_first == last);
}

// ---- estimates ---------------------------------------------------------------------------

static double sum_types(const nm_brick_cost *e) {
    double s = 0;
    for (int i = 0; i < NM_EST_TYPES; i++) s += e->flops_by_type[i];
    return s;
}

// The decoder's estimate against the model: a decode step streams the bytes
// nm_model_decode_weight_bytes says (less its norms); its matmuls are 2 FLOPs
// per weight; prompt batches read the weights once each; attention grows with
// the positions before.
NM_TEST(llm_estimate) {
    char path[1024];
    if (!nmtest_model_path("SmolLM2-135M-Instruct.Q4_1.gguf", path, sizeof path))
        NM_SKIP_MISSING("SmolLM2-135M-Instruct.Q4_1.gguf not in the model cache");
    nm_brick_params p = nm_brick_default_params(NM_BRICK_LLM);
    p.model = path;
    p.n_ctx = 1024;
    p.n_batch = 256;
    p.n_threads = 1;
    nm_brick *b = NULL;
    char err[256];
    NM_CHECK(nm_brick_load(NULL, &p, &b, err, sizeof err) == NM_OK);
    if (!b) return;
    const nm_model *m = nm_brick_llm_model(b);
    nm_brick_cost one, ten, prompt, late;
    NM_CHECK(nm_brick_estimate(b, &(nm_brick_input){.n_predict = 1}, &one) == NM_OK);
    NM_CHECK(nm_brick_estimate(b, &(nm_brick_input){.n_predict = 10}, &ten) == NM_OK);
    NM_CHECK(nm_brick_estimate(b, &(nm_brick_input){.n_tokens = 600}, &prompt) == NM_OK);
    NM_CHECK(nm_brick_estimate(b, &(nm_brick_input){.n_predict = 1, .n_past = 900}, &late) == NM_OK);
    const double dw = (double)nm_model_decode_weight_bytes(m);
    printf("  decode step: %.1f MB streamed (the model says %.1f MB), %.1f MFLOP; 600-token prompt %.2f GFLOP in %lld "
           "passes\n",
           one.weight_bytes_read / 1e6, dw / 1e6, one.flops / 1e6, prompt.flops / 1e9, (long long)prompt.n_passes);
    NM_CHECK(one.weight_bytes_read <= dw && one.weight_bytes_read > 0.995 * dw);
    NM_CHECK(fabs(ten.weight_bytes_read - 10 * one.weight_bytes_read) < 1 && ten.n_passes == 10 && ten.n_out == 10);
    // 135 M weights at 2 FLOPs each (the tied head is 49152 x 576 of them), and the rest small
    NM_CHECK(one.flops > 2 * 1.3e8 && one.flops < 2 * 1.45e8);
    NM_CHECK(fabs(sum_types(&one) - one.flops) < 1e-6 * one.flops);
    NM_CHECK(one.flops_by_type[3] > 0.5 * one.flops); // Q4_1 (GGUF type 3) carries most of it
    // a prompt of 600 in batches of 256: 3 passes, the weights read 3 times, logits once
    NM_CHECK(prompt.n_passes == 3 && prompt.n_out == 0);
    // the ops each pass dispatches (forward.c's layer_record: 15 a llama layer; lookup, norm, head)
    const double ops = 15.0 * nm_model_n_layer(m) + 3;
    NM_CHECK(one.n_ops == ops && ten.n_ops == 10 * ops && prompt.n_ops == 3 * ops);
    NM_CHECK(prompt.flops > 590 * (one.flops - 2.0 * 49152 * 576) && prompt.weight_bytes_read < 3.01 * dw);
    // attention over 900 earlier positions: more arithmetic and KV reads, the same weights
    NM_CHECK(late.flops > one.flops && late.act_bytes > one.act_bytes && late.weight_bytes_read == one.weight_bytes_read);
    // the memory it holds: the mapped weights and the context (KV cache of 1024 positions, activations)
    NM_CHECK(one.weight_bytes > 0.99 * dw && one.peak_bytes > one.weight_bytes + 1024 * nm_model_kv_bytes_per_pos(m));
    nm_brick_free(b);
}

// lfm2: the short convolutions' projections are streamed like any matmul weight (a decode step reads
// what nm_model_decode_weight_bytes says, less the norms and taps), a convolution layer dispatches 11
// ops (norm, in_proj, convolution, out_proj, add, the FFN's 6), and attending 900 earlier positions
// costs the attention layers only.
NM_TEST(llm_estimate_short_convolutions) {
    char tok[1024], path[256];
    if (!nmtest_model_path("SmolLM2-135M-Instruct.Q4_1.gguf", tok, sizeof tok))
        NM_SKIP_MISSING("SmolLM2-135M-Instruct.Q4_1.gguf not in the model cache");
    snprintf(path, sizeof path, "/tmp/nm-test-brick-lfm2-%d.gguf", (int)getpid());
    gen_opts o = nm_genmodel_defaults();
    o.arch = "lfm2", o.tok_from = tok, o.out = path, o.type = NM_TYPE_Q8_0, o.layers = 4, o.embd = 128;
    o.heads = 4, o.kv_heads = 2, o.ff = 256, o.attn_layers = "1,3";
    NM_CHECK(nm_genmodel_write(&o) == 0);
    nm_brick_params p = nm_brick_default_params(NM_BRICK_LLM);
    p.model = path;
    p.n_ctx = 1024;
    p.n_threads = 1;
    nm_brick *b = NULL;
    char err[256];
    NM_CHECK(nm_brick_load(NULL, &p, &b, err, sizeof err) == NM_OK);
    unlink(path);
    if (!b) return (void)fprintf(stderr, "  %s\n", err);
    const nm_model *m = nm_brick_llm_model(b);
    nm_brick_cost one, late;
    NM_CHECK(nm_brick_estimate(b, &(nm_brick_input){.n_predict = 1}, &one) == NM_OK);
    NM_CHECK(nm_brick_estimate(b, &(nm_brick_input){.n_predict = 1, .n_past = 900}, &late) == NM_OK);
    const double dw = (double)nm_model_decode_weight_bytes(m);
    printf("  lfm2 decode step: %.3f MB streamed (the model says %.3f MB), %.0f ops\n", one.weight_bytes_read / 1e6,
           dw / 1e6, one.n_ops);
    NM_CHECK(one.weight_bytes_read <= dw && one.weight_bytes_read > 0.98 * dw);
    NM_CHECK(one.n_ops == 2 * 11 + 2 * (15 + 2) + 3); // (attention layers: q and k norms)
    // 900 more positions attended by 2 layers of 4 heads x 32: 4 x 4 x 32 FLOPs a position and layer
    NM_CHECK(fabs((late.flops - one.flops) - 2 * 900 * 4.0 * 4 * 32) < 1);
    nm_brick_free(b);
}

// The vision brick's estimate counts encoder runs from the image's size: one
// for mlp (no pinpoints), tiles and the overview for idefics3.
NM_TEST(vision_estimate) {
    char path[1024], mm[64];
    if (!nmtest_model_path("SmolLM2-135M-Instruct.Q4_1.gguf", path, sizeof path))
        NM_SKIP_MISSING("SmolLM2-135M-Instruct.Q4_1.gguf not in the model cache");
    nm_brick_params lp = nm_brick_default_params(NM_BRICK_LLM);
    lp.model = path;
    lp.n_ctx = 64;
    lp.n_threads = 1;
    nm_brick *llm = NULL;
    char err[256];
    NM_CHECK(nm_brick_load(NULL, &lp, &llm, err, sizeof err) == NM_OK);
    if (!llm) return;
    const char *proj[2] = {"mlp", "idefics3"};
    nm_brick_cost small[2], big[2];
    for (int k = 0; k < 2; k++) {
        snprintf(mm, sizeof mm, "/tmp/nm-brick-mm-%d-%d.gguf", (int)getpid(), k);
        nm_genmmproj_params gp = nm_genmmproj_default_params(proj[k]);
        gp.image_size = 64;
        gp.patch_size = 16;
        gp.n_embd = 64;
        gp.n_ff = 128;
        gp.n_head = 4;
        gp.n_layer = 2;
        gp.n_out_embd = 576;
        if (k == 1) gp.preproc_image_size = 128;
        NM_CHECK(nm_genmmproj_write(mm, &gp, err, sizeof err) == NM_OK);
        nm_brick_params vp = nm_brick_default_params(NM_BRICK_VISION);
        vp.model = mm;
        vp.feeds = llm;
        vp.n_threads = 1;
        nm_brick *v = NULL;
        NM_CHECK(nm_brick_load(NULL, &vp, &v, err, sizeof err) == NM_OK);
        unlink(mm);
        if (!v) continue;
        NM_CHECK(nm_brick_estimate(v, &(nm_brick_input){.width = 400, .height = 40}, &small[k]) == NM_OK);
        NM_CHECK(nm_brick_estimate(v, &(nm_brick_input){.width = 640, .height = 480}, &big[k]) == NM_OK);
        NM_CHECK(fabs(sum_types(&small[k]) - small[k].flops) < 1e-6 * small[k].flops && small[k].flops > 0);
        nm_brick_free(v);
    }
    printf("  encoder runs: mlp %lld and %lld, idefics3 %lld and %lld\n", (long long)small[0].n_passes,
           (long long)big[0].n_passes, (long long)small[1].n_passes, (long long)big[1].n_passes);
    NM_CHECK(small[0].n_passes == 1 && big[0].n_passes == 1 && small[0].flops == big[0].flops);
    // the longest edge to 128 px, then tiles of 64: 400x40 -> 128x13, 2x1 tiles; 640x480 -> 128x96, 2x2; + the overview
    NM_CHECK(small[1].n_passes == 2 * 1 + 1 && big[1].n_passes == 2 * 2 + 1);
    NM_CHECK(fabs(big[1].flops - 5 * small[1].flops / 3) < 1e-6 * big[1].flops);
    nm_brick_free(llm);
}

// The spoken test sentence at 16 kHz (the STT tests' input); false (a failed check) if it cannot load.
static bool load_speech(nm_audio *a, char *err, size_t n, int *nmtest_failed) {
    NM_CHECK(nm_audio_load("tests/data/speech/tts_16k.wav", 16000, a, err, n) == NM_OK);
    return a->pcm != NULL;
}

// ---- a pipeline: PCM -> STT lane -> TEXT ring -> TTS lane -> PCM ------------------------
NM_TEST(pipeline_stt_to_tts) {
    char path[1024];
    if (!nmtest_model_path("whisper-tiny.en.gguf", path, sizeof path))
        NM_SKIP_MISSING("whisper-tiny.en.gguf not in the model cache");
    nm_audio a = {0};
    char err[512];
    if (!load_speech(&a, err, sizeof err, nmtest_failed)) return;
    nm_ledger *led = nm_ledger_create();
    nm_brick_params sp = nm_brick_default_params(NM_BRICK_STT);
    sp.model = path;
    sp.n_threads = 1;
    sp.stt = nm_stt_default_params(NM_STT_GREEDY);
    sp.ledger = led;
    nm_brick_params tp = nm_brick_default_params(NM_BRICK_TTS);
    tp.ledger = led;
    nm_brick *stt = NULL, *tts = NULL;
    nm_tabm *pcm = NULL, *text = NULL, *speech = NULL;
    NM_CHECK(nm_brick_load(NULL, &sp, &stt, err, sizeof err) == NM_OK);
    NM_CHECK(nm_brick_load(NULL, &tp, &tts, err, sizeof err) == NM_OK);
    if (!stt || !tts) goto done;
    NM_CHECK(nm_tabm_create(NULL, 1, sizeof(float) * (size_t)a.n, &pcm, err, sizeof err) == NM_OK);
    NM_CHECK(nm_tabm_create(NULL, 4, nm_brick_out_slot_bytes(stt), &text, err, sizeof err) == NM_OK);
    NM_CHECK(nm_tabm_create(NULL, 64, nm_brick_out_slot_bytes(tts), &speech, err, sizeof err) == NM_OK);
    if (!pcm || !text || !speech) goto done;
    lane ls = {stt, pcm, text, NM_OK}, lt = {tts, text, speech, NM_OK};
    pthread_t t1, t2;
    NM_CHECK(pthread_create(&t1, NULL, lane_main, &ls) == 0 && pthread_create(&t2, NULL, lane_main, &lt) == 0);
    nm_tabm_slot s;
    NM_CHECK(nm_tabm_acquire_write(pcm, 0, -1, &s) == NM_OK);
    // the decoded audio into the slot: the one copy, counted
    nm_ledger_copy(led, nm_ledger_endpoint(led, "audio-decoder"), nm_ledger_endpoint(led, "stt"), s.data, a.pcm,
                   sizeof(float) * (size_t)a.n);
    *s.meta = (nm_tabm_meta){.kind = NM_TABM_PCM_F32, .ndim = 1, .shape = {a.n}, .size = sizeof(float) * (uint64_t)a.n,
                             .sample_rate = 16000, .request = 11};
    NM_CHECK(nm_tabm_publish(pcm, &s) == NM_OK);
    int64_t samples = 0;
    int n_slots = 0;
    bool ok = true;
    for (;;) {
        if (nm_tabm_acquire_read(speech, 60000000000ll, &s) != NM_OK) {
            ok = false;
            break;
        }
        samples += (int64_t)(s.meta->size / 2);
        n_slots++;
        ok = ok && s.meta->request == 11 && !(s.meta->user & NM_BRICK_ERROR) && s.meta->kind == NM_TABM_PCM_S16;
        const bool end = !(s.meta->user & NM_BRICK_MORE);
        nm_tabm_release(speech, &s);
        if (end) break;
    }
    nm_tabm_shutdown(pcm); // ends the STT lane, which ends the TTS lane
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    NM_CHECK(ok && ls.st == NM_ERR_SHUTDOWN && lt.st == NM_ERR_SHUTDOWN);
    const nm_transcript *tr = nm_brick_stt_transcript(stt);
    size_t text_bytes = 0;
    for (int32_t i = 0; tr && i < tr->n_seg; i++) text_bytes += strlen(tr->seg[i].text);
    printf("  %.2f s of speech -> %d segments, %zu bytes of text -> %.2f s of speech in %d slots\n", a.n / 16000.0,
           tr ? tr->n_seg : 0, text_bytes, samples / 22050.0, n_slots);
    NM_CHECK(tr && tr->n_seg >= 1 && samples > 22050 && n_slots >= 2);
    // the copies: the audio into its slot, the text into espeak-ng, the samples out of espeak-ng; nothing else
    const int ep_dec = nm_ledger_endpoint(led, "audio-decoder"), ep_stt = nm_ledger_endpoint(led, "stt"),
              ep_tts = nm_ledger_endpoint(led, "tts"), ep_eng = nm_ledger_endpoint(led, "espeak-ng");
    NM_CHECK(nm_ledger_bytes(led, ep_dec, ep_stt) == sizeof(float) * (uint64_t)a.n);
    NM_CHECK(nm_ledger_bytes(led, ep_tts, ep_eng) <= text_bytes && nm_ledger_bytes(led, ep_tts, ep_eng) > 0);
    NM_CHECK(nm_ledger_bytes(led, ep_eng, ep_tts) == 2 * (uint64_t)samples);
    NM_CHECK(nm_ledger_total(led) == sizeof(float) * (uint64_t)a.n + nm_ledger_bytes(led, ep_tts, ep_eng) +
                                         2 * (uint64_t)samples);
done:
    nm_tabm_free(pcm);
    nm_tabm_free(text);
    nm_tabm_free(speech);
    nm_brick_free(stt);
    nm_brick_free(tts);
    nm_ledger_free(led);
    nm_audio_free(&a);
}

// A greedy STT brick on two threads, a PCM ring of pcm_slots slots of n
// samples, a text ring of text_slots 4 KiB slots; false (a failed check) if any is missing.
static bool stt_rig(int *nmtest_failed, const char *path, uint32_t pcm_slots, int64_t n, uint32_t text_slots,
                    nm_brick **stt, nm_tabm **pcm, nm_tabm **text) {
    char err[512];
    nm_brick_params sp = nm_brick_default_params(NM_BRICK_STT);
    sp.model = path;
    sp.n_threads = 2;
    sp.stt = nm_stt_default_params(NM_STT_GREEDY);
    NM_CHECK(nm_brick_load(NULL, &sp, stt, err, sizeof err) == NM_OK);
    NM_CHECK(nm_tabm_create(NULL, pcm_slots, sizeof(float) * (size_t)n, pcm, err, sizeof err) == NM_OK);
    NM_CHECK(nm_tabm_create(NULL, text_slots, 4096, text, err, sizeof err) == NM_OK);
    return *stt && *pcm && *text;
}

// The STT brick stops a long recording once its output ring is gone: the
// reader takes one segment and shuts the ring; Whisper stops before its next
// 30 s window instead of decoding the whole minute for nobody.
NM_TEST(stt_stops_when_its_output_goes) {
    char path[1024];
    if (!nmtest_model_path("whisper-tiny.en.gguf", path, sizeof path))
        NM_SKIP_MISSING("whisper-tiny.en.gguf not in the model cache");
    nm_audio a = {0};
    char err[512];
    if (!load_speech(&a, err, sizeof err, nmtest_failed)) return;
    const int64_t reps = 12, n = reps * a.n; // about a minute: three windows
    nm_brick *stt = NULL;
    nm_tabm *pcm = NULL, *text = NULL;
    if (!stt_rig(nmtest_failed, path, 1, n, 1, &stt, &pcm, &text)) goto done;
    nm_tabm_slot s;
    NM_CHECK(nm_tabm_acquire_write(pcm, 0, -1, &s) == NM_OK);
    for (int64_t r = 0; r < reps; r++) memcpy((float *)s.data + r * a.n, a.pcm, sizeof(float) * (size_t)a.n);
    *s.meta = (nm_tabm_meta){.kind = NM_TABM_PCM_F32, .ndim = 1, .shape = {n}, .size = sizeof(float) * (uint64_t)n,
                             .sample_rate = 16000};
    NM_CHECK(nm_tabm_publish(pcm, &s) == NM_OK);
    lane l = {stt, pcm, text, NM_OK};
    pthread_t th;
    NM_CHECK(pthread_create(&th, NULL, lane_main, &l) == 0);
    NM_CHECK(nm_tabm_acquire_read(text, 60000000000ll, &s) == NM_OK && (s.meta->user & NM_BRICK_MORE));
    nm_tabm_release(text, &s);
    nm_tabm_shutdown(text); // nobody reads the rest
    pthread_join(th, NULL);
    const nm_stt_timings tm = nm_brick_stt_timings(stt);
    printf("  %.1f s of audio: %lld of its windows encoded before the brick stopped\n", n / 16000.0,
           (long long)tm.n_encode);
    NM_CHECK(l.st == NM_ERR_SHUTDOWN && tm.n_encode <= 2);
    NM_CHECK(strstr(nm_brick_last_error(stt), "stopped by its caller") != NULL);
done:
    nm_tabm_free(pcm);
    nm_tabm_free(text);
    nm_brick_free(stt);
    nm_audio_free(&a);
}

// A request cancelled while Whisper works through a long recording: it stops
// before the next window, the request ends with a slot flagged
// NM_BRICK_CANCELLED (not an error), the mark goes on to the text ring, and
// the brick serves the next request; one cancelled before it starts is not
// transcribed at all.
NM_TEST(stt_request_cancelled) {
    char path[1024];
    if (!nmtest_model_path("whisper-tiny.en.gguf", path, sizeof path))
        NM_SKIP_MISSING("whisper-tiny.en.gguf not in the model cache");
    nm_audio a = {0};
    char err[512];
    if (!load_speech(&a, err, sizeof err, nmtest_failed)) return;
    const int64_t reps = 12, n = reps * a.n; // about a minute: three windows
    nm_brick *stt = NULL;
    nm_tabm *pcm = NULL, *text = NULL;
    if (!stt_rig(nmtest_failed, path, 2, n, 1, &stt, &pcm, &text)) goto done;
    NM_CHECK(nm_tabm_cancel_request(pcm, 32) == NM_OK); // the second request, before it is written
    for (uint64_t req = 31; req <= 32; req++) {
        nm_tabm_slot s;
        NM_CHECK(nm_tabm_acquire_write(pcm, 0, -1, &s) == NM_OK);
        for (int64_t r = 0; r < reps; r++) memcpy((float *)s.data + r * a.n, a.pcm, sizeof(float) * (size_t)a.n);
        *s.meta = (nm_tabm_meta){.kind = NM_TABM_PCM_F32, .ndim = 1, .shape = {n}, .size = sizeof(float) * (uint64_t)n,
                                 .sample_rate = 16000, .request = req};
        NM_CHECK(nm_tabm_publish(pcm, &s) == NM_OK);
    }
    lane l = {stt, pcm, text, NM_OK};
    pthread_t th;
    NM_CHECK(pthread_create(&th, NULL, lane_main, &l) == 0);
    char buf[4096];
    uint64_t user = 0, req = 0;
    NM_CHECK(get_text(text, buf, sizeof buf, &user, &req) && req == 31 && (user & NM_BRICK_MORE));
    NM_CHECK(nm_tabm_cancel_request(pcm, 31) == NM_OK);
    int more = 0;
    while (get_text(text, buf, sizeof buf, &user, &req) && req == 31 && (user & NM_BRICK_MORE)) more++;
    NM_CHECK(req == 31 && (user & NM_BRICK_CANCELLED) && !(user & NM_BRICK_ERROR) && !(user & NM_BRICK_MORE));
    NM_CHECK(nm_tabm_request_cancelled(text, 31));
    // request 32: one flagged slot, no text
    NM_CHECK(get_text(text, buf, sizeof buf, &user, &req) && req == 32 && (user & NM_BRICK_CANCELLED) && !buf[0]);
    nm_tabm_shutdown(pcm);
    nm_tabm_shutdown(text); // also wakes a lane left waiting on a full text ring by a failed check
    pthread_join(th, NULL);
    const int64_t encoded = nm_brick_stt_timings(stt).n_encode; // read once the lane is done
    printf("  %.1f s of audio cancelled after its first segment: %lld windows encoded, %d more segments\n",
           n / 16000.0, (long long)encoded, more);
    NM_CHECK(encoded <= 2);
    nm_brick_stats bs = nm_brick_get_stats(stt);
    NM_CHECK(bs.n_cancelled == 2 && bs.n_bad_requests == 0 && bs.n_requests == 2 && l.st == NM_ERR_SHUTDOWN);
done:
    nm_tabm_free(pcm);
    nm_tabm_free(text);
    nm_brick_free(stt);
    nm_audio_free(&a);
}

// A request's own Whisper parameters (a PARAMS slot, then the audio): they
// give what set_params would, for that request only; a wrong one fails the
// request, named.
NM_TEST(stt_request_params) {
    char path[1024];
    if (!nmtest_model_path("whisper-tiny.en.gguf", path, sizeof path))
        NM_SKIP_MISSING("whisper-tiny.en.gguf not in the model cache");
    nm_audio a = {0};
    char err[512];
    if (!load_speech(&a, err, sizeof err, nmtest_failed)) return;
    nm_brick_params sp = nm_brick_default_params(NM_BRICK_STT);
    sp.model = path;
    sp.n_threads = 2;
    sp.stt = nm_stt_default_params(NM_STT_GREEDY);
    nm_brick *stt = NULL;
    nm_tabm *pcm = NULL, *text = NULL;
    NM_CHECK(nm_brick_load(NULL, &sp, &stt, err, sizeof err) == NM_OK);
    NM_CHECK(nm_tabm_create(NULL, 4, sizeof(float) * (size_t)a.n, &pcm, err, sizeof err) == NM_OK);
    NM_CHECK(nm_tabm_create(NULL, 8, 4096, &text, err, sizeof err) == NM_OK);
    if (!stt || !pcm || !text) goto done;
    static const char *const js[] = {"{\"no_timestamps\": true, \"beam_size\": 1, \"temperature_inc\": 0}",
                                     "{\"beam_size\": 99}", NULL};
    char first[3][1024];
    for (int k = 0; k < 3; k++) {
        nm_tabm_slot s;
        if (js[k]) {
            const size_t m = strlen(js[k]);
            NM_CHECK(nm_tabm_acquire_write(pcm, 0, -1, &s) == NM_OK);
            memcpy(s.data, js[k], m);
            *s.meta = (nm_tabm_meta){.kind = NM_TABM_PARAMS, .ndim = 1, .shape = {(int64_t)m}, .size = m,
                                     .user = NM_BRICK_MORE, .request = 40 + (uint64_t)k};
            NM_CHECK(nm_tabm_publish(pcm, &s) == NM_OK);
        }
        NM_CHECK(nm_tabm_acquire_write(pcm, 0, -1, &s) == NM_OK);
        memcpy(s.data, a.pcm, sizeof(float) * (size_t)a.n);
        *s.meta = (nm_tabm_meta){.kind = NM_TABM_PCM_F32, .ndim = 1, .shape = {a.n},
                                 .size = sizeof(float) * (uint64_t)a.n, .sample_rate = 16000, .request = 40 + (uint64_t)k};
        NM_CHECK(nm_tabm_publish(pcm, &s) == NM_OK);
        NM_CHECK(nm_brick_step(stt, pcm, text) == NM_OK);
        uint64_t user = 0, req = 0;
        int segs = 0;
        first[k][0] = '\0';
        char buf[1024];
        while (get_text(text, buf, sizeof buf, &user, &req) && (user & NM_BRICK_MORE))
            if (segs++ == 0) snprintf(first[k], sizeof first[k], "%s", buf);
        NM_CHECK(req == 40 + (uint64_t)k);
        if (k == 0) NM_CHECK(segs == 1 && !(user & NM_BRICK_ERROR)); // no timestamps: one segment a window
        if (k == 1) {
            NM_CHECK(segs == 0 && (user & NM_BRICK_ERROR));
            NM_CHECK(strstr(nm_brick_last_error(stt), "\"beam_size\" must be a number in [1, 8]") != NULL);
        }
        const nm_transcript *t = nm_brick_stt_transcript(stt);
        int ts = 0; // timestamp tokens in the transcript
        for (int32_t i = 0; t && i < t->n_seg; i++)
            for (int32_t j = 0; j < t->seg[i].n_tokens; j++) ts += t->seg[i].tokens[j].id == t->seg[i].tokens[j].tid;
        if (k == 0) NM_CHECK(ts == 0);
        if (k == 2) NM_CHECK(segs >= 1 && ts >= 2 && !(user & NM_BRICK_ERROR)); // the brick's own: timestamps again
    }
    // the same as the brick set to those parameters
    nm_brick_params q = sp;
    q.stt.no_timestamps = true;
    q.stt.temperature_inc = 0;
    NM_CHECK(nm_brick_set_params(stt, &q, err, sizeof err) == NM_OK);
    const nm_transcript *tr = NULL;
    {
        nm_tabm_slot s;
        NM_CHECK(nm_tabm_acquire_write(pcm, 0, -1, &s) == NM_OK);
        memcpy(s.data, a.pcm, sizeof(float) * (size_t)a.n);
        *s.meta = (nm_tabm_meta){.kind = NM_TABM_PCM_F32, .ndim = 1, .shape = {a.n},
                                 .size = sizeof(float) * (uint64_t)a.n, .sample_rate = 16000, .request = 50};
        NM_CHECK(nm_tabm_publish(pcm, &s) == NM_OK);
        NM_CHECK(nm_brick_step(stt, pcm, text) == NM_OK);
        tr = nm_brick_stt_transcript(stt);
        NM_CHECK(tr && tr->n_seg == 1 && !strcmp(tr->seg[0].text, first[0]));
        char buf[1024];
        uint64_t user = 0, req = 0;
        while (get_text(text, buf, sizeof buf, &user, &req) && (user & NM_BRICK_MORE)) {}
    }
    printf("  one segment with a request's no_timestamps: \"%s\"\n", first[0]);
done:
    nm_tabm_free(pcm);
    nm_tabm_free(text);
    nm_brick_free(stt);
    nm_audio_free(&a);
}

// nm_brick_step on the caller's thread, which writes the request and reads
// the answer itself: a wait only it could end returns NM_ERR_AGAIN, naming
// the ring, instead of hanging (issue 45: a 1-slot output ring and speech
// that makes a segment and the END blocked forever). An input ring with
// nothing for it, and a request whose audio never comes, the same. With a
// reader on another thread the same step waits, and finishes.
typedef struct text_reader {
    nm_tabm *r;
    int n;
} text_reader;
static void *read_texts(void *arg) {
    text_reader *R = arg;
    char buf[1024];
    uint64_t user = 0, req = 0;
    while (get_text(R->r, buf, sizeof buf, &user, &req) && (R->n++, (user & NM_BRICK_MORE))) {}
    return NULL;
}

NM_TEST(stt_step_that_cannot_progress_returns) {
    char path[1024];
    if (!nmtest_model_path("whisper-tiny.en.gguf", path, sizeof path))
        NM_SKIP_MISSING("whisper-tiny.en.gguf not in the model cache");
    nm_audio a = {0};
    char err[512];
    if (!load_speech(&a, err, sizeof err, nmtest_failed)) return;
    nm_brick *stt = NULL;
    nm_tabm *pcm = NULL, *text = NULL;
    if (!stt_rig(nmtest_failed, path, 4, a.n, 1, &stt, &pcm, &text)) goto done;
    // nothing to read
    NM_CHECK(nm_brick_step(stt, pcm, text) == NM_ERR_AGAIN);
    NM_CHECK(strstr(nm_brick_last_error(stt), "input ring has nothing more to read") != NULL);
    for (int k = 0; k < 2; k++) { // the speech: a segment, then its END finds the 1-slot ring full
        nm_tabm_slot s;
        NM_CHECK(nm_tabm_acquire_write(pcm, 0, -1, &s) == NM_OK);
        memcpy(s.data, a.pcm, sizeof(float) * (size_t)a.n);
        *s.meta = (nm_tabm_meta){.kind = NM_TABM_PCM_F32, .ndim = 1, .shape = {a.n},
                                 .size = sizeof(float) * (uint64_t)a.n, .sample_rate = 16000, .request = 60 + (uint64_t)k};
        NM_CHECK(nm_tabm_publish(pcm, &s) == NM_OK);
        if (k == 0) {
            NM_CHECK(nm_brick_step(stt, pcm, text) == NM_ERR_AGAIN);
            printf("  %s\n", nm_brick_last_error(stt));
            NM_CHECK(strstr(nm_brick_last_error(stt), "output ring is full (1 slot)") != NULL);
            char buf[1024];
            uint64_t user = 0, req = 0;
            NM_CHECK(get_text(text, buf, sizeof buf, &user, &req) && req == 60 && (user & NM_BRICK_MORE));
        } else { // a reader on another thread: the step waits for it
            text_reader R = {text, 0};
            pthread_t th;
            NM_CHECK(pthread_create(&th, NULL, read_texts, &R) == 0);
            while (nm_tabm_get_stats(text).empty_waits == 0) usleep(1000); // (it has asked to read: it is the reader)
            NM_CHECK(nm_brick_step(stt, pcm, text) == NM_OK);
            pthread_join(th, NULL);
            NM_CHECK(R.n >= 2);
        }
    }
    { // a request's parameters, its audio never written
        static const char js[] = "{\"beam_size\": 1}";
        nm_tabm_slot s;
        NM_CHECK(nm_tabm_acquire_write(pcm, 0, -1, &s) == NM_OK);
        memcpy(s.data, js, sizeof js - 1);
        *s.meta = (nm_tabm_meta){.kind = NM_TABM_PARAMS, .ndim = 1, .shape = {sizeof js - 1}, .size = sizeof js - 1,
                                 .user = NM_BRICK_MORE, .request = 70};
        NM_CHECK(nm_tabm_publish(pcm, &s) == NM_OK);
        NM_CHECK(nm_brick_step(stt, pcm, text) == NM_ERR_AGAIN);
        NM_CHECK(strstr(nm_brick_last_error(stt), "input ring has nothing more to read") != NULL);
    }
done:
    nm_tabm_free(pcm);
    nm_tabm_free(text);
    nm_brick_free(stt);
    nm_audio_free(&a);
}

// A TTS request cancelled while it speaks: what was said stays, the rest of
// the text (this slot's and the request's next ones) is dropped, the last
// slot is flagged NM_BRICK_CANCELLED, and the next request is spoken whole.
NM_TEST(tts_request_cancelled) {
    nm_brick_params tp = nm_brick_default_params(NM_BRICK_TTS);
    nm_brick *tts = NULL;
    nm_tabm *text = NULL, *speech = NULL;
    char err[256];
    NM_CHECK(nm_brick_load(NULL, &tp, &tts, err, sizeof err) == NM_OK);
    if (!tts) return;
    NM_CHECK(nm_tabm_create(NULL, 4, 4096, &text, err, sizeof err) == NM_OK);
    NM_CHECK(nm_tabm_create(NULL, 2, nm_brick_out_slot_bytes(tts), &speech, err, sizeof err) == NM_OK);
    if (!text || !speech) goto done;
    const char *long_text = "This sentence goes on for a long while, so that the speech it makes lasts many seconds, "
                            "far longer than the little that is heard before the request is cancelled by its reader, "
                            "who has heard enough of it and wants to ask something else instead of listening on.";
    NM_CHECK(put_text(text, long_text, NM_BRICK_MORE, 61) && put_text(text, "And more text.", 0, 61));
    NM_CHECK(put_text(text, "Hello.", 0, 62));
    NM_CHECK(put_text(text, "Cancelled upstream.", NM_BRICK_CANCELLED, 63)); // a brick before this one cancelled it
    lane l = {tts, text, speech, NM_OK};
    pthread_t th;
    NM_CHECK(pthread_create(&th, NULL, lane_main, &l) == 0);
    int64_t samples[3] = {0, 0, 0};
    uint64_t last_user[3] = {0, 0, 0};
    for (int r = 0; r < 3; r++) {
        for (;;) {
            nm_tabm_slot s;
            if (nm_tabm_acquire_read(speech, 20000000000ll, &s) != NM_OK) break;
            NM_CHECK(s.meta->request == 61 + (uint64_t)r);
            samples[r] += (int64_t)(s.meta->size / 2);
            const uint64_t user = s.meta->user;
            nm_tabm_release(speech, &s);
            if (r == 0 && samples[0] > 0 && !nm_tabm_request_cancelled(text, 61))
                NM_CHECK(nm_tabm_cancel_request(text, 61) == NM_OK);
            if (!(user & NM_BRICK_MORE)) {
                last_user[r] = user;
                break;
            }
        }
    }
    nm_tabm_shutdown(text);
    nm_tabm_shutdown(speech); // also wakes a lane left waiting on a full ring by a failed check
    pthread_join(th, NULL);
    const int32_t rate = nm_brick_tts_sample_rate(tts);
    printf("  cancelled after %.2f s of speech; the next request: %.2f s\n", (double)samples[0] / rate,
           (double)samples[1] / rate);
    // the long text is over 10 s of speech: cancelled within the slots the ring holds
    NM_CHECK(samples[0] > 0 && samples[0] < rate);
    NM_CHECK((last_user[0] & NM_BRICK_CANCELLED) && !(last_user[0] & NM_BRICK_ERROR));
    NM_CHECK(nm_tabm_request_cancelled(speech, 61) && !nm_tabm_request_cancelled(speech, 62));
    NM_CHECK(samples[1] > rate / 4 && !(last_user[1] & (NM_BRICK_CANCELLED | NM_BRICK_ERROR)));
    NM_CHECK(samples[2] == 0 && (last_user[2] & NM_BRICK_CANCELLED) && nm_tabm_request_cancelled(speech, 63));
    nm_brick_stats bs = nm_brick_get_stats(tts);
    NM_CHECK(bs.n_cancelled == 2 && bs.n_bad_requests == 0 && bs.n_requests == 3 && bs.n_in_slots == 4);
done:
    nm_tabm_free(text);
    nm_tabm_free(speech);
    nm_brick_free(tts);
}

static bool put_params(nm_tabm *r, const char *json, uint64_t request) {
    nm_tabm_slot s;
    if (nm_tabm_acquire_write(r, 0, -1, &s) != NM_OK) return false;
    const size_t n = strlen(json);
    memcpy(s.data, json, n);
    *s.meta = (nm_tabm_meta){.kind = NM_TABM_PARAMS, .ndim = 1, .shape = {(int64_t)n}, .size = n,
                             .user = NM_BRICK_MORE, .request = request};
    return nm_tabm_publish(r, &s) == NM_OK;
}

// A TTS request's own voice (a PARAMS slot, then its text): "speed" 2 speaks
// the same text in clearly fewer samples, another voice and pitch speak, and
// the next request without parameters is the brick's own voice again (its
// length as before); a bad value, an unknown voice, a rate the speed takes
// out of the engine's range and a slot that is not JSON each fail their
// request with the cause named, and the brick serves the next one.
NM_TEST(tts_request_params) {
    nm_brick_params tp = nm_brick_default_params(NM_BRICK_TTS);
    nm_brick *tts = NULL;
    nm_tabm *text = NULL, *speech = NULL;
    char err[256];
    NM_CHECK(nm_brick_load(NULL, &tp, &tts, err, sizeof err) == NM_OK);
    if (!tts) return;
    NM_CHECK(nm_tabm_create(NULL, 32, 4096, &text, err, sizeof err) == NM_OK);
    NM_CHECK(nm_tabm_create(NULL, 4, nm_brick_out_slot_bytes(tts), &speech, err, sizeof err) == NM_OK);
    if (!text || !speech) goto done;
    static const struct { const char *json; const char *error; } rq[] = {
        {NULL, NULL},                                     // the brick's own voice
        {"{\"speed\": 2.0}", NULL},                       // twice as fast
        {"{\"voice\": \"en+f3\", \"pitch\": 80, \"volume\": 120, \"unknown\": 1}", NULL},
        {"{\"speed\": 9}", "\"speed\" must be a number in [0.25, 4]"},
        {"{\"voice\": \"xx-nonexistent\"}", "unknown espeak-ng voice 'xx-nonexistent'"},
        {"{\"speed\": 0.25}", "outside 80..450 (the rate after \"speed\")"},
        {"{\"pitch\": ", "is not JSON"},
        {NULL, NULL},                                     // the brick's own voice again
    };
    enum { NQ = sizeof rq / sizeof rq[0] };
    const char *say = "The quick brown fox jumps over the lazy dog.";
    lane l = {tts, text, speech, NM_OK};
    pthread_t th;
    NM_CHECK(pthread_create(&th, NULL, lane_main, &l) == 0);
    int64_t samples[NQ] = {0};
    uint64_t last[NQ] = {0};
    char errs[NQ][256];
    for (int r = 0; r < NQ; r++) { // one at a time: the error text is the brick's last
        if (rq[r].json) NM_CHECK(put_params(text, rq[r].json, 70 + (uint64_t)r));
        NM_CHECK(put_text(text, say, 0, 70 + (uint64_t)r));
        errs[r][0] = '\0';
        for (;;) {
            nm_tabm_slot s;
            if (nm_tabm_acquire_read(speech, 20000000000ll, &s) != NM_OK) break;
            NM_CHECK(s.meta->request == 70 + (uint64_t)r);
            samples[r] += (int64_t)(s.meta->size / 2);
            const uint64_t user = s.meta->user;
            if (!(user & NM_BRICK_MORE) && (user & NM_BRICK_ERROR)) // the message is set before the slot goes out
                snprintf(errs[r], sizeof errs[r], "%s", nm_brick_last_error(tts));
            nm_tabm_release(speech, &s);
            if (!(user & NM_BRICK_MORE)) {
                last[r] = user;
                break;
            }
        }
    }
    nm_tabm_shutdown(text);
    nm_tabm_shutdown(speech);
    pthread_join(th, NULL);
    printf("  samples: own %lld, speed 2 %lld, en+f3 %lld, own again %lld\n", (long long)samples[0],
           (long long)samples[1], (long long)samples[2], (long long)samples[NQ - 1]);
    NM_CHECK(samples[0] > 0 && samples[1] > 0 && samples[1] < samples[0] * 3 / 4);
    NM_CHECK(samples[2] > 0 && !(last[2] & NM_BRICK_ERROR));
    NM_CHECK(llabs(samples[NQ - 1] - samples[0]) < samples[0] / 100 && !(last[NQ - 1] & NM_BRICK_ERROR));
    for (int r = 3; r < NQ - 1; r++) {
        const bool named = (last[r] & NM_BRICK_ERROR) && samples[r] == 0 && strstr(errs[r], rq[r].error);
        if (!named) fprintf(stderr, "  request %d: flags %llx, %lld samples, error \"%s\"\n", r,
                            (unsigned long long)last[r], (long long)samples[r], errs[r]);
        NM_CHECK(named);
    }
    nm_brick_stats bs = nm_brick_get_stats(tts);
    NM_CHECK(bs.n_requests == NQ && bs.n_bad_requests == 4);
done:
    nm_tabm_free(text);
    nm_tabm_free(speech);
    nm_brick_free(tts);
}

NM_TEST_MAIN()
