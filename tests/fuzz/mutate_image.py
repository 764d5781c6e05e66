#!/usr/bin/env python3
"""Writes mutated copies of the image seed corpus, for replaying without libFuzzer:

    python3 tests/fuzz/mutate_image.py tests/fuzz/corpus/image OUT_DIR [N] [SEED]
    ./build-asan/fuzz_image_replay OUT_DIR

Mutations: byte flips and overwrites with boundary values, inserted / deleted /
duplicated runs, truncation, splices of two seeds, and header fields (sizes,
depth, colour type, maxval) set to edge values. PNG chunk CRCs are recomputed
after most mutations so libpng gets past its checksum and into the code behind it.
"""
import os
import random
import struct
import sys
import zlib

EDGE16 = [0, 1, 2, 7, 8, 255, 256, 0x7FFF, 0x8000, 0xFFFF]
EDGE32 = [0, 1, 2, 16383, 16384, 16385, 65535, 65536, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF]


def fix_png_crcs(d):
    if not d.startswith(b"\x89PNG\r\n\x1a\n"):
        return d
    d = bytearray(d)
    pos = 8
    while pos + 12 <= len(d):
        n = struct.unpack(">I", d[pos:pos + 4])[0]
        if pos + 12 + n > len(d):
            break
        crc = zlib.crc32(bytes(d[pos + 4:pos + 8 + n])) & 0xFFFFFFFF
        d[pos + 8 + n:pos + 12 + n] = struct.pack(">I", crc)
        pos += 12 + n
    return bytes(d)


def mutate_header(d, rnd):
    d = bytearray(d)
    if d.startswith(b"\x89PNG") and len(d) > 29:  # IHDR: w, h, depth, colour, comp, filter, interlace
        f = rnd.randrange(7)
        if f < 2:
            d[16 + 4 * f:20 + 4 * f] = struct.pack(">I", rnd.choice(EDGE32))
        else:
            d[24 + f - 2] = rnd.choice([0, 1, 2, 3, 4, 5, 6, 7, 8, 16, 255])
    elif d[:2] == b"\xff\xd8":  # SOFn: precision, height, width, components
        i = d.find(b"\xff\xc0")
        if i < 0:
            i = d.find(b"\xff\xc2")
        if i >= 0 and i + 10 < len(d):
            f = rnd.randrange(4)
            if f == 0:
                d[i + 4] = rnd.choice([0, 7, 8, 12, 16, 255])
            elif f in (1, 2):
                d[i + 5 + 2 * (f - 1):i + 7 + 2 * (f - 1)] = struct.pack(">H", rnd.choice(EDGE16))
            else:
                d[i + 9] = rnd.choice([0, 1, 2, 3, 4, 5, 255])
    elif d[:1] == b"P":  # PNM: replace one header number
        toks = d[:64].split()
        if len(toks) >= 4:
            k = rnd.randrange(1, 4)
            new = str(rnd.choice([0, 1, 255, 256, 65535, 65536, 16384, 16385, 99999999999])).encode()
            start = d.find(toks[k], len(toks[0]))
            d[start:start + len(toks[k])] = new
    return bytes(d)


def mutate(d, seeds, rnd):
    d = bytearray(d)
    for _ in range(rnd.randint(1, 4)):
        op = rnd.randrange(8)
        if not d:
            break
        i = rnd.randrange(len(d))
        if op == 0:
            d[i] ^= 1 << rnd.randrange(8)
        elif op == 1:
            d[i] = rnd.choice([0, 1, 0x7F, 0x80, 0xFF, ord(" "), ord("#"), ord("9")])
        elif op == 2:
            del d[i:i + rnd.randint(1, 16)]
        elif op == 3:
            d[i:i] = bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 16)))
        elif op == 4:
            j = rnd.randrange(len(d))
            d[i:i] = d[j:j + rnd.randint(1, 64)]
        elif op == 5:
            del d[i:]
        elif op == 6:
            other = rnd.choice(seeds)
            d = d[:i] + other[rnd.randrange(len(other)):]
        else:
            d = bytearray(mutate_header(bytes(d), rnd))
    d = bytes(d)
    if rnd.random() < 0.8:
        d = fix_png_crcs(d)
    return d


def main():
    src, out = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 3000
    rnd = random.Random(int(sys.argv[4]) if len(sys.argv) > 4 else 1)
    names = sorted(os.listdir(src))
    seeds = [open(os.path.join(src, x), "rb").read() for x in names]
    os.makedirs(out, exist_ok=True)
    for k in range(n):
        j = rnd.randrange(len(seeds))
        d = mutate(seeds[j], seeds, rnd)
        if rnd.random() < 0.15:
            d = fix_png_crcs(mutate_header(d, rnd))
        with open(os.path.join(out, "m%05d-%s" % (k, names[j])), "wb") as f:
            f.write(d)


if __name__ == "__main__":
    main()
