"""The layers and initializer of :mod:`train.airbench`'s network, each registered for Keras serialization.

* :class:`Shift`: a BatchNorm's learned shift (or the whitening bias), stored divided by a gain.
* :class:`PartialIdentity`: convolutions that start by passing their input through.
* :class:`GELU`: the exact GELU, XLA-fused while training under TensorFlow.
* :class:`Views`: test-time augmentation inside the model, the logits averaged over :func:`six_views`.
"""

import functools

import keras
import numpy as np
from keras import layers

from train.models import INPUT_SHAPE

BIAS_GAIN = 8.0  # BN shifts are stored divided by 8, so SGD moves them 8**2 = 64x faster
# airbench's coupled weight decay (0.0153 per 1024 images at a rate of 11.5 per 1024, under its
# summed loss) on the mean loss: an L2 penalty whose gradient is 0.0153 / 11.5 = 1.33e-3 x the
# weight. Every learned weight has it, the BN shifts and the whitening bias included (stored
# divided by their gain, they decay at the same rate).
L2 = 0.0153 / 11.5 / 2


def pytorch_default(seed=None):
    """PyTorch's default for convolutions and linear layers: uniform within 1 / sqrt(fan_in)."""
    return keras.initializers.VarianceScaling(scale=1 / 3, mode="fan_in", distribution="uniform", seed=seed)


@keras.saving.register_keras_serializable(package="cifar")
class Shift(layers.Layer):
    """A learned per-channel bias with weight decay, stored divided by ``gain`` so that SGD moves it ``gain**2`` faster."""

    def __init__(self, gain=BIAS_GAIN, **kwargs):
        super().__init__(**kwargs)
        self.gain = gain

    def build(self, input_shape):
        self.bias = self.add_weight(name="bias", shape=(input_shape[-1],), initializer="zeros",
                                    regularizer=keras.regularizers.L2(L2))

    def call(self, x):
        return x + keras.ops.cast(self.bias * self.gain, x.dtype)

    def get_config(self):
        return {**super().get_config(), "gain": self.gain}


@keras.saving.register_keras_serializable(package="cifar")
class PartialIdentity(keras.initializers.Initializer):
    """PyTorch's default initialisation, except that the first ``in_channels`` filters pass their input through."""

    def __init__(self, seed=None):
        self.seed = seed

    def __call__(self, shape, dtype=None):
        height, width, channels_in, channels_out = shape
        kept = min(channels_in, channels_out)
        identity = np.zeros(shape, dtype="float32")
        identity[height // 2, width // 2, np.arange(kept), np.arange(kept)] = 1
        random = pytorch_default(self.seed)(shape, dtype)
        mask = np.zeros(shape, dtype="float32")
        mask[..., :kept] = 1
        return keras.ops.cast(random * (1 - mask) + identity, dtype or "float32")

    def get_config(self):
        return {"seed": self.seed}


@keras.saving.register_keras_serializable(package="cifar")
class GELU(layers.Layer):
    """The exact GELU, x Phi(x), as airbench's ``nn.GELU()``.

    Under TensorFlow, while training, it runs as one XLA-compiled loop each way, computed in
    float32 (:func:`_tensorflow_gelu`): TensorFlow's own GELU and its gradient take separate
    unfused kernels, scalar in bfloat16, about 6x the time, which made the activations cost as
    much as the convolutions (docs/benchmarks.md). Inference, and every other backend, takes
    ``keras.activations.gelu``: the exported graph holds no XLA call.
    """

    def call(self, x, training=False):
        if training and keras.backend.backend() == "tensorflow":
            return _tensorflow_gelu()(x)
        return keras.activations.gelu(x, approximate=False)


@functools.cache
def _tensorflow_gelu():
    """GELU with its gradient, each one XLA-compiled TensorFlow function computing in float32."""
    import tensorflow as tf

    @tf.function(jit_compile=True)
    def forward(x):
        f = tf.cast(x, tf.float32)
        return tf.cast(0.5 * f * tf.math.erfc(-f * SQRT_HALF), x.dtype)

    @tf.function(jit_compile=True)
    def backward(x, upstream):
        f = tf.cast(x, tf.float32)
        slope = 0.5 * tf.math.erfc(-f * SQRT_HALF) + f * INV_SQRT_2PI * tf.exp(-0.5 * f * f)  # Phi(x) + x phi(x)
        return tf.cast(tf.cast(upstream, tf.float32) * slope, x.dtype)

    @tf.custom_gradient
    def gelu(x):
        return forward(x), lambda upstream: backward(x, upstream)

    return gelu


SQRT_HALF = 0.7071067811865476
INV_SQRT_2PI = 0.3989422804014327


#: The weight of each of :func:`six_views`' views in the averaged logits.
VIEW_WEIGHTS = (0.25, 0.125, 0.125) * 2


def six_views(images):
    """The six views :class:`Views` averages, stacked on the batch axis (view-major): the image as is,
    shifted one pixel up-left and down-right (reflect padding), then each of the three flipped."""
    padded = keras.ops.pad(images, [[0, 0], [1, 1], [1, 1], [0, 0]], mode="reflect")
    size = INPUT_SHAPE[0]
    views = [images, padded[:, :size, :size], padded[:, 2:, 2:]]
    views += [keras.ops.flip(view, axis=2) for view in views]
    return keras.ops.concatenate(views)


@keras.saving.register_keras_serializable(package="cifar")
class Views(layers.Layer):
    """The network's logits: of the image when training; averaged over six views at inference."""

    def __init__(self, network, **kwargs):
        super().__init__(**kwargs)
        self.network = network

    def call(self, images, training=False):
        if training:
            return keras.ops.cast(self.network(images, training=True), "float32")
        logits = keras.ops.cast(self.network(six_views(images), training=False), "float32")
        logits = keras.ops.reshape(logits, (len(VIEW_WEIGHTS), -1, logits.shape[-1]))
        weights = keras.ops.convert_to_tensor(VIEW_WEIGHTS, "float32")
        return keras.ops.einsum("v,vbc->bc", weights, logits)

    def get_config(self):
        return {**super().get_config(), "network": keras.saving.serialize_keras_object(self.network)}

    @classmethod
    def from_config(cls, config):
        return cls(network=keras.saving.deserialize_keras_object(config.pop("network")), **config)
