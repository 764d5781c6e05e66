// The LLM brick on TABM rings (src/bricks/llm/brick.c): prompts fed by a
// producer thread through an input ring, tokens read from the output ring,
// checked against the plain nm_decode / nm_decode_embd + nm_sampler loop on
// a private context; the ledger stays at 0 bytes; shutdown of either ring
// ends the brick cleanly; malformed slots give a clear error and the brick
// goes on. Uses a small random-weight model (the SmolLM2 tokenizer is
// copied into it; the tests skip when that file is absent, failing under NM_CI=1).
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "bricks/llm/think.h"
#include "genmodel.h"
#include "nmtest.h"
#include "small_model.h"

#define N_EMBD 64
#define N_CTX 96
#define N_BATCH 8 // small, so prompt slots are decoded in several batches

static nm_model *g_model;
static char g_path[256];

static void free_model(void) {
    nm_model_free(g_model);
    if (g_path[0]) unlink(g_path);
}

static int g_model_r = -2; // nmtest_small_model's answer; -2: not tried yet

// The model, built once; NULL when absent (g_model_r 0) or failed (-1).
static nm_model *model(void) {
    if (g_model_r != -2) return g_model;
    snprintf(g_path, sizeof g_path, "/tmp/nm-tabm-llm-brick-%d.gguf", (int)getpid());
    g_model_r = nmtest_small_model(g_path, N_EMBD, 11, &g_model);
    atexit(free_model);
    return g_model;
}

// lfm2's short convolutions in layer 0, attention in layer 1: a model whose state is kept only at
// checkpoints (every 32 positions) and for the last positions decoded.
static nm_model *g_lfm2;
static char g_lfm2_path[256];
static bool g_rig_lfm2; // set: the next rig runs the lfm2 model

static void free_lfm2(void) {
    nm_model_free(g_lfm2);
    if (g_lfm2_path[0]) unlink(g_lfm2_path);
}

static nm_model *lfm2_model(void) {
    char tok[1024];
    if (g_lfm2 || !nmtest_model_path("SmolLM2-135M-Instruct.Q4_1.gguf", tok, sizeof tok)) return g_lfm2;
    snprintf(g_lfm2_path, sizeof g_lfm2_path, "/tmp/nm-tabm-llm-brick-lfm2-%d.gguf", (int)getpid());
    gen_opts o = nm_genmodel_defaults();
    o.arch = "lfm2", o.tok_from = tok, o.out = g_lfm2_path, o.layers = 2, o.embd = N_EMBD, o.heads = 4;
    o.kv_heads = 2, o.ff = 128, o.seed = 13, o.attn_layers = "1";
    char err[256];
    if (nm_genmodel_write(&o) != 0 || nm_model_load(g_lfm2_path, NULL, &g_lfm2, err, sizeof err) != NM_OK) g_lfm2 = NULL;
    atexit(free_lfm2);
    return g_lfm2;
}

// A rig that did not come up ends the case: a skip only when the model is absent.
// Brings the rig up by `up` (an expression on &R), or skips without the model / fails.
#define RIG_UP_BY(R, up)                                               \
    do {                                                               \
        if (!(up)) {                                                   \
            rig_down(&R);                                              \
            NM_NEED_SMALL_MODEL(g_model_r);                            \
            NM_CHECK(!"the rig did not come up with the model loaded"); \
            return;                                                    \
        }                                                              \
    } while (0)
#define RIG_UP(R, n_predict, out_batch, out_slots) RIG_UP_BY(R, rig_up(&R, n_predict, out_batch, out_slots))

static nm_ctx *new_ctx(nm_model *m) {
    nm_ctx_params cp = nm_ctx_default_params();
    cp.n_ctx = N_CTX;
    cp.n_batch = N_BATCH;
    cp.n_threads = 1;
    nm_ctx *c = NULL;
    return nm_ctx_create(m, &cp, &c, NULL, 0) == NM_OK ? c : NULL;
}

static nm_sampler *greedy(nm_model *m) {
    nm_sampler_params sp = nm_sampler_default_params();
    sp.temp = 0;
    return nm_sampler_create(&sp, nm_model_n_vocab(m));
}

// The LLM brick's parameters for the rig: the shared model, the plain loop's context shape, greedy.
static nm_brick_params brick_params(nm_model *m) {
    nm_brick_params bp = nm_brick_default_params(NM_BRICK_LLM);
    bp.llm_model = m;
    bp.n_ctx = N_CTX;
    bp.n_batch = N_BATCH;
    bp.n_threads = 1;
    bp.sampling.temp = 0;
    return bp;
}

// One part of a prompt: token ids or f32 embedding rows.
typedef struct part {
    int kind; // NM_TABM_TOKENS or NM_TABM_EMBD_F32; anything else: a raw slot (ndim/shape below)
    const int32_t *tok;
    const float *embd;
    int32_t n;
    uint64_t user;
    int32_t ndim;       // for raw slots
    int64_t shape[2];
    uint64_t size;
    const char *json;   // NM_TABM_PARAMS: the request's parameters
} part;

#define TOKS(t, n, u) {NM_TABM_TOKENS, t, NULL, n, u, 0, {0, 0}, 0, NULL}
#define EMBD(x, n, u) {NM_TABM_EMBD_F32, NULL, x, n, u, 0, {0, 0}, 0, NULL}
#define RAW(kind, u, nd, s0, s1, sz) {kind, NULL, NULL, 0, u, nd, {s0, s1}, sz, NULL}
#define PARAMS(js, u) {NM_TABM_PARAMS, NULL, NULL, 0, u, 1, {0, 0}, 0, js}

static uint64_t g_request = 1000; // the id put_parts gives a prompt's first slot, and read_gen wants

static float embd_val(int32_t r, int32_t e) { return 0.02f * (float)((r * 37 + e * 11) % 53) - 0.5f; }

// The plain loop: decode the parts at pos (token parts in the brick's prompt
// chunks, which end at multiples of N_BATCH; embedding rows in batches of
// N_BATCH from the part's start), then sample greedily, decode each token,
// until EOG or n_predict. Returns the count.
static int32_t plain(nm_ctx *c, nm_sampler *s, const part *p, int n_parts, int32_t *pos, int32_t n_predict,
                     int32_t *out) {
    nm_model *m = model();
    for (int k = 0; k < n_parts; k++) {
        if (p[k].user & NM_LLM_IN_AT_POS) *pos = NM_LLM_IN_POS_OF(p[k].user);
        for (int32_t i = 0, nb; i < p[k].n; i += nb) {
            nb = p[k].n - i < N_BATCH ? p[k].n - i : N_BATCH;
            if (p[k].kind == NM_TABM_TOKENS && nb > N_BATCH - (*pos + i) % N_BATCH) nb = N_BATCH - (*pos + i) % N_BATCH;
            nm_status st = p[k].kind == NM_TABM_TOKENS ? nm_decode(c, p[k].tok + i, nb, *pos + i, false)
                                                       : nm_decode_embd(c, p[k].embd + (size_t)i * N_EMBD, nb, *pos + i, false);
            if (st != NM_OK) return -1;
            if (p[k].kind == NM_TABM_TOKENS)
                for (int32_t j = 0; j < nb; j++) nm_sampler_accept(s, p[k].tok[i + j]);
        }
        *pos += p[k].n;
    }
    int32_t n = 0;
    for (; n < n_predict; n++) {
        int32_t t = nm_sampler_sample(s, nm_get_logits(c, -1));
        if (nm_token_is_eog(m, t)) break;
        nm_sampler_accept(s, t);
        out[n] = t;
        if (nm_decode(c, &t, 1, (*pos)++, false) != NM_OK) return -1;
    }
    return n;
}

// Writes the parts into the ring as slots (raw slots as described).
static nm_status put_parts(nm_tabm *r, const part *p, int n_parts) {
    for (int k = 0; k < n_parts; k++) {
        nm_tabm_slot s;
        nm_status st = nm_tabm_acquire_write(r, 7, 5ll * 1000000000, &s);
        if (st != NM_OK) return st;
        nm_tabm_meta *mt = s.meta;
        mt->kind = (uint32_t)p[k].kind;
        mt->user = p[k].user;
        mt->request = g_request + (uint64_t)k; // the brick answers with the id of the prompt's first slot
        if (p[k].kind == NM_TABM_PARAMS && p[k].json) {
            size_t n = strlen(p[k].json);
            memcpy(s.data, p[k].json, n);
            mt->ndim = 1;
            mt->shape[0] = (int64_t)n;
            mt->size = n;
        } else if (p[k].kind == NM_TABM_TOKENS && p[k].tok) {
            memcpy(s.data, p[k].tok, sizeof(int32_t) * (size_t)p[k].n); // the producer fills its slot
            mt->ndim = 1;
            mt->shape[0] = p[k].n;
            mt->size = sizeof(int32_t) * (uint64_t)p[k].n;
        } else if (p[k].kind == NM_TABM_EMBD_F32 && p[k].embd) {
            memcpy(s.data, p[k].embd, sizeof(float) * (size_t)p[k].n * N_EMBD);
            mt->ndim = 2;
            mt->shape[0] = p[k].n;
            mt->shape[1] = N_EMBD;
            mt->size = sizeof(float) * (uint64_t)p[k].n * N_EMBD;
        } else {
            mt->ndim = p[k].ndim;
            mt->shape[0] = p[k].shape[0];
            mt->shape[1] = p[k].shape[1];
            mt->size = p[k].size;
            memset(s.data, 0, p[k].size);
        }
        if ((st = nm_tabm_publish(r, &s)) != NM_OK) return st;
    }
    return NM_OK;
}

typedef struct producer {
    nm_tabm *r;
    const part *p;
    int n_parts;
    nm_status st;
} producer;

static void *producer_main(void *arg) {
    producer *P = arg;
    P->st = put_parts(P->r, P->p, P->n_parts);
    return NULL;
}

typedef struct lane {
    nm_brick *b;
    nm_tabm *in, *out;
    nm_status st;
} lane;

static void *lane_main(void *arg) {
    lane *L = arg;
    L->st = nm_brick_run(L->b, L->in, L->out);
    return NULL;
}

// Reads output slots until an END slot; tokens into out. Returns the count
// (-1 on a ring error); *why gets the stop reason, *slots the slot count.
static uint64_t g_last_user; // meta->user of the last slot read_gen read

static int32_t read_gen(nm_tabm *r, int32_t *out, int32_t max, nm_llm_stop *why, int *slots) {
    int32_t n = 0;
    *slots = 0;
    for (;;) {
        nm_tabm_slot s;
        if (nm_tabm_acquire_read(r, 10ll * 1000000000, &s) != NM_OK) return -1;
        (*slots)++;
        if (s.meta->kind != NM_TABM_TOKENS || s.meta->request != g_request) return -1;
        int32_t k = s.meta->ndim == 1 ? (int32_t)s.meta->shape[0] : 0;
        const int32_t *t = s.data;
        for (int32_t i = 0; i < k && n < max; i++) out[n++] = t[i];
        uint64_t user = s.meta->user;
        g_last_user = user;
        nm_tabm_release(r, &s);
        if (!(user & NM_BRICK_MORE)) {
            *why = NM_LLM_STOP_OF(user);
            return n;
        }
    }
}

typedef struct rig {
    nm_model *m;
    nm_ledger *led;
    nm_brick *b;
    nm_tabm *in, *out;
    lane L;
    pthread_t th;
    bool running;
} rig;

// A rig whose brick decodes n_par sequences together, its input ring of in_slots.
static int32_t g_rig_batch, g_rig_ubatch; // set: the next rig's n_batch and n_ubatch (else N_BATCH, the default)

static bool rig_up_with(rig *R, int32_t n_par, int32_t n_predict, int32_t out_batch, uint32_t in_slots,
                        uint32_t out_slots) {
    memset(R, 0, sizeof *R);
    R->m = g_rig_lfm2 ? lfm2_model() : model();
    g_rig_lfm2 = false;
    if (!R->m) return false;
    R->led = nm_ledger_create();
    nm_brick_params bp = brick_params(R->m);
    bp.llm.n_predict = n_predict;
    bp.llm.out_batch = out_batch;
    bp.n_parallel = n_par;
    bp.ledger = R->led;
    if (g_rig_batch) bp.n_batch = g_rig_batch, bp.n_ubatch = g_rig_ubatch;
    g_rig_batch = g_rig_ubatch = 0;
    char err[256];
    if (!R->led || nm_brick_load(NULL, &bp, &R->b, err, sizeof err) != NM_OK) return false;
    if (nm_tabm_create(NULL, in_slots, sizeof(float) * N_CTX * N_EMBD, &R->in, err, sizeof err) != NM_OK) return false;
    if (nm_tabm_create(NULL, out_slots, sizeof(int32_t) * (size_t)out_batch, &R->out, err, sizeof err) != NM_OK)
        return false;
    R->L = (lane){R->b, R->in, R->out, NM_OK};
    return true;
}

// Starts the rig's lane: the brick's thread from here on.
static bool rig_start(rig *R) {
    R->running = pthread_create(&R->th, NULL, lane_main, &R->L) == 0;
    return R->running;
}

static bool rig_up(rig *R, int32_t n_predict, int32_t out_batch, uint32_t out_slots) {
    return rig_up_with(R, 1, n_predict, out_batch, 4, out_slots) && rig_start(R);
}

// Shuts the rings; the brick must return NM_ERR_SHUTDOWN. Frees all.
static nm_status rig_down(rig *R) {
    nm_status st = NM_OK;
    if (R->running) {
        nm_tabm_shutdown(R->in);
        nm_tabm_shutdown(R->out); // also when a failed check left the brick waiting on a full output ring
        pthread_join(R->th, NULL);
        st = R->L.st;
    }
    nm_brick_free(R->b);
    nm_tabm_free(R->in);
    nm_tabm_free(R->out);
    nm_ledger_free(R->led);
    return st;
}

// One prompt through the rig's brick against the plain greedy loop on a
// fresh context: the same tokens (the brick answers with its own, greedy,
// parameters), n_predict of them or up to the end of generation.
static void greedy_as_plain(int *nmtest_failed, rig *R, const part *p, int32_t n_predict) {
    int32_t got[64], want[64];
    nm_llm_stop why;
    int slots;
    NM_CHECK(put_parts(R->in, p, 1) == NM_OK);
    int32_t n = read_gen(R->out, got, 64, &why, &slots);
    nm_ctx *rc = new_ctx(R->m);
    nm_sampler *rs = greedy(R->m);
    int32_t pos = 0;
    int32_t nw = plain(rc, rs, p, 1, &pos, n_predict, want);
    NM_CHECK(nw > 0 && n == nw && !memcmp(got, want, sizeof(int32_t) * (size_t)nw));
    NM_CHECK(why == (nw == n_predict ? NM_LLM_STOP_N_PREDICT : NM_LLM_STOP_EOG));
    nm_ctx_free(rc);
    nm_sampler_free(rs);
}

// The answer to a refused prompt: one END slot, no token, NM_LLM_STOP_BAD_INPUT
// flagged NM_BRICK_ERROR, and the brick's last error says `msg` (case k).
static void refused(int *nmtest_failed, rig *R, size_t k, const char *msg) {
    int32_t toks[16];
    nm_llm_stop why = NM_LLM_STOP_NONE;
    int slots = 0;
    int32_t n = read_gen(R->out, toks, 16, &why, &slots);
    NM_CHECK(n == 0 && slots == 1 && why == NM_LLM_STOP_BAD_INPUT && (g_last_user & NM_BRICK_ERROR));
    const char *e = nm_brick_last_error(R->b);
    if (!strstr(e, msg)) {
        fprintf(stderr, "  case %zu: error '%s' lacks '%s'\n", k, e, msg);
        NM_CHECK(0);
    }
}

static const int32_t TEXT_A[] = {1, 504, 3458, 282, 4649, 314, 12, 2500, 77, 9, 1046, 30};
static const int32_t TEXT_B[] = {2010, 34, 8, 905, 217, 15};
static const int32_t TEXT_C[] = {77, 3458, 9, 1046, 12, 504, 30, 314, 2500, 282, 4649, 1};

// Feeds the parts through the brick (a producer thread writes them) and
// through the plain loop; both must give the same tokens.
static void same_as_plain(int *nmtest_failed, const part *p, int n_parts, int32_t n_predict, int32_t out_batch) {
    rig R;
    RIG_UP(R, n_predict, out_batch, 3);
    producer P = {R.in, p, n_parts, NM_OK};
    pthread_t pt;
    NM_CHECK(pthread_create(&pt, NULL, producer_main, &P) == 0);
    int32_t got[256], want[256];
    nm_llm_stop why = NM_LLM_STOP_NONE;
    int slots = 0;
    int32_t n = read_gen(R.out, got, 256, &why, &slots);
    pthread_join(pt, NULL);
    NM_CHECK(P.st == NM_OK);

    nm_ctx *rc = new_ctx(R.m);
    nm_sampler *rs = greedy(R.m);
    int32_t pos = 0;
    int32_t nw = plain(rc, rs, p, n_parts, &pos, n_predict, want);
    NM_CHECK(nw > 0);
    NM_CHECK(n == nw);
    NM_CHECK(n > 0 && !memcmp(got, want, sizeof(int32_t) * (size_t)(n < nw ? n : nw)));
    NM_CHECK(why == (nw == n_predict ? NM_LLM_STOP_N_PREDICT : NM_LLM_STOP_EOG));
    NM_CHECK(slots == n / out_batch + 1); // full slots, then the END slot with what is left (maybe nothing)
    NM_CHECK(nm_brick_llm_pos(R.b) == pos);
    nm_brick_stats bs = nm_brick_get_stats(R.b);
    NM_CHECK(bs.n_requests == 1 && bs.n_gen == (uint64_t)n && bs.n_in_slots == (uint64_t)n_parts && bs.n_bad_requests == 0);
    NM_CHECK(nm_ledger_total(R.led) == 0 && nm_ledger_copies(R.led, -1, -1) == 0);
    nm_tabm_stats is = nm_tabm_get_stats(R.in);
    NM_CHECK(is.published == (uint64_t)n_parts && is.released == (uint64_t)n_parts && is.occupancy == 0);
    NM_CHECK(rig_down(&R) == NM_ERR_SHUTDOWN);
    nm_ctx_free(rc);
    nm_sampler_free(rs);
}

NM_TEST(tabm_llm_brick_tokens_match_plain_loop) {
    part p[] = {TOKS(TEXT_A, 12, NM_LLM_IN_POS(0))};
    same_as_plain(nmtest_failed, p, 1, 24, 1);
}

NM_TEST(tabm_llm_brick_batched_output_slots) {
    part p[] = {TOKS(TEXT_A, 12, NM_LLM_IN_POS(0))};
    same_as_plain(nmtest_failed, p, 1, 22, 5); // 4 full slots, then the END slot with 2 tokens
}

// The vision brick's shape of prompt: text, image embeddings, text, in three
// slots, generation after the last; positions continue across them.
NM_TEST(tabm_llm_brick_mixed_prompt_several_slots) {
    static float img[20 * N_EMBD];
    for (int32_t r = 0; r < 20; r++)
        for (int32_t e = 0; e < N_EMBD; e++) img[r * N_EMBD + e] = embd_val(r, e);
    part p[] = {TOKS(TEXT_A, 5, NM_LLM_IN_POS(0) | NM_BRICK_MORE),
                EMBD(img, 20, NM_BRICK_MORE),
                TOKS(TEXT_B, 6, 0)};
    same_as_plain(nmtest_failed, p, 3, 16, 1);
}

// A second prompt that starts over at position 0 and shares the first one's
// tokens: it reuses the cache up to the end of the last whole chunk (N_BATCH
// positions) that prompt 1 decoded, and decodes the rest in the chunks a
// fresh prompt is decoded in, so its answer is the plain loop's for prompt 2
// on a fresh context (the bits of recomputing it, not of decoding prompt 1's
// answer one token at a time).
NM_TEST(tabm_llm_brick_prefix_reuse) {
    rig R;
    RIG_UP(R, 8, 1, 4);
    part p1 = TOKS(TEXT_A, 12, NM_LLM_IN_POS(0));
    int32_t a1[16], a2[16], w1[16], w2[16];
    nm_llm_stop why;
    int slots;
    NM_CHECK(put_parts(R.in, &p1, 1) == NM_OK);
    int32_t n1 = read_gen(R.out, a1, 16, &why, &slots);
    NM_CHECK(n1 == 8);
    // prompt 2 = prompt 1 + its answer + TEXT_B: all but TEXT_B is cached
    int32_t p2t[12 + 8 + 6];
    memcpy(p2t, TEXT_A, sizeof TEXT_A);
    memcpy(p2t + 12, a1, sizeof(int32_t) * 8);
    memcpy(p2t + 20, TEXT_B, sizeof TEXT_B);
    part p2 = TOKS(p2t, 26, NM_LLM_IN_POS(0));
    uint64_t before = nm_brick_get_stats(R.b).n_prompt_tokens;
    NM_CHECK(before == 12);
    NM_CHECK(put_parts(R.in, &p2, 1) == NM_OK);
    int32_t n2 = read_gen(R.out, a2, 16, &why, &slots);
    NM_CHECK(n2 == 8);
    // [0, 8) reused: prompt 1's one whole chunk; [8, 26) decoded
    NM_CHECK(nm_brick_get_stats(R.b).n_prompt_tokens - before == 26 - 8);

    nm_ctx *rc = new_ctx(R.m);
    nm_sampler *rs = greedy(R.m);
    int32_t pos = 0;
    NM_CHECK(plain(rc, rs, &p1, 1, &pos, 8, w1) == 8);
    nm_ctx_free(rc);
    nm_sampler_free(rs);
    rc = new_ctx(R.m), rs = greedy(R.m), pos = 0;
    NM_CHECK(plain(rc, rs, &p2, 1, &pos, 8, w2) == 8);
    NM_CHECK(!memcmp(a1, w1, sizeof(int32_t) * 8) && !memcmp(a2, w2, sizeof(int32_t) * 8));
    // prompt 3 = prompt 1 again: [0, 8) cached; the chunk of its last token
    // is decoded again for fresh logits, so the answer is prompt 1's.
    before = nm_brick_get_stats(R.b).n_prompt_tokens;
    NM_CHECK(put_parts(R.in, &p1, 1) == NM_OK);
    int32_t a3[16];
    NM_CHECK(read_gen(R.out, a3, 16, &why, &slots) == 8 && !memcmp(a3, a1, sizeof(int32_t) * 8));
    NM_CHECK(nm_brick_get_stats(R.b).n_prompt_tokens - before == 12 - 8);
    // prompt 4 = prompt 1's first chunk, exactly: its last position is decoded again, so its whole chunk is
    part p4 = TOKS(TEXT_A, 8, NM_LLM_IN_POS(0));
    before = nm_brick_get_stats(R.b).n_prompt_tokens;
    NM_CHECK(put_parts(R.in, &p4, 1) == NM_OK);
    int32_t a4[16], w4[16];
    NM_CHECK(read_gen(R.out, a4, 16, &why, &slots) == 8 && nm_brick_get_stats(R.b).n_prompt_tokens - before == 8);
    nm_ctx_free(rc);
    nm_sampler_free(rs);
    rc = new_ctx(R.m), rs = greedy(R.m), pos = 0;
    NM_CHECK(plain(rc, rs, &p4, 1, &pos, 8, w4) == 8 && !memcmp(a4, w4, sizeof(int32_t) * 8));
    NM_CHECK(nm_ledger_total(R.led) == 0);
    NM_CHECK(rig_down(&R) == NM_ERR_SHUTDOWN);
    nm_ctx_free(rc);
    nm_sampler_free(rs);
}

// With recurrent layers (lfm2) a prompt goes on from a cached prefix only where their state is kept: a
// second prompt sharing 44 of the first's 70 tokens would reuse [0, 40) (whole chunks of 8), but the state
// at 40 is neither among the last positions decoded nor at a checkpoint, so it reuses [0, 32) and decodes
// the rest; its answer is the plain loop's on a fresh context.
NM_TEST(tabm_llm_brick_prefix_reuse_recurrent) {
    rig R;
    g_rig_lfm2 = true;
    RIG_UP(R, 8, 1, 4);
    int32_t t1[70], t3[50], a1[16], a3[16], w3[16];
    for (int i = 0; i < 70; i++) t1[i] = (i * 7919 + 13) % nm_model_n_vocab(R.m);
    memcpy(t3, t1, sizeof(int32_t) * 44);
    memcpy(t3 + 44, TEXT_B, sizeof TEXT_B);
    part p1 = TOKS(t1, 70, NM_LLM_IN_POS(0)), p3 = TOKS(t3, 50, NM_LLM_IN_POS(0));
    nm_llm_stop why;
    int slots;
    NM_CHECK(put_parts(R.in, &p1, 1) == NM_OK);
    NM_CHECK(read_gen(R.out, a1, 16, &why, &slots) == 8);
    const uint64_t before = nm_brick_get_stats(R.b).n_prompt_tokens;
    NM_CHECK(put_parts(R.in, &p3, 1) == NM_OK);
    NM_CHECK(read_gen(R.out, a3, 16, &why, &slots) == 8);
    NM_CHECK(nm_brick_get_stats(R.b).n_prompt_tokens - before == 50 - 32);
    nm_ctx *rc = new_ctx(R.m);
    nm_sampler *rs = greedy(R.m);
    int32_t pos = 0;
    NM_CHECK(plain(rc, rs, &p3, 1, &pos, 8, w3) == 8 && !memcmp(a3, w3, sizeof(int32_t) * 8));
    nm_ctx_free(rc);
    nm_sampler_free(rs);
    NM_CHECK(rig_down(&R) == NM_ERR_SHUTDOWN);
}

// Nobody reads the output ring: the brick blocks on it (backpressure), then
// the ring is shut down; the brick returns NM_ERR_SHUTDOWN, holds no slot,
// and shuts the input ring too.
NM_TEST(tabm_llm_brick_shutdown_while_output_full) {
    rig R;
    RIG_UP(R, 50, 1, 2);
    part p = TOKS(TEXT_A, 12, NM_LLM_IN_POS(0));
    NM_CHECK(put_parts(R.in, &p, 1) == NM_OK);
    nm_tabm_stats os = {0};
    for (int i = 0; i < 5000; i++) { // up to 5 s for the brick to fill the ring and wait
        os = nm_tabm_get_stats(R.out);
        if (os.ready == 2 && os.full_waits > 0) break;
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    NM_CHECK(os.ready == 2 && os.full_waits > 0);
    nm_tabm_shutdown(R.out);
    pthread_join(R.th, NULL);
    R.running = false;
    NM_CHECK(R.L.st == NM_ERR_SHUTDOWN);
    NM_CHECK(nm_tabm_is_shutdown(R.in));
    NM_CHECK(strstr(nm_brick_last_error(R.b), "output ring was shut down") != NULL);
    os = nm_tabm_get_stats(R.out);
    NM_CHECK(os.published == 2 && os.occupancy == 2); // the two unread token slots, nothing held for write
    NM_CHECK(nm_tabm_get_stats(R.in).occupancy == 0);
    // The consumer can still drain what was published.
    nm_tabm_slot s;
    NM_CHECK(nm_tabm_acquire_read(R.out, 0, &s) == NM_OK && nm_tabm_release(R.out, &s) == NM_OK);
    rig_down(&R);
}

// Shutting the input ring while the brick waits for a prompt ends it too,
// and the output ring is shut down for the consumer.
NM_TEST(tabm_llm_brick_shutdown_while_waiting_for_input) {
    rig R;
    RIG_UP(R, 4, 1, 2);
    nanosleep(&(struct timespec){0, 20000000}, NULL);
    NM_CHECK(rig_down(&R) == NM_ERR_SHUTDOWN);
}

// Malformed slots: each gives an END slot with NM_LLM_STOP_BAD_INPUT and a
// message naming the problem; the next prompt is served normally.
NM_TEST(tabm_llm_brick_malformed_slots) {
    rig R;
    RIG_UP(R, 6, 1, 4);
    static float narrow[3 * 32];
    static const int32_t big_id[] = {5, 1 << 30};
    static float img[2 * N_EMBD];
    struct {
        part p[3];
        int n;
        const char *msg;
    } cases[] = {
        {{RAW(NM_TABM_PCM_F32, 0, 2, 8, 1, 32)}, 1, "kind 5 (pcm f32) is not taken"},
        {{RAW(NM_TABM_EMBD_F16, 0, 2, 2, N_EMBD, 2 * 2 * N_EMBD)}, 1, "kind 3 (embeddings f16)"},
        {{RAW(NM_TABM_EMBD_F32, 0, 2, 3, 32, sizeof narrow)}, 1, "width 32, the model's n_embd is 64"},
        {{RAW(NM_TABM_TOKENS, 0, 0, 0, 0, 0)}, 1, "at least one token"},
        {{RAW(NM_TABM_EMBD_F32, 0, 0, 0, 0, 0)}, 1, "at least one row"},
        {{TOKS(big_id, 2, 0)}, 1, "is 1073741824, not in [0, 49152)"},
        {{TOKS(TEXT_A, 4, NM_LLM_IN_POS(N_CTX - 2))}, 1, "do not fit the context of 96"},
        // a part another brick failed (the vision brick's error slot)
        {{RAW(NM_TABM_TOKENS, NM_BRICK_ERROR, 0, 0, 0, 0)}, 1, "the brick before this one failed this part"},
        // a bad slot in the middle of a prompt drops the whole prompt
        // (at position 40, so the good prompt at 0 below shares no cached prefix with it)
        {{TOKS(TEXT_A, 4, NM_LLM_IN_POS(40) | NM_BRICK_MORE),
          RAW(NM_TABM_BYTES, NM_BRICK_MORE, 1, 16, 0, 16),
          EMBD(img, 2, 0)},
         3, "kind 0 (bytes) is not taken"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        NM_CHECK(put_parts(R.in, cases[k].p, cases[k].n) == NM_OK);
        refused(nmtest_failed, &R, k, cases[k].msg);
    }
    NM_CHECK(nm_brick_get_stats(R.b).n_bad_requests == sizeof cases / sizeof cases[0]);
    NM_CHECK(nm_brick_llm_pos(R.b) == 0); // dropped prompts leave no position behind
    // ... and the brick goes on: a good prompt gives the plain loop's tokens.
    part good = TOKS(TEXT_A, 12, NM_LLM_IN_POS(0));
    greedy_as_plain(nmtest_failed, &R, &good, 6);
    NM_CHECK(nm_ledger_total(R.led) == 0);
    NM_CHECK(rig_down(&R) == NM_ERR_SHUTDOWN);
}

// ---- a request's own parameters (an NM_TABM_PARAMS slot first) -------------------------

// A request with a PARAMS slot samples as a brick loaded with those
// parameters would (the plain loop with that sampler); the next request has
// the brick's own again (greedy, its n_predict).
NM_TEST(tabm_llm_brick_request_params_this_request_only) {
    rig R;
    RIG_UP(R, 8, 1, 4);
    part p1[] = {PARAMS("{\"temperature\": 0.9, \"top_k\": 40, \"top_p\": 0.95, \"min_p\": 0.01, \"seed\": 4242, "
                        "\"repeat_penalty\": 1.2, \"repeat_last_n\": 16, \"presence_penalty\": 0.3, "
                        "\"frequency_penalty\": 0.2, \"n_predict\": 12, \"unknown_field\": [1, 2]}", NM_BRICK_MORE),
                 TOKS(TEXT_A, 12, NM_LLM_IN_POS(0))};
    int32_t got[32], want[32];
    nm_llm_stop why = NM_LLM_STOP_NONE;
    int slots = 0;
    NM_CHECK(put_parts(R.in, p1, 2) == NM_OK);
    int32_t n = read_gen(R.out, got, 32, &why, &slots);
    nm_sampler_params sp = nm_sampler_default_params();
    sp.temp = 0.9f;
    sp.top_k = 40;
    sp.top_p = 0.95f;
    sp.min_p = 0.01f;
    sp.seed = 4242;
    sp.repeat_penalty = 1.2f;
    sp.repeat_last_n = 16;
    sp.presence_penalty = 0.3f;
    sp.frequency_penalty = 0.2f;
    nm_ctx *rc = new_ctx(R.m);
    nm_sampler *rs = nm_sampler_create(&sp, nm_model_n_vocab(R.m));
    int32_t pos = 0;
    int32_t nw = plain(rc, rs, &p1[1], 1, &pos, 12, want);
    NM_CHECK(nw > 0 && n == nw && !memcmp(got, want, sizeof(int32_t) * (size_t)nw));
    NM_CHECK(why == (nw == 12 ? NM_LLM_STOP_N_PREDICT : NM_LLM_STOP_EOG));
    // greedy would have chosen otherwise somewhere (else the parameters proved nothing)
    nm_ctx *gc = new_ctx(R.m);
    nm_sampler *gs = greedy(R.m);
    int32_t gpos = 0, gw[32];
    int32_t ng = plain(gc, gs, &p1[1], 1, &gpos, 12, gw);
    NM_CHECK(ng != nw || memcmp(gw, want, sizeof(int32_t) * (size_t)nw) != 0);
    // the next request: the brick's own parameters (greedy, 8 tokens)
    part p2 = TOKS(TEXT_B, 6, NM_LLM_IN_POS(0));
    greedy_as_plain(nmtest_failed, &R, &p2, 8);
    NM_CHECK(nm_brick_get_stats(R.b).n_bad_requests == 0 && nm_ledger_total(R.led) == 0);
    NM_CHECK(rig_down(&R) == NM_ERR_SHUTDOWN);
    nm_ctx_free(rc);
    nm_ctx_free(gc);
    nm_sampler_free(rs);
    nm_sampler_free(gs);
}

// JSON text of s, escaped.
static void json_str(char *dst, size_t cap, const char *s) {
    size_t k = 0;
    dst[k++] = '"';
    for (; *s && k + 8 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') k += (size_t)snprintf(dst + k, cap - k, "\\%c", c);
        else if (c < 0x20) k += (size_t)snprintf(dst + k, cap - k, "\\u%04x", c);
        else dst[k++] = (char)c;
    }
    dst[k++] = '"';
    dst[k] = '\0';
}

// n_predict / max_tokens and stop strings of one request.
NM_TEST(tabm_llm_brick_request_params_limits_and_stop) {
    rig R;
    RIG_UP(R, 10, 1, 4);
    part prompt = TOKS(TEXT_A, 12, NM_LLM_IN_POS(0));
    int32_t all[16], got[16];
    nm_llm_stop why;
    int slots;
    NM_CHECK(put_parts(R.in, &prompt, 1) == NM_OK);
    int32_t n_all = read_gen(R.out, all, 16, &why, &slots);
    NM_CHECK(n_all == 10);
    struct {
        const char *json;
        int32_t n;
    } lim[] = {{"{\"max_tokens\": 3}", 3}, {"{\"n_predict\": 2, \"max_tokens\": 5}", 2}, {"{\"n_predict\": null}", 10}};
    for (size_t k = 0; k < sizeof lim / sizeof lim[0]; k++) {
        part p[] = {PARAMS(lim[k].json, NM_BRICK_MORE), prompt};
        NM_CHECK(put_parts(R.in, p, 2) == NM_OK);
        int32_t n = read_gen(R.out, got, 16, &why, &slots);
        NM_CHECK(n == lim[k].n && why == NM_LLM_STOP_N_PREDICT && !memcmp(got, all, sizeof(int32_t) * (size_t)n));
    }
    // a stop string: the text of a generated token that does not occur earlier
    char text[2048] = "", piece[256];
    int32_t at = -1;
    size_t len = 0;
    nm_detok dt = {0};
    for (int32_t i = 0; i < n_all && at < 0; i++) {
        int32_t k = nm_detok_push(R.m, &dt, all[i], piece, (int32_t)sizeof piece - 1);
        if (k <= 0) continue;
        piece[k] = '\0';
        if (i >= 2 && !strstr(text, piece) && strlen(piece) >= 2) at = i;
        if (len + (size_t)k < sizeof text - 1) {
            memcpy(text + len, piece, (size_t)k);
            len += (size_t)k;
            text[len] = '\0';
        }
    }
    if (at < 0) {
        NM_SKIP("the random model's output has no token text to stop at");
    } else {
        char js[1200], esc[600];
        json_str(esc, sizeof esc, piece);
        snprintf(js, sizeof js, "{\"stop\": [\"never in this text\", %s]}", esc);
        part p[] = {PARAMS(js, NM_BRICK_MORE), prompt};
        NM_CHECK(put_parts(R.in, p, 2) == NM_OK);
        int32_t n = read_gen(R.out, got, 16, &why, &slots);
        NM_CHECK(n == at + 1 && why == NM_LLM_STOP_STRING && !memcmp(got, all, sizeof(int32_t) * (size_t)n));
        // one string, not an array, as OpenAI's API allows
        snprintf(js, sizeof js, "{\"stop\": %s}", esc);
        part q[] = {PARAMS(js, NM_BRICK_MORE), prompt};
        NM_CHECK(put_parts(R.in, q, 2) == NM_OK);
        n = read_gen(R.out, got, 16, &why, &slots);
        NM_CHECK(n == at + 1 && why == NM_LLM_STOP_STRING);
        // and the next request has no stop strings again
        NM_CHECK(put_parts(R.in, &prompt, 1) == NM_OK);
        n = read_gen(R.out, got, 16, &why, &slots);
        NM_CHECK(n == 10 && why == NM_LLM_STOP_N_PREDICT);
    }
    NM_CHECK(rig_down(&R) == NM_ERR_SHUTDOWN);
}

// A wrong parameter fails its request (flagged, the field named); the brick
// goes on with its own parameters.
NM_TEST(tabm_llm_brick_request_params_refused) {
    rig R;
    RIG_UP(R, 6, 1, 4);
    struct {
        const char *json;
        uint64_t user;
        const char *msg;
    } cases[] = {
        {"{\"temperature\": \"hot\"}", NM_BRICK_MORE, "\"temperature\" must be a number"},
        {"{\"top_p\": 1.5}", NM_BRICK_MORE, "\"top_p\" must be a number in [0, 1]"},
        {"{\"top_k\": 2.5}", NM_BRICK_MORE, "\"top_k\" must be a whole number"},
        {"{\"n_predict\": -3}", NM_BRICK_MORE, "\"n_predict\" must be a number in [-2,"},
        {"{\"repeat_last_n\": 97}", NM_BRICK_MORE, "\"repeat_last_n\" must be a number in [-1, 96]"},
        {"{\"seed\": -2}", NM_BRICK_MORE, "\"seed\""},
        {"{\"ignore_eos\": 1}", NM_BRICK_MORE, "\"ignore_eos\" must be true or false"},
        {"{\"stop\": [\"a\", 7]}", NM_BRICK_MORE, "\"stop\": element 1 must be a non-empty string"},
        {"{\"stop\": \"\"}", NM_BRICK_MORE, "\"stop\" must be a non-empty string"},
        {"{\"stop\": [\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\",\"11\",\"12\",\"13\",\"14\",\"15\",\"16\",\"17\"]}",
         NM_BRICK_MORE, "an array of at most 16 strings"},
        {"{\"temperature\": 0.5", NM_BRICK_MORE, "is not JSON"},
        {"[1, 2]", NM_BRICK_MORE, "JSON but not an object"},
        {"{} {}", NM_BRICK_MORE, "bytes after the JSON object"},
        {"{\"n_predict\": 4}", 0, "parameters alone: no prompt follows"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        part p[] = {PARAMS(cases[k].json, cases[k].user), TOKS(TEXT_A, 12, NM_LLM_IN_POS(0))};
        NM_CHECK(put_parts(R.in, p, cases[k].user ? 2 : 1) == NM_OK);
        refused(nmtest_failed, &R, k, cases[k].msg);
    }
    NM_CHECK(nm_brick_get_stats(R.b).n_bad_requests == sizeof cases / sizeof cases[0]);
    // a PARAMS slot anywhere but first is a malformed part of the prompt
    part late[] = {TOKS(TEXT_A, 4, NM_LLM_IN_POS(0) | NM_BRICK_MORE), PARAMS("{}", 0)};
    NM_CHECK(put_parts(R.in, late, 2) == NM_OK);
    refused(nmtest_failed, &R, 99, "kind 8 (parameters (only as a request's first slot))");
    // the brick's own parameters are intact: greedy, 6 tokens
    part good = TOKS(TEXT_A, 12, NM_LLM_IN_POS(0));
    greedy_as_plain(nmtest_failed, &R, &good, 6);
    NM_CHECK(rig_down(&R) == NM_ERR_SHUTDOWN);
}

// ---- cancellation ------------------------------------------------------------------------

// A request cancelled before the brick reads it: no token, its last slot
// flagged NM_BRICK_CANCELLED (not an error), the mark passed to the output
// ring; the next request is served.
NM_TEST(tabm_llm_brick_cancelled_before_it_starts) {
    rig R;
    RIG_UP(R, 6, 1, 4);
    g_request = 3000;
    NM_CHECK(nm_tabm_cancel_request(R.in, 3000) == NM_OK);
    part p[] = {TOKS(TEXT_A, 4, NM_LLM_IN_POS(0) | NM_BRICK_MORE), TOKS(TEXT_B, 6, 0)};
    NM_CHECK(put_parts(R.in, p, 2) == NM_OK);
    int32_t toks[16];
    nm_llm_stop why = NM_LLM_STOP_NONE;
    int slots = 0;
    NM_CHECK(read_gen(R.out, toks, 16, &why, &slots) == 0 && slots == 1);
    NM_CHECK(why == NM_LLM_STOP_CANCELLED && (g_last_user & NM_BRICK_CANCELLED) && !(g_last_user & NM_BRICK_ERROR));
    NM_CHECK(nm_tabm_request_cancelled(R.out, 3000) && !nm_tabm_request_cancelled(R.out, 3001));
    nm_brick_stats bs = nm_brick_get_stats(R.b);
    NM_CHECK(bs.n_cancelled == 1 && bs.n_bad_requests == 0 && bs.n_in_slots == 2 && bs.n_prompt_tokens == 0);
    NM_CHECK(nm_brick_llm_pos(R.b) == 0);
    // a slot flagged cancelled by the brick before this one cancels its request too
    g_request = 3100;
    part f[] = {RAW(NM_TABM_TOKENS, NM_BRICK_CANCELLED | NM_BRICK_MORE, 0, 0, 0, 0), TOKS(TEXT_B, 6, 0)};
    NM_CHECK(put_parts(R.in, f, 2) == NM_OK);
    NM_CHECK(read_gen(R.out, toks, 16, &why, &slots) == 0 && why == NM_LLM_STOP_CANCELLED);
    NM_CHECK(nm_tabm_request_cancelled(R.out, 3100));
    g_request = 3200;
    part good = TOKS(TEXT_A, 12, NM_LLM_IN_POS(0));
    NM_CHECK(put_parts(R.in, &good, 1) == NM_OK);
    NM_CHECK(read_gen(R.out, toks, 16, &why, &slots) == 6 && why == NM_LLM_STOP_N_PREDICT);
    NM_CHECK(nm_brick_get_stats(R.b).n_cancelled == 2);
    g_request = 1000;
    NM_CHECK(rig_down(&R) == NM_ERR_SHUTDOWN);
}

// Cancelled while it generates without limit: it stops within the tokens
// the output ring holds, and the next request has the brick's parameters.
NM_TEST(tabm_llm_brick_cancelled_while_generating) {
    rig R;
    RIG_UP(R, 5, 1, 2);
    g_request = 4000;
    part p[] = {PARAMS("{\"n_predict\": -1, \"ignore_eos\": true}", NM_BRICK_MORE), TOKS(TEXT_A, 12, NM_LLM_IN_POS(0))};
    NM_CHECK(put_parts(R.in, p, 2) == NM_OK);
    int32_t n = 0;
    uint64_t user = 0;
    for (;;) {
        nm_tabm_slot s;
        if (nm_tabm_acquire_read(R.out, 10ll * 1000000000, &s) != NM_OK) break;
        n += s.meta->ndim == 1 ? (int32_t)s.meta->shape[0] : 0;
        user = s.meta->user;
        NM_CHECK(s.meta->request == 4000);
        nm_tabm_release(R.out, &s);
        if (n == 3) NM_CHECK(nm_tabm_cancel_request(R.in, 4000) == NM_OK);
        if (!(user & NM_BRICK_MORE)) break;
    }
    // 3 read, then at most the two the ring held and the one in hand
    NM_CHECK(n >= 3 && n <= 6);
    NM_CHECK(NM_LLM_STOP_OF(user) == NM_LLM_STOP_CANCELLED && (user & NM_BRICK_CANCELLED) && !(user & NM_BRICK_ERROR));
    NM_CHECK(nm_tabm_request_cancelled(R.out, 4000));
    NM_CHECK(nm_brick_llm_pos(R.b) == 12 + n); // what went out stays in the conversation
    g_request = 4100;
    part q = TOKS(TEXT_B, 6, NM_LLM_IN_POS(0));
    NM_CHECK(put_parts(R.in, &q, 1) == NM_OK);
    int32_t toks[16];
    nm_llm_stop why;
    int slots;
    NM_CHECK(read_gen(R.out, toks, 16, &why, &slots) == 5 && why == NM_LLM_STOP_N_PREDICT);
    g_request = 1000;
    NM_CHECK(rig_down(&R) == NM_ERR_SHUTDOWN);
}

// Bad arguments: clear statuses, no crash.
NM_TEST(tabm_llm_brick_bad_args) {
    nm_brick *b = (nm_brick *)1;
    char err[128] = "";
    nm_brick_params none = nm_brick_default_params(NM_BRICK_LLM); // no model, no file
    NM_CHECK(nm_brick_load(NULL, &none, &b, err, sizeof err) == NM_ERR_INVALID_ARG);
    NM_CHECK(b == NULL && strstr(err, "no model") != NULL);
    NM_CHECK(nm_brick_load(NULL, NULL, &b, err, sizeof err) == NM_ERR_INVALID_ARG && b == NULL);
    NM_CHECK(nm_brick_step(NULL, NULL, NULL) == NM_ERR_INVALID_ARG);
    nm_brick_free(NULL);
    nm_model *m = model();
    if (!m) NM_NEED_SMALL_MODEL(g_model_r);
    nm_brick_params bp = brick_params(m);
    const char *empty[] = {""};
    bp.llm.stop = empty;
    bp.llm.n_stop = 1;
    NM_CHECK(nm_brick_load(NULL, &bp, &b, err, sizeof err) == NM_ERR_INVALID_ARG && b == NULL);
    NM_CHECK(strstr(err, "stop string 0 is empty") != NULL);
    bp.llm.n_stop = 0;
    bp.llm.out_batch = 4;
    nm_tabm *in = NULL, *out = NULL;
    NM_CHECK(nm_brick_load(NULL, &bp, &b, err, sizeof err) == NM_OK);
    NM_CHECK(nm_tabm_create(NULL, 2, 64, &in, NULL, 0) == NM_OK && nm_tabm_create(NULL, 2, 8, &out, NULL, 0) == NM_OK);
    NM_CHECK(nm_brick_step(b, in, out) == NM_ERR_INVALID_ARG); // 4 tokens do not fit 8-byte slots
    NM_CHECK(strstr(nm_brick_last_error(b), "cannot hold 4 tokens") != NULL);
    NM_CHECK(nm_brick_out_slot_bytes(b) == 16 && nm_brick_in_slot_bytes(b) == sizeof(int32_t) * N_CTX);
    // set_params checks what it takes and keeps the old values on a bad one
    bp.llm.stop = empty;
    bp.llm.n_stop = 1;
    NM_CHECK(nm_brick_set_params(b, &bp, err, sizeof err) == NM_ERR_INVALID_ARG);
    NM_CHECK(nm_brick_out_slot_bytes(b) == 16);
    bp.llm.n_stop = 0;
    bp.llm.out_batch = 2;
    NM_CHECK(nm_brick_set_params(b, &bp, err, sizeof err) == NM_OK && nm_brick_out_slot_bytes(b) == 8);
    NM_CHECK(nm_brick_get_kind(b) == NM_BRICK_LLM && !strcmp(nm_brick_name(b), "llm") &&
             !strcmp(nm_brick_device(b), "cpu") && nm_brick_llm_model(b) == m && nm_brick_llm_ctx(b) != NULL);
    NM_CHECK(nm_brick_stt_transcript(b) == NULL && nm_brick_tts_sample_rate(b) == 0); // not those kinds
    nm_brick_free(b);
    nm_tabm_free(in);
    nm_tabm_free(out);
}

// Writes a request's parts as slots of one id (with several sequences the
// brick tells requests apart by id: their slots may interleave in the ring).
typedef struct request_writer {
    nm_tabm *r;
    const part *p;
    int n_parts;
    uint64_t id;
    nm_status st;
} request_writer;

static void *request_writer_main(void *arg) {
    request_writer *W = arg;
    W->st = NM_OK;
    for (int k = 0; k < W->n_parts && W->st == NM_OK; k++) {
        nm_tabm_slot s;
        if ((W->st = nm_tabm_acquire_write(W->r, 7, 5ll * 1000000000, &s)) != NM_OK) break;
        const part *p = &W->p[k];
        *s.meta = (nm_tabm_meta){.kind = (uint32_t)p->kind, .user = p->user, .request = W->id};
        if (p->kind == NM_TABM_PARAMS) {
            const size_t n = strlen(p->json);
            memcpy(s.data, p->json, n);
            s.meta->ndim = 1, s.meta->shape[0] = (int64_t)n, s.meta->size = n;
        } else if (p->kind == NM_TABM_TOKENS) {
            memcpy(s.data, p->tok, sizeof(int32_t) * (size_t)p->n);
            s.meta->ndim = 1, s.meta->shape[0] = p->n, s.meta->size = sizeof(int32_t) * (uint64_t)p->n;
        } else {
            memcpy(s.data, p->embd, sizeof(float) * (size_t)p->n * N_EMBD);
            s.meta->ndim = 2, s.meta->shape[0] = p->n, s.meta->shape[1] = N_EMBD;
            s.meta->size = sizeof(float) * (uint64_t)p->n * N_EMBD;
        }
        W->st = nm_tabm_publish(W->r, &s);
        usleep(1000); // the other writers' slots come in between
    }
    return NULL;
}

// The answers of n requests (ids from id0) read from one ring: tokens and stop reasons by request.
static bool read_answers(nm_tabm *r, uint64_t id0, int n, int32_t got[][64], int32_t *n_got, nm_llm_stop *why) {
    int ended = 0;
    for (int k = 0; k < n; k++) n_got[k] = 0, why[k] = NM_LLM_STOP_NONE;
    while (ended < n) {
        nm_tabm_slot s;
        if (nm_tabm_acquire_read(r, 10ll * 1000000000, &s) != NM_OK) return false;
        const int k = (int)(s.meta->request - id0);
        if (k < 0 || k >= n || why[k] != NM_LLM_STOP_NONE) {
            nm_tabm_release(r, &s);
            return false;
        }
        const int32_t c = s.meta->ndim == 1 ? (int32_t)s.meta->shape[0] : 0;
        for (int32_t i = 0; i < c && n_got[k] < 64; i++) got[k][n_got[k]++] = ((const int32_t *)s.data)[i];
        const uint64_t user = s.meta->user;
        nm_tabm_release(r, &s);
        if (!(user & NM_BRICK_MORE)) why[k] = NM_LLM_STOP_OF(user), ended++;
    }
    return true;
}

static bool rig_up_par(rig *R, int32_t n_par, int32_t n_predict, uint32_t in_slots) {
    return rig_up_with(R, n_par, n_predict, 1, in_slots, 8) && rig_start(R);
}

// Continuous batching: three requests written at once by three writers (their
// slots interleaved in the ring: a PARAMS slot, embedding rows between text)
// are served together on three sequences: passes carry several of them, and
// each request gets the plain loop's tokens on a context of its own. On two
// sequences the third request waits for one, and is answered the same.
static float g_rows[3 * N_EMBD];
static void parallel_requests(int *nmtest_failed, int32_t n_par) {
    rig R;
    RIG_UP_BY(R, rig_up_par(&R, n_par, 12, 12));
    for (int32_t r = 0; r < 3; r++)
        for (int32_t e = 0; e < N_EMBD; e++) g_rows[r * N_EMBD + e] = embd_val(r, e);
    part a[] = {PARAMS("{\"n_predict\": 10}", NM_BRICK_MORE), TOKS(TEXT_A, 12, NM_LLM_IN_POS(0))};
    part bq[] = {TOKS(TEXT_B, 6, NM_LLM_IN_POS(0))};
    part c[] = {TOKS(TEXT_A, 5, NM_LLM_IN_POS(0) | NM_BRICK_MORE), EMBD(g_rows, 3, NM_BRICK_MORE), TOKS(TEXT_B, 6, 0)};
    const part *reqs[3] = {a, bq, c};
    const int np[3] = {2, 1, 3}, n_predict[3] = {10, 12, 12};
    request_writer W[3];
    pthread_t th[3];
    for (int k = 0; k < 3; k++) {
        W[k] = (request_writer){R.in, reqs[k], np[k], 5000 + (uint64_t)k, NM_OK};
        NM_CHECK(pthread_create(&th[k], NULL, request_writer_main, &W[k]) == 0);
    }
    // The answers are read once every request is in: until then the brick fills the 8 output slots and
    // waits, so a writer starved by a loaded machine cannot find the first request already answered
    // (the passes below must carry several sequences).
    for (int k = 0; k < 3; k++) {
        pthread_join(th[k], NULL);
        NM_CHECK(W[k].st == NM_OK);
    }
    int32_t got[3][64], n_got[3];
    nm_llm_stop why[3];
    NM_CHECK(read_answers(R.out, 5000, 3, got, n_got, why));
    for (int k = 0; k < 3; k++) {
        nm_ctx *rc = new_ctx(R.m);
        nm_sampler *rs = greedy(R.m);
        int32_t want[64], pos = 0;
        const int first = reqs[k][0].kind == NM_TABM_PARAMS; // (the plain loop takes no PARAMS)
        const int32_t nw = plain(rc, rs, reqs[k] + first, np[k] - first, &pos, n_predict[k], want);
        NM_CHECK(nw > 0 && n_got[k] == nw && !memcmp(got[k], want, sizeof(int32_t) * (size_t)nw));
        NM_CHECK(why[k] == (nw == n_predict[k] ? NM_LLM_STOP_N_PREDICT : NM_LLM_STOP_EOG));
        if (n_got[k] != nw) fprintf(stderr, "  request %d: %d tokens (why %d), the plain loop %d; %s\n", k, n_got[k], (int)why[k], nw, nm_brick_last_error(R.b));
        nm_ctx_free(rc);
        nm_sampler_free(rs);
    }
    const nm_brick_stats bs = nm_brick_get_stats(R.b);
    printf("  %llu passes carried %llu sequences (at most %u in one)\n", (unsigned long long)bs.n_passes,
           (unsigned long long)bs.n_pass_seqs, bs.max_pass_seqs);
    NM_CHECK(bs.n_requests == 3 && bs.n_bad_requests == 0 && bs.n_in_slots == 6 && bs.max_pass_seqs == (uint32_t)n_par);
    NM_CHECK(bs.n_pass_seqs > bs.n_passes + 10); // most steps decode the three together
    NM_CHECK(nm_ledger_total(R.led) == 0);
    const nm_tabm_stats is = nm_tabm_get_stats(R.in);
    NM_CHECK(is.released == 6 && is.occupancy == 0);
    NM_CHECK(rig_down(&R) == NM_ERR_SHUTDOWN);
}

NM_TEST(tabm_llm_brick_parallel_requests_together) { parallel_requests(nmtest_failed, 3); }
NM_TEST(tabm_llm_brick_parallel_more_requests_than_sequences) { parallel_requests(nmtest_failed, 2); }

// Two prompts that meet in one pass, by construction: both are in the input
// ring before the brick's lane starts, so the second pass carries the first
// prompt's last 4 rows and the second's first chunk in what is left of the
// N_BATCH rows (a chunk sized without the first's rows overruns the batch).
// Each gets the plain loop's tokens; passes never carry more than N_BATCH rows.
NM_TEST(tabm_llm_brick_two_prompts_share_a_pass) {
    rig R;
    RIG_UP_BY(R, rig_up_with(&R, 2, 6, 1, 8, 16));
    part a[] = {TOKS(TEXT_A, 12, NM_LLM_IN_POS(0))};
    part c[] = {TOKS(TEXT_C, 12, NM_LLM_IN_POS(0))};
    const part *reqs[2] = {a, c};
    request_writer W[2];
    for (int k = 0; k < 2; k++) {
        W[k] = (request_writer){R.in, reqs[k], 1, 8000 + (uint64_t)k, NM_OK};
        request_writer_main(&W[k]);
        NM_CHECK(W[k].st == NM_OK);
    }
    RIG_UP_BY(R, rig_start(&R));
    int32_t got[2][64], n_got[2];
    nm_llm_stop why[2];
    NM_CHECK(read_answers(R.out, 8000, 2, got, n_got, why));
    for (int k = 0; k < 2; k++) {
        nm_ctx *rc = new_ctx(R.m);
        nm_sampler *rs = greedy(R.m);
        int32_t want[64], pos = 0;
        const int32_t nw = plain(rc, rs, reqs[k], 1, &pos, 6, want);
        NM_CHECK(why[k] == NM_LLM_STOP_N_PREDICT && n_got[k] == nw && !memcmp(got[k], want, sizeof(int32_t) * (size_t)nw));
        nm_ctx_free(rc);
        nm_sampler_free(rs);
    }
    const nm_brick_stats bs = nm_brick_get_stats(R.b);
    // 24 prompt rows in passes of 8: 8 (A), 4 + 4 (A's end, C's start), 8 (C's end): three passes, the second of two.
    NM_CHECK(bs.n_prompt_tokens == 24 && bs.n_bad_requests == 0 && bs.max_pass_seqs == 2);
    if (bs.n_bad_requests) fprintf(stderr, "  %s\n", nm_brick_last_error(R.b));
    NM_CHECK(rig_down(&R) == NM_ERR_SHUTDOWN);
}

// Prompt chunks of n_ubatch 64 in passes of n_batch 96: two
// 70-token prompts written before the lane starts share their first passes
// (A's [0, 64) beside C's [0, 32)), so nothing of A is reused by the next A:
// a chunk decoded beside other rows is not how a fresh prompt is decoded.
// That next A runs alone: its [0, 64) is then reused by the third, which
// decodes only [64, 70) and answers as the second did. Then A is decoded
// afresh (cache_prompt false) beside a long request on C: the same tokens,
// in shared passes, so A after that reuses nothing again.
static int32_t g_long[2][70];
NM_TEST(tabm_llm_brick_ubatch_chunks_reused_only_when_alone) {
    rig R;
    g_rig_batch = 96, g_rig_ubatch = 64;
    RIG_UP_BY(R, rig_up_with(&R, 2, 6, 1, 8, 16));
    for (int k = 0; k < 2; k++)
        for (int32_t i = 0; i < 70; i++) g_long[k][i] = 100 + (int32_t)((i * 7919 + k * 131) % 3000);
    part a[] = {TOKS(g_long[0], 70, NM_LLM_IN_POS(0))}, c[] = {TOKS(g_long[1], 70, NM_LLM_IN_POS(0))};
    request_writer W = {R.in, a, 1, 9000, NM_OK};
    request_writer_main(&W);
    NM_CHECK(W.st == NM_OK);
    W = (request_writer){R.in, c, 1, 9001, NM_OK};
    request_writer_main(&W);
    NM_CHECK(W.st == NM_OK);
    RIG_UP_BY(R, rig_start(&R));
    int32_t got[3][64], n_got[3];
    nm_llm_stop why[3];
    NM_CHECK(read_answers(R.out, 9000, 2, got, n_got, why));
    NM_CHECK(nm_brick_get_stats(R.b).n_prompt_tokens == 140 && nm_brick_get_stats(R.b).max_pass_seqs == 2);
    uint64_t before = nm_brick_get_stats(R.b).n_prompt_tokens;
    W = (request_writer){R.in, a, 1, 9002, NM_OK}; // A alone: nothing reusable
    request_writer_main(&W);
    NM_CHECK(W.st == NM_OK && read_answers(R.out, 9002, 1, &got[1], &n_got[1], &why[1]));
    NM_CHECK(nm_brick_get_stats(R.b).n_prompt_tokens - before == 70);
    before = nm_brick_get_stats(R.b).n_prompt_tokens;
    W = (request_writer){R.in, a, 1, 9003, NM_OK}; // A again: [0, 64) reused
    request_writer_main(&W);
    NM_CHECK(W.st == NM_OK && read_answers(R.out, 9003, 1, &got[2], &n_got[2], &why[2]));
    NM_CHECK(nm_brick_get_stats(R.b).n_prompt_tokens - before == 6);
    NM_CHECK(n_got[1] == 6 && n_got[2] == 6 && !memcmp(got[1], got[2], sizeof(int32_t) * 6));
    // E (C, 20 tokens) is active until its answer is read, which the ring's 16 slots hold back: A' shares its passes
    part e[] = {PARAMS("{\"n_predict\": 20, \"ignore_eos\": true}", NM_BRICK_MORE), TOKS(g_long[1], 70, NM_LLM_IN_POS(0))};
    part a2[] = {PARAMS("{\"cache_prompt\": false}", NM_BRICK_MORE), TOKS(g_long[0], 70, NM_LLM_IN_POS(0))};
    W = (request_writer){R.in, e, 2, 9004, NM_OK};
    request_writer_main(&W);
    NM_CHECK(W.st == NM_OK);
    W = (request_writer){R.in, a2, 2, 9005, NM_OK};
    request_writer_main(&W);
    int32_t got2[2][64], n_got2[2];
    nm_llm_stop why2[2];
    NM_CHECK(W.st == NM_OK && read_answers(R.out, 9004, 2, got2, n_got2, why2) && n_got2[0] == 20 && n_got2[1] == 6);
    before = nm_brick_get_stats(R.b).n_prompt_tokens;
    W = (request_writer){R.in, a, 1, 9006, NM_OK}; // A: what A' overwrote in shared passes is not reused
    request_writer_main(&W);
    NM_CHECK(W.st == NM_OK && read_answers(R.out, 9006, 1, &got[0], &n_got[0], &why[0]));
    NM_CHECK(nm_brick_get_stats(R.b).n_prompt_tokens - before == 70);
    NM_CHECK(rig_down(&R) == NM_ERR_SHUTDOWN);
}

// A new request goes to the free sequence that holds the longest start of
// its prompt (not the least recently used one): two prompts answered in turn
// on three sequences, then three requests at once: one repeating the first
// prompt, one starting with the second's first tokens, a bad one. Each
// repeat decodes again only what follows the whole chunk (N_BATCH) its
// sequence holds; the bad one fails alone; the one without end is cancelled
// while the others run and ends alone.
NM_TEST(tabm_llm_brick_parallel_prefix_cancel_and_bad) {
    rig R;
    RIG_UP_BY(R, rig_up_par(&R, 3, 8, 16));
    static const int32_t bad_tok[] = {5, 999999};
    part ok1[] = {TOKS(TEXT_A, 12, NM_LLM_IN_POS(0))};
    part ok2[] = {TOKS(TEXT_C, 12, NM_LLM_IN_POS(0))};
    part endless[] = {PARAMS("{\"n_predict\": -1, \"ignore_eos\": true}", NM_BRICK_MORE), TOKS(TEXT_C, 9, NM_LLM_IN_POS(0))};
    part bad[] = {TOKS(bad_tok, 2, NM_LLM_IN_POS(0))};
    part again[] = {TOKS(TEXT_A, 12, NM_LLM_IN_POS(0))};
    const part *reqs[5] = {ok1, ok2, endless, bad, again};
    const int np[5] = {1, 1, 2, 1, 1};
    request_writer W[5];
    int32_t got[5][64], n_got[5];
    nm_llm_stop why[5];
    for (int k = 0; k < 2; k++) { // in turn: sequence 0 holds TEXT_A, sequence 1 TEXT_B, 2 nothing
        W[k] = (request_writer){R.in, reqs[k], np[k], 6000 + (uint64_t)k, NM_OK};
        request_writer_main(&W[k]);
        NM_CHECK(W[k].st == NM_OK && read_answers(R.out, 6000 + (uint64_t)k, 1, &got[k], &n_got[k], &why[k]));
    }
    const uint64_t before = nm_brick_get_stats(R.b).n_prompt_tokens;
    NM_CHECK(before == 12 + 12);
    // All three are written before any answer is read: the endless one first, so it runs beside the
    // other two. It cannot run ahead meanwhile (the output ring holds 8 tokens and nothing reads it
    // yet), nor can the other two be late (no writer thread to be starved under load).
    for (int k = 2; k < 5; k++) {
        W[k] = (request_writer){R.in, reqs[k], np[k], 6000 + (uint64_t)k, NM_OK};
        request_writer_main(&W[k]);
        NM_CHECK(W[k].st == NM_OK);
    }
    int ended = 0;
    for (int k = 2; k < 5; k++) n_got[k] = 0, why[k] = NM_LLM_STOP_NONE;
    while (ended < 3) {
        nm_tabm_slot s;
        if (nm_tabm_acquire_read(R.out, 10ll * 1000000000, &s) != NM_OK) break;
        const int k = (int)(s.meta->request - 6000);
        if (k < 2 || k >= 5) {
            nm_tabm_release(R.out, &s);
            break;
        }
        const int32_t c = s.meta->ndim == 1 ? (int32_t)s.meta->shape[0] : 0;
        for (int32_t i = 0; i < c && n_got[k] < 64; i++) got[k][n_got[k]++] = ((const int32_t *)s.data)[i];
        const uint64_t user = s.meta->user;
        nm_tabm_release(R.out, &s);
        if (!(user & NM_BRICK_MORE)) why[k] = NM_LLM_STOP_OF(user), ended++;
        if (ended == 2 && why[2] == NM_LLM_STOP_NONE) NM_CHECK(nm_tabm_cancel_request(R.in, 6002) == NM_OK);
    }
    NM_CHECK(ended == 3);
    NM_CHECK(why[2] == NM_LLM_STOP_CANCELLED && why[3] == NM_LLM_STOP_BAD_INPUT && n_got[3] == 0);
    NM_CHECK(strstr(nm_brick_last_error(R.b), "999999") != NULL);
    const int idx[3] = {0, 1, 4};
    for (int j = 0; j < 3; j++) {
        const int k = idx[j];
        nm_ctx *rc = new_ctx(R.m);
        nm_sampler *rs = greedy(R.m);
        int32_t want[64], pos = 0;
        const int32_t nw = plain(rc, rs, reqs[k], np[k], &pos, 8, want);
        NM_CHECK(n_got[k] == nw && why[k] == NM_LLM_STOP_N_PREDICT && !memcmp(got[k], want, sizeof(int32_t) * (size_t)nw));
        nm_ctx_free(rc);
        nm_sampler_free(rs);
    }
    const nm_brick_stats bs = nm_brick_get_stats(R.b);
    printf("  prompt positions decoded: %llu, then %llu for the three at once (4 + 1: the repeats past [0, 8))\n",
           (unsigned long long)before, (unsigned long long)(bs.n_prompt_tokens - before));
    NM_CHECK(bs.n_prompt_tokens - before == 4 + 1);
    NM_CHECK(bs.n_requests == 5 && bs.n_cancelled == 1 && bs.n_bad_requests == 1 && bs.max_pass_seqs >= 2);
    NM_CHECK(rig_down(&R) == NM_ERR_SHUTDOWN);
}

// Two requests failing at once: X's first slot holds a bad token (999999),
// its END waits for its last slot; meanwhile Y fails (888888) and is the
// brick's last error. Each request's own text stays its own
// (nm_brick_request_error): X's names 999999 though Y failed after it.
NM_TEST(tabm_llm_brick_parallel_errors_per_request) {
    rig R;
    RIG_UP_BY(R, rig_up_par(&R, 2, 8, 16));
    static const int32_t bad_x[] = {5, 999999}, bad_y[] = {888888};
    part x1[] = {TOKS(bad_x, 2, NM_LLM_IN_POS(0) | NM_BRICK_MORE)}, x2[] = {TOKS(TEXT_A, 3, 0)};
    part y[] = {TOKS(bad_y, 1, NM_LLM_IN_POS(0))};
    request_writer W = {R.in, x1, 1, 7001, NM_OK};
    request_writer_main(&W);
    NM_CHECK(W.st == NM_OK);
    W = (request_writer){R.in, y, 1, 7002, NM_OK};
    request_writer_main(&W);
    int32_t got[2][64], n_got[2];
    nm_llm_stop why[2];
    NM_CHECK(W.st == NM_OK && read_answers(R.out, 7002, 1, &got[1], &n_got[1], &why[1]) && why[1] == NM_LLM_STOP_BAD_INPUT);
    NM_CHECK(strstr(nm_brick_last_error(R.b), "888888") != NULL); // Y failed last
    W = (request_writer){R.in, x2, 1, 7001, NM_OK};
    request_writer_main(&W);
    NM_CHECK(W.st == NM_OK && read_answers(R.out, 7001, 1, &got[0], &n_got[0], &why[0]) && why[0] == NM_LLM_STOP_BAD_INPUT);
    printf("  request 7001: %s\n", nm_brick_request_error(R.b, 7001)); // (one reader's copy: a call at a time)
    printf("  request 7002: %s\n", nm_brick_request_error(R.b, 7002));
    NM_CHECK(strstr(nm_brick_request_error(R.b, 7001), "999999") != NULL);
    NM_CHECK(strstr(nm_brick_request_error(R.b, 7002), "888888") != NULL);
    NM_CHECK(nm_brick_request_error(R.b, 7003)[0] == '\0' && nm_brick_request_error(NULL, 7001)[0] == '\0');
    NM_CHECK(rig_down(&R) == NM_ERR_SHUTDOWN);
}

// A prompt whose middle part changes: request 2 repeats request 1's text
// around other embedding rows. Its leading text is reused (its whole chunk);
// the text after the rows is not (its cache entries attended to request 1's
// rows), so the answer is the plain loop's for request 2's own prompt.
// Request 3 changes the middle right after a wholly reused chunk: its rows
// [8, 13) are decoded while the cache still lists request 2's tokens past
// them, and its text lands where request 2's did ([13, 19), the same ids):
// none of it is reused either (those rows attended to request 2's rows).
static float g_e1[3 * N_EMBD], g_e2[3 * N_EMBD], g_e3[5 * N_EMBD];
NM_TEST(tabm_llm_brick_changed_middle_not_reused) {
    rig R;
    RIG_UP(R, 8, 1, 4);
    for (int32_t r = 0; r < 3; r++)
        for (int32_t e = 0; e < N_EMBD; e++) g_e1[r * N_EMBD + e] = embd_val(r, e), g_e2[r * N_EMBD + e] = embd_val(r + 7, e + 3);
    for (int32_t r = 0; r < 5; r++)
        for (int32_t e = 0; e < N_EMBD; e++) g_e3[r * N_EMBD + e] = embd_val(r + 13, e + 5);
    part p1[] = {TOKS(TEXT_A, 10, NM_LLM_IN_POS(0) | NM_BRICK_MORE), EMBD(g_e1, 3, NM_BRICK_MORE), TOKS(TEXT_B, 6, 0)};
    part p2[] = {TOKS(TEXT_A, 10, NM_LLM_IN_POS(0) | NM_BRICK_MORE), EMBD(g_e2, 3, NM_BRICK_MORE), TOKS(TEXT_B, 6, 0)};
    part p3[] = {TOKS(TEXT_A, 8, NM_LLM_IN_POS(0) | NM_BRICK_MORE), EMBD(g_e3, 5, NM_BRICK_MORE), TOKS(TEXT_B, 6, 0)};
    int32_t a1[16], a2[16], w2[16], a3[16], w3[16];
    nm_llm_stop why;
    int slots;
    NM_CHECK(put_parts(R.in, p1, 3) == NM_OK && read_gen(R.out, a1, 16, &why, &slots) == 8);
    const uint64_t before = nm_brick_get_stats(R.b).n_prompt_tokens;
    NM_CHECK(put_parts(R.in, p2, 3) == NM_OK && read_gen(R.out, a2, 16, &why, &slots) == 8);
    // the leading tokens' whole chunk [0, 8) reused; their last 2, the 3 rows and the 6 tokens after them decoded
    NM_CHECK(nm_brick_get_stats(R.b).n_prompt_tokens - before == 2 + 3 + 6);
    nm_ctx *rc = new_ctx(R.m);
    nm_sampler *rs = greedy(R.m);
    int32_t pos = 0;
    NM_CHECK(plain(rc, rs, p2, 3, &pos, 8, w2) == 8 && !memcmp(a2, w2, sizeof w2[0] * 8));
    nm_ctx_free(rc);
    nm_sampler_free(rs);
    const uint64_t before3 = nm_brick_get_stats(R.b).n_prompt_tokens;
    NM_CHECK(put_parts(R.in, p3, 3) == NM_OK && read_gen(R.out, a3, 16, &why, &slots) == 8);
    NM_CHECK(nm_brick_get_stats(R.b).n_prompt_tokens - before3 == 5 + 6); // [0, 8) reused; rows and text decoded
    rc = new_ctx(R.m);
    rs = greedy(R.m);
    pos = 0;
    NM_CHECK(plain(rc, rs, p3, 3, &pos, 8, w3) == 8 && !memcmp(a3, w3, sizeof w3[0] * 8));
    nm_ctx_free(rc);
    nm_sampler_free(rs);
    NM_CHECK(rig_down(&R) == NM_ERR_SHUTDOWN);
}

// ---- the TEXT ports -----------------------------------------------------------------------------

// A brick with its output kind `out` (out_batch 3) on rings of its own, run on this thread by nm_brick_step.
typedef struct text_rig {
    nm_brick *b;
    nm_tabm *in, *out;
} text_rig;

static bool text_rig_on(text_rig *T, nm_model *m, nm_llm_out out, int32_t n_predict) {
    memset(T, 0, sizeof *T);
    if (!m) return false;
    nm_brick_params bp = brick_params(m);
    bp.llm.n_predict = n_predict;
    bp.llm.out_batch = 3;
    bp.llm.out = out;
    char err[256];
    return nm_brick_load(NULL, &bp, &T->b, err, sizeof err) == NM_OK &&
           nm_tabm_create(NULL, 4, sizeof(int32_t) * N_CTX, &T->in, err, sizeof err) == NM_OK &&
           nm_tabm_create(NULL, 64, nm_brick_out_slot_bytes(T->b), &T->out, err, sizeof err) == NM_OK;
}

static bool text_rig_up(text_rig *T, nm_llm_out out, int32_t n_predict) {
    return text_rig_on(T, model(), out, n_predict);
}

static void text_rig_down(text_rig *T) {
    nm_brick_free(T->b);
    nm_tabm_free(T->in);
    nm_tabm_free(T->out);
}

// Ends the case unless `up` (the rigs, zeroed before, brought up): a skip
// without the small model, else a failure; the rigs given are freed.
#define TEXT_RIGS_UP(up, ...)                                                 \
    do {                                                                      \
        if (!(up)) {                                                          \
            text_rig *rigs_[] = {__VA_ARGS__};                                \
            for (size_t i_ = 0; i_ < sizeof rigs_ / sizeof rigs_[0]; i_++)     \
                text_rig_down(rigs_[i_]);                                     \
            NM_NEED_SMALL_MODEL(g_model_r);                                   \
            NM_CHECK(!"the rigs did not come up");                            \
            return;                                                           \
        }                                                                     \
    } while (0)

// A TEXT prompt slot (request g_request) at pos (< 0: where the brick stands).
static nm_status put_text(nm_tabm *r, const char *text, int32_t pos) {
    nm_tabm_slot s;
    nm_status st = nm_tabm_acquire_write(r, 7, 0, &s);
    if (st != NM_OK) return st;
    const size_t n = strlen(text);
    memcpy(s.data, text, n);
    *s.meta = (nm_tabm_meta){.kind = NM_TABM_TEXT, .ndim = n ? 1 : 0, .shape = {(int64_t)n}, .size = n,
                             .user = pos >= 0 ? NM_LLM_IN_POS(pos) : 0, .request = g_request};
    return nm_tabm_publish(r, &s);
}

// Reads one request's output slots: token ids into toks (TOKENS) or text into
// text (TEXT), the slots' byte counts into cuts. Returns the slot count, -1
// on a ring error or a slot of another kind.
static int read_any(nm_tabm *r, uint32_t kind, int32_t *toks, int32_t *n_toks, char *text, size_t cap,
                    size_t *cuts, nm_llm_stop *why) {
    int n = 0;
    size_t len = 0;
    *n_toks = 0;
    for (;;) {
        nm_tabm_slot s;
        if (nm_tabm_acquire_read(r, 0, &s) != NM_OK) return -1;
        const uint64_t user = s.meta->user;
        const bool ok = s.meta->kind == kind && s.meta->request == g_request;
        if (ok && kind == NM_TABM_TOKENS)
            for (int64_t i = 0; i < (s.meta->ndim ? s.meta->shape[0] : 0); i++) toks[(*n_toks)++] = ((int32_t *)s.data)[i];
        if (ok && kind == NM_TABM_TEXT && len + s.meta->size < cap) {
            memcpy(text + len, s.data, (size_t)s.meta->size);
            len += (size_t)s.meta->size;
            if (cuts) cuts[n] = len;
        }
        n++;
        nm_tabm_release(r, &s);
        if (!ok) return -1;
        if (!(user & NM_BRICK_MORE)) {
            *why = NM_LLM_STOP_OF(user);
            if (text) text[len] = '\0';
            return n;
        }
    }
}

// A TEXT prompt is the prompt nm_tokenize gives (BOS at position 0, special
// tokens parsed); a TEXT slot later in the context takes no BOS; the output
// as TEXT is the tokens' text, a slot per out_batch tokens.
NM_TEST(tabm_llm_brick_text_prompt_and_text_output) {
    text_rig T = {0}, K = {0};
    TEXT_RIGS_UP(text_rig_up(&T, NM_LLM_OUT_TOKENS, 12) && text_rig_up(&K, NM_LLM_OUT_TEXT, 12), &T, &K);
    nm_model *m = model();
    const char *prompt = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n";
    int32_t want[N_CTX], got[64], ref[64], n_ref = 0, n_got = 0;
    const int32_t n_want = nm_tokenize(m, prompt, strlen(prompt), want, N_CTX, true, true);
    NM_CHECK(n_want > 4);
    part tp[1] = {TOKS(want, n_want, NM_LLM_IN_POS(0))};
    nm_llm_stop why = NM_LLM_STOP_NONE, why2 = NM_LLM_STOP_NONE;
    // tokens in, tokens out: the reference
    NM_CHECK(put_parts(T.in, tp, 1) == NM_OK && nm_brick_step(T.b, T.in, T.out) == NM_OK);
    NM_CHECK(read_any(T.out, NM_TABM_TOKENS, ref, &n_ref, NULL, 0, NULL, &why) > 0 && n_ref > 0);
    // text in, tokens out: the same tokens (decoded from the same prompt)
    NM_CHECK(put_text(T.in, prompt, 0) == NM_OK && nm_brick_step(T.b, T.in, T.out) == NM_OK);
    NM_CHECK(read_any(T.out, NM_TABM_TOKENS, got, &n_got, NULL, 0, NULL, &why2) > 0);
    NM_CHECK(n_got == n_ref && !memcmp(got, ref, sizeof(int32_t) * (size_t)n_ref) && why2 == why);
    // text in, text out: the tokens' text, out_batch (3) tokens a slot
    char text[4096], want_text[4096];
    size_t cuts[64], wl = 0, upto[65] = {0}; // upto[i]: the text's bytes after i tokens
    nm_detok dt = {0};
    for (int32_t i = 0; i < n_ref; i++) {
        const int32_t k = nm_detok_push(m, &dt, ref[i], want_text + wl, (int32_t)(sizeof want_text - wl));
        if (k > 0) wl += (size_t)k;
        upto[i + 1] = wl;
    }
    want_text[wl] = '\0';
    NM_CHECK(put_text(K.in, prompt, 0) == NM_OK && nm_brick_step(K.b, K.in, K.out) == NM_OK);
    int32_t nt;
    const int slots = read_any(K.out, NM_TABM_TEXT, NULL, &nt, text, sizeof text, cuts, &why2);
    NM_CHECK(slots == n_ref / 3 + 1 && why2 == why); // a slot each 3 tokens, then the END with the rest
    for (int i = 0; i + 1 < slots && i < 64; i++) NM_CHECK(cuts[i] == upto[3 * (i + 1)]);
    if (strcmp(text, want_text)) {
        fprintf(stderr, "  text out '%s', the tokens' '%s'\n", text, want_text);
        NM_CHECK(0);
    }
    // a TEXT slot where the brick stands continues the context without a BOS
    const int32_t pos = nm_brick_llm_pos(T.b);
    NM_CHECK(put_text(T.in, " And of Spain?", -1) == NM_OK && nm_brick_step(T.b, T.in, T.out) == NM_OK);
    NM_CHECK(read_any(T.out, NM_TABM_TOKENS, got, &n_got, NULL, 0, NULL, &why2) > 0);
    const int32_t n_more = nm_tokenize(m, " And of Spain?", 14, want, N_CTX, false, true);
    NM_CHECK(nm_brick_llm_pos(T.b) == pos + n_more + n_got - (why2 == NM_LLM_STOP_N_PREDICT ? 1 : 0) ||
             nm_brick_llm_pos(T.b) == pos + n_more + n_got);
    text_rig_down(&T);
    text_rig_down(&K);
}

// BOS goes where a TEXT slot starts at position 0, and only there (Gemma's
// tokenizer adds one; SmolLM2's does not).
NM_TEST(tabm_llm_brick_text_bos_at_zero_only) {
    char path[1024];
    if (!nmtest_model_path("gemma-3-270m-q4_k_m.gguf", path, sizeof path))
        NM_SKIP_MISSING("Gemma 3 270M is not in the model cache");
    nm_model *m = NULL;
    nm_model_params mp = nm_model_default_params();
    mp.n_threads = 2;
    NM_CHECK(nm_model_load(path, &mp, &m, NULL, 0) == NM_OK);
    text_rig T = {0};
    const bool up = text_rig_on(&T, m, NM_LLM_OUT_TOKENS, 1);
    NM_CHECK(up);
    if (!up) {
        text_rig_down(&T);
        nm_model_free(m);
        return;
    }
    int32_t toks[64], n_got = 0;
    nm_llm_stop why;
    const int32_t with_bos = nm_tokenize(m, "Hello there", 11, toks, 64, true, true),
                  without = nm_tokenize(m, " and more", 9, toks, 64, false, true);
    NM_CHECK(with_bos == nm_tokenize(m, "Hello there", 11, toks, 64, false, true) + 1);
    NM_CHECK(put_text(T.in, "Hello there", 0) == NM_OK && nm_brick_step(T.b, T.in, T.out) == NM_OK);
    NM_CHECK(read_any(T.out, NM_TABM_TOKENS, toks, &n_got, NULL, 0, NULL, &why) > 0);
    const int32_t pos = nm_brick_llm_pos(T.b);
    NM_CHECK(pos == with_bos + n_got);
    NM_CHECK(put_text(T.in, " and more", -1) == NM_OK && nm_brick_step(T.b, T.in, T.out) == NM_OK);
    NM_CHECK(read_any(T.out, NM_TABM_TOKENS, toks, &n_got, NULL, 0, NULL, &why) > 0);
    NM_CHECK(nm_brick_llm_pos(T.b) == pos + without + n_got);
    text_rig_down(&T);
    nm_model_free(m);
}

// Text that gives no tokens, or more than the context holds, fails its
// request (flagged, the cause named); the brick goes on.
NM_TEST(tabm_llm_brick_text_prompt_refused) {
    text_rig T = {0};
    TEXT_RIGS_UP(text_rig_up(&T, NM_LLM_OUT_TOKENS, 4), &T);
    char big[N_CTX * 3 + 1];
    for (size_t i = 0; i + 1 < sizeof big; i += 3) memcpy(big + i, " zq", 3);
    big[sizeof big - 1] = '\0';
    const char *bad[] = {"", big};
    const char *msg[] = {"the text gives no tokens", "do not fit the context"};
    for (int k = 0; k < 2; k++) {
        int32_t toks[16], n;
        nm_llm_stop why = NM_LLM_STOP_NONE;
        NM_CHECK(put_text(T.in, bad[k], 0) == NM_OK && nm_brick_step(T.b, T.in, T.out) == NM_OK);
        NM_CHECK(read_any(T.out, NM_TABM_TOKENS, toks, &n, NULL, 0, NULL, &why) == 1 && n == 0 &&
                 why == NM_LLM_STOP_BAD_INPUT);
        if (!strstr(nm_brick_last_error(T.b), msg[k])) {
            fprintf(stderr, "  case %d: error '%s' lacks '%s'\n", k, nm_brick_last_error(T.b), msg[k]);
            NM_CHECK(0);
        }
    }
    // and the next request is served
    int32_t toks[16], n;
    nm_llm_stop why = NM_LLM_STOP_NONE;
    NM_CHECK(put_text(T.in, "Hello", 0) == NM_OK && nm_brick_step(T.b, T.in, T.out) == NM_OK);
    NM_CHECK(read_any(T.out, NM_TABM_TOKENS, toks, &n, NULL, 0, NULL, &why) > 0 && n > 0);
    text_rig_down(&T);
}

// Sentences for a voice (SmolLM2 itself, whose answers have sentences): the
// slots join into the text of the TEXT output, and every cut but the last is
// one of the rules': after a line's end, or before a blank that follows . ! or ?.
NM_TEST(tabm_llm_brick_sentence_output_cuts) {
    char path[1024];
    if (!nmtest_model_path("SmolLM2-135M-Instruct.Q4_1.gguf", path, sizeof path))
        NM_SKIP_MISSING("SmolLM2 is not in the model cache");
    nm_model *m = NULL;
    nm_model_params mp = nm_model_default_params();
    mp.n_threads = 2;
    NM_CHECK(nm_model_load(path, &mp, &m, NULL, 0) == NM_OK);
    text_rig T = {0}, K = {0};
    nm_brick_params one = brick_params(m); // T's text a token a slot: the pieces the cuts fall between
    one.llm.n_predict = 48;
    one.llm.out = NM_LLM_OUT_TEXT;
    const bool up = text_rig_on(&T, m, NM_LLM_OUT_TEXT, 48) && text_rig_on(&K, m, NM_LLM_OUT_SENTENCES, 48) &&
                    nm_brick_set_params(T.b, &one, NULL, 0) == NM_OK;
    NM_CHECK(up);
    static const char *q[] = {"Describe the sea in three short sentences.", "Give me two tips for sleeping well.",
                              "List three fruits, one per line."};
    int n_cut = 0;
    for (int k = 0; up && k < 3; k++) {
        char prompt[256], a[4096], b[4096];
        size_t cuts[128];
        int32_t nt;
        nm_llm_stop w1 = NM_LLM_STOP_NONE, w2 = NM_LLM_STOP_NONE;
        snprintf(prompt, sizeof prompt, "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n", q[k]);
        size_t piece[128];
        NM_CHECK(put_text(T.in, prompt, 0) == NM_OK && nm_brick_step(T.b, T.in, T.out) == NM_OK);
        const int np = read_any(T.out, NM_TABM_TEXT, NULL, &nt, a, sizeof a, piece, &w1);
        NM_CHECK(np > 0);
        NM_CHECK(put_text(K.in, prompt, 0) == NM_OK && nm_brick_step(K.b, K.in, K.out) == NM_OK);
        const int slots = read_any(K.out, NM_TABM_TEXT, NULL, &nt, b, sizeof b, cuts, &w2);
        NM_CHECK(slots > 0 && !strcmp(a, b) && w1 == w2);
        // the cuts the rules make between the pieces: after a line's end; before a piece that starts
        // with a blank after . ! ?
        size_t want[128];
        int nw = 0;
        for (int i = 0; i + 1 < np; i++) {
            const size_t c = piece[i];
            if (c == 0 || (i > 0 && c == piece[i - 1])) continue; // (a piece without text)
            if (a[c - 1] == '\n' || (strchr(".!?", a[c - 1]) && (a[c] == ' ' || a[c] == '\n'))) want[nw++] = c;
        }
        NM_CHECK(slots == nw + 1);
        for (int i = 0; i < nw && i + 1 < slots; i++)
            if (cuts[i] != want[i]) {
                fprintf(stderr, "  prompt %d: cut %d at %zu, the rules' at %zu: '%s'\n", k, i, cuts[i], want[i], b);
                NM_CHECK(0);
                break;
            }
        n_cut += nw;
    }
    NM_CHECK(n_cut >= 3); // (the model's text has sentence ends to cut at)
    text_rig_down(&T);
    text_rig_down(&K);
    nm_model_free(m);
}

// The thinking kept out of the content (src/bricks/llm/think.c), fed whole, a byte at a time and in pieces of
// 2..9 bytes: the same reasoning and content each way, as llama-server's deepseek format splits them.
typedef struct think_got {
    char r[512], c[512];
    size_t nr, nc;
    int runs;
} think_got;

static void think_out(void *user, bool reasoning, const char *p, size_t n) {
    think_got *g = user;
    char *b = reasoning ? g->r : g->c;
    size_t *k = reasoning ? &g->nr : &g->nc;
    if (*k + n < sizeof g->r) memcpy(b + *k, p, n), *k += n, b[*k] = '\0';
    g->runs++;
}

NM_TEST(think_split_as_whole) {
    static const struct { const char *in, *reasoning, *content; } cs[] = {
        {"<think>\nSmall sum.\n</think>\n\n4", "Small sum.", "4"},
        {"  \n<think>a b</think>c", "a b", "c"},
        {"<think>\n\n</think>\n\nHello there", "", "Hello there"},
        {"Hello <think>not here</think>", "", "Hello <think>not here</think>"},
        {"  Hello", "", "  Hello"},
        {"<thin", "", "<thin"},
        {"<think>still thinking \n", "still thinking", ""},
        {"<think>x </thin y</think> z ", "x </thin y", "z "},
        {"<think>a</think></think>b", "a", "</think>b"},
        {"<thinkers>", "", "<thinkers>"},
        {"", "", ""},
        {"<think>1 < 2 <\n/think> ok</think>\nyes\n", "1 < 2 <\n/think> ok", "yes\n"},
        {"<think>a </thi", "a </thi", ""},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        for (int how = 0; how < 3; how++) {
            think_got g = {0};
            g.r[0] = g.c[0] = '\0';
            nm_think t;
            nm_think_init(&t);
            const size_t n = strlen(cs[i].in);
            for (size_t at = 0, step = 0; at < n || (at == 0 && n == 0); at += step) {
                step = how == 0 ? n : how == 1 ? 1 : 2 + (at * 7 + i) % 8;
                if (at + step > n) step = n - at;
                nm_think_feed(&t, cs[i].in + at, step, at + step == n, think_out, &g);
                if (n == 0) break;
            }
            const bool ok = !strcmp(g.r, cs[i].reasoning) && !strcmp(g.c, cs[i].content);
            if (!ok) fprintf(stderr, "  case %zu way %d: '%s' -> reasoning '%s', content '%s'\n", i, how, cs[i].in, g.r, g.c);
            NM_CHECK(ok);
            if (how == 0) NM_CHECK(g.runs <= 2); // (whole: a run each)
        }
    // nothing held longer than it must be: content goes out as it comes, reasoning up to what may trail it
    think_got g = {0};
    nm_think t;
    nm_think_init(&t);
    nm_think_feed(&t, "Hello wor", 9, false, think_out, &g);
    NM_CHECK(!strcmp(g.c, "Hello wor") && g.nr == 0);
    g = (think_got){0};
    nm_think_init(&t);
    nm_think_feed(&t, "<think>one two </th", 19, false, think_out, &g);
    NM_CHECK(!strcmp(g.r, "one two") && g.nc == 0);
}


// Text output needs slots that hold a token's text (256 bytes); a voice's sentences, what the thinking's
// split hands on at once (512: what it held back and a token's text). Smaller ones are refused by name.
NM_TEST(tabm_llm_brick_text_slots_big_enough) {
    nm_model *m = model();
    if (!m) NM_NEED_SMALL_MODEL(g_model_r);
    static const struct { nm_llm_out out; size_t bytes; const char *why; } cs[] = {
        {NM_LLM_OUT_TEXT, 200, "cannot hold a token's text (256)"},
        {NM_LLM_OUT_SENTENCES, 300, "cannot hold a sentence's run (512)"},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        nm_brick_params bp = brick_params(m);
        bp.llm.out = cs[i].out;
        nm_brick *b = NULL;
        nm_tabm *in = NULL, *out = NULL;
        char err[256];
        NM_CHECK(nm_brick_load(NULL, &bp, &b, err, sizeof err) == NM_OK);
        NM_CHECK(nm_tabm_create(NULL, 2, 64, &in, NULL, 0) == NM_OK &&
                 nm_tabm_create(NULL, 2, cs[i].bytes, &out, NULL, 0) == NM_OK);
        NM_CHECK(nm_tabm_max_payload(out) < (i ? 512u : 256u));
        NM_CHECK(b && nm_brick_step(b, in, out) == NM_ERR_INVALID_ARG && strstr(nm_brick_last_error(b), cs[i].why));
        nm_brick_free(b);
        nm_tabm_free(in);
        nm_tabm_free(out);
    }
}

// A voice's sentences leave out the answer's reasoning: a model whose greedy answer to a chat prompt (ending
// in "\n") is a <think> block and two sentences (nm-genmodel --script; <think> and </think> user-defined tokens,
// as Qwen3's vocabulary has them) gives its whole text as TEXT and, as SENTENCES, the two sentences alone, a
// slot each; one that only thinks (the block never closed) gives an END slot with no text; one that says
// "<thin" (it might have begun <think> until the answer ended) says it.
NM_TEST(tabm_llm_brick_sentences_leave_thinking_out) {
    char tok[1024], path[3][256];
    if (!nmtest_model_path("SmolLM2-135M-Instruct.Q4_1.gguf", tok, sizeof tok))
        NM_SKIP_MISSING("SmolLM2-135M-Instruct.Q4_1.gguf not in the model cache");
    // (a one-layer model says a script whose every token has one follower: no token twice with two)
    static const char *script[3] = {"<think>Plan it</think> Paris is the capital. It looks old!",
                                     "<think>Still thinking about it", "<thin"};
    for (int k = 0; k < 3; k++) {
        snprintf(path[k], sizeof path[k], "/tmp/nm-test-think-%d-%d.gguf", (int)getpid(), k);
        gen_opts o = nm_genmodel_defaults();
        o.arch = "qwen3", o.tok_from = tok, o.out = path[k], o.layers = 1, o.embd = 256, o.heads = 4, o.kv_heads = 2;
        o.ff = 256, o.seed = 9, o.user_tokens = "<think>,</think>", o.script = script[k];
        NM_CHECK(nm_genmodel_write(&o) == 0);
    }
    for (int k = 0; k < 3; k++) {
        nm_model *m = NULL;
        NM_CHECK(nm_model_load(path[k], NULL, &m, NULL, 0) == NM_OK);
        text_rig T = {0}, K = {0};
        const bool up = text_rig_on(&T, m, NM_LLM_OUT_TEXT, 64) && text_rig_on(&K, m, NM_LLM_OUT_SENTENCES, 64);
        NM_CHECK(up);
        char a[4096] = "", b[4096] = "";
        size_t cuts[64];
        int32_t nt;
        nm_llm_stop w1 = NM_LLM_STOP_NONE, w2 = NM_LLM_STOP_NONE;
        int slots = 0;
        if (up) {
            NM_CHECK(put_text(T.in, "<|im_start|>user\nWhich city?<|im_end|>\n<|im_start|>assistant\n", 0) == NM_OK && nm_brick_step(T.b, T.in, T.out) == NM_OK);
            NM_CHECK(read_any(T.out, NM_TABM_TEXT, NULL, &nt, a, sizeof a, NULL, &w1) > 0);
            NM_CHECK(put_text(K.in, "<|im_start|>user\nWhich city?<|im_end|>\n<|im_start|>assistant\n", 0) == NM_OK && nm_brick_step(K.b, K.in, K.out) == NM_OK);
            slots = read_any(K.out, NM_TABM_TEXT, NULL, &nt, b, sizeof b, cuts, &w2);
        }
        if (k == 0) {
            NM_CHECK(!strcmp(a, script[0]) && w1 == NM_LLM_STOP_EOG); // (the script as taught, then its end)
            NM_CHECK(!strcmp(b, "Paris is the capital. It looks old!") && w2 == NM_LLM_STOP_EOG);
            NM_CHECK(slots == 2 && cuts[0] == strlen("Paris is the capital."));
        } else { // (what might have begun <think> goes out at the end)
            NM_CHECK(!strcmp(a, script[k]) && w1 == NM_LLM_STOP_EOG);
            NM_CHECK(slots == 1 && !strcmp(b, k == 1 ? "" : "<thin") && w2 == NM_LLM_STOP_EOG);
        }
        if (strcmp(b, k == 0 ? "Paris is the capital. It looks old!" : k == 1 ? "" : "<thin"))
            fprintf(stderr, "  script %d: TEXT '%s', SENTENCES '%s' in %d slots\n", k, a, b, slots);
        text_rig_down(&T);
        text_rig_down(&K);
        nm_model_free(m);
        unlink(path[k]);
    }
}

NM_TEST_MAIN()
