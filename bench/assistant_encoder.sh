#!/usr/bin/env bash
# The assistant's loop with the vision encoder on a CPU lane against the
# encoder on an OpenCL device (docs/benchmarks.md, "The assistant with the
# encoder on OpenCL"), each pipelined against --sequential, alternated, in one
# run: 20 frames, each with a spoken question (bench/assistant.sh's inputs),
# Whisper and espeak-ng on core 1, the decoder on core 0 (-t 1), the encoder on
# core 1 or on the device.
#   bench/assistant_encoder.sh [RUNS]    (default 2)
# Environment: NM (build/nanomind), LLM, WM (Whisper), FRAMES and QUESTIONS
# (folders; default: bench/assistant.sh's in $DIR), DIR (/tmp/nm-bench-assistant),
# DEV (the OpenCL device, default opencl:0).
set -euo pipefail
runs=${1:-2}
nm=${NM:-build/nanomind}
gen=$(dirname "$nm")/nm-genmmproj
M=${MODELS:-$HOME/.cache/nanomind/models}
D=${DIR:-/tmp/nm-bench-assistant}
LLM=${LLM:-$M/SmolLM2-135M-Instruct.Q4_1.gguf}
WM=${WM:-$M/whisper-tiny.en.gguf}
FRAMES=${FRAMES:-$D/frames}
QUESTIONS=${QUESTIONS:-$D/questions}
DEV=${DEV:-opencl:0}
for f in "$nm" "$gen" "$LLM" "$WM" "$FRAMES" "$QUESTIONS"; do
    [ -e "$f" ] || { echo "missing $f (bench/assistant.sh makes the frames and questions)" >&2; exit 2; }
done
mkdir -p "$D/out-enc"
[ -f "$D/clip-f16.gguf" ] || "$gen" -o "$D/clip-f16.gguf" --proj mlp --type f16 --image-size 224 --patch-size 16 \
    --n-embd 768 --n-ff 3072 --n-head 12 --n-layer 13 --n-out 576 > /dev/null
if ! "$nm" --list-devices 2>/dev/null | grep -q "^ *${DEV}\b\|${DEV}:"; then
    echo "note: '$nm --list-devices' does not list $DEV: its rows will fail" >&2
fi
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; $(date -u '+%Y-%m-%d %H:%M UTC')"
"$nm" --list-devices 2>/dev/null | grep -i opencl | head -3 || true
echo
echo "| run | encoder | mode | questions/s | end of question -> first audio, median (min-max) s | -> answer spoken, median s | vision brick busy, s |"
echo "|---|---|---|---|---|---|---|"
declare -A qps
for r in $(seq "$runs"); do
    for enc in cpu "$DEV"; do
        for mode in pipelined sequential; do
            flag=""; [ "$mode" = sequential ] && flag=--sequential
            where=(--mmproj-cores 1); [ "$enc" != cpu ] && where=(--mmproj-device "$enc")
            out=$("$nm" assistant -m "$LLM" --stt "$WM" --audio "$QUESTIONS" --mmproj "$D/clip-f16.gguf" \
                  --frames "$FRAMES" --out "$D/out-enc" -n 16 --temp 0 -t 1 --cores 0 "${where[@]}" \
                  --stt-cores 1 --tts-cores 1 --stats $flag 2>&1 > /dev/null) || { echo "| $r | $enc | $mode | failed: $(tail -1 <<< "$out") |"; continue; }
            q=$(sed -En 's/.*: ([0-9.]+) questions\/s.*/\1/p' <<< "$out")
            fa=$(sed -n 's/^end of question -> first audio sample: median \([0-9.]*\) s, min \([0-9.]*\) s, max \([0-9.]*\) s/\1 (\2-\3)/p' <<< "$out")
            sp=$(sed -n 's/^end of question -> answer spoken: median \([0-9.]*\) s.*/\1/p' <<< "$out")
            vb=$(sed -n 's/^vision brick ([^)]*): [0-9]* requests, busy \([0-9.]*\) s.*/\1/p' <<< "$out")
            qps[$r$enc$mode]=$q
            echo "| $r | $enc | $mode | $q | $fa | $sp | $vb |"
        done
    done
done
for r in $(seq "$runs"); do
    python3 -c "
import sys
c, cs, g, gs = (float(x) if x else 0.0 for x in sys.argv[1:])
f = lambda a, b: '%.2fx' % (a / b) if a and b else 'n/a'
print('run $r: pipelined / sequential: encoder on cpu %s, on $DEV %s; $DEV / cpu pipelined %s' % (f(c, cs), f(g, gs), f(g, c)))" \
        "${qps[${r}cpupipelined]:-}" "${qps[${r}cpusequential]:-}" "${qps[${r}${DEV}pipelined]:-}" "${qps[${r}${DEV}sequential]:-}"
done
