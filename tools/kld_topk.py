#!/usr/bin/env python3
"""Reduce a llama.cpp logits file (llama-perplexity --kl-divergence-base) to
what tests/golden/test_perplexity.c needs, small enough to store in tests/.

    tools/kld_topk.py BASE.kld OUT.topk [--k 16] [--other OTHER.kld]

llama.cpp's file: "_logits_", int32 n_ctx, n_vocab, n_chunk, the n_ctx x n_chunk
token ids, then for every scored position (the second half of each chunk but
its last token) one row of 2 * ((n_vocab + 1) / 2) + 4 uint16: float scale,
float min, then log p(i) = scale * q[i] + min for every token i.

Written (little-endian): "NMTOPK01", int32 n_pos, k, n_vocab, has_other; then
per scored position: int32 the next token, float its log-prob, k x int32 the
ids of the k likeliest tokens (most likely first), k x float their
log-probs; with --other (a second llama.cpp run on the same text) also
k x float the other run's log-probs of the same ids and int32 its top token.
That is enough for top-1 agreement, a lower bound of the KL divergence (the
k tokens plus one bin for the rest: merging outcomes never raises KL) and the
largest log-prob difference among the k tokens.
"""
import argparse
import struct
import sys

import numpy as np


def rows(path):
    with open(path, "rb") as f:
        if f.read(8) != b"_logits_":
            sys.exit(f"{path}: not a llama.cpp logits file")
        n_ctx, n_vocab, n_chunk = struct.unpack("<3i", f.read(12))
        toks = np.frombuffer(f.read(4 * n_ctx * n_chunk), dtype="<i4")
        nv = 2 * ((n_vocab + 1) // 2) + 4
        for ch in range(n_chunk):
            for p in range(n_ctx // 2, n_ctx - 1):
                b = f.read(2 * nv)
                if len(b) != 2 * nv:
                    sys.exit(f"{path}: truncated")
                scale, mn = struct.unpack("<2f", b[:8])
                q = np.frombuffer(b[8:8 + 2 * n_vocab], dtype="<u2")
                # the log-probs in float32, as llama.cpp and our reader compute them
                yield n_vocab, int(toks[ch * n_ctx + p + 1]), np.float32(scale) * q.astype(np.float32) + np.float32(mn)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("out")
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--other")
    a = ap.parse_args()
    recs = []
    other = rows(a.other) if a.other else None
    n_vocab = 0
    for n_vocab, tok, lp in rows(a.base):
        # most likely first; among equal log-probs the lower id first (a stable sort)
        top = np.argsort(-lp, kind="stable")[:a.k]
        rec = struct.pack("<if", tok, lp[tok]) + top.astype("<i4").tobytes() + lp[top].astype("<f4").tobytes()
        if other:
            nv2, tok2, lp2 = next(other)
            if nv2 != n_vocab or tok2 != tok:
                sys.exit("the two files are not runs over the same tokens")
            rec += lp2[top].astype("<f4").tobytes() + struct.pack("<i", int(np.argmax(lp2)))
        recs.append(rec)
    with open(a.out, "wb") as f:
        f.write(b"NMTOPK01" + struct.pack("<4i", len(recs), a.k, n_vocab, 1 if other else 0))
        for r in recs:
            f.write(r)
    print(f"{a.out}: {len(recs)} positions, top {a.k}{' + other run' if other else ''}")


if __name__ == "__main__":
    main()
