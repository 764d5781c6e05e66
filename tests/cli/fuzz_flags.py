#!/usr/bin/env python3
"""Random flag combinations for the nanomind command (issue 12): every run
must end by itself (no signal, no hang past the time limit), exit 0 exactly
when the arguments are valid, and exit 2 with a message naming the flag when
one is not.

    fuzz_flags.py NANOMIND [--runs N] [--seed S]

Each run draws a command, the arguments it needs, and up to four more flags
with values from small pools: valid values, range edges, and garbage. The
expected verdict comes from the ranges written here, which are the ones the
--help texts state (an independent statement of the rules, not the parser's
code). Prints one line per run that goes wrong and "N passed, N failed,
N skipped"; a missing model is a skip (a failure under NM_CI).
"""
import os
import random
import subprocess
import sys
import tempfile

MODELS = os.environ.get("NM_MODEL_DIR", os.path.expanduser("~/.cache/nanomind/models"))
LLM = os.path.join(MODELS, "SmolLM2-135M-Instruct.Q4_1.gguf")
WHISPER = os.path.join(MODELS, "whisper-tiny.en.gguf")
SPEECH = "tests/data/speech/tts_16k.wav"
CORES = os.cpu_count() or 1


def num(v):
    try:
        return float(v)
    except ValueError:
        return None


def integer(lo, hi):
    def ok(v):
        try:
            x = int(v, 10)
        except ValueError:
            return False
        return lo <= x <= hi
    return ok


def real(lo, hi, lo_open=False):
    def ok(v):
        x = num(v)
        # the values are single-precision floats: beyond 3.4e38 is infinite, refused
        if x is None or x != x or abs(x) > 3.4028234663852886e38:
            return False
        return (x > lo if lo_open else x >= lo) and x <= hi
    return ok


def threads(v):
    return integer(-1, 4 * CORES)(v) and v != "0"


GARBAGE = ["", "x", "1x", "nan", "inf", "1e99", "--", "-"]

# flag: (pool of values, validity, takes a value)
RUN = {
    "-t": (["1", "2", "-1", "0", "-3", str(4 * CORES + 1)], threads),
    "-c": (["64", "128", "0", "-5", "99999999999"], integer(0, 1 << 24)),
    "-b": (["1", "8", "0", "-1"], integer(1, 1 << 20)),
    "-ub": (["1", "64", "0", "-1"], integer(1, 1 << 20)),
    "--temp": (["0", "0.7", "-1", "2"], real(0, float("inf"))),
    "--top-k": (["0", "40", "-5"], integer(0, 1 << 24)),
    "--top-p": (["1", "0.9", "0", "-1", "2"], real(0, 1, lo_open=True)),
    "--min-p": (["0", "0.05", "1", "2", "-0.1"], real(0, 1)),
    "--repeat-penalty": (["1", "1.1", "0", "-1"], real(0, float("inf"), lo_open=True)),
    "--repeat-last-n": (["64", "0", "-1", "-2"], integer(-1, 1 << 24)),
    "-s": (["0", "42", "-1", "-2", "4294967296"], integer(-1, 4294967295)),
    "--presence-penalty": (["0", "0.5", "-0.5"], real(float("-inf"), float("inf"))),
    "--frequency-penalty": (["0", "0.3", "-1"], real(float("-inf"), float("inf"))),
    "-n": (["1", "0", "-2"], integer(-1, 1 << 24)),
    "-ngl": (["0", "99", "all", "-2"], lambda v: v in ("all", "auto") or integer(-1, 1 << 20)(v)),
}
RUN_SWITCHES = ["--no-escape", "-e", "--stats", "--pin", "--mlock", "-no-cnv", "-fa"]
BENCH = {"-t": RUN["-t"], "-o": (["json", "jsonl", "csv", ""], lambda v: v in ("json", "jsonl"))}
BENCH_FOREIGN = ["-c", "--temp", "-f", "--chat", "-s"]  # (-p and -n are bench's own: token counts)
TRANSCRIBE = {
    "-bs": (["1", "2", "0", "17"], integer(1, 16)),
    "-tp": (["0", "0.5", "1.5", "-1"], real(0, 1)),
    "-nth": (["0.6", "2", "-0.1"], real(0, 1)),
    "-ot": (["0", "-5"], integer(0, 2147483647)),
    "-t": (["1", "2", "0", str(4 * CORES + 1)], integer(1, 4 * CORES)),
    "-ml": (["0", "1", "40", "-1"], integer(0, 1 << 20)),
    "-wt": (["0.01", "0.5", "2", "-0.1"], real(0, 1)),
}
TRANSCRIBE_SWITCHES = ["-nf", "-nt", "-np", "--stats", "-sns", "-sow", "-nfa"]
SAY = {
    "--rate": (["175", "80", "450", "79", "451", "x"], integer(80, 450)),
    "--pitch": (["50", "0", "100", "101", "-1"], integer(0, 100)),
    "--volume": (["100", "0", "200", "201"], integer(0, 200)),
    "--sample-rate": (["16000", "22050", "999", "384001"], integer(1000, 384000)),
}


def draw(rng, flags, switches, foreign=()):
    """Up to four flags: (argv, valid, the flags whose value is bad)."""
    args, valid, bad = [], True, []
    names = list(flags) + list(switches) + list(foreign)
    for name in rng.sample(names, k=rng.randint(0, min(4, len(names)))):
        if name in switches:
            args.append(name)
        elif name in foreign:
            args += [name, "1"] if name not in ("--chat",) else [name]
            valid = False
            bad.append(name)
        else:
            pool, ok = flags[name]
            v = rng.choice(pool + [rng.choice(GARBAGE)] if rng.random() < 0.3 else pool)
            args += [name, v]
            if not ok(v):
                valid = False
                bad.append(name)
    return args, valid, bad


def case(rng, tmp):
    kind = rng.choice(["run", "run", "run", "bench", "info", "transcribe", "say"])
    if kind == "run":
        extra, valid, bad = draw(rng, RUN, RUN_SWITCHES)
        # short runs: a tiny prompt; -n 1 unless drawn (never -1: a whole context)
        argv = ["run", "-m", LLM, "-p", "hi"] + ([] if "-n" in extra else ["-n", "1"]) + extra
        need = LLM
    elif kind == "bench":
        extra, valid, bad = draw(rng, BENCH, ["--pin"], BENCH_FOREIGN)
        argv = ["bench", "-m", LLM, "-p", "4", "-n", "2", "-r", "1"] + extra
        need = LLM
    elif kind == "info":
        extra, valid, bad = draw(rng, {}, [], ["-t", "-c", "--temp", "--stats"])
        argv = ["info", LLM] + extra
        need = LLM
    elif kind == "transcribe":
        extra, valid, bad = draw(rng, TRANSCRIBE, TRANSCRIBE_SWITCHES)
        argv = ["transcribe", "-m", WHISPER, SPEECH] + ([] if "-bs" in extra else ["-bs", "1"]) + extra
        need = WHISPER
    else:
        extra, valid, bad = draw(rng, SAY, ["--stats"])
        argv = ["say", "hello", "-o", os.path.join(tmp, "fuzz.wav")] + extra
        need = None
    return argv, valid, bad, need


def main():
    nm = sys.argv[1]
    runs = int(sys.argv[sys.argv.index("--runs") + 1]) if "--runs" in sys.argv else 120
    seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else 12
    ci = os.environ.get("NM_CI", "0") not in ("", "0")
    rng = random.Random(seed)
    passed = failed = skipped = n_valid = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(runs):
            argv, valid, bad, need = case(rng, tmp)
            n_valid += valid
            if need and not os.path.exists(need):
                if ci:
                    failed += 1
                    print(f"FAIL {i}: {need} missing and NM_CI set")
                else:
                    skipped += 1
                continue
            try:
                p = subprocess.run([nm] + argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
            except subprocess.TimeoutExpired:
                failed += 1
                print(f"FAIL {i}: hung (120 s): nanomind {' '.join(argv)}")
                continue
            err = p.stderr.decode(errors="replace")
            why = None
            if p.returncode < 0 or p.returncode > 128:
                why = f"killed by signal {-p.returncode if p.returncode < 0 else p.returncode - 128}"
            elif valid and p.returncode != 0:
                why = f"valid arguments, exit {p.returncode}: {err.strip()[-200:]}"
            elif not valid and p.returncode != 2:
                why = f"bad {' '.join(bad)}, exit {p.returncode} (want 2)"
            elif not valid and not any(b in err for b in bad):
                why = f"bad {' '.join(bad)}, but the message does not name it: {err.strip()[-200:]}"
            if why:
                failed += 1
                print(f"FAIL {i}: nanomind {' '.join(argv)}: {why}")
            else:
                passed += 1
    print(f"({runs} runs, {n_valid} with valid arguments, seed {seed})")
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
