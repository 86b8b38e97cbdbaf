"""Optimizers and learning-rate schedules for a recipe (contract.recipe.Recipe).

Typical usage::

    optimizer = schedules.optimizer(recipe, learning_rate=0.1, schedule="onecycle", total_steps=4000)

Keras is imported inside the functions: the training CLI imports this module's callers before it
has chosen the Keras backend.
"""

from contract.recipe import OPTIMIZERS, SCHEDULES


def scaled_rate(recipe, global_batch):
    """The recipe's peak rate, scaled from its reference batch to ``global_batch``."""
    ratio = global_batch / recipe.reference_batch
    return recipe.learning_rate * (ratio if recipe.lr_scaling == "linear" else ratio ** 0.5)


def optimizer(recipe, learning_rate, schedule, total_steps):
    """The recipe's optimizer with ``schedule`` peaking at ``learning_rate`` over ``total_steps``."""
    import keras

    warmup = max(1, int(total_steps * recipe.warmup_fraction))
    if schedule == "onecycle":
        rate = keras.optimizers.schedules.CosineDecay(
            initial_learning_rate=learning_rate / 10,
            decay_steps=max(1, total_steps - warmup),
            alpha=0.0,
            warmup_target=learning_rate,
            warmup_steps=warmup,
        )
    elif schedule == "triangle":
        rate = triangle(learning_rate, warmup, total_steps)
    elif schedule == "linear":
        rate = keras.optimizers.schedules.PolynomialDecay(learning_rate, max(1, total_steps), end_learning_rate=0.0)
    elif schedule == "constant":
        rate = learning_rate
    else:
        raise ValueError(f"unknown schedule {schedule!r}; choose from {', '.join(SCHEDULES)}")
    weight_decay = recipe.weight_decay or None
    if recipe.optimizer == "sgd":
        return keras.optimizers.SGD(rate, momentum=recipe.momentum, nesterov=True, weight_decay=weight_decay)
    if recipe.optimizer == "sgd_pytorch":
        return pytorch_sgd(rate, momentum=recipe.momentum, weight_decay=weight_decay)
    if recipe.optimizer == "muon":
        filter_ratio = recipe.filter_learning_rate / learning_rate if learning_rate else 0.0
        return muon(rate, filter_ratio, momentum=recipe.momentum, filter_momentum=recipe.filter_momentum,
                    weight_decay=weight_decay)
    if recipe.optimizer == "adam":
        return keras.optimizers.Adam(rate, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer {recipe.optimizer!r}; choose from {', '.join(OPTIMIZERS)}")


def pytorch_sgd(learning_rate, momentum, weight_decay=None):
    """Nesterov SGD in PyTorch's form: the velocity sums raw gradients, and the current rate scales the whole step.

    ``velocity = momentum * velocity + gradient``, then ``weight -= rate * (gradient + momentum * velocity)``.
    Keras's SGD keeps ``rate * gradient`` in its velocity instead, which takes the same steps at a
    constant rate but not under a schedule: while the rate rises its steps are smaller than
    PyTorch's, and while it falls they are larger (at the end of airbench's triangle, about
    20% larger). Recipes tuned in PyTorch, such as airbench's, need this form.
    """
    return _pytorch_sgd_class()(learning_rate, momentum=momentum, nesterov=True, weight_decay=weight_decay)


def _pytorch_sgd_class():
    import keras
    from keras import ops

    class PyTorchSGD(keras.optimizers.SGD):
        def nesterov_step(self, gradient, variable, momentum):
            """Move ``variable``'s velocity by ``gradient``, PyTorch's way, and return the Nesterov step before the rate."""
            momentum = ops.cast(momentum, variable.dtype)
            velocity = self.momentums[self._get_variable_index(variable)]
            self.assign(velocity, ops.add(ops.multiply(velocity, momentum), gradient))
            return ops.add(gradient, ops.multiply(velocity, momentum))

        def update_step(self, gradient, variable, learning_rate):
            learning_rate = ops.cast(learning_rate, variable.dtype)
            gradient = ops.cast(gradient, variable.dtype)
            self.assign_sub(variable, ops.multiply(learning_rate, self.nesterov_step(gradient, variable, self.momentum)))

    return PyTorchSGD


def muon(learning_rate, filter_ratio, momentum, filter_momentum, weight_decay=None, steps=3):
    """airbench94_muon's optimizer: Muon on the convolution kernels, :func:`pytorch_sgd` on every other weight.

    A kernel (a 4-D trainable weight) takes a Nesterov step (``filter_momentum``) whose direction is
    orthogonalised by ``steps`` Newton-Schulz iterations (the kernel read as a matrix of input taps
    by output channels), after the kernel is rescaled to a norm of sqrt(output channels); its rate is
    ``filter_ratio`` x the scheduled rate. With BatchNorm after each convolution a kernel's scale
    does not change the network, so holding it fixed leaves the step size to the rate alone.
    """
    from keras import ops

    class Muon(_pytorch_sgd_class()):
        def update_step(self, gradient, variable, learning_rate):
            if len(variable.shape) != 4:
                return super().update_step(gradient, variable, learning_rate)
            learning_rate = ops.cast(learning_rate, variable.dtype)
            step = self.nesterov_step(ops.cast(gradient, variable.dtype), variable, filter_momentum)
            outputs = variable.shape[-1]
            weight = ops.multiply(variable, outputs ** 0.5 / ops.sqrt(ops.sum(ops.square(variable))))
            direction = ops.reshape(orthogonalise(ops.reshape(step, (-1, outputs)), steps), variable.shape)
            self.assign(variable, ops.subtract(weight, ops.multiply(learning_rate * filter_ratio, direction)))

    return Muon(learning_rate, momentum=momentum, nesterov=True, weight_decay=weight_decay)


def orthogonalise(matrix, steps=3, eps=1e-7):
    """Muon's quintic Newton-Schulz iteration: ``matrix`` with its singular values pushed toward 1 (roughly 0.5-1.5).

    The coefficients (3.4445, -4.7750, 2.0315) maximise the slope at zero, so three steps suffice
    for an update direction; the singular vectors are ``matrix``'s.
    """
    from keras import ops

    a, b, c = 3.4445, -4.7750, 2.0315
    x = ops.divide(matrix, ops.sqrt(ops.sum(ops.square(matrix))) + eps)  # every singular value at most 1
    tall = matrix.shape[0] > matrix.shape[1]
    if tall:
        x = ops.transpose(x)
    for _ in range(steps):
        gram = ops.matmul(x, ops.transpose(x))
        x = ops.add(a * x, ops.matmul(ops.add(b * gram, c * ops.matmul(gram, gram)), x))
    return ops.transpose(x) if tall else x


def triangle(peak, warmup_steps, total_steps, start=0.2, end=0.07):
    """Linear from ``start`` x peak up to the peak at ``warmup_steps``, then linear down to ``end`` x peak.

    The schedule of the fast CIFAR-10 records (airbench: start 0.2, end 0.07).
    """
    import keras

    class Triangle(keras.optimizers.schedules.LearningRateSchedule):
        def __call__(self, step):
            step = keras.ops.cast(step, "float32")
            rising = start + (1 - start) * step / warmup_steps
            falling = 1 + (end - 1) * (step - warmup_steps) / max(1, total_steps - warmup_steps)
            return peak * keras.ops.where(step < warmup_steps, rising, keras.ops.maximum(falling, end))

        def get_config(self):
            return {"peak": peak, "warmup_steps": warmup_steps, "total_steps": total_steps, "start": start, "end": end}

    return Triangle()
