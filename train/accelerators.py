"""Pick the distribution strategy and the precision for whatever hardware is present.

Order: a TPU (asked for by name, ``local`` on TPU VMs and Colab, or found by
``auto``); several GPUs -> MirroredStrategy; ``TF_CONFIG`` -> MultiWorkerMirroredStrategy;
else the default strategy. A TPU that was asked for by name and is not there is an
:class:`AcceleratorError`, never a silent fallback to the CPU.
"""

import glob
import json
import os

import tensorflow as tf

PRECISIONS = ("auto", "float32", "mixed_bfloat16", "mixed_float16")


class AcceleratorError(RuntimeError):
    """The requested accelerator is not usable; the message says why in one line."""


def tpu_present():
    """Whether this machine looks like a TPU host (TPU VM devices or a TPU address in the environment)."""
    return bool(
        glob.glob("/dev/accel*")
        or glob.glob("/dev/vfio/[0-9]*")
        or os.environ.get("TPU_NAME")
        or os.environ.get("COLAB_TPU_ADDR")
    )


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


def kind(strategy):
    """A short name for the hardware behind ``strategy``: "tpu", "gpu" or "cpu"."""
    if isinstance(strategy, tf.distribute.TPUStrategy):
        return "tpu"
    try:
        devices = strategy.extended.worker_devices
    except RuntimeError:  # the default strategy: whatever TensorFlow places ops on
        return "gpu" if tf.config.list_logical_devices("GPU") else "cpu"
    return "gpu" if any("GPU" in d.upper() for d in devices) else "cpu"


def cpu_has_bf16():
    """Whether the CPU has bfloat16 units (AVX512-BF16 or AMX), where mixed bfloat16 pays off."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_precision(precision, hardware):
    """Turn "auto" into a concrete Keras dtype policy name for ``hardware``."""
    if precision not in PRECISIONS:
        raise AcceleratorError(f"unknown precision {precision!r}; choose from {', '.join(PRECISIONS)}")
    if precision != "auto":
        return precision
    if hardware == "tpu":
        return "mixed_bfloat16"
    if hardware == "gpu":
        return "mixed_float16"
    return "mixed_bfloat16" if cpu_has_bf16() else "float32"


def is_chief(strategy):
    """Whether this worker writes the run's files (always true outside multi-worker training)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) or resolver is None:
        return True
    return is_chief_task(resolver.task_type, resolver.task_id, resolver.cluster_spec().as_dict())


def is_chief_task(task_type, task_id, cluster):
    """TF_CONFIG's rule: the "chief" task if the cluster has one, else worker 0."""
    if task_type is None:
        return True
    if "chief" in cluster:
        return task_type == "chief"
    return task_type == "worker" and int(task_id) == 0
