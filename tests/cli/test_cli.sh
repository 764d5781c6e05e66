#!/usr/bin/env bash
# The nanomind command end to end: every subcommand's --help, bad input
# (missing or corrupt files, bad flags) reported with a clear message and a
# non-zero exit, and short real runs on the default model.
# usage: test_cli.sh path/to/nanomind ; prints "N passed, N failed".
set -u
NM=$1
M=${NM_MODEL_DIR:-$HOME/.cache/nanomind/models}/SmolLM2-135M-Instruct.Q4_1.gguf
pass=0 fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# expect NAME RC REGEX -- CMD...: exit code RC and output (stdout+stderr) matching REGEX
expect() {
    local name=$1 want_rc=$2 re=$3
    shift 4
    local out rc
    out=$(timeout 300 "$@" 2>&1 < /dev/null)
    rc=$?
    if [ "$rc" = "$want_rc" ] && grep -Eq -- "$re" <<< "$out"; then
        pass=$((pass + 1)); echo "ok   $name"
    else
        fail=$((fail + 1)); echo "FAIL $name (rc $rc, want $want_rc, /$re/)"; echo "$out" | head -5 | sed 's/^/     /'
    fi
}

for c in run info perplexity bench; do
    expect "help_$c" 0 "usage: nanomind $c" -- "$NM" $c --help
done
expect no_command 2 "usage: nanomind COMMAND" -- "$NM"
expect unknown_command 2 "unknown command 'frobnicate'" -- "$NM" frobnicate
expect unknown_flag 2 "unknown option '--bogus'" -- "$NM" run -m "$M" -p hi --bogus
expect bad_int 2 "-n needs an integer" -- "$NM" run -m "$M" -p hi -n many
expect missing_model 1 "cannot load '/nonexistent.gguf'.*No such file" -- "$NM" run -m /nonexistent.gguf -p hi
head -c 100 "$M" > "$tmp/trunc.gguf"
expect truncated_model 1 "malformed input" -- "$NM" run -m "$tmp/trunc.gguf" -p hi
expect info_corrupt 1 "alignment" -- "$NM" info tests/fuzz/corpus/gguf/bad-align-3.gguf
expect unknown_template 2 "unknown chat template 'bogus' \\(known: chatml" -- "$NM" run -m "$M" --chat --chat-template bogus -p hi
expect template_without_chat 2 "only applies with --chat" -- "$NM" run -m "$M" --chat-template chatml -p hi
expect empty_int 2 "-n needs an integer, got ''" -- "$NM" run -m "$M" -p hi -n ""
expect nan_temp 2 "--temp needs a number" -- "$NM" run -m "$M" -p hi --temp nan
expect too_many_threads 2 "more than 4 threads per core" -- "$NM" run -m "$M" -p hi -t 100000
expect ppl_tiny_chunk 1 "at least 4 tokens" -- "$NM" perplexity -m "$M" -f tests/data/declaration.txt -c 2
expect prompt_too_long 1 "does not fit the context" -- "$NM" run -m "$M" -c 16 -f tests/data/declaration.txt
expect ppl_too_short 1 "do not fill one chunk" -- "$NM" perplexity -m "$M" -f tests/data/declaration.txt -c 4096

# real runs
expect info_real 0 "general.architecture +str += \"llama\"" -- "$NM" info "$M"
expect run_greedy 0 "The capital of France is Paris" -- "$NM" run -m "$M" -p "The capital of France is" -n 4 --temp 0 -t 2
expect run_seeded_same 0 "." -- bash -c "a=\$('$NM' run -m '$M' -p 'Once' -n 12 --seed 7 -t 2 2>/dev/null); b=\$('$NM' run -m '$M' -p 'Once' -n 12 --seed 7 -t 2 2>/dev/null); [ \"\$a\" = \"\$b\" ] && echo same"
expect chat_stdin 0 "Paris" -- bash -c "printf 'Name the capital of France.\n' | '$NM' run -m '$M' --chat --temp 0 -n 16 -t 2"
expect stats_ledger 0 "mapped from the model file" -- "$NM" run -m "$M" -p "Hi" -n 2 --temp 0 --stats
# --stats: the run goes through the LLM brick's rings; the ledger line reports the copies between bricks (none)
expect stats_ledger_line 0 "ledger: 0 bytes copied between bricks \\(0 copies\\)" -- "$NM" run -m "$M" -p "Hi" -n 2 --temp 0 --stats
expect stats_ledger_chat 0 "ledger: 0 bytes copied between bricks \\(0 copies\\)" -- bash -c "printf 'Hi\nAgain\n' | '$NM' run -m '$M' --chat --temp 0 -n 4 -t 2 --stats"
expect no_ledger_without_stats 1 "^0$" -- bash -c "'$NM' run -m '$M' -p Hi -n 2 --temp 0 2>&1 | grep -c ledger"
expect bench_tg_only 0 "tg4 " -- "$NM" bench -m "$M" -p 0 -n 4 -r 1
expect bench_json 0 "\"pp_tps\": [0-9.]+, .*\"tg_tps\": [0-9.]+, .*\"peak_rss_bytes\": [0-9]+, .*\"roofline_pct\": [0-9.]+" -- "$NM" bench -m "$M" -p 8 -n 4 -r 1 --json

# images: a random-weight mmproj sized for SmolLM2 (576-wide embeddings) from the
# generator next to the binary, a PPM written here
GEN=$(dirname "$NM")/nm-genmmproj
"$GEN" -o "$tmp/mm.gguf" --proj mlp --n-out 576 --image-size 64 --patch-size 16 > /dev/null
"$GEN" -o "$tmp/mm-sv.gguf" --proj idefics3 --n-out 576 --image-size 64 --patch-size 8 > /dev/null
"$GEN" -o "$tmp/mm-wide.gguf" --proj mlp --n-out 960 --image-size 64 --patch-size 16 > /dev/null
"$GEN" -o "$tmp/mm-any.gguf" --proj mlp --n-out 576 --image-size 64 --patch-size 16 --pinpoints 64,128,128,64,128,128 > /dev/null
python3 -c "import sys; w,h=150,90; sys.stdout.buffer.write(b'P6\n%d %d\n255\n'%(w,h)+bytes((x*3+y*5+c*70)%256 for y in range(h) for x in range(w) for c in range(3)))" > "$tmp/wide.ppm"
python3 -c "import sys; w,h=40,30; sys.stdout.buffer.write(b'P6\n%d %d\n255\n'%(w,h)+bytes((x*6+c*40)%256 for y in range(h) for x in range(w) for c in range(3)))" > "$tmp/img.ppm"
printf '\x89PNG\r\n\x1a\nnot really a png' > "$tmp/bad.png"
expect image_needs_mmproj 2 "--image needs --mmproj" -- "$NM" run -m "$M" --image "$tmp/img.ppm" -p hi
expect mmproj_needs_image 2 "--mmproj needs at least one --image" -- "$NM" run -m "$M" --mmproj "$tmp/mm.gguf" -p hi
expect image_corrupt 1 "image '.*bad.png'.*(PNG|png)" -- "$NM" run -m "$M" --mmproj "$tmp/mm.gguf" --image "$tmp/bad.png" -p hi -n 2
expect image_missing 1 "image '/nonexistent.png'" -- "$NM" run -m "$M" --mmproj "$tmp/mm.gguf" --image /nonexistent.png -p hi -n 2
expect mmproj_width_mismatch 1 "960-wide embeddings but the language model's embedding width is 576" -- "$NM" run -m "$M" --mmproj "$tmp/mm-wide.gguf" --image "$tmp/img.ppm" -p hi
expect mmproj_not_mmproj 1 "cannot load mmproj.*not an mmproj file" -- "$NM" run -m "$M" --mmproj "$M" --image "$tmp/img.ppm" -p hi
expect image_marker_count 1 "2 <__media__> markers for 1 images" -- "$NM" run -m "$M" --mmproj "$tmp/mm.gguf" --image "$tmp/img.ppm" -p "<__media__><__media__>hi"
# an image prompt through the rings: the embeddings are decoded where the encoder wrote them
expect image_chat_zero_copy 0 "vision: 1 images, 1 encoder runs.*ledger: 0 bytes copied between bricks \(0 copies\)" -- bash -c "'$NM' run -m '$M' --mmproj '$tmp/mm.gguf' --image '$tmp/img.ppm' -p 'What is this?' --chat --temp 0 -n 4 -t 2 --stats 2>&1 | tr '\n' ' '"
# LLaVA-1.6-style anyres: 150x90 -> the 128x128 pinpoint, 2x2 tiles and the overview
expect image_anyres_tiles 0 "prompt: 8[0-9] tokens.*vision: 1 images, 5 encoder runs.*ledger: 0 bytes copied" -- bash -c "'$NM' run -m '$M' --mmproj '$tmp/mm-any.gguf' --image '$tmp/wide.ppm' -p 'A<__media__>B' --temp 0 -n 4 -t 2 --stats 2>&1 | tr '\n' ' '"
expect image_smolvlm_tiles 0 "vision: 2 images, [0-9]+ encoder runs.*ledger: 0 bytes copied" -- bash -c "'$NM' run -m '$M' --mmproj '$tmp/mm-sv.gguf' --image '$tmp/img.ppm' --image '$tmp/img.ppm' -p 'A<__media__>and<__media__>' --temp 0 -n 4 -t 2 --stats 2>&1 | tr '\n' ' '"

# the perplexity tool over several batches per chunk (-b 64 < -c 256), against llama.cpp's value
expect ppl_multibatch 0 "PPL = 20\\.(8|9)|PPL = 21\\.0" -- "$NM" perplexity -m "$M" -f tests/data/declaration.txt -c 256 -b 64 -t 2

# say: text to speech (espeak-ng) into a WAV file through the TTS brick's ring
expect help_say 0 "usage: nanomind say" -- "$NM" say --help
expect say_wav 0 "RIFF WAVE 1 16 22050 frames=[0-9]{5,}" -- bash -c "'$NM' say 'Hello from nanomind.' -o '$tmp/say.wav' && python3 -c \"import sys,wave,struct; b=open(sys.argv[1],'rb').read(44); w=wave.open(sys.argv[1]); print(b[:4].decode(), b[8:12].decode(), w.getnchannels(), 8*w.getsampwidth(), w.getframerate(), 'frames=%d' % w.getnframes())\" '$tmp/say.wav'"
expect say_same_twice 0 "^same$" -- bash -c "'$NM' say 'Seven plus five.' -o '$tmp/s1.wav' && '$NM' say 'Seven plus five.' -o '$tmp/s2.wav' && cmp -s '$tmp/s1.wav' '$tmp/s2.wav' && echo same"
expect say_stdin_16k 0 "mono 16000 Hz" -- bash -c "echo 'Text from standard input.' | '$NM' say - -o '$tmp/say16.wav' --sample-rate 16000 && file '$tmp/say16.wav'"
expect say_stats 0 "real-time factor [0-9.]+.*ledger: 0 bytes copied between bricks \\(0 copies\\)" -- bash -c "'$NM' say 'Counting the copies.' -o '$tmp/say.wav' --stats 2>&1 | tr '\n' ' '"
expect say_list_voices 0 "^en-us +English" -- bash -c "'$NM' say --list-voices 2>/dev/null | grep '^en-us '"
expect say_bad_voice 1 "unknown espeak-ng voice 'xx-bogus'" -- "$NM" say hello -o "$tmp/bad.wav" --voice xx-bogus
expect say_empty_text 1 "empty text" -- "$NM" say "   " -o "$tmp/empty.wav"
expect say_no_output 2 "-o OUT.wav is required" -- "$NM" say hello

# transcribe: Whisper speech to text (errors first; real runs need whisper-tiny.en.gguf from set-up)
WM=${NM_MODEL_DIR:-$HOME/.cache/nanomind/models}/whisper-tiny.en.gguf
SPEECH=tests/data/speech
expect help_transcribe 0 "usage: nanomind transcribe" -- "$NM" transcribe --help
expect transcribe_no_audio 2 "no audio file" -- "$NM" transcribe -m "$WM"
expect transcribe_missing_model 1 "cannot load '/nonexistent.bin'" -- "$NM" transcribe -m /nonexistent.bin $SPEECH/tts_16k.wav
head -c 30 $SPEECH/tts_16k.wav > "$tmp/trunc.wav"
if [ -f "$WM" ]; then
    expect transcribe_truncated_audio 1 "cannot read audio" -- "$NM" transcribe -m "$WM" "$tmp/trunc.wav"
    expect transcribe_bad_language 2 "unknown language 'xx'" -- "$NM" transcribe -m "$WM" -l xx $SPEECH/tts_16k.wav
    expect transcribe_text 0 "quick brown fox" -- "$NM" transcribe -m "$WM" $SPEECH/tts_16k.wav -t 2 --beam-size 1
    expect transcribe_timestamps 0 "^\[00:00:00.000 --> 00:00:0[0-9].[0-9]{3}\]   The quick" -- "$NM" transcribe -m "$WM" $SPEECH/tts_16k.wav -t 2 --beam-size 1 --timestamps
    expect transcribe_srt 0 "^1$" -- bash -c "'$NM' transcribe -m '$WM' $SPEECH/tts_48k.wav -t 2 --beam-size 1 --output-srt | head -1"
    expect transcribe_json 0 "\"segments\": \[" -- "$NM" transcribe -m "$WM" $SPEECH/tts_48k.wav -t 2 --beam-size 1 --output-json
    expect transcribe_stdin_8k 0 "leave your name" -- bash -c "'$NM' transcribe -m '$WM' - -t 2 --beam-size 1 < $SPEECH/tts_8k.wav"
    expect transcribe_stats 0 "real-time factor [0-9.]+.*ledger: [0-9]+ bytes copied between bricks \\(1 copies\\)" -- bash -c "'$NM' transcribe -m '$WM' $SPEECH/tts_48k.wav -t 2 --beam-size 1 --stats 2>&1 | tr '\n' ' '"
fi
expect say_unwritable 1 "cannot write '/nonexistent/dir/x.wav'" -- "$NM" say hello -o /nonexistent/dir/x.wav
expect say_bad_rate 2 "--rate needs an integer in \\[80, 450\\]" -- "$NM" say hello -o "$tmp/r.wav" --rate 5
expect say_no_file_left 0 "^none$" -- bash -c "'$NM' say hi -o '$tmp/left.wav' --voice xx-bogus; [ -e '$tmp/left.wav' ] || echo none"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
