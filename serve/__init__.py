"""SERVE: a Flask front end for the exported SavedModel (or for a TF Serving).

Typical usage::

    python -m serve --model-dir models/cifar10 --port 8000           # gunicorn, in-process model
    SERVE_BACKEND=tfserving-grpc TFSERVING_GRPC_TARGET=tfserving:8500 python -m serve

Routes: ``/`` (upload form), ``/api/v1/predict``, ``/api/v1/model``, TF Serving's REST API
under ``/v1/models/NAME``, the Open Inference Protocol (KServe v2)
under ``/v2``, ``/healthz``, ``/readyz``, ``/metrics``. Configuration is by
environment variable; see :mod:`serve.settings`.
"""

import time

from flask import Flask, g, jsonify, request
from werkzeug.exceptions import HTTPException

JSON_PREFIXES = ("/api/", "/v1/", "/v2")


def create_app(config=None, backend=None):
    """Build the app: defaults from the environment, then ``config``; ``backend`` replaces the configured one."""
    from serve import api, backends, classify, health, metrics, settings, tfserving_api, v2_api, web

    app = Flask(__name__)
    # One typed, checked settings object: a bad value stops the start here, naming its variable.
    configured = settings.Settings.from_env(overrides=config)
    known = configured.flask_config()
    app.config.update(known)
    app.config.from_mapping({k: v for k, v in (config or {}).items() if k not in known})
    # A body that cannot be read (JSON however deep, a broken chunked body) is a 400 on every route.
    from serve import bodies

    bodies.init_app(app)

    app_metrics = metrics.Metrics(multiprocess=bool(configured.prometheus_multiproc_dir))
    app.extensions["serve.metrics"] = app_metrics
    # API keys, rate limits, CORS, security headers, ProxyFix (serve/security.py); before the model
    # loads, so that an unreadable key file stops the start at once.
    from serve import security

    security.init_app(app, app_metrics)
    if backend is None:
        backend = backends.from_config(
            app.config, on_batch=app_metrics.batch_size.observe, on_load=app_metrics.model_loaded,
            on_skip=app_metrics.version_skipped,
        )
    app.extensions["serve.backend"] = backend
    app.extensions["serve.readiness"] = health.Readiness(backend)
    # The core of / and /api/v1/predict, given what it needs instead of reaching into the app.
    app.extensions["serve.classifier"] = classify.Classifier(backend, app.config["MAX_PIXELS"], app_metrics.images.inc,
                                                             app_metrics.answers)

    for blueprint in (web.bp, api.bp, tfserving_api.bp, v2_api.bp, health.bp):
        app.register_blueprint(blueprint)

    @app.before_request
    def _start_timer():
        g.serve_started = time.perf_counter()

    @app.after_request
    def _observe(response):
        route = request.url_rule.rule if request.url_rule is not None else "<unmatched>"
        started = g.get("serve_started")
        if started is not None:
            app_metrics.latency.labels(route, request.method).observe(time.perf_counter() - started)
        app_metrics.requests.labels(route, request.method, str(response.status_code)).inc()
        return response

    @app.errorhandler(HTTPException)
    def _http_error(e):
        if request.path.startswith(JSON_PREFIXES):
            description = e.description
            if e.code == 413:
                description = f"the request is larger than the {app.config['MAX_CONTENT_LENGTH'] / 1048576:g} MiB limit"
            elif e.code == 404:
                description = f"no route {request.path}"
            return jsonify(error=description), e.code
        if e.code == 413:
            return web.render_error(f"The upload is larger than the {app.config['MAX_CONTENT_LENGTH'] / 1048576:g} MiB limit.", 413)
        return e

    @app.errorhandler(Exception)
    def _unexpected(e):
        app.logger.exception("unhandled error on %s", request.path)
        return jsonify(error=f"internal error: {type(e).__name__}"), 500

    return app
