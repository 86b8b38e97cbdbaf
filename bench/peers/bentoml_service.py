"""BentoML serving ``model.tflite``: a ``@bentoml.service`` with two adaptive-batching APIs, as BentoML's docs write one.

    BENCH_MODEL_DIR=models/cifar10 bench/peers/.venvs/bentoml/bin/bentoml serve \
        bentoml_service:CIFAR10 --working-dir bench/peers --port 8000

* ``POST /predict``: JSON ``{"instances": [N x 32 x 32 x 3 ints]}`` (the ``np.ndarray`` argument
  named ``instances``: BentoML's JSON body is an object of the API's arguments, so TF Serving's
  body is taken unchanged), answered with the ``[N, 10]`` probabilities as a JSON array.
* ``POST /classify``: a multipart upload of PNG files in field ``file`` (a ``list`` of
  ``PIL.Image.Image``, BentoML's image input), answered the same way.

Both are ``@bentoml.api(batchable=True)``: BentoML's adaptive batching with the limits its 1.4
API gives by default (``max_batch_size=100``, ``max_latency_ms=60000``; the dispatcher sizes its
window from the traffic it sees). ``@bentoml.service(workers=2)``: two worker processes. The model
path comes from ``BENCH_MODEL_DIR`` (``bentoml serve`` imports the module).
"""

import os

import bentoml
import numpy as np
from PIL.Image import Image

from litert_model import LiteRTModel, model_file  # beside this script: run as a file, in its own environment


@bentoml.service(workers=2)
class CIFAR10:
    def __init__(self):
        self.model = LiteRTModel(model_file(os.environ["BENCH_MODEL_DIR"]))
        self.model.probabilities(np.zeros((1, 32, 32, 3), np.uint8))

    @bentoml.api(batchable=True)
    def predict(self, instances: np.ndarray) -> np.ndarray:
        return self.model.probabilities(instances)

    @bentoml.api(batchable=True)
    def classify(self, file: list[Image]) -> np.ndarray:
        return self.model.probabilities(np.stack([np.asarray(image.convert("RGB"), np.uint8) for image in file]))
