#!/usr/bin/env python3
"""Scores a VLM (an LLM GGUF and an mmproj) on held-out synthetic scenes through the real
command-line tools, one process per question, greedy decoding:

    eval.py --nanomind build/nanomind -m LLM.gguf --mmproj MM.gguf [-n 500] [--seed 4242]
            [--llama-mtmd-cli PATH] [-j 2] [--json OUT.json] [--min colour=0.95,count=0.9,...]

Scene i of the set asks one question of category i % 4: the colour and the shape of a single
shape, how many shapes there are (1-4), where the shape of a given colour is (quadrants).
An answer counts when the reply, stripped, is the expected answer exactly. With
--llama-mtmd-cli, llama.cpp's mtmd-cli (built locally; --jinja, so its prompt is ours: the
model's own template with its default system turn, the image before the question) answers
the same questions, and the agreement of the two tools is reported. --min makes the exit
status 1 when a category's accuracy is under its bound (a test's use). Images are written as
PPM files into a temporary directory that is removed at the end.
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scenes  # noqa: E402

CATS = ("colour", "shape", "count", "position")


def ask_nanomind(a, img, q):
    cmd = [a.nanomind, "run", "-m", a.model, "--mmproj", a.mmproj, "--image", img, "--chat", "-p", q,
           "--temp", "0", "-n", "12", "-t", "1"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(cmd), r.returncode, r.stderr[-400:]))
    return r.stdout.strip()


def ask_llama(a, img, q):
    cmd = [a.llama_mtmd_cli, "-m", a.model, "--mmproj", a.mmproj, "--image", img, "-p", q, "--temp", "0",
           "-n", "12", "--jinja", "-t", "1", "--no-warmup"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(cmd), r.returncode, r.stderr[-400:]))
    return r.stdout.strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nanomind", required=True)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--mmproj", required=True)
    ap.add_argument("-n", type=int, default=500)
    ap.add_argument("--seed", type=int, default=4242, help="held-out: the training stream is seed 1")
    ap.add_argument("--llama-mtmd-cli")
    ap.add_argument("-j", type=int, default=2)
    ap.add_argument("--json")
    ap.add_argument("--min", default="", help="e.g. colour=0.95,count=0.9")
    a = ap.parse_args()
    bounds = {}
    for item in filter(None, a.min.split(",")):
        k, v = item.split("=")
        if k not in CATS:
            ap.error("--min: unknown category '%s' (%s)" % (k, ", ".join(CATS)))
        bounds[k] = float(v)
    rows = []
    with tempfile.TemporaryDirectory(prefix="nm-vlm-eval-") as tmp:
        jobs = []
        for i, (img, cat, q, ans) in enumerate(scenes.eval_set(a.seed, a.n)):
            path = os.path.join(tmp, "%04d.ppm" % i)
            scenes.write_ppm(path, img)
            jobs.append((i, path, cat, q, ans))

        def one(job):
            i, path, cat, q, ans = job
            ours = ask_nanomind(a, path, q)
            theirs = ask_llama(a, path, q) if a.llama_mtmd_cli else None
            return {"i": i, "category": cat, "question": q, "expected": ans, "nanomind": ours, "llama": theirs}

        with concurrent.futures.ThreadPoolExecutor(a.j) as ex:
            rows = list(ex.map(one, jobs))
    res = {"n": a.n, "seed": a.seed, "model": os.path.basename(a.model), "mmproj": os.path.basename(a.mmproj)}
    ok = True
    for c in CATS:
        sel = [r for r in rows if r["category"] == c]
        if not sel:
            continue
        acc = sum(r["nanomind"] == r["expected"] for r in sel) / len(sel)
        res[c] = {"n": len(sel), "accuracy": acc}
        line = "%-9s %3d questions  nanomind %5.1f%%" % (c, len(sel), 100 * acc)
        if a.llama_mtmd_cli:
            res[c]["llama_accuracy"] = sum(r["llama"] == r["expected"] for r in sel) / len(sel)
            res[c]["agreement"] = sum(r["llama"] == r["nanomind"] for r in sel) / len(sel)
            line += "  llama.cpp %5.1f%%  same answer %5.1f%%" % (100 * res[c]["llama_accuracy"],
                                                                  100 * res[c]["agreement"])
        if c in bounds and acc < bounds[c]:
            ok = False
            line += "  UNDER %.1f%%" % (100 * bounds[c])
        print(line)
    if a.llama_mtmd_cli:
        res["agreement"] = sum(r["llama"] == r["nanomind"] for r in rows) / len(rows)
        print("same answer from both tools: %.1f%% of %d" % (100 * res["agreement"], len(rows)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"summary": res, "answers": rows}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
