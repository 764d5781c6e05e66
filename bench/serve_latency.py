#!/usr/bin/env python3
"""Reply latency of a running `nanomind serve` (or llama-server) on loopback, keep-alive:

    bench/serve_latency.py PORT [-n 20]

The median over N requests of GET /v1/models and of a non-streamed one-token chat answer, then
three streamed 128-token answers (ignore_eos): tokens, time to first token, tokens/s. Prints figures;
no pass/fail (docs/benchmarks.md, "Server").
"""
import http.client
import json
import sys
import time


def main():
    port = int(sys.argv[1])
    n = int(sys.argv[sys.argv.index("-n") + 1]) if "-n" in sys.argv else 20
    c = http.client.HTTPConnection("127.0.0.1", port)
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "temperature": 0}
    for path, body in (("/v1/models", None), ("/v1/chat/completions", json.dumps(chat))):
        ts = []
        for _ in range(n):
            t = time.time()
            c.request("GET" if body is None else "POST", path, body=body, headers={"Content-Type": "application/json"})
            c.getresponse().read()
            ts.append(time.time() - t)
        ts.sort()
        print("%-22s median %6.1f ms over %d requests (keep-alive)" % (path, 1000 * ts[n // 2], n))
    story = {"messages": [{"role": "user", "content": "Write a long story about a dragon."}], "max_tokens": 128,
             "stream": True, "temperature": 0, "ignore_eos": True}
    for _ in range(3):
        t0 = time.time()
        c.request("POST", "/v1/chat/completions", body=json.dumps(story), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        tokens, first, buf = 0, None, b""
        while True:
            chunk = r.read1(65536)
            if not chunk:
                break
            buf += chunk
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                if ev.startswith(b"data: {") and b'"content"' in ev:
                    tokens += 1
                    first = first if first is not None else time.time() - t0
            if b"data: [DONE]" in buf:
                break
        total = time.time() - t0
        print("streamed: %d tokens, first after %.1f ms, %.1f tokens/s" % (tokens, 1000 * first, tokens / total))
    return 0


if __name__ == "__main__":
    sys.exit(main())
