#!/usr/bin/env python3
"""Reference vision encoder for llama.cpp-format mmproj files (numpy only).

    clip_ref.py MMPROJ INPUT.f32 OUTPUT.f32 [--size WxH] [--act-quant] [--ggml] [--cls-first] [--dump DIR] [--info]

INPUT:  the normalized image, planar: 3 x S x S float32 (R, G, B planes, row-major),
        S = clip.vision.image_size; qwen2vl_merger: 3 x H x W with --size WxH (whole
        2 x 2 patch cells; default S x S).
OUTPUT: the projector output, n_out x n_out_embd float32, row-major.

Runs the ViT (conv patch embedding, class token, position embeddings, pre-LN,
layers, post-LN) and the projector (mlp, idefics3) in float64 with the weights
dequantized (f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q4_K, q5_K, q6_K), following
the rules of llama.cpp's tools/mtmd (clip.cpp, models/llava.cpp, models/siglip.cpp,
models/qwen2vl.cpp). qwen2vl_merger (Qwen2-VL): the two patch kernels applied to the
image and summed, patches in 2 x 2 groups, the 2-D rope of each head (its first and
third quarters turned by the patch's row, the second and fourth by its column, base
10000), post-LN, each group's four rows joined, mm.0 -> GELU -> mm.2.
The layout and the math are written down in docs/mmproj.md.

Options:
  --act-quant  round every matmul input as llama.cpp (and our CPU backend) do before
               the dot: to f16 for f16 weights, to 8-bit blocks (q8_0, q8_1, q8_K: the
               weight type's vec_dot_type) for quantized ones. The default multiplies
               the exact activations by the dequantized weights.
  --ggml       --act-quant plus the two other roundings of ggml's CPU backend: the
               patch embedding (ggml_conv_2d goes through an f16 im2col, so pixels
               and kernel are rounded to f16) and GELU / quick GELU (a table indexed
               by the input rounded to f16, with an f16 result). Reproduces
               llama.cpp's numbers up to f32 rounding.
  --cls-first  put the class token first (position 0) and drop its output row, as
               HF transformers does. The default follows llama.cpp at 0c1e570, whose
               llava graph appends the class token after the patches (position
               n_patches) and then keeps rows 1..n_patches: patch 0 is dropped and the
               class token's row is kept (llama.cpp issue 25814).
  --dump DIR   also write every stage (patch_embd, embd_in, pre_ln, layer_N, post_ln,
               proj_in, out) to DIR/<stage>.f32, float32, rows of the stage's width.
  --info       print the hyperparameters read from the file to stderr.
"""

import os
import struct
import sys

import numpy as np

# ---- GGUF reader --------------------------------------------------------------
# Spec: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md

GGUF_SCALAR = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1",
               10: "<u8", 11: "<i8", 12: "<f8"}
GGUF_STRING, GGUF_ARRAY, GGUF_BOOL = 8, 9, 7

# ggml type number -> (name, elements per block, bytes per block)
GGML_TYPES = {
    0: ("f32", 1, 4), 1: ("f16", 1, 2), 2: ("q4_0", 32, 18), 3: ("q4_1", 32, 20),
    6: ("q5_0", 32, 22), 7: ("q5_1", 32, 24), 8: ("q8_0", 32, 34), 12: ("q4_K", 256, 144),
    13: ("q5_K", 256, 176), 14: ("q6_K", 256, 210), 30: ("bf16", 1, 2),
}


class FormatError(Exception):
    pass


class Gguf:
    def __init__(self, path):
        with open(path, "rb") as f:
            self.buf = f.read()
        self.pos = 0
        if len(self.buf) < 24 or self.buf[:4] != b"GGUF":
            raise FormatError(f"{path}: not a GGUF file")
        self.pos = 4
        version = self._u32()
        if version not in (2, 3):
            raise FormatError(f"{path}: GGUF version {version} not supported")
        n_tensors, n_kv = self._u64(), self._u64()
        self.kv = {}
        for _ in range(n_kv):
            key = self._str()
            vtype = self._u32()
            self.kv[key] = self._value(vtype)
        infos = []
        for _ in range(n_tensors):
            name = self._str()
            n_dims = self._u32()
            if n_dims > 4:
                raise FormatError(f"tensor {name}: {n_dims} dims")
            ne = [self._u64() for _ in range(n_dims)]
            ttype = self._u32()
            offset = self._u64()
            infos.append((name, ne, ttype, offset))
        align = int(self.kv.get("general.alignment", 32))
        data_start = (self.pos + align - 1) // align * align
        self.tensors = {}
        for name, ne, ttype, offset in infos:
            if ttype not in GGML_TYPES:
                raise FormatError(f"tensor {name}: ggml type {ttype} not supported by the reference")
            _, blck, tsize = GGML_TYPES[ttype]
            n = int(np.prod(ne)) if ne else 1
            if ne and ne[0] % blck:
                raise FormatError(f"tensor {name}: row of {ne[0]} not a multiple of block {blck}")
            nbytes = n // blck * tsize
            start = data_start + offset
            if start + nbytes > len(self.buf):
                raise FormatError(f"tensor {name}: data past the end of the file")
            self.tensors[name] = (ne, ttype, start, nbytes)

    def _need(self, n):
        if self.pos + n > len(self.buf):
            raise FormatError("truncated GGUF header")

    def _u32(self):
        self._need(4)
        v = struct.unpack_from("<I", self.buf, self.pos)[0]
        self.pos += 4
        return v

    def _u64(self):
        self._need(8)
        v = struct.unpack_from("<Q", self.buf, self.pos)[0]
        self.pos += 8
        return v

    def _str(self):
        n = self._u64()
        self._need(n)
        s = self.buf[self.pos:self.pos + n].decode("utf-8", errors="replace")
        self.pos += n
        return s

    def _value(self, vtype):
        if vtype == GGUF_STRING:
            return self._str()
        if vtype == GGUF_ARRAY:
            etype, n = self._u32(), self._u64()
            return [self._value(etype) for _ in range(n)]
        if vtype not in GGUF_SCALAR:
            raise FormatError(f"unknown GGUF value type {vtype}")
        dt = np.dtype(GGUF_SCALAR[vtype])
        self._need(dt.itemsize)
        v = np.frombuffer(self.buf, dt, 1, self.pos)[0].item()
        self.pos += dt.itemsize
        return bool(v) if vtype == GGUF_BOOL else v

    def has(self, name):
        return name in self.tensors

    def type_name(self, name):
        return GGML_TYPES[self.tensors[name][1]][0]

    def tensor(self, name):
        """Tensor as float64, numpy shape = reversed ggml ne (ne[0] last)."""
        if name not in self.tensors:
            raise FormatError(f"missing tensor {name}")
        ne, ttype, start, nbytes = self.tensors[name]
        raw = np.frombuffer(self.buf, np.uint8, nbytes, start)
        n = int(np.prod(ne)) if ne else 1
        return dequantize(ttype, raw, n).reshape(tuple(reversed(ne)) if ne else ())


# ---- dequantization (ggml block formats) -----------------------------------------

def _f16(raw, off, nb, bsize):
    """Field of one f16 per block at byte offset off."""
    b = raw.reshape(nb, bsize)[:, off:off + 2].copy()
    return b.view("<f2").astype(np.float64).reshape(nb, 1)


def _bytes(raw, off, n, nb, bsize):
    return raw.reshape(nb, bsize)[:, off:off + n]


def _nibbles32(qs):
    """16 bytes per block -> 32 4-bit values: low nibbles are elements 0..15, high 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.int32)


def _qh_bits(qh_bytes):
    """4 bytes (a little-endian u32) per block -> the 32 bits, bit j for element j."""
    u = qh_bytes.copy().view("<u4").reshape(-1, 1).astype(np.uint64)
    return ((u >> np.arange(32, dtype=np.uint64)) & 1).astype(np.int32)


def _scale_min_k4(sc):
    """12 bytes of packed 6-bit scales and mins per super-block -> (8 scales, 8 mins)."""
    sc = sc.astype(np.int32)
    d = np.empty((sc.shape[0], 8), np.int32)
    m = np.empty((sc.shape[0], 8), np.int32)
    for j in range(8):
        if j < 4:
            d[:, j] = sc[:, j] & 63
            m[:, j] = sc[:, j + 4] & 63
        else:
            d[:, j] = (sc[:, j + 4] & 0x0F) | ((sc[:, j - 4] >> 6) << 4)
            m[:, j] = (sc[:, j + 4] >> 4) | ((sc[:, j] >> 6) << 4)
    return d, m


def dequantize(ttype, raw, n):
    name, blck, bsize = GGML_TYPES[ttype]
    nb = n // blck
    if name == "f32":
        return raw.view("<f4").astype(np.float64)
    if name == "f16":
        return raw.view("<f2").astype(np.float64)
    if name == "bf16":
        return (raw.view("<u2").astype(np.uint32) << 16).view("<f4").astype(np.float64)
    if name == "q8_0":
        d = _f16(raw, 0, nb, bsize)
        q = _bytes(raw, 2, 32, nb, bsize).view(np.int8).astype(np.float64)
        return (d * q).reshape(-1)
    if name == "q4_0":
        d = _f16(raw, 0, nb, bsize)
        q = _nibbles32(_bytes(raw, 2, 16, nb, bsize)) - 8
        return (d * q).reshape(-1)
    if name == "q4_1":
        d, m = _f16(raw, 0, nb, bsize), _f16(raw, 2, nb, bsize)
        q = _nibbles32(_bytes(raw, 4, 16, nb, bsize))
        return (d * q + m).reshape(-1)
    if name == "q5_0":
        d = _f16(raw, 0, nb, bsize)
        q = _nibbles32(_bytes(raw, 6, 16, nb, bsize)) | (_qh_bits(_bytes(raw, 2, 4, nb, bsize)) << 4)
        return (d * (q - 16)).reshape(-1)
    if name == "q5_1":
        d, m = _f16(raw, 0, nb, bsize), _f16(raw, 2, nb, bsize)
        q = _nibbles32(_bytes(raw, 8, 16, nb, bsize)) | (_qh_bits(_bytes(raw, 4, 4, nb, bsize)) << 4)
        return (d * q + m).reshape(-1)
    if name in ("q4_K", "q5_K"):
        # d, dmin (f16), 12 bytes of scales/mins, [q5_K: 32 bytes of high bits], 128 bytes of nibbles.
        # Each 64 elements take 32 bytes: low nibbles for the first 32, high for the next 32.
        d, dmin = _f16(raw, 0, nb, bsize), _f16(raw, 2, nb, bsize)
        sc, mn = _scale_min_k4(_bytes(raw, 4, 12, nb, bsize))
        qs_off = 16 if name == "q4_K" else 48
        qs = _bytes(raw, qs_off, 128, nb, bsize).astype(np.int32).reshape(nb, 4, 32)
        q = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(nb, 8, 32)  # sub-block j = 2*chunk + half
        if name == "q5_K":
            qh = _bytes(raw, 16, 32, nb, bsize).astype(np.int32)  # bit j of qh[l] -> element 32*j + l
            hi = np.stack([(qh >> j) & 1 for j in range(8)], axis=1)  # (nb, 8, 32)
            q = q + (hi << 4)
        y = d[:, :, None] * sc[:, :, None] * q - dmin[:, :, None] * mn[:, :, None]
        return y.reshape(-1)
    if name == "q6_K":
        ql = _bytes(raw, 0, 128, nb, bsize).astype(np.int32)
        qh = _bytes(raw, 128, 64, nb, bsize).astype(np.int32)
        scales = _bytes(raw, 192, 16, nb, bsize).view(np.int8).astype(np.float64)
        d = _f16(raw, 208, nb, bsize)
        y = np.empty((nb, 256), np.float64)
        for half in range(2):  # 128 elements each: 64 bytes of ql, 32 of qh, 8 scales
            l_ = ql[:, 64 * half:64 * half + 64]
            h_ = qh[:, 32 * half:32 * half + 32]
            s_ = scales[:, 8 * half:8 * half + 8]
            quarters = [
                (l_[:, :32] & 0x0F) | (((h_ >> 0) & 3) << 4),
                (l_[:, 32:] & 0x0F) | (((h_ >> 2) & 3) << 4),
                (l_[:, :32] >> 4) | (((h_ >> 4) & 3) << 4),
                (l_[:, 32:] >> 4) | (((h_ >> 6) & 3) << 4),
            ]
            for k, qv in enumerate(quarters):
                # element l of quarter k uses scale 2k + l/16
                sc = np.repeat(s_[:, 2 * k:2 * k + 2], 16, axis=1)
                y[:, 128 * half + 32 * k:128 * half + 32 * k + 32] = d * sc * (qv - 32)
        return y.reshape(-1)
    raise FormatError(f"type {name} not supported")


# ---- llama.cpp's matmul input rounding -----------------------------------------------
# ggml (and our CPU backend) multiply a weight of type W by first converting the
# activation row to W's vec_dot_type, then taking an integer (or f16) dot. These
# return the activation values that dot effectively sees.

VEC_DOT_TYPE = {"f32": "f32", "f16": "f16", "bf16": "bf16", "q4_0": "q8_0", "q5_0": "q8_0", "q8_0": "q8_0",
                "q4_1": "q8_1", "q5_1": "q8_1", "q4_K": "q8_K", "q5_K": "q8_K", "q6_K": "q8_K"}


def _round_bf16(x):
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16  # nearest even
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


def act_quant(x, wtype):
    """x (..., K) -> the values of x after conversion to wtype's vec_dot_type."""
    vt = VEC_DOT_TYPE[wtype]
    if vt == "f32":
        return x
    if vt == "f16":
        return x.astype(np.float32).astype(np.float16).astype(np.float64)
    if vt == "bf16":
        return _round_bf16(x)
    shape = x.shape
    x32 = x.astype(np.float32)
    if vt in ("q8_0", "q8_1"):
        # x86 quantize_row_q8_0/q8_1: d = amax/127 (stored f16), q = rint(x * 127/amax)
        b = x32.reshape(-1, 32)
        amax = np.abs(b).max(axis=1, keepdims=True)
        with np.errstate(divide="ignore"):
            iscale = np.where(amax > 0, np.float32(127.0) / amax, np.float32(0.0)).astype(np.float32)
        q = np.clip(np.rint(b * iscale), -128, 127)
        d = (amax / np.float32(127.0)).astype(np.float32).astype(np.float16).astype(np.float64)
        return (q * d).reshape(shape)
    # q8_K (quantize_row_q8_K_ref): scale from the signed extreme, d = 1/iscale kept in f32
    b = x32.reshape(-1, 256)
    idx = np.abs(b).argmax(axis=1)
    mx = b[np.arange(b.shape[0]), idx].reshape(-1, 1)
    with np.errstate(divide="ignore"):
        iscale = np.where(mx != 0, np.float32(-127.0) / mx, np.float32(0.0)).astype(np.float32)
        d = np.where(mx != 0, np.float32(1.0) / iscale, np.float32(0.0)).astype(np.float32)
    q = np.minimum(127, np.rint(b * iscale))
    return (q * d.astype(np.float64)).reshape(shape)


# ---- activations -------------------------------------------------------------------

def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(0.7978845608028654 * x * (1.0 + 0.044715 * x * x)))


def gelu_quick(x):
    return x / (1.0 + np.exp(-1.702 * x))


def silu(x):
    return x / (1.0 + np.exp(-x))


def ggml_table(fn, x, clamp):
    """ggml CPU: y = f16(fn_f32(f16(x))), with GELU's +-10 shortcut."""
    xh = x.astype(np.float32).astype(np.float16).astype(np.float32)
    with np.errstate(over="ignore"):
        y = fn(xh).astype(np.float32).astype(np.float16).astype(np.float64)
    if clamp:
        x32 = x.astype(np.float32)
        y = np.where(x32 <= -10.0, 0.0, np.where(x32 >= 10.0, x32.astype(np.float64), y))
    return y


# ---- the encoder ------------------------------------------------------------------------

def layer_norm(x, w, b, eps):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    y = (x - mu) / np.sqrt(var + eps)
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return y


class Encoder:
    def __init__(self, path, ggml=False, quant_act=False, cls_first=False):
        g = self.g = Gguf(path)
        kv = g.kv

        def need(key):
            if key not in kv:
                raise FormatError(f"missing key {key}")
            return kv[key]

        self.proj = kv.get("clip.projector_type", kv.get("clip.vision.projector_type", ""))
        if self.proj not in ("mlp", "idefics3", "qwen2vl_merger"):
            raise FormatError(f"projector type '{self.proj}' not supported (mlp, idefics3, qwen2vl_merger)")
        self.qwen = self.proj == "qwen2vl_merger"
        self.image_size = int(need("clip.vision.image_size"))
        self.patch_size = int(need("clip.vision.patch_size"))
        self.n_embd = int(need("clip.vision.embedding_length"))
        if self.qwen:  # the key holds the LLM's width (or 0): fc1's shape, under either name
            up, down = g.tensors.get("v.blk.0.ffn_up.weight"), g.tensors.get("v.blk.0.ffn_down.weight")
            if up is None or down is None:
                raise FormatError("missing tensor v.blk.0.ffn_up.weight / ffn_down.weight")
            fc1 = down if down[0][0] == int(need("clip.vision.embedding_length")) else up
            self.n_ff = int(fc1[0][1])
        else:
            self.n_ff = int(need("clip.vision.feed_forward_length"))
        self.n_head = int(need("clip.vision.attention.head_count"))
        self.n_layer = int(need("clip.vision.block_count"))
        self.eps = float(need("clip.vision.attention.layer_norm_epsilon"))
        if kv.get("clip.use_gelu", False) and kv.get("clip.use_silu", False):
            raise FormatError("both clip.use_gelu and clip.use_silu are set")
        if kv.get("clip.use_gelu", False):
            self.act_name, fn, clamp = "gelu", gelu_tanh, True
        elif kv.get("clip.use_silu", False):
            self.act_name, fn, clamp = "silu", silu, None
        else:
            self.act_name, fn, clamp = "gelu_quick", gelu_quick, False
        # ggml evaluates SiLU directly; GELU and quick GELU through f16 tables.
        self.act = (lambda x: ggml_table(fn, x, clamp)) if ggml and clamp is not None else fn
        self.gelu = (lambda x: ggml_table(gelu_tanh, x, True)) if ggml else gelu_tanh
        self.ggml = ggml
        self.aq = act_quant if (ggml or quant_act) else (lambda x, wtype: x)
        self.n_merge = int(kv.get("clip.vision.projector.scale_factor", 1)) if self.proj == "idefics3" else 1
        self.cls_first = cls_first
        if self.image_size <= 0 or self.patch_size <= 0 or self.image_size % self.patch_size:
            raise FormatError(f"image_size {self.image_size} is not a multiple of patch_size {self.patch_size}")
        if self.n_head <= 0 or self.n_embd % self.n_head:
            raise FormatError(f"n_embd {self.n_embd} is not a multiple of n_head {self.n_head}")
        self.grid = self.image_size // self.patch_size
        if self.proj == "idefics3" and (self.n_merge < 2 or self.grid % self.n_merge):
            raise FormatError(f"scale_factor {self.n_merge} must be >= 2 and divide the grid side {self.grid}")
        # mlp (llava graph): the second-to-last layer's output, i.e. n_layer - 1 layers.
        self.n_layer_run = self.n_layer - 1 if self.proj == "mlp" else self.n_layer
        if self.qwen and (self.image_size % (2 * self.patch_size) or (self.n_embd // self.n_head) % 4):
            raise FormatError("qwen2vl_merger: image_size must be whole 2 x 2 patch cells, the head size a multiple of 4")

        d, ps = self.n_embd, self.patch_size
        t = self._t
        self.patch_w = t("v.patch_embd.weight", (d, 3, ps, ps))
        self.patch_w1 = t("v.patch_embd.weight.1", (d, 3, ps, ps)) if self.qwen else None
        self.patch_b = t("v.patch_embd.bias", (d,), optional=True)
        self.cls = t("v.class_embd", (d,), optional=True)
        n_pos = self.grid * self.grid + (1 if self.cls is not None else 0)
        self.pos = None if self.qwen else t("v.position_embd.weight", (n_pos, d))
        self.pre_ln = (t("v.pre_ln.weight", (d,), optional=True), t("v.pre_ln.bias", (d,), optional=True))
        self.post_ln = (t("v.post_ln.weight", (d,), optional=True), t("v.post_ln.bias", (d,), optional=True))
        self.layers = []
        for il in range(self.n_layer_run):
            p = f"v.blk.{il}."
            L = {
                "ln1": (t(p + "ln1.weight", (d,)), t(p + "ln1.bias", (d,))),
                "ln2": (t(p + "ln2.weight", (d,)), t(p + "ln2.bias", (d,))),
            }
            for k in ("q", "k", "v", "out"):
                L[k] = (t(p + f"attn_{k}.weight", (d, d)), t(p + f"attn_{k}.bias", (d,), optional=True),
                        g.type_name(p + f"attn_{k}.weight"))
            # llama.cpp's check for files from old converters, which named fc1
            # ffn_down and fc2 ffn_up: if ffn_down takes n_embd inputs, swap back.
            up_w, down_w = g.tensor(p + "ffn_up.weight"), g.tensor(p + "ffn_down.weight")
            up_b, down_b = t(p + "ffn_up.bias", None, optional=True), t(p + "ffn_down.bias", None, optional=True)
            up_t, down_t = g.type_name(p + "ffn_up.weight"), g.type_name(p + "ffn_down.weight")
            if down_w.ndim == 2 and down_w.shape[1] == d:
                up_w, down_w, up_b, down_b, up_t, down_t = down_w, up_w, down_b, up_b, down_t, up_t
            self._shape(p + "ffn_up", up_w, (self.n_ff, d))
            self._shape(p + "ffn_down", down_w, (d, self.n_ff))
            if up_b is not None:
                self._shape(p + "ffn_up.bias", up_b, (self.n_ff,))
            if down_b is not None:
                self._shape(p + "ffn_down.bias", down_b, (d,))
            L["up"], L["down"] = (up_w, up_b, up_t), (down_w, down_b, down_t)
            self.layers.append(L)
        if self.proj in ("mlp", "qwen2vl_merger"):
            w0 = g.tensor("mm.0.weight")
            k_in = 4 * d if self.qwen else d
            if w0.ndim != 2 or w0.shape[1] != k_in:
                raise FormatError(f"mm.0.weight: shape {list(reversed(w0.shape))}, want [{k_in}, n]")
            self.mm0 = (w0, t("mm.0.bias", (w0.shape[0],)), g.type_name("mm.0.weight"))
            w2 = g.tensor("mm.2.weight")
            if w2.ndim != 2 or w2.shape[1] != w0.shape[0]:
                raise FormatError(f"mm.2.weight: shape {list(reversed(w2.shape))}, want [{w0.shape[0]}, n]")
            self.mm2 = (w2, t("mm.2.bias", (w2.shape[0],)), g.type_name("mm.2.weight"))
            self.n_out_embd = w2.shape[0]
            self.n_out = self.grid * self.grid // (4 if self.qwen else 1)
        else:
            fc = g.tensor("mm.model.fc.weight")
            k = d * self.n_merge * self.n_merge
            if fc.ndim != 2 or fc.shape[1] != k:
                raise FormatError(f"mm.model.fc.weight: shape {list(reversed(fc.shape))}, want [{k}, n]")
            self.fc = (fc, None, g.type_name("mm.model.fc.weight"))
            self.n_out_embd = fc.shape[0]
            self.n_out = (self.grid // self.n_merge) ** 2

    def _shape(self, name, a, shape):
        if a.shape != shape:
            raise FormatError(f"{name}: shape {list(reversed(a.shape))} (ggml ne), want {list(reversed(shape))}")

    def _t(self, name, shape, optional=False):
        if not self.g.has(name):
            if optional:
                return None
            raise FormatError(f"missing tensor {name}")
        a = self.g.tensor(name)
        if shape is not None:
            self._shape(name, a, shape)
        return a

    def _lin(self, w, b, wtype, v):
        y = self.aq(v, wtype) @ w.T
        return y + b if b is not None else y

    def _rope_vision(self, x, rows, cols):
        """x (n_pos, H, dh): pair (k, k + dh/2) turns by the row for k < dh/4, by the column after,
        at frequency 10000^(-2 j / (dh/2)), j = k or k - dh/4 (ggml's mode 24). ggml builds the
        angles by repeated f32 multiplication, as --ggml does."""
        dh = x.shape[2]
        half, quarter = dh // 2, dh // 4
        if self.ggml:
            scale = np.float32(np.power(np.float32(10000.0), np.float32(-2.0) / np.float32(half)))
            th = np.empty((x.shape[0], half), np.float32)
            for part, p in ((0, rows), (1, cols)):
                cur = p.astype(np.float32)
                for j in range(quarter):
                    th[:, part * quarter + j] = cur
                    cur = (cur * scale).astype(np.float32)
            c, s = np.cos(th).astype(np.float64), np.sin(th).astype(np.float64)
        else:
            j = np.arange(quarter, dtype=np.float64)
            f = 10000.0 ** (-2.0 * j / half)
            th = np.concatenate([rows[:, None] * f[None, :], cols[:, None] * f[None, :]], axis=1)
            c, s = np.cos(th), np.sin(th)
        c, s = c[:, None, :], s[:, None, :]
        x0, x1 = x[:, :, :half], x[:, :, half:]
        return np.concatenate([x0 * c - x1 * s, x0 * s + x1 * c], axis=2)

    def encode(self, img, dump=None):
        """img: (3, S, S) float64 planar (qwen2vl_merger: (3, H, W)). Returns (n_out, n_out_embd) float64."""
        def stage(name, x):
            if dump:
                x.astype(np.float32).tofile(os.path.join(dump, name + ".f32"))
            return x

        d, ps, G = self.n_embd, self.patch_size, self.grid
        if self.qwen:
            return self._encode_qwen(img, stage)
        # Conv2d with stride = kernel: every patch is a dot with the flattened
        # (c, ky, kx) kernel. Patches row-major: index py * G + px.
        patches = img.reshape(3, G, ps, G, ps).transpose(1, 3, 0, 2, 4).reshape(G * G, 3 * ps * ps)
        kernel = self.patch_w.reshape(d, -1)
        if self.ggml:
            patches = patches.astype(np.float16).astype(np.float64)
            kernel = kernel.astype(np.float16).astype(np.float64)
        x = patches @ kernel.T
        if self.patch_b is not None:
            x = x + self.patch_b
        stage("patch_embd", x)
        n_patches = G * G
        if self.cls is not None:
            if self.cls_first:
                x = np.concatenate([self.cls[None, :], x], axis=0)
            else:  # llama.cpp: appended after the patches
                x = np.concatenate([x, self.cls[None, :]], axis=0)
        x = x + self.pos
        stage("embd_in", x)
        if self.pre_ln[0] is not None:
            x = stage("pre_ln", layer_norm(x, self.pre_ln[0], self.pre_ln[1], self.eps))
        x = self._layers(x, stage)
        return self._project(x, n_patches, stage)

    def _layers(self, x, stage, rows=None, cols=None):
        d, n_pos, H = self.n_embd, x.shape[0], self.n_head
        dh = d // H
        for il, L in enumerate(self.layers):
            h = layer_norm(x, L["ln1"][0], L["ln1"][1], self.eps)

            lin = self._lin
            q = lin(*L["q"], h).reshape(n_pos, H, dh)
            k = lin(*L["k"], h).reshape(n_pos, H, dh)
            if rows is not None:
                q, k = self._rope_vision(q, rows, cols), self._rope_vision(k, rows, cols)
            q, k = q.transpose(1, 0, 2), k.transpose(1, 0, 2)
            v = lin(*L["v"], h).reshape(n_pos, H, dh).transpose(1, 0, 2)
            s = q @ k.transpose(0, 2, 1) / np.sqrt(dh)
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s = s / s.sum(axis=-1, keepdims=True)
            a = (s @ v).transpose(1, 0, 2).reshape(n_pos, d)
            x = x + lin(*L["out"], a)
            h = layer_norm(x, L["ln2"][0], L["ln2"][1], self.eps)
            h = self.act(lin(*L["up"], h))
            x = x + lin(*L["down"], h)
            stage(f"layer_{il}", x)
        if self.post_ln[0] is not None:
            x = stage("post_ln", layer_norm(x, self.post_ln[0], self.post_ln[1], self.eps))
        return x

    def _encode_qwen(self, img, stage):
        d, ps = self.n_embd, self.patch_size
        _, H, W = img.shape
        gh, gw = H // ps, W // ps
        # patches in 2 x 2 groups: index ((yb * gw/2 + xb) * 2 + dy) * 2 + dx
        patches = img.reshape(3, gh // 2, 2, ps, gw // 2, 2, ps).transpose(1, 4, 2, 5, 0, 3, 6)
        patches = patches.reshape(gh * gw, 3 * ps * ps)
        yb, xb, dy, dx = np.meshgrid(np.arange(gh // 2), np.arange(gw // 2), np.arange(2), np.arange(2), indexing="ij")
        rows, cols = (2 * yb + dy).reshape(-1), (2 * xb + dx).reshape(-1)
        k0, k1 = self.patch_w.reshape(d, -1), self.patch_w1.reshape(d, -1)
        if self.ggml:  # each conv through an f16 im2col, the two results summed in f32
            ph = patches.astype(np.float16).astype(np.float64)
            x = ph @ k0.astype(np.float16).astype(np.float64).T + ph @ k1.astype(np.float16).astype(np.float64).T
        else:
            x = patches @ (k0 + k1).T
        stage("patch_embd", x)
        x = self._layers(x, stage, rows.astype(np.float64), cols.astype(np.float64))
        x = x.reshape(-1, 4 * d)  # each group's four consecutive rows joined
        stage("proj_in", x)
        return stage("out", self._lin(*self.mm2, self.gelu(self._lin(*self.mm0, x))))

    def _project(self, x, n_patches, stage):
        d, G = self.n_embd, self.grid
        if self.proj == "mlp":
            if self.cls is not None:
                # llama.cpp keeps rows 1..n_patches (CLS-last order: patches 1.. and the class token)
                x = x[1:n_patches + 1]
            stage("proj_in", x)
            y = self._lin(*self.mm2, self.gelu(self._lin(*self.mm0, x)))
        else:
            # Pixel shuffle (idefics3 / llama.cpp build_patch_merge_permute):
            # out[(yo, xo)][(sy, sx, e)] = in[(yo*s + sy, xo*s + sx)][e]
            s = self.n_merge
            x = x.reshape(G // s, s, G // s, s, d).transpose(0, 2, 1, 3, 4).reshape((G // s) ** 2, s * s * d)
            stage("proj_in", x)
            y = self._lin(*self.fc, x)
        return stage("out", y)


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--")]
    flags = [a for a in argv[1:] if a.startswith("--")]
    dump = None
    if "--dump" in argv:
        i = argv.index("--dump")
        if i + 1 >= len(argv):
            print("clip_ref.py: --dump needs a directory", file=sys.stderr)
            return 2
        dump = argv[i + 1]
        args.remove(dump)
        flags.remove("--dump")
    size = None
    if "--size" in argv:
        i = argv.index("--size")
        try:
            size = tuple(int(v) for v in argv[i + 1].lower().split("x"))
            assert len(size) == 2 and size[0] > 0 and size[1] > 0
        except (IndexError, ValueError, AssertionError):
            print("clip_ref.py: --size needs WxH", file=sys.stderr)
            return 2
        args.remove(argv[i + 1])
        flags.remove("--size")
    unknown = [f for f in flags if f not in ("--ggml", "--act-quant", "--cls-first", "--info", "--help")]
    if "--help" in flags or len(args) != 3 or unknown:
        print(__doc__, file=sys.stderr)
        return 0 if "--help" in flags else 2
    mmproj, inp, out = args
    try:
        enc = Encoder(mmproj, ggml="--ggml" in flags, quant_act="--act-quant" in flags,
                      cls_first="--cls-first" in flags)
    except (FormatError, OSError) as e:
        print(f"clip_ref.py: {mmproj}: {e}", file=sys.stderr)
        return 1
    S = enc.image_size
    W, H = size if size else (S, S)
    if (W, H) != (S, S) and not enc.qwen:
        print(f"clip_ref.py: --size: a {enc.proj} encoder takes {S}x{S} only", file=sys.stderr)
        return 1
    cell = 2 * enc.patch_size
    if enc.qwen and (W % cell or H % cell):
        print(f"clip_ref.py: --size {W}x{H} is not whole {cell}-pixel cells", file=sys.stderr)
        return 1
    img = np.fromfile(inp, dtype="<f4")
    if img.size != 3 * W * H:
        print(f"clip_ref.py: {inp}: {img.size} floats, want 3 x {H} x {W} = {3 * W * H}", file=sys.stderr)
        return 1
    if "--info" in flags:
        print(f"clip_ref.py: {enc.proj}, image {S}, patch {enc.patch_size}, n_embd {enc.n_embd}, n_ff {enc.n_ff}, "
              f"n_head {enc.n_head}, layers {enc.n_layer_run}/{enc.n_layer}, act {enc.act_name}, "
              f"class {enc.cls is not None}, n_out {enc.n_out} x {enc.n_out_embd}", file=sys.stderr)
    if dump:
        os.makedirs(dump, exist_ok=True)
    y = enc.encode(img.astype(np.float64).reshape(3, H, W), dump)
    y.astype("<f4").tofile(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
