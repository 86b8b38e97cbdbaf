"""OpenTelemetry traces: off unless ``OTEL_TRACES_EXPORTER`` names an exporter (serve/README.md, "Traces").

On, every HTTP request is a span (the Flask instrumentation) and so is every gRPC call but health's
(the gRPC instrumentation's server interceptor), whose parent is the caller's W3C ``traceparent`` when
it sends one; the core and the backends add a child span for each stage with :func:`span` (decoding,
waiting in the batcher, the model call, the TF Serving hop), and a call to TF Serving carries the
context on (:func:`inject`). Off, nothing is instrumented, and :func:`span` is one shared no-op
context: no span objects and no context switches on the hot path.

The spans are exported by the SDK's own pieces: one ``TracerProvider`` a process, with the
resource (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``) and a ``BatchSpanProcessor`` for each
exporter (``otlp``: OTLP over HTTP/protobuf, which reads ``OTEL_EXPORTER_OTLP_*`` itself; ``console``:
each span as JSON on stdout). Under gunicorn the provider is built in ``create_app``, so in the
worker after the fork: the batch processor's thread would not survive one. ``worker_exit`` flushes it.

Typical usage (``create_app`` and ``serve/gunicorn_conf.py`` do this)::

    init_app(app, settings)                  # instruments the app when traces are on
    with span("serve.decode", {"serve.images": 3}):
        ...
"""

import contextlib

from opentelemetry import propagate, trace
from opentelemetry import context as otel_context

TRACER_NAME = "serve"
#: ``service.name`` when neither ``OTEL_SERVICE_NAME`` nor ``OTEL_RESOURCE_ATTRIBUTES`` names one.
DEFAULT_SERVICE_NAME = "serve"
#: The span attribute that carries the request id (``X-Request-Id``; ``x-request-id`` over gRPC).
REQUEST_ID = "serve.request_id"
#: Requests never traced: probes and scrapes, answered every few seconds, would bury the requests.
EXCLUDED_URLS = r"/healthz(\?|$),/readyz(\?|$),/metrics(\?|$)"
HEALTH_SERVICE = "grpc.health.v1.Health"
CLIENT = trace.SpanKind.CLIENT

_NOTHING = contextlib.nullcontext()
_tracer = None  # the tracer of the spans below a request's; None while traces are off
_built = None  # the provider this process built from its settings (one a process: see process_provider)


def enabled():
    """Whether this process traces (an app was set up with an exporter, or a provider)."""
    return _tracer is not None


def init_app(app, settings, provider=None):
    """Trace ``app``'s requests when ``settings.traces_exporter`` names an exporter; returns the provider or None.

    ``provider`` (a ``TracerProvider``) replaces the one the settings would build: tests hand in one
    that exports to memory. Call it before the hooks that may refuse a request, so refusals are spans too.
    """
    global _tracer
    if settings.traces_exporter == "none":
        return None
    from opentelemetry.instrumentation.flask import FlaskInstrumentor

    provider = provider or process_provider(settings)
    _tracer = provider.get_tracer(TRACER_NAME)
    FlaskInstrumentor.instrument_app(app, tracer_provider=provider, excluded_urls=EXCLUDED_URLS)
    app.extensions["serve.tracer_provider"] = provider
    return provider


def process_provider(settings):
    """The process's ``TracerProvider`` for ``settings``, built once and made the global one."""
    global _built
    if _built is None:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider = TracerProvider(resource=resource(settings))
        for name in settings.traces_exporter.split(","):
            provider.add_span_processor(BatchSpanProcessor(exporter(name)))
        trace.set_tracer_provider(provider)
        _built = provider
    return _built


def resource(settings):
    """The SDK's resource (``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_SERVICE_NAME``), named ``serve`` when neither names the service."""
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource

    found = Resource.create({SERVICE_NAME: settings.service_name} if settings.service_name else {})
    if str(found.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        found = found.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    return found


def exporter(name):
    """The span exporter ``OTEL_TRACES_EXPORTER`` names: ``otlp`` or ``console``."""
    if name == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()  # endpoint, headers, timeout: OTEL_EXPORTER_OTLP_*
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    raise ValueError(f"unknown span exporter {name!r}")


def shutdown():
    """Export what is buffered and stop the processors (gunicorn's ``worker_exit``)."""
    if _built is not None:
        _built.shutdown()


def grpc_interceptors(app):
    """The gRPC instrumentation's server interceptor for ``app``'s provider (health's calls untraced), or none."""
    provider = app.extensions.get("serve.tracer_provider")
    if provider is None:
        return []
    from opentelemetry.instrumentation.grpc import filters, server_interceptor

    return [server_interceptor(tracer_provider=provider, filter_=filters.negate(filters.service_name(HEALTH_SERVICE)))]


def tag(request_id):
    """Put ``request_id`` on the span of the request being handled."""
    if _tracer is not None and request_id:
        trace.get_current_span().set_attribute(REQUEST_ID, request_id)


def span(name, attributes=None, kind=trace.SpanKind.INTERNAL):
    """A child span of the current one for one stage, as a context manager; a no-op outside a traced request."""
    if _tracer is None or not trace.get_current_span().is_recording():
        return _NOTHING
    return _tracer.start_as_current_span(name, kind=kind, attributes=attributes)


def current():
    """The current context when it holds a recording span (to carry to another thread), else None."""
    if _tracer is None or not trace.get_current_span().is_recording():
        return None
    return otel_context.get_current()


def span_for(name, contexts, attributes=None):
    """A span for work done for several requests on another thread (a batch): a child of the first
    request's context in ``contexts`` (from :func:`current`), linked to the others; a no-op when none is traced."""
    contexts = [c for c in contexts if c is not None]
    if _tracer is None or not contexts:
        return _NOTHING
    links = [trace.Link(trace.get_current_span(c).get_span_context()) for c in contexts[1:]]
    return _tracer.start_as_current_span(name, context=contexts[0], links=links, attributes=attributes)


def inject(carrier):
    """``carrier`` (headers, or a dict for gRPC metadata) with the current ``traceparent`` added when traced."""
    if _tracer is not None:
        propagate.inject(carrier)
    return carrier
