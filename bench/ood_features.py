"""Would a feature-space score tell foreign images apart better than the served energy of the logits?

The candidate is the Mahalanobis distance of the penultimate features (Lee et al., 2018): class
means and one shared covariance from the run's training images, the score being the distance to
the nearest class mean. It is measured next to the energy (what export serves,
``contract.confidence.score``) on the same images: the zip's test images against every set of
``bench/ood_sets.py``, AUROC and the false-positive rate at 95% true-positive rate, as
``bench/ood.py`` reports them.

    python bench/ood_features.py --run runs/airbench-png-s0 --data ../shared/data/cifar10-png.zip \\
        [--train-images 10000] [--json out.json]

Features are the penultimate layer's output for one view of each image: ``airbench``'s network
after its final pooling (it averages six views' logits inside the model, so its served energy is of
six views and is reported both ways); the input of the softmax ``Dense`` for the other models.
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the other bench scripts

import ood_sets  # noqa: E402
from accuracy_of_record import read_split  # noqa: E402
from ood import batched, detection, load_run  # noqa: E402

from contract import confidence as rules  # noqa: E402


def feature_and_logit_models(model):
    """(one-view features model, one-view logits model) of a run's rebuilt ``model``."""
    import keras

    from train import models

    head = model.get_layer("probabilities")
    if isinstance(head, keras.layers.Softmax):  # airbench: views inside the model
        network = model.get_layer("views").network
        return (keras.Model(network.input, network.get_layer("flatten").output),
                keras.Model(network.input, network.output))
    return keras.Model(model.input, head.input), models.logits_model(model)


class Mahalanobis:
    """Distance to the nearest class mean under the classes' shared covariance."""

    def __init__(self, features, labels, num_classes):
        self.means = np.stack([features[labels == c].mean(axis=0) for c in range(num_classes)])
        centred = features - self.means[labels]
        covariance = centred.T @ centred / len(features)
        self.precision = np.linalg.pinv(covariance, hermitian=True)

    def __call__(self, features):
        distances = [np.einsum("ij,jk,ik->i", features - m, self.precision, features - m) for m in self.means]
        return np.min(np.stack(distances, axis=1), axis=1)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True)
    parser.add_argument("--data", required=True, help="zip of train/<class>/* and test/<class>/* images")
    parser.add_argument("--train-images", type=int, default=10000, help="training images for the class statistics")
    parser.add_argument("--json")
    args = parser.parse_args(argv)

    from train import models

    manifest, model = load_run(args.run)
    served_logits = models.logits_model(model)
    features_of, logits_of = feature_and_logit_models(model)
    _, test_images, _, classes = read_split(args.data, "test")
    _, train_images, train_labels, _ = read_split(args.data, "train", args.train_images)
    mahalanobis = Mahalanobis(batched(features_of, train_images), train_labels, len(classes))
    scores = {
        "energy (served)": lambda images: rules.score(batched(served_logits, images)),
        "energy, one view": lambda images: rules.score(batched(logits_of, images)),
        "mahalanobis, one view": lambda images: mahalanobis(batched(features_of, images)),
    }
    inside = {name: score(test_images) for name, score in scores.items()}
    result = {"run": os.path.abspath(args.run), "model": manifest.model.name,
              "train_images": len(train_labels), "test_images": len(test_images), "sets": {}}
    for set_name, images in ood_sets.make().items():
        result["sets"][set_name] = {name: detection(inside[name], score(images)) for name, score in scores.items()}
    names = list(scores)
    print("| set | " + " | ".join(f"{n} AUROC" for n in names) + " | " + " | ".join(f"{n} FPR@95" for n in names) + " |")
    print("|---|" + "---:|" * (2 * len(names)))
    for set_name, entry in result["sets"].items():
        print(f"| {set_name} | " + " | ".join(f"{entry[n]['auroc']:.3f}" for n in names) + " | "
              + " | ".join(f"{entry[n]['fpr_at_95_tpr']:.1%}" for n in names) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
