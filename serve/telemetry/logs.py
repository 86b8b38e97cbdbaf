"""Request ids and structured logs: one request followed through the answer, the error body and every log line.

Every request gets an id: the caller's ``X-Request-Id`` when it is sane (1 to 128 letters, digits,
``.``, ``_``, ``:`` or ``-``), else a new one. It comes back in the answer's ``X-Request-Id``, in
every JSON error body (``"request_id"``), and on every log line written while the request is
handled. After each request one line on the ``serve.access`` logger says what happened: the id, the
method, the route, the status, the model version and images answered, the duration and the client's
address (after ``SERVE_TRUSTED_PROXIES``' proxy fix). No line carries an API key, a header or an
image's bytes.

The hooks that do this for HTTP are :mod:`serve.http.exchange`'s. A gRPC call gets its id the same way, from its
``x-request-id`` metadata (:func:`call` holds it while the call runs; :mod:`serve.grpc.interceptors` sends it back and
writes the call's line with :func:`log_call`).

``SERVE_LOG_FORMAT=json`` (the default) writes each record as one JSON object a line (:class:`JSONFormatter`, on
orjson); ``text`` writes plain lines for a terminal.
"""

import contextlib
import contextvars
import logging
import os
import re
import sys
import time

import orjson
from flask import g, has_request_context

HEADER = "X-Request-Id"
#: The model version that answered the request, on every answer a model gave.
VERSION_HEADER = "X-Model-Version"
SANE_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
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
    """``given`` when it is a sane id (non-empty), else a new one: 32 random hex digits, as a UUID4's hex is."""
    return given if given and isinstance(given, str) and SANE_ID.fullmatch(given) else os.urandom(16).hex()


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


class JSONFormatter(logging.Formatter):
    """One JSON object a line: ``time``, ``level``, ``logger``, ``message``, then the record's own fields (``extra=``, the
    request id), then ``exc_info`` with the traceback of an error. Written by orjson in one call: the access line is
    written for every request, and python-json-logger's generic field merging cost a fifth of a small request."""

    _second = (None, "")  # (the second, its text), replaced in one assignment: threads share the formatter

    def formatTime(self, record, datefmt=None):
        """``2026-12-05 05:39:07,619``, as logging's default; the second's text is written once a second, not a line."""
        second, stamp = self._second
        if int(record.created) != second:
            second = int(record.created)
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", self.converter(second))
            self._second = (second, stamp)
        return f"{stamp},{int(record.msecs):03d}"

    def format(self, record):
        line = {"time": self.formatTime(record), "level": record.levelname, "logger": record.name,
                "message": record.getMessage()}
        for key, value in record.__dict__.items():
            if key not in _RECORD_FIELDS:
                line[key] = value
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack_info"] = self.formatStack(record.stack_info)
        return orjson.dumps(line, default=str).decode()


#: What every LogRecord carries: not a field of the line (message aside, which is written formatted).
_RECORD_FIELDS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


def formatter(kind):
    """A formatter for ``SERVE_LOG_FORMAT``: JSON lines, or text."""
    return JSONFormatter() if kind == "json" else logging.Formatter(TEXT_FORMAT)


def configure(kind):
    """Send the server's own loggers (``serve``, and the app's) to stderr in ``kind``, each record with its request id.

    No format of the server's shows a record's source line, thread or process, so logging is told not to look them up
    for every record (its documented optimisation): a frame walk and three calls a line.
    """
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(kind))
    handler.addFilter(RequestIdFilter())
    root = logging.getLogger("serve")
    if not any(getattr(h, "serve_logs", False) for h in root.handlers):
        handler.serve_logs = True
        root.addHandler(handler)
        root.setLevel(logging.INFO)


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
