"""The training manifest: what a run hands to export, and what a published model carries.

Training writes ``RUN/manifest.json`` last (its presence means the run is complete); export
reads it, checks the weights against its fingerprint, and publishes a copy with an
``export`` section in ``models/NAME/N/assets.extra/``; the server reads that copy. Every stage
goes through :func:`read` and :func:`write`, so a field has one name and one meaning.

Pure Python (no TensorFlow), like the rest of :mod:`contract`.

Format history: 1 had no ``samples`` and no ``training.backend``; 2 adds them. Both are read.
"""

import dataclasses
import json
import os
import tempfile

FORMAT = 2
READABLE_FORMATS = (1, 2)


class ManifestError(ValueError):
    """A manifest that cannot be used; the message names the file and the problem in one line."""


@dataclasses.dataclass
class ModelSpec:
    name: str  # the registry name in train.models
    kwargs: dict = dataclasses.field(default_factory=dict)  # builder arguments beyond num_classes


@dataclasses.dataclass
class Weights:
    file: str  # contract.WEIGHTS_FILE, beside the manifest
    sha256: str
    dtype: str = "float32"


@dataclasses.dataclass
class Fingerprint:
    """A seeded probe batch (train.models.probe_batch) and the trained model's outputs on it."""

    seed: int
    shape: list  # [count, 32, 32, 3]
    outputs: list  # float32 probabilities, [count, num_classes]
    inputs_sha256: str = ""  # of the probe's bytes, so a changed random stream is caught
    dtype: str = "uint8"


@dataclasses.dataclass
class Samples:
    """A seeded subset of each split (contract.SAMPLES_FILE) for calibrating and verifying exports."""

    file: str
    train: int  # images in the train sample
    test: int  # images in the test sample
    sha256: str
    seed: int = 0


@dataclasses.dataclass
class Holdout:
    """Training images kept out of training (contract.HOLDOUT_FILE), for export's calibration."""

    file: str
    images: int
    seed: int  # contract.confidence.holdout_indices's seed
    indices_sha256: str  # of the int64 indices into the training split, as loaded
    sha256: str


@dataclasses.dataclass
class Manifest:
    model: ModelSpec
    class_names: list
    weights: Weights
    fingerprint: Fingerprint
    input: dict  # the input contract: shape, dtype, range, colour, resize method
    training: dict  # how the weights were made: backend, strategy, hardware, batch, recipe, wall time
    metrics: dict  # test_accuracy, test_loss, test_images
    versions: dict  # library versions at training time
    created: str = ""
    samples: Samples = None  # None in format 1
    holdout: Holdout = None  # None unless trained with --holdout
    export: dict = None  # added by export to the published copy
    extra: dict = dataclasses.field(default_factory=dict)  # sections this code does not know, kept as they are
    format: int = FORMAT

    @property
    def num_classes(self):
        return len(self.class_names)

    def to_dict(self):
        out = {"format": self.format, "created": self.created, "model": dataclasses.asdict(self.model),
               "class_names": list(self.class_names), "num_classes": self.num_classes, "input": self.input,
               "weights": dataclasses.asdict(self.weights), "training": self.training, "metrics": self.metrics,
               "versions": self.versions, "fingerprint": dataclasses.asdict(self.fingerprint)}
        if self.samples is not None:
            out["samples"] = dataclasses.asdict(self.samples)
        if self.holdout is not None:
            out["holdout"] = dataclasses.asdict(self.holdout)
        if self.export is not None:
            out["export"] = self.export
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, raw, source="manifest"):
        """Validate ``raw`` (parsed JSON) and return a Manifest; raises :class:`ManifestError`."""
        if not isinstance(raw, dict):
            raise ManifestError(f"{source} is not a JSON object")
        version = raw.get("format")
        if version not in READABLE_FORMATS:
            newer = isinstance(version, int) and version > FORMAT
            raise ManifestError(f"{source} has manifest format {version!r}; this version reads formats "
                                f"{', '.join(map(str, READABLE_FORMATS))}" + (" (upgrade the pipeline)" if newer else ""))
        known = {f.name for f in dataclasses.fields(cls)} | {"num_classes"}
        try:
            manifest = cls(
                format=version,
                created=raw.get("created", ""),
                model=_section(ModelSpec, raw, "model"),
                class_names=list(raw["class_names"]),
                weights=_section(Weights, raw, "weights"),
                fingerprint=_section(Fingerprint, raw, "fingerprint"),
                input=dict(raw["input"]),
                training=dict(raw["training"]),
                metrics=dict(raw["metrics"]),
                versions=dict(raw.get("versions") or {}),
                samples=_section(Samples, raw, "samples") if raw.get("samples") is not None else None,
                holdout=_section(Holdout, raw, "holdout") if raw.get("holdout") is not None else None,
                export=raw.get("export"),
                extra={k: v for k, v in raw.items() if k not in known},
            )
        except KeyError as exc:
            raise ManifestError(f"{source} lacks field {exc}") from None
        except (TypeError, ValueError) as exc:
            raise ManifestError(f"{source} has a malformed section: {exc}") from None
        if "num_classes" in raw and raw["num_classes"] != manifest.num_classes:
            raise ManifestError(f"{source} lists {manifest.num_classes} class names for {raw['num_classes']} classes")
        if not all(isinstance(n, str) and n for n in manifest.class_names) or manifest.num_classes < 2:
            raise ManifestError(f"{source} needs at least two non-empty class names")
        shape = manifest.fingerprint.shape
        outputs = manifest.fingerprint.outputs
        if not (isinstance(shape, list) and len(shape) == 4 and isinstance(outputs, list) and len(outputs) == shape[0]):
            raise ManifestError(f"{source}: the fingerprint's outputs do not match its probe shape {shape}")
        return manifest


def _section(kind, raw, key):
    value = raw[key]
    if not isinstance(value, dict):
        raise ManifestError(f"section {key!r} is not an object")
    names = {f.name for f in dataclasses.fields(kind)}
    try:
        return kind(**{k: v for k, v in value.items() if k in names})
    except TypeError:
        missing = [f.name for f in dataclasses.fields(kind)
                   if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.name not in value]
        raise KeyError(f"{key}.{missing[0]}" if missing else key) from None


def read(path):
    """The manifest at ``path``, validated; raises :class:`ManifestError` naming the file and the problem."""
    try:
        with open(path) as f:
            raw = json.load(f)
    except FileNotFoundError:
        raise ManifestError(f"no manifest at {path}") from None
    except (OSError, ValueError) as exc:
        raise ManifestError(f"cannot read {path}: {exc}") from None
    return Manifest.from_dict(raw, source=path)


def write(path, manifest):
    """Write ``manifest`` (a Manifest or a dict) to ``path`` atomically: a kill never leaves half a file."""
    data = manifest.to_dict() if isinstance(manifest, Manifest) else manifest
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
        os.chmod(tmp, 0o644)  # mkstemp makes files private; run and model directories are shared
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
