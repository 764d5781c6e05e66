// The streamed audio encoder (nanomind.h, "writing"): 16-bit mono PCM into
// FLAC, MP3 or Opus-in-Ogg bytes through libsndfile's virtual I/O, each byte
// handed to the caller's sink as libsndfile writes it. A stream cannot seek:
// the virtual file answers only seeks to where it already is, and refuses
// going back (FLAC's header rewrite at close, which then keeps its "unknown
// length"). MP3 is written at a constant bit rate: a VBR stream's first frame
// holds a frame count that LAME can only write back at the end.
#include "io/audio/audio_impl.h"
#include "core/fail.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sndfile.h>

struct nm_audio_encoder {
    SNDFILE *sf;
    SF_VIRTUAL_IO io;
    nm_audio_bytes_fn sink;
    void *user;
    sf_count_t pos;   // bytes handed to the sink
    bool stopped;     // the sink said stop
    bool elsewhere;   // a seek away from the end was refused: what is written until one comes back is
                      // meant for an earlier place (FLAC's header at close), not for the end: dropped
    char err[256];
};

static const struct { const char *name, *mime; int format; } containers[] = {
    [NM_AUDIO_FLAC] = {"flac", "audio/flac", SF_FORMAT_FLAC | SF_FORMAT_PCM_16},
    [NM_AUDIO_MP3] = {"mp3", "audio/mpeg", SF_FORMAT_MPEG | SF_FORMAT_MPEG_LAYER_III},
    [NM_AUDIO_OPUS] = {"opus", "audio/ogg", SF_FORMAT_OGG | SF_FORMAT_OPUS},
};

static bool known(nm_audio_container c) { return c >= NM_AUDIO_FLAC && c <= NM_AUDIO_OPUS; }

bool nm_audio_container_parse(const char *name, nm_audio_container *out) {
    if (!name || !out) return false;
    for (int c = NM_AUDIO_FLAC; c <= NM_AUDIO_OPUS; c++)
        if (!strcmp(name, containers[c].name)) return *out = (nm_audio_container)c, true;
    if (!strcmp(name, "ogg")) return *out = NM_AUDIO_OPUS, true;
    return false;
}

const char *nm_audio_container_name(nm_audio_container c) { return known(c) ? containers[c].name : "?"; }
const char *nm_audio_container_mime(nm_audio_container c) { return known(c) ? containers[c].mime : "?"; }

static sf_count_t enc_len(void *u) { return ((nm_audio_encoder *)u)->pos; }
static sf_count_t enc_tell(void *u) { return ((nm_audio_encoder *)u)->pos; }
static sf_count_t enc_read(void *p, sf_count_t n, void *u) { return (void)p, (void)n, (void)u, 0; }

static sf_count_t enc_seek(sf_count_t off, int whence, void *u) {
    nm_audio_encoder *e = u;
    const sf_count_t to = whence == SEEK_SET ? off : e->pos + off; // (SEEK_CUR and SEEK_END: the end is here)
    // (libsndfile's FLAC writer does not look at a virtual seek's answer: the flag keeps its rewrite out)
    e->elsewhere = to != e->pos;
    return to == e->pos ? to : -1;
}

static sf_count_t enc_write(const void *p, sf_count_t n, void *u) {
    nm_audio_encoder *e = u;
    if (e->elsewhere) return n; // (dropped: see the flag)
    if (e->stopped) return 0;
    if (n > 0 && !e->sink(p, (size_t)n, e->user)) {
        e->stopped = true;
        return 0;
    }
    e->pos += n;
    return n;
}

nm_status nm_audio_encoder_open(nm_audio_container c, int32_t rate, nm_audio_bytes_fn sink, void *user,
                                nm_audio_encoder **out, char *err, size_t err_size) {
    if (!out) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "audio encoder: NULL output");
    *out = NULL;
    if (!sink || !known(c)) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "audio encoder: no sink or container %d", (int)c);
    nm_status st = nm_audio_check_rate("sample rate", rate, err, err_size);
    if (st != NM_OK) return st;
    if (c == NM_AUDIO_OPUS && rate != 8000 && rate != 12000 && rate != 16000 && rate != 24000 && rate != 48000)
        return nm_fail(NM_ERR_UNSUPPORTED, err, err_size, "audio: Opus takes 8, 12, 16, 24 or 48 kHz, not %d Hz", rate);
    SF_INFO in = {.samplerate = rate, .channels = 1, .format = containers[c].format};
    if (!sf_format_check(&in))
        return nm_fail(NM_ERR_UNSUPPORTED, err, err_size, "audio: this libsndfile (%s) cannot write %s",
                       sf_version_string(), containers[c].name);
    nm_audio_encoder *e = calloc(1, sizeof *e);
    if (!e) return nm_fail(NM_ERR_NOMEM, err, err_size, "audio encoder: out of memory");
    e->io = (SF_VIRTUAL_IO){enc_len, enc_seek, enc_read, enc_write, enc_tell};
    e->sink = sink;
    e->user = user;
    if (!(e->sf = sf_open_virtual(&e->io, SFM_WRITE, &in, e))) {
        st = nm_fail(e->stopped ? NM_ERR_IO : NM_ERR_UNSUPPORTED, err, err_size, "audio: %s encoder: %s",
                     containers[c].name, e->stopped ? "the sink stopped" : sf_strerror(NULL));
        free(e);
        return st;
    }
    if (c == NM_AUDIO_MP3) { // constant bit rate: a stream cannot go back to write a VBR header's frame count
        int mode = SF_BITRATE_MODE_CONSTANT;
        sf_command(e->sf, SFC_SET_BITRATE_MODE, &mode, sizeof mode);
        double level = 0.5; // libsndfile's middle: 80 kb/s at 24 kHz (its default, 32 kb/s, blurs speech:
        sf_command(e->sf, SFC_SET_COMPRESSION_LEVEL, &level, sizeof level); // Whisper mishears it)
    }
    *out = e;
    return NM_OK;
}

nm_status nm_audio_encoder_write(nm_audio_encoder *e, const int16_t *pcm, int64_t n) {
    if (!e || (n > 0 && !pcm) || n < 0) return NM_ERR_INVALID_ARG;
    if (e->stopped) return nm_fail(NM_ERR_IO, e->err, sizeof e->err, "audio encoder: the sink stopped");
    for (int64_t done = 0; done < n;) {
        const sf_count_t k = sf_write_short(e->sf, pcm + done, n - done);
        if (e->stopped) return nm_fail(NM_ERR_IO, e->err, sizeof e->err, "audio encoder: the sink stopped");
        if (k <= 0)
            return nm_fail(NM_ERR_IO, e->err, sizeof e->err, "audio encoder: %s", sf_strerror(e->sf));
        done += k;
    }
    return NM_OK;
}

nm_status nm_audio_encoder_close(nm_audio_encoder *e) {
    if (!e) return NM_OK;
    const int rc = sf_close(e->sf); // the last frames (and FLAC's attempt to rewrite its header: refused)
    const nm_status st = e->stopped || rc != 0 ? NM_ERR_IO : NM_OK;
    free(e);
    return st;
}

const char *nm_audio_encoder_error(const nm_audio_encoder *e) { return e ? e->err : ""; }
