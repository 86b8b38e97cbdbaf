"""The corrupted test images for bench/confidence/robustness.py: the 15 common corruptions of the PyPI package
``imagecorruptions`` at its 5 severities, seeded, written to one ``.npz``.

It runs in its own environment, never the project's (bench/confidence/robustness.py makes
``bench/.venvs/corruptions/`` from ``bench/confidence/requirements-corruptions.txt`` on first use and
calls this script there, by its path; it imports nothing of the project)::

    bench/.venvs/corruptions/bin/python bench/confidence/corruptions_generate.py --input clean.npz \\
        --output bench/.cache/corruptions-KEY.npz --seed 0

``--input`` holds ``images``, uint8 ``[N, 32, 32, 3]``. ``--output`` holds one uint8 array of the same
shape per set, named ``CORRUPTION-SEVERITY`` (``fog-3``), and ``meta``: a JSON string with the
package versions and the corruptions that could not be made (``not_measured``: name and reason).

The severities are ImageNet-C's (Hendrycks and Dietterich, 2019), which the package follows, applied
to 32x32 images as they are: its blurs, snow and frost are sized in pixels for ImageNet's 224-pixel
images, so these sets are not CIFAR-10-C's (whose parameters were chosen for 32x32), and most are
harder. The package accepts 32x32 (its smallest size) for all 15.
"""

import argparse
import json
import os
import sys

import numpy as np

#: ImageNet-C's 15 common corruptions, in its order (noise, blur, weather, digital).
CORRUPTIONS = ("gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "motion_blur",
               "zoom_blur", "snow", "frost", "fog", "brightness", "contrast", "elastic_transform", "pixelate",
               "jpeg_compression")
SEVERITIES = (1, 2, 3, 4, 5)
VERSIONED = ("imagecorruptions", "numpy", "scikit-image", "scipy", "opencv-python", "pillow")


def set_name(corruption, severity):
    return f"{corruption}-{severity}"


def set_seed(seed, corruption, severity):
    """The NumPy seed of one set: each set is reproducible alone, whichever others are made."""
    return seed * 1000 + CORRUPTIONS.index(corruption) * 10 + severity


def _package():
    """``imagecorruptions.corrupt``, with glass_blur's one call that scikit-image >= 0.20 refuses mapped."""
    import imagecorruptions
    from imagecorruptions import corruptions
    from skimage.filters import gaussian

    def gaussian_multichannel(image, *args, multichannel=None, **kwargs):
        # scikit-image 0.19 deprecated multichannel=True for channel_axis=-1, which means the same.
        if multichannel:
            kwargs.setdefault("channel_axis", -1)
        return gaussian(image, *args, **kwargs)

    corruptions.gaussian = gaussian_multichannel
    return imagecorruptions.corrupt


def versions():
    from importlib import metadata

    return {name: metadata.version(name) for name in VERSIONED}


def generate(images, corruptions=CORRUPTIONS, severities=SEVERITIES, seed=0, log=print):
    """``({set name: uint8 images}, {corruption: why it was not made})``."""
    corrupt = _package()
    sets, not_measured = {}, {}
    for corruption in corruptions:
        try:
            for severity in severities:
                np.random.seed(set_seed(seed, corruption, severity))  # the package draws from NumPy's global state
                out = np.stack([np.asarray(corrupt(image, corruption_name=corruption, severity=severity))
                                for image in images])
                if out.shape != images.shape or out.dtype != np.uint8:
                    raise ValueError(f"severity {severity} gave {out.dtype} {out.shape}, not uint8 {images.shape}")
                sets[set_name(corruption, severity)] = out
        except Exception as e:  # one corruption that fails is reported, not fatal to the other 14
            for severity in severities:
                sets.pop(set_name(corruption, severity), None)
            not_measured[corruption] = f"{type(e).__name__}: {e}"
            log(f"{corruption}: not made ({not_measured[corruption]})", file=sys.stderr)
            continue
        log(f"{corruption}: {len(severities)} severities x {len(images)} images", file=sys.stderr)
    return sets, not_measured


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--input", required=True, help=".npz with 'images', uint8 [N, 32, 32, 3]")
    p.add_argument("--output", required=True, help=".npz to write the corrupted sets to")
    p.add_argument("--seed", type=int, default=0, help="seeds every set (NumPy's global generator, which the package uses)")
    p.add_argument("--corruptions", default=",".join(CORRUPTIONS), help="comma-separated names (default: all 15)")
    p.add_argument("--severities", default=",".join(map(str, SEVERITIES)), help="comma-separated, 1 to 5")
    args = p.parse_args(argv)
    chosen = [c for c in args.corruptions.split(",") if c]
    unknown = sorted(set(chosen) - set(CORRUPTIONS))
    if unknown:
        raise SystemExit(f"error: unknown corruptions {unknown}; choose from {', '.join(CORRUPTIONS)}")
    severities = [int(s) for s in args.severities.split(",") if s]
    if not severities or not set(severities) <= set(SEVERITIES):
        raise SystemExit(f"error: severities must be among 1-5, not {args.severities!r}")
    with np.load(args.input) as f:
        images = f["images"]
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] != 3:
        raise SystemExit(f"error: {args.input}: images must be uint8 [N, H, W, 3], not {images.dtype} {images.shape}")
    sets, not_measured = generate(images, chosen, severities, args.seed)
    meta = {"versions": versions(), "seed": args.seed, "not_measured": not_measured}
    partial = args.output + ".partial.npz"  # np.savez appends .npz to any other name
    np.savez(partial, meta=np.array(json.dumps(meta)), **sets)
    os.replace(partial, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
