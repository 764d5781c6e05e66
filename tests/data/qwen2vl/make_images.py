# the Qwen2-VL logits test's three images (README.md here): smooth colour fields with a
# few blocks, as 8-bit RGB PNG (zlib), deterministic
import struct, zlib, sys
import numpy as np

def png(path, a):
    h, w, _ = a.shape
    d = a.astype(np.int16)  # each row filtered with "Sub" (type 1): the byte minus the pixel's left neighbour's
    d[:, 1:] -= a[:, :-1].astype(np.int16)
    raw = b"".join(b"\1" + (d[y] % 256).astype(np.uint8).tobytes() for y in range(h))
    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) +
                chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))

for k, (w, h) in enumerate(((320, 200), (120, 300), (224, 224))):
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    a = np.stack([128 + 100 * np.sin(x / (13 + k) + y / 29), 128 + 100 * np.cos(y / (17 + k) - x / 41),
                  128 + 90 * np.sin((x + y) / (23 + 2 * k))], axis=2)
    for j in range(3):  # blocks of solid colour
        x0, y0 = (37 * (j + 1) * (k + 2)) % (w - 40), (53 * (j + 2) * (k + 1)) % (h - 40)
        a[y0:y0 + 40, x0:x0 + 30] = [(90 * j + 40 * k) % 256, (160 + 50 * j) % 256, (30 * k + 70) % 256]
    png("img%dx%d.png" % (w, h), np.clip(np.rint(a), 0, 255).astype(np.uint8))
