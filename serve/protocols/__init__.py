"""The protocols: thin adapters between a wire format and :class:`serve.core.service.InferenceService`.

Each module translates its requests into calls on the service and the service's typed answers
(or its one :class:`~serve.core.errors.ServeError`) back into its wire format, and nothing else:
no protocol imports a backend, a runtime, the batcher or the decoder (``tests/project/test_layering.py``).

* :mod:`~serve.protocols.web`: the upload form (``/``);
* :mod:`~serve.protocols.api`: the JSON API (``/api/v1``);
* :mod:`~serve.protocols.tfserving_rest`: TF Serving's REST API (``/v1/models``);
* :mod:`~serve.protocols.v2_rest`: the Open Inference Protocol over HTTP (``/v2``);
* :mod:`~serve.protocols.tfserving_grpc`: TF Serving's gRPC API and gRPC health, on ``GRPC_PORT`` in each worker;
* :mod:`~serve.protocols.v2_grpc`: the Open Inference Protocol over gRPC, on the same server.

A new protocol is one more module here that calls the service (docs/serving.md).
"""

from flask import current_app, jsonify


def service():
    """This app's :class:`~serve.core.service.InferenceService`."""
    return current_app.extensions["serve.service"]


def settings():
    """This app's :class:`~serve.settings.Settings`."""
    return current_app.extensions["serve.settings"]


def json_error(e):
    """A :class:`~serve.core.errors.ServeError` as every JSON protocol answers it: ``{"error": ...}``, its status,
    and ``Retry-After`` when the error says when to retry."""
    response = jsonify(error=str(e))
    response.status_code = e.status
    if e.retry_after is not None:
        response.headers["Retry-After"] = str(e.retry_after)
    return response
