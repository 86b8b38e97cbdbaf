"""Training speed of the same model and input pipeline under the JAX and TensorFlow backends.

Typical usage::

    python -m bench.training.backends --data ../shared/data/cifar10-jpeg.zip --epochs 3 --repeats 2 [--json bench/records/NAME.json]

Each run is ``python -m train --keras-backend B`` in a fresh process (one process cannot switch Keras
backends), alternating A B A B so that machine noise falls on both. The data is decoded once
into the CIFAR-10 binary layout first, so the runs do not spend their time decoding JPEGs. Epoch
time is the trainer's own ``epoch_time_s`` (training steps plus the test-set evaluation); the
first epoch, which includes compilation, is reported apart.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from bench import record
from train import data, report

REPO = record.ROOT


def write_binary(splits, path):
    """``splits`` as cifar-10-binary.tar.gz: label byte + CHW pixels per record, as the official file."""
    import io
    import tarfile

    import numpy as np

    def records(x, y):
        return np.concatenate([y.astype(np.uint8)[:, None], x.transpose(0, 3, 1, 2).reshape(len(x), -1)], 1).tobytes()

    with tarfile.open(path, "w:gz", compresslevel=1) as archive:
        for name, payload in (("data_batch_1.bin", records(splits.x_train, splits.y_train)),
                              ("test_batch.bin", records(splits.x_test, splits.y_test)),
                              ("batches.meta.txt", "\n".join(splits.class_names).encode())):
            info = tarfile.TarInfo(f"cifar-10-batches-bin/{name}")
            info.size = len(payload)
            archive.addfile(info, io.BytesIO(payload))


def train(backend, source, output, args):
    env = {k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND", "XLA_FLAGS")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    command = [sys.executable, "-m", "train", "--keras-backend", backend, "--model", args.model, "--data", source,
               "--output", output, "--epochs", str(args.epochs), "--precision", args.precision, "--quiet"]
    started = time.monotonic()
    subprocess.run(command, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL)
    total = time.monotonic() - started
    manifest = json.load(open(os.path.join(output, "manifest.json")))
    epochs = [row["epoch_time_s"] for row in report.read_history(os.path.join(output, "history.csv"))]
    images = manifest["training"]["steps_per_epoch"] * manifest["training"]["global_batch"]
    return {"first_epoch_s": epochs[0], "epoch_s": statistics.median(epochs[1:]), "images_per_epoch": images,
            "process_s": total, "test_accuracy": manifest["metrics"]["test_accuracy"]}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="a folder, .zip or tarball of CIFAR-10")
    p.add_argument("--model", default="seed_cnn")
    p.add_argument("--epochs", type=int, default=3, help="per run; at least 2 (the first is reported apart)")
    p.add_argument("--repeats", type=int, default=2, help="runs per backend, interleaved")
    p.add_argument("--precision", default="auto")
    p.add_argument("--train-images", type=int, help="train on a random N of the training images (faster)")
    p.add_argument("--json", help="write the record here (bench/records/NAME.json)")
    args = p.parse_args(argv)

    work = tempfile.mkdtemp(prefix="bench-backends-")
    source = os.path.join(work, "cifar-10-binary.tar.gz")
    splits = data.load(args.data)
    if args.train_images:  # a seeded random subset: the loaders return the images class by class
        import numpy as np

        keep = np.random.default_rng(0).permutation(len(splits.x_train))[: args.train_images]
        splits.x_train, splits.y_train = splits.x_train[keep], splits.y_train[keep]
    write_binary(splits, source)
    rows = {"jax": [], "tensorflow": []}
    for repeat in range(args.repeats):
        for backend in ("tensorflow", "jax") if repeat % 2 == 0 else ("jax", "tensorflow"):
            result = train(backend, source, os.path.join(work, f"{backend}-{repeat}"), args)
            rows[backend].append(result)
            print(f"{backend:10s} run {repeat + 1}: epoch {result['epoch_s']:.1f} s "
                  f"({result['images_per_epoch'] / result['epoch_s']:.0f} img/s incl. evaluation), "
                  f"first epoch {result['first_epoch_s']:.1f} s, test accuracy {result['test_accuracy']:.4f}",
                  flush=True)
    summary = {b: {"median_epoch_s": statistics.median(r["epoch_s"] for r in runs),
                   "median_first_epoch_s": statistics.median(r["first_epoch_s"] for r in runs),
                   "runs": runs} for b, runs in rows.items()}
    ratio = summary["tensorflow"]["median_epoch_s"] / summary["jax"]["median_epoch_s"]
    print(f"JAX epoch time is {1 / ratio:.2f}x TensorFlow's (JAX {'faster' if ratio > 1 else 'slower'} by "
          f"{abs(ratio - 1) * 100:.0f}%), {args.model}, {args.epochs} epochs x {args.repeats} runs each")
    record.write(args.json, {"model": args.model, "epochs": args.epochs, "summary": summary}, __spec__.name, argv)


if __name__ == "__main__":
    main()
