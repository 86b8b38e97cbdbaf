"""The gRPC server's interceptors: request ids and access lines (:class:`RequestIds`), then the core's gate (:class:`Admission`).

**Request ids.** Every unary call gets an id: the caller's ``x-request-id`` metadata value when it is sane (HTTP's
rule), else a new one. It goes back at once in the call's initial metadata (so a refusal carries it too), onto the
call's span when traces are on, onto every log line written while the call runs, and into one ``serve.access``
line when the call ends: the id, the method, the status code's name, the model version and images answered,
the duration and the caller's address. Every call is also counted by method and status code
(``serve_grpc_requests_total``) and timed by method (``serve_grpc_request_duration_seconds``).

**Admission.** The core's :class:`serve.core.admission.Gate` admits every call (the ``api`` area, one budget
with HTTP's; health's calls the ``open`` area), from the key in its metadata (``authorization: Bearer KEY`` or
``x-api-key: KEY``) and its peer's address, *before* its message is read: a unary method is served as a
client-streaming one whose behaviour runs at once, so a call refused never waits for its message. At most
``threads`` calls of this worker are admitted at once; the next is refused at once with ``RESOURCE_EXHAUSTED``,
so calls that never send their message cannot hold every thread, and health's calls keep threads of their own.

Typical usage (``serve.grpc.server.make_server`` puts them after the tracing interceptor)::

    grpc.server(pool, interceptors=[*tracing.grpc_interceptors(app), RequestIds(metrics), Admission(gate, threads)])
"""

import threading
import time

import grpc

from serve.core.admission import Caller
from serve.core.errors import ServeError, Unauthenticated
from serve.grpc.edge import caller, code_of
from serve.telemetry import logs, tracing

#: The metadata key of the id, both ways (gRPC metadata keys are lower case).
METADATA_KEY = "x-request-id"
#: Methods of the ``open`` area, like ``/healthz`` and ``/readyz``: a kubelet's probe sends no key.
OPEN_METHODS = ("/grpc.health.v1.Health/",)
HOW_TO_SEND_A_KEY = "send the metadata 'authorization: Bearer KEY' or 'x-api-key: KEY'"


def _unary(handler, behaviour):
    """``handler`` with its unary-response behaviour (unary or client-streaming) replaced by ``behaviour``."""
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(behaviour, request_deserializer=handler.request_deserializer,
                                                    response_serializer=handler.response_serializer)
    return grpc.unary_unary_rpc_method_handler(behaviour, request_deserializer=handler.request_deserializer,
                                               response_serializer=handler.response_serializer)


def _behaviour(handler):
    return handler.stream_unary if handler.request_streaming else handler.unary_unary


class RequestIds(grpc.ServerInterceptor):
    """An id for every unary-response call, sent back in the initial metadata and logged (and counted) with its outcome."""

    def __init__(self, metrics=None):
        self.metrics = metrics  # serve.telemetry.metrics.Metrics, or None: not counted

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler.response_streaming:
            return handler
        given = next((value for key, value in handler_call_details.invocation_metadata or ()
                      if key == METADATA_KEY and isinstance(value, str)), None)
        method = handler_call_details.method
        answer = _behaviour(handler)

        def with_id(request, context):
            started = time.perf_counter()
            with logs.call(logs.new_id(given)) as state:
                context.send_initial_metadata(((METADATA_KEY, state.request_id),))
                tracing.tag(state.request_id)
                failed = True
                try:
                    response = answer(request, context)
                    failed = False
                    return response
                finally:
                    code = context.code()
                    status = code.name if code is not None else ("UNKNOWN" if failed else "OK")
                    taken = time.perf_counter() - started
                    logs.log_call(state, method, status, taken, peer_address(context.peer()))
                    if self.metrics is not None:
                        self.metrics.grpc_requests.labels(method, status).inc()
                        self.metrics.grpc_latency.labels(method).observe(taken)

        return _unary(handler, with_id)


class Admission(grpc.ServerInterceptor):
    """The core's gate on every unary call, before its message is read; at most ``max_calls`` ``api`` calls at once."""

    def __init__(self, gate, max_calls):
        self.gate = gate
        self.max_calls = max_calls
        self._calls = threading.BoundedSemaphore(max_calls)

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler.request_streaming or handler.response_streaming:
            return handler
        method = handler_call_details.method
        area = "open" if method.startswith(OPEN_METHODS) else "api"
        key = presented_key(handler_call_details.invocation_metadata)
        answer = handler.unary_unary
        bounded = area == "api"
        gate = self.gate if self.gate.guarded(area) else None

        def admitted(requests, context):
            if bounded and not self._calls.acquire(blocking=False):
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"this worker answers at most {self.max_calls} calls at once; retry shortly")
            try:
                identity = None
                if gate is not None:
                    try:
                        identity = gate.admit(Caller(key, peer_address(context.peer())), area).identity
                    except ServeError as e:
                        if e.retry_after is not None:
                            context.set_trailing_metadata((("retry-after", str(e.retry_after)),))
                        context.abort(code_of(e), _message(e))
                try:
                    request = next(requests, None)
                except Exception:  # the call ended (cancelled, or its deadline passed) while its message was awaited
                    context.abort(grpc.StatusCode.CANCELLED, "the call ended before its request message came")
                if request is None:  # the caller closed the call without its message
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the call ended before its request message came")
                token = caller.set(identity)
                try:
                    return answer(request, context)
                finally:
                    caller.reset(token)
            finally:
                if bounded:
                    self._calls.release()

        return grpc.stream_unary_rpc_method_handler(admitted, request_deserializer=handler.request_deserializer,
                                                    response_serializer=handler.response_serializer)


def _message(e):
    if isinstance(e, Unauthenticated) and e.reason == "missing_key":
        return f"this server needs an API key: {HOW_TO_SEND_A_KEY}"
    return str(e)


def peer_address(peer):
    """The address in gRPC's ``context.peer()`` (``ipv4:1.2.3.4:5678``, ``ipv6:[::1]:5678``), as HTTP's ``remote_addr``."""
    kind, _, rest = (peer or "").partition(":")
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]") or "unknown"
    if kind == "ipv4":
        return rest.rpartition(":")[0] or "unknown"
    return rest or "unknown"


def presented_key(metadata):
    """The key a call's metadata carries (``x-api-key``, else an ``authorization`` Bearer token), or None."""
    values = {}
    for key, value in metadata or ():
        if isinstance(value, str):
            values.setdefault(key.lower(), value.strip())
    if values.get("x-api-key"):
        return values["x-api-key"]
    scheme, _, token = values.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return None
