"""LiteRT models beside the SavedModel, float32 and int8, each checked before it is published.

Export calls :func:`export` on the version directory it is about to publish, after the
SavedModel in it has passed its own checks. It writes, next to ``saved_model.pb``:

* ``model.tflite`` (``contract.LITERT_FILE``): the ``serving_default`` signature converted by
  ``tf.lite.TFLiteConverter`` from the written SavedModel, float32, same inputs and outputs
  (uint8 pixels in; probabilities, class ids and class names out). TF Serving serves it with
  ``--prefer_tflite_model``; the server's ``litert`` runtime runs it.
* ``model.int8.tflite`` (``contract.LITERT_INT8_FILE``): the same signature with int8 weights
  (dynamic-range quantization, :func:`convert_int8`). The server's ``litert-int8`` runtime runs it.

Every model is run in LiteRT (the interpreter the server uses, XNNPACK) on the run's test
sample and compared with the written SavedModel on the same images:

* float32 must give the same class on every image, probabilities within
  :data:`FLOAT_TOLERANCE` and out-of-distribution scores within :data:`SCORE_TOLERANCE`;
* int8 must give the same class on at least :data:`AGREEMENT_GATE` of them.

A model that fails its check is not published: the reason is printed on stderr and recorded in
the published manifest, and the SavedModel and the other model are published as usual. The
manifest's ``export.litert`` section (:class:`contract.published.LiteRT`) records, per model, the
agreement, the accuracy against the sample's labels (beside the SavedModel's own), the largest
probability difference and the file size. A run whose samples file is missing or is not the one
its manifest describes cannot be checked, and is refused (:class:`export.ExportError`).
"""

import os
import sys

from contract import (
    INPUT_PIXELS,
    LITERT_FILE,
    LITERT_INT8_FILE,
    OUTPUT_OOD_SCORE,
    OUTPUT_PROBABILITIES,
    RUNTIME_LITERT,
    RUNTIME_LITERT_INT8,
    SAMPLES_FILE,
    SIGNATURE_PIXELS,
)
from contract import published as publications
from export import one_line, read_images

#: Runtime names, as the server's SERVE_RUNTIME spells them, and the file each one loads.
FILES = {RUNTIME_LITERT: LITERT_FILE, RUNTIME_LITERT_INT8: LITERT_INT8_FILE}

#: Largest absolute difference allowed between float32 LiteRT and SavedModel probabilities.
#: XNNPACK sums in another order than TensorFlow (about 1e-6 apart on the seed model).
FLOAT_TOLERANCE = 1e-4
#: Largest absolute difference allowed between float32 LiteRT and SavedModel out-of-distribution
#: scores (energies of about -5 to -30; contract.confidence).
SCORE_TOLERANCE = 1e-4
#: Least share of the test sample on which the int8 model must give the SavedModel's class: the
#: serving target itself (99.0% on the original test images), not a margin under it. Training puts
#: every test image up to 1,000 in the sample (train.handover.SAMPLE_IMAGES), so on CIFAR-10's
#: original pixels the gate is measured on all 1,000 of them: an int8 model published is one that
#: meets the target on those images, and one under it is refused, in one line that says by how much.
AGREEMENT_GATE = 0.99
#: Images per call when running a model over a sample.
BATCH = 64


def export(version_dir, run_dir, samples, verbose=1):
    """Write and check the LiteRT models in ``version_dir``; return the manifest's :class:`contract.published.LiteRT`.

    Args:
      version_dir: the not yet published version directory holding the checked SavedModel.
      run_dir: the training run, for its samples file.
      samples: the run manifest's :class:`contract.manifest.Samples`, which the file must match.
    """
    import numpy as np
    import tensorflow as tf

    reference = tf.saved_model.load(version_dir).signatures[SIGNATURE_PIXELS]

    test_images, test_labels = read_images(run_dir, samples, "test_")
    has_score = OUTPUT_OOD_SCORE in reference.structured_outputs
    # Each model runs once over the test images for the outputs that are checked, not once an output.
    checked = (OUTPUT_PROBABILITIES, OUTPUT_OOD_SCORE) if has_score else (OUTPUT_PROBABILITIES,)

    def savedmodel(images):
        answers = reference(**{INPUT_PIXELS: tf.constant(images)})
        return {name: answers[name].numpy() for name in checked}

    reference_answers = _batched(savedmodel, test_images)
    expected = reference_answers[OUTPUT_PROBABILITIES]
    checks = {}

    def publish(runtime, convert, check):
        entry = {"file": FILES[runtime]}
        checks[runtime] = entry
        try:
            content = convert()
        except Exception as exc:  # the converter raises many types; each means this model is not made
            entry.update(published=False, reason=f"conversion failed: {one_line(exc)}")
            return _say(entry, runtime, verbose)
        answers = _batched(runner(content, checked), test_images)
        entry.update(measure(answers[OUTPUT_PROBABILITIES], expected, test_labels), bytes=len(content))
        if has_score:  # the out-of-distribution score must survive conversion too
            entry["ood_score_max_abs_diff"] = float(np.max(np.abs(answers[OUTPUT_OOD_SCORE]
                                                                  - reference_answers[OUTPUT_OOD_SCORE])))
        reason = check(entry)
        if reason:
            entry.update(published=False, reason=reason)
            return _say(entry, runtime, verbose)
        with open(os.path.join(version_dir, FILES[runtime]), "wb") as f:
            f.write(content)
        entry["published"] = True
        return _say(entry, runtime, verbose)

    def float_check(entry):
        if entry["agreement"] < 1.0:
            return (f"it gives another class than the SavedModel on {entry['disagreements']} of "
                    f"{entry['images']} images")
        if not entry["max_abs_diff"] <= FLOAT_TOLERANCE:  # also catches NaN
            return (f"its probabilities differ from the SavedModel's by up to {entry['max_abs_diff']:.3g} "
                    f"(more than {FLOAT_TOLERANCE:g})")
        if not entry.get("ood_score_max_abs_diff", 0.0) <= SCORE_TOLERANCE:
            return (f"its out-of-distribution scores differ from the SavedModel's by up to "
                    f"{entry['ood_score_max_abs_diff']:.3g} (more than {SCORE_TOLERANCE:g})")
        return None

    publish(RUNTIME_LITERT, lambda: convert_float(version_dir), float_check)
    publish(RUNTIME_LITERT_INT8, lambda: convert_int8(version_dir),
            lambda entry: int8_refusal(entry["agreement"], entry["images"]))
    return publications.LiteRT(
        gate=publications.Gate(float_tolerance=FLOAT_TOLERANCE, int8_min_agreement=AGREEMENT_GATE),
        checked_on=publications.CheckedOn(images=len(test_images), source=f"{SAMPLES_FILE} test_images"),
        savedmodel_accuracy=_accuracy(expected, test_labels),
        runtimes={runtime: publications.RuntimeCheck(**entry) for runtime, entry in checks.items()})


def int8_refusal(agreement, images):
    """Why an int8 model giving the SavedModel's class on ``agreement`` of ``images`` test images is not published, or None."""
    if agreement < AGREEMENT_GATE:
        return (f"it gives the SavedModel's class on {agreement:.2%} of {images} test images, "
                f"under the {AGREEMENT_GATE:.1%} gate")
    return None


def convert_float(saved_model_dir):
    """``serving_default`` of the SavedModel as a float32 LiteRT model (bytes)."""
    import tensorflow as tf

    return tf.lite.TFLiteConverter.from_saved_model(saved_model_dir, signature_keys=[SIGNATURE_PIXELS]).convert()


def convert_int8(saved_model_dir):
    """``serving_default`` with int8 weights (bytes): dynamic-range quantization.

    The kernels of the convolutions and dense layers are stored int8, per output channel (but for
    kernels of under 1,024 weights, which the converter leaves float32: airbench's whitening,
    seed_cnn's first convolution). At run time LiteRT (XNNPACK) quantizes each of those layers'
    inputs from their own values, image by image, and computes the layer in int8; everything else
    (pooling, the activations, the softmax and the out-of-distribution score after the logits) stays
    float32. Nothing is calibrated beforehand, so an image far from the training images (a photo, a
    flat colour) is quantized as finely as a CIFAR one, and an image's answer does not depend on the
    images batched with it. Full-integer int8, its ranges calibrated on training images, answered 64
    images a call at 1.2x the rate on AVX-512 BF16 (one image as fast) but gave the SavedModel's
    "none of these" verdict on 90-93% of images: docs/benchmarks.md, "The same score in every runtime".
    """
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_saved_model(saved_model_dir, signature_keys=[SIGNATURE_PIXELS])
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    return converter.convert()


def runner(content, output=OUTPUT_PROBABILITIES):
    """A function: uint8 images -> ``output`` of the LiteRT model ``content`` (bytes), run by LiteRT.

    ``output``: one output's name, or a tuple of names for a dict of those outputs from one call.
    """
    from ai_edge_litert.interpreter import Interpreter

    signature = Interpreter(model_content=content).get_signature_runner(SIGNATURE_PIXELS)
    if isinstance(output, tuple):
        return lambda images: {name: value for name, value in signature(**{INPUT_PIXELS: images}).items()
                               if name in output}
    return lambda images: signature(**{INPUT_PIXELS: images})[output]


def measure(got, expected, labels=None):
    """Agreement of two probability arrays on the top class, their largest difference, and accuracy."""
    import numpy as np

    same = np.argmax(got, axis=-1) == np.argmax(expected, axis=-1)
    result = {
        "images": int(len(same)),
        "agreement": float(np.mean(same)),
        "disagreements": int(np.sum(~same)),
        "max_abs_diff": float(np.max(np.abs(got - expected))),
    }
    if labels is not None:
        result["accuracy"] = _accuracy(got, labels)
    return result


def _accuracy(probabilities, labels):
    import numpy as np

    return float(np.mean(np.argmax(probabilities, axis=-1) == labels))


def _batched(fn, images):
    """``fn`` over ``images`` in batches of :data:`BATCH`, as float32: an array, or a dict of them when ``fn`` gives dicts."""
    import numpy as np

    parts = [fn(images[start:start + BATCH]) for start in range(0, len(images), BATCH)]
    if isinstance(parts[0], dict):
        return {name: np.concatenate([np.asarray(part[name], np.float32) for part in parts]) for name in parts[0]}
    return np.concatenate([np.asarray(part, np.float32) for part in parts])


def _say(entry, runtime, verbose):
    """One line about ``runtime``'s model: on stderr when it was not published, else when verbose."""
    if not entry["published"]:
        print(f"warning: {entry['file']} ({runtime}) not published: {entry['reason']}", file=sys.stderr)
    elif verbose:
        accuracy = f", accuracy {entry['accuracy']:.2%}" if "accuracy" in entry else ""
        print(f"{entry['file']} ({runtime}): same class as the SavedModel on {entry['agreement']:.2%} of "
              f"{entry['images']} images{accuracy}, {entry['bytes'] / 1e6:.1f} MB")
    return entry

