"""A model's training recipe: every hyperparameter, with its unit and its valid values, in one frozen dataclass.

Each registered model has one (``train/registry.py``). ``python -m train`` makes one flag of each
field (``--learning-rate`` for ``learning_rate``; its help is the field's ``help`` and ``unit``), a
run's flags replace the model's values with ``dataclasses.replace``, and the manifest records the
run's recipe whole (:class:`contract.manifest.Training`'s ``recipe``). A hyperparameter is added by
adding its field here, written as airbench writes its header: the value, the unit, what it does.

Pure Python (no Keras), like the rest of :mod:`contract`: the manifest types its training section
with :class:`Recipe`, and the training CLI builds its flags before a Keras backend is chosen.
"""

import dataclasses

OPTIMIZERS = ("adam", "sgd", "sgd_pytorch", "muon")
SCHEDULES = ("constant", "onecycle", "triangle", "linear")
LR_SCALINGS = ("sqrt", "linear")


def hyperparameter(default, help, unit=None, choices=None, low=None, high=None, metavar=None):
    """A :class:`Recipe` field: its default, what it does, its unit, and its valid values (``choices``, or ``low``-``high`` inclusive)."""
    return dataclasses.field(default=default, metadata={
        "help": help, "unit": unit, "choices": choices, "low": low, "high": high, "metavar": metavar})


def problem(field, value):
    """Why ``value`` cannot be the recipe's ``field`` (a ``dataclasses.Field`` of :class:`Recipe`), or None."""
    meta = field.metadata
    kind = field.type
    if kind is bool:
        fits = isinstance(value, bool)
    elif kind is int:
        fits = isinstance(value, int) and not isinstance(value, bool)
    elif kind is float:
        fits = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:
        fits = isinstance(value, kind)
    if not fits:
        return f"expected {kind.__name__}, got {value!r}"
    if meta["choices"] is not None and value not in meta["choices"]:
        return f"{value!r} is not one of {', '.join(meta['choices'])}"
    if meta["low"] is not None and value < meta["low"]:
        return f"must be at least {meta['low']}, got {value}"
    if meta["high"] is not None and value > meta["high"]:
        return f"must be at most {meta['high']}, got {value}"
    return None


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A model's training hyperparameters; each one is also the ``python -m train`` flag of the same name."""

    optimizer: str = hyperparameter(
        "adam", "optimizer: adam, sgd (Keras's Nesterov SGD), sgd_pytorch (Nesterov SGD in PyTorch's form) or "
                "muon (airbench94_muon's: Muon on the convolution kernels, sgd_pytorch on the other weights)",
        choices=OPTIMIZERS)
    learning_rate: float = hyperparameter(
        1e-3, "peak learning rate; the run scales it from --reference-batch to its own global batch by "
              "--lr-scaling", unit="per step of --reference-batch images", low=0.0, metavar="RATE")
    reference_batch: int = hyperparameter(
        128, "global batch --learning-rate is quoted for", unit="images per step", low=1, metavar="IMAGES")
    lr_scaling: str = hyperparameter(
        "sqrt", "how the rate follows the global batch: sqrt (Adam) or linear (SGD)", choices=LR_SCALINGS)
    schedule: str = hyperparameter(
        "constant", "learning-rate schedule: constant; onecycle (linear warmup from a tenth of the peak, then "
                    "cosine decay to 0); triangle (0.2x the peak up to it, then down to 0.07x); linear (from the "
                    "peak straight down to 0)", choices=SCHEDULES)
    warmup_fraction: float = hyperparameter(
        0.2, "onecycle and triangle: the rise to the peak rate", unit="fraction of all steps", low=0.0, high=1.0,
        metavar="FRACTION")
    epochs: int = hyperparameter(50, "length of training", unit="passes over the training set", low=1, metavar="N")
    batch_size: int = hyperparameter(
        128, "batch per replica; the global batch is this times the replicas", unit="images per replica per step", low=1,
        metavar="IMAGES")
    augment: bool = hyperparameter(False, "random crop after padding (--crop-padding) and horizontal flip")
    alternate_flips: bool = hyperparameter(
        False, "with --augment: each image mirrored in every other epoch, not at random")
    crop_padding: int = hyperparameter(
        4, "with --augment: reflection padding before the random crop; 0 flips only", unit="pixels", low=0,
        metavar="PIXELS")
    corrupt_fraction: float = hyperparameter(
        0.0, "share of each training batch corrupted, each image on its own draw: half of them with Gaussian noise "
             "(--corrupt-noise), half blurred (--corrupt-blur), after the crop and flip; 0 trains on clean images "
             "only", unit="fraction of the images, 0-1", low=0.0, high=1.0, metavar="FRACTION")
    corrupt_noise: float = hyperparameter(
        0.1, "with --corrupt-fraction: the largest standard deviation of the noise; each noisy image draws its own "
             "uniformly from 0 up to it", unit="fraction of the 0-255 range", low=0.0, high=1.0, metavar="STD")
    corrupt_blur: float = hyperparameter(
        1.0, "with --corrupt-fraction: the largest sigma of the Gaussian blur; each blurred image draws its own "
             "uniformly from 0 up to it", unit="pixels", low=0.0, high=3.0, metavar="SIGMA")
    jpeg_fraction: float = hyperparameter(
        0.0, "share of each training batch re-encoded as JPEG, each image at its own quality, uniform from "
             "--jpeg-quality to 95, after the corruption; 0: none", unit="fraction of the images, 0-1", low=0.0,
        high=1.0, metavar="FRACTION")
    jpeg_quality: int = hyperparameter(
        30, "with --jpeg-fraction: the lowest JPEG quality drawn", unit="JPEG quality, 1-95", low=1, high=95,
        metavar="QUALITY")
    outlier_fraction: float = hyperparameter(
        0.0, "outlier exposure (Hendrycks et al., 2019): share of each training batch replaced by outliers made from "
             "its own images, their 8x8 patches shuffled (no object left), trained towards the uniform answer "
             "(--outlier-weight); needs integer labels (no --label-smoothing); the training accuracy Keras prints "
             "counts them as misses; 0 trains on the classes only",
        unit="fraction of the images, 0-1", low=0.0, high=0.5, metavar="FRACTION")
    outlier_weight: float = hyperparameter(
        0.5, "with --outlier-fraction: the outliers' mean loss (cross-entropy to the uniform answer, 0 at it) "
             "against the classes' mean cross-entropy", unit="ratio (the paper's 0.5)", low=0.0, metavar="WEIGHT")
    label_smoothing: float = hyperparameter(
        0.0, "target mass spread evenly over all classes", unit="fraction, 0-1", low=0.0, high=1.0,
        metavar="FRACTION")
    logit_norm: float = hyperparameter(
        0.0, "LogitNorm (Wei et al., 2022): the loss sees the logits, centred, divided by their norm times this "
             "temperature, so training cannot lower it by growing them; 0 is the plain cross-entropy",
        unit="temperature (the paper's 0.04)", low=0.0, metavar="TEMPERATURE")
    weight_decay: float = hyperparameter(
        0.0, "decoupled weight decay", unit="fraction of each weight per step, times the learning rate", low=0.0,
        metavar="DECAY")
    momentum: float = hyperparameter(
        0.9, "SGD momentum (sgd, sgd_pytorch, and muon's other weights)", unit="fraction of the velocity kept per step, 0-1",
        low=0.0, high=1.0)
    filter_learning_rate: float = hyperparameter(
        0.24, "muon: peak rate of the convolution kernels, following --schedule; not scaled with the batch (the "
              "update is orthogonalised)", unit="per step, on kernels held at norm sqrt(output channels)", low=0.0,
        metavar="RATE")
    filter_momentum: float = hyperparameter(
        0.6, "muon: Nesterov momentum of the convolution kernels", unit="fraction of the velocity kept per step, 0-1",
        low=0.0, high=1.0)

    def __post_init__(self):
        for field in dataclasses.fields(self):
            why = problem(field, getattr(self, field.name))
            if why:
                raise ValueError(f"recipe {field.name}: {why}")

    def augmentation(self):
        """What the training images go through, in one line (the trainer's start line): ``off`` for nothing."""
        parts = []
        if self.augment:
            flip = "alternating flip" if self.alternate_flips else "flip"
            parts.append(f"crop(pad {self.crop_padding})+{flip}" if self.crop_padding else flip)
        if self.corrupt_fraction > 0:
            parts.append(f"corrupt({self.corrupt_fraction:g} of each batch: noise std up to {self.corrupt_noise:g}, "
                         f"blur sigma up to {self.corrupt_blur:g} px)")
        if self.jpeg_fraction > 0:
            parts.append(f"jpeg({self.jpeg_fraction:g} of each batch: quality {self.jpeg_quality}-95)")
        if self.outlier_fraction > 0:
            parts.append(f"outliers({self.outlier_fraction:g} of each batch: patches shuffled, weight "
                         f"{self.outlier_weight:g})")
        return "+".join(parts) or "off"
