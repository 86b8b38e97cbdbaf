"""JAX backend: data parallelism over every device through ``keras.distribution``.

One process sees its local devices (TPU chips, GPUs, or the CPU); several processes (a TPU
pod slice, several hosts) join through ``keras.distribution.initialize()``, which reads
``KERAS_DISTRIBUTION_JOB_ADDRESSES``, ``KERAS_DISTRIBUTION_NUM_PROCESSES`` and
``KERAS_DISTRIBUTION_PROCESS_ID`` (or finds a Cloud TPU pod by itself). With more than one
device the model's variables are replicated and every global batch is split across the
devices (``DataParallel``); process 0 writes the run directory.
"""

import contextlib
import os

import jax
import keras

from train.hardware import AcceleratorError, Placement, installed

MULTI_PROCESS_VARIABLES = ("KERAS_DISTRIBUTION_JOB_ADDRESSES", "KERAS_DISTRIBUTION_NUM_PROCESSES")


def placement(tpu="auto"):
    """The :class:`Placement` over every device JAX can see; ``tpu`` as for the TensorFlow backend."""
    if any(os.environ.get(name) for name in MULTI_PROCESS_VARIABLES):
        keras.distribution.initialize()
    devices = jax.devices()
    platform = devices[0].platform  # "tpu", "gpu" or "cpu"
    if tpu not in ("auto", "none") and platform != "tpu":
        raise AcceleratorError(f"TPU {tpu!r} is not available: JAX found only {platform} devices")
    note = ""
    if tpu == "auto" and platform != "tpu" and installed("libtpu"):
        note = f"no TPU found; training on {len(devices)} {platform.upper()} device(s)"
    if len(devices) > 1:
        distribution = keras.distribution.DataParallel(devices=devices)
        # Global, not only a scope: fit() lays out every batch by the distribution in force.
        keras.distribution.set_distribution(distribution)
        name, scope = "DataParallel", distribution.scope
    else:
        name, scope = "SingleDevice", contextlib.nullcontext
    process = jax.process_index()
    return Placement(
        backend="jax",
        name=name,
        hardware="gpu" if platform in ("gpu", "cuda", "rocm") else platform,
        replicas=len(devices),
        chief=process == 0,
        worker="chief" if process == 0 else f"process-{process}",
        scope=scope,
        host=on_host,
        note=note,
    )


@contextlib.contextmanager
def on_host():
    """The handover's context: no distribution, and new arrays on the host's CPU.

    The fingerprint must be what export computes on a CPU in float32; a GPU computes float32
    convolutions in TF32 by default, about 1e-4 away (seen on an H200), beyond export's 1e-5.
    """
    previous = keras.distribution.distribution()
    keras.distribution.set_distribution(None)
    try:
        with jax.default_device(jax.devices("cpu")[0]):
            yield
    finally:
        keras.distribution.set_distribution(previous)


class Profile(keras.callbacks.Callback):
    """A JAX profiler trace of training steps ``first`` to ``last`` (1-based), for TensorBoard's profile tab."""

    def __init__(self, log_dir, first, last):
        super().__init__()
        self.log_dir, self.first, self.last = log_dir, first, last
        self._step = 0
        self._tracing = False

    def on_train_batch_begin(self, batch, logs=None):
        self._step += 1
        if self._step == self.first:
            jax.profiler.start_trace(self.log_dir)
            self._tracing = True

    def on_train_batch_end(self, batch, logs=None):
        if self._tracing and self._step >= self.last:
            self._stop()

    def on_train_end(self, logs=None):
        if self._tracing:
            self._stop()

    def _stop(self):
        jax.effects_barrier()
        jax.profiler.stop_trace()
        self._tracing = False
