"""bench/serving.py's agreement section: each runtime's (and each int8 calibration's) answers on
every test image against the SavedModel's."""

import os

import numpy as np

from contract import OUTPUT_PROBABILITIES, SAMPLES_FILE
from serve.backends import runtimes


def probabilities(model, images, batch=256):
    return np.concatenate([np.asarray(model.pixels(images[i:i + batch])[OUTPUT_PROBABILITIES], np.float32)
                           for i in range(0, len(images), batch)])


def agreement_rows(version_dir, images, labels, run_dir=None):
    """``[(name, measures)]``: each runtime (and, with ``run_dir``, each int8 calibration variant) against the SavedModel."""
    cores = len(os.sched_getaffinity(0))
    reference = probabilities(runtimes.load("savedmodel", version_dir), images)
    rows = [("savedmodel", measure(reference, reference, labels))]
    for runtime in ("litert", "litert-int8"):
        if os.path.isfile(os.path.join(version_dir, runtimes.MODEL_FILES[runtime])):
            rows.append((runtime, measure(probabilities(runtimes.load(runtime, version_dir, cores), images), reference, labels)))
    if run_dir:
        rows += calibration_variants(version_dir, run_dir, images, reference, labels)
    return rows


def calibration_variants(version_dir, run_dir, images, reference, labels):
    """int8 models quantized other ways from the same SavedModel, compared on the same images."""
    from export import litert

    with np.load(os.path.join(run_dir, SAMPLES_FILE)) as data:
        train = data["train_images"]
    flipped = np.concatenate([train, train[:, :, ::-1]])  # the training augmentation's mirror images too
    head, layers = litert.FLOAT_HEAD_OPS, litert.FLOAT_LAYERS
    variants = (
        ("int8, every op quantized", train, (), ()),
        (f"int8, float {'+'.join(head)}", train, head, ()),
        (f"int8, float {'+'.join(head)} and layers {'+'.join(layers)} (what export publishes)", train, head, layers),
        ("the same, mirrored images added to the calibration", flipped, head, layers),
    )
    rows = []
    for name, calibration, float_ops, float_layers in variants:
        content = litert.convert_int8(version_dir, calibration, float_ops, float_layers)
        got = np.concatenate([litert.runner(content)(images[i:i + 256]) for i in range(0, len(images), 256)])
        row = measure(got, reference, labels)
        row.update(calibration_images=len(calibration), megabytes=len(content) / 1e6)
        rows.append((name, row))
    return rows


def measure(got, reference, labels):
    same = got.argmax(1) == reference.argmax(1)
    return {
        "images": len(got),
        "agreement": float(same.mean()),
        "accuracy": float((got.argmax(1) == labels).mean()),
        "accuracy_loss": float((reference.argmax(1) == labels).mean() - (got.argmax(1) == labels).mean()),
        "max_abs_diff": float(np.abs(got - reference).max()),
    }
