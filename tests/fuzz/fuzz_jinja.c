// Fuzz target for the Jinja subset interpreter (src/bricks/tokenizer/jinja.c):
// arbitrary bytes as a chat template, rendered with a fixed conversation under
// small limits. Checks the contracts that do not depend on the bytes: the
// status is one the header lists; NM_OK gives a NUL-terminated output of the
// stated length within the output limit; an error gives no output and a
// message. A hang or a crash is the fuzzer's to find (the limits must stop
// every loop). Seeds: tests/fuzz/corpus/jinja.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bricks/tokenizer/jinja.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char conv[] =
        "{\"messages\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"hi \\u00e9\"},"
        " {\"role\": \"assistant\", \"content\": [{\"type\": \"text\", \"text\": \"yo\"}]}],"
        " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"tools\": null}";
    cJSON *ctx = cJSON_Parse(conv);
    if (!ctx) abort();
    nm_jinja_limits lim = nm_jinja_default_limits();
    lim.max_steps = 200000;
    lim.max_mem = 8u << 20;
    lim.max_out = 1u << 20;
    char *out = NULL, err[256];
    size_t n = 12345;
    nm_status st = nm_jinja_render((const char *)data, size, ctx, &lim, &out, &n, err, sizeof err);
    if (st == NM_OK) {
        if (!out || n > lim.max_out || out[n] != 0) abort();
    } else {
        if (out || n != 0 || !err[0]) abort();
        if (st != NM_ERR_UNSUPPORTED && st != NM_ERR_TEMPLATE && st != NM_ERR_RANGE && st != NM_ERR_NOMEM) abort();
    }
    free(out);
    cJSON_Delete(ctx);
    return 0;
}
