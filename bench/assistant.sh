#!/usr/bin/env bash
# The assistant's loop, side by side in one run (docs/benchmarks.md, "The assistant"):
#  1. 20 camera frames (640x480), each with a spoken question, through
#     `nanomind assistant` (Whisper tiny.en, a CLIP-B/16-shaped f16 mmproj with
#     random weights, SmolLM2, espeak-ng), pipelined against --sequential, the
#     decoder on core 0 and the vision encoder on core 1 (STT and TTS there
#     too): questions a second and per-question latency;
#  2. from the end of a spoken question to the first audio sample of the
#     answer: `nanomind assistant` against today's `make demo` chain
#     (transcribe, run, say: the answer's first sample exists once `say` has
#     written its file), on the same question file, also with the chain's
#     Whisper decoding greedily as the assistant does.
#   bench/assistant.sh [RUNS]     (default 2; everything goes to $DIR, default /tmp/nm-bench-assistant)
set -euo pipefail
runs=${1:-2}
nm=${NM:-build/nanomind}
gen=$(dirname "$nm")/nm-genmmproj
M=${MODELS:-$HOME/.cache/nanomind/models}
D=${DIR:-/tmp/nm-bench-assistant}
LLM=$M/SmolLM2-135M-Instruct.Q4_1.gguf
WM=$M/whisper-tiny.en.gguf
for f in "$nm" "$gen" "$LLM" "$WM"; do [ -e "$f" ] || { echo "missing $f (make build models)" >&2; exit 2; }; done
mkdir -p "$D/frames" "$D/questions" "$D/out" "$D/demo"

# --- inputs -------------------------------------------------------------------------------
[ -f "$D/clip-f16.gguf" ] || "$gen" -o "$D/clip-f16.gguf" --proj mlp --type f16 --image-size 224 --patch-size 16 \
    --n-embd 768 --n-ff 3072 --n-head 12 --n-layer 13 --n-out 576 > /dev/null
python3 - "$D/frames" <<'PY'
import os, sys
d = sys.argv[1]
for i in range(20):
    p = os.path.join(d, "frame-%03d.ppm" % i)
    if os.path.exists(p):
        continue
    w, h = 640, 480
    px = bytearray(w * h * 3)
    for y in range(h):
        for x in range(w):
            o = (y * w + x) * 3
            px[o], px[o + 1], px[o + 2] = (x + i * 8) & 255, (y + i * 5) & 255, ((x ^ y) + i * 3) & 255
    for y in range(100 + i * 5, 200 + i * 5):   # a red square moving across the frames
        for x in range(200 + i * 10, 300 + i * 10):
            o = (y * w + x) * 3
            px[o:o + 3] = b"\xff\x00\x00"
    open(p, "wb").write(b"P6\n%d %d\n255\n" % (w, h) + px)
PY
qs=("What is in the image?" "What color is the square?" "Where is the red square?" "Describe this picture."
    "Is there a person here?" "What shape do you see?" "How many squares are there?" "What is the background like?"
    "Is it day or night?" "What moves in this frame?" "Describe the colors." "What is on the left?"
    "What is on the right?" "Is the square big or small?" "What do you notice first?" "Is this a photo or a drawing?"
    "What is in the middle?" "Name one object here." "What changed since the last frame?" "Summarize the scene.")
for i in $(seq 0 19); do
    q=$D/questions/q-$(printf %03d "$i").wav
    [ -f "$q" ] || "$nm" say "${qs[$i]}" -o "$q" 2> /dev/null
done
question="Why is the sky blue? Answer in two sentences."  # scripts/demo.sh's
[ -f "$D/demo/question.wav" ] || "$nm" say "$question" -o "$D/demo/question.wav" 2> /dev/null

echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; $(date -u '+%Y-%m-%d %H:%M UTC')"

# --- 1. pipelined against sequential ------------------------------------------------------
echo
echo "| run | mode | questions/s | end of question -> first audio, median (min-max) s | -> answer spoken, median s |"
echo "|---|---|---|---|---|"
declare -A qps
for r in $(seq "$runs"); do
    for mode in pipelined sequential; do
        flag=""; [ "$mode" = sequential ] && flag=--sequential
        out=$("$nm" assistant -m "$LLM" --stt "$WM" --audio "$D/questions" --mmproj "$D/clip-f16.gguf" \
              --frames "$D/frames" --out "$D/out" -n 16 --temp 0 -t 1 --cores 0 --mmproj-cores 1 \
              --stt-cores 1 --tts-cores 1 --stats $flag 2>&1 > /dev/null)
        q=$(sed -En 's/.*: ([0-9.]+) questions\/s.*/\1/p' <<< "$out")
        fa=$(sed -n 's/^end of question -> first audio sample: median \([0-9.]*\) s, min \([0-9.]*\) s, max \([0-9.]*\) s/\1 (\2-\3)/p' <<< "$out")
        sp=$(sed -n 's/^end of question -> answer spoken: median \([0-9.]*\) s.*/\1/p' <<< "$out")
        qps[$r$mode]=$q
        echo "| $r | $mode | $q | $fa | $sp |"
    done
done
for r in $(seq "$runs"); do
    python3 -c "import sys; p, s = map(float, sys.argv[1:]); print('run %s: pipelined / sequential = %.2fx questions per second' % ('$r', p / s))" \
        "${qps[${r}pipelined]}" "${qps[${r}sequential]}"
done

# --- 2. end of question -> first audio sample ----------------------------------------------
echo
echo "| run | make demo chain (transcribe, beam 5), s | chain, greedy Whisper, s | assistant, s | chain / assistant | greedy chain / assistant |"
echo "|---|---|---|---|---|---|"
chain() { # the demo's three commands on the question file; prints the seconds until the answer's WAV exists
    local t0 t1
    t0=$(date +%s.%N)
    "$nm" transcribe -m "$WM" "$D/demo/question.wav" -t 2 "$@" > "$D/demo/question.txt" 2> /dev/null
    "$nm" run -m "$LLM" --chat --temp 0 -n 120 -f "$D/demo/question.txt" -t 2 > "$D/demo/answer.txt" 2> /dev/null
    "$nm" say -f "$D/demo/answer.txt" -o "$D/demo/answer.wav" 2> /dev/null
    t1=$(date +%s.%N)
    python3 -c "print('%.3f' % ($t1 - $t0))"
}
for r in $(seq "$runs"); do
    c=$(chain)
    g=$(chain --beam-size 1)
    a=$("$nm" assistant -m "$LLM" --stt "$WM" --audio "$D/demo/question.wav" --out "$D/demo" -n 120 --temp 0 -t 2 \
        --stats 2>&1 > /dev/null | sed -n 's/^end of question -> first audio sample: median \([0-9.]*\) s.*/\1/p')
    python3 -c "import sys; c, g, a = map(float, sys.argv[1:]); print('| %s | %.3f | %.3f | %.3f | %.2fx | %.2fx |' % ('$r', c, g, a, c / a, g / a))" "$c" "$g" "$a"
done
