"""Train a registered model on TPU, GPUs, several workers or the CPU; hand the weights to the host.

Typical usage::

    python -m train --data cifar10 --output runs/seed
    python -m train --keras-backend jax --data ../shared/data/cifar10-jpeg.zip --output runs/seed

The same registered models and recipes train under either Keras backend: JAX (what TPUs
run today; data parallel over every local device) or TensorFlow (tf.distribute strategies).
The input pipeline is tf.data on the host for both, or NumPy batches where JAX trains without
TensorFlow (``--input-pipeline``, decided once at start and recorded in the manifest). Everything goes under ``--output DIR``:

* ``model.weights.h5`` - the trained weights, float32, copied to the host (backend-neutral:
  export loads them under TensorFlow whichever backend trained);
* ``manifest.json`` - what export needs to rebuild and verify the model (written last:
  its presence means the run is complete);
* ``eval/`` - test accuracy, per-class accuracy and the confusion matrix (JSON and PNG);
* ``samples.npz`` - a seeded sample of training and test images for export's quantization;
* ``holdout.npz`` - with ``--holdout N``: the N training images kept out of training, for
  export's calibration (contract.confidence);
* ``history.csv`` and ``curves.png``; ``logs/`` for TensorBoard; ``backup/`` while running.

Re-running the same command after a kill resumes from the last finished epoch (:mod:`train.backup`).
"""

import contextlib
import dataclasses
import os
import shutil
import time

from contract import MANIFEST_FILE, WEIGHTS_FILE
from contract import manifest as manifests
from contract.recipe import Recipe

DEFAULT_DATA = "cifar10"
DEFAULT_OUTPUT = "runs/latest"
DEFAULT_MODEL = "seed_cnn"
TPU_STEPS_PER_EXECUTION = 32  # amortises host round trips on a TPU


class UsageError(Exception):
    """A problem the user can fix; reported as one line with exit code 2."""


@dataclasses.dataclass
class Config:
    """One run: which model on which data, on what hardware; ``recipe`` changes the model's hyperparameters."""

    data: str = DEFAULT_DATA
    output: str = DEFAULT_OUTPUT
    model: str = DEFAULT_MODEL
    #: Fields of the model's :class:`contract.recipe.Recipe` this run changes, by name ({"epochs": 1}).
    recipe: dict = dataclasses.field(default_factory=dict)
    keras_backend: str = "auto"  # "jax", "tensorflow", or "auto" (see train.hardware.pick_backend)
    input_pipeline: str = "auto"  # one of INPUT_PIPELINES: "auto" is tf.data where TensorFlow imports, else numpy
    precision: str = "auto"
    tpu: str = "auto"
    steps_per_execution: int = None  # None: 32 on TPU, 1 elsewhere
    validation_freq: int = 1  # evaluate on the test split every N epochs, 0 never (the handover always does at the end)
    profile_steps: tuple = None
    seed: int = 0
    holdout: int = 0  # training images kept out of training for export's calibration (contract.confidence)
    time_budget: float = None  # seconds for the whole run: it trains the most epochs that fit (train.budget)
    overwrite: bool = False
    verbose: int = 1


#: How batches are made: tf.data (train.data) or NumPy (train.arrays, for JAX without TensorFlow).
INPUT_PIPELINES = ("auto", "tf.data", "numpy")


@dataclasses.dataclass(frozen=True)
class Plan:
    """The resolved settings of one run: the model's recipe with the run's changes, then the hardware."""

    recipe: Recipe
    global_batch: int  # recipe.batch_size times the replicas
    steps_per_epoch: int
    learning_rate: float  # the recipe's peak rate, scaled to global_batch
    precision: str
    steps_per_execution: int
    input_pipeline: str  # "tf.data" or "numpy", decided once, before the model is built


def run(config, strategy=None, splits=None, clock=time.monotonic):
    """Train as ``config`` says and return the manifest as a dict (None on a non-chief worker).

    Args:
      strategy: a ``tf.distribute.Strategy`` to use instead of picking one (tests pass
        an 8-replica MirroredStrategy here); implies the TensorFlow backend.
      splits: a :class:`train.data.Splits` to use instead of loading ``config.data``.
      clock: seconds, monotonic: what the time budget and the progress lines read (tests pass a fake).
    """
    from train import hardware

    started = clock()
    if config.time_budget is not None and not config.time_budget > 0:
        raise UsageError(f"--time-budget must be more than 0 seconds, got {config.time_budget:g}")

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
    from train import budget, data, handover, quiet

    with quiet.native_startup():
        input_pipeline = _input_pipeline(config.input_pipeline, backend)  # imports TensorFlow for tf.data
        from train import losses, models

        try:
            recipe = _recipe(models.recipe(config.model), config.recipe)
            losses.for_recipe(recipe)  # a loss the recipe's fields cannot make together is refused here
            placement = _place(backend, config.tpu, strategy)
        except (ValueError, hardware.AcceleratorError) as exc:  # an unknown model or field; an absent TPU
            raise UsageError(str(exc)) from None
    try:
        if splits is None:
            splits = data.load(config.data)
        splits, held_out = data.hold_out(splits, config.holdout)
        plan = _plan(config, recipe, placement, len(splits.x_train), input_pipeline)
    except (hardware.AcceleratorError, data.DataError) as exc:
        raise UsageError(str(exc)) from None
    if config.time_budget is not None and _shard(placement)[1] > 1:
        # Each process would time its own steps and might choose another length: a collective mismatch.
        raise UsageError("--time-budget times one process's steps; with several processes give --epochs instead")
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
                 f"model={config.model} epochs={recipe.epochs}{_budget_note(config)} lr={plan.learning_rate:.4g} schedule={recipe.schedule} "
                 f"augment={recipe.augmentation()} "
                 f"steps_per_execution={plan.steps_per_execution} input_pipeline={plan.input_pipeline}")

    from train import backup

    if config.overwrite and placement.chief and os.path.exists(manifest_path):
        # Train a finished run again from scratch. An interrupted one (no manifest yet)
        # keeps its backup, so re-running this same command after a kill still resumes.
        shutil.rmtree(os.path.join(workdir, "backup"), ignore_errors=True)
        for stale in ("history.csv", budget.CHOICE_FILE, backup.RESUMED_FILE, MANIFEST_FILE):
            if os.path.exists(os.path.join(workdir, stale)):
                os.remove(os.path.join(workdir, stale))

    resumed = backup.resumes(workdir, placement.chief)
    if resumed:
        _say(config, f"resuming from the backup after epoch {resumed[-1]} (restart {len(resumed)} of this run)")
    try:
        model, wall_time, choice = _fit(config, plan, placement, splits, workdir, started, clock)
    except hardware.AcceleratorError as exc:  # e.g. processes that do not all see the backup
        raise UsageError(str(exc)) from None
    except Exception as exc:
        if _shard(placement)[1] > 1:  # a lost process, or this one failing: end now, not in JAX's shutdown
            from train import jax_devices

            jax_devices.stop_after(exc)
        raise
    if not placement.chief:
        return None
    if choice is not None:  # the manifest's recipe is the one trained: the budget's epochs
        plan = dataclasses.replace(plan, recipe=dataclasses.replace(plan.recipe, epochs=choice.epochs))
    # Under JAX, outside the distribution: Keras makes a variable while saving, which would otherwise
    # be laid out over every process's devices (a collective the other processes are not in).
    with placement.host() if placement.backend == "jax" else contextlib.nullcontext():
        handover.save_weights_atomically(model, os.path.join(output, WEIGHTS_FILE))
    manifest = handover.hand_over(config, plan, placement, splits, output, wall_time, held_out, choice, resumed)
    _say(config, f"test accuracy {manifest.metrics.test_accuracy:.4f} on {manifest.metrics.test_images} "
                 f"images; weights and manifest in {output}")
    return manifest.to_dict()


def _recipe(recipe, changes):
    """``recipe`` with the run's ``changes`` (field name to value); raises ValueError naming a bad one."""
    unknown = sorted(set(changes) - {field.name for field in dataclasses.fields(Recipe)})
    if unknown:
        raise ValueError(f"the recipe has no field {', '.join(unknown)}")
    return dataclasses.replace(recipe, **changes)


def _input_pipeline(requested, backend):
    """The run's input pipeline, decided once: "tf.data" (importing TensorFlow) or "numpy" (train.arrays)."""
    if requested not in INPUT_PIPELINES:
        raise UsageError(f"input pipeline {requested!r} is not one of {', '.join(INPUT_PIPELINES)}")
    if requested == "numpy":
        if backend == "tensorflow":
            raise UsageError("the tensorflow backend trains on tf.data; --input-pipeline numpy is for jax")
        return "numpy"
    try:
        import tensorflow as tf
    except ImportError:
        if backend == "tensorflow":
            raise
        if requested == "tf.data":
            raise UsageError("--input-pipeline tf.data needs TensorFlow, which this environment lacks") from None
        return "numpy"
    if backend != "tensorflow":
        # tf.data only feeds the host; keep TensorFlow off the accelerators JAX is using.
        tf.config.set_visible_devices([], "GPU")
    return "tf.data"


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


def _plan(config, recipe, placement, train_images, input_pipeline="tf.data"):
    from train import hardware, schedules

    global_batch = recipe.batch_size * placement.replicas
    steps_per_epoch = train_images // global_batch
    if steps_per_epoch < 1:
        raise UsageError(f"{train_images} training images are fewer than one global batch of {global_batch}")
    return Plan(
        recipe=recipe,
        global_batch=global_batch,
        steps_per_epoch=steps_per_epoch,
        learning_rate=schedules.scaled_rate(recipe, global_batch),
        precision=hardware.resolve_precision(config.precision, placement.hardware),
        steps_per_execution=config.steps_per_execution
        or (TPU_STEPS_PER_EXECUTION if placement.hardware == "tpu" else 1),
        input_pipeline=input_pipeline,
    )


def _fit(config, plan, placement, splits, workdir, started, clock):
    """Build, compile and fit under ``placement``; returns the model, the wall time in seconds, and the
    time budget's choice (a :class:`contract.manifest.Budget`, or None without a budget)."""
    import keras

    from train import budget, losses, models, progress

    recipe = plan.recipe
    keras.utils.set_random_seed(config.seed)
    num_classes = splits.num_classes
    labels = num_classes if losses.one_hot(recipe) else None
    pipelines = _pipelines(plan.input_pipeline)
    shard = _shard(placement)  # several processes: each feeds its own part of every global batch
    train_ds = pipelines.train_dataset(splits.x_train, splits.y_train, plan.global_batch, recipe, seed=config.seed,
                                       num_classes=labels, shard=shard)
    val_ds = pipelines.eval_dataset(splits.x_test, splits.y_test, plan.global_batch, num_classes=labels, shard=shard)

    # A run resumed after a kill keeps the length an earlier process chose, budget flag or not: its
    # backup was trained on that schedule.
    choice = budget.read_choice(workdir)
    timer = None
    if choice is not None:
        _say(config, f"resuming with the length chosen when this run began: {budget.describe(choice)}")
    elif config.time_budget is not None:
        timer = budget.Timer(config.time_budget, started, plan.steps_per_epoch, recipe.epochs,
                             budget.handover_steps(plan.global_batch, len(splits.x_test)))
    epochs = recipe.epochs if choice is None else choice.epochs
    shown = progress.Progress(epochs, plan.steps_per_epoch, started, clock, timer=timer,
                              run_dir=workdir if placement.chief else None,
                              every_s=10 if config.verbose == 1 else progress.EVERY_S, verbose=config.verbose,
                              handover_steps=budget.handover_steps(plan.global_batch, len(splits.x_test)))
    shown.choice = choice

    previous_policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(plan.precision)
    try:
        with placement.scope():
            model = models.build_model(config.model, num_classes)
            fit_started = clock()
            models.prepare(config.model, model, splits.x_train)  # data-dependent initialisation, if any
            compile_model(model, recipe, plan.learning_rate, epochs * plan.steps_per_epoch, plan.steps_per_execution)
        model.fit(
            train_ds,
            epochs=epochs,
            steps_per_epoch=plan.steps_per_epoch,
            validation_data=val_ds if config.validation_freq else None,
            validation_freq=config.validation_freq or 1,
            shuffle=False,  # the dataset shuffles itself
            # The recipe's own first: they change the weights, which the others then save and log. Their
            # length is the run's, which a time budget may shorten after the first steps.
            callbacks=models.training_callbacks(config.model, lambda: shown.epochs * plan.steps_per_epoch)
            + _callbacks(config, plan, placement, workdir, shown),
            verbose=0,  # progress.Progress says how it goes, in lines a log keeps
        )
        return model, clock() - fit_started, shown.choice
    finally:
        keras.mixed_precision.set_global_policy(previous_policy)


def compile_model(model, recipe, learning_rate, total_steps, steps_per_execution=1):
    """Compile ``model`` as a run trains it: the recipe's optimizer and schedule over ``total_steps`` from
    ``learning_rate`` (the rate at the run's global batch, train.schedules.scaled_rate), its loss, and accuracy."""
    from train import losses, schedules

    model.compile(optimizer=schedules.optimizer(recipe, learning_rate, recipe.schedule, total_steps),
                  loss=losses.for_recipe(recipe),
                  weighted_metrics=["accuracy"],  # weighted: the last evaluation batch's zero-weight padding never counts
                  steps_per_execution=steps_per_execution)


def _pipelines(input_pipeline):
    """The module that makes the run's batches: train.data (tf.data) or train.arrays (NumPy)."""
    if input_pipeline == "tf.data":
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


def _callbacks(config, plan, placement, workdir, shown):
    import keras

    from train import report

    logs = os.path.join(workdir, "logs")
    tensorboard_profile = config.profile_steps if placement.backend == "tensorflow" else None
    backup_dir = os.path.join(workdir, "backup")
    if _shard(placement)[1] > 1:
        from train import jax_devices

        restore = jax_devices.ChiefBackup(backup_dir, placement.chief)  # the others resume from the chief's
    else:
        from train import backup

        restore = backup.Backup(backup_dir)
    callbacks = [restore, report.EpochTimer(), shown]
    if not placement.chief:
        return callbacks  # only the chief writes the run
    callbacks.append(keras.callbacks.CSVLogger(os.path.join(workdir, "history.csv"), append=True))
    if plan.input_pipeline == "tf.data":  # TensorFlow is loaded, and Keras writes TensorBoard summaries with it
        callbacks.append(keras.callbacks.TensorBoard(logs, profile_batch=tensorboard_profile or 0))
    if config.profile_steps and placement.backend == "jax":
        from train import jax_devices

        callbacks.append(jax_devices.Profile(os.path.join(logs, "train"), *config.profile_steps))
    return callbacks


def _budget_note(config):
    if config.time_budget is None:
        return ""
    return f" (at most: a time budget of {config.time_budget:g} s chooses after the first steps)"


def _say(config, line):
    if config.verbose:
        print(line, flush=True)
