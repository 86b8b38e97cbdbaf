"""What the gRPC transports share: one channel with the answer cap, the key in every call's metadata, and
gRPC's status codes turned into :class:`Unreachable` and :class:`RequestFailed` as the HTTP ones are."""

import math

from client.transports.common import MAX_ANSWER_BYTES, RequestFailed, Unreachable


class GrpcTransport:
    """One insecure channel to ``target``; every call has gRPC's own deadline, ``timeout`` seconds for the whole
    call however slowly the server answers, and an answer over :data:`MAX_ANSWER_BYTES` is refused by gRPC itself.

    ``metadata`` goes with every call: :func:`client.transports.authorize` puts the API key there.
    """

    def __init__(self, target, model, timeout, version=None):
        import grpc

        self._grpc = grpc
        self.target = target
        self.model = model
        self.timeout = timeout
        self.version = version
        self.metadata = ()
        self.channel = grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", MAX_ANSWER_BYTES)])

    def _call(self, method, request):
        try:
            return method(request, timeout=self.timeout if math.isfinite(self.timeout) else None, metadata=self.metadata)
        except self._grpc.RpcError as error:
            code, details = error.code(), error.details()
            if code == self._grpc.StatusCode.DEADLINE_EXCEEDED:
                raise Unreachable(f"no whole answer from {self.target} within {self.timeout:g} s (--timeout); gave up") from error
            if code == self._grpc.StatusCode.UNAVAILABLE:
                raise Unreachable(f"cannot reach {self.target}: {code.name}" + (f" ({details})" if details else "")) from error
            if code == self._grpc.StatusCode.RESOURCE_EXHAUSTED:  # an answer over the cap, or a request over the server's
                details = f"{details or code.name} (the client reads answers of at most {MAX_ANSWER_BYTES} bytes)"
            raise RequestFailed(details or code.name, code.name) from error
