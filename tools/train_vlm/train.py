#!/usr/bin/env python3
"""Trains the test VLM: a small CLIP-layout vision transformer and an `mlp` projector into
the embedding space of SmolLM2-135M-Instruct, the language model frozen (its weights
dequantized from the default GGUF, so the projector learns the very model nanomind runs),
on synthetic scenes (scenes.py) drawn on the fly. Runs on the GPU machine (PyTorch).

    train.py --llm SmolLM2-135M-Instruct.Q4_1.gguf --tokens tokens.json --out DIR
             [--steps 3000] [--batch 96] [--lr 5e-4] [--seed 1] [--workers 14]
    train.py --llm random ... --steps 30      the pipeline on a random LLM of the same shape
                                              (a smoke run: step time, shapes, export)
    train.py ... --init vlm-mmproj-q8_0.gguf  a second stage from an exported file (its q8_0
                                              weights dequantized; the auxiliary heads afresh)

Writes DIR/vlm-mmproj-f16.gguf and DIR/vlm-mmproj-q8_0.gguf (llama.cpp's mmproj layout,
docs/mmproj.md), DIR/loss.csv (step, seconds, loss) and DIR/eval.json (held-out accuracy
by question, measured here by teacher forcing: an answer counts when every one of its
tokens and the end-of-turn token are the argmax, which is what greedy decoding produces).

The encoder is the math llama.cpp's mtmd runs for an `mlp` projector (docs/mmproj.md):
conv patch embedding (no bias), no class token (so none of llama.cpp's class-token order
applies), position embeddings, pre-LN, layers with tanh GELU (clip.use_gelu), post-LN,
then GELU-tanh MLP. llama.cpp runs the first block_count - 1 layers for this projector,
so the file holds one more layer than was trained, zeros, which never runs. The sequence
the LLM sees is the one `nanomind run --chat --image` and llama-mtmd-cli build: the chat
template's text before the media marker, the 196 image embeddings, the text after it.
"""
import argparse
import json
import math
import multiprocessing as mp
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "vision_ref"))
import scenes  # noqa: E402
from gguf_writer import GgufWriter  # noqa: E402

MEAN = STD = (0.5, 0.5, 0.5)
P = 16
N_PATCH = (scenes.S // P) ** 2
EVAL_SEED = 999
AUX_WHAT = 2 + len(scenes.SHAPES)  # background, shapes, digit
AUX_COLOUR = 1 + len(scenes.COLOURS)
AUX_WEIGHT = 0.3
# how often each question is drawn for a training scene, relative to the others of that scene: the
# shape and the place of a shape are what the first run learned least (docs/vlm.md)
Q_WEIGHT = {scenes.Q_SHAPE: 3.0, scenes.Q_WHERE: 2.0, scenes.Q_COUNT: 0.5}
QUADRANT = torch.tensor([(i // scenes.G >= scenes.G // 2) * 2 + (i % scenes.G >= scenes.G // 2)
                         for i in range(N_PATCH)])


# ---- the frozen LLM: llama as llama.cpp runs a GGUF (rope mode 0: adjacent pairs) ----------------
class Llama:
    def __init__(self, path, dev):
        if path == "random":
            hp = dict(n_layer=30, d=576, n_head=9, n_kv=3, ff=1536, eps=1e-5, base=100000.0, vocab=49152)
            g = torch.Generator().manual_seed(0)

            def T(shape, scale):
                return (torch.randn(shape, generator=g) * scale).to(dev)

            def W(name, shape):
                if name.endswith("norm.weight"):
                    return torch.ones(shape, device=dev)
                return T(shape, 1.0 / math.sqrt(shape[-1]))
        else:
            from clip_ref import Gguf
            gg = Gguf(path)
            kv = gg.kv
            if kv["general.architecture"] != "llama":
                raise SystemExit("train.py: %s is not a llama-arch GGUF" % path)
            self.vocab_text = kv["tokenizer.ggml.tokens"]
            hp = dict(n_layer=kv["llama.block_count"], d=kv["llama.embedding_length"],
                      n_head=kv["llama.attention.head_count"], n_kv=kv["llama.attention.head_count_kv"],
                      ff=kv["llama.feed_forward_length"], eps=kv["llama.attention.layer_norm_rms_epsilon"],
                      base=kv["llama.rope.freq_base"], vocab=len(kv["tokenizer.ggml.tokens"]))

            def W(name, shape):
                return torch.tensor(gg.tensor(name), dtype=torch.float32).to(dev)
        self.__dict__.update(hp)
        d, hd = self.d, self.d // self.n_head
        self.emb = W("token_embd.weight", (self.vocab, d))
        self.out = self.emb  # SmolLM2 ties the output head to the embeddings
        if path != "random" and "output.weight" in gg.tensors:
            self.out = W("output.weight", (self.vocab, d))
        self.norm = W("output_norm.weight", (d,))
        self.layers = []
        for i in range(self.n_layer):
            b = "blk.%d." % i
            L = {k: W(b + k + ".weight", s) for k, s in (
                ("attn_norm", (d,)), ("attn_q", (d, d)), ("attn_k", (self.n_kv * hd, d)),
                ("attn_v", (self.n_kv * hd, d)), ("attn_output", (d, d)), ("ffn_norm", (d,)),
                ("ffn_gate", (self.ff, d)), ("ffn_up", (self.ff, d)), ("ffn_down", (d, self.ff)))}
            for k in L:
                if not k.endswith("norm"):
                    L[k] = L[k].to(torch.bfloat16)
            self.layers.append(L)
        self.out16 = self.out.to(torch.bfloat16)

    def rms(self, x, w):
        x = x.float()
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def hidden(self, x):
        """x [B, T, d] input embeddings -> final-normed hidden states [B, T, d] (float32)."""
        B, T, d = x.shape
        nh, nkv, hd = self.n_head, self.n_kv, d // self.n_head
        inv = self.base ** (-torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd)
        ang = torch.arange(T, device=x.device, dtype=torch.float32)[:, None] * inv[None, :]
        cos, sin = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]

        def rope(t):
            t = t.float()
            t0, t1 = t[..., 0::2], t[..., 1::2]
            return torch.stack([t0 * cos - t1 * sin, t0 * sin + t1 * cos], dim=-1).flatten(-2)

        x = x.float()
        for L in self.layers:
            h = self.rms(x, L["attn_norm"]).to(torch.bfloat16)
            q = rope((h @ L["attn_q"].T).view(B, T, nh, hd))
            k = rope((h @ L["attn_k"].T).view(B, T, nkv, hd))
            v = (h @ L["attn_v"].T).view(B, T, nkv, hd)
            q, k, v = (t.transpose(1, 2).to(torch.bfloat16) for t in (q, k, v))
            k = k.repeat_interleave(nh // nkv, dim=1)
            v = v.repeat_interleave(nh // nkv, dim=1)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + (a.transpose(1, 2).reshape(B, T, d) @ L["attn_output"].T).float()
            h = self.rms(x, L["ffn_norm"]).to(torch.bfloat16)
            x = x + ((F.silu(h @ L["ffn_gate"].T) * (h @ L["ffn_up"].T)) @ L["ffn_down"].T).float()
        return self.rms(x, self.norm)

    def logits(self, h):
        return (h.to(torch.bfloat16) @ self.out16.T).float()

    def greedy(self, ids, n):
        """Greedy continuation of a token list (no cache: a check of the forward pass)."""
        ids = list(ids)
        with torch.no_grad():
            for _ in range(n):
                x = self.emb[torch.tensor(ids, device=self.emb.device)][None]
                ids.append(int(self.logits(self.hidden(x)[0, -1]).argmax()))
        return ids


# ---- the vision encoder + projector (llama.cpp's clip graph for an mlp projector) ---------------
class Block(nn.Module):
    def __init__(self, d, f, nh):
        super().__init__()
        self.nh = nh
        self.ln1, self.ln2 = nn.LayerNorm(d, eps=1e-5), nn.LayerNorm(d, eps=1e-5)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.up, self.down = nn.Linear(d, f), nn.Linear(f, d)

    def forward(self, x):
        B, T, d = x.shape
        h = self.ln1(x)
        q, k, v = (m(h).view(B, T, self.nh, d // self.nh).transpose(1, 2) for m in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v)
        x = x + self.o(a.transpose(1, 2).reshape(B, T, d))
        return x + self.down(F.gelu(self.up(self.ln2(x)), approximate="tanh"))


class Vit(nn.Module):
    def __init__(self, d, f, nh, n_layer, n_out):
        super().__init__()
        self.d, self.f, self.nh, self.n_layer, self.n_out = d, f, nh, n_layer, n_out
        self.patch = nn.Conv2d(3, d, P, P, bias=False)
        self.pos = nn.Parameter(torch.randn(N_PATCH, d) * 0.02)
        self.pre_ln, self.post_ln = nn.LayerNorm(d, eps=1e-5), nn.LayerNorm(d, eps=1e-5)
        self.blocks = nn.ModuleList(Block(d, f, nh) for _ in range(n_layer))
        self.mm0, self.mm2 = nn.Linear(d, n_out), nn.Linear(n_out, n_out)
        # training only (not exported): per-patch heads on the encoder's output, what covers the
        # patch, its colour and its quadrant, so the tokens carry shape and place early on
        self.aux = nn.Linear(d, AUX_WHAT + AUX_COLOUR + 4)
        with torch.no_grad():  # 2-D sine-cosine start for the position table
            g = scenes.G
            yy, xx = torch.meshgrid(torch.arange(g).float(), torch.arange(g).float(), indexing="ij")
            k = torch.arange(d // 4).float()
            w = 1.0 / (100.0 ** (k / (d // 4)))
            e = [f(c.reshape(-1, 1) * w) for c in (yy, xx) for f in (torch.sin, torch.cos)]
            self.pos.copy_(torch.cat(e, dim=1) * 0.5)

    def features(self, img):
        x = self.patch(img).flatten(2).transpose(1, 2) + self.pos  # row py * G + px
        x = self.pre_ln(x)
        for b in self.blocks:
            x = b(x)
        return self.post_ln(x)

    def project(self, f):
        return self.mm2(F.gelu(self.mm0(f), approximate="tanh"))

    def forward(self, img):
        return self.project(self.features(img))

    def load_gguf(self, path):
        """Starts from an exported mmproj (this class's own layout; q8_0 weights dequantized): a
        second stage that continues a run whose export is all that came back. The auxiliary heads,
        never exported, start afresh."""
        from clip_ref import Gguf
        g = Gguf(path)
        for k, v in (("embedding_length", self.d), ("feed_forward_length", self.f),
                     ("block_count", self.n_layer + 1), ("projection_dim", self.n_out),
                     ("attention.head_count", self.nh)):
            if g.kv.get("clip.vision." + k) != v:
                raise ValueError("%s: clip.vision.%s is %s, this model has %d" % (path, k, g.kv.get("clip.vision." + k), v))

        def put(m, name):
            t = torch.from_numpy(g.tensor(name).astype(np.float32))
            if tuple(m.shape) != tuple(t.shape):
                raise ValueError("%s: %s has shape %s, this model %s" % (path, name, tuple(t.shape), tuple(m.shape)))
            m.copy_(t)

        with torch.no_grad():
            put(self.patch.weight, "v.patch_embd.weight")
            put(self.pos, "v.position_embd.weight")
            for ln, name in ((self.pre_ln, "v.pre_ln"), (self.post_ln, "v.post_ln")):
                put(ln.weight, name + ".weight")
                put(ln.bias, name + ".bias")
            for i, b in enumerate(self.blocks):
                pre = "v.blk.%d." % i
                for attr, name in (("ln1", "ln1"), ("ln2", "ln2"), ("q", "attn_q"), ("k", "attn_k"),
                                   ("v", "attn_v"), ("o", "attn_out"), ("up", "ffn_up"), ("down", "ffn_down")):
                    put(getattr(b, attr).weight, pre + name + ".weight")
                    put(getattr(b, attr).bias, pre + name + ".bias")
            for m, name in ((self.mm0, "mm.0"), (self.mm2, "mm.2")):
                put(m.weight, name + ".weight")
                put(m.bias, name + ".bias")

    def export(self, path, wtype):
        w = GgufWriter()
        w.add_str("general.architecture", "clip")
        w.add_str("general.type", "mmproj")
        w.add_str("general.name", "nanomind test VLM (synthetic scenes, SmolLM2-135M-Instruct)")
        w.add_u32("general.file_type", {"f16": 1, "q8_0": 7}[wtype])
        w.add_bool("clip.has_vision_encoder", True)
        w.add_bool("clip.has_llava_projector", True)
        w.add_str("clip.projector_type", "mlp")
        w.add_bool("clip.use_gelu", True)
        w.add_u32("clip.vision.image_size", scenes.S)
        w.add_u32("clip.vision.patch_size", P)
        w.add_u32("clip.vision.embedding_length", self.d)
        w.add_u32("clip.vision.feed_forward_length", self.f)
        w.add_u32("clip.vision.block_count", self.n_layer + 1)
        w.add_u32("clip.vision.projection_dim", self.n_out)
        w.add_u32("clip.vision.attention.head_count", self.nh)
        w.add_f32("clip.vision.attention.layer_norm_epsilon", 1e-5)
        w.add_f32_array("clip.vision.image_mean", MEAN)
        w.add_f32_array("clip.vision.image_std", STD)

        def a(t):
            return t.detach().float().cpu().numpy()

        w.add_tensor("v.patch_embd.weight", a(self.patch.weight))  # [d, 3, p, p] = ne [p, p, 3, d]
        w.add_tensor("v.position_embd.weight", a(self.pos))
        w.add_tensor("v.pre_ln.weight", a(self.pre_ln.weight))
        w.add_tensor("v.pre_ln.bias", a(self.pre_ln.bias))
        names = (("attn_q", "q"), ("attn_k", "k"), ("attn_v", "v"), ("attn_out", "o"), ("ffn_up", "up"),
                 ("ffn_down", "down"))
        for i in range(self.n_layer + 1):
            b = self.blocks[i] if i < self.n_layer else None  # the last, never run, is zeros
            pre = "v.blk.%d." % i
            for ln in ("ln1", "ln2"):
                m = getattr(b, ln) if b else None
                w.add_tensor(pre + ln + ".weight", a(m.weight) if b else np.ones(self.d, np.float32))
                w.add_tensor(pre + ln + ".bias", a(m.bias) if b else np.zeros(self.d, np.float32))
            for gname, attr in names:
                shape = {"ffn_up": (self.f, self.d), "ffn_down": (self.d, self.f)}.get(gname, (self.d, self.d))
                m = getattr(b, attr) if b else None
                w.add_tensor(pre + gname + ".weight", a(m.weight) if b else np.zeros(shape, np.float32), wtype)
                w.add_tensor(pre + gname + ".bias", a(m.bias) if b else np.zeros(shape[0], np.float32))
        w.add_tensor("v.post_ln.weight", a(self.post_ln.weight))
        w.add_tensor("v.post_ln.bias", a(self.post_ln.bias))
        w.add_tensor("mm.0.weight", a(self.mm0.weight), wtype)
        w.add_tensor("mm.0.bias", a(self.mm0.bias))
        w.add_tensor("mm.2.weight", a(self.mm2.weight), wtype)
        w.add_tensor("mm.2.bias", a(self.mm2.bias))
        w.write(path)


# ---- data -------------------------------------------------------------------------------------
def make_batch(args):
    """Batch `step` of the training stream: images [B, S, S, 3] uint8 and (question, answer)s."""
    seed, step, n = args
    imgs, qa = np.empty((n, scenes.S, scenes.S, 3), np.uint8), []
    labs = np.empty((n, 2, scenes.G, scenes.G), np.int8)
    for i in range(n):
        img, _, pairs, labs[i] = scenes.scene(seed, step * n + i)
        rng = np.random.default_rng([seed, step * n + i, 7])
        imgs[i] = img
        w = np.array([Q_WEIGHT.get(q, 2.0 if q.startswith("Where is the ") else 1.0) for q, _ in pairs])
        qa.append(pairs[int(rng.choice(len(pairs), p=w / w.sum()))])
    return imgs, qa, labs


def batches(pool, seed, steps, n, ahead):
    """The training batches in order, at most `ahead` made in advance (an unbounded imap
    floods the main process with finished batches and slows the training steps)."""
    pend = [pool.apply_async(make_batch, ((seed, s, n),)) for s in range(min(ahead, steps))]
    for s in range(steps):
        b = pend.pop(0).get()
        if s + ahead < steps:
            pend.append(pool.apply_async(make_batch, ((seed, s + ahead, n),)))
        yield b


def eval_batch(n):
    imgs, cats, qa = np.empty((n, scenes.S, scenes.S, 3), np.uint8), [], []
    for i, (img, cat, q, a) in enumerate(scenes.eval_set(EVAL_SEED, n)):
        imgs[i] = img
        cats.append(cat)
        qa.append((q, a))
    return imgs, cats, qa


class Seqs:
    """Builds the LLM's input embeddings and answer targets for a batch."""

    def __init__(self, tokens, llm, dev):
        self.t, self.llm, self.dev = tokens, llm, dev

    def build(self, img_emb, qa, variants):
        xs, tgt_pos, tgt_ids, owner = [], [], [], []
        emb = self.llm.emb
        for i, ((q, a), var) in enumerate(zip(qa, variants)):
            v = self.t["questions"][q][var]
            pre = torch.tensor(v["pre"], device=self.dev)
            post = torch.tensor(v["post"] + self.t["answers"][a][:-1], device=self.dev)
            xs.append(torch.cat([emb[pre], img_emb[i].float(), emb[post]]))
            start = len(v["pre"]) + N_PATCH + len(v["post"]) - 1
            ans = self.t["answers"][a]
            tgt_pos += range(start, start + len(ans))
            tgt_ids += ans
            owner += [i] * len(ans)
        x = nn.utils.rnn.pad_sequence(xs, batch_first=True)
        return (x, torch.tensor(owner, device=self.dev), torch.tensor(tgt_pos, device=self.dev),
                torch.tensor(tgt_ids, device=self.dev))


def normalize(imgs, dev):
    x = torch.from_numpy(imgs).to(dev).permute(0, 3, 1, 2).float() / 255.0
    m = torch.tensor(MEAN, device=dev)[None, :, None, None]
    s = torch.tensor(STD, device=dev)[None, :, None, None]
    return (x - m) / s


def forward_loss(vit, llm, seqs, imgs, qa, variants, dev, labs=None):
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dev.type == "cuda"):
        f = vit.features(normalize(imgs, dev))
        e = vit.project(f)
        aux = vit.aux(f).float() if labs is not None else None
    x, owner, pos, ids = seqs.build(e, qa, variants)
    h = llm.hidden(x)[owner, pos]
    logits = llm.logits(h)
    loss = F.cross_entropy(logits, ids)
    if aux is not None:
        lab = torch.from_numpy(labs).to(dev).long().flatten(2)  # [B, 2, N_PATCH]
        quad = QUADRANT.to(dev)[None].expand(len(qa), -1)
        loss_aux = (F.cross_entropy(aux[..., :AUX_WHAT].transpose(1, 2), lab[:, 0]) +
                    F.cross_entropy(aux[..., AUX_WHAT:AUX_WHAT + AUX_COLOUR].transpose(1, 2), lab[:, 1]) +
                    F.cross_entropy(aux[..., AUX_WHAT + AUX_COLOUR:].transpose(1, 2), quad))
        loss = loss + AUX_WEIGHT * loss_aux
    return loss, logits.argmax(-1) == ids, owner


def evaluate(vit, llm, seqs, n, dev, bs=100):
    imgs, cats, qa = eval_batch(n)
    ok = np.zeros(n, bool)
    vit.eval()
    with torch.no_grad():
        for s in range(0, n, bs):
            _, hit, owner = forward_loss(vit, llm, seqs, imgs[s:s + bs], qa[s:s + bs],
                                         ["system"] * len(qa[s:s + bs]), dev)
            bad = torch.zeros(len(qa[s:s + bs]), device=dev).index_add_(0, owner, (~hit).float())
            ok[s:s + bs] = (bad == 0).cpu().numpy()
    vit.train()
    res = {}
    for c in ("colour", "shape", "count", "position"):
        sel = [i for i in range(n) if cats[i] == c]
        res[c] = {"n": len(sel), "correct": int(ok[sel].sum()), "accuracy": float(ok[sel].mean())}
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llm", required=True)
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=96)
    ap.add_argument("--lr", type=float, default=8e-4)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workers", type=int, default=14)
    ap.add_argument("--eval", type=int, default=400, help="held-out questions at the end")
    ap.add_argument("--time-limit", type=float, default=0,
                    help="seconds of training: the learning rate's cosine follows whichever of the steps and "
                         "the time runs out first, and the run stops there, evaluates and exports (eval.json "
                         "records the step it stopped at)")
    ap.add_argument("--eval-every", type=int, default=0,
                    help="steps between held-out scores during the run (eval_curve.csv), each also exported")
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--ff", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--system-frac", type=float, default=0.8,
                    help="share of prompts with the default system turn (the rest without it)")
    ap.add_argument("--init", default="",
                    help="start from this exported mmproj (a second stage of a run: docs/vlm.md)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(a.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    t0 = time.time()
    llm = Llama(a.llm, dev)
    tokens = json.load(open(a.tokens))
    print("llm: %s, %d layers, d %d, vocab %d, loaded in %.1f s" % (a.llm, llm.n_layer, llm.d, llm.vocab,
                                                                    time.time() - t0), flush=True)
    if a.llm != "random":  # the frozen LLM as nanomind runs it: compare with `nanomind run --chat --temp 0`
        v = tokens["questions"][scenes.Q_DESCRIBE]["system"]
        ids = v["pre"] + v["post"]
        out = llm.greedy(ids, 24)[len(ids):]
        text = "".join(llm.vocab_text[i] for i in out).replace("\u0120", " ").replace("\u010a", "\n")
        print("check: greedy reply to %r: %s %r" % (scenes.Q_DESCRIBE, out, text), flush=True)
    vit = Vit(a.d, a.ff, a.heads, a.layers, llm.d).to(dev)
    if a.init:
        vit.load_gguf(a.init)
        print("init: %s" % a.init, flush=True)
    n_par = sum(p.numel() for p in vit.parameters())
    print("vit: d %d, ff %d, %d heads, %d layers, %.2f M parameters" % (a.d, a.ff, a.heads, a.layers, n_par / 1e6))
    opt = torch.optim.AdamW(vit.parameters(), lr=a.lr, weight_decay=0.05, betas=(0.9, 0.98))
    seqs = Seqs(tokens, llm, dev)
    rng = np.random.default_rng(a.seed)
    pool = mp.get_context("fork").Pool(a.workers)
    log = open(os.path.join(a.out, "loss.csv"), "w")
    log.write("step,seconds,loss,token_accuracy\n")
    t_train = time.time()
    curve = open(os.path.join(a.out, "eval_curve.csv"), "w")
    curve.write("step,seconds,colour,shape,count,position\n")
    for step, (imgs, qa, labs) in enumerate(batches(pool, a.seed, a.steps, a.batch, 2 * a.workers)):
        done = step / a.steps
        if a.time_limit > 0:
            done = max(done, (time.time() - t_train) / a.time_limit)
        lr = a.lr * min(1.0, (step + 1) / a.warmup) * 0.5 * (1 + math.cos(math.pi * min(done, 1.0)))
        for g in opt.param_groups:
            g["lr"] = lr
        variants = ["system" if u < a.system_frac else "plain" for u in rng.uniform(size=len(qa))]
        loss, hit, _ = forward_loss(vit, llm, seqs, imgs, qa, variants, dev, labs)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vit.parameters(), 1.0)
        opt.step()
        stop = done >= 1.0
        if a.eval_every and step > 0 and step % a.eval_every == 0:
            r = evaluate(vit, llm, seqs, 200, dev)
            curve.write("%d,%.1f,%s\n" % (step, time.time() - t_train,
                                          ",".join("%.3f" % r[c]["accuracy"] for c in ("colour", "shape", "count", "position"))))
            curve.flush()
            print("eval at step %d: %s" % (step, {c: r[c]["accuracy"] for c in r}), flush=True)
            vit.export(os.path.join(a.out, "vlm-mmproj-q8_0.gguf"), "q8_0")
        if step % 10 == 0 or step == a.steps - 1 or stop:
            el = time.time() - t_train
            log.write("%d,%.1f,%.5f,%.4f\n" % (step, el, loss.item(), hit.float().mean().item()))
            log.flush()
            if step % 100 == 0 or step == a.steps - 1:
                print("step %5d  %6.1f s  loss %.4f  token acc %.3f  lr %.2e" % (
                    step, el, loss.item(), hit.float().mean().item(), lr), flush=True)
        if stop:
            print("time limit: stopped after step %d of %d" % (step, a.steps), flush=True)
            break
    pool.terminate()
    train_s = time.time() - t_train
    res = evaluate(vit, llm, seqs, a.eval, dev)
    res["train_seconds"] = train_s
    res["steps"], res["batch"], res["seed"], res["lr"] = a.steps, a.batch, a.seed, a.lr
    res["steps_run"] = step + 1
    res["init"] = a.init
    print(json.dumps(res), flush=True)
    json.dump(res, open(os.path.join(a.out, "eval.json"), "w"), indent=1)
    for wt in ("f16", "q8_0"):
        p = os.path.join(a.out, "vlm-mmproj-%s.gguf" % wt)
        vit.export(p, wt)
        print("wrote %s (%d bytes)" % (p, os.path.getsize(p)))
    torch.save(vit.state_dict(), os.path.join(a.out, "vit.pt"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
