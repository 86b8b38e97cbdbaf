"""Calibration and out-of-distribution detection of a trained model, on images it never saw.

Typical usage::

    python -m bench.confidence.ood --run runs/airbench-png-s0 --data ../shared/data/cifar10-png.zip \\
        --version-dir models/airbench-png/cifar10/1 --json bench/records/ood-airbench-png-s0.json

In distribution: the zip's test images (cifar10-png.zip: the first 1,000 of the official test
split, original pixels). Out of distribution: every set of bench/confidence/ood_sets.py. The logits come from
the run's weights, rebuilt with the registry's builder (export proves its graphs give the same);
from them, for each set against the test images:

* AUROC and the false-positive rate at 95% true-positive rate (the share of the set that passes the
  threshold at which 95% of the test images pass) of three scores: the energy (-logsumexp of the
  logits, what export serves: contract.confidence), the maximum logit, and the plain maximum
  probability (softmax at temperature 1: the baseline, what a model without a score offers);
* the share flagged by the threshold export chose on held-out training images (``--version-dir``);
  for the test images, that share is the in-distribution images wrongly flagged;
* the verdict at other pass rates (:data:`PASS_RATES`), when the run kept a held-out slice: the
  threshold fitted on it as export fits it, the test images flagged (false alarms, with their Wilson
  interval) and each set's share flagged, so the served rate can be chosen by what users see.

And calibration on the test images: negative log-likelihood and expected calibration error (15
bins) at temperature 1 and at the exported temperature, each with a 95% interval (percentile
bootstrap over the test images, 1,000 resamples), with the accuracy; the share of test images
flagged has its Wilson interval.
"""

import argparse
import os
import sys

import numpy as np

from bench import record
from bench.accuracy.of_record import test_split, wilson
from bench.confidence import ood_sets
from contract import ASSETS_EXTRA, MANIFEST_FILE, WEIGHTS_FILE
from contract import confidence as rules
from contract import manifest as manifests
from contract import published as publications

#: name -> score of each image from its logits; higher means more foreign.
SCORES = {
    "energy": rules.score,
    "max_logit": lambda z: -np.max(z, axis=1),
    "max_probability": lambda z: -np.max(rules.softmax(z), axis=1),
}


#: Pass rates of the held-out images at which the verdict is measured: 5%, 2% and 1% false alarms.
PASS_RATES = (0.95, 0.98, 0.99)


def load_run(run_dir):
    """``(manifest, model)``: the run's :class:`contract.manifest.Manifest` and its model rebuilt by the registry's builder, with its weights, float32."""
    import keras

    from train import models

    manifest = manifests.read(os.path.join(run_dir, MANIFEST_FILE))
    keras.mixed_precision.set_global_policy("float32")
    model = models.build_model(manifest.model.name, manifest.num_classes, **manifest.model.kwargs)
    model.load_weights(os.path.join(run_dir, WEIGHTS_FILE))
    return manifest, model


def batched(model, images, batch=250):
    """``model``'s float64 outputs for uint8 ``images``, ``batch`` at a time."""
    return np.concatenate([np.asarray(model(images[i:i + batch].astype(np.float32), training=False), np.float64)
                           for i in range(0, len(images), batch)])


def run_logits(run_dir):
    """``(manifest, function)``: the function maps uint8 images to float64 logits of the run's model."""
    from train import models

    manifest, model = load_run(run_dir)
    logits_model = models.logits_model(model)
    return manifest, lambda images: batched(logits_model, images)


def detection(inside, outside):
    from sklearn.metrics import roc_auc_score

    labels = np.concatenate([np.zeros(len(inside)), np.ones(len(outside))])
    return {"auroc": float(roc_auc_score(labels, np.concatenate([inside, outside]))),
            "fpr_at_95_tpr": float(np.mean(outside <= rules.threshold_for(inside, 0.95)))}


def bootstrap_interval(statistic, logits, labels, resamples=1000, seed=0):
    """95% percentile-bootstrap interval of ``statistic(logits, labels)`` over resamples of the images."""
    rng = np.random.default_rng(seed)
    n = len(labels)
    values = [statistic(logits[i], labels[i]) for i in (rng.integers(0, n, n) for _ in range(resamples))]
    return [float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))]


def calibration(test_z, test_labels, temperature):
    """NLL and ECE (15 bins) at temperature 1 and at ``temperature``, each with its bootstrap interval."""
    def nll_at(t):
        return lambda z, y: rules.nll(z, y, t)

    def ece_at(t):
        return lambda z, y: rules.expected_calibration_error(rules.softmax(z, t), y)

    result = {"temperature": temperature}
    for name, at in (("nll", nll_at), ("ece", ece_at)):
        before, after = at(1.0), at(temperature)
        result[name] = {"before": before(test_z, test_labels), "after": after(test_z, test_labels),
                        "interval_95": {"before": bootstrap_interval(before, test_z, test_labels),
                                        "after": bootstrap_interval(after, test_z, test_labels)}}
    return result


def verdicts(held_out_scores, test_scores, set_scores, pass_rates=PASS_RATES):
    """Per pass rate: the threshold fitted on ``held_out_scores``, the share of test images and of each set flagged."""
    result = {}
    for rate in pass_rates:
        threshold = rules.threshold_for(held_out_scores, rate)
        flagged = int(np.sum(test_scores > threshold))
        result[f"{rate:g}"] = {
            "threshold": threshold,
            "test_flagged": flagged / len(test_scores),
            "test_flagged_interval_95": list(wilson(flagged, len(test_scores))),
            "sets": {name: float(np.mean(scores > threshold)) for name, scores in set_scores.items()}}
    return result


def measure(logits, test_images, test_labels, sets, exported=None, held_out_images=None):
    """``exported``: the version's :class:`contract.published.Confidence`, or None for temperature 1 and no threshold;
    ``held_out_images``: the run's held-out slice, for :func:`verdicts`."""
    test_z = logits(test_images)
    temperature = exported.temperature if exported is not None else 1.0
    threshold = exported.ood.threshold if exported is not None else None
    flagged = None if threshold is None else int(np.sum(rules.score(test_z) > threshold))
    result = {
        "test_images": int(len(test_labels)),
        "accuracy": float(np.mean(test_z.argmax(axis=1) == test_labels)),
        "calibration": calibration(test_z, test_labels, temperature),
        "threshold": threshold,
        "test_flagged": None if flagged is None else flagged / len(test_labels),
        "test_flagged_interval_95": None if flagged is None else list(wilson(flagged, len(test_labels))),
        "sets": {},
    }
    inside = {name: fn(test_z) for name, fn in SCORES.items()}
    energies = {}
    for name, images in sets.items():
        z = logits(images)
        energies[name] = rules.score(z)
        entry = {"images": int(len(images))}
        for score_name, fn in SCORES.items():
            entry[score_name] = detection(inside[score_name], fn(z))
        entry["flagged"] = None if threshold is None else float(np.mean(energies[name] > threshold))
        result["sets"][name] = entry
    if held_out_images is not None:
        result["verdicts"] = verdicts(rules.score(logits(held_out_images)), inside["energy"], energies)
    return result


def table(result):
    lines = ["| set | images | energy AUROC | max-logit AUROC | max-probability AUROC | energy FPR@95 | "
             "max-probability FPR@95 | flagged by the exported threshold |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, e in result["sets"].items():
        flagged = "n/a" if e["flagged"] is None else f"{e['flagged']:.1%}"
        lines.append(f"| {name} | {e['images']} | {e['energy']['auroc']:.3f} | {e['max_logit']['auroc']:.3f} | "
                     f"{e['max_probability']['auroc']:.3f} | {e['energy']['fpr_at_95_tpr']:.1%} | "
                     f"{e['max_probability']['fpr_at_95_tpr']:.1%} | {flagged} |")
    c = result["calibration"]
    flagged = "n/a"
    if result["test_flagged"] is not None:
        low, high = result["test_flagged_interval_95"]
        flagged = f"{result['test_flagged']:.1%} ({low:.1%}-{high:.1%})"

    def figure(name, when):
        low, high = c[name]["interval_95"][when]
        return f"{c[name][when]:.4f} ({low:.4f}-{high:.4f})"

    if "verdicts" in result:
        lines += ["", "| held-out images passing | test images flagged (95% Wilson) | "
                  + " | ".join(result["sets"]) + " |", "|---:|---:|" + "---:|" * len(result["sets"])]
        for rate, v in result["verdicts"].items():
            low, high = v["test_flagged_interval_95"]
            lines.append(f"| {float(rate):.0%} | {v['test_flagged']:.1%} ({low:.1%}-{high:.1%}) | "
                         + " | ".join(f"{share:.1%}" for share in v["sets"].values()) + " |")
    lines.append(f"\ntest images: {result['test_images']}, accuracy {result['accuracy']:.2%}, flagged {flagged}; "
                 f"temperature {c['temperature']:.4f}: NLL {figure('nll', 'before')} -> {figure('nll', 'after')}, "
                 f"ECE {figure('ece', 'before')} -> {figure('ece', 'after')} (95% intervals: Wilson; bootstrap)")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="a finished training run (weights and manifest)")
    parser.add_argument("--data", required=True, help="zip whose test/<class>/* images are the in-distribution set")
    parser.add_argument("--version-dir", help="the run's exported version: its temperature and threshold")
    parser.add_argument("--json", help="write the record here (bench/records/NAME.json)")
    args = parser.parse_args(argv)
    exported = None
    if args.version_dir:
        exported = publications.read_published(os.path.join(args.version_dir, ASSETS_EXTRA, MANIFEST_FILE)).confidence
    manifest, logits = run_logits(args.run)
    _, images, labels, classes = test_split(args.data)
    if classes != manifest.class_names:
        parser.error(f"the zip's classes {classes} are not the model's {manifest.class_names}")
    held_out = None
    if manifest.holdout is not None:
        from export import read_images

        held_out, _ = read_images(args.run, manifest.holdout)
    result = measure(logits, images, labels, ood_sets.make(), exported, held_out)
    result.update(run=os.path.abspath(args.run), data=os.path.basename(args.data), version_dir=args.version_dir)
    print(table(result))
    if args.json:
        record.write(args.json, result, __spec__.name, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
