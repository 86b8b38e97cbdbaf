"""``grpc.health.v1.Health``: ``SERVING`` while the model answers its probe (the core's readiness, as ``/readyz``'s).

It needs no key, like ``/readyz`` (a kubelet's gRPC probe sends none). A service name is one of
:data:`SERVICES`; any other is ``NOT_FOUND``, its name bounded in the message so that the status stays the
right one (a long name must not turn it into ``RESOURCE_EXHAUSTED`` by overflowing the trailers).
"""

import logging
import threading

import grpc

from serve.core.errors import ServeError, echo
from serve.grpc.edge import Failure, edge
from tfs_protos.grpc_health.v1 import health_pb2, health_pb2_grpc

log = logging.getLogger(__name__)

#: What the health service answers for: the whole server (""), and each service by name.
SERVICES = ("", "tensorflow.serving.PredictionService", "tensorflow.serving.ModelService", "inference.GRPCInferenceService")
#: Seconds between a ``Watch`` stream's looks at readiness (a probe runs at most once a second anyway).
WATCH_INTERVAL_S = 1.0
#: ``Watch`` streams one worker keeps open at once: each holds a server thread.
MAX_WATCHES = 4


class HealthService(health_pb2_grpc.HealthServicer):
    """``Check`` and ``Watch`` over one :class:`~serve.core.service.InferenceService`'s readiness."""

    def __init__(self, service):
        self.service = service
        self._watches = threading.BoundedSemaphore(MAX_WATCHES)

    def _status(self, name):
        if name not in SERVICES:
            return health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
        try:
            self.service.ready()
        except ServeError:
            return health_pb2.HealthCheckResponse.NOT_SERVING
        return health_pb2.HealthCheckResponse.SERVING

    @edge()
    def Check(self, request, context):
        if request.service not in SERVICES:
            raise Failure(grpc.StatusCode.NOT_FOUND, f"unknown service {echo(request.service)}; this server knows "
                          f"{', '.join(repr(s) for s in SERVICES)}")
        return health_pb2.HealthCheckResponse(status=self._status(request.service))

    def Watch(self, request, context):
        if not self._watches.acquire(blocking=False):
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"this worker keeps at most {MAX_WATCHES} Watch streams open; use Check")
        try:
            gone = threading.Event()
            context.add_callback(gone.set)
            last = None
            while context.is_active():
                status = self._status(request.service)
                if status != last:
                    yield health_pb2.HealthCheckResponse(status=status)
                    last = status
                gone.wait(WATCH_INTERVAL_S)
        except Exception:  # the stream ends cleanly; a fault is logged, never sent as a traceback
            log.exception("unhandled error in Watch")
        finally:
            self._watches.release()
