#!/usr/bin/env bash
# The nanomind command end to end: every subcommand's --help, bad input
# (missing or corrupt files, bad flags) reported with a clear message and a
# non-zero exit, and short real runs on the default model.
# usage: test_cli.sh path/to/nanomind ; prints "N passed, N failed, N skipped".
# The helpers (nm, expect, setup) are tests/cli/lib.sh.
set -u
NM=$1
. "$(dirname "$0")/lib.sh"

for c in run info perplexity bench; do
    expect "help_$c" 0 "usage: nanomind $c" -- nm $c --help
done
expect no_command 2 "usage: nanomind COMMAND" -- nm
expect unknown_command 2 "unknown command 'frobnicate'" -- nm frobnicate
# llama.cpp habits (issue 45): a model with a chat template converses by default, as llama-completion
# (-no-cnv: plain completion); an image prompt without --chat answers as with it (as llama-mtmd-cli)
case_cnv_default_same() { local a b; a=$(nm run -m "$M" -p "What is the capital of France?" -n 8 --temp 0 -t 2); b=$(nm run -m "$M" --chat -p "What is the capital of France?" -n 8 --temp 0 -t 2); [ "$a" = "$b" ] && echo "same: $a"; }
expect run_converses_by_default 0 "^same: [A-Za-z]" "$M" -- case_cnv_default_same
expect run_no_cnv_completes 0 "^The capital of France is" "$M" -- nm run -m "$M" -no-cnv -p "The capital of France is" -n 4 --temp 0 -t 2
case_no_display_prompt() { nm run -m "$M" -no-cnv --no-display-prompt -p "The capital of France is" -n 4 --temp 0 -t 2 | head -c 40; }
expect run_no_display_prompt 0 "^[^T]" "$M" -- case_no_display_prompt
case_image_without_chat() { local a b; a=$(nm run -m "$M" --mmproj tests/data/vlm/vlm-mmproj-q8_0.gguf --image tests/data/vlm/scene-4242-1.ppm -p "What colour is the shape?" -n 8 --temp 0 -t 2); b=$(nm run -m "$M" --mmproj tests/data/vlm/vlm-mmproj-q8_0.gguf --image tests/data/vlm/scene-4242-1.ppm --chat -p "What colour is the shape?" -n 8 --temp 0 -t 2); [ "$a" = "$b" ] && echo "same: $a"; }
expect run_image_prompt_without_chat_answers 0 "^same: [A-Za-z]" "$M" -- case_image_without_chat
printf 'You answer in one word.\n' > "$tmp/sys.txt"
case_sysf() { local a b; a=$(nm run -m "$M" -sysf "$tmp/sys.txt" -p "Capital of France?" -n 6 --temp 0 -t 2); b=$(nm run -m "$M" -sys "You answer in one word." -p "Capital of France?" -n 6 --temp 0 -t 2); [ "$a" = "$b" ] && echo "same: $a"; }
expect run_sysf_equals_sys 0 "^same: " "$M" -- case_sysf
expect run_sysf_and_sys 2 "-sys and -sysf both give the system message" -- nm run -m "$M" -sys x -sysf "$tmp/sys.txt" -p hi
expect run_ctk_q8_refused 2 "-ctk q8_0: the KV cache is f16 in this build" -- nm run -m "$M" -ctk q8_0 -p hi
expect run_ctk_f16_taken 0 "Paris" "$M" -- nm run -m "$M" -ctk f16 -ctv f16 -no-cnv -p "The capital of France is" -n 3 --temp 0 -t 2
expect run_log_flags_accepted 0 "Paris" "$M" -- nm run -m "$M" --log-disable -v --no-warmup -no-cnv -p "The capital of France is" -n 3 --temp 0 -t 2
# hints: a model given to the command that does not take it says which does (issue 45)
case_flag_first() { nm -m "$M" -p hi 2>&1 | tr '\n' ' '; }
expect flag_before_command_hint 2 "unknown command '-m' hint: a command comes first: nanomind run -m" -- case_flag_first
expect run_whisper_model_hint 1 "hint: '[^']*whisper-tiny.en.gguf' is a Whisper model \(speech to text\): nanomind transcribe -m" "$WM" -- nm run -m "$WM" -p hi
expect run_mmproj_as_model_hint 1 "hint: '[^']*vlm-mmproj-q8_0.gguf' is an mmproj \(a vision encoder\): give it with --mmproj" -- nm run -m tests/data/vlm/vlm-mmproj-q8_0.gguf -p hi
expect transcribe_llm_hint 1 "hint: '[^']*SmolLM2-135M-Instruct.Q4_1.gguf' is a language model \(llama\): give it with -m: nanomind run -m" "$M" -- nm transcribe -m "$M" tests/data/speech/tts_16k.wav
expect mmproj_llm_hint 1 "hint: '[^']*SmolLM2-135M-Instruct.Q4_1.gguf' is a language model" "$M" -- nm run -m "$M" --mmproj "$M" --image tests/data/vlm/scene-4242-1.ppm -p hi
expect unknown_flag 2 "unknown option '--bogus'" -- nm run -m "$M" -p hi --bogus
expect bad_int 2 "-n needs an integer" -- nm run -m "$M" -p hi -n many
expect missing_model 1 "cannot load '/nonexistent.gguf'.*No such file" -- nm run -m /nonexistent.gguf -p hi
[ -f "$M" ] && setup "truncated copy of $M" "$tmp/trunc.gguf" head -c 100 "$M"
expect truncated_model 1 "malformed input" "$M" -- nm run -m "$tmp/trunc.gguf" -p hi
expect info_corrupt 1 "alignment" -- nm info tests/fuzz/corpus/gguf/bad-align-3.gguf
expect unknown_template 2 "unknown chat template 'bogus' \\(known: chatml" -- nm run -m "$M" --chat --chat-template bogus -p hi
expect template_without_chat 2 "only applies to a conversation \\(not with -no-cnv\\)" -- nm run -m "$M" --chat-template chatml -no-cnv -p hi
expect empty_int 2 "-n needs an integer in \\[-1, [0-9]+\\] \\(-1: until the end of text or a full context\\), got ''" -- nm run -m "$M" -p hi -n ""
expect nan_temp 2 "--temp needs a number" -- nm run -m "$M" -p hi --temp nan
expect too_many_threads 2 "-t needs an integer in \\[-1, [0-9]+\\] \\(-1: all cores; at most 4 per core\\), got '100000'" -- nm run -m "$M" -p hi -t 100000
expect ppl_tiny_chunk 1 "at least 4 tokens" "$M" -- nm perplexity -m "$M" -f tests/data/declaration.txt -c 2
expect prompt_too_long 1 "does not fit the context" "$M" -- nm run -m "$M" -c 16 -f tests/data/declaration.txt
expect ppl_too_short 1 "do not fill one chunk" "$M" -- nm perplexity -m "$M" -f tests/data/declaration.txt -c 4096

# real runs
expect info_real 0 "general.architecture +str += \"llama\"" "$M" -- nm info "$M"
expect run_greedy 0 "The capital of France is Paris" "$M" -- nm run -m "$M" -no-cnv -p "The capital of France is" -n 4 --temp 0 -t 2
# the same seed twice: the same text, and some text beyond the prompt
case_seeded_same() {
    local a b
    a=$(nm run -m "$M" -no-cnv -p Once -n 12 --seed 7 -t 2 2>/dev/null)
    b=$(nm run -m "$M" -no-cnv -p Once -n 12 --seed 7 -t 2 2>/dev/null)
    if [ "$a" = "$b" ]; then echo "same: $a"; else printf 'differ:\n%s\n---\n%s\n' "$a" "$b"; fi
}
expect run_seeded_same 0 "^same: Once.+" "$M" -- case_seeded_same
# Ctrl-C while the model answers: the answer is cancelled (the request marked
# on the LLM brick's ring), the stats still print, and the one-shot run exits
# 130 as llama-cli does; a chat goes back to its prompt. (A run killed by the
# signal would print neither "[cancelled]" nor the stats.)
# interrupt FILE ARGS...: runs nanomind ARGS, stdout to FILE, and sends SIGINT
# once FILE holds 40 bytes of the answer; its status goes to $tmp/rc.
interrupt() {
    local out=$1 pid rc i
    shift
    "$NM" "$@" <&0 > "$out" 2> "$out.err" & # (stdin named: a background job would get /dev/null)
    pid=$!
    for i in $(seq 600); do [ "$(wc -c < "$out")" -ge 40 ] && break; sleep 0.1; done
    kill -INT "$pid"
    for i in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && { echo "still running 30 s after Ctrl-C"; kill -9 "$pid"; }
    wait "$pid"
    rc=$?
    { cat "$out.err"; echo "exit $rc"; } | tr '\n' ' '
    [ "$rc" = 130 ] && rc=0 # the status the command chose (its stats above say it was not killed)
    echo "$rc" >> "$tmp/rc"
}
case_ctrl_c() { interrupt "$tmp/ctrlc.txt" run -m "$M" -p "Once upon a time" -n -1 --ignore-eos -t 2 --stats; }
expect run_ctrl_c_cancels 0 "\\[cancelled\\].*generation: [0-9]+ tokens.*exit 130" "$M" -- case_ctrl_c
case_ctrl_c_chat() {
    mkfifo "$tmp/chat.in"
    # the question, then the end of input once the answer was cancelled
    { echo "Tell me a very long story."
      for i in $(seq 600); do grep -q cancelled "$tmp/ctrlc-chat.txt.err" 2>/dev/null && break; sleep 0.1; done
    } > "$tmp/chat.in" &
    local feeder=$!
    interrupt "$tmp/ctrlc-chat.txt" run -m "$M" --chat -n -1 --ignore-eos -t 2 --stats < "$tmp/chat.in"
    kill "$feeder" 2>/dev/null
}
expect run_ctrl_c_chat_goes_on 0 "> .*\\[cancelled\\].*> .*generation: [0-9]+ tokens.*exit 0" "$M" -- case_ctrl_c_chat
case_chat_stdin() { printf 'Name the capital of France.\n' | nm run -m "$M" --chat --temp 0 -n 16 -t 2; }
expect chat_stdin 0 "Paris" "$M" -- case_chat_stdin
expect stats_ledger 0 "mapped from the model file" "$M" -- nm run -m "$M" -p "Hi" -n 2 --temp 0 --stats
# --stats: the run goes through the LLM brick's rings; the ledger line reports the copies between bricks (none)
expect stats_ledger_line 0 "ledger: 0 bytes copied between bricks \\(0 copies\\)" "$M" -- nm run -m "$M" -p "Hi" -n 2 --temp 0 --stats
case_stats_ledger_chat() { printf 'Hi\nAgain\n' | nm run -m "$M" --chat --temp 0 -n 4 -t 2 --stats; }
expect stats_ledger_chat 0 "ledger: 0 bytes copied between bricks \\(0 copies\\)" "$M" -- case_stats_ledger_chat
# without --stats: a run that printed its text, and no ledger line in it
case_no_ledger() {
    nm run -m "$M" -p Hi -n 2 --temp 0 > "$tmp/noledger.txt" 2>&1
    echo "bytes=$(wc -c < "$tmp/noledger.txt") ledger_lines=$(grep -c ledger "$tmp/noledger.txt")"
}
expect no_ledger_without_stats 0 "^bytes=[1-9][0-9]* ledger_lines=0$" "$M" -- case_no_ledger
# profile and the planner: the CPU measured into a file, shown back, and run --plan placing the bricks from it
case_profile() {
    nm profile --units cpu -o "$tmp/prof.json" > "$tmp/prof.txt" 2>&1
    grep -E '^cpu +[0-9.]+' "$tmp/prof.txt" | head -1 | tr -s ' ' | cut -d' ' -f1-3 | tr '\n' ' '
    nm profile --show -o "$tmp/prof.json" > "$tmp/show.txt"
    echo "shown: $(grep -c '^cpu ' "$tmp/show.txt")" # its matmul, decode and watts rows
}
expect profile_cpu 0 "^cpu [0-9.]+ [0-9.]+ shown: 3$" -- case_profile
case_plan() {
    nm profile --units cpu,cpu:0 -o "$tmp/prof2.json" > /dev/null 2>&1
    nm run -m "$M" -p "Hello there" -n 8 --plan --plan-goal throughput --profile "$tmp/prof2.json" | tr '\n' ' '
}
expect run_plan 0 "request: [0-9]+ prompt positions .* 8 generated; goal: throughput; .*llm +estimate: [0-9.]+ GFLOP.*plan: [0-9]+ placements considered.* llm .*(on|layers).*latency [0-9.]+ ms a request, period" "$M" -- case_plan
# a plan from a profile without watts (none seen here: no meter) says the energy is unknown, not 0 J
case_plan_no_watts() {
    nm profile --units cpu -o "$tmp/prof3.json" --no-watts > /dev/null 2>&1
    nm run -m "$M" -p "Hello there" -n 4 --plan --profile "$tmp/prof3.json" | grep -E "J a request|unknown"
}
expect run_plan_energy_unknown 0 "^latency [0-9.]+ ms a request, .*energy a request unknown \\(no unit's watts" "$M" -- case_plan_no_watts
# help and notes that tell the truth (issue 45): the device options in every LLM command's help, a clock
# that is not known said so, -c past the training context warned of as llama.cpp does
help_of() { nm "$1" --help | tr '\n' ' '; }
for c in run perplexity bench; do
    expect "help_${c}_device" 0 "-dev, --device DEV .*-ngl, --n-gpu-layers N .*--no-mmap" -- help_of $c
done
case_list_devices_no_zero_clock() { nm --list-devices > "$tmp/dev.txt"; ! grep -q "max 0.00 GHz" "$tmp/dev.txt" && echo none; }
expect list_devices_no_zero_clock 0 "^none$" -- case_list_devices_no_zero_clock
expect ctx_past_training_warned 0 "warning: -c 9000 is more than the model's training context \\(8192\\)" "$M" -- nm run -m "$M" -c 9000 -p hi -n 1 --temp 0
expect run_plan_no_profile 1 "none.json: cannot open: No such file or directory \\(i/o error\\): measure the units first with .nanomind profile." "$M" -- nm run -m "$M" -p hi --plan --profile "$tmp/none.json"
expect run_plan_goal_bad 2 "--plan-goal 'fast': latency, throughput or energy" "$M" -- nm run -m "$M" -p hi --plan --plan-goal fast
expect run_plan_goal_without_plan 2 "--plan-goal and --profile go with --plan" "$M" -- nm run -m "$M" -p hi --plan-goal energy
expect profile_bad_unit 2 "unit 'gpu': cpu, cpu:big" -- nm profile --units gpu -o "$tmp/x.json"
expect run_cores_offline 2 "--cores: cores '999': core 999 is past the 256|--cores: cores '999'" "$M" -- nm run -m "$M" -p hi --cores 999
expect bench_no_cores 2 "nanomind bench does not take --cores" "$M" -- nm bench -m "$M" --cores 0
expect bench_tg_only 0 "tg4 " "$M" -- nm bench -m "$M" -p 0 -n 4 -r 1
# NM_PROFILE=1: the CPU backend's time per (op, weight type) on stderr when it is freed
case_profile() { NM_PROFILE=1 nm run -m "$M" -p "The capital of France is" -n 4 --temp 0; }
expect profile_ops 0 "matmul +q4_1 +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+% +[0-9.]+" "$M" -- case_profile
expect bench_json 0 "\"pp_tps\": [0-9.]+, .*\"tg_tps\": [0-9.]+, .*\"peak_rss_bytes\": [0-9]+, .*\"roofline_pct\": [0-9.]+" "$M" -- nm bench -m "$M" -p 8 -n 4 -r 1 --json

# images: a random-weight mmproj sized for SmolLM2 (576-wide embeddings) from the
# generator next to the binary, a PPM written here
GEN=$(dirname "$NM")/nm-genmmproj
setup "nm-genmmproj mm.gguf" /dev/null "$GEN" -o "$tmp/mm.gguf" --proj mlp --n-out 576 --image-size 64 --patch-size 16
setup "nm-genmmproj mm-sv.gguf" /dev/null "$GEN" -o "$tmp/mm-sv.gguf" --proj idefics3 --n-out 576 --image-size 64 --patch-size 8
setup "nm-genmmproj mm-wide.gguf" /dev/null "$GEN" -o "$tmp/mm-wide.gguf" --proj mlp --n-out 960 --image-size 64 --patch-size 16
setup "nm-genmmproj mm-any.gguf" /dev/null "$GEN" -o "$tmp/mm-any.gguf" --proj mlp --n-out 576 --image-size 64 --patch-size 16 --pinpoints 64,128,128,64,128,128
setup wide.ppm "$tmp/wide.ppm" python3 -c "import sys; w,h=150,90; sys.stdout.buffer.write(b'P6\n%d %d\n255\n'%(w,h)+bytes((x*3+y*5+c*70)%256 for y in range(h) for x in range(w) for c in range(3)))"
setup img.ppm "$tmp/img.ppm" python3 -c "import sys; w,h=40,30; sys.stdout.buffer.write(b'P6\n%d %d\n255\n'%(w,h)+bytes((x*6+c*40)%256 for y in range(h) for x in range(w) for c in range(3)))"
printf '\x89PNG\r\n\x1a\nnot really a png' > "$tmp/bad.png"
expect image_needs_mmproj 2 "--image needs --mmproj" -- nm run -m "$M" --image "$tmp/img.ppm" -p hi
expect mmproj_needs_image 2 "--mmproj needs at least one --image" -- nm run -m "$M" --mmproj "$tmp/mm.gguf" -p hi
expect image_corrupt 1 "^error: image .*bad.png: png: truncated data \\(malformed input\\)$" "$M" -- nm run -m "$M" --mmproj "$tmp/mm.gguf" --image "$tmp/bad.png" -p hi -n 2
expect image_missing 1 "^error: image /nonexistent.png: cannot open: No such file or directory \\(i/o error\\)$" "$M" -- nm run -m "$M" --mmproj "$tmp/mm.gguf" --image /nonexistent.png -p hi -n 2
expect mmproj_width_mismatch 1 "960-wide embeddings but the language model's embedding width is 576" "$M" -- nm run -m "$M" --mmproj "$tmp/mm-wide.gguf" --image "$tmp/img.ppm" -p hi
expect mmproj_not_mmproj 1 "cannot load mmproj.*not an mmproj file" "$M" -- nm run -m "$M" --mmproj "$M" --image "$tmp/img.ppm" -p hi
expect image_marker_count 1 "2 <__media__> markers for 1 images" "$M" -- nm run -m "$M" --mmproj "$tmp/mm.gguf" --image "$tmp/img.ppm" -p "<__media__><__media__>hi"
# an image prompt through the rings: the embeddings are decoded where the encoder wrote them
expect bench_mmproj 0 "^encode +[0-9.]+ ± [0-9.]+ ms per encoder run \\(1 a request\\)" -- nm bench --mmproj "$tmp/mm.gguf" -r 2 -t 2
expect bench_mmproj_json 0 "^\\{\"cpu\": .*\"mmproj\": \"[^\"]*mm.gguf\", \"threads\": 2, \"reps\": 2, \"image_size\": 64, \"n_patches\": 16, \"n_tokens\": 16, \"runs_per_image\": 1, \"encode_ms\": [0-9.]+, \"encode_ms_sd\": [0-9.]+\\}$" -- nm bench --mmproj "$tmp/mm.gguf" -r 2 -t 2 -o json
# idefics3 cuts even an image of the input size into tiles when its longest edge is larger:
# 256 px in tiles of 64, 4 x 4 and the overview, each a slot of the bench's ring (it hung on 4)
setup "nm-genmmproj mm-sv256.gguf" /dev/null "$GEN" -o "$tmp/mm-sv256.gguf" --proj idefics3 --n-out 576 --image-size 64 --patch-size 8 --preproc-image-size 256
expect bench_mmproj_tiles 0 "ms per encoder run \\(17 a request\\)" -- nm bench --mmproj "$tmp/mm-sv256.gguf" -r 1 -t 2
expect bench_mmproj_no_image 2 "it takes no --image" -- nm bench --mmproj "$tmp/mm.gguf" --image "$tmp/img.ppm"
expect bench_mmproj_and_model 2 "-m MODEL or --mmproj MMPROJ, one at a time" "$M" -- nm bench -m "$M" --mmproj "$tmp/mm.gguf"
expect bench_mmproj_not_mmproj 1 "not an mmproj file: no clip.projector_type key" "$M" -- nm bench --mmproj "$M"
case_image_chat() { nm run -m "$M" --mmproj "$tmp/mm.gguf" --image "$tmp/img.ppm" -p 'What is this?' --chat --temp 0 -n 4 -t 2 --stats 2>&1 | tr '\n' ' '; }
expect image_chat_zero_copy 0 "vision: 1 images, 1 encoder runs.*ledger: 0 bytes copied between bricks \(0 copies\)" "$M" -- case_image_chat
# LLaVA-1.6-style anyres: 150x90 -> the 128x128 pinpoint, 2x2 tiles and the overview
case_image_anyres() { nm run -m "$M" -no-cnv --mmproj "$tmp/mm-any.gguf" --image "$tmp/wide.ppm" -p 'A<__media__>B' --temp 0 -n 4 -t 2 --stats 2>&1 | tr '\n' ' '; }
expect image_anyres_tiles 0 "prompt: 8[0-9] tokens.*vision: 1 images, 5 encoder runs.*ledger: 0 bytes copied" "$M" -- case_image_anyres
case_image_smolvlm() { nm run -m "$M" --mmproj "$tmp/mm-sv.gguf" --image "$tmp/img.ppm" --image "$tmp/img.ppm" -p 'A<__media__>and<__media__>' --temp 0 -n 4 -t 2 --stats 2>&1 | tr '\n' ' '; }
expect image_smolvlm_tiles 0 "vision: 2 images, [0-9]+ encoder runs.*ledger: 0 bytes copied" "$M" -- case_image_smolvlm

# the perplexity tool over several batches per chunk (-b 64 < -c 256), against llama.cpp's value
expect ppl_multibatch 0 "PPL = 20\\.(8|9)|PPL = 21\\.0" "$M" -- nm perplexity -m "$M" -f tests/data/declaration.txt -c 256 -b 64 -t 2

# say: text to speech (espeak-ng) into a WAV file through the TTS brick's ring
expect help_say 0 "usage: nanomind say" -- nm say --help
case_say_wav() {
    rm -f "$tmp/say.wav"
    nm say 'Hello from nanomind.' -o "$tmp/say.wav" || return
    python3 -c "import sys,wave,struct; b=open(sys.argv[1],'rb').read(44); w=wave.open(sys.argv[1]); print(b[:4].decode(), b[8:12].decode(), w.getnchannels(), 8*w.getsampwidth(), w.getframerate(), 'frames=%d' % w.getnframes())" "$tmp/say.wav"
}
expect say_wav 0 "RIFF WAVE 1 16 22050 frames=[0-9]{5,}" -- case_say_wav
case_say_same_twice() {
    rm -f "$tmp/s1.wav" "$tmp/s2.wav"
    nm say 'Seven plus five.' -o "$tmp/s1.wav" && nm say 'Seven plus five.' -o "$tmp/s2.wav" || return
    [ -s "$tmp/s1.wav" ] && cmp -s "$tmp/s1.wav" "$tmp/s2.wav" && echo same
}
expect say_same_twice 0 "^same$" -- case_say_same_twice
case_say_stdin_16k() {
    rm -f "$tmp/say16.wav"
    echo 'Text from standard input.' | nm say - -o "$tmp/say16.wav" --sample-rate 16000 || return
    file "$tmp/say16.wav"
}
expect say_stdin_16k 0 "mono 16000 Hz" -- case_say_stdin_16k
# --stats: espeak-ng hands out its own buffers, so at the native rate each
# sample is copied once out of them into a slot, counted espeak-ng -> tts: the
# WAV's bytes (2 bytes a frame); the text goes once into the brick's slot (20
# bytes, caller -> tts) and once into espeak-ng's input (tts -> espeak-ng);
# nothing else is copied
case_say_stats() {
    rm -f "$tmp/say.wav"
    nm say 'Counting the copies.' -o "$tmp/say.wav" --stats 2>&1 | tr '\n' ' '
    python3 -c "import sys,wave; print('wav_bytes=%d' % (2 * wave.open(sys.argv[1]).getnframes()))" "$tmp/say.wav" 2>&1
}
expect say_stats 0 "real-time factor [0-9.]+.*ledger: [1-9][0-9]* bytes copied between bricks \\(([0-9]+) copies\\) ledger: +caller -> tts: 20 bytes \\(1 copies\\) ledger: +tts -> espeak-ng: 20 bytes \\(1 copies\\) ledger: +espeak-ng -> tts: ([1-9][0-9]*) bytes \\([0-9]+ copies\\) .*wav_bytes=\\2$" -- case_say_stats
case_say_list_voices() { nm say --list-voices 2>/dev/null > "$tmp/voices.txt"; grep '^en-us ' "$tmp/voices.txt"; }
expect say_list_voices 0 "^en-us +English" -- case_say_list_voices
expect say_bad_voice 1 "unknown espeak-ng voice 'xx-bogus'" -- nm say hello -o "$tmp/bad.wav" --voice xx-bogus
expect say_empty_text 1 "empty text" -- nm say "   " -o "$tmp/empty.wav"
expect say_no_output 2 "no output: give -o OUT.wav or --stdout" -- nm say hello
# compressed speech: by the extension or --format, heard back by the transcriber (which reads them all)
case_say_encoded() {
    local f
    for f in mp3 opus flac; do
        nm say "Hello there, how are you today?" -o "$tmp/hello.$f" || return
        printf '%s: %s ' "$f" "$(head -c 4 "$tmp/hello.$f" | od -An -tx1 | tr -d ' \n')"
        nm transcribe -m "$WM" "$tmp/hello.$f" -t 2 -nt 2>/dev/null | tr '\n' ' '
    done
    printf 'stdout: %s' "$(nm say hi --stdout --format opus | head -c 4)"
}
expect say_mp3_opus_flac 0 "^mp3: fff3[0-9a-f]{4} Hello there, how are you today\? opus: 4f676753 Hello there, how are you today\? flac: 664c6143 Hello there, how are you today\? stdout: OggS$" "$WM" -- case_say_encoded
expect say_bad_format 2 "--format takes wav, mp3, opus or flac, not 'aac'" -- nm say hello -o "$tmp/x.aac" --format aac
expect say_opus_rate 1 "Opus takes 8, 12, 16, 24 or 48 kHz, not 22050 Hz" -- nm say hello -o "$tmp/x.opus" --sample-rate 22050

# transcribe: Whisper speech to text (errors first; real runs need whisper-tiny.en.gguf from set-up)
SPEECH=tests/data/speech
# A case's output (stdout and stderr) on one line, for a pattern across its lines.
oneline() { "$@" 2>&1 | tr '\n' ' '; echo; }
expect help_transcribe 0 "usage: nanomind transcribe" -- nm transcribe --help
expect transcribe_no_audio 2 "no audio file" -- nm transcribe -m "$WM"
expect transcribe_missing_model 1 "cannot load '/nonexistent.bin'" -- nm transcribe -m /nonexistent.bin $SPEECH/tts_16k.wav
setup "truncated copy of tts_16k.wav" "$tmp/trunc.wav" head -c 30 $SPEECH/tts_16k.wav
expect transcribe_truncated_audio 1 "cannot read audio" "$WM" -- nm transcribe -m "$WM" "$tmp/trunc.wav"
expect transcribe_bad_language 2 "unknown language 'xx'" "$WM" -- nm transcribe -m "$WM" -l xx $SPEECH/tts_16k.wav
expect transcribe_text 0 "^[^[]*quick brown fox" "$WM" -- nm transcribe -m "$WM" $SPEECH/tts_16k.wav -t 2 --beam-size 1 -nt
expect transcribe_timestamps 0 "^\[00:00:00.000 --> 00:00:0[0-9].[0-9]{3}\]   The quick" "$WM" -- nm transcribe -m "$WM" $SPEECH/tts_16k.wav -t 2 --beam-size 1 --timestamps
# timestamps by default, as whisper-cli and the library's STT brick (issue 45): the same decode, the same text
expect transcribe_timestamps_by_default 0 "^\[00:00:00.000 --> 00:00:0[0-9].[0-9]{3}\]   The quick" "$WM" -- nm transcribe -m "$WM" $SPEECH/tts_16k.wav -t 2 --beam-size 1
# SRT: the first cue's number, its time range and its text (captured first: no pipe into head)
case_transcribe_srt() {
    nm transcribe -m "$WM" $SPEECH/tts_48k.wav -t 2 --beam-size 1 --print-srt > "$tmp/out.srt" 2>/dev/null
    head -3 "$tmp/out.srt" | tr '\n' ' '
}
expect transcribe_srt 0 "^1 00:00:00,000 --> 00:00:[0-9]{2},[0-9]{3}  Good morning" "$WM" -- case_transcribe_srt
expect transcribe_json 0 "\"segments\": \[" "$WM" -- nm transcribe -m "$WM" $SPEECH/tts_48k.wav -t 2 --beam-size 1 --print-json
case_transcribe_stdin() { nm transcribe -m "$WM" - -t 2 --beam-size 1 < $SPEECH/tts_8k.wav; }
expect transcribe_stdin_8k 0 "leave your name" "$WM" -- case_transcribe_stdin
case_transcribe_stats() { nm transcribe -m "$WM" $SPEECH/tts_48k.wav -t 2 --beam-size 1 --stats 2>&1 | tr '\n' ' '; }
# a file is decoded straight into the brick's slot: no copy; from stdin (length unknown) one, counted
expect transcribe_stats 0 "real-time factor [0-9.]+.*ledger: 0 bytes copied between bricks \\(0 copies\\)" "$WM" -- case_transcribe_stats
case_transcribe_stats_stdin() { nm transcribe -m "$WM" - -t 2 --beam-size 1 --stats < $SPEECH/tts_48k.wav 2>&1 | tr '\n' ' '; }
expect transcribe_stats_stdin 0 "real-time factor [0-9.]+.*ledger: [1-9][0-9]* bytes copied between bricks \\(1 copies\\)" "$WM" -- case_transcribe_stats_stdin
# --prompt goes to the STT brick with the request (its tokens lead the windows): whisper-cli's transcript
case_transcribe_prompt() {
    nm transcribe -m "$WM" $SPEECH/tts_long.ogg -t 2 -bs 1 --prompt "Speech recognition on small devices. The engine \
computes the log-mel spectrogram and runs the encoder once per window, and the decoder emits the words one token at a \
time." 2>/dev/null > "$tmp/prompt.txt"
    cmp "$tmp/prompt.txt" tests/data/speech/expected/tts_long.ogg.prompt-greedy-ts.txt && echo same as whisper-cli
}
expect transcribe_prompt_as_whisper_cli 0 "^same as whisper-cli$" "$WM" -- case_transcribe_prompt
# assistant: the whole loop in one process (errors first; real runs on the default models)
expect help_assistant 0 "usage: nanomind assistant" -- nm assistant --help
expect assistant_no_question 2 "give the questions: --audio FILE\\|DIR .* or -p TEXT" "$M" -- nm assistant -m "$M"
expect assistant_both_questions 2 "one of the two" "$M" -- nm assistant -m "$M" -p hi --audio $SPEECH/tts_16k.wav --stt "$WM"
expect assistant_audio_needs_stt 2 "--audio needs a Whisper model: --stt FILE" "$M" -- nm assistant -m "$M" --audio $SPEECH/tts_16k.wav
expect assistant_frames_need_mmproj 2 "--frames and --mmproj go together" "$M" -- nm assistant -m "$M" -p hi --frames "$tmp"
expect assistant_fps_needs_frames 2 "--fps goes with --frames" "$M" -- nm assistant -m "$M" -p hi --fps 2
expect assistant_bad_fps 2 "--fps needs a number in \\[0, 1000\\], got 'fast'" "$M" -- nm assistant -m "$M" -p hi --fps fast
expect assistant_bad_tts 2 "--tts takes espeak-ng, piper or none, not 'festival'" "$M" -- nm assistant -m "$M" -p hi --tts festival
expect assistant_out_not_folder 2 "--out '/nonexistent/dir': No such file or directory" "$M" -- nm assistant -m "$M" -p hi --out /nonexistent/dir
expect assistant_no_image_flag 2 "takes its images from --frames, not --image" "$M" -- nm assistant -m "$M" -p hi --image "$tmp/img.ppm"
expect assistant_unknown_flag 2 "unknown option '--bogus' \\(see nanomind assistant --help\\)" "$M" -- nm assistant -m "$M" -p hi --bogus
expect assistant_missing_audio 1 "error: --audio '/nonexistent.wav': No such file or directory" "$M" "$WM" -- nm assistant -m "$M" --stt "$WM" --audio /nonexistent.wav
mkdir -p "$tmp/frames3" "$tmp/asked" "$tmp/answers"
for f in a b c; do cp "$tmp/img.ppm" "$tmp/frames3/$f.ppm"; done
expect assistant_frames_questions_mismatch 1 "3 frames and 1 spoken questions" "$M" "$WM" -- nm assistant -m "$M" --stt "$WM" --audio $SPEECH/tts_16k.wav --mmproj "$tmp/mm.gguf" --frames "$tmp/frames3"
# a typed question, text only
expect assistant_typed 0 "^> The capital of France is" "$M" -- nm assistant -m "$M" -p "The capital of France is" -n 8 --temp 0 -t 2
# a spoken question answered aloud: the transcript, the answer's WAV, the latency figures
# (the first sentence is spoken before the answer's last token: speech starts while the decoder goes on)
case_assistant_spoken() {
    rm -f "$tmp/answers/"*
    nm assistant -m "$M" --stt "$WM" --audio $SPEECH/tts_16k.wav --out "$tmp/answers" -n 48 --temp 0 -t 2 --stats > "$tmp/spoken.txt" 2>&1
    tr '\n' ' ' < "$tmp/spoken.txt"
    python3 - "$tmp/spoken.txt" "$tmp/answers/answer-001.wav" <<'PY' 2>&1 | tr '\n' ' '
import re, sys, wave
t = open(sys.argv[1]).read()
m = re.search(r"last token ([0-9.]+) s, first audio ([0-9.]+) s", t)
print("spoken before the last token" if m and float(m.group(2)) < float(m.group(1)) else "spoken after the answer: %s" % (m and m.groups(),))
w = wave.open(sys.argv[2])
print("answer_wav_frames=%d rate=%d" % (w.getnframes(), w.getframerate()))
PY
}
expect assistant_spoken 0 "^> The quick brown fox.*first audio [0-9.]+ s, spoken [0-9.]+ s \\([0-9.]+ s of speech\\).*end of question -> first audio sample: median [0-9.]+ s.*the microphone's audio into the STT slots 0, the transcripts into the chats [1-9][0-9]*, the answers' sentences into the voice [1-9][0-9]*, espeak-ng's text and samples [1-9][0-9]*, anything else 0 .*spoken before the last token answer_wav_frames=[1-9][0-9]* rate=22050" "$M" "$WM" -- case_assistant_spoken
case_assistant_piper() {
    rm -f "$tmp/answers/"*
    nm assistant -m "$M" --stt "$WM" --audio $SPEECH/tts_16k.wav --out "$tmp/answers" --tts piper --voice "$PV" -n 24 \
        --temp 0 -t 2 --stats 2>&1 | grep -E "^> |ledger" | tr '\n' ' '
    nm transcribe -m "$WM" "$tmp/answers/answer-001.wav" > "$tmp/answer-heard.txt" 2>/dev/null || return
    head -c 60 "$tmp/answer-heard.txt" # (from a file: a pipe closed early would end nanomind with SIGPIPE)
}
expect assistant_piper 0 "^> The quick brown fox.*piper's text and samples [1-9][0-9]*, anything else 0 .*\[00:00:00" "$M" "$WM" "$PV" -- case_assistant_piper
# frames and spoken questions, pipelined and sequential: the same answers (greedy), one per frame, in order
case_assistant_frames() {
    cp $SPEECH/tts_16k.wav "$tmp/asked/1.wav"; cp $SPEECH/tts_16k.wav "$tmp/asked/2.wav"; cp $SPEECH/tts_16k.wav "$tmp/asked/3.wav"
    nm assistant -m "$M" --stt "$WM" --audio "$tmp/asked" --mmproj "$tmp/mm.gguf" --frames "$tmp/frames3" -n 6 --temp 0 -t 2 --stats > "$tmp/pipelined.txt" 2> "$tmp/pipelined.err"
    nm assistant -m "$M" --stt "$WM" --audio "$tmp/asked" --mmproj "$tmp/mm.gguf" --frames "$tmp/frames3" -n 6 --temp 0 -t 2 --stats --sequential > "$tmp/sequential.txt" 2> "$tmp/sequential.err"
    local same=differ
    cmp -s "$tmp/pipelined.txt" "$tmp/sequential.txt" && same="pipelined = sequential"
    echo -n "questions: $(grep -c '^> The quick' "$tmp/pipelined.txt") $same "
    # sequential: each question taken once the last answer was written; pipelined: some taken before
    python3 - "$tmp/pipelined.err" "$tmp/sequential.err" <<'PY' 2>&1 | tr '\n' ' '
import re, sys
for name, path in zip(("pipelined", "sequential"), sys.argv[1:]):
    q = [(float(a), float(b)) for a, b in re.findall(r"\(at ([0-9.]+) s\):.*last token ([0-9.]+) s", open(path).read())]
    after = all(q[i][0] >= q[i - 1][0] + q[i - 1][1] - 0.002 for i in range(1, len(q)))
    print("%s: %d questions, each after the last answer: %s" % (name, len(q), after))
PY
}
expect assistant_frames 0 "questions: 3 pipelined = sequential pipelined: 3 questions, each after the last answer: False sequential: 3 questions, each after the last answer: True" "$M" "$WM" -- case_assistant_frames
# devices (ALSA, which set-up installs): a microphone and a speaker. The microphone is ALSA's file
# plugin reading two spoken sentences with silence around them (its .asoundrc in a HOME of the
# test's own): the utterance cutter makes them two questions; the speaker is ALSA's null device.
# Absent devices: the microphone is an error, the speaker is skipped with a message.
mkdir -p "$tmp/home"
python3 - "$tmp/mic.raw" <<'PY'
import random, struct, sys, wave
w = wave.open("tests/data/speech/tts_16k.wav")
speech = w.readframes(w.getnframes())
random.seed(1)
quiet = lambda s: b"".join(struct.pack("<h", random.randint(-30, 30)) for _ in range(int(16000 * s)))
open(sys.argv[1], "wb").write(quiet(1.0) + speech + quiet(1.5) + speech + quiet(1.5))
PY
printf 'pcm.questions {\n type file\n slave.pcm null\n file "/dev/null"\n infile "%s"\n format "raw"\n}\n' "$tmp/mic.raw" > "$tmp/home/.asoundrc"
case_assistant_mic() { HOME="$tmp/home" nm assistant -m "$M" --stt "$WM" --audio mic:questions --listen 12 -n 4 --temp 0 -t 2 --stats 2>&1 | tr '\n' ' '; }
expect assistant_mic 0 "listening on 'questions'.*> The quick brown fox.*> The quick brown fox.*2 questions in .*the microphone's audio into the STT slots [1-9][0-9]*, the transcripts into the chats [1-9][0-9]*, the answers' sentences into the voice 0, espeak-ng's text and samples 0, anything else 0" "$M" "$WM" -- case_assistant_mic
expect assistant_mic_absent 1 "error: microphone: audio: cannot open capture device 'nm-no-such-mic'" "$M" "$WM" -- nm assistant -m "$M" --stt "$WM" --audio mic:nm-no-such-mic --listen 1
expect assistant_listen_needs_mic 2 "--listen goes with --audio mic" "$M" -- nm assistant -m "$M" -p hi --listen 3
expect assistant_barge_in_needs_mic 2 "--barge-in goes with --audio mic" "$M" -- nm assistant -m "$M" -p hi --barge-in
case_assistant_speaker() { nm assistant -m "$M" -p "Say hello." --out speaker:null -n 8 --temp 0 -t 2 --stats 2>&1 | tr '\n' ' '; }
expect assistant_speaker 0 "> Say hello\\..*first audio [0-9.]+ s, spoken [0-9.]+ s \\([0-9.]*[1-9][0-9.]* s of speech\\)" "$M" -- case_assistant_speaker
case_assistant_speaker_absent() { nm assistant -m "$M" -p "Say hello." --out speaker:nm-no-such-speaker -n 4 --temp 0 -t 2 2>&1 | tr '\n' ' '; }
expect assistant_speaker_absent 0 "speaker skipped: audio: cannot play on 'nm-no-such-speaker'.*> Say hello" "$M" -- case_assistant_speaker_absent
# events: a watched folder (each audio file written and closed there, or moved in, is a question;
# other files and files already there are not), wake words (a question without one is not
# answered; the word is taken off the question; "the qui" is not a word "The quick" starts with), a camera's frames arriving in a folder with
# --frame-change (a frame like the last one asked about wakes nothing)
# drop ERR DIR SRC:NAME...: once the assistant says it is watching (in ERR), each SRC into DIR/NAME,
# the first by a rename (a writer's atomic way), the others written in place; 0.7 s apart
drop() {
    local err=$1 dir=$2 k=0 f
    shift 2
    for _ in $(seq 300); do grep -q "^watching" "$err" 2>/dev/null && break; sleep 0.1; done
    for f in "$@"; do
        if [ $k = 0 ]; then cp "${f%%:*}" "$dir/.part" && mv "$dir/.part" "$dir/${f#*:}"; else cp "${f%%:*}" "$dir/${f#*:}"; fi
        k=$((k + 1)); sleep 0.7
    done
}
case_assistant_watch() {
    rm -rf "$tmp/watch" "$tmp/watch.out"; mkdir -p "$tmp/watch" "$tmp/watch.out"
    cp $SPEECH/tts_16k.wav "$tmp/watch/already-there.wav"; echo "not a question" > "$tmp/notes.txt"
    drop "$tmp/watch.err" "$tmp/watch" $SPEECH/tts_16k.wav:q1.wav "$tmp/notes.txt:notes.txt" $SPEECH/tts_16k.wav:q2.wav &
    nm assistant -m "$M" --stt "$WM" --audio "watch:$tmp/watch" --listen 8 --wake-words "Hey nano, the quick" \
        --out "$tmp/watch.out" -n 4 --temp 0 -t 2 > "$tmp/watch.txt" 2> "$tmp/watch.err"
    wait
    cat "$tmp/watch.txt" "$tmp/watch.err"; ls "$tmp/watch.out"
}
expect assistant_watch_folder 0 "^> brown fox jump.*> brown fox jump.*watching '.*/watch' for questions answer-001.wav answer-002.wav $" "$M" "$WM" -- oneline case_assistant_watch
case_assistant_no_wake_word() { nm assistant -m "$M" --stt "$WM" --audio $SPEECH/tts_16k.wav --wake-words "computer,the qui" -n 4 --temp 0 -t 2 --stats; }
expect assistant_no_wake_word 0 "question 1: no wake word: \"The quick brown fox.*; 0 tokens \(not answered: no wake word\) 1 questions in" "$M" "$WM" -- oneline case_assistant_no_wake_word
python3 - "$tmp" <<'PY'
import sys
def ppm(path, shade, dot=None):
    w, h = 40, 30
    px = bytearray()
    for y in range(h):
        for x in range(w):
            v = 255 - shade if dot and abs(x - dot[0]) < 6 and abs(y - dot[1]) < 6 else shade
            px += bytes((v, v, v))
    open(path, "wb").write(b"P6\n%d %d\n255\n" % (w, h) + px)
ppm(sys.argv[1] + "/cam1.ppm", 60)
ppm(sys.argv[1] + "/cam2.ppm", 61)            # the same scene, one grey level of sensor noise
ppm(sys.argv[1] + "/cam3.ppm", 60, (20, 15))  # something came into view
PY
case_assistant_camera() {
    rm -rf "$tmp/cam"; mkdir -p "$tmp/cam"
    drop "$tmp/cam.err" "$tmp/cam" "$tmp/cam1.ppm:f1.ppm" "$tmp/cam2.ppm:f2.ppm" "$tmp/cam3.ppm:f3.ppm" &
    nm assistant -m "$M" --mmproj "$tmp/mm.gguf" --frames "watch:$tmp/cam" -p "What is there?" --frame-change 4 \
        --listen 6 -n 2 --temp 0 -t 2 --stats > "$tmp/cam.txt" 2> "$tmp/cam.err"
    wait
    cat "$tmp/cam.err" "$tmp/cam.txt"
}
expect assistant_camera_frame_change 0 "question 2: frame .*f2.ppm unchanged \(difference 1.00 <= 4.00\): not asked.*vision brick \(cpu\): 2 requests.*> What is there\?.*> What is there\?" "$M" -- oneline case_assistant_camera
# a camera (V4L2): none here, so its refusals; the capture itself: tests/unit/test_camera.c
expect assistant_camera_absent 1 "error: camera /dev/video-nm-none: cannot be opened: No such file or directory" "$M" \
    -- nm assistant -m "$M" --mmproj "$tmp/mm.gguf" --frames /dev/video-nm-none -p "What is there?"
expect assistant_camera_not_v4l2 1 "error: camera /dev/null: not a V4L2 device" "$M" \
    -- nm assistant -m "$M" --mmproj "$tmp/mm.gguf" --frames /dev/null -p "What is there?"
case_assistant_camera_absent_spoken() { nm assistant -m "$M" --stt "$WM" --audio $SPEECH/tts_16k.wav --mmproj "$tmp/mm.gguf" --frames /dev/video-nm-none -n 4 --temp 0 -t 2 --stats 2>&1 | tr '\n' ' '; }
expect assistant_camera_absent_spoken 0 "camera /dev/video-nm-none: cannot be opened: No such file or directory .*> The quick brown fox.*vision brick \(cpu\): 0 requests" "$M" "$WM" -- case_assistant_camera_absent_spoken
# the emulated camera (tests/cli/vcam_preload.c) at /dev/video-nm-emu, through libc's calls
VCAM=${NM_VCAM_PRELOAD:-/nonexistent/libnm_vcam_preload.so}
vcam() { LD_PRELOAD="$VCAM" ASAN_OPTIONS="${ASAN_OPTIONS:-}:verify_asan_link_order=0" "$@"; }
case_assistant_camera_frames() { vcam nm assistant -m "$M" --mmproj "$tmp/mm.gguf" --frames /dev/video-nm-emu -p "What is there?" --fps 2 --listen 2 -n 4 --temp 0 -t 2 --stats 2>&1 | tr '\n' ' '; }
expect assistant_camera_frames 0 "camera /dev/video-nm-emu: Emulated camera \(vcam\), 640 x 480 YUYV, frames straight into the slots asking about /dev/video-nm-emu's frames > What is there\?.*> What is there\?.*> What is there\?.*vision brick \(cpu\): [3-9] requests.*ledger: 0 bytes copied" "$M" "$VCAM" -- case_assistant_camera_frames
case_assistant_camera_still() { NM_VCAM_STILL=1 NM_VCAM_MMAP=1 vcam nm assistant -m "$M" --mmproj "$tmp/mm.gguf" --frames /dev/video-nm-emu -p "What is there?" --frame-change 4 --fps 4 --listen 1.5 -n 4 --temp 0 -t 2 --stats 2>&1 | tr '\n' ' '; }
expect assistant_camera_still 0 "a copy a frame \(mmap\).*question 2: frame /dev/video-nm-emu unchanged \(difference 0.00 <= 4.00\): not asked.*vision brick \(cpu\): 1 requests.*ledger: [1-9][0-9]* bytes copied .*anything else [1-9][0-9]*" "$M" "$VCAM" -- case_assistant_camera_still
case_assistant_camera_spoken() { vcam nm assistant -m "$M" --stt "$WM" --audio $SPEECH/tts_16k.wav --mmproj "$tmp/mm.gguf" --frames /dev/video-nm-emu -n 4 --temp 0 -t 2 --stats 2>&1 | tr '\n' ' '; }
case_assistant_camera_gone() { NM_VCAM_GONE_AFTER=6 vcam nm assistant -m "$M" --mmproj "$tmp/mm.gguf" --frames /dev/video-nm-emu -p "What is there?" --listen 20 -n 2 --temp 0 -t 2 --stats 2>&1 | tr '\n' ' '; }
expect assistant_camera_gone 1 "error: question [0-9]+ \(/dev/video-nm-emu\): image 1 \(the camera's frame\): camera /dev/video-nm-emu: gone \(VIDIOC_DQBUF: No such device\).* [1-5] questions in" "$M" "$VCAM" -- case_assistant_camera_gone
expect assistant_camera_spoken 0 "frames straight into the slots .*> The quick brown fox.*vision brick \(cpu\): 1 requests" "$M" "$WM" "$VCAM" -- case_assistant_camera_spoken
# the microphone's questions with the camera's frames (the pipeline's heard images): each utterance asked of the newest
case_assistant_camera_mic() { HOME="$tmp/home" vcam nm assistant -m "$M" --stt "$WM" --audio mic:questions --listen 12 --mmproj "$tmp/mm.gguf" --frames /dev/video-nm-emu -n 4 --temp 0 -t 2 --stats 2>&1 | tr '\n' ' '; }
expect assistant_camera_mic 0 "frames straight into the slots .*listening on 'questions'.*> The quick brown fox.*> The quick brown fox.*vision brick \(cpu\): 2 requests" "$M" "$WM" "$VCAM" -- case_assistant_camera_mic
expect assistant_watch_missing 1 "error: --audio watch:/nonexistent: No such file or directory" "$M" "$WM" -- nm assistant -m "$M" --stt "$WM" --audio watch:/nonexistent
expect assistant_watch_frames_need_prompt 2 "--frames watch:DIR asks a typed question of each frame: give it with -p" "$M" "$WM" -- nm assistant -m "$M" --stt "$WM" --audio $SPEECH/tts_16k.wav --mmproj "$tmp/mm.gguf" --frames "watch:$tmp"
# the answers go elsewhere than the watched folder (written there, each would arrive as a question); the same
# folder under another name too
expect assistant_watch_into_itself 2 "--out '.*/watch/\\.' is the watched folder" "$M" "$WM" \
    -- nm assistant -m "$M" --stt "$WM" --audio "watch:$tmp/watch" --out "$tmp/watch/."
expect assistant_out_is_a_file 2 "--out '.*/notes.txt': not a folder" "$M" \
    -- nm assistant -m "$M" -p hi --out "$tmp/notes.txt"
expect assistant_watch_two 2 "watch one folder" "$M" -- nm assistant -m "$M" --audio "watch:$tmp" --frames "watch:$tmp"
expect assistant_frame_change_needs_prompt 2 "--frame-change goes with --frames and -p" "$M" -- nm assistant -m "$M" -p hi --frame-change 3
expect assistant_frame_change_range 2 "--frame-change needs a number in \[0, 254\], got '300'" "$M" -- nm assistant -m "$M" -p hi --frame-change 300
expect assistant_wake_empty 2 "error: wake words: an empty word in 'hey,,you'" "$M" "$WM" -- nm assistant -m "$M" --stt "$WM" --audio $SPEECH/tts_16k.wav --wake-words hey,,you
expect assistant_wake_needs_speech 2 "--wake-words goes with spoken questions" "$M" -- nm assistant -m "$M" -p hi --wake-words hey
case_assistant_watch_gone() {
    rm -rf "$tmp/gone"; mkdir -p "$tmp/gone"
    (for _ in $(seq 300); do grep -q "^watching" "$tmp/gone.err" 2>/dev/null && break; sleep 0.1; done; rmdir "$tmp/gone") &
    nm assistant -m "$M" --stt "$WM" --audio "watch:$tmp/gone" -n 2 2> "$tmp/gone.err"
    wait
    cat "$tmp/gone.err"
}
expect assistant_watch_folder_removed 1 "watching .*the folder was removed or moved away $" "$M" "$WM" -- oneline case_assistant_watch_gone
# --plan: the bricks placed by the planner from a profile (here one written by hand: core 0 takes
# everything but vision, core 1 only vision), then the question answered on those lanes
printf '{"units": [{"name": "cpu:0", "unit": "cpu", "read_gbps": 20, "gflops_f32": 50, "gflops": {"f16": 50, "q4_0": 60, "q4_1": 60, "q8_0": 60, "q6_K": 60}, "launch_us": 1, "kinds": 26}, {"name": "cpu:1", "unit": "cpu", "read_gbps": 20, "gflops_f32": 50, "gflops": {"f16": 400}, "launch_us": 1, "kinds": 4}]}' > "$tmp/lanes.json"
mkdir -p "$tmp/frame1"; cp "$tmp/img.ppm" "$tmp/frame1/"
case_assistant_plan() { nm assistant -m "$M" --stt "$WM" --audio $SPEECH/tts_16k.wav --mmproj "$tmp/mm.gguf" --frames "$tmp/frame1" --plan --profile "$tmp/lanes.json" -n 4 --temp 0 -t 2 2>&1 | tr '\n' ' '; }
expect assistant_plan 0 "stt +on cpu:0 .*vision +on cpu:1 .*llm +on cpu:0 .*placed: stt on cpu, cores 0 placed: vision on cpu, cores 1 placed: llm on cpu, cores 0 > The quick brown fox" "$M" "$WM" -- case_assistant_plan
# a profile with a fast OpenCL unit: the planner puts a Piper voice there (its convolutions' estimate) and the
# answer is spoken from it; espeak-ng, CPU-only, stays on the CPU
printf '{"units": [{"name": "cpu", "unit": "cpu", "read_gbps": 20, "gflops_f32": 50, "gflops": {"f16": 50, "q4_0": 60, "q4_1": 60, "q8_0": 60, "q6_K": 60}, "launch_us": 1}, {"name": "opencl", "unit": "opencl", "read_gbps": 200, "gflops_f32": 5000, "gflops": {"f32": 5000}, "launch_us": 5}]}' > "$tmp/gpu.json"
case_assistant_plan_tts() {
    mkdir -p "$tmp/plan-answers"
    nm assistant -m "$M" --stt "$WM" --audio $SPEECH/tts_16k.wav --out "$tmp/plan-answers" --tts "$1" --plan \
        --profile "$tmp/gpu.json" -n 8 --temp 0 -t 2 --stats 2>&1 | grep -E "^  tts|^placed: tts|^tts brick" | tr '\n' ' '
}
expect assistant_plan_piper_opencl 0 "tts +on opencl .*alone on cpu: [0-9.]+ ms +placed: tts on opencl +tts brick \(opencl\): 1 requests" "$M" "$WM" "$PV" -- case_assistant_plan_tts piper
expect assistant_plan_espeak_cpu 0 "tts +on cpu .*the only unit for it .*placed: tts on cpu +tts brick \(cpu\): 1 requests" "$M" "$WM" -- case_assistant_plan_tts espeak-ng
expect assistant_tts_device_and_plan 2 "drop .*--tts-device" "$M" -- nm assistant -m "$M" -p hi --plan --tts-device opencl
expect assistant_plan_and_cores 2 "--plan places the bricks: drop --cores" "$M" -- nm assistant -m "$M" -p hi --plan --cores 0
expect assistant_plan_goal_alone 2 "--plan-goal goes with --plan" "$M" -- nm assistant -m "$M" -p hi --plan-goal energy
expect assistant_plan_no_profile 1 "none.json: cannot open: No such file or directory \\(i/o error\\): measure the units first" "$M" -- nm assistant -m "$M" -p hi --plan --profile "$tmp/none.json"
# a question that cannot be read fails alone: the others are answered, the exit status says one failed
case_assistant_bad_question() {
    printf 'RIFF....WAVEjunk' > "$tmp/asked/2.wav"
    nm assistant -m "$M" --stt "$WM" --audio "$tmp/asked" -n 4 --temp 0 -t 2 2>&1 | tr '\n' ' '
}
expect assistant_bad_question 1 "error: question .*2.wav: .*> The quick.*> The quick" "$M" "$WM" -- case_assistant_bad_question
# ... also with speech, pipelined: each answer's speech in its own file, the failed one's empty
case_assistant_bad_question_spoken() {
    rm -rf "$tmp/spoken3"; mkdir -p "$tmp/spoken3"
    nm assistant -m "$M" --stt "$WM" --audio "$tmp/asked" --out "$tmp/spoken3" -n 12 --temp 0 -t 2 > /dev/null 2>&1
    python3 - "$tmp/spoken3" <<'PY' 2>&1 | tr '\n' ' '
import sys, wave
for k in (1, 2, 3):
    w = wave.open("%s/answer-%03d.wav" % (sys.argv[1], k))
    print("answer %d: %s" % (k, "speech" if w.getnframes() > 11025 else "empty" if w.getnframes() == 0 else "%d frames" % w.getnframes()))
PY
}
expect assistant_bad_question_spoken 1 "answer 1: speech answer 2: empty answer 3: speech" "$M" "$WM" -- case_assistant_bad_question_spoken
# ... and a question dropped while the answer before it is being spoken: the first answer is long
# (160 tokens, ~2 s of decoding), the second question (silence, no wake word) is dropped ~0.7 s after
# its start, mid-answer; it has no answer file, and the first answer's is whole (as long as the
# third's, the same question and answer)
case_assistant_dropped_mid_answer() {
    rm -rf "$tmp/race"; mkdir -p "$tmp/race/asked" "$tmp/race/out"
    cp $SPEECH/tts_16k.wav "$tmp/race/asked/1.wav"; cp $SPEECH/tts_16k.wav "$tmp/race/asked/3.wav"
    python3 -c "import wave; w = wave.open('$tmp/race/asked/2.wav', 'wb'); w.setnchannels(1); w.setsampwidth(2); w.setframerate(16000); w.writeframes(bytes(64000)); w.close()"
    nm assistant -m "$M" --stt "$WM" --audio "$tmp/race/asked" --out "$tmp/race/out" --wake-words "the quick" \
        -n 160 --ignore-eos --temp 0 -t 2 --stats > "$tmp/race/stats.txt" 2>&1
    python3 - "$tmp/race" <<'PY' 2>&1 | tr '\n' ' '
import re, sys, wave
d = sys.argv[1]
st = open(d + "/stats.txt").read()
q1 = re.search(r"question 1 \(at ([0-9.]+) s\): from its end: .*last token ([0-9.]+) s", st)
q2 = re.search(r"question 2 \(at ([0-9.]+) s\): from its end: heard ([0-9.]+) s", st)
if q1 and q2:
    drop, last = float(q2[1]) + float(q2[2]), float(q1[1]) + float(q1[2])
    print("question 2 dropped at %.2f s, %s answer 1's last token (%.2f s);" % (drop, "before" if drop < last else "AFTER", last))
import os
n = [wave.open("%s/out/answer-%03d.wav" % (d, k)).getnframes() for k in (1, 3)]
print("frames %s; answer 1 %s answer 3; answer 2 %s" % (n, "as long as" if n[1] > 22050 * 10 and abs(n[0] - n[1]) < 0.05 * n[1] else "NOT as long as", "not spoken" if not os.path.exists(d + "/out/answer-002.wav") else "spoken"))
print("question 2: %s" % ("no wake word" if re.search(r"question 2: no wake word", st) else "answered"))
PY
}
expect assistant_dropped_mid_answer 0 "question 2 dropped at [0-9.]+ s, before answer 1's last token .*answer 1 as long as answer 3; answer 2 not spoken question 2: no wake word" "$M" "$WM" -- case_assistant_dropped_mid_answer
# say --tts piper: the Piper voice (VITS on our kernels), heard back by Whisper; its options and refusals
case_say_piper() {
    rm -f "$tmp/piper.wav"
    nm say --tts piper --voice "$PV" 'Please remind me to water the plants tomorrow morning.' -o "$tmp/piper.wav" --stats \
        2>&1 | grep -E "^voice|^ledger: +piper" | tr '\n' ' '
    nm transcribe -m "$WM" "$tmp/piper.wav" 2>/dev/null | tr '\n' ' '
}
expect say_piper 0 "voice: .*piper-en_US-joe-medium.gguf \(piper on cpu\), 175 wpm, 22050 Hz .*piper -> tts: [1-9][0-9]* bytes .*remind me to water the plants tomorrow morning" "$PV" "$WM" -- case_say_piper
# -dev opencl: HiFi-GAN on OpenCL (PoCL here): the CPU's samples within a few steps of 16 bits (each file
# scaled by its own peak), and it says where it ran; espeak-ng cannot run there; an unknown device named
case_say_piper_opencl() {
    nm say --tts piper --voice "$PV" 'Switch off the kitchen light, please.' -o "$tmp/pc.wav" || return
    nm say --tts piper --voice "$PV" -dev opencl 'Switch off the kitchen light, please.' -o "$tmp/po.wav" --stats 2>&1 |
        grep -E "^voice" | tr '\n' ' '
    python3 -c "import sys,wave,array
a,b=(array.array('h',wave.open(f).readframes(10**8)) for f in sys.argv[1:])
print('same length' if len(a)==len(b) else 'lengths %d %d'%(len(a),len(b)), 'max diff %d'%max(abs(x-y) for x,y in zip(a,b)))" \
        "$tmp/pc.wav" "$tmp/po.wav"
}
expect say_piper_opencl 0 "\(piper on opencl\).*same length max diff [0-3]$" "$PV" -- case_say_piper_opencl
expect say_espeak_opencl 1 "error: unsupported: tts: espeak-ng runs on the CPU only, not on 'opencl'" -- nm say -dev opencl hi -o "$tmp/x.wav"
expect say_piper_bad_device 1 "piper: device nosuch: unknown device 'nosuch'" "$PV" -- nm say --tts piper --voice "$PV" -dev nosuch hi -o "$tmp/x.wav"
# a voice converted with --q8 (the wide convolutions as q8_0, a file ~40% the size): Whisper hears it, and
# HiFi-GAN on OpenCL gives the CPU's samples within a few 16-bit steps
case_say_piper_q8() { say_piper_q8 | tr '\n' ' '; }
say_piper_q8() {
    python3 tools/convert_piper.py "${PV%.gguf}.onnx" --q8 -o "$tmp/q8.gguf" > /dev/null || return
    python3 -c "import os,sys; print('size %.2f' % (os.path.getsize(sys.argv[1]) / os.path.getsize(sys.argv[2])))" "$tmp/q8.gguf" "$PV"
    nm say -m "$tmp/q8.gguf" 'Switch off the kitchen light, please.' -o "$tmp/q8c.wav" || return
    nm say -m "$tmp/q8.gguf" -dev opencl 'Switch off the kitchen light, please.' -o "$tmp/q8o.wav" || return
    python3 -c "import sys,wave,array
a,b=(array.array('h',wave.open(f).readframes(10**8)) for f in sys.argv[1:])
print('same length' if len(a)==len(b) else 'lengths %d %d'%(len(a),len(b)), 'max diff %d'%max(abs(x-y) for x,y in zip(a,b)))" \
        "$tmp/q8c.wav" "$tmp/q8o.wav"
    nm transcribe -m "$WM" "$tmp/q8c.wav" 2>/dev/null
}
expect say_piper_q8 0 "size 0\.[34][0-9].*same length max diff [0-3] .*[Ss]witch off the kitchen light" "$PV" "${PV%.gguf}.onnx" "$WM" -- case_say_piper_q8
case_say_piper_m() { # Piper's -m; slower (--speed 0.5: twice the length scale) is longer
    nm say -m "$PV" 'Turn left.' -o "$tmp/p1.wav" && nm say -m "$PV" --speed 0.5 'Turn left.' -o "$tmp/p2.wav" || return
    python3 -c "import sys,wave; a,b=(wave.open(f).getnframes() for f in sys.argv[1:]); print('longer' if b > 1.6 * a else 'not longer: %d %d' % (a, b))" "$tmp/p1.wav" "$tmp/p2.wav"
}
expect say_piper_m 0 "^longer$" "$PV" -- case_say_piper_m
expect say_piper_list_voices 0 "^en_US-joe-medium +Piper en_US, medium +piper" "$PV" -- nm say --tts piper --list-voices
expect say_piper_no_voice 1 "no Piper voice 'xx-nobody'" -- nm say --tts piper --voice xx-nobody hi -o "$tmp/x.wav"
expect say_piper_pitch 1 "pitch 60: a Piper voice has no pitch control" "$PV" -- nm say --tts piper --voice "$PV" --pitch 60 hi -o "$tmp/x.wav"
expect say_piper_bad_scale 2 "--noise-scale needs a number in \[0, 5\]" -- nm say --tts piper --noise-scale 9 hi -o "$tmp/x.wav"
expect say_bad_engine 2 "--tts takes espeak-ng or piper, not 'festival'" -- nm say --tts festival hi -o "$tmp/x.wav"
expect say_piper_not_a_voice 1 "not a Piper voice" "$WM" -- nm say --tts piper --voice "$WM" hi -o "$tmp/x.wav"
expect say_unwritable 1 "/nonexistent/dir/x.wav: cannot create a file in its folder: No such file or directory" -- nm say hello -o /nonexistent/dir/x.wav
expect say_bad_rate 2 "--rate needs an integer in \\[80, 450\\]" -- nm say hello -o "$tmp/r.wav" --rate 5
expect say_rate_trailing_garbage 2 "--rate needs an integer in \\[80, 450\\], got '100x'" -- nm say hello -o "$tmp/r.wav" --rate 100x
expect transcribe_temp_out_of_range 2 "--temp needs a number in \\[0, 1\\], got '2'" -- nm transcribe --temp 2 tests/data/speech/tts_16k.wav
expect run_flag_without_value 2 "-m needs a value" -- nm run -p hi -m
expect run_prompt_without_value 2 "-p needs a value" "$M" -- nm run -m "$M" -p
expect run_template_without_value 2 "--chat-template needs a value" "$M" -- nm run -m "$M" -p hi -n 1 --chat-template
# a failed say (exit 1, with its message) leaves no file behind
case_say_no_file_left() {
    rm -f "$tmp/left.wav"
    nm say hi -o "$tmp/left.wav" --voice xx-bogus 2>&1 | tr '\n' ' '
    if [ -e "$tmp/left.wav" ]; then echo "file left: $tmp/left.wav"; else echo "no file left"; fi
}
expect say_no_file_left 1 "unknown espeak-ng voice 'xx-bogus'.* no file left$" -- case_say_no_file_left

# --jinja and --chat-template-file (issue 45, item 6): SmolLM2's own template rendered by the interpreter gives
# the built-in formatter's prompt, so the same greedy answer; a file's template changes the prompt; one beyond
# the subset falls back to the built-in template, named on stderr; one that refuses the chat is an error.
printf '%s' "{% for m in messages %}<|im_start|>{{ m.role }}
{{ m.content | upper }} (answer in one word)<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}" > "$tmp/custom.jinja"
printf '%s' "{% macro f() %}{% endmacro %}{{ f() }}" > "$tmp/macro.jinja"
printf '%s' "{% if messages | length > 0 %}{{ raise_exception('no chats today') }}{% endif %}" > "$tmp/refuse.jinja"
case_jinja_same() {
    a=$(nm run -m "$M" --chat -p hi -n 4 --temp 0 2>/dev/null); b=$(nm run -m "$M" --jinja --chat -p hi -n 4 --temp 0 2>/dev/null)
    if [ -n "$a" ] && [ "$a" = "$b" ]; then echo "same: $a"; else echo "differ: [$a] [$b]"; fi
}
expect jinja_same_as_builtin 0 "^same: ." "$M" -- case_jinja_same
case_jinja_file() {
    a=$(nm run -m "$M" --chat -p hi -n 4 --temp 0 --stats 2>&1 | sed -n 's/^prompt: \([0-9]*\) tokens.*/\1/p')
    b=$(nm run -m "$M" --chat-template-file "$tmp/custom.jinja" --chat -p hi -n 4 --temp 0 --stats 2>&1 |
        sed -n 's/^prompt: \([0-9]*\) tokens.*/\1/p')
    echo "built-in $a tokens, file $b tokens"
}
# built-in: the default system turn + "hi" (31 tokens); the file: no system turn, "HI (answer in one word)"
expect jinja_template_file_changes_prompt 0 "^built-in 31 tokens, file 16 tokens$" "$M" -- case_jinja_file
case_jinja_fallback() {
    a=$(nm run -m "$M" --chat -p hi -n 4 --temp 0 2>/dev/null)
    b=$(nm run -m "$M" --chat-template-file "$tmp/macro.jinja" --chat -p hi -n 4 --temp 0 2>"$tmp/fb.err")
    tr '\n' ' ' < "$tmp/fb.err"
    if [ "$a" = "$b" ]; then echo "same answer"; else echo "differ: [$a] [$b]"; fi
}
expect jinja_fallback_named 0 "macro.jinja is beyond nanomind's Jinja subset \(line 1, column 4: the statement 'macro' is not supported\): formatting with the built-in 'chatml' template instead.*same answer$" "$M" -- case_jinja_fallback
expect jinja_template_refuses 1 "refuse.jinja: line 1, column 49: the template raised an error: no chats today" "$M" -- nm run -m "$M" --chat-template-file "$tmp/refuse.jinja" --chat -p hi -n 4
expect jinja_with_no_cnv 2 "--jinja only applies to a conversation \\(not with -no-cnv\\)" "$M" -- nm run -m "$M" --jinja -no-cnv -p hi -n 1
expect jinja_file_missing 2 "--chat-template-file: $tmp/none.jinja: cannot open" "$M" -- nm run -m "$M" --chat-template-file "$tmp/none.jinja" --chat -p hi -n 1
# --chat-template-kwargs (issue 48): Qwen3's own template (tests/data/jinja/qwen3.jinja) with its thinking switch off
# adds the empty <think> block after the assistant's turn: 9 more tokens of SmolLM2's vocabulary
case_jinja_kwargs() {
    for t in true false; do
        nm run -m "$M" --chat-template-file tests/data/jinja/qwen3.jinja --chat-template-kwargs "{\"enable_thinking\": $t}" \
            --chat -p hi -n 4 --temp 0 --stats 2>&1 | sed -n "s/^prompt: \([0-9]*\) tokens.*/thinking $t: \1 tokens/p"
    done | tr '\n' ' '
}
expect jinja_kwargs_thinking_off 0 "^thinking true: 10 tokens thinking false: 19 tokens $" "$M" -- case_jinja_kwargs
expect jinja_kwargs_without_jinja 2 "--chat-template-kwargs gives the Jinja template variables: add --jinja" "$M" -- nm run -m "$M" --chat-template-kwargs '{"enable_thinking": false}' --chat -p hi -n 1
expect jinja_kwargs_not_json 2 "--chat-template-kwargs: chat template kwargs: not a JSON object" "$M" -- nm run -m "$M" --jinja --chat-template-kwargs '{"enable_thinking":' --chat -p hi -n 1
expect jinja_kwargs_no_fallback 1 "macro.jinja: line 1, column 4: the statement 'macro' is not supported \(with template variables given there is no falling back" "$M" -- nm run -m "$M" --chat-template-file "$tmp/macro.jinja" --chat-template-kwargs '{"enable_thinking": false}' --chat -p hi -n 1
expect jinja_kwargs_reserved 2 "'messages' is the conversation's own" "$M" -- nm run -m "$M" --jinja --chat-template-kwargs '{"messages": []}' --chat -p hi -n 1
# The 2026 archs (issue 48): `info` names each, `run` generates from each (random-weight files, SmolLM2's tokenizer)
GM=$(dirname "$NM")/nm-genmodel
case_run_arch() { nm run -m "$tmp/$1.gguf" -no-cnv -p 'Once upon a time' -n 6 --ignore-eos --temp 0 -t 2 --stats 2>&1 | grep '^generation'; }
for a in qwen3 smollm3 lfm2; do
    setup "nm-genmodel $a" /dev/null "$GM" --arch "$a" --tokenizer-from "$M" -o "$tmp/$a.gguf" --layers 4 --embd 64 \
        --heads 4 --kv-heads 2 --ff 128
    expect "info_$a" 0 "general.architecture +str += \"$a\"" "$M" -- nm info "$tmp/$a.gguf"
    expect "run_$a" 0 "^generation: 6 tokens" "$M" -- case_run_arch "$a"
done
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" = 0 ]
