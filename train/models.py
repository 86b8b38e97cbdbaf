"""Model builders, looked up by name so that export rebuilds exactly what was trained.

Every builder takes ``num_classes`` (plus its own keyword arguments, recorded in
the manifest) and returns an uncompiled ``keras.Model`` that takes raw 0-255 RGB
pixels ``[batch, 32, 32, 3]`` and returns float32 class probabilities. Every
layer is named, so weight files and error messages speak in stable names.

The registry that names them (``Recipe``, ``register``, ``build_model``...) is
:mod:`train.registry`; its functions are importable from here too, as every stage has
always called them.

Typical usage::

    model = build_model("seed_cnn", num_classes=10)
"""

import hashlib

import keras
import numpy as np
from keras import layers

from contract import CHANNELS, IMAGE_SIZE
from train.registry import (  # noqa: F401  (the registry's functions, as callers import them from here)
    Recipe,
    build_model,
    model_names,
    prepare,
    recipe,
    register,
    training_callbacks,
)

INPUT_SHAPE = (IMAGE_SIZE, IMAGE_SIZE, CHANNELS)
# CIFAR-10 per-channel pixel statistics (0-255 scale); fixed, so a model normalises its own raw input.
CIFAR10_MEAN = (125.3, 123.0, 113.9)
CIFAR10_STD = (63.0, 62.1, 66.7)


def fingerprint_images(seed, count=8):
    """The seeded uint8 images whose outputs fingerprint a trained model (PCG64: stable across NumPy versions)."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(count, *INPUT_SHAPE), dtype=np.uint8)


def fingerprint_digest(images):
    """The SHA-256 the manifest records for the fingerprint images, so export can tell the same inputs came back."""
    return hashlib.sha256(np.ascontiguousarray(images, dtype=np.uint8).tobytes()).hexdigest()


def logits_model(model):
    """``model`` up to its logits, float32: what ``softmax`` turns into its probabilities.

    Every registered model ends in a float32 layer named ``probabilities``: a ``Softmax`` (its
    input is the logits) or a ``Dense`` with a softmax activation (the logits are the same Dense
    without it, sharing its weights' values). Export computes the calibrated probabilities and
    the out-of-distribution score from these (contract.confidence).
    """
    head = model.get_layer("probabilities")
    if isinstance(head, layers.Softmax):
        logits = head.input
    elif isinstance(head, layers.Dense) and head.activation is keras.activations.softmax:
        linear = layers.Dense(head.units, use_bias=head.use_bias, dtype="float32", name="logits")
        logits = linear(head.input)
        linear.set_weights(head.get_weights())
    else:
        raise ValueError(f"{model.name} ends in {type(head).__name__} 'probabilities', not a softmax")
    return keras.Model(model.input, keras.ops.cast(logits, "float32"), name=f"{model.name}_logits")


def _classifier_head(x, num_classes):
    # The softmax stays float32 under mixed precision: probabilities near 0 and 1
    # lose too much in bfloat16, and the loss wants them exact.
    return layers.Dense(num_classes, activation="softmax", dtype="float32", name="probabilities")(x)


# The tutorial's network with a recipe for a 2-core CPU instead of 50 constant-rate TPU epochs.
# Random crops with padding underfit in this few epochs (80.00% at 15 epochs, docs/benchmarks.md);
# flips alone, a one-cycle rate and a little label smoothing over 20 epochs clear the tutorial's
# 80.79% (82.0% and 82.2% on an H200; docs/benchmarks.md), where 14 epochs stopped at 80.5-80.7%.
SEED_CNN_RECIPE = Recipe(
    optimizer="adam",
    learning_rate=2e-3,  # peak rate per step at reference_batch (square-root scaling)
    reference_batch=128,  # images per step the peak rate is quoted for
    lr_scaling="sqrt",
    schedule="onecycle",  # linear warmup from a tenth of the peak over warmup_fraction, then cosine to 0
    warmup_fraction=0.2,  # of all steps
    epochs=20,  # passes over the 50,000 training images (14 gave 80.5-80.7%)
    batch_size=128,  # images per replica per step, as the tutorial (128 per TPU core)
    augment=True,
    crop_padding=0,  # 0: horizontal flips only, no crops
    label_smoothing=0.1,  # of the target mass, spread evenly over the classes
)


@register("seed_cnn", SEED_CNN_RECIPE)
def seed_cnn(num_classes):
    """The 2018 tutorial's CNN, layer for layer (80.79% on CIFAR-10 in 50 TPU epochs)."""
    inputs = keras.Input(shape=INPUT_SHAPE, name="images")
    x = layers.BatchNormalization(name="input_bn")(inputs)
    x = layers.Conv2D(32, 3, padding="same", activation="relu", name="conv1a")(x)
    x = layers.Conv2D(32, 3, padding="same", activation="relu", name="conv1b")(x)
    x = layers.MaxPooling2D(2, name="pool1")(x)
    x = layers.Dropout(0.25, name="drop1")(x)
    x = layers.BatchNormalization(name="bn2")(x)
    x = layers.Conv2D(64, 3, padding="same", activation="relu", name="conv2a")(x)
    x = layers.Conv2D(64, 3, padding="valid", activation="relu", name="conv2b")(x)
    x = layers.MaxPooling2D(2, name="pool2")(x)
    x = layers.Dropout(0.25, name="drop2")(x)
    x = layers.Flatten(name="flatten")(x)
    x = layers.Dense(512, activation="relu", name="fc")(x)
    x = layers.Dropout(0.5, name="drop3")(x)
    outputs = _classifier_head(x, num_classes)
    return keras.Model(inputs, outputs, name="seed_cnn")

