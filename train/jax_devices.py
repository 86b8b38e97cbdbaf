"""JAX backend: data parallelism over every device through ``keras.distribution``.

One process sees its local devices (TPU chips, GPUs, or the CPU); several processes (a TPU
pod slice, several hosts) join through ``keras.distribution.initialize()``, which reads
``KERAS_DISTRIBUTION_JOB_ADDRESSES``, ``KERAS_DISTRIBUTION_NUM_PROCESSES`` and
``KERAS_DISTRIBUTION_PROCESS_ID`` (or finds a Cloud TPU pod by itself). With more than one
device the model's variables are replicated and every global batch is split across the
devices (``DataParallel``).

With several processes, each feeds only its own part of every global batch (:func:`shard`;
the input pipelines cut it, and Keras's own re-batching of the dataset is switched off: its
re-batched dataset has no known length, so Keras kept one iterator across epochs and every
second epoch found it empty, which under JAX left the model's variables purged). Process 0
alone writes the run and its backup, which every process resumes from (:class:`ChiefBackup`).
CPU collectives between processes go through gloo, at the address this host is reached at
(:func:`join`): ``CIFAR_HOST_ADDRESS`` where the launcher passes one (a pod's IP), else the local
address of the route to the coordinator, never what the host's name happens to resolve to.
"""

import contextlib
import ipaddress
import os
import re
import socket
import time

import jax
import keras
import numpy as np

from train import backup
from train.hardware import LOST_PROCESS_EXIT, AcceleratorError, Placement, installed

MULTI_PROCESS_VARIABLES = ("KERAS_DISTRIBUTION_JOB_ADDRESSES", "KERAS_DISTRIBUTION_NUM_PROCESSES")
ADDRESS_VARIABLE = "CIFAR_HOST_ADDRESS"  # this host's address for the collectives (a pod's status.podIP)
JOIN_TIMEOUT_VARIABLE = "CIFAR_JOIN_TIMEOUT_S"  # how long to wait for the coordinator (default 300 s, JAX's)
ADDRESSES = []  # the collectives' address of every process, by process index (join)


def placement(tpu="auto"):
    """The :class:`Placement` over every device JAX can see.

    ``tpu``: "auto" (a TPU when JAX finds one), "none", or a TPU asked for ("local", a name), which
    is an :class:`AcceleratorError` unless JAX's devices are TPUs.
    """
    if any(os.environ.get(name) for name in MULTI_PROCESS_VARIABLES):
        if not jax.config.jax_cpu_collectives_implementation:
            # Collectives between processes' CPU devices (Keras's seed agreement, and CPU training):
            # gloo over TCP, the default of the JAX this is tested with (0.10); set where a JAX has none.
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        if os.environ.get("KERAS_DISTRIBUTION_JOB_ADDRESSES"):
            join()
        else:  # no addresses: JAX finds the cluster itself (a Cloud TPU pod)
            keras.distribution.initialize()
    devices = jax.devices()
    platform = devices[0].platform  # "tpu", "gpu" or "cpu"
    if tpu not in ("auto", "none") and platform != "tpu":
        raise AcceleratorError(f"TPU {tpu!r} is not available: JAX found only {platform} devices")
    note = ""
    if tpu == "auto" and platform != "tpu" and installed("libtpu"):
        note = f"no TPU found; training on {len(devices)} {platform.upper()} device(s)"
    if len(devices) > 1:
        # The input pipelines give each process its own part of every global batch (shard()).
        distribution = keras.distribution.DataParallel(devices=devices, auto_shard_dataset=False)
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


def join():
    """``keras.distribution.initialize()`` from the same variables, with gloo at this host's address.

    Refused in one line (:class:`AcceleratorError`): an address that is loopback while another
    process is on another host, and a coordinator not reached within ``CIFAR_JOIN_TIMEOUT_S``
    (JAX itself would abort the process with a stack trace).
    """
    from jax._src import distributed
    from keras.src.backend.jax import distribution_lib

    addresses = [a.strip() for a in os.environ["KERAS_DISTRIBUTION_JOB_ADDRESSES"].split(",") if a.strip()]
    count = int(os.environ.get("KERAS_DISTRIBUTION_NUM_PROCESSES") or len(addresses))
    process = int(os.environ.get("KERAS_DISTRIBUTION_PROCESS_ID", "0"))
    if len(addresses) > 1 and len(addresses) != count:
        raise AcceleratorError(f"KERAS_DISTRIBUTION_JOB_ADDRESSES names {len(addresses)} processes, "
                               f"KERAS_DISTRIBUTION_NUM_PROCESSES {count}")
    timeout = int(os.environ.get(JOIN_TIMEOUT_VARIABLE) or 300)
    coordinator = addresses[0]
    host, port = _split(coordinator)
    deadline = time.monotonic() + timeout
    unreached = AcceleratorError(
        f"process {process} could not reach the coordinator (process 0) at {coordinator} within {timeout} s "
        f"({JOIN_TIMEOUT_VARIABLE}); is process 0 running, and is that address reachable from this host?")
    target = _reach(host, port, deadline, probe=False)
    if target is None:
        raise unreached
    address = os.environ.get(ADDRESS_VARIABLE) or _route_address(target)
    source = ADDRESS_VARIABLE if os.environ.get(ADDRESS_VARIABLE) else "the route to the coordinator"
    if _loopback(address):
        remote = [a for a in addresses if _loopback(_split(a)[0]) is False]
        if remote:
            raise AcceleratorError(
                f"process {process}'s collectives would listen on loopback {address} (from {source}) while "
                f"process {addresses.index(remote[0])} is at {remote[0]}; set {ADDRESS_VARIABLE} to this "
                "host's address the others reach (in Kubernetes, the pod IP: status.podIP)")
    if process != 0 and _reach(host, port, deadline, probe=True) is None:
        raise unreached
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=count, process_id=process,
                               initialization_timeout=timeout)
    _gloo_at(address)
    # Every process's address, so that a lost one can be named by the address a failed collective gives.
    client = distributed.global_state.client
    client.key_value_set(f"cifar/address/{process}", address)
    ADDRESSES[:] = [client.blocking_key_value_get(f"cifar/address/{i}", timeout * 1000) for i in range(count)]
    distribution_lib.initialize_rng()  # what keras.distribution.initialize() does after joining


def stop_after(exc):
    """End this process at once after ``exc`` stopped a multi-process run: one line, no JAX shutdown.

    When a process is lost, the others' next collective fails at once (gloo: "Connection closed by
    peer [ADDRESS]:PORT"). JAX's shutdown would then wait in a barrier for the lost process until its
    heartbeat times out (100 s by default) and abort with a native stack trace; instead the line names
    the lost process and the exit status is :data:`LOST_PROCESS_EXIT`. Any other failure keeps its
    traceback and exits 1, as the others will once they find this process gone.
    """
    import sys
    import traceback

    me = f"process {jax.process_index()} of {jax.process_count()}"
    peer = lost_peer(str(exc))
    if peer:
        named = [i for i, address in enumerate(ADDRESSES) if address == peer and i != jax.process_index()]
        who = " or ".join(f"process {i}" for i in named) or "the process"
        print(f"error: {me}: {who} at {peer} was lost mid-run (a collective failed: connection closed "
              "by peer); start every process again to resume from the last finished epoch", file=sys.stderr, flush=True)
        status = LOST_PROCESS_EXIT
    else:
        traceback.print_exception(exc)
        print(f"error: {me} failed; the other processes stop when they find it gone", file=sys.stderr, flush=True)
        status = 1
    sys.stdout.flush()
    os._exit(status)


#: gloo's words for a peer gone, either way round: "Connection closed by peer [ADDRESS]:PORT" (a write)
#: or "Read error [ADDRESS]:PORT: Connection reset by peer" (a read).
LOST_PEER = (re.compile(r"(?:closed|reset) by peer \[?([0-9A-Fa-f.:]+?)\]?:\d+"),
             re.compile(r"\[([0-9A-Fa-f.:]+)\]:\d+: Connection (?:closed|reset) by peer"))


def lost_peer(message):
    """The address of the peer a failed collective's ``message`` says is gone, or None."""
    found = next((m for m in (pattern.search(message) for pattern in LOST_PEER) if m), None)
    return found and found.group(1)


def _split(address):
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _loopback(host):
    """True or False for what ``host`` resolves to; None when it does not resolve (yet)."""
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return None
    return all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def _reach(host, port, deadline, probe):
    """The coordinator's socket address, once it resolves (and, with ``probe``, accepts a connection)."""
    while True:
        try:
            family, kind, protocol, _, target = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
            if not probe:
                return target
            with socket.socket(family, kind, protocol) as s:
                s.settimeout(max(0.1, min(5.0, deadline - time.monotonic())))
                s.connect(target)
                return target
        except OSError:
            if time.monotonic() >= deadline:
                return None
            time.sleep(1)


def _route_address(target):
    """The local address the kernel would send from to reach ``target`` (a UDP connect sends nothing)."""
    family = socket.AF_INET6 if ":" in target[0] else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect(target)
        return s.getsockname()[0]


def _gloo_at(address):
    """Make JAX's CPU client build gloo's collectives on ``address``; its default is the host name's address.

    JAX 0.10 offers no setting for it, so the CPU backend's factory is replaced by one that passes
    ``hostname`` to jaxlib's ``make_gloo_tcp_collectives`` (before any backend exists).
    """
    from jax._src import distributed, xla_bridge
    from jax._src.lib import _jax

    if jax.config.jax_cpu_collectives_implementation != "gloo":
        return

    def cpu_client():
        collectives = _jax.make_gloo_tcp_collectives(distributed_client=distributed.global_state.client,
                                                     hostname=address)
        return xla_bridge.make_cpu_client(collectives=collectives)

    xla_bridge.register_backend_factory("cpu", cpu_client, priority=0, fail_quietly=False)


def shard():
    """``(index, count)``: this process's part of each global batch, and how many parts there are."""
    return jax.process_index(), jax.process_count()


class ChiefBackup(backup.Backup):
    """The backup of several processes: process 0 writes it, every process reads it.

    The backup is under the run directory, which every process must see (a shared volume), so
    all resume from the same epoch with the same weights; a process that cannot see what process 0
    sees is an error on every process, never a silent start from scratch on some. Process 0 saves
    outside the distribution: Keras makes a variable while saving, which under the distribution
    would be laid out over every process's devices, a collective the others are not in.
    """

    def on_train_begin(self, logs=None):
        from jax.experimental import multihost_utils

        present = np.int32(os.path.exists(self._weights_path))
        seen = multihost_utils.process_allgather(present)
        if len(set(np.ravel(seen).tolist())) > 1:
            raise AcceleratorError(
                f"the processes disagree on whether {self._weights_path} exists (process by process: "
                f"{np.ravel(seen).tolist()}); every process must mount the run directory to resume")
        super().on_train_begin(logs)  # every process loads the same file: equal values, as device_put checks

    def _save_model(self):
        with without_distribution():
            super()._save_model()


@contextlib.contextmanager
def without_distribution():
    previous = keras.distribution.distribution()
    keras.distribution.set_distribution(None)
    try:
        yield
    finally:
        keras.distribution.set_distribution(previous)


@contextlib.contextmanager
def on_host():
    """The handover's context: no distribution, and new arrays on the host's CPU.

    The fingerprint must be what export computes on a CPU in float32; a GPU computes float32
    convolutions in TF32 by default, about 1e-4 away (seen on an H200), beyond export's 1e-5.
    """
    with without_distribution(), jax.default_device(jax.local_devices(backend="cpu")[0]):
        yield


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
