"""Robustness: an exported model's accuracy, calibration and out-of-distribution verdicts on the
1,000 original test images under the 15 common corruptions at 5 severities, and clean.

Typical usage::

    python -m bench.confidence.robustness --data ../shared/data/cifar10-png.zip --model-dir models/airbench_fast/cifar10 \\
        --name airbench_fast-h5000-png-s0

writes ``bench/records/robustness-NAME.json``, ``docs/images/robustness-NAME.png`` and prints two
markdown tables: each corruption averaged over its severities, and each severity averaged over the
corruptions.

**The corruptions** are the PyPI package ``imagecorruptions``'s (``bench/confidence/corruptions_generate.py``):
ImageNet-C's 15 corruptions at ImageNet-C's severities, applied to the 32x32 test images. They are
not CIFAR-10-C's (Hendrycks and Dietterich chose other parameters for 32x32 images): the package's
blurs, snow and frost are sized in pixels for 224-pixel images, so most sets here are harder than
CIFAR-10-C's of the same name, and no figure here compares with a CIFAR-10-C figure one for one.
The package is not a dependency of the project: it runs in ``bench/.venvs/corruptions/`` (made on
first use from ``bench/confidence/requirements-corruptions.txt``), and its sets are cached in
``bench/.cache/corruptions-KEY.npz`` (about 230 MB), KEY a hash of the images, the seed, the
corruptions, the severities, the generator and its pins.

**What is measured**, per set, on what the server answers (the SavedModel run in-process by
default, as bench/accuracy/of_record.py runs it): accuracy with its 95% Wilson interval; the
expected calibration error of the served, temperature-scaled probabilities
(``contract.confidence.expected_calibration_error``: 15 equal-width bins of the top probability);
the mean top probability; and the share flagged as foreign: ``in_distribution: false``, the model's
own verdict, which is its energy score above the threshold in the published manifest's confidence
section (``export/calibration.py``). A model exported without a held-out slice has no threshold, and
its flagged share is recorded as null.
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from bench import record as records
from bench.accuracy.of_record import test_split, version_dir_of, wilson
from bench.confidence.corruptions_generate import CORRUPTIONS, SEVERITIES, set_name  # NumPy only at import
from contract import OUTPUT_IN_DISTRIBUTION, OUTPUT_OOD_SCORE, OUTPUT_PROBABILITIES
from contract import confidence as rules

HERE = os.path.dirname(os.path.abspath(__file__))
GENERATOR = os.path.join(HERE, "corruptions_generate.py")
REQUIREMENTS = os.path.join(HERE, "requirements-corruptions.txt")
VENV = os.path.join(records.ROOT, "bench", ".venvs", "corruptions")
CACHE_DIR = os.path.join(records.ROOT, "bench", ".cache")
IMAGES_DIR = os.path.join(records.ROOT, "docs", "images")
BATCH = 250
MEASURES = ("accuracy", "ece", "flagged")
NOT_CIFAR10C = ("imagecorruptions' severities follow ImageNet-C (parameters sized for 224-pixel images), "
                "applied to 32x32 images: not CIFAR-10-C's sets, and not comparable with its figures one for one")


# --- The corrupted sets: made once in their own environment, cached -----------------------------

def cache_key(images, corruptions, severities, seed, recipe_files=(GENERATOR, REQUIREMENTS)):
    """16 hex digits naming one cache: the images, the seed, the sets asked for, the generator and its pins."""
    digest = hashlib.sha256()
    digest.update(np.ascontiguousarray(images, np.uint8).tobytes())
    digest.update(repr((tuple(np.shape(images)), tuple(corruptions), tuple(severities), int(seed))).encode())
    for path in recipe_files:
        with open(path, "rb") as f:
            digest.update(hashlib.sha256(f.read()).digest())
    return digest.hexdigest()[:16]


def venv_python(log=print):
    """``bench/.venvs/corruptions/bin/python``, installed from its pins unless already installed from this very file."""
    with open(REQUIREMENTS, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    python = os.path.join(VENV, "bin", "python")
    stamp = os.path.join(VENV, ".requirements.sha256")
    if os.path.isfile(stamp) and open(stamp).read().strip() == digest:
        return python
    log(f"installing the corruptions' environment in {os.path.relpath(VENV, records.ROOT)} (first use; a minute or two)")
    if not os.path.isfile(python):
        # The base interpreter of the one running (a venv of a venv would point at ours).
        subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", VENV], check=True)
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r", REQUIREMENTS], check=True)
    with open(stamp, "w") as f:
        f.write(digest + "\n")
    return python


def run_generator(clean_path, out_path, corruptions, severities, seed, log=print):
    """bench/confidence/corruptions_generate.py in its own environment, from the images in ``clean_path`` to ``out_path``."""
    python = venv_python(log)
    log(f"making {len(corruptions)} x {len(severities)} corrupted sets (minutes; once per cache key)")
    subprocess.run([python, GENERATOR, "--input", clean_path, "--output", out_path, "--seed", str(seed),
                    "--corruptions", ",".join(corruptions), "--severities", ",".join(map(str, severities))], check=True)


def ensure_cache(images, corruptions=CORRUPTIONS, severities=SEVERITIES, seed=0, cache_dir=CACHE_DIR,
                 generate=run_generator, log=print):
    """The path of the cached sets of ``images``, made by ``generate`` only when no cache has their key."""
    path = os.path.join(cache_dir, f"corruptions-{cache_key(images, corruptions, severities, seed)}.npz")
    if os.path.isfile(path):
        return path
    os.makedirs(cache_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir) as scratch:
        clean = os.path.join(scratch, "clean.npz")
        np.savez(clean, images=np.ascontiguousarray(images, np.uint8))
        generate(clean, path, list(corruptions), list(severities), seed, log=log)
    if not os.path.isfile(path):
        raise SystemExit(f"error: the generator wrote no {path}")
    return path


def load_sets(path, corruptions, severities, shape):
    """``({(corruption, severity): images}, meta)`` from a cache; a corruption the generator could not make is absent."""
    with np.load(path) as f:
        meta = json.loads(str(f["meta"]))
        sets = {}
        for corruption in corruptions:
            if corruption in meta["not_measured"]:
                continue
            for severity in severities:
                images = f[set_name(corruption, severity)]
                if images.shape != tuple(shape) or images.dtype != np.uint8:
                    raise SystemExit(f"error: {path}: {set_name(corruption, severity)} is {images.dtype} {images.shape}, "
                                     f"not uint8 {tuple(shape)}")
                sets[corruption, severity] = images
    return sets, meta


# --- The measures ------------------------------------------------------------------------------

def foreign(outputs, threshold):
    """Which images the server answers ``in_distribution: false``: the model's verdict where it gives
    one, else its score above ``threshold``; None for a model with neither."""
    if OUTPUT_IN_DISTRIBUTION in outputs:
        return ~np.asarray(outputs[OUTPUT_IN_DISTRIBUTION], bool)
    if threshold is not None and OUTPUT_OOD_SCORE in outputs:
        return ~rules.in_distribution(outputs[OUTPUT_OOD_SCORE], threshold)
    return None


def measures(probabilities, labels, flagged):
    """One set's accuracy (with its Wilson interval), ECE, mean top probability and flagged share."""
    probabilities = np.asarray(probabilities, np.float64)
    correct = int(np.sum(probabilities.argmax(1) == labels))
    low, high = wilson(correct, len(labels))
    return {"accuracy": correct / len(labels), "wilson_95": [round(low, 4), round(high, 4)],
            "ece": rules.expected_calibration_error(probabilities, labels),
            "confidence": float(probabilities.max(1).mean()),
            "flagged": None if flagged is None else float(np.mean(flagged))}


def predict_all(predict, images, batch=BATCH):
    """``predict`` over ``images`` in batches, its outputs concatenated."""
    parts = [predict(images[i:i + batch]) for i in range(0, len(images), batch)]
    return {key: np.concatenate([np.asarray(p[key]) for p in parts]) for key in parts[0]}


def evaluate(predict, clean, sets, labels, threshold, log=print):
    """``(clean measures, {corruption: {severity: measures}}, verdicts that disagree with score > threshold)``."""
    mismatches = 0

    def one(images):
        nonlocal mismatches
        outputs = predict_all(predict, images)
        flagged = foreign(outputs, threshold)
        if flagged is not None and threshold is not None and OUTPUT_OOD_SCORE in outputs:
            mismatches += int(np.sum(flagged != ~rules.in_distribution(outputs[OUTPUT_OOD_SCORE], threshold)))
        return measures(outputs[OUTPUT_PROBABILITIES], labels, flagged)

    clean_measures = one(clean)
    by_set = {}
    for (corruption, severity), images in sets.items():
        by_set.setdefault(corruption, {})[str(severity)] = one(images)
        m = by_set[corruption][str(severity)]
        log(f"{corruption} {severity}: accuracy {m['accuracy']:.1%}, ECE {m['ece']:.3f}, flagged {_share(m['flagged'])}")
    return clean_measures, by_set, mismatches


def _mean(rows, measure):
    values = [row[measure] for row in rows]
    return None if not values or any(v is None for v in values) else float(np.mean(values))


def summarise(by_set):
    """Means of each measure: per corruption over its severities, per severity over the corruptions, and over all sets."""
    severities = sorted({s for per in by_set.values() for s in per}, key=int)
    rows = [m for per in by_set.values() for m in per.values()]
    return {
        "by_corruption": {c: {k: _mean(list(per.values()), k) for k in MEASURES} for c, per in by_set.items()},
        "by_severity": {s: {k: _mean([per[s] for per in by_set.values() if s in per], k) for k in MEASURES}
                        for s in severities},
        "all": {k: _mean(rows, k) for k in MEASURES},
    }


# --- Reporting ---------------------------------------------------------------------------------

def _share(value, digits=1):
    return "n/a" if value is None else f"{value:.{digits}%}"


def _row(label, m):
    return f"| {label} | {_share(m['accuracy'])} | {m['ece']:.3f} | {_share(m['flagged'])} |"


def tables(record):
    """The two markdown tables of a record: corruption x mean over severities, severity x mean over corruptions."""
    clean, summary = record["clean"], record["summary"]
    head = ["| {} | accuracy | ECE | flagged as foreign |", "|---|---:|---:|---:|"]
    out = [head[0].format("corruption (mean of severities 1-5)"), head[1], _row("none (clean)", clean)]
    out += [_row(c.replace("_", " "), m) for c, m in summary["by_corruption"].items()]
    out += [_row(f"**mean of {len(summary['by_corruption'])}**", summary["all"])]
    for corruption, why in record["not_measured"].items():
        out.append(f"| {corruption.replace('_', ' ')} | not measured | | |")
    out += ["", head[0].format(f"severity (mean of {len(summary['by_corruption'])} corruptions)"), head[1],
            _row("0 (clean)", clean)]
    out += [_row(s, m) for s, m in summary["by_severity"].items()]
    return "\n".join(out)


PANELS = [("accuracy", "accuracy"), ("ece", "ECE (15 bins)"), ("flagged", "flagged as foreign")]
SEVERITY_AXIS = "severity (0: clean; ImageNet-C's scale)"


def _figure(panels):
    """A row of ``panels`` on matplotlib's file backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), constrained_layout=True)


def _save(fig, path):
    import matplotlib.pyplot as plt

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _mean_curve(record, measure):
    """Severities 0 (clean) to 5 and ``measure`` at each, the mean over the corruptions."""
    severities = [0] + [int(s) for s in record["summary"]["by_severity"]]
    return severities, [record["clean"][measure]] + [record["summary"]["by_severity"][str(s)][measure]
                                                     for s in severities[1:]]


def plot(record, path):
    """Accuracy, ECE and flagged share against severity: one thin line per corruption, their mean in bold."""
    panels = PANELS if record["clean"]["flagged"] is not None else PANELS[:2]
    fig, axes = _figure(panels)
    for ax, (measure, title) in zip(axes, panels):
        severities, means = _mean_curve(record, measure)
        for corruption, per in record["sets"].items():
            ys = [record["clean"][measure]] + [per[str(s)][measure] for s in severities[1:]]
            ax.plot(severities, ys, color="0.75", linewidth=0.8)
        ax.plot(severities, means, color="C0", linewidth=2.5, marker="o", label="mean of the corruptions")
        ax.set_title(title)
        ax.set_xlabel(SEVERITY_AXIS)
        ax.set_xticks(severities)
        ax.set_ylim(0, 1 if measure != "ece" else max(0.05, 1.1 * max(
            [record["clean"][measure]] + [m[measure] for per in record["sets"].values() for m in per.values()])))
        ax.grid(alpha=0.3)
    axes[0].legend(loc="lower left", fontsize=8)
    fig.suptitle(f"{record['name']}: {record['images']} CIFAR-10 test images, imagecorruptions (grey: each corruption)",
                 fontsize=10)
    _save(fig, path)


def comparison(records):
    """One markdown table across models: each corruption's accuracy and flagged share (means over its
    severities), clean first and the mean of the corruptions last; a record's missing corruption is n/a."""
    names = [r["name"] for r in records]
    corruptions = list(dict.fromkeys(c for r in records for c in r["summary"]["by_corruption"]))
    out = ["| corruption (mean of severities 1-5) | " + " | ".join(f"{n}: accuracy / flagged" for n in names) + " |",
           "|---|" + "---:|" * len(names)]

    def cells(pick):
        return " | ".join("n/a" if m is None else f"{_share(m['accuracy'])} / {_share(m['flagged'])}"
                          for m in map(pick, records))

    out.append("| none (clean) | " + cells(lambda r: r["clean"]) + " |")
    for c in corruptions:
        out.append(f"| {c.replace('_', ' ')} | " + cells(lambda r: r["summary"]["by_corruption"].get(c)) + " |")
    out.append("| **mean of the corruptions** | " + cells(lambda r: r["summary"]["all"]) + " |")
    out.append("| ECE: clean / mean of the corruptions | "
               + " | ".join(f"{r['clean']['ece']:.3f} / {r['summary']['all']['ece']:.3f}" for r in records) + " |")
    return "\n".join(out)


def comparison_plot(records, path):
    """Accuracy, ECE and flagged share against severity, the mean of the corruptions, one line per model."""
    fig, axes = _figure(PANELS)
    for ax, (measure, title) in zip(axes, PANELS):
        for i, record in enumerate(records):
            severities, means = _mean_curve(record, measure)
            if None not in means:  # a model without a threshold has no flagged share
                ax.plot(severities, means, color=f"C{i}", linewidth=2, marker="o", label=record["name"])
        ax.set_title(title)
        ax.set_xlabel(SEVERITY_AXIS)
        ax.set_ylim(0, 1 if measure != "ece" else None)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="lower left", fontsize=7)
    fig.suptitle("imagecorruptions' 15 corruptions, mean over them, on the 1,000 original CIFAR-10 test images", fontsize=10)
    _save(fig, path)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="zip of test/<class>/ images (e.g. ../shared/data/cifar10-png.zip)")
    p.add_argument("--model-dir", required=True, help="models/NAME (its highest version) or a version directory N/")
    p.add_argument("--name", help="the model's name in the outputs, e.g. airbench_fast-h5000-png-s0 "
                                  "(default: its architecture from the published manifest)")
    p.add_argument("--runtime", default="savedmodel", help="the runtime to run the model in (default: savedmodel)")
    p.add_argument("--seed", type=int, default=0, help="seeds the corruptions (default: 0)")
    p.add_argument("--corruptions", default=",".join(CORRUPTIONS), help="comma-separated names (default: all 15)")
    p.add_argument("--severities", default=",".join(map(str, SEVERITIES)), help="comma-separated, 1 to 5 (default: all)")
    p.add_argument("--cache-dir", default=CACHE_DIR, help="where the corrupted sets are cached (default: bench/.cache)")
    p.add_argument("--json", help="the record (default: bench/records/robustness-NAME.json)")
    p.add_argument("--plot", help="the plot, a .png (default: docs/images/robustness-NAME.png; 'none' for no plot)")
    args = p.parse_args(argv)
    corruptions = [c for c in args.corruptions.split(",") if c]
    unknown = sorted(set(corruptions) - set(CORRUPTIONS))
    if unknown:
        raise SystemExit(f"error: unknown corruptions {unknown}; choose from {', '.join(CORRUPTIONS)}")
    try:
        severities = [int(s) for s in args.severities.split(",") if s]
    except ValueError:
        severities = []
    if not severities or not set(severities) <= set(SEVERITIES):
        raise SystemExit(f"error: --severities must be among 1-5, not {args.severities!r}")

    from serve.backends import published
    from serve.backends import runtimes

    version_dir = version_dir_of(args.model_dir)
    try:
        runtimes.check(args.runtime)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    manifest = published.manifest(version_dir)
    name = args.name or (manifest.model.name if manifest is not None else os.path.basename(os.path.abspath(args.model_dir)))
    threshold = manifest.confidence.ood.threshold if manifest is not None else None
    names, images, labels, classes = test_split(args.data)
    cache = ensure_cache(images, corruptions, severities, args.seed, args.cache_dir)
    sets, meta = load_sets(cache, corruptions, severities, images.shape)
    model = runtimes.load(args.runtime, version_dir)
    print(f"{len(names)} test images of {args.data}; model {version_dir} ({args.runtime}); cache {cache}")
    clean, by_set, mismatches = evaluate(model.pixels, images, sets, labels, threshold)
    record = {
        "name": name, "data": os.path.basename(args.data), "version_dir": version_dir, "runtime": args.runtime,
        "images": len(names), "corruptions": {"package": "imagecorruptions", "severities": "ImageNet-C's",
                                              "note": NOT_CIFAR10C, "seed": args.seed, "cache": os.path.basename(cache),
                                              "versions": meta["versions"]},
        "ece_bins": rules.ECE_BINS, "threshold": threshold,
        "temperature": manifest.confidence.temperature if manifest is not None else None,
        "verdicts_off_threshold": mismatches, "not_measured": meta["not_measured"],
        "clean": clean, "sets": by_set, "summary": summarise(by_set),
    }
    path = args.json or os.path.join(records.RECORDS, f"robustness-{name}.json")
    records.write(path, record, __spec__.name, argv)
    print(f"\n{name}: {NOT_CIFAR10C}\n")
    print(tables(record))
    for corruption, why in meta["not_measured"].items():
        print(f"not measured: {corruption} ({why})")
    if mismatches:
        print(f"warning: {mismatches} served verdicts differ from score > the manifest's threshold {threshold}")
    if (args.plot or "").lower() != "none":
        plot_path = args.plot or os.path.join(IMAGES_DIR, f"robustness-{name}.png")
        plot(record, plot_path)
        print(f"plot: {plot_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
