"""Where a training step's time goes beyond the step: a registered model trained as the trainer trains it, fed by
its recipe's tf.data pipeline, against the same step fed one batch already in memory. Side by side, in one run.

Typical usage::

    python -m bench.training.throughput --data ../shared/data/cifar10-png.zip --model airbench_muon \\
        [--json bench/records/training-throughput-airbench_muon-KIND.json]

The model is built, initialised and compiled as ``python -m train`` does (the recipe's optimizer, schedule and
loss, at the precision it picks on this CPU) and trained by Keras's ``fit`` in the recipe's last epoch, where
all its callbacks act, three ways in turn each round, ``--steps`` timed steps after ``--warmup`` untimed ones:

* with the recipe's callbacks, fed by the pipeline: the trainer's loop less its progress lines and backups;
* without callbacks, fed by the pipeline;
* without callbacks, fed one batch of the pipeline again and again: an input that costs nothing.

The pipeline is the training stage's own input (``train.data.train_dataset`` with the recipe: cache, shuffle,
batch, crop and flips, corruption, prefetch) over the real images. It shares the CPU with the step, so what it
costs shows as the gap between the last two. Last, the pipeline alone: seconds a batch with no model running.
The record holds one table (seconds a step, median and range of the rounds) and the target that the pipeline
and the loop together add at most 5% to the step.
"""

import argparse
import statistics
import time

from bench import record
from bench.training.vmstat import Vmstat

#: The most the pipeline and the callbacks may add to the step (the first way against the last).
OVERHEAD = 0.05


def clock(keras):
    """A callback that keeps the wall time at the end of each training step (the step's loss read, so it has run)."""
    class Clock(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.ends = []

        def on_train_batch_end(self, batch, logs=None):
            float(logs["loss"])
            self.ends.append(time.perf_counter())

    return Clock()


def seconds_a_step(ends, warmup):
    """Wall seconds a step over the steps after the first ``warmup`` (from their step ends)."""
    return (ends[-1] - ends[warmup - 1]) / (len(ends) - warmup)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="../shared/data/cifar10-png.zip")
    p.add_argument("--model", default="airbench_muon")
    p.add_argument("--steps", type=int, default=10, help="timed steps of each way a round")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps of each way before its timed ones, a round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", help="write the record here (bench/records/training-throughput-MODEL-KIND.json)")
    args = p.parse_args(argv)
    if args.warmup < 1 or args.steps < 1 or args.rounds < 1:
        p.error("--warmup, --steps and --rounds must each be at least 1 (the first step compiles)")

    from train import hardware

    hardware.prepare_environment("tensorflow")
    import keras
    import tensorflow as tf

    from train import data, losses, models, schedules, trainer

    recipe = models.recipe(args.model)
    precision = hardware.resolve_precision("auto", "cpu")
    splits = data.load(args.data)
    num_classes = splits.num_classes
    pipeline = data.train_dataset(splits.x_train, splits.y_train, recipe.batch_size, recipe, seed=0,
                                  num_classes=num_classes if losses.one_hot(recipe) else None).repeat()
    in_memory = tf.data.Dataset.from_tensors(next(iter(pipeline))).repeat()
    total_steps = recipe.epochs * (len(splits.x_train) // recipe.batch_size)

    previous_policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(precision)
    keras.utils.set_random_seed(0)
    model = models.build_model(args.model, num_classes)
    models.prepare(args.model, model, splits.x_train)
    trainer.compile_model(model, recipe, schedules.scaled_rate(recipe, recipe.batch_size), total_steps)
    steps = args.warmup + args.steps
    timer = clock(keras)

    def fit(dataset, callbacks):
        # The recipe's last epoch, where every callback of the recipe acts; a new iterator, whose first batch
        # (the shuffle buffer's fill) is among the untimed ones.
        model.fit(dataset, steps_per_epoch=steps, initial_epoch=recipe.epochs - 1, epochs=recipe.epochs,
                  callbacks=[*callbacks, timer], shuffle=False, verbose=0)
        return seconds_a_step(timer.ends, args.warmup)

    ways = {"the recipe's callbacks, the pipeline": lambda: fit(pipeline, models.training_callbacks(args.model,
                                                                                                     total_steps)),
            "no callbacks, the pipeline": lambda: fit(pipeline, []),
            "no callbacks, one batch in memory": lambda: fit(in_memory, [])}
    rounds = {way: [] for way in ways}
    vmstat = Vmstat(every=2)
    started = time.monotonic()
    try:
        for number in range(args.rounds):
            for way, measure in ways.items():
                rounds[way].append(measure())
            print(f"round {number + 1}: " + ", ".join(f"{way} {times[-1]:.3f} s" for way, times in rounds.items()),
                  flush=True)
        batches = iter(pipeline)
        next(batches)
        alone_started = time.perf_counter()
        for _ in range(args.steps):
            images, _ = next(batches)
        images.numpy()
        alone = (time.perf_counter() - alone_started) / args.steps
    finally:
        vmstat.stop()
        keras.mixed_precision.set_global_policy(previous_policy)

    medians = {way: statistics.median(times) for way, times in rounds.items()}
    floor = medians["no callbacks, one batch in memory"]
    loop = medians["the recipe's callbacks, the pipeline"]
    rows = [[way, medians[way], min(times), max(times), medians[way] / floor] for way, times in rounds.items()]
    rows.append(["the pipeline alone, no model", alone, None, None, alone / floor])
    title = f"`{args.model}`, batch {recipe.batch_size:,}, {precision.replace('_', ' ')}"
    print("\n".join(f"{row[0]:40s} {row[1]:.3f} s a step ({row[4]:.2f}x the step in memory)" for row in rows))
    record.write(args.json, {
        "model": args.model, "batch": recipe.batch_size, "precision": precision, "steps": args.steps,
        "rounds_s": rounds, "pipeline_alone_s": alone, "vmstat": vmstat.summary(started, time.monotonic()),
        "table": {"columns": [f"seconds a step, {title}", f"median of {args.rounds} rounds", "lowest round",
                              "highest round", "against the step in memory"],
                  "rows": rows, "formats": [None, "{:.3f}", "{:.3f}", "{:.3f}", "{:.2f}x"]},
        "targets": [{"target": f"training, `{args.model}`: the pipeline and the loop add ≤ {OVERHEAD:.0%} to the step",
                     "measured": loop / floor - 1, "at_most": OVERHEAD, "format": "{:+.1%}"}],
    }, __spec__.name, argv)


if __name__ == "__main__":
    main()
