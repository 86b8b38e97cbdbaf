"""TF Serving's two APIs on one front end, in one run: gRPC (``tensor_content``) against REST (JSON ``instances``).

Starts ``python -m serve`` (gunicorn, its default workers) with gRPC on, then alternates the two
protocols round by round so that a noisy machine hurts both alike: 64-image requests from 2 clients
(images per second, and the median call), and 1-image requests from 1 client (median call). Each
gRPC client has its own channel (SO_REUSEPORT spreads connections over the workers), each REST
client its own keep-alive session. The client side uses the vendored protos, no TensorFlow.

Typical usage::

    python -m bench.serving.grpc_rest --model-dir models/cifar10 --rounds 3 --seconds 10 [--json bench/records/NAME.json]
"""

import argparse
import json
import os
import statistics
import sys
import threading
import time

import grpc
import numpy as np
import requests

from bench import harness, record
from tfs_protos import tensors
from tfs_protos.tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc


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
    parser.add_argument("--json", help="write the record here (bench/records/NAME.json)")
    args = parser.parse_args(argv)
    port, grpc_port = harness.free_port(), harness.free_port()
    server = harness.Server(harness.serve_argv(os.path.abspath(args.model_dir), port, grpc_port), {"SERVE_LOG_FORMAT": "text"})
    url = f"http://127.0.0.1:{port}"

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
    rounds = []
    try:
        server.wait_ready(f"{url}/readyz", timeout_s=300, answers=8)
        for round_ in range(args.rounds):
            rounds.append({})
            for name, call_for in (("REST JSON", rest_call), ("gRPC", grpc_call)):
                rate, median = measure(call_for, batch, 2, args.seconds)
                rounds[-1][f"{name}, 64 images, c=2"] = {"images_per_s": rate, "p50_ms": median * 1000}
                print(f"round {round_}  64 images c=2  {name:9}  {rate:7.0f} images/s  p50 {median * 1000:7.1f} ms", flush=True)
            for name, call_for in (("REST JSON", rest_call), ("gRPC", grpc_call)):
                _, median = measure(call_for, batch[:1], 1, args.seconds)
                rounds[-1][f"{name}, 1 image, c=1"] = {"p50_ms": median * 1000}
                print(f"round {round_}  1 image  c=1  {name:9}  p50 {median * 1000:6.2f} ms", flush=True)
    finally:
        server.stop(60)
    record.write(args.json, {"model_dir": args.model_dir, "rounds": rounds}, __spec__.name, argv)


if __name__ == "__main__":
    sys.exit(main())
