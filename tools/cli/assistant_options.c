// nanomind assistant: its command line (docs/cli.md): the help, the options
// of its own (the rest are `run`'s, parsed by cli_parse), and the checks of
// what goes with what, all before anything is loaded.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "assistant.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: nanomind assistant -m LLM.gguf [--stt WHISPER.gguf] (--audio FILE|DIR | -p TEXT)\n"
            "                          [--mmproj MM.gguf --frames DIR [--fps F]] [--out DIR] [options]\n"
            "\n"
            "The assistant's loop: each question (spoken, or typed with -p), with a camera frame if\n"
            "given, is transcribed, answered by the language model (a chat turn of its own) and\n"
            "spoken, every model on its own lane, the next question heard and the next frame encoded\n"
            "while the current answer is decoded, and the first sentence spoken before the answer ends.\n"
            "\n"
            "sources and sinks:\n"
            "  --stt FILE               Whisper model for spoken questions (GGUF or whisper.cpp .bin)\n"
            "  --audio FILE|DIR         the questions: an audio file, or a folder of them (one question\n"
            "                           each, in name order; WAV, FLAC, OGG, MP3), up to %d s each\n"
            "  --audio mic[:DEVICE]     the questions from a microphone (ALSA; default device \"default\"):\n"
            "                           each utterance (speech until 0.8 s of silence) is a question\n"
            "  --audio watch:DIR        the questions as audio files arrive in DIR (written and closed\n"
            "                           there, or moved in; files already there are not questions)\n"
            "  --listen S               with mic or watch: listen S seconds; 0 (default): until Ctrl-C\n"
            "  --wake-words LIST        answer only a spoken question that starts with one of these\n"
            "                           (comma-separated; case and punctuation ignored); the word is\n"
            "                           taken off the question. Others are not answered (in the\n"
            "                           cascade, nothing but Whisper is loaded for them)\n"
            "  --barge-in               with mic: speech that starts while an answer is decoded or\n"
            "                           spoken stops it (the new question is answered)\n"
            "  -p, --prompt TEXT        a typed question (with --frames: asked of every frame)\n"
            "  --mmproj FILE            vision encoder for the frames (llama.cpp's mmproj GGUF)\n"
            "  --image-min-tokens N, --image-max-tokens N  image tokens of a dynamic-resolution mmproj\n"
            "  --frames DIR             the camera frames: a folder of images (PNG, JPEG, PPM) in name\n"
            "                           order, one per question (as many as the questions, or any number\n"
            "                           with -p)\n"
            "  --frames watch:DIR       the frames as a camera writes them into DIR, each asked -p\n"
            "  --frames /dev/videoN     a camera (V4L2): each question is asked of its newest frame; with\n"
            "                           -p, the typed question of frame after frame (--fps, --listen,\n"
            "                           Ctrl-C). An absent camera: the spoken questions go without one\n"
            "  --frame-change T         with -p: ask about a frame only if it differs from the last one\n"
            "                           asked about by more than T (mean absolute difference of 32x32\n"
            "                           grey thumbnails, 0..255; e.g. 4); the others wake nothing\n"
            "  --fps F                  take at most F frames a second (a camera's rate); 0 (default):\n"
            "                           as fast as the pipeline goes\n"
            "  --out DIR                speak the answers into DIR/answer-NNN.wav (text goes to stdout\n"
            "                           always); without it nothing is spoken\n"
            "  --out speaker[:DEVICE]   speak them on a speaker (ALSA; an absent one is skipped with a\n"
            "                           message)\n"
            "  --tts ENGINE             espeak-ng (default), piper (a neural voice, docs/piper.md) or none;\n"
            "                           --voice V  its voice (espeak-ng: en-us; piper: en_US-joe-medium or a GGUF);\n"
            "                           --tts-device DEV  where a Piper voice's decoder runs (cpu, opencl,\n"
            "                           opencl:N, auto; default cpu)\n"
            "  --sequential             one question at a time: the next starts once the answer is\n"
            "                           spoken (the baseline of the pipelined loop)\n"
            "power (docs/power.md):\n"
            "  --battery SRC            the battery: a percent, sysfs[:NAME] (Linux power_supply) or\n"
            "                           trace:FILE (seconds,percent rows); before each question the policy\n"
            "                           sets the frame rate, the decoder's pace, the bricks' threads (the\n"
            "                           pipeline made again when they change) and, when critical, runs\n"
            "                           the question as the cascade\n"
            "  --battery-speed X        trace seconds per second of the loop (default 1)\n"
            "  --power-sysfs ROOT       write the policy's DVFS caps under ROOT (/sys), restored at exit\n"
            "  --cascade                every question as the cascade: each brick loaded, run once and\n"
            "                           released in turn (the least memory), when a question comes\n"
            "  --plan                   place the bricks where the planner puts them (the plan goes to\n"
            "                           stderr) from the unit profiles (`nanomind profile`);\n"
            "                           --plan-goal latency|throughput|energy, --profile FILE (its\n"
            "                           watts are the energy model's in --stats and --json too)\n"
            "lanes (core lists as run --cores: 0-3,6, big, little, cluster:N):\n"
            "  --cores LIST             the language model's lane;  --mmproj-cores LIST  the vision\n"
            "                           encoder's;  --stt-cores LIST, --tts-cores LIST\n"
            "also: -t, -c, -b, -ub, -n (default 128), --temp and the other sampling options, -sys,\n"
            "--chat-template, --jinja, --chat-template-file, --chat-template-kwargs, -dev, -ngl, --mmproj-device, --pin, --no-mmap, --mlock,\n"
            "as `run`.\n"
            "  --stats                  per question: seconds from the end of the question to its\n"
            "                           transcript, first token, first audio sample, last token and\n"
            "                           last sample; questions a second; the copy ledger; energy per\n"
            "                           brick and per question (modelled; measured where a meter exists)\n"
            "  --json FILE              the same as one JSON object in FILE\n"
            "  -h, --help               this help\n",
            MAX_QUESTION_S);
}

// The assistant's options that take a number: their ranges (as --help states them).
static const struct { const char *name; float lo, hi; } floats[] = {
    {"--fps", 0.0f, 1000.0f}, {"--listen", 0.0f, 86400.0f}, {"--frame-change", 0.0f, 254.0f},
    {"--battery-speed", 0.001f, 1e9f}};
static int float_opt(const char *a) {
    for (int k = 0; k < (int)(sizeof floats / sizeof floats[0]); k++)
        if (!strcmp(a, floats[k].name)) return k;
    return -1;
}

// Takes the assistant's own options out of argv (the rest is `run`'s).
static bool take_own(app *A, int *argc, char **argv) {
    int w = 1, f;
    float speed = 0;
    const char *wake = NULL;
    float *fdst[] = {&A->fps, &A->listen_s, &A->frame_change, &speed};
    for (int i = 1; i < *argc; i++) {
        const char *a = argv[i];
        const char **dst = !strcmp(a, "--stt") ? &A->stt_model : !strcmp(a, "--audio") ? &A->audio
                           : !strcmp(a, "--frames") ? &A->frames : !strcmp(a, "--out") ? &A->out_dir
                           : !strcmp(a, "--tts") ? &A->tts_engine : !strcmp(a, "--voice") ? &A->voice
                           : !strcmp(a, "--tts-device") ? &A->tts_device
                           : !strcmp(a, "--stt-cores") ? &A->stt_cores : !strcmp(a, "--tts-cores") ? &A->tts_cores
                           : !strcmp(a, "--json") ? &A->json_path : !strcmp(a, "--wake-words") ? &wake
                                                                                                : NULL;
        if (dst) {
            if ((dst == &A->stt_model || dst == &A->audio || dst == &A->stt_cores) &&
                !cli_part(a, NM_WITH_STT, CLI_PART_STT))
                return false;
            if (dst == &A->frames && !cli_part(a, NM_WITH_VISION, CLI_PART_VISION)) return false;
            if (i + 1 >= *argc || !argv[i + 1][0]) {
                fprintf(stderr, "error: %s needs a value\n", a);
                return false;
            }
            *dst = argv[++i];
        } else if ((f = float_opt(a)) >= 0) {
            if (i + 1 >= *argc || !cli_arg_float(a, argv[i + 1], floats[f].lo, floats[f].hi, fdst[f])) {
                if (i + 1 >= *argc) fprintf(stderr, "error: %s needs a value\n", a);
                return false;
            }
            i++;
        } else if (!strcmp(a, "--sequential")) {
            A->sequential = true;
        } else if (!strcmp(a, "--cascade")) {
            A->cascade_always = true;
        } else if (!strcmp(a, "--barge-in")) {
            A->barge_in = true;
        } else if (!strcmp(a, "--battery") || !strcmp(a, "--power-sysfs")) {
            if (i + 1 >= *argc || !argv[i + 1][0]) {
                fprintf(stderr, "error: %s needs a value\n", a);
                return false;
            }
            *(!strcmp(a, "--battery") ? &A->battery_src : &A->power_sysfs) = argv[++i];
        } else {
            argv[w++] = argv[i];
        }
    }
    *argc = w;
    if (speed > 0) A->battery_speed = speed;
    A->wake_words = wake; // (the pipeline reads the list: its errors are said when it is made)
    // the devices: mic[:DEV] and speaker[:DEV] (ALSA names; "default" without one)
    if (A->audio && (!strcmp(A->audio, "mic") || !strncmp(A->audio, "mic:", 4)))
        A->mic_dev = A->audio[3] ? A->audio + 4 : "default";
    if (A->out_dir && (!strcmp(A->out_dir, "speaker") || !strncmp(A->out_dir, "speaker:", 8)))
        A->speaker_dev = A->out_dir[7] ? A->out_dir + 8 : "default";
    // watch:DIR: the questions (or the frames) as files arrive in DIR
    if (A->audio && !strncmp(A->audio, "watch:", 6)) A->watch_dir = A->audio + 6;
    if (A->frames && !strncmp(A->frames, "watch:", 6)) {
        if (A->watch_dir) {
            fprintf(stderr, "error: watch one folder: the spoken questions' (--audio watch:DIR) or the frames' "
                            "(--frames watch:DIR, with -p)\n");
            return false;
        }
        A->watch_dir = A->frames + 6;
        A->watch_frames = true;
    }
    if (A->watch_dir && !A->watch_dir[0]) {
        fprintf(stderr, "error: watch: needs a folder (watch:DIR)\n");
        return false;
    }
    // a camera: a character device (or a /dev/video path that is not there: said when it is opened)
    struct stat cb;
    if (A->frames && !A->watch_frames &&
        (stat(A->frames, &cb) == 0 ? S_ISCHR(cb.st_mode) : !strncmp(A->frames, "/dev/video", 10)))
        A->camera_dev = A->frames;
    A->live = A->mic_dev || A->watch_dir || (A->camera_dev && !A->audio);
    A->watch_fd = -1;
    return true;
}

int assistant_options(app *A, int argc, char **argv) {
    A->tts_engine = "espeak-ng";
    if (!take_own(A, &argc, argv)) return 2;
    if (!cli_parse("assistant", CLI_MPATH | CLI_MODEL | CLI_CTX | CLI_PROMPT | CLI_GEN | CLI_VISION | CLI_IMGTOK | CLI_STATS | CLI_LANE | CLI_PLAN,
                   argc, argv, &A->o, NULL))
        return 2;
    cli_opts *o = &A->o;
    if (o->help || o->version) {
        if (o->help) usage(stdout);
        else cli_print_version();
        cli_opts_free(o);
        return 0;
    }
    if (!o->model) {
        fprintf(stderr, "error: give the language model with -m FILE\n");
        goto bad;
    }
    if (!A->audio == !o->prompt) {
        fprintf(stderr, "error: give the questions: --audio FILE|DIR (spoken, with --stt) or -p TEXT (typed), one "
                        "of the two\n");
        goto bad;
    }
    if (A->audio && !A->stt_model) {
        fprintf(stderr, "error: --audio needs a Whisper model: --stt FILE\n");
        goto bad;
    }
    if (!A->frames != !o->mmproj) {
        fprintf(stderr, "error: --frames and --mmproj go together\n");
        goto bad;
    }
    if ((o->image_min_tokens || o->image_max_tokens) && !o->mmproj) {
        fprintf(stderr, "error: %s needs --mmproj (the vision encoder)\n",
                o->image_min_tokens ? "--image-min-tokens" : "--image-max-tokens");
        goto bad;
    }
    if (o->n_images > 0) {
        fprintf(stderr, "error: the assistant takes its images from --frames, not --image\n");
        goto bad;
    }
    if (o->plan && (o->cores || o->mmproj_cores || A->stt_cores || A->tts_cores || o->device || o->mmproj_device ||
                    A->tts_device || o->n_gpu_layers != -1)) {
        fprintf(stderr, "error: --plan places the bricks: drop --cores, --mmproj-cores, --stt-cores, --tts-cores, -dev, "
                        "--mmproj-device, --tts-device and -ngl\n");
        goto bad;
    }
    if (o->plan_goal && !o->plan) {
        fprintf(stderr, "error: --plan-goal goes with --plan\n");
        goto bad;
    }
    if (o->profile && !o->plan && !o->stats && !A->json_path) { // its watts feed the energy figures
        fprintf(stderr, "error: --profile goes with --plan, --stats or --json\n");
        goto bad;
    }
    if (A->listen_s > 0 && !A->live) {
        fprintf(stderr, "error: --listen goes with --audio mic, --audio watch:DIR, --frames watch:DIR or a camera "
                        "with -p\n");
        goto bad;
    }
    if (A->watch_frames && !o->prompt) {
        fprintf(stderr, "error: --frames watch:DIR asks a typed question of each frame: give it with -p\n");
        goto bad;
    }
    if (A->audio && A->frames && A->live && !A->camera_dev) {
        fprintf(stderr, "error: --frames pairs a folder's frames with a folder's questions, not with %s\n",
                A->mic_dev ? "a microphone" : "a watched folder");
        goto bad;
    }
    if (A->wake_words && !A->audio) {
        fprintf(stderr, "error: --wake-words goes with spoken questions (--audio)\n");
        goto bad;
    }
    if (A->frame_change > 0 && (!A->frames || !o->prompt)) {
        fprintf(stderr, "error: --frame-change goes with --frames and -p (a typed question asked of each frame that "
                        "changed)\n");
        goto bad;
    }
    if (A->barge_in && !A->mic_dev) {
        fprintf(stderr, "error: --barge-in goes with --audio mic (speech heard while an answer is spoken stops it)\n");
        goto bad;
    }
    if (A->fps > 0 && !A->frames) {
        fprintf(stderr, "error: --fps goes with --frames\n");
        goto bad;
    }
    if (!strcmp(A->tts_engine, "espeak")) A->tts_engine = "espeak-ng";
    if (strcmp(A->tts_engine, "espeak-ng") && strcmp(A->tts_engine, "piper") && strcmp(A->tts_engine, "none")) {
        fprintf(stderr, "error: --tts takes espeak-ng, piper or none, not '%s'\n", A->tts_engine);
        goto bad;
    }
    if (A->out_dir && !strcmp(A->tts_engine, "none")) {
        fprintf(stderr, "error: --out writes speech: it needs a voice (not --tts none)\n");
        goto bad;
    }
    if (o->chat_tmpl && !nm_chat_template_known(o->chat_tmpl)) {
        fprintf(stderr, "error: unknown chat template '%s' (known: %s)\n", o->chat_tmpl, nm_chat_template_names());
        goto bad;
    }
    if (A->cascade_always && o->plan) {
        fprintf(stderr, "error: --cascade runs each brick alone on every core: drop --plan\n");
        goto bad;
    }
    if ((A->battery_speed > 0 || A->power_sysfs) && !A->battery_src) {
        fprintf(stderr, "error: --battery-speed and --power-sysfs go with --battery\n");
        goto bad;
    }
    if (A->json_path) { // its folder must be there now, not after the run
        char *dir = strdup(A->json_path), *slash = dir ? strrchr(dir, '/') : NULL;
        struct stat sb;
        if (slash) *(slash == dir ? slash + 1 : slash) = '\0';
        errno = 0;
        const bool there = dir && stat(slash ? dir : ".", &sb) == 0 && S_ISDIR(sb.st_mode);
        if (!there) fprintf(stderr, "error: --json '%s': %s\n", A->json_path, errno ? strerror(errno) : "not in a folder");
        free(dir);
        if (!there) goto bad;
    }
    if (A->out_dir && !A->speaker_dev) {
        struct stat sb, wb;
        const bool there = stat(A->out_dir, &sb) == 0;
        if (!there || !S_ISDIR(sb.st_mode)) {
            fprintf(stderr, "error: --out '%s': %s\n", A->out_dir, there ? "not a folder" : strerror(errno));
            goto bad;
        }
        // the answers written into the watched folder would arrive there as questions, without end
        if (A->watch_dir && stat(A->watch_dir, &wb) == 0 && wb.st_dev == sb.st_dev && wb.st_ino == sb.st_ino) {
            fprintf(stderr, "error: --out '%s' is the watched folder: its answers would be taken as questions\n",
                    A->out_dir);
            goto bad;
        }
    }
    return -1;
bad:
    cli_opts_free(o);
    return 2;
}
