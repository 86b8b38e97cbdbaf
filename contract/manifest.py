"""The run's manifest: what a training run writes and hands to export.

Training writes ``RUN/manifest.json`` last (its presence means the run is complete): a
:class:`Manifest`. Export reads it and checks the weights against its fingerprint. What export adds
when it publishes a version (the :class:`contract.published.Published` copy a server reads) lives in
:mod:`contract.published`, built on this module's loader. Every stage goes through :func:`read` and
:func:`write` (and :func:`contract.published.read_published`), and every section is a frozen dataclass,
so a field has one name, one type and one meaning.

Pure Python (no TensorFlow), like the rest of :mod:`contract`.

Only :data:`FORMAT` is read. Every artefact of this project is rebuilt by its own commands, so a
manifest in an older format is refused with one line that names them (:data:`REBUILD`).
"""

import dataclasses
import json
import types
import typing

from contract import replaced_atomically
from contract.recipe import Recipe

#: 4 (later, optional and so readable by every reader of 4): ``training.budget`` (:class:`Budget`).
#: 4: the run's whole recipe under ``training.recipe`` (:class:`contract.recipe.Recipe`; the
#: hyperparameters were flat fields of ``training``, some missing), ``training.input_pipeline``, and
#: ``training.peak_learning_rate`` (the recipe's rate at the run's global batch; was ``learning_rate``).
#: 3: typed export and confidence sections, ``training.keras_backend`` (was ``training.backend``),
#: ``samples`` required; the LiteRT checks under ``export.litert.runtimes``.
FORMAT = 4
#: The commands that rebuild a run and its published versions in the current format.
REBUILD = "python -m train --output RUN --overwrite, then python -m export --run RUN"

_section = dataclasses.dataclass(frozen=True)


class ManifestError(ValueError):
    """A manifest that cannot be used; the message names the file and the problem in one line."""


class FormatError(ManifestError):
    """A manifest in another format than :data:`FORMAT`; the message says how to rebuild it."""


# --- The run: what training hands to export ----------------------------------------------------


@_section
class ModelSpec:
    name: str  # the registry name in train.models
    kwargs: dict = dataclasses.field(default_factory=dict)  # builder arguments beyond num_classes


@_section
class Weights:
    file: str  # contract.WEIGHTS_FILE, beside the manifest
    sha256: str
    dtype: str = "float32"


@_section
class Fingerprint:
    """The fingerprint images (train.models.fingerprint_images, from ``seed``) and the trained model's outputs on them."""

    seed: int
    shape: list  # [count, 32, 32, 3]
    outputs: list  # float32 probabilities, [count, num_classes]
    inputs_sha256: str  # of the images' bytes, so a changed random stream is caught
    dtype: str = "uint8"


@_section
class Samples:
    """A seeded subset of each split (contract.SAMPLES_FILE); export verifies its LiteRT models on the test sample."""

    file: str
    train: int  # images in the train sample
    test: int  # images in the test sample
    sha256: str
    seed: int


@_section
class Holdout:
    """Training images kept out of training (contract.HOLDOUT_FILE), for export's calibration."""

    file: str
    images: int
    seed: int  # contract.confidence.holdout_indices's seed
    indices_sha256: str  # of the int64 indices into the training split, as loaded
    sha256: str


@_section
class Input:  # the input contract every model takes
    shape: list  # [32, 32, 3]
    dtype: str
    range: list  # [0, 255]
    color: str
    resize: str  # contract.RESIZE_METHOD
    preprocessing: str


@_section
class Budget:
    """How a run given a time budget (``python -m train --time-budget``) chose its length (train.budget).

    Seconds are wall time on the trainer's clock, which starts when the run does (before the data is
    read), so the budget covers the whole training command up to its manifest.
    """

    seconds: float  # the budget
    epochs: int  # the length chosen: the most that fit, at least one, at most max_epochs
    max_epochs: int  # the recipe's epochs, which the budget never exceeds
    steps_per_epoch: int
    step_s: float  # the median wall time of the timed steps
    timed_steps: int  # steps timed after the first, which compiles
    compile_s: float  # the first step's time less step_s: tracing and compiling the train step
    elapsed_s: float  # on the clock when the choice was made
    steps_done: int  # steps taken when the choice was made
    reserve_s: float  # predicted for what follows the last step (the handover's evaluation and files)
    predicted_s: float  # the whole run's predicted wall time at the chosen length


@_section
class Training:  # how the weights were made: the recipe, and the run that applied it
    data: str | None  # what --data named (None: data handed in by a caller)
    train_images: int
    test_images: int
    recipe: Recipe  # the model's recipe with the run's flags applied, every field
    keras_backend: str  # "jax" or "tensorflow"
    input_pipeline: str  # "tf.data", or "numpy" (train.arrays) where JAX trains without TensorFlow
    strategy: str
    hardware: str
    replicas: int
    global_batch: int  # recipe.batch_size times replicas, images per step
    peak_learning_rate: float  # recipe.learning_rate scaled from recipe.reference_batch to global_batch
    steps_per_epoch: int
    steps_per_execution: int
    precision: str
    seed: int
    wall_time_s: float
    budget: Budget | None = None  # None unless trained with --time-budget
    # The epoch each restart after an interruption (a kill, a lost host) resumed from, in order; empty: none.
    resumed_from_epochs: list = dataclasses.field(default_factory=list)


@_section
class Metrics:
    test_accuracy: float
    test_loss: float
    test_images: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class Manifest:
    """A finished run (``RUN/manifest.json``)."""

    format: int = FORMAT
    created: str = ""
    model: ModelSpec
    class_names: list
    input: Input
    weights: Weights
    training: Training
    metrics: Metrics
    versions: dict  # library versions at training time
    fingerprint: Fingerprint
    samples: Samples
    holdout: Holdout | None = None  # None unless trained with --holdout

    @property
    def num_classes(self):
        return len(self.class_names)

    def to_dict(self):
        """The JSON form: every field, and ``num_classes`` after ``class_names`` for readers of the file."""
        out = {}
        for key, value in dataclasses.asdict(self).items():
            out[key] = value
            if key == "class_names":
                out["num_classes"] = self.num_classes
        return out

    @classmethod
    def from_dict(cls, raw, source="manifest"):
        """Validate ``raw`` (parsed JSON) and return one of ``cls``; raises :class:`ManifestError`."""
        if not isinstance(raw, dict):
            raise ManifestError(f"{source} is not a JSON object")
        version = raw.get("format")
        if version != FORMAT:
            if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT:
                raise FormatError(f"{source} has manifest format {version}; this version reads format {FORMAT} "
                                  "(upgrade the pipeline)")
            raise FormatError(f"{source} has manifest format {version!r}, not {FORMAT}: it was made by an older "
                              f"version of this pipeline; rebuild it with {REBUILD}")
        fields = {k: v for k, v in raw.items() if k != "num_classes"}
        try:
            manifest = _load(cls, fields, "")
        except _Bad as bad:
            raise ManifestError(f"{source} {bad}") from None
        if "num_classes" in raw and raw["num_classes"] != manifest.num_classes:
            raise ManifestError(f"{source} lists {manifest.num_classes} class names for {raw['num_classes']} classes")
        if not all(isinstance(n, str) and n for n in manifest.class_names) or manifest.num_classes < 2:
            raise ManifestError(f"{source} needs at least two non-empty class names")
        shape, outputs = manifest.fingerprint.shape, manifest.fingerprint.outputs
        if not (len(shape) == 4 and len(outputs) == shape[0]):
            raise ManifestError(f"{source}: the fingerprint's outputs do not match its image shape {shape}")
        return manifest


# --- Reading and writing ----------------------------------------------------------------------


class _Bad(Exception):
    """A field that does not fit its type; the message says which, from the manifest's root."""


_KINDS = {str: "a string", int: "an integer", float: "a number", bool: "true or false", list: "a list", dict: "an object"}


def _load(hint, value, where):
    """``value`` (parsed JSON) as ``hint`` says: a dataclass, ``X | None``, ``dict[str, X]``, a list or a plain type."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (hint,) = [a for a in args if a is not type(None)]
        return _load(hint, value, where)
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise _Bad(f"section {where!r} is not an object" if where else "is not a JSON object")
        fields = dataclasses.fields(hint)
        unknown = sorted(set(value) - {f.name for f in fields})
        if unknown:
            raise _Bad(f"has {'fields' if where else 'sections'} this version does not know"
                       f"{' in ' + repr(where) if where else ''}: {', '.join(unknown)}")
        hints = typing.get_type_hints(hint)
        kwargs = {}
        for f in fields:
            path = f"{where}.{f.name}" if where else f.name
            if f.name in value:
                kwargs[f.name] = _load(hints[f.name], value[f.name], path)
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise _Bad(f"lacks field {path!r}")
        try:
            return hint(**kwargs)
        except ValueError as exc:  # a section that checks its own values (contract.recipe.Recipe)
            raise _Bad(f"section {where!r}: {exc}") from None
    plain = origin or hint
    ok = isinstance(value, plain) and not (isinstance(value, bool) and plain in (int, float))
    if plain is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise _Bad(f"field {where!r} should be {_KINDS.get(plain, plain.__name__)}, not {json.dumps(value)[:40]}")
    if origin is dict:
        return {k: _load(args[1], v, f"{where}.{k}") for k, v in value.items()}
    return value


def read(path, kind=Manifest):
    """The manifest at ``path`` as ``kind``, validated; raises :class:`ManifestError` naming the file and the problem."""
    try:
        with open(path) as f:
            raw = json.load(f)
    except FileNotFoundError:
        raise ManifestError(f"no manifest at {path}") from None
    except (OSError, ValueError) as exc:
        raise ManifestError(f"cannot read {path}: {exc}") from None
    return kind.from_dict(raw, source=path)


def write(path, manifest):
    """Write ``manifest`` (a :class:`Manifest`, published or not) to ``path`` atomically: a kill never leaves half a file."""
    if not isinstance(manifest, Manifest):
        raise TypeError(f"write takes a contract.manifest.Manifest, not {type(manifest).__name__}")
    with replaced_atomically(path, ".json") as tmp, open(tmp, "w") as f:
        json.dump(manifest.to_dict(), f, indent=2)
        f.write("\n")
