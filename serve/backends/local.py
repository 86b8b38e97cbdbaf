"""The exported model in this process: one of :mod:`serve.backends.runtimes` (LiteRT float32 or int8, or the
SavedModel in TensorFlow), concurrent requests micro-batched, new versions picked up as they appear.

The versions loaded and their labels follow a :class:`serve.model_config.ModelConfig` (TF Serving's config
file, else the newest version alone). New versions load in the background, then they and the labels are
swapped in in one step before the versions no longer selected retire: a label moves without a failed request.
"""

import dataclasses
import logging
import os
import threading
import time

from contract import OUTPUT_PROBABILITIES
from serve.backends import model_config, published
from serve.backends import runtimes
from serve.backends.version import Batching, LoadedVersion
from serve.core.errors import NotServed, ServeError, Unavailable
from serve.core.model import readiness_images

RELOAD_INTERVAL_S = 5.0  # how often a backend that failed to load tries again
RETIRE_AFTER_S = 30.0  # how long a replaced version keeps answering requests already sent to it
RETRY_FIRST_S, RETRY_MAX_S = 5.0, 300.0  # a version that failed to load is tried again after 5 s, 10 s, ... 300 s
#: A version's state as TF Serving's ModelService and ``GET /v1/models/NAME`` name it.
LOADING, AVAILABLE, UNLOADING, END = "LOADING", "AVAILABLE", "UNLOADING", "END"

log = logging.getLogger(__name__)


class LocalBackend:
    """The versions under ``model_dir`` that ``config`` selects (default: the highest alone), in one of
    :mod:`serve.backends.runtimes`, each a :class:`serve.backends.version.LoadedVersion` batched by its own batcher.

    ``on_load(runtime, version)`` is called each time a version becomes the one a request without a
    version gets (the newest loaded), and ``on_skip(runtime, version, reason)`` each time a version newer
    than that one is passed over (no model file for this runtime, export refused it, or it failed to
    load); the skipped versions and why are in :attr:`skipped_versions` for ``/readyz`` and ``/api/v1/model``.
    ``config_file`` is read at start and again, every ``config_poll_s`` (> 0), when it changed.
    """

    kind = "local"

    def __init__(self, model_dir, name, runtime, *, max_batch, batch_wait_ms, poll_s, threads=None, on_batch=None,
                 on_load=None, on_skip=None, timeout_s=None, config_file=None,
                 config_poll_s=0.0):
        self.model_dir = str(model_dir)
        self.name = name
        self.runtime = runtimes.check(runtime)
        self._threads = threads or None  # None: runtimes.default_threads()
        self._on_load, self._on_skip = on_load, on_skip
        #: Versions newer than the served one that were passed over: ``{version: reason}``.
        self.skipped_versions = {}
        self._retry_at = {}  # version -> (monotonic time it may be tried again, failed loads so far)
        # Like TF Serving's file-system poll: a new version N+1/ replaces the served one.
        self._poll_s = float(poll_s)
        self._polled_at = time.monotonic()
        self._config_file = None if config_file is None else model_config.Watched(config_file, config_poll_s)
        self._config = model_config.newest(name, self.model_dir) if config_file is None else self._config_file.config
        self.model_dir = self._config.base_path
        self._states = {}  # version -> LOADING, AVAILABLE, UNLOADING or END, for the status routes
        self._swapping, self._refreshing = threading.Lock(), threading.Lock()
        self._batching = Batching(max_batch, batch_wait_ms / 1000.0, on_batch, timeout_s)
        self._lock = threading.Lock()
        self._served = None  # a _Served once loaded
        self._infos = (None, {})  # (the _Served they describe, {version: ModelInfo}): see _refresh
        self._retiring = {}  # version -> LoadedVersion: replaced, still answering what was already sent to it
        self._error = self._tried_at = None
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
        served = self._served
        if served is not None:
            self._poll()
            return served
        if not self._lock.acquire(blocking=wait):
            raise Unavailable(f"the model in {self.model_dir} is still loading")
        try:
            if self._served is not None:
                return self._served
            if self._tried_at is not None and time.monotonic() - self._tried_at < RELOAD_INTERVAL_S:
                raise Unavailable(self._error)
            self._tried_at = time.monotonic()
            try:
                self._publish(self._config, self._first_load(), dict(self._config.labels))
                self._error = None
                return self._served
            except ServeError as e:
                self._error = str(e)
            except Exception as e:  # a broken SavedModel must not take the worker down
                self._error = f"cannot load the model from {self.model_dir}: {type(e).__name__}: {e}"
            raise Unavailable(self._error)
        finally:
            self._lock.release()

    def _first_load(self):
        """Every version the config selects, loaded; a 503 saying why when there is none, or a label's is missing."""
        available = runtimes.versions(self.model_dir, self.runtime)
        if not available:
            saved = published.versions(self.model_dir)
            if saved:  # versions there are, but none this runtime can serve: say why
                raise Unavailable(runtimes.missing_reason(os.path.join(self.model_dir, str(saved[-1])), self.runtime))
            raise Unavailable(f"no model versions (directories N/ with a saved_model.pb) under {self.model_dir}")
        wanted = self._config.select(available)
        if not wanted:
            raise Unavailable(f"the model config selects none of the versions under {self.model_dir}")
        self._note_skipped(wanted[-1], available)
        loaded = {}
        try:
            for version in wanted:
                self._set_state(version, LOADING)
                loaded[version] = self._load_version(version)
            if (missing := self._config.unlabelled(loaded)) is not None:
                raise Unavailable(f"label {missing[0]!r} names version {missing[1]} of model {self.name}, which is not "
                                  f"available (loaded: {', '.join(map(str, loaded))})")
        except Exception:
            for state in loaded.values():
                state.close()
            for version in wanted:
                self._set_state(version, None)
            raise
        return loaded

    def _poll(self):
        """Re-read the config, list the versions; when the loaded ones should change, start that in the background."""
        now = time.monotonic()
        if self._config_file is not None and (config := self._config_file.poll(now, self._config)) is not None:
            self._config = config
        served = self._served
        if self._poll_s > 0 and now - self._polled_at >= self._poll_s:
            self._polled_at = now
        elif self._config is served.config:
            return
        available = runtimes.versions(self.model_dir, self.runtime)
        self._note_skipped(served.default, available)
        config = self._config
        if config is not served.config and not config.select(available):
            # As TF Serving refuses such a config: applying it would serve nothing. Keep the one in force, and stop
            # looking at the model directory on every request until the file changes again.
            log.error("model config refused: %s selects none of the published versions (%s); keeping the one read "
                      "before", config.source, ", ".join(map(str, available)) or "none")
            self._config = served.config
            return
        wanted = config.select(self._candidates(available, served, now))
        if not wanted or (config is served.config and wanted == tuple(sorted(served.loaded))):
            return
        if self._swapping.acquire(blocking=False):
            threading.Thread(target=self._reconcile, args=(config, wanted), name="model-swap", daemon=True).start()

    def _candidates(self, available, served, now):
        """Of the ``available`` versions, those loaded or that may be loaded now (not backing off, manifest there)."""
        candidates = []
        for version in available:
            if version not in served.loaded:
                if not self._due(version, now):
                    continue
                if (served.loaded[served.default].info.architecture is not None
                        and not os.path.exists(published.manifest_path(os.path.join(self.model_dir, str(version))))):
                    # Exported versions carry their manifest; one copied in by hand may show its model before
                    # its manifest. Wait for it rather than serve the version without confidence data for good.
                    log.info("version %s has no manifest yet; waiting for it", version)
                    continue
            candidates.append(version)
        return candidates

    def _due(self, version, now):
        """Whether ``version`` may be loaded now: never failed, or its back-off has passed."""
        return now >= self._retry_at.get(version, (0.0, 0))[0]

    def _note_skipped(self, served, available):
        """Log, record and count each published version newer than ``served`` that this runtime cannot serve.

        A version whose file for this runtime appears later (a copy that was still under way when the
        directory was listed) stops being skipped at the next poll.
        """
        for version in list(self.skipped_versions):
            if version in available and version not in self._retry_at:
                del self.skipped_versions[version]
                self._refresh()
        for version in published.versions(self.model_dir):
            if version > served and version not in available and version not in self.skipped_versions:
                self._skip(version, runtimes.missing_reason(os.path.join(self.model_dir, str(version)), self.runtime))

    def _skip(self, version, reason):
        self.skipped_versions[version] = reason
        self._refresh()
        log.warning("skipping version %s: %s", version, reason)
        _hook(self._on_skip, self.runtime, version, reason)

    def _reconcile(self, config, wanted):
        """Load the versions of ``wanted`` not loaded, then swap in them and ``config``'s labels in one step."""
        try:
            served = self._served
            loaded = {version: state for version, state in served.loaded.items() if version in wanted}
            fresh = [version for version in wanted if version not in loaded]
            for version in fresh:
                state = self._try_load(version)
                if state is not None:
                    loaded[version] = state
            missing = config.unlabelled(loaded)
            if missing is not None or not loaded:
                for version in fresh:
                    if version in loaded:
                        loaded[version].close()
                    self._set_state(version, None)
                if missing is not None:  # as TF Serving refuses such a config: keep the one before it
                    log.error("model config refused: %s: Request to assign label %s to version %s of model %s, which is "
                              "not currently available for inference; keeping the one read before", config.source,
                              missing[0], missing[1], self.name)
                    if self._config is config:  # (a newer one read meanwhile is tried at the next poll)
                        self._config = served.config
                return
            leaving = {version: state for version, state in served.loaded.items() if version not in loaded}
            # Reachable by number before they leave the versions served: a request that resolved a label to
            # one of them just before the swap still finds it when it runs, just after.
            self._retiring.update(leaving)
            self._publish(config, loaded, dict(config.labels))
            for version, state in leaving.items():
                self._retire(version, state)
        finally:
            self._swapping.release()

    def _try_load(self, version):
        """``version`` loaded, or None when it failed (then tried again after a back-off, and skipped meanwhile)."""
        self._set_state(version, LOADING)
        try:
            state = self._load_version(version)
        except Exception as e:  # keep serving the versions we have, and try this one again after a back-off
            self._set_state(version, None)
            _, failures = self._retry_at.get(version, (0.0, 0))
            wait = min(RETRY_MAX_S, RETRY_FIRST_S * 2**failures)
            self._retry_at[version] = (time.monotonic() + wait, failures + 1)
            self._skip(version, f"failed to load: {type(e).__name__}: {e} (tried {failures + 1} times; again in {wait:g} s)")
            return None
        self._retry_at.pop(version, None)
        if self.skipped_versions.pop(version, None) is not None:
            self._refresh()
        return state

    def _publish(self, config, loaded, labels):
        """Make ``loaded`` and ``labels`` what requests see, in one assignment."""
        before = self._served
        for version in loaded:
            self._states[version] = AVAILABLE
        self._served = _Served(config, dict(loaded), labels, max(loaded))
        self._refresh()
        if before is None or before.default != self._served.default:
            if before is not None:
                log.info("now serving version %s (was %s)", self._served.default, before.default)
            _hook(self._on_load, self.runtime, self._served.default)

    def _retire(self, version, state):
        """Requests already sent to ``state`` (holding it, or its number resolved from a label) finish on it; then
        its batcher thread ends. New requests cannot name it: it is no longer among the versions served."""
        self._retiring[version] = state
        self._set_state(version, UNLOADING)

        def close():
            if self._retiring.get(version) is state:
                del self._retiring[version]
            state.close()
            if self._states.get(version) == UNLOADING:
                self._set_state(version, END)

        retire = threading.Timer(RETIRE_AFTER_S, close)
        retire.daemon = True  # never hold up a worker's shutdown
        retire.start()

    def _load_version(self, version):
        return LoadedVersion.load(self.model_dir, version, self.name, self.runtime, self._threads, self._batching)

    @property
    def loaded(self):
        """Whether a version is loaded (until then ``ready()`` answers 503 without a model call)."""
        return self._served is not None

    @property
    def batch_sizes(self):
        """How many batches of each size the newest loaded version ran (empty until loaded)."""
        served = self._served
        return served.loaded[served.default].batcher.batch_sizes if served else {}

    # -- the interface (serve.core.model.Backend) ------------------------------------------
    def info(self, version=None):
        served = self._load()
        state = self._version(served, version)
        cached_for, infos = self._infos
        info = infos.get(state.version) if cached_for is served else None
        return info if info is not None else self._info_of(served, {state.version: state})[state.version]

    def _info_of(self, served, states=None):
        """Each version's info (default: every loaded one's) as requests see it: every version, the labels, the states."""
        seen = {"versions": tuple(sorted(served.loaded)), "labels": served.labels, "states": dict(self._states),
                "skipped_versions": dict(self.skipped_versions)}
        return {version: dataclasses.replace(state.info, **seen) for version, state in (states or served.loaded).items()}

    def _refresh(self):
        """Build the infos :meth:`info` answers with again, after what they show changed (once, not per request)."""
        with self._refreshing:  # one at a time, so an older view never overwrites a newer one
            served = self._served
            if served is not None:
                self._infos = (served, self._info_of(served))

    def _set_state(self, version, state):
        """Record ``version``'s state (None: forget it) for the status routes."""
        if state is None:
            self._states.pop(version, None)
        else:
            self._states[version] = state
        self._refresh()

    def infer(self, images, version=None, deadline=None):
        served = self._load()  # one snapshot for the whole call: the answer names the version that gave it
        return self._version(served, version).predict(images, deadline)

    def run(self, signature_name, inputs, version=None):
        return self._version(self._load(), version).run(signature_name, inputs)

    def ready(self):
        served = self._load(wait=False)
        outputs = self.infer(readiness_images()).outputs
        if outputs[OUTPUT_PROBABILITIES].shape[0] != 1:
            raise Unavailable("the probe prediction returned the wrong batch size")
        return served.default

    def close(self):
        if self._served:
            for state in self._served.loaded.values():
                state.close()

    def _version(self, served, version):
        """The loaded ``version`` of ``served`` (None: the newest); :class:`NotServed` when it is not loaded."""
        number = served.default if version is None else int(version)
        state = served.loaded.get(number) or (self._retiring.get(number) if version is not None else None)
        if state is None:
            raise NotServed(self.name, version, tuple(sorted(served.loaded)),
                            f"model {self.name!r} version {version} is not loaded "
                            f"(available: {', '.join(map(str, sorted(served.loaded)))})")
        return state


def _hook(hook, *args):
    """Call a metrics hook (None: none); its failure is logged, and never stops a model from serving."""
    if hook is not None:
        try:
            hook(*args)
        except Exception:
            log.exception("%s hook failed", getattr(hook, "__name__", "a"))


@dataclasses.dataclass(frozen=True)
class _Served:
    """What requests see, swapped in one assignment: the config, its loaded versions, their labels."""

    config: model_config.ModelConfig
    loaded: dict  # version -> LoadedVersion
    labels: dict  # label -> version, each of them loaded
    default: int  # the version a request without one gets: the newest loaded
