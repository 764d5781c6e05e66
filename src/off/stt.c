// Speech to text left out (-DNM_WITH_STT=OFF; off.h): no STT brick loads, and
// since none exists the calls on one answer as for a brick of another kind.
#include <stdio.h>
#include <string.h>

#include "bricks/brick_impl.h"
#include "off/off.h"

#define WHAT "speech to text (Whisper)"
#define OPTION "NM_WITH_STT"

static nm_status stt_load(const nm_brick_params *p, void **state, char *err, size_t err_size) {
    *state = NULL;
    return nm_off_fail(err, err_size, WHAT, OPTION);
}
static nm_status stt_run(void *state, nm_brick *self, nm_tabm *in, nm_tabm *out) { return NM_ERR_UNSUPPORTED; }
static void stt_release(void *state) {}

const nm_brick_i nm_brick_stt_i = {
    .version = NM_BRICK_I_VERSION,
    .kind = NM_BRICK_STT,
    .name = "stt",
    .in_ports = NM_PORT_BIT(NM_PORT_PCM),
    .out_ports = NM_PORT_BIT(NM_PORT_TEXT),
    .units = NM_UNIT_BIT(NM_UNIT_CPU),
    .load = stt_load,
    .run = stt_run,
    .release = stt_release,
};

nm_stt_params nm_stt_default_params(nm_stt_strategy strategy) {
    nm_stt_params p;
    memset(&p, 0, sizeof p);
    p.strategy = strategy;
    return p;
}

const nm_transcript *nm_brick_stt_transcript(const nm_brick *b) { return NULL; }
bool nm_brick_stt_info(const nm_brick *b, nm_stt_model_info *out) {
    if (out) memset(out, 0, sizeof *out);
    return false;
}
int32_t nm_brick_stt_lang_id(const nm_brick *b, const char *code) { return -1; }
int32_t nm_brick_stt_tokenize(const nm_brick *b, const char *text, int32_t *out, int32_t cap) { return -1; }
const char *nm_brick_stt_token_text(const nm_brick *b, int32_t id, char buf[24], uint32_t *len) { return NULL; }
nm_stt_timings nm_brick_stt_timings(const nm_brick *b) { return (nm_stt_timings){0}; }

// No transcript can exist in this build: nothing is written (false).
bool nm_transcript_write_text(const nm_transcript *t, bool timestamps, FILE *f) { return false; }
bool nm_transcript_write_srt(const nm_transcript *t, FILE *f) { return false; }
bool nm_transcript_write_vtt(const nm_transcript *t, FILE *f) { return false; }
bool nm_transcript_write_json(const nm_transcript *t, const char *model_name, FILE *f) { return false; }

// Plain formatting, the same as src/bricks/stt/transcribe.c's.
void nm_stt_timestamp(int64_t t, bool comma, char *buf) {
    int64_t ms = t * 10;
    if (ms < 0) ms = 0;
    int64_t hr = ms / 3600000;
    ms -= hr * 3600000;
    int64_t mn = ms / 60000;
    ms -= mn * 60000;
    int64_t s = ms / 1000;
    ms -= s * 1000;
    snprintf(buf, 32, "%02d:%02d:%02d%c%03d", (int)hr, (int)mn, (int)s, comma ? ',' : '.', (int)ms);
}
