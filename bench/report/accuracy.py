"""docs/benchmarks.md's regions of accuracy. Accuracy of record: each model's runs, their seeds, and airbench against airbench94's own code."""

import numpy as np

from bench.accuracy.of_record import mcnemar, wilson
from bench.report.core import kind, pct, region, table, with_interval

INT8_GATE = 0.99  # export publishes an int8 model only at this agreement (export/litert.py)


def right(predicted):
    """Which images (in name order) ``predicted`` classed rightly: the true class is the folder of a name, ``test/<class>/N.png``."""
    return np.array([predicted[n] == n.split("/")[1] for n in sorted(predicted)])


def run_answers(rec):
    """``[{image: class}]``: each run's answers in an accuracy record (its SavedModel's) or a control's predictions."""
    return [run["predicted"] for run in rec["runs"]] if "runs" in rec else [rec["savedmodel"]["predicted"]]


def accuracy_runs(report):
    """Every run of record, from the per-image answers where a record has them, else from its counts."""
    out = []
    for name, rec in report.matching("accuracy-*"):
        base = {"record": name, "model": rec.get("model"), "holdout": rec.get("holdout"), "epochs": rec.get("epochs"),
                "seed": rec.get("seed"), "label_smoothing": rec.get("label_smoothing"), "held_out": None, "float": None, "int8": None, "int8_accuracy": None, "answers": None}
        if "runs" in rec and "predicted" not in rec["runs"][0]:
            for run in rec["runs"]:
                out.append({**base, **{k: v for k, v in run.items() if k in base}, "correct": run["correct"],
                            "images": run["images"], "float": run.get("litert_agreement"), "int8": run.get("int8_agreement")})
            continue
        for i, answers in enumerate(run_answers(rec)):
            row = {**base, "seed": rec.get("seed", i), "answers": answers, "correct": int(right(answers).sum()), "images": len(answers)}
            for runtime, key in (("litert", "float"), ("litert-int8", "int8")):
                if runtime in rec:
                    theirs = rec[runtime]["predicted"]
                    row[key] = float(np.mean([theirs[n] == answers[n] for n in answers]))
                    if key == "int8":
                        row["int8_accuracy"] = float(np.mean(right(theirs)))
            out.append(row)
    return out


def label(run):
    # airbench_muon's accuracy records all trained batch 2,000, its recipe until batch 1,000 (training-recipes).
    epochs = f", batch 2,000, {run['epochs']} epochs" if run["epochs"] and run["model"] == "airbench_muon" else ""
    smoothing = " --label-smoothing 0" if run["label_smoothing"] == 0 else ""
    return f"`{run['model']}{smoothing}`{epochs}" if "control" not in run["model"] else run["model"]


MODEL_ORDER = ("airbench", "airbench94 (control)", "airbench_fast", "airbench_muon", "seed_cnn")


def in_order(runs):
    return sorted(runs, key=lambda r: (MODEL_ORDER.index(r["model"]), r["epochs"] or 0, -(r["holdout"] or 0), r["record"], r["seed"]))


@region("accuracy")
def accuracy(report):
    rows = []
    for run in in_order(accuracy_runs(report)):
        gate = "" if run["int8"] is None or run["int8"] >= INT8_GATE else ", under the gate"
        rows.append([label(run), f"{50000 - (run['holdout'] or 0):,}", run["seed"],
                     with_interval(run["correct"] / run["images"], *wilson(run["correct"], run["images"])),
                     "" if run["held_out"] is None else pct(run["held_out"]),
                     "" if run["float"] is None else pct(run["float"]),
                     "" if run["int8"] is None else pct(run["int8"]) + gate,
                     "" if run["int8_accuracy"] is None else pct(run["int8_accuracy"]),
                     kind(report.records[run["record"]]), report.read.index(run["record"]) + 1])
    seed_cnn = [r for r in accuracy_runs(report) if r["model"] == "seed_cnn"]
    report.target("`seed_cnn`: every run ≥ 81.5%", min(r["correct"] / r["images"] for r in seed_cnn), 0.815, "{:.2%}",
                  [r["record"] for r in seed_cnn])
    return table(["model", "training images", "seed", "test accuracy (95% Wilson)", "held-out accuracy",
                  "LiteRT float32: the SavedModel's class", "LiteRT int8: the SavedModel's class", "LiteRT int8 accuracy",
                  "machine kind", "record"], rows)


def bootstrap_mean(correct, resamples=10_000, seed=0):
    """The 95% interval of the runs' mean accuracy with the test images resampled (each image's runs kept together)."""
    rng = np.random.default_rng(seed)
    n = correct.shape[1]
    means = [correct[:, rng.integers(0, n, n)].mean() for _ in range(resamples)]
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


#: Targets over seeds: (model, held out, epochs) -> (mean at least, every run at least).
SEED_TARGETS = {("airbench", None, None): (0.94, None), ("airbench_fast", None, None): (0.93, 0.925),
                ("airbench_muon", 5000, 7): (0.93, 0.925), ("airbench_muon", 5000, 10): (0.93, 0.925)}


@region("accuracy-seeds")
def accuracy_seeds(report):
    groups = {}
    for run in in_order(accuracy_runs(report)):  # seeds of one configuration on one machine kind
        groups.setdefault((run["model"], run["holdout"], run["epochs"], run["label_smoothing"],
                           kind(report.records[run["record"]])), []).append(run)
    rows = []
    for (model, holdout, epochs, _, _), runs in groups.items():
        if len(runs) < 2:
            continue
        accuracies = np.array([r["correct"] / r["images"] for r in runs])
        resampled = ""
        if all(r["answers"] is not None for r in runs):
            resampled = "{}-{}".format(*map(pct, bootstrap_mean(np.stack([right(r["answers"]) for r in runs]))))
        name = label(runs[0]) + (", `--holdout 5000`" if holdout else "")
        rows.append([name, len(runs), pct(accuracies.mean()), f"{accuracies.std(ddof=1) * 100:.2f} pt",
                     f"{pct(accuracies.min())}-{pct(accuracies.max())}", resampled, kind(report.records[runs[0]["record"]])])
        mean_at_least, each_at_least = SEED_TARGETS.get((model, holdout, epochs), (None, None))
        records_of = list(dict.fromkeys(r["record"] for r in runs))
        if mean_at_least:
            report.target(f"{name}: mean ≥ {mean_at_least:.1%} over ≥ 3 seeds", accuracies.mean(), mean_at_least, "{:.2%}", records_of)
        if each_at_least:
            report.target(f"{name}: every run ≥ {each_at_least:.1%}", accuracies.min(), each_at_least, "{:.2%}", records_of)
    report.read = []  # the accuracy table's records, listed under it
    return table(["model", "runs", "mean", "sd over seeds", "range", "95% interval of the mean, test images resampled",
                  "machine kind"], rows)


#: `airbench` as registered and without its label smoothing, each on all 50,000 images, against the control.
AIRBENCH_VARIANTS = (("`airbench`", "accuracy-airbench-png-s*"),
                     ("`airbench --label-smoothing 0`", "accuracy-airbench-smoothing0-png-s*"))


@region("airbench-control")
def airbench_control(report):
    control = {n: run_answers(r)[0] for n, r in report.matching("accuracy-airbench94-png-s*")}
    control_right = np.stack([right(a) for a in control.values()])
    summary, rows = [], []
    for name, pattern in AIRBENCH_VARIANTS:
        ours = {n: run_answers(r)[0] for n, r in report.matching(pattern)}
        ours_right = np.stack([right(a) for a in ours.values()])
        difference = ours_right.mean() - control_right.mean()
        rng = np.random.default_rng(0)
        n = ours_right.shape[1]
        samples = [ours_right[:, i].mean() - control_right[:, i].mean()
                   for i in (rng.integers(0, n, n) for _ in range(10_000))]
        low, high = np.percentile(samples, [2.5, 97.5])
        report.target(f"{name}: no more than 0.3 points below airbench94's own code", difference * 100, -0.3,
                      "{:+.2f} pt", [*ours, *control])
        summary.append([f"{name} − control ({len(ours)} seeds, {kind(report.records[next(iter(ours))])})",
                        f"{difference * 100:+.2f} pt", f"{low * 100:+.2f} to {high * 100:+.2f} pt"])
        for (a, first), (b, second) in ((x, y) for x in zip(ours, ours_right) for y in zip(control, control_right)):
            only_ours, only_control, p = mcnemar(first, second)
            rows.append([f"{name}, seed {a.split('-s')[-1]} against {b.split('-s')[-1]}", only_ours, only_control, f"{p:.2g}"])
    report.read = []  # the accuracy table's records, listed under it
    return (table(["mean accuracy", "difference", "95% interval, test images resampled"], summary) + "\n\n"
            + table(["seeds (against the control's)", "only ours right", "only the control right", "McNemar exact p"], rows))
