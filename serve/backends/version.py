"""One loaded version of the local backend: its runtime's model, its batcher and its info, and running it.

:class:`serve.backends.local.LocalBackend` decides which versions are loaded and which a request gets
(discovery, the model config, reloads, retiring); this module is what it holds for each of them.
"""

import dataclasses
import os

from contract.manifest import ManifestError
from serve.backends import published, runtimes
from serve.backends.batcher import Batcher
from serve.core.errors import ModelFailed, ServeError, Shed, Unavailable
from serve.core.model import ModelInfo, Prediction


@dataclasses.dataclass(frozen=True)
class Batching:
    """How each loaded version's :class:`Batcher` batches (the local backend's settings)."""

    max_batch: int
    max_wait_s: float
    on_batch: object = None
    timeout_s: float | None = None  # how long a call without a deadline (the readiness probe) may wait


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
            raise Unavailable(f"version {version} is refused: {e}") from None
        model = runtimes.load(runtime, path, threads)
        info = ModelInfo.build(name, version, model.signatures, served, versions=(version,), runtime=runtime)
        batcher = Batcher(model.pixels, max_batch=batching.max_batch, max_wait_s=batching.max_wait_s,
                          on_batch=batching.on_batch, timeout_s=batching.timeout_s)
        return cls(version, model, batcher, info)

    def predict(self, images, deadline=None):
        """``serving_default`` on uint8 pixels through this version's batcher; a batch of none without a model call."""
        if not len(images):
            return Prediction(self.version, {key: value.copy() for key, value in self.model.empty_outputs.items()})
        try:
            return Prediction(self.version, self.batcher.submit(images, deadline))
        except TimeoutError as e:
            raise Shed(str(e), "timeout") from None
        except ServeError:
            raise
        except Exception as e:
            raise ModelFailed(f"prediction failed: {type(e).__name__}: {e}") from e

    def run(self, signature_name, inputs):
        """Another signature this version's runtime runs (the core has checked the signature and its inputs)."""
        return self.model.call(signature_name, inputs, lambda images: self.predict(images).outputs)

    def close(self):
        """End this version's batcher thread."""
        self.batcher.close()
