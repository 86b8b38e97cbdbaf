"""Do the six test-time views tell foreign images apart beyond the served energy?

Typical usage::

    python -m bench.research.ood_views --run runs/airbench_muon-h5000-png-s0 --data ../shared/data/cifar10-png.zip \\
        --json bench/records/ood-views-NAME.json

``airbench``'s family averages the logits of six views of each image inside the model
(``train.airbench_layers.Views``); the served score is the energy of that average. The six views' own
logits give other scores at no cost to a server that computes them in the same graph:

* **the views' mean energy**: the views' energies (``-logsumexp`` of each view's logits), averaged
  with the model's weights, in place of the energy of the averaged logits;
* **the views' agreement**: the weighted variance of the logits across the views, summed over the
  classes, negated (a model's logits of a foreign image move *less* from view to view: they are small);
* **energy + agreement**: the two standardised on the held-out slice and added, the agreement
  weighted by the value in ``--weights`` that gives the highest mean AUROC of the held-out slice
  against a second draw of ``bench/confidence/ood_sets.py`` (another seed), never the reported sets or the test images.

Each is measured as ``bench/confidence/ood.py`` measures the energy: the zip's test images against every set of
``bench/confidence/ood_sets.py`` at its own seed, AUROC and the false-positive rate at 95% true-positive rate.
The run must have a held-out slice (``python -m train --holdout N``).
"""

import argparse
import os
import sys

import numpy as np

from bench import record
from bench.accuracy.of_record import test_split
from bench.confidence import ood_sets
from bench.confidence.ood import detection, load_run
from bench.research import ood_scores as scores
from bench.research.ood_features import SELECTION_SEED, mean_auroc, score_table

WEIGHTS = (0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0)  # of the agreement, against the energy's 1


def view_logits(model, batch=250):
    """A function of uint8 images to their six views' logits, float64 ``[views, images, classes]``."""
    from train.airbench_layers import VIEW_WEIGHTS, six_views

    names = [layer.name for layer in model.layers]
    if "views" not in names:
        raise SystemExit(f"the model has no test-time views (layers {names}): only airbench's family has them")
    network = model.get_layer("views").network

    def logits(images):
        out = []
        for i in range(0, len(images), batch):
            z = np.asarray(network(six_views(images[i:i + batch].astype(np.float32)), training=False), np.float64)
            out.append(z.reshape(len(VIEW_WEIGHTS), -1, z.shape[-1]))
        return np.concatenate(out, axis=1)

    return logits


def view_scores(views):
    """``{score: [images]}`` of ``[views, images, classes]`` logits; higher is more foreign."""
    from train.airbench_layers import VIEW_WEIGHTS

    weights = np.asarray(VIEW_WEIGHTS)
    averaged = np.einsum("v,vbc->bc", weights, views)
    spread = np.einsum("v,vbc->b", weights, (views - averaged[None]) ** 2)
    view_energies = np.stack([scores.energy(z) for z in views])
    return {"energy": scores.energy(averaged), "views' mean energy": weights @ view_energies,
            "views' agreement": -spread}


def measure(groups, sets, selection_sets):
    """``{"chosen": ..., "scores": {score: {set: detection}}}`` from ``{group: {score: values}}``."""
    def fused(weight):
        fusion = scores.Fusion([groups["held_out"]["energy"], groups["held_out"]["views' agreement"]], [1.0, weight])
        return lambda g: fusion([groups[g]["energy"], groups[g]["views' agreement"]])

    tried = {w: mean_auroc(fused(w), "held_out", selection_sets) for w in WEIGHTS}
    weight = max(tried, key=tried.get)
    made = {name: (lambda g, name=name: groups[g][name]) for name in groups["test"]}
    made["energy + views' agreement"] = fused(weight)
    return {"chosen": {"weight": weight, "selection_mean_auroc": tried},
            "scores": {name: {s: detection(score("test"), score(f"report/{s}")) for s in sets}
                       for name, score in made.items()}}


def main(argv=None):
    from export import read_images

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="a finished training run of airbench's family with a held-out slice")
    parser.add_argument("--data", required=True, help="zip whose test/<class>/* images are the in-distribution set")
    parser.add_argument("--json", help="write the record here (bench/records/NAME.json)")
    args = parser.parse_args(argv)
    manifest, model = load_run(args.run)
    if manifest.holdout is None:
        parser.error(f"{args.run} kept no held-out slice (python -m train --holdout N): the fusion is chosen on it")
    _, test_images, _, classes = test_split(args.data)
    if classes != manifest.class_names:
        parser.error(f"the zip's classes {classes} are not the model's {manifest.class_names}")
    held_images, _ = read_images(args.run, manifest.holdout)
    sets, selection = ood_sets.make(), ood_sets.make(seed=SELECTION_SEED)
    images = {"held_out": held_images, "test": test_images,
              **{f"report/{s}": x for s, x in sets.items()}, **{f"selection/{s}": x for s, x in selection.items()}}
    logits = view_logits(model)
    groups = {group: view_scores(logits(x)) for group, x in images.items()}
    result = measure(groups, list(sets), [f"selection/{s}" for s in selection])
    print(score_table(result["scores"], list(sets)))
    print(f"agreement's weight, chosen on the held-out slice against the selection sets: {result['chosen']['weight']}")
    record.write(args.json, {"run": os.path.abspath(args.run), "model": manifest.model.name, "test_images": len(test_images),
                             "held_out_images": len(held_images), **result}, __spec__.name, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
