"""Every runtime a published version offers, against its SavedModel: the out-of-distribution score and verdict.

Typical usage::

    python -m bench.confidence.runtimes --version-dir models/airbench_muon-h5000-png-s0/cifar10/1 \\
        --data ../shared/data/cifar10-png.zip --name airbench_muon-h5000-png-s0

writes ``bench/records/ood-runtimes-NAME.json`` and prints a markdown table.

The images: the zip's test images (cifar10-png.zip: the first 1,000 of the official test split) and
every foreign set of bench/confidence/ood_sets.py. Each runtime the version publishes (``savedmodel``,
``litert``, ``litert-int8``: export leaves out a LiteRT model that fails its gate, and the record says
why) is loaded by :func:`serve.backends.runtimes.load`, the server's own loader, and answers through
its ``pixels`` call: ``probabilities``, ``ood_score`` and ``in_distribution``. TF Serving runs the
same SavedModel graph, so the SavedModel stands for it.

Per runtime: the test images and photos it flags (``in_distribution: false``), the photos AUROC of its
score against the test images (bench/confidence/ood.py's :func:`~bench.confidence.ood.detection`), the
verdicts that disagree with its own score against the manifest's threshold, and how near the threshold
its nearest score lies. Against the SavedModel: the largest and 99th-percentile absolute score
difference, the share of all images given the same verdict and the same top-1 class, the images whose
verdict differs (per set) and how far from the threshold the SavedModel's score of those lies.
"""

import argparse
import os
import sys

import numpy as np

from bench import record as records
from bench.accuracy.of_record import test_split
from bench.confidence import ood_sets
from bench.confidence.ood import detection
from bench.confidence.robustness import predict_all
from contract import OUTPUT_IN_DISTRIBUTION, OUTPUT_OOD_SCORE, OUTPUT_PROBABILITIES
from contract import confidence as rules

TEST = "test"
PHOTOS = "photos"


def own(outputs, groups, threshold):
    """One runtime's own figures: test images and photos flagged, its photos AUROC, verdicts off its score and
    threshold, and its score nearest the threshold (a runtime closer to the reference than that cannot flip a verdict)."""
    score = np.asarray(outputs[OUTPUT_OOD_SCORE], np.float64)
    flagged = ~np.asarray(outputs[OUTPUT_IN_DISTRIBUTION], bool)
    test, photos = groups == TEST, groups == PHOTOS
    off = nearest = None
    if threshold is not None:
        off = int(np.sum(flagged == rules.in_distribution(score, threshold)))
        nearest = float(np.min(np.abs(score - threshold)))
    return {"test_flagged": float(np.mean(flagged[test])), "photos_flagged": float(np.mean(flagged[photos])),
            "photos_auroc": detection(score[test], score[photos])["auroc"], "verdicts_off_threshold": off,
            "nearest_to_threshold": nearest}


def against(reference, outputs, groups, threshold):
    """``outputs`` against ``reference`` (the SavedModel's), image by image over every group."""
    ref_score = np.asarray(reference[OUTPUT_OOD_SCORE], np.float64)
    difference = np.abs(np.asarray(outputs[OUTPUT_OOD_SCORE], np.float64) - ref_score)
    differ = np.asarray(reference[OUTPUT_IN_DISTRIBUTION], bool) != np.asarray(outputs[OUTPUT_IN_DISTRIBUTION], bool)
    same_class = np.argmax(reference[OUTPUT_PROBABILITIES], 1) == np.argmax(outputs[OUTPUT_PROBABILITIES], 1)
    within = None
    if threshold is not None and differ.any():
        within = float(np.max(np.abs(ref_score[differ] - threshold)))
    return {"score_diff_max": float(difference.max()), "score_diff_p99": float(np.percentile(difference, 99)),
            "verdict_agreement": float(1 - differ.mean()), "class_agreement": float(same_class.mean()),
            "verdicts_differ": {str(g): int(np.sum(differ[groups == g])) for g in dict.fromkeys(groups)},
            "verdicts_differ_within": within}


def compare(by_runtime, groups, threshold, reference="savedmodel"):
    """``{runtime: figures}``: each runtime's own figures, and for all but ``reference`` its figures against it."""
    base = by_runtime[reference]
    return {runtime: {**own(outputs, groups, threshold),
                      **({} if runtime == reference else against(base, outputs, groups, threshold))}
            for runtime, outputs in by_runtime.items()}


def table(result):
    """The record as a markdown table, one row per runtime."""
    lines = ["| runtime | max abs score difference | p99 | same verdict | same class | test images flagged | "
             "photos flagged | photos AUROC |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for runtime, r in result["runtimes"].items():
        vs = ("reference", "", "", "") if "score_diff_max" not in r else (
            f"{r['score_diff_max']:.2g}", f"{r['score_diff_p99']:.2g}", f"{r['verdict_agreement']:.2%}",
            f"{r['class_agreement']:.2%}")
        lines.append(f"| {runtime} | {' | '.join(vs)} | {r['test_flagged']:.1%} | {r['photos_flagged']:.1%} | "
                     f"{r['photos_auroc']:.3f} |")
    for runtime, why in result["not_published"].items():
        lines.append(f"\n{runtime}: not published ({why})")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--version-dir", required=True, help="a published version, models/NAME/cifar10/N")
    p.add_argument("--data", required=True, help="zip of test/<class>/ images (e.g. ../shared/data/cifar10-png.zip)")
    p.add_argument("--name", required=True, help="the model's name in the record, e.g. airbench_muon-h5000-png-s0")
    p.add_argument("--load", help="how shared the machine was, in words, e.g. \"shared: a training run beside it\" "
                   "(default: the 1-minute load average as it started); no figure here is a time")
    p.add_argument("--json", help="the record (default: bench/records/ood-runtimes-NAME.json)")
    args = p.parse_args(argv)

    from serve.backends import published, runtimes

    manifest = published.manifest(args.version_dir)
    if manifest is None:
        raise SystemExit(f"error: {args.version_dir} has no published manifest (export it with python -m export)")
    threshold = manifest.confidence.ood.threshold
    checks = manifest.export.litert.runtimes
    not_published = {r: checks[r].reason for r in checks if not checks[r].published}
    offered = [r for r in (runtimes.SAVEDMODEL, runtimes.LITERT, runtimes.LITERT_INT8) if r not in not_published]
    _, test_images, _, _ = test_split(args.data)
    sets = {TEST: test_images, **ood_sets.make()}
    groups = np.repeat(list(sets), [len(images) for images in sets.values()])
    images = np.concatenate(list(sets.values()))
    by_runtime = {}
    for runtime in offered:
        model = runtimes.load(runtime, args.version_dir)
        by_runtime[runtime] = predict_all(model.pixels, images)
        print(f"{runtime}: {len(images)} images")
    result = {"name": args.name, "data": os.path.basename(args.data), "version_dir": args.version_dir,
              "threshold": threshold, "images": {g: len(v) for g, v in sets.items()},
              "not_published": not_published, "runtimes": compare(by_runtime, groups, threshold)}
    path = args.json or os.path.join(records.RECORDS, f"ood-runtimes-{args.name}.json")
    machine = records.machine()
    records.write(path, result, __spec__.name, argv, machine={**machine, "load": args.load or machine["load"]})
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
