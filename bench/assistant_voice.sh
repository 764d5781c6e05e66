#!/usr/bin/env bash
# The assistant's end of question -> first audio sample with each voice (docs/benchmarks.md, "Piper
# voices"): `nanomind assistant` on the demo's spoken question (scripts/demo.sh's), Whisper tiny.en,
# SmolLM2 (greedy, up to 120 tokens), 2 threads, answering with espeak-ng and with the Piper voice
# (en_US-joe-medium), the two interleaved, RUNS times each; prints each run and the medians.
#   bench/assistant_voice.sh [RUNS]     (default 5; files go to $DIR, default /tmp/nm-bench-voice)
set -euo pipefail
runs=${1:-5}
nm=${NM:-build/nanomind}
M=${MODELS:-$HOME/.cache/nanomind/models}
D=${DIR:-/tmp/nm-bench-voice}
LLM=$M/SmolLM2-135M-Instruct.Q4_1.gguf
WM=$M/whisper-tiny.en.gguf
VOICE=$M/piper-en_US-joe-medium.gguf
for f in "$nm" "$LLM" "$WM" "$VOICE"; do [ -e "$f" ] || { echo "missing $f (make build models)" >&2; exit 2; }; done
mkdir -p "$D/espeak-ng" "$D/piper"
question="Why is the sky blue? Answer in two sentences." # scripts/demo.sh's
[ -f "$D/question.wav" ] || "$nm" say "$question" -o "$D/question.wav" 2> /dev/null
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; $(date -u '+%Y-%m-%d %H:%M UTC')"
echo
echo "| run | espeak-ng, s | piper, s | piper / espeak-ng |"
echo "|---|---|---|---|"
first() { # seconds from the question's end to the answer's first audio sample, with voice $1
    "$nm" assistant -m "$LLM" --stt "$WM" --audio "$D/question.wav" --out "$D/$1" --tts "$1" -n 120 --temp 0 -t 2 \
        --stats 2>&1 > /dev/null | sed -n 's/^end of question -> first audio sample: median \([0-9.]*\) s.*/\1/p'
}
es=() ps=()
for r in $(seq "$runs"); do
    e=$(first espeak-ng)
    p=$(first piper)
    es+=("$e") ps+=("$p")
    python3 -c "import sys; e, p = map(float, sys.argv[1:]); print('| %s | %.3f | %.3f | %.2fx |' % ('$r', e, p, p / e))" "$e" "$p"
done
python3 - "${es[*]}" "${ps[*]}" <<'PY'
import statistics, sys
e, p = ([float(v) for v in a.split()] for a in sys.argv[1:])
print("\nmedian: espeak-ng %.3f s, piper %.3f s: piper / espeak-ng = %.2fx" % (statistics.median(e), statistics.median(p),
      statistics.median(p) / statistics.median(e)))
PY
