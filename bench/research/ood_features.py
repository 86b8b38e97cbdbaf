"""Would a score of the penultimate features tell foreign images apart better than the served energy?

Typical usage::

    python -m bench.research.ood_features --run runs/airbench_fast-h5000-png-s0 --data ../shared/data/cifar10-png.zip \\
        --banks 5000,20000,all --json bench/records/ood-features-NAME.json --cache /tmp/ood-features.npz

The run must have a held-out slice (``python -m train --holdout N``). The scores
(``bench/research/ood_scores.py``): the energy of the logits (what export serves), the Mahalanobis distance,
KNN on L2-normalised features against banks of the run's training images (the held-out slice never
in them), ViM, and KNN fused with the energy; and the post-hoc scores: the energy at other temperatures,
GEN, ReAct, SCALE, ASH-P/S/B and fDBD, each timed on one image. Their parameters (KNN's k, ViM's
subspace, GEN's gamma and M, the percentiles of ReAct, SCALE and ASH) are chosen on
the held-out slice against a second draw of ``bench/confidence/ood_sets.py`` (another seed); the fusion is
standardised on the held-out slice. Then every score is measured as ``bench/confidence/ood.py`` measures the
energy: the zip's test images against every set of ``bench/confidence/ood_sets.py`` at its own seed, AUROC and
the false-positive rate at 95% true-positive rate.

Features are the input of the model's last linear layer. ``airbench``'s family averages six views'
logits inside the model (its ``views`` layer): each score is measured on the features of the image
as it is ("one view") and on the six views' features averaged with the model's weights ("six
views", whose logits are the served ones). ``--cache`` keeps the features, so a second run only scores.
"""

import argparse
import json
import os
import sys
import time

import numpy as np

from bench import record
from bench.accuracy.of_record import test_split
from bench.confidence import ood_sets
from bench.confidence.ood import batched, detection, load_run
from bench.research import ood_scores as scores

K_CANDIDATES = (1, 2, 5, 10, 20, 50, 100, 200)  # KNN's k: Sun et al. use 50 on all 50,000 CIFAR-10 images
VIM_FRACTIONS = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 3 / 4)  # ViM's principal subspace, as a share of the features
TEMPERATURES = (0.5, 0.75, 2.0, 5.0, 10.0, 20.0)  # the energy's, each reported and one chosen (1 is the served energy)
GEN_GRID = [(g, m) for g in (0.01, 0.1, 0.5) for m in (3, 5, 10)]  # (gamma, M): Liu et al. use 0.1 and 10 on CIFAR-10
REACT_PERCENTILES = (80, 85, 90, 95, 99)  # of every training activation: Sun et al. use 90
SHAPING_PERCENTILES = (50, 65, 80, 90, 95)  # of each image's own activations: ASH uses 65 and 90 on CIFAR-10
BANK_SEED = 0  # orders the training images so each smaller bank is a part of the larger ones
SELECTION_SEED = ood_sets.SEED + 1  # the foreign images parameters are chosen on: not the reported ones


def feature_views(model):
    """``{view name: function}``: the function maps uint8 images to ``(features, logits)``, float64, in one pass."""
    import keras

    from train import models

    views = model.get_layer("views") if "views" in [layer.name for layer in model.layers] else None
    network = views.network if views is not None else model
    head = [layer for layer in network.layers if isinstance(layer, keras.layers.Dense)][-1]
    logits = network.output if views is not None else models.logits_model(model).output
    # Features and logits side by side: one forward pass gives both, and Views averages both alike.
    both = keras.Model(network.input, keras.layers.Concatenate(name="features_logits")(
        [keras.ops.cast(head.input, "float32"), keras.ops.cast(logits, "float32")]))
    dim = head.input.shape[-1]

    def split(of):
        return lambda images: (lambda out: (out[:, :dim], out[:, dim:]))(batched(of, images))

    if views is None:
        return {"one view": split(both)}
    from train.airbench import Views

    # The six views' features averaged with the weights the model gives their logits; their logits are the served ones.
    return {"one view": split(both), "six views": split(Views(both, name="feature_views"))}


def run_images(run_dir, manifest, data):
    """``(training images trained on, their labels, held-out images, their labels)``, as the trainer split them."""
    from export import read_images
    from train import data as loader

    if manifest.holdout is None:
        raise SystemExit(f"{run_dir} kept no held-out slice (python -m train --holdout N): the scores' "
                         "parameters and the fusion are chosen on it")
    splits, held = loader.hold_out(loader.load(data), manifest.holdout.images)
    images, labels = read_images(run_dir, manifest.holdout)
    if not np.array_equal(images, held.images):
        raise SystemExit(f"{data} does not hold the training images {run_dir} was trained on (held-out slice differs)")
    return splits.x_train, splits.y_train, images, labels


def extract(views, groups, cache_path, run_dir):
    """``{view: {group: (features, logits)}}`` of every group of images, from ``cache_path`` when it has them."""
    cached = {}
    if cache_path and os.path.exists(cache_path):
        with np.load(cache_path, allow_pickle=False) as saved:
            if str(saved["run"]) == os.path.abspath(run_dir):
                cached = {key: saved[key] for key in saved.files}
    out = {}
    for view, features_and_logits in views.items():
        out[view] = {}
        for group, images in groups.items():
            key = f"{view}/{group}"
            if f"{key}/features" not in cached or len(cached[f"{key}/features"]) != len(images):
                started = time.perf_counter()
                cached[f"{key}/features"], cached[f"{key}/logits"] = features_and_logits(images)
                print(f"features: {key}, {len(images)} images, {time.perf_counter() - started:.0f} s", flush=True)
            out[view][group] = (cached[f"{key}/features"], cached[f"{key}/logits"])
        if cache_path:  # after each view: the six views cost six times one view's, so one view's are kept first
            np.savez(cache_path, run=os.path.abspath(run_dir), **{k: v for k, v in cached.items() if k != "run"})
    return out


def search_cost(bank, dim, k, repeats=200):
    """Median seconds to score one image against ``bank`` normalised features: the matmul and the k-th largest."""
    rng = np.random.default_rng(0)
    bank = scores.normalised(rng.normal(size=(bank, dim))).astype(np.float32)
    query = scores.normalised(rng.normal(size=(1, dim))).astype(np.float32)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        similarity = query @ bank.T
        np.partition(-similarity, k - 1, axis=1)[:, k - 1]
        times.append(time.perf_counter() - started)
    return float(np.median(times))


def mean_auroc(score, inside, sets):
    """The mean AUROC over ``sets`` of ``score`` (a function of a group name) against ``inside``'s."""
    reference = score(inside)
    return float(np.mean([detection(reference, score(name))["auroc"] for name in sets]))


def build_scores(f, banks, labels, num_classes, selection_sets):
    """``({score name: function of a group name}, {score name: chosen parameters and their selection AUROCs})``."""
    feature, logit = (lambda g: f[g][0]), (lambda g: f[g][1])
    groups = ["held_out", *selection_sets]
    made = {"energy": lambda g: scores.energy(logit(g))}
    chosen = {}
    # Fitted on the training images, as Lee et al. do, and on the held-out slice: a network's features
    # of the images it was trained on can be tighter than those of any image it has not seen.
    for fitted_on in ("bank", "held_out"):
        mahalanobis = scores.Mahalanobis(feature(fitted_on), labels[fitted_on], num_classes)
        made[f"mahalanobis, {'training' if fitted_on == 'bank' else 'held-out'} fit"] = lambda g, m=mahalanobis: m(feature(g))
    for size in banks:
        bank = feature("bank")[:size]
        ks = [k for k in K_CANDIDATES if k <= size]
        distances = {g: scores.nearest_distances(bank, feature(g), max(ks)) for g in groups}
        tried = {k: mean_auroc(lambda g, k=k: distances[g][:, k - 1], "held_out", selection_sets) for k in ks}
        k = max(tried, key=tried.get)
        knn = scores.KNN(bank, k)
        name = f"knn, bank {size:,}"
        made[name] = lambda g, knn=knn: knn(feature(g))
        chosen[name] = {"k": k, "selection_mean_auroc": tried}
        fusion = scores.Fusion([made[name]("held_out"), made["energy"]("held_out")])
        made[f"{name} + energy"] = lambda g, n=name, fusion=fusion: fusion([made[n](g), made["energy"](g)])
    w, b, error = scores.affine_head(feature("bank"), logit("bank"))
    dim = feature("bank").shape[1]
    tried = {}
    for fraction in VIM_FRACTIONS:
        vim = scores.ViM(feature("bank"), w, b, max(1, round(dim * fraction)))
        tried[vim.dim] = (mean_auroc(lambda g, vim=vim: vim(feature(g)), "held_out", selection_sets), vim)
    best = max(tried, key=lambda d: tried[d][0])
    vim = tried[best][1]
    made["vim"] = lambda g: vim(feature(g))
    chosen["vim"] = {"dim": best, "alpha": vim.alpha, "head_max_error": error,
                     "selection_mean_auroc": {d: a for d, (a, _) in tried.items()}}
    return made, chosen, w, b


def post_hoc_scores(f, w, b, selection_sets):
    """As :func:`build_scores`, for the scores of the logits and of reshaped features through the head ``(w, b)``."""
    feature, logit = (lambda g: f[g][0]), (lambda g: f[g][1])
    made = {f"energy, T {t:g}": lambda g, t=t: scores.energy(logit(g), t) for t in TEMPERATURES}
    chosen = {}

    def pick(name, candidates):
        """The candidate ``{parameter: score of features and logits}`` with the best mean selection AUROC."""
        tried = {p: mean_auroc(lambda g, s=s: s(feature(g), logit(g)), "held_out", selection_sets) for p, s in candidates.items()}
        best = max(tried, key=tried.get)
        made[name] = lambda g, s=candidates[best]: s(feature(g), logit(g))
        chosen[name] = {"parameter": best, "selection_mean_auroc": {str(p): a for p, a in tried.items()}}

    pick("energy, T chosen", {t: lambda x, z, t=t: scores.energy(z, t) for t in (1.0, *TEMPERATURES, 50.0, 100.0)})
    pick("gen", {(gamma, m): lambda x, z, gamma=gamma, m=m: scores.gen(z, gamma, m) for gamma, m in GEN_GRID})
    react = {p: scores.ReAct(feature("bank"), w, b, p) for p in REACT_PERCENTILES}
    pick("react", {p: lambda x, z, r=r: r(x) for p, r in react.items()})
    pick("scale", {p: lambda x, z, p=p: scores.energy(scores.scale(x, p) @ w + b) for p in SHAPING_PERCENTILES})
    for variant in "psb":
        pick(f"ash-{variant}", {p: lambda x, z, p=p, v=variant: scores.energy(scores.ash(x, p, v) @ w + b)
                                for p in SHAPING_PERCENTILES})
    fdbd = scores.FDBD(feature("bank"), w, b)
    made["fdbd"] = lambda g: fdbd(feature(g))
    return made, chosen


def cost(score, repeats=300):
    """Median seconds for ``score`` (a function of a group name) to score the one image of the group ``"one"``."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        score("one")
        times.append(time.perf_counter() - started)
    return float(np.median(times))


def measure(features, labels, num_classes, banks, sets, selection_sets):
    """``{view: {"chosen": ..., "scores": {score: {set: detection}}, "seconds_per_image": {score: s}}}``.

    The cost is of the energy and the post-hoc scores, each on one image's features and logits (KNN's
    search is :func:`search_cost`'s).
    """
    result = {}
    for view, f in features.items():
        f = {**f, "one": tuple(a[:1] for a in f["test"])}  # what :func:`cost` times
        made, chosen, w, b = build_scores(f, banks, labels, num_classes, selection_sets)
        post_hoc, post_hoc_chosen = post_hoc_scores(f, w, b, selection_sets)
        made.update(post_hoc)
        chosen.update(post_hoc_chosen)
        result[view] = {"chosen": chosen, "scores": {},
                        "seconds_per_image": {n: cost(made[n]) for n in ["energy", *post_hoc]}}
        for name, score in made.items():
            inside = score("test")
            result[view]["scores"][name] = {s: detection(inside, score(f"report/{s}")) for s in sets}
    return result


def score_table(rows, sets):
    """A Markdown table of ``{row name: {set: detection}}``: AUROC / FPR@95 in each of ``sets``."""
    lines = ["| score | " + " | ".join(sets) + " |", "|---|" + "---:|" * len(sets)]
    for name, per_set in rows.items():
        cells = [f"{per_set[s]['auroc']:.3f} / {per_set[s]['fpr_at_95_tpr']:.1%}" for s in sets]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table(result, sets):
    return score_table({f"{name}, {view}": per_set for view, entry in result["views"].items()
                        for name, per_set in entry["scores"].items()}, sets)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="a finished training run with a held-out slice")
    parser.add_argument("--data", required=True, help="the zip the run trained on: train/<class>/* and test/<class>/*")
    parser.add_argument("--banks", default="5000,20000,all",
                        help="KNN bank sizes, training images each ('all': every image trained on)")
    parser.add_argument("--json", help="write the record here (bench/records/NAME.json)")
    parser.add_argument("--views", default="one view,six views",
                        help="which features, comma-separated: 'one view', 'six views' (airbench's family only)")
    parser.add_argument("--cache", help="an .npz keeping the features between runs of this script")
    args = parser.parse_args(argv)
    manifest, model = load_run(args.run)
    x_train, y_train, held_images, held_labels = run_images(args.run, manifest, args.data)
    order = np.random.default_rng(BANK_SEED).permutation(len(x_train))
    try:
        banks = sorted({len(order) if b == "all" else min(int(b), len(order)) for b in args.banks.split(",")})
    except ValueError:
        parser.error(f"--banks takes sizes and 'all', comma-separated, not {args.banks!r}")
    order = order[:max(banks)]
    _, test_images, _, classes = test_split(args.data)
    if classes != manifest.class_names:
        parser.error(f"the zip's classes {classes} are not the model's {manifest.class_names}")
    sets, selection = ood_sets.make(), ood_sets.make(seed=SELECTION_SEED)
    groups = {"bank": x_train[order], "held_out": held_images, "test": test_images,
              **{f"report/{s}": images for s, images in sets.items()},
              **{f"selection/{s}": images for s, images in selection.items()}}
    available = feature_views(model)
    wanted = [v.strip() for v in args.views.split(",") if v.strip() in available]
    if not wanted:
        parser.error(f"--views: none of {args.views!r} is one of this model's {list(available)}")
    features = extract({v: available[v] for v in wanted}, groups, args.cache, args.run)
    labels = {"bank": y_train[order], "held_out": held_labels}
    views = measure(features, labels, manifest.num_classes, banks, list(sets), [f"selection/{s}" for s in selection])
    dim = next(iter(features.values()))["bank"][0].shape[1]
    result = {"run": os.path.abspath(args.run), "model": manifest.model.name, "test_images": len(test_images),
              "held_out_images": len(held_images), "feature_dim": dim, "banks": banks, "views": views,
              "search_seconds_per_image": {
                  b: search_cost(b, dim, max(v["chosen"][f"knn, bank {b:,}"]["k"] for v in views.values())) for b in banks}}
    print(table(result, list(sets)))
    print("chosen on the held-out slice against the selection sets:",
          json.dumps({v: {n: {k: c[k] for k in c if k != "selection_mean_auroc"} for n, c in e["chosen"].items()}
                      for v, e in views.items()}))
    print("search at c=1, seconds an image:", json.dumps(result["search_seconds_per_image"]))
    if args.json:
        record.write(args.json, result, __spec__.name, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
