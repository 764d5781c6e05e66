#!/usr/bin/env python3
"""Convert a CTranslate2 Whisper model into nanomind's Whisper GGUF.

    convert_whisper_ct2.py MODEL_DIR OUT.gguf [--ggml-bin OUT.bin] [--outtype f16|f32] [--name NAME]

MODEL_DIR holds what CTranslate2's converter writes: model.bin (the weights),
config.json (suppress lists, alignment heads, language ids) and vocabulary.txt
(one GPT-2 byte-level BPE token per line, ids = line numbers). Only Python and
numpy are needed: model.bin is parsed here and the GGUF is written here.

--ggml-bin also writes the same model in whisper.cpp's legacy `ggml` layout
(what its models/convert-pt-to-ggml.py writes), so one conversion can feed
both loaders. The layouts are documented in docs/whisper_gguf.md.

The mel filterbank is computed (librosa's slaney mel, as whisper's
mel_filters.npz was made), never downloaded.
"""
import argparse
import hashlib
import json
import os
import re
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_writer import ALIGN, GGML, GgufWriter  # noqa: E402

# ---- CTranslate2 model.bin ---------------------------------------------------------------
# Layout (little-endian), as CTranslate2's ModelSpec._serialize writes it, binary version >= 4:
#   u32 binary_version; str spec_name; u32 spec_revision; u32 n_variables;
#   n_variables x { str name; u8 rank; u32 dims[rank]; u8 dtype; u32 n_bytes; bytes data }
#   u32 n_aliases; n_aliases x { str alias; str target }
# where str = u16 length (including a trailing NUL) + bytes + NUL.
CT2_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16, 5: "bfloat16"}


class FormatError(Exception):
    pass


class Reader:
    def __init__(self, buf):
        self.buf = buf
        self.off = 0

    def take(self, n, what):
        if n < 0 or self.off + n > len(self.buf):
            raise FormatError(f"model.bin truncated reading {what} at offset {self.off}")
        b = self.buf[self.off:self.off + n]
        self.off += n
        return b

    def u8(self, what):
        return self.take(1, what)[0]

    def u16(self, what):
        return struct.unpack("<H", self.take(2, what))[0]

    def u32(self, what):
        return struct.unpack("<I", self.take(4, what))[0]

    def string(self, what):
        n = self.u16(what)
        if n == 0:
            raise FormatError(f"model.bin: empty string record for {what}")
        b = bytes(self.take(n, what))
        if b[-1] != 0:
            raise FormatError(f"model.bin: string for {what} is not NUL-terminated")
        return b[:-1].decode("utf-8")


def read_ct2(path):
    """Returns (spec_name, revision, {name: np.ndarray}) with aliases resolved."""
    with open(path, "rb") as f:
        buf = memoryview(f.read())
    r = Reader(buf)
    version = r.u32("binary version")
    if version < 4 or version > 6:
        raise FormatError(f"model.bin: binary version {version} (this reader knows 4..6)")
    spec = r.string("spec name")
    revision = r.u32("spec revision")
    n = r.u32("variable count")
    if n > 1 << 20:
        raise FormatError(f"model.bin: {n} variables is not plausible")
    out = {}
    for _ in range(n):
        name = r.string("variable name")
        rank = r.u8(name)
        dims = [r.u32(name) for _ in range(rank)]
        dtype_id = r.u8(name)
        nbytes = r.u32(name)
        data = r.take(nbytes, name)
        if dtype_id not in CT2_DTYPES:
            raise FormatError(f"model.bin: variable {name} has unknown dtype id {dtype_id}")
        dt = CT2_DTYPES[dtype_id]
        count = int(np.prod(dims)) if dims else 1
        if dt == "bfloat16":
            if nbytes != 2 * count:
                raise FormatError(f"model.bin: variable {name}: {nbytes} bytes for {dims} bfloat16")
            a = (np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            dt = np.dtype(dt).newbyteorder("<")
            if nbytes != dt.itemsize * count:
                raise FormatError(f"model.bin: variable {name}: {nbytes} bytes for {dims} {dt}")
            a = np.frombuffer(data, dtype=dt)
        out[name] = a.reshape(dims) if dims else a.reshape(())
    n_alias = r.u32("alias count")
    for _ in range(n_alias):
        alias = r.string("alias")
        target = r.string("alias target")
        if target not in out:
            raise FormatError(f"model.bin: alias {alias} -> unknown {target}")
        out[alias] = out[target]
    if r.off != len(buf):
        raise FormatError(f"model.bin: {len(buf) - r.off} trailing bytes")
    return spec, revision, out


# ---- whisper's fixed pieces, computed -----------------------------------------------------
def hz_to_mel_slaney(f):
    f = np.asarray(f, dtype=np.float64)
    f_sp = 200.0 / 3
    mels = f / f_sp
    min_log_hz = 1000.0
    min_log_mel = min_log_hz / f_sp
    logstep = np.log(6.4) / 27.0
    return np.where(f >= min_log_hz, min_log_mel + np.log(np.maximum(f, 1e-10) / min_log_hz) / logstep, mels)


def mel_to_hz_slaney(m):
    m = np.asarray(m, dtype=np.float64)
    f_sp = 200.0 / 3
    freqs = f_sp * m
    min_log_hz = 1000.0
    min_log_mel = min_log_hz / f_sp
    logstep = np.log(6.4) / 27.0
    return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), freqs)


def mel_filters(sr=16000, n_fft=400, n_mels=80):
    """librosa.filters.mel(sr, n_fft, n_mels) with its defaults (fmin 0, fmax sr/2,
    slaney mel scale, slaney area normalisation), float32: (n_mels, 1 + n_fft // 2)."""
    fftfreqs = np.linspace(0, sr / 2, 1 + n_fft // 2)
    mel_f = mel_to_hz_slaney(np.linspace(hz_to_mel_slaney(0.0), hz_to_mel_slaney(sr / 2), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = mel_f[:, None] - fftfreqs[None, :]
    w = np.zeros((n_mels, len(fftfreqs)), dtype=np.float64)
    for i in range(n_mels):
        lower = -ramps[i] / fdiff[i]
        upper = ramps[i + 2] / fdiff[i + 1]
        w[i] = np.maximum(0, np.minimum(lower, upper))
    w *= (2.0 / (mel_f[2:n_mels + 2] - mel_f[:n_mels]))[:, None]
    return w.astype(np.float32)


def sinusoids(length, channels, max_timescale=10000):
    """whisper's encoder position embedding: [sin | cos] of length x channels/2 frequencies."""
    inc = np.log(max_timescale) / (channels // 2 - 1)
    inv = np.exp(-inc * np.arange(channels // 2))
    t = np.arange(length)[:, None] * inv[None, :]
    return np.concatenate([np.sin(t), np.cos(t)], axis=1).astype(np.float32)


def bytes_to_unicode():
    """GPT-2's reversible byte <-> printable code point map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


BYTE_DECODER = {v: k for k, v in bytes_to_unicode().items()}


def token_bytes(tok):
    try:
        return bytes(BYTE_DECODER[c] for c in tok)
    except KeyError as e:
        raise FormatError(f"vocabulary: token {tok!r} is not GPT-2 byte-level BPE ({e})")


# ---- the model --------------------------------------------------------------------------
class Model:
    def __init__(self):
        self.hp = {}
        self.tensors = []  # (name, np.ndarray float32, kind) kind: "mat" (f16-able) or "vec" (f32)
        self.tokens = []
        self.special = {}
        self.languages = []
        self.suppress = []
        self.begin_suppress = []
        self.alignment_heads = []
        self.filters = None
        self.source_sha256 = ""


def weight(v, name):
    a = v[name]
    scale = v.get(name + "_scale")
    if a.dtype == np.int8:
        if scale is None:
            raise FormatError(f"{name} is int8 without {name}_scale")
        s = np.asarray(scale, dtype=np.float32).reshape(-1, *([1] * (a.ndim - 1)))
        return a.astype(np.float32) / s
    if a.dtype not in (np.float16, np.float32):
        raise FormatError(f"{name} has dtype {a.dtype}, expected a float or int8+scale")
    return a.astype(np.float32)


def scalar(v, name, default=None):
    if name not in v:
        if default is None:
            raise FormatError(f"model.bin: missing {name}")
        return default
    return int(np.asarray(v[name]).reshape(-1)[0])


def build(model_dir):
    m = Model()
    bin_path = os.path.join(model_dir, "model.bin")
    h = hashlib.sha256()
    with open(bin_path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    m.source_sha256 = h.hexdigest()
    spec, revision, v = read_ct2(bin_path)
    if spec != "WhisperSpec":
        raise FormatError(f"model.bin holds a {spec}, not a WhisperSpec")
    # Whisper's fixed architecture: pre-norm, exact GELU, unscaled embeddings.
    for name, want in (("decoder/activation", 3), ("decoder/pre_norm", 1), ("decoder/scale_embeddings", 0),
                       ("decoder/alibi", 0)):
        got = scalar(v, name, want)
        if got != want:
            raise FormatError(f"model.bin: {name} = {got}, Whisper has {want}")

    conv1 = weight(v, "encoder/conv1/weight")  # (n_state, n_mels, 3)
    if conv1.ndim != 3 or conv1.shape[2] != 3:
        raise FormatError(f"encoder/conv1/weight has shape {conv1.shape}")
    n_state, n_mels = conv1.shape[0], conv1.shape[1]
    n_enc = len({k.split("/")[1] for k in v if re.match(r"encoder/layer_\d+/", k)})
    n_dec = len({k.split("/")[1] for k in v if re.match(r"decoder/layer_\d+/", k)})
    emb = weight(v, "decoder/embeddings/weight")  # (n_vocab, n_state)
    dec_pe = weight(v, "decoder/position_encodings/encodings")  # (n_text_ctx, n_state)
    enc_pe = weight(v, "encoder/position_encodings/encodings") if "encoder/position_encodings/encodings" in v else None
    n_audio_ctx = enc_pe.shape[0] if enc_pe is not None else 1500
    m.hp = dict(n_vocab=emb.shape[0], n_audio_ctx=n_audio_ctx, n_audio_state=n_state,
                n_audio_head=scalar(v, "encoder/num_heads"), n_audio_layer=n_enc,
                n_text_ctx=dec_pe.shape[0], n_text_state=emb.shape[1],
                n_text_head=scalar(v, "decoder/num_heads"), n_text_layer=n_dec, n_mels=n_mels)
    if emb.shape[1] != n_state or dec_pe.shape[1] != n_state:
        raise FormatError("encoder and decoder widths differ")
    if n_state % m.hp["n_audio_head"] or n_state % m.hp["n_text_head"]:
        raise FormatError("heads do not divide the width")
    if enc_pe is not None:
        diff = float(np.max(np.abs(enc_pe - sinusoids(n_audio_ctx, n_state))))
        if diff > 1e-2:  # stored as f16: a few 1e-4 of rounding
            raise FormatError(f"encoder position encodings are not whisper's sinusoids (max diff {diff})")

    T = m.tensors

    def add(name, a, kind):
        T.append((name, np.ascontiguousarray(a, dtype=np.float32), kind))

    def lin(dst, src, rows=None):
        w = weight(v, src + "/weight")
        b = weight(v, src + "/bias") if src + "/bias" in v else None
        parts = rows or [(dst, 0, w.shape[0])]
        for nm, r0, r1 in parts:
            add(nm + ".weight", w[r0:r1], "mat")
            if b is not None:
                bb = b[r0:r1]
                if nm.endswith(".key"):  # whisper's key projection has no bias; CTranslate2 fuses zeros
                    if np.any(bb != 0):
                        add(nm + ".bias", bb, "vec")
                else:
                    add(nm + ".bias", bb, "vec")

    def ln(dst, src):
        add(dst + ".weight", weight(v, src + "/gamma"), "vec")
        add(dst + ".bias", weight(v, src + "/beta"), "vec")

    d = n_state
    # Encoder.
    if enc_pe is not None:
        add("encoder.positional_embedding", enc_pe, "vec")
    add("encoder.conv1.weight", conv1, "mat")
    add("encoder.conv1.bias", weight(v, "encoder/conv1/bias").reshape(d, 1), "vec")
    add("encoder.conv2.weight", weight(v, "encoder/conv2/weight"), "mat")
    add("encoder.conv2.bias", weight(v, "encoder/conv2/bias").reshape(d, 1), "vec")
    for i in range(n_enc):
        p, q = f"encoder/layer_{i}", f"encoder.blocks.{i}"
        ln(q + ".attn_ln", p + "/self_attention/layer_norm")
        lin(None, p + "/self_attention/linear_0",
            [(q + ".attn.query", 0, d), (q + ".attn.key", d, 2 * d), (q + ".attn.value", 2 * d, 3 * d)])
        lin(q + ".attn.out", p + "/self_attention/linear_1")
        ln(q + ".mlp_ln", p + "/ffn/layer_norm")
        lin(q + ".mlp.0", p + "/ffn/linear_0")
        lin(q + ".mlp.2", p + "/ffn/linear_1")
    ln("encoder.ln_post", "encoder/layer_norm")
    # Decoder.
    add("decoder.positional_embedding", dec_pe, "vec")
    add("decoder.token_embedding.weight", emb, "mat")
    for i in range(n_dec):
        p, q = f"decoder/layer_{i}", f"decoder.blocks.{i}"
        ln(q + ".attn_ln", p + "/self_attention/layer_norm")
        lin(None, p + "/self_attention/linear_0",
            [(q + ".attn.query", 0, d), (q + ".attn.key", d, 2 * d), (q + ".attn.value", 2 * d, 3 * d)])
        lin(q + ".attn.out", p + "/self_attention/linear_1")
        ln(q + ".cross_attn_ln", p + "/attention/layer_norm")
        lin(q + ".cross_attn.query", p + "/attention/linear_0")
        lin(None, p + "/attention/linear_1", [(q + ".cross_attn.key", 0, d), (q + ".cross_attn.value", d, 2 * d)])
        lin(q + ".cross_attn.out", p + "/attention/linear_2")
        ln(q + ".mlp_ln", p + "/ffn/layer_norm")
        lin(q + ".mlp.0", p + "/ffn/linear_0")
        lin(q + ".mlp.2", p + "/ffn/linear_1")
    ln("decoder.ln", "decoder/layer_norm")
    if "decoder/projection/weight" in v and not np.array_equal(weight(v, "decoder/projection/weight"), emb):
        raise FormatError("decoder/projection/weight differs from the token embedding (Whisper ties them)")

    # Vocabulary: line i is token i.
    with open(os.path.join(model_dir, "vocabulary.txt"), "r", encoding="utf-8", newline="\n") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) != m.hp["n_vocab"]:
        raise FormatError(f"vocabulary.txt has {len(lines)} tokens, the embedding {m.hp['n_vocab']} rows")
    for t in lines:
        token_bytes(t)  # every token must decode
    # Hugging Face's vocabularies (which CTranslate2 copies) spell two specials
    # differently from whisper's tokenizer.py: Hebrew as <|iw|> and <|nospeech|>
    # by its older name <|nocaptions|>. Use whisper's names, as whisper.cpp does,
    # so both file formats describe the same vocabulary.
    rename = {"<|iw|>": "<|he|>", "<|nocaptions|>": "<|nospeech|>"}
    lines = [rename.get(t, t) for t in lines]
    m.tokens = lines
    idx = {}
    for i, t in enumerate(lines):
        if t.startswith("<|") and t.endswith("|>"):
            idx.setdefault(t, i)

    def sid(*names):
        for nm in names:
            if nm in idx:
                return idx[nm]
        raise FormatError(f"vocabulary has no {names[0]}")

    sp = dict(eot=sid("<|endoftext|>"), sot=sid("<|startoftranscript|>"), translate=sid("<|translate|>"),
              transcribe=sid("<|transcribe|>"), solm=sid("<|startoflm|>"), prev=sid("<|startofprev|>"),
              nospeech=sid("<|nospeech|>"), notimestamps=sid("<|notimestamps|>"),
              timestamp_begin=sid("<|0.00|>"))
    m.special = sp
    langs = lines[sp["sot"] + 1:sp["translate"]]
    for t in langs:
        if not (t.startswith("<|") and t.endswith("|>")):
            raise FormatError(f"vocabulary: {t!r} between <|startoftranscript|> and <|translate|> is not a language")
    m.languages = [t[2:-2] for t in langs]
    n_ts = m.hp["n_vocab"] - sp["timestamp_begin"]
    for k in range(n_ts):
        want = "<|%.2f|>" % (0.02 * k)
        if lines[sp["timestamp_begin"] + k] != want:
            raise FormatError(f"vocabulary: token {sp['timestamp_begin'] + k} is {lines[sp['timestamp_begin'] + k]!r}, expected {want}")

    with open(os.path.join(model_dir, "config.json"), "r", encoding="utf-8") as f:
        cfg = json.load(f)
    m.suppress = [int(x) for x in cfg.get("suppress_ids", [])]
    m.begin_suppress = [int(x) for x in cfg.get("suppress_ids_begin", [])]
    m.alignment_heads = [[int(a), int(b)] for a, b in cfg.get("alignment_heads", [])]
    lang_ids = cfg.get("lang_ids")
    if lang_ids is not None and list(lang_ids) != list(range(sp["sot"] + 1, sp["translate"])):
        # Seen in the tiny.en conversion: Hugging Face's generation config of the .en models
        # lists the multilingual ids (one higher). The vocabulary is authoritative.
        print("convert_whisper_ct2: note: config.json lang_ids do not match the vocabulary's language "
              "tokens; using the vocabulary", file=sys.stderr)
    for x in m.suppress + m.begin_suppress:
        if not 0 <= x < m.hp["n_vocab"]:
            raise FormatError(f"config.json: suppressed token {x} out of range")
    for a, b in m.alignment_heads:
        if not (0 <= a < n_dec and 0 <= b < m.hp["n_text_head"]):
            raise FormatError(f"config.json: alignment head {[a, b]} out of range")
    m.filters = mel_filters(16000, 400, n_mels) if n_mels in (80, 128) else None
    if m.filters is None:
        raise FormatError(f"n_mels = {n_mels}: whisper uses 80 or 128")
    return m


# ---- GGUF writer -------------------------------------------------------------------------
def tensor_type(kind, outtype):
    """Matrices in outtype, vectors and position tables in f32 (as whisper.cpp): both files."""
    return outtype if kind == "mat" else "f32"


# https://github.com/ggml-org/ggml/blob/master/docs/gguf.md (v3, little-endian)
def write_gguf(m, path, outtype, name):
    w = GgufWriter()
    w.add_str("general.architecture", "whisper")
    w.add_str("general.name", name)
    w.add_u32("general.alignment", ALIGN)
    w.add_u32("general.file_type", 1 if outtype == "f16" else 0)
    w.add_str("whisper.source", "ctranslate2")
    w.add_str("whisper.source.sha256", m.source_sha256)
    for k in ("n_vocab", "n_audio_ctx", "n_audio_state", "n_audio_head", "n_audio_layer", "n_text_ctx",
              "n_text_state", "n_text_head", "n_text_layer", "n_mels"):
        w.add_u32("whisper." + k, m.hp[k])
    for k, t in m.special.items():
        w.add_u32("whisper.token." + k, t)
    w.add_str_array("whisper.tokenizer.tokens", m.tokens)
    w.add_str_array("whisper.languages", m.languages)
    w.add_i32_array("whisper.suppress_tokens", m.suppress)
    w.add_i32_array("whisper.begin_suppress_tokens", m.begin_suppress)
    w.add_i32_array("whisper.alignment_heads", [x for p in m.alignment_heads for x in p])
    for nm, a, kind in [("mel_filters", m.filters, "vec")] + m.tensors:
        w.add_tensor(nm, a, tensor_type(kind, outtype))
    w.write(path)


# ---- whisper.cpp legacy ggml .bin -------------------------------------------------------------
def write_ggml_bin(m, path, outtype):
    """whisper.cpp's layout: magic, 11 i32 hparams, mel filters, the ordinary tokens as raw
    bytes (whisper.cpp names the special ones itself), then per tensor
    {i32 n_dims, i32 name_len, i32 ggml type, i32 ne[n_dims], name, data} with no padding."""
    hp = m.hp
    out = [struct.pack("<I", 0x67676D6C)]
    out.append(struct.pack("<11i", hp["n_vocab"], hp["n_audio_ctx"], hp["n_audio_state"], hp["n_audio_head"],
                           hp["n_audio_layer"], hp["n_text_ctx"], hp["n_text_state"], hp["n_text_head"],
                           hp["n_text_layer"], hp["n_mels"], 1 if outtype == "f16" else 0))
    out.append(struct.pack("<ii", *m.filters.shape) + m.filters.astype("<f4").tobytes())
    ordinary = m.tokens[:m.special["eot"]]  # multilingual models: id eot-1 is an empty token
    out.append(struct.pack("<i", len(ordinary)))
    for t in ordinary:
        b = token_bytes(t)
        out.append(struct.pack("<i", len(b)) + b)
    tensors = list(m.tensors)
    if not any(nm == "encoder.positional_embedding" for nm, _, _ in tensors):  # whisper.cpp requires it
        tensors.insert(0, ("encoder.positional_embedding", sinusoids(hp["n_audio_ctx"], hp["n_audio_state"]), "vec"))
    for nm, a, kind in tensors:
        t = tensor_type(kind, outtype)
        ttype, data = GGML[t][0], a.astype("<f2" if t == "f16" else "<f4").tobytes()
        ne = list(reversed(a.shape))
        b = nm.encode()
        out.append(struct.pack("<iii", len(ne), len(b), ttype) + struct.pack(f"<{len(ne)}i", *ne) + b + data)
    tmp = path + ".partial"
    with open(tmp, "wb") as f:
        for b in out:
            f.write(b)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir", help="CTranslate2 model directory (model.bin, config.json, vocabulary.txt)")
    ap.add_argument("out", help="output GGUF path")
    ap.add_argument("--ggml-bin", help="also write whisper.cpp's legacy ggml .bin here")
    ap.add_argument("--outtype", choices=("f16", "f32"), default="f16", help="matrix type (vectors are always f32)")
    ap.add_argument("--name", default="whisper", help="general.name")
    a = ap.parse_args()
    try:
        m = build(a.model_dir)
    except (FormatError, OSError, ValueError, json.JSONDecodeError) as e:
        print(f"convert_whisper_ct2: {e}", file=sys.stderr)
        sys.exit(1)
    write_gguf(m, a.out, a.outtype, a.name)
    hp = m.hp
    print(f"convert_whisper_ct2: {a.out}: {hp['n_audio_layer']}+{hp['n_text_layer']} layers, d {hp['n_audio_state']}, "
          f"{hp['n_audio_head']} heads, vocab {hp['n_vocab']}, {len(m.languages)} languages, {len(m.tensors)} tensors")
    if a.ggml_bin:
        write_ggml_bin(m, a.ggml_bin, a.outtype)
        print(f"convert_whisper_ct2: {a.ggml_bin}: whisper.cpp ggml layout")


if __name__ == "__main__":
    main()
