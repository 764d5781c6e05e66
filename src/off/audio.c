// Audio in and out left out: neither speech part is built (-DNM_WITH_STT=OFF
// and -DNM_WITH_TTS=OFF), so no libsndfile, soxr or ALSA (off.h). The VAD
// (src/io/audio/vad.c) is plain C and stays.
#include <stdlib.h>
#include <string.h>

#include "nanomind.h"
#include "off/off.h"

#define WHAT "audio input and output"
#define OPTION "NM_WITH_STT or NM_WITH_TTS"

static nm_status off(nm_audio *out, char *err, size_t err_size) {
    if (out) *out = (nm_audio){0};
    return nm_off_fail(err, err_size, WHAT, OPTION);
}

nm_status nm_audio_decode(const void *data, size_t n, int32_t target_rate, nm_audio *out, char *err,
                          size_t err_size) {
    return off(out, err, err_size);
}
nm_status nm_audio_decode_max(const void *data, size_t n, int32_t target_rate, int64_t max_samples,
                              nm_audio *out, char *err, size_t err_size) {
    return off(out, err, err_size);
}
nm_status nm_audio_load(const char *path, int32_t target_rate, nm_audio *out, char *err, size_t err_size) {
    return off(out, err, err_size);
}
nm_status nm_audio_load_into(const char *path, int32_t target_rate, float *dst, int64_t cap, int64_t *n, char *err,
                             size_t err_size) {
    if (n) *n = 0;
    return off(NULL, err, err_size);
}
nm_status nm_audio_probe(const char *path, int32_t target_rate, int64_t *max_samples, char *err, size_t err_size) {
    return off(NULL, err, err_size);
}
nm_status nm_audio_from_raw(const void *data, size_t n, nm_pcm_format fmt, int32_t rate, int32_t channels,
                            int32_t target_rate, nm_audio *out, char *err, size_t err_size) {
    return off(out, err, err_size);
}
nm_status nm_audio_load_raw(const char *path, nm_pcm_format fmt, int32_t rate, int32_t channels,
                            int32_t target_rate, nm_audio *out, char *err, size_t err_size) {
    return off(out, err, err_size);
}
nm_status nm_audio_resample(const float *in, int64_t n, int32_t rate_in, int32_t rate_out, nm_audio *out,
                            char *err, size_t err_size) {
    return off(out, err, err_size);
}
void nm_audio_free(nm_audio *a) {
    if (!a) return;
    free(a->pcm);
    *a = (nm_audio){0};
}

nm_audio_capture_params nm_audio_capture_default_params(void) {
    return (nm_audio_capture_params){
        .device = "default", .rate = NM_AUDIO_RATE, .format = NM_PCM_S16LE, .seconds = 5.0};
}
bool nm_audio_capture_available(void) { return false; }
nm_status nm_audio_capture(const nm_audio_capture_params *p, nm_audio *out, char *err, size_t err_size) {
    return off(out, err, err_size);
}
nm_status nm_audio_player_open(const char *device, int32_t rate, nm_audio_player **out, char *err,
                               size_t err_size) {
    if (out) *out = NULL;
    return off(NULL, err, err_size);
}
nm_status nm_audio_player_write(nm_audio_player *p, const int16_t *pcm, int64_t n, char *err, size_t err_size) {
    return off(NULL, err, err_size);
}
nm_status nm_audio_player_drain(nm_audio_player *p, char *err, size_t err_size) { return off(NULL, err, err_size); }
void nm_audio_player_close(nm_audio_player *p) {}

// Plain bytes, the same as src/io/audio/audio_io.c's.
static void put_u16(uint8_t *p, uint32_t v) { p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8); }
static void put_u32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16), p[3] = (uint8_t)(v >> 24);
}
void nm_audio_wav_header(uint8_t h[NM_WAV_HEADER_BYTES], uint32_t data_bytes, int32_t rate, int32_t channels) {
    memcpy(h, "RIFF", 4);
    put_u32(h + 4, 36 + data_bytes);
    memcpy(h + 8, "WAVEfmt ", 8);
    put_u32(h + 16, 16);
    put_u16(h + 20, 1); // WAVE_FORMAT_PCM
    put_u16(h + 22, (uint32_t)channels);
    put_u32(h + 24, (uint32_t)rate);
    put_u32(h + 28, (uint32_t)rate * (uint32_t)channels * 2);
    put_u16(h + 32, (uint32_t)channels * 2);
    put_u16(h + 34, 16);
    memcpy(h + 36, "data", 4);
    put_u32(h + 40, data_bytes);
}
nm_status nm_audio_write_wav(const char *path, const float *pcm, int64_t n_frames, int32_t rate,
                             int32_t channels, char *err, size_t err_size) {
    return off(NULL, err, err_size);
}

// No encoder can be made: no container is known, the calls on an encoder are those on NULL.
bool nm_audio_container_parse(const char *name, nm_audio_container *out) { return false; }
const char *nm_audio_container_name(nm_audio_container c) { return "?"; }
const char *nm_audio_container_mime(nm_audio_container c) { return "?"; }
nm_status nm_audio_encoder_open(nm_audio_container c, int32_t rate, nm_audio_bytes_fn sink, void *user,
                                nm_audio_encoder **out, char *err, size_t err_size) {
    if (out) *out = NULL;
    return off(NULL, err, err_size);
}
nm_status nm_audio_encoder_write(nm_audio_encoder *e, const int16_t *pcm, int64_t n) { return NM_ERR_UNSUPPORTED; }
nm_status nm_audio_encoder_close(nm_audio_encoder *e) { return NM_OK; }
const char *nm_audio_encoder_error(const nm_audio_encoder *e) { return ""; }
