#!/usr/bin/env bash
# Image prompts side by side: nanomind run --mmproj/--image against llama.cpp's
# llama-mtmd-cli on the same language model, mmproj, image, prompt and
# threads, in one run, as ratios. llama.cpp is whatever the caller built
# locally (this script neither fetches nor builds it).
#   bench/vision_vs_llama_cpp.sh LLAMA_BIN_DIR [THREADS] LLM.gguf IMAGE MMPROJ.gguf...
# For each mmproj: image encode time (ms per encoder run: one image, or one
# tile or the global image of a SmolVLM split) and time to first
# token (s: from the prompt - image decoding, preprocessing, encoding and the
# prompt's prefill - to the first generated token), best of 3 runs of each.
#   nanomind:  encode alone: `nanomind bench --mmproj MM -r 3` (mean ms of 3 runs
#              after a warm-up, nothing else running: as llama.cpp encodes,
#              before it decodes); encode in the pipeline and time to first
#              token: the `vision:` (ms each) and `time to first token:` lines
#              of `run --stats` (there the LLM prefills the text before the
#              image on the same cores while the encoder runs)
#   llama.cpp: the mean of its "mtmd batch encoding done in X ms" lines (one
#              per image chunk) and, for time to
#              first token, the log timestamps from the first media chunk to
#              the end of the prompt eval ("image decoded ... " and the text
#              chunks' prompt eval from llama_perf) - read from its -v log.
set -euo pipefail
llama=$1; shift
threads=2
if [[ "${1:-}" =~ ^[0-9]+$ ]]; then threads=$1; shift; fi
llm=$1 img=$2; shift 2
nm=${NM:-build/nanomind}
[ -x "$llama/llama-mtmd-cli" ] || { echo "no llama-mtmd-cli in $llama" >&2; exit 2; }
[ -x "$nm" ] || { echo "no nanomind at $nm (make build)" >&2; exit 2; }
prompt="Describe the image."

nm_run() { # -> "encode_ms ttft_s"
    "$nm" run -m "$llm" --mmproj "$1" --image "$img" -p "$prompt" --chat --temp 0 -n 1 -t "$threads" --stats 2>&1 >/dev/null |
        python3 -c '
import re, sys
t = sys.stdin.read()
e = re.search(r"encoder runs in [0-9.]+ s \(([0-9.]+) ms each\)", t); f = re.search(r"time to first token: ([0-9.]+) s", t)
if not e or not f: sys.exit("nanomind output without timings:\n" + t[-2000:])
print(e.group(1), f.group(1))'
}

llama_run() { # -> "encode_ms ttft_s"
    "$llama/llama-mtmd-cli" -m "$llm" --mmproj "$1" --image "$img" -p "$prompt" --temp 0 -n 1 -t "$threads" -v 2>&1 |
        python3 -c '
import re, sys
t = sys.stdin.read()
def ts(line):  # "M.SS.mmm.uuu I ..." (minutes, seconds, ms, us since start) -> seconds
    m = re.match(r"(\d+)\.(\d+)\.(\d+)\.(\d+) ", line)
    return int(m.group(1)) * 60 + int(m.group(2)) + int(m.group(3)) / 1e3 + int(m.group(4)) / 1e6 if m else None
lines = t.splitlines()
enc = [float(x) for x in re.findall(r"mtmd batch encoding done in ([0-9.]+) ms", t)]  # one per image chunk
start = next((ts(l) for l in lines if "add_media:" in l), None)       # image preprocessing starts
end = next((ts(l) for l in lines if "llama_perf_context_print" in l), None)  # after the prompt and one token
if not enc: sys.exit("llama.cpp output without timings:\n" + t[-2000:])
# An idefics3 mmproj with an LLM whose vocabulary lacks the SmolVLM image tokens
# (<fake_token_around_image>, <global-img>) encodes, then stops in the text
# step: encode time only.
print(sum(enc) / len(enc), end - start if start is not None and end is not None else "nan")'
}

best() { sort -g | head -1; } # nan sorts first with -g: a failed run makes the best nan

echo "| mmproj | nanomind ms per encode, alone | in the pipeline | llama.cpp ms per encode | ratio (alone) | nanomind TTFT s | llama.cpp TTFT s | ratio |"
echo "|---|---|---|---|---|---|---|---|"
for mm in "$@"; do
    a_e=() a_t=() b_e=() b_t=()
    for r in 1 2 3; do
        read -r e t < <(nm_run "$mm"); a_e+=("$e"); a_t+=("$t")
        read -r e t < <(llama_run "$mm" || true); b_e+=("$e"); b_t+=("$t")
    done
    ae=$(printf '%s\n' "${a_e[@]}" | best); at=$(printf '%s\n' "${a_t[@]}" | best)
    be=$(printf '%s\n' "${b_e[@]}" | best); bt=$(printf '%s\n' "${b_t[@]}" | best)
    al=$("$nm" bench --mmproj "$mm" -t "$threads" -r 3 --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["encode_ms"])')
    python3 - "$mm" "$al" "$ae" "$be" "$at" "$bt" <<'PY'
import os, sys
m, al, a, b, c, d = sys.argv[1], *map(float, sys.argv[2:])
import math
ttft = f"{d:.2f} | {d/c:.2f}x faster" if not math.isnan(d) else "n/a (stops after encoding) | -"
print(f"| {os.path.basename(m)} | {al:.0f} | {a:.0f} | {b:.0f} | {b/al:.2f}x faster | {c:.2f} | {ttft} |")
PY
done
