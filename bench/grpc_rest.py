"""TF Serving's two APIs on one front end, in one run: gRPC (``tensor_content``) against REST (JSON ``instances``).

Starts ``python -m serve`` (gunicorn, its default workers) with gRPC on, then alternates the two
protocols round by round so that a noisy machine hurts both alike: 64-image requests from 2 clients
(images per second, and the median call), and 1-image requests from 1 client (median call). Each
gRPC client has its own channel (SO_REUSEPORT spreads connections over the workers), each REST
client its own keep-alive session. The client side uses the vendored protos, no TensorFlow.

Typical usage::

    python bench/grpc_rest.py --model-dir models/cifar10 --rounds 3 --seconds 10
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import requests

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tfs_protos import tensors  # noqa: E402
from tfs_protos.tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(model_dir, port, grpc_port):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "SERVE_LOG_FORMAT": "text"}
    process = subprocess.Popen(
        [sys.executable, "-m", "serve", "--model-dir", model_dir, "--host", "127.0.0.1", "--port", str(port),
         "--grpc-port", str(grpc_port)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if all(requests.get(f"{url}/readyz", timeout=5).status_code == 200 for _ in range(8)):
                return process, url
        except requests.RequestException:
            pass
        time.sleep(0.5)
    process.kill()
    raise SystemExit("the server was not ready within 300 s")


def measure(call_for, images, clients, seconds):
    """(images per second, median seconds a call) of ``clients`` threads calling for ``seconds``."""
    counts, latencies, stop = [0] * clients, [], time.monotonic() + seconds

    def client(index):
        call = call_for(images)
        for _ in range(3):  # warm the connection
            call()
        while time.monotonic() < stop:
            started = time.perf_counter()
            call()
            latencies.append(time.perf_counter() - started)
            counts[index] += len(images)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    began = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.monotonic() - began), statistics.median(latencies)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", required=True, help="version folders N/, as python -m serve takes them")
    parser.add_argument("--model-name", default="cifar10")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0, help="per measurement")
    args = parser.parse_args(argv)
    port, grpc_port = free_port(), free_port()
    process, url = start(os.path.abspath(args.model_dir), port, grpc_port)

    def grpc_call(images):
        channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}", options=[("grpc.use_local_subchannel_pool", 1)])
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        request = predict_pb2.PredictRequest()
        request.model_spec.name = args.model_name
        request.inputs["images"].CopyFrom(tensors.to_proto(images))
        return lambda: stub.Predict(request, timeout=60)

    def rest_call(images):
        session, body = requests.Session(), json.dumps({"instances": images.tolist()})
        target = f"{url}/v1/models/{args.model_name}:predict"
        return lambda: session.post(target, data=body, headers={"Content-Type": "application/json"}, timeout=60).raise_for_status()

    batch = np.random.default_rng(0).integers(0, 256, (64, 32, 32, 3), dtype=np.uint8)
    try:
        for round_ in range(args.rounds):
            for name, call_for in (("REST JSON", rest_call), ("gRPC", grpc_call)):
                rate, median = measure(call_for, batch, 2, args.seconds)
                print(f"round {round_}  64 images c=2  {name:9}  {rate:7.0f} images/s  p50 {median * 1000:7.1f} ms", flush=True)
            for name, call_for in (("REST JSON", rest_call), ("gRPC", grpc_call)):
                _, median = measure(call_for, batch[:1], 1, args.seconds)
                print(f"round {round_}  1 image  c=1  {name:9}  p50 {median * 1000:6.2f} ms", flush=True)
    finally:
        process.terminate()
        process.wait(60)


if __name__ == "__main__":
    sys.exit(main())
