"""A small fit with airbench's optimizer, rate and between-step callbacks, run the same way under either Keras backend.

``python -m recipe_callbacks_fit OUT.npz`` (KERAS_BACKEND set; the repository root and tests/support on
PYTHONPATH) saves the final weights;
tests/train/test_airbench.py compares the backends. Under JAX it trains data parallel over every device.
"""

import sys

import keras
import numpy as np

from train import airbench, schedules

STEPS_PER_EPOCH, EPOCHS, BATCH = 8, 4, 8


def fit(with_callbacks=True):
    """Final weights (by path) of a small net trained 4 epochs; the whitening-like bias holds from epoch 1,
    lookahead averages from epoch 1."""
    if keras.backend.backend() == "jax":
        keras.distribution.set_distribution(keras.distribution.DataParallel())
    rng = np.random.default_rng(0)
    inputs = keras.Input((4,))
    x = keras.layers.Dense(3, name="d")(inputs)
    x = keras.layers.BatchNormalization(name="bn")(x)
    model = keras.Model(inputs, keras.layers.Dense(2, name="out")(x))
    for w in model.weights:
        w.assign(rng.normal(size=w.shape).astype("float32") if "moving_variance" not in w.path else np.ones(w.shape))
    rate = schedules.triangle(0.05, warmup_steps=8, total_steps=STEPS_PER_EPOCH * EPOCHS)
    model.compile(optimizer=schedules.pytorch_sgd(rate, momentum=0.85), loss="mse")
    x_train = rng.normal(size=(STEPS_PER_EPOCH * BATCH, 4)).astype("float32")
    callbacks = [airbench.HoldFrom(lambda m: m.get_layer("d").bias, epoch=1),
                 airbench.Lookahead(STEPS_PER_EPOCH * EPOCHS, start_epoch=1)] if with_callbacks else []
    model.fit(x_train, x_train[:, :2] * 2 + 1, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
              callbacks=callbacks)
    return {w.path: keras.ops.convert_to_numpy(w.value) for w in model.weights}


if __name__ == "__main__":
    np.savez(sys.argv[1], **fit())
