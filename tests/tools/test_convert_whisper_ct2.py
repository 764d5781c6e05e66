#!/usr/bin/env python3
"""tools/convert_whisper_ct2.py, every flag, on small CTranslate2 Whisper models written here.

usage: test_convert_whisper_ct2.py [path/to/nanomind]

The models are written by this test in CTranslate2's model.bin layout (docs/whisper_gguf.md),
with a full .en vocabulary (51864 tokens, Hugging Face's spellings <|iw|> and <|nocaptions|>),
d 8 and one or two layers: model A with the encoder position table, f16 and f32 variables and an
int8 matrix with its scales; model B without the position table (older spec revisions). Each
conversion is read back by a GGUF and a ggml .bin reader of this file (not the converter's code)
and compared value by value with the source variables, split into whisper's names as the mapping
table of docs/whisper_gguf.md says:

  MODEL_DIR OUT.gguf          the GGUF: f16 matrices, name "whisper", every tensor and key
  --outtype f16|f32           matrices in that type (vectors always f32), general.file_type
  --name NAME                 general.name
  --ggml-bin OUT.bin          whisper.cpp's layout: header, filters, the ordinary tokens' bytes, and
                              every tensor equal to the GGUF's (type and bytes); model B's .bin gets
                              whisper's sinusoids as encoder.positional_embedding
  bad input, -h               a broken model.bin: exit 1 and a message, no output left; a bad
                              --outtype or a missing argument: exit 2; --help names every flag
                              and the docstring's usage line names every flag --help does

With the nanomind binary: `nanomind transcribe` on a 2 s WAV gives the same output from the GGUF
and from the .bin, both f16 and f32 (the C loader reads both files as the same model); without it
that case is a skip (a failure under NM_CI). Prints "N passed, N failed, N skipped".
"""
import hashlib
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONV = os.path.join(ROOT, "tools", "convert_whisper_ct2.py")
sys.path.insert(0, os.path.join(ROOT, "tools", "vision_ref"))
from clip_ref import Gguf  # noqa: E402  (the GGUF reader of the references: not the converter's writer)
NM = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else None
CI = os.environ.get("NM_CI", "0") not in ("", "0")

D, HEADS, N_MELS, N_AUDIO_CTX, N_TEXT_CTX = 8, 2, 80, 1500, 16
LANGS = ["en", "zh", "de", "es", "ru", "ko", "fr", "ja", "pt", "tr", "pl", "ca", "nl", "ar", "sv", "it", "id",
         "hi", "fi", "vi", "iw", "uk", "el", "ms", "cs", "ro", "da", "hu", "ta", "no", "th", "ur", "hr", "bg",
         "lt", "la", "mi", "ml", "cy", "sk", "te", "fa", "lv", "bn", "sr", "az", "sl", "kn", "et", "mk", "br",
         "eu", "is", "hy", "ne", "mn", "bs", "kk", "sq", "sw", "gl", "mr", "pa", "si", "km", "sn", "yo", "so",
         "af", "oc", "ka", "be", "tg", "sd", "gu", "am", "yi", "lo", "uz", "fo", "ht", "ps", "tk", "nn", "mt",
         "sa", "lb", "my", "bo", "tl", "mg", "as", "tt", "haw", "ln", "ha", "ba", "jw", "su"]  # 99, HF's <|iw|>
EOT = 50256


# ---- GPT-2 byte-level strings (its definition) --------------------------------------------
def byte_encoder():
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


BENC = byte_encoder()


def vocabulary():
    """(tokens as vocabulary.txt spells them, the ordinary tokens' bytes): ids < 256 single bytes,
    then two or three bytes of every value, then whisper's .en specials."""
    raw = [bytes([i]) for i in range(256)]
    for i in range(256, EOT):
        raw.append(bytes([(i * 7) % 256, (i * 13 + 5) % 256] + ([i % 251] if i % 3 == 0 else [])))
    toks = ["".join(BENC[b] for b in r) for r in raw]
    toks += ["<|endoftext|>", "<|startoftranscript|>"] + ["<|%s|>" % c for c in LANGS]
    toks += ["<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nocaptions|>",
             "<|notimestamps|>"] + ["<|%.2f|>" % (0.02 * k) for k in range(1501)]
    assert len(toks) == 51864
    return toks, raw


def sinusoids(length, channels):
    """whisper's model.py sinusoids(), in float64."""
    inc = np.log(10000) / (channels // 2 - 1)
    inv = np.exp(-inc * np.arange(channels // 2))
    t = np.arange(length)[:, None] * inv[None, :]
    return np.concatenate([np.sin(t), np.cos(t)], axis=1)


# ---- CTranslate2 model.bin ----------------------------------------------------------------
CT2_DT = {np.dtype(np.float32): 0, np.dtype(np.int8): 1, np.dtype(np.int16): 2, np.dtype(np.int32): 3,
          np.dtype(np.float16): 4}


def ct2_str(s):
    b = s.encode() + b"\0"
    return struct.pack("<H", len(b)) + b


def write_ct2(path, variables, aliases):
    out = [struct.pack("<I", 6), ct2_str("WhisperSpec"), struct.pack("<II", 3, len(variables))]
    for name, a in variables.items():
        a = np.ascontiguousarray(a)
        data = a.astype(a.dtype.newbyteorder("<")).tobytes()
        out.append(ct2_str(name) + struct.pack("<B", a.ndim) + struct.pack("<%dI" % a.ndim, *a.shape) +
                   struct.pack("<BI", CT2_DT[a.dtype], len(data)) + data)
    out.append(struct.pack("<I", len(aliases)))
    for alias, target in aliases:
        out.append(ct2_str(alias) + ct2_str(target))
    with open(path, "wb") as f:
        f.write(b"".join(out))


def make_model(dirname, seed, n_enc, n_dec, enc_pe, int8_name=None):
    """Writes model.bin, config.json, vocabulary.txt into dirname. Returns (want, tokens, raw, config):
    {whisper name: ("mat" or "vec", float32 values)}, the vocabulary as written and as bytes, and
    config.json's contents."""
    rng = np.random.default_rng(seed)
    d = D
    v, want = {}, {}

    def r(*shape, dt=np.float16):
        return (rng.standard_normal(shape) * 0.5).astype(dt)

    def lin(ct2, names, rows_out, n_in):
        """A linear layer stored fused as CTranslate2 does, and its whisper pieces."""
        b = r(rows_out, dt=np.float32)
        if ct2 + "/weight" == int8_name:  # int8 with a scale per output row: value = q / scale
            q = rng.integers(-127, 128, (rows_out, n_in)).astype(np.int8)
            s = (rng.random(rows_out) * 50 + 10).astype(np.float32)
            v[ct2 + "/weight"], v[ct2 + "/weight_scale"] = q, s
            wf = q.astype(np.float32) / s[:, None]
        else:
            v[ct2 + "/weight"] = r(rows_out, n_in)
            wf = v[ct2 + "/weight"].astype(np.float32)
        per = rows_out // len(names)
        for i, nm in enumerate(names):
            if nm.endswith(".key"):
                b[i * per:(i + 1) * per] = 0  # whisper's key has no bias; CTranslate2 stores zeros
            want[nm + ".weight"] = ("mat", wf[i * per:(i + 1) * per])
            if not nm.endswith(".key"):
                want[nm + ".bias"] = ("vec", b[i * per:(i + 1) * per])
        v[ct2 + "/bias"] = b

    def ln(ct2, nm):
        v[ct2 + "/gamma"], v[ct2 + "/beta"] = r(d), r(d, dt=np.float32)
        want[nm + ".weight"] = ("vec", v[ct2 + "/gamma"].astype(np.float32))
        want[nm + ".bias"] = ("vec", v[ct2 + "/beta"])

    v["encoder/num_heads"] = np.array(HEADS, dtype=np.int16)
    v["decoder/num_heads"] = np.array(HEADS, dtype=np.int16)
    v["decoder/activation"] = np.array(3, dtype=np.int8)
    v["decoder/pre_norm"] = np.array(1, dtype=np.int8)
    for k in (1, 2):
        n_in = N_MELS if k == 1 else d
        v[f"encoder/conv{k}/weight"], v[f"encoder/conv{k}/bias"] = r(d, n_in, 3), r(d)
        want[f"encoder.conv{k}.weight"] = ("mat", v[f"encoder/conv{k}/weight"].astype(np.float32))
        want[f"encoder.conv{k}.bias"] = ("vec", v[f"encoder/conv{k}/bias"].astype(np.float32).reshape(d, 1))
    if enc_pe:
        v["encoder/position_encodings/encodings"] = sinusoids(N_AUDIO_CTX, d).astype(np.float16)
        want["encoder.positional_embedding"] = ("vec", v["encoder/position_encodings/encodings"].astype(np.float32))
    for i in range(n_enc):
        p, q = f"encoder/layer_{i}", f"encoder.blocks.{i}"
        ln(p + "/self_attention/layer_norm", q + ".attn_ln")
        lin(p + "/self_attention/linear_0", [q + ".attn.query", q + ".attn.key", q + ".attn.value"], 3 * d, d)
        lin(p + "/self_attention/linear_1", [q + ".attn.out"], d, d)
        ln(p + "/ffn/layer_norm", q + ".mlp_ln")
        lin(p + "/ffn/linear_0", [q + ".mlp.0"], 4 * d, d)
        lin(p + "/ffn/linear_1", [q + ".mlp.2"], d, 4 * d)
    ln("encoder/layer_norm", "encoder.ln_post")
    v["decoder/embeddings/weight"] = r(51864, d)
    want["decoder.token_embedding.weight"] = ("mat", v["decoder/embeddings/weight"].astype(np.float32))
    v["decoder/position_encodings/encodings"] = r(N_TEXT_CTX, d, dt=np.float32)
    want["decoder.positional_embedding"] = ("vec", v["decoder/position_encodings/encodings"])
    for i in range(n_dec):
        p, q = f"decoder/layer_{i}", f"decoder.blocks.{i}"
        ln(p + "/self_attention/layer_norm", q + ".attn_ln")
        lin(p + "/self_attention/linear_0", [q + ".attn.query", q + ".attn.key", q + ".attn.value"], 3 * d, d)
        lin(p + "/self_attention/linear_1", [q + ".attn.out"], d, d)
        ln(p + "/attention/layer_norm", q + ".cross_attn_ln")
        lin(p + "/attention/linear_0", [q + ".cross_attn.query"], d, d)
        lin(p + "/attention/linear_1", [q + ".cross_attn.key", q + ".cross_attn.value"], 2 * d, d)
        lin(p + "/attention/linear_2", [q + ".cross_attn.out"], d, d)
        ln(p + "/ffn/layer_norm", q + ".mlp_ln")
        lin(p + "/ffn/linear_0", [q + ".mlp.0"], 4 * d, d)
        lin(p + "/ffn/linear_1", [q + ".mlp.2"], d, 4 * d)
    ln("decoder/layer_norm", "decoder.ln")
    write_ct2(os.path.join(dirname, "model.bin"), v, [("decoder/projection/weight", "decoder/embeddings/weight")])
    toks, raw = vocabulary()
    with open(os.path.join(dirname, "vocabulary.txt"), "w", encoding="utf-8", newline="\n") as f:
        f.write("\n".join(toks) + "\n")
    cfg = {"suppress_ids": [1, 2, 7, 50357], "suppress_ids_begin": [220, 50256],
           "alignment_heads": [[0, 1], [n_dec - 1, 0]], "lang_ids": list(range(50258, 50357))}
    with open(os.path.join(dirname, "config.json"), "w") as f:
        json.dump(cfg, f)
    return want, toks, raw, cfg


# ---- readers of the outputs (independent of the converter) --------------------------------
GGML_TYPES = {0: ("f32", "<f4"), 1: ("f16", "<f2")}


def read_gguf(path):
    """(metadata dict, {name: (type name, numpy shape, float32 array, raw bytes)}), by the references' reader."""
    g = Gguf(path)
    assert struct.unpack_from("<I", g.buf, 4)[0] == 3, "GGUF version"
    tensors = {}
    for name, (ne, t, start, nbytes) in g.tensors.items():
        tn, dt = GGML_TYPES[t]
        raw = g.buf[start:start + nbytes]
        tensors[name] = (tn, tuple(reversed(ne)), np.frombuffer(raw, dtype=dt).astype(np.float32), raw)
    return g.kv, tensors


def read_ggml_bin(path):
    """(hparams list of 11, filters, [token bytes], {name: (type name, numpy shape, float32, raw)})."""
    buf = open(path, "rb").read()
    off = 0

    def take(fmt):
        nonlocal off
        vals = struct.unpack_from(fmt, buf, off)
        off += struct.calcsize(fmt)
        return vals

    assert take("<I")[0] == 0x67676D6C, "bad magic"
    hp = list(take("<11i"))
    n_mel, n_fft = take("<ii")
    filters = np.frombuffer(buf, dtype="<f4", count=n_mel * n_fft, offset=off).reshape(n_mel, n_fft)
    off += 4 * n_mel * n_fft
    toks = []
    for _ in range(take("<i")[0]):
        n = take("<I")[0]
        toks.append(buf[off:off + n])
        off += n
    tensors = {}
    while off < len(buf):
        nd, nl, t = take("<iii")
        ne = take("<%di" % nd)
        name = buf[off:off + nl].decode()
        off += nl
        tn, dt = GGML_TYPES[t]
        size = int(np.prod(ne)) * np.dtype(dt).itemsize
        raw = buf[off:off + size]
        off += size
        assert name not in tensors, "tensor %s twice" % name
        tensors[name] = (tn, tuple(reversed(ne)), np.frombuffer(raw, dtype=dt).astype(np.float32), raw)
    assert off == len(buf)
    return hp, filters, toks, tensors


# ---- the cases ----------------------------------------------------------------------------
results = {"passed": 0, "failed": 0, "skipped": 0}


class Skip(Exception):
    pass


def case(fn):
    """Runs fn now; counts it passed, failed or skipped (a skip is a failure under NM_CI)."""
    try:
        fn()
        print("ok   %s" % fn.__name__)
        results["passed"] += 1
    except Skip as e:
        print("%s %s: %s" % ("FAIL" if CI else "skip", fn.__name__, e))
        results["failed" if CI else "skipped"] += 1
    except AssertionError as e:
        print("FAIL %s: %s" % (fn.__name__, e))
        results["failed"] += 1
    except Exception as e:  # the converter or a reader crashed: a failure of the case, not of the run
        print("FAIL %s: %s: %s" % (fn.__name__, type(e).__name__, e))
        results["failed"] += 1
    return fn


def convert(model_dir, out, *flags, expect=0):
    p = subprocess.run([sys.executable, CONV, model_dir, out] + list(flags), capture_output=True, text=True)
    assert p.returncode == expect, "convert %s: exit %d, expected %d\n%s" % (" ".join(flags), p.returncode,
                                                                            expect, p.stderr[-3000:])
    return p


def mel_filters_ref(n_mels):
    """librosa.filters.mel(sr=16000, n_fft=400, n_mels) written from its definition (slaney)."""
    def hz_to_mel(f):
        f = np.asarray(f, dtype=np.float64)
        return np.where(f < 1000, f * 3 / 200, 15 + np.log(np.maximum(f, 1e-10) / 1000) / (np.log(6.4) / 27))

    def mel_to_hz(m):
        return np.where(m < 15, m * 200 / 3, 1000 * np.exp((np.log(6.4) / 27) * (m - 15)))

    pts = mel_to_hz(np.linspace(0, hz_to_mel(8000.0), n_mels + 2))
    f = np.linspace(0, 8000, 201)
    w = np.maximum(0, np.minimum((f - pts[:-2, None]) / (pts[1:-1] - pts[:-2])[:, None],
                                 (pts[2:, None] - f) / (pts[2:] - pts[1:-1])[:, None]))
    return w * (2 / (pts[2:] - pts[:-2]))[:, None]


def check_gguf(path, want, toks, cfg, outtype, name, model_bin, n_enc, n_dec):
    kv, t = read_gguf(path)
    assert kv["general.architecture"] == "whisper"
    assert kv["general.name"] == name, "general.name %r, expected %r" % (kv["general.name"], name)
    assert kv["general.file_type"] == (1 if outtype == "f16" else 0), "file_type %r" % kv["general.file_type"]
    assert kv["whisper.source"] == "ctranslate2"
    assert kv["whisper.source.sha256"] == hashlib.sha256(open(model_bin, "rb").read()).hexdigest()
    hp = dict(n_vocab=51864, n_audio_ctx=N_AUDIO_CTX, n_audio_state=D, n_audio_head=HEADS, n_audio_layer=n_enc,
              n_text_ctx=N_TEXT_CTX, n_text_state=D, n_text_head=HEADS, n_text_layer=n_dec, n_mels=N_MELS)
    for k, x in hp.items():
        assert kv["whisper." + k] == x, "whisper.%s = %r, expected %r" % (k, kv["whisper." + k], x)
    special = dict(eot=50256, sot=50257, translate=50357, transcribe=50358, solm=50359, prev=50360, nospeech=50361,
                   notimestamps=50362, timestamp_begin=50363)
    for k, x in special.items():
        assert kv["whisper.token." + k] == x, "whisper.token.%s = %r, expected %r" % (k, kv["whisper.token." + k], x)
    langs = [("he" if c == "iw" else c) for c in LANGS]
    assert kv["whisper.languages"] == langs, "languages"
    fixed = [{"<|iw|>": "<|he|>", "<|nocaptions|>": "<|nospeech|>"}.get(s, s) for s in toks]
    assert kv["whisper.tokenizer.tokens"] == fixed, "tokens"
    assert kv["whisper.suppress_tokens"] == cfg["suppress_ids"]
    assert kv["whisper.begin_suppress_tokens"] == cfg["suppress_ids_begin"]
    assert kv["whisper.alignment_heads"] == [x for p in cfg["alignment_heads"] for x in p]
    full = dict(want)
    full["mel_filters"] = ("vec", None)
    assert set(t) == set(full), "tensors: missing %s, unexpected %s" % (sorted(set(full) - set(t)),
                                                                      sorted(set(t) - set(full)))
    for nm, (kind, a) in want.items():
        tn, shape, got, _ = t[nm]
        wt = "f16" if kind == "mat" and outtype == "f16" else "f32"
        assert tn == wt, "%s is %s, expected %s" % (nm, tn, wt)
        assert shape == a.shape, "%s has shape %s, expected %s" % (nm, shape, a.shape)
        ref = a.astype(np.float32).astype(np.float16 if wt == "f16" else np.float32).astype(np.float32)
        assert np.array_equal(got, ref.reshape(-1)), "%s: values differ (max %g)" % (
            nm, float(np.max(np.abs(got - ref.reshape(-1)))))
    tn, shape, got, _ = t["mel_filters"]
    assert tn == "f32" and shape == (N_MELS, 201)
    assert np.max(np.abs(got.reshape(shape) - mel_filters_ref(N_MELS))) < 1e-6, "mel filters"
    return kv, t


def check_bin(path, gguf_tensors, raw_toks, outtype, n_enc, n_dec, pe_added):
    hp, filters, btoks, bt = read_ggml_bin(path)
    want_hp = [51864, N_AUDIO_CTX, D, HEADS, n_enc, N_TEXT_CTX, D, HEADS, n_dec, N_MELS, 1 if outtype == "f16" else 0]
    assert hp == want_hp, "hparams %s, expected %s" % (hp, want_hp)
    assert np.array_equal(filters.reshape(-1), gguf_tensors["mel_filters"][2]), "filters differ from the GGUF's"
    assert btoks == raw_toks, "the .bin's tokens are not the %d ordinary tokens' bytes" % len(raw_toks)
    names = set(gguf_tensors) - {"mel_filters"}
    if pe_added:
        assert "encoder.positional_embedding" not in names
        names.add("encoder.positional_embedding")
    assert set(bt) == names, "tensors: missing %s, unexpected %s" % (sorted(names - set(bt)),
                                                                   sorted(set(bt) - names))
    for nm in names:
        tn, shape, got, raw = bt[nm]
        if nm == "encoder.positional_embedding" and pe_added:
            assert tn == "f32" and shape == (N_AUDIO_CTX, D), "added positions: %s %s" % (tn, shape)
            assert np.max(np.abs(got - sinusoids(N_AUDIO_CTX, D).reshape(-1))) < 1e-6, "added positions' values"
            continue
        gtn, gshape, _, graw = gguf_tensors[nm]
        assert (tn, shape) == (gtn, gshape), "%s: .bin %s %s, GGUF %s %s" % (nm, tn, shape, gtn, gshape)
        assert raw == graw, "%s: the .bin's bytes differ from the GGUF's" % nm


def main():
    tmp = tempfile.TemporaryDirectory(prefix="nm-test-convert-")
    T = tmp.name
    a_dir, b_dir = os.path.join(T, "a"), os.path.join(T, "b")
    os.makedirs(a_dir)
    os.makedirs(b_dir)
    want_a, toks, raw, cfg_a = make_model(a_dir, 1, 2, 1, True, int8_name="encoder/layer_1/ffn/linear_0/weight")
    want_b, _, _, cfg_b = make_model(b_dir, 2, 1, 2, False)
    ordinary = raw[:EOT]
    out = {}

    @case
    def gguf_defaults():
        p = os.path.join(T, "a.gguf")
        convert(a_dir, p)
        check_gguf(p, want_a, toks, cfg_a, "f16", "whisper", os.path.join(a_dir, "model.bin"), 2, 1)
        left = sorted(f for f in os.listdir(T) if f.endswith((".partial", ".bin")))
        assert not left, "left behind without --ggml-bin: %s" % left
        out["a.gguf"] = p

    @case
    def outtype_f16_is_the_default():
        p = os.path.join(T, "a16.gguf")
        convert(a_dir, p, "--outtype", "f16")
        check_gguf(p, want_a, toks, cfg_a, "f16", "whisper", os.path.join(a_dir, "model.bin"), 2, 1)
        assert "a.gguf" in out and open(p, "rb").read() == open(out["a.gguf"], "rb").read(), \
            "--outtype f16 differs from the default"

    @case
    def outtype_f32_and_name():
        p = os.path.join(T, "a32.gguf")
        convert(a_dir, p, "--outtype", "f32", "--name", "tiny-test.en")
        check_gguf(p, want_a, toks, cfg_a, "f32", "tiny-test.en", os.path.join(a_dir, "model.bin"), 2, 1)

    @case
    def ggml_bin_f16():
        g, b = os.path.join(T, "a-bin16.gguf"), os.path.join(T, "a16.bin")
        convert(a_dir, g, "--ggml-bin", b)
        _, t = check_gguf(g, want_a, toks, cfg_a, "f16", "whisper", os.path.join(a_dir, "model.bin"), 2, 1)
        check_bin(b, t, ordinary, "f16", 2, 1, False)
        assert not os.path.exists(b + ".partial")
        out["a16"] = (g, b)

    @case
    def ggml_bin_f32():
        g, b = os.path.join(T, "a-bin32.gguf"), os.path.join(T, "a32.bin")
        convert(a_dir, g, "--ggml-bin", b, "--outtype", "f32", "--name", "x")
        _, t = check_gguf(g, want_a, toks, cfg_a, "f32", "x", os.path.join(a_dir, "model.bin"), 2, 1)
        check_bin(b, t, ordinary, "f32", 2, 1, False)
        out["a32"] = (g, b)

    @case
    def ggml_bin_adds_encoder_positions():
        g, b = os.path.join(T, "b.gguf"), os.path.join(T, "b.bin")
        convert(b_dir, g, "--ggml-bin", b)
        _, t = check_gguf(g, want_b, toks, cfg_b, "f16", "whisper", os.path.join(b_dir, "model.bin"), 1, 2)
        check_bin(b, t, ordinary, "f16", 1, 2, True)

    @case
    def bad_input_and_usage():
        bad = os.path.join(T, "bad")
        os.makedirs(bad)
        for f in ("config.json", "vocabulary.txt"):
            with open(os.path.join(a_dir, f), "rb") as src, open(os.path.join(bad, f), "wb") as dst:
                dst.write(src.read())
        with open(os.path.join(a_dir, "model.bin"), "rb") as src, open(os.path.join(bad, "model.bin"), "wb") as dst:
            dst.write(src.read()[:-7])  # truncated
        o, ob = os.path.join(T, "bad.gguf"), os.path.join(T, "bad.bin")
        p = convert(bad, o, "--ggml-bin", ob, expect=1)
        assert p.stderr.startswith("convert_whisper_ct2: ") and "Traceback" not in p.stderr, p.stderr[-500:]
        assert not any(os.path.exists(x) for x in (o, ob, o + ".partial", ob + ".partial")), "output left"
        p = convert(a_dir, o, "--outtype", "q8_0", expect=2)
        assert "--outtype" in p.stderr and not os.path.exists(o)
        p = subprocess.run([sys.executable, CONV, a_dir], capture_output=True, text=True)
        assert p.returncode == 2, "a missing OUT: exit %d" % p.returncode
        h = subprocess.run([sys.executable, CONV, "--help"], capture_output=True, text=True)
        assert h.returncode == 0
        flags = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", h.stdout)) - {"--help"}
        assert flags == {"--ggml-bin", "--outtype", "--name"}, "flags of --help: %s (a new flag needs a case here)" % flags
        doc = open(CONV).read().split('"""')[1]
        usage = [l for l in doc.splitlines() if "convert_whisper_ct2.py MODEL_DIR" in l][0]
        for f in flags:
            assert f in usage, "the docstring's usage line lacks %s" % f

    @case
    def nanomind_reads_gguf_and_bin_alike():
        if not NM or not os.path.exists(NM):
            raise Skip("needs the nanomind binary (argument 1)")
        assert "a16" in out and "a32" in out, "the .bin cases failed"
        wav = os.path.join(T, "tone.wav")
        n = 32000
        x = (np.sin(2 * np.pi * 440 * np.arange(n) / 16000) * 8000 +
             np.random.default_rng(5).standard_normal(n) * 2000).astype("<i2")
        with open(wav, "wb") as f:
            f.write(b"RIFF" + struct.pack("<I", 36 + 2 * n) + b"WAVEfmt " +
                    struct.pack("<IHHIIHH", 16, 1, 1, 16000, 32000, 2, 16) + b"data" + struct.pack("<I", 2 * n) +
                    x.tobytes())
        for kind in ("a16", "a32"):
            outs = []
            for model in out[kind]:
                p = subprocess.run([NM, "transcribe", "-m", model, wav, "-t", "2", "-bs", "1", "-nf", "--print-json"],
                                   capture_output=True, timeout=300)  # random weights: bytes, not UTF-8
                assert p.returncode == 0, "nanomind transcribe -m %s: exit %d\n%s" % (model, p.returncode,
                                                                                   p.stderr[-2000:].decode("utf-8", "replace"))
                # the JSON's "model" is the file's name: whisper (general.name) or ggml-custom.en (a .bin's)
                outs.append(re.sub(rb'\n  "model": "[^"]*",', b"", p.stdout))
            assert outs[0] == outs[1], "%s: the GGUF and the .bin transcribe differently:\n%s\n%s" % (
                kind, outs[0][:800], outs[1][:800])
            assert b'"segments"' in outs[0], "no segments in %r" % outs[0][:400]

    tmp.cleanup()
    print("%d passed, %d failed, %d skipped" % (results["passed"], results["failed"], results["skipped"]))
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
