#!/usr/bin/env python3
"""A load test of an OpenAI-compatible server: many streaming chat clients for a while.

usage: serve_load.py PORT CLIENTS SECONDS TOKENS [SERVER_PID]
CLIENTS threads, each on its own keep-alive connection, ask streamed chat completions one after
another (greedy, ignore_eos, max_tokens TOKENS, a question of its own each time) until SECONDS have
passed since the start; a request begun before then is finished. Prints the requests, the failed ones
(an HTTP error, a broken stream, a wrong token count: each counted, the first few shown; a request on
a kept-alive connection that the server had closed is sent again on a new one and counted apart), the
aggregate completion tokens a second (all tokens / the time from the start to the last answer's end),
the time to first token (p50, p99, max: from sending the request to the first content event, queueing
included), and, given the server's pid, its resident set: after one warm-up request, a quarter of the
way in (every sequence slot and the HTTP threads in use by then) and at the end (a leak grows the last
against the second).
Works against `nanomind serve` and llama-server alike (docs/benchmarks.md, "Server": figures).
"""
import http.client
import json
import sys
import threading
import time

port, clients, seconds, ntok = (int(a) for a in sys.argv[1:5])
pid = int(sys.argv[5]) if len(sys.argv) > 5 else 0
topics = ["cats", "dogs", "the sea", "mountains", "rivers", "the moon", "bread", "music", "trains", "rain",
          "books", "gardens", "clocks", "bridges", "owls", "snow"]


def rss_kib():
    if not pid:
        return 0
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def stream_one(conn, i, k):
    """One streamed chat: (time to first token, completion tokens); raises on any failure."""
    body = json.dumps({"messages": [{"role": "user", "content": "Tell me about %s (%d)." % (topics[(i + k) % len(topics)], k)}],
                       "max_tokens": ntok, "temperature": 0, "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}})
    t0 = time.time()
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError("HTTP %d: %s" % (r.status, r.read()[:200]))
    ttft, n_events, usage, done = None, 0, None, False
    while True:
        line = r.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            done = True
            continue
        ev = json.loads(data)
        if ev.get("usage"):
            usage = ev["usage"]["completion_tokens"]
        for ch in ev.get("choices") or []:
            if (ch.get("delta") or {}).get("content"):
                n_events += 1
                if ttft is None:
                    ttft = time.time() - t0
    if not done or ttft is None:
        raise RuntimeError("stream ended without [DONE] or without content")
    if usage is not None and usage != ntok:
        raise RuntimeError("%d completion tokens, asked %d" % (usage, ntok))
    return ttft, usage if usage is not None else n_events


reconnects = []


def client(i, t_end, res):
    conn, k = None, 0
    while time.time() < t_end:
        try:
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
                fresh = True
            else:
                fresh = False
            try:
                ttft, n = stream_one(conn, i, k)
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                if fresh:
                    raise
                # a kept-alive connection the server had closed (llama-server closes one after a stream):
                # the request again on a new connection, as HTTP clients do; counted apart, not a failure
                reconnects.append(1)
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
                ttft, n = stream_one(conn, i, k)
            res.append((ttft, n, time.time()))
        except Exception as e:  # noqa: BLE001 (every failure is counted and shown)
            res.append((None, 0, time.time(), "%s: %s" % (type(e).__name__, e)))
            if conn is not None:
                conn.close()
            conn = None
        k += 1
    if conn is not None:
        conn.close()


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100.0 * (len(v) - 1))))] if v else float("nan")


def main():
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    stream_one(c, 0, 0)  # warm-up: the model's pages in, the prompt cache, the first allocation
    c.close()
    rss0 = rss_kib()
    res = []
    t0 = time.time()
    th = [threading.Thread(target=client, args=(i, t0 + seconds, res)) for i in range(clients)]
    for t in th:
        t.start()
    time.sleep(seconds / 4.0)
    rss_q = rss_kib()
    for t in th:
        t.join()
    ok = [r for r in res if r[0] is not None]
    bad = [r for r in res if r[0] is None]
    t_last = max((r[2] for r in ok), default=t0)
    tok = sum(r[1] for r in ok)
    ttft = [r[0] for r in ok]
    time.sleep(1.0)
    rss1 = rss_kib()
    print("%d clients, %d s: %d requests, %d failed, %d sent again on a new connection; %d tokens in %.1f s: %.1f tokens/s; "
          "TTFT p50 %.3f s, p99 %.3f s, max %.3f s" % (clients, seconds, len(res), len(bad), len(reconnects), tok, t_last - t0,
                                                       tok / max(t_last - t0, 1e-9), pct(ttft, 50), pct(ttft, 99),
                                                       max(ttft, default=float("nan"))))
    for r in bad[:5]:
        print("  failed: %s" % r[3])
    if pid:
        print("RSS after the warm-up %.1f MiB, a quarter in %.1f MiB, at the end %.1f MiB (%+.1f%% on the quarter)" % (
            rss0 / 1024.0, rss_q / 1024.0, rss1 / 1024.0, 100.0 * (rss1 - rss_q) / max(rss_q, 1)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
