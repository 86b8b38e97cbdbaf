"""Request ids and structured logs: one request followed through the answer, the error body and every log line.

Every request gets an id: the caller's ``X-Request-Id`` when it is sane (1 to 128 letters, digits,
``.``, ``_``, ``:`` or ``-``), else a new one. It comes back in the answer's ``X-Request-Id``, in
every JSON error body (``"request_id"``), and on every log line written while the request is
handled. After each request one line on the ``serve.access`` logger says what happened: the id, the
method, the route, the status, the model version and images answered, the duration and the client's
address (after ``SERVE_TRUSTED_PROXIES``' proxy fix). No line carries an API key, a header or an
image's bytes.

A gRPC call gets its id the same way, from its ``x-request-id`` metadata (:func:`call` holds it while the
call runs; :mod:`serve.protocols.grpc_calls` sends it back and writes the call's line with :func:`log_call`).

``SERVE_LOG_FORMAT=json`` (the default) writes each record as one JSON object a line (python-json-logger);
``text`` writes plain lines for a terminal.
"""

import contextlib
import contextvars
import logging
import re
import sys
import time
import uuid

from flask import g, has_request_context, request

HEADER = "X-Request-Id"
#: The model version that answered the request, on every answer a model gave.
VERSION_HEADER = "X-Model-Version"
SANE_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
#: Fields every JSON line carries, in this order (the rest follow).
JSON_FIELDS = "%(asctime)s %(levelname)s %(name)s %(message)s"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"
ACCESS = logging.getLogger("serve.access")
#: The gRPC call this thread is answering (a :class:`Call`), for what has no Flask request.
_call = contextvars.ContextVar("serve_call", default=None)


class Call:
    """A request outside Flask (a gRPC call): its id, and the model version and images the core answered."""

    __slots__ = ("request_id", "answered")

    def __init__(self, request_id):
        self.request_id = request_id
        self.answered = (None, 0)


def new_id(given):
    """``given`` when it is a sane id, else a new one."""
    return given if isinstance(given, str) and SANE_ID.fullmatch(given) else uuid.uuid4().hex


@contextlib.contextmanager
def call(request_id):
    """Hold ``request_id`` as this thread's request (a gRPC call's) while the block runs; yields its :class:`Call`."""
    state = Call(request_id)
    token = _call.set(state)
    try:
        yield state
    finally:
        _call.reset(token)


def request_id():
    """The id of the request being handled (an HTTP request's, or a gRPC call's), or None outside one."""
    if has_request_context():
        return g.get("request_id")
    state = _call.get()
    return state.request_id if state is not None else None


class RequestIdFilter(logging.Filter):
    """Adds ``request_id`` to every record (``-`` outside a request), so any formatter can show it."""

    def filter(self, record):
        if not hasattr(record, "request_id"):
            record.request_id = request_id() or "-"
        return True


def formatter(kind):
    """A formatter for ``SERVE_LOG_FORMAT``: JSON lines, or text."""
    if kind == "json":
        from pythonjsonlogger.orjson import OrjsonFormatter  # python-json-logger's, on orjson: a third less time a line

        return OrjsonFormatter(JSON_FIELDS, rename_fields={"levelname": "level", "name": "logger", "asctime": "time"})
    return logging.Formatter(TEXT_FORMAT)


def configure(kind):
    """Send the server's own loggers (``serve``, and the app's) to stderr in ``kind``, each record with its request id."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(kind))
    handler.addFilter(RequestIdFilter())
    root = logging.getLogger("serve")
    if not any(getattr(h, "serve_logs", False) for h in root.handlers):
        handler.serve_logs = True
        root.addHandler(handler)
        root.setLevel(logging.INFO)


def init_app(app, log_format):
    """Give every request an id, echo it, put it in JSON error bodies, and log one line per request."""
    configure(log_format)

    @app.before_request
    def _assign():
        g.request_id = new_id(request.headers.get(HEADER, ""))
        g.serve_log_started = time.perf_counter()

    @app.after_request
    def _echo(response):
        rid = g.get("request_id")
        if rid is None:  # a request refused before the hooks ran
            rid = g.request_id = uuid.uuid4().hex
        response.headers[HEADER] = rid
        status = response.status_code
        if status >= 400 and response.is_json:
            body = response.get_json(silent=True)
            if isinstance(body, dict) and "error" in body and "request_id" not in body:
                body["request_id"] = rid
                response.set_data(app.json.dumps(body))
        started = g.get("serve_log_started")
        answered = g.get("serve_answered") or (None, 0)
        if answered[0] is not None:  # which version answered, on every protocol (TF Serving's REST body has no field for it)
            response.headers[VERSION_HEADER] = str(answered[0])
        rule, method = request.url_rule, request.method
        ACCESS.info("%s %s %s", method, printable(request.path) if rule is None else rule.rule, status, extra={
            "request_id": rid, "method": method, "route": rule.rule if rule is not None else "<unmatched>",
            "status": status, "model_version": answered[0], "images": answered[1],
            "duration_ms": round((time.perf_counter() - started) * 1000, 2) if started else None,
            "client": request.remote_addr,
        })
        return response


def printable(text, limit=200):
    """A path from a request as a log line may show it: control characters escaped (a ``%0A`` must not start a forged
    line in the text format), at most ``limit`` characters."""
    if not text.isprintable():
        text = text.encode("unicode_escape").decode("ascii")
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def note_answer(version, images):
    """Record for this request's log line which model version answered how many images (the core's hook)."""
    if has_request_context():
        previous = g.get("serve_answered") or (None, 0)
        g.serve_answered = (version, previous[1] + images)
    elif _call.get() is not None:
        state = _call.get()
        state.answered = (version, state.answered[1] + images)


def log_call(state, method, status, duration_s, client):
    """The ``serve.access`` line of a gRPC call (``status``: its code's name, such as ``OK``)."""
    ACCESS.info("gRPC %s %s", method, status, extra={
        "request_id": state.request_id, "method": "gRPC", "route": method, "status": status,
        "model_version": state.answered[0], "images": state.answered[1], "duration_ms": round(duration_s * 1000, 2),
        "client": client,
    })


def gunicorn_logger(kind):
    """gunicorn's logger class with its error and access logs in ``kind`` (``SERVE_LOG_FORMAT``; ``logger_class`` in gunicorn_conf)."""
    from gunicorn import glogging

    class Logger(glogging.Logger):
        def setup(self, cfg):
            super().setup(cfg)
            if kind == "json":
                for log in (self.error_log, self.access_log):
                    for handler in log.handlers:
                        handler.setFormatter(formatter("json"))

    return Logger
