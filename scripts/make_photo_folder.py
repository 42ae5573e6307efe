#!/usr/bin/env python3
"""Writes an image folder of real photographs for the loader benchmarks: COUNT JPEGs (quality 90) of
ImageNet-like sizes (300-500 wide, 260-440 high: about 400x350 on average), each a random crop of one
of scikit-image's sample photographs (Debian's python3-skimage), randomly flipped and slightly recoloured,
resized with Lanczos. One class folder per photograph; the grayscale photographs make one class of
grayscale JPEGs (as ImageNet has a few). Deterministic for a seed.

  make_photo_folder.py OUT [--count 3000] [--seed 7] [--scale 1.0]

--scale multiplies every side (2.5: 750-1250 x 650-1100, for the sizes of Open Images or of phone photos).
"""
import argparse
import os

import numpy as np
from PIL import Image
import skimage.data

COLOUR = ["astronaut", "chelsea", "coffee", "hubble_deep_field", "immunohistochemistry", "rocket", "retina",
          "stereo_motorcycle", "colorwheel"]
GRAY = ["camera", "coins", "moon", "grass", "gravel", "brick"]


def load(name):
    a = getattr(skimage.data, name)()
    if isinstance(a, tuple):
        a = a[0]
    return Image.fromarray(np.asarray(a, dtype=np.uint8))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--count", type=int, default=3000)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--scale", type=float, default=1.0)
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    sources = [(n, load(n)) for n in COLOUR] + [("gray", None)]
    grays = [load(n) for n in GRAY]
    for i in range(args.count):
        name, src = sources[i % len(sources)]
        if src is None:
            src = grays[int(rng.integers(0, len(grays)))]
        w, h = int(rng.integers(300, 501) * args.scale), int(rng.integers(260, 441) * args.scale)
        # A crop of the source with the output's aspect ratio, 35-100% of the largest one that fits.
        sw, sh = src.size
        fit = min(sw / w, sh / h)
        f = fit * float(rng.uniform(0.35, 1.0))
        cw, ch = max(8, int(w * f)), max(8, int(h * f))
        x0, y0 = int(rng.integers(0, sw - cw + 1)), int(rng.integers(0, sh - ch + 1))
        img = src.crop((x0, y0, x0 + cw, y0 + ch)).resize((w, h), Image.LANCZOS)
        if rng.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        a = np.asarray(img, dtype=np.float32) * float(rng.uniform(0.8, 1.2)) + float(rng.uniform(-20, 20))
        img = Image.fromarray(np.clip(a, 0, 255).astype(np.uint8))
        d = os.path.join(args.out, name)
        os.makedirs(d, exist_ok=True)
        img.save(os.path.join(d, f"{i:05d}.jpg"), quality=90)


if __name__ == "__main__":
    main()
