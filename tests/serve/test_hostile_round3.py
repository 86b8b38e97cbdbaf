"""The serving tier under hostile use, round 3 (issue 55): each class of finding, refused once by the core or the
transport for every protocol it can reach, with a bounded message, in bounded time and memory.

Memory and time are bounded by construction here, and checked without the clock: a body that would have
allocated gigabytes is answered while tracemalloc sees a few MB at most; a walk that could have taken seconds is
counted in the calls it makes.
"""

import contextlib
import logging
import struct
import threading
import tracemalloc

import grpc
import numpy as np
import pytest

import contract
import grpc_servers
import synthetic
from fake_backend import FakeBackend, make_app
from tfs_protos.grpc_health.v1 import health_pb2, health_pb2_grpc
from tfs_protos.tensorflow.core.framework import tensor_pb2, types_pb2
from tfs_protos.tensorflow_serving.apis import get_model_status_pb2, model_service_pb2_grpc, predict_pb2, prediction_service_pb2_grpc

KEY = "round-3-key"
WAIT_S = 60
WITH_KEY = (("x-api-key", KEY),)


@pytest.fixture(scope="module")
def app():
    return make_app(API_KEYS=KEY)


@pytest.fixture(scope="module")
def target(app):
    with grpc_servers.serving(app, threads=4) as target:
        yield target


def _post(app, path, body, **kwargs):
    return app.test_client().post(path, data=body, headers={"X-API-Key": KEY, "Content-Type": "application/json"},
                                  **kwargs)


# -- shapes not bounded by the body ----------------------------------------------------------------------------------


def _ragged(n):
    """A ragged array of a few kB whose first rows at each depth spell a shape of ``n**3`` numbers."""
    return b"[[[" + b"0," * (n - 1) + b"0]" + b",[0]" * (n - 1) + b"]" + b",[[0]]" * (n - 1) + b"]"


@pytest.mark.parametrize("route, wrap", [
    ("/v1/models/cifar10:predict", lambda tensor: b'{"instances": ' + tensor + b"}"),
    ("/v2/models/cifar10/infer", lambda tensor: b'{"inputs": [{"name": "images", "datatype": "UINT8", '
                                                b'"shape": [1, 32, 32, 3], "data": ' + tensor + b"}]}"),
])
def test_a_ragged_body_is_a_400_in_bounded_memory(app, route, wrap):
    body = wrap(_ragged(1000))  # 12 kB; as a rectangle, 10**9 numbers
    assert len(body) < 1 << 20
    tracemalloc.start()
    try:
        answer = _post(app, route, body)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert answer.status_code == 400 and "not a tensor" in answer.get_json()["error"]
    assert peak < 50 << 20, f"{peak / 2**20:.0f} MiB for a 12 kB body"


def test_the_canonical_texts_kept_are_bounded_by_the_bodies_that_asked():
    from serve.http import json_tensors

    for n in range(2, 40):  # many shapes, each spelled by a body of its own size
        json_tensors.loads(b'{"instances": [' + b",".join([b"[1,2,3]"] * n) + b"]}", "instances")
    kept = json_tensors._canonical_kept.cache_info()
    assert kept.currsize <= kept.maxsize == 16


def test_a_string_tensor_with_a_huge_declared_shape_is_refused_before_it_is_expanded(target):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "cifar10"
    request.model_spec.signature_name = contract.SIGNATURE_BYTES
    proto = request.inputs[contract.INPUT_BYTES]
    proto.dtype = types_pb2.DT_STRING
    proto.tensor_shape.dim.add().size = 1 << 40  # one value, filled out by TensorFlow's rule: a terabyte of pointers
    proto.string_val.append(b"x")
    with grpc.insecure_channel(target) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, metadata=WITH_KEY, timeout=WAIT_S)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "SERVE_MAX_IMAGES" in refused.value.details()


# -- values that are not pixels --------------------------------------------------------------------------------------


@pytest.mark.parametrize("route, body", [
    ("/v1/models/cifar10:predict", {"instances": [[[[True, 0, 0]] * 32] * 32]}),
    ("/v1/models/cifar10:predict", {"instances": [[[[0, 0, 0]] * 31 + [[False, 1, 2]]] * 32]}),
    ("/v2/models/cifar10/infer", {"inputs": [{"name": "images", "datatype": "UINT8", "shape": [1, 32, 32, 3],
                                             "data": [True] + [0] * 3071}]}),
], ids=["tfserving-true", "tfserving-false", "v2-true"])
def test_booleans_among_the_pixels_are_refused_as_tf_serving_refuses_them(app, route, body):
    answer = app.test_client().post(route, json=body, headers={"X-API-Key": KEY})
    assert answer.status_code == 400 and "whole numbers 0..255" in answer.get_json()["error"]


@pytest.mark.parametrize("value", [300, -1])
def test_an_int_val_outside_uint8_is_refused_not_wrapped(target, value):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "cifar10"
    proto = request.inputs[contract.INPUT_PIXELS]
    proto.dtype = types_pb2.DT_UINT8
    for size in (1, 32, 32, 3):
        proto.tensor_shape.dim.add().size = size
    proto.int_val.extend([value] + [0] * 3071)
    with grpc.insecure_channel(target) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, metadata=WITH_KEY, timeout=WAIT_S)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "0..255" in refused.value.details()


# -- unbounded echoes ------------------------------------------------------------------------------------------------

LONG = "n" * 20_000


@pytest.mark.parametrize("path", [f"/v1/models/{LONG}", f"/v1/models/cifar10/labels/{LONG}", f"/v2/models/{LONG}",
                                  f"/api/v1/{LONG}", f"/v1/{LONG}/%0Aline"],
                         ids=["model", "label", "v2-model", "api-route", "route-with-a-newline"])
def test_a_long_name_in_a_url_is_echoed_bounded(app, path):
    answer = app.test_client().get(path, headers={"X-API-Key": KEY})
    assert answer.status_code == 404
    error = answer.get_json()["error"]
    assert len(error) < 400 and "\n" not in error


def test_a_long_name_over_grpc_stays_not_found(target):
    with grpc.insecure_channel(target) as channel:
        request = predict_pb2.PredictRequest()
        request.model_spec.name = LONG
        request.inputs[contract.INPUT_PIXELS].CopyFrom(tensor_pb2.TensorProto(dtype=types_pb2.DT_UINT8))
        with pytest.raises(grpc.RpcError) as refused:
            prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, metadata=WITH_KEY, timeout=WAIT_S)
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND and len(refused.value.details()) < 400
        status = get_model_status_pb2.GetModelStatusRequest()
        status.model_spec.name = "cifar10"
        status.model_spec.version_label = LONG
        with pytest.raises(grpc.RpcError) as refused:
            model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(status, metadata=WITH_KEY, timeout=WAIT_S)
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND and len(refused.value.details()) < 400
        with pytest.raises(grpc.RpcError) as refused:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=LONG), timeout=WAIT_S)
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND and len(refused.value.details()) < 400


# -- work before refusal ---------------------------------------------------------------------------------------------


def test_bytes_elements_are_walked_no_further_than_the_shape_says(app, monkeypatch):
    from serve.core import tensors

    walked = []

    class Counting:
        @staticmethod
        def unpack_from(*args):
            walked.append(1)
            return struct.unpack_from(*args)

    monkeypatch.setattr(tensors, "struct", Counting)
    tail = b"\0\0\0\0" * 250_000  # a million bytes: a quarter of a million empty elements
    header = b'{"inputs": [{"name": "image_bytes", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": %d}}]}' % len(tail)
    answer = app.test_client().post("/v2/models/cifar10/infer", data=header + tail, headers={
        "X-API-Key": KEY, "Inference-Header-Content-Length": str(len(header))})
    assert answer.status_code == 400 and "its shape needs 2" in answer.get_json()["error"]
    assert len(walked) <= 2
    declared = header.replace(b"[2]", b"[250000]")
    answer = app.test_client().post("/v2/models/cifar10/infer", data=declared + tail, headers={
        "X-API-Key": KEY, "Inference-Header-Content-Length": str(len(declared))})
    assert answer.status_code == 413 and "SERVE_MAX_IMAGES" in answer.get_json()["error"]
    assert len(walked) <= 2  # refused from the shape alone


# -- stalled gRPC calls ----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _stalled(channel, count, metadata):
    """``count`` Predict calls that send their metadata and never their message, until the block ends.

    Yields the calls and ``hold()``, which starts again any call the server has already answered: a stalled call that
    reaches the server after a probe has taken the last slot is turned away, and ``hold()`` keeps ``count`` waiting.
    """
    release = threading.Event()

    def never():
        release.wait(WAIT_S)
        return
        yield  # a generator that yields nothing: the call's message never comes

    predict = channel.stream_unary("/tensorflow.serving.PredictionService/Predict",
                                   request_serializer=predict_pb2.PredictRequest.SerializeToString,
                                   response_deserializer=predict_pb2.PredictResponse.FromString)

    def start():
        return predict.future(never(), metadata=metadata, timeout=WAIT_S)

    calls = [start() for _ in range(count)]

    def hold():
        calls[:] = [start() if call.done() else call for call in calls]

    try:
        yield calls, hold
    finally:
        release.set()
        for call in calls:
            call.cancel()


def test_calls_that_never_send_their_message_cannot_starve_the_server(app, target):
    from serve.core import InferenceService  # noqa: F401  (the app's core answers the health check below)

    with grpc.insecure_channel(target) as channel:
        ready = health_pb2_grpc.HealthStub(channel)
        assert ready.Check(health_pb2.HealthCheckRequest(), timeout=WAIT_S).status == health_pb2.HealthCheckResponse.SERVING
        with _stalled(channel, 4, WITH_KEY) as (_, hold):  # the test server admits four calls at once
            request = predict_pb2.PredictRequest()
            request.model_spec.name = "cifar10"
            request.inputs[contract.INPUT_PIXELS].CopyFrom(tensor_pb2.TensorProto(dtype=types_pb2.DT_UINT8))
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            refused = None
            for _ in range(200):  # until the four stalled calls hold their slots (polled, never timed)
                hold()
                try:
                    stub.Predict(request, metadata=WITH_KEY, timeout=WAIT_S)
                except grpc.RpcError as e:
                    if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                        refused = e
                        break
                threading.Event().wait(0.05)
            assert refused is not None and "at most 4 calls at once" in refused.details()
            # Health keeps threads of its own: the probe still answers, at once.
            assert ready.Check(health_pb2.HealthCheckRequest(), timeout=WAIT_S).status == health_pb2.HealthCheckResponse.SERVING


def test_a_call_without_a_key_is_refused_before_its_message(target):
    with grpc.insecure_channel(target) as channel:
        with _stalled(channel, 1, ()) as ((call,), _):
            with pytest.raises(grpc.RpcError) as refused:
                call.result(timeout=WAIT_S)  # answered while its message is still being awaited
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


# -- operator-side ---------------------------------------------------------------------------------------------------


def test_a_version_folder_named_with_other_scripts_digits_is_not_a_version(tmp_path):
    from serve.backends import published

    for name in ("1", "\u00b2", "\u0663", "12\u0663"):  # "2" superscript, Arabic-Indic three: isdigit(), not ASCII
        (tmp_path / name).mkdir()
        (tmp_path / name / published.SAVED_MODEL_FILE).write_bytes(b"")
    assert published.versions(tmp_path) == [1]


def test_a_newline_in_a_path_cannot_forge_a_text_log_line(app):
    from serve.telemetry import logs

    text_app = make_app(LOG_FORMAT="text")
    handler = logging.StreamHandler(stream := __import__("io").StringIO())
    handler.setFormatter(logs.formatter("text"))
    handler.addFilter(logs.RequestIdFilter())
    logs.ACCESS.addHandler(handler)
    try:
        text_app.test_client().get("/nothing%0A2026-12-05 00:00:00,000 INFO serve.access [forged] GET / 200")
    finally:
        logs.ACCESS.removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and "\\n2026" in lines[0]


def test_readyz_reads_the_workers_metric_files_at_most_once_a_second(monkeypatch):
    app = make_app()
    metrics = app.extensions["serve.metrics"]
    reads = []
    real = metrics.versions_served
    monkeypatch.setattr(metrics, "versions_served", lambda: reads.append(1) or real())
    now = [100.0]
    from serve.http.health import VersionsServed

    app.extensions["serve.versions_served"] = VersionsServed(metrics, clock=lambda: now[0])
    client = app.test_client()
    assert all(client.get("/readyz").status_code == 200 for _ in range(50))
    assert len(reads) == 1
    now[0] += 1.0
    client.get("/readyz")
    assert len(reads) == 2


@pytest.mark.end_to_end
def test_a_reloaded_config_that_selects_no_version_is_refused_and_not_polled_per_request(model_base, tmp_path, caplog):
    import time

    from serve.backends import runtimes
    from serve.backends.local import LocalBackend

    config = tmp_path / "models.config"
    body = 'model_config_list {{ config {{ name: "cifar10" base_path: "{}" model_platform: "tensorflow" {} }} }}'
    config.write_text(body.format(model_base, ""))
    backend = LocalBackend(model_base, "cifar10", "litert", max_batch=4, batch_wait_ms=0, poll_s=0,
                           config_file=str(config), config_poll_s=0.01)
    backend.wait_loaded()
    listed = []
    real = runtimes.versions
    try:
        config.write_text(body.format(model_base, "model_version_policy { specific { versions: 9 } }"))
        caplog.set_level(logging.ERROR, logger="serve.backends.local")
        deadline = time.monotonic() + WAIT_S
        while "selects none of the published versions" not in caplog.text:  # a poll read it, and refused it
            assert time.monotonic() < deadline, caplog.text
            backend.info()
            threading.Event().wait(0.02)
        runtimes.versions = lambda *args: listed.append(1) or real(*args)
        for _ in range(50):
            assert backend.infer(synthetic.make_images(1)[0][:1]).version == 1  # the version before still serves
        assert listed == []  # the directory is not listed again on every request
    finally:
        runtimes.versions = real
        backend.close()
