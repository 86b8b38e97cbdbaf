"""A training run's record for the docs: what trained it, on what CPU, at which commit, and what it measured.

Typical usage::

    vmstat -t 5 > runs/X.vmstat &          # beside the run, so its time can be judged
    python -m train --model airbench_muon --data ../shared/data/cifar10-png.zip --holdout 5000 --seed 0 \\
        --validation-freq 0 --output runs/X
    python -m export --run runs/X --model-dir models/X --model-name cifar10
    python -m bench.training.run_record --run runs/X --version-dir models/X/cifar10/1 --vmstat runs/X.vmstat \\
        --command "python -m train ..." --load "quiet: nothing else ran" --json bench/records/training-X.json

Reads the run's manifest (the recipe as trained, the time budget's choice, the trainer's wall time,
the test accuracy on the test split it was given, with its 95% Wilson interval), the published
version's manifest when given (the held-out accuracy export measured; ``--heldout`` measures it here
for a run not exported), and ``vmstat -t`` lines when given: the runnable processes and the CPU shares
(user, system, idle, stolen) over the trainer's wall time, the window that ends at the manifest's
``created`` (UTC, as ``vmstat -t`` stamps when TZ is UTC). The record is ``bench.record``'s with the
training's command and commit, the day it finished, and ``--load``'s words with ``vmstat``'s median of
runnable processes as the machine's load.
"""

import argparse
import datetime
import json
import os

from bench import record
from bench.accuracy.of_record import wilson
from bench.training import vmstat


def heldout_accuracy(run, manifest):
    """``(accuracy, images)`` of the run's model, rebuilt from its weights (float32, as exported), on its held-out images."""
    import numpy as np

    from train import hardware

    hardware.prepare_environment("tensorflow")
    from train import models

    model = models.build_model(manifest["model"]["name"], manifest["num_classes"])
    model.load_weights(os.path.join(run, manifest["weights"]["file"]))
    with np.load(os.path.join(run, manifest["holdout"]["file"])) as held:
        images, labels = held["images"], held["labels"]
    predicted = model.predict(images.astype("float32"), batch_size=500, verbose=0).argmax(axis=1)
    return float((predicted == labels).mean()), int(len(labels))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True, help="the finished run directory")
    p.add_argument("--version-dir", help="its exported version (models/NAME/cifar10/N), for the held-out accuracy")
    p.add_argument("--heldout", action="store_true",
                   help="measure the held-out accuracy here, from the run's weights and holdout.npz (for a run not "
                        "exported; export measures the same figure, the top class of the served model)")
    p.add_argument("--vmstat", help="vmstat -t lines logged beside the run (UTC stamps)")
    p.add_argument("--command", required=True, help="the exact command line that trained the run")
    p.add_argument("--commit", help="the git commit of the code that trained it (default: this checkout's)")
    p.add_argument("--load", help="how shared the machine was, in words, e.g. \"shared: other work ran beside it\" "
                   "(default: the 1-minute load average as this records it); vmstat's median r is added")
    p.add_argument("--json", help="write the record here (bench/records/training-NAME.json)")
    args = p.parse_args(argv)

    with open(os.path.join(args.run, "manifest.json")) as f:
        manifest = json.load(f)
    training, metrics = manifest["training"], manifest["metrics"]
    correct = round(metrics["test_accuracy"] * metrics["test_images"])
    figures = {
        "model": manifest["model"]["name"],
        "seed": training["seed"],
        "recipe": training["recipe"],
        "precision": training["precision"],
        "train_images": training["train_images"],
        "test_accuracy": metrics["test_accuracy"],
        "test_images": metrics["test_images"],
        "test_wilson_95": [round(v, 4) for v in wilson(correct, metrics["test_images"])],
        "training_wall_time_s": training["wall_time_s"],
        "budget": training.get("budget"),
    }
    if args.heldout:
        figures["heldout_accuracy"], figures["heldout_images"] = heldout_accuracy(args.run, manifest)
    if args.version_dir:
        with open(os.path.join(args.version_dir, "assets.extra", "manifest.json")) as f:
            published = json.load(f)
        held = (published.get("confidence") or {}).get("held_out") or {}
        figures["heldout_accuracy"] = held.get("accuracy")
        figures["heldout_images"] = (published.get("holdout") or {}).get("images")
        figures["int8_published"] = published["export"]["litert"]["runtimes"].get("litert-int8", {}).get("published")
    ended = datetime.datetime.fromisoformat(manifest["created"])
    if args.vmstat:
        figures["vmstat"] = vmstat.logged(args.vmstat, ended - datetime.timedelta(seconds=training["wall_time_s"]), ended)
    machine = record.machine()
    words = args.load or f"1-minute load average {machine['load']} as this recorded it"
    record.write(args.json, figures, __spec__.name, argv, command=args.command, commit=args.commit or record.commit(),
                 date=ended.date().isoformat(), machine={**machine, "load": vmstat.load(words, figures.get("vmstat"))})


if __name__ == "__main__":
    main()
