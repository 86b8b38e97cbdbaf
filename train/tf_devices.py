"""TensorFlow backend: the tf.distribute strategy for whatever hardware is present.

Order: a TPU (asked for by name, ``local`` on TPU VMs, or found by ``auto``); ``TF_CONFIG``
-> MultiWorkerMirroredStrategy, refused with a clear error because Keras 3 cannot fit under
it (keras-team/keras#20585); several GPUs -> MirroredStrategy; else the default strategy.
A TPU that was asked for by name and is not there is an :class:`AcceleratorError`, never a
silent fallback to the CPU. On current TPU VMs TensorFlow reaches the chips through the PJRT
plugin, whose environment :func:`train.hardware.prepare_environment` sets before import.
"""

import json
import os

import tensorflow as tf

from train.hardware import AcceleratorError, Placement, is_chief_task, tpu_present


def connect_tpu(tpu):
    """Connect to ``tpu`` ("local", a name or a grpc:// address) and return a TPUStrategy."""
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
        if tpu != "local":
            tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        strategy = tf.distribute.TPUStrategy(resolver)
    except Exception as exc:  # the resolver raises many types; all mean "no usable TPU"
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise AcceleratorError(f"TPU {tpu!r} is not available: {first_line}") from None
    if not tf.config.list_logical_devices("TPU"):
        raise AcceleratorError(f"TPU {tpu!r} is not available: no TPU devices after initialisation")
    return strategy


def select_strategy(tpu="auto"):
    """Return the strategy for this machine; ``tpu`` is "auto", "none", "local", a name or an address."""
    if tpu not in (None, "auto", "none"):
        return connect_tpu(tpu)
    if tpu == "auto" and tpu_present():
        return connect_tpu(os.environ.get("TPU_NAME", "local"))
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
    )


def on_host():
    """The handover's context: one CPU device (a host may have several GPUs; it needs none of them)."""
    return tf.distribute.OneDeviceStrategy("/cpu:0").scope()


def kind(strategy):
    """A short name for the hardware behind ``strategy``: "tpu", "gpu" or "cpu"."""
    if isinstance(strategy, tf.distribute.TPUStrategy):
        return "tpu"
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
