#!/usr/bin/env python3
"""nanomind serve against the official `openai` client and raw HTTP (docs/server.md).

usage: test_server.py path/to/nanomind
Starts the server on a free loopback port (stopped at the end, by SIGTERM),
runs the cases, prints "N passed, N failed, N skipped". NM_SERVER_FILTER (a
regex searched in each case's name) runs only the cases it names, and starts
only the servers they need (the first one always starts). A case needing the
default model is a skip without it (a failure under NM_CI), and the whole
file is a skip without the `openai` package (a failure under NM_CI: set-up
installs it).
"""
import http.client
import json
import re
import os
import signal
import socket
import subprocess
import tempfile
import sys
import threading
import time

NM = os.path.abspath(sys.argv[1])
MODELS = os.environ.get("NM_MODEL_DIR", os.path.expanduser("~/.cache/nanomind/models"))
M = os.path.join(MODELS, "SmolLM2-135M-Instruct.Q4_1.gguf")
CI = os.environ.get("NM_CI", "0") not in ("", "0")
KEY = "test-key-1"
passed = failed = skipped = 0


def result(name, ok, why=""):
    global passed, failed
    if ok:
        passed += 1
        print("ok   " + name)
    else:
        failed += 1
        print("FAIL %s (%s)" % (name, why))


def skip_all(why):
    global skipped, failed
    if CI:
        failed += 1
        print("FAIL server (%s, and NM_CI is set)" % why)
    else:
        skipped += 1
        print("skip server (%s)" % why)
    print("%d passed, %d failed, %d skipped" % (passed, failed, skipped))
    sys.exit(1 if failed else 0)


try:
    import openai
except ImportError:
    skip_all("the openai package is not installed (scripts/setup.sh installs it)")
if not os.path.exists(M):
    skip_all("needs %s" % M)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start(*extra, model=None):
    port = free_port()
    p = subprocess.Popen([NM, "serve", "-m", model or M, "--port", str(port), "-t", "2", *extra],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for _ in range(300):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return p, port
        except OSError:
            time.sleep(0.1)
        if p.poll() is not None:
            break
    raise RuntimeError("the server did not start: " + (p.stderr.read() if p.poll() is not None else "timeout"))


# A 1000-token generation's time budget: under ASan the decoder makes ~18 tokens/s on the 2-core machine
# (57 s for 1000), so the budgets of the requests that wait for one are 3 minutes, not 1.
LONG_S = 180


def stop(p, timeout=60):
    p.send_signal(signal.SIGTERM)
    try:
        rc = p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = "hung"
    return rc, p.stderr.read()


def raw(port, method, path, body=None, headers=None, timeout=60):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    h = {"Authorization": "Bearer " + KEY}
    if body is not None:
        h["Content-Type"] = "application/json"
    h.update(headers or {})
    c.request(method, path, body=body, headers=h)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def err_of(data):
    try:
        e = json.loads(data)["error"]
        return e["code"], e["message"], e.get("param")
    except (ValueError, KeyError, TypeError):
        return None, data[:200], None


def run_nm(*args):  # run's text, without the newline it ends with
    out = subprocess.run([NM, "run", "-m", M, "-t", "2", *args], capture_output=True, text=True, timeout=300).stdout
    return out[:-1] if out.endswith("\n") else out


FILTER = os.environ.get("NM_SERVER_FILTER", "")


def wanted(*names):  # whether NM_SERVER_FILTER lets one of these cases run
    return not FILTER or any(re.search(FILTER, n) for n in names)


# NM_SANITIZED=1 (the ASan/TSan stages: make test-asan): the cases that only repeat, slower, a comparison
# of numbers the Release run makes, on paths other cases walk under the sanitizer too, are skipped (counted)
SANITIZED = os.environ.get("NM_SANITIZED", "0") not in ("", "0")
NUMERIC_REPEATS = {"piper_speech_equals_say": "the Piper path of piper_round_trip and piper_speech_on_opencl"}


def case(name, fn):
    global skipped
    if not wanted(name):
        return
    if SANITIZED and name in NUMERIC_REPEATS:
        skipped += 1
        print("skip %s (NM_SANITIZED: a numeric repeat of the Release run; %s)" % (name, NUMERIC_REPEATS[name]))
        return
    try:
        fn(name)
    except Exception as e:  # a case that raises is a failure, named
        result(name, False, "%s: %s" % (type(e).__name__, e))


# a machine's energy meters, in a sysfs of our own: a RAPL package counter and a 3 W hwmon power input
SYSFS = tempfile.mkdtemp(prefix="nm-server-sysfs-")
for rel, val in [("class/powercap/intel-rapl:0/name", "package-0"), ("class/powercap/intel-rapl:0/energy_uj", "5000000"),
                 ("class/powercap/intel-rapl:0/max_energy_range_uj", "262143328850"),
                 ("class/hwmon/hwmon0/name", 'acpi "power"'), ("class/hwmon/hwmon0/power1_input", "3000000")]:
    os.makedirs(os.path.dirname(os.path.join(SYSFS, rel)), exist_ok=True)
    with open(os.path.join(SYSFS, rel), "w") as f:
        f.write(val + "\n")
p, port = start("--api-key", KEY, "--max-body", "4096", "--queue", "0", "-c", "512", "--sysfs", SYSFS, "--body-timeout", "2",
                "--metrics", "--log-disable")  # (llama-server launch scripts pass these: accepted)
# cache_prompt false: every prompt decoded afresh, as `run` decodes it; the text is run's to the bit with the
# cache too (cache_answers_equal_fresh), this keeps one case of each
EXACT = {"cache_prompt": False}
client = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % port, api_key=KEY, max_retries=0, timeout=120)
Q = "What is the capital of France?"


def t_models(name):
    ids = [m.id for m in client.models.list().data]
    result(name, ids == ["SmolLM2-135M-Instruct.Q4_1.gguf"], ids)


def t_chat(name):
    r = client.chat.completions.create(model="x", messages=[{"role": "user", "content": Q}], max_tokens=12,
                                       temperature=0, extra_body=EXACT)
    want = run_nm("--chat", "-p", Q, "-n", "12", "--temp", "0")
    got = r.choices[0].message.content
    ok = got == want and r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 12 \
        and r.usage.prompt_tokens > 10 and r.object == "chat.completion"
    result(name, ok, "%r against run's %r, %s" % (got, want, r.usage))


def t_chat_stream(name):
    s = client.chat.completions.create(model="x", messages=[{"role": "user", "content": Q}], max_tokens=12,
                                       temperature=0, stream=True, stream_options={"include_usage": True},
                                       extra_body=EXACT)
    text, finish, usage, n = "", None, None, 0
    for ch in s:
        if ch.choices:
            n += 1
            text += ch.choices[0].delta.content or ""
            finish = ch.choices[0].finish_reason or finish
        if ch.usage:
            usage = ch.usage
    want = run_nm("--chat", "-p", Q, "-n", "12", "--temp", "0")
    ok = text == want and finish == "length" and usage is not None and usage.completion_tokens == 12 and n >= 12
    result(name, ok, "%r (%d chunks, %s, %s) against %r" % (text, n, finish, usage, want))


def t_completion(name):
    r = client.completions.create(model="x", prompt="The capital of France is", max_tokens=6, temperature=0,
                                  extra_body=EXACT)
    want = run_nm("-no-cnv", "-p", "The capital of France is", "-n", "6", "--temp", "0")
    got = "The capital of France is" + r.choices[0].text
    # streamed: the same text (newlines and all, escaped in each chunk's JSON)
    s = client.completions.create(model="x", prompt="The capital of France is", max_tokens=6, temperature=0,
                                  stream=True, extra_body=EXACT)
    streamed = "The capital of France is" + "".join(ch.choices[0].text for ch in s if ch.choices)
    result(name, got == want and streamed == want and "\n" in got and r.usage.completion_tokens == 6,
           "%r, streamed %r, against run's %r" % (got, streamed, want))


def t_stop(name):
    r = client.completions.create(model="x", prompt="The capital of France is", max_tokens=20, temperature=0,
                                  stop=["."], extra_body=EXACT)
    s = client.completions.create(model="x", prompt="The capital of France is", max_tokens=20, temperature=0,
                                  stop=[".\n", "zzz"], stream=True, extra_body=EXACT)
    streamed = "".join(ch.choices[0].text for ch in s if ch.choices)
    # the answer is " Paris.\n\nThe answer ...": cut before the stop, which is not part of it
    result(name, r.choices[0].text == " Paris" and r.choices[0].finish_reason == "stop" and streamed == " Paris",
           "%r, streamed %r" % (r.choices[0], streamed))


def t_bad_key(name):
    bad = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % port, api_key="wrong", max_retries=0)
    try:
        bad.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        result(name, False, "answered with a wrong key")
    except openai.AuthenticationError as e:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)  # and no key at all
        c.request("POST", "/v1/completions", body=b'{"prompt": "hi", "max_tokens": 1}')
        r = c.getresponse()
        none = r.status, err_of(r.read())[0]
        result(name, e.status_code == 401 and none == (401, 401), "%s; without a key: %s" % (e, none))


def t_bad_requests(name):
    cases = [
        ("POST", "/v1/chat/completions", b"{not json", 400, None),
        ("POST", "/v1/chat/completions", b'{"messages": "hi"}', 400, "messages"),
        ("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}',
         400, "temperature"),
        ("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "n": 2}', 400, "n"),
        ("POST", "/v1/chat/completions", b'{"messages": [{"role": "wizard", "content": "hi"}]}', 400, "messages"),
        ("POST", "/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}).encode(), 400, "messages"),
        ("POST", "/v1/completions", b'{"prompt": 5}', 400, "prompt"),
        ("POST", "/v1/completions", b'{"prompt": "x", "stop": [1]}', 400, "stop"),
        ("POST", "/v1/completions", b'{"prompt": "x", "stop": ["a", ""]}', 400, "stop"),
        # 11 stop strings of 256 bytes: within the body limit, over the decoder's 2 KiB slot (-c 512)
        ("POST", "/v1/completions", json.dumps({"prompt": "x", "stop": [c * 256 for c in "abcdefghijk"]}).encode(),
         400, None),
        ("POST", "/v1/completions", b'{"prompt": "x", "max_tokens": 1.5}', 400, "max_tokens"),
        ("POST", "/v1/completions", json.dumps({"prompt": "x" * 5000}).encode(), 413, None),
        ("GET", "/v1/chat/completions", None, 405, None),
        ("GET", "/v1/nothing", None, 404, None),
    ]
    bad = []
    for method, path, body, want, param in cases:
        st, data = raw(port, method, path, body)
        code, msg, got_param = err_of(data)
        if st != want or code != want or (param and got_param != param):
            bad.append("%s %s %r: %s %s %s" % (method, path, (body or b"")[:40], st, msg, got_param))
    st, _ = raw(port, "GET", "/health")
    result(name, not bad and st == 200, "; ".join(bad))


def http_get(port_, method, path, headers, body=None):  # (status, headers, body), headers as given (Host too)
    c = http.client.HTTPConnection("127.0.0.1", port_, timeout=60)
    c.request(method, path, body=body, headers=headers)
    r = c.getresponse()
    out = r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    c.close()
    return out


def t_cors_host_content_type(name):
    """A web page must not drive the server (issue 45, item 20): no CORS headers (a preflight gets none),
    a Host that is not a loopback name refused on a loopback server (DNS rebinding), JSON routes take
    application/json only (a page may POST text/plain, a form or an untyped Blob without a preflight)."""
    bad = []
    auth = {"Authorization": "Bearer " + KEY}
    pre = dict(auth, **{"Origin": "http://evil.example", "Access-Control-Request-Method": "POST",
                        "Access-Control-Request-Headers": "authorization, content-type"})
    for method, path in (("OPTIONS", "/v1/chat/completions"), ("GET", "/v1/models"), ("GET", "/health")):
        st, h, _ = http_get(port, method, path, pre)
        cors = [k for k in h if k.startswith("access-control-")]
        if cors:
            bad.append("%s %s: %s %s" % (method, path, st, cors))
    body = json.dumps({"prompt": "hi", "max_tokens": 1})
    for host, want in (("evil.example", 403), ("evil.example:%d" % port, 403), ("127.0.0.1.evil.example", 403),
                       ("localhost:%d" % port, 200), ("127.0.0.1", 200), ("[::1]:%d" % port, 200), ("LocalHost", 200)):
        for method, path, b in (("GET", "/v1/models", None), ("POST", "/v1/completions", body)):
            st, _, data = http_get(port, method, path, dict(auth, **{"Host": host, "Content-Type": "application/json"}), b)
            if st != want or (st == 403 and "Host" not in str(err_of(data)[1])):
                bad.append("Host %s %s: %s %s" % (host, path, st, data[:120]))
    for ctype, want in (("text/plain", 415), (None, 415), ("application/x-www-form-urlencoded", 415),
                        ("application/jsonx", 415), ("multipart/form-data; boundary=x", 415),
                        ("Application/JSON; charset=utf-8", 200)):
        h = dict(auth)
        if ctype:
            h["Content-Type"] = ctype
        st, _, data = http_get(port, "POST", "/v1/completions", h, body)
        if st != want or (st == 415 and "application/json" not in str(err_of(data)[1])):
            bad.append("Content-Type %s: %s %s" % (ctype, st, data[:120]))
    # bound to every address (--host 0.0.0.0), the server takes any Host: it is reached by names it cannot know
    p7, port7 = start("--host", "0.0.0.0")
    try:
        st, _, data = http_get(port7, "GET", "/v1/models", {"Host": "my-box.lan:%d" % port7})
        if st != 200:
            bad.append("--host 0.0.0.0, Host my-box.lan: %s %s" % (st, data[:120]))
    finally:
        stop(p7)
    result(name, not bad, "; ".join(bad))


def t_two_content_lengths(name):
    """Two different Content-Length headers: which one frames the body is ambiguous (a proxy in front may take
    the other: request smuggling), so it is a 400 and the connection closes; two equal ones are one."""
    body = b'{"prompt": "hi", "max_tokens": 1}'
    got = []
    for lengths in ((len(body), 5), (5, len(body)), (len(body), len(body))):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + KEY.encode() +
                  b"\r\nContent-Type: application/json\r\n" +
                  b"".join(b"Content-Length: %d\r\n" % n for n in lengths) + b"\r\n" + body)
        data = b""
        try:
            while True:
                k = s.recv(65536)
                if not k:
                    break
                data += k
                if lengths[0] == lengths[1] and b"\r\n\r\n" in data and data.rstrip().endswith(b"}"):
                    break  # (kept alive: the whole answer is there)
        except socket.timeout:
            data += b" [still open after 10 s]"
        s.close()
        got.append(data.split(b"\r\n", 1)[0] + (b" whole" if data.endswith(b"}") else b" " + data[-40:]))
    # (civetweb refuses the second order itself, its own 400 in text; the first came to the handler, and was a 200)
    ok = all(g.startswith(b"HTTP/1.1 400") and b"still open" not in g for g in got[:2]) and got[2].startswith(b"HTTP/1.1 200")
    result(name, ok, got)


def random_body(rng):
    """A body that must be refused (4xx): random bytes, cut JSON, deep nesting, a value that is not an
    object, messages or a prompt of the wrong shape, a known field of the wrong type, bad UTF-8 in the text
    with a wrong field; unknown fields sprinkled in (ignored, as llama-server)."""
    def val(d=0):
        k = rng.randrange(8 if d < 3 else 5)
        return [lambda: rng.randrange(-10 ** 9, 10 ** 9), lambda: rng.random() * 10 ** rng.randrange(-5, 300),
                lambda: "".join(chr(rng.randrange(1, 0x2FFF)) for _ in range(rng.randrange(20))),
                lambda: rng.random() < 0.5, lambda: None,
                lambda: [val(d + 1) for _ in range(rng.randrange(4))],
                lambda: {"k%d" % rng.randrange(99): val(d + 1) for _ in range(rng.randrange(4))},
                lambda: "x" * rng.randrange(300)][k]()

    def unknown(o):
        for _ in range(rng.randrange(3)):
            o["zz_%d" % rng.randrange(1000)] = val()
        return o
    good_msgs = [{"role": "user", "content": "hi"}]
    kind = rng.randrange(8)
    if kind == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(300)))
    if kind == 1:
        t = json.dumps(unknown({"messages": good_msgs, "max_tokens": 2}))
        return t[:rng.randrange(len(t))].encode()
    if kind == 2:
        d = rng.randrange(100, 3000)
        return b"[" * d + (b"]" * d if rng.random() < 0.5 else b"") if rng.random() < 0.5 else \
            b'{"messages": ' + b"[" * d + b"]" * d + b"}"
    if kind == 3:
        return json.dumps(rng.choice([5, "x", [], None, True, [{"messages": good_msgs}], 1e308])).encode()
    if kind == 4:
        msgs = rng.choice([val(), [], [{"role": "wizard%d" % rng.randrange(9), "content": "hi"}],
                           [{"role": "user", "content": val()} if rng.random() < 0.5 else {"role": "user"}],
                           [{"role": "user", "content": [{"type": "audio", "x": val()}]}], "hi"])
        if isinstance(msgs, list) and msgs and isinstance(msgs[0], dict) and \
                isinstance(msgs[0].get("content"), (str, list)) and msgs[0].get("role") == "user":
            msgs = 7  # (val() gave a string or a list, [] say: not a wrong shape after all)
        return json.dumps(unknown({"messages": msgs, "max_tokens": 2})).encode()
    field, bad = rng.choice([("temperature", "hot"), ("top_p", [1]), ("top_k", {"a": 1}), ("min_p", "0.1"),
                             ("seed", "s"), ("max_tokens", 1.5), ("max_tokens", "many"), ("stop", 5),
                             ("stop", [""]), ("stop", [1, 2]), ("n", 2), ("stream", "yes"), ("presence_penalty", "p"),
                             ("frequency_penalty", [0]), ("repeat_penalty", "r"), ("ignore_eos", 1),
                             ("max_completion_tokens", "m"), ("cache_prompt", "no")])
    o = unknown({field: bad, "max_tokens": 2})
    if field == "max_tokens":
        o[field] = bad
    if kind == 5:
        o["prompt"] = rng.choice(["x", val()]) if rng.random() < 0.5 else None
        return ("C", json.dumps(o).encode())  # to /v1/completions
    o["messages"] = good_msgs
    t = json.dumps(o).encode()
    if kind == 7:  # invalid UTF-8 in the text (the wrong field still makes it a 400)
        t = t.replace(b'"hi"', b'"h\xff\xfei"')
    return t


def t_random_bodies(name):
    # 10,000 requests with random bodies (random_body: each must be refused): each answer a 4xx with
    # OpenAI's error object of the same code, no crash, /health afterwards, every one counted an error
    import random
    rng = random.Random(17)
    before = int(metrics()["nanomind_errors_total"])
    bad, codes, conn = [], {}, None
    for i in range(10000):
        b = random_body(rng)
        path = "/v1/chat/completions"
        if isinstance(b, tuple):
            path, b = "/v1/completions", b[1]
        for attempt in range(2):  # (a connection the server closed after an error is opened again)
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                conn.request("POST", path, body=b, headers={"Authorization": "Bearer " + KEY,
                                                            "Content-Type": "application/json"})
                r = conn.getresponse()
                data = r.read()
                break
            except (http.client.HTTPException, OSError):
                conn.close()
                conn = None
                if attempt:
                    raise
        if r.will_close:
            conn.close()
            conn = None
        code, msg, _ = err_of(data)
        codes[r.status] = codes.get(r.status, 0) + 1
        if not 400 <= r.status < 500 or code != r.status or not msg:
            bad.append((i, r.status, b[:80], data[:120]))
    if conn:
        conn.close()
    st, _ = raw(port, "GET", "/health")
    errors = int(metrics()["nanomind_errors_total"]) - before
    result(name, not bad and st == 200 and errors == 10000, "%d bad (first %s); codes %s; health %s; %d errors counted"
           % (len(bad), bad[:3], codes, st, errors))


def t_copied(name):
    # the bytes copied between the pipeline and the server are the answer's text, out of its events into the
    # request's box, never the prompt (tokenized straight into the decoder's slot) nor the parameters (made in
    # the decoder's slot): a 300-word prompt copies its answer's bytes, as a one-word one does
    deltas = []
    for prompt in ("hi", "word " * 300):
        before = int(metrics()["nanomind_bytes_copied_total"])
        st, data = raw(port, "POST", "/v1/completions", json.dumps({"prompt": prompt, "max_tokens": 3, "seed": 7}).encode())
        text = json.loads(data)["choices"][0]["text"] if st == 200 else ""
        deltas.append((st, int(metrics()["nanomind_bytes_copied_total"]) - before, len(text.encode())))
    result(name, all(st == 200 and 0 < d == n for st, d, n in deltas), deltas)


def t_body_limits(name):
    # --max-body 4096: a body of exactly 4096 bytes is read whole; a chunked one (no Content-Length) over it is 413
    body = b'{"prompt": "hi", "max_tokens": 1}'
    body += b" " * (4096 - len(body))
    st_exact, data_exact = raw(port, "POST", "/v1/completions", body)
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v1/completions", body=iter([b'{"prompt": "' + b"x" * 3000, b"y" * 3000 + b'"}']),
              headers={"Authorization": "Bearer " + KEY, "Content-Type": "application/json"}, encode_chunked=True)
    r = c.getresponse()
    st_chunked, data_chunked = r.status, r.read()
    c.close()
    result(name, st_exact == 200 and st_chunked == 413 and err_of(data_chunked)[0] == 413,
           "exact: %s %r; chunked: %s %r" % (st_exact, data_exact[:100], st_chunked, data_chunked[:100]))


def drip_body(sport_, head, first, timeout=10.0):
    """Sends a request's header and the first bytes of its body, then a byte every 0.25 s of the rest
    (never all of it): (seconds until the server answered, its reply) or (None, what came)."""
    s = socket.create_connection(("127.0.0.1", sport_), timeout=timeout)
    t0 = time.time()
    s.sendall(head + first)
    s.settimeout(0.25)
    got = b""
    while time.time() - t0 < timeout:
        try:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
            if b"\r\n\r\n" in got and got.rstrip().endswith(b"}"):
                break
        except socket.timeout:
            try:
                s.sendall(b"x")
            except OSError:
                break
    took = time.time() - t0
    s.close()
    return (took if got.startswith(b"HTTP/1.1 408") else None), got


def t_slow_body(name):
    # --body-timeout 2: a body dripped a byte every 0.25 s (each byte restarts civetweb's own wait) is cut at
    # 2 s with a 408 naming the flag; the server answers the next request
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + KEY.encode() +
            b"\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
    took, got = drip_body(port, head, b'{"prompt": "')
    body = got.split(b"\r\n\r\n", 1)[-1]
    st, data = raw(port, "POST", "/v1/completions", b'{"prompt": "hi", "max_tokens": 1}')
    result(name, took is not None and 1.9 < took < 5 and b"--body-timeout" in body and err_of(body)[0] == 408 and st == 200,
           "408 after %s s: %r; next request %s" % (took, got[:300], st))


def read_to_end(socks, until):
    """Reads each socket until the server ends it or `until` (time.time()) passes: {socket: (seconds from the
    call to its end or None, bytes)}."""
    import select
    t0, got, end = time.time(), {s: b"" for s in socks}, {}
    open_ = list(socks)
    while open_ and time.time() < until:
        ready, _, _ = select.select(open_, [], [], max(0.0, min(0.5, until - time.time())))
        for s in ready:
            try:
                chunk = s.recv(65536)
            except OSError:
                chunk = b""
            if chunk:
                got[s] += chunk
            else:
                end[s] = time.time() - t0
                open_.remove(s)
    return {s: (end.get(s), got[s]) for s in socks}


def t_idle_connections(name):
    # 100 connections that send nothing and 8 that send half a header, more than the HTTP threads the server
    # had (64, each held for --timeout, 600 s): /health and a small completion answer at once all the same,
    # and the server ends each of them by --idle-timeout (default 10 s)
    socks = []
    try:
        t0 = time.time()
        for i in range(108):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            if i >= 100:
                s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            socks.append(s)
        time.sleep(0.5)
        t1 = time.time()
        st_h, _ = raw(port, "GET", "/health", timeout=5)
        t_health = time.time() - t1
        t1 = time.time()
        st_c, _ = raw(port, "POST", "/v1/completions", json.dumps({"prompt": "hi", "max_tokens": 4}).encode(), timeout=20)
        t_comp = time.time() - t1
        ends = read_to_end(socks, t0 + 16)
        left = sum(1 for e, _ in ends.values() if e is None)
        result(name, st_h == 200 and t_health < 2 and st_c == 200 and t_comp < 10 and left == 0,
               "/health %s in %.2f s, completion %s in %.2f s, %d of 108 still open 16 s on"
               % (st_h, t_health, st_c, t_comp, left))
    finally:
        for s in socks:
            s.close()


def t_error_reply_closes(name):
    # a 413 for a declared 100 MB that never comes: the reply at once, with Connection: close, and the
    # connection ended (it waited for the body before, holding its thread)
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + KEY.encode() +
                  b"\r\nContent-Type: application/json\r\nContent-Length: 100000000\r\n\r\n")
        end, got = read_to_end([s], time.time() + 5)[s]
    finally:
        s.close()
    head = got.split(b"\r\n\r\n", 1)[0].lower()
    result(name, got.startswith(b"HTTP/1.1 413") and b"connection: close" in head and end is not None and end < 2,
           "ended after %s s: %r" % (end, got[:300]))


def t_prompt_too_long(name):
    st, data = raw(port, "POST", "/v1/completions", json.dumps({"prompt": "word " * 700}).encode())
    result(name, st == 400 and "does not fit the context" in err_of(data)[1], (st, data[:200]))


def metrics():
    st, data = raw(port, "GET", "/metrics")
    return dict(l.rsplit(" ", 1) for l in data.decode().splitlines() if l and not l.startswith("#"))


LE = ["0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "30", "60"]


def hist_one_more(m0, m1, name, wall):
    """The histogram `name` took one observation between the /metrics dicts m0 and m1: its count, +Inf
    and sum moved by one and by the observation (at most `wall`, the client's own time), and exactly the
    buckets whose bound holds it moved, by one. Returns a reason when not."""
    g = lambda m, k: float(m.get(name + k, "nan"))
    obs = g(m1, "_sum") - g(m0, "_sum")
    if g(m1, "_count") - g(m0, "_count") != 1 or g(m1, '_bucket{le="+Inf"}') - g(m0, '_bucket{le="+Inf"}') != 1:
        return "%s: count %s -> %s" % (name, m0.get(name + "_count"), m1.get(name + "_count"))
    if not 0 < obs <= wall + 1e-3:
        return "%s: observed %.4f s, the client saw %.4f s" % (name, obs, wall)
    for le in LE:
        d = g(m1, '_bucket{le="%s"}' % le) - g(m0, '_bucket{le="%s"}' % le)
        if d != (1 if obs <= float(le) else 0):
            return "%s: bucket le=%s moved by %s for %.4f s" % (name, le, d, obs)
    return None


def t_latency_histograms(name):
    m0 = metrics()
    t = time.time()
    r = client.chat.completions.create(model="x", messages=[{"role": "user", "content": Q}], max_tokens=8)
    wall = time.time() - t
    m1 = metrics()
    why = [w for w in (hist_one_more(m0, m1, "nanomind_request_seconds", wall),
                       hist_one_more(m0, m1, "nanomind_first_token_seconds", wall)) if w]
    # the first token comes before the last byte
    ttft = float(m1["nanomind_first_token_seconds_sum"]) - float(m0["nanomind_first_token_seconds_sum"])
    total = float(m1["nanomind_request_seconds_sum"]) - float(m0["nanomind_request_seconds_sum"])
    result(name, not why and r.choices[0].message.content and ttft <= total, "%s; ttft %.4f total %.4f" % (why, ttft, total))


def t_disconnect_whole_answer(name):
    # a request for a whole (not streamed) answer of up to the context (~500 tokens), its client gone as soon
    # as it is sent: the server sees the socket closed at the first token and the decoder stops there
    before = int(metrics()["nanomind_tokens_predicted_total"])
    s = socket.create_connection(("127.0.0.1", port))
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 4000, "ignore_eos": True,
                       "temperature": 0}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + KEY.encode() +
              b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    s.close()
    for _ in range(600):  # --queue 0: 429 while the decoder still serves it
        st, data = raw(port, "POST", "/v1/completions", b'{"prompt": "hi", "max_tokens": 2, "temperature": 0}')
        if st != 429:
            break
        time.sleep(0.1)
    decoded = int(metrics()["nanomind_tokens_predicted_total"]) - before - 2
    result(name, st == 200 and 0 <= decoded < 100, "next %s, %d tokens decoded for the closed request" % (st, decoded))


def t_disconnect_and_busy(name):
    # a long stream (until the 512-position context is full: ~480 tokens); while it runs a second request
    # is refused (--queue 0: 429); the first client then goes away mid-stream and the decoder stops it: far
    # fewer tokens are decoded than the context allows, and the next request is answered
    before = int(metrics()["nanomind_tokens_predicted_total"])
    s = socket.create_connection(("127.0.0.1", port))
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 4000, "ignore_eos": True, "stream": True,
                       "temperature": 0}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + KEY.encode() +
              b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    while got.count(b"data: ") < 3:
        chunk = s.recv(4096)
        if not chunk:
            break
        got += chunk
    st, data = raw(port, "POST", "/v1/completions", b'{"prompt": "hi", "max_tokens": 2}')
    busy = st == 429 and err_of(data)[0] == 429
    s.close()
    t0 = time.time()
    for _ in range(100):  # the server notices at its next write; the decoder stops at its next token
        st, data = raw(port, "POST", "/v1/completions", b'{"prompt": "hi", "max_tokens": 2, "temperature": 0}')
        if st != 429:
            break
        time.sleep(0.1)
    took = time.time() - t0
    m = metrics()
    decoded = int(m["nanomind_tokens_predicted_total"]) - before - 2
    result(name, b"200 OK" in got and busy and st == 200 and 3 <= decoded < 150 and int(m["nanomind_rejected_total"]) >= 1,
           "stream %r, busy %s, next %s after %.1f s, %d tokens decoded for the stream, metrics %s"
           % (got[:60], busy, st, took, decoded, m))


def t_metrics_energy(name):
    # the modelled energy: what `nanomind power energy` gives for the CPU time, uptime and DRAM traffic it reports;
    # a request adds traffic (its estimate) and energy
    m0 = metrics()
    st, _ = raw(port, "POST", "/v1/completions", b'{"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}')
    m = metrics()
    key = 'nanomind_energy_joules_total{energy="modelled"}'
    j, cpu, wall, dram = (float(m[k]) for k in (key, "nanomind_cpu_seconds_total", "nanomind_uptime_seconds",
                                                  "nanomind_dram_bytes_total"))
    out = subprocess.run([NM, "power", "energy", "--cpu-s", repr(cpu), "--wall-s", repr(wall), "--bytes", repr(dram)],
                         capture_output=True, text=True).stdout
    want = float(re.match(r"modelled: ([0-9.]+) J", out).group(1))
    grew = dram > float(m0["nanomind_dram_bytes_total"]) + 1e6 and j > float(m0[key])
    result(name, st == 200 and grew and abs(j - want) <= 0.002 + 1e-4 * want,
           "status %s, %.4f J against power energy's %.4f (%s), before %s" % (st, j, want, out.strip(), m0))


def t_metrics_measured(name):
    # each meter's joules since the start: the counter's movement, the power input integrated over the uptime
    with open(os.path.join(SYSFS, "class/powercap/intel-rapl:0/energy_uj"), "w") as f:
        f.write("7500000\n")  # 2.5 J more
    m = metrics()
    rapl = float(m.get('nanomind_energy_joules_total{energy="measured",meter="rapl:package-0"}', "nan"))
    hw = float(m.get('nanomind_energy_joules_total{energy="measured",meter="hwmon:acpi \\"power\\":power1_input"}', "nan"))
    up = float(m["nanomind_uptime_seconds"])
    result(name, abs(rapl - 2.5) < 1e-6 and abs(hw - 3.0 * up) < 0.5,
           "rapl %.4f J (want 2.5), hwmon %.3f J over %.2f s (want ~%.3f)" % (rapl, hw, up, 3.0 * up))


def t_stt_absent(name):  # the first server has no --stt and no --tts: 404, naming the flag
    st, data = raw(port0, "POST", "/v1/audio/transcriptions", b"x", {"Content-Type": "multipart/form-data; boundary=b"})
    st2, data2 = raw(port0, "POST", "/v1/audio/speech", b'{"input": "hi"}')
    result(name, st == 404 and "--stt" in err_of(data)[1] and st2 == 404 and "--tts" in err_of(data2)[1],
           (st, data[:200], st2, data2[:200]))


def image_part(data, mime="image/x-portable-pixmap"):
    import base64
    return {"type": "image_url", "image_url": {"url": "data:%s;base64,%s" % (mime, base64.b64encode(data).decode())}}


def t_image_absent(name):  # the first server has no --mmproj: 400, naming the flag
    st, data = raw(port, "POST", "/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": [
        image_part(b"P6\n1 1\n255\n\0\0\0"), {"type": "text", "text": "hi"}]}]}))
    c, msg, _ = err_of(data)
    result(name, st == 400 and "--mmproj" in str(msg), "%s %s" % (st, msg))



# Five chats (a system prompt of more than one 64-position chunk, two of them a second turn that carries the
# first answer) at temperature 0, and one at temperature 1 with a seed: each asked with cache_prompt false,
# then twice with it true (the first may reuse another chat's prefix, the second its own whole prompt): the
# same text each time, as llama-server gives. A cached prefix is reused only up to a chunk boundary that a
# fresh prompt's decode also has, so the logits are those of recomputing it, to the bit.
SYS = ("You are a helpful assistant that lives on a small battery-powered device. You answer in short, plain "
       "sentences. You never make up facts; when you do not know, you say so. You like geography, cooking, "
       "astronomy and the history of small inventions. The person you talk to is busy: lead with the answer, "
       "then give one or two details that help. Use metric units, and give temperatures in degrees Celsius. "
       "When a question has several parts, answer each part in order. When a question is about safety, such as "
       "cooking meat, electricity or climbing, give the safe way first. You may be asked about the sky at "
       "night: name the planets, stars and constellations by their common English names. You may be asked "
       "about recipes: give quantities for two people unless told otherwise. Keep every answer under one "
       "hundred words, and never use tables or lists of more than five items.")


def t_cache_answers_equal_fresh(name):
    # (NM_SANITIZED: the first two, with and without a seed: the cache's paths, a third of the decodes)
    chats = [[{"role": "user", "content": "Name three planets and one fact about each."}],
             [{"role": "user", "content": "How do I boil an egg?"}],
             [{"role": "user", "content": "What is the capital of Italy?"},
              {"role": "assistant", "content": "The capital of Italy is Rome."},
              {"role": "user", "content": "And what river runs through it?"}],
             [{"role": "user", "content": "Tell me about the paper clip."}],
             [{"role": "user", "content": "Who invented the telescope?"},
              {"role": "assistant", "content": "Hans Lipperhey applied for a patent on a telescope in 1608."},
              {"role": "user", "content": "What did Galileo see with his?"}]]
    bad = []
    for i, msgs in enumerate(chats[:2] if SANITIZED else chats):
        msgs = [{"role": "system", "content": SYS}] + msgs
        for extra in ({"temperature": 0}, {"temperature": 1.0, "seed": 42 + i}):
            if i > 1 and "seed" in extra:
                continue
            texts = []
            for cache in (False, True, True):
                r = client.chat.completions.create(model="x", messages=msgs, max_tokens=48,
                                                   extra_body={"cache_prompt": cache}, **extra)
                texts.append(r.choices[0].message.content)
                n_prompt = r.usage.prompt_tokens
            if len(set(texts)) != 1:
                bad.append("chat %d %s: %r" % (i, extra, texts))
            if n_prompt < 128 + 16:  # so the cache has a whole 128-position chunk to give
                bad.append("chat %d: only %d prompt tokens" % (i, n_prompt))
    result(name, not bad, "; ".join(bad)[:600])


# What the official client sends for tools, JSON output and log-probabilities: not served yet, so a 400
# naming the field (before, 200 with free text and logprobs None). `created` is each answer's time.
def t_unserved_fields(name):
    msgs = [{"role": "user", "content": Q}]
    asks = [("tools", {"tools": [{"type": "function", "function": {"name": "get_time", "parameters": {
                 "type": "object", "properties": {}}}}]}),
            ("response_format", {"response_format": {"type": "json_object"}}),
            ("response_format", {"response_format": {"type": "json_schema", "json_schema": {
                 "name": "a", "schema": {"type": "object"}}}}),
            ("logprobs", {"logprobs": True, "top_logprobs": 2})]
    bad = []
    for field, kw in asks:
        try:
            client.chat.completions.create(model="x", messages=msgs, max_tokens=4, **kw)
            bad.append("%s: answered" % field)
        except openai.BadRequestError as e:
            if e.status_code != 400 or field not in str(e):
                bad.append("%s: %s" % (field, e))
    try:
        client.completions.create(model="x", prompt="Hi", max_tokens=4, logprobs=2)
        bad.append("completions logprobs: answered")
    except openai.BadRequestError as e:
        if "logprobs" not in str(e):
            bad.append("completions logprobs: %s" % e)
    r1 = client.chat.completions.create(model="x", messages=msgs, max_tokens=2, temperature=0)
    time.sleep(1.1)
    t = time.time()
    r2 = client.chat.completions.create(model="x", messages=msgs, max_tokens=2, temperature=0)
    if not (r2.created > r1.created and abs(r2.created - t) <= 2):
        bad.append("created %d then %d (now %d)" % (r1.created, r2.created, t))
    result(name, not bad, "; ".join(bad))


port0 = port
for n, f in [("unserved_fields_400_created_now", t_unserved_fields), ("cache_answers_equal_fresh", t_cache_answers_equal_fresh), ("models", t_models), ("stt_absent_404", t_stt_absent), ("image_without_mmproj_400", t_image_absent), ("metrics_energy", t_metrics_energy), ("metrics_measured_energy", t_metrics_measured), ("chat_equals_run", t_chat), ("chat_stream_equals_run", t_chat_stream),
             ("completion_equals_run", t_completion), ("stop_string", t_stop), ("invalid_key", t_bad_key),
             ("bad_requests_4xx_then_healthy", t_bad_requests), ("no_cors_host_checked_json_only", t_cors_host_content_type), ("two_content_lengths_400", t_two_content_lengths), ("prompt_too_long", t_prompt_too_long), ("body_limits", t_body_limits), ("slow_body_408", t_slow_body), ("copied_answer_not_prompt", t_copied),
             ("idle_connections_do_not_starve", t_idle_connections), ("error_reply_closes_413", t_error_reply_closes),
             ("disconnect_cancels_and_queue_full_429", t_disconnect_and_busy), ("disconnect_cancels_whole_answer", t_disconnect_whole_answer), ("latency_histograms", t_latency_histograms),
             ("random_bodies_10000_each_4xx", t_random_bodies)]:
    case(n, f)
rc, err = stop(p)
if wanted("sigterm_exits_0"):
    result("sigterm_exits_0", rc == 0, "exit %s: %s" % (rc, err[-300:]))


# SIGTERM with a request in flight: the answer is finished, then the server exits 0
def t_sigterm_in_flight(name):
    p2, port2 = start()
    out = {}

    def ask():
        st, data = raw(port2, "POST", "/v1/completions",
                       json.dumps({"prompt": "Once upon a time", "max_tokens": 1000, "ignore_eos": True,
                                   "temperature": 0}).encode(), timeout=LONG_S)
        out["st"], out["data"] = st, data

    th = threading.Thread(target=ask)
    th.start()
    time.sleep(0.5)  # (1000 tokens take seconds: it is in flight)
    rc2, _ = stop(p2, LONG_S)
    th.join(LONG_S)
    n = json.loads(out.get("data", b"{}") or b"{}").get("usage", {}).get("completion_tokens")
    result(name, rc2 == 0 and out.get("st") == 200 and n == 1000, "exit %s, status %s, %s tokens" % (rc2, out.get("st"), n))


case("sigterm_finishes_the_request_in_flight", t_sigterm_in_flight)


# --idle-timeout 2: a header dripped a byte every 0.3 s is cut at 2 s; a keep-alive connection idle 0.5 s is
# closed; a generation of many seconds (the connection silent meanwhile) is not cut
def t_idle_timeout(name):
    p5, port5 = start("--idle-timeout", "2")
    try:
        s = socket.create_connection(("127.0.0.1", port5), timeout=10)
        t0 = time.time()
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        s.settimeout(0.3)
        cut = None
        while time.time() - t0 < 8:
            try:
                if not s.recv(4096):
                    cut = time.time() - t0
                    break
            except socket.timeout:
                try:
                    s.sendall(b"X")
                except OSError:
                    cut = time.time() - t0
                    break
            except OSError:
                cut = time.time() - t0
                break
        s.close()
        c = http.client.HTTPConnection("127.0.0.1", port5, timeout=10)
        c.request("GET", "/health")
        c.getresponse().read()
        end, _ = read_to_end([c.sock], time.time() + 4)[c.sock]
        c.close()
        t1 = time.time()
        st, data = raw(port5, "POST", "/v1/completions", json.dumps({"prompt": "Once upon a time", "max_tokens": 1000,
                                                                     "ignore_eos": True, "temperature": 0}).encode(),
                       timeout=LONG_S)
        took = time.time() - t1
        n = json.loads(data).get("usage", {}).get("completion_tokens") if st == 200 else None
    finally:
        stop(p5)
    result(name, cut is not None and 1.5 < cut < 4 and end is not None and end < 2 and st == 200 and n == 1000 and took > 2,
           "dripped header cut after %s s, idle keep-alive closed after %s s, 1000 tokens: %s %s in %.1f s"
           % (cut, end, st, n, took))


case("idle_timeout_cuts_headers_not_generation", t_idle_timeout)
# chat_template_kwargs (issue 48): a server rendering Qwen3's own template (tests/data/jinja/qwen3.jinja) with
# --chat-template-kwargs '{"enable_thinking": false}': its chats end in the empty <think> block (19 prompt
# tokens of SmolLM2's vocabulary for "hi"); a request's {"enable_thinking": true} goes over it (10); one that
# is not an object, or names messages, is a 400 naming chat_template_kwargs


def t_chat_template_kwargs(name):
    tpl = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tests", "data",
                       "jinja", "qwen3.jinja")
    pk, kport = start("--chat-template-file", tpl, "--chat-template-kwargs", '{"enable_thinking": false}')
    got = []
    try:
        for kw in (None, {"enable_thinking": True}, [1], {"messages": []}):
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "temperature": 0}
            if kw is not None:
                body["chat_template_kwargs"] = kw
            st, data = raw(kport, "POST", "/v1/chat/completions", json.dumps(body).encode())
            j = json.loads(data)
            got.append((st, j.get("usage", {}).get("prompt_tokens") if st == 200 else err_of(data)))
    finally:
        stop(pk)
    ok = (len(got) == 4 and got[0] == (200, 19) and got[1] == (200, 10) and got[2][0] == 400 and got[3][0] == 400 and
          all(g[1] and g[1][2] == "chat_template_kwargs" for g in got[2:]))
    result(name, ok, str(got))


case("chat_template_kwargs_default_and_request", t_chat_template_kwargs)
# The thinking out of the content (--reasoning-format, issue 48): a model whose greedy answer to any chat is
# "<think>Plan it.</think>Done!" (nm-genmodel --script, <think> and </think> user-defined tokens, as Qwen3's
# vocabulary has them): message.reasoning_content "Plan it.", content "Done!"; streamed, the deltas'
# reasoning_content and content join to the same; with --reasoning-format none all of it is content


def t_reasoning_split(name):
    import tempfile
    path = os.path.join(tempfile.gettempdir(), "nm-think-%d.gguf" % os.getpid())
    gen = subprocess.run([os.path.join(os.path.dirname(NM), "nm-genmodel"), "--arch", "qwen3", "--tokenizer-from", M,
                          "-o", path, "--layers", "1", "--embd", "256", "--heads", "4", "--kv-heads", "2", "--ff", "256",
                          "--user-tokens", "<think>,</think>", "--script", "<think>Plan it.</think>Done!", "--seed", "9"],
                         capture_output=True, text=True)
    # a second model answers "<" alone: what may have begun <think> comes out as content at the end
    path2 = path.replace(".gguf", "-lt.gguf")
    gen2 = subprocess.run([os.path.join(os.path.dirname(NM), "nm-genmodel"), "--arch", "llama", "--tokenizer-from", M,
                           "-o", path2, "--layers", "1", "--embd", "256", "--script", "<", "--seed", "9"],
                          capture_output=True, text=True)
    got = []
    try:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 20, "temperature": 0}
        pr, rport = start(model=path2)
        try:
            st, data = raw(rport, "POST", "/v1/chat/completions", json.dumps(body).encode())
            msg = json.loads(data)["choices"][0]["message"] if st == 200 else {}
            got.append(("auto", "<", msg.get("reasoning_content"), msg.get("content")))
        finally:
            stop(pr)
        for fmt in ("auto", "none"):
            pr, rport = start("--reasoning-format", fmt, model=path)
            try:
                st, data = raw(rport, "POST", "/v1/chat/completions", json.dumps(body).encode())
                msg = json.loads(data)["choices"][0]["message"] if st == 200 else {}
                got.append((fmt, "whole", msg.get("reasoning_content"), msg.get("content")))
                st, data = raw(rport, "POST", "/v1/chat/completions", json.dumps(dict(body, stream=True)).encode())
                r = c = ""
                for line in data.decode().splitlines():
                    if line.startswith("data: {"):
                        d = json.loads(line[6:])["choices"]
                        delta = d[0].get("delta", {}) if d else {}
                        r += delta.get("reasoning_content", "")
                        c += delta.get("content", "")
                got.append((fmt, "stream", r or None, c))
            finally:
                stop(pr)
    finally:
        for f in (path, path2):
            if os.path.exists(f):
                os.unlink(f)
    want = [("auto", "<", None, "<"), ("auto", "whole", "Plan it.", "Done!"), ("auto", "stream", "Plan it.", "Done!"),
            ("none", "whole", None, "<think>Plan it.</think>Done!"), ("none", "stream", None, "<think>Plan it.</think>Done!")]
    result(name, gen.returncode == 0 and gen2.returncode == 0 and got == want,
           (gen.stderr + gen2.stderr).strip() or str(got))


case("reasoning_content_out_of_content", t_reasoning_split)
# --api-key-file read whole: 16 keys of 600 bytes (9.6 KB): the last one admits a request, a key not there does not
def t_key_file(name):
    import tempfile
    keys = ["k%02d" % i + "x" * 597 for i in range(16)]
    with tempfile.NamedTemporaryFile("w", suffix=".keys", delete=False) as f:
        f.write("\n".join(keys) + "\n")
    p3, port3 = start("--api-key-file", f.name)
    try:
        got = []
        for k in (keys[-1], keys[0], "k99"):
            c = http.client.HTTPConnection("127.0.0.1", port3, timeout=60)
            c.request("GET", "/metrics", headers={"Authorization": "Bearer " + k})  # (/v1/models is open)
            r = c.getresponse()
            r.read()
            got.append(r.status)
            c.close()
    finally:
        stop(p3)
        os.unlink(f.name)
    result(name, got == [200, 200, 401], got)


case("api_key_file_read_whole", t_key_file)


# A key list with no key in it is a start-up error, not a server open to anyone (issue 45, item 14)
def t_keyless_refused(name):
    import tempfile
    bad = []
    with tempfile.TemporaryDirectory(prefix="nm-test-keys-") as d:
        ws, empty = os.path.join(d, "ws.keys"), os.path.join(d, "empty.keys")
        with open(ws, "w") as f:
            f.write("  \n\t\n , \r\n")
        open(empty, "w").close()
        for args in (["--api-key", ","], ["--api-key", " "], ["--api-key", " ,"], ["--api-key-file", ws],
                     ["--api-key", KEY, "--api-key-file", empty], ["--api-key", KEY, "--api-key", ", ,"]):
            try:
                st = subprocess.run([NM, "serve", "-m", M, "--port", str(free_port()), *args], capture_output=True,
                                    text=True, timeout=20)
                if st.returncode == 0 or "holds no key" not in st.stderr:
                    bad.append("%s: exit %d, %s" % (args, st.returncode, st.stderr[-200:]))
            except subprocess.TimeoutExpired:
                bad.append("%s: the server started" % args)
    # blanks around a key are not part of it; a list with empties between keys keeps its keys
    p6, port6 = start("--api-key", " k1 ,, k2\t")
    try:
        got = []
        for k in ("k1", "k2", "k", "k1 ", "k12", ""):
            c = http.client.HTTPConnection("127.0.0.1", port6, timeout=60)
            c.request("GET", "/metrics", headers={"Authorization": "Bearer " + k})
            r = c.getresponse()
            r.read()
            got.append(r.status)
            c.close()
    finally:
        stop(p6)
    result(name, not bad and got == [200, 200, 401, 401, 401, 401], "%s; keys %s" % (bad, got))


case("api_key_list_without_a_key_refused", t_keyless_refused)
# ---- speech to text: POST /v1/audio/transcriptions with --stt ---------------------------------
W = os.path.join(MODELS, "whisper-tiny.en.gguf")
SPEECH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "speech")
WAV, OGG = os.path.join(SPEECH, "tts_16k.wav"), os.path.join(SPEECH, "tts_long.ogg")


def transcribe_cli(path, *extra):  # `nanomind transcribe`'s stdout for the same file
    return subprocess.run([NM, "transcribe", "-m", W, "-t", "2", path, *extra], capture_output=True, text=True,
                          timeout=300).stdout


def t_transcription(name):
    with open(WAV, "rb") as f:
        r = sclient.audio.transcriptions.create(model="whisper-1", file=f)
    want = transcribe_cli(WAV, "-nt").strip()
    with open(os.path.join(SPEECH, "expected", "tts_16k.nt.txt")) as f:
        stored = f.read().strip()  # whisper-cli's text for this file
    result(name, r.text == want == stored, "%r; transcribe: %r; whisper-cli: %r" % (r.text, want, stored))


def t_transcription_words(name):
    # timestamp_granularities[]=word: the words and times that `transcribe -ml 1 -sow` (whisper.cpp's token
    # timestamps, a segment a word) gives the same file, in verbose_json only
    with open(WAV, "rb") as f:
        vj = sclient.audio.transcriptions.create(model="whisper-1", file=f, response_format="verbose_json",
                                                 timestamp_granularities=["word", "segment"])
    want = []
    for line in transcribe_cli(WAV, "-ml", "1", "-sow", "--timestamps").splitlines():
        m = re.match(r"\[(\d\d):(\d\d):(\d\d\.\d+) --> (\d\d):(\d\d):(\d\d\.\d+)\]\s*(.*)$", line)
        if m and m.group(7).strip():
            want.append((m.group(7).strip(), round(int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3)), 2)))
    words = [(w.word, round(w.start, 2)) for w in (vj.words or [])]
    ends_ok = all(w.start <= w.end for w in vj.words or []) and all(
        a.end <= b.start + 1e-9 for a, b in zip(vj.words or [], (vj.words or [])[1:]))
    st, data = raw(sport, "POST", "/v1/audio/transcriptions",
                   *multipart([("file", open(WAV, "rb").read(), "a.wav"), ("timestamp_granularities[]", b"word", None)]))
    code, msg, param = err_of(data)
    result(name, len(words) >= 10 and words == want and ends_ok and " ".join(w for w, _ in words) == vj.text.strip() and
           st == 400 and param == "timestamp_granularities[]" and "verbose_json" in msg,
           "words %s; transcribe -ml 1 -sow %s; text %r; json: %s %s" % (words, want, vj.text, st, msg))


def t_transcription_formats(name):
    with open(OGG, "rb") as f:  # 33 s of Ogg Vorbis: two windows, several segments
        srt = sclient.audio.transcriptions.create(model="whisper-1", file=f, response_format="srt")
    with open(OGG, "rb") as f:
        vtt = sclient.audio.transcriptions.create(model="whisper-1", file=f, response_format="vtt")
    with open(OGG, "rb") as f:
        txt = sclient.audio.transcriptions.create(model="whisper-1", file=f, response_format="text")
    with open(OGG, "rb") as f:
        vj = sclient.audio.transcriptions.create(model="whisper-1", file=f, response_format="verbose_json",
                                                 timestamp_granularities=["segment"])
    want_srt = transcribe_cli(OGG, "--print-srt")
    want_txt = " ".join(transcribe_cli(OGG, "-nt").split("\n")).strip()
    segs = vj.segments or []
    ok = (srt == want_srt and vtt.startswith("WEBVTT\n\n00:00:00.000 --> ") and vtt.count(" --> ") == srt.count(" --> ")
          and txt.strip() == want_txt and vj.language == "en" and abs(vj.duration - 32.9) < 0.5 and len(segs) >= 3
          and segs[0].start == 0.0 and all(a.end <= b.start + 1e-9 for a, b in zip(segs, segs[1:]))
          and segs[-1].end <= vj.duration + 0.5)
    result(name, ok, "srt %r against %r; text %r against %r; verbose %s" % (srt[:80], want_srt[:80], txt[:60],
                                                                         want_txt[:60], str(vj)[:200]))


def t_transcription_streamed(name):
    # stream=true through the official client: a delta event a segment as Whisper ends it, then the whole text,
    # the same as the unstreamed answer (json and text decode without timestamps, as whisper-cli -nt: a segment
    # is a 30 s window)
    with open(OGG, "rb") as f:  # 33 s: two windows
        events = list(sclient.audio.transcriptions.create(model="whisper-1", file=f, stream=True))
    with open(OGG, "rb") as f:
        whole = sclient.audio.transcriptions.create(model="whisper-1", file=f).text
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    done = [e.text for e in events if e.type == "transcript.text.done"]
    ok = (len(deltas) >= 2 and len(done) == 1 and events[-1].type == "transcript.text.done" and done[0] == whole
          and " ".join(d.strip() for d in deltas) == whole)
    result(name, ok, "%d deltas %r, done %r, unstreamed %r" % (len(deltas), deltas[:3], done, whole[:80]))


def multipart(fields, boundary="nmtestboundary"):
    out = b""
    for k, v, fn in fields:
        out += b"--" + boundary.encode() + b"\r\n"
        out += b'Content-Disposition: form-data; name="' + k.encode() + b'"'
        if fn:
            out += b'; filename="' + fn.encode() + b'"\r\nContent-Type: application/octet-stream'
        out += b"\r\n\r\n" + v + b"\r\n"
    return out + b"--" + boundary.encode() + b"--\r\n", {"Content-Type": "multipart/form-data; boundary=" + boundary}


def t_transcription_bad_requests(name):
    wav = open(WAV, "rb").read()
    cases = [
        (multipart([("model", b"whisper-1", None)]), 400, "file"),
        (multipart([("file", wav, "a.wav"), ("stream", b"maybe", None)]), 400, "stream"),
        (multipart([("file", wav, "a.wav"), ("stream", b"true", None), ("response_format", b"srt", None)]), 400, "stream"),
        (multipart([("file", b"", "a.wav")]), 400, "file"),
        (multipart([("file", b"RIFF....not audio at all" * 20, "a.wav")]), 400, "file"),
        (multipart([("file", wav, "a.wav"), ("response_format", b"xml", None)]), 400, "response_format"),
        (multipart([("file", wav, "a.wav"), ("temperature", b"hot", None)]), 400, "temperature"),
        (multipart([("file", wav, "a.wav"), ("temperature", b"1.5", None)]), 400, "temperature"),
        (multipart([("file", wav, "a.wav"), ("language", b"xx", None)]), 400, "language"),
        (multipart([("file", wav, "a.wav"), ("language", b"de", None)]), 400, "language"),  # an English-only model
        (multipart([("file", wav, "a.wav"), ("timestamp_granularities[]", b"word", None)]), 400,
         "timestamp_granularities[]"),
        (multipart([("file", wav, "a.wav"), ("response_format", b"verbose_json", None),
                    ("timestamp_granularities[]", b"sentence", None)]), 400, "timestamp_granularities[]"),
        (multipart([("file", wav, "a.wav"), ("prompt", b"p" * 9000, None)]), 400, "prompt"),
        ((b'{"file": "x"}', {"Content-Type": "application/json"}), 400, "file"),
    ]
    bad = []
    for (body, headers), want, param in cases:
        st, data = raw(sport, "POST", "/v1/audio/transcriptions", body, headers)
        code, msg, got_param = err_of(data)
        if st != want or code != want or got_param != param:
            bad.append("%r: %s %s %s" % (body[:60], st, msg, got_param))
    # the audio limit (--max-audio 60): 70 s of silence is refused, named; translation needs a multilingual model
    import io
    import wave
    b = io.BytesIO()
    with wave.open(b, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000), w.writeframes(b"\0\0" * 16000 * 70)
    body, headers = multipart([("file", b.getvalue(), "a.wav")])
    st, data = raw(sport, "POST", "/v1/audio/transcriptions", body, headers)
    if st != 400 or "--max-audio" not in err_of(data)[1]:
        bad.append("long audio: %s %r" % (st, data[:200]))
    body, headers = multipart([("file", wav, "a.wav")])
    st, data = raw(sport, "POST", "/v1/audio/translations", body, headers)
    if st != 400 or "English-only" not in err_of(data)[1]:
        bad.append("translation: %s %r" % (st, data[:200]))
    # and it still serves, through whisper.cpp's route too
    st, data = raw(sport, "POST", "/inference", *multipart([("file", wav, "a.wav"), ("response_format", b"text", None)]))
    result(name, not bad and st == 200 and data.decode().startswith("The quick brown fox"), "; ".join(bad) +
           " then %s %r" % (st, data[:80]))


def t_transcription_slow_body(name):  # the multipart reader under the same deadline
    head = (b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + KEY.encode() +
            b"\r\nContent-Type: multipart/form-data; boundary=nmslow\r\nContent-Length: 100000\r\n\r\n")
    first = b'--nmslow\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\nRIFF'
    took, got = drip_body(sport, head, first)
    body = got.split(b"\r\n\r\n", 1)[-1]
    st, data = raw(sport, "POST", "/v1/audio/transcriptions", *multipart([("file", open(WAV, "rb").read(), "a.wav"),
                                                                        ("response_format", b"text", None)]))
    result(name, took is not None and 1.9 < took < 5 and err_of(body)[0] == 408 and st == 200 and
           data.decode().startswith("The quick brown fox"), "408 after %s s: %r; next %s %r" % (took, got[:300], st, data[:60]))


def t_transcription_metrics(name):
    def m():
        st, data = raw(sport, "GET", "/metrics")
        return dict(l.rsplit(" ", 1) for l in data.decode().splitlines() if l and not l.startswith("#"))
    m0 = m()
    body, headers = multipart([("file", open(WAV, "rb").read(), "a.wav")])
    t = time.time()
    st, _ = raw(sport, "POST", "/v1/audio/transcriptions", body, headers)
    wall = time.time() - t
    m1 = m()
    hist = hist_one_more(m0, m1, "nanomind_transcription_seconds", wall)
    n = int(m1["nanomind_transcriptions_total"]) - int(m0["nanomind_transcriptions_total"])
    secs = float(m1["nanomind_audio_seconds_total"]) - float(m0["nanomind_audio_seconds_total"])
    copied = int(m1["nanomind_bytes_copied_total"]) - int(m0["nanomind_bytes_copied_total"])
    # the decoded PCM goes into the transcriber's slot once: 4 bytes a sample (the file is at 16 kHz), counted
    import wave
    with wave.open(WAV) as w:
        samples = w.getnframes()
    result(name, st == 200 and n == 1 and abs(secs - samples / 16000) < 1e-3 and copied == 4 * samples and not hist,
           "status %s, %d requests, %.3f s, %d bytes copied; %s" % (st, n, secs, copied, hist))


# ---- text to speech: POST /v1/audio/speech with --tts espeak (the same server) ------------------
SAY = "Hello there, this is a test of the speech endpoint."


def say_cli(text, *extra):  # `nanomind say`'s raw samples at 24 kHz
    return subprocess.run([NM, "say", text, "--output-raw", "--sample-rate", "24000", *extra], capture_output=True,
                          timeout=120).stdout


def t_speech(name):
    import struct
    wav = sclient.audio.speech.create(model="tts-1", voice="alloy", input=SAY, response_format="wav").content
    fmt_tag, ch, rate, _, _, bits = struct.unpack("<HHIIHH", wav[20:36])
    pcm = wav[44:]
    want = say_cli(SAY, "--voice", "en-us")
    result(name, wav[:4] == b"RIFF" and wav[36:40] == b"data" and (fmt_tag, ch, rate, bits) == (1, 1, 24000, 16)
           and pcm == want and len(pcm) > 24000,  # the same samples as `say`, over half a second of them
           "%r %s, %d bytes against say's %d" % (wav[:4], (fmt_tag, ch, rate, bits), len(pcm), len(want)))


def t_speech_pcm_voice_speed(name):
    # (the first request of the server is `say`'s to the sample; espeak-ng carries a little state from one
    # utterance to the next in a process - a later one's length moves by up to ~1% - so later ones are compared
    # by length)
    one = sclient.audio.speech.create(model="tts-1", voice="nova", input=SAY, response_format="pcm").content
    two = sclient.audio.speech.create(model="tts-1", voice="nova", input=SAY, response_format="pcm", speed=2.0).content
    alloy = sclient.audio.speech.create(model="tts-1", voice="alloy", input=SAY, response_format="pcm").content
    want = say_cli(SAY, "--voice", "en-us+f3")  # nova: espeak-ng's en-us with the f3 variant
    same_len = abs(len(one) - len(want)) <= 0.03 * len(want)
    result(name, same_len and one[:20000] != alloy[:20000] and 0.35 < len(two) / len(one) < 0.65,
           "%d bytes (say %d), at speed 2: %d" % (len(one), len(want), len(two)))


def t_speech_round_trip(name):  # what the server says, it hears: the words come back
    wav = sclient.audio.speech.create(model="tts-1", voice="alloy", input=SAY, response_format="wav").content
    # (the streamed header's sizes say 0xffffffff; the transcriber reads to the end)
    t = sclient.audio.transcriptions.create(model="whisper-1", file=("speech.wav", wav)).text.lower()
    result(name, "hello there" in t and "test" in t, t)


def t_speech_encoded(name):
    # mp3, opus and flac as OpenAI names them: their own bytes and media type, and what the server says in
    # them it hears back (the transcriber decodes each)
    import urllib.request
    bad = []
    for fmt, mime, ok in [("mp3", "audio/mpeg", lambda b: b[0] == 0xFF and (b[1] & 0xE6) == 0xE2),
                          ("opus", "audio/ogg", lambda b: b[:4] == b"OggS" and b[28:36] == b"OpusHead"),
                          ("flac", "audio/flac", lambda b: b[:4] == b"fLaC")]:
        req = urllib.request.Request("http://127.0.0.1:%d/v1/audio/speech" % sport, method="POST",
                                     data=json.dumps({"input": SAY, "response_format": fmt}).encode(),
                                     headers={"Authorization": "Bearer " + KEY, "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            ctype, body = r.headers.get("Content-Type"), r.read()
        t = sclient.audio.transcriptions.create(model="whisper-1", file=("speech." + fmt, body)).text.lower()
        # (Whisper tiny hears the sentence's end differently through each codec, and through a plain WAV of
        # `say` too: "this is my test on the speaking point"; its start it hears in every one)
        if ctype != mime or len(body) < 1000 or not ok(body) or "hello there" not in t or "this is" not in t:
            bad.append("%s: %s, %d bytes %r, heard %r" % (fmt, ctype, len(body), body[:8], t))
    result(name, not bad, "; ".join(bad) or "mp3, opus, flac heard back")


def t_speech_streams(name):
    # a long input goes out as the brick makes it: an HTTP chunk a PCM slot (0.1 s of audio), not one body
    # at the end (espeak-ng speaks ~700x faster than real time here, so the proof is the chunks, not the clock)
    text = " ".join(["The quick brown fox jumps over the lazy dog."] * 30)
    body = json.dumps({"input": text, "response_format": "pcm"}).encode()
    s = socket.create_connection(("127.0.0.1", sport), timeout=120)
    s.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + KEY.encode() +
              b"\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: " + str(len(body)).encode() +
              b"\r\n\r\n" + body)
    got = b""
    while True:
        d = s.recv(1 << 16)
        if not d:
            break
        got += d
    s.close()
    head, _, rest = got.partition(b"\r\n\r\n")
    chunks, n = 0, 0
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        chunks += 1
        n += size
        rest = rest[size + 2:]
    result(name, b"200 OK" in head and b"chunked" in head and n > 24000 * 2 * 60 and chunks >= n // 4800 // 2,
           "%r, %d bytes (%.1f s of audio) in %d chunks" % (head[:40], n, n / 48000, chunks))


def t_speech_bad_requests(name):
    cases = [
        (b"{not json", 400, None),
        (b'{"voice": "alloy"}', 400, "input"),
        (b'{"input": ""}', 400, "input"),
        (json.dumps({"input": "x" * 2001}).encode(), 400, "input"),  # --max-speech 2000
        (b'{"input": "hi", "voice": "zzqq"}', 400, "voice"),
        # a variant out of espeak-ng's folder (and over its 40-byte buffer: glibc aborted the server)
        (b'{"input": "hi", "voice": "en+../../../../../../../../etc/passwd"}', 400, "voice"),
        (b'{"input": "hi", "voice": "en-us+nosuch"}', 400, "voice"),
        (b'{"input": "hi", "voice": 7}', 400, "voice"),
        (b'{"input": "hi", "response_format": "aac"}', 400, "response_format"),
        (b'{"input": "hi", "response_format": "ogg"}', 400, "response_format"),
        (b'{"input": "hi", "speed": 5}', 400, "speed"),
        (b'{"input": "hi", "speed": "fast"}', 400, "speed"),
    ]
    bad = []
    for body, want, param in cases:
        st, data = raw(sport, "POST", "/v1/audio/speech", body, {"Content-Type": "application/json"})
        code, msg, got_param = err_of(data)
        if st != want or code != want or got_param != param:
            bad.append("%r: %s %s %s" % (body[:40], st, msg, got_param))
    for ctype in ("text/plain", "application/x-www-form-urlencoded"):  # JSON only: 415
        st, data = raw(sport, "POST", "/v1/audio/speech", b'{"input": "hi"}', {"Content-Type": ctype})
        if st != 415:
            bad.append("Content-Type %s: %s %s" % (ctype, st, data[:100]))
    st, data = raw(sport, "POST", "/v1/audio/speech", b'{"input": "still here", "response_format": "pcm"}')
    result(name, not bad and st == 200 and len(data) > 4800, "; ".join(bad) + " then %s %d" % (st, len(data)))


def t_speech_metrics(name):
    def m():
        st, data = raw(sport, "GET", "/metrics")
        return dict(l.rsplit(" ", 1) for l in data.decode().splitlines() if l and not l.startswith("#"))
    m0 = m()
    t = time.time()
    st, data = raw(sport, "POST", "/v1/audio/speech", json.dumps({"input": SAY, "response_format": "pcm"}).encode())
    wall = time.time() - t
    m1 = m()
    n = int(m1["nanomind_speech_requests_total"]) - int(m0["nanomind_speech_requests_total"])
    secs = float(m1["nanomind_speech_seconds_total"]) - float(m0["nanomind_speech_seconds_total"])
    hist = hist_one_more(m0, m1, "nanomind_speech_seconds", wall)
    result(name, st == 200 and n == 1 and abs(secs - len(data) / 48000) < 1e-3 and not hist,
           "%s, %d requests, %.3f s for %d bytes; %s" % (st, n, secs, len(data), hist))


def t_speech_disconnect(name):
    # a client that goes away mid-stream: the engine stops its synthesis (counted as cancelled), not speaking
    # two minutes of audio for nobody, and the next request is served
    def cancelled():
        st, data = raw(sport, "GET", "/metrics")
        return int(dict(l.rsplit(" ", 1) for l in data.decode().splitlines() if l and not l.startswith("#"))
                   ["nanomind_speech_cancelled_total"])
    c0 = cancelled()
    body = json.dumps({"input": "word " * 390, "response_format": "pcm"}).encode()
    s = socket.create_connection(("127.0.0.1", sport), timeout=60)
    s.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + KEY.encode() +
              b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    first = s.recv(65536)
    s.close()
    deadline = time.time() + 60  # (the server notices at its next writes: a bound, not a measure)
    while cancelled() == c0 and time.time() < deadline:
        time.sleep(0.05)
    c1 = cancelled()
    st, data = raw(sport, "POST", "/v1/audio/speech", b'{"input": "still here", "response_format": "pcm"}')
    result(name, b"200 OK" in first and c1 == c0 + 1 and st == 200 and len(data) > 4800,
           "%r; cancelled %d -> %d; then %s %d" % (first[:20], c0, c1, st, len(data)))


# Decompression bombs (issue 45, item 16): four 1 MB uploads of 8-bit mu-law at 1 kHz, each 1000 s (64 MB of
# 16 kHz float samples), at once. Each is refused naming --max-audio (60 s here) from its header, and the server's
# peak memory grows by about their bodies alone: it decoded none (before: each was decoded whole, all four side by
# side before any took its turn, and only then measured against the limit).
def t_transcription_bomb(name):
    import struct
    import threading
    n = 1000 * 1000
    fmt = struct.pack("<HHIIHHH", 7, 1, 1000, 1000, 1, 8, 0)  # WAVE_FORMAT_MULAW, mono, 1 kHz, 8 bits, cbSize 0
    wav = (b"RIFF" + struct.pack("<I", 4 + 8 + len(fmt) + 8 + n) + b"WAVEfmt " + struct.pack("<I", len(fmt)) + fmt +
           b"data" + struct.pack("<I", n) + b"\xff" * n)  # (0xff: mu-law silence)

    def hwm():
        with open("/proc/%d/status" % p4.pid) as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) // 1024

    before = hwm()
    got = [None] * 4

    def post(i):
        st, data = raw(sport, "POST", "/v1/audio/transcriptions", *multipart([("file", wav, "bomb.wav")]), timeout=120)
        got[i] = (st, err_of(data)[1])
    threads = [threading.Thread(target=post, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    grew = hwm() - before
    ok = all(g and g[0] == 400 and "longer than 60 s, the limit (--max-audio)" in g[1] for g in got)
    result(name, ok and grew < 48, "peak memory +%d MiB; %s" % (grew, got))


STT_CASES = [("transcription_equals_transcribe_and_whisper_cli", t_transcription),
             ("transcription_bomb_refused_before_decoding", t_transcription_bomb),
             ("transcription_formats", t_transcription_formats), ("transcription_words", t_transcription_words),
             ("transcription_streamed", t_transcription_streamed),
             ("transcription_bad_requests_4xx_then_serves", t_transcription_bad_requests),
             ("transcription_slow_body_408", t_transcription_slow_body),
             ("transcription_metrics_and_copy", t_transcription_metrics),
             ("speech_equals_say", t_speech), ("speech_pcm_voice_and_speed", t_speech_pcm_voice_speed),
             ("speech_round_trip_through_the_transcriber", t_speech_round_trip),
             ("speech_mp3_opus_flac", t_speech_encoded),
             ("speech_streamed_as_made", t_speech_streams), ("speech_bad_requests_4xx_then_serves", t_speech_bad_requests),
             ("speech_metrics", t_speech_metrics), ("speech_disconnect_cancels", t_speech_disconnect)]
if not wanted(*[n for n, _ in STT_CASES], "stt_server_sigterm_exits_0"):
    pass
elif not os.path.exists(W):
    if CI:
        result("speech_to_text", False, "needs %s (NM_CI is set)" % W)
    else:
        skipped += 1
        print("skip speech_to_text (needs %s)" % W)
else:
    p4, sport = start("--stt", W, "--tts", "espeak", "--max-speech", "2000", "--api-key", KEY, "--max-audio", "60",
                      "--body-timeout", "2")
    sclient = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % sport, api_key=KEY, max_retries=0, timeout=300)
    for n, f in STT_CASES:
        case(n, f)
    rc4, err4 = stop(p4)
    result("stt_server_sigterm_exits_0", rc4 == 0, "exit %s: %s" % (rc4, err4[-300:]))

# ---- text to speech with a Piper voice: --tts piper --voice (docs/piper.md) ------------------------
PV = os.path.join(os.path.dirname(M), "piper-en_US-joe-medium.gguf")


def t_piper_speech(name):  # OpenAI's voice names are the server's voice: `say --tts piper`'s samples, as the
    import struct         # noises are seeded per sentence in a fresh engine; another name is a Piper voice
    wav = pclient.audio.speech.create(model="tts-1", voice="alloy", input=SAY, response_format="wav").content
    fmt_tag, ch, rate, _, _, bits = struct.unpack("<HHIIHH", wav[20:36])
    want = say_cli(SAY, "--tts", "piper", "--voice", PV)
    st, data = raw(pport, "POST", "/v1/audio/speech", json.dumps({"input": "hi", "voice": "xx-nobody"}).encode())
    st2, data2 = raw(pport, "POST", "/v1/audio/speech",
                     json.dumps({"input": SAY, "voice": "en_US-joe-medium", "response_format": "pcm"}).encode())
    result(name, (fmt_tag, ch, rate, bits) == (1, 1, 24000, 16) and wav[44:] == want and len(want) > 24000
           and st == 400 and err_of(data)[2] == "voice" and "no Piper voice" in err_of(data)[1]
           and st2 == 200 and len(data2) > 24000,
           "%s, %d bytes against say's %d; unknown voice %d %s; by name %d" % (
               (fmt_tag, ch, rate, bits), len(wav) - 44, len(want), st, err_of(data), st2))


def t_piper_round_trip(name):
    wav = pclient.audio.speech.create(model="tts-1", voice="nova", input=SAY, response_format="wav").content
    words = subprocess.run([NM, "transcribe", "-m", W, "-"], input=wav, capture_output=True, timeout=120).stdout
    t = words.decode(errors="replace").lower()
    # the words, not Whisper's punctuation (a comma or a full stop after "hello there", as the voice's noise
    # draw, which moves with the requests before, falls)
    said = " ".join(re.sub(r"[^a-z' ]", " ", t).split())
    result(name, "hello there this is a test of the speech" in said, t[-200:])


def t_piper_on_opencl(name):  # --tts-device opencl: the voice's decoder on OpenCL (PoCL here), say's (CPU) samples
    import array             # within a few steps of 16 bits
    p6, cport = start("--tts", "piper", "--voice", PV, "--api-key", KEY, "--tts-device", "opencl")
    try:
        st, data = raw(cport, "POST", "/v1/audio/speech",
                       json.dumps({"input": SAY, "voice": "alloy", "response_format": "pcm"}).encode())
    finally:
        rc6, err6 = stop(p6)
    want = say_cli(SAY, "--tts", "piper", "--voice", PV)
    a, b = array.array("h", data if st == 200 else b""), array.array("h", want)
    diff = max((abs(x - y) for x, y in zip(a, b)), default=-1)
    result(name, st == 200 and len(a) == len(b) and 0 <= diff <= 3 and rc6 == 0,
           "status %d, %d samples against say's %d, max diff %d; exit %s %s" % (st, len(a), len(b), diff, rc6,
                                                                                 err6[-200:]))


PIPER_CASES = [("piper_speech_equals_say", t_piper_speech), ("piper_round_trip", t_piper_round_trip),
               ("piper_speech_on_opencl", t_piper_on_opencl)]
if not wanted(*[n for n, _ in PIPER_CASES]):
    pass
elif not os.path.exists(PV) or not os.path.exists(W):
    if CI:
        result("piper_speech", False, "needs %s and %s (NM_CI is set)" % (PV, W))
    else:
        skipped += 1
        print("skip piper_speech (needs %s)" % PV)
else:
    p5, pport = start("--tts", "piper", "--voice", PV, "--api-key", KEY)
    pclient = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % pport, api_key=KEY, max_retries=0, timeout=300)
    for n, f in PIPER_CASES:
        case(n, f)
    rc5, err5 = stop(p5)
    result("piper_server_sigterm_exits_0", rc5 == 0, "exit %s: %s" % (rc5, err5[-300:]))

# ---- images in chats: image_url parts with --mmproj (the trained test VLM, docs/vlm.md) ----------
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VLM = os.path.join(ROOT, "tests", "data", "vlm", "vlm-mmproj-q8_0.gguf")
sys.path.insert(0, os.path.join(ROOT, "tools", "train_vlm"))


def png_bytes(img):  # an RGB PNG (zlib, CRCs): a byte decoded wrong anywhere makes it fail to decode
    import struct
    import zlib
    raw_rows = b"".join(b"\0" + img[y].tobytes() for y in range(img.shape[0]))

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", img.shape[1], img.shape[0], 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(raw_rows, 9)) + chunk(b"IEND", b""))


def ppm_bytes(img):
    return b"P6\n%d %d\n255\n" % (img.shape[1], img.shape[0]) + img.tobytes()


def t_image_chat(name):
    # a held-out scene (an orange triangle, top left): the answer through the server is `run`'s, and right
    # as a PNG: its base64 holds '+' and '/' (checked), and a byte decoded wrong breaks its zlib stream or CRCs
    q = "What colour is the shape?"
    png = open(SCENE_PNG, "rb").read()
    part = image_part(png, "image/png")
    r = iclient.chat.completions.create(model="x", messages=[{"role": "user", "content": [
        part, {"type": "text", "text": q}]}], max_tokens=12, temperature=0, extra_body=EXACT)
    want = run_nm("--mmproj", VLM, "--image", SCENE_PNG, "--chat", "-p", q, "--temp", "0", "-n", "12")
    got = r.choices[0].message.content
    url = part["image_url"]["url"]
    # the usage counts the image's 196 embeddings with the text's tokens
    result(name, got == want == "orange" and r.usage.prompt_tokens > 196 + 20 and "+" in url and "/" in url[22:],
           "%r, run %r, usage %s" % (got, want, r.usage))


def t_image_stream_and_file(name):
    q = "Where is the shape?"
    parts = iclient.chat.completions.create(model="x", stream=True, max_tokens=12, temperature=0, extra_body=EXACT,
                                            messages=[{"role": "user", "content": [
                                                image_part(open(SCENE, "rb").read()), {"type": "text", "text": q}]}])
    streamed = "".join(c.choices[0].delta.content or "" for c in parts if c.choices)
    answers = []
    for url in ("scene.ppm", "file://" + SCENE):  # a name under --image-dir, an absolute file:// URL there
        r = iclient.chat.completions.create(model="x", max_tokens=12, temperature=0, extra_body=EXACT, messages=[
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": q}]}])
        answers.append(r.choices[0].message.content)
    result(name, streamed == "top left" and answers == [streamed] * 2, "%r %r" % (streamed, answers))


def t_image_bad_requests(name):
    import numpy as np
    bad = []

    def expect(content, code, words):
        st, data = raw(iport, "POST", "/v1/chat/completions", json.dumps(
            {"messages": [{"role": "user", "content": content}], "max_tokens": 4}))
        c, msg, _ = err_of(data)
        if st != code or not all(w in str(msg) for w in words) or idir in str(msg):  # (no host path in a reply)
            bad.append((words, st, msg))

    q = {"type": "text", "text": "What colour is the shape?"}
    expect([{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}, q], 400, ["not fetched", "data:"])
    expect([{"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO!!"}}, q], 400, ["not base64"])
    expect([{"type": "image_url", "image_url": {"url": "data:text/plain;base64,aGk="}}, q], 400, ["base64"])
    expect([{"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8gd29ybGQ="}}, q], 400,
           ["unknown format"])
    expect([image_part(ppm_bytes(np.zeros((300, 300, 3), np.uint8))), q], 400, ["60000"])  # --max-image-pixels
    # a file beside the directory, named through "..", and a link inside it to a file outside: both refused
    expect([{"type": "image_url", "image_url": {"url": "../" + os.path.basename(OUTSIDE)}}, q], 400,
           ["no such file under --image-dir"])
    expect([{"type": "image_url", "image_url": {"url": "link.ppm"}}, q], 400, ["no such file under --image-dir"])
    # one answer for a file out of the directory, there or not, and a missing one in it (no existence oracle)
    for url in ("nothere.ppm", "file:///etc/shadow", "file:///etc/nm-no-such-file", "/etc/passwd"):
        p = url[7:] if url.startswith("file://") else url
        expect([{"type": "image_url", "image_url": {"url": url}}, q], 400,
               ["image file '%s': no such file under --image-dir" % p])
    expect([{"type": "image_url", "image_url": {"url": "empty.ppm"}}, q], 400, ["'empty.ppm' is empty"])
    expect([{"type": "image_url", "image_url": {}}, q], 400, ["image_url.url"])
    expect([{"type": "text", "text": "<__media__>"}, image_part(open(SCENE, "rb").read())], 400, ["media marker"])
    expect([image_part(open(SCENE, "rb").read())] * 17 + [q], 400, ["more than 16"])
    # the rings stay in step: the next request with an image is answered (second image too: both encoded)
    r = iclient.chat.completions.create(model="x", max_tokens=12, temperature=0, messages=[{"role": "user", "content": [
        image_part(ppm_bytes(np.zeros((8, 8, 3), np.uint8))), image_part(open(SCENE, "rb").read()), q]}])
    ok = r.choices[0].message.content != "" and r.usage.prompt_tokens > 2 * 196
    result(name, not bad and ok, "%s; then %r %s" % (bad, r.choices[0].message.content, r.usage))


def t_image_metrics(name):
    st, data = raw(iport, "GET", "/metrics")
    m = re.search(r"^nanomind_images_total (\d+)$", data.decode(), re.M)
    result(name, st == 200 and m and int(m.group(1)) >= 6, data.decode()[-400:])


try:
    import numpy  # noqa: F401
    import scenes
    have_numpy = True
except ImportError:
    have_numpy = False
IMAGE_CASES = ["image_chat_equals_run", "image_stream_and_image_dir", "image_bad_requests_4xx_then_serves",
               "image_metrics", "image_server_sigterm_exits_0"]
if not wanted(*IMAGE_CASES):
    pass
elif not have_numpy:
    if CI:
        result("images_in_chat", False, "needs numpy (NM_CI is set)")
    else:
        skipped += 1
        print("skip images_in_chat (needs numpy)")
else:
    import tempfile
    idir = tempfile.mkdtemp(prefix="nm-test-images-")
    SCENE = os.path.join(idir, "scene.ppm")
    scenes.write_ppm(SCENE, scenes.scene(4242, 1)[0])  # an orange triangle, top left (docs/vlm.md)
    SCENE_PNG = os.path.join(idir, "scene.png")
    with open(SCENE_PNG, "wb") as f:
        f.write(png_bytes(scenes.scene(4242, 1)[0]))
    OUTSIDE = idir + "-outside.ppm"
    scenes.write_ppm(OUTSIDE, scenes.scene(4242, 1)[0])
    os.symlink(OUTSIDE, os.path.join(idir, "link.ppm"))
    open(os.path.join(idir, "empty.ppm"), "w").close()
    p5, iport = start("--mmproj", VLM, "--image-dir", idir, "--max-image-pixels", "60000", "--api-key", KEY)
    iclient = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % iport, api_key=KEY, max_retries=0, timeout=120)
    for n, f in [("image_chat_equals_run", t_image_chat), ("image_stream_and_image_dir", t_image_stream_and_file),
                 ("image_bad_requests_4xx_then_serves", t_image_bad_requests), ("image_metrics", t_image_metrics)]:
        case(n, f)
    rc5, err5 = stop(p5)
    result("image_server_sigterm_exits_0", rc5 == 0, "exit %s: %s" % (rc5, err5[-300:]))
    for f in (SCENE, SCENE_PNG, os.path.join(idir, "link.ppm"), OUTSIDE, os.path.join(idir, "empty.ppm")):
        os.remove(f)
    os.rmdir(idir)


# --parallel 3: requests decoded together (continuous batching), each on a sequence of -c / 3 positions
def stream_first(pport, prompt, n):  # a streamed completion whose first event has come: (connection, response)
    c = http.client.HTTPConnection("127.0.0.1", pport, timeout=120)
    c.request("POST", "/v1/completions", json.dumps({"prompt": prompt, "max_tokens": n, "ignore_eos": True,
                                                     "temperature": 0, "stream": True}),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    first = b""
    while r.status == 200 and not first.startswith(b"data: {"):  # (past the blank line between events)
        first = r.readline()
        if not first:
            break
    return c, r, first


def stream_rest(r):  # the number of text events until [DONE]
    n = 0
    while True:
        line = r.readline()
        if not line or line.startswith(b"data: [DONE]"):
            return n
        n += line.startswith(b"data: {\"id\"") and b'"text":""' not in line  # (not the closing event)


def t_parallel_overlap(name):
    # three long streams opened one after another, each once the one before has its first token: all three are
    # decoded at once (3 slots busy; with one sequence the second would wait for the first's 300 tokens), a
    # fourth request meanwhile is refused (--queue 0), and each stream then ends whole
    streams = [stream_first(pport, p, 300) for p in ("Once upon a time", "The history of Rome", "Dear diary,")]
    busy = int(metrics_of(pport)["nanomind_slots_busy"])
    st4, _ = raw(pport, "POST", "/v1/completions", json.dumps({"prompt": "hi", "max_tokens": 4}).encode())
    counts = [1 + stream_rest(r) for _, r, _ in streams]
    for c, _, _ in streams:
        c.close()
    m = metrics_of(pport)
    result(name, busy == 3 and st4 == 429 and counts == [300, 300, 300] and m["nanomind_slots_total"] == "3",
           "slots busy %d, a fourth request %d, events %s, slots %s" % (busy, st4, counts, m["nanomind_slots_total"]))


def t_parallel_equal_solo(name):
    # greedy answers to prompts whose continuations are sure, asked at once and one at a time: the same text.
    # A pass of several rows runs other kernels than a pass of one (docs/correctness.md: mean KL ~2e-3), so every
    # token of these answers leads the next candidate by >= 1.4 in log-probability (llama-server's n_probs on
    # this model); a near tie ("Monday, Tuesday, Wednesday," -> " and Thursday" then ")" or ".") flipped under ASan
    prompts = ["1, 2, 3, 4, 5, 6, 7, 8,", "2, 4, 6, 8, 10,", "a, b, c, d, e, f, g,"]

    def ask(p, out, k):
        st, data = raw(pport, "POST", "/v1/completions", json.dumps({"prompt": p, "max_tokens": 16, "temperature": 0,
                                                                     "cache_prompt": False}).encode())
        out[k] = json.loads(data)["choices"][0]["text"] if st == 200 else "status %d" % st

    solo, together = [None] * 3, [None] * 3
    for k, p in enumerate(prompts):
        ask(p, solo, k)
    th = [threading.Thread(target=ask, args=(p, together, k)) for k, p in enumerate(prompts)]
    [t.start() for t in th]
    [t.join(120) for t in th]
    result(name, solo == together and all(solo), "solo %s, together %s" % (solo, together))


def t_parallel_disconnect(name):
    # one of two streams goes away: the other ends whole, and the slot comes back
    (ca, ra, _), (cb, rb, _) = stream_first(pport, "Once upon a time", 200), stream_first(pport, "In the beginning", 200)
    ca.close()
    n = 1 + stream_rest(rb)
    cb.close()
    time.sleep(0.5)
    busy = int(metrics_of(pport)["nanomind_slots_busy"])
    result(name, n == 200 and busy == 0, "the other stream %d events, slots busy after %d" % (n, busy))


def metrics_of(pport):
    st, data = raw(pport, "GET", "/metrics")
    return dict(l.split(" ", 1) for l in data.decode().splitlines() if l and not l.startswith("#"))


PARALLEL_CASES = [("parallel_streams_overlap_queue_full_429", t_parallel_overlap),
                  ("parallel_answers_equal_solo", t_parallel_equal_solo),
                  ("parallel_disconnect_cancels_one", t_parallel_disconnect)]
if wanted(*[n for n, _ in PARALLEL_CASES], "parallel_server_sigterm_exits_0"):
    pp, pport = start("--parallel", "3", "--queue", "0", "-c", "3072")
    for n, f in PARALLEL_CASES:
        case(n, f)
    rcp, errp = stop(pp)
    result("parallel_server_sigterm_exits_0", rcp == 0, "exit %s: %s" % (rcp, errp[-300:]))


def t_refused(name, args, want):
    st = subprocess.run([NM, "serve", "-m", M, *args], capture_output=True, text=True, timeout=60)
    result(name, st.returncode in (1, 2) and want in st.stderr, "exit %d: %s" % (st.returncode, st.stderr))


for args, want in [(["--parallel", "0"], "--parallel needs an integer in [1"), (["-np", "300"], "[1, 256]"),
                   (["--parallel", "4", "-c", "200"], "leaves 50 positions a sequence")]:
    case("parallel_refused_" + "_".join(args).strip("-").replace("-", ""), lambda n, a=args, w=want: t_refused(n, a, w))
def t_bad_port(name):
    st = subprocess.run([NM, "serve", "-m", M, "--port", "70000"], capture_output=True, text=True, timeout=60)
    result(name, st.returncode == 2 and "--port" in st.stderr, st.stderr)


case("bad_port_refused", t_bad_port)


def t_random_model_valid_utf8(name):
    """A random-weight model's tokens spell stray bytes (SmolLM2's byte-level pieces out of order): every
    streamed event and every whole answer must still be valid UTF-8 JSON, the bad bytes as U+FFFD."""
    with tempfile.TemporaryDirectory(prefix="nm-test-serve-rnd-") as tmp:
        rm = os.path.join(tmp, "rnd.gguf")
        subprocess.run([os.path.join(os.path.dirname(NM), "nm-genmodel"), "--arch", "llama", "--tokenizer-from", M,
                        "-o", rm, "--layers", "2", "--embd", "128", "--heads", "4", "--kv-heads", "2", "--ff", "256",
                        "--seed", "7"], check=True, capture_output=True)
        port = free_port()
        p = subprocess.Popen([NM, "serve", "-m", rm, "--port", str(port), "-t", "2", "--api-key", KEY],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            for _ in range(300):
                try:
                    if raw(port, "GET", "/health", timeout=5)[0] == 200:
                        break
                except OSError:
                    time.sleep(0.1)
            bad, replaced = [], 0
            for i in range(6):
                for stream in (True, False):
                    body = json.dumps({"messages": [{"role": "user", "content": "tell me %d things" % i}],
                                       "max_tokens": 200, "temperature": 1.0, "seed": i, "ignore_eos": True,
                                       "stream": stream})
                    st, data = raw(port, "POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
                    try:
                        text = data.decode("utf-8")  # strict: a stray byte raises
                        if stream:
                            for line in text.split("\n\n"):
                                if line.startswith("data: {"):
                                    json.loads(line[6:])
                        else:
                            json.loads(text)
                        replaced += text.count("\ufffd")
                    except (UnicodeDecodeError, ValueError) as e:
                        bad.append("%d %s: %s" % (i, "stream" if stream else "whole", e))
                    if st != 200:
                        bad.append("%d: status %d" % (i, st))
        finally:
            stop(p)
    # (the answers do carry stray bytes: without the cleaning this fails)
    result(name, not bad and replaced > 0, "%d U+FFFD; %s" % (replaced, bad[:3]))


case("random_model_answers_are_valid_utf8", t_random_model_valid_utf8)
import shutil
shutil.rmtree(SYSFS, ignore_errors=True)
print("%d passed, %d failed, %d skipped" % (passed, failed, skipped))
sys.exit(1 if failed else 0)
