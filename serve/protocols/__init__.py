"""The protocols: codecs between a wire format and the core's one request and answer.

Each module turns its requests into an :class:`~serve.core.request.InferRequest` (or a metadata call of
:class:`~serve.core.service.InferenceService`) and the :class:`~serve.core.request.InferResponse`, or the one
:class:`~serve.core.errors.ServeError`, back into its wire format, and nothing else: no protocol checks a
count, a size, a type, a shape or a key, and none imports a backend, a runtime, the batcher or the decoder
(``tests/project/test_layering.py``).

* :mod:`~serve.protocols.web`: the upload form (``/``), and :mod:`~serve.protocols.api`: the JSON API (``/api/v1``),
  both reading uploads with :mod:`~serve.protocols.multipart`;
* :mod:`~serve.protocols.tfserving_rest` and :mod:`~serve.protocols.tfserving_grpc`: TF Serving's REST and gRPC APIs,
  with what they share (TF Serving's words, its metadata) in :mod:`~serve.protocols.tfserving`;
* :mod:`~serve.protocols.v2_rest` and :mod:`~serve.protocols.v2_grpc`: the Open Inference Protocol over HTTP and
  gRPC, with what they share (datatypes, tensors, outputs, metadata) in :mod:`~serve.protocols.v2`.

A new protocol is one more module here (docs/serving.md). The HTTP ones build their request with
:func:`http_request`, the gRPC ones with :func:`serve.grpc.edge.grpc_request`: the request id, the caller and the
deadline come from the exchange, the same way for every protocol of a kind.
"""

import math
import time

from flask import current_app, g, request

from serve.core.errors import BadRequest, echo
from serve.core.request import InferRequest

#: The HTTP request header with the caller's deadline, in seconds from its arrival (capped by SERVE_PREDICT_TIMEOUT_S).
DEADLINE_HEADER = "X-Request-Timeout"
_DEADLINE_ENVIRON = "HTTP_" + DEADLINE_HEADER.upper().replace("-", "_")


def service():
    """This app's :class:`~serve.core.service.InferenceService`."""
    return current_app.extensions["serve.service"]


def settings():
    """This app's :class:`~serve.settings.Settings`."""
    return current_app.extensions["serve.settings"]


def http_request(inputs, **fields):
    """An :class:`InferRequest` of ``inputs`` and ``fields``, with this HTTP request's id, caller and deadline."""
    state = g._get_current_object()
    return InferRequest(inputs, deadline=_deadline(state), id=getattr(state, "request_id", None),
                        caller=getattr(state, "serve_caller", None), **fields)


def _deadline(state):
    """``X-Request-Timeout`` as a ``time.monotonic()`` deadline from the request's arrival; None without the header."""
    value = request.environ.get(_DEADLINE_ENVIRON)
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise BadRequest(f"{DEADLINE_HEADER} must be a positive number of seconds, got {echo(value)}")
    return (getattr(state, "serve_started", None) or time.monotonic()) + seconds
