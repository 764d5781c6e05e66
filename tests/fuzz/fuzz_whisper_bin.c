// Fuzz target for the Whisper model loader, aimed at whisper.cpp's ggml .bin
// parser (header, mel filters, vocabulary, tensor directory, binding by name);
// GGUF inputs go through the same entry point. Accepted models are walked as
// the forward pass would: every token, the filters, each tensor's first and
// last byte. Seeds: tests/fuzz/corpus/whisper_bin (written by
// `NM_GEN_CORPUS=DIR test_whisper_model --filter gen_corpus`).
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bricks/stt/whisper_model.h"
#include "quant/quant.h"

static volatile uint64_t sink;

static uint64_t touch(const nm_tensor *t) {
    if (!nm_tensor_is_set(t)) return 0;
    const size_t n = nm_row_size(t->type, t->ne[0]) * (size_t)(t->ne[1] * t->ne[2] * t->ne[3]);
    if (n == 0) abort(); // a bound tensor always has a size
    const uint8_t *p = nm_tensor_host(t);
    return p[0] + p[n - 1];
}

static uint64_t touch_attn(const nm_whisper_attn *a) {
    return touch(&a->ln_w) + touch(&a->ln_b) + touch(&a->q_w) + touch(&a->q_b) + touch(&a->k_w) + touch(&a->k_b) +
           touch(&a->v_w) + touch(&a->v_b) + touch(&a->o_w) + touch(&a->o_b);
}

static uint64_t touch_mlp(const nm_whisper_mlp *m) {
    return touch(&m->ln_w) + touch(&m->ln_b) + touch(&m->fc1_w) + touch(&m->fc1_b) + touch(&m->fc2_w) +
           touch(&m->fc2_b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    nm_whisper_model *m = NULL;
    char err[256];
    nm_status st = nm_whisper_model_load_memory(data, size, &m, err, sizeof err);
    if (st != NM_OK) {
        if (m || err[0] == '\0') abort(); // failures leave *out NULL and say why
        return 0;
    }
    uint64_t h = 0;
    for (int32_t i = 0; i < m->hp.n_vocab; i++) {
        uint32_t len;
        const char *t = nm_whisper_token(m, i, &len);
        if (!t) abort();
        if (len) h += (uint8_t)t[len - 1];
    }
    for (int32_t i = 0; i < m->special.n_langs; i++) h += (uint8_t)m->lang_codes[i][0];
    for (int32_t i = 0; i < m->hp.n_mels * m->hp.n_fft_bins; i++) h += m->mel_filters[i] > 0;
    for (int32_t i = 0; i < m->n_suppress; i++) if (m->suppress[i] < 0 || m->suppress[i] >= m->hp.n_vocab) abort();
    h += touch(&m->e_pe) + touch(&m->conv1_w) + touch(&m->conv1_b) + touch(&m->conv2_w) + touch(&m->conv2_b) +
         touch(&m->e_ln_w) + touch(&m->e_ln_b) + touch(&m->d_pe) + touch(&m->d_te) + touch(&m->d_ln_w) +
         touch(&m->d_ln_b);
    for (int i = 0; i < m->hp.n_audio_layer; i++) h += touch_attn(&m->enc[i].attn) + touch_mlp(&m->enc[i].mlp);
    for (int i = 0; i < m->hp.n_text_layer; i++)
        h += touch_attn(&m->dec[i].attn) + touch_attn(&m->dec[i].cross) + touch_mlp(&m->dec[i].mlp);
    sink = h;
    nm_whisper_model_free(m);
    return 0;
}
