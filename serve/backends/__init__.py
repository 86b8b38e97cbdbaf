"""Prediction backends: one small interface, three implementations.

* ``LocalBackend`` - the exported model in this process, run by one of :mod:`serve.runtimes`
  (LiteRT float32 or int8, or the SavedModel in TensorFlow), with concurrent requests
  micro-batched.
* ``TFServingRestBackend`` - a TF Serving REST endpoint.
* ``TFServingGrpcBackend`` - a TF Serving gRPC ``PredictionService``.

Every backend offers:

* ``predict(images)``: uint8 ``[N, 32, 32, 3]`` -> ``{output key: array [N, ...]}``
  through the ``serving_default`` signature;
* ``run(signature_name, inputs, version=None)``: any signature, ``{input key: array}``
  (strings as ``object`` arrays of ``bytes``) -> ``{output key: array}``;
* ``ready()``: raises :class:`serve.errors.ServeError` unless a probe prediction succeeds;
* ``metadata()``: ``name``, ``version``, ``versions``, ``architecture``, ``class_names``,
  ``signature_defs`` (TF Serving's JSON form) and ``confidence_outputs`` (which of
  :data:`serve.signatures.CONFIDENCE_OUTPUTS` the model answers, worked out once with the
  signatures); the local backend adds ``runtime``.

Failures raise :class:`serve.errors.ServeError` with the HTTP status to answer with (503: try again later).
"""

from serve import runtimes, settings
from serve.backends.interface import probe_batch
from serve.backends.local import LocalBackend
from serve.backends.tfserving import TFServingGrpcBackend, TFServingRestBackend

__all__ = ["LocalBackend", "TFServingGrpcBackend", "TFServingRestBackend", "from_config", "probe_batch"]

#: The TF Serving backends by SERVE_BACKEND, with the setting that says where TF Serving is.
REMOTE = {
    "tfserving-rest": (TFServingRestBackend, "TFSERVING_REST_URL"),
    "tfserving-grpc": (TFServingGrpcBackend, "TFSERVING_GRPC_TARGET"),
}


def from_config(config, on_batch=None, on_load=None, on_skip=None):
    """The backend ``config["BACKEND"]`` names, built from the app's configuration."""
    kind = config["BACKEND"]
    if kind == "local":
        return LocalBackend(
            config["MODEL_DIR"], config["MODEL_NAME"], config["MAX_BATCH"], config["BATCH_WAIT_MS"], on_batch,
            poll_s=config.get("MODEL_POLL_S", settings.DEFAULT_MODEL_POLL_S),
            runtime=config.get("RUNTIME") or runtimes.DEFAULT_RUNTIME,
            threads=config.get("RUNTIME_THREADS") or None,
            on_load=on_load, on_skip=on_skip,
        )
    if kind in REMOTE:
        backend_class, address = REMOTE[kind]
        if not config.get(address):
            raise ValueError(f"SERVE_BACKEND={kind} needs {address}")
        return backend_class(
            config[address], config["MODEL_NAME"], config["TFSERVING_TIMEOUT_S"], config["MODEL_DIR"], on_batch,
            max_batch=config.get("TFSERVING_MAX_BATCH", settings.DEFAULT_TFSERVING_MAX_BATCH),
        )
    raise ValueError(f"unknown backend {kind!r}; choose local, tfserving-rest or tfserving-grpc")
