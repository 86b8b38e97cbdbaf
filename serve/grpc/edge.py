"""Where a gRPC call meets the core: its request's id, caller and deadline in, its refusal out as a status code.

Every method of every servicer is wrapped by :func:`edge`: a :class:`~serve.core.errors.ServeError` leaves
with the gRPC code of its kind (:data:`serve.core.errors.WIRE`), its message (worded by the protocol where it
has words of its own) and a ``retry-after`` trailer when it says when to retry; anything unexpected is logged
and answered ``INTERNAL`` with its kind only, never ``UNKNOWN`` with a traceback. A call whose caller has gone
(its deadline passed, or it cancelled) ends ``DEADLINE_EXCEEDED`` or ``CANCELLED``.
"""

import contextvars
import functools
import logging
import time

import grpc

from serve.core.errors import ServeError
from serve.core.request import InferRequest
from serve.telemetry import logs

log = logging.getLogger(__name__)
#: The identity the gate admitted the call this thread answers as (serve.grpc.interceptors sets it).
caller = contextvars.ContextVar("serve_grpc_caller", default=None)


class Failure(Exception):
    """A call's end as a gRPC code and message, for what no :class:`ServeError` kind says (the caller gone, a health
    service unknown). Raise it inside :func:`edge`; ``context.abort`` there would be taken for an unexpected error."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


def code_of(e):
    """The ``grpc.StatusCode`` a :class:`ServeError` leaves as."""
    return grpc.StatusCode[e.code]


def edge(words=str):
    """Wrap a servicer method: every refusal a status code (``words(error)``: its message), the caller's presence checked first."""

    def wrap(method):
        @functools.wraps(method)
        def call(self, request, context):
            try:
                alive(context)
                return method(self, request, context)
            except Failure as e:
                code, message = e.code, str(e)
            except ServeError as e:
                code, message = code_of(e), words(e)
                if e.retry_after is not None:
                    context.set_trailing_metadata((("retry-after", str(e.retry_after)),))
            except Exception as e:  # never UNKNOWN with a traceback: log it here, answer its kind only
                log.exception("unhandled error in %s", method.__name__)
                code, message = grpc.StatusCode.INTERNAL, f"internal error: {type(e).__name__}"
            context.abort(code, message)

        return call

    return wrap


def alive(context):
    """Raise :class:`Failure` when the caller has gone: its deadline passed, or it cancelled the call."""
    if context.is_active():
        return
    remaining = context.time_remaining()
    if remaining is not None and remaining <= 0:
        raise Failure(grpc.StatusCode.DEADLINE_EXCEEDED, "the call's deadline passed before it was answered")
    raise Failure(grpc.StatusCode.CANCELLED, "the caller cancelled the call")


def grpc_request(context, inputs, **fields):
    """An :class:`InferRequest` of ``inputs`` and ``fields``, with this call's id, caller and deadline."""
    remaining = context.time_remaining()
    deadline = None if remaining is None else time.monotonic() + remaining
    return InferRequest(inputs, deadline=deadline, id=logs.request_id(), caller=caller.get(), **fields)
