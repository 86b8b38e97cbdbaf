"""What JPEG draft mode (Pillow's ``Image.draft``) would save the server, and what it would change.

A large JPEG is decoded at full size and then resized to 32x32 (``contract.pixels.to_rgb32``, what
training and serving both run). Draft mode lets libjpeg decode at 1/2, 1/4 or 1/8 scale through
the DCT, so far fewer pixels are made, but the 32x32 result is then a resize of a different image.
This times both paths on a few large JPEGs and reports the largest pixel difference between them.

Typical usage:

    python bench/jpeg_draft.py                    # 4000x3000, quality 90, 20 repeats
    python bench/jpeg_draft.py --size 1024x768 --repeats 50
"""

import argparse
import io
import statistics
import time

import numpy as np
from PIL import Image

from contract import IMAGE_SIZE
from contract.pixels import to_rgb32


def images(width, height):
    """Three kinds of content: smooth (a photo's sky), fine detail (noise), and hard edges (stripes)."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    smooth = np.stack([x / width * 255, y / height * 255, (x + y) / (width + height) * 255], axis=-1)
    noise = rng.integers(0, 256, (height, width, 3)).astype(np.float32)
    stripes = np.repeat(((x // 37) % 2 * 255)[..., None], 3, axis=-1)
    return {"smooth": smooth, "noise": noise, "stripes": stripes}


def jpeg(pixels, quality):
    out = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(out, "JPEG", quality=quality)
    return out.getvalue()


def current(data):
    return to_rgb32(Image.open(io.BytesIO(data)))


def draft(data):
    image = Image.open(io.BytesIO(data))
    image.draft("RGB", (IMAGE_SIZE, IMAGE_SIZE))  # the largest DCT reduction that stays at least 32x32
    return to_rgb32(image)


def timed(function, data, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function(data)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="4000x3000", help="the JPEGs' width x height in pixels")
    p.add_argument("--quality", type=int, default=90, help="the JPEG quality they are saved at")
    p.add_argument("--repeats", type=int, default=20, help="decodes timed per path and image (the median is shown)")
    args = p.parse_args(argv)
    width, height = map(int, args.size.lower().split("x"))
    print(f"{width}x{height} JPEG, quality {args.quality}, to {IMAGE_SIZE}x{IMAGE_SIZE}; median of {args.repeats}")
    print(f"{'content':<8} {'full decode':>12} {'draft':>9} {'speed-up':>9} {'draft size':>11} {'max |diff|':>11} {'mean |diff|':>12}")
    for name, pixels in images(width, height).items():
        data = jpeg(pixels, args.quality)
        drafted = Image.open(io.BytesIO(data))
        drafted.draft("RGB", (IMAGE_SIZE, IMAGE_SIZE))
        a, b = current(data).astype(int), draft(data).astype(int)
        full_ms, draft_ms = timed(current, data, args.repeats), timed(draft, data, args.repeats)
        diff = np.abs(a - b)
        print(f"{name:<8} {full_ms:>9.1f} ms {draft_ms:>6.1f} ms {full_ms / draft_ms:>8.1f}x "
              f"{'%dx%d' % drafted.size:>11} {diff.max():>11d} {diff.mean():>12.2f}")


if __name__ == "__main__":
    main()
