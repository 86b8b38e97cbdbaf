"""A fit whose schedule's length is changed by a callback after its third step, run the same way under either backend.

``python tests/support/schedule_length_fit.py`` (with KERAS_BACKEND set) prints the final weight as JSON.
One weight, a loss whose gradient is 1 and SGD without momentum: the weight moves by minus the sum of
the rates the compiled step used, so it shows whether the step read the new length.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import keras  # noqa: E402
import numpy as np  # noqa: E402

from contract.recipe import Recipe  # noqa: E402
from train import schedules  # noqa: E402

PEAK, FIRST_LENGTH, SECOND_LENGTH, CHANGED_AFTER, STEPS = 0.5, 40, 10, 3, 10


class SetLength(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch + 1 == CHANGED_AFTER:
            schedules.length(self.model.optimizer).assign(float(SECOND_LENGTH))


def fit():
    """The weight after STEPS steps: the length is FIRST_LENGTH for CHANGED_AFTER steps, SECOND_LENGTH after."""
    inputs = keras.Input((1,))
    model = keras.Model(inputs, keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros", name="w")(inputs))
    recipe = Recipe(optimizer="sgd", momentum=0.0, schedule="linear")
    model.compile(optimizer=schedules.optimizer(recipe, PEAK, "linear", FIRST_LENGTH),
                  loss=lambda y_true, y_pred: keras.ops.mean(y_pred))
    x = np.ones((STEPS, 1), "float32")
    model.fit(x, x, batch_size=1, epochs=1, shuffle=False, verbose=0, callbacks=[SetLength()])
    return float(keras.ops.convert_to_numpy(model.get_layer("w").kernel)[0, 0])


if __name__ == "__main__":
    print(json.dumps({"backend": keras.backend.backend(), "weight": fit()}))
