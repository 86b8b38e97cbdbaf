"""docs/benchmarks.md's regions of training. Training: the GELU kernels, airbench_muon's recipe runs and the main job's timings."""

import fnmatch
import statistics

from bench.accuracy.of_record import wilson
from bench.report.core import cell, generic, kind, pct, region, table, with_interval


@region("gelu")
def gelu(report):
    step = generic(report, "training-gelu-step")
    rec = report["training-gelu-epochs"]
    rows = [[run["gelu"], *(f"{s:.1f}" for s in run["epoch_seconds"])] for run in rec["runs"]]
    return step + "\n\n" + table(["whole epochs, alternating runs (the GELU)", "epoch 1 (s)", "epoch 2 (s)"], rows)


def recipe_label(recipe, usual_rate):
    """``batch 1,000, 10 epochs``, and what else the run changed: its rate against ``usual_rate``, its jitter,
    corruption, JPEG and outliers."""
    text = f"batch {recipe['batch_size']:,}, {recipe['epochs']} epochs"
    if recipe["learning_rate"] != usual_rate:
        text += f", rate × {recipe['learning_rate'] / usual_rate:g}"
    if recipe.get("jitter_brightness") or recipe.get("jitter_contrast"):
        text += f", brightness ± {recipe['jitter_brightness']:g} and contrast ± {recipe['jitter_contrast']:g} jittered"
    share, noise, blur = recipe.get("corrupt_fraction"), recipe.get("corrupt_noise"), recipe.get("corrupt_blur")
    if share and noise and blur:
        text += f", {share:.0%} of each batch corrupted (noise ≤ {noise:g}, blur ≤ {blur:g} px)"
    elif share and (noise or blur):  # half the chosen images get the corruption that is on; the rest pass as they are
        only = f"noisy (noise ≤ {noise:g})" if noise else f"blurred (blur ≤ {blur:g} px)"
        text += f", {share / 2:.0%} of each batch {only}"
    if recipe.get("jpeg_fraction"):
        text += f", {recipe['jpeg_fraction']:.0%} re-encoded as JPEG (quality {recipe['jpeg_quality']}-95)"
    if recipe.get("outlier_fraction"):
        text += f", {recipe['outlier_fraction']:.0%} outliers (weight {recipe['outlier_weight']:g})"
    return text


def runnable(shares, rec):
    """vmstat's median of runnable processes over a span, against the machine's cores ("not logged" without vmstat)."""
    return "not logged" if shares is None else f"{shares['r']['median']:g} on {rec['machine']['cores']} cores"


#: airbench_muon's recipe (train/airbench.py) and the clean one before it (the runs that chose it, and the
#: same recipe run again as the corruption runs' controls): their records' names, and the targets over runs.
MUON_RECIPE = ("training-airbench_muon-b1000-e12-c10-s*",)
#: The same recipe on another machine kind (AVX-512 BF16 without AMX): labelled as the recipe, its means apart.
MUON_RECIPE_ELSEWHERE = ("training-airbench_muon-epyc-b1000-e12-c10-s*",)
MUON_CLEAN = ("training-airbench_muon-b1000-e10-s*", "training-airbench_muon-b1000-e10-control-s*")
#: The recipe cut to the epochs the main job's time budget trains on the AVX2 kind (3 to 6: docs, the main job),
#: as the mean rows' (patterns, what).
MUON_CUT = tuple(((f"training-airbench_muon-epyc-b1000-e{epochs}-c10-s*",),
                  f"its recipe cut to {epochs} epochs, as the main job's budget on AVX2") for epochs in (6, 3))
MUON_MEAN, MUON_EVERY = 0.93, 0.925


def recipe_runs(report, patterns=MUON_RECIPE):
    """``[(name, record)]`` of every run of airbench_muon's recipe (or of ``patterns``)."""
    return [run for pattern in patterns for run in report.matching(pattern)]


@region("training-recipes")
def training_recipes(report):
    runs = report.matching("training-airbench_muon-*")
    usual_rate = statistics.mode(rec["recipe"]["learning_rate"] for _, rec in runs)
    order = lambda run: (run[1]["recipe"]["epochs"], -run[1]["recipe"]["batch_size"],  # noqa: E731
                         run[1]["recipe"].get("corrupt_fraction") or 0, run[1]["recipe"].get("jpeg_fraction") or 0,
                         run[1]["recipe"].get("outlier_fraction") or 0, run[1]["recipe"].get("jitter_brightness") or 0,
                         -run[1]["recipe"]["learning_rate"], run[1]["machine"]["kind"], run[1]["seed"])
    rows = []
    for name, rec in sorted(runs, key=order):
        correct = round(rec["test_accuracy"] * rec["test_images"])
        mine = any(fnmatch.fnmatch(name, pattern) for pattern in MUON_RECIPE + MUON_RECIPE_ELSEWHERE)
        rows.append([recipe_label(rec["recipe"], usual_rate) + (" (the recipe)" if mine else ""),
                     rec["seed"], pct(rec["heldout_accuracy"]),
                     with_interval(rec["test_accuracy"], *wilson(correct, rec["test_images"]), digits=1),
                     f"{rec['training_wall_time_s']:,.0f}", kind(rec), runnable(rec.get("vmstat"), rec),
                     report.read.index(name) + 1])
    for patterns, what in ((MUON_RECIPE, "its recipe (batch 1,000, 12 epochs, 10% corrupted)"),
                           (MUON_RECIPE_ELSEWHERE, "its recipe on AVX-512 BF16 without AMX"),
                           (MUON_CLEAN, "the clean recipe before it (batch 1,000, 10 epochs)"), *MUON_CUT):
        runs = recipe_runs(report, patterns)
        test = [rec["test_accuracy"] for _, rec in runs]
        held = [rec["heldout_accuracy"] for _, rec in runs]
        rows.append([f"{what}: mean of {len(runs)} runs (lowest)", "", f"{pct(statistics.mean(held))} ({pct(min(held))})",
                     f"{pct(statistics.mean(test))} ({pct(min(test))})", "", "", "", ""])
        names = [n for n, _ in runs]
        report.target(f"`airbench_muon`, {what}: mean of {len(runs)} runs ≥ {MUON_MEAN:.1%}",
                      statistics.mean(test), MUON_MEAN, "{:.2%}", names)
        report.target(f"`airbench_muon`, {what}: every run ≥ {MUON_EVERY:.1%}", min(test), MUON_EVERY, "{:.2%}", names)
    return table(["`airbench_muon`, `--holdout 5000`", "seed", "held-out accuracy (5,000)",
                  "test accuracy, 95% Wilson (1,000)", "training (s)", "machine kind", "runnable processes (vmstat r, median)",
                  "record"], rows)


@region("training-main-job")
def training_main_job(report):
    rows, whole = [], None
    for name, rec in report.matching("training-main-job-*"):
        budget, seconds = rec["training"]["budget"], rec["seconds"]
        correct = round(rec["test_accuracy"] * rec["test_images"])
        cells = [cell(seconds.get(stage), "{:,.1f}") for stage in ("train", "export", "serve_until_ready", "whole")]
        default = budget and "TIME_BUDGET" not in rec["job_env"]
        rows.append([f"`{rec['job_env'].get('MODEL', 'airbench_muon')}`",
                     f"{budget['seconds']:g} s" + (" (the default)" if default else "") if budget else "none (`TIME_BUDGET=0`)",
                     f"{rec['training']['epochs']}" + (f" (the budget predicted {budget['predicted_s']:.0f} s)" if budget else ""),
                     *(c or "not timed" for c in cells),
                     with_interval(rec["test_accuracy"], *wilson(correct, rec["test_images"]), digits=1), kind(rec),
                     runnable(rec["vmstat"].get("whole") or rec["vmstat"]["train"], rec), report.read.index(name) + 1])
        if default and rec["machine"]["kind"] == "avx512-bf16-amx":
            whole = (name, seconds["whole"])
    if whole:
        report.target("the whole main job ≤ 600 s on AVX-512 BF16 + AMX (install excluded)", whole[1], 600, "{:.0f} s",
                      [whole[0]], at_least=False)
    return table(["`MODEL`", "training budget", "epochs trained", "train (s)", "export (s)", "serve until ready (s)", "whole (s)",
                  "test accuracy, 95% Wilson (1,000)", "machine kind", "runnable processes (vmstat r, median)", "record"], rows)
