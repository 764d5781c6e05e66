#!/usr/bin/env bash
# Side-by-side speed and memory of nanomind and llama.cpp on the same model
# files, threads and sizes, in one run, as ratios. llama.cpp is whatever the
# caller built locally (this script does not fetch or build it).
#   bench/vs_llama_cpp.sh LLAMA_BIN_DIR [THREADS] MODEL.gguf...
# prints a markdown table: pp128, tg64 (mean of 5), peak RSS of a 128-token
# generation at context 4096, and nanomind/llama.cpp ratios.
set -euo pipefail
llama=$1; shift
threads=2
if [[ "${1:-}" =~ ^[0-9]+$ ]]; then threads=$1; shift; fi
nm=${NM:-build/nanomind}
[ -x "$llama/llama-bench" ] || { echo "no llama-bench in $llama" >&2; exit 2; }
[ -x "$nm" ] || { echo "no nanomind at $nm (make build)" >&2; exit 2; }

rss_kb() { /usr/bin/time -v "$@" 2>&1 >/dev/null | awk -F: '/Maximum resident/ {gsub(/ /, "", $2); print $2}'; }
num() { python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }

echo "| model | nanomind pp128 | llama.cpp pp128 | ratio | nanomind tg64 | llama.cpp tg64 | ratio | nanomind RSS | llama.cpp RSS | ratio |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for m in "$@"; do
    j=$("$nm" bench -m "$m" -p 128 -n 64 -t "$threads" -r 5 --json)
    nm_pp=$(num '["pp_tps"]' <<< "$j"); nm_tg=$(num '["tg_tps"]' <<< "$j")
    lj=$("$llama/llama-bench" -m "$m" -p 128 -n 64 -t "$threads" -r 5 -o json 2>/dev/null)
    l_pp=$(num '[0]["avg_ts"]' <<< "$lj"); l_tg=$(num '[1]["avg_ts"]' <<< "$lj")
    nm_rss=$(rss_kb "$nm" run -m "$m" -no-cnv -p "Once upon a time" -n 128 --temp 0 -t "$threads" -c 4096)
    l_rss=$(rss_kb "$llama/llama-completion" -m "$m" -p "Once upon a time" -n 128 --temp 0 -t "$threads" -c 4096 -no-cnv)
    python3 - "$m" "$nm_pp" "$l_pp" "$nm_tg" "$l_tg" "$nm_rss" "$l_rss" <<'PY'
import os, sys
m, a, b, c, d, e, f = sys.argv[1], *map(float, sys.argv[2:])
print(f"| {os.path.basename(m)} | {a:.1f} | {b:.1f} | {a/b:.2f}x | {c:.1f} | {d:.1f} | {c/d:.2f}x | "
      f"{e/1024:.1f} MiB | {f/1024:.1f} MiB | {e/f:.2f}x |")
PY
done
