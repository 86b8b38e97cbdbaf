"""Proof that an export holds the trained model: the rebuilt model reproduces the manifest's
fingerprint, and the written SavedModel, reloaded without Keras, agrees with it on both signatures."""

import re
import warnings

from contract import (
    INPUT_BYTES,
    INPUT_PIXELS,
    OUTPUT_CLASS_IDS,
    OUTPUT_CLASS_NAMES,
    OUTPUT_IN_DISTRIBUTION,
    OUTPUT_OOD_SCORE,
    OUTPUT_PROBABILITIES,
    OUTPUTS,
    SIGNATURE_BYTES,
    SIGNATURE_PIXELS,
    WEIGHTS_FILE,
    sha256_file,
)
from export import ExportError
from export.savedmodel import read_signatures

TOLERANCE = 1e-5  # max absolute difference allowed between probabilities, float32
SCORE_TOLERANCE = 1e-4  # and between out-of-distribution scores (energies of about -5 to -30)


def rebuild(manifest, weights_path):
    """The trained architecture from the registry, with the run's weights loaded."""
    import tensorflow as tf

    from train import models

    spec = manifest.model
    try:
        # One device: tests (and multi-GPU hosts) may have several, and export needs none of them.
        with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
            model = models.build_model(spec.name, manifest.num_classes, **spec.kwargs)
    except ValueError as exc:
        raise ExportError(str(exc)) from None
    try:
        # Keras warns about parts of the file it skips; the error below (or the fingerprint
        # check) already says so, on the one line a user reads.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.load_weights(weights_path)
    except Exception as exc:  # h5py and Keras raise many types for a bad file; all mean the same here
        raise ExportError(f"cannot load {weights_path} into {spec.name} with "
                          f"{manifest.num_classes} classes: {_load_error(exc)}") from None
    return model


def _load_error(exc):
    """The useful part of Keras's multi-paragraph load_weights error, on one line."""
    text = " ".join(str(exc).split())
    found = re.search(r"object <\w+ name=([^ ,>]+)[^>]*>: (.*)", text)
    if found:
        layer, detail = found.groups()
        shapes = re.search(r"variable\.shape=(\([^)]*\)), Received: value\.shape=(\([^)]*\))", detail)
        if shapes:
            return f"layer {layer!r} has shape {shapes[1]} but the file holds {shapes[2]}"
        # e.g. "Layer 'input_bn' expected 4 variables, but received 0 variables during loading"
        return detail.split(". ")[0]
    return text[:200] or type(exc).__name__


def fingerprint_images(manifest):
    """The fingerprint's images, regenerated from the manifest's seed and checked against its digest."""
    import numpy as np

    from train import models

    fingerprint = manifest.fingerprint
    images = models.fingerprint_images(fingerprint.seed, count=fingerprint.shape[0])
    # The images are regenerated from their seed; if NumPy ever changed the stream, comparing
    # outputs would blame the weights for what the inputs did.
    if models.fingerprint_digest(images) != fingerprint.inputs_sha256:
        raise ExportError("the fingerprint images regenerated from the manifest's seed differ from the ones "
                          "training used (inputs_sha256 mismatch); cannot verify the weights")
    return np.asarray(images, dtype=np.uint8)


def check_fingerprint(manifest, outputs, weights_path):
    import numpy as np

    recorded = np.asarray(manifest.fingerprint.outputs, dtype=np.float32)
    if recorded.shape != outputs.shape:
        raise ExportError(f"model outputs have shape {list(outputs.shape)} on the fingerprint images but the "
                          f"manifest recorded {list(recorded.shape)}")
    diff = float(np.max(np.abs(outputs.astype(np.float32) - recorded)))
    if not diff <= TOLERANCE:  # also catches NaN
        hint = ""
        if manifest.weights.sha256 != sha256_file(weights_path):
            hint = f"; {WEIGHTS_FILE} is not the file the manifest describes (sha256 differs)"
        raise ExportError(f"rebuilt model does not reproduce the manifest's fingerprint outputs: max absolute "
                          f"difference {diff:.3g} > {TOLERANCE:g}{hint}")


def verify_saved_model(path, images, expected, class_names):
    """Reload ``path`` without Keras and check both signatures; return their summary.

    ``expected``: what the signatures must answer on ``images`` (export.calibration.outputs):
    ``probabilities`` within :data:`TOLERANCE`, ``ood_score`` within :data:`SCORE_TOLERANCE`,
    ``in_distribution`` equal wherever the score is not within that tolerance of the threshold.
    """
    import numpy as np
    import tensorflow as tf

    loaded = tf.saved_model.load(path)
    pngs = tf.stack([tf.io.encode_png(image) for image in images])  # lossless, so identical pixels
    calls = {
        SIGNATURE_PIXELS: (INPUT_PIXELS, tf.constant(images)),
        SIGNATURE_BYTES: (INPUT_BYTES, pngs),
    }
    want_keys = sorted(set(OUTPUTS) | set(expected))
    want_ids = np.argmax(expected[OUTPUT_PROBABILITIES], axis=-1)
    want_names = [class_names[i] for i in want_ids]
    for signature, (key, value) in calls.items():
        if signature not in loaded.signatures:
            raise ExportError(f"written SavedModel lacks signature {signature!r}")
        result = loaded.signatures[signature](**{key: value})
        if sorted(result) != want_keys:
            raise ExportError(f"signature {signature!r} returns {sorted(result)}, expected {want_keys}")
        for key, tolerance in ((OUTPUT_PROBABILITIES, TOLERANCE), (OUTPUT_OOD_SCORE, SCORE_TOLERANCE)):
            diff = float(np.max(np.abs(result[key].numpy() - expected[key])))
            if not diff <= tolerance:
                raise ExportError(f"reloaded signature {signature!r} disagrees with the Keras model on {key}: "
                                  f"max absolute difference {diff:.3g} > {tolerance:g}")
        if OUTPUT_IN_DISTRIBUTION in expected:
            clear = np.abs(result[OUTPUT_OOD_SCORE].numpy() - expected[OUTPUT_OOD_SCORE]) < SCORE_TOLERANCE
            got = result[OUTPUT_IN_DISTRIBUTION].numpy()
            if not np.array_equal(got[clear], expected[OUTPUT_IN_DISTRIBUTION][clear]):
                raise ExportError(f"reloaded signature {signature!r} answers another in_distribution than export's check")
        if not np.array_equal(result[OUTPUT_CLASS_IDS].numpy(), want_ids):
            raise ExportError(f"reloaded signature {signature!r} returns other class ids than the Keras model")
        got_names = [n.decode() for n in result[OUTPUT_CLASS_NAMES].numpy()]
        if got_names != want_names:
            raise ExportError(f"reloaded signature {signature!r} returns other class names than the manifest's")
    return read_signatures(path)
