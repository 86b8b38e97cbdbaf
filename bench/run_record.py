"""A training run's record for the docs: what trained it, on what CPU, at which commit, and what it measured.

Typical usage::

    vmstat -t 5 > runs/X.vmstat &          # beside the run, so its time can be judged
    python -m train --model airbench_muon --data ../shared/data/cifar10-png.zip --holdout 5000 --seed 0 \\
        --validation-freq 0 --output runs/X
    python -m export --run runs/X --model-dir models/X --model-name cifar10
    python bench/run_record.py --run runs/X --version-dir models/X/cifar10/1 --vmstat runs/X.vmstat \\
        --command "python -m train ..." --commit abc1234 --json bench/records/train-X.json

Reads the run's manifest (the recipe as trained, the time budget's choice, the trainer's wall time,
the test accuracy on the test split it was given, with its 95% Wilson interval), the published
version's manifest when given (the held-out accuracy export measured; ``--heldout`` measures it here
for a run not exported), and ``vmstat -t`` lines
when given: the runnable processes and the CPU shares (user, system, idle, stolen) over the trainer's wall time, the window that
ends at the manifest's ``created`` (UTC, as ``vmstat -t`` stamps when TZ is UTC).
"""

import argparse
import datetime
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from accuracy_of_record import wilson  # noqa: E402  (bench/ is not a package)
from emit import emit  # noqa: E402
from main_job import cpu_kind  # noqa: E402


def vmstat_shares(path, start, end):
    """Median, mean and largest of r, us, sy, id and st over ``vmstat -t`` lines stamped between ``start`` and ``end`` (UTC)."""
    header, rows = None, []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if "us" in parts and "st" in parts:
                header = [part for part in parts if part != "UTC"]  # -t's stamp column
                continue
            if not header or len(parts) < len(header) + 2 or not parts[0].isdigit():
                continue
            stamp = datetime.datetime.fromisoformat(" ".join(parts[-2:])).replace(tzinfo=datetime.timezone.utc)
            if start <= stamp <= end:
                rows.append(dict(zip(header, map(int, parts[:len(header)]))))
    if not rows:
        return None
    out = {"samples": len(rows), "every_s": 5}
    # r: processes runnable; above the CPU count, other work was competing for them (which us cannot show).
    for name in ("r", "us", "sy", "id", "st"):
        values = [row[name] for row in rows]
        out[name] = {"median": statistics.median(values), "mean": round(statistics.mean(values), 1), "max": max(values)}
    return out


def heldout_accuracy(run, manifest):
    """``(accuracy, images)`` of the run's model, rebuilt from its weights (float32, as exported), on its held-out images."""
    import numpy as np

    sys.path.insert(0, os.path.dirname(HERE))
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
    p.add_argument("--commit", required=True, help="the git commit of the code that trained it")
    p.add_argument("--json", help="also write the record here")
    args = p.parse_args(argv)

    with open(os.path.join(args.run, "manifest.json")) as f:
        manifest = json.load(f)
    training, metrics = manifest["training"], manifest["metrics"]
    correct = round(metrics["test_accuracy"] * metrics["test_images"])
    model_name, kind = cpu_kind()
    record = {
        "command": args.command,
        "machine": {"cpu_kind": kind, "model_name": model_name, "cpus": os.cpu_count()},
        "commit": args.commit,
        "date": manifest["created"],
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
        record["heldout_accuracy"], record["heldout_images"] = heldout_accuracy(args.run, manifest)
    if args.version_dir:
        with open(os.path.join(args.version_dir, "assets.extra", "manifest.json")) as f:
            published = json.load(f)
        held = (published.get("confidence") or {}).get("held_out") or {}
        record["heldout_accuracy"] = held.get("accuracy")
        record["heldout_images"] = (published.get("holdout") or {}).get("images")
        record["int8_published"] = published["export"]["litert"]["runtimes"].get("litert-int8", {}).get("published")
    if args.vmstat:
        ended = datetime.datetime.fromisoformat(manifest["created"])
        record["vmstat"] = vmstat_shares(args.vmstat, ended - datetime.timedelta(seconds=training["wall_time_s"]), ended)
    emit(record, args.json)


if __name__ == "__main__":
    main()
