"""Synthetic scenes for the test VLM: shapes, colours, counts, positions, sizes,
backgrounds, and large printed digits, each with its questions and exact answers.

    scenes.py OUT_DIR N [--seed S]   writes N scenes as OUT_DIR/NNNN.ppm and OUT_DIR/scenes.jsonl
    scenes.py --one OUT.ppm [--seed S] [--index I]   one scene; prints its description

numpy only; a scene is a function of (seed, index), so the training run (on the GPU
machine) and the evaluation (here) draw from the same distribution, and a held-out
set is another seed. Images are S x S RGB (S = 224, the encoder's input size, so no
resize happens in preprocessing).
"""
import json
import os
import sys

import numpy as np

S = 224
COLOURS = {  # name -> base RGB; each scene jitters it by up to +-JITTER per channel
    "red": (215, 35, 35),
    "green": (35, 165, 55),
    "blue": (35, 75, 215),
    "yellow": (235, 215, 35),
    "orange": (240, 135, 25),
    "purple": (135, 50, 175),
}
JITTER = 18
SHAPES = ["circle", "square", "triangle", "star", "diamond", "cross"]
BACKGROUNDS = [(255, 255, 255), (232, 232, 232), (196, 196, 196), (128, 128, 128), (64, 64, 64),
               (24, 24, 24), (244, 234, 212), (210, 226, 240)]
POSITIONS = ["top left", "top right", "bottom left", "bottom right"]  # quadrant q: row q // 2, column q % 2

# 5 x 7 bitmap digits, one string of 7 rows of 5 bits each
FONT = {
    "0": "01110 10001 10011 10101 11001 10001 01110", "1": "00100 01100 00100 00100 00100 00100 01110",
    "2": "01110 10001 00001 00010 00100 01000 11111", "3": "11111 00010 00100 00010 00001 10001 01110",
    "4": "00010 00110 01010 10010 11111 00010 00010", "5": "11111 10000 11110 00001 00001 10001 01110",
    "6": "00110 01000 10000 11110 10001 10001 01110", "7": "11111 00001 00010 00100 01000 01000 01000",
    "8": "01110 10001 10001 01110 10001 10001 01110", "9": "01110 10001 10001 01111 00001 00010 01100",
}

# the questions, by the kind of answer they ask for
Q_COLOUR = "What colour is the shape?"
Q_SHAPE = "What shape is it?"
Q_WHERE = "Where is the shape?"
Q_COUNT = "How many shapes are there?"
Q_DIGIT = "What number is written?"
Q_DESCRIBE = "Describe the image."


def q_where_colour(colour):
    return "Where is the %s shape?" % colour


def questions():
    """Every question text the scenes ask (for the tokenizer table)."""
    return [Q_COLOUR, Q_SHAPE, Q_WHERE, Q_COUNT, Q_DIGIT, Q_DESCRIBE] + [q_where_colour(c) for c in COLOURS]


def answers():
    """Every answer text (for the tokenizer table)."""
    out = list(COLOURS) + SHAPES + POSITIONS + [str(n) for n in range(10)]
    out += ["A %s %s in the %s." % (c, s, p) for c in COLOURS for s in SHAPES for p in POSITIONS]
    return out


_YY, _XX = np.mgrid[0:S, 0:S].astype(np.float32) + 0.5


def _polygon(dx, dy, verts):
    """Even-odd point-in-polygon over the pixel offsets (dx, dy)."""
    inside = np.zeros(dx.shape, dtype=bool)
    n = len(verts)
    for i in range(n):
        x0, y0 = verts[i]
        x1, y1 = verts[(i + 1) % n]
        if y0 == y1:
            continue
        cond = (y0 > dy) != (y1 > dy)
        xc = x0 + (dy - y0) * (x1 - x0) / (y1 - y0)
        inside ^= cond & (dx < xc)
    return inside


def shape_mask(shape, cx, cy, r):
    dx, dy = _XX - cx, _YY - cy
    if shape == "circle":
        return dx * dx + dy * dy <= r * r
    if shape == "square":
        return np.maximum(np.abs(dx), np.abs(dy)) <= 0.85 * r
    if shape == "diamond":
        return np.abs(dx) + np.abs(dy) <= 1.1 * r
    if shape == "cross":
        a = 0.34 * r
        return ((np.abs(dx) <= a) & (np.abs(dy) <= r)) | ((np.abs(dy) <= a) & (np.abs(dx) <= r))
    if shape == "triangle":  # pointing up, circumradius r, its centroid lowered to sit in the box
        ang = np.deg2rad([-90.0, 30.0, 150.0])
        verts = [(r * np.cos(t), r * np.sin(t) + 0.15 * r) for t in ang]
        return _polygon(dx, dy, verts)
    if shape == "star":
        verts = []
        for k in range(10):
            t = np.deg2rad(-90.0 + 36.0 * k)
            rr = r if k % 2 == 0 else 0.45 * r
            verts.append((rr * np.cos(t), rr * np.sin(t) + 0.08 * r))
        return _polygon(dx, dy, verts)
    raise ValueError(shape)


G = S // 16  # the encoder's patch grid (patch 16)


def _labels():
    """Per-patch labels: [0] what covers at least a quarter of the patch (0 background,
    1 + shape index, 1 + len(SHAPES) for a digit), [1] its colour (0 background, 1 + index)."""
    return np.zeros((2, G, G), np.int8)


def _paint(img, lab, mask, rgb, what, colour):
    img[mask] = rgb
    cover = mask.reshape(G, 16, G, 16).mean(axis=(1, 3)) >= 0.25
    lab[0][cover] = what
    lab[1][cover] = 1 + list(COLOURS).index(colour)


def _colour(rng, name):
    base = np.array(COLOURS[name], dtype=np.int32)
    return np.clip(base + rng.integers(-JITTER, JITTER + 1, 3), 0, 255)


def _background(rng, img):
    bg = np.array(BACKGROUNDS[rng.integers(len(BACKGROUNDS))], dtype=np.float32)
    img[:] = bg
    noise = rng.uniform(0.0, 8.0)
    if noise > 2.0:  # mild sensor-like noise on some scenes
        img += rng.normal(0.0, noise, img.shape).astype(np.float32)


def _finish(img):
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def _quadrant_centre(rng, q, r, margin):
    """A centre for a shape of radius r inside quadrant q, at least `margin` px from the midlines."""
    half = S // 2
    lo, hi = r + 3, half - max(margin, r * 0.35)
    lo = min(lo, hi)
    cx = rng.uniform(lo, hi)
    cy = rng.uniform(lo, hi)
    if q % 2 == 1:
        cx = S - cx
    if q // 2 == 1:
        cy = S - cy
    return cx, cy


def single_scene(rng):
    img = np.empty((S, S, 3), dtype=np.float32)
    _background(rng, img)
    colour = list(COLOURS)[rng.integers(len(COLOURS))]
    shape = SHAPES[rng.integers(len(SHAPES))]
    q = int(rng.integers(4))
    r = rng.uniform(18.0, 46.0)
    cx, cy = _quadrant_centre(rng, q, r, 14.0)
    lab = _labels()
    _paint(img, lab, shape_mask(shape, cx, cy, r), _colour(rng, colour), 1 + SHAPES.index(shape), colour)
    pos = POSITIONS[q]
    qa = [(Q_COLOUR, colour), (Q_SHAPE, shape), (Q_WHERE, pos), (Q_COUNT, "1"),
          (Q_DESCRIBE, "A %s %s in the %s." % (colour, shape, pos)), (q_where_colour(colour), pos)]
    return _finish(img), {"kind": "single", "colour": colour, "shape": shape, "position": pos}, qa, lab


def multi_scene(rng, n=None):
    img = np.empty((S, S, 3), dtype=np.float32)
    _background(rng, img)
    n = int(rng.integers(1, 5)) if n is None else n
    quads = rng.permutation(4)[:n]
    colours = [list(COLOURS)[i] for i in rng.permutation(len(COLOURS))[:n]]
    items = []
    lab = _labels()
    for q, colour in zip(quads, colours):
        shape = SHAPES[rng.integers(len(SHAPES))]
        r = rng.uniform(14.0, 34.0)
        cx, cy = _quadrant_centre(rng, int(q), r, 10.0)
        _paint(img, lab, shape_mask(shape, cx, cy, r), _colour(rng, colour), 1 + SHAPES.index(shape), colour)
        items.append({"colour": colour, "shape": shape, "position": POSITIONS[int(q)]})
    qa = [(Q_COUNT, str(n))] + [(q_where_colour(it["colour"]), it["position"]) for it in items]
    return _finish(img), {"kind": "multi", "count": n, "items": items}, qa, lab


def digit_scene(rng):
    img = np.empty((S, S, 3), dtype=np.float32)
    _background(rng, img)
    d = str(int(rng.integers(10)))
    colour = list(COLOURS)[rng.integers(len(COLOURS))]
    cell = int(rng.integers(12, 20))
    w, h = 5 * cell, 7 * cell
    x0 = int(rng.integers(4, S - w - 4))
    y0 = int(rng.integers(4, S - h - 4))
    rows = FONT[d].split()
    mask = np.zeros((S, S), dtype=bool)
    for j, row in enumerate(rows):
        for i, bit in enumerate(row):
            if bit == "1":
                mask[y0 + j * cell:y0 + (j + 1) * cell, x0 + i * cell:x0 + (i + 1) * cell] = True
    lab = _labels()
    _paint(img, lab, mask, _colour(rng, colour), 1 + len(SHAPES), colour)
    return _finish(img), {"kind": "digit", "digit": d, "colour": colour}, [(Q_DIGIT, d)], lab


def scene(seed, index):
    """Scene `index` of the stream `seed`: (uint8 S x S x 3 image, description, [(question, answer)],
    per-patch labels)."""
    rng = np.random.default_rng([seed, index])
    u = rng.uniform()
    if u < 0.45:
        return single_scene(rng)
    if u < 0.9:
        return multi_scene(rng)
    return digit_scene(rng)


def eval_set(seed, n):
    """The held-out questions: scene i asks one question of category i % 4 (colour, shape, count,
    position), on a scene made for that category."""
    out = []
    for i in range(n):
        rng = np.random.default_rng([seed, i])
        cat = ["colour", "shape", "count", "position"][i % 4]
        if cat in ("colour", "shape"):
            img, desc, _, _ = single_scene(rng)
            q, a = (Q_COLOUR, desc["colour"]) if cat == "colour" else (Q_SHAPE, desc["shape"])
        elif cat == "count":
            img, desc, qa, _ = multi_scene(rng)
            q, a = qa[0]
        else:
            img, desc, qa, _ = multi_scene(rng, int(rng.integers(2, 5)))
            q, a = qa[1 + int(rng.integers(desc["count"]))]
        out.append((img, cat, q, a))
    return out


def write_ppm(path, img):
    with open(path, "wb") as f:
        f.write(b"P6\n%d %d\n255\n" % (img.shape[1], img.shape[0]))
        f.write(img.tobytes())


def main(argv):
    if len(argv) < 2:
        sys.stderr.write(__doc__)
        return 2
    seed = int(argv[argv.index("--seed") + 1]) if "--seed" in argv else 1
    if argv[0] == "--one":
        img, desc, _, _ = scene(seed, int(argv[argv.index("--index") + 1]) if "--index" in argv else 0)
        write_ppm(argv[1], img)
        print(json.dumps(desc))
        return 0
    out, n = argv[0], int(argv[1])
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "scenes.jsonl"), "w") as f:
        for i in range(n):
            img, desc, qa, _ = scene(seed, i)
            name = "%04d.ppm" % i
            write_ppm(os.path.join(out, name), img)
            f.write(json.dumps({"image": name, "scene": desc, "qa": qa}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
