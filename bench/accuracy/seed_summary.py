"""Seeds of two models on the same test images: each run, each model's mean and spread, and the
difference of the means with a 95% interval, with McNemar's test for every pair of runs.

Typical usage::

    python -m bench.accuracy.seed_summary \\
        --group airbench bench/records/airbench-png-s0.json bench/records/airbench-png-s1.json \\
        --group control bench/records/airbench94-png-s0.json bench/records/airbench94-png-s1.json

A group's files are ``python -m bench.accuracy.of_record --json`` records (``--runtime`` picks which of
their runtimes; the SavedModel by default) or ``bench/training/airbench94_reference.py --predictions`` files
(every run in them). The true class of an image is the folder of its name (``test/<class>/N.png``),
the zips' layout. Two intervals answer two questions:

* the spread over seeds (standard deviation, lowest and highest run) is how much a model's
  accuracy moves from one training run to the next;
* the 95% bootstrap interval resamples the test images, keeping each image's answers from every
  run together, so it says how much the same runs' figures would move on other test images drawn
  like these.
"""

import argparse
import json
import os
import sys

import numpy as np

from bench.accuracy.of_record import mcnemar, runs_of, wilson


def correctness(paths, runtime="savedmodel"):
    """``(run labels, image names, bool [runs, images])``: which images each run in ``paths`` classified rightly."""
    labels, runs = [], []
    for path in paths:
        found = runs_of(path, runtime)
        for i, predicted in enumerate(found):
            labels.append(os.path.basename(path) + (f"[{i}]" if len(found) > 1 else ""))
            runs.append(predicted)
    names = sorted(runs[0])
    for label, predicted in zip(labels, runs):
        if sorted(predicted) != names:
            raise SystemExit(f"error: {label} was scored on other images than {labels[0]} "
                             f"({len(predicted)} against {len(names)})")
    truth = [name.split("/")[-2] for name in names]
    right = np.array([[predicted[n] == t for n, t in zip(names, truth)] for predicted in runs])
    return labels, names, right


def bootstrap_means(rights, resamples=10_000, seed=0):
    """``[resamples, groups]``: each group's mean accuracy over its runs on each resample of the images."""
    per_image = np.stack([right.mean(0) for right in rights])  # [groups, images]
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, per_image.shape[1], size=(resamples, per_image.shape[1]))
    return np.stack([per_image[g][picks].mean(1) for g in range(len(rights))], axis=1)


def summarise(groups, runtime="savedmodel", resamples=10_000):
    """The report for ``{name: [paths]}``: runs, each group's statistics, and each pair's difference."""
    named = {name: correctness(paths, runtime) for name, paths in groups.items()}
    image_sets = {name: names for name, (_, names, _) in named.items()}
    first = next(iter(image_sets.values()))
    for name, names in image_sets.items():
        if names != first:
            raise SystemExit(f"error: group {name} was scored on other images than the first group")
    report = {"images": len(first), "runtime": runtime, "groups": {}, "differences": []}
    means = bootstrap_means([right for _, _, right in named.values()], resamples)
    for g, (name, (labels, _, right)) in enumerate(named.items()):
        accuracies = right.mean(1)
        report["groups"][name] = {
            "runs": [{"run": label, "accuracy": float(a), "correct": int(r.sum()),
                      "wilson_95": [round(x, 4) for x in wilson(int(r.sum()), r.size)]}
                     for label, a, r in zip(labels, accuracies, right)],
            "mean": float(accuracies.mean()),
            "sd": float(accuracies.std(ddof=1)) if len(accuracies) > 1 else None,
            "range": [float(accuracies.min()), float(accuracies.max())],
            "bootstrap_95": [float(x) for x in np.percentile(means[:, g], [2.5, 97.5])],
        }
    names = list(named)
    for a in range(len(names)):
        for b in range(a + 1, len(names)):
            first_labels, _, first_right = named[names[a]]
            second_labels, _, second_right = named[names[b]]
            difference = means[:, a] - means[:, b]
            report["differences"].append({
                "first": names[a], "second": names[b],
                "difference": report["groups"][names[a]]["mean"] - report["groups"][names[b]]["mean"],
                "bootstrap_95": [float(x) for x in np.percentile(difference, [2.5, 97.5])],
                "mcnemar": [dict(zip(("first", "second", "only_first_right", "only_second_right", "p"),
                                     (x, y, *mcnemar(rx, ry))))
                            for x, rx in zip(first_labels, first_right)
                            for y, ry in zip(second_labels, second_right)],
            })
    return report


def print_report(report):
    print(f"{report['images']} test images; runtime {report['runtime']} where a report holds several")
    print("| model | run | accuracy | 95% Wilson interval |")
    print("|---|---|---:|---|")
    for name, group in report["groups"].items():
        for run in group["runs"]:
            low, high = run["wilson_95"]
            print(f"| {name} | {run['run']} | {run['accuracy']:.2%} | {low:.2%} - {high:.2%} |")
    for name, group in report["groups"].items():
        sd = f"sd {group['sd']:.2%}, " if group["sd"] is not None else ""
        low, high = group["bootstrap_95"]
        runs = len(group["runs"])
        print(f"{name}: mean {group['mean']:.2%} over {runs} run{'s' * (runs > 1)} ({sd}"
              f"range {group['range'][0]:.2%} - {group['range'][1]:.2%}); images resampled: {low:.2%} - {high:.2%}")
    for d in report["differences"]:
        low, high = d["bootstrap_95"]
        print(f"{d['first']} - {d['second']}: {d['difference'] * 100:+.2f} points "
              f"(images resampled: {low * 100:+.2f} to {high * 100:+.2f})")
        for m in d["mcnemar"]:
            print(f"  {m['first']} vs {m['second']}: only the first right {m['only_first_right']}, "
                  f"only the second right {m['only_second_right']}, McNemar exact p = {m['p']:.3g}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--group", nargs="+", action="append", required=True, metavar=("NAME", "FILE"),
                   help="a model's name and its runs' predictions files; give two or more groups to compare them")
    p.add_argument("--runtime", default="savedmodel", help="which runtime's answers to read from bench.accuracy.of_record records")
    p.add_argument("--resamples", type=int, default=10_000)
    p.add_argument("--json", help="write the summary here (derived from the records: not a record itself)")
    args = p.parse_args(argv)
    groups = {}
    for name, *paths in args.group:
        if not paths:
            p.error(f"--group {name} names no predictions file")
        missing = [path for path in paths if not os.path.isfile(path)]
        if missing:
            p.error(f"no such file: {missing[0]}")
        if name in groups:
            p.error(f"two groups are named {name}")
        groups[name] = paths
    report = summarise(groups, args.runtime, args.resamples)
    print_report(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
