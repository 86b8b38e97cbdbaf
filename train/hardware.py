"""What this machine has, and which Keras backend trains on it; imports neither TensorFlow nor JAX.

The backend must be chosen before Keras is first imported (``KERAS_BACKEND``), and JAX kept
from loading libtpu on a machine without a TPU, so everything here runs first. The
backend-specific halves are :mod:`train.tf_devices` (tf.distribute strategies, CPU and GPUs)
and :mod:`train.jax_devices` (``keras.distribution`` over JAX devices, TPUs included); both
return a :class:`Placement`.
"""

import contextlib
import dataclasses
import glob
import importlib.util
import os

PRECISIONS = ("auto", "float32", "mixed_bfloat16", "mixed_float16")
BACKENDS = ("auto", "jax", "tensorflow")
GOOGLE_PCI_VENDOR = "0x1ae0"  # every Cloud TPU chip (v2 to v6e) is a PCI device of Google's
NVIDIA_PCI_VENDOR = "0x10de"
PCI_DEVICES = "/sys/bus/pci/devices"
LOST_PROCESS_EXIT = 3  # the exit status of a process whose run stopped because another process was lost


class AcceleratorError(RuntimeError):
    """The requested accelerator or backend is not usable; the message says why in one line."""


@dataclasses.dataclass
class Placement:
    """Where training runs, whichever backend placed it."""

    backend: str  # "tensorflow" or "jax"
    name: str  # the strategy or distribution: "MirroredStrategy", "DataParallel", ...
    hardware: str  # "tpu", "gpu" or "cpu"
    replicas: int  # devices that each take a slice of the global batch
    chief: bool = True  # whether this process writes the run directory
    worker: str = "chief"  # a stable name for this process, for its own backup directory
    scope: object = contextlib.nullcontext  # a callable returning the context to build and fit in
    host: object = contextlib.nullcontext  # a callable returning the context the handover rebuilds and evaluates in
    strategy: object = None  # the tf.distribute.Strategy (TensorFlow only)
    note: str = ""  # one line worth telling the user, e.g. that no TPU was found


def pci_devices(vendor, pci_root=PCI_DEVICES):
    """How many PCI devices of ``vendor`` (a PCI vendor id such as ``0x1ae0``) this host has."""
    count = 0
    for vendor_file in glob.glob(os.path.join(pci_root, "*", "vendor")):
        try:
            with open(vendor_file) as f:
                if f.read().strip().lower() == vendor:
                    count += 1
        except OSError:
            continue
    return count


def tpu_chips(pci_root=PCI_DEVICES):
    """How many TPU chips this host has: Google-made PCI devices (what libtpu itself looks for).

    A passed-through GPU also shows up under /dev/vfio, so device nodes alone prove nothing.
    """
    return pci_devices(GOOGLE_PCI_VENDOR, pci_root)


def quiet_tensorflow(environ=None, pci_root=PCI_DEVICES):
    """TensorFlow's C++ logs from warnings up, and on a host without an NVIDIA device its CPU devices alone.

    Without ``TF_ENABLED_DEVICE_TYPES=CPU`` TensorFlow calls ``cuInit`` at its first op on every machine and
    logs the failure as an error (``cuda_platform.cc ... failed call to cuInit``) where there is no GPU. Both
    are defaults: a value the user set wins. Set it before TensorFlow is imported.
    """
    env = os.environ if environ is None else environ
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if not pci_devices(NVIDIA_PCI_VENDOR, pci_root):
        env.setdefault("TF_ENABLED_DEVICE_TYPES", "CPU")


def tpu_present(pci_root=PCI_DEVICES, environ=None):
    """Whether a TPU is reachable: chips on this host, or a TPU node named in the environment."""
    env = os.environ if environ is None else environ
    return tpu_chips(pci_root) > 0 or bool(env.get("TPU_NAME") or env.get("COLAB_TPU_ADDR"))


def installed(module):
    return importlib.util.find_spec(module) is not None


def pick_backend(requested="auto", environ=None, tpu=None):
    """The Keras backend to train with.

    ``auto``: ``KERAS_BACKEND`` when the user set it; JAX on a TPU host when JAX is installed
    (TensorFlow has no TPU build for current TPU generations, and Colab's TPU runtimes ship
    only JAX); TensorFlow everywhere else, where it is the measured and tested path.
    """
    env = os.environ if environ is None else environ
    if requested not in BACKENDS:
        raise AcceleratorError(f"unknown backend {requested!r}; choose from {', '.join(BACKENDS)}")
    if requested == "auto":
        chosen = env.get("KERAS_BACKEND")
        if chosen not in ("jax", "tensorflow"):
            on_tpu = tpu_present(environ=env) if tpu is None else tpu
            # Without TensorFlow (a JAX-only image), JAX is the one that can train.
            chosen = "jax" if installed("jax") and (on_tpu or not installed("tensorflow")) else "tensorflow"
    else:
        chosen = requested
    if not installed(chosen):  # JAX trains without TensorFlow too (train.arrays feeds it)
        raise AcceleratorError(f"--keras-backend {chosen} needs the {chosen} package, which is not installed "
                               f"(pip install '.[{'jax' if chosen == 'jax' else 'train'}]')")
    return chosen


def prepare_environment(backend, environ=None, pci_root=PCI_DEVICES):
    """Set what must be set before Keras, TensorFlow or JAX is imported; call it first thing."""
    env = os.environ if environ is None else environ
    env["KERAS_BACKEND"] = backend
    quiet_tensorflow(env, pci_root)
    # TensorFlow turns its oneDNN kernels on by itself only on CPUs with AVX-512; on an AVX2 CPU its
    # own convolution gradients made airbench's step take 13.4 s against 6.6 s with oneDNN
    # (docs/benchmarks.md). TF_ENABLE_ONEDNN_OPTS=0 still turns it off.
    env.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
    on_tpu = tpu_chips(pci_root) > 0
    if backend == "jax" and not on_tpu and "JAX_PLATFORMS" not in env:
        # Without a TPU, keep JAX from loading libtpu (which searches for TPU workers and prints
        # errors before falling back); a GPU plugin, when installed, is still used.
        gpu_plugin = any(installed(f"jax_cuda{v}_plugin") for v in (12, 13))
        env["JAX_PLATFORMS"] = "cuda,cpu" if gpu_plugin else "cpu"


def loaded_backend():
    """The backend of an already imported Keras, or None if Keras is not loaded yet."""
    import sys

    keras = sys.modules.get("keras")
    return keras.backend.backend() if keras is not None and hasattr(keras, "backend") else None


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


def is_chief_task(task_type, task_id, cluster):
    """TF_CONFIG's rule: the "chief" task if the cluster has one, else worker 0."""
    if task_type is None:
        return True
    if "chief" in cluster:
        return task_type == "chief"
    return task_type == "worker" and int(task_id) == 0
