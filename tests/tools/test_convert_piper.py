#!/usr/bin/env python3
"""tools/convert_piper.py on the default Piper voice (the .onnx scripts/fetch_models.sh keeps beside
its GGUF), against the `onnx` package's reader (the oracle: not the converter's protobuf reader).

usage: test_convert_piper.py

  weights_equal_onnx     every initializer of the graph is a GGUF tensor, bit for bit, under its module's
                         name (the anonymous WaveNet convolutions after the Conv node reading them, `sid`
                         as enc_p.emb.weight, the folded exp(-logs)); nothing else is in the GGUF
  keys_of_the_voice      the config's sample rate, scales, espeak voice and phoneme id map; the
                         hyperparameters of VITS "medium" read off the graph
  q8_convolutions_as_rows  --q8: every convolution of a kernel wider than 1 whose [ic k] rows are whole
                         32-weight blocks is q8_0 of shape [oc][ic k] (transposed [ic][oc k]), each weight
                         within half a step of the graph's (and its f16 scale's rounding); every other weight f32 bit
                         for bit; the file under 45% of the f32 one's size
  fuzzed_files_refused_cleanly  40 files of flipped bytes or cut short: converted or refused with a message,
                         never a traceback
  refuses_other_graphs   an input renamed, an op we do not run, a weight missing, an extra weight, a
                         resblock's dilation changed, a stride changed, two speakers, no phoneme map,
                         a truncated file, not a file: exit 1, the difference named, no GGUF left
Prints "N passed, N failed, N skipped" (a skip fails under NM_CI).
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONV = os.path.join(ROOT, "tools", "convert_piper.py")
sys.path.insert(0, os.path.join(ROOT, "tools", "vision_ref"))
from clip_ref import Gguf  # noqa: E402  (the references' GGUF reader: not the converter's writer)

CI = os.environ.get("NM_CI", "0") not in ("", "0")
MODELS = os.environ.get("NM_MODEL_DIR", os.path.expanduser("~/.cache/nanomind/models"))
VOICE = os.path.join(MODELS, "piper-en_US-joe-medium.onnx")
results = {"passed": 0, "failed": 0, "skipped": 0}


class Skip(Exception):
    pass


def case(fn):
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
    except Exception as e:  # the converter or a reader crashed: this case fails
        print("FAIL %s: %s: %s" % (fn.__name__, type(e).__name__, e))
        results["failed"] += 1
    return fn


def need():
    try:
        import onnx  # noqa: F401
    except ImportError:
        raise Skip("the onnx package is not installed (scripts/setup.sh installs it)")
    if not os.path.isfile(VOICE) or not os.path.isfile(VOICE + ".json"):
        raise Skip("%s (and its .json) not in the model cache (scripts/fetch_models.sh)" % VOICE)


def convert(onnx_path, out, config=None, expect=0, extra=()):
    cmd = [sys.executable, CONV, onnx_path, "-o", out] + (["--config", config] if config else []) + list(extra)
    p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == expect, "convert: exit %d, expected %d\n%s" % (p.returncode, expect, p.stderr[-2000:])
    return p


TMP = tempfile.mkdtemp(prefix="nm-piper-")
OUT = os.path.join(TMP, "voice.gguf")


def tensors(path):
    g = Gguf(path)
    out = {}
    for name, (ne, t, start, nbytes) in g.tensors.items():
        assert t == 0, "%s: ggml type %d (f32 expected)" % (name, t)
        out[name] = np.frombuffer(g.buf[start:start + nbytes], "<f4").reshape(tuple(reversed(ne)))
    return g.kv, out


@case
def weights_equal_onnx():
    need()
    import onnx
    from onnx import numpy_helper
    convert(VOICE, OUT)
    kv, got = tensors(OUT)
    m = onnx.load(VOICE)
    consumer = {}
    for n in m.graph.node:
        for k, i in enumerate(n.input):
            consumer.setdefault(i, (n, k))
    want = {}
    for t in m.graph.initializer:
        a = numpy_helper.to_array(t)
        if t.name == "sid":
            want["enc_p.emb.weight"] = a
        elif t.name.startswith("onnx::Conv_"):
            n, k = consumer[t.name]
            want[n.name.strip("/").rsplit("/", 1)[0].replace("/", ".") + (".weight" if k == 1 else ".bias")] = a
        elif t.name == "/dp/flows.0/Exp_output_0":
            want["dp.flows.0.exp_neg_logs"] = a
        elif t.name[0] != "/" and not t.name.startswith("onnx::") and a.dtype == np.float32 and a.ndim > 0 \
                and not t.name.isdigit():
            want[t.name] = a
    assert len(want) == 350, "%d weights in the graph" % len(want)
    assert sorted(got) == sorted(want), "GGUF %s, graph %s" % (sorted(set(got) - set(want))[:5],
                                                                 sorted(set(want) - set(got))[:5])
    for k, a in want.items():
        assert got[k].shape == a.shape and got[k].tobytes() == a.astype("<f4").tobytes(), k
    assert got["dp.flows.0.exp_neg_logs"].shape == (2, 1)


@case
def q8_convolutions_as_rows():
    need()
    if not os.path.isfile(OUT):
        convert(VOICE, OUT)
    q8 = os.path.join(TMP, "voice-q8.gguf")
    convert(VOICE, q8, extra=["--q8"])
    _, f32 = tensors(OUT)
    g = Gguf(q8)
    n_q8 = 0
    for name, (ne, t, start, nbytes) in g.tensors.items():
        a = f32[name]
        wide = name.endswith(".weight") and a.ndim == 3 and a.shape[2] > 1 and a.shape[1] * a.shape[2] % 32 == 0
        if not wide:
            assert t == 0 and g.buf[start:start + nbytes] == a.astype("<f4").tobytes(), "%s: type %d, or changed" % (name, t)
            continue
        rows, cols = a.shape[0], a.shape[1] * a.shape[2]
        assert t == 8 and list(ne) == [cols, rows], "%s: type %d shape %s (q8_0 [%d %d] expected)" % (name, t, ne, rows, cols)
        blocks = np.frombuffer(g.buf[start:start + nbytes], np.uint8).reshape(-1, 34)
        d = blocks[:, :2].copy().view("<f2").astype(np.float32).reshape(-1)
        q = blocks[:, 2:].copy().view(np.int8).astype(np.float32)
        got = (q * d[:, None]).reshape(rows, cols)
        step = np.repeat(d, 32).reshape(rows, cols)
        err = np.abs(got - a.reshape(rows, cols))
        # (half a step, and 127 times the scale's rounding to f16: 2^-11 of it, or 2^-25 where it is subnormal)
        bound = step * 0.5 + 127 * np.maximum(step * 2.0 ** -11, 2.0 ** -25) + 1e-12
        assert np.all(err <= bound), "%s: %g off (%g allowed there)" % (name, err.max(), bound[np.argmax(err - bound)])
        n_q8 += 1
    assert n_q8 == 51, "%d q8_0 weights" % n_q8  # (6 FFN pairs, 16 WaveNet layers, HiFi-GAN's 23)
    assert os.path.getsize(q8) < 0.45 * os.path.getsize(OUT), "%d bytes against %d" % (os.path.getsize(q8),
                                                                                      os.path.getsize(OUT))


@case
def keys_of_the_voice():
    need()
    if not os.path.isfile(OUT):
        convert(VOICE, OUT)
    kv, _ = tensors(OUT)
    cfg = json.load(open(VOICE + ".json"))
    assert kv["general.architecture"] == "piper"
    assert kv["piper.sample_rate"] == 22050 and kv["piper.espeak.voice"] == "en-us"
    assert abs(kv["piper.noise_scale"] - 0.667) < 1e-6 and kv["piper.length_scale"] == 1.0
    assert abs(kv["piper.noise_w"] - 0.8) < 1e-6
    ids, counts, k = kv["piper.phoneme_ids"], kv["piper.phoneme_id_counts"], 0
    got = {}
    for p, c in zip(kv["piper.phonemes"], counts):
        got[p] = list(ids[k:k + c])
        k += c
    assert got == cfg["phoneme_id_map"] and k == len(ids)
    hp = {"hidden": 192, "inter": 192, "filter": 768, "ffn_kernel": 3, "n_layers": 6, "n_heads": 2, "window": 4,
          "dp_filter": 192, "dp_kernel": 3, "dp_layers": 3, "dp_flows": 3, "dp_bins": 10, "flow_layers": 4,
          "flow_wn_layers": 4, "flow_kernel": 5, "dec_initial": 256, "dec_kernel": 7, "resblock": 2,
          "num_symbols": 256}
    for key, v in hp.items():
        assert kv["piper." + key] == v, "piper.%s = %s, %s expected" % (key, kv["piper." + key], v)
    for key, v in {"upsample_rates": [8, 8, 4], "upsample_kernels": [16, 16, 8], "resblock_kernels": [3, 5, 7],
                   "resblock_dilations": [1, 2, 2, 6, 3, 12]}.items():
        assert list(kv["piper." + key]) == v, "piper.%s = %s" % (key, list(kv["piper." + key]))


def refused(model, why, config=None):
    """model: an onnx ModelProto to save (or a path); the converter exits 1 naming `why`, and leaves no GGUF."""
    import onnx
    path = model
    if not isinstance(model, str):
        path = os.path.join(TMP, "bad.onnx")
        onnx.save(model, path)
    out = os.path.join(TMP, "bad.gguf")
    p = convert(path, out, config=config or VOICE + ".json", expect=1)
    assert why in p.stderr, "%r not in %r" % (why, p.stderr)
    assert not os.path.exists(out), "a GGUF was left"


@case
def refuses_other_graphs():
    need()
    import onnx
    from onnx import helper

    def fresh():
        return onnx.load(VOICE)

    m = fresh()
    m.graph.input[0].name = "phonemes"
    refused(m, "graph inputs ['phonemes', 'input_lengths', 'scales']")
    m = fresh()
    m.graph.node.append(helper.make_node("Gelu", ["output"], ["gelu_out"], name="/extra/Gelu"))
    refused(m, "ops not in Piper's VITS graph: Gelu")
    m = fresh()
    for i, t in enumerate(m.graph.initializer):
        if t.name == "dec.ups.1.bias":
            del m.graph.initializer[i]
            break
    refused(m, "weight dec.ups.1.bias missing")
    m = fresh()
    m.graph.initializer.append(onnx.numpy_helper.from_array(np.zeros(3, np.float32), "dec.extra.weight"))
    refused(m, "weights we do not know: dec.extra.weight")
    for node_name, attr, value, why in (("/dec/resblocks.4/convs.1/Conv", "dilations", [5],
                                         "dec.resblocks.4.convs.1: dilations [5] ([6] expected)"),
                                        ("/dec/ups.2/ConvTranspose", "strides", [2], "dec.ups.2: pads [2, 2] ([3, 3] expected)")):
        m = fresh()
        for n in m.graph.node:
            if n.name == node_name:
                for a in n.attribute:
                    if a.name == attr:
                        del a.ints[:]
                        a.ints.extend(value)
        refused(m, why)
    cfg = json.load(open(VOICE + ".json"))
    for change, why in ((("num_speakers", 2), "2 speakers"), (("phoneme_id_map", {}), "no phoneme_id_map")):
        c = dict(cfg)
        c[change[0]] = change[1]
        path = os.path.join(TMP, "bad.json")
        json.dump(c, open(path, "w"))
        refused(VOICE, why, config=path)
    cut = os.path.join(TMP, "cut.onnx")
    with open(VOICE, "rb") as f, open(cut, "wb") as g:
        g.write(f.read(5_000_000))
    refused(cut, "truncated protobuf")
    refused(os.path.join(TMP, "nonexistent.onnx"), "No such file")


@case
def fuzzed_files_refused_cleanly():
    """40 mutations of the voice file (bytes flipped in its first MiB, where the graph's nodes and the
    first initializers lie; cut at random lengths): each converts (exit 0) or is refused (exit 1, a
    message, no GGUF left), never a traceback."""
    need()
    import random
    rnd = random.Random(47)
    data = open(VOICE, "rb").read()
    path, out = os.path.join(TMP, "fz.onnx"), os.path.join(TMP, "fz.gguf")
    for k in range(40):
        b = bytearray(data[: rnd.randrange(16, len(data))] if k % 4 == 0 else data)
        for _ in range(rnd.randrange(1, 8)):
            i = rnd.randrange(0, min(len(b), 1 << 20))
            b[i] = rnd.randrange(256)
        open(path, "wb").write(bytes(b))
        p = subprocess.run([sys.executable, CONV, path, "--config", VOICE + ".json", "-o", out], capture_output=True,
                           text=True)
        assert p.returncode in (0, 1) and "Traceback" not in p.stderr, "mutation %d: exit %d\n%s" % (
            k, p.returncode, p.stderr[-1500:])
        assert p.returncode == 0 or ("convert_piper:" in p.stderr and not os.path.exists(out)), p.stderr
        if os.path.exists(out):
            os.remove(out)


def main():
    print("%d passed, %d failed, %d skipped" % (results["passed"], results["failed"], results["skipped"]))
    for f in os.listdir(TMP):
        os.remove(os.path.join(TMP, f))
    os.rmdir(TMP)
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
