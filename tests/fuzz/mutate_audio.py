#!/usr/bin/env python3
"""Writes mutated copies of the audio seed corpus, for replaying without libFuzzer:

    python3 tests/fuzz/mutate_audio.py tests/fuzz/corpus/audio OUT_DIR [N] [SEED]
    ./build-asan/fuzz_audio_replay OUT_DIR

Mutations: bit flips and byte overwrites (mostly in the first 256 bytes, where
the headers are), boundary values written over the WAV fmt/data fields
(channels, rate, byte rate, block align, bits, chunk sizes) and the FLAC
STREAMINFO (block sizes, rate, channels, bits, total samples), truncation,
inserted / deleted / duplicated runs, and splices of two seeds.
"""
import os
import random
import struct
import sys

EDGE16 = [0, 1, 2, 3, 7, 8, 24, 32, 33, 255, 256, 0x7FFF, 0x8000, 0xFFFE, 0xFFFF]
EDGE32 = [0, 1, 2, 999, 1000, 8000, 16000, 384000, 384001, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF]


def wav_fields(d):
    """Offsets of (size, width) numeric fields in a RIFF/WAVE file's chunks."""
    out = []
    if len(d) < 12 or d[:4] != b"RIFF" or d[8:12] != b"WAVE":
        return out
    out.append((4, 4))
    pos = 12
    while pos + 8 <= len(d):
        cid, n = d[pos:pos + 4], struct.unpack("<I", d[pos + 4:pos + 8])[0]
        out.append((pos + 4, 4))
        if cid == b"fmt ":
            for off, w in ((0, 2), (2, 2), (4, 4), (8, 4), (12, 2), (14, 2), (16, 2), (18, 2), (20, 2)):
                if pos + 8 + off + w <= len(d) and off < n:
                    out.append((pos + 8 + off, w))
        pos += 8 + n + (n & 1)
    return out


def flac_fields(d):
    """Bytes of the FLAC STREAMINFO block (after 'fLaC' and the block header)."""
    if d[:4] != b"fLaC" or len(d) < 42:
        return []
    return list(range(8, 42))


def mutate(seed_bytes, seeds, rng):
    d = bytearray(seed_bytes)
    for _ in range(rng.choice([1, 1, 1, 2, 3, 5])):
        if not d:
            d = bytearray(rng.choice(seeds))
        kind = rng.randrange(9)
        n = len(d)
        head = min(n, 256)
        if kind == 0:  # bit flip, mostly in the header
            i = rng.randrange(head if rng.random() < 0.8 else n)
            d[i] ^= 1 << rng.randrange(8)
        elif kind == 1:  # byte overwrite
            i = rng.randrange(head if rng.random() < 0.8 else n)
            d[i] = rng.choice([0, 1, 0x7F, 0x80, 0xFF, rng.randrange(256)])
        elif kind == 2:  # WAV field to an edge value
            f = wav_fields(d)
            if f:
                off, w = rng.choice(f)
                v = rng.choice(EDGE16 if w == 2 else EDGE32)
                d[off:off + w] = struct.pack("<H" if w == 2 else "<I", v & (0xFFFF if w == 2 else 0xFFFFFFFF))
        elif kind == 3:  # FLAC STREAMINFO byte
            f = flac_fields(d)
            if f:
                i = rng.choice(f)
                d[i] = rng.choice([0, 0xFF, rng.randrange(256)])
        elif kind == 4:  # truncate
            d = d[:rng.randrange(n + 1)]
        elif kind == 5:  # delete a run
            i = rng.randrange(n)
            del d[i:i + rng.randint(1, 64)]
        elif kind == 6:  # insert a run
            i = rng.randrange(n + 1)
            d[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 32)))
        elif kind == 7:  # duplicate a run
            i = rng.randrange(n)
            run = d[i:i + rng.randint(1, 256)]
            j = rng.randrange(len(d) + 1)
            d[j:j] = run
        else:  # splice: the head of this seed, the tail of another
            other = rng.choice(seeds)
            d = d[:rng.randrange(n + 1)] + other[rng.randrange(len(other) + 1):]
    return bytes(d)


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    src, out = sys.argv[1], sys.argv[2]
    count = int(sys.argv[3]) if len(sys.argv) > 3 else 3000
    rng = random.Random(int(sys.argv[4]) if len(sys.argv) > 4 else 1)
    names = sorted(f for f in os.listdir(src) if not f.startswith("."))
    seeds = [open(os.path.join(src, f), "rb").read() for f in names]
    os.makedirs(out, exist_ok=True)
    for k in range(count):
        i = rng.randrange(len(seeds))
        with open(os.path.join(out, "m%05d-%s" % (k, names[i])), "wb") as f:
            f.write(mutate(seeds[i], seeds, rng))
    print("wrote %d mutants of %d seeds to %s" % (count, len(seeds), out))


if __name__ == "__main__":
    main()
