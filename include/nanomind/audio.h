// nanomind's public API, part: audio files: reading, capture, utterances, writing, encoding.
// Included by <nanomind.h> (its conventions, types and visibility apply): include that.
#ifndef NANOMIND_AUDIO_H
#define NANOMIND_AUDIO_H
#ifndef NANOMIND_H
#error "include <nanomind.h>, not its parts"
#endif

// ==== audio files ==========================================================================
// Owner: src/io/audio/ (audio.h has the full contract). Every reader gives
// one shape: mono float PCM at a chosen rate, nominally in [-1, 1]: libsndfile
// opens the container (WAV, FLAC, OGG Vorbis/Opus, AIFF, ...), channels are
// averaged, soxr (HQ) resamples when the rates differ. The writer stores 16-bit
// PCM WAV. Limits are errors, never crashes: rates NM_AUDIO_MIN_RATE..
// NM_AUDIO_MAX_RATE, 1..NM_AUDIO_MAX_CHANNELS channels, at most
// NM_AUDIO_MAX_SECONDS, NaN/inf samples rejected. Statuses: NM_ERR_INVALID_ARG
// (a caller's argument), NM_ERR_IO, NM_ERR_FORMAT (corrupt, truncated, empty),
// NM_ERR_UNSUPPORTED (a format libsndfile does not read), NM_ERR_RANGE, NM_ERR_NOMEM;
// err says which and where.

#define NM_AUDIO_RATE 16000               // Whisper's input rate
#define NM_AUDIO_MIN_RATE 1000            // Hz, inclusive
#define NM_AUDIO_MAX_RATE 384000          // Hz, inclusive
#define NM_AUDIO_MAX_CHANNELS 32
#define NM_AUDIO_MAX_SECONDS (4 * 3600)   // default cap on duration (4 h: 230.4 M samples at 16 kHz)
#define NM_AUDIO_MAX_BUFFER_BYTES (1ull << 30) // stdin / pipes are read whole, up to 1 GiB

// Mono float PCM. pcm is owned: release with nm_audio_free.
typedef struct nm_audio {
    float *pcm;   // (n,) samples
    int64_t n;    // samples (= frames: mono)
    int32_t rate; // Hz
} nm_audio;

// Raw (headerless) PCM sample formats, little-endian, channels interleaved.
typedef enum nm_pcm_format {
    NM_PCM_S16LE = 1, // int16, v / 32768
    NM_PCM_F32LE = 2, // IEEE float32, as is
} nm_pcm_format;

// ---- reading ------------------------------------------------------------------------
//
// target_rate: the output rate (NM_AUDIO_MIN_RATE..NM_AUDIO_MAX_RATE), or <= 0
// to keep the input's own rate. On success *out owns a new buffer of n >= 1
// samples; on failure *out is {NULL, 0, 0} and err says why (see above).

// Decodes a whole audio file held in memory (any container libsndfile opens;
// it is read through sf_open_virtual, no temporary file). data is only read
// during the call.
nm_status nm_audio_decode(const void *data, size_t n, int32_t target_rate, nm_audio *out, char *err,
                          size_t err_size);
// As nm_audio_decode with a cap on the output's samples instead of
// NM_AUDIO_MAX_SECONDS * rate (max_samples <= 0: that default), applied while
// decoding: a header announcing more fails before any sample is decoded, and a
// stream that does not say its length stops at the cap (NM_ERR_RANGE either
// way). A server's limit on an upload (nanomind serve --max-audio); the fuzzer
// uses a small cap to stay fast.
nm_status nm_audio_decode_max(const void *data, size_t n, int32_t target_rate, int64_t max_samples,
                              nm_audio *out, char *err, size_t err_size);

// Reads and decodes a file. A regular file is streamed by libsndfile; "-"
// (stdin), a pipe or another non-seekable file is first read whole (up to
// NM_AUDIO_MAX_BUFFER_BYTES), then decoded as nm_audio_decode does.
nm_status nm_audio_load(const char *path, int32_t target_rate, nm_audio *out, char *err, size_t err_size);

// As nm_audio_load, decoding (and resampling to target_rate, which is
// required) straight into dst, e.g. a TABM slot, so the samples are written
// once where their reader reads them: *n samples. NM_ERR_RANGE when the audio
// needs more than cap samples.
nm_status nm_audio_load_into(const char *path, int32_t target_rate, float *dst, int64_t cap, int64_t *n, char *err,
                             size_t err_size);
// The most samples nm_audio_load_into can write for a regular file at
// target_rate, from its header (to size a buffer first). NM_ERR_UNSUPPORTED
// for stdin, a pipe, or a header without a length.
nm_status nm_audio_probe(const char *path, int32_t target_rate, int64_t *max_samples, char *err, size_t err_size);

// Raw PCM from a buffer: n bytes of interleaved frames of `channels` samples in
// fmt at `rate`. n must be a whole number of frames (>= 1); a partial frame is
// NM_ERR_FORMAT. rate / channels outside the limits are NM_ERR_INVALID_ARG.
nm_status nm_audio_from_raw(const void *data, size_t n, nm_pcm_format fmt, int32_t rate, int32_t channels,
                            int32_t target_rate, nm_audio *out, char *err, size_t err_size);
// Raw PCM from a path or "-" (stdin), streamed in chunks (no size cap beyond
// the duration limit). Same contract as nm_audio_from_raw.
nm_status nm_audio_load_raw(const char *path, nm_pcm_format fmt, int32_t rate, int32_t channels,
                            int32_t target_rate, nm_audio *out, char *err, size_t err_size);

// Resamples n mono samples from rate_in to rate_out (both within the limits;
// equal rates copy) with the settings above. *out is a new buffer of about
// n * rate_out / rate_in samples (soxr's count after flushing its filter,
// within one sample of that; exactly round(n * rate_out / rate_in) in all
// the cases tested). An input too short to give one sample, or NaN/inf, is
// NM_ERR_FORMAT.
nm_status nm_audio_resample(const float *in, int64_t n, int32_t rate_in, int32_t rate_out, nm_audio *out,
                            char *err, size_t err_size);

// Frees a->pcm and zeroes *a. NULL and an empty struct are no-ops.
void nm_audio_free(nm_audio *a);

// ---- microphone capture (ALSA) ------------------------------------------------------

// Called with each captured chunk (mono float at the capture rate, about
// 100 ms), borrowed for the call. Return true to stop capturing.
typedef bool (*nm_audio_capture_cb)(const float *pcm, int64_t n, void *user);

typedef struct nm_audio_capture_params {
    const char *device;      // ALSA PCM name ("default", "hw:1,0", "null", ...); NULL: "default"
    int32_t rate;            // capture rate, NM_AUDIO_MIN_RATE..NM_AUDIO_MAX_RATE (16000)
    nm_pcm_format format;    // what the device is asked for: NM_PCM_S16LE (default) or NM_PCM_F32LE;
                             // the output is float either way
    double seconds;          // stop after this long; <= 0: only on_chunk stops it (then it must be
                             // set), still capped at NM_AUDIO_MAX_SECONDS
    nm_audio_capture_cb on_chunk; // optional, see above
    void *user;              // passed to on_chunk
    bool stream;             // the samples go to on_chunk only (which must be set): *out stays empty,
                             // so a capture may run for hours (seconds <= 0: until on_chunk stops it)
} nm_audio_capture_params;

// device "default", 16 kHz, s16, 5 seconds, no callback.
nm_audio_capture_params nm_audio_capture_default_params(void);

// True when the library was built with ALSA (NM_HAVE_ALSA).
bool nm_audio_capture_available(void);

// Records from an ALSA capture device into *out (mono float at p->rate; a
// device that will not give mono is opened in stereo and averaged). Blocks
// until `seconds` have been captured or on_chunk returns true. Without ALSA:
// NM_ERR_UNSUPPORTED. No such device, or one that refuses the format / rate:
// NM_ERR_IO with ALSA's reason. ALSA's own stderr chatter is silenced while
// the device is opened (a process-wide ALSA setting, restored afterwards).
nm_status nm_audio_capture(const nm_audio_capture_params *p, nm_audio *out, char *err, size_t err_size);

// Playback through ALSA: 16-bit mono at a rate, written as it comes (e.g. the
// TTS brick's slots, in place). Without ALSA: NM_ERR_UNSUPPORTED.
typedef struct nm_audio_player nm_audio_player;
// device: an ALSA PCM name ("default", "hw:0,0", "null"; NULL: "default").
// No such device, or one that refuses mono s16 at `rate`: NM_ERR_IO with ALSA's reason.
nm_status nm_audio_player_open(const char *device, int32_t rate, nm_audio_player **out, char *err,
                               size_t err_size);
// Queues n samples; blocks while the device's buffer is full (so a writer
// goes at the speed of playback). An underrun is recovered from.
nm_status nm_audio_player_write(nm_audio_player *p, const int16_t *pcm, int64_t n, char *err, size_t err_size);
// Waits until everything written has been played.
nm_status nm_audio_player_drain(nm_audio_player *p, char *err, size_t err_size);
void nm_audio_player_close(nm_audio_player *p); // NULL: a no-op

// ---- utterances: where speech starts and ends --------------------------------------
// Cuts a stream of mono samples into utterances (speech between silences),
// as a microphone's questions: an energy detector. A frame is speech when its
// level is threshold_db over the noise floor (the quietest recent frames: the
// floor follows a quieter frame at once and a louder room at 5 dB a second)
// and above min_level_dbfs; an utterance starts after start_frames speech
// frames in a row (with pre_ms of audio before them) and ends after
// end_silence_ms without speech (keeping post_ms of it), or at max_ms.
typedef struct nm_vad_params {
    int32_t rate;           // Hz (16000)
    int32_t frame_ms;       // 20
    float threshold_db;     // 12
    float min_level_dbfs;   // -50
    int32_t start_frames;   // 3
    int32_t end_silence_ms; // 800
    int32_t pre_ms;         // 300
    int32_t post_ms;        // 200
    int32_t max_ms;         // 30000 (Whisper's window)
} nm_vad_params;
nm_vad_params nm_vad_default_params(void);

typedef struct nm_vad nm_vad;
// An utterance: n samples (borrowed for the call) starting at sample t0 of the stream.
typedef void (*nm_vad_fn)(void *user, const float *pcm, int64_t n, int64_t t0);
// NM_ERR_INVALID_ARG (err says which) for a parameter out of range.
nm_status nm_vad_create(const nm_vad_params *p, nm_vad **out, char *err, size_t err_size);
void nm_vad_free(nm_vad *v);
// Feeds n samples: fn is called for each utterance that ends in them.
void nm_vad_push(nm_vad *v, const float *pcm, int64_t n, nm_vad_fn fn, void *user);
// The stream's end: an utterance still open ends here.
void nm_vad_flush(nm_vad *v, nm_vad_fn fn, void *user);
// Samples fed so far, and whether an utterance is open now.
int64_t nm_vad_position(const nm_vad *v);
bool nm_vad_in_speech(const nm_vad *v);

// ---- writing ------------------------------------------------------------------------

// The canonical 44-byte header of a 16-bit PCM WAV file (RIFF/WAVE,
// WAVE_FORMAT_PCM) whose data chunk holds data_bytes (<= 4 GiB - 37).
#define NM_WAV_HEADER_BYTES 44
void nm_audio_wav_header(uint8_t h[NM_WAV_HEADER_BYTES], uint32_t data_bytes, int32_t rate, int32_t channels);

// Writes n_frames frames of `channels` interleaved floats (pcm holds
// n_frames * channels values) as a 16-bit PCM WAV file (that header). path "-"
// writes to stdout; an existing file is replaced only once the new one is
// complete, a device or FIFO is written in place (core/outfile.h). Samples are clamped to
// the 16-bit range (see the top of this file); NaN/inf are NM_ERR_INVALID_ARG;
// a data chunk over 4 GiB is NM_ERR_RANGE; n_frames 0 writes a valid empty file.
nm_status nm_audio_write_wav(const char *path, const float *pcm, int64_t n_frames, int32_t rate,
                             int32_t channels, char *err, size_t err_size);

// A streamed encoder of 16-bit mono PCM into a compressed file's bytes,
// handed to a sink as they are made (an answer sent while it is spoken):
// FLAC (lossless), MP3 (LAME) and Opus in Ogg, through libsndfile. A
// stream's encoder cannot seek back, so a FLAC stream's header has no length
// (readers take it as unknown), as with any streamed FLAC.
typedef enum nm_audio_container {
    NM_AUDIO_FLAC = 1,
    NM_AUDIO_MP3 = 2,
    NM_AUDIO_OPUS = 3, // 8, 12, 16, 24 or 48 kHz only (Opus's rates)
} nm_audio_container;
// "flac", "mp3", "opus" (also "ogg"); false for another name.
bool nm_audio_container_parse(const char *name, nm_audio_container *out);
const char *nm_audio_container_name(nm_audio_container c);  // "flac", "mp3", "opus"; "?" for another value
const char *nm_audio_container_mime(nm_audio_container c);  // "audio/flac", "audio/mpeg", "audio/ogg"
// The encoder's bytes: n of them at `bytes` (borrowed during the call). false: stop (the client went).
typedef bool (*nm_audio_bytes_fn)(const void *bytes, size_t n, void *user);
typedef struct nm_audio_encoder nm_audio_encoder;
// An encoder of `rate` Hz mono (1..384000; Opus: its rates) into sink.
// NM_ERR_UNSUPPORTED when this build's libsndfile cannot write the
// container (err says which); *out freed with nm_audio_encoder_close.
nm_status nm_audio_encoder_open(nm_audio_container c, int32_t rate, nm_audio_bytes_fn sink, void *user,
                                nm_audio_encoder **out, char *err, size_t err_size);
// Encodes n samples (the encoder may hold some back until it has a frame).
// NM_ERR_IO when the sink said stop or the encoder failed (nm_audio_encoder_error).
nm_status nm_audio_encoder_write(nm_audio_encoder *e, const int16_t *pcm, int64_t n);
// Flushes what it holds into the sink and frees e. NM_ERR_IO as write. NULL: NM_OK.
nm_status nm_audio_encoder_close(nm_audio_encoder *e);
const char *nm_audio_encoder_error(const nm_audio_encoder *e); // "" if none

#endif
