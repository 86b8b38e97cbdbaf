"""The published manifest: what export adds to a run's manifest, and what a server reads.

Export publishes a :class:`Published` copy of the run's :class:`contract.manifest.Manifest` in
``models/NAME/N/assets.extra/``: every section of the run's manifest plus an :class:`Export` section
(where the version came from, its signatures, the LiteRT checks) and a :class:`Confidence` section
(the temperature and the out-of-distribution threshold). The server reads that copy through
:func:`read_published`; export writes it through :func:`contract.manifest.write`. Every section is a
frozen dataclass, loaded by the same typed loader and format check as the run's manifest, so a field
has one name, one type and one meaning.

Pure Python (no TensorFlow), like the rest of :mod:`contract`.
"""

import dataclasses

from contract.manifest import Manifest, read

_section = dataclasses.dataclass(frozen=True)


@_section
class Tensor:
    dtype: str
    shape: list  # -1: any size


@_section
class Signature:
    inputs: dict[str, Tensor]
    outputs: dict[str, Tensor]


@_section
class Gate:  # what a LiteRT model must meet to be published (export/litert.py)
    float_tolerance: float
    int8_min_agreement: float


@_section
class CheckedOn:
    images: int
    source: str


@_section
class Int8Calibration:  # versions exported with full-integer int8 (calibrated): read, no longer written
    images: int
    source: str
    float_ops: list  # operators kept in float32
    float_layers: list  # Keras layers kept in float32


@_section
class RuntimeCheck:  # one LiteRT model against the SavedModel: published, or refused and why
    file: str
    published: bool
    reason: str | None = None  # why it was not published
    images: int | None = None
    agreement: float | None = None  # share of images given the SavedModel's class
    disagreements: int | None = None
    max_abs_diff: float | None = None  # largest probability difference
    accuracy: float | None = None  # against the sample's labels
    bytes: int | None = None
    ood_score_max_abs_diff: float | None = None
    calibration: Int8Calibration | None = None  # int8 exported before dynamic-range quantization


@_section
class LiteRT:  # export/litert.py's checks: the gate, the images, each runtime's model by runtime name
    gate: Gate
    checked_on: CheckedOn
    savedmodel_accuracy: float  # the SavedModel's own accuracy on the same images
    runtimes: dict[str, RuntimeCheck]  # contract.RUNTIME_LITERT and contract.RUNTIME_LITERT_INT8


@_section
class Export:  # where a published version came from
    model_name: str
    version: int
    exported: str  # ISO 8601, UTC
    run_dir: str
    resize: str  # how predict_images brings other sizes to 32x32
    signatures: dict[str, Signature]
    litert: LiteRT


@_section
class Ood:  # the out-of-distribution score (contract.confidence) and the threshold chosen for it
    method: str
    higher_is: str
    definition: str
    threshold: float | None  # None: no held-out images to choose one on
    pass_rate: float | None = None
    held_out_passing: float | None = None


@_section
class FittedOn:
    file: str
    images: int
    sha256: str


@_section
class FittedTemperature:
    temperature: float  # what the search found, before any fallback to 1
    search_range: list


@_section
class BeforeAfter:
    before: float
    after: float


@_section
class Ece:
    before: float
    after: float
    bins: int


@_section
class HeldOut:  # the held-out images' measures at temperature 1 (before) and the served one (after)
    accuracy: float
    nll: BeforeAfter
    ece: Ece


@_section
class Confidence:  # how the served probabilities and verdicts are made (export/calibration.py)
    temperature: float  # the served probabilities are softmax(logits / temperature)
    calibrated: bool
    ood: Ood
    why: str | None = None  # why the probabilities are not calibrated
    fitted_on: FittedOn | None = None
    fitted: FittedTemperature | None = None
    held_out: HeldOut | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Published(Manifest):
    """A published version's ``assets.extra/manifest.json``: the run's manifest, how it was exported, its confidence."""

    export: Export
    confidence: Confidence

    @classmethod
    def of(cls, manifest, export, confidence):
        """The published copy of the run ``manifest``."""
        return cls(**{f.name: getattr(manifest, f.name) for f in dataclasses.fields(Manifest)},
                   export=export, confidence=confidence)


def read_published(path):
    """The :class:`Published` manifest at ``path`` (a version's ``assets.extra/manifest.json``)."""
    return read(path, Published)
