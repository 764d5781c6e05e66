#!/usr/bin/env bash
# The cascade against every brick resident (issue 16; docs/benchmarks.md):
# the same spoken question with a camera frame, answered and spoken by
# `nanomind assistant` with all four bricks loaded (pipelined lanes) and with
# --cascade (each brick loaded, run once, released in turn), alternated;
# peak RSS and time of each, and each brick's peak RSS alone (its own process:
# `transcribe`, `run`, bench/vision_alone.c, `say`), so the cascade's peak can
# be read against the largest brick's.
# usage: bash bench/power_cascade.sh [RUNS] (default 2); the models from `make models`.
set -u
RUNS=${1:-2}
root=$(cd "$(dirname "$0")/.." && pwd)
B=${BUILD:-$root/build}
nm=$B/nanomind
gen=$B/nm-genmmproj
M=${MODELS:-$HOME/.cache/nanomind/models}
D=${DIR:-/tmp/nm-bench-cascade}
LLM=$M/SmolLM2-135M-Instruct.Q4_1.gguf
WM=$M/whisper-tiny.en.gguf
for f in "$nm" "$gen" "$LLM" "$WM"; do [ -e "$f" ] || { echo "missing $f (make build models)" >&2; exit 2; }; done
mkdir -p "$D/frames" "$D/q" "$D/out"
# the inputs: bench/assistant.sh's CLIP-B/16-shaped f16 mmproj (random weights), a 640x480 frame, a question
[ -f "$D/clip-f16.gguf" ] || "$gen" -o "$D/clip-f16.gguf" --proj mlp --type f16 --image-size 224 --patch-size 16 \
    --n-embd 768 --n-ff 3072 --n-head 12 --n-layer 13 --n-out 576 > /dev/null
python3 - "$D/frames/frame.ppm" <<'PY'
import os, sys
p = sys.argv[1]
if not os.path.exists(p):
    w, h = 640, 480
    px = bytearray(w * h * 3)
    for y in range(h):
        for x in range(w):
            o = (y * w + x) * 3
            px[o], px[o + 1], px[o + 2] = x & 255, y & 255, (x ^ y) & 255
    for y in range(100, 200):
        for x in range(200, 300):
            o = (y * w + x) * 3
            px[o:o + 3] = b"\xff\x00\x00"
    open(p, "wb").write(b"P6\n%d %d\n255\n" % (w, h) + px)
PY
[ -f "$D/q/question.wav" ] || "$nm" say "What color is the square in the picture?" -o "$D/q/question.wav" 2> /dev/null
cc -O2 "$root/bench/vision_alone.c" -I"$root/include" -L"$B" -lnanomind -Wl,-rpath,"$B" -o "$D/vision_alone" || exit 1

echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; $(date -u '+%Y-%m-%d %H:%M UTC')"
args=(-m "$LLM" --stt "$WM" --audio "$D/q/question.wav" --mmproj "$D/clip-f16.gguf" --frames "$D/frames"
      --out "$D/out" -n 48 --temp 0 --stats)
printf '| run | mode | peak RSS MiB | end of question -> first audio s | -> answer spoken s | wall s |\n|---|---|---|---|---|---|\n'
for r in $(seq 1 "$RUNS"); do
    for mode in resident cascade; do
        extra=(); [ "$mode" = cascade ] && extra=(--cascade)
        s=$(date +%s.%N)
        err=$("$nm" assistant "${args[@]}" "${extra[@]}" 2>&1 > /dev/null) || { echo "$mode failed: $err" >&2; exit 1; }
        e=$(date +%s.%N)
        peak=$(sed -n 's/^peak RSS: \([0-9.]*\) MiB/\1/p' <<< "$err")
        fa=$(sed -n 's/.*first audio \([0-9.]*\) s, spoken \([0-9.]*\) s.*/\1/p' <<< "$err")
        sp=$(sed -n 's/.*first audio \([0-9.]*\) s, spoken \([0-9.]*\) s.*/\2/p' <<< "$err")
        printf '| %d | %s | %s | %s | %s | %.2f |\n' "$r" "$mode" "$peak" "$fa" "$sp" "$(echo "$e - $s" | bc)"
        [ "$mode" = cascade ] && grep '^cascade:' <<< "$err" >&2
    done
done
rss() { /usr/bin/time -f '%M' "$@" 2>&1 > /dev/null | tail -1; }
stt=$(rss "$nm" transcribe -m "$WM" -f "$D/q/question.wav" --beam-size 1)
llm=$(rss "$nm" run -m "$LLM" -no-cnv -p "What color is the square in the picture?" -n 48 --temp 0)
vis=$("$D/vision_alone" "$D/clip-f16.gguf" "$D/frames/frame.ppm" | sed -n 's/.*peak RSS \([0-9.]*\) MiB/\1/p')
tts=$(rss "$nm" say "Blue, the sky is blue, and so is the square." -o "$D/out/alone.wav")
printf 'alone: whisper %.1f MiB, decoder %.1f MiB, vision %.1f MiB, voice %.1f MiB\n' "$(echo "$stt / 1024" | bc -l)" \
    "$(echo "$llm / 1024" | bc -l)" "$vis" "$(echo "$tts / 1024" | bc -l)"
