"""Model runtimes: what runs one published version ``models/NAME/N/`` inside this process.

======================  ============================  =============================================
``SERVE_RUNTIME``       runs                          needs
======================  ============================  =============================================
``litert`` (default)    ``N/model.tflite``, float32   ``ai-edge-litert`` (the ``serve`` extra)
``litert-int8``         ``N/model.int8.tflite``       the same
``savedmodel``          ``N/saved_model.pb``          TensorFlow (the ``savedmodel`` extra)
======================  ============================  =============================================

``litert`` is the default: export publishes it only after it gave the SavedModel's labels on
every image of the run's test sample (``export/litert.py``), it runs the model several times
faster than TensorFlow on a small CPU (``docs/benchmarks.md``), and a worker that never imports
TensorFlow holds a fraction of the memory. ``litert-int8`` is faster still, but changes a label in a
few hundred, so it is a choice to make, not a default. ``savedmodel`` runs the exported
graph itself.

Every runtime gives the same two things to :class:`serve.backends.local.LocalBackend`:
``pixels(images)`` (the ``serving_default`` signature, uint8 ``[N, 32, 32, 3]``; one call at a
time: the backend's batcher serialises them) and ``call(signature_name, inputs, pixels)`` for
the signatures it runs, where ``pixels`` is the batched way back to the model. Encoded images
never reach a runtime: the front end decodes every one with :mod:`serve.core.decode` (the pixel cap,
EXIF orientation, Pillow's resize) and hands over pixels, whichever route they came by. Signature definitions always come from ``N/saved_model.pb``,
read through the vendored protos, so the metadata routes say the same on every runtime.
"""

import os

import numpy as np

from contract import (
    CHANNELS,
    DEFAULT_SERVING_RUNTIME,
    IMAGE_SIZE,
    INPUT_PIXELS,
    LITERT_FILE,
    LITERT_INT8_FILE,
    OUTPUT_PROBABILITIES,
    RUNTIME_LITERT,
    RUNTIME_LITERT_INT8,
    RUNTIME_SAVEDMODEL,
    SERVING_RUNTIMES,
    SIGNATURE_PIXELS,
)
from contract.manifest import ManifestError
from serve.backends import published, signatures
from serve.core.errors import BadRequest

LITERT, LITERT_INT8, SAVEDMODEL = RUNTIME_LITERT, RUNTIME_LITERT_INT8, RUNTIME_SAVEDMODEL
RUNTIMES = SERVING_RUNTIMES
DEFAULT_RUNTIME = DEFAULT_SERVING_RUNTIME  # LITERT, for the reasons above

#: The file in a version directory that each runtime loads.
MODEL_FILES = {LITERT: LITERT_FILE, LITERT_INT8: LITERT_INT8_FILE, SAVEDMODEL: published.SAVED_MODEL_FILE}


def check(runtime):
    """``runtime`` if it is one of :data:`RUNTIMES`; ``ValueError`` naming them otherwise."""
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown runtime {runtime!r}; choose {', '.join(RUNTIMES)}")
    return runtime


def default_threads():
    """Threads for one model call: every core this process may run on, though gunicorn's workers share them.

    A lone request then has the idle cores to itself; under load the batcher's batches keep the
    calls few. On the 2-core benchmark machine, two threads a call answered single images at c=1
    about 1 ms sooner than one thread a worker, and no slower at c=32 (``python -m bench.serving.speed
    --servers litert,litert@1``; docs/benchmarks.md). Where a CPU limit caps the process below
    the cores it sees (a container), set ``SERVE_RUNTIME_THREADS`` to fit the limit instead.
    """
    return len(os.sched_getaffinity(0))


def versions(model_dir, runtime):
    """Versions under ``model_dir`` that ``runtime`` can serve, ascending."""
    return published.versions(model_dir, MODEL_FILES[check(runtime)])


def missing_reason(version_dir, runtime):
    """Why ``version_dir`` has no model for ``runtime``, from its published manifest, or a generic line."""
    file = MODEL_FILES[runtime]
    try:
        served = published.manifest(version_dir)
    except ManifestError as e:
        return f"{version_dir} is refused: {e}"
    check = served.export.litert.runtimes.get(runtime) if served is not None else None
    if check is not None and not check.published:
        return f"{version_dir} has no {file}: export did not publish it ({check.reason})"
    return f"{version_dir} has no {file}; export it with python -m export, or set SERVE_RUNTIME=savedmodel"


def load(runtime, version_dir, threads=None):
    """The model in ``version_dir``, loaded by ``runtime`` and checked on one probe image."""
    check(runtime)
    path = os.path.join(version_dir, MODEL_FILES[runtime])
    if not os.path.isfile(path):
        raise FileNotFoundError(missing_reason(version_dir, runtime))
    typed = signatures.of_saved_model(os.path.join(version_dir, published.SAVED_MODEL_FILE))
    if runtime == SAVEDMODEL:
        model = SavedModel(version_dir, typed)
    else:
        model = LiteRT(runtime, path, typed, threads or default_threads())
    outputs = model.pixels(np.zeros((1, IMAGE_SIZE, IMAGE_SIZE, CHANNELS), np.uint8))  # fail here, not on a request
    if np.asarray(outputs[OUTPUT_PROBABILITIES]).shape[0] != 1:
        raise ValueError(f"{path} returned the wrong batch size on a probe image")
    # A batch of no images is answered with no rows, never by the runtime: XNNPACK refuses a
    # batch of 0, and TensorFlow's answer to one depends on the CPU's kernels (oneDNN or not).
    model.empty_outputs = {key: np.asarray(value)[:0].copy() for key, value in outputs.items()}
    return model


class LiteRT:
    """A ``.tflite`` model in LiteRT's interpreter (XNNPACK)."""

    def __init__(self, runtime, path, signatures, threads):
        from ai_edge_litert.interpreter import Interpreter

        self.runtime = runtime
        self.threads = threads
        self.signatures = signatures
        # model_path, not model_content: the file is memory-mapped, so workers share its pages.
        self._interpreter = Interpreter(model_path=path, num_threads=threads)
        available = self._interpreter.get_signature_list()
        if SIGNATURE_PIXELS not in available:
            raise ValueError(f"{path} has no {SIGNATURE_PIXELS!r} signature (it has {sorted(available)})")
        self._runner = self._interpreter.get_signature_runner(SIGNATURE_PIXELS)

    def pixels(self, images):
        # The runner resizes the input only when the batch size changed (about 10 us when it did).
        return self._runner(**{INPUT_PIXELS: np.ascontiguousarray(images, dtype=np.uint8)})

    def call(self, signature_name, inputs, pixels):
        if signature_name == SIGNATURE_PIXELS:
            return pixels(inputs[INPUT_PIXELS])
        raise BadRequest(f"the {self.runtime} runtime does not run signature {signature_name!r}")


class SavedModel:
    """The SavedModel's own concrete signatures, in TensorFlow."""

    runtime = SAVEDMODEL
    threads = None  # TensorFlow's own thread pools

    def __init__(self, version_dir, signatures):
        import tensorflow as tf

        self._tf = tf
        self.signatures = signatures
        self._loaded = tf.saved_model.load(version_dir)  # keeps the functions' variables alive
        self._functions = {name: self._loaded.signatures[name] for name in self._loaded.signatures.keys()}
        if SIGNATURE_PIXELS not in self._functions:
            raise ValueError(f"{version_dir} has no {SIGNATURE_PIXELS!r} signature")
        self._pixels = self._functions[SIGNATURE_PIXELS]

    def pixels(self, images):
        outputs = self._pixels(**{INPUT_PIXELS: self._tf.convert_to_tensor(images)})
        return {key: value.numpy() for key, value in outputs.items()}

    def call(self, signature_name, inputs, pixels):
        tf = self._tf
        if signature_name == SIGNATURE_PIXELS and list(inputs) == [INPUT_PIXELS]:
            return pixels(inputs[INPUT_PIXELS])
        if signature_name not in self._functions:
            raise BadRequest(f"signature {signature_name!r} not found; this model has {sorted(self._functions)}")
        try:
            outputs = self._functions[signature_name](**{k: tf.convert_to_tensor(v) for k, v in inputs.items()})
        except (tf.errors.InvalidArgumentError, ValueError, TypeError) as e:
            message = getattr(e, "message", None) or str(e)
            raise BadRequest(f"the model rejected the input: {message.strip().splitlines()[0]}") from None
        return {key: value.numpy() for key, value in outputs.items()}
