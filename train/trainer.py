"""Train a registered model on TPU, GPUs, several workers or the CPU; hand the weights to the host.

Typical usage::

    python -m train --data cifar10 --output runs/seed --epochs 50
    python -m train --data ../shared/data/cifar10-jpeg.zip --output runs/seed --tpu local

Everything goes under ``--output DIR``:

* ``model.weights.h5`` - the trained weights, float32, copied to the host;
* ``manifest.json`` - what export needs to rebuild and verify the model (written last:
  its presence means the run is complete);
* ``eval/`` - test accuracy, per-class accuracy and the confusion matrix (JSON and PNG);
* ``history.csv`` and ``curves.png``; ``logs/`` for TensorBoard; ``backup/`` while running.

Re-running the same command after a kill resumes from the last finished epoch.
"""

import argparse
import dataclasses
import datetime
import json
import os
import platform
import shutil
import sys
import tempfile
import time

from contract import CHANNELS, IMAGE_SIZE, MANIFEST_FILE, RESIZE_METHOD, WEIGHTS_FILE, sha256_file

DEFAULT_DATA = "cifar10"
DEFAULT_OUTPUT = "runs/latest"
DEFAULT_MODEL = "seed_cnn"
DEFAULT_PROBE_SEED = 20180921
TPU_STEPS_PER_EXECUTION = 32  # amortises host round trips on a TPU
MANIFEST_FORMAT = 1


class UsageError(Exception):
    """A problem the user can fix; reported as one line with exit code 2."""


@dataclasses.dataclass
class Config:
    data: str = DEFAULT_DATA
    output: str = DEFAULT_OUTPUT
    model: str = DEFAULT_MODEL
    epochs: int = None  # None: the model's recipe
    batch_size: int = None  # per replica; None: the recipe's (128 for seed_cnn, as the seed tutorial)
    learning_rate: float = None  # None: the recipe's rate, scaled to the global batch
    schedule: str = None
    augment: bool = None
    crop_padding: int = None
    label_smoothing: float = None
    precision: str = "auto"
    tpu: str = "auto"
    steps_per_execution: int = None  # None: 32 on TPU, 1 elsewhere
    profile_steps: tuple = None
    seed: int = 0
    overwrite: bool = False
    verbose: int = 1


def run(config, strategy=None, splits=None):
    """Train as ``config`` says and return the manifest.

    Args:
      strategy: a ``tf.distribute.Strategy`` to use instead of picking one (tests pass
        an 8-replica MirroredStrategy here).
      splits: a :class:`train.data.Splits` to use instead of loading ``config.data``.
    """
    import keras
    import numpy as np
    import tensorflow as tf

    from train import accelerators, data, models, report

    try:
        recipe = models.recipe(config.model)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    output = os.path.abspath(config.output)
    manifest_path = os.path.join(output, MANIFEST_FILE)
    if os.path.exists(manifest_path) and not config.overwrite:
        with open(manifest_path) as f:
            manifest = json.load(f)
        _say(config, f"{output} already holds a finished run ({manifest['model']['name']}); "
                     "pass --overwrite to train again")
        return manifest

    # Everything that can fail on bad input happens before anything is written.
    if strategy is None:
        try:
            strategy = accelerators.select_strategy(config.tpu)
        except accelerators.AcceleratorError as exc:
            raise UsageError(str(exc)) from None
    if splits is None:
        try:
            splits = data.load(config.data)
        except data.DataError as exc:
            raise UsageError(str(exc)) from None
    hardware = accelerators.kind(strategy)
    try:
        precision = accelerators.resolve_precision(config.precision, hardware)
    except accelerators.AcceleratorError as exc:
        raise UsageError(str(exc)) from None

    epochs = config.epochs or recipe.epochs
    augment = recipe.augment if config.augment is None else config.augment
    crop_padding = recipe.crop_padding if config.crop_padding is None else config.crop_padding
    schedule = config.schedule or recipe.schedule
    label_smoothing = recipe.label_smoothing if config.label_smoothing is None else config.label_smoothing
    replicas = strategy.num_replicas_in_sync
    batch_size = config.batch_size or recipe.batch_size
    global_batch = batch_size * replicas
    steps_per_epoch = len(splits.x_train) // global_batch
    if steps_per_epoch < 1:
        raise UsageError(f"{len(splits.x_train)} training images are fewer than one global batch of {global_batch}")
    learning_rate = config.learning_rate or _scaled_rate(recipe, global_batch)
    steps_per_execution = config.steps_per_execution or (TPU_STEPS_PER_EXECUTION if hardware == "tpu" else 1)
    chief = accelerators.is_chief(strategy)
    # Non-chief workers must still write (collectives need everyone); they write to scratch.
    workdir = output if chief else tempfile.mkdtemp(prefix="train-worker-")
    try:
        os.makedirs(workdir, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create output directory {output}: {exc.strerror}") from None

    _say(config, f"strategy={type(strategy).__name__} hardware={hardware} replicas={replicas} "
                 f"global_batch={global_batch} precision={precision} model={config.model} epochs={epochs} "
                 f"lr={learning_rate:.4g} schedule={schedule} augment={_describe_augmentation(augment, crop_padding)} steps_per_execution={steps_per_execution}")

    if config.overwrite and chief and os.path.exists(manifest_path):
        # Train a finished run again from scratch. An interrupted one (no manifest yet)
        # keeps its backup, so re-running this same command after a kill still resumes.
        shutil.rmtree(os.path.join(workdir, "backup"), ignore_errors=True)
        for stale in ("history.csv", MANIFEST_FILE):
            if os.path.exists(os.path.join(workdir, stale)):
                os.remove(os.path.join(workdir, stale))

    keras.utils.set_random_seed(config.seed)
    one_hot = label_smoothing > 0
    num_classes = splits.num_classes
    train_ds = data.train_dataset(
        splits.x_train, splits.y_train, global_batch, augment, seed=config.seed, crop_padding=crop_padding
    )
    val_ds = data.eval_dataset(splits.x_test, splits.y_test, global_batch)
    if one_hot:
        train_ds = train_ds.map(lambda x, y: (x, tf.one_hot(y, num_classes)))
        val_ds = val_ds.map(lambda x, y, w: (x, tf.one_hot(y, num_classes), w))

    previous_policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(precision)
    try:
        with strategy.scope():
            model = models.build_model(config.model, num_classes)
            model.compile(
                optimizer=_optimizer(recipe, learning_rate, schedule, epochs * steps_per_epoch),
                loss=(keras.losses.CategoricalCrossentropy(label_smoothing=label_smoothing) if one_hot
                      else keras.losses.SparseCategoricalCrossentropy()),
                # Weighted, so the zero-weight padding of the last evaluation batch never counts.
                weighted_metrics=["accuracy"],
                steps_per_execution=steps_per_execution,
            )
        callbacks = [
            keras.callbacks.BackupAndRestore(os.path.join(workdir, "backup")),
            report.EpochTimer(),
            keras.callbacks.CSVLogger(os.path.join(workdir, "history.csv"), append=True),
            keras.callbacks.TensorBoard(
                os.path.join(workdir, "logs"), profile_batch=config.profile_steps or 0
            ),
        ]
        started = time.monotonic()
        model.fit(
            train_ds,
            epochs=epochs,
            steps_per_epoch=steps_per_epoch,
            validation_data=val_ds,
            shuffle=False,  # the dataset shuffles itself
            callbacks=callbacks,
            verbose=config.verbose,
        )
        wall_time = time.monotonic() - started
        weights_path = os.path.join(workdir, WEIGHTS_FILE)
        _save_weights_atomically(model, weights_path)
    finally:
        keras.mixed_precision.set_global_policy(previous_policy)

    if not chief:
        return None

    # The handover: a fresh float32 model on the host, from the saved file alone.
    with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
        host_model = models.build_model(config.model, num_classes)
    host_model.load_weights(weights_path)
    probe = models.probe_batch(DEFAULT_PROBE_SEED)
    probe_outputs = host_model(probe.astype("float32"), training=False).numpy()
    evaluation = report.evaluate(host_model, splits, os.path.join(output, "eval"))
    report.plot_history(os.path.join(output, "history.csv"), os.path.join(output, "curves.png"))

    manifest = {
        "format": MANIFEST_FORMAT,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model": {"name": config.model, "kwargs": {}},
        "class_names": list(splits.class_names),
        "num_classes": num_classes,
        "input": {
            "shape": [IMAGE_SIZE, IMAGE_SIZE, CHANNELS],
            "dtype": "uint8",
            "range": [0, 255],
            "color": "RGB",
            "resize": RESIZE_METHOD,
            "preprocessing": "none outside the model: raw pixels in, normalisation is the model's first layer",
        },
        "weights": {"file": WEIGHTS_FILE, "dtype": "float32", "sha256": sha256_file(weights_path)},
        "training": {
            "data": splits.source or config.data,
            "train_images": int(len(splits.x_train)),
            "test_images": int(len(splits.x_test)),
            "strategy": type(strategy).__name__,
            "hardware": hardware,
            "replicas": replicas,
            "batch_size_per_replica": batch_size,
            "global_batch": global_batch,
            "precision": precision,
            "epochs": epochs,
            "steps_per_epoch": steps_per_epoch,
            "steps_per_execution": steps_per_execution,
            "optimizer": recipe.optimizer,
            "learning_rate": learning_rate,
            "schedule": schedule,
            "augment": augment,
            "crop_padding": crop_padding,
            "label_smoothing": label_smoothing,
            "weight_decay": recipe.weight_decay,
            "seed": config.seed,
            "wall_time_s": round(wall_time, 1),
        },
        "metrics": {
            "test_accuracy": evaluation["accuracy"],
            "test_loss": evaluation["loss"],
            "test_images": evaluation["count"],
        },
        "versions": _versions(),
        "fingerprint": {
            "seed": DEFAULT_PROBE_SEED,
            "shape": list(probe.shape),
            "dtype": "uint8",
            "inputs_sha256": models.probe_digest(probe),
            "outputs": np.asarray(probe_outputs, dtype=np.float32).tolist(),
        },
    }
    _write_json_atomically(manifest_path, manifest)
    _say(config, f"test accuracy {evaluation['accuracy']:.4f} on {evaluation['count']} images; "
                 f"weights and manifest in {output}")
    return manifest


def _describe_augmentation(augment, crop_padding):
    if not augment:
        return "off"
    return f"crop(pad {crop_padding})+flip" if crop_padding else "flip"


def _scaled_rate(recipe, global_batch):
    ratio = global_batch / recipe.reference_batch
    return recipe.learning_rate * (ratio if recipe.lr_scaling == "linear" else ratio ** 0.5)


def _optimizer(recipe, learning_rate, schedule, total_steps):
    import keras

    if schedule == "onecycle":
        warmup = max(1, int(total_steps * recipe.warmup_fraction))
        rate = keras.optimizers.schedules.CosineDecay(
            initial_learning_rate=learning_rate / 10,
            decay_steps=max(1, total_steps - warmup),
            alpha=0.0,
            warmup_target=learning_rate,
            warmup_steps=warmup,
        )
    elif schedule == "constant":
        rate = learning_rate
    else:
        raise UsageError(f"unknown schedule {schedule!r}; choose constant or onecycle")
    weight_decay = recipe.weight_decay or None
    if recipe.optimizer == "sgd":
        return keras.optimizers.SGD(rate, momentum=recipe.momentum, nesterov=True, weight_decay=weight_decay)
    return keras.optimizers.Adam(rate, weight_decay=weight_decay)


def _save_weights_atomically(model, path):
    directory = os.path.dirname(path)
    # Keras insists on the .weights.h5 suffix, so the temporary name keeps it.
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".weights.h5")
    os.close(fd)
    try:
        model.save_weights(tmp, overwrite=True)
        os.chmod(tmp, 0o644)  # mkstemp makes files private; a run directory is shared
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _write_json_atomically(path, obj):
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def _versions():
    import h5py
    import keras
    import numpy
    import tensorflow

    return {
        "python": platform.python_version(),
        "tensorflow": tensorflow.__version__,
        "keras": keras.__version__,
        "numpy": numpy.__version__,
        "h5py": h5py.__version__,
    }


def _say(config, line):
    if config.verbose:
        print(line, flush=True)


def _profile_steps(text):
    try:
        first, last = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError("expected two step numbers, e.g. 10,20") from None
    if not 0 < first <= last:
        raise argparse.ArgumentTypeError("expected 0 < A <= B")
    return first, last


def _int_at_least(minimum):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}")
        return value

    return parse


_positive_int = _int_at_least(1)


def build_parser():
    from train.accelerators import PRECISIONS

    p = argparse.ArgumentParser(prog="python -m train", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=os.environ.get("CIFAR_DATA", DEFAULT_DATA),
                   help="'cifar10' (Keras's downloader), a folder or .zip of train/<class>/ and test/<class>/ "
                        "images, or cifar-10-binary.tar.gz (default: $CIFAR_DATA or cifar10)")
    p.add_argument("--output", default=DEFAULT_OUTPUT, help="run directory for weights, manifest, logs (default: %(default)s)")
    p.add_argument("--model", default=DEFAULT_MODEL, help="registered model name (default: %(default)s)")
    p.add_argument("--epochs", type=_positive_int, help="passes over the training set (default: the model's recipe)")
    p.add_argument("--batch-size", type=_positive_int,
                   help="images per replica per step; the global batch is this times the replicas "
                        "(default: the recipe's, 128 for seed_cnn as in the seed tutorial)")
    p.add_argument("--learning-rate", type=float,
                   help="peak learning rate (default: the recipe's, scaled to the global batch)")
    p.add_argument("--schedule", choices=("constant", "onecycle"), help="learning-rate schedule (default: the recipe's)")
    p.add_argument("--augment", action=argparse.BooleanOptionalAction,
                   help="random crop after padding (--crop-padding) and horizontal flip (default: the recipe's)")
    p.add_argument("--crop-padding", type=_int_at_least(0), metavar="PIXELS",
                   help="with --augment: reflection padding before the random crop; 0 flips only (default: 4)")
    p.add_argument("--label-smoothing", type=float, help="label smoothing, 0-1 (default: the recipe's)")
    p.add_argument("--precision", choices=PRECISIONS, default="auto",
                   help="auto: bfloat16 on TPU and on CPUs with bf16 units, float16 on GPUs (default: %(default)s)")
    p.add_argument("--tpu", nargs="?", const="auto", default="auto",
                   help="'auto' (use a TPU when present), 'none', 'local' (TPU VM, Colab), a TPU name or grpc:// address")
    p.add_argument("--steps-per-execution", type=_positive_int,
                   help=f"steps per compiled call (default: {TPU_STEPS_PER_EXECUTION} on TPU, 1 elsewhere)")
    p.add_argument("--profile-steps", type=_profile_steps, metavar="A,B",
                   help="capture a TensorBoard profile of steps A to B")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    p.add_argument("--overwrite", action="store_true", help="train again even if OUTPUT holds a finished run")
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary lines")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    config = Config(
        data=args.data, output=args.output, model=args.model, epochs=args.epochs, batch_size=args.batch_size,
        learning_rate=args.learning_rate, schedule=args.schedule, augment=args.augment,
        crop_padding=args.crop_padding, label_smoothing=args.label_smoothing, precision=args.precision, tpu=args.tpu,
        steps_per_execution=args.steps_per_execution, profile_steps=args.profile_steps, seed=args.seed,
        overwrite=args.overwrite,
        # A progress bar on a terminal; one line per epoch in a log file.
        verbose=0 if args.quiet else (1 if sys.stdout.isatty() else 2),
    )
    try:
        run(config)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
