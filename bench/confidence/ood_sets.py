"""Images that are none of CIFAR-10's classes, for the out-of-distribution benchmark (bench/confidence/ood.py).

Every set is made here, seeded, from files that installed packages ship or from code: nothing is
downloaded, so the benchmark reruns on any machine with the ``ood`` extra. Each set is uint8
``[N, 32, 32, 3]``:

* ``photos`` - scikit-learn's two sample photographs (``china.jpg``, a temple; ``flower.jpg``, a
  flower) and matplotlib's ``grace_hopper.jpg`` (a portrait): random square crops of 64 to 256
  pixels, resized to 32x32 with Pillow's BILINEAR (the server's rule), and each photo whole.
  None shows an airplane, a car, a bird, a cat, a deer, a dog, a frog, a horse, a ship or a truck.
* ``textures`` - half 32x32 crops of the same photographs at their own resolution (fur of
  petals, roof tiles, cloth: texture, not objects), half drawn: stripes at any angle, checkerboards,
  plaids, brick walls and smoothed noise ("clouds"), in random colours.
* ``digits`` - scikit-learn's 8x8 handwritten digits (1,797, UCI), scaled to 32x32, grey on black.
* ``text`` - words in the system's DejaVu and Liberation fonts (Pillow's built-in font where
  there are none), random sizes and colours.
* ``noise`` - uniform and Gaussian pixel noise, in colour and in grey.
* ``gradients`` - linear and radial gradients between two random colours.
* ``flat`` - one colour over the whole image.
"""

import glob
import os

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

SIZE = 32
#: Images per set (digits: all 1,797 are available; this many are used).
COUNTS = {"photos": 400, "textures": 400, "digits": 500, "text": 300, "noise": 200, "gradients": 200, "flat": 100}
SEED = 20261201
WORDS = ("cloud", "river", "Hello", "TOTAL", "42", "invoice", "page 7", "été", "Zürich", "OK", "A", "xyz",
         "Lorem", "ipsum", "SALE", "2026", "tea", "moon", "π ≈ 3.14", "Q", "serve", "model")


def photographs():
    """The shipped photographs as RGB Pillow images: ``{name: image}``."""
    import matplotlib
    from sklearn.datasets import load_sample_images

    photos = dict(zip(("china", "flower"), (Image.fromarray(a) for a in load_sample_images().images)))
    hopper = os.path.join(matplotlib.get_data_path(), "sample_data", "grace_hopper.jpg")
    with Image.open(hopper) as image:
        photos["grace_hopper"] = image.convert("RGB")
    return photos


def _resize(image):
    return np.asarray(image.resize((SIZE, SIZE), Image.BILINEAR), np.uint8)


def photos(count, rng):
    shots = list(photographs().values())
    out = [_resize(shot) for shot in shots]
    while len(out) < count:
        shot = shots[rng.integers(len(shots))]
        side = int(rng.integers(64, min(256, *shot.size) + 1))
        x, y = rng.integers(0, shot.size[0] - side + 1), rng.integers(0, shot.size[1] - side + 1)
        out.append(_resize(shot.crop((x, y, x + side, y + side))))
    return np.stack(out[:count])


def _colour(rng):
    return tuple(int(c) for c in rng.integers(0, 256, 3))


def _drawn_texture(rng):
    kind = rng.integers(5)
    a, b = np.array(_colour(rng), np.float64), np.array(_colour(rng), np.float64)
    yy, xx = np.mgrid[0:SIZE, 0:SIZE].astype(np.float64)
    if kind == 0:  # stripes at any angle
        angle, period = rng.uniform(0, np.pi), rng.uniform(3, 12)
        t = (np.sin(2 * np.pi * (xx * np.cos(angle) + yy * np.sin(angle)) / period) > 0).astype(np.float64)
    elif kind == 1:  # checkerboard
        cell = int(rng.integers(2, 9))
        t = ((xx // cell + yy // cell) % 2).astype(np.float64)
    elif kind == 2:  # plaid: two sine gratings
        p1, p2 = rng.uniform(4, 14, 2)
        t = 0.5 + 0.25 * (np.sin(2 * np.pi * xx / p1) + np.sin(2 * np.pi * yy / p2))
    elif kind == 3:  # bricks
        image = Image.new("RGB", (SIZE, SIZE), tuple(int(c) for c in b))
        draw = ImageDraw.Draw(image)
        h, w = int(rng.integers(4, 9)), int(rng.integers(8, 17))
        for row, top in enumerate(range(0, SIZE, h)):
            offset = (w // 2) * (row % 2)
            for left in range(-offset, SIZE, w):
                draw.rectangle((left + 1, top + 1, left + w - 1, top + h - 1), fill=tuple(int(c) for c in a))
        return np.asarray(image, np.uint8)
    else:  # clouds: noise blurred, stretched to the full range
        noise = Image.fromarray(rng.integers(0, 256, (SIZE, SIZE), dtype=np.uint8))
        t = np.asarray(noise.filter(ImageFilter.GaussianBlur(rng.uniform(1.5, 4))), np.float64)
        t = (t - t.min()) / max(np.ptp(t), 1.0)
    return np.clip(a * t[..., None] + b * (1 - t[..., None]), 0, 255).astype(np.uint8)


def textures(count, rng):
    shots = list(photographs().values())
    out = []
    for _ in range(count // 2):
        shot = shots[rng.integers(len(shots))]
        x, y = rng.integers(0, shot.size[0] - SIZE + 1), rng.integers(0, shot.size[1] - SIZE + 1)
        out.append(np.asarray(shot.crop((x, y, x + SIZE, y + SIZE)), np.uint8))
    while len(out) < count:
        out.append(_drawn_texture(rng))
    return np.stack(out)


def digits(count, rng):
    from sklearn.datasets import load_digits

    images = load_digits().images  # float 0-16, [1797, 8, 8]
    chosen = rng.choice(len(images), size=min(count, len(images)), replace=False)
    out = []
    for index in chosen:
        grey = Image.fromarray(np.uint8(np.round(images[index] * 255 / 16)), "L").resize((SIZE, SIZE), Image.BILINEAR)
        out.append(np.asarray(grey.convert("RGB"), np.uint8))
    return np.stack(out)


def _fonts():
    found = sorted(glob.glob("/usr/share/fonts/truetype/*/*.ttf"))
    return found or [None]  # None: Pillow's own font


def text(count, rng):
    fonts = _fonts()
    out = []
    for _ in range(count):
        background, ink = _colour(rng), _colour(rng)
        image = Image.new("RGB", (SIZE, SIZE), background)
        font_file, size = fonts[rng.integers(len(fonts))], int(rng.integers(8, 20))
        font = ImageFont.truetype(font_file, size) if font_file else ImageFont.load_default(size=size)
        word = WORDS[rng.integers(len(WORDS))]
        ImageDraw.Draw(image).text((int(rng.integers(-4, 12)), int(rng.integers(0, 16))), word, fill=ink, font=font)
        out.append(np.asarray(image, np.uint8))
    return np.stack(out)


def noise(count, rng):
    out = []
    for i in range(count):
        shape = (SIZE, SIZE, 3) if i % 2 == 0 else (SIZE, SIZE, 1)
        if i % 4 < 2:
            pixels = rng.integers(0, 256, shape)
        else:
            pixels = np.clip(rng.normal(rng.uniform(64, 192), rng.uniform(10, 80), shape), 0, 255)
        out.append(np.broadcast_to(pixels, (SIZE, SIZE, 3)).astype(np.uint8))
    return np.stack(out)


def gradients(count, rng):
    yy, xx = np.mgrid[0:SIZE, 0:SIZE].astype(np.float64) / (SIZE - 1)
    out = []
    for i in range(count):
        a, b = np.array(_colour(rng), np.float64), np.array(_colour(rng), np.float64)
        if i % 2 == 0:
            angle = rng.uniform(0, 2 * np.pi)
            t = xx * np.cos(angle) + yy * np.sin(angle)
            t = (t - t.min()) / np.ptp(t)
        else:
            cx, cy = rng.uniform(0, 1, 2)
            t = np.clip(np.hypot(xx - cx, yy - cy) / rng.uniform(0.5, 1.5), 0, 1)
        out.append(np.clip(a * t[..., None] + b * (1 - t[..., None]), 0, 255).astype(np.uint8))
    return np.stack(out)


def flat(count, rng):
    return np.stack([np.full((SIZE, SIZE, 3), _colour(rng), np.uint8) for _ in range(count)])


MAKERS = {"photos": photos, "textures": textures, "digits": digits, "text": text, "noise": noise,
          "gradients": gradients, "flat": flat}


def make(names=None, counts=None, seed=SEED):
    """``{set name: uint8 [N, 32, 32, 3]}`` for ``names`` (default: every set), seeded."""
    counts = {**COUNTS, **(counts or {})}
    return {name: MAKERS[name](counts[name], np.random.default_rng([seed, index]))
            for index, name in enumerate(MAKERS) if names is None or name in names}


if __name__ == "__main__":  # a contact sheet of each set, to look at
    import argparse

    parser = argparse.ArgumentParser(description="write a PNG contact sheet of each out-of-distribution set")
    parser.add_argument("--out", default="bench/results/ood-sets", help="folder for the sheets")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for name, images in make().items():
        rows = [np.concatenate(list(images[i:i + 20]), axis=1) for i in range(0, min(len(images), 200) - 19, 20)]
        Image.fromarray(np.concatenate(rows, axis=0)).save(os.path.join(args.out, f"{name}.png"))
        print(f"{name}: {len(images)} images -> {args.out}/{name}.png")
