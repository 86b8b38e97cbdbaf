"""``/healthz`` (the process answers), ``/readyz`` (the last probe prediction succeeded), ``/metrics``.

A probe prediction costs a model call, and ``/readyz`` is open to anyone: :class:`Readiness`
runs one at most once a second per worker and answers every other ``/readyz`` (and the v2 health
routes) from its result, so no number of probes drives more inference than that.
"""

import threading
import time

from flask import Blueprint, Response, current_app, jsonify

from serve.core import ServeError
from serve.protocols import service
from serve.protocols.api import skipped_versions

bp = Blueprint("health", __name__)

#: Seconds a probe's result stands for.
PROBE_INTERVAL_S = 1.0


class Readiness:
    """``ready()`` of a backend (or the service), run at most once every ``interval_s`` seconds; its version, or the ``ServeError``."""

    def __init__(self, backend, interval_s=PROBE_INTERVAL_S, clock=time.monotonic):
        self._backend = backend
        self._interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._checked_at = None
        self._result = None

    def check(self):
        """The served version; raises the probe's ``ServeError`` (503) when it failed."""
        if not self._backend.loaded:
            # Still loading: the answer (503) costs no model call, and must turn to 200 the
            # moment the model is in, not up to a second later.
            return self._unwrap(self._probe())
        with self._lock:  # one probe at a time; the others wait for its result
            now = self._clock()
            if self._checked_at is None or now - self._checked_at >= self._interval_s:
                self._result = self._probe()
                self._checked_at = self._clock()
            result = self._result
        return self._unwrap(result)

    @staticmethod
    def _unwrap(result):
        if isinstance(result, ServeError):
            raise result
        return result

    def _probe(self):
        try:
            return self._backend.ready()
        except ServeError as e:
            return ServeError(str(e), 503)
        except Exception as e:  # the probe itself failing means "not ready", never a 500
            return ServeError(f"probe failed: {type(e).__name__}: {e}", 503)


@bp.get("/healthz")
def healthz():
    return jsonify(status="ok")


@bp.get("/readyz")
def readyz():
    served = service()
    try:
        version = current_app.extensions["serve.readiness"].check()
        info = served.info()
    except ServeError as e:
        return jsonify(error=str(e), backend=served.kind, **_skipped(served)), e.status
    return jsonify(status="ready", model=served.model_name, version=version, backend=served.kind, runtime=info.runtime,
                   **_skipped(served), **_agreement(version))


def _agreement(version):
    """``versions_served`` when the server's workers answer with different versions (each polls on its own), else ``{}``."""
    served = current_app.extensions["serve.metrics"].versions_served()
    if len(set(served) | {version}) > 1:
        return {"versions_served": sorted(set(served) | {version}), "workers_disagree": True}
    return {}


def _skipped(served):
    """``{"skipped_versions": [...]}`` when versions newer than the served one were passed over, else ``{}``."""
    if not served.backend.loaded:
        return {}
    try:
        skipped = skipped_versions(served.info().skipped_versions)
    except ServeError:
        return {}
    return {"skipped_versions": skipped} if skipped else {}


@bp.get("/metrics")
def metrics():
    body, content_type = current_app.extensions["serve.metrics"].exposition()
    return Response(body, content_type=content_type)
