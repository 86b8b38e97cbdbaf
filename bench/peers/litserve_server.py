"""LitServe serving ``model.tflite``, as LitServe's docs set a CPU server up for throughput.

    bench/peers/.venvs/litserve/bin/python bench/peers/litserve_server.py --model-dir models/cifar10 --port 8000

One ``LitAPI`` on ``POST /predict`` takes either body its docs show: JSON (here ``{"instances":
[N x 32 x 32 x 3 ints]}``, TF Serving's shape) or a multipart upload (``decode_request`` reads the
PNG files of field ``file``, as LitServe's image examples do). Both answer ``{"predictions": [[10
probabilities], ...]}``. Settings from ``LitServer``'s docstring (0.2.19): ``accelerator="cpu"``,
``workers_per_device=2`` ("for CPU, set to the number of cores"), ``fast_queue=True`` (ZeroMQ,
"for high-throughput scenarios (>100 RPS)"), ``num_api_servers`` left to its default (one per
inference worker). Batching: up to 32 requests, waiting at most 5 ms. LitServe's docstring example
(``max_batch_size=8, batch_timeout=0.1``) is a GPU's, and a 100 ms wait would be added to every
request at c=1; 5 ms keeps that wait small, and 32 lets c=32's single images fill a batch.
A request of 64 images is one item of a batch; ``batch`` concatenates the items' images,
``unbatch`` splits the answer back.
"""

import argparse
import io

import litserve as ls
import numpy as np
from PIL import Image

from litert_model import LiteRTModel, model_file  # beside this script: run as a file, in its own environment

MAX_BATCH_SIZE = 32
BATCH_TIMEOUT_S = 0.005


def decode_png(data):
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.uint8)


class CIFARAPI(ls.LitAPI):
    def __init__(self, model_path, **kwargs):
        super().__init__(**kwargs)
        self.model_path = model_path

    def setup(self, device):
        self.model = LiteRTModel(self.model_path)
        self.model.probabilities(np.zeros((1, 32, 32, 3), np.uint8))

    def decode_request(self, request):
        if isinstance(request, dict):
            return np.asarray(request["instances"], dtype=np.uint8)
        files = request.getlist("file")  # a multipart form
        return np.stack([decode_png(f.file.read() if hasattr(f, "file") else f) for f in files])

    def batch(self, inputs):
        return np.concatenate(inputs), [len(x) for x in inputs]

    def predict(self, batch):
        images, sizes = batch
        return self.model.probabilities(images), sizes

    def unbatch(self, output):
        probabilities, sizes = output
        return np.split(probabilities, np.cumsum(sizes)[:-1])

    def encode_response(self, output):
        return {"predictions": np.asarray(output).tolist()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    api = CIFARAPI(model_file(args.model_dir), max_batch_size=MAX_BATCH_SIZE, batch_timeout=BATCH_TIMEOUT_S, api_path="/predict")
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=2, fast_queue=True)
    server.run(host="127.0.0.1", port=args.port, generate_client_file=False, log_level="warning")


if __name__ == "__main__":
    main()
