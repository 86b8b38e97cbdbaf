"""SERVE: a Flask front end for the exported SavedModel (or for a TF Serving).

Typical usage::

    python -m serve --model-dir models/cifar10 --port 8000           # gunicorn, in-process model
    SERVE_BACKEND=tfserving-grpc TFSERVING_GRPC_TARGET=tfserving:8500 python -m serve

Routes: ``/`` (upload form), ``/api/v1/predict``, ``/api/v1/model``, TF Serving's REST API
under ``/v1/models/NAME``, the Open Inference Protocol (KServe v2) under ``/v2``, ``/healthz``,
``/readyz``, ``/metrics``; TF Serving's and the Open Inference Protocol's gRPC APIs on ``GRPC_PORT``
(:mod:`serve.grpc.server`). Configuration is by environment variable; see :mod:`serve.settings`.
docs/serving.md draws the layers: ``core`` (the request, the service, the gate), ``protocols`` (codecs),
``http`` and ``grpc`` (what each transport needs around them), ``backends``, ``telemetry``.
"""

import functools

from flask import Flask

#: Paths under these answer errors as JSON (``{"error": ...}``), the rest as the form page: the API area's.
from serve.http.security import API_PREFIXES as JSON_PREFIXES  # noqa: E402


def create_app(config=None, backend=None, tracer_provider=None):
    """Build the app: this process's settings (:func:`serve.settings.process`), or, with ``config``, settings from
    the environment and then ``config`` (setting keys such as ``MODEL_DIR``, and Flask's own such as ``TESTING``);
    ``backend`` (a :class:`serve.core.model.Backend`) replaces the configured one, and ``tracer_provider``
    (OpenTelemetry's) the one ``OTEL_TRACES_EXPORTER`` would build, when traces are on.

    The pieces get the typed settings in their constructors: the metrics, the gate, the backend and the
    :class:`~serve.core.service.InferenceService` that every protocol calls.
    """
    from serve import backends, settings
    from serve.core.admission import Gate
    from serve.core.service import InferenceService
    from serve.http import bodies, errors, exchange, health, security
    from serve.http.health import VersionsServed
    from serve.protocols import api, tfserving_rest, v2_rest, web
    from serve.telemetry import logs, metrics, tracing

    app = Flask(__name__)
    # Flask asks ensure_sync (inspect.iscoroutinefunction) about every hook and view on every request;
    # the answer for a function never changes, so it is worked out once per function (Flask's documented override point).
    app.ensure_sync = functools.cache(app.ensure_sync)
    # One typed, checked settings object: a bad value stops the start here, naming its variable.
    configured = settings.process() if config is None else settings.Settings.from_env(overrides=config).resolved()
    app.config.from_mapping({k: v for k, v in (config or {}).items() if k not in settings.Settings.keys()})
    app.config["MAX_CONTENT_LENGTH"] = configured.max_upload_bytes
    app.extensions["serve.settings"] = configured
    logs.configure(configured.log_format)
    # Next, so that a request refused by a later hook is a span too (off unless OTEL_TRACES_EXPORTER says).
    tracing.init_app(app, configured, tracer_provider)
    # A body that cannot be read (JSON however deep, a broken chunked body) is a 400 on every route.
    bodies.init_app(app)

    app_metrics = metrics.Metrics(multiprocess=bool(configured.prometheus_multiproc_dir))
    app.extensions["serve.metrics"] = app_metrics
    app.extensions["serve.versions_served"] = VersionsServed(app_metrics)
    # The core's gate (keys, rate limits), the headers, CORS and proxies, and the exchange's hooks (the request's id,
    # admission, metrics, headers, access line); before the model loads, so that an unreadable key file stops the start.
    gate = Gate(configured, app_metrics)
    app.extensions["serve.gate"] = gate
    exchange.init_app(app, security.init_app(app, configured, gate), app_metrics)
    errors.init_app(app, configured, web.render_error)
    if backend is None:
        backend = backends.from_settings(configured, app_metrics)
    app.extensions["serve.backend"] = backend
    app.extensions["serve.service"] = InferenceService(backend, configured.model_name, configured.limits(), app_metrics,
                                                       on_answer=logs.note_answer)
    app.context_processor(lambda: {"model_name": configured.model_name})
    for blueprint in (web.bp, api.bp, tfserving_rest.bp, v2_rest.bp, health.bp):
        app.register_blueprint(blueprint)
    return app

