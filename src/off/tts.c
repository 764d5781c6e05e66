// Text to speech left out (-DNM_WITH_TTS=OFF, so no espeak-ng; off.h): no TTS
// brick loads, and the calls on one answer as for a brick of another kind.
#include "bricks/brick_impl.h"
#include "off/off.h"

#define WHAT "text to speech (espeak-ng)"
#define OPTION "NM_WITH_TTS"

static nm_status tts_load(const nm_brick_params *p, void **state, char *err, size_t err_size) {
    *state = NULL;
    return nm_off_fail(err, err_size, WHAT, OPTION);
}
static nm_status tts_run(void *state, nm_brick *self, nm_tabm *in, nm_tabm *out) { return NM_ERR_UNSUPPORTED; }
static void tts_release(void *state) {}

const nm_brick_i nm_brick_tts_i = {
    .version = NM_BRICK_I_VERSION,
    .kind = NM_BRICK_TTS,
    .name = "tts",
    .in_ports = NM_PORT_BIT(NM_PORT_TEXT),
    .out_ports = NM_PORT_BIT(NM_PORT_PCM),
    .units = NM_UNIT_BIT(NM_UNIT_CPU),
    .load = tts_load,
    .run = tts_run,
    .release = tts_release,
};

// The same defaults as src/bricks/tts/tts.c: nm_brick_default_params fills them in every build.
nm_tts_params nm_tts_default_params(void) {
    return (nm_tts_params){.voice = "en-us", .rate_wpm = 175, .pitch = 50, .volume = 100};
}

int32_t nm_brick_tts_sample_rate(const nm_brick *b) { return 0; }
int32_t nm_brick_tts_native_rate(const nm_brick *b) { return 0; }
const char *nm_brick_tts_engine(const nm_brick *b) { return ""; }

nm_status nm_tts_list_voices(const char *engine, const char *data_dir, nm_tts_voice_fn fn, void *user, char *err,
                             size_t err_size) {
    return nm_off_fail(err, err_size, WHAT, OPTION);
}
