"""The serving core: one typed inference service that every protocol adapter calls.

``model``: the :class:`~serve.core.model.Backend` protocol and the frozen
:class:`~serve.core.model.ModelInfo` of a loaded version; ``service``: the
:class:`~serve.core.service.InferenceService` (routing, limits, decoding, prediction, ranking,
confidence, metrics); ``decode``: the one image decoder; ``errors``: the one error. Nothing here
imports Flask. docs/serving.md draws the whole path of a request.
"""

from serve.core.errors import NotServed, ServeError, Shed
from serve.core.model import Backend, Confidence, ModelInfo, Prediction
from serve.core.service import (Answered, Classification, Inference, InferenceService, Limits, Ranked, Refused, Upload,
                                float32_list, parse_top_k)

__all__ = ["Answered", "Backend", "Classification", "Confidence", "Inference", "InferenceService", "Limits", "ModelInfo",
           "NotServed", "Prediction", "Ranked", "Refused", "ServeError", "Shed", "Upload", "float32_list", "parse_top_k"]
