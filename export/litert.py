"""LiteRT models beside the SavedModel, float32 and int8, each checked before it is published.

Export calls :func:`export` on the version directory it is about to publish, after the
SavedModel in it has passed its own checks. It writes, next to ``saved_model.pb``:

* ``model.tflite`` (``contract.LITERT_FILE``): the ``serving_default`` signature converted by
  ``tf.lite.TFLiteConverter`` from the written SavedModel, float32, same inputs and outputs
  (uint8 pixels in; probabilities, class ids and class names out). TF Serving serves it with
  ``--prefer_tflite_model``; the server's ``litert`` runtime runs it.
* ``model.int8.tflite`` (``contract.LITERT_INT8_FILE``): post-training int8 quantization of the
  same signature, calibrated on the run's training sample (``contract.SAMPLES_FILE``, written by
  training), the classifier head and a few layers left in float32 (:data:`FLOAT_HEAD_OPS` and
  :data:`FLOAT_LAYERS`, why below). The server's ``litert-int8`` runtime runs it.

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
import re
import sys
import warnings

from contract import (
    IMAGE_SIZE,
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
from export import ExportError, one_line, read_images
from export.savedmodel import CONFIDENCE_SCOPE

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
#: Operators kept in float32 in the int8 model. The classifier head turns a few hundred features
#: into 10 probabilities; quantized, its softmax output has 1/256 steps, so close calls become
#: ties and ties go to the lower class id. Keeping FULLY_CONNECTED and SOFTMAX in float costs
#: little (the convolutions do most of the work) and measured agreement (docs/benchmarks.md).
#: ARG_MAX too: quantized, it reads the softmax rounded back to int8, so the served class_ids
#: would differ from the argmax of the served probabilities on near ties.
FLOAT_HEAD_OPS = ("FULLY_CONNECTED", "SOFTMAX", "ARG_MAX")
#: Keras layers (by name) whose operators also stay float32 in the int8 model. seed_cnn's bn2 is a
#: batch normalization between two convolutions, which the converter cannot fold into either (it
#: stays a MUL and an ADD); its output, conv2a's input, spans both signs (bn2 learns negative
#: scales), and rounding it to int8 is what loses most. The QuantizationDebugger shows no layer
#: much worse than one rounding step, so the layers were found by keeping them in float one or
#: two at a time and measuring agreement with the SavedModel on all 10,000 test images (the
#: figures are in docs/benchmarks.md). conv2a is about a fifth of the model's multiply-adds.
#: Names that a model does not have are ignored: other architectures keep only the head in float.
FLOAT_LAYERS = ("bn2", "conv2a")
#: Images per call when running a model over a sample, and per calibration step.
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

    calibration, _ = read_images(run_dir, samples, "train_")
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
    made = []

    def int8():
        made.append(convert_int8(version_dir, calibration))
        return made[-1]

    publish(RUNTIME_LITERT_INT8, int8, lambda entry: int8_refusal(entry["agreement"], entry["images"]))
    # Only the FLOAT_LAYERS this model has (their operators keep their names in the int8 model).
    kept = [layer for layer in FLOAT_LAYERS if made and layer_nodes(made[-1], [layer])]
    checks[RUNTIME_LITERT_INT8]["calibration"] = publications.Int8Calibration(
        images=len(calibration), source=f"{SAMPLES_FILE} train_images", float_ops=list(FLOAT_HEAD_OPS), float_layers=kept)
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


def convert_int8(saved_model_dir, calibration_images, float_ops=FLOAT_HEAD_OPS, float_layers=FLOAT_LAYERS):
    """``serving_default`` quantized to int8 (bytes), calibrated on uint8 ``calibration_images``.

    Weights are int8 per channel, activations int8 from the ranges the calibration images
    reach; the operators named in ``float_ops`` and the operators of the Keras layers named in
    ``float_layers`` stay float32 (TF's QuantizationDebugger is the documented way to leave
    operators or single nodes out of full-integer quantization).
    """
    import tensorflow as tf

    def representative():
        for start in range(0, len(calibration_images), BATCH):
            yield {INPUT_PIXELS: calibration_images[start:start + BATCH]}

    converter = tf.lite.TFLiteConverter.from_saved_model(saved_model_dir, signature_keys=[SIGNATURE_PIXELS])
    # The operators after the logits (temperature, softmax, score, threshold) stay float32 too: a
    # score rounded to int8 steps would move images across the threshold.
    float_nodes = layer_nodes(converter.convert(), [*float_layers, CONFIDENCE_SCOPE])
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = representative
    with warnings.catch_warnings():
        # Calibration runs TensorFlow's own copy of the interpreter, which warns that it is deprecated.
        warnings.filterwarnings("ignore", message=".*tf.lite.Interpreter is deprecated", category=UserWarning)
        if not float_ops and not float_nodes:
            return converter.convert()
        options = tf.lite.experimental.QuantizationDebugOptions(denylisted_ops=list(float_ops) or None,
                                                                denylisted_nodes=float_nodes or None)
        debugger = tf.lite.experimental.QuantizationDebugger(
            converter=converter, debug_dataset=representative, debug_options=options)
        return debugger.get_nondebug_quantized_model()


def layer_nodes(content, layers):
    """Names of the operators (their output tensors) that come from the Keras ``layers`` in LiteRT model ``content``.

    The converter names an operator's output after the TensorFlow ops fused into it, each
    ``model/layer_N/op`` (``seed_cnn_1/conv2a_1/Relu;seed_cnn_1/conv2a_1/BiasAdd;...``); these are
    the node names the QuantizationDebugger's ``denylisted_nodes`` takes.
    """
    from tensorflow.lite.tools import flatbuffer_utils

    wanted = re.compile(r"(%s)(_\d+)?" % "|".join(re.escape(layer) for layer in layers))
    graph = flatbuffer_utils.convert_bytearray_to_object(content).subgraphs[0]
    names = []
    for op in graph.operators:
        for index in op.outputs:
            name = graph.tensors[index].name.decode()
            if any(wanted.fullmatch(part) for fused in name.split(";") for part in fused.split("/")):
                names.append(name)
    return names


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

