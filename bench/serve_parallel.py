#!/usr/bin/env python3
"""Concurrent clients against an OpenAI-compatible server: aggregate tokens a second.

usage: serve_parallel.py PORT CLIENTS TOKENS [ROUNDS]
Each of CLIENTS threads asks one chat completion (greedy, ignore_eos, max_tokens TOKENS, a different
short question each) at once; prints the wall time, the aggregate completion tokens a second and each
request's time to its last token, ROUNDS times (default 3). Works against `nanomind serve` and
llama-server alike (docs/benchmarks.md, "Server": the commands and figures).
"""
import json
import sys
import threading
import time
import urllib.request

port, clients, ntok = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
topics = ["cats", "dogs", "the sea", "mountains", "rivers", "the moon", "bread", "music"]


def ask(i, out):
    body = json.dumps({"messages": [{"role": "user", "content": "Tell me about %s." % topics[i % len(topics)]}],
                       "max_tokens": ntok, "temperature": 0, "ignore_eos": True}).encode()
    t0 = time.time()
    req = urllib.request.Request("http://127.0.0.1:%d/v1/chat/completions" % port, body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        j = json.loads(r.read())
    out[i] = (time.time() - t0, j["usage"]["completion_tokens"])


for k in range(rounds):
    out = [None] * clients
    t0 = time.time()
    th = [threading.Thread(target=ask, args=(i, out)) for i in range(clients)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.time() - t0
    tok = sum(o[1] for o in out)
    print("round %d: %d clients x %d tokens in %.2f s: %.1f tokens/s; each %s s" %
          (k + 1, clients, ntok, wall, tok / wall, " ".join("%.2f" % o[0] for o in out)))
