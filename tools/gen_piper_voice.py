#!/usr/bin/env python3
"""A tiny random-weight Piper voice in the GGUF layout tools/convert_piper.py writes (arch "piper": the
same tensor names, shapes in the same roles, the same keys), at small sizes, for fast tests and fuzz
seeds: tests/data/piper/tiny-rb1.gguf and tiny-rb2.gguf are made by

    tools/gen_piper_voice.py --resblock 2 --seed 1 -o tests/data/piper/tiny-rb2.gguf
    tools/gen_piper_voice.py --resblock 1 --seed 2 -o tests/data/piper/tiny-rb1.gguf

(hidden 16, 2 heads, window 2, 2 layers; a duration predictor of 2 layers and 2 spline flows of 4 bins;
2 coupling flows of 2 WaveNet layers; HiFi-GAN from 16 channels upsampling 2 x 2 with kernels 4, 4,
residual blocks of kernels 3 and 5, dilations (1, 2) each; 12 phonemes). `--shape medium` gives a Piper
"medium" voice's shapes instead (en_US-joe-medium's: hidden 192, 6 layers, HiFi-GAN from 256 channels
upsampling 8 x 8 x 4, ResBlock2 kernels 3, 5, 7; 22050 Hz; ~63 MB), random, for timing where the real
voice cannot go (the device machine). Weights are scaled so the signal stays in range through the layers.
Tooling only (numpy).
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_writer import GgufWriter  # noqa: E402

PHONEMES = ["_", "^", "$", " ", ".", ",", "?", "!", "a", "b", "h", "\u0259"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--resblock", type=int, choices=(1, 2), default=2)
    ap.add_argument("--shape", choices=("tiny", "medium"), default="tiny")
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    H, INTER, FILT, FK, L, HEADS, WIN = 16, 8, 32, 3, 2, 2, 2
    DPF, DPK, DPL, DPFLOWS, BINS = 16, 3, 2, 2, 4
    NC, WNL, WNK = 2, 2, 5
    INIT, DK, RATES, UPK, RESK, DIL = 16, 7, [2, 2], [4, 4], [3, 5], [[1, 2], [1, 2]]
    RATE = 16000
    if a.shape == "medium":
        H, INTER, FILT, FK, L, HEADS, WIN = 192, 192, 768, 3, 6, 2, 4
        DPF, DPK, DPL, DPFLOWS, BINS = 192, 3, 3, 3, 10
        NC, WNL, WNK = 4, 4, 5
        INIT, DK, RATES, UPK, RESK, DIL = 256, 7, [8, 8, 4], [16, 16, 8], [3, 5, 7], [[1, 2], [2, 6], [3, 12]]
        RATE = 22050
    NV = len(PHONEMES)
    W = {}

    def t(name, *shape, scale=None):
        fan = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
        s = scale if scale is not None else 1.0 / np.sqrt(max(fan, 1))
        W[name] = (rng.standard_normal(shape) * s).astype(np.float32)

    def bias(name, n):
        W[name] = (rng.standard_normal(n) * 0.05).astype(np.float32)

    def norm(name, n):
        W[name + ".gamma"] = (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)
        W[name + ".beta"] = (0.1 * rng.standard_normal(n)).astype(np.float32)

    def conv(name, oc, ic, k, b=True):
        t(name + ".weight", oc, ic, k)
        if b:
            bias(name + ".bias", oc)

    t("enc_p.emb.weight", NV, H, scale=H ** -0.5)
    for l in range(L):
        p = "enc_p.encoder.attn_layers.%d." % l
        t(p + "emb_rel_k", 1, 2 * WIN + 1, H // HEADS, scale=(H // HEADS) ** -0.5)
        t(p + "emb_rel_v", 1, 2 * WIN + 1, H // HEADS, scale=(H // HEADS) ** -0.5)
        for c in "qkvo":
            conv(p + "conv_" + c, H, H, 1)
        norm("enc_p.encoder.norm_layers_1.%d" % l, H)
        norm("enc_p.encoder.norm_layers_2.%d" % l, H)
        conv("enc_p.encoder.ffn_layers.%d.conv_1" % l, FILT, H, FK)
        conv("enc_p.encoder.ffn_layers.%d.conv_2" % l, H, FILT, FK)
    conv("enc_p.proj", 2 * INTER, H, 1)
    conv("dp.pre", DPF, H, 1)
    conv("dp.proj", DPF, DPF, 1)

    def dds(p):
        for k in range(DPL):
            t(p + "convs_sep.%d.weight" % k, DPF, 1, DPK)
            bias(p + "convs_sep.%d.bias" % k, DPF)
            conv(p + "convs_1x1.%d" % k, DPF, DPF, 1)
            norm(p + "norms_1.%d" % k, DPF)
            norm(p + "norms_2.%d" % k, DPF)

    dds("dp.convs.")
    for f in range(DPFLOWS):
        p = "dp.flows.%d." % (1 + 2 * (f + 1))
        conv(p + "pre", DPF, 1, 1)
        dds(p + "convs.")
        t(p + "proj.weight", 3 * BINS - 1, DPF, 1, scale=0.1)
        bias(p + "proj.bias", 3 * BINS - 1)
    W["dp.flows.0.m"] = (0.1 * rng.standard_normal((2, 1))).astype(np.float32)
    W["dp.flows.0.exp_neg_logs"] = np.exp(-0.1 * rng.standard_normal((2, 1))).astype(np.float32)
    for f in range(NC):
        p = "flow.flows.%d." % (2 * f)
        conv(p + "pre", H, INTER // 2, 1)
        for l in range(WNL):
            conv(p + "enc.in_layers.%d" % l, 2 * H, H, WNK)
            conv(p + "enc.res_skip_layers.%d" % l, 2 * H if l + 1 < WNL else H, H, 1)
        conv(p + "post", INTER // 2, H, 1)
        W[p + "post.weight"] *= 0.1
    conv("dec.conv_pre", INIT, INTER, DK)
    ch = INIT
    for u, (r, k) in enumerate(zip(RATES, UPK)):
        t("dec.ups.%d.weight" % u, ch, ch // 2, k)
        bias("dec.ups.%d.bias" % u, ch // 2)
        ch //= 2
        for j, (rk, ds) in enumerate(zip(RESK, DIL)):
            b = "dec.resblocks.%d." % (u * len(RESK) + j)
            for c, d in enumerate(ds):
                if a.resblock == 2:
                    conv(b + "convs.%d" % c, ch, ch, rk)
                else:
                    conv(b + "convs1.%d" % c, ch, ch, rk)
                    conv(b + "convs2.%d" % c, ch, ch, rk)
    t("dec.conv_post.weight", 1, ch, DK)

    g = GgufWriter()
    g.add_str("general.architecture", "piper")
    g.add_str("general.name", "%s-rb%d" % (a.shape, a.resblock))
    g.add_u32("piper.sample_rate", RATE)
    g.add_str("piper.quality", "test")
    g.add_f32("piper.noise_scale", 0.667)
    g.add_f32("piper.length_scale", 1.0)
    g.add_f32("piper.noise_w", 0.8)
    g.add_str("piper.espeak.voice", "en-us")
    g.add_str("piper.language", "en_US")
    g.add_u32("piper.num_symbols", NV)
    g.add_str_array("piper.phonemes", PHONEMES)
    g.add_i32_array("piper.phoneme_id_counts", [1] * NV)
    g.add_i32_array("piper.phoneme_ids", list(range(NV)))
    hp = dict(hidden=H, inter=INTER, filter=FILT, ffn_kernel=FK, n_layers=L, n_heads=HEADS, window=WIN,
              dp_filter=DPF, dp_kernel=DPK, dp_layers=DPL, dp_flows=DPFLOWS, dp_bins=BINS, flow_layers=NC,
              flow_wn_layers=WNL, flow_kernel=WNK, dec_initial=INIT, dec_kernel=DK, resblock=a.resblock)
    for k, v in hp.items():
        g.add_u32("piper." + k, v)
    g.add_i32_array("piper.upsample_rates", RATES)
    g.add_i32_array("piper.upsample_kernels", UPK)
    g.add_i32_array("piper.resblock_kernels", RESK)
    g.add_i32_array("piper.resblock_dilations", [d for ds in DIL for d in ds])
    for k in sorted(W):
        g.add_tensor(k, W[k], "f32")
    g.write(a.out)
    print("gen_piper_voice: %d weights -> %s" % (len(W), a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
