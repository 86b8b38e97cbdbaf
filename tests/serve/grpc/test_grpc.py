"""TF Serving's gRPC API on the front end (serve/protocols/tfserving_grpc.py), called with
``tensorflow-serving-api``'s own stubs: in-process over an app of the fake backend; marked ``end_to_end``, the
real model's signatures, and once through the real gunicorn server, where every worker serves it on one port."""

import threading
import time

import grpc
import numpy as np
import pytest
import requests
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

import contract
import grpc_servers
import synthetic
from fake_backend import api_probabilities, make_app, probabilities_by_class
from live_server import free_port, start_server, stop_server
from tfs_protos.grpc_health.v1 import health_pb2, health_pb2_grpc

KEY = "grpc-test-key"
MAX_IMAGES = 8
#: Seconds a call may take before the test gives up on it: generous, this is no timing test.
DEADLINE_S = 60
WITH_KEY = (("x-api-key", KEY),)
HEADERS = {"X-API-Key": KEY}  # the same key, on the JSON API


@pytest.fixture(scope="module")
def app():
    """An app over the fake backend with API keys on, an 8-image cap and a 1 MiB message limit."""
    return make_app(API_KEYS=KEY, MAX_IMAGES=MAX_IMAGES)


@pytest.fixture(scope="module")
def predict_stub(channel):
    return prediction_service_pb2_grpc.PredictionServiceStub(channel)


@pytest.fixture(scope="module")
def images():
    return synthetic.make_images(2, seed=7)[0]  # 6 images, under the cap


def pixels_request(pixels, version=None, name="cifar10", **spec):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    for key, value in spec.items():
        setattr(request.model_spec, key, value)
    if version is not None:
        request.model_spec.version.value = version
    request.inputs[contract.INPUT_PIXELS].CopyFrom(tf.make_tensor_proto(pixels))
    return request


def code_of(call, *args, **kwargs):
    with pytest.raises(grpc.RpcError) as raised:
        call(*args, timeout=kwargs.pop("timeout", DEADLINE_S), **kwargs)
    error = raised.value
    assert error.code() != grpc.StatusCode.UNKNOWN and "Traceback" not in (error.details() or ""), error
    return error.code(), error.details()


def still_serves(stub, images):
    response = stub.Predict(pixels_request(images[:1]), metadata=WITH_KEY, timeout=DEADLINE_S)
    assert tf.make_ndarray(response.outputs[contract.OUTPUT_PROBABILITIES]).shape == (1, len(synthetic.CLASS_NAMES))


# -- predictions -------------------------------------------------------------------------


def test_predict_gives_the_probabilities_of_the_json_api(app, predict_stub, images):
    response = predict_stub.Predict(pixels_request(images), metadata=WITH_KEY, timeout=DEADLINE_S)
    assert response.model_spec.name == "cifar10"
    assert response.model_spec.version.value == 1
    assert response.model_spec.signature_name == contract.SIGNATURE_PIXELS
    probabilities = tf.make_ndarray(response.outputs[contract.OUTPUT_PROBABILITIES])
    assert probabilities.dtype == np.float32
    np.testing.assert_allclose(probabilities, api_probabilities(app, images, HEADERS), atol=1e-6)
    assert tf.make_ndarray(response.outputs[contract.OUTPUT_CLASS_IDS]).tolist() == probabilities.argmax(axis=1).tolist()


def test_predict_reads_typed_values_and_encoded_images_alike(app, predict_stub, images):
    expected = api_probabilities(app, images, HEADERS)
    typed = pixels_request(images)
    typed.inputs[contract.INPUT_PIXELS].ClearField("tensor_content")
    typed.inputs[contract.INPUT_PIXELS].int_val.extend(images.reshape(-1).tolist())
    response = predict_stub.Predict(typed, metadata=WITH_KEY, timeout=DEADLINE_S)
    np.testing.assert_allclose(tf.make_ndarray(response.outputs[contract.OUTPUT_PROBABILITIES]), expected, atol=1e-6)

    encoded = predict_pb2.PredictRequest()
    encoded.model_spec.name = "cifar10"
    encoded.model_spec.signature_name = contract.SIGNATURE_BYTES
    encoded.inputs[contract.INPUT_BYTES].CopyFrom(
        tf.make_tensor_proto([synthetic.encode(image) for image in images], dtype=tf.string))
    response = predict_stub.Predict(encoded, metadata=WITH_KEY, timeout=DEADLINE_S)
    assert response.model_spec.signature_name == contract.SIGNATURE_BYTES
    np.testing.assert_allclose(tf.make_ndarray(response.outputs[contract.OUTPUT_PROBABILITIES]), expected, atol=1e-6)


def test_version_and_output_filter_are_honoured(predict_stub, images):
    request = pixels_request(images, version=1)
    request.output_filter.append(contract.OUTPUT_PROBABILITIES)
    response = predict_stub.Predict(request, metadata=WITH_KEY, timeout=DEADLINE_S)
    assert response.model_spec.version.value == 1
    assert list(response.outputs) == [contract.OUTPUT_PROBABILITIES]

    request.output_filter.append("no_such_output")
    code, details = code_of(predict_stub.Predict, request, metadata=WITH_KEY)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "no_such_output" in details


def test_classify_ranks_every_class_of_each_example(app, predict_stub, images):
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = "cifar10"
    for image in images:
        example = request.input.example_list.examples.add()
        example.features.feature[contract.INPUT_BYTES].bytes_list.value.append(synthetic.encode(image))
    response = predict_stub.Classify(request, metadata=WITH_KEY, timeout=DEADLINE_S)
    assert response.model_spec.version.value == 1
    expected = api_probabilities(app, images, HEADERS)
    assert len(response.result.classifications) == len(images)
    for row, classification in zip(expected, response.result.classifications):
        scores = {c.label: c.score for c in classification.classes}
        assert list(scores) == [synthetic.CLASS_NAMES[i] for i in np.argsort(-row, kind="stable")]
        assert [scores[name] for name in synthetic.CLASS_NAMES] == pytest.approx(row.tolist(), abs=1e-6)


# -- metadata and status -----------------------------------------------------------------


@pytest.mark.end_to_end
def test_metadata_describes_the_saved_signatures(real_app, model_base):
    """The real model's signatures as exported, byte for byte (the fake backend has no saved_model.pb)."""
    with grpc_servers.serving(real_app) as target, grpc.insecure_channel(target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
        request.model_spec.name = "cifar10"
        response = stub.GetModelMetadata(request, timeout=DEADLINE_S)
        assert response.model_spec.version.value == 1
        served = get_model_metadata_pb2.SignatureDefMap()
        assert response.metadata["signature_def"].Unpack(served)

        saved = saved_model_pb2.SavedModel.FromString((model_base / "1" / "saved_model.pb").read_bytes())
        exported = saved.meta_graphs[0].signature_def
        assert set(served.signature_def) == set(exported) - {"__saved_model_init_op"}
        for name in served.signature_def:
            assert served.signature_def[name] == exported[name], name
        pixels = served.signature_def[contract.SIGNATURE_PIXELS].inputs[contract.INPUT_PIXELS]
        assert pixels.dtype == tf.uint8.as_datatype_enum
        assert [d.size for d in pixels.tensor_shape.dim] == [-1, 32, 32, 3]

        request.ClearField("metadata_field")
        assert code_of(stub.GetModelMetadata, request)[0] == grpc.StatusCode.INVALID_ARGUMENT


def test_model_status_lists_the_served_version(channel):
    stub = model_service_pb2_grpc.ModelServiceStub(channel)
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = "cifar10"
    response = stub.GetModelStatus(request, metadata=WITH_KEY, timeout=DEADLINE_S)
    assert [(s.version, s.state, s.status.error_code) for s in response.model_version_status] == [
        (1, get_model_status_pb2.ModelVersionStatus.AVAILABLE, 0)]
    request.model_spec.version.value = 7
    assert code_of(stub.GetModelStatus, request, metadata=WITH_KEY)[0] == grpc.StatusCode.NOT_FOUND
    request.model_spec.name = "other"
    assert code_of(stub.GetModelStatus, request, metadata=WITH_KEY)[0] == grpc.StatusCode.NOT_FOUND


def test_unknown_model_or_version_is_not_found(predict_stub, images):
    code, details = code_of(predict_stub.Predict, pixels_request(images, version=7), metadata=WITH_KEY)
    assert code == grpc.StatusCode.NOT_FOUND and "Specific(cifar10, 7)" in details
    code, details = code_of(predict_stub.Predict, pixels_request(images, name="other"), metadata=WITH_KEY)
    assert code == grpc.StatusCode.NOT_FOUND and "Latest(other)" in details
    code, _ = code_of(predict_stub.Predict, pixels_request(images, version_label="canary"), metadata=WITH_KEY)
    assert code == grpc.StatusCode.NOT_FOUND
    still_serves(predict_stub, images)


# -- guards ------------------------------------------------------------------------------


def test_the_api_key_is_needed_in_the_metadata(predict_stub, images):
    request = pixels_request(images[:1])
    code, details = code_of(predict_stub.Predict, request)
    assert code == grpc.StatusCode.UNAUTHENTICATED and "API key" in details
    code, details = code_of(predict_stub.Predict, request, metadata=(("x-api-key", "wrong"),))
    assert code == grpc.StatusCode.UNAUTHENTICATED and "not valid" in details
    code, _ = code_of(predict_stub.Predict, request, metadata=(("authorization", "Bearer wrong"),))
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert predict_stub.Predict(request, metadata=(("authorization", f"Bearer {KEY}"),), timeout=DEADLINE_S).outputs
    still_serves(predict_stub, images)


def test_over_the_image_cap_is_refused_naming_it(predict_stub):
    many = synthetic.make_images(3, seed=1)[0][: MAX_IMAGES + 1]
    code, details = code_of(predict_stub.Predict, pixels_request(many), metadata=WITH_KEY)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "SERVE_MAX_IMAGES" in details
    still_serves(predict_stub, many)


def test_tensor_content_that_does_not_fill_its_shape_is_invalid(predict_stub, images):
    request = pixels_request(images[:2])
    request.inputs[contract.INPUT_PIXELS].tensor_content = images[:2].tobytes()[:-5]
    code, details = code_of(predict_stub.Predict, request, metadata=WITH_KEY)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "tensor_content" in details
    # A huge shape over a single value (TensorFlow's fill rule) is refused before anything is allocated.
    request = pixels_request(images[:1])
    proto = request.inputs[contract.INPUT_PIXELS]
    proto.ClearField("tensor_content")
    proto.int_val.append(7)
    proto.tensor_shape.dim[1].size = 1 << 20
    code, details = code_of(predict_stub.Predict, request, metadata=WITH_KEY)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "SERVE_MAX_UPLOAD_MB" in details
    still_serves(predict_stub, images)


def test_a_wrong_dtype_is_invalid(predict_stub, images):
    code, details = code_of(predict_stub.Predict, pixels_request(images.astype(np.float32)), metadata=WITH_KEY)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "DT_UINT8" in details and "DT_FLOAT" in details
    still_serves(predict_stub, images)


def test_a_message_over_the_size_limit_is_refused_by_grpc(predict_stub, images):
    big = np.zeros((MAX_IMAGES, 256, 256, 3), np.uint8)  # 1.5 MiB, over the app's 1 MiB
    code, _ = code_of(predict_stub.Predict, pixels_request(big), metadata=WITH_KEY)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    still_serves(predict_stub, images)


@pytest.fixture()
def held(app, monkeypatch):
    """The service's ``infer`` held until the test lets it go: a model call that outlasts any deadline, without a sleep."""
    service = app.extensions["serve.service"]
    real, entered, release = service.infer, threading.Event(), threading.Event()

    def run(*args, **kwargs):
        entered.set()
        release.wait(DEADLINE_S)
        return real(*args, **kwargs)

    monkeypatch.setattr(service, "infer", run)
    yield entered
    release.set()
    monkeypatch.undo()


def test_a_1_ms_deadline_is_exceeded_and_the_server_goes_on(predict_stub, images, held):
    code, _ = code_of(predict_stub.Predict, pixels_request(images), metadata=WITH_KEY, timeout=0.001)
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED


def test_a_cancelled_call_leaves_the_server_serving(predict_stub, images, held):
    future = predict_stub.Predict.future(pixels_request(images), metadata=WITH_KEY, timeout=DEADLINE_S)
    assert held.wait(DEADLINE_S)  # the call is in the model when it is cancelled
    assert future.cancel() and future.cancelled()


def test_the_server_serves_after_deadlines_and_cancellations(predict_stub, images):
    still_serves(predict_stub, images)


@pytest.mark.parametrize("remaining, code", [(-0.5, grpc.StatusCode.DEADLINE_EXCEEDED), (5.0, grpc.StatusCode.CANCELLED)])
def test_a_call_whose_caller_went_away_stops_between_stages(remaining, code):
    from serve.grpc import edge

    class Gone:
        def is_active(self):
            return False

        def time_remaining(self):
            return remaining

    with pytest.raises(edge.Failure) as raised:
        edge.alive(Gone())
    assert raised.value.code == code


def test_an_unexpected_fault_is_internal_with_no_traceback(app, predict_stub, images, monkeypatch):
    service = app.extensions["serve.service"]
    monkeypatch.setattr(service, "infer", lambda *args, **kwargs: 1 / 0)
    code, details = code_of(predict_stub.Predict, pixels_request(images), metadata=WITH_KEY)
    assert code == grpc.StatusCode.INTERNAL and details == "internal error: ZeroDivisionError"
    monkeypatch.undo()
    still_serves(predict_stub, images)


def test_the_rate_limit_is_one_budget_with_http(images):
    """Three calls a minute for the API area: HTTP and gRPC draw on the same count, per key."""
    from serve.grpc import server as grpc_server

    limited = make_app(API_KEYS=f"{KEY},other", RATE_LIMIT_API="3/minute")
    server, port = grpc_server.make_server(limited, "127.0.0.1:0", threads=4, reuse_port=False)
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            http = limited.test_client()
            assert http.get("/v1/models/cifar10", headers={"X-API-Key": KEY}).status_code == 200
            assert stub.Predict(pixels_request(images[:1]), metadata=WITH_KEY, timeout=DEADLINE_S).outputs
            assert http.get("/v1/models/cifar10", headers={"X-API-Key": KEY}).status_code == 200
            code, details = code_of(stub.Predict, pixels_request(images[:1]), metadata=WITH_KEY)
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "3 per 1 minute" in details
            assert http.get("/v1/models/cifar10", headers={"X-API-Key": KEY}).status_code == 429
            # Another key has its own budget; keys are still checked, and health is never limited.
            other = (("authorization", "Bearer other"),)
            assert stub.Predict(pixels_request(images[:1]), metadata=other, timeout=DEADLINE_S).outputs
            assert code_of(stub.Predict, pixels_request(images[:1]), metadata=(("x-api-key", "wrong"),))[0] == (
                grpc.StatusCode.UNAUTHENTICATED)  # counted by address, like HTTP's wrong keys
            code, _ = code_of(stub.Predict, pixels_request(images[:1]))
            assert code == grpc.StatusCode.UNAUTHENTICATED
            for _ in range(5):
                assert health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=DEADLINE_S).status == 1
    finally:
        server.stop(None).wait()
        limited.extensions["serve.backend"].close()


# -- health ------------------------------------------------------------------------------


def wait_serving(channel, deadline_s=DEADLINE_S):
    """Poll the health service until it answers SERVING (no key: a kubelet sends none)."""
    stub = health_pb2_grpc.HealthStub(channel)
    end = time.monotonic() + deadline_s
    while True:
        try:
            status = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=DEADLINE_S).status
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > end:
                raise
            status = None
        if status == health_pb2.HealthCheckResponse.SERVING:
            return stub
        assert time.monotonic() < end, f"health never answered SERVING (last: {status})"
        time.sleep(0.1)  # a poll's pace, not a timing window: the deadline above is what bounds it


def test_health_answers_serving_without_a_key(channel):
    stub = wait_serving(channel)
    for service in ("tensorflow.serving.PredictionService", "tensorflow.serving.ModelService"):
        assert stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=DEADLINE_S).status == 1
    code, _ = code_of(stub.Check, health_pb2.HealthCheckRequest(service="no.such.Service"))
    assert code == grpc.StatusCode.NOT_FOUND
    watch = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=DEADLINE_S)
    assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
    watch.cancel()


# -- through gunicorn ----------------------------------------------------------------------


@pytest.mark.end_to_end
def test_every_gunicorn_worker_serves_grpc_on_one_port(model_base, images):
    grpc_port = free_port()
    process, url = start_server(model_base, extra_env={"SERVE_API_KEYS": KEY}, args=("--grpc-port", str(grpc_port), "--workers", "2"))
    try:
        files = [("file", (f"{i}.png", synthetic.encode(image), "image/png")) for i, image in enumerate(images)]
        answer = requests.post(f"{url}/api/v1/predict", files=files, headers={"X-API-Key": KEY}, timeout=DEADLINE_S)
        assert answer.status_code == 200, answer.text
        expected = probabilities_by_class(answer.json()["predictions"])
        # New channels land on either worker (SO_REUSEPORT): every one answers alike.
        for _ in range(4):
            with grpc.insecure_channel(f"127.0.0.1:{grpc_port}", options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
                wait_serving(channel)
                stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
                response = stub.Predict(pixels_request(images), metadata=WITH_KEY, timeout=DEADLINE_S)
                np.testing.assert_allclose(tf.make_ndarray(response.outputs[contract.OUTPUT_PROBABILITIES]), expected, atol=1e-6)
                assert code_of(stub.Predict, pixels_request(images))[0] == grpc.StatusCode.UNAUTHENTICATED
    finally:
        stop_server(process)
