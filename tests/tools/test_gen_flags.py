#!/usr/bin/env python3
"""nm-genmodel and nm-genmmproj (tools/genmodel): every command-line flag changes the file as it says.

usage: test_gen_flags.py path/to/nm-genmodel path/to/nm-genmmproj

The C tests make their models through the library (nm_genmodel_write, nm_genmmproj_write), and
the scripts pass the tools only some flags; here each flag of each tool runs, and the written GGUF
(read by a reader of this file) shows its effect against the defaults:

  nm-genmodel   --arch --tokenizer-from -o --type --seed --layers --embd --heads --kv-heads --ff
                --head-dim --swa --final-softcap --vocab --user-tokens; the tokenizer source is a small GGUF
                written here; --script with SmolLM2's tokenizer (the model cache's)
  nm-genmmproj  --class-embd --patch-bias --pre-ln --post-ln --gelu --eps --legacy-ffn --f16-embd
                --scale-factor --input --pinpoints --preproc-image-size --proj --type --seed
                --image-size --patch-size --n-embd --n-ff --n-head --n-layer --n-out -o, -h; a bad
                value and an unknown flag are exit 2
  both          the flags each tool's source parses are exactly those this test runs, and those
                its usage text names

Prints "N passed, N failed, N skipped".
"""
import os
import re
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from gguf_writer import GgufWriter  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tools", "vision_ref"))
from clip_ref import Gguf  # noqa: E402  (the GGUF reader of the references)

GENMODEL, GENMMPROJ = (os.path.abspath(p) for p in sys.argv[1:3]) if len(sys.argv) > 2 else (None, None)
CI = os.environ.get("NM_CI", "0") not in ("", "0")
results = {"passed": 0, "failed": 0, "skipped": 0}


def case(fn):
    try:
        fn()
        print("ok   %s" % fn.__name__)
        results["passed"] += 1
    except Exception as e:
        print("FAIL %s: %s%s" % (fn.__name__, "" if isinstance(e, AssertionError) else type(e).__name__ + ": ", e))
        results["failed"] += 1
    return fn


def read_gguf(path):
    """(metadata {key: value}, tensors {name: (ggml type id, ne list)}, file bytes), by the reference reader."""
    g = Gguf(path)
    return g.kv, {name: (t, ne) for name, (ne, t, _, _) in g.tensors.items()}, g.buf


def run(tool, *args, expect=0):
    p = subprocess.run([tool] + [str(a) for a in args], capture_output=True, text=True, timeout=300)
    assert p.returncode == expect, "%s %s: exit %d, expected %d\n%s%s" % (
        os.path.basename(tool), " ".join(map(str, args)), p.returncode, expect, p.stdout[-1500:], p.stderr[-1500:])
    return p


def source_flags(path):
    """The flags a tool's main() compares its arguments with."""
    return set(re.findall(r'strcmp\((?:a|argv\[i\]), "(-[-a-z0-9]*)"\)', open(path).read()))


def main():
    if not GENMODEL or not os.path.exists(GENMODEL) or not os.path.exists(GENMMPROJ):
        print("%s gen_tools: needs the nm-genmodel and nm-genmmproj binaries (arguments 1 and 2)" % (
            "FAIL" if CI else "skip"))
        results["failed" if CI else "skipped"] += 1
        print("%d passed, %d failed, %d skipped" % (results["passed"], results["failed"], results["skipped"]))
        return 1 if CI else 0
    tmp = tempfile.TemporaryDirectory(prefix="nm-test-genflags-")
    T = tmp.name
    tested = {"genmodel": set(), "genmmproj": set()}

    # a tokenizer source: 300 tokens and whatever tokenizer.* keys, copied verbatim
    tok = os.path.join(T, "tok.gguf")
    w = GgufWriter()
    w.add_str("general.architecture", "llama")
    w.add_str("tokenizer.ggml.model", "gpt2")
    w.add_str_array("tokenizer.ggml.tokens", ["t%d" % i for i in range(300)])
    w.add_i32_array("tokenizer.ggml.token_type", [1] * 300)
    w.add_u32("tokenizer.ggml.bos_token_id", 7)
    w.add_tensor("x", [0.0] * 32)
    w.write(tok)

    def gm(*flags, out=None):
        for f in flags:
            if isinstance(f, str) and f.startswith("-"):
                tested["genmodel"].add(f)
        out = out or os.path.join(T, "m.gguf")
        run(GENMODEL, "--tokenizer-from", tok, "-o", out, *flags)
        tested["genmodel"] |= {"--tokenizer-from", "-o"}
        return read_gguf(out)

    @case
    def genmodel_every_flag():
        kv, t, _ = gm("--arch", "llama")
        assert kv["general.architecture"] == "llama"
        src, _, _ = read_gguf(tok)
        assert {k: v for k, v in kv.items() if k.startswith("tokenizer.")} == \
            {k: v for k, v in src.items() if k.startswith("tokenizer.")}, "--tokenizer-from: the keys differ"
        assert t["token_embd.weight"] == (0, [128, 300]), "defaults: f32, d 128, 300 tokens: %s" % (t["token_embd.weight"],)
        kv, t, _ = gm("--arch", "qwen2", "--layers", 3, "--embd", 64, "--heads", 4, "--kv-heads", 2, "--ff", 96,
                      "--head-dim", 32, "--type", "q8_0")
        assert kv["general.architecture"] == "qwen2" and kv["qwen2.block_count"] == 3, "--arch, --layers"
        assert "blk.2.attn_q.weight" in t and "blk.3.attn_q.weight" not in t, "--layers 3"
        assert kv["qwen2.embedding_length"] == 64 and kv["qwen2.feed_forward_length"] == 96, "--embd, --ff"
        assert kv["qwen2.attention.head_count"] == 4 and kv["qwen2.attention.head_count_kv"] == 2, "--heads, --kv-heads"
        assert kv["qwen2.attention.key_length"] == 32 and kv["qwen2.attention.value_length"] == 32, "--head-dim"
        assert t["blk.0.attn_q.weight"] == (8, [64, 128]) and t["blk.0.attn_k.weight"] == (8, [64, 64]), \
            "--head-dim 32 x 4 heads, 2 kv heads, q8_0: %s %s" % (t["blk.0.attn_q.weight"], t["blk.0.attn_k.weight"])
        assert t["blk.0.ffn_up.weight"] == (8, [64, 96]), "--ff 96: %s" % (t["blk.0.ffn_up.weight"],)
        kv, t, _ = gm("--arch", "gemma3", "--swa", 4, "--final-softcap", 30)
        assert kv["gemma3.attention.sliding_window"] == 4, "--swa"
        assert kv["gemma3.final_logit_softcapping"] == 30.0, "--final-softcap"
        a, b, c = (os.path.join(T, n) for n in ("s1.gguf", "s1b.gguf", "s2.gguf"))
        gm("--arch", "llama", "--seed", 1, out=a)
        gm("--arch", "llama", "--seed", 1, out=b)
        gm("--arch", "llama", "--seed", 2, out=c)
        assert open(a, "rb").read() == open(b, "rb").read(), "--seed 1 twice: different files"
        assert open(a, "rb").read() != open(c, "rb").read(), "--seed 2 wrote --seed 1's weights"
        run(GENMODEL, "--arch", "llama", "--tokenizer-from", tok, "-o", a, "--type", "q9_9", expect=2)
        run(GENMODEL, "--arch", "llama", "--tokenizer-from", tok, "-o", a, "--bogus", "1", expect=2)
        # lfm2: --attn-layers picks the attending layers (head_count_kv non-zero there), --conv-l the taps
        kv, t, _ = gm("--arch", "lfm2", "--layers", 4, "--attn-layers", "0,3", "--conv-l", 4)
        assert kv["lfm2.attention.head_count_kv"] == [2, 0, 0, 2] and kv["lfm2.shortconv.l_cache"] == 4, \
            "--attn-layers 0,3, --conv-l 4: %s" % (kv["lfm2.attention.head_count_kv"],)
        assert t["blk.1.shortconv.conv.weight"] == (0, [4, 128]) and "blk.1.attn_q.weight" not in t and \
            "blk.3.attn_q_norm.weight" in t and "token_embd_norm.weight" in t, "lfm2's tensors"
        run(GENMODEL, "--arch", "lfm2", "--tokenizer-from", tok, "-o", a, "--attn-layers", "9", expect=2)
        # --vocab pads with control tokens; --user-tokens adds user-defined ones before the pads
        kv, t, _ = gm("--arch", "qwen3", "--vocab", 320)
        toks, types = kv["tokenizer.ggml.tokens"], kv["tokenizer.ggml.token_type"]
        assert len(toks) == 320 and toks[300] == "<|nm_pad_0|>" and toks[319] == "<|nm_pad_19|>", "--vocab 320"
        assert types[299] == 1 and set(types[300:]) == {3} and t["output.weight"] == (0, [128, 320]), "--vocab: pads"
        kv, t, _ = gm("--arch", "llama", "--user-tokens", "<x>,</x>", "--vocab", 305)
        toks, types = kv["tokenizer.ggml.tokens"], kv["tokenizer.ggml.token_type"]
        assert toks[300:303] == ["<x>", "</x>", "<|nm_pad_0|>"] and types[300:303] == [4, 4, 3] and len(toks) == 305, \
            "--user-tokens: %s %s" % (toks[300:303], types[300:303])
        run(GENMODEL, "--arch", "llama", "--tokenizer-from", tok, "-o", a, "--vocab", 299, expect=1)  # (below 300)
        # --script: f32 only; the layers add nothing (attn_output, ffn_down zero), the head learns the chain
        run(GENMODEL, "--arch", "llama", "--tokenizer-from", tok, "-o", a, "--script", "x", "--type", "q8_0", expect=2)
        smol = os.path.join(os.environ.get("NM_MODEL_DIR", os.path.expanduser("~/.cache/nanomind/models")),
                            "SmolLM2-135M-Instruct.Q4_1.gguf")
        if os.path.exists(smol):
            tested["genmodel"].add("--script")
            run(GENMODEL, "--arch", "llama", "--tokenizer-from", smol, "-o", b, "--layers", "1", "--embd", "256",
                "--seed", "4")
            run(GENMODEL, "--arch", "llama", "--tokenizer-from", smol, "-o", c, "--layers", "1", "--embd", "256",
                "--seed", "4", "--script", "Yes.")
            g1, g2 = Gguf(b), Gguf(c)
            zero = lambda g, n: not any(g.buf[g.tensors[n][2]:g.tensors[n][2] + 4 * 256 * 256])  # noqa: E731
            assert zero(g2, "blk.0.attn_output.weight") and not zero(g1, "blk.0.attn_output.weight"), "--script: attn_output"
            e1, e2 = g1.tensors["token_embd.weight"][2], g2.tensors["token_embd.weight"][2]
            assert g1.buf[e1:e1 + 4096] == g2.buf[e2:e2 + 4096], "--script: the embeddings are the seed's"
        elif CI:
            raise AssertionError("--script: SmolLM2-135M-Instruct.Q4_1.gguf missing (set-up fetches it)")

    def gp(*flags, out=None):
        for f in flags:
            if isinstance(f, str) and f.startswith("-"):
                tested["genmmproj"].add(f)
        out = out or os.path.join(T, "p.gguf")
        run(GENMMPROJ, "-o", out, *flags)
        tested["genmmproj"].add("-o")
        return read_gguf(out)

    @case
    def genmmproj_every_flag():
        kv, t, _ = gp()  # mlp defaults: class token, pre-LN, no patch bias, no post-LN, quick GELU, eps 1e-5
        grid = (64 // 16) ** 2
        assert "v.class_embd" in t and t["v.position_embd.weight"][1] == [128, grid + 1], "default class token"
        assert "v.pre_ln.weight" in t and "v.post_ln.weight" not in t and "v.patch_embd.bias" not in t
        assert kv["clip.use_gelu"] is False and abs(kv["clip.vision.attention.layer_norm_epsilon"] - 1e-5) < 1e-9
        assert t["v.blk.0.ffn_up.weight"][1] == [128, 256] and t["v.blk.0.ffn_down.weight"][1] == [256, 128]
        assert t["v.patch_embd.weight"][0] == 0 and t["v.position_embd.weight"][0] == 0, "default f32 embeddings"
        kv, t, _ = gp("--class-embd", 0, "--patch-bias", 1, "--pre-ln", 0, "--post-ln", 1, "--gelu", 1, "--eps", 0.001)
        assert "v.class_embd" not in t and t["v.position_embd.weight"][1] == [128, grid], "--class-embd 0"
        assert "v.patch_embd.bias" in t, "--patch-bias 1"
        assert "v.pre_ln.weight" not in t, "--pre-ln 0"
        assert "v.post_ln.weight" in t, "--post-ln 1"
        assert kv["clip.use_gelu"] is True, "--gelu 1"
        assert abs(kv["clip.vision.attention.layer_norm_epsilon"] - 0.001) < 1e-9, "--eps"
        kv, t, _ = gp("--legacy-ffn", "--f16-embd")
        assert t["v.blk.0.ffn_down.weight"][1] == [128, 256] and t["v.blk.0.ffn_up.weight"][1] == [256, 128], \
            "--legacy-ffn: fc1 named ffn_down"
        assert t["v.patch_embd.weight"][0] == 1 and t["v.position_embd.weight"][0] == 1, "--f16-embd"
        kv, t, _ = gp("--proj", "idefics3", "--image-size", 64, "--patch-size", 8, "--scale-factor", 4,
                      "--preproc-image-size", 96, "--n-embd", 32, "--n-ff", 48, "--n-head", 2, "--n-layer", 2,
                      "--n-out", 40, "--type", "f16", "--seed", 3)
        assert kv["clip.projector_type"] == "idefics3", "--proj: %r" % kv.get("clip.projector_type")
        assert kv["clip.vision.image_size"] == 64 and kv["clip.vision.patch_size"] == 8, "--image-size, --patch-size"
        assert kv["clip.vision.projector.scale_factor"] == 4, "--scale-factor"
        assert kv["clip.vision.preproc_image_size"] == 96, "--preproc-image-size"
        assert kv["clip.vision.embedding_length"] == 32 and kv["clip.vision.feed_forward_length"] == 48, \
            "--n-embd, --n-ff"
        assert kv["clip.vision.attention.head_count"] == 2 and kv["clip.vision.block_count"] == 2, "--n-head, --n-layer"
        assert kv["clip.vision.projection_dim"] == 40, "--n-out"
        assert t["mm.model.fc.weight"] == (1, [32 * 16, 40]), "--scale-factor 4, --n-out 40, --type f16: %s" % (
            t["mm.model.fc.weight"],)
        kv, t, _ = gp("--pinpoints", "64,128,128,64")
        assert kv["clip.vision.image_grid_pinpoints"] == [64, 128, 128, 64], "--pinpoints"
        a, b = os.path.join(T, "i1.gguf"), os.path.join(T, "i2.gguf")
        inp = os.path.join(T, "in.f32")
        gp("--seed", 5, "--input", inp, "--image-size", 32, out=a)
        assert os.path.getsize(inp) == 3 * 32 * 32 * 4, "--input: %d bytes" % os.path.getsize(inp)
        gp("--seed", 6, "--image-size", 32, out=b)
        assert open(a, "rb").read() != open(b, "rb").read(), "--seed"
        h = run(GENMMPROJ, "--help")
        run(GENMMPROJ, "-h")
        tested["genmmproj"] |= {"--help", "-h"}
        assert "usage: nm-genmmproj" in h.stdout
        run(GENMMPROJ, "-o", a, "--gelu", "2", expect=2)
        run(GENMMPROJ, "-o", a, "--bogus", expect=2)

    @case
    def flags_parsed_tested_and_documented():
        for tool, src, exe in (("genmodel", "nm_genmodel.c", GENMODEL), ("genmmproj", "nm_genmmproj.c", GENMMPROJ)):
            parsed = source_flags(os.path.join(ROOT, "tools", "genmodel", src))
            assert len(parsed) > 5, "%s: the flag pattern finds %s" % (src, parsed)
            assert parsed == tested[tool], "%s: parsed but not run here %s; run here but not parsed %s" % (
                src, sorted(parsed - tested[tool]), sorted(tested[tool] - parsed))
            p = subprocess.run([exe, "--help"], capture_output=True, text=True)
            usage = p.stdout + p.stderr
            missing = sorted(f for f in parsed if not re.search(r"(?<![\w-])%s(?![\w-])" % re.escape(f), usage))
            assert not missing, "%s: the usage text lacks %s" % (tool, missing)

    tmp.cleanup()
    print("%d passed, %d failed, %d skipped" % (results["passed"], results["failed"], results["skipped"]))
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
