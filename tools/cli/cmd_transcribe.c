// nanomind transcribe: speech to text with a Whisper model (our GGUF or
// whisper.cpp's ggml .bin). The decoding follows whisper.cpp's whisper-cli
// (src/bricks/stt/transcribe.h), so the same model, file and options give the
// same transcript. A client of nm_pipeline with the STT brick alone: each
// file is a request, decoded into the brick's PCM slot, which the brick reads
// in place on its lane; its segments come back as TRANSCRIPT events, printed
// as they arrive, and the whole transcript (tokens, probabilities) is the
// brick's for the output files.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#include <cjson/cJSON.h>

#include "cli.h"

static void transcribe_usage(void) {
    printf("usage: nanomind transcribe -m MODEL AUDIO... [options]      (AUDIO: a path, - for stdin, or -f FILE)\n"
           "\n"
           "Transcribes each AUDIO (WAV, FLAC, OGG, ...; any rate and channel count, resampled to 16 kHz\n"
           "mono) with a Whisper model and prints the transcript to stdout. Decoding follows whisper.cpp's\n"
           "whisper-cli: the same model, audio and options give the same text (`nanomind transcribe` =\n"
           "`whisper-cli`, timestamps printed; `-nt` = `whisper-cli -nt`). Flags take whisper-cli's short forms.\n"
           "\n"
           "  -m, --model FILE         Whisper model: nanomind GGUF or whisper.cpp ggml-*.bin\n"
           "  -f, --file FILE          an audio file (repeatable; positional paths work too)\n"
           "  -t, --threads N          threads (default: all cores)\n"
           "  -l, --language LANG      spoken language (en, de, fr, ..., or auto; default en).\n"
           "                           English-only models (*.en) always transcribe English\n"
           "  -tr, --translate         translate to English (multilingual models)\n"
           "  --timestamps             print [HH:MM:SS.mmm --> HH:MM:SS.mmm] per segment (the default, as\n"
           "                           whisper-cli's; decoded with timestamps, as the library's STT brick does)\n"
           "  -nt, --no-timestamps     plain text, decoded without timestamps (whisper-cli -nt)\n"
           "  -bs, --beam-size N       beam search with N hypotheses (default 5, as whisper-cli; 1 = greedy)\n"
           "  -bo, --best-of N         sequences sampled at temperatures > 0 (default 5)\n"
           "  -tp, --temperature T     first temperature (default 0; also --temp)\n"
           "  -tpi, --temperature-inc T  fallback increment (default 0.2; also --temp-inc)\n"
           "  -nf, --no-fallback       no temperature fallback\n"
           "  -mc, --max-context N     previous-text tokens carried between windows (default: up to 224; 0: none)\n"
           "  --prompt TEXT            initial prompt: text the decoder takes as what came before\n"
           "                           (spelling, names, style; at most n_text_ctx/2 - 1 tokens are used)\n"
           "  --carry-initial-prompt   the prompt leads every 30 s window, not only the first\n"
           "  -nth, --no-speech-thold T  no-speech probability threshold (default 0.6)\n"
           "  -ml, --max-len N         split segments to at most N characters, at token starts, timed\n"
           "                           by token-level timestamps (whisper.cpp's; 0: off, the default)\n"
           "  -sow, --split-on-word    with -ml: split only before a word (a token starting with a blank)\n"
           "  -wt, --word-thold P      token timestamp probability threshold (default 0.01)\n"
           "  -sns, --suppress-nst     suppress non-speech symbols (whisper.cpp's list)\n"
           "  -ot, --offset-t N        start at N ms (also --offset-ms)\n"
           "  -d, --duration N         transcribe N ms (default: to the end; also --duration-ms)\n"
           "Output files, written beside the input as whisper-cli does (INPUT.txt, ...; -of NAME: NAME.txt),\n"
           "each replaced only once complete:\n"
           "  -otxt, --output-txt      text, a segment per line\n"
           "  -ovtt, --output-vtt      WebVTT\n"
           "  -osrt, --output-srt      SubRip\n"
           "  -ocsv, --output-csv      CSV: start,end (ms),text\n"
           "  -oj, --output-json       whisper-cli's JSON (model, params, result, transcription)\n"
           "  -ojf, --output-json-full the JSON with each token: text, times, id, probability\n"
           "  -of, --output-file NAME  the output name without extension (repeatable: one per input)\n"
           "Printing:\n"
           "  --print-srt              print SubRip to stdout instead of text\n"
           "  --print-json             print nanomind's JSON to stdout: language, duration, segments with\n"
           "                           t0/t1 (seconds), text, avg_logprob, no_speech_prob, temperature, tokens\n"
           "  -np, --no-prints         only the results (nanomind prints nothing else unless --stats)\n"
           "  -nfa, --no-flash-attn    accepted: attention is always computed as whisper-cli -nfa does\n"
           "  -fa, --flash-attn        accepted with a note (no f16 flash attention here)\n"
           "  -pp, --print-progress    print the progress to stderr after each 30 s window\n"
           "  --stats                  print load, mel, encode and decode times, the real-time factor and\n"
           "                           the bytes copied between bricks to stderr\n"
           "  -h, --help               this help;  --version  the version\n"
           "Audio shorter than 100 ms (after the offset) gives no text, as in whisper.cpp: a notice says so\n"
           "and the exit status is 0; an offset past the end is a usage error (2).\n");
}

typedef enum { PRINT_TXT, PRINT_SRT, PRINT_JSON } print_fmt;

typedef struct live {
    bool timestamps, progress;
    double secs; // audio duration, for the progress
} live;

// A segment (its text, its times), as whisper-cli prints it.
static void print_live(const live *L, const char *s, size_t n, int64_t t0, int64_t t1) {
    char a[32], b[32];
    if (L->timestamps) {
        nm_stt_timestamp(t0, false, a);
        nm_stt_timestamp(t1, false, b);
        printf("[%s --> %s]  ", a, b);
    }
    if (!L->timestamps)
        while (n > 0 && (*s == ' ' || *s == '\t')) s++, n--; // as whisper-cli -otxt writes it
    fwrite(s, 1, n, stdout);
    putchar('\n');
    fflush(stdout);
}

// The STT requests' own parameters (docs/bricks.md): what needed the model to
// decide. malloc'd JSON, NULL on OOM.
static char *stt_request_params(const char *lang, bool translate, const char *prompt) {
    cJSON *o = cJSON_CreateObject();
    bool ok = o && cJSON_AddStringToObject(o, "language", lang) && cJSON_AddBoolToObject(o, "translate", translate);
    if (ok && prompt && *prompt) ok = cJSON_AddStringToObject(o, "prompt", prompt) != NULL;
    char *s = ok ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

// After each window, on the brick's lane (the text comes as slots).
static void progress(const nm_transcript *t, int32_t i0, void *user) {
    const live *L = user;
    if (L->progress && t->n_seg > 0 && L->secs > 0) {
        double done = (double)t->seg[t->n_seg - 1].t1 / 100.0 / L->secs;
        fprintf(stderr, "progress = %3d%%\n", (int)(100 * (done > 1 ? 1 : done)));
    }
}

// ---- output files (whisper-cli's formats) ----------------------------------------

enum { OF_TXT = 1, OF_VTT = 2, OF_SRT = 4, OF_CSV = 8, OF_JSON = 16, OF_JSON_FULL = 32 };

static void put_escaped(FILE *f, const char *s, bool csv) {
    for (; *s; s++) {
        if (csv && *s == '"') fputc('"', f);                      // RFC 4180: a quote doubled
        else if (!csv && (*s == '"' || *s == '\\')) fputc('\\', f); // JSON as whisper-cli escapes it
        fputc(*s, f);
    }
}

static const char *model_type(const nm_stt_model_info *m) {
    switch (m->n_audio_layer) {
    case 4: return "tiny";
    case 6: return "base";
    case 12: return "small";
    case 24: return "medium";
    case 32: return "large";
    default: return "unknown";
    }
}

// whisper.cpp's ftype (ggml_ftype) of the model's big matrices, as its JSON
// prints it, from their GGUF tensor type.
static int ggml_ftype(uint32_t type) {
    switch (type) {
    case 0: return 0;   // F32
    case 1: return 1;   // F16
    case 2: return 2;   // Q4_0
    case 3: return 3;   // Q4_1
    case 8: return 7;   // Q8_0
    case 6: return 8;   // Q5_0
    case 7: return 9;   // Q5_1
    case 10: return 10; // Q2_K
    case 11: return 11; // Q3_K
    case 12: return 12; // Q4_K
    case 13: return 13; // Q5_K
    case 14: return 14; // Q6_K
    case 30: return 24; // BF16
    default: return -1;
    }
}

// Bytes still missing from the last UTF-8 character of s[0..n).
static int utf8_missing(const char *s, size_t n) {
    for (size_t back = 0; back < n && back < 4; back++) {
        const uint8_t c = (uint8_t)s[n - 1 - back];
        if ((c & 0xC0) == 0x80) continue;
        if (c >= 0xF8) return 0; // no lead byte: whisper-cli counts it complete
        const int need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > (int)back + 1 ? need - (int)back - 1 : 0;
    }
    return 0;
}

// whisper-cli -ojf's "tokens" of one segment: tokens whose bytes end inside a
// UTF-8 character are merged with the next ones (their t1 the last known).
static void write_json_tokens(FILE *f, const nm_stt_segment *g, const nm_brick *m) {
    char a[32], b[32], name[24], text[512];
    fputs(",\n\t\t\t\"tokens\": [\n", f);
    for (int32_t j = 0; j < g->n_tokens;) {
        const nm_stt_token *tk = &g->tokens[j];
        uint32_t len;
        const char *s = nm_brick_stt_token_text(m, tk->id, name, &len);
        size_t n = 0;
        int64_t t1 = tk->t1;
        if (s && len < sizeof text) memcpy(text, s, len), n = len;
        for (j++; j < g->n_tokens && utf8_missing(text, n) > 0; j++) {
            s = nm_brick_stt_token_text(m, g->tokens[j].id, name, &len);
            if (s && n + len < sizeof text) memcpy(text + n, s, len), n += len;
            if (g->tokens[j].t1 > -1) t1 = g->tokens[j].t1;
        }
        text[n] = '\0';
        fputs("\t\t\t\t{\n\t\t\t\t\t\"text\": \"", f);
        put_escaped(f, text, false);
        fputs("\",\n", f);
        if (tk->t0 > -1 && t1 > -1) {
            nm_stt_timestamp(tk->t0, true, a);
            nm_stt_timestamp(t1, true, b);
            fprintf(f, "\t\t\t\t\t\"timestamps\": {\n\t\t\t\t\t\t\"from\": \"%s\",\n\t\t\t\t\t\t\"to\": \"%s\"\n"
                       "\t\t\t\t\t},\n\t\t\t\t\t\"offsets\": {\n\t\t\t\t\t\t\"from\": %lld,\n\t\t\t\t\t\t\"to\": %lld\n"
                       "\t\t\t\t\t},\n",
                    a, b, (long long)(10 * tk->t0), (long long)(10 * t1));
        }
        fprintf(f, "\t\t\t\t\t\"id\": %d,\n\t\t\t\t\t\"p\": %g,\n\t\t\t\t\t\"t_dtw\": -1\n\t\t\t\t}%s\n", tk->id,
                (double)tk->p, j < g->n_tokens ? "," : "");
    }
    fputs("\t\t\t]", f);
}

static void write_format(FILE *f, int fmt, bool full, const nm_transcript *t, const nm_brick *stt,
                         const char *model_path, const char *lang, bool translate) {
    char a[32], b[32];
    nm_stt_model_info mi;
    nm_brick_stt_info(stt, &mi);
    const nm_stt_model_info *m = &mi;
    if (fmt == OF_TXT) { // the library's writers are whisper-cli's -otxt and -osrt
        nm_transcript_write_text(t, false, f);
        return;
    }
    if (fmt == OF_SRT) {
        nm_transcript_write_srt(t, f);
        return;
    }
    if (fmt == OF_VTT) {
        nm_transcript_write_vtt(t, f);
        return;
    }
    if (fmt == OF_CSV) fputs("start,end,text\n", f);
    if (fmt == OF_JSON) {
        fprintf(f, "{\n\t\"systeminfo\": \"nanomind %s\",\n\t\"model\": {\n\t\t\"type\": \"%s\",\n"
                   "\t\t\"multilingual\": %s,\n\t\t\"vocab\": %d,\n"
                   "\t\t\"audio\": {\n\t\t\t\"ctx\": %d,\n\t\t\t\"state\": %d,\n\t\t\t\"head\": %d,\n\t\t\t\"layer\": %d\n\t\t},\n"
                   "\t\t\"text\": {\n\t\t\t\"ctx\": %d,\n\t\t\t\"state\": %d,\n\t\t\t\"head\": %d,\n\t\t\t\"layer\": %d\n\t\t},\n"
                   "\t\t\"mels\": %d,\n\t\t\"ftype\": %d\n\t},\n\t\"params\": {\n\t\t\"model\": \"",
                NM_VERSION_STRING, model_type(m), m->multilingual ? "true" : "false", m->n_vocab, m->n_audio_ctx,
                m->n_audio_state, m->n_audio_head, m->n_audio_layer, m->n_text_ctx, m->n_text_state, m->n_text_head,
                m->n_text_layer, m->n_mels, ggml_ftype(m->wtype));
        put_escaped(f, model_path, false);
        fprintf(f, "\",\n\t\t\"language\": \"%s\",\n\t\t\"translate\": %s\n\t},\n\t\"result\": {\n\t\t\"language\": \"%s\"\n"
                   "\t},\n\t\"transcription\": [\n",
                lang, translate ? "true" : "false", t->language);
    }
    for (int32_t i = 0; i < t->n_seg; i++) {
        const nm_stt_segment *g = &t->seg[i];
        const char *s = g->text;
        switch (fmt) {
        case OF_CSV:
            fprintf(f, "%lld,%lld,\"", (long long)(10 * g->t0), (long long)(10 * g->t1));
            put_escaped(f, s, true);
            fputs("\"\n", f);
            break;
        case OF_JSON:
            nm_stt_timestamp(g->t0, true, a);
            nm_stt_timestamp(g->t1, true, b);
            fprintf(f, "\t\t{\n\t\t\t\"timestamps\": {\n\t\t\t\t\"from\": \"%s\",\n\t\t\t\t\"to\": \"%s\"\n\t\t\t},\n"
                       "\t\t\t\"offsets\": {\n\t\t\t\t\"from\": %lld,\n\t\t\t\t\"to\": %lld\n\t\t\t},\n\t\t\t\"text\": \"",
                    a, b, (long long)(10 * g->t0), (long long)(10 * g->t1));
            put_escaped(f, s, false);
            fputc('"', f);
            if (full) write_json_tokens(f, g, stt);
            fprintf(f, "\n\t\t}%s\n", i + 1 < t->n_seg ? "," : "");
            break;
        }
    }
    if (fmt == OF_JSON) fputs("\t]\n}\n", f);
}

// Writes every requested format for one input: BASE.txt, ... (BASE: -of NAME, or the input's path).
static bool write_outputs(int formats, const char *base, const nm_transcript *t, const nm_brick *m,
                          const char *model_path, const char *lang, bool translate, bool quiet) {
    static const struct { int fmt; const char *ext; } F[] = {
        {OF_TXT, ".txt"}, {OF_VTT, ".vtt"}, {OF_SRT, ".srt"}, {OF_CSV, ".csv"}, {OF_JSON, ".json"}};
    for (size_t k = 0; k < sizeof F / sizeof F[0]; k++) {
        if (!(formats & F[k].fmt)) continue;
        char path[4096], err[512];
        snprintf(path, sizeof path, "%s%s", base, F[k].ext);
        nm_outfile o;
        if (nm_outfile_open(&o, path, err, sizeof err) != NM_OK) {
            fprintf(stderr, "error: %s\n", err);
            return false;
        }
        write_format(o.f, F[k].fmt, formats & OF_JSON_FULL, t, m, model_path, lang, translate);
        if (ferror(o.f)) {
            fprintf(stderr, "error: %s: write failed\n", path);
            nm_outfile_abort(&o);
            return false;
        }
        if (nm_outfile_commit(&o, err, sizeof err) != NM_OK) {
            fprintf(stderr, "error: %s\n", err);
            return false;
        }
        if (!quiet) fprintf(stderr, "saved %s\n", path);
    }
    return true;
}

#define MAX_INPUTS 256

int cmd_transcribe(int argc, char **argv) {
    const char *model = NULL, *lang = "en", *prompt = NULL;
    const char *inputs[MAX_INPUTS], *outnames[MAX_INPUTS];
    int n_inputs = 0, n_outnames = 0, formats = 0;
    int32_t n_threads = 0, beam = 5, best_of = 5, max_ctx = -1, offset_ms = 0, duration_ms = 0, max_len = 0;
    float temp = 0.0f, temp_inc = 0.2f, nst = 0.6f, word_thold = 0.01f;
    bool timestamps = true, stats = false, translate = false, suppress_nst = false, quiet = false, pp = false;
    bool carry_prompt = false, split_on_word = false;
    print_fmt pfmt = PRINT_TXT;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true, takes = true;
#define IS(x) (!strcmp(a, x))
        if (IS("-m") || IS("--model")) model = v;
        else if (IS("-f") || IS("--file")) {
            if (n_inputs == MAX_INPUTS) {
                fprintf(stderr, "error: at most %d audio files\n", MAX_INPUTS);
                return 2;
            }
            inputs[n_inputs++] = v;
        } else if (IS("-of") || IS("--output-file")) {
            if (n_outnames == MAX_INPUTS) {
                fprintf(stderr, "error: at most %d output names\n", MAX_INPUTS);
                return 2;
            }
            outnames[n_outnames++] = v;
        } else if (IS("-l") || IS("--language")) lang = v;
        else if (IS("--prompt")) prompt = v;
        else if (IS("-t") || IS("--threads")) ok = cli_arg_int(a, v, 1, 4 * nm_cpu_count(), &n_threads);
        else if (IS("--beam-size") || IS("-bs")) ok = cli_arg_int(a, v, 1, NM_STT_MAX_DECODERS, &beam);
        else if (IS("--best-of") || IS("-bo")) ok = cli_arg_int(a, v, 1, NM_STT_MAX_DECODERS, &best_of);
        else if (IS("--temp") || IS("-tp") || IS("--temperature")) ok = cli_arg_float(a, v, 0.0f, 1.0f, &temp);
        else if (IS("--temp-inc") || IS("-tpi") || IS("--temperature-inc"))
            ok = cli_arg_float(a, v, 0.0f, 1.0f, &temp_inc);
        else if (IS("-nth") || IS("--no-speech-thold")) ok = cli_arg_float(a, v, 0.0f, 1.0f, &nst);
        else if (IS("--max-context") || IS("-mc")) ok = cli_arg_int(a, v, 0, 1 << 20, &max_ctx);
        else if (IS("-ml") || IS("--max-len")) ok = cli_arg_int(a, v, 0, 1 << 20, &max_len);
        else if (IS("-wt") || IS("--word-thold")) ok = cli_arg_float(a, v, 0.0f, 1.0f, &word_thold);
        else if (IS("--offset-ms") || IS("-ot") || IS("--offset-t")) ok = cli_arg_int(a, v, 0, 2147483647, &offset_ms);
        else if (IS("--duration-ms") || IS("-d") || IS("--duration")) ok = cli_arg_int(a, v, 0, 2147483647, &duration_ms);
        else {
            takes = false;
            if (IS("--timestamps")) timestamps = true;
            else if (IS("-nt") || IS("--no-timestamps")) timestamps = false;
            else if (IS("-otxt") || IS("--output-txt")) formats |= OF_TXT;
            else if (IS("-ovtt") || IS("--output-vtt")) formats |= OF_VTT;
            else if (IS("-osrt") || IS("--output-srt")) formats |= OF_SRT;
            else if (IS("-ocsv") || IS("--output-csv")) formats |= OF_CSV;
            else if (IS("-oj") || IS("--output-json")) formats |= OF_JSON;
            else if (IS("-ojf") || IS("--output-json-full")) formats |= OF_JSON | OF_JSON_FULL;
            else if (IS("-sow") || IS("--split-on-word")) split_on_word = true;
            else if (IS("-nfa") || IS("--no-flash-attn")) { /* what we compute anyway */ }
            else if (IS("-fa") || IS("--flash-attn"))
                fprintf(stderr, "note: %s: attention here is computed as whisper-cli -nfa does (f32 sums); "
                                "flash attention's f16 sums are not used\n", a);
            else if (IS("--print-srt")) pfmt = PRINT_SRT;
            else if (IS("--print-json")) pfmt = PRINT_JSON;
            else if (IS("--no-fallback") || IS("-nf")) temp_inc = 0.0f;
            else if (IS("--translate") || IS("-tr")) translate = true;
            else if (IS("--suppress-nst") || IS("-sns")) suppress_nst = true;
            else if (IS("--carry-initial-prompt")) carry_prompt = true;
            else if (IS("-np") || IS("--no-prints")) quiet = true;
            else if (IS("-pp") || IS("--print-progress")) pp = true;
            else if (IS("--stats")) stats = true;
            else if (IS("-h") || IS("--help")) {
                transcribe_usage();
                return 0;
            } else if (IS("--version")) {
                cli_print_version();
                return 0;
            } else if (a[0] != '-' || !a[1]) {
                if (n_inputs == MAX_INPUTS) {
                    fprintf(stderr, "error: at most %d audio files\n", MAX_INPUTS);
                    return 2;
                }
                inputs[n_inputs++] = a;
            } else {
                fprintf(stderr, "error: unknown option '%s' (see nanomind transcribe --help)\n", a);
                return 2;
            }
        }
#undef IS
        if (takes) {
            if (!v) {
                fprintf(stderr, "error: %s needs a value\n", a);
                return 2;
            }
            if (!ok) return 2;
            i++;
        }
    }
    if (!model || n_inputs == 0) {
        fprintf(stderr, "error: %s\nusage: nanomind transcribe -m MODEL AUDIO... [options] (--help for more)\n",
                !model ? "no model (-m)" : "no audio file (a path, - for stdin, or -f FILE)");
        return 2;
    }
    if (n_outnames > n_inputs) {
        fprintf(stderr, "error: %d -of names for %d audio files\n", n_outnames, n_inputs);
        return 2;
    }
    if (n_outnames > 0 && !formats) {
        fprintf(stderr, "error: -of names output files: give a format too (-otxt, -osrt, -ovtt, -ocsv, -oj, -ojf)\n");
        return 2;
    }
    for (int i = 0; i < n_inputs; i++)
        if (formats && !strcmp(inputs[i], "-") && i >= n_outnames) {
            fprintf(stderr, "error: output files for stdin need a name: -of NAME\n");
            return 2;
        }

    int rc = 1;
    char err[512] = "";
    nm_pipeline *P = NULL;
    nm_brick *stt = NULL;
    nm_stt_model_info mi = {0};
    const nm_stt_model_info *m = &mi;
    nm_audio *held = calloc((size_t)n_inputs, sizeof *held); // streams, read whole first
    int64_t *length = calloc((size_t)n_inputs, sizeof *length); // each input's samples (a file's: from its header)
    nm_ledger *ledger = nm_ledger_create();
    char *params = NULL;
    nm_status st;
    if (!ledger || !held || !length) {
        fprintf(stderr, "error: out of memory\n");
        goto done;
    }
    double t0 = cli_now();
    // The STT ring's slots hold the longest input: a file is decoded straight into its slot (sized from
    // its header: nothing copied); stdin or a pipe is decoded whole first, then copied once (counted).
    int64_t most = NM_AUDIO_RATE;
    for (int i = 0; i < n_inputs; i++) {
        char perr[512];
        st = nm_audio_probe(inputs[i], NM_AUDIO_RATE, &length[i], perr, sizeof perr);
        if (st == NM_ERR_UNSUPPORTED) { // a stream, or a header without a length
            if ((st = nm_audio_load(inputs[i], NM_AUDIO_RATE, &held[i], err, sizeof err)) != NM_OK) {
                fprintf(stderr, "error: cannot read audio %s (%s)\n", err, nm_status_str(st)); // err names the input
                goto done;
            }
            length[i] = held[i].n;
        }
        if (length[i] > most) most = length[i]; // (an input that cannot be read says so at its turn)
    }
    const double t_streams = cli_now() - t0;

    live L = {.timestamps = timestamps, .progress = pp};
    nm_stt_params p = nm_stt_default_params(beam > 1 ? NM_STT_BEAM : NM_STT_GREEDY);
    p.beam_size = beam;
    p.best_of = best_of;
    p.temperature = temp;
    p.temperature_inc = temp_inc;
    p.no_speech_thold = nst;
    p.suppress_nst = suppress_nst;
    p.offset_ms = offset_ms;
    p.duration_ms = duration_ms;
    if (max_ctx >= 0) p.n_max_text_ctx = max_ctx;
    p.carry_initial_prompt = carry_prompt;
    // As whisper-cli: token timestamps for -ml and -ojf.
    p.token_timestamps = max_len > 0 || (formats & OF_JSON_FULL);
    p.max_len = max_len;
    p.split_on_word = split_on_word;
    p.thold_pt = word_thold;
    // Text without --timestamps decodes as whisper-cli -nt; SRT, JSON and the files need the times.
    // -ml splits at token times: it decodes with timestamps too (whisper-cli without -nt).
    p.no_timestamps = pfmt == PRINT_TXT && !timestamps && !(formats & ~OF_TXT) && max_len == 0;
    p.on_segments = progress; // -pp: after each 30 s window
    p.user = &L;
    nm_brick_params bp = nm_brick_default_params(NM_BRICK_STT);
    bp.model = model;
    bp.n_threads = n_threads;
    bp.stt_max_decoders = beam > best_of ? beam : best_of;
    bp.stt = p;
    nm_pipeline_params pl = nm_pipeline_default_params(); // the STT brick alone, a file a request
    pl.stt = &bp;
    pl.ledger = ledger;
    pl.max_audio_s = (int32_t)((most + NM_AUDIO_RATE - 1) / NM_AUDIO_RATE);
    if ((st = nm_pipeline_create(&pl, &P, err, sizeof err)) != NM_OK) {
        if (strstr(err, "transcriber") || strstr(err, "pipeline") || st == NM_ERR_NOMEM)
            fprintf(stderr, "error: cannot set up the transcriber: %s: %s\n", nm_status_str(st), err);
        else
            cli_load_error(model, st, err, CLI_WANT_WHISPER);
        goto done;
    }
    stt = nm_pipeline_brick(P, NM_BRICK_STT);
    nm_brick_stt_info(stt, &mi);
    const double t_load = cli_now() - t0 - t_streams;

    // Language: a known code, "auto" (multilingual models), English for .en models.
    if (strcmp(lang, "auto") && nm_brick_stt_lang_id(stt, lang) < 0) {
        fprintf(stderr, "error: unknown language '%s' (a code such as en, de, fr, es, ja, or auto)\n", lang);
        rc = 2;
        goto done;
    }
    if (!m->multilingual) {
        if (strcmp(lang, "en") && strcmp(lang, "auto"))
            fprintf(stderr, "warning: %s is an English-only model: transcribing as English, not '%s'\n", m->name,
                    lang);
        if (translate) fprintf(stderr, "warning: %s is an English-only model: --translate ignored\n", m->name);
        lang = "en";
        translate = false;
    }
    if (prompt && *prompt) {
        // As whisper.cpp: the last min(-mc, n_text_ctx / 2) - 1 tokens lead the first window
        // (carried: at least 1); -mc 0 turns all previous text off.
        const int32_t n_prompt_tok = nm_brick_stt_tokenize(stt, prompt, NULL, 0);
        const int32_t half = m->n_text_ctx / 2, mpc = max_ctx >= 0 && max_ctx < half ? max_ctx : half;
        const int32_t most_tok = max_ctx == 0 ? 0 : carry_prompt && mpc - 1 < 1 ? 1 : mpc - 1;
        if (n_prompt_tok > most_tok && most_tok > 0)
            fprintf(stderr, "warning: the prompt has %d tokens: only its last %d are used\n", n_prompt_tok, most_tok);
        else if (most_tok <= 0)
            fprintf(stderr, "warning: --prompt is not used with -mc %d (no previous text)\n", (int)max_ctx);
    }
    // what the model decided: the requests' own parameters (the brick tokenizes the prompt)
    if (!(params = stt_request_params(lang, translate, prompt))) {
        fprintf(stderr, "error: out of memory\n");
        goto done;
    }

    for (int fi = 0; fi < n_inputs; fi++) {
        const char *audio = inputs[fi];
        t0 = cli_now();
        L.secs = (double)length[fi] / NM_AUDIO_RATE; // (read by -pp on the lane, after the submit)
        nm_pipeline_input in = {.stt_params = params};
        if (held[fi].pcm) in.pcm = held[fi].pcm, in.n_samples = held[fi].n;
        else in.audio_path = audio;
        if ((st = nm_pipeline_submit(P, &in, NULL, err, sizeof err)) != NM_OK) {
            fprintf(stderr, "error: cannot read audio %s\n", err); // err names the input
            goto done;
        }
        const double t_audio = cli_now() - t0 + (held[fi].pcm ? t_streams : 0);
        nm_audio_free(&held[fi]);

        // The brick on its lane; its segments printed here as they come.
        t0 = cli_now();
        nm_pipeline_event ev = {0};
        while (nm_pipeline_read(P, -1, &ev) == NM_OK && ev.kind != NM_PIPELINE_DONE)
            if (pfmt == PRINT_TXT && ev.kind == NM_PIPELINE_TRANSCRIPT) print_live(&L, ev.text, ev.len, ev.t0, ev.t1);
        const double t_run = cli_now() - t0;
        if (ev.kind != NM_PIPELINE_DONE || ev.status != NM_OK) { // the brick's message starts with the status
            const char *why = ev.kind != NM_PIPELINE_DONE ? nm_brick_last_error(stt) : ev.text;
            const char *bad = nm_status_str(NM_ERR_INVALID_ARG);
            if (!strncmp(why, "stt: ", 5)) why += 5;
            fprintf(stderr, "error: transcription of '%s' failed: %s\n", audio, why);
            if (!strncmp(why, bad, strlen(bad))) rc = 2; // parameters the request refused (as before the brick)
            goto done;
        }
        const nm_transcript out = *nm_brick_stt_transcript(stt);
        const int64_t n_samples = out.n_samples, total_ms = n_samples * 1000 / NM_AUDIO_RATE;
        if (offset_ms > 0 && offset_ms >= total_ms) {
            fprintf(stderr, "error: --offset-ms %d is past the end of '%s' (%lld ms of audio)\n", (int)offset_ms, audio,
                    (long long)total_ms);
            rc = 2;
            goto done;
        }
        int64_t span = total_ms - offset_ms;
        if (duration_ms > 0 && duration_ms < span) span = duration_ms;
        if (span < 100)
            fprintf(stderr, "notice: '%s': %lld ms of audio%s: Whisper decodes nothing under 100 ms (as whisper.cpp); "
                            "pad it with silence\n",
                    audio, (long long)span, offset_ms || duration_ms ? " from the offset" : "");
        else if (out.n_seg == 0)
            fprintf(stderr, "notice: '%s': no speech found\n", audio);
        bool wrote = true;
        if (pfmt == PRINT_SRT) wrote = nm_transcript_write_srt(&out, stdout);
        else if (pfmt == PRINT_JSON) wrote = nm_transcript_write_json(&out, m->name, stdout);
        fflush(stdout);
        if (!wrote || ferror(stdout)) {
            fprintf(stderr, "error: cannot write the transcript to stdout\n");
            goto done;
        }
        if (formats && !write_outputs(formats, fi < n_outnames ? outnames[fi] : audio, &out, stt, model, lang, translate,
                                      quiet))
            goto done;

        if (stats) {
            const nm_stt_timings tm = nm_brick_stt_timings(stt);
            const double secs = (double)n_samples / NM_AUDIO_RATE;
            fprintf(stderr, "model: %s (%s), %d+%d layers, d %d, load %.3f s\n", m->name, m->format,
                    m->n_audio_layer, m->n_text_layer, m->n_audio_state, t_load);
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
            fprintf(stderr,
                    "(the decoded audio is written once into the PCM slot; the STT brick reads the slot in place)\n");
            fprintf(stderr, "peak RSS: %.1f MiB\n", cli_peak_rss_kb() / 1024.0);
        }
    }
    rc = 0;
done:
    nm_pipeline_free(P);
    nm_ledger_free(ledger);
    for (int i = 0; held && i < n_inputs; i++) nm_audio_free(&held[i]);
    free(held);
    free(length);
    free(params);
    return rc;
}
