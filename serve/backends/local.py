"""The exported model in this process: one of :mod:`serve.backends.runtimes` (LiteRT float32 or int8, or the
SavedModel in TensorFlow), concurrent requests micro-batched, new versions picked up as they appear."""

import dataclasses
import logging
import os
import threading
import time

from contract import OUTPUT_PROBABILITIES
from contract.manifest import ManifestError
from serve import published
from serve.backends import runtimes
from serve.backends.batcher import Batcher, Overloaded
from serve.core.errors import NotServed, ServeError, Shed
from serve.core.model import ModelInfo, Prediction, readiness_images

RELOAD_INTERVAL_S = 5.0  # how often a backend that failed to load tries again
RETIRE_AFTER_S = 30.0  # how long a replaced version keeps answering requests already sent to it
RETRY_FIRST_S, RETRY_MAX_S = 5.0, 300.0  # a version that failed to load is tried again after 5 s, 10 s, ... 300 s


class LocalBackend:
    """The highest version under ``model_dir`` in one of :mod:`serve.backends.runtimes`, batched by a :class:`serve.backends.batcher.Batcher`.

    ``on_load(runtime, version)`` is called each time a version starts answering, and
    ``on_skip(runtime, version, reason)`` each time a version newer than the one served is passed
    over (no model file for this runtime, export refused it, or it failed to load); the skipped
    versions and why are in :attr:`skipped_versions` for ``/readyz`` and ``/api/v1/model``.
    """

    kind = "local"

    def __init__(self, model_dir, name, runtime, *, max_batch, batch_wait_ms, poll_s, threads=None, on_batch=None,
                 on_load=None, on_skip=None, max_queue=None, timeout_s=None, on_waiting=None):
        self.model_dir = str(model_dir)
        self.name = name
        self.runtime = runtimes.check(runtime)
        self._threads = threads or None  # None: runtimes.default_threads()
        self._on_load = on_load
        self._on_skip = on_skip
        #: Versions newer than the served one that were passed over: ``{version: reason}``.
        self.skipped_versions = {}
        self._retry_at = {}  # version -> (monotonic time it may be tried again, failed loads so far)
        # Like TF Serving's file-system poll: a new version N+1/ replaces the served one.
        self._poll_s = float(poll_s)
        self._polled_at = time.monotonic()
        self._swapping = threading.Lock()
        self._max_batch = max_batch
        self._wait_s = batch_wait_ms / 1000.0
        self._on_batch = on_batch
        self._max_queue, self._timeout_s, self._on_waiting = max_queue, timeout_s, on_waiting
        self._lock = threading.Lock()
        self._state = None  # a _Loaded once loaded
        self._error = None
        self._tried_at = None
        # Load in the background: the worker answers /healthz and /readyz (503) meanwhile
        # instead of leaving connections hanging while the model loads.
        self._loader = threading.Thread(target=self._load_quietly, name="model-loader", daemon=True)
        self._loader.start()

    def wait_loaded(self, timeout=None):
        """Block until the first load attempt has finished (for tests and tools)."""
        self._loader.join(timeout)

    def _load_quietly(self):
        try:
            self._load()
        except ServeError:
            pass  # kept in self._error; readyz reports it

    # -- loading -----------------------------------------------------------------------
    def _load(self, wait=True):
        if self._state is not None:
            self._poll_versions()
            return self._state
        if not self._lock.acquire(blocking=wait):
            raise ServeError(f"the model in {self.model_dir} is still loading", 503)
        try:
            if self._state is not None:
                return self._state
            if self._tried_at is not None and time.monotonic() - self._tried_at < RELOAD_INTERVAL_S:
                raise ServeError(self._error, 503)
            self._tried_at = time.monotonic()
            try:
                self._state = self._load_unlocked()
                self._error = None
                self._loaded(self._state)
                return self._state
            except ServeError as e:
                self._error = str(e)
            except Exception as e:  # a broken SavedModel must not take the worker down
                self._error = f"cannot load the model from {self.model_dir}: {type(e).__name__}: {e}"
            raise ServeError(self._error, 503)
        finally:
            self._lock.release()

    def _poll_versions(self):
        """Start loading a newer version in the background when one has appeared (at most every poll_s)."""
        now = time.monotonic()
        if self._poll_s <= 0 or now - self._polled_at < self._poll_s:
            return
        self._polled_at = now
        available = runtimes.versions(self.model_dir, self.runtime)
        self._note_skipped(self._state.version, available)
        newest = available[-1] if available else None
        if newest is None or newest <= self._state.version or not self._due(newest, now):
            return
        if self._state.info.architecture is not None and not os.path.exists(
                published.manifest_path(os.path.join(self.model_dir, str(newest)))):
            # Exported versions carry their manifest; one copied in by hand may show its model before
            # its manifest. Wait for it rather than serve the version without confidence data for good.
            logging.getLogger(__name__).info("version %s has no manifest yet; waiting for it", newest)
            return
        if self._swapping.acquire(blocking=False):
            threading.Thread(target=self._swap, args=(newest,), name="model-swap", daemon=True).start()

    def _due(self, version, now):
        """Whether ``version`` may be loaded now: never failed, or its back-off has passed."""
        retry_at, _ = self._retry_at.get(version, (0.0, 0))
        return now >= retry_at

    def _note_skipped(self, served, available):
        """Log, record and count each published version newer than ``served`` that this runtime cannot serve.

        A version whose file for this runtime appears later (a copy that was still under way when the
        directory was listed) stops being skipped at the next poll.
        """
        for version in list(self.skipped_versions):
            if version in available and version not in self._retry_at:
                del self.skipped_versions[version]
        for version in published.versions(self.model_dir):
            if version > served and version not in available and version not in self.skipped_versions:
                self._skip(version, runtimes.missing_reason(os.path.join(self.model_dir, str(version)), self.runtime))

    def _skip(self, version, reason):
        self.skipped_versions[version] = reason
        logging.getLogger(__name__).warning("skipping version %s: %s", version, reason)
        if self._on_skip is not None:
            try:
                self._on_skip(self.runtime, version, reason)
            except Exception:  # metrics must never stop a model from serving
                logging.getLogger(__name__).exception("on_skip hook failed")

    def _swap(self, version):
        try:
            new_state = self._load_unlocked(version)
        except Exception as e:  # keep serving the version we have, and try this one again after a back-off
            _, failures = self._retry_at.get(version, (0.0, 0))
            wait = min(RETRY_MAX_S, RETRY_FIRST_S * 2**failures)
            self._retry_at[version] = (time.monotonic() + wait, failures + 1)
            self._skip(version, f"failed to load: {type(e).__name__}: {e} (tried {failures + 1} times; again in {wait:g} s)")
            return
        finally:
            self._swapping.release()
        self._retry_at.pop(version, None)
        self.skipped_versions.pop(version, None)
        old_state, self._state = self._state, new_state
        self._loaded(new_state)
        logging.getLogger(__name__).info("now serving version %s (was %s)", version, old_state.version)
        # Requests that already hold the old state finish on it; then its batcher thread ends.
        retire = threading.Timer(RETIRE_AFTER_S, old_state.batcher.close)
        retire.daemon = True  # never hold up a worker's shutdown
        retire.start()

    def _load_unlocked(self, version=None):
        available = runtimes.versions(self.model_dir, self.runtime)
        if not available:
            saved = published.versions(self.model_dir)
            if saved:  # versions there are, but none this runtime can serve: say why
                raise ServeError(runtimes.missing_reason(os.path.join(self.model_dir, str(saved[-1])), self.runtime), 503)
            raise ServeError(f"no model versions (directories N/ with a saved_model.pb) under {self.model_dir}", 503)
        if version is None:
            version = available[-1]
            self._note_skipped(version, available)
        path = os.path.join(self.model_dir, str(version))
        try:
            served = published.manifest(path)  # first: a version whose manifest is refused is never loaded
        except ManifestError as e:
            raise ServeError(f"version {version} is refused: {e}", 503) from None
        model = runtimes.load(self.runtime, path, self._threads)
        info = ModelInfo.build(self.name, version, model.signature_defs, served, versions=(version,), runtime=self.runtime)
        batcher = Batcher(model.pixels, max_batch=self._max_batch, max_wait_s=self._wait_s, on_batch=self._on_batch,
                          max_queue=self._max_queue, timeout_s=self._timeout_s, on_waiting=self._on_waiting)
        return _Loaded(version, model, batcher, info)

    def _loaded(self, state):
        if self._on_load is not None:
            try:
                self._on_load(self.runtime, state.version)
            except Exception:  # metrics must never stop a model from serving
                logging.getLogger(__name__).exception("on_load hook failed")

    @property
    def loaded(self):
        """Whether a version is loaded (until then ``ready()`` answers 503 without a model call)."""
        return self._state is not None

    @property
    def batch_sizes(self):
        """How many batches of each size the model ran (empty until loaded)."""
        return self._state.batcher.batch_sizes if self._state else {}

    # -- the interface (serve.core.model.Backend) ------------------------------------------
    def info(self):
        state = self._load()
        if not self.skipped_versions:
            return state.info
        return dataclasses.replace(state.info, skipped_versions=dict(self.skipped_versions))

    def infer(self, images, version=None):
        state = self._load()  # one state for the whole call: the answer names the version that gave it
        self._check_version(state, version)
        if not len(images):
            return Prediction(state.version, {key: value.copy() for key, value in state.model.empty_outputs.items()})
        try:
            return Prediction(state.version, state.batcher.submit(images))
        except Overloaded as e:
            raise Shed(str(e), "queue_full") from None
        except TimeoutError as e:
            raise Shed(str(e), "timeout") from None
        except Exception as e:
            raise ServeError(f"prediction failed: {type(e).__name__}: {e}", 500) from e

    def predict(self, images):
        """``serving_default``'s outputs for uint8 pixels, by the newest version."""
        return self.infer(images).outputs

    def run(self, signature_name, inputs, version=None):
        state = self._load()
        self._check_version(state, version)
        if signature_name not in state.info.signature_defs:
            raise ServeError(f"signature {signature_name!r} not found; this model has {sorted(state.info.signature_defs)}", 400)
        try:
            return state.model.call(signature_name, inputs, self.predict)
        except runtimes.InputError as e:
            raise ServeError(str(e), 400) from None

    def ready(self):
        state = self._load(wait=False)
        outputs = self.predict(readiness_images())
        if outputs[OUTPUT_PROBABILITIES].shape[0] != 1:
            raise ServeError("the probe prediction returned the wrong batch size", 503)
        return state.version

    def close(self):
        if self._state:
            self._state.batcher.close()

    def _check_version(self, state, version):
        if version is not None and int(version) != state.version:
            raise NotServed(self.name, version, (state.version,),
                            f"model {self.name!r} version {version} is not loaded (serving {state.version})")


@dataclasses.dataclass(frozen=True)
class _Loaded:
    """One loaded version: its runtime's model, its batcher and its info."""

    version: int
    model: object
    batcher: Batcher
    info: ModelInfo
