"""The serving core: one request type, one service that answers it, one gate that admits its caller.

``request``: :class:`InferRequest` (its inputs as :class:`Tensor` s, as the wire carried them) and
:class:`InferResponse`; ``service``: :class:`InferenceService`, which checks every request once (deadline,
routing, signature, shedding, inputs, pixel budgets), decodes, predicts, ranks and counts; ``tensors``: the
one set of rules an input's values meet; ``admission``: :class:`Gate` (API keys, rate limits) for HTTP and gRPC
alike; ``model``: the :class:`Backend` protocol and the frozen, typed :class:`ModelInfo`; ``decode``: the one
image decoder; ``errors``: the one error, its kinds and the table that puts each on the wire. Nothing here
imports Flask or gRPC. docs/serving.md draws the path of a request.
"""

from serve.core.errors import ServeError
from serve.core.model import Backend, ModelInfo, Prediction
from serve.core.request import Answered, InferRequest, InferResponse, Ranked, Refused, Tensor, Upload
from serve.core.service import InferenceService, Limits

__all__ = ["Answered", "Backend", "InferRequest", "InferResponse", "InferenceService", "Limits", "ModelInfo", "Prediction",
           "Ranked", "Refused", "ServeError", "Tensor", "Upload"]
