"""Request bodies: whatever a client sends, a body that cannot be read is a 400, never a 500.

Two ways a body used to end as a 500, closed here for every route, present and future, by
:func:`init_app`:

* **JSON nested too deeply.** Python's ``json.loads`` raises ``RecursionError``, not
  ``ValueError``, on a body nested deeper than the interpreter's recursion limit (``[[[[...]]]]``
  100,000 levels deep is only 200 kB), and Flask's ``request.get_json`` turns only ``ValueError``
  into "bad JSON". The app's JSON provider (orjson) stops at 1,024 levels with a ``ValueError``, so
  ``get_json(silent=True)`` returns ``None`` and ``get_json()`` answers 400, as for any other
  malformed body (:func:`request_json` also says why: the routes here use it). A route that calls
  the standard ``json.loads`` itself (better: ``flask.json.loads``, the provider's) is covered by an
  app-wide handler that answers 400 for a ``RecursionError`` raised inside the ``json`` package;
  one raised anywhere else is a bug in the server and stays a 500.
* **A body the server cannot read**: a chunked body with a broken chunk, a client that
  vanished mid-body. gunicorn's reader raises its own exceptions from ``wsgi.input``; the
  input is wrapped so that any of them becomes werkzeug's ``BadRequest``, which the app's
  error handler answers like every other 400.

A refusal that comes before the body is read (401, 429, a 415 for the content type) leaves that
body on the socket. gunicorn 27 drains at most 64 KiB of it after the answer, which has already
announced keep-alive, and closes the connection when there is more: the client's next request
on it then finds the connection gone. So a body of up to :data:`DRAIN_LIMIT` bytes that a
refused request left unread is read here, as the server would have read a good request's, for at
most :data:`DRAIN_TIMEOUT_S`: a client that declares a body and trickles it (or never sends it)
would otherwise hold a request thread for as long as it likes, before any answer. A body that is
larger, or not all there in time, is not read: the socket is shut for reading, so that neither this
drain nor gunicorn's waits on it, the answer goes out at once and the connection closes after it.
"""

import json
import os
import socket
import time

import numpy as np
import orjson

from flask import current_app, jsonify, request
from flask.json.provider import DefaultJSONProvider
from werkzeug.exceptions import BadRequest, HTTPException

from serve.core.errors import BadRequest
from serve.http import json_tensors

NESTED_TOO_DEEPLY = "nested too deeply"
#: Most bytes of a refused request's unread body read before answering, so its connection stays usable.
DRAIN_LIMIT = 1024 * 1024
#: Most seconds spent reading a refused request's unread body.
DRAIN_TIMEOUT_S = 2.0
_JSON_PACKAGE = os.path.dirname(json.__file__) + os.sep


class JSONProvider(DefaultJSONProvider):
    """Flask's JSON provider on orjson: keys in insertion order, strict RFC 8259, deep nesting a ``ValueError``.

    orjson reads and writes JSON several times faster than the standard ``json`` (a 64-image
    ``instances`` body is about 200,000 integers; docs/benchmarks.md). It reads only JSON: ``NaN``
    and ``Infinity``, which Python's ``json`` accepts and would echo into answers that JavaScript and
    Go clients cannot parse, a lone surrogate and nesting deeper than 1,024 levels are each a
    ``ValueError`` (``orjson.JSONDecodeError``), which Flask's ``get_json`` and :func:`request_json`
    answer with a 400. A non-finite float in an answer is written as ``null``. NumPy arrays and scalars
    in an answer are written by orjson itself (a float32 as its shortest decimal that reads back the same),
    never turned into Python lists first.
    """

    sort_keys = False

    def loads(self, s, **kwargs):
        try:
            return orjson.loads(s)
        except orjson.JSONDecodeError as e:
            constant = _constant_at(e.doc, e.pos)
            if constant:
                raise ValueError(f"{constant} is not a JSON value (JSON has no NaN or Infinity)") from None
            raise

    def dumps(self, obj, **kwargs):
        return orjson.dumps(obj, default=_default, option=orjson.OPT_SERIALIZE_NUMPY).decode()

    def response(self, *args, **kwargs):
        obj = self._prepare_response_obj(args, kwargs)
        return self._app.response_class(orjson.dumps(obj, default=_default, option=orjson.OPT_SERIALIZE_NUMPY),
                                        mimetype=self.mimetype)


def _constant_at(doc, pos):
    """``NaN``, ``Infinity`` or ``-Infinity`` where orjson stopped in ``doc``, else None: the error then names it."""
    rest = doc[pos : pos + 9]
    rest = rest.decode("ascii", "replace") if isinstance(rest, (bytes, bytearray, memoryview)) else str(rest)
    return next((c for c in ("NaN", "Infinity", "-Infinity") if rest.startswith(c)), None)


def _default(value):
    """What orjson does not write itself, as Flask's provider writes it (dates, decimals, ``__html__``); an array orjson
    cannot write as it is (not contiguous, or of objects) as its list."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    return DefaultJSONProvider.default(value)


def request_json(tensor=None):
    """The request body decoded as JSON, whatever its Content-Type; a :class:`~serve.core.errors.BadRequest` says why not.

    ``tensor``: a key, or keys, whose array of integers (a batch of images' pixels) is read
    straight into an int64 NumPy array (:mod:`serve.json_tensors`) instead of nested lists.
    """
    try:
        if tensor:
            return json_tensors.loads(request.get_data(cache=True), tensor, current_app.json.loads)
        return current_app.json.loads(request.get_data(cache=True))
    except ValueError as e:
        raise BadRequest(f"the body is not valid JSON ({e})") from None


def init_app(app):
    app.json = JSONProvider(app)
    app.register_error_handler(RecursionError, _recursion_error)
    app.wsgi_app = _GuardedInputMiddleware(app.wsgi_app)


def drain_refused_body(response):
    """Read what a refused request left of its body (up to DRAIN_LIMIT, within DRAIN_TIMEOUT_S), so keep-alive holds."""
    if response.status_code < 400:  # an answered request read its body: nothing to drain (and no header to parse)
        return response
    length = request.content_length
    if not length:
        return response
    sock = request.environ.get("gunicorn.socket")  # None in the test client, whose body is in memory
    if length > DRAIN_LIMIT:
        _stop_reading(sock)
        return response
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    saved = sock.gettimeout() if sock is not None else None
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            if sock is not None:
                sock.settimeout(remaining)
            if not request.stream.read(65536):
                break
    except Exception:  # too slow, or unreadable: the connection closes after the answer
        _stop_reading(sock)
    finally:
        if sock is not None:
            _restore_timeout(sock, saved)
    return response


def _stop_reading(sock):
    """Shut ``sock`` for reading: every later read of the unread body ends at once, and the connection closes."""
    if sock is None:
        return
    try:
        sock.shutdown(socket.SHUT_RD)
    except OSError:  # nosec B110  # already gone: nothing left to stop
        pass


def _restore_timeout(sock, saved):
    try:
        sock.settimeout(saved)
    except OSError:  # nosec B110  # the socket is shut already
        pass


def _recursion_error(e):
    if not _raised_in_json_package(e):
        raise e  # Flask's own 500 path: logged, and answered by the app's 500 handler
    return jsonify(error=f"the body is not valid JSON ({NESTED_TOO_DEEPLY})"), 400


def _raised_in_json_package(e):
    tb = e.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_filename.startswith(_JSON_PACKAGE)


class _GuardedInputMiddleware:
    """WSGI middleware: ``wsgi.input`` wrapped in :class:`_GuardedInput`."""

    def __init__(self, wsgi_app):
        self.wsgi_app = wsgi_app

    def __call__(self, environ, start_response):
        if environ.get("wsgi.input") is not None:
            environ["wsgi.input"] = _GuardedInput(environ["wsgi.input"])
        return self.wsgi_app(environ, start_response)


class _GuardedInput:
    """A WSGI input stream whose read errors (the server's, from the client's bytes) are a ``BadRequest``."""

    def __init__(self, stream):
        self._stream = stream

    def read(self, *args):
        return self._guarded(self._stream.read, *args)

    def readline(self, *args):
        return self._guarded(self._stream.readline, *args)

    def readlines(self, *args):
        return self._guarded(self._stream.readlines, *args)

    def __iter__(self):
        return self

    def __next__(self):
        line = self.readline()
        if not line:
            raise StopIteration
        return line

    def __getattr__(self, name):
        return getattr(self._stream, name)

    @staticmethod
    def _guarded(method, *args):
        try:
            return method(*args)
        except HTTPException:
            raise
        except Exception as e:  # gunicorn's ParseException, NoMoreData, a reset socket...
            raise BadRequest(f"the request body cannot be read: {type(e).__name__}: {e}") from None
