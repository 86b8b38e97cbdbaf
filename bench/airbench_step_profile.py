"""Where a training step of ``airbench`` goes on this CPU: the step as the trainer runs it, its parts, and its ops.

The control is ``bench/airbench94_step_profile.py``, which times airbench94's own PyTorch code the same
way; run the two back to back on a quiet machine and divide. Both train on the same shape of data
(``--images`` random 32x32 images, batch 1024): the step's arithmetic does not depend on the pixels.

    python bench/airbench_step_profile.py [--keras-backend jax] [--json out.json]
    python bench/airbench_step_profile.py --model airbench_muon --gelu keras   # the GELU as Keras computes it

Timed, each the median of ``--repeats`` after ``--warmup`` untimed:

* ``fit_step``: ``model.fit`` over the trainer's own input (``train.data.train_dataset``: cache,
  shuffle, batch, random translations, alternating flips, prefetch) with the recipe's callbacks
  (whitening-bias hold, lookahead), per step. What an epoch costs, divided by its steps.
* ``train_step``: Keras's compiled train step on one batch already in memory (``train_on_batch``).
* ``forward_backward``: the loss (label smoothing, the L2 penalties) and its gradients, no update.
* ``forward``: the network in training mode (BatchNorm on batch statistics), no gradients.
* ``optimizer``: the recipe's optimizer applying fixed gradients to every weight.
* ``input``: the input pipeline alone, per batch.

With TensorFlow it also records a profiler trace of ``--trace-steps`` train steps and sums the ops'
own time by kind (convolutions and their gradients, BatchNorm, GELU, pooling, the optimizer's
updates, the rest).
"""

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from contract.arguments import add_renamed  # noqa: E402  (after the path is set)
from emit import emit  # noqa: E402  (bench/, the script's own folder)
from gelu_kernels import add_gelu_argument, use_gelu  # noqa: E402  (imports neither TensorFlow nor JAX)
from train.hardware import PRECISIONS  # noqa: E402  (imports neither TensorFlow nor JAX)

KINDS = (  # (kind, substrings of TensorFlow op types), first match wins
    ("convolution backward", ("Conv2DBackprop",)),
    ("convolution forward", ("Conv2D",)),  # and _FusedConv2D, _MklNativeConv2D
    ("batchnorm", ("BatchNorm", "Moments", "SquaredDifference", "Rsqrt")),
    ("gelu", ("Erf", "Gelu", "XlaLaunch", "_XlaRun")),  # the XLA calls are the fused GELU's (train.airbench.GELU)
    ("pooling", ("MaxPool",)),
    ("optimizer updates", ("ResourceApply", "AssignVariable", "AssignAddVariable", "AssignSubVariable",
                           "ReadVariable")),
    ("matmul (logits)", ("MatMul",)),
)


PARTS = ("fit_step", "train_step", "forward_backward", "forward", "optimizer", "input")


def median_seconds(call, repeats, warmup):
    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def op_types(op_stats):
    """{op type: seconds of its own time on the host} from the profiler's framework op table."""
    table = json.loads(op_stats)
    rows = table[0] if isinstance(table, list) else table
    columns = [column["label"] for column in rows["cols"]]
    where, op_type, self_time = (columns.index(label) for label in
                                 ("Host/device", "Operation Type", "Total self-time (us)"))
    types = {}
    for row in rows["rows"]:
        cells = [cell["v"] for cell in row["c"]]
        if cells[where] == "Host" and cells[op_type] != "IDLE":
            types[cells[op_type]] = types.get(cells[op_type], 0.0) + cells[self_time] / 1e6
    return types


def summarise(types, steps, kinds=KINDS, top=15):
    """``({kind: seconds a step}, {op type: seconds a step} of the top ``top``)`` from ``{op type: seconds}``."""
    by_kind = {}
    for name, seconds in types.items():
        kind = next((k for k, parts in kinds if any(part in name for part in parts)), "other")
        by_kind[kind] = by_kind.get(kind, 0.0) + seconds

    def per_step(table, count=None):
        ranked = sorted(table.items(), key=lambda kv: -kv[1])[:count]
        return {name: round(seconds / steps, 3) for name, seconds in ranked}

    return per_step(by_kind), per_step(types, top)


def trace_ops(model, x, y, steps):
    import tensorflow as tf
    from tensorflow.python.profiler.internal import _pywrap_profiler_plugin as plugin

    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        for _ in range(steps):
            model.train_on_batch(x, y)
        tf.profiler.experimental.stop()
        planes = [os.path.join(root, name) for root, _, names in os.walk(logdir) for name in names
                  if name.endswith(".xplane.pb")]
        data, _ = plugin.xspace_to_tools_data(planes, "framework_op_stats", {})
    return summarise(op_types(data.decode() if isinstance(data, bytes) else data), steps)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_renamed(parser, "--keras-backend", "--backend", choices=("tensorflow", "jax"), default="tensorflow")
    parser.add_argument("--images", type=int, default=10240, help="random training images (10 steps an epoch)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--trace-steps", type=int, default=3, help="steps in the profiler trace (TensorFlow; 0: none)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"which of {','.join(PARTS)} to time")
    parser.add_argument("--inter-op-threads", type=int, help="TensorFlow's ops run at once (default: its own)")
    parser.add_argument("--model", default="airbench", choices=("airbench", "airbench_fast", "airbench_muon"),
                        help="which of the family, at its recipe's batch (default: %(default)s)")
    parser.add_argument("--precision", default="auto", choices=PRECISIONS,
                        help="as the trainer's flag (auto: mixed bfloat16 on CPUs with bf16 units, else float32)")
    add_gelu_argument(parser)
    parser.add_argument("--json", help="also write the report here")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    if parts - set(PARTS):
        parser.error(f"--parts: unknown {sorted(parts - set(PARTS))}")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from train import hardware

    hardware.prepare_environment(args.keras_backend)  # as the trainer sets it: oneDNN on unless TF_ENABLE_ONEDNN_OPTS=0

    import keras
    import numpy as np

    if args.inter_op_threads:
        import tensorflow as tf

        tf.config.threading.set_inter_op_parallelism_threads(args.inter_op_threads)

    from train import data, losses, models, schedules

    use_gelu(args.gelu)
    precision = hardware.resolve_precision(args.precision, "cpu")
    keras.mixed_precision.set_global_policy(precision)
    recipe = models.recipe(args.model)
    batch, steps_per_epoch = recipe.batch_size, args.images // recipe.batch_size
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (args.images, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, args.images)
    total_steps = recipe.epochs * steps_per_epoch

    keras.utils.set_random_seed(0)
    model = models.build_model(args.model, 10)
    models.prepare(args.model, model, images)
    loss = losses.for_recipe(recipe)  # the trainer's
    model.compile(optimizer=schedules.optimizer(recipe, schedules.scaled_rate(recipe, batch), recipe.schedule,
                                                total_steps),
                  loss=loss)
    one_hot = losses.one_hot(recipe)
    pipeline = data.train_dataset(images, labels, batch, recipe.augment, seed=0, crop_padding=recipe.crop_padding,
                                  num_classes=10 if one_hot else None, alternate_flips=recipe.alternate_flips)
    x = images[:batch].astype("float32")
    y = keras.utils.to_categorical(labels[:batch], 10) if one_hot else labels[:batch]
    report = {"keras_backend": args.keras_backend, "keras": keras.__version__, "python": platform.python_version(),
              "machine": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
              "onednn": os.environ["TF_ENABLE_ONEDNN_OPTS"], "inter_op_threads": args.inter_op_threads,
              "model": args.model, "precision": precision, "gelu": args.gelu, "batch": batch,
              "steps_per_epoch": steps_per_epoch, "repeats": args.repeats}

    def fit_epoch():
        model.fit(pipeline, epochs=1, steps_per_epoch=steps_per_epoch, verbose=0,
                  callbacks=models.training_callbacks(args.model, total_steps))

    seconds = {}
    if "fit_step" in parts:
        seconds["fit_step"] = median_seconds(fit_epoch, args.repeats, 1) / steps_per_epoch
    if "train_step" in parts:
        seconds["train_step"] = median_seconds(lambda: model.train_on_batch(x, y), args.repeats, args.warmup)

    network = model.get_layer("views").network
    weights = network.trainable_weights
    optimizer = model.optimizer
    if args.keras_backend == "tensorflow":
        import tensorflow as tf

        @tf.function
        def forward(x):
            return network(x, training=True)

        @tf.function
        def forward_backward(x, y):
            with tf.GradientTape() as tape:
                value = loss(y, tf.nn.softmax(tf.cast(network(x, training=True), tf.float32))) + tf.add_n(network.losses)
            return tape.gradient(value, weights)

        @tf.function
        def apply(gradients):
            optimizer.apply(gradients, weights)

        if "forward" in parts:
            seconds["forward"] = median_seconds(lambda: forward(x).numpy(), args.repeats, args.warmup)
        if "forward_backward" in parts:
            seconds["forward_backward"] = median_seconds(lambda: [g.numpy() for g in forward_backward(x, y)][0],
                                                         args.repeats, args.warmup)
        if "optimizer" in parts:
            gradients = forward_backward(x, y)
            seconds["optimizer"] = median_seconds(lambda: (apply(gradients), weights[0].numpy()),
                                                  args.repeats, args.warmup)
    if "input" in parts:
        iterator = iter(pipeline)
        seconds["input"] = median_seconds(lambda: next(iterator)[0].numpy(), args.repeats * 4, args.warmup)
    report["seconds"] = {name: round(value, 3) for name, value in seconds.items()}
    if args.keras_backend == "tensorflow" and args.trace_steps:
        report["op_seconds_per_step"], report["top_op_types"] = trace_ops(model, x, y, args.trace_steps)
    emit(report, args.json)


if __name__ == "__main__":
    main()
