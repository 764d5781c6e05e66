#!/usr/bin/env python3
"""The trained test VLM (tests/data/vlm, docs/vlm.md) answers questions about held-out
synthetic scenes through `nanomind run --mmproj --image --chat`: an image reaches the
language model with its meaning intact.

usage: test_vlm.py path/to/nanomind
One case per question category (colour, shape, count, position), each on the same fixed
held-out scenes (tools/train_vlm/scenes.py, seed 4242, 12 questions a category), greedy;
a case passes when its accuracy reaches the bound below (what the fixture gives on these
questions less a margin, so that another CPU's rounding may flip an unsure answer; on 500
scenes it gives colour 100%, shape 97.6%, count 97.6%, position 100%: docs/vlm.md). Without the default LLM every
case is a skip (a failure under NM_CI). Prints "N passed, N failed, N skipped".

Qwen2-VL (qwen2vl_*): a random-weight `qwen2vl` LLM (nm-genmodel, SmolLM2's tokenizer, d 256)
and a `qwen2vl_merger` mmproj (nm-genmmproj), both from fixed seeds, answer "What is it?" about
three images of three aspect ratios (320x200, 120x300, 224x224: 77, 44 and 64 image tokens after
the resize to 28-pixel cells), and two of them again with llama.cpp's token limits
(--image-max-tokens 20: 320x200 down to 15 tokens, 5 x 3; --image-min-tokens 120: 120x300 up to
126, 7 x 18; both at 100: 120x300 up to 112, 7 x 16, past the most as llama.cpp rounds it);
the 24 greedy tokens must be byte for byte what llama.cpp's llama-mtmd-cli gave on the same files
and flags (tests/data/qwen2vl/README.md): the encoder, the preprocessing, the markers and the
decoder's M-RoPE positions all agree. The six answers must differ from each other (the image
and its size reach the decoder), and an mmproj of another width than the LLM is refused with a
message naming both.
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NM = os.path.abspath(sys.argv[1])
MODELS = os.environ.get("NM_MODEL_DIR", os.path.expanduser("~/.cache/nanomind/models"))
LLM = os.path.join(MODELS, "SmolLM2-135M-Instruct.Q4_1.gguf")
MMPROJ = os.path.join(ROOT, "tests", "data", "vlm", "vlm-mmproj-q8_0.gguf")
CI = os.environ.get("NM_CI", "0") not in ("", "0")
N_PER_CATEGORY = 12
# measured on these 48 questions (Zen 4, 2026-12-05): 12/12 in each category
BOUNDS = {"colour": 0.95, "shape": 0.9, "count": 0.9, "position": 0.9}


def qwen2vl_images(d):
    """The three test images (deterministic: numpy's PCG64), as PPM files in d."""
    import numpy as np
    rng = np.random.default_rng(7)
    names = []
    for w, h in ((320, 200), (120, 300), (224, 224)):
        a = rng.random((h, w, 3)) * 255
        a = a * 0.3 + np.sin(np.arange(w)[None, :, None] / 17.0 + np.arange(h)[:, None, None] / 23.0) * 100 + 128
        name = "img%dx%d" % (w, h)
        with open(os.path.join(d, name + ".ppm"), "wb") as f:
            f.write(b"P6 %d %d 255\n" % (w, h) + np.clip(a, 0, 255).astype(np.uint8).tobytes())
        names.append(name)
    return names


def qwen2vl_cases():
    """Returns (passed, failed, skipped)."""
    bindir = os.path.dirname(NM)
    gm, gp = os.path.join(bindir, "nm-genmodel"), os.path.join(bindir, "nm-genmmproj")
    if not os.path.exists(LLM) or not os.path.exists(gm) or not os.path.exists(gp):
        print("%s qwen2vl_matches_llama_cpp (needs %s, nm-genmodel, nm-genmmproj)" % ("FAIL" if CI else "skip", LLM))
        return (0, 1, 0) if CI else (0, 0, 1)
    want = json.load(open(os.path.join(ROOT, "tests", "data", "qwen2vl", "llama-mtmd-cli.json")))
    passed = failed = 0
    with tempfile.TemporaryDirectory(prefix="nm-test-qwen2vl-") as tmp:
        llm, mm, mm_bad = (os.path.join(tmp, n) for n in ("llm.gguf", "mm.gguf", "mm128.gguf"))
        subprocess.run([gm, "--arch", "qwen2vl", "--tokenizer-from", LLM, "-o", llm, "--type", "f32", "--layers", "2",
                        "--embd", "256", "--heads", "4", "--kv-heads", "2", "--ff", "512", "--seed", "3"],
                       check=True, capture_output=True)
        common = ["--proj", "qwen2vl_merger", "--n-embd", "128", "--n-ff", "256", "--n-head", "2", "--n-layer", "2",
                  "--image-size", "56", "--seed", "4"]
        subprocess.run([gp, "-o", mm, "--n-out", "256"] + common, check=True, capture_output=True)
        subprocess.run([gp, "-o", mm_bad, "--n-out", "128"] + common, check=True, capture_output=True)
        got = {}
        names = qwen2vl_images(tmp)
        # each image at the model's token limits, then two with limits of their own (llama.cpp's flags)
        for key in names + ["img320x200 --image-max-tokens 20", "img120x300 --image-min-tokens 120",
                            "img120x300 --image-min-tokens 100 --image-max-tokens 100"]:
            name, *flags = key.split()
            r = subprocess.run([NM, "run", "-m", llm, "--mmproj", mm, "--image", os.path.join(tmp, name + ".ppm"),
                                "--chat", "-p", "What is it?", "--temp", "0", "-n", "24", "-t", "2"] + flags,
                               capture_output=True)
            got[key] = r.stdout.strip()
            exp = bytes.fromhex(want[key]).strip()
            case = "_".join([name] + [f.strip("-").replace("-", "_") for f in flags])
            if r.returncode == 0 and got[key] == exp:
                passed += 1
                print("ok   qwen2vl_matches_llama_cpp_%s (%d bytes)" % (case, len(exp)))
            else:
                failed += 1
                print("FAIL qwen2vl_matches_llama_cpp_%s (exit %d)\n  ours:  %r\n  llama: %r\n  %s" % (
                    case, r.returncode, got[key], exp, r.stderr[-300:]))
        if len(set(got.values())) == len(got):
            passed += 1
            print("ok   qwen2vl_images_matter")
        else:
            failed += 1
            print("FAIL qwen2vl_images_matter (two images, or one at two token limits, gave the same answer)")
        r = subprocess.run([NM, "run", "-m", llm, "--mmproj", mm_bad, "--image", os.path.join(tmp, "img224x224.ppm"),
                            "--chat", "-p", "What is it?", "-n", "4"], capture_output=True, text=True)
        if r.returncode != 0 and "128" in r.stderr and "256" in r.stderr:
            passed += 1
            print("ok   qwen2vl_width_mismatch_refused")
        else:
            failed += 1
            print("FAIL qwen2vl_width_mismatch_refused (exit %d: %s)" % (r.returncode, r.stderr[-300:]))
    return passed, failed, 0


def main():
    passed, failed, skipped = qwen2vl_cases()
    if not os.path.exists(LLM):
        for c in BOUNDS:
            if CI:
                failed += 1
                print("FAIL vlm_%s (needs %s, and NM_CI is set)" % (c, LLM))
            else:
                skipped += 1
                print("skip vlm_%s (needs %s)" % (c, LLM))
        print("%d passed, %d failed, %d skipped" % (passed, failed, skipped))
        return 1 if failed else 0
    with tempfile.TemporaryDirectory(prefix="nm-test-vlm-") as tmp:
        out = os.path.join(tmp, "eval.json")
        r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "train_vlm", "eval.py"), "--nanomind", NM,
                            "-m", LLM, "--mmproj", MMPROJ, "-n", str(4 * N_PER_CATEGORY), "--seed", "4242",
                            "--json", out], capture_output=True, text=True)
        sys.stdout.write(r.stdout)
        if not os.path.exists(out):
            print("FAIL vlm (eval.py exited %d: %s)" % (r.returncode, r.stderr[-600:]))
            print("0 passed, 1 failed, 0 skipped")
            return 1
        res = json.load(open(out))
    for c, bound in BOUNDS.items():
        acc = res["summary"][c]["accuracy"]
        wrong = [(a["question"], a["expected"], a["nanomind"]) for a in res["answers"]
                 if a["category"] == c and a["nanomind"] != a["expected"]]
        if acc >= bound:
            passed += 1
            print("ok   vlm_%s (%.0f%%, bound %.0f%%)" % (c, 100 * acc, 100 * bound))
        else:
            failed += 1
            print("FAIL vlm_%s (%.0f%% < %.0f%%; wrong: %s)" % (c, 100 * acc, 100 * bound, wrong[:4]))
    print("%d passed, %d failed, %d skipped" % (passed, failed, skipped))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
