#!/usr/bin/env python3
"""Writes the merge-stress corpus of test_tokenizer's stress_* cases and, given
llama.cpp's llama-tokenize, the ids it gives each line.

  tools/tokenizer_stress.py corpus GEMMA.gguf SMOLLM.gguf
      writes tests/data/tokenizer/stress.corpus
  tools/tokenizer_stress.py expect LLAMA_BIN_DIR MODEL.gguf...
      writes tests/data/tokenizer/MODEL.stress (reads the corpus)

The corpus is built to make merges compete: runs of one character (spaces,
newlines, tabs, letters, punctuation, CJK, emoji) of every length 1..N;
periodic strings where the same pair is a candidate at several places at once
(equal scores, equal ranks: only the tie order decides), found by replaying
both merge algorithms with the ties broken leftmost and rightmost and keeping
the strings where the two differ; byte fallback (code points Gemma 3's
vocabulary lacks, control characters, private use, noncharacters, invalid
bytes); the characters of every Unicode block either vocabulary holds, and
runs of its tokens glued together so merges cross their borders; digits,
punctuation, code, the literal texts of special and byte tokens; seeded
random mixes of all of it. It depends only on the two vocabularies read from
the GGUF files, so the same files give the same corpus.

Format of stress.corpus: '#' lines are comments; then one line per string,
"LABEL HEX" (LABEL names its family, HEX its bytes). MODEL.stress: '#'
header lines (llama.cpp version, the command), then "INDEX ID ID ...", one
line per corpus line in order (ids of llama_tokenize(text, add_special =
false, parse_special = false)). Tooling only: llama.cpp is not part of this
repository and nothing here builds it.
"""
import os
import random
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "tokenizer")
CORPUS = os.path.join(OUT, "stress.corpus")
SPACE = "\u2581".encode()

# ---- GGUF: the tokenizer keys only (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md)


def read_tokenizer(path):
    with open(path, "rb") as f:
        buf = f.read()
    if buf[:4] != b"GGUF":
        sys.exit(f"{path}: not a GGUF file")
    pos = 8
    _, n_kv = struct.unpack_from("<QQ", buf, pos)
    pos += 16
    scal = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "B", 10: "Q", 11: "q", 12: "d"}

    def value(t):
        nonlocal pos
        if t == 8:
            n = struct.unpack_from("<Q", buf, pos)[0]
            s = buf[pos + 8:pos + 8 + n]
            pos += 8 + n
            return s
        if t == 9:
            et, n = struct.unpack_from("<IQ", buf, pos)
            pos += 12
            if et in scal:
                v = list(struct.unpack_from(f"<{n}{scal[et]}", buf, pos))
                pos += n * struct.calcsize(scal[et])
                return v
            return [value(et) for _ in range(n)]
        v = struct.unpack_from("<" + scal[t], buf, pos)[0]
        pos += struct.calcsize(scal[t])
        return v

    kv = {}
    for _ in range(n_kv):
        n = struct.unpack_from("<Q", buf, pos)[0]
        key = buf[pos + 8:pos + 8 + n].decode()
        pos += 8 + n
        t = struct.unpack_from("<I", buf, pos)[0]
        pos += 4
        kv[key] = value(t)
    return kv


# ---- replays of the two merge algorithms, ties broken either way (corpus selection only)


class Spm:
    def __init__(self, kv):
        self.toks = kv["tokenizer.ggml.tokens"]
        self.scores = kv["tokenizer.ggml.scores"]
        self.types = kv["tokenizer.ggml.token_type"]
        self.index = {t: i for i, t in enumerate(self.toks)}

    def encode(self, text, leftmost):
        """Normal-text merges of one fragment (no special-token split): ids."""
        e = text.replace(b" ", SPACE)
        sym = []
        i = 0
        while i < len(e):
            n = min([1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4][e[i] >> 4], len(e) - i)
            sym.append([i, n])
            i += n
        while True:
            best = None
            for k in range(len(sym) - 1):
                a, b = sym[k], sym[k + 1]
                t = self.index.get(e[a[0]:b[0] + b[1]])
                if t is None:
                    continue
                key = (self.scores[t], -k if leftmost else k)
                if best is None or key > best[0]:
                    best = (key, k)
            if best is None:
                break
            k = best[1]
            sym[k][1] += sym[k + 1][1]
            del sym[k + 1]
        out = []
        for o, n in sym:
            t = self.index.get(e[o:o + n])
            out += [t] if t is not None else [self.index.get(b"<0x%02X>" % c) for c in e[o:o + n]]
        return out

    def tie_sensitive(self, text):
        return self.encode(text, True) != self.encode(text, False)


def gpt2_byte_chars():
    printable = [b for b in range(256) if 0x21 <= b <= 0x7e or 0xa1 <= b <= 0xac or 0xae <= b <= 0xff]
    m, nxt = {}, 256
    for b in range(256):
        m[b] = chr(b) if b in printable else chr(nxt)
        if b not in printable:
            nxt += 1
    return m


class Bpe:
    def __init__(self, kv):
        self.rank = {}
        for r, line in enumerate(kv["tokenizer.ggml.merges"]):
            a, _, b = line.decode().partition(" ")
            self.rank.setdefault((a, b), r)
        self.chars = gpt2_byte_chars()

    def word(self, w, leftmost):
        """Merges of one pre-token (bytes): the symbols' texts."""
        sym = [self.chars[c] for c in w]
        while True:
            best = None
            for k in range(len(sym) - 1):
                r = self.rank.get((sym[k], sym[k + 1]))
                if r is None:
                    continue
                key = (-r, -k if leftmost else k)
                if best is None or key > best[0]:
                    best = (key, k)
            if best is None:
                return sym
            k = best[1]
            sym[k:k + 2] = [sym[k] + sym[k + 1]]

    def tie_sensitive(self, w):
        return self.word(w, True) != self.word(w, False)


# ---- the corpus


def corpus(gemma_path, smol_path):
    spm = Spm(read_tokenizer(gemma_path))
    bpe = Bpe(read_tokenizer(smol_path))
    lines = []

    def add(label, s):
        if isinstance(s, str):
            s = s.encode()
        if s and (label, s) not in seen:
            seen.add((label, s))
            lines.append((label, s))

    seen = set()

    # 1. Runs of one character, every length: whitespace to 70 (Gemma's user-defined runs stop at 31),
    # others to 24; bare, between letters and after a space.
    for c in [" ", "\n", "\t", "\r", "\r\n", " \n", "\n "]:
        for n in range(1, 71):
            add("run", c * n)
        for n in range(1, 40, 3):
            add("run_in", "x" + c * n + "y")
    for c in ["a", "e", "l", "s", "z", "A", "0", "1", "9", ".", "-", "=", "_", "*", "#", "/", "\\", "!", "?", "~",
              "'", '"', "`", "<", ">", "|", "+", "é", "ß", "ø", "α", "я", "ا", "ה", "क", "ก", "中", "の", "한",
              "😀", "🎉", "\u200b", "\u00a0", "\u3000"]:
        for n in range(1, 13):
            add("run", c * n)
        for n in range(1, 7):
            add("run_sp", " " + c * n)

    # 2. Equal scores / equal ranks: periodic strings where the same token is a candidate at several
    # places and the tie order changes the result, for either tokenizer.
    units = [u for u in ["ab", "la", "na", "an", "ha", "he", "ing", "the", "abc", "ba", "ma", "to", "oo", "ee", "ll",
                         "ss", "10", "00", "01", "=-", "-=", ".-", "ab ", " a", "ें", "ाा", "ιι", "на", "ан", "ла",
                         "ab1", "xo", "ox", "ah", "um", "mm", "hm", "ol", "lo", "ja", "ka", "ta", "ra", "ri", "in",
                         "on", "er", "re", "es", "se", "at", "ta", "st", "nd", "ou", "co", "de", "ed"]]
    found_spm = found_bpe = 0
    for u in units:
        for k in range(2, 16):
            s = (u * k).encode()
            if spm.tie_sensitive(s):
                add("tie_spm", s)
                found_spm += 1
            if bpe.tie_sensitive(s):
                add("tie_bpe", s)
                found_bpe += 1
            if bpe.tie_sensitive(b" " + s):
                add("tie_bpe", b" " + s)
                found_bpe += 1
    # From the vocabulary: Gemma's tokens of 2-6 characters, taken thrice, kept where the tie
    # order matters (every normal token's score differs, so ties are one token in several places).
    normal = [i for i, ty in enumerate(spm.types) if ty == 1]
    normal.sort(key=lambda i: -spm.scores[i])
    picked = 0
    for i in normal:
        t = spm.toks[i].replace(SPACE, b" ")
        try:
            n = len(t.decode())
        except UnicodeDecodeError:
            continue
        if not 2 <= n <= 6 or picked >= 120:
            continue
        for k in (3, 5):
            if spm.tie_sensitive(t * k):
                add("tie_spm_vocab", t * k)
                picked += 1
                break
    # The same from SmolLM2's merges: the left and right halves of the first merges, repeated.
    inv = {v: k for k, v in bpe.chars.items()}
    picked = 0
    for (a, b), r in sorted(bpe.rank.items(), key=lambda x: x[1]):
        if picked >= 120:
            break
        try:
            w = bytes(inv[ch] for ch in a + b)
        except KeyError:
            continue
        for k in (3, 5):
            if bpe.tie_sensitive(w * k):
                add("tie_bpe_vocab", w * k)
                picked += 1
                break

    # 3. Byte fallback: code points Gemma's vocabulary lacks (first few of many blocks), alone,
    # in runs and between known characters; control characters; invalid bytes.
    vocab = set(spm.toks)
    lacking = []
    for lo, hi in [(0x0080, 0x0800), (0x0800, 0x3000), (0x3000, 0xa000), (0xa000, 0xd800), (0xe000, 0xe100),
                   (0xf900, 0xfffe), (0x10000, 0x10400), (0x1d400, 0x1d800), (0x1f000, 0x1fb00),
                   (0x20000, 0x20400), (0x2a700, 0x2a800), (0x30000, 0x30100), (0xf0000, 0xf0010),
                   (0x10fff0, 0x110000)]:
        got = [c for c in range(lo, hi) if chr(c).encode() not in vocab]
        lacking += got[:: max(1, len(got) // 6)][:6]
    for c in lacking:
        ch = chr(c)
        add("bytes", ch)
        add("bytes", ch * 3)
        add("bytes", "a" + ch + "b")
        add("bytes", " " + ch + " " + ch)
    for i in range(0, len(lacking), 6):
        add("bytes_mix", "".join(chr(c) for c in lacking[i:i + 6]))
    for c in list(range(0, 32)) + [0x7f]:
        add("ctrl", bytes([c]))
        add("ctrl", b"a" + bytes([c]) * 2 + b"b")
    for s in [b"\xff", b"\xfe\xff", b"\x80", b"\x80\x80\x80", b"\xc3", b"a\xc3", b"\xc3(", b"\xe2\x82", b"\xe2\x82(",
              b"\xf0\x9f\x98", b"\xf0\x9f\x98 ", b"\xc0\x80", b"\xc1\xbf", b"\xe0\x80\x80",
              b"\xf8\x88\x80\x80\x80", b"caf\xe9", b"\xef\xbb\xbfBOM", b"\xef\xbf\xbd", b"\xef\xbf\xbf",
              b"\xf4\x8f\xbf\xbf", b"a\xffb\xfec"]:
        add("invalid", s)
    # Not F4 90 80 80 (past U+10FFFF): llama.cpp's BPE throws std::invalid_argument ("invalid
    # codepoint") and llama-tokenize aborts; ours reads it as U+FFFD.

    # 4. Every script the vocabularies hold: each 128-code-point block's single-character tokens
    # (both vocabularies; SmolLM2's decoded from its byte-level form), up to 48 in lines of 24 (CJK
    # and Hangul: every sixth block, one line); then Gemma's 16 best multi-character tokens of each
    # block, 8 to a line, glued together (merges cross the borders between them) and as they are.
    chars_by_block = {}
    for t in spm.toks + [bytes(inv.get(ch, 0) for ch in tok.decode()) for tok in
                         read_tokenizer(smol_path)["tokenizer.ggml.tokens"] if all(ch in inv for ch in tok.decode())]:
        try:
            s = t.replace(SPACE, b" ").decode()
        except UnicodeDecodeError:
            continue
        if len(s) == 1 and ord(s) >= 0x80:
            chars_by_block.setdefault(ord(s) >> 7, set()).add(s)
    n_cjk = 0
    for blk in sorted(chars_by_block):
        cs = sorted(chars_by_block[blk])
        cp = blk << 7
        if 0x3400 <= cp < 0xa000 or 0xac00 <= cp < 0xd800 or cp >= 0x20000:  # CJK, Hangul: a sixth
            n_cjk += 1
            if n_cjk % 6 == 1:
                add("script_chars", "".join(cs[:24]))
            continue
        for i in range(0, min(len(cs), 48), 24):
            add("script_chars", "".join(cs[i:i + 24]))
    words_by_block = {}
    for i in normal:
        try:
            s = spm.toks[i].replace(SPACE, b" ").decode()
        except UnicodeDecodeError:
            continue
        core = s.strip()
        if len(core) >= 2 and ord(core[0]) >= 0x80 and all(ord(ch) >> 7 == ord(core[0]) >> 7 for ch in core):
            words_by_block.setdefault(ord(core[0]) >> 7, []).append(s)
    for blk in sorted(words_by_block):
        ws = words_by_block[blk][:16]  # highest scores first
        for i in range(0, len(ws), 8):
            add("script_glued", "".join(w.strip() for w in ws[i:i + 8]))
            add("script_words", "".join(ws[i:i + 8]))
    for s in SENTENCES:
        add("sentence", s)

    # 5. Digits, punctuation, code, the literal texts of special and byte tokens.
    for n in range(1, 25):
        add("digits", "".join(str((i * 7 + 3) % 10) for i in range(n)))
    for s in ["3.14159265358979", "1,234,567.89", "-0.000001", "1e-10", "0x7fffffff", "2024-12-31T23:59:59Z",
              "+1 (555) 010-9999", "192.168.0.1", "v1.2.3-rc.4", "1/2 + 3/4 = 5/4", "100%", "$1,000.00", "€9,99",
              "١٢٣٤٥", "१२३४५", "一二三四五", "①②③", "Ⅻ", "½¼¾", "x²+y³", "0000000000000000"]:
        add("digits", s)
    for s in ["...", "…", "!!!???", "?!?!", "<<<>>>", "=====", "-----", "_____", "*****", "#####", "~~~~",
              "''''", '""""', "````", "'''", '"""', "(((())))", "[[[]]]", "{{{}}}", "«»", "„“", "‘’", "—–-",
              ":-) ;-( :D xD", "->", "=>", "<=>", "!=", "===", "!==", "::", "&&||", "<<=", ">>>=", "/**/", "//",
              "<!---->", "@@", "%%", "^^", "$$", "\\\\", "|||"]:
        add("punct", s)
    for s in CODE:
        add("code", s)
    for t in [b"<0x41>", b"<0x0A>", b"<0xFF>", b"<0x41><0x42>", b"<0x>", b"<unk>", b"<pad>", b"<bos>", b"<eos>",
              b"<mask>", b"<unused0>", b"<unused99>", b"<start_of_turn>", b"<end_of_turn>", b"<start_of_image>",
              b"[multimodal]", b"<table>", b"<b>x</b>", b"<s>", b"</s>", b"<|im_start|>", b"<|im_end|>",
              b"<|endoftext|>", b"<repo_name>", b"<filename>", b"<|im_start|>user\nhi<|im_end|>",
              b"<start_of_turn>user\nhi<end_of_turn>", b"<<start_of_turn>>", b"<start_of_turn<end_of_turn>>"]:
        add("special_text", t)

    # 6. Seeded random mixes of the pieces above.
    pieces = [s for _, s in lines if len(s) <= 24]
    rng = random.Random(20261225)
    for _ in range(200):
        add("mix", b"".join(rng.choice(pieces) for _ in range(rng.randint(2, 7))))
    return lines, found_spm, found_bpe


SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Voix ambiguë d'un cœur qui, au zéphyr, préfère les jattes de kiwis.",
    "Falsches Üben von Xylophonmusik quält jeden größeren Zwerg.",
    "El pingüino Wenceslao hizo kilómetros bajo exhaustiva lluvia y frío.",
    "Pchnąć w tę łódź jeża lub ośm skrzyń fig.",
    "Příliš žluťoučký kůň úpěl ďábelské ódy.",
    "Tiếng Việt có dấu: Chữ Quốc ngữ, người, được, những.",
    "Pijamalı hasta yağız şoföre çabucak güvendi.",
    "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Жебракують філософи при ґанку церкви в Гадячі.",
    "Մենք կանք, մեր սարերը։",
    "ქართული ენა მსოფლიოში ერთ-ერთი უძველესი ენაა.",
    "דג סקרן שט בים מאוכזב ולפתע מצא חברה.",
    "نص حكيم له سر قاطع وذو شأن عظيم مكتوب على ثوب أخضر ومغلف بجلد أزرق.",
    "زمانی که ما به دنیا آمدیم، فارسی زبان مادری ما بود.",
    "ہم نے اردو میں لکھا۔",
    "ऋषियों को सताने वाले दुष्ट राक्षसों के राजा रावण का सर्वनाश करने वाले विष्णुवतार भगवान श्रीराम।",
    "আমার সোনার বাংলা, আমি তোমায় ভালোবাসি।",
    "ਪੰਜਾਬੀ ਭਾਸ਼ਾ ਗੁਰਮੁਖੀ ਲਿਪੀ ਵਿੱਚ ਲਿਖੀ ਜਾਂਦੀ ਹੈ।",
    "ગુજરાતી ભાષા",
    "தமிழ் ஒரு செம்மொழி ஆகும்.",
    "తెలుగు భాష",
    "ಕನ್ನಡ ಭಾಷೆ",
    "മലയാളം ഭാഷ",
    "සිංහල භාෂාව",
    "เป็นมนุษย์สุดประเสริฐเลิศคุณค่า กว่าบรรดาฝูงสัตว์เดรัจฉาน",
    "ພາສາລາວ",
    "བོད་ཡིག",
    "မြန်မာဘာသာ",
    "ភាសាខ្មែរ",
    "ᠮᠣᠩᠭᠣᠯ",
    "አማርኛ ቋንቋ",
    "ᏣᎳᎩ ᎦᏬᏂᎯᏍᏗ",
    "いろはにほへと ちりぬるを わかよたれそ つねならむ",
    "カタカナとひらがなと漢字が混ざった日本語の文章です。",
    "天地玄黄，宇宙洪荒。日月盈昃，辰宿列张。",
    "繁體中文與简体中文：臺灣、台湾。",
    "키스의 고유조건은 입술끼리 만나야 하고 특별한 기술은 필요치 않다.",
    "ᄀᄁᄂ ᅡᅢᅣ ᆨᆩᆪ",
    "Ｆｕｌｌｗｉｄｔｈ　ＡＢＣ　１２３",
    "∀x∈ℝ: x²≥0 ⇒ √(x²)=|x| ∑∫∂∇",
    "→←↑↓↔ ⇐⇒ ─│┌┐└┘├┤ ■□▲△●○",
    "👨‍👩‍👧‍👦 🏳️‍🌈 👍🏻👍🏿 🇯🇵🇺🇸 1️⃣ ©️®️™️",
    "e\u0301 a\u0300 n\u0303 o\u0308 (combining marks)",
    "Zalgo: Z\u0351\u0352\u0353a\u0354\u0355l\u0356g\u0357o",
    "left\u200eright\u200fzero\u200bwidth\u200cjoin\u200dend\ufeff",
    "ﬁ ﬂ ﬀ ﬃ Å Å Ω Ω",
    "𝕳𝖊𝖑𝖑𝖔 𝓦𝓸𝓻𝓵𝓭 𝟙𝟚𝟛",
]

CODE = [
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) { a[i] = b[i] * c[i]; }",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); }",
    "{\"key\": [1, 2.5, true, null], \"nested\": {\"a\": \"b\"}}",
    "<div class=\"x\"><p>Hello &amp; goodbye</p></div>",
    "SELECT * FROM users WHERE id = 1 AND name LIKE '%bob%';",
    "const x = (a, b) => a ?? b?.c ?? [];",
    "fn main() { let v: Vec<u8> = vec![0; 16]; }",
    "if [[ -f \"$1\" ]]; then echo \"${1##*/}\"; fi",
    "^(?:[a-z0-9!#$%&'*+/=?^_`{|}~-]+)@[a-z]+\\.[a-z]{2,}$",
    "| a | b |\n|---|---|\n| 1 | 2 |",
    "- [ ] todo\n- [x] done\n> quote\n```py\nx=1\n```",
    "\tif (x) {\n\t\treturn;\n\t}\n",
    "    indented\n        more\n            most",
    "https://example.com/a/b?c=d&e=f#g",
    "C:\\Users\\name\\file.txt",
    "snake_case camelCase PascalCase kebab-case SCREAMING_CASE",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
]


def write_corpus(gemma, smol):
    lines, _, _ = corpus(gemma, smol)
    found_spm = sum(label.startswith("tie_spm") for label, _ in lines)
    found_bpe = sum(label.startswith("tie_bpe") for label, _ in lines)
    os.makedirs(OUT, exist_ok=True)
    with open(CORPUS, "w") as f:
        f.write("# Merge-stress corpus: written by tools/tokenizer_stress.py from the vocabularies of\n"
                f"# {os.path.basename(gemma)} and {os.path.basename(smol)}. One string a line: LABEL HEX.\n"
                f"# {len(lines)} lines; {found_spm} periodic strings where Gemma's tie order matters, "
                f"{found_bpe} where SmolLM2's does (tie_*).\n")
        for label, s in lines:
            f.write(f"{label} {s.hex()}\n")
    print(f"tokenizer_stress: {len(lines)} lines ({found_spm} tie-sensitive for SPM, {found_bpe} for BPE)")


def read_corpus():
    out = []
    with open(CORPUS) as f:
        for line in f:
            if line.startswith("#"):
                continue
            label, hx = line.split()
            out.append((label, bytes.fromhex(hx)))
    return out


def run_tokenize(llama, model, text, parse_special):
    with tempfile.NamedTemporaryFile(delete=False) as f:
        f.write(text)
        path = f.name
    try:
        cmd = [os.path.join(llama, "llama-tokenize"), "-m", model, "-f", path, "--no-escape", "--ids", "--log-disable",
               "--no-bos"]
        if not parse_special:
            cmd.append("--no-parse-special")
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=True)
        line = [ln for ln in p.stdout.decode().splitlines() if ln.startswith("[")][-1]
        return [int(x) for x in line.strip("[]").split(",") if x.strip()]
    finally:
        os.unlink(path)


def tokenize_all(llama, model, texts, n_check):
    """The ids of llama_tokenize(text, add_special = false, parse_special = false) for each text.

    One llama-tokenize a line would take Gemma 3 ~0.4 s each (loading its vocabulary). Instead the
    lines go BATCH to a call, joined by the end-of-sequence token's text, with special parsing on:
    llama.cpp splits the text at special tokens and tokenizes each piece between them alone, as it
    would the line by itself. A line holding the text of any control or unknown token (which
    special parsing would split too) goes alone with --no-parse-special. n_check lines, spread over
    the corpus, are also run alone and must give the batch's ids."""
    kv = read_tokenizer(model)
    toks, types = kv["tokenizer.ggml.tokens"], kv["tokenizer.ggml.token_type"]
    sep_id = kv["tokenizer.ggml.eos_token_id"]
    sep = toks[sep_id]
    specials = [t for t, ty in zip(toks, types) if ty in (2, 3) and t]
    out = [None] * len(texts)
    batch = []
    alone = 0
    for i, s in enumerate(texts):
        if any(t in s for t in specials):
            out[i] = run_tokenize(llama, model, s, False)
            alone += 1
        else:
            batch.append(i)
    BATCH = 400
    for b in range(0, len(batch), BATCH):
        idx = batch[b:b + BATCH]
        ids = run_tokenize(llama, model, sep.join(texts[i] for i in idx), True)
        parts, cur = [], []
        for t in ids:
            if t == sep_id:
                parts.append(cur)
                cur = []
            else:
                cur.append(t)
        parts.append(cur)
        if len(parts) != len(idx):
            sys.exit(f"{model}: batch at line {idx[0]}: {len(parts)} pieces for {len(idx)} lines")
        for i, p in zip(idx, parts):
            out[i] = p
    step = max(1, len(batch) // max(1, n_check))
    checked = 0
    for i in batch[::step][:n_check]:
        if run_tokenize(llama, model, texts[i], False) != out[i]:
            sys.exit(f"{model}: line {i}: alone, llama-tokenize gives other ids than in the batch")
        checked += 1
    return out, alone, checked


def write_expect(llama, models):
    texts = [s for _, s in read_corpus()]
    ver = subprocess.run([os.path.join(llama, "llama-tokenize"), "--version"], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT).stdout.decode().strip().splitlines()
    for model in models:
        name = os.path.basename(model)
        ids, alone, checked = tokenize_all(llama, model, texts, 200)
        n_tok = sum(len(x) for x in ids)
        with open(os.path.join(OUT, name + ".stress"), "w") as f:
            f.write(f"# llama.cpp's ids for each line of stress.corpus, model {name}:\n")
            f.write("# llama_tokenize(line, add_special = false, parse_special = false), from\n")
            for v in ver:
                f.write(f"# llama-tokenize {v}\n")
            f.write("# run as: llama-tokenize -m MODEL -f FILE --no-escape --ids --log-disable --no-bos\n"
                    "#   [--no-parse-special]\n")
            f.write(f"# by tools/tokenizer_stress.py expect: {len(texts) - alone} lines in batches joined by the\n"
                    f"# EOS text with special parsing on ({checked} of them also run alone: the same ids), {alone}\n"
                    f"# that hold a special token's text alone with --no-parse-special. {len(texts)} lines, "
                    f"{n_tok} tokens.\n")
            for i, x in enumerate(ids):
                f.write(" ".join(str(v) for v in [i] + x) + "\n")
        print(f"tokenizer_stress: {name}: {len(texts)} lines, {n_tok} tokens, {alone} alone, {checked} checked alone")


def main():
    if len(sys.argv) >= 4 and sys.argv[1] == "corpus":
        write_corpus(sys.argv[2], sys.argv[3])
        return 0
    if len(sys.argv) >= 4 and sys.argv[1] == "expect":
        write_expect(sys.argv[2], sys.argv[3:])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
