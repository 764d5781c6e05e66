#!/usr/bin/env python3
"""A Piper voice (VITS exported to ONNX: VOICE.onnx and VOICE.onnx.json) -> one GGUF
for nanomind's Piper engine. Numpy only: the ONNX file is read by the small protobuf
reader below (ModelProto -> GraphProto: nodes with their Conv attributes, initializers).

    tools/convert_piper.py en_US-joe-medium.onnx [--config X.onnx.json] [--q8] -o voice.gguf

The weights keep PyTorch's module names (enc_p.encoder.attn_layers.0.conv_q.weight, ...),
in f32 as stored, so the runtime finds each one by its module. With --q8, the convolutions of
kernels wider than 1 (the encoder's FFN, the flow's WaveNet, HiFi-GAN: 52 of a medium voice's
63 MB) are stored as q8_0 instead, each output channel's weights one row ([oc][ic k], transposed
[ic][oc k]; only where those rows are whole 32-weight blocks): a file ~40% the size; the runtime
widens them to f32 once when it lays them out (docs/piper.md: what it costs in accuracy). The exporter names some
weights after nothing (`onnx::Conv_8168`: the coupling flow's WaveNet convolutions, their
weight norm folded); each is named here after the Conv node that reads it
(/flow/flows.0/enc/in_layers.0/Conv -> flow.flows.0.enc.in_layers.0.weight). The phoneme
embedding the exporter calls `sid` is enc_p.emb.weight (the Gather of the phoneme ids
reads it); the duration predictor's first flow keeps its mean, m, and exp(-logs) as
the graph folded it (dp.flows.0.exp_neg_logs: the reverse pass multiplies by it).

The hyperparameters are read off the weights' shapes and the convolutions' attributes
(dilations, strides, padding), and written as piper.* keys with the voice's config:
sample rate, the inference scales, the espeak voice, the phoneme id map. A graph this
does not recognise (an input or output renamed, an op we do not run, a weight missing,
extra or of another shape, a convolution whose dilation or stride is not VITS's, several
speakers) is refused with what differs named, and exit status 1. Tooling only: Python
is not part of the runtime (docs/piper.md).
"""
import argparse
import json
import os
import re
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_writer import GgufWriter  # noqa: E402


class Refused(Exception):
    pass


# ---- protobuf (the wire format: varints, fixed 32/64, length-delimited) ----------------

def _varint(b, i):
    v = s = 0
    while True:
        if i >= len(b):
            raise Refused("truncated protobuf (a varint runs past the end)")
        c = b[i]
        i += 1
        v |= (c & 0x7F) << s
        if c < 0x80:
            return v, i
        s += 7
        if s > 63:
            raise Refused("malformed protobuf (a varint of more than 10 bytes)")


def fields(b):
    """(field number, wire type, value) of each field of message bytes b; value: int for
    varints and fixed, memoryview for length-delimited."""
    i, n = 0, len(b)
    while i < n:
        key, i = _varint(b, i)
        f, w = key >> 3, key & 7
        if w == 0:
            v, i = _varint(b, i)
        elif w == 1:
            if i + 8 > n:
                raise Refused("truncated protobuf (fixed64)")
            v = struct.unpack_from("<Q", b, i)[0]
            i += 8
        elif w == 2:
            ln, i = _varint(b, i)
            if i + ln > n:
                raise Refused("truncated protobuf (a field of %d bytes runs past the end)" % ln)
            v = b[i:i + ln]
            i += ln
        elif w == 5:
            if i + 4 > n:
                raise Refused("truncated protobuf (fixed32)")
            v = struct.unpack_from("<I", b, i)[0]
            i += 4
        else:
            raise Refused("malformed protobuf (wire type %d)" % w)
        yield f, w, v


def _ints(w, v):
    """A repeated int64 field's values: one varint, or packed."""
    if w == 0:
        return [v - (1 << 64) if v >= 1 << 63 else v]
    out, i = [], 0
    while i < len(v):
        x, i = _varint(v, i)
        out.append(x - (1 << 64) if x >= 1 << 63 else x)
    return out


def _str(v):
    return bytes(v).decode("utf-8", "replace")


# ONNX TensorProto data types we read
DTYPES = {1: np.float32, 6: np.int32, 7: np.int64, 10: np.float16, 11: np.float64}


def tensor(b):
    name, dims, dt, raw, floats, i64, i32 = "", [], 0, None, [], [], []
    for f, w, v in fields(b):
        if f == 1:
            dims += _ints(w, v)
        elif f == 2:
            dt = v
        elif f == 8:
            name = _str(v)
        elif f == 9:
            raw = bytes(v)
        elif f == 4:
            floats += list(np.frombuffer(bytes(v), "<f4")) if w == 2 else [struct.unpack("<f", struct.pack("<I", v))[0]]
        elif f == 7:
            i64 += _ints(w, v)
        elif f == 5:
            i32 += _ints(w, v)
        elif f == 14 and v == 1:
            raise Refused("tensor %s: its data is in an external file (not a single-file voice)" % name)
    if dt not in DTYPES:
        raise Refused("tensor %s: ONNX data type %d" % (name, dt))
    count = int(np.prod(dims)) if dims else 1
    if raw is not None:
        a = np.frombuffer(raw, np.dtype(DTYPES[dt]).newbyteorder("<"))
    elif dt == 1:
        a = np.array(floats, np.float32)
    elif dt == 7:
        a = np.array(i64, np.int64)
    else:
        a = np.array(i32, np.int64).astype(DTYPES[dt])
    if a.size != count:
        raise Refused("tensor %s: %d values for dims %s" % (name, a.size, dims))
    return name, a.reshape(dims) if dims else a.reshape(())


def node(b):
    n = {"in": [], "out": [], "name": "", "op": "", "attr": {}}
    for f, w, v in fields(b):
        if f == 1:
            n["in"].append(_str(v))
        elif f == 2:
            n["out"].append(_str(v))
        elif f == 3:
            n["name"] = _str(v)
        elif f == 4:
            n["op"] = _str(v)
        elif f == 5:
            an, ai, aints = "", None, []
            for g, w2, v2 in fields(v):
                if g == 1:
                    an = _str(v2)
                elif g == 3:
                    ai = v2 - (1 << 64) if v2 >= 1 << 63 else v2
                elif g == 8:
                    aints += _ints(w2, v2)
            n["attr"][an] = aints if aints else ai
    return n


def value_names(b):
    return [_str(v) for f, w, v in fields(b) if f == 1]


def read_onnx(path):
    with open(path, "rb") as fh:
        data = memoryview(fh.read())
    graph = None
    for f, w, v in fields(data):
        if f == 7 and w == 2:
            graph = v
    if graph is None:
        raise Refused("%s: no graph (not an ONNX model)" % path)
    nodes, inits, ins, outs = [], {}, [], []
    for f, w, v in fields(graph):
        if f == 1:
            nodes.append(node(v))
        elif f == 5:
            k, a = tensor(v)
            inits[k] = a
        elif f == 11:
            ins += value_names(v)
        elif f == 12:
            outs += value_names(v)
    return nodes, inits, ins, outs


# ---- the VITS graph as Piper exports it ------------------------------------------------

# The ops of Piper's export (opset 15); another op means another graph.
KNOWN_OPS = {
    "Add", "And", "Cast", "Ceil", "Clip", "Concat", "ConstantOfShape", "Conv", "ConvTranspose", "CumSum", "Div",
    "Equal", "Erf", "Exp", "Expand", "Gather", "GatherElements", "GatherND", "GreaterOrEqual", "LeakyRelu", "Less",
    "LessOrEqual", "MatMul", "Mul", "Neg", "NonZero", "Not", "Pad", "Pow", "RandomNormalLike", "Range", "ReduceMax",
    "ReduceMean", "ReduceSum", "Relu", "Reshape", "ScatterND", "Shape", "Sigmoid", "Slice", "Softmax", "Softplus",
    "Split", "Sqrt", "Squeeze", "Sub", "Tanh", "Transpose", "Unsqueeze", "Where", "Constant", "Identity",
}


def convert(onnx_path, config, out_path, name=None, q8=False):
    nodes, inits, ins, outs = read_onnx(onnx_path)
    if ins != ["input", "input_lengths", "scales"]:
        raise Refused("graph inputs %s (Piper's are input, input_lengths, scales)" % ins)
    if outs != ["output"]:
        raise Refused("graph outputs %s (Piper's is output)" % outs)
    ops = sorted({n["op"] for n in nodes} - KNOWN_OPS)
    if ops:
        raise Refused("ops not in Piper's VITS graph: %s" % ", ".join(ops))
    if int(config.get("num_speakers", 1)) != 1:
        raise Refused("%s speakers: multi-speaker voices are not supported yet" % config.get("num_speakers"))
    if config.get("phoneme_type", "espeak") != "espeak":
        raise Refused("phoneme_type %r (espeak is supported)" % config.get("phoneme_type"))

    # every weight by its module's name
    W = {}
    convs = {}  # module -> the Conv/ConvTranspose node's attributes
    for n in nodes:
        if n["op"] not in ("Conv", "ConvTranspose"):
            continue
        m = re.fullmatch(r"/(.+)/(Conv|ConvTranspose)", n["name"])
        if not m:
            raise Refused("a %s node named %r (not after a module)" % (n["op"], n["name"]))
        mod = m.group(1).replace("/", ".")
        convs[mod] = n["attr"]
        for k, src in enumerate(n["in"][1:]):
            if src in inits:
                W[mod + (".weight" if k == 0 else ".bias")] = inits[src]
    for n in nodes:
        if n["op"] == "Gather" and n["name"] == "/enc_p/emb/Gather" and n["in"][0] in inits:
            W["enc_p.emb.weight"] = inits[n["in"][0]]
        if n["op"] == "Mul" and n["name"] == "/dp/flows.0/Mul" and n["in"][1] in inits:
            W["dp.flows.0.exp_neg_logs"] = inits[n["in"][1]]
    for k, a in inits.items():  # the rest kept by their own module names (norms, relative embeddings, m)
        if re.fullmatch(r"(enc_p|dec|flow|dp)\.[A-Za-z0-9_.]+", k) and k not in W:
            W[k] = a

    def w(key, shape=None):
        if key not in W:
            raise Refused("weight %s missing" % key)
        if shape is not None and tuple(W[key].shape) != tuple(shape):
            raise Refused("weight %s has shape %s, %s expected" % (key, list(W[key].shape), list(shape)))
        return W[key]

    def attr(mod, key, want):
        got = convs.get(mod, {}).get(key)
        if got != want:
            raise Refused("%s: %s %s (%s expected)" % (mod, key, got, want))

    used = set()

    def take(key, shape=None):
        a = w(key, shape)
        used.add(key)
        return a

    hp = {}
    n_vocab, hidden = w("enc_p.emb.weight").shape
    if n_vocab != int(config.get("num_symbols", n_vocab)):
        raise Refused("the phoneme embedding has %d rows, the config %s symbols" % (n_vocab, config.get("num_symbols")))
    take("enc_p.emb.weight")
    two_inter = w("enc_p.proj.weight").shape[0]
    inter = two_inter // 2
    n_layers = 0
    while "enc_p.encoder.attn_layers.%d.conv_q.weight" % n_layers in W:
        n_layers += 1
    if n_layers == 0:
        raise Refused("no text encoder layers (enc_p.encoder.attn_layers.0)")
    rel = w("enc_p.encoder.attn_layers.0.emb_rel_k")
    if rel.ndim != 3 or rel.shape[1] % 2 != 1 or hidden % rel.shape[2]:
        raise Refused("enc_p.encoder.attn_layers.0.emb_rel_k has shape %s" % list(rel.shape))
    head_dim, window = rel.shape[2], (rel.shape[1] - 1) // 2
    n_heads = hidden // head_dim
    filt, _, ffn_k = w("enc_p.encoder.ffn_layers.0.conv_1.weight").shape
    for l in range(n_layers):
        p = "enc_p.encoder.attn_layers.%d." % l
        for r in ("emb_rel_k", "emb_rel_v"):
            take(p + r, (1, 2 * window + 1, head_dim))
        for c in ("q", "k", "v", "o"):
            take(p + "conv_%s.weight" % c, (hidden, hidden, 1))
            take(p + "conv_%s.bias" % c, (hidden,))
        for nl in ("norm_layers_1", "norm_layers_2"):
            take("enc_p.encoder.%s.%d.gamma" % (nl, l), (hidden,))
            take("enc_p.encoder.%s.%d.beta" % (nl, l), (hidden,))
        p = "enc_p.encoder.ffn_layers.%d." % l
        take(p + "conv_1.weight", (filt, hidden, ffn_k))
        take(p + "conv_1.bias", (filt,))
        take(p + "conv_2.weight", (hidden, filt, ffn_k))
        take(p + "conv_2.bias", (hidden,))
    take("enc_p.proj.weight", (two_inter, hidden, 1))
    take("enc_p.proj.bias", (two_inter,))
    hp.update(hidden=hidden, inter=inter, filter=filt, ffn_kernel=ffn_k, n_layers=n_layers, n_heads=n_heads,
              window=window)

    # the stochastic duration predictor: pre, DDSConv, proj; its flows run in reverse
    dp_filt = w("dp.pre.weight").shape[0]
    take("dp.pre.weight", (dp_filt, hidden, 1))
    take("dp.pre.bias", (dp_filt,))
    take("dp.proj.weight", (dp_filt, dp_filt, 1))
    take("dp.proj.bias", (dp_filt,))

    def ddsconv(p, ch):
        k = 0
        while p + "convs_sep.%d.weight" % k in W:
            ks = W[p + "convs_sep.%d.weight" % k].shape[2]
            take(p + "convs_sep.%d.weight" % k, (ch, 1, ks))
            take(p + "convs_sep.%d.bias" % k, (ch,))
            attr(p[:-1] + ".convs_sep.%d" % k, "dilations", [ks ** k])
            attr(p[:-1] + ".convs_sep.%d" % k, "group", ch)
            take(p + "convs_1x1.%d.weight" % k, (ch, ch, 1))
            take(p + "convs_1x1.%d.bias" % k, (ch,))
            for nl in ("norms_1", "norms_2"):
                take(p + "%s.%d.gamma" % (nl, k), (ch,))
                take(p + "%s.%d.beta" % (nl, k), (ch,))
            k += 1
        return k, ks

    dp_layers, dp_k = ddsconv("dp.convs.", dp_filt)
    flows = sorted(int(m.group(1)) for k in W for m in [re.fullmatch(r"dp\.flows\.(\d+)\.proj\.weight", k)] if m)
    if not flows:
        raise Refused("no duration predictor flows (dp.flows.N.proj)")
    n_bins3 = w("dp.flows.%d.proj.weight" % flows[0]).shape[0]
    if (n_bins3 + 1) % 3:
        raise Refused("dp.flows.%d.proj has %d outputs (3 x bins - 1 expected)" % (flows[0], n_bins3))
    for f in flows:
        p = "dp.flows.%d." % f
        take(p + "pre.weight", (dp_filt, 1, 1))
        take(p + "pre.bias", (dp_filt,))
        if ddsconv(p + "convs.", dp_filt)[0] != dp_layers:
            raise Refused("%sconvs: not %d layers" % (p, dp_layers))
        take(p + "proj.weight", (n_bins3, dp_filt, 1))
        take(p + "proj.bias", (n_bins3,))
    take("dp.flows.0.m", (2, 1))
    take("dp.flows.0.exp_neg_logs", (2, 1))
    hp.update(dp_filter=dp_filt, dp_kernel=dp_k, dp_layers=dp_layers, dp_flows=len(flows), dp_bins=(n_bins3 + 1) // 3)

    # the coupling flow (mean only), its WaveNet layers
    cflows = sorted(int(m.group(1)) for k in W for m in [re.fullmatch(r"flow\.flows\.(\d+)\.pre\.weight", k)] if m)
    if not cflows or cflows != list(range(0, 2 * len(cflows), 2)):
        raise Refused("coupling flows at %s (0, 2, 4, ... expected)" % cflows)
    half = inter // 2
    wn_k = w("flow.flows.0.enc.in_layers.0.weight").shape[2]
    wn_layers = 0
    while "flow.flows.0.enc.in_layers.%d.weight" % wn_layers in W:
        wn_layers += 1
    for f in cflows:
        p = "flow.flows.%d." % f
        take(p + "pre.weight", (hidden, half, 1))
        take(p + "pre.bias", (hidden,))
        for l in range(wn_layers):
            take(p + "enc.in_layers.%d.weight" % l, (2 * hidden, hidden, wn_k))
            take(p + "enc.in_layers.%d.bias" % l, (2 * hidden,))
            attr("flow.flows.%d.enc.in_layers.%d" % (f, l), "dilations", [1])
            rs = hidden if l == wn_layers - 1 else 2 * hidden
            take(p + "enc.res_skip_layers.%d.weight" % l, (rs, hidden, 1))
            take(p + "enc.res_skip_layers.%d.bias" % l, (rs,))
        take(p + "post.weight", (half, hidden, 1))
        take(p + "post.bias", (half,))
    hp.update(flow_layers=len(cflows), flow_wn_layers=wn_layers, flow_kernel=wn_k)

    # the HiFi-GAN decoder
    initial, _, pre_k = w("dec.conv_pre.weight").shape
    take("dec.conv_pre.weight", (initial, inter, pre_k))
    take("dec.conv_pre.bias", (initial,))
    rates, up_k, ch = [], [], initial
    while "dec.ups.%d.weight" % len(rates) in W:
        u = len(rates)
        k = w("dec.ups.%d.weight" % u).shape[2]
        stride = convs.get("dec.ups.%d" % u, {}).get("strides", [0])[0]
        if not stride or (k - stride) % 2:
            raise Refused("dec.ups.%d: stride %s, kernel %d" % (u, stride, k))
        attr("dec.ups.%d" % u, "pads", [(k - stride) // 2] * 2)
        take("dec.ups.%d.weight" % u, (ch, ch // 2, k))
        take("dec.ups.%d.bias" % u, (ch // 2,))
        rates.append(stride)
        up_k.append(k)
        ch //= 2
    if not rates:
        raise Refused("no upsampling layers (dec.ups.0)")
    n_res = 0
    while "dec.resblocks.%d.convs.0.weight" % n_res in W or "dec.resblocks.%d.convs1.0.weight" % n_res in W:
        n_res += 1
    if n_res == 0 or n_res % len(rates):
        raise Refused("%d residual blocks for %d upsamplings" % (n_res, len(rates)))
    per = n_res // len(rates)
    rtype = 1 if "dec.resblocks.0.convs1.0.weight" in W else 2
    res_k, res_d = [], []
    for j in range(per):
        key = "dec.resblocks.%d.%s.0.weight" % (j, "convs1" if rtype == 1 else "convs")
        res_k.append(w(key).shape[2])
        ds, c = [], 0
        while "dec.resblocks.%d.%s.%d.weight" % (j, "convs1" if rtype == 1 else "convs", c) in W:
            ds.append(convs.get("dec.resblocks.%d.%s.%d" % (j, "convs1" if rtype == 1 else "convs", c), {})
                      .get("dilations", [0])[0])
            c += 1
        res_d.append(ds)
    if len({len(d) for d in res_d}) != 1:
        raise Refused("residual blocks of different depths: %s" % res_d)
    ch = initial
    for u in range(len(rates)):
        ch //= 2
        for j in range(per):
            b = "dec.resblocks.%d." % (u * per + j)
            for c, d in enumerate(res_d[j]):
                for part in (["convs1", "convs2"] if rtype == 1 else ["convs"]):
                    take(b + "%s.%d.weight" % (part, c), (ch, ch, res_k[j]))
                    take(b + "%s.%d.bias" % (part, c), (ch,))
                    attr(b[:-1] + ".%s.%d" % (part, c), "dilations", [d if part != "convs2" else 1])
    take("dec.conv_post.weight", (1, ch, pre_k))
    if "dec.conv_post.bias" in W:
        raise Refused("dec.conv_post has a bias (VITS's has none)")
    hp.update(dec_initial=initial, dec_kernel=pre_k, upsample_rates=rates, upsample_kernels=up_k,
              resblock=rtype, resblock_kernels=res_k, resblock_dilations=[d for ds in res_d for d in ds])

    extra = sorted(set(W) - used)
    if extra:
        raise Refused("weights we do not know: %s%s" % (", ".join(extra[:8]), " ..." if len(extra) > 8 else ""))

    # ---- the GGUF
    g = GgufWriter()
    g.add_str("general.architecture", "piper")
    g.add_str("general.name", name or os.path.basename(onnx_path).rsplit(".onnx", 1)[0])
    audio, inf = config.get("audio", {}), config.get("inference", {})
    g.add_u32("piper.sample_rate", int(audio.get("sample_rate", 22050)))
    g.add_str("piper.quality", str(audio.get("quality", "")))
    g.add_f32("piper.noise_scale", float(inf.get("noise_scale", 0.667)))
    g.add_f32("piper.length_scale", float(inf.get("length_scale", 1.0)))
    g.add_f32("piper.noise_w", float(inf.get("noise_w", 0.8)))
    g.add_str("piper.espeak.voice", str(config.get("espeak", {}).get("voice", "en-us")))
    g.add_str("piper.language", str(config.get("language", {}).get("code", "")))
    g.add_u32("piper.num_symbols", int(n_vocab))
    idmap = config.get("phoneme_id_map")
    if not isinstance(idmap, dict) or not idmap:
        raise Refused("the config has no phoneme_id_map")
    keys, ids, counts = [], [], []
    for k, v in idmap.items():
        if not isinstance(v, list) or not v or any(not isinstance(x, int) or x < 0 or x >= n_vocab for x in v):
            raise Refused("phoneme_id_map[%r] = %r (ids below %d expected)" % (k, v, n_vocab))
        keys.append(k)
        counts.append(len(v))
        ids += v
    for must in ("_", "^", "$"):
        if must not in idmap:
            raise Refused("phoneme_id_map has no %r (Piper's pad, start and end)" % must)
    g.add_str_array("piper.phonemes", keys)
    g.add_i32_array("piper.phoneme_id_counts", counts)
    g.add_i32_array("piper.phoneme_ids", ids)
    for k, v in hp.items():
        if isinstance(v, list):
            g.add_i32_array("piper." + k, v)
        else:
            g.add_u32("piper." + k, int(v))
    for k in sorted(used):
        a = W[k]
        if q8 and k.endswith(".weight") and a.ndim == 3 and a.shape[2] > 1 and a.shape[1] * a.shape[2] % 32 == 0:
            g.add_tensor(k, np.asarray(a, np.float32).reshape(a.shape[0], -1), "q8_0")
            continue
        g.add_tensor(k, a.astype(np.float16) if a.dtype == np.float16 else np.asarray(a, np.float32),
                     "f16" if a.dtype == np.float16 else "f32")
    g.write(out_path)
    return hp, len(used)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("onnx", help="the voice's .onnx")
    ap.add_argument("--config", help="its .onnx.json (default: ONNX + .json)")
    ap.add_argument("-o", "--out", required=True, help="the GGUF to write")
    ap.add_argument("--name", help="general.name (default: the file's name)")
    ap.add_argument("--q8", action="store_true", help="HiFi-GAN's convolutions as q8_0 (a third of the size)")
    a = ap.parse_args()
    cfg = a.config or a.onnx + ".json"
    try:
        try:
            with open(cfg, encoding="utf-8") as f:
                config = json.load(f)
        except (OSError, ValueError) as e:
            raise Refused("%s: %s" % (cfg, e))
        if not isinstance(config, dict):
            raise Refused("%s: not a JSON object" % cfg)
        try:
            hp, n = convert(a.onnx, config, a.out, a.name, a.q8)
        except OSError as e:
            raise Refused(str(e))
        except (ValueError, TypeError, KeyError, IndexError, OverflowError, MemoryError, struct.error) as e:
            raise Refused("malformed file (%s: %s)" % (type(e).__name__, e))  # (bytes the reader cannot make sense of)
    except Refused as e:
        print("convert_piper: %s: %s" % (a.onnx, e), file=sys.stderr)
        return 1
    print("convert_piper: %s: %d weights, %d layers, hidden %d, upsampling %s -> %s" %
          (a.onnx, n, hp["n_layers"], hp["hidden"], "x".join(map(str, hp["upsample_rates"])), a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
