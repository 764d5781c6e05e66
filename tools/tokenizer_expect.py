#!/usr/bin/env python3
"""Writes the stored expectations of test_tokenizer's random_mixes case:
random mixes of awkward pieces (whitespace runs, digits, contractions, accents,
CJK, emoji, special tokens, invalid UTF-8, surrogates), each tokenized by
llama.cpp's llama-tokenize under the four settings of add_special x
parse_special, for each model given.

  tools/tokenizer_expect.py LLAMA_BIN_DIR MODEL.gguf...

LLAMA_BIN_DIR holds a llama-tokenize built from llama.cpp (not part of this
repository). Writes tests/data/tokenizer/random_mixes.hex (one string per line,
hex) and tests/data/tokenizer/MODEL.ids ("index add parse id id ...", one line
per string and setting). The strings come from a fixed seed, so a rerun with the
same llama.cpp writes the same files. Tooling only.
"""
import os
import random
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "tokenizer")
N_STRINGS = 160

PIECES = [
    b"Hello", b" world", b"  ", b"   ", b"\t", b"\n", b"\n\n", b"\r\n", b" ", b"1", b"12", b"123", b"1234567",
    b"3.14", b"2024-01-01", b"1,234", b"don't", b"I'll", b"we've", b"THEY'RE", b"'s", b"'S", b"''",
    "Café".encode(), "naïve".encode(), "Straße".encode(), "Ærøskøbing".encode(), "中文".encode(),
    "测试".encode(), "日本語".encode(), "한국어".encode(), "😀".encode(), "👍🏽".encode(), "🇫🇷".encode(),
    "Русский".encode(), "العربية".encode(), "हिन्दी".encode(), "ελληνικά".encode(), "\u00a0".encode(),
    "\u2003".encode(), b"<|im_start|>", b"<|im_end|>", b"<|endoftext|>", b"<start_of_turn>",
    b"<end_of_turn>", b"user", b"model", b"def", b"return", b"x**2", b"#", b"(", b")", b"[", b"]", b"{",
    b"}", b"...", b"!!!", b"?!", b'"', b"http://example.com/a?b=1&c=2", b"ALLCAPS", b"MiXeD",
    b"\xff", b"\xc3", b"\xc0\x80", b"\xe0\x80\x80", b"\xed\xa0\x80",
]


def strings():
    rng = random.Random(20261201)
    out = []
    for _ in range(N_STRINGS):
        k = rng.randint(1, 8)
        out.append(b"".join(rng.choice(PIECES) for _ in range(k)))
    return out


def tokenize(llama, model, text, add, parse):
    with tempfile.NamedTemporaryFile(delete=False) as f:
        f.write(text)
        path = f.name
    try:
        cmd = [os.path.join(llama, "llama-tokenize"), "-m", model, "-f", path, "--no-escape", "--ids",
               "--log-disable"]
        if not add:
            cmd.append("--no-bos")
        if not parse:
            cmd.append("--no-parse-special")
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=True)
        line = [l for l in p.stdout.decode().splitlines() if l.startswith("[")][-1]
        return [int(x) for x in line.strip("[]").split(",") if x.strip()]
    finally:
        os.unlink(path)


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    llama, models = sys.argv[1], sys.argv[2:]
    os.makedirs(OUT, exist_ok=True)
    ss = strings()
    with open(os.path.join(OUT, "random_mixes.hex"), "w") as f:
        for s in ss:
            f.write(s.hex() + "\n")
    for model in models:
        name = os.path.basename(model)
        with open(os.path.join(OUT, name + ".ids"), "w") as f:
            for i, s in enumerate(ss):
                for add in (1, 0):
                    for parse in (1, 0):
                        ids = tokenize(llama, model, s, add, parse)
                        f.write(" ".join(str(x) for x in [i, add, parse] + ids) + "\n")
        print(f"tokenizer_expect: {name}: {len(ss)} strings x 4 settings")
    return 0


if __name__ == "__main__":
    sys.exit(main())
