"""Optimizers and learning-rate schedules for a recipe (contract.recipe.Recipe).

Typical usage::

    optimizer = schedules.optimizer(recipe, learning_rate=0.1, schedule="onecycle", total_steps=4000)

Keras is imported inside the functions: the training CLI imports this module's callers before it
has chosen the Keras backend.
"""

import functools
import math

from contract.recipe import OPTIMIZERS, SCHEDULES


def scaled_rate(recipe, global_batch):
    """The recipe's peak rate, scaled from its reference batch to ``global_batch``."""
    ratio = global_batch / recipe.reference_batch
    return recipe.learning_rate * (ratio if recipe.lr_scaling == "linear" else ratio ** 0.5)


#: The name of the optimizer's variable that holds the schedule's length in steps (:func:`length`).
LENGTH = "schedule_steps"


def optimizer(recipe, learning_rate, schedule, total_steps):
    """The recipe's optimizer with ``schedule`` peaking at ``learning_rate`` over ``total_steps``.

    The length is a variable of the optimizer (:func:`length`), read by the schedule at every step: a run
    with a time budget (train.budget) sets it once it has timed its first steps, so that the schedule ends
    where the run ends. Being the optimizer's, it is in the state every backend's compiled step reads,
    and in the run's backup.
    """
    import keras

    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose from {', '.join(SCHEDULES)}")
    scheduled = None if schedule == "constant" else _scheduled_class()(schedule, learning_rate, recipe.warmup_fraction)
    rate = learning_rate if scheduled is None else scheduled
    weight_decay = recipe.weight_decay or None
    if recipe.optimizer == "sgd":
        built = keras.optimizers.SGD(rate, momentum=recipe.momentum, nesterov=True, weight_decay=weight_decay)
    elif recipe.optimizer == "sgd_pytorch":
        built = pytorch_sgd(rate, momentum=recipe.momentum, weight_decay=weight_decay)
    elif recipe.optimizer == "muon":
        filter_ratio = recipe.filter_learning_rate / learning_rate if learning_rate else 0.0
        built = muon(rate, filter_ratio, momentum=recipe.momentum, filter_momentum=recipe.filter_momentum,
                     weight_decay=weight_decay)
    elif recipe.optimizer == "adam":
        built = keras.optimizers.Adam(rate, weight_decay=weight_decay)
    else:
        raise ValueError(f"unknown optimizer {recipe.optimizer!r}; choose from {', '.join(OPTIMIZERS)}")
    steps = built.add_variable((), initializer=keras.initializers.Constant(float(total_steps)), dtype="float32",
                               name=LENGTH)
    if scheduled is not None:
        scheduled.steps = steps
    return built


def length(optimizer):
    """The variable of :func:`optimizer`'s result that holds its schedule's length in steps (assign to change it)."""
    for variable in optimizer.variables:
        if variable.name == LENGTH:
            return variable
    raise ValueError(f"optimizer {optimizer.name!r} has no {LENGTH} variable: it was not made by schedules.optimizer")


@functools.cache
def _scheduled_class():
    import keras

    class Scheduled(keras.optimizers.schedules.LearningRateSchedule):
        """A recipe's schedule over a length read at every step from ``steps`` (the variable :func:`optimizer` sets).

        onecycle is Keras's ``CosineDecay`` from a tenth of the peak with a linear warmup, triangle is
        :func:`triangle`, linear is Keras's ``PolynomialDecay`` to 0; each warms up over
        ``max(1, floor(steps * warmup_fraction))`` steps, as they were built with a fixed length.
        """

        def __init__(self, schedule, peak, warmup_fraction, steps=None):
            super().__init__()
            self.schedule, self.peak, self.warmup_fraction, self.steps = schedule, peak, warmup_fraction, steps

        def __call__(self, step):
            ops = keras.ops
            step = ops.cast(step, "float32")
            total = ops.maximum(ops.cast(self.steps, "float32"), 1.0)
            warmup = ops.maximum(ops.floor(total * self.warmup_fraction), 1.0)
            if self.schedule == "linear":
                return self.peak * (1.0 - ops.minimum(step, total) / total)
            if self.schedule == "triangle":
                return triangle_rate(step, self.peak, warmup, total)
            # onecycle: linear from a tenth of the peak to it, then a half cosine down to 0.
            decay = ops.maximum(total - warmup, 1.0)
            step = ops.minimum(step, decay + warmup)
            rising = self.peak / 10 + (self.peak - self.peak / 10) * step / warmup
            falling = self.peak * 0.5 * (1.0 + ops.cos(math.pi * (step - warmup) / decay))
            return ops.where(step < warmup, rising, falling)

        def get_config(self):
            return {"schedule": self.schedule, "peak": self.peak, "warmup_fraction": self.warmup_fraction}

    return Scheduled


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


def triangle_rate(step, peak, warmup_steps, total_steps, start=0.2, end=0.07):
    """:func:`triangle`'s rate at ``step`` (every argument a number or a tensor)."""
    import keras

    ops = keras.ops
    step = ops.cast(step, "float32")
    rising = start + (1 - start) * step / warmup_steps
    falling = 1 + (end - 1) * (step - warmup_steps) / ops.maximum(ops.cast(total_steps - warmup_steps, "float32"), 1.0)
    return peak * ops.where(step < warmup_steps, rising, ops.maximum(falling, end))


def triangle(peak, warmup_steps, total_steps, start=0.2, end=0.07):
    """Linear from ``start`` x peak up to the peak at ``warmup_steps``, then linear down to ``end`` x peak.

    The schedule of the fast CIFAR-10 records (airbench: start 0.2, end 0.07).
    """
    import keras

    class Triangle(keras.optimizers.schedules.LearningRateSchedule):
        def __call__(self, step):
            return triangle_rate(step, peak, warmup_steps, total_steps, start, end)

        def get_config(self):
            return {"peak": peak, "warmup_steps": warmup_steps, "total_steps": total_steps, "start": start, "end": end}

    return Triangle()
