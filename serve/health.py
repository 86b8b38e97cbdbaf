"""``/healthz`` (the process answers), ``/readyz`` (a probe prediction succeeds), ``/metrics``."""

from flask import Blueprint, Response, current_app, jsonify

from serve.errors import ServeError

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz():
    return jsonify(status="ok")


@bp.get("/readyz")
def readyz():
    backend = current_app.extensions["serve.backend"]
    try:
        version = backend.ready()
    except ServeError as e:
        return jsonify(error=str(e), backend=backend.kind), 503
    except Exception as e:  # never let the probe itself break readiness reporting
        return jsonify(error=f"probe failed: {type(e).__name__}: {e}", backend=backend.kind), 503
    return jsonify(
        status="ready", model=current_app.config["MODEL_NAME"], version=version, backend=backend.kind,
        runtime=getattr(backend, "runtime", None),
    )


@bp.get("/metrics")
def metrics():
    body, content_type = current_app.extensions["serve.metrics"].exposition()
    return Response(body, content_type=content_type)
