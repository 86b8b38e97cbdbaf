"""Accuracy of record: an exported model on every runtime, scored on a zip's test images, with its
95% Wilson interval and how often each runtime gives the SavedModel's class, and compared image by
image with another model on the same images (McNemar).

Typical usage::

    python -m bench.accuracy.of_record --data ../shared/data/cifar10-png.zip \\
        --model-dir models/airbench-png/cifar10 --json bench/records/airbench-png-s0.json
    # against airbench94's own code, from bench/training/airbench94_reference.py --predictions ref.json:
    python -m bench.accuracy.of_record --data ../shared/data/cifar10-png.zip \\
        --model-dir models/airbench-png/cifar10 --compare ref.json

The test images are decoded by ``contract.pixels.to_rgb32``, as training's loaders and the server
decode them, in the zip's sorted order. Every figure is on the same images: each runtime's, the
other model's, and the comparison's.
"""

import argparse
import io
import json
import math
import os
import sys
import zipfile

import numpy as np

from bench import record

Z_95 = 1.959963984540054


def wilson(correct, total, z=Z_95):
    """The Wilson score interval ``(low, high)`` of a proportion ``correct / total``."""
    if total == 0:
        return float("nan"), float("nan")
    p = correct / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z / (1 + z * z / total) * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total))
    return centre - half, centre + half


def mcnemar(first_right, second_right):
    """``(only the first right, only the second right, two-sided exact p)`` for paired answers on the same images."""
    first_right, second_right = np.asarray(first_right, bool), np.asarray(second_right, bool)
    b = int(np.sum(first_right & ~second_right))
    c = int(np.sum(~first_right & second_right))
    n = b + c
    if n == 0:
        return b, c, 1.0
    tail = sum(math.comb(n, i) for i in range(0, min(b, c) + 1)) / 2**n
    return b, c, min(1.0, 2 * tail)


def runs_of(path, runtime="savedmodel"):
    """The per-image classes ``[{name: class}, ...]`` in a predictions file: every run of
    bench/training/airbench94_reference.py's ``--predictions``, or ``runtime``'s answers in this script's ``--json``."""
    with open(path) as f:
        report = json.load(f)
    if "runs" in report:
        return [run["predicted"] for run in report["runs"]]
    if runtime not in report:
        raise SystemExit(f"error: {path} holds no {runtime} answers")
    return [report[runtime]["predicted"]]


def test_split(zip_path):
    """``(file names, uint8 images [N, 32, 32, 3], labels, class names)`` of the zip's test split, sorted by name."""
    return read_split(zip_path, "test")


def read_split(zip_path, split, count=None):
    """Like :func:`test_split`, for ``split``; with ``count``, that many images spread evenly over the sorted names."""
    from PIL import Image

    from contract.pixels import to_rgb32

    with zipfile.ZipFile(zip_path) as archive:
        names = sorted(n for n in archive.namelist() if n.startswith(f"{split}/") and n.lower().endswith((".png", ".jpg", ".jpeg")))
        classes = sorted({n.split("/")[1] for n in names})
        if count:
            names = names[::max(1, len(names) // count)][:count]
        images = []
        for name in names:
            with Image.open(io.BytesIO(archive.read(name))) as image:
                images.append(to_rgb32(image))
    labels = np.array([classes.index(n.split("/")[1]) for n in names])
    return names, np.stack(images), labels, classes


def version_dir_of(model_dir):
    """``model_dir`` if it is a version directory ``N/``, else its highest version; SystemExit if it has none."""
    if os.path.isfile(os.path.join(model_dir, "saved_model.pb")):
        return model_dir
    versions = sorted(int(v) for v in os.listdir(model_dir) if v.isdigit()) if os.path.isdir(model_dir) else []
    if not versions:
        raise SystemExit(f"error: no version directories under {model_dir}")
    return os.path.join(model_dir, str(versions[-1]))


def score(version_dir, images, labels, names, classes):
    """``{runtime: result}`` for every runtime whose model ``version_dir`` holds."""
    from contract import OUTPUT_PROBABILITIES
    from serve.backends import runtimes

    results = {}
    for runtime in runtimes.RUNTIMES:
        if not os.path.isfile(os.path.join(version_dir, runtimes.MODEL_FILES[runtime])):
            continue
        model = runtimes.load(runtime, version_dir, len(os.sched_getaffinity(0)))
        probabilities = np.concatenate([
            np.asarray(model.pixels(images[i:i + 250])[OUTPUT_PROBABILITIES]) for i in range(0, len(images), 250)])
        predicted = probabilities.argmax(1)
        correct = int(np.sum(predicted == labels))
        low, high = wilson(correct, len(labels))
        results[runtime] = {
            "accuracy": correct / len(labels), "correct": correct, "images": len(labels),
            "wilson_95": [round(low, 4), round(high, 4)],
            "predicted": {name: classes[c] for name, c in zip(names, predicted.tolist())},
        }
    return results


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="zip of test/<class>/ images (e.g. ../shared/data/cifar10-png.zip)")
    p.add_argument("--model-dir", required=True, help="models/NAME (its highest version) or a version directory N/")
    p.add_argument("--json", help="write every runtime's result and per-image classes here")
    p.add_argument("--compare", action="append", default=[], metavar="PREDICTIONS.json",
                   help="per-image classes of another model on the same images (this script's --json, its "
                        "SavedModel's; or bench/training/airbench94_reference.py --predictions): McNemar against each of "
                        "its runs; python -m bench.accuracy.seed_summary compares several seeds of each")
    args = p.parse_args(argv)
    version_dir = version_dir_of(args.model_dir)
    names, images, labels, classes = test_split(args.data)
    results = score(version_dir, images, labels, names, classes)
    print(f"{len(names)} test images of {args.data}; model {version_dir}")
    reference = results.get("savedmodel")
    if reference:
        for r in results.values():
            r["agreement"] = float(np.mean([r["predicted"][n] == reference["predicted"][n] for n in names]))
    print("| runtime | accuracy | 95% Wilson interval | the SavedModel's class |")
    print("|---|---:|---|---:|")
    for runtime, r in results.items():
        agreement = f"{r['agreement']:.2%}" if "agreement" in r else "(no SavedModel)"
        print(f"| {runtime} | {r['accuracy']:.2%} ({r['correct']}/{r['images']}) | "
              f"{r['wilson_95'][0]:.2%} - {r['wilson_95'][1]:.2%} | {agreement} |")
    if args.json:
        record.write(args.json, {"data": os.path.basename(args.data), "version_dir": version_dir, **results}, __spec__.name, argv)
    truth = dict(zip(names, (classes[c] for c in labels)))
    ours = reference or next(iter(results.values()))
    ours_right = [ours["predicted"][n] == truth[n] for n in names]
    for path in args.compare:
        for i, predicted in enumerate(runs_of(path)):
            missing = [n for n in names if n not in predicted]
            if missing:
                raise SystemExit(f"error: {path} run {i} has no class for {len(missing)} of these images (e.g. {missing[0]})")
            other_right = [predicted[n] == truth[n] for n in names]
            b, c, p_value = mcnemar(ours_right, other_right)
            print(f"vs {path} run {i}: ours {np.mean(ours_right):.2%}, theirs {np.mean(other_right):.2%}; "
                  f"only ours right {b}, only theirs right {c}; McNemar exact p = {p_value:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
