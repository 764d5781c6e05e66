// nanomind say: text to speech into a WAV file, through a pipeline of the TTS
// brick alone (nm_pipeline: the brick on its lane, the text its request).
//
// The speech comes as AUDIO events, each the samples of a slot of the TTS
// brick's output ring, lent until the next read: this thread writes them to
// the file straight from the slot (no intermediate buffer). The ledger
// (--stats) counts what is copied: the text into the brick's slot and into
// espeak-ng's input, and its samples out of espeak-ng's buffer (it allocates
// them itself), nothing else. The WAV header is the audio module's
// (nm_audio_wav_header); its two sizes are filled in once the utterance has
// ended. The file is a temporary beside OUT, renamed over it on success, so a
// failure never damages an existing OUT (core/outfile.h). Where OUT cannot
// seek (stdout, a FIFO, a device) the audio is held until the end, then the
// header and the samples are written in place.
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

// The slots' int16 samples go to the file as they lie in memory; WAV is little-endian.
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "cmd_say writes host-order samples as WAV");


static void say_usage(void) {
    printf("usage: nanomind say \"TEXT\" (-o OUT.wav | --stdout) [options]\n"
           "\n"
           "Speaks TEXT with espeak-ng or a Piper voice (--tts piper) and writes 16-bit mono PCM WAV (or MP3,\n"
           "Opus, FLAC: --format).\n"
           "TEXT \"-\" reads stdin.\n"
           "The same text and options give the same file.\n"
           "\n"
           "  -o, -w, --output FILE  the WAV file to write (\"-\" or /dev/stdout: stdout); an existing file\n"
           "                         is replaced only once the new one is complete\n"
           "  --stdout               write the WAV to stdout (as espeak-ng --stdout; = -o -)\n"
           "  --output-raw           raw 16-bit mono samples, no header, to stdout (as Piper --output-raw;\n"
           "                         --stats prints the rate)\n"
           "  --format F             wav (default), mp3, opus (Ogg; 8/12/16/24/48 kHz: see --sample-rate)\n"
           "                         or flac; by default the output's extension (.mp3, .opus, .ogg, .flac)\n"
           "                         says which\n"
           "  -f, --file FILE        read the text from FILE (\"-\": stdin) instead of TEXT\n"
           "  --tts ENGINE           espeak-ng (default: formant voices) or piper (neural voices: a Piper voice\n"
           "                         converted to GGUF, docs/piper.md)\n"
           "  --voice V              espeak-ng: a language (en-us, en, en-gb, de, fr-fr, ...) or a voice file,\n"
           "                         with an optional variant (en-us+f3); default en-us. piper: a voice GGUF, or\n"
           "                         the name of one in the model folder (default en_US-joe-medium)\n"
           "  -m, --model FILE       a Piper voice GGUF (as Piper's -m; implies --tts piper)\n"
           "  -dev, --device DEV     piper: where the decoder (HiFi-GAN, most of the work) runs: cpu (default),\n"
           "                         opencl, opencl:N, opencl:auto or auto (OpenCL's GPU where there is one)\n"
           "  --rate WPM             speaking rate, words per minute (80..450, default 175)\n"
           "  --speed X              speaking speed, a factor of the rate (0.46..2.57: 80..450 wpm)\n"
           "  --pitch P              base pitch, 0..100 (default 50; espeak-ng only)\n"
           "  --volume V             volume in percent, 0..200 (default 100; piper: of each sentence normalized\n"
           "                         to its peak, as piper-tts)\n"
           "  --length-scale X       piper: the phonemes' lengths (0.05..20, larger is slower; default the voice's)\n"
           "  --noise-scale X        piper: the voice's variation (0..5; default the voice's, 0.667 for most)\n"
           "  --noise-w X            piper: the durations' variation (0..5; default the voice's, 0.8 for most)\n"
           "  --stream-ms N          piper: a long sentence's first N ms are made and written first (the same\n"
           "                         samples, scaled by that part's peak; default 0: each sentence whole)\n"
           "  --sample-rate HZ       output rate (default: the voice's, 22050 Hz for most; others resampled with\n"
           "                         soxr)\n"
           "  --list-voices          list the voices (name for --voice, description, id) and exit\n"
           "  --stats                print synthesis time, audio length, real-time factor and the bytes\n"
           "                         copied between bricks to stderr\n"
           "  -h, --help             this help\n");
}

static bool print_voice(void *user, const nm_tts_voice_info *v) {
    (void)user;
    printf("%-24s %-32s %s\n", v->name, v->description, v->identifier);
    return true;
}

// The encoder's bytes into the output file.
static bool to_file(const void *bytes, size_t n, void *user) { return fwrite(bytes, 1, n, (FILE *)user) == n; }

static void put_u32le(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16), p[3] = (uint8_t)(v >> 24);
}

int cmd_say(int argc, char **argv) {
    const char *text_arg = NULL, *file = NULL, *out = NULL, *format = NULL;
    bool list = false, stats = false, raw = false;
    nm_tts_params p = nm_tts_default_params();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true, takes = true;
        if (!strcmp(a, "-o") || !strcmp(a, "-w") || !strcmp(a, "--output")) out = v;
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) file = v;
        else if (!strcmp(a, "--voice")) p.voice = v;
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) p.voice = v, p.engine = "piper";
        else if (!strcmp(a, "-dev") || !strcmp(a, "--device")) p.device = v;
        else if (!strcmp(a, "--tts")) {
            ok = v && (!strcmp(v, "piper") || !strcmp(v, "espeak-ng") || !strcmp(v, "espeak"));
            if (v && !ok) fprintf(stderr, "error: --tts takes espeak-ng or piper, not '%s'\n", v);
            p.engine = v && !strcmp(v, "piper") ? "piper" : "espeak-ng";
        } else if (!strcmp(a, "--speed")) {
            float x = 1;
            ok = cli_arg_float(a, v, 0.46f, 2.57f, &x);
            p.rate_wpm = (int32_t)lroundf(175.0f * x);
        } else if (!strcmp(a, "--length-scale")) ok = cli_arg_float(a, v, 0.05f, 20, &p.length_scale);
        else if (!strcmp(a, "--noise-scale")) ok = cli_arg_float(a, v, 0, 5, &p.noise_scale);
        else if (!strcmp(a, "--noise-w")) ok = cli_arg_float(a, v, 0, 5, &p.noise_w);
        else if (!strcmp(a, "--stream-ms")) ok = cli_arg_int(a, v, 0, 60000, &p.stream_ms);
        else if (!strcmp(a, "--format")) format = v;
        else if (!strcmp(a, "--rate")) ok = cli_arg_int(a, v, 80, 450, &p.rate_wpm);
        else if (!strcmp(a, "--pitch")) ok = cli_arg_int(a, v, 0, 100, &p.pitch);
        else if (!strcmp(a, "--volume")) ok = cli_arg_int(a, v, 0, 200, &p.volume);
        else if (!strcmp(a, "--sample-rate")) ok = cli_arg_int(a, v, NM_AUDIO_MIN_RATE, NM_AUDIO_MAX_RATE, &p.sample_rate);
        else {
            takes = false;
            if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
                say_usage();
                return 0;
            } else if (!strcmp(a, "--list-voices")) list = true;
            else if (!strcmp(a, "--stats")) stats = true;
            else if (!strcmp(a, "--stdout")) out = "-";
            else if (!strcmp(a, "--output-raw")) out = "-", raw = true;
            else if ((a[0] != '-' || !strcmp(a, "-")) && !text_arg) text_arg = a;
            else if (a[0] != '-') {
                fprintf(stderr, "error: more than one text argument ('%s'); quote the text\n", a);
                return 2;
            } else {
                fprintf(stderr, "error: unknown option '%s'\n", a);
                return 2;
            }
        }
        if (takes) {
            if (!v) {
                fprintf(stderr, "error: %s needs a value\n", a);
                return 2;
            }
            if (!ok) return 2;
            i++;
        }
    }

    char err[512] = "";
    if (list) {
        nm_status st = nm_tts_list_voices(p.engine, p.data_dir, print_voice, NULL, err, sizeof err);
        if (st != NM_OK) {
            fprintf(stderr, "error: cannot list voices: %s: %s\n", nm_status_str(st), err);
            return 1;
        }
        return 0;
    }
    if (text_arg && file) {
        fprintf(stderr, "error: give the text or -f FILE, not both\n");
        return 2;
    }
    if (!text_arg && !file) {
        fprintf(stderr, "error: no text: give \"TEXT\", - (stdin) or -f FILE (see nanomind say --help)\n");
        return 2;
    }
    if (!out) {
        fprintf(stderr, "error: no output: give -o OUT.wav or --stdout\n");
        return 2;
    }

    // The container: --format, else the output's extension; WAV otherwise.
    nm_audio_container container = 0;
    const char *dot = strrchr(out, '.');
    if (format && strcmp(format, "wav") && (!nm_audio_container_parse(format, &container) || raw)) {
        fprintf(stderr, raw ? "error: --output-raw writes raw samples: drop --format\n"
                            : "error: --format takes wav, mp3, opus or flac, not '%s'\n", format);
        return 2;
    }
    if (!format && !raw && dot && !strchr(dot, '/')) nm_audio_container_parse(dot + 1, &container);
    if (container == NM_AUDIO_OPUS && p.sample_rate == 0) p.sample_rate = 24000; // espeak-ng's 22050 is no Opus rate

    // The text.
    char *owned = NULL;
    const char *text = text_arg;
    const char *src = file ? file : (!strcmp(text_arg, "-") ? "-" : NULL);
    if (src) {
        char ferr[512];
        if (nm_infile_read(src, 4ull * NM_TTS_MAX_TEXT, NM_INFILE_STDIN | NM_INFILE_STREAM, &owned, NULL, ferr,
                           sizeof ferr) != NM_OK) {
            fprintf(stderr, "error: cannot read the text: %s\n", ferr);
            return 1;
        }
        text = owned;
    }
    bool blank = true;
    for (const char *c = text; *c && blank; c++) blank = *c == ' ' || (*c >= '\t' && *c <= '\r');
    if (blank) {
        fprintf(stderr, "error: empty text: nothing to say\n");
        free(owned);
        return 1;
    }

    int rc = 1;
    nm_ledger *ledger = nm_ledger_create();
    nm_pipeline *P = NULL;
    nm_brick *brick = NULL;
    nm_outfile wav = {0};
    nm_audio_encoder *enc = NULL; // --format mp3, opus, flac
    uint8_t *held = NULL; // the samples, where the output cannot seek
    size_t n_held = 0, cap_held = 0;
    nm_status st;
    double t0 = cli_now();
    if (!ledger || nm_ledger_endpoint(ledger, "wav") < 0) {
        fprintf(stderr, "error: out of memory\n");
        goto done;
    }
    nm_brick_params bp = nm_brick_default_params(NM_BRICK_TTS);
    bp.tts = p;
    nm_pipeline_params pp = nm_pipeline_default_params(); // a voice alone
    pp.tts = &bp;
    pp.ledger = ledger;
    if ((st = nm_pipeline_create(&pp, &P, err, sizeof err)) != NM_OK) {
        fprintf(stderr, "error: %s: %s\n", nm_status_str(st), err);
        goto done;
    }
    brick = nm_pipeline_brick(P, NM_BRICK_TTS);
    // The output first: an unwritable path fails before any synthesis.
    if ((st = nm_outfile_open(&wav, out, err, sizeof err)) != NM_OK) {
        fprintf(stderr, "error: %s\n", err);
        goto done;
    }
    if (container && (st = nm_audio_encoder_open(container, nm_brick_tts_sample_rate(brick), to_file, wav.f, &enc, err,
                                                 sizeof err)) != NM_OK) {
        fprintf(stderr, "error: %s\n", err);
        goto done;
    }
    uint8_t hdr[NM_WAV_HEADER_BYTES];
    nm_audio_wav_header(hdr, 0, nm_brick_tts_sample_rate(brick), 1);
    errno = 0;
    if (!raw && !enc && wav.seekable && fwrite(hdr, 1, sizeof hdr, wav.f) != sizeof hdr) {
        fprintf(stderr, "error: cannot write '%s': %s\n", out, strerror(errno ? errno : EIO));
        goto done;
    }
    uint64_t id = 0;
    if ((st = nm_pipeline_submit(P, &(nm_pipeline_input){.text = text}, &id, err, sizeof err)) != NM_OK) {
        fprintf(stderr, "error: %s: %s\n", nm_status_str(st), err);
        goto done;
    }
    nm_pipeline_close(P); // the one request
    uint64_t data_bytes = 0;
    bool write_failed = false, ended = false;
    double first_audio = 0; // the request's first speech, seconds after its submit
    nm_status said = NM_OK; // the request's end
    char why[512] = "";
    int write_errno = 0;
    while (!ended) {
        nm_pipeline_event ev;
        if (nm_pipeline_read(P, -1, &ev) != NM_OK) break;
        if (ev.kind == NM_PIPELINE_DONE) {
            ended = true;
            said = ev.status;
            first_audio = ev.t.first_audio;
            snprintf(why, sizeof why, "%s", ev.text);
            continue;
        }
        if (ev.kind != NM_PIPELINE_AUDIO) continue;
        const uint64_t size = sizeof(int16_t) * (uint64_t)ev.n_samples; // the TTS ring's slot, lent until the next read
        if (!write_failed && size) {
            // The slot's bytes, in place, to the file (or held, where it cannot seek), or to the encoder.
            if (enc) {
                errno = 0;
                if (nm_audio_encoder_write(enc, ev.pcm, (int64_t)(size / 2)) != NM_OK) {
                    write_failed = true;
                    write_errno = errno ? errno : EIO;
                    nm_pipeline_cancel(P, id);
                }
            } else if (wav.seekable || raw) { // raw samples need no header to complete: straight out
                errno = 0;
                if (fwrite(ev.pcm, 1, (size_t)size, wav.f) != size) {
                    write_failed = true;
                    write_errno = errno ? errno : EIO;
                    nm_pipeline_cancel(P, id); // stop the synthesis: nowhere to put it
                }
            } else {
                if (n_held + size > cap_held) {
                    size_t cap = cap_held ? cap_held * 2 : 1 << 20;
                    while (cap < n_held + size) cap *= 2;
                    uint8_t *nb = realloc(held, cap);
                    if (!nb) {
                        write_failed = true;
                        write_errno = ENOMEM;
                        nm_pipeline_cancel(P, id);
                    } else {
                        held = nb;
                        cap_held = cap;
                    }
                }
                if (!write_failed) {
                    memcpy(held + n_held, ev.pcm, (size_t)size);
                    n_held += (size_t)size;
                }
            }
            data_bytes += size;
        }
    }
    double t_total = cli_now() - t0;
    if (write_failed) {
        fprintf(stderr, "error: cannot write '%s': %s\n", out, strerror(write_errno));
        goto done;
    }
    if (said != NM_OK || !ended) {
        fprintf(stderr, "error: synthesis failed: %s: %s\n", nm_status_str(ended ? said : NM_ERR_IO), why);
        goto done;
    }
    if (!enc && data_bytes > 0xffffffffull - 36) {
        fprintf(stderr, "error: %llu bytes of audio do not fit a WAV file (4 GiB)\n", (unsigned long long)data_bytes);
        goto done;
    }
    errno = 0;
    bool ok;
    if (enc) {
        ok = nm_audio_encoder_close(enc) == NM_OK; // its last frames
        enc = NULL;
    } else if (raw) {
        ok = true; // the samples are out already
    } else if (wav.seekable) { // the two sizes, now known
        uint8_t sz[4];
        put_u32le(sz, (uint32_t)(36 + data_bytes));
        ok = fseek(wav.f, 4, SEEK_SET) == 0 && fwrite(sz, 1, 4, wav.f) == 4;
        put_u32le(sz, (uint32_t)data_bytes);
        ok = ok && fseek(wav.f, 40, SEEK_SET) == 0 && fwrite(sz, 1, 4, wav.f) == 4;
    } else {
        nm_audio_wav_header(hdr, (uint32_t)data_bytes, nm_brick_tts_sample_rate(brick), 1);
        ok = fwrite(hdr, 1, sizeof hdr, wav.f) == sizeof hdr && fwrite(held, 1, n_held, wav.f) == n_held;
    }
    if (!ok) {
        fprintf(stderr, "error: cannot write '%s': %s\n", out, strerror(errno ? errno : EIO));
        goto done;
    }
    if ((st = nm_outfile_commit(&wav, err, sizeof err)) != NM_OK) {
        fprintf(stderr, "error: %s\n", err);
        goto done;
    }
    rc = 0;
    if (stats) {
        nm_pipeline_brick_report tr;
        nm_pipeline_brick_stats(P, NM_BRICK_TTS, &tr);
        const nm_brick_stats bs = tr.s;
        int32_t rate = nm_brick_tts_sample_rate(brick);
        double audio_s = (double)bs.n_samples / rate;
        fprintf(stderr, "voice: %s (%s on %s), %d wpm, %d Hz%s\n", p.voice ? p.voice : "default",
                nm_brick_tts_engine(brick), tr.device, (int)p.rate_wpm, (int)rate,
                rate != nm_brick_tts_native_rate(brick) ? " (resampled)" : "");
        fprintf(stderr, "synthesis: %.3f s for %.3f s of audio (real-time factor %.4f), %llu slots\n", bs.t_busy,
                audio_s, audio_s > 0 ? bs.t_busy / audio_s : 0.0, (unsigned long long)bs.n_out_slots);
        fprintf(stderr, "first audio: %.3f s after the text was given\n", first_audio);
        fprintf(stderr, "total: %.3f s (open, synthesis, file)\n", t_total);
        char led[1024];
        if (nm_ledger_format(ledger, led, sizeof led) > 0) fputs(led, stderr);
        fprintf(stderr, "peak RSS: %.1f MiB\n", cli_peak_rss_kb() / 1024.0);
    }
done:
    nm_audio_encoder_close(enc); // (a failure's: what it held goes into the temporary, which goes)
    nm_outfile_abort(&wav); // after a commit, nothing; else only our temporary goes
    free(held);
    nm_pipeline_free(P);
    nm_ledger_free(ledger);
    free(owned);
    return rc;
}
