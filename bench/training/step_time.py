"""The trainer's compiled train step, timed on one batch in memory, under settings that must be made before
TensorFlow loads (oneDNN's math mode, the allocator): each variant in a fresh process, alternated.

Typical usage::

    python -m bench.training.step_time --batch 1000 --variant mixed_bfloat16 \\
        --variant "mixed_bfloat16 LD_PRELOAD=libtcmalloc_minimal.so.4" --variant float32 \\
        --variant "float32 ONEDNN_DEFAULT_FPMATH_MODE=BF16" --rounds 3 \\
        --json bench/records/training-step-airbench_muon-b1000-avx512-bf16.json

A variant is a Keras precision policy, then any ``NAME=VALUE`` environment settings. Each round runs
every variant once, in order, in its own process: the model built as the trainer builds it and compiled
by the trainer's own ``train.trainer.compile_model``, one untimed step that compiles, two more
untimed, then ``--repeats`` timed ``train_on_batch`` calls on a batch of random images; the median is
the variant's figure for the round. ``vmstat``'s runnable processes and CPU shares beside each process
say whether the machine was quiet. The step's arithmetic does not depend on the pixels.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from bench import record
from bench.training.vmstat import Vmstat

CHILD = """
import json, statistics, time
from train import hardware
hardware.prepare_environment("tensorflow")
import keras, numpy as np
from train import losses, models, schedules, trainer
model_name, batch, precision, repeats = {model!r}, {batch}, {precision!r}, {repeats}
keras.mixed_precision.set_global_policy(precision)
recipe = models.recipe(model_name)
rng = np.random.default_rng(0)
images = rng.integers(0, 256, (batch, 32, 32, 3), dtype=np.uint8)
labels = rng.integers(0, 10, batch)
if losses.one_hot(recipe):  # a recipe with label smoothing trains on one-hot labels, as in train.trainer
    labels = np.eye(10, dtype="float32")[labels]
keras.utils.set_random_seed(0)
model = models.build_model(model_name, 10)
models.prepare(model_name, model, images)
trainer.compile_model(model, recipe, schedules.scaled_rate(recipe, batch), total_steps=1000)
x = images.astype("float32")
start = time.perf_counter(); model.train_on_batch(x, labels); first = time.perf_counter() - start
for _ in range(2):
    model.train_on_batch(x, labels)
times = []
for _ in range(repeats):
    start = time.perf_counter(); model.train_on_batch(x, labels); times.append(time.perf_counter() - start)
print(json.dumps({{"first_step_s": first, "median_s": statistics.median(times), "times_s": times}}))
"""


def run_variant(variant, model, batch, repeats):
    """One variant's step times in a fresh process (run from the repository root), with vmstat's shares beside it."""
    precision, *settings = variant.split()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **dict(setting.split("=", 1) for setting in settings)}
    vmstat = Vmstat(every=2)
    started = time.monotonic()
    try:
        result = subprocess.run([sys.executable, "-c", CHILD.format(model=model, batch=batch, precision=precision,
                                                                    repeats=repeats)],
                                cwd=record.ROOT, env=env, capture_output=True, text=True)
    finally:
        vmstat.stop()
    if result.returncode:
        lines = result.stderr.strip().splitlines() or [f"exit status {result.returncode}"]
        raise SystemExit(f"step_time: the variant {variant!r} failed: {lines[-1]}")
    out = json.loads(result.stdout.strip().splitlines()[-1])
    out["vmstat"] = vmstat.summary(started, time.monotonic())
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="airbench_muon")
    p.add_argument("--batch", type=int, default=2000)
    p.add_argument("--variant", action="append", required=True,
                   help="a precision policy, then NAME=VALUE environment settings, e.g. \"float32 ONEDNN_DEFAULT_FPMATH_MODE=BF16\"")
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", help="write the record here (bench/records/training-step-NAME.json)")
    args = p.parse_args(argv)
    rounds = []
    for _ in range(args.rounds):
        rounds.append({variant: run_variant(variant, args.model, args.batch, args.repeats) for variant in args.variant})
        print(json.dumps({v: round(r["median_s"], 3) for v, r in rounds[-1].items()}), flush=True)
    medians = {v: [r[v]["median_s"] for r in rounds] for v in args.variant}
    record.write(args.json, {"model": args.model, "batch": args.batch, "repeats": args.repeats,
                             "median_step_s": {v: [round(m, 3) for m in ms] for v, ms in medians.items()},
                             "rounds": rounds, "table": table(args.model, args.batch, medians)}, __spec__.name, argv)


def table(model, batch, medians):
    """The record's table: each variant's step, the median of its rounds' medians, against the first variant's."""
    first = next(iter(medians.values()))
    rows = [[f"`{variant}`", statistics.median(ms), min(ms), max(ms), statistics.median(ms) / statistics.median(first)]
            for variant, ms in medians.items()]
    return {"columns": [f"seconds a step, `{model}`, batch {batch:,}", f"median of {len(first)} rounds",
                        "lowest round", "highest round", "against the first"],
            "rows": rows, "formats": [None, "{:.3f}", "{:.3f}", "{:.3f}", "{:.2f}x"]}


if __name__ == "__main__":
    main()
