#!/usr/bin/env bash
# Real-time factor of `nanomind transcribe` next to whisper.cpp's whisper-cli on
# the same model weights, audio file and thread count. whisper.cpp is built
# outside this repository (docs/correctness.md, "Whisper", says how).
#
# usage: bench/whisper_vs_whisper_cpp.sh WHISPER_CLI MODEL.bin [MODEL.gguf] [AUDIO.wav] [THREADS] [RUNS]
#   MODEL.bin   whisper.cpp ggml file (both tools run it; nanomind also runs MODEL.gguf if given)
#   AUDIO.wav   16 kHz mono 16-bit WAV (default tests/data/speech/tts_16k.wav; a longer one shows the
#               steady state: docs/benchmarks.md used a 32.9 s copy of tts_long.ogg)
#   THREADS     -t for both (default 2); RUNS: best of N wall times (default 3)
# RTF = wall time of the whole command (load + mel + encode + decode) / audio seconds.
set -euo pipefail
WCLI=${1:?usage: $0 WHISPER_CLI MODEL.bin [MODEL.gguf] [AUDIO.wav] [THREADS] [RUNS]}
BIN=${2:?need the ggml .bin model}
GGUF=${3:-}
AUDIO=${4:-}
T=${5:-2}
RUNS=${6:-3}
here=$(cd "$(dirname "$0")/.." && pwd)
NM=${NM:-$here/build/nanomind}
[ -x "$NM" ] || { echo "error: $NM not built (cmake --build build --target nanomind)" >&2; exit 1; }
[ -x "$WCLI" ] || { echo "error: whisper-cli not found at $WCLI" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# whisper-cli reads WAV at 16 kHz as is (other rates go through its own resampler).
[ -n "$AUDIO" ] || AUDIO=$here/tests/data/speech/tts_16k.wav
secs=$(python3 -c "import wave,sys; w=wave.open(sys.argv[1]); print(w.getnframes()/w.getframerate())" "$AUDIO")

best() { # best wall time of RUNS runs of "$@"
    local b=""
    for _ in $(seq "$RUNS"); do
        local t0 t1
        t0=$(date +%s.%N)
        "$@" > "$tmp/out.txt" 2> "$tmp/err.txt" || { echo "error: $* failed: $(tail -2 "$tmp/err.txt")" >&2; exit 1; }
        t1=$(date +%s.%N)
        b=$(python3 -c "import sys; t=float(sys.argv[2])-float(sys.argv[1]); b=sys.argv[3]; print(t if not b or t<float(b) else b)" "$t0" "$t1" "$b")
    done
    echo "$b"
}

echo "audio: $AUDIO ($secs s), threads $T, best of $RUNS; $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
printf "%-10s %-22s %9s %7s %9s %7s %8s\n" mode model "wcpp s" "RTF" "ours s" "RTF" "ours/wcpp"
for mode in greedy beam5; do
    if [ $mode = greedy ]; then wa=(-bs 1); na=(--beam-size 1); else wa=(); na=(); fi
    w=$(best "$WCLI" -m "$BIN" -f "$AUDIO" -t "$T" -nt -np "${wa[@]}")
    for model in "$BIN" ${GGUF:+"$GGUF"}; do
        o=$(best "$NM" transcribe -m "$model" "$AUDIO" -t "$T" -nt "${na[@]}")
        python3 -c "
import sys; w,o,s=float(sys.argv[1]),float(sys.argv[2]),float(sys.argv[3])
print('%-10s %-22s %9.2f %7.3f %9.2f %7.3f %8.2f' % (sys.argv[4], sys.argv[5][-22:], w, w/s, o, o/s, o/w))" "$w" "$o" "$secs" "$mode" "$(basename "$model")"
    done
done
