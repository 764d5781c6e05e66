// Fuzz target for a request's PARAMS slot (src/bricks/request.c): arbitrary
// bytes as the payload of an NM_TABM_PARAMS slot, parsed as the bricks parse
// it, then every field the LLM and STT bricks read, read as they read it.
// Checks the contracts that do not depend on the bytes: a failure says why;
// each reader returns -1, 0 or 1; a 1 gives a value in the asked range (a
// whole number for the integer fields, a non-empty string of bounded length,
// at most the asked number of strings); a -1 names the field.
// Seeds: tests/fuzz/corpus/params.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bricks/brick_impl.h"

static void number(const cJSON *o, const char *key, double lo, double hi) {
    char err[200] = "";
    double v = NAN;
    int k = nm_req_number(o, key, lo, hi, &v, err, sizeof err);
    if (k == 1 && !(v >= lo && v <= hi)) abort();
    if (k == -1 && !strstr(err, key)) abort();
    if (k < -1 || k > 1) abort();
}

static void integer(const cJSON *o, const char *key, double lo, double hi) {
    char err[200] = "";
    int64_t v = 0;
    int k = nm_req_int(o, key, lo, hi, &v, err, sizeof err);
    if (k == 1 && ((double)v < lo || (double)v > hi)) abort();
    if (k == -1 && !strstr(err, key)) abort();
    if (k < -1 || k > 1) abort();
}

static void boolean(const cJSON *o, const char *key) {
    char err[200] = "";
    bool v = false;
    int k = nm_req_bool(o, key, &v, err, sizeof err);
    if ((k == -1 && !strstr(err, key)) || k < -1 || k > 1) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    // the slot: capacity a little over the payload, as a ring's would be
    uint8_t *buf = malloc(size + 64);
    if (!buf) return 0;
    if (size) memcpy(buf, data, size);
    nm_tabm_meta meta = {.kind = NM_TABM_PARAMS, .size = size, .ndim = 1, .shape = {(int64_t)size}, .seq = 3};
    nm_tabm_slot s = {.data = buf, .capacity = size + 64, .meta = &meta};
    char err[256] = "";
    cJSON *o = nm_req_parse(&s, "fuzz", err, sizeof err);
    if (!o) {
        if (!err[0]) abort(); // a failure says why
        free(buf);
        return 0;
    }
    // the LLM brick's fields (a context of 4096)
    number(o, "temperature", -100, 100);
    integer(o, "top_k", INT32_MIN, INT32_MAX);
    number(o, "top_p", 0, 1);
    number(o, "min_p", 0, 1);
    number(o, "repeat_penalty", 0, 100);
    integer(o, "repeat_last_n", -1, 4096);
    number(o, "presence_penalty", -100, 100);
    number(o, "frequency_penalty", -100, 100);
    integer(o, "max_tokens", -2, INT32_MAX);
    integer(o, "n_predict", -2, INT32_MAX);
    integer(o, "seed", -1, 9007199254740992.0);
    boolean(o, "ignore_eos");
    const char *stop[NM_LLM_MAX_STOP];
    int32_t n_stop = -1;
    int k = nm_req_strings(o, "stop", NM_LLM_MAX_STOP, NM_LLM_MAX_STOP_LEN, stop, &n_stop, err, sizeof err);
    if (k == 1) {
        if (n_stop < 0 || n_stop > NM_LLM_MAX_STOP) abort();
        for (int32_t i = 0; i < n_stop; i++)
            if (!stop[i] || !stop[i][0] || strlen(stop[i]) > NM_LLM_MAX_STOP_LEN) abort();
    } else if ((k == -1 && !strstr(err, "stop")) || k < -1 || k > 1) {
        abort();
    }
    // the STT brick's
    const char *lang = NULL;
    k = nm_req_string(o, "language", 15, &lang, err, sizeof err);
    if ((k == 1 && (!lang || !lang[0] || strlen(lang) > 15)) || (k == -1 && !strstr(err, "language"))) abort();
    boolean(o, "translate");
    boolean(o, "no_timestamps");
    number(o, "temperature_inc", 0, 2);
    integer(o, "beam_size", 1, NM_STT_MAX_DECODERS);
    integer(o, "best_of", 1, NM_STT_MAX_DECODERS);
    nm_req_free(o);
    free(buf);
    return 0;
}
