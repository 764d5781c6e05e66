// nanomind transcribe: speech to text with a Whisper model (our GGUF or
// whisper.cpp's ggml .bin). The decoding follows whisper.cpp's whisper-cli
// (src/bricks/stt/transcribe.h), so the same model, file and options give the
// same transcript. The audio goes to the STT brick as one PCM slot of a TABM
// ring, which the brick reads in place.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bricks/audio/audio.h"
#include "bricks/stt/transcribe.h"
#include "bricks/stt/whisper_model.h"
#include "cli.h"
#include "core/threadpool.h"

static void transcribe_usage(void) {
    printf("usage: nanomind transcribe -m MODEL AUDIO [options]\n"
           "\n"
           "Transcribes AUDIO (WAV, FLAC, OGG, ...; any rate and channel count, resampled to 16 kHz\n"
           "mono; \"-\" reads stdin) with a Whisper model and prints the transcript to stdout.\n"
           "Decoding follows whisper.cpp's whisper-cli: the same model, audio and options give the\n"
           "same text (`nanomind transcribe` = `whisper-cli -nt`, `--timestamps` = `whisper-cli`).\n"
           "\n"
           "  -m, --model FILE       Whisper model: nanomind GGUF or whisper.cpp ggml-*.bin\n"
           "  -t, --threads N        threads (default: all cores)\n"
           "  -l, --language LANG    spoken language (en, de, fr, ..., or auto; default en).\n"
           "                         English-only models (*.en) always transcribe English\n"
           "  --translate            translate to English (multilingual models)\n"
           "  --timestamps           decode with timestamps; print [HH:MM:SS.mmm --> HH:MM:SS.mmm] per segment\n"
           "  --output-txt           plain text, a segment per line (default)\n"
           "  --output-srt           SubRip subtitles (decodes with timestamps)\n"
           "  --output-json          JSON: language, duration, segments with t0/t1 (seconds), text,\n"
           "                         avg_logprob, no_speech_prob, temperature, token ids (decodes with timestamps)\n"
           "  --beam-size N          beam search with N hypotheses (default 5, as whisper-cli; 1 = greedy)\n"
           "  --best-of N            sequences sampled at temperatures > 0 (default 5)\n"
           "  --temp T               first temperature (default 0)\n"
           "  --temp-inc T           fallback increment (default 0.2)\n"
           "  --no-fallback          no temperature fallback\n"
           "  --max-context N        previous-text tokens carried between windows (default: up to 224; 0: none)\n"
           "  --suppress-nst         suppress non-speech symbols (whisper.cpp's list)\n"
           "  --offset-ms N          start at N ms\n"
           "  --duration-ms N        transcribe N ms (default: to the end)\n"
           "  --stats                print load, mel, encode and decode times, the real-time factor and\n"
           "                         the bytes copied between bricks to stderr\n"
           "  -h, --help             this help\n");
}

typedef enum { OUT_TXT, OUT_SRT, OUT_JSON } out_fmt;

static void print_live(const nm_transcript *t, int32_t i0, void *user) {
    const bool *timestamps = user;
    char a[32], b[32];
    for (int32_t i = i0; i < t->n_seg; i++) {
        if (*timestamps) {
            nm_stt_timestamp(t->seg[i].t0, false, a);
            nm_stt_timestamp(t->seg[i].t1, false, b);
            printf("[%s --> %s]  ", a, b);
        }
        const char *s = t->seg[i].text;
        if (!*timestamps)
            while (*s == ' ' || *s == '\t') s++; // as whisper-cli -otxt writes it
        printf("%s\n", s);
    }
    fflush(stdout);
}

int cmd_transcribe(int argc, char **argv) {
    const char *model = NULL, *audio = NULL, *lang = "en";
    int32_t n_threads = 0, beam = 5, best_of = 5, max_ctx = -1, offset_ms = 0, duration_ms = 0;
    float temp = 0.0f, temp_inc = 0.2f;
    bool timestamps = false, stats = false, translate = false, suppress_nst = false;
    out_fmt fmt = OUT_TXT;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true, takes = true;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "-l") || !strcmp(a, "--language")) lang = v;
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) ok = cli_arg_int(a, v, 1, 4 * nm_cpu_count(), &n_threads);
        else if (!strcmp(a, "--beam-size") || !strcmp(a, "-bs")) ok = cli_arg_int(a, v, 1, NM_STT_MAX_DECODERS, &beam);
        else if (!strcmp(a, "--best-of") || !strcmp(a, "-bo")) ok = cli_arg_int(a, v, 1, NM_STT_MAX_DECODERS, &best_of);
        else if (!strcmp(a, "--temp")) ok = cli_arg_float(a, v, 0.0f, 1.0f, &temp);
        else if (!strcmp(a, "--temp-inc")) ok = cli_arg_float(a, v, 0.0f, 1.0f, &temp_inc);
        else if (!strcmp(a, "--max-context")) ok = cli_arg_int(a, v, 0, 1 << 20, &max_ctx);
        else if (!strcmp(a, "--offset-ms")) ok = cli_arg_int(a, v, 0, 2147483647, &offset_ms);
        else if (!strcmp(a, "--duration-ms")) ok = cli_arg_int(a, v, 0, 2147483647, &duration_ms);
        else {
            takes = false;
            if (!strcmp(a, "--timestamps")) timestamps = true;
            else if (!strcmp(a, "--output-txt")) fmt = OUT_TXT;
            else if (!strcmp(a, "--output-srt")) fmt = OUT_SRT;
            else if (!strcmp(a, "--output-json")) fmt = OUT_JSON;
            else if (!strcmp(a, "--no-fallback")) temp_inc = 0.0f;
            else if (!strcmp(a, "--translate")) translate = true;
            else if (!strcmp(a, "--suppress-nst")) suppress_nst = true;
            else if (!strcmp(a, "--stats")) stats = true;
            else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
                transcribe_usage();
                return 0;
            } else if ((a[0] != '-' || !strcmp(a, "-")) && !audio) audio = a;
            else {
                fprintf(stderr, "error: unknown option '%s' (nanomind transcribe --help)\n", a);
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
    if (!model || !audio) {
        fprintf(stderr, "error: %s\nusage: nanomind transcribe -m MODEL AUDIO [options] (--help for more)\n",
                !model ? "no model (-m)" : "no audio file (a path, or - for stdin)");
        return 2;
    }

    int rc = 1;
    char err[512] = "";
    nm_whisper_model *m = NULL;
    nm_transcriber *tr = NULL;
    nm_audio pcm = {0};
    nm_tabm *ring = NULL;
    nm_ledger *ledger = NULL;
    nm_transcript out = {0};

    double t0 = cli_now();
    nm_status st = nm_whisper_model_load(model, &m, err, sizeof err);
    if (st != NM_OK) {
        fprintf(stderr, "error: cannot load '%s': %s: %s\n", model, nm_status_str(st), err);
        goto done;
    }
    const double t_load = cli_now() - t0;

    // Language: a known code, "auto" (multilingual models), English for .en models.
    if (strcmp(lang, "auto") && nm_stt_lang_id(m, lang) < 0) {
        fprintf(stderr, "error: unknown language '%s' (a code such as en, de, fr, es, ja, or auto)\n", lang);
        rc = 2;
        goto done;
    }
    if (!nm_whisper_is_multilingual(m)) {
        if (strcmp(lang, "en") && strcmp(lang, "auto"))
            fprintf(stderr, "warning: %s is an English-only model: transcribing as English, not '%s'\n", m->name,
                    lang);
        if (translate) fprintf(stderr, "warning: %s is an English-only model: --translate ignored\n", m->name);
        lang = "en";
        translate = false;
    }

    t0 = cli_now();
    st = nm_audio_load(audio, NM_AUDIO_RATE, &pcm, err, sizeof err);
    if (st != NM_OK) {
        fprintf(stderr, "error: cannot read audio '%s': %s: %s\n", audio, nm_status_str(st), err);
        goto done;
    }
    const double t_audio = cli_now() - t0;

    int32_t n_dec = beam > best_of ? beam : best_of;
    if ((st = nm_transcriber_create(m, n_threads, n_dec, &tr, err, sizeof err)) != NM_OK) {
        fprintf(stderr, "error: cannot set up the transcriber: %s: %s\n", nm_status_str(st), err);
        goto done;
    }

    // The PCM goes to the brick as one slot (Whisper's spectrogram is
    // normalised over the whole recording, so the brick needs all of it).
    const size_t bytes = sizeof(float) * (size_t)pcm.n;
    if ((st = nm_tabm_create(NULL, 1, bytes, &ring, err, sizeof err)) != NM_OK) {
        fprintf(stderr, "error: cannot create the PCM ring (%zu bytes): %s: %s\n", bytes, nm_status_str(st), err);
        goto done;
    }
    ledger = nm_ledger_create();
    const int ep_audio = ledger ? nm_ledger_endpoint(ledger, "audio-decoder") : -1;
    const int ep_stt = ledger ? nm_ledger_endpoint(ledger, "stt") : -1;
    nm_tabm_slot sl;
    if (!ledger || ep_audio < 0 || ep_stt < 0 || (st = nm_tabm_acquire_write(ring, 0, -1, &sl)) != NM_OK) {
        fprintf(stderr, "error: the PCM ring: %s\n", ledger ? nm_tabm_last_error(ring) : "out of memory");
        goto done;
    }
    // The decoder (libsndfile + soxr) wrote its own buffer: one counted copy
    // into the slot. From here the brick reads the slot in place.
    nm_ledger_copy(ledger, ep_audio, ep_stt, sl.data, pcm.pcm, bytes);
    sl.meta->kind = NM_TABM_PCM_F32;
    sl.meta->ndim = 2;
    sl.meta->shape[0] = pcm.n;
    sl.meta->shape[1] = 1;
    sl.meta->size = bytes;
    sl.meta->sample_rate = NM_AUDIO_RATE;
    if ((st = nm_tabm_publish(ring, &sl)) != NM_OK) {
        fprintf(stderr, "error: the PCM ring: %s (%s)\n", nm_status_str(st), nm_tabm_last_error(ring));
        nm_tabm_cancel(ring, &sl);
        goto done;
    }
    const int64_t n_samples = pcm.n;
    nm_audio_free(&pcm);

    nm_stt_params p = nm_stt_default_params(beam > 1 ? NM_STT_BEAM : NM_STT_GREEDY);
    p.beam_size = beam;
    p.best_of = best_of;
    p.language = lang;
    p.translate = translate;
    p.temperature = temp;
    p.temperature_inc = temp_inc;
    p.suppress_nst = suppress_nst;
    p.offset_ms = offset_ms;
    p.duration_ms = duration_ms;
    if (max_ctx >= 0) p.n_max_text_ctx = max_ctx;
    // Text without --timestamps decodes as whisper-cli -nt; SRT and JSON need the times.
    p.no_timestamps = fmt == OUT_TXT && !timestamps;
    bool live_ts = timestamps;
    if (fmt == OUT_TXT) {
        p.on_segments = print_live; // printed as each 30 s window finishes
        p.user = &live_ts;
    }

    t0 = cli_now();
    st = nm_transcribe_slot(tr, ring, -1, &p, &out, err, sizeof err);
    const double t_run = cli_now() - t0;
    if (st != NM_OK) {
        fprintf(stderr, "error: transcription failed: %s: %s\n", nm_status_str(st), err);
        rc = st == NM_ERR_INVALID_ARG ? 2 : 1;
        goto done;
    }
    bool wrote = true;
    if (fmt == OUT_SRT) wrote = nm_transcript_write_srt(&out, stdout);
    else if (fmt == OUT_JSON) wrote = nm_transcript_write_json(&out, m, stdout);
    fflush(stdout);
    if (!wrote || ferror(stdout)) {
        fprintf(stderr, "error: cannot write the transcript to stdout\n");
        goto done;
    }

    if (stats) {
        const nm_stt_timings tm = nm_transcriber_timings(tr);
        const double secs = (double)n_samples / NM_AUDIO_RATE;
        fprintf(stderr, "model: %s (%s), %d+%d layers, d %d, load %.3f s\n", m->name,
                m->format == NM_WHISPER_GGUF ? "gguf" : "ggml .bin", m->hp.n_audio_layer, m->hp.n_text_layer,
                m->hp.n_audio_state, t_load);
        fprintf(stderr, "audio: %.2f s (%lld samples at 16 kHz), read + resample %.3f s\n", secs,
                (long long)n_samples, t_audio);
        fprintf(stderr, "mel: %.3f s\n", tm.t_mel);
        fprintf(stderr, "encode: %.3f s (%lld windows, %.1f ms each)\n", tm.t_encode, (long long)tm.n_encode,
                tm.n_encode ? 1e3 * tm.t_encode / (double)tm.n_encode : 0.0);
        fprintf(stderr, "decode: %.3f s (%lld calls, %lld tokens), sampling %.3f s, %d fallbacks\n", tm.t_decode,
                (long long)tm.n_decode_calls, (long long)tm.n_decode_tokens, tm.t_sample, out.n_fallbacks);
        fprintf(stderr, "transcribe: %.3f s for %.2f s of audio: real-time factor %.3f (%.1fx real time)\n", t_run,
                secs, secs > 0 ? t_run / secs : 0.0, t_run > 0 ? secs / t_run : 0.0);
        char led[1024];
        if (nm_ledger_format(ledger, led, sizeof led) > 0) fputs(led, stderr);
        fprintf(stderr, "(the decoded audio is written once into the PCM slot; the STT brick reads the slot in place)\n");
        fprintf(stderr, "peak RSS: %.1f MiB\n", cli_peak_rss_kb() / 1024.0);
    }
    rc = 0;
done:
    nm_transcript_free(&out);
    nm_tabm_free(ring);
    nm_ledger_free(ledger);
    nm_audio_free(&pcm);
    nm_transcriber_free(tr);
    nm_whisper_model_free(m);
    return rc;
}
