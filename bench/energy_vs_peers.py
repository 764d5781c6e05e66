#!/usr/bin/env python3
"""Energy per spoken question: nanomind's assistant against the stack users stitch
today (whisper.cpp's whisper-cli, llama.cpp's llama-completion, espeak-ng), doing
the same work: the same question files, the same Whisper weights (the ggml .bin,
which both read), the same LLM file, greedy decoding of the same number of tokens
(--ignore-eos), the same threads, and the answer spoken by espeak-ng.

Both are put through one energy model, nanomind's (`nanomind power energy`,
docs/power.md): the CPU-seconds each used (measured: the children's rusage, every
process whole, loading included), the wall time, and the DRAM bytes, which no
counter here measures, so they are modelled alike: the traffic of the work
itself (the bricks' estimates, from nanomind's --json; the same work for both)
plus what a stack copies on top: whisper.cpp reads its model file into its
buffers in every process (the file's bytes read and written), llama.cpp
repacks some weight types at load (its "CPU_REPACK" buffer, read and written,
when it reports one). nanomind maps both models and copies neither.

Rows: nanomind with every question in one process (the assistant as it runs),
nanomind with a process per question (load included each time, as the CLIs),
and the peer stack (three processes per question).

usage: bench/energy_vs_peers.py --llama-completion BIN --whisper-cli BIN --whisper-bin ggml-tiny.en.bin
                                [--llm GGUF] [-n 48] [-t 2] [--questions WAV ...]
"""
import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYSTEM = "You are a helpful assistant. Answer in one or two sentences."


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


class Meter:
    """CPU-seconds and wall time of the commands run through it."""

    def __init__(self):
        self.cpu = 0.0
        self.wall = 0.0
        self.by_tool = {}  # basename -> [CPU-s, wall s]

    def run(self, cmd, **kw):
        c0, t0 = children_cpu(), time.monotonic()
        p = subprocess.run(cmd, capture_output=True, text=True, **kw)
        wall, cpu = time.monotonic() - t0, children_cpu() - c0
        self.wall += wall
        self.cpu += cpu
        t = self.by_tool.setdefault(os.path.basename(cmd[0]), [0.0, 0.0])
        t[0] += cpu
        t[1] += wall
        if p.returncode != 0:
            sys.exit("error: %s failed (%d): %s" % (" ".join(cmd[:3]), p.returncode, p.stderr[-800:]))
        return p


def model(nm, cpu, wall, dram, questions):
    out = subprocess.run([nm, "power", "energy", "--cpu-s", "%.6f" % cpu, "--wall-s", "%.6f" % wall, "--bytes",
                          "%.0f" % dram, "--questions", str(questions)], capture_output=True, text=True, check=True)
    m = re.match(r"modelled: ([0-9.]+) J", out.stdout)
    return float(m.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-completion", required=True)
    ap.add_argument("--whisper-cli", required=True)
    ap.add_argument("--whisper-bin", required=True, help="whisper.cpp ggml .bin (both stacks read it)")
    ap.add_argument("--llm", default=os.path.expanduser("~/.cache/nanomind/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("-n", type=int, default=48, help="tokens each answer decodes (--ignore-eos)")
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("--questions", nargs="*", default=[
        os.path.join(HERE, "tests/data/speech", f) for f in
        ("tts_16k.wav", "alsa_front_center.wav", "alsa_side_left.wav", "alsa_rear_right.wav")])
    ap.add_argument("--nanomind", default=os.path.join(HERE, "build/nanomind"))
    a = ap.parse_args()
    for f in (a.llama_completion, a.whisper_cli, a.nanomind):
        if not os.access(f, os.X_OK):
            sys.exit("error: %s is not an executable" % f)
    for f in [a.whisper_bin, a.llm] + a.questions:
        if not os.path.isfile(f):
            sys.exit("error: %s: no such file" % f)
    espeak = shutil.which("espeak-ng")
    if not espeak:
        sys.exit("error: espeak-ng is not installed")
    nq = len(a.questions)
    tmp = tempfile.mkdtemp(prefix="nm-energy-")
    try:
        qdir = os.path.join(tmp, "q")
        os.mkdir(qdir)
        for i, q in enumerate(a.questions):
            os.symlink(os.path.abspath(q), os.path.join(qdir, "q%02d.wav" % i))
        common = ["-m", a.llm, "--stt", a.whisper_bin, "-t", str(a.t), "-n", str(a.n), "--ignore-eos", "--temp", "0",
                  "-sys", SYSTEM]
        # warm the page cache for every file (all runs then read the models from memory)
        for f in (a.llm, a.whisper_bin):
            with open(f, "rb") as fh:
                while fh.read(1 << 24):
                    pass

        # nanomind: every question in one process
        out = os.path.join(tmp, "out1")
        os.mkdir(out)
        ours1 = Meter()
        js = os.path.join(tmp, "r.json")
        ours1.run([a.nanomind, "assistant"] + common + ["--audio", qdir, "--out", out, "--json", js])
        r = json.load(open(js))
        work_dram = r["run"]["dram_bytes"]
        ours_q = [q["question"] for q in r["questions"]]
        ours_tokens = [q["prompt_tokens"] for q in r["questions"]]

        # nanomind: a process per question
        oursN = Meter()
        for i, q in enumerate(a.questions):
            d = os.path.join(tmp, "outN%d" % i)
            os.mkdir(d)
            oursN.run([a.nanomind, "assistant"] + common + ["--audio", q, "--out", d])

        # the peers: whisper-cli, llama-completion, espeak-ng per question
        peers = Meter()
        extra = 0.0
        peer_q, peer_tokens = [], []
        wbin = os.path.getsize(a.whisper_bin)
        for i, q in enumerate(a.questions):
            p = peers.run([a.whisper_cli, "-m", a.whisper_bin, "-f", q, "-t", str(a.t), "-nt", "-np", "-nfa", "-bs",
                           "1"])
            text = " ".join(p.stdout.split())
            peer_q.append(text)
            extra += 2.0 * wbin  # the file read into whisper.cpp's buffers
            prompt = ("<|im_start|>system\n%s<|im_end|>\n<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n" %
                      (SYSTEM, text))
            p = peers.run([a.llama_completion, "-m", a.llm, "-p", prompt, "-n", str(a.n), "--ignore-eos", "--temp",
                           "0", "-t", str(a.t), "-no-cnv", "--no-display-prompt", "--no-warmup"],
                          stdin=subprocess.DEVNULL)
            m = re.search(r"CPU_REPACK model buffer size\s*=\s*([0-9.]+) MiB", p.stderr)
            if m:
                extra += 2.0 * float(m.group(1)) * 2**20
            m = re.search(r"prompt eval time\s*=.*?/\s*(\d+) tokens", p.stderr)
            peer_tokens.append(int(m.group(1)) if m else -1)
            answer = p.stdout.strip() or "."
            peers.run([espeak, "-v", "en-us", "-w", os.path.join(tmp, "peer%d.wav" % i), answer])

        print("questions: %d spoken (%s), answers of %d tokens (--ignore-eos, greedy), -t %d; %s" %
              (nq, ", ".join(os.path.basename(q) for q in a.questions), a.n, a.t, os.path.basename(a.llm)))
        for i in range(nq):
            same = "same" if ours_q[i].strip() == peer_q[i].strip() else "DIFFERENT"
            print("  q%d: transcript %s (%r), prompt tokens: ours %d, llama.cpp %d" %
                  (i + 1, same, ours_q[i][:60], ours_tokens[i], peer_tokens[i]))
        print("%-34s %8s %8s %10s %9s %11s %7s" % ("stack", "CPU-s", "wall s", "DRAM MB", "J", "J/question",
                                                   "vs peer"))
        rows = [("nanomind, one process", ours1, work_dram), ("nanomind, a process per question", oursN, work_dram),
                ("whisper.cpp + llama.cpp + espeak-ng", peers, work_dram + extra)]
        joules = [model(a.nanomind, m.cpu, m.wall, d, nq) for _, m, d in rows]
        for (name, m, d), j in zip(rows, joules):
            print("%-34s %8.3f %8.3f %10.1f %9.3f %11.3f %6.2fx" % (name, m.cpu, m.wall, d / 1e6, j, j / nq,
                                                                    j / joules[2]))
        print("the peers by tool: " + ", ".join("%s %.3f CPU-s in %.3f s" % (k, v[0], v[1])
                                                for k, v in peers.by_tool.items()))
        print("(modelled: `nanomind power energy`, %s)" % subprocess.run(
            [a.nanomind, "power", "energy", "--cpu-s", "1", "--wall-s", "1"], capture_output=True,
            text=True).stdout.split("; ", 1)[1].strip())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
