"""``airbench``: Keller Jordan's airbench94 network and recipe (2024), in Keras, for every backend.

The network: fixed per-channel normalisation; a frozen 2x2 convolution that whitens patches,
initialised from the training images before training (:func:`whiten_from`; the weights file
carries it, so export needs no data); GELU; three conv groups of widths 64/256/256, each
conv-pool-BN-GELU-conv-BN-GELU with identity-initialised convolutions and BatchNorm without a
learned scale; a 3x3 max pool and a bias-free linear layer scaled by 1/9.

The recipe: Nesterov SGD at batch 1024 with a triangular rate, label smoothing 0.2, 2-pixel
translations, flips that alternate (each image is mirrored in every other epoch), BatchNorm
shifts that move 64x faster than the other weights (stored divided by 8), a whitening bias
learned for the first three epochs only (:class:`HoldFrom`), and lookahead weight averaging
from the fourth epoch (:class:`Lookahead`). Weights start at PyTorch's default scale,
as airbench's did: with BatchNorm after every convolution, a weight's scale sets its effective
learning rate.

Test-time augmentation is part of the model: at inference it averages the logits of the image,
its mirror and two one-pixel shifts of both (six views, airbench's level 2), so the SavedModel,
the LiteRT models and TF Serving all give the accuracy training measured, at six times the
arithmetic of one view. Training sees one view.

The GELU is the exact one; under TensorFlow its training kernels are XLA-fused, which made the
training step of ``airbench_muon`` 0.70x as long in mixed bfloat16 (AMX). The layers
(:class:`~train.airbench_layers.Shift`, :class:`~train.airbench_layers.Views`,
:class:`~train.airbench_layers.GELU`) are in :mod:`train.airbench_layers`.
"""

import dataclasses

import keras
import numpy as np
from keras import layers

from train.airbench_layers import BIAS_GAIN, GELU, L2, PartialIdentity, Shift, Views, pytorch_default
from train.models import CIFAR10_MEAN, CIFAR10_STD, INPUT_SHAPE
from train.registry import Recipe, register

WIDTHS = (64, 256, 256)  # channels of the three conv groups
WHITEN_PATCH = 2  # pixels: 2x2x3 patches, 12 directions, each kept with its negative
WHITEN_EPS = 5e-4  # added to the eigenvalues before the inverse square root
WHITEN_IMAGES = 5000  # training images the patch statistics come from
BATCHNORM_MOMENTUM = 0.6  # of the old statistic kept per step (airbench's BatchNorm passes PyTorch 1 - 0.6)
BATCHNORM_EPSILON = 1e-12
LOGIT_SCALE = 1 / 9
WHITEN_BIAS_EPOCHS = 3  # the whitening bias learns for this many epochs, then holds
LOOKAHEAD_START_EPOCH = 3  # 0-based: averaging begins in the fourth epoch
LOOKAHEAD_EVERY = 5  # steps between averaging updates
LOOKAHEAD_DECAY = 0.95  # per step: 0.95**5 per update at the end of training
LOOKAHEAD_POWER = 3.0  # the decay grows as (step / total steps) ** 3

AIRBENCH_RECIPE = Recipe(
    optimizer="sgd_pytorch",  # Nesterov momentum as PyTorch applies it, which airbench was tuned with
    learning_rate=1.5,  # airbench's 11.5 per kilostep, for a mean rather than a summed loss
    reference_batch=1024,
    lr_scaling="linear",
    schedule="triangle",  # 0.2x the peak rising to the peak at 23% of the steps, then down to 0.07x
    warmup_fraction=0.23,
    epochs=10,  # airbench: 9.9
    batch_size=1024,  # images per replica per step
    augment=True,
    crop_padding=2,  # reflection padding: random translations of up to 2 pixels, and flips
    label_smoothing=0.2,
    weight_decay=0.0,  # the L2 penalty lives in the layers (L2 above)
    momentum=0.85,
    alternate_flips=True,
)

# The fast member of the family trained by airbench's own recipe at narrower widths and
# fewer epochs (chosen on a validation split of the training images: docs/benchmarks.md).
FAST_WIDTHS = (64, 128, 128)
AIRBENCH_FAST_RECIPE = dataclasses.replace(AIRBENCH_RECIPE, epochs=7)

# airbench94_muon's recipe at FAST_WIDTHS: Muon on the kernels (0.24, momentum 0.6), the rest by
# sgd_pytorch at batch 2000 with a rate falling straight to 0, no lookahead. Its SGD rates (0.053 for
# the biases and 0.67 for the head, on a loss summed over 2000 images, the head divided by 256 and
# initialised at unit scale) are both 1.66 on this port's mean loss, BN shifts stored divided by 8
# and head scaled by 1/9: 0.053 x 2000 / 8**2 and 0.67 x 2000 x 81 / 256**2. Unlike airbench94_muon,
# no label smoothing: over 3 seeds the held-out accuracy is the same and the served energy tells
# flat, gradient, text and texture images apart far better (digits worse): docs/benchmarks.md.
# Batch 1000 (the SGD rates scaled linearly, 0.83; Muon's is per step), chosen on the held-out slice
# over batch 2000 (Keller Jordan's notes: batch ~1000 beats 2000). 10% of each batch corrupted by noise
# and blur (train/corruption.py) for 12 epochs rather than clean for 10: over 3 seeds each, the 75
# corrupted sets' mean is up about 10 points at the same held-out and test accuracy, for a fifth more
# steps and photos told apart slightly less well (docs/benchmarks.md, "Training with corrupted images");
# a time budget (--time-budget, scripts/main.sh) trains fewer epochs where 12 do not fit.
AIRBENCH_MUON_RECIPE = dataclasses.replace(
    AIRBENCH_RECIPE, optimizer="muon", learning_rate=1.66, reference_batch=2000, schedule="linear",
    warmup_fraction=0.0, epochs=12, batch_size=1000, filter_learning_rate=0.24, filter_momentum=0.6,
    label_smoothing=0.0, corrupt_fraction=0.1)


def whiten_from(model, x_train, images=WHITEN_IMAGES):
    """Set the frozen whitening kernel from the uncentred covariance of 2x2 training patches.

    Each eigenvector, scaled by the inverse square root of its eigenvalue (plus WHITEN_EPS),
    becomes a filter, and so does its negative: the filters' outputs on training patches
    are decorrelated with unit variance.
    """
    x = (x_train[:images].astype(np.float64) - np.asarray(CIFAR10_MEAN)) / np.asarray(CIFAR10_STD)
    patches = np.lib.stride_tricks.sliding_window_view(x, (WHITEN_PATCH, WHITEN_PATCH), axis=(1, 2))
    patches = patches.transpose(0, 1, 2, 4, 5, 3).reshape(-1, WHITEN_PATCH * WHITEN_PATCH * x.shape[-1])
    eigenvalues, eigenvectors = np.linalg.eigh(patches.T @ patches / len(patches))
    filters = eigenvectors[:, ::-1] / np.sqrt(eigenvalues[::-1] + WHITEN_EPS)  # one filter per column
    kernel = np.concatenate([filters, -filters], axis=1).reshape(WHITEN_PATCH, WHITEN_PATCH, x.shape[-1], -1)
    whiten_layer(model).kernel.assign(kernel.astype(np.float32))


def whiten_layer(model):
    return model.get_layer("views").network.get_layer("whiten")


def whiten_bias(model):
    return model.get_layer("views").network.get_layer("whiten_bias").bias


class HoldFrom(keras.callbacks.Callback):
    """Hold ``get_variable(model)`` at its value from epoch ``epoch`` (0-based) on: a learned weight that stops learning.

    Restoring the value after every step freezes it without recompiling the model (Keras fixes
    the trainable weights at compile time), and a resumed run holds the value its backup saved.
    Values are assigned as copies: Keras's JAX trainer donates a variable's buffer to the next step,
    which would free an array kept here (``Callback.model`` syncs that trainer's state first).
    """

    def __init__(self, get_variable, epoch):
        super().__init__()
        self.get_variable, self.epoch = get_variable, epoch
        self.held = None

    def on_epoch_begin(self, epoch, logs=None):
        self.held = keras.ops.copy(self.get_variable(self.model).value) if epoch >= self.epoch else None

    def on_train_batch_end(self, batch, logs=None):
        if self.held is not None:
            self.get_variable(self.model).assign(keras.ops.copy(self.held))


class Lookahead(keras.callbacks.Callback):
    """airbench's lookahead: every ``every`` steps from epoch ``start_epoch``, average the weights and continue from the average.

    The average (of every float weight, BatchNorm statistics included) moves toward the weights
    by ``1 - decay`` with ``decay = base**every * (step / total_steps)**power``: hardly at all
    early, strongly at the end. The weights are then set to the average, and once more at the
    end of each epoch, so every epoch (and the saved model) ends on the average, and a run
    resumed from an epoch's backup continues exactly. Assigned as copies, as in :class:`HoldFrom`.
    ``total_steps``: a number, or a function that returns it (a time budget sets the run's length after
    its first steps, train.budget).
    With several steps per compiled call (``--steps-per-execution``, 32 on a TPU) it can act only
    between calls: once in each call that passes a multiple of ``every``.
    """

    def __init__(self, total_steps, start_epoch=LOOKAHEAD_START_EPOCH, every=LOOKAHEAD_EVERY,
                 base=LOOKAHEAD_DECAY, power=LOOKAHEAD_POWER):
        super().__init__()
        self.total_steps, self.start_epoch, self.every, self.base, self.power = (
            total_steps, start_epoch, every, base, power)
        self.average = None

    def _weights(self):
        return [w for w in self.model.weights if "float" in str(w.dtype)]

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        self.steps_done = epoch * self.params["steps"]
        # The previous epoch ended on the average, so the weights are the average.
        self.average = [keras.ops.copy(w.value) for w in self._weights()] if epoch > self.start_epoch else None

    def on_train_batch_end(self, batch, logs=None):
        steps = self.params["steps"]
        step = self.epoch * steps + batch + 1  # steps taken so far
        # Every `every` steps; with several steps per call (steps_per_execution), once a call that passes one.
        due = step // self.every > self.steps_done // self.every
        self.steps_done = step
        last = batch == steps - 1
        if self.epoch < self.start_epoch or not (due or last):
            return  # the model is not touched (under JAX, touching it syncs the training state)
        weights = self._weights()
        if self.average is None:
            if due:  # the first average is the weights themselves
                self.average = [keras.ops.copy(w.value) for w in weights]
            return
        if due:
            total = self.total_steps() if callable(self.total_steps) else self.total_steps
            decay = self.base ** self.every * (step / total) ** self.power
            self.average = [a + (1 - decay) * (w.value - a) for a, w in zip(self.average, weights)]
        for a, w in zip(self.average, weights):
            w.assign(keras.ops.copy(a))


def training_callbacks(total_steps):
    """What airbench's recipe does between steps: the whitening bias's three epochs, and lookahead."""
    return [HoldFrom(whiten_bias, WHITEN_BIAS_EPOCHS), Lookahead(total_steps)]


def muon_callbacks(total_steps):
    """airbench94_muon's between steps: the whitening bias's three epochs; no lookahead."""
    return [HoldFrom(whiten_bias, WHITEN_BIAS_EPOCHS)]


def _conv(filters, name, l2=L2):
    return layers.Conv2D(filters, 3, padding="same", use_bias=False, kernel_initializer=PartialIdentity(),
                         kernel_regularizer=keras.regularizers.L2(l2) if l2 else None, name=name)


def _norm_gelu(x, name):
    x = layers.BatchNormalization(momentum=BATCHNORM_MOMENTUM, epsilon=BATCHNORM_EPSILON, center=False, scale=False,
                                  name=f"{name}_bn")(x)
    x = Shift(name=f"{name}_shift")(x)
    return GELU(name=f"{name}_gelu")(x)


def _network(num_classes, widths=WIDTHS, whiten_gain=1.0, kernel_l2=L2):
    inputs = keras.Input(shape=INPUT_SHAPE, name="pixels")
    x = layers.Normalization(mean=CIFAR10_MEAN, variance=[s * s for s in CIFAR10_STD], name="normalize")(inputs)
    x = layers.Conv2D(2 * WHITEN_PATCH * WHITEN_PATCH * INPUT_SHAPE[-1], WHITEN_PATCH, use_bias=False,
                      trainable=False, name="whiten")(x)
    x = Shift(gain=whiten_gain, name="whiten_bias")(x)
    x = GELU(name="whiten_gelu")(x)
    for group, width in enumerate(widths, start=1):
        x = _conv(width, f"group{group}_conv1", kernel_l2)(x)
        x = layers.MaxPooling2D(2, name=f"group{group}_pool")(x)
        x = _norm_gelu(x, f"group{group}_1")
        x = _conv(width, f"group{group}_conv2", kernel_l2)(x)
        x = _norm_gelu(x, f"group{group}_2")
    x = layers.MaxPooling2D(3, name="final_pool")(x)
    x = layers.Flatten(name="flatten")(x)
    x = layers.Dense(num_classes, use_bias=False, kernel_initializer=pytorch_default(),
                     kernel_regularizer=keras.regularizers.L2(L2), name="logits")(x)
    outputs = layers.Rescaling(LOGIT_SCALE, name="logit_scale")(x)
    return keras.Model(inputs, outputs, name="airbench_network")


@register("airbench", AIRBENCH_RECIPE, prepare=whiten_from, callbacks=training_callbacks)
def airbench(num_classes, widths=WIDTHS, name="airbench", whiten_gain=1.0, kernel_l2=L2):
    """airbench94's network (about 2 M parameters) with its test-time views inside the model.

    ``widths``: the channels of the three conv groups; every registered member of the family
    (``airbench``, ``airbench_fast``, ``airbench_muon``) is this one builder at its own widths.
    ``whiten_gain``: the whitening bias's ``Shift`` gain (airbench94 trains it at the rate of the
    kernels, 1; airbench94_muon at the BN shifts', BIAS_GAIN). ``kernel_l2``: the convolution kernels' L2
    penalty (0: none, as under Muon, which holds each kernel's norm; a penalty there would put the
    kernel itself into the orthogonalised step, where the norm's reset undoes it).
    """
    inputs = keras.Input(shape=INPUT_SHAPE, name="images")
    logits = Views(_network(num_classes, tuple(widths), whiten_gain, kernel_l2), name="views")(inputs)
    outputs = layers.Softmax(dtype="float32", name="probabilities")(logits)
    return keras.Model(inputs, outputs, name=name)


@register("airbench_fast", AIRBENCH_FAST_RECIPE, prepare=whiten_from, callbacks=training_callbacks)
def airbench_fast(num_classes):
    """airbench's network at FAST_WIDTHS, trained for AIRBENCH_FAST_RECIPE's epochs."""
    return airbench(num_classes, widths=FAST_WIDTHS, name="airbench_fast")


@register("airbench_muon", AIRBENCH_MUON_RECIPE, prepare=whiten_from, callbacks=muon_callbacks)
def airbench_muon(num_classes):
    """airbench's network at FAST_WIDTHS, trained by AIRBENCH_MUON_RECIPE (Muon on the kernels): the main job's default."""
    return airbench(num_classes, widths=FAST_WIDTHS, name="airbench_muon", whiten_gain=BIAS_GAIN, kernel_l2=0.0)


# airbench_muon's recipe at airbench's widths (airbench94_muon's own) for 7 epochs rather than 12: over 3 seeds
# on AVX-512 BF16 it tells photos from CIFAR images at 0.953 (the default 0.949) and digits at 0.969 (0.951),
# at the default's held-out accuracy, for about a fifth more training time on that kind and 2.2x the arithmetic an
# image when served (docs/benchmarks.md, "Trials against the recipe").
AIRBENCH_MUON_WIDE_RECIPE = dataclasses.replace(AIRBENCH_MUON_RECIPE, epochs=7)


@register("airbench_muon_wide", AIRBENCH_MUON_WIDE_RECIPE, prepare=whiten_from, callbacks=muon_callbacks)
def airbench_muon_wide(num_classes):
    """airbench's network at its own WIDTHS, trained by AIRBENCH_MUON_WIDE_RECIPE: the choice where the verdict matters."""
    return airbench(num_classes, widths=WIDTHS, name="airbench_muon_wide", whiten_gain=BIAS_GAIN, kernel_l2=0.0)
