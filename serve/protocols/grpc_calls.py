"""Request ids over gRPC: what ``X-Request-Id`` is to HTTP (serve/logs.py), in a call's metadata.

Every unary call (both gRPC APIs and health's ``Check``) gets an id: the caller's ``x-request-id``
metadata value when it is sane (HTTP's rule), else a new one. It goes back at once in the call's
initial metadata (so a refusal carries it too), onto the call's span when traces are on, onto every
log line written while the call runs, and into one ``serve.access`` line when the call ends: the id,
the method, the status code's name, the model version and images answered, the duration and the
caller's address. With the app's metrics, every call is also counted by method and status code
(``serve_grpc_requests_total``) and timed by method (``serve_grpc_request_duration_seconds``), as
``serve_requests_total`` and ``serve_request_duration_seconds`` count and time HTTP requests.

Typical usage (``tfserving_grpc.make_server`` puts it after the tracing interceptor, before the guard)::

    grpc.server(pool, interceptors=[*tracing.grpc_interceptors(app), RequestIds(metrics), Guard(app)])
"""

import time

import grpc

from serve import logs, tracing
from serve.protocols.grpc_guard import peer_address

#: The metadata key of the id, both ways (gRPC metadata keys are lower case).
METADATA_KEY = "x-request-id"


class RequestIds(grpc.ServerInterceptor):
    """An id for every unary call, sent back in the initial metadata and logged (and counted) with the call's outcome."""

    def __init__(self, metrics=None):
        self.metrics = metrics  # serve.metrics.Metrics, or None: not counted

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        given = next((value for key, value in handler_call_details.invocation_metadata or ()
                      if key == METADATA_KEY and isinstance(value, str)), None)
        method = handler_call_details.method
        answer = handler.unary_unary

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

        return grpc.unary_unary_rpc_method_handler(
            with_id, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)
