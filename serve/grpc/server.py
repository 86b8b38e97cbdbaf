"""The gRPC server of one worker: TF Serving's gRPC API, the Open Inference Protocol's and ``grpc.health.v1``, on one port.

Typical usage (``serve/gunicorn_conf.py`` starts one in every worker, over that worker's app)::

    server, port = make_server(app, "0.0.0.0:8500")
    server.start()

The calls go through the tracing interceptor (traces on), :class:`~serve.grpc.interceptors.RequestIds` and
:class:`~serve.grpc.interceptors.Admission` (the core's gate, before a message is read; at most ``threads``
protocol calls at once), then to the servicers over the app's one :class:`~serve.core.service.InferenceService`:
a gRPC call and an HTTP request of one worker share its service, batcher, limits, budget and metrics.
"""

from concurrent import futures

import grpc

from serve.grpc import health, interceptors
from serve.protocols import tfserving_grpc, v2_grpc
from serve.telemetry import tracing
from tfs_protos.grpc_health.v1 import health_pb2_grpc

#: Seconds ``stop`` lets the calls under way finish.
STOP_GRACE_S = 5.0
#: Threads kept for health's calls beyond the protocols' (``Watch`` streams and ``Check`` s): a server full of
#: calls that never send their message still answers its probes.
HEALTH_THREADS = health.MAX_WATCHES + 2


def make_server(app, address, threads=16, reuse_port=True):
    """A gRPC server over ``app``'s service, gate and metrics, bound to ``address``; returns ``(server, port)``.

    ``reuse_port`` (gRPC's Linux default) lets every gunicorn worker bind the same port, the kernel
    handing each new connection to one of them. Raises ``RuntimeError`` when the address cannot be bound.
    """
    settings = app.extensions["serve.settings"]
    service = app.extensions["serve.service"]
    pool = threads + HEALTH_THREADS
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=pool, thread_name_prefix="grpc"),
        # The call's span (traces on), then its request id, then the gate: a refusal has both.
        interceptors=[*tracing.grpc_interceptors(app), interceptors.RequestIds(app.extensions["serve.metrics"]),
                      interceptors.Admission(app.extensions["serve.gate"], threads)],
        options=[
            ("grpc.max_receive_message_length", settings.max_upload_bytes),
            ("grpc.so_reuseport", 1 if reuse_port else 0),
        ],
        maximum_concurrent_rpcs=pool,  # beyond every thread busy: refused at once, never queued
    )
    tfserving_grpc.add_to_server(server, service)
    v2_grpc.add_to_server(server, service)
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthService(service), server)
    port = server.add_insecure_port(address)
    if not port:
        raise RuntimeError(f"could not bind gRPC to {address}")
    return server, port


def bind_address(host, port):
    """``host:port`` as gRPC takes it (an IPv6 address in brackets)."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
