// Fuzz target for the Piper voice loader (src/bricks/tts/piper/vits.c):
// arbitrary bytes through nm_vits_load_memory (copied first to 64-byte
// aligned memory, as a file's mapping is). Accepted voices are used as the
// engine would: the info read back (in range), the map's phonemes looked up,
// and, for a voice small enough to run per input, a few ids synthesized at the
// shortest length scale (finite samples, a whole number of frames).
// Seeds: tests/fuzz/corpus/piper (tools/gen_piper_voice.py's tiny voices).
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bricks/tts/piper/vits.h"

static volatile uint64_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    void *buf = aligned_alloc(64, (size + 63) & ~(size_t)63);
    if (!buf) return 0;
    if (size) memcpy(buf, data, size);
    nm_vits *v = NULL;
    char err[256];
    nm_status st = nm_vits_load_memory(buf, size, &v, err, sizeof err);
    if (st != NM_OK) {
        if (v || err[0] == '\0') abort(); // failures leave *out NULL and say why
        free(buf);
        return 0;
    }
    const nm_vits_info *in = nm_vits_get_info(v);
    if (in->sample_rate < 8000 || in->hop < 1 || in->n_symbols < 3 || in->reach < 1) abort();
    int32_t ids[8];
    uint64_t h = 0;
    static const char *ph[] = {"_", "^", "$", " ", "a", "\xc9\x99"};
    for (int i = 0; i < 6; i++) {
        const int32_t k = nm_vits_phoneme_ids(v, ph[i], strlen(ph[i]), ids, 8);
        for (int32_t j = 0; j < k && j < 8; j++)
            if (ids[j] < 0 || ids[j] >= in->n_symbols) abort();
        h += (uint64_t)k;
    }
    if (size < (1u << 18) && in->hop <= 16) { // (a tiny voice: a few ids, the shortest length)
        const int32_t few[] = {1, 0, 2 % in->n_symbols, 0, 2};
        const nm_vits_scales s = {0, 0.05f, 0, 1};
        float *pcm = NULL;
        int64_t n = 0;
        st = nm_vits_synth(v, NULL, few, 5, &s, &pcm, &n, err, sizeof err);
        if (st == NM_OK && (!pcm || n <= 0 || n % in->hop)) abort();
        if (st != NM_OK && (pcm || err[0] == '\0')) abort();
        for (int64_t i = 0; pcm && i < n; i++)
            if (!isfinite(pcm[i])) abort();
        free(pcm);
    }
    sink += h;
    nm_vits_free(v);
    free(buf);
    return 0;
}
