"""Time to a target test accuracy: runs the training CLI, then reads its history.

Typical usage::

    python -m bench.training.time_to_accuracy --target 0.8079 -- \
        --data ../shared/data/cifar10-jpeg.zip --output runs/tta --augment --schedule onecycle --epochs 15

Everything after ``--`` is passed to ``python -m train``. Time to target is the sum of the
epochs' wall times (training plus the per-epoch test-set evaluation) up to the first epoch whose
test accuracy reaches the target; data loading and start-up are reported apart.
"""

import argparse
import json
import os
import subprocess
import sys
import time

from bench import record
from train.report import read_history

REPO = record.ROOT


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", type=float, default=0.8079, help="test accuracy to reach (default: the seed's 80.79%%)")
    p.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then python -m train flags (needs --output)")
    args = p.parse_args(argv)
    train_args = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
    output = train_args[train_args.index("--output") + 1]

    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "train", *train_args], cwd=REPO, check=True)
    total = time.monotonic() - started
    report(output, args.target, total, train_args)


def report(output, target, total, train_args):
    history = read_history(os.path.join(output, "history.csv"))
    manifest = json.load(open(os.path.join(output, "manifest.json")))
    elapsed, reached = 0.0, None
    for row in history:
        elapsed += row["epoch_time_s"]
        if reached is None and row.get("val_accuracy", 0) >= target:  # absent: not evaluated (--validation-freq)
            reached = (int(row["epoch"]) + 1, elapsed)
    print(f"command: python -m train {' '.join(train_args)}")
    print(f"precision {manifest['training']['precision']}, global batch {manifest['training']['global_batch']}, "
          f"{len(history)} epochs, {sum(r['epoch_time_s'] for r in history):.0f} s in epochs, {total:.0f} s end to end")
    for row in history:
        accuracy = f"{row['val_accuracy']:.4f}" if "val_accuracy" in row else "not evaluated"
        print(f"  epoch {int(row['epoch']) + 1:3d}  {row['epoch_time_s']:6.1f} s  test accuracy {accuracy}")
    print(f"final test accuracy (all {manifest['metrics']['test_images']} images): {manifest['metrics']['test_accuracy']:.4f}")
    if reached:
        print(f"reached {target:.2%} after epoch {reached[0]}: {reached[1]:.0f} s ({reached[1] / 60:.1f} min) of training")
    else:
        print(f"did not reach {target:.2%}")


if __name__ == "__main__":
    main()
