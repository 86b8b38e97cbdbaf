"""Train a registered model on TPU, GPUs, several workers or the CPU; hand the weights to the host.

Typical usage::

    python -m train --data cifar10 --output runs/seed
    python -m train --keras-backend jax --data ../shared/data/cifar10-jpeg.zip --output runs/seed

The same registered models and recipes train under either Keras backend: JAX (what TPUs
run today; data parallel over every local device) or TensorFlow (tf.distribute strategies).
The input pipeline is tf.data on the host for both. Everything goes under ``--output DIR``:

* ``model.weights.h5`` - the trained weights, float32, copied to the host (backend-neutral:
  export loads them under TensorFlow whichever backend trained);
* ``manifest.json`` - what export needs to rebuild and verify the model (written last:
  its presence means the run is complete);
* ``eval/`` - test accuracy, per-class accuracy and the confusion matrix (JSON and PNG);
* ``samples.npz`` - a seeded sample of training and test images for export's quantization;
* ``holdout.npz`` - with ``--holdout N``: the N training images kept out of training, for
  export's calibration (contract.confidence);
* ``history.csv`` and ``curves.png``; ``logs/`` for TensorBoard; ``backup/`` while running.

Re-running the same command after a kill resumes from the last finished epoch.
"""

import contextlib
import dataclasses
import os
import shutil
import sys
import time

from contract import MANIFEST_FILE, WEIGHTS_FILE
from contract import manifest as manifests

DEFAULT_DATA = "cifar10"
DEFAULT_OUTPUT = "runs/latest"
DEFAULT_MODEL = "seed_cnn"
TPU_STEPS_PER_EXECUTION = 32  # amortises host round trips on a TPU


class UsageError(Exception):
    """A problem the user can fix; reported as one line with exit code 2."""


@dataclasses.dataclass
class Config:
    data: str = DEFAULT_DATA
    output: str = DEFAULT_OUTPUT
    model: str = DEFAULT_MODEL
    keras_backend: str = "auto"  # "jax", "tensorflow", or "auto" (see train.hardware.pick_backend)
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
    validation_freq: int = 1  # evaluate on the test split every N epochs (the handover always does at the end)
    profile_steps: tuple = None
    seed: int = 0
    holdout: int = 0  # training images kept out of training for export's calibration (contract.confidence)
    overwrite: bool = False
    verbose: int = 1


@dataclasses.dataclass
class Plan:
    """The resolved settings of one run: the recipe, then the flags, then the hardware."""

    epochs: int
    batch_size: int  # per replica
    global_batch: int
    steps_per_epoch: int
    learning_rate: float
    schedule: str
    augment: bool
    crop_padding: int
    label_smoothing: float
    precision: str
    steps_per_execution: int


def run(config, strategy=None, splits=None):
    """Train as ``config`` says and return the manifest as a dict (None on a non-chief worker).

    Args:
      strategy: a ``tf.distribute.Strategy`` to use instead of picking one (tests pass
        an 8-replica MirroredStrategy here); implies the TensorFlow backend.
      splits: a :class:`train.data.Splits` to use instead of loading ``config.data``.
    """
    from train import hardware

    output = os.path.abspath(config.output)
    manifest_path = os.path.join(output, MANIFEST_FILE)
    if os.path.exists(manifest_path) and not config.overwrite:
        try:
            finished = manifests.read(manifest_path)
        except manifests.ManifestError as exc:
            raise UsageError(str(exc) if isinstance(exc, manifests.FormatError) else
                             f"{exc}; pass --overwrite to train again") from None
        _say(config, f"{output} already holds a finished run ({finished.model.name}); "
                     "pass --overwrite to train again")
        return finished.to_dict()

    # Everything that can fail on bad input happens before anything is written.
    backend = _choose_backend(config, strategy)
    from train import data, handover, quiet

    with quiet.native_startup():
        _load_tensorflow(backend)  # while its start-up noise is filtered
        from train import models

        try:
            recipe = models.recipe(config.model)
            placement = _place(backend, config.tpu, strategy)
        except (ValueError, hardware.AcceleratorError) as exc:  # an unknown model; an absent TPU
            raise UsageError(str(exc)) from None
    try:
        if splits is None:
            splits = data.load(config.data)
        splits, held_out = data.hold_out(splits, config.holdout)
        plan = _plan(config, recipe, placement, len(splits.x_train))
    except (hardware.AcceleratorError, data.DataError) as exc:
        raise UsageError(str(exc)) from None
    # Only the chief writes: the run, its logs and the backup every process resumes from.
    workdir = output
    if placement.chief:
        try:
            os.makedirs(workdir, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot create output directory {output}: {exc.strerror}") from None

    if placement.note:
        _say(config, placement.note)
    _say(config, f"backend={backend} strategy={placement.name} hardware={placement.hardware} "
                 f"replicas={placement.replicas} global_batch={plan.global_batch} precision={plan.precision} "
                 f"model={config.model} epochs={plan.epochs} lr={plan.learning_rate:.4g} schedule={plan.schedule} "
                 f"augment={_describe_augmentation(plan.augment, plan.crop_padding, recipe.alternate_flips)} "
                 f"steps_per_execution={plan.steps_per_execution}")

    if config.overwrite and placement.chief and os.path.exists(manifest_path):
        # Train a finished run again from scratch. An interrupted one (no manifest yet)
        # keeps its backup, so re-running this same command after a kill still resumes.
        shutil.rmtree(os.path.join(workdir, "backup"), ignore_errors=True)
        for stale in ("history.csv", MANIFEST_FILE):
            if os.path.exists(os.path.join(workdir, stale)):
                os.remove(os.path.join(workdir, stale))

    model, wall_time = _fit(config, recipe, plan, placement, splits, workdir)
    if not placement.chief:
        return None
    # Under JAX, outside the distribution: Keras makes a variable while saving, which would otherwise
    # be laid out over every process's devices (a collective the other processes are not in).
    with placement.host() if placement.backend == "jax" else contextlib.nullcontext():
        handover.save_weights_atomically(model, os.path.join(output, WEIGHTS_FILE))
    manifest = handover.hand_over(config, recipe, plan, placement, splits, output, wall_time, held_out)
    _say(config, f"test accuracy {manifest.metrics.test_accuracy:.4f} on {manifest.metrics.test_images} "
                 f"images; weights and manifest in {output}")
    return manifest.to_dict()


def _load_tensorflow(backend):
    """Import TensorFlow for tf.data; without it JAX trains on train.arrays' NumPy batches."""
    try:
        import tensorflow as tf
    except ImportError:
        if backend == "tensorflow":
            raise
        return
    if backend != "tensorflow":
        # tf.data only feeds the host; keep TensorFlow off the accelerators JAX is using.
        tf.config.set_visible_devices([], "GPU")


def _choose_backend(config, strategy):
    """The backend for this run, checked against a Keras this process may already have loaded."""
    from train import hardware

    loaded = hardware.loaded_backend()
    requested = "tensorflow" if strategy is not None else config.keras_backend
    if requested == "auto" and loaded:
        return loaded
    try:
        backend = hardware.pick_backend(requested)
    except hardware.AcceleratorError as exc:
        raise UsageError(str(exc)) from None
    if loaded and loaded != backend:
        raise UsageError(f"Keras is already loaded with the {loaded} backend in this process; "
                         f"train with --keras-backend {backend} in a new process")
    if not loaded:
        hardware.prepare_environment(backend)
    return backend


def _place(backend, tpu, strategy):
    if backend == "jax":
        from train import jax_devices

        return jax_devices.placement(tpu)
    from train import tf_devices

    return tf_devices.placement(tpu, strategy)


def _plan(config, recipe, placement, train_images):
    from train import hardware, schedules

    batch_size = config.batch_size or recipe.batch_size
    global_batch = batch_size * placement.replicas
    steps_per_epoch = train_images // global_batch
    if steps_per_epoch < 1:
        raise UsageError(f"{train_images} training images are fewer than one global batch of {global_batch}")
    return Plan(
        epochs=config.epochs or recipe.epochs,
        batch_size=batch_size,
        global_batch=global_batch,
        steps_per_epoch=steps_per_epoch,
        learning_rate=config.learning_rate or schedules.scaled_rate(recipe, global_batch),
        schedule=config.schedule or recipe.schedule,
        augment=recipe.augment if config.augment is None else config.augment,
        crop_padding=recipe.crop_padding if config.crop_padding is None else config.crop_padding,
        label_smoothing=recipe.label_smoothing if config.label_smoothing is None else config.label_smoothing,
        precision=hardware.resolve_precision(config.precision, placement.hardware),
        steps_per_execution=config.steps_per_execution
        or (TPU_STEPS_PER_EXECUTION if placement.hardware == "tpu" else 1),
    )


def _fit(config, recipe, plan, placement, splits, workdir):
    """Build, compile and fit under ``placement``; returns the model and the wall time in seconds."""
    import keras

    from train import models, schedules

    keras.utils.set_random_seed(config.seed)
    one_hot = plan.label_smoothing > 0
    num_classes = splits.num_classes
    labels = num_classes if one_hot else None
    pipelines = _pipelines()
    shard = _shard(placement)  # several processes: each feeds its own part of every global batch
    train_ds = pipelines.train_dataset(splits.x_train, splits.y_train, plan.global_batch, plan.augment,
                                       seed=config.seed, crop_padding=plan.crop_padding, num_classes=labels,
                                       alternate_flips=recipe.alternate_flips, shard=shard)
    val_ds = pipelines.eval_dataset(splits.x_test, splits.y_test, plan.global_batch, num_classes=labels, shard=shard)

    previous_policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(plan.precision)
    try:
        with placement.scope():
            model = models.build_model(config.model, num_classes)
            started = time.monotonic()
            models.prepare(config.model, model, splits.x_train)  # data-dependent initialisation, if any
            model.compile(
                optimizer=schedules.optimizer(recipe, plan.learning_rate, plan.schedule,
                                              plan.epochs * plan.steps_per_epoch),
                loss=(keras.losses.CategoricalCrossentropy(label_smoothing=plan.label_smoothing) if one_hot
                      else keras.losses.SparseCategoricalCrossentropy()),
                # Weighted, so the zero-weight padding of the last evaluation batch never counts.
                weighted_metrics=["accuracy"],
                steps_per_execution=plan.steps_per_execution,
            )
        model.fit(
            train_ds,
            epochs=plan.epochs,
            steps_per_epoch=plan.steps_per_epoch,
            validation_data=val_ds,
            validation_freq=config.validation_freq,
            shuffle=False,  # the dataset shuffles itself
            # The recipe's own first: they change the weights, which the others then save and log.
            callbacks=models.training_callbacks(config.model, plan.epochs * plan.steps_per_epoch)
            + _callbacks(config, placement, workdir),
            verbose=config.verbose,
        )
        return model, time.monotonic() - started
    finally:
        keras.mixed_precision.set_global_policy(previous_policy)


def _pipelines():
    """tf.data where TensorFlow is loaded (every TensorFlow run, and JAX beside it); else NumPy."""
    if "tensorflow" in sys.modules:
        from train import data

        return data
    from train import arrays

    return arrays


def _shard(placement):
    """``(index, count)`` of this process among the processes that share each global batch."""
    if placement.backend != "jax":
        return 0, 1  # TensorFlow trains in one process (multi-worker training is refused)
    from train import jax_devices

    return jax_devices.shard()


def _callbacks(config, placement, workdir):
    import keras

    from train import report

    logs = os.path.join(workdir, "logs")
    tensorboard_profile = config.profile_steps if placement.backend == "tensorflow" else None
    backup = os.path.join(workdir, "backup")
    if _shard(placement)[1] > 1:
        from train import jax_devices

        restore = jax_devices.ChiefBackup(backup, placement.chief)  # the others resume from the chief's
    else:
        restore = keras.callbacks.BackupAndRestore(backup)
    callbacks = [restore, report.EpochTimer()]
    if not placement.chief:
        return callbacks  # only the chief writes the run
    callbacks.append(keras.callbacks.CSVLogger(os.path.join(workdir, "history.csv"), append=True))
    if "tensorflow" in sys.modules:  # Keras writes TensorBoard summaries through tf.summary
        callbacks.append(keras.callbacks.TensorBoard(logs, profile_batch=tensorboard_profile or 0))
    if config.profile_steps and placement.backend == "jax":
        from train import jax_devices

        callbacks.append(jax_devices.Profile(os.path.join(logs, "train"), *config.profile_steps))
    return callbacks


def _describe_augmentation(augment, crop_padding, alternate_flips=False):
    if not augment:
        return "off"
    flip = "alternating flip" if alternate_flips else "flip"
    return f"crop(pad {crop_padding})+{flip}" if crop_padding else flip


def _say(config, line):
    if config.verbose:
        print(line, flush=True)
