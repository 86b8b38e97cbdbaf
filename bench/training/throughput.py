"""Training throughput of a registered model: float32 against mixed bfloat16, and the tf.data
pipeline against the same model fed from in-memory tensors. Side by side, interleaved, in one run.

Typical usage::

    python -m bench.training.throughput --data ../shared/data/cifar10-jpeg.zip --model seed_cnn [--json bench/records/NAME.json]

Each configuration trains ``--steps`` steps after ``--warmup`` untimed ones, ``--repeats`` times in
turn (A B C A B C ...); the median images per second is reported. "pipeline" is the training
stage's own input: ``train.data.train_dataset`` (cache, shuffle, batch, augment, prefetch) over the
real images; "in-memory" is one fixed batch already in memory, repeated: an input that costs nothing.
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras
import tensorflow as tf

from bench import record
from contract.recipe import Recipe
from train import data, models


def build(model_name, policy, num_classes):
    keras.mixed_precision.set_global_policy(policy)
    model = models.build_model(model_name, num_classes)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
    keras.mixed_precision.set_global_policy("float32")
    return model


def images_per_second(model, dataset, steps, warmup, batch):
    iterator = iter(dataset)
    # Keras's own train step, without fit()'s callbacks and progress bar in the timing.
    model.make_train_function()
    train_step = model.train_function
    for _ in range(warmup):
        train_step(iterator)
    started = time.perf_counter()
    for _ in range(steps):
        logs = train_step(iterator)
    float(logs["loss"])  # wait for the last step to finish
    return steps * batch / (time.perf_counter() - started)


def pipeline_ms_per_batch(dataset, batches=300, warmup=20):
    """The input pipeline alone: milliseconds to produce one batch, with no model running."""
    iterator = iter(dataset)
    for _ in range(warmup):
        next(iterator)
    started = time.perf_counter()
    for _ in range(batches):
        images, _ = next(iterator)
    images.numpy()
    return (time.perf_counter() - started) / batches * 1000


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="../shared/data/cifar10-jpeg.zip")
    p.add_argument("--model", default="seed_cnn")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--json", help="write the record here (bench/records/NAME.json)")
    args = p.parse_args(argv)

    splits = data.load(args.data)
    pipeline = data.train_dataset(splits.x_train, splits.y_train, args.batch_size, Recipe(augment=True), seed=0).repeat()
    first = next(iter(pipeline))
    in_memory = tf.data.Dataset.from_tensors(first).repeat()

    configs = {
        "float32, tf.data pipeline": ("float32", pipeline),
        "mixed_bfloat16, tf.data pipeline": ("mixed_bfloat16", pipeline),
        "mixed_bfloat16, in-memory tensors": ("mixed_bfloat16", in_memory),
        "float32, in-memory tensors": ("float32", in_memory),
    }
    built = {name: build(args.model, policy, splits.num_classes) for name, (policy, _) in configs.items()}
    results = {name: [] for name in configs}
    for _ in range(args.repeats):
        for name, (_, dataset) in configs.items():
            results[name].append(images_per_second(built[name], dataset, args.steps, args.warmup, args.batch_size))

    alone = pipeline_ms_per_batch(pipeline)
    print(f"model {args.model}, batch {args.batch_size}, {args.steps} timed steps x {args.repeats} repeats (median)")
    medians = {name: statistics.median(v) for name, v in results.items()}
    for name, value in medians.items():
        print(f"  {name:36s} {value:8.0f} img/s   (runs: {', '.join(f'{v:.0f}' for v in results[name])})")
    bf16 = medians["mixed_bfloat16, tf.data pipeline"]
    print(f"mixed_bfloat16 / float32 (pipeline):          {bf16 / medians['float32, tf.data pipeline']:.2f}x")
    print(f"pipeline / in-memory (mixed_bfloat16):        {bf16 / medians['mixed_bfloat16, in-memory tensors']:.2f}")
    print(f"pipeline / in-memory (float32):               "
          f"{medians['float32, tf.data pipeline'] / medians['float32, in-memory tensors']:.2f}")
    step_ms = args.batch_size / medians["mixed_bfloat16, in-memory tensors"] * 1000
    print(f"the pipeline alone, no model: {alone:.2f} ms a batch ({alone / step_ms:.1%} of a {step_ms:.0f} ms "
          f"mixed_bfloat16 step, {alone * medians['float32, in-memory tensors'] / args.batch_size / 1000:.1%} of a float32 one)")
    record.write(args.json, {"model": args.model, "batch": args.batch_size, "images_per_s": medians, "rounds": results,
                             "pipeline_alone_ms_a_batch": alone}, __spec__.name, argv)


if __name__ == "__main__":
    main()
