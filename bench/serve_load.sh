#!/usr/bin/env bash
# The load test of issue 17, nanomind serve against llama-server, side by side in one run:
#   bash bench/serve_load.sh [LLAMA_SERVER] [CLIENTS] [SECONDS] [TOKENS] [PARALLEL]
# (defaults: nanomind alone, 64 clients, 60 s, 64 tokens, -np 8). Each server (-c 8192, -t 2, the
# default SmolLM2 Q4_1, -np PARALLEL; nanomind with --queue CLIENTS so that no client is turned away,
# llama-server with as many HTTP threads as nanomind has)
# is loaded by bench/serve_load.py: CLIENTS streaming clients asking one chat after another for
# SECONDS; then the ratios. LLAMA_SERVER: a llama-server binary built locally.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
NM=${NM:-$here/build/nanomind}
M=${NM_MODEL_DIR:-$HOME/.cache/nanomind/models}/SmolLM2-135M-Instruct.Q4_1.gguf
LS=${1:-}
clients=${2:-64}
seconds=${3:-60}
tokens=${4:-64}
np=${5:-8}
port=8733
log=$(mktemp /tmp/nm-serve-load.XXXXXX)
trap 'rm -f "$log" "$log".*' EXIT
run_one() { # tag, command...
    local tag=$1
    shift
    "$@" > "$log.server" 2>&1 &
    local pid=$!
    for _ in $(seq 1 150); do
        curl -sf "http://127.0.0.1:$port/health" > /dev/null 2>&1 && break
        sleep 0.2
    done
    echo "== $*" | sed "s|$HOME|~|g"
    python3 "$here/bench/serve_load.py" "$port" "$clients" "$seconds" "$tokens" "$pid" | tee "$log.$tag" || true
    kill -TERM "$pid"
    wait "$pid" 2> /dev/null || true
}
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; $(date -u '+%Y-%m-%d %H:%M UTC')"
run_one nm "$NM" serve -m "$M" --port "$port" -c 8192 -t 2 -np "$np" --queue "$clients"
[ -n "$LS" ] || exit 0
# (its HTTP threads as many as nanomind's: with its default, --parallel + 2 here, the connections beyond
# them are closed under the clients, RemoteDisconnected)
run_one ls "$LS" -m "$M" --port "$port" -c 8192 -t 2 -np "$np" --threads-http $((np + clients + 16))
python3 - "$log.nm" "$log.ls" <<'PY'
import re, sys
def read(p):
    s = open(p).read()
    return (float(re.search(r"([0-9.]+) tokens/s", s).group(1)), float(re.search(r"p50 ([0-9.]+) s", s).group(1)),
            float(re.search(r"p99 ([0-9.]+) s", s).group(1)))
a, b = read(sys.argv[1]), read(sys.argv[2])
print("nanomind / llama-server: aggregate tokens/s %.2fx, TTFT p50 %.2fx, p99 %.2fx" % (a[0] / b[0], a[1] / b[1], a[2] / b[2]))
PY
