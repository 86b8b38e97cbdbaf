"""gRPC load for python -m bench.peers, and the bare model it is held against.

``wrk`` speaks HTTP only, so the gRPC cells are driven from Python: ``concurrency`` threads, each with its
own channel, call one method with one prepared message for ``seconds``, and every latency is kept (exact
p50 and p99). Two messages, each the transport's binary form of ``[64, 32, 32, 3]`` uint8 pixels:

* ``tfs``: TF Serving's ``PredictionService/Predict`` with the pixels in ``tensor_content``;
* ``v2``: the Open Inference Protocol's ``ModelInfer`` with them in ``raw_input_contents``.

:func:`bare_model` is the limit the server is quoted beside: the same ``model.tflite`` in LiteRT's
interpreter in this process (as many threads as cores, as the servers run it), called directly.

    python -m bench.peers.grpc_load --target 127.0.0.1:8500 --kind tfs --images 64 --seconds 10
"""

import argparse
import json
import statistics
import threading
import time

import numpy as np


def message(kind, images, model_name="cifar10"):
    """``(method path, serialized request)`` for ``images`` (uint8 ``[N, 32, 32, 3]``)."""
    images = np.ascontiguousarray(images, np.uint8)
    if kind == "tfs":
        from tfs_protos.tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2
        from tfs_protos.tensorflow_serving.apis import predict_pb2

        shape = tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=n) for n in images.shape])
        request = predict_pb2.PredictRequest()
        request.model_spec.name = model_name
        request.inputs["images"].CopyFrom(tensor_pb2.TensorProto(dtype=types_pb2.DT_UINT8, tensor_shape=shape,
                                                                 tensor_content=images.tobytes()))
        return "/tensorflow.serving.PredictionService/Predict", request.SerializeToString()
    if kind == "v2":
        from tfs_protos.inference import grpc_predict_v2_pb2 as v2

        request = v2.ModelInferRequest(model_name=model_name)
        request.inputs.add(name="images", datatype="UINT8", shape=list(images.shape))
        request.raw_input_contents.append(images.tobytes())
        return "/inference.GRPCInferenceService/ModelInfer", request.SerializeToString()
    raise ValueError(kind)


def probabilities(kind, answer):
    """float32 ``[N, 10]`` probabilities of a serialized answer to :func:`message`."""
    if kind == "tfs":
        from tfs_protos.tensorflow_serving.apis import predict_pb2

        tensor = predict_pb2.PredictResponse.FromString(answer).outputs["probabilities"]
        values = np.frombuffer(tensor.tensor_content, np.float32) if tensor.tensor_content else np.asarray(tensor.float_val, np.float32)
        return values.reshape(-1, 10)
    from tfs_protos.inference import grpc_predict_v2_pb2 as v2

    response = v2.ModelInferResponse.FromString(answer)
    index = [output.name for output in response.outputs].index("probabilities")
    if response.raw_output_contents:
        return np.frombuffer(response.raw_output_contents[index], np.float32).reshape(-1, 10)
    return np.asarray(response.outputs[index].contents.fp32_contents, np.float32).reshape(-1, 10)  # KServe's typed contents


def wrong(target, kind, images, expected, tolerance=1e-4):
    """None when one call's answer has every image's top class (and probabilities within ``tolerance``), else why not."""
    import grpc

    method, body = message(kind, images)
    with grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", 64 << 20)]) as channel:
        answer = channel.unary_unary(method, request_serializer=None, response_deserializer=None)(body, timeout=60)
    got = probabilities(kind, answer)
    if got.shape != expected.shape:
        return f"answer of shape {list(got.shape)} for {list(expected.shape)}"
    if (got.argmax(1) != expected.argmax(1)).any() or float(np.abs(got - expected).max()) > tolerance:
        return f"probabilities differ by {float(np.abs(got - expected).max()):.2g}"
    return None


def run(target, kind, images, concurrency, seconds, timeout_s=10):
    """``{"requests", "requests_per_s", "p50_ms", "p99_ms", "errors"}`` of ``concurrency`` callers for ``seconds``."""
    import grpc

    method, body = message(kind, images)
    latencies, errors = [], []
    stop = time.monotonic() + seconds

    def caller():
        with grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", 64 << 20)]) as channel:
            call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
            call(body, timeout=timeout_s)  # connect outside the measured window
            while time.monotonic() < stop:
                start = time.perf_counter()
                try:
                    call(body, timeout=timeout_s)
                except grpc.RpcError as e:
                    errors.append(e.code().name)
                    continue
                latencies.append(time.perf_counter() - start)

    threads = [threading.Thread(target=caller) for _ in range(concurrency)]
    began = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - began
    latencies.sort()
    return {"requests": len(latencies), "requests_per_s": len(latencies) / elapsed,
            "p50_ms": 1000 * statistics.median(latencies) if latencies else None,
            "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else None,
            "non_2xx": len(errors), "socket_errors": 0, "timeouts": errors.count("DEADLINE_EXCEEDED"),
            "error_codes": sorted(set(errors))}


def bare_model(model_path, images, seconds=3.0):
    """The model alone: 1 image a call (p50 latency) and 32 and 64 images a call (images/s), LiteRT in this process."""
    from bench.peers.litert_model import LiteRTModel

    model = LiteRTModel(model_path)
    result = {}
    for batch in (1, 32, 64):
        pixels = images[:batch]
        model.probabilities(pixels)  # load and warm
        times = []
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            start = time.perf_counter()
            model.probabilities(pixels)
            times.append(time.perf_counter() - start)
        p50 = statistics.median(times)
        result[f"batch_{batch}"] = {"calls": len(times), "p50_ms": 1000 * p50, "images_per_s": batch / p50}
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--kind", choices=("tfs", "v2"), required=True)
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=10)
    args = parser.parse_args(argv)
    from bench.peers.model import request_images

    print(json.dumps(run(args.target, args.kind, request_images(args.images), args.concurrency, args.seconds)))


if __name__ == "__main__":
    main()
