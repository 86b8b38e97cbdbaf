"""SERVE: a Flask front end for the exported SavedModel (or for a TF Serving).

Typical usage::

    python -m serve --model-dir models/cifar10 --port 8000           # gunicorn, in-process model
    SERVE_BACKEND=tfserving-grpc TFSERVING_GRPC_TARGET=tfserving:8500 python -m serve

Routes: ``/`` (upload form), ``/api/v1/predict``, ``/api/v1/model``, TF Serving's REST API
under ``/v1/models/NAME``, the Open Inference Protocol (KServe v2)
under ``/v2``, ``/healthz``, ``/readyz``, ``/metrics``. Configuration is by
environment variable; see :mod:`serve.settings`.
"""

import functools
import time

from flask import Flask, g, jsonify, request
from werkzeug.exceptions import HTTPException

from contract import API_ROOTS

#: Paths under these answer errors as JSON (``{"error": ...}``), the rest as the form page.
JSON_PREFIXES = tuple(f"{root}/" for root in API_ROOTS)


def create_app(config=None, backend=None, tracer_provider=None):
    """Build the app: settings from the environment, then ``config`` (setting keys such as ``MODEL_DIR``, and
    Flask's own such as ``TESTING``); ``backend`` (a :class:`serve.core.model.Backend`) replaces the configured one,
    and ``tracer_provider`` (OpenTelemetry's) the one ``OTEL_TRACES_EXPORTER`` would build, when traces are on.

    The pieces get their typed settings in their constructors: the metrics, the security hooks, the
    backend and the :class:`~serve.core.service.InferenceService` that every protocol calls.
    """
    from serve import backends, bodies, health, logs, metrics, security, settings, tracing
    from serve.core import InferenceService
    from serve.protocols import api, tfserving_rest, v2_rest, web

    app = Flask(__name__)
    # Flask asks ensure_sync (inspect.iscoroutinefunction) about every hook and view on every request;
    # the answer for a function never changes, so it is worked out once per function (Flask's documented override point).
    app.ensure_sync = functools.cache(app.ensure_sync)
    # One typed, checked settings object: a bad value stops the start here, naming its variable.
    configured = settings.Settings.from_env(overrides=config)
    app.config.from_mapping({k: v for k, v in (config or {}).items() if k not in settings.Settings.keys()})
    app.config["MAX_CONTENT_LENGTH"] = configured.max_upload_bytes
    app.extensions["serve.settings"] = configured
    # First, so that every later hook, refusals included, runs with the request's id.
    logs.init_app(app, configured.log_format)
    # Next, so that a request refused by a later hook is a span too (off unless OTEL_TRACES_EXPORTER says).
    tracing.init_app(app, configured, tracer_provider)
    # A body that cannot be read (JSON however deep, a broken chunked body) is a 400 on every route.
    bodies.init_app(app)

    app_metrics = metrics.Metrics(multiprocess=bool(configured.prometheus_multiproc_dir))
    app.extensions["serve.metrics"] = app_metrics
    # API keys, rate limits, CORS, security headers, ProxyFix (serve/security.py); before the model
    # loads, so that an unreadable key file stops the start at once.
    security.init_app(app, configured, app_metrics)
    if backend is None:
        backend = backends.from_settings(configured, app_metrics)
    app.extensions["serve.backend"] = backend
    service = InferenceService(backend, configured.model_name, configured.limits(), app_metrics, on_answer=logs.note_answer)
    app.extensions["serve.service"] = service
    app.extensions["serve.readiness"] = health.Readiness(backend)
    app.context_processor(lambda: {"model_name": configured.model_name})

    for blueprint in (web.bp, api.bp, tfserving_rest.bp, v2_rest.bp, health.bp):
        app.register_blueprint(blueprint)

    @app.before_request
    def _start_timer():
        g.serve_started = time.perf_counter()
        app_metrics.in_flight.inc()
        g.serve_in_flight = True

    @app.teardown_request
    def _done(_error):
        if g.pop("serve_in_flight", False):
            app_metrics.in_flight.dec()

    @app.after_request
    def _observe(response):
        # Labels from fixed sets only: the route's rule (or "<unmatched>"), a known method (or "other"),
        # the status. A client that invents methods or paths adds no series.
        rule, method, started = request.url_rule, request.method, g.get("serve_started")
        app_metrics.request_answered(rule.rule if rule is not None else "<unmatched>",
                                     method if method in metrics.METHODS else "other", response.status_code,
                                     None if started is None else time.perf_counter() - started)
        return response

    @app.errorhandler(HTTPException)
    def _http_error(e):
        if request.path.startswith(JSON_PREFIXES) or request.path in API_ROOTS:
            description = e.description
            if e.code == 413:
                description = f"the request is larger than the {configured.max_upload_mb:g} MiB limit"
            elif e.code == 404:
                description = f"no route {request.path}"
            return jsonify(error=description), e.code
        if e.code == 413:
            return web.render_error(f"The upload is larger than the {configured.max_upload_mb:g} MiB limit.", 413)
        return e

    @app.errorhandler(Exception)
    def _unexpected(e):
        app.logger.exception("unhandled error on %s", request.path)
        return jsonify(error=f"internal error: {type(e).__name__}"), 500

    return app
