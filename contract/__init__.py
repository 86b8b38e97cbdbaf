"""The serving contract: names every stage agrees on, in one place.

Pure Python with no TensorFlow import, so the client can use it too. The export
stage writes SavedModels with exactly these names; the server and the client read
them. Never rely on auto-generated tensor names such as ``input_1``.
"""

import contextlib
import hashlib
import os
import tempfile

#: Default model name, as in ``models/NAME/N/`` and TF Serving's ``MODEL_NAME``.
DEFAULT_MODEL_NAME = "cifar10"

#: Images enter every model as raw RGB pixels, 0-255, of this size.
IMAGE_SIZE = 32
CHANNELS = 3

#: How images of any other size are brought to 32x32: Pillow's BILINEAR on the
#: server and in the training loaders, ``tf.image.resize(method="bilinear",
#: antialias=True)`` inside the ``predict_images`` signature. Both filter when
#: they shrink, so they agree closely; on 32x32 inputs neither resizes at all and
#: predictions are identical.
RESIZE_METHOD = "bilinear"

#: Signature taking a uint8 batch ``[None, 32, 32, 3]`` of raw RGB pixels.
SIGNATURE_PIXELS = "serving_default"
#: Signature taking a string batch ``[None]`` of encoded images (PNG, JPEG, GIF, BMP).
SIGNATURE_BYTES = "predict_images"

INPUT_PIXELS = "images"
INPUT_BYTES = "image_bytes"

OUTPUT_PROBABILITIES = "probabilities"  # float32 [None, C]
OUTPUT_CLASS_IDS = "class_ids"  # int64 [None]
OUTPUT_CLASS_NAMES = "class_names"  # string [None]
OUTPUTS = (OUTPUT_PROBABILITIES, OUTPUT_CLASS_IDS, OUTPUT_CLASS_NAMES)
#: How foreign each image looks (contract.confidence: the energy of the logits; higher is more
#: foreign), float32 [None]; every model exported with these outputs has it.
OUTPUT_OOD_SCORE = "ood_score"
#: The score at or under the threshold export chose on held-out images, bool [None]; only models
#: trained with a held-out slice have it (without one there is no threshold to choose).
OUTPUT_IN_DISTRIBUTION = "in_distribution"
#: Outputs only some models have, in this order: how foreign each image looks, and the verdict.
CONFIDENCE_OUTPUTS = (OUTPUT_OOD_SCORE, OUTPUT_IN_DISTRIBUTION)
#: Everything a model exported from a run with a held-out slice answers.
CALIBRATED_OUTPUTS = (*OUTPUTS, *CONFIDENCE_OUTPUTS)

#: Files the training stage hands to the export stage.
WEIGHTS_FILE = "model.weights.h5"
MANIFEST_FILE = "manifest.json"
#: A seeded sample of the run's training and test images (uint8); export checks its LiteRT models
#: on the test images: arrays ``train_images``, ``train_labels``, ``test_images``, ``test_labels``.
SAMPLES_FILE = "samples.npz"
#: The training images kept out of training (``python -m train --holdout N``), with their labels
#: (arrays ``images``, ``labels``, ``indices``): export fits the temperature and the
#: out-of-distribution threshold on them (contract.confidence).
HOLDOUT_FILE = "holdout.npz"

#: Beside ``saved_model.pb`` in a version directory: the ``serving_default`` signature as a
#: LiteRT model in float32 (the name TF Serving loads with ``--prefer_tflite_model``), and
#: the same quantized to int8. Export writes each only after it agreed with the SavedModel.
LITERT_FILE = "model.tflite"
LITERT_INT8_FILE = "model.int8.tflite"
#: The in-process runtimes of a published version (serve.backends.runtimes runs them).
RUNTIME_LITERT, RUNTIME_LITERT_INT8, RUNTIME_SAVEDMODEL = "litert", "litert-int8", "savedmodel"
SERVING_RUNTIMES = (RUNTIME_LITERT, RUNTIME_LITERT_INT8, RUNTIME_SAVEDMODEL)
#: The runtime a server uses unless told otherwise (serve.backends.runtimes says why): export fails
#: when it cannot publish that runtime's model, and only warns about the others.
DEFAULT_SERVING_RUNTIME = RUNTIME_LITERT

#: The URL prefixes of the server's protocols: its JSON API, TF Serving's REST API, the Open
#: Inference Protocol. Every route under them answers JSON errors and needs an API key when keys are on.
API_PREFIX, TFSERVING_REST_PREFIX, V2_PREFIX = "/api/v1", "/v1/models", "/v2"
API_ROOTS = ("/api", "/v1", "/v2")

#: Inside a SavedModel version directory: a copy of the manifest, and TF Serving's
#: warmup records.
ASSETS_EXTRA = "assets.extra"
WARMUP_FILE = "tf_serving_warmup_requests"

CIFAR10_CLASSES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)


def sha256_file(path):
    """The hex SHA-256 of a file, as the manifest records ``weights.sha256``."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@contextlib.contextmanager
def replaced_atomically(path, suffix=""):
    """Yields a temporary path beside ``path`` to write; then renames it over ``path`` in one step.

    A kill never leaves half a file at ``path``: it has the old one or the new. ``suffix`` ends the
    temporary name (Keras insists on ``.weights.h5``). The file is made readable by all, since run and
    model directories are shared (``mkstemp`` makes files private); on an error it is removed.
    """
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".tmp-", suffix=suffix)
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
