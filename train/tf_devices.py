"""TensorFlow backend: the tf.distribute strategy for the CPU or the GPUs of one machine.

Order: ``TF_CONFIG`` -> MultiWorkerMirroredStrategy, refused with a clear error because Keras 3
cannot fit under it (keras-team/keras#20585); several GPUs -> MirroredStrategy; else the default
strategy. TPUs are trained on by the JAX backend alone: no TensorFlow that pip installs runs on
current TPUs (``tensorflow-tpu`` 2.20, the last, aborts at import with the libtpu it resolves), so a
TPU asked for here is an :class:`AcceleratorError` that names ``--keras-backend jax``, never a silent
fallback to the CPU.
"""

import json
import os

import tensorflow as tf

from train.hardware import AcceleratorError, Placement, is_chief_task, tpu_present

JAX_FOR_TPUS = "no TensorFlow build runs on current TPUs; train on them with --keras-backend jax"


def select_strategy(tpu="auto"):
    """Return the strategy for this machine; ``tpu`` other than "auto" or "none" is an error (see the module)."""
    if tpu not in (None, "auto", "none"):
        raise AcceleratorError(f"TPU {tpu!r} is not available to the TensorFlow backend: {JAX_FOR_TPUS}")
    if os.environ.get("TF_CONFIG"):
        try:
            json.loads(os.environ["TF_CONFIG"])
        except ValueError:
            raise AcceleratorError("TF_CONFIG is set but is not valid JSON") from None
        return tf.distribute.MultiWorkerMirroredStrategy()
    gpus = tf.config.list_logical_devices("GPU")
    if len(gpus) > 1:
        return tf.distribute.MirroredStrategy()
    return tf.distribute.get_strategy()


def placement(tpu="auto", strategy=None):
    """The :class:`Placement` for ``strategy`` (chosen by :func:`select_strategy` when None)."""
    if strategy is None:
        strategy = select_strategy(tpu)
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        # Keras 3's fit() fails in its first step under this strategy (it reduces a PerReplica
        # batch it cannot convert): keras-team/keras#20585, open since TensorFlow 2.16.
        raise AcceleratorError("TF_CONFIG asks for multi-worker training, which Keras 3 cannot run under "
                               "MultiWorkerMirroredStrategy (keras-team/keras#20585); unset TF_CONFIG to train "
                               "on this host")
    task_type, task_id = _task(strategy)
    note = f"a TPU is present, but TensorFlow trains on the {kind(strategy).upper()}: {JAX_FOR_TPUS}" \
        if tpu == "auto" and tpu_present() else ""
    return Placement(
        backend="tensorflow",
        name=type(strategy).__name__,
        hardware=kind(strategy),
        replicas=strategy.num_replicas_in_sync,
        chief=is_chief(strategy),
        worker="chief" if task_type is None else f"{task_type}-{task_id}",
        scope=strategy.scope,
        host=on_host,
        strategy=strategy,
        note=note,
    )


def on_host():
    """The handover's context: one CPU device (a host may have several GPUs; it needs none of them)."""
    return tf.distribute.OneDeviceStrategy("/cpu:0").scope()


def kind(strategy):
    """A short name for the hardware behind ``strategy``: "gpu" or "cpu"."""
    try:
        devices = strategy.extended.worker_devices
    except RuntimeError:  # the default strategy: whatever TensorFlow places ops on
        return "gpu" if tf.config.list_logical_devices("GPU") else "cpu"
    return "gpu" if any("GPU" in d.upper() for d in devices) else "cpu"


def _task(strategy):
    resolver = getattr(strategy, "cluster_resolver", None)
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) or resolver is None:
        return None, None
    return resolver.task_type, resolver.task_id


def is_chief(strategy):
    """Whether this worker writes the run's files (always true outside multi-worker training)."""
    task_type, task_id = _task(strategy)
    if task_type is None:
        return True
    return is_chief_task(task_type, task_id, strategy.cluster_resolver.cluster_spec().as_dict())
