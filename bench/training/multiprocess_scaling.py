"""Multi-process JAX training on one machine: 1, 2 or 4 processes, the same global batch.

Starts ``--processes`` copies of ``python -m train --keras-backend jax`` joined as the Kubernetes Job joins
them (``KERAS_DISTRIBUTION_*`` on localhost), each with ``--devices`` host CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count``), and prints one JSON line: images per second
over the epochs after the first (which compiles), and the run's test accuracy.

    python -m bench.training.multiprocess_scaling --data ../shared/data/cifar10-png.zip --per-class 500,100 \
        --processes 2 --global-batch 128 --epochs 3

Every process here shares the machine's cores, so this measures what the collectives and the extra
processes cost, not a speed-up: on separate hosts each process would have its own cores.
"""

import argparse
import csv
import json
import os
import socket
import subprocess
import sys
import tempfile
import zipfile

from bench import record

REPO = record.ROOT


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True, help="what python -m train reads, or the .zip --per-class slices")
    p.add_argument("--per-class", metavar="TRAIN,TEST",
                   help="train on the first TRAIN training and TEST test images of each class of a .zip of "
                        "train/<class>/ and test/<class>/ images (in the zip's order), written to a temporary folder")
    p.add_argument("--processes", type=int, default=1)
    p.add_argument("--devices", type=int, default=1, help="host CPU devices per process")
    p.add_argument("--global-batch", type=int, default=128)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--model", default="seed_cnn")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-augment", action="store_true",
                   help="no random augmentation: every configuration then trains on the same batches")
    args = p.parse_args()

    replicas = args.processes * args.devices
    if args.per_class:
        args.data = slice_zip(args.data, *(int(n) for n in args.per_class.split(",")))
    assert args.global_batch % replicas == 0, "the global batch must split over the replicas"
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    output = tempfile.mkdtemp(prefix="mp-scaling-")
    procs = []
    for i in range(args.processes):
        env = {k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND", "JAX_PLATFORMS")}
        env.update(TF_CPP_MIN_LOG_LEVEL="3", XLA_FLAGS=f"--xla_force_host_platform_device_count={args.devices}")
        if args.processes > 1:
            env.update(KERAS_DISTRIBUTION_JOB_ADDRESSES=",".join([f"localhost:{port}"] * args.processes),
                       KERAS_DISTRIBUTION_NUM_PROCESSES=str(args.processes), KERAS_DISTRIBUTION_PROCESS_ID=str(i))
        command = [sys.executable, "-m", "train", "--keras-backend", "jax", "--data", args.data, "--output", output,
                   "--model", args.model, "--epochs", str(args.epochs), "--seed", str(args.seed),
                   "--batch-size", str(args.global_batch // replicas), "--quiet"]
        if args.no_augment:
            command.append("--no-augment")
        procs.append(subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                      stderr=open(os.path.join(output, f".stderr-{i}"), "w")))
    codes = [proc.wait(timeout=6 * 3600) for proc in procs]
    assert codes == [0] * args.processes, (codes, output)
    with open(os.path.join(output, "history.csv")) as f:
        rows = list(csv.DictReader(f))
    with open(os.path.join(output, "manifest.json")) as f:
        manifest = json.load(f)
    training = manifest["training"]
    images = training["steps_per_epoch"] * training["global_batch"]
    timed = [float(r["epoch_time_s"]) for r in rows[1:]] or [float(rows[0]["epoch_time_s"])]
    print(json.dumps({
        "processes": args.processes, "devices_per_process": args.devices, "replicas": training["replicas"],
        "global_batch": training["global_batch"], "epochs": training["recipe"]["epochs"],
        "train_images": training["train_images"], "augment": training["recipe"]["augment"],
        "epoch_s": [round(float(r["epoch_time_s"]), 1) for r in rows],
        "images_per_s": round(images / (sum(timed) / len(timed)), 1),
        "test_accuracy": manifest["metrics"]["test_accuracy"], "test_images": manifest["metrics"]["test_images"],
        "output": output,
    }), flush=True)


def slice_zip(path, train, test):
    """The first ``train`` / ``test`` images of each class of ``path``, as a folder tree; returns its path."""
    root = tempfile.mkdtemp(prefix="mp-slice-")
    wanted, taken = {"train": train, "test": test}, {}
    with zipfile.ZipFile(path) as archive:
        for name in archive.namelist():
            parts = name.split("/")
            if len(parts) < 3 or not parts[-1] or parts[-3] not in wanted:
                continue
            key = (parts[-3], parts[-2])
            if taken.get(key, 0) >= wanted[parts[-3]]:
                continue
            taken[key] = taken.get(key, 0) + 1
            os.makedirs(os.path.join(root, *key), exist_ok=True)
            with open(os.path.join(root, *key, parts[-1]), "wb") as f:
                f.write(archive.read(name))
    return root


if __name__ == "__main__":
    main()
