#!/usr/bin/env python3
"""The mutation harness's shards and report (tests/mutation/mutate.py), without building anything.

  shard_partition       for N = 1..12, the N shards of the real mutants hold each exactly once, in
                        order, the same on every call; a mutant keeps its shard when half the
                        others go; --shard K/N parsing
  report_roundtrip      rows appended (the header once) read back by key with their verdicts, a
                        '|' in a reason escaped; a report of the old format (no keys) starts anew,
                        --fresh empties one
  key_staleness         the key changes with each field of the mutant, the time limit and the tree,
                        and only then
  tree_digest           in a scratch git repository: follows tracked and untracked files, not
                        ignored ones, mutants.txt or the report
  resume_through_main   mutate.py --only A B C --report R (in a git repository of its own), with A and
                        B recorded for this tree and C an equivalent mutant: nothing is built (no
                        scratch), C's row is appended, a second run runs nothing; a row of another
                        tree is not taken, and after a change to a source none is (the build that
                        follows meets a cmake that fails at once: exit 2); a bad --shard is exit 2
  interrupted_run_resumes  with a cmake that succeeds and a ctest that fails (every mutant killed),
                        Ctrl-C while the second mutant's tests hang: exit 130, the first mutant's row
                        written, the second's file restored and its tests killed; the same command
                        then runs the second and third only
  copy_tree_follows_moves  a source moved to another folder leaves the scratch copy too (CI's sample,
                        2026-12-06: a scratch kept from before src/io/ linked the image decoders twice);
                        the harness's builds stay
  no_targets_no_build   a mutant whose tests need no program builds nothing (an empty --target list is
                        no build, not a failed one)

Prints "N passed, N failed, N skipped".
"""
import copy
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MUTATE = os.path.join(HERE, "mutate.py")
spec = importlib.util.spec_from_file_location("mutate", MUTATE)
M = importlib.util.module_from_spec(spec)
spec.loader.exec_module(M)

results = {"passed": 0, "failed": 0}


def case(fn):
    try:
        fn()
        print("ok   %s" % fn.__name__)
        results["passed"] += 1
    except Exception as e:
        print("FAIL %s: %s%s" % (fn.__name__, "" if isinstance(e, AssertionError) else type(e).__name__ + ": ", e))
        results["failed"] += 1
    return fn


MUTANTS = M.parse(M.DEFS)


@case
def shard_partition():
    names = [m.name for m in MUTANTS]
    for n in range(1, 13):
        parts = [M.shard(MUTANTS, k, n) for k in range(1, n + 1)]
        got = [m.name for p in parts for m in p]
        assert sorted(got) == sorted(names) and len(got) == len(set(got)), "N=%d: not a partition" % n
        for p in parts:
            idx = [names.index(m.name) for m in p]
            assert idx == sorted(idx), "N=%d: a shard out of the definitions' order" % n
        assert [[m.name for m in M.shard(MUTANTS, k, n)] for k in range(1, n + 1)] == \
            [[m.name for m in p] for p in parts], "N=%d: another call gave other shards" % n
        if n <= 8:
            assert all(len(p) >= len(MUTANTS) // (2 * n) for p in parts), \
                "N=%d: a shard of %s" % (n, [len(p) for p in parts])
        half = MUTANTS[::2]
        for k in range(1, n + 1):
            assert [m.name for m in M.shard(half, k, n)] == [m.name for m in parts[k - 1] if m in half], \
                "N=%d: mutants changed shard when others went" % n
    assert M.parse_shard("2/5") == (2, 5) and M.parse_shard("1/1") == (1, 1)
    for bad in ("0/5", "6/5", "2", "a/b", "2/5/1", "", "-1/3", "1/0"):
        try:
            M.parse_shard(bad)
        except ValueError:
            continue
        raise AssertionError("--shard %r accepted" % bad)


def mutant(name, **kw):
    m = M.Mutant(name, 1)
    m.file, m.tests, m.old, m.new = "src/x.c", ["test_x"], ["a = 1;"], ["a = 2;"]
    for k, v in kw.items():
        setattr(m, k, v)
    return m


@case
def report_roundtrip():
    d = tempfile.mkdtemp(prefix="nm-test-mutate-")
    try:
        r = os.path.join(d, "sub", "report.md")
        a, b = mutant("a"), mutant("b", equivalent="x | y: z")
        c = mutant("c", survives="known: why")
        M.report_append(r, a, "killed", 12.4, "abc1234", "0123456789abcdef")
        M.report_append(r, b, "equivalent", 0, "abc1234+", "1111111111111111")
        M.report_append(r, c, "known survivor", 3, "abc1234", "2222222222222222")
        text = open(r).read()
        assert text.startswith(M.REPORT_HEAD) and text.count(M.REPORT_HEAD) == 1, "the header, once:\n" + text
        assert "x \\| y: z" in text, "a '|' in a reason is not escaped:\n" + text
        rows = M.report_rows(r)
        assert rows == {"0123456789abcdef": ("a", "killed", 12.0), "1111111111111111": ("b", "equivalent", 0.0),
                        "2222222222222222": ("c", "known survivor", 3.0)}, rows
        assert M.report_rows(os.path.join(d, "none.md")) == {}
        M.report_start(r, False)  # ours: kept
        assert M.report_rows(r) == rows
        M.report_start(r, True)  # --fresh
        assert open(r).read() == "" and M.report_rows(r) == {}
        with open(r, "w") as f:  # the old format: a table without keys and a summary line
            f.write("| mutant | file | tests | verdict | seconds |\n|---|---|---|---|---|\n| a | f | t | killed | 3 |\n"
                    "\n1 killed / 1 mutants run\n")
        M.report_start(r, False)
        assert open(r).read() == "", "an old-format report was kept"
        M.report_append(r, a, "survived", 1, "abc1234", "3333333333333333")
        assert M.report_rows(r) == {"3333333333333333": ("a", "survived", 1.0)}
    finally:
        shutil.rmtree(d)


@case
def key_staleness():
    base = mutant("m", env={"K": "1"})
    k0 = M.mutant_key(base, "t" * 64, 600)
    assert k0 == M.mutant_key(copy.deepcopy(base), "t" * 64, 600) and len(k0) == 16
    for field, value in (("name", "n"), ("file", "src/y.c"), ("old", ["a = 3;"]), ("new", ["a = 3;"]),
                         ("tests", ["test_y"]), ("env", {"K": "2"}), ("runner", "arm"), ("equivalent", "why"),
                         ("survives", "why"), ("needs", ["avx512f"])):
        m = copy.deepcopy(base)
        setattr(m, field, value)
        assert M.mutant_key(m, "t" * 64, 600) != k0, "the key ignores %s" % field
    assert M.mutant_key(base, "u" * 64, 600) != k0, "the key ignores the tree"
    assert M.mutant_key(base, "t" * 64, 150) != k0, "the key ignores the time limit"


GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]


def write(d, rel, text):
    os.makedirs(os.path.dirname(os.path.join(d, rel)), exist_ok=True)
    with open(os.path.join(d, rel), "w") as f:
        f.write(text)


def git_repo(d, files):
    """A scratch git repository in d: files (path: text) written and committed."""
    for rel, text in files.items():
        write(d, rel, text)
    subprocess.run(GIT + ["init", "-q", d], check=True)
    subprocess.run(GIT + ["add", "."], cwd=d, check=True)
    subprocess.run(GIT + ["commit", "-qm", "x"], cwd=d, check=True)


@case
def tree_digest():
    d = tempfile.mkdtemp(prefix="nm-test-mutate-git-")
    try:
        def w(rel, text):
            write(d, rel, text)
        git_repo(d, {".gitignore": "/build/\n", "src/a.c": "int a;\n", "tests/mutation/mutants.txt": "name: x\n",
                     "report.md": ""})
        rep = os.path.join(d, "report.md")
        t0 = M.tree_digest(d, skip=[rep])
        assert t0 == M.tree_digest(d, skip=[rep])
        w("tests/mutation/mutants.txt", "name: y\n")
        w("report.md", "| a | row |\n")
        w("build/x.o", "object")
        assert M.tree_digest(d, skip=[rep]) == t0, "mutants.txt, the report or an ignored file changed the digest"
        w("src/a.c", "int a = 1;\n")
        t1 = M.tree_digest(d, skip=[rep])
        assert t1 != t0, "a changed source kept the digest"
        w("src/new.c", "int b;\n")  # untracked, not ignored: the harness copies it
        assert M.tree_digest(d, skip=[rep]) != t1, "an untracked source kept the digest"
        assert "src/new.c" in M.tree_files(d) and "build/x.o" not in M.tree_files(d)
    finally:
        shutil.rmtree(d)


@case
def resume_through_main():
    eq = [m for m in MUTANTS if m.equivalent]
    live = [m for m in MUTANTS if not m.equivalent and not m.survives and not m.needs and m.runner == "ctest"]
    assert eq and len(live) >= 2
    a, b, c = live[0], live[1], eq[0]
    d = tempfile.mkdtemp(prefix="nm-test-mutate-main-")
    try:
        # the harness, its definitions and the three mutants' files in a git repository of their own
        # (the scratch tree of a mutation run, where this test also runs, is no git checkout)
        root = os.path.join(d, "repo")
        for rel in ("tests/mutation/mutate.py", "tests/mutation/mutants.txt", a.file, b.file, c.file):
            os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            shutil.copyfile(os.path.join(M.ROOT, rel), os.path.join(root, rel))
        subprocess.run(["git", "init", "-q", root], check=True)
        rep, scratch = os.path.join(d, "report.md"), os.path.join(d, "scratch")
        tree = M.tree_digest(root, skip=[rep])
        M.report_append(rep, a, "killed", 5, "x", M.mutant_key(a, tree, 600))
        M.report_append(rep, b, "killed", 7, "x", M.mutant_key(b, tree, 600))
        M.report_append(rep, c, "killed", 1, "x", M.mutant_key(c, "0" * 64, 600))  # another tree's: stale
        cmd = [sys.executable, os.path.join(root, "tests", "mutation", "mutate.py"), "--only", a.name, b.name, c.name,
               "--report", rep, "--scratch", scratch]
        # cmake and ctest that fail at once: if a recorded mutant were not taken, no real build starts
        fake = os.path.join(d, "bin")
        os.makedirs(fake)
        for tool in ("cmake", "ctest"):
            with open(os.path.join(fake, tool), "w") as f:
                f.write("#!/bin/sh\nexit 97\n")
            os.chmod(os.path.join(fake, tool), 0o755)
        env = dict(os.environ, PATH=fake + os.pathsep + os.environ.get("PATH", ""))
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
        assert p.returncode == 0, "exit %d\n%s%s" % (p.returncode, p.stdout, p.stderr)
        assert "2 recorded in %s for this tree, 1 to run" % rep in p.stdout, p.stdout
        assert not os.path.exists(scratch), "a scratch tree was made: nothing needed building"
        rows = M.report_rows(rep)
        assert rows.get(M.mutant_key(c, tree, 600), (None, None))[1] == "equivalent", rows
        assert len(rows) == 4
        assert "2 passed, 0 failed, 1 skipped" in p.stdout, p.stdout
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
        assert p.returncode == 0 and "3 recorded in %s for this tree, 0 to run" % rep in p.stdout, p.stdout
        assert len(M.report_rows(rep)) == 4, "rows added by a run with nothing to run"
        with open(os.path.join(root, a.file), "a") as f:  # the tree changes: every row is stale
            f.write("\n")
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
        assert p.returncode == 2 and "0 recorded in %s for this tree, 3 to run" % rep in p.stdout, \
            "exit %d\n%s%s" % (p.returncode, p.stdout, p.stderr)
        p = subprocess.run([sys.executable, MUTATE, "--shard", "4/3", "--report", rep], capture_output=True, text=True)
        assert p.returncode == 2 and "--shard" in p.stderr, p.stderr
    finally:
        shutil.rmtree(d)


@case
def interrupted_run_resumes():
    live = [m for m in MUTANTS if not m.equivalent and not m.survives and not m.needs and m.runner == "ctest"]
    a, b, c = live[2], live[3], live[4]
    d = tempfile.mkdtemp(prefix="nm-test-mutate-int-")
    try:
        root = os.path.join(d, "repo")
        for rel in ("tests/mutation/mutate.py", "tests/mutation/mutants.txt", a.file, b.file, c.file):
            os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            shutil.copyfile(os.path.join(M.ROOT, rel), os.path.join(root, rel))
        subprocess.run(["git", "init", "-q", root], check=True)
        rep, scratch, state = (os.path.join(d, x) for x in ("report.md", "scratch", "state"))
        os.makedirs(state)
        # cmake that succeeds; ctest that passes the baseline and fails each mutant (killed), but in
        # MODE=hang hangs on the second mutant, where this test interrupts the run
        fake = os.path.join(d, "bin")
        os.makedirs(fake)
        with open(os.path.join(fake, "cmake"), "w") as f:
            f.write('#!/bin/sh\nwhile [ $# -gt 0 ]; do [ "$1" = -B ] && mkdir -p "$2"; shift; done\nexit 0\n')
        with open(os.path.join(fake, "ctest"), "w") as f:
            f.write('#!/bin/sh\ncase " $* " in *" --stop-on-failure "*) ;; *) exit 0;; esac\n'
                    'n=$(cat "$STATE/n" 2>/dev/null || echo 0); n=$((n + 1)); echo $n > "$STATE/n"\n'
                    'if [ "$MODE" = hang ] && [ $n -eq 2 ]; then echo $$ > "$STATE/hang.pid"; exec sleep 60; fi\n'
                    'exit 1\n')
        for t in ("cmake", "ctest"):
            os.chmod(os.path.join(fake, t), 0o755)
        env = dict(os.environ, PATH=fake + os.pathsep + os.environ.get("PATH", ""), STATE=state)
        cmd = [sys.executable, os.path.join(root, "tests", "mutation", "mutate.py"), "--only", a.name, b.name, c.name,
               "--report", rep, "--scratch", scratch]
        p = subprocess.Popen(cmd, env=dict(env, MODE="hang"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        pidf = os.path.join(state, "hang.pid")
        for _ in range(600):
            if os.path.exists(pidf) and open(pidf).read().strip() or p.poll() is not None:
                break
            time.sleep(0.05)
        if not os.path.exists(pidf):
            p.kill()
            out, err = p.communicate()
            raise AssertionError("the second mutant's tests never started:\n%s%s" % (out, err))
        hung = int(open(pidf).read())
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 130 and "resumes" in err, "exit %d\n%s%s" % (p.returncode, out, err)
        rows = M.report_rows(rep)
        assert sorted(r[0] for r in rows.values()) == [a.name] and list(rows.values())[0][1] == "killed", rows
        mutated = os.path.join(scratch, "tree", b.file)
        assert open(mutated).read() == open(os.path.join(root, b.file)).read(), "the interrupted mutant stayed applied"
        try:
            os.kill(hung, signal.SIGKILL)
            raise AssertionError("the interrupted mutant's tests still ran (pid %d, killed now)" % hung)
        except ProcessLookupError:
            pass
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, "exit %d\n%s%s" % (p.returncode, p.stdout, p.stderr)
        assert "1 recorded in %s for this tree, 2 to run" % rep in p.stdout, p.stdout
        assert sorted(r[0] for r in M.report_rows(rep).values()) == sorted([a.name, b.name, c.name])
        assert "3 passed, 0 failed, 0 skipped" in p.stdout, p.stdout
    finally:
        shutil.rmtree(d)



@case
def copy_tree_follows_moves():
    d = tempfile.mkdtemp(prefix="nm-test-mutate-git-")
    scratch = tempfile.mkdtemp(prefix="nm-test-mutate-scratch-")
    try:
        git_repo(d, {"src/a.c": "int a;\n", "src/old/b.c": "int b;\n"})
        tree = M.copy_tree(scratch, root=d)
        assert os.path.isfile(os.path.join(tree, "src/old/b.c"))
        os.makedirs(os.path.join(tree, "build-mutate/src/old"))
        with open(os.path.join(tree, "build-mutate/src/old/b.c.o"), "w") as f:
            f.write("object")
        os.makedirs(os.path.join(d, "src/new"))
        subprocess.run(GIT + ["mv", "src/old/b.c", "src/new/b.c"], cwd=d, check=True)
        M.copy_tree(scratch, root=d)
        assert not os.path.exists(os.path.join(tree, "src/old/b.c")), "the moved source stayed in the copy"
        assert open(os.path.join(tree, "src/new/b.c")).read() == "int b;\n"
        assert os.path.isfile(os.path.join(tree, "src/a.c"))
        assert os.path.isfile(os.path.join(tree, "build-mutate/src/old/b.c.o")), "the harness's build went"
    finally:
        shutil.rmtree(d)
        shutil.rmtree(scratch)


@case
def no_targets_no_build():
    # a mutant whose tests need no program of ours (the harness's own) builds nothing: before, an empty
    # --target list made cmake fail and the mutant counted as one that did not build (CI's sample, 2026-12-06)
    d = tempfile.mkdtemp(prefix="nm-mutate-test-")
    try:
        log = os.path.join(d, "log")
        assert M.targets_of(["mutation_harness"]) == [], M.targets_of(["mutation_harness"])
        assert M.build_targets(os.path.join(d, "no-build-dir"), 2, [], d, log) == 0
        assert not os.path.exists(log) or "cmake" not in open(log).read(), "cmake ran for no target"
        assert M.build_targets(os.path.join(d, "no-build-dir"), 2, ["x"], d, log) != 0  # (a real build fails there)
    finally:
        shutil.rmtree(d)

@case
def in_place_mutates_and_restores():
    # --in-place BUILD --tested (CI, after make test): the mutant goes into the tree's own file, is built in
    # BUILD without configuring it, its tests run once (no baseline run), and the file comes back as it was
    live = [m for m in MUTANTS if not m.equivalent and not m.survives and not m.needs and m.runner == "ctest"]
    a = live[5]
    d = tempfile.mkdtemp(prefix="nm-test-mutate-inplace-")
    try:
        root = os.path.join(d, "repo")
        for rel in ("tests/mutation/mutate.py", "tests/mutation/mutants.txt", a.file):
            os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            shutil.copyfile(os.path.join(M.ROOT, rel), os.path.join(root, rel))
        subprocess.run(["git", "init", "-q", root], check=True)
        before = open(os.path.join(root, a.file)).read()
        build = os.path.join(d, "build")
        os.makedirs(build)
        fake, seen = os.path.join(d, "bin"), os.path.join(d, "seen")
        os.makedirs(fake)
        shutil.copyfile(os.path.join(root, a.file), os.path.join(d, "orig"))
        # cmake records its arguments; ctest records whether the tree's file holds the mutant, then fails
        with open(os.path.join(fake, "cmake"), "w") as f:
            f.write('#!/bin/sh\necho "cmake $*" >> %s\nexit 0\n' % seen)
        with open(os.path.join(fake, "ctest"), "w") as f:
            f.write('#!/bin/sh\nif cmp -s %s %s; then echo "ctest clean" >> %s; else echo "ctest mutated" >> %s; fi\n'
                    'exit 1\n' % (os.path.join(d, "orig"), os.path.join(root, a.file), seen, seen))
        for tool in ("cmake", "ctest"):
            os.chmod(os.path.join(fake, tool), 0o755)
        env = dict(os.environ, PATH=fake + os.pathsep + os.environ.get("PATH", ""))
        cmd = [sys.executable, os.path.join(root, "tests", "mutation", "mutate.py"), "--only", a.name,
               "--scratch", os.path.join(d, "scratch"), "--in-place", build, "--tested"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
        assert p.returncode == 2 and "not a build directory" in p.stderr, p.stderr  # (no CMakeCache.txt yet)
        open(os.path.join(build, "CMakeCache.txt"), "w").close()
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
        assert p.returncode == 0 and "killed    " + a.name in p.stdout, "exit %d\n%s%s" % (p.returncode, p.stdout, p.stderr)
        log = open(seen).read().splitlines()
        assert [l for l in log if l.startswith("ctest")] == ["ctest mutated"], log  # once, on the mutated tree
        # the build last, after the file came back: its programs are the unmutated tree's again
        assert log[-1].startswith("cmake --build " + build) and log.index("ctest mutated") < len(log) - 1, log
        assert not any(" -S " in l for l in log) and all(build in l for l in log if l.startswith("cmake")), log
        assert open(os.path.join(root, a.file)).read() == before, "the tree's file was not restored"
        assert not os.path.exists(os.path.join(d, "scratch", "tree")), "a scratch copy was made"
        p = subprocess.run(cmd[:-3] + ["--tested"], capture_output=True, text=True, timeout=120, env=env)
        assert p.returncode == 2 and "--tested goes with --in-place" in p.stderr, p.stderr
    finally:
        shutil.rmtree(d)


print("%d passed, %d failed, 0 skipped" % (results["passed"], results["failed"]))
sys.exit(1 if results["failed"] else 0)
