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
  tests/mutation/mutate.py --shard K/N     shard K of N of the selection (make mutate SHARD=K/N)
  tests/mutation/mutate.py --list          the mutants (of --shard's shard) and the tests they run
  tests/mutation/mutate.py --check         every search text occurs once (ctest mutants_texts)

In place (--in-place BUILD): the mutants are applied to this tree's own files
(each restored, with a new mtime, when its tests end) and built in BUILD, an
existing build of this tree, and the ARM mutants in test-arm's build-arm: what
CI runs on its fresh clone after `make test`, so nothing is built twice; the
programs are rebuilt from the restored tree at the end. With
--tested (only with --in-place) the baseline run is left out: BUILD's tests
have just passed on the unmutated tree (CI runs it only after `make test`
succeeded). Not for a working tree: a run killed mid-way leaves a mutant in it.

Options: --scratch DIR (default /tmp/nm-mutate, or $NM_MUTATE_DIR), --report FILE
(see below), --fresh (start the report anew), --timeout S (for all of one
mutant's tests, default 600: they stop at the first that fails, and a mutant
that makes them hang is killed, with every process it started, when the time
is up), --jobs N (build jobs). Exit status: 0 when every mutant of the
selection was killed (or was declared equivalent), 1 when one survived, 2 when
the harness itself could not run (a search text not found, a mutant that does
not build, the unmutated tree failing its own tests, the scratch in use).

Shards: --shard K/N keeps the mutants whose name hashes to K of 1..N (sha256 of
the name, mod N): the N shards partition any selection, each mutant in exactly
one, and a mutant keeps its shard when others are added or removed.

The report (--report FILE) is one Markdown table that accumulates: a row is
appended, under a lock, as each mutant ends, so shards and interrupted runs
add to the same file. Each row carries a key, the first 16 hex digits of a
sha256 of what its verdict depends on: the mutant's definition (name, file,
search and replacement text, tests, env, runner, equivalent/survives/needs),
the time limit, and the tree: every file the harness copies (tracked and
unignored), by path and content, but tests/mutation/mutants.txt (a mutant's
own text is in its key, so adding or editing one leaves the others' rows good)
and the report itself. A run with a report skips each selected mutant whose
key is already in it, so a run stopped half-way resumes at the first mutant
without a row, and the summary and exit status cover the recorded and the new
results together; any change to the tree makes every row stale (kept, never
matched again). --fresh empties the report first (every shard's rows go).
One scratch serves one run at a time (a lock); shards run side by side need a
--scratch each.

Before any mutant, the unmutated scratch tree must pass every test the
selected mutants will run: otherwise every mutant would look killed. A run
whose mutants are all recorded builds nothing.

Tooling only: Python is not part of the runtime.
"""
import argparse
import fcntl
import hashlib
import json
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
    call: the mmproj writer, the requantizer), public_api (what it installs)
    and spin (no program of ours)."""
    extra = {"cli": ["nanomind", "nm-genmmproj", "nm_vcam_preload"], "cli_bad_input": ["nanomind", "nm-requant"], "cli_fuzz_flags": ["nanomind"], "cli_power": ["nanomind", "nm-genmmproj"], "server": ["nanomind", "nm-genmodel"], "convert_whisper_ct2": ["nanomind"], "convert_piper": [], "piper_ort": ["test_piper"], "piper_phonemes": ["test_piper"], "fetch_models": [], "mutation_harness": [], "gen_tools_flags": ["nm-genmodel", "nm-genmmproj"], "vlm": ["nanomind", "nm-genmodel", "nm-genmmproj"], "spin_tabm": [], "public_api": ["nanomind", "nanomind_static", "nanomind_shared"],
             "test_transcribe_avx2": ["test_transcribe"], "golden_test_perplexity_avx2": ["golden_test_perplexity"],
             "golden_test_perplexity_avx2vnni": ["golden_test_perplexity"]}
    return sorted({t for test in tests for t in extra.get(test, [test])})


def build_targets(build, jobs, targets, tree, log):
    """Builds the targets (none: nothing to build, as for the harness's own test); 0 on success."""
    if not targets:
        return 0
    return run(["cmake", "--build", build, f"-j{jobs}", "--target"] + targets, tree, log)


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
        except BaseException:  # Ctrl-C: the tests it started stop too
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            raise


def tree_files(root=ROOT):
    """The files the harness copies: tracked and unignored plain files (no links), sorted."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root,
                           stdout=subprocess.PIPE, check=True).stdout.decode().split("\0")
    return sorted({rel for rel in files if rel and os.path.isfile(os.path.join(root, rel)) and
                   not os.path.islink(os.path.join(root, rel))})


def tree_digest(root=ROOT, skip=()):
    """sha256 of the tree a run tests: each file tree_files lists, path and content, but the
    mutant definitions (each mutant's text goes into its own key) and the paths in skip."""
    skip = {os.path.realpath(p) for p in skip}
    h = hashlib.sha256()
    for rel in tree_files(root):
        path = os.path.join(root, rel)
        if rel == "tests/mutation/mutants.txt" or os.path.realpath(path) in skip:
            continue
        with open(path, "rb") as f:
            h.update(rel.encode() + b"\0" + hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def mutant_key(m, tree, timeout):
    """The report's key of a verdict: 16 hex digits of a sha256 of what it depends on."""
    what = [m.name, m.file, m.old, m.new, m.tests, sorted(m.env.items()), m.runner, m.equivalent, m.survives,
            m.needs, timeout, tree]
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:16]


def parse_shard(text):
    """'K/N' -> (K, N) with 1 <= K <= N; ValueError otherwise."""
    m = re.fullmatch(r"([0-9]+)/([0-9]+)", text or "")
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise ValueError(f"--shard {text!r}: expected K/N with 1 <= K <= N")
    return int(m.group(1)), int(m.group(2))


def shard_of(name, n):
    """A mutant's shard, 1..n: from a hash of its name, so that it stays put when others come or go."""
    return int(hashlib.sha256(name.encode()).hexdigest(), 16) % n + 1


def shard(mutants, k, n):
    """The mutants of shard k of n, in their order."""
    return [m for m in mutants if shard_of(m.name, n) == k]


REPORT_HEAD = ("| mutant | file | tests | verdict | seconds | commit | key |\n"
               "|---|---|---|---|---|---|---|\n")


def report_rows(path):
    """{key: (mutant, verdict, seconds)} of a report's rows (a missing file: none). The verdict is
    its first word(s), without the reason after ':'."""
    rows = {}
    try:
        f = open(path)
    except FileNotFoundError:
        return rows
    with f:
        for line in f:
            cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            if len(cells) == 7 and re.fullmatch(r"[0-9a-f]{16}", cells[6]):
                secs = float(cells[4]) if re.fullmatch(r"[0-9]+(\.[0-9]*)?", cells[4]) else 0.0
                rows[cells[6]] = (cells[0], cells[3].split(":")[0], secs)
    return rows


def report_append(path, m, verdict, seconds, commit, key):
    """Appends one row (the header first into an empty file), under an exclusive lock."""
    tl = "test_arm (qemu)" if m.runner == "arm" else " ".join(m.tests)
    why = f": {m.equivalent}" if m.equivalent else f": {m.survives}" if verdict == "known survivor" else ""
    cells = [m.name, m.file, tl, verdict + why, f"{seconds:.0f}", commit, key]
    row = "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |\n"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        if os.fstat(f.fileno()).st_size == 0:
            f.write(REPORT_HEAD)
        f.write(row)
        f.flush()
        os.fsync(f.fileno())


def report_start(path, fresh):
    """Empties the report for --fresh, or one that is not of this format (it has no keys to resume)."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        head = f.readline()
    if fresh or head != REPORT_HEAD.splitlines(True)[0]:
        if not fresh:
            print(f"mutate: {path} is not a report of this harness (no keys); starting it anew", flush=True)
        open(path, "w").close()


def commit_label():
    """HEAD's short id, + when the tree differs from it (for the reader; the key is what counts)."""
    try:
        c = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, check=True).stdout.decode().strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, check=True).stdout.strip()
        return c + ("+" if dirty else "")
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "?"


def copy_tree(scratch, root=ROOT):
    """The tracked and unignored files of the repository, into scratch/tree, and nothing else
    but the harness's builds."""
    tree = os.path.join(scratch, "tree")
    files = tree_files(root)
    # a file the repository no longer has goes from the copy too (a source moved
    # to another folder would otherwise be compiled twice); the builds stay
    keep = set(files)
    for dirpath, dirnames, filenames in os.walk(tree):
        if dirpath == tree:
            dirnames[:] = [d for d in dirnames if not d.startswith("build-mutate")]
        for name in filenames:
            path = os.path.join(dirpath, name)
            if os.path.relpath(path, tree) not in keep:
                os.remove(path)
    for rel in files:
        src, dst = os.path.join(root, rel), os.path.join(tree, rel)
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
    ap.add_argument("--fresh", action="store_true")
    ap.add_argument("--shard")
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--in-place", metavar="BUILD")
    ap.add_argument("--tested", action="store_true")
    a = ap.parse_args()
    if a.tested and not a.in_place:
        print("mutate: --tested goes with --in-place (a scratch tree's build has run no tests)", file=sys.stderr)
        return 2
    if a.in_place and not os.path.isfile(os.path.join(a.in_place, "CMakeCache.txt")):
        print(f"mutate: --in-place {a.in_place}: not a build directory of this tree (no CMakeCache.txt)",
              file=sys.stderr)
        return 2

    mutants = parse(DEFS)
    try:
        k, n = parse_shard(a.shard) if a.shard else (1, 1)
    except ValueError as e:
        print(f"mutate: {e}", file=sys.stderr)
        return 2
    if a.list:
        listed = shard(mutants, k, n)
        for m in listed:
            what = "arm (qemu)" if m.runner == "arm" else " ".join(m.tests)
            eq = f"  [equivalent: {m.equivalent}]" if m.equivalent else ""
            print(f"{m.name:44s} {m.file:44s} {what}{eq}")
        print(f"{len(listed)} mutants" + (f" (shard {a.shard} of {len(mutants)})" if a.shard else ""))
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
    chosen = shard(chosen, k, n)

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

    # What a report already holds for this tree is not run again (the docstring: the report).
    t0 = time.time()
    digest = tree_digest(ROOT, skip=[a.report] if a.report else [])
    keys = {m.name: mutant_key(m, digest, a.timeout) for m in chosen}
    recorded = {}
    if a.report:
        report_start(a.report, a.fresh)
        recorded = report_rows(a.report)
    results = [(m, recorded[keys[m.name]][1], recorded[keys[m.name]][2]) for m in chosen if keys[m.name] in recorded]
    todo = [m for m in chosen if keys[m.name] not in recorded]
    commit = commit_label()
    shard_note = f" (shard {a.shard})" if a.shard else ""
    print(f"mutate: {len(chosen)} of {len(mutants)} mutants{shard_note}: {len(results)} recorded in {a.report} "
          f"for this tree, {len(todo)} to run" if a.report else
          f"mutate: {len(chosen)} of {len(mutants)} mutants{shard_note}", flush=True)

    def record(m, verdict, dt):
        results.append((m, verdict, dt))
        if a.report:
            report_append(a.report, m, verdict, dt, commit, keys[m.name])

    live_now = [m for m in todo if not m.equivalent and m.name not in unrunnable]
    logdir = os.path.join(a.scratch, "logs")
    if live_now:
        os.makedirs(a.scratch, exist_ok=True)
        # one run at a time in a scratch: two would build and mutate the same copy
        lock = open(os.path.join(a.scratch, ".lock"), "w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            print(f"mutate: another mutate.py is running in {a.scratch}: give each concurrent shard "
                  f"its own --scratch (NM_MUTATE_DIR)", file=sys.stderr)
            return 2
        tree = ROOT if a.in_place else copy_tree(a.scratch)
        build = os.path.abspath(a.in_place) if a.in_place else os.path.join(tree, "build-mutate")
        os.makedirs(logdir, exist_ok=True)
        base_log = os.path.join(logdir, "_baseline.log")
        open(base_log, "w").close()
        print(f"mutate: scratch {tree}; logs {logdir}", flush=True)

    ctest_mut = [m for m in live_now if m.runner == "ctest"]
    arm_mut = [m for m in live_now if m.runner == "arm"]
    tests = sorted({t for m in ctest_mut for t in m.tests})
    targets = targets_of(tests)
    arm_build = "build-arm" if a.in_place else "build-mutate-arm"
    if ctest_mut:
        configure = [] if a.in_place else [["cmake", "-S", tree, "-B", build, "-DCMAKE_BUILD_TYPE=Release"]]
        if any(run(c, tree, base_log) != 0 for c in configure) or \
           build_targets(build, a.jobs, targets, tree, base_log) != 0:
            print(f"mutate: the unmutated tree does not build (see {base_log})", file=sys.stderr)
            return 2
        # under the environment each mutant runs them with (a filter to the cases that matter)
        groups = {}
        for m in ctest_mut:
            groups.setdefault(tuple(sorted(m.env.items())), set()).update(m.tests)
        rc = 0
        for env, ts in ([] if a.tested else sorted(groups.items())):
            rc = rc or run(["ctest", "-j1", "-R", "^(" + "|".join(sorted(ts)) + ")$"], build, base_log, env=dict(env))
        if rc != 0:
            print(f"mutate: the unmutated tree fails its tests (see {base_log})", file=sys.stderr)
            return 2
    if arm_mut and not a.tested:
        if run(["bash", "scripts/test_arm.sh"], tree, base_log, env={"BUILD_ARM": arm_build}) != 0:
            print(f"mutate: the unmutated tree fails test_arm (see {base_log})", file=sys.stderr)
            return 2
    if live_now:
        print(f"mutate: baseline {'built (its tests passed before: --tested)' if a.tested else 'green'} "
              f"({time.time() - t0:.0f} s)", flush=True)

    for m in todo:
        if m.equivalent:
            record(m, "equivalent", 0.0)
            print(f"  equivalent {m.name}: {m.equivalent}", flush=True)
            continue
        if m.name in unrunnable:
            record(m, "not run", 0.0)
            print(f"  not run   {m.name}: this CPU lacks {' '.join(sorted(set(m.needs) - flags))}", flush=True)
            continue
        path = os.path.join(tree, m.file)
        orig = open(path).read()
        log = os.path.join(logdir, m.name + ".log")
        if os.path.exists(log):
            os.remove(log)  # an earlier run's, interrupted or stale
        t1 = time.time()
        try:
            with open(path, "w") as f:
                f.write(m.apply(orig))
            if m.runner == "arm":
                rc = run(["bash", "scripts/test_arm.sh"], tree, log,
                         env=dict(m.env, BUILD_ARM=arm_build), timeout=a.timeout)
                # a compiler diagnostic (file:line:col: error:) or make's failure, not a test's message
                built = not re.search(r"^\S+:\d+:\d+: error:|^g?make(\[\d+\])?: \*\*\*", open(log).read(), re.M)
            else:
                mt = targets_of(m.tests)
                built = build_targets(build, a.jobs, mt, tree, log) == 0
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
        record(m, verdict, dt)
        print(f"  {verdict:9s} {m.name} ({dt:.0f} s)", flush=True)

    # in place, the build is left as it was found: its programs rebuilt from the restored tree (the last
    # mutant's objects would stay in them otherwise)
    if a.in_place and ctest_mut and build_targets(build, a.jobs, targets, tree, base_log) != 0:
        print(f"mutate: the restored tree does not build in {build} (see {base_log})", file=sys.stderr)
        return 2
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
    if stillborn:
        return 2
    print(f"{killed} passed, {len(survived)} failed, {len(known) + n_eq + n_nr} skipped")
    return 1 if survived else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # the mutated file is restored (finally); the report has every finished mutant
        print("\nmutate: interrupted; the same command resumes after the last mutant recorded", file=sys.stderr)
        sys.exit(130)
