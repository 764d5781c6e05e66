#!/usr/bin/env python3
"""Our Piper phonemes against piper-tts's on tests/data/piper/sentences.txt (30 sentences), the default voice.

usage: test_piper_phonemes.py BUILD/test_piper

piper-tts (PyPI, test-only) phonemizes with the espeak-ng it embeds (Piper's fork, its own data);
we phonemize with Debian's libespeak-ng 1.51 (docs/piper.md). Where the two espeak-ngs pronounce a word
differently the ids differ in that word, so a sentence is held to piper-tts in its frame: the same
sentences (the same split), and in each the same sequence of the ids of ^ $ blank and punctuation
(where words, clauses and sentences begin and end; the pads follow the phonemes), every one of them. The sentences whose ids are
equal outright are counted and printed (docs/piper.md states the figure), and must be at least 20 of 30.

Prints "N passed, N failed, N skipped" (a skip, no piper-tts or no voice, fails under NM_CI).
"""
import os
import subprocess
import sys
import tempfile

CI = os.environ.get("NM_CI", "0") not in ("", "0")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = os.environ.get("NM_MODEL_DIR", os.path.expanduser("~/.cache/nanomind/models"))
VOICE = os.path.join(MODELS, "piper-en_US-joe-medium.onnx")
FRAME = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}  # ^ $ blank ! ' ( ) , - . : ; ? (a pad follows every phoneme)


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    skip = None
    try:
        from piper import PiperVoice
    except ImportError:
        skip = "piper-tts is not installed (scripts/setup.sh installs it)"
    if not skip and not os.path.isfile(VOICE):
        skip = "%s is not in the model cache (scripts/fetch_models.sh)" % VOICE
    if skip:
        print("%s piper_phonemes_as_piper_tts: %s" % ("FAIL" if CI else "skip", skip))
        print("0 passed, %d failed, %d skipped" % (1 if CI else 0, 0 if CI else 1))
        return 1 if CI else 0
    voice = PiperVoice.load(VOICE)
    lines = open(os.path.join(ROOT, "tests", "data", "piper", "sentences.txt"), encoding="utf-8").read().splitlines()
    with tempfile.TemporaryDirectory(prefix="nm-piper-ph-") as d:
        out = os.path.join(d, "ids.txt")
        p = subprocess.run([sys.argv[1], "--filter", "piper_phonemes_dump"], cwd=ROOT, capture_output=True, text=True,
                           env=dict(os.environ, NM_PIPER_IDS_OUT=out, NM_MODEL_DIR=MODELS), timeout=300)
        if p.returncode != 0 or not os.path.isfile(out):
            print("FAIL piper_phonemes_as_piper_tts: test_piper exited %d\n%s" % (p.returncode, p.stdout[-2000:]))
            print("0 passed, 1 failed, 0 skipped")
            return 1
        ours = open(out).read().splitlines()
    exact, bad = 0, []
    for k, text in enumerate(lines):
        want = [voice.phonemes_to_ids(s) for s in voice.phonemize(text) if s]
        got = [[int(x) for x in s.split()] for s in ours[k].split(" | ")] if k < len(ours) and ours[k] else []
        if want == got:
            exact += 1
            continue
        if len(want) != len(got) or any([i for i in w if i in FRAME] != [i for i in g if i in FRAME]
                                        for w, g in zip(want, got)):
            bad.append("%d: %r\n    piper-tts %s\n    ours      %s" % (k + 1, text, want, got))
    print("  %d of %d sentences: the ids of piper-tts exactly; %d: the same frame, words pronounced otherwise "
          "by Debian's espeak-ng 1.51" % (exact, len(lines), len(lines) - exact - len(bad)))
    for b in bad:
        print("  frame differs: " + b)
    ok = not bad and exact >= 20
    print("%s piper_phonemes_as_piper_tts" % ("ok  " if ok else "FAIL"))
    print("%d passed, %d failed, 0 skipped" % (ok, not ok))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
