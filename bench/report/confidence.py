"""docs/benchmarks.md's regions of confidence. Calibration and out-of-distribution detection: the served energy
per set, the verdict at each pass rate, in every runtime, in the trials against the recipe and on what users send
(the scores beyond it: bench.report.scores)."""

import statistics

from bench.report.core import kind, pct, region, table, with_interval
from contract import confidence as rules
from export.litert import SCORE_TOLERANCE

SETS = ("photos", "textures", "digits", "text", "noise", "gradients", "flat")


def energy_row(label, rec):
    """A run's served-energy AUROC on each set, the test images it flags, and the sets where it beats the maximum probability."""
    sets = rec["sets"]
    beats = sum(sets[s]["energy"]["auroc"] > sets[s]["max_probability"]["auroc"] for s in SETS)
    flagged = "" if rec.get("test_flagged") is None else pct(rec["test_flagged"], 1)
    return [label, *(f"{sets[s]['energy']['auroc']:.3f}" for s in SETS), flagged, f"{beats} of {len(SETS)}"]


ENERGY_COLUMNS = ["served energy, AUROC", *SETS, "test images flagged", "sets above the maximum probability"]


@region("ood-muon")
def ood_muon(report):
    rows, photos, ten, recipe, clean = [], [], [], [], []
    groups = (("batch 1,000, 12 epochs, 10% corrupted (the recipe), seed {}", VERDICTS, recipe),
              ("batch 1,000, 10 epochs, seed {}", CLEAN_VERDICTS, clean),
              ("batch 2,000, 7 epochs, seed {}", "ood-airbench_muon-fusedgelu-h5000-png-s*", photos),
              ("batch 2,000, 10 epochs, seed {}", "ood-airbench_muon-10epochs-h5000-png-s*", ten))
    for label, pattern, collected in groups:
        for name, rec in report.matching(pattern):
            rows.append(energy_row(label.format(name[-1]), rec))
            collected.append(rec["sets"]["photos"]["energy"]["auroc"])
    smoothing = report["ood-airbench_muon-h5000-png-s0"]
    rows.append(energy_row("with label smoothing 0.2 (the earlier recipe), seed 0", smoothing))
    logitnorm = report["ood-airbench_muon-logitnorm-h5000-png-s0"]
    rows.append(energy_row(f"LogitNorm 0.04, SGD rate ÷ 10, seed 0 (accuracy {pct(logitnorm['accuracy'])})", logitnorm))
    report.target("`airbench_muon`, its recipe: photos AUROC ≥ 0.95 (mean over seeds)", statistics.mean(recipe),
                  0.95, "{:.3f}", [n for n, _ in report.matching(VERDICTS)])
    report.target("`airbench_muon`, batch 1,000, 10 epochs (clean): photos AUROC ≥ 0.95 (mean over seeds)",
                  statistics.mean(clean), 0.95, "{:.3f}", [n for n, _ in report.matching(CLEAN_VERDICTS)])
    names = [n for n, _ in report.matching("ood-airbench_muon-fusedgelu-h5000-png-s*")]
    report.target("`airbench_muon`, batch 2,000, 7 epochs: photos AUROC ≥ 0.95 (mean over seeds)", statistics.mean(photos),
                  0.95, "{:.3f}", names)
    names = [n for n, _ in report.matching("ood-airbench_muon-10epochs-h5000-png-s*")]
    report.target("`airbench_muon`, batch 2,000, 10 epochs: photos AUROC ≥ 0.95 (mean over seeds)", statistics.mean(ten),
                  0.95, "{:.3f}", names)
    return table(ENERGY_COLUMNS, rows)


#: The served energy's records of the recipe's runs, and of the clean recipe before it (batch 1,000, 10 epochs).
VERDICTS, CLEAN_VERDICTS = "ood-verdicts-airbench_muon-b1000-e12-c10-h5000-png-s*", "ood-verdicts-airbench_muon-h5000-png-s*"


@region("ood-verdicts")
def ood_verdicts(report):
    """The verdict at each pass rate of the held-out images: test images and each set's images flagged, mean of the seeds."""
    found = report.matching(VERDICTS)
    rates = list(found[0][1]["verdicts"])
    rows = []
    for rate in rates:
        at = [rec["verdicts"][rate] for _, rec in found]
        tests = " / ".join(pct(v["test_flagged"], 1) for v in at)
        served = " (served)" if float(rate) == rules.PASS_RATE else ""
        rows.append([f"{float(rate):.0%}{served}", tests,
                     *(pct(statistics.mean(v["sets"][s] for v in at), 1) for s in SETS)])
        if served:
            report.target("real images called foreign ≤ 2% at the served threshold (mean over seeds)",
                          statistics.mean(v["test_flagged"] for v in at), 0.02, "{:.1%}",
                          [n for n, _ in found], at_least=False)
    return table(["held-out images passing", "test images flagged, per seed", *(f"{s} flagged" for s in SETS)], rows)


#: Each runtime against the SavedModel, per group of runs: its name in the table, its records, and whether its
#: int8 models are export's own (dynamic-range), rather than the full-integer int8 calibrated on the training
#: sample that export made before. Only export's own count toward the int8 target.
RUNTIMES = (("the recipe, AVX-512 BF16", "ood-runtimes-airbench_muon-epyc-b1000-e12-c10-h5000-png-s*", True),
            ("the wider net, AVX-512 BF16", "ood-runtimes-airbench_muon_wide-e7-h5000-png-s*", True),
            ("the recipe, AVX-512 BF16, int8 calibrated", "ood-runtimes-int8-calibrated-epyc-*", False),
            ("`seed_cnn`, AVX-512 BF16", "ood-runtimes-seed_cnn-h5000-png-s*", True),
            ("`seed_cnn`, AVX-512 BF16, int8 calibrated", "ood-runtimes-int8-calibrated-seed_cnn-s*", False),
            ("the recipe, AMX, int8 calibrated", "ood-runtimes-airbench_muon-b1000-e12-c10-h5000-png-s*", False),
            ("clean, 10 epochs, AMX", "ood-runtimes-airbench_muon-h5000-png-s*", False))


@region("ood-runtimes")
def ood_runtimes(report):
    """Each runtime a version publishes against its SavedModel, per run: score differences, verdicts, classes, flagged shares."""
    rows, refused, against = [], [], {}
    for model, pattern, current in RUNTIMES:
        for name, rec in report.matching(pattern):
            for runtime, r in rec["runtimes"].items():
                vs = ["", "", "", ""] if "score_diff_max" not in r else [
                    f"{r['score_diff_max']:.1e}", f"{r['score_diff_p99']:.1e}", pct(r["verdict_agreement"]),
                    pct(r["class_agreement"])]
                if "score_diff_max" in r and (current or runtime != "litert-int8"):
                    against.setdefault(runtime, []).append((name, r))
                label = "`savedmodel` (and TF Serving)" if runtime == "savedmodel" else f"`{runtime}`"
                rows.append([model, name[-1], label, *vs, pct(r["test_flagged"], 1), pct(r["photos_flagged"], 1),
                             f"{r['photos_auroc']:.3f}", f"{r['nearest_to_threshold']:.1e}"])
            refused += [f"- {model}, seed {name[-1]}: `{runtime}` is not published: {why}."
                        for runtime, why in rec["not_published"].items()]
    for runtime, gate, tolerance in (("litert", 1.0, SCORE_TOLERANCE), ("litert-int8", 0.99, None)):
        names, got = [n for n, _ in against.get(runtime, [])], [r for _, r in against.get(runtime, [])]
        if not got:
            continue
        report.target(f"`{runtime}`: the SavedModel's verdict on {'every image' if gate == 1 else f'≥ {gate:.0%} of the images'} "
                      "(the least over runs)", min(r["verdict_agreement"] for r in got), gate, "{:.2%}", names)
        if tolerance:
            report.target(f"`{runtime}`: the SavedModel's `ood_score` within export's tolerance (the largest difference over runs)",
                          max(r["score_diff_max"] for r in got), tolerance, "{:.1e}", names, at_least=False)
    columns = ["model", "seed", "runtime", "largest score difference", "p99", "same verdict", "same class",
               "test images flagged", "photos flagged", "photos AUROC", "score nearest the threshold"]
    return "\n\n".join([table(columns, rows), *(["\n".join(refused)] if refused else [])])


@region("ood-airbench")
def ood_airbench(report):
    rows = []
    airbench = report.matching("ood-airbench-*")
    for measure, at_least, pick in (("photos", 0.95, min), ("textures", 0.95, min)):
        report.target(f"`airbench`: {measure} AUROC ≥ 0.95 in every model", pick(r["sets"][measure]["energy"]["auroc"] for _, r in airbench),
                      at_least, "{:.3f}", [n for n, _ in airbench])
    beats = min(sum(r["sets"][s]["energy"]["auroc"] > r["sets"][s]["max_probability"]["auroc"] for s in SETS) for _, r in airbench)
    report.target("`airbench`: the energy above the maximum probability on every set, every model", beats, len(SETS),
                  "{} of 7 sets", [n for n, _ in airbench])
    for name, rec in [*airbench, *report.matching("ood-seed_cnn-*")]:
        model, rest = name[4:].split("-", 1)
        rows.append(energy_row(f"`{model}`, seed {rest[-1]}{', `--holdout 5000`' if 'h5000' in rest else ''}", rec))
        if name == "ood-seed_cnn-h5000-png-s0":
            beats = sum(rec["sets"][s]["energy"]["auroc"] > rec["sets"][s]["max_probability"]["auroc"] for s in SETS)
            report.target("`seed_cnn`: the energy above the maximum probability on every set", beats, len(SETS),
                          "{} of 7 sets", [name])
    return table(ENERGY_COLUMNS, rows)


#: `airbench` with its recipe's label smoothing (0.2, airbench94's) and without, trained on one machine with
#: ``--holdout 5000``: each run's training record (``training-airbench-TAG-sN``) and served energy
#: (``ood-verdicts-airbench-TAG-h5000-png-sN``).
SMOOTHING = (("label smoothing 0.2 (its recipe)", "smoothing20"), ("no label smoothing", "smoothing0"))
SMOOTHING_COLUMNS = {"heldout": pct, "test": lambda x: pct(x, 1), **{s: "{:.3f}".format for s in SETS},
                     "flagged": lambda x: pct(x, 1), "photos_flagged": lambda x: pct(x, 1)}


def _served_run(train, energy, sets):
    """A run's figures from its training record and its served energy (``bench.confidence.ood``): accuracy,
    the AUROC on each of ``sets``, and the test images and photos flagged at the served pass rate."""
    served = energy["verdicts"][str(rules.PASS_RATE)]
    return {"seed": train["seed"], "kind": kind(train), "heldout": train["heldout_accuracy"], "test": train["test_accuracy"],
            **{s: energy["sets"][s]["energy"]["auroc"] for s in sets},
            "flagged": served["test_flagged"], "photos_flagged": served["sets"]["photos"]}


def _seed_rows(groups, columns):
    """Table rows: each group's runs (``[(label, runs)]``), then its mean where it has several seeds; a
    figure a run lacks (None) is blank, and so is a mean over it."""
    rows = []
    for label, runs in groups:
        for run in runs:
            rows.append([label, run["seed"], *("" if run[k] is None else fmt(run[k]) for k, fmt in columns.items()),
                         run["kind"]])
        if len(runs) > 1:
            rows.append([f"{label}: mean of {len(runs)} seeds", "", *(
                "" if None in (values := [run[k] for run in runs]) else fmt(statistics.mean(values))
                for k, fmt in columns.items()), ""])
    return rows


def _mean(runs, key):
    return statistics.mean(run[key] for run in runs)


@region("airbench-smoothing")
def airbench_smoothing(report):
    """`airbench` with and without label smoothing, run by run, with each group's mean."""
    groups = {tag: [_served_run(train, report[f"ood-verdicts-airbench-{tag}-h5000-png-s{train['seed']}"], SETS)
                    for _, train in report.matching(f"training-airbench-{tag}-s*")] for _, tag in SMOOTHING}
    smoothed, plain = groups["smoothing20"], groups["smoothing0"]
    names = [n for n, _ in report.matching("ood-verdicts-airbench-smoothing0-h5000-png-s*")]
    report.target("`airbench` without label smoothing: photos AUROC ≥ 0.95 (mean over seeds)", _mean(plain, "photos"), 0.95,
                  "{:.3f}", names)
    report.target("`airbench` without label smoothing: no set's AUROC below the smoothed runs' (means over seeds)",
                  sum(_mean(plain, s) < _mean(smoothed, s) for s in SETS), 0, "{} of 7 below", names, at_least=False)
    report.target("`airbench` without label smoothing: ≤ 0.3 points of held-out accuracy lost (mean over seeds)",
                  (_mean(plain, "heldout") - _mean(smoothed, "heldout")) * 100, -0.3, "{:+.2f} pt",
                  [n for n, _ in report.matching("training-airbench-smoothing0-s*")])
    rows = _seed_rows([(label, groups[tag]) for label, tag in SMOOTHING], SMOOTHING_COLUMNS)
    return table(["`airbench`, `--holdout 5000`", "seed", "held-out accuracy (5,000)", "test accuracy (1,000)",
                  *(f"{s} AUROC" for s in SETS), "test images flagged", "photos flagged", "machine kind"], rows)


@region("calibration")
def calibration(report):
    rows = []
    names = ["ood-seed_cnn-h5000-png-s0", "ood-airbench-h5000-png-s0",
             *(n for n, _ in report.matching("ood-airbench_muon-fusedgelu-h5000-png-s*"))]
    for name in names:
        rec = report[name]
        c = rec["calibration"]

        def figure(measure, when):
            low, high = c[measure]["interval_95"][when]
            return f"{c[measure][when]:.3f} ({low:.3f}-{high:.3f})"

        low, high = rec["test_flagged_interval_95"]
        rows.append([f"`{name[4:]}`", f"{c['temperature']:.3f}", figure("nll", "before"), figure("nll", "after"),
                     figure("ece", "before"), figure("ece", "after"), with_interval(rec["test_flagged"], low, high, 1)])
    return table(["run", "temperature", "NLL before", "NLL after", "ECE before", "ECE after",
                  "test images flagged (95% Wilson)"], rows)


#: The recipe against itself with outlier exposure (--outlier-fraction), JPEG training (--jpeg-fraction), noise
#: alone (--corrupt-fraction 0.2 --corrupt-blur 0: the blurred half passes as it was), half its corrupted share
#: (--corrupt-fraction 0.05), brightness and contrast jitter (--jitter-brightness and --jitter-contrast of b50db6a)
#: or a wider net: each run's training record (``training-TAG-sN``), its served energy on the PNG test images
#: (``ood-verdicts-TAG-h5000-png-sN``) and on the JPEG mirror's (``ood-jpeg-TAG-sN``) and its robustness where
#: measured. The recipe's own runs: the three of record (AVX-512 BF16 + AMX) and three on the machine the trials
#: trained on (``epyc``); last, the recipe cut to the epochs the main job's budget trains on the AVX2 kind.
EXPOSURE = (("the recipe", "airbench_muon-b1000-e12-c10"), ("the recipe", "airbench_muon-epyc-b1000-e12-c10"),
            ("with 10% outliers (patches shuffled, weight 0.5)", "airbench_muon-b1000-e12-c10-oe10"),
            ("with 10% re-encoded as JPEG (quality 30-95)", "airbench_muon-b1000-e12-c10-j10"),
            ("with 5% corrupted and 5% re-encoded as JPEG", "airbench_muon-b1000-e12-c5-j5"),
            ("with the tenth corrupted by noise alone (no blur)", "airbench_muon-epyc-b1000-e12-n10"),
            ("with 5% corrupted (half the recipe's share)", "airbench_muon-epyc-b1000-e12-c5"),
            ("with brightness and contrast jitter (± 0.035, ± 0.13)", "airbench_muon-epyc-b1000-e12-c10-jit"),
            ("at airbench's widths (64/256/256), 7 epochs", "airbench_muon_wide-e7"),
            ("cut to 6 epochs (the main job's budget on AVX2)", "airbench_muon-epyc-b1000-e6-c10"),
            ("cut to 3 epochs (the budget on an AVX2 host half as fast)", "airbench_muon-epyc-b1000-e3-c10"))
#: The groups above that are trials, each against the recipe's runs on the machine they trained on: (tag, what).
TRIALS = (("airbench_muon-b1000-e12-c10-oe10", "with outlier exposure"),
          ("airbench_muon-b1000-e12-c10-j10", "with 10% as JPEG"),
          ("airbench_muon-b1000-e12-c5-j5", "with 5% corrupted and 5% as JPEG"),
          ("airbench_muon-epyc-b1000-e12-n10", "with noise alone"),
          ("airbench_muon-epyc-b1000-e12-c5", "with 5% corrupted"),
          ("airbench_muon-epyc-b1000-e12-c10-jit", "with brightness and contrast jitter"),
          ("airbench_muon_wide-e7", "at airbench's widths, 7 epochs"))


def _exposure_run(report, tag, train):
    """One run's figures: accuracy, the served energy's AUROC and verdicts on PNG and JPEG, the 75 corrupted sets."""
    def measured(name):  # a record not every run has: None where it was not measured
        return report[name] if name in report.records else None

    seed = train["seed"]
    run = _served_run(train, report[f"ood-verdicts-{tag}-h5000-png-s{seed}"], ("photos", "digits"))
    jpeg = measured(f"ood-jpeg-{tag}-s{seed}")
    robust = measured(f"robustness-{tag}-h5000-png-s{seed}")
    return {**run, "jpeg_flagged": jpeg and jpeg["verdicts"][str(rules.PASS_RATE)]["test_flagged"],
            "jpeg_accuracy": jpeg and jpeg["accuracy"], "corrupted": robust and robust["summary"]["all"]["accuracy"]}


EXPOSURE_COLUMNS = {"heldout": pct, "test": lambda x: pct(x, 1), "photos": "{:.3f}".format, "digits": "{:.3f}".format,
                    "flagged": lambda x: pct(x, 1), "photos_flagged": lambda x: pct(x, 1),
                    "jpeg_flagged": lambda x: pct(x, 1), "jpeg_accuracy": pct, "corrupted": lambda x: pct(x, 1)}


@region("exposure")
def exposure(report):
    """The trials against the recipe (outlier exposure, JPEG training, noise alone, less corruption, jitter, a wider
    net), run by run, with the means of each group of seeds."""
    groups = {tag: [_exposure_run(report, tag, train) for _, train in report.matching(f"training-{tag}-s*")]
              for _, tag in EXPOSURE}
    # The trials trained on AVX-512 BF16: each against the recipe's runs on that machine.
    recipe = groups["airbench_muon-epyc-b1000-e12-c10"]
    report.target("`airbench_muon`, its recipe on AVX-512 BF16: photos AUROC ≥ 0.95 (mean over seeds)",
                  _mean(recipe, "photos"), 0.95, "{:.3f}",
                  [f"ood-verdicts-airbench_muon-epyc-b1000-e12-c10-h5000-png-s{run['seed']}" for run in recipe])
    for tag, trial in TRIALS:
        runs, what = groups[tag], f"`airbench_muon` {trial}"
        names = [f"ood-verdicts-{tag}-h5000-png-s{run['seed']}" for run in runs]
        report.target(f"{what}: photos AUROC ≥ 0.95 (mean over seeds)", _mean(runs, "photos"), 0.95, "{:.3f}", names)
        report.target(f"{what}: digits AUROC no lower than the recipe's on its machine (mean over seeds)",
                      _mean(runs, "digits") - _mean(recipe, "digits"), 0.0, "{:+.3f}", names)
        report.target(f"{what}: ≤ 0.3 points of held-out accuracy lost against the recipe on its machine (mean over "
                      "seeds)", (_mean(runs, "heldout") - _mean(recipe, "heldout")) * 100, -0.3, "{:+.2f} pt",
                      [f"training-{tag}-s{run['seed']}" for run in runs])
    rows = _seed_rows([(label, groups[tag]) for label, tag in EXPOSURE], EXPOSURE_COLUMNS)
    return table(["`airbench_muon`, batch 1,000, 12 epochs, 10% corrupted, `--holdout 5000`", "seed",
                  "held-out accuracy (5,000)", "test accuracy (1,000)", "photos AUROC", "digits AUROC",
                  "test images flagged", "photos flagged", "JPEG mirror's test images flagged (10,000)",
                  "accuracy on the JPEG mirror", "the 75 corrupted sets, mean accuracy", "machine kind"], rows)


#: The serving cost of the wider net: ``bench.serving.speed`` in-process on an export of each, one after the other;
#: then the recipe's export from before, whose int8 model was full-integer, calibrated (the control for export's own).
SERVING_COST = ("serving-speed-airbench_muon-epyc", "serving-speed-airbench_muon_wide-epyc")
CALIBRATED_INT8 = "serving-speed-airbench_muon-int8-calibrated-epyc"


@region("serving-cost")
def serving_cost(report):
    """Each runtime's images/s and one image's p50, in-process, for the recipe and the wider net side by side."""
    narrow, wide = (report[name]["in_process"] for name in SERVING_COST)
    rows = []
    for runtime in ("litert", "litert-int8", "savedmodel"):
        one, many = f"{runtime}, batch 1", f"{runtime}, batch 64"
        rows.append([f"`{runtime}`", f"{narrow[many]['images_per_s']:,.0f}", f"{wide[many]['images_per_s']:,.0f}",
                     f"{wide[many]['images_per_s'] / narrow[many]['images_per_s']:.2f}x",
                     f"{narrow[one]['p50_ms']:.1f}", f"{wide[one]['p50_ms']:.1f}", kind(report[SERVING_COST[1]])])
    calibrated = report[CALIBRATED_INT8]["in_process"]
    rows.append(["`litert-int8` calibrated (the control)", f"{calibrated['litert-int8, batch 64']['images_per_s']:,.0f}",
                 "", "", f"{calibrated['litert-int8, batch 1']['p50_ms']:.1f}", "", kind(report[CALIBRATED_INT8])])
    return table(["runtime, in-process, every core", "the recipe: images/s, 64 a call", "the wider net: images/s, 64 a call",
                  "ratio", "the recipe: 1 image, p50 (ms)", "the wider net: 1 image, p50 (ms)", "machine kind"], rows)


@region("uploads")
def uploads(report):
    """The served verdict on images sent as users send them, at the served threshold and at one fitted with JPEG copies."""
    found = [rec for _, rec in report.matching("ood-uploads-airbench_muon-*")]
    rows = []
    for form in found[0]["forms"]:
        runs = [rec["forms"][form] for rec in found]
        flagged = [statistics.mean(run[fit][figure] for run in runs)
                   for fit in ("served", "with_jpeg") for figure in ("test_flagged", "photos_flagged")]
        rows.append([form, pct(_mean(runs, "accuracy"), 1), f"{_mean(runs, 'photos_auroc'):.3f}",
                     *(pct(share, 1) for share in flagged)])
    return table([f"sent as (the recipe, mean of {len(found)} seeds)", "test accuracy (1,000)", "photos AUROC",
                  "test images flagged", "photos flagged", "test images flagged, fitted with JPEG copies",
                  "photos flagged, fitted with JPEG copies"], rows)


@region("uploads-pass-rates")
def uploads_pass_rates(report):
    """Each upload form's false alarms and foreign photos caught at the served threshold and at stricter ones."""
    named = report.matching("ood-uploads-pass-rates-airbench_muon-*")
    found = [rec for _, rec in named]
    fits = ["served", *(fit for fit in found[0]["thresholds"] if fit.startswith("pass "))]
    flagged = {(form, fit, figure): statistics.mean(rec["forms"][form][fit][figure] for rec in found)
               for form in found[0]["forms"] for fit in fits for figure in ("test_flagged", "photos_flagged")}
    rows = [[form, *(f"{pct(flagged[form, fit, 'test_flagged'], 1)} / {pct(flagged[form, fit, 'photos_flagged'], 1)}"
                     for fit in fits)] for form in found[0]["forms"]]
    report.target("real images called foreign ≤ 2% at the served threshold, every upload form (mean over seeds)",
                  max(flagged[form, "served", "test_flagged"] for form in found[0]["forms"]), 0.02, "{:.1%}",
                  [n for n, _ in named], at_least=False)
    return table([f"sent as (the recipe, mean of {len(found)} seeds): test images / photos flagged",
                  f"{rules.PASS_RATE:.1%} of the held-out slice pass (served)",
                  *(f"{float(fit.split()[1]):.1%} pass" for fit in fits[1:])], rows)
