"""The TF Serving stand-in speaks TF Serving's REST and gRPC protocols over the exported model.

Other tests trust the stand-in as if it were TF Serving, so these pin the wire format
(URLs, JSON shapes, protobuf messages, status codes) and check that every answer equals
calling the SavedModel directly.
"""

import base64

import grpc
import numpy as np
import pytest
import requests
import tensorflow as tf
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

import contract
from tfserving_standin import StandIn, tfserving  # noqa: F401  (tfserving is a fixture)

NAME = contract.DEFAULT_MODEL_NAME
PIXELS, BYTES = contract.SIGNATURE_PIXELS, contract.SIGNATURE_BYTES
TIMEOUT_S = 30

#: Every test here needs the model trained and exported in the session (tests/serve/conftest.py).
pytestmark = pytest.mark.end_to_end


@pytest.fixture(scope="module")
def images():
    return np.random.default_rng(0).integers(0, 256, size=(3, 32, 32, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def pngs(images):
    return [tf.io.encode_png(image).numpy() for image in images]


@pytest.fixture(scope="module")
def expected(model_base, images, pngs):
    """What the SavedModel itself answers, per signature, as numpy arrays."""
    loaded = tf.saved_model.load(str(model_base / "1"))
    direct = {
        PIXELS: loaded.signatures[PIXELS](**{contract.INPUT_PIXELS: tf.constant(images)}),
        BYTES: loaded.signatures[BYTES](**{contract.INPUT_BYTES: tf.constant(pngs)}),
    }
    return {sig: {k: v.numpy() for k, v in out.items()} for sig, out in direct.items()}


@pytest.fixture(scope="module")
def channel(tfserving):
    with grpc.insecure_channel(tfserving.grpc_target) as ch:
        yield ch


def b64(data):
    return {"b64": base64.b64encode(data).decode("ascii")}


def assert_outputs_equal(columns, want):
    """``columns`` (JSON-decoded, by output name) equal the direct outputs ``want``."""
    assert set(columns) == set(contract.CALIBRATED_OUTPUTS)
    np.testing.assert_allclose(np.array(columns[contract.OUTPUT_PROBABILITIES]), want[contract.OUTPUT_PROBABILITIES], rtol=1e-6)
    assert columns[contract.OUTPUT_CLASS_IDS] == want[contract.OUTPUT_CLASS_IDS].tolist()
    assert columns[contract.OUTPUT_CLASS_NAMES] == [n.decode() for n in want[contract.OUTPUT_CLASS_NAMES]]


def rows_to_columns(predictions):
    return {key: [row[key] for row in predictions] for key in predictions[0]}


def post(tfserving, body, path=f"/v1/models/{NAME}:predict"):
    return requests.post(tfserving.rest_url + path, json=body, timeout=TIMEOUT_S)


# ---------------------------------------------------------------------------
# REST
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", [f"/v1/models/{NAME}", f"/v1/models/{NAME}/versions/1"])
def test_rest_status(tfserving, path):
    response = requests.get(tfserving.rest_url + path, timeout=TIMEOUT_S)
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "application/json"
    assert response.json() == {
        "model_version_status": [
            {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
        ]
    }


@pytest.mark.parametrize("path", [f"/v1/models/{NAME}/metadata", f"/v1/models/{NAME}/versions/1/metadata"])
def test_rest_metadata_describes_both_signatures(tfserving, path):
    body = requests.get(tfserving.rest_url + path, timeout=TIMEOUT_S).json()
    assert body["model_spec"] == {"name": NAME, "signature_name": "", "version": "1"}
    signatures = body["metadata"]["signature_def"]["signature_def"]
    pixels, encoded = signatures[PIXELS], signatures[BYTES]
    assert pixels["method_name"] == "tensorflow/serving/predict"
    assert pixels["inputs"][contract.INPUT_PIXELS]["dtype"] == "DT_UINT8"
    assert [d["size"] for d in pixels["inputs"][contract.INPUT_PIXELS]["tensor_shape"]["dim"]] == ["-1", "32", "32", "3"]
    assert encoded["inputs"][contract.INPUT_BYTES]["dtype"] == "DT_STRING"
    for signature in (pixels, encoded):
        dtypes = {name: tensor["dtype"] for name, tensor in signature["outputs"].items()}
        assert dtypes == {
            contract.OUTPUT_PROBABILITIES: "DT_FLOAT",
            contract.OUTPUT_CLASS_IDS: "DT_INT64",
            contract.OUTPUT_CLASS_NAMES: "DT_STRING",
            contract.OUTPUT_OOD_SCORE: "DT_FLOAT",
            contract.OUTPUT_IN_DISTRIBUTION: "DT_BOOL",
        }


def test_rest_row_format_pixels(tfserving, images, expected):
    response = post(tfserving, {"instances": images.tolist()})
    assert response.status_code == 200, response.text
    predictions = response.json()["predictions"]
    assert len(predictions) == len(images)
    assert_outputs_equal(rows_to_columns(predictions), expected[PIXELS])


def test_rest_row_format_named_instances_on_a_version(tfserving, images, expected):
    body = {"signature_name": PIXELS, "instances": [{contract.INPUT_PIXELS: image.tolist()} for image in images]}
    response = post(tfserving, body, f"/v1/models/{NAME}/versions/1:predict")
    assert response.status_code == 200, response.text
    assert_outputs_equal(rows_to_columns(response.json()["predictions"]), expected[PIXELS])


@pytest.mark.parametrize("named", [True, False], ids=["named", "bare"])
def test_rest_row_format_png_bytes(tfserving, pngs, expected, named):
    instances = [{contract.INPUT_BYTES: b64(png)} if named else b64(png) for png in pngs]
    response = post(tfserving, {"signature_name": BYTES, "instances": instances})
    assert response.status_code == 200, response.text
    assert_outputs_equal(rows_to_columns(response.json()["predictions"]), expected[BYTES])


def test_rest_columnar_format(tfserving, images, pngs, expected):
    bare = post(tfserving, {"inputs": images.tolist()})
    assert bare.status_code == 200, bare.text
    assert_outputs_equal(bare.json()["outputs"], expected[PIXELS])

    named = post(tfserving, {"signature_name": BYTES, "inputs": {contract.INPUT_BYTES: [b64(p) for p in pngs]}})
    assert named.status_code == 200, named.text
    assert_outputs_equal(named.json()["outputs"], expected[BYTES])


def test_png_and_pixels_agree(expected):
    # On 32x32 inputs the bytes signature does not resize, so both must classify alike.
    assert expected[PIXELS][contract.OUTPUT_CLASS_IDS].tolist() == expected[BYTES][contract.OUTPUT_CLASS_IDS].tolist()


@pytest.mark.parametrize(
    "method, path, body, status, message",
    [
        ("get", "/v1/models/nope", None, 404, "Could not find any versions of model nope"),
        ("get", f"/v1/models/{NAME}/versions/7", None, 404, f"Could not find version 7 of model {NAME}"),
        ("get", "/v1/models/nope/metadata", None, 404, "Servable not found for request: Latest(nope)"),
        ("post", "/v1/models/nope:predict", {"instances": [1]}, 404, "Servable not found for request: Latest(nope)"),
        (
            "post",
            f"/v1/models/{NAME}/versions/7:predict",
            {"instances": [1]},
            404,
            f"Servable not found for request: Specific({NAME}, 7)",
        ),
        ("post", f"/v1/models/{NAME}:predict", b"{not json", 400, "JSON Parse error"),
        ("post", f"/v1/models/{NAME}:predict", {"instances": [[1, 2]]}, 400, "does not match [-1, 32, 32, 3]"),
        ("post", f"/v1/models/{NAME}:predict", {"instances": [[[[300, 0, 0]] * 32] * 32]}, 400, "expected type: uint8"),
        ("post", f"/v1/models/{NAME}:predict", {"instances": [[[[0.5, 0, 0]] * 32] * 32]}, 400, "expected type: uint8"),
        ("post", f"/v1/models/{NAME}:predict", {"rows": []}, 400, "Missing 'inputs' or 'instances' key"),
        ("post", f"/v1/models/{NAME}:predict", {"signature_name": "nope", "instances": [1]}, 400, '"nope" not found'),
        ("post", f"/v1/models/{NAME}:predict", {"inputs": {"pixels": [1]}}, 400, "alias not found in signature: pixels"),
        (
            "post",
            f"/v1/models/{NAME}:predict",
            {"signature_name": BYTES, "instances": [b64(b"not an image")]},
            400,
            "",
        ),
        ("post", f"/v1/models/{NAME}/versions/x:predict", {"instances": [1]}, 400, "Malformed request"),
    ],
    ids=[
        "status-unknown-model",
        "status-unknown-version",
        "metadata-unknown-model",
        "predict-unknown-model",
        "predict-unknown-version",
        "bad-json",
        "bad-shape",
        "out-of-range",
        "float-for-uint8",
        "no-instances",
        "unknown-signature",
        "unknown-input",
        "undecodable-image",
        "non-numeric-version",
    ],
)
def test_rest_errors(tfserving, method, path, body, status, message):
    url = tfserving.rest_url + path
    if method == "get":
        response = requests.get(url, timeout=TIMEOUT_S)
    elif isinstance(body, bytes):
        response = requests.post(url, data=body, timeout=TIMEOUT_S)
    else:
        response = requests.post(url, json=body, timeout=TIMEOUT_S)
    assert response.status_code == status
    assert set(response.json()) == {"error"}
    assert message in response.json()["error"]


# ---------------------------------------------------------------------------
# gRPC
# ---------------------------------------------------------------------------


def predict_request(signature, alias, values, version=None, output_filter=()):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = NAME
    request.model_spec.signature_name = signature
    if version is not None:
        request.model_spec.version.value = version
    request.inputs[alias].CopyFrom(tf.make_tensor_proto(values))
    request.output_filter.extend(output_filter)
    return request


@pytest.mark.parametrize("signature", [PIXELS, BYTES])
def test_grpc_predict(channel, images, pngs, expected, signature):
    alias, values = (contract.INPUT_PIXELS, images) if signature == PIXELS else (contract.INPUT_BYTES, pngs)
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    response = stub.Predict(predict_request(signature, alias, values), timeout=TIMEOUT_S)
    assert response.model_spec.name == NAME
    assert response.model_spec.version.value == 1
    assert response.model_spec.signature_name == signature
    outputs = {k: tf.make_ndarray(v) for k, v in response.outputs.items()}
    assert set(outputs) == set(contract.CALIBRATED_OUTPUTS)
    np.testing.assert_allclose(outputs[contract.OUTPUT_PROBABILITIES], expected[signature][contract.OUTPUT_PROBABILITIES], rtol=1e-6)
    assert outputs[contract.OUTPUT_CLASS_IDS].dtype == np.int64
    np.testing.assert_array_equal(outputs[contract.OUTPUT_CLASS_IDS], expected[signature][contract.OUTPUT_CLASS_IDS])
    assert outputs[contract.OUTPUT_CLASS_NAMES].tolist() == expected[signature][contract.OUTPUT_CLASS_NAMES].tolist()


def test_grpc_predict_default_signature_and_output_filter(channel, images, expected):
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    request = predict_request("", contract.INPUT_PIXELS, images, version=1, output_filter=[contract.OUTPUT_CLASS_IDS])
    response = stub.Predict(request, timeout=TIMEOUT_S)
    assert response.model_spec.signature_name == PIXELS
    assert list(response.outputs) == [contract.OUTPUT_CLASS_IDS]
    np.testing.assert_array_equal(tf.make_ndarray(response.outputs[contract.OUTPUT_CLASS_IDS]), expected[PIXELS][contract.OUTPUT_CLASS_IDS])


def test_grpc_metadata(channel):
    request = get_model_metadata_pb2.GetModelMetadataRequest()
    request.model_spec.name = NAME
    request.metadata_field.append("signature_def")
    response = prediction_service_pb2_grpc.PredictionServiceStub(channel).GetModelMetadata(request, timeout=TIMEOUT_S)
    assert response.model_spec.version.value == 1
    signature_map = get_model_metadata_pb2.SignatureDefMap()
    assert response.metadata["signature_def"].Unpack(signature_map)
    pixels = signature_map.signature_def[PIXELS]
    assert pixels.inputs[contract.INPUT_PIXELS].dtype == tf.uint8.as_datatype_enum
    assert signature_map.signature_def[BYTES].inputs[contract.INPUT_BYTES].dtype == tf.string.as_datatype_enum
    assert pixels.outputs[contract.OUTPUT_CLASS_IDS].dtype == tf.int64.as_datatype_enum


def test_grpc_status(channel):
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = NAME
    response = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(request, timeout=TIMEOUT_S)
    [status] = response.model_version_status
    assert status.version == 1
    assert status.state == get_model_status_pb2.ModelVersionStatus.AVAILABLE
    assert status.status.error_code == 0


@pytest.mark.parametrize(
    "name, version, signature, alias, values, code, message",
    [
        ("nope", None, PIXELS, contract.INPUT_PIXELS, np.zeros((1, 32, 32, 3), np.uint8), "NOT_FOUND", "Latest(nope)"),
        (NAME, 7, PIXELS, contract.INPUT_PIXELS, np.zeros((1, 32, 32, 3), np.uint8), "NOT_FOUND", f"Specific({NAME}, 7)"),
        (NAME, None, "nope", contract.INPUT_PIXELS, np.zeros((1, 32, 32, 3), np.uint8), "INVALID_ARGUMENT", '"nope"'),
        (NAME, None, PIXELS, contract.INPUT_PIXELS, np.zeros((1, 32, 32, 3), np.float32), "INVALID_ARGUMENT", "uint8"),
        (NAME, None, PIXELS, contract.INPUT_PIXELS, np.zeros((1, 4, 4, 3), np.uint8), "INVALID_ARGUMENT", "does not match"),
        (NAME, None, PIXELS, "pixels", np.zeros((1, 32, 32, 3), np.uint8), "INVALID_ARGUMENT", "alias not found"),
    ],
    ids=["unknown-model", "unknown-version", "unknown-signature", "wrong-dtype", "wrong-shape", "unknown-input"],
)
def test_grpc_predict_errors(channel, name, version, signature, alias, values, code, message):
    request = predict_request(signature, alias, values, version=version)
    request.model_spec.name = name
    with pytest.raises(grpc.RpcError) as error:
        prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=TIMEOUT_S)
    assert error.value.code() == getattr(grpc.StatusCode, code)
    assert message in error.value.details()


def test_grpc_status_unknown_version(channel):
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = NAME
    request.model_spec.version.value = 7
    with pytest.raises(grpc.RpcError) as error:
        model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(request, timeout=TIMEOUT_S)
    assert error.value.code() == grpc.StatusCode.NOT_FOUND


# ---------------------------------------------------------------------------
# Versions, delays and restarts
# ---------------------------------------------------------------------------


def test_every_version_is_served_and_latest_is_the_default(tmp_path, model_base, images):
    base = tmp_path / NAME
    base.mkdir()
    for version in ("1", "2"):
        (base / version).symlink_to(model_base / "1", target_is_directory=True)
    (base / "tmp-export").mkdir()  # not a version: TF Serving ignores non-numeric directories
    standin = StandIn(base).start()
    try:
        status = requests.get(f"{standin.rest_url}/v1/models/{NAME}", timeout=TIMEOUT_S).json()
        assert [v["version"] for v in status["model_version_status"]] == ["2", "1"]
        latest = requests.get(f"{standin.rest_url}/v1/models/{NAME}/metadata", timeout=TIMEOUT_S).json()
        assert latest["model_spec"]["version"] == "2"
        response = requests.post(
            f"{standin.rest_url}/v1/models/{NAME}/versions/1:predict", json={"instances": images[:1].tolist()}, timeout=TIMEOUT_S
        )
        assert response.status_code == 200
    finally:
        standin.stop()


def test_delay_makes_clients_time_out(tfserving, channel, images):
    tfserving.delay_s = 1.0
    try:
        with pytest.raises(requests.Timeout):
            requests.post(f"{tfserving.rest_url}/v1/models/{NAME}:predict", json={"instances": images[:1].tolist()}, timeout=0.3)
        with pytest.raises(grpc.RpcError) as error:
            prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
                predict_request(PIXELS, contract.INPUT_PIXELS, images[:1]), timeout=0.3
            )
        assert error.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    finally:
        tfserving.delay_s = 0.0


def test_stop_refuses_connections_and_start_reuses_the_ports(tfserving, images):
    rest_url, grpc_target = tfserving.rest_url, tfserving.grpc_target
    session = requests.Session()  # a pooled keep-alive connection must not outlive stop()
    assert session.get(f"{rest_url}/v1/models/{NAME}", timeout=TIMEOUT_S).status_code == 200
    calls = tfserving.predict_calls

    tfserving.stop()
    try:
        with pytest.raises(requests.ConnectionError):
            requests.get(f"{rest_url}/v1/models/{NAME}", timeout=TIMEOUT_S)
        with pytest.raises(requests.ConnectionError):
            session.get(f"{rest_url}/v1/models/{NAME}", timeout=TIMEOUT_S)
        with grpc.insecure_channel(grpc_target) as channel, pytest.raises(grpc.RpcError) as error:
            prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
                predict_request(PIXELS, contract.INPUT_PIXELS, images[:1]), timeout=5
            )
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        tfserving.start()

    assert (tfserving.rest_url, tfserving.grpc_target) == (rest_url, grpc_target)
    assert requests.post(f"{rest_url}/v1/models/{NAME}:predict", json={"instances": images[:1].tolist()}, timeout=TIMEOUT_S).ok
    with grpc.insecure_channel(grpc_target) as channel:
        response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
            predict_request(PIXELS, contract.INPUT_PIXELS, images[:1]), timeout=TIMEOUT_S
        )
    assert response.outputs[contract.OUTPUT_CLASS_IDS].int64_val
    assert tfserving.predict_calls == calls + 2
