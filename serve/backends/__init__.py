"""Prediction backends: three implementations of :class:`serve.core.model.Backend`.

* :class:`~serve.backends.local.LocalBackend` - the exported model in this process, run by one of
  :mod:`serve.backends.runtimes` (LiteRT float32 or int8, or the SavedModel in TensorFlow), with
  concurrent requests micro-batched by :mod:`serve.backends.batcher`; each loaded version is a
  :class:`~serve.backends.version.LoadedVersion`, and ``LocalBackend`` decides which are loaded.
* :class:`~serve.backends.tfserving.TFServingRestBackend` - a TF Serving REST endpoint.
* :class:`~serve.backends.tfserving.TFServingGrpcBackend` - a TF Serving gRPC ``PredictionService``.

The interface itself (``info``, ``infer``, ``run``, ``ready``, ``close``) and the frozen
:class:`~serve.core.model.ModelInfo` each describes its version with are in :mod:`serve.core.model`.
"""

from serve.backends.local import LocalBackend
from serve.backends.tfserving import TFServingGrpcBackend, TFServingRestBackend

__all__ = ["LocalBackend", "TFServingGrpcBackend", "TFServingRestBackend", "from_settings"]


def from_settings(settings, metrics=None):
    """The backend ``settings.backend`` names (a :class:`serve.settings.Settings`), its hooks counted in ``metrics``."""
    on_batch = metrics.batch_size.observe if metrics is not None else None
    if settings.backend == "local":
        return LocalBackend(
            settings.model_dir, settings.model_name, settings.runtime, max_batch=settings.max_batch,
            batch_wait_ms=settings.batch_wait_ms, poll_s=settings.model_poll_s, threads=settings.runtime_threads or None,
            on_batch=on_batch, on_load=metrics and metrics.model_loaded, on_skip=metrics and metrics.version_skipped,
            timeout_s=settings.predict_timeout_s,
            config_file=settings.model_config_file, config_poll_s=settings.model_config_poll_s,
        )
    remote = {"tfserving-rest": (TFServingRestBackend, settings.tfserving_rest_url),
              "tfserving-grpc": (TFServingGrpcBackend, settings.tfserving_grpc_target)}
    backend_class, address = remote[settings.backend]  # Settings refuses any other kind, and a kind without its address
    return backend_class(address, settings.model_name, settings.tfserving_timeout_s, settings.model_dir, on_batch,
                         max_batch=settings.tfserving_max_batch)
