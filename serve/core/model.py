"""The seam between the inference service and the backends: what a loaded version is, and what a backend does.

A backend (:mod:`serve.backends`) is anything that satisfies :class:`Backend`; it describes the
version it serves with one frozen :class:`ModelInfo`, built once when the version is loaded (or,
for TF Serving, when its metadata is fetched), and answers a batch of pixels with a
:class:`Prediction` that names the version that answered.
"""

import dataclasses
import functools
from collections.abc import Mapping
from typing import Protocol, runtime_checkable

import numpy as np

from contract import (CHANNELS, CONFIDENCE_OUTPUTS, IMAGE_SIZE, OUTPUT_CLASS_IDS, OUTPUT_CLASS_NAMES, OUTPUT_PROBABILITIES,
                      OUTPUTS, SIGNATURE_PIXELS)
from serve import signatures


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
    #: ``{signature name: signature_def}`` in TF Serving's metadata JSON form.
    signature_defs: Mapping = dataclasses.field(default_factory=dict)
    #: Which of :data:`contract.CONFIDENCE_OUTPUTS` ``serving_default`` answers, in that order.
    confidence_outputs: tuple[str, ...] = ()
    runtime: str | None = None  # the in-process runtime; None for TF Serving
    #: Versions newer than ``version`` that were passed over: ``{version: reason}``.
    skipped_versions: Mapping = dataclasses.field(default_factory=dict)
    #: ``{label: version}``: the model config's version labels, each naming one of ``versions``.
    labels: Mapping = dataclasses.field(default_factory=dict)
    #: ``{version: state}`` of every version the backend knows, as TF Serving names the states
    #: (``LOADING``, ``AVAILABLE``, ``UNLOADING``, ``END``); empty: every one of ``versions`` is ``AVAILABLE``.
    states: Mapping = dataclasses.field(default_factory=dict)

    @classmethod
    def build(cls, name, version, signature_defs, manifest=None, **fields):
        """The info of ``version``, its facts from ``signature_defs`` and the published ``manifest``
        (a :class:`contract.published.Published`, or None for a SavedModel from elsewhere)."""
        have = (signature_defs or {}).get(SIGNATURE_PIXELS, {}).get("outputs", {})
        return cls(
            name=name, version=version, signature_defs=dict(signature_defs or {}),
            confidence_outputs=tuple(key for key in CONFIDENCE_OUTPUTS if key in have),
            architecture=manifest.model.name if manifest is not None else None,
            class_names=tuple(manifest.class_names) if manifest is not None else None,
            confidence=Confidence.from_manifest(manifest),
            **fields,
        )

    def version_states(self):
        """``[(version, state)]`` newest first, as TF Serving's status lists them."""
        states = dict(self.states) or {version: "AVAILABLE" for version in self.versions}
        return sorted(states.items(), reverse=True)

    @functools.cached_property
    def input_specs(self):
        """``{signature name: {input key: (numpy dtype, dims)}}`` (:func:`serve.signatures.tensor_specs`),
        read from ``signature_defs`` once per loaded version rather than once per request."""
        return {name: signatures.tensor_specs(sig) for name, sig in self.signature_defs.items()}

    @property
    def outputs(self):
        """The outputs of ``serving_default``: the three every model has, then its confidence outputs."""
        return (*OUTPUTS, *self.confidence_outputs)

    @property
    def num_classes(self):
        """Classes the model answers: from its signature, else the manifest; -1 when neither says."""
        output = self.signature_defs.get(SIGNATURE_PIXELS, {}).get("outputs", {}).get(OUTPUT_PROBABILITIES, {})
        dims = output.get("tensor_shape", {}).get("dim", [])
        if len(dims) == 2 and int(dims[1].get("size", -1)) > 0:
            return int(dims[1]["size"])
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

    Every method raises :class:`serve.core.errors.ServeError` with the HTTP status to answer with
    (503: try again later; 404: no such version).
    """

    kind: str  # "local", "tfserving-rest" or "tfserving-grpc"

    @property
    def loaded(self) -> bool:
        """Whether a version is loaded (until then ``ready()`` answers 503 without a model call)."""

    def info(self, version: int | None = None) -> ModelInfo:
        """``version``'s info (None: the version a request without one is answered by), listing every version that may be named."""

    def infer(self, images: np.ndarray, version: int | None = None) -> Prediction:
        """``serving_default`` on uint8 ``[N, 32, 32, 3]`` pixels, by ``version`` (None: the newest)."""

    def run(self, signature_name: str, inputs: Mapping, version: int | None = None) -> Mapping:
        """Any signature: ``{input key: array}`` (strings as ``object`` arrays of bytes) -> ``{output key: array}``."""

    def ready(self) -> int:
        """The served version, once a probe prediction succeeded."""

    def close(self) -> None:
        """Stop background work (batcher threads, channels)."""


def readiness_images():
    """One black image: what ``ready()`` predicts to prove the model answers."""
    return np.zeros((1, IMAGE_SIZE, IMAGE_SIZE, CHANNELS), np.uint8)
