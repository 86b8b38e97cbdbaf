"""Five ways to reach a model: this project's HTTP API (:mod:`.api`), TF Serving's REST API
(:mod:`.tfserving_rest`), TF Serving's gRPC API (:mod:`.tfserving_grpc`: TF Serving's own, or this
project's server's gRPC port), and the Open Inference Protocol (KServe v2) over HTTP (:mod:`.v2`) and
gRPC (:mod:`.v2_grpc`) that Triton, KServe, MLServer and this project's server speak; what they share
is in :mod:`.common`, the HTTP session in :mod:`.http`, the gRPC channel in :mod:`.grpc_call`.

Each transport has the same three calls: ``predict(batch, top_k)`` with ``batch`` a list of
``(filename, bytes)`` returns one result dict per image, in order (``label``, ``class_id``,
``probability``, ``top_k``, ``ood_score`` and ``in_distribution``, None where the model has no
such output; or ``error`` and ``status``), ``health()`` returns a dict describing a
ready model, and ``info()`` the model's name, version, classes and signatures. They raise
:class:`Unreachable` when there is no ready server to talk to, and :class:`RequestFailed` when the
server refused a whole request. None of them imports TensorFlow.
"""

from client.transports.api import ApiTransport
from client.transports.common import (DEFAULT_MAX_WAIT_S, DEFAULT_RETRIES, RETRY_STATUSES, UNKNOWN_LABEL, RequestFailed,
                                      Unreachable, authorize, top_k_from_probabilities)
from client.transports.tfserving_grpc import TFServingGrpcTransport
from client.transports.tfserving_rest import TFServingRestTransport
from client.transports.v2 import V2Transport
from client.transports.v2_grpc import V2GrpcTransport

__all__ = [
    "DEFAULT_MAX_WAIT_S", "DEFAULT_RETRIES", "RETRY_STATUSES", "UNKNOWN_LABEL", "ApiTransport", "RequestFailed",
    "TFServingGrpcTransport", "TFServingRestTransport", "Unreachable", "V2GrpcTransport", "V2Transport", "authorize",
    "top_k_from_probabilities",
]
