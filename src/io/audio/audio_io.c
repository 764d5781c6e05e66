// Audio files in and out: libsndfile containers (path, memory, stdin), raw
// PCM, and a 16-bit WAV writer. Samples go through the sink (audio_resample.c).
#include "io/audio/audio_impl.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sndfile.h>

#include "core/outfile.h"
#include "io/infile.h"

#define CHUNK_FRAMES 4096 // frames read per libsndfile / raw call

static void clear(char *err, size_t err_size) {
    if (err && err_size) err[0] = '\0';
}

// Puts "name: sub" into err, sub's own "audio: " dropped. Returns st.
static nm_status relabel(nm_status st, char *err, size_t err_size, const char *name, const char *sub) {
    if (!strncmp(sub, "audio: ", 7)) sub += 7;
    return nm_fail(st, err, err_size, "%s: %s", name, sub);
}

// ---- libsndfile ---------------------------------------------------------------------

// A read-only memory file for sf_open_virtual.
typedef struct memfile {
    const uint8_t *data;
    sf_count_t n, pos;
} memfile;

static sf_count_t mem_len(void *u) { return ((memfile *)u)->n; }

static sf_count_t mem_seek(sf_count_t off, int whence, void *u) {
    memfile *m = u;
    sf_count_t base = whence == SEEK_SET ? 0 : whence == SEEK_CUR ? m->pos : m->n;
    // As lseek: a position past the end is allowed (reads there return 0), a
    // negative one is an error, and so is one that would overflow (a hostile
    // 64-bit chunk size).
    if (off < -base || off > INT64_MAX - base) return -1;
    m->pos = base + off;
    return m->pos;
}

static sf_count_t mem_read(void *dst, sf_count_t count, void *u) {
    memfile *m = u;
    if (count <= 0 || m->pos >= m->n) return 0;
    sf_count_t left = m->n - m->pos;
    if (count > left) count = left;
    memcpy(dst, m->data + m->pos, (size_t)count);
    m->pos += count;
    return count;
}

static sf_count_t mem_write(const void *src, sf_count_t count, void *u) { return 0; }

static sf_count_t mem_tell(void *u) { return ((memfile *)u)->pos; }

// Why sf_open* failed, as a status.
static nm_status open_status(int sferr) {
    switch (sferr) {
    case SF_ERR_UNRECOGNISED_FORMAT:
    case SF_ERR_UNSUPPORTED_ENCODING: return NM_ERR_UNSUPPORTED;
    case SF_ERR_SYSTEM: return NM_ERR_IO;
    default: return NM_ERR_FORMAT; // malformed, and libsndfile's many specific codes
    }
}

// Where a decode writes: its own buffer (dst NULL), or the caller's dst of cap samples.
typedef struct dest {
    float *dst;
    int64_t cap;
} dest;

// Decodes an open file into *out (out->pcm is d->dst when given). name is for messages. Closes nothing.
static nm_status decode_sf(SNDFILE *sf, const SF_INFO *info, const char *name, int32_t target_rate,
                           int64_t max_samples, const dest *d, nm_audio *out, char *err, size_t err_size) {
    if (info->channels <= 0 || info->channels > NM_AUDIO_MAX_CHANNELS)
        return nm_fail(NM_ERR_RANGE, err, err_size, "%s: %d channels (1..%d supported)", name,
                       info->channels, NM_AUDIO_MAX_CHANNELS);
    if (info->samplerate < NM_AUDIO_MIN_RATE || info->samplerate > NM_AUDIO_MAX_RATE)
        return nm_fail(NM_ERR_RANGE, err, err_size, "%s: sample rate %d Hz is outside %d..%d Hz", name,
                       info->samplerate, NM_AUDIO_MIN_RATE, NM_AUDIO_MAX_RATE);
    if (info->frames == 0) return nm_fail(NM_ERR_FORMAT, err, err_size, "%s: no audio frames", name);
    int32_t rate_out = target_rate > 0 ? target_rate : info->samplerate;
    nm_audio_sink s;
    nm_status st = d && d->dst ? nm_audio_sink_init_into(&s, info->samplerate, rate_out, d->dst, d->cap, err, err_size)
                               : nm_audio_sink_init(&s, info->samplerate, rate_out, max_samples, err, err_size);
    if (st != NM_OK) return st;
    // A header announcing more than the cap fails before any decoding. (A
    // negative or unknown count, SF_COUNT_MAX, is checked as we go instead.)
    if (info->frames > s.max_in && info->frames != SF_COUNT_MAX) {
        st = nm_fail(NM_ERR_RANGE, err, err_size,
                     "%s: too long: %lld frames at %d Hz (%.1f s), the limit is %.1f s", name,
                     (long long)info->frames, info->samplerate, (double)info->frames / info->samplerate,
                     (double)s.max_out / rate_out);
        nm_audio_sink_free(&s);
        return st;
    }
    const int ch = info->channels;
    float *buf = malloc((size_t)CHUNK_FRAMES * ch * sizeof *buf);
    float *mono = malloc((size_t)CHUNK_FRAMES * sizeof *mono);
    if (!buf || !mono) st = nm_fail(NM_ERR_NOMEM, err, err_size, "%s: out of memory", name);
    char sub[256];
    while (st == NM_OK) {
        sf_count_t got = sf_readf_float(sf, buf, CHUNK_FRAMES);
        if (got <= 0) break; // end of data (libsndfile stops at what a truncated file holds)
        for (sf_count_t i = 0; i < got; i++) {
            const float *f = buf + i * ch;
            float acc = 0.0f;
            for (int c = 0; c < ch; c++) {
                if (!isfinite(f[c])) { // say which channel; the sum would hide it
                    st = nm_fail(NM_ERR_FORMAT, err, err_size, "%s: sample %lld (channel %d) is %s", name,
                                 (long long)(s.in_frames + i), c, isnan(f[c]) ? "NaN" : "infinite");
                    break;
                }
                acc += f[c];
            }
            if (st != NM_OK) break;
            mono[i] = ch == 1 ? acc : acc / (float)ch;
        }
        if (st != NM_OK) break;
        st = nm_audio_sink_push(&s, mono, got, sub, sizeof sub);
        if (st != NM_OK) relabel(st, err, err_size, name, sub);
    }
    // The header was fine but no frame decodes: say what libsndfile says, if
    // anything (a truncated OGG, whose end it cannot find, reads as empty).
    if (st == NM_OK && s.in_frames == 0)
        st = nm_fail(NM_ERR_FORMAT, err, err_size, "%s: no audio frames could be decoded (truncated or corrupt?)%s%s",
                     name, sf_error(sf) ? ": " : "", sf_error(sf) ? sf_strerror(sf) : "");
    // A decoder error part way (a FLAC frame that fails its CRC, ...) fails the
    // whole file rather than handing back a silently shortened recording. Data
    // that simply ends early (a cut WAV) is no error to libsndfile: what is
    // there is returned.
    if (st == NM_OK && sf_error(sf) != SF_ERR_NO_ERROR)
        st = nm_fail(NM_ERR_FORMAT, err, err_size, "%s: corrupt data after %lld frames: %s", name,
                     (long long)s.in_frames, sf_strerror(sf));
    if (st == NM_OK) {
        st = nm_audio_sink_finish(&s, out, sub, sizeof sub);
        if (st != NM_OK) relabel(st, err, err_size, name, sub);
    }
    free(buf);
    free(mono);
    nm_audio_sink_free(&s);
    return st;
}

// What libsndfile will not say about a WAV header it refuses ("SF_INFO struct
// incomplete"): the rate or channel count the fmt chunk holds, when out of
// range. Returns false when the bytes are no such header.
static bool wav_header_hint(const uint8_t *p, size_t n, char *hint, size_t size) {
    if (n < 12 || memcmp(p, "RIFF", 4) || memcmp(p + 8, "WAVE", 4)) return false;
    for (size_t at = 12; at + 8 <= n;) {
        const uint32_t len = (uint32_t)p[at + 4] | (uint32_t)p[at + 5] << 8 | (uint32_t)p[at + 6] << 16 |
                             (uint32_t)p[at + 7] << 24;
        if (!memcmp(p + at, "fmt ", 4) && at + 8 + 8 <= n) {
            const uint8_t *f = p + at + 8;
            const unsigned ch = (unsigned)f[2] | (unsigned)f[3] << 8;
            const uint32_t rate = (uint32_t)f[4] | (uint32_t)f[5] << 8 | (uint32_t)f[6] << 16 | (uint32_t)f[7] << 24;
            if (rate < NM_AUDIO_MIN_RATE || rate > NM_AUDIO_MAX_RATE) {
                snprintf(hint, size, "the WAV header gives a sample rate of %u Hz (%d..%d supported)", rate,
                         NM_AUDIO_MIN_RATE, NM_AUDIO_MAX_RATE);
                return true;
            }
            if (ch < 1 || ch > NM_AUDIO_MAX_CHANNELS) {
                snprintf(hint, size, "the WAV header gives %u channels (1..%d supported)", ch, NM_AUDIO_MAX_CHANNELS);
                return true;
            }
            return false;
        }
        if (len > n) return false;
        at += 8 + (size_t)len + (len & 1);
    }
    return false;
}

static nm_status check_target(int32_t target_rate, nm_audio *out, char *err, size_t err_size) {
    clear(err, err_size);
    if (!out) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "audio: no output");
    *out = (nm_audio){0};
    if (target_rate > 0) return nm_audio_check_rate("target rate", target_rate, err, err_size);
    return NM_OK;
}

static nm_status decode_mem(const void *data, size_t n, int32_t target_rate, int64_t max_samples, const dest *d,
                            nm_audio *out, char *err, size_t err_size) {
    nm_status st = check_target(target_rate, out, err, err_size);
    if (st != NM_OK) return st;
    if (!data && n) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "audio: no data");
    if (n == 0) return nm_fail(NM_ERR_FORMAT, err, err_size, "audio: empty input");
    memfile m = {.data = data, .n = (sf_count_t)n};
    SF_VIRTUAL_IO io = {mem_len, mem_seek, mem_read, mem_write, mem_tell};
    SF_INFO info = {0};
    SNDFILE *sf = sf_open_virtual(&io, SFM_READ, &info, &m);
    if (!sf) {
        int e = sf_error(NULL);
        char hint[160];
        if (wav_header_hint(data, n, hint, sizeof hint)) return nm_fail(NM_ERR_FORMAT, err, err_size, "audio: %s", hint);
        return nm_fail(open_status(e), err, err_size, "audio: cannot decode (%zu bytes): %s", n,
                       sf_strerror(NULL));
    }
    st = decode_sf(sf, &info, "audio", target_rate, max_samples, d, out, err, err_size);
    sf_close(sf);
    return st;
}

nm_status nm_audio_decode_max(const void *data, size_t n, int32_t target_rate, int64_t max_samples,
                              nm_audio *out, char *err, size_t err_size) {
    return decode_mem(data, n, target_rate, max_samples, NULL, out, err, err_size);
}

nm_status nm_audio_decode(const void *data, size_t n, int32_t target_rate, nm_audio *out, char *err,
                          size_t err_size) {
    return nm_audio_decode_max(data, n, target_rate, 0, out, err, err_size);
}

// Bytes per frame of an uncompressed libsndfile format; 0 when compressed or unknown.
static int64_t frame_bytes(const SF_INFO *info) {
    int b;
    switch (info->format & SF_FORMAT_SUBMASK) {
    case SF_FORMAT_PCM_S8: case SF_FORMAT_PCM_U8: case SF_FORMAT_ULAW: case SF_FORMAT_ALAW: b = 1; break;
    case SF_FORMAT_PCM_16: b = 2; break;
    case SF_FORMAT_PCM_24: b = 3; break;
    case SF_FORMAT_PCM_32: case SF_FORMAT_FLOAT: b = 4; break;
    case SF_FORMAT_DOUBLE: b = 8; break;
    default: return 0;
    }
    return (int64_t)b * info->channels;
}

#define PROBE_BYTES (64 * 1024)

// Reads f whole into *data, never more than a stream can need: once the first
// PROBE_BYTES are in, libsndfile must recognise a format in them (else the
// stream is refused at once: /dev/zero is not read to the end), and an
// uncompressed format is read only up to NM_AUDIO_MAX_SECONDS of its frames
// (so memory is bounded by the duration limit, not by what the pipe offers).
// Always at most NM_AUDIO_MAX_BUFFER_BYTES.
static nm_status read_all(FILE *f, const char *name, uint8_t **data, size_t *n, char *err, size_t err_size) {
    size_t cap = 1 << 16, len = 0;
    uint64_t limit = NM_AUDIO_MAX_BUFFER_BYTES;
    bool probed = false;
    uint8_t *buf = malloc(cap);
    if (!buf) return nm_fail(NM_ERR_NOMEM, err, err_size, "%s: out of memory", name);
    for (;;) {
        if (!probed && len >= PROBE_BYTES) {
            probed = true;
            memfile m = {.data = buf, .n = (sf_count_t)len};
            SF_VIRTUAL_IO io = {mem_len, mem_seek, mem_read, mem_write, mem_tell};
            SF_INFO info = {0};
            SNDFILE *sf = sf_open_virtual(&io, SFM_READ, &info, &m);
            if (!sf && sf_error(NULL) == SF_ERR_UNRECOGNISED_FORMAT) {
                free(buf);
                return nm_fail(NM_ERR_UNSUPPORTED, err, err_size,
                               "%s: no audio format recognised in its first %d KiB: %s", name, PROBE_BYTES / 1024,
                               sf_strerror(NULL));
            }
            if (sf) {
                const int64_t fb = frame_bytes(&info);
                if (fb > 0 && info.samplerate > 0) {
                    const uint64_t most = (uint64_t)PROBE_BYTES + (uint64_t)NM_AUDIO_MAX_SECONDS * info.samplerate * fb;
                    if (most < limit) limit = most;
                }
                sf_close(sf);
            }
        }
        if (len >= limit) {
            free(buf);
            return nm_fail(NM_ERR_RANGE, err, err_size, "%s: longer than %d s of audio (the limit)%s", name,
                           NM_AUDIO_MAX_SECONDS,
                           limit == NM_AUDIO_MAX_BUFFER_BYTES ? "; pass a regular file to stream it" : "");
        }
        if (len == cap) {
            size_t ncap = cap * 2 > limit ? (size_t)limit : cap * 2;
            uint8_t *p = realloc(buf, ncap);
            if (!p) {
                free(buf);
                return nm_fail(NM_ERR_NOMEM, err, err_size, "%s: out of memory", name);
            }
            buf = p;
            cap = ncap;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) break;
    }
    if (ferror(f)) {
        free(buf);
        return nm_fail(NM_ERR_IO, err, err_size, "%s: read error: %s", name, strerror(errno));
    }
    *data = buf;
    *n = len;
    return NM_OK;
}

// Opens path ("-" = stdin; pipes and FIFOs are streams, never waited on at
// the open). *regular says whether it is a seekable regular file (stdin is
// always read as a stream), *size is then its size. A regular file is streamed
// by libsndfile: no size cap, the duration cap bounds what it costs.
static nm_status open_input(const char *path, FILE **f, bool *regular, int64_t *size, char *err,
                            size_t err_size) {
    *regular = false;
    *size = 0;
    if (!path) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "audio: no path");
    nm_status st = nm_infile_open(path, UINT64_MAX, NM_INFILE_STDIN | NM_INFILE_STREAM, f, size, err, err_size);
    if (st != NM_OK) return st;
    *regular = *size >= 0 && strcmp(path, "-");
    return NM_OK;
}

static void close_input(FILE *f) {
    if (f) fclose(f);
}

static nm_status load(const char *path, int32_t target_rate, const dest *d, nm_audio *out, char *err,
                      size_t err_size) {
    nm_status st = check_target(target_rate, out, err, err_size);
    if (st != NM_OK) return st;
    FILE *f;
    bool regular;
    int64_t size;
    st = open_input(path, &f, &regular, &size, err, err_size);
    if (st != NM_OK) return st;
    const char *name = strcmp(path, "-") ? path : "stdin";
    if (!regular) {
        uint8_t *data = NULL;
        size_t n = 0;
        st = read_all(f, name, &data, &n, err, err_size);
        close_input(f);
        if (st != NM_OK) return st;
        char sub[256] = "";
        st = decode_mem(data, n, target_rate, 0, d, out, sub, sizeof sub);
        free(data);
        if (st != NM_OK) relabel(st, err, err_size, name, sub);
        return st;
    }
    // A regular file: libsndfile streams it through our descriptor (nothing
    // has been read through f, so the descriptor is at offset 0).
    if (size == 0) {
        close_input(f);
        return nm_fail(NM_ERR_FORMAT, err, err_size, "%s: empty file", path);
    }
    // The first bytes, for a clearer message if libsndfile refuses the header
    // (read before it: a failed open may leave the descriptor unusable).
    uint8_t head[4096];
    const ssize_t got = pread(fileno(f), head, sizeof head, 0);
    SF_INFO info = {0};
    SNDFILE *sf = sf_open_fd(fileno(f), SFM_READ, &info, 0);
    if (!sf) {
        int e = sf_error(NULL);
        char hint[160];
        close_input(f);
        if (got > 0 && wav_header_hint(head, (size_t)got, hint, sizeof hint))
            return nm_fail(NM_ERR_FORMAT, err, err_size, "%s: %s", path, hint);
        return nm_fail(open_status(e), err, err_size, "%s: cannot decode: %s", path, sf_strerror(NULL));
    }
    st = decode_sf(sf, &info, path, target_rate, 0, d, out, err, err_size);
    sf_close(sf);
    close_input(f);
    return st;
}

nm_status nm_audio_load(const char *path, int32_t target_rate, nm_audio *out, char *err, size_t err_size) {
    return load(path, target_rate, NULL, out, err, err_size);
}

nm_status nm_audio_load_into(const char *path, int32_t target_rate, float *dst, int64_t cap, int64_t *n, char *err,
                             size_t err_size) {
    if (n) *n = 0;
    if (!dst || cap < 1 || !n) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "audio: no destination buffer");
    if (target_rate <= 0) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "audio: a target rate is needed");
    nm_audio a;
    dest d = {dst, cap};
    nm_status st = load(path, target_rate, &d, &a, err, err_size);
    if (st == NM_OK) *n = a.n; // a.pcm is dst: nothing to free
    return st;
}

nm_status nm_audio_probe(const char *path, int32_t target_rate, int64_t *max_samples, char *err, size_t err_size) {
    clear(err, err_size);
    if (max_samples) *max_samples = 0;
    if (!path || !max_samples || target_rate <= 0)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "audio: probe needs a path, a target rate and an output");
    int fd = -1;
    int64_t size = -1;
    if (strcmp(path, "-")) (void)nm_infile_fd(path, UINT64_MAX, NM_INFILE_STDIN | NM_INFILE_STREAM, &fd, &size, NULL, 0);
    if (fd < 0 || size < 0) {
        if (fd >= 0) close(fd);
        return nm_fail(NM_ERR_UNSUPPORTED, err, err_size, "%s: not a regular file: its length is known once read", path);
    }
    SF_INFO info = {0};
    SNDFILE *sf = sf_open_fd(fd, SFM_READ, &info, 0);
    if (sf) sf_close(sf);
    close(fd);
    if (!sf) return nm_fail(NM_ERR_FORMAT, err, err_size, "%s: cannot decode: %s", path, sf_strerror(NULL));
    if (info.frames <= 0 || info.frames == SF_COUNT_MAX || info.samplerate <= 0)
        return nm_fail(NM_ERR_UNSUPPORTED, err, err_size, "%s: the header does not say how long it is", path);
    // soxr's count is within a sample of round(frames * out / in); a margin for its tail
    if ((double)info.frames / info.samplerate > NM_AUDIO_MAX_SECONDS)
        return nm_fail(NM_ERR_RANGE, err, err_size, "%s: too long: %.1f s, the limit is %d s", path,
                       (double)info.frames / info.samplerate, NM_AUDIO_MAX_SECONDS);
    *max_samples = (int64_t)ceil((double)info.frames * target_rate / info.samplerate) + 64;
    return NM_OK;
}

void nm_audio_free(nm_audio *a) {
    if (!a) return;
    free(a->pcm);
    *a = (nm_audio){0};
}

// ---- raw PCM ------------------------------------------------------------------------

static nm_status check_raw(nm_pcm_format fmt, int32_t rate, int32_t channels, char *err, size_t err_size) {
    if (fmt != NM_PCM_S16LE && fmt != NM_PCM_F32LE)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "audio: unknown raw format %d (s16le or f32le)",
                       (int)fmt);
    if (channels < 1 || channels > NM_AUDIO_MAX_CHANNELS)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "audio: %d channels (1..%d supported)",
                       (int)channels, NM_AUDIO_MAX_CHANNELS);
    return nm_audio_check_rate("sample rate", rate, err, err_size);
}

static size_t sample_bytes(nm_pcm_format fmt) { return fmt == NM_PCM_S16LE ? 2 : 4; }

// Converts `frames` frames of raw little-endian data to mono floats.
static void raw_to_mono(const uint8_t *p, int64_t frames, nm_pcm_format fmt, int channels, float *mono) {
    const size_t bs = sample_bytes(fmt);
    for (int64_t i = 0; i < frames; i++) {
        float acc = 0.0f;
        for (int c = 0; c < channels; c++, p += bs) {
            if (fmt == NM_PCM_S16LE) {
                acc += (float)(int16_t)(uint16_t)(p[0] | p[1] << 8) * (1.0f / 32768.0f);
            } else {
                uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
                float v;
                memcpy(&v, &u, 4);
                acc += v; // a NaN/inf stays one through the sum and is caught by the sink
            }
        }
        mono[i] = channels == 1 ? acc : acc / (float)channels;
    }
}

nm_status nm_audio_from_raw_max(const void *data, size_t n, nm_pcm_format fmt, int32_t rate,
                                int32_t channels, int32_t target_rate, int64_t max_samples, nm_audio *out,
                                char *err, size_t err_size) {
    nm_status st = check_target(target_rate, out, err, err_size);
    if (st == NM_OK) st = check_raw(fmt, rate, channels, err, err_size);
    if (st != NM_OK) return st;
    if (!data && n) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "audio: no data");
    if (n == 0) return nm_fail(NM_ERR_FORMAT, err, err_size, "audio: empty raw input");
    const size_t frame = sample_bytes(fmt) * (size_t)channels;
    if (n % frame)
        return nm_fail(NM_ERR_FORMAT, err, err_size,
                       "audio: %zu bytes of raw %s is not a whole number of %d-channel frames (%zu bytes each)",
                       n, fmt == NM_PCM_S16LE ? "s16le" : "f32le", (int)channels, frame);
    nm_audio_sink s;
    st = nm_audio_sink_init(&s, rate, target_rate > 0 ? target_rate : rate, max_samples, err, err_size);
    float *mono = st == NM_OK ? malloc(CHUNK_FRAMES * sizeof *mono) : NULL;
    if (st == NM_OK && !mono) st = nm_fail(NM_ERR_NOMEM, err, err_size, "audio: out of memory");
    const int64_t frames = (int64_t)(n / frame);
    if (st == NM_OK && frames > s.max_in)
        st = nm_fail(NM_ERR_RANGE, err, err_size, "audio: too long: %lld frames at %d Hz, the limit is %.1f s",
                     (long long)frames, (int)rate, (double)s.max_out / s.rate_out);
    for (int64_t i = 0; st == NM_OK && i < frames; i += CHUNK_FRAMES) {
        int64_t k = frames - i < CHUNK_FRAMES ? frames - i : CHUNK_FRAMES;
        raw_to_mono((const uint8_t *)data + (size_t)i * frame, k, fmt, channels, mono);
        st = nm_audio_sink_push(&s, mono, k, err, err_size);
    }
    if (st == NM_OK) st = nm_audio_sink_finish(&s, out, err, err_size);
    free(mono);
    nm_audio_sink_free(&s);
    return st;
}

nm_status nm_audio_from_raw(const void *data, size_t n, nm_pcm_format fmt, int32_t rate, int32_t channels,
                            int32_t target_rate, nm_audio *out, char *err, size_t err_size) {
    return nm_audio_from_raw_max(data, n, fmt, rate, channels, target_rate, 0, out, err, err_size);
}

nm_status nm_audio_load_raw(const char *path, nm_pcm_format fmt, int32_t rate, int32_t channels,
                            int32_t target_rate, nm_audio *out, char *err, size_t err_size) {
    nm_status st = check_target(target_rate, out, err, err_size);
    if (st == NM_OK) st = check_raw(fmt, rate, channels, err, err_size);
    if (st != NM_OK) return st;
    FILE *f;
    bool regular;
    int64_t size;
    st = open_input(path, &f, &regular, &size, err, err_size);
    if (st != NM_OK) return st;
    const char *name = strcmp(path, "-") ? path : "stdin";
    const size_t frame = sample_bytes(fmt) * (size_t)channels;
    nm_audio_sink s;
    char sub[256] = "";
    st = nm_audio_sink_init(&s, rate, target_rate > 0 ? target_rate : rate, 0, sub, sizeof sub);
    uint8_t *buf = malloc(CHUNK_FRAMES * frame);
    float *mono = malloc(CHUNK_FRAMES * sizeof *mono);
    if (st == NM_OK && (!buf || !mono)) st = nm_fail(NM_ERR_NOMEM, sub, sizeof sub, "audio: out of memory");
    size_t total = 0;
    while (st == NM_OK) {
        // fread returns a short count only at end of file or on an error.
        size_t got = fread(buf, 1, CHUNK_FRAMES * frame, f);
        total += got;
        if (got % frame) {
            st = nm_fail(NM_ERR_FORMAT, sub, sizeof sub,
                         "audio: %zu bytes of raw %s is not a whole number of %d-channel frames (%zu bytes each)",
                         total, fmt == NM_PCM_S16LE ? "s16le" : "f32le", (int)channels, frame);
            break;
        }
        if (got) {
            raw_to_mono(buf, (int64_t)(got / frame), fmt, channels, mono);
            st = nm_audio_sink_push(&s, mono, (int64_t)(got / frame), sub, sizeof sub);
        }
        if (got < CHUNK_FRAMES * frame) break;
    }
    if (st == NM_OK && ferror(f)) st = nm_fail(NM_ERR_IO, sub, sizeof sub, "audio: read error");
    if (st == NM_OK && total == 0) st = nm_fail(NM_ERR_FORMAT, sub, sizeof sub, "audio: empty raw input");
    if (st == NM_OK) st = nm_audio_sink_finish(&s, out, sub, sizeof sub);
    if (st != NM_OK) relabel(st, err, err_size, name, sub);
    free(buf);
    free(mono);
    nm_audio_sink_free(&s);
    close_input(f);
    return st;
}

// ---- WAV writer ---------------------------------------------------------------------

static void put_u16(uint8_t *p, uint32_t v) { p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8); }
static void put_u32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16), p[3] = (uint8_t)(v >> 24);
}

static int16_t to_s16(float x) {
    float v = x * 32768.0f;
    if (v >= 32767.0f) return 32767;
    if (v <= -32768.0f) return -32768;
    return (int16_t)lrintf(v);
}

void nm_audio_wav_header(uint8_t h[NM_WAV_HEADER_BYTES], uint32_t data_bytes, int32_t rate, int32_t channels) {
    // RIFF, fmt (16 bytes, PCM), data.
    memcpy(h, "RIFF", 4);
    put_u32(h + 4, 36 + data_bytes);
    memcpy(h + 8, "WAVEfmt ", 8);
    put_u32(h + 16, 16);
    put_u16(h + 20, 1); // WAVE_FORMAT_PCM
    put_u16(h + 22, (uint32_t)channels);
    put_u32(h + 24, (uint32_t)rate);
    put_u32(h + 28, (uint32_t)rate * (uint32_t)channels * 2); // bytes per second
    put_u16(h + 32, (uint32_t)channels * 2);                  // block align
    put_u16(h + 34, 16);                                      // bits per sample
    memcpy(h + 36, "data", 4);
    put_u32(h + 40, data_bytes);
}

nm_status nm_audio_write_wav(const char *path, const float *pcm, int64_t n_frames, int32_t rate,
                             int32_t channels, char *err, size_t err_size) {
    clear(err, err_size);
    if (!path) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "audio: no path");
    if (n_frames < 0 || (!pcm && n_frames))
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "audio: no samples to write");
    if (channels < 1 || channels > NM_AUDIO_MAX_CHANNELS)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "audio: %d channels (1..%d supported)",
                       (int)channels, NM_AUDIO_MAX_CHANNELS);
    nm_status st = nm_audio_check_rate("sample rate", rate, err, err_size);
    if (st != NM_OK) return st;
    const uint64_t data_bytes = (uint64_t)n_frames * (uint64_t)channels * 2;
    if (data_bytes > 0xffffffffull - 36)
        return nm_fail(NM_ERR_RANGE, err, err_size, "audio: %lld frames do not fit a WAV file (4 GiB)",
                       (long long)n_frames);
    const int64_t n = n_frames * channels;
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(pcm[i]))
            return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "audio: sample %lld to write is %s",
                           (long long)i, isnan(pcm[i]) ? "NaN" : "infinite");
    uint8_t h[NM_WAV_HEADER_BYTES];
    nm_audio_wav_header(h, (uint32_t)data_bytes, rate, channels);
    // Never damages an existing file: a temporary renamed on success, devices
    // and FIFOs in place (core/outfile.h).
    nm_outfile o;
    if ((st = nm_outfile_open(&o, path, err, err_size)) != NM_OK) return st;
    errno = 0;
    bool ok = fwrite(h, 1, sizeof h, o.f) == sizeof h;
    uint8_t buf[8192];
    for (int64_t i = 0; ok && i < n;) {
        size_t k = 0;
        for (; k + 2 <= sizeof buf && i < n; i++, k += 2) put_u16(buf + k, (uint16_t)to_s16(pcm[i]));
        ok = fwrite(buf, 1, k, o.f) == k;
    }
    if (!ok) {
        st = nm_fail(NM_ERR_IO, err, err_size, "%s: write failed: %s", o.is_stdout ? "stdout" : path,
                     strerror(errno ? errno : EIO));
        nm_outfile_abort(&o);
        return st;
    }
    if ((st = nm_outfile_commit(&o, err, err_size)) != NM_OK) return st;
    return NM_OK;
}
