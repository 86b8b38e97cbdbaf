"""Who may call the gRPC server: HTTP's guards, the API area's rate limit and the API keys of
:mod:`serve.security`, read from a call's metadata, on every method but health's.

:class:`Guard` is the server interceptor :func:`serve.protocols.tfserving_grpc.make_server` installs, so TF
Serving's gRPC API and the Open Inference Protocol over gRPC are guarded alike.
"""

import logging

import grpc
from werkzeug.exceptions import TooManyRequests

from contract import TFSERVING_REST_PREFIX
from serve import logs
from serve.protocols.tfserving_grpc import status_code
from serve.security import matches

log = logging.getLogger(__name__)

#: Methods that need no API key, like ``/healthz`` and ``/readyz``: a kubelet's probe sends none.
OPEN_METHODS = ("/grpc.health.v1.Health/",)


class Guard(grpc.ServerInterceptor):
    """HTTP's guards on every call but health's: the API area's rate limit, then the API keys of :mod:`serve.security`.

    With a rate limit set (``SERVE_RATE_LIMIT_API`` or ``SERVE_RATE_LIMIT``), a call goes through the
    app's own before-request hooks as a ``POST`` to TF Serving's REST predict route, carrying the
    call's key and the caller's address: Flask-Limiter counts it in the same bucket and store as the
    caller's HTTP requests (one budget for the ``api`` area, whatever the protocol), and the key is
    checked by the same hook, in the same order (limit first, so key guessing is limited too).
    Without one, the key is checked here with :func:`serve.security.matches`.
    """

    def __init__(self, app):
        self.app = app
        security = app.extensions["serve.security"]
        self.keys = security.api_keys
        self.metrics = security.metrics
        self.limited = security.limiter is not None
        self.path = f"{TFSERVING_REST_PREFIX}/{app.extensions['serve.service'].model_name}:predict"

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(OPEN_METHODS) or handler.unary_unary is None:
            return handler
        if not self.keys and not self.limited:
            return handler
        metadata = handler_call_details.invocation_metadata
        answer = handler.unary_unary

        def guarded(request, context):
            code, message = self._refusal(presented_key(metadata), context.peer())
            if code is not None:
                context.abort(code, message)
            return answer(request, context)

        return grpc.unary_unary_rpc_method_handler(
            guarded, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)

    def _refusal(self, key, peer):
        """``(code, message)`` when the call may not go on, else ``(None, None)``."""
        if self.limited:
            return self._through_http_hooks(key, peer)
        if key is not None and matches(key, self.keys):
            return None, None
        reason = "missing_key" if key is None else "wrong_key"
        self.metrics.rejections.labels(reason, "api").inc()
        return grpc.StatusCode.UNAUTHENTICATED, (
            "this server needs an API key: send the metadata 'authorization: Bearer KEY' or 'x-api-key: KEY'"
            if key is None else "the API key is not valid")

    def _through_http_hooks(self, key, peer):
        headers = {"X-API-Key": key} if key is not None else {}
        headers[logs.HEADER] = logs.request_id() or ""  # the hooks' log lines name the call's id
        with self.app.test_request_context(self.path, method="POST", headers=headers,
                                           environ_base={"REMOTE_ADDR": peer_address(peer)}):
            try:
                response = self.app.preprocess_request()
            except TooManyRequests as e:
                self.metrics.rejections.labels("rate_limited", "api").inc()
                return grpc.StatusCode.RESOURCE_EXHAUSTED, f"too many requests: the limit is {e.description}"
            except Exception:
                log.exception("the rate limit check failed")
                return grpc.StatusCode.INTERNAL, "internal error: the rate limit check failed"
        if response is None:
            return None, None
        body = response.get_json(silent=True) or {}
        code = grpc.StatusCode.UNAUTHENTICATED if response.status_code == 401 else status_code(response.status_code)
        message = body.get("error", "refused") if isinstance(body, dict) else "refused"
        if code == grpc.StatusCode.UNAUTHENTICATED and message.startswith("this route needs"):
            message = "this server needs an API key: send the metadata 'authorization: Bearer KEY' or 'x-api-key: KEY'"
        return code, message


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
