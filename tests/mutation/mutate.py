#!/usr/bin/env python3
"""Mutation harness: do the tests fail when the code is wrong?

Each mutant in tests/mutation/mutants.txt is one small, deliberate bug: a
search text that must occur exactly once in one file, and its replacement.
For each mutant the harness applies it to a scratch copy of the tree, builds
the test programs that cover that file, runs them, records whether they
failed ("killed") or passed ("survived"), and restores the file.

  tests/mutation/mutate.py                 every mutant (make mutate)
  tests/mutation/mutate.py --sample N      N mutants, a deterministic slice that
                                           rotates with the commit (what CI runs)
  tests/mutation/mutate.py --only NAME...  the named mutants
  tests/mutation/mutate.py --list          the mutants and the tests they run

Options: --scratch DIR (default /tmp/nm-mutate), --report FILE (a Markdown
table of the run), --timeout S (for all of one mutant's tests, default 600:
they stop at the first that fails, and a mutant that makes them hang is
killed, with every process it started, when the time is up),
--jobs N (build jobs). Exit status: 0 when every mutant run was killed (or was
declared equivalent), 1 when one survived, 2 when the harness itself could
not run (a search text not found, a mutant that does not build, the
unmutated tree failing its own tests).

Before any mutant, the unmutated scratch tree must pass every test the
selected mutants will run: otherwise every mutant would look killed.

Tooling only: Python is not part of the runtime.
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DEFS = os.path.join(HERE, "mutants.txt")


class Mutant:
    def __init__(self, name, lineno):
        self.name = name
        self.lineno = lineno
        self.file = None
        self.tests = None
        self.runner = "ctest"   # ctest | arm
        self.env = {}
        self.equivalent = None  # reason, if the mutant cannot change behaviour
        self.needs = []         # CPU flags (/proc/cpuinfo) without which its code never runs here
        self.survives = None    # why a real bug is known to pass the C tests (and what catches it instead)
        self.old = []
        self.new = []

    # The `-` lines match the code whatever its indentation: the first from
    # anywhere in a line, the others after the next newline and any blanks.
    # `+` lines are indented like the matched code (plus their own leading blanks).
    def pattern(self):
        lines = [l.strip() for l in self.old]
        return re.compile(r"\n[ \t]*".join(re.escape(l) for l in lines))

    def count(self, text):
        return len(self.pattern().findall(text))

    def apply(self, text):
        m = self.pattern().search(text)
        line_start = text.rfind("\n", 0, m.start()) + 1
        indent = re.match(r"[ \t]*", text[line_start:m.start()]).group(0)
        new = "\n".join(l if i == 0 else indent + l for i, l in enumerate(self.new))
        return text[:m.start()] + new + text[m.end():]


def parse(path):
    """The definitions: `cover FILE: TESTS` lines name the tests of a file;
    a mutant is a block of `name:`, `file:`, optional `tests:` (instead of
    the file's cover), `env: K=V ...`, `runner: arm`, `equivalent: why`,
    then `- ` lines (the text to find, one or more lines) and `+ ` lines
    (what replaces it; none deletes it). `#` starts a comment line."""
    cover, mutants, cur = {}, [], None
    with open(path) as f:
        for n, raw in enumerate(f, 1):
            line = raw.rstrip("\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            if line.startswith("cover "):
                m = re.match(r"cover (\S+):\s*(.*)$", line)
                if not m:
                    sys.exit(f"mutate: {path}:{n}: bad cover line")
                cover[m.group(1)] = m.group(2).split()
                continue
            if line.startswith("name:"):
                cur = Mutant(line[5:].strip(), n)
                mutants.append(cur)
                continue
            if cur is None:
                sys.exit(f"mutate: {path}:{n}: a line before the first name:")
            if line.startswith("- ") or line == "-":
                cur.old.append(line[2:])
            elif line.startswith("+ ") or line == "+":
                cur.new.append(line[2:])
            elif line.startswith("file:"):
                cur.file = line[5:].strip()
            elif line.startswith("tests:"):
                cur.tests = line[6:].split()
            elif line.startswith("env:"):
                for kv in line[4:].split():
                    k, _, v = kv.partition("=")
                    cur.env[k] = v
            elif line.startswith("runner:"):
                cur.runner = line[7:].strip()
            elif line.startswith("survives:"):
                cur.survives = line[9:].strip()
            elif line.startswith("needs:"):
                cur.needs = line[6:].split()
            elif line.startswith("equivalent:"):
                cur.equivalent = line[11:].strip()
            else:
                sys.exit(f"mutate: {path}:{n}: cannot read {line!r}")
    names = set()
    for m in mutants:
        where = f"{path}:{m.lineno} ({m.name})"
        if m.name in names:
            sys.exit(f"mutate: {where}: the name is used twice")
        names.add(m.name)
        if not m.file or not m.old:
            sys.exit(f"mutate: {where}: needs file: and - lines")
        if m.tests is None:
            m.tests = cover.get(m.file)
        if m.runner == "ctest" and not m.tests:
            sys.exit(f"mutate: {where}: no tests: and no cover line for {m.file}")
        if m.runner not in ("ctest", "arm"):
            sys.exit(f"mutate: {where}: runner must be ctest or arm")
    return mutants


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags") or line.startswith("Features"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def targets_of(tests):
    """The build targets a list of ctest tests runs: ctest names are the
    programs' names, but for the CLI scripts (nanomind and the tools they
    call: the mmproj writer, the requantizer) and spin (no program of ours)."""
    extra = {"cli": ["nanomind", "nm-genmmproj", "nm_vcam_preload"], "cli_bad_input": ["nanomind", "nm-requant"], "cli_fuzz_flags": ["nanomind"], "cli_power": ["nanomind", "nm-genmmproj"], "server": ["nanomind"], "convert_whisper_ct2": ["nanomind"], "fetch_models": [], "vlm": ["nanomind", "nm-genmodel", "nm-genmmproj"], "spin_tabm": [],
             "test_transcribe_avx2": ["test_transcribe"], "golden_test_perplexity_avx2": ["golden_test_perplexity"],
             "golden_test_perplexity_avx2vnni": ["golden_test_perplexity"]}
    return sorted({t for test in tests for t in extra.get(test, [test])})


def run(cmd, cwd, log, env=None, timeout=None):
    e = dict(os.environ)
    if env:
        e.update(env)
    with open(log, "a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        # its own process group, so that a timeout kills the tests it started too
        p = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=e, start_new_session=True)
        try:
            return p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            out.write(f"timed out after {timeout} s (killed)\n")
            return 124


def copy_tree(scratch):
    """The tracked and unignored files of the repository, into scratch/tree."""
    tree = os.path.join(scratch, "tree")
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                           stdout=subprocess.PIPE, check=True).stdout.decode().split("\0")
    for rel in files:
        if not rel:
            continue
        src, dst = os.path.join(ROOT, rel), os.path.join(tree, rel)
        if not os.path.isfile(src) or os.path.islink(src):
            continue
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if not os.path.exists(dst) or open(src, "rb").read() != open(dst, "rb").read():
            # a new mtime (not the source's, which may be older than the scratch
            # build's objects): the build recompiles what changed
            shutil.copyfile(src, dst)
            shutil.copymode(src, dst)
    return tree


def sample(mutants, n):
    """n live mutants, evenly spaced, starting at an offset that moves with the
    commit count: the same commit always runs the same slice, and consecutive
    commits cover every mutant."""
    live = [m for m in mutants if not m.equivalent and not m.survives]
    if n >= len(live):
        return live
    try:
        k = int(subprocess.run(["git", "rev-list", "--count", "HEAD"], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, check=True).stdout)
    except (subprocess.CalledProcessError, ValueError, FileNotFoundError):
        k = 0
    step = len(live) / n
    start = (k * n) % len(live)
    picked = sorted({(start + int(i * step)) % len(live) for i in range(n)})
    return [live[i] for i in picked]


def main():
    ap = argparse.ArgumentParser(description="mutation harness (see the module docstring)")
    ap.add_argument("--sample", type=int)
    ap.add_argument("--only", nargs="+")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--scratch", default=os.environ.get("NM_MUTATE_DIR", "/tmp/nm-mutate"))
    ap.add_argument("--report")
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    a = ap.parse_args()

    mutants = parse(DEFS)
    if a.list:
        for m in mutants:
            what = "arm (qemu)" if m.runner == "arm" else " ".join(m.tests)
            eq = f"  [equivalent: {m.equivalent}]" if m.equivalent else ""
            print(f"{m.name:44s} {m.file:44s} {what}{eq}")
        print(f"{len(mutants)} mutants")
        return 0
    if a.check:
        chosen = mutants
    elif a.only:
        byname = {m.name: m for m in mutants}
        unknown = [n for n in a.only if n not in byname]
        if unknown:
            print(f"mutate: unknown mutants: {' '.join(unknown)}", file=sys.stderr)
            return 2
        chosen = [byname[n] for n in a.only]
    elif a.sample:
        chosen = sample(mutants, a.sample)
    else:
        chosen = mutants

    # A mutant of code this CPU never runs (an AVX-512 kernel on a CPU without it)
    # cannot be killed here: it is reported as not run, never as killed or survived.
    flags = cpu_flags()
    unrunnable = {m.name for m in chosen if m.needs and not set(m.needs) <= flags}

    # Every search text must be found once, in the real tree, before anything runs.
    bad = 0
    for m in chosen:
        text = open(os.path.join(ROOT, m.file)).read()
        c = m.count(text)
        if c != 1:
            print(f"mutate: {m.name}: the search text occurs {c} times in {m.file} (must be once)", file=sys.stderr)
            bad += 1
    if bad:
        return 2
    if a.check:
        print(f"mutate: every search text of the {len(chosen)} mutants occurs once")
        print(f"{len(chosen)} passed, 0 failed, 0 skipped")
        return 0

    os.makedirs(a.scratch, exist_ok=True)
    tree = copy_tree(a.scratch)
    build = os.path.join(tree, "build-mutate")
    logdir = os.path.join(a.scratch, "logs")
    shutil.rmtree(logdir, ignore_errors=True)
    os.makedirs(logdir)
    base_log = os.path.join(logdir, "_baseline.log")
    t0 = time.time()
    print(f"mutate: {len(chosen)} of {len(mutants)} mutants; scratch {tree}; logs {logdir}", flush=True)

    live_now = [m for m in chosen if not m.equivalent and m.name not in unrunnable]
    ctest_mut = [m for m in live_now if m.runner == "ctest"]
    arm_mut = [m for m in live_now if m.runner == "arm"]
    tests = sorted({t for m in ctest_mut for t in m.tests})
    targets = targets_of(tests)
    if ctest_mut:
        if run(["cmake", "-S", tree, "-B", build, "-DCMAKE_BUILD_TYPE=Release"], tree, base_log) != 0 or \
           run(["cmake", "--build", build, f"-j{a.jobs}", "--target"] + targets, tree, base_log) != 0:
            print(f"mutate: the unmutated tree does not build (see {base_log})", file=sys.stderr)
            return 2
        # under the environment each mutant runs them with (a filter to the cases that matter)
        groups = {}
        for m in ctest_mut:
            groups.setdefault(tuple(sorted(m.env.items())), set()).update(m.tests)
        rc = 0
        for env, ts in sorted(groups.items()):
            rc = rc or run(["ctest", "-j1", "-R", "^(" + "|".join(sorted(ts)) + ")$"], build, base_log, env=dict(env))
        if rc != 0:
            print(f"mutate: the unmutated tree fails its tests (see {base_log})", file=sys.stderr)
            return 2
    if arm_mut:
        if run(["bash", "scripts/test_arm.sh"], tree, base_log, env={"BUILD_ARM": "build-mutate-arm"}) != 0:
            print(f"mutate: the unmutated tree fails test_arm (see {base_log})", file=sys.stderr)
            return 2
    print(f"mutate: baseline green ({time.time() - t0:.0f} s)", flush=True)

    results = []
    for m in chosen:
        if m.equivalent:
            results.append((m, "equivalent", 0.0))
            print(f"  equivalent {m.name}: {m.equivalent}", flush=True)
            continue
        if m.name in unrunnable:
            results.append((m, "not run", 0.0))
            print(f"  not run   {m.name}: this CPU lacks {' '.join(sorted(set(m.needs) - flags))}", flush=True)
            continue
        path = os.path.join(tree, m.file)
        orig = open(path).read()
        log = os.path.join(logdir, m.name + ".log")
        t1 = time.time()
        try:
            with open(path, "w") as f:
                f.write(m.apply(orig))
            if m.runner == "arm":
                rc = run(["bash", "scripts/test_arm.sh"], tree, log,
                         env=dict(m.env, BUILD_ARM="build-mutate-arm"), timeout=a.timeout)
                # a compiler diagnostic (file:line:col: error:) or make's failure, not a test's message
                built = not re.search(r"^\S+:\d+:\d+: error:|^g?make(\[\d+\])?: \*\*\*", open(log).read(), re.M)
            else:
                mt = targets_of(m.tests)
                built = run(["cmake", "--build", build, f"-j{a.jobs}", "--target"] + mt, tree, log) == 0
                # the first failing test kills the mutant: the rest need not run
                rc = run(["ctest", "-j1", "--stop-on-failure", "-R", "^(" + "|".join(m.tests) + ")$"], build, log,
                         env=m.env, timeout=a.timeout) if built else 1
        finally:
            with open(path, "w") as f:
                f.write(orig)
            # a new mtime, so the next build recompiles the restored file
            os.utime(path, None)
        if not built:
            verdict = "stillborn"
        else:
            verdict = "killed" if rc != 0 else "survived" if not m.survives else "known survivor"
        dt = time.time() - t1
        results.append((m, verdict, dt))
        print(f"  {verdict:9s} {m.name} ({dt:.0f} s)", flush=True)

    live = [r for r in results if r[1] not in ("equivalent", "not run")]
    killed = sum(1 for r in live if r[1] == "killed")
    survived = [r[0] for r in live if r[1] == "survived"]
    known = [r[0] for r in live if r[1] == "known survivor"]
    stillborn = [r[0] for r in live if r[1] == "stillborn"]
    n_eq = sum(1 for r in results if r[1] == "equivalent")
    n_nr = sum(1 for r in results if r[1] == "not run")
    total = len(live)
    print(f"mutate: {killed} killed / {total} mutants ({100.0 * killed / max(total, 1):.1f}%), "
          f"{len(survived)} survived, {len(known)} known survivors, {n_eq} equivalent, {n_nr} not run on this CPU, "
          f"{len(stillborn)} did not build; "
          f"{time.time() - t0:.0f} s")
    for m in survived:
        print(f"  SURVIVED {m.name} ({m.file}, ran {' '.join(m.tests or ['test_arm'])}): see {logdir}/{m.name}.log")
    for m in known:
        print(f"  known survivor {m.name}: {m.survives}")
    for m in stillborn:
        print(f"  DID NOT BUILD {m.name}: see {logdir}/{m.name}.log")
    if a.report:
        with open(a.report, "w") as f:
            f.write("| mutant | file | tests | verdict | seconds |\n|---|---|---|---|---|\n")
            for m, v, dt in results:
                tl = "test_arm (qemu)" if m.runner == "arm" else " ".join(m.tests)
                why = f": {m.equivalent}" if m.equivalent else f": {m.survives}" if v == "known survivor" else ""
                f.write(f"| {m.name} | {m.file} | {tl} | {v}{why} | {dt:.0f} |\n")
            f.write(f"\n{killed} killed / {total} mutants run, {len(survived)} survived, "
                    f"{len(known)} known survivors, {n_eq} equivalent, "
                    f"{n_nr} not run on this CPU\n")
    if stillborn:
        return 2
    print(f"{killed} passed, {len(survived)} failed, {len(known) + n_eq + n_nr} skipped")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
