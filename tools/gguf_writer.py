"""A small GGUF writer (numpy only) for the Python tools: metadata of the GGUF scalar,
string and array types, tensors in f32, f16 or q8_0, 32-byte alignment, written to a
temporary file and renamed into place. Spec: ggml's docs/gguf.md.

    w = GgufWriter()
    w.add_str("general.architecture", "clip"); w.add_u32(...); w.add_f32_array(...)
    w.add_tensor("v.blk.0.attn_q.weight", array, "q8_0")   # array in numpy (row-major) shape
    w.write(path)

A tensor's ne is its numpy shape reversed (ne[0] the contiguous dimension), so a
PyTorch Linear(in, out) weight, shape (out, in), is stored as ne = [in, out].
"""
import os
import struct

import numpy as np

ALIGN = 32
T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR, T_U64, T_I64, T_F64 = range(13)
GGML = {"f32": (0, 1, 4), "f16": (1, 1, 2), "q8_0": (8, 32, 34)}  # name -> (type id, block, bytes)


def gstr(s):
    b = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def quantize_q8_0(a):
    """ggml's reference q8_0 (quantize_row_q8_0_ref): per 32 values d = amax / 127 (stored
    f16), q = round(x / d) half away from zero, computed in float32 as x * (1 / d)."""
    x = np.ascontiguousarray(a, dtype=np.float32).reshape(-1, 32)
    amax = np.abs(x).max(axis=1)
    d = amax / np.float32(127.0)
    inv = np.where(d != 0, np.float32(1.0) / np.where(d != 0, d, np.float32(1.0)), np.float32(0.0)).astype(np.float32)
    v = x * inv[:, None]
    q = (np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))).astype(np.int8)
    out = np.empty((x.shape[0], 34), dtype=np.uint8)
    out[:, :2] = d.astype("<f2").view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    return out.tobytes()


class GgufWriter:
    def __init__(self):
        self.kvs = []
        self.tensors = []  # (name, ne, type id, bytes)

    def _kv(self, key, vtype, payload):
        self.kvs.append(gstr(key) + struct.pack("<I", vtype) + payload)

    def add_str(self, key, s):
        self._kv(key, T_STR, gstr(s))

    def add_u32(self, key, v):
        self._kv(key, T_U32, struct.pack("<I", v))

    def add_i32(self, key, v):
        self._kv(key, T_I32, struct.pack("<i", v))

    def add_f32(self, key, v):
        self._kv(key, T_F32, struct.pack("<f", v))

    def add_bool(self, key, v):
        self._kv(key, T_BOOL, struct.pack("<B", 1 if v else 0))

    def add_str_array(self, key, strs):
        self._kv(key, T_ARR, struct.pack("<IQ", T_STR, len(strs)) + b"".join(gstr(s) for s in strs))

    def add_i32_array(self, key, xs):
        self._kv(key, T_ARR, struct.pack("<IQ", T_I32, len(xs)) + np.asarray(xs, dtype="<i4").tobytes())

    def add_f32_array(self, key, xs):
        self._kv(key, T_ARR, struct.pack("<IQ", T_F32, len(xs)) + np.asarray(xs, dtype="<f4").tobytes())

    def add_tensor(self, name, a, ttype="f32"):
        a = np.asarray(a)
        tid, block, _ = GGML[ttype]
        if a.shape[-1] % block:
            raise ValueError("%s: rows of %d values are not whole %s blocks" % (name, a.shape[-1], ttype))
        if ttype == "f32":
            data = a.astype("<f4").tobytes()
        elif ttype == "f16":
            data = a.astype("<f2").tobytes()
        else:
            data = quantize_q8_0(a)
        self.tensors.append((name, list(reversed(a.shape)), tid, data))

    def write(self, path):
        infos, off = [], 0
        for name, ne, tid, data in self.tensors:
            infos.append(gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", x) for x in ne) +
                         struct.pack("<IQ", tid, off))
            off += len(data) + (-len(data)) % ALIGN
        head = b"GGUF" + struct.pack("<IQQ", 3, len(self.tensors), len(self.kvs)) + b"".join(self.kvs)
        head += b"".join(infos)
        head += b"\0" * ((-len(head)) % ALIGN)
        tmp = path + ".partial"
        with open(tmp, "wb") as f:
            f.write(head)
            for _, _, _, data in self.tensors:
                f.write(data + b"\0" * ((-len(data)) % ALIGN))
        os.replace(tmp, path)
