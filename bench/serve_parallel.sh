#!/usr/bin/env bash
# nanomind serve against llama-server with concurrent clients, side by side in one run:
#   bash bench/serve_parallel.sh [LLAMA_SERVER] [CLIENTS] [TOKENS]
# Each server (-c 4096, -t 2, the default SmolLM2 Q4_1) with -np 1 then -np CLIENTS, alternated, each
# asked by bench/serve_parallel.py (CLIENTS chats at once, greedy, TOKENS each, 3 rounds). LLAMA_SERVER:
# a llama-server binary built locally (left out: nanomind alone).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
NM=${NM:-$here/build/nanomind}
M=${NM_MODEL_DIR:-$HOME/.cache/nanomind/models}/SmolLM2-135M-Instruct.Q4_1.gguf
LS=${1:-}
clients=${2:-4}
tokens=${3:-128}
port=8731
run_one() { # name, command...
    local name=$1
    shift
    "$@" > /tmp/nm-serve-parallel.log 2>&1 &
    local pid=$!
    for _ in $(seq 1 100); do
        curl -sf "http://127.0.0.1:$port/health" > /dev/null 2>&1 && break
        sleep 0.2
    done
    echo "== $name"
    python3 "$here/bench/serve_parallel.py" "$port" "$clients" "$tokens" 3
    kill -TERM "$pid"
    wait "$pid" 2> /dev/null || true
}
grep -m1 "model name" /proc/cpuinfo
for np in 1 "$clients"; do
    run_one "nanomind serve -np $np" "$NM" serve -m "$M" --port "$port" -c 4096 -t 2 -np "$np"
    if [ -n "$LS" ]; then
        run_one "llama-server -np $np" "$LS" -m "$M" --port "$port" -c 4096 -t 2 -np "$np"
    fi
done
