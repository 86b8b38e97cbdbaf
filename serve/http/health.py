"""``/healthz`` (the process answers), ``/readyz`` (the model answered its last probe), ``/metrics`` (Prometheus).

Readiness is the core's (:meth:`serve.core.service.InferenceService.ready`: a probe prediction at most once a
second per worker, whoever asks); gRPC health and the v2 health routes ask it too.
"""

import threading
import time

from flask import Blueprint, Response, current_app, jsonify

from serve.core.errors import ServeError

bp = Blueprint("health", __name__)

#: Seconds the workers' versions read for ``/readyz`` stand for, as long as a readiness probe's result stands.
VERSIONS_INTERVAL_S = 1.0


@bp.get("/healthz")
def healthz():
    return jsonify(status="ok")


@bp.get("/readyz")
def readyz():
    served = current_app.extensions["serve.service"]
    try:
        version = served.ready()
        info = served.info()
    except ServeError as e:
        return jsonify(error=str(e), backend=served.kind, **_skipped(served)), e.status
    return jsonify(status="ready", model=served.model_name, version=version, backend=served.kind, runtime=info.runtime,
                   **_skipped(served), **_agreement(version))


class VersionsServed:
    """The versions live workers answer with (:meth:`serve.telemetry.metrics.Metrics.versions_served`), read from the
    workers' metric files at most once every :data:`VERSIONS_INTERVAL_S` seconds: ``/readyz`` is open to anyone."""

    def __init__(self, metrics, clock=time.monotonic):
        self._metrics, self._clock = metrics, clock
        self._lock = threading.Lock()
        self._read_at, self._versions = None, []

    def __call__(self):
        with self._lock:
            now = self._clock()
            if self._read_at is None or now - self._read_at >= VERSIONS_INTERVAL_S:
                self._versions, self._read_at = self._metrics.versions_served(), now
            return self._versions


def _agreement(version):
    """``versions_served`` when the server's workers answer with different versions (each polls on its own), else ``{}``."""
    served = current_app.extensions["serve.versions_served"]()
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


def skipped_versions(skipped):
    """``{version: reason}`` of versions passed over as ``[{"version", "reason"}]``, oldest first."""
    return [{"version": v, "reason": why} for v, why in sorted((skipped or {}).items())]


@bp.get("/metrics")
def metrics():
    body, content_type = current_app.extensions["serve.metrics"].exposition()
    return Response(body, content_type=content_type)
