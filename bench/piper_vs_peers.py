#!/usr/bin/env python3
"""nanomind's Piper voice against piper-tts (onnxruntime) and sherpa-onnx on the same voice, the same
sentences, the same threads, in one run: real-time factor, first audio of a three-sentence answer,
peak RSS. Each engine runs in a process of its own (its peak RSS is that process's).

usage: bench/piper_vs_peers.py BUILD/nanomind [--threads 2] [--reps 3]

Needs piper-tts and sherpa-onnx (PyPI; a peer missing is reported and skipped). piper-tts runs twice:
as the piper command runs it (onnxruntime's default session), and with its session given exactly the
threads (piper-tts/2t: intra-op threads, one inter-op). and the voice's .onnx
beside its GGUF in the model cache (scripts/fetch_models.sh). The text: tests/data/piper/sentences.txt,
all 30 sentences as one text (RTF: synthesis seconds / audio seconds, warm: the voice loaded and one
sentence spoken first), and its first three sentences (first audio: seconds from the text to the first
samples). The noises at the voice's defaults. nanomind/stream: say --stream-ms 200 (the first long sentence's first 0.2 s
made first: what the assistant and the server do); nanomind/f32 (and /f32/stream): NM_NO_AMX=1 (the f32 kernels only, as
on a CPU without AMX). Prints a table and one JSON line per engine.
"""
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.environ.get("NM_MODEL_DIR", os.path.expanduser("~/.cache/nanomind/models"))
ONNX = os.path.join(MODELS, "piper-en_US-joe-medium.onnx")
GGUF = os.path.join(MODELS, "piper-en_US-joe-medium.gguf")
LINES = open(os.path.join(ROOT, "tests", "data", "piper", "sentences.txt"), encoding="utf-8").read().splitlines()
TEXT, ANSWER = " ".join(LINES), " ".join(LINES[:3])


def piper_tts(threads, reps, tuned):
    import onnxruntime
    from piper import PiperVoice
    v = PiperVoice.load(ONNX)  # (its own session: onnxruntime's defaults, as the piper command runs)
    if tuned:  # the session given exactly the threads (intra-op), none between ops
        opts = onnxruntime.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        v.session = onnxruntime.InferenceSession(ONNX, sess_options=opts, providers=["CPUExecutionProvider"])
    list(v.synthesize(LINES[0]))  # warm
    best = None
    for _ in range(reps):
        t0 = time.perf_counter()
        n = sum(len(c.audio_float_array) for c in v.synthesize(TEXT))
        dt = time.perf_counter() - t0
        t0 = time.perf_counter()
        first = None
        for c in v.synthesize(ANSWER):
            first = first or time.perf_counter() - t0
        r = {"rtf": dt / (n / v.config.sample_rate), "audio_s": n / v.config.sample_rate, "first_audio_s": first}
        best = r if best is None or r["rtf"] < best["rtf"] else best
    return best


def sherpa(threads, reps):
    # sherpa-onnx >= 2 takes a Piper voice's phonemes from an external phonemizer (GenerationConfig's
    # phoneme_codepoints, its documented way): piper-tts's, made inside the timed region
    import onnx
    import sherpa_onnx
    from piper import PiperVoice
    cfg = json.load(open(ONNX + ".json"))
    d = tempfile.mkdtemp(prefix="nm-sherpa-")
    m = onnx.load(ONNX)  # sherpa-onnx reads the voice's settings from the model's metadata: added to a copy
    for k, val in {"model_type": "vits", "comment": "piper", "language": "English", "voice": cfg["espeak"]["voice"],
                   "has_espeak": "1", "n_speakers": "1", "sample_rate": str(cfg["audio"]["sample_rate"])}.items():
        m.metadata_props.add(key=k, value=val)
    onnx.save(m, os.path.join(d, "voice.onnx"))
    with open(os.path.join(d, "tokens.txt"), "w", encoding="utf-8") as f:
        for sym, ids in cfg["phoneme_id_map"].items():
            f.write("%s %d\n" % (sym, ids[0]))
    vits = sherpa_onnx.OfflineTtsVitsModelConfig(model=os.path.join(d, "voice.onnx"), tokens=os.path.join(d, "tokens.txt"),
                                                 noise_scale=cfg["inference"]["noise_scale"],
                                                 noise_scale_w=cfg["inference"]["noise_w"],
                                                 length_scale=cfg["inference"]["length_scale"])
    tts = sherpa_onnx.OfflineTts(sherpa_onnx.OfflineTtsConfig(
        model=sherpa_onnx.OfflineTtsModelConfig(vits=vits, num_threads=threads), max_num_sentences=1))
    phon = PiperVoice.load(ONNX)  # (its phonemizer only)

    def gen(text, callback=None):
        g = sherpa_onnx.GenerationConfig()
        g.phoneme_codepoints = [[ord(c) for c in s] for s in phon.phonemize(text)]
        return tts.generate(text, g, callback=callback) if callback else tts.generate(text, g)

    gen(LINES[0])
    best = None
    for _ in range(reps):
        t0 = time.perf_counter()
        a = gen(TEXT)
        dt = time.perf_counter() - t0
        first = []
        t0 = time.perf_counter()
        gen(ANSWER, callback=lambda s, p: (first.append(time.perf_counter() - t0) if not first else None) or 1)
        r = {"rtf": dt / (len(a.samples) / a.sample_rate), "audio_s": len(a.samples) / a.sample_rate,
             "first_audio_s": first[0] if first else None}
        best = r if best is None or r["rtf"] < best["rtf"] else best
    return best


def nanomind(nm, threads, reps, stream_ms=0, env=None):
    best = None
    with tempfile.TemporaryDirectory(prefix="nm-piper-bench-") as d:
        txt, ans = os.path.join(d, "text.txt"), os.path.join(d, "answer.txt")
        open(txt, "w").write(TEXT)
        open(ans, "w").write(ANSWER)
        for _ in range(reps):
            r = {}
            for f, key in ((txt, "rtf"), (ans, "first")):
                p = subprocess.run([nm, "say", "--tts", "piper", "--voice", GGUF, "-f", f, "-o", os.path.join(d, "o.wav"),
                                    "--stream-ms", str(stream_ms), "--stats"], capture_output=True, text=True,
                                   env=dict(os.environ, **(env or {})))
                if p.returncode:
                    raise RuntimeError(p.stderr)
                for line in p.stderr.splitlines():
                    w = line.split()
                    if line.startswith("synthesis:") and key == "rtf":
                        r["rtf"], r["audio_s"] = float(w[1]) / float(w[4]), float(w[4])
                    if line.startswith("first audio:") and key == "first":
                        r["first_audio_s"] = float(w[2])
            best = r if best is None or r["rtf"] < best["rtf"] else best
    return best


def child(engine, nm, threads, reps):
    r = {"piper-tts": lambda: piper_tts(threads, reps, False), "piper-tts/2t": lambda: piper_tts(threads, reps, True),
         "sherpa-onnx": lambda: sherpa(threads, reps),
         "nanomind": lambda: nanomind(nm, threads, reps),
         "nanomind/stream": lambda: nanomind(nm, threads, reps, 200),
         "nanomind/f32": lambda: nanomind(nm, threads, reps, env={"NM_NO_AMX": "1"}),
         "nanomind/f32/stream": lambda: nanomind(nm, threads, reps, 200, env={"NM_NO_AMX": "1"})}[engine]()
    r["engine"] = engine
    # the process's own peak (nanomind: its child's, the say command)
    who = resource.RUSAGE_CHILDREN if engine.startswith("nanomind") else resource.RUSAGE_SELF
    r["peak_rss_mib"] = resource.getrusage(who).ru_maxrss / 1024.0
    print(json.dumps(r))


def main():
    args = sys.argv[1:]
    if len(args) >= 2 and args[0] == "--child":
        child(args[1], args[2], int(args[3]), int(args[4]))
        return 0
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    nm, threads, reps = os.path.abspath(args[0]), 2, 3
    if "--threads" in args:
        threads = int(args[args.index("--threads") + 1])
    if "--reps" in args:
        reps = int(args[args.index("--reps") + 1])
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print("cpu: %s; %d threads; best of %d; %d sentences, %d characters" % (cpu, threads, reps, len(LINES), len(TEXT)))
    rows = []
    for engine in ("nanomind", "nanomind/stream", "nanomind/f32", "nanomind/f32/stream", "piper-tts", "piper-tts/2t",
                   "sherpa-onnx"):
        p = subprocess.run([sys.executable, __file__, "--child", engine, nm, str(threads), str(reps)], capture_output=True,
                           text=True, env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
        if p.returncode:
            print("%-12s failed or missing: %s" % (engine, (p.stderr.strip().splitlines() or ["?"])[-1]))
            continue
        r = json.loads(p.stdout.strip().splitlines()[-1])
        rows.append(r)
        print(json.dumps(r))
    base = next((r for r in rows if r["engine"] == "nanomind"), None)
    streamed = next((r for r in rows if r["engine"] == "nanomind/stream"), None)
    f32 = next((r for r in rows if r["engine"] == "nanomind/f32"), None)
    f32s = next((r for r in rows if r["engine"] == "nanomind/f32/stream"), None)
    print("%-12s %8s %10s %12s %10s" % ("engine", "RTF", "audio s", "first audio", "peak RSS"))
    for r in rows:
        print("%-12s %8.4f %10.2f %10.3f s %7.1f MiB" % (r["engine"], r["rtf"], r["audio_s"], r["first_audio_s"] or 0,
                                                          r["peak_rss_mib"]))
    for r in rows:
        if base and not r["engine"].startswith("nanomind"):
            print("nanomind / %s: RTF %.2f, first audio %.2f (streamed: %s), peak RSS %.2f" % (
                r["engine"], base["rtf"] / r["rtf"], base["first_audio_s"] / r["first_audio_s"],
                "%.2f" % (streamed["first_audio_s"] / r["first_audio_s"]) if streamed else "-",
                base["peak_rss_mib"] / r["peak_rss_mib"]))
            if f32:
                print("  the f32 kernels (NM_NO_AMX=1, a CPU without AMX): RTF %.2f, first audio %.2f (streamed: %s), "
                      "peak RSS %.2f" % (f32["rtf"] / r["rtf"], f32["first_audio_s"] / r["first_audio_s"],
                                         "%.2f" % (f32s["first_audio_s"] / r["first_audio_s"]) if f32s else "-",
                                         f32["peak_rss_mib"] / r["peak_rss_mib"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
