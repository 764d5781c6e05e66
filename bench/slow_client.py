#!/usr/bin/env python3
"""How long a running `nanomind serve` keeps a slow client's connection open (docs/server.md):

    bench/slow_client.py PORT [SECONDS]

Two clients on loopback, each sending a byte group a second for SECONDS (default 12): one sends a
request's header lines one a second (the header never ends), the other a complete header with a
1,000-byte body, then the body a byte a second. Prints, for each, when the server closed the
connection or that it was still open. Figures, no pass/fail.
"""
import socket
import sys
import time


def drip(port, body, seconds):
    s = socket.create_connection(("127.0.0.1", port))
    t0 = time.time()
    if body:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1000\r\n\r\n{")
    else:
        s.sendall(b"GET /health HTTP/1.1\r\n")
    what = "body a byte a second" if body else "header lines one a second"
    try:
        for _ in range(seconds):
            time.sleep(1)
            s.sendall(b"X" if body else b"X-a: b\r\n")
        print("%s: still open after %.1f s" % (what, time.time() - t0))
    except OSError as e:
        print("%s: closed by the server after %.1f s (%s)" % (what, time.time() - t0, type(e).__name__))
    s.close()


def main():
    port = int(sys.argv[1])
    seconds = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    drip(port, False, seconds)
    drip(port, True, seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
