"""The seam between the inference service and the backends: what a loaded version is, and what a backend does.

A backend (:mod:`serve.backends`) is anything that satisfies :class:`Backend`; it describes the version it
serves with one frozen :class:`ModelInfo`, built once when the version is loaded (or, for TF Serving, when
its metadata is fetched), whose signatures are typed (:class:`Signature`, :class:`TensorSpec`), and answers
a batch of pixels with a :class:`Prediction` that names the version that answered.
"""

import dataclasses
from collections.abc import Mapping
from typing import Protocol, runtime_checkable

import numpy as np

from contract import (CHANNELS, CONFIDENCE_OUTPUTS, IMAGE_SIZE, INPUT_BYTES, INPUT_PIXELS, OUTPUT_CLASS_IDS,
                      OUTPUT_CLASS_NAMES, OUTPUT_PROBABILITIES, SIGNATURE_BYTES, SIGNATURE_PIXELS)

#: TensorFlow's ``DT_*`` names of the types a signature may use, and the numpy type of each (strings: ``object``).
DTYPES = {
    "DT_FLOAT": np.dtype(np.float32), "DT_DOUBLE": np.dtype(np.float64), "DT_HALF": np.dtype(np.float16),
    "DT_UINT8": np.dtype(np.uint8), "DT_INT8": np.dtype(np.int8), "DT_UINT16": np.dtype(np.uint16),
    "DT_INT16": np.dtype(np.int16), "DT_INT32": np.dtype(np.int32), "DT_UINT32": np.dtype(np.uint32),
    "DT_INT64": np.dtype(np.int64), "DT_UINT64": np.dtype(np.uint64), "DT_BOOL": np.dtype(np.bool_),
    "DT_STRING": np.dtype(object),
}
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}


@dataclasses.dataclass(frozen=True, slots=True)
class TensorSpec:
    """One input or output of a signature: its type, its shape (``-1``: any size; None: any rank), its graph name."""

    dtype: str  # TensorFlow's name, e.g. "DT_UINT8"
    shape: tuple[int, ...] | None
    name: str = ""

    @property
    def numpy(self):
        """The numpy type of its values (``object`` for strings); None for a type this server does not read."""
        return DTYPES.get(self.dtype)

    @classmethod
    def from_json(cls, info):
        """A ``TensorInfo`` in TF Serving's metadata JSON."""
        shape = info.get("tensor_shape", {})
        dims = None if shape.get("unknown_rank") else tuple(int(d.get("size", -1)) for d in shape.get("dim", []))
        return cls(info.get("dtype", "DT_INVALID"), dims, info.get("name", ""))

    def json(self):
        """As TF Serving's metadata JSON writes a ``TensorInfo``."""
        dims = [{"size": str(size), "name": ""} for size in self.shape or ()]
        return {"name": self.name, "dtype": self.dtype, "tensor_shape": {"dim": dims, "unknown_rank": self.shape is None}}


@dataclasses.dataclass(frozen=True)
class Signature:
    """One signature of the model: its inputs and outputs by key."""

    inputs: Mapping[str, TensorSpec]
    outputs: Mapping[str, TensorSpec]
    method_name: str = ""

    @classmethod
    def from_json(cls, signature_def):
        """A ``SignatureDef`` in TF Serving's metadata JSON (the form ``GET /v1/models/NAME/metadata`` answers)."""
        return cls({k: TensorSpec.from_json(v) for k, v in signature_def.get("inputs", {}).items()},
                   {k: TensorSpec.from_json(v) for k, v in signature_def.get("outputs", {}).items()},
                   signature_def.get("method_name", ""))

    def json(self):
        """As TF Serving's metadata JSON writes a ``SignatureDef``."""
        return {"inputs": {k: v.json() for k, v in self.inputs.items()},
                "outputs": {k: v.json() for k, v in self.outputs.items()},
                "method_name": self.method_name, "defaults": {}}


#: The inputs of the contract's two signatures, which every exported model has (contract.SIGNATURE_PIXELS and _BYTES).
CONTRACT_INPUTS = {
    SIGNATURE_PIXELS: {INPUT_PIXELS: TensorSpec("DT_UINT8", (-1, IMAGE_SIZE, IMAGE_SIZE, CHANNELS))},
    SIGNATURE_BYTES: {INPUT_BYTES: TensorSpec("DT_STRING", (-1,))},
}


@dataclasses.dataclass(frozen=True)
class Confidence:
    """How the served probabilities and verdicts were made (export/calibration.py), from the published manifest."""

    calibrated: bool | None = None
    temperature: float | None = None
    method: str | None = None  # the out-of-distribution score
    threshold: float | None = None  # at or under it an image is in distribution

    @classmethod
    def from_manifest(cls, manifest):
        """The :class:`contract.published.Published` manifest's confidence section; None without a manifest."""
        if manifest is None:
            return None
        section = manifest.confidence
        return cls(section.calibrated, section.temperature, section.ood.method, section.ood.threshold)


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """One loaded version of the served model, as every protocol describes it."""

    name: str
    version: int | None  # the version a request without one gets (None: TF Serving has none loaded)
    versions: tuple[int, ...] = ()  # every version a request may name
    architecture: str | None = None
    class_names: tuple[str, ...] | None = None  # from the published manifest; None for a bare TF Serving
    confidence: Confidence | None = None
    signatures: Mapping[str, Signature] = dataclasses.field(default_factory=dict)
    runtime: str | None = None  # the in-process runtime; None for TF Serving
    #: Versions newer than ``version`` that were passed over: ``{version: reason}``.
    skipped_versions: Mapping = dataclasses.field(default_factory=dict)
    #: ``{label: version}``: the model config's version labels, each naming one of ``versions``.
    labels: Mapping = dataclasses.field(default_factory=dict)
    #: ``{version: state}`` of every version the backend knows, as TF Serving names the states
    #: (``LOADING``, ``AVAILABLE``, ``UNLOADING``, ``END``); empty: every one of ``versions`` is ``AVAILABLE``.
    states: Mapping = dataclasses.field(default_factory=dict)

    @classmethod
    def build(cls, name, version, signatures, manifest=None, **fields):
        """The info of ``version``, its facts from its typed ``signatures`` and the published ``manifest``
        (a :class:`contract.published.Published`, or None for a SavedModel from elsewhere)."""
        return cls(
            name=name, version=version, signatures=dict(signatures or {}),
            architecture=manifest.model.name if manifest is not None else None,
            class_names=tuple(manifest.class_names) if manifest is not None else None,
            confidence=Confidence.from_manifest(manifest),
            **fields,
        )

    def signature(self, name):
        """The signature ``name`` of the model, or None. The contract's two (``serving_default`` on pixels and
        ``predict_images`` on encoded images, which the core decodes itself) are known to every model, even one
        whose backend describes none of its signatures (a SavedModel from elsewhere behind a TF Serving)."""
        found = self.signatures.get(name)
        if found is not None or name not in CONTRACT_INPUTS:
            return found
        pixels = self.signatures.get(SIGNATURE_PIXELS)
        outputs = pixels.outputs if pixels is not None else {key: TensorSpec("DT_INVALID", None) for key in self.outputs}
        return Signature(CONTRACT_INPUTS[name], outputs)

    def version_states(self):
        """``[(version, state)]`` newest first, as TF Serving's status lists them."""
        states = dict(self.states) or {version: "AVAILABLE" for version in self.versions}
        return sorted(states.items(), reverse=True)

    @property
    def outputs(self):
        """The outputs of ``serving_default`` in the contract's order: the three every model has, then its confidence outputs."""
        pixels = self.signatures.get(SIGNATURE_PIXELS)
        have = pixels.outputs if pixels is not None else {}
        return (OUTPUT_PROBABILITIES, OUTPUT_CLASS_IDS, OUTPUT_CLASS_NAMES, *(key for key in CONFIDENCE_OUTPUTS if key in have))

    @property
    def num_classes(self):
        """Classes the model answers: from its signature, else the manifest; -1 when neither says."""
        pixels = self.signatures.get(SIGNATURE_PIXELS)
        spec = pixels.outputs.get(OUTPUT_PROBABILITIES) if pixels is not None else None
        if spec is not None and spec.shape is not None and len(spec.shape) == 2 and spec.shape[1] > 0:
            return spec.shape[1]
        return len(self.class_names) if self.class_names else -1

    def label_names(self, outputs, num_classes):
        """The name of each class id: the manifest's, else what the model answered, else ``class_N``."""
        if self.class_names and len(self.class_names) == num_classes:
            return list(self.class_names)
        names = [f"class_{c}" for c in range(num_classes)]
        if OUTPUT_CLASS_IDS in outputs and OUTPUT_CLASS_NAMES in outputs:
            for c, name in zip(np.asarray(outputs[OUTPUT_CLASS_IDS]).tolist(), np.asarray(outputs[OUTPUT_CLASS_NAMES]).tolist()):
                if 0 <= c < num_classes:
                    names[c] = name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
        return names


@dataclasses.dataclass(frozen=True)
class Prediction:
    """A backend's answer: ``{output key: array [N, ...]}`` and the version that gave it."""

    version: int | None
    outputs: Mapping


@runtime_checkable
class Backend(Protocol):
    """Where predictions run: the exported model in this process, or a TF Serving.

    Every method raises a :class:`serve.core.errors.ServeError` kind (``Unavailable``: try again later;
    ``NotServed``: no such version).
    """

    kind: str  # "local", "tfserving-rest" or "tfserving-grpc"

    @property
    def loaded(self) -> bool:
        """Whether a version is loaded (until then ``ready()`` answers 503 without a model call)."""

    def info(self, version: int | None = None) -> ModelInfo:
        """``version``'s info (None: the version a request without one is answered by), listing every version that may be named."""

    def infer(self, images: np.ndarray, version: int | None = None, deadline: float | None = None) -> Prediction:
        """``serving_default`` on uint8 ``[N, 32, 32, 3]`` pixels, by ``version`` (None: the newest), answered by
        ``deadline`` (``time.monotonic()``; None: no deadline) or refused with ``Shed("timeout")``."""

    def run(self, signature_name: str, inputs: Mapping, version: int | None = None) -> Mapping:
        """Any other signature: ``{input key: array}`` (strings as ``object`` arrays of bytes) -> ``{output key: array}``."""

    def ready(self) -> int:
        """The served version, once a probe prediction succeeded."""

    def close(self) -> None:
        """Stop background work (batcher threads, channels)."""


def readiness_images():
    """One black image: what ``ready()`` predicts to prove the model answers."""
    return np.zeros((1, IMAGE_SIZE, IMAGE_SIZE, CHANNELS), np.uint8)
