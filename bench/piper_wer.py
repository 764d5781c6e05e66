#!/usr/bin/env python3
"""Whisper (our STT brick, tiny.en) hears the 30 sentences of tests/data/piper/sentences.txt spoken by
nanomind's Piper voice and by piper-tts (the same voice, the noises at the voice's defaults), and by
espeak-ng (nanomind say): the word error rate of each against the text.

usage: bench/piper_wer.py BUILD/nanomind [VOICE-Q8.gguf]

With VOICE-Q8.gguf (tools/convert_piper.py --q8 of the same voice) a fourth row: that voice, by nanomind.

WER: word-level edit distance over the reference's words, all sentences summed; both sides lower-cased,
punctuation dropped (apostrophes kept), hyphens as blanks. Needs piper-tts (PyPI) and the models
(scripts/fetch_models.sh). Prints each engine's WER and the difference.
"""
import os
import re
import subprocess
import sys
import tempfile
import wave

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.environ.get("NM_MODEL_DIR", os.path.expanduser("~/.cache/nanomind/models"))
ONNX = os.path.join(MODELS, "piper-en_US-joe-medium.onnx")
GGUF = os.path.join(MODELS, "piper-en_US-joe-medium.gguf")
WHISPER = os.path.join(MODELS, "whisper-tiny.en.gguf")
LINES = open(os.path.join(ROOT, "tests", "data", "piper", "sentences.txt"), encoding="utf-8").read().splitlines()


def words(t):
    t = t.lower().replace("-", " ")
    return re.sub(r"[^\w' ]", " ", t).split()


def distance(a, b):
    d = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        prev, d[0] = d[0], i
        for j in range(1, len(b) + 1):
            cur = min(d[j] + 1, d[j - 1] + 1, prev + (a[i - 1] != b[j - 1]))
            prev, d[j] = d[j], cur
    return d[len(b)]


def hear(nm, wav):
    out = subprocess.run([nm, "transcribe", "-m", WHISPER, "-nt", wav], capture_output=True, text=True, timeout=300)
    return out.stdout.strip()


def main():
    if len(sys.argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    nm = os.path.abspath(sys.argv[1])
    q8 = sys.argv[2] if len(sys.argv) == 3 else None
    from piper import PiperVoice
    voice = PiperVoice.load(ONNX)
    errs = {"nanomind piper": 0, "piper-tts": 0, "espeak-ng": 0}
    if q8:
        errs["nanomind q8_0"] = 0
    n_ref = 0
    with tempfile.TemporaryDirectory(prefix="nm-wer-") as d:
        for k, text in enumerate(LINES):
            ref = words(text)
            n_ref += len(ref)
            ours, peer, esp = (os.path.join(d, "%s%d.wav" % (x, k)) for x in ("n", "p", "e"))
            subprocess.run([nm, "say", "--tts", "piper", "--voice", GGUF, text, "-o", ours], check=True,
                           capture_output=True)
            subprocess.run([nm, "say", text, "-o", esp], check=True, capture_output=True)
            with wave.open(peer, "wb") as w:
                voice.synthesize_wav(text, w)
            runs = [("nanomind piper", ours), ("piper-tts", peer), ("espeak-ng", esp)]
            if q8:
                runs.append(("nanomind q8_0", os.path.join(d, "q%d.wav" % k)))
                subprocess.run([nm, "say", "--tts", "piper", "--voice", q8, text, "-o", runs[-1][1]], check=True,
                               capture_output=True)
            for name, f in runs:
                errs[name] += distance(ref, words(hear(nm, f)))
    for name, e in errs.items():
        print("%-15s WER %5.1f%% (%d errors in %d words)" % (name, 100.0 * e / n_ref, e, n_ref))
    print("nanomind piper - piper-tts: %+.1f points" % (100.0 * (errs["nanomind piper"] - errs["piper-tts"]) / n_ref))
    return 0


if __name__ == "__main__":
    sys.exit(main())
