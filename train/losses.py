"""The training loss a recipe names: cross-entropy, with label smoothing, LogitNorm's, or outlier exposure's.

Every registered model ends in a float32 softmax (``train.models.logits_model``), so a loss sees
probabilities. LogitNorm (Wei et al., "Mitigating Neural Network Overconfidence with Logit
Normalization", ICML 2022) needs the logits: it takes the cross-entropy of ``f / (tau * |f|)``, so
that training cannot lower the loss by growing the logits' norm, which then stays a measure of how
familiar an image is (the served energy score reads it). The logits are recovered from the
probabilities as ``log p`` centred on its mean over the classes, which equals the logits centred on
theirs: softmax cannot see the part common to all classes, so this is the paper's normalisation of
the part that decides the answer (the paper's own ``f`` keeps it; the airbench heads have no bias).
"""

import math

import keras

#: Probabilities are clipped here before the log: the recovered logits are exact while no class's
#: logit is more than ln(1e30) = 69 under the largest, far past any margin training reaches.
SMALLEST_PROBABILITY = 1e-30
_EPSILON = 1e-7  # the paper's, added to the norm


def centred_logits(probabilities):
    """The logits, less their mean over the classes, from the softmax's ``probabilities`` (float32)."""
    log_p = keras.ops.log(keras.ops.maximum(keras.ops.cast(probabilities, "float32"), SMALLEST_PROBABILITY))
    return log_p - keras.ops.mean(log_p, axis=-1, keepdims=True)


@keras.saving.register_keras_serializable(package="cifar")
class LogitNorm(keras.losses.Loss):
    """Cross-entropy of the centred logits divided by ``temperature`` times their norm; labels as class ids,
    or one-hot (and then smoothed by ``label_smoothing``)."""

    def __init__(self, temperature=0.04, label_smoothing=0.0, name="logit_norm", **kwargs):
        super().__init__(name=name, **kwargs)
        if not temperature > 0:
            raise ValueError(f"LogitNorm's temperature must be above 0, got {temperature}")
        self.temperature = temperature
        self.label_smoothing = label_smoothing

    def call(self, y_true, y_pred):
        logits = centred_logits(y_pred)
        norm = keras.ops.sqrt(keras.ops.sum(keras.ops.square(logits), axis=-1, keepdims=True)) + _EPSILON
        scaled = logits / (norm * self.temperature)
        if self.label_smoothing > 0:
            return keras.losses.categorical_crossentropy(y_true, scaled, from_logits=True,
                                                         label_smoothing=self.label_smoothing)
        return keras.losses.sparse_categorical_crossentropy(y_true, scaled, from_logits=True)

    def get_config(self):
        return {**super().get_config(), "temperature": self.temperature, "label_smoothing": self.label_smoothing}


@keras.saving.register_keras_serializable(package="cifar")
class OutlierExposure(keras.losses.Loss):
    """Cross-entropy for images of a class; for an outlier (label :data:`~train.corruption.OUTLIER`), ``weight``
    times its cross-entropy to the uniform answer, less its least value ``log(classes)``.

    Outlier exposure (Hendrycks, Mazeika and Dietterich, "Deep Anomaly Detection with Outlier Exposure", ICLR
    2019): the outliers' mean loss counts ``weight`` against the classes' mean loss when a ``fraction`` of
    each batch is outliers, so each outlier's loss is scaled by ``weight * (1 - fraction) / fraction``.
    """

    def __init__(self, fraction, weight=0.5, name="outlier_exposure", **kwargs):
        super().__init__(name=name, **kwargs)
        if not 0 < fraction < 1:
            raise ValueError(f"outlier exposure needs a fraction between 0 and 1, got {fraction}")
        self.fraction = fraction
        self.weight = weight

    def call(self, y_true, y_pred):
        ops = keras.ops
        labels = ops.reshape(ops.cast(y_true, "int32"), (-1,))
        log_p = ops.log(ops.maximum(ops.cast(y_pred, "float32"), SMALLEST_PROBABILITY))
        classes = log_p.shape[-1]
        known = ops.take_along_axis(log_p, ops.expand_dims(ops.maximum(labels, 0), -1), axis=-1)[:, 0]
        uniform = -ops.mean(log_p, axis=-1) - math.log(classes)
        scale = self.weight * (1 - self.fraction) / self.fraction
        return ops.where(labels >= 0, -known, scale * uniform)

    def get_config(self):
        return {**super().get_config(), "fraction": self.fraction, "weight": self.weight}


def one_hot(recipe):
    """Whether ``recipe``'s loss takes one-hot labels (label smoothing needs them) rather than class ids."""
    return recipe.label_smoothing > 0


def for_recipe(recipe):
    """The Keras loss ``recipe`` trains with."""
    if recipe.outlier_fraction > 0:
        if recipe.label_smoothing > 0 or recipe.logit_norm > 0:
            raise ValueError("outlier exposure (--outlier-fraction) trains with the plain cross-entropy on integer "
                             "labels: set --label-smoothing 0 and --logit-norm 0")
        return OutlierExposure(recipe.outlier_fraction, recipe.outlier_weight)
    if recipe.logit_norm > 0:
        return LogitNorm(recipe.logit_norm, label_smoothing=recipe.label_smoothing)
    if one_hot(recipe):
        return keras.losses.CategoricalCrossentropy(label_smoothing=recipe.label_smoothing)
    return keras.losses.SparseCategoricalCrossentropy()
