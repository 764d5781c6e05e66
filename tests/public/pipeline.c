// A program outside the library: built with include/nanomind.h alone and
// `pkg-config nanomind` (tests/public/test_public_api.sh compiles and runs it
// against an installed copy). It builds a pipeline of two bricks on their own
// threads: a prompt -> the LLM brick -> tokens, turned into text by this
// program -> the TTS brick -> speech; it prints what came out and the copy
// ledger, and fails if anything is missing.
//
//   pipeline LLM.gguf "PROMPT" N_PREDICT
#include <nanomind.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct lane {
    nm_brick *b;
    nm_tabm *in, *out;
} lane;

static void *lane_main(void *arg) {
    lane *l = arg;
    nm_brick_run(l->b, l->in, l->out);
    return NULL;
}

static int die(const char *what, nm_status st, const char *msg) {
    fprintf(stderr, "pipeline: %s: %s: %s\n", what, nm_status_str(st), msg);
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: pipeline LLM.gguf PROMPT N_PREDICT\n");
        return 2;
    }
    char err[512];
    nm_ledger *led = nm_ledger_create();
    nm_brick_params lp = nm_brick_default_params(NM_BRICK_LLM);
    lp.model = argv[1];
    lp.n_ctx = 256;
    lp.sampling.temp = 0;
    lp.llm.n_predict = atoi(argv[3]);
    lp.llm.ignore_eos = true;
    lp.ledger = led;
    nm_brick_params tp = nm_brick_default_params(NM_BRICK_TTS);
    tp.ledger = led;
    nm_brick *llm = NULL, *tts = NULL;
    nm_status st;
    if ((st = nm_brick_load(NULL, &lp, &llm, err, sizeof err)) != NM_OK) return die("LLM brick", st, err);
    if ((st = nm_brick_load(NULL, &tp, &tts, err, sizeof err)) != NM_OK) return die("TTS brick", st, err);
    // rings: prompt -> LLM -> tokens (read here) -> text -> TTS -> speech
    nm_tabm *prompt = NULL, *tokens = NULL, *text = NULL, *speech = NULL;
    if ((st = nm_tabm_create(NULL, 2, nm_brick_in_slot_bytes(llm), &prompt, err, sizeof err)) != NM_OK ||
        (st = nm_tabm_create(NULL, 8, nm_brick_out_slot_bytes(llm), &tokens, err, sizeof err)) != NM_OK ||
        (st = nm_tabm_create(NULL, 4, nm_brick_in_slot_bytes(tts), &text, err, sizeof err)) != NM_OK ||
        (st = nm_tabm_create(NULL, 64, nm_brick_out_slot_bytes(tts), &speech, err, sizeof err)) != NM_OK)
        return die("rings", st, err);
    lane l1 = {llm, prompt, tokens}, l2 = {tts, text, speech};
    pthread_t t1, t2;
    pthread_create(&t1, NULL, lane_main, &l1);
    pthread_create(&t2, NULL, lane_main, &l2);

    // the prompt, tokenized straight into its slot
    const nm_model *m = nm_brick_llm_model(llm);
    nm_tabm_slot s;
    if ((st = nm_tabm_acquire_write(prompt, 0, -1, &s)) != NM_OK) return die("prompt slot", st, "");
    int32_t n = nm_tokenize(m, argv[2], strlen(argv[2]), s.data, (int32_t)(s.capacity / 4), true, true);
    if (n <= 0) return die("tokenize", NM_ERR_RANGE, argv[2]);
    *s.meta = (nm_tabm_meta){.kind = NM_TABM_TOKENS, .ndim = 1, .shape = {n}, .size = 4 * (uint64_t)n,
                             .user = NM_LLM_IN_POS(0), .request = 1};
    nm_tabm_publish(prompt, &s);

    // tokens -> text: the whole answer as one TEXT slot for the TTS brick
    char answer[4096];
    size_t len = 0;
    nm_detok dt = {0};
    int32_t n_tok = 0;
    for (bool end = false; !end;) {
        if ((st = nm_tabm_acquire_read(tokens, -1, &s)) != NM_OK) return die("tokens", st, nm_brick_last_error(llm));
        const int32_t *t = s.data;
        for (int32_t i = 0; s.meta->ndim == 1 && i < (int32_t)s.meta->shape[0]; i++, n_tok++) {
            int32_t k = nm_detok_push(m, &dt, t[i], answer + len, (int32_t)(sizeof answer - 1 - len));
            if (k > 0) len += (size_t)k;
        }
        end = !(s.meta->user & NM_BRICK_MORE);
        nm_tabm_release(tokens, &s);
    }
    answer[len] = '\0';
    if ((st = nm_tabm_acquire_write(text, 0, -1, &s)) != NM_OK) return die("text slot", st, "");
    memcpy(s.data, answer, len); // this program's text, written once into its slot
    *s.meta = (nm_tabm_meta){.kind = NM_TABM_TEXT, .ndim = len ? 1 : 0, .shape = {(int64_t)len}, .size = len,
                             .request = 1};
    nm_tabm_publish(text, &s);

    int64_t samples = 0;
    for (bool end = false; !end;) {
        if ((st = nm_tabm_acquire_read(speech, -1, &s)) != NM_OK) return die("speech", st, nm_brick_last_error(tts));
        samples += (int64_t)(s.meta->size / 2);
        end = !(s.meta->user & NM_BRICK_MORE);
        nm_tabm_release(speech, &s);
    }
    nm_tabm_shutdown(prompt); // the lanes end, each shutting its other ring
    nm_tabm_shutdown(text);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);

    char ledger[1024];
    nm_ledger_format(led, ledger, sizeof ledger);
    printf("answer: %d tokens, %zu bytes: %s\n", n_tok, len, answer);
    printf("speech: %lld samples at %d Hz\n", (long long)samples, nm_brick_tts_sample_rate(tts));
    printf("%s", ledger);
    int rc = n_tok == lp.llm.n_predict && len > 0 && samples > 0 ? 0 : 1;
    nm_brick_free(llm);
    nm_brick_free(tts);
    nm_tabm_free(prompt);
    nm_tabm_free(tokens);
    nm_tabm_free(text);
    nm_tabm_free(speech);
    nm_ledger_free(led);
    return rc;
}
