"""Request ids over gRPC (serve/grpc/interceptors.py): the caller's ``x-request-id`` metadata or a new id, sent
back in the initial metadata of every answer and refusal, and one JSON ``serve.access`` line a call."""

import json
import re

import grpc
import numpy as np
import pytest

import contract
import grpc_servers
import synthetic
from fake_backend import make_app
from tfs_protos import tensors
from tfs_protos.grpc_health.v1 import health_pb2, health_pb2_grpc
from tfs_protos.inference import grpc_predict_v2_pb2 as v2, grpc_predict_v2_pb2_grpc
from tfs_protos.tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

KEY = "grpc-ids-key-material"
DEADLINE_S = 60


@pytest.fixture(scope="module")
def served():
    """``(app, channel)``: the app over the fake backend with API keys on, and a channel to its gRPC server."""
    app = make_app(API_KEYS=KEY)
    with grpc_servers.serving(app, threads=4) as target, grpc.insecure_channel(target) as channel:
        yield app, channel


@pytest.fixture(scope="module")
def channel(served):
    return served[1]


def _predict(n=2, name="cifar10"):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    request.inputs[contract.INPUT_PIXELS].CopyFrom(tensors.to_proto(synthetic.make_images(1)[0][:n]))
    return request


def _metadata(request_id=None, key=KEY):
    pairs = [("x-api-key", key)] if key else []
    return tuple(pairs + ([("x-request-id", request_id)] if request_id is not None else []))


def test_the_callers_id_comes_back_and_names_the_calls_log_line(channel, access_lines):
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    _, call = stub.Predict.with_call(_predict(), metadata=_metadata("grpc-good-1"), timeout=DEADLINE_S)
    assert dict(call.initial_metadata())["x-request-id"] == "grpc-good-1"
    (line,) = [line for line in access_lines() if line["request_id"] == "grpc-good-1"]
    assert line["route"] == "/tensorflow.serving.PredictionService/Predict" and line["status"] == "OK"
    assert line["model_version"] == 1 and line["images"] == 2 and line["client"] == "127.0.0.1"
    assert line["duration_ms"] > 0 and KEY not in json.dumps(line)


@pytest.mark.parametrize("given", [None, "", "has space", "x" * 129, "semi;colon"])
def test_a_missing_or_odd_id_is_replaced_by_a_new_one(channel, given):
    stub = grpc_predict_v2_pb2_grpc.GRPCInferenceServiceStub(channel)
    _, call = stub.ServerLive.with_call(v2.ServerLiveRequest(), metadata=_metadata(given), timeout=DEADLINE_S)
    assert re.fullmatch(r"[0-9a-f]{32}", dict(call.initial_metadata())["x-request-id"])


@pytest.mark.parametrize("case", ["refused", "not-found", "bad-input"])
def test_a_refusal_carries_the_id_and_logs_its_code(channel, access_lines, case):
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    request, metadata, code = {
        "refused": (_predict(), _metadata(f"grpc-{case}", key=None), grpc.StatusCode.UNAUTHENTICATED),
        "not-found": (_predict(name="nope"), _metadata(f"grpc-{case}"), grpc.StatusCode.NOT_FOUND),
        "bad-input": (predict_pb2.PredictRequest(model_spec={"name": "cifar10"}), _metadata(f"grpc-{case}"),
                      grpc.StatusCode.INVALID_ARGUMENT),
    }[case]
    with pytest.raises(grpc.RpcError) as raised:
        stub.Predict(request, metadata=metadata, timeout=DEADLINE_S)
    assert raised.value.code() == code
    assert dict(raised.value.initial_metadata())["x-request-id"] == f"grpc-{case}"
    (line,) = [line for line in access_lines() if line["request_id"] == f"grpc-{case}"]
    assert line["status"] == code.name and line["images"] == 0


def test_v2_infer_and_health_calls_have_ids_too(channel, access_lines):
    health = health_pb2_grpc.HealthStub(channel)
    _, call = health.Check.with_call(health_pb2.HealthCheckRequest(), metadata=(("x-request-id", "probe-1"),),
                                     timeout=DEADLINE_S)
    assert dict(call.initial_metadata())["x-request-id"] == "probe-1"
    pixels = synthetic.make_images(1)[0][:1]
    request = v2.ModelInferRequest(model_name="cifar10", inputs=[v2.ModelInferRequest.InferInputTensor(
        name=contract.INPUT_PIXELS, datatype="UINT8", shape=list(pixels.shape))], raw_input_contents=[pixels.tobytes()])
    _, call = grpc_predict_v2_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer.with_call(
        request, metadata=_metadata("v2-1"), timeout=DEADLINE_S)
    assert dict(call.initial_metadata())["x-request-id"] == "v2-1"
    lines = {line["request_id"]: line for line in access_lines()}
    assert lines["v2-1"]["route"] == "/inference.GRPCInferenceService/ModelInfer" and lines["v2-1"]["images"] == 1
    assert lines["probe-1"]["status"] == "OK"
    assert np.isfinite(lines["v2-1"]["duration_ms"])


def _grpc_counts(app):
    """``{(method, code): calls}`` from the app's ``serve_grpc_requests_total``, and the timed calls a method."""
    from prometheus_client.parser import text_string_to_metric_families

    counts, timed = {}, {}
    body, _ = app.extensions["serve.metrics"].exposition()
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name == "serve_grpc_requests_total":
                counts[sample.labels["method"], sample.labels["code"]] = sample.value
            elif sample.name == "serve_grpc_request_duration_seconds_count":
                timed[sample.labels["method"]] = sample.value
    return counts, timed


def test_every_call_is_counted_by_method_and_code_refusals_too(served):
    app, channel = served
    predict = "/tensorflow.serving.PredictionService/Predict"
    before, timed_before = _grpc_counts(app)
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    stub.Predict(_predict(), metadata=_metadata(), timeout=DEADLINE_S)
    for request, metadata, code in ((_predict(name="no-such-model"), _metadata(), grpc.StatusCode.NOT_FOUND),
                                    (_predict(), _metadata(key="wrong"), grpc.StatusCode.UNAUTHENTICATED)):
        with pytest.raises(grpc.RpcError) as refused:
            stub.Predict(request, metadata=metadata, timeout=DEADLINE_S)
        assert refused.value.code() == code
    after, timed_after = _grpc_counts(app)
    for code in ("OK", "NOT_FOUND", "UNAUTHENTICATED"):
        assert after[predict, code] - before.get((predict, code), 0) == 1, code
    assert timed_after[predict] - timed_before.get(predict, 0) == 3
