"""The Open Inference Protocol over gRPC (serve/protocols/v2_grpc.py), called with ``tritonclient.grpc``
unchanged (and Triton's own generated stub where a test needs typed contents, which tritonclient never
sends), on the server ``serve.grpc.server.make_server`` starts in-process over an app of the fake backend: the
port that also serves TF Serving's gRPC API and health."""

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

import contract
import synthetic
from fake_backend import api_probabilities, make_app
from tfs_protos import tensors
from tfs_protos.grpc_health.v1 import health_pb2, health_pb2_grpc
from tfs_protos.tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

KEY = "v2-grpc-test-key"
HEADERS = {"x-api-key": KEY}
MODEL = "cifar10"
MAX_IMAGES = 8
#: Seconds a call may take before the test gives up on it: generous, this is no timing test.
DEADLINE_S = 60.0


@pytest.fixture(scope="module")
def app():
    """The app over the fake backend with API keys on and an 8-image cap (as tests/serve/grpc/test_grpc.py's)."""
    return make_app(MODEL_NAME=MODEL, API_KEYS=KEY, MAX_IMAGES=MAX_IMAGES)


@pytest.fixture(scope="module")
def client(target):
    client = triton.InferenceServerClient(url=target)
    yield client
    client.close()


@pytest.fixture(scope="module")
def images():
    return synthetic.make_images(2, seed=11)[0]  # 6 images, under the cap


@pytest.fixture(scope="module")
def expected(app, images):
    """``/api/v1/predict``'s probabilities for ``images`` (by class id), as PNG uploads."""
    return api_probabilities(app, images, HEADERS)


def pixels_input(pixels, datatype="UINT8"):
    tensor = triton.InferInput(contract.INPUT_PIXELS, list(pixels.shape), datatype)
    tensor.set_data_from_numpy(pixels)
    return tensor


def bytes_input(datas):
    tensor = triton.InferInput(contract.INPUT_BYTES, [len(datas)], "BYTES")
    tensor.set_data_from_numpy(np.array(datas, dtype=np.object_))
    return tensor


def status_of(call, *args, **kwargs):
    """The gRPC status and message ``call`` fails with, through tritonclient's own exception."""
    with pytest.raises(InferenceServerException) as raised:
        call(*args, client_timeout=DEADLINE_S, **kwargs)
    error = raised.value
    assert error.status() != str(grpc.StatusCode.UNKNOWN) and "Traceback" not in error.message(), error
    return error.status(), error.message()


def still_serves(client, images):
    result = client.infer(MODEL, [pixels_input(images[:1])], headers=HEADERS, client_timeout=DEADLINE_S)
    assert result.as_numpy(contract.OUTPUT_PROBABILITIES).shape == (1, len(synthetic.CLASS_NAMES))


# -- inference ---------------------------------------------------------------------------------


def test_raw_pixels_give_the_probabilities_of_the_json_api(client, images, expected):
    result = client.infer(MODEL, [pixels_input(images)], request_id="req-7", headers=HEADERS, client_timeout=DEADLINE_S)
    response = result.get_response()
    assert (response.model_name, response.model_version, response.id) == (MODEL, "1", "req-7")
    probabilities = result.as_numpy(contract.OUTPUT_PROBABILITIES)
    assert probabilities.dtype == np.float32 and probabilities.shape == expected.shape
    np.testing.assert_allclose(probabilities, expected, atol=1e-6)
    assert result.as_numpy(contract.OUTPUT_CLASS_IDS).tolist() == expected.argmax(axis=1).tolist()
    assert [name.decode() for name in result.as_numpy(contract.OUTPUT_CLASS_NAMES)] == [
        synthetic.CLASS_NAMES[c] for c in expected.argmax(axis=1)]
    # Every output raw, as Triton answers: one raw_output_contents entry per output, in order.
    assert len(response.raw_output_contents) == len(response.outputs) >= 3


def test_encoded_images_as_bytes_are_decoded_as_the_json_api_does(client, images, expected):
    datas = [synthetic.encode(image) for image in images]
    result = client.infer(MODEL, [bytes_input(datas)], model_version="1", headers=HEADERS, client_timeout=DEADLINE_S,
                          outputs=[triton.InferRequestedOutput(contract.OUTPUT_PROBABILITIES)])
    assert [output.name for output in result.get_response().outputs] == [contract.OUTPUT_PROBABILITIES]
    np.testing.assert_allclose(result.as_numpy(contract.OUTPUT_PROBABILITIES), expected, atol=1e-6)


def test_typed_contents_are_read_as_raw_ones(target, images, expected):
    """``uint_contents`` for UINT8 and ``bytes_contents`` for BYTES, through Triton's own generated stub."""
    with grpc.insecure_channel(target) as channel:
        _typed_contents(service_pb2_grpc.GRPCInferenceServiceStub(channel), images, expected)


def _typed_contents(stub, images, expected):
    pixels = service_pb2.ModelInferRequest(model_name=MODEL)
    tensor = pixels.inputs.add(name=contract.INPUT_PIXELS, datatype="UINT8", shape=list(images.shape))
    tensor.contents.uint_contents.extend(images.reshape(-1).tolist())
    encoded = service_pb2.ModelInferRequest(model_name=MODEL)
    tensor = encoded.inputs.add(name=contract.INPUT_BYTES, datatype="BYTES", shape=[len(images)])
    tensor.contents.bytes_contents.extend(synthetic.encode(image) for image in images)
    for request in (pixels, encoded):
        response = stub.ModelInfer(request, metadata=tuple(HEADERS.items()), timeout=DEADLINE_S)
        result = triton.InferResult(response)
        np.testing.assert_allclose(result.as_numpy(contract.OUTPUT_PROBABILITIES), expected, atol=1e-6)
        assert response.model_version == "1"

    tensor = pixels.inputs[0]
    tensor.contents.uint_contents[0] = 256
    with pytest.raises(grpc.RpcError) as raised:
        stub.ModelInfer(pixels, metadata=tuple(HEADERS.items()), timeout=DEADLINE_S)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "0..255" in raised.value.details()
    tensor.contents.ClearField("uint_contents")
    tensor.contents.int_contents.extend(images.reshape(-1).tolist())  # INT32's field, not UINT8's
    with pytest.raises(grpc.RpcError) as raised:
        stub.ModelInfer(pixels, metadata=tuple(HEADERS.items()), timeout=DEADLINE_S)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "uint_contents" in raised.value.details()


def test_classification_ranks_as_over_http(client, images, expected):
    result = client.infer(MODEL, [pixels_input(images)], headers=HEADERS, client_timeout=DEADLINE_S,
                          outputs=[triton.InferRequestedOutput(contract.OUTPUT_PROBABILITIES, class_count=2)])
    ranked = result.as_numpy(contract.OUTPUT_PROBABILITIES)
    assert ranked.shape == (len(images), 2)
    for row, entries in zip(expected, ranked):
        parsed = [entry.decode().split(":") for entry in entries]
        best = np.argsort(-row, kind="stable")[:2].tolist()
        assert [int(class_id) for _, class_id, _ in parsed] == best
        assert [label for _, _, label in parsed] == [synthetic.CLASS_NAMES[c] for c in best]
        assert [float(p) for p, _, _ in parsed] == pytest.approx(row[best].tolist(), abs=1e-6)


# -- metadata and readiness ---------------------------------------------------------------------


def test_model_metadata_describes_the_real_inputs_and_outputs(app, client):
    served = client.get_model_metadata(MODEL, headers=HEADERS, as_json=True, client_timeout=DEADLINE_S)
    assert served["name"] == MODEL and served["versions"] == ["1"]
    assert {t["name"]: (t["datatype"], [int(d) for d in t["shape"]]) for t in served["inputs"]} == {
        contract.INPUT_PIXELS: ("UINT8", [-1, contract.IMAGE_SIZE, contract.IMAGE_SIZE, contract.CHANNELS]),
        contract.INPUT_BYTES: ("BYTES", [-1]),
    }
    outputs = {t["name"]: (t["datatype"], [int(d) for d in t["shape"]]) for t in served["outputs"]}
    assert outputs[contract.OUTPUT_PROBABILITIES] == ("FP32", [-1, len(synthetic.CLASS_NAMES)])
    assert outputs[contract.OUTPUT_CLASS_IDS] == ("INT64", [-1])
    assert outputs[contract.OUTPUT_CLASS_NAMES] == ("BYTES", [-1])
    # What HTTP's /v2 says of the same model, field for field.
    http = app.test_client().get(f"/v2/models/{MODEL}", headers=HEADERS).get_json()
    assert served["platform"] == http["platform"]
    for field in ("inputs", "outputs"):
        assert [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in served[field]] == [
            (t["name"], t["datatype"], t["shape"]) for t in http[field]]
    assert client.get_model_metadata(MODEL, "1", headers=HEADERS, client_timeout=DEADLINE_S).versions == ["1"]


def test_server_live_ready_and_metadata(client):
    assert client.is_server_live(headers=HEADERS, client_timeout=DEADLINE_S)
    assert client.is_server_ready(headers=HEADERS, client_timeout=DEADLINE_S)
    assert client.is_model_ready(MODEL, headers=HEADERS, client_timeout=DEADLINE_S)
    assert client.is_model_ready(MODEL, "1", headers=HEADERS, client_timeout=DEADLINE_S)
    metadata = client.get_server_metadata(headers=HEADERS, client_timeout=DEADLINE_S)
    assert metadata.name == "cifar-tpu-pipeline" and list(metadata.extensions) == ["classification"]


def test_one_port_serves_both_grpc_apis_and_health(target, images, expected):
    with grpc.insecure_channel(target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        check = health.Check(health_pb2.HealthCheckRequest(service="inference.GRPCInferenceService"), timeout=DEADLINE_S)
        assert check.status == health_pb2.HealthCheckResponse.SERVING
        request = predict_pb2.PredictRequest()
        request.model_spec.name = MODEL
        request.inputs[contract.INPUT_PIXELS].CopyFrom(tensors.to_proto(images))
        response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
            request, metadata=tuple(HEADERS.items()), timeout=DEADLINE_S)
        np.testing.assert_allclose(tensors.to_array(response.outputs[contract.OUTPUT_PROBABILITIES]), expected, atol=1e-6)


# -- guards and errors -------------------------------------------------------------------------


def test_the_api_key_is_needed(client, images):
    status, message = status_of(client.infer, MODEL, [pixels_input(images[:1])])
    assert status == str(grpc.StatusCode.UNAUTHENTICATED) and "API key" in message
    status, _ = status_of(client.infer, MODEL, [pixels_input(images[:1])], headers={"x-api-key": "wrong"})
    assert status == str(grpc.StatusCode.UNAUTHENTICATED)
    status, _ = status_of(client.get_model_metadata, MODEL)
    assert status == str(grpc.StatusCode.UNAUTHENTICATED)
    result = client.infer(MODEL, [pixels_input(images[:1])], headers={"authorization": f"Bearer {KEY}"}, client_timeout=DEADLINE_S)
    assert result.as_numpy(contract.OUTPUT_PROBABILITIES).shape == (1, len(synthetic.CLASS_NAMES))


def test_a_wrong_datatype_is_invalid(client, images):
    status, message = status_of(client.infer, MODEL, [pixels_input(images.astype(np.float32), "FP32")], headers=HEADERS)
    assert status == str(grpc.StatusCode.INVALID_ARGUMENT) and "must have datatype UINT8" in message
    still_serves(client, images)


def test_raw_contents_that_do_not_fill_their_shape_are_invalid(client, images):
    short = pixels_input(images[:1])
    short.set_shape([2, *images.shape[1:]])  # one image's bytes under a two-image shape
    status, message = status_of(client.infer, MODEL, [short], headers=HEADERS)
    assert status == str(grpc.StatusCode.INVALID_ARGUMENT) and f"needs {2 * images[0].size}" in message

    broken = bytes_input([synthetic.encode(images[0])])
    broken.set_shape([2])  # one length-prefixed element for a two-element shape
    status, message = status_of(client.infer, MODEL, [broken], headers=HEADERS)
    assert status == str(grpc.StatusCode.INVALID_ARGUMENT) and "its shape needs 2" in message
    still_serves(client, images)


def test_over_the_image_cap_is_invalid_naming_it(client):
    many = synthetic.make_images(3, seed=1)[0][: MAX_IMAGES + 1]
    status, message = status_of(client.infer, MODEL, [pixels_input(many)], headers=HEADERS)
    assert status == str(grpc.StatusCode.INVALID_ARGUMENT) and "SERVE_MAX_IMAGES" in message
    still_serves(client, many)


def test_an_unknown_model_or_version_is_not_found(client, images):
    status, message = status_of(client.infer, "other", [pixels_input(images[:1])], headers=HEADERS)
    assert status == str(grpc.StatusCode.NOT_FOUND) and "other" in message
    status, message = status_of(client.infer, MODEL, [pixels_input(images[:1])], model_version="7", headers=HEADERS)
    assert status == str(grpc.StatusCode.NOT_FOUND) and "no version '7'" in message
    assert status_of(client.get_model_metadata, "other", headers=HEADERS)[0] == str(grpc.StatusCode.NOT_FOUND)
    assert status_of(client.is_model_ready, "other", headers=HEADERS)[0] == str(grpc.StatusCode.NOT_FOUND)
    still_serves(client, images)


def test_the_vendored_proto_is_tritons_on_the_wire():
    """Every message, field and method of tfs_protos/inference is in Triton's grpc_service.proto (a superset), alike."""
    from google.protobuf import descriptor_pb2

    from tfs_protos.inference import grpc_predict_v2_pb2

    ours, theirs = descriptor_pb2.FileDescriptorProto(), descriptor_pb2.FileDescriptorProto()
    grpc_predict_v2_pb2.DESCRIPTOR.CopyToProto(ours)
    service_pb2.DESCRIPTOR.CopyToProto(theirs)
    assert ours.package == theirs.package == "inference"

    def fields(message, scope=""):
        found = {}
        for field in message.field:
            found[f"{scope}{message.name}.{field.name}"] = (field.number, field.type, field.label, field.type_name)
        for nested in message.nested_type:
            found.update(fields(nested, f"{scope}{message.name}."))
        return found

    theirs_fields = {}
    for message in theirs.message_type:
        theirs_fields.update(fields(message))
    for message in ours.message_type:
        for name, spec in fields(message).items():
            assert theirs_fields.get(name) == spec, name
    (service,) = ours.service
    methods = {m.name: (m.input_type, m.output_type) for s in theirs.service if s.name == service.name for m in s.method}
    assert {m.name: (m.input_type, m.output_type) for m in service.method}.items() <= methods.items()
