"""A backend with no model behind it, for serve's unit tests: the app, every protocol and the core run as in
production, over answers computed from the pixels, so no test of the front end waits for a training run.

:class:`FakeBackend` satisfies :class:`serve.core.model.Backend`. Each version's :class:`ModelInfo` is built
as the local backend builds it (:meth:`ModelInfo.build`), from a real :class:`contract.published.Published`
(:func:`published_manifest`) and the signature definitions that manifest lists, turned into TF Serving's
JSON by the same code that reads a ``saved_model.pb`` (:func:`serve.signatures.signature_def_map_json`);
``tests/serve/core/test_fake_backend.py`` checks both against the local backend over a real export.

The model: class ``c``'s logit is ``SCALE * (mean of channel c % 3) / 255`` plus ``version - 1`` for class
``(version - 1) % C`` (so versions answer differently), the probabilities its softmax, the
out-of-distribution score its energy (``contract.confidence.score``). The synthetic classes
(``synthetic.CLASS_NAMES``) differ by their brightest channel, so the fake gets them right.
:func:`expected` computes the same for a test.

Faults: ``raises`` (an exception every call raises), ``hold`` (an event every call waits on,
after setting ``entered``), ``not_ready`` (``ready()`` answers 503, as before a model loads).
"""

import dataclasses
import threading
import time

import numpy as np

import synthetic
from contract import (CHANNELS, IMAGE_SIZE, INPUT_BYTES, INPUT_PIXELS, OUTPUT_CLASS_IDS, OUTPUT_CLASS_NAMES,
                      OUTPUT_IN_DISTRIBUTION, OUTPUT_OOD_SCORE, OUTPUT_PROBABILITIES, RUNTIME_LITERT, SIGNATURE_BYTES,
                      SIGNATURE_PIXELS, confidence)
from contract import manifest as manifests
from contract import published as publications
from contract.recipe import Recipe
from serve.core.errors import BadRequest, NotServed, Shed, Unavailable
from serve.core.model import ModelInfo, Prediction, readiness_images

SCALE = 8.0
#: The energy at or under which an image is in distribution: the synthetic images score about -5.5
#: to -8, a black image about -1.1 (three equal logits of 0: -log 3).
THRESHOLD = -3.0

_DTYPES = {"uint8": 4, "float32": 1, "int64": 9, "string": 7, "bool": 10}  # tensorflow.DataType numbers


def published_manifest(class_names=synthetic.CLASS_NAMES, *, model_name="cifar10", version=1, threshold=THRESHOLD,
                       calibrated=False, temperature=1.0, architecture="seed_cnn"):
    """A valid :class:`contract.published.Published`, as export writes it (read back through its validator).

    ``threshold`` None: a run without a held-out slice (no ``in_distribution`` output).
    """
    n = len(class_names)
    outputs = {OUTPUT_PROBABILITIES: ("float32", [-1, n]), OUTPUT_CLASS_IDS: ("int64", [-1]),
               OUTPUT_CLASS_NAMES: ("string", [-1]), OUTPUT_OOD_SCORE: ("float32", [-1])}
    if threshold is not None:
        outputs[OUTPUT_IN_DISTRIBUTION] = ("bool", [-1])
    tensors = {key: {"dtype": dtype, "shape": shape} for key, (dtype, shape) in sorted(outputs.items())}
    signatures = {
        SIGNATURE_BYTES: {"inputs": {INPUT_BYTES: {"dtype": "string", "shape": [-1]}}, "outputs": tensors},
        SIGNATURE_PIXELS: {"inputs": {INPUT_PIXELS: {"dtype": "uint8", "shape": [-1, IMAGE_SIZE, IMAGE_SIZE, CHANNELS]}},
                           "outputs": tensors},
    }
    check = {"file": "model.tflite", "published": True, "images": 48, "agreement": 1.0, "disagreements": 0,
             "max_abs_diff": 0.0, "accuracy": 1.0, "bytes": 1000}
    raw = {
        "format": manifests.FORMAT, "created": "2026-01-01T00:00:00+00:00",
        "model": {"name": architecture, "kwargs": {}},
        "class_names": list(class_names), "num_classes": n,
        "input": {"shape": [IMAGE_SIZE, IMAGE_SIZE, CHANNELS], "dtype": "uint8", "range": [0, 255], "color": "RGB",
                  "resize": "bilinear", "preprocessing": "inside the model"},
        "weights": {"file": "model.weights.h5", "sha256": "0" * 64},
        # The recipe whole, from its own type: a field added to it needs no edit here.
        "training": {"data": None, "train_images": 144, "test_images": 48,
                     "recipe": dataclasses.asdict(Recipe(epochs=4, batch_size=16)), "keras_backend": "tensorflow",
                     "input_pipeline": "tf.data", "strategy": "default", "hardware": "cpu", "replicas": 1,
                     "global_batch": 16, "peak_learning_rate": 0.001, "steps_per_epoch": 9, "steps_per_execution": 1,
                     "precision": "float32", "seed": 0, "wall_time_s": 1.0},
        "metrics": {"test_accuracy": 1.0, "test_loss": 0.01, "test_images": 48},
        "versions": {},
        "fingerprint": {"seed": 0, "shape": [1, IMAGE_SIZE, IMAGE_SIZE, CHANNELS], "outputs": [[1.0 / n] * n],
                        "inputs_sha256": "0" * 64},
        "samples": {"file": "samples.npz", "train": 48, "test": 48, "sha256": "0" * 64, "seed": 0},
        "export": {"model_name": model_name, "version": version, "exported": "2026-01-01T00:00:00+00:00",
                   "run_dir": "/runs/fake", "resize": "bilinear", "signatures": signatures,
                   "litert": {"gate": {"float_tolerance": 1e-4, "int8_min_agreement": 0.99},
                              "checked_on": {"images": 48, "source": "samples.npz test"}, "savedmodel_accuracy": 1.0,
                              "runtimes": {RUNTIME_LITERT: check}}},
        "confidence": {"temperature": temperature, "calibrated": calibrated,
                       "ood": {"method": confidence.METHOD, "higher_is": "more foreign",
                               "definition": "-logsumexp(logits), the logits at temperature 1", "threshold": threshold}},
    }
    return publications.Published.from_dict(raw, source="fake manifest")


def signature_defs(manifest):
    """``manifest``'s signatures, typed, as the local backend reads them from ``saved_model.pb``."""
    from serve.backends import signatures
    from tfs_protos.tensorflow_serving.apis import get_model_metadata_pb2

    defs = get_model_metadata_pb2.SignatureDefMap()
    for name, signature in manifest.export.signatures.items():
        sig = defs.signature_def[name]
        sig.method_name = "tensorflow/serving/predict"
        for key, tensor in signature.inputs.items():
            _tensor_info(sig.inputs[key], tensor, f"{name}_{key}:0")
        for index, (key, tensor) in enumerate(sorted(signature.outputs.items())):
            _tensor_info(sig.outputs[key], tensor, f"StatefulPartitionedCall:{index}")
    return signatures.of_signature_defs(defs.signature_def)


def _tensor_info(info, tensor, name):
    info.name = name
    info.dtype = _DTYPES[tensor.dtype]
    for size in tensor.shape:
        info.tensor_shape.dim.add(size=size)


def logits(images, version=1, num_classes=len(synthetic.CLASS_NAMES)):
    """The fake model's logits for uint8 ``[N, 32, 32, 3]`` pixels, float64 ``[N, num_classes]``."""
    means = np.asarray(images, np.float64).reshape(len(images), IMAGE_SIZE * IMAGE_SIZE, CHANNELS).mean(axis=1) / 255.0
    z = SCALE * means[:, [c % CHANNELS for c in range(num_classes)]]
    z[:, (version - 1) % num_classes] += version - 1
    return z


def expected(images, version=1, class_names=synthetic.CLASS_NAMES, threshold=THRESHOLD, temperature=1.0):
    """``{output key: array}``: what the fake's ``serving_default`` answers for ``images`` by ``version``."""
    z = logits(images, version, len(class_names))
    probabilities = confidence.softmax(z, temperature).astype(np.float32)
    ids = probabilities.argmax(axis=1).astype(np.int64)
    outputs = {
        OUTPUT_PROBABILITIES: probabilities,
        OUTPUT_CLASS_IDS: ids,
        OUTPUT_CLASS_NAMES: np.asarray([class_names[i].encode() for i in ids], dtype=object).reshape(len(ids)),
        OUTPUT_OOD_SCORE: confidence.score(z).astype(np.float32),
    }
    if threshold is not None:
        outputs[OUTPUT_IN_DISTRIBUTION] = confidence.in_distribution(outputs[OUTPUT_OOD_SCORE], threshold)
    return outputs


class FakeBackend:
    """:class:`serve.core.model.Backend` over :func:`expected`: ``versions`` (default: 1 alone), ``labels``
    (``{label: version}``), each version described by ``manifests[version]`` (default: :func:`published_manifest`;
    None: a SavedModel from elsewhere, without class names or confidence)."""

    kind = "local"

    def __init__(self, name="cifar10", versions=(1,), labels=None, manifests=None, runtime=RUNTIME_LITERT,
                 skipped_versions=None):
        self.name = name
        self.runtime = runtime
        self.labels = dict(labels or {})
        self.manifests = {v: published_manifest(model_name=name, version=v) for v in versions}
        self.manifests.update(manifests or {})
        self.skipped_versions = dict(skipped_versions or {})
        self.raises = None  # an exception every call raises
        self.hold = None  # a threading.Event every call waits on, after setting `entered`
        self.entered = threading.Event()
        self.not_ready = False
        self.closed = False
        self.calls = []  # (signature name, version, image count) of every model call, in order
        self._lock = threading.Lock()

    @property
    def versions(self):
        return tuple(sorted(self.manifests))

    @property
    def loaded(self):
        return not self.not_ready

    def wait_loaded(self, timeout=None):
        """Loaded from the start (the local backend's ``wait_loaded``, so fixtures treat both alike)."""

    def info(self, version=None):
        number = self._version(version)
        manifest = self.manifests[number]
        defs = signature_defs(manifest if manifest is not None else published_manifest(model_name=self.name))
        return ModelInfo.build(self.name, number, defs, manifest, versions=self.versions, runtime=self.runtime,
                               labels=dict(self.labels), skipped_versions=dict(self.skipped_versions))

    def infer(self, images, version=None, deadline=None):
        number = self._version(version)
        images = np.asarray(images, np.uint8)
        with self._lock:
            self.calls.append((SIGNATURE_PIXELS, number, len(images)))
        self._fault(deadline)
        manifest = self.manifests[number]
        if manifest is None:
            outputs = expected(images, number, [f"class_{c}" for c in range(len(synthetic.CLASS_NAMES))], threshold=None)
        else:
            outputs = expected(images, number, manifest.class_names, manifest.confidence.ood.threshold,
                               manifest.confidence.temperature)
        return Prediction(number, outputs)

    def run(self, signature_name, inputs, version=None):
        # As LiteRT (the default runtime) answers: it runs serving_default alone, which the core sends to infer.
        raise BadRequest(f"the {self.runtime} runtime does not run signature {signature_name!r}")

    def ready(self):
        if self.not_ready:
            raise Unavailable("the model is still loading")
        self.infer(readiness_images())
        return self.versions[-1]

    def close(self):
        self.closed = True

    def _version(self, version):
        if self.not_ready:
            raise Unavailable("the model is still loading")
        number = self.versions[-1] if version is None else int(version)
        if number not in self.manifests:
            raise NotServed(f"model {self.name!r} version {version} is not loaded "
                            f"(available: {', '.join(map(str, self.versions))})", name=self.name, version=version,
                            versions=self.versions)
        return number

    def _fault(self, deadline=None):
        if self.hold is not None:
            self.entered.set()
            # As the local backend's batcher does: a call waits for the model until its deadline, then gives up.
            if not self.hold.wait(None if deadline is None else max(0.0, deadline - time.monotonic())):
                raise Shed("the model did not answer by the request's deadline", "timeout")
        if self.raises is not None:
            raise self.raises



#: The unit tests' app settings: a 1 MiB upload limit, as the real app of the end-to-end tests has.
APP_SETTINGS = {"TESTING": True, "MODEL_NAME": "cifar10", "MAX_UPLOAD_MB": 1}


def make_app(backend=None, api_key=None, **settings):
    """serve's app over ``backend`` (default: a new :class:`FakeBackend`), ``settings`` (Flask config keys) over
    :data:`APP_SETTINGS`, and ``api_key`` required on the API and the form when given."""
    from serve import create_app

    settings = {**APP_SETTINGS, **({"API_KEYS": api_key} if api_key else {}), **settings}
    return create_app(settings, backend=backend if backend is not None else FakeBackend())


def probabilities_by_class(predictions):
    """The JSON API's ``predictions`` as a table of probabilities: a row an image, a column a class id."""
    table = np.full((len(predictions), len(synthetic.CLASS_NAMES)), np.nan, np.float32)
    for row, prediction in enumerate(predictions):
        for entry in prediction["top_k"]:
            table[row, entry["class_id"]] = entry["probability"]
    assert not np.isnan(table).any(), predictions
    return table


def api_probabilities(app, images, headers):
    """``/api/v1/predict``'s probabilities for ``images`` sent as PNG uploads, by class id: what the other protocols
    of the same app must answer."""
    files = [(f"{i}.png", synthetic.encode(image)) for i, image in enumerate(images)]
    response = app.test_client().post("/api/v1/predict", headers=headers, **synthetic.multipart(*files))
    assert response.status_code == 200, response.get_json()
    return probabilities_by_class(response.get_json()["predictions"])
