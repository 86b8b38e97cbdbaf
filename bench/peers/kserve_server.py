"""KServe's ``ModelServer`` serving ``model.tflite``: a custom ``kserve.Model``, as KServe's docs write one.

    bench/peers/.venvs/kserve/bin/python bench/peers/kserve_server.py --model-dir models/cifar10 \
        --http_port 8000 --workers 2

The model is registered as ``cifar10``, so it answers the same routes as this project:
``POST /v1/models/cifar10:predict`` (TF Serving's ``{"instances": [N x 32 x 32 x 3 ints]}``,
answered ``{"predictions": [[10 probabilities], ...]}``) and ``POST /v2/models/cifar10/infer``
(the Open Inference Protocol: one ``UINT8 [N, 32, 32, 3]`` input, answered with one ``FP32 [N,
10]`` output ``probabilities``). ``predict`` is a plain function, as in KServe's custom-model
guide. ``ModelServer``'s own flags are passed through (``--workers 2``: two uvicorn processes;
its gRPC port stays on, its default). KServe's ModelServer has no request batching of its own
(the ``batcher`` of an InferenceService is a Kubernetes sidecar), so none is configured.
"""

import argparse
import uuid

import numpy as np
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer, model_server

from litert_model import LiteRTModel, model_file  # beside this script: run as a file, in its own environment


class CIFARModel(Model):
    def __init__(self, name, model_dir):
        super().__init__(name)
        self.model_dir = model_dir
        self.model = None
        self.load()

    def load(self):
        self.model = LiteRTModel(model_file(self.model_dir))
        self.ready = True
        return self.ready

    def predict(self, payload, headers=None):
        if isinstance(payload, InferRequest):
            probabilities = self.model.probabilities(payload.inputs[0].as_numpy())
            output = InferOutput(name="probabilities", shape=list(probabilities.shape), datatype="FP32")
            output.set_data_from_numpy(probabilities, binary_data=False)
            return InferResponse(model_name=self.name, infer_outputs=[output], response_id=payload.id or str(uuid.uuid4()))
        probabilities = self.model.probabilities(np.asarray(payload["instances"], dtype=np.uint8))
        return {"predictions": probabilities.tolist()}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(parents=[model_server.parser], description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True)
    args, _ = parser.parse_known_args()
    ModelServer().start([CIFARModel("cifar10", args.model_dir)])
