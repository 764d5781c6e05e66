#!/usr/bin/env python3
"""Our Piper VITS against onnxruntime running the original voice (.onnx, kept by scripts/fetch_models.sh
beside its GGUF), the noises at 0: onnxruntime's samples for each case are written into a folder, and
`test_piper --filter piper_matches_onnxruntime` (NM_PIPER_ORACLE) holds ours to them: the same length,
SNR >= 80 dB with the f32 kernels, >= 65 dB where AMX's bf16x3 products run (conv1d.h), max |error|
<= 2e-3. It runs three times: with this CPU's kernels, with NM_NO_AMX=1 (the f32 ones), and with HiFi-GAN
on OpenCL (NM_PIPER_DEVICE=opencl; the rest on this CPU's kernels, so their bound; a skip, counted apart,
where there is no OpenCL device).

usage: test_piper_ort.py BUILD/test_piper

Cases: the phoneme ids piper-tts 1.8 gives for two sentences, and random ids (a seeded generator) of
1, 9 and 250 ids, one of them at length_scale 1.4; then with the noises on (the voice's 0.667 and 0.8):
onnxruntime's two RandomNormalLike nodes (the duration predictor's noise, the prior's) replaced by inputs
fed the draws our synthesis takes for its seed 1 (xorshift64* and Box-Muller, nm_vits_normals; the
prior's frame count from a first run), so both sides add the same noise. Prints "N passed, N failed,
N skipped" (a skip, no onnxruntime or no voice, fails under NM_CI).
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

CI = os.environ.get("NM_CI", "0") not in ("", "0")
MODELS = os.environ.get("NM_MODEL_DIR", os.path.expanduser("~/.cache/nanomind/models"))
VOICE = os.path.join(MODELS, "piper-en_US-joe-medium.onnx")

HELLO = [1, 0, 20, 0, 59, 0, 24, 0, 120, 0, 27, 0, 100, 0, 3, 0, 35, 0, 120, 0, 62, 0, 122, 0, 24, 0, 17, 0, 10, 0, 2]
FOX = [1, 0, 41, 0, 59, 0, 3, 0, 23, 0, 35, 0, 120, 0, 74, 0, 23, 0, 3, 0, 15, 0, 88, 0, 120, 0, 14, 0, 100, 0,
       26, 0, 3, 0, 19, 0, 120, 0, 51, 0, 122, 0, 23, 0, 31, 0, 3, 0, 17, 0, 108, 0, 120, 0, 102, 0, 25, 0, 28, 0,
       31, 0, 3, 0, 121, 0, 27, 0, 100, 0, 34, 0, 60, 0, 3, 0, 41, 0, 59, 0, 3, 0, 24, 0, 120, 0, 18, 0, 74, 0, 38,
       0, 21, 0, 3, 0, 17, 0, 120, 0, 51, 0, 122, 0, 66, 0, 8, 0, 3, 0, 32, 0, 35, 0, 120, 0, 14, 0, 74, 0, 31, 0,
       4, 0, 2]


def normals(seed, n):
    """The first n standard normal draws of our synthesis's generator for seed (vits.c: randn_fill)."""
    mask = (1 << 64) - 1
    st = (seed * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & mask or 1
    u = np.empty(n + (n & 1))
    for i in range(len(u)):
        st ^= st >> 12
        st ^= (st << 25) & mask
        st ^= st >> 27
        u[i] = (float(((st * 0x2545F4914F6CDD1D) & mask) >> 11) + 0.5) / 9007199254740992.0
    m, a = np.sqrt(-2.0 * np.log(u[0::2])), 6.283185307179586 * u[1::2]
    return np.stack([m * np.cos(a), m * np.sin(a)], axis=1).reshape(-1)[:n].astype(np.float32)


def noise_fed(model_path):
    """The voice's graph with its RandomNormalLike outputs as inputs eps_dp [1, 2, n] and eps_z [1, inter,
    frames], and the prior's [1, inter, frames] shape as a second output."""
    import onnx
    m = onnx.load(model_path)
    rn = [nd for nd in m.graph.node if nd.op_type == "RandomNormalLike"]
    if len(rn) != 2:
        raise SystemExit("the voice's graph has %d RandomNormalLike nodes, not 2" % len(rn))
    shape_of_z = None
    for nd in rn:
        name = "eps_dp" if nd.name.startswith("/dp/") else "eps_z"
        if name == "eps_z":
            shape_of_z = nd.input[0]
        for other in m.graph.node:
            for i, x in enumerate(other.input):
                if x == nd.output[0]:
                    other.input[i] = name
        m.graph.input.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [1, None, None]))
        m.graph.node.remove(nd)
    m.graph.node.append(onnx.helper.make_node("Shape", [shape_of_z], ["z_shape"]))
    m.graph.output.append(onnx.helper.make_tensor_value_info("z_shape", onnx.TensorProto.INT64, [3]))
    return m.SerializeToString()


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    skip = None
    try:
        import onnxruntime as ort
    except ImportError:
        skip = "onnxruntime is not installed (scripts/setup.sh installs it)"
    if not skip and not os.path.isfile(VOICE):
        skip = "%s is not in the model cache (scripts/fetch_models.sh)" % VOICE
    if skip:
        print("%s piper_matches_onnxruntime: %s" % ("FAIL" if CI else "skip", skip))
        print("0 passed, %d failed, %d skipped" % (1 if CI else 0, 0 if CI else 1))
        return 1 if CI else 0
    rng = np.random.default_rng(47)
    cases = [(HELLO, (0, 1, 0)), (FOX, (0, 1, 0)), (FOX, (0, 1.4, 0))]
    for n in (1, 9, 250):
        cases.append(([int(x) for x in rng.integers(0, 151, n)], (0, 1, 0)))
    noisy = [(HELLO, (0.667, 1, 0.8)), (FOX, (0.667, 1, 0.8)), (cases[-1][0], (0.667, 1.2, 0.8))]
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(VOICE, opts, providers=["CPUExecutionProvider"])
    fed = ort.InferenceSession(noise_fed(VOICE), opts, providers=["CPUExecutionProvider"])
    with tempfile.TemporaryDirectory(prefix="nm-piper-ort-") as d:
        for k, (ids, scales) in enumerate(cases + noisy):
            feed = {"input": np.array([ids], np.int64), "input_lengths": np.array([len(ids)], np.int64),
                    "scales": np.array(scales, np.float32)}
            if k < len(cases):
                out = sess.run(None, feed)[0]
            else:  # our draws: 2 a phoneme (time-major [n][2]), then inter a frame ([frames][inter])
                eps_dp = normals(1, 2 * len(ids)).reshape(len(ids), 2).T[None]
                _, zs = fed.run(None, dict(feed, eps_dp=eps_dp, eps_z=np.zeros((1, 1, 1), np.float32)))
                inter, frames = int(zs[1]), int(zs[2])
                eps_z = normals(1, 2 * len(ids) + frames * inter)[2 * len(ids):].reshape(frames, inter).T[None]
                out, _ = fed.run(None, dict(feed, eps_dp=eps_dp, eps_z=np.ascontiguousarray(eps_z)))
            open(os.path.join(d, "%d.ids" % k), "w").write(" ".join(map(str, ids)))
            open(os.path.join(d, "%d.scales" % k), "w").write("%g %g %g" % scales)
            out.reshape(-1).astype("<f4").tofile(os.path.join(d, "%d.f32" % k))
        runs = []
        for kernels, extra in (("this CPU's kernels", {}), ("the f32 kernels", {"NM_NO_AMX": "1"}),
                               ("HiFi-GAN on OpenCL", {"NM_PIPER_DEVICE": "opencl"})):
            env = dict(os.environ, NM_PIPER_ORACLE=d, NM_MODEL_DIR=MODELS, **extra)
            p = subprocess.run([sys.argv[1], "--filter", "piper_matches_onnxruntime"], env=env, capture_output=True,
                               text=True, timeout=600)
            runs.append((kernels, p))
    failed = skipped = 0
    for kernels, p in runs:
        sys.stdout.write(p.stdout)
        skip = p.returncode == 0 and "0 passed, 0 failed, 1 skipped" in p.stdout
        ok = p.returncode == 0 and "1 passed, 0 failed" in p.stdout
        failed += not ok and not skip
        skipped += skip
        print("%s piper_matches_onnxruntime (%d cases, %d with the noises fed, %s)" % (
            "ok  " if ok else "skip" if skip else "FAIL", len(cases) + len(noisy), len(noisy), kernels))
    print("%d passed, %d failed, %d skipped" % (len(runs) - failed - skipped, failed, skipped))
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
