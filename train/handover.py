"""The handover: what a finished run leaves for export, written from the saved weights alone.

The chief rebuilds the model in float32 outside any distribution, loads ``model.weights.h5``
(whichever backend wrote it), evaluates it on every test image, and writes ``samples.npz``, ``holdout.npz`` (with ``--holdout``) and,
last, ``manifest.json`` (:mod:`contract.manifest`): its presence means the run is complete.
"""

import datetime
import os
import platform

import numpy as np

from contract import (CHANNELS, HOLDOUT_FILE, IMAGE_SIZE, MANIFEST_FILE, RESIZE_METHOD, SAMPLES_FILE, WEIGHTS_FILE,
                      replaced_atomically, sha256_file)
from contract import manifest as manifests

FINGERPRINT_SEED = 20180921  # the fingerprint's images (train.models.fingerprint_images)
#: Images per split handed to export (contract.SAMPLES_FILE): the test sample is what every LiteRT
#: model is checked on against the SavedModel; the train sample is not read by export (its int8 model
#: needs no calibration), and stays because manifest format 4 describes it. The test sample holds
#: every test image up to 1,000 (CIFAR-10's original test pixels are 1,000: 3 MB of uint8), so the
#: int8 gate is measured on all of them, where 500 left a standard error of 0.45 points at 99%.
SAMPLE_IMAGES = {"train": 500, "test": 1000}


def hand_over(config, plan, placement, splits, output, wall_time, held_out=None, budget=None, resumed=()):
    """Rebuild the model on the host from the saved file alone, evaluate it, write samples and manifest.

    ``budget``: the time budget's choice (contract.manifest.Budget), recorded in the manifest; ``resumed``:
    the epochs the run resumed from after interruptions (train.trainer.resumes).
    """
    import keras

    from train import models, report

    weights_path = os.path.join(output, WEIGHTS_FILE)
    images = models.fingerprint_images(FINGERPRINT_SEED)
    with placement.host():  # one CPU device, outside any distribution, as export computes it
        model = models.build_model(config.model, splits.num_classes)
        model.load_weights(weights_path)
        outputs = keras.ops.convert_to_numpy(model(images.astype("float32"), training=False))
        evaluation = report.evaluate(model, splits, os.path.join(output, "eval"))
    report.plot_history(os.path.join(output, "history.csv"), os.path.join(output, "curves.png"))
    samples = write_samples(splits, os.path.join(output, SAMPLES_FILE), config.seed)
    holdout = write_holdout(held_out, os.path.join(output, HOLDOUT_FILE)) if held_out is not None else None

    manifest = manifests.Manifest(
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        model=manifests.ModelSpec(config.model),
        class_names=list(splits.class_names),
        input=manifests.Input(
            shape=[IMAGE_SIZE, IMAGE_SIZE, CHANNELS],
            dtype="uint8",
            range=[0, 255],
            color="RGB",
            resize=RESIZE_METHOD,
            preprocessing="none outside the model: raw pixels in, normalisation is the model's first layer",
        ),
        weights=manifests.Weights(file=WEIGHTS_FILE, sha256=sha256_file(weights_path)),
        training=manifests.Training(
            data=splits.source or config.data,
            train_images=int(len(splits.x_train)),
            test_images=int(len(splits.x_test)),
            recipe=plan.recipe,
            keras_backend=placement.backend,
            input_pipeline=plan.input_pipeline,
            strategy=placement.name,
            hardware=placement.hardware,
            replicas=int(placement.replicas),
            global_batch=int(plan.global_batch),
            peak_learning_rate=float(plan.learning_rate),
            steps_per_epoch=int(plan.steps_per_epoch),
            steps_per_execution=int(plan.steps_per_execution),
            precision=plan.precision,
            seed=int(config.seed),
            wall_time_s=round(wall_time, 1),
            budget=budget,
            resumed_from_epochs=list(resumed),
        ),
        metrics=manifests.Metrics(
            test_accuracy=float(evaluation["accuracy"]),
            test_loss=float(evaluation["loss"]),
            test_images=int(evaluation["count"]),
        ),
        versions=versions(placement.backend, plan.input_pipeline),
        fingerprint=manifests.Fingerprint(
            seed=FINGERPRINT_SEED,
            shape=list(images.shape),
            inputs_sha256=models.fingerprint_digest(images),
            outputs=np.asarray(outputs, dtype=np.float32).tolist(),
        ),
        samples=samples,
        holdout=holdout,
    )
    manifests.write(os.path.join(output, MANIFEST_FILE), manifest)
    return manifest


def _write_npz(path, arrays):
    with replaced_atomically(path, ".npz") as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)


def write_holdout(held_out, path):
    """The held-out images, labels and indices (contract.HOLDOUT_FILE), for export's calibration."""
    import hashlib

    from contract import confidence

    indices = np.asarray(held_out.indices, np.int64)
    _write_npz(path, {"images": np.ascontiguousarray(held_out.images, np.uint8),
                      "labels": np.asarray(held_out.labels, np.int64), "indices": indices})
    return manifests.Holdout(file=os.path.basename(path), images=len(indices), seed=confidence.HOLDOUT_SEED,
                             indices_sha256=hashlib.sha256(indices.tobytes()).hexdigest(), sha256=sha256_file(path))


def write_samples(splits, path, seed):
    """A seeded subset of each split (:data:`SAMPLE_IMAGES`), uint8, for export to verify its LiteRT models."""

    rng = np.random.default_rng(seed)
    chosen = {}
    for split, (x, y) in {"train": (splits.x_train, splits.y_train), "test": (splits.x_test, splits.y_test)}.items():
        index = np.sort(rng.choice(len(x), size=min(SAMPLE_IMAGES[split], len(x)), replace=False))
        chosen[f"{split}_images"] = np.ascontiguousarray(x[index], dtype=np.uint8)
        chosen[f"{split}_labels"] = np.asarray(y[index], dtype=np.int64)
    _write_npz(path, chosen)
    return manifests.Samples(file=os.path.basename(path), train=len(chosen["train_images"]),
                             test=len(chosen["test_images"]), sha256=sha256_file(path), seed=seed)


def save_weights_atomically(model, path, attributes=None):
    """``model``'s weights to ``path`` by one rename, with ``attributes`` on the file's root (h5py)."""
    with replaced_atomically(path, ".weights.h5") as tmp:  # Keras insists on the suffix
        model.save_weights(tmp, overwrite=True)
        if attributes:
            import h5py

            with h5py.File(tmp, "r+") as f:
                f.attrs.update(attributes)


def versions(backend, input_pipeline):
    """The versions of what trained: TensorFlow where it ran (its backend, or tf.data beside JAX), JAX where it did."""
    import h5py
    import keras
    import numpy

    versions = {"python": platform.python_version()}
    if backend == "tensorflow" or input_pipeline == "tf.data":
        import tensorflow

        versions["tensorflow"] = tensorflow.__version__
    versions.update(keras=keras.__version__, numpy=numpy.__version__, h5py=h5py.__version__)
    if backend == "jax":
        import jax

        versions["jax"] = jax.__version__
    return versions
