"""One loaded version of the local backend: its runtime's model, its batcher and its info, and running it.

:class:`serve.backends.local.LocalBackend` decides which versions are loaded and which a request gets
(discovery, the model config, reloads, retiring); this module is what it holds for each of them.
"""

import dataclasses
import os

from contract.manifest import ManifestError
from serve import published
from serve.backends import runtimes
from serve.backends.batcher import Batcher, Overloaded
from serve.core.errors import ServeError, Shed
from serve.core.model import ModelInfo, Prediction


@dataclasses.dataclass(frozen=True)
class Batching:
    """How each loaded version's :class:`Batcher` batches and sheds (the local backend's settings)."""

    max_batch: int
    max_wait_s: float
    on_batch: object = None
    max_queue: int | None = None
    timeout_s: float | None = None
    on_waiting: object = None


@dataclasses.dataclass(frozen=True)
class LoadedVersion:
    """One loaded version: its runtime's model, its batcher and its info."""

    version: int
    model: object
    batcher: Batcher
    info: ModelInfo

    @classmethod
    def load(cls, model_dir, version, name, runtime, threads, batching: Batching):
        """``model_dir/version`` in ``runtime``; its manifest is read first, so a refused one is never loaded."""
        path = os.path.join(model_dir, str(version))
        try:
            served = published.manifest(path)
        except ManifestError as e:
            raise ServeError(f"version {version} is refused: {e}", 503) from None
        model = runtimes.load(runtime, path, threads)
        info = ModelInfo.build(name, version, model.signature_defs, served, versions=(version,), runtime=runtime)
        batcher = Batcher(model.pixels, max_batch=batching.max_batch, max_wait_s=batching.max_wait_s,
                          on_batch=batching.on_batch, max_queue=batching.max_queue, timeout_s=batching.timeout_s,
                          on_waiting=batching.on_waiting)
        return cls(version, model, batcher, info)

    def predict(self, images):
        """``serving_default`` on uint8 pixels through this version's batcher; a batch of none without a model call."""
        if not len(images):
            return Prediction(self.version, {key: value.copy() for key, value in self.model.empty_outputs.items()})
        try:
            return Prediction(self.version, self.batcher.submit(images))
        except Overloaded as e:
            raise Shed(str(e), "queue_full") from None
        except TimeoutError as e:
            raise Shed(str(e), "timeout") from None
        except Exception as e:
            raise ServeError(f"prediction failed: {type(e).__name__}: {e}", 500) from e

    def run(self, signature_name, inputs):
        """Any signature this version's runtime runs; ``serving_default`` on pixels goes through the batcher."""
        if signature_name not in self.info.signature_defs:
            raise ServeError(f"signature {signature_name!r} not found; this model has {sorted(self.info.signature_defs)}", 400)
        try:
            return self.model.call(signature_name, inputs, lambda images: self.predict(images).outputs)
        except runtimes.InputError as e:
            raise ServeError(str(e), 400) from None

    def close(self):
        """End this version's batcher thread."""
        self.batcher.close()
