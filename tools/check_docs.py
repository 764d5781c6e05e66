#!/usr/bin/env python3
"""Re-runs the cheap figures quoted in docs/ and compares them with the text.

docs/checks.txt lists them: for each, the doc file and the exact text that
quotes the figure (it must still be there, so the docs and the list move
together), the command in the repository that produces it, a regex whose
group 1 is the value in the command's output (stdout and stderr), and how
close it must be:

  name: smollm2_perplexity
  doc: docs/correctness.md
  text: | SmolLM2-135M-Instruct Q4_1 | 20.9808 | 20.9462 |
  value: 20.9462
  run: build/nanomind perplexity -m $MODELS/SmolLM2-135M-Instruct.Q4_1.gguf -f tests/data/declaration.txt -c 256 -t 2
  match: PPL = ([0-9.]+)
  tol: rel 0.001          (or: abs X; or: max X - every match at most X, a bound the doc states)
  needs: $MODELS/SmolLM2-135M-Instruct.Q4_1.gguf

`value_avx2: X` (optional): the figure the doc gives for the AVX2 kernels, checked
instead of `value` on a CPU without AVX-512 (or with NM_NO_AVX512=1); it must
occur inside `text` too. `value` must occur inside `text`. Several matches of `match` are reduced with
`reduce: max` (default: the last one). $MODELS is $NM_MODEL_DIR or
~/.cache/nanomind/models; $BUILD is the build folder (argument 1, default
build). A missing `needs` file is a skip, a failure under NM_CI=1.

  tools/check_docs.py [BUILD] [--only NAME...] [--list]

Prints one line per figure and "N passed, N failed, N skipped". Tooling only.
"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKS = os.path.join(ROOT, "docs", "checks.txt")


def parse(path):
    checks, cur = [], None
    with open(path) as f:
        for n, raw in enumerate(f, 1):
            line = raw.rstrip("\n")
            if not line.strip() or line.startswith("#"):
                continue
            key, sep, val = line.partition(":")
            if not sep:
                sys.exit(f"check_docs: {path}:{n}: expected 'key: value'")
            key, val = key.strip(), val.strip()
            if key == "name":
                cur = {"name": val, "line": n, "needs": [], "reduce": "last"}
                checks.append(cur)
            elif cur is None:
                sys.exit(f"check_docs: {path}:{n}: a line before the first name:")
            elif key == "needs":
                cur["needs"].append(val)
            elif key in ("doc", "text", "value", "value_avx2", "run", "match", "tol", "reduce"):
                cur[key] = val
            else:
                sys.exit(f"check_docs: {path}:{n}: unknown key {key!r}")
    for c in checks:
        for k in ("doc", "text", "value", "run", "match", "tol"):
            if k not in c:
                sys.exit(f"check_docs: {path}:{c['line']} ({c['name']}): no {k}:")
        for k in ("value", "value_avx2"):
            if k in c and c[k] not in c["text"]:
                sys.exit(f"check_docs: {path}:{c['line']} ({c['name']}): {k} {c[k]} is not in text")
    return checks


def avx2_kernels():
    """Whether the CPU backend runs its AVX2 kernels: no AVX-512 here, or NM_NO_AVX512=1."""
    if os.environ.get("NM_NO_AVX512", "") not in ("", "0"):
        return True
    try:
        with open("/proc/cpuinfo") as f:
            return not re.search(r"^flags\s*:.*\bavx512f\b", f.read(), re.M)
    except OSError:
        return False


def within(got, want, tol):
    kind, _, x = tol.partition(" ")
    x = float(x)
    if kind == "rel":
        return abs(got / want - 1) <= x
    if kind == "abs":
        return abs(got - want) <= x
    if kind == "max":
        return got <= x
    raise ValueError(f"tol must be 'rel X', 'abs X' or 'max X', not {tol!r}")


def main():
    args = sys.argv[1:]
    only = None
    if "--only" in args:
        i = args.index("--only")
        only, args = set(args[i + 1:]), args[:i]
    listing = "--list" in args
    args = [a for a in args if a != "--list"]
    build = os.path.abspath(args[0]) if args else os.path.join(ROOT, "build")
    models = os.environ.get("NM_MODEL_DIR") or os.path.join(os.path.expanduser("~"), ".cache/nanomind/models")
    ci = os.environ.get("NM_CI", "") not in ("", "0")
    env = dict(os.environ, MODELS=models, BUILD=build)

    checks = parse(CHECKS)
    if listing:
        for c in checks:
            print(f"{c['name']:36s} {c['doc']:24s} {c['value']:>12s}  {c['run']}")
        return 0
    passed = failed = skipped = 0
    avx2 = avx2_kernels()
    for c in checks:
        if only and c["name"] not in only:
            continue
        doc = open(os.path.join(ROOT, c["doc"])).read()
        if c["text"] not in doc:
            print(f"FAIL {c['name']}: {c['doc']} no longer says {c['text']!r}")
            failed += 1
            continue
        missing = [p for p in (os.path.expandvars(n.replace("$MODELS", models)) for n in c["needs"])
                   if not os.path.exists(p)]
        if missing:
            if ci:
                print(f"FAIL {c['name']}: {missing[0]} is missing and NM_CI=1")
                failed += 1
            else:
                print(f"skip {c['name']}: {missing[0]} is missing")
                skipped += 1
            continue
        cmd = c["run"].replace("build/", build + "/", 1) if c["run"].startswith("build/") else c["run"]
        p = subprocess.run(["bash", "-c", cmd], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=600)
        out = p.stdout.decode(errors="replace")
        vals = [float(v) for v in re.findall(c["match"], out)]
        if p.returncode != 0 or not vals:
            print(f"FAIL {c['name']}: `{c['run']}` exited {p.returncode} with "
                  f"{len(vals)} matches of /{c['match']}/")
            print("     " + "\n     ".join(out.strip().splitlines()[-5:]))
            failed += 1
            continue
        got = max(vals) if c["reduce"] == "max" else vals[-1]
        key = "value_avx2" if "value_avx2" in c and avx2 else "value"
        ok = within(got, float(c[key]), c["tol"])
        print(f"{'ok  ' if ok else 'FAIL'} {c['name']}: {c['doc']} says {c[key]}{' (AVX2)' if key != 'value' else ''}, "
              f"measured {got:g} ({c['tol']})")
        passed += ok
        failed += not ok
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
